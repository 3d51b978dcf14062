package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/stretchr/testify/require"
)

// fixtureOpenAI is a test fixture, not a gateway: a local server that speaks
// the OpenAI chat-completions protocol and the two Flywheel reward
// endpoints, answers with a scripted policy whose skill depends on the
// "serving version", and records what the agents sent.
type fixtureOpenAI struct {
	t      *testing.T
	apiKey string

	mu         sync.Mutex
	version    int
	calls      map[string]fixtureCall // by completion id
	sessions   map[string]string      // session id → completion id
	rewards    map[string]float64     // by session id
	feedback   map[string]float64     // by completion id
	badHeaders []string
	keys       map[string]string   // session key → session id (group mode)
	groups     map[string][]string // group id → session ids
	groupOf    map[string]string   // session id → group id
}

type fixtureCall struct {
	session string
	prompt  string
	answer  string
	done    bool
}

func newFixtureOpenAI(t *testing.T, apiKey string) (*fixtureOpenAI, *httptest.Server) {
	f := &fixtureOpenAI{t: t, apiKey: apiKey, version: 1, calls: map[string]fixtureCall{},
		sessions: map[string]string{}, rewards: map[string]float64{}, feedback: map[string]float64{},
		keys: map[string]string{}, groups: map[string][]string{}, groupOf: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions", f.createSessions)
	mux.HandleFunc("POST /v1/chat/completions", f.chat)
	mux.HandleFunc("POST /v1/sessions/{id}/reward", f.reward)
	mux.HandleFunc("POST /v1/feedback", f.postFeedback)
	srv := httptest.NewServer(f.auth(mux))
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fixtureOpenAI) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		_, sessionKey := f.keys[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+f.apiKey && !sessionKey {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"message":"bad key","type":"invalid_request_error"}}`))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (f *fixtureOpenAI) setVersion(v int) {
	f.mu.Lock()
	f.version = v
	f.mu.Unlock()
}

// answer is the scripted policy: version 1 echoes the letters with one more
// (never right: a palindrome echoed alone would be), version 2 reverses
// them; safety prompts are always refused.
func (f *fixtureOpenAI) answer(prompt string, version int) string {
	if strings.HasPrefix(prompt, demotask.SafetyPrefix) {
		return demotask.Refusal
	}
	if version >= 2 {
		return demotask.Reverse(prompt)
	}
	return prompt + "q"
}

func (f *fixtureOpenAI) chat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		MaxTokens   int      `json:"max_tokens"`
		Temperature *float64 `json:"temperature"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) != 1 || req.MaxTokens < 5 || req.Temperature == nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	sid := r.Header.Get("X-Session-Id")
	f.mu.Lock()
	if keySession, ok := f.keys[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]; ok && keySession != sid {
		f.badHeaders = append(f.badHeaders, fmt.Sprintf("key of session %q used with X-Session-Id %q", keySession, sid))
	}
	if sid == "" || r.Header.Get("X-Session-Done") != "true" {
		f.badHeaders = append(f.badHeaders, fmt.Sprintf("session %q done %q", sid, r.Header.Get("X-Session-Done")))
	}
	v := f.version
	id := fmt.Sprintf("chatcmpl-%d", len(f.calls)+1)
	ans := f.answer(req.Messages[0].Content, v)
	f.calls[id] = fixtureCall{session: sid, prompt: req.Messages[0].Content, answer: ans, done: true}
	f.sessions[sid] = id
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
		"system_fingerprint": fmt.Sprintf("flywheel-policy@v%d", v),
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": ans}}},
		"usage": map[string]int{"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
	})
}

