package tinkerserver

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"sort"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

// idPattern and idMaxLength are SkyRL's ID_PATTERN and ID_MAX_LENGTH for
// model and checkpoint ids.
var idPattern = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

const idMaxLength = 255

// fieldError is one entry of FastAPI's 422 detail list.
type fieldError struct {
	Type string `json:"type"`
	Loc  []any  `json:"loc"`
	Msg  string `json:"msg"`
}

// checker collects a body's validation errors, located under "body".
type checker struct{ errs []fieldError }

func (ch *checker) add(typ, msg string, loc ...any) {
	ch.errs = append(ch.errs, fieldError{Type: typ, Loc: append([]any{"body"}, loc...), Msg: msg})
}

// required reports an empty string field as missing.
func (ch *checker) required(v string, loc ...any) {
	if v == "" {
		ch.add("missing", "Field required", loc...)
	}
}

// id checks a string against SkyRL's id pattern and length.
func (ch *checker) id(v string, loc ...any) {
	switch {
	case v == "":
		ch.add("missing", "Field required", loc...)
	case len(v) > idMaxLength:
		ch.add("string_too_long", fmt.Sprintf("String should have at most %d characters", idMaxLength), loc...)
	case !idPattern.MatchString(v):
		ch.add("string_pattern_mismatch", fmt.Sprintf("String should match pattern '%s'", idPattern), loc...)
	}
}

// decode reads the body into v and runs check; it answers 413 or 422
// itself and reports false.
func decode(c *gin.Context, v any, check func(*checker)) bool {
	_, ok := decodeBody(c, v, check)
	return ok
}

// decodeBody is decode that also returns the body as it came.
func decodeBody(c *gin.Context, v any, check func(*checker)) ([]byte, bool) {
	body, err := tinker.ReadBody(http.MaxBytesReader(c.Writer, c.Request.Body, maxBody), c.Request.ContentLength)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		abort(c, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over %d bytes", maxBody))
		return nil, false
	case err != nil:
		abort(c, http.StatusBadRequest, "read request body: "+err.Error())
		return nil, false
	}
	ch := &checker{}
	if err := tinker.Unmarshal(body, v); err != nil {
		ch.add("json_invalid", "JSON decode error: "+err.Error())
	} else if check != nil {
		check(ch)
	}
	if len(ch.errs) > 0 {
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, gin.H{"detail": ch.errs})
		return nil, false
	}
	return body, true
}

// skyrlLosses are the loss functions SkyRL tx's API accepts, with the
// loss_fn_config keys each may carry. Another name is 422; one of these
// the learner does not implement fails its request, as SkyRL's JAX
// backend fails it.
var skyrlLosses = map[string][]string{
	tinker.LossCrossEntropy:       nil,
	tinker.LossImportanceSampling: nil,
	tinker.LossPPO:                {tinker.ClipHigh, tinker.ClipLow, "value_clip"},
	"gspo":                        {tinker.ClipHigh, tinker.ClipLow},
	"cispo":                       {tinker.ClipHigh, tinker.ClipLow},
	"ppo_critic":                  {"value_clip"},
	"dppo":                        {"delta_high", "delta_low"},
}

// passInput checks a forward or forward_backward input and turns it into
// the learner's datums and loss; field is its name in the body.
func passInput(ch *checker, in tinker.ForwardBackwardInput, field string) ([]trainer.TokenDatum, trainer.Loss) {
	loss := trainer.Loss{Fn: in.LossFn}
	allowed, ok := skyrlLosses[in.LossFn]
	if !ok {
		names := make([]string, 0, len(skyrlLosses))
		for n := range skyrlLosses {
			names = append(names, n)
		}
		sort.Strings(names)
		ch.add("literal_error", fmt.Sprintf("Input should be one of %q", names), field, "loss_fn")
	}
	var bad []string
	for k, v := range in.LossFnConfig {
		switch {
		case !slices.Contains(allowed, k):
			bad = append(bad, k)
		case k == tinker.ClipLow:
			loss.ClipLow = v
		case k == tinker.ClipHigh:
			loss.ClipHigh = v
		}
	}
	if ok && len(bad) > 0 {
		sort.Strings(bad)
		msg := fmt.Sprintf("Value error, loss_fn='%s' does not accept loss_fn_config keys. Received: %q.", in.LossFn, bad)
		if len(allowed) > 0 {
			msg = fmt.Sprintf("Value error, Invalid loss_fn_config keys for loss_fn='%s': %q. Allowed keys: %q.", in.LossFn, bad, allowed)
		}
		ch.add("value_error", msg, field)
	}
	if in.Data == nil {
		ch.add("missing", "Field required", field, "data")
	}
	data := make([]trainer.TokenDatum, len(in.Data))
	for d, dt := range in.Data {
		data[d] = datum(ch, dt, field, d)
	}
	return data, loss
}

