package fakevllm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
)

// Script limits.
const (
	// maxModelLen is the context the fake reports.
	maxModelLen = 32768
	// tokensPerChunk is how many tokens one stream increment carries.
	tokensPerChunk = 4
)

// engine is the scripted model behind the fixture: a byte tokenizer, the
// template "role:content\n" per message, and a deterministic answer (a
// call of the first tool when tools are offered to a user's message, else
// an echo). It is where the fixture's latency, failures and vLLM quirks
// live; the wire is the model server's.
type engine struct{ f *Fixture }

// answer is one scripted generation.
type answer struct {
	out     string // the completion's text: content, or a tool call's arguments
	tool    string // the called tool's name, or ""
	finish  string
	stopped string // the stop sequence that ended it, or ""
	ids     []int
	prompt  []int
}

func (e engine) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	a, err := e.f.script(req)
	if err != nil {
		return nil, err
	}
	if err := sleep(ctx, e.f.Latency); err != nil {
		return nil, err
	}
	return e.f.response(req, a), nil
}

// Stream emits the answer tokensPerChunk tokens at a time, the latency
// spread evenly before and between them; a tool call streams its
// arguments, as vLLM's tool parser does. BreakStreamAfter and
// ErrorChunkAfter break it after that many increments.
func (e engine) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	f := e.f
	a, err := f.script(req)
	if err != nil {
		return nil, err
	}
	chunks := (len(a.ids) + tokensPerChunk - 1) / tokensPerChunk
	step := time.Duration(0)
	if chunks > 0 {
		step = f.Latency / time.Duration(chunks+1)
	}
	if err := sleep(ctx, step); err != nil {
		return nil, err
	}
	callID := f.callID()
	if f.Reasoning != "" {
		if err := emit(inference.Delta{Reasoning: f.Reasoning}); err != nil {
			return nil, err
		}
	}
	for c := range chunks {
		if f.BreakStreamAfter > 0 && c >= f.BreakStreamAfter {
			// A crashed upstream: the stream stops without [DONE].
			panic(http.ErrAbortHandler)
		}
		if f.ErrorChunkAfter > 0 && c >= f.ErrorChunkAfter {
			return nil, errors.New("fixture: generation failed")
		}
		if err := sleep(ctx, step); err != nil {
			return nil, err
		}
		lo, hi := c*tokensPerChunk, min((c+1)*tokensPerChunk, len(a.ids))
		d := inference.Delta{TokenIDs: a.ids[lo:hi], Logprobs: logprobs(lo, hi)}
		if a.tool != "" {
			tc := inference.ToolCallDelta{Arguments: a.out[lo:hi]}
			if c == 0 {
				tc.ID, tc.Name = callID, a.tool
			}
			d.ToolCalls = []inference.ToolCallDelta{tc}
		} else {
			d.Text = a.out[lo:hi]
		}
		if err := emit(d); err != nil {
			return nil, err
		}
	}
	resp := f.response(req, a)
	if len(resp.Message.ToolCalls) > 0 {
		resp.Message.ToolCalls[0].ID = callID
	}
	return resp, nil
}

