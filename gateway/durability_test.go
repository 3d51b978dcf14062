package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// startGateway runs `flywheel gateway` as a child process, sending its
// session notices to the Temporal server at temporalAddr.
func startGateway(t *testing.T, bin, dbURL, upstream, addr, temporalAddr string) *exec.Cmd {
	cmd := exec.Command(bin, "gateway", "--database-url", dbURL, "--gateway-listen", addr,
		"--gateway-upstream-url", upstream, "--gateway-upstream-models", fixtureModel,
		"--gateway-rate-limit-rps", "0", "--log-level", "error", "--temporal-address", temporalAddr)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// The policy's checkpoints go under the working directory's data dir.
	cmd.Dir = t.TempDir()
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, "the gateway becomes ready")
	return cmd
}

// TestKillUnderLoadLosesNothingAcknowledged kills the gateway process
// (SIGKILL, no drain) while many agents are mid-call, then shows every
// completion that was answered 2xx is in Postgres, that a restarted
// gateway continues the same sessions, and that every session gets its
// workflow although the notices in the dead process's memory were lost.
func TestKillUnderLoadLosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the flywheel binary")
	}
	bin := filepath.Join(t.TempDir(), "flywheel")
	build := exec.Command("go", "build", "-o", bin, "../cmd/flywheel")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "build ./cmd/flywheel")

	dbURL := testenv.DatabaseURL(t, true)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, store.EnsureTenant(context.Background(), pool, "acme"))
	key, err := store.CreateKey(context.Background(), pool, "acme", "", "kill test")
	require.NoError(t, err)

	fx := &fakevllm.Fixture{Latency: 2 * time.Millisecond}
	up := httptest.NewServer(fx)
	t.Cleanup(up.Close)
	addr := freeAddr(t)
	tc, temporalAddr := testenv.TemporalServer(t)
	cmd := startGateway(t, bin, dbURL, up.URL+"/v1", addr, temporalAddr)

	var mu sync.Mutex
	acked := map[string]string{} // completion id → session
	var wg sync.WaitGroup
	stop := make(chan struct{})
	client := &http.Client{Timeout: 5 * time.Second}
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			session := fmt.Sprintf("agent-%d", w)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"step %d"}]}`, fixtureModel, i)
				req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("X-Session-Id", session)
				resp, err := client.Do(req)
				if err != nil {
					return // the gateway died under us
				}
				var out struct{ ID string }
				err = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if err == nil && resp.StatusCode == 200 && out.ID != "" {
					mu.Lock()
					acked[out.ID] = session
					mu.Unlock()
				}
			}
		}()
	}
	eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= 300 }, "load is flowing")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	close(stop)
	wg.Wait()

	mu.Lock()
	ids := make([]string, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	mu.Unlock()
	var found int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM interactions WHERE completion_id = ANY($1)`, ids).Scan(&found))
	require.Equal(t, len(ids), found, "every acknowledged interaction survived the kill")
	t.Logf("acknowledged before the kill: %d, all in Postgres", len(ids))

	var sessions, orphaned int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE notified_at IS NULL) FROM sessions WHERE tenant_id = 'acme'`).Scan(&sessions, &orphaned))
	t.Logf("sessions at the kill: %d, %d of them with no notice delivered", sessions, orphaned)

	// After a restart the same sessions continue, with consistent steps.
	startGateway(t, bin, dbURL, up.URL+"/v1", addr, temporalAddr)
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"after restart"}]}`, fixtureModel)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Session-Id", "agent-0")
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var gaps int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT session_id, max(seq) + 1 - count(*) AS gap FROM interactions GROUP BY session_id) g WHERE gap <> 0`).Scan(&gaps))
	require.Zero(t, gaps, "step numbers stay dense per session")

	// The restarted gateway's outbox reconciler owes the dead one's notices.
	require.Eventually(t, func() bool {
		var left int
		return pool.QueryRow(context.Background(), `SELECT count(*) FROM sessions WHERE notified_at IS NULL`).Scan(&left) == nil && left == 0
	}, 30*time.Second, 200*time.Millisecond, "every committed session was notified")
	rows, err := pool.Query(context.Background(), `SELECT id FROM sessions WHERE tenant_id = 'acme'`)
	require.NoError(t, err)
	sids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, sids)
	for _, sid := range sids {
		_, err := tc.DescribeWorkflowExecution(context.Background(), flow.SessionWorkflowID("acme", sid), "")
		require.NoError(t, err, "session %s has its workflow", sid)
	}
}
