package workflows_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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
	"github.com/flywheel-ai/flywheel/internal/policytest"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/redact"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trajectory"
	"github.com/flywheel-ai/flywheel/workflows"
)

const policyName = "flywheel-policy"

// stack is the real thing on the real services: Postgres, a Temporal dev
// server, a worker with Flywheel's workflows and activities, and the
// gateway serving the policy from its model server, as `flywheel up` does.
type stack struct {
	t    *testing.T
	pool *pgxpool.Pool
	tc   client.Client
	// policy is the policy's model server and deployment; engines are the
	// gates' engines, which reach it over HTTP.
	policy  *policytest.Policy
	engines *activities.Engines
	v1      *trainer.Model
	url     string
	key     string
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
	// v1 serves; its checkpoint is where the trainers' go, so that a
	// trainer can go back to it.
	policy := policytest.Start(t, pool, policytest.Options{Name: policyName, Base: m, Version: 1, Dir: filepath.Join(dir, "checkpoints")})
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
	for _, q := range []string{flow.TaskQueue, flow.SessionTaskQueue} {
		w := tworker.New(tc, q, tworker.Options{})
		register(w, pool, red, engines, tc, dir)
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
	return &stack{t: t, pool: pool, tc: tc, policy: policy, engines: engines, v1: m, url: ts.URL, key: key, dir: dir}
}

// trainerWorker is a trainer worker of the trainer protocol: it takes
// TrainBatch from the trainer queue with tr's weights, reading and writing
// only the stack's shared files. It has no database, like a GPU trainer
// in another language.
func (s *stack) trainerWorker(tr activities.TrainStepper, heartbeat time.Duration) tworker.Worker {
	w := tworker.New(s.tc, flow.TrainerTaskQueue, tworker.Options{})
	a := &activities.Training{Trainer: tr, HeartbeatEvery: heartbeat}
	w.RegisterActivityWithOptions(a.TrainBatch, activity.RegisterOptions{Name: flow.TrainBatchActivity})
	return w
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
func register(r tworker.Registry, pool *pgxpool.Pool, red *redact.Redactor, backend activities.Completer, tc client.Client, dir string) {
	wf := func(fn any, name string) { r.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: name}) }
	act := func(fn any, name string) { r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name}) }
	rules, err := trajectory.NewRules(config.Default().Gateway, map[string]trajectory.Tokenizer{policyName: trainer.Tokenizer{}})
	if err != nil {
		panic(err)
	}
	session := &activities.Session{DB: pool, Rules: rules}
	release := &activities.Release{DB: pool, Backend: backend, MaxPrompts: 5, MaxTokens: 16}
	evolve := &activities.Evolution{DB: pool, Temporal: tc, Redactor: red}
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
	wf(workflows.EvolutionWorkflow, flow.EvolutionWorkflowName)
	act(evolve.ComputeEvidence, flow.ActivityName((*activities.Evolution).ComputeEvidence))
	act(evolve.RecordDecision, flow.ActivityName((*activities.Evolution).RecordDecision))
	act(evolve.ProposeArtefact, flow.ActivityName((*activities.Evolution).ProposeArtefact))
	act(evolve.RequestTraining, flow.ActivityName((*activities.Evolution).RequestTraining))
	act(evolve.RollbackVersion, flow.ActivityName((*activities.Evolution).RollbackVersion))
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
	v1, v2 := s.policy.Serving, s.policy.Candidate(s.v1.Clone(), 2)

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
				if v == v2 {
					r = 0
				}
				if s.reward(session, r) != http.StatusCreated {
					failed.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })

	id := flow.ReleaseWorkflowID(policyName, artefact.LayerWeights, v2)
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.ReleaseWorkflowName,
		flow.ReleaseInput{Deployment: policyName, Layer: artefact.LayerWeights, Candidate: v2, Reason: "integration test",
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
	require.Positive(t, servedBy[v2], "the canary served some traffic")
	require.Greater(t, servedBy[v1], servedBy[v2])
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v1, serving)
	var status string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT status FROM model_versions WHERE id = $1`, v2).Scan(&status))
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
		require.Equal(t, v1, s.versionOf(cid))
	}
	testenv.RecordHistory(t, s.tc, id, filepath.Join("testdata", "release_rollback_history.json"))
}

// TestIntegrationWatchdogRollsBack runs the WatchdogWorkflow on the real
// services: the held-out suite is what v1 answers, v2 (other weights)
// slipped into serving without the gates, and the watchdog, measuring both
// on the policy's model server, rolls back to v1 and records it.
func TestIntegrationWatchdogRollsBack(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	var items []store.SuiteItem
	zero := 0.0
	for i := 0; len(items) < 60 && i < 2000; i++ {
		q := fmt.Sprintf("question %d", i)
		resp, err := s.engines.Complete(ctx, &inference.Request{Model: policyName, Messages: []inference.Message{{Role: inference.RoleUser, Content: q}},
			Temperature: &zero, MaxTokens: 8, Version: store.VersionID(policyName, 1)})
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

	other, err := trainer.NewModel(s.v1.Config, 99)
	require.NoError(t, err)
	v1, v2 := s.policy.Serving, s.policy.Candidate(other, 2)
	s.policy.Load(v2) // as a release's sync would have
	rel, err := store.BeginRelease(ctx, s.pool, store.Release{Deployment: policyName, Layer: artefact.LayerWeights, Candidate: v2, WorkflowID: "forced"})
	require.NoError(t, err)
	require.NoError(t, store.FinishRelease(ctx, s.pool, rel.ID, flow.ReleasePromoted, "forced past the gates"))

	res = watch("watchdog-it-2")
	require.Equal(t, flow.WatchRolledBack, res.Verdict, res.Reason)
	require.Equal(t, v1, res.RolledBackTo)
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v1, serving)
	testenv.RecordHistory(t, s.tc, "watchdog-it-2", filepath.Join("testdata", "watchdog_rollback_history.json"))
}

// TestIntegrationTrainingLoop runs the loop on the real services: sessions
// through the gateway become samples, the TrainingWorkflow trains them on a
// trainer worker (its own task queue), records the candidate with lineage
// and hands it to a ReleaseWorkflow, which rolls it back because no live
// traffic reaches its canary.
func TestIntegrationTrainingLoop(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	local, err := trainer.NewLocal(s.v1, 1, trainer.Config{}, nil)
	require.NoError(t, err)
	tw := s.trainerWorker(local, 200*time.Millisecond)
	require.NoError(t, tw.Start())
	t.Cleanup(tw.Stop)

	const n = 6
	s.queueSamples(n)

	id := flow.TrainingWorkflowID(policyName)
	_, err = s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, PollInterval: time.Second,
			Release: deployment.ReleasePolicy{ShadowDuration: time.Second, CanaryDuration: 2 * time.Second, CanaryChecks: 1, MinCanarySamples: 3}}})
	require.NoError(t, err)
	v2 := store.VersionID(policyName, 2)
	rid := flow.ReleaseWorkflowID(policyName, artefact.LayerWeights, v2)
	var rel flow.ReleaseResult
	require.Eventually(t, func() bool {
		return s.tc.GetWorkflow(ctx, rid, "").Get(ctx, &rel) == nil
	}, 2*time.Minute, 500*time.Millisecond, "the candidate goes through a release")
	require.Equal(t, flow.ReleaseRolledBack, rel.State.Status, rel.State.Reason)
	require.NoError(t, s.tc.TerminateWorkflow(ctx, id, "", "test done"))
	testenv.RecordHistory(t, s.tc, id, filepath.Join("testdata", "training_protocol_history.json"))

	var lineage, used int
	var parent, status string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT parent_version, status FROM model_versions WHERE id = $1`, v2).Scan(&parent, &status))
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM model_version_lineage WHERE version_id = $1`, v2).Scan(&lineage))
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM training_samples WHERE status = 'used'`).Scan(&used))
	require.Equal(t, store.VersionID(policyName, 1), parent)
	require.Equal(t, "rolled_back", status)
	require.GreaterOrEqual(t, lineage, n)
	require.Equal(t, lineage, used)
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, store.VersionID(policyName, 1), serving, "users never saw the unproven version")
}

