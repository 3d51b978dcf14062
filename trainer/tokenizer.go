package trainer

import (
	"fmt"
	"strings"
)

// Token ids: 0–255 are raw bytes, so any UTF-8 (or binary) text round-trips
// exactly; the rest are special tokens the chat template inserts. Byte-level
// keeps the vocabulary (and so the output layer) tiny, which matters more for
// a CPU-trained policy than sequence length does.
const (
	TokImStart   = 256 // <|im_start|>
	TokImEnd     = 257 // <|im_end|>: ends a message; the sampler's stop token
	TokToolStart = 258 // <tool_call>
	TokToolEnd   = 259 // </tool_call>
	VocabSize    = 260
)

var specialText = map[int]string{
	TokImStart:   "<|im_start|>",
	TokImEnd:     "<|im_end|>",
	TokToolStart: "<tool_call>",
	TokToolEnd:   "</tool_call>",
}

// Tokenizer is the byte-level tokenizer. The zero value is ready to use.
type Tokenizer struct{}

// Encode turns text into byte tokens. Special-token spellings inside text stay
// plain bytes except the tool-call markers, which the model must be able to
// emit and read back as single tokens.
func (Tokenizer) Encode(text string) []int {
	ids := make([]int, 0, len(text))
	for len(text) > 0 {
		if strings.HasPrefix(text, specialText[TokToolStart]) {
			ids = append(ids, TokToolStart)
			text = text[len(specialText[TokToolStart]):]
			continue
		}
		if strings.HasPrefix(text, specialText[TokToolEnd]) {
			ids = append(ids, TokToolEnd)
			text = text[len(specialText[TokToolEnd]):]
			continue
		}
		ids = append(ids, int(text[0]))
		text = text[1:]
	}
	return ids
}

// Decode turns ids back into text; special tokens become their spelling.
func (Tokenizer) Decode(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(TokenText(id))
	}
	return b.String()
}

// TokenText is the text of one token (a single byte may be part of a UTF-8
// sequence; concatenating TokenText of consecutive ids gives valid text).
func TokenText(id int) string {
	if id >= 0 && id < 256 {
		return string([]byte{byte(id)})
	}
	if s, ok := specialText[id]; ok {
		return s
	}
	return fmt.Sprintf("<|unk_%d|>", id)
}

// validateIDs reports the first id outside the vocabulary.
func validateIDs(ids []int, vocab int) error {
	for i, id := range ids {
		if id < 0 || id >= vocab {
			return fmt.Errorf("token id %d at position %d is outside the vocabulary [0,%d)", id, i, vocab)
		}
	}
	return nil
}

// RedactIDs passes every run of byte tokens in ids (the text between special
// tokens) through redact and re-encodes it as bytes; special tokens stay.
// When redact changes nothing, ids itself is returned.
func (Tokenizer) RedactIDs(ids []int, redact func(string) string) []int {
	var out []int // nil until some run changes
	start := 0
	buf := make([]byte, 0, 256)
	for i := 0; i <= len(ids); i++ {
		if i < len(ids) && ids[i] >= 0 && ids[i] < 256 {
			continue
		}
		if i > start { // ids[start:i] is a run of bytes
			buf = buf[:0]
			for _, id := range ids[start:i] {
				buf = append(buf, byte(id))
			}
			if clean := redact(string(buf)); clean != string(buf) {
				if out == nil {
					out = append(make([]int, 0, len(ids)), ids[:start]...)
				}
				for _, b := range []byte(clean) {
					out = append(out, int(b))
				}
			} else if out != nil {
				out = append(out, ids[start:i]...)
			}
		}
		if i < len(ids) && out != nil {
			out = append(out, ids[i])
		}
		start = i + 1
	}
	if out == nil {
		return ids
	}
	return out
}
