package workflows

import (
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
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
const (
	CheckBatchActivity = "CheckBatch"
	ClaimBatchActivity = "ClaimBatch"
	// TrainStepActivity runs on TrainerTaskQueue, next to the weights.
	TrainStepActivity = "TrainStep"
)

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
}

// TrainingPolicy says when a batch is ready and how it trains; zero fields
// take the defaults (withDefaults).
type TrainingPolicy struct {
	// BatchSize is how many queued samples make a batch. Default 32.
	BatchSize int
	// MaxBatchAge trains a smaller batch once its oldest sample waited this
	// long. Default 10m.
	MaxBatchAge time.Duration
	// PollInterval is how often the queue is checked. Default 30s.
	PollInterval time.Duration
	// MaxStaleness is η: samples whose behaviour version is more than η
	// versions behind the serving one are dropped. Default 4.
	MaxStaleness int
	// StepTimeout bounds one train step. Default 30m.
	StepTimeout time.Duration
	// StepHeartbeatTimeout is how long a train step may go without a
	// heartbeat before it is handed to another trainer worker. Default 1m.
	StepHeartbeatTimeout time.Duration
	// StepsPerRun is how many steps one run makes before it continues as
	// new. Default 50.
	StepsPerRun int
	// Release gates each candidate.
	Release ReleasePolicy
	// NoRelease leaves candidates unreleased (for offline training).
	NoRelease bool
}

