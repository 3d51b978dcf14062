package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
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

// SessionWorkflow owns one session's lifecycle (workflow id = session id).
// The gateway signals SessionEventsSignal with ids of rows it committed; on
// end (client, or idle timeout) activities turn the session into a
// redacted, rewarded ATDP trajectory and queue its eligible steps.
func SessionWorkflow(ctx workflow.Context, in flow.SessionInput) (flow.SessionResult, error) {
	if in.SessionID == "" || in.TenantID == "" {
		return flow.SessionResult{}, temporal.NewNonRetryableApplicationError("session workflow needs SessionID and TenantID", "BadInput", nil)
	}
	s := &sessionRun{in: in}
	return s.run(ctx)
}

type sessionRun struct {
	in flow.SessionInput
	// v is the workflow's version of sessionChangeGraceLocal.
	v          workflow.Version
	generation int
	state      flow.SessionState
	// events handled by this run (the continue-as-new budget).
	events int
}

func (s *sessionRun) run(ctx workflow.Context) (flow.SessionResult, error) {
	in := s.in
	c := in.Carry
	if c == nil {
		c = &flow.SessionCarry{}
	}
	s.state = flow.SessionState{
		SessionID: in.SessionID, TenantID: in.TenantID, Deployment: in.Deployment,
		Steps: c.Steps, Rewards: c.Rewards, FinalReward: c.FinalReward,
		LastEventAt: c.LastEventAt, Phase: "open", Runs: c.Runs,
	}
	s.generation = c.Generation
	if s.state.LastEventAt.IsZero() {
		s.state.LastEventAt = workflow.Now(ctx)
	}
	// Handlers first, so a query during the first task already answers.
	if err := workflow.SetQueryHandler(ctx, flow.SessionStateQuery, func() (flow.SessionState, error) {
		return s.state, nil
	}); err != nil {
		return flow.SessionResult{}, fmt.Errorf("register state query: %w", err)
	}
	if _, set := workflow.GetTypedSearchAttributes(ctx).GetKeyword(flow.SessionIDKey); !set && c.Runs == 0 {
		// Started without them (before revision 1, or by hand).
		_ = workflow.UpsertTypedSearchAttributes(ctx,
			flow.SessionIDKey.ValueSet(in.SessionID), flow.TenantKey.ValueSet(in.TenantID), flow.DeploymentKey.ValueSet(in.Deployment))
	}
	idle := in.IdleTimeout
	if idle <= 0 {
		idle = flow.DefaultSessionIdleTimeout
	}
	perRun := in.EventsPerRun
	if perRun <= 0 {
		perRun = flow.DefaultSessionEventsPerRun
	}
	ch := workflow.GetSignalChannel(ctx, flow.SessionEventsSignal)

	// Decided once, at the start of the run: every later branch of this
	// run follows the same version. From revision 1 the input decides, so
	// no marker is recorded.
	if in.Rev >= 1 {
		s.v = 1
		if err := s.await(ctx, ch, idle, perRun); err != nil {
			return flow.SessionResult{}, err
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
			s.end(flow.EndByIdle)
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
				return flow.SessionResult{}, err
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
		next.Carry = &flow.SessionCarry{
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
			s.end(flow.EndByIdle)
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
		var batch flow.SessionEvents
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
	next.Carry = &flow.SessionCarry{
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
		grace = flow.DefaultRewardGrace
	}
	if grace < 0 || s.state.EndReason != flow.EndByClient || s.state.Rewards > 0 {
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
		var batch flow.SessionEvents
		if !ch.ReceiveAsync(&batch) {
			return
		}
		s.apply(ctx, batch)
	}
}

func (s *sessionRun) apply(ctx workflow.Context, batch flow.SessionEvents) {
	for _, e := range batch.Events {
		s.events++
		switch e.Kind {
		case flow.EventStep:
			s.state.Steps++
		case flow.EventReward:
			s.state.Rewards++
			if e.Final {
				s.state.FinalReward = true
			}
		case flow.EventEnd:
			s.end(flow.EndByClient)
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
func (s *sessionRun) finish(ctx workflow.Context) (flow.SessionResult, error) {
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
	var asm flow.AssembleOutput
	err := execute(ctx, aSession.AssembleTrajectory, flow.AssembleInput{
		SessionID: s.in.SessionID, TenantID: s.in.TenantID, Key: key, Discount: discount,
	}).Get(ctx, &asm)
	if err != nil {
		return flow.SessionResult{State: s.state}, fmt.Errorf("assemble trajectory: %w", err)
	}
	s.state.TrajectoryID, s.state.Eligible, s.state.TotalReward = asm.TrajectoryID, asm.Eligible, asm.TotalReward
	if asm.HasReward {
		_ = workflow.UpsertTypedSearchAttributes(ctx, flow.RewardKey.ValueSet(asm.TotalReward))
	}
	var enq flow.EnqueueOutput
	if asm.Eligible > 0 {
		err = execute(ctx, aSession.EnqueueSamples, flow.EnqueueInput{
			TrajectoryID: asm.TrajectoryID, TenantID: s.in.TenantID,
		}).Get(ctx, &enq)
		if err != nil {
			return flow.SessionResult{State: s.state}, fmt.Errorf("enqueue samples: %w", err)
		}
	}
	s.state.Enqueued = enq.Enqueued + enq.AlreadyQueued
	err = execute(ctx, aSession.EndSession, flow.EndSessionInput{
		SessionID: s.in.SessionID, TenantID: s.in.TenantID, Reason: s.state.EndReason,
	}).Get(ctx, nil)
	if err != nil {
		return flow.SessionResult{State: s.state}, fmt.Errorf("end session: %w", err)
	}
	s.state.Phase = "done"
	return flow.SessionResult{State: s.state}, nil
}
