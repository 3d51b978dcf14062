package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
)

// releaseActs scripts gate verdicts; the real gates are tested against
// Postgres in package activities.
type releaseActs struct {
	env      *testsuite.TestWorkflowEnvironment
	verdicts map[string][]flow.GateResult // per gate, one per evaluation (last repeats)
	calls    map[string]int
	phases   []flow.SetPhaseInput
	finished []flow.FinishReleaseInput
	failOnce map[string]bool
	at       map[string][]time.Time
	// synced plays a deployment with weight sync; syncs are the calls,
	// syncFail makes the first (the candidate's load) fail for good.
	synced   bool
	syncFail bool
	syncs    []flow.SyncWeightsInput
	syncAt   []time.Time
	// finishedAt is when the release was recorded as ended.
	finishedAt time.Time
}

func newReleaseEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *releaseActs) {
	var ts testsuite.WorkflowTestSuite
	env := newWorkflowEnv(&ts)
	env.RegisterWorkflowWithOptions(ReleaseWorkflow, workflow.RegisterOptions{Name: flow.ReleaseWorkflowName})
	a := &releaseActs{env: env, verdicts: map[string][]flow.GateResult{}, calls: map[string]int{}, failOnce: map[string]bool{}, at: map[string][]time.Time{}}
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.ReleaseInput) (flow.BeginReleaseOutput, error) {
		return flow.BeginReleaseOutput{ReleaseID: 42, Baseline: "dep@v1"}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aRelease.BeginRelease)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SetPhaseInput) error {
		a.phases = append(a.phases, in)
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aRelease.SetReleasePhase)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.GateInput) (flow.GateResult, error) {
		if in.SetPhase && (len(a.phases) == 0 || a.phases[len(a.phases)-1].Phase != in.Gate) {
			// The activity records the phase itself (a retry: once).
			a.phases = append(a.phases, flow.SetPhaseInput{ReleaseID: in.ReleaseID, Phase: in.Gate})
		}
		a.calls[in.Gate]++
		a.at[in.Gate] = append(a.at[in.Gate], env.Now())
		if a.failOnce[in.Gate] {
			a.failOnce[in.Gate] = false
			return flow.GateResult{}, errors.New("evaluator unreachable")
		}
		if in.Baseline != "dep@v1" {
			return flow.GateResult{}, errors.New("baseline not resolved")
		}
		vs := a.verdicts[in.Gate]
		if len(vs) == 0 {
			return flow.GateResult{Gate: in.Gate, Passed: true}, nil
		}
		v := vs[0]
		if len(vs) > 1 {
			a.verdicts[in.Gate] = vs[1:]
		}
		v.Gate = in.Gate
		return v, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aRelease.EvaluateGate)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.FinishReleaseInput) error {
		a.finished, a.finishedAt = append(a.finished, in), env.Now()
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aRelease.FinishRelease)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SyncWeightsInput) (flow.SyncWeightsOutput, error) {
		a.syncs = append(a.syncs, in)
		a.syncAt = append(a.syncAt, env.Now())
		if a.syncFail && len(a.syncs) == 1 {
			return flow.SyncWeightsOutput{Synced: true}, temporal.NewNonRetryableApplicationError("engine answered 404: adapter path has no adapter_config.json", "WeightSync", nil)
		}
		return flow.SyncWeightsOutput{Synced: a.synced}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aRelease.SyncWeights)})
	return env, a
}

var testPolicy = deployment.ReleasePolicy{ShadowDuration: time.Minute, CanaryDuration: 10 * time.Minute, CanaryChecks: 5, CanaryShare: 0.2}

func releaseResult(t *testing.T, env *testsuite.TestWorkflowEnvironment) flow.ReleaseResult {
	t.Helper()
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var res flow.ReleaseResult
	require.NoError(t, env.GetWorkflowResult(&res))
	return res
}

func TestReleasePromotesWhenEveryGatePasses(t *testing.T) {
	env, acts := newReleaseEnv(t)
	acts.failOnce[flow.GateReplay] = true // a retried activity, not a failed gate
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: testPolicy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleasePromoted, res.State.Status)
	require.Equal(t, 2, acts.calls[flow.GateReplay])
	require.Equal(t, 5, acts.calls[flow.GateCanary])
	require.Len(t, acts.finished, 1)
	require.Equal(t, flow.FinishReleaseInput{ReleaseID: 42, Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2",
		Baseline: "dep@v1", Status: flow.ReleasePromoted, Reason: "every gate passed"}, acts.finished[0])
	var names []string
	for _, p := range acts.phases {
		names = append(names, p.Phase)
	}
	require.Equal(t, []string{flow.GateShadow, flow.GateReplay, flow.GateRegression, flow.GateSafety, flow.GateCanary}, names)
	require.Equal(t, 0.2, acts.phases[4].CanaryShare)
	require.Zero(t, acts.phases[0].CanaryShare, "users see the baseline during shadow")
}

