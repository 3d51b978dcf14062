package flow

import (
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// The session contract between the gateway (which signals) and
// SessionWorkflow (which owns the session's lifecycle). The workflow id is
// SessionWorkflowID, so a signal-with-start from any gateway replica reaches
// the one workflow of that session.
const (
	SessionWorkflowName = "SessionWorkflow"
	// SessionEventsSignal carries SessionEvents, one or a batch.
	SessionEventsSignal = "session-events"
	// SessionStateQuery answers SessionState.
	SessionStateQuery = "state"
)

// SessionWorkflowID is the id of a session's workflow, "<tenant>/<session>":
// session ids are the tenant's own names, so two tenants' "task-42" are
// two sessions and two workflows. Tenant names hold no "/", so the id is
// unambiguous.
func SessionWorkflowID(tenantID, sessionID string) string {
	return tenantID + "/" + sessionID
}

// Kinds of SessionEvent.
const (
	EventStep   = "step"   // an interaction was committed
	EventReward = "reward" // a reward row was committed
	EventEnd    = "end"    // the client ended the session
)

// SessionInput starts a SessionWorkflow.
type SessionInput struct {
	SessionID  string
	TenantID   string
	Deployment string
	// GroupID and GroupSize tie sessions into a GRPO group ("" / 1: none).
	GroupID   string
	GroupSize int
	TaskID    string
	// IdleTimeout ends the session after no event for this long (0: the
	// workflow's default).
	IdleTimeout time.Duration
	// EventsPerRun is how many events one run handles before it continues
	// as new (0: DefaultSessionEventsPerRun).
	EventsPerRun int `json:",omitempty"`
	// Discount is γ for the discounted returns (0: the worker's gateway.discount).
	Discount float64 `json:",omitempty"`
	// RewardGrace is how long a session the client ended without a reward
	// waits for one before assembly (0: DefaultRewardGrace; negative: no
	// wait). Later rewards still bind, in a next generation.
	RewardGrace time.Duration `json:",omitempty"`
	// Carry is set by the workflow itself when it continues as new.
	Carry *SessionCarry `json:",omitempty"`
	// Rev is the revision of the workflow's behaviour the starter asked
	// for (SessionStart sets SessionRevision; 0 is the first). It is part
	// of the started event, so a history replays the revision it ran.
	Rev int `json:",omitempty"`
}

// SessionRevision is the session workflow's current behaviour. Revision 1
// records no version marker, takes its search attributes from the start
// (no upsert) and arms its idle timer only while it waits, so a short
// session costs the Temporal server one workflow task with no timer and
// one visibility update (its reward) besides its start and close.
const SessionRevision = 1

// SessionStart is how a client starts a session's workflow: its options
// (workflow id SessionWorkflowID, the session queue, the search attributes) and
// the input at the current revision.
func SessionStart(in SessionInput) (client.StartWorkflowOptions, SessionInput) {
	in.Rev = SessionRevision
	return client.StartWorkflowOptions{
		ID: SessionWorkflowID(in.TenantID, in.SessionID), TaskQueue: SessionTaskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SessionIDKey.ValueSet(in.SessionID), TenantKey.ValueSet(in.TenantID), DeploymentKey.ValueSet(in.Deployment)),
	}, in
}

// SessionEvent is a notice that something about the session was committed
// to Postgres. It carries ids only; the data stays in Postgres.
type SessionEvent struct {
	Kind          string
	InteractionID int64 `json:",omitempty"`
	RewardID      int64 `json:",omitempty"`
	// Final marks a reward that closes the session's outcome.
	Final bool `json:",omitempty"`
	At    time.Time
}

// SessionEvents is the signal payload: events in commit order.
type SessionEvents struct {
	Events []SessionEvent
}
