package store_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

const weatherTool = `[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
	"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}]`

// weatherTurns is a tool conversation: the model called get_weather, the
// tool answered, and the user asks again.
const weatherTurns = `[{"role": "user", "content": "Weather in Paris?"},
	{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
	{"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
	{"role": "user", "content": "And in Lyon, in Fahrenheit?"}]`

func suiteItem(t *testing.T, line string) store.SuiteItem {
	t.Helper()
	var it store.SuiteItem
	require.NoError(t, json.Unmarshal([]byte(line), &it))
	return it
}

func TestSuiteItemReadsAToolCallExpectation(t *testing.T) {
	it := suiteItem(t, `{"prompt": "p", "expect": {"name": "get_weather", "arguments": {"city": "Paris"}}, "match": "tool_call"}`)
	require.Equal(t, `{"name":"get_weather","arguments":{"city":"Paris"}}`, it.Expect, "an object is kept as its compact JSON")
	require.Equal(t, "Paris", suiteItem(t, `{"prompt": "p", "expect": "Paris"}`).Expect)

	var bad store.SuiteItem
	require.ErrorContains(t, json.Unmarshal([]byte(`{"prompt": "p", "expected": "Paris"}`), &bad), "expected", "a misspelt field is refused")
	require.ErrorContains(t, json.Unmarshal([]byte(`{"prompt": "p", "expect": 4}`), &bad), "expect")
}

func TestSuitePromptsValidateToolsAndToolTurns(t *testing.T) {
	for _, c := range []struct {
		name, line string
		want       []string
	}{
		{"a tool without a name", `{"prompt": "p", "expect": "x", "tools": [{"type": "function", "function": {"description": "d"}}]}`,
			[]string{"prompt 1", "tools[0].function.name"}},
		{"two tools of one name", `{"prompt": "p", "expect": "x", "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}`,
			[]string{"prompt 1", "tools[1].function.name", `"a" is offered twice`}},
		{"parameters that are not an object", `{"prompt": "p", "expect": "x", "tools": [{"type": "function", "function": {"name": "a", "parameters": [1]}}]}`,
			[]string{"prompt 1", "tools[0].function.parameters", "object"}},
		{"tools that are not an array", `{"prompt": "p", "expect": "x", "tools": {"name": "a"}}`,
			[]string{"prompt 1", "tools:"}},
		{"a tool turn without its call's id", `{"messages": [{"role": "user", "content": "u"}, {"role": "tool", "content": "r"}], "expect": "x"}`,
			[]string{"prompt 1", "messages[1]", "tool_call_id"}},
		{"tool calls on a user turn", `{"messages": [{"role": "user", "content": "u", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "a", "arguments": "{}"}}]}], "expect": "x"}`,
			[]string{"prompt 1", "messages[0]", "tool_calls"}},
		{"an unknown role", `{"messages": [{"role": "robot", "content": "hi"}], "expect": "x"}`,
			[]string{"prompt 1", "messages[0]", "robot"}},
		{"tool_call without a name", `{"prompt": "p", "expect": {"arguments": {}}, "match": "tool_call"}`,
			[]string{"prompt 1", "expect", "tool_call", "name: required"}},
		{"tool_call arguments that are not an object", `{"prompt": "p", "expect": {"name": "a", "arguments": "{}"}, "match": "tool_call"}`,
			[]string{"prompt 1", "expect", "arguments: want a JSON object"}},
		{"tool_call expecting text", `{"prompt": "p", "expect": "call get_weather", "match": "tool_call"}`,
			[]string{"prompt 1", "expect", "tool_call"}},
		{"tool_call of a tool not offered", `{"prompt": "p", "tools": ` + weatherTool + `, "expect": {"name": "get_time"}, "match": "tool_call"}`,
			[]string{"prompt 1", `"get_time"`, "does not offer"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			good := suiteItem(t, `{"prompt": "fine", "expect": "x"}`)
			_, err := store.SuitePrompts(store.SuiteRegression, []store.SuiteItem{suiteItem(t, c.line), good})
			require.Error(t, err)
			for _, w := range c.want {
				require.ErrorContains(t, err, w)
			}
			require.NotContains(t, err.Error(), "prompt 2", "only the bad prompt is named")
		})
	}

	ok, err := store.SuitePrompts(store.SuiteRegression, []store.SuiteItem{
		suiteItem(t, `{"messages": `+weatherTurns+`, "tools": `+weatherTool+`, "expect": {"name": "get_weather", "arguments": {"city": "Lyon", "unit": "F"}}, "match": "tool_call"}`),
		suiteItem(t, `{"prompt": "no tools here", "tools": [], "expect": "x"}`),
	})
	require.NoError(t, err)
	require.Nil(t, ok[1].Tools, `"tools": [] offers none`)
}

