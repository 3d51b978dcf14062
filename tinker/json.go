package tinker

import gojson "github.com/goccy/go-json"

// Marshal and Unmarshal are the wire's JSON codec, on both ends: the
// client's requests and the embedded server's answers, the server's
// reading of requests and the client's of answers. goccy/go-json reads
// and writes what encoding/json does (FuzzWireJSON holds it to that on
// the wire's types, error for error and value for value) at two to five
// times its speed on a train step's tensors, which are most of the API's
// cost.
func Marshal(v any) ([]byte, error) { return gojson.Marshal(v) }

// Unmarshal decodes data into v; see Marshal.
func Unmarshal(data []byte, v any) error { return gojson.Unmarshal(data, v) }
