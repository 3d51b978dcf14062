package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/testenv"
)

// flakyStarter is the real Temporal client with an outage in front: its
// first `fail` calls error, as they would while the frontend is down.
type flakyStarter struct {
	client.Client
	fail atomic.Int64
}

func (f *flakyStarter) SignalWithStartWorkflow(ctx context.Context, id, signal string, arg any,
	opts client.StartWorkflowOptions, wf any, args ...any) (client.WorkflowRun, error) {
	if f.fail.Add(-1) >= 0 {
		return nil, errors.New("frontend unavailable")
	}
	return f.Client.SignalWithStartWorkflow(ctx, id, signal, arg, opts, wf, args...)
}

// signals returns the session-events payloads a workflow received, in order.
func signals(t *testing.T, c client.Client, workflowID string) []flow.SessionEvents {
	t.Helper()
	it := c.GetWorkflowHistory(context.Background(), workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var out []flow.SessionEvents
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return nil
		}
		if a := ev.GetWorkflowExecutionSignaledEventAttributes(); a != nil && a.SignalName == flow.SessionEventsSignal {
			var se flow.SessionEvents
			require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(a.Input, &se))
			out = append(out, se)
		}
	}
	return out
}

// TestNotifierDeliversBatchedNoticesThroughOutage runs the gateway with
// the real Temporal dev server: steps and rewards reach the session's
// workflow as batched signals with ids only, after an outage too, while
// the model calls themselves never waited.
func TestNotifierDeliversBatchedNoticesThroughOutage(t *testing.T) {
	tc := testenv.Temporal(t)
	starter := &flakyStarter{Client: tc}
	starter.fail.Store(2)
	n := gateway.NewTemporalNotifier(starter, 50*time.Millisecond, slog.New(slog.DiscardHandler))
	e := newEnv(t, envOpts{notifier: n})

	st, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel, "group_size": 2, "task_id": "task-9"})
	require.Equal(t, 201, st)
	sid := created["id"].(string)
	wid := flow.SessionWorkflowID("acme", sid)
	var ids []string
	for range 3 {
		_, c := e.doJSON("POST", "/v1/chat/completions", created["api_key"].(string), chatBody("go"))
		ids = append(ids, c["id"].(string))
	}
	e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": ids[0], "value": 1})
	e.doJSON("POST", "/v1/sessions/"+sid+"/end", e.keyA, nil)

	var got []flow.SessionEvent
	eventually(t, func() bool {
		got = got[:0]
		for _, s := range signals(t, tc, wid) {
			got = append(got, s.Events...)
		}
		return len(got) == 5
	}, "3 steps, 1 reward and the end arrive despite the outage")
	kinds := []string{}
	for _, ev := range got {
		kinds = append(kinds, ev.Kind)
	}
	require.Equal(t, []string{"step", "step", "step", "reward", "end"}, kinds)
	require.NotZero(t, got[0].InteractionID)
	require.NotZero(t, got[3].RewardID)
	raw, _ := json.Marshal(got)
	require.NotContains(t, string(raw), "go", "notices carry ids, never content")

	desc, err := tc.DescribeWorkflowExecution(context.Background(), wid, "")
	require.NoError(t, err)
	require.Equal(t, flow.SessionWorkflowName, desc.WorkflowExecutionInfo.Type.Name)
	require.Equal(t, flow.SessionTaskQueue, desc.WorkflowExecutionInfo.TaskQueue)
	var input flow.SessionInput
	hist := tc.GetWorkflowHistory(context.Background(), wid, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	first, err := hist.Next()
	require.NoError(t, err)
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(first.GetWorkflowExecutionStartedEventAttributes().Input, &input))
	require.Equal(t, "task-9", input.TaskID)
	require.Equal(t, 2, input.GroupSize, "an explicit session starts its workflow with its group")
}

