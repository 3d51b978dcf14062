package activities

import (
	"context"
	"errors"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

const msgVersionsRetired = "model versions retired for a forget request"

// Forget implements ForgetWorkflow's activity.
type Forget struct {
	DB     *pgxpool.Pool
	Logger *slog.Logger
}

// RetireForgotten retires the versions trained on a forget request's data
// and deletes their checkpoints where this worker can reach them.
func (f *Forget) RetireForgotten(ctx context.Context, in flow.ForgetInput) (flow.ForgetResult, error) {
	out, err := store.RetireForgotten(ctx, f.DB, in.RequestID)
	if errors.Is(err, store.ErrNotFound) {
		return flow.ForgetResult{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	if err != nil {
		return flow.ForgetResult{}, err
	}
	removed := 0
	for _, p := range out.Checkpoints {
		if err := os.Remove(p); err == nil {
			removed++
		}
	}
	logger := f.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger.Info(msgVersionsRetired, "request_id", in.RequestID, "retired", out.Affected, "rollbacks", out.Rollbacks, "checkpoints_removed", removed)
	return flow.ForgetResult{Sessions: len(out.Sessions), Retired: out.Affected, Rollbacks: out.Rollbacks, Checkpoints: removed,
		Restart: out.Restart}, nil
}
