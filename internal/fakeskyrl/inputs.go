package fakeskyrl

import (
	"fmt"
	"strings"
)

// The losses SkyRL's API accepts, and the loss_fn_config keys each allows
// (ForwardBackwardInput._ALLOWED_KEYS_BY_LOSS_FN).
var allowedLossKeys = map[string][]string{
	"cross_entropy":       nil,
	"importance_sampling": nil,
	"ppo":                 {"clip_low_threshold", "clip_high_threshold", "value_clip"},
	"gspo":                {"clip_low_threshold", "clip_high_threshold"},
	"cispo":               {"clip_low_threshold", "clip_high_threshold"},
	"ppo_critic":          {"value_clip"},
	"dppo":                {"delta_low", "delta_high"},
}

const lossFnLiteralMsg = "Input should be 'cross_entropy', 'importance_sampling', 'ppo', 'gspo', 'cispo', 'ppo_critic' or 'dppo'"

// passInput is a validated forward or forward_backward input, with
// Datum.to_types' defaults applied. Its JSON is what seq_id deduplication
// compares, as create_future compares the serialized types.ForwardBackwardInput.
type passInput struct {
	Data         []passDatum        `json:"data"`
	LossFn       string             `json:"loss_fn"`
	LossFnConfig map[string]float64 `json:"loss_fn_config"`
}

type passChunk struct {
	Type   string `json:"type"`
	Tokens []int  `json:"tokens,omitempty"`
}

type passDatum struct {
	Chunks       []passChunk `json:"chunks"`
	TargetTokens []float64   `json:"target_tokens"`
	Weights      []float64   `json:"weights"`
	Advantages   []float64   `json:"advantages"`
	Logprobs     []float64   `json:"logprobs"`
	Values       []float64   `json:"values"`
	Returns      []float64   `json:"returns"`
}

// errNoTargets is SkyRL's KeyError in Datum.to_types when a datum has no
// target_tokens: FastAPI answers it as an unhandled 500.
var errNoTargets = fmt.Errorf("datum without target_tokens")

// checkPassInput validates a ForwardBackwardInput found at path. It returns
// nil when c gained errors, or errNoTargets when the body validates but
// to_types would fail.
func checkPassInput(c *checker, in *forwardBackwardInput, raw any, path ...any) (*passInput, error) {
	if in == nil {
		c.missing(raw, path...)
		return nil, nil
	}
	before := len(c.errs)
	rawIn, _ := lookup(raw, path...).(map[string]any)
	if in.Data == nil {
		c.missing(rawIn, append(path, "data")...)
	}
	if in.LossFn == nil {
		c.missing(rawIn, append(path, "loss_fn")...)
	} else if _, ok := allowedLossKeys[*in.LossFn]; !ok {
		c.add("literal_error", lossFnLiteralMsg, *in.LossFn, append(path, "loss_fn")...)
	}
	if in.Data != nil {
		for i, d := range *in.Data {
			checkDatum(c, d, append(path, "data", i)...)
		}
	}
	if len(c.errs) > before {
		return nil, nil
	}
	if in.LossFnConfig != nil {
		allowed := allowedLossKeys[*in.LossFn]
		var invalid []string
		for k := range in.LossFnConfig {
			if !contains(allowed, k) {
				invalid = append(invalid, k)
			}
		}
		if len(invalid) > 0 {
			var msg string
			if len(allowed) > 0 {
				msg = fmt.Sprintf("Invalid loss_fn_config keys for loss_fn='%s': %s. Allowed keys: %s.",
					*in.LossFn, pyList(invalid), pyList(append([]string{}, allowed...)))
			} else {
				msg = fmt.Sprintf("loss_fn='%s' does not accept loss_fn_config keys. Received: %s.", *in.LossFn, pyList(invalid))
			}
			c.add("value_error", "Value error, "+msg, rawIn, path...)
			return nil, nil
		}
	}
	out := &passInput{LossFn: *in.LossFn, LossFnConfig: in.LossFnConfig, Data: make([]passDatum, 0, len(*in.Data))}
	for _, d := range *in.Data {
		inputs := *d.LossFnInputs
		targets, ok := inputs["target_tokens"]
		if !ok {
			return nil, errNoTargets
		}
		pd := passDatum{TargetTokens: *targets.Data}
		if w, ok := inputs["weights"]; ok {
			pd.Weights = *w.Data
		} else {
			pd.Weights = make([]float64, len(pd.TargetTokens))
			for i := range pd.Weights {
				pd.Weights[i] = 1
			}
		}
		pd.Advantages = optionalTensor(inputs, "advantages")
		pd.Logprobs = optionalTensor(inputs, "logprobs")
		pd.Values = optionalTensor(inputs, "values")
		pd.Returns = optionalTensor(inputs, "returns")
		for _, ch := range *d.ModelInput.Chunks {
			pc := passChunk{Type: chunkType(ch)}
			if ch.Tokens != nil {
				pc.Tokens = *ch.Tokens
			}
			pd.Chunks = append(pd.Chunks, pc)
		}
		out.Data = append(out.Data, pd)
	}
	return out, nil
}

