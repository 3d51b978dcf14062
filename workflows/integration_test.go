package workflows_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakeopenai"
	"github.com/flywheel-ai/flywheel/internal/policytest"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/redact"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/tinkerserver"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trajectory"
	"github.com/flywheel-ai/flywheel/workflows"
)

const policyName = "flywheel-policy"

// stack is the real thing on the real services: Postgres, a Temporal dev
// server, a worker with Flywheel's workflows and activities, and the
// gateway serving the policy from its model server, trained by the
// embedded trainer behind the Tinker API, as `flywheel up` does.
type stack struct {
	t    *testing.T
	pool *pgxpool.Pool
	tc   client.Client
	// policy is the policy's model server and deployment; engines are the
	// gates' engines, which reach it over HTTP.
	policy  *policytest.Policy
	engines *activities.Engines
	// base is the policy's base model, which serves as version 0.
	base *trainer.Model
	// trainer is the policy deployment's trainer.
	trainer *trainerService
	// reflector is the policy deployment's reflector.
	reflector *fakeopenai.Server
	url       string
	key       string
	// dir holds checkpoints and batch files, shared by the control plane
	// and the trainer workers as a deployment's volume would be.
	dir string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	pool := testenv.Pool(t)
	tc := testenv.Temporal(t)
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)

	m, err := trainer.NewModel(trainer.ModelConfig{Context: 512, Layers: 1, Heads: 2, DModel: 32}, 3)
	require.NoError(t, err)
	dir := t.TempDir()
	// The base model serves as v0 and the embedded trainer starts from it;
	// trained versions are saved beside v0's checkpoint.
	tr := startTrainerService(t, m, filepath.Join(dir, "trainer-server"))
	policy := policytest.Start(t, pool, policytest.Options{Name: policyName, Base: m, Dir: filepath.Join(dir, "checkpoints"),
		Trainer: &deployment.Trainer{Kind: deployment.TrainerTinker, URL: tr.url, BaseModel: policyName, LoRA: deployment.LoRA{FullWeights: true}}})
	// A held-out suite, so that releases can promote. The tiny random
	// policy answers noise, so no version passes any of it: equal
	// versions tie, which is all these tests need of the regression gate
	// (it has its own tests).
	var items []store.SuiteItem
	for i := 0; i < 100; i++ {
		items = append(items, store.SuiteItem{Prompt: fmt.Sprintf("held-out question %d", i), Expect: "an answer noise never gives",
			Match: store.MatchExact, MaxTokens: 8})
	}
	prompts, err := store.SuitePrompts(store.SuiteRegression, items)
	require.NoError(t, err)
	_, err = store.SetEvalSuite(ctx, pool, policyName, store.SuiteRegression, prompts)
	require.NoError(t, err)

	red, err := redact.New(redact.Options{})
	require.NoError(t, err)
	// Gates answer on each deployment's own engine, as cmd/flywheel wires
	// them: the policy's on its model server.
	engines := &activities.Engines{DB: pool, Timeout: 10 * time.Second}
	// The policy's reflector is a fake hosted model behind an "openai"
	// upstream; evolution asks it through the gateway below.
	reflector := &fakeopenai.Server{Script: func(fakeopenai.Request) fakeopenai.Reply { return fakeopenai.Reply{Text: `{"deltas": []}`} }}
	rs := httptest.NewServer(reflector)
	t.Cleanup(rs.Close)
	_, err = store.CreateUpstreamDeployment(ctx, pool, "reflector", deployment.Settings{BaseURL: rs.URL + "/v1", Dialect: deployment.DialectOpenAI})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE deployments SET config = config || '{"evolution": {"reflector": "reflector"}}' WHERE name = $1`, policyName)
	require.NoError(t, err)
	refl := &activities.GatewayReflector{}
	for _, q := range []string{flow.TaskQueue, flow.SessionTaskQueue} {
		w := tworker.New(tc, q, tworker.Options{})
		register(w, pool, red, engines, refl, tc, dir)
		require.NoError(t, w.Start())
		t.Cleanup(w.Stop)
	}

	cfg := config.Default().Gateway
	cfg.RateLimitRPS = 0
	cfg.NotifyInterval = 50 * time.Millisecond
	notifier := gateway.NewTemporalNotifier(tc, cfg.NotifyInterval, logger)
	srv, err := gateway.New(cfg, gateway.Deps{DB: pool, Logger: logger, Notifier: notifier})
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	require.NoError(t, store.EnsureTenant(ctx, pool, "acme"))
	key, err := store.CreateKey(ctx, pool, "acme", "", "test")
	require.NoError(t, err)
	require.NoError(t, store.EnsureTenant(ctx, pool, "ops"))
	refl.URL = ts.URL
	if refl.APIKey, err = store.CreateKey(ctx, pool, "ops", "", "operator"); err != nil {
		t.Fatal(err)
	}
	return &stack{t: t, pool: pool, tc: tc, policy: policy, engines: engines, base: m, trainer: tr, url: ts.URL, key: key, dir: dir,
		reflector: reflector}
}

// trainerWorker drives the policy's trainer: a worker on the Tinker queue
// with the Tinker step as the trainer protocol's TrainBatch, as
// worker.Registrations registers it on every worker. It has no database
// and reads and writes only the stack's shared files.
func (s *stack) trainerWorker(heartbeat time.Duration) tworker.Worker {
	w := tworker.New(s.tc, deployment.TinkerQueue, tworker.Options{})
	a := &activities.TinkerTraining{HeartbeatEvery: heartbeat, Logger: slog.New(slog.DiscardHandler)}
	w.RegisterActivityWithOptions(a.TrainBatch, activity.RegisterOptions{Name: flow.TrainBatchActivity})
	w.RegisterActivity(a.PruneStates)
	return w
}

// startTrainer starts a trainerWorker, stopped at cleanup.
func (s *stack) startTrainer(heartbeat time.Duration) tworker.Worker {
	s.t.Helper()
	w := s.trainerWorker(heartbeat)
	require.NoError(s.t, w.Start())
	s.t.Cleanup(w.Stop)
	return w
}

// weightsOf loads a version the trainer saved: its directory holds the
// full weights.
func (s *stack) weightsOf(version string) *trainer.Model {
	s.t.Helper()
	var dir string
	require.NoError(s.t, s.pool.QueryRow(context.Background(), `SELECT checkpoint_path FROM model_versions WHERE id = $1`, version).Scan(&dir))
	m, _, _, err := trainer.LoadCheckpoint(filepath.Join(dir, trainer.FullWeightsFile))
	require.NoError(s.t, err)
	return m
}

// trainerService is the embedded trainer behind the Tinker API, as
// `flywheel up` serves it. A hold, when set, sees every request first and
// may hold it; it answers false for a request it dropped (its client went
// away or the service is closing).
type trainerService struct {
	url  string
	done chan struct{}

	mu       sync.Mutex
	hold     func(r *http.Request) bool
	requests map[string]int
}

func startTrainerService(t *testing.T, base *trainer.Model, dir string) *trainerService {
	t.Helper()
	ts, err := tinkerserver.New(tinkerserver.Config{BaseModels: map[string]*trainer.Model{policyName: base}, Dir: dir,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	svc := &trainerService{done: make(chan struct{}), requests: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		svc.mu.Lock()
		svc.requests[r.URL.Path]++
		hold := svc.hold
		svc.mu.Unlock()
		if hold != nil && !hold(r) {
			return
		}
		ts.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { close(svc.done); srv.Close(); ts.Close() })
	svc.url = srv.URL
	return svc
}

func (svc *trainerService) setHold(hold func(r *http.Request) bool) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	svc.hold = hold
}

// count is how many requests of a route the service was sent.
func (svc *trainerService) count(path string) int {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return svc.requests[path]
}

// wait holds r for d; false if its client went away or the service
// closed first.
func (svc *trainerService) wait(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
	case <-svc.done:
	}
	return false
}

// slowSteps makes every forward_backward take d, as a real batch does:
// its future is not ready until then, and a poll of it waits until then
// or until its client cuts it. It returns the count of polls that waited.
func (svc *trainerService) slowSteps(d time.Duration) *atomic.Int64 {
	var (
		mu    sync.Mutex
		ready time.Time
		held  atomic.Int64
	)
	svc.setHold(func(r *http.Request) bool {
		switch r.URL.Path {
		case tinker.PathForwardBackward:
			mu.Lock()
			ready = time.Now().Add(d)
			mu.Unlock()
		case tinker.PathRetrieveFuture:
			mu.Lock()
			wait := time.Until(ready)
			mu.Unlock()
			if wait > 0 {
				held.Add(1)
				return svc.wait(r, wait)
			}
		}
		return true
	})
	return &held
}

// l2 is the Euclidean distance between two weight vectors.
func l2(a, b []float32) float64 {
	var s float64
	for i := range a {
		d := float64(a[i] - b[i])
		s += d * d
	}
	return math.Sqrt(s)
}

// register mirrors cmd/flywheel's registrations for the workflow queue.
func register(r tworker.Registry, pool *pgxpool.Pool, red *redact.Redactor, backend activities.Completer, refl activities.Reflector, tc client.Client, dir string) {
	wf := func(fn any, name string) { r.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: name}) }
	act := func(fn any, name string) { r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name}) }
	rules, err := trajectory.NewRules(config.Default().Gateway, map[string]trajectory.Tokenizer{policyName: trainer.Tokenizer{}})
	if err != nil {
		panic(err)
	}
	session := &activities.Session{DB: pool, Rules: rules}
	release := &activities.Release{DB: pool, Backend: backend, MaxPrompts: 5, MaxTokens: 16}
	evolve := &activities.Evolution{DB: pool, Temporal: tc, Redactor: red, Reflector: refl, Backend: backend}
	training := &activities.Training{DB: pool, CheckpointDir: filepath.Join(dir, "checkpoints"), BatchDir: filepath.Join(dir, "batches")}
	wf(workflows.SessionWorkflow, flow.SessionWorkflowName)
	act(session.AssembleTrajectory, flow.ActivityName((*activities.Session).AssembleTrajectory))
	act(session.EnqueueSamples, flow.ActivityName((*activities.Session).EnqueueSamples))
	act(session.EndSession, flow.ActivityName((*activities.Session).EndSession))
	wf(workflows.ReleaseWorkflow, flow.ReleaseWorkflowName)
	act(release.BeginRelease, flow.ActivityName((*activities.Release).BeginRelease))
	act(release.SetReleasePhase, flow.ActivityName((*activities.Release).SetReleasePhase))
	act(release.EvaluateGate, flow.ActivityName((*activities.Release).EvaluateGate))
	act(release.FinishRelease, flow.ActivityName((*activities.Release).FinishRelease))
	act(release.SyncWeights, flow.ActivityName((*activities.Release).SyncWeights))
	wf(workflows.WatchdogWorkflow, flow.WatchdogWorkflowName)
	act(release.WatchServing, flow.ActivityName((*activities.Release).WatchServing))
	wf(workflows.TrainingWorkflow, flow.TrainingWorkflowName)
	act(training.CheckBatch, flow.ActivityName((*activities.Training).CheckBatch))
	act(training.ClaimBatch, flow.ActivityName((*activities.Training).ClaimBatch))
	act(training.PrepareBatch, flow.ActivityName((*activities.Training).PrepareBatch))
	act(training.RegisterCheckpoint, flow.ActivityName((*activities.Training).RegisterCheckpoint))
	act(training.FailTrainingRun, flow.ActivityName((*activities.Training).FailTrainingRun))
	act(training.PrunableStates, flow.ActivityName((*activities.Training).PrunableStates))
	act(training.MarkStatesPruned, flow.ActivityName((*activities.Training).MarkStatesPruned))
	wf(workflows.EvolutionWorkflow, flow.EvolutionWorkflowName)
	act(evolve.ComputeEvidence, flow.ActivityName((*activities.Evolution).ComputeEvidence))
	act(evolve.RecordDecision, flow.ActivityName((*activities.Evolution).RecordDecision))
	act(evolve.ProposeArtefact, flow.ActivityName((*activities.Evolution).ProposeArtefact))
	act(evolve.RequestTraining, flow.ActivityName((*activities.Evolution).RequestTraining))
	act(evolve.RollbackVersion, flow.ActivityName((*activities.Evolution).RollbackVersion))
	act(evolve.RecordDecisionRelease, flow.ActivityName((*activities.Evolution).RecordDecisionRelease))
	forget := &activities.Forget{DB: pool}
	wf(workflows.ForgetWorkflow, flow.ForgetWorkflowName)
	act(forget.RetireForgotten, flow.ActivityName((*activities.Forget).RetireForgotten))
}

// chat sends one call of a one-call session and returns the HTTP status
// and the completion id.
func (s *stack) chat(session string, done bool, content string) (int, string) {
	return s.chatModel(policyName, session, done, content)
}

func (s *stack) reward(session string, value float64) int {
	req, err := http.NewRequest(http.MethodPost, s.url+"/v1/sessions/"+session+"/reward",
		strings.NewReader(fmt.Sprintf(`{"value":%v,"final":true}`, value)))
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (s *stack) versionOf(completionID string) string {
	var v string
	require.NoError(s.t, s.pool.QueryRow(context.Background(), `SELECT model_version FROM interactions WHERE completion_id = $1`, completionID).Scan(&v))
	return v
}

func TestIntegrationSessionFromFirstCallToQueuedSamples(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	const session = "int-session-1"
	st, _ := s.chat(session, false, "hello, my email is ann@example.com")
	require.Equal(t, http.StatusOK, st)
	st, _ = s.chat(session, false, "and now?")
	require.Equal(t, http.StatusOK, st)
	require.Equal(t, http.StatusCreated, s.reward(session, 0.8))
	st, _ = s.chat(session, true, "thanks, bye")
	require.Equal(t, http.StatusOK, st)

	var res flow.SessionResult
	require.Eventually(t, func() bool {
		return s.tc.GetWorkflow(ctx, flow.SessionWorkflowID("acme", session), "").Get(ctx, &res) == nil
	}, time.Minute, 100*time.Millisecond)
	require.Equal(t, "done", res.State.Phase)
	require.Equal(t, flow.EndByClient, res.State.EndReason)
	require.Equal(t, 3, res.State.Steps+0, "three calls were signalled")
	require.Positive(t, res.State.Enqueued)

	queued, err := store.QueuedSamplesOfSession(ctx, s.pool, "acme", session)
	require.NoError(t, err)
	require.Equal(t, res.State.Enqueued, queued)
	var stepJSON string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT step::text FROM atdp_steps WHERE session_id = $1 ORDER BY step_index LIMIT 1`, session).Scan(&stepJSON))
	require.NotContains(t, stepJSON, "ann@example.com", "stored steps are redacted")

	// The state query answers after the end, from the closed workflow.
	v, err := s.tc.QueryWorkflow(ctx, flow.SessionWorkflowID("acme", session), "", flow.SessionStateQuery)
	require.NoError(t, err)
	var state flow.SessionState
	require.NoError(t, v.Get(&state))
	require.Equal(t, "done", state.Phase)

	// What the session cost the server (revision 1): its search attributes
	// came with the start, no version marker, one upsert (the reward), and
	// no timer started and cancelled per batch of events.
	it := s.tc.GetWorkflowHistory(ctx, flow.SessionWorkflowID("acme", session), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	kinds := map[enumspb.EventType]int{}
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		kinds[ev.GetEventType()]++
		if a := ev.GetWorkflowExecutionStartedEventAttributes(); a != nil {
			require.Contains(t, a.GetSearchAttributes().GetIndexedFields(), flow.SessionIDKey.GetName())
		}
	}
	require.Zero(t, kinds[enumspb.EVENT_TYPE_TIMER_CANCELED], "the idle timer is never cancelled, only re-armed when it fires")
	require.Equal(t, 3, kinds[enumspb.EVENT_TYPE_MARKER_RECORDED], "the three local activities; no version marker")
	require.Equal(t, 1, kinds[enumspb.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES])
	testenv.RecordHistory(t, s.tc, flow.SessionWorkflowID("acme", session), filepath.Join("testdata", "session_rev1_history.json"))
}

