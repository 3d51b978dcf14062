package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A PEFT LoRA adapter directory, as Hugging Face PEFT saves one and vLLM
// loads one: adapter_config.json and adapter_model.safetensors, whose
// tensors are named after a Llama-style model
// (base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight, …) in
// PyTorch's [out, in] layout: lora_A is [r, in], lora_B [out, r]. The
// policy's fused wqkv is written as q_proj, k_proj and v_proj sharing one A;
// w1 and w2 are the MLP's up_proj and down_proj (a GELU MLP has no
// gate_proj); head is lm_head.
const (
	PEFTConfigFile  = "adapter_config.json"
	PEFTWeightsFile = "adapter_model.safetensors"
	// FullWeightsFile is what WritePEFT writes for a full-weight learner
	// (rank 0), which has no adapter: the model as a SaveCheckpoint file.
	FullWeightsFile = "model.safetensors"
)

// peftConfig is the part of adapter_config.json this package writes and
// checks; the rest of what PEFT writes is ignored on reading.
type peftConfig struct {
	PEFTType       string         `json:"peft_type"`
	TaskType       string         `json:"task_type"`
	BaseModel      string         `json:"base_model_name_or_path"`
	R              int            `json:"r"`
	LoRAAlpha      float64        `json:"lora_alpha"`
	LoRADropout    float64        `json:"lora_dropout"`
	TargetModules  []string       `json:"target_modules"`
	Bias           string         `json:"bias"`
	FanInFanOut    bool           `json:"fan_in_fan_out"`
	InferenceMode  bool           `json:"inference_mode"`
	UseRSLoRA      bool           `json:"use_rslora"`
	UseDoRA        bool           `json:"use_dora"`
	ModulesToSave  []string       `json:"modules_to_save"`
	RankPattern    map[string]any `json:"rank_pattern"`
	AlphaPattern   map[string]any `json:"alpha_pattern"`
	LayersToChange []int          `json:"layers_to_transform"`
}

// peftModule is one PEFT linear module: a column range of a policy tensor.
type peftModule struct {
	key        string // tensor key prefix, up to ".lora_A.weight"
	short      string // target_modules name
	target     string // policy tensor
	col0, cols int
}

// peftModules lists every module an adapter for config c may hold, by key.
func peftModules(c ModelConfig) map[string]peftModule {
	d, f := c.DModel, c.FFN
	mods := map[string]peftModule{}
	add := func(key, short, target string, col0, cols int) {
		mods[key] = peftModule{key: key, short: short, target: target, col0: col0, cols: cols}
	}
	for i := 0; i < c.Layers; i++ {
		p := fmt.Sprintf("base_model.model.model.layers.%d.", i)
		t := fmt.Sprintf("layers.%d.", i)
		add(p+"self_attn.q_proj", "q_proj", t+"wqkv", 0, d)
		add(p+"self_attn.k_proj", "k_proj", t+"wqkv", d, d)
		add(p+"self_attn.v_proj", "v_proj", t+"wqkv", 2*d, d)
		add(p+"self_attn.o_proj", "o_proj", t+"wo", 0, d)
		add(p+"mlp.up_proj", "up_proj", t+"w1", 0, f)
		add(p+"mlp.down_proj", "down_proj", t+"w2", 0, d)
	}
	add("base_model.model.lm_head", "lm_head", "head", 0, c.Vocab)
	return mods
}

// WritePEFT writes the learner's adapter as a PEFT LoRA directory dir
// (created if needed) naming baseModel as its base. A full-weight learner
// (rank 0) has no adapter: dir gets FullWeightsFile, the merged model in
// the SaveCheckpoint format, with the step as its version.
func (l *Learner) WritePEFT(dir, baseModel string) error {
	files, err := l.PEFTFiles(baseModel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write peft: %w", err)
	}
	for _, f := range files {
		if err := writeFileAtomic(filepath.Join(dir, f.Name), f.Data); err != nil {
			return fmt.Errorf("write peft: %w", err)
		}
	}
	return nil
}

// File is one file of a directory, by name.
type File struct {
	Name string
	Data []byte
}

