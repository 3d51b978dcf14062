package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"
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

// maxFastDepth bounds the recursion of skipped values; deeper input goes
// to encoding/json, which has its own limit.
const maxFastDepth = 64

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
			w.Usage = &struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			}{}
			return d.usage(&w.Usage.PromptTokens, &w.Usage.CompletionTokens)
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

func (d *fastDecoder) usage(prompt, completion *int) error {
	var seen uint8
	return d.object(func(key []byte) error {
		switch string(key) {
		case "prompt_tokens":
			if err := d.once(&seen, 1); err != nil {
				return err
			}
			return d.optInt(prompt)
		case "completion_tokens":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			return d.optInt(completion)
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
			return d.message(&c.Message.Content, &c.Message.ReasoningContent, &c.Message.ToolCalls)
		case "delta":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			return d.message(&c.Delta.Content, &c.Delta.ReasoningContent, &c.Delta.ToolCalls)
		case "finish_reason":
			if err := d.once(&seen, 4); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			s, err := d.str()
			c.FinishReason = &s
			return err
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
func (d *fastDecoder) message(content **string, reasoning *string, calls *[]wireToolCall) error {
	if d.null() {
		return nil // json leaves a struct untouched on null
	}
	var seen uint8
	return d.object(func(key []byte) error {
		switch string(key) {
		case "content":
			if err := d.once(&seen, 1); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			s, err := d.str()
			*content = &s
			return err
		case "reasoning_content":
			if err := d.once(&seen, 2); err != nil {
				return err
			}
			return d.optStr(reasoning)
		case "tool_calls":
			if err := d.once(&seen, 4); err != nil {
				return err
			}
			if d.null() {
				return nil
			}
			*calls = []wireToolCall{}
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

func (d *fastDecoder) space() {
	for d.pos < len(d.buf) {
		switch d.buf[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// peek is the next non-space byte, or 0 at the end.
func (d *fastDecoder) peek() byte {
	d.space()
	if d.pos < len(d.buf) {
		return d.buf[d.pos]
	}
	return 0
}

// null consumes a null literal if one is next.
func (d *fastDecoder) null() bool {
	if d.peek() == 'n' && bytes.HasPrefix(d.buf[d.pos:], []byte("null")) {
		d.pos += 4
		return true
	}
	return false
}

// object walks {"key": value, ...}; field consumes each value.
func (d *fastDecoder) object(field func(key []byte) error) error {
	if d.peek() != '{' {
		return errUnusual
	}
	d.pos++
	if d.peek() == '}' {
		d.pos++
		return nil
	}
	for {
		if d.peek() != '"' {
			return errUnusual
		}
		key, escaped, err := d.rawString()
		if err != nil || escaped {
			return errUnusual // an escaped key may spell a field name
		}
		if d.peek() != ':' {
			return errUnusual
		}
		d.pos++
		if err := field(key); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return nil
		default:
			return errUnusual
		}
	}
}

// array walks [value, ...]; elem consumes each value.
func (d *fastDecoder) array(elem func() error) error {
	if d.peek() != '[' {
		return errUnusual
	}
	d.pos++
	if d.peek() == ']' {
		d.pos++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return nil
		default:
			return errUnusual
		}
	}
}

func (d *fastDecoder) emptyArray() error {
	return d.array(func() error { return errUnusual })
}

// ints decodes an array of plain integers (or null).
func (d *fastDecoder) ints() ([]int, error) {
	if d.null() {
		return nil, nil
	}
	out := make([]int, 0, 64)
	err := d.array(func() error {
		n, err := d.int()
		out = append(out, n)
		return err
	})
	return out, err
}

// int decodes a JSON integer that fits an int; fractions and exponents,
// which json refuses for int fields, go to json for its error.
func (d *fastDecoder) int() (int, error) {
	lit, err := d.number()
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(lit))
	if err != nil {
		return 0, errUnusual
	}
	return n, nil
}

// number returns the literal of a JSON number, checked against the
// grammar: strconv accepts forms JSON does not (hex, inf, underscores).
func (d *fastDecoder) number() ([]byte, error) {
	d.space()
	b, start := d.buf, d.pos
	i := start
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return nil, errUnusual
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return nil, errUnusual
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return nil, errUnusual
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	d.pos = i
	return b[start:i], nil
}

// optStr decodes a string into *s; null leaves *s as it is, as json does
// for a non-pointer field (each field is decoded at most once, so that is
// its zero value).
func (d *fastDecoder) optStr(s *string) error {
	if d.null() {
		return nil
	}
	v, err := d.str()
	*s = v
	return err
}

// optInt is optStr for an int.
func (d *fastDecoder) optInt(n *int) error {
	if d.null() {
		return nil
	}
	v, err := d.int()
	*n = v
	return err
}

// str decodes a JSON string. Plain strings are copied as they are;
// escapes and invalid UTF-8 go through encoding/json for that one string,
// so replacement characters and surrogates come out exactly as json makes
// them.
func (d *fastDecoder) str() (string, error) {
	if d.peek() != '"' {
		return "", errUnusual
	}
	start := d.pos
	raw, escaped, err := d.rawString()
	if err != nil {
		return "", err
	}
	if !escaped && utf8.Valid(raw) {
		return string(raw), nil
	}
	var s string
	if err := json.Unmarshal(d.buf[start:d.pos], &s); err != nil {
		return "", errUnusual
	}
	return s, nil
}

// rawString consumes a string token and returns its bytes between the
// quotes, whether it holds escapes, and errUnusual when json would refuse
// it (control characters, bad escapes, no closing quote).
func (d *fastDecoder) rawString() ([]byte, bool, error) {
	b := d.buf
	i := d.pos + 1
	escaped := false
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			raw := b[d.pos+1 : i]
			d.pos = i + 1
			return raw, escaped, nil
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return nil, false, errUnusual
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return nil, false, errUnusual
				}
				for _, h := range b[i+2 : i+6] {
					if !isHex(h) {
						return nil, false, errUnusual
					}
				}
				i += 6
			default:
				return nil, false, errUnusual
			}
		case c < 0x20:
			return nil, false, errUnusual
		default:
			i++
		}
	}
	return nil, false, errUnusual
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// skip consumes any JSON value, checking its grammar.
func (d *fastDecoder) skip(depth int) error {
	if depth > maxFastDepth {
		return errUnusual
	}
	switch c := d.peek(); {
	case c == '{':
		return d.object(func(key []byte) error { return d.skip(depth + 1) })
	case c == '[':
		return d.array(func() error { return d.skip(depth + 1) })
	case c == '"':
		_, _, err := d.rawString()
		return err
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	default:
		_, err := d.number()
		return err
	}
}

func (d *fastDecoder) literal(word string) error {
	if !bytes.HasPrefix(d.buf[d.pos:], []byte(word)) {
		return errUnusual
	}
	d.pos += len(word)
	return nil
}
