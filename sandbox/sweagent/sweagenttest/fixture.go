// Package sweagenttest provides FixtureModel, a test fixture that plays a
// deterministic model behind an OpenAI-compatible Chat Completions endpoint.
// It is a fixture, not a model: it replays a fixed script of tool calls,
// chosen by how many assistant turns the request already contains, so the
// same conversation always gets the same answer. Tests use it as the
// upstream of the gateway, or directly as the agent's base URL.
package sweagenttest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"sort"
	"sync"
	"time"
)

// Step is one scripted assistant turn: a tool call, or plain text when Tool
// is empty.
type Step struct {
	Tool string
	Args map[string]any
	Text string
}

// Request is what the fixture saw in one call.
type Request struct {
	Model    string
	Messages int
	Tools    []string
	Header   http.Header
	// LastToolResult is the content of the last tool message, if any.
	LastToolResult string
}

// FixtureModel serves POST /v1/chat/completions (non-streaming) from Script.
type FixtureModel struct {
	Script []Step

	mu       sync.Mutex
	requests []Request
}

// Requests returns a copy of every request received.
func (f *FixtureModel) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.requests...)
}

// NewServer starts f on a local httptest server; its URL + "/v1" is the
// base URL. Close it when done.
func NewServer(f *FixtureModel) *httptest.Server {
	return httptest.NewServer(f)
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (f *FixtureModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || path.Base(r.URL.Path) != "completions" {
		http.Error(w, `{"error":{"message":"fixture serves only POST /v1/chat/completions","type":"invalid_request_error"}}`, http.StatusNotFound)
		return
	}
	var req struct {
		Model    string        `json:"model"`
		Messages []chatMessage `json:"messages"`
		Stream   bool          `json:"stream"`
		Tools    []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 32<<20)).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	if req.Stream {
		http.Error(w, `{"error":{"message":"fixture does not stream","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	turn := 0
	rec := Request{Model: req.Model, Messages: len(req.Messages), Header: r.Header.Clone()}
	for _, m := range req.Messages {
		switch m.Role {
		case "assistant":
			turn++
		case "tool":
			var s string
			if json.Unmarshal(m.Content, &s) == nil {
				rec.LastToolResult = s
			} else {
				rec.LastToolResult = string(m.Content)
			}
		}
	}
	for _, t := range req.Tools {
		rec.Tools = append(rec.Tools, t.Function.Name)
	}
	f.mu.Lock()
	f.requests = append(f.requests, rec)
	f.mu.Unlock()

	step := Step{Text: "I have nothing more to do."}
	if turn < len(f.Script) {
		step = f.Script[turn]
	}
	msg := map[string]any{"role": "assistant", "content": nil}
	finish := "stop"
	if step.Tool == "" {
		msg["content"] = step.Text
	} else {
		args, _ := json.Marshal(step.Args)
		msg["tool_calls"] = []any{map[string]any{
			"id": fmt.Sprintf("call_fixture_%d", turn), "type": "function",
			"function": map[string]any{"name": step.Tool, "arguments": string(args)},
		}}
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("chatcmpl-fixture-%d", turn), "object": "chat.completion",
		"created": time.Now().Unix(), "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]any{"prompt_tokens": 10 * len(req.Messages), "completion_tokens": 10, "total_tokens": 10*len(req.Messages) + 10},
	})
}

// SolveScript is a script that looks around, reads the file to fix, writes
// the reference fix (solution: repository path -> content), runs the tests
// it can see and submits.
func SolveScript(solution map[string][]byte) []Step {
	paths := make([]string, 0, len(solution))
	for p := range solution {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	steps := []Step{{Tool: "bash", Args: map[string]any{"command": "ls -R"}}}
	for _, p := range paths {
		steps = append(steps,
			Step{Tool: "read_file", Args: map[string]any{"path": p}},
			Step{Tool: "write_file", Args: map[string]any{"path": p, "content": string(solution[p])}})
	}
	steps = append(steps,
		Step{Tool: "bash", Args: map[string]any{"command": "git diff --stat"}},
		Step{Tool: "submit", Args: map[string]any{"summary": "applied the fix"}})
	return steps
}