// datum converts one datum; the learner checks what depends on the model
// and the loss (lengths, shift, vocabulary, context).
func datum(ch *checker, dt tinker.Datum, field string, d int) trainer.TokenDatum {
	var out trainer.TokenDatum
	ids, err := dt.ModelInput.Tokens()
	if err != nil {
		ch.add("value_error", err.Error(), field, "data", d, "model_input")
	}
	out.Input = ids
	targets, ok := dt.LossFnInputs[tinker.InputTargetTokens]
	if !ok {
		ch.add("missing", "Field required", field, "data", d, "loss_fn_inputs", tinker.InputTargetTokens)
	}
	for i, v := range targets.Data {
		if v != math.Trunc(v) || math.Abs(v) > math.MaxInt32 {
			ch.add("int_from_float", "Input should be a valid integer, got a number with a fractional part", field, "data", d, "loss_fn_inputs", tinker.InputTargetTokens, "data", i)
			break
		}
		out.Targets = append(out.Targets, int(v))
	}
	floats := func(key string) []float32 {
		t, ok := dt.LossFnInputs[key]
		if !ok {
			return nil
		}
		v := make([]float32, len(t.Data))
		for i, x := range t.Data {
			v[i] = float32(x)
		}
		return v
	}
	out.Weights = floats(tinker.InputWeights)
	out.Logprobs = floats(tinker.InputLogprobs)
	out.Advantages = floats(tinker.InputAdvantages)
	return out
}

// passOutput is a forward or forward_backward result on the wire.
func passOutput(res trainer.ForwardResult) tinker.ForwardBackwardOutput {
	out := tinker.ForwardBackwardOutput{LossFnOutputType: "scalar", Metrics: map[string]float64{tinker.MetricLossSum: res.LossSum},
		LossFnOutputs: make([]map[string]tinker.TensorData, len(res.Logprobs))}
	for d := range res.Logprobs {
		out.LossFnOutputs[d] = map[string]tinker.TensorData{
			tinker.OutputLogprobs: floats64(res.Logprobs[d]),
			tinker.OutputLoss:     floats64(res.Loss[d]),
		}
	}
	return out
}

func floats64(v []float32) tinker.TensorData {
	x := make([]float64, len(v))
	for i, f := range v {
		x[i] = float64(f)
	}
	return tinker.Floats(x)
}

// adamParams is adam_params with SkyRL tx's defaults for absent fields.
type adamParams struct {
	LearningRate *float64 `json:"learning_rate"`
	Beta1        *float64 `json:"beta1"`
	Beta2        *float64 `json:"beta2"`
	Eps          *float64 `json:"eps"`
	WeightDecay  *float64 `json:"weight_decay"`
	GradClipNorm *float64 `json:"grad_clip_norm"`
}

// step resolves the defaults (SkyRL's: 1e-4, 0.9, 0.95, 1e-12, 0; no
// clipping) and checks SkyRL's bounds.
func (p adamParams) step(ch *checker) trainer.AdamStep {
	get := func(v *float64, def float64, name string, lo float64, loOpen bool, hi float64) float64 {
		x := def
		if v != nil {
			x = *v
		}
		switch {
		case loOpen && !(x > lo):
			ch.add("greater_than", fmt.Sprintf("Input should be greater than %v", lo), "adam_params", name)
		case !loOpen && !(x >= lo):
			ch.add("greater_than_equal", fmt.Sprintf("Input should be greater than or equal to %v", lo), "adam_params", name)
		case !(x < hi):
			ch.add("less_than", fmt.Sprintf("Input should be less than %v", hi), "adam_params", name)
		}
		return x
	}
	inf := math.Inf(1)
	return trainer.AdamStep{
		LR:          get(p.LearningRate, 1e-4, "learning_rate", 0, false, inf),
		Beta1:       get(p.Beta1, 0.9, "beta1", 0, false, 1),
		Beta2:       get(p.Beta2, 0.95, "beta2", 0, false, 1),
		Eps:         get(p.Eps, 1e-12, "eps", 0, true, inf),
		WeightDecay: get(p.WeightDecay, 0, "weight_decay", 0, false, inf),
		ClipNorm:    get(p.GradClipNorm, 0, "grad_clip_norm", 0, false, inf),
	}
}
