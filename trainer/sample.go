package trainer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
)

// SampleOptions control generation.
type SampleOptions struct {
	// Temperature scales logits; 0 means greedy. Default 1 (when nil).
	Temperature *float64
	// TopP keeps the smallest set of tokens whose probability reaches TopP.
	// Default 1 (no truncation).
	TopP float64
	// MaxTokens bounds the completion. Default 64; never past the context.
	MaxTokens int
	// Stop ends generation when the text ends with one of these strings.
	// <|im_end|> always stops.
	Stop []string
	// TopLogprobs asks for that many most likely alternatives per token.
	TopLogprobs int
}

// Generation is one sampled completion.
type Generation struct {
	PromptIDs []int
	IDs       []int
	// Logprobs[i] is log π(IDs[i]) under the distribution it was drawn from:
	// softmax(logits/T) (T = 1 for greedy), before top-p truncation. The
	// trainer recomputes proximal log-probs at the same temperature.
	Logprobs []float32
	// Finish is FinishStop (stop token or string) or FinishLength.
	Finish string
	// StopText is the stop string that ended generation, if any.
	StopText string
	// Top[i] holds the TopLogprobs most likely tokens at step i.
	Top [][]TokenLogprob
}

// TokenLogprob is one candidate token and its log-prob.
type TokenLogprob struct {
	ID      int
	Logprob float32
}

const (
	finishStop   = "stop"
	finishLength = "length"
)

// Generate samples one completion per prompt, batching the decode steps of
// all prompts. onToken, when set, sees every token as it is produced; an
// error from it aborts generation.
func (m *Model) Generate(ctx context.Context, prompts [][]int, opts SampleOptions, rng *rand.Rand, onToken func(seq, id int, logprob float32) error) ([]Generation, error) {
	s, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if rng == nil {
		rng = rand.New(rand.NewPCG(1, 2))
	}
	// Per prompt: its generation so far, its KV cache and the token to feed
	// next. Separate slices in this frame, not a struct, so that for one
	// prompt (a chat request) they can stay off the heap.
	gens := make([]Generation, len(prompts))
	caches := make([]*kvCache, len(prompts))
	next := make([]int, len(prompts))
	if err := m.startSequences(prompts, gens, caches, next); err != nil {
		return nil, err
	}
	if err := m.decode(ctx, s, rng, onToken, gens, caches, next); err != nil {
		return nil, err
	}
	return gens, nil
}

// sampling is SampleOptions with the defaults applied, checked.
type sampling struct {
	temp, topP  float64
	maxTok, top int
	stop        []string
}

func (o SampleOptions) resolve() (sampling, error) {
	s := sampling{temp: 1, topP: o.TopP, maxTok: o.MaxTokens, top: o.TopLogprobs, stop: o.Stop}
	if o.Temperature != nil {
		s.temp = *o.Temperature
	}
	if s.temp < 0 || math.IsNaN(s.temp) || math.IsInf(s.temp, 0) {
		return s, inputErrorf("temperature %v must be a finite number ≥ 0", s.temp)
	}
	if s.topP == 0 {
		s.topP = 1
	}
	if s.topP < 0 || s.topP > 1 || math.IsNaN(s.topP) {
		return s, inputErrorf("top_p %v must be in (0, 1]", s.topP)
	}
	if s.maxTok == 0 {
		s.maxTok = 64
	}
	if s.top < 0 || s.top > 20 {
		return s, inputErrorf("top_logprobs %d must be in [0, 20]", s.top)
	}
	if s.maxTok < 0 {
		return s, inputErrorf("max_tokens %d must be positive", s.maxTok)
	}
	return s, nil
}

// startSequences checks every prompt, then fills gens, next and caches
// (prefilled with all but the last prompt token).
func (m *Model) startSequences(prompts [][]int, gens []Generation, caches []*kvCache, next []int) error {
	c := m.Config
	for i, p := range prompts {
		if len(p) == 0 {
			return inputErrorf("prompt %d is empty", i)
		}
		if err := validateIDs(p, c.Vocab); err != nil {
			return inputErrorf("prompt %d: %v", i, err)
		}
		if len(p) >= c.Context {
			return inputErrorf("prompt %d has %d tokens; the context is %d", i, len(p), c.Context)
		}
		gens[i].PromptIDs = p
		next[i] = p[len(p)-1]
	}
	// A GRPO group samples one prompt many times: prefill it once and copy
	// the cache.
	first := map[string]int{}
	for i, p := range prompts {
		key := idsKey(p)
		if j, ok := first[key]; ok {
			caches[i] = caches[j].clone(c.DModel)
			continue
		}
		first[key] = i
		caches[i] = m.newCache()
		m.prefill(caches[i], p[:len(p)-1])
	}
	return nil
}

