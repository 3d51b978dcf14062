package workflows

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
)

// trainingActs scripts the queue and the trainer protocol; the real
// activities are tested on Postgres and the in-process trainer in package
// activities.
type trainingActs struct {
	queued    []flow.CheckBatchOutput // one per check (last repeats)
	claims    []flow.ClaimBatchInput
	serving   string // serving before any promotion (default dep@v1)
	trains    int
	trained   int  // successful steps
	failTrain int  // first attempts that fail
	refuse    bool // every step fails at once, as on a worker for another deployment
	// failPrepare and failRegister: every PrepareBatch or
	// RegisterCheckpoint fails (Postgres gone for longer than its retries).
	failPrepare, failRegister bool
	// resets are the bases of steps that did not go on from the previous
	// step's weights (the trainer sent back).
	resets  []string
	last    string // the newest trained version
	failed  []int64
	release *releaseActs
	// kept are the versions each prune pass kept, pruned the versions
	// whose states it marked gone.
	kept   [][]string
	pruned []string
}

func newTrainingEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *trainingActs) {
	env, rel := newReleaseEnv(t)
	env.RegisterWorkflowWithOptions(TrainingWorkflow, workflowRegisterOptions(flow.TrainingWorkflowName))
	a := &trainingActs{release: rel, serving: "dep@v1", last: "dep@v1"}
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.CheckBatchInput) (flow.CheckBatchOutput, error) {
		q := a.queued[0]
		if len(a.queued) > 1 {
			a.queued = a.queued[1:]
		}
		return q, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTraining.CheckBatch)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.ClaimBatchInput) (flow.ClaimBatchOutput, error) {
		a.claims = append(a.claims, in)
		serving := a.serving
		for _, f := range a.release.finished {
			if f.Status == flow.ReleasePromoted {
				serving = f.Candidate
			}
		}
		return flow.ClaimBatchOutput{RunID: int64(len(a.claims)), Samples: in.BatchSize, BaseVersion: serving}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTraining.ClaimBatch)})
	// Each run reserves its own version: run N makes v(N+1).
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.PrepareBatchInput) (flow.TrainBatchInput, error) {
		if a.failPrepare {
			return flow.TrainBatchInput{}, errors.New("connect: connection refused")
		}
		if in.Base != a.last {
			a.resets = append(a.resets, in.Base)
		}
		return flow.TrainBatchInput{Protocol: flow.TrainerProtocol, Deployment: in.Deployment, RunID: in.RunID,
			Base: flow.CheckpointRef{Version: in.Base}, Output: flow.OutputRef{Version: fmt.Sprintf("dep@v%d", in.RunID+1)}, Algo: in.Algorithm}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTraining.PrepareBatch)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.TrainBatchInput) (flow.TrainBatchOutput, error) {
		a.trains++
		if a.refuse {
			return flow.TrainBatchOutput{}, temporal.NewNonRetryableApplicationError("this worker trains \"other\", not \"dep\"", "WrongDeployment", nil)
		}
		if a.trains <= a.failTrain {
			return flow.TrainBatchOutput{}, errors.New("trainer worker lost")
		}
		return flow.TrainBatchOutput{Version: in.Output.Version, Loss: 0.5, Samples: 2}, nil
	}, activity.RegisterOptions{Name: flow.TrainBatchActivity})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.RegisterCheckpointInput) (flow.TrainStepOutput, error) {
		if a.failRegister {
			return flow.TrainStepOutput{}, errors.New("connect: connection refused")
		}
		a.trained++
		a.last = in.Trained.Version
		return flow.TrainStepOutput{Version: in.Trained.Version, Loss: in.Trained.Loss, Samples: in.Trained.Samples}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTraining.RegisterCheckpoint)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.FailTrainingRunInput) error {
		a.failed = append(a.failed, in.RunID)
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTraining.FailTrainingRun)})
	// Every version but the ones kept is prunable, its directory /d/<id>.
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.PrunableStatesInput) (flow.PrunableStatesOutput, error) {
		a.kept = append(a.kept, in.Keep)
		out := flow.PrunableStatesOutput{Versions: map[string]string{}, Trainer: &deployment.Trainer{Kind: deployment.TrainerTinker}}
		for n := 1; n <= a.trained+1; n++ {
			if v := fmt.Sprintf("dep@v%d", n); !slices.Contains(in.Keep, v) && !slices.Contains(a.pruned, v) {
				out.Versions[v] = "/d/" + v
			}
		}
		return out, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTraining.PrunableStates)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.PruneStatesInput) (flow.PruneStatesOutput, error) {
		var out flow.PruneStatesOutput
		for v := range in.Versions {
			out.Pruned = append(out.Pruned, v)
		}
		return out, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTinker.PruneStates)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.MarkStatesPrunedInput) error {
		a.pruned = append(a.pruned, in.Versions...)
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aTraining.MarkStatesPruned)})
	return env, a
}

