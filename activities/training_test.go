package activities

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

// TestFormAdvantagesUsesTheTrainersEstimator: online advantages come from
// the configured estimator (the demo's Dr. GRPO r − mean), not a fixed
// (r − mean)/std, and singletons continue the stored per-task baselines.
func TestFormAdvantagesUsesTheTrainersEstimator(t *testing.T) {
	batch := func() []trainer.Sample {
		s := func(group, task string, r float64) trainer.Sample {
			return trainer.Sample{GroupID: group, TaskID: task, Reward: r}
		}
		return []trainer.Sample{
			s("g1", "a", 0.75), s("g1", "a", 0.25), // a group
			s("", "a", 1),                        // singleton with a known task: 1 − 0.5
			s("g2", "b", 0.3), s("g2", "b", 0.3), // all equal: no signal
		}
	}
	advs := func(ss []trainer.Sample) []float64 {
		out := make([]float64, len(ss))
		for i, s := range ss {
			out[i] = *s.Advantage
		}
		return out
	}
	stored := map[string]float64{"a": 0.5, "b": 0.1}

	dr := batch()
	adv, err := formAdvantages(dr, trainer.AdvantageConfig{Estimator: trainer.AdvMean, BaselineRate: 0.5}, stored)
	require.NoError(t, err)
	require.Equal(t, trainer.AdvMean, adv.Estimator)
	require.InDeltaSlice(t, []float64{0.25, -0.25, 0.5, 0, 0}, advs(dr), 1e-12)
	require.Equal(t, 3, adv.Groups)
	require.Equal(t, 1, adv.BaselineSamples)
	require.Equal(t, 1, adv.ZeroSignalGroups)
	require.Equal(t, []int{3, 4}, adv.Flat, "the all-equal group's samples carry no signal")
	require.Equal(t, 3, adv.Observed["a"])
	// a: 0.5 → 0.75 (the singleton's 1) → 0.75 → 0.5 (the group's 0.75, 0.25).
	require.InDelta(t, 0.5, adv.Baselines["a"], 1e-12)
	require.InDelta(t, 0.1+0.5*(0.3-0.1)+0.25*(0.3-0.1), adv.Baselines["b"], 1e-12, "b moved toward the group's rewards")

	grpo := batch()
	_, err = formAdvantages(grpo, trainer.AdvantageConfig{Estimator: trainer.AdvMeanStd}, stored)
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{1, -1}, advs(grpo)[:2], 1e-12, "GRPO divides by the group's std")

	// A group that earned the top reward throughout is trained with the
	// configured perfect advantage: it is not flat.
	top := []trainer.Sample{{GroupID: "g", TaskID: "a", Reward: 1}, {GroupID: "g", TaskID: "a", Reward: 1}}
	adv, err = formAdvantages(top, trainer.AdvantageConfig{Estimator: trainer.AdvMean, PerfectAdvantage: 0.2}, stored)
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{0.2, 0.2}, advs(top), 1e-12)
	require.Equal(t, 1, adv.PerfectGroups)
	require.Empty(t, adv.Flat)

	// With no history at all, singletons are compared with the batch mean:
	// not a silent zero, and reported.
	solo := []trainer.Sample{{TaskID: "x", Reward: 1}, {TaskID: "y", Reward: 0}}
	adv, err = formAdvantages(solo, trainer.AdvantageConfig{}, nil)
	require.NoError(t, err)
	require.InDeltaSlice(t, []float64{0.5, -0.5}, advs(solo), 1e-12)
	require.Equal(t, 2, adv.NoBaseline)
}

// queueSamples makes n rewarded one-step sessions and queues them through
// the session activities, as the SessionWorkflow would.
func queueSamples(t *testing.T, db *pgxpool.Pool, tenant, dep, version string, n int, reward float64) {
	t.Helper()
	ctx := context.Background()
	acts := &Session{DB: db}
	for i := 0; i < n; i++ {
		sid := fmt.Sprintf("%s-%s-%s-%d", dep, version, tenant, trafficSeq.Add(1))
		ids := seedSession(t, db, tenant, sid, dep, []seedInteraction{{Status: "ok", Prompt: "hi", Completion: "yo", Tokens: 3, Version: version}})
		seedReward(t, db, tenant, sid, &ids[0], reward, true)
		a, err := acts.AssembleTrajectory(ctx, flow.AssembleInput{SessionID: sid, TenantID: tenant, Key: sid, Discount: 1})
		require.NoError(t, err)
		_, err = acts.EnqueueSamples(ctx, flow.EnqueueInput{TrajectoryID: a.TrajectoryID, TenantID: tenant})
		require.NoError(t, err)
	}
}

