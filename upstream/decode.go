package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// Decoding the upstream's answer was half of the gateway's CPU per call:
// encoding/json reflects over one small object per generated token
// (token text, logprob, top_logprobs). decodeWire is a hand-written
// decoder for the shape vLLM, SGLang and OpenAI send. It decodes exactly
// what json.Unmarshal would into a wireResponse, or gives up and lets
// encoding/json decode the whole body: on duplicate keys, keys that only
// match a field case-insensitively, nulls where a value is expected, tool
// calls, non-empty top_logprobs, numbers that are not plain integers where
// ints go, and anything malformed. FuzzDecodeWire holds it to
// json.Unmarshal's answer.

// errUnusual means the fast decoder declined the input; it never reaches
// a caller.
var errUnusual = errors.New("upstream: response needs encoding/json")

// decodeWire decodes one response body (a whole JSON document) into w.
// Trailing non-space bytes are left to encoding/json's Decoder, which
// ignores them after the first value, as the non-fast path always did.
func decodeWire(body []byte, w *wireResponse) error {
	var fast wireResponse
	d := fastDecoder{buf: body}
	if err := d.response(&fast); err == nil {
		*w = fast
		return nil
	}
	*w = wireResponse{}
	return json.NewDecoder(bytes.NewReader(body)).Decode(w)
}

// unmarshalWire is json.Unmarshal(data, w) with the fast path: a stream
// chunk must be exactly one JSON value.
func unmarshalWire(data []byte, w *wireResponse) error {
	var fast wireResponse
	d := fastDecoder{buf: data}
	if err := d.response(&fast); err == nil {
		*w = fast
		return nil
	}
	*w = wireResponse{}
	return json.Unmarshal(data, w)
}

type fastDecoder struct {
	buf []byte
	pos int
}

func (d *fastDecoder) response(w *wireResponse) error {
	var seen uint8
	err := d.object(func(key []byte) error {
		switch string(key) {
		case "model":
			if err := d.once(&seen, 1); err != nil {
				return err
			}
			return d.optStr(&w.Model)
		case "error":
			return errUnusual // rare: encoding/json decodes it
		case "choices":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			w.Choices = []wireChoice{}
			return d.array(func() error {
				w.Choices = append(w.Choices, wireChoice{})
				return d.choice(&w.Choices[len(w.Choices)-1])
			})
		case "prompt_token_ids":
			if err := d.once(&seen, 4); err != nil {
				return err
			}
			ids, err := d.ints()
			w.PromptTokenIDs = ids
			return err
		case "usage":
			if err := d.once(&seen, 8); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			w.Usage = &openai.Usage{}
			return d.usage(w.Usage)
		}
		return d.skipUnknown(key)
	})
	if err != nil {
		return err
	}
	d.space()
	if d.pos != len(d.buf) {
		return errUnusual
	}
	return nil
}

func (d *fastDecoder) usage(u *openai.Usage) error {
	var seen uint8
	return d.object(func(key []byte) error {
		switch string(key) {
		case "prompt_tokens":
			if err := d.once(&seen, 1); err != nil {
				return err
			}
			return d.optInt(&u.PromptTokens)
		case "completion_tokens":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			return d.optInt(&u.CompletionTokens)
		case "total_tokens":
			if err := d.once(&seen, 4); err != nil {
				return err
			}
			return d.optInt(&u.TotalTokens)
		}
		return d.skipUnknown(key)
	})
}

func (d *fastDecoder) choice(c *wireChoice) error {
	var seen uint8
	return d.object(func(key []byte) error {
		switch string(key) {
		case "message":
			if err := d.once(&seen, 1); err != nil {
				return err
			}
			return d.message(&c.Message)
		case "delta":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			return d.message(&c.Delta)
		case "finish_reason":
			if err := d.once(&seen, 4); err != nil {
				return err
			}
			return d.optStrPtr(&c.FinishReason)
		case "logprobs":
			if err := d.once(&seen, 8); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			c.Logprobs = &struct {
				Content []wireLogprob `json:"content"`
			}{}
			return d.logprobs(&c.Logprobs.Content)
		case "token_ids":
			if err := d.once(&seen, 16); err != nil {
				return err
			}
			ids, err := d.ints()
			c.TokenIDs = ids
			return err
		case "stop_reason":
			if err := d.once(&seen, 32); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			if d.peek() != '"' {
				return errUnusual // a stop token id: json's answer
			}
			s, err := d.str()
			c.StopReason = stopReason(s)
			return err
		}
		return d.skipUnknown(key)
	})
}

// message decodes a message or delta; tool calls other than an empty
// list go to encoding/json.
func (d *fastDecoder) message(m *openai.RespMessage) error {
	if d.null() {
		return nil // json leaves a struct untouched on null
	}
	var seen uint8
	return d.object(func(key []byte) error {
		switch string(key) {
		case "role":
			if err := d.once(&seen, 1); err != nil {
				return err
			}
			return d.optStrKnown(&m.Role, inference.RoleAssistant)
		case "content":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			return d.optStrPtr(&m.Content)
		case "reasoning_content":
			if err := d.once(&seen, 4); err != nil {
				return err
			}
			return d.optStr(&m.ReasoningContent)
		case "refusal":
			if err := d.once(&seen, 8); err != nil {
				return err
			}
			return d.optStrPtr(&m.Refusal)
		case "tool_calls":
			if err := d.once(&seen, 16); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			m.ToolCalls = []openai.ToolCall{}
			return d.emptyArray()
		}
		return d.skipUnknown(key)
	})
}

func (d *fastDecoder) logprobs(content *[]wireLogprob) error {
	var seen uint8
	return d.object(func(key []byte) error {
		if string(key) != "content" {
			return d.skipUnknown(key)
		}
		if err := d.once(&seen, 1); err != nil {
			return err
		}
		if d.null() {
			return nil
		}
		out := make([]wireLogprob, 0, 64)
		err := d.array(func() error {
			out = append(out, wireLogprob{})
			return d.logprob(&out[len(out)-1])
		})
		*content = out
		return err
	})
}

func (d *fastDecoder) logprob(lp *wireLogprob) error {
	var seen uint8
	return d.object(func(key []byte) error {
		switch string(key) {
		case "token":
			if err := d.once(&seen, 1); err != nil {
				return err
			}
			return d.optStr(&lp.Token)
		case "logprob":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			lit, err := d.number()
			if err != nil {
				return err
			}
			f, err := strconv.ParseFloat(string(lit), 32)
			if err != nil {
				return errUnusual
			}
			lp.Logprob = float32(f)
			return nil
		case "top_logprobs":
			if err := d.once(&seen, 4); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			lp.TopLogprobs = []struct {
				Token   string  `json:"token"`
				Logprob float32 `json:"logprob"`
			}{}
			return d.emptyArray()
		}
		return d.skipUnknown(key)
	})
}

// once refuses a key seen before in the same object: json.Unmarshal
// merges or replaces on duplicates, which this decoder does not mirror.
func (d *fastDecoder) once(seen *uint8, bit uint8) error {
	if *seen&bit != 0 {
		return errUnusual
	}
	*seen |= bit
	return nil
}

// skipUnknown skips the value of a key no field is named after. A key
// with upper-case or non-ASCII letters could still match a field the way
// encoding/json matches (case-insensitively), so it is left to json.
func (d *fastDecoder) skipUnknown(key []byte) error {
	for _, c := range key {
		if c >= 0x80 || ('A' <= c && c <= 'Z') {
			return errUnusual
		}
	}
	return d.skip(0)
}
