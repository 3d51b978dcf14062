package evolution

import (
	"fmt"
	"sort"

	"github.com/flywheel-ai/flywheel/artefact"
)

// Decisions u* the control plane can take. A decision that changes one
// layer is named after it, except DecisionMemory: decisions rows and
// workflow histories hold "memory" for a playbook change, so the word
// stays and DecisionLayer maps it.
const (
	DecisionNoOp       = "noop"
	DecisionMemory     = "memory"
	DecisionHarness    = artefact.LayerHarness
	DecisionToolSchema = artefact.LayerToolSchema
	DecisionWeights    = artefact.LayerWeights
	DecisionRollback   = "rollback"
)

// DecisionLayer is the layer (artefact.Layer*) a decision changes, or ""
// for a decision that changes none (noop, rollback). It is the one place
// where a decision's word and its layer's may differ.
func DecisionLayer(decision string) string {
	switch decision {
	case DecisionMemory:
		return artefact.LayerPlaybook
	case DecisionHarness, DecisionToolSchema, DecisionWeights:
		return decision
	}
	return ""
}

// Evidence is what a decision rests on: the deployment's recent window
// compared with the window before it. It is stored with the decision.
type Evidence struct {
	Deployment string  `json:"deployment"`
	WindowSecs float64 `json:"window_secs"`
	// Sessions ended in the window, and how many carried a reward.
	Sessions         int `json:"sessions"`
	RewardedSessions int `json:"rewarded_sessions"`
	// RewardMean is the mean session outcome; RewardPrev the previous
	// window's (NaN-free: 0 when there was none); RewardTrend the change.
	RewardMean  float64 `json:"reward_mean"`
	RewardPrev  float64 `json:"reward_prev"`
	PrevSamples int     `json:"prev_sessions"`
	RewardTrend float64 `json:"reward_trend"`
	// CorrectionRate is the share of sessions with a negative reward or a
	// reward from source "correction".
	CorrectionRate float64 `json:"correction_rate"`
	// ToolFailures are per-tenant, per-tool failure clusters, worst first.
	ToolFailures []ToolFailure `json:"tool_failures"`
	// EvaluatorScore is the mean reward from source "evaluator" (and the
	// previous window's).
	EvaluatorScore float64 `json:"evaluator_score"`
	EvaluatorPrev  float64 `json:"evaluator_prev"`
	// CostPerSession is tokens per session (prompt + completion), and the
	// previous window's.
	CostPerSession float64 `json:"cost_per_session"`
	CostPrev       float64 `json:"cost_prev"`
	// SafetyRate is the share of sessions flagged by a negative reward from
	// source "safety".
	SafetyRate float64 `json:"safety_rate"`
	// Drift is 1 − the word overlap of this window's prompts with the
	// previous window's (0: same topics, 1: nothing in common).
	Drift float64 `json:"drift"`
	// FailingTenants is how many tenants had sessions with a negative
	// outcome; Tenants how many had sessions at all.
	FailingTenants int `json:"failing_tenants"`
	Tenants        int `json:"tenants"`
	// QueuedSamples are waiting for training.
	QueuedSamples int `json:"queued_samples"`
	// ServingVersion serves now; PreviousVersion served before it and
	// RecentlyPromoted says the serving version was promoted in the window.
	ServingVersion   string `json:"serving_version"`
	PreviousVersion  string `json:"previous_version"`
	RecentlyPromoted bool   `json:"recently_promoted"`
	// LastDecision is the previous decision of this deployment and how many
	// sessions ended since it.
	LastDecision      string `json:"last_decision"`
	SessionsSinceLast int    `json:"sessions_since_last"`
	// TenantOutcomes are each tenant's sessions in the window, worst mean
	// reward first: where a failure lives decides which layer it goes to.
	TenantOutcomes []TenantOutcome `json:"tenant_outcomes,omitempty"`
}

// TenantOutcome is one tenant's sessions in the window: how many, how
// many rewarded, how many failed (outcome below 0), and the mean reward
// of the rewarded ones.
type TenantOutcome struct {
	Tenant   string  `json:"tenant"`
	Sessions int     `json:"sessions"`
	Rewarded int     `json:"rewarded"`
	Failed   int     `json:"failed"`
	Mean     float64 `json:"mean_reward"`
}

// ToolFailure is one tenant's failure cluster of one tool: tool names and
// results are the tenant's own, and so is the schema change they call for.
type ToolFailure struct {
	Tenant   string  `json:"tenant"`
	Tool     string  `json:"tool"`
	Calls    int     `json:"calls"`
	Failures int     `json:"failures"`
	Rate     float64 `json:"rate"`
	// Example is a short failure message seen most often, redacted, and
	// Sessions the sessions whose results it quotes.
	Example  string   `json:"example,omitempty"`
	Sessions []string `json:"sessions,omitempty"`
}

