package activities

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/trainer"
)

// holdsWeights is a TrainStepper that must never be reached.
type holdsWeights struct{ TrainStepper }

func (holdsWeights) TrainStep(context.Context, *trainer.Batch) (trainer.StepResult, error) {
	panic("trained another deployment's batch")
}

func TestTrainStepRefusesAnotherDeployment(t *testing.T) {
	tr := &Training{Trainer: holdsWeights{}, Deployment: "flywheel-policy"}
	_, err := tr.TrainStep(context.Background(), flow.TrainStepInput{Deployment: "flywheel-demo", RunID: 1})
	var app *temporal.ApplicationError
	require.True(t, errors.As(err, &app), "got %v", err)
	require.True(t, app.NonRetryable())
	require.Equal(t, "WrongDeployment", app.Type())
	require.Contains(t, err.Error(), `trains "flywheel-policy", not "flywheel-demo"`)
}

// TestRefusedStepEndsItsRun: a step refused for another deployment's
// batch fails its run, so runs do not pile up claimed, and leaves the
// samples queued for a worker that can train them.
func TestRefusedStepEndsItsRun(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	queueSamples(t, db, "acme", "dep", "dep@v1", 2, 1)
	acts := &Training{DB: db, Trainer: holdsWeights{}, Deployment: "other"}
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k", BatchSize: 2, MaxStaleness: 4})
	require.NoError(t, err)
	_, err = acts.TrainStep(ctx, flow.TrainStepInput{Deployment: "dep", RunID: claim.RunID})
	require.ErrorContains(t, err, `trains "other", not "dep"`)
	var status, reason string
	require.NoError(t, db.QueryRow(ctx, `SELECT status, stats->>'error' FROM training_runs WHERE id = $1`, claim.RunID).Scan(&status, &reason))
	require.Equal(t, "failed", status)
	require.Contains(t, reason, "not \"dep\"")
	q, err := acts.CheckBatch(ctx, flow.CheckBatchInput{Deployment: "dep"})
	require.NoError(t, err)
	require.Equal(t, 2, q.Queued, "the samples wait for a trainer of their deployment")
}
