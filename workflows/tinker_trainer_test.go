package workflows_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	tworker "go.temporal.io/sdk/worker"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/fakeskyrl"
	"github.com/flywheel-ai/flywheel/store"
)

// skyrl is a fake SkyRL tx server that keeps the bodies it was sent.
type skyrl struct {
	fake *fakeskyrl.Server
	url  string
	mu   sync.Mutex
	sent map[string][][]byte
}

func newSkyRL(t *testing.T) *skyrl {
	t.Helper()
	s := &skyrl{fake: fakeskyrl.New(fakeskyrl.Config{}), sent: map[string][][]byte{}}
	h := s.fake.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		s.sent[r.URL.Path] = append(s.sent[r.URL.Path], body)
		s.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { srv.Close(); s.fake.Close() })
	s.url = srv.URL
	return s
}

// loadedStates are the paths of the load_weights requests, in order.
func (s *skyrl) loadedStates(t *testing.T) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var paths []string
	for _, b := range s.sent[fakeskyrl.RouteLoadWeights] {
		var req struct {
			Path string `json:"path"`
		}
		require.NoError(t, json.Unmarshal(b, &req))
		paths = append(paths, req.Path)
	}
	return paths
}

// TestIntegrationTinkerTrainsAnUpstreamDeployment is the production shape
// with a Tinker trainer: the deployment's settings name a Tinker service
// (fake: SkyRL tx's server, no GPU), Flywheel's own worker on the Tinker
// queue drives it, and the adapter the service saves for sampling is
// loaded into vLLM under the version's name and promoted by gates that
// all evaluate. The next step continues from that version's saved
// training state.
func TestIntegrationTinkerTrainsAnUpstreamDeployment(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	svc := newSkyRL(t)
	const dep = "tinker-model"
	u := s.newUpstream(dep, &deployment.Trainer{Kind: deployment.TrainerTinker, URL: svc.url, BaseModel: fakeskyrl.DefaultBaseModel,
		LoRA: deployment.LoRA{Rank: 4}})

	// As worker/registrations.go registers it on every worker.
	w := tworker.New(s.tc, deployment.TinkerQueue, tworker.Options{})
	tinker := &activities.TinkerTraining{Logger: slog.New(slog.DiscardHandler)}
	w.RegisterActivityWithOptions(tinker.TrainBatch, activity.RegisterOptions{Name: flow.TrainBatchActivity})
	w.RegisterActivity(tinker.PruneStates)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	u.queueSessions("agent", 4)
	id := u.startLoop(flow.TrainingPolicy{StepsPerRun: 1, Release: releasePolicy()})
	v1, v2 := store.VersionID(dep, 1), store.VersionID(dep, 2)
	u.awaitVersion(v1)
	live := u.traffic("live")
	rel := u.awaitRelease(v1)
	live.Stop()
	require.Zero(t, live.failed.Load(), "no call of %d failed during the release", live.sent.Load())

	// The step went through the Tinker API.
	for _, route := range []string{fakeskyrl.RouteCreateModel, fakeskyrl.RouteForwardBackward, fakeskyrl.RouteOptimStep,
		fakeskyrl.RouteSaveWeights, fakeskyrl.RouteSaveWeightsForSampler} {
		require.Positive(t, svc.fake.Requests(route), route)
	}
	require.Equal(t, 1, svc.fake.SamplerSaves("v1"))
	require.Empty(t, svc.loadedStates(t), "the first step trains the base model: no state to load")

	// The version's directory holds the sampler adapter and where its
	// training state lives.
	var ckpt string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT checkpoint_path FROM model_versions WHERE id = $1`, v1).Scan(&ckpt))
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors", "tinker.json"} {
		require.FileExists(t, filepath.Join(ckpt, f))
	}
	raw, err := os.ReadFile(filepath.Join(ckpt, "tinker.json"))
	require.NoError(t, err)
	var meta struct {
		Service string `json:"service"`
		State   string `json:"state"`
	}
	require.NoError(t, json.Unmarshal(raw, &meta))
	require.Equal(t, svc.url, meta.Service)
	require.True(t, strings.HasPrefix(meta.State, "tinker://") && strings.HasSuffix(meta.State, "/weights/v1"), meta.State)

	// The release loaded that adapter into vLLM as the version, and every
	// gate evaluated it.
	require.Contains(t, u.adapterLoads(), v1+" "+ckpt)
	requirePromotedByEveryGate(t, rel)
	serving, err := store.ServingOf(ctx, s.pool, dep, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v1, serving)
	var last any
	require.Eventually(t, func() bool {
		st, _ := s.chatModel(dep, "after-release", false, "list the files")
		last = u.vllm.LastRequest()["model"]
		return st == http.StatusOK && last == v1
	}, 10*time.Second, 200*time.Millisecond, "traffic goes to the promoted adapter once the gateway's routes refresh (last: %v)", last)

	// The next step, on v1's traffic, continues from v1's training state.
	u.queueSessions("more", 2)
	require.NoError(t, s.tc.SignalWorkflow(ctx, id, "", flow.TrainNowSignal, nil))
	u.awaitVersion(v2)
	require.Equal(t, []string{meta.State}, svc.loadedStates(t), "v2's step loads v1's state")
	var parent string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT parent_version FROM model_versions WHERE id = $1`, v2).Scan(&parent))
	require.Equal(t, v1, parent)
	require.Equal(t, 1, svc.fake.SamplerSaves("v2"))
}

