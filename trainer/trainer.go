package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// Trainer turns a batch into a new policy version. Local is the built-in
// implementation; an external (distributed) trainer takes steps through the
// trainer protocol (docs/trainer-protocol.md) instead.
type Trainer interface {
	TrainStep(ctx context.Context, b *Batch) (StepResult, error)
}

// Publisher receives every new version; Engine implements it.
type Publisher interface {
	Publish(m *Model, version int64) error
}

// StepResult summarises one optimizer step.
type StepResult struct {
	// Version is the policy version after the step, and Parent the one
	// whose weights the step started from (its lineage parent).
	Version  int64   `json:"version"`
	Parent   int64   `json:"parent"`
	Loss     float64 `json:"loss"`
	GradNorm float64 `json:"grad_norm"`
	LR       float64 `json:"lr"`
	// Samples trained and samples dropped for staleness (older than η).
	Samples      int `json:"samples"`
	DroppedStale int `json:"dropped_stale"`
	// TrainedTokens is the loss denominator; masked tokens are in it too.
	TrainedTokens int `json:"trained_tokens"`
	IcePopMasked  int `json:"icepop_masked"`
	KPopMasked    int `json:"kpop_masked"`
	Clipped       int `json:"clipped"`
	// MeanKL is the mean KL estimate to the reference (0 when off).
	MeanKL float64 `json:"mean_kl"`
	// MeanEntropy is the policy's mean entropy (nats) where it predicted a
	// trained token, before the update: a collapse to near 0 means it has
	// stopped exploring.
	MeanEntropy float64        `json:"mean_entropy"`
	MeanReward  float64        `json:"mean_reward"`
	Advantages  AdvantageStats `json:"advantages"`
	// TotalTokens over all samples and UniqueTokens actually computed after
	// prefix sharing.
	TotalTokens int `json:"total_tokens"`
	// FLOPs executed by the forward and backward passes (matrix products,
	// attention over the full per-tree square included).
	FLOPs        float64       `json:"flops"`
	UniqueTokens int           `json:"unique_tokens"`
	Duration     time.Duration `json:"duration"`
}

