package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/proccpu"
	"github.com/flywheel-ai/flywheel/worker"
	"github.com/flywheel-ai/flywheel/workflows"
)

// flywheel bench sessions: what a short session costs the Temporal server,
// for each revision of SessionWorkflow, measured in the same run. Each
// session is started as the gateway starts one (SignalWithStart, its step,
// reward and end in one batch) on a private task queue, whose worker's
// activities do nothing: the figure is Temporal's cost, not Postgres'. The
// server's CPU time comes from /proc (--temporal-pid, default the
// services' $FLYWHEEL_STATE_DIR/temporal.pid), so run it on the machine of
// the Temporal server, with nothing else using it. Revisions alternate in
// rounds, so drift in the machine's load falls on both.
func init() {
	benchCommands["sessions"] = func(ctx context.Context, args []string) error {
		var n, rounds, conc int
		var pidFile string
		cfg, _, err := loadConfig("bench sessions", args, func(fs *flag.FlagSet) {
			fs.IntVar(&n, "sessions", 200, "sessions per revision per round")
			fs.IntVar(&rounds, "rounds", 3, "rounds (each runs every revision once)")
			fs.IntVar(&conc, "concurrency", 16, "sessions started at once")
			fs.StringVar(&pidFile, "temporal-pid", filepath.Join(os.Getenv("FLYWHEEL_STATE_DIR"), "temporal.pid"), "file with the Temporal server's pid")
		})
		if err != nil {
			return err
		}
		if n < 1 || rounds < 1 || conc < 1 {
			return errors.New("bench sessions: --sessions, --rounds and --concurrency must be positive")
		}
		raw, err := os.ReadFile(pidFile)
		if err != nil {
			return fmt.Errorf("bench sessions: the Temporal server's pid: %w (set --temporal-pid)", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			return fmt.Errorf("bench sessions: %s: %w", pidFile, err)
		}
		if _, err := proccpu.Of(pid); err != nil {
			return fmt.Errorf("bench sessions: the Temporal server's %w", err)
		}
		logger := newLogger(cfg.Log)
		c, err := worker.Dial(ctx, cfg.Temporal.Address, cfg.Temporal.Namespace, logger)
		if err != nil {
			return err
		}
		defer c.Close()
		queue := "bench-sessions-" + rand.Text()[:8]
		w := tworker.New(c, queue, tworker.Options{})
		w.RegisterWorkflowWithOptions(workflows.SessionWorkflow, workflow.RegisterOptions{Name: flow.SessionWorkflowName})
		registerNoopSessionActivities(w)
		if err := w.Start(); err != nil {
			return err
		}
		defer w.Stop()

		revs := []int{0, flow.SessionRevision}
		type total struct {
			cpu      time.Duration
			wall     time.Duration
			sessions int
			events   int
		}
		totals := make([]total, len(revs))
		for r := range rounds {
			for i, rev := range revs {
				before, _ := proccpu.Of(pid)
				start := time.Now()
				last, err := runBenchSessions(ctx, c, queue, rev, n, conc)
				if err != nil {
					return fmt.Errorf("bench sessions: revision %d: %w", rev, err)
				}
				after, _ := proccpu.Of(pid)
				wall := time.Since(start)
				events, err := historyLength(ctx, c, last)
				if err != nil {
					return err
				}
				t := &totals[i]
				t.cpu += after - before
				t.wall += wall
				t.sessions += n
				t.events = events
				fmt.Printf("round %d, revision %d: %d sessions in %.1f s, server CPU %.2f ms a session, %d history events each\n",
					r+1, rev, n, wall.Seconds(), float64(after-before)/float64(time.Millisecond)/float64(n), events)
			}
		}
		res := map[string]any{"sessions_per_revision": n * rounds}
		for i, rev := range revs {
			t := totals[i]
			res[fmt.Sprintf("rev%d", rev)] = map[string]any{
				"server_cpu_ms_per_session": float64(t.cpu) / float64(time.Millisecond) / float64(t.sessions),
				"sessions_per_second":       float64(t.sessions) / t.wall.Seconds(),
				"history_events":            t.events,
			}
		}
		if totals[0].cpu > 0 {
			res["cpu_ratio"] = float64(totals[1].cpu) / float64(totals[0].cpu)
		}
		res["throughput_ratio"] = totals[0].wall.Seconds() / totals[1].wall.Seconds()
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
		return nil
	}
}

// registerNoopSessionActivities registers the session's activities as
// doing nothing but answering as a session with one rewarded, eligible
// step would.
func registerNoopSessionActivities(w tworker.Worker) {
	w.RegisterActivityWithOptions(func(context.Context, flow.AssembleInput) (flow.AssembleOutput, error) {
		return flow.AssembleOutput{TrajectoryID: 1, Steps: 1, Eligible: 1, TotalReward: 1, HasReward: true}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName((*activities.Session).AssembleTrajectory)})
	w.RegisterActivityWithOptions(func(context.Context, flow.EnqueueInput) (flow.EnqueueOutput, error) {
		return flow.EnqueueOutput{Enqueued: 1, EligibleSteps: 1}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName((*activities.Session).EnqueueSamples)})
	w.RegisterActivityWithOptions(func(context.Context, flow.EndSessionInput) error { return nil },
		activity.RegisterOptions{Name: flow.ActivityName((*activities.Session).EndSession)})
}

// runBenchSessions runs n sessions of revision rev to completion, conc at
// a time, and returns the last one's workflow id.
func runBenchSessions(ctx context.Context, c client.Client, queue string, rev, n, conc int) (string, error) {
	tenant := "bench-" + rand.Text()[:8]
	ids := make(chan int)
	errs := make(chan error, conc)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for i := range ids {
				in := flow.SessionInput{SessionID: fmt.Sprintf("s%d", i), TenantID: tenant, Deployment: "bench"}
				opts, in := flow.SessionStart(in)
				opts.TaskQueue = queue
				in.Rev = rev
				batch := flow.SessionEvents{Events: []flow.SessionEvent{
					{Kind: flow.EventStep, InteractionID: 1},
					{Kind: flow.EventReward, RewardID: 1, Final: true},
					{Kind: flow.EventEnd},
				}}
				run, err := c.SignalWithStartWorkflow(ctx, opts.ID, flow.SessionEventsSignal, batch, opts, flow.SessionWorkflowName, in)
				if err == nil {
					err = run.Get(ctx, nil)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for i := range n {
		select {
		case ids <- i:
		case err = <-errs:
			break feed
		}
	}
	close(ids)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return flow.SessionWorkflowID(tenant, fmt.Sprintf("s%d", n-1)), err
}

func historyLength(ctx context.Context, c client.Client, id string) (int, error) {
	it := c.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	n := 0
	for it.HasNext() {
		if _, err := it.Next(); err != nil {
			return 0, err
		}
		n++
	}
	return n, nil
}