// TestIntegrationNoTrainerWorkerFailsTheStep: a deployment whose trainer
// queue no worker polls fails its step once StepStartTimeout passes, the
// loop says which queue on its state, and it waits longer after each
// failure however often train-now is signalled, instead of claiming and
// failing in a loop.
func TestIntegrationNoTrainerWorkerFailsTheStep(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	const dep, queue = "orphan-model", "orphan-model-gpu"
	u := s.newUpstream(dep, &deployment.Trainer{Kind: deployment.TrainerTemporal, Queue: queue})
	u.queueSessions("agent", 2)
	id := u.startLoop(flow.TrainingPolicy{StepStartTimeout: 2 * time.Second, PollInterval: 4 * time.Second, NoRelease: true})

	// Train-now every half second, as an evolution loop that keeps
	// deciding to train would.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
				_ = s.tc.SignalWorkflow(ctx, id, "", flow.TrainNowSignal, nil)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })

	var st flow.TrainingState
	require.Eventually(t, func() bool {
		v, err := s.tc.QueryWorkflow(ctx, id, "", flow.TrainingStateQuery)
		return err == nil && v.Get(&st) == nil && st.LastError != ""
	}, 30*time.Second, 200*time.Millisecond, "the step fails")
	failedAt := time.Now()
	require.Contains(t, st.LastError, queue)
	require.Contains(t, st.LastError, "no worker took the train step")

	// Failed steps at 2 s, 8 s (4 s wait), 18 s (8 s): a loop that claimed
	// again at each train-now would have failed every 2 s.
	time.Sleep(8 * time.Second)
	var runs, failed int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'failed') FROM training_runs
		WHERE deployment = $1`, dep).Scan(&runs, &failed))
	t.Logf("%d runs, %d failed, %v after the first failure", runs, failed, time.Since(failedAt).Round(100*time.Millisecond))
	require.LessOrEqual(t, runs, 2, "the loop waits after a failed step")
	require.GreaterOrEqual(t, failed, 1)
	require.Eventually(t, func() bool {
		var queued int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM training_samples WHERE deployment = $1 AND status = 'queued'`, dep).Scan(&queued)
		return err == nil && queued == 4
	}, 5*time.Second, 100*time.Millisecond, "a failed step's samples go back to the queue")
	var versions int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM model_versions WHERE deployment = $1`, dep).Scan(&versions))
	require.Zero(t, versions)
}
