package activities_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/fakeskyrl"
	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

// tinkerService is a fake SkyRL tx that records what it was sent and can
// cut a caller off at a route (the worker dying there).
type tinkerService struct {
	fake *fakeskyrl.Server
	url  string
	mu   sync.Mutex
	sent map[string][][]byte
	// dieAt cancels the caller's context once the service has answered a
	// request to a path ending so (before the answer reaches it).
	dieAt  string
	cancel context.CancelFunc
}

func newTinkerService(t *testing.T) *tinkerService {
	t.Helper()
	s := &tinkerService{fake: fakeskyrl.New(fakeskyrl.Config{}), sent: map[string][][]byte{}}
	h := s.fake.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		s.sent[r.URL.Path] = append(s.sent[r.URL.Path], body)
		die := s.dieAt != "" && strings.HasSuffix(r.URL.Path, s.dieAt) && s.cancel != nil
		if die {
			s.dieAt = ""
		}
		s.mu.Unlock()
		h.ServeHTTP(w, r)
		if die {
			s.cancel() // after the service acted: the answer is lost
		}
	}))
	t.Cleanup(func() { srv.Close(); s.fake.Close() })
	s.url = srv.URL
	return s
}

func (s *tinkerService) bodies(path string) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.sent[path]...)
}

// tinkerBatch writes a batch of two GRPO groups of two, tokens under the
// fake's vocabulary.
func tinkerBatch(t *testing.T, dir string) flow.BatchRef {
	t.Helper()
	rows := []parquetbatch.Row{
		{SampleID: 1, GroupID: "g1", TaskID: "t", PromptIDs: []int32{5, 6, 7}, CompletionIDs: []int32{8, 9}, LossMask: []uint8{1, 1},
			Logprobs: []float32{-6.1, -6.3}, Versions: []int64{0, 0}, Advantage: 1, Reward: 1},
		{SampleID: 2, GroupID: "g1", TaskID: "t", PromptIDs: []int32{5, 6, 7}, CompletionIDs: []int32{10, 11, 12}, LossMask: []uint8{1, 0, 1},
			Logprobs: []float32{-6.2, -6.2, -6.4}, Versions: []int64{0, 0, 0}, Advantage: -1, Reward: 0},
		{SampleID: 3, GroupID: "g2", TaskID: "u", PromptIDs: []int32{20, 21}, CompletionIDs: []int32{22}, LossMask: []uint8{1},
			Logprobs: []float32{-6.0}, Versions: []int64{0}, Advantage: 0.5, Reward: 1},
		{SampleID: 4, GroupID: "g2", TaskID: "u", PromptIDs: []int32{20, 21}, CompletionIDs: []int32{23}, LossMask: []uint8{1},
			Logprobs: []float32{-7.0}, Versions: []int64{0}, Advantage: -0.5, Reward: 0},
	}
	path := filepath.Join(dir, "run.parquet")
	require.NoError(t, parquetbatch.Write(path, nil, rows))
	return flow.BatchRef{URI: "file://" + path, Format: "parquet", Samples: len(rows)}
}

func tinkerInput(t *testing.T, svc *tinkerService, loss string, run int64, version, base string, baseURI string) flow.TrainBatchInput {
	dir := t.TempDir()
	return flow.TrainBatchInput{Protocol: flow.TrainerProtocol, Deployment: "dep", RunID: run, Batch: tinkerBatch(t, dir),
		Base:   flow.CheckpointRef{Version: base, URI: baseURI, Model: fakeskyrl.DefaultBaseModel},
		Output: flow.OutputRef{Version: version, Dir: filepath.Join(filepath.Dir(dir), "ckpt")},
		Algo:   flow.TrainAlgorithm{Objective: "grpo", MaxStaleness: 4},
		Trainer: &deployment.Trainer{Kind: deployment.TrainerTinker, URL: svc.url, LoRA: deployment.LoRA{Rank: 4}, Loss: loss, MiniBatches: 2,
			Adam: deployment.Adam{LR: 0.05}}}
}

// versionMeta is what the tests read of a version's tinker.json.
type versionMeta struct {
	Model string `json:"model_id"`
	State string `json:"state"`
}

