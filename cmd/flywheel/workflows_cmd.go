package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/worker"
)

// The `flywheel session|release|train|evolve|forget` commands: the same
// operations as the `temporal` CLI recipes in docs/workflows.md, with
// Flywheel's ids, names and payloads filled in.

// wfEnv is what a workflow command needs: a Temporal client and, for the
// commands that read Postgres, a pool.
type wfEnv struct {
	c    client.Client
	pool *pgxpool.Pool
}

func (e *wfEnv) close() {
	if e.c != nil {
		e.c.Close()
	}
	if e.pool != nil {
		e.pool.Close()
	}
}

// openWF parses args (flags registered by own) and dials Temporal, and
// Postgres when db is true; it returns the positional arguments.
func openWF(ctx context.Context, name string, args []string, db bool, own func(fs *flag.FlagSet)) (*wfEnv, []string, error) {
	cfg, fs, err := loadConfig(name, args, own)
	if err != nil {
		return nil, nil, err
	}
	logger := newLogger(cfg.Log)
	e := &wfEnv{}
	if e.c, err = worker.Dial(ctx, cfg.Temporal.Address, cfg.Temporal.Namespace, logger); err != nil {
		return nil, nil, err
	}
	if db {
		if e.pool, err = store.Open(ctx, cfg.Database.URL, 2); err != nil {
			e.close()
			return nil, nil, err
		}
	}
	return e, fs.Args(), nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// verb splits a command's subcommand from the rest of its arguments. Asked
// for help (-h, --help, help) it prints usage and returns flag.ErrHelp, so
// the command exits 0 as the flag-parsing commands do; with no subcommand
// the usage is the error.
func verb(args []string, usage string) (string, []string, error) {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintln(os.Stderr, "usage:", usage)
		return "", nil, flag.ErrHelp
	}
	if len(args) == 0 {
		return "", nil, fmt.Errorf("usage: %s", usage)
	}
	return args[0], args[1:], nil
}

// subcommand parses the arguments of subcommand v of cmd with the flags
// own[v] registers (nil: only the configuration flags); a subcommand own
// does not name is an error that says the usage.
func subcommand(cmd, v string, args []string, usage string, own map[string]func(fs *flag.FlagSet)) (config.Config, *flag.FlagSet, error) {
	f, ok := own[v]
	if !ok {
		return config.Config{}, nil, fmt.Errorf("unknown %s subcommand %q; usage: %s", cmd, v, usage)
	}
	return loadConfig(cmd+" "+v, args, f)
}

func one(pos []string, what string) (string, error) {
	if len(pos) != 1 || pos[0] == "" {
		return "", fmt.Errorf("give exactly one %s", what)
	}
	return pos[0], nil
}

// queryState asks a workflow's state query and prints the answer.
func queryState(ctx context.Context, c client.Client, id, query string) error {
	v, err := c.QueryWorkflow(ctx, id, "", query)
	if err != nil {
		return fmt.Errorf("query %s of %s: %w", query, id, err)
	}
	var out any
	if err := v.Get(&out); err != nil {
		return fmt.Errorf("decode %s of %s: %w", query, id, err)
	}
	return printJSON(out)
}

// listWorkflows prints the workflows a visibility query matches.
func listWorkflows(ctx context.Context, c client.Client, query string) error {
	resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: query})
	if err != nil {
		return fmt.Errorf("list workflows: %w", err)
	}
	for _, w := range resp.GetExecutions() {
		fmt.Printf("%-50s %-20s %-10s %s\n", w.GetExecution().GetWorkflowId(), w.GetType().GetName(), w.GetStatus().String(), w.GetStartTime().AsTime().Format(time.RFC3339))
	}
	return nil
}

const sessionUsage = "flywheel session show [--tenant T] ID | session list [--tenant T]"

func runSessionCmd(ctx context.Context, args []string) error {
	v, rest, err := verb(args, sessionUsage)
	if err != nil {
		return err
	}
	var tenant string
	e, pos, err := openWF(ctx, "session "+v, rest, false, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "the session's tenant (show: ID is then the session id, not the workflow id \"<tenant>/<session>\"); only this tenant's sessions (list)")
	})
	if err != nil {
		return err
	}
	defer e.close()
	switch v {
	case "show":
		id, err := one(pos, "session id")
		if err != nil {
			return err
		}
		if tenant != "" {
			id = flow.SessionWorkflowID(tenant, id)
		}
		return queryState(ctx, e.c, id, flow.SessionStateQuery)
	case "list":
		q := fmt.Sprintf("WorkflowType = '%s'", flow.SessionWorkflowName)
		if tenant != "" {
			q += fmt.Sprintf(" AND %s = %s", flow.TenantKey.GetName(), strconv.Quote(tenant))
		}
		return listWorkflows(ctx, e.c, q)
	}
	return fmt.Errorf("usage: %s", sessionUsage)
}

