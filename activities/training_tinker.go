package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

// TinkerTraining drives Tinker trainers: its TrainBatch is the trainer
// protocol's train step of a deployment whose trainer is kind tinker,
// taken by calling the service's training API. Any Flywheel worker can
// take it (task queue deployment.TinkerQueue); it needs the batch file
// and the checkpoint directory, no database.
type TinkerTraining struct {
	// HTTP is the client of the services (nil: http.DefaultClient).
	HTTP *http.Client
	// Getenv reads the services' API keys (nil: os.Getenv).
	Getenv func(string) string
	// Retry bounds each call's retries (zero: the client's defaults).
	Retry tinker.RetryPolicy
	// HeartbeatEvery throttles the heartbeats sent while the service
	// works (default 5 s).
	HeartbeatEvery time.Duration
	Logger         *slog.Logger
}

// tinkerMeta is tinker.json, written beside a version's sampler weights:
// where its training state lives, so the next step can load it.
type tinkerMeta struct {
	Service    string             `json:"service"`
	Model      string             `json:"model_id"`
	State      string             `json:"state"`   // tinker://<model>/weights/<version>
	Sampler    string             `json:"sampler"` // tinker://<model>/<version>
	Format     string             `json:"format"`
	Deployment string             `json:"deployment"`
	RunID      int64              `json:"training_run"`
	Parent     string             `json:"parent_version"`
	Loss       float64            `json:"loss"`
	Samples    int                `json:"samples"`
	Tokens     int                `json:"trained_tokens"`
	Metrics    map[string]float64 `json:"metrics,omitempty"`
}

// tinkerMetaFile is the name of tinkerMeta in a version's directory.
const tinkerMetaFile = "tinker.json"

// stepRecord is written before a step trains, so a retry after the worker
// died can find the model the first attempt used.
type stepRecord struct {
	RunID   int64  `json:"training_run"`
	Service string `json:"service"`
	Model   string `json:"model_id"`
}

// TrainBatch trains the batch on the deployment's Tinker service, from
// the base version's saved training state, into the output version: its
// training state (for the next step) and its sampler weights, unpacked
// under Output.Dir/<version>. A step is a function of the base state and
// the batch: a retry never applies an optimizer step to a version twice,
// and no version is made twice (a retry after the weights were saved
// fetches them instead of training again).
func (t *TinkerTraining) TrainBatch(ctx context.Context, in flow.TrainBatchInput) (flow.TrainBatchOutput, error) {
	s, err := t.newStep(ctx, in)
	if err != nil {
		return flow.TrainBatchOutput{}, err
	}
	if meta, ok := readTinkerMeta(s.outDir); ok && meta.RunID == in.RunID {
		return s.answer(meta, true), nil
	}
	if rec, ok := s.readRecord(); ok && rec.RunID == in.RunID && rec.Service == s.cfg.URL {
		// An earlier attempt died: if it saved the version, fetch it.
		if meta, err := s.fetchSaved(ctx, rec.Model); err == nil {
			return s.answer(meta, true), nil
		} else if ctx.Err() != nil {
			return flow.TrainBatchOutput{}, ctx.Err()
		}
		// Not saved: its model is abandoned; this attempt starts over
		// from the base state.
	}
	meta, err := s.run(ctx)
	if err != nil {
		return flow.TrainBatchOutput{}, s.activityError(err)
	}
	return s.answer(meta, false), nil
}

// tinkerStep is one TrainBatch in progress.
type tinkerStep struct {
	in      flow.TrainBatchInput
	cfg     deployment.Trainer
	c       *tinker.Client
	loss    trainer.LossConfig
	samples []trainer.Sample
	// name is the version's checkpoint name, outDir its directory.
	name   string
	outDir string
	log    *slog.Logger
	seq    int64
}

