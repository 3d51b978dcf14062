package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/redact"
	"github.com/flywheel-ai/flywheel/store"
)

const (
	msgDecisionRecorded = "evolution decision recorded"
	msgArtefactProposed = "artefact proposed"
)

// SignalWithStarter is the part of the Temporal client RequestTraining
// needs; client.Client implements it.
type SignalWithStarter interface {
	SignalWithStartWorkflow(ctx context.Context, workflowID, signalName string, signalArg any,
		options client.StartWorkflowOptions, workflow any, workflowArgs ...any) (client.WorkflowRun, error)
}

// Evolution implements EvolutionWorkflow's activities.
type Evolution struct {
	DB       *pgxpool.Pool
	Temporal SignalWithStarter
	// Redactor cleans lessons taken from user text before they enter a
	// playbook that is injected into other sessions.
	Redactor *redact.Redactor
	Logger   *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Reflector asks the deployment's reflecting model (nil: the cheap
	// layers propose nothing on this worker).
	Reflector Reflector
	// Backend replays failed tool calls on the deployment's engine.
	Backend Completer
}

func (e *Evolution) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// ComputeEvidence measures the window ending now against the one before.
func (e *Evolution) ComputeEvidence(ctx context.Context, in flow.EvidenceInput) (evolution.Evidence, error) {
	if in.Window <= 0 {
		return evolution.Evidence{}, temporal.NewNonRetryableApplicationError("evidence window must be positive", "BadInput", nil)
	}
	now := e.now()
	from, prevFrom := now.Add(-in.Window), now.Add(-2*in.Window)
	// What earlier promoted changes did to reward, now that a window has
	// passed since each.
	if _, err := store.ReviewDecisions(ctx, e.DB, in.Deployment, in.Window, now); err != nil {
		return evolution.Evidence{}, err
	}
	cur, err := store.SessionWindow(ctx, e.DB, in.Deployment, from, now)
	if err != nil {
		return evolution.Evidence{}, err
	}
	prev, err := store.SessionWindow(ctx, e.DB, in.Deployment, prevFrom, from)
	if err != nil {
		return evolution.Evidence{}, err
	}
	ev := evolution.Evidence{
		Deployment: in.Deployment, WindowSecs: in.Window.Seconds(),
		Sessions: cur.Sessions, RewardedSessions: cur.RewardedSessions,
		RewardMean: cur.MeanReward, RewardPrev: prev.MeanReward, PrevSamples: prev.RewardedSessions,
		EvaluatorScore: cur.EvaluatorMean, EvaluatorPrev: prev.EvaluatorMean,
		CostPerSession: cur.TokensPerSession, CostPrev: prev.TokensPerSession,
		Tenants: cur.Tenants, FailingTenants: cur.FailingTenants,
	}
	if prev.RewardedSessions > 0 && cur.RewardedSessions > 0 {
		ev.RewardTrend = cur.MeanReward - prev.MeanReward
	}
	if cur.Sessions > 0 {
		ev.CorrectionRate = float64(cur.Corrected) / float64(cur.Sessions)
		ev.SafetyRate = float64(cur.SafetyFlagged) / float64(cur.Sessions)
	}
	tools, err := store.ToolFailures(ctx, e.DB, in.Deployment, from, now)
	if err != nil {
		return evolution.Evidence{}, err
	}
	for _, t := range tools {
		example := t.Example
		if e.Redactor != nil {
			example, _ = e.Redactor.Text(example)
		}
		ev.ToolFailures = append(ev.ToolFailures, evolution.ToolFailure{Tenant: t.Tenant, Tool: t.Tool, Calls: t.Calls, Failures: t.Failures,
			Rate: float64(t.Failures) / float64(t.Calls), Example: example, Sessions: t.Sessions})
	}
	tenants, err := store.TenantOutcomes(ctx, e.DB, in.Deployment, from, now)
	if err != nil {
		return evolution.Evidence{}, err
	}
	for _, t := range tenants {
		ev.TenantOutcomes = append(ev.TenantOutcomes, evolution.TenantOutcome(t))
	}
	recent, err := store.UserPrompts(ctx, e.DB, in.Deployment, from, now, 200)
	if err != nil {
		return evolution.Evidence{}, err
	}
	older, err := store.UserPrompts(ctx, e.DB, in.Deployment, prevFrom, from, 200)
	if err != nil {
		return evolution.Evidence{}, err
	}
	ev.Drift = evolution.Drift(recent, older, 50)
	if ev.QueuedSamples, _, err = store.QueueStats(ctx, e.DB, in.Deployment); err != nil {
		return evolution.Evidence{}, err
	}
	if ev.ServingVersion, err = store.ServingOf(ctx, e.DB, in.Deployment, artefact.LayerWeights); err != nil {
		return evolution.Evidence{}, err
	}
	if ev.ServingVersion != "" {
		var at time.Time
		if ev.PreviousVersion, at, err = store.LastPromotion(ctx, e.DB, in.Deployment, ev.ServingVersion); err != nil {
			return evolution.Evidence{}, err
		}
		ev.RecentlyPromoted = !at.IsZero() && !at.Before(from)
	}
	last, err := store.LastDecision(ctx, e.DB, in.Deployment, now)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return evolution.Evidence{}, err
	default:
		ev.LastDecision = last.Decision
		if ev.SessionsSinceLast, err = store.SessionsSince(ctx, e.DB, in.Deployment, last.CreatedAt); err != nil {
			return evolution.Evidence{}, err
		}
	}
	return ev, nil
}

