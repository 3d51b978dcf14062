package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/workflows"
)

// The faults, in the order they run.
const (
	GatewayKill  = "gateway-kill"  // SIGKILL of `flywheel up` (gateway, workers, model server), then a restart
	PostgresStop = "postgres-stop" // Postgres stopped as by a crash (-m immediate), then started
	TemporalKill = "temporal-kill" // SIGKILL of the Temporal server, then a restart
)

// All is every fault the suite injects.
var All = []string{GatewayKill, PostgresStop, TemporalKill}

// Config sizes a run; zero values take the defaults.
type Config struct {
	// Bin is the flywheel binary to run as `flywheel up`; TemporalCLI the
	// `temporal` binary whose dev server the run starts.
	Bin, TemporalCLI string
	// Faults to inject (default All).
	Faults []string
	// Clients is the number of concurrent agents (default 16), each
	// sending its next call Think after the last answer (default 50 ms).
	// The private gateway has no per-key rate limit: the load is bounded
	// by its clients, and a 429 would not be a fault's answer.
	Clients int
	Think   time.Duration
	// Before and After are the load before a fault and after recovery
	// (default 5 s each); Outage how long a stopped service stays down
	// (default 10 s).
	Before, After, Outage time.Duration
	// Settle bounds the wait for every session's workflow (default 90 s).
	Settle time.Duration
	// Keep leaves the run's directory (logs, data) in place.
	Keep bool
	Out  io.Writer
}

func (c *Config) fill() {
	if len(c.Faults) == 0 {
		c.Faults = All
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Clients <= 0 {
		c.Clients = 16
	}
	def(&c.Think, 50*time.Millisecond)
	def(&c.Before, 5*time.Second)
	def(&c.After, 5*time.Second)
	def(&c.Outage, 10*time.Second)
	def(&c.Settle, 90*time.Second)
	if c.Out == nil {
		c.Out = io.Discard
	}
}

// Figures are one fault's counts.
type Figures struct {
	Fault string `json:"fault"`
	// Sent requests, of which Acked were answered 2xx, Stored of those are
	// in Postgres, Lost are not (target 0), and Duplicated are stored more
	// than once (target 0).
	Sent       int `json:"sent"`
	Acked      int `json:"acked"`
	Stored     int `json:"stored"`
	Lost       int `json:"lost"`
	Duplicated int `json:"duplicated"`
	// Sessions with a committed interaction, and Orphaned those whose
	// SessionWorkflow did not exist when the settle time ran out (target 0).
	Sessions int `json:"sessions"`
	Orphaned int `json:"orphaned"`
	// Statuses counts the answers clients saw by HTTP status ("conn" for a
	// refused or cut connection); RetryAfter the 429/503s that said when
	// to retry; Hung the calls with no answer within 30 s (target 0).
	Statuses   map[string]int `json:"statuses"`
	RetryAfter int            `json:"retry_after"`
	Hung       int            `json:"hung"`
	// NotReadySeen: /readyz said not ready while Postgres was down.
	NotReadySeen bool `json:"not_ready_seen,omitempty"`
	// RecoveryS is the time from the fault's end (the service back, the
	// process restarted) to the first 2xx; WorkflowsS to the moment every
	// session had its workflow.
	RecoveryS  float64 `json:"recovery_s"`
	WorkflowsS float64 `json:"workflows_s"`
	// Before and after, with no load: the gateway's goroutines and
	// Postgres connections to its database.
	GoroutinesBefore int `json:"goroutines_before"`
	GoroutinesAfter  int `json:"goroutines_after"`
	PGConnsBefore    int `json:"pg_conns_before"`
	PGConnsAfter     int `json:"pg_conns_after"`
}

// Result is a run's figures; the JSON is `flywheel bench faults`' last line.
type Result struct {
	Clients int       `json:"clients"`
	Faults  []Figures `json:"faults"`
	// Lost, Duplicated, Orphaned, Hung and ServerErrors (500s) summed over
	// the faults: each must be 0.
	Lost         int `json:"lost"`
	Duplicated   int `json:"duplicated"`
	Orphaned     int `json:"orphaned"`
	Hung         int `json:"hung"`
	ServerErrors int `json:"server_errors"`
}

// Run starts the private stack and injects each fault in turn.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.fill()
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format+"\n", args...) }
	logf("starting a private Postgres, Temporal dev server and flywheel up under /var/tmp")
	st, err := startStack(ctx, "flywheel-faults-", cfg.Bin, cfg.TemporalCLI)
	if err != nil {
		return nil, err
	}
	defer func() {
		st.close(cfg.Keep)
		if cfg.Keep {
			logf("left %s (logs, data)", st.dir)
		}
	}()
	res := &Result{Clients: cfg.Clients}
	for _, fault := range cfg.Faults {
		f, err := runFault(ctx, cfg, st, fault, logf)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fault, err)
		}
		res.Faults = append(res.Faults, *f)
		res.Lost += f.Lost
		res.Duplicated += f.Duplicated
		res.Orphaned += f.Orphaned
		res.Hung += f.Hung
		res.ServerErrors += f.Statuses["500"]
	}
	return res, nil
}

