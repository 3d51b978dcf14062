package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/sweagent"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
)

// Log messages of the SWE activities.
const (
	msgSWEAcquired = "swe sandbox acquired"
	msgSWEStepDone = "swe agent step finished"
	msgSWEReward   = "swe reward recorded"
)

// SWEGateway is what the SWE activities need from the flywheel gateway:
// sessions to capture the agent's calls under, and the reward endpoint.
type SWEGateway interface {
	CreateSessions(ctx context.Context, taskID, model string, groupSize int) (groupID string, sessionIDs []string, err error)
	RecordReward(ctx context.Context, sessionID string, value float64, source string, final bool) error
}

// SWETaskImages resolves a task id to the task and its sandbox image.
type SWETaskImages interface {
	Ensure(ctx context.Context, taskID string) (*tasks.Task, sandbox.Image, error)
}

// SWEActivities implements the SWE rollout activities (see
// workflows.SWERolloutWorkflow). Sandboxes live in the worker's Docker
// engine; a sandbox id acquired on one worker can be used from another on the
// same engine (the manager re-attaches).
type SWEActivities struct {
	Sandboxes *sandbox.Manager
	Images    SWETaskImages
	Gateway   SWEGateway
	// Agent is the template for the built-in agent: BaseURL (the gateway's
	// /v1), APIKey, default Model and limits. Per-rollout values override.
	Agent sweagent.Config
	// PoolSize keeps this many warm sandboxes per task image once a task has
	// been used; 0 disables pools.
	PoolSize int
	// HeartbeatEvery is how often long activities heartbeat; default 10s,
	// and never slower than a third of the activity's heartbeat timeout.
	HeartbeatEvery time.Duration
	Logger         *slog.Logger
}

func (a *SWEActivities) log() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}

// sandboxGone is a step or grade whose sandbox does not exist (any more):
// retrying cannot bring it back, but the rollout can start again in a
// new one.
func sandboxGone(err error) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), flow.SWESandboxGoneError, err)
}

func badInput(msg string, err error) error {
	return temporal.NewNonRetryableApplicationError(msg, "BadInput", err)
}

// heartbeatWhile heartbeats detail() until the returned stop is called.
func (a *SWEActivities) heartbeatWhile(ctx context.Context, detail func() any) (stop func()) {
	return heartbeatWhile(ctx, a.HeartbeatEvery, detail)
}

// CreateSessions opens the gateway sessions of a rollout or a group.
func (a *SWEActivities) SWECreateSessions(ctx context.Context, in flow.SWECreateSessionsInput) (flow.SWECreateSessionsOutput, error) {
	if in.TaskID == "" || in.GroupSize < 1 || in.GroupSize > flow.SWEMaxGroupSize {
		return flow.SWECreateSessionsOutput{}, badInput(fmt.Sprintf("create sessions: task %q, group size %d", in.TaskID, in.GroupSize), nil)
	}
	model := in.Model
	if model == "" {
		model = a.Agent.Model
	}
	gid, ids, err := a.Gateway.CreateSessions(ctx, in.TaskID, model, in.GroupSize)
	if err != nil {
		return flow.SWECreateSessionsOutput{}, err
	}
	return flow.SWECreateSessionsOutput{GroupID: gid, SessionIDs: ids}, nil
}

// Acquire returns a started sandbox of the task's image, from the warm pool
// when there is one. The first use of a task may build its image.
func (a *SWEActivities) SWEAcquire(ctx context.Context, in flow.SWEAcquireInput) (flow.SWEAcquireOutput, error) {
	stop := a.heartbeatWhile(ctx, func() any { return "preparing " + in.TaskID })
	defer stop()
	_, img, err := a.Images.Ensure(ctx, in.TaskID)
	if errors.Is(err, tasks.ErrUnknownTask) {
		return flow.SWEAcquireOutput{}, badInput(err.Error(), err)
	}
	if err != nil {
		return flow.SWEAcquireOutput{}, err
	}
	if a.PoolSize > 0 {
		if err := a.Sandboxes.StartPool(img, a.PoolSize); err != nil {
			return flow.SWEAcquireOutput{}, err
		}
	}
	sb, err := a.Sandboxes.Acquire(ctx, img)
	if err != nil {
		return flow.SWEAcquireOutput{}, err
	}
	if sb.HasAgent() {
		// A rollout is long; one round trip now rules out a hung agent.
		if _, err := sb.Ping(ctx); err != nil {
			_ = a.Sandboxes.Release(context.WithoutCancel(ctx), sb)
			return flow.SWEAcquireOutput{}, fmt.Errorf("acquired sandbox does not answer: %w", err)
		}
	}
	a.log().Info(msgSWEAcquired, "task", in.TaskID, "sandbox", sb.ID[:12], "image", img.Ref)
	return flow.SWEAcquireOutput{SandboxID: sb.ID, Image: img.Ref}, nil
}

