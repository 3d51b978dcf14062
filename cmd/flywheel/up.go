package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"golang.org/x/sync/errgroup"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/demo/demotraining"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/worker"
)

// defaultTenant owns the key `flywheel up` prints; the gateway's status
// page shows it to a local browser by default.
const defaultTenant = config.DevTenant

// runUp runs the whole system in one process on top of the local services:
// migrations, Temporal setup, a worker on every queue and the gateway. It
// prints a summary once a workflow has made the round trip through the
// worker, then serves until interrupted.
func runUp(ctx context.Context, args []string) error {
	var baseName string
	cfg, _, err := loadConfig("up", args, func(fs *flag.FlagSet) {
		fs.StringVar(&baseName, "policy-base", os.Getenv("FLYWHEEL_POLICY_BASE"),
			`v0 of a new policy deployment: "" (a seeded random model), "demo" or "demo-tools" (the base policy of the demo's `+
				"letters or tools task, trained by the demo's control plane so `flywheel demo` learns online; env FLYWHEEL_POLICY_BASE)")
	})
	if err != nil {
		return err
	}
	logger := newLogger(cfg.Log)
	pb, err := namedPolicyBase(baseName, cfg.DataDir, logger)
	if err != nil {
		return err
	}
	if err := migrateUp(ctx, cfg.Database.URL); err != nil {
		return err
	}
	pool, err := store.Open(ctx, cfg.Database.URL, cfg.Database.MaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := worker.Dial(ctx, cfg.Temporal.Address, cfg.Temporal.Namespace, logger)
	if err != nil {
		return fmt.Errorf("%w (is the Temporal dev server running? `scripts/services.sh up` starts it)", err)
	}
	defer c.Close()
	if err := worker.Setup(ctx, c, cfg.Temporal.Namespace); err != nil {
		return err
	}
	key, err := devKey(ctx, pool, filepath.Join(cfg.DataDir, "dev-api-key"))
	if err != nil {
		return err
	}
	lns, err := listenUp(cfg)
	if err != nil {
		return err
	}
	ln := lns.gateway
	pol, err := newPolicy(ctx, cfg, pool, pb, policyURLs{model: modelServerURL(cfg, lns.modelServer.Addr()),
		trainer: trainerServerURL(cfg, lns.trainer.Addr())}, true, logger)
	if err != nil {
		lns.close()
		return err
	}
	if pb != nil {
		if err := installDemoSuites(ctx, pool, cfg.Gateway.PolicyModel, pb.task); err != nil {
			return err
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	modelReady, trainerReady := make(chan struct{}), make(chan struct{})
	g.Go(func() error { return serveModel(ctx, cfg, pool, pol, lns.modelServer, modelReady, logger) })
	g.Go(func() error { return serveTrainer(ctx, cfg, pol, lns.trainer, trainerReady, logger) })
	// One process runs every queue, SWE rollouts included: their agents
	// call this gateway with the development key, like any outside agent.
	if !slices.Contains(cfg.Worker.TaskQueues, flow.SWETaskQueue) {
		cfg.Worker.TaskQueues = append(cfg.Worker.TaskQueues, flow.SWETaskQueue)
	}
	swe := &activities.SWEConfig{GatewayURL: "http://" + ln.Addr().String(), APIKey: key, Model: cfg.Gateway.PolicyModel,
		DockerHost: cfg.Docker.Host, Logger: logger}
	// Evolution asks deployments' reflectors through this gateway, as the
	// development key's tenant, the operator.
	refl := &activities.GatewayReflector{URL: "http://" + ln.Addr().String(), APIKey: key}
	// Gates ask the model server; it answers once it holds what the routes
	// name.
	g.Go(func() error {
		return afterReady(ctx, modelReady, func() error {
			return afterReady(ctx, trainerReady, func() error { return serveWorker(ctx, cfg, c, pool, pol, swe, refl, logger) })
		})
	})
	gw, err := newGateway(cfg, pool, c, logger)
	if err != nil {
		return err
	}
	g.Go(func() error { return afterReady(ctx, modelReady, func() error { return gw.Serve(ctx, ln) }) })
	g.Go(func() error { return announceUp(ctx, c, cfg, pb != nil, lns, key) })
	err = g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// namedPolicyBase is the v0 of a new policy deployment that --policy-base
// names: nil for a seeded random model.
func namedPolicyBase(name, dataDir string, logger *slog.Logger) (*policyBase, error) {
	switch name {
	case "":
		return nil, nil
	case "demo", "demo-tools":
		task, train := demotask.DefaultTask, demotraining.TrainerConfig(logger)
		if name == "demo-tools" {
			task, train = demotask.ToolsTask, demotraining.ToolsTrainerConfig(logger)
		}
		cache := filepath.Join(dataDir, "demo-cache")
		return &policyBase{
			load: func(ctx context.Context) (*trainer.Model, map[string]string, error) {
				return demotask.DeploymentBase(ctx, task, cache, logger)
			},
			origin: demotask.BaseOrigin(task), train: train, task: task,
		}, nil
	default:
		return nil, fmt.Errorf(`--policy-base %q: want "", "demo" or "demo-tools"`, name)
	}
}

// upListeners are where `flywheel up` listens. The policy is served and
// trained as production serves and trains a model: its own model server
// in vLLM's dialect, which the gateway and the gates reach over HTTP and
// releases load new versions into by name, and its own trainer behind
// the Tinker training API, which the workers drive.
type upListeners struct {
	gateway, modelServer, trainer net.Listener
}

func (l upListeners) close() {
	for _, ln := range []net.Listener{l.gateway, l.modelServer, l.trainer} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

func listenUp(cfg config.Config) (upListeners, error) {
	var l upListeners
	for _, x := range []struct {
		what, addr string
		ln         *net.Listener
	}{{"gateway", cfg.Gateway.Listen, &l.gateway}, {"model server", cfg.ModelServer.Listen, &l.modelServer}, {"trainer server", cfg.Trainer.Listen, &l.trainer}} {
		ln, err := net.Listen("tcp", x.addr)
		if err != nil {
			l.close()
			return upListeners{}, fmt.Errorf("%s listen on %s: %w", x.what, x.addr, err)
		}
		*x.ln = ln
	}
	return l, nil
}

// afterReady runs serve once ready is closed, unless ctx ends first.
func afterReady(ctx context.Context, ready <-chan struct{}, serve func() error) error {
	select {
	case <-ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	return serve()
}

// announceUp waits for a workflow's round trip through the worker, starts
// the policy deployment's control loops and prints where everything is.
func announceUp(ctx context.Context, c client.Client, cfg config.Config, demo bool, lns upListeners, key string) error {
	out, err := ping(ctx, c)
	if err != nil {
		return fmt.Errorf("worker round trip: %w", err)
	}
	release := deployment.ReleasePolicy{}
	if demo {
		// The demo deployment learns with no human action: its training
		// loop runs from the start, on the demo's schedule.
		if err := startTraining(ctx, c, cfg.Gateway.PolicyModel, demotraining.TrainingPolicy()); err != nil {
			return err
		}
		release = demotraining.TrainingPolicy().Release
	}
	if err := scheduleWatchdog(ctx, c, cfg.Gateway.PolicyModel, cfg.Control.WatchdogEvery, release); err != nil {
		return err
	}
	if err := scheduleEvolution(ctx, c, cfg.Control.EvolveEvery, release); err != nil {
		return err
	}
	gw := lns.gateway.Addr()
	fmt.Printf("\nFlywheel is up (%s)\n"+
		"  gateway      http://%s   (OpenAI/Anthropic base_url: http://%s/v1)\n"+
		"  temporal ui  %s/namespaces/%s/workflows\n"+
		"  status page  http://%s/status   (versions, gates, decisions, sessions, the curve; JSON: GET /v1/status)\n"+
		"  model server %s   (%s in vLLM's dialect)\n"+
		"  trainer      %s   (%s behind the Tinker training API)\n"+
		"  api key      %s   (tenant %q)\n"+
		"  worker       %s on %s, postgres %s\n\n",
		version(), gw, gw, cfg.Temporal.UIURL, cfg.Temporal.Namespace,
		gw, modelServerURL(cfg, lns.modelServer.Addr()), cfg.Gateway.PolicyModel,
		trainerServerURL(cfg, lns.trainer.Addr()), cfg.Gateway.PolicyModel, key, defaultTenant, out.Worker, out.Compute, out.Postgres)
	return nil
}

// startTraining starts the deployment's TrainingWorkflow with policy, or
// leaves the running one as it is.
func startTraining(ctx context.Context, c client.Client, deployment string, policy flow.TrainingPolicy) error {
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: flow.TrainingWorkflowID(deployment), TaskQueue: flow.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, flow.TrainingWorkflowName, flow.TrainingInput{Deployment: deployment, Policy: policy})
	if err != nil {
		return fmt.Errorf("start training of %s: %w", deployment, err)
	}
	return nil
}

// scheduleWatchdog makes the deployment's watchdog schedule run every
// every with policy's thresholds; every 0 removes it.
func scheduleWatchdog(ctx context.Context, c client.Client, deployment string, every time.Duration, policy deployment.ReleasePolicy) error {
	return upsertSchedule(ctx, c, flow.WatchdogScheduleID(deployment), every, time.Time{}, &client.ScheduleWorkflowAction{
		ID: "watchdog-" + deployment, Workflow: flow.WatchdogWorkflowName, TaskQueue: flow.TaskQueue,
		Args:                     []any{flow.WatchdogInput{Deployment: deployment, Policy: policy}},
		WorkflowExecutionTimeout: 15 * time.Minute,
	})
}

// scheduleEvolution makes the evolution sweep run every every, its first
// run one interval from now (a fresh start has no window of evidence
// yet), each deployment's evolution with policy as its release policy
// (a deployment's own gates win); every 0 removes it.
func scheduleEvolution(ctx context.Context, c client.Client, every time.Duration, policy deployment.ReleasePolicy) error {
	return upsertSchedule(ctx, c, flow.EvolutionSweepScheduleID, every, time.Now().Add(every), &client.ScheduleWorkflowAction{
		ID: flow.EvolutionSweepScheduleID, Workflow: flow.EvolutionSweepWorkflowName, TaskQueue: flow.TaskQueue,
		Args:                     []any{flow.EvolutionSweepInput{Window: every, Release: policy}},
		WorkflowExecutionTimeout: 15 * time.Minute,
	})
}

// upsertSchedule makes schedule id run action every every, from startAt
// (zero: now), creating it or updating the one an earlier `flywheel up`
// made, and never two runs at once; every 0 removes it.
func upsertSchedule(ctx context.Context, c client.Client, id string, every time.Duration, startAt time.Time, action *client.ScheduleWorkflowAction) error {
	h := c.ScheduleClient().GetHandle(ctx, id)
	if every <= 0 {
		var missing *serviceerror.NotFound
		if err := h.Delete(ctx); err != nil && !errors.As(err, &missing) {
			return fmt.Errorf("remove schedule %s: %w", id, err)
		}
		return nil
	}
	spec := client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: every}}, StartAt: startAt}
	_, err := c.ScheduleClient().Create(ctx, client.ScheduleOptions{ID: id, Spec: spec, Action: action, Overlap: enumspb.SCHEDULE_OVERLAP_POLICY_SKIP})
	if err == nil {
		return nil
	}
	if !errors.Is(err, temporal.ErrScheduleAlreadyRunning) {
		return fmt.Errorf("create schedule %s: %w", id, err)
	}
	err = h.Update(ctx, client.ScheduleUpdateOptions{DoUpdate: func(in client.ScheduleUpdateInput) (*client.ScheduleUpdate, error) {
		s := in.Description.Schedule
		s.Spec, s.Action = &spec, action
		if s.Policy != nil {
			s.Policy.Overlap = enumspb.SCHEDULE_OVERLAP_POLICY_SKIP
		}
		return &client.ScheduleUpdate{Schedule: &s}, nil
	}})
	if err != nil {
		return fmt.Errorf("update schedule %s: %w", id, err)
	}
	return nil
}

// ping runs PingWorkflow through the worker.
func ping(ctx context.Context, c client.Client) (flow.PingOutput, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       fmt.Sprintf("ping-%d", time.Now().UnixNano()),
		TaskQueue:                flow.TaskQueue,
		WorkflowExecutionTimeout: time.Minute,
	}, flow.PingWorkflowName, flow.PingInput{Note: "up"})
	if err != nil {
		return flow.PingOutput{}, err
	}
	var out flow.PingOutput
	return out, run.Get(ctx, &out)
}

// devKey returns the development API key kept in path, issuing a new one
// for the default tenant when the file is missing or the key is unknown
// (say, after the database was reset).
func devKey(ctx context.Context, db store.DBTX, path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		key := strings.TrimSpace(string(b))
		if _, err := store.LookupKey(ctx, db, key); err == nil {
			return key, nil
		}
	}
	if err := store.EnsureTenant(ctx, db, defaultTenant); err != nil {
		return "", err
	}
	key, err := store.CreateKey(ctx, db, defaultTenant, "", "flywheel up")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("save dev api key: %w", err)
	}
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("save dev api key: %w", err)
	}
	return key, nil
}