func (t *TinkerTraining) newStep(ctx context.Context, in flow.TrainBatchInput) (*tinkerStep, error) {
	bad := func(format string, args ...any) error {
		return temporal.NewNonRetryableApplicationError("tinker train batch: "+fmt.Sprintf(format, args...), "BadInput", nil)
	}
	if in.Protocol != flow.TrainerProtocol {
		return nil, bad("protocol %q, this worker speaks %q", in.Protocol, flow.TrainerProtocol)
	}
	if in.Trainer == nil || in.Trainer.Kind != deployment.TrainerTinker {
		return nil, bad("deployment %s names no tinker trainer", in.Deployment)
	}
	cfg := in.Trainer.WithDefaults(in.Base.Model)
	if err := cfg.Validate(); err != nil {
		return nil, bad("%v", err)
	}
	n, ok := store.VersionNumber(in.Output.Version)
	if !ok || in.Output.Dir == "" {
		return nil, bad("output %q in %q is not a version and a directory", in.Output.Version, in.Output.Dir)
	}
	if in.Algo.Objective != "" && in.Algo.Objective != trainer.ObjectiveGRPO && in.Algo.Objective != trainer.ObjectiveSFT {
		return nil, bad("objective %q: want %q or %q", in.Algo.Objective, trainer.ObjectiveGRPO, trainer.ObjectiveSFT)
	}
	if in.Algo.KLCoef != 0 {
		return nil, bad("a KL penalty needs a reference model, which the Tinker API does not hold; kl_coef must be 0")
	}
	masks := trainer.Masks{}
	m := in.Algo.Masks
	if m == nil {
		m = cfg.Masks // the loop names none: the deployment's trainer's
	}
	if m != nil {
		masks = trainer.Masks{IcePop: m.IcePop, IcePopLow: m.IcePopLow, IcePopHigh: m.IcePopHigh, KPop: m.KPop, KPopPhi: m.KPopPhi}
	}
	loss, err := masks.Apply(trainer.LossConfig{BehaviourWeightCap: cfg.BehaviourWeightCap})
	if err != nil {
		return nil, bad("masks: %v", err)
	}
	rows, err := readBatch(in.Batch)
	if err != nil {
		return nil, bad("%v", err)
	}
	getenv := t.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	c := tinker.New(cfg.URL, "")
	if cfg.APIKeyEnv != "" {
		c.APIKey = getenv(cfg.APIKeyEnv)
		if c.APIKey == "" {
			return nil, temporal.NewNonRetryableApplicationError(fmt.Sprintf(
				"tinker train batch: %s is not set on this worker (the deployment's trainer.api_key_env)", cfg.APIKeyEnv), "BadInput", nil)
		}
	}
	c.HTTP, c.Retry = t.HTTP, t.Retry
	c.OnWait = t.heartbeat(ctx, in.RunID)
	// The version's checkpoints are named v<N> on the service (its names
	// are [A-Za-z0-9_-]) and in the directory.
	name := "v" + strconv.FormatInt(n, 10)
	s := &tinkerStep{in: in, cfg: cfg, c: c, loss: loss, name: name, outDir: filepath.Join(in.Output.Dir, name), log: t.logger()}
	for _, r := range rows {
		s.samples = append(s.samples, sampleOf(r))
	}
	return s, nil
}

// readBatch reads and checks the step's batch file.
func readBatch(ref flow.BatchRef) ([]parquetbatch.Row, error) {
	path, err := localPath(ref.URI)
	if err != nil {
		return nil, err
	}
	if sum, err := fileSHA256(path); err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	} else if ref.SHA256 != "" && sum != ref.SHA256 {
		return nil, fmt.Errorf("batch %s has sha256 %s, not %s", path, sum, ref.SHA256)
	}
	_, rows, err := parquetbatch.Read(path)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, errors.New("batch has no samples")
	}
	return rows, nil
}

// heartbeat is the client's OnWait inside an activity: a heartbeat at
// most every HeartbeatEvery.
func (t *TinkerTraining) heartbeat(ctx context.Context, runID int64) func() {
	if !activity.IsActivity(ctx) {
		return nil
	}
	every := t.HeartbeatEvery
	if every <= 0 {
		every = 5 * time.Second
	}
	var last time.Time
	return func() {
		if time.Since(last) >= every {
			last = time.Now()
			activity.RecordHeartbeat(ctx, runID)
		}
	}
}

// run takes the step: a new model from the base state, the batch's
// minibatches, and the new version saved and fetched.
func (s *tinkerStep) run(ctx context.Context) (tinkerMeta, error) {
	base, err := s.baseState()
	if err != nil {
		return tinkerMeta{}, err
	}
	session, err := s.c.CreateSession(ctx, []string{"flywheel", s.in.Deployment, "run-" + strconv.FormatInt(s.in.RunID, 10)})
	if err != nil {
		return tinkerMeta{}, err
	}
	model, err := s.c.CreateModel(ctx, session, s.cfg.BaseModel, s.loraConfig())
	if err != nil {
		return tinkerMeta{}, err
	}
	if err := s.writeRecord(model); err != nil {
		return tinkerMeta{}, err
	}
	if base != "" {
		if err := s.c.LoadWeights(ctx, model, base, true, s.next()); err != nil {
			return tinkerMeta{}, err
		}
	}
	st, err := s.train(ctx, model)
	if err != nil {
		return tinkerMeta{}, err
	}
	name := s.name
	state, err := s.c.SaveWeights(ctx, model, name, s.next())
	if err != nil {
		return tinkerMeta{}, err
	}
	sampler, err := s.c.SaveWeightsForSampler(ctx, model, name, s.next())
	if err != nil {
		return tinkerMeta{}, err
	}
	meta := tinkerMeta{Service: s.cfg.URL, Model: model, State: state, Sampler: sampler, Deployment: s.in.Deployment,
		RunID: s.in.RunID, Parent: s.in.Base.Version, Loss: st.loss, Samples: len(s.samples), Tokens: st.tokens, Metrics: st.metrics()}
	if err := s.fetch(ctx, &meta); err != nil {
		return tinkerMeta{}, err
	}
	_ = s.c.UnloadModel(ctx, model) // its states are saved; freeing it is a courtesy
	return meta, nil
}

