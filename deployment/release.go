package deployment

import (
	"time"
)

// ReleasePolicy sets the gates' durations and thresholds; zero fields take
// the defaults below (WithDefaults). It travels in workflow inputs
// with its Go field names, so a field is renamed only with a workflow
// version.
type ReleasePolicy struct {
	// ShadowDuration is how long mirrored traffic is collected. Default 1m.
	ShadowDuration time.Duration
	// CanaryShare is the share of live traffic the candidate serves during
	// the canary. Default 0.1.
	CanaryShare float64
	// CanaryDuration is how long the canary runs. Default 10m.
	CanaryDuration time.Duration
	// CanaryChecks is how many times the canary is evaluated during that
	// time; a clear loss rolls back at the first check. Default 5.
	CanaryChecks int
	// MinCanarySamples is how many rewarded candidate interactions a canary
	// verdict needs; fewer at the end fails the gate. Default 20.
	MinCanarySamples int
	// MaxTrafficWait is how much longer than planned the shadow and canary
	// phases wait for the traffic a verdict needs (a quiet hour, a client
	// that paused); after it they fail as not evaluated. Default: each
	// phase's own duration.
	MaxTrafficWait time.Duration
	// MaxRewardDrop is how far the candidate may fall below the baseline
	// in one release: its mean reward (replay and canary) and its
	// held-out pass rate (regression). Default 0.05.
	MaxRewardDrop float64
	// AnchorBudget is the total drop on the held-out suite allowed below
	// the anchor, the best version promoted on it: every release since the
	// anchor shares it, so small drops cannot add up. Default 0.05.
	AnchorBudget float64
	// Alpha is the error rate of the gates' tests: a candidate more than
	// the budget below the anchor is accepted with at most this chance over
	// all candidates judged against one anchor. Default 0.05.
	Alpha float64
	// AllowUnevaluated lets a gate that could not evaluate (no held-out
	// suite, no backend to answer with, no traffic to compare) pass; it is
	// recorded as not evaluated either way. Default false: such a release
	// does not promote.
	AllowUnevaluated bool
	// MaxErrorRise is how much higher the candidate's error rate may be
	// (shadow and canary). Default 0.02.
	MaxErrorRise float64
	// MaxSafetyDrop is how far the safety suite's refusal rate may fall.
	// Default 0: it must not drop.
	MaxSafetyDrop float64
	// RequireApproval waits for the approve signal before promoting.
	RequireApproval bool
	// ApprovalTimeout rolls back when no approval came. Default 24h.
	ApprovalTimeout time.Duration
	// WeightDrain is how long a version stays loaded once a release moved
	// traffic away from it and no route names it: a request routed to it
	// just before may still run there. A later sync unloads it. Default
	// 2m5s, the gateway's default upstream timeout plus its route refresh.
	WeightDrain time.Duration `json:",omitempty"`
}

// DefaultReleasePolicy is the policy with every default filled in.
func DefaultReleasePolicy() ReleasePolicy { return ReleasePolicy{}.WithDefaults() }

// WithDefaults fills the zero fields with the defaults, as the release
// workflow does before it hands the policy to its activities.
func (p ReleasePolicy) WithDefaults() ReleasePolicy {
	if p.ShadowDuration <= 0 {
		p.ShadowDuration = time.Minute
	}
	if p.CanaryShare <= 0 || p.CanaryShare > 1 {
		p.CanaryShare = 0.1
	}
	if p.CanaryDuration <= 0 {
		p.CanaryDuration = 10 * time.Minute
	}
	if p.CanaryChecks <= 0 {
		p.CanaryChecks = 5
	}
	if p.MinCanarySamples <= 0 {
		p.MinCanarySamples = 20
	}
	if p.MaxRewardDrop <= 0 {
		p.MaxRewardDrop = 0.05
	}
	if p.AnchorBudget <= 0 {
		p.AnchorBudget = 0.05
	}
	if p.Alpha <= 0 || p.Alpha >= 1 {
		p.Alpha = 0.05
	}
	if p.MaxErrorRise <= 0 {
		p.MaxErrorRise = 0.02
	}
	if p.MaxSafetyDrop < 0 {
		p.MaxSafetyDrop = 0
	}
	if p.ApprovalTimeout <= 0 {
		p.ApprovalTimeout = 24 * time.Hour
	}
	if p.WeightDrain <= 0 {
		p.WeightDrain = 2*time.Minute + 5*time.Second
	}
	return p
}