func runFault(ctx context.Context, cfg Config, st *stack, fault string, logf func(string, ...any)) (*Figures, error) {
	f := &Figures{Fault: fault}
	f.GoroutinesBefore = goroutines(st.gatewayAddr)
	f.PGConnsBefore = pgConns(ctx, st.dbURL)
	ld := startLoad(st, cfg, fault)
	sleep(ctx, cfg.Before)

	var faultEnd time.Time
	switch fault {
	case GatewayKill:
		if err := st.killUp(); err != nil {
			return nil, err
		}
		faultEnd = time.Now()
		if err := st.startUp(ctx); err != nil {
			return nil, err
		}
	case PostgresStop:
		if err := st.pgCrash(); err != nil {
			return nil, err
		}
		until := time.Now().Add(cfg.Outage)
		for time.Now().Before(until) {
			if resp, err := http.Get("http://" + st.gatewayAddr + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					f.NotReadySeen = true
				}
			}
			sleep(ctx, 200*time.Millisecond)
		}
		if err := st.pgStart(); err != nil {
			return nil, err
		}
		faultEnd = time.Now()
	case TemporalKill:
		if err := st.killTemporal(); err != nil {
			return nil, err
		}
		sleep(ctx, cfg.Outage)
		if err := st.startTemporal(ctx); err != nil {
			return nil, err
		}
		faultEnd = time.Now()
	default:
		return nil, fmt.Errorf("unknown fault (want one of %s)", strings.Join(All, ", "))
	}
	ld.markFaultEnd(faultEnd)
	sleep(ctx, cfg.After)
	ld.stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	f.Sent, f.Acked, f.Statuses, f.RetryAfter, f.Hung = ld.sent, len(ld.acked), ld.statuses, ld.retryAfter, ld.hung
	if !ld.firstOK.IsZero() {
		f.RecoveryS = ld.firstOK.Sub(faultEnd).Seconds()
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
	f.Orphaned, f.WorkflowsS = orphans, time.Since(faultEnd).Seconds()
	if orphans > 0 {
		f.WorkflowsS = -1
	}
	sleep(ctx, 5*time.Second) // closed connections and finished notices wind down
	f.GoroutinesAfter = goroutines(st.gatewayAddr)
	f.PGConnsAfter = pgConns(ctx, st.dbURL)
	logf("%-14s sent %5d, acknowledged %5d, stored %5d, lost %d, duplicated %d; sessions %d, orphaned %d; statuses %v (Retry-After on %d), hung %d; first 2xx %.1f s after, every workflow %.1f s after; goroutines %d → %d, Postgres connections %d → %d",
		fault, f.Sent, f.Acked, f.Stored, f.Lost, f.Duplicated, f.Sessions, f.Orphaned, f.Statuses, f.RetryAfter, f.Hung,
		f.RecoveryS, f.WorkflowsS, f.GoroutinesBefore, f.GoroutinesAfter, f.PGConnsBefore, f.PGConnsAfter)
	return f, nil
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
			_, err := c.DescribeWorkflowExecution(ctx, workflows.SessionWorkflowID(tenant, s), "")
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

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// load is the clients of one fault's phase.
type load struct {
	tenant, prefix string
	cancel         context.CancelFunc
	wg             sync.WaitGroup
	httpc          *http.Client

	mu             sync.Mutex
	sent           int
	acked          map[string]bool
	statuses       map[string]int
	retryAfter     int
	hung           int
	faultEnd       time.Time
	firstOK        time.Time
	sessionsStored []string
}

// startLoad starts cfg.Clients agents, each running sessions of 4 calls
// (the last with X-Session-Done) against the gateway, with no retries:
// every answer is counted as the client saw it.
func startLoad(st *stack, cfg Config, fault string) *load {
	ctx, cancel := context.WithCancel(context.Background())
	ld := &load{tenant: "default", prefix: fmt.Sprintf("faults-%s-%d-", fault, time.Now().UnixNano()), cancel: cancel,
		acked: map[string]bool{}, statuses: map[string]int{}}
	httpc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Clients}}
	ld.httpc = httpc
	for c := range cfg.Clients {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for s := 0; ctx.Err() == nil; s++ {
				session := fmt.Sprintf("%sc%d-s%d", ld.prefix, c, s)
				for turn := 0; turn < 4 && ctx.Err() == nil; turn++ {
					ld.call(ctx, httpc, st, session, turn, turn == 3)
					sleep(ctx, cfg.Think)
				}
			}
		}()
	}
	return ld
}

