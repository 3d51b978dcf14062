// Package rehearsal is the demo's in-process learnability rehearsal: the
// online loop (sample groups, score them with the verifier, train a GRPO
// step, gate the candidate, release it) run in one process on the demo
// task, with no gateway, Temporal or database, so how well and how fast the
// task is learnt can be measured and tuned in seconds. It runs either demo
// task: a tools task's rollout is a whole session of calls. It trains as every
// deployment does, through the Tinker training API (the embedded trainer
// on a loopback port). Its gate judges safety by the release's own safety
// gate (evolution.JudgeSafety).
package rehearsal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/trainer"
)

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

// Result is the whole run.
type Result struct {
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
func (r Result) First() Point {
	if len(r.Points) == 0 {
		return Point{}
	}
	return r.Points[0]
}

// Last is the last point (zero when empty).
func (r Result) Last() Point {
	if len(r.Points) == 0 {
		return Point{}
	}
	return r.Points[len(r.Points)-1]
}

// latest is a version of the policy: the trainer's line publishes each
// new one into it, and the serving version is one too.
type latest struct {
	model   *trainer.Model
	version int64
}

func (l *latest) Publish(m *trainer.Model, v int64) error {
	l.model, l.version = m, v
	return nil
}

// run is one rehearsal in progress.
type run struct {
	cfg     Config
	serve   trainer.Publisher
	onPoint func(Point)
	res     Result

	// evalSet is what the reported success is measured on; gateSet and
	// safeSet are what the gate judges. gen draws the training prompts,
	// never one of theirs.
	evalSet, gateSet, safeSet *demotask.PromptSet
	gen                       *demotask.Generator

	// The trainer's line: cur is its newest version, ahead the gates it
	// has been held at since it last left the serving version.
	tr    *line
	cur   *latest
	ahead int

	// The serving version, its training state (to go back to), its gate
	// scores and reported success, and the best gate success of a
	// promoted version (the anchor).
	serving        latest
	servingState   string
	servingScores  scores
	servingSuccess float64
	anchorGate     float64
	// With ReleaseGate: the anchor's scores, and how many candidates were
	// judged against it and passed.
	anchorScores  scores
	looks, passes int

	// What was sampled for training since the last point.
	loopStart          time.Time
	sampled, succeeded int
	rewardSum          float64
}

// Run runs the learning loop until the budget or MaxSteps is spent.
// Rollouts are sampled on-policy from the newest trained version; every
// EvalEvery steps a gate compares it with the serving version and decides.
// serve (may be nil) receives every promoted version, so an engine behind
// a gateway would serve exactly what the gate let through. onPoint (may be
// nil) sees every measurement as it is taken.
func Run(ctx context.Context, cfg Config, serve trainer.Publisher, onPoint func(Point)) (Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Result{}, fmt.Errorf("rehearsal config: %w", err)
	}
	r := &run{cfg: cfg, serve: serve, onPoint: onPoint}
	defer r.close()
	if err := r.start(ctx); err != nil {
		return r.res, err
	}
	err := r.loop(ctx)
	return r.res, err
}

func (r *run) close() {
	if r.tr != nil {
		r.tr.close()
	}
}

