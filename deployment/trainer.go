package deployment

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
)

// Trainer kinds.
const (
	// TrainerTinker trains through the Tinker training API: hosted
	// Tinker, SkyRL tx, OpenRL or the embedded trainer of `flywheel up`.
	// Flywheel's own workers drive it (queue TinkerQueue).
	TrainerTinker = "tinker"
	// TrainerTemporal is a trainer worker of the flywheel.train/v1
	// protocol (docs/trainer-protocol.md) on its own task queue.
	TrainerTemporal = "temporal"
)

// Losses a Tinker trainer may be told to take.
const (
	// LossPPO is decoupled PPO: a forward pass gives the proximal
	// log-probs, the behaviour weight and the masks (IcePop, KPop) fold
	// into the advantages, and Tinker's clipped ppo loss trains.
	LossPPO = "ppo"
	// LossImportanceSampling is Tinker's importance_sampling loss against
	// the behaviour log-probs, unclipped: one pass less.
	LossImportanceSampling = "importance_sampling"
)

// TinkerQueue is the task queue of Flywheel's workers that drive Tinker
// trainers; every worker with the training activities serves it.
const TinkerQueue = "flywheel-tinker"

// Trainer says what trains a deployment. Zero fields take the defaults
// WithDefaults gives.
type Trainer struct {
	// Kind is "tinker" or "temporal".
	Kind string `json:"kind"`
	// Queue is the task queue of the train step: a temporal trainer's own,
	// TinkerQueue for tinker.
	Queue string `json:"queue,omitempty"`
	// URL is the Tinker service's root (tinker).
	URL string `json:"url,omitempty"`
	// APIKeyEnv names the environment variable holding the service's key
	// on the workers; the key itself is never stored.
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// BaseModel is the model the service trains (default: the
	// deployment's base_model).
	BaseModel string `json:"base_model,omitempty"`
	// LoRA is the adapter. Rank 0 trains full weights, an extension only
	// the embedded trainer serves.
	LoRA LoRA `json:"lora"`
	// Loss is "ppo" (default) or "importance_sampling".
	Loss string `json:"loss,omitempty"`
	// ClipLow and ClipHigh bound the ppo ratio to [1−low, 1+high]
	// (defaults 0.2 and 0.28).
	ClipLow  float64 `json:"clip_low,omitempty"`
	ClipHigh float64 `json:"clip_high,omitempty"`
	// BehaviourWeightCap caps the decoupled-PPO weight π_prox/μ (default 5).
	BehaviourWeightCap float64 `json:"behaviour_weight_cap,omitempty"`
	// KLCoef weighs a penalty on the KL from the base model (0: none),
	// taken as the Tinker cookbook takes it: every trained token's
	// advantage gains KLCoef·(mean d − d), d its behaviour log-prob less
	// the base model's, the mean over the batch's trained tokens. The base
	// model's log-probs come from a forward pass on a second model of the
	// service, created from BaseModel and never updated.
	KLCoef float64 `json:"kl_coef,omitempty"`
	// MiniBatches is the optimizer steps per batch (default 1).
	MiniBatches int `json:"mini_batches,omitempty"`
	// NominalBatch scales the learning rate of a step that trains fewer
	// samples by samples/NominalBatch (0: no scaling).
	NominalBatch int `json:"nominal_batch,omitempty"`
	// Adam is the optimizer.
	Adam Adam `json:"adam"`
	// Masks are the step's off-policy token masks where the training
	// loop names none (nil: none).
	Masks *TokenMasks `json:"masks,omitempty"`
	// Advantage is how the control plane turns the batch's rewards into
	// advantages, whatever the kind (nil: GRPO's (r − mean)/std, with a
	// per-task running baseline at rate 0.1 for samples without a group).
	Advantage *Advantage `json:"advantage,omitempty"`
}

// Advantage is an advantage estimator's settings (trainer.AdvantageConfig
// reads them; zero fields take its defaults).
type Advantage struct {
	// Estimator is "mean_std" (GRPO), "mean" (Dr. GRPO) or
	// "leave_one_out" (RLOO).
	Estimator string `json:"estimator,omitempty"`
	// BaselineRate is the step of the per-task running baseline of
	// samples without a group, in (0, 1].
	BaselineRate float64 `json:"baseline_rate,omitempty"`
	// PerfectAdvantage is the advantage of a group whose answers all
	// earned the top reward (0: none).
	PerfectAdvantage float64 `json:"perfect_advantage,omitempty"`
	// NegativeWeight scales every negative advantage, in (0, 1] (0: 1).
	NegativeWeight float64 `json:"negative_weight,omitempty"`
}

