package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// sweMaxSandboxes bounds the sandboxes one rollout goes through.
const sweMaxSandboxes = 3

// sweDefaultWallTime bounds the agent step when the input sets none; the
// step activity's timeout is derived from it.
const sweDefaultWallTime = 15 * time.Minute

// SWERolloutWorkflow runs one SWE rollout: acquire a sandbox of the task,
// let the agent work through the gateway, grade with the hidden tests,
// record the pass rate as the session's reward, and always release the
// sandbox.
func SWERolloutWorkflow(ctx workflow.Context, in flow.SWERolloutInput) (flow.SWERolloutResult, error) {
	if err := in.Validate(); err != nil {
		return flow.SWERolloutResult{}, err
	}
	r := &sweRollout{in: in, res: flow.SWERolloutResult{TaskID: in.TaskID, SessionID: in.SessionID}}
	return r.run(ctx)
}

type sweRollout struct {
	in  flow.SWERolloutInput
	res flow.SWERolloutResult
}

func sweShortOptions() workflow.ActivityOptions {
	return workflow.ActivityOptions{
		TaskQueue:           flow.SWETaskQueue,
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        time.Second,
			BackoffCoefficient:     2,
			MaximumInterval:        30 * time.Second,
			MaximumAttempts:        4,
			NonRetryableErrorTypes: []string{"BadInput"},
		},
	}
}

func (r *sweRollout) run(ctx workflow.Context) (flow.SWERolloutResult, error) {
	log := workflow.GetLogger(ctx)
	short := workflow.WithActivityOptions(ctx, sweShortOptions())
	if r.res.SessionID == "" {
		var sess flow.SWECreateSessionsOutput
		if err := workflow.ExecuteActivity(short, aSWE.SWECreateSessions, flow.SWECreateSessionsInput{TaskID: r.in.TaskID, Model: r.in.Model, GroupSize: 1}).Get(ctx, &sess); err != nil {
			return r.res, fmt.Errorf("create session: %w", err)
		}
		if len(sess.SessionIDs) != 1 {
			return r.res, temporal.NewNonRetryableApplicationError(fmt.Sprintf("create session: got %d sessions, want 1", len(sess.SessionIDs)), "BadOutput", nil)
		}
		r.res.SessionID = sess.SessionIDs[0]
	}

	defer func() {
		// Release even when the workflow is cancelled or a later step failed.
		r.release(ctx, r.res.SandboxID)
	}()
	var grade flow.SWEGradeOutput
	for n := 1; ; n++ {
		var err error
		grade, err = r.attempt(ctx)
		var gone *temporal.ApplicationError
		if err == nil || !errors.As(err, &gone) || gone.Type() != flow.SWESandboxGoneError {
			if err != nil {
				return r.res, err
			}
			break
		}
		// Its edits went with it; the agent starts over in a new sandbox,
		// under the same session.
		if workflow.GetVersion(ctx, sweChangeReacquire, workflow.DefaultVersion, 1) < 1 || n >= sweMaxSandboxes {
			return r.res, err
		}
		log.Warn("sandbox gone; the rollout starts again in a new one", "TaskID", r.in.TaskID, "SandboxID", r.res.SandboxID, "Error", err)
		r.release(ctx, r.res.SandboxID)
		r.res.SandboxID = ""
	}
	r.res.Reward, r.res.Passed, r.res.Total = grade.Reward, grade.Passed, grade.Total
	r.res.FailToPass, r.res.PassToPass = grade.FailToPass, grade.PassToPass
	r.res.Resolved, r.res.Tampered = grade.Resolved, grade.Tampered

	if err := workflow.ExecuteActivity(short, aSWE.SWERecordReward, flow.SWERecordRewardInput{SessionID: r.res.SessionID, Reward: grade.Reward, TaskID: r.in.TaskID}).Get(ctx, nil); err != nil {
		return r.res, fmt.Errorf("record reward: %w", err)
	}
	log.Info("swe rollout finished", "TaskID", r.in.TaskID, "SessionID", r.res.SessionID, "Reward", grade.Reward, "StopReason", r.res.StopReason)
	return r.res, nil
}

// release gives a sandbox back (the janitor removes what it cannot).
func (r *sweRollout) release(ctx workflow.Context, id string) {
	if id == "" {
		return
	}
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	dctx = workflow.WithActivityOptions(dctx, sweShortOptions())
	if err := workflow.ExecuteActivity(dctx, aSWE.SWERelease, flow.SWEReleaseInput{SandboxID: id}).Get(dctx, nil); err != nil {
		workflow.GetLogger(ctx).Warn("sandbox release failed; the janitor will remove it", "SandboxID", id, "Error", err)
	}
}

