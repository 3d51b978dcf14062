package faults

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/flow"
)

// runFault runs the load through one fault: it measures the gateway
// before, injects the fault under load, counts what the clients saw and
// Postgres kept, waits for the workflows and what the scenario left
// behind, and measures the gateway again.
func runFault(ctx context.Context, cfg Config, st *stack, fault string, logf func(string, ...any)) (*Figures, error) {
	f := &Figures{Fault: fault}
	if fault == SWEKill && cfg.sweSkip != "" {
		f.Skipped = cfg.sweSkip
		logf("%-14s skipped: %s", fault, f.Skipped)
		return f, nil
	}
	f.GoroutinesBefore = goroutines(st.gatewayAddr)
	f.PGConnsBefore = pgConns(ctx, st.dbURL)
	// The model server's fault releases a trained candidate.
	training := fault == TrainerKill || fault == ModelServerKill
	if training {
		if err := startTraining(ctx, st); err != nil {
			return nil, err
		}
	}
	ld := startLoad(st, cfg, fault, training)
	sleep(ctx, cfg.Before)

	in, err := inject(ctx, cfg, st, fault, ld, f)
	if err != nil {
		return nil, err
	}
	ld.markFaultEnd(in.end)
	sleep(ctx, cfg.After)
	ld.stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	f.Sent, f.Acked, f.Statuses, f.RetryAfter, f.Hung = ld.sent, len(ld.acked), ld.statuses, ld.retryAfter, ld.hung
	f.RewardsSent, f.RewardsAcked = ld.rewardsSent, ld.rewardsAcked
	if !ld.firstOK.IsZero() {
		f.RecoveryS = ld.firstOK.Sub(in.end).Seconds()
	} else {
		f.RecoveryS = -1
	}
	if err := account(ctx, st, ld, f); err != nil {
		return nil, err
	}
	orphans, err := awaitWorkflows(ctx, st, ld.tenant, ld.sessionsStored, cfg.Settle)
	if err != nil {
		return nil, err
	}
	f.Orphaned, f.WorkflowsS = orphans, time.Since(in.end).Seconds()
	if orphans > 0 {
		f.WorkflowsS = -1
	}
	if err := settleScenario(ctx, cfg, st, fault, in, ld.prefix, f, logf); err != nil {
		return nil, err
	}
	sleep(ctx, 5*time.Second) // closed connections and finished notices wind down
	f.GoroutinesAfter = goroutines(st.gatewayAddr)
	f.PGConnsAfter = pgConns(ctx, st.dbURL)
	logf("%-14s sent %5d, acknowledged %5d, stored %5d, lost %d, duplicated %d; sessions %d, orphaned %d; statuses %v (Retry-After on %d), hung %d; first 2xx %.1f s after, every workflow %.1f s after; goroutines %d → %d, Postgres connections %d → %d",
		fault, f.Sent, f.Acked, f.Stored, f.Lost, f.Duplicated, f.Sessions, f.Orphaned, f.Statuses, f.RetryAfter, f.Hung,
		f.RecoveryS, f.WorkflowsS, f.GoroutinesBefore, f.GoroutinesAfter, f.PGConnsBefore, f.PGConnsAfter)
	return f, nil
}

