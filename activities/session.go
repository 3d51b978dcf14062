package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trajectory"
)

// Log messages are constants; everything dynamic is an attribute.
const (
	msgTrajectoryAssembled = "trajectory assembled"
	msgSamplesEnqueued     = "training samples enqueued"
)

// Session implements SessionWorkflow's activities.
type Session struct {
	DB *pgxpool.Pool
	// Rules build the steps, as the export does (gateway.reward_weights,
	// gateway.discount, gateway.redact_patterns).
	Rules  trajectory.Rules
	Logger *slog.Logger
}

// AssembleTrajectory reads the session's interactions and rewards, builds
// redacted ATDP steps with returns and eligibility, and writes them as one
// trajectory. A retry with the same key returns what the first attempt wrote.
func (s *Session) AssembleTrajectory(ctx context.Context, in flow.AssembleInput) (flow.AssembleOutput, error) {
	if in.Key == "" || in.SessionID == "" || in.TenantID == "" {
		return flow.AssembleOutput{}, temporal.NewNonRetryableApplicationError("assemble: session, tenant and key are required", "BadInput", nil)
	}
	rules := s.Rules
	if in.Discount != 0 { // the session's own γ (SessionInput.Discount) wins over the configured one
		rules.Discount = in.Discount
	}
	if rules.Discount == 0 {
		rules.Discount = atdp.DefaultDiscount
	}
	if rules.Discount < 0 || rules.Discount > 1 {
		return flow.AssembleOutput{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("assemble: discount %v must be in (0, 1]", rules.Discount), "BadInput", nil)
	}
	sess, err := store.SessionForAssembly(ctx, s.DB, in.TenantID, in.SessionID)
	if errors.Is(err, store.ErrNotFound) {
		return flow.AssembleOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	if err != nil {
		return flow.AssembleOutput{}, err
	}
	inter, err := store.SessionInteractions(ctx, s.DB, in.TenantID, in.SessionID)
	if err != nil {
		return flow.AssembleOutput{}, err
	}
	rewards, err := store.SessionRewards(ctx, s.DB, in.TenantID, in.SessionID)
	if err != nil {
		return flow.AssembleOutput{}, err
	}
	steps, total, err := trajectory.Build(sess, inter, rewards, rules, nil)
	if err != nil {
		// Stored rows that do not decode will not decode on a retry either.
		return flow.AssembleOutput{}, temporal.NewNonRetryableApplicationError("assemble: "+err.Error(), "BadData", err)
	}
	t := store.NewTrajectory{TenantID: in.TenantID, SessionID: in.SessionID, Key: in.Key, Discount: rules.Discount, TotalReward: total}
	for i := range steps {
		row, err := newStep(&steps[i])
		if err != nil {
			return flow.AssembleOutput{}, err
		}
		t.Steps = append(t.Steps, row)
	}
	id, written, existed, err := store.InsertTrajectory(ctx, s.DB, t)
	if err != nil {
		return flow.AssembleOutput{}, err
	}
	out := flow.AssembleOutput{TrajectoryID: id, Steps: len(written), Ineligible: map[string]int{}}
	for _, w := range written {
		if w.Eligible {
			out.Eligible++
		} else {
			out.Ineligible[w.Reason]++
		}
	}
	if existed {
		total, err = store.TrajectoryTotal(ctx, s.DB, id)
		if err != nil {
			return flow.AssembleOutput{}, err
		}
	}
	if total != nil {
		out.TotalReward, out.HasReward = *total, true
	}
	s.logger().Info(msgTrajectoryAssembled, "session_id", in.SessionID, "trajectory_id", id, "steps", out.Steps,
		"eligible", out.Eligible, "existed", existed)
	return out, nil
}

// newStep is a built step as the store writes it.
// It is validated here, once, where it is stored; the export builds the
// same steps by the same code and does not pay for the schema again.
func newStep(st *trajectory.Step) (store.NewStep, error) {
	if err := st.ATDP.Validate(); err != nil {
		return store.NewStep{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("step %d: %v", st.ATDP.Metadata.StepIndex, err), "BadData", err)
	}
	raw, err := json.Marshal(st.ATDP)
	if err != nil {
		return store.NewStep{}, fmt.Errorf("encode step %d: %w", st.ATDP.Metadata.StepIndex, err)
	}
	reds, err := json.Marshal(st.ATDP.Metadata.Redactions)
	if err != nil {
		return store.NewStep{}, fmt.Errorf("encode step %d: %w", st.ATDP.Metadata.StepIndex, err)
	}
	return store.NewStep{InteractionID: st.InteractionID, Index: st.ATDP.Metadata.StepIndex, Step: raw,
		Reward: st.ATDP.Reward.Merged, Return: st.ATDP.Reward.Return, Eligible: st.Eligible(), Reason: st.Reason(), Redactions: reds}, nil
}

// EnqueueSamples queues the trajectory's eligible steps; queueing is keyed
// by step (and by interaction), so a retry adds nothing.
func (s *Session) EnqueueSamples(ctx context.Context, in flow.EnqueueInput) (flow.EnqueueOutput, error) {
	q, err := store.EnqueueSamples(ctx, s.DB, in.TenantID, in.TrajectoryID)
	if err != nil {
		return flow.EnqueueOutput{}, err
	}
	s.logger().Info(msgSamplesEnqueued, "trajectory_id", in.TrajectoryID, "enqueued", q.Queued, "rescored", q.Rescored,
		"after_training", q.AfterTraining, "eligible", q.Eligible)
	return flow.EnqueueOutput{Enqueued: q.Queued, AlreadyQueued: q.Eligible - q.Queued, EligibleSteps: q.Eligible,
		Rescored: q.Rescored, AfterTraining: q.AfterTraining}, nil
}

// EndSession marks the session row ended.
func (s *Session) EndSession(ctx context.Context, in flow.EndSessionInput) error {
	return store.CloseSession(ctx, s.DB, in.TenantID, in.SessionID)
}

func (s *Session) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}
