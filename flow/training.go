package flow

import (
	"math"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
)

// TrainingWorkflow names and signal.
const (
	TrainingWorkflowName = "TrainingWorkflow"
	// TrainNowSignal asks for a step as soon as any sample is queued (the
	// evolution workflow's "weights" decision sends it).
	TrainNowSignal     = "train-now"
	TrainingStateQuery = "state"
)

// Activity names TrainingWorkflow runs (activities.Training implements them).
const ()

// ResetTrainerInput names the version training goes on from: the input of
// the ResetTrainer activity, which only histories from before the trainer
// protocol schedule.
type ResetTrainerInput struct {
	Deployment string
	Version    string
}

// ResetTrainerOutput confirms it.
type ResetTrainerOutput struct {
	Version string
}

// TrainingWorkflowID is the one TrainingWorkflow of a deployment.
func TrainingWorkflowID(deployment string) string { return "training-" + deployment }

// ReleaseWorkflowID is the release of one candidate.
func ReleaseWorkflowID(deployment, layer, candidate string) string {
	return "release-" + deployment + "-" + layer + "-" + candidate
}

// TrainingInput starts (or continues) the training loop of a deployment.
type TrainingInput struct {
	Deployment string
	Policy     TrainingPolicy
	// Carry is set by the workflow itself when it continues as new.
	Carry *TrainingCarry `json:",omitempty"`
}

// TrainingCarry is handed to the next run.
type TrainingCarry struct {
	Steps       int
	LastVersion string
	TrainNow    bool
	// Serving is the version serving when the run ended; Ahead is how many
	// steps the trainer's weights are past it.
	Serving string `json:",omitempty"`
	Ahead   int    `json:",omitempty"`
	// Pending is the newest candidate not yet released, PendingAhead the
	// value of Ahead when it was trained.
	Pending       string `json:",omitempty"`
	PendingAhead  int    `json:",omitempty"`
	PendingReason string `json:",omitempty"`
	// Failed counts the steps in a row that failed, so the wait after the
	// next failure keeps growing across runs.
	Failed int `json:",omitempty"`
	// From is the version the line trains on from when it is not the
	// serving one (the anchor, after a failed release).
	From string `json:",omitempty"`
}

// TrainingPolicy says when a batch is ready and how it trains; zero fields
// take the defaults (WithDefaults).
type TrainingPolicy struct {
	// BatchSize is how many queued samples make a batch. Default 32.
	BatchSize int
	// MaxBatchAge trains a smaller batch once its oldest sample waited this
	// long. Default 10m.
	MaxBatchAge time.Duration
	// GroupWait is how long the first sample of a GRPO group waits for the
	// rest of its group's sessions before the group trains without them (a
	// member may never come: unrewarded, stale, opted out). Until then a
	// partial group is neither counted nor claimed. Default MaxBatchAge.
	GroupWait time.Duration
	// PollInterval is how often the queue is checked. Default 30s.
	PollInterval time.Duration
	// MaxStaleness is η: samples whose behaviour version is more than η
	// versions behind the serving one are dropped. Default 4.
	MaxStaleness int
	// StepTimeout bounds one train step. Default 30m.
	StepTimeout time.Duration
	// StepStartTimeout is how long a train step waits for a worker on
	// the trainer's queue to take it; then the step fails and the loop
	// says on the status page that no worker serves the queue. Default 5m.
	StepStartTimeout time.Duration `json:",omitempty"`
	// StepHeartbeatTimeout is how long a train step may go without a
	// heartbeat before it is handed to another trainer worker. Default 1m.
	StepHeartbeatTimeout time.Duration
	// StepsPerRun is how many steps one run makes before it continues as
	// new. Default 50.
	StepsPerRun int
	// MaxAhead is how many steps the trainer may run ahead of the serving
	// version while a release is gated: training goes on during a release,
	// and the newest candidate is released next. Samples come from the
	// serving version, so more than η steps ahead they would be dropped
	// as stale. Default η (MaxStaleness); negative: train only when no
	// release is in flight (one candidate at a time).
	MaxAhead int
	// Release gates each candidate.
	Release deployment.ReleasePolicy
	// NoRelease leaves candidates unreleased (for offline training).
	NoRelease bool
	// Masks are this deployment's KPop / IcePop settings (nil: the
	// trainer's own, config trainer.*).
	Masks *deployment.TokenMasks `json:",omitempty"`
	// TrainerQueue is the task queue of the workers that train this
	// deployment (TrainBatch) when its settings name no trainer (a trainer
	// they name wins). Default TrainerTaskQueue, which only a
	// flywheel.train/v1 worker outside Flywheel serves.
	TrainerQueue string `json:",omitempty"`
}

