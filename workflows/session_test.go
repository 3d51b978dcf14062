package workflows

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// sessionActs records what SessionWorkflow asked of its activities; the
// real ones are tested against Postgres in package activities.
type sessionActs struct {
	assembled []flow.AssembleInput
	enqueued  []flow.EnqueueInput
	ended     []flow.EndSessionInput
	// failAssemble fails this many first attempts.
	failAssemble int
	// duringAssemble runs inside the assemble activity.
	duringAssemble func()
}

func (a *sessionActs) register(env *testsuite.TestWorkflowEnvironment) {
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.AssembleInput) (flow.AssembleOutput, error) {
		a.assembled = append(a.assembled, in)
		if a.duringAssemble != nil {
			a.duringAssemble()
			a.duringAssemble = nil
		}
		if len(a.assembled) <= a.failAssemble {
			return flow.AssembleOutput{}, errors.New("postgres went away")
		}
		return flow.AssembleOutput{TrajectoryID: 7, Steps: 3, Eligible: 2, TotalReward: 1.5, HasReward: true}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSession.AssembleTrajectory)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.EnqueueInput) (flow.EnqueueOutput, error) {
		a.enqueued = append(a.enqueued, in)
		return flow.EnqueueOutput{Enqueued: 2, EligibleSteps: 2}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSession.EnqueueSamples)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.EndSessionInput) error {
		a.ended = append(a.ended, in)
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSession.EndSession)})
}

func newSessionEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *sessionActs) {
	var ts testsuite.WorkflowTestSuite
	env := newWorkflowEnv(&ts)
	env.RegisterWorkflowWithOptions(SessionWorkflow, workflow.RegisterOptions{Name: flow.SessionWorkflowName})
	acts := &sessionActs{}
	acts.register(env)
	return env, acts
}

// forRevs runs a test against every revision of SessionWorkflow still
// started (SessionRevision) or replayed (0).
func forRevs(t *testing.T, test func(t *testing.T, rev int)) {
	for _, rev := range []int{0, flow.SessionRevision} {
		t.Run(fmt.Sprintf("rev%d", rev), func(t *testing.T) { test(t, rev) })
	}
}

func signalAt(env *testsuite.TestWorkflowEnvironment, d time.Duration, events ...flow.SessionEvent) {
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(flow.SessionEventsSignal, flow.SessionEvents{Events: events})
	}, d)
}

func steps(n int) []flow.SessionEvent {
	out := make([]flow.SessionEvent, n)
	for i := range out {
		out[i] = flow.SessionEvent{Kind: flow.EventStep, InteractionID: int64(i + 1)}
	}
	return out
}

func TestSessionEndsOnClientEndAndQueuesSamples(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		signalAt(env, time.Minute, steps(2)...)
		signalAt(env, 2*time.Minute, flow.SessionEvent{Kind: flow.EventReward, RewardID: 9, Final: true})
		env.RegisterDelayedCallback(func() {
			v, err := env.QueryWorkflow(flow.SessionStateQuery)
			require.NoError(t, err)
			var st flow.SessionState
			require.NoError(t, v.Get(&st))
			require.Equal(t, 2, st.Steps)
			require.Equal(t, 1, st.Rewards)
			require.Equal(t, "open", st.Phase)
		}, 2*time.Minute+time.Second)
		signalAt(env, 3*time.Minute, flow.SessionEvent{Kind: flow.EventEnd})

		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", Deployment: "d", Discount: 0.9})
		require.True(t, env.IsWorkflowCompleted())
		require.NoError(t, env.GetWorkflowError())
		var res flow.SessionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, flow.EndByClient, res.State.EndReason)
		require.Equal(t, "done", res.State.Phase)
		require.Equal(t, 2, res.State.Enqueued)
		require.Equal(t, int64(7), res.State.TrajectoryID)
		require.Len(t, acts.assembled, 1)
		require.Equal(t, 0.9, acts.assembled[0].Discount)
		require.Equal(t, "s1", acts.assembled[0].SessionID)
		require.Equal(t, []flow.EnqueueInput{{TrajectoryID: 7, TenantID: "t1"}}, acts.enqueued)
		require.Equal(t, []flow.EndSessionInput{{SessionID: "s1", TenantID: "t1", Reason: flow.EndByClient}}, acts.ended)
	})
}