// start builds (or loads) the base, the prompt sets and the trainer, and
// serves and measures the base as the first point.
func (r *run) start(ctx context.Context) error {
	cfg := r.cfg
	begin := time.Now()
	base, cached, err := demotask.LoadOrBuildBase(ctx, cfg.CacheDir, cfg.Task, cfg.Base, cfg.Seed, demotask.TuningHeldOutSpan(cfg.EvalPrompts), cfg.Logger)
	if err != nil {
		return err
	}
	r.res.BaseBuild, r.res.BaseCached, r.res.Params = time.Since(begin), cached, base.NumParams()
	if err := r.prepareSets(); err != nil {
		return err
	}
	trCfg := cfg.Trainer
	if trCfg.Optim.LR == 0 {
		trCfg.Optim.LR = cfg.LR
	}
	trCfg.Logger = cfg.Logger
	r.cur = &latest{model: base, version: 0}
	if r.tr, err = newLine(ctx, base, trCfg, cfg.LoRARank, cfg.Seed, r.cur); err != nil {
		return err
	}
	if r.servingState, err = r.tr.save(ctx); err != nil {
		return fmt.Errorf("rehearsal trainer: %w", err)
	}

	r.serving = latest{model: base, version: 0}
	if r.servingScores, err = r.score(ctx, base); err != nil {
		return err
	}
	if r.servingSuccess, err = r.evalSet.Success(ctx, base); err != nil {
		return fmt.Errorf("evaluate: %w", err)
	}
	if r.serve != nil {
		if err := r.serve.Publish(base, 0); err != nil {
			return fmt.Errorf("serve base: %w", err)
		}
	}
	r.loopStart = time.Now()
	safety := r.servingScores.safetyRate()
	r.emit(Point{Version: 0, Success: r.servingSuccess, Safety: safety, CandidateSuccess: r.servingScores.gate, CandidateSafety: safety})
	r.anchorGate, r.anchorScores = r.servingScores.gate, r.servingScores
	return nil
}

// prepareSets draws the held-out, gate and safety prompts, and the
// generator of training prompts that never asks one of them.
func (r *run) prepareSets() error {
	cfg := r.cfg
	heldOut, err := demotask.TuningHeldOut(cfg.Task, cfg.Seed, cfg.EvalPrompts)
	if err != nil {
		return err
	}
	gatePrompts, err := demotask.HeldOut(cfg.Task, cfg.Seed^0x6a7e, cfg.GatePrompts)
	if err != nil {
		return err
	}
	suite := demotask.SafetySuite(cfg.Seed, cfg.SafetyPrompts)
	if r.evalSet, err = demotask.NewTaskPromptSet(cfg.Task, heldOut); err != nil {
		return err
	}
	if r.gateSet, err = demotask.NewTaskPromptSet(cfg.Task, gatePrompts); err != nil {
		return err
	}
	if r.safeSet, err = demotask.NewTaskPromptSet(cfg.Task, suite); err != nil {
		return err
	}
	exclude := append(append(append([]demotask.Prompt{}, heldOut...), gatePrompts...), suite...)
	r.gen, err = demotask.NewGenerator(cfg.Task, cfg.Seed^0x7a1+cfg.RLSeed, exclude)
	return err
}

// emit records p with what was sampled since the last point.
func (r *run) emit(p Point) {
	if r.sampled > 0 {
		p.SampledSuccess, p.MeanReward = float64(r.succeeded)/float64(r.sampled), r.rewardSum/float64(r.sampled)
	}
	r.sampled, r.succeeded, r.rewardSum = 0, 0, 0
	p.Elapsed = time.Since(r.loopStart)
	r.res.Points = append(r.res.Points, p)
	// Debug: the progress bar shows the same on the terminal.
	r.cfg.Logger.Debug("demo rehearsal point", "step", p.Step, "decision", p.Decision, "serving", p.Version,
		"success", p.Success, "safety", p.Safety, "candidate", p.Candidate, "candidate_success", p.CandidateSuccess,
		"sampled_success", p.SampledSuccess, "elapsed", p.Elapsed.Round(time.Millisecond))
	if r.onPoint != nil {
		r.onPoint(p)
	}
}

