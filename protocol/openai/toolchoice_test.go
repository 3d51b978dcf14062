package openai

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeToolChoice(t *testing.T) {
	for raw, want := range map[string]ToolChoice{
		``:           {},
		` null `:     {},
		`"auto"`:     {Mode: "auto"},
		`"none"`:     {Mode: "none"},
		`"required"`: {Mode: "required"},
		`{"type":"function","function":{"name":"f"}}`: {Name: "f", Type: "function"},
		// The gateway takes the named form without its type; vLLM does not.
		`{"function":{"name":"f"}}`: {Name: "f"},
	} {
		got, err := DecodeToolChoice(json.RawMessage(raw))
		require.NoError(t, err, raw)
		require.Equal(t, want, got, raw)
	}
	for raw, mode := range map[string]string{`"any"`: "any", `""`: ""} {
		_, err := DecodeToolChoice(json.RawMessage(raw))
		var modeErr *ToolChoiceModeError
		require.True(t, errors.As(err, &modeErr), raw)
		require.Equal(t, mode, modeErr.Mode)
	}
	for _, raw := range []string{`5`, `[]`, `{}`, `{"type":"function"}`, `{"function":{"name":""}}`, `{"function":"f"}`} {
		_, err := DecodeToolChoice(json.RawMessage(raw))
		require.ErrorIs(t, err, ErrToolChoiceShape, raw)
	}
}

// TestEncodeToolChoice: the writer's bytes, and that the reader reads
// them back as they were written.
func TestEncodeToolChoice(t *testing.T) {
	require.Nil(t, EncodeToolChoice(""))
	for choice, want := range map[string]string{
		"auto": `"auto"`, "none": `"none"`, "required": `"required"`,
		"f":   `{"function":{"name":"f"},"type":"function"}`,
		"a<b": `{"function":{"name":"a\u003cb"},"type":"function"}`,
	} {
		raw := EncodeToolChoice(choice)
		require.Equal(t, want, string(raw), choice)
		tc, err := DecodeToolChoice(raw)
		require.NoError(t, err)
		require.Equal(t, choice, tc.Choice())
	}
}
