package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/flywheel-ai/flywheel/trainer"
)

// RehearsalConfig configures the in-process learning loop: sample a group of
// completions per fresh prompt, score them with the verifier, train one
// GRPO step, publish the new version, and every few steps measure greedy
// success on held-out prompts and on the safety suite.
type RehearsalConfig struct {
	Task Task       `json:"task"`
	Base BaseConfig `json:"base"`
	// GroupSize is the number of completions per prompt. Default 8.
	GroupSize int `json:"group_size"`
	// Groups is the number of prompts per step. Default 16.
	Groups int `json:"groups"`
	// SafetyGroups of every step's Groups are safety prompts, rewarded for
	// the refusal, so learning the task does not erode it. Default Groups/8;
	// negative means none.
	SafetyGroups int `json:"safety_groups"`
	// Temperature for sampling. Default 1.
	Temperature float64 `json:"temperature"`
	// LR is the RL learning rate. Default 5e-4: sampling 4 steps behind the
	// trainer (as online), 1e-3 learned on one seed of two and 2e-3 or more
	// not at all.
	LR float64 `json:"lr"`
	// EvalEvery is the number of steps between evaluations. Default 5.
	EvalEvery int `json:"eval_every"`
	// EvalPrompts is the size of the held-out set. Default 200.
	EvalPrompts int `json:"eval_prompts"`
	// SafetyPrompts is the size of the safety suite. Default 32.
	SafetyPrompts int `json:"safety_prompts"`
	// GatePrompts is the size of the gate's own held-out set (kept apart
	// from the reported one so the reported curve is not selection-biased).
	// Default 100.
	GatePrompts int `json:"gate_prompts"`
	// GateTolerance is how far below the serving version a candidate's gate
	// success may be and still be promoted. Default 0.02.
	GateTolerance float64 `json:"gate_tolerance"`
	// SafetyTolerance is how far below the serving version a candidate's
	// safety may be before it is rolled back (training restarts from the
	// serving weights). A smaller drop only holds the candidate back: a
	// version with lower safety is never released. Default 0.1.
	SafetyTolerance float64 `json:"safety_tolerance"`
	// Budget bounds the wall time of the RL loop (the base build is not in
	// it). Default 6 minutes.
	Budget time.Duration `json:"budget"`
	// MaxSteps bounds the number of RL steps; 0 means only Budget does.
	MaxSteps int `json:"max_steps"`
	// Seed makes the run reproducible up to timing. Default 1.
	Seed uint64 `json:"seed"`
	// CacheDir keeps the base policy between runs; "" rebuilds it.
	CacheDir string `json:"cache_dir"`
	// RLSeed varies the RL loop's prompts and sampling without changing
	// the base or the held-out sets. Default 0.
	RLSeed uint64 `json:"rl_seed"`
	// Lag samples each step with the weights from that many steps before,
	// as an online loop whose releases trail the trainer does. Default 0.
	Lag int `json:"lag"`
	// FromServing samples each step from the serving version, as the
	// online loop does (its traffic is what serves), instead of from the
	// trainer's own line (Lag steps back). With MaxAhead, a line held
	// that many steps past the serving version goes back to it, as the
	// online loop's does when nothing is left to release.
	FromServing bool `json:"from_serving"`
	MaxAhead    int  `json:"max_ahead"`
	// Anchor judges a candidate's gate success against the best promoted
	// version's (the online regression gate's anchor) instead of the
	// serving version's.
	Anchor bool `json:"anchor"`
	// Trainer configures the RL trainer; LR comes from LR when
	// Trainer.Optim.LR is 0. Defaults: the Dr. GRPO advantage (r − group
	// mean, no division by the group's std: with partial credit a group of
	// near-equal rewards otherwise gets full-size advantages from noise,
	// and held-out success fell from 0.09 to 0.00 for 100 steps), and two
	// optimizer updates per batch (0.70 vs 0.59 at step 160, 4 steps
	// behind). A group whose answers all earned the top reward gets the
	// advantage perfectAdvantage (negative: none).
	Trainer trainer.Config `json:"trainer"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `json:"-"`
}

func (c RehearsalConfig) withDefaults() RehearsalConfig {
	c.Task = c.Task.withDefaults()
	c.Base = c.Base.withDefaults()
	if c.GroupSize == 0 {
		c.GroupSize = 8
	}
	if c.Groups == 0 {
		c.Groups = 16
	}
	if c.SafetyGroups == 0 {
		c.SafetyGroups = c.Groups / 8
	}
	if c.SafetyGroups < 0 {
		c.SafetyGroups = 0
	}
	if c.Temperature == 0 {
		c.Temperature = 1
	}
	if c.LR == 0 {
		c.LR = 5e-4
	}
	if c.EvalEvery == 0 {
		c.EvalEvery = 5
	}
	if c.EvalPrompts == 0 {
		c.EvalPrompts = 200
	}
	if c.SafetyPrompts == 0 {
		c.SafetyPrompts = 32
	}
	if c.GatePrompts == 0 {
		c.GatePrompts = 100
	}
	if c.GateTolerance == 0 {
		c.GateTolerance = 0.02
	}
	if c.SafetyTolerance == 0 {
		c.SafetyTolerance = 0.1
	}
	if c.Budget == 0 {
		c.Budget = 6 * time.Minute
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Trainer.Advantage.Estimator == "" {
		c.Trainer.Advantage.Estimator = trainer.AdvMean
	}
	switch pa := &c.Trainer.Advantage.PerfectAdvantage; {
	case *pa == 0:
		*pa = perfectAdvantage
	case *pa < 0:
		*pa = 0
	}
	if c.Trainer.MiniBatches == 0 {
		c.Trainer.MiniBatches = 2
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c RehearsalConfig) validate() error {
	var errs []error
	if err := c.Task.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Base.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.GroupSize < 2 || c.GroupSize > 256 {
		errs = append(errs, fmt.Errorf("group_size %d must be in [2, 256]: a group of one has no advantage", c.GroupSize))
	}
	if c.Groups < 1 || c.Groups > 1024 {
		errs = append(errs, fmt.Errorf("groups %d must be in [1, 1024]", c.Groups))
	}
	if c.SafetyGroups >= c.Groups {
		errs = append(errs, fmt.Errorf("safety_groups %d must be fewer than groups %d", c.SafetyGroups, c.Groups))
	}
	if c.Temperature <= 0 || c.Temperature > 5 {
		errs = append(errs, fmt.Errorf("temperature %v must be in (0, 5]", c.Temperature))
	}
	if c.LR <= 0 || c.LR > 1 {
		errs = append(errs, fmt.Errorf("lr %v must be in (0, 1]", c.LR))
	}
	if c.EvalEvery < 1 || c.EvalPrompts < 1 || c.EvalPrompts > 10_000 || c.SafetyPrompts < 1 || c.SafetyPrompts > 10_000 {
		errs = append(errs, fmt.Errorf("eval_every %d, eval_prompts %d and safety_prompts %d must be positive (prompts ≤ 10000)", c.EvalEvery, c.EvalPrompts, c.SafetyPrompts))
	}
	if c.GatePrompts < 1 || c.GatePrompts > 10_000 || c.GateTolerance < 0 || c.GateTolerance > 1 || c.SafetyTolerance < 0 || c.SafetyTolerance > 1 {
		errs = append(errs, fmt.Errorf("gate_prompts %d must be in [1, 10000], gate_tolerance %v and safety_tolerance %v in [0, 1]", c.GatePrompts, c.GateTolerance, c.SafetyTolerance))
	}
	if c.Lag < 0 || c.Lag > 64 {
		errs = append(errs, fmt.Errorf("lag %d must be in [0, 64]", c.Lag))
	}
	if c.MaxAhead < 0 || (c.MaxAhead > 0 && !c.FromServing) {
		errs = append(errs, fmt.Errorf("max_ahead %d must be ≥ 0, and needs from_serving (a line sampled from itself never goes back)", c.MaxAhead))
	}
	if c.Budget < 0 || c.MaxSteps < 0 {
		errs = append(errs, fmt.Errorf("budget %v and max_steps %d must be ≥ 0", c.Budget, c.MaxSteps))
	}
	return errors.Join(errs...)
}

// perfectAdvantage is the demo's advantage for a group whose answers all
// earned the top reward. Refusals the base always gives make only such
// groups, so without it nothing kept them trained while the task moved the
// weights: run as the online loop runs (steps of 288, 64 safety prompts, a
// candidate that loses one refusal sends the line back), final held-out
// success over seeds 1-5 was 0.730, 0.880, 0.900, 0.855 and 0.735 with 16
// safety rollbacks in all; with 0.1, 0.910, 0.860, 0.760, 0.885 and 0.865
// (9); with 0.2, 0.910, 0.840, 0.825, 0.895 and 0.800 (5).
const perfectAdvantage = 0.2

// Gate decisions.
const (
	// DecisionPromote: the candidate serves from now on.
	DecisionPromote = "promote"
	// DecisionHold: the candidate is not better; serving stays and
	// training goes on from the candidate (it may be in a dip on the way up).
	DecisionHold = "hold"
	// DecisionRollback: the candidate regressed on safety; it is discarded
	// and training restarts from the serving weights.
	DecisionRollback = "rollback"
	// DecisionReset: held, and the line went back to the serving version
	// (FromServing with MaxAhead).
	DecisionReset = "reset"
)

// Point is one measurement of the learning curve, taken at a gate.
type Point struct {
	Step    int           `json:"step"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// Version is the serving version after the gate's decision; Success
	// and Safety are its greedy success on the held-out prompts and on the
	// safety suite.
	Version int64   `json:"version"`
	Success float64 `json:"success"`
	Safety  float64 `json:"safety"`
	// Candidate is the trained version the gate judged, with its gate-set
	// success and safety, and the decision ("" for the base at step 0).
	Candidate        int64   `json:"candidate"`
	CandidateSuccess float64 `json:"candidate_success"`
	CandidateSafety  float64 `json:"candidate_safety"`
	Decision         string  `json:"decision,omitempty"`
	// SampledSuccess and MeanReward are over the task completions sampled
	// for training since the previous point (what agents would see).
	SampledSuccess float64 `json:"sampled_success"`
	MeanReward     float64 `json:"mean_reward"`
}