func (p TrainingPolicy) WithDefaults() TrainingPolicy {
	if p.BatchSize <= 0 {
		p.BatchSize = 32
	}
	if p.MaxBatchAge <= 0 {
		p.MaxBatchAge = 10 * time.Minute
	}
	if p.GroupWait <= 0 {
		p.GroupWait = p.MaxBatchAge
	}
	if p.PollInterval <= 0 {
		p.PollInterval = 30 * time.Second
	}
	if p.MaxStaleness == 0 {
		p.MaxStaleness = 4
	}
	if p.StepTimeout <= 0 {
		p.StepTimeout = 30 * time.Minute
	}
	if p.StepStartTimeout <= 0 {
		p.StepStartTimeout = 5 * time.Minute
	}
	if p.StepHeartbeatTimeout <= 0 {
		p.StepHeartbeatTimeout = time.Minute
	}
	if p.StepsPerRun <= 0 {
		p.StepsPerRun = 50
	}
	if p.TrainerQueue == "" {
		p.TrainerQueue = TrainerTaskQueue
	}
	switch {
	case p.MaxAhead < 0:
		p.MaxAhead = 0
	case p.MaxAhead > 0:
	case p.MaxStaleness < 0: // no staleness bound: no reason to stop
		p.MaxAhead = math.MaxInt32
	default:
		p.MaxAhead = max(p.MaxStaleness, 1)
	}
	return p
}

// CheckBatchInput asks how the deployment's queue stands.
type CheckBatchInput struct {
	Deployment string
	// FreshOnly counts only the samples a claim with staleness bound
	// MaxStaleness (negative: none) would keep. Inputs recorded before
	// these fields existed count every queued sample.
	MaxStaleness int
	FreshOnly    bool
	// GroupWait counts a partial GRPO group only once its first sample
	// waited this long (0: every group counts).
	GroupWait time.Duration `json:",omitempty"`
}

// CheckBatchOutput is the queue's state.
type CheckBatchOutput struct {
	Queued    int
	OldestAge time.Duration
}

// ClaimBatchInput claims a batch for one step; RunKey makes it idempotent.
type ClaimBatchInput struct {
	Deployment   string
	RunKey       string
	BatchSize    int
	MaxStaleness int
	// GroupWait claims a partial GRPO group only once its first sample
	// waited this long (0: every group).
	GroupWait time.Duration `json:",omitempty"`
}

// ClaimBatchOutput is the claimed batch.
type ClaimBatchOutput struct {
	RunID        int64
	Samples      int
	DroppedStale int
	// BaseVersion serves now; the candidate's parent.
	BaseVersion string
}

// TrainStepInput trains one claimed run: the input of the TrainStep
// activity, which only histories from before the trainer protocol
// schedule. TrainStepOutput is also what RegisterCheckpoint answers.
type TrainStepInput struct {
	Deployment string
	RunID      int64
	// Masks, when set, are this deployment's KPop / IcePop settings; nil
	// leaves the trainer's own (config trainer.*).
	Masks *deployment.TokenMasks `json:",omitempty"`
}

// TrainStepOutput is the candidate the step produced.
type TrainStepOutput struct {
	Version  string
	Loss     float64
	Samples  int
	Groups   int
	Baseline int // singleton samples scored against the per-task baseline
	Stale    int // samples the trainer itself dropped as stale
	// IcePopMasked and KPopMasked are the fractions of trained tokens each
	// mask dropped.
	IcePopMasked float64 `json:",omitempty"`
	KPopMasked   float64 `json:",omitempty"`
}

// TrainingState answers the state query.
type TrainingState struct {
	Deployment  string
	Phase       string
	Steps       int
	Queued      int
	LastVersion string
	LastRelease string
	LastOutcome string
	LastError   string `json:",omitempty"`
	// Serving is the version serving now, Ahead the steps the trainer is
	// past it, Releasing the candidate whose release is in flight.
	Serving   string `json:",omitempty"`
	Ahead     int
	Releasing string `json:",omitempty"`
	Promoted  int
	// RolledBack counts releases that ended without promotion.
	RolledBack int
	// Resets counts the times training went back to the serving weights
	// or the anchor's.
	Resets int
	// From is the version the trainer went back to when it is not the
	// serving one: the anchor, the best promoted version on the held-out
	// suite, after a release failed.
	From string `json:",omitempty"`
}
