package workflows

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
)

// trainingActs scripts the queue and the trainer; the real activities are
// tested on Postgres and the in-process trainer in package activities.
type trainingActs struct {
	queued    []CheckBatchOutput // one per check (last repeats)
	claims    []ClaimBatchInput
	trains    int
	trained   int // successful steps: the Nth makes version N+1
	failTrain int // first attempts that fail
	resets    []ResetTrainerInput
	release   *releaseActs
}

func newTrainingEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *trainingActs) {
	env, rel := newReleaseEnv(t)
	env.RegisterWorkflowWithOptions(TrainingWorkflow, workflowRegisterOptions(TrainingWorkflowName))
	a := &trainingActs{release: rel}
	env.RegisterActivityWithOptions(func(ctx context.Context, in CheckBatchInput) (CheckBatchOutput, error) {
		q := a.queued[0]
		if len(a.queued) > 1 {
			a.queued = a.queued[1:]
		}
		return q, nil
	}, activity.RegisterOptions{Name: CheckBatchActivity})
	env.RegisterActivityWithOptions(func(ctx context.Context, in ClaimBatchInput) (ClaimBatchOutput, error) {
		a.claims = append(a.claims, in)
		return ClaimBatchOutput{RunID: int64(len(a.claims)), Samples: in.BatchSize, BaseVersion: "dep@v1"}, nil
	}, activity.RegisterOptions{Name: ClaimBatchActivity})
	env.RegisterActivityWithOptions(func(ctx context.Context, in TrainStepInput) (TrainStepOutput, error) {
		a.trains++
		if a.trains <= a.failTrain {
			return TrainStepOutput{}, errors.New("trainer worker lost")
		}
		a.trained++
		return TrainStepOutput{Version: fmt.Sprintf("dep@v%d", a.trained+1), Loss: 0.5, Samples: 2}, nil
	}, activity.RegisterOptions{Name: TrainStepActivity})
	env.RegisterActivityWithOptions(func(ctx context.Context, in ResetTrainerInput) (ResetTrainerOutput, error) {
		a.resets = append(a.resets, in)
		return ResetTrainerOutput{Version: in.Version}, nil
	}, activity.RegisterOptions{Name: ResetTrainerActivity})
	return env, a
}

func TestTrainingTrainsAFullBatchAndReleasesIt(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 1}, {Queued: 2}}
	acts.failTrain = 1 // the step is retried on another worker
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 2, PollInterval: time.Minute, MaxBatchAge: time.Hour, StepsPerRun: 1, Release: testPolicy}})
	var can *TrainingInput
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
	require.Equal(t, ReleasePromoted, acts.release.finished[0].Status)
}

func TestTrainingTrainsAnOldSmallBatchOrOnSignal(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 1, OldestAge: time.Minute}}
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(TrainNowSignal, nil) }, 5*time.Minute)
	start := env.Now()
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 10, PollInterval: time.Hour, MaxBatchAge: 24 * time.Hour, StepsPerRun: 1, NoRelease: true}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, 1, next.Carry.Steps)
	require.Less(t, env.Now().Sub(start), time.Hour, "train-now cuts the wait short")
	require.Empty(t, acts.release.finished)

	env, acts = newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 1, OldestAge: 2 * time.Hour}}
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 10, MaxBatchAge: time.Hour, StepsPerRun: 1, NoRelease: true}})
	next = continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, 1, next.Carry.Steps, "a batch older than MaxBatchAge trains although it is small")
}

func TestTrainingSurvivesAFailedStep(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 5}}
	acts.failTrain = 5 // every attempt of the first step fails
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 2, StepsPerRun: 2, NoRelease: true}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, 1, next.Carry.Steps, "the loop goes on after a failed step")
	require.Len(t, acts.claims, 2)
	require.NotEqual(t, acts.claims[0].RunKey, acts.claims[1].RunKey)
}

func continueAsNewTraining(t *testing.T, err error) TrainingInput {
	t.Helper()
	var next TrainingInput
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
	acts.queued = []CheckBatchOutput{{Queued: 10}}
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
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
}

func TestTrainingGoesBackToServingWeightsWhenSafetyFails(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[GateSafety] = []GateResult{{Passed: false, Regressed: true, Reason: "refusals dropped"}, {Passed: true}}
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	next := continueAsNewTraining(t, env.GetWorkflowError())
	// v3 and v4 descend from the unsafe v2: dropped with it.
	require.Equal(t, []string{"dep@v2 rolled_back", "dep@v5 promoted"}, releasedCandidates(acts))
	require.Equal(t, []ResetTrainerInput{{Deployment: "dep", Version: "dep@v1"}}, acts.resets)
	require.Equal(t, "dep@v5", next.Carry.Serving)
}

// TestTrainingTrainsOnPastAnUnprovenCandidate: a candidate the held-out
// suite could not show good enough (not shown worse) may be in a dip on
// the way up, so its line trains on; one shown worse is dropped.
func TestTrainingTrainsOnPastAnUnprovenCandidate(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[GateRegression] = []GateResult{{Passed: false, Reason: "not shown within the budget"}, {Passed: true}}
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []string{"dep@v2 rolled_back", "dep@v4 promoted", "dep@v5 promoted"}, releasedCandidates(acts))
	require.Empty(t, acts.resets)

	env, acts = newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 10}}
	acts.release.verdicts[GateRegression] = []GateResult{{Passed: false, Regressed: true, Reason: "shown beyond the budget"}, {Passed: true}}
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 2, MaxStaleness: 3, StepsPerRun: 4, Release: testPolicy}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []ResetTrainerInput{{Deployment: "dep", Version: "dep@v1"}}, acts.resets)
}

// TestTrainingFollowsAWatchdogRollback: the watchdog moved serving back to
// the anchor; the loop drops the candidates of the abandoned line and
// trains on from the anchor's weights.
func TestTrainingFollowsAWatchdogRollback(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 0}, {Queued: 0}, {Queued: 2}}
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(ServingChangedSignal, ServingChanged{Version: "dep@v0", Reason: "watchdog"})
	}, time.Second)
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 2, PollInterval: time.Minute, StepsPerRun: 1, NoRelease: true}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []ResetTrainerInput{{Deployment: "dep", Version: "dep@v0"}}, acts.resets)
}

func TestTrainingOneCandidateAtATimeWhenMaxAheadIsNegative(t *testing.T) {
	env, acts := newTrainingEnv(t)
	acts.queued = []CheckBatchOutput{{Queued: 10}}
	env.ExecuteWorkflow(TrainingWorkflow, TrainingInput{Deployment: "dep", Policy: TrainingPolicy{
		BatchSize: 2, StepsPerRun: 3, MaxAhead: -1, Release: testPolicy}})
	continueAsNewTraining(t, env.GetWorkflowError())
	require.Equal(t, []string{"dep@v2 promoted", "dep@v3 promoted", "dep@v4 promoted"}, releasedCandidates(acts))
}
