package workflows

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
)

type evolutionActs struct {
	evidence  evolution.Evidence
	recorded  []flow.RecordDecisionInput
	proposed  []flow.ProposeArtefactInput
	version   int
	trainings []flow.RequestTrainingInput
	rollbacks []flow.RollbackInput
	releases  []flow.DecisionReleaseInput
	release   *releaseActs
}

func newEvolutionEnv(t *testing.T, ev evolution.Evidence) (*testsuite.TestWorkflowEnvironment, *evolutionActs) {
	env, rel := newReleaseEnv(t)
	env.RegisterWorkflowWithOptions(EvolutionWorkflow, workflowRegisterOptions(flow.EvolutionWorkflowName))
	a := &evolutionActs{evidence: ev, version: 3, release: rel}
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.EvidenceInput) (evolution.Evidence, error) {
		return a.evidence, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aEvolution.ComputeEvidence)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.RecordDecisionInput) (int64, error) {
		a.recorded = append(a.recorded, in)
		return 11, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aEvolution.RecordDecision)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.ProposeArtefactInput) (flow.ProposeArtefactOutput, error) {
		a.proposed = append(a.proposed, in)
		if a.version == 0 {
			return flow.ProposeArtefactOutput{Reason: "no corrected answers"}, nil
		}
		return flow.ProposeArtefactOutput{Version: a.version, Items: 2}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aEvolution.ProposeArtefact)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.DecisionReleaseInput) error {
		a.releases = append(a.releases, in)
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aEvolution.RecordDecisionRelease)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.RequestTrainingInput) error {
		a.trainings = append(a.trainings, in)
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aEvolution.RequestTraining)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.RollbackInput) (string, error) {
		a.rollbacks = append(a.rollbacks, in)
		return "dep@v3", nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aEvolution.RollbackVersion)})
	return env, a
}

func evolutionResult(t *testing.T, env *testsuite.TestWorkflowEnvironment) flow.EvolutionResult {
	t.Helper()
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var res flow.EvolutionResult
	require.NoError(t, env.GetWorkflowResult(&res))
	return res
}

var base = evolution.Evidence{Deployment: "dep", Sessions: 100, PrevSamples: 100, RewardMean: 0.5, RewardPrev: 0.5}

func TestEvolutionMemoryDecisionReleasesAPlaybook(t *testing.T) {
	ev := base
	ev.CorrectionRate = 0.4
	env, acts := newEvolutionEnv(t, ev)
	env.ExecuteWorkflow(EvolutionWorkflow, flow.EvolutionInput{Deployment: "dep", Trigger: "manual", Release: testPolicy})
	res := evolutionResult(t, env)
	require.Equal(t, evolution.DecisionMemory, res.Decision.Kind)
	require.Equal(t, int64(11), res.DecisionID)
	require.Equal(t, ev, res.Evidence, "the evidence is in the workflow's result")
	require.Len(t, acts.recorded, 1)
	require.Equal(t, "manual", acts.recorded[0].Trigger)
	require.Equal(t, artefact.LayerPlaybook, acts.proposed[0].Kind)
	require.Equal(t, "release "+flow.ReleaseWorkflowID("dep", artefact.LayerPlaybook, "3"), res.Action)
	require.Equal(t, flow.ReleasePromoted, res.Release)
	require.Equal(t, artefact.LayerPlaybook, acts.release.finished[0].Layer)
	require.Equal(t, testPolicy.CanaryChecks, acts.release.calls[flow.GateCanary], "an artefact passes the live canary too")
	require.Equal(t, []flow.DecisionReleaseInput{{DecisionID: 11, Status: flow.ReleasePromoted}}, acts.releases, "the decision records how its release ended")
}

func TestEvolutionToolSchemaAndNothingToPropose(t *testing.T) {
	ev := base
	ev.ToolFailures = []evolution.ToolFailure{{Tool: "search", Calls: 10, Failures: 6, Rate: 0.6}}
	env, acts := newEvolutionEnv(t, ev)
	acts.version = 0
	env.ExecuteWorkflow(EvolutionWorkflow, flow.EvolutionInput{Deployment: "dep"})
	res := evolutionResult(t, env)
	require.Equal(t, evolution.DecisionToolSchema, res.Decision.Kind)
	require.Equal(t, "search", acts.proposed[0].Target)
	require.Equal(t, "nothing to propose: no corrected answers", res.Action)
	require.Empty(t, acts.release.finished)
}

