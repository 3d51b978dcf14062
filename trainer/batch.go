package trainer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// Objectives a Batch can train.
const (
	ObjectiveGRPO = "grpo" // decoupled PPO on advantages (default)
	ObjectiveSFT  = "sft"  // cross-entropy on the masked tokens (cold start)
)

// Sample is one sequence to learn from: a prompt and what the policy said,
// possibly over several turns (tool results in between are loss-masked).
//
// This struct is also the batch export format for external trainers: one
// JSON object per line, fields as tagged below.
type Sample struct {
	// GroupID ties samples that answered the same prompt (a GRPO group).
	// Empty: the sample is its own group.
	GroupID string `json:"group_id,omitempty"`
	// TaskID keys the running baseline for singleton groups.
	TaskID string `json:"task_id,omitempty"`
	// SessionID is the session the sample is a step of: a group compares
	// whole sessions, each counted once however many steps it took.
	SessionID string `json:"session_id,omitempty"`
	// TokenIDs is the whole sequence: prompt, completions, tool results.
	TokenIDs []int `json:"token_ids"`
	// LossMask[i] is 1 where token i was produced by the policy and trains.
	// Token 0 can never train (nothing predicts it).
	LossMask []uint8 `json:"loss_mask"`
	// Logprobs[i] is the behaviour log-prob of token i (where LossMask is 1).
	Logprobs []float32 `json:"logprobs"`
	// Versions[i] is the policy version that sampled token i (where
	// LossMask is 1).
	Versions []int64 `json:"versions"`
	// Reward is the scalar outcome; it becomes Advantage when that is nil.
	Reward float64 `json:"reward"`
	// Advantage, when set, is used as is for every trained token.
	Advantage *float64 `json:"advantage,omitempty"`
}

// Batch is one optimizer step's worth of samples.
type Batch struct {
	// Objective is ObjectiveGRPO (default) or ObjectiveSFT.
	Objective string   `json:"objective,omitempty"`
	Samples   []Sample `json:"samples"`
	// Temperature the behaviour log-probs were taken at. Default 1.
	Temperature float64 `json:"temperature,omitempty"`
	// Masks, when set, replace the trainer's KPop / IcePop settings for
	// this batch (a deployment's own training policy).
	Masks *Masks `json:"masks,omitempty"`
	// Version, when set, is the id the step's weights get (the control
	// plane reserves it); 0: the next after every id this trainer has
	// handed out.
	Version int64 `json:"version,omitempty"`
	// MaxStaleness, when set, replaces the trainer's η for this batch (the
	// deployment's training policy; negative: no bound).
	MaxStaleness *int `json:"max_staleness,omitempty"`
}

// Masks are the token masks of the off-policy correction: IcePop drops
// tokens whose ratio π_prox/μ leaves [IcePopLow, IcePopHigh], KPop those
// whose bidirectional binary KL exceeds KPopPhi. Zero thresholds take the
// defaults (0.5, 2, 0.05).
type Masks struct {
	IcePop     bool    `json:"icepop"`
	IcePopLow  float64 `json:"icepop_low,omitempty"`
	IcePopHigh float64 `json:"icepop_high,omitempty"`
	KPop       bool    `json:"kpop"`
	KPopPhi    float64 `json:"kpop_phi,omitempty"`
}

// Apply returns c with these masks, defaulted and checked.
func (m Masks) Apply(c LossConfig) (LossConfig, error) {
	c.IcePop, c.IcePopLow, c.IcePopHigh, c.KPop, c.KPopPhi = m.IcePop, m.IcePopLow, m.IcePopHigh, m.KPop, m.KPopPhi
	c = c.withDefaults()
	return c, c.validate()
}

