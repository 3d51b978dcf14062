package trainer

import (
	"math"
	"math/rand/v2"
)

// DefaultLoRAAlpha is Tinker's adapter scale numerator.
const DefaultLoRAAlpha = 32

// LoRAConfig selects what a Learner trains.
type LoRAConfig struct {
	// Rank of every adapter, at most the model's d_model. 0 trains the full
	// weights instead (Flywheel's extension of the API).
	Rank int `json:"rank"`
	// Alpha scales every adapter by Alpha/Rank. Default DefaultLoRAAlpha.
	Alpha float64 `json:"alpha"`
	// Seed draws the A matrices.
	Seed uint64 `json:"seed"`
	// Attn (wqkv, wo), MLP (w1, w2) and Unembed (head) choose the layers
	// with an adapter. All false means Tinker's default: attention and MLP.
	// Embeddings and norms never train in LoRA mode.
	Attn    bool `json:"train_attn"`
	MLP     bool `json:"train_mlp"`
	Unembed bool `json:"train_unembed"`
}

func (c LoRAConfig) withDefaults() LoRAConfig {
	if c.Alpha == 0 {
		c.Alpha = DefaultLoRAAlpha
	}
	if c.Rank > 0 && !c.Attn && !c.MLP && !c.Unembed {
		c.Attn, c.MLP = true, true
	}
	return c
}

// Validate refuses a configuration (its defaults filled) that a learner
// of a model of config m cannot take.
func (c LoRAConfig) Validate(m ModelConfig) error {
	if c.Rank < 0 || c.Rank > m.DModel {
		return invalidf("lora rank %d must be in [0, %d] (0: full weights)", c.Rank, m.DModel)
	}
	if math.IsNaN(c.Alpha) || math.IsInf(c.Alpha, 0) || c.Alpha <= 0 {
		return invalidf("lora alpha %v must be positive", c.Alpha)
	}
	return nil
}

// scale is the factor on B·A.
func (c LoRAConfig) scale() float32 { return float32(c.Alpha / float64(c.Rank)) }

// adapter is one LoRA pair on a weight stored in×out (y = x·W): the model
// runs on W + s·Aᵀ·Bᵀ, with A (r×in) and B (out×r) in PyTorch's layout so
// that a PEFT file is a copy of them.
type adapter struct {
	target  paramSpec // the base tensor in the model's layout
	in, out int
	a, b    paramSpec // in the learner's trainable vector
}

// newAdapters lists the adapters lora selects, in layout order, and the
// trainable tensors they make.
func newAdapters(base *Model, lora LoRAConfig) ([]adapter, []paramSpec) {
	var ads []adapter
	var specs []paramSpec
	off := 0
	add := func(name string, shape ...int) paramSpec {
		s := paramSpec{Name: name, Shape: shape, Offset: off, Size: shape[0] * shape[1]}
		off += s.Size
		specs = append(specs, s)
		return s
	}
	r := lora.Rank
	for _, s := range base.lay.Specs {
		if !lora.selects(s.Name) {
			continue
		}
		in, out := s.Shape[0], s.Shape[1]
		a := add(s.Name+".lora_A", r, in)
		b := add(s.Name+".lora_B", out, r)
		ads = append(ads, adapter{target: s, in: in, out: out, a: a, b: b})
	}
	return ads, specs
}

// selects reports whether the tensor named carries an adapter.
func (c LoRAConfig) selects(name string) bool {
	switch {
	case hasSuffix(name, ".wqkv"), hasSuffix(name, ".wo"):
		return c.Attn
	case hasSuffix(name, ".w1"), hasSuffix(name, ".w2"):
		return c.MLP
	case name == "head":
		return c.Unembed
	}
	return false
}

// initAdapters draws every A as PEFT does (Kaiming-uniform with a = √5,
// that is U(±1/√in)) and leaves B at zero, so a new adapter changes nothing.
func initAdapters(params []float32, ads []adapter, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x10ca))
	for _, ad := range ads {
		bound := 1 / math.Sqrt(float64(ad.in))
		for i := range params[ad.a.Offset : ad.a.Offset+ad.a.Size] {
			params[ad.a.Offset+i] = float32((2*rng.Float64() - 1) * bound)
		}
	}
}

// merge rebuilds the model the passes run on: base plus every adapter.
func (l *Learner) merge() {
	copy(l.model.W, l.base.W)
	s := l.lora.scale()
	r := l.lora.Rank
	for _, ad := range l.adapters {
		A, B := l.params[ad.a.Offset:ad.a.Offset+ad.a.Size], l.params[ad.b.Offset:ad.b.Offset+ad.b.Size]
		// W (in×out) += s·Aᵀ·Bᵀ.
		sgemm(true, true, ad.in, ad.out, r, s, A, ad.in, B, r, 1, l.model.W[ad.target.Offset:], ad.out)
	}
}

// adapterGrads adds to the adapters' gradient their share of full, the
// gradient of every model weight: with G = dL/dW (in×out),
// dA = s·Bᵀ·Gᵀ and dB = s·Gᵀ·Aᵀ.
func (l *Learner) adapterGrads(full []float32) {
	s := l.lora.scale()
	r := l.lora.Rank
	for _, ad := range l.adapters {
		A, B := l.params[ad.a.Offset:ad.a.Offset+ad.a.Size], l.params[ad.b.Offset:ad.b.Offset+ad.b.Size]
		G := full[ad.target.Offset : ad.target.Offset+ad.target.Size]
		sgemm(true, true, r, ad.in, ad.out, s, B, r, G, ad.out, 1, l.grad[ad.a.Offset:], ad.in)
		sgemm(true, true, ad.out, r, ad.in, s, G, ad.out, A, ad.in, 1, l.grad[ad.b.Offset:], r)
	}
}