// decode runs batched decode steps over every sequence still going, one
// token each, until all have finished, appending to gens.
func (m *Model) decode(ctx context.Context, s sampling, rng *rand.Rand, onToken func(seq, id int, logprob float32) error, gens []Generation, caches []*kvCache, next []int) error {
	c := m.Config
	w := m.view(m.W)
	text := make([]strings.Builder, len(gens))
	active := make([]int, len(gens))
	for i := range active {
		active[i] = i
	}
	V := c.Vocab
	logits := make([]float32, len(gens)*V)
	lp := make([]float32, V)
	for len(active) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		cs, toks := make([]*kvCache, len(active)), make([]int, len(active))
		for j, i := range active {
			cs[j], toks[j] = caches[i], next[i]
		}
		m.decodeStep(w, cs, toks, logits[:len(active)*V])
		still := active[:0]
		for j, i := range active {
			tok := s.draw(lp, logits[j*V:j*V+V], rng)
			g := &gens[i]
			g.IDs = append(g.IDs, tok)
			g.Logprobs = append(g.Logprobs, lp[tok])
			if s.top > 0 {
				g.Top = append(g.Top, topK(lp, s.top))
			}
			if onToken != nil {
				if err := onToken(i, tok, lp[tok]); err != nil {
					return err
				}
			}
			text[i].WriteString(TokenText(tok))
			if !s.finish(g, tok, text[i].String(), caches[i].n+1 >= c.Context) {
				next[i] = tok
				still = append(still, i)
			}
		}
		active = still
	}
	return nil
}

// draw picks the next token from the logits z, leaving in lp the log-probs
// it was drawn from: at temperature 1 for greedy, else at the sampling
// temperature, before top-p truncation.
func (s sampling) draw(lp, z []float32, rng *rand.Rand) int {
	if s.temp == 0 {
		logSoftmaxRow(lp, z, 1)
		return argmax(lp)
	}
	logSoftmaxRow(lp, z, float32(1/s.temp))
	return sampleTopP(lp, s.topP, rng)
}

// finish reports whether g, whose text now ends with tok, is done, and sets
// why: the end token or a stop string, else its length (full: the context
// has no room for another token).
func (s sampling) finish(g *Generation, tok int, text string, full bool) bool {
	switch {
	case tok == TokImEnd:
		g.Finish = finishStop
	case endsWithAny(text, s.stop, &g.StopText):
		g.Finish = finishStop
	case len(g.IDs) >= s.maxTok || full:
		g.Finish = finishLength
	default:
		return false
	}
	return true
}

func endsWithAny(s string, stops []string, which *string) bool {
	for _, st := range stops {
		if st != "" && strings.HasSuffix(s, st) {
			*which = st
			return true
		}
	}
	return false
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// sampleTopP draws from exp(lp) restricted to the top-p nucleus.
func sampleTopP(lp []float32, topP float64, rng *rand.Rand) int {
	if topP >= 1 {
		r := rng.Float64()
		var acc float64
		for i, v := range lp {
			acc += math.Exp(float64(v))
			if r < acc {
				return i
			}
		}
		return argmax(lp)
	}
	idx := make([]int, len(lp))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return lp[idx[a]] > lp[idx[b]] })
	var mass float64
	n := 0
	for n < len(idx) {
		mass += math.Exp(float64(lp[idx[n]]))
		n++
		if mass >= topP {
			break
		}
	}
	r := rng.Float64() * mass
	var acc float64
	for _, i := range idx[:n] {
		acc += math.Exp(float64(lp[i]))
		if r < acc {
			return i
		}
	}
	return idx[0]
}

// topK returns the k largest entries of lp, best first.
func topK(lp []float32, k int) []TokenLogprob {
	out := make([]TokenLogprob, 0, k+1)
	for i, v := range lp {
		if len(out) == k && v <= out[k-1].Logprob {
			continue
		}
		j := len(out)
		out = append(out, TokenLogprob{})
		for j > 0 && out[j-1].Logprob < v {
			out[j] = out[j-1]
			j--
		}
		out[j] = TokenLogprob{ID: i, Logprob: v}
		if len(out) > k {
			out = out[:k]
		}
	}
	return out
}

// inputError is a request the sampler rejects; servers answer it with 400.
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

func inputErrorf(format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...)}
}

func idsKey(ids []int) string {
	b := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		b = append(b, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
	}
	return string(b)
}
