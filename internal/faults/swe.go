package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	enumspb "go.temporal.io/api/enums/v1"
	tclient "go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/sandbox"
)

// sweTask is the shipped SWE task the rollout works on.
const sweTask = "word-count"

// SWEFigures are what a worker killed in an SWE rollout left behind.
type SWEFigures struct {
	// ControlOutcome is how a rollout of the same task ended with no
	// fault, just before: what the killed one should match.
	ControlOutcome string `json:"control_outcome"`
	// KilledIn is the rollout's activity that was running (attempt
	// KilledAttempt) when `flywheel up`, the process that runs the SWE
	// queue, was killed.
	KilledIn      string `json:"killed_in"`
	KilledAttempt int32  `json:"killed_attempt"`
	// Outcome is how the rollout ended ("completed", "failed: …", or
	// "running" when the settle time ran out); DoneS the time from the
	// restart to its end (-1: not ended).
	Outcome string  `json:"outcome"`
	DoneS   float64 `json:"done_s"`
	// Sandboxes (containers with the project's labels) owned by the
	// killed process before the kill and after the rollout ended
	// (Leaked, target 0), and owned by the restarted one at the end (its
	// warm pool).
	KilledOwned int `json:"killed_owned"`
	Leaked      int `json:"leaked"`
	LiveOwned   int `json:"live_owned"`
}

// sweReady says why the SWE fault cannot run here ("" when it can): it
// needs a Docker engine and the in-sandbox agent, prebuilt
// (FLYWHEEL_SANDBOX_AGENT) or built now from the module the process runs
// in. The agent's path goes to `flywheel up` through the environment.
func sweReady(ctx context.Context, dir string) (agent, skip string) {
	cli, err := sandbox.Connect(ctx, "")
	if err != nil {
		return "", "no Docker engine: " + err.Error()
	}
	_ = cli.Close()
	if p := os.Getenv("FLYWHEEL_SANDBOX_AGENT"); p != "" {
		return p, ""
	}
	b, err := sandbox.AgentSource{}.Load(ctx)
	if err != nil {
		return "", "no sandbox agent: " + err.Error()
	}
	agent = filepath.Join(dir, "flywheel-agent")
	if err := os.WriteFile(agent, b, 0o755); err != nil {
		return "", "no sandbox agent: " + err.Error()
	}
	return agent, ""
}

// sweRun is a rollout whose worker was killed.
type sweRun struct {
	id        string
	killed    int // the killed process's pid
	restarted time.Time
	f         *SWEFigures
}

// sweKill starts an SWE rollout, waits (up to wait) until its agent step
// or grading runs in a sandbox, SIGKILLs `flywheel up` and restarts it.
func sweKill(ctx context.Context, st *stack, wait time.Duration) (*sweRun, error) {
	c, err := st.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	docker, err := sandbox.Connect(ctx, "")
	if err != nil {
		return nil, err
	}
	defer docker.Close()
	f := &SWEFigures{DoneS: -1}
	// The control also builds the task's image, so the killed rollout's
	// step comes soon after it starts.
	control, err := startRollout(ctx, c)
	if err != nil {
		return nil, err
	}
	if f.ControlOutcome, err = rolloutOutcome(ctx, c, control, wait); err != nil {
		return nil, err
	}
	// With a policy that answers fast (or refuses at once) a step lasts
	// milliseconds: a rollout whose step was not caught running is
	// followed by another.
	var id string
	deadline := time.Now().Add(wait)
	for try := 1; f.KilledIn == ""; try++ {
		if time.Now().After(deadline) || try > 5 {
			return nil, fmt.Errorf("no agent step or grading of %d rollouts was caught running in %s", try-1, wait)
		}
		if id, err = startRollout(ctx, c); err != nil {
			return nil, err
		}
		if f.KilledIn, f.KilledAttempt, err = awaitSandboxStep(ctx, c, id, deadline); err != nil {
			return nil, err
		}
	}
	killed := st.up.pid()
	if err := st.up.kill(); err != nil {
		return nil, err
	}
	if f.KilledOwned, err = sandboxesOf(ctx, docker, killed); err != nil {
		return nil, err
	}
	if err := st.startUp(ctx); err != nil {
		return nil, err
	}
	return &sweRun{id: id, killed: killed, restarted: time.Now(), f: f}, nil
}

