package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

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
	// "demo-reverse-letters".
	TaskID string
	// Task the agents work on. Default DefaultTask.
	Task Task
	// Exclude are prompts the agents never ask (the held-out set success
	// is measured on, the safety suites).
	Exclude []Prompt
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
	// Temperature the agents ask for. Default 1: the policy must explore.
	Temperature float64
	// Reward scores an answer to p, the reward the agents send. Default:
	// Verify(p.Want, answer). Misevolution tests give a fleet a wrong one
	// (a reward hack, rewards for unsafe answers) to show that the gates
	// refuse what it teaches.
	Reward func(p Prompt, answer string) Score
	// Rewrite, when set, changes each prompt before it is asked (Reward
	// then scores the rewritten one): a jailbreaking fleet asks variants
	// of the prompts the deployment must refuse.
	Rewrite func(p Prompt) Prompt
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
	if c.TaskID == "" {
		c.TaskID = "demo-reverse-letters"
	}
	c.Task = c.Task.withDefaults()
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
		c.Temperature = 1
	}
	if c.Window == 0 {
		c.Window = 200
	}
	if c.Reward == nil {
		c.Reward = func(p Prompt, answer string) Score { return Verify(p.Want, answer) }
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
	if err := c.Task.validate(); err != nil {
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

// HeaderModelVersion is the response header a gateway may use for the
// serving version. The Flywheel gateway reports it in system_fingerprint;
// the header wins when both are present.
const HeaderModelVersion = "X-Flywheel-Model-Version"

// FleetStats is a snapshot of what the agents observed.
type FleetStats struct {
	Calls        int `json:"calls"`
	Errors       int `json:"errors"`
	RewardsSent  int `json:"rewards_sent"`
	FeedbackSent int `json:"feedback_sent"`
	// FeedbackPending is late feedback not yet sent.
	FeedbackPending int `json:"feedback_pending"`
	// Success is exact-match success over the last Window task answers.
	Success float64 `json:"success"`
	// Safety is the refusal rate over the last Window safety prompts.
	Safety float64 `json:"safety"`
	// Answered counts task answers that went into Success so far.
	Answered int `json:"answered"`
	// Version is the serving version of the latest answer.
	Version string `json:"version"`
	// Versions lists every version seen, first seen first.
	Versions []string `json:"versions"`
	// LastError is the latest failure, for the terminal.
	LastError string `json:"last_error,omitempty"`
	// HeldBack is the agents' total time waiting for a slow slot while the
	// control plane's backlog was over MaxBacklog.
	HeldBack time.Duration `json:"held_back_ns"`
}

// Fleet runs the demo agents.
type Fleet struct {
	cfg    FleetConfig
	client openai.Client
	root   string // gateway root without /v1

	mu       sync.Mutex
	stats    FleetStats
	task     rolling
	safety   rolling
	seen     map[string]bool
	recent   []SessionRow // newest last, at most maxRecentSessions
	feedback sync.WaitGroup
	// pace hands out one tick per session when SessionsPerSecond is set;
	// slow one per group (or ungrouped session) at a fifth of the group
	// rate, while the backlog is over MaxBacklog.
	pace, slow <-chan time.Time
	// backlog is the tenant's latest backlog reading (MaxBacklog).
	backlog atomic.Int64
}

// NewFleet validates cfg and prepares the client.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("fleet config: %w", err)
	}
	root := strings.TrimSuffix(strings.TrimSuffix(cfg.BaseURL, "/"), "/v1")
	f := &Fleet{
		cfg:  cfg,
		root: root,
		// This is the whole integration an existing agent needs.
		client: openai.NewClient(
			option.WithBaseURL(root+"/v1/"),
			option.WithAPIKey(cfg.APIKey),
			option.WithHTTPClient(cfg.HTTPClient),
			option.WithMaxRetries(2),
			option.WithRequestTimeout(cfg.RequestTimeout),
		),
		task:   newRolling(cfg.Window),
		safety: newRolling(cfg.Window),
		seen:   map[string]bool{},
	}
	return f, nil
}

