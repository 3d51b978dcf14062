package weightsync

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/internal/fakesglang"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
)

// checkpoint writes a directory holding file, as a trainer would.
func checkpoint(t *testing.T, file string) string {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, file), []byte(`{}`), 0o644))
	return dir
}

func vllm(t *testing.T, fx *fakevllm.Fixture) Engine {
	srv := httptest.NewServer(fx)
	t.Cleanup(srv.Close)
	e, err := New(deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}, srv.URL+"/v1", "", nil)
	require.NoError(t, err)
	return e
}

func TestVLLMLoRAExactRequestsAndAnswers(t *testing.T) {
	ctx := context.Background()
	fx := &fakevllm.Fixture{RuntimeLoRA: true, Model: "Qwen/Qwen3-8B"}
	e := vllm(t, fx)
	v1 := checkpoint(t, "adapter_config.json")

	require.NoError(t, e.Load(ctx, "qwen@v1", v1))
	calls := fx.AdapterCalls()
	require.Len(t, calls, 1)
	require.Equal(t, "/v1/load_lora_adapter", calls[0].Path)
	require.Equal(t, map[string]any{"lora_name": "qwen@v1", "lora_path": v1}, calls[0].Body, "exactly vLLM's LoadLoRAAdapterRequest")

	// A retry after a lost answer: vLLM refuses the name (400), and the
	// adapter it holds under that name is the same path, so it is loaded.
	require.NoError(t, e.Load(ctx, "qwen@v1", v1))
	require.Equal(t, 400, fx.AdapterCalls()[1].Status)
	// The same name from another path is an error, never a silent keep.
	err := e.Load(ctx, "qwen@v1", checkpoint(t, "adapter_config.json"))
	require.ErrorContains(t, err, "is loaded from")
	require.False(t, Temporary(err))

	loaded, err := e.Loaded(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"qwen@v1": v1}, loaded, "the base model is not an adapter")

	// A path without an adapter is vLLM's 404, a refusal, not a retry.
	err = e.Load(ctx, "qwen@v2", t.TempDir())
	require.ErrorContains(t, err, "No adapter found")
	require.False(t, Temporary(err))

	// The engine failing is worth a retry.
	fx.FailLoRA.Store(1)
	err = e.Load(ctx, "qwen@v2", v1)
	require.True(t, Temporary(err), "%v", err)

	require.NoError(t, e.Unload(ctx, "qwen@v1"))
	last := fx.AdapterCalls()[len(fx.AdapterCalls())-1]
	require.Equal(t, "/v1/unload_lora_adapter", last.Path)
	require.Equal(t, map[string]any{"lora_name": "qwen@v1"}, last.Body)
	require.NoError(t, e.Unload(ctx, "qwen@v1"), "an adapter already gone (404) is unloaded")
	require.Empty(t, fx.Adapters())
}

