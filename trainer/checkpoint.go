package trainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Checkpoint metadata keys (safetensors __metadata__).
const (
	MetaFormat  = "format"  // always CheckpointFormat
	MetaVersion = "version" // policy version, decimal
	MetaConfig  = "config"  // ModelConfig as JSON
	MetaCreated = "created" // RFC 3339
	// CheckpointFormat marks files this package wrote or can read: the tensor
	// names and shapes are the ones Model's layout lists.
	CheckpointFormat = "flywheel-policy-v1"
)

// SaveCheckpoint writes m as version to path. Versions are immutable: an
// existing file is never overwritten, and the file appears atomically
// (written aside, then renamed) so a reader never sees half a checkpoint.
// extra adds metadata (for example the lineage of trajectories).
func SaveCheckpoint(path string, m *Model, version int64, extra map[string]string) error {
	data, err := encodeCheckpoint(m, version, extra)
	if err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("save checkpoint: %s exists; versions are immutable", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ckpt-*")
	if err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("save checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	// Link fails if path appeared meanwhile, unlike rename.
	if err := os.Link(tmp.Name(), path); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// encodeCheckpoint is the safetensors file SaveCheckpoint writes.
func encodeCheckpoint(m *Model, version int64, extra map[string]string) ([]byte, error) {
	cfg, err := json.Marshal(m.Config)
	if err != nil {
		return nil, err
	}
	meta := map[string]string{}
	for k, v := range extra {
		meta[k] = v
	}
	meta[MetaFormat] = CheckpointFormat
	meta[MetaVersion] = strconv.FormatInt(version, 10)
	meta[MetaConfig] = string(cfg)
	meta[MetaCreated] = time.Now().UTC().Format(time.RFC3339)
	tensors := map[string]Tensor{}
	for _, s := range m.lay.Specs {
		tensors[s.Name] = F32Tensor(s.Shape, m.W[s.Offset:s.Offset+s.Size])
	}
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, tensors, meta); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// LoadCheckpoint reads a checkpoint written by SaveCheckpoint, or by an
// external trainer that follows the same names and shapes.
func LoadCheckpoint(path string) (*Model, int64, map[string]string, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("load checkpoint: %w", err)
	}
	m, v, meta, err := DecodeCheckpoint(buf)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("load checkpoint %s: %w", path, err)
	}
	return m, v, meta, nil
}

// DecodeCheckpoint parses checkpoint bytes.
func DecodeCheckpoint(buf []byte) (*Model, int64, map[string]string, error) {
	tensors, meta, err := ReadSafetensors(buf)
	if err != nil {
		return nil, 0, nil, err
	}
	if meta[MetaFormat] != CheckpointFormat {
		return nil, 0, nil, fmt.Errorf("metadata format %q, want %q", meta[MetaFormat], CheckpointFormat)
	}
	version, err := strconv.ParseInt(meta[MetaVersion], 10, 64)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("metadata version %q: %w", meta[MetaVersion], err)
	}
	var cfg ModelConfig
	if err := json.Unmarshal([]byte(meta[MetaConfig]), &cfg); err != nil {
		return nil, 0, nil, fmt.Errorf("metadata config: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return nil, 0, nil, fmt.Errorf("metadata config: %w", err)
	}
	m := &Model{Config: cfg, lay: newLayout(cfg)}
	if len(tensors) != len(m.lay.Specs) {
		return nil, 0, nil, fmt.Errorf("%d tensors, the config needs %d", len(tensors), len(m.lay.Specs))
	}
	// The file must hold exactly the weights the config implies; checked
	// before allocating, so a forged config cannot ask for gigabytes.
	var have int
	for _, t := range tensors {
		have += len(t.Data) / 4
	}
	if have != m.lay.Total {
		return nil, 0, nil, fmt.Errorf("the file holds %d weights, the config needs %d", have, m.lay.Total)
	}
	m.W = make([]float32, m.lay.Total)
	for _, s := range m.lay.Specs {
		t, ok := tensors[s.Name]
		if !ok {
			return nil, 0, nil, fmt.Errorf("tensor %s is missing", s.Name)
		}
		if fmt.Sprint(t.Shape) != fmt.Sprint(s.Shape) {
			return nil, 0, nil, fmt.Errorf("tensor %s has shape %v, want %v", s.Name, t.Shape, s.Shape)
		}
		v, err := t.Float32s()
		if err != nil {
			return nil, 0, nil, fmt.Errorf("tensor %s: %w", s.Name, err)
		}
		copy(m.W[s.Offset:], v)
	}
	return m, version, meta, nil
}
