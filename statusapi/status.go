// Package statusapi is the wire format of GET /v1/status: what the control
// plane did with a tenant's deployments, as the store reads it, the gateway
// writes it and its clients (the demo, the status page) read it. It holds
// types only and imports nothing of Flywheel's, so a client of the HTTP API
// needs neither the store nor the gateway.
package statusapi

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// The status view: what the control plane did with a deployment (versions,
// releases and their gates, evolution decisions, training runs) and what a
// tenant's own traffic looks like on it (recent sessions, the success
// curve).
//
// Deployments are shared between tenants, so a tenant sees a deployment
// only once it has a session on it; sessions, the curve and per-tenant
// counts are filtered by tenant, and nothing another tenant wrote (prompts,
// answers, tool output) appears.

// Status is a tenant's view of its deployments.
type Status struct {
	Tenant      string             `json:"tenant"`
	GeneratedAt time.Time          `json:"generated_at"`
	Deployments []DeploymentStatus `json:"deployments"`
	// Usage is what the tenant's keys spent in the window.
	Usage Usage `json:"usage"`
}

// Usage is what a tenant's keys spent on model calls from Since on (a UTC
// day: usage is accounted per day, so the view's window is widened to
// whole days), counted as GET /v1/usage counts it: every acknowledged
// call, failed ones among the requests too.
type Usage struct {
	Since            string `json:"since"`
	Requests         int64  `json:"requests"`
	Errors           int64  `json:"errors"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	// Deployments is the same per deployment, largest first.
	Deployments []DeploymentUsage `json:"deployments"`
}

// DeploymentUsage is a tenant's usage of one deployment.
type DeploymentUsage struct {
	Deployment       string `json:"deployment"`
	Requests         int64  `json:"requests"`
	Errors           int64  `json:"errors"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
}

// DeploymentStatus is one deployment.
type DeploymentStatus struct {
	Name string `json:"name"`
	// Backend is "" for a deployment routed by configuration only (no
	// deployments row).
	Backend        string `json:"backend"`
	ServingVersion string `json:"serving_version"`
	// Canary is the running weights release, nil when none runs.
	Canary   *CanaryStatus   `json:"canary"`
	Versions []VersionStatus `json:"versions"`
	Releases []ReleaseStatus `json:"releases"`
	// ReleaseCounts counts every release the deployment ever had, by
	// layer then status (the Releases list is capped): what happened
	// during a run is the difference of two readings.
	ReleaseCounts map[string]map[string]int `json:"release_counts"`
	Decisions     []DecisionStatus          `json:"decisions"`
	TrainingRuns  []TrainingRunStatus       `json:"training_runs"`
	// TrainingCounts counts every training run by status (claimed,
	// trained, failed); the TrainingRuns list is capped.
	TrainingCounts map[string]int `json:"training_counts"`
	// Anchor is the best version promoted on the held-out suite, which
	// every release and the watchdog compare with (nil: no suite, or none
	// measured yet).
	Anchor *AnchorStatus `json:"anchor"`
	// Watchdog lists the latest re-measurements of the serving version.
	Watchdog []WatchdogCheck  `json:"watchdog"`
	Sessions []SessionSummary `json:"sessions"`
	Curve    Curve            `json:"curve"`
}

// CanaryStatus is a running weights release: its candidate takes Share of
// the traffic once the release reaches its canary phase.
type CanaryStatus struct {
	ReleaseID int64   `json:"release_id"`
	Candidate string  `json:"candidate"`
	Baseline  string  `json:"baseline"`
	Phase     string  `json:"phase"`
	Share     float64 `json:"share"`
}

// VersionStatus is a model version with its lineage.
type VersionStatus struct {
	ID     string `json:"id"`
	Parent string `json:"parent"`
	// Status is candidate, serving, superseded, rolled_back or retired.
	Status string `json:"status"`
	// Serving and Canary say whether it takes traffic now.
	Serving       bool           `json:"serving"`
	Canary        bool           `json:"canary"`
	Metrics       map[string]any `json:"metrics"`
	RetiredReason string         `json:"retired_reason,omitempty"`
	CreatedAt     time.Time      `json:"created_at"`
	// TrainedSamples is how many samples trained it (all tenants);
	// TenantSessions how many of this tenant's sessions they came from.
	TrainedSamples int `json:"trained_samples"`
	TenantSessions int `json:"tenant_sessions"`
}

// ReleaseStatus is a release with every gate's numbers.
type ReleaseStatus struct {
	ID          int64        `json:"id"`
	Layer       string       `json:"layer"`
	Candidate   string       `json:"candidate"`
	Baseline    string       `json:"baseline"`
	Status      string       `json:"status"`
	Phase       string       `json:"phase"`
	CanaryShare float64      `json:"canary_share"`
	Reason      string       `json:"reason"`
	StartedAt   time.Time    `json:"started_at"`
	FinishedAt  *time.Time   `json:"finished_at"`
	Gates       []GateStatus `json:"gates"`
}