// Stats returns a snapshot.
func (f *Fleet) Stats() FleetStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats
	s.Versions = append([]string(nil), s.Versions...)
	s.Success, s.Safety = f.task.mean(), f.safety.mean()
	return s
}

// Run drives the agents until ctx ends, then waits for late feedback that
// is already due (bounded by MaxFeedbackDelay) and returns. It returns nil
// when ctx ended it; a fleet whose every call fails keeps going and counts
// the errors (the gateway may come up late).
func (f *Fleet) Run(ctx context.Context) error {
	if f.cfg.SessionsPerSecond > 0 {
		every := time.Duration(float64(time.Second) / f.cfg.SessionsPerSecond)
		t, s := time.NewTicker(every), time.NewTicker(every*time.Duration(backlogSlowdown*f.cfg.GroupSize))
		defer t.Stop()
		defer s.Stop()
		f.pace, f.slow = t.C, s.C
	}
	var wg sync.WaitGroup
	if f.cfg.MaxBacklog > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.watchBacklog(ctx)
		}()
	}
	for i := 0; i < f.cfg.Agents; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.agent(ctx, i)
		}()
	}
	wg.Wait()
	f.feedback.Wait()
	return nil
}

// backlogEvery is how often the fleet reads the tenant's backlog.
const backlogEvery = 500 * time.Millisecond

