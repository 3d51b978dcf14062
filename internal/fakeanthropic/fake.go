// Package fakeanthropic is a FAKE of Anthropic's Messages API
// (api.anthropic.com), not a model: it implements the part of the HTTP
// contract that Flywheel relays, as Anthropic's API reference describes
// it, so tests can check what reached "Anthropic" and what came back:
//
//   - POST /v1/messages with x-api-key and anthropic-version (else 401
//     authentication_error, 400 invalid_request_error) and a body with
//     model, max_tokens and messages (else 400) answers a message
//     {"id": "msg_…", "type": "message", "role": "assistant", "model",
//     "content": […], "stop_reason", "stop_sequence", "usage":
//     {"input_tokens", "output_tokens", "cache_creation_input_tokens",
//     "cache_read_input_tokens"}}; with "stream": true, SSE in Anthropic's
//     order: message_start (content empty, stop_reason null), ping, then
//     for each block content_block_start, content_block_delta
//     (text_delta, thinking_delta then signature_delta, input_json_delta)
//     and content_block_stop, then message_delta (stop_reason,
//     stop_sequence, cumulative usage) and message_stop;
//   - POST /v1/messages/count_tokens answers {"input_tokens": N};
//   - errors are {"type": "error", "error": {"type", "message"},
//     "request_id"} with their status and, where given, retry-after; an
//     error after a stream started is an "error" event with the same data.
//
// The answer echoes the last user text ("echo: …") unless Answer says
// otherwise. Every request is recorded with its headers and exact body.
package fakeanthropic

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
)

// Failure is an error answer, as Anthropic sends it.
type Failure struct {
	// Status is the HTTP status: 400, 401, 429, 500, 529, ….
	Status int
	// Type is error.type: invalid_request_error, rate_limit_error,
	// overloaded_error, api_error, ….
	Type    string
	Message string
	// RetryAfter is the retry-after header ("" for none).
	RetryAfter string
}

// Request is one request the fake received.
type Request struct {
	Path   string
	Header http.Header
	Body   []byte
}

// Fake is the fake API. Set its fields before serving.
type Fake struct {
	// Key is the x-api-key it accepts ("": any).
	Key string
	// Answer is the content of every answer, as Anthropic's blocks (text,
	// thinking, tool_use); nil echoes the last user text.
	Answer []map[string]any
	// CacheRead and CacheCreation are every answer's prompt-cache counts.
	CacheRead, CacheCreation int

	// Failures answer the next /v1/messages calls, one each, in order.
	Failures []Failure
	// ErrorAfter, when > 0, ends a stream with an overloaded_error event
	// after that many events.
	ErrorAfter int
	// CutAfter, when > 0, drops the connection of a stream after that
	// many events.
	CutAfter int

	mu       sync.Mutex
	requests []Request
	ids      atomic.Int64
}

// Break sets CutAfter and ErrorAfter for the next streams (safe while the
// fake serves; a request reads them when it arrives).
func (f *Fake) Break(cutAfter, errorAfter int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.CutAfter, f.ErrorAfter = cutAfter, errorAfter
}

// Requests are the requests received, in order.
func (f *Fake) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.requests...)
}

