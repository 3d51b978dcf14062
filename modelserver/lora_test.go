package modelserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/inference/weightsync"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/trainer"
)

func (e *env) weightsync(t *testing.T) weightsync.Engine {
	t.Helper()
	ws, err := weightsync.New(deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}, e.http.URL+"/v1", "", nil)
	require.NoError(t, err)
	return ws
}

// TestWeightSyncLoadsAndServesVersions: Flywheel's weight sync puts
// trained versions on this server as on vLLM, a request pinned to a
// version answers with that version's weights, and every refusal is
// vLLM's.
func TestWeightSyncLoadsAndServesVersions(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, modelserver.Config{})
	ws := e.weightsync(t)
	b := e.backend(t)
	m1, p1 := e.checkpoint(t, 1, 11)
	m2, p2 := e.checkpoint(t, 2, 12)
	v1, v2 := served+"@v1", served+"@v2"
	want := map[string]string{v1: p1, v2: p2}

	rep, err := weightsync.Sync(ctx, ws, served+"@", want, v2, true)
	require.NoError(t, err)
	require.Equal(t, []string{v1, v2}, rep.Loaded)
	loaded, err := ws.Loaded(ctx)
	require.NoError(t, err)
	require.Equal(t, want, loaded, "adapters are the cards with a parent, their root the path")
	require.Equal(t, want, e.srv.Adapters())
	rep, err = weightsync.Sync(ctx, ws, served+"@", want, v2, true)
	require.NoError(t, err)
	require.Equal(t, []string{v1, v2}, rep.Kept, "a second sync changes nothing")

	resp, err := b.Complete(ctx, greedy("hi", v2))
	require.NoError(t, err)
	require.Equal(t, v2, resp.ModelVersion)
	require.Equal(t, direct(t, m2, greedy("hi", "")).Logprobs, resp.Logprobs, "v2's weights")
	require.Equal(t, direct(t, m2, greedy("hi", "")).CompletionTokenIDs, resp.CompletionTokenIDs)
	resp, err = b.Complete(ctx, greedy("hi", v1))
	require.NoError(t, err)
	require.Equal(t, v1, resp.ModelVersion)
	require.Equal(t, direct(t, m1, greedy("hi", "")).Logprobs, resp.Logprobs, "v1's weights")
	require.NotEqual(t, direct(t, m2, greedy("hi", "")).Logprobs, resp.Logprobs)

	// A second load of a loaded name is vLLM's 400 (weight sync accepts
	// it for the same path, refuses it for another).
	status, body := e.post(t, "/v1/load_lora_adapter", map[string]string{"lora_name": v1, "lora_path": p1})
	require.Equal(t, http.StatusBadRequest, status)
	requireVLLMError(t, 400, "InvalidUserInput", body)
	require.Equal(t, "The lora adapter '"+v1+"' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", body["message"])
	require.NoError(t, ws.Load(ctx, v1, p1))
	require.ErrorContains(t, ws.Load(ctx, v1, p2), "is loaded from")
	require.ErrorContains(t, e.srv.Load(v1, p1), "has already been loaded")

	requireLoadRefusals(t, e, ws, p1)
	require.Equal(t, want, e.srv.Adapters(), "nothing refused was registered")

	// Unload: the name is no longer served.
	require.NoError(t, ws.Unload(ctx, v1))
	_, err = b.Complete(ctx, greedy("hi", v1))
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Contains(t, ie.Message, "The model `"+v1+"` does not exist.")
	status, body = e.post(t, "/v1/chat/completions", map[string]any{"model": v1, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	require.Equal(t, http.StatusNotFound, status)
	requireVLLMError(t, 404, "NotFoundError", body)
	status, body = e.post(t, "/v1/unload_lora_adapter", map[string]string{"lora_name": v1})
	require.Equal(t, http.StatusNotFound, status)
	require.Equal(t, "The lora adapter '"+v1+"' cannot be found.", body["message"])
	require.NoError(t, ws.Unload(ctx, v1), "weight sync takes an adapter already gone as unloaded")

	// Loaded again from another checkpoint of version 1: its weights are
	// read again, not the ones held before the unload.
	other := trainer.CheckpointDir{Dir: t.TempDir()}
	m1b := model(t, 21)
	p1b, err := other.Save(m1b, 1, nil)
	require.NoError(t, err)
	status, body = e.post(t, "/v1/load_lora_adapter", map[string]string{"lora_name": v1, "lora_path": p1b})
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.Equal(t, "Success: LoRA adapter '"+v1+"' added successfully.", body["text"])
	resp, err = b.Complete(ctx, greedy("hi", v1))
	require.NoError(t, err)
	require.Equal(t, direct(t, m1b, greedy("hi", "")).Logprobs, resp.Logprobs)

	// load_inplace replaces an adapter's weights under its name.
	m2b := model(t, 22)
	p2b, err := other.Save(m2b, 2, nil)
	require.NoError(t, err)
	status, body = e.post(t, "/v1/load_lora_adapter", map[string]any{"lora_name": v2, "lora_path": p2b, "load_inplace": true})
	require.Equal(t, http.StatusOK, status, "%v", body)
	resp, err = b.Complete(ctx, greedy("hi", v2))
	require.NoError(t, err)
	require.Equal(t, direct(t, m2b, greedy("hi", "")).Logprobs, resp.Logprobs)
	status, body = e.post(t, "/v1/unload_lora_adapter", map[string]string{"lora_name": v2})
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "Success: LoRA adapter '"+v2+"' removed successfully.", body["text"])
	require.Equal(t, map[string]string{v1: p1b}, e.srv.Adapters())
}

