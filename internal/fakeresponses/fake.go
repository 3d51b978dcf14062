// Package fakeresponses is a FAKE of OpenAI's Responses API
// (api.openai.com/v1/responses), not a model: it implements the part of
// the HTTP contract that Flywheel relays, as OpenAI's API reference
// describes it, so tests can check what reached "OpenAI" and what came
// back:
//
//   - POST /v1/responses with "Authorization: Bearer <key>" (else 401
//     invalid_api_key) and a body with model and input (else 400
//     invalid_request_error naming the param) answers a response object
//     {"id": "resp_…", "object": "response", "created_at", "status":
//     "completed", "error": null, "incomplete_details": null,
//     "instructions", "model", "output": […], "previous_response_id",
//     "store", "usage": {"input_tokens", "input_tokens_details",
//     "output_tokens", "output_tokens_details", "total_tokens"}, …};
//   - previous_response_id names a stored response (else 400
//     previous_response_not_found): the conversation is the chain's input
//     and output items, then this request's input; store (default true)
//     keeps the response for GET, DELETE and chaining;
//   - with "stream": true, SSE in OpenAI's order, each event with its
//     type and a sequence_number from 0: response.created and
//     response.in_progress (status in_progress, output empty), then for
//     each output item response.output_item.added, for a message
//     response.content_part.added, response.output_text.delta …,
//     response.output_text.done and response.content_part.done, for a
//     function call response.function_call_arguments.delta … and .done,
//     then response.output_item.done; last response.completed with the
//     whole response (no [DONE] sentinel);
//   - GET and DELETE /v1/responses/{id} read and delete a stored response
//     (DELETE answers {"id", "object": "response.deleted", "deleted":
//     true}); an unknown one is 404;
//   - errors are {"error": {"message", "type", "param", "code"}} with
//     their status and, where given, retry-after; an error after a stream
//     started is an "error" event {"type": "error", "code", "message",
//     "param", "sequence_number"}.
//
// The answer is a message echoing the last user text, "echo: …", with
// the number of user turns in the conversation ("(turn 2)") when there is
// more than one, unless Output says otherwise. Every request is recorded
// with its headers and exact body.
package fakeresponses

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Failure is an error answer, as OpenAI sends it.
type Failure struct {
	// Status is the HTTP status: 400, 401, 429, 500, 503, ….
	Status int
	// Type is error.type (invalid_request_error, rate_limit_error,
	// server_error, …) and Code error.code ("" sends null).
	Type, Code string
	Message    string
	// RetryAfter is the retry-after header ("" for none).
	RetryAfter string
}

// Request is one request the fake received.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         []byte
}

// Fake is the fake API. Set its fields before serving; while it serves,
// change its failures with Fail and Break.
type Fake struct {
	// Key is the bearer token it accepts ("": any).
	Key string
	// Output is every answer's output items (message, function_call,
	// reasoning, as OpenAI's); nil echoes the last user text.
	Output []map[string]any

	// Failures answer the next POST /v1/responses calls, one each, in
	// order.
	Failures []Failure
	// ErrorAfter, when > 0, ends a stream with an error event after that
	// many events.
	ErrorAfter int
	// CutAfter, when > 0, drops the connection of a stream after that
	// many events.
	CutAfter int

	mu       sync.Mutex
	requests []Request
	stored   map[string]*stored
	ids      int
}

// stored is a kept response and the conversation it ends.
type stored struct {
	response     map[string]any
	conversation []json.RawMessage
}

// Fail queues failures for the next POST /v1/responses calls, one each,
// in order (as Failures, but safe while the fake serves).
func (f *Fake) Fail(failures ...Failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Failures = append(f.Failures, failures...)
}

// Break sets CutAfter and ErrorAfter for the next streams (safe while the
// fake serves).
func (f *Fake) Break(cutAfter, errorAfter int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.CutAfter, f.ErrorAfter = cutAfter, errorAfter
}

// faults are a request's stream faults, read when it arrived.
type faults struct{ cutAfter, errorAfter int }

// Requests are the requests received, in order.
func (f *Fake) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.requests...)
}

// Stored reports whether the fake holds response id.
func (f *Fake) Stored(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.stored[id]
	return ok
}

