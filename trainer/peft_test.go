package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

// trainedLearner is a learner a few ppo steps away from its base.
func trainedLearner(t *testing.T, base *Model, lora LoRAConfig) *Learner {
	t.Helper()
	l, err := NewLearner(base, lora)
	require.NoError(t, err)
	data := learnerData(rand.New(rand.NewPCG(4, 4)))
	for i := 0; i < 3; i++ {
		_, err := l.ForwardBackward(context.Background(), data, Loss{Fn: LossFnPPO})
		require.NoError(t, err)
		_, err = l.OptimStep(localSettings)
		require.NoError(t, err)
	}
	return l
}

func TestPEFTRoundTrip(t *testing.T) {
	ctx := context.Background()
	base := tinyModel(t, 7)
	data := learnerData(rand.New(rand.NewPCG(5, 5)))
	for _, lora := range []LoRAConfig{{Rank: 3, Attn: true, MLP: true, Unembed: true}, {Rank: 2}, {}} {
		l := trainedLearner(t, base, lora)
		dir := filepath.Join(t.TempDir(), "adapter")
		require.NoError(t, l.WritePEFT(dir, "flywheel-policy"))
		applied, err := ApplyPEFT(base, dir)
		require.NoError(t, err)
		merged := l.Merged()
		require.Greater(t, maxAbsDiff(merged.W, base.W), 1e-3, "training moved the weights")
		require.Less(t, maxAbsDiff(merged.W, applied.W), 1e-5, "rank %d", lora.Rank)

		// The applied model scores like the learner.
		again, err := NewLearner(applied, LoRAConfig{})
		require.NoError(t, err)
		want, err := l.Forward(ctx, data, Loss{Fn: LossFnCrossEntropy})
		require.NoError(t, err)
		got, err := again.Forward(ctx, data, Loss{Fn: LossFnCrossEntropy})
		require.NoError(t, err)
		for d := range data {
			require.Less(t, maxAbsDiff(want.Logprobs[d], got.Logprobs[d]), 1e-5)
		}

		if lora.Rank == 0 {
			_, err := os.Stat(filepath.Join(dir, FullWeightsFile))
			require.NoError(t, err, "full weights are a checkpoint file")
			continue
		}
		js, err := os.ReadFile(filepath.Join(dir, PEFTConfigFile))
		require.NoError(t, err)
		var cfg map[string]any
		require.NoError(t, json.Unmarshal(js, &cfg))
		require.Equal(t, "LORA", cfg["peft_type"])
		require.Equal(t, "CAUSAL_LM", cfg["task_type"])
		require.Equal(t, "none", cfg["bias"])
		require.Equal(t, false, cfg["fan_in_fan_out"])
		require.Equal(t, "flywheel-policy", cfg["base_model_name_or_path"])
		require.EqualValues(t, lora.Rank, cfg["r"])
		require.EqualValues(t, 32, cfg["lora_alpha"])
		buf, err := os.ReadFile(filepath.Join(dir, PEFTWeightsFile))
		require.NoError(t, err)
		tensors, _, err := ReadSafetensors(buf)
		require.NoError(t, err)
		if lora.Unembed {
			require.ElementsMatch(t, []any{"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "lm_head"}, cfg["target_modules"])
			require.Equal(t, []int{3, 8}, tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"].Shape)
			require.Equal(t, []int{8, 3}, tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"].Shape)
			require.Equal(t, []int{3, 16}, tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"].Shape)
			require.Equal(t, []int{16, 3}, tensors["base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"].Shape)
			require.Equal(t, []int{VocabSize, 3}, tensors["base_model.model.lm_head.lora_B.weight"].Shape)
			require.Len(t, tensors, 2*(2*6+1))
		} else {
			require.NotContains(t, cfg["target_modules"], "lm_head")
			require.Len(t, tensors, 2*2*6)
		}
	}
}

func TestMergedPolicyServes(t *testing.T) {
	base, err := NewModel(ModelConfig{Context: 128, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, 1)
	require.NoError(t, err)
	l := trainedLearner(t, base, LoRAConfig{Rank: 4})
	dir := t.TempDir()
	require.NoError(t, l.WritePEFT(dir, "flywheel-policy"))
	m, err := ApplyPEFT(base, dir)
	require.NoError(t, err)
	e, err := NewEngine(m, 1, EngineConfig{DefaultMaxTokens: 8})
	require.NoError(t, err)
	seed := int64(1)
	resp, err := e.Complete(context.Background(), &inference.Request{Messages: []inference.Message{{Role: "user", Content: "hi"}}, Seed: &seed})
	require.NoError(t, err)
	require.NotEmpty(t, resp.CompletionTokenIDs)
	require.Len(t, resp.Logprobs, len(resp.CompletionTokenIDs))
}

func TestApplyPEFTRefuses(t *testing.T) {
	base := tinyModel(t, 8)
	l := trainedLearner(t, base, LoRAConfig{Rank: 2})
	src := t.TempDir()
	require.NoError(t, l.WritePEFT(src, "flywheel-policy"))
	cfgJS, err := os.ReadFile(filepath.Join(src, PEFTConfigFile))
	require.NoError(t, err)
	weights, err := os.ReadFile(filepath.Join(src, PEFTWeightsFile))
	require.NoError(t, err)
	tensors, _, err := ReadSafetensors(weights)
	require.NoError(t, err)

	write := func(t *testing.T, cfg map[string]any, ts map[string]Tensor) string {
		dir := t.TempDir()
		js, err := json.Marshal(cfg)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, PEFTConfigFile), js, 0o644))
		var buf bytes.Buffer
		require.NoError(t, WriteSafetensors(&buf, ts, nil))
		require.NoError(t, os.WriteFile(filepath.Join(dir, PEFTWeightsFile), buf.Bytes(), 0o644))
		return dir
	}
	baseCfg := func() map[string]any {
		var c map[string]any
		require.NoError(t, json.Unmarshal(cfgJS, &c))
		return c
	}
	baseTensors := func() map[string]Tensor {
		out := map[string]Tensor{}
		for k, v := range tensors {
			out[k] = v
		}
		return out
	}
	const qA = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
	cases := map[string]struct {
		cfg func(map[string]any)
		ts  func(map[string]Tensor)
		msg string
	}{
		"unknown key": {ts: func(ts map[string]Tensor) {
			ts["base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight"] = ts[qA]
		}, msg: "layers.5.self_attn.q_proj.lora_A.weight is not a LoRA weight of this model"},
		"gate_proj": {ts: func(ts map[string]Tensor) {
			ts["base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"] = ts[qA]
		}, msg: "gate_proj.lora_A.weight is not a LoRA weight"},
		"r mismatch": {cfg: func(c map[string]any) { c["r"] = 3 }, msg: "(r=3)"},
		"bad shape": {ts: func(ts map[string]Tensor) {
			ts[qA] = F32Tensor([]int{8, 2}, make([]float32, 16))
		}, msg: "q_proj.lora_A.weight has shape [8 2], want [2 8]"},
		"missing B": {ts: func(ts map[string]Tensor) {
			delete(ts, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
		}, msg: "needs both lora_A and lora_B"},
		"zero alpha":     {cfg: func(c map[string]any) { c["lora_alpha"] = 0 }, msg: "lora_alpha 0 must be positive"},
		"rslora":         {cfg: func(c map[string]any) { c["use_rslora"] = true }, msg: "use_rslora"},
		"not lora":       {cfg: func(c map[string]any) { c["peft_type"] = "IA3" }, msg: `peft_type "IA3"`},
		"not a target":   {cfg: func(c map[string]any) { c["target_modules"] = []string{"q_proj"} }, msg: "down_proj is not in target_modules [q_proj]"},
		"fan in fan out": {cfg: func(c map[string]any) { c["fan_in_fan_out"] = true }, msg: "fan_in_fan_out"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, ts := baseCfg(), baseTensors()
			if c.cfg != nil {
				c.cfg(cfg)
			}
			if c.ts != nil {
				c.ts(ts)
			}
			_, err := ApplyPEFT(base, write(t, cfg, ts))
			require.ErrorContains(t, err, c.msg)
		})
	}
	other, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 2, DModel: 8, FFN: 16}, 1)
	require.NoError(t, err)
	_, err = ApplyPEFT(other, src)
	require.ErrorContains(t, err, "not a LoRA weight of this model")
	_, err = ApplyPEFT(base, t.TempDir())
	require.ErrorContains(t, err, PEFTConfigFile)
}
