package trainer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	in := map[string]Tensor{
		"a":      F32Tensor([]int{2, 3}, []float32{1, 2, 3, 4, 5, -6.5}),
		"b":      {DType: "I64", Shape: []int{2}, Data: []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}},
		"scalar": F32Tensor([]int{}, []float32{7}),
		"empty":  F32Tensor([]int{0, 4}, nil),
	}
	var buf bytes.Buffer
	require.NoError(t, WriteSafetensors(&buf, in, map[string]string{"k": "v"}))
	raw := buf.Bytes()
	// The layout is the spec's: LE length, JSON header, aligned data.
	n := binary.LittleEndian.Uint64(raw[:8])
	require.Zero(t, n%8)
	require.Equal(t, byte('{'), raw[8])
	out, meta, err := ReadSafetensors(raw)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"k": "v"}, meta)
	require.Len(t, out, 4)
	v, err := out["a"].Float32s()
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2, 3, 4, 5, -6.5}, v)
	require.Equal(t, []int{2, 3}, out["a"].Shape)
	require.Equal(t, in["b"].Data, out["b"].Data)
	require.Equal(t, []int{}, out["scalar"].Shape)
}

// A file laid out by hand from the spec (metadata first, unpadded header),
// independent of our writer.
func TestSafetensorsReadsSpecExample(t *testing.T) {
	header := `{"__metadata__":{"m":"1"},"x":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}`
	var buf bytes.Buffer
	_ = binary.Write(&buf, binary.LittleEndian, uint64(len(header)))
	buf.WriteString(header)
	_ = binary.Write(&buf, binary.LittleEndian, []float32{1, 2})
	out, meta, err := ReadSafetensors(buf.Bytes())
	require.NoError(t, err)
	require.Equal(t, "1", meta["m"])
	v, err := out["x"].Float32s()
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2}, v)
}

func TestSafetensorsRejectsMalformed(t *testing.T) {
	mk := func(header string, data int) []byte {
		var buf bytes.Buffer
		_ = binary.Write(&buf, binary.LittleEndian, uint64(len(header)))
		buf.WriteString(header)
		buf.Write(make([]byte, data))
		return buf.Bytes()
	}
	for name, raw := range map[string][]byte{
		"short":        {1, 2},
		"huge header":  {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0},
		"not object":   mk(`[1]`, 0),
		"bad dtype":    mk(`{"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}`, 4),
		"size":         mk(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4),
		"out of range": mk(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 2),
		"hole":         mk(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8),
		"overlap":      mk(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4),
		"trailing":     mk(`{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 8),
		"negative":     mk(`{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4),
		"bad metadata": mk(`{"__metadata__":{"a":1}}`, 0),
	} {
		_, _, err := ReadSafetensors(raw)
		require.Error(t, err, name)
	}
}

func FuzzReadSafetensors(f *testing.F) {
	var buf bytes.Buffer
	_ = WriteSafetensors(&buf, map[string]Tensor{"a": F32Tensor([]int{2}, []float32{1, 2})}, map[string]string{"x": "y"})
	f.Add(buf.Bytes())
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '})
	f.Fuzz(func(t *testing.T, data []byte) {
		tensors, meta, err := ReadSafetensors(data)
		if err != nil {
			return
		}
		for name, ts := range tensors {
			n, err := numElements(ts.Shape)
			require.NoError(t, err)
			require.Equal(t, n*dtypeSize[ts.DType], len(ts.Data), name)
		}
		// Whatever parses must write back and parse to the same tensors and
		// metadata, and the written form is a fixed point.
		var out bytes.Buffer
		require.NoError(t, WriteSafetensors(&out, tensors, meta))
		again, meta2, err := ReadSafetensors(out.Bytes())
		require.NoError(t, err)
		require.Len(t, again, len(tensors))
		for name, ts := range tensors {
			got, ok := again[name]
			require.True(t, ok, name)
			require.Equal(t, ts.DType, got.DType, name)
			require.Equal(t, fmt.Sprint(ts.Shape), fmt.Sprint(got.Shape), name)
			require.True(t, bytes.Equal(ts.Data, got.Data), name)
		}
		require.Equal(t, len(meta), len(meta2))
		for k, v := range meta {
			require.Equal(t, v, meta2[k], k)
		}
		var out2 bytes.Buffer
		require.NoError(t, WriteSafetensors(&out2, again, meta2))
		require.Equal(t, out.Bytes(), out2.Bytes())
	})
}

func TestCheckpointRoundTripAndImmutability(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 32, Layers: 1, Heads: 2, DModel: 8, FFN: 16}, 3)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "v7.safetensors")
	require.NoError(t, SaveCheckpoint(path, m, 7, map[string]string{"lineage": "traj-1,traj-2"}))
	got, v, meta, err := LoadCheckpoint(path)
	require.NoError(t, err)
	require.Equal(t, int64(7), v)
	require.Equal(t, "traj-1,traj-2", meta["lineage"])
	require.Equal(t, m.Config, got.Config)
	require.Equal(t, m.W, got.W)
	require.ErrorContains(t, SaveCheckpoint(path, m, 8, nil), "immutable")

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	_, _, _, err = DecodeCheckpoint(raw[:len(raw)-4])
	require.Error(t, err)
}

func FuzzDecodeCheckpoint(f *testing.F) {
	m, err := NewModel(ModelConfig{Context: 4, Layers: 1, Heads: 1, DModel: 2, FFN: 2}, 1)
	if err != nil {
		f.Fatal(err)
	}
	path := filepath.Join(f.TempDir(), "c.safetensors")
	if err := SaveCheckpoint(path, m, 1, nil); err != nil {
		f.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, _, _, err := DecodeCheckpoint(data)
		if err != nil {
			return
		}
		require.Len(t, m.W, m.lay.Total)
		// Every weight comes from the file, bit for bit.
		tensors, _, err := ReadSafetensors(data)
		require.NoError(t, err)
		for _, s := range m.lay.Specs {
			v, err := tensors[s.Name].Float32s()
			require.NoError(t, err)
			require.Len(t, v, s.Size, s.Name)
			for i, w := range v {
				require.Equal(t, math.Float32bits(w), math.Float32bits(m.W[s.Offset+i]), s.Name)
			}
		}
		// A loaded checkpoint is served: whatever its weights (NaN and Inf
		// included), sampling a token answers or errors, never panics.
		_, _ = m.Generate(context.Background(), [][]int{{1, 2}}, SampleOptions{MaxTokens: 2}, rand.New(rand.NewPCG(1, 2)), nil)
	})
}
