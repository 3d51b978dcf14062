package tinkerserver

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

const baseName = "flywheel-policy"

func testBase(t testing.TB) *trainer.Model {
	t.Helper()
	m, err := trainer.NewModel(trainer.ModelConfig{Context: 32, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, 1)
	require.NoError(t, err)
	return m
}

// harness is a server under httptest and a raw HTTP client for it.
type harness struct {
	t    testing.TB
	srv  *Server
	http *httptest.Server
	key  string
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	if cfg.BaseModels == nil {
		cfg.BaseModels = map[string]*trainer.Model{baseName: testBase(t)}
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := New(cfg)
	require.NoError(t, err)
	h := &harness{t: t, srv: srv, http: httptest.NewServer(srv), key: cfg.APIKey}
	t.Cleanup(func() {
		h.http.Close()
		srv.Close()
	})
	return h
}

// do sends a request and decodes a 200 answer into out; it returns the
// status and the raw body.
func (h *harness) do(method, path string, in, out any) (int, []byte) {
	h.t.Helper()
	var body io.Reader
	if in != nil {
		if raw, ok := in.(string); ok {
			body = strings.NewReader(raw)
		} else {
			js, err := json.Marshal(in)
			require.NoError(h.t, err)
			body = bytes.NewReader(js)
		}
	}
	req, err := http.NewRequest(method, h.http.URL+path, body)
	require.NoError(h.t, err)
	req.Header.Set("Content-Type", "application/json")
	if h.key != "" {
		req.Header.Set("X-API-Key", h.key)
	}
	resp, err := h.http.Client().Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	if resp.StatusCode == http.StatusOK && out != nil {
		require.NoError(h.t, json.Unmarshal(data, out), string(data))
	}
	return resp.StatusCode, data
}

func (h *harness) post(path string, in, out any) (int, []byte) {
	h.t.Helper()
	return h.do(http.MethodPost, path, in, out)
}

// ok posts and requires 200.
func (h *harness) ok(path string, in, out any) {
	h.t.Helper()
	status, body := h.post(path, in, out)
	require.Equal(h.t, http.StatusOK, status, "%s: %s", path, body)
}

// result submits an asynchronous request and retrieves its result: the
// retrieve status and body (decoded into out on 200).
func (h *harness) result(path string, in, out any) (int, []byte) {
	h.t.Helper()
	var f tinker.FutureResponse
	h.ok(path, in, &f)
	require.NotEmpty(h.t, f.RequestID)
	require.Equal(h.t, f.RequestID, f.FutureID)
	return h.retrieve(f.RequestID, out)
}

func (h *harness) retrieve(id string, out any) (int, []byte) {
	h.t.Helper()
	for {
		status, body := h.post(tinker.PathRetrieveFuture, tinker.RetrieveFutureRequest{RequestID: id}, out)
		if status != http.StatusRequestTimeout {
			return status, body
		}
	}
}

// must is result requiring success.
func (h *harness) must(path string, in, out any) {
	h.t.Helper()
	status, body := h.result(path, in, out)
	require.Equal(h.t, http.StatusOK, status, "%s: %s", path, body)
}

func (h *harness) session() string {
	var s tinker.CreateSessionResponse
	h.ok(tinker.PathCreateSession, tinker.CreateSessionRequest{Tags: []string{"test"}, SDKVersion: "0", Type: "create_session"}, &s)
	require.NotEmpty(h.t, s.SessionID)
	return s.SessionID
}

func (h *harness) model(session string, lora tinker.LoraConfig) string {
	h.t.Helper()
	var resp tinker.CreateModelResponse
	h.ok(tinker.PathCreateModel, tinker.CreateModelRequest{SessionID: session, BaseModel: baseName, LoraConfig: lora}, &resp)
	var out createModelOutput
	status, body := h.retrieve(resp.RequestID, &out)
	require.Equal(h.t, http.StatusOK, status, string(body))
	require.Equal(h.t, resp.ModelID, out.ModelID)
	return resp.ModelID
}

func seqDatum(seq []int, weight float64) tinker.Datum {
	w := make([]float64, len(seq)-1)
	for i := range w {
		w[i] = weight
	}
	return tinker.Datum{ModelInput: tinker.Text(seq[:len(seq)-1]), LossFnInputs: map[string]tinker.TensorData{
		tinker.InputTargetTokens: tinker.Ints(seq[1:]), tinker.InputWeights: tinker.Floats(w)}}
}

func testData() []tinker.Datum {
	return []tinker.Datum{
		seqDatum([]int{trainer.TokImStart, 'h', 'e', 'l', 'l', 'o'}, 0.1),
		seqDatum([]int{trainer.TokImStart, 'h', 'e', 'y'}, 0.1),
		seqDatum([]int{'a', 'b', 'c', 'd', 'e'}, 0.1),
	}
}

func fbRequest(model string, seq *int64) tinker.ForwardBackwardRequest {
	return tinker.ForwardBackwardRequest{ModelID: model, SeqID: seq,
		ForwardBackwardInput: tinker.ForwardBackwardInput{Data: testData(), LossFn: tinker.LossCrossEntropy}}
}

func (h *harness) logprobs(model string) [][]float64 {
	h.t.Helper()
	var out tinker.ForwardBackwardOutput
	h.must(tinker.PathForward, tinker.ForwardRequest{ModelID: model,
		ForwardInput: tinker.ForwardBackwardInput{Data: testData(), LossFn: tinker.LossCrossEntropy}}, &out)
	lps := make([][]float64, len(out.LossFnOutputs))
	for i, o := range out.LossFnOutputs {
		lps[i] = o[tinker.OutputLogprobs].Data
	}
	return lps
}

func requireClose(t *testing.T, want, got [][]float64, tol float64) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.Len(t, got[i], len(want[i]))
		for j := range want[i] {
			require.InDelta(t, want[i][j], got[i][j], tol, "datum %d position %d", i, j)
		}
	}
}

