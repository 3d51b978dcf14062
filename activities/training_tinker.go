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
	"github.com/flywheel-ai/flywheel/tinkerstep"
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
	// works, and bounds each poll of a future (default 5 s, and never
	// slower than a third of the step's heartbeat timeout).
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

// stepRecord names the model a step trained, written once every update
// has answered, so that a retry after the worker died fetches the version
// that model saved instead of training again. The saves are queued behind
// the updates before their answers are read: only the record says the
// updates succeeded. A retry trusts one only when Trained (a worker before
// this rule wrote it before training).
type stepRecord struct {
	RunID   int64  `json:"training_run"`
	Service string `json:"service"`
	Model   string `json:"model_id"`
	Trained bool   `json:"trained,omitempty"`
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
	s.batch = startBatchRead(in.Batch)
	if rec, ok := s.readRecord(); ok && rec.RunID == in.RunID && rec.Service == s.cfg.URL && rec.Trained {
		// An earlier attempt died after its updates: if it saved the
		// version, fetch it.
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
	masks   *deployment.TokenMasks
	batch   *batchRead
	samples []trainer.Sample // once readSamples has read the batch
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
	if in.Algo.KLCoef != 0 {
		cfg.KLCoef = in.Algo.KLCoef // the loop's overrides the deployment's
	}
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
	masks := in.Algo.Masks
	if masks == nil {
		masks = cfg.Masks // the loop names none: the deployment's trainer's
	}
	if masks != nil {
		m := trainer.Masks{IcePop: masks.IcePop, IcePopLow: masks.IcePopLow, IcePopHigh: masks.IcePopHigh, KPop: masks.KPop, KPopPhi: masks.KPopPhi}
		if _, err := m.Apply(trainer.LossConfig{}); err != nil {
			return nil, bad("masks: %v", err)
		}
	}
	c, err := t.client(cfg, "tinker train batch")
	if err != nil {
		return nil, err
	}
	c.OnWait, c.PollTimeout = t.heartbeat(ctx, in.RunID)
	// The version's checkpoints are named v<N> on the service (its names
	// are [A-Za-z0-9_-]) and in the directory.
	name := "v" + strconv.FormatInt(n, 10)
	return &tinkerStep{in: in, cfg: cfg, c: c, masks: masks, name: name, outDir: filepath.Join(in.Output.Dir, name), log: t.logger()}, nil
}

// batchRead is the step's batch file, read and checked in the background
// while the service makes the step's model and loads its base state.
type batchRead struct {
	done    chan struct{}
	samples []trainer.Sample
	err     error
}

func startBatchRead(ref flow.BatchRef) *batchRead {
	b := &batchRead{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		rows, err := readBatch(ref)
		if err != nil {
			b.err = err
			return
		}
		for _, r := range rows {
			b.samples = append(b.samples, sampleOf(r))
		}
	}()
	return b
}

// readSamples waits for the batch; a bad one fails the step for good.
func (s *tinkerStep) readSamples(ctx context.Context) error {
	select {
	case <-s.batch.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.batch.err != nil {
		return temporal.NewNonRetryableApplicationError("tinker train batch: "+s.batch.err.Error(), "BadInput", nil)
	}
	s.samples = s.batch.samples
	return nil
}

// client is a client of cfg's service, with its API key from this
// worker's environment; op names the caller in the error when the key is
// not set.
func (t *TinkerTraining) client(cfg deployment.Trainer, op string) (*tinker.Client, error) {
	getenv := t.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	c := tinker.New(cfg.URL, "")
	if cfg.APIKeyEnv != "" {
		c.APIKey = getenv(cfg.APIKeyEnv)
		if c.APIKey == "" {
			return nil, temporal.NewNonRetryableApplicationError(fmt.Sprintf(
				"%s: %s is not set on this worker (the deployment's trainer.api_key_env)", op, cfg.APIKeyEnv), "BadInput", nil)
		}
	}
	c.HTTP, c.Retry = t.HTTP, t.Retry
	return c, nil
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

// defaultTinkerHeartbeatEvery is TinkerTraining's default HeartbeatEvery.
const defaultTinkerHeartbeatEvery = 5 * time.Second

// heartbeat is the client's OnWait inside an activity, a heartbeat at most
// every HeartbeatEvery, and how long one poll of a future may be held.
// Both are bounded by a third of the step's heartbeat timeout: the client
// heartbeats only between polls, and a poll the service holds for its
// full 30 s would have a step with a shorter timeout taken for a dead
// worker's, and retried, while it trains.
func (t *TinkerTraining) heartbeat(ctx context.Context, runID int64) (onWait func(), poll time.Duration) {
	if !activity.IsActivity(ctx) {
		return nil, 0
	}
	every := t.HeartbeatEvery
	if every <= 0 {
		every = defaultTinkerHeartbeatEvery
	}
	every = heartbeatInterval(every, activity.GetInfo(ctx).HeartbeatTimeout)
	var last time.Time
	return func() {
		if time.Since(last) >= every {
			last = time.Now()
			activity.RecordHeartbeat(ctx, runID)
		}
	}, every
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
	step := tinkerstep.Config{Trainer: s.cfg, Masks: s.masks, SFT: s.in.Algo.Objective == trainer.ObjectiveSFT}
	if base != "" {
		// The service runs the model's requests in order: the proximal
		// pass queues behind the load, and no update is queued until the
		// load has succeeded.
		load, err := s.c.LoadWeightsAsync(ctx, model, base, true, s.next())
		if err != nil {
			return tinkerMeta{}, err
		}
		step.Ready = func(ctx context.Context) error {
			_, err := load.Await(ctx)
			return err
		}
	}
	if s.cfg.KLCoef > 0 && !step.SFT {
		// The KL penalty's reference is the base model itself: a model
		// of the service never trained (a fresh adapter leaves the base's
		// outputs as they are).
		ref, err := s.c.CreateModel(ctx, session, s.cfg.BaseModel, s.loraConfig())
		if err != nil {
			return tinkerMeta{}, err
		}
		defer func() { _ = s.c.UnloadModel(context.WithoutCancel(ctx), ref) }()
		var refSeq int64
		step.Reference, step.ReferenceSeq = ref, func() int64 { refSeq++; return refSeq }
	}
	if err := s.readSamples(ctx); err != nil {
		return tinkerMeta{}, err
	}
	// Both saves are queued behind the last update, the sampler weights
	// first (they are downloaded while the service writes the training
	// state), and the model's unload behind them: its states saved,
	// freeing it is a courtesy, whose answer is not read.
	var savingSampler tinker.Pending[tinker.SaveWeightsForSamplerResponse]
	var savingState tinker.Pending[tinker.SaveWeightsResponse]
	step.Queued = func(ctx context.Context) error {
		var err error
		if savingSampler, err = s.c.SaveWeightsForSamplerAsync(ctx, model, s.name, s.next()); err != nil {
			return err
		}
		if savingState, err = s.c.SaveWeightsAsync(ctx, model, s.name, s.next()); err != nil {
			return err
		}
		_ = s.c.QueueUnload(ctx, model)
		return nil
	}
	st, err := tinkerstep.Train(ctx, s.c, model, s.samples, step, s.next)
	if errors.Is(err, tinkerstep.ErrNothingToTrain) {
		return tinkerMeta{}, temporal.NewNonRetryableApplicationError("tinker train batch: "+err.Error(), "BadData", err)
	}
	if err != nil {
		return tinkerMeta{}, err
	}
	if err := s.writeRecord(model); err != nil {
		return tinkerMeta{}, err
	}
	sampler, err := savingSampler.Await(ctx)
	if err != nil {
		return tinkerMeta{}, err
	}
	tmp, err := s.download(ctx, sampler.Path)
	if err != nil {
		return tinkerMeta{}, err
	}
	defer os.RemoveAll(tmp) // gone once installed
	// The service's copy of the sampler weights is never read again (the
	// training state stays: a later step may start from this version).
	if err := s.c.DeleteCheckpoint(ctx, sampler.Path); err != nil {
		s.log.Warn(msgSamplerNotDeleted, "deployment", s.in.Deployment, "checkpoint", sampler.Path, "error", err)
	}
	state, err := savingState.Await(ctx)
	if err != nil {
		return tinkerMeta{}, err
	}
	meta := tinkerMeta{Service: s.cfg.URL, Model: model, State: state.Path, Sampler: sampler.Path, Deployment: s.in.Deployment,
		RunID: s.in.RunID, Parent: s.in.Base.Version, Loss: st.Loss, Samples: len(s.samples), Tokens: st.Tokens, Metrics: st.Metrics()}
	if err := s.install(tmp, &meta); err != nil {
		return tinkerMeta{}, err
	}
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

const msgSamplerNotDeleted = "the trainer's copy of the sampler weights was not deleted; the version's directory holds them"
