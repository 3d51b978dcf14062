package faults_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/faults"
	"github.com/flywheel-ai/flywheel/internal/testenv"
)

// TestFaultSuiteShortForm is `flywheel bench faults` in CI's short form:
// fewer agents and shorter phases, every fault. Under each, nothing
// acknowledged is lost or stored twice, every session reaches its
// workflow, no call hangs or gets a 500, a stopped Postgres is answered
// with 503 + Retry-After and a not-ready /readyz, and the gateway answers
// 2xx again after every fault, within 5 s of Postgres's return. A trainer
// killed in a step leaves no run claimed, no version or sample twice and
// no sample of its run lost, and training goes on after its restart.
func TestFaultSuiteShortForm(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the flywheel binary and runs a private stack")
	}
	cli := testenv.Need(t, "FLYWHEEL_TEMPORAL_CLI")
	bin := filepath.Join(t.TempDir(), "flywheel")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/flywheel")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "build ./cmd/flywheel")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// Not swe-kill: a step on a dead worker waits out its 2-minute
	// heartbeat timeout before it is retried.
	short := []string{faults.GatewayKill, faults.PostgresStop, faults.TemporalKill, faults.TrainerKill}
	res, err := faults.Run(ctx, faults.Config{Bin: bin, TemporalCLI: cli, Faults: short, Clients: 6,
		Before: 2 * time.Second, After: 2 * time.Second, Outage: 4 * time.Second, Settle: 90 * time.Second, Out: testWriter{t}})
	require.NoError(t, err)
	t.Log("\n" + faults.Table(res))
	require.Len(t, res.Faults, len(short))
	for _, f := range res.Faults {
		require.Positive(t, f.Acked, "%s: load flowed", f.Fault)
		require.Zero(t, f.Lost, "%s: acknowledged but not stored", f.Fault)
		require.Zero(t, f.Duplicated, "%s: stored twice", f.Fault)
		require.Zero(t, f.Orphaned, "%s: sessions without their workflow", f.Fault)
		require.Zero(t, f.Hung, "%s: calls with no answer", f.Fault)
		require.Zero(t, f.Statuses["500"], "%s: 500s", f.Fault)
		require.GreaterOrEqual(t, f.RecoveryS, 0.0, "%s: no 2xx after the fault", f.Fault)
		if tr := f.Train; tr != nil {
			require.NotEqual(t, "claimed", tr.KilledOutcome, "the killed step's run is closed")
			require.Zero(t, tr.KilledLost, "samples of the killed run neither trained nor queued again")
			require.Zero(t, tr.RunsStuck, "runs left claimed")
			require.Zero(t, tr.DuplicateVersions, "versions registered twice for a run")
			require.Zero(t, tr.SamplesTrainedTwice, "samples in two versions' lineage")
			require.GreaterOrEqual(t, tr.ResumeS, 0.0, "no run trained after the trainer's restart")
		}
		if f.Fault == faults.PostgresStop {
			require.Less(t, f.RecoveryS, 5.0, "seconds from Postgres's return to the first 2xx")
			require.Positive(t, f.Statuses["503"], "calls while Postgres is down get 503")
			require.Equal(t, f.Statuses["503"], f.RetryAfter, "every 503 says when to retry")
			require.True(t, f.NotReadySeen, "readiness is false while Postgres is down")
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