func TestIntegrationWorseCandidateRollsBackWhileClientsSeeNoFailure(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	// The candidate answers exactly like the serving version (so the
	// offline gates tie), but users dislike what it serves: the steady
	// client below rewards the candidate's sessions 0 and the serving
	// version's 1. Only the live canary can tell them apart.
	// The release's weight sync loads it into the model server.
	v0, v1 := s.policy.Serving, s.policy.Candidate(s.base.Clone(), 1)

	var (
		stop             atomic.Bool
		requests, failed atomic.Int64
		mu               sync.Mutex
		servedBy         = map[string]int{}
		wg               sync.WaitGroup
	)
	for c := 0; c < 2; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				session := fmt.Sprintf("steady-%d-%d", c, i)
				st, id := s.chat(session, true, "what is two plus two?")
				requests.Add(1)
				if st != http.StatusOK {
					failed.Add(1)
					continue
				}
				v := s.versionOf(id)
				mu.Lock()
				servedBy[v]++
				mu.Unlock()
				r := 1.0
				if v == v1 {
					r = 0
				}
				if s.reward(session, r) != http.StatusCreated {
					failed.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })

	id := flow.ReleaseWorkflowID(policyName, artefact.LayerWeights, v1)
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.ReleaseWorkflowName,
		flow.ReleaseInput{Deployment: policyName, Layer: artefact.LayerWeights, Candidate: v1, Reason: "integration test",
			Policy: deployment.ReleasePolicy{ShadowDuration: time.Second, CanaryShare: 0.5, CanaryDuration: 40 * time.Second,
				CanaryChecks: 8, MinCanarySamples: 5, MaxRewardDrop: 0.05}})
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var res flow.ReleaseResult
	require.NoError(t, run.Get(rctx, &res))
	// Serving goes on after the rollback.
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()

	require.Equal(t, flow.ReleaseRolledBack, res.State.Status, res.State.Reason)
	require.Contains(t, res.State.Reason, "canary gate failed")
	require.Zero(t, failed.Load(), "a steady client sees no failed request (of %d)", requests.Load())
	require.Positive(t, servedBy[v1], "the canary served some traffic")
	require.Greater(t, servedBy[v0], servedBy[v1])
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v0, serving)
	var status string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT status FROM model_versions WHERE id = $1`, v1).Scan(&status))
	require.Equal(t, "rolled_back", status)
	rel, err := store.ReleaseByWorkflow(ctx, s.pool, id)
	require.NoError(t, err)
	gates, err := store.ReleaseGates(ctx, s.pool, rel.ID)
	require.NoError(t, err)
	names := []string{}
	for _, g := range gates {
		names = append(names, g.Gate)
	}
	require.Equal(t, []string{flow.GateShadow, flow.GateReplay, flow.GateRegression, flow.GateSafety, flow.GateCanary}, names)
	require.False(t, gates[4].Passed)
	t.Logf("requests %d, served by %v, canary %v", requests.Load(), servedBy, gates[4].Metrics)

	// After the rollback, new sessions are served by the baseline only.
	for i := 0; i < 5; i++ {
		st, cid := s.chat(fmt.Sprintf("after-%d", i), true, "hi")
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, v0, s.versionOf(cid))
	}
	testenv.RecordHistory(t, s.tc, id, filepath.Join("testdata", "release_rollback_history.json"))
}

// TestIntegrationWatchdogRollsBack runs the WatchdogWorkflow on the real
// services: the held-out suite is what v0 answers, v1 (other weights)
// slipped into serving without the gates, and the watchdog, measuring both
// on the policy's model server, rolls back to v0 and records it.
func TestIntegrationWatchdogRollsBack(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	var items []store.SuiteItem
	zero := 0.0
	for i := 0; len(items) < 60 && i < 2000; i++ {
		q := fmt.Sprintf("question %d", i)
		resp, err := s.engines.Complete(ctx, &inference.Request{Model: policyName, Messages: []inference.Message{{Role: inference.RoleUser, Content: q}},
			Temperature: &zero, MaxTokens: 8, Version: s.policy.Serving})
		require.NoError(t, err)
		if a := store.ValidText(resp.Message.Content); strings.TrimSpace(a) != "" {
			items = append(items, store.SuiteItem{Prompt: q, Expect: a, Match: store.MatchExact, MaxTokens: 8})
		}
	}
	prompts, err := store.SuitePrompts(store.SuiteRegression, items)
	require.NoError(t, err)
	_, err = store.SetEvalSuite(ctx, s.pool, policyName, store.SuiteRegression, prompts)
	require.NoError(t, err)

	watch := func(id string) flow.WatchdogResult {
		t.Helper()
		run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.WatchdogWorkflowName,
			flow.WatchdogInput{Deployment: policyName})
		require.NoError(t, err)
		var res flow.WatchdogResult
		require.NoError(t, run.Get(ctx, &res))
		return res
	}
	res := watch("watchdog-it-1")
	require.Equal(t, flow.WatchOK, res.Verdict, res.Reason)

	other, err := trainer.NewModel(s.base.Config, 99)
	require.NoError(t, err)
	v0, v1 := s.policy.Serving, s.policy.Candidate(other, 1)
	s.policy.Load(v1) // as a release's sync would have
	rel, err := store.BeginRelease(ctx, s.pool, store.Release{Deployment: policyName, Layer: artefact.LayerWeights, Candidate: v1, WorkflowID: "forced"})
	require.NoError(t, err)
	require.NoError(t, store.FinishRelease(ctx, s.pool, rel.ID, flow.ReleasePromoted, "forced past the gates"))

	res = watch("watchdog-it-2")
	require.Equal(t, flow.WatchRolledBack, res.Verdict, res.Reason)
	require.Equal(t, v0, res.RolledBackTo)
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v0, serving)
	testenv.RecordHistory(t, s.tc, "watchdog-it-2", filepath.Join("testdata", "watchdog_rollback_history.json"))
}

// TestIntegrationTrainingLoop runs the loop on the real services: sessions
// through the gateway become samples, the TrainingWorkflow has the
// deployment's trainer (the embedded one, through the Tinker API, driven
// from the Tinker queue) train them, records the candidate with lineage
// and hands it to a ReleaseWorkflow, which rolls it back because no live
// traffic reaches its canary.
func TestIntegrationTrainingLoop(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	s.startTrainer(200 * time.Millisecond)

	const n = 6
	s.queueSamples(n)

	id := flow.TrainingWorkflowID(policyName)
	_, err := s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, PollInterval: time.Second,
			Release: deployment.ReleasePolicy{ShadowDuration: time.Second, CanaryDuration: 2 * time.Second, CanaryChecks: 1, MinCanarySamples: 3}}})
	require.NoError(t, err)
	v1 := store.VersionID(policyName, 1)
	rid := flow.ReleaseWorkflowID(policyName, artefact.LayerWeights, v1)
	var rel flow.ReleaseResult
	require.Eventually(t, func() bool {
		return s.tc.GetWorkflow(ctx, rid, "").Get(ctx, &rel) == nil
	}, 2*time.Minute, 500*time.Millisecond, "the candidate goes through a release")
	require.Equal(t, flow.ReleaseRolledBack, rel.State.Status, rel.State.Reason)
	require.NoError(t, s.tc.TerminateWorkflow(ctx, id, "", "test done"))
	testenv.RecordHistory(t, s.tc, id, filepath.Join("testdata", "training_protocol_history.json"))

	var lineage, used int
	var parent, status, ckpt string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT parent_version, status, checkpoint_path FROM model_versions WHERE id = $1`, v1).Scan(&parent, &status, &ckpt))
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM model_version_lineage WHERE version_id = $1`, v1).Scan(&lineage))
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM training_samples WHERE status = 'used'`).Scan(&used))
	require.Equal(t, s.policy.Serving, parent)
	require.Equal(t, "rolled_back", status)
	require.GreaterOrEqual(t, lineage, n)
	require.Equal(t, lineage, used)
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, s.policy.Serving, serving, "users never saw the unproven version")

	// The step went through the Tinker API, and the version is the full
	// weights the trainer saved for sampling, which the release loaded.
	for _, route := range []string{tinker.PathCreateModel, tinker.PathForwardBackward, tinker.PathOptimStep, tinker.PathSaveWeights,
		tinker.PathSaveWeightsForSampler} {
		require.Positive(t, s.trainer.count(route), route)
	}
	require.FileExists(t, filepath.Join(ckpt, trainer.FullWeightsFile))
	require.FileExists(t, filepath.Join(ckpt, "tinker.json"))
	require.NotEqual(t, s.base.W, s.weightsOf(v1).W, "the step changed the weights")
}

