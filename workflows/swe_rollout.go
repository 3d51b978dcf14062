package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// SWE rollout names. The activities run on SWETaskQueue, served only by
// workers that can reach a Docker engine.
const (
	SWERolloutWorkflowName = "SWERolloutWorkflow"
	SWEGroupWorkflowName   = "SWEGroupWorkflow"
	SWETaskQueue           = "flywheel-swe"

	SWECreateSessionsActivity = "SWECreateSessions"
	SWEAcquireActivity        = "SWEAcquire"
	SWEStepActivity           = "SWEStep"
	SWEGradeActivity          = "SWEGrade"
	SWERecordRewardActivity   = "SWERecordReward"
	SWEReleaseActivity        = "SWERelease"

	// SWERewardSource is the reward source the grader reports under.
	SWERewardSource = "swe-grader"
	// SWEMaxGroupSize bounds G in one group workflow.
	SWEMaxGroupSize = 64

	// SWESandboxGoneError is the error type of a step or grade whose
	// sandbox no longer exists: its worker died and the janitor of the
	// restarted one removed the dead process's containers. The rollout
	// starts again in a new sandbox.
	SWESandboxGoneError = "SandboxGone"
	// sweMaxSandboxes bounds the sandboxes one rollout goes through.
	sweMaxSandboxes = 3
)

// SWERolloutInput starts one rollout of one task.
type SWERolloutInput struct {
	TaskID string
	// SessionID is the gateway session the agent's calls are captured under;
	// when empty the rollout creates one.
	SessionID string
	// Model is the deployment the agent asks the gateway for.
	Model string
	// MaxToolCalls and MaxWallTime cap the agent; zero takes the activity's
	// defaults.
	MaxToolCalls int
	MaxWallTime  time.Duration
}

// SWERolloutResult is the rollout's small summary; the trajectory itself is
// in Postgres under SessionID.
type SWERolloutResult struct {
	TaskID     string
	SessionID  string
	SandboxID  string
	StopReason string
	ToolCalls  int
	Reward     float64
	Passed     int
	Total      int
	// FailToPass and PassToPass count the failing tests fixed and the
	// passing tests kept, apart.
	FailToPass int `json:",omitempty"`
	PassToPass int `json:",omitempty"`
	Resolved   bool
	Tampered   bool
}

// SWEGroupInput starts G rollouts of one task, a GRPO group.
type SWEGroupInput struct {
	TaskID    string
	GroupSize int
	Model     string
	// MaxToolCalls and MaxWallTime are passed to every rollout.
	MaxToolCalls int
	MaxWallTime  time.Duration
}

// SWEGroupResult summarises a group.
type SWEGroupResult struct {
	TaskID     string
	GroupID    string
	Rollouts   []SWERolloutResult
	MeanReward float64
	Resolved   int
	// Failed counts rollouts that ended in an error (no reward recorded).
	Failed int
}

// Activity inputs and outputs.
type (
	SWECreateSessionsInput struct {
		TaskID    string
		Model     string
		GroupSize int
	}
	SWECreateSessionsOutput struct {
		GroupID    string
		SessionIDs []string
	}
	SWEAcquireInput struct {
		TaskID string
	}
	SWEAcquireOutput struct {
		SandboxID string
		Image     string
	}
	SWEStepInput struct {
		TaskID       string
		SandboxID    string
		SessionID    string
		Model        string
		MaxToolCalls int
		MaxWallTime  time.Duration
	}
	SWEStepOutput struct {
		StopReason string
		ToolCalls  int
		Turns      int
		Denied     int
	}
	SWEGradeInput struct {
		TaskID    string
		SandboxID string
	}
	SWEGradeOutput struct {
		Reward   float64
		Passed   int
		Total    int
		Resolved bool
		Tampered bool
		Reasons  []string
		// FailToPass and PassToPass count the fixed and the kept tests
		// (tasks.Result).
		FailToPass int `json:",omitempty"`
		PassToPass int `json:",omitempty"`
	}
	SWERecordRewardInput struct {
		SessionID string
		Reward    float64
		TaskID    string
	}
	SWEReleaseInput struct {
		SandboxID string
	}
)

// sweDefaultWallTime bounds the agent step when the input sets none; the
// step activity's timeout is derived from it.
const sweDefaultWallTime = 15 * time.Minute

func (in SWERolloutInput) validate() error {
	if in.TaskID == "" {
		return temporal.NewNonRetryableApplicationError("swe rollout: TaskID is required", "BadInput", nil)
	}
	if in.MaxToolCalls < 0 || in.MaxWallTime < 0 {
		return temporal.NewNonRetryableApplicationError("swe rollout: limits must not be negative", "BadInput", nil)
	}
	return nil
}

// SWERolloutWorkflow runs one SWE rollout: acquire a sandbox of the task,
// let the agent work through the gateway, grade with the hidden tests,
// record the pass rate as the session's reward, and always release the
// sandbox.
func SWERolloutWorkflow(ctx workflow.Context, in SWERolloutInput) (SWERolloutResult, error) {
	if err := in.validate(); err != nil {
		return SWERolloutResult{}, err
	}
	r := &sweRollout{in: in, res: SWERolloutResult{TaskID: in.TaskID, SessionID: in.SessionID}}
	return r.run(ctx)
}

type sweRollout struct {
	in  SWERolloutInput
	res SWERolloutResult
}