func TestReleaseRollsBackOnSafetyDrop(t *testing.T) {
	env, acts := newReleaseEnv(t)
	acts.verdicts[flow.GateSafety] = []flow.GateResult{{Passed: false, Reason: "refusal rate fell", Metrics: map[string]float64{"candidate_pass_rate": 0.5}}}
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: testPolicy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleaseRolledBack, res.State.Status)
	require.Contains(t, res.State.Reason, "safety gate failed")
	require.Zero(t, acts.calls[flow.GateCanary], "no live traffic reaches a candidate that failed offline")
	require.Equal(t, flow.ReleaseRolledBack, acts.finished[0].Status)
}

func TestReleaseCanaryRollsBackAtTheFirstClearLoss(t *testing.T) {
	env, acts := newReleaseEnv(t)
	acts.verdicts[flow.GateCanary] = []flow.GateResult{
		{Passed: false, Insufficient: true, Reason: "3 rewarded; 20 needed"},
		{Passed: false, Reason: "mean reward: candidate 0.1 vs baseline 0.8"},
	}
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: testPolicy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleaseRolledBack, res.State.Status)
	require.Contains(t, res.State.Reason, "canary gate failed")
	require.Equal(t, 2, acts.calls[flow.GateCanary], "the loss is acted on at once, not at the end of the canary")
	require.Len(t, res.State.Gates, 5, "an insufficient interim check is not a recorded verdict")
}

func TestReleaseCanaryWithoutEnoughDataRollsBack(t *testing.T) {
	env, acts := newReleaseEnv(t)
	acts.verdicts[flow.GateCanary] = []flow.GateResult{{Passed: false, Insufficient: true, Reason: "0 rewarded"}}
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: testPolicy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleaseRolledBack, res.State.Status)
	require.Equal(t, 10, acts.calls[flow.GateCanary], "5 planned checks, then as many more while it waits for traffic (MaxTrafficWait: the canary's own duration)")
}

// TestReleaseWaitsForTraffic: a shadow or canary window that saw too little
// traffic waits for more instead of failing at once, and passes once the
// traffic came.
func TestReleaseWaitsForTraffic(t *testing.T) {
	env, acts := newReleaseEnv(t)
	acts.verdicts[flow.GateShadow] = []flow.GateResult{{Insufficient: true, NotEvaluated: true, Reason: "no live traffic"}, {Insufficient: true, NotEvaluated: true}, {Passed: true}}
	acts.verdicts[flow.GateCanary] = []flow.GateResult{{Insufficient: true}, {Insufficient: true}, {Insufficient: true}, {Insufficient: true}, {Insufficient: true}, {Passed: true}}
	policy := testPolicy
	policy.MaxTrafficWait = 5 * time.Minute
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: policy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleasePromoted, res.State.Status, res.State.Reason)
	require.Equal(t, 3, acts.calls[flow.GateShadow])
	require.Equal(t, 6, acts.calls[flow.GateCanary])
	require.Len(t, res.State.Gates, 5, "waiting checks are not recorded verdicts")

	// A shadow that never sees traffic fails as not evaluated after the wait.
	env, acts = newReleaseEnv(t)
	acts.verdicts[flow.GateShadow] = []flow.GateResult{{Insufficient: true, NotEvaluated: true, Reason: "no live traffic"}}
	policy.MaxTrafficWait = 3 * time.Minute
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: policy})
	res = releaseResult(t, env)
	require.Equal(t, flow.ReleaseRolledBack, res.State.Status)
	require.Equal(t, 4, acts.calls[flow.GateShadow], "one check a shadow duration (1m) for 3m more")
}

func TestReleaseAbortSignalRollsBackAtOnce(t *testing.T) {
	env, acts := newReleaseEnv(t)
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(flow.ReleaseStateQuery)
		require.NoError(t, err)
		var st flow.ReleaseState
		require.NoError(t, v.Get(&st))
		require.Equal(t, flow.GateCanary, st.Phase)
		env.SignalWorkflow(flow.ReleaseAbortSignal, "users complain")
	}, 5*time.Minute)
	start := env.Now()
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: testPolicy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleaseAborted, res.State.Status)
	require.Equal(t, "aborted by operator: users complain", res.State.Reason)
	require.Less(t, env.Now().Sub(start), 6*time.Minute)
	require.Equal(t, flow.ReleaseAborted, acts.finished[0].Status)
}

