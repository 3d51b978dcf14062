package tinker_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/fakeskyrl"
	"github.com/flywheel-ai/flywheel/tinker"
)

// fake starts a fake of SkyRL tx's server and a client of it with short
// backoffs.
func fake(t *testing.T, cfg fakeskyrl.Config) (*fakeskyrl.Server, *tinker.Client) {
	t.Helper()
	f := fakeskyrl.New(cfg)
	srv := httptest.NewServer(f.Handler())
	t.Cleanup(func() { srv.Close(); f.Close() })
	c := tinker.New(srv.URL, cfg.APIKey)
	c.Retry = tinker.RetryPolicy{Initial: 5 * time.Millisecond, Max: 40 * time.Millisecond, MaxElapsed: 20 * time.Second}
	return f, c
}

func datum(tokens []int) tinker.Datum {
	w := make([]float64, len(tokens)-1)
	for i := range w {
		w[i] = 1
	}
	return tinker.Datum{ModelInput: tinker.Text(tokens[:len(tokens)-1]), LossFnInputs: map[string]tinker.TensorData{
		tinker.InputTargetTokens: tinker.Ints(tokens[1:]), tinker.InputWeights: tinker.Floats(w)}}
}

// TestClientTrainsAndSaves drives the whole contract against an
// implementation the client did not write: a session, a model, passes
// that lower the loss, a saved state a new model loads to the same
// log-probs, and a sampler archive fetched to a directory.
func TestClientTrainsAndSaves(t *testing.T) {
	ctx := context.Background()
	f, c := fake(t, fakeskyrl.Config{APIKey: "k"})
	require.NoError(t, c.Healthz(ctx))
	session, err := c.CreateSession(ctx, []string{"test"})
	require.NoError(t, err)
	model, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 4})
	require.NoError(t, err)
	in := tinker.ForwardBackwardInput{Data: []tinker.Datum{datum([]int{1, 2, 3, 4})}, LossFn: tinker.LossCrossEntropy}
	var losses []float64
	for i := range 4 {
		out, err := c.ForwardBackward(ctx, model, in, int64(2*i+1))
		require.NoError(t, err)
		losses = append(losses, out.LossSum())
		_, err = c.OptimStep(ctx, model, tinker.AdamParams{LearningRate: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}, int64(2*i+2))
		require.NoError(t, err)
	}
	require.InDelta(t, 3*math.Log(fakeskyrl.DefaultVocab), losses[0], 1e-3, "SkyRL leaves loss:sum out; the client sums the elementwise losses")
	require.Less(t, losses[3], losses[0])
	require.Equal(t, 4, f.OptimSteps(model))

	state, err := c.SaveWeights(ctx, model, "v1", 9)
	require.NoError(t, err)
	require.Equal(t, "tinker://"+model+"/weights/v1", state)
	sampler, err := c.SaveWeightsForSampler(ctx, model, "v1", 10)
	require.NoError(t, err)
	p, err := tinker.ParsePath(sampler)
	require.NoError(t, err)
	require.Equal(t, tinker.Path{Model: model, Name: "v1"}, p)

	again, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 4})
	require.NoError(t, err)
	require.NoError(t, c.LoadWeights(ctx, again, state, true, 1))
	a, err := c.Forward(ctx, model, in, 11)
	require.NoError(t, err)
	b, err := c.Forward(ctx, again, in, 2)
	require.NoError(t, err)
	require.Equal(t, a.LossFnOutputs[0][tinker.OutputLogprobs].Data, b.LossFnOutputs[0][tinker.OutputLogprobs].Data)

	cps, err := c.Checkpoints(ctx, model)
	require.NoError(t, err)
	require.Len(t, cps, 2)
	dir := t.TempDir()
	require.NoError(t, c.DownloadSampler(ctx, model, "v1", dir))
	for _, name := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		_, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err, name)
	}

	// Deleting: the sampler weights by their SkyRL path (no kind), the
	// state by its; twice is not an error; a path of no kind is refused.
	require.NoError(t, c.DeleteCheckpoint(ctx, sampler))
	require.NoError(t, c.DeleteCheckpoint(ctx, sampler), "already gone")
	cps, err = c.Checkpoints(ctx, model)
	require.NoError(t, err)
	require.Len(t, cps, 1)
	require.Equal(t, state, cps[0].TinkerPath, "the training state stays")
	require.Error(t, c.DownloadSampler(ctx, model, "v1", t.TempDir()))
	require.NoError(t, c.DeleteCheckpoint(ctx, state))
	cps, err = c.Checkpoints(ctx, model)
	require.NoError(t, err)
	require.Empty(t, cps)
	require.ErrorContains(t, c.DeleteCheckpoint(ctx, "tinker://"+model+"/other/v1"), "names no checkpoint")
}