// loop trains step after step, gating every EvalEvery steps and after the
// last one.
func (r *run) loop(ctx context.Context) error {
	cfg := r.cfg
	rng := rand.New(rand.NewPCG(cfg.Seed+cfg.RLSeed, 0x5a3b))
	step := 0
	var history, servingHist []latest
	for (cfg.MaxSteps == 0 || step < cfg.MaxSteps) && time.Since(r.loopStart) < cfg.Budget {
		if err := ctx.Err(); err != nil {
			return err
		}
		history = lagged(history, *r.cur, cfg.Lag)
		behaviour := history[0]
		if cfg.FromServing {
			servingHist = lagged(servingHist, r.serving, cfg.Lag)
			behaviour = servingHist[0]
		}
		if err := r.trainStep(ctx, rng, behaviour, step); err != nil {
			return err
		}
		step++
		if step%cfg.EvalEvery == 0 {
			if err := r.gate(ctx, step); err != nil {
				return err
			}
		}
	}
	if step%cfg.EvalEvery != 0 {
		if err := r.gate(ctx, step); err != nil {
			return err
		}
	}
	r.res.Steps, r.res.Wall = step, time.Since(r.loopStart)
	return nil
}

// lagged appends v to the versions of the last steps and keeps lag+1 of
// them: the first is the one a loop lagging lag steps samples.
func lagged(h []latest, v latest, lag int) []latest {
	h = append(h, v)
	if len(h) > lag+1 {
		h = h[1:]
	}
	return h
}

// trainStep samples a batch of groups from behaviour, scores it with the
// verifier and trains one step on it. A tools task's rollout is a whole
// session: each of its calls is a sample, and the session's end reward is
// every call's return (the deployment's discount of 1); the group compares
// the sessions of one request, as the online loop's does.
func (r *run) trainStep(ctx context.Context, rng *rand.Rand, behaviour latest, step int) error {
	cfg := r.cfg
	prompts := make([]demotask.Prompt, 0, cfg.Groups*cfg.GroupSize)
	for g := 0; g < cfg.Groups; g++ {
		p := r.gen.Next()
		if g < cfg.SafetyGroups {
			p = r.gen.NextSafety()
		}
		for j := 0; j < cfg.GroupSize; j++ {
			prompts = append(prompts, p)
		}
	}
	sessions, err := r.rollouts(ctx, rng, behaviour.model, prompts)
	if err != nil {
		return fmt.Errorf("rehearsal sample: %w", err)
	}
	b := &trainer.Batch{Temperature: cfg.Temperature}
	for i, sess := range sessions {
		sc := demotask.Verify(prompts[i].Want, sess.Answer)
		if prompts[i].Want != demotask.Refusal {
			r.sampled++
			r.res.Sampled++
			r.rewardSum += sc.Reward
			if sc.Success {
				r.succeeded++
			}
		}
		for _, g := range sess.Calls {
			s := rlSample(g, behaviour.version)
			s.GroupID, s.SessionID = strconv.Itoa(i/cfg.GroupSize), strconv.Itoa(i)
			s.Reward = sc.Reward
			b.Samples = append(b.Samples, s)
		}
	}
	if err := r.tr.trainStep(ctx, b); err != nil {
		return fmt.Errorf("rehearsal step %d: %w", step, err)
	}
	return nil
}

// rollouts samples a session of every prompt from m at the configured
// temperature: one call each, or the tools task's whole sessions.
func (r *run) rollouts(ctx context.Context, rng *rand.Rand, m *trainer.Model, prompts []demotask.Prompt) ([]demotask.Session, error) {
	temp := r.cfg.Temperature
	if r.cfg.Task.Kind == demotask.KindTools {
		return demotask.RunToolsSessions(ctx, m, prompts, temp, rng)
	}
	ids := make([][]int, len(prompts))
	for i, p := range prompts {
		var err error
		if ids[i], err = demotask.PromptIDs(p.Text); err != nil {
			return nil, err
		}
	}
	maxTok := max(r.cfg.Task.MaxLetters, len(demotask.Refusal)) + 2
	gens, err := m.Generate(ctx, ids, trainer.SampleOptions{Temperature: &temp, MaxTokens: maxTok}, rng, nil)
	if err != nil {
		return nil, err
	}
	out := make([]demotask.Session, len(gens))
	for i, g := range gens {
		out[i] = demotask.Session{Calls: []trainer.Generation{g}, Answer: demotask.AnswerText(g.IDs)}
	}
	return out, nil
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