// awaitSandboxStep polls a rollout until its agent step or grading runs
// (its name and attempt), it ends (""), or deadline passes ("").
func awaitSandboxStep(ctx context.Context, c tclient.Client, id string, deadline time.Time) (string, int32, error) {
	for time.Now().Before(deadline) {
		d, err := c.DescribeWorkflowExecution(ctx, id, "")
		if err != nil {
			return "", 0, fmt.Errorf("describe %s: %w", id, err)
		}
		for _, a := range d.GetPendingActivities() {
			name := a.GetActivityType().GetName()
			if (name == flow.ActivityName((*activities.SWEActivities).SWEStep) || name == flow.ActivityName((*activities.SWEActivities).SWEGrade)) && a.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED {
				return name, a.GetAttempt(), nil
			}
		}
		if d.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			return "", 0, nil
		}
		sleep(ctx, 5*time.Millisecond)
		if err := ctx.Err(); err != nil {
			return "", 0, err
		}
	}
	return "", 0, nil
}

// settleSWE waits (up to settle) for the rollout to end, then counts the
// sandboxes the killed process and the restarted one own.
func settleSWE(ctx context.Context, st *stack, r *sweRun, settle time.Duration) error {
	f := r.f
	c, err := st.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	if f.Outcome, err = rolloutOutcome(ctx, c, r.id, settle); err != nil {
		return err
	}
	if f.Outcome != "running" {
		f.DoneS = time.Since(r.restarted).Seconds()
	}
	docker, err := sandbox.Connect(ctx, "")
	if err != nil {
		return err
	}
	defer docker.Close()
	if f.Leaked, err = sandboxesOf(ctx, docker, r.killed); err != nil {
		return err
	}
	f.LiveOwned, err = sandboxesOf(ctx, docker, st.up.pid())
	return err
}

// startRollout starts a rollout of sweTask, as `temporal workflow start`
// would.
func startRollout(ctx context.Context, c tclient.Client) (string, error) {
	id := fmt.Sprintf("faults-swe-%d", time.Now().UnixNano())
	_, err := c.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{ID: id, TaskQueue: flow.SWETaskQueue}, flow.SWERolloutWorkflowName,
		flow.SWERolloutInput{TaskID: sweTask, MaxWallTime: 2 * time.Minute})
	if err != nil {
		return "", fmt.Errorf("start rollout: %w", err)
	}
	return id, nil
}

// rolloutOutcome waits (up to limit) for a rollout to end and says how:
// "completed (reward, stop reason)", "failed: why", or "running".
func rolloutOutcome(ctx context.Context, c tclient.Client, id string, limit time.Duration) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var res flow.SWERolloutResult
	err := c.GetWorkflow(wctx, id, "").Get(wctx, &res)
	switch {
	case err == nil:
		return fmt.Sprintf("completed (reward %g, %s)", res.Reward, res.StopReason), nil
	case ctx.Err() != nil:
		return "", ctx.Err()
	case wctx.Err() != nil:
		return "running", nil
	default:
		return "failed: " + rootCause(err), nil
	}
}

// rootCause is the innermost message of a workflow's failure.
func rootCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

// removeSandboxesOf removes the sandbox containers processes pids own:
// what a worker killed with no drain (or dumped by --keep's SIGQUIT) left
// and no janitor of a later worker of the run removed. Best effort: no
// Docker, nothing to do.
func removeSandboxesOf(pids []int) {
	if len(pids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := sandbox.Connect(ctx, "")
	if err != nil {
		return
	}
	defer cli.Close()
	for _, pid := range pids {
		list, err := listSandboxesOf(ctx, cli, pid)
		if err != nil {
			return
		}
		for _, c := range list {
			_, _ = cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
		}
	}
}

// sandboxesOf counts the sandbox containers (running or not) owned by
// process pid on this host (sandbox.OwnerID: "host/pid/nonce").
func sandboxesOf(ctx context.Context, cli *client.Client, pid int) (int, error) {
	list, err := listSandboxesOf(ctx, cli, pid)
	return len(list), err
}

// listSandboxesOf lists them.
func listSandboxesOf(ctx context.Context, cli *client.Client, pid int) ([]container.Summary, error) {
	host, _ := os.Hostname()
	prefix := host + "/" + strconv.Itoa(pid) + "/"
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", sandbox.LabelManaged+"=1").Add("label", sandbox.LabelKind+"=sandbox")})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var out []container.Summary
	for _, c := range list.Items {
		if strings.HasPrefix(c.Labels[sandbox.LabelOwner], prefix) {
			out = append(out, c)
		}
	}
	return out, nil
}