// TestIntegrationForgetRetiresEveryDescendant runs the real training loop
// with candidates ahead of serving (no release), so v2 trains on v1's
// weights while v0 serves. Forgetting a session trained into v1 must
// retire v1 and v2, leave v0 serving, and send the trainer back to v0.
func TestIntegrationForgetRetiresEveryDescendant(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	s.startTrainer(200 * time.Millisecond)

	versionRow := func(v string) (parent, status string) {
		var p *string
		if err := s.pool.QueryRow(ctx, `SELECT parent_version, status FROM model_versions WHERE id = $1`, v).Scan(&p, &status); err != nil {
			return "", ""
		}
		if p != nil {
			parent = *p
		}
		return parent, status
	}
	trained := func(v string) {
		t.Helper()
		require.Eventually(t, func() bool { _, st := versionRow(v); return st != "" }, 2*time.Minute, 200*time.Millisecond, "%s is trained", v)
	}
	v0, v1, v2, v3 := s.policy.Serving, store.VersionID(policyName, 1), store.VersionID(policyName, 2), store.VersionID(policyName, 3)

	s.queueSessions("early", 2)
	id := flow.TrainingWorkflowID(policyName)
	_, err := s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, MaxBatchAge: time.Second,
			PollInterval: 300 * time.Millisecond, MaxStaleness: 4, MaxAhead: 4, NoRelease: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.tc.TerminateWorkflow(context.Background(), id, "", "test done") })
	trained(v1)
	s.queueSessions("late", 2)
	trained(v2)
	parent, _ := versionRow(v2)
	require.Equal(t, v1, parent, "v2 was trained from v1's weights, not from the serving v0")
	v2w := s.weightsOf(v2) // forget deletes v2's checkpoint

	res, err := store.Forget(ctx, s.pool, "acme", "session", "early-0")
	require.NoError(t, err)
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: flow.ForgetWorkflowID(res.ID), TaskQueue: flow.TaskQueue},
		flow.ForgetWorkflowName, flow.ForgetInput{RequestID: res.ID})
	require.NoError(t, err)
	var out flow.ForgetResult
	require.NoError(t, run.Get(ctx, &out))
	require.ElementsMatch(t, []string{v1, v2}, out.Retired, "every descendant of the forgotten data is retired")
	for _, v := range []string{v1, v2} {
		_, st := versionRow(v)
		require.Equal(t, "retired", st, v)
	}
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v0, serving, "the newest clean version serves")

	s.queueSessions("after", 2)
	trained(v3)
	parent, _ = versionRow(v3)
	require.Equal(t, v0, parent, "training goes on from the clean version")
	// v3 is v0's weights plus one step, not v2's: its step started from
	// the base model, not from v2's training state.
	v3w := s.weightsOf(v3)
	require.Less(t, l2(v3w.W, s.base.W), l2(v3w.W, v2w.W), "v3 is one step from v0, two from v2")
}