// watchBacklog keeps f.backlog current until ctx ends; a failed read keeps
// the last value (the agents' own calls report a gateway that is down).
func (f *Fleet) watchBacklog(ctx context.Context) {
	t := time.NewTicker(backlogEvery)
	defer t.Stop()
	for {
		var b struct {
			N int64 `json:"sessions_awaiting_assembly"`
		}
		if err := f.send(ctx, http.MethodGet, "/v1/backlog", nil, &b); err == nil {
			f.backlog.Store(b.N)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// backlogSlowdown divides the session rate while the backlog is high.
const backlogSlowdown = 5

// admit waits, while the control plane's backlog is over MaxBacklog, for
// a slow slot to start the next group (or ungrouped session).
func (f *Fleet) admit(ctx context.Context) error {
	if f.slow == nil || f.cfg.MaxBacklog <= 0 || f.backlog.Load() <= int64(f.cfg.MaxBacklog) {
		return nil
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-f.slow:
	}
	f.mu.Lock()
	f.stats.HeldBack += time.Since(start)
	f.mu.Unlock()
	return nil
}

// tick waits for the pacer's next session slot.
func (f *Fleet) tick(ctx context.Context) error {
	if f.pace == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-f.pace:
		return nil
	}
}

func (f *Fleet) agent(ctx context.Context, idx int) {
	gen, err := NewGenerator(f.cfg.Task, f.cfg.Seed+uint64(idx)*0x9e37, f.cfg.Exclude)
	if err != nil {
		f.fail(err) // validated already; kept for safety
		return
	}
	rng := rand.New(rand.NewPCG(f.cfg.Seed, uint64(idx)))
	backoff := 100 * time.Millisecond
	for n := 0; ctx.Err() == nil; n++ {
		p := gen.Next()
		if rng.Float64() < f.cfg.SafetyFraction {
			p = gen.NextSafety()
		}
		if f.cfg.Rewrite != nil {
			p = f.cfg.Rewrite(p)
		}
		err := f.admit(ctx)
		switch {
		case err != nil:
		case f.cfg.GroupSize > 1:
			err = f.group(ctx, rng, p)
		default:
			err = f.episode(ctx, rng, fmt.Sprintf("demo-%s-a%d-%d", f.cfg.RunID, idx, n), "", p)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.fail(err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// group answers p GroupSize times as one GRPO group of sessions.
func (f *Fleet) group(ctx context.Context, rng *rand.Rand, p Prompt) error {
	var created struct {
		Sessions []struct {
			ID     string `json:"id"`
			APIKey string `json:"api_key"`
		} `json:"sessions"`
	}
	body := map[string]any{"model": f.cfg.Model, "task_id": f.cfg.TaskID, "group_size": f.cfg.GroupSize}
	if err := f.postInto(ctx, "/v1/sessions", body, &created); err != nil {
		return err
	}
	if len(created.Sessions) != f.cfg.GroupSize {
		return fmt.Errorf("create group: got %d sessions, want %d", len(created.Sessions), f.cfg.GroupSize)
	}
	for _, s := range created.Sessions {
		if s.ID == "" || s.APIKey == "" {
			return errors.New("create group: a session without id or api_key")
		}
		if err := f.episode(ctx, rng, s.ID, s.APIKey, p); err != nil {
			return err
		}
	}
	return nil
}

// episode is one session: one model call (the last, so it carries
// X-Session-Done), then its reward, now or later. key, when set, is the
// session's own API key (group mode).
func (f *Fleet) episode(ctx context.Context, rng *rand.Rand, sid, key string, p Prompt) error {
	if err := f.tick(ctx); err != nil {
		return err
	}
	var httpResp *http.Response
	opts := []option.RequestOption{option.WithHeader("X-Session-Id", sid), option.WithHeader("X-Session-Done", "true"), option.WithResponseInto(&httpResp)}
	if key != "" {
		opts = append(opts, option.WithAPIKey(key))
	}
	resp, err := f.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:       f.cfg.Model,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(p.Text)},
		MaxTokens:   openai.Int(int64(AnswerTokens(p))),
		Temperature: openai.Float(f.cfg.Temperature),
	}, opts...)
	if err != nil {
		return fmt.Errorf("chat completion: %w", err)
	}
	if len(resp.Choices) == 0 {
		return errors.New("chat completion: no choices")
	}
	sc := f.cfg.Reward(p, resp.Choices[0].Message.Content)
	version := servedVersion(resp, httpResp)
	f.record(SessionRow{ID: sid, Prompt: p.Text, Answer: resp.Choices[0].Message.Content, Reward: sc.Reward, Version: version}, p, sc)

	if rng.Float64() < f.cfg.DelayedFraction {
		delay := time.Duration(rng.Int64N(int64(f.cfg.MaxFeedbackDelay) + 1))
		f.mu.Lock()
		f.stats.FeedbackPending++
		f.mu.Unlock()
		f.feedback.Add(1)
		go func() {
			defer f.feedback.Done()
			// Late feedback outlives the agent's context on purpose: it
			// was promised for this answer and the run waits for it.
			time.Sleep(delay)
			err := f.post(context.WithoutCancel(ctx), "/v1/feedback", map[string]any{"completion_id": resp.ID, "value": sc.Reward, "source": "verifier"})
			f.mu.Lock()
			f.stats.FeedbackPending--
			if err == nil {
				f.stats.FeedbackSent++
			}
			f.mu.Unlock()
			if err != nil {
				f.fail(err)
			}
		}()
		return nil
	}
	// The answer was seen, so its reward is owed even when the run is
	// stopping; RequestTimeout still bounds the post.
	if err := f.post(context.WithoutCancel(ctx), "/v1/sessions/"+url.PathEscape(sid)+"/reward", map[string]any{"value": sc.Reward, "source": "verifier", "final": true}); err != nil {
		return err
	}
	f.mu.Lock()
	f.stats.RewardsSent++
	f.mu.Unlock()
	return nil
}

// maxRecentSessions bounds the sessions kept for the status page.
const maxRecentSessions = 20

func (f *Fleet) record(row SessionRow, p Prompt, sc Score) {
	f.mu.Lock()
	defer f.mu.Unlock()
	version := row.Version
	f.recent = append(f.recent, row)
	if len(f.recent) > maxRecentSessions {
		f.recent = f.recent[len(f.recent)-maxRecentSessions:]
	}
	f.stats.Calls++
	if p.Want == Refusal {
		f.safety.add(sc.Success)
	} else {
		f.task.add(sc.Success)
		f.stats.Answered++
	}
	if version != "" {
		f.stats.Version = version
		if !f.seen[version] {
			f.seen[version] = true
			f.stats.Versions = append(f.stats.Versions, version)
		}
	}
}

// recentSessions returns the latest sessions, newest first.
func (f *Fleet) recentSessions() []SessionRow {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]SessionRow, len(f.recent))
	for i, r := range f.recent {
		out[len(out)-1-i] = r
	}
	return out
}

func (f *Fleet) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats.Errors++
	f.stats.LastError = err.Error()
	f.cfg.Logger.Debug("demo agent call failed", "error", err)
}

