package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/workflows"
)

const (
	msgGateEvaluated   = "release gate evaluated"
	msgReleaseFinished = "release finished"
)

// Completer answers one request; inference.Backend implements it. The
// release gates use it to let the candidate and the baseline answer the
// same prompts.
type Completer interface {
	Complete(ctx context.Context, req *inference.Request) (*inference.Response, error)
}

// Release implements ReleaseWorkflow's activities.
type Release struct {
	DB *pgxpool.Pool
	// Backend serves both the candidate and the baseline (by
	// Request.Version for weights). Nil: offline gates (shadow, replay,
	// regression, safety) record that nothing was evaluated and pass; the
	// live canary still decides.
	Backend Completer
	Logger  *slog.Logger
	// MaxPrompts bounds the prompts an offline gate evaluates. Default 20.
	MaxPrompts int
	// MaxTokens bounds each evaluated answer. Default 128.
	MaxTokens int
}

// BeginRelease writes (or finds) the release row of this workflow.
func (r *Release) BeginRelease(ctx context.Context, in workflows.ReleaseInput) (workflows.BeginReleaseOutput, error) {
	rel, err := store.BeginRelease(ctx, r.DB, store.Release{
		Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate, Baseline: in.Baseline,
		WorkflowID: workflowID(ctx), Reason: in.Reason,
	})
	if err != nil {
		return workflows.BeginReleaseOutput{}, err
	}
	return workflows.BeginReleaseOutput{ReleaseID: rel.ID, Baseline: rel.Baseline}, nil
}

// SetReleasePhase records the phase and the canary share the gateway routes.
func (r *Release) SetReleasePhase(ctx context.Context, in workflows.SetPhaseInput) error {
	return store.SetReleasePhase(ctx, r.DB, in.ReleaseID, in.Phase, in.CanaryShare)
}

// FinishRelease promotes or rolls back.
func (r *Release) FinishRelease(ctx context.Context, in workflows.FinishReleaseInput) error {
	if err := store.FinishRelease(ctx, r.DB, in.ReleaseID, in.Status, in.Reason); err != nil {
		return err
	}
	r.logger().Info(msgReleaseFinished, "release_id", in.ReleaseID, "deployment", in.Deployment, "layer", in.Layer,
		"candidate", in.Candidate, "status", in.Status, "reason", in.Reason)
	return nil
}

// EvaluateGate computes one gate's numbers, records them in gate_results
// and returns the verdict.
func (r *Release) EvaluateGate(ctx context.Context, in workflows.GateInput) (workflows.GateResult, error) {
	var res workflows.GateResult
	var err error
	switch in.Gate {
	case workflows.GateShadow:
		res, err = r.shadow(ctx, in)
	case workflows.GateReplay:
		res, err = r.replay(ctx, in)
	case workflows.GateRegression, workflows.GateSafety:
		res, err = r.suite(ctx, in)
	case workflows.GateCanary:
		res, err = r.canary(ctx, in)
	default:
		return res, temporal.NewNonRetryableApplicationError(fmt.Sprintf("unknown gate %q", in.Gate), "BadInput", nil)
	}
	if err != nil {
		return res, err
	}
	res.Gate = in.Gate
	metrics := map[string]any{"reason": res.Reason, "insufficient": res.Insufficient}
	for k, v := range res.Metrics {
		metrics[k] = v
	}
	if err := store.RecordGate(ctx, r.DB, in.ReleaseID, in.Gate, res.Passed, metrics); err != nil {
		return res, err
	}
	r.logger().Info(msgGateEvaluated, "release_id", in.ReleaseID, "gate", in.Gate, "passed", res.Passed,
		"insufficient", res.Insufficient, "reason", res.Reason)
	return res, nil
}

// variant is how one side (candidate or baseline) answers.
type variant struct {
	version   string // model version (Request.Version)
	artefacts evolution.ArtefactSet
}

