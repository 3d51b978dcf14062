package workflows

import (
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/flow"
)

// TrainingWorkflow is the training loop of one deployment (workflow id
// TrainingWorkflowID): it waits for a batch (size or age), claims it
// (dropping samples staler than η), trains one step on the trainer task
// queue, and releases candidates through ReleaseWorkflows. Training goes on
// while a release is gated, up to MaxAhead steps past the serving version;
// when the release ends the newest candidate is released next. A candidate
// failing a safety or regression gate sends the trainer back to the
// serving weights, as does a rollback that leaves nothing to release;
// after a failed release, to the anchor's weights instead, when its suite
// gates named an anchor other than the serving version.
func TrainingWorkflow(ctx workflow.Context, in flow.TrainingInput) (flow.TrainingState, error) {
	if in.Deployment == "" {
		return flow.TrainingState{}, temporal.NewNonRetryableApplicationError("training needs a Deployment", "BadInput", nil)
	}
	r := &trainingRun{in: in, p: in.Policy.WithDefaults()}
	r.st = flow.TrainingState{Deployment: in.Deployment, Phase: "waiting"}
	if c := in.Carry; c != nil {
		r.st.Steps, r.st.LastVersion, r.trainNow = c.Steps, c.LastVersion, c.TrainNow
		r.st.Serving, r.st.Ahead = c.Serving, c.Ahead
		r.pending, r.pendingAhead, r.pendingReason = c.Pending, c.PendingAhead, c.PendingReason
		r.st.From, r.failed = c.From, c.Failed
	}
	if err := workflow.SetQueryHandler(ctx, flow.TrainingStateQuery, func() (flow.TrainingState, error) { return r.st, nil }); err != nil {
		return r.st, fmt.Errorf("register state query: %w", err)
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.DeploymentKey.ValueSet(in.Deployment))
	return r.run(ctx)
}

type trainingRun struct {
	in       flow.TrainingInput
	p        flow.TrainingPolicy
	st       flow.TrainingState
	trainNow bool
	nowCh    workflow.ReceiveChannel
	// servingCh receives ServingChangedSignal; changedTo is the version a
	// signal said serves now, not yet handled.
	servingCh workflow.ReceiveChannel
	changedTo string
	light     workflow.Context
	train     workflow.Context

	// pending is the newest candidate not yet released, trained
	// pendingAhead steps past the serving version, for pendingReason.
	pending       string
	pendingAhead  int
	pendingReason string
	// rel is the release in flight (nil: none), of candidate relCand
	// trained at relAhead steps past the then serving version.
	rel      workflow.ChildWorkflowFuture
	relCand  string
	relAhead int
	// relDone is set by the release's callback, handled by the loop.
	relDone bool
	// failed counts the steps failed in a row.
	failed int
}

func (r *trainingRun) run(ctx workflow.Context) (flow.TrainingState, error) {
	r.setUp(ctx)
	info := workflow.GetInfo(ctx)
	// A run ends after StepsPerRun steps or maxPollsPerRun idle polls, far
	// below the history limits either way.
	const maxPollsPerRun = 500
	polls := 0
	for steps := 0; steps < r.p.StepsPerRun && polls < maxPollsPerRun && !info.GetContinueAsNewSuggested(); {
		r.drain()
		if err := r.servingChanged(ctx); err != nil {
			return r.st, err
		}
		if err := r.settleRelease(ctx); err != nil {
			return r.st, err
		}
		if r.rel != nil && r.st.Ahead >= r.p.MaxAhead {
			// Another step would train past what the serving version's
			// samples can feed (η): wait for the release.
			r.st.Phase = "waiting for release"
			r.wait(ctx, 0)
			continue
		}
		ready, err := r.batchReady(ctx)
		if err != nil {
			return r.st, err
		}
		if !ready {
			polls++
			r.st.Phase = "waiting"
			r.wait(ctx, r.p.PollInterval)
			continue
		}
		claim, err := r.claim(ctx, fmt.Sprintf("%s/%s/%d", info.WorkflowExecution.ID, info.WorkflowExecution.RunID, steps))
		if err != nil {
			return r.st, err
		}
		steps++
		if claim.Samples == 0 {
			continue // everything was stale
		}
		r.trainClaimed(ctx, claim)
	}
	return r.continueAsNew(ctx)
}