// maxErrorBody bounds how much of an error response is kept, and
// maxAnswerBody how much of a 2xx answer is read.
const (
	maxErrorBody  = 4 << 10
	maxAnswerBody = 1 << 20
)

func (f *Fleet) post(ctx context.Context, path string, body any) error {
	return f.postInto(ctx, path, body, nil)
}

// postInto posts body as JSON with the fleet's key and decodes a 2xx
// answer into out (when not nil).
func (f *Fleet) postInto(ctx context.Context, path string, body any, out any) error {
	return f.send(ctx, http.MethodPost, path, body, out)
}

// send makes one JSON request with the fleet's key.
func (f *Fleet) send(ctx context.Context, method, path string, body any, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.RequestTimeout)
	defer cancel()
	resp, err := doRetrying(ctx, f.cfg.HTTPClient, func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, method, f.root+path, bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+f.cfg.APIKey)
		req.Header.Set("Content-Type", "application/json")
		return req, nil
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	if out != nil {
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBody)).Decode(out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

// doRetrying sends the request newReq builds and answers its response. A
// 429 is the key's rate limit, not a verdict: it waits as told and sends
// again, up to maxSendAttempts, so a reward or a status reading is not
// lost to the fleet's own burst (the OpenAI client does the same for
// model calls). The last 429 is answered as it is.
func doRetrying(ctx context.Context, client *http.Client, newReq func() (*http.Request, error)) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		req, err := newReq()
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusTooManyRequests || attempt >= maxSendAttempts {
			return resp, nil
		}
		wait := retryAfter(resp.Header.Get("Retry-After"))
		resp.Body.Close()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rate limited: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
}

// maxSendAttempts bounds the retries of a rate-limited request.
const maxSendAttempts = 5

// retryAfter reads a Retry-After in seconds (default and cap: 1s and 5s).
func retryAfter(h string) time.Duration {
	secs, err := strconv.Atoi(strings.TrimSpace(h))
	if err != nil || secs <= 0 {
		return time.Second
	}
	return min(time.Duration(secs)*time.Second, 5*time.Second)
}

// rolling is a fixed-size window of outcomes.
type rolling struct {
	buf  []bool
	next int
	full bool
	hits int
}

func newRolling(n int) rolling { return rolling{buf: make([]bool, n)} }

func (r *rolling) add(ok bool) {
	if r.full && r.buf[r.next] {
		r.hits--
	}
	r.buf[r.next] = ok
	if ok {
		r.hits++
	}
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
}

func (r *rolling) mean() float64 {
	n := r.next
	if r.full {
		n = len(r.buf)
	}
	if n == 0 {
		return 0
	}
	return float64(r.hits) / float64(n)
}

// servedVersion is the version that answered: the header, else the
// system fingerprint, else the model name.
func servedVersion(resp *openai.ChatCompletion, httpResp *http.Response) string {
	if httpResp != nil && httpResp.Header.Get(HeaderModelVersion) != "" {
		return httpResp.Header.Get(HeaderModelVersion)
	}
	if resp.SystemFingerprint != "" {
		return resp.SystemFingerprint
	}
	return resp.Model
}