// Thresholds tune Decide; zero fields take the defaults (WithDefaults).
type Thresholds struct {
	// MinSessions below which nothing is decided. Default 20.
	MinSessions int `json:"min_sessions"`
	// RewardDrop is how far the mean outcome may fall before acting.
	// Default 0.1.
	RewardDrop float64 `json:"reward_drop"`
	// CorrectionRate above which the cheap layers act. Default 0.2.
	CorrectionRate float64 `json:"correction_rate"`
	// ToolFailureRate and MinToolCalls define a tool-failure cluster.
	// Defaults 0.3 and 5.
	ToolFailureRate float64 `json:"tool_failure_rate"`
	MinToolCalls    int     `json:"min_tool_calls"`
	// SafetyRate above which the serving version is rolled back (if it was
	// promoted recently). Default 0.05.
	SafetyRate float64 `json:"safety_rate"`
	// Drift above which the playbook is refreshed. Default 0.7.
	Drift float64 `json:"drift"`
	// WeightsMinTenants and WeightsMinSamples: weights change only when
	// failures span this many tenants and this many samples are queued.
	// Defaults 2 and 32.
	WeightsMinTenants int `json:"weights_min_tenants"`
	WeightsMinSamples int `json:"weights_min_samples"`
	// Cooldown is how many sessions must end after a change before the
	// next one of the same layer. Default 20.
	Cooldown int `json:"cooldown"`
	// RewardFloor is the mean session reward below which a deployment (or
	// a tenant) is failing whatever its trend: rewarded sessions that
	// average −0.73 are not healthy. Default 0 (a zero value is the
	// floor 0; with rewards in [0, 1] set it, e.g. 0.5).
	RewardFloor float64 `json:"reward_floor"`
	// MinRewarded is how many rewarded sessions the window needs before
	// its mean is judged against the floor, and MinTenantRewarded how many
	// a tenant needs. Defaults 10 and 3.
	MinRewarded       int `json:"min_rewarded"`
	MinTenantRewarded int `json:"min_tenant_rewarded"`
}

// WithDefaults fills zero fields.
func (t Thresholds) WithDefaults() Thresholds {
	def := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	defi := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defi(&t.MinSessions, 20)
	def(&t.RewardDrop, 0.1)
	def(&t.CorrectionRate, 0.2)
	def(&t.ToolFailureRate, 0.3)
	defi(&t.MinToolCalls, 5)
	def(&t.SafetyRate, 0.05)
	def(&t.Drift, 0.7)
	defi(&t.WeightsMinTenants, 2)
	defi(&t.WeightsMinSamples, 32)
	defi(&t.Cooldown, 20)
	defi(&t.MinRewarded, 10)
	defi(&t.MinTenantRewarded, 3)
	return t
}

// Decision is u* with the reason and, for tool-schema and rollback, the
// target (a tool name, a version); a tool-schema or memory change for one
// tenant is the Tenant's. Expected says what the change should do, which
// the decision's review later holds it to.
type Decision struct {
	Kind     string `json:"decision"`
	Reason   string `json:"reason"`
	Target   string `json:"target,omitempty"`
	Tenant   string `json:"tenant,omitempty"`
	Expected string `json:"expected,omitempty"`
}

// FailingTenants are the tenants with enough rewarded sessions whose mean
// reward is below the floor, worst first.
func FailingTenants(e Evidence, t Thresholds) []TenantOutcome {
	t = t.WithDefaults()
	var out []TenantOutcome
	for _, o := range e.TenantOutcomes {
		if o.Rewarded >= t.MinTenantRewarded && o.Mean < t.RewardFloor {
			out = append(out, o)
		}
	}
	return out
}

