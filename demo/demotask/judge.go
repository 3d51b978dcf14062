package demotask

import (
	"context"

	"github.com/flywheel-ai/flywheel/trainer"
)

// PromptSet is a fixed set of prompts rendered once, so a policy can be
// judged on it again and again (every gate of the rehearsal) without
// rendering the prompts each time. A policy answers greedily, in process,
// in one batch; a tools task's prompts open a whole session each.
type PromptSet struct {
	prompts []Prompt
	ids     [][]int
	maxTok  int
	tools   bool
}

// NewPromptSet renders ps, each asked in one call.
func NewPromptSet(ps []Prompt) (*PromptSet, error) { return NewTaskPromptSet(DefaultTask, ps) }

// NewTaskPromptSet renders ps as task's agents ask them: a tools session
// with the tools on offer, or one call.
func NewTaskPromptSet(task Task, ps []Prompt) (*PromptSet, error) {
	s := &PromptSet{prompts: ps, maxTok: 2, tools: task.Kind == KindTools}
	if s.tools {
		return s, nil // a session renders its calls as it goes
	}
	for _, p := range ps {
		ids, err := PromptIDs(p.Text)
		if err != nil {
			return nil, err
		}
		s.ids = append(s.ids, ids)
		s.maxTok = max(s.maxTok, len(p.Want)+2)
	}
	return s, nil
}

// Success is m's greedy exact-match success on the set.
func (s *PromptSet) Success(ctx context.Context, m *trainer.Model) (float64, error) {
	each, err := s.Each(ctx, m)
	if err != nil {
		return 0, err
	}
	ok := 0
	for _, e := range each {
		if e {
			ok++
		}
	}
	return float64(ok) / float64(len(s.prompts)), nil
}

// Each is m's greedy exact-match result on every prompt of the set.
func (s *PromptSet) Each(ctx context.Context, m *trainer.Model) ([]bool, error) {
	answers, err := s.Answers(ctx, m)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(answers))
	for i, a := range answers {
		out[i] = Verify(s.prompts[i].Want, a).Success
	}
	return out, nil
}

// Answers is m's greedy answer to every prompt of the set.
func (s *PromptSet) Answers(ctx context.Context, m *trainer.Model) ([]string, error) {
	if s.tools {
		return ToolsSessions(ctx, m, s.prompts, 0, nil)
	}
	zero := 0.0
	gens, err := m.Generate(ctx, s.ids, trainer.SampleOptions{Temperature: &zero, MaxTokens: s.maxTok}, nil, nil)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(gens))
	for i, g := range gens {
		out[i] = AnswerText(g.IDs)
	}
	return out, nil
}

// GreedyAnswers is m's greedy answer to each of prompts, answered in
// process in one batch.
func GreedyAnswers(ctx context.Context, m *trainer.Model, prompts []Prompt) ([]string, error) {
	s, err := NewPromptSet(prompts)
	if err != nil {
		return nil, err
	}
	return s.Answers(ctx, m)
}

// GreedySuccess is m's greedy exact-match result on each of prompts, the
// measure the demo reports, answered in process in one batch (tests use it
// to judge stored versions on prompts the gates never saw).
func GreedySuccess(ctx context.Context, m *trainer.Model, prompts []Prompt) ([]bool, error) {
	s, err := NewPromptSet(prompts)
	if err != nil {
		return nil, err
	}
	return s.Each(ctx, m)
}

// AnswerText is the answer that completion tokens spell, the end marker
// dropped: the inverse of AnswerIDs.
func AnswerText(ids []int) string {
	if n := len(ids); n > 0 && ids[n-1] == trainer.TokImEnd {
		ids = ids[:n-1]
	}
	return trainer.Tokenizer{}.Decode(ids)
}

// Judge is m's greedy exact-match result on each of prompts of task, as
// the task's agents ask them (a tools session with the tools on offer,
// or one call), in process.
func Judge(ctx context.Context, m *trainer.Model, task Task, prompts []Prompt) ([]bool, error) {
	s, err := NewTaskPromptSet(task, prompts)
	if err != nil {
		return nil, err
	}
	return s.Each(ctx, m)
}