// LoRA is a Tinker model's adapter.
type LoRA struct {
	// Rank defaults to 32; 0 after defaults only where FullWeights.
	Rank int `json:"rank,omitempty"`
	// FullWeights trains every weight instead of an adapter (Flywheel's
	// extension of the API, rank 0 on the wire).
	FullWeights bool `json:"full_weights,omitempty"`
	// Attn, MLP and Unembed say which layers carry the adapter (defaults:
	// attention and MLP on, unembedding off, as Tinker's).
	Attn    *bool `json:"attn,omitempty"`
	MLP     *bool `json:"mlp,omitempty"`
	Unembed *bool `json:"unembed,omitempty"`
	// Seed initialises the adapter (default 0: the service picks).
	Seed int64 `json:"seed,omitempty"`
}

// Adam is the optimizer of a Tinker trainer.
type Adam struct {
	// LR defaults to 1e-4 (Tinker's for LoRA on a large model).
	LR float64 `json:"lr,omitempty"`
	// Beta1 0.9, Beta2 0.95, Eps 1e-8 by default; WeightDecay 0.
	Beta1       float64 `json:"beta1,omitempty"`
	Beta2       float64 `json:"beta2,omitempty"`
	Eps         float64 `json:"eps,omitempty"`
	WeightDecay float64 `json:"weight_decay,omitempty"`
	// GradClipNorm bounds the gradient's global norm (0: none).
	GradClipNorm float64 `json:"grad_clip_norm,omitempty"`
}

// WithDefaults fills what t leaves zero; base is the deployment's base
// model.
func (t Trainer) WithDefaults(base string) Trainer {
	if t.Kind == TrainerTinker && t.Queue == "" {
		t.Queue = TinkerQueue
	}
	if t.BaseModel == "" {
		t.BaseModel = base
	}
	if t.Loss == "" {
		t.Loss = LossPPO
	}
	if t.ClipLow == 0 {
		t.ClipLow = 0.2
	}
	if t.ClipHigh == 0 {
		t.ClipHigh = 0.28
	}
	if t.BehaviourWeightCap == 0 {
		t.BehaviourWeightCap = 5
	}
	if t.MiniBatches == 0 {
		t.MiniBatches = 1
	}
	if t.LoRA.Rank == 0 && !t.LoRA.FullWeights {
		t.LoRA.Rank = 32
	}
	on, off := true, false
	if t.LoRA.Attn == nil {
		t.LoRA.Attn = &on
	}
	if t.LoRA.MLP == nil {
		t.LoRA.MLP = &on
	}
	if t.LoRA.Unembed == nil {
		t.LoRA.Unembed = &off
	}
	a := &t.Adam
	if a.LR == 0 {
		a.LR = 1e-4
	}
	if a.Beta1 == 0 {
		a.Beta1 = 0.9
	}
	if a.Beta2 == 0 {
		a.Beta2 = 0.95
	}
	if a.Eps == 0 {
		a.Eps = 1e-8
	}
	return t
}

