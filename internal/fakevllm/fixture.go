// Package fakevllm is a FAKE of a vLLM server, not a model server: a
// local HTTP server that speaks the OpenAI Chat Completions protocol the way vLLM
// does (return_token_ids, return_tokens_as_token_ids, logprobs, SSE with
// usage), with a deterministic byte-level "model", a configurable fixed
// latency and injectable failures. Tests and `flywheel bench gateway` use
// it where a real vLLM would need a GPU and weights.
package fakevllm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fixture is the fake upstream. Set its fields before serving.
type Fixture struct {
	// Latency is added before every answer (and between stream chunks,
	// divided evenly).
	Latency time.Duration
	// Model is the served model name (default "fixture-model").
	Model string
	// FailStatus, when FailNext > 0, is answered to the next FailNext
	// requests (default 503), with RetryAfter seconds if set.
	FailStatus int
	RetryAfter int
	FailNext   atomic.Int64
	// BreakStreamAfter > 0 cuts streams after that many chunks without
	// [DONE], as a crashed upstream would.
	BreakStreamAfter int
	// ErrorChunkAfter > 0 ends streams after that many chunks with an
	// error chunk and [DONE], as vLLM does when generation fails once the
	// stream has started (create_streaming_error_response).
	ErrorChunkAfter int
	// OldTokenIDs ignores return_token_ids, as vLLM did before it had
	// that parameter; return_tokens_as_token_ids still works.
	OldTokenIDs bool
	// RuntimeLoRA serves vLLM's dynamic LoRA endpoints, as vLLM does with
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (without it they are 404):
	// POST /v1/load_lora_adapter {"lora_name","lora_path"} and
	// /v1/unload_lora_adapter {"lora_name"}. A chat request must then name
	// the base model or a loaded adapter, or it gets vLLM's 404.
	RuntimeLoRA bool
	// AdapterReply, when set, is how a loaded adapter answers (given its
	// name and the last user message) in place of the base's echo.
	AdapterReply func(adapter, last string) string
	// Reasoning, when set, is exposed thinking every answer starts with,
	// as vLLM's reasoning parser returns it: message.reasoning_content, or
	// in a stream a delta of its own before the answer's (its tokens are
	// not among the answer's ids here).
	Reasoning string
	// LoRALatency is added to each adapter load, as reading weights takes.
	LoRALatency time.Duration
	// FailLoRA, when > 0, fails that many load / unload calls with 500.
	FailLoRA atomic.Int64

	Requests atomic.Int64
	mu       sync.Mutex
	last     []byte
	lastHdr  http.Header
	// adapters are the loaded LoRA adapters: name → path.
	adapters map[string]string
	// adapterCalls are the load / unload bodies received, in order.
	adapterCalls []AdapterCall
}

// LastHeader is a header of the last request received.
func (f *Fixture) LastHeader(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastHdr.Get(name)
}

// LastRequest is the last request body received, decoded on demand so
// serving stays cheap (the benchmark runs this fixture in its process).
func (f *Fixture) LastRequest() map[string]any {
	f.mu.Lock()
	body := f.last
	f.mu.Unlock()
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	return m
}

func (f *Fixture) model() string {
	if f.Model == "" {
		return "fixture-model"
	}
	return f.Model
}

type message struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type request struct {
	Model    string    `json:"model"`
	Messages []message `json:"messages"`
	Tools    []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	ToolChoice     json.RawMessage `json:"tool_choice"`
	MaxTokens      int             `json:"max_tokens"`
	Logprobs       bool            `json:"logprobs"`
	Stream         bool            `json:"stream"`
	ReturnTokenIDs bool            `json:"return_token_ids"`
	TokensAsIDs    bool            `json:"return_tokens_as_token_ids"`
	// Stop are stop strings (vLLM also takes one string; this fake, the
	// list OpenAI clients send).
	Stop []string `json:"stop"`
}

func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// The non-streaming answer as typed values: encoding a map sorts its keys
// and boxes every value, which made this fixture cost more CPU per call
// than the gateway under test.
type wireCompletion struct {
	ID             string          `json:"id"`
	Object         string          `json:"object"`
	Created        int64           `json:"created"`
	Model          string          `json:"model"`
	Choices        []wireChoice    `json:"choices"`
	Usage          map[string]int  `json:"usage"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
}

type wireChoice struct {
	Index        int             `json:"index"`
	Message      wireMessage     `json:"message"`
	FinishReason string          `json:"finish_reason"`
	StopReason   any             `json:"stop_reason"`
	Logprobs     *wireLogprobs   `json:"logprobs,omitempty"`
	TokenIDs     json.RawMessage `json:"token_ids,omitempty"`
}

type wireMessage struct {
	Role             string         `json:"role"`
	Content          *string        `json:"content"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []wireToolCall `json:"tool_calls,omitempty"`
}

type wireToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type wireLogprobs struct {
	// Content is written by appendLogprobs: one object per token is the
	// bulk of an answer, and reflection over it was the bulk of the cost.
	Content json.RawMessage `json:"content"`
}

