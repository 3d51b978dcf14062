package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trajectory"
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
	// Request.Version for weights). Nil: the offline gates (shadow,
	// replay, regression, safety) record that nothing was evaluated and
	// fail, unless the release's policy allows unevaluated gates.
	Backend Completer
	Logger  *slog.Logger
	// HTTPClient calls the serving engines' weight APIs (nil: a default
	// client; each call has the weight sync's own timeout).
	HTTPClient *http.Client
	// RewardMin and RewardMax bound live rewards (the gateway's
	// reward_min and reward_max); the live tests need the range. Default
	// [-1, 1].
	RewardMin, RewardMax float64
	// MaxPrompts bounds the live prompts shadow and replay evaluate
	// (suites are answered whole). Default 20.
	MaxPrompts int
	// MaxTokens bounds each evaluated answer. Default 128.
	MaxTokens int
	// SuiteConcurrency is how many suite prompts are answered at once: an
	// engine serves concurrent requests side by side (vLLM batches them),
	// and a suite answered one prompt at a time held the tools demo's
	// releases for 20 s of their 35. Default 4.
	SuiteConcurrency int
}

// BeginRelease writes (or finds) the release row of this workflow and
// reads the policy it runs by: the release's, with the deployment's own
// settings (thresholds and timings) in place of its.
func (r *Release) BeginRelease(ctx context.Context, in flow.ReleaseInput) (flow.BeginReleaseOutput, error) {
	rel, err := store.BeginRelease(ctx, r.DB, store.Release{
		Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate, Baseline: in.Baseline,
		WorkflowID: workflowID(ctx), Reason: in.Reason,
	})
	if err != nil {
		return flow.BeginReleaseOutput{}, err
	}
	p, err := gatePolicy(ctx, r.DB, in.Deployment, in.Policy)
	if err != nil {
		return flow.BeginReleaseOutput{}, err
	}
	return flow.BeginReleaseOutput{ReleaseID: rel.ID, Baseline: rel.Baseline, Policy: &p}, nil
}

// SetReleasePhase records the phase and the canary share the gateway routes.
func (r *Release) SetReleasePhase(ctx context.Context, in flow.SetPhaseInput) error {
	return store.SetReleasePhase(ctx, r.DB, in.ReleaseID, in.Phase, in.CanaryShare)
}

// FinishRelease promotes or rolls back.
func (r *Release) FinishRelease(ctx context.Context, in flow.FinishReleaseInput) error {
	if err := store.FinishRelease(ctx, r.DB, in.ReleaseID, in.Status, in.Reason); err != nil {
		return err
	}
	r.logger().Info(msgReleaseFinished, "release_id", in.ReleaseID, "deployment", in.Deployment, "layer", in.Layer,
		"candidate", in.Candidate, "status", in.Status, "reason", in.Reason)
	return nil
}

// EvaluateGate computes one gate's numbers, records them in gate_results
// and returns the verdict.
func (r *Release) EvaluateGate(ctx context.Context, in flow.GateInput) (flow.GateResult, error) {
	var err error
	if in.Policy, err = gatePolicy(ctx, r.DB, in.Deployment, in.Policy); err != nil {
		return flow.GateResult{}, err
	}
	if in.SetPhase {
		if err := store.SetReleasePhase(ctx, r.DB, in.ReleaseID, in.Gate, 0); err != nil {
			return flow.GateResult{}, err
		}
	}
	var res flow.GateResult
	switch in.Gate {
	case flow.GateShadow:
		res, err = r.shadow(ctx, in)
	case flow.GateReplay:
		res, err = r.replay(ctx, in)
	case flow.GateRegression, flow.GateSafety:
		res, err = r.suite(ctx, in)
	case flow.GateCanary:
		res, err = r.canary(ctx, in)
	default:
		return res, temporal.NewNonRetryableApplicationError(fmt.Sprintf("unknown gate %q", in.Gate), "BadInput", nil)
	}
	if err != nil {
		return res, err
	}
	res.Gate = in.Gate
	metrics := map[string]any{"reason": res.Reason, "insufficient": res.Insufficient,
		"not_evaluated": res.NotEvaluated, "regressed": res.Regressed}
	if res.Anchor != "" {
		metrics["anchor"] = res.Anchor
	}
	if res.SuiteKey != "" {
		metrics["suite_key"] = res.SuiteKey
	}
	for k, v := range res.Metrics {
		metrics[k] = v
	}
	if err := store.RecordGate(ctx, r.DB, in.ReleaseID, in.Gate, res.Passed, metrics); err != nil {
		return res, err
	}
	r.logger().Info(msgGateEvaluated, "release_id", in.ReleaseID, "gate", in.Gate, "passed", res.Passed,
		"insufficient", res.Insufficient, "not_evaluated", res.NotEvaluated, "reason", res.Reason)
	return res, nil
}

