package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// SetField returns the JSON object obj with the value of its top-level
// key replaced by value, every other byte as it was: a body relayed to
// another server keeps its fields, their order and their spelling. A key
// that obj lacks is added at its end.
func SetField(obj []byte, key string, value json.RawMessage) ([]byte, error) {
	start, end, closing, err := fieldSpan(obj, key)
	if err != nil {
		return nil, err
	}
	if start < 0 {
		k, _ := json.Marshal(key)
		sep := ","
		if len(bytes.TrimSpace(obj[bytes.IndexByte(obj, '{')+1:closing])) == 0 {
			sep = ""
		}
		out := make([]byte, 0, len(obj)+len(k)+len(value)+2)
		out = append(append(append(append(append(out, obj[:closing]...), sep...), k...), ':'), value...)
		return append(out, obj[closing:]...), nil
	}
	out := make([]byte, 0, len(obj)-(end-start)+len(value))
	return append(append(append(out, obj[:start]...), value...), obj[end:]...), nil
}

// Field is the raw value of obj's top-level key (nil when obj lacks it).
func Field(obj []byte, key string) (json.RawMessage, error) {
	start, end, _, err := fieldSpan(obj, key)
	if err != nil || start < 0 {
		return nil, err
	}
	return obj[start:end], nil
}

// fieldSpan finds the bytes of the value of obj's top-level key (start
// is -1 when there is none) and the object's closing brace. A key given
// twice is refused: which one a server reads is its own choice.
func fieldSpan(obj []byte, key string) (start, end, closing int, err error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 0, 0, 0, errors.New("want a JSON object")
	}
	start = -1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return 0, 0, 0, fmt.Errorf("want a JSON object: %w", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return 0, 0, 0, fmt.Errorf("want a JSON object: %w", err)
		}
		if tok == key {
			if start >= 0 {
				return 0, 0, 0, fmt.Errorf("%s: given twice", key)
			}
			end = int(dec.InputOffset())
			start = end - len(v)
		}
	}
	if _, err := dec.Token(); err != nil {
		return 0, 0, 0, fmt.Errorf("want a JSON object: %w", err)
	}
	closing = int(dec.InputOffset()) - 1
	if len(bytes.TrimSpace(obj[closing+1:])) > 0 {
		return 0, 0, 0, errors.New("want one JSON object")
	}
	return start, end, closing, nil
}
