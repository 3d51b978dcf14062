package fakeskyrl

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// harness drives the fake over HTTP with raw net/http and encoding/json.
type harness struct {
	t    *testing.T
	srv  *Server
	url  string
	http *http.Client
	key  string
}

func start(t *testing.T, cfg Config) *harness {
	t.Helper()
	srv := New(cfg)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &harness{t: t, srv: srv, url: ts.URL, http: noRedirect, key: cfg.APIKey}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(a.body, &m), "body %s", a.body)
	return m
}

func (a answer) detail(t *testing.T) any {
	t.Helper()
	return a.json(t)["detail"]
}

func (h *harness) do(method, path string, body any) answer {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, ok := body.([]byte)
		if !ok {
			var err error
			b, err = json.Marshal(body)
			require.NoError(h.t, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	require.NoError(h.t, err)
	req.Header.Set("Content-Type", "application/json")
	if h.key != "" {
		req.Header.Set("X-API-Key", h.key)
	}
	resp, err := h.http.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: data}
}

func (h *harness) post(route string, body any) answer { return h.do(http.MethodPost, route, body) }

// ok posts and requires a 200.
func (h *harness) ok(route string, body any) map[string]any {
	h.t.Helper()
	a := h.post(route, body)
	require.Equal(h.t, http.StatusOK, a.status, "%s: %s", route, a.body)
	return a.json(h.t)
}

// async posts a request that answers a future and returns its request_id.
func (h *harness) async(route string, body any) string {
	h.t.Helper()
	f := h.ok(route, body)
	require.Equal(h.t, "pending", f["status"])
	require.Equal(h.t, f["request_id"], f["future_id"])
	return f["request_id"].(string)
}

func (h *harness) retrieve(requestID string) answer {
	h.t.Helper()
	return h.post(RouteRetrieveFuture, map[string]string{"request_id": requestID})
}

// result retrieves a future that must complete.
func (h *harness) result(requestID string) map[string]any {
	h.t.Helper()
	a := h.retrieve(requestID)
	require.Equal(h.t, http.StatusOK, a.status, "retrieve %s: %s", requestID, a.body)
	return a.json(h.t)
}

// newModel creates a session and a model and waits for the model.
func (h *harness) newModel() string {
	h.t.Helper()
	session := h.ok(RouteCreateSession, map[string]any{"tags": []string{}, "sdk_version": "0.0.0"})
	created := h.ok(RouteCreateModel, map[string]any{
		"session_id": session["session_id"], "base_model": DefaultBaseModel, "lora_config": map[string]any{"rank": 4},
	})
	require.Equal(h.t, "created", created["status"])
	out := h.result(created["request_id"].(string))
	require.Equal(h.t, created["model_id"], out["model_id"])
	require.EqualValues(h.t, 32, out["lora_config"].(map[string]any)["alpha"])
	return out["model_id"].(string)
}

func ceDatum(tokens, targets []int) map[string]any {
	return map[string]any{
		"model_input":    map[string]any{"chunks": []any{map[string]any{"type": "encoded_text", "tokens": tokens}}},
		"loss_fn_inputs": map[string]any{"target_tokens": map[string]any{"data": targets}},
	}
}

func fwdBwd(model string, lossFn string, data ...map[string]any) map[string]any {
	return map[string]any{
		"model_id":               model,
		"forward_backward_input": map[string]any{"data": data, "loss_fn": lossFn},
	}
}

// summedLoss sums every elementwise_loss of a forward(_backward) result,
// as a client must: SkyRL's JAX backend leaves metrics empty.
func summedLoss(t *testing.T, out map[string]any) float64 {
	t.Helper()
	require.Equal(t, "scalar", out["loss_fn_output_type"])
	require.Empty(t, out["metrics"])
	var sum float64
	for _, o := range out["loss_fn_outputs"].([]any) {
		loss := o.(map[string]any)["elementwise_loss"].(map[string]any)
		require.Equal(t, "float32", loss["dtype"])
		for _, v := range loss["data"].([]any) {
			sum += v.(float64)
		}
	}
	return sum
}

func adam(lr float64) map[string]any {
	return map[string]any{"learning_rate": lr, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}
}

func TestCrossEntropyLossFallsWithOptimSteps(t *testing.T) {
	h := start(t, Config{})
	model := h.newModel()
	datum := ceDatum([]int{1, 2, 3, 4}, []int{5, 5, 7, 7})

	var losses []float64
	for step := 0; step < 5; step++ {
		out := h.result(h.async(RouteForwardBackward, fwdBwd(model, "cross_entropy", datum)))
		losses = append(losses, summedLoss(t, out))
		opt := h.result(h.async(RouteOptimStep, map[string]any{"model_id": model, "adam_params": adam(0.1)}))
		metrics := opt["metrics"].(map[string]any)
		require.Greater(t, metrics["skyrl.ai/grad_norm"].(float64), 0.0)
		require.InDelta(t, 0.1, metrics["skyrl.ai/learning_rate"].(float64), 1e-12)
	}
	// A fresh adapter leaves the uniform base: each token costs ln(Vocab).
	require.InDelta(t, 4*math.Log(DefaultVocab), losses[0], 1e-4)
	for i := 1; i < len(losses); i++ {
		require.Less(t, losses[i], losses[i-1], "losses %v", losses)
	}
	require.Equal(t, 5, h.srv.OptimSteps(model))
	require.Equal(t, 5, h.srv.Requests(RouteOptimStep))
}

func TestWeightsMaskTheLoss(t *testing.T) {
	h := start(t, Config{Vocab: 16})
	model := h.newModel()
	datum := ceDatum([]int{1, 2, 3}, []int{4, 5, 6})
	datum["loss_fn_inputs"].(map[string]any)["weights"] = map[string]any{"data": []float64{0, 1, 0}}
	out := h.result(h.async(RouteForwardBackward, fwdBwd(model, "cross_entropy", datum)))
	first := out["loss_fn_outputs"].([]any)[0].(map[string]any)
	loss := first["elementwise_loss"].(map[string]any)
	require.Equal(t, []any{3.0}, loss["shape"])
	data := loss["data"].([]any)
	require.Zero(t, data[0])
	require.InDelta(t, math.Log(16), data[1], 1e-5)
	require.Zero(t, data[2])
}

func TestSeqIDDeduplication(t *testing.T) {
	h := start(t, Config{})
	model := h.newModel()
	body := fwdBwd(model, "cross_entropy", ceDatum([]int{1, 2}, []int{3, 4}))
	body["seq_id"] = 1
	first := h.async(RouteForwardBackward, body)
	require.Equal(t, first, h.async(RouteForwardBackward, body), "a retried request keeps its request_id")

	other := fwdBwd(model, "cross_entropy", ceDatum([]int{1, 2}, []int{3, 5}))
	other["seq_id"] = 1
	a := h.post(RouteForwardBackward, other)
	require.Equal(t, http.StatusConflict, a.status)
	require.Equal(t, "Training request sequence number was reused", a.detail(t))

	step := map[string]any{"model_id": model, "adam_params": adam(0.01), "seq_id": 2}
	id := h.async(RouteOptimStep, step)
	require.Equal(t, id, h.async(RouteOptimStep, step))
	h.result(id)
	require.Equal(t, 1, h.srv.OptimSteps(model), "a retried step made one version")

	// Another request type under a used seq_id is a reuse too.
	fwd := map[string]any{"model_id": model, "forward_input": body["forward_backward_input"], "seq_id": 1}
	require.Equal(t, http.StatusConflict, h.post(RouteForward, fwd).status)
}

func TestLoadWeights(t *testing.T) {
	h := start(t, Config{})
	source := h.newModel()
	datum := ceDatum([]int{1, 2}, []int{9, 9})
	h.result(h.async(RouteForwardBackward, fwdBwd(source, "cross_entropy", datum)))
	h.result(h.async(RouteOptimStep, map[string]any{"model_id": source, "adam_params": adam(0.5)}))
	saved := h.result(h.async(RouteSaveWeights, map[string]any{"model_id": source, "path": "ckpt-1"}))
	path := "tinker://" + source + "/weights/ckpt-1"
	require.Equal(t, map[string]any{"path": path, "type": "save_weights"}, saved)

	a := h.post(RouteSaveWeights, map[string]any{"model_id": source, "path": "ckpt-1"})
	require.Equal(t, http.StatusConflict, a.status)
	a = h.post(RouteSaveWeights, map[string]any{"model_id": source, "path": "../etc"})
	require.Equal(t, http.StatusUnprocessableEntity, a.status)

	// Not the model's first request: 400.
	busy := h.newModel()
	h.result(h.async(RouteForwardBackward, fwdBwd(busy, "cross_entropy", datum)))
	a = h.post(RouteLoadWeights, map[string]any{"model_id": busy, "path": path})
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Equal(t, "LoadWeights is not permitted with seq_id 2", a.detail(t))

	fresh := h.newModel()
	a = h.post(RouteLoadWeights, map[string]any{"model_id": fresh, "path": "tinker://" + source + "/weights/nope"})
	require.Equal(t, http.StatusNotFound, a.status)
	a = h.post(RouteLoadWeights, map[string]any{"model_id": fresh, "path": "s3://bucket/ckpt"})
	require.Equal(t, http.StatusBadRequest, a.status)
	loaded := h.result(h.async(RouteLoadWeights, map[string]any{"model_id": fresh, "path": path, "optimizer": true}))
	require.Equal(t, map[string]any{"type": "load_weights"}, loaded)

	fwd := func(model string) float64 {
		body := map[string]any{"model_id": model, "forward_input": map[string]any{"data": []any{datum}, "loss_fn": "cross_entropy"}}
		return summedLoss(t, h.result(h.async(RouteForward, body)))
	}
	require.InDelta(t, fwd(source), fwd(fresh), 1e-6)
	require.Less(t, fwd(fresh), 2*math.Log(DefaultVocab))
}

func TestRetrieveFutureTimesOutWhileProcessing(t *testing.T) {
	h := start(t, Config{RetrieveWait: 50 * time.Millisecond})
	model := h.newModel()
	h.srv.Faults.SetDelay(300 * time.Millisecond)
	id := h.async(RouteForwardBackward, fwdBwd(model, "cross_entropy", ceDatum([]int{1}, []int{2})))

	a := h.retrieve(id)
	require.Equal(t, http.StatusRequestTimeout, a.status)
	require.Equal(t, "Timeout waiting for result", a.detail(t))
	require.Eventually(t, func() bool { return h.retrieve(id).status == http.StatusOK }, 2*time.Second, 20*time.Millisecond)

	require.Equal(t, http.StatusNotFound, h.retrieve("999999").status)
}

func TestBadDatumFailsItsRequest(t *testing.T) {
	h := start(t, Config{Vocab: 8})
	model := h.newModel()
	id := h.async(RouteForwardBackward, fwdBwd(model, "cross_entropy", ceDatum([]int{1, 9}, []int{2, 3})))
	a := h.retrieve(id)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Contains(t, a.detail(t), "outside the vocabulary of 8")

	id = h.async(RouteForwardBackward, fwdBwd(model, "gspo", ceDatum([]int{1}, []int{2})))
	a = h.retrieve(id)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Equal(t, "Loss functions ['gspo'] are not supported by the JAX backend", a.detail(t))
}

func TestSamplerArchive(t *testing.T) {
	const vocab, rank = 32, 4
	h := start(t, Config{Vocab: vocab})
	model := h.newModel()
	datum := ceDatum([]int{1, 2, 3}, []int{3, 3, 3})
	h.result(h.async(RouteForwardBackward, fwdBwd(model, "cross_entropy", datum)))
	h.result(h.async(RouteOptimStep, map[string]any{"model_id": model, "adam_params": adam(0.3)}))

	saved := h.result(h.async(RouteSaveWeightsForSampler, map[string]any{"model_id": model, "path": "sampler-1"}))
	require.Equal(t, "tinker://"+model+"/sampler-1", saved["path"])
	require.Equal(t, "save_weights_for_sampler", saved["type"])
	require.Equal(t, 1, h.srv.SamplerSaves("sampler-1"))
	require.Equal(t, http.StatusConflict, h.post(RouteSaveWeightsForSampler, map[string]any{"model_id": model, "path": "sampler-1"}).status)

	list := h.do(http.MethodGet, "/api/v1/training_runs/"+model+"/checkpoints", nil)
	require.Equal(t, http.StatusOK, list.status)
	checkpoints := list.json(t)["checkpoints"].([]any)
	require.Len(t, checkpoints, 1)
	require.Equal(t, "tinker://"+model+"/sampler_weights/sampler-1", checkpoints[0].(map[string]any)["tinker_path"])

	archive := h.do(http.MethodGet, "/api/v1/training_runs/"+model+"/checkpoints/sampler-1/archive", nil)
	require.Equal(t, http.StatusFound, archive.status)
	location := archive.header.Get("Location")
	require.True(t, strings.HasSuffix(location, "/checkpoints/sampler-1/download"), location)
	download := h.do(http.MethodGet, strings.TrimPrefix(location, h.url), nil)
	require.Equal(t, http.StatusOK, download.status)

	files := untar(t, download.body)
	var config map[string]any
	require.NoError(t, json.Unmarshal(files["adapter_config.json"], &config))
	require.Equal(t, "LORA", config["peft_type"])
	require.EqualValues(t, rank, config["r"])
	require.Equal(t, []any{"lm_head"}, config["target_modules"])
	require.Equal(t, DefaultBaseModel, config["base_model_name_or_path"])

	tensors := parseSafetensors(t, files["adapter_model.safetensors"])
	require.Equal(t, []int{rank, 1}, tensors[loraAKey].shape)
	require.Equal(t, []int{vocab, rank}, tensors[loraBKey].shape)
	a, b := tensors[loraAKey].data, tensors[loraBKey].data
	table := make([]float64, vocab)
	for v := range table {
		for k := 0; k < rank; k++ {
			table[v] += float64(b[v*rank+k]) * float64(a[k])
		}
	}
	// B·A is the table: its log_softmax is what forward reports.
	logp, _ := logSoftmax(table)
	out := h.result(h.async(RouteForward, map[string]any{"model_id": model,
		"forward_input": map[string]any{"data": []any{datum}, "loss_fn": "cross_entropy"}}))
	reported := out["loss_fn_outputs"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["data"].([]any)
	require.InDelta(t, logp[3], reported[0], 1e-5)
	require.InDelta(t, logp[3], reported[2], 1e-5)
	require.Greater(t, logp[3], logp[4], "training moved mass to the trained target")

	missing := h.do(http.MethodGet, "/api/v1/training_runs/"+model+"/checkpoints/nope/archive", nil)
	require.Equal(t, http.StatusNotFound, missing.status)
}

func untar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	files := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[hdr.Name] = body
	}
	return files
}