// Step runs the built-in agent in the sandbox until it submits or a budget
// runs out. Its model calls go to the gateway under the rollout's session.
func (a *SWEActivities) SWEStep(ctx context.Context, in flow.SWEStepInput) (flow.SWEStepOutput, error) {
	if in.TaskID == "" || in.SandboxID == "" || in.SessionID == "" {
		return flow.SWEStepOutput{}, badInput("step: task, sandbox and session are required", nil)
	}
	t, err := tasks.Find(in.TaskID)
	if err != nil {
		return flow.SWEStepOutput{}, badInput(err.Error(), err)
	}
	sb, err := a.Sandboxes.Get(ctx, in.SandboxID)
	if errors.Is(err, sandbox.ErrNotFound) {
		return flow.SWEStepOutput{}, sandboxGone(err)
	}
	if err != nil {
		return flow.SWEStepOutput{}, err
	}
	cfg := a.Agent
	cfg.Headers = map[string]string{"X-Session-Id": in.SessionID}
	for k, v := range a.Agent.Headers {
		cfg.Headers[k] = v
	}
	if in.Model != "" {
		cfg.Model = in.Model
	}
	if in.MaxToolCalls > 0 {
		cfg.MaxToolCalls = in.MaxToolCalls
	}
	if in.MaxWallTime > 0 {
		cfg.MaxWallTime = in.MaxWallTime
	}
	if cfg.Logger == nil {
		cfg.Logger = a.log()
	}
	var calls atomic.Int64
	cfg.OnToolCall = func(n int, tool string) {
		calls.Store(int64(n))
		activity.RecordHeartbeat(ctx, n)
	}
	stop := a.heartbeatWhile(ctx, func() any { return calls.Load() })
	res, err := sweagent.Run(ctx, cfg, sb, t.ProblemStatement)
	stop()
	if err != nil {
		return flow.SWEStepOutput{}, err
	}
	a.log().Info(msgSWEStepDone, "task", in.TaskID, "session", in.SessionID, "stop", res.StopReason, "tool_calls", res.ToolCalls, "denied", res.Denied)
	return flow.SWEStepOutput{StopReason: res.StopReason, ToolCalls: res.ToolCalls, Turns: res.Turns, Denied: res.Denied}, nil
}

// Grade restores the hidden tests, runs them and returns the pass rate.
func (a *SWEActivities) SWEGrade(ctx context.Context, in flow.SWEGradeInput) (flow.SWEGradeOutput, error) {
	t, err := tasks.Find(in.TaskID)
	if err != nil {
		return flow.SWEGradeOutput{}, badInput(err.Error(), err)
	}
	sb, err := a.Sandboxes.Get(ctx, in.SandboxID)
	if errors.Is(err, sandbox.ErrNotFound) {
		return flow.SWEGradeOutput{}, sandboxGone(err)
	}
	if err != nil {
		return flow.SWEGradeOutput{}, err
	}
	stop := a.heartbeatWhile(ctx, func() any { return "grading" })
	res, err := tasks.Grade(ctx, sb, t, a.log())
	stop()
	if err != nil {
		return flow.SWEGradeOutput{}, err
	}
	return flow.SWEGradeOutput{Reward: res.Reward, Passed: res.Passed, Total: res.Total, FailToPass: res.FailToPass,
		PassToPass: res.PassToPass, Resolved: res.Resolved, Tampered: res.Tampered, Reasons: res.Reasons}, nil
}

// RecordReward reports the grade as the session's final reward.
func (a *SWEActivities) SWERecordReward(ctx context.Context, in flow.SWERecordRewardInput) error {
	if in.SessionID == "" {
		return badInput("record reward: session is required", nil)
	}
	if err := a.Gateway.RecordReward(ctx, in.SessionID, in.Reward, flow.SWERewardSource, true); err != nil {
		return err
	}
	a.log().Info(msgSWEReward, "task", in.TaskID, "session", in.SessionID, "reward", in.Reward)
	return nil
}

// Release removes the sandbox; releasing one that is gone succeeds.
func (a *SWEActivities) SWERelease(ctx context.Context, in flow.SWEReleaseInput) error {
	if in.SandboxID == "" {
		return nil
	}
	return a.Sandboxes.ReleaseID(ctx, in.SandboxID)
}