// setUp listens for the loop's signals and sets the options its
// activities run with.
func (r *trainingRun) setUp(ctx workflow.Context) {
	r.nowCh = workflow.GetSignalChannel(ctx, flow.TrainNowSignal)
	r.servingCh = workflow.GetSignalChannel(ctx, flow.ServingChangedSignal)
	// Checking and claiming are short Postgres statements (the claim is
	// idempotent by its run key): local activities, so a step costs one
	// server round trip (the train step) instead of three.
	r.light = workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute, MaximumAttempts: 10, NonRetryableErrorTypes: []string{"BadInput"}},
	})
	// The step heartbeats; when its worker dies the heartbeat timeout hands
	// it to another trainer worker, which resumes from the claimed run.
	r.train = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              r.p.TrainerQueue,
		StartToCloseTimeout:    r.p.StepTimeout,
		ScheduleToStartTimeout: r.p.StepStartTimeout,
		HeartbeatTimeout:       r.p.StepHeartbeatTimeout,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 5 * time.Second, MaximumInterval: 5 * time.Minute, MaximumAttempts: 5, NonRetryableErrorTypes: []string{"BadInput", "BadData", "WrongDeployment"}},
	})
}

// batchReady checks the queue: a batch is ready at BatchSize samples, or
// sooner once its oldest sample is MaxBatchAge old or train-now was
// signalled.
func (r *trainingRun) batchReady(ctx workflow.Context) (bool, error) {
	p := r.p
	var q flow.CheckBatchOutput
	if err := workflow.ExecuteLocalActivity(r.light, aTraining.CheckBatch, flow.CheckBatchInput{Deployment: r.in.Deployment, MaxStaleness: r.claimStaleness(), FreshOnly: true, GroupWait: p.GroupWait}).Get(ctx, &q); err != nil {
		return false, fmt.Errorf("check batch: %w", err)
	}
	r.st.Queued = q.Queued
	return q.Queued >= p.BatchSize || (q.Queued > 0 && (q.OldestAge >= p.MaxBatchAge || r.trainNow)), nil
}

// claim claims the next batch under runKey, which a train-now signal no
// longer hurries; the store's base version wins over the loop's.
func (r *trainingRun) claim(ctx workflow.Context, runKey string) (flow.ClaimBatchOutput, error) {
	p := r.p
	r.trainNow = false
	r.st.Phase = "claiming"
	var claim flow.ClaimBatchOutput
	err := workflow.ExecuteLocalActivity(r.light, aTraining.ClaimBatch, flow.ClaimBatchInput{
		Deployment: r.in.Deployment, RunKey: runKey, BatchSize: p.BatchSize, MaxStaleness: r.claimStaleness(), GroupWait: p.GroupWait,
	}).Get(ctx, &claim)
	if err != nil {
		return claim, fmt.Errorf("claim batch: %w", err)
	}
	if claim.BaseVersion != "" {
		r.st.Serving = claim.BaseVersion // the store's word wins
	}
	return claim, nil
}

// trainClaimed trains one step on a claimed batch, through the trainer
// protocol or (histories from before it) one TrainStep activity.
func (r *trainingRun) trainClaimed(ctx workflow.Context, claim flow.ClaimBatchOutput) {
	r.st.Phase = "training"
	var out flow.TrainStepOutput
	var err error
	if workflow.GetVersion(ctx, trainingChangeProtocol, workflow.DefaultVersion, 1) >= 1 {
		out, err = r.step(ctx, claim.RunID)
	} else {
		// Replayed only (see legacyTrainStepActivity).
		err = workflow.ExecuteActivity(r.train, legacyTrainStepActivity, flow.TrainStepInput{Deployment: r.in.Deployment, RunID: claim.RunID, Masks: r.p.Masks}).Get(ctx, &out)
	}
	if err != nil {
		r.stepFailed(ctx, claim.RunID, err)
		return
	}
	r.stepTrained(ctx, claim, out)
}