type parsedTensor struct {
	shape []int
	data  []float32
}

func parseSafetensors(t *testing.T, data []byte) map[string]parsedTensor {
	t.Helper()
	require.GreaterOrEqual(t, len(data), 8)
	n := binary.LittleEndian.Uint64(data[:8])
	require.LessOrEqual(t, 8+n, uint64(len(data)))
	var header map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(data[8:8+n], &header))
	payload := data[8+n:]
	out := map[string]parsedTensor{}
	for name, raw := range header {
		if name == "__metadata__" {
			continue
		}
		var info tensorInfo
		require.NoError(t, json.Unmarshal(raw, &info))
		require.Equal(t, "F32", info.DType)
		begin, end := info.DataOffsets[0], info.DataOffsets[1]
		require.LessOrEqual(t, end, len(payload))
		count := 1
		for _, d := range info.Shape {
			count *= d
		}
		require.Equal(t, 4*count, end-begin)
		values := make([]float32, count)
		for i := range values {
			values[i] = math.Float32frombits(binary.LittleEndian.Uint32(payload[begin+4*i:]))
		}
		out[name] = parsedTensor{shape: info.Shape, data: values}
	}
	return out
}

func TestUnknownModelAndSession(t *testing.T) {
	h := start(t, Config{})
	a := h.post(RouteForwardBackward, fwdBwd("model_nope", "cross_entropy", ceDatum([]int{1}, []int{2})))
	require.Equal(t, http.StatusNotFound, a.status)
	require.Equal(t, "Model not found", a.detail(t))
	a = h.post(RouteOptimStep, map[string]any{"model_id": "model_nope", "adam_params": adam(0.1)})
	require.Equal(t, http.StatusNotFound, a.status)
	a = h.post(RouteCreateModel, map[string]any{"session_id": "session_nope", "base_model": "b", "lora_config": map[string]any{"rank": 1}})
	require.Equal(t, http.StatusNotFound, a.status)
	require.Equal(t, "Session not found", a.detail(t))
}

