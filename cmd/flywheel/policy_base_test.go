package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/trainer"
)

// TestPolicyBaseMismatch checks a deployment whose v0 came from another
// base is refused before anything is served or trained on top of it.
func TestPolicyBaseMismatch(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	m, err := trainer.NewModel(trainer.ModelConfig{}, 1)
	require.NoError(t, err)
	dir := trainer.CheckpointDir{Dir: filepath.Join(cfg.DataDir, "checkpoints", cfg.Gateway.PolicyModel)}
	_, err = dir.Save(m, 0, map[string]string{originKey: "seeded base"})
	require.NoError(t, err)

	pb := &policyBase{origin: "demo base abc", load: func(context.Context) (*trainer.Model, map[string]string, error) {
		t.Fatal("an existing v0 must not be rebuilt")
		return nil, nil, nil
	}}
	_, err = newPolicy(context.Background(), cfg, nil, pb, policyURLs{model: "http://127.0.0.1:8000/v1", trainer: "http://127.0.0.1:8091"}, true, nil)
	require.ErrorContains(t, err, `v0 of flywheel-policy is "seeded base", not "demo base abc"`)
}