func (ld *load) call(ctx context.Context, httpc *http.Client, st *stack, session string, turn int, done bool) {
	body := fmt.Sprintf(`{"model":"flywheel-policy","max_tokens":8,"messages":[{"role":"user","content":"task %s, step %d"}]}`, session, turn)
	req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, "http://"+st.gatewayAddr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+st.key)
	req.Header.Set("X-Session-Id", session)
	if done {
		req.Header.Set("X-Session-Done", "true")
	}
	resp, err := httpc.Do(req)
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.sent++
	if err != nil {
		var te interface{ Timeout() bool }
		if errors.As(err, &te) && te.Timeout() {
			ld.hung++
		}
		ld.statuses["conn"]++
		return
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ld.statuses[strconv.Itoa(resp.StatusCode)]++
	if resp.Header.Get("Retry-After") != "" {
		ld.retryAfter++
	}
	if resp.StatusCode/100 != 2 {
		return
	}
	var out struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &out) == nil && out.ID != "" {
		ld.acked[out.ID] = true
	}
	if !ld.faultEnd.IsZero() && ld.firstOK.IsZero() {
		ld.firstOK = time.Now()
	}
}

func (ld *load) markFaultEnd(t time.Time) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.faultEnd = t
}

// stop ends the load and closes its connections, so that what the gateway
// holds afterwards is its own.
func (ld *load) stop() {
	ld.cancel()
	ld.wg.Wait()
	ld.httpc.CloseIdleConnections()
}

// Table renders figures as the README's table.
func Table(res *Result) string {
	var b strings.Builder
	b.WriteString("| fault | sent | acknowledged | stored | lost | duplicated | sessions | orphaned | statuses | hung | first 2xx after (s) | every workflow after (s) | goroutines | Postgres conns |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range res.Faults {
		codes := make([]string, 0, len(f.Statuses))
		for k := range f.Statuses {
			codes = append(codes, k)
		}
		sort.Strings(codes)
		var st []string
		for _, k := range codes {
			st = append(st, fmt.Sprintf("%s×%d", k, f.Statuses[k]))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %s | %d | %.1f | %.1f | %d → %d | %d → %d |\n",
			f.Fault, f.Sent, f.Acked, f.Stored, f.Lost, f.Duplicated, f.Sessions, f.Orphaned, strings.Join(st, ", "), f.Hung,
			f.RecoveryS, f.WorkflowsS, f.GoroutinesBefore, f.GoroutinesAfter, f.PGConnsBefore, f.PGConnsAfter)
	}
	return b.String()
}
