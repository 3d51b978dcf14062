package activities

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// toolBackend answers as a tool-using agent: each version makes the call
// calls names (or answers in text without one).
type toolBackend struct {
	calls map[string][]inference.ToolCall
	mu    sync.Mutex // suite prompts are answered concurrently
	seen  []*inference.Request
}

func (b *toolBackend) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	b.mu.Lock()
	b.seen = append(b.seen, req)
	b.mu.Unlock()
	msg := inference.Message{Role: inference.RoleAssistant, ToolCalls: b.calls[req.Version]}
	if len(msg.ToolCalls) == 0 {
		msg.Content = "It is sunny in Lyon."
	}
	return &inference.Response{Message: msg, FinishReason: inference.FinishToolCalls, ModelVersion: req.Version}, nil
}

func TestSuiteWithToolsIsAskedWithThemAndJudgedByToolCall(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	line := `{"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}],
	"messages": [{"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
		{"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
		{"role": "user", "content": "And in Lyon, in Fahrenheit?"}],
	"expect": {"name": "get_weather", "arguments": {"city": "Lyon", "unit": "F"}}, "match": "tool_call"}`
	var item store.SuiteItem
	require.NoError(t, json.Unmarshal([]byte(line), &item))
	prompts, err := store.SuitePrompts(store.SuiteRegression, []store.SuiteItem{item})
	require.NoError(t, err)
	_, err = store.SetEvalSuite(ctx, db, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)

	b := &toolBackend{calls: map[string][]inference.ToolCall{
		"dep@right":     {{ID: "c1", Name: "get_weather", Arguments: `{"unit": "F", "city": "Lyon"}`}},
		"dep@wrongargs": {{ID: "c1", Name: "get_weather", Arguments: `{"city": "Paris", "unit": "F"}`}},
		"dep@wrongtool": {{ID: "c1", Name: "get_forecast", Arguments: `{"city": "Lyon", "unit": "F"}`}},
	}}
	r := &Release{DB: db, Backend: b}
	s, err := r.loadSuite(ctx, "dep", store.SuiteRegression)
	require.NoError(t, err)
	for version, want := range map[string]float64{"dep@right": 1, "dep@wrongargs": 0, "dep@wrongtool": 0, "dep@text": 0} {
		got, err := r.measure(ctx, "dep", variant{version: version, key: version}, s, true)
		require.NoError(t, err)
		require.Equal(t, []float64{want}, got, version)
	}

	// The backend was asked the stored conversation, tool turns and tools
	// included.
	require.Len(t, b.seen, 4)
	req := b.seen[0]
	require.Len(t, req.Tools, 1)
	require.Equal(t, []inference.Tool{{Name: "get_weather", Parameters: req.Tools[0].Parameters}}, req.Tools)
	require.JSONEq(t, `{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}`, string(req.Tools[0].Parameters))
	require.Len(t, req.Messages, 4)
	require.Equal(t, inference.Message{Role: inference.RoleAssistant, ToolCalls: []inference.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city": "Paris"}`}}}, req.Messages[1])
	require.Equal(t, inference.Message{Role: inference.RoleTool, ToolCallID: "call_1", Content: "18C, sunny"}, req.Messages[2])

	// A result shows the call the answer made, for the status page and
	// reviewers.
	var answer string
	require.NoError(t, db.QueryRow(ctx, `SELECT answer FROM suite_results WHERE subject = 'dep@right'`).Scan(&answer))
	require.Equal(t, `{"name":"get_weather","arguments":{"unit":"F","city":"Lyon"}}`, answer)
	require.NoError(t, db.QueryRow(ctx, `SELECT answer FROM suite_results WHERE subject = 'dep@text'`).Scan(&answer))
	require.Equal(t, "It is sunny in Lyon.", answer)
}

func TestSuiteAnswerTextShowsContentThenEachCall(t *testing.T) {
	m := inference.Message{Content: "Checking.", ToolCalls: []inference.ToolCall{
		{Name: "a", Arguments: "{ \"x\" : 1 }"},
		{Name: "b", Arguments: "not json"},
	}}
	require.Equal(t, "Checking.\n"+`{"name":"a","arguments":{"x":1}}`+"\n"+`{"name":"b","arguments":"not json"}`, answerText(m))
}

func TestSuitePassesJudgeToolCallOnCallsAndTextOnContent(t *testing.T) {
	call := inference.Message{ToolCalls: []inference.ToolCall{{Name: "get_weather", Arguments: `{"city":"Lyon"}`}}}
	require.True(t, passes(store.MatchToolCall, `{"name":"get_weather","arguments":{"city":"Lyon"}}`, call))
	require.False(t, passes(store.MatchToolCall, `{"name":"get_weather","arguments":{"city":"Oslo"}}`, call))
	require.False(t, passes(store.MatchToolCall, `{"name":"get_weather"}`, inference.Message{Content: `{"name":"get_weather"}`}),
		"a call written as text is no call")
	require.False(t, passes(store.MatchContains, "get_weather", call), "the text rules read the content, not the calls")
	require.True(t, passes(store.MatchContains, "lyon", inference.Message{Content: "Lyon"}))
}

// TestSuitePromptIsAskedAtItsTemperature: a prompt registered with a
// temperature is sampled at it with its own fixed seed (the same for every
// version, another for another prompt); one without is greedy.
func TestSuitePromptIsAskedAtItsTemperature(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	prompts, err := store.SuitePrompts(store.SuiteRegression, []store.SuiteItem{
		{Prompt: "sampled", Expect: "x", Temperature: 0.8}, {Prompt: "greedy", Expect: "x"}})
	require.NoError(t, err)
	_, err = store.SetEvalSuite(ctx, db, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	b := &toolBackend{}
	r := &Release{DB: db, Backend: b, SuiteConcurrency: 1}
	s, err := r.loadSuite(ctx, "dep", store.SuiteRegression)
	require.NoError(t, err)
	_, err = r.measure(ctx, "dep", variant{version: "dep@v1", key: "dep@v1"}, s, true)
	require.NoError(t, err)
	_, err = r.measure(ctx, "dep", variant{version: "dep@v2", key: "dep@v2"}, s, true)
	require.NoError(t, err)
	require.Len(t, b.seen, 4)
	seeds := map[string]int64{}
	for i, want := range []float64{0.8, 0, 0.8, 0} {
		req := b.seen[i]
		require.NotNil(t, req.Temperature)
		require.Equal(t, want, *req.Temperature, req.Messages[0].Content)
		require.NotNil(t, req.Seed, "sampled or not, the seed is fixed")
		if s, ok := seeds[req.Messages[0].Content]; ok {
			require.Equal(t, s, *req.Seed, "every version draws the same numbers for a prompt")
		}
		seeds[req.Messages[0].Content] = *req.Seed
	}
	require.NotEqual(t, seeds["sampled"], seeds["greedy"], "two prompts draw independent numbers")
}
