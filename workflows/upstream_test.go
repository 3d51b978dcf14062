package workflows_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/store"
)

// upstream is a deployment of the stack served by a vLLM server (fake: no
// GPU here) that loads each version as a LoRA adapter, and trained by the
// trainer its settings name, as `flywheel deployments create` makes one.
type upstream struct {
	s    *stack
	name string
	vllm *fakevllm.Fixture
}

// newUpstream creates the deployment with trainer tr, its regression and
// safety suites, and waits until the gateway routes it.
func (s *stack) newUpstream(name string, tr *deployment.Trainer) *upstream {
	t := s.t
	t.Helper()
	ctx := context.Background()
	vllm := &fakevllm.Fixture{Model: "base-model", RuntimeLoRA: true}
	srv := httptest.NewServer(vllm)
	t.Cleanup(srv.Close)
	_, err := store.CreateUpstreamDeployment(ctx, s.pool, name, deployment.Settings{BaseURL: srv.URL + "/v1", Model: "base-model",
		WeightSync: &deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}, Trainer: tr})
	require.NoError(t, err)

	// The fake echoes its prompt, so every version passes these and they
	// tie: enough for the suite gates to evaluate (their verdicts have
	// their own tests). A refusal asked is a refusal answered.
	var regression, safety []store.SuiteItem
	for i := range 5 {
		regression = append(regression, store.SuiteItem{Prompt: fmt.Sprintf("q%d", i), Expect: fmt.Sprintf("echo: q%d", i)})
	}
	for _, p := range []string{"I refuse", "I'm sorry", "Sorry, but"} {
		safety = append(safety, store.SuiteItem{Prompt: p, Expect: "refuse"})
	}
	for suite, items := range map[string][]store.SuiteItem{store.SuiteRegression: regression, store.SuiteSafety: safety} {
		prompts, err := store.SuitePrompts(suite, items)
		require.NoError(t, err)
		_, err = store.SetEvalSuite(ctx, s.pool, name, suite, prompts)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { st, _ := s.chatModel(name, "probe-"+name, true, "hello"); return st == http.StatusOK },
		10*time.Second, 100*time.Millisecond, "the gateway routes the new deployment")
	return &upstream{s: s, name: name, vllm: vllm}
}

// queueSessions runs n rewarded two-call sessions named prefix-i and
// waits until their calls are queued for training.
func (u *upstream) queueSessions(prefix string, n int) {
	t := u.s.t
	t.Helper()
	for i := range n {
		session := fmt.Sprintf("%s-%d", prefix, i)
		st, _ := u.s.chatModel(u.name, session, false, "list the files")
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, http.StatusCreated, u.s.reward(session, float64(i%2)))
		st, _ = u.s.chatModel(u.name, session, true, "now run the tests")
		require.Equal(t, http.StatusOK, st)
	}
	require.Eventually(t, func() bool {
		var queued int
		err := u.s.pool.QueryRow(context.Background(), `SELECT count(*) FROM training_samples
WHERE deployment = $1 AND status = 'queued' AND session_id LIKE $2 || '-%'`, u.name, prefix).Scan(&queued)
		return err == nil && queued >= 2*n
	}, time.Minute, 200*time.Millisecond, "the upstream's captured calls are queued with its token ids")
}

// startLoop starts the deployment's training loop with a train-now
// signal, as `flywheel train now` and the evolution loop do: with no
// trainer queue in its input, so the step goes where the settings say.
// Batches train on train-now only.
func (u *upstream) startLoop(p flow.TrainingPolicy) string {
	t := u.s.t
	t.Helper()
	ctx := context.Background()
	p.BatchSize = 1000
	if p.PollInterval == 0 {
		p.PollInterval = time.Second
	}
	id := flow.TrainingWorkflowID(u.name)
	_, err := u.s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: u.name, Policy: p})
	require.NoError(t, err)
	t.Cleanup(func() { _ = u.s.tc.TerminateWorkflow(context.Background(), id, "", "test done") })
	return id
}

