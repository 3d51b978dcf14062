package tinkerstep

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/internal/fakeskyrl"
	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

// recorder notes the route of every request the client sends, and of a
// retrieve_future the route of the request whose result it reads
// ("await forward"); a poll repeated while it waits is noted once.
type recorder struct {
	mu     sync.Mutex
	routes []string
	ids    map[string]string // request_id → route
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	route := strings.TrimPrefix(req.URL.Path, "/api/v1/")
	if route == "retrieve_future" {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		var f tinker.RetrieveFutureRequest
		_ = json.Unmarshal(body, &f)
		route = "await " + r.ids[f.RequestID]
	}
	r.mu.Lock()
	if n := len(r.routes); n == 0 || r.routes[n-1] != route || !strings.HasPrefix(route, "await") {
		r.routes = append(r.routes, route)
	}
	r.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || strings.HasPrefix(route, "await") {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var f tinker.FutureResponse
	if json.Unmarshal(body, &f) == nil && f.RequestID != "" {
		r.mu.Lock()
		r.ids[f.RequestID] = route
		r.mu.Unlock()
	}
	return resp, err
}

// fakeService is a client of a fake of SkyRL tx (through hc, nil: the
// default) and a session on it.
func fakeService(t *testing.T, hc *http.Client) (*tinker.Client, string) {
	t.Helper()
	f := fakeskyrl.New(fakeskyrl.Config{})
	srv := httptest.NewServer(f.Handler())
	t.Cleanup(func() { srv.Close(); f.Close() })
	c := tinker.New(srv.URL, "")
	c.HTTP = hc
	c.Retry = tinker.RetryPolicy{Initial: 5 * time.Millisecond, Max: 40 * time.Millisecond, MaxElapsed: 20 * time.Second}
	session, err := c.CreateSession(context.Background(), nil)
	require.NoError(t, err)
	return c, session
}

// TestTrainQueuesMinibatchesAhead: a step queues the next minibatches'
// forward_backward and optim_step before it reads the results of the ones
// ahead (two minibatches ahead at most), against a fake of SkyRL tx, which
// runs a model's requests in order; and the step trains exactly what one
// request at a time does: the same losses and the same weights after.
func TestTrainQueuesMinibatchesAhead(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{ids: map[string]string{}}
	c, session := fakeService(t, &http.Client{Transport: rec})

	// Five groups of two, one minibatch each.
	var samples []trainer.Sample
	for g := range 5 {
		for j := range 2 {
			adv := float64(2*j - 1)
			tokens := []int{1, 2 + g, 3 + j, 4, 5 + g}
			samples = append(samples, trainer.Sample{GroupID: fmt.Sprint(g), TokenIDs: tokens, LossMask: []uint8{0, 0, 1, 1, 1},
				Logprobs: []float32{0, 0, -1.5, -2, -1}, Advantage: &adv})
		}
	}
	cfg := Config{Trainer: deployment.Trainer{Loss: deployment.LossPPO, MiniBatches: 5, ClipLow: 0.2, ClipHigh: 0.2,
		Adam: deployment.Adam{LR: 0.05, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}}
	model, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 2})
	require.NoError(t, err)
	var seq int64
	next := func() int64 { seq++; return seq }
	rec.routes = nil
	cfg.Queued = func(context.Context) error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		rec.routes = append(rec.routes, "queued")
		return nil
	}
	st, err := Train(ctx, c, model, samples, cfg, next)
	require.NoError(t, err)
	require.Equal(t, 5, st.Updates)
	require.Equal(t, 1, st.ForwardPasses)
	cfg.Queued = nil

	// The proximal pass is queued first, in two requests: the first part
	// alone and the other four together. Each part's update is queued
	// once its log-probs are back (the first request's, then the
	// second's for the rest), and a minibatch's results are read when two
	// more are queued behind it. Once the last update is queued, Queued
	// is called before the results still in flight are read.
	update := []string{"forward_backward", "optim_step"}
	done := []string{"await forward_backward", "await optim_step"}
	want := slices.Concat([]string{"forward", "forward", "await forward"}, update, []string{"await forward"},
		update, update, done, update, done, update, done, []string{"queued"}, done, done)
	require.Equal(t, want, rec.routes)

	// The same step one request at a time, each awaited before the next
	// is sent, on a second model: the same losses, the same weights.
	other, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 2})
	require.NoError(t, err)
	loss, err := lossConfig(cfg)
	require.NoError(t, err)
	parts := trainer.SplitGroups(samples, 5)
	var flat []trainer.Sample
	for _, p := range parts {
		flat = append(flat, p...)
	}
	fwd, err := c.Forward(ctx, other, proximalInput(flat), 1)
	require.NoError(t, err)
	prox, err := proximal(flat, fwd)
	require.NoError(t, err)
	var one float64
	for i, part := range parts {
		in, _ := partInput(cfg, loss, part, prox[2*i:2*i+2], nil, 0)
		out, err := c.ForwardBackward(ctx, other, in, int64(2*i+2))
		require.NoError(t, err)
		_, err = c.OptimStep(ctx, other, tinker.AdamParams{LearningRate: 0.05, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}, int64(2*i+3))
		require.NoError(t, err)
		one += out.LossSum()
	}
	require.Equal(t, one, st.Loss)
	after, err := c.Forward(ctx, model, proximalInput(flat), seq+1)
	require.NoError(t, err)
	afterOne, err := c.Forward(ctx, other, proximalInput(flat), 12)
	require.NoError(t, err)
	require.Equal(t, afterOne.LossFnOutputs, after.LossFnOutputs)
	require.NotEqual(t, fwd.LossFnOutputs, after.LossFnOutputs, "the step changed the weights")
}