// trainAs does what the deployment's trainer does with a prepared batch:
// it writes the output version's checkpoint where the input says and
// answers with it.
func trainAs(t *testing.T, tb flow.TrainBatchInput) flow.TrainBatchOutput {
	t.Helper()
	n, ok := store.VersionNumber(tb.Output.Version)
	require.True(t, ok, tb.Output.Version)
	m, err := trainer.NewModel(trainer.ModelConfig{Context: 64, Layers: 1, Heads: 2, DModel: 16}, 7)
	require.NoError(t, err)
	path, err := trainer.CheckpointDir{Dir: tb.Output.Dir}.Save(m, n, map[string]string{"deployment": tb.Deployment})
	require.NoError(t, err)
	return flow.TrainBatchOutput{Version: tb.Output.Version, Samples: tb.Batch.Samples, Loss: 0.5,
		Checkpoint: flow.CheckpointRef{Version: tb.Output.Version, URI: fileURI(path), Format: flow.CheckpointFlywheelPolicy}}
}

// TestRegisterCheckpointRecordsCandidateWithLineage: a claimed run,
// prepared and trained, becomes the candidate version with every sample
// of its batch in its lineage; its samples are used and its singletons
// move their task's baseline. Claiming and registering again are no-ops.
func TestRegisterCheckpointRecordsCandidateWithLineage(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	queueSamples(t, db, "acme", "dep", "dep@v1", 3, 1)
	queueSamples(t, db, "acme", "dep", "dep@v1", 2, -1)
	dir := t.TempDir()
	acts := &Training{DB: db, CheckpointDir: filepath.Join(dir, "ckpt"), BatchDir: filepath.Join(dir, "batches")}

	q, err := acts.CheckBatch(ctx, flow.CheckBatchInput{Deployment: "dep"})
	require.NoError(t, err)
	require.Equal(t, 5, q.Queued)

	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k1", BatchSize: 4, MaxStaleness: 4})
	require.NoError(t, err)
	require.Equal(t, 4, claim.Samples)
	require.Equal(t, "dep@v1", claim.BaseVersion)
	again, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k1", BatchSize: 4, MaxStaleness: 4})
	require.NoError(t, err)
	require.Equal(t, claim, again, "a retried claim returns the same run")

	tb, err := acts.PrepareBatch(ctx, flow.PrepareBatchInput{Deployment: "dep", RunID: claim.RunID, Base: claim.BaseVersion})
	require.NoError(t, err)
	in := flow.RegisterCheckpointInput{Deployment: "dep", RunID: claim.RunID, Trained: trainAs(t, tb)}
	out, err := acts.RegisterCheckpoint(ctx, in)
	require.NoError(t, err)
	require.Equal(t, "dep@v2", out.Version)
	require.Equal(t, 4, out.Samples)
	require.Equal(t, 4, out.Baseline, "ungrouped samples are scored against the task baseline")

	var parent, status, ckpt string
	require.NoError(t, db.QueryRow(ctx, `SELECT parent_version, status, checkpoint_path FROM model_versions WHERE id = 'dep@v2'`).Scan(&parent, &status, &ckpt))
	require.Equal(t, "dep@v1", parent)
	require.Equal(t, "candidate", status)
	_, _, meta, err := trainer.LoadCheckpoint(ckpt)
	require.NoError(t, err)
	require.Equal(t, "2", meta[trainer.MetaVersion])
	var lineage, used, queued int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM model_version_lineage WHERE version_id = 'dep@v2' AND tenant_id = 'acme'`).Scan(&lineage))
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'used'), count(*) FILTER (WHERE status = 'queued') FROM training_samples`).Scan(&used, &queued))
	require.Equal(t, 4, lineage)
	require.Equal(t, 4, used)
	require.Equal(t, 1, queued)
	base, err := store.TaskBaselines(ctx, db, "dep")
	require.NoError(t, err)
	require.Contains(t, base, "task-a")
	require.NoFileExists(t, filepath.Join(dir, "batches", "dep", fmt.Sprintf("run-%012d.parquet", claim.RunID)), "a committed step's batch is in the lineage")

	// A retry after the commit (the workflow did not see the answer)
	// answers the committed version and records nothing twice.
	out2, err := acts.RegisterCheckpoint(ctx, in)
	require.NoError(t, err)
	require.Equal(t, "dep@v2", out2.Version)
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM model_version_lineage WHERE version_id = 'dep@v2'`).Scan(&lineage))
	require.Equal(t, 4, lineage)
	_, err = os.Stat(ckpt)
	require.NoError(t, err)
}

func TestClaimDropsSamplesStalerThanEta(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v10")
	queueSamples(t, db, "acme", "dep", "dep@v5", 2, 1) // 5 behind: stale at η = 4
	queueSamples(t, db, "acme", "dep", "dep@v6", 1, 1) // 4 behind: kept
	acts := &Training{DB: db}
	// The check counts what the claim will keep, so a loop waits for a
	// full batch of fresh samples instead of training on a sliver.
	q, err := acts.CheckBatch(ctx, flow.CheckBatchInput{Deployment: "dep", MaxStaleness: 4, FreshOnly: true})
	require.NoError(t, err)
	require.Equal(t, 1, q.Queued)
	q, err = acts.CheckBatch(ctx, flow.CheckBatchInput{Deployment: "dep"})
	require.NoError(t, err)
	require.Equal(t, 3, q.Queued, "without FreshOnly (older histories) every queued sample counts")
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k", BatchSize: 10, MaxStaleness: 4})
	require.NoError(t, err)
	require.Equal(t, 2, claim.DroppedStale)
	require.Equal(t, 1, claim.Samples)
	var dropped int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM training_samples WHERE status = 'dropped_stale'`).Scan(&dropped))
	require.Equal(t, 2, dropped)
}

