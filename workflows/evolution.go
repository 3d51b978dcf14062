package workflows

import (
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
)

// EvolutionWorkflow computes the evidence for a deployment, picks one
// change (evolution.Decide), records it in Postgres and in its own history
// and result, and carries it out: a new playbook, harness or tool-schema
// artefact through a ReleaseWorkflow, a training request, or a rollback.
func EvolutionWorkflow(ctx workflow.Context, in flow.EvolutionInput) (flow.EvolutionResult, error) {
	if in.Deployment == "" {
		return flow.EvolutionResult{}, temporal.NewNonRetryableApplicationError("evolution needs a Deployment", "BadInput", nil)
	}
	if in.Window <= 0 {
		in.Window = time.Hour
	}
	var res flow.EvolutionResult
	phase := "evidence"
	if err := workflow.SetQueryHandler(ctx, flow.EvolutionStateQuery, func() (map[string]any, error) {
		return map[string]any{"phase": phase, "result": res}, nil
	}); err != nil {
		return res, fmt.Errorf("register state query: %w", err)
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.DeploymentKey.ValueSet(in.Deployment))
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute,
			MaximumAttempts: 10, NonRetryableErrorTypes: []string{"BadInput", "BadData"}},
	})
	if err := workflow.ExecuteActivity(actx, aEvolution.ComputeEvidence, flow.EvidenceInput{
		Deployment: in.Deployment, Window: in.Window, Thresholds: in.Thresholds,
	}).Get(ctx, &res.Evidence); err != nil {
		return res, fmt.Errorf("compute evidence: %w", err)
	}
	// The decision is pure, but recorded as a side effect so that a later
	// change to the rules cannot alter the history of this run on replay.
	phase = "deciding"
	ev, th := res.Evidence, in.Thresholds
	if err := workflow.SideEffect(ctx, func(workflow.Context) any { return evolution.Decide(ev, th) }).Get(&res.Decision); err != nil {
		return res, fmt.Errorf("decide: %w", err)
	}
	if err := workflow.ExecuteActivity(actx, aEvolution.RecordDecision, flow.RecordDecisionInput{
		Deployment: in.Deployment, Decision: res.Decision, Evidence: res.Evidence, Trigger: in.Trigger,
	}).Get(ctx, &res.DecisionID); err != nil {
		return res, fmt.Errorf("record decision: %w", err)
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.DecisionKey.ValueSet(res.Decision.Kind))
	workflow.GetLogger(ctx).Info("evolution decision", "deployment", in.Deployment, "decision", res.Decision.Kind, "reason", res.Decision.Reason)
	if in.DryRun {
		res.Action, phase = "dry run", "done"
		return res, nil
	}

	phase = "acting"
	if err := act(ctx, actx, in, &res); err != nil {
		return res, err
	}
	phase = "done"
	return res, nil
}

// act carries out res's decision and records in res what it did.
func act(ctx, actx workflow.Context, in flow.EvolutionInput, res *flow.EvolutionResult) error {
	switch res.Decision.Kind {
	case evolution.DecisionNoOp:
		res.Action = "none"
	case evolution.DecisionMemory, evolution.DecisionHarness, evolution.DecisionToolSchema:
		return releaseArtefact(ctx, actx, in, res)
	case evolution.DecisionWeights:
		if err := workflow.ExecuteActivity(actx, aEvolution.RequestTraining, flow.RequestTrainingInput{
			Deployment: in.Deployment, Policy: in.Training,
		}).Get(ctx, nil); err != nil {
			return fmt.Errorf("request training: %w", err)
		}
		res.Action = "training requested from " + flow.TrainingWorkflowID(in.Deployment)
	case evolution.DecisionRollback:
		var from string
		if err := workflow.ExecuteActivity(actx, aEvolution.RollbackVersion, flow.RollbackInput{
			Deployment: in.Deployment, To: res.Decision.Target, Reason: res.Decision.Reason,
		}).Get(ctx, &from); err != nil {
			return fmt.Errorf("roll back: %w", err)
		}
		res.Action = fmt.Sprintf("rolled back from %s to %s", from, res.Decision.Target)
	}
	return nil
}

// releaseArtefact proposes the playbook, harness or tool-schema artefact
// the decision asks for and takes it through a ReleaseWorkflow.
func releaseArtefact(ctx, actx workflow.Context, in flow.EvolutionInput, res *flow.EvolutionResult) error {
	layer := evolution.DecisionLayer(res.Decision.Kind)
	// Asking the reflector (a hosted model, perhaps) and replaying failed
	// tool calls take longer than the other steps.
	pctx := workflow.WithActivityOptions(actx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute,
			MaximumAttempts: 3, NonRetryableErrorTypes: []string{"BadInput", "BadData"}},
	})
	var art flow.ProposeArtefactOutput
	if err := workflow.ExecuteActivity(pctx, aEvolution.ProposeArtefact, flow.ProposeArtefactInput{
		Deployment: in.Deployment, Kind: layer, Target: res.Decision.Target, Tenant: res.Decision.Tenant, Evidence: res.Evidence,
		Window: in.Window, Key: workflow.GetInfo(ctx).WorkflowExecution.ID,
	}).Get(ctx, &art); err != nil {
		return fmt.Errorf("propose %s: %w", layer, err)
	}
	res.ReflectionTokens = art.ReflectionTokens
	if art.Version == 0 {
		res.Action = "nothing to propose: " + art.Reason
		return nil
	}
	res.Proposal = art.Reason
	candidate := fmt.Sprint(art.Version)
	id := flow.ReleaseWorkflowID(in.Deployment, layer, candidate)
	res.Action = "release " + id
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID: id, ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
	})
	var rel flow.ReleaseResult
	if err := workflow.ExecuteChildWorkflow(cctx, ReleaseWorkflow, flow.ReleaseInput{
		Deployment: in.Deployment, Layer: layer, Candidate: candidate, Policy: in.Release,
		Reason: fmt.Sprintf("evolution decision %d: %s", res.DecisionID, res.Decision.Reason),
	}).Get(ctx, &rel); err != nil {
		return fmt.Errorf("release %s: %w", id, err)
	}
	res.Release = rel.State.Status
	// Histories from before decisions recorded their release replay
	// without this step.
	if workflow.GetVersion(ctx, "decision-release", workflow.DefaultVersion, 1) == 1 {
		if err := workflow.ExecuteActivity(actx, aEvolution.RecordDecisionRelease, flow.DecisionReleaseInput{
			DecisionID: res.DecisionID, Status: rel.State.Status,
		}).Get(ctx, nil); err != nil {
			return fmt.Errorf("record the release of decision %d: %w", res.DecisionID, err)
		}
	}
	return nil
}
