package upstream_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakesglang"
	"github.com/flywheel-ai/flywheel/upstream"
)

func newSGLang(t *testing.T, fake *fakesglang.Fake, cfg upstream.Config) *upstream.Backend {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	cfg.BaseURL, cfg.Model, cfg.Dialect = srv.URL+"/v1", "qwen", deployment.DialectSGLang
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Millisecond
	}
	b, err := upstream.New(cfg)
	require.NoError(t, err)
	return b
}

// fakeLogprobs are the fake's logprobs of n sampled tokens.
func fakeLogprobs(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(-0.01 - 0.1*float64(i%5))
	}
	return out
}

// TestSGLangKeepsTheEnginesIDs: the prompt ids are the chat-templated ids
// SGLang's /v1/tokenize gave, sent to /generate as input_ids; the
// completion ids and logprobs are /generate's own. Nothing goes to the
// chat endpoint, which has no ids.
func TestSGLangKeepsTheEnginesIDs(t *testing.T) {
	fake := &fakesglang.Fake{}
	b := newSGLang(t, fake, upstream.Config{})
	temp := 0.7
	req := userReq("hello")
	req.MaxTokens, req.Temperature, req.Stop = 64, &temp, []string{"\n\n"}
	resp, err := b.Complete(context.Background(), req)
	require.NoError(t, err)
	prompt := tokens("user:hello\n")
	require.Equal(t, "echo: hello", resp.Message.Content)
	require.Equal(t, prompt, resp.PromptTokenIDs)
	require.Equal(t, tokens("echo: hello"), resp.CompletionTokenIDs)
	require.Equal(t, fakeLogprobs(len("echo: hello")), resp.Logprobs)
	require.Equal(t, "e", resp.CompletionTokens[0], "return_text_in_logprobs gives the token's text")
	require.Equal(t, "stop", resp.FinishReason)
	require.Equal(t, inference.Usage{PromptTokens: len(prompt), CompletionTokens: len("echo: hello")}, resp.Usage)
	require.Equal(t, "qwen", resp.ModelVersion)
	require.Zero(t, fake.Chat.Requests.Load(), "the chat endpoint was not asked")

	require.Equal(t, []map[string]any{{"model": "qwen", "messages": []any{map[string]any{"role": "user", "content": "hello"}}}},
		fake.Tokenizes(), "SGLang's TokenizeRequest, no vLLM add_generation_prompt")
	require.Equal(t, []map[string]any{{
		"input_ids":       floats(prompt),
		"sampling_params": map[string]any{"max_new_tokens": float64(64), "temperature": 0.7, "stop": []any{"\n\n"}},
		"return_logprob":  true, "return_text_in_logprobs": true,
	}}, fake.Generates())

	// No max_tokens: null, the chat endpoint's "until the context is full",
	// not /generate's default of 128.
	_, err = b.Complete(context.Background(), userReq("x"))
	require.NoError(t, err)
	sp := fake.Generates()[1]["sampling_params"].(map[string]any)
	require.Contains(t, sp, "max_new_tokens")
	require.Nil(t, sp["max_new_tokens"])

	req = userReq("a long answer")
	req.MaxTokens, req.TopLogprobs = 3, 2
	resp, err = b.Complete(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, "length", resp.FinishReason)
	require.Equal(t, tokens("ech"), resp.CompletionTokenIDs)
	require.Len(t, resp.TopLogprobs, 3)
	require.Equal(t, inference.TopLogprob{TokenID: 'e', Token: "e", Logprob: resp.Logprobs[0]}, resp.TopLogprobs[0][0])
	require.Equal(t, float64(2), fake.Generates()[2]["top_logprobs_num"])
}