// variant is how one side (candidate or baseline) answers.
type variant struct {
	version   string // model version (Request.Version)
	artefacts artefact.Set
	// suffix names the artefacts ("+playbook:3"), key the whole variant
	// (version + suffix): what a suite result is stored under.
	suffix, key string
}

// servingSet reads the deployment's serving artefacts.
func (r *Release) servingSet(ctx context.Context, deployment string) ([]store.StoredArtefact, artefact.Set, error) {
	var set artefact.Set
	serving, err := store.ServingArtefacts(ctx, r.DB, deployment)
	if err != nil {
		return nil, set, err
	}
	for _, a := range serving {
		if err := set.Decode(a.Kind, a.Content); err != nil {
			return nil, set, err
		}
	}
	return serving, set, nil
}

// weightsVariant is version answering under the serving artefacts.
func (r *Release) weightsVariant(ctx context.Context, deployment, version string) (variant, error) {
	serving, set, err := r.servingSet(ctx, deployment)
	if err != nil {
		return variant{}, err
	}
	suffix := store.ArtefactSuffix(serving, "", "")
	return variant{version: version, artefacts: set, suffix: suffix, key: version + suffix}, nil
}

// variants builds the candidate and baseline sides of a comparison.
func (r *Release) variants(ctx context.Context, in flow.GateInput) (cand, base variant, err error) {
	kind := store.ArtefactKind(in.Layer)
	if kind == "" {
		if cand, err = r.weightsVariant(ctx, in.Deployment, in.Candidate); err != nil {
			return cand, base, err
		}
		base = cand
		base.version, base.key = in.Baseline, in.Baseline+cand.suffix
		return cand, base, nil
	}
	serving, set, err := r.servingSet(ctx, in.Deployment)
	if err != nil {
		return cand, base, err
	}
	weights, err := store.ServingOf(ctx, r.DB, in.Deployment, artefact.LayerWeights)
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
	suffix, candSuffix := store.ArtefactSuffix(serving, "", ""), store.ArtefactSuffix(serving, kind, in.Candidate)
	return variant{version: weights, artefacts: candSet, suffix: candSuffix, key: weights + candSuffix},
		variant{version: weights, artefacts: set, suffix: suffix, key: weights + suffix}, nil
}

// greedy is the temperature the replay and shadow gates answer recorded
// requests at: the argmax, a fact about the version.
const greedy = 0.0

// answer lets v answer msgs, under every tenant's part of its artefacts:
// suite prompts are no tenant's, and a candidate playbook or tool schema
// is judged on all it could put in front of any tenant.
// limit is the request's own max_tokens (0: none): the smaller of it and
// the gate's bound applies. temperature 0 (greedy) answers the argmax; any
// other samples with the prompt's own fixed seed (promptSeed).
func (r *Release) answer(ctx context.Context, deployment string, v variant, msgs []inference.Message, tools []inference.Tool, limit int, temperature float64) (*inference.Response, error) {
	seed := promptSeed(msgs, tools)
	msgs, tools = v.artefacts.Apply(artefact.AllTenants, msgs, tools)
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
		MaxTokens: maxTokens, Temperature: &temperature, Seed: &seed,
	})
}