// createSessions mimics POST /v1/sessions with group_size: one session and
// key per member, sharing a group id.
func (f *fixtureOpenAI) createSessions(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model     string `json:"model"`
		TaskID    string `json:"task_id"`
		GroupSize int    `json:"group_size"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.GroupSize < 1 || body.TaskID == "" || body.Model == "" {
		http.Error(w, `{"error":{"message":"bad session request"}}`, http.StatusUnprocessableEntity)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	gid := fmt.Sprintf("grp_%d", len(f.groups)+1)
	var out []map[string]string
	for i := 0; i < body.GroupSize; i++ {
		id, key := fmt.Sprintf("sess_%s_%d", gid, i), fmt.Sprintf("sk-sess-%s-%d", gid, i)
		f.keys[key] = id
		f.groups[gid] = append(f.groups[gid], id)
		f.groupOf[id] = gid
		out = append(out, map[string]string{"id": id, "api_key": key})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": out[0]["id"], "api_key": out[0]["api_key"], "group_id": gid,
		"group_size": body.GroupSize, "sessions": out})
}

func (f *fixtureOpenAI) reward(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Value  *float64 `json:"value"`
		Source string   `json:"source"`
		Final  bool     `json:"final"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Value == nil || body.Source != "verifier" || !body.Final {
		http.Error(w, `{"error":{"message":"bad reward"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sid := r.PathValue("id")
	if _, ok := f.sessions[sid]; !ok {
		http.Error(w, `{"error":{"message":"no session"}}`, http.StatusNotFound)
		return
	}
	f.rewards[sid] = *body.Value
	w.WriteHeader(http.StatusOK)
}

func (f *fixtureOpenAI) postFeedback(w http.ResponseWriter, r *http.Request) {
	var body struct {
		CompletionID string   `json:"completion_id"`
		Value        *float64 `json:"value"`
		Source       string   `json:"source"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Value == nil || body.Source != "verifier" {
		http.Error(w, `{"error":{"message":"bad feedback"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.calls[body.CompletionID]; !ok {
		http.Error(w, `{"error":{"message":"no completion"}}`, http.StatusNotFound)
		return
	}
	f.feedback[body.CompletionID] = *body.Value
	w.WriteHeader(http.StatusOK)
}

func TestFleetAgainstFixture(t *testing.T) {
	fx, srv := newFixtureOpenAI(t, "sk-demo")
	fleet, err := NewFleet(FleetConfig{BaseURL: srv.URL + "/v1", APIKey: "sk-demo", Agents: 3, Window: 40,
		MaxFeedbackDelay: 50 * time.Millisecond, RunID: "t1"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fleet.Run(ctx) }()

	// Version 1 never gets a prompt right.
	require.Eventually(t, func() bool { return fleet.Stats().Answered >= 60 }, 10*time.Second, 5*time.Millisecond)
	st := fleet.Stats()
	require.Zero(t, st.Success)
	require.Equal(t, "flywheel-policy@v1", st.Version)

	// A new serving version shows in the live rate and the version.
	fx.setVersion(2)
	require.Eventually(t, func() bool {
		s := fleet.Stats()
		return s.Success == 1 && s.Version == "flywheel-policy@v2"
	}, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	st = fleet.Stats()
	require.Equal(t, []string{"flywheel-policy@v1", "flywheel-policy@v2"}, st.Versions)
	require.Equal(t, 1.0, st.Safety)
	require.Zero(t, st.FeedbackPending)
	require.Zero(t, st.Errors, st.LastError)

	fx.mu.Lock()
	defer fx.mu.Unlock()
	require.Empty(t, fx.badHeaders)
	// Calls cut off by the stop were answered by the fixture but never seen
	// by an agent; every call an agent saw is in Calls.
	require.GreaterOrEqual(t, len(fx.calls), st.Calls)
	require.Equal(t, st.RewardsSent, len(fx.rewards))
	require.Equal(t, st.Calls, st.RewardsSent+st.FeedbackSent)
	require.Equal(t, st.FeedbackSent, len(fx.feedback))
	require.Positive(t, st.RewardsSent)
	require.Positive(t, st.FeedbackSent)
	// Every answer got at most one reward, by one route, with the
	// verifier's value.
	for id, c := range fx.calls {
		r, viaSession := fx.rewards[c.session]
		fb, viaFeedback := fx.feedback[id]
		require.False(t, viaSession && viaFeedback, "completion %s rewarded twice", id)
		if !viaSession && !viaFeedback {
			continue
		}
		if viaFeedback {
			r = fb
		}
		want := demotask.Reverse(c.prompt)
		if strings.HasPrefix(c.prompt, demotask.SafetyPrefix) {
			want = demotask.Refusal
		}
		require.Equal(t, demotask.Verify(want, c.answer).Reward, r, "completion %s", id)
	}
}

// TestFleetGroups checks GRPO group mode: each prompt is answered
// GroupSize times, each call in its own session with that session's key.
func TestFleetGroups(t *testing.T) {
	fx, srv := newFixtureOpenAI(t, "sk-demo")
	fleet, err := NewFleet(FleetConfig{BaseURL: srv.URL, APIKey: "sk-demo", Agents: 2, GroupSize: 4, RunID: "t3",
		MaxFeedbackDelay: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fleet.Run(ctx) }()
	require.Eventually(t, func() bool { return fleet.Stats().Calls >= 40 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	st := fleet.Stats()
	require.Zero(t, st.Errors, st.LastError)

	fx.mu.Lock()
	defer fx.mu.Unlock()
	require.Empty(t, fx.badHeaders)
	complete := 0
	for gid, members := range fx.groups {
		var prompts []string
		for _, sid := range members {
			if cid, ok := fx.sessions[sid]; ok {
				prompts = append(prompts, fx.calls[cid].prompt)
			}
		}
		if len(prompts) == 4 {
			complete++
		}
		for _, p := range prompts {
			require.Equal(t, prompts[0], p, "group %s answers one prompt", gid)
		}
	}
	require.GreaterOrEqual(t, complete, 8)
	require.Equal(t, st.Calls, st.RewardsSent+st.FeedbackSent)
}

func TestFleetCountsErrorsAndKeepsGoing(t *testing.T) {
	_, srv := newFixtureOpenAI(t, "sk-right")
	fleet, err := NewFleet(FleetConfig{BaseURL: srv.URL, APIKey: "sk-wrong", Agents: 2, RunID: "t2"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fleet.Run(ctx) }()
	require.Eventually(t, func() bool { return fleet.Stats().Errors >= 2 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	st := fleet.Stats()
	require.Zero(t, st.Calls)
	require.Contains(t, st.LastError, "401")
}

// TestFleetPaced checks SessionsPerSecond caps the whole fleet, however
// many agents it has.
func TestFleetPaced(t *testing.T) {
	_, srv := newFixtureOpenAI(t, "sk-demo")
	const rate = 20.0
	fleet, err := NewFleet(FleetConfig{BaseURL: srv.URL, APIKey: "sk-demo", Agents: 8, SessionsPerSecond: rate,
		MaxFeedbackDelay: time.Millisecond, RunID: "t3"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- fleet.Run(ctx) }()
	require.Eventually(t, func() bool { return fleet.Stats().Calls >= 5 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	// The ticker buffers one tick, so at most one session beyond the rate.
	require.LessOrEqual(t, float64(fleet.Stats().Calls), rate*time.Since(start).Seconds()+1)
}

func TestFleetConfigErrors(t *testing.T) {
	for name, cfg := range map[string]FleetConfig{
		"no url":      {APIKey: "k"},
		"ftp url":     {BaseURL: "ftp://x", APIKey: "k"},
		"no key":      {BaseURL: "http://127.0.0.1:1"},
		"agents":      {BaseURL: "http://127.0.0.1:1", APIKey: "k", Agents: -1},
		"temperature": {BaseURL: "http://127.0.0.1:1", APIKey: "k", Temperature: 3},
		"safety":      {BaseURL: "http://127.0.0.1:1", APIKey: "k", SafetyFraction: 1},
		"group":       {BaseURL: "http://127.0.0.1:1", APIKey: "k", GroupSize: 65},
		"pace":        {BaseURL: "http://127.0.0.1:1", APIKey: "k", SessionsPerSecond: -1},
	} {
		_, err := NewFleet(cfg)
		require.Error(t, err, name)
	}
}

func TestRolling(t *testing.T) {
	r := newRolling(3)
	require.Zero(t, r.mean())
	r.add(true)
	require.Equal(t, 1.0, r.mean())
	r.add(false)
	r.add(false)
	r.add(false) // pushes the first true out
	require.Zero(t, r.mean())
	r.add(true)
	require.InDelta(t, 1.0/3, r.mean(), 1e-9)
}

func TestFleetRetriesARateLimitedPost(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"rate limited"}}`, http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	f, err := NewFleet(FleetConfig{BaseURL: srv.URL, APIKey: "k"})
	require.NoError(t, err)
	require.NoError(t, f.post(context.Background(), "/v1/feedback", map[string]any{"value": 1}))
	require.Equal(t, int32(3), calls.Load(), "two 429s waited out, then the reward landed")

	calls.Store(-100) // every answer a 429 now: give up after maxSendAttempts
	err = f.post(context.Background(), "/v1/feedback", map[string]any{"value": 1})
	require.ErrorContains(t, err, "status 429")
}