// PEFTFiles are the files WritePEFT writes, sorted by name, for a caller
// that packs them itself (the sampler archive).
func (l *Learner) PEFTFiles(baseModel string) ([]File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lora.Rank == 0 {
		data, err := encodeCheckpoint(l.model, int64(l.opt.step), map[string]string{"base_model": baseModel})
		if err != nil {
			return nil, fmt.Errorf("write peft: %w", err)
		}
		return []File{{FullWeightsFile, data}}, nil
	}
	r := l.lora.Rank
	cfg := peftConfig{PEFTType: "LORA", TaskType: "CAUSAL_LM", BaseModel: baseModel, R: r, LoRAAlpha: l.lora.Alpha,
		Bias: "none", InferenceMode: true, TargetModules: []string{}}
	tensors := map[string]Tensor{}
	mods := peftModules(l.base.Config)
	keys := make([]string, 0, len(mods))
	for k := range mods {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, ad := range l.adapters {
		A := l.params[ad.a.Offset : ad.a.Offset+ad.a.Size]
		B := l.params[ad.b.Offset : ad.b.Offset+ad.b.Size]
		for _, k := range keys {
			m := mods[k]
			if m.target != ad.target.Name {
				continue
			}
			// B's rows are output columns of the policy tensor: a
			// module's rows are its column range.
			tensors[k+".lora_A.weight"] = F32Tensor([]int{r, ad.in}, A)
			tensors[k+".lora_B.weight"] = F32Tensor([]int{m.cols, r}, B[m.col0*r:(m.col0+m.cols)*r])
			if !slices.Contains(cfg.TargetModules, m.short) {
				cfg.TargetModules = append(cfg.TargetModules, m.short)
			}
		}
	}
	slices.Sort(cfg.TargetModules)
	js, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("write peft: %w", err)
	}
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, tensors, map[string]string{"format": "pt"}); err != nil {
		return nil, fmt.Errorf("write peft: %w", err)
	}
	return []File{{PEFTConfigFile, append(js, '\n')}, {PEFTWeightsFile, buf.Bytes()}}, nil // by name
}