// TestOutboxStartsTheWorkflowsADeadGatewayOwed: a gateway dies with its
// notices in memory (its notifier never flushes and is never closed, as
// after a SIGKILL). Its sessions are committed but their workflows never
// started; the session rows say so. A gateway started after it has nothing
// of theirs in memory, and its reconciler starts every one of them from
// Postgres, with the end of the session the client had ended.
func TestOutboxStartsTheWorkflowsADeadGatewayOwed(t *testing.T) {
	tc := testenv.Temporal(t)
	dead := gateway.NewTemporalNotifier(tc, time.Hour, slog.New(slog.DiscardHandler))
	e := newEnv(t, envOpts{notifier: dead})
	prefix := fmt.Sprintf("outbox-%d-", time.Now().UnixNano())
	for i := range 5 {
		st, body := e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("hello"), "X-Session-Id", prefix+strconv.Itoa(i))
		require.Equal(t, 200, st, body)
	}
	st, _ := e.doJSON("POST", "/v1/sessions/"+prefix+"0/end", e.keyA, nil)
	require.Equal(t, 200, st)
	ctx := context.Background()
	unnotified := func() (n int) {
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM sessions WHERE tenant_id = 'acme' AND id LIKE $1 || '%' AND notified_at IS NULL`, prefix).Scan(&n))
		return n
	}
	require.Equal(t, 5, unnotified(), "committed, and no notice reached Temporal")

	restarted := gateway.NewTemporalNotifier(tc, 50*time.Millisecond, slog.New(slog.DiscardHandler))
	restarted.UseOutbox(e.pool)
	t.Cleanup(func() { restarted.Close(ctx) })
	require.Eventually(t, func() bool { return unnotified() == 0 }, 30*time.Second, 100*time.Millisecond, "the reconciler notifies every session")
	for i := range 5 {
		id := flow.SessionWorkflowID("acme", prefix+strconv.Itoa(i))
		_, err := tc.DescribeWorkflowExecution(ctx, id, "")
		require.NoError(t, err, "%s has its workflow", id)
		if i == 0 {
			var kinds []string
			for _, s := range signals(t, tc, id) {
				for _, ev := range s.Events {
					kinds = append(kinds, ev.Kind)
				}
			}
			require.Contains(t, kinds, flow.EventEnd, "the ended session's workflow hears of its end")
		}
	}
}

// TestNotifierSendsAShortSessionInOneSignal: a group session's bare start,
// its one call (which ends it) and the reward that follows reach the
// workflow as one signal (such a batch costs the workflow one task and no
// timer: TestSessionRev1ArmsOneIdleTimerAtATime and the integration
// test's history); a session nobody uses still starts its workflow.
func TestNotifierSendsAShortSessionInOneSignal(t *testing.T) {
	tc := testenv.Temporal(t)
	n := gateway.NewTemporalNotifier(tc, 50*time.Millisecond, slog.New(slog.DiscardHandler))
	e := newEnv(t, envOpts{notifier: n})

	st, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel, "group_size": 2, "task_id": "task-1"})
	require.Equal(t, 201, st)
	var sids, keys []string
	for _, s := range created["sessions"].([]any) {
		m := s.(map[string]any)
		sids, keys = append(sids, m["id"].(string)), append(keys, m["api_key"].(string))
	}
	time.Sleep(300 * time.Millisecond) // several flushes pass before the agent's call
	st, _ = e.doJSON("POST", "/v1/chat/completions", keys[0], chatBody("go"), "X-Session-Id", sids[0], "X-Session-Done", "true")
	require.Equal(t, 200, st)
	time.Sleep(300 * time.Millisecond) // and before its reward
	st, _ = e.doJSON("POST", "/v1/sessions/"+sids[0]+"/reward", keys[0], map[string]any{"value": 1, "final": true})
	require.Equal(t, 201, st)

	ctx := context.Background()
	used := flow.SessionWorkflowID("acme", sids[0])
	var got []flow.SessionEvents
	eventually(t, func() bool {
		got = signals(t, tc, used)
		return len(got) > 0
	}, "the used session's workflow starts")
	time.Sleep(2 * gateway.NoticeHold) // nothing else is on its way
	got = signals(t, tc, used)
	require.Len(t, got, 1, "start, call, end and reward travel as one signal")
	var kinds []string
	for _, ev := range got[0].Events {
		kinds = append(kinds, ev.Kind)
	}
	require.Equal(t, []string{flow.EventStep, flow.EventEnd, flow.EventReward}, kinds)

	idle := flow.SessionWorkflowID("acme", sids[1])
	eventually(t, func() bool {
		_, err := tc.DescribeWorkflowExecution(ctx, idle, "")
		return err == nil
	}, "the unused session's workflow starts after the hold")
	require.Empty(t, signals(t, tc, idle)[0].Events, "with no events")
}