func sweShortOptions() workflow.ActivityOptions {
	return workflow.ActivityOptions{
		TaskQueue:           SWETaskQueue,
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

func (r *sweRollout) run(ctx workflow.Context) (SWERolloutResult, error) {
	log := workflow.GetLogger(ctx)
	short := workflow.WithActivityOptions(ctx, sweShortOptions())
	if r.res.SessionID == "" {
		var sess SWECreateSessionsOutput
		if err := workflow.ExecuteActivity(short, SWECreateSessionsActivity, SWECreateSessionsInput{TaskID: r.in.TaskID, Model: r.in.Model, GroupSize: 1}).Get(ctx, &sess); err != nil {
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
	var grade SWEGradeOutput
	for n := 1; ; n++ {
		var err error
		grade, err = r.attempt(ctx)
		var gone *temporal.ApplicationError
		if err == nil || !errors.As(err, &gone) || gone.Type() != SWESandboxGoneError {
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

	if err := workflow.ExecuteActivity(short, SWERecordRewardActivity, SWERecordRewardInput{SessionID: r.res.SessionID, Reward: grade.Reward, TaskID: r.in.TaskID}).Get(ctx, nil); err != nil {
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
	if err := workflow.ExecuteActivity(dctx, SWEReleaseActivity, SWEReleaseInput{SandboxID: id}).Get(dctx, nil); err != nil {
		workflow.GetLogger(ctx).Warn("sandbox release failed; the janitor will remove it", "SandboxID", id, "Error", err)
	}
}

// attempt acquires a sandbox (r.res.SandboxID, which run releases), lets
// the agent work in it and grades it.
func (r *sweRollout) attempt(ctx workflow.Context) (SWEGradeOutput, error) {
	// Acquiring may build the task image on a cold worker.
	acqOpts := sweShortOptions()
	acqOpts.StartToCloseTimeout = 15 * time.Minute
	acqOpts.HeartbeatTimeout = time.Minute
	var acq SWEAcquireOutput
	if err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, acqOpts), SWEAcquireActivity, SWEAcquireInput{TaskID: r.in.TaskID}).Get(ctx, &acq); err != nil {
		return SWEGradeOutput{}, fmt.Errorf("acquire sandbox: %w", err)
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
	var step SWEStepOutput
	if err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, stepOpts), SWEStepActivity, SWEStepInput{
		TaskID: r.in.TaskID, SandboxID: acq.SandboxID, SessionID: r.res.SessionID, Model: r.in.Model,
		MaxToolCalls: r.in.MaxToolCalls, MaxWallTime: wall,
	}).Get(ctx, &step); err != nil {
		return SWEGradeOutput{}, fmt.Errorf("agent step: %w", err)
	}
	r.res.StopReason, r.res.ToolCalls = step.StopReason, step.ToolCalls

	gradeOpts := sweShortOptions()
	gradeOpts.StartToCloseTimeout = 10 * time.Minute
	gradeOpts.HeartbeatTimeout = time.Minute
	var grade SWEGradeOutput
	if err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, gradeOpts), SWEGradeActivity, SWEGradeInput{TaskID: r.in.TaskID, SandboxID: acq.SandboxID}).Get(ctx, &grade); err != nil {
		return SWEGradeOutput{}, fmt.Errorf("grade: %w", err)
	}
	return grade, nil
}

// SWEGroupWorkflow runs G rollouts of one task in parallel as child
// workflows, under one gateway session group so their rewards form a GRPO
// group. A failed child counts as failed; the group still completes.
func SWEGroupWorkflow(ctx workflow.Context, in SWEGroupInput) (SWEGroupResult, error) {
	if in.TaskID == "" {
		return SWEGroupResult{}, temporal.NewNonRetryableApplicationError("swe group: TaskID is required", "BadInput", nil)
	}
	if in.GroupSize < 1 || in.GroupSize > SWEMaxGroupSize {
		return SWEGroupResult{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("swe group: GroupSize %d: want 1..%d", in.GroupSize, SWEMaxGroupSize), "BadInput", nil)
	}
	res := SWEGroupResult{TaskID: in.TaskID}
	short := workflow.WithActivityOptions(ctx, sweShortOptions())
	var sess SWECreateSessionsOutput
	if err := workflow.ExecuteActivity(short, SWECreateSessionsActivity, SWECreateSessionsInput{TaskID: in.TaskID, Model: in.Model, GroupSize: in.GroupSize}).Get(ctx, &sess); err != nil {
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
		futures[i] = workflow.ExecuteChildWorkflow(cctx, SWERolloutWorkflowName, SWERolloutInput{
			TaskID: in.TaskID, SessionID: sid, Model: in.Model, MaxToolCalls: in.MaxToolCalls, MaxWallTime: in.MaxWallTime,
		})
	}
	res.Rollouts = make([]SWERolloutResult, in.GroupSize)
	sum := 0.0
	for i, f := range futures {
		var out SWERolloutResult
		if err := f.Get(ctx, &out); err != nil {
			workflow.GetLogger(ctx).Warn("swe rollout failed", "Index", i, "Error", err)
			res.Failed++
			res.Rollouts[i] = SWERolloutResult{TaskID: in.TaskID, SessionID: sess.SessionIDs[i], StopReason: "error"}
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
	r.RegisterWorkflowWithOptions(SWERolloutWorkflow, workflow.RegisterOptions{Name: SWERolloutWorkflowName})
	r.RegisterWorkflowWithOptions(SWEGroupWorkflow, workflow.RegisterOptions{Name: SWEGroupWorkflowName})
}

// sweChangeReacquire: a rollout whose sandbox is gone (SandboxGone)
// starts again in a new one instead of failing.
const sweChangeReacquire = "swe-reacquire-gone-sandbox"
