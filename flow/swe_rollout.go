package flow

import (
	"time"

	"go.temporal.io/sdk/temporal"
)

// SWE rollout names. The activities run on SWETaskQueue, served only by
// workers that can reach a Docker engine.
const (
	SWERolloutWorkflowName = "SWERolloutWorkflow"
	SWEGroupWorkflowName   = "SWEGroupWorkflow"
	SWETaskQueue           = "flywheel-swe"

	// SWERewardSource is the reward source the grader reports under.
	SWERewardSource = "swe-grader"
	// SWEMaxGroupSize bounds G in one group workflow.
	SWEMaxGroupSize = 64

	// SWESandboxGoneError is the error type of a step or grade whose
	// sandbox no longer exists: its worker died and the janitor of the
	// restarted one removed the dead process's containers. The rollout
	// starts again in a new sandbox.
	SWESandboxGoneError = "SandboxGone"
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

func (in SWERolloutInput) Validate() error {
	if in.TaskID == "" {
		return temporal.NewNonRetryableApplicationError("swe rollout: TaskID is required", "BadInput", nil)
	}
	if in.MaxToolCalls < 0 || in.MaxWallTime < 0 {
		return temporal.NewNonRetryableApplicationError("swe rollout: limits must not be negative", "BadInput", nil)
	}
	return nil
}
