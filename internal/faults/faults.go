package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
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
	// TrainerKill is a SIGKILL of the trainer worker (`flywheel worker` on
	// the trainer queue) while it runs a TrainBatch, then a restart; the
	// load rewards its sessions so that they train.
	TrainerKill = "trainer-kill"
	// SWEKill is a SIGKILL of `flywheel up`, the one process that runs
	// the SWE queue (its activities call the gateway with the development
	// key), while a rollout's agent works or is graded in a Docker
	// sandbox, then a restart. It needs Docker and the sandbox agent, and
	// is skipped, saying why, without them.
	SWEKill = "swe-kill"
	// ModelServerKill is a SIGKILL of the policy's model server (`flywheel
	// model-server`, its own process in this stack as in
	// docker-compose.yml) while a release loads its candidate into it,
	// then a restart.
	ModelServerKill = "model-server-kill"
)

// All is every fault the suite injects.
var All = []string{GatewayKill, PostgresStop, TemporalKill, TrainerKill, SWEKill, ModelServerKill}

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
	// SWESettle bounds the wait for a rollout whose worker was killed
	// (default 5 min: a step on a dead worker is retried after its 2-minute
	// heartbeat timeout).
	SWESettle time.Duration
	// Keep leaves the run's directory (logs, data) in place.
	Keep bool
	Out  io.Writer

	// sweSkip says why SWEKill cannot run here.
	sweSkip string
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
	def(&c.SWESettle, 5*time.Minute)
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
	// RewardsSent and RewardsAcked count the sessions' final rewards (only
	// under a training fault).
	RewardsSent  int `json:"rewards_sent,omitempty"`
	RewardsAcked int `json:"rewards_acked,omitempty"`
	// Train is what a fault in the training path left behind.
	Train *TrainFigures `json:"train,omitempty"`
	// SWE is what a fault in an SWE rollout left behind.
	SWE *SWEFigures `json:"swe,omitempty"`
	// Swap is what a model server killed in a weight swap left behind.
	Swap *SwapFigures `json:"swap,omitempty"`
	// Skipped says why the fault could not be injected here.
	Skipped string `json:"skipped,omitempty"`
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
	// Over the training faults: runs left claimed, versions registered
	// twice for one run or samples trained twice, and samples of a killed
	// run neither trained nor queued again. Each must be 0.
	RunsStuck         int `json:"runs_stuck"`
	DuplicateVersions int `json:"duplicate_versions"`
	SamplesLost       int `json:"samples_lost"`
	// SandboxesLeaked: containers of a killed worker left after its
	// rollout ended (target 0).
	SandboxesLeaked int `json:"sandboxes_leaked"`
	// ServingUnserved: model-server faults after which the restarted
	// server did not hold the serving version (target 0).
	ServingUnserved int `json:"serving_unserved"`
}