// GateStatus is one gate's verdict and numbers.
type GateStatus struct {
	Gate      string         `json:"gate"`
	Passed    bool           `json:"passed"`
	Metrics   map[string]any `json:"metrics"`
	CreatedAt time.Time      `json:"created_at"`
}

// DecisionStatus is an evolution decision with the evidence it rested on.
type DecisionStatus struct {
	ID        int64           `json:"id"`
	Decision  string          `json:"decision"`
	Reason    string          `json:"reason"`
	Evidence  json.RawMessage `json:"evidence"`
	CreatedAt time.Time       `json:"created_at"`
	// Expected is what the decision expects its change to do, Release how
	// the release it started ended, and Outcome what the promoted change
	// did to reward, once a window of traffic has passed.
	Expected string           `json:"expected,omitempty"`
	Release  string           `json:"release,omitempty"`
	Outcome  *DecisionOutcome `json:"outcome,omitempty"`
}

// DecisionOutcome is what a promoted change did to reward: the mean
// session reward of its scope (the tenant's sessions, or all) in the
// window before the decision and in the window after the promotion.
type DecisionOutcome struct {
	Before         float64   `json:"before"`
	After          float64   `json:"after"`
	RewardedBefore int       `json:"rewarded_before"`
	RewardedAfter  int       `json:"rewarded_after"`
	MeasuredAt     time.Time `json:"measured_at"`
}

// TrainingRunStatus is one training step of the deployment.
type TrainingRunStatus struct {
	ID int64 `json:"id"`
	// Status is claimed (training now), trained or failed.
	Status  string `json:"status"`
	Version string `json:"version"`
	Samples int    `json:"samples"`
	// TenantSamples of them are this tenant's.
	TenantSamples int            `json:"tenant_samples"`
	Stats         map[string]any `json:"stats"`
	CreatedAt     time.Time      `json:"created_at"`
	FinishedAt    *time.Time     `json:"finished_at"`
}

// SessionSummary is one of the tenant's recent sessions.
type SessionSummary struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	TaskID string `json:"task_id,omitempty"`
	Steps  int    `json:"steps"`
	// Version served the session's last step.
	Version string `json:"version"`
	// Reward is the session's outcome (its outcome rewards' mean, else its
	// step rewards' mean); nil when it has none.
	Reward *float64 `json:"reward"`
	// Trained says whether a version trained on it (TrainedInto lists
	// them); Reason is why not, or TrainingTrained.
	Trained      bool      `json:"trained"`
	TrainedInto  []string  `json:"trained_into"`
	Reason       string    `json:"reason"`
	CreatedAt    time.Time `json:"created_at"`
	LastActiveAt time.Time `json:"last_active_at"`
}

// Curve is the success curve of the tenant's traffic: the mean reward of
// rewarded interactions per time bucket, per version that served them.
type Curve struct {
	// BucketSeconds is the bucket width, chosen from the span.
	BucketSeconds int          `json:"bucket_seconds"`
	Points        []CurvePoint `json:"points"`
}

// CurvePoint is one bucket of one version.
type CurvePoint struct {
	Start      time.Time `json:"start"`
	Version    string    `json:"version"`
	Rewarded   int       `json:"rewarded"`
	MeanReward float64   `json:"mean_reward"`
}

// AnchorStatus is a deployment's anchor on its held-out suite.
type AnchorStatus struct {
	Version string `json:"version"`
	// PassRate is its result on the suite's Prompts prompts.
	PassRate float64 `json:"pass_rate"`
	Prompts  int     `json:"prompts"`
	// ServingPassRate is the serving version's, when it has one.
	ServingPassRate *float64 `json:"serving_pass_rate,omitempty"`
}

// WatchdogCheck is one re-measurement of a deployment's serving version.
type WatchdogCheck struct {
	ID         int64          `json:"id"`
	Deployment string         `json:"deployment"`
	Serving    string         `json:"serving"`
	Anchor     string         `json:"anchor"`
	Verdict    string         `json:"verdict"`
	Reason     string         `json:"reason"`
	Metrics    map[string]any `json:"metrics"`
	WorkflowID string         `json:"workflow_id"`
	CreatedAt  time.Time      `json:"created_at"`
}

// VersionNumber parses the policy version number out of a model version id
// "<name>@v<N>" (the in-process engine's naming, which the status reports);
// ok is false for other names (upstream models).
func VersionNumber(id string) (int64, bool) {
	i := strings.LastIndex(id, "@v")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(id[i+2:], 10, 64)
	return n, err == nil && n >= 0
}
