package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Session defaults.
const (
	// DefaultSessionIdleTimeout ends a session nobody has touched for this long.
	DefaultSessionIdleTimeout = 30 * time.Minute
	// DefaultSessionEventsPerRun bounds the events one run handles before it
	// continues as new, far below the server's 51,200-event history limit
	// (every signal is one history event; each batch of ≤ this many events is
	// also bounded by the server's own continue-as-new suggestion).
	DefaultSessionEventsPerRun = 2000
	// DefaultDiscount is γ when neither the session nor the worker sets one.
	DefaultDiscount = 1.0
	// DefaultRewardGrace is how long a session the client ended without
	// any reward waits for one before it is assembled. Agents usually post
	// the reward just after their last call; without the grace that reward
	// would arrive during assembly and cost a second generation.
	DefaultRewardGrace = 5 * time.Second
)

// Workflow change ids (workflow.GetVersion), so histories recorded before
// a change still replay.
const (
	// sessionChangeGraceLocal adds the reward grace and runs the finishing
	// activities as local activities: one workflow task instead of three
	// server round trips each, which is most of a short session's cost on
	// the Temporal server.
	sessionChangeGraceLocal = "session-grace-local-finish"
)

// Activity names SessionWorkflow runs (activities.Session implements them).
const (
	AssembleTrajectoryActivity = "AssembleTrajectory"
	EnqueueSamplesActivity     = "EnqueueSamples"
	EndSessionActivity         = "EndSession"
)

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

// SessionWorkflow owns one session's lifecycle (workflow id = session id).
// The gateway signals SessionEventsSignal with ids of rows it committed; on
// end (client, or idle timeout) activities turn the session into a
// redacted, rewarded ATDP trajectory and queue its eligible steps.
func SessionWorkflow(ctx workflow.Context, in SessionInput) (SessionResult, error) {
	if in.SessionID == "" || in.TenantID == "" {
		return SessionResult{}, temporal.NewNonRetryableApplicationError("session workflow needs SessionID and TenantID", "BadInput", nil)
	}
	s := &sessionRun{in: in}
	return s.run(ctx)
}

type sessionRun struct {
	in SessionInput
	// v is the workflow's version of sessionChangeGraceLocal.
	v          workflow.Version
	generation int
	state      SessionState
	// events handled by this run (the continue-as-new budget).
	events int
}

func (s *sessionRun) run(ctx workflow.Context) (SessionResult, error) {
	in := s.in
	c := in.Carry
	if c == nil {
		c = &SessionCarry{}
	}
	s.state = SessionState{
		SessionID: in.SessionID, TenantID: in.TenantID, Deployment: in.Deployment,
		Steps: c.Steps, Rewards: c.Rewards, FinalReward: c.FinalReward,
		LastEventAt: c.LastEventAt, Phase: "open", Runs: c.Runs,
	}
	s.generation = c.Generation
	if s.state.LastEventAt.IsZero() {
		s.state.LastEventAt = workflow.Now(ctx)
	}
	// Handlers first, so a query during the first task already answers.
	if err := workflow.SetQueryHandler(ctx, SessionStateQuery, func() (SessionState, error) {
		return s.state, nil
	}); err != nil {
		return SessionResult{}, fmt.Errorf("register state query: %w", err)
	}
	if _, set := workflow.GetTypedSearchAttributes(ctx).GetKeyword(SessionIDKey); !set && c.Runs == 0 {
		// Started without them (before revision 1, or by hand).
		_ = workflow.UpsertTypedSearchAttributes(ctx,
			SessionIDKey.ValueSet(in.SessionID), TenantKey.ValueSet(in.TenantID), DeploymentKey.ValueSet(in.Deployment))
	}
	idle := in.IdleTimeout
	if idle <= 0 {
		idle = DefaultSessionIdleTimeout
	}
	perRun := in.EventsPerRun
	if perRun <= 0 {
		perRun = DefaultSessionEventsPerRun
	}
	ch := workflow.GetSignalChannel(ctx, SessionEventsSignal)

	// Decided once, at the start of the run: every later branch of this
	// run follows the same version. From revision 1 the input decides, so
	// no marker is recorded.
	if in.Rev >= 1 {
		s.v = 1
		if err := s.await(ctx, ch, idle, perRun); err != nil {
			return SessionResult{}, err
		}
	} else {
		s.v = workflow.GetVersion(ctx, sessionChangeGraceLocal, workflow.DefaultVersion, 1)
	}
	// Revision 0's wait: a timer for every wait, cancelled by the events.
	for !s.state.Ended {
		// The idle deadline counts from the last event, so it survives
		// continue-as-new (LastEventAt is carried).
		wait := s.state.LastEventAt.Add(idle).Sub(workflow.Now(ctx))
		if wait <= 0 {
			s.end(EndByIdle)
			break
		}
		timerCtx, cancelTimer := workflow.WithCancel(ctx)
		s.wait(ctx, ch, workflow.NewTimer(timerCtx, wait))
		cancelTimer()
		// Take whatever else arrived in the same task before deciding.
		s.drain(ctx, ch)
		if s.state.Ended {
			break
		}
		if s.events >= perRun || workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			if err := s.continueAsNew(ctx, ch); err != nil {
				return SessionResult{}, err
			}
			break
		}
	}
	if s.v >= 1 {
		s.awaitReward(ctx, ch)
	}
	res, err := s.finish(ctx)
	if err != nil {
		return res, err
	}
	// Events that arrived while assembling (a late reward, a step of a
	// client that went on) belong to a next generation of the session.
	late := s.events
	s.drain(ctx, ch)
	if s.events > late {
		next := in
		next.Carry = &SessionCarry{
			Steps: s.state.Steps, Rewards: s.state.Rewards, FinalReward: s.state.FinalReward,
			LastEventAt: s.state.LastEventAt, Runs: s.state.Runs + 1, Generation: s.generation + 1,
		}
		workflow.GetLogger(ctx).Info("session events after assembly; next generation", "session_id", in.SessionID, "events", s.events-late)
		return res, workflow.NewContinueAsNewError(ctx, SessionWorkflow, next)
	}
	return res, nil
}