func TestValidationErrors(t *testing.T) {
	h := start(t, Config{})
	model := h.newModel()

	body := fwdBwd(model, "ppo", ceDatum([]int{1}, []int{2}))
	body["forward_backward_input"].(map[string]any)["loss_fn_config"] = map[string]float64{"clip_low_threshold": 0.8, "bogus": 1}
	a := h.post(RouteForwardBackward, body)
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	detail := a.detail(t).([]any)
	require.Len(t, detail, 1)
	entry := detail[0].(map[string]any)
	require.Equal(t, "value_error", entry["type"])
	require.Equal(t, []any{"forward_backward_input"}, entry["loc"])
	require.Equal(t, "Value error, Invalid loss_fn_config keys for loss_fn='ppo': ['bogus']. "+
		"Allowed keys: ['clip_high_threshold', 'clip_low_threshold', 'value_clip'].", entry["msg"])

	body = fwdBwd(model, "cross_entropy", ceDatum([]int{1}, []int{2}))
	body["forward_backward_input"].(map[string]any)["loss_fn_config"] = map[string]float64{"clip_low_threshold": 0.8}
	a = h.post(RouteForwardBackward, body)
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	require.Contains(t, string(a.body), "does not accept loss_fn_config keys")

	a = h.post(RouteOptimStep, map[string]any{"model_id": model})
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	entry = a.detail(t).([]any)[0].(map[string]any)
	require.Equal(t, "missing", entry["type"])
	require.Equal(t, []any{"body", "adam_params"}, entry["loc"])

	a = h.post(RouteOptimStep, []byte(`{"model_id":`))
	require.Equal(t, http.StatusUnprocessableEntity, a.status)
	require.Equal(t, "json_invalid", a.detail(t).([]any)[0].(map[string]any)["type"])
}

