package faults

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/flow"
)

// trainedDeployment is the policy deployment `flywheel up` serves and
// trains on its embedded trainer, through the trainer worker.
var trainedDeployment = config.Default().Gateway.PolicyModel

// faultTraining is the training loop the suite starts on its private
// stack: small batches often, so a step is always near; no releases, so
// every step is a plain PrepareBatch ▶ TrainBatch ▶ RegisterCheckpoint;
// and a short heartbeat timeout, so a step on a dead trainer is handed on
// within seconds rather than the default minute.
var faultTraining = flow.TrainingPolicy{
	BatchSize: 16, MaxBatchAge: time.Second, GroupWait: time.Second, PollInterval: 250 * time.Millisecond,
	MaxStaleness: -1, StepTimeout: 2 * time.Minute, StepHeartbeatTimeout: 10 * time.Second, NoRelease: true,
}

// TrainFigures are what a fault in the training path left behind.
type TrainFigures struct {
	// KilledRun is the training run whose TrainBatch was running (attempt
	// KilledAttempt) when its worker was killed, with KilledSamples
	// samples; KilledOutcome its status at the end: "trained" (Temporal
	// retried the step on the restarted worker), "failed" (its samples
	// went back to the queue) or "claimed" (stuck).
	KilledRun     int64  `json:"killed_run"`
	KilledAttempt int32  `json:"killed_attempt"`
	KilledSamples int    `json:"killed_samples"`
	KilledOutcome string `json:"killed_outcome"`
	// Of the killed run's samples: trained into a version, queued again
	// for a later batch, and lost (neither: target 0).
	KilledTrained  int `json:"killed_trained"`
	KilledRequeued int `json:"killed_requeued"`
	KilledLost     int `json:"killed_lost"`
	// ResumeS is the time from the restart to the first run trained at or
	// after the killed one (-1: none in the settle time).
	ResumeS float64 `json:"resume_s"`
	// Runs of the deployment by status at the end; Stuck are still
	// claimed although no step runs (target 0).
	RunsTrained int `json:"runs_trained"`
	RunsFailed  int `json:"runs_failed"`
	RunsStuck   int `json:"runs_stuck"`
	// Versions trained; DuplicateVersions more than one per run, and
	// SamplesTrainedTwice samples in more than one version's lineage
	// (targets 0).
	Versions            int `json:"versions"`
	DuplicateVersions   int `json:"duplicate_versions"`
	SamplesTrainedTwice int `json:"samples_trained_twice"`
	// Samples queued from this fault's sessions, and of those how many
	// trained and how many were still queued at the end.
	Samples        int `json:"samples"`
	SamplesTrained int `json:"samples_trained"`
	SamplesQueued  int `json:"samples_queued"`
}

// startTraining starts the deployment's training loop with faultTraining
// (or leaves the running one), as `flywheel train now` would.
func startTraining(ctx context.Context, st *stack) error {
	c, err := st.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	id := flow.TrainingWorkflowID(trainedDeployment)
	_, err = c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING},
		flow.TrainingWorkflowName, flow.TrainingInput{Deployment: trainedDeployment, Policy: faultTraining})
	if err != nil {
		return fmt.Errorf("start training: %w", err)
	}
	return nil
}

// trainerKill is a trainer worker killed while it ran a TrainBatch.
type trainerKill struct {
	run       int64
	attempt   int32
	samples   []int64
	restarted time.Time
}

