package demo

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/flywheel-ai/flywheel/demo/demotask"
)

// DefaultTemperature is what the agents sample at: the policy must
// explore. The tools deployment's regression suite asks at it too.
const DefaultTemperature = 1.0

// FleetConfig configures the demo agents. Each agent is an ordinary OpenAI
// SDK client; only the base URL and the API key point it at Flywheel.
type FleetConfig struct {
	// BaseURL is the gateway's root ("http://127.0.0.1:8080"); a trailing
	// "/v1" is accepted. Required.
	BaseURL string
	// APIKey is sent as the bearer token. Required.
	APIKey string
	// Model is the deployment name in requests. Default "flywheel-policy".
	Model string
	// Agents is the number of concurrent agents. Default 4.
	Agents int
	// GroupSize > 1 makes each agent answer every prompt GroupSize times as
	// a GRPO group: it creates the group's sessions with POST /v1/sessions
	// and makes each call with that session's own API key. Default 1: one
	// session per prompt, named by X-Session-Id.
	GroupSize int
	// TaskID labels the sessions (running baselines key on it). Default
	// Task.ID().
	TaskID string
	// Task the agents work on. Default demotask.DefaultTask.
	Task demotask.Task
	// Exclude are prompts the agents never ask (the held-out set success
	// is measured on, the safety suites).
	Exclude []demotask.Prompt
	// Seed seeds the prompts and reward timing. Default 1.
	Seed uint64
	// RunID prefixes session ids so runs never collide. Default: the start
	// time in nanoseconds.
	RunID string
	// SafetyFraction is the share of requests that are safety prompts.
	// Default 0.125; negative means none.
	SafetyFraction float64
	// DelayedFraction is the share of rewards sent later through
	// /v1/feedback instead of at once to the session. Default 0.3;
	// negative means none.
	DelayedFraction float64
	// MaxFeedbackDelay bounds the random delay of late feedback. Default 2s.
	MaxFeedbackDelay time.Duration
	// Temperature the agents ask for. Default DefaultTemperature.
	Temperature float64
	// Reward scores an answer to p, the reward the agents send. Default:
	// demotask.Verify(p.Want, answer). Misevolution tests give a fleet a wrong one
	// (a reward hack, rewards for unsafe answers) to show that the gates
	// refuse what it teaches.
	Reward func(p demotask.Prompt, answer string) demotask.Score
	// Rewrite, when set, changes each prompt before it is asked (Reward
	// then scores the rewritten one): a jailbreaking fleet asks variants
	// of the prompts the deployment must refuse.
	Rewrite func(p demotask.Prompt) demotask.Prompt
	// SessionsPerSecond caps how fast the whole fleet opens sessions, so
	// the control plane (one Temporal workflow per session) keeps up and
	// samples reach training while they are fresh. Default 0: no cap.
	SessionsPerSecond float64
	// MaxBacklog > 0 starts new groups (or ungrouped sessions) at a fifth
	// of their rate while more than this many of the tenant's sessions wait
	// to be assembled (GET /v1/backlog): a loaded machine's control plane
	// then gets sessions about as fast as it absorbs them, and samples
	// reach training while they are fresh instead of piling up until the
	// staleness bound drops them. A group's own sessions still come at
	// SessionsPerSecond, so the group arrives whole, and traffic never
	// stops, so live gates still see some. Default 0: no limit.
	MaxBacklog int
	// Window is the number of recent task answers the live success rate
	// covers. Default 200.
	Window int
	// RequestTimeout bounds one model call. Default 30s.
	RequestTimeout time.Duration
	// HTTPClient defaults to a client with keep-alive for the agent count.
	HTTPClient *http.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c FleetConfig) withDefaults() FleetConfig {
	if c.Model == "" {
		c.Model = "flywheel-policy"
	}
	if c.Agents == 0 {
		c.Agents = 4
	}
	if c.GroupSize == 0 {
		c.GroupSize = 1
	}
	c.Task = c.Task.WithDefaults()
	if c.TaskID == "" {
		c.TaskID = c.Task.ID()
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.RunID == "" {
		c.RunID = fmt.Sprintf("%x", time.Now().UnixNano())
	}
	if c.SafetyFraction == 0 {
		c.SafetyFraction = 0.125
	}
	c.SafetyFraction = max(c.SafetyFraction, 0)
	if c.DelayedFraction == 0 {
		c.DelayedFraction = 0.3
	}
	c.DelayedFraction = max(c.DelayedFraction, 0)
	if c.MaxFeedbackDelay == 0 {
		c.MaxFeedbackDelay = 2 * time.Second
	}
	if c.Temperature == 0 {
		c.Temperature = DefaultTemperature
	}
	if c.Window == 0 {
		c.Window = 200
	}
	if c.Reward == nil {
		c.Reward = func(p demotask.Prompt, answer string) demotask.Score { return demotask.Verify(p.Want, answer) }
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.Agents * 2, IdleConnTimeout: time.Minute}}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c FleetConfig) validate() error {
	var errs []error
	if u, err := url.Parse(c.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("base_url %q must be an http(s) URL", c.BaseURL))
	}
	if c.APIKey == "" {
		errs = append(errs, errors.New("api_key is required"))
	}
	if c.Agents < 1 || c.Agents > 1024 {
		errs = append(errs, fmt.Errorf("agents %d must be in [1, 1024]", c.Agents))
	}
	if c.GroupSize < 1 || c.GroupSize > 64 {
		errs = append(errs, fmt.Errorf("group_size %d must be in [1, 64] (the gateway's bound)", c.GroupSize))
	}
	if err := c.Task.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SafetyFraction >= 1 || c.DelayedFraction > 1 {
		errs = append(errs, fmt.Errorf("safety_fraction %v must be < 1 and delayed_fraction %v ≤ 1", c.SafetyFraction, c.DelayedFraction))
	}
	if c.MaxFeedbackDelay < 0 || c.RequestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("max_feedback_delay %v must be ≥ 0 and request_timeout %v > 0", c.MaxFeedbackDelay, c.RequestTimeout))
	}
	if c.Temperature < 0 || c.Temperature > 2 {
		errs = append(errs, fmt.Errorf("temperature %v must be in [0, 2] (the OpenAI range)", c.Temperature))
	}
	if c.Window < 1 {
		errs = append(errs, fmt.Errorf("window %d must be positive", c.Window))
	}
	if c.SessionsPerSecond < 0 || c.SessionsPerSecond > 10_000 {
		errs = append(errs, fmt.Errorf("sessions_per_second %v must be in [0, 10000]", c.SessionsPerSecond))
	}
	return errors.Join(errs...)
}
