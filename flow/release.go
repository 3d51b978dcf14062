package flow

import (
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
)

// ReleaseWorkflow names, signals and query.
const (
	ReleaseWorkflowName = "ReleaseWorkflow"
	// ReleaseApproveSignal promotes the candidate once the gate in progress
	// passes (it also satisfies RequireApproval).
	ReleaseApproveSignal = "approve"
	// ReleaseAbortSignal rolls the candidate back at once.
	ReleaseAbortSignal = "abort"
	ReleaseStateQuery  = "state"
)

// Gates, in the order a release runs them.
const (
	GateShadow     = "shadow"
	GateReplay     = "replay"
	GateRegression = "regression"
	GateSafety     = "safety"
	GateCanary     = "canary"
)

// Release outcomes (releases.status).
const (
	ReleasePromoted   = "promoted"
	ReleaseRolledBack = "rolled_back"
	ReleaseAborted    = "aborted"
)

// Activity names ReleaseWorkflow runs (activities.Release implements them).
const ()

// SyncWeightsInput asks that a deployment's serving engine hold what its
// routes name: the serving version, the anchor and, while its release
// runs, Candidate. Unload releases the deployment's other versions there,
// except those a weights release moved traffic away from less than Drain
// ago: a request routed to one before the move may still be running.
type SyncWeightsInput struct {
	Deployment string
	Candidate  string        `json:",omitempty"`
	Unload     bool          `json:",omitempty"`
	Drain      time.Duration `json:",omitempty"`
}

// SyncWeightsOutput is what the engine was asked to do; Synced is false
// for a deployment with no weight sync (nothing was asked).
type SyncWeightsOutput struct {
	Synced   bool
	Loaded   []string `json:",omitempty"`
	Unloaded []string `json:",omitempty"`
	Kept     []string `json:",omitempty"`
}

// ReleaseInput starts a gated release of one layer of a deployment. The
// workflow id should be "release-<deployment>-<candidate>".
type ReleaseInput struct {
	Deployment string
	// Layer is one of artefact.Layer*.
	Layer string
	// Candidate is a model version id (weights) or an artefact version
	// (other layers, as its decimal number).
	Candidate string
	// Baseline is what serves now; empty: the activity reads it.
	Baseline string
	Policy   deployment.ReleasePolicy
	// Reason says why the release exists (the evolution decision, a run).
	Reason string
}

// BeginReleaseOutput identifies the release row.
type BeginReleaseOutput struct {
	ReleaseID int64
	Baseline  string
	// Policy is the release's policy with the deployment's settings in
	// place (nil in histories from before it was read here).
	Policy *deployment.ReleasePolicy `json:",omitempty"`
}

// SetPhaseInput moves the release to a phase; CanaryShare is the share of
// live traffic the gateway routes to the candidate in it.
type SetPhaseInput struct {
	ReleaseID   int64
	Phase       string
	CanaryShare float64
}

// GateInput asks for one gate's verdict, compared with the baseline.
type GateInput struct {
	ReleaseID  int64
	Deployment string
	Layer      string
	Candidate  string
	Baseline   string
	Gate       string
	// Since bounds the live data (shadow, canary) to this phase.
	Since  time.Time
	Policy deployment.ReleasePolicy
	// Final marks the gate's last evaluation: too little data fails it.
	Final bool
	// SetPhase records Gate as the release's phase first (no canary
	// share), in the same activity.
	SetPhase bool `json:",omitempty"`
}

// GateResult is one gate's numbers and verdict (also in gate_results).
type GateResult struct {
	Gate    string
	Passed  bool
	Metrics map[string]float64
	Reason  string
	// Insufficient: not enough data yet for a verdict (interim canary).
	Insufficient bool
	// NotEvaluated: the gate could not evaluate (nothing to answer with or
	// to compare); it passed only if the policy allows that.
	NotEvaluated bool `json:",omitempty"`
	// Regressed: the candidate was shown worse than allowed (not merely
	// not shown good enough), so its training line is abandoned.
	Regressed bool `json:",omitempty"`
	// Anchor is the version a suite gate compared with besides the
	// baseline, on the suite named by SuiteKey.
	Anchor   string `json:",omitempty"`
	SuiteKey string `json:",omitempty"`
}

// FinishReleaseInput promotes or rolls back.
type FinishReleaseInput struct {
	ReleaseID  int64
	Deployment string
	Layer      string
	Candidate  string
	Baseline   string
	Status     string
	Reason     string
}

// ReleaseState answers the state query.
type ReleaseState struct {
	ReleaseID int64
	Phase     string
	Gates     []GateResult
	Status    string
	Reason    string
	Approved  bool
}

// ReleaseResult is the release's outcome.
type ReleaseResult struct {
	State ReleaseState
}
