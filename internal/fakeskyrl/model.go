package fakeskyrl

import (
	"fmt"
	"math"
)

// The JAX backend's PPO clip defaults (_DEFAULT_PPO_CLIP_*_THRESHOLD).
const (
	defaultClipLow  = 0.8
	defaultClipHigh = 1.2
)

// weights are a model's learnable state: the logit table and its AdamW
// moments. A training checkpoint is a copy of them.
type weights struct {
	Table []float64
	Mu    []float64
	Nu    []float64
	Steps int
}

func newWeights(vocab int) weights {
	// LoRA's B starts at zero, so a fresh adapter leaves the base, here a
	// uniform distribution, unchanged.
	return weights{Table: make([]float64, vocab), Mu: make([]float64, vocab), Nu: make([]float64, vocab)}
}

func (w weights) clone() weights {
	return weights{
		Table: append([]float64{}, w.Table...),
		Mu:    append([]float64{}, w.Mu...),
		Nu:    append([]float64{}, w.Nu...),
		Steps: w.Steps,
	}
}

// policy is one model's engine-side state, touched only by its worker.
type policy struct {
	weights
	lora loraConfig
	// gradSum and gradCount are the JAX backend's AccumulatedGradients:
	// summed gradients and the number of datums they came from.
	gradSum   []float64
	gradCount int
}

func newPolicy(vocab int, lora loraConfig) *policy {
	return &policy{weights: newWeights(vocab), lora: lora, gradSum: make([]float64, vocab)}
}

// logSoftmax returns log_softmax(table) and softmax(table).
func logSoftmax(table []float64) (logp, p []float64) {
	maxv := math.Inf(-1)
	for _, v := range table {
		maxv = math.Max(maxv, v)
	}
	var sum float64
	for _, v := range table {
		sum += math.Exp(v - maxv)
	}
	lse := maxv + math.Log(sum)
	logp, p = make([]float64, len(table)), make([]float64, len(table))
	for i, v := range table {
		logp[i] = v - lse
		p[i] = math.Exp(logp[i])
	}
	return logp, p
}

// tokenLoss is one token's loss from loss_fns.py and its derivative with
// respect to the target logprob. The mask is applied by the caller.
func tokenLoss(lossFn string, logp, sampled, adv, clipLow, clipHigh float64) (loss, dLogp float64) {
	switch lossFn {
	case "cross_entropy":
		return -logp, -1
	case "importance_sampling":
		ratio := math.Exp(logp - sampled)
		return -ratio * adv, -ratio * adv
	case "ppo":
		ratio := math.Exp(logp - sampled)
		clipped := math.Min(math.Max(ratio, clipLow), clipHigh)
		unclippedObj, clippedObj := ratio*adv, clipped*adv
		if unclippedObj <= clippedObj || (ratio > clipLow && ratio < clipHigh) {
			return -math.Min(unclippedObj, clippedObj), -ratio * adv
		}
		return -clippedObj, 0
	case "cispo":
		ratio := math.Exp(logp - sampled)
		clipped := math.Min(math.Max(ratio, clipLow), clipHigh)
		// The clipped ratio is under stop_gradient.
		return -clipped * logp * adv, -clipped * adv
	}
	panic("unreachable: loss " + lossFn)
}

// at returns v[i], or 0 past its end, as pad_batch pads with zeros.
func at(v []float64, i int) float64 {
	if i < len(v) {
		return v[i]
	}
	return 0
}

