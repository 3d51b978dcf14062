package flow

import "time"

// Session defaults.
const (
	// DefaultSessionIdleTimeout ends a session nobody has touched for this long.
	DefaultSessionIdleTimeout = 30 * time.Minute
	// DefaultSessionEventsPerRun bounds the events one run handles before it
	// continues as new, far below the server's 51,200-event history limit
	// (every signal is one history event; each batch of ≤ this many events is
	// also bounded by the server's own continue-as-new suggestion).
	DefaultSessionEventsPerRun = 2000
	// DefaultRewardGrace is how long a session the client ended without
	// any reward waits for one before it is assembled. Agents usually post
	// the reward just after their last call; without the grace that reward
	// would arrive during assembly and cost a second generation.
	DefaultRewardGrace = 5 * time.Second
)

// Activity names SessionWorkflow runs (activities.Session implements them).
const ()

// End reasons.
const (
	EndByClient = "client"
	EndByIdle   = "idle"
)

// SessionCarry is what a run hands to the next when it continues as new.
type SessionCarry struct {
	Steps       int
	Rewards     int
	FinalReward bool
	// LastEventAt is when the last event was received (workflow time).
	LastEventAt time.Time
	// Runs counts continue-as-new hand-offs so far.
	Runs int
	// Generation counts assemblies: events that arrive while a session is
	// being assembled (a late reward) start the next generation, which
	// assembles again (a new trajectory) when it ends.
	Generation int `json:",omitempty"`
}

// SessionState answers the "state" query.
type SessionState struct {
	SessionID   string
	TenantID    string
	Deployment  string
	Steps       int
	Rewards     int
	FinalReward bool
	Ended       bool
	EndReason   string `json:",omitempty"`
	LastEventAt time.Time
	// Phase is "open", "finishing" (activities running) or "done".
	Phase string
	// Runs counts continue-as-new hand-offs.
	Runs int
	// Filled in when the session is done.
	TrajectoryID int64   `json:",omitempty"`
	Eligible     int     `json:",omitempty"`
	Enqueued     int     `json:",omitempty"`
	TotalReward  float64 `json:",omitempty"`
}

// AssembleInput asks for one session's trajectory. Key makes the activity
// idempotent: a retry with the same key returns the trajectory already
// written instead of writing a second one.
type AssembleInput struct {
	SessionID string
	TenantID  string
	Key       string
	Discount  float64
}

// AssembleOutput summarises an assembled trajectory.
type AssembleOutput struct {
	TrajectoryID int64
	Steps        int
	Eligible     int
	// Ineligible counts steps per reason.
	Ineligible  map[string]int
	TotalReward float64
	HasReward   bool
}

// EnqueueInput queues a trajectory's eligible steps for training.
type EnqueueInput struct {
	TrajectoryID int64
	TenantID     string
}

// EnqueueOutput says how many samples this call queued and how many were
// already queued (by an earlier attempt).
type EnqueueOutput struct {
	Enqueued       int
	AlreadyQueued  int
	EligibleSteps  int
	DeploymentName string
	// Rescored counts queued samples of an earlier assembly that took the
	// new return; AfterTraining, steps whose sample had trained already.
	Rescored      int `json:",omitempty"`
	AfterTraining int `json:",omitempty"`
}

// EndSessionInput marks the session row ended.
type EndSessionInput struct {
	SessionID string
	TenantID  string
	Reason    string
}

// SessionResult is what a finished SessionWorkflow returns.
type SessionResult struct {
	State SessionState
}