const releaseUsage = "flywheel release start --deployment D --layer L --candidate C [policy flags] | show ID | list --deployment D | approve ID | abort ID [--note TEXT]"

func runReleaseCmd(ctx context.Context, args []string) error {
	v, rest, err := verb(args, releaseUsage)
	if err != nil {
		return err
	}
	var in flow.ReleaseInput
	var note string
	e, pos, err := openWF(ctx, "release "+v, rest, v == "show" || v == "list", func(fs *flag.FlagSet) {
		fs.StringVar(&in.Deployment, "deployment", "", "deployment (start, list)")
		fs.StringVar(&in.Layer, "layer", artefact.LayerWeights, "weights, playbook, harness or tool_schema (start)")
		fs.StringVar(&in.Candidate, "candidate", "", "model version or artefact version (start)")
		fs.StringVar(&in.Reason, "reason", "manual release", "why (start)")
		fs.DurationVar(&in.Policy.ShadowDuration, "shadow", 0, "shadow duration (default 1m)")
		fs.Float64Var(&in.Policy.CanaryShare, "canary-share", 0, "share of live traffic in the canary (default 0.1)")
		fs.DurationVar(&in.Policy.CanaryDuration, "canary-duration", 0, "canary duration (default 10m)")
		fs.IntVar(&in.Policy.MinCanarySamples, "min-canary-samples", 0, "rewarded interactions a canary verdict needs (default 20)")
		fs.BoolVar(&in.Policy.RequireApproval, "require-approval", false, "wait for `flywheel release approve` before promoting")
		fs.StringVar(&note, "note", "", "note sent with approve / abort")
	})
	if err != nil {
		return err
	}
	defer e.close()
	switch v {
	case "start":
		if in.Deployment == "" || in.Candidate == "" {
			return errors.New("release start: --deployment and --candidate are required")
		}
		id := flow.ReleaseWorkflowID(in.Deployment, in.Layer, in.Candidate)
		run, err := e.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.ReleaseWorkflowName, in)
		if err != nil {
			return fmt.Errorf("start release: %w", err)
		}
		fmt.Printf("release started: workflow %s run %s\n", run.GetID(), run.GetRunID())
		return nil
	case "show":
		id, err := one(pos, "release workflow id")
		if err != nil {
			return err
		}
		rel, err := store.ReleaseByWorkflow(ctx, e.pool, id)
		if err != nil {
			return err
		}
		gates, err := store.ReleaseGates(ctx, e.pool, rel.ID)
		if err != nil {
			return err
		}
		return printJSON(map[string]any{"release": rel, "gates": gates})
	case "list":
		if in.Deployment == "" {
			return errors.New("release list: --deployment is required")
		}
		rels, err := store.ListReleases(ctx, e.pool, in.Deployment, 50)
		if err != nil {
			return err
		}
		return printJSON(rels)
	case "approve", "abort":
		id, err := one(pos, "release workflow id")
		if err != nil {
			return err
		}
		sig := flow.ReleaseApproveSignal
		if v == "abort" {
			sig = flow.ReleaseAbortSignal
		}
		if err := e.c.SignalWorkflow(ctx, id, "", sig, note); err != nil {
			return fmt.Errorf("%s %s: %w", v, id, err)
		}
		fmt.Printf("sent %s to %s\n", sig, id)
		return nil
	}
	return fmt.Errorf("usage: %s", releaseUsage)
}

const trainUsage = "flywheel train now --deployment D [--batch-size N] | show --deployment D"