// stepFailed records a failed step and waits before the next claim,
// longer with each failure in a row.
func (r *trainingRun) stepFailed(ctx workflow.Context, runID int64, err error) {
	// A failed step leaves its samples queued for the next batch.
	r.st.LastError = err.Error()
	workflow.GetLogger(ctx).Error("train step failed", "deployment", r.in.Deployment, "run_id", runID, "error", err)
	r.failed++
	if workflow.GetVersion(ctx, trainingChangeBackoff, workflow.DefaultVersion, 1) >= 1 {
		// A step that cannot succeed (no trainer for this
		// deployment, a bad batch) fails at once; claiming the
		// next batch at once would spin. Wait, longer each time.
		r.st.Phase = "waiting after a failed step"
		if workflow.GetVersion(ctx, trainingChangeFailedWaitHolds, workflow.DefaultVersion, 1) >= 1 {
			// Train-now (an evolution decision every few
			// seconds) must not cut this wait short, or a
			// deployment no worker can train spins on it.
			r.waitOut(ctx, failedStepWait(r.p.PollInterval, r.failed))
		} else {
			r.wait(ctx, failedStepWait(r.p.PollInterval, r.failed))
		}
	}
}

// stepTrained counts a trained step and makes its version the candidate
// to release next.
func (r *trainingRun) stepTrained(ctx workflow.Context, claim flow.ClaimBatchOutput, out flow.TrainStepOutput) {
	r.failed = 0
	r.st.Steps++
	r.st.Ahead++
	r.st.LastVersion, r.st.LastError = out.Version, ""
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.ModelVersionKey.ValueSet(out.Version))
	if !r.p.NoRelease {
		r.pending, r.pendingAhead = out.Version, r.st.Ahead
		r.pendingReason = fmt.Sprintf("training run %d: %d samples, loss %.4f", claim.RunID, out.Samples, out.Loss)
	}
}

// continueAsNew ends the run once its release is settled and carries the
// loop's state into the next one.
func (r *trainingRun) continueAsNew(ctx workflow.Context) (flow.TrainingState, error) {
	// The next run starts with no release in flight: it cannot wait on a
	// child of this one. Training could not go far meanwhile anyway.
	for {
		if err := r.settleRelease(ctx); err != nil {
			return r.st, err
		}
		if r.rel == nil {
			break
		}
		r.st.Phase = "waiting for release"
		r.wait(ctx, 0)
	}
	r.drain()
	// A rollback signalled during the last wait is handled here: the next
	// run starts from the serving weights it names.
	if err := r.servingChanged(ctx); err != nil {
		return r.st, err
	}
	r.pruneStates(ctx)
	r.st.Phase = "continuing"
	return r.st, workflow.NewContinueAsNewError(ctx, TrainingWorkflow, flow.TrainingInput{
		Deployment: r.in.Deployment, Policy: r.in.Policy,
		Carry: &flow.TrainingCarry{Steps: r.st.Steps, LastVersion: r.st.LastVersion, TrainNow: r.trainNow,
			Serving: r.st.Serving, Ahead: r.st.Ahead, Pending: r.pending, PendingAhead: r.pendingAhead, PendingReason: r.pendingReason, Failed: r.failed,
			From: r.st.From},
	})
}

// claimStaleness is η as the claim measures it, against the serving
// version: the trainer is Ahead steps past that, and would drop what the
// claim let through beyond η − Ahead, leaving a step on a sliver of its
// batch.
func (r *trainingRun) claimStaleness() int {
	if r.p.MaxStaleness < 0 {
		return r.p.MaxStaleness
	}
	return max(r.p.MaxStaleness-r.st.Ahead, 0)
}

func (r *trainingRun) drain() {
	for r.nowCh.ReceiveAsync(nil) {
		r.trainNow = true
	}
	var sc flow.ServingChanged
	for r.servingCh.ReceiveAsync(&sc) {
		r.changedTo = sc.Version
	}
}