func (p TrainingPolicy) withDefaults() TrainingPolicy {
	if p.BatchSize <= 0 {
		p.BatchSize = 32
	}
	if p.MaxBatchAge <= 0 {
		p.MaxBatchAge = 10 * time.Minute
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
	if p.StepHeartbeatTimeout <= 0 {
		p.StepHeartbeatTimeout = time.Minute
	}
	if p.StepsPerRun <= 0 {
		p.StepsPerRun = 50
	}
	return p
}

// CheckBatchInput asks how the deployment's queue stands.
type CheckBatchInput struct {
	Deployment string
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
}

// ClaimBatchOutput is the claimed batch.
type ClaimBatchOutput struct {
	RunID        int64
	Samples      int
	DroppedStale int
	// BaseVersion serves now; the candidate's parent.
	BaseVersion string
}

// TrainStepInput trains one claimed run.
type TrainStepInput struct {
	Deployment string
	RunID      int64
}

// TrainStepOutput is the candidate the step produced.
type TrainStepOutput struct {
	Version  string
	Loss     float64
	Samples  int
	Groups   int
	Baseline int // singleton samples scored against the per-task baseline
	Stale    int // samples the trainer itself dropped as stale
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
}

// TrainingWorkflow is the training loop of one deployment (workflow id
// TrainingWorkflowID): it waits for a batch (size or age), claims it
// (dropping samples staler than η), trains one step on the trainer task
// queue, and releases the candidate through a ReleaseWorkflow.
func TrainingWorkflow(ctx workflow.Context, in TrainingInput) (TrainingState, error) {
	if in.Deployment == "" {
		return TrainingState{}, temporal.NewNonRetryableApplicationError("training needs a Deployment", "BadInput", nil)
	}
	p := in.Policy.withDefaults()
	st := TrainingState{Deployment: in.Deployment, Phase: "waiting"}
	trainNow := false
	if in.Carry != nil {
		st.Steps, st.LastVersion, trainNow = in.Carry.Steps, in.Carry.LastVersion, in.Carry.TrainNow
	}
	if err := workflow.SetQueryHandler(ctx, TrainingStateQuery, func() (TrainingState, error) { return st, nil }); err != nil {
		return st, fmt.Errorf("register state query: %w", err)
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, DeploymentKey.ValueSet(in.Deployment))
	nowCh := workflow.GetSignalChannel(ctx, TrainNowSignal)
	drain := func() {
		for nowCh.ReceiveAsync(nil) {
			trainNow = true
		}
	}

	light := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute, MaximumAttempts: 10, NonRetryableErrorTypes: []string{"BadInput"}},
	})
	// The step heartbeats; when its worker dies the heartbeat timeout hands
	// it to another trainer worker, which resumes from the claimed run.
	train := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:           TrainerTaskQueue,
		StartToCloseTimeout: p.StepTimeout,
		HeartbeatTimeout:    p.StepHeartbeatTimeout,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: 5 * time.Second, MaximumInterval: 5 * time.Minute, MaximumAttempts: 5, NonRetryableErrorTypes: []string{"BadInput", "BadData"}},
	})

	info := workflow.GetInfo(ctx)
	// A run ends after StepsPerRun steps or maxPollsPerRun idle polls, far
	// below the history limits either way.
	const maxPollsPerRun = 500
	polls := 0
	for steps := 0; steps < p.StepsPerRun && polls < maxPollsPerRun && !info.GetContinueAsNewSuggested(); {
		drain()
		var q CheckBatchOutput
		if err := workflow.ExecuteActivity(light, CheckBatchActivity, CheckBatchInput{Deployment: in.Deployment}).Get(ctx, &q); err != nil {
			return st, fmt.Errorf("check batch: %w", err)
		}
		st.Queued = q.Queued
		ready := q.Queued >= p.BatchSize || (q.Queued > 0 && (q.OldestAge >= p.MaxBatchAge || trainNow))
		if !ready {
			polls++
			st.Phase = "waiting"
			sel := workflow.NewSelector(ctx)
			sel.AddFuture(workflow.NewTimer(ctx, p.PollInterval), func(workflow.Future) {})
			sel.AddReceive(nowCh, func(c workflow.ReceiveChannel, _ bool) {
				c.Receive(ctx, nil)
				trainNow = true
			})
			sel.Select(ctx)
			continue
		}
		trainNow = false
		st.Phase = "claiming"
		runKey := fmt.Sprintf("%s/%s/%d", info.WorkflowExecution.ID, info.WorkflowExecution.RunID, steps)
		var claim ClaimBatchOutput
		err := workflow.ExecuteActivity(light, ClaimBatchActivity, ClaimBatchInput{
			Deployment: in.Deployment, RunKey: runKey, BatchSize: p.BatchSize, MaxStaleness: p.MaxStaleness,
		}).Get(ctx, &claim)
		if err != nil {
			return st, fmt.Errorf("claim batch: %w", err)
		}
		steps++
		if claim.Samples == 0 {
			continue // everything was stale
		}
		st.Phase = "training"
		var out TrainStepOutput
		if err := workflow.ExecuteActivity(train, TrainStepActivity, TrainStepInput{Deployment: in.Deployment, RunID: claim.RunID}).Get(ctx, &out); err != nil {
			// A failed step leaves its samples queued for the next batch.
			st.LastError = err.Error()
			workflow.GetLogger(ctx).Error("train step failed", "deployment", in.Deployment, "run_id", claim.RunID, "error", err)
			continue
		}
		st.Steps++
		st.LastVersion, st.LastError = out.Version, ""
		_ = workflow.UpsertTypedSearchAttributes(ctx, ModelVersionKey.ValueSet(out.Version))
		if p.NoRelease {
			continue
		}
		st.Phase = "releasing"
		st.LastRelease = ReleaseWorkflowID(in.Deployment, LayerWeights, out.Version)
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:        st.LastRelease,
			ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
		})
		var rel ReleaseResult
		err = workflow.ExecuteChildWorkflow(cctx, ReleaseWorkflow, ReleaseInput{
			Deployment: in.Deployment, Layer: LayerWeights, Candidate: out.Version, Baseline: claim.BaseVersion,
			Policy: p.Release, Reason: fmt.Sprintf("training run %d: %d samples, loss %.4f", claim.RunID, out.Samples, out.Loss),
		}).Get(ctx, &rel)
		if err != nil {
			st.LastOutcome = "release failed: " + err.Error()
			continue
		}
		st.LastOutcome = rel.State.Status
	}
	drain()
	st.Phase = "continuing"
	return st, workflow.NewContinueAsNewError(ctx, TrainingWorkflow, TrainingInput{
		Deployment: in.Deployment, Policy: in.Policy,
		Carry: &TrainingCarry{Steps: st.Steps, LastVersion: st.LastVersion, TrainNow: trainNow},
	})
}