// TestClientErrorsNameTheRequest checks what will not change on a retry:
// a failed request (a token past the vocabulary), a refused body and a
// load that is not a model's first request are final errors that say
// which request and what the service answered.
func TestClientErrorsNameTheRequest(t *testing.T) {
	ctx := context.Background()
	_, c := fake(t, fakeskyrl.Config{Vocab: 16})
	session, err := c.CreateSession(ctx, nil)
	require.NoError(t, err)
	model, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 1})
	require.NoError(t, err)

	_, err = c.ForwardBackward(ctx, model, tinker.ForwardBackwardInput{Data: []tinker.Datum{datum([]int{1, 99})}, LossFn: tinker.LossCrossEntropy}, 1)
	var api *tinker.APIError
	require.ErrorAs(t, err, &api)
	require.False(t, api.Retryable)
	require.Equal(t, http.StatusBadRequest, api.Status)
	require.NotEmpty(t, api.RequestID)
	require.Contains(t, err.Error(), "/api/v1/forward_backward (request "+api.RequestID+"): HTTP 400")

	_, err = c.ForwardBackward(ctx, model, tinker.ForwardBackwardInput{Data: []tinker.Datum{datum([]int{1, 2})}, LossFn: tinker.LossCrossEntropy,
		LossFnConfig: map[string]float64{tinker.ClipLow: 0.8}}, 2)
	require.ErrorAs(t, err, &api)
	require.Equal(t, http.StatusUnprocessableEntity, api.Status)
	require.False(t, api.Retryable)
	require.Contains(t, api.Detail, "does not accept loss_fn_config keys")

	err = c.LoadWeights(ctx, model, "tinker://"+model+"/weights/x", true, 3)
	require.ErrorAs(t, err, &api)
	require.Equal(t, http.StatusBadRequest, api.Status)
	require.Contains(t, api.Detail, "LoadWeights is not permitted")

	_, err = c.CreateModel(ctx, "no-such-session", fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 1})
	require.ErrorAs(t, err, &api)
	require.Equal(t, http.StatusNotFound, api.Status)
}

// TestClientWaitsOutSlowResultsAndStorms checks the waits: a result slower
// than the service holds a poll (408, asked again), a 429 storm with
// Retry-After (slowed down, not failed), and OnWait called throughout.
func TestClientWaitsOutSlowResultsAndStorms(t *testing.T) {
	ctx := context.Background()
	f, c := fake(t, fakeskyrl.Config{RetrieveWait: 20 * time.Millisecond})
	var waits atomic.Int64
	c.OnWait = func() { waits.Add(1) }
	session, err := c.CreateSession(ctx, nil)
	require.NoError(t, err)
	model, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 1})
	require.NoError(t, err)
	in := tinker.ForwardBackwardInput{Data: []tinker.Datum{datum([]int{1, 2, 3})}, LossFn: tinker.LossCrossEntropy}

	f.Faults.SetDelay(150 * time.Millisecond)
	polls := f.Requests(fakeskyrl.RouteRetrieveFuture)
	_, err = c.ForwardBackward(ctx, model, in, 1)
	require.NoError(t, err)
	require.GreaterOrEqual(t, f.Requests(fakeskyrl.RouteRetrieveFuture)-polls, 3, "408s were asked again")
	f.Faults.SetDelay(0)

	f.Faults.FailNext(fakeskyrl.RouteForwardBackward, 6, http.StatusTooManyRequests, 0)
	before := f.Requests(fakeskyrl.RouteForwardBackward)
	start := time.Now()
	_, err = c.ForwardBackward(ctx, model, in, 2)
	require.NoError(t, err, "a storm slows the call down; it does not fail it")
	require.GreaterOrEqual(t, time.Since(start), 6*2500*time.Microsecond, "each retry waited at least half its backoff")
	require.Equal(t, 7, f.Requests(fakeskyrl.RouteForwardBackward)-before, "six refusals, then the call")
	require.Positive(t, waits.Load())

	c.Retry.MaxElapsed = 50 * time.Millisecond
	f.Faults.FailNext(fakeskyrl.RouteOptimStep, 1000, http.StatusServiceUnavailable, 0)
	_, err = c.OptimStep(ctx, model, tinker.AdamParams{LearningRate: 0.1}, 3)
	var api *tinker.APIError
	require.ErrorAs(t, err, &api)
	require.True(t, api.Retryable, "a service that stays down may come back: the activity retries")
	require.Contains(t, api.Detail, "gave up after")
}

// TestClientStopsWhenCancelled checks that cancelling the context ends a
// long poll at once.
func TestClientStopsWhenCancelled(t *testing.T) {
	f, c := fake(t, fakeskyrl.Config{})
	session, err := c.CreateSession(context.Background(), nil)
	require.NoError(t, err)
	model, err := c.CreateModel(context.Background(), session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 1})
	require.NoError(t, err)
	f.Faults.SetDelay(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.ForwardBackward(ctx, model, tinker.ForwardBackwardInput{Data: []tinker.Datum{datum([]int{1, 2})}, LossFn: tinker.LossCrossEntropy}, 1)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	require.Less(t, time.Since(start), 5*time.Second)
	f.Faults.SetDelay(0)
}

func TestUntarRefusesEscapes(t *testing.T) {
	for _, name := range []string{"../x", "/etc/x"} {
		err := tinker.Untar(tarGz(t, name), t.TempDir())
		require.ErrorContains(t, err, "leaves the directory", name)
	}
}

// TestTensorDataJSON checks the compact encoding: ids as integers, a
// float32 tensor at float32 precision that reads back to the same
// float32s, and a refusal of what JSON cannot hold.
func TestTensorDataJSON(t *testing.T) {
	x := []float64{float64(float32(-0.1)), 1.5, float64(float32(3.3e-9)), 0}
	b, err := json.Marshal(tinker.Floats(x))
	require.NoError(t, err)
	require.Equal(t, `{"data":[-0.1,1.5,3.3e-09,0],"dtype":"float32","shape":[4]}`, string(b))
	var back tinker.TensorData
	require.NoError(t, json.Unmarshal(b, &back))
	for i := range x {
		require.Equal(t, float32(x[i]), float32(back.Data[i]))
	}
	b, err = json.Marshal(tinker.Ints([]int{5, 260, 1 << 20}))
	require.NoError(t, err)
	require.Equal(t, `{"data":[5,260,1048576],"dtype":"int64","shape":[3]}`, string(b))
	_, err = json.Marshal(tinker.Floats([]float64{math.NaN()}))
	require.ErrorContains(t, err, "not a JSON number")
}
