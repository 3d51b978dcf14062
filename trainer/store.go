package trainer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CheckpointDir keeps one immutable checkpoint per version in a directory
// (vNNNNNNNNNNNN.safetensors), so a restarted process serves the version it
// had and a rollback can load any kept one.
type CheckpointDir struct {
	Dir string
}

// ErrNoCheckpoint means the directory holds no checkpoint yet.
var ErrNoCheckpoint = errors.New("no checkpoint")

// Path is where version is (or would be) stored.
func (d CheckpointDir) Path(version int64) string {
	return filepath.Join(d.Dir, fmt.Sprintf("v%012d.safetensors", version))
}

// Save writes m as version; an existing version is never overwritten.
func (d CheckpointDir) Save(m *Model, version int64, meta map[string]string) (string, error) {
	if version < 0 {
		return "", fmt.Errorf("checkpoint version %d is negative", version)
	}
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return "", fmt.Errorf("checkpoint dir: %w", err)
	}
	p := d.Path(version)
	return p, SaveCheckpoint(p, m, version, meta)
}

// Versions lists the stored versions, oldest first.
func (d CheckpointDir) Versions() ([]int64, error) {
	ents, err := os.ReadDir(d.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint dir: %w", err)
	}
	var vs []int64
	for _, e := range ents { // ReadDir sorts by name; names are zero-padded
		name, ok := strings.CutSuffix(e.Name(), ".safetensors")
		if !ok || !strings.HasPrefix(name, "v") {
			continue
		}
		if v, err := strconv.ParseInt(name[1:], 10, 64); err == nil {
			vs = append(vs, v)
		}
	}
	return vs, nil
}

// Load reads one version and checks that the file says the same version.
func (d CheckpointDir) Load(version int64) (*Model, map[string]string, error) {
	m, v, meta, err := LoadCheckpoint(d.Path(version))
	if err != nil {
		return nil, nil, err
	}
	if v != version {
		return nil, nil, fmt.Errorf("checkpoint %s holds version %d", d.Path(version), v)
	}
	return m, meta, nil
}

// Latest loads the newest version, or ErrNoCheckpoint.
func (d CheckpointDir) Latest() (*Model, int64, map[string]string, error) {
	vs, err := d.Versions()
	if err != nil {
		return nil, 0, nil, err
	}
	if len(vs) == 0 {
		return nil, 0, nil, fmt.Errorf("%s: %w", d.Dir, ErrNoCheckpoint)
	}
	v := vs[len(vs)-1]
	m, meta, err := d.Load(v)
	return m, v, meta, err
}
