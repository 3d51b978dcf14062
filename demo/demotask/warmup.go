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

// warmup is the base's supervised training, taken through the Tinker
// training API as every training of the policy is: an embedded trainer
// serves the seeded model on a loopback port for the build, and the same
// client that drives a remote service runs cross_entropy steps on full
// weights with the in-process trainer's AdamW (its defaults, the rate on
// a cosine over the steps), then fetches the sampler weights.
type warmup struct {
	init   *trainer.Model
	c      *tinker.Client
	model  string
	optim  trainer.OptimConfig
	seq    int64
	dir    string
	stop   func()
	closed bool
}

// startWarmup serves init behind the Tinker API and creates the model
// the steps train.
func startWarmup(ctx context.Context, init *trainer.Model, optim trainer.OptimConfig) (*warmup, error) {
	dir, err := os.MkdirTemp("", "flywheel-base-*")
	if err != nil {
		return nil, fmt.Errorf("base warm-up: %w", err)
	}
	const name = "demo-base-init"
	srv, err := tinkerserver.New(tinkerserver.Config{BaseModels: map[string]*trainer.Model{name: init}, Dir: filepath.Join(dir, "server"),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("base warm-up: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("base warm-up: %w", err)
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(ln) }()
	w := &warmup{init: init, c: tinker.New("http://"+ln.Addr().String(), ""), optim: optim, dir: dir,
		stop: func() { _ = hs.Close(); srv.Close(); os.RemoveAll(dir) }}
	session, err := w.c.CreateSession(ctx, []string{"demo-base"})
	if err == nil {
		w.model, err = w.c.CreateModel(ctx, session, name, tinker.LoraConfig{Rank: 0}) // full weights
	}
	if err != nil {
		w.close()
		return nil, fmt.Errorf("base warm-up: %w", err)
	}
	return w, nil
}

func (w *warmup) close() {
	if !w.closed {
		w.closed = true
		w.stop()
	}
}

// step trains one batch of (sequence, loss mask) samples: the token mean
// of −log π over the masked tokens, as the in-process trainer's SFT.
func (w *warmup) step(ctx context.Context, step int, samples []trainer.Sample) error {
	o := w.optim
	cfg := tinkerstep.Config{SFT: true, LR: o.LRAt(step), Trainer: deployment.Trainer{MiniBatches: 1,
		Adam: deployment.Adam{LR: o.LR, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, WeightDecay: o.WeightDecay, GradClipNorm: max(o.ClipNorm, 0)}}}
	_, err := tinkerstep.Train(ctx, w.c, w.model, samples, cfg, w.next)
	return err
}

func (w *warmup) next() int64 {
	w.seq++
	return w.seq
}

// finish fetches the trained weights as the sampler would load them.
func (w *warmup) finish(ctx context.Context) (*trainer.Model, error) {
	defer w.close()
	if _, err := w.c.SaveWeightsForSampler(ctx, w.model, "base", w.next()); err != nil {
		return nil, err
	}
	out := filepath.Join(w.dir, "base")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}
	if err := w.c.DownloadSampler(ctx, w.model, "base", out); err != nil {
		return nil, err
	}
	return trainer.ApplyPEFT(w.init, out)
}