func TestSessionIdleTimeoutEndsIt(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		signalAt(env, time.Minute, steps(1)...)
		// A second event pushes the deadline: idle counts from the last event.
		signalAt(env, 9*time.Minute, steps(1)...)
		start := env.Now()
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", IdleTimeout: 10 * time.Minute})
		require.NoError(t, env.GetWorkflowError())
		var res flow.SessionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, flow.EndByIdle, res.State.EndReason)
		require.Equal(t, 2, res.State.Steps)
		require.GreaterOrEqual(t, env.Now().Sub(start), 19*time.Minute)
		require.Len(t, acts.ended, 1)
		require.Equal(t, flow.EndByIdle, acts.ended[0].Reason)
	})
}

func continueAsNewInput(t *testing.T, err error) flow.SessionInput {
	t.Helper()
	var next flow.SessionInput
	decodeContinueAsNew(t, err, &next)
	return next
}

// decodeContinueAsNew checks err is a continue-as-new and decodes its input.
func decodeContinueAsNew(t *testing.T, err error, into any) {
	t.Helper()
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(err, &can), "want continue-as-new, got %v", err)
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, into))
}

func workflowRegisterOptions(name string) workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: name}
}

func TestSessionContinuesAsNewWithSignalsDrained(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		// The first batch crosses the per-run budget; the second and third
		// arrive in the same instant, while the run decides to hand off: they
		// must be carried, not lost.
		env.RegisterDelayedCallback(func() {
			env.SignalWorkflowSkippingWorkflowTask(flow.SessionEventsSignal, flow.SessionEvents{Events: steps(3)})
			env.SignalWorkflowSkippingWorkflowTask(flow.SessionEventsSignal, flow.SessionEvents{Events: steps(2)})
			env.SignalWorkflow(flow.SessionEventsSignal, flow.SessionEvents{Events: []flow.SessionEvent{{Kind: flow.EventReward, RewardID: 1}}})
		}, time.Minute)
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", EventsPerRun: 3, IdleTimeout: time.Hour})
		next := continueAsNewInput(t, env.GetWorkflowError())
		require.NotNil(t, next.Carry)
		require.Equal(t, 5, next.Carry.Steps)
		require.Equal(t, 1, next.Carry.Rewards)
		require.Equal(t, 1, next.Carry.Runs)
		require.Equal(t, "s1", next.SessionID)
		require.Equal(t, 3, next.EventsPerRun)
		require.Empty(t, acts.assembled, "a run that hands off must not finish the session")

		// The next run starts from the carry and keeps the idle deadline of the
		// last event, not of the hand-off.
		env2, acts2 := newSessionEnv(t)
		next.Carry.LastEventAt = env2.Now().Add(-50 * time.Minute)
		start := env2.Now()
		env2.ExecuteWorkflow(SessionWorkflow, next)
		require.NoError(t, env2.GetWorkflowError())
		var res flow.SessionResult
		require.NoError(t, env2.GetWorkflowResult(&res))
		require.Equal(t, 5, res.State.Steps)
		require.Equal(t, flow.EndByIdle, res.State.EndReason)
		require.Less(t, env2.Now().Sub(start), 11*time.Minute)
		require.Len(t, acts2.assembled, 1)
		require.NotEmpty(t, acts2.assembled[0].Key)
	})
}

func TestSessionEndDrainedAtHandOffFinishesInstead(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		env.RegisterDelayedCallback(func() {
			env.SignalWorkflowSkippingWorkflowTask(flow.SessionEventsSignal, flow.SessionEvents{Events: steps(3)})
			env.SignalWorkflow(flow.SessionEventsSignal, flow.SessionEvents{Events: []flow.SessionEvent{{Kind: flow.EventEnd}}})
		}, time.Minute)
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", EventsPerRun: 3})
		require.NoError(t, env.GetWorkflowError(), "the done flag must be re-checked before continuing as new")
		var res flow.SessionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, flow.EndByClient, res.State.EndReason)
		require.Equal(t, 3, res.State.Steps)
		require.Len(t, acts.assembled, 1)
	})
}

func TestSessionRetriesFailedActivityWithTheSameKey(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		acts.failAssemble = 2
		signalAt(env, time.Minute, append(steps(1), flow.SessionEvent{Kind: flow.EventEnd})...)
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1"})
		require.NoError(t, env.GetWorkflowError())
		require.Len(t, acts.assembled, 3)
		// Every attempt carries the same idempotency key, which is what keeps a
		// retry from writing a second trajectory.
		require.Equal(t, acts.assembled[0].Key, acts.assembled[2].Key)
		require.Len(t, acts.enqueued, 1)
	})
}

func TestSessionRejectsMissingIDs(t *testing.T) {
	env, _ := newSessionEnv(t)
	env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{SessionID: "s1"})
	err := env.GetWorkflowError()
	require.Error(t, err)
	require.Contains(t, err.Error(), "TenantID")
}