func TestTrainingTrainsAFullBatchAndReleasesIt(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 1}, {Queued: 2}}
	acts.failTrain = 1 // the step is retried on another worker
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, PollInterval: time.Minute, MaxBatchAge: time.Hour, StepsPerRun: 1, Release: testPolicy}})
	var can *flow.TrainingInput
	err := env.GetWorkflowError()
	next := continueAsNewTraining(t, err)
	can = &next
	require.Equal(t, 1, can.Carry.Steps)
	require.Equal(t, "dep@v2", can.Carry.LastVersion)
	require.Len(t, acts.claims, 1)
	require.Equal(t, 4, acts.claims[0].MaxStaleness, "η defaults to 4")
	require.Equal(t, 2, acts.trains)
	require.Len(t, acts.release.finished, 1, "the candidate went through a ReleaseWorkflow")
	require.Equal(t, "dep@v2", acts.release.finished[0].Candidate)
	require.Equal(t, flow.ReleasePromoted, acts.release.finished[0].Status)
}

func TestTrainingTrainsAnOldSmallBatchOrOnSignal(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 1, OldestAge: time.Minute}}
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(flow.TrainNowSignal, nil) }, 5*time.Minute)
	start := env.Now()
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 10, PollInterval: time.Hour, MaxBatchAge: 24 * time.Hour, StepsPerRun: 1, NoRelease: true}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, 1, next.Carry.Steps)
	require.Less(t, env.Now().Sub(start), time.Hour, "train-now cuts the wait short")
	require.Empty(t, acts.release.finished)

	env, acts = newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 1, OldestAge: 2 * time.Hour}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 10, MaxBatchAge: time.Hour, StepsPerRun: 1, NoRelease: true}})
	next = continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, 1, next.Carry.Steps, "a batch older than MaxBatchAge trains although it is small")
}

func TestTrainingSurvivesAFailedStep(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 5}}
	acts.failTrain = 5 // every attempt of the first step fails
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, StepsPerRun: 2, NoRelease: true}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, 1, next.Carry.Steps, "the loop goes on after a failed step")
	require.Len(t, acts.claims, 2)
	require.NotEqual(t, acts.claims[0].RunKey, acts.claims[1].RunKey)
}

// TestTrainingFailsTheRunOfEveryFailedStep: a step whose PrepareBatch or
// RegisterCheckpoint failed for good left its run claimed for ever (only a
// failed TrainBatch closed it); the run is failed, so nothing stays
// claimed and its samples go back to the queue.
func TestTrainingFailsTheRunOfEveryFailedStep(t *testing.T) {
	for _, failRegister := range []bool{false, true} {
		env, acts := newTrainingEnv(t)
		acts.queued = []flow.CheckBatchOutput{{Queued: 5}}
		acts.failPrepare, acts.failRegister = !failRegister, failRegister
		env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
			BatchSize: 2, StepsPerRun: 2, NoRelease: true}})
		next := continueAsNewTraining(t, env.GetWorkflowError())
		require.Zero(t, next.Carry.Steps)
		require.Len(t, acts.claims, 2)
		require.Equal(t, []int64{1, 2}, acts.failed, "register fails: %v; every claimed run is closed", failRegister)
	}
}