// TestIntegrationEvolutionPlaybookLoop: users correct the agent, the
// EvolutionWorkflow decides "memory", writes a playbook from the
// corrections, releases it through the gates, and the gateway injects it
// into the next requests of that deployment.
func TestIntegrationEvolutionPlaybookLoop(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	const n = 12
	for i := 0; i < n; i++ {
		session := fmt.Sprintf("corrected-%d", i)
		st, cid := s.chat(session, false, "What is the capital of France?")
		require.Equal(t, http.StatusOK, st)
		var iid int64
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT id FROM interactions WHERE completion_id = $1`, cid).Scan(&iid))
		req, err := http.NewRequest(http.MethodPost, s.url+"/v1/sessions/"+session+"/reward",
			strings.NewReader(fmt.Sprintf(`{"value":-1,"step_id":"%d","source":"user"}`, iid)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+s.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		st, _ = s.chat(session, true, "No, the capital of France is Paris.")
		require.Equal(t, http.StatusOK, st)
	}

	// The reflector reads the corrected sessions and proposes the lesson
	// they teach, citing them.
	s.reflector.Script = func(r fakeopenai.Request) fakeopenai.Reply {
		var cite []string
		for _, m := range regexp.MustCompile(`\[session ([^\]]+)\]`).FindAllStringSubmatch(r.Messages[1].Content, -1) {
			cite = append(cite, m[1])
		}
		d, _ := json.Marshal(map[string]any{"deltas": []evolution.Delta{
			{Op: evolution.DeltaAdd, Content: "Asked for the capital of France, answer Paris.", Sessions: cite}}})
		return fakeopenai.Reply{Text: string(d)}
	}
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "evolution-it", TaskQueue: flow.TaskQueue}, flow.EvolutionWorkflowName,
		flow.EvolutionInput{Deployment: policyName, Window: time.Hour, Trigger: "test",
			Thresholds: evolution.Thresholds{MinSessions: n},
			// The tiny random policy answers noise, so replay scores are
			// noise too: this test is about the loop (the gates have their
			// own tests), hence a drop allowance wider than the score range,
			// and unevaluated gates allowed: the corrections came before the
			// shadow window and the canary, which see no traffic.
			Release: deployment.ReleasePolicy{ShadowDuration: time.Second, CanaryDuration: time.Second, CanaryChecks: 1,
				MaxRewardDrop: 2, AllowUnevaluated: true}})
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var res flow.EvolutionResult
	if err := run.Get(rctx, &res); err != nil {
		for _, id := range []string{"evolution-it", flow.ReleaseWorkflowID(policyName, artefact.LayerPlaybook, "1")} {
			d, derr := s.tc.DescribeWorkflowExecution(ctx, id, "")
			if derr != nil {
				t.Logf("describe %s: %v", id, derr)
				continue
			}
			for _, pa := range d.GetPendingActivities() {
				t.Logf("%s pending %s attempt %d: %v", id, pa.GetActivityType().GetName(), pa.GetAttempt(), pa.GetLastFailure())
			}
		}
		require.NoError(t, err)
	}
	require.Equal(t, evolution.DecisionMemory, res.Decision.Kind, res.Decision.Reason)
	require.InDelta(t, 1, res.Evidence.CorrectionRate, 1e-9)
	require.Equal(t, flow.ReleasePromoted, res.Release, res.Action)
	rows, err := store.ListDecisions(ctx, s.pool, policyName, 5)
	require.NoError(t, err)
	require.Equal(t, res.DecisionID, rows[0].ID)

	// Routes refresh every second; then every request carries the playbook.
	require.Eventually(t, func() bool {
		st, cid := s.chat(fmt.Sprintf("after-playbook-%d", time.Now().UnixNano()), true, "What is the capital of France?")
		if st != http.StatusOK {
			return false
		}
		var stored string
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT request::text FROM interactions WHERE completion_id = $1`, cid).Scan(&stored))
		return strings.Contains(stored, "Playbook") && strings.Contains(stored, "Paris")
	}, 30*time.Second, 300*time.Millisecond, "the promoted playbook is injected by the gateway")
	testenv.RecordHistory(t, s.tc, "evolution-it", filepath.Join("testdata", "evolution_history.json"))
}