func TestSessionIgnoresUnknownEventKinds(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, _ := newSessionEnv(t)
		signalAt(env, time.Minute, flow.SessionEvent{Kind: "bogus"}, flow.SessionEvent{Kind: flow.EventStep}, flow.SessionEvent{Kind: flow.EventEnd})
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1"})
		require.NoError(t, env.GetWorkflowError())
		var res flow.SessionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, 1, res.State.Steps)
	})
}

func TestSessionLateRewardDuringAssemblyStartsTheNextGeneration(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		acts.duringAssemble = func() {
			env.SignalWorkflowSkippingWorkflowTask(flow.SessionEventsSignal, flow.SessionEvents{Events: []flow.SessionEvent{{Kind: flow.EventReward, RewardID: 5, Final: true}}})
		}
		signalAt(env, time.Minute, append(steps(2), flow.SessionEvent{Kind: flow.EventEnd})...)
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", IdleTimeout: time.Hour})
		next := continueAsNewInput(t, env.GetWorkflowError())
		require.Len(t, acts.ended, 1, "the first generation was assembled and ended")
		require.Equal(t, 1, next.Carry.Generation)
		require.Equal(t, 1, next.Carry.Rewards)
		require.Equal(t, 2, next.Carry.Steps)

		env2, acts2 := newSessionEnv(t)
		env2.ExecuteWorkflow(SessionWorkflow, next)
		require.NoError(t, env2.GetWorkflowError())
		require.Len(t, acts2.assembled, 1)
		require.NotEqual(t, acts.assembled[0].Key, acts2.assembled[0].Key, "the next generation assembles a new trajectory")
		require.True(t, strings.HasSuffix(acts2.assembled[0].Key, "/1"))
	})
}

func TestSessionWaitsTheRewardGraceForARewardAfterTheEnd(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		signalAt(env, time.Minute, append(steps(1), flow.SessionEvent{Kind: flow.EventEnd})...)
		// The agent posts its reward just after its last call.
		signalAt(env, time.Minute+2*time.Second, flow.SessionEvent{Kind: flow.EventReward, RewardID: 3, Final: true})
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", IdleTimeout: time.Hour})
		require.NoError(t, env.GetWorkflowError(), "no second generation: the reward was in time")
		var res flow.SessionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, 1, res.State.Rewards)
		require.Len(t, acts.assembled, 1)
		require.Len(t, acts.ended, 1)
	})
}

func TestSessionWithoutRewardIsAssembledAfterTheGrace(t *testing.T) {
	forRevs(t, func(t *testing.T, rev int) {
		env, acts := newSessionEnv(t)
		var assembledAt time.Time
		acts.duringAssemble = func() { assembledAt = env.Now() }
		start := env.Now()
		signalAt(env, time.Minute, append(steps(1), flow.SessionEvent{Kind: flow.EventEnd})...)
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", IdleTimeout: time.Hour, RewardGrace: 3 * time.Second})
		require.NoError(t, env.GetWorkflowError())
		require.Len(t, acts.assembled, 1)
		require.Equal(t, time.Minute+3*time.Second, assembledAt.Sub(start).Round(time.Second))
	})
}

// TestSessionRev1ArmsOneIdleTimerAtATime: revision 0 starts and cancels a
// timer for every batch of events; revision 1 keeps one armed and re-arms
// it only when it fires early, so each batch costs the server no timer.
func TestSessionRev1ArmsOneIdleTimerAtATime(t *testing.T) {
	timers := map[int]int{}
	forRevs(t, func(t *testing.T, rev int) {
		env, _ := newSessionEnv(t)
		env.SetOnTimerScheduledListener(func(string, time.Duration) { timers[rev]++ })
		for i := 1; i <= 5; i++ {
			signalAt(env, time.Duration(i)*time.Minute, steps(1)...)
		}
		start := env.Now()
		env.ExecuteWorkflow(SessionWorkflow, flow.SessionInput{Rev: rev, SessionID: "s1", TenantID: "t1", IdleTimeout: 10 * time.Minute})
		require.NoError(t, env.GetWorkflowError())
		var res flow.SessionResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, flow.EndByIdle, res.State.EndReason)
		require.Equal(t, 5, res.State.Steps)
		// Idle counts from the last event (5 min) in both.
		require.Equal(t, 15*time.Minute, env.Now().Sub(start).Round(time.Second))
	})
	require.Equal(t, 6, timers[0], "revision 0: one timer per wait")
	require.Equal(t, 2, timers[flow.SessionRevision], "revision 1: the first, and one re-armed when it fired early")
}