// RehearsalResult is the whole run.
type RehearsalResult struct {
	Points     []Point       `json:"points"`
	Steps      int           `json:"steps"`
	Wall       time.Duration `json:"wall_ns"`
	BaseBuild  time.Duration `json:"base_build_ns"`
	BaseCached bool          `json:"base_cached"`
	Params     int           `json:"params"`
	// Sampled counts the task completions sampled for training.
	Sampled    int `json:"sampled"`
	Promoted   int `json:"promoted"`
	Held       int `json:"held"`
	RolledBack int `json:"rolled_back"`
}

// First is the first point (zero when empty).
func (r RehearsalResult) First() Point {
	if len(r.Points) == 0 {
		return Point{}
	}
	return r.Points[0]
}

// Last is the last point (zero when empty).
func (r RehearsalResult) Last() Point {
	if len(r.Points) == 0 {
		return Point{}
	}
	return r.Points[len(r.Points)-1]
}

// promptSet is a fixed set of prompts rendered once.
type promptSet struct {
	prompts []Prompt
	ids     [][]int
	maxTok  int
}

func newPromptSet(ps []Prompt) (*promptSet, error) {
	s := &promptSet{prompts: ps, maxTok: 2}
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

// success is greedy exact-match success of m on the set.
func (s *promptSet) success(ctx context.Context, m *trainer.Model) (float64, error) {
	each, err := s.each(ctx, m)
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

// each is m's greedy exact-match result on every prompt of the set.
func (s *promptSet) each(ctx context.Context, m *trainer.Model) ([]bool, error) {
	answers, err := s.answers(ctx, m)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(answers))
	for i, a := range answers {
		out[i] = Verify(s.prompts[i].Want, a).Success
	}
	return out, nil
}

// answers is m's greedy answer to every prompt of the set.
func (s *promptSet) answers(ctx context.Context, m *trainer.Model) ([]string, error) {
	zero := 0.0
	gens, err := m.Generate(ctx, s.ids, trainer.SampleOptions{Temperature: &zero, MaxTokens: s.maxTok}, nil, nil)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(gens))
	for i, g := range gens {
		out[i] = completionText(g.IDs)
	}
	return out, nil
}

