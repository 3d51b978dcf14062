package upstream

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// The JSON grammar under the fast decoder (decode.go): whitespace,
// objects, arrays, numbers, strings and literals, each checked as
// encoding/json checks it, so that whatever json would refuse or read
// differently goes to json (errUnusual).

// maxFastDepth bounds the recursion of skipped values; deeper input goes
// to encoding/json, which has its own limit.
const maxFastDepth = 64

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

// optStrKnown is optStr that, for the one value every answer repeats
// (the assistant's role), takes the constant instead of copying the bytes.
func (d *fastDecoder) optStrKnown(s *string, known string) error {
	d.space()
	if end := d.pos + len(known) + 2; end <= len(d.buf) && d.buf[d.pos] == '"' && d.buf[end-1] == '"' &&
		string(d.buf[d.pos+1:end-1]) == known {
		d.pos = end
		*s = known
		return nil
	}
	return d.optStr(s)
}

// optStrPtr decodes a string into a new *s; null leaves *s nil, as json
// does for a pointer field decoded once.
func (d *fastDecoder) optStrPtr(s **string) error {
	if d.null() {
		return nil
	}
	v, err := d.str()
	*s = &v
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
