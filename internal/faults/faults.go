package faults

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
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