func TestClaimTakesWholeGroups(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	queueSamples(t, db, "acme", "dep", "dep@v1", 6, 1)
	ids, err := pgx.CollectRows(must(db.Query(ctx, `SELECT id FROM training_samples ORDER BY created_at, id`)), pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, 6)
	// g1 starts first and ends late; g2 sits between its members.
	for i, g := range []string{"g1", "g2", "g2", "g1", "g1", ""} {
		_, err := db.Exec(ctx, `UPDATE training_samples SET group_id = $1 WHERE id = $2`, g, ids[i])
		require.NoError(t, err)
	}
	acts := &Training{DB: db}
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k", BatchSize: 2, MaxStaleness: 4})
	require.NoError(t, err)
	require.Equal(t, 3, claim.Samples, "the whole first group, though it is larger than the batch")
	_, samples, err := store.LoadRun(ctx, db, claim.RunID)
	require.NoError(t, err)
	for _, s := range samples {
		require.Equal(t, "g1", s.GroupID)
	}
	next, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k2", BatchSize: 3, MaxStaleness: 4})
	require.NoError(t, err)
	require.Equal(t, 3, next.Samples, "g2 and the singleton")
}

// TestClaimWaitsForTheRestOfAGroup: a GRPO group of four sessions with two
// queued is neither counted nor claimed until its other members arrive, or
// until it has waited GroupWait (a member may never come).
func TestClaimWaitsForTheRestOfAGroup(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	queueSamples(t, db, "acme", "dep", "dep@v1", 5, 1)
	ids, err := pgx.CollectRows(must(db.Query(ctx, `SELECT id FROM training_samples ORDER BY created_at, id`)), pgx.RowTo[int64])
	require.NoError(t, err)
	for i, g := range []string{"g4", "g4", "g2", "g2", ""} {
		size := map[string]int{"g4": 4, "g2": 2, "": 1}[g]
		_, err := db.Exec(ctx, `UPDATE training_samples SET group_id = $1, group_size = $2 WHERE id = $3`, g, size, ids[i])
		require.NoError(t, err)
	}
	acts := &Training{DB: db}
	wait := time.Minute
	q, err := acts.CheckBatch(ctx, flow.CheckBatchInput{Deployment: "dep", MaxStaleness: 4, FreshOnly: true, GroupWait: wait})
	require.NoError(t, err)
	require.Equal(t, 3, q.Queued, "g4 has two of its four sessions: not counted")
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k1", BatchSize: 10, MaxStaleness: 4, GroupWait: wait})
	require.NoError(t, err)
	require.Equal(t, 3, claim.Samples, "the whole g2 and the singleton, not half of g4")
	_, err = db.Exec(ctx, `UPDATE training_samples SET status = 'used' WHERE id = ANY(SELECT unnest(sample_ids) FROM training_runs WHERE id = $1)`, claim.RunID)
	require.NoError(t, err)

	_, err = db.Exec(ctx, `UPDATE training_samples SET created_at = now() - interval '2 minutes' WHERE group_id = 'g4'`)
	require.NoError(t, err)
	q, err = acts.CheckBatch(ctx, flow.CheckBatchInput{Deployment: "dep", MaxStaleness: 4, FreshOnly: true, GroupWait: wait})
	require.NoError(t, err)
	require.Equal(t, 2, q.Queued, "after the wait the partial group trains")
	claim, err = acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k2", BatchSize: 10, MaxStaleness: 4, GroupWait: wait})
	require.NoError(t, err)
	require.Equal(t, 2, claim.Samples)
}