func TestVLLMWithoutRuntimeLoRASaysHowToTurnItOn(t *testing.T) {
	e := vllm(t, &fakevllm.Fixture{})
	err := e.Load(context.Background(), "qwen@v1", checkpoint(t, "adapter_config.json"))
	require.ErrorContains(t, err, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
	require.False(t, Temporary(err))
}

func TestEngineTimeoutIsTemporary(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	t.Cleanup(func() { close(block); srv.Close() })
	e, err := New(deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA, Timeout: "100ms"}, srv.URL+"/v1", "", nil)
	require.NoError(t, err)
	start := time.Now()
	err = e.Load(context.Background(), "qwen@v1", "/ckpt")
	require.True(t, Temporary(err), "%v", err)
	require.ErrorContains(t, err, "no answer within 100ms")
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestSyncSwapsWithoutFailingARequest loads a candidate beside the serving
// adapter, moves traffic to it, then unloads the old one, while clients
// keep asking for whichever version is routed: none of their requests
// fails, because a version is loaded before it is routed and unloaded only
// after it is not.
func TestSyncSwapsWithoutFailingARequest(t *testing.T) {
	ctx := context.Background()
	fx := &fakevllm.Fixture{RuntimeLoRA: true, Model: "base", LoRALatency: 20 * time.Millisecond}
	srv := httptest.NewServer(fx)
	t.Cleanup(srv.Close)
	e, err := New(deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}, srv.URL+"/v1", "", nil)
	require.NoError(t, err)
	v1, v2 := checkpoint(t, "adapter_config.json"), checkpoint(t, "adapter_config.json")
	// Someone else's adapter on the same server stays.
	require.NoError(t, e.Load(ctx, "other@v9", v1))

	var routed atomic.Value
	routed.Store("dep@v1")
	rep, err := Sync(ctx, e, "dep@", map[string]string{"dep@v1": v1}, "dep@v1", true)
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v1"}, rep.Loaded)

	var failed, sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				body := `{"model":"` + routed.Load().(string) + `","messages":[{"role":"user","content":"hi"}]}`
				resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", stringsReader(body))
				sent.Add(1)
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
				}
				if resp != nil {
					resp.Body.Close()
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	// Release: load the candidate beside serving, route to it, then unload.
	want := map[string]string{"dep@v1": v1, "dep@v2": v2}
	rep, err = Sync(ctx, e, "dep@", want, "dep@v1", false)
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v2"}, rep.Loaded)
	require.Equal(t, []string{"dep@v1"}, rep.Kept)
	routed.Store("dep@v2")
	time.Sleep(50 * time.Millisecond) // in-flight requests for v1 drain
	rep, err = Sync(ctx, e, "dep@", map[string]string{"dep@v2": v2}, "dep@v2", true)
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v1"}, rep.Unloaded)
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	require.Greater(t, sent.Load(), int64(20))
	require.Zero(t, failed.Load(), "no request failed during the swap (%d sent)", sent.Load())
	require.Equal(t, map[string]string{"dep@v2": v2, "other@v9": v1}, fx.Adapters())

	// Unloading first would have failed them: the fake answers vLLM's 404
	// for a model it does not hold.
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
		stringsReader(`{"model":"dep@v1","messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 404, resp.StatusCode)
}

func TestSGLangDiskUpdatesInPlace(t *testing.T) {
	ctx := context.Background()
	fake := &fakesglang.Fake{ModelPath: "/models/base", LoadLatency: 30 * time.Millisecond}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	e, err := New(deployment.WeightSync{Kind: deployment.WeightSyncSGLangDisk}, srv.URL+"/v1", "", nil)
	require.NoError(t, err)
	require.False(t, e.ByName())
	v2 := checkpoint(t, "config.json")

	// Chat requests during the update wait for it and succeed.
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
				stringsReader(`{"model":"fixture-model","messages":[{"role":"user","content":"hi"}]}`))
			if err != nil || resp.StatusCode != 200 {
				failed.Add(1)
			}
			if resp != nil {
				resp.Body.Close()
			}
		}()
	}
	rep, err := Sync(ctx, e, "dep@", map[string]string{"dep@v2": v2}, "dep@v2", true)
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v2"}, rep.Loaded)
	require.Zero(t, failed.Load())
	require.Equal(t, []map[string]any{{"model_path": v2, "weight_version": "dep@v2"}}, fake.Updates(), "exactly SGLang's UpdateWeightFromDiskReqInput fields we set")
	path, version := fake.Weights()
	require.Equal(t, v2, path)
	require.Equal(t, "dep@v2", version)

	// Synced again, it holds that version already: no second update.
	rep, err = Sync(ctx, e, "dep@", map[string]string{"dep@v2": v2}, "dep@v2", true)
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v2"}, rep.Kept)
	require.Len(t, fake.Updates(), 1)

	// SGLang's refusal (400, success false) keeps the old weights.
	err = e.Load(ctx, "dep@v3", t.TempDir())
	require.ErrorContains(t, err, "is not a model directory")
	require.False(t, Temporary(err))
	_, version = fake.Weights()
	require.Equal(t, "dep@v2", version)
	fake.FailNext.Store(1)
	require.True(t, Temporary(e.Load(ctx, "dep@v3", v2)))
}

func TestSettingsValidate(t *testing.T) {
	require.NoError(t, deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}.Validate())
	require.ErrorContains(t, deployment.WeightSync{Kind: "nccl"}.Validate(), "weight_sync.kind")
	require.ErrorContains(t, deployment.WeightSync{Kind: deployment.WeightSyncSGLangDisk, URL: "ftp://x"}.Validate(), "weight_sync.url")
	require.ErrorContains(t, deployment.WeightSync{Kind: deployment.WeightSyncSGLangDisk, Timeout: "soon"}.Validate(), "weight_sync.timeout")
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