func TestInjectedFaultsAndAPIKey(t *testing.T) {
	h := start(t, Config{APIKey: "secret"})
	model := h.newModel()
	body := fwdBwd(model, "cross_entropy", ceDatum([]int{1}, []int{2}))

	h.srv.Faults.FailNext(RouteForwardBackward, 2, http.StatusTooManyRequests, 1500*time.Millisecond)
	for i := 0; i < 2; i++ {
		a := h.post(RouteForwardBackward, body)
		require.Equal(t, http.StatusTooManyRequests, a.status)
		require.Equal(t, "2", a.header.Get("Retry-After"))
	}
	h.async(RouteForwardBackward, body)
	require.Equal(t, 3, h.srv.Requests(RouteForwardBackward))

	h.key = "wrong"
	require.Equal(t, http.StatusUnauthorized, h.post(RouteForwardBackward, body).status)
	require.Equal(t, http.StatusOK, h.do(http.MethodGet, RouteHealthz, nil).status)
}

// TestGradientsMatchFiniteDifferences checks each loss's accumulated
// gradient against the numerical derivative of the loss SkyRL optimizes:
// per datum, the summed token losses over the summed weights.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	const vocab = 8
	base := []float64{0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.2, -0.1}
	logp, _ := logSoftmax(base)
	// Not cispo: its clipped ratio is under stop_gradient, so its gradient
	// is not the derivative of its value.
	for _, lossFn := range []string{"cross_entropy", "importance_sampling", "ppo"} {
		t.Run(lossFn, func(t *testing.T) {
			// Ratios outside and inside PPO's clip range, advantages of both signs.
			in := &passInput{LossFn: lossFn, Data: []passDatum{{
				Chunks:       []passChunk{{Type: "encoded_text", Tokens: []int{0, 1, 2, 3}}},
				TargetTokens: []float64{1, 4, 6, 4},
				Weights:      []float64{1, 0.5, 1, 0},
				Logprobs:     []float64{logp[1] - 0.5, logp[4] + 0.05, logp[6] + 0.5, logp[4]},
				Advantages:   []float64{1, -1, 1, 2},
			}, {
				Chunks:       []passChunk{{Type: "encoded_text", Tokens: []int{5, 6}}},
				TargetTokens: []float64{2, 7},
				Weights:      []float64{1, 1},
				Logprobs:     []float64{logp[2] + 0.1, logp[7] - 0.1},
				Advantages:   []float64{-1, 0.5},
			}}}
			loss := func(table []float64) float64 {
				p := newPolicy(vocab, loraConfig{Rank: 1})
				copy(p.Table, table)
				out, err := p.pass(in, false)
				require.NoError(t, err)
				var total float64
				for d, o := range out.LossFnOutputs {
					var sum, mask float64
					for _, v := range o.ElementwiseLoss.Data {
						sum += float64(v)
					}
					for _, w := range in.Data[d].Weights {
						mask += w
					}
					total += sum / mask
				}
				return total
			}
			p := newPolicy(vocab, loraConfig{Rank: 1})
			copy(p.Table, base)
			_, err := p.pass(in, true)
			require.NoError(t, err)
			require.Equal(t, 2, p.gradCount)
			const h = 1e-3
			for j := range base {
				up, down := append([]float64{}, base...), append([]float64{}, base...)
				up[j] += h
				down[j] -= h
				numeric := (loss(up) - loss(down)) / (2 * h)
				require.InDelta(t, numeric, p.gradSum[j], 1e-3, "d loss / d table[%d]", j)
			}
		})
	}
}

