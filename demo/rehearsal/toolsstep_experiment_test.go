package rehearsal

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/trainer"
)

// TestToolsStepExperiment is a tuning harness, not a check: it runs only
// when FLYWHEEL_TOOLS_STEP_EXPERIMENT holds a Config as JSON. It trains
// MaxSteps on-policy steps of the tools task from the base and after each
// reports the share of sampled first calls (temperature 1, 200 held-out
// requests) that are well-formed: what breaks first when an update hurts.
func TestToolsStepExperiment(t *testing.T) {
	cfg := experimentConfig(t, "FLYWHEEL_TOOLS_STEP_EXPERIMENT").WithDefaults()
	ctx := context.Background()
	r := &run{cfg: cfg}
	defer r.close()
	require.NoError(t, r.start(ctx))
	held, err := demotask.HeldOut(cfg.Task, cfg.Seed, 200)
	require.NoError(t, err)
	wellFormed := func(m *trainer.Model) float64 {
		sessions, err := demotask.RunToolsSessions(ctx, m, held, 1, rand.New(rand.NewPCG(7, 7)))
		require.NoError(t, err)
		ok := 0
		for _, s := range sessions {
			_, calls := trainer.ParseAssistant(demotask.AnswerText(s.Calls[0].IDs), "c")
			if len(calls) == 0 {
				continue
			}
			var args map[string]any
			if json.Unmarshal([]byte(calls[0].Arguments), &args) == nil {
				if _, has := args[demotask.ToolArg].(string); has {
					ok++
				}
			}
		}
		return float64(ok) / float64(len(held))
	}
	rng := rand.New(rand.NewPCG(cfg.Seed+cfg.RLSeed, 0x5a3b))
	t.Logf("base: well-formed %.3f", wellFormed(r.cur.model))
	if db := os.Getenv("FLYWHEEL_TOOLS_STEP_DB"); db != "" {
		pool, err := pgxpool.New(ctx, db)
		require.NoError(t, err)
		defer pool.Close()
		rows, err := pool.Query(ctx, `SELECT s.prompt_token_ids, s.completion_token_ids, s.logprobs, s.group_id, s.session_id, s.reward, s.task_id
FROM training_runs r CROSS JOIN LATERAL jsonb_array_elements_text(r.stats->'prepared'->'samples') AS x(id)
JOIN training_samples s ON s.id = x.id::bigint WHERE r.id = $1`, os.Getenv("FLYWHEEL_TOOLS_STEP_RUN"))
		require.NoError(t, err)
		b := &trainer.Batch{Temperature: 1}
		for rows.Next() {
			var p, c []int32
			var lp []float32
			var s trainer.Sample
			require.NoError(t, rows.Scan(&p, &c, &lp, &s.GroupID, &s.SessionID, &s.Reward, &s.TaskID))
			n := len(p) + len(c)
			s.TokenIDs, s.LossMask, s.Logprobs, s.Versions = make([]int, 0, n), make([]uint8, n), make([]float32, n), make([]int64, n)
			for _, id := range p {
				s.TokenIDs = append(s.TokenIDs, int(id))
			}
			for i, id := range c {
				s.TokenIDs = append(s.TokenIDs, int(id))
				s.LossMask[len(p)+i], s.Logprobs[len(p)+i] = 1, lp[i]
			}
			b.Samples = append(b.Samples, s)
		}
		require.NoError(t, rows.Err())
		t.Logf("online batch: %d samples", len(b.Samples))
		require.NoError(t, r.tr.trainStep(ctx, b))
		t.Logf("after the online batch: well-formed %.3f", wellFormed(r.cur.model))
		return
	}
	for step := 0; step < max(cfg.MaxSteps, 1); step++ {
		require.NoError(t, r.trainStep(ctx, rng, *r.cur, step))
		t.Logf("step %d: well-formed %.3f, sampled success %.3f", step+1, wellFormed(r.cur.model), float64(r.succeeded)/float64(r.sampled))
		r.sampled, r.succeeded = 0, 0
	}
}