func i64(v int64) *int64 { return &v }

// train takes a few steps on model.
func (h *harness) train(model string, steps int) {
	h.t.Helper()
	for i := 0; i < steps; i++ {
		var fb tinker.ForwardBackwardOutput
		h.must(tinker.PathForwardBackward, fbRequest(model, nil), &fb)
		var opt tinker.OptimStepResponse
		h.must(tinker.PathOptimStep, tinker.OptimStepRequest{ModelID: model,
			AdamParams: tinker.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}}, &opt)
		require.Greater(h.t, opt.Metrics["skyrl.ai/grad_norm"], 0.0)
		require.Equal(h.t, float64(i+1), opt.Metrics["step"])
	}
}

func TestFullLoop(t *testing.T) {
	for _, rank := range []int{4, 0} {
		t.Run(map[int]string{4: "lora", 0: "full weights"}[rank], func(t *testing.T) {
			dir := t.TempDir()
			h := newHarness(t, Config{Dir: dir})
			base := h.srv.cfg.BaseModels[baseName]
			sess := h.session()
			m1 := h.model(sess, tinker.LoraConfig{Rank: rank})
			before := h.logprobs(m1)

			var fb tinker.ForwardBackwardOutput
			h.must(tinker.PathForwardBackward, fbRequest(m1, nil), &fb)
			require.Equal(t, "scalar", fb.LossFnOutputType)
			require.Len(t, fb.LossFnOutputs, 3)
			var sum float64
			for d, o := range fb.LossFnOutputs {
				lp, el := o[tinker.OutputLogprobs], o[tinker.OutputLoss]
				require.Len(t, lp.Data, len(testData()[d].LossFnInputs[tinker.InputTargetTokens].Data))
				for i := range el.Data {
					require.InDelta(t, -0.1*lp.Data[i], el.Data[i], 1e-6)
					sum += el.Data[i]
				}
			}
			require.InDelta(t, sum, fb.Metrics[tinker.MetricLossSum], 1e-4)
			var opt tinker.OptimStepResponse
			h.must(tinker.PathOptimStep, tinker.OptimStepRequest{ModelID: m1,
				AdamParams: tinker.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}}, &opt)
			require.Equal(t, 1.0, opt.Metrics["step"])
			require.Equal(t, 1e-2, opt.Metrics["skyrl.ai/learning_rate"])
			require.Equal(t, opt.Metrics["grad_norm"], opt.Metrics["skyrl.ai/grad_norm"])
			after := h.logprobs(m1)
			require.Greater(t, after[0][3], before[0][3], "training raised the trained token's log-prob")

			// A saved state loads into a new model with the same weights
			// and Adam state: one more identical step stays identical.
			var saved tinker.SaveWeightsResponse
			h.must(tinker.PathSaveWeights, tinker.SaveWeightsRequest{ModelID: m1, Path: "step2"}, &saved)
			require.Equal(t, "tinker://"+m1+"/weights/step2", saved.Path)
			m2 := h.model(sess, tinker.LoraConfig{Rank: rank})
			h.must(tinker.PathLoadWeights, tinker.LoadWeightsRequest{ModelID: m2, Path: saved.Path, Optimizer: true}, nil)
			requireClose(t, after, h.logprobs(m2), 0)

			// The sampler archive, applied to the base, scores as the learner.
			var samp tinker.SaveWeightsForSamplerResponse
			h.must(tinker.PathSaveWeightsForSampler, tinker.SaveWeightsForSamplerRequest{ModelID: m1, Path: "serve1"}, &samp)
			require.Equal(t, "tinker://"+m1+"/serve1", samp.Path)
			archive := tinker.PathTrainingRuns + "/" + m1 + "/checkpoints/serve1/archive"
			noFollow := *h.http.Client()
			noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			resp, err := noFollow.Get(h.http.URL + archive)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusFound, resp.StatusCode)
			require.Equal(t, tinker.PathTrainingRuns+"/"+m1+"/checkpoints/serve1/download", resp.Header.Get("Location"))
			resp, err = h.http.Client().Get(h.http.URL + archive)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			unpacked := t.TempDir()
			untar(t, resp.Body, unpacked)
			resp.Body.Close()
			applied, err := trainer.ApplyPEFT(base, unpacked)
			require.NoError(t, err)
			direct, err := trainer.NewLearner(applied, trainer.LoRAConfig{})
			require.NoError(t, err)
			res, err := direct.Forward(context.Background(), learnerData(t), trainer.Loss{Fn: trainer.LossFnCrossEntropy})
			require.NoError(t, err)
			got := make([][]float64, len(res.Logprobs))
			for i, lp := range res.Logprobs {
				for _, v := range lp {
					got[i] = append(got[i], float64(v))
				}
			}
			requireClose(t, after, got, 1e-5)

			var list struct {
				Checkpoints []tinker.Checkpoint `json:"checkpoints"`
			}
			status, _ := h.do(http.MethodGet, tinker.PathTrainingRuns+"/"+m1+"/checkpoints", nil, &list)
			require.Equal(t, http.StatusOK, status)
			require.ElementsMatch(t, []tinker.Checkpoint{
				{CheckpointID: "step2", CheckpointType: tinker.CheckpointTraining, TinkerPath: saved.Path},
				{CheckpointID: "serve1", CheckpointType: tinker.CheckpointSampler, TinkerPath: "tinker://" + m1 + "/sampler_weights/serve1"},
			}, list.Checkpoints)

			// A restarted server on the same directory loads the state.
			h2 := newHarness(t, Config{Dir: dir, BaseModels: map[string]*trainer.Model{baseName: base}})
			m3 := h2.model(h2.session(), tinker.LoraConfig{Rank: rank})
			h2.must(tinker.PathLoadWeights, tinker.LoadWeightsRequest{ModelID: m3, Path: saved.Path}, nil)
			requireClose(t, after, h2.logprobs(m3), 0)
		})
	}
}