// TestIntegrationForgetRetiresEveryDescendant runs the real training loop
// with candidates ahead of serving (no release), so v3 trains on v2's
// weights while v1 serves. Forgetting a session trained into v2 must
// retire v2 and v3, leave v1 serving, and send the trainer back to v1.
func TestIntegrationForgetRetiresEveryDescendant(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	// v1's checkpoint is stored (newStack), so that the trainer can go
	// back to it.
	ckpt := s.policy.Checkpoints
	local, err := trainer.NewLocal(s.v1, 1, trainer.Config{}, nil)
	require.NoError(t, err)
	tw := s.trainerWorker(local, 200*time.Millisecond)
	require.NoError(t, tw.Start())
	t.Cleanup(tw.Stop)

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
	v1, v2, v3, v4 := store.VersionID(policyName, 1), store.VersionID(policyName, 2), store.VersionID(policyName, 3), store.VersionID(policyName, 4)

	s.queueSessions("early", 2)
	id := flow.TrainingWorkflowID(policyName)
	_, err = s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, MaxBatchAge: time.Second,
			PollInterval: 300 * time.Millisecond, MaxStaleness: 4, MaxAhead: 4, NoRelease: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.tc.TerminateWorkflow(context.Background(), id, "", "test done") })
	trained(v2)
	s.queueSessions("late", 2)
	trained(v3)
	parent, _ := versionRow(v3)
	require.Equal(t, v2, parent, "v3 was trained from v2's weights, not from the serving v1")
	v3w := local.Snapshot() // forget deletes v3's checkpoint

	res, err := store.Forget(ctx, s.pool, "acme", "session", "early-0")
	require.NoError(t, err)
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: flow.ForgetWorkflowID(res.ID), TaskQueue: flow.TaskQueue},
		flow.ForgetWorkflowName, flow.ForgetInput{RequestID: res.ID})
	require.NoError(t, err)
	var out flow.ForgetResult
	require.NoError(t, run.Get(ctx, &out))
	require.ElementsMatch(t, []string{v2, v3}, out.Retired, "every descendant of the forgotten data is retired")
	for _, v := range []string{v2, v3} {
		_, st := versionRow(v)
		require.Equal(t, "retired", st, v)
	}
	serving, err := store.ServingOf(ctx, s.pool, policyName, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v1, serving, "the newest clean version serves")

	s.queueSessions("after", 2)
	trained(v4)
	parent, _ = versionRow(v4)
	require.Equal(t, v1, parent, "training goes on from the clean version")
	// v4 is v1's weights plus one step, not v3's: its step loaded v1.
	v4w, _, err := ckpt.Load(4)
	require.NoError(t, err)
	require.Less(t, l2(v4w.W, s.v1.W), l2(v4w.W, v3w.W), "v4 is one step from v1, two from v3")
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

