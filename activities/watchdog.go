package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/statusapi"
	"github.com/flywheel-ai/flywheel/store"
)

const msgWatchdogRolledBack = "watchdog rolled the deployment back to its anchor"

// minLiveRewards is how many rewarded interactions each side needs before
// the watchdog compares live rewards.
const minLiveRewards = 30

// WatchServing re-measures the serving version (WatchdogWorkflow's one
// activity): its held-out and safety suites answered afresh, and its live
// reward, against the anchor. A significant drop rolls the deployment back
// to the anchor. Every check is recorded (watchdog_checks).
func (r *Release) WatchServing(ctx context.Context, in flow.WatchdogInput) (flow.WatchdogResult, error) {
	var err error
	if in.Policy, err = gatePolicy(ctx, r.DB, in.Deployment, in.Policy); err != nil {
		return flow.WatchdogResult{}, err
	}
	serving, err := store.ServingOf(ctx, r.DB, in.Deployment, artefact.LayerWeights)
	if err != nil {
		return flow.WatchdogResult{}, err
	}
	res, err := r.watch(ctx, in, serving)
	if err != nil {
		return res, err
	}
	check := statusapi.WatchdogCheck{Deployment: in.Deployment, Serving: serving, Anchor: res.Anchor, Verdict: res.Verdict,
		Reason: res.Reason, Metrics: map[string]any{}, WorkflowID: workflowID(ctx)}
	for k, v := range res.Metrics {
		check.Metrics[k] = v
	}
	if res.RolledBackTo != "" {
		check.Metrics["rolled_back_to"] = res.RolledBackTo
	}
	if err := store.RecordWatchdogCheck(ctx, r.DB, check); err != nil {
		return res, err
	}
	return res, nil
}

func (r *Release) watch(ctx context.Context, in flow.WatchdogInput, serving string) (flow.WatchdogResult, error) {
	res := flow.WatchdogResult{Serving: serving, Metrics: map[string]float64{}}
	notEvaluated := func(why string) (flow.WatchdogResult, error) {
		res.Verdict, res.Reason = flow.WatchNotEvaluated, why
		return res, nil
	}
	if serving == "" {
		return notEvaluated("the deployment has no serving version")
	}
	if ok, err := r.answers(ctx, in.Deployment); err != nil {
		return res, err
	} else if !ok {
		return notEvaluated("no engine on this worker serves this deployment to answer the suites with")
	}
	cur, err := r.weightsVariant(ctx, in.Deployment, serving)
	if err != nil {
		return res, err
	}
	// The serving version answers afresh: a version that slipped through,
	// or a suite registered since its release, is measured now.
	p := in.Policy
	var fresh [2][]float64
	for i, name := range []string{store.SuiteRegression, store.SuiteSafety} {
		s, err := r.loadSuite(ctx, in.Deployment, name)
		if err != nil {
			return res, err
		}
		if len(s.prompts) > 0 {
			if fresh[i], err = r.measure(ctx, in.Deployment, cur, s, true); err != nil {
				return res, err
			}
		}
	}
	servingReg := fresh[0]
	anchor, reg, safety, ok, err := r.anchorOf(ctx, in.Deployment, cur, p.MaxSafetyDrop)
	if err != nil {
		return res, err
	}
	if !ok {
		return notEvaluated("no anchor: the deployment has no held-out suite, or no promoted version was measured on it")
	}
	res.Anchor = anchor.version
	if anchor.version == serving {
		res.Verdict, res.Reason = flow.WatchOK, "the anchor serves"
		res.Metrics["serving_pass_rate"] = evolution.Mean(servingReg)
		return res, nil
	}
	w := evolution.WatchInput{Serving: servingReg, ServingSafety: fresh[1], MinLive: minLiveRewards,
		Budget: p.AnchorBudget, MaxSafetyDrop: p.MaxSafetyDrop, MaxRewardDrop: p.MaxRewardDrop, Alpha: p.Alpha}
	if w.Anchor, err = r.measure(ctx, in.Deployment, anchor, reg, false); err != nil {
		return res, err
	}
	if w.AnchorSafety, err = r.measure(ctx, in.Deployment, anchor, safety, false); err != nil {
		return res, err
	}
	if w.ServingLive, err = r.live(ctx, in.Deployment, serving, p.Alpha/2); err != nil {
		return res, err
	}
	if w.AnchorLive, err = r.live(ctx, in.Deployment, anchor.version, p.Alpha/2); err != nil {
		return res, err
	}
	v := evolution.JudgeServing(w)
	res.Metrics, res.Reason = v.Metrics, v.Reason
	if !v.Rollback {
		res.Verdict = flow.WatchOK
		return res, nil
	}
	if _, err := store.RollbackTo(ctx, r.DB, in.Deployment, anchor.version, "watchdog: "+v.Reason); err != nil {
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrCannotServe) {
			return res, temporal.NewNonRetryableApplicationError(err.Error(), "BadData", err)
		}
		return res, fmt.Errorf("watchdog rollback: %w", err)
	}
	res.Verdict, res.RolledBackTo = flow.WatchRolledBack, anchor.version
	r.logger().Warn(msgWatchdogRolledBack, "deployment", in.Deployment, "from", serving, "to", anchor.version, "reason", v.Reason)
	return res, nil
}

// live is a version's live reward over all the traffic it served, as a
// confidence sequence at alpha.
func (r *Release) live(ctx context.Context, deployment, version string, alpha float64) (evolution.Live, error) {
	o, series, err := store.OutcomeSeries(ctx, r.DB, deployment, version, nil, time.Time{})
	if err != nil {
		return evolution.Live{}, err
	}
	lo, hi := r.rewardRange()
	cs := evolution.NewMeanCS(lo, hi, alpha)
	for _, v := range series {
		cs.Add(v)
	}
	l, u := cs.Bounds()
	return evolution.Live{N: len(series), Mean: o.MeanReward, Lower: l, Upper: u}, nil
}