func TestReleaseWaitsForApproval(t *testing.T) {
	p := testPolicy
	p.RequireApproval, p.ApprovalTimeout = true, time.Hour

	env, acts := newReleaseEnv(t)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(flow.ReleaseApproveSignal, "") }, 30*time.Minute)
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: p})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleasePromoted, res.State.Status)
	require.Contains(t, res.State.Reason, "approved by operator")
	require.Len(t, acts.finished, 1)

	env, _ = newReleaseEnv(t)
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: p})
	res = releaseResult(t, env)
	require.Equal(t, flow.ReleaseRolledBack, res.State.Status)
	require.Contains(t, res.State.Reason, "no approval")
}

// TestReleaseOfAnArtefactPassesTheLiveCanary: an artefact candidate serves
// the canary share of live traffic like weights do, and a canary loss
// rolls it back.
func TestReleaseOfAnArtefactPassesTheLiveCanary(t *testing.T) {
	env, acts := newReleaseEnv(t)
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerHarness, Candidate: "3", Policy: testPolicy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleasePromoted, res.State.Status)
	require.Equal(t, 1, acts.calls[flow.GateSafety])
	require.Equal(t, testPolicy.CanaryChecks, acts.calls[flow.GateCanary])
	var share float64
	for _, p := range acts.phases {
		if p.Phase == flow.GateCanary {
			share = p.CanaryShare
		}
	}
	require.Equal(t, testPolicy.CanaryShare, share)

	env, acts = newReleaseEnv(t)
	acts.verdicts[flow.GateCanary] = []flow.GateResult{{Passed: false, Regressed: true, Reason: "mean reward: worse"}}
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerPlaybook, Candidate: "4", Policy: testPolicy})
	res = releaseResult(t, env)
	require.Equal(t, flow.ReleaseRolledBack, res.State.Status)
	require.Contains(t, res.State.Reason, "canary gate failed")
}

func TestReleaseRejectsBadInput(t *testing.T) {
	env, _ := newReleaseEnv(t)
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: "kernel", Candidate: "x"})
	require.ErrorContains(t, env.GetWorkflowError(), "layer")
}

// TestWeightsReleaseSyncsTheEngine: a weights release loads its candidate
// into the serving engine before any gate asks for it, and after it ends
// it syncs again at once (an in-place engine takes the promoted weights),
// unloading what no route names and no release left within the drain. It
// does not sleep through the drain: the training loop waits for it.
func TestWeightsReleaseSyncsTheEngine(t *testing.T) {
	env, acts := newReleaseEnv(t)
	acts.synced = true
	p := testPolicy
	p.WeightDrain = 3 * time.Minute
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: p})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleasePromoted, res.State.Status)
	require.Equal(t, []flow.SyncWeightsInput{{Deployment: "dep", Candidate: "dep@v2"}, {Deployment: "dep", Unload: true, Drain: 3 * time.Minute}}, acts.syncs)
	require.False(t, acts.syncAt[0].After(acts.at[flow.GateShadow][0]), "the candidate is loaded before the first gate")
	require.Less(t, acts.syncAt[1].Sub(acts.finishedAt), time.Minute, "the release ends without waiting for the drain")

	// A deployment without weight sync: one call that finds nothing to do.
	env, acts = newReleaseEnv(t)
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: testPolicy})
	require.Equal(t, flow.ReleasePromoted, releaseResult(t, env).State.Status)
	require.Len(t, acts.syncs, 1)

	// Artefacts have no weights to sync.
	env, acts = newReleaseEnv(t)
	acts.synced = true
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerHarness, Candidate: "3", Policy: testPolicy})
	releaseResult(t, env)
	require.Empty(t, acts.syncs)
}

// TestWeightsReleaseFailsClosedWhenTheEngineRefuses: a candidate the engine
// will not load is never gated or routed; the release rolls back.
func TestWeightsReleaseFailsClosedWhenTheEngineRefuses(t *testing.T) {
	env, acts := newReleaseEnv(t)
	acts.synced, acts.syncFail = true, true
	env.ExecuteWorkflow(ReleaseWorkflow, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Policy: testPolicy})
	res := releaseResult(t, env)
	require.Equal(t, flow.ReleaseRolledBack, res.State.Status)
	require.Contains(t, res.State.Reason, "adapter_config.json")
	require.Empty(t, acts.calls, "no gate ran")
	require.Len(t, acts.finished, 1)
	require.Equal(t, flow.ReleaseRolledBack, acts.finished[0].Status)
	require.Len(t, acts.syncs, 1, "nothing was loaded, so nothing to settle")
}