// hangingTrainer is a trainer worker that dies mid-step: its step never
// returns (until the test ends), like a process that was killed.
type hangingTrainer struct {
	activities.TrainStepper
	entered, release chan struct{}
}

func (h *hangingTrainer) TrainStep(ctx context.Context, b *trainer.Batch) (trainer.StepResult, error) {
	close(h.entered)
	<-h.release
	return trainer.StepResult{}, fmt.Errorf("this worker was dead")
}

func TestIntegrationTrainStepResumesAfterTheWorkerDies(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	s.queueSamples(4)
	local, err := trainer.NewLocal(s.v1, 1, trainer.Config{}, nil)
	require.NoError(t, err)
	hang := &hangingTrainer{TrainStepper: local, entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { close(hang.release) })
	startTrainer := func(tr activities.TrainStepper) tworker.Worker {
		w := s.trainerWorker(tr, 100*time.Millisecond)
		require.NoError(t, w.Start())
		return w
	}
	a := startTrainer(hang)

	id := flow.TrainingWorkflowID(policyName)
	_, err = s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, PollInterval: time.Second,
			StepHeartbeatTimeout: 2 * time.Second, NoRelease: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.tc.TerminateWorkflow(context.Background(), id, "", "test done") })
	select {
	case <-hang.entered:
	case <-time.After(time.Minute):
		t.Fatal("the train step never reached the first trainer worker")
	}
	start := time.Now()
	a.Stop() // the worker dies with the step in flight
	b := startTrainer(local)
	t.Cleanup(b.Stop)

	v2 := store.VersionID(policyName, 2)
	require.Eventually(t, func() bool {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM model_versions WHERE id = $1`, v2).Scan(&n)
		return err == nil && n == 1
	}, time.Minute, 200*time.Millisecond, "another trainer worker finishes the step")
	t.Logf("step resumed on the second worker %v after the first died", time.Since(start).Round(100*time.Millisecond))
	var runs, trained int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'trained') FROM training_runs`).Scan(&runs, &trained))
	require.Equal(t, 1, runs, "the retry resumed the claimed run instead of claiming another")
	require.Equal(t, 1, trained)
	require.Equal(t, int64(2), local.Version(), "the batch trained once")
}

// slowTrainer takes its time over every step, as a real batch does.
type slowTrainer struct {
	activities.TrainStepper
	d time.Duration
}

func (s slowTrainer) TrainStep(ctx context.Context, b *trainer.Batch) (trainer.StepResult, error) {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return trainer.StepResult{}, ctx.Err()
	}
	return s.TrainStepper.TrainStep(ctx, b)
}

// TestIntegrationTrainStepLongerThanItsHeartbeatTimeout: a live trainer
// worker beats within the step's heartbeat timeout, however short the
// deployment sets it. At the fixed 10 s it beat before, a 1 s timeout
// took every step longer than that for a dead worker's: the server timed
// the attempt out while it trained, and the retry answered with the
// checkpoint the orphaned attempt went on to write.
func TestIntegrationTrainStepLongerThanItsHeartbeatTimeout(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	s.queueSamples(4)
	local, err := trainer.NewLocal(s.v1, 1, trainer.Config{}, nil)
	require.NoError(t, err)
	w := s.trainerWorker(slowTrainer{TrainStepper: local, d: 2500 * time.Millisecond}, 0) // the default interval
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	id := flow.TrainingWorkflowID(policyName)
	_, err = s.tc.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName,
		flow.TrainingInput{Deployment: policyName, Policy: flow.TrainingPolicy{BatchSize: 64, PollInterval: time.Second,
			StepHeartbeatTimeout: time.Second, NoRelease: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.tc.TerminateWorkflow(context.Background(), id, "", "test done") })

	v2 := store.VersionID(policyName, 2)
	require.Eventually(t, func() bool {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM model_versions WHERE id = $1`, v2).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, 200*time.Millisecond, "the step trains on the worker that runs it")
	var runs, trained int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'trained') FROM training_runs`).Scan(&runs, &trained))
	require.Equal(t, 1, runs)
	require.Equal(t, 1, trained)
	var resumed string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT metrics->>'resumed' FROM model_versions WHERE id = $1`, v2).Scan(&resumed))
	require.Equal(t, "false", resumed, "the first attempt answered; no retry found its checkpoint after it timed out")
}
