package activities

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/workflows"
)

// holdsWeights is a TrainStepper that must never be reached.
type holdsWeights struct{ TrainStepper }

func (holdsWeights) TrainStep(context.Context, *trainer.Batch) (trainer.StepResult, error) {
	panic("trained another deployment's batch")
}

func TestTrainStepRefusesAnotherDeployment(t *testing.T) {
	tr := &Training{Trainer: holdsWeights{}, Deployment: "flywheel-policy"}
	_, err := tr.TrainStep(context.Background(), workflows.TrainStepInput{Deployment: "flywheel-demo", RunID: 1})
	var app *temporal.ApplicationError
	require.True(t, errors.As(err, &app), "got %v", err)
	require.True(t, app.NonRetryable())
	require.Equal(t, "WrongDeployment", app.Type())
	require.Contains(t, err.Error(), `trains "flywheel-policy", not "flywheel-demo"`)
}