// appendLogprobs appends the logprobs content array for ids:
// [{"token":…,"logprob":…,"top_logprobs":[]},…].
func appendLogprobs(b []byte, ids []int, tokText func(int) string, lp func(int) float64) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"token":`...)
		b = appendString(b, tokText(id))
		b = append(b, `,"logprob":`...)
		b = strconv.AppendFloat(b, lp(i), 'g', -1, 64)
		b = append(b, `,"top_logprobs":[]}`...)
	}
	return append(b, ']')
}

// appendInts appends xs as a JSON array.
func appendInts(b []byte, xs []int) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// appendString appends s as a JSON string: plain printable ASCII as it
// is, anything else as encoding/json writes it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// ServeHTTP routes /v1/chat/completions, /v1/models, /tokenize and, with
// RuntimeLoRA, the LoRA load and unload endpoints.
func (f *Fixture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		f.models(w)
	case "/v1/chat/completions":
		f.complete(w, r)
	case "/tokenize":
		f.tokenize(w, r)
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		if f.RuntimeLoRA && r.Method == http.MethodPost {
			f.lora(w, r)
			return
		}
		fallthrough
	default:
		// FastAPI's answer to a route it does not have.
		writeJSON(w, 404, map[string]any{"detail": "Not Found"})
	}
}

// tokenize is vLLM's POST /tokenize for chat messages: {"count",
// "max_model_len", "tokens"} of the prompt the fixture conditions on.
func (f *Fixture) tokenize(w http.ResponseWriter, r *http.Request) {
	var req request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		writeJSON(w, 400, map[string]any{"object": "error", "message": "messages required", "code": 400})
		return
	}
	ids := tokens(renderPrompt(req.Messages))
	writeJSON(w, 200, map[string]any{"count": len(ids), "max_model_len": 32768, "tokens": ids})
}

// PromptIDs are the ids the fixture conditions a chat on: its template
// ("role:content\n" per message) in its byte tokenizer. messages is a
// JSON array of chat messages.
func PromptIDs(messages json.RawMessage) ([]int, error) {
	var msgs []message
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return nil, err
	}
	return tokens(renderPrompt(msgs)), nil
}

// renderPrompt is the fixture's chat template.
func renderPrompt(msgs []message) string {
	var prompt strings.Builder
	for _, m := range msgs {
		prompt.WriteString(m.Role + ":" + text(m.Content) + "\n")
	}
	return prompt.String()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// reply is the deterministic model: a tool call to the first tool when
// tools are offered and the last message is the user's, else an echo.
func reply(req *request) (content string, toolName, args string) {
	last := req.Messages[len(req.Messages)-1]
	choice := text(req.ToolChoice)
	if len(req.Tools) > 0 && last.Role == "user" && choice != "none" {
		a, _ := json.Marshal(map[string]string{"query": text(last.Content)})
		return "", req.Tools[0].Function.Name, string(a)
	}
	return "echo: " + text(last.Content), "", ""
}

func tokens(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

func (f *Fixture) complete(w http.ResponseWriter, r *http.Request) {
	f.Requests.Add(1)
	var req request
	body, err := io.ReadAll(r.Body)
	if err != nil || json.Unmarshal(body, &req) != nil {
		writeJSON(w, 400, map[string]any{"object": "error", "message": "bad json", "code": 400})
		return
	}
	f.mu.Lock()
	f.last, f.lastHdr = body, r.Header.Clone()
	_, isAdapter := f.adapters[req.Model]
	f.mu.Unlock()
	served := f.model()
	if f.RuntimeLoRA {
		if !isAdapter && req.Model != served {
			writeJSON(w, 404, vllmError(fmt.Sprintf("The model `%s` does not exist.", req.Model), "NotFoundError", 404))
			return
		}
		if isAdapter {
			served = req.Model // vLLM names the adapter that answered
		}
	}
	if f.FailNext.Load() > 0 && f.FailNext.Add(-1) >= 0 {
		st := f.FailStatus
		if st == 0 {
			st = 503
		}
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", fmt.Sprint(f.RetryAfter))
		}
		writeJSON(w, st, map[string]any{"object": "error", "message": "injected failure", "code": st})
		return
	}
	if f.OldTokenIDs {
		req.ReturnTokenIDs = false
	}
	if len(req.Messages) == 0 {
		writeJSON(w, 400, map[string]any{"object": "error", "message": "messages required", "code": 400})
		return
	}
	promptIDs := tokens(renderPrompt(req.Messages))
	content, tool, args := reply(&req)
	if isAdapter && f.AdapterReply != nil && tool == "" {
		content = f.AdapterReply(req.Model, text(req.Messages[len(req.Messages)-1].Content))
	}
	out := content
	if tool != "" {
		out = args
	}
	if req.MaxTokens > 0 && len(out) > req.MaxTokens && tool == "" {
		out = out[:req.MaxTokens]
		content = out
	}
	// A stop string ends the answer before it, and vLLM names it in
	// stop_reason.
	var stopReason any
	if tool == "" {
		for _, st := range req.Stop {
			if i := strings.Index(out, st); st != "" && i >= 0 {
				out, content, stopReason = out[:i], out[:i], st
				break
			}
		}
	}
	ids := tokens(out)
	finish := "stop"
	if tool != "" {
		finish = "tool_calls"
	} else if stopReason == nil && req.MaxTokens > 0 && len("echo: "+text(req.Messages[len(req.Messages)-1].Content)) > req.MaxTokens {
		finish = "length"
	}
	lp := func(i int) float64 { return -0.01 - 0.1*float64(i%5) }
	tokText := func(id int) string {
		if req.TokensAsIDs {
			return "token_id:" + strconv.Itoa(id)
		}
		return string(rune(id))
	}
	usage := map[string]int{"prompt_tokens": len(promptIDs), "completion_tokens": len(ids), "total_tokens": len(promptIDs) + len(ids)}
	id := fmt.Sprintf("chatcmpl-fixture-%d", f.Requests.Load())
	if !req.Stream {
		time.Sleep(f.Latency)
		msg := wireMessage{Role: "assistant", Content: &content, ReasoningContent: f.Reasoning}
		if tool != "" {
			msg.Content = nil
			msg.ToolCalls = []wireToolCall{{ID: "call_fx" + fmt.Sprint(f.Requests.Load()), Type: "function", Function: wireFunction{Name: tool, Arguments: args}}}
		}
		choice := wireChoice{Message: msg, FinishReason: finish, StopReason: stopReason}
		if req.Logprobs {
			choice.Logprobs = &wireLogprobs{Content: appendLogprobs(nil, ids, tokText, lp)}
		}
		resp := wireCompletion{ID: id, Object: "chat.completion", Created: time.Now().Unix(), Model: served,
			Choices: []wireChoice{choice}, Usage: usage}
		if req.ReturnTokenIDs {
			resp.Choices[0].TokenIDs = appendInts(nil, ids)
			resp.PromptTokenIDs = appendInts(nil, promptIDs)
		}
		writeJSON(w, 200, resp)
		return
	}
	send, done := EventStream(w)
	const per = 4 // tokens per chunk
	chunks := (len(ids) + per - 1) / per
	step := time.Duration(0)
	if chunks > 0 {
		step = f.Latency / time.Duration(chunks+1)
	}
	time.Sleep(step)
	first := map[string]any{"id": id, "object": "chat.completion.chunk", "model": served,
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}}}}
	if req.ReturnTokenIDs {
		first["prompt_token_ids"] = promptIDs
	}
	send(first)
	if f.Reasoning != "" {
		send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": served,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"reasoning_content": f.Reasoning}}}})
	}
	for c := 0; c < chunks; c++ {
		if f.BreakStreamAfter > 0 && c >= f.BreakStreamAfter {
			return // no [DONE]: a broken upstream
		}
		if f.ErrorChunkAfter > 0 && c >= f.ErrorChunkAfter {
			send(map[string]any{"error": map[string]any{"object": "error", "message": "fixture: generation failed",
				"type": "InternalServerError", "param": nil, "code": 500}})
			done()
			return
		}
		time.Sleep(step)
		lo, hi := c*per, min((c+1)*per, len(ids))
		delta := map[string]any{}
		if tool != "" {
			tc := map[string]any{"index": 0, "function": map[string]any{"arguments": out[lo:hi]}}
			if c == 0 {
				tc["id"], tc["type"] = "call_fx"+fmt.Sprint(f.Requests.Load()), "function"
				tc["function"].(map[string]any)["name"] = tool
			}
			delta["tool_calls"] = []any{tc}
		} else {
			delta["content"] = out[lo:hi]
		}
		ch := map[string]any{"index": 0, "delta": delta}
		if req.ReturnTokenIDs {
			ch["token_ids"] = ids[lo:hi]
		}
		if req.Logprobs {
			var lps []any
			for i := lo; i < hi; i++ {
				lps = append(lps, map[string]any{"token": tokText(ids[i]), "logprob": lp(i), "top_logprobs": []any{}})
			}
			ch["logprobs"] = map[string]any{"content": lps}
		}
		send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": served, "choices": []any{ch}})
	}
	send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": served,
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finish, "stop_reason": stopReason}}})
	send(map[string]any{"id": id, "object": "chat.completion.chunk", "model": served, "choices": []any{}, "usage": usage})
	done()
}

// EventStream starts a text/event-stream answer on w: send writes one
// "data: <JSON>" event, done the "data: [DONE]" that ends the stream.
func EventStream(w http.ResponseWriter) (send func(any), done func()) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	fl, _ := w.(http.Flusher)
	write := func(format string, args ...any) {
		fmt.Fprintf(w, format, args...)
		if fl != nil {
			fl.Flush()
		}
	}
	send = func(v any) {
		b, _ := json.Marshal(v)
		write("data: %s\n\n", b)
	}
	return send, func() { write("data: [DONE]\n\n") }
}
