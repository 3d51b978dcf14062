package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
)

// releaseChangeGatesV2: shadow and canary wait for traffic (up to
// MaxTrafficWait) before a verdict, instead of failing at once; and the
// offline gates record their phase in their own activity (one server
// round trip per gate instead of two).
const releaseChangeGatesV2 = "release-gates-v2"

// releaseChangeArtefactCanary: artefact releases (playbook, harness,
// tool_schema) pass the live canary too; before, they promoted on the
// offline gates alone.
const releaseChangeArtefactCanary = "release-artefact-canary"

// releaseChangeDrainInSync: a weights release ends with one sync that
// unloads what no route names and no release moved away from within the
// drain, instead of sleeping through the drain itself: the training loop
// waits for its release, so a sleeping release held it for minutes.
const releaseChangeDrainInSync = "release-drain-in-sync"

// releaseChangeWeightSync: a weights release loads its candidate into the
// deployment's serving engine before the gates, and unloads what no route
// names once it ends.
const releaseChangeWeightSync = "release-weight-sync"

// ReleaseWorkflow takes a candidate through shadow, replay, regression,
// safety and canary gates and then promotes it or rolls it back on its own.
// Serving never pauses: until promotion users see the baseline, except the
// canary share; a rollback just sets the share back to zero.
func ReleaseWorkflow(ctx workflow.Context, in flow.ReleaseInput) (flow.ReleaseResult, error) {
	switch {
	case in.Deployment == "" || in.Candidate == "":
		return flow.ReleaseResult{}, temporal.NewNonRetryableApplicationError("release needs Deployment and Candidate", "BadInput", nil)
	case in.Layer != artefact.LayerWeights && in.Layer != artefact.LayerPlaybook && in.Layer != artefact.LayerHarness && in.Layer != artefact.LayerToolSchema:
		return flow.ReleaseResult{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("release layer %q is not one of weights, playbook, harness, tool_schema", in.Layer), "BadInput", nil)
	}
	r := &releaseRun{in: in, policy: in.Policy.WithDefaults()}
	return r.run(ctx)
}

type releaseRun struct {
	in       flow.ReleaseInput
	policy   deployment.ReleasePolicy
	state    flow.ReleaseState
	approved bool
	aborted  bool
	abortWhy string
}

func (r *releaseRun) run(ctx workflow.Context) (flow.ReleaseResult, error) {
	r.state.Phase = "starting"
	if err := workflow.SetQueryHandler(ctx, flow.ReleaseStateQuery, func() (flow.ReleaseState, error) { return r.state, nil }); err != nil {
		return flow.ReleaseResult{}, fmt.Errorf("register state query: %w", err)
	}
	approveCh := workflow.GetSignalChannel(ctx, flow.ReleaseApproveSignal)
	abortCh := workflow.GetSignalChannel(ctx, flow.ReleaseAbortSignal)
	// Signals are handled as they arrive, whatever the workflow waits on.
	workflow.Go(ctx, func(ctx workflow.Context) {
		for {
			sel := workflow.NewSelector(ctx)
			sel.AddReceive(approveCh, func(c workflow.ReceiveChannel, _ bool) {
				var note string
				c.Receive(ctx, &note)
				r.approved, r.state.Approved = true, true
			})
			sel.AddReceive(abortCh, func(c workflow.ReceiveChannel, _ bool) {
				var note string
				c.Receive(ctx, &note)
				r.aborted = true
				r.abortWhy = "aborted by operator"
				if note != "" {
					r.abortWhy += ": " + note
				}
			})
			sel.Select(ctx)
		}
	})
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.DeploymentKey.ValueSet(r.in.Deployment), flow.ModelVersionKey.ValueSet(r.in.Candidate))

	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 5 * time.Minute,
		HeartbeatTimeout:    time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute, MaximumAttempts: 10,
			NonRetryableErrorTypes: []string{"BadInput"},
		},
	})
	var begin flow.BeginReleaseOutput
	if err := workflow.ExecuteActivity(actx, aRelease.BeginRelease, r.in).Get(ctx, &begin); err != nil {
		return flow.ReleaseResult{State: r.state}, fmt.Errorf("begin release: %w", err)
	}
	r.state.ReleaseID = begin.ReleaseID
	if begin.Policy != nil {
		// The deployment's own timings and thresholds.
		r.policy = begin.Policy.WithDefaults()
	}
	base := r.in.Baseline
	if base == "" {
		base = begin.Baseline
	}

	synced := false
	if r.in.Layer == artefact.LayerWeights && workflow.GetVersion(ctx, releaseChangeWeightSync, workflow.DefaultVersion, 1) >= 1 {
		// The candidate must be in the engine before a gate or the canary
		// asks for it by name.
		r.state.Phase = "loading weights"
		var out flow.SyncWeightsOutput
		err := workflow.ExecuteActivity(weightSyncCtx(actx), aRelease.SyncWeights, flow.SyncWeightsInput{Deployment: r.in.Deployment, Candidate: r.in.Candidate}).Get(ctx, &out)
		synced = out.Synced
		if err != nil {
			return r.finish(ctx, actx, begin.ReleaseID, base, flow.ReleaseRolledBack, "weight sync: the serving engine did not load the candidate: "+err.Error(), false)
		}
	}
	status, reason, err := r.gates(ctx, actx, base)
	if err != nil {
		return flow.ReleaseResult{State: r.state}, err
	}
	return r.finish(ctx, actx, begin.ReleaseID, base, status, reason, synced)
}

