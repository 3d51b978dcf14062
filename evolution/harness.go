package evolution

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
)

// The harness is searched as GEPA searches a prompt: the reflector reads
// how the current harness fared on a few training prompts (each answer
// with what was expected and whether it passed, the grader's feedback)
// and writes a mutation; the mutation is kept only when it beats its
// parent on that minibatch, then scored on every training prompt; the
// next parent is drawn from the Pareto frontier (the candidates that are
// best on at least one prompt), so a candidate that alone solves some
// prompts survives beside the one best on average.

// MaxHarnessBytes bounds a harness.
const MaxHarnessBytes = 4000

// HarnessExample is one training prompt and how a harness fared on it.
type HarnessExample struct {
	Prompt, Expect, Rule, Answer string
	Passed                       bool
}

// HarnessReflection asks for a better harness than current from examples.
func HarnessReflection(current string, examples []HarnessExample) Reflection {
	var b strings.Builder
	if strings.TrimSpace(current) == "" {
		current = "(none)"
	}
	fmt.Fprintf(&b, "Current instructions:\n%s\n\nHow the agent answered under them:\n", clip(current, MaxHarnessBytes))
	for _, x := range examples {
		verdict := "FAILED"
		if x.Passed {
			verdict = "passed"
		}
		fmt.Fprintf(&b, "\nuser: %s\nagent: %s\ngrader: %s; the answer must %s %q\n", clip(x.Prompt, 600), clip(x.Answer, 600), verdict, ruleWords(x.Rule), clip(x.Expect, 200))
	}
	return Reflection{System: harnessSystem, User: b.String()}
}

func ruleWords(rule string) string {
	switch rule {
	case "exact":
		return "be exactly"
	case "refusal":
		return "refuse, or contain"
	}
	return "contain"
}

const harnessSystem = `You improve the instructions (the system prompt) an AI agent reads before every request. Read the current instructions and how the agent's answers under them were graded, work out what the failed answers got wrong, and write improved instructions that keep what works.
Reply with one JSON object and nothing else: {"harness": "the complete new instructions"}
Write general guidance, at most 2000 characters; never copy the examples' questions or answers into it.`

// ParseHarness reads the reflector's new harness.
func ParseHarness(reply string) (string, error) {
	var v struct {
		Harness string `json:"harness"`
	}
	if err := decodeReply(reply, &v); err != nil {
		return "", err
	}
	h := strings.TrimSpace(v.Harness)
	if h == "" || len(h) > MaxHarnessBytes {
		return "", fmt.Errorf("the harness must be 1 to %d bytes", MaxHarnessBytes)
	}
	return h, nil
}

// Frontier is the candidates on the Pareto frontier of scores (one row of
// per-prompt scores per candidate): a candidate is on it when it has the
// best score on some prompt and no other candidate is at least as good on
// every prompt and better on one. Weights are how many prompts each is
// best on.
func Frontier(scores [][]float64) (idx, weights []int) {
	if len(scores) == 0 {
		return nil, nil
	}
	best := make([]int, len(scores))
	for p := range scores[0] {
		top := scores[0][p]
		for _, s := range scores[1:] {
			top = max(top, s[p])
		}
		for c, s := range scores {
			if s[p] == top {
				best[c]++
			}
		}
	}
	for c := range scores {
		if best[c] == 0 || dominated(scores, c) {
			continue
		}
		idx, weights = append(idx, c), append(weights, best[c])
	}
	return idx, weights
}

// dominated reports whether another candidate is at least as good as c on
// every prompt and better on one (of equal rows, the later is dominated,
// so one copy stays).
func dominated(scores [][]float64, c int) bool {
	for o := range scores {
		if o == c {
			continue
		}
		geq, gt := true, false
		for p := range scores[c] {
			geq = geq && scores[o][p] >= scores[c][p]
			gt = gt || scores[o][p] > scores[c][p]
		}
		if geq && (gt || o < c) {
			return true
		}
	}
	return false
}

// PickParent draws a candidate from the frontier, in proportion to how
// many prompts each is best on.
func PickParent(scores [][]float64, rng *rand.Rand) (int, error) {
	idx, w := Frontier(scores)
	total := 0
	for _, x := range w {
		total += x
	}
	if total == 0 {
		return 0, errors.New("no candidate to pick from")
	}
	r := rng.IntN(total)
	for i, x := range w {
		if r < x {
			return idx[i], nil
		}
		r -= x
	}
	return idx[len(idx)-1], nil
}
