package upstream_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/upstream"
)

func newBackend(t *testing.T, fx *fakevllm.Fixture, cfg upstream.Config) *upstream.Backend {
	t.Helper()
	srv := httptest.NewServer(fx)
	t.Cleanup(srv.Close)
	cfg.BaseURL, cfg.Model = srv.URL+"/v1", "fixture-model"
	if cfg.Dialect == "" {
		cfg.Dialect = deployment.DialectVLLM
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Millisecond
	}
	b, err := upstream.New(cfg)
	require.NoError(t, err)
	return b
}

func userReq(s string) *inference.Request {
	return &inference.Request{Model: "m", Messages: []inference.Message{{Role: "user", Content: s}}}
}

func TestCompleteAndStreamAgree(t *testing.T) {
	fx := &fakevllm.Fixture{}
	b := newBackend(t, fx, upstream.Config{})
	resp, err := b.Complete(context.Background(), userReq("hello"))
	require.NoError(t, err)
	require.Equal(t, "echo: hello", resp.Message.Content)
	require.Len(t, resp.CompletionTokenIDs, len("echo: hello"))
	require.Len(t, resp.Logprobs, len(resp.CompletionTokenIDs))
	require.NotEmpty(t, resp.PromptTokenIDs)
	require.Equal(t, "fixture-model", resp.ModelVersion)

	var text string
	var ids []int
	sresp, err := b.Stream(context.Background(), userReq("hello"), func(d inference.Delta) error {
		text += d.Text
		ids = append(ids, d.TokenIDs...)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, resp.Message.Content, sresp.Message.Content)
	require.Equal(t, text, sresp.Message.Content)
	require.Equal(t, resp.CompletionTokenIDs, sresp.CompletionTokenIDs)
	require.Equal(t, resp.CompletionTokenIDs, ids)
	require.Equal(t, resp.Logprobs, sresp.Logprobs)
	require.Equal(t, resp.Usage, sresp.Usage)
}

func TestTokenIDsFromTokenStringsWithoutReturnTokenIDs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A server that honours return_tokens_as_token_ids but not
		// return_token_ids (older vLLM): ids come from "token_id:N".
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"model":"m","choices":[{"message":{"content":"hi"},"finish_reason":"stop",
			"logprobs":{"content":[{"token":"token_id:104","logprob":-0.5},{"token":"token_id:105","logprob":-0.25}]}}]}`))
	}))
	defer srv.Close()
	b, err := upstream.New(upstream.Config{BaseURL: srv.URL + "/v1", Model: "m", Dialect: deployment.DialectVLLM})
	require.NoError(t, err)
	resp, err := b.Complete(context.Background(), userReq("x"))
	require.NoError(t, err)
	require.Equal(t, []int{104, 105}, resp.CompletionTokenIDs)
	require.Equal(t, []float32{-0.5, -0.25}, resp.Logprobs)
}

func TestRetriesWithBackoffOn503And429(t *testing.T) {
	fx := &fakevllm.Fixture{FailStatus: 503}
	fx.FailNext.Store(2)
	b := newBackend(t, fx, upstream.Config{Retries: 2})
	resp, err := b.Complete(context.Background(), userReq("x"))
	require.NoError(t, err)
	require.Equal(t, "echo: x", resp.Message.Content)
	require.EqualValues(t, 3, fx.Requests.Load())

	fx2 := &fakevllm.Fixture{FailStatus: 429, RetryAfter: 7}
	fx2.FailNext.Store(5)
	b2 := newBackend(t, fx2, upstream.Config{Retries: 0})
	_, err = b2.Complete(context.Background(), userReq("x"))
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 429, ie.Status)
	require.Equal(t, 7*time.Second, ie.RetryAfter, "the upstream's Retry-After reaches the client")
}

func TestBadRequestIsNotRetried(t *testing.T) {
	fx := &fakevllm.Fixture{FailStatus: 400}
	fx.FailNext.Store(5)
	b := newBackend(t, fx, upstream.Config{Retries: 3})
	_, err := b.Complete(context.Background(), userReq("x"))
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 400, ie.Status)
	require.EqualValues(t, 1, fx.Requests.Load())
}

func TestTimeoutAndFallback(t *testing.T) {
	slow := newBackend(t, &fakevllm.Fixture{Latency: time.Second}, upstream.Config{Timeout: 50 * time.Millisecond})
	start := time.Now()
	_, err := slow.Complete(context.Background(), userReq("x"))
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 502, ie.Status)
	require.Less(t, time.Since(start), 900*time.Millisecond)

	good := newBackend(t, &fakevllm.Fixture{}, upstream.Config{})
	resp, err := upstream.Fallback{slow, good}.Complete(context.Background(), userReq("y"))
	require.NoError(t, err)
	require.Equal(t, "echo: y", resp.Message.Content)
	sresp, err := upstream.Fallback{slow, good}.Stream(context.Background(), userReq("z"), func(inference.Delta) error { return nil })
	require.NoError(t, err)
	require.Equal(t, "echo: z", sresp.Message.Content)
}

func TestStreamBreakIsAnErrorAndEmitErrorStops(t *testing.T) {
	b := newBackend(t, &fakevllm.Fixture{BreakStreamAfter: 1}, upstream.Config{Retries: 3})
	_, err := b.Stream(context.Background(), userReq("a longer prompt"), func(inference.Delta) error { return nil })
	require.Error(t, err)

	stop := errors.New("client went away")
	b2 := newBackend(t, &fakevllm.Fixture{}, upstream.Config{})
	_, err = b2.Stream(context.Background(), userReq("a longer prompt"), func(inference.Delta) error { return stop })
	require.ErrorIs(t, err, stop)
}

// TestStreamErrorChunkIsAnError: vLLM reports a failure after the stream
// started as an error chunk followed by [DONE]; that is an error, not a
// complete answer.
func TestStreamErrorChunkIsAnError(t *testing.T) {
	b := newBackend(t, &fakevllm.Fixture{ErrorChunkAfter: 1}, upstream.Config{})
	var got int
	resp, err := b.Stream(context.Background(), userReq("a longer prompt that takes a few chunks"), func(inference.Delta) error { got++; return nil })
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, http.StatusBadGateway, ie.Status)
	require.Contains(t, ie.Message, "fixture: generation failed")
	require.Positive(t, got, "the chunks before the error were emitted")
	require.NotNil(t, resp, "what streamed before the error is kept for the capture")
}

// TestTokenIDsAskedTheWayTheServerUnderstands: a server that knows
// return_token_ids is asked for nothing else, so its logprob tokens keep
// their text; one that ignores it (vLLM before return_token_ids) is asked
// for "token_id:N" strings from its next request on.
func TestTokenIDsAskedTheWayTheServerUnderstands(t *testing.T) {
	fx := &fakevllm.Fixture{}
	b := newBackend(t, fx, upstream.Config{})
	resp, err := b.Complete(context.Background(), userReq("hi"))
	require.NoError(t, err)
	require.Equal(t, tokens("echo: hi"), resp.CompletionTokenIDs)
	require.Equal(t, "e", resp.CompletionTokens[0], "the logprob token is text, not token_id:N")
	last := fx.LastRequest()
	require.Equal(t, true, last["return_token_ids"])
	require.NotContains(t, last, "return_tokens_as_token_ids")

	old := &fakevllm.Fixture{OldTokenIDs: true}
	ob := newBackend(t, old, upstream.Config{})
	first, err := ob.Complete(context.Background(), userReq("hi"))
	require.NoError(t, err)
	require.Empty(t, first.CompletionTokenIDs, "the old server returned no ids")
	require.Len(t, first.Logprobs, len("echo: hi"))
	second, err := ob.Complete(context.Background(), userReq("hi"))
	require.NoError(t, err)
	require.Equal(t, true, old.LastRequest()["return_tokens_as_token_ids"], "the next request asks for ids in the tokens")
	require.Equal(t, tokens("echo: hi"), second.CompletionTokenIDs)
	var streamed []int
	sresp, err := ob.Stream(context.Background(), userReq("hi"), func(d inference.Delta) error {
		streamed = append(streamed, d.TokenIDs...)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, tokens("echo: hi"), sresp.CompletionTokenIDs)
	require.Equal(t, sresp.CompletionTokenIDs, streamed)
}

func tokens(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}