// ServeHTTP implements http.Handler.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, Request{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	var fail *Failure
	cutAfter, errorAfter := f.CutAfter, f.ErrorAfter
	if r.URL.Path == "/v1/messages" && len(f.Failures) > 0 {
		fail = &f.Failures[0]
		f.Failures = f.Failures[1:]
	}
	f.mu.Unlock()
	if r.Method != http.MethodPost || (r.URL.Path != "/v1/messages" && r.URL.Path != "/v1/messages/count_tokens") {
		f.fail(w, Failure{Status: 404, Type: "not_found_error", Message: "Not found"})
		return
	}
	switch {
	case f.Key != "" && r.Header.Get("x-api-key") != f.Key:
		f.fail(w, Failure{Status: 401, Type: "authentication_error", Message: "invalid x-api-key"})
		return
	case r.Header.Get("anthropic-version") == "":
		f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Message: "anthropic-version: header is required"})
		return
	case fail != nil:
		f.fail(w, *fail)
		return
	}
	var req struct {
		Model     string            `json:"model"`
		MaxTokens *int              `json:"max_tokens"`
		Messages  []json.RawMessage `json:"messages"`
		Stream    bool              `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Message: "body: " + err.Error()})
		return
	}
	if req.Model == "" || len(req.Messages) == 0 {
		f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Message: "model and messages: Field required"})
		return
	}
	input := len(body)/4 + 1
	if r.URL.Path == "/v1/messages/count_tokens" {
		writeJSON(w, 200, map[string]any{"input_tokens": input})
		return
	}
	if req.MaxTokens == nil {
		f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Message: "max_tokens: Field required"})
		return
	}
	content := f.Answer
	if content == nil {
		content = []map[string]any{{"type": "text", "text": "echo: " + lastUserText(req.Messages)}}
	}
	stop := "end_turn"
	output := 0
	for _, b := range content {
		if b["type"] == "tool_use" {
			stop = "tool_use"
		}
		raw, _ := json.Marshal(b)
		output += len(raw)/4 + 1
	}
	msg := map[string]any{"id": fmt.Sprintf("msg_fake%06d", f.ids.Add(1)), "type": "message", "role": "assistant", "model": req.Model,
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": input, "output_tokens": output,
			"cache_creation_input_tokens": f.CacheCreation, "cache_read_input_tokens": f.CacheRead}}
	w.Header().Set("request-id", "req_fake")
	if !req.Stream {
		writeJSON(w, 200, msg)
		return
	}
	f.stream(w, msg, content, cutAfter, errorAfter)
}

// stream writes msg as Anthropic's stream events.
func (f *Fake) stream(w http.ResponseWriter, msg map[string]any, content []map[string]any, cutAfter, errorAfter int) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	flusher, _ := w.(http.Flusher)
	sent := 0
	// send writes one event; false ends the stream (cut or failed).
	send := func(name string, data any) bool {
		if cutAfter > 0 && sent == cutAfter {
			panic(http.ErrAbortHandler) // drops the connection mid-stream
		}
		if errorAfter > 0 && sent == errorAfter {
			name, data = "error", errorBody(Failure{Type: "overloaded_error", Message: "Overloaded"})
		}
		raw, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, raw)
		if flusher != nil {
			flusher.Flush()
		}
		sent++
		return name != "error"
	}
	usage := msg["usage"].(map[string]any)
	start := map[string]any{}
	for k, v := range msg {
		start[k] = v
	}
	start["content"], start["stop_reason"] = []any{}, nil
	start["usage"] = map[string]any{"input_tokens": usage["input_tokens"], "output_tokens": 1,
		"cache_creation_input_tokens": usage["cache_creation_input_tokens"], "cache_read_input_tokens": usage["cache_read_input_tokens"]}
	if !send("message_start", map[string]any{"type": "message_start", "message": start}) ||
		!send("ping", map[string]any{"type": "ping"}) {
		return
	}
	for i, b := range content {
		var opened map[string]any
		var deltas []map[string]any
		switch b["type"] {
		case "text":
			opened = map[string]any{"type": "text", "text": ""}
			for _, part := range chunks(b["text"].(string)) {
				deltas = append(deltas, map[string]any{"type": "text_delta", "text": part})
			}
		case "thinking":
			opened = map[string]any{"type": "thinking", "thinking": ""}
			for _, part := range chunks(b["thinking"].(string)) {
				deltas = append(deltas, map[string]any{"type": "thinking_delta", "thinking": part})
			}
			deltas = append(deltas, map[string]any{"type": "signature_delta", "signature": b["signature"]})
		case "tool_use":
			opened = map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}
			raw, _ := json.Marshal(b["input"])
			for _, part := range chunks(string(raw)) {
				deltas = append(deltas, map[string]any{"type": "input_json_delta", "partial_json": part})
			}
		default:
			opened = b
		}
		if !send("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": opened}) {
			return
		}
		for _, d := range deltas {
			if !send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": d}) {
				return
			}
		}
		if !send("content_block_stop", map[string]any{"type": "content_block_stop", "index": i}) {
			return
		}
	}
	if !send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": msg["stop_reason"], "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": usage["output_tokens"]}}) {
		return
	}
	send("message_stop", map[string]any{"type": "message_stop"})
}

// chunks splits s in pieces of up to 5 bytes, as a model streams.
func chunks(s string) []string {
	var out []string
	for len(s) > 5 {
		out = append(out, s[:5])
		s = s[5:]
	}
	return append(out, s)
}

func (f *Fake) fail(w http.ResponseWriter, e Failure) {
	if e.RetryAfter != "" {
		w.Header().Set("retry-after", e.RetryAfter)
	}
	w.Header().Set("request-id", "req_fake")
	writeJSON(w, e.Status, errorBody(e))
}

func errorBody(e Failure) map[string]any {
	return map[string]any{"type": "error", "error": map[string]any{"type": e.Type, "message": e.Message}, "request_id": "req_fake"}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	raw, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
	w.WriteHeader(status)
	_, _ = w.Write(raw)
}

// lastUserText is the text of the last user message: its string content,
// or its last text block.
func lastUserText(msgs []json.RawMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(msgs[i], &m) != nil || m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var blocks []struct {
			Type    string          `json:"type"`
			Text    string          `json:"text"`
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(m.Content, &blocks)
		for j := len(blocks) - 1; j >= 0; j-- {
			switch blocks[j].Type {
			case "text":
				return blocks[j].Text
			case "tool_result":
				if json.Unmarshal(blocks[j].Content, &s) == nil {
					return s
				}
			}
		}
	}
	return ""
}