// TestTrainingWaitsWhenNoWorkerCanTrain: a step refused at once (no
// trainer for this deployment) is not followed by the next claim at once,
// or the loop would claim and fail batches as fast as it can; it waits,
// longer each time, and says why.
func TestTrainingWaitsWhenNoWorkerCanTrain(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 5}}
	acts.refuse = true
	start := env.Now()
	// An evolution decision asks for a step every few seconds; that must
	// not end the wait.
	for i := 1; i <= 100; i++ {
		env.RegisterDelayedCallback(func() { env.SignalWorkflow(flow.TrainNowSignal, nil) }, time.Duration(i)*3*time.Second)
	}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, PollInterval: 10 * time.Second, StepsPerRun: 4, NoRelease: true}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	require.Zero(t, next.Carry.Steps)
	require.Len(t, acts.claims, 4)
	require.Equal(t, 4, acts.trains, "a refused step is not retried")
	require.GreaterOrEqual(t, env.Now().Sub(start), (10+20+40+80)*time.Second, "each failure waits twice as long, train-now or not")
	require.Equal(t, 4, next.Carry.Failed, "the next run goes on waiting longer")

	// The next run starts where this one left off: its first failure
	// waits 160 s, not 10.
	env, acts = newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 5}}
	acts.refuse = true
	start = env.Now()
	env.ExecuteWorkflow(TrainingWorkflow, next)
	next = continueAsNewTraining(t, env.GetWorkflowError())
	require.GreaterOrEqual(t, env.Now().Sub(start), (160+300+300+300)*time.Second)
	require.Equal(t, 8, next.Carry.Failed)
}

func TestFailedStepWait(t *testing.T) {
	require.Equal(t, 30*time.Second, failedStepWait(30*time.Second, 1))
	require.Equal(t, 2*time.Minute, failedStepWait(30*time.Second, 3))
	require.Equal(t, 5*time.Minute, failedStepWait(30*time.Second, 40))
	require.Equal(t, time.Hour, failedStepWait(time.Hour, 3), "never shorter than the poll interval")
}

func continueAsNewTraining(t *testing.T, err error) flow.TrainingInput {
	t.Helper()
	var next flow.TrainingInput
	decodeContinueAsNew(t, err, &next)
	return next
}

func releasedCandidates(acts *trainingActs) (out []string) {
	for _, f := range acts.release.finished {
		out = append(out, f.Candidate+" "+f.Status)
	}
	return out
}

func TestTrainingGoesOnWhileAReleaseRunsAndReleasesTheNewest(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	// v2 is released at once; v3 and v4 train during its gates (3 ahead of
	// v1 is the bound), so v4 goes next and v3 is never released on its
	// own; v5 trains during v4's release.
	require.Equal(t, []string{"dep@v2 promoted", "dep@v4 promoted", "dep@v5 promoted"}, releasedCandidates(acts))
	require.Equal(t, 4, next.Carry.Steps)
	require.Equal(t, "dep@v5", next.Carry.Serving)
	require.Equal(t, 0, next.Carry.Ahead)
	require.Empty(t, next.Carry.Pending)
	require.Empty(t, acts.resets)
	// Before it continued, the run named the versions it holds, and what
	// the store called prunable (here every other version) was pruned and
	// marked.
	require.Equal(t, [][]string{{"dep@v5"}}, acts.kept)
	require.ElementsMatch(t, []string{"dep@v1", "dep@v2", "dep@v3", "dep@v4"}, acts.pruned)
}

