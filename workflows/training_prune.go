package workflows

import (
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// trainingChangePruneStates: a run, before it continues as new, deletes
// the training states no step can start from again.
const trainingChangePruneStates = "training-prune-states"

// pruneStates deletes, on the deployment's Tinker service, the training
// states the loop no longer needs: of versions rolled back or retired,
// candidates a newer one replaced before release, and superseded versions
// but the newest few (store.PrunableStates). It runs where a run
// continues as new (every StepsPerRun steps), with no step in flight and
// the release settled; the loop's own versions (serving, the line's start
// and head, the pending candidate) and the anchor are kept, and a step
// asked to start from a pruned version starts from one that has its state
// (store.TrainableBase). Best effort: a
// pass that fails is logged and the next run's pass tries again; the loop
// waits on it a minute or two at most.
func (r *trainingRun) pruneStates(ctx workflow.Context) {
	if workflow.GetVersion(ctx, trainingChangePruneStates, workflow.DefaultVersion, 1) < 1 {
		return
	}
	logger := workflow.GetLogger(ctx)
	keep := []string{r.st.Serving, r.st.From, r.st.LastVersion, r.pending, r.base()}
	slices.Sort(keep)
	keep = slices.DeleteFunc(slices.Compact(keep), func(v string) bool { return v == "" })
	// Short, few tries: a pass that cannot run now is the next run's.
	light := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumAttempts: 2},
	})
	var list flow.PrunableStatesOutput
	if err := workflow.ExecuteLocalActivity(light, aTraining.PrunableStates, flow.PrunableStatesInput{Deployment: r.in.Deployment, Keep: keep}).Get(ctx, &list); err != nil {
		logger.Warn("prunable training states", "deployment", r.in.Deployment, "error", err)
		return
	}
	if len(list.Versions) == 0 || list.Trainer == nil {
		return
	}
	prune := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// The queue its train steps go to (the trainer's settings fill
		// in the Tinker queue when the deployment names none).
		TaskQueue:              list.Trainer.Queue,
		ScheduleToStartTimeout: time.Minute,
		StartToCloseTimeout:    2 * time.Minute,
		HeartbeatTimeout:       time.Minute,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 5 * time.Second, MaximumAttempts: 2, NonRetryableErrorTypes: []string{"BadInput"}},
	})
	var out flow.PruneStatesOutput
	if err := workflow.ExecuteActivity(prune, aTinker.PruneStates, flow.PruneStatesInput{
		Deployment: r.in.Deployment, Trainer: list.Trainer, Versions: list.Versions,
	}).Get(ctx, &out); err != nil {
		logger.Warn("prune training states", "deployment", r.in.Deployment, "error", err)
		return
	}
	if err := workflow.ExecuteLocalActivity(light, aTraining.MarkStatesPruned, flow.MarkStatesPrunedInput{Versions: out.Pruned}).Get(ctx, nil); err != nil {
		logger.Warn("mark training states pruned", "deployment", r.in.Deployment, "error", err)
	}
}