// await handles events until the session ends (revision 1): whatever is
// already buffered first, and one idle timer, armed only while nothing is
// buffered and re-armed only when it fires early (events came meanwhile),
// so a session whose events arrive together records no timer. A run past
// its event budget continues as new (the error).
func (s *sessionRun) await(ctx workflow.Context, ch workflow.ReceiveChannel, idle time.Duration, perRun int) error {
	var timer workflow.Future
	for {
		s.drain(ctx, ch)
		if s.state.Ended {
			return nil
		}
		if s.events >= perRun || workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			return s.continueAsNew(ctx, ch)
		}
		// The idle deadline counts from the last event, so it survives
		// continue-as-new (LastEventAt is carried).
		wait := s.state.LastEventAt.Add(idle).Sub(workflow.Now(ctx))
		if wait <= 0 {
			s.end(EndByIdle)
			return nil
		}
		if timer == nil {
			timer = workflow.NewTimer(ctx, wait)
		}
		if s.wait(ctx, ch, timer) {
			timer = nil
		}
	}
}

// wait applies the next batch of events, or returns true when timer fires
// first.
func (s *sessionRun) wait(ctx workflow.Context, ch workflow.ReceiveChannel, timer workflow.Future) (fired bool) {
	sel := workflow.NewSelector(ctx)
	sel.AddReceive(ch, func(c workflow.ReceiveChannel, _ bool) {
		var batch SessionEvents
		c.Receive(ctx, &batch)
		s.apply(ctx, batch)
	})
	sel.AddFuture(timer, func(workflow.Future) { fired = true })
	sel.Select(ctx)
	return fired
}

// continueAsNew hands the open session to a next run. Signals that arrive
// while it hands off would be lost with this run: they are drained first,
// and an end among them ends the session here instead (nil).
func (s *sessionRun) continueAsNew(ctx workflow.Context, ch workflow.ReceiveChannel) error {
	s.drain(ctx, ch)
	if s.state.Ended {
		return nil
	}
	next := s.in
	next.Carry = &SessionCarry{
		Steps: s.state.Steps, Rewards: s.state.Rewards, FinalReward: s.state.FinalReward,
		LastEventAt: s.state.LastEventAt, Runs: s.state.Runs + 1,
	}
	workflow.GetLogger(ctx).Info("session continues as new", "session_id", s.in.SessionID, "events", s.events)
	return workflow.NewContinueAsNewError(ctx, SessionWorkflow, next)
}