// settleScenario waits for what a training, SWE or model-server fault
// left behind (a no-op for the others) and logs it.
func settleScenario(ctx context.Context, cfg Config, st *stack, fault string, in injected, prefix string, f *Figures, logf func(string, ...any)) error {
	var err error
	if killed := in.killed; killed != nil {
		if f.Train, err = settleTraining(ctx, st, killed, prefix, cfg.Settle); err != nil {
			return err
		}
		t := f.Train
		logf("%-14s killed run %d (attempt %d, %d samples): %s, its samples trained %d, queued again %d, lost %d; first run trained %.1f s after the restart; runs trained %d, failed %d, stuck %d; versions %d, duplicate %d, samples trained twice %d; the fault's samples %d, trained %d, still queued %d",
			fault, t.KilledRun, t.KilledAttempt, t.KilledSamples, t.KilledOutcome, t.KilledTrained, t.KilledRequeued, t.KilledLost, t.ResumeS,
			t.RunsTrained, t.RunsFailed, t.RunsStuck, t.Versions, t.DuplicateVersions, t.SamplesTrainedTwice, t.Samples, t.SamplesTrained, t.SamplesQueued)
	}
	if rollout := in.rollout; rollout != nil {
		if err := settleSWE(ctx, st, rollout, cfg.SWESettle); err != nil {
			return err
		}
		f.SWE = rollout.f
		s := f.SWE
		logf("%-14s a rollout with no fault %s; killed in %s (attempt %d); the rollout %s, %.1f s after the restart; sandboxes of the killed worker %d, left %d; of the restarted one %d",
			fault, s.ControlOutcome, s.KilledIn, s.KilledAttempt, s.Outcome, s.DoneS, s.KilledOwned, s.Leaked, s.LiveOwned)
	}
	if swap := in.swap; swap != nil {
		if err := settleSwap(ctx, st, swap, cfg.Settle); err != nil {
			return err
		}
		f.Swap = swap.f
		s := f.Swap
		logf("%-14s killed with %s of %s %s (attempt %d); the release %s, %.1f s after the restart; serving %s, held by the restarted model server: %t",
			fault, s.KilledIn, s.Candidate, s.KilledState, s.KilledAttempt, s.Outcome, s.DoneS, s.Serving, s.Served)
	}
	return nil
}

// account counts the acknowledged calls Postgres holds, once or more, and
// the sessions they belong to.
func account(ctx context.Context, st *stack, ld *load, f *Figures) error {
	ids := make([]string, 0, len(ld.acked))
	for id := range ld.acked {
		ids = append(ids, id)
	}
	conn, err := pgx.Connect(ctx, st.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var rows, distinct int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT completion_id) FROM interactions WHERE completion_id = ANY($1)`,
		ids).Scan(&rows, &distinct); err != nil {
		return err
	}
	f.Stored, f.Lost, f.Duplicated = distinct, len(ids)-distinct, rows-distinct
	r, err := conn.Query(ctx, `SELECT DISTINCT session_id FROM interactions WHERE tenant_id = $1 AND session_id LIKE $2`,
		ld.tenant, ld.prefix+"%")
	if err != nil {
		return err
	}
	ld.sessionsStored, err = pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		return err
	}
	f.Sessions = len(ld.sessionsStored)
	return nil
}

// awaitWorkflows waits until every session has its SessionWorkflow, and
// returns how many still have none at the deadline.
func awaitWorkflows(ctx context.Context, st *stack, tenant string, sessions []string, settle time.Duration) (int, error) {
	c, err := client.Dial(client.Options{HostPort: st.temporalAddr(), Namespace: "flywheel", Logger: quietLogger{}})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	left := append([]string(nil), sessions...)
	deadline := time.Now().Add(settle)
	for {
		var still []string
		for _, s := range left {
			_, err := c.DescribeWorkflowExecution(ctx, flow.SessionWorkflowID(tenant, s), "")
			var nf *serviceerror.NotFound
			switch {
			case errors.As(err, &nf):
				still = append(still, s)
			case err != nil:
				still = append(still, s) // Temporal not answering yet
			}
		}
		left = still
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return len(left), ctx.Err()
		}
		sleep(ctx, time.Second)
	}
}

// goroutines reads go_goroutines from the gateway's /metrics (-1: none).
func goroutines(addr string) int {
	if v, ok := metrics(addr, "go_goroutines")["go_goroutines"]; ok {
		return int(v)
	}
	return -1
}

// pgConns counts the connections to the run's database, this query's own
// left out.
func pgConns(ctx context.Context, url string) int {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return -1
	}
	defer conn.Close(ctx)
	var n int
	if conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n) != nil {
		return -1
	}
	return n
}