// servingChanged handles a serving version set from outside the loop (a
// watchdog rollback): candidates trained on the abandoned line are not
// released, and the trainer goes on from the new serving weights.
func (r *trainingRun) servingChanged(ctx workflow.Context) error {
	if r.changedTo == "" {
		return nil
	}
	r.st.Serving, r.changedTo, r.st.From = r.changedTo, "", ""
	r.pending, r.pendingAhead, r.pendingReason = "", 0, ""
	return r.reset(ctx)
}

// wait blocks until a train-now signal, the end of the release in flight,
// or d (0: no timer) — whichever comes first.
func (r *trainingRun) wait(ctx workflow.Context, d time.Duration) {
	r.waitFor(ctx, d, true)
}

// waitOut is wait that a train-now signal does not end (it is kept for
// the next claim): the wait after a failed step.
func (r *trainingRun) waitOut(ctx workflow.Context, d time.Duration) {
	r.waitFor(ctx, d, false)
}

func (r *trainingRun) waitFor(ctx workflow.Context, d time.Duration, onNow bool) {
	sel := workflow.NewSelector(ctx)
	if d > 0 {
		sel.AddFuture(workflow.NewTimer(ctx, d), func(workflow.Future) {})
	}
	if onNow {
		sel.AddReceive(r.nowCh, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			r.trainNow = true
		})
	}
	sel.AddReceive(r.servingCh, func(c workflow.ReceiveChannel, _ bool) {
		var sc flow.ServingChanged
		c.Receive(ctx, &sc)
		r.changedTo = sc.Version
	})
	if r.rel != nil && !r.relDone {
		sel.AddFuture(r.rel, func(workflow.Future) { r.relDone = true })
	}
	sel.Select(ctx)
}

// settleRelease handles a release that ended and starts the next one.
func (r *trainingRun) settleRelease(ctx workflow.Context) error {
	if r.rel != nil && (r.relDone || r.rel.IsReady()) {
		var res flow.ReleaseResult
		err := r.rel.Get(ctx, &res)
		r.rel, r.relDone = nil, false
		r.st.Releasing = ""
		promoted := err == nil && res.State.Status == flow.ReleasePromoted
		switch {
		case err != nil:
			r.st.LastOutcome = "release failed: " + err.Error()
		default:
			r.st.LastOutcome = res.State.Status
		}
		if promoted {
			r.st.Promoted++
			r.st.Serving, r.st.From = r.relCand, ""
			// A reset since the release began (a watchdog rollback) already
			// counted the trainer from the serving weights.
			r.st.Ahead = max(r.st.Ahead-r.relAhead, 0)
			if r.pending != "" {
				r.pendingAhead -= r.relAhead
			}
		} else {
			r.st.RolledBack++
			failed := failedGate(res.State)
			// Candidates trained on from the rejected one are judged on
			// their own, unless it was shown to regress: then its line is
			// dropped. With nothing left to release and the trainer too far
			// ahead to use new samples, it must go back anyway.
			stuck := r.pending == "" && r.st.Ahead >= r.p.MaxAhead
			abandon := failed.Gate == flow.GateSafety || failed.Gate == flow.GateRegression
			if workflow.GetVersion(ctx, trainingChangeRegressedOnly, workflow.DefaultVersion, 1) >= 1 {
				// A candidate not shown good enough on the held-out suite
				// may be in a dip on the way up; only one shown worse than
				// allowed ends its line.
				abandon = failed.Regressed
			}
			if abandon || stuck {
				if err := r.reset(ctx); err != nil {
					return err
				}
				if workflow.GetVersion(ctx, trainingChangeBackToAnchor, workflow.DefaultVersion, 1) >= 1 {
					r.backToAnchor(res.State)
				}
			}
		}
	}
	if r.rel == nil && r.pending != "" {
		r.startRelease(ctx)
	}
	return nil
}

