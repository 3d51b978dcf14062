package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"go.temporal.io/sdk/temporal"
	"golang.org/x/sync/errgroup"

	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
)

// Suites are answered greedily, or at a prompt's temperature with a fixed
// seed, so a version's result on a prompt is a fact about that version
// (and two versions sampling a prompt draw the same random numbers, which
// keeps their paired comparison tight): each subject (a version under a
// set of artefacts) answers each prompt once, and every later comparison
// reads the stored result. The release gates and the watchdog share this
// code.

// suiteSet is one suite of a deployment, ready to answer.
type suiteSet struct {
	name    string
	prompts []store.EvalPrompt
	msgs    [][]inference.Message
	tools   [][]inference.Tool
	// key names the suite's current prompts (store.SuiteKey).
	key string
}

// defaultSafetyID marks the built-in safety prompts, which have no rows
// and so no stored results.
const defaultSafetyID = 0

func (r *Release) loadSuite(ctx context.Context, deployment, suite string) (*suiteSet, error) {
	rows, err := store.EvalSuite(ctx, r.DB, deployment, suite)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 && suite == store.SuiteSafety {
		for _, p := range evolution.DefaultSafetyPrompts {
			msgs, _ := json.Marshal([]inference.Message{{Role: inference.RoleUser, Content: p}})
			rows = append(rows, store.EvalPrompt{ID: defaultSafetyID, Messages: msgs, Expect: "refuse", Match: store.MatchRefusal})
		}
	}
	s := &suiteSet{name: suite, prompts: rows, key: store.SuiteKey(rows)}
	for _, p := range rows {
		msgs, tools, err := p.Conversation()
		if err != nil {
			return nil, temporal.NewNonRetryableApplicationError(fmt.Sprintf("eval prompt %d: %v", p.ID, err), "BadData", err)
		}
		s.msgs = append(s.msgs, msgs)
		s.tools = append(s.tools, tools)
	}
	return s, nil
}

// passes judges one answer by the prompt's rule: the text rules read its
// content (as stored, and as an expected answer can be written), tool_call
// its tool calls.
func passes(rule, expect string, answer inference.Message) bool {
	text := store.ValidText(answer.Content)
	contains := expect != "" && strings.Contains(strings.ToLower(text), strings.ToLower(expect))
	switch rule {
	case store.MatchExact:
		return strings.TrimSpace(text) == strings.TrimSpace(expect)
	case store.MatchRefusal:
		// A refusal in words, or the deployment's own refusal marker.
		return evolution.IsRefusal(text) || (expect != "refuse" && contains)
	case store.MatchToolCall:
		e, err := store.ParseToolCallExpect(expect)
		return err == nil && e.Matches(answer.ToolCalls)
	default:
		return contains
	}
}

// answerText is an answer as a result stores it and reviewers read it:
// its content, then each tool call as compact {"name", "arguments"} JSON
// on a line of its own (arguments as a string when they are not JSON).
func answerText(m inference.Message) string {
	parts := []string{}
	if m.Content != "" {
		parts = append(parts, m.Content)
	}
	for _, c := range m.ToolCalls {
		var args any = c.Arguments
		var compact bytes.Buffer
		if json.Compact(&compact, []byte(c.Arguments)) == nil {
			args = json.RawMessage(compact.Bytes())
		}
		line, err := json.Marshal(struct {
			Name      string `json:"name"`
			Arguments any    `json:"arguments"`
		}{c.Name, args})
		if err != nil {
			line = []byte(c.Name)
		}
		parts = append(parts, string(line))
	}
	return store.ValidText(strings.Join(parts, "\n"))
}

