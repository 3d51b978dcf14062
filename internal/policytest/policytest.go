// Package policytest serves the built-in policy to tests the way
// `flywheel up` serves it: its own model server (modelserver, in
// vLLM's dialect) on an HTTP listener, registered as the policy's upstream
// deployment with vLLM's runtime LoRA weight sync, and the serving
// version loaded into it by name. A test of the default policy through the
// gateway or the gates therefore tests the production path.
//
// It is test support only: nothing outside _test.go files imports it. It
// must not import activities or gateway, whose own tests use it.
package policytest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference/weightsync"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
)

// DB is what the deployment's registration needs: a pool.
type DB interface {
	store.Beginner
	store.DBTX
}

// Options configure Start.
type Options struct {
	// Name is the deployment and served model name. Default
	// "flywheel-policy" (config's default policy model).
	Name string
	// Base is the serving weights. Default: a seeded random model of
	// trainer's default shape (seed 7).
	Base *trainer.Model
	// Version is Base's version number. Default 1, or 0 with a Trainer:
	// a Tinker trainer starts from the deployment's base model only at
	// version 0, which `flywheel up` stores the base as.
	Version int64
	// Trainer is the deployment's trainer, as `flywheel up` names the
	// embedded one (nil: none named).
	Trainer *deployment.Trainer
	// Dir holds the checkpoints, under Dir/Name, as the data directory's
	// checkpoints do. Default: a temporary directory.
	Dir string
	// DefaultMaxTokens applies to a request with none. Default: the model
	// server's.
	DefaultMaxTokens int
}

// Policy is a running model server over the policy and its deployment.
type Policy struct {
	t    testing.TB
	db   DB
	sync weightsync.Engine
	// Name is the deployment (and base model) name.
	Name string
	// URL is the model server's base URL, /v1 included, as stored in the
	// deployment's config.
	URL string
	// Base is the serving weights at Start.
	Base *trainer.Model
	// Serving is the serving version's id at Start.
	Serving string
	// Checkpoints is where each version's checkpoint is saved.
	Checkpoints trainer.CheckpointDir
	// Server is the model server.
	Server *modelserver.Server
	// Completions counts the chat completions the server was asked for.
	Completions atomic.Int64
}

// Start saves o.Base as version o.Version, serves it from a model server,
// registers the deployment as `flywheel up` does (store.EnsurePolicyDeployment),
// and loads the serving version into the server through weight sync, as
// the model server's start does before any traffic reaches it.
func Start(t testing.TB, db DB, o Options) *Policy {
	t.Helper()
	if o.Name == "" {
		o.Name = "flywheel-policy"
	}
	if o.Version == 0 && o.Trainer == nil {
		o.Version = 1
	}
	if o.Base == nil {
		m, err := trainer.NewModel(trainer.ModelConfig{}, 7)
		require.NoError(t, err)
		o.Base = m
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	p := &Policy{t: t, db: db, Name: o.Name, Base: o.Base, Serving: store.VersionID(o.Name, o.Version),
		Checkpoints: trainer.CheckpointDir{Dir: filepath.Join(o.Dir, o.Name)}}
	path, err := p.Checkpoints.Save(o.Base, o.Version, map[string]string{"deployment": o.Name})
	require.NoError(t, err)
	p.Server, err = modelserver.New(o.Base, o.Version, modelserver.Config{Name: o.Name, BasePath: path,
		DefaultMaxTokens: o.DefaultMaxTokens, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			p.Completions.Add(1)
		}
		p.Server.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL + "/v1"
	settings := deployment.Settings{BaseURL: p.URL, Model: o.Name, WeightSync: &deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA},
		Trainer: o.Trainer}
	ctx := context.Background()
	serving, err := store.EnsurePolicyDeployment(ctx, db, o.Name, p.Serving, path, settings, true)
	require.NoError(t, err)
	require.Equal(t, p.Serving, serving, "a fresh deployment serves its base")
	p.sync, err = weightsync.New(*settings.WeightSync, settings.BaseURL, "", http.DefaultClient)
	require.NoError(t, err)
	p.Load(p.Serving)
	return p
}

// Candidate saves m as version (parent: the serving version at Start) and
// records it as a candidate with its checkpoint, as a trainer's
// RegisterCheckpoint does; a release's weight sync loads it from there. It
// returns the version's id.
func (p *Policy) Candidate(m *trainer.Model, version int64) string {
	p.t.Helper()
	path, err := p.Checkpoints.Save(m, version, map[string]string{"deployment": p.Name})
	require.NoError(p.t, err)
	id := store.VersionID(p.Name, version)
	_, err = p.db.Exec(context.Background(), `INSERT INTO model_versions (id, deployment, parent_version, status, checkpoint_path)
		VALUES ($1, $2, $3, 'candidate', $4)`, id, p.Name, p.Serving, path)
	require.NoError(p.t, err)
	return id
}

// Load loads a stored version's checkpoint into the model server under
// the version's name, through the weight sync a release uses.
func (p *Policy) Load(id string) {
	p.t.Helper()
	ctx := context.Background()
	paths, err := store.Checkpoints(ctx, p.db, p.Name, []string{id})
	require.NoError(p.t, err)
	require.NotEmpty(p.t, paths[id], "version %s has a checkpoint", id)
	require.NoError(p.t, p.sync.Load(ctx, id, paths[id]))
}