// step trains one claimed run through the trainer protocol: the control
// plane writes the batch, the deployment's trainer trains it, the control
// plane records the checkpoint.
func (r *trainingRun) step(ctx workflow.Context, runID int64) (flow.TrainStepOutput, error) {
	var tb flow.TrainBatchInput
	err := workflow.ExecuteLocalActivity(r.light, aTraining.PrepareBatch, flow.PrepareBatchInput{
		Deployment: r.in.Deployment, RunID: runID, Base: r.base(),
		Algorithm: flow.TrainAlgorithm{Objective: "grpo", MaxStaleness: r.p.MaxStaleness, Masks: r.p.Masks},
	}).Get(ctx, &tb)
	if err != nil {
		err = fmt.Errorf("prepare batch: %w", err)
		if workflow.GetVersion(ctx, trainingChangeFailEveryStep, workflow.DefaultVersion, 1) >= 1 {
			r.failRun(ctx, runID, err)
		}
		return flow.TrainStepOutput{}, err
	}
	var trained flow.TrainBatchOutput
	train, queue := r.train, r.p.TrainerQueue
	if tb.TaskQueue != "" {
		// The deployment names its trainer: the step goes to its queue
		// however the loop was started.
		train, queue = workflow.WithTaskQueue(r.train, tb.TaskQueue), tb.TaskQueue
	}
	if err := workflow.ExecuteActivity(train, flow.TrainBatchActivity, tb).Get(ctx, &trained); err != nil {
		var te *temporal.TimeoutError
		if errors.As(err, &te) && te.TimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START {
			err = fmt.Errorf("no worker took the train step on task queue %q within %s: start a worker that serves this deployment's trainer: %w",
				queue, r.p.StepStartTimeout, err)
		}
		// The run's samples go back to the queue; the loop waits and
		// claims again.
		r.failRun(ctx, runID, err)
		return flow.TrainStepOutput{}, err
	}
	var out flow.TrainStepOutput
	err = workflow.ExecuteLocalActivity(r.light, aTraining.RegisterCheckpoint, flow.RegisterCheckpointInput{
		Deployment: r.in.Deployment, RunID: runID, Trained: trained,
	}).Get(ctx, &out)
	if err != nil {
		err = fmt.Errorf("register checkpoint: %w", err)
		if workflow.GetVersion(ctx, trainingChangeFailEveryStep, workflow.DefaultVersion, 1) >= 1 {
			// Its checkpoint is left unregistered; the samples train again.
			r.failRun(ctx, runID, err)
		}
		return flow.TrainStepOutput{}, err
	}
	return out, nil
}

// failRun closes a run whose step failed, so it does not stay claimed and
// its samples go back to the queue.
func (r *trainingRun) failRun(ctx workflow.Context, runID int64, cause error) {
	if err := workflow.ExecuteLocalActivity(r.light, aTraining.FailTrainingRun, flow.FailTrainingRunInput{RunID: runID, Reason: cause.Error()}).Get(ctx, nil); err != nil {
		workflow.GetLogger(ctx).Error("fail training run", "run_id", runID, "error", err)
	}
}

// base is the version the next step trains on from: the newest candidate
// while the loop is ahead of where its line began, else the line's start
// (the anchor it went back to, or the serving version).
func (r *trainingRun) base() string {
	if r.st.Ahead > 0 && r.st.LastVersion != "" {
		return r.st.LastVersion
	}
	if r.st.From != "" {
		return r.st.From
	}
	return r.st.Serving
}

// backToAnchor starts the line the trainer was just sent back on from the
// anchor a failed release's suite gates named, when that is not the
// serving version. The anchor is the best promoted version on the
// held-out suite, and every candidate is judged against it: a line from a
// serving version below it must first climb back to it, while its alpha
// shrinks with each look, and can stall there (one demo run refused 13
// candidates in a row, each 4 steps past a serving version below the
// anchor). Samples still come from the serving version; the anchor was
// promoted earlier on the same traffic, and the masks (IcePop) bound what
// the difference between the two costs.
func (r *trainingRun) backToAnchor(s flow.ReleaseState) {
	for _, g := range s.Gates {
		if g.Anchor != "" && g.Anchor != r.st.Serving {
			r.st.From = g.Anchor
			return
		}
	}
}