func checkDatum(c *checker, d datum, path ...any) {
	if d.LossFnInputs == nil {
		c.missing(nil, append(path, "loss_fn_inputs")...)
	} else {
		for name, t := range *d.LossFnInputs {
			if t.Data == nil {
				c.missing(nil, append(path, "loss_fn_inputs", name, "data")...)
			}
		}
	}
	if d.ModelInput == nil {
		c.missing(nil, append(path, "model_input")...)
		return
	}
	if d.ModelInput.Chunks == nil {
		c.missing(nil, append(path, "model_input", "chunks")...)
		return
	}
	for i, ch := range *d.ModelInput.Chunks {
		at := append(path, "model_input", "chunks", i)
		switch typ := chunkType(ch); typ {
		case "encoded_text":
			if ch.Tokens == nil {
				c.missing(nil, append(at, "encoded_text", "tokens")...)
			}
		case "image", "image_asset_pointer":
			// Accepted by the API; the engine fails the request.
		default:
			c.add("union_tag_invalid",
				fmt.Sprintf("Input tag '%s' found using _get_model_chunk_type() does not match any of the expected tags: 'encoded_text', 'image_asset_pointer', 'image'", typ),
				nil, at...)
		}
	}
}

// chunkType is SkyRL's _get_model_chunk_type: the explicit type, else
// the kind the keys imply, else encoded_text.
func chunkType(ch chunk) string {
	switch {
	case ch.Type != "":
		return ch.Type
	case ch.Tokens != nil:
		return "encoded_text"
	case ch.Location != nil:
		return "image_asset_pointer"
	case ch.Data != nil:
		return "image"
	}
	return "encoded_text"
}

func optionalTensor(inputs map[string]tensorData, name string) []float64 {
	if t, ok := inputs[name]; ok {
		return *t.Data
	}
	return []float64{}
}

// adamParams is types.AdamParams with SkyRL's defaults applied.
type adamParams struct {
	LearningRate float64 `json:"learning_rate"`
	Beta1        float64 `json:"beta1"`
	Beta2        float64 `json:"beta2"`
	Eps          float64 `json:"eps"`
	WeightDecay  float64 `json:"weight_decay"`
}

type optimInput struct {
	AdamParams adamParams `json:"adam_params"`
}

// checkAdamParams applies api.py's AdamParams defaults and bounds.
func checkAdamParams(c *checker, in *adamParamsIn, raw any, path ...any) adamParams {
	p := adamParams{LearningRate: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12, WeightDecay: 0}
	if in == nil {
		c.missing(raw, path...)
		return p
	}
	bound := func(v *float64, dst *float64, name string, ge, gt, lt bool) {
		if v == nil {
			return
		}
		*dst = *v
		switch {
		case ge && *v < 0:
			c.add("greater_than_equal", "Input should be greater than or equal to 0.0", *v, append(path, name)...)
		case gt && *v <= 0:
			c.add("greater_than", "Input should be greater than 0.0", *v, append(path, name)...)
		case lt && *v >= 1:
			c.add("less_than", "Input should be less than 1.0", *v, append(path, name)...)
		}
	}
	bound(in.LearningRate, &p.LearningRate, "learning_rate", true, false, false)
	bound(in.Beta1, &p.Beta1, "beta1", true, false, true)
	bound(in.Beta2, &p.Beta2, "beta2", true, false, true)
	bound(in.Eps, &p.Eps, "eps", false, true, false)
	bound(in.WeightDecay, &p.WeightDecay, "weight_decay", true, false, false)
	return p
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// lookup walks a decoded JSON value along path, for the input echoed in
// a 422 entry.
func lookup(v any, path ...any) any {
	for _, p := range path {
		switch key := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[key]
		case int:
			l, ok := v.([]any)
			if !ok || key >= len(l) {
				return nil
			}
			v = l[key]
		}
	}
	return v
}

// tinkerPath is types.TinkerPath: tinker://primary/kind/secondary or
// tinker://primary/secondary (kind "").
type tinkerPath struct {
	primary, kind, secondary string
}

func parseTinkerPath(s string) (tinkerPath, bool) {
	rest, ok := strings.CutPrefix(s, "tinker://")
	if !ok {
		return tinkerPath{}, false
	}
	host, path, _ := strings.Cut(rest, "/")
	parts := strings.Split(path, "/")
	switch len(parts) {
	case 1:
		return tinkerPath{primary: host, secondary: parts[0]}, true
	case 2:
		return tinkerPath{primary: host, kind: parts[0], secondary: parts[1]}, true
	}
	return tinkerPath{}, false
}