// TestClaimKeepsTenantsGroupsApart: group ids are each tenant's own names,
// so two tenants' "g" of size 2 with one session each are two partial
// groups, neither ready before the wait, and never one GRPO group.
func TestClaimKeepsTenantsGroupsApart(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedTenant(t, db, "globex", true)
	seedVersions(t, db, "dep", "dep@v1")
	queueSamples(t, db, "acme", "dep", "dep@v1", 1, 1)
	queueSamples(t, db, "globex", "dep", "dep@v1", 1, 0)
	_, err := db.Exec(ctx, `UPDATE training_samples SET group_id = 'g', group_size = 2`)
	require.NoError(t, err)
	acts := &Training{DB: db}
	wait := time.Minute
	q, err := acts.CheckBatch(ctx, flow.CheckBatchInput{Deployment: "dep", MaxStaleness: 4, FreshOnly: true, GroupWait: wait})
	require.NoError(t, err)
	require.Equal(t, 0, q.Queued, "each tenant's g has one of its two sessions")

	_, err = db.Exec(ctx, `UPDATE training_samples SET created_at = now() - interval '2 minutes'`)
	require.NoError(t, err)
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k", BatchSize: 10, MaxStaleness: 4, GroupWait: wait})
	require.NoError(t, err)
	require.Equal(t, 2, claim.Samples)
	_, samples, err := store.LoadRun(ctx, db, claim.RunID)
	require.NoError(t, err)
	groups := map[string]bool{}
	for _, s := range samples {
		groups[rowOf(s).GroupID] = true
	}
	require.Equal(t, map[string]bool{"acme/g": true, "globex/g": true}, groups, "the trainer normalises each tenant's group alone")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestRegisteredStepMarksFlatGroups: a GRPO group whose answers all
// scored the same teaches nothing; its steps say filtered_group once the
// step is registered.
func TestRegisteredStepMarksFlatGroups(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	queueSamples(t, db, "acme", "dep", "dep@v1", 2, 1)
	queueSamples(t, db, "acme", "dep", "dep@v1", 1, 0)
	var ids []int64
	require.NoError(t, db.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM training_samples`).Scan(&ids))
	for i, g := range []string{"flat", "flat", "mixed"} {
		_, err := db.Exec(ctx, `UPDATE training_samples SET group_id = $1, group_size = $2 WHERE id = $3`, g, map[string]int{"flat": 2, "mixed": 1}[g], ids[i])
		require.NoError(t, err)
	}
	dir := t.TempDir()
	acts := &Training{DB: db, CheckpointDir: filepath.Join(dir, "ckpt"), BatchDir: filepath.Join(dir, "batches")}
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k", BatchSize: 8, MaxStaleness: 4})
	require.NoError(t, err)
	require.Equal(t, 3, claim.Samples)
	tb, err := acts.PrepareBatch(ctx, flow.PrepareBatchInput{Deployment: "dep", RunID: claim.RunID, Base: claim.BaseVersion})
	require.NoError(t, err)
	_, err = acts.RegisterCheckpoint(ctx, flow.RegisterCheckpointInput{Deployment: "dep", RunID: claim.RunID, Trained: trainAs(t, tb)})
	require.NoError(t, err)
	var flat int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM atdp_steps s JOIN training_samples ts ON ts.step_id = s.id
		WHERE s.ineligible_reason = 'filtered_group' AND ts.group_id = 'flat'`).Scan(&flat))
	require.Equal(t, 2, flat)
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM atdp_steps WHERE ineligible_reason = 'filtered_group'`).Scan(&flat))
	require.Equal(t, 2, flat, "the singleton is scored against its task's baseline: not flat")
}

// TestTrainerProtocolPreparesAndRegisters: PrepareBatch writes the run as
// the protocol's Parquet batch with the estimator's advantages and
// reserves a version no other run gets; RegisterCheckpoint records only
// the reserved version, and not at all when a sample of the batch was
// forgotten while it trained.
func TestTrainerProtocolPreparesAndRegisters(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedServingWithSamples(t, db, "dep@v1")
	// The deployment names its base model: the trainer is told what to
	// load when no checkpoint of it is stored.
	// Its trainer names the queue its steps go to and the advantage
	// estimator the batch is prepared with.
	_, err := db.Exec(ctx, `UPDATE deployments SET backend = 'upstream',
		config = '{"base_url": "http://vllm:8000/v1", "base_model": "Qwen/Qwen3-8B", "tokenizer": "Qwen/Qwen3-8B-tok",
			"trainer": {"kind": "temporal", "queue": "dep-gpu", "advantage": {"estimator": "mean"}}}' WHERE name = 'dep'`)
	require.NoError(t, err)
	dir := t.TempDir()
	acts := &Training{DB: db, CheckpointDir: filepath.Join(dir, "ckpt"), BatchDir: filepath.Join(dir, "batches")}
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k1", BatchSize: 2, MaxStaleness: 4})
	require.NoError(t, err)
	in := flow.PrepareBatchInput{Deployment: "dep", RunID: claim.RunID, Base: "dep@v1",
		Algorithm: flow.TrainAlgorithm{MaxStaleness: 4}}
	tb, err := acts.PrepareBatch(ctx, in)
	require.NoError(t, err)
	require.Equal(t, flow.TrainerProtocol, tb.Protocol)
	require.Equal(t, "dep@v2", tb.Output.Version)
	require.Equal(t, filepath.Join(dir, "ckpt", "dep"), tb.Output.Dir)
	require.Equal(t, "grpo", tb.Algo.Objective)
	require.Equal(t, "dep-gpu", tb.TaskQueue)
	require.Nil(t, tb.Trainer, "a Temporal trainer is told nothing of its settings")
	require.Equal(t, flow.CheckpointRef{Version: "dep@v1", Model: "Qwen/Qwen3-8B", Tokenizer: "Qwen/Qwen3-8B-tok"}, tb.Base,
		"v1 has no stored checkpoint: the deployment's base model")
	path, err := localPath(tb.Batch.URI)
	require.NoError(t, err)
	meta, rows, err := parquetbatch.Read(path)
	require.NoError(t, err)
	require.Equal(t, "dep@v2", meta["flywheel.candidate"])
	require.Len(t, rows, 2)
	require.Equal(t, 2, tb.Batch.Samples)
	run, samples, err := store.LoadRun(ctx, db, claim.RunID)
	require.NoError(t, err)
	require.Equal(t, trainer.AdvMean, run.Prepared.Stats["advantage_estimator"])
	for i, r := range rows {
		require.Equal(t, samples[i].ID, r.SampleID)
		require.Equal(t, samples[i].CompletionTokenIDs, r.CompletionIDs)
		require.Equal(t, samples[i].Logprobs, r.Logprobs)
		require.Equal(t, int64(1), r.Versions[0], "the behaviour version of every token")
		require.Equal(t, samples[i].Reward, r.Reward)
	}
	again, err := acts.PrepareBatch(ctx, in)
	require.NoError(t, err)
	require.Equal(t, "dep@v2", again.Output.Version, "a retried prepare keeps the run's version")

	// Another run reserves the next number, though v2 is not committed.
	claim2, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k2", BatchSize: 2, MaxStaleness: 4})
	require.NoError(t, err)
	tb2, err := acts.PrepareBatch(ctx, flow.PrepareBatchInput{Deployment: "dep", RunID: claim2.RunID, Base: "dep@v2"})
	require.NoError(t, err)
	require.Equal(t, "dep@v3", tb2.Output.Version)

	adapter := filepath.Join(tb.Output.Dir, "adapter")
	require.NoError(t, os.MkdirAll(adapter, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(adapter, "adapter_config.json"), []byte(`{}`), 0o644))
	ckpt := "file://" + adapter
	_, err = acts.RegisterCheckpoint(ctx, flow.RegisterCheckpointInput{Deployment: "dep", RunID: claim.RunID,
		Trained: flow.TrainBatchOutput{Version: "dep@v9", Checkpoint: flow.CheckpointRef{URI: ckpt}}})
	require.ErrorContains(t, err, `the trainer answered version "dep@v9"; the run's candidate is "dep@v2"`)

	// Run 2's batch loses a sample to a forget while it trains.
	_, err = db.Exec(ctx, `DELETE FROM training_samples WHERE id = $1`, rowsOf(t, tb2)[0].SampleID)
	require.NoError(t, err)
	_, err = acts.RegisterCheckpoint(ctx, flow.RegisterCheckpointInput{Deployment: "dep", RunID: claim2.RunID,
		Trained: flow.TrainBatchOutput{Version: "dep@v3", Checkpoint: flow.CheckpointRef{URI: ckpt, Format: flow.CheckpointPEFTLoRA}}})
	require.ErrorContains(t, err, "was forgotten while it trained")
	require.NoDirExists(t, adapter, "weights trained on forgotten data are deleted")
	var versions int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM model_versions WHERE deployment = 'dep'`).Scan(&versions))
	require.Equal(t, 1, versions, "neither step made a version")
	var status string
	require.NoError(t, db.QueryRow(ctx, `SELECT status FROM training_runs WHERE id = $1`, claim2.RunID).Scan(&status))
	require.Equal(t, "failed", status)
}

// TestPrepareBatchStartsFromAVersionWithAState: a step asked to start
// from a version whose training state was pruned (a person rolled back to
// an old one) starts from the newest version that still has its state,
// and the run records the version it was asked for.
func TestPrepareBatchStartsFromAVersionWithAState(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedServingWithSamples(t, db, "dep@v2")
	dir := t.TempDir()
	v2 := filepath.Join(dir, "ckpt", "dep", "v2")
	require.NoError(t, os.MkdirAll(v2, 0o755))
	_, err := db.Exec(ctx, `UPDATE model_versions SET checkpoint_path = $1 WHERE id = 'dep@v2'`, v2)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path, created_at)
		VALUES ('dep@v1', 'dep', 'superseded', '/c/v1', now() - interval '1 hour')`)
	require.NoError(t, err)
	require.NoError(t, store.MarkStatesPruned(ctx, db, []string{"dep@v1"}))
	acts := &Training{DB: db, CheckpointDir: filepath.Join(dir, "ckpt"), BatchDir: filepath.Join(dir, "batches")}
	claim, err := acts.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "k1", BatchSize: 2, MaxStaleness: 4})
	require.NoError(t, err)
	tb, err := acts.PrepareBatch(ctx, flow.PrepareBatchInput{Deployment: "dep", RunID: claim.RunID, Base: "dep@v1"})
	require.NoError(t, err)
	require.Equal(t, "dep@v2", tb.Base.Version)
	require.Equal(t, "file://"+v2, tb.Base.URI)
	path, err := localPath(tb.Batch.URI)
	require.NoError(t, err)
	meta, _, err := parquetbatch.Read(path)
	require.NoError(t, err)
	require.Equal(t, "dep@v2", meta["flywheel.base"])
	run, _, err := store.LoadRun(ctx, db, claim.RunID)
	require.NoError(t, err)
	require.Equal(t, "dep@v2", run.Prepared.Base)
	require.Equal(t, "dep@v1", run.Prepared.Stats["base_state_pruned"])
}