// reset sends the trainer back to the serving version's weights.
func (r *trainingRun) reset(ctx workflow.Context) error {
	if r.st.Serving == "" {
		return nil
	}
	r.st.From = ""
	if workflow.GetVersion(ctx, trainingChangeProtocol, workflow.DefaultVersion, 1) >= 1 {
		// Each step names its base (step), so going back is the loop's
		// own state: the next step trains on from the serving version.
		r.st.Resets++
		r.st.Ahead, r.pending, r.pendingAhead = 0, "", 0
		return nil
	}
	var out flow.ResetTrainerOutput
	// Replayed only (see legacyResetTrainerActivity).
	err := workflow.ExecuteActivity(r.train, legacyResetTrainerActivity, flow.ResetTrainerInput{Deployment: r.in.Deployment, Version: r.st.Serving}).Get(ctx, &out)
	if err != nil {
		// Training on from the rejected line is still safe (every candidate
		// is gated); record why it could not go back.
		r.st.LastError = "reset trainer: " + err.Error()
		workflow.GetLogger(ctx).Error("reset trainer failed", "deployment", r.in.Deployment, "version", r.st.Serving, "error", err)
		return nil
	}
	r.st.Resets++
	r.st.Ahead, r.pending, r.pendingAhead = 0, "", 0
	return nil
}

func (r *trainingRun) startRelease(ctx workflow.Context) {
	r.relCand, r.relAhead = r.pending, r.pendingAhead
	reason := r.pendingReason
	r.pending, r.pendingAhead, r.pendingReason = "", 0, ""
	r.st.Phase = "releasing"
	r.st.Releasing = r.relCand
	r.st.LastRelease = flow.ReleaseWorkflowID(r.in.Deployment, artefact.LayerWeights, r.relCand)
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:        r.st.LastRelease,
		ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
	})
	r.rel = workflow.ExecuteChildWorkflow(cctx, ReleaseWorkflow, flow.ReleaseInput{
		// The baseline is read when the release begins: whatever serves then.
		Deployment: r.in.Deployment, Layer: artefact.LayerWeights, Candidate: r.relCand,
		Policy: r.p.Release, Reason: reason,
	})
}

// failedGate is the gate that failed a release (zero if none did).
func failedGate(s flow.ReleaseState) flow.GateResult {
	for _, g := range s.Gates {
		if !g.Passed && !g.Insufficient {
			return g
		}
	}
	return flow.GateResult{}
}

// failedStepWait is the wait after the n-th failed step in a row: the poll
// interval, doubling each time up to five minutes (or the poll interval,
// if longer).
func failedStepWait(poll time.Duration, n int) time.Duration {
	limit := max(5*time.Minute, poll)
	d := poll
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// trainingChangeBackoff: a failed step is followed by a wait before the
// next claim.
const trainingChangeBackoff = "training-wait-after-failed-step"

// trainingChangeFailedWaitHolds: train-now no longer ends the wait after a
// failed step.
const trainingChangeFailedWaitHolds = "training-failed-wait-ignores-train-now"

// trainingChangeRegressedOnly: a release failed on the held-out suite
// without being shown worse no longer sends the trainer back.
const trainingChangeRegressedOnly = "training-reset-regressed-only"

// trainingChangeBackToAnchor: a failed release that sends the trainer back
// sends it to the anchor its suite gates named, when that is not the
// serving version.
const trainingChangeBackToAnchor = "training-back-to-anchor"

// trainingChangeFailEveryStep: a step that fails in PrepareBatch or
// RegisterCheckpoint (their retries spent) fails its run too, as a failed
// TrainBatch did; the run stayed claimed for ever.
const trainingChangeFailEveryStep = "training-fail-run-of-every-failed-step"

// trainingChangeProtocol: a step is PrepareBatch, TrainBatch on the
// trainer queue and RegisterCheckpoint (the trainer protocol), and a reset
// moves the next step's base instead of calling ResetTrainer.
const trainingChangeProtocol = "training-trainer-protocol"

// The activities a training step and a reset were before
// trainingChangeProtocol, as histories recorded then name them. Workflows
// still replay those branches, so they schedule them by these names; no
// worker registers them (the trainer that held weights inside a worker is
// gone), so such a run's next step waits for one until StepStartTimeout.
const (
	legacyTrainStepActivity    = "TrainStep"
	legacyResetTrainerActivity = "ResetTrainer"
)
