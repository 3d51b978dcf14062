package fakeskyrl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// maxBody bounds a request body; SkyRL's own bound (1 GiB, for
// decompressed forward_backward bodies) is far above what a test sends.
const maxBody = 64 << 20

// idPattern and idMaxLength are SkyRL's ID_PATTERN and ID_MAX_LENGTH for
// checkpoint names and path ids.
var idPattern = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

const idMaxLength = 255

// fieldError is one entry of FastAPI's 422 detail list (pydantic's
// ErrorDetails).
type fieldError struct {
	Type  string `json:"type"`
	Loc   []any  `json:"loc"`
	Msg   string `json:"msg"`
	Input any    `json:"input"`
}

// checker collects the errors of one body under a location prefix:
// ["body"] for FastAPI's own body parsing, [] where SkyRL validates the
// body itself (forward_backward) and re-raises pydantic's errors.
type checker struct {
	prefix []any
	errs   []fieldError
}

func (c *checker) loc(path ...any) []any {
	return append(append([]any{}, c.prefix...), path...)
}

func (c *checker) add(typ, msg string, input any, path ...any) {
	c.errs = append(c.errs, fieldError{Type: typ, Loc: c.loc(path...), Msg: msg, Input: input})
}

func (c *checker) missing(input any, path ...any) {
	c.add("missing", "Field required", input, path...)
}

// idField checks a string against SkyRL's id pattern and length.
func (c *checker) idField(v string, path ...any) {
	switch {
	case len(v) > idMaxLength:
		c.add("string_too_long", fmt.Sprintf("String should have at most %d characters", idMaxLength), v, path...)
	case !idPattern.MatchString(v):
		c.add("string_pattern_mismatch", "String should match pattern '"+idPattern.String()+"'", v, path...)
	}
}

// decodeBody reads and decodes a JSON body into dst. A body that does not
// decode yields FastAPI's 422 entries and a nil raw body.
func decodeBody(r *http.Request, dst any, c *checker) (raw map[string]any) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		c.add("json_invalid", "JSON decode error", map[string]any{}, 0)
		return nil
	}
	var generic any
	if err := json.Unmarshal(body, &generic); err != nil {
		var syn *json.SyntaxError
		offset := 0
		if errors.As(err, &syn) {
			offset = int(syn.Offset)
		}
		c.add("json_invalid", "JSON decode error", map[string]any{}, offset)
		return nil
	}
	obj, ok := generic.(map[string]any)
	if !ok {
		c.add("model_attributes_type", "Input should be a valid dictionary or object to extract fields from", generic)
		return nil
	}
	if err := json.Unmarshal(body, dst); err != nil {
		var typ *json.UnmarshalTypeError
		if !errors.As(err, &typ) {
			c.add("json_invalid", "JSON decode error", map[string]any{}, 0)
			return nil
		}
		kind, msg := typeError(typ.Type)
		c.add(kind, msg, typ.Value, fieldPath(typ.Field)...)
		return nil
	}
	return obj
}

// typeError names pydantic's error for a value of the wrong JSON type.
func typeError(t reflect.Type) (string, string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "string_type", "Input should be a valid string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "int_type", "Input should be a valid integer"
	case reflect.Float32, reflect.Float64:
		return "float_type", "Input should be a valid number"
	case reflect.Bool:
		return "bool_type", "Input should be a valid boolean"
	case reflect.Slice:
		return "list_type", "Input should be a valid list"
	case reflect.Map:
		return "dict_type", "Input should be a valid dictionary"
	default:
		return "model_type", "Input should be a valid dictionary or instance of the model"
	}
}

func fieldPath(field string) []any {
	if field == "" {
		return nil
	}
	var path []any
	for _, part := range strings.Split(field, ".") {
		if n, err := strconv.Atoi(part); err == nil {
			path = append(path, n)
			continue
		}
		path = append(path, part)
	}
	return path
}

// pyList formats sorted names as Python's repr of a list of str, which is
// how SkyRL's validator messages print them.
func pyList(names []string) string {
	sort.Strings(names)
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = "'" + n + "'"
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}