// ServeHTTP implements http.Handler.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	var fail *Failure
	if r.Method == http.MethodPost && len(f.Failures) > 0 {
		fail = &f.Failures[0]
		f.Failures = f.Failures[1:]
	}
	key, output, broken := f.Key, f.Output, faults{f.CutAfter, f.ErrorAfter}
	f.mu.Unlock()
	if key != "" && r.Header.Get("Authorization") != "Bearer "+key {
		f.fail(w, Failure{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "Incorrect API key provided."})
		return
	}
	id, isOne := strings.CutPrefix(r.URL.Path, "/v1/responses/")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/responses":
		if fail != nil {
			f.fail(w, *fail)
			return
		}
		f.create(w, body, output, broken)
	case isOne && (r.Method == http.MethodGet || r.Method == http.MethodDelete):
		f.mu.Lock()
		s, ok := f.stored[id]
		if ok && r.Method == http.MethodDelete {
			delete(f.stored, id)
		}
		f.mu.Unlock()
		switch {
		case !ok:
			f.fail(w, Failure{Status: 404, Type: "invalid_request_error", Message: fmt.Sprintf("Response with id '%s' not found.", id)})
		case r.Method == http.MethodGet:
			writeJSON(w, 200, s.response)
		default:
			writeJSON(w, 200, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
		}
	default:
		f.fail(w, Failure{Status: 404, Type: "invalid_request_error", Message: "Invalid URL (" + r.Method + " " + r.URL.Path + ")"})
	}
}

