package tinker

import (
	"bytes"
	"io"

	gojson "github.com/goccy/go-json"
)

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

// maxPresize bounds the buffer ReadBody makes up front from a declared
// size: a larger body grows it as it arrives.
const maxPresize = 16 << 20

// ReadBody reads a body whose Content-Length is size (−1: unknown), on
// both ends. The buffer is made at the declared size, so a train step's
// large bodies are read in a few system calls and copied once, where
// io.ReadAll grows from 512 bytes, reading and copying a little at a
// time. Bound r itself (io.LimitReader, http.MaxBytesReader).
func ReadBody(r io.Reader, size int64) ([]byte, error) {
	var b bytes.Buffer
	if size > 0 {
		b.Grow(int(min(size, maxPresize)) + bytes.MinRead)
	}
	_, err := b.ReadFrom(r)
	return b.Bytes(), err
}