func floats(xs []int) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// TestSGLangStreams: /generate streams the same ids and logprobs as it
// answers, whether each chunk holds everything so far (SGLang's default)
// or only what is new (--incremental-streaming-output).
func TestSGLangStreams(t *testing.T) {
	for _, incremental := range []bool{false, true} {
		fake := &fakesglang.Fake{IncrementalStreaming: incremental}
		b := newSGLang(t, fake, upstream.Config{})
		whole, err := b.Complete(context.Background(), userReq("a prompt of some length"))
		require.NoError(t, err)
		var text string
		var ids []int
		var lps []float32
		resp, err := b.Stream(context.Background(), userReq("a prompt of some length"), func(d inference.Delta) error {
			text += d.Text
			ids = append(ids, d.TokenIDs...)
			lps = append(lps, d.Logprobs...)
			return nil
		})
		require.NoError(t, err, "incremental %t", incremental)
		require.Equal(t, whole.Message.Content, resp.Message.Content)
		require.Equal(t, whole.Message.Content, text)
		require.Equal(t, whole.PromptTokenIDs, resp.PromptTokenIDs)
		require.Equal(t, whole.CompletionTokenIDs, resp.CompletionTokenIDs)
		require.Equal(t, whole.CompletionTokenIDs, ids)
		require.Equal(t, whole.Logprobs, resp.Logprobs)
		require.Equal(t, whole.Logprobs, lps)
		require.Equal(t, whole.Usage, resp.Usage)
		require.Equal(t, "stop", resp.FinishReason)
		require.Equal(t, true, fake.Generates()[1]["stream"])
	}
}

// TestSGLangFailures: /generate's errors are handled as the chat
// endpoint's are: a 400 is the client's and not retried, a 5xx is retried
// and then a 502, a timeout a 502, an error chunk mid-stream an error
// with what streamed before it kept.
func TestSGLangFailures(t *testing.T) {
	ctx := context.Background()
	var ie *inference.Error

	bad := &fakesglang.Fake{FailStatus: 400}
	bad.FailNextGenerate.Store(5)
	_, err := newSGLang(t, bad, upstream.Config{Retries: 3}).Complete(ctx, userReq("x"))
	require.ErrorAs(t, err, &ie)
	require.Equal(t, http.StatusBadRequest, ie.Status)
	require.Equal(t, "upstream: fake: injected failure", ie.Message)
	require.Len(t, bad.Generates(), 1, "a 400 is not retried")

	flaky := &fakesglang.Fake{FailStatus: 503}
	flaky.FailNextGenerate.Store(2)
	resp, err := newSGLang(t, flaky, upstream.Config{Retries: 2}).Complete(ctx, userReq("x"))
	require.NoError(t, err)
	require.Equal(t, tokens("echo: x"), resp.CompletionTokenIDs)
	require.Len(t, flaky.Generates(), 3)
	require.Len(t, flaky.Tokenizes(), 1, "the prompt is tokenized once")

	broken := &fakesglang.Fake{}
	broken.FailNextGenerate.Store(5)
	_, err = newSGLang(t, broken, upstream.Config{Retries: 1}).Complete(ctx, userReq("x"))
	require.ErrorAs(t, err, &ie)
	require.Equal(t, http.StatusBadGateway, ie.Status)
	require.Len(t, broken.Generates(), 2)

	slow := newSGLang(t, &fakesglang.Fake{Latency: time.Second}, upstream.Config{Timeout: 50 * time.Millisecond})
	start := time.Now()
	_, err = slow.Complete(ctx, userReq("x"))
	require.ErrorAs(t, err, &ie)
	require.Equal(t, http.StatusBadGateway, ie.Status)
	require.Equal(t, "upstream timed out", ie.Message)
	require.Less(t, time.Since(start), 900*time.Millisecond)
	_, err = slow.Stream(ctx, userReq("x"), func(inference.Delta) error { return nil })
	require.ErrorAs(t, err, &ie)
	require.Equal(t, http.StatusBadGateway, ie.Status)

	var got int
	resp, err = newSGLang(t, &fakesglang.Fake{ErrorChunkAfter: 1}, upstream.Config{Retries: 3}).Stream(ctx,
		userReq("a longer prompt that takes a few chunks"), func(inference.Delta) error { got++; return nil })
	require.ErrorAs(t, err, &ie)
	require.Equal(t, http.StatusBadGateway, ie.Status)
	require.Equal(t, "upstream stream failed: fake: generation failed", ie.Message)
	require.Equal(t, 1, got, "the chunk before the error was emitted")
	require.Equal(t, tokens("echo"), resp.CompletionTokenIDs, "what streamed before the error is kept for the capture")
}