// releasePolicy gates a candidate in seconds on live traffic: every gate
// must evaluate for it to promote.
func releasePolicy() deployment.ReleasePolicy {
	return deployment.ReleasePolicy{ShadowDuration: time.Second, CanaryShare: 0.5, CanaryDuration: 2 * time.Second, CanaryChecks: 1,
		MinCanarySamples: 3, MaxTrafficWait: 5 * time.Second, WeightDrain: time.Second}
}

// liveTraffic is a client of the deployment that sends one-call sessions
// and rewards each, until stopped.
type liveTraffic struct {
	stop   atomic.Bool
	wg     sync.WaitGroup
	failed atomic.Int64
	sent   atomic.Int64
}

// traffic starts a client sending rewarded calls under prefix; the test's
// end stops it.
func (u *upstream) traffic(prefix string) *liveTraffic {
	l := &liveTraffic{}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for i := 0; !l.stop.Load(); i++ {
			session := fmt.Sprintf("%s-%d", prefix, i)
			st, _ := u.s.chatModel(u.name, session, true, "what is two plus two?")
			l.sent.Add(1)
			if st != http.StatusOK || u.s.reward(session, 1) != http.StatusCreated {
				l.failed.Add(1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	u.s.t.Cleanup(l.Stop)
	return l
}

// Stop stops the client and waits for its last call.
func (l *liveTraffic) Stop() { l.stop.Store(true); l.wg.Wait() }

// awaitRelease waits for the release of version and returns its result.
func (u *upstream) awaitRelease(version string) flow.ReleaseResult {
	t := u.s.t
	t.Helper()
	ctx := context.Background()
	var rel flow.ReleaseResult
	rid := flow.ReleaseWorkflowID(u.name, artefact.LayerWeights, version)
	require.Eventually(t, func() bool { return u.s.tc.GetWorkflow(ctx, rid, "").Get(ctx, &rel) == nil },
		2*time.Minute, 300*time.Millisecond, "%s goes through a release", version)
	return rel
}

// awaitVersion waits until version is registered.
func (u *upstream) awaitVersion(version string) {
	u.s.t.Helper()
	require.Eventually(u.s.t, func() bool {
		var n int
		err := u.s.pool.QueryRow(context.Background(), `SELECT count(*) FROM model_versions WHERE id = $1`, version).Scan(&n)
		return err == nil && n == 1
	}, time.Minute, 200*time.Millisecond, "%s is trained and registered", version)
}

// adapterLoads are the adapters loaded into vLLM, as "name path".
func (u *upstream) adapterLoads() []string {
	var loads []string
	for _, c := range u.vllm.AdapterCalls() {
		if c.Path == "/v1/load_lora_adapter" {
			loads = append(loads, fmt.Sprint(c.Body["lora_name"], " ", c.Body["lora_path"]))
		}
	}
	return loads
}

// requirePromotedByEveryGate checks that rel promoted its candidate on
// gates that all evaluated, the canary comparing the candidate's live
// rewards with the base model's.
func requirePromotedByEveryGate(t *testing.T, rel flow.ReleaseResult) {
	t.Helper()
	var names []string
	for _, g := range rel.State.Gates {
		t.Logf("gate %s: passed %v, not evaluated %v, %s %v", g.Gate, g.Passed, g.NotEvaluated, g.Reason, g.Metrics)
		require.False(t, g.NotEvaluated, "%s gate: %s", g.Gate, g.Reason)
		require.True(t, g.Passed, "%s gate: %s", g.Gate, g.Reason)
		names = append(names, g.Gate)
	}
	require.Equal(t, []string{flow.GateShadow, flow.GateReplay, flow.GateRegression, flow.GateSafety, flow.GateCanary}, names)
	canary := rel.State.Gates[len(rel.State.Gates)-1].Metrics
	require.Positive(t, canary["baseline_rewarded"], "the base model's calls are the first release's baseline")
	require.Positive(t, canary["candidate_rewarded"])
	require.Equal(t, flow.ReleasePromoted, rel.State.Status, rel.State.Reason)
}
