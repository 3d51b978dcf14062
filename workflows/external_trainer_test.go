package workflows_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	tworker "go.temporal.io/sdk/worker"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

// fakeGPUTrainer is a FAKE of an external GPU trainer's Temporal worker
// (verl, TRL, OpenRLHF behind a Python worker): it does with
// flywheel.train/v1 what such a worker does, except the training. It
// shares no code with Flywheel: its input and output are the protocol's
// JSON read into plain maps, it reads the batch with arrow-go (the Apache
// Arrow implementation, as pyarrow is), and it writes a PEFT LoRA adapter
// directory (adapter_config.json and adapter_model.safetensors) whose one
// tensor holds the batch's advantages, in place of trained weights.
type fakeGPUTrainer struct {
	mu     sync.Mutex
	inputs []map[string]any
	// completions are the completion ids of every row read, in order.
	completions [][]int32
}

func (f *fakeGPUTrainer) TrainBatch(ctx context.Context, in map[string]any) (map[string]any, error) {
	f.mu.Lock()
	f.inputs = append(f.inputs, in)
	f.mu.Unlock()
	get := func(m any, k string) any { return m.(map[string]any)[k] }
	if in["protocol"] != "flywheel.train/v1" {
		return nil, fmt.Errorf("protocol %v", in["protocol"])
	}
	u, err := url.Parse(get(in["batch"], "uri").(string))
	if err != nil || u.Scheme != "file" {
		return nil, fmt.Errorf("batch uri %v", get(in["batch"], "uri"))
	}
	pf, err := file.OpenParquetFile(u.Path, false)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	if v := pf.MetaData().KeyValueMetadata().FindValue("flywheel.protocol"); v == nil || *v != "flywheel.train/v1" {
		return nil, fmt.Errorf("batch metadata has no flywheel.protocol")
	}
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		return nil, err
	}
	tbl, err := fr.ReadTable(ctx)
	if err != nil {
		return nil, err
	}
	defer tbl.Release()
	col := func(name string) arrow.Array {
		idx := tbl.Schema().FieldIndices(name)
		if len(idx) != 1 {
			panic("no column " + name)
		}
		return tbl.Column(idx[0]).Data().Chunk(0)
	}
	completions, advantages, logprobs := col("completion_ids").(*array.List), col("advantage").(*array.Float64), col("logprobs").(*array.List)
	var loss float64
	tokens := 0
	for i := 0; i < int(tbl.NumRows()); i++ {
		s, e := completions.ValueOffsets(i)
		ids := array.NewSlice(completions.ListValues(), s, e).(*array.Int32)
		f.mu.Lock()
		f.completions = append(f.completions, append([]int32(nil), ids.Int32Values()...))
		f.mu.Unlock()
		s, e = logprobs.ValueOffsets(i)
		for _, lp := range array.NewSlice(logprobs.ListValues(), s, e).(*array.Float32).Float32Values() {
			loss -= advantages.Value(i) * float64(lp) // the policy-gradient surrogate
			tokens++
		}
	}
	activity.RecordHeartbeat(ctx, "trained")

	version := get(in["output"], "version").(string)
	dir := filepath.Join(get(in["output"], "dir").(string), strings.ReplaceAll(version, "@", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := `{"peft_type":"LORA","r":1,"lora_alpha":1,"target_modules":["q_proj"],"base_model_name_or_path":"base-model"}`
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	// safetensors: an 8-byte little-endian header length, the JSON
	// header, then the tensor bytes.
	n := advantages.Len()
	header := fmt.Sprintf(`{"base_model.model.layers.0.self_attn.q_proj.lora_A.weight":{"dtype":"F32","shape":[1,%d],"data_offsets":[0,%d]}}`, n, 4*n)
	buf := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	buf = append(buf, header...)
	for i := range n {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(float32(advantages.Value(i))))
	}
	if err := os.WriteFile(filepath.Join(dir, "adapter_model.safetensors"), buf, 0o644); err != nil {
		return nil, err
	}
	return map[string]any{
		"version":    version,
		"checkpoint": map[string]any{"version": version, "uri": "file://" + dir, "format": "peft_lora"},
		"loss":       loss / max(float64(tokens), 1), "samples": n, "trained_tokens": tokens,
		"metrics": map[string]any{"gpu_seconds": 0.5},
	}, nil
}