// create answers POST /v1/responses.
func (f *Fake) create(w http.ResponseWriter, body []byte, output []map[string]any, broken faults) {
	var req struct {
		Model              string          `json:"model"`
		Input              json.RawMessage `json:"input"`
		Instructions       *string         `json:"instructions"`
		PreviousResponseID *string         `json:"previous_response_id"`
		Store              *bool           `json:"store"`
		Stream             bool            `json:"stream"`
		Tools              []any           `json:"tools"`
		Reasoning          any             `json:"reasoning"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Message: "We could not parse the JSON body of your request."})
		return
	}
	if req.Model == "" {
		f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Code: "missing_required_parameter", Message: "Missing required parameter: 'model'."})
		return
	}
	input, ok := items(req.Input)
	if !ok {
		f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Message: "Invalid type for 'input': expected a string or an array of input items."})
		return
	}
	var conversation []json.RawMessage
	if req.PreviousResponseID != nil {
		f.mu.Lock()
		prev, ok := f.stored[*req.PreviousResponseID]
		f.mu.Unlock()
		if !ok {
			f.fail(w, Failure{Status: 400, Type: "invalid_request_error", Code: "previous_response_not_found",
				Message: fmt.Sprintf("Previous response with id '%s' not found.", *req.PreviousResponseID)})
			return
		}
		conversation = append(conversation, prev.conversation...)
	}
	conversation = append(conversation, input...)
	if output == nil {
		text := "echo: " + lastUserText(conversation)
		if n := userTurns(conversation); n > 1 {
			text += fmt.Sprintf(" (turn %d)", n)
		}
		output = []map[string]any{{"type": "message", "role": "assistant", "status": "completed",
			"content": []map[string]any{{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}}}}
	}
	f.mu.Lock()
	f.ids++
	n := f.ids
	f.mu.Unlock()
	id := fmt.Sprintf("resp_fake%06d", n)
	out := make([]map[string]any, len(output))
	outputTokens := 0
	for i, it := range output {
		item := map[string]any{}
		for k, v := range it {
			item[k] = v
		}
		if item["id"] == nil {
			item["id"] = fmt.Sprintf("%s_%06d_%d", itemPrefix(item["type"]), n, i)
		}
		if item["status"] == nil && item["type"] != "reasoning" {
			item["status"] = "completed"
		}
		raw, _ := json.Marshal(item)
		outputTokens += len(raw)/4 + 1
		out[i] = item
	}
	for _, it := range out {
		raw, _ := json.Marshal(it)
		conversation = append(conversation, raw)
	}
	store := req.Store == nil || *req.Store
	inputTokens := len(body)/4 + 1
	tools := req.Tools
	if tools == nil {
		tools = []any{}
	}
	resp := map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "status": "completed",
		"background": false, "error": nil, "incomplete_details": nil, "instructions": req.Instructions, "max_output_tokens": nil,
		"model": req.Model + "-2025-01-01", "output": out, "parallel_tool_calls": true, "previous_response_id": req.PreviousResponseID,
		"reasoning": map[string]any{"effort": nil, "summary": nil}, "store": store, "temperature": 1.0,
		"text": map[string]any{"format": map[string]any{"type": "text"}}, "tool_choice": "auto", "tools": tools, "top_p": 1.0,
		"truncation": "disabled", "user": nil, "metadata": map[string]any{},
		"usage": map[string]any{"input_tokens": inputTokens, "input_tokens_details": map[string]any{"cached_tokens": 0},
			"output_tokens": outputTokens, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
			"total_tokens": inputTokens + outputTokens}}
	if store {
		f.mu.Lock()
		if f.stored == nil {
			f.stored = map[string]*stored{}
		}
		f.stored[id] = &stored{response: resp, conversation: conversation}
		f.mu.Unlock()
	}
	w.Header().Set("x-request-id", "req_fake")
	if !req.Stream {
		writeJSON(w, 200, resp)
		return
	}
	f.stream(w, resp, out, broken)
}

func itemPrefix(kind any) string {
	switch kind {
	case "function_call":
		return "fc"
	case "reasoning":
		return "rs"
	}
	return "msg"
}

// stream writes resp as the Responses API's stream events.
func (f *Fake) stream(w http.ResponseWriter, resp map[string]any, output []map[string]any, broken faults) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	flusher, _ := w.(http.Flusher)
	seq := 0
	// send writes one event; false ends the stream (cut or failed).
	send := func(name string, ev map[string]any) bool {
		if broken.cutAfter > 0 && seq == broken.cutAfter {
			panic(http.ErrAbortHandler) // drops the connection mid-stream
		}
		if broken.errorAfter > 0 && seq == broken.errorAfter {
			name, ev = "error", map[string]any{"code": "server_error", "message": "The server had an error while processing your request.", "param": nil}
		}
		ev["type"], ev["sequence_number"] = name, seq
		raw, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, raw)
		if flusher != nil {
			flusher.Flush()
		}
		seq++
		return name != "error"
	}
	started := map[string]any{}
	for k, v := range resp {
		started[k] = v
	}
	started["status"], started["output"], started["usage"] = "in_progress", []any{}, nil
	if !send("response.created", map[string]any{"response": started}) ||
		!send("response.in_progress", map[string]any{"response": started}) {
		return
	}
	for i, item := range output {
		id := item["id"]
		added := map[string]any{}
		for k, v := range item {
			added[k] = v
		}
		added["status"] = "in_progress"
		var deltas []map[string]any
		var done []map[string]any
		switch item["type"] {
		case "message":
			added["content"] = []any{}
			text := messageText(item)
			part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}, "logprobs": []any{}}
			deltas = append(deltas, map[string]any{"@": "response.content_part.added", "item_id": id, "output_index": i, "content_index": 0, "part": part})
			for _, c := range chunks(text) {
				deltas = append(deltas, map[string]any{"@": "response.output_text.delta", "item_id": id, "output_index": i, "content_index": 0, "delta": c, "logprobs": []any{}})
			}
			full := map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
			done = append(done, map[string]any{"@": "response.output_text.done", "item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []any{}},
				map[string]any{"@": "response.content_part.done", "item_id": id, "output_index": i, "content_index": 0, "part": full})
		case "function_call":
			args, _ := item["arguments"].(string)
			added["arguments"] = ""
			for _, c := range chunks(args) {
				deltas = append(deltas, map[string]any{"@": "response.function_call_arguments.delta", "item_id": id, "output_index": i, "delta": c})
			}
			done = append(done, map[string]any{"@": "response.function_call_arguments.done", "item_id": id, "output_index": i, "arguments": args})
		}
		if !send("response.output_item.added", map[string]any{"output_index": i, "item": added}) {
			return
		}
		for _, ev := range append(deltas, done...) {
			name := ev["@"].(string)
			delete(ev, "@")
			if !send(name, ev) {
				return
			}
		}
		if !send("response.output_item.done", map[string]any{"output_index": i, "item": item}) {
			return
		}
	}
	send("response.completed", map[string]any{"response": resp})
}

// messageText is a message item's output_text.
func messageText(item map[string]any) string {
	raw, _ := json.Marshal(item["content"])
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
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
	w.Header().Set("x-request-id", "req_fake")
	var code any
	if e.Code != "" {
		code = e.Code
	}
	writeJSON(w, e.Status, map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "param": nil, "code": code}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	raw, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
	w.WriteHeader(status)
	_, _ = w.Write(raw)
}

// items is the request's input as items: a string is one user message.
func items(input json.RawMessage) ([]json.RawMessage, bool) {
	var s string
	if json.Unmarshal(input, &s) == nil {
		raw, _ := json.Marshal(map[string]any{"role": "user", "content": s})
		return []json.RawMessage{raw}, true
	}
	var list []json.RawMessage
	if err := json.Unmarshal(input, &list); err != nil {
		return nil, false
	}
	return list, true
}

// userItem is what the fake reads of an item.
type userItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Output  json.RawMessage `json:"output"`
}

// lastUserText is the text of the last user message or function call
// output: its string content, or its last text part.
func lastUserText(conversation []json.RawMessage) string {
	for i := len(conversation) - 1; i >= 0; i-- {
		var it userItem
		if json.Unmarshal(conversation[i], &it) != nil {
			continue
		}
		content := it.Content
		switch {
		case it.Type == "function_call_output":
			content = it.Output
		case it.Role != "user":
			continue
		}
		var s string
		if json.Unmarshal(content, &s) == nil {
			return s
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		_ = json.Unmarshal(content, &parts)
		for j := len(parts) - 1; j >= 0; j-- {
			if parts[j].Type == "input_text" {
				return parts[j].Text
			}
		}
	}
	return ""
}

// userTurns counts the conversation's user messages and function call
// outputs.
func userTurns(conversation []json.RawMessage) int {
	n := 0
	for _, raw := range conversation {
		var it userItem
		if json.Unmarshal(raw, &it) == nil && (it.Role == "user" || it.Type == "function_call_output") {
			n++
		}
	}
	return n
}
