package activities

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
)

// The harness search's bounds: how many training prompts score a
// candidate (the Pareto set), how many a reflection reads and a child must
// beat its parent on, and how many reflections one decision asks for.
const (
	harnessParetoPrompts = 32
	harnessMinibatch     = 4
	harnessReflections   = 4
)

// harnessCandidate is a harness and its score on each training prompt,
// with the answers it gave.
type harnessCandidate struct {
	text    string
	scores  []float64
	answers []string
}

// proposeHarness searches the harness GEPA's way on the deployment's
// train suite (never the gates' suites, never a tenant's text): from the
// serving harness, each reflection reads a minibatch of graded answers of
// a parent drawn from the Pareto frontier and writes a child; a child that
// beats its parent on that minibatch is scored on every training prompt.
// The best candidate on average is proposed when it beats the serving
// harness there; the release gates then judge it on the held-out suites
// and live traffic.
func (e *Evolution) proposeHarness(ctx context.Context, in flow.ProposeArtefactInput, cur artefact.Set, b *reflectionSpend) (*artefact.Harness, string, error) {
	prompts, err := store.EvalSuite(ctx, e.DB, in.Deployment, store.SuiteTrain)
	if err != nil {
		return nil, "", err
	}
	if len(prompts) == 0 {
		return nil, "the deployment has no train suite for the harness search to look at (flywheel suite set --suite train)", nil
	}
	if len(prompts) > harnessParetoPrompts {
		prompts = prompts[:harnessParetoPrompts]
	}
	msgs := make([][]inference.Message, len(prompts))
	tools := make([][]inference.Tool, len(prompts))
	for i, p := range prompts {
		var err error
		if msgs[i], tools[i], err = p.Conversation(); err != nil {
			return nil, fmt.Sprintf("train prompt %d does not read: %v", p.ID, err), nil
		}
	}
	if !e.answers(ctx, in.Deployment) {
		return nil, "no engine on this worker serves the deployment to answer the train suite", nil
	}
	weights, err := store.ServingOf(ctx, e.DB, in.Deployment, artefact.LayerWeights)
	if err != nil {
		return nil, "", err
	}
	judge := &Release{DB: e.DB, Backend: e.Backend}
	score := func(h string, only []int) (*harnessCandidate, error) {
		set := cur
		set.Harness = &artefact.Harness{System: h}
		v := variant{version: weights, artefacts: set}
		c := &harnessCandidate{text: h, scores: make([]float64, len(prompts)), answers: make([]string, len(prompts))}
		for _, i := range only {
			resp, err := judge.answer(ctx, in.Deployment, v, msgs[i], tools[i], prompts[i].MaxTokens, prompts[i].Temperature)
			switch {
			case err == nil:
				c.answers[i] = answerText(resp.Message)
				c.scores[i] = b2f(passes(prompts[i].Rule(store.SuiteTrain), prompts[i].Expect, resp.Message))
			case !rejected(err):
				return nil, fmt.Errorf("train suite under a harness candidate: %w", err)
			}
		}
		return c, nil
	}
	all := make([]int, len(prompts))
	for i := range all {
		all[i] = i
	}
	serving := ""
	if cur.Harness != nil {
		serving = cur.Harness.System
	}
	root, err := score(serving, all)
	if err != nil {
		return nil, "", err
	}
	pool := []*harnessCandidate{root}
	h := fnv.New64a()
	h.Write([]byte(in.Key))
	rng := rand.New(rand.NewPCG(h.Sum64(), 1))
	asked, kept := 0, 0
	var stop string
	for k := 0; k < harnessReflections; k++ {
		rows := make([][]float64, len(pool))
		for i, c := range pool {
			rows[i] = c.scores
		}
		pi, err := evolution.PickParent(rows, rng)
		if err != nil {
			return nil, "", err
		}
		parent := pool[pi]
		batch := make([]int, 0, harnessMinibatch)
		for j := 0; j < min(harnessMinibatch, len(prompts)); j++ {
			batch = append(batch, (k*harnessMinibatch+j)%len(prompts))
		}
		var ex []evolution.HarnessExample
		for _, i := range batch {
			ex = append(ex, evolution.HarnessExample{Prompt: e.redact(lastUser(msgs[i])), Expect: prompts[i].Expect,
				Rule: prompts[i].Rule(store.SuiteTrain), Answer: e.redact(parent.answers[i]), Passed: parent.scores[i] > 0})
		}
		r, err := e.reflect(ctx, b, ReflectQuery{Deployment: in.Deployment, Layer: artefact.LayerHarness,
			Reflection: evolution.HarnessReflection(parent.text, ex)})
		if errors.Is(err, store.ErrBudget) {
			stop = "; stopped: " + err.Error()
			break
		}
		if err != nil {
			return nil, "", err
		}
		asked++
		text, err := evolution.ParseHarness(r.Text)
		if err != nil || text == parent.text {
			continue
		}
		child, err := score(e.redact(text), batch)
		if err != nil {
			return nil, "", err
		}
		if sum(child.scores, batch) <= sum(parent.scores, batch) {
			continue
		}
		rest := make([]int, 0, len(prompts))
		for _, i := range all {
			if !slices.Contains(batch, i) {
				rest = append(rest, i)
			}
		}
		full, err := score(child.text, rest)
		if err != nil {
			return nil, "", err
		}
		for _, i := range batch {
			full.scores[i], full.answers[i] = child.scores[i], child.answers[i]
		}
		pool, kept = append(pool, full), kept+1
	}
	best := root
	for _, c := range pool[1:] {
		if evolution.Mean(c.scores) > evolution.Mean(best.scores) {
			best = c
		}
	}
	note := fmt.Sprintf("harness search: %d reflections, %d children kept; the best scores %.3f against the serving harness's %.3f on %d train prompts%s",
		asked, kept, evolution.Mean(best.scores), evolution.Mean(root.scores), len(prompts), stop)
	if best == root {
		return nil, note, nil
	}
	return &artefact.Harness{System: best.text}, note, nil
}

func lastUser(msgs []inference.Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == inference.RoleUser {
			return msgs[i].Content
		}
	}
	return ""
}

func sum(xs []float64, idx []int) float64 {
	s := 0.0
	for _, i := range idx {
		s += xs[i]
	}
	return s
}
