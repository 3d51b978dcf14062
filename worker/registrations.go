package worker

import (
	"log/slog"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/trajectory"
	"github.com/flywheel-ai/flywheel/workflows"
)

// Deps are what the activities of every task queue need; a nil one leaves
// its activities to another worker.
type Deps struct {
	Pool          *pgxpool.Pool
	Host, Compute string
	Logger        *slog.Logger
	Rules         trajectory.Rules
	// Backend lets release gates run candidate and baseline side by side,
	// each deployment on its own engine (a deployment no engine here
	// serves: its offline gates record that nothing was evaluated).
	Backend activities.Completer
	// CheckpointDir is where trainers write versions; BatchDir receives
	// the trainer protocol's batch files. Both are shared with the
	// deployments' trainers.
	CheckpointDir, BatchDir string
	// Temporal lets evolution signal-with-start the training loop.
	Temporal client.Client
	// RewardMin and RewardMax are the gateway's reward range, which the
	// live gates' tests need.
	RewardMin, RewardMax float64
	// SWE runs SWE rollouts (nil: not on this worker).
	SWE *activities.SWEActivities
	// Reflector lets evolution ask deployments' reflectors (nil: the
	// cheap layers propose nothing on this worker).
	Reflector activities.Reflector
}

// Registrations says which workflows and activities run on which task
// queue: the one place every worker's registrations live. Activities are
// registered by method value under their method's name, the name the
// workflows schedule them by; TrainBatch keeps the trainer protocol's
// name, which a trainer in another language implements.
func Registrations(d Deps) map[string]Registrar {
	ping := &activities.Ping{DB: d.Pool, Worker: d.Host, Compute: d.Compute}
	session := &activities.Session{DB: d.Pool, Rules: d.Rules, Logger: d.Logger}
	release := &activities.Release{DB: d.Pool, Backend: d.Backend, Logger: d.Logger, RewardMin: d.RewardMin, RewardMax: d.RewardMax}
	training := &activities.Training{DB: d.Pool, CheckpointDir: d.CheckpointDir, BatchDir: d.BatchDir, Logger: d.Logger}
	evolve := &activities.Evolution{DB: d.Pool, Temporal: d.Temporal, Redactor: d.Rules.Redactor, Logger: d.Logger,
		Reflector: d.Reflector, Backend: d.Backend}
	forget := &activities.Forget{DB: d.Pool, Logger: d.Logger}
	sessions := func(r tworker.Registry) {
		r.RegisterWorkflowWithOptions(workflows.SessionWorkflow, workflow.RegisterOptions{Name: flow.SessionWorkflowName})
		register(r, session.AssembleTrajectory, session.EnqueueSamples, session.EndSession)
	}
	return map[string]Registrar{
		flow.SessionTaskQueue: sessions,
		flow.TaskQueue: func(r tworker.Registry) {
			r.RegisterWorkflowWithOptions(workflows.PingWorkflow, workflow.RegisterOptions{Name: flow.PingWorkflowName})
			register(r, ping.Ping)
			// Sessions started on this queue before they had their own
			// (continue-as-new keeps a workflow's queue) still finish.
			sessions(r)
			r.RegisterWorkflowWithOptions(workflows.ReleaseWorkflow, workflow.RegisterOptions{Name: flow.ReleaseWorkflowName})
			register(r, release.BeginRelease, release.SetReleasePhase, release.EvaluateGate, release.FinishRelease, release.SyncWeights)
			r.RegisterWorkflowWithOptions(workflows.WatchdogWorkflow, workflow.RegisterOptions{Name: flow.WatchdogWorkflowName})
			register(r, release.WatchServing)
			r.RegisterWorkflowWithOptions(workflows.TrainingWorkflow, workflow.RegisterOptions{Name: flow.TrainingWorkflowName})
			register(r, training.CheckBatch, training.ClaimBatch, training.PrepareBatch, training.RegisterCheckpoint, training.FailTrainingRun,
				training.PrunableStates, training.MarkStatesPruned)
			r.RegisterWorkflowWithOptions(workflows.EvolutionWorkflow, workflow.RegisterOptions{Name: flow.EvolutionWorkflowName})
			r.RegisterWorkflowWithOptions(workflows.EvolutionSweepWorkflow, workflow.RegisterOptions{Name: flow.EvolutionSweepWorkflowName})
			register(r, evolve.ComputeEvidence, evolve.RecordDecision, evolve.ProposeArtefact, evolve.RecordDecisionRelease,
				evolve.RequestTraining, evolve.RollbackVersion, evolve.EvolvableDeployments)
			r.RegisterWorkflowWithOptions(workflows.ForgetWorkflow, workflow.RegisterOptions{Name: flow.ForgetWorkflowName})
			register(r, forget.RetireForgotten)
		},
		// Every worker can drive a Tinker trainer: the service holds the
		// weights, the step needs only the batch and checkpoint files.
		deployment.TinkerQueue: func(r tworker.Registry) {
			tinker := &activities.TinkerTraining{Logger: d.Logger}
			r.RegisterActivityWithOptions(tinker.TrainBatch, activity.RegisterOptions{Name: flow.TrainBatchActivity})
			register(r, tinker.PruneStates)
		},
		flow.SandboxTaskQueue: func(r tworker.Registry) {},
		flow.SWETaskQueue: func(r tworker.Registry) {
			if d.SWE != nil {
				workflows.RegisterSWEWorkflows(r)
				RegisterSWE(r, d.SWE)
			}
		},
	}
}

// RegisterSWE registers the SWE rollout activities of a.
func RegisterSWE(r tworker.ActivityRegistry, a *activities.SWEActivities) {
	register(r, a.SWECreateSessions, a.SWEAcquire, a.SWEStep, a.SWEGrade, a.SWERecordReward, a.SWERelease)
}

func register(r tworker.ActivityRegistry, fns ...any) {
	for _, fn := range fns {
		r.RegisterActivity(fn)
	}
}
