package trainer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

func TestTokenizerRoundTrip(t *testing.T) {
	var tok Tokenizer
	for _, s := range []string{"", "hello", "héllo wörld €", "\x00\xff\xfe", `a<tool_call>{"name":"x"}</tool_call>b`, "<|im_end|> stays bytes"} {
		ids := tok.Encode(s)
		require.Equal(t, s, tok.Decode(ids))
		require.NoError(t, validateIDs(ids, VocabSize))
	}
	require.Equal(t, []int{'a', TokToolStart, TokToolEnd}, tok.Encode("a<tool_call></tool_call>"))
	require.Len(t, tok.Encode("<|im_end|>"), len("<|im_end|>"), "users cannot inject the end-of-message token")
	require.Error(t, validateIDs([]int{1, VocabSize}, VocabSize))
	require.Equal(t, "<|unk_999|>", TokenText(999))
}

func FuzzTokenizerRoundTrip(f *testing.F) {
	f.Add("hello <tool_call>x</tool_call>")
	f.Fuzz(func(t *testing.T, s string) {
		var tok Tokenizer
		require.Equal(t, s, tok.Decode(tok.Encode(s)))
	})
}

func TestRenderPromptPrefixErrors(t *testing.T) {
	msgs := []inference.Message{{Role: "user", Content: "a"}}
	_, err := RenderPrompt(msgs, nil, "", []int{TokImStart, TokImEnd, TokImStart, TokImEnd})
	require.ErrorContains(t, err, "cover 2 messages")
	_, err = RenderPrompt(msgs, nil, "", []int{-1})
	require.ErrorContains(t, err, "prompt_token_ids")
	// A prefix cut by max_tokens is closed before the next message.
	ids, err := RenderPrompt([]inference.Message{{Role: "user", Content: "a"}, {Role: "assistant", Content: "xy"}, {Role: "user", Content: "b"}}, nil, "",
		append(Tokenizer{}.Encode("p"), TokImEnd, 'x'))
	require.NoError(t, err)
	require.Equal(t, "p<|im_end|>x<|im_end|><|im_start|>user\nb<|im_end|><|im_start|>assistant\n", Tokenizer{}.Decode(ids))
}

func TestRedactIDsRebuildsOnlyWhatChanged(t *testing.T) {
	var tok Tokenizer
	redact := func(s string) string { return strings.ReplaceAll(s, "bob@example.com", "[REDACTED_EMAIL]") }
	ids := append([]int{TokImStart}, tok.Encode("user\nmail bob@example.com now")...)
	ids = append(ids, TokImEnd, TokImStart)
	ids = append(ids, tok.Encode("assistant\n")...)
	got := tok.RedactIDs(ids, redact)
	require.Equal(t, "<|im_start|>user\nmail [REDACTED_EMAIL] now<|im_end|><|im_start|>assistant\n", tok.Decode(got))
	require.Equal(t, TokImEnd, got[len(tok.Encode("user\nmail [REDACTED_EMAIL] now"))+1], "special tokens stay tokens")

	clean := append([]int{TokImStart}, tok.Encode("user\nhello")...)
	same := tok.RedactIDs(clean, redact)
	require.Equal(t, clean, same)
	require.Equal(t, &clean[0], &same[0], "nothing removed: the ids themselves come back")
	require.Empty(t, tok.RedactIDs(nil, redact))
}
