package trainer

import (
	"errors"
	"fmt"
	"math"
)

// OptimConfig configures AdamW, clipping and the learning-rate schedule.
type OptimConfig struct {
	// LR is the peak learning rate. Default 3e-3 (a small model).
	LR float64 `json:"lr"`
	// MinLR is where the cosine decay ends. Default LR/10.
	MinLR float64 `json:"min_lr"`
	// WarmupSteps ramps the rate linearly from 0. Default 0.
	WarmupSteps int `json:"warmup_steps"`
	// DecaySteps is the cosine length after warmup; 0 keeps LR constant.
	DecaySteps int `json:"decay_steps"`
	// Beta1 defaults to 0.9, Beta2 to 0.99, Eps to 1e-8.
	Beta1 float64 `json:"beta1"`
	Beta2 float64 `json:"beta2"`
	Eps   float64 `json:"eps"`
	// WeightDecay applies to matrices only (not norms). Default 0.01.
	WeightDecay float64 `json:"weight_decay"`
	// ClipNorm bounds the global gradient norm. Default 1; <0 disables.
	ClipNorm float64 `json:"clip_norm"`
}

// WithDefaults fills the zero fields with the defaults.
func (c OptimConfig) WithDefaults() OptimConfig { return c.withDefaults() }

func (c OptimConfig) withDefaults() OptimConfig {
	if c.LR == 0 {
		c.LR = 3e-3
	}
	if c.MinLR == 0 {
		c.MinLR = c.LR / 10
	}
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.99
	}
	if c.Eps == 0 {
		c.Eps = 1e-8
	}
	if c.WeightDecay == 0 {
		c.WeightDecay = 0.01
	}
	if c.ClipNorm == 0 {
		c.ClipNorm = 1
	}
	return c
}

func (c OptimConfig) validate() error {
	var errs []error
	if c.LR <= 0 || c.MinLR < 0 || c.MinLR > c.LR {
		errs = append(errs, fmt.Errorf("lr %v and min_lr %v must satisfy 0 ≤ min_lr ≤ lr, lr > 0", c.LR, c.MinLR))
	}
	if c.WarmupSteps < 0 || c.DecaySteps < 0 {
		errs = append(errs, fmt.Errorf("warmup_steps %d and decay_steps %d must be ≥ 0", c.WarmupSteps, c.DecaySteps))
	}
	if c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1 {
		errs = append(errs, fmt.Errorf("betas (%v, %v) must be in [0, 1)", c.Beta1, c.Beta2))
	}
	if c.Eps <= 0 || c.WeightDecay < 0 {
		errs = append(errs, fmt.Errorf("eps %v must be > 0 and weight_decay %v ≥ 0", c.Eps, c.WeightDecay))
	}
	return errors.Join(errs...)
}

// LRAt is the learning rate of step (counting from 0).
func (c OptimConfig) LRAt(step int) float64 {
	if step < c.WarmupSteps {
		return c.LR * float64(step+1) / float64(c.WarmupSteps)
	}
	if c.DecaySteps == 0 {
		return c.LR
	}
	p := math.Min(1, float64(step-c.WarmupSteps)/float64(c.DecaySteps))
	return c.MinLR + 0.5*(c.LR-c.MinLR)*(1+math.Cos(math.Pi*p))
}

// adamW holds the moment estimates for one flat parameter vector.
type adamW struct {
	cfg   OptimConfig
	m, v  []float32
	decay []bool // per parameter: apply weight decay
	step  int
}

func newAdamW(cfg OptimConfig, lay *layout) *adamW {
	a := &adamW{cfg: cfg, m: make([]float32, lay.Total), v: make([]float32, lay.Total), decay: make([]bool, lay.Total)}
	for _, s := range lay.Specs {
		if len(s.Shape) > 1 {
			for i := s.Offset; i < s.Offset+s.Size; i++ {
				a.decay[i] = true
			}
		}
	}
	return a
}

// clipGrad scales grad to the configured global norm and returns the norm
// before clipping.
func clipGrad(grad []float32, maxNorm float64) float64 {
	var ss float64
	for _, g := range grad {
		ss += float64(g) * float64(g)
	}
	norm := math.Sqrt(ss)
	if maxNorm > 0 && norm > maxNorm {
		s := float32(maxNorm / norm)
		for i := range grad {
			grad[i] *= s
		}
	}
	return norm
}

// update applies one AdamW step to w, at scale times the scheduled rate,
// and returns the learning rate used.
func (a *adamW) update(w, grad []float32, scale float64) float64 {
	c := a.cfg
	lr := c.LRAt(a.step) * scale
	a.step++
	b1, b2 := float32(c.Beta1), float32(c.Beta2)
	bc1 := 1 - math.Pow(c.Beta1, float64(a.step))
	bc2 := 1 - math.Pow(c.Beta2, float64(a.step))
	stepSize := float32(lr / bc1)
	invBC2 := float32(1 / bc2)
	wd := float32(lr * c.WeightDecay)
	eps := float32(c.Eps)
	for i, g := range grad {
		a.m[i] = b1*a.m[i] + (1-b1)*g
		a.v[i] = b2*a.v[i] + (1-b2)*g*g
		denom := float32(math.Sqrt(float64(a.v[i]*invBC2))) + eps
		if a.decay[i] {
			w[i] -= wd * w[i]
		}
		w[i] -= stepSize * a.m[i] / denom
	}
	return lr
}
