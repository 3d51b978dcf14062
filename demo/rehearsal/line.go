package rehearsal

import (
	"context"
	"fmt"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/tinkerstep"
	"github.com/flywheel-ai/flywheel/trainer"
)

// line is the trainer's line of versions. It trains through the Tinker
// API as every deployment does (demotask.LoopbackTrainer: the embedded
// trainer on a loopback port), one long-lived model whose weights reach
// sampling the way serving gets them; the control plane's part of a step,
// advantages and staleness, is trainer.PrepareStep's, as the in-process
// trainer's was. Versions are numbered, and staleness counted, as the
// in-process trainer does it: in optimizer steps along the line, which
// after a reset is not the difference of the ids.
type line struct {
	tr       *demotask.LoopbackTrainer
	cfg      trainer.Config // defaults applied
	model    trainer.ModelConfig
	step     tinkerstep.Config
	baseline *trainer.Baseline
	pub      trainer.Publisher

	// version is the id of the current weights, lastID the highest id
	// handed out, depth each held version's steps from the base (an id
	// not in it is its own depth).
	version, lastID int64
	depth           map[int64]int64
	// updates counts the optimizer updates since the moments were last
	// fresh: the learning-rate schedule's step.
	updates int
}

// newLine serves base on a loopback trainer with cfg's settings (and LoRA
// of loraRank on attention, MLP and the unembedding; 0: full weights);
// pub receives every new version.
func newLine(ctx context.Context, base *trainer.Model, cfg trainer.Config, loraRank int, seed uint64, pub trainer.Publisher) (*line, error) {
	cfg, err := cfg.Resolve()
	if err != nil {
		return nil, fmt.Errorf("rehearsal trainer: %w", err)
	}
	dt := deploymentTrainer(cfg, loraRank, seed)
	l := &line{cfg: cfg, model: base.Config, baseline: trainer.NewBaseline(cfg.Advantage.BaselineRate), pub: pub,
		depth: map[int64]int64{}, step: tinkerstep.Config{Trainer: dt}}
	if lc := cfg.Loss; lc.IcePop || lc.KPop {
		l.step.Masks = &deployment.TokenMasks{IcePop: lc.IcePop, IcePopLow: lc.IcePopLow, IcePopHigh: lc.IcePopHigh, KPop: lc.KPop, KPopPhi: lc.KPopPhi}
	}
	if l.tr, err = demotask.StartLoopback(ctx, base, dt.LoRA); err != nil {
		return nil, fmt.Errorf("rehearsal trainer: %w", err)
	}
	if dt.KLCoef > 0 {
		if l.step.Reference, l.step.ReferenceSeq, err = l.tr.Reference(ctx); err != nil {
			l.tr.Close()
			return nil, fmt.Errorf("rehearsal trainer: %w", err)
		}
	}
	return l, nil
}

// deploymentTrainer is the in-process trainer's configuration as a
// deployment's Tinker trainer: decoupled PPO with its clip range and cap,
// its minibatches and nominal batch, its AdamW, its KL penalty.
func deploymentTrainer(cfg trainer.Config, loraRank int, seed uint64) deployment.Trainer {
	lora := deployment.LoRA{FullWeights: true}
	if loraRank > 0 {
		// Attention and MLP alone barely move this small model's logits.
		on := true
		lora = deployment.LoRA{Rank: loraRank, Attn: &on, MLP: &on, Unembed: &on, Seed: int64(seed)}
	}
	return deployment.Trainer{Loss: deployment.LossPPO, ClipLow: cfg.Loss.ClipLow, ClipHigh: cfg.Loss.ClipHigh,
		BehaviourWeightCap: cfg.Loss.BehaviourWeightCap, KLCoef: cfg.Loss.KLCoef, MiniBatches: cfg.MiniBatches, NominalBatch: cfg.NominalBatch,
		LoRA: lora, Adam: demotask.AdamFrom(cfg.Optim)}
}

func (l *line) close() { l.tr.Close() }

func (l *line) depthOf(v int64) int64 {
	if d, ok := l.depth[v]; ok {
		return d
	}
	return v
}

// trainStep trains b and publishes the new weights as the next version.
func (l *line) trainStep(ctx context.Context, b *trainer.Batch) error {
	cur := l.depthOf(l.version)
	samples, _, err := trainer.PrepareStep(b, l.model, func(v int64) int64 { return cur - l.depthOf(v) }, l.cfg, l.baseline)
	if err != nil {
		return err
	}
	step := l.step
	step.LR = l.cfg.Optim.LRAt(l.updates)
	st, err := l.tr.Step(ctx, samples, step)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	l.updates += st.Updates
	m, err := l.tr.Weights(ctx)
	if err != nil {
		return err
	}
	next := l.lastID + 1
	l.lastID, l.depth[next], l.version = next, cur+1, next
	if err := l.pub.Publish(m, next); err != nil {
		return fmt.Errorf("publish version %d: %w", next, err)
	}
	return nil
}

// save keeps the current training state, for a later restart from it.
func (l *line) save(ctx context.Context) (string, error) { return l.tr.SaveState(ctx) }

// restart goes on from a saved state of version from, with fresh
// optimizer moments, as the version id: as deep as from, so samples of
// from are fresh (a new trainer started there, as after a rollback, also
// forgets the reward baseline).
func (l *line) restart(ctx context.Context, state string, id, from int64, fresh bool) error {
	if err := l.tr.Restore(ctx, state); err != nil {
		return err
	}
	if fresh {
		l.baseline = trainer.NewBaseline(l.cfg.Advantage.BaselineRate)
	}
	l.depth[id] = l.depthOf(from)
	l.version, l.lastID, l.updates = id, max(l.lastID, id), 0
	return nil
}
