package trainer

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// ModelConfig sizes the policy. The defaults fit a CPU: about 0.5M
// parameters, a few thousand sampled tokens per second per core.
type ModelConfig struct {
	// Vocab is the vocabulary size. Default VocabSize (the byte tokenizer).
	Vocab int `json:"vocab"`
	// Context is the longest sequence (prompt + completion). Default 256.
	Context int `json:"context"`
	// Layers is the number of transformer blocks. Default 2.
	Layers int `json:"layers"`
	// Heads is the number of attention heads; it must divide DModel. Default 4.
	Heads int `json:"heads"`
	// DModel is the residual width. Default 128.
	DModel int `json:"d_model"`
	// FFN is the hidden width of the MLP. Default 4·DModel.
	FFN int `json:"ffn"`
}

func (c ModelConfig) withDefaults() ModelConfig {
	if c.Vocab == 0 {
		c.Vocab = VocabSize
	}
	if c.Context == 0 {
		c.Context = 256
	}
	if c.Layers == 0 {
		c.Layers = 2
	}
	if c.Heads == 0 {
		c.Heads = 4
	}
	if c.DModel == 0 {
		c.DModel = 128
	}
	if c.FFN == 0 {
		c.FFN = 4 * c.DModel
	}
	return c
}

func (c ModelConfig) validate() error {
	var errs []error
	if c.Vocab < VocabSize || c.Vocab > 1<<20 {
		errs = append(errs, fmt.Errorf("vocab %d must be in [%d, %d]", c.Vocab, VocabSize, 1<<20))
	}
	if c.Context < 2 || c.Context > 1<<16 {
		errs = append(errs, fmt.Errorf("context %d must be in [2, 65536]", c.Context))
	}
	if c.Layers < 1 || c.Layers > 64 {
		errs = append(errs, fmt.Errorf("layers %d must be in [1, 64]", c.Layers))
	}
	if c.DModel < 1 || c.DModel > 1<<14 || c.Heads < 1 || c.DModel%c.Heads != 0 {
		errs = append(errs, fmt.Errorf("heads %d must divide d_model %d (at most %d)", c.Heads, c.DModel, 1<<14))
	}
	if c.FFN < 1 || c.FFN > 1<<16 {
		errs = append(errs, fmt.Errorf("ffn %d must be in [1, %d]", c.FFN, 1<<16))
	}
	return errors.Join(errs...)
}

// paramSpec names one tensor inside the flat parameter vector.
type paramSpec struct {
	Name   string
	Shape  []int
	Offset int
	Size   int
}

// layout lists every parameter tensor in a fixed order; all weights live in
// one flat slice so the optimizer, clipping and checkpoints see one vector.
type layout struct {
	Specs []paramSpec
	Total int
	byKey map[string]int
}

func newLayout(c ModelConfig) *layout {
	l := &layout{byKey: map[string]int{}}
	add := func(name string, shape ...int) {
		n := 1
		for _, s := range shape {
			n *= s
		}
		l.byKey[name] = len(l.Specs)
		l.Specs = append(l.Specs, paramSpec{Name: name, Shape: shape, Offset: l.Total, Size: n})
		l.Total += n
	}
	d := c.DModel
	add("tok_emb", c.Vocab, d)
	add("pos_emb", c.Context, d)
	for i := 0; i < c.Layers; i++ {
		p := fmt.Sprintf("layers.%d.", i)
		add(p+"ln1", d)
		add(p+"wqkv", d, 3*d)
		add(p+"wo", d, d)
		add(p+"ln2", d)
		add(p+"w1", d, c.FFN)
		add(p+"w2", c.FFN, d)
	}
	add("ln_f", d)
	add("head", d, c.Vocab)
	return l
}

// Model is a set of weights. Weights of a Model that an Engine serves are
// never written again: training works on its own copy and publishes clones.
type Model struct {
	Config ModelConfig
	lay    *layout
	W      []float32
}

// weights is a typed view of one layer's tensors inside a flat vector.
type layerW struct {
	ln1, wqkv, wo, ln2, w1, w2 []float32
}

type modelW struct {
	tokEmb, posEmb []float32
	layers         []layerW
	lnF, head      []float32
}

func (m *Model) view(flat []float32) modelW {
	get := func(name string) []float32 {
		s := m.lay.Specs[m.lay.byKey[name]]
		return flat[s.Offset : s.Offset+s.Size]
	}
	v := modelW{tokEmb: get("tok_emb"), posEmb: get("pos_emb"), lnF: get("ln_f"), head: get("head")}
	for i := 0; i < m.Config.Layers; i++ {
		p := fmt.Sprintf("layers.%d.", i)
		v.layers = append(v.layers, layerW{
			ln1: get(p + "ln1"), wqkv: get(p + "wqkv"), wo: get(p + "wo"),
			ln2: get(p + "ln2"), w1: get(p + "w1"), w2: get(p + "w2"),
		})
	}
	return v
}

// NewModel initialises weights from seed (GPT-2 style: N(0, 0.02), output
// projections scaled by 1/√(2·layers), norms at one).
func NewModel(cfg ModelConfig, seed uint64) (*Model, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("model config: %w", err)
	}
	m := &Model{Config: cfg, lay: newLayout(cfg)}
	m.W = make([]float32, m.lay.Total)
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	resid := 0.02 / math.Sqrt(2*float64(cfg.Layers))
	for _, s := range m.lay.Specs {
		w := m.W[s.Offset : s.Offset+s.Size]
		std := 0.02
		switch {
		case len(s.Shape) == 1:
			for i := range w {
				w[i] = 1
			}
			continue
		case hasSuffix(s.Name, "wo"), hasSuffix(s.Name, "w2"):
			std = resid
		}
		for i := range w {
			w[i] = float32(rng.NormFloat64() * std)
		}
	}
	return m, nil
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// Clone returns an independent copy of the weights.
func (m *Model) Clone() *Model {
	c := &Model{Config: m.Config, lay: m.lay, W: make([]float32, len(m.W))}
	copy(c.W, m.W)
	return c
}

// NumParams is the number of weights.
func (m *Model) NumParams() int { return len(m.W) }

// forwardFLOPs counts the multiply-adds ×2 of one forward pass: the dense
// layers per node, the output layer per logits row and attention of each
// segment's rows over its path (causal halves included, as computed).
// Backward costs twice as much.
func (st *fwdState) forwardFLOPs() float64 {
	c := st.m.Config
	d, f := float64(c.DModel), float64(c.FFN)
	dense := 2 * float64(c.Layers) * (3*d*d + d*d + 2*d*f) * float64(st.pk.NumNodes())
	head := 2 * d * float64(c.Vocab) * float64(len(st.rows))
	var att float64
	for _, sg := range st.pk.Segs {
		att += 4 * float64(sg.L) * float64(sg.P) * d * float64(c.Layers)
	}
	return dense + head + att
}