// weightSyncCtx runs a weight load, which may take minutes and is refused
// for good (WeightSync) when the engine says no.
func weightSyncCtx(actx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(actx, workflow.ActivityOptions{
		StartToCloseTimeout: 15 * time.Minute,
		HeartbeatTimeout:    time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute, MaximumAttempts: 5,
			NonRetryableErrorTypes: []string{"BadInput", "WeightSync"},
		},
	})
}

// finish records how the release ended and, for a deployment whose
// engine was synced, unloads the versions no route names any more whose
// requests have drained.
func (r *releaseRun) finish(ctx, actx workflow.Context, releaseID int64, base, status, reason string, synced bool) (flow.ReleaseResult, error) {
	r.state.Phase = "finishing"
	// Finishing must happen even if the workflow was cancelled: a release
	// left half-open would keep routing canary traffic.
	fctx, _ := workflow.NewDisconnectedContext(actx)
	err := workflow.ExecuteActivity(fctx, aRelease.FinishRelease, flow.FinishReleaseInput{
		ReleaseID: releaseID, Deployment: r.in.Deployment, Layer: r.in.Layer,
		Candidate: r.in.Candidate, Baseline: base, Status: status, Reason: reason,
	}).Get(fctx, nil)
	if err != nil {
		return flow.ReleaseResult{State: r.state}, fmt.Errorf("finish release: %w", err)
	}
	if synced {
		// An engine that holds one set of weights takes the promoted
		// version now, and the versions no route names go once a request
		// routed to them has had its time to finish: the sync keeps those
		// still draining (older histories slept through the drain here).
		r.state.Phase = "syncing weights"
		syncs := []flow.SyncWeightsInput{{Deployment: r.in.Deployment, Unload: true, Drain: r.policy.WeightDrain}}
		if workflow.GetVersion(ctx, releaseChangeDrainInSync, workflow.DefaultVersion, 1) < 1 {
			syncs = []flow.SyncWeightsInput{{Deployment: r.in.Deployment}, {Deployment: r.in.Deployment, Unload: true}}
		}
		for _, in := range syncs {
			if in.Unload && in.Drain == 0 {
				if err := workflow.Sleep(fctx, r.policy.WeightDrain); err != nil {
					return flow.ReleaseResult{State: r.state}, err
				}
			}
			var out flow.SyncWeightsOutput
			if err := workflow.ExecuteActivity(weightSyncCtx(fctx), aRelease.SyncWeights, in).Get(fctx, &out); err != nil {
				// The release stands as recorded; the next release or
				// the watchdog syncs the engine again.
				workflow.GetLogger(ctx).Warn("weight sync after release failed", "deployment", r.in.Deployment, "unload", in.Unload, "error", err)
			}
		}
	}
	r.state.Phase, r.state.Status, r.state.Reason = "done", status, reason
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.GateKey.ValueSet(status))
	return flow.ReleaseResult{State: r.state}, nil
}