// RecordDecision stores the decision and its evidence.
func (e *Evolution) RecordDecision(ctx context.Context, in flow.RecordDecisionInput) (int64, error) {
	raw, err := json.Marshal(struct {
		evolution.Evidence
		Trigger string `json:"trigger,omitempty"`
		Target  string `json:"target,omitempty"`
		Tenant  string `json:"tenant,omitempty"`
	}{in.Evidence, in.Trigger, in.Decision.Target, in.Decision.Tenant})
	if err != nil {
		return 0, fmt.Errorf("encode evidence: %w", err)
	}
	id, err := store.RecordDecision(ctx, e.DB, store.DecisionRow{
		Deployment: in.Deployment, Decision: in.Decision.Kind, Evidence: raw, Reason: in.Decision.Reason,
		WorkflowID: workflowID(ctx), Tenant: in.Decision.Tenant, Expected: in.Decision.Expected,
	})
	if err != nil {
		return 0, err
	}
	e.logger().Info(msgDecisionRecorded, "deployment", in.Deployment, "decision", in.Decision.Kind, "id", id, "reason", in.Decision.Reason)
	return id, nil
}

// ProposeArtefact writes the candidate artefact the decision calls for.
func (e *Evolution) ProposeArtefact(ctx context.Context, in flow.ProposeArtefactInput) (flow.ProposeArtefactOutput, error) {
	serving, err := store.ServingArtefacts(ctx, e.DB, in.Deployment)
	if err != nil {
		return flow.ProposeArtefactOutput{}, err
	}
	var cur artefact.Set
	for _, a := range serving {
		if a.Kind == in.Kind {
			if err := cur.Decode(a.Kind, a.Content); err != nil {
				return flow.ProposeArtefactOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadData", err)
			}
		}
	}
	var content any
	items := 0
	settings, err := e.evolutionSettings(ctx, in.Deployment)
	if err != nil {
		return flow.ProposeArtefactOutput{}, err
	}
	spend := &reflectionSpend{settings: settings}
	nothing := func(why string) (flow.ProposeArtefactOutput, error) {
		return flow.ProposeArtefactOutput{Reason: why, ReflectionTokens: spend.spent}, nil
	}
	const noReflector = "the deployment names no reflector (its settings' evolution.reflector), so nothing reads its failed sessions"
	var note string
	switch in.Kind {
	case artefact.LayerPlaybook:
		if settings.Reflector == "" {
			return nothing(noReflector)
		}
		var old artefact.Playbook
		if cur.Playbook != nil {
			old = *cur.Playbook
		}
		pb, why, err := e.proposePlaybook(ctx, in, old, spend)
		if err != nil {
			return flow.ProposeArtefactOutput{}, err
		}
		if samePlaybook(pb, old) {
			return nothing("the playbook would not change: " + why)
		}
		content, items, note = pb, len(pb.Items), why
	case artefact.LayerHarness:
		if settings.Reflector == "" {
			return nothing(noReflector)
		}
		h, why, err := e.proposeHarness(ctx, in, cur, spend)
		if err != nil {
			return flow.ProposeArtefactOutput{}, err
		}
		if h == nil {
			return nothing(why)
		}
		content, items, note = *h, 1, why
	case artefact.LayerToolSchema:
		var f *evolution.ToolFailure
		for i := range in.Evidence.ToolFailures {
			if g := &in.Evidence.ToolFailures[i]; g.Tool == in.Target && g.Tenant == in.Tenant {
				f = g
			}
		}
		if f == nil || f.Tenant == "" {
			return flow.ProposeArtefactOutput{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("tool %q of tenant %q is not in the evidence", in.Target, in.Tenant), "BadInput", nil)
		}
		if settings.Reflector == "" {
			return nothing(noReflector)
		}
		ts := artefact.ToolSchema{Tenants: map[string]map[string]artefact.ToolOverride{}}
		if cur.ToolSchema != nil {
			for t, o := range cur.ToolSchema.Tenants {
				ts.Tenants[t] = o
			}
		}
		mine := map[string]artefact.ToolOverride{}
		for k, v := range ts.Tenants[f.Tenant] {
			mine[k] = v
		}
		o, why, err := e.proposeToolSchema(ctx, in, *f, mine[f.Tool], spend)
		if err != nil {
			return flow.ProposeArtefactOutput{}, err
		}
		if o == nil {
			return nothing(why)
		}
		mine[f.Tool] = *o
		ts.Tenants[f.Tenant] = mine
		content, items, note = ts, len(mine), why
	default:
		return flow.ProposeArtefactOutput{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("unknown artefact kind %q", in.Kind), "BadInput", nil)
	}
	raw, err := json.Marshal(content)
	if err != nil {
		return flow.ProposeArtefactOutput{}, fmt.Errorf("encode %s: %w", in.Kind, err)
	}
	a, err := store.CreateArtefact(ctx, e.DB, in.Deployment, in.Kind, raw, in.Key)
	if err != nil {
		return flow.ProposeArtefactOutput{}, err
	}
	e.logger().Info(msgArtefactProposed, "deployment", in.Deployment, "kind", in.Kind, "version", a.Version, "items", items,
		"reflection_tokens", spend.spent)
	return flow.ProposeArtefactOutput{Version: a.Version, Items: items, Reason: note, ReflectionTokens: spend.spent}, nil
}