// TestFirstAdamStepMovesEachWeightByTheLearningRate checks optax.adamw's
// bias correction: the first update is g/|g|, so every weight with a
// gradient moves by the learning rate, plus the decoupled weight decay.
func TestFirstAdamStepMovesEachWeightByTheLearningRate(t *testing.T) {
	p := newPolicy(4, loraConfig{Rank: 1})
	copy(p.Table, []float64{0, 0, 0, 1})
	in := &passInput{LossFn: "cross_entropy", Data: []passDatum{{
		Chunks:       []passChunk{{Type: "encoded_text", Tokens: []int{0}}},
		TargetTokens: []float64{2},
		Weights:      []float64{1},
	}}}
	_, err := p.pass(in, true)
	require.NoError(t, err)
	out := p.optimStep(adamParams{LearningRate: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12, WeightDecay: 0.5})
	require.InDeltaSlice(t, []float64{-0.1, -0.1, 0.1, 1 - 0.1 - 0.1*0.5}, p.Table, 1e-9)
	require.Greater(t, out.Metrics["skyrl.ai/grad_norm"], 0.0)
	require.Zero(t, p.gradCount)
	require.Equal(t, make([]float64, 4), p.gradSum)
}

// TestDeleteNeedsTheKind: delete_checkpoint takes "weights/<name>" or
// "sampler_weights/<name>" (or the type as a query); a bare id is 400,
// an unknown one 404.
func TestDeleteNeedsTheKind(t *testing.T) {
	h := start(t, Config{})
	base := "/api/v1/training_runs/m1/checkpoints/"
	a := h.do(http.MethodDelete, base+"v1", nil)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Contains(t, a.detail(t), "Invalid checkpoint identifier")
	require.Equal(t, http.StatusNotFound, h.do(http.MethodDelete, base+"weights/v1", nil).status)
	require.Equal(t, http.StatusNotFound, h.do(http.MethodDelete, base+"v1?checkpoint_type=sampler", nil).status)
}