func TestEvolutionWeightsRequestsTraining(t *testing.T) {
	ev := base
	ev.RewardTrend, ev.LastDecision, ev.SessionsSinceLast, ev.FailingTenants, ev.QueuedSamples = -0.3, evolution.DecisionHarness, 50, 3, 100
	env, acts := newEvolutionEnv(t, ev)
	env.ExecuteWorkflow(EvolutionWorkflow, flow.EvolutionInput{Deployment: "dep", Training: flow.TrainingPolicy{BatchSize: 8}})
	res := evolutionResult(t, env)
	require.Equal(t, evolution.DecisionWeights, res.Decision.Kind)
	require.Equal(t, []flow.RequestTrainingInput{{Deployment: "dep", Policy: flow.TrainingPolicy{BatchSize: 8}}}, acts.trainings)
}

func TestEvolutionRollsBackARegression(t *testing.T) {
	ev := base
	ev.RecentlyPromoted, ev.ServingVersion, ev.PreviousVersion, ev.RewardTrend = true, "dep@v3", "dep@v2", -0.4
	env, acts := newEvolutionEnv(t, ev)
	env.ExecuteWorkflow(EvolutionWorkflow, flow.EvolutionInput{Deployment: "dep"})
	res := evolutionResult(t, env)
	require.Equal(t, evolution.DecisionRollback, res.Decision.Kind)
	require.Equal(t, "rolled back from dep@v3 to dep@v2", res.Action)
	require.Equal(t, "dep@v2", acts.rollbacks[0].To)
}

func TestEvolutionNoOpAndDryRun(t *testing.T) {
	env, acts := newEvolutionEnv(t, base)
	env.ExecuteWorkflow(EvolutionWorkflow, flow.EvolutionInput{Deployment: "dep"})
	res := evolutionResult(t, env)
	require.Equal(t, evolution.DecisionNoOp, res.Decision.Kind)
	require.Len(t, acts.recorded, 1, "a no-op is recorded too")

	ev := base
	ev.CorrectionRate = 0.5
	env, acts = newEvolutionEnv(t, ev)
	env.ExecuteWorkflow(EvolutionWorkflow, flow.EvolutionInput{Deployment: "dep", DryRun: true})
	res = evolutionResult(t, env)
	require.Equal(t, evolution.DecisionMemory, res.Decision.Kind)
	require.Equal(t, "dry run", res.Action)
	require.Empty(t, acts.proposed)
}

// TestEvolutionSweepEvolvesEveryDeploymentWithTraffic: the sweep starts
// one evolution per deployment the activity lists, under the
// deployment's own id, with the sweep's window and policy.
func TestEvolutionSweepEvolvesEveryDeploymentWithTraffic(t *testing.T) {
	env, acts := newEvolutionEnv(t, base)
	env.RegisterWorkflowWithOptions(EvolutionSweepWorkflow, workflowRegisterOptions(flow.EvolutionSweepWorkflowName))
	var window time.Duration
	env.RegisterActivityWithOptions(func(ctx context.Context, w time.Duration) ([]string, error) {
		window = w
		return []string{"dep", "support-agent"}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aEvolution.EvolvableDeployments)})
	env.ExecuteWorkflow(EvolutionSweepWorkflow, flow.EvolutionSweepInput{Window: 30 * time.Minute, Release: testPolicy})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var res flow.EvolutionSweepResult
	require.NoError(t, env.GetWorkflowResult(&res))
	require.Equal(t, []string{"dep", "support-agent"}, res.Started)
	require.Equal(t, 30*time.Minute, window)
	require.Len(t, acts.recorded, 2, "each deployment got its own decision")
	require.Equal(t, "schedule", acts.recorded[0].Trigger)
}