// Run starts the private stack and injects each fault in turn.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.fill()
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format+"\n", args...) }
	var env []string
	if slices.Contains(cfg.Faults, SWEKill) {
		dir, err := os.MkdirTemp("/var/tmp", "flywheel-faults-agent-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		agent, skip := sweReady(ctx, dir)
		if cfg.sweSkip = skip; skip == "" {
			env = append(env, "FLYWHEEL_SANDBOX_AGENT="+agent)
		}
	}
	logf("starting a private Postgres, Temporal dev server and flywheel up under /var/tmp")
	st, err := startStack(ctx, "flywheel-faults-", cfg.Bin, cfg.TemporalCLI, env...)
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
		if s := f.SWE; s != nil {
			res.SandboxesLeaked += s.Leaked
		}
		if s := f.Swap; s != nil && !s.Served {
			res.ServingUnserved++
		}
		if t := f.Train; t != nil {
			res.RunsStuck += t.RunsStuck
			res.DuplicateVersions += t.DuplicateVersions + t.SamplesTrainedTwice
			res.SamplesLost += t.KilledLost
		}
	}
	return res, nil
}

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

	var faultEnd time.Time
	var killed *trainerKill
	var rollout *sweRun
	var swap *swapRun
	switch fault {
	case GatewayKill:
		if err := st.up.kill(); err != nil {
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
		if err := st.temporal.kill(); err != nil {
			return nil, err
		}
		sleep(ctx, cfg.Outage)
		if err := st.startTemporal(ctx); err != nil {
			return nil, err
		}
		faultEnd = time.Now()
	case TrainerKill:
		var err error
		if killed, err = killTrainerInStep(ctx, st, 3*time.Minute); err != nil {
			ld.stop()
			return nil, err
		}
		faultEnd = killed.restarted
	case SWEKill:
		var err error
		// The first rollout builds the task's image.
		if rollout, err = sweKill(ctx, st, 5*time.Minute); err != nil {
			ld.stop()
			return nil, err
		}
		faultEnd = rollout.restarted
	case ModelServerKill:
		var err error
		if swap, err = killModelServerInSwap(ctx, st, 3*time.Minute); err != nil {
			ld.stop()
			return nil, err
		}
		faultEnd = swap.restarted
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
	f.RewardsSent, f.RewardsAcked = ld.rewardsSent, ld.rewardsAcked
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
	if killed != nil {
		if f.Train, err = settleTraining(ctx, st, killed, ld.prefix, cfg.Settle); err != nil {
			return nil, err
		}
		t := f.Train
		logf("%-14s killed run %d (attempt %d, %d samples): %s, its samples trained %d, queued again %d, lost %d; first run trained %.1f s after the restart; runs trained %d, failed %d, stuck %d; versions %d, duplicate %d, samples trained twice %d; the fault's samples %d, trained %d, still queued %d",
			fault, t.KilledRun, t.KilledAttempt, t.KilledSamples, t.KilledOutcome, t.KilledTrained, t.KilledRequeued, t.KilledLost, t.ResumeS,
			t.RunsTrained, t.RunsFailed, t.RunsStuck, t.Versions, t.DuplicateVersions, t.SamplesTrainedTwice, t.Samples, t.SamplesTrained, t.SamplesQueued)
	}
	if rollout != nil {
		if err := settleSWE(ctx, st, rollout, cfg.SWESettle); err != nil {
			return nil, err
		}
		f.SWE = rollout.f
		s := f.SWE
		logf("%-14s a rollout with no fault %s; killed in %s (attempt %d); the rollout %s, %.1f s after the restart; sandboxes of the killed worker %d, left %d; of the restarted one %d",
			fault, s.ControlOutcome, s.KilledIn, s.KilledAttempt, s.Outcome, s.DoneS, s.KilledOwned, s.Leaked, s.LiveOwned)
	}
	if swap != nil {
		if err := settleSwap(ctx, st, swap, cfg.Settle); err != nil {
			return nil, err
		}
		f.Swap = swap.f
		s := f.Swap
		logf("%-14s killed with %s of %s %s (attempt %d); the release %s, %.1f s after the restart; serving %s, held by the restarted model server: %t",
			fault, s.KilledIn, s.Candidate, s.KilledState, s.KilledAttempt, s.Outcome, s.DoneS, s.Serving, s.Served)
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

	// rewards: each session ends with a final reward, so its steps queue
	// as training samples.
	rewards bool

	mu             sync.Mutex
	sent           int
	rewardsSent    int
	rewardsAcked   int
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
// every answer is counted as the client saw it. With rewards each session
// then gets a final reward of +1 or -1 (half each, by session).
func startLoad(st *stack, cfg Config, fault string, rewards bool) *load {
	ctx, cancel := context.WithCancel(context.Background())
	ld := &load{tenant: "default", prefix: fmt.Sprintf("faults-%s-%d-", fault, time.Now().UnixNano()), cancel: cancel,
		acked: map[string]bool{}, statuses: map[string]int{}, rewards: rewards}
	httpc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Clients}}
	ld.httpc = httpc
	for c := range cfg.Clients {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for s := 0; ctx.Err() == nil; s++ {
				session := fmt.Sprintf("%sc%d-s%d", ld.prefix, c, s)
				acked := 0
				for turn := 0; turn < 4 && ctx.Err() == nil; turn++ {
					if ld.call(ctx, httpc, st, session, turn, turn == 3) {
						acked++
					}
					sleep(ctx, cfg.Think)
				}
				if ld.rewards && acked > 0 {
					ld.reward(ctx, httpc, st, session, float64(1-2*(s%2)))
				}
			}
		}()
	}
	return ld
}