// pass runs forward (and, with backward, accumulates the gradient of) a
// request's loss, as JaxBackendImpl._model_pass does over one model.
func (p *policy) pass(in *passInput, backward bool) (*forwardBackwardOutput, error) {
	vocab := len(p.Table)
	switch in.LossFn {
	case "cross_entropy", "importance_sampling", "ppo", "cispo":
	default:
		return nil, fmt.Errorf("Loss functions ['%s'] are not supported by the JAX backend", in.LossFn)
	}
	lengths := make([]int, len(in.Data))
	for d, dt := range in.Data {
		n, err := checkDatumTokens(dt, vocab)
		if err != nil {
			return nil, fmt.Errorf("datum %d: %w", d, err)
		}
		lengths[d] = n
	}
	clipLow, clipHigh := defaultClipLow, defaultClipHigh
	if v, ok := in.LossFnConfig["clip_low_threshold"]; ok {
		clipLow = v
	}
	if v, ok := in.LossFnConfig["clip_high_threshold"]; ok {
		clipHigh = v
	}

	logp, prob := logSoftmax(p.Table)
	grad := make([]float64, vocab)
	out := &forwardBackwardOutput{LossFnOutputType: "scalar", LossFnOutputs: []lossFnOutput{}, Metrics: map[string]any{}}
	for d, dt := range in.Data {
		n := lengths[d]
		var maskSum float64
		for i := 0; i < n; i++ {
			maskSum += at(dt.Weights, i)
		}
		denom := math.Max(maskSum, 1e-9)
		losses, lps := make([]float32, n), make([]float32, n)
		var gradMass float64
		for i := 0; i < n; i++ {
			target := int(at(dt.TargetTokens, i))
			mask := at(dt.Weights, i)
			lp := logp[target]
			loss, dl := tokenLoss(in.LossFn, lp, at(dt.Logprobs, i), at(dt.Advantages, i), clipLow, clipHigh)
			// safe_loss_mask: a zero weight zeroes the loss outright.
			if mask == 0 {
				loss, dl = 0, 0
			}
			losses[i], lps[i] = float32(mask*loss), float32(lp)
			g := mask * dl / denom
			grad[target] += g
			gradMass += g
		}
		// d logp[t] / d table[j] = 1[j=t] - softmax[j].
		for j := range grad {
			grad[j] -= gradMass * prob[j]
		}
		out.LossFnOutputs = append(out.LossFnOutputs, lossFnOutput{
			ElementwiseLoss: tensorOut{Data: losses, DType: "float32", Shape: []int{n}},
			Logprobs:        tensorOut{Data: lps, DType: "float32", Shape: []int{n}},
		})
	}
	for _, o := range out.LossFnOutputs {
		for _, v := range o.ElementwiseLoss.Data {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("loss is not finite")
			}
		}
	}
	if backward {
		for j, g := range grad {
			p.gradSum[j] += g
		}
		p.gradCount += len(in.Data)
	}
	return out, nil
}

// checkDatumTokens checks a datum against the fake's vocabulary and
// returns its sequence length (the number of input tokens).
func checkDatumTokens(dt passDatum, vocab int) (int, error) {
	n := 0
	for _, ch := range dt.Chunks {
		if ch.Type != "encoded_text" {
			return 0, fmt.Errorf("%s chunks are not supported by this fake", ch.Type)
		}
		for _, t := range ch.Tokens {
			if t < 0 || t >= vocab {
				return 0, fmt.Errorf("token id %d is outside the vocabulary of %d", t, vocab)
			}
		}
		n += len(ch.Tokens)
	}
	for name, v := range map[string][]float64{
		"target_tokens": dt.TargetTokens, "weights": dt.Weights, "logprobs": dt.Logprobs, "advantages": dt.Advantages,
	} {
		if len(v) > n {
			return 0, fmt.Errorf("%s has %d entries for %d input tokens", name, len(v), n)
		}
	}
	for _, t := range dt.TargetTokens {
		if t < 0 || t >= float64(vocab) || t != math.Trunc(t) {
			return 0, fmt.Errorf("target token %v is outside the vocabulary of %d", t, vocab)
		}
	}
	return n, nil
}

// optimStep applies optax.adamw to the mean accumulated gradient and
// clears it, as compute_grads_and_update does.
func (p *policy) optimStep(a adamParams) optimStepOutput {
	count := math.Max(float64(p.gradCount), 1)
	var norm float64
	p.Steps++
	b1c := 1 - math.Pow(a.Beta1, float64(p.Steps))
	b2c := 1 - math.Pow(a.Beta2, float64(p.Steps))
	for j := range p.Table {
		g := p.gradSum[j] / count
		norm += g * g
		p.Mu[j] = a.Beta1*p.Mu[j] + (1-a.Beta1)*g
		p.Nu[j] = a.Beta2*p.Nu[j] + (1-a.Beta2)*g*g
		update := (p.Mu[j]/b1c)/(math.Sqrt(p.Nu[j]/b2c)+a.Eps) + a.WeightDecay*p.Table[j]
		p.Table[j] -= a.LearningRate * update
		p.gradSum[j] = 0
	}
	p.gradCount = 0
	return optimStepOutput{Metrics: map[string]float64{
		"skyrl.ai/grad_norm":     math.Sqrt(norm),
		"skyrl.ai/learning_rate": a.LearningRate,
	}}
}