// SWEGatewayHTTP talks to the flywheel gateway's session API.
type SWEGatewayHTTP struct {
	// BaseURL is the gateway root, e.g. http://localhost:8080 (no /v1).
	BaseURL string
	// APIKey is a tenant key allowed to create sessions and post rewards.
	APIKey     string
	HTTPClient *http.Client
}

func (g *SWEGatewayHTTP) do(ctx context.Context, method, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(g.BaseURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return badInput("gateway request: "+err.Error(), err)
	}
	req.Header.Set("Content-Type", "application/json")
	if g.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+g.APIKey)
	}
	hc := g.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("gateway %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 300 {
		err := fmt.Errorf("gateway %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
		// Client errors will not change on a retry; throttling and server errors may.
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusRequestTimeout {
			return badInput(err.Error(), nil)
		}
		return err
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("gateway %s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// CreateSessions is POST /v1/sessions with group_size.
func (g *SWEGatewayHTTP) CreateSessions(ctx context.Context, taskID, model string, groupSize int) (string, []string, error) {
	var out struct {
		ID       string `json:"id"`
		GroupID  string `json:"group_id"`
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	if err := g.do(ctx, http.MethodPost, "/v1/sessions", map[string]any{"model": model, "task_id": taskID, "group_size": groupSize}, &out); err != nil {
		return "", nil, err
	}
	ids := []string{out.ID}
	if len(out.Sessions) > 0 {
		ids = ids[:0]
		for _, s := range out.Sessions {
			ids = append(ids, s.ID)
		}
	}
	return out.GroupID, ids, nil
}

// RecordReward is POST /v1/sessions/{id}/reward.
func (g *SWEGatewayHTTP) RecordReward(ctx context.Context, sessionID string, value float64, source string, final bool) error {
	return g.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(sessionID)+"/reward", map[string]any{"value": value, "source": source, "final": final}, nil)
}

// SWEConfig is what a worker needs to serve workflows.SWETaskQueue.
type SWEConfig struct {
	// GatewayURL is the gateway root the agent and the reward calls use,
	// e.g. http://127.0.0.1:8080. Required.
	GatewayURL string
	// APIKey is a tenant key (sessions are created and rewarded with it).
	APIKey string
	// Model is the default deployment the agent asks for. Required.
	Model string
	// PoolSize warm sandboxes per task image; default 2, -1 disables.
	PoolSize int
	// Limits for every sandbox; see sandbox.Limits.
	Limits sandbox.Limits
	// DockerHost is the Docker Engine address (docker.host; empty: the
	// environment's DOCKER_HOST, or the local socket).
	DockerHost string
	Logger     *slog.Logger
}

// NewSWEActivities connects to the Docker engine, removes sandboxes left
// behind by crashed workers, and returns the activities and a close function
// that removes this worker's sandboxes.
func NewSWEActivities(ctx context.Context, cfg SWEConfig) (*SWEActivities, func(context.Context) error, error) {
	if cfg.GatewayURL == "" || cfg.Model == "" {
		return nil, nil, errors.New("swe activities: GatewayURL and Model are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	switch {
	case cfg.PoolSize == 0:
		cfg.PoolSize = 2
	case cfg.PoolSize < 0:
		cfg.PoolSize = 0
	}
	cli, err := sandbox.Connect(ctx, cfg.DockerHost)
	if err != nil {
		return nil, nil, err
	}
	if _, err := sandbox.Janitor(ctx, cli, sandbox.JanitorOptions{Logger: log}); err != nil {
		log.Warn("sandbox janitor failed", "error", err)
	}
	m, err := sandbox.NewManager(cli, sandbox.Config{Limits: cfg.Limits, Logger: log})
	if err != nil {
		_ = cli.Close()
		return nil, nil, err
	}
	base := strings.TrimRight(cfg.GatewayURL, "/")
	a := &SWEActivities{
		Sandboxes: m,
		Images:    &tasks.Images{Client: cli, Logger: log},
		Gateway:   &SWEGatewayHTTP{BaseURL: base, APIKey: cfg.APIKey},
		Agent:     sweagent.Config{BaseURL: base + "/v1", APIKey: cfg.APIKey, Model: cfg.Model, Logger: log},
		PoolSize:  cfg.PoolSize,
		Logger:    log,
	}
	closeFn := func(ctx context.Context) error {
		err := m.Close(ctx)
		_ = cli.Close()
		return err
	}
	return a, closeFn, nil
}
