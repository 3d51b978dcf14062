package trainer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// Safetensors, after the format's specification
// (https://github.com/huggingface/safetensors#format): an 8-byte
// little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype","shape","data_offsets":[begin,end]} (offsets relative to the data
// section) plus an optional "__metadata__" string map, then the raw
// little-endian data. The data section must be covered by the tensors exactly
// once, without holes or overlap.

// MaxSafetensorsHeader bounds the JSON header, as the reference reader does,
// so that a corrupt length cannot make us allocate gigabytes.
const MaxSafetensorsHeader = 100 << 20

var dtypeSize = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// Tensor is one named array in a safetensors file.
type Tensor struct {
	DType string
	Shape []int
	Data  []byte // little-endian, row-major
}

// F32Tensor wraps float32 values.
func F32Tensor(shape []int, v []float32) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Tensor{DType: "F32", Shape: shape, Data: b}
}

// Float32s decodes an F32 tensor.
func (t Tensor) Float32s() ([]float32, error) {
	if t.DType != "F32" {
		return nil, fmt.Errorf("tensor dtype is %s, want F32", t.DType)
	}
	v := make([]float32, len(t.Data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

type stEntry struct {
	DType       string `json:"dtype"`
	Shape       []int  `json:"shape"`
	DataOffsets [2]int `json:"data_offsets"`
}

func numElements(shape []int) (int, error) {
	n := 1
	for _, s := range shape {
		if s < 0 {
			return 0, fmt.Errorf("negative dimension %d", s)
		}
		if s != 0 && n > math.MaxInt32*64/s {
			return 0, errors.New("shape too large")
		}
		n *= s
	}
	return n, nil
}

// WriteSafetensors writes tensors (in name order) and metadata.
func WriteSafetensors(w io.Writer, tensors map[string]Tensor, meta map[string]string) error {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		if n == "__metadata__" {
			return errors.New("tensor name __metadata__ is reserved")
		}
		names = append(names, n)
	}
	sort.Strings(names)
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	off := 0
	for _, n := range names {
		t := tensors[n]
		size, ok := dtypeSize[t.DType]
		if !ok {
			return fmt.Errorf("tensor %s: unknown dtype %q", n, t.DType)
		}
		count, err := numElements(t.Shape)
		if err != nil {
			return fmt.Errorf("tensor %s: %w", n, err)
		}
		if count*size != len(t.Data) {
			return fmt.Errorf("tensor %s: shape %v of %s needs %d bytes, have %d", n, t.Shape, t.DType, count*size, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[n] = stEntry{DType: t.DType, Shape: shape, DataOffsets: [2]int{off, off + len(t.Data)}}
		off += len(t.Data)
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("encode safetensors header: %w", err)
	}
	// Pad with spaces so the data section starts 8-byte aligned.
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	if _, err := w.Write(lenBuf[:]); err != nil {
		return fmt.Errorf("write safetensors: %w", err)
	}
	if _, err := w.Write(js); err != nil {
		return fmt.Errorf("write safetensors: %w", err)
	}
	for _, n := range names {
		if _, err := w.Write(tensors[n].Data); err != nil {
			return fmt.Errorf("write safetensors tensor %s: %w", n, err)
		}
	}
	return nil
}

// ReadSafetensors parses a whole safetensors file held in memory.
func ReadSafetensors(buf []byte) (map[string]Tensor, map[string]string, error) {
	if len(buf) < 8 {
		return nil, nil, errors.New("safetensors: file shorter than its 8-byte header length")
	}
	hlen := binary.LittleEndian.Uint64(buf[:8])
	if hlen > MaxSafetensorsHeader {
		return nil, nil, fmt.Errorf("safetensors: header length %d exceeds %d", hlen, MaxSafetensorsHeader)
	}
	if uint64(len(buf)-8) < hlen {
		return nil, nil, fmt.Errorf("safetensors: header length %d exceeds the file (%d bytes)", hlen, len(buf))
	}
	head := buf[8 : 8+hlen]
	if len(bytes.TrimSpace(head)) == 0 || bytes.TrimLeft(head, " ")[0] != '{' {
		return nil, nil, errors.New("safetensors: header is not a JSON object")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(head, &raw); err != nil {
		return nil, nil, fmt.Errorf("safetensors: header: %w", err)
	}
	data := buf[8+hlen:]
	var meta map[string]string
	type span struct {
		name       string
		begin, end int
	}
	var spans []span
	tensors := map[string]Tensor{}
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, fmt.Errorf("safetensors: __metadata__ must map strings to strings: %w", err)
			}
			continue
		}
		var e stEntry
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		size, ok := dtypeSize[e.DType]
		if !ok {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: unknown dtype %q", name, e.DType)
		}
		count, err := numElements(e.Shape)
		if err != nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		b, en := e.DataOffsets[0], e.DataOffsets[1]
		if b < 0 || en < b || en > len(data) {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: data_offsets [%d,%d] outside the data (%d bytes)", name, b, en, len(data))
		}
		if en-b != count*size {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: shape %v of %s needs %d bytes, offsets give %d", name, e.Shape, e.DType, count*size, en-b)
		}
		tensors[name] = Tensor{DType: e.DType, Shape: e.Shape, Data: data[b:en]}
		spans = append(spans, span{name, b, en})
	}
	// The spec forbids holes and overlap: sorted spans must tile the data.
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	pos := 0
	for _, s := range spans {
		if s.begin != pos {
			return nil, nil, fmt.Errorf("safetensors: tensor %q starts at %d, expected %d (hole or overlap)", s.name, s.begin, pos)
		}
		pos = s.end
	}
	if pos != len(data) {
		return nil, nil, fmt.Errorf("safetensors: tensors cover %d of %d data bytes", pos, len(data))
	}
	return tensors, meta, nil
}
