package fakeskyrl

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// The tensor names of the sampler adapter, as save_lora_checkpoint writes
// them with prefix "base_model.model." for the fake's one LoRA target.
const (
	loraAKey = "base_model.model.lm_head.lora_A.weight"
	loraBKey = "base_model.model.lm_head.lora_B.weight"
)

// samplerArchive is the tar.gz save_weights_for_sampler stores: a PEFT
// LoRA adapter on lm_head whose B·A is the logit table.
func samplerArchive(baseModel string, lora loraConfig, table []float64) ([]byte, error) {
	r := lora.Rank
	a := make([]float32, r)
	a[0] = 1
	b := make([]float32, len(table)*r)
	for v, x := range table {
		b[v*r] = float32(x)
	}
	tensors, err := safetensors([]tensor{
		{name: loraAKey, shape: []int{r, 1}, data: a},
		{name: loraBKey, shape: []int{len(table), r}, data: b},
	})
	if err != nil {
		return nil, err
	}
	config, err := json.MarshalIndent(map[string]any{
		"peft_type":               "LORA",
		"task_type":               nil,
		"base_model_name_or_path": baseModel,
		"r":                       r,
		"lora_alpha":              lora.Alpha,
		"lora_dropout":            0.0,
		"target_modules":          []string{"lm_head"},
		"bias":                    "none",
		"fan_in_fan_out":          false,
		"inference_mode":          true,
	}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("adapter config: %w", err)
	}

	var out bytes.Buffer
	// SkyRL packs with compresslevel=0: checkpoints do not compress well.
	gz, err := gzip.NewWriterLevel(&out, gzip.NoCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	now := time.Now()
	for _, f := range []struct {
		name string
		data []byte
	}{{"adapter_config.json", config}, {"adapter_model.safetensors", tensors}} {
		hdr := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

type tensor struct {
	name  string
	shape []int
	data  []float32
}

type tensorInfo struct {
	DType       string `json:"dtype"`
	Shape       []int  `json:"shape"`
	DataOffsets [2]int `json:"data_offsets"`
}

// safetensors encodes F32 tensors: an 8-byte little-endian header length,
// the JSON header (padded with spaces to 8 bytes), then the raw
// little-endian data in the header's order.
func safetensors(ts []tensor) ([]byte, error) {
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	offset := 0
	for _, t := range ts {
		size := 4 * len(t.data)
		header[t.name] = tensorInfo{DType: "F32", Shape: t.shape, DataOffsets: [2]int{offset, offset + size}}
		offset += size
	}
	h, err := json.Marshal(header)
	if err != nil {
		return nil, fmt.Errorf("safetensors header: %w", err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := make([]byte, 8, 8+len(h)+offset)
	binary.LittleEndian.PutUint64(out, uint64(len(h)))
	out = append(out, h...)
	for _, t := range ts {
		for _, v := range t.data {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		}
	}
	return out, nil
}
