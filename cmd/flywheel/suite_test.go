package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/store"
)

func TestSuiteFileReadsAToolCallLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "heldout.jsonl")
	lines := `# a tool-using agent's prompt
{"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}], "expect": {"name": "get_weather", "arguments": {"city": "Paris"}}, "match": "tool_call"}
{"prompt": "2+2", "expect": "4", "match": "exact"}
`
	require.NoError(t, os.WriteFile(path, []byte(lines), 0o600))
	items, err := readSuiteFile(path)
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.Equal(t, `{"name":"get_weather","arguments":{"city":"Paris"}}`, items[0].Expect)
	prompts, err := store.SuitePrompts(store.SuiteRegression, items)
	require.NoError(t, err)
	require.JSONEq(t, `[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]`, string(prompts[0].Tools))

	require.NoError(t, os.WriteFile(path, []byte(`{"prompt": "p", "expect": "x", "tool": []}`+"\n"), 0o600))
	_, err = readSuiteFile(path)
	require.ErrorContains(t, err, "line 1", "a misspelt field is refused, the line named")
}
