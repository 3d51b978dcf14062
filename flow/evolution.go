package flow

import (
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/evolution"
)

// EvolutionWorkflow names.
const (
	EvolutionWorkflowName = "EvolutionWorkflow"
	EvolutionStateQuery   = "state"
)

// Activity names EvolutionWorkflow runs (activities.Evolution implements them).
const ()

// EvolutionScheduleID is the schedule that runs a deployment's evolution,
// and the id of the runs the sweep starts for it.
func EvolutionScheduleID(deployment string) string { return "evolution-" + deployment }

// The sweep: one schedule that evolves every deployment with traffic.
const (
	EvolutionSweepWorkflowName = "EvolutionSweepWorkflow"
	EvolutionSweepScheduleID   = "evolution-sweep"
)

// EvolutionSweepInput is what each deployment's evolution gets.
type EvolutionSweepInput struct {
	// Window is the evidence window, and how recent a deployment's
	// sessions must be for it to be evolved. Default 1h.
	Window     time.Duration
	Thresholds evolution.Thresholds
	Release    deployment.ReleasePolicy
	Training   TrainingPolicy
}

// EvolutionSweepResult says which deployments' evolutions the sweep
// started, and which it skipped because their last one still runs.
type EvolutionSweepResult struct {
	Started, Skipped []string
}

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
	Release deployment.ReleasePolicy
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
	// Reason says why nothing was proposed, or what the proposal rests on.
	Reason string
	// ReflectionTokens is what asking the reflector cost.
	ReflectionTokens int `json:",omitempty"`
}

// DecisionReleaseInput records how the release a decision started ended.
type DecisionReleaseInput struct {
	DecisionID int64
	Status     string
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
	// Proposal says what the proposed change rests on (the reflector's
	// curated deltas, a replay's count), and ReflectionTokens what the
	// reflection cost.
	Proposal         string `json:",omitempty"`
	ReflectionTokens int    `json:",omitempty"`
}