// Config configures Local.
type Config struct {
	Loss      LossConfig      `json:"loss"`
	Advantage AdvantageConfig `json:"advantage"`
	Optim     OptimConfig     `json:"optim"`
	// MaxStaleness is η: a sample whose oldest trained token came from a
	// version more than η behind the current one is dropped. Default 4;
	// negative means no bound.
	MaxStaleness int `json:"max_staleness"`
	// NoPacking turns prefix sharing off (for comparisons). Default false.
	NoPacking bool `json:"no_packing"`
	// MiniBatches splits a batch (whole groups at a time) into that many
	// optimizer updates. All of them measure the ratio against the proximal
	// policy, the weights the step started from, which is what makes the
	// PPO clip bite after the first update. Default 1.
	MiniBatches int `json:"mini_batches"`
	// NominalBatch is the batch size the learning rate is tuned for: a
	// step that trains fewer samples (a batch cut short by age or by stale
	// samples) scales its rate by samples/NominalBatch. Adam makes every
	// step about the same size, so without it a step on a sliver of a batch
	// moves the weights as far as a full one on far noisier evidence.
	// Default 0: no scaling. Both trainers apply it (LRScale).
	NominalBatch int `json:"nominal_batch"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `json:"-"`
}

func (c Config) withDefaults() Config {
	c.Loss = c.Loss.withDefaults()
	c.Advantage = c.Advantage.withDefaults()
	c.Optim = c.Optim.withDefaults()
	if c.MaxStaleness == 0 {
		c.MaxStaleness = 4
	}
	if c.MiniBatches == 0 {
		c.MiniBatches = 1
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// LRScale is the factor on a step's learning rate for a batch of n trained
// samples: n/NominalBatch when that is below 1, else 1.
func (c Config) LRScale(n int) float64 {
	if c.NominalBatch > 0 && n < c.NominalBatch {
		return float64(n) / float64(c.NominalBatch)
	}
	return 1
}

func (c Config) validate() error {
	var mb error
	if c.MiniBatches < 1 || c.MiniBatches > 1024 {
		mb = fmt.Errorf("mini_batches %d must be in [1, 1024]", c.MiniBatches)
	}
	if c.NominalBatch < 0 {
		mb = errors.Join(mb, fmt.Errorf("nominal_batch %d must be ≥ 0", c.NominalBatch))
	}
	return errors.Join(c.Loss.validate(), c.Advantage.validate(), c.Optim.validate(), mb)
}

// Local trains the in-process policy.
type Local struct {
	cfg   Config
	mu    sync.Mutex
	model *Model // training weights; never served directly
	ref   *Model // frozen reference for the KL term
	opt   *adamW
	base  *Baseline
	// version is the id of the current weights; lastID the highest id
	// handed out, so a step after Reset still gets a new one.
	version int64
	lastID  int64
	// depth is the lineage depth (optimizer steps from the base) of the
	// versions this trainer has held; a version not in it is assumed to
	// sit on a straight line from the base (depth = id). Staleness is the
	// depth between the behaviour version and the current weights, which
	// after a Reset is not the difference of the ids.
	depth map[int64]int64
	pub   Publisher
}

// NewLocal trains a copy of m, starting at version; pub (may be nil) gets
// every new version.
func NewLocal(m *Model, version int64, cfg Config, pub Publisher) (*Local, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("trainer config: %w", err)
	}
	l := &Local{cfg: cfg, model: m.Clone(), opt: newAdamW(cfg.Optim, m.lay), base: NewBaseline(cfg.Advantage.BaselineRate),
		version: version, lastID: version, depth: map[int64]int64{}, pub: pub}
	if cfg.Loss.KLCoef > 0 {
		l.ref = m.Clone()
	}
	return l, nil
}

// Version is the current policy version.
func (l *Local) Version() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version
}

// ReserveIDs makes every later version id higher than id (versions up to
// id exist elsewhere, e.g. checkpoints of an earlier process).
func (l *Local) ReserveIDs(id int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastID = max(l.lastID, id)
}

// Reset makes m, the weights of an existing version, the trainer's current
// weights: training goes on from there (after a rollback, from the serving
// version), with fresh optimizer moments. The next step still gets a new
// id, and staleness is measured along the new lineage.
func (l *Local) Reset(m *Model, version int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m.Config != l.model.Config {
		return fmt.Errorf("trainer reset: version %d has another model config", version)
	}
	l.model = m.Clone()
	l.opt = newAdamW(l.cfg.Optim, m.lay)
	l.depth[version] = l.depthOf(version)
	l.version = version
	l.lastID = max(l.lastID, version)
	return nil
}

func (l *Local) depthOf(v int64) int64 {
	if d, ok := l.depth[v]; ok {
		return d
	}
	return v
}

// Snapshot returns a copy of the current weights.
func (l *Local) Snapshot() *Model {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.model.Clone()
}

// TrainStep runs one optimizer step on b and publishes the new version.
func (l *Local) TrainStep(ctx context.Context, b *Batch) (StepResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	start := time.Now()
	c := l.model.Config
	cur := l.depthOf(l.version)
	cfg := l.cfg
	if b != nil && b.MaxStaleness != nil {
		cfg.MaxStaleness = *b.MaxStaleness
	}
	samples, res, err := PrepareStep(b, c, func(v int64) int64 { return cur - l.depthOf(v) }, cfg, l.base)
	if err != nil {
		return res, err
	}
	if b.Version != 0 && (b.Version < 0 || b.Version == l.version) {
		return res, fmt.Errorf("train step: version %d cannot be the new weights' id (training starts from %d)", b.Version, l.version)
	}
	set, err := l.stepSettings(b)
	if err != nil {
		return res, err
	}
	// One optimizer update per part; a part keeps each group whole. The
	// parts and their proximal log-probs are locals of this frame, not a
	// struct a helper returns, so the compiler can keep them off the heap.
	var parts [][]Sample
	var packs []*packedBatch
	for _, p := range SplitGroups(samples, l.cfg.MiniBatches) {
		pb, err := l.packBatch(p)
		if err != nil {
			return res, err
		}
		if pb.trained > 0 { // a part of prompt-only samples has nothing to learn
			parts, packs = append(parts, p), append(packs, pb)
		}
	}
	if len(parts) == 0 {
		return res, errors.New("train step: no token has loss_mask 1")
	}
	prox := make([][]float32, len(parts))
	if err := l.proximal(ctx, packs, set, prox); err != nil {
		return res, err
	}
	if err := l.update(ctx, parts, packs, prox, set, l.cfg.LRScale(len(samples)), &res); err != nil {
		return res, err
	}
	if err := l.advance(b, cur, &res); err != nil {
		return res, err
	}
	res.Duration = time.Since(start)
	l.cfg.Logger.Debug("train step done", "version", res.Version, "loss", res.Loss, "grad_norm", res.GradNorm,
		"samples", res.Samples, "unique_tokens", res.UniqueTokens, "duration", res.Duration)
	return res, nil
}

// stepSettings is what a batch sets for its step's loss.
type stepSettings struct {
	loss LossConfig // the trainer's, with the batch's masks applied
	temp float32    // log π is taken at this temperature
	sft  bool
}

func (l *Local) stepSettings(b *Batch) (stepSettings, error) {
	set := stepSettings{loss: l.cfg.Loss, temp: float32(b.Temperature), sft: b.Objective == ObjectiveSFT}
	if b.Masks != nil {
		var err error
		if set.loss, err = b.Masks.Apply(set.loss); err != nil {
			return set, fmt.Errorf("train step: masks: %w", err)
		}
	}
	if set.temp == 0 {
		set.temp = 1 // greedy samples report log-probs at T = 1
	}
	return set, nil
}

// proximal sets prox[i] to the proximal log-probs of packs[i] for every
// minibatch after the first, taken before any update; the first one's
// (left nil) are its own forward pass. SFT needs none.
func (l *Local) proximal(ctx context.Context, packs []*packedBatch, set stepSettings, prox [][]float32) error {
	if set.sft {
		return nil
	}
	for i := 1; i < len(packs); i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		prox[i] = l.model.forward(packs[i].pk, packs[i].targets, set.temp).TargetLogp
	}
	return nil
}

// update runs one optimizer update per part, in order, at scale times the
// scheduled rate, and adds their counts and token-weighted means to res.
func (l *Local) update(ctx context.Context, parts [][]Sample, packs []*packedBatch, prox [][]float32, set stepSettings, scale float64, res *StepResult) error {
	// A failure after the first update must not leave half-trained weights
	// behind an unchanged version.
	var saved []float32
	if len(parts) > 1 {
		saved = append([]float32(nil), l.model.W...)
	}
	restore := func() {
		if saved != nil {
			copy(l.model.W, saved)
		}
	}
	var loss, kl, gradNorm, entropy float64
	for i, p := range parts {
		part := StepResult{}
		grad, err := l.lossAndGrad(ctx, set.loss, p, packs[i], prox[i], set.temp, set.sft, &part)
		if err != nil {
			restore()
			return err
		}
		norm := clipGrad(grad, l.cfg.Optim.ClipNorm)
		if math.IsNaN(norm) || math.IsInf(norm, 0) {
			restore()
			return fmt.Errorf("train step: gradient norm is %v; update %d of %d skipped", norm, i+1, len(parts))
		}
		res.LR = l.opt.update(l.model.W, grad, scale)
		n := float64(part.TrainedTokens)
		loss += part.Loss * n
		kl += part.MeanKL * n
		gradNorm += norm / float64(len(parts))
		res.TrainedTokens += part.TrainedTokens
		res.TotalTokens += part.TotalTokens
		res.UniqueTokens += part.UniqueTokens
		res.IcePopMasked += part.IcePopMasked
		res.KPopMasked += part.KPopMasked
		res.Clipped += part.Clipped
		res.FLOPs += part.FLOPs
		entropy += part.MeanEntropy * n
	}
	res.Loss = loss / float64(res.TrainedTokens)
	res.MeanKL = kl / float64(res.TrainedTokens)
	res.MeanEntropy = entropy / float64(res.TrainedTokens)
	res.GradNorm = gradNorm
	return nil
}

// advance makes the updated weights the current version: b.Version, or
// the next free id, one deeper than cur in the lineage; then publishes it.
func (l *Local) advance(b *Batch, cur int64, res *StepResult) error {
	next := l.lastID + 1
	if b.Version != 0 {
		next = b.Version
	}
	l.lastID = max(l.lastID, next)
	l.depth[next] = cur + 1
	res.Parent = l.version
	l.version = next
	res.Version = l.version
	if l.pub != nil {
		if err := l.pub.Publish(l.model.Clone(), l.version); err != nil {
			return fmt.Errorf("publish version %d: %w", l.version, err)
		}
	}
	return nil
}

// packedBatch is a minibatch laid out as a prefix tree, with the nodes
// whose log-probs the loss needs.
type packedBatch struct {
	pk       *Pack
	targets  []int // node ids, each once
	targetOf []int // node → index in targets, -1 if none
	trained  int   // trained tokens over all samples (a shared node counts per sample)
}

func (l *Local) packBatch(samples []Sample) (*packedBatch, error) {
	seqs := make([][]int, len(samples))
	for i, s := range samples {
		seqs[i] = s.TokenIDs
	}
	pk, err := BuildPack(seqs, !l.cfg.NoPacking)
	if err != nil {
		return nil, fmt.Errorf("train step: %w", err)
	}
	pb := &packedBatch{pk: pk, targetOf: make([]int, pk.NumNodes())}
	for i := range pb.targetOf {
		pb.targetOf[i] = -1
	}
	for s, smp := range samples {
		for t, mk := range smp.LossMask {
			if mk == 0 {
				continue
			}
			pb.trained++
			if n := pk.SampleNodes[s][t]; pb.targetOf[n] < 0 {
				pb.targetOf[n] = len(pb.targets)
				pb.targets = append(pb.targets, n)
			}
		}
	}
	return pb, nil
}

// SplitGroups cuts samples into at most k parts without splitting a group.
func SplitGroups(samples []Sample, k int) [][]Sample {
	if k <= 1 {
		return [][]Sample{samples}
	}
	var order []string
	byGroup := map[string][]Sample{}
	for i, s := range samples {
		key := s.GroupID
		if key == "" {
			key = fmt.Sprintf("\x00%d", i)
		}
		if _, ok := byGroup[key]; !ok {
			order = append(order, key)
		}
		byGroup[key] = append(byGroup[key], s)
	}
	k = min(k, len(order))
	parts := make([][]Sample, k)
	for i, g := range order {
		parts[i*k/len(order)] = append(parts[i*k/len(order)], byGroup[g]...)
	}
	return parts
}

// lossAndGrad computes the loss of one minibatch on the current weights and
// returns its gradient. Every token's loss depends on the network only
// through log π of that token, so the pass reduces the loss to
// d loss / d log π per node; a node shared by several samples sums their
// terms. prox holds the proximal log-probs per target; nil means the
// current weights are the proximal policy.
func (l *Local) lossAndGrad(ctx context.Context, loss LossConfig, samples []Sample, pb *packedBatch, prox []float32, temp float32, sft bool, res *StepResult) ([]float32, error) {
	pk, targets, targetOf := pb.pk, pb.targets, pb.targetOf
	res.TotalTokens, res.UniqueTokens, res.TrainedTokens = pk.NumSampleTokens(), pk.NumNodes(), pb.trained
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sc := &scratch{}
	defer sc.release()
	st := l.model.forwardIn(sc, pk, targets, temp)
	var refLogp []float32
	if l.ref != nil && !sft {
		refLogp = l.ref.forwardIn(sc, pk, targets, temp).TargetLogp
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dLogp := make([]float32, len(targets))
	inv := 1 / float64(res.TrainedTokens)
	var klSum float64
	for s, smp := range samples {
		for t, mk := range smp.LossMask {
			if mk == 0 {
				continue
			}
			ti := targetOf[pk.SampleNodes[s][t]]
			logp := float64(st.TargetLogp[ti])
			if sft {
				res.Loss -= logp * inv
				dLogp[ti] -= float32(inv)
				continue
			}
			in := tokenIn{Logp: logp, LogpProx: logp, LogpBehav: float64(smp.Logprobs[t]), Adv: *smp.Advantage}
			if prox != nil {
				in.LogpProx = float64(prox[ti])
			}
			if refLogp != nil {
				in.LogpRef = float64(refLogp[ti])
			}
			out := ppoToken(loss, in)
			res.Loss += out.Loss * inv
			dLogp[ti] += float32(out.DLogp * inv)
			klSum += out.KL
			if out.IcePopMasked {
				res.IcePopMasked++
			}
			if out.KPopMasked {
				res.KPopMasked++
			}
			if out.Clipped {
				res.Clipped++
			}
		}
	}
	res.MeanKL = klSum * inv
	for s, smp := range samples {
		for t, mk := range smp.LossMask {
			if mk == 1 {
				res.MeanEntropy += st.rowEntropy(pk.Parent[pk.SampleNodes[s][t]]) * inv
			}
		}
	}
	grad := make([]float32, len(l.model.W))
	st.backward(dLogp, grad)
	res.FLOPs = 3 * st.forwardFLOPs()
	return grad, nil
}

// PrepareStep is the part of a train step every training path shares: it
// validates b against the model config c, drops samples staler than η
// (never for SFT), averages the reward and, for GRPO, computes the
// advantages in place. res carries the counts for the step's result.
func PrepareStep(b *Batch, c ModelConfig, staleness func(behaviour int64) int64, cfg Config, base *Baseline) (samples []Sample, res StepResult, err error) {
	if b == nil {
		return nil, StepResult{}, errors.New("train step: nil batch")
	}
	if err := b.validate(c.Vocab, c.Context); err != nil {
		return nil, StepResult{}, fmt.Errorf("train step: %w", err)
	}
	res = StepResult{}
	sft := b.Objective == ObjectiveSFT
	samples = make([]Sample, 0, len(b.Samples))
	for _, s := range b.Samples {
		if !sft && cfg.MaxStaleness >= 0 {
			if v, ok := s.oldestVersion(); ok && staleness(v) > int64(cfg.MaxStaleness) {
				res.DroppedStale++
				continue
			}
		}
		res.MeanReward += s.Reward
		samples = append(samples, s)
	}
	if len(samples) == 0 {
		return nil, res, fmt.Errorf("train step: all %d samples are staler than η=%d", len(b.Samples), cfg.MaxStaleness)
	}
	res.MeanReward /= float64(len(samples))
	res.Samples = len(samples)
	if !sft {
		st, err := ComputeAdvantages(samples, cfg.Advantage, base)
		if err != nil {
			return nil, res, fmt.Errorf("train step: %w", err)
		}
		res.Advantages = st
	}
	return samples, res, nil
}