// variants builds the candidate and baseline sides of a comparison.
func (r *Release) variants(ctx context.Context, in workflows.GateInput) (cand, base variant, err error) {
	serving, err := store.ServingArtefacts(ctx, r.DB, in.Deployment)
	if err != nil {
		return cand, base, err
	}
	var set evolution.ArtefactSet
	for _, a := range serving {
		if err := set.Decode(a.Kind, a.Content); err != nil {
			return cand, base, err
		}
	}
	kind := store.ArtefactKind(in.Layer)
	if kind == "" {
		return variant{version: in.Candidate, artefacts: set}, variant{version: in.Baseline, artefacts: set}, nil
	}
	weights, err := store.ServingOf(ctx, r.DB, in.Deployment, workflows.LayerWeights)
	if err != nil {
		return cand, base, err
	}
	a, err := store.ArtefactVersion(ctx, r.DB, in.Deployment, kind, in.Candidate)
	if err != nil {
		return cand, base, err
	}
	candSet := set
	if err := candSet.Decode(kind, a.Content); err != nil {
		return cand, base, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	return variant{version: weights, artefacts: candSet}, variant{version: weights, artefacts: set}, nil
}

// answer lets v answer msgs.
// limit is the request's own max_tokens (0: none): the smaller of it and
// the gate's bound applies.
func (r *Release) answer(ctx context.Context, deployment string, v variant, msgs []inference.Message, tools []inference.Tool, limit int) (*inference.Response, error) {
	msgs, tools = v.artefacts.Apply(msgs, tools)
	zero, seed := 0.0, int64(1)
	maxTokens := r.MaxTokens
	if maxTokens <= 0 {
		maxTokens = 128
	}
	if limit > 0 {
		maxTokens = min(maxTokens, limit)
	}
	heartbeat(ctx)
	return r.Backend.Complete(ctx, &inference.Request{
		Model: deployment, Version: v.version, Messages: msgs, Tools: tools,
		MaxTokens: maxTokens, Temperature: &zero, Seed: &seed,
	})
}

// rejected reports whether the backend refused the request itself (a 4xx
// other than 429): the side that got it cannot answer that prompt, which
// is a verdict on that side, not a fault to retry.
func rejected(err error) bool {
	var ie *inference.Error
	return errors.As(err, &ie) && ie.Status >= 400 && ie.Status < 500 && ie.Status != 429
}

func (r *Release) maxPrompts() int {
	if r.MaxPrompts <= 0 {
		return 20
	}
	return r.MaxPrompts
}

func notEvaluated(why string) workflows.GateResult {
	return workflows.GateResult{Passed: true, Metrics: map[string]float64{"evaluated": 0}, Reason: why}
}

// shadow lets the candidate answer the live prompts of the shadow window
// (users were served by the baseline) and compares error rates.
func (r *Release) shadow(ctx context.Context, in workflows.GateInput) (workflows.GateResult, error) {
	if r.Backend == nil {
		return notEvaluated("no backend on this worker to mirror traffic to"), nil
	}
	prompts, err := store.RecentPrompts(ctx, r.DB, in.Deployment, in.Since, r.maxPrompts(), false)
	if err != nil {
		return workflows.GateResult{}, err
	}
	if len(prompts) == 0 {
		return notEvaluated("no live traffic during the shadow window"), nil
	}
	cand, _, err := r.variants(ctx, in)
	if err != nil {
		return workflows.GateResult{}, err
	}
	var candErr, baseErr int
	var latency time.Duration
	for _, p := range prompts {
		var req capturedRequest
		if err := json.Unmarshal(p.Request, &req); err != nil {
			continue
		}
		if p.Status != "ok" {
			baseErr++
		}
		start := time.Now()
		resp, err := r.answer(ctx, in.Deployment, cand, req.Messages, req.Tools, req.MaxTokens)
		latency += time.Since(start)
		if err != nil && !rejected(err) {
			return workflows.GateResult{}, fmt.Errorf("shadow on candidate %s: %w", in.Candidate, err)
		}
		if err != nil || resp.FinishReason == inference.FinishError {
			candErr++
		}
	}
	n := float64(len(prompts))
	m := map[string]float64{
		"evaluated": n, "candidate_error_rate": float64(candErr) / n, "baseline_error_rate": float64(baseErr) / n,
		"candidate_latency_ms": float64(latency.Milliseconds()) / n,
	}
	ok, why := evolution.Verdict(-m["candidate_error_rate"], -m["baseline_error_rate"], in.Policy.MaxErrorRise)
	return workflows.GateResult{Passed: ok, Metrics: m, Reason: "error rate: " + why}, nil
}

// replay re-scores recorded, rewarded prompts: each side's answer is
// compared with the recorded answer weighted by its reward.
func (r *Release) replay(ctx context.Context, in workflows.GateInput) (workflows.GateResult, error) {
	if r.Backend == nil {
		return notEvaluated("no backend on this worker to replay prompts on"), nil
	}
	prompts, err := store.RecentPrompts(ctx, r.DB, in.Deployment, time.Time{}, r.maxPrompts(), true)
	if err != nil {
		return workflows.GateResult{}, err
	}
	if len(prompts) == 0 {
		return notEvaluated("no rewarded prompts recorded yet"), nil
	}
	cand, base, err := r.variants(ctx, in)
	if err != nil {
		return workflows.GateResult{}, err
	}
	var cs, bs []float64
	var candErrs, baseErrs int
	for _, p := range prompts {
		var req capturedRequest
		var rec capturedResponse
		if json.Unmarshal(p.Request, &req) != nil || json.Unmarshal(p.Response, &rec) != nil || p.Reward == nil {
			continue
		}
		ca, cerr := r.answer(ctx, in.Deployment, cand, req.Messages, req.Tools, req.MaxTokens)
		if cerr != nil && !rejected(cerr) {
			return workflows.GateResult{}, fmt.Errorf("replay on candidate %s: %w", in.Candidate, cerr)
		}
		ba, berr := r.answer(ctx, in.Deployment, base, req.Messages, req.Tools, req.MaxTokens)
		if berr != nil && !rejected(berr) {
			return workflows.GateResult{}, fmt.Errorf("replay on baseline %s: %w", in.Baseline, berr)
		}
		if cerr != nil && berr != nil {
			continue // neither side can take this prompt: it says nothing
		}
		var c, b float64
		if cerr != nil {
			candErrs++
		} else {
			c = evolution.ReplayScore(ca.Message.Content, rec.Message.Content, *p.Reward)
		}
		if berr != nil {
			baseErrs++
		} else {
			b = evolution.ReplayScore(ba.Message.Content, rec.Message.Content, *p.Reward)
		}
		cs, bs = append(cs, c), append(bs, b)
	}
	if len(cs) == 0 {
		return notEvaluated("no recorded prompt could be decoded"), nil
	}
	c, b := evolution.Mean(cs), evolution.Mean(bs)
	n := float64(len(cs))
	m := map[string]float64{"evaluated": n, "candidate_score": c, "baseline_score": b,
		"candidate_error_rate": float64(candErrs) / n, "baseline_error_rate": float64(baseErrs) / n}
	if ok, why := evolution.Verdict(-m["candidate_error_rate"], -m["baseline_error_rate"], in.Policy.MaxErrorRise); !ok {
		return workflows.GateResult{Passed: false, Reason: "requests the candidate cannot take: " + why, Metrics: m}, nil
	}
	// Paired: both sides answered the same prompts, so the noise is that of
	// the per-prompt differences. A fixed margin on 20 prompts rolled back
	// 7 of 10 candidates in the last minutes of a demo run that was still
	// improving.
	se := evolution.PairedSE(cs, bs)
	m["score_diff_se"] = se
	ok, why := evolution.SignificantVerdict(c, b, se, in.Policy.MaxRewardDrop)
	return workflows.GateResult{Passed: ok, Reason: why, Metrics: m}, nil
}

// suite runs the regression suite (answers must keep their expected
// substring) or the safety suite (answers must be refusals).
func (r *Release) suite(ctx context.Context, in workflows.GateInput) (workflows.GateResult, error) {
	if r.Backend == nil {
		return notEvaluated("no backend on this worker to run the " + in.Gate + " suite on"), nil
	}
	rows, err := store.EvalSuite(ctx, r.DB, in.Deployment, in.Gate)
	if err != nil {
		return workflows.GateResult{}, err
	}
	type item struct {
		msgs   []inference.Message
		expect string
	}
	var items []item
	for _, p := range rows {
		var msgs []inference.Message
		if err := json.Unmarshal(p.Messages, &msgs); err != nil {
			return workflows.GateResult{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("eval prompt %d: %v", p.ID, err), "BadData", err)
		}
		items = append(items, item{msgs, p.Expect})
	}
	if len(items) == 0 && in.Gate == workflows.GateSafety {
		for _, p := range evolution.DefaultSafetyPrompts {
			items = append(items, item{[]inference.Message{{Role: inference.RoleUser, Content: p}}, "refuse"})
		}
	}
	if len(items) == 0 {
		return notEvaluated("the regression suite of this deployment is empty"), nil
	}
	cand, base, err := r.variants(ctx, in)
	if err != nil {
		return workflows.GateResult{}, err
	}
	pass := func(answer, expect string) bool {
		contains := strings.Contains(strings.ToLower(answer), strings.ToLower(expect))
		if in.Gate == workflows.GateSafety {
			// A refusal in words, or the deployment's own refusal marker
			// when its suite names one.
			return evolution.IsRefusal(answer) || (expect != "" && expect != "refuse" && contains)
		}
		return contains
	}
	var cp, bp int
	for _, it := range items {
		// A side that cannot take a prompt fails it.
		ca, err := r.answer(ctx, in.Deployment, cand, it.msgs, nil, 0)
		if err != nil && !rejected(err) {
			return workflows.GateResult{}, fmt.Errorf("%s suite on candidate: %w", in.Gate, err)
		}
		if err == nil && pass(ca.Message.Content, it.expect) {
			cp++
		}
		ba, err := r.answer(ctx, in.Deployment, base, it.msgs, nil, 0)
		if err != nil && !rejected(err) {
			return workflows.GateResult{}, fmt.Errorf("%s suite on baseline: %w", in.Gate, err)
		}
		if err == nil && pass(ba.Message.Content, it.expect) {
			bp++
		}
	}
	n := float64(len(items))
	c, b := float64(cp)/n, float64(bp)/n
	drop := in.Policy.MaxRewardDrop
	if in.Gate == workflows.GateSafety {
		drop = in.Policy.MaxSafetyDrop
	}
	ok, why := evolution.Verdict(c, b, drop)
	return workflows.GateResult{Passed: ok, Reason: why,
		Metrics: map[string]float64{"evaluated": n, "candidate_pass_rate": c, "baseline_pass_rate": b}}, nil
}

// canary compares the live outcomes of the candidate's share of traffic
// with the baseline's over the same period.
func (r *Release) canary(ctx context.Context, in workflows.GateInput) (workflows.GateResult, error) {
	c, err := store.OutcomesSince(ctx, r.DB, in.Deployment, in.Candidate, in.Since)
	if err != nil {
		return workflows.GateResult{}, err
	}
	b, err := store.OutcomesSince(ctx, r.DB, in.Deployment, in.Baseline, in.Since)
	if err != nil {
		return workflows.GateResult{}, err
	}
	m := map[string]float64{
		"candidate_interactions": float64(c.Interactions), "baseline_interactions": float64(b.Interactions),
		"candidate_rewarded": float64(c.Rewarded), "baseline_rewarded": float64(b.Rewarded),
		"candidate_mean_reward": c.MeanReward, "baseline_mean_reward": b.MeanReward,
		"candidate_error_rate": rate(c.Errors, c.Interactions), "baseline_error_rate": rate(b.Errors, b.Interactions),
	}
	need := in.Policy.MinCanarySamples
	if c.Interactions >= need && b.Interactions >= need {
		if ok, why := evolution.Verdict(-m["candidate_error_rate"], -m["baseline_error_rate"], in.Policy.MaxErrorRise); !ok {
			return workflows.GateResult{Passed: false, Metrics: m, Reason: "error rate: " + why}, nil
		}
	}
	if c.Rewarded < need || b.Rewarded < need {
		return workflows.GateResult{Passed: false, Insufficient: true, Metrics: m,
			Reason: fmt.Sprintf("%d candidate and %d baseline rewarded interactions; %d each needed", c.Rewarded, b.Rewarded, need)}, nil
	}
	se := evolution.MeanDiffSE(c.StdReward, c.Rewarded, b.StdReward, b.Rewarded)
	m["reward_diff_se"] = se
	ok, why := evolution.SignificantVerdict(c.MeanReward, b.MeanReward, se, in.Policy.MaxRewardDrop)
	return workflows.GateResult{Passed: ok, Metrics: m, Reason: "mean reward: " + why}, nil
}

// heartbeat reports progress when ctx is an activity's (it is not when a
// test calls the method directly).
func heartbeat(ctx context.Context, details ...any) {
	if activity.IsActivity(ctx) {
		activity.RecordHeartbeat(ctx, details...)
	}
}

// workflowID is the calling workflow's id ("" outside an activity).
func workflowID(ctx context.Context) string {
	if activity.IsActivity(ctx) {
		return activity.GetInfo(ctx).WorkflowExecution.ID
	}
	return ""
}

func rate(k, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(k) / float64(n)
}

func (r *Release) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}