// promptSeed is the seed a gate samples a prompt with: a hash of the prompt
// as the suite holds it (before a variant's artefacts change it). Every
// version draws the same random numbers for one prompt, so a paired
// comparison stays as tight as the versions are alike; different prompts
// draw independent ones. One seed for every prompt made their draws the
// same: where a format token's probability crossed the shared draw at one
// position, every sampled call of a version broke there at once, and a
// suite of 200 calls passed 0 or most of them on nearly equal weights.
func promptSeed(msgs []inference.Message, tools []inference.Tool) int64 {
	h := fnv.New64a()
	raw, _ := json.Marshal(struct {
		M []inference.Message `json:"m"`
		T []inference.Tool    `json:"t"`
	}{msgs, tools}) // plain data: it marshals
	_, _ = h.Write(raw)
	return int64(h.Sum64() >> 1)
}

// answers reports whether the backend answers for deployment: any
// Completer does, DeploymentEngines only for the deployments it serves.
func (r *Release) answers(ctx context.Context, deployment string) (bool, error) {
	if r.Backend == nil {
		return false, nil
	}
	if e, ok := r.Backend.(DeploymentEngines); ok {
		return e.Serves(ctx, deployment)
	}
	return true, nil
}

// unevaluable says why in's candidate cannot answer on its deployment's
// own engine here ("": it can): no engine here serves the deployment, or
// its engine holds one set of weights, replaced in place, so a weights
// candidate has no engine to answer on beside the serving version. Such a
// gate is not evaluated; it is never judged on other weights.
func (r *Release) unevaluable(ctx context.Context, in flow.GateInput) (string, error) {
	if ok, err := r.answers(ctx, in.Deployment); !ok || err != nil {
		return "no engine on this worker serves this deployment to answer the " + in.Gate + " gate's prompts", err
	}
	e, ok := r.Backend.(DeploymentEngines)
	if !ok || store.ArtefactKind(in.Layer) != "" {
		return "", nil // an artefact candidate answers on the serving weights
	}
	pins, err := e.PinsVersions(ctx, in.Deployment)
	if err != nil || pins {
		return "", err
	}
	return fmt.Sprintf("the deployment's engine answers only as the weights it holds (they are replaced in place, as %s does, "+
		"or not synced; only %s names each version), so candidate %s cannot answer beside the serving version on it, "+
		"and is not judged on other weights", deployment.WeightSyncSGLangDisk, deployment.WeightSyncVLLMLoRA, in.Candidate), nil
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

// notEvaluated is the result of a gate that had nothing to evaluate:
// it fails, unless the release's policy allows unevaluated gates.
func notEvaluated(in flow.GateInput, why string) flow.GateResult {
	res := flow.GateResult{NotEvaluated: true, Metrics: map[string]float64{"evaluated": 0}}
	if in.Policy.AllowUnevaluated {
		res.Passed, res.Reason = true, "not evaluated (the policy allows it): "+why
	} else {
		res.Reason = "not evaluated, so not passed: " + why
	}
	return res
}

// shadow lets the candidate answer the live prompts of the shadow window
// (users were served by the baseline) and compares error rates.
func (r *Release) shadow(ctx context.Context, in flow.GateInput) (flow.GateResult, error) {
	if why, err := r.unevaluable(ctx, in); why != "" || err != nil {
		return notEvaluated(in, why), err
	}
	prompts, err := store.RecentPrompts(ctx, r.DB, in.Deployment, in.Since, r.maxPrompts(), false)
	if err != nil {
		return flow.GateResult{}, err
	}
	if len(prompts) == 0 {
		if !in.Final {
			// The release waits for traffic and asks again.
			return flow.GateResult{Insufficient: true, NotEvaluated: true, Metrics: map[string]float64{"evaluated": 0},
				Reason: "no live traffic in the shadow window yet"}, nil
		}
		return notEvaluated(in, "no live traffic during the shadow window"), nil
	}
	cand, _, err := r.variants(ctx, in)
	if err != nil {
		return flow.GateResult{}, err
	}
	var candErr, baseErr int
	var latency time.Duration
	for _, p := range prompts {
		req, err := trajectory.DecodeRequest(p.Request)
		if err != nil {
			continue
		}
		if p.Status != "ok" {
			baseErr++
		}
		start := time.Now()
		resp, err := r.answer(ctx, in.Deployment, cand, req.Messages, req.Tools, req.MaxTokens, greedy)
		latency += time.Since(start)
		if err != nil && !rejected(err) {
			return flow.GateResult{}, fmt.Errorf("shadow on candidate %s: %w", in.Candidate, err)
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
	return flow.GateResult{Passed: ok, Metrics: m, Reason: "error rate: " + why}, nil
}

// replay re-scores recorded, rewarded prompts: each side's answer is
// compared with the recorded answer weighted by its reward.
func (r *Release) replay(ctx context.Context, in flow.GateInput) (flow.GateResult, error) {
	if why, err := r.unevaluable(ctx, in); why != "" || err != nil {
		return notEvaluated(in, why), err
	}
	prompts, err := store.RecentPrompts(ctx, r.DB, in.Deployment, time.Time{}, r.maxPrompts(), true)
	if err != nil {
		return flow.GateResult{}, err
	}
	if len(prompts) == 0 {
		return notEvaluated(in, "no rewarded prompts recorded yet"), nil
	}
	cand, base, err := r.variants(ctx, in)
	if err != nil {
		return flow.GateResult{}, err
	}
	var cs, bs []float64
	var candErrs, baseErrs int
	for _, p := range prompts {
		req, rerr := trajectory.DecodeRequest(p.Request)
		rec, perr := trajectory.DecodeResponse(p.Response)
		if rerr != nil || perr != nil || p.Reward == nil {
			continue
		}
		ca, cerr := r.answer(ctx, in.Deployment, cand, req.Messages, req.Tools, req.MaxTokens, greedy)
		if cerr != nil && !rejected(cerr) {
			return flow.GateResult{}, fmt.Errorf("replay on candidate %s: %w", in.Candidate, cerr)
		}
		ba, berr := r.answer(ctx, in.Deployment, base, req.Messages, req.Tools, req.MaxTokens, greedy)
		if berr != nil && !rejected(berr) {
			return flow.GateResult{}, fmt.Errorf("replay on baseline %s: %w", in.Baseline, berr)
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
		return notEvaluated(in, "no recorded prompt could be decoded"), nil
	}
	c, b := evolution.Mean(cs), evolution.Mean(bs)
	n := float64(len(cs))
	m := map[string]float64{"evaluated": n, "candidate_score": c, "baseline_score": b,
		"candidate_error_rate": float64(candErrs) / n, "baseline_error_rate": float64(baseErrs) / n}
	if ok, why := evolution.Verdict(-m["candidate_error_rate"], -m["baseline_error_rate"], in.Policy.MaxErrorRise); !ok {
		return flow.GateResult{Passed: false, Reason: "requests the candidate cannot take: " + why, Metrics: m}, nil
	}
	// Paired: both sides answered the same prompts, so the noise is that of
	// the per-prompt differences. A fixed margin on 20 prompts rolled back
	// 7 of 10 candidates in the last minutes of a demo run that was still
	// improving.
	se := evolution.PairedSE(cs, bs)
	m["score_diff_se"] = se
	ok, why := evolution.SignificantVerdict(c, b, se, in.Policy.MaxRewardDrop)
	return flow.GateResult{Passed: ok, Reason: why, Metrics: m}, nil
}

// canary compares the live outcomes of the candidate's share of traffic
// with the baseline's over the same period. It is checked several times as
// rewards come in, so it bounds each side's mean reward with a confidence
// sequence (valid however often it is looked at) and rolls back once the
// candidate is shown more than MaxRewardDrop worse. Drift over many
// releases is the held-out suite's to bound (the anchor), and the
// watchdog's once the candidate serves. An artefact release's sides are
// the calls the serving weights answered under the candidate artefact and
// under the serving one (the gateway records each call's artefacts).
func (r *Release) canary(ctx context.Context, in flow.GateInput) (flow.GateResult, error) {
	candVersion, baseVersion := in.Candidate, in.Baseline
	var candArtefacts, baseArtefacts *string
	if store.ArtefactKind(in.Layer) != "" {
		cand, base, err := r.variants(ctx, in)
		if err != nil {
			return flow.GateResult{}, err
		}
		candVersion, baseVersion, candArtefacts, baseArtefacts = cand.version, base.version, &cand.suffix, &base.suffix
	}
	c, cr, err := store.OutcomeSeries(ctx, r.DB, in.Deployment, candVersion, candArtefacts, in.Since)
	if err != nil {
		return flow.GateResult{}, err
	}
	b, br, err := store.OutcomeSeries(ctx, r.DB, in.Deployment, baseVersion, baseArtefacts, in.Since)
	if err != nil {
		return flow.GateResult{}, err
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
			return flow.GateResult{Passed: false, Regressed: true, Metrics: m, Reason: "error rate: " + why}, nil
		}
	}
	if c.Rewarded < need || b.Rewarded < need {
		why := fmt.Sprintf("%d candidate and %d baseline rewarded interactions; %d each needed", c.Rewarded, b.Rewarded, need)
		if in.Final {
			// Out of time: the canary could not evaluate, which passes
			// only where the policy allows unevaluated gates.
			res := notEvaluated(in, why)
			for k, v := range m {
				res.Metrics[k] = v
			}
			return res, nil
		}
		return flow.GateResult{Passed: false, Insufficient: true, Metrics: m, Reason: why}, nil
	}
	lower, upper := r.rewardDiff(cr, br, in.Policy.Alpha)
	m["reward_diff_lower"], m["reward_diff_upper"] = lower, upper
	if upper < -in.Policy.MaxRewardDrop {
		return flow.GateResult{Passed: false, Regressed: true, Metrics: m, Reason: fmt.Sprintf(
			"mean reward: candidate %.4f vs baseline %.4f, worse by at least %.4f (confidence sequence, alpha %.2g), more than the allowed %.4f",
			c.MeanReward, b.MeanReward, -upper, in.Policy.Alpha, in.Policy.MaxRewardDrop)}, nil
	}
	return flow.GateResult{Passed: true, Metrics: m, Reason: fmt.Sprintf(
		"mean reward: candidate %.4f vs baseline %.4f, difference in [%.4f, %.4f] (confidence sequence, alpha %.2g); not shown worse than the allowed %.4f",
		c.MeanReward, b.MeanReward, lower, upper, in.Policy.Alpha, in.Policy.MaxRewardDrop)}, nil
}

// rewardDiff bounds mean(a) − mean(b), each side's confidence sequence at
// alpha/2 over the configured reward range.
func (r *Release) rewardDiff(a, b []float64, alpha float64) (lower, upper float64) {
	lo, hi := r.rewardRange()
	ca, cb := evolution.NewMeanCS(lo, hi, alpha/2), evolution.NewMeanCS(lo, hi, alpha/2)
	for _, v := range a {
		ca.Add(v)
	}
	for _, v := range b {
		cb.Add(v)
	}
	return evolution.DiffBounds(ca, cb)
}

// rewardRange is the configured range of live rewards.
func (r *Release) rewardRange() (lo, hi float64) {
	if r.RewardMax > r.RewardMin {
		return r.RewardMin, r.RewardMax
	}
	return -1, 1
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