// killTrainerInStep waits (up to wait) until the trainer worker runs a
// TrainBatch, SIGKILLs it, and restarts it.
func killTrainerInStep(ctx context.Context, st *stack, wait time.Duration) (*trainerKill, error) {
	c, conn, closeAll, err := st.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	id := flow.TrainingWorkflowID(trainedDeployment)
	deadline := time.Now().Add(wait)
	for {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no TrainBatch started on the trainer worker in %s", wait)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := c.DescribeWorkflowExecution(ctx, id, "")
		if err != nil {
			return nil, fmt.Errorf("describe %s: %w", id, err)
		}
		for _, a := range d.GetPendingActivities() {
			if a.GetActivityType().GetName() != flow.TrainBatchActivity || a.GetState() != enumspb.PENDING_ACTIVITY_STATE_STARTED {
				continue
			}
			// The loop trains one run at a time: the one prepared and
			// still claimed is the one this step trains.
			k := &trainerKill{attempt: a.GetAttempt()}
			err := conn.QueryRow(ctx, `SELECT id, sample_ids FROM training_runs WHERE deployment = $1 AND status = 'claimed'
AND stats ? 'prepared' ORDER BY id DESC LIMIT 1`, trainedDeployment).Scan(&k.run, &k.samples)
			if errors.Is(err, pgx.ErrNoRows) {
				break // it finished meanwhile: wait for the next
			}
			if err != nil {
				return nil, err
			}
			if err := st.trainer.kill(); err != nil {
				return nil, err
			}
			if err := st.startTrainer(ctx); err != nil {
				return nil, err
			}
			k.restarted = time.Now()
			return k, nil
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// settleTraining waits (up to settle) until the killed run is closed, a
// run trained after the restart and nothing of the fault's sessions is
// left queued or claimed, then counts what training left behind.
func settleTraining(ctx context.Context, st *stack, k *trainerKill, prefix string, settle time.Duration) (*TrainFigures, error) {
	conn, err := pgx.Connect(ctx, st.dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	tf := &TrainFigures{KilledRun: k.run, KilledAttempt: k.attempt, KilledSamples: len(k.samples), ResumeS: -1}
	deadline := time.Now().Add(settle)
	for settled := 0; settled < 2 && time.Now().Before(deadline) && ctx.Err() == nil; {
		if err := countTraining(ctx, conn, k, prefix, tf); err != nil {
			return nil, err
		}
		if tf.KilledOutcome != "claimed" && tf.ResumeS >= 0 && tf.RunsStuck == 0 && tf.SamplesQueued == 0 {
			settled++ // twice in a row: late sessions may still queue samples
		} else {
			settled = 0
		}
		sleep(ctx, time.Second)
	}
	return tf, ctx.Err()
}

// countTraining fills tf from Postgres.
func countTraining(ctx context.Context, conn *pgx.Conn, k *trainerKill, prefix string, tf *TrainFigures) error {
	var resumed *time.Time
	err := conn.QueryRow(ctx, `SELECT (SELECT status FROM training_runs WHERE id = $2),
  (SELECT min(finished_at) FROM training_runs WHERE deployment = $1 AND id >= $2 AND status = 'trained'),
  count(*) FILTER (WHERE status = 'trained'), count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE status = 'claimed')
FROM training_runs WHERE deployment = $1`, trainedDeployment, k.run).
		Scan(&tf.KilledOutcome, &resumed, &tf.RunsTrained, &tf.RunsFailed, &tf.RunsStuck)
	if err != nil {
		return fmt.Errorf("count training runs: %w", err)
	}
	if resumed != nil {
		tf.ResumeS = max(resumed.Sub(k.restarted).Seconds(), 0)
	}
	err = conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'used' AND EXISTS (SELECT 1 FROM model_version_lineage l WHERE l.sample_id = ts.id)),
  count(*) FILTER (WHERE status = 'queued')
FROM training_samples ts WHERE id = ANY($1)`, k.samples).Scan(&tf.KilledTrained, &tf.KilledRequeued)
	if err != nil {
		return fmt.Errorf("count the killed run's samples: %w", err)
	}
	tf.KilledLost = tf.KilledSamples - tf.KilledTrained - tf.KilledRequeued
	err = conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT metrics->>'training_run'),
  (SELECT count(*) FROM (SELECT sample_id FROM model_version_lineage l JOIN model_versions v ON v.id = l.version_id
     WHERE v.deployment = $1 GROUP BY sample_id HAVING count(*) > 1) x)
FROM model_versions WHERE deployment = $1 AND metrics ? 'training_run'`, trainedDeployment).
		Scan(&tf.Versions, &tf.DuplicateVersions, &tf.SamplesTrainedTwice)
	if err != nil {
		return fmt.Errorf("count versions: %w", err)
	}
	tf.DuplicateVersions = tf.Versions - tf.DuplicateVersions
	err = conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE ts.status = 'used'), count(*) FILTER (WHERE ts.status = 'queued')
FROM training_samples ts JOIN atdp_steps st ON st.id = ts.step_id
WHERE ts.deployment = $1 AND st.session_id LIKE $2`, trainedDeployment, prefix+"%").
		Scan(&tf.Samples, &tf.SamplesTrained, &tf.SamplesQueued)
	if err != nil {
		return fmt.Errorf("count the fault's samples: %w", err)
	}
	return nil
}