// TestNoUpdateFollowsAFailedLoad: a request queued ahead of the step (the
// base state's load_weights) is awaited once the proximal pass is queued
// behind it, and when it failed the step ends with its error before it
// queues any update, so no optimizer step lands on weights that were
// never loaded.
func TestNoUpdateFollowsAFailedLoad(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{ids: map[string]string{}}
	c, session := fakeService(t, &http.Client{Transport: rec})
	model, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 2})
	require.NoError(t, err)
	var seq int64
	next := func() int64 { seq++; return seq }
	var samples []trainer.Sample
	for j := range 2 {
		adv := float64(2*j - 1)
		samples = append(samples, trainer.Sample{GroupID: "g", TokenIDs: []int{1, 2, 3 + j}, LossMask: []uint8{0, 1, 1},
			Logprobs: []float32{0, -1, -2}, Advantage: &adv})
	}
	failed := errors.New("load_weights failed")
	cfg := Config{Trainer: deployment.Trainer{Loss: deployment.LossPPO, MiniBatches: 1, ClipLow: 0.2, ClipHigh: 0.2,
		Adam: deployment.Adam{LR: 0.05, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}},
		Ready: func(context.Context) error { return failed }}
	rec.routes = nil
	_, err = Train(ctx, c, model, samples, cfg, next)
	require.ErrorIs(t, err, failed)
	require.Equal(t, []string{"forward"}, rec.routes, "the proximal pass queued; no update")

	cfg.Ready = func(context.Context) error { return nil }
	rec.routes = nil
	_, err = Train(ctx, c, model, samples, cfg, next)
	require.NoError(t, err)
	require.Equal(t, []string{"forward", "await forward", "forward_backward", "optim_step", "await forward_backward", "await optim_step"}, rec.routes)
}

// TestKLPenaltyShapesTheAdvantages: with kl_coef, a step takes the
// reference model's log-probs in one more forward pass, and every trained
// token's advantage gains kl_coef·(mean d − d), d its behaviour log-prob
// less the reference's, the mean over the batch's trained tokens; the
// prompt's tokens carry none. Without a reference model the step is
// refused.
func TestKLPenaltyShapesTheAdvantages(t *testing.T) {
	ctx := context.Background()
	c, session := fakeService(t, nil)
	var samples []trainer.Sample
	for g := range 2 {
		for j := range 2 {
			adv := float64(2*j - 1)
			samples = append(samples, trainer.Sample{GroupID: fmt.Sprint(g), TokenIDs: []int{1, 2 + g, 3 + j, 4, 5 + g},
				LossMask: []uint8{0, 0, 1, 1, 1}, Logprobs: []float32{0, 0, -1.5, -0.1, -3}, Advantage: &adv})
		}
	}
	const coef = 0.5
	cfg := Config{Trainer: deployment.Trainer{Loss: deployment.LossImportanceSampling, MiniBatches: 2, KLCoef: coef,
		Adam: deployment.Adam{LR: 0.05, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}}
	model, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 2})
	require.NoError(t, err)
	var seq int64
	next := func() int64 { seq++; return seq }
	_, err = Train(ctx, c, model, samples, cfg, next)
	require.ErrorContains(t, err, "reference model")

	ref, err := c.CreateModel(ctx, session, fakeskyrl.DefaultBaseModel, tinker.LoraConfig{Rank: 2})
	require.NoError(t, err)
	fwd, err := c.Forward(ctx, ref, proximalInput(samples), 1)
	require.NoError(t, err)
	refLp, err := proximal(samples, fwd)
	require.NoError(t, err)
	var sum float64
	for i, smp := range samples {
		for tk := 2; tk < 5; tk++ {
			sum += float64(smp.Logprobs[tk]) - refLp[i][tk]
		}
	}
	mean := sum / 12

	var refSeq int64 = 1
	cfg.Reference, cfg.ReferenceSeq = ref, func() int64 { refSeq++; return refSeq }
	st, err := Train(ctx, c, model, samples, cfg, next)
	require.NoError(t, err)
	require.Equal(t, 1, st.ForwardPasses, "importance_sampling takes no proximal pass; the reference's is the one")
	require.NotNil(t, st.KL)
	require.InDelta(t, mean, *st.KL, 1e-9)
	require.InDelta(t, mean, st.Metrics()["kl_ref"], 1e-9)

	loss, err := lossConfig(cfg)
	require.NoError(t, err)
	in, _ := partInput(cfg, loss, samples[:2], nil, refLp[:2], mean)
	for j, d := range in.Data {
		adv := d.LossFnInputs[tinker.InputAdvantages].Data
		for pos := range adv {
			tk := pos + 1 // position pos predicts token pos+1
			want := 0.0
			if samples[j].LossMask[tk] == 1 {
				want = *samples[j].Advantage + coef*(mean-(float64(samples[j].Logprobs[tk])-refLp[j][tk]))
			}
			require.InDelta(t, want, adv[pos], 1e-9, "sample %d token %d", j, tk)
		}
	}
}