// attempt acquires a sandbox (r.res.SandboxID, which run releases), lets
// the agent work in it and grades it.
func (r *sweRollout) attempt(ctx workflow.Context) (flow.SWEGradeOutput, error) {
	// Acquiring may build the task image on a cold worker.
	acqOpts := sweShortOptions()
	acqOpts.StartToCloseTimeout = 15 * time.Minute
	acqOpts.HeartbeatTimeout = time.Minute
	var acq flow.SWEAcquireOutput
	if err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, acqOpts), aSWE.SWEAcquire, flow.SWEAcquireInput{TaskID: r.in.TaskID}).Get(ctx, &acq); err != nil {
		return flow.SWEGradeOutput{}, fmt.Errorf("acquire sandbox: %w", err)
	}
	r.res.SandboxID = acq.SandboxID

	wall := r.in.MaxWallTime
	if wall == 0 {
		wall = sweDefaultWallTime
	}
	stepOpts := sweShortOptions()
	stepOpts.StartToCloseTimeout = wall + 2*time.Minute
	// The step heartbeats every 10 s whatever the agent does, so a dead
	// worker's step is retried after 30 s, not 2 minutes.
	stepOpts.HeartbeatTimeout = 30 * time.Second
	// The agent's edits live in the sandbox; a retried step continues from
	// them, which is what a person would do after a crash too.
	stepOpts.RetryPolicy.MaximumAttempts = 2
	var step flow.SWEStepOutput
	if err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, stepOpts), aSWE.SWEStep, flow.SWEStepInput{
		TaskID: r.in.TaskID, SandboxID: acq.SandboxID, SessionID: r.res.SessionID, Model: r.in.Model,
		MaxToolCalls: r.in.MaxToolCalls, MaxWallTime: wall,
	}).Get(ctx, &step); err != nil {
		return flow.SWEGradeOutput{}, fmt.Errorf("agent step: %w", err)
	}
	r.res.StopReason, r.res.ToolCalls = step.StopReason, step.ToolCalls

	gradeOpts := sweShortOptions()
	gradeOpts.StartToCloseTimeout = 10 * time.Minute
	gradeOpts.HeartbeatTimeout = time.Minute
	var grade flow.SWEGradeOutput
	if err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, gradeOpts), aSWE.SWEGrade, flow.SWEGradeInput{TaskID: r.in.TaskID, SandboxID: acq.SandboxID}).Get(ctx, &grade); err != nil {
		return flow.SWEGradeOutput{}, fmt.Errorf("grade: %w", err)
	}
	return grade, nil
}

// SWEGroupWorkflow runs G rollouts of one task in parallel as child
// workflows, under one gateway session group so their rewards form a GRPO
// group. A failed child counts as failed; the group still completes.
func SWEGroupWorkflow(ctx workflow.Context, in flow.SWEGroupInput) (flow.SWEGroupResult, error) {
	if in.TaskID == "" {
		return flow.SWEGroupResult{}, temporal.NewNonRetryableApplicationError("swe group: TaskID is required", "BadInput", nil)
	}
	if in.GroupSize < 1 || in.GroupSize > flow.SWEMaxGroupSize {
		return flow.SWEGroupResult{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("swe group: GroupSize %d: want 1..%d", in.GroupSize, flow.SWEMaxGroupSize), "BadInput", nil)
	}
	res := flow.SWEGroupResult{TaskID: in.TaskID}
	short := workflow.WithActivityOptions(ctx, sweShortOptions())
	var sess flow.SWECreateSessionsOutput
	if err := workflow.ExecuteActivity(short, aSWE.SWECreateSessions, flow.SWECreateSessionsInput{TaskID: in.TaskID, Model: in.Model, GroupSize: in.GroupSize}).Get(ctx, &sess); err != nil {
		return res, fmt.Errorf("create sessions: %w", err)
	}
	if len(sess.SessionIDs) != in.GroupSize {
		return res, temporal.NewNonRetryableApplicationError(fmt.Sprintf("create sessions: got %d, want %d", len(sess.SessionIDs), in.GroupSize), "BadOutput", nil)
	}
	res.GroupID = sess.GroupID
	parentID := workflow.GetInfo(ctx).WorkflowExecution.ID
	futures := make([]workflow.ChildWorkflowFuture, in.GroupSize)
	for i, sid := range sess.SessionIDs {
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID: fmt.Sprintf("%s/rollout-%d", parentID, i),
		})
		futures[i] = workflow.ExecuteChildWorkflow(cctx, flow.SWERolloutWorkflowName, flow.SWERolloutInput{
			TaskID: in.TaskID, SessionID: sid, Model: in.Model, MaxToolCalls: in.MaxToolCalls, MaxWallTime: in.MaxWallTime,
		})
	}
	res.Rollouts = make([]flow.SWERolloutResult, in.GroupSize)
	sum := 0.0
	for i, f := range futures {
		var out flow.SWERolloutResult
		if err := f.Get(ctx, &out); err != nil {
			workflow.GetLogger(ctx).Warn("swe rollout failed", "Index", i, "Error", err)
			res.Failed++
			res.Rollouts[i] = flow.SWERolloutResult{TaskID: in.TaskID, SessionID: sess.SessionIDs[i], StopReason: "error"}
			continue
		}
		res.Rollouts[i] = out
		sum += out.Reward
		if out.Resolved {
			res.Resolved++
		}
	}
	if ok := in.GroupSize - res.Failed; ok > 0 {
		res.MeanReward = sum / float64(ok)
	}
	return res, nil
}

// RegisterSWEWorkflows registers both SWE workflows on a worker.
func RegisterSWEWorkflows(r worker.WorkflowRegistry) {
	r.RegisterWorkflowWithOptions(SWERolloutWorkflow, workflow.RegisterOptions{Name: flow.SWERolloutWorkflowName})
	r.RegisterWorkflowWithOptions(SWEGroupWorkflow, workflow.RegisterOptions{Name: flow.SWEGroupWorkflowName})
}

// sweChangeReacquire: a rollout whose sandbox is gone (SandboxGone)
// starts again in a new one instead of failing.
const sweChangeReacquire = "swe-reacquire-gone-sandbox"