// requireLoadRefusals: loads refused, each with vLLM's status and words.
func requireLoadRefusals(t *testing.T, e *env, ws weightsync.Engine, p1 string) {
	t.Helper()
	refusals := []struct {
		name, path string
		status     int
		message    string
	}{
		{"other@v1", p1, 400, "an adapter is named policy@v<N>"},
		{served + "@v01", p1, 400, "an adapter is named policy@v<N>"},
		{served, p1, 400, "an adapter is named policy@v<N>"},
		{served + "@v3", p1, 400, "holds version 1, not 3"},
		{served + "@v4", filepath.Join(t.TempDir(), "missing.safetensors"), 404, "Loading lora policy@v4 failed: No adapter found for "},
		{served + "@v5", t.TempDir(), 404, "No adapter found for "},
	}
	for _, r := range refusals {
		err := ws.Load(context.Background(), r.name, r.path)
		var we *weightsync.Error
		require.ErrorAs(t, err, &we, r.name)
		require.Equal(t, r.status, we.Status, r.name)
		require.Contains(t, we.Message, r.message, r.name)
		require.False(t, weightsync.Temporary(err))
	}
	status, body := e.post(t, "/v1/load_lora_adapter", map[string]string{"lora_name": served + "@v6"})
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "Both 'lora_name' and 'lora_path' must be provided.", body["message"])
	status, body = e.post(t, "/v1/load_lora_adapter", `{"lora_name":`)
	require.Equal(t, http.StatusBadRequest, status)
	requireVLLMError(t, 400, "InvalidUserInput", body)
}