// Decide picks one change from the evidence. Cheap, reversible layers come
// first: a regression right after a promotion rolls back; a clustered tool
// failure changes that tool's schema; a falling reward or many corrections
// change the memory (playbook) or the harness; weights change only when
// failures persist across tenants, the cheap layers were tried, and enough
// samples are queued. Anything else is a no-op.
func Decide(e Evidence, t Thresholds) Decision {
	t = t.WithDefaults()
	if e.Sessions < t.MinSessions {
		return Decision{Kind: DecisionNoOp, Reason: fmt.Sprintf("%d sessions in the window; %d needed for a decision", e.Sessions, t.MinSessions)}
	}
	regressed := e.PrevSamples > 0 && e.RewardTrend <= -t.RewardDrop
	if e.RecentlyPromoted && e.PreviousVersion != "" {
		switch {
		case e.SafetyRate > t.SafetyRate:
			return Decision{Kind: DecisionRollback, Target: e.PreviousVersion,
				Reason: fmt.Sprintf("safety flags on %.1f%% of sessions since %s was promoted (limit %.1f%%)", 100*e.SafetyRate, e.ServingVersion, 100*t.SafetyRate)}
		case regressed:
			return Decision{Kind: DecisionRollback, Target: e.PreviousVersion,
				Reason: fmt.Sprintf("mean reward fell by %.3f since %s was promoted", -e.RewardTrend, e.ServingVersion)}
		}
	}
	for _, f := range e.ToolFailures {
		if f.Calls >= t.MinToolCalls && f.Rate >= t.ToolFailureRate {
			return Decision{Kind: DecisionToolSchema, Target: f.Tool, Tenant: f.Tenant,
				Expected: fmt.Sprintf("fewer than %.0f%% of tenant %s's calls of %s fail", 100*f.Rate, f.Tenant, f.Tool),
				Reason:   fmt.Sprintf("tool %s of tenant %s failed %d of %d calls (%.0f%%)", f.Tool, f.Tenant, f.Failures, f.Calls, 100*f.Rate)}
		}
	}
	corrected := e.CorrectionRate >= t.CorrectionRate
	low := e.RewardedSessions >= t.MinRewarded && e.RewardMean < t.RewardFloor
	if regressed || corrected || low {
		var symptom string
		switch {
		case regressed:
			symptom = fmt.Sprintf("mean reward fell by %.3f (%.3f → %.3f)", -e.RewardTrend, e.RewardPrev, e.RewardMean)
		case low:
			symptom = fmt.Sprintf("rewarded sessions average %.3f (%d of them), below the floor %.3f", e.RewardMean, e.RewardedSessions, t.RewardFloor)
		default:
			symptom = fmt.Sprintf("correction rate %.0f%%", 100*e.CorrectionRate)
		}
		rises := fmt.Sprintf("the mean session reward rises from %.3f", e.RewardMean)
		cheapTried := (e.LastDecision == DecisionMemory || e.LastDecision == DecisionHarness) && e.SessionsSinceLast >= t.Cooldown
		widespread := e.FailingTenants >= t.WeightsMinTenants
		if cheapTried && widespread && e.QueuedSamples >= t.WeightsMinSamples {
			return Decision{Kind: DecisionWeights, Expected: rises, Reason: fmt.Sprintf("%s persists across %d tenants after a %s change; %d samples queued",
				symptom, e.FailingTenants, e.LastDecision, e.QueuedSamples)}
		}
		if (e.LastDecision == DecisionMemory || e.LastDecision == DecisionHarness) && e.SessionsSinceLast < t.Cooldown {
			return Decision{Kind: DecisionNoOp, Reason: fmt.Sprintf("%s, but the %s change has only seen %d of %d sessions", symptom, e.LastDecision, e.SessionsSinceLast, t.Cooldown)}
		}
		failing := FailingTenants(e, t)
		if len(failing) == 1 && len(e.TenantOutcomes) > 1 && e.LastDecision != DecisionMemory {
			// A failure only one tenant has is that tenant's to learn.
			f := failing[0]
			return Decision{Kind: DecisionMemory, Tenant: f.Tenant,
				Expected: fmt.Sprintf("tenant %s's mean session reward rises from %.3f", f.Tenant, f.Mean),
				Reason: fmt.Sprintf("%s; only tenant %s fails (%d of %d rewarded sessions failed, mean %.3f): lessons from its sessions go into its playbook",
					symptom, f.Tenant, f.Failed, f.Rewarded, f.Mean)}
		}
		if e.LastDecision == DecisionMemory && e.SessionsSinceLast >= t.Cooldown {
			return Decision{Kind: DecisionHarness, Expected: rises, Reason: symptom + "; the playbook change did not fix it"}
		}
		if len(failing) >= 2 {
			// One shared across tenants is the harness's, which every
			// tenant reads.
			return Decision{Kind: DecisionHarness, Expected: rises,
				Reason: fmt.Sprintf("%s; %d tenants fail alike: the shared harness changes", symptom, len(failing))}
		}
		return Decision{Kind: DecisionMemory, Expected: rises, Reason: symptom + "; lessons from the failed sessions go into the playbook first"}
	}
	if e.Drift >= t.Drift && e.LastDecision != DecisionMemory {
		return Decision{Kind: DecisionMemory, Expected: "the playbook follows the new topics without lowering reward",
			Reason: fmt.Sprintf("prompts drifted (%.2f ≥ %.2f); refresh the playbook", e.Drift, t.Drift)}
	}
	return Decision{Kind: DecisionNoOp, Reason: fmt.Sprintf("healthy: rewarded sessions average %.3f (%d of them, floor %.3f), trend %+.3f, corrections %.0f%%",
		e.RewardMean, e.RewardedSessions, t.RewardFloor, e.RewardTrend, 100*e.CorrectionRate)}
}

// Drift is 1 − the Jaccard overlap of the vocabularies of two prompt sets
// (their top words); 0 when either is empty.
func Drift(recent, previous []string, top int) float64 {
	a, b := topWords(recent, top), topWords(previous, top)
	if len(a) == 0 || len(b) == 0 {
		return 0
	}
	inter := 0
	for w := range a {
		if b[w] {
			inter++
		}
	}
	union := len(a) + len(b) - inter
	return 1 - float64(inter)/float64(union)
}

func topWords(texts []string, top int) map[string]bool {
	count := map[string]int{}
	for _, t := range texts {
		for _, w := range words(t) {
			if len(w) > 2 {
				count[w]++
			}
		}
	}
	ws := make([]string, 0, len(count))
	for w := range count {
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool {
		if count[ws[i]] != count[ws[j]] {
			return count[ws[i]] > count[ws[j]]
		}
		return ws[i] < ws[j]
	})
	if top > 0 && len(ws) > top {
		ws = ws[:top]
	}
	out := map[string]bool{}
	for _, w := range ws {
		out[w] = true
	}
	return out
}
