package workflows

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/flywheel-ai/flywheel/flow"
)

// sweStubs are stand-ins for the Docker- and gateway-backed activities
// (activities/swe_test.go runs the real ones); they record the call order.
type sweStubs struct {
	mu       sync.Mutex
	calls    []string
	released []string
	rewards  map[string]float64
	failStep map[string]bool // by session id
	// goneSteps steps answer that their sandbox is gone, as after a
	// worker died, before the next ones work.
	goneSteps int
	acquired  int
}

func (s *sweStubs) record(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, name)
}

func (s *sweStubs) register(env *testsuite.TestWorkflowEnvironment) {
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SWECreateSessionsInput) (flow.SWECreateSessionsOutput, error) {
		s.record("create")
		out := flow.SWECreateSessionsOutput{GroupID: "grp_1"}
		for i := range in.GroupSize {
			out.SessionIDs = append(out.SessionIDs, "sess_"+string(rune('a'+i)))
		}
		return out, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSWE.SWECreateSessions)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SWEAcquireInput) (flow.SWEAcquireOutput, error) {
		s.record("acquire")
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.acquired++; s.acquired > 1 {
			return flow.SWEAcquireOutput{SandboxID: fmt.Sprintf("sb-%s-%d", in.TaskID, s.acquired)}, nil
		}
		return flow.SWEAcquireOutput{SandboxID: "sb-" + in.TaskID}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSWE.SWEAcquire)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SWEStepInput) (flow.SWEStepOutput, error) {
		s.record("step")
		if s.failStep[in.SessionID] {
			return flow.SWEStepOutput{}, temporal.NewNonRetryableApplicationError("model down", "Test", errors.New("model down"))
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.goneSteps > 0 {
			s.goneSteps--
			return flow.SWEStepOutput{}, temporal.NewNonRetryableApplicationError("sandbox "+in.SandboxID+": not found", flow.SWESandboxGoneError, nil)
		}
		return flow.SWEStepOutput{StopReason: "submitted", ToolCalls: 4}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSWE.SWEStep)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SWEGradeInput) (flow.SWEGradeOutput, error) {
		s.record("grade")
		return flow.SWEGradeOutput{Reward: 0.5, Passed: 1, Total: 2}, nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSWE.SWEGrade)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SWERecordRewardInput) error {
		s.record("reward")
		s.mu.Lock()
		defer s.mu.Unlock()
		s.rewards[in.SessionID] = in.Reward
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSWE.SWERecordReward)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SWEReleaseInput) error {
		s.record("release")
		s.mu.Lock()
		defer s.mu.Unlock()
		s.released = append(s.released, in.SandboxID)
		return nil
	}, activity.RegisterOptions{Name: flow.ActivityName(aSWE.SWERelease)})
}

func newSWEEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *sweStubs) {
	var suite testsuite.WorkflowTestSuite
	env := newWorkflowEnv(&suite)
	RegisterSWEWorkflows(env)
	stubs := &sweStubs{rewards: map[string]float64{}, failStep: map[string]bool{}}
	stubs.register(env)
	return env, stubs
}

func TestSWERolloutRunsActivitiesInOrder(t *testing.T) {
	env, stubs := newSWEEnv(t)
	env.ExecuteWorkflow(SWERolloutWorkflow, flow.SWERolloutInput{TaskID: "median"})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var out flow.SWERolloutResult
	require.NoError(t, env.GetWorkflowResult(&out))
	require.Equal(t, []string{"create", "acquire", "step", "grade", "reward", "release"}, stubs.calls)
	require.Equal(t, flow.SWERolloutResult{TaskID: "median", SessionID: "sess_a", SandboxID: "sb-median", StopReason: "submitted", ToolCalls: 4, Reward: 0.5, Passed: 1, Total: 2}, out)
	require.Equal(t, 0.5, stubs.rewards["sess_a"])
}

func TestSWERolloutReleasesWhenTheStepFails(t *testing.T) {
	env, stubs := newSWEEnv(t)
	stubs.failStep["sess_x"] = true
	env.ExecuteWorkflow(SWERolloutWorkflow, flow.SWERolloutInput{TaskID: "median", SessionID: "sess_x"})
	require.Error(t, env.GetWorkflowError())
	require.Equal(t, []string{"acquire", "step", "release"}, stubs.calls)
	require.Equal(t, []string{"sb-median"}, stubs.released)
	require.Empty(t, stubs.rewards, "no reward without a grade")
}

func TestSWERolloutRejectsBadInput(t *testing.T) {
	env, stubs := newSWEEnv(t)
	env.ExecuteWorkflow(SWERolloutWorkflow, flow.SWERolloutInput{})
	require.Error(t, env.GetWorkflowError())
	require.Empty(t, stubs.calls)

	env, _ = newSWEEnv(t)
	env.ExecuteWorkflow(SWEGroupWorkflow, flow.SWEGroupInput{TaskID: "median", GroupSize: flow.SWEMaxGroupSize + 1})
	require.Error(t, env.GetWorkflowError())
}

func TestSWEGroupRunsGRolloutsAndSurvivesAFailure(t *testing.T) {
	env, stubs := newSWEEnv(t)
	stubs.failStep["sess_b"] = true
	env.ExecuteWorkflow(SWEGroupWorkflow, flow.SWEGroupInput{TaskID: "median", GroupSize: 3})
	require.NoError(t, env.GetWorkflowError())
	var out flow.SWEGroupResult
	require.NoError(t, env.GetWorkflowResult(&out))
	require.Equal(t, "grp_1", out.GroupID)
	require.Len(t, out.Rollouts, 3)
	require.Equal(t, 1, out.Failed)
	require.InDelta(t, 0.5, out.MeanReward, 1e-9)
	require.Equal(t, "error", out.Rollouts[1].StopReason)
	require.Len(t, stubs.rewards, 2)
	require.Len(t, stubs.released, 3, "every rollout released its sandbox, the failed one too")
}

// TestSWERolloutStartsAgainWhenItsSandboxIsGone: a worker killed during
// the agent step leaves a sandbox the restarted worker's janitor removes;
// the retried step finds nothing. The rollout starts again in a new
// sandbox and completes (it used to fail, its reward never recorded), and
// gives up after sweMaxSandboxes.
func TestSWERolloutStartsAgainWhenItsSandboxIsGone(t *testing.T) {
	env, stubs := newSWEEnv(t)
	stubs.goneSteps = 1
	env.ExecuteWorkflow(flow.SWERolloutWorkflowName, flow.SWERolloutInput{TaskID: "t1"})
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	var out flow.SWERolloutResult
	require.NoError(t, env.GetWorkflowResult(&out))
	require.Equal(t, "sb-t1-2", out.SandboxID)
	require.Equal(t, 0.5, out.Reward)
	require.Equal(t, []string{"create", "acquire", "step", "release", "acquire", "step", "grade", "reward", "release"}, stubs.calls)
	require.Equal(t, []string{"sb-t1", "sb-t1-2"}, stubs.released, "both sandboxes given back")

	env, stubs = newSWEEnv(t)
	stubs.goneSteps = sweMaxSandboxes
	env.ExecuteWorkflow(flow.SWERolloutWorkflowName, flow.SWERolloutInput{TaskID: "t1"})
	require.Error(t, env.GetWorkflowError())
	require.Len(t, stubs.released, sweMaxSandboxes)
	require.Empty(t, stubs.rewards)
}