func TestTrainingGoesBackToServingWeightsWhenSafetyFails(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[flow.GateSafety] = []flow.GateResult{{Passed: false, Regressed: true, Reason: "refusals dropped"}, {Passed: true}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	// v3 and v4 descend from the unsafe v2: dropped with it.
	require.Equal(t, []string{"dep@v2 rolled_back", "dep@v5 promoted"}, releasedCandidates(acts))
	require.Equal(t, []string{"dep@v1"}, acts.resets)
	require.Equal(t, "dep@v5", next.Carry.Serving)
}

// TestTrainingTrainsOnPastAnUnprovenCandidate: a candidate the held-out
// suite could not show good enough (not shown worse) may be in a dip on
// the way up, so its line trains on; one shown worse is dropped.
func TestTrainingTrainsOnPastAnUnprovenCandidate(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[flow.GateRegression] = []flow.GateResult{{Passed: false, Reason: "not shown within the budget"}, {Passed: true}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []string{"dep@v2 rolled_back", "dep@v4 promoted", "dep@v5 promoted"}, releasedCandidates(acts))
	require.Empty(t, acts.resets)

	env, acts = newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[flow.GateRegression] = []flow.GateResult{{Passed: false, Regressed: true, Reason: "shown beyond the budget"}, {Passed: true}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []string{"dep@v1"}, acts.resets)
}

// TestTrainingGoesBackToTheAnchor: a failed release that sends the
// trainer back sends it to the anchor its suite gates named (the best
// promoted version on the held-out suite), not to a serving version below
// it; once a candidate of that line is promoted, the line goes on from
// serving again.
func TestTrainingGoesBackToTheAnchor(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[flow.GateRegression] = []flow.GateResult{
		{Passed: false, Regressed: true, Anchor: "dep@v0", Reason: "shown beyond the budget"},
		{Passed: true, Anchor: "dep@v0"}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	// v3 and v4 descend from the regressed v2: dropped with it; v5 trains
	// from the anchor v0 and is promoted.
	require.Equal(t, []string{"dep@v2 rolled_back", "dep@v5 promoted"}, releasedCandidates(acts))
	require.Equal(t, []string{"dep@v0"}, acts.resets)
	require.Equal(t, "dep@v5", next.Carry.Serving)
	require.Empty(t, next.Carry.From)

	// The anchor is the serving version: back to serving, as before.
	env, acts = newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[flow.GateRegression] = []flow.GateResult{
		{Passed: false, Regressed: true, Anchor: "dep@v1", Reason: "shown beyond the budget"},
		{Passed: true, Anchor: "dep@v1"}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []string{"dep@v1"}, acts.resets)

	// A line from the anchor whose run ends before a release: the next run
	// trains on from the anchor's line.
	env, acts = newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[flow.GateRegression] = []flow.GateResult{
		{Passed: false, Regressed: true, Anchor: "dep@v0", Reason: "shown beyond the budget"}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 1, Release: testPolicy}})
	next = continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, "dep@v0", next.Carry.From)
	require.Equal(t, "dep@v1", next.Carry.Serving)
}

// TestTrainingFollowsAWatchdogRollback: the watchdog moved serving back to
// the anchor; the loop drops the candidates of the abandoned line and
// trains on from the anchor's weights.
func TestTrainingFollowsAWatchdogRollback(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 0}, {Queued: 0}, {Queued: 2}}
	env.RegisterDelayedCallback(func() {
		acts.serving = "dep@v0"
		env.SignalWorkflow(flow.ServingChangedSignal, flow.ServingChanged{Version: "dep@v0", Reason: "watchdog"})
	}, time.Second)
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, PollInterval: time.Minute, StepsPerRun: 1, NoRelease: true}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []string{"dep@v0"}, acts.resets)
}

func TestTrainingOneCandidateAtATimeWhenMaxAheadIsNegative(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []flow.CheckBatchOutput{{Queued: 10}}
	env.ExecuteWorkflow(TrainingWorkflow, flow.TrainingInput{Deployment: "dep", Policy: flow.TrainingPolicy{
		BatchSize: 2, StepsPerRun: 3, MaxAhead: -1, Release: testPolicy}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []string{"dep@v2 promoted", "dep@v3 promoted", "dep@v4 promoted"}, releasedCandidates(acts))
}
