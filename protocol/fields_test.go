package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSetFieldKeepsEveryOtherByte(t *testing.T) {
	for in, want := range map[string]string{
		`{"a": 1, "model" :  "x" , "b":[1, {"model": 2}]}`: `{"a": 1, "model" :  "m" , "b":[1, {"model": 2}]}`,
		`{ }`:      `{ "model":"m"}`,
		`{"b":{}}`: `{"b":{},"model":"m"}`,
	} {
		out, err := SetField([]byte(in), "model", json.RawMessage(`"m"`))
		require.NoError(t, err, in)
		require.Equal(t, want, string(out))
		v, err := Field(out, "model")
		require.NoError(t, err)
		require.Equal(t, `"m"`, string(v))
	}
	for in, want := range map[string]string{
		`{"model":"a","model":"b"}`: "given twice",
		`[1]`:                       "want a JSON object",
		`{"a":1} x`:                 "want one JSON object",
		`{"a":`:                     "want a JSON object",
	} {
		_, err := SetField([]byte(in), "model", json.RawMessage(`"m"`))
		require.ErrorContains(t, err, want, in)
	}
}

// FuzzSetField: whatever the body, SetField either refuses it or returns
// valid JSON in which the key holds the new value.
func FuzzSetField(f *testing.F) {
	for _, s := range []string{`{"model":"x","stream":true}`, `{}`, `{"a":[{"model":1}]}`, ` {"model" : null } `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := SetField(body, "model", json.RawMessage(`"m"`))
		if err != nil {
			return
		}
		require.True(t, json.Valid(out), "%q -> %q", body, out)
		v, err := Field(out, "model")
		require.NoError(t, err)
		require.Equal(t, `"m"`, string(v))
	})
}
