package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

func testEngine(t *testing.T) *Engine {
	t.Helper()
	m, err := NewModel(ModelConfig{Context: 128, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, 1)
	require.NoError(t, err)
	e, err := NewEngine(m, 1, EngineConfig{DefaultMaxTokens: 12})
	require.NoError(t, err)
	return e
}

func TestEngineCompleteStampsVersionAndLogprobs(t *testing.T) {
	e := testEngine(t)
	seed := int64(3)
	req := &inference.Request{Messages: []inference.Message{{Role: "user", Content: "hi"}}, Seed: &seed, TopLogprobs: 2}
	resp, err := e.Complete(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, "flywheel-policy@v1", resp.ModelVersion)
	require.NotEmpty(t, resp.CompletionTokenIDs)
	require.Len(t, resp.Logprobs, len(resp.CompletionTokenIDs))
	require.Len(t, resp.TopLogprobs, len(resp.CompletionTokenIDs))
	require.Equal(t, len(resp.PromptTokenIDs), resp.Usage.PromptTokens)
	want, err := RenderPrompt(req.Messages, nil, "", nil)
	require.NoError(t, err)
	require.Equal(t, want, resp.PromptTokenIDs)

	// Same seed, same output.
	again, err := e.Complete(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, resp.CompletionTokenIDs, again.CompletionTokenIDs)

	// A stored prefix is reused verbatim for the turns it covers.
	prefix := append(append([]int{}, resp.PromptTokenIDs...), resp.CompletionTokenIDs...)
	next := &inference.Request{Messages: []inference.Message{
		{Role: "user", Content: "hi"}, {Role: "assistant", Content: "something else"}, {Role: "user", Content: "more"},
	}, PromptTokenIDs: prefix, MaxTokens: 2}
	resp2, err := e.Complete(context.Background(), next)
	require.NoError(t, err)
	require.Equal(t, prefix, resp2.PromptTokenIDs[:len(prefix)])
}

func TestEngineStreamMatchesFinalResponse(t *testing.T) {
	e := testEngine(t)
	seed := int64(5)
	var ids []int
	var lps []float32
	resp, err := e.Stream(context.Background(), &inference.Request{Messages: []inference.Message{{Role: "user", Content: "x"}}, Seed: &seed},
		func(d inference.Delta) error {
			ids = append(ids, d.TokenIDs...)
			lps = append(lps, d.Logprobs...)
			return nil
		})
	require.NoError(t, err)
	require.Equal(t, resp.CompletionTokenIDs, ids)
	require.Equal(t, resp.Logprobs, lps)

	boom := errors.New("client went away")
	_, err = e.Stream(context.Background(), &inference.Request{Messages: []inference.Message{{Role: "user", Content: "x"}}},
		func(inference.Delta) error { return boom })
	require.ErrorIs(t, err, boom)
}

func TestEngineBadRequests(t *testing.T) {
	e := testEngine(t)
	ctx := context.Background()
	var ie *inference.Error
	_, err := e.Complete(ctx, &inference.Request{})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 400, ie.Status)
	long := make([]byte, 500)
	for i := range long {
		long[i] = 'a'
	}
	_, err = e.Complete(ctx, &inference.Request{Messages: []inference.Message{{Role: "user", Content: string(long)}}})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 400, ie.Status)
	require.Contains(t, ie.Message, "context")
	_, err = e.Complete(ctx, &inference.Request{Messages: []inference.Message{{Role: "user", Content: "x"}}, PromptTokenIDs: []int{-3}})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 400, ie.Status)
	_, err = e.Complete(ctx, &inference.Request{Messages: []inference.Message{{Role: "user", Content: "x"}}, Version: "v99"})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 404, ie.Status)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = e.Complete(cctx, &inference.Request{Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.ErrorIs(t, err, context.Canceled)
}

// Requests in flight while a version is published finish on the weights
// they started with: every response's tokens carry one version, and the
// tokens are exactly what that version's weights give.
func TestEngineSwapsVersionsAtomically(t *testing.T) {
	e := testEngine(t)
	m0, _ := e.Current()
	versions := map[string]*Model{"flywheel-policy@v1": m0}
	var mu sync.Mutex
	var wg sync.WaitGroup
	type result struct {
		req  *inference.Request
		resp *inference.Response
	}
	results := make(chan result, 64)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 4; j++ {
				seed := int64(i*10 + j)
				zero := 0.0
				req := &inference.Request{Messages: []inference.Message{{Role: "user", Content: "q"}}, Seed: &seed, Temperature: &zero, MaxTokens: 20}
				resp, err := e.Complete(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				results <- result{req, resp}
			}
		}(i)
	}
	for v := int64(2); v <= 5; v++ {
		m, err := NewModel(m0.Config, uint64(v))
		require.NoError(t, err)
		mu.Lock()
		versions[e.VersionName(v)] = m
		mu.Unlock()
		require.NoError(t, e.Publish(m, v))
	}
	wg.Wait()
	close(results)
	require.Error(t, e.Publish(m0, 3), "versions only move forward")
	for r := range results {
		m := versions[r.resp.ModelVersion]
		require.NotNil(t, m, r.resp.ModelVersion)
		gens, err := m.Generate(context.Background(), [][]int{r.resp.PromptTokenIDs}, SampleOptions{Temperature: r.req.Temperature, MaxTokens: 20}, nil, nil)
		require.NoError(t, err)
		require.Equal(t, gens[0].IDs, r.resp.CompletionTokenIDs)
	}
}