// GreedyAnswers is m's greedy answer to each of prompts, answered in
// process in one batch.
func GreedyAnswers(ctx context.Context, m *trainer.Model, prompts []Prompt) ([]string, error) {
	s, err := newPromptSet(prompts)
	if err != nil {
		return nil, err
	}
	return s.answers(ctx, m)
}

// GreedySuccess is m's greedy exact-match result on each of prompts, the
// measure the demo reports, answered in process in one batch (tests use it
// to judge stored versions on prompts the gates never saw).
func GreedySuccess(ctx context.Context, m *trainer.Model, prompts []Prompt) ([]bool, error) {
	s, err := newPromptSet(prompts)
	if err != nil {
		return nil, err
	}
	return s.each(ctx, m)
}

func completionText(ids []int) string {
	if n := len(ids); n > 0 && ids[n-1] == trainer.TokImEnd {
		ids = ids[:n-1]
	}
	return trainer.Tokenizer{}.Decode(ids)
}

// decide is the gate: a safety regression beyond safetyTol rolls the
// candidate back; any smaller safety drop, or success more than tol below
// the serving version's, holds it (not released, training goes on); else
// it is promoted. So the serving version's safety never goes down.
func decide(candSuccess, candSafety, servingSuccess, servingSafety, tol, safetyTol float64) string {
	switch {
	case candSafety < servingSafety-safetyTol:
		return DecisionRollback
	case candSafety >= servingSafety && candSuccess >= servingSuccess-tol:
		return DecisionPromote
	default:
		return DecisionHold
	}
}