// TestModelsListsBaseAndAdapters checks the cards themselves.
func TestModelsListsBaseAndAdapters(t *testing.T) {
	e := newEnv(t, modelserver.Config{BasePath: "/ckpt/base.safetensors"})
	_, p3 := e.checkpoint(t, 3, 13)
	require.NoError(t, e.srv.Load(served+"@v3", p3))
	list := func() []any {
		resp, err := http.Get(e.http.URL + "/v1/models")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		require.Equal(t, "list", body["object"])
		return body["data"].([]any)
	}
	cards := list()
	require.Len(t, cards, 2)
	base, adapter := cards[0].(map[string]any), cards[1].(map[string]any)
	require.Equal(t, served, base["id"])
	require.Equal(t, "model", base["object"])
	require.Equal(t, "vllm", base["owned_by"])
	require.Equal(t, "/ckpt/base.safetensors", base["root"])
	require.Contains(t, base, "parent")
	require.Nil(t, base["parent"])
	require.Equal(t, float64(smallModel.Context), base["max_model_len"])
	require.Equal(t, []any{}, base["permission"])
	require.Equal(t, served+"@v3", adapter["id"])
	require.Equal(t, served, adapter["parent"])
	require.Equal(t, p3, adapter["root"])
	require.Positive(t, adapter["created"])
	require.Equal(t, cards, list(), "cards are stable: created is when each was loaded")

	resp, err := http.Get(e.http.URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestStateFileKeepsAdaptersAcrossRestarts: a new server with the same
// state file serves what the old one served; an adapter whose checkpoint
// is gone is left out rather than keeping the server down.
func TestStateFileKeepsAdaptersAcrossRestarts(t *testing.T) {
	state := filepath.Join(t.TempDir(), "model-server", "adapters.json") // its directory is made
	e := newEnv(t, modelserver.Config{StateFile: state})
	m2, p2 := e.checkpoint(t, 2, 12)
	_, p3 := e.checkpoint(t, 3, 13)
	_, p4 := e.checkpoint(t, 4, 14)
	require.NoError(t, e.srv.Load(served+"@v2", p2))
	require.NoError(t, e.srv.Load(served+"@v3", p3))
	require.NoError(t, e.srv.Load(served+"@v4", p4))
	status, _ := e.post(t, "/v1/unload_lora_adapter", map[string]string{"lora_name": served + "@v3"})
	require.Equal(t, http.StatusOK, status)
	raw, err := os.ReadFile(state)
	require.NoError(t, err)
	var st struct {
		Adapters map[string]string `json:"adapters"`
	}
	require.NoError(t, json.Unmarshal(raw, &st))
	require.Equal(t, map[string]string{served + "@v2": p2, served + "@v4": p4}, st.Adapters)
	require.NoError(t, os.Remove(p4))

	restarted, err := modelserver.New(model(t, 1), 1, modelserver.Config{Name: served, StateFile: state})
	require.NoError(t, err)
	require.Equal(t, map[string]string{served + "@v2": p2}, restarted.Adapters())
	h := &env{srv: restarted, http: newHTTP(t, restarted)}
	resp, err := h.backend(t).Complete(context.Background(), greedy("hi", served+"@v2"))
	require.NoError(t, err)
	require.Equal(t, served+"@v2", resp.ModelVersion)
	require.Equal(t, direct(t, m2, greedy("hi", "")).Logprobs, resp.Logprobs)

	require.NoError(t, os.WriteFile(state, []byte("{not json"), 0o644))
	_, err = modelserver.New(model(t, 1), 1, modelserver.Config{Name: served, StateFile: state})
	require.ErrorContains(t, err, "adapter state", "a corrupt state file is an error, never a silent empty list")
}

// TestAdapterOfTheBaseVersion: the engine answers the base's version with
// the base, so an adapter of that version is accepted only when it holds
// the base's weights (as an immutable version does).
func TestAdapterOfTheBaseVersion(t *testing.T) {
	e := newEnv(t, modelserver.Config{})
	name := served + "@v" + strconv.Itoa(baseVersion)
	same, err := e.dir.Save(e.base, baseVersion, nil)
	require.NoError(t, err)
	require.NoError(t, e.srv.Load(name, same))
	resp, err := e.backend(t).Complete(context.Background(), greedy("hi", name))
	require.NoError(t, err)
	require.Equal(t, name, resp.ModelVersion)
	require.Equal(t, direct(t, e.base, greedy("hi", "")).Logprobs, resp.Logprobs)

	status, _ := e.post(t, "/v1/unload_lora_adapter", map[string]string{"lora_name": name})
	require.Equal(t, http.StatusOK, status)
	otherPath, err := trainer.CheckpointDir{Dir: t.TempDir()}.Save(model(t, 99), baseVersion, nil)
	require.NoError(t, err)
	err = e.srv.Load(name, otherPath)
	require.ErrorContains(t, err, "is the base model's, and the checkpoint at "+otherPath+" holds other weights")
	require.Empty(t, e.srv.Adapters())
}
