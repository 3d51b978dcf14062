package rehearsal

import (
	"context"
	"fmt"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/trainer"
)

// scores is a version's results on what the gate judges.
type scores struct {
	// gate is its greedy success on the gate's held-out prompts, each 1
	// for a prompt it answered right and 0 for one it did not.
	gate     float64
	gateEach []float64
	// safety is 1 for each prompt of the safety suite it refused, as it
	// must, and 0 for each it did not.
	safety []float64
}

func (s scores) safetyRate() float64 { return evolution.Mean(s.safety) }

// score measures m as the gate judges it.
func (r *run) score(ctx context.Context, m *trainer.Model) (scores, error) {
	each, err := r.gateSet.Each(ctx, m)
	if err != nil {
		return scores{}, fmt.Errorf("gate: %w", err)
	}
	gateEach := make([]float64, len(each))
	for i, ok := range each {
		if ok {
			gateEach[i] = 1
		}
	}
	gate := evolution.Mean(gateEach)
	refused, err := r.safeSet.Each(ctx, m)
	if err != nil {
		return scores{}, fmt.Errorf("gate: %w", err)
	}
	s := scores{gate: gate, gateEach: gateEach, safety: make([]float64, len(refused))}
	for i, ok := range refused {
		if ok {
			s.safety[i] = 1
		}
	}
	return s, nil
}

// decide is the gate. Safety is judged by the release's safety gate
// (evolution.JudgeSafety: the suite is answered greedily, so its rate is
// exact): a regression beyond safetyTol rolls the candidate back, and any
// smaller drop holds it (not released, training goes on), so the serving
// version's safety never goes down. Gate success more than tol below
// against holds it too; else it is promoted.
//
// The success rule is not evolution.Verdict, which passes a candidate
// within 1e-12 of the allowed drop: with rates of k/100, a candidate
// exactly tol below is held here when the subtraction rounds up (0.15 vs
// 0.17) and passed there, so switching would change the demo's runs (step
// 30 of the default offline demo, seed 1, is such a tie).
func decide(cand, serving scores, against, tol, safetyTol float64) string {
	safety := evolution.SuiteInput{Candidate: cand.safety, Baseline: serving.safety, MaxDrop: safetyTol}
	if evolution.JudgeSafety(safety).Regressed {
		return DecisionRollback
	}
	safety.MaxDrop = 0
	if evolution.JudgeSafety(safety).Passed && cand.gate >= against-tol {
		return DecisionPromote
	}
	return DecisionHold
}

// gate judges the trainer's newest version against the serving one (or,
// with Anchor, the best promoted one's gate success), acts on the
// decision and records the point.
func (r *run) gate(ctx context.Context, step int) error {
	cand := *r.cur
	cs, err := r.score(ctx, cand.model)
	if err != nil {
		return err
	}
	p := Point{Step: step, Candidate: cand.version, CandidateSuccess: cs.gate, CandidateSafety: cs.safetyRate()}
	against := r.servingScores.gate
	if r.cfg.Anchor {
		against = r.anchorGate
	}
	p.Decision = decide(cs, r.servingScores, against, r.cfg.GateTolerance, r.cfg.SafetyTolerance)
	if r.cfg.ReleaseGate && p.Decision != DecisionRollback {
		p.Decision = r.judgeAsReleased(cs)
	}
	switch p.Decision {
	case DecisionRollback:
		r.res.RolledBack++
		r.ahead = 0
		// Versions only move forward: the restarted trainer continues
		// numbering after the discarded candidate.
		*r.cur = latest{model: r.serving.model, version: cand.version}
		if err := r.tr.restart(ctx, r.servingState, cand.version, r.serving.version, true); err != nil {
			return fmt.Errorf("rollback: %w", err)
		}
	case DecisionPromote:
		if err := r.promote(ctx, cand, cs); err != nil {
			return err
		}
	default:
		r.res.Held++
		if r.ahead++; r.cfg.MaxAhead > 0 && r.ahead >= r.cfg.MaxAhead {
			if err := r.tr.restart(ctx, r.servingState, r.serving.version, r.serving.version, false); err != nil {
				return fmt.Errorf("reset: %w", err)
			}
			*r.cur = r.serving
			p.Decision, r.ahead = DecisionReset, 0
		}
	}
	p.Version, p.Success, p.Safety = r.serving.version, r.servingSuccess, r.servingScores.safetyRate()
	r.emit(p)
	return nil
}

// promote makes cand the serving version.
func (r *run) promote(ctx context.Context, cand latest, cs scores) error {
	r.res.Promoted++
	r.ahead = 0
	if r.serve != nil {
		if err := r.serve.Publish(cand.model, cand.version); err != nil {
			return fmt.Errorf("promote version %d: %w", cand.version, err)
		}
	}
	// The line's current weights are the candidate's: it was the newest.
	state, err := r.tr.save(ctx)
	if err != nil {
		return fmt.Errorf("promote version %d: %w", cand.version, err)
	}
	r.serving, r.servingState, r.servingScores = cand, state, cs
	if cs.gate > r.anchorGate {
		r.anchorScores, r.looks, r.passes = cs, 0, 0
	}
	r.anchorGate = max(r.anchorGate, cs.gate)
	if r.servingSuccess, err = r.evalSet.Success(ctx, cand.model); err != nil {
		return fmt.Errorf("evaluate: %w", err)
	}
	return nil
}

// judgeAsReleased is the release's regression gate on the gate set, with
// the release policy's defaults, for a candidate the safety rule did not
// roll back.
func (r *run) judgeAsReleased(cs scores) string {
	p := deployment.ReleasePolicy{}.WithDefaults()
	r.looks++
	v := evolution.JudgeRegression(evolution.SuiteInput{Candidate: cs.gateEach, Baseline: r.servingScores.gateEach,
		Anchor: r.anchorScores.gateEach, Budget: p.AnchorBudget, MaxDrop: p.MaxRewardDrop, Alpha: p.Alpha, Look: r.looks, Passes: r.passes})
	safety := evolution.SuiteInput{Candidate: cs.safety, Baseline: r.servingScores.safety}
	switch {
	case v.Regressed:
		return DecisionRollback
	case v.Passed && evolution.JudgeSafety(safety).Passed:
		r.passes++
		return DecisionPromote
	}
	return DecisionHold
}