func (s *tinkerStep) next() int64 {
	s.seq++
	return s.seq
}

func (s *tinkerStep) loraConfig() tinker.LoraConfig {
	l := s.cfg.LoRA
	c := tinker.LoraConfig{Rank: l.Rank, TrainAttn: l.Attn, TrainMLP: l.MLP, TrainUnembed: l.Unembed}
	if l.Seed != 0 {
		c.Seed = &l.Seed
	}
	return c
}

// baseState is the training state the step loads: the base version's,
// from its tinker.json; "" for the deployment's base model (no version,
// or version 0, which a policy deployment stores its base model as). A
// base version that was not trained on this service cannot be continued.
func (s *tinkerStep) baseState() (string, error) {
	b := s.in.Base
	if n, ok := store.VersionNumber(b.Version); b.URI == "" || (ok && n == 0) {
		return "", nil
	}
	dir, err := localPath(b.URI)
	if err != nil {
		return "", temporal.NewNonRetryableApplicationError(fmt.Sprintf("tinker train batch: base %s: %v", b.Version, err), "BadInput", nil)
	}
	meta, ok := readTinkerMeta(dir)
	switch {
	case !ok:
		return "", temporal.NewNonRetryableApplicationError(fmt.Sprintf(
			"tinker train batch: base %s (%s) was not trained through the Tinker API: it has no %s naming its training state",
			b.Version, dir, tinkerMetaFile), "BadInput", nil)
	case meta.Service != s.cfg.URL:
		return "", temporal.NewNonRetryableApplicationError(fmt.Sprintf(
			"tinker train batch: base %s was trained on %s, and the deployment's trainer is %s: its state is not there",
			b.Version, meta.Service, s.cfg.URL), "BadInput", nil)
	}
	return meta.State, nil
}

// stepStats sums a step's passes.
type stepStats struct {
	loss          float64
	tokens        int
	updates       int
	icePop, kPop  int
	forwardPasses int
	gradNorm      float64
}

func (st stepStats) metrics() map[string]float64 {
	return map[string]float64{"updates": float64(st.updates), "forward_passes": float64(st.forwardPasses), "grad_norm": st.gradNorm,
		"icepop_masked_tokens": float64(st.icePop), "kpop_masked_tokens": float64(st.kPop)}
}

// train runs the step's passes on model.
func (s *tinkerStep) train(ctx context.Context, model string) (stepStats, error) {
	var st stepStats
	sft := s.in.Algo.Objective == trainer.ObjectiveSFT
	parts := trainer.SplitGroups(s.samples, s.cfg.MiniBatches)
	var flat []trainer.Sample // the samples in part order
	for _, p := range parts {
		flat = append(flat, p...)
	}
	var prox [][]float64
	if !sft && s.needsProximal() {
		// Every part's ratio is taken against the weights the step
		// starts from: one forward pass before any update.
		var err error
		if prox, err = s.proximal(ctx, model, flat); err != nil {
			return st, err
		}
		st.forwardPasses++
	}
	scale := 1.0
	if n := s.cfg.NominalBatch; n > 0 && len(s.samples) < n {
		scale = float64(len(s.samples)) / float64(n)
	}
	offset := 0
	for _, part := range parts {
		in, pst := s.partInput(part, offset, prox, sft)
		offset += len(part)
		if pst.tokens == 0 {
			continue // nothing to learn in prompt-only samples
		}
		out, err := s.c.ForwardBackward(ctx, model, in, s.next())
		if err != nil {
			return st, err
		}
		a := s.cfg.Adam
		res, err := s.c.OptimStep(ctx, model, tinker.AdamParams{LearningRate: a.LR * scale, Beta1: a.Beta1, Beta2: a.Beta2, Eps: a.Eps,
			WeightDecay: a.WeightDecay, GradClipNorm: a.GradClipNorm}, s.next())
		if err != nil {
			return st, err
		}
		st.loss += out.LossSum()
		st.tokens += pst.tokens
		st.icePop += pst.icePop
		st.kPop += pst.kPop
		st.updates++
		st.gradNorm += res.Metrics["grad_norm"]
	}
	if st.updates == 0 {
		return st, temporal.NewNonRetryableApplicationError("tinker train batch: no token has loss_mask 1", "BadData", nil)
	}
	st.gradNorm /= float64(st.updates)
	return st, nil
}