// versionCheckpoints reads the tinker.json of the version in dir and lists
// its model's checkpoints on svc.
func versionCheckpoints(t *testing.T, svc *tinkerService, dir string) (versionMeta, []tinker.Checkpoint) {
	t.Helper()
	var meta versionMeta
	raw, err := os.ReadFile(filepath.Join(dir, "tinker.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &meta))
	cps, err := tinker.New(svc.url, "").Checkpoints(context.Background(), meta.Model)
	require.NoError(t, err)
	return meta, cps
}

func fastTinker() *activities.TinkerTraining {
	return &activities.TinkerTraining{Retry: tinker.RetryPolicy{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, MaxElapsed: 30 * time.Second}}
}

type sentFB struct {
	ForwardBackwardInput tinker.ForwardBackwardInput `json:"forward_backward_input"`
}

// TestTinkerStepSendsTheBatchAsDatums checks the exact datums a step sends
// with the importance_sampling loss: each sample's sequence shifted by one,
// weight 1/N on its trained tokens (N per minibatch) and 0 elsewhere, its
// behaviour log-probs and its advantage on those tokens, whole groups per
// minibatch; and that the version lands as a PEFT adapter with the state
// the next step loads.
func TestTinkerStepSendsTheBatchAsDatums(t *testing.T) {
	ctx := context.Background()
	svc := newTinkerService(t)
	in := tinkerInput(t, svc, deployment.LossImportanceSampling, 7, "dep@v1", "", "")
	out, err := fastTinker().TrainBatch(ctx, in)
	require.NoError(t, err)

	require.Empty(t, svc.bodies(tinker.PathForward), "importance sampling needs no proximal pass")
	fbs := svc.bodies(tinker.PathForwardBackward)
	require.Len(t, fbs, 2, "two minibatches of whole groups")
	var first sentFB
	require.NoError(t, json.Unmarshal(fbs[0], &first))
	in0 := first.ForwardBackwardInput
	require.Equal(t, tinker.LossImportanceSampling, in0.LossFn)
	require.Len(t, in0.Data, 2, "group g1")
	d := in0.Data[1] // sample 2: prompt 5 6 7, completion 10 11 12 with 11 masked
	require.Equal(t, tinker.Text([]int{5, 6, 7, 10, 11}), d.ModelInput)
	require.Equal(t, []float64{6, 7, 10, 11, 12}, d.LossFnInputs[tinker.InputTargetTokens].Data)
	n := 4.0 // trained tokens of g1: 2 + 2
	require.Equal(t, []float64{0, 0, 1 / n, 0, 1 / n}, d.LossFnInputs[tinker.InputWeights].Data)
	require.Equal(t, []float64{0, 0, -1, 0, -1}, d.LossFnInputs[tinker.InputAdvantages].Data)
	lp := d.LossFnInputs[tinker.InputLogprobs].Data
	require.InDelta(t, -6.2, lp[2], 1e-6)
	require.InDelta(t, -6.4, lp[4], 1e-6)
	require.Zero(t, lp[3])

	require.Equal(t, "dep@v1", out.Version)
	require.Equal(t, flow.CheckpointPEFTLoRA, out.Checkpoint.Format)
	require.Equal(t, 4, out.Samples)
	require.Equal(t, 6, out.TrainedTokens)
	dir := filepath.Join(in.Output.Dir, "v1")
	require.Equal(t, "file://"+dir, out.Checkpoint.URI)
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors", "tinker.json"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
	}
	// The service keeps v1's training state, for the next step to start
	// from, and no longer its sampler weights: the directory holds them.
	meta, cps := versionCheckpoints(t, svc, dir)
	require.Len(t, cps, 1)
	require.Equal(t, meta.State, cps[0].TinkerPath)
	require.Len(t, svc.bodies(tinker.PathTrainingRuns+"/"+meta.Model+"/checkpoints/sampler_weights/v1"), 1, "deleted by its kind and name")

	// The next step loads v1's state into a new model first.
	next := tinkerInput(t, svc, deployment.LossImportanceSampling, 8, "dep@v2", "dep@v1", out.Checkpoint.URI)
	next.Output.Dir = in.Output.Dir
	_, err = fastTinker().TrainBatch(ctx, next)
	require.NoError(t, err)
	loads := svc.bodies(tinker.PathLoadWeights)
	require.Len(t, loads, 1)
	var load tinker.LoadWeightsRequest
	require.NoError(t, json.Unmarshal(loads[0], &load))
	p, err := tinker.ParsePath(load.Path)
	require.NoError(t, err)
	require.Equal(t, tinker.KindWeights, p.Kind)
	require.Equal(t, "v1", p.Name)
	require.True(t, load.Optimizer, "the optimizer's moments go on with the weights")
}

// TestTinkerStepFoldsTheBehaviourWeight checks decoupled PPO: one forward
// pass before any update (the first minibatch's request, then the rest's,
// both queued before the first update; tinkerstep's test checks the
// order) gives the proximal
// log-probs, which the ppo loss
// takes its ratio against, and the behaviour weight min(π_prox/μ, cap)
// multiplies the advantage; IcePop zeroes a token's advantage.
func TestTinkerStepFoldsTheBehaviourWeight(t *testing.T) {
	ctx := context.Background()
	svc := newTinkerService(t)
	in := tinkerInput(t, svc, deployment.LossPPO, 9, "dep@v1", "", "")
	in.Algo.Masks = &deployment.TokenMasks{IcePop: true, IcePopLow: 0.5, IcePopHigh: 2}
	out, err := fastTinker().TrainBatch(ctx, in)
	require.NoError(t, err)
	require.Len(t, svc.bodies(tinker.PathForward), 2, "one proximal pass: the first minibatch, then the rest")
	fbs := svc.bodies(tinker.PathForwardBackward)
	var second sentFB
	require.NoError(t, json.Unmarshal(fbs[1], &second))
	in1 := second.ForwardBackwardInput
	require.Equal(t, tinker.LossPPO, in1.LossFn)
	require.Equal(t, map[string]float64{tinker.ClipLow: 0.8, tinker.ClipHigh: 1.28}, in1.LossFnConfig)
	// The fake's fresh model is uniform over 512 tokens: π_prox = −ln 512
	// for every token.
	prox := -math.Log(fakeskyrl.DefaultVocab)
	for i, behav := range []float64{-6.0, -7.0} { // group g2
		d := in1.Data[i]
		lp := d.LossFnInputs[tinker.InputLogprobs].Data
		adv := d.LossFnInputs[tinker.InputAdvantages].Data
		require.InDelta(t, prox, lp[1], 1e-5)
		a := []float64{0.5, -0.5}[i]
		ratio := math.Exp(prox - behav)
		if ratio < 0.5 || ratio > 2 {
			require.Zero(t, adv[1], "IcePop drops a token whose ratio leaves [0.5, 2]")
		} else {
			require.InDelta(t, a*math.Min(ratio, 5), adv[1], 1e-5)
		}
	}
	// −6.0 → ratio e^(−0.238) ≈ 0.79 kept; −7.0 → e^(0.76) ≈ 2.14 dropped.
	require.InDelta(t, 1.0/6, out.IcePopMasked, 1e-9, "one of six trained tokens")
}

// TestTinkerStepTakesTheKLPenaltyToTheBase checks kl_coef on the Tinker
// API: the step creates a second model of the base, never trained, takes
// its log-probs in a forward pass (the first minibatch, then the rest),
// shapes every trained token's advantage by kl_coef·(mean d − d), d the
// behaviour log-prob less the base's, records the mean d, and unloads the
// reference after.
func TestTinkerStepTakesTheKLPenaltyToTheBase(t *testing.T) {
	ctx := context.Background()
	svc := newTinkerService(t)
	in := tinkerInput(t, svc, deployment.LossImportanceSampling, 12, "dep@v1", "", "")
	const coef = 0.1
	in.Trainer.KLCoef = coef
	out, err := fastTinker().TrainBatch(ctx, in)
	require.NoError(t, err)
	require.Len(t, svc.bodies(tinker.PathCreateModel), 2, "the trained model and the reference")
	fwds := svc.bodies(tinker.PathForward)
	require.Len(t, fwds, 2, "the reference's pass: the first minibatch, then the rest")
	var ref struct {
		Model string `json:"model_id"`
	}
	require.NoError(t, json.Unmarshal(fwds[0], &ref))
	unloads := svc.bodies(tinker.PathUnloadModel)
	require.Len(t, unloads, 2, "the trained model and the reference unloaded")
	require.Contains(t, string(unloads[0])+string(unloads[1]), ref.Model)

	// The fake's fresh model is uniform over 512 tokens: the base's
	// log-prob is −ln 512 for every token.
	base := -math.Log(fakeskyrl.DefaultVocab)
	behav := []float64{-6.1, -6.3, -6.2, -6.4, -6.0, -7.0} // the six trained tokens
	mean := 0.0
	for _, b := range behav {
		mean += (b - base) / 6
	}
	require.InDelta(t, mean, out.Metrics["kl_ref"], 1e-5)
	fbs := svc.bodies(tinker.PathForwardBackward)
	require.Len(t, fbs, 2)
	var first sentFB
	require.NoError(t, json.Unmarshal(fbs[0], &first))
	d := first.ForwardBackwardInput.Data[1] // sample 2: advantage −1, its token 11 masked
	shaped := func(a, b float64) float64 { return a + coef*(mean-(b-base)) }
	adv := d.LossFnInputs[tinker.InputAdvantages].Data
	require.InDelta(t, shaped(-1, -6.2), adv[2], 1e-5)
	require.Zero(t, adv[3], "a token out of the loss carries nothing")
	require.InDelta(t, shaped(-1, -6.4), adv[4], 1e-5)

	bad := tinkerInput(t, svc, deployment.LossImportanceSampling, 13, "dep@v1", "", "")
	bad.Algo.KLCoef = -1
	_, err = fastTinker().TrainBatch(ctx, bad)
	require.ErrorContains(t, err, "kl_coef -1")
}

// TestTinkerStepRetriedAfterTheWorkerDied checks exactness under a killed
// worker: dying after the version was saved makes the retry fetch it (no
// new optimizer step, one sampler save); dying mid-step makes the retry
// start over from the base state on a new model, and the version is still
// saved once.
func TestTinkerStepRetriedAfterTheWorkerDied(t *testing.T) {
	svc := newTinkerService(t)
	// dies trains in, the worker dying once the service has answered a
	// request to a path ending so.
	dies := func(in flow.TrainBatchInput, at string) {
		ctx, cancel := context.WithCancel(context.Background())
		svc.mu.Lock()
		svc.dieAt, svc.cancel = at, cancel
		svc.mu.Unlock()
		_, err := fastTinker().TrainBatch(ctx, in)
		require.Error(t, err)
	}
	in := tinkerInput(t, svc, deployment.LossImportanceSampling, 11, "dep@v1", "", "")
	dies(in, "/archive")
	steps := len(svc.bodies(tinker.PathOptimStep))
	out, err := fastTinker().TrainBatch(context.Background(), in)
	require.NoError(t, err)
	require.True(t, out.Resumed)
	require.Equal(t, steps, len(svc.bodies(tinker.PathOptimStep)), "the retry applied no optimizer step")
	require.Equal(t, 1, svc.fake.SamplerSaves("v1"))

	in2 := tinkerInput(t, svc, deployment.LossImportanceSampling, 12, "dep@v2", "", "")
	dies(in2, tinker.PathOptimStep)
	out2, err := fastTinker().TrainBatch(context.Background(), in2)
	require.NoError(t, err)
	require.False(t, out2.Resumed, "nothing was saved: the step trained again, on a new model")
	require.Equal(t, 1, svc.fake.SamplerSaves("v2"), "the version was made once")
	again, err := fastTinker().TrainBatch(context.Background(), in2)
	require.NoError(t, err)
	require.True(t, again.Resumed, "a step already answered is answered from its files")

	// Dying once the saves are queued behind the updates, before the
	// updates have answered: the version saved on that model is not
	// trusted (an update might have failed before it), and the retry
	// trains again, on a new model.
	in3 := tinkerInput(t, svc, deployment.LossImportanceSampling, 13, "dep@v3", "", "")
	dies(in3, tinker.PathSaveWeights)
	saves := svc.bodies(tinker.PathSaveWeights)
	var rec tinker.SaveWeightsRequest
	require.NoError(t, json.Unmarshal(saves[len(saves)-1], &rec))
	require.Eventually(t, func() bool {
		cps, err := tinker.New(svc.url, "").Checkpoints(context.Background(), rec.ModelID)
		return err == nil && len(cps) == 2
	}, 10*time.Second, 5*time.Millisecond, "the first attempt's saves finished on the service")
	steps = len(svc.bodies(tinker.PathOptimStep))
	out3, err := fastTinker().TrainBatch(context.Background(), in3)
	require.NoError(t, err)
	require.False(t, out3.Resumed, "the retry trained again")
	require.Greater(t, len(svc.bodies(tinker.PathOptimStep)), steps)
	meta, _ := versionCheckpoints(t, svc, filepath.Join(in3.Output.Dir, "v3"))
	require.NotEqual(t, rec.ModelID, meta.Model)
}

// TestTinkerStepOutlastsA429Storm checks that throttling slows a step
// down without failing it, and that a refusal that will not change fails
// it for good, naming the request.
func TestTinkerStepOutlastsA429Storm(t *testing.T) {
	svc := newTinkerService(t)
	svc.fake.Faults.FailNext(fakeskyrl.RouteForwardBackward, 5, http.StatusTooManyRequests, 0)
	svc.fake.Faults.FailNext(fakeskyrl.RouteOptimStep, 5, http.StatusTooManyRequests, 0)
	_, err := fastTinker().TrainBatch(context.Background(), tinkerInput(t, svc, deployment.LossImportanceSampling, 13, "dep@v1", "", ""))
	require.NoError(t, err)
	require.Equal(t, 2+5, len(svc.bodies(tinker.PathForwardBackward)))

	bad := tinkerInput(t, svc, deployment.LossImportanceSampling, 14, "dep@v2", "", "")
	bad.Trainer.LoRA.Rank = 64 // past the fake's maximum rank
	_, err = fastTinker().TrainBatch(context.Background(), bad)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.True(t, app.NonRetryable())
	require.Equal(t, "TinkerRejected", app.Type())
	require.Contains(t, err.Error(), "create_model")
}

// TestTinkerStepRefusesABadBatch checks that a batch file that is not the
// one the loop wrote fails the step for good, naming it, and trains
// nothing, although it is read while the service makes the model.
func TestTinkerStepRefusesABadBatch(t *testing.T) {
	svc := newTinkerService(t)
	in := tinkerInput(t, svc, deployment.LossImportanceSampling, 15, "dep@v1", "", "")
	in.Batch.SHA256 = strings.Repeat("0", 64)
	_, err := fastTinker().TrainBatch(context.Background(), in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.True(t, app.NonRetryable())
	require.Equal(t, "BadInput", app.Type())
	require.ErrorContains(t, err, "not "+in.Batch.SHA256)
	require.Empty(t, svc.bodies(tinker.PathForward))
	require.Empty(t, svc.bodies(tinker.PathForwardBackward))
	require.NoDirExists(t, filepath.Join(in.Output.Dir, "v1"))
}

// TestTinkerPruneStatesDeletesTheNamedStates trains two versions, prunes
// the first: its training state is gone from the service, its sampler
// weights stay in its directory, the second's state is untouched, and a
// second pass (the state already gone) and a version without tinker.json
// are reported done; a state on another service is left there.
func TestTinkerPruneStatesDeletesTheNamedStates(t *testing.T) {
	ctx := context.Background()
	svc := newTinkerService(t)
	in := tinkerInput(t, svc, deployment.LossImportanceSampling, 21, "dep@v1", "", "")
	v1, err := fastTinker().TrainBatch(ctx, in)
	require.NoError(t, err)
	in2 := tinkerInput(t, svc, deployment.LossImportanceSampling, 22, "dep@v2", "dep@v1", v1.Checkpoint.URI)
	in2.Output.Dir = in.Output.Dir
	_, err = fastTinker().TrainBatch(ctx, in2)
	require.NoError(t, err)
	dir1, dir2 := filepath.Join(in.Output.Dir, "v1"), filepath.Join(in.Output.Dir, "v2")
	states := func(dir string) []string {
		_, cps := versionCheckpoints(t, svc, dir)
		var out []string
		for _, c := range cps {
			out = append(out, c.CheckpointType+" "+c.CheckpointID)
		}
		return out
	}
	require.Equal(t, []string{"training v1"}, states(dir1))

	bare := t.TempDir() // a version trained before tinker.json, or by another trainer
	moved := filepath.Join(t.TempDir(), "v3")
	require.NoError(t, os.MkdirAll(moved, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(moved, "tinker.json"), []byte(`{"service":"http://127.0.0.1:1","model_id":"m","state":"tinker://m/weights/v3"}`), 0o644))
	prune := flow.PruneStatesInput{Deployment: "dep", Trainer: in.Trainer, Versions: map[string]string{"dep@v1": dir1, "dep@v0": bare, "dep@v3": moved}}
	out, err := fastTinker().PruneStates(ctx, prune)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"dep@v0", "dep@v1", "dep@v3"}, out.Pruned)
	require.Empty(t, states(dir1), "v1's training state is deleted")
	require.FileExists(t, filepath.Join(dir1, "adapter_model.safetensors"), "its sampler weights stay")
	require.Equal(t, []string{"training v2"}, states(dir2), "v2's is kept")

	out, err = fastTinker().PruneStates(ctx, flow.PruneStatesInput{Deployment: "dep", Trainer: in.Trainer, Versions: map[string]string{"dep@v1": dir1}})
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v1"}, out.Pruned, "a state already gone counts as pruned")

	_, err = fastTinker().PruneStates(ctx, flow.PruneStatesInput{Deployment: "dep", Versions: map[string]string{"dep@v1": dir1}})
	require.ErrorContains(t, err, "names no tinker trainer")
}