// queueSamples runs n rewarded two-call sessions through the gateway and
// waits until their steps are queued for training.
func (s *stack) queueSamples(n int) { s.t.Helper(); s.queueSessions("train", n) }

// queueSessions runs n two-call sessions named prefix-i, rewarded, and
// waits until their samples are queued.
func (s *stack) queueSessions(prefix string, n int) {
	s.t.Helper()
	for i := 0; i < n; i++ {
		session := fmt.Sprintf("%s-%d", prefix, i)
		st, _ := s.chat(session, false, "count to three")
		require.Equal(s.t, http.StatusOK, st)
		require.Equal(s.t, http.StatusCreated, s.reward(session, float64(i%2)))
		st, _ = s.chat(session, true, "again")
		require.Equal(s.t, http.StatusOK, st)
	}
	// Each session's samples, not just as many samples as sessions: the
	// gateway may hold a session's end for up to a second.
	require.Eventually(s.t, func() bool {
		var queued int
		err := s.pool.QueryRow(context.Background(), `SELECT count(DISTINCT session_id) FROM training_samples
WHERE deployment = $1 AND status = 'queued' AND session_id LIKE $2 || '-%'`, policyName, prefix).Scan(&queued)
		return err == nil && queued >= n
	}, time.Minute, 200*time.Millisecond, "every session's eligible steps are queued")
}

