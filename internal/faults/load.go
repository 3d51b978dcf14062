package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// load is the clients of one fault's phase.
type load struct {
	tenant, prefix string
	cancel         context.CancelFunc
	wg             sync.WaitGroup
	httpc          *http.Client

	// rewards: each session ends with a final reward, so its steps queue
	// as training samples.
	rewards bool

	mu             sync.Mutex
	sent           int
	rewardsSent    int
	rewardsAcked   int
	acked          map[string]bool
	statuses       map[string]int
	retryAfter     int
	hung           int
	faultEnd       time.Time
	firstOK        time.Time
	sessionsStored []string
}

// startLoad starts cfg.Clients agents, each running sessions of 4 calls
// (the last with X-Session-Done) against the gateway, with no retries:
// every answer is counted as the client saw it. With rewards each session
// then gets a final reward of +1 or -1 (half each, by session).
func startLoad(st *stack, cfg Config, fault string, rewards bool) *load {
	ctx, cancel := context.WithCancel(context.Background())
	ld := &load{tenant: "default", prefix: fmt.Sprintf("faults-%s-%d-", fault, time.Now().UnixNano()), cancel: cancel,
		acked: map[string]bool{}, statuses: map[string]int{}, rewards: rewards}
	httpc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Clients}}
	ld.httpc = httpc
	for c := range cfg.Clients {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for s := 0; ctx.Err() == nil; s++ {
				session := fmt.Sprintf("%sc%d-s%d", ld.prefix, c, s)
				acked := 0
				for turn := 0; turn < 4 && ctx.Err() == nil; turn++ {
					if ld.call(ctx, httpc, st, session, turn, turn == 3) {
						acked++
					}
					sleep(ctx, cfg.Think)
				}
				if ld.rewards && acked > 0 {
					ld.reward(ctx, httpc, st, session, float64(1-2*(s%2)))
				}
			}
		}()
	}
	return ld
}

// call sends one chat completion and says whether it was acknowledged.
func (ld *load) call(ctx context.Context, httpc *http.Client, st *stack, session string, turn int, done bool) bool {
	body := fmt.Sprintf(`{"model":"flywheel-policy","max_tokens":8,"messages":[{"role":"user","content":"task %s, step %d"}]}`, session, turn)
	req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, "http://"+st.gatewayAddr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+st.key)
	req.Header.Set("X-Session-Id", session)
	if done {
		req.Header.Set("X-Session-Done", "true")
	}
	resp, err := httpc.Do(req)
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.sent++
	if err != nil {
		var te interface{ Timeout() bool }
		if errors.As(err, &te) && te.Timeout() {
			ld.hung++
		}
		ld.statuses["conn"]++
		return false
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ld.statuses[strconv.Itoa(resp.StatusCode)]++
	if resp.Header.Get("Retry-After") != "" {
		ld.retryAfter++
	}
	if resp.StatusCode/100 != 2 {
		return false
	}
	var out struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &out) == nil && out.ID != "" {
		ld.acked[out.ID] = true
	}
	if !ld.faultEnd.IsZero() && ld.firstOK.IsZero() {
		ld.firstOK = time.Now()
	}
	return true
}

// reward posts a session's final reward (POST /v1/sessions/{id}/reward).
func (ld *load) reward(ctx context.Context, httpc *http.Client, st *stack, session string, value float64) {
	body := fmt.Sprintf(`{"value":%g,"final":true,"source":"verifier"}`, value)
	req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost,
		"http://"+st.gatewayAddr+"/v1/sessions/"+session+"/reward", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+st.key)
	resp, err := httpc.Do(req)
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.rewardsSent++
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		ld.rewardsAcked++
	}
}

func (ld *load) markFaultEnd(t time.Time) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.faultEnd = t
}

// stop ends the load and closes its connections, so that what the gateway
// holds afterwards is its own.
func (ld *load) stop() {
	ld.cancel()
	ld.wg.Wait()
	ld.httpc.CloseIdleConnections()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