// TestSGLangWithoutIDs: where /generate cannot serve a request (it offers
// tools, whose calls only SGLang's chat endpoint parses; or the server's
// /v1/tokenize takes no messages), the chat endpoint answers, without
// ids, so the sample cannot train.
func TestSGLangWithoutIDs(t *testing.T) {
	fake := &fakesglang.Fake{}
	b := newSGLang(t, fake, upstream.Config{})
	req := userReq("weather in Paris")
	req.Tools = []inference.Tool{{Name: "search", Parameters: json.RawMessage(`{"type":"object"}`)}}
	resp, err := b.Complete(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, "search", resp.Message.ToolCalls[0].Name)
	require.Empty(t, resp.CompletionTokenIDs)
	require.Empty(t, resp.PromptTokenIDs)
	require.Empty(t, fake.Generates())
	require.NotContains(t, fake.Chat.LastRequest(), "return_token_ids", "the sglang dialect asks the chat endpoint for nothing of vLLM's")

	old := &fakesglang.Fake{PromptOnlyTokenize: true}
	ob := newSGLang(t, old, upstream.Config{})
	resp, err = ob.Complete(context.Background(), userReq("hi"))
	require.NoError(t, err)
	require.Equal(t, "echo: hi", resp.Message.Content)
	require.Empty(t, resp.CompletionTokenIDs)
	require.Empty(t, old.Generates())
	sresp, err := ob.Stream(context.Background(), userReq("hi"), func(inference.Delta) error { return nil })
	require.NoError(t, err)
	require.Equal(t, "echo: hi", sresp.Message.Content)
	require.Empty(t, sresp.CompletionTokenIDs)
	require.EqualValues(t, 2, old.Chat.Requests.Load())

	n, err := b.CountTokens(context.Background(), userReq("hello"))
	require.NoError(t, err)
	require.Equal(t, len("user:hello\n"), n, "SGLang's /v1/tokenize counts")
}

// TestDialectSettings: a deployment names its server's dialect; the older
// "vllm" flag still reads, and an SGLang weight sync implies SGLang.
func TestDialectSettings(t *testing.T) {
	for raw, want := range map[string]deployment.Dialect{
		`{"base_url":"http://e/v1"}`:                                                   deployment.DialectVLLM,
		`{"base_url":"http://e/v1","vllm":false}`:                                      deployment.DialectOpenAI,
		`{"base_url":"http://e/v1","vllm":true,"dialect":"vllm"}`:                      deployment.DialectVLLM,
		`{"base_url":"http://e/v1","dialect":"sglang"}`:                                deployment.DialectSGLang,
		`{"base_url":"http://e/v1","dialect":"openai","vllm":false}`:                   deployment.DialectOpenAI,
		`{"base_url":"http://e/v1","weight_sync":{"kind":"sglang_disk"}}`:              deployment.DialectSGLang,
		`{"base_url":"http://e/v1","weight_sync":{"kind":"sglang_disk"},"vllm":false}`: deployment.DialectOpenAI,
	} {
		s, err := deployment.Parse(json.RawMessage(raw))
		require.NoError(t, err, raw)
		require.Equal(t, want, s.ServerDialect(), raw)
	}
	for raw, msg := range map[string]string{
		`{"base_url":"http://e/v1","dialect":"tgi"}`:                `dialect "tgi": want vllm, sglang, openai or anthropic`,
		`{"base_url":"http://e/v1","dialect":"sglang","vllm":true}`: `vllm true contradicts dialect "sglang"`,
		`{"base_url":"http://e/v1","dialect":"vllm","vllm":false}`:  `vllm false contradicts dialect "vllm"`,
	} {
		_, err := deployment.Parse(json.RawMessage(raw))
		require.ErrorContains(t, err, msg, raw)
	}
}