// seedServingWithSamples makes version serve deployment "dep" for tenant
// acme, with four samples of it queued: two rewarded 1, two 0.
func seedServingWithSamples(t *testing.T, db *pgxpool.Pool, version string) {
	t.Helper()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", version)
	queueSamples(t, db, "acme", "dep", version, 2, 1)
	queueSamples(t, db, "acme", "dep", version, 2, 0)
}

func rowsOf(t *testing.T, tb flow.TrainBatchInput) []parquetbatch.Row {
	t.Helper()
	path, err := localPath(tb.Batch.URI)
	require.NoError(t, err)
	_, rows, err := parquetbatch.Read(path)
	require.NoError(t, err)
	return rows
}

func TestHeartbeatIntervalBeatsWithinTheTimeout(t *testing.T) {
	require.Equal(t, 10*time.Second, heartbeatInterval(0, 0), "no timeout: the default")
	require.Equal(t, 10*time.Second, heartbeatInterval(0, time.Minute))
	require.Equal(t, time.Second, heartbeatInterval(0, 3*time.Second), "a third of a short timeout")
	require.Equal(t, 200*time.Millisecond, heartbeatInterval(200*time.Millisecond, time.Minute), "a shorter interval stands")
}

// TestPrunableStatesKeepTheAnchor: for a deployment trained on a Tinker
// service, the prune pass lists the superseded versions older than the
// newest three, but never the anchor (the best promoted version on the
// held-out suite, which a failed line goes back to); for a deployment
// with another kind of trainer, nothing.
func TestPrunableStatesKeepTheAnchor(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedVersions(t, db, "dep", "dep@v7")
	_, err := db.Exec(ctx, `UPDATE deployments SET backend = 'upstream', config = '{"base_url": "http://vllm:8000/v1", "base_model": "m",
		"trainer": {"kind": "tinker", "url": "http://127.0.0.1:1"}}' WHERE name = 'dep'`)
	require.NoError(t, err)
	for i := 1; i <= 6; i++ {
		_, err := db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path, created_at)
			VALUES ($1, 'dep', 'superseded', $2, now() - make_interval(mins => $3))`, fmt.Sprintf("dep@v%d", i), fmt.Sprintf("/c/v%d", i), 60-i)
		require.NoError(t, err)
	}
	seedSuites(t, db, "dep", 4, 1)
	reg, err := store.EvalSuite(ctx, db, "dep", store.SuiteRegression)
	require.NoError(t, err)
	safety, err := store.EvalSuite(ctx, db, "dep", store.SuiteSafety)
	require.NoError(t, err)
	for i := 1; i <= 7; i++ {
		var res []store.SuiteResult
		for j, p := range append(reg, safety...) {
			// v1 passes every prompt; the others all but the first.
			res = append(res, store.SuiteResult{PromptID: p.ID, Passed: i == 1 || j > 0})
		}
		require.NoError(t, store.RecordSuiteResults(ctx, db, fmt.Sprintf("dep@v%d", i), res))
	}
	acts := &Training{DB: db}
	out, err := acts.PrunableStates(ctx, flow.PrunableStatesInput{Deployment: "dep", Keep: []string{"dep@v7"}})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"dep@v2": "/c/v2", "dep@v3": "/c/v3"}, out.Versions, "v1 is the anchor; v4-v6 the newest superseded")
	require.Equal(t, deployment.TrainerTinker, out.Trainer.Kind)

	_, err = db.Exec(ctx, `UPDATE deployments SET config = '{"base_url": "http://vllm:8000/v1", "base_model": "m",
		"trainer": {"kind": "temporal", "queue": "dep-gpu"}}' WHERE name = 'dep'`)
	require.NoError(t, err)
	out, err = acts.PrunableStates(ctx, flow.PrunableStatesInput{Deployment: "dep", Keep: []string{"dep@v7"}})
	require.NoError(t, err)
	require.Empty(t, out.Versions, "another kind of trainer keeps its own states")
}
