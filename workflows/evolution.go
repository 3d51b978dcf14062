package workflows

import (
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/evolution"
)

// EvolutionWorkflow names.
const (
	EvolutionWorkflowName = "EvolutionWorkflow"
	EvolutionStateQuery   = "state"
)

// Activity names EvolutionWorkflow runs (activities.Evolution implements them).
const (
	ComputeEvidenceActivity = "ComputeEvidence"
	RecordDecisionActivity  = "RecordDecision"
	ProposeArtefactActivity = "ProposeArtefact"
	RequestTrainingActivity = "RequestTraining"
	RollbackVersionActivity = "RollbackVersion"
)

// EvolutionScheduleID is the schedule that runs a deployment's evolution.
func EvolutionScheduleID(deployment string) string { return "evolution-" + deployment }

// EvolutionInput runs one decision for a deployment.
type EvolutionInput struct {
	Deployment string
	// Window is the period the evidence covers (compared with the one
	// before it). Default 1h.
	Window     time.Duration
	Thresholds evolution.Thresholds
	// Trigger says who asked: "schedule", "manual", "release", …
	Trigger string
	// Release gates any change the decision makes.
	Release ReleasePolicy
	// Training starts the deployment's TrainingWorkflow when a weights
	// decision finds none running.
	Training TrainingPolicy
	// DryRun records the decision without acting on it.
	DryRun bool
}

// EvidenceInput asks for the evidence of a window ending now.
type EvidenceInput struct {
	Deployment string
	Window     time.Duration
	Thresholds evolution.Thresholds
}

// RecordDecisionInput stores a decision.
type RecordDecisionInput struct {
	Deployment string
	Decision   evolution.Decision
	Evidence   evolution.Evidence
	Trigger    string
}

// ProposeArtefactInput asks for a new artefact version the decision calls
// for; Key makes it idempotent.
type ProposeArtefactInput struct {
	Deployment string
	Kind       string
	Target     string
	// Tenant is whose tool a tool-schema change is for.
	Tenant   string `json:",omitempty"`
	Evidence evolution.Evidence
	Window   time.Duration
	Key      string
}

// ProposeArtefactOutput is the candidate artefact (Version 0: nothing to
// propose, with Reason).
type ProposeArtefactOutput struct {
	Version int
	Items   int
	Reason  string
}

// RequestTrainingInput asks the deployment's TrainingWorkflow to train now.
type RequestTrainingInput struct {
	Deployment string
	Policy     TrainingPolicy
}

// RollbackInput makes To serve again.
type RollbackInput struct {
	Deployment string
	To         string
	Reason     string
}

// EvolutionResult is the decision, its evidence and what was done.
type EvolutionResult struct {
	DecisionID int64
	Decision   evolution.Decision
	Evidence   evolution.Evidence
	// Action says what followed: a release workflow id, "training
	// requested", "rolled back from X", "nothing to propose: …", "dry run".
	Action string
	// Release is the outcome of the release the decision started, if any.
	Release string `json:",omitempty"`
}

// EvolutionWorkflow computes the evidence for a deployment, picks one
// change (evolution.Decide), records it in Postgres and in its own history
// and result, and carries it out: a new playbook, harness or tool-schema
// artefact through a ReleaseWorkflow, a training request, or a rollback.
func EvolutionWorkflow(ctx workflow.Context, in EvolutionInput) (EvolutionResult, error) {
	if in.Deployment == "" {
		return EvolutionResult{}, temporal.NewNonRetryableApplicationError("evolution needs a Deployment", "BadInput", nil)
	}
	if in.Window <= 0 {
		in.Window = time.Hour
	}
	var res EvolutionResult
	phase := "evidence"
	if err := workflow.SetQueryHandler(ctx, EvolutionStateQuery, func() (map[string]any, error) {
		return map[string]any{"phase": phase, "result": res}, nil
	}); err != nil {
		return res, fmt.Errorf("register state query: %w", err)
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, DeploymentKey.ValueSet(in.Deployment))
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute,
			MaximumAttempts: 10, NonRetryableErrorTypes: []string{"BadInput", "BadData"}},
	})
	if err := workflow.ExecuteActivity(actx, ComputeEvidenceActivity, EvidenceInput{
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
	if err := workflow.ExecuteActivity(actx, RecordDecisionActivity, RecordDecisionInput{
		Deployment: in.Deployment, Decision: res.Decision, Evidence: res.Evidence, Trigger: in.Trigger,
	}).Get(ctx, &res.DecisionID); err != nil {
		return res, fmt.Errorf("record decision: %w", err)
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, DecisionKey.ValueSet(res.Decision.Kind))
	workflow.GetLogger(ctx).Info("evolution decision", "deployment", in.Deployment, "decision", res.Decision.Kind, "reason", res.Decision.Reason)
	if in.DryRun {
		res.Action, phase = "dry run", "done"
		return res, nil
	}

	phase = "acting"
	info := workflow.GetInfo(ctx)
	switch res.Decision.Kind {
	case evolution.DecisionNoOp:
		res.Action = "none"
	case evolution.DecisionMemory, evolution.DecisionHarness, evolution.DecisionToolSchema:
		kind, layer := evolution.KindPlaybook, LayerPlaybook
		switch res.Decision.Kind {
		case evolution.DecisionHarness:
			kind, layer = evolution.KindHarness, LayerHarness
		case evolution.DecisionToolSchema:
			kind, layer = evolution.KindToolSchema, LayerToolSchema
		}
		var art ProposeArtefactOutput
		if err := workflow.ExecuteActivity(actx, ProposeArtefactActivity, ProposeArtefactInput{
			Deployment: in.Deployment, Kind: kind, Target: res.Decision.Target, Tenant: res.Decision.Tenant, Evidence: res.Evidence,
			Window: in.Window, Key: info.WorkflowExecution.ID,
		}).Get(ctx, &art); err != nil {
			return res, fmt.Errorf("propose %s: %w", kind, err)
		}
		if art.Version == 0 {
			res.Action = "nothing to propose: " + art.Reason
			break
		}
		candidate := fmt.Sprint(art.Version)
		id := ReleaseWorkflowID(in.Deployment, layer, candidate)
		res.Action = "release " + id
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID: id, ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
		})
		var rel ReleaseResult
		if err := workflow.ExecuteChildWorkflow(cctx, ReleaseWorkflow, ReleaseInput{
			Deployment: in.Deployment, Layer: layer, Candidate: candidate, Policy: in.Release,
			Reason: fmt.Sprintf("evolution decision %d: %s", res.DecisionID, res.Decision.Reason),
		}).Get(ctx, &rel); err != nil {
			return res, fmt.Errorf("release %s: %w", id, err)
		}
		res.Release = rel.State.Status
	case evolution.DecisionWeights:
		if err := workflow.ExecuteActivity(actx, RequestTrainingActivity, RequestTrainingInput{
			Deployment: in.Deployment, Policy: in.Training,
		}).Get(ctx, nil); err != nil {
			return res, fmt.Errorf("request training: %w", err)
		}
		res.Action = "training requested from " + TrainingWorkflowID(in.Deployment)
	case evolution.DecisionRollback:
		var from string
		if err := workflow.ExecuteActivity(actx, RollbackVersionActivity, RollbackInput{
			Deployment: in.Deployment, To: res.Decision.Target, Reason: res.Decision.Reason,
		}).Get(ctx, &from); err != nil {
			return res, fmt.Errorf("roll back: %w", err)
		}
		res.Action = fmt.Sprintf("rolled back from %s to %s", from, res.Decision.Target)
	}
	phase = "done"
	return res, nil
}