// measure returns v's result on every prompt of s (1 passed, 0 failed),
// answering only the prompts v has no stored result for, or all of them
// when fresh. A side the backend refuses (a 4xx) fails that prompt.
func (r *Release) measure(ctx context.Context, deployment string, v variant, s *suiteSet, fresh bool) ([]float64, error) {
	known := map[int64]bool{}
	if !fresh {
		var err error
		if known, err = store.SuiteResults(ctx, r.DB, v.key, s.prompts); err != nil {
			return nil, err
		}
	}
	out := make([]float64, len(s.prompts))
	answered := make([]*store.SuiteResult, len(s.prompts))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.suiteConcurrency())
	for i, p := range s.prompts {
		if ok, have := known[p.ID]; have && p.ID != defaultSafetyID {
			out[i] = b2f(ok)
			continue
		}
		g.Go(func() error {
			var answer inference.Message
			resp, err := r.answer(gctx, deployment, v, s.msgs[i], s.tools[i], p.MaxTokens, p.Temperature)
			switch {
			case err == nil:
				answer = resp.Message
			case !rejected(err):
				return fmt.Errorf("%s suite on %s: %w", s.name, v.key, err)
			}
			ok := err == nil && passes(p.Rule(s.name), p.Expect, answer)
			out[i] = b2f(ok)
			answered[i] = &store.SuiteResult{PromptID: p.ID, Passed: ok, Answer: answerText(answer)}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var record []store.SuiteResult
	for i, a := range answered {
		if a != nil && s.prompts[i].ID != defaultSafetyID {
			record = append(record, *a)
		}
	}
	if err := store.RecordSuiteResults(ctx, r.DB, v.key, record); err != nil {
		return nil, err
	}
	return out, nil
}

func (r *Release) suiteConcurrency() int {
	if r.SuiteConcurrency <= 0 {
		return 4
	}
	return r.SuiteConcurrency
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// anchorOf finds the deployment's anchor under the baseline's artefacts
// and returns it as a variant with the regression and safety suites, or ok
// false when there is none yet (no held-out suite, or no promoted version
// measured on it). The baseline is measured on both suites first (stored
// results are reused), so a suite registered since it was promoted makes
// it the first anchor.
func (r *Release) anchorOf(ctx context.Context, deployment string, base variant, maxSafetyDrop float64) (a variant, reg, safety *suiteSet, ok bool, err error) {
	if reg, err = r.loadSuite(ctx, deployment, store.SuiteRegression); err != nil || len(reg.prompts) == 0 {
		return a, reg, safety, false, err
	}
	if safety, err = r.loadSuite(ctx, deployment, store.SuiteSafety); err != nil {
		return a, reg, safety, false, err
	}
	for _, s := range []*suiteSet{reg, safety} {
		if len(s.prompts) == 0 || s.prompts[0].ID == defaultSafetyID {
			continue // the built-in safety prompts store no results
		}
		if _, err := r.measure(ctx, deployment, base, s, false); err != nil {
			return a, reg, safety, false, err
		}
	}
	v, err := store.SuiteAnchor(ctx, r.DB, deployment, base.suffix, reg.prompts, safety.prompts, maxSafetyDrop)
	if err != nil || v == "" {
		return a, reg, safety, false, err
	}
	a = base
	a.version, a.key = v, v+base.suffix
	return a, reg, safety, true, nil
}

// suite runs the regression suite (held-out prompts, judged against the
// anchor and the baseline) or the safety suite (refusals, which may not
// drop below either).
func (r *Release) suite(ctx context.Context, in flow.GateInput) (flow.GateResult, error) {
	if why, err := r.unevaluable(ctx, in); why != "" || err != nil {
		return notEvaluated(in, why), err
	}
	s, err := r.loadSuite(ctx, in.Deployment, in.Gate)
	if err != nil {
		return flow.GateResult{}, err
	}
	if len(s.prompts) == 0 {
		return notEvaluated(in, fmt.Sprintf("the %s suite of this deployment is empty: register held-out prompts with "+
			"`flywheel suite set --deployment %s --suite %s` or PUT /admin/v1/deployments/%s/suites/%s", in.Gate, in.Deployment, in.Gate, in.Deployment, in.Gate)), nil
	}
	cand, base, err := r.variants(ctx, in)
	if err != nil {
		return flow.GateResult{}, err
	}
	p := in.Policy
	anchor, reg, _, ok, err := r.anchorOf(ctx, in.Deployment, base, p.MaxSafetyDrop)
	if err != nil {
		return flow.GateResult{}, err
	}
	bs, err := r.measure(ctx, in.Deployment, base, s, false)
	if err != nil {
		return flow.GateResult{}, err
	}
	cs, err := r.measure(ctx, in.Deployment, cand, s, false)
	if err != nil {
		return flow.GateResult{}, err
	}
	judged := evolution.SuiteInput{Candidate: cs, Baseline: bs, Budget: p.AnchorBudget, Alpha: p.Alpha}
	res := flow.GateResult{SuiteKey: s.key}
	if ok {
		if judged.Anchor, err = r.measure(ctx, in.Deployment, anchor, s, false); err != nil {
			return flow.GateResult{}, err
		}
		res.Anchor = anchor.version
	}
	var v evolution.SuiteVerdict
	if in.Gate == flow.GateSafety {
		judged.MaxDrop = p.MaxSafetyDrop
		v = evolution.JudgeSafety(judged)
	} else {
		looks, passed := 0, 0
		if ok {
			if looks, passed, err = store.AnchorLooks(ctx, r.DB, in.Deployment, anchor.version, reg.key, in.ReleaseID); err != nil {
				return flow.GateResult{}, err
			}
		}
		judged.MaxDrop, judged.Look, judged.Passes = p.MaxRewardDrop, looks+1, passed
		v = evolution.JudgeRegression(judged)
	}
	res.Passed, res.Regressed, res.Reason, res.Metrics = v.Passed, v.Regressed, v.Reason, v.Metrics
	return res, nil
}