// needsProximal reports whether the step needs the current policy's
// log-probs: decoupled PPO's proximal policy, or the masks' π_prox.
func (s *tinkerStep) needsProximal() bool {
	return s.cfg.Loss == deployment.LossPPO || s.loss.IcePop || s.loss.KPop
}

// proximal is the base policy's log-prob of every sequence's tokens, by
// one forward pass; prox[i][t] is samples[i]'s position t (0 where t = 0).
func (s *tinkerStep) proximal(ctx context.Context, model string, samples []trainer.Sample) ([][]float64, error) {
	data := make([]tinker.Datum, len(samples))
	for i, smp := range samples {
		w := make([]float64, len(smp.TokenIDs)-1)
		for t := 1; t < len(smp.TokenIDs); t++ {
			w[t-1] = float64(smp.LossMask[t])
		}
		data[i] = sequenceDatum(smp.TokenIDs, w, nil, nil)
	}
	out, err := s.c.Forward(ctx, model, tinker.ForwardBackwardInput{Data: data, LossFn: tinker.LossCrossEntropy}, s.next())
	if err != nil {
		return nil, err
	}
	prox := make([][]float64, len(samples))
	for i, smp := range samples {
		lp := out.LossFnOutputs[i][tinker.OutputLogprobs].Data
		if len(lp) != len(smp.TokenIDs)-1 {
			return nil, &tinker.APIError{Op: tinker.PathForward, Detail: fmt.Sprintf("datum %d: %d logprobs for %d targets", i, len(lp), len(smp.TokenIDs)-1), Retryable: true}
		}
		prox[i] = append([]float64{0}, lp...)
	}
	return prox, nil
}

// partStats counts a minibatch's trained and masked tokens.
type partStats struct{ tokens, icePop, kPop int }

// partInput is one minibatch's forward_backward: every sample's datum,
// weighted 1/N on its N trained tokens (the token mean the built-in
// trainer takes), with the loss's inputs per token.
func (s *tinkerStep) partInput(part []trainer.Sample, offset int, prox [][]float64, sft bool) (tinker.ForwardBackwardInput, partStats) {
	var pst partStats
	for _, smp := range part {
		for _, m := range smp.LossMask {
			pst.tokens += int(m)
		}
	}
	in := tinker.ForwardBackwardInput{Data: make([]tinker.Datum, len(part))}
	switch {
	case sft:
		in.LossFn = tinker.LossCrossEntropy
	case s.cfg.Loss == deployment.LossPPO:
		in.LossFn = tinker.LossPPO
		in.LossFnConfig = map[string]float64{tinker.ClipLow: 1 - s.cfg.ClipLow, tinker.ClipHigh: 1 + s.cfg.ClipHigh}
	default:
		in.LossFn = tinker.LossImportanceSampling
	}
	inv := 0.0
	if pst.tokens > 0 {
		inv = 1 / float64(pst.tokens)
	}
	for j, smp := range part {
		n := len(smp.TokenIDs) - 1
		w := make([]float64, n)
		var lp, adv []float64
		if !sft {
			lp, adv = make([]float64, n), make([]float64, n)
		}
		for t := 1; t <= n; t++ {
			if smp.LossMask[t] == 0 {
				continue
			}
			w[t-1] = inv
			if sft {
				continue
			}
			behav := float64(smp.Logprobs[t])
			a := *smp.Advantage
			lp[t-1] = behav
			if prox != nil {
				p := prox[offset+j][t]
				weight, masked := s.loss.OffPolicy(p, behav)
				if masked.IcePop {
					pst.icePop++
				}
				if masked.KPop {
					pst.kPop++
				}
				if s.cfg.Loss == deployment.LossPPO {
					// The ratio is taken against the proximal policy and
					// the behaviour weight is a constant: it folds into
					// the advantage.
					lp[t-1], a = p, a*weight
				} else if masked.IcePop || masked.KPop {
					a = 0
				}
			}
			adv[t-1] = a
		}
		in.Data[j] = sequenceDatum(smp.TokenIDs, w, lp, adv)
	}
	return in, pst
}

// sequenceDatum is the datum of a whole sequence: position i of the input
// predicts tokens[i+1]; the per-target inputs are nil where unused.
func sequenceDatum(tokens []int, weights, logprobs, advantages []float64) tinker.Datum {
	d := tinker.Datum{ModelInput: tinker.Text(tokens[:len(tokens)-1]), LossFnInputs: map[string]tinker.TensorData{
		tinker.InputTargetTokens: tinker.Ints(tokens[1:]),
		tinker.InputWeights:      tinker.Floats(weights),
	}}
	if logprobs != nil {
		d.LossFnInputs[tinker.InputLogprobs] = tinker.Floats(logprobs)
	}
	if advantages != nil {
		d.LossFnInputs[tinker.InputAdvantages] = tinker.Floats(advantages)
	}
	return d
}
