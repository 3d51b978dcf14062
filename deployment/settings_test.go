package deployment

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestResponsesNeedsTheOpenAIDialect: only an OpenAI server is relayed the
// Responses API; any other dialect with responses: true is refused by
// name.
func TestResponsesNeedsTheOpenAIDialect(t *testing.T) {
	for _, raw := range []string{
		`{"base_url":"https://api.openai.com/v1","dialect":"openai","responses":true}`,
		`{"base_url":"https://api.openai.com/v1","vllm":false,"responses":true}`,
	} {
		c, err := Parse([]byte(raw))
		require.NoError(t, err, raw)
		require.True(t, c.Responses)
	}
	for _, raw := range []string{
		`{"base_url":"http://vllm:8000/v1","responses":true}`,
		`{"base_url":"http://sglang:30000/v1","dialect":"sglang","responses":true}`,
		`{"base_url":"https://api.anthropic.com","dialect":"anthropic","responses":true}`,
	} {
		_, err := Parse([]byte(raw))
		require.ErrorContains(t, err, `responses: true needs dialect "openai"`, raw)
	}
}