// TestIntegrationExternalTrainerTrainsAnUpstreamDeployment runs the
// production shape on the real services: an agent's calls go through the
// gateway to a vLLM server (fake: no GPU here) and are captured with the
// server's token ids; the deployment's settings name an external trainer
// on its own task queue, and its TrainingWorkflow, started with no queue
// as `flywheel train now` starts it, hands the batch there through the
// trainer protocol; the adapter it writes becomes a candidate version with
// lineage, and the release loads it into vLLM under its version name,
// gates it on that adapter and on live traffic, and routes the
// deployment's traffic to it.
func TestIntegrationExternalTrainerTrainsAnUpstreamDeployment(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	const dep, queue = "team-model", "team-model-gpu"
	u := s.newUpstream(dep, &deployment.Trainer{Kind: deployment.TrainerTemporal, Queue: queue})

	gpu := &fakeGPUTrainer{}
	w := tworker.New(s.tc, queue, tworker.Options{})
	w.RegisterActivityWithOptions(gpu.TrainBatch, activity.RegisterOptions{Name: flow.TrainBatchActivity})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	const n = 4
	u.queueSessions("agent", n)
	u.startLoop(flow.TrainingPolicy{StepsPerRun: 1, Release: releasePolicy()})
	v1 := store.VersionID(dep, 1)
	u.awaitVersion(v1)
	// Users go on calling through the shadow and canary phases: the
	// canary compares the candidate's share with the base model's.
	live := u.traffic("live")
	rel := u.awaitRelease(v1)
	live.Stop()
	require.Zero(t, live.failed.Load(), "no call of %d failed during the release", live.sent.Load())

	// What the trainer was given.
	require.Len(t, gpu.inputs, 1)
	in := gpu.inputs[0]
	require.Equal(t, dep, in["deployment"])
	require.Equal(t, v1, in["output"].(map[string]any)["version"])
	require.Equal(t, "", in["base"].(map[string]any)["version"], "the first step trains the server's own base model")
	require.Equal(t, "grpo", in["algorithm"].(map[string]any)["objective"])
	var captured [][]int32
	rows, err := s.pool.Query(ctx, `SELECT ts.completion_token_ids FROM model_version_lineage l
		JOIN training_samples ts ON ts.id = l.sample_id WHERE l.version_id = $1`, v1)
	require.NoError(t, err)
	for rows.Next() {
		var ids []int32
		require.NoError(t, rows.Scan(&ids))
		captured = append(captured, ids)
	}
	require.NoError(t, rows.Err())
	require.Len(t, captured, 2*n)
	require.ElementsMatch(t, captured, gpu.completions, "the batch holds the server's own token ids, as captured")

	// What was recorded.
	var ckpt, status string
	var metrics map[string]any
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT checkpoint_path, status, metrics FROM model_versions WHERE id = $1`, v1).Scan(&ckpt, &status, &metrics))
	require.FileExists(t, filepath.Join(ckpt, "adapter_config.json"))
	require.Equal(t, "peft_lora", metrics["checkpoint_format"])
	require.EqualValues(t, 2*n, metrics["samples"])
	require.EqualValues(t, 0.5, metrics["gpu_seconds"], "the trainer's own figures are kept")
	var lineage int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM model_version_lineage WHERE version_id = $1`, v1).Scan(&lineage))
	require.Equal(t, 2*n, lineage)
	_, err = os.Stat(filepath.Join(s.dir, "batches", dep))
	require.NoError(t, err)
	left, _ := filepath.Glob(filepath.Join(s.dir, "batches", dep, "*.parquet"))
	require.Empty(t, left, "a committed step's batch file is removed")

	// The release loaded the adapter into vLLM under the version's name,
	// and every gate judged the candidate on it: the offline gates by
	// asking vLLM for the adapter, the canary on the users' rewards.
	require.Contains(t, u.adapterLoads(), v1+" "+ckpt)
	requirePromotedByEveryGate(t, rel)
	serving, err := store.ServingOf(ctx, s.pool, dep, artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, v1, serving)
	require.Eventually(t, func() bool {
		st, _ := s.chatModel(dep, "after-release", false, "list the files")
		return st == http.StatusOK && u.vllm.LastRequest()["model"] == v1
	}, 10*time.Second, 200*time.Millisecond, "traffic goes to the promoted adapter once the gateway's routes refresh")
}

// chatModel is chat against another deployment than the stack's policy.
func (s *stack) chatModel(model, session string, done bool, content string) (int, string) {
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8, "messages": []any{map[string]any{"role": "user", "content": content}}})
	req, err := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(string(body)))
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", session)
	if done {
		req.Header.Set("X-Session-Done", "true")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	var out struct {
		ID string `json:"id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.ID
}