func runTrainCmd(ctx context.Context, args []string) error {
	v, rest, err := verb(args, trainUsage)
	if err != nil {
		return err
	}
	var in flow.TrainingInput
	e, _, err := openWF(ctx, "train "+v, rest, false, func(fs *flag.FlagSet) {
		fs.StringVar(&in.Deployment, "deployment", "", "deployment to train")
		fs.IntVar(&in.Policy.BatchSize, "batch-size", 0, "samples per step (default 32)")
		fs.DurationVar(&in.Policy.MaxBatchAge, "max-batch-age", 0, "train a smaller batch after this wait (default 10m)")
		fs.IntVar(&in.Policy.MaxStaleness, "eta", 0, "η: drop samples more than η versions behind (default 4)")
	})
	if err != nil {
		return err
	}
	defer e.close()
	if in.Deployment == "" {
		return errors.New("train: --deployment is required")
	}
	id := flow.TrainingWorkflowID(in.Deployment)
	switch v {
	case "now":
		run, err := e.c.SignalWithStartWorkflow(ctx, id, flow.TrainNowSignal, nil,
			client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.TrainingWorkflowName, in)
		if err != nil {
			return fmt.Errorf("train now: %w", err)
		}
		fmt.Printf("training requested: workflow %s run %s\n", run.GetID(), run.GetRunID())
		return nil
	case "show":
		return queryState(ctx, e.c, id, flow.TrainingStateQuery)
	}
	return fmt.Errorf("usage: %s", trainUsage)
}

const evolveUsage = "flywheel evolve now --deployment D [--window 1h] [--dry-run] | schedule --deployment D [--every 1h] | list --deployment D"

func runEvolveCmd(ctx context.Context, args []string) error {
	v, rest, err := verb(args, evolveUsage)
	if err != nil {
		return err
	}
	var in flow.EvolutionInput
	var every time.Duration
	e, _, err := openWF(ctx, "evolve "+v, rest, v == "list", func(fs *flag.FlagSet) {
		fs.StringVar(&in.Deployment, "deployment", "", "deployment to evolve")
		fs.DurationVar(&in.Window, "window", time.Hour, "evidence window")
		fs.BoolVar(&in.DryRun, "dry-run", false, "record the decision without acting on it")
		fs.DurationVar(&every, "every", time.Hour, "schedule interval")
	})
	if err != nil {
		return err
	}
	defer e.close()
	if in.Deployment == "" {
		return errors.New("evolve: --deployment is required")
	}
	switch v {
	case "now":
		in.Trigger = "manual"
		id := fmt.Sprintf("evolution-%s-%d", in.Deployment, time.Now().Unix())
		run, err := e.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue}, flow.EvolutionWorkflowName, in)
		if err != nil {
			return fmt.Errorf("start evolution: %w", err)
		}
		var res flow.EvolutionResult
		if err := run.Get(ctx, &res); err != nil {
			return fmt.Errorf("evolution %s: %w", id, err)
		}
		return printJSON(res)
	case "schedule":
		in.Trigger = "schedule"
		_, err := e.c.ScheduleClient().Create(ctx, client.ScheduleOptions{
			ID:   flow.EvolutionScheduleID(in.Deployment),
			Spec: client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: every}}},
			Action: &client.ScheduleWorkflowAction{
				ID: "evolution-" + in.Deployment, Workflow: flow.EvolutionWorkflowName,
				Args: []any{in}, TaskQueue: flow.TaskQueue,
			},
		})
		if err != nil {
			return fmt.Errorf("create schedule: %w", err)
		}
		fmt.Printf("schedule %s runs EvolutionWorkflow every %s\n", flow.EvolutionScheduleID(in.Deployment), every)
		return nil
	case "list":
		rows, err := store.ListDecisions(ctx, e.pool, in.Deployment, 50)
		if err != nil {
			return err
		}
		return printJSON(rows)
	}
	return fmt.Errorf("usage: %s", evolveUsage)
}

const forgetUsage = "flywheel forget retire REQUEST_ID"

func runForgetCmd(ctx context.Context, args []string) error {
	v, rest, err := verb(args, forgetUsage)
	if err != nil {
		return err
	}
	e, pos, err := openWF(ctx, "forget "+v, rest, false, nil)
	if err != nil {
		return err
	}
	defer e.close()
	if v != "retire" {
		return fmt.Errorf("usage: %s", forgetUsage)
	}
	s, err := one(pos, "forget request id")
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("forget request id %q is not a positive number", s)
	}
	run, err := e.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: flow.ForgetWorkflowID(id), TaskQueue: flow.TaskQueue},
		flow.ForgetWorkflowName, flow.ForgetInput{RequestID: id})
	if err != nil {
		return fmt.Errorf("start forget: %w", err)
	}
	var res flow.ForgetResult
	if err := run.Get(ctx, &res); err != nil {
		return fmt.Errorf("forget %d: %w", id, err)
	}
	return printJSON(res)
}
