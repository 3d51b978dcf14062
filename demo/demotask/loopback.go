package demotask

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/tinkerserver"
	"github.com/flywheel-ai/flywheel/tinkerstep"
	"github.com/flywheel-ai/flywheel/trainer"
)

// loopbackBase is the name the loopback server serves its base model as.
const loopbackBase = "demo-base"

// LoopbackTrainer trains a model the way every policy is trained: an
// embedded trainer serves the base behind the Tinker training API on a
// loopback port, and the client that drives a remote service runs the
// steps (tinkerstep) and fetches the weights as serving loads them. The
// base's warm-up and the rehearsal train through it, so the demo has no
// training path of its own.
//
// Every Weights call leaves a sampler archive on the server; they live in
// a temporary directory that Close removes.
type LoopbackTrainer struct {
	base    *trainer.Model
	lora    tinker.LoraConfig
	c       *tinker.Client
	session string
	model   string
	seq     int64
	// ref is the reference model (the base, never trained) once
	// Reference made it, refSeq its last seq_id.
	ref    string
	refSeq int64
	saved  int // names the checkpoints
	dir    string
	stop   func()
	closed bool
}

// StartLoopback serves base behind the Tinker API and creates the model
// the steps train, with lora's adapter (FullWeights: every weight).
func StartLoopback(ctx context.Context, base *trainer.Model, lora deployment.LoRA) (*LoopbackTrainer, error) {
	dir, err := os.MkdirTemp("", "flywheel-loopback-*")
	if err != nil {
		return nil, fmt.Errorf("loopback trainer: %w", err)
	}
	srv, err := tinkerserver.New(tinkerserver.Config{BaseModels: map[string]*trainer.Model{loopbackBase: base},
		Dir: filepath.Join(dir, "server"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("loopback trainer: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("loopback trainer: %w", err)
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(ln) }()
	t := &LoopbackTrainer{base: base, lora: loraConfig(lora), c: tinker.New("http://"+ln.Addr().String(), ""), dir: dir,
		stop: func() { _ = hs.Close(); srv.Close(); _ = os.RemoveAll(dir) }}
	t.session, err = t.c.CreateSession(ctx, []string{"demo"})
	if err == nil {
		t.model, err = t.c.CreateModel(ctx, t.session, loopbackBase, t.lora)
	}
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("loopback trainer: %w", err)
	}
	return t, nil
}

// loraConfig is lora on the wire: rank 0 for full weights.
func loraConfig(l deployment.LoRA) tinker.LoraConfig {
	if l.FullWeights {
		return tinker.LoraConfig{Rank: 0}
	}
	c := tinker.LoraConfig{Rank: l.Rank, TrainAttn: l.Attn, TrainMLP: l.MLP, TrainUnembed: l.Unembed}
	if l.Seed != 0 {
		c.Seed = &l.Seed
	}
	return c
}

// AdamFrom is the in-process trainer's optimizer settings as a Tinker
// trainer's (o after WithDefaults; a negative ClipNorm is no clipping).
func AdamFrom(o trainer.OptimConfig) deployment.Adam {
	return deployment.Adam{LR: o.LR, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, WeightDecay: o.WeightDecay, GradClipNorm: max(o.ClipNorm, 0)}
}

// Step trains one batch (advantages set, except for SFT).
func (t *LoopbackTrainer) Step(ctx context.Context, samples []trainer.Sample, cfg tinkerstep.Config) (tinkerstep.Stats, error) {
	return tinkerstep.Train(ctx, t.c, t.model, samples, cfg, t.next)
}

func (t *LoopbackTrainer) next() int64 {
	t.seq++
	return t.seq
}

func (t *LoopbackTrainer) name() string {
	t.saved++
	return fmt.Sprintf("c%d", t.saved)
}

// Weights fetches the current weights as a sampler loads them: saved for
// the sampler, downloaded, and applied to the base (an adapter merged).
func (t *LoopbackTrainer) Weights(ctx context.Context) (*trainer.Model, error) {
	name := t.name()
	if _, err := t.c.SaveWeightsForSampler(ctx, t.model, name, t.next()); err != nil {
		return nil, fmt.Errorf("save sampler weights: %w", err)
	}
	out, err := os.MkdirTemp(t.dir, "sampler-*")
	if err != nil {
		return nil, fmt.Errorf("sampler weights: %w", err)
	}
	defer func() { _ = os.RemoveAll(out) }()
	if err := t.c.DownloadSampler(ctx, t.model, name, out); err != nil {
		return nil, fmt.Errorf("download sampler weights: %w", err)
	}
	m, err := trainer.ApplyPEFT(t.base, out)
	if err != nil {
		return nil, fmt.Errorf("apply sampler weights: %w", err)
	}
	return m, nil
}

// SaveState saves the training state (weights and optimizer) and returns
// its path for Restore.
func (t *LoopbackTrainer) SaveState(ctx context.Context) (string, error) {
	path, err := t.c.SaveWeights(ctx, t.model, t.name(), t.next())
	if err != nil {
		return "", fmt.Errorf("save training state: %w", err)
	}
	return path, nil
}

// Restore goes back to the weights of a saved state, with fresh optimizer
// moments: a state loads only into a new model, so the steps go on on a
// new one and the old one is unloaded.
func (t *LoopbackTrainer) Restore(ctx context.Context, path string) error {
	model, err := t.c.CreateModel(ctx, t.session, loopbackBase, t.lora)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := t.c.LoadWeights(ctx, model, path, false, 1); err != nil {
		return fmt.Errorf("restore %s: %w", path, err)
	}
	old := t.model
	t.model, t.seq = model, 1
	if err := t.c.UnloadModel(ctx, old); err != nil {
		return fmt.Errorf("restore: unload %s: %w", old, err)
	}
	return nil
}

// Reference is a model of the base that no step trains, for a KL
// penalty (tinkerstep.Config's Reference and ReferenceSeq): created on
// the first call, the same model after.
func (t *LoopbackTrainer) Reference(ctx context.Context) (string, func() int64, error) {
	if t.ref == "" {
		ref, err := t.c.CreateModel(ctx, t.session, loopbackBase, t.lora)
		if err != nil {
			return "", nil, fmt.Errorf("reference model: %w", err)
		}
		t.ref = ref
	}
	return t.ref, func() int64 { t.refSeq++; return t.refSeq }, nil
}

// Close stops the server and removes its files; it may be called again.
func (t *LoopbackTrainer) Close() {
	if !t.closed {
		t.closed = true
		t.stop()
	}
}