// samePlaybook reports whether two playbooks hold the same items.
func samePlaybook(a, b artefact.Playbook) bool {
	x, _ := json.Marshal(a.Items)
	y, _ := json.Marshal(b.Items)
	return string(x) == string(y)
}

// EvolvableDeployments lists the deployments with consented sessions in
// the window ending now: the ones evolution has evidence to judge.
func (e *Evolution) EvolvableDeployments(ctx context.Context, window time.Duration) ([]string, error) {
	now := e.now()
	return store.ActiveDeployments(ctx, e.DB, now.Add(-window), now)
}

// RecordDecisionRelease records how the release a decision started ended,
// so that a later evolution run can measure what the promoted change did.
func (e *Evolution) RecordDecisionRelease(ctx context.Context, in flow.DecisionReleaseInput) error {
	return store.SetDecisionRelease(ctx, e.DB, in.DecisionID, in.Status, e.now())
}

// RequestTraining signals the deployment's TrainingWorkflow to train now,
// starting it if it is not running.
func (e *Evolution) RequestTraining(ctx context.Context, in flow.RequestTrainingInput) error {
	if e.Temporal == nil {
		return temporal.NewNonRetryableApplicationError("request training: no Temporal client on this worker", "BadInput", nil)
	}
	// The loop sends each step where the deployment's trainer is, as
	// PrepareBatch reads it: nothing to look up here.
	_, err := e.Temporal.SignalWithStartWorkflow(ctx, flow.TrainingWorkflowID(in.Deployment), flow.TrainNowSignal, nil,
		client.StartWorkflowOptions{ID: flow.TrainingWorkflowID(in.Deployment), TaskQueue: flow.TaskQueue},
		flow.TrainingWorkflowName, flow.TrainingInput{Deployment: in.Deployment, Policy: in.Policy})
	if err != nil {
		return fmt.Errorf("signal-with-start training of %s: %w", in.Deployment, err)
	}
	return nil
}

// RollbackVersion makes in.To serve again and returns what served before.
func (e *Evolution) RollbackVersion(ctx context.Context, in flow.RollbackInput) (string, error) {
	from, err := store.RollbackTo(ctx, e.DB, in.Deployment, in.To, in.Reason)
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrCannotServe) {
		return "", temporal.NewNonRetryableApplicationError(err.Error(), "BadData", err)
	}
	if err != nil {
		return "", err
	}
	return from, nil
}

func (e *Evolution) logger() *slog.Logger {
	if e.Logger == nil {
		return slog.Default()
	}
	return e.Logger
}