// call sends one chat completion and says whether it was acknowledged.
func (ld *load) call(ctx context.Context, httpc *http.Client, st *stack, session string, turn int, done bool) bool {
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
		return false
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ld.statuses[strconv.Itoa(resp.StatusCode)]++
	if resp.Header.Get("Retry-After") != "" {
		ld.retryAfter++
	}
	if resp.StatusCode/100 != 2 {
		return false
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
	return true
}

// reward posts a session's final reward (POST /v1/sessions/{id}/reward).
func (ld *load) reward(ctx context.Context, httpc *http.Client, st *stack, session string, value float64) {
	body := fmt.Sprintf(`{"value":%g,"final":true,"source":"verifier"}`, value)
	req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost,
		"http://"+st.gatewayAddr+"/v1/sessions/"+session+"/reward", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+st.key)
	resp, err := httpc.Do(req)
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.rewardsSent++
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		ld.rewardsAcked++
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
		if f.Skipped != "" {
			continue
		}
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
	for _, f := range res.Faults {
		if f.Skipped != "" {
			fmt.Fprintf(&b, "| %s | skipped: %s |\n", f.Fault, f.Skipped)
		}
	}
	var train, swe, swap []string
	for _, f := range res.Faults {
		if t := f.Train; t != nil {
			train = append(train, fmt.Sprintf("| %s | %d, %d | %s | %d / %d / %d | %.1f | %d / %d / %d | %d (%d) | %d | %d: %d / %d |",
				f.Fault, t.KilledSamples, t.KilledAttempt, t.KilledOutcome, t.KilledTrained, t.KilledRequeued, t.KilledLost, t.ResumeS,
				t.RunsTrained, t.RunsFailed, t.RunsStuck, t.Versions, t.DuplicateVersions, t.SamplesTrainedTwice, t.Samples, t.SamplesTrained, t.SamplesQueued))
		}
		if s := f.Swap; s != nil {
			swap = append(swap, fmt.Sprintf("| %s | %s, %s (%s, attempt %d) | %s | %.1f | %s, %t |",
				f.Fault, s.Candidate, s.KilledIn, s.KilledState, s.KilledAttempt, s.Outcome, s.DoneS, s.Serving, s.Served))
		}
		if s := f.SWE; s != nil {
			swe = append(swe, fmt.Sprintf("| %s | %s | %s (%d) | %s | %.1f | %d / %d | %d |",
				f.Fault, s.ControlOutcome, s.KilledIn, s.KilledAttempt, s.Outcome, s.DoneS, s.KilledOwned, s.Leaked, s.LiveOwned))
		}
	}
	subTable(&b, []string{"fault", "killed run: samples, attempt", "its outcome", "its samples trained / queued again / lost",
		"first run trained after restart (s)", "runs trained / failed / stuck", "versions (duplicate)", "samples trained twice",
		"the fault's samples: trained / still queued"}, train)
	subTable(&b, []string{"fault", "a rollout with no fault", "killed in (attempt)", "the killed rollout", "ended after restart (s)",
		"sandboxes of the killed worker: before / left", "of the restarted one"}, swe)
	subTable(&b, []string{"fault", "candidate, killed in (state, attempt)", "the release", "ended after restart (s)",
		"serving, held by the restarted model server"}, swap)
	return b.String()
}

// subTable adds a table of rows under header, after a blank line (none
// without rows).
func subTable(b *strings.Builder, header []string, rows []string) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "\n| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
}