// TestIntegrationTrainStepResumesAfterTheWorkerDies: the worker driving a
// Tinker step dies after the service saved the version, while it fetches
// it; another worker takes the step over, finds the first one's step
// record and fetches the saved version instead of training the batch
// again.
func TestIntegrationTrainStepResumesAfterTheWorkerDies(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	s.queueSamples(4)
	// The first fetch of a sampler archive hangs until its worker dies.
	entered := make(chan struct{})
	var held atomic.Bool
	s.trainer.setHold(func(r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/archive") || !held.CompareAndSwap(false, true) {
			return true
		}
		close(entered)
		return s.trainer.wait(r, time.Hour)
	})
	a := s.trainerWorker(100 * time.Millisecond)
	require.NoError(t, a.Start())

	id := flow.TrainingWorkflowID(policyName)
	_, err := s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, PollInterval: time.Second,
			StepHeartbeatTimeout: 2 * time.Second, NoRelease: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.tc.TerminateWorkflow(context.Background(), id, "", "test done") })
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the train step never reached the fetch of its version")
	}
	start := time.Now()
	a.Stop() // the worker dies with the step in flight
	s.startTrainer(100 * time.Millisecond)

	v1 := store.VersionID(policyName, 1)
	require.Eventually(t, func() bool {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM model_versions WHERE id = $1`, v1).Scan(&n)
		return err == nil && n == 1
	}, time.Minute, 200*time.Millisecond, "another worker finishes the step")
	t.Logf("step resumed on the second worker %v after the first died", time.Since(start).Round(100*time.Millisecond))
	var runs, trained int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'trained') FROM training_runs`).Scan(&runs, &trained))
	require.Equal(t, 1, runs, "the retry resumed the claimed run instead of claiming another")
	require.Equal(t, 1, trained)
	var resumed string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT metrics->>'resumed' FROM model_versions WHERE id = $1`, v1).Scan(&resumed))
	require.Equal(t, "true", resumed, "the second worker fetched the version the first one saved")
	require.Equal(t, 1, s.trainer.count(tinker.PathForwardBackward), "the batch trained once")
	require.FileExists(t, filepath.Join(s.dir, "checkpoints", policyName, "v1", trainer.FullWeightsFile))
}

// TestIntegrationTrainStepLongerThanItsHeartbeatTimeout: a live worker
// beats within the step's heartbeat timeout, however short the deployment
// sets it, while the service takes longer than that over a step. The
// client heartbeats between polls of a future, and the service holds a
// poll up to 30 s: unless each poll ends in time for the next heartbeat,
// the server times the attempt out while the service trains, and the
// retry trains the batch again.
func TestIntegrationTrainStepLongerThanItsHeartbeatTimeout(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	s.queueSamples(4)
	held := s.trainer.slowSteps(2500 * time.Millisecond)
	s.startTrainer(0) // the default interval

	id := flow.TrainingWorkflowID(policyName)
	_, err := s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, PollInterval: time.Second,
			StepHeartbeatTimeout: time.Second, NoRelease: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.tc.TerminateWorkflow(context.Background(), id, "", "test done") })

	v1 := store.VersionID(policyName, 1)
	require.Eventually(t, func() bool {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM model_versions WHERE id = $1`, v1).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, 200*time.Millisecond, "the step trains on the worker that runs it")
	var runs, trained int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'trained') FROM training_runs`).Scan(&runs, &trained))
	require.Equal(t, 1, runs)
	require.Equal(t, 1, trained)
	var resumed string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT metrics->>'resumed' FROM model_versions WHERE id = $1`, v1).Scan(&resumed))
	require.Equal(t, "false", resumed, "the first attempt answered")
	require.Equal(t, 1, s.trainer.count(tinker.PathForwardBackward), "no retry trained the batch again")
	require.Greater(t, held.Load(), int64(2), "the client cut its polls of the slow step short, heartbeating between them")
}
