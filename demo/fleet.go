package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// FleetStats is a snapshot of what the agents observed.
type FleetStats struct {
	// Sessions counts the sessions answered, Calls their model calls.
	Sessions     int `json:"sessions"`
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
	gen, err := demotask.NewGenerator(f.cfg.Task, f.cfg.Seed+uint64(idx)*0x9e37, f.cfg.Exclude)
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
func (f *Fleet) group(ctx context.Context, rng *rand.Rand, p demotask.Prompt) error {
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

// episode is one session: the task's model calls (a letters session's
// one call carries X-Session-Done; a tools session is ended once the
// model answered), then the reward for the answer, now or later, for the
// whole session. key, when set, is the session's own API key (group
// mode).
func (f *Fleet) episode(ctx context.Context, rng *rand.Rand, sid, key string, p demotask.Prompt) error {
	if err := f.tick(ctx); err != nil {
		return err
	}
	opts := []option.RequestOption{option.WithHeader("X-Session-Id", sid)}
	if key != "" {
		opts = append(opts, option.WithAPIKey(key))
	}
	r, err := f.converse(ctx, p, f.cfg.Temperature, "", true, opts...)
	if err != nil {
		return err
	}
	if f.cfg.Task.Kind == demotask.KindTools {
		if err := f.post(context.WithoutCancel(ctx), "/v1/sessions/"+url.PathEscape(sid)+"/end", map[string]any{}); err != nil {
			return err
		}
	}
	sc := f.cfg.Reward(p, r.Answer)
	f.record(SessionRow{ID: sid, Prompt: p.Text, Answer: r.Trace, Reward: sc.Reward, Version: r.Version}, p, sc, r.Calls)

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
			err := f.post(context.WithoutCancel(ctx), "/v1/feedback", map[string]any{"completion_id": r.CompletionID, "value": sc.Reward, "source": "verifier"})
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

func (f *Fleet) record(row SessionRow, p demotask.Prompt, sc demotask.Score, calls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	version := row.Version
	f.recent = append(f.recent, row)
	if len(f.recent) > maxRecentSessions {
		f.recent = f.recent[len(f.recent)-maxRecentSessions:]
	}
	f.stats.Sessions++
	f.stats.Calls += calls
	if p.Want == demotask.Refusal {
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

// CallsPerSession is the mean number of model calls a session made.
func (s FleetStats) CallsPerSession() float64 {
	if s.Sessions == 0 {
		return 0
	}
	return float64(s.Calls) / float64(s.Sessions)
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
