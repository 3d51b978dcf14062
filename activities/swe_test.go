package activities_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"

	fwworker "github.com/flywheel-ai/flywheel/worker"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/sandboxtest"
	"github.com/flywheel-ai/flywheel/sandbox/sweagent"
	"github.com/flywheel-ai/flywheel/sandbox/sweagent/sweagenttest"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
	"github.com/flywheel-ai/flywheel/workflows"
)

// fakeGateway stands in for the flywheel gateway until the SWE end-to-end
// test can run against the real one: it serves the session and reward API
// the activities use, and forwards chat completions to the fixture model
// after checking they carry a known session. It records what it saw.
type fakeGateway struct {
	model *sweagenttest.FixtureModel

	mu       sync.Mutex
	sessions map[string]string // id -> task
	groups   map[string][]string
	rewards  map[string][]float64
	chats    map[string]int // per session
	next     int
}

func newFakeGateway(t *testing.T, model *sweagenttest.FixtureModel) (*fakeGateway, *httptest.Server) {
	g := &fakeGateway{model: model, sessions: map[string]string{}, groups: map[string][]string{}, rewards: map[string][]float64{}, chats: map[string]int{}}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return g, srv
}

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		sid := r.Header.Get("X-Session-Id")
		g.mu.Lock()
		_, ok := g.sessions[sid]
		if ok {
			g.chats[sid]++
		}
		g.mu.Unlock()
		if !ok {
			http.Error(w, `{"error":{"message":"unknown session"}}`, http.StatusNotFound)
			return
		}
		g.model.ServeHTTP(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions":
		var req struct {
			TaskID    string `json:"task_id"`
			GroupSize int    `json:"group_size"`
		}
		if json.NewDecoder(r.Body).Decode(&req) != nil || req.GroupSize < 1 {
			http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusUnprocessableEntity)
			return
		}
		g.mu.Lock()
		g.next++
		gid := fmt.Sprintf("grp_%d", g.next)
		var sessions []map[string]string
		for i := range req.GroupSize {
			id := fmt.Sprintf("sess_%d_%d", g.next, i)
			g.sessions[id] = req.TaskID
			g.groups[gid] = append(g.groups[gid], id)
			sessions = append(sessions, map[string]string{"id": id, "api_key": "k"})
		}
		g.mu.Unlock()
		out := map[string]any{"id": sessions[0]["id"], "api_key": "k", "group_size": req.GroupSize}
		if req.GroupSize > 1 {
			out["group_id"], out["sessions"] = gid, sessions
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(out)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/sessions/") && strings.HasSuffix(r.URL.Path, "/reward"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/sessions/"), "/reward")
		var req struct {
			Value  *float64 `json:"value"`
			Source string   `json:"source"`
			Final  bool     `json:"final"`
		}
		if json.NewDecoder(r.Body).Decode(&req) != nil || req.Value == nil || req.Source != flow.SWERewardSource || !req.Final {
			http.Error(w, `{"error":{"message":"bad reward"}}`, http.StatusUnprocessableEntity)
			return
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if _, ok := g.sessions[id]; !ok {
			http.Error(w, `{"error":{"message":"unknown session"}}`, http.StatusNotFound)
			return
		}
		g.rewards[id] = append(g.rewards[id], *req.Value)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{}`))
	default:
		http.NotFound(w, r)
	}
}

func (g *fakeGateway) snapshot() (rewards map[string][]float64, chats map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rewards, chats = map[string][]float64{}, map[string]int{}
	for k, v := range g.rewards {
		rewards[k] = append([]float64(nil), v...)
	}
	for k, v := range g.chats {
		chats[k] = v
	}
	return rewards, chats
}

func sweActivities(t *testing.T, gatewayURL string) (*activities.SWEActivities, *client.Client) {
	t.Helper()
	cli := sandboxtest.Docker(t)
	m := sandboxtest.Manager(t, cli, sandbox.Config{})
	return &activities.SWEActivities{
		Sandboxes:      m,
		Images:         &tasks.Images{Client: cli},
		Gateway:        &activities.SWEGatewayHTTP{BaseURL: gatewayURL, APIKey: "test"},
		Agent:          sweagent.Config{BaseURL: gatewayURL + "/v1", Model: "fixture", MaxToolCalls: 20},
		HeartbeatEvery: 200 * time.Millisecond,
	}, cli
}

func requireRemoved(t *testing.T, cli *client.Client, id string) {
	t.Helper()
	_, err := cli.ContainerInspect(context.Background(), id, client.ContainerInspectOptions{})
	require.Error(t, err, "sandbox %s must be released", id)
}

// TestSWERolloutWithFixtureModel runs SWERolloutWorkflow with the real
// activities (Docker sandbox, task image, agent loop, hidden-test grading)
// in the Temporal test environment.
func TestSWERolloutWithFixtureModel(t *testing.T) {
	tk, err := tasks.Find("flatten")
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		script []sweagenttest.Step
		reward float64
	}{
		"solves": {sweagenttest.SolveScript(tk.Solution), 1},
		// Changing nothing fixes nothing: the tests that passed already
		// earn no reward.
		"gives up": {[]sweagenttest.Step{{Tool: "submit", Args: map[string]any{"summary": "nothing"}}}, 0},
	} {
		t.Run(name, func(t *testing.T) {
			gw, srv := newFakeGateway(t, &sweagenttest.FixtureModel{Script: tc.script})
			a, cli := sweActivities(t, srv.URL)
			var suite testsuite.WorkflowTestSuite
			env := newWorkflowEnv(&suite)
			// Real activities: the first may build the task image (tens of
			// seconds), far past the test environment's 3 s default.
			env.SetTestTimeout(5 * time.Minute)
			workflows.RegisterSWEWorkflows(env)
			fwworker.RegisterSWE(env, a)
			env.ExecuteWorkflow(workflows.SWERolloutWorkflow, flow.SWERolloutInput{TaskID: tk.ID})
			require.NoError(t, env.GetWorkflowError())
			var out flow.SWERolloutResult
			require.NoError(t, env.GetWorkflowResult(&out))
			require.Equal(t, sweagent.StopSubmitted, out.StopReason)
			require.Equal(t, tc.reward, out.Reward)
			require.Equal(t, tc.reward == 1, out.Resolved)
			require.Equal(t, len(tk.PassToPass), out.PassToPass, "no passing test broke")
			require.Equal(t, int(tc.reward)*len(tk.FailToPass), out.FailToPass)
			rewards, chats := gw.snapshot()
			require.Equal(t, map[string][]float64{out.SessionID: {tc.reward}}, rewards)
			require.Equal(t, len(tc.script), chats[out.SessionID], "every model call went through the gateway under the session")
			requireRemoved(t, cli, out.SandboxID)
		})
	}
}

// TestSWEGroupOnTemporalDevServer runs a GRPO group of two rollouts through
// a real Temporal dev server and worker.
func TestSWEGroupOnTemporalDevServer(t *testing.T) {
	tc := testenv.Temporal(t)
	tk, err := tasks.Find("median")
	require.NoError(t, err)
	gw, srv := newFakeGateway(t, &sweagenttest.FixtureModel{Script: sweagenttest.SolveScript(tk.Solution)})
	a, cli := sweActivities(t, srv.URL)
	a.PoolSize = 2

	w := tworker.New(tc, flow.SWETaskQueue, tworker.Options{})
	workflows.RegisterSWEWorkflows(w)
	fwworker.RegisterSWE(w, a)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run, err := tc.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{ID: "swe-group-it", TaskQueue: flow.SWETaskQueue},
		flow.SWEGroupWorkflowName, flow.SWEGroupInput{TaskID: tk.ID, GroupSize: 2})
	require.NoError(t, err)
	var out flow.SWEGroupResult
	require.NoError(t, run.Get(ctx, &out))
	require.Equal(t, 0, out.Failed)
	require.Equal(t, 2, out.Resolved)
	require.Equal(t, 1.0, out.MeanReward)
	require.NotEmpty(t, out.GroupID)
	rewards, _ := gw.snapshot()
	require.Len(t, rewards, 2)
	for _, r := range out.Rollouts {
		require.Equal(t, []float64{1}, rewards[r.SessionID])
		requireRemoved(t, cli, r.SandboxID)
	}
	testenv.RecordHistory(t, tc, run.GetID(), filepath.Join("..", "workflows", "testdata", "swe_group.history.json"))
}