func TestSuiteToolCallExpectMatches(t *testing.T) {
	e, err := store.ParseToolCallExpect(`{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "F", "days": [1, 2]}}`)
	require.NoError(t, err)
	call := func(name, args string) []inference.ToolCall {
		return []inference.ToolCall{{ID: "c", Name: name, Arguments: args}}
	}
	require.True(t, e.Matches(call("get_weather", `{"city":"Lyon","unit":"F","days":[1,2]}`)))
	require.True(t, e.Matches(call("get_weather", "{\n  \"days\": [1, 2], \"unit\": \"F\",\n \"city\": \"Lyon\"}")), "key order and spacing do not count")
	require.True(t, e.Matches(append(call("lookup", `{}`), call("get_weather", `{"unit":"F","city":"Lyon","days":[1,2]}`)...)), "any of the calls")
	require.False(t, e.Matches(call("get_forecast", `{"city":"Lyon","unit":"F","days":[1,2]}`)), "wrong name")
	require.False(t, e.Matches(call("get_weather", `{"city":"Paris","unit":"F","days":[1,2]}`)), "wrong value")
	require.False(t, e.Matches(call("get_weather", `{"city":"Lyon","unit":"F"}`)), "missing argument")
	require.False(t, e.Matches(call("get_weather", `{"city":"Lyon","unit":"F","days":[2,1]}`)), "array order counts")
	require.False(t, e.Matches(call("get_weather", `{"city":"Lyon"`)), "arguments that are not JSON")
	require.False(t, e.Matches(nil), "no call")

	anyArgs, err := store.ParseToolCallExpect(`{"name": "get_weather"}`)
	require.NoError(t, err)
	require.True(t, anyArgs.Matches(call("get_weather", `{"city":"Oslo"}`)), "without arguments, the name decides")
	none, err := store.ParseToolCallExpect(`{"name": "now", "arguments": {}}`)
	require.NoError(t, err)
	require.True(t, none.Matches(call("now", "")), "a call sent without arguments has none")
	require.False(t, none.Matches(call("now", `{"tz":"UTC"}`)))
}

func TestSuiteKeyOfToolLessPromptsIsUnchanged(t *testing.T) {
	// The key of ids 1 and 2 as stored gate results name it since before
	// prompts had tools: a new key would orphan their anchor looks.
	require.Equal(t, "8c7654ecfd7b0b62", store.SuiteKey([]store.EvalPrompt{{ID: 1}, {ID: 2}}))
}

func TestSuiteWithToolsRoundTrip(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	items := []store.SuiteItem{
		suiteItem(t, `{"messages": `+weatherTurns+`, "tools": `+weatherTool+`, "expect": {"name": "get_weather", "arguments": {"city": "Lyon", "unit": "F"}}, "match": "tool_call"}`),
		{Prompt: "plain", Expect: "text"},
	}
	prompts, err := store.SuitePrompts(store.SuiteRegression, items)
	require.NoError(t, err)
	changed, err := store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	require.True(t, changed)

	got, err := store.EvalSuite(ctx, pool, "dep", store.SuiteRegression)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.JSONEq(t, weatherTool, string(got[0].Tools))
	require.JSONEq(t, weatherTurns, string(got[0].Messages))
	require.Equal(t, store.MatchToolCall, got[0].Match)
	require.JSONEq(t, `{"name": "get_weather", "arguments": {"unit": "F", "city": "Lyon"}}`, string(got[0].ExpectValue().(json.RawMessage)))
	require.Nil(t, got[1].Tools, "a prompt without tools stores none")
	require.Equal(t, "text", got[1].ExpectValue())

	msgs, tools, err := got[0].Conversation()
	require.NoError(t, err)
	require.Len(t, tools, 1)
	require.Equal(t, []inference.Tool{{Name: "get_weather", Description: "Weather of a city", Parameters: tools[0].Parameters}}, tools)
	require.JSONEq(t, `{"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}`, string(tools[0].Parameters))
	require.Len(t, msgs, 4)
	require.Equal(t, []inference.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city": "Paris"}`}}, msgs[1].ToolCalls)
	require.Equal(t, inference.Message{Role: inference.RoleTool, Content: "18C, sunny", ToolCallID: "call_1"}, msgs[2])

	// The same prompts keep their ids and key; other tools replace them.
	key := store.SuiteKey(got)
	changed, err = store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	require.False(t, changed)
	again, err := store.EvalSuite(ctx, pool, "dep", store.SuiteRegression)
	require.NoError(t, err)
	require.Equal(t, key, store.SuiteKey(again))

	items[0].Tools = json.RawMessage(`[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]`)
	other, err := store.SuitePrompts(store.SuiteRegression, items)
	require.NoError(t, err)
	changed, err = store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, other)
	require.NoError(t, err)
	require.True(t, changed, "other tools are another suite")
	replaced, err := store.EvalSuite(ctx, pool, "dep", store.SuiteRegression)
	require.NoError(t, err)
	require.NotEqual(t, key, store.SuiteKey(replaced))
	require.JSONEq(t, string(items[0].Tools), string(replaced[0].Tools))

	// Dropping the tools alone is a change too.
	items[0].Tools = nil
	bare, err := store.SuitePrompts(store.SuiteRegression, items)
	require.NoError(t, err)
	changed, err = store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, bare)
	require.NoError(t, err)
	require.True(t, changed)
}