// Validate checks a trainer after WithDefaults; each error names its
// field.
func (t Trainer) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("trainer."+format, args...)) }
	switch t.Kind {
	case TrainerTinker:
		u, err := url.Parse(t.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("url %q: want the Tinker service's http(s) root, e.g. http://skyrl:8000", t.URL)
		}
		if t.BaseModel == "" {
			bad("base_model: a tinker trainer names the model it trains (or the deployment's base_model does)")
		}
	case TrainerTemporal:
		if t.Queue == "" {
			bad("queue: a temporal trainer names its task queue")
		}
	default:
		bad("kind %q: want %q or %q", t.Kind, TrainerTinker, TrainerTemporal)
	}
	if t.Queue != "" && (len(t.Queue) > maxModelName || strings.ContainsFunc(t.Queue, func(r rune) bool { return r <= ' ' })) {
		bad("queue %q: want a task queue name: at most %d printable characters, no spaces", t.Queue, maxModelName)
	}
	if t.APIKeyEnv != "" && !envName.MatchString(t.APIKeyEnv) {
		bad("api_key_env %q: want an environment variable name", t.APIKeyEnv)
	}
	if len(t.BaseModel) > maxModelRef || strings.ContainsFunc(t.BaseModel, func(r rune) bool { return r < ' ' }) {
		bad("base_model %q: want a model name, at most %d printable characters", t.BaseModel, maxModelRef)
	}
	if t.Loss != LossPPO && t.Loss != LossImportanceSampling {
		bad("loss %q: want %q or %q", t.Loss, LossPPO, LossImportanceSampling)
	}
	if !(t.ClipLow > 0 && t.ClipLow < 1) {
		bad("clip_low %v: want (0, 1)", t.ClipLow)
	}
	if !(t.ClipHigh > 0 && t.ClipHigh <= 10) {
		bad("clip_high %v: want (0, 10]", t.ClipHigh)
	}
	if !(t.BehaviourWeightCap >= 1) {
		bad("behaviour_weight_cap %v: want ≥ 1", t.BehaviourWeightCap)
	}
	if !(t.KLCoef >= 0 && !math.IsInf(t.KLCoef, 0)) {
		bad("kl_coef %v: want ≥ 0", t.KLCoef)
	}
	if t.MiniBatches < 1 || t.MiniBatches > 1024 {
		bad("mini_batches %d: want 1..1024", t.MiniBatches)
	}
	if t.NominalBatch < 0 {
		bad("nominal_batch %d: want ≥ 0", t.NominalBatch)
	}
	switch {
	case t.LoRA.FullWeights && t.LoRA.Rank != 0:
		bad("lora.rank %d: full_weights trains no adapter; leave rank out", t.LoRA.Rank)
	case !t.LoRA.FullWeights && (t.LoRA.Rank < 1 || t.LoRA.Rank > 1024):
		bad("lora.rank %d: want 1..1024", t.LoRA.Rank)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if adv := t.Advantage; adv != nil {
		switch adv.Estimator {
		case "", "mean_std", "mean", "leave_one_out":
		default:
			bad("advantage.estimator %q: want mean_std, mean or leave_one_out", adv.Estimator)
		}
		if !(adv.BaselineRate >= 0 && adv.BaselineRate <= 1) {
			bad("advantage.baseline_rate %v: want (0, 1]", adv.BaselineRate)
		}
		if !(adv.PerfectAdvantage >= 0 && finite(adv.PerfectAdvantage)) {
			bad("advantage.perfect_advantage %v: want ≥ 0", adv.PerfectAdvantage)
		}
		if !(adv.NegativeWeight >= 0 && adv.NegativeWeight <= 1) {
			bad("advantage.negative_weight %v: want (0, 1]", adv.NegativeWeight)
		}
	}
	a := t.Adam
	if !(a.LR > 0 && a.LR <= 1) {
		bad("adam.lr %v: want (0, 1]", a.LR)
	}
	if !(a.Beta1 >= 0 && a.Beta1 < 1) || !(a.Beta2 >= 0 && a.Beta2 < 1) {
		bad("adam.beta1 %v, adam.beta2 %v: want [0, 1)", a.Beta1, a.Beta2)
	}
	if !(a.Eps > 0 && finite(a.Eps)) {
		bad("adam.eps %v: want > 0", a.Eps)
	}
	if !(a.WeightDecay >= 0 && finite(a.WeightDecay)) || !(a.GradClipNorm >= 0 && finite(a.GradClipNorm)) {
		bad("adam.weight_decay %v, adam.grad_clip_norm %v: want ≥ 0", a.WeightDecay, a.GradClipNorm)
	}
	return errors.Join(errs...)
}

// TokenMasks are the off-policy token masks a train step applies: IcePop
// drops tokens whose ratio π_prox/μ leaves [IcePopLow, IcePopHigh], KPop
// those whose bidirectional binary KL exceeds KPopPhi (zero thresholds:
// 0.5, 2, 0.05). It is the wire form of trainer.Masks, so a trainer in any
// language can read it.
type TokenMasks struct {
	IcePop     bool    `json:"icepop"`
	IcePopLow  float64 `json:"icepop_low,omitempty"`
	IcePopHigh float64 `json:"icepop_high,omitempty"`
	KPop       bool    `json:"kpop"`
	KPopPhi    float64 `json:"kpop_phi,omitempty"`
}