// script checks the injected failures and the request, and writes the
// answer: an echo of the last message (or AdapterReply's, on an adapter),
// cut at MaxTokens bytes or at the first stop sequence; or, when tools
// are offered to a user's message and tool_choice is not "none", a call
// of the first tool with {"query": <the message>}.
func (f *Fixture) script(req *inference.Request) (answer, error) {
	if f.FailNext.Load() > 0 && f.FailNext.Add(-1) >= 0 {
		st := f.FailStatus
		if st == 0 {
			st = http.StatusServiceUnavailable
		}
		return answer{}, &inference.Error{Status: st, Message: "injected failure", RetryAfter: time.Duration(f.RetryAfter) * time.Second}
	}
	if len(req.Messages) == 0 {
		return answer{}, &inference.Error{Status: http.StatusBadRequest, Message: "messages required"}
	}
	last := req.Messages[len(req.Messages)-1]
	a := answer{finish: inference.FinishStop, prompt: tokens(renderPrompt(req.Messages))}
	if len(req.Tools) > 0 && last.Role == inference.RoleUser && req.ToolChoice != "none" {
		args, _ := json.Marshal(map[string]string{"query": last.Content})
		a.out, a.tool, a.finish = string(args), req.Tools[0].Name, inference.FinishToolCalls
		a.ids = tokens(a.out)
		return a, nil
	}
	echo := "echo: " + last.Content
	a.out = echo
	if req.Version != "" && f.AdapterReply != nil {
		a.out = f.AdapterReply(req.Version, last.Content)
	}
	if req.MaxTokens > 0 && len(a.out) > req.MaxTokens {
		a.out = a.out[:req.MaxTokens]
	}
	for _, st := range req.Stop {
		if i := strings.Index(a.out, st); st != "" && i >= 0 {
			a.out, a.stopped = a.out[:i], st
			break
		}
	}
	// As vLLM's, the finish is "length" when the budget cut the answer;
	// the fixture measures the base's echo, whoever answered.
	if a.stopped == "" && req.MaxTokens > 0 && len(echo) > req.MaxTokens {
		a.finish = inference.FinishLength
	}
	a.ids = tokens(a.out)
	return a, nil
}

// response is the whole answer a.
func (f *Fixture) response(req *inference.Request, a answer) *inference.Response {
	resp := &inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Reasoning: f.Reasoning}, FinishReason: a.finish,
		PromptTokenIDs: a.prompt, CompletionTokenIDs: a.ids, Logprobs: logprobs(0, len(a.ids)), StopSequence: a.stopped,
		Usage: inference.Usage{PromptTokens: len(a.prompt), CompletionTokens: len(a.ids)}}
	if a.tool != "" {
		resp.Message.ToolCalls = []inference.ToolCall{{ID: f.callID(), Name: a.tool, Arguments: a.out}}
	} else {
		resp.Message.Content = a.out
	}
	return resp
}

// callID names a tool call after the request it answers.
func (f *Fixture) callID() string { return fmt.Sprintf("call_fx%d", f.Requests.Load()) }

// logprobs are the scripted logprobs of positions lo to hi.
func logprobs(lo, hi int) []float32 {
	out := make([]float32, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, float32(-0.01-0.1*float64(i%5)))
	}
	return out
}

func (e engine) PromptTokens(req *inference.Request, _ bool) ([]int, error) {
	if len(req.Messages) == 0 {
		return nil, errors.New("messages required")
	}
	// The template has no generation prompt to leave out.
	return tokens(renderPrompt(req.Messages)), nil
}

func (engine) Encode(text string) []int { return tokens(text) }

func (engine) TokenText(id int) string { return string(rune(id)) }

func (engine) MaxLen() int { return maxModelLen }

// Prepare loads an adapter as vLLM reads a PEFT adapter: a path without
// adapter_config.json is LoRAAdapterNotFoundError. FailLoRA fails it with
// a 500 first; LoRALatency is the time reading weights takes.
func (e engine) Prepare(name, path string) (int, error) {
	f := e.f
	if f.FailLoRA.Load() > 0 && f.FailLoRA.Add(-1) >= 0 {
		return 0, &inference.Error{Status: http.StatusInternalServerError, Message: "fake engine failure"}
	}
	if _, err := os.Stat(filepath.Join(path, "adapter_config.json")); err != nil {
		return 0, &inference.Error{Status: http.StatusNotFound, Message: fmt.Sprintf("Loading lora %s failed: No adapter found for %s", name, path)}
	}
	time.Sleep(f.LoRALatency)
	return maxModelLen, nil
}

// The fixture holds no weights: the registry is the server's.
func (engine) Loaded(string, string) {}

func (engine) Evict(string) {}

// renderPrompt is the fixture's chat template.
func renderPrompt(msgs []inference.Message) string {
	var prompt strings.Builder
	for _, m := range msgs {
		prompt.WriteString(m.Role + ":" + m.Content + "\n")
	}
	return prompt.String()
}

// tokens is the byte tokenizer.
func tokens(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