// ApplyPEFT returns base with the adapter in dir merged in (base is not
// written). dir is a PEFT LoRA directory for this policy, or a directory
// holding FullWeightsFile of the same model config (what WritePEFT writes
// for full weights), whose weights are returned as they are. Every key,
// shape and setting must be one this package can merge exactly.
func ApplyPEFT(base *Model, dir string) (*Model, error) {
	js, err := os.ReadFile(filepath.Join(dir, PEFTConfigFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(filepath.Join(dir, FullWeightsFile)); serr == nil {
			return applyFullWeights(base, filepath.Join(dir, FullWeightsFile))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("apply peft: %w", err)
	}
	var cfg peftConfig
	if err := json.Unmarshal(js, &cfg); err != nil {
		return nil, fmt.Errorf("apply peft: %s: %w", PEFTConfigFile, err)
	}
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("apply peft: %s: %w", PEFTConfigFile, err)
	}
	buf, err := os.ReadFile(filepath.Join(dir, PEFTWeightsFile))
	if err != nil {
		return nil, fmt.Errorf("apply peft: %w", err)
	}
	tensors, _, err := ReadSafetensors(buf)
	if err != nil {
		return nil, fmt.Errorf("apply peft: %s: %w", PEFTWeightsFile, err)
	}
	m, err := mergePEFT(base, cfg, tensors)
	if err != nil {
		return nil, fmt.Errorf("apply peft: %w", err)
	}
	return m, nil
}

func (c peftConfig) check() error {
	var errs []error
	if c.PEFTType != "LORA" {
		errs = append(errs, fmt.Errorf("peft_type %q, want LORA", c.PEFTType))
	}
	if c.R < 1 {
		errs = append(errs, fmt.Errorf("r %d must be positive", c.R))
	}
	if !(c.LoRAAlpha > 0) || math.IsInf(c.LoRAAlpha, 0) {
		errs = append(errs, fmt.Errorf("lora_alpha %v must be positive", c.LoRAAlpha))
	}
	if c.Bias != "" && c.Bias != "none" {
		errs = append(errs, fmt.Errorf("bias %q: only none is supported", c.Bias))
	}
	if c.FanInFanOut {
		errs = append(errs, errors.New("fan_in_fan_out true is not supported"))
	}
	if c.UseRSLoRA || c.UseDoRA {
		errs = append(errs, errors.New("use_rslora and use_dora are not supported"))
	}
	if len(c.ModulesToSave) > 0 || len(c.RankPattern) > 0 || len(c.AlphaPattern) > 0 || len(c.LayersToChange) > 0 {
		errs = append(errs, errors.New("modules_to_save, rank_pattern, alpha_pattern and layers_to_transform must be empty"))
	}
	return errors.Join(errs...)
}

// mergePEFT adds s·Bᵀ-by-Aᵀ of every module to a copy of base.
func mergePEFT(base *Model, cfg peftConfig, tensors map[string]Tensor) (*Model, error) {
	mods := peftModules(base.Config)
	type pair struct{ a, b []float32 }
	pairs := map[string]*pair{}
	names := make([]string, 0, len(tensors))
	for name := range tensors {
		names = append(names, name)
	}
	slices.Sort(names) // the first bad tensor is always the same one
	for _, name := range names {
		t := tensors[name]
		key, half, ok := strings.Cut(name, ".lora_")
		m, known := mods[key]
		if !ok || !known || (half != "A.weight" && half != "B.weight") {
			return nil, fmt.Errorf("tensor %s is not a LoRA weight of this model", name)
		}
		if !slices.Contains(cfg.TargetModules, m.short) {
			return nil, fmt.Errorf("tensor %s: %s is not in target_modules %v", name, m.short, cfg.TargetModules)
		}
		spec := base.lay.Specs[base.lay.byKey[m.target]]
		want := []int{cfg.R, spec.Shape[0]}
		if half == "B.weight" {
			want = []int{m.cols, cfg.R}
		}
		if !slices.Equal(t.Shape, want) {
			return nil, fmt.Errorf("tensor %s has shape %v, want %v (r=%d)", name, t.Shape, want, cfg.R)
		}
		v, err := t.Float32s()
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", name, err)
		}
		p := pairs[key]
		if p == nil {
			p = &pair{}
			pairs[key] = p
		}
		if half == "A.weight" {
			p.a = v
		} else {
			p.b = v
		}
	}
	if len(pairs) == 0 {
		return nil, errors.New("the adapter holds no LoRA weights")
	}
	out := base.Clone()
	s := float32(cfg.LoRAAlpha / float64(cfg.R))
	keys := make([]string, 0, len(pairs))
	for key := range pairs {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		p := pairs[key]
		if p.a == nil || p.b == nil {
			return nil, fmt.Errorf("module %s needs both lora_A and lora_B", key)
		}
		m := mods[key]
		spec := base.lay.Specs[base.lay.byKey[m.target]]
		in, ld := spec.Shape[0], spec.Shape[1]
		// W[:, col0:col0+cols] (in×cols, row stride ld) += s·Aᵀ·Bᵀ.
		sgemm(true, true, in, m.cols, cfg.R, s, p.a, in, p.b, cfg.R, 1, out.W[spec.Offset+m.col0:], ld)
	}
	return out, nil
}

func applyFullWeights(base *Model, path string) (*Model, error) {
	m, _, _, err := LoadCheckpoint(path)
	if err != nil {
		return nil, fmt.Errorf("apply peft: %w", err)
	}
	if m.Config != base.Config {
		return nil, fmt.Errorf("apply peft: %s has model config %+v, the base %+v", path, m.Config, base.Config)
	}
	return m, nil
}

// LoadWeights reads a version's weights at path, as a serving engine
// loads them: a checkpoint file of the policy (its stored version with it),
// or a directory a trainer of the Tinker API wrote, a PEFT LoRA adapter of
// base or full weights (version −1: the directory does not say).
func LoadWeights(base *Model, path string) (*Model, int64, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		m, err := ApplyPEFT(base, path)
		return m, -1, err
	}
	m, version, _, err := LoadCheckpoint(path)
	return m, version, err
}