// awaitReward gives a session the client ended with no reward yet up to
// the reward grace for one to arrive.
func (s *sessionRun) awaitReward(ctx workflow.Context, ch workflow.ReceiveChannel) {
	grace := s.in.RewardGrace
	if grace == 0 {
		grace = DefaultRewardGrace
	}
	if grace < 0 || s.state.EndReason != EndByClient || s.state.Rewards > 0 {
		return
	}
	timerCtx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	timer := workflow.NewTimer(timerCtx, grace)
	expired := false
	for !expired && s.state.Rewards == 0 {
		expired = s.wait(ctx, ch, timer)
	}
	s.drain(ctx, ch)
}

// drain applies every signal already buffered without blocking.
func (s *sessionRun) drain(ctx workflow.Context, ch workflow.ReceiveChannel) {
	for {
		var batch SessionEvents
		if !ch.ReceiveAsync(&batch) {
			return
		}
		s.apply(ctx, batch)
	}
}

func (s *sessionRun) apply(ctx workflow.Context, batch SessionEvents) {
	for _, e := range batch.Events {
		s.events++
		switch e.Kind {
		case EventStep:
			s.state.Steps++
		case EventReward:
			s.state.Rewards++
			if e.Final {
				s.state.FinalReward = true
			}
		case EventEnd:
			s.end(EndByClient)
		default:
			workflow.GetLogger(ctx).Warn("session event of unknown kind ignored", "session_id", s.in.SessionID, "kind", e.Kind)
			continue
		}
		s.state.LastEventAt = workflow.Now(ctx)
	}
}

func (s *sessionRun) end(reason string) {
	if !s.state.Ended {
		s.state.Ended = true
		s.state.EndReason = reason
	}
}

// finish turns the session into training data. Each activity is idempotent
// (keys and unique constraints), so retries never duplicate a row.
func (s *sessionRun) finish(ctx workflow.Context) (SessionResult, error) {
	s.state.Phase = "finishing"
	retry := &temporal.RetryPolicy{
		InitialInterval:        time.Second,
		BackoffCoefficient:     2,
		MaximumInterval:        time.Minute,
		MaximumAttempts:        10,
		NonRetryableErrorTypes: []string{"BadInput"},
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 2 * time.Minute, RetryPolicy: retry})
	ctx = workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 2 * time.Minute, RetryPolicy: retry})
	// The finishing activities are short Postgres transactions on the
	// worker that runs the workflow: local activities record one marker
	// each instead of three events and a server round trip.
	execute := workflow.ExecuteActivity
	if s.v >= 1 {
		execute = workflow.ExecuteLocalActivity
	}
	info := workflow.GetInfo(ctx)
	// Discount 0 leaves γ to the worker's gateway.discount, the one the
	// export uses; a session started with its own γ keeps it.
	discount := s.in.Discount
	// The key is the first run's id (stable across continue-as-new
	// hand-offs and activity retries) and the generation.
	key := info.WorkflowExecution.ID + "/" + info.FirstRunID
	if s.generation > 0 {
		key += fmt.Sprintf("/%d", s.generation)
	}
	var asm AssembleOutput
	err := execute(ctx, AssembleTrajectoryActivity, AssembleInput{
		SessionID: s.in.SessionID, TenantID: s.in.TenantID, Key: key, Discount: discount,
	}).Get(ctx, &asm)
	if err != nil {
		return SessionResult{State: s.state}, fmt.Errorf("assemble trajectory: %w", err)
	}
	s.state.TrajectoryID, s.state.Eligible, s.state.TotalReward = asm.TrajectoryID, asm.Eligible, asm.TotalReward
	if asm.HasReward {
		_ = workflow.UpsertTypedSearchAttributes(ctx, RewardKey.ValueSet(asm.TotalReward))
	}
	var enq EnqueueOutput
	if asm.Eligible > 0 {
		err = execute(ctx, EnqueueSamplesActivity, EnqueueInput{
			TrajectoryID: asm.TrajectoryID, TenantID: s.in.TenantID,
		}).Get(ctx, &enq)
		if err != nil {
			return SessionResult{State: s.state}, fmt.Errorf("enqueue samples: %w", err)
		}
	}
	s.state.Enqueued = enq.Enqueued + enq.AlreadyQueued
	err = execute(ctx, EndSessionActivity, EndSessionInput{
		SessionID: s.in.SessionID, TenantID: s.in.TenantID, Reason: s.state.EndReason,
	}).Get(ctx, nil)
	if err != nil {
		return SessionResult{State: s.state}, fmt.Errorf("end session: %w", err)
	}
	s.state.Phase = "done"
	return SessionResult{State: s.state}, nil
}