// learnerData is testData in the learner's terms.
func learnerData(t *testing.T) []trainer.TokenDatum {
	ch := &checker{}
	data, _ := passInput(ch, tinker.ForwardBackwardInput{Data: testData(), LossFn: tinker.LossCrossEntropy}, "x")
	require.Empty(t, ch.errs)
	return data
}

func TestMalformedRequests(t *testing.T) {
	h := newHarness(t, Config{})
	m := h.model(h.session(), tinker.LoraConfig{Rank: 2})
	fb := func(mutate func(*tinker.ForwardBackwardRequest)) tinker.ForwardBackwardRequest {
		req := fbRequest(m, nil)
		mutate(&req)
		return req
	}
	// Bodies that do not parse are 422 at once, FastAPI's list of errors.
	for name, body := range map[string]any{
		"not json":     `{"model_id":`,
		"unknown loss": fb(func(r *tinker.ForwardBackwardRequest) { r.ForwardBackwardInput.LossFn = "mse" }),
		"config key": fb(func(r *tinker.ForwardBackwardRequest) {
			r.ForwardBackwardInput.LossFnConfig = map[string]float64{"eps": 1}
		}),
		"no targets": fb(func(r *tinker.ForwardBackwardRequest) {
			delete(r.ForwardBackwardInput.Data[1].LossFnInputs, tinker.InputTargetTokens)
		}),
		"float token": fb(func(r *tinker.ForwardBackwardRequest) {
			r.ForwardBackwardInput.Data[0].LossFnInputs[tinker.InputTargetTokens].Data[2] = 1.5
		}),
		"image chunk": fb(func(r *tinker.ForwardBackwardRequest) {
			r.ForwardBackwardInput.Data[0].ModelInput.Chunks[0].Type = "image"
		}),
		"no model":       fb(func(r *tinker.ForwardBackwardRequest) { r.ModelID = "" }),
		"no data":        fb(func(r *tinker.ForwardBackwardRequest) { r.ForwardBackwardInput.Data = nil }),
		"bad clip value": `{"model_id":"` + m + `","forward_backward_input":{"data":[],"loss_fn":"ppo","loss_fn_config":{"clip_low_threshold":"x"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			status, resp := h.post(tinker.PathForwardBackward, body, nil)
			require.Equal(t, http.StatusUnprocessableEntity, status, string(resp))
			var detail struct {
				Detail []fieldError `json:"detail"`
			}
			require.NoError(t, json.Unmarshal(resp, &detail))
			require.NotEmpty(t, detail.Detail)
		})
	}
	// Datums that parse but that the learner refuses fail their future
	// with 400 and a message naming the datum and position.
	for name, c := range map[string]struct {
		req tinker.ForwardBackwardRequest
		msg string
	}{
		"not shifted": {fb(func(r *tinker.ForwardBackwardRequest) {
			r.ForwardBackwardInput.Data[1].LossFnInputs[tinker.InputTargetTokens].Data[0] = 'x'
		}), "datum 1 position 0: target 120 is not the next input token 104"},
		"vocabulary": {fb(func(r *tinker.ForwardBackwardRequest) {
			r.ForwardBackwardInput.Data[2].LossFnInputs[tinker.InputTargetTokens].Data[3] = 1e6
		}), "datum 2 position 3: target token 1000000 outside the vocabulary"},
		"lengths": {fb(func(r *tinker.ForwardBackwardRequest) {
			r.ForwardBackwardInput.Data[0].LossFnInputs[tinker.InputWeights] = tinker.Floats([]float64{1})
		}), "datum 0: 1 weights for 5 positions"},
		"ppo without logprobs": {fb(func(r *tinker.ForwardBackwardRequest) { r.ForwardBackwardInput.LossFn = tinker.LossPPO }),
			"datum 0: loss ppo needs 5 logprobs and advantages"},
		"unimplemented loss": {fb(func(r *tinker.ForwardBackwardRequest) { r.ForwardBackwardInput.LossFn = "cispo" }),
			`loss function "cispo"`},
		"empty": {fb(func(r *tinker.ForwardBackwardRequest) { r.ForwardBackwardInput.Data = []tinker.Datum{} }), "no datums"},
		"too long": {fb(func(r *tinker.ForwardBackwardRequest) {
			r.ForwardBackwardInput.Data[0] = seqDatum(make([]int, 40), 1)
		}), "exceed the context of 32"},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := h.result(tinker.PathForwardBackward, c.req, nil)
			require.Equal(t, http.StatusBadRequest, status, string(body))
			var detail struct {
				Detail string `json:"detail"`
			}
			require.NoError(t, json.Unmarshal(body, &detail))
			require.Contains(t, detail.Detail, c.msg)
		})
	}
	// None of them reached the gradient.
	var opt tinker.OptimStepResponse
	h.must(tinker.PathOptimStep, tinker.OptimStepRequest{ModelID: m, AdamParams: tinker.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}}, &opt)
	require.Zero(t, opt.Metrics["grad_norm"])

	status, body := h.post(tinker.PathOptimStep, `{"model_id":"`+m+`","adam_params":{"beta1":1}}`, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status, string(body))
	require.Contains(t, string(body), "beta1")
	status, body = h.post(tinker.PathSaveWeights, tinker.SaveWeightsRequest{ModelID: m, Path: "../x"}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status, string(body))
	status, body = h.post(tinker.PathForwardBackward, fbRequest("model_nope", nil), nil)
	require.Equal(t, http.StatusNotFound, status, string(body))
	require.JSONEq(t, `{"detail":"Model not found"}`, string(body))
	status, body = h.post("/api/v1/nothing", "{}", nil)
	require.Equal(t, http.StatusNotFound, status)
	require.JSONEq(t, `{"detail":"Not Found"}`, string(body))
	status, _ = h.do(http.MethodGet, tinker.PathForwardBackward, nil, nil)
	require.Equal(t, http.StatusMethodNotAllowed, status)
}

func TestSeqIDDeduplication(t *testing.T) {
	h := newHarness(t, Config{})
	m := h.model(h.session(), tinker.LoraConfig{Rank: 2})
	var a, b tinker.FutureResponse
	h.ok(tinker.PathForwardBackward, fbRequest(m, i64(1)), &a)
	h.ok(tinker.PathForwardBackward, fbRequest(m, i64(1)), &b)
	require.Equal(t, a.RequestID, b.RequestID, "a retry gets the same future")
	other := fbRequest(m, i64(1))
	other.ForwardBackwardInput.Data = other.ForwardBackwardInput.Data[:1]
	status, body := h.post(tinker.PathForwardBackward, other, nil)
	require.Equal(t, http.StatusConflict, status)
	require.JSONEq(t, `{"detail":"Training request sequence number was reused"}`, string(body))
	status, _ = h.post(tinker.PathOptimStep, tinker.OptimStepRequest{ModelID: m, SeqID: i64(1), AdamParams: tinker.AdamParams{LearningRate: 1e-3, Eps: 1e-8}}, nil)
	require.Equal(t, http.StatusConflict, status, "another request type with the seq_id")

	// The request ran once.
	status, _ = h.retrieve(a.RequestID, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, 1, countKind(h.srv, m, reqForwardBackward))
}

func countKind(s *Server, model, kind string) int {
	s.futures.mu.Lock()
	defer s.futures.mu.Unlock()
	n := 0
	for _, f := range s.futures.byID {
		if f.model == model && f.kind == kind {
			n++
		}
	}
	return n
}

// block holds a model's worker until the returned function is called.
func block(t *testing.T, s *Server, modelID string) func() {
	t.Helper()
	release := make(chan struct{})
	s.mu.Lock()
	m := s.models[modelID]
	m.pending++
	s.mu.Unlock()
	f := &future{id: s.newID(), model: modelID, kind: "block", done: make(chan struct{})}
	m.jobs <- job{fut: f, run: func(context.Context, *model) (any, error) { <-release; return nil, nil }}
	return func() { close(release) }
}

func TestRetrieveFutureWaits(t *testing.T) {
	h := newHarness(t, Config{RetrieveWait: 50 * time.Millisecond})
	m := h.model(h.session(), tinker.LoraConfig{Rank: 2})
	release := block(t, h.srv, m)
	var f tinker.FutureResponse
	h.ok(tinker.PathForwardBackward, fbRequest(m, nil), &f)
	start := time.Now()
	status, body := h.post(tinker.PathRetrieveFuture, tinker.RetrieveFutureRequest{RequestID: f.RequestID}, nil)
	require.Equal(t, http.StatusRequestTimeout, status)
	require.JSONEq(t, `{"detail":"Timeout waiting for result"}`, string(body))
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	release()
	status, body = h.retrieve(f.RequestID, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	status, body = h.post(tinker.PathRetrieveFuture, tinker.RetrieveFutureRequest{RequestID: "12"}, nil)
	require.Equal(t, http.StatusNotFound, status)
	require.JSONEq(t, `{"detail":"Future not found"}`, string(body))
}

func TestLoadWeightsOnlyFirst(t *testing.T) {
	h := newHarness(t, Config{})
	sess := h.session()
	m := h.model(sess, tinker.LoraConfig{Rank: 2})
	h.must(tinker.PathSaveWeights, tinker.SaveWeightsRequest{ModelID: m, Path: "s"}, nil)
	status, body := h.post(tinker.PathSaveWeights, tinker.SaveWeightsRequest{ModelID: m, Path: "s"}, nil)
	require.Equal(t, http.StatusConflict, status)
	require.JSONEq(t, `{"detail":"Checkpoint 's' already exists for model '`+m+`'"}`, string(body))

	status, body = h.post(tinker.PathLoadWeights, tinker.LoadWeightsRequest{ModelID: m, Path: "tinker://" + m + "/weights/s"}, nil)
	require.Equal(t, http.StatusBadRequest, status)
	require.JSONEq(t, `{"detail":"LoadWeights is not permitted with seq_id 2"}`, string(body))

	fresh := h.model(sess, tinker.LoraConfig{Rank: 2})
	for path, want := range map[string]int{
		"tinker://" + m + "/weights/none":         http.StatusNotFound,
		"tinker://" + m + "/sampler_weights/s":    http.StatusBadRequest,
		"tinker://" + m + "/weights/..%2F..%2Fx":  http.StatusBadRequest,
		"/tmp/s":                                  http.StatusBadRequest,
		"tinker://" + m + "/weights/s/extra/more": http.StatusBadRequest,
	} {
		status, body := h.post(tinker.PathLoadWeights, tinker.LoadWeightsRequest{ModelID: fresh, Path: path}, nil)
		require.Equal(t, want, status, "%s: %s", path, body)
	}
	// Another rank is refused when the state loads.
	other := h.model(sess, tinker.LoraConfig{Rank: 3})
	status, body = h.result(tinker.PathLoadWeights, tinker.LoadWeightsRequest{ModelID: other, Path: "tinker://" + m + "/weights/s"}, nil)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(body), "has lora rank 2")
}

func TestEvictionKeepsSavedStates(t *testing.T) {
	h := newHarness(t, Config{MaxModels: 1})
	sess := h.session()
	a := h.model(sess, tinker.LoraConfig{Rank: 2})
	h.train(a, 1)
	h.must(tinker.PathSaveWeights, tinker.SaveWeightsRequest{ModelID: a, Path: "kept"}, nil)
	want := h.logprobs(a)

	b := h.model(sess, tinker.LoraConfig{Rank: 2})
	status, body := h.post(tinker.PathForward, tinker.ForwardRequest{ModelID: a,
		ForwardInput: tinker.ForwardBackwardInput{Data: testData(), LossFn: tinker.LossCrossEntropy}}, nil)
	require.Equal(t, http.StatusNotFound, status)
	require.Contains(t, string(body), "evicted while idle")
	h.must(tinker.PathLoadWeights, tinker.LoadWeightsRequest{ModelID: b, Path: "tinker://" + a + "/weights/kept"}, nil)
	requireClose(t, want, h.logprobs(b), 0)

	// A busy model is not evicted: creating another is 429.
	release := block(t, h.srv, b)
	defer release()
	status, body = h.post(tinker.PathCreateModel, tinker.CreateModelRequest{SessionID: sess, BaseModel: baseName, LoraConfig: tinker.LoraConfig{Rank: 2}}, nil)
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
}

func TestUnloadModel(t *testing.T) {
	h := newHarness(t, Config{})
	m := h.model(h.session(), tinker.LoraConfig{Rank: 2})
	var resp tinker.UnloadModelResponse
	h.ok(tinker.PathUnloadModel, tinker.UnloadModelRequest{ModelID: m}, &resp)
	require.Equal(t, m, resp.ModelID)
	var out map[string]any
	status, _ := h.retrieve(resp.RequestID, &out)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, map[string]any{"model_id": m, "status": "unloaded", "type": "unload_model"}, out)
	status, body := h.post(tinker.PathForwardBackward, fbRequest(m, nil), nil)
	require.Equal(t, http.StatusNotFound, status)
	require.Contains(t, string(body), "unloaded")
}

func TestCreateModelRefuses(t *testing.T) {
	h := newHarness(t, Config{})
	sess := h.session()
	no := false
	for name, c := range map[string]struct {
		req    tinker.CreateModelRequest
		status int
		msg    string
	}{
		"negative rank": {tinker.CreateModelRequest{SessionID: sess, BaseModel: baseName, LoraConfig: tinker.LoraConfig{Rank: -1}}, 400, "LoRA rank -1 must be between 1 and 16"},
		"rank too big":  {tinker.CreateModelRequest{SessionID: sess, BaseModel: baseName, LoraConfig: tinker.LoraConfig{Rank: 17}}, 400, "between 1 and 16"},
		"unknown base":  {tinker.CreateModelRequest{SessionID: sess, BaseModel: "Qwen/Qwen3-8B", LoraConfig: tinker.LoraConfig{Rank: 2}}, 400, "is not served here"},
		"no session":    {tinker.CreateModelRequest{SessionID: "session_x", BaseModel: baseName, LoraConfig: tinker.LoraConfig{Rank: 2}}, 404, "Session not found"},
		"nothing to train": {tinker.CreateModelRequest{SessionID: sess, BaseModel: baseName,
			LoraConfig: tinker.LoraConfig{Rank: 2, TrainAttn: &no, TrainMLP: &no, TrainUnembed: &no}}, 400, "trains no layer"},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := h.post(tinker.PathCreateModel, c.req, nil)
			require.Equal(t, c.status, status, string(body))
			require.Contains(t, string(body), c.msg)
		})
	}
	var caps tinker.Capabilities
	status, _ := h.do(http.MethodGet, tinker.PathCapabilities, nil, &caps)
	require.Equal(t, http.StatusOK, status)
	require.Len(t, caps.SupportedModels, 1)
	require.Equal(t, baseName, caps.SupportedModels[0].ModelName)
	status, _ = h.post(tinker.PathSessionHeartbeat, map[string]string{"session_id": sess}, nil)
	require.Equal(t, http.StatusOK, status)
	status, _ = h.post(tinker.PathSessionHeartbeat, map[string]string{"session_id": "session_x"}, nil)
	require.Equal(t, http.StatusNotFound, status)
}

func TestAPIKey(t *testing.T) {
	h := newHarness(t, Config{APIKey: "sekrit"})
	h.session() // the harness sends the key
	h.key = "wrong"
	status, body := h.post(tinker.PathCreateSession, tinker.CreateSessionRequest{}, nil)
	require.Equal(t, http.StatusUnauthorized, status)
	require.JSONEq(t, `{"detail":"Invalid API key"}`, string(body))
	h.key = ""
	status, _ = h.post(tinker.PathCreateSession, tinker.CreateSessionRequest{}, nil)
	require.Equal(t, http.StatusUnauthorized, status)
	status, _ = h.do(http.MethodGet, tinker.PathHealthz, nil, nil)
	require.Equal(t, http.StatusOK, status, "health probes need no key")
}

func TestConfigValidation(t *testing.T) {
	_, err := New(Config{})
	require.ErrorContains(t, err, "base models")
	require.ErrorContains(t, err, "dir: required")
	_, err = New(Config{BaseModels: map[string]*trainer.Model{"x": nil}, Dir: t.TempDir(), MaxModels: -1})
	require.ErrorContains(t, err, `base model "x"`)
	require.ErrorContains(t, err, "max models -1")
}

// untar unpacks a tar.gz of regular files into dir.
func untar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	zr, err := gzip.NewReader(r)
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
		require.Equal(t, byte(tar.TypeReg), h.Typeflag)
		require.NotContains(t, h.Name, "/")
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, h.Name), data, 0o644))
	}
}

// TestDeleteCheckpoint: Tinker's DELETE of a checkpoint by kind and name,
// as SkyRL answers it: 204 and the file gone, 404 when it is not there, 400
// for an id of no kind.
func TestDeleteCheckpoint(t *testing.T) {
	h := newHarness(t, Config{})
	m := h.model(h.session(), tinker.LoraConfig{Rank: 2})
	h.train(m, 1)
	h.must(tinker.PathSaveWeights, tinker.SaveWeightsRequest{ModelID: m, Path: "v1"}, nil)
	h.must(tinker.PathSaveWeightsForSampler, tinker.SaveWeightsForSamplerRequest{ModelID: m, Path: "v1"}, nil)
	base := tinker.PathTrainingRuns + "/" + m + "/checkpoints/"
	count := func() int {
		var out struct {
			Checkpoints []tinker.Checkpoint `json:"checkpoints"`
		}
		status, body := h.do(http.MethodGet, tinker.PathTrainingRuns+"/"+m+"/checkpoints", nil, &out)
		require.Equal(t, http.StatusOK, status, string(body))
		return len(out.Checkpoints)
	}
	require.Equal(t, 2, count())
	status, body := h.do(http.MethodDelete, base+"sampler_weights/v1", nil, nil)
	require.Equal(t, http.StatusNoContent, status, string(body))
	require.Equal(t, 1, count())
	status, _ = h.do(http.MethodGet, base+"v1/download", nil, nil)
	require.Equal(t, http.StatusNotFound, status)
	status, _ = h.do(http.MethodDelete, base+"sampler_weights/v1", nil, nil)
	require.Equal(t, http.StatusNotFound, status)
	status, body = h.do(http.MethodDelete, base+"v1", nil, nil)
	require.Equal(t, http.StatusBadRequest, status, string(body))
	status, _ = h.do(http.MethodDelete, base+"other/v1", nil, nil)
	require.Equal(t, http.StatusBadRequest, status)
	status, _ = h.do(http.MethodDelete, base+"weights/v1", nil, nil)
	require.Equal(t, http.StatusNoContent, status)
	require.Zero(t, count())
}