// gates runs every gate and says how the release ends.
func (r *releaseRun) gates(ctx, actx workflow.Context, base string) (status, reason string, err error) {
	g := &gating{releaseRun: r, ctx: ctx, actx: actx, base: base}
	// Traffic waits: a phase that saw too little traffic for a verdict
	// waits up to MaxTrafficWait more before it fails as not evaluated.
	g.v2 = workflow.GetVersion(ctx, releaseChangeGatesV2, workflow.DefaultVersion, 1) >= 1
	g.waitForTraffic = g.v2
	if status, reason, err := g.beforeCanary(); status != "" || err != nil {
		return status, reason, err
	}
	// Canary: a share of live traffic, compared with control as it comes.
	// The gateway serves a weights candidate's share by model version and
	// an artefact candidate's share (its own split of sessions) under the
	// candidate artefact.
	if r.in.Layer != artefact.LayerWeights && workflow.GetVersion(ctx, releaseChangeArtefactCanary, workflow.DefaultVersion, 1) < 1 {
		return r.approval(ctx, "offline gates passed (no live canary for the "+r.in.Layer+" layer)")
	}
	if status, reason, err := g.canary(); status != "" || err != nil {
		return status, reason, err
	}
	return r.approval(ctx, "every gate passed")
}

// gating is one release's way through its gates: the contexts they run
// in, the baseline they compare with, and how the history decided to wait.
type gating struct {
	*releaseRun
	ctx, actx workflow.Context
	base      string
	// v2 is releaseChangeGatesV2; waitForTraffic follows it.
	v2, waitForTraffic bool
}

// beforeCanary runs the shadow phase, then the shadow, replay, regression
// and safety gates in turn. A status is how the release ends ("" when
// every gate passed).
func (g *gating) beforeCanary() (status, reason string, err error) {
	ctx, p := g.ctx, g.policy
	// Shadow: the gateway mirrors live traffic to the candidate; users
	// keep seeing the baseline.
	if err := g.phase(flow.GateShadow, 0); err != nil {
		return "", "", fmt.Errorf("set shadow phase: %w", err)
	}
	since := workflow.Now(ctx)
	g.wait(p.ShadowDuration, false)
	if g.aborted {
		return flow.ReleaseAborted, g.abortWhy, nil
	}
	shadowUntil := workflow.Now(ctx).Add(g.trafficWait(p.ShadowDuration))
	for _, name := range []string{flow.GateShadow, flow.GateReplay, flow.GateRegression, flow.GateSafety} {
		inGate := false
		if name != flow.GateShadow {
			if g.v2 {
				// The gate's activity records the phase itself.
				g.state.Phase, inGate = name, true
				_ = workflow.UpsertTypedSearchAttributes(ctx, flow.GateKey.ValueSet(name))
			} else if err := g.phase(name, 0); err != nil {
				return "", "", fmt.Errorf("set %s phase: %w", name, err)
			}
		}
		final := !g.waitForTraffic || name != flow.GateShadow || !workflow.Now(ctx).Before(shadowUntil)
		res, err := g.gate(name, since, final, inGate)
		for err == nil && res.Insufficient && !final {
			g.wait(p.ShadowDuration, false)
			if g.aborted {
				return flow.ReleaseAborted, g.abortWhy, nil
			}
			final = !workflow.Now(ctx).Before(shadowUntil)
			res, err = g.gate(name, since, final, false)
		}
		if err != nil {
			return "", "", err
		}
		if g.aborted {
			return flow.ReleaseAborted, g.abortWhy, nil
		}
		if !res.Passed {
			return flow.ReleaseRolledBack, fmt.Sprintf("%s gate failed: %s", name, res.Reason), nil
		}
	}
	return "", "", nil
}

