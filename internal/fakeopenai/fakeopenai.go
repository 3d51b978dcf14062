// Package fakeopenai is a fake of a hosted model behind OpenAI's Chat
// Completions API (POST /v1/chat/completions, GET /v1/models), for tests
// only. It stands for a stronger hosted model that Flywheel routes to
// through an OpenAI-compatible upstream with no token ids (the "openai"
// dialect), such as the model a deployment names as its reflector. Its
// answers are scripted: Script maps each request to the assistant's text
// or tool calls. It reports usage as OpenAI does (prompt_tokens,
// completion_tokens, total_tokens), counting a token per four bytes.
package fakeopenai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Message is a chat message as OpenAI's API carries it.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// ToolCall is an assistant's function call.
type ToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Request is the part of a chat completions request the fake reads.
type Request struct {
	Model       string            `json:"model"`
	Messages    []Message         `json:"messages"`
	Tools       []json.RawMessage `json:"tools,omitempty"`
	MaxTokens   int               `json:"max_tokens,omitempty"`
	Temperature *float64          `json:"temperature,omitempty"`
}

// Reply is a scripted answer: text, or tool calls (name and JSON
// arguments).
type Reply struct {
	Text  string
	Calls [][2]string
}

// Server is the fake. Script must be set; it is called once per request.
type Server struct {
	Script func(Request) Reply

	mu       sync.Mutex
	requests []Request
}

// Requests are the requests received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{}})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		s.complete(w, r)
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown route "+r.URL.Path)
	}
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON: "+err.Error())
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "messages: required")
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, req)
	n := len(s.requests)
	s.mu.Unlock()
	reply := s.Script(req)
	prompt := 0
	for _, m := range req.Messages {
		prompt += len(m.Content)
	}
	msg := map[string]any{"role": "assistant", "content": reply.Text}
	finish, out := "stop", len(reply.Text)
	if len(reply.Calls) > 0 {
		var calls []map[string]any
		for i, c := range reply.Calls {
			calls = append(calls, map[string]any{"id": fmt.Sprintf("call_%d_%d", n, i), "type": "function",
				"function": map[string]string{"name": c[0], "arguments": c[1]}})
			out += len(c[0]) + len(c[1])
		}
		msg["tool_calls"], msg["content"], finish = calls, nil, "tool_calls"
	}
	pt, ct := tokens(prompt), tokens(out)
	if req.MaxTokens > 0 && ct > req.MaxTokens && len(reply.Calls) == 0 {
		// A real model stops at max_tokens.
		msg["content"], ct, finish = reply.Text[:4*req.MaxTokens], req.MaxTokens, "length"
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": fmt.Sprintf("chatcmpl-fake%d", n), "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]int{"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
	})
}

func tokens(bytes int) int { return (bytes + 3) / 4 }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}})
}