func TestChatTemplateAndToolCalls(t *testing.T) {
	tools := []inference.Tool{
		{Name: "add", Description: "adds", Parameters: json.RawMessage(`{"type":"object","properties":{"b":{"type":"number"},"a":{"type":"number"}}}`)},
		{Name: "now", Parameters: json.RawMessage(`{"type":"object"}`)},
	}
	ids, err := RenderPrompt([]inference.Message{
		{Role: "user", Content: "2+2?"},
		{Role: "assistant", ToolCalls: []inference.ToolCall{{ID: "c1", Name: "add", Arguments: `{"a":2,"b":2}`}}},
		{Role: "tool", ToolCallID: "c1", Content: "4"},
	}, tools, "auto", nil)
	require.NoError(t, err)
	text := Tokenizer{}.Decode(ids)
	require.Equal(t, "<|im_start|>system\n# Tools\nadd(b,a): adds\nnow()<|im_end|>"+
		"<|im_start|>user\n2+2?<|im_end|>"+
		"<|im_start|>assistant\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":2,\"b\":2}}</tool_call><|im_end|>"+
		"<|im_start|>tool\n4<|im_end|><|im_start|>assistant\n", text)
	require.Contains(t, ids, TokToolStart)

	content, calls := ParseAssistant(`Let me add. <tool_call>{"name":"add","arguments":{"a":1}}</tool_call><tool_call>{"name":"mul","arguments":"{\"x\":2}"}</tool_call>`, "call")
	require.Equal(t, "Let me add.", content)
	require.Equal(t, []inference.ToolCall{{ID: "call_0", Name: "add", Arguments: `{"a":1}`}, {ID: "call_1", Name: "mul", Arguments: `{"x":2}`}}, calls)
	content, calls = ParseAssistant(`<tool_call>{broken</tool_call> tail`, "c")
	require.Empty(t, calls)
	require.Equal(t, `<tool_call>{broken</tool_call> tail`, content)
	content, calls = ParseAssistant(`<tool_call>{"name":"x"`, "c")
	require.Empty(t, calls)
	require.Equal(t, `<tool_call>{"name":"x"`, content)
}

func FuzzParseAssistant(f *testing.F) {
	f.Add(`<tool_call>{"name":"a","arguments":{}}</tool_call>`)
	f.Add(`text <tool_call>{"name":1}</tool_call>`)
	f.Fuzz(func(t *testing.T, s string) {
		_, calls := ParseAssistant(s, "c")
		for _, c := range calls {
			require.NotEmpty(t, c.Name)
		}
	})
}