// canary sends the candidate its share of live traffic and checks it
// CanaryChecks times over CanaryDuration (longer, while the traffic is too
// little for a verdict). A status is how the release ends ("" when the
// canary passed).
func (g *gating) canary() (status, reason string, err error) {
	ctx, p := g.ctx, g.policy
	if err := g.phase(flow.GateCanary, p.CanaryShare); err != nil {
		return "", "", fmt.Errorf("set canary phase: %w", err)
	}
	since := workflow.Now(ctx)
	every := p.CanaryDuration / time.Duration(p.CanaryChecks)
	canaryUntil := since.Add(p.CanaryDuration + g.trafficWait(p.CanaryDuration))
	for i := 1; ; i++ {
		g.wait(every, true)
		if g.aborted {
			return flow.ReleaseAborted, g.abortWhy, nil
		}
		planned := i >= p.CanaryChecks
		final := g.approved || (planned && !workflow.Now(ctx).Before(canaryUntil))
		res, err := g.gate(flow.GateCanary, since, final, false)
		if err != nil {
			return "", "", err
		}
		if !res.Passed && !res.Insufficient {
			return flow.ReleaseRolledBack, "canary gate failed: " + res.Reason, nil
		}
		if final {
			if !res.Passed && !g.approved {
				return flow.ReleaseRolledBack, "canary gate failed: " + res.Reason, nil
			}
			return "", "", nil
		}
		if planned && !res.Insufficient {
			return "", "", nil // the planned checks are done and the last had enough data
		}
	}
}

// gate evaluates one gate on the traffic since since and keeps its result
// when it is the verdict (final, or enough data for one).
func (g *gating) gate(name string, since time.Time, final, setPhase bool) (flow.GateResult, error) {
	var res flow.GateResult
	err := workflow.ExecuteActivity(g.actx, aRelease.EvaluateGate, flow.GateInput{
		ReleaseID: g.state.ReleaseID, Deployment: g.in.Deployment, Layer: g.in.Layer,
		Candidate: g.in.Candidate, Baseline: g.base, Gate: name, Since: since, Policy: g.policy, Final: final, SetPhase: setPhase,
	}).Get(g.ctx, &res)
	if err != nil {
		return res, fmt.Errorf("evaluate %s gate: %w", name, err)
	}
	if final || !res.Insufficient {
		g.state.Gates = append(g.state.Gates, res)
	}
	return res, nil
}

// phase records the phase the release enters, with the candidate's share
// of live traffic.
func (g *gating) phase(name string, share float64) error {
	g.state.Phase = name
	_ = workflow.UpsertTypedSearchAttributes(g.ctx, flow.GateKey.ValueSet(name))
	return workflow.ExecuteActivity(g.actx, aRelease.SetReleasePhase, flow.SetPhaseInput{ReleaseID: g.state.ReleaseID, Phase: name, CanaryShare: share}).Get(g.ctx, nil)
}

// wait sleeps for d unless an abort (or, when approveEnds, an approval)
// comes first.
func (g *gating) wait(d time.Duration, approveEnds bool) {
	_, _ = workflow.AwaitWithTimeout(g.ctx, d, func() bool { return g.aborted || (approveEnds && g.approved) })
}

// trafficWait is how much longer than planned a phase may wait for
// traffic enough for a verdict.
func (g *gating) trafficWait(planned time.Duration) time.Duration {
	if !g.waitForTraffic {
		return 0
	}
	if g.policy.MaxTrafficWait > 0 {
		return g.policy.MaxTrafficWait
	}
	return planned
}

// approval waits for the operator when the policy asks for it.
func (r *releaseRun) approval(ctx workflow.Context, passed string) (status, reason string, err error) {
	p := r.policy
	if p.RequireApproval && !r.approved {
		r.state.Phase = "awaiting_approval"
		ok, _ := workflow.AwaitWithTimeout(ctx, p.ApprovalTimeout, func() bool { return r.aborted || r.approved })
		if r.aborted {
			return flow.ReleaseAborted, r.abortWhy, nil
		}
		if !ok {
			return flow.ReleaseRolledBack, "no approval within " + p.ApprovalTimeout.String(), nil
		}
	}
	if r.approved {
		return flow.ReleasePromoted, passed + "; approved by operator", nil
	}
	return flow.ReleasePromoted, passed, nil
}