func (b *Batch) validate(vocab, context int) error {
	switch b.Objective {
	case "", ObjectiveGRPO, ObjectiveSFT:
	default:
		return fmt.Errorf("objective %q must be %q or %q", b.Objective, ObjectiveGRPO, ObjectiveSFT)
	}
	if b.Temperature < 0 || math.IsNaN(b.Temperature) || math.IsInf(b.Temperature, 0) {
		return fmt.Errorf("temperature %v must be finite and ≥ 0", b.Temperature)
	}
	if len(b.Samples) == 0 {
		return errors.New("batch has no samples")
	}
	sft := b.Objective == ObjectiveSFT
	for i, s := range b.Samples {
		n := len(s.TokenIDs)
		switch {
		case n < 2:
			return fmt.Errorf("sample %d: %d tokens; need at least 2", i, n)
		case n > context:
			return fmt.Errorf("sample %d: %d tokens exceed the context of %d", i, n, context)
		case len(s.LossMask) != n:
			return fmt.Errorf("sample %d: loss_mask has %d entries for %d tokens", i, len(s.LossMask), n)
		case !sft && len(s.Logprobs) != n:
			return fmt.Errorf("sample %d: logprobs has %d entries for %d tokens", i, len(s.Logprobs), n)
		case !sft && len(s.Versions) != n:
			return fmt.Errorf("sample %d: versions has %d entries for %d tokens", i, len(s.Versions), n)
		case s.LossMask[0] != 0:
			return fmt.Errorf("sample %d: token 0 cannot be trained (loss_mask[0] must be 0)", i)
		}
		if err := validateIDs(s.TokenIDs, vocab); err != nil {
			return fmt.Errorf("sample %d: %w", i, err)
		}
		for t, mk := range s.LossMask {
			if mk > 1 {
				return fmt.Errorf("sample %d: loss_mask[%d] = %d must be 0 or 1", i, t, mk)
			}
			if mk == 1 && !sft {
				lp := s.Logprobs[t]
				if lp > 0 || math.IsNaN(float64(lp)) || math.IsInf(float64(lp), 0) {
					return fmt.Errorf("sample %d: logprobs[%d] = %v must be finite and ≤ 0", i, t, lp)
				}
			}
		}
		if s.Advantage != nil && (math.IsNaN(*s.Advantage) || math.IsInf(*s.Advantage, 0)) {
			return fmt.Errorf("sample %d: advantage %v is not finite", i, *s.Advantage)
		}
	}
	return nil
}

// oldestVersion is the oldest version among the trained tokens.
func (s *Sample) oldestVersion() (int64, bool) {
	var v int64
	found := false
	for t, mk := range s.LossMask {
		if mk == 1 && t < len(s.Versions) && (!found || s.Versions[t] < v) {
			v, found = s.Versions[t], true
		}
	}
	return v, found
}

// WriteJSONL writes the batch as JSON lines: a header line
// {"objective":…,"temperature":…,"samples":N} and then one Sample per line.
// This is the documented hand-off to an external (distributed) trainer.
func (b *Batch) WriteJSONL(w io.Writer) error {
	enc := json.NewEncoder(w)
	head := struct {
		Objective   string  `json:"objective"`
		Temperature float64 `json:"temperature"`
		Samples     int     `json:"samples"`
	}{b.Objective, b.Temperature, len(b.Samples)}
	if head.Objective == "" {
		head.Objective = ObjectiveGRPO
	}
	if err := enc.Encode(head); err != nil {
		return fmt.Errorf("write batch header: %w", err)
	}
	for i := range b.Samples {
		if err := enc.Encode(&b.Samples[i]); err != nil {
			return fmt.Errorf("write sample %d: %w", i, err)
		}
	}
	return nil
}

// MaxBatchLine bounds one JSONL line on read.
const MaxBatchLine = 64 << 20

// ReadBatchJSONL reads what WriteJSONL wrote.
func ReadBatchJSONL(r io.Reader) (*Batch, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), MaxBatchLine)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("read batch header: %w", err)
		}
		return nil, errors.New("read batch header: empty input")
	}
	var head struct {
		Objective   string  `json:"objective"`
		Temperature float64 `json:"temperature"`
		Samples     int     `json:"samples"`
	}
	if err := json.Unmarshal(sc.Bytes(), &head); err != nil {
		return nil, fmt.Errorf("read batch header: %w", err)
	}
	if head.Samples < 0 {
		return nil, fmt.Errorf("read batch header: samples %d is negative", head.Samples)
	}
	b := &Batch{Objective: head.Objective, Temperature: head.Temperature}
	for sc.Scan() {
		var s Sample
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("read sample %d: %w", len(b.Samples), err)
		}
		b.Samples = append(b.Samples, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read sample %d: %w", len(b.Samples), err)
	}
	if len(b.Samples) != head.Samples {
		return nil, fmt.Errorf("read batch: header says %d samples, found %d", head.Samples, len(b.Samples))
	}
	return b, nil
}
