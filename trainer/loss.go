package trainer

import (
	"errors"
	"fmt"
	"math"
)

// KL estimators of KL(π ‖ π_ref) from one sample, with lr = log π − log π_ref
// (Schulman's k1, k2, k3).
const (
	KLk1 = "k1" // lr: unbiased, high variance, can be negative
	KLk2 = "k2" // ½·lr²
	KLk3 = "k3" // e^(−lr) − 1 + lr: unbiased and ≥ 0
)

// LossConfig configures the policy-gradient loss.
type LossConfig struct {
	// ClipLow is ε: the ratio π/π_prox is clipped below at 1−ε. Default 0.2.
	ClipLow float64 `json:"clip_low"`
	// ClipHigh is ε_high: clipped above at 1+ε_high. Default 0.28 (DAPO's
	// clip-higher, which keeps exploration alive).
	ClipHigh float64 `json:"clip_high"`
	// BehaviourWeightCap caps the decoupled-PPO weight π_prox/μ. Default 5.
	BehaviourWeightCap float64 `json:"behaviour_weight_cap"`
	// KLCoef weighs the KL penalty to the reference policy. Default 0 (off).
	KLCoef float64 `json:"kl_coef"`
	// KLEstimator is KLk1, KLk2 or KLk3. Default KLk3.
	KLEstimator string `json:"kl_estimator"`
	// IcePop masks tokens whose ratio π_prox/μ leaves [IcePopLow, IcePopHigh].
	IcePop bool `json:"icepop"`
	// IcePopLow defaults to 0.5.
	IcePopLow float64 `json:"icepop_low"`
	// IcePopHigh defaults to 2.
	IcePopHigh float64 `json:"icepop_high"`
	// KPop masks tokens whose bidirectional binary KL exceeds KPopPhi.
	KPop bool `json:"kpop"`
	// KPopPhi defaults to 0.05.
	KPopPhi float64 `json:"kpop_phi"`
}

func (c LossConfig) withDefaults() LossConfig {
	if c.ClipLow == 0 {
		c.ClipLow = 0.2
	}
	if c.ClipHigh == 0 {
		c.ClipHigh = 0.28
	}
	if c.BehaviourWeightCap == 0 {
		c.BehaviourWeightCap = 5
	}
	if c.KLEstimator == "" {
		c.KLEstimator = KLk3
	}
	if c.IcePopLow == 0 {
		c.IcePopLow = 0.5
	}
	if c.IcePopHigh == 0 {
		c.IcePopHigh = 2
	}
	if c.KPopPhi == 0 {
		c.KPopPhi = 0.05
	}
	return c
}

func (c LossConfig) validate() error {
	var errs []error
	if c.ClipLow <= 0 || c.ClipLow >= 1 {
		errs = append(errs, fmt.Errorf("clip_low %v must be in (0, 1)", c.ClipLow))
	}
	if c.ClipHigh <= 0 {
		errs = append(errs, fmt.Errorf("clip_high %v must be positive", c.ClipHigh))
	}
	if c.BehaviourWeightCap < 1 {
		errs = append(errs, fmt.Errorf("behaviour_weight_cap %v must be ≥ 1", c.BehaviourWeightCap))
	}
	if c.KLCoef < 0 {
		errs = append(errs, fmt.Errorf("kl_coef %v must be ≥ 0", c.KLCoef))
	}
	if c.KLEstimator != KLk1 && c.KLEstimator != KLk2 && c.KLEstimator != KLk3 {
		errs = append(errs, fmt.Errorf("kl_estimator %q must be k1, k2 or k3", c.KLEstimator))
	}
	if c.IcePopLow <= 0 || c.IcePopLow >= 1 || c.IcePopHigh <= 1 {
		errs = append(errs, fmt.Errorf("icepop range [%v, %v] must satisfy 0 < low < 1 < high", c.IcePopLow, c.IcePopHigh))
	}
	if c.KPopPhi <= 0 {
		errs = append(errs, fmt.Errorf("kpop_phi %v must be positive", c.KPopPhi))
	}
	return errors.Join(errs...)
}

// tokenIn is what the loss of one trained token depends on.
type tokenIn struct {
	Logp, LogpProx, LogpBehav, LogpRef float64
	Adv                                float64
}

// tokenOut is one token's loss and its derivative with respect to Logp.
type tokenOut struct {
	Loss, DLogp  float64
	Masked       bool // dropped by IcePop or KPop
	IcePopMasked bool
	KPopMasked   bool
	Clipped      bool
	KL           float64
}

// OffPolicyMasks says which masks dropped a token.
type OffPolicyMasks struct{ IcePop, KPop bool }

// OffPolicy is decoupled PPO's correction of one token for the behaviour
// policy μ that sampled it: the weight min(π_prox/μ, cap), or a mask
// (IcePop, KPop) that drops the token. Every trainer applies it through
// here: the in-process loss, and the Tinker step, which folds the weight
// into the token's advantage.
func (c LossConfig) OffPolicy(logpProx, logpBehav float64) (weight float64, masked OffPolicyMasks) {
	if c.IcePop && !icePopKeep(logpProx, logpBehav, c.IcePopLow, c.IcePopHigh) {
		masked.IcePop = true
	}
	if c.KPop && kPopScore(logpProx, logpBehav) > c.KPopPhi {
		masked.KPop = true
	}
	if masked.IcePop || masked.KPop {
		return 0, masked
	}
	return math.Min(math.Exp(logpProx-logpBehav), c.BehaviourWeightCap), masked
}

// ppoToken is the decoupled-PPO token loss
//
//	−w·min(r·A, clip(r, 1−ε, 1+ε_high)·A) + β·KL,
//
// with r = π/π_prox (carries the gradient) and w = min(π_prox/μ, cap)
// (a constant that corrects for the behaviour policy being stale).
func ppoToken(c LossConfig, in tokenIn) tokenOut {
	var out tokenOut
	w, off := c.OffPolicy(in.LogpProx, in.LogpBehav)
	out.IcePopMasked, out.KPopMasked = off.IcePop, off.KPop
	out.Masked = off.IcePop || off.KPop
	if out.Masked {
		return out
	}
	r := math.Exp(in.Logp - in.LogpProx)
	rc := math.Min(math.Max(r, 1-c.ClipLow), 1+c.ClipHigh)
	un, cl := r*in.Adv, rc*in.Adv
	if cl < un {
		// The clipped branch is the minimum: it is constant in θ.
		out.Loss, out.Clipped = -w*cl, true
	} else {
		out.Loss, out.DLogp = -w*un, -w*in.Adv*r
	}
	if c.KLCoef > 0 {
		lr := in.Logp - in.LogpRef
		var kl, dkl float64
		switch c.KLEstimator {
		case KLk1:
			kl, dkl = lr, 1
		case KLk2:
			kl, dkl = 0.5*lr*lr, lr
		default:
			kl, dkl = math.Exp(-lr)-1+lr, 1-math.Exp(-lr)
		}
		out.KL = kl
		out.Loss += c.KLCoef * kl
		out.DLogp += c.KLCoef * dkl
	}
	return out
}