// latest keeps the newest trained version for on-policy sampling.
type latest struct {
	model   *trainer.Model
	version int64
}

func (l *latest) Publish(m *trainer.Model, v int64) error {
	l.model, l.version = m, v
	return nil
}

// Rehearse runs the learning loop until the budget or MaxSteps is spent.
// Rollouts are sampled on-policy from the newest trained version; every
// EvalEvery steps a gate compares it with the serving version and decides.
// serve (may be nil) receives every promoted version, so an engine behind
// a gateway would serve exactly what the gate let through. onPoint (may be
// nil) sees every measurement as it is taken.
func Rehearse(ctx context.Context, cfg RehearsalConfig, serve trainer.Publisher, onPoint func(Point)) (RehearsalResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return RehearsalResult{}, fmt.Errorf("rehearsal config: %w", err)
	}
	var res RehearsalResult
	start := time.Now()
	base, cached, err := LoadOrBuildBase(ctx, cfg.CacheDir, cfg.Task, cfg.Base, cfg.Seed, cfg.EvalPrompts, cfg.Logger)
	if err != nil {
		return res, err
	}
	res.BaseBuild, res.BaseCached, res.Params = time.Since(start), cached, base.NumParams()

	heldOut, err := HeldOut(cfg.Task, cfg.Seed, cfg.EvalPrompts)
	if err != nil {
		return res, err
	}
	gatePrompts, err := HeldOut(cfg.Task, cfg.Seed^0x6a7e, cfg.GatePrompts)
	if err != nil {
		return res, err
	}
	suite := SafetySuite(cfg.Seed, cfg.SafetyPrompts)
	evalSet, err := newPromptSet(heldOut)
	if err != nil {
		return res, err
	}
	gateSet, err := newPromptSet(gatePrompts)
	if err != nil {
		return res, err
	}
	safeSet, err := newPromptSet(suite)
	if err != nil {
		return res, err
	}
	exclude := append(append(append([]Prompt{}, heldOut...), gatePrompts...), suite...)
	gen, err := NewGenerator(cfg.Task, cfg.Seed^0x7a1+cfg.RLSeed, exclude)
	if err != nil {
		return res, err
	}
	trCfg := cfg.Trainer
	if trCfg.Optim.LR == 0 {
		trCfg.Optim.LR = cfg.LR
	}
	trCfg.Logger = cfg.Logger
	cur := &latest{model: base, version: 0}
	tr, err := trainer.NewLocal(base, 0, trCfg, cur)
	if err != nil {
		return res, fmt.Errorf("rehearsal trainer: %w", err)
	}

	// The serving version and its gate scores.
	serving, servingV := base, int64(0)
	servingGate, err := gateSet.success(ctx, base)
	if err != nil {
		return res, fmt.Errorf("gate: %w", err)
	}
	servingSafety, err := safeSet.success(ctx, base)
	if err != nil {
		return res, fmt.Errorf("gate: %w", err)
	}
	servingSuccess, err := evalSet.success(ctx, base)
	if err != nil {
		return res, fmt.Errorf("evaluate: %w", err)
	}
	if serve != nil {
		if err := serve.Publish(base, 0); err != nil {
			return res, fmt.Errorf("serve base: %w", err)
		}
	}

	loopStart := time.Now()
	var sampled, succeeded int
	var rewardSum float64
	emit := func(p Point) {
		if sampled > 0 {
			p.SampledSuccess, p.MeanReward = float64(succeeded)/float64(sampled), rewardSum/float64(sampled)
		}
		sampled, succeeded, rewardSum = 0, 0, 0
		p.Elapsed = time.Since(loopStart)
		res.Points = append(res.Points, p)
		// Debug: the progress bar shows the same on the terminal.
		cfg.Logger.Debug("demo rehearsal point", "step", p.Step, "decision", p.Decision, "serving", p.Version,
			"success", p.Success, "safety", p.Safety, "candidate", p.Candidate, "candidate_success", p.CandidateSuccess,
			"sampled_success", p.SampledSuccess, "elapsed", p.Elapsed.Round(time.Millisecond))
		if onPoint != nil {
			onPoint(p)
		}
	}
	emit(Point{Version: 0, Success: servingSuccess, Safety: servingSafety, CandidateSuccess: servingGate, CandidateSafety: servingSafety})

	ahead := 0 // steps the trainer's line is past the serving version
	anchorGate := servingGate
	gate := func(step int) error {
		cand, candV := cur.model, cur.version
		candGate, err := gateSet.success(ctx, cand)
		if err != nil {
			return fmt.Errorf("gate: %w", err)
		}
		candSafety, err := safeSet.success(ctx, cand)
		if err != nil {
			return fmt.Errorf("gate: %w", err)
		}
		p := Point{Step: step, Candidate: candV, CandidateSuccess: candGate, CandidateSafety: candSafety}
		against := servingGate
		if cfg.Anchor {
			against = anchorGate
		}
		p.Decision = decide(candGate, candSafety, against, servingSafety, cfg.GateTolerance, cfg.SafetyTolerance)
		switch p.Decision {
		case DecisionRollback:
			res.RolledBack++
			ahead = 0
			// Versions only move forward: the restarted trainer continues
			// numbering after the discarded candidate.
			cur.model, cur.version = serving, candV
			if tr, err = trainer.NewLocal(serving, candV, trCfg, cur); err != nil {
				return fmt.Errorf("rollback: %w", err)
			}
		case DecisionPromote:
			res.Promoted++
			ahead = 0
			if serve != nil {
				if err := serve.Publish(cand, candV); err != nil {
					return fmt.Errorf("promote version %d: %w", candV, err)
				}
			}
			serving, servingV, servingGate, servingSafety = cand, candV, candGate, candSafety
			anchorGate = max(anchorGate, candGate)
			if servingSuccess, err = evalSet.success(ctx, serving); err != nil {
				return fmt.Errorf("evaluate: %w", err)
			}
		default:
			res.Held++
			if ahead++; cfg.MaxAhead > 0 && ahead >= cfg.MaxAhead {
				if err := tr.Reset(serving, servingV); err != nil {
					return fmt.Errorf("reset: %w", err)
				}
				cur.model, cur.version = serving, servingV
				p.Decision, ahead = DecisionReset, 0
			}
		}
		p.Version, p.Success, p.Safety = servingV, servingSuccess, servingSafety
		emit(p)
		return nil
	}

	temp := cfg.Temperature
	maxTok := max(cfg.Task.MaxLetters, len(Refusal)) + 2
	rng := rand.New(rand.NewPCG(cfg.Seed+cfg.RLSeed, 0x5a3b))
	step := 0
	var history, servingHist []latest
	for (cfg.MaxSteps == 0 || step < cfg.MaxSteps) && time.Since(loopStart) < cfg.Budget {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		model, version := cur.model, cur.version
		history = append(history, latest{model: model, version: version})
		if len(history) > cfg.Lag+1 {
			history = history[1:]
		}
		model, version = history[0].model, history[0].version
		if cfg.FromServing {
			servingHist = append(servingHist, latest{model: serving, version: servingV})
			if len(servingHist) > cfg.Lag+1 {
				servingHist = servingHist[1:]
			}
			model, version = servingHist[0].model, servingHist[0].version
		}
		prompts := make([]Prompt, 0, cfg.Groups*cfg.GroupSize)
		ids := make([][]int, 0, cfg.Groups*cfg.GroupSize)
		for g := 0; g < cfg.Groups; g++ {
			p := gen.Next()
			if g < cfg.SafetyGroups {
				p = gen.NextSafety()
			}
			pid, err := PromptIDs(p.Text)
			if err != nil {
				return res, err
			}
			for j := 0; j < cfg.GroupSize; j++ {
				prompts, ids = append(prompts, p), append(ids, pid)
			}
		}
		gens, err := model.Generate(ctx, ids, trainer.SampleOptions{Temperature: &temp, MaxTokens: maxTok}, rng, nil)
		if err != nil {
			return res, fmt.Errorf("rehearsal sample: %w", err)
		}
		b := &trainer.Batch{Temperature: temp}
		for i, g := range gens {
			sc := Verify(prompts[i].Want, completionText(g.IDs))
			if prompts[i].Want != Refusal {
				sampled++
				res.Sampled++
				rewardSum += sc.Reward
				if sc.Success {
					succeeded++
				}
			}
			s := rlSample(g, version)
			s.GroupID = strconv.Itoa(i / cfg.GroupSize)
			s.Reward = sc.Reward
			b.Samples = append(b.Samples, s)
		}
		if _, err := tr.TrainStep(ctx, b); err != nil {
			return res, fmt.Errorf("rehearsal step %d: %w", step, err)
		}
		step++
		if step%cfg.EvalEvery == 0 {
			if err := gate(step); err != nil {
				return res, err
			}
		}
	}
	if step%cfg.EvalEvery != 0 {
		if err := gate(step); err != nil {
			return res, err
		}
	}
	res.Steps, res.Wall = step, time.Since(loopStart)
	return res, nil
}

// rlSample turns a generation into a training sample: only the completion
// trains, with the behaviour log-probs and version it was sampled with.
func rlSample(g trainer.Generation, version int64) trainer.Sample {
	ids := append(append([]int{}, g.PromptIDs...), g.IDs...)
	n, p := len(ids), len(g.PromptIDs)
	s := trainer.Sample{TokenIDs: ids, LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n)}
	for i := range g.IDs {
		s.LossMask[p+i] = 1
		s.Logprobs[p+i] = g.Logprobs[i]
		s.Versions[p+i] = version
	}
	return s
}
