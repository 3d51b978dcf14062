package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
)

// relayedRequest finishes decoding a relayed request: what the neutral
// request can hold of it, for capture. Nothing here refuses the request;
// the server it is relayed to does that.
func relayedRequest(r *Request) (*Request, error) {
	if isSet(r.Input) {
		items, err := parseItems(r.Input)
		if err != nil {
			return nil, err
		}
		r.items = speakable(items)
	}
	var err error
	if r.input, err = Messages(r.items); err != nil {
		return nil, fmt.Errorf("input%v", err) // speakable keeps only items Messages reads
	}
	tools := r.Tools[:0:0]
	for _, t := range r.Tools {
		if t.Type == "function" && t.Name != "" {
			tools = append(tools, t)
		}
	}
	r.Tools = tools
	// A hosted tool's choice or a format the neutral request cannot hold
	// is the server's to judge; capture records the call without it.
	r.toolChoice, _ = toolChoice(r.ToolChoice, r.Tools)
	r.responseFormat, _ = responseFormat(r.Text)
	return r, nil
}

// speakable are the items the neutral request can hold, each as Messages
// reads it: a part that is not text becomes its placeholder, and an item
// of another kind (a hosted tool's call, an item reference) is left out.
func speakable(items []InputItem) []InputItem {
	out := make([]InputItem, 0, len(items))
	for _, it := range items {
		it.Content = textParts(it.Content)
		it.Output = textParts(it.Output)
		if _, err := Messages([]InputItem{it}); err == nil {
			out = append(out, it)
		}
	}
	return out
}

// textParts is an array of parts with each part that is not text as an
// input_text placeholder; anything else is returned as it is.
func textParts(raw json.RawMessage) json.RawMessage {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || trimmed[0] != '[' {
		return raw
	}
	var parts []Part
	if json.Unmarshal(trimmed, &parts) != nil {
		return raw
	}
	changed := false
	for i, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text", "refusal", "reasoning_text":
		default:
			parts[i] = Part{Type: "input_text", Text: Placeholder(p.Type)}
			changed = true
		}
	}
	if !changed {
		return raw
	}
	out, err := json.Marshal(parts)
	if err != nil {
		return raw
	}
	return out
}

// Placeholder is the text capture records for content it cannot hold.
func Placeholder(kind string) string { return "[" + kind + "]" }

// InjectInstructions puts system (the serving harness and playbook) in
// front of a relayed body's instructions, every other byte as it was.
func InjectInstructions(body []byte, system string) ([]byte, error) {
	if system == "" {
		return body, nil
	}
	raw, err := protocol.Field(body, "instructions")
	if err != nil {
		return nil, err
	}
	text := system
	if isSet(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, errors.New("instructions: want a string")
		}
		text = system + "\n\n" + s
	}
	injected, _ := json.Marshal(text)
	return protocol.SetField(body, "instructions", injected)
}

// OverrideTools gives the body's function tools named in changed the
// description and parameters they have in tools (a tool-schema artefact's
// overrides, as artefact.Set.Tools returned them), every other byte as
// sent; hosted tools are left as they are.
func OverrideTools(body []byte, tools []inference.Tool, changed []string) ([]byte, error) {
	return protocol.OverrideTools(body, tools, changed, "parameters", "function")
}

// Answer is what the gateway reads of a response object that a server of
// the Responses API sent.
type Answer struct {
	// ID is the server's id for the response, by which it is read,
	// deleted and continued there.
	ID     string
	Status string
	// Error is a failed response's error.
	Error *Error
	// Response is what capture records: the output's text, reasoning and
	// function calls, the usage, the model that answered.
	Response *inference.Response
}

// answerWire is the part of a response object the gateway reads.
type answerWire struct {
	ID                string             `json:"id"`
	Model             string             `json:"model"`
	Status            string             `json:"status"`
	Error             *Error             `json:"error"`
	IncompleteDetails *IncompleteDetails `json:"incomplete_details"`
	Output            []struct {
		Type      string       `json:"type"`
		Content   []answerPart `json:"content"`
		Summary   []answerPart `json:"summary"`
		CallID    string       `json:"call_id"`
		Name      string       `json:"name"`
		Arguments string       `json:"arguments"`
	} `json:"output"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

type answerPart struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Refusal string `json:"refusal"`
}

// ReadAnswer reads a response object: a whole answer's body, or the
// response of a stream's last event.
func ReadAnswer(raw []byte) (*Answer, error) {
	var w answerWire
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("response: %w", err)
	}
	g := &inference.Response{ModelVersion: w.Model, FinishReason: inference.FinishStop}
	g.Message.Role = inference.RoleAssistant
	var texts []string
	for _, it := range w.Output {
		switch it.Type {
		case "message":
			for _, p := range it.Content {
				texts = append(texts, p.Text+p.Refusal)
			}
		case "function_call":
			g.Message.ToolCalls = append(g.Message.ToolCalls, inference.ToolCall{ID: it.CallID, Name: it.Name, Arguments: it.Arguments})
		case "reasoning":
			var b strings.Builder
			for _, p := range it.Content {
				b.WriteString(p.Text)
			}
			if b.Len() == 0 {
				for _, p := range it.Summary {
					b.WriteString(p.Text)
				}
			}
			g.Message.Reasoning += b.String()
		}
	}
	g.Message.Content = strings.Join(texts, "")
	switch {
	case w.Status == StatusFailed:
		g.FinishReason = inference.FinishError
	case w.Status == StatusIncomplete && w.IncompleteDetails != nil && w.IncompleteDetails.Reason == "max_output_tokens":
		g.FinishReason = inference.FinishLength
	case len(g.Message.ToolCalls) > 0:
		g.FinishReason = inference.FinishToolCalls
	}
	if w.Usage != nil {
		g.Usage.PromptTokens, g.Usage.CompletionTokens = w.Usage.InputTokens, w.Usage.OutputTokens
	}
	return &Answer{ID: w.ID, Status: w.Status, Error: w.Error, Response: g}, nil
}

// Terminal reports whether a stream event ends the response.
func Terminal(event string) bool {
	return event == EventCompleted || event == EventIncomplete || event == EventFailed
}

// StreamReader follows a relayed stream's events for capture: the
// response's id from response.created, the text as it arrives, and the
// whole answer from the last event.
type StreamReader struct {
	// ID is the response's id, once response.created named it.
	ID string
	// Answer is the final response, once a terminal event brought it.
	Answer *Answer
	// Last is the last event's name (its data's type where the server
	// named none).
	Last string
	text strings.Builder
}

// streamEvent is the part of a stream event the reader reads.
type streamEvent struct {
	Type     string          `json:"type"`
	Delta    string          `json:"delta"`
	Response json.RawMessage `json:"response"`
	Code     *string         `json:"code"`
	Message  string          `json:"message"`
}

// StreamError is an error event of a stream.
type StreamError struct {
	Code, Message string
}

func (e *StreamError) Error() string { return e.Code + ": " + e.Message }

// Event reads one event (name is the SSE event's name; "" takes its
// data's type) and reports whether it ended the stream. An error event
// is returned as a *StreamError.
func (s *StreamReader) Event(name string, data []byte) (done bool, err error) {
	var ev streamEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return false, fmt.Errorf("event %s: %w", name, err)
	}
	if name == "" {
		name = ev.Type
	}
	s.Last = name
	switch {
	case name == EventError:
		e := &StreamError{Message: ev.Message}
		if ev.Code != nil {
			e.Code = *ev.Code
		}
		return true, e
	case name == EventCreated && isSet(ev.Response):
		var head struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(ev.Response, &head); err != nil {
			return false, fmt.Errorf("event %s: %w", name, err)
		}
		s.ID = head.ID
	case name == EventTextDelta:
		s.text.WriteString(ev.Delta)
	case Terminal(name):
		if !isSet(ev.Response) {
			return true, fmt.Errorf("event %s: no response", name)
		}
		s.Answer, err = ReadAnswer(ev.Response)
		return true, err
	}
	return false, nil
}

// Response is what capture records of the stream: the final answer, or
// the text that arrived before the stream ended without one.
func (s *StreamReader) Response() *inference.Response {
	if s.Answer != nil {
		return s.Answer.Response
	}
	return &inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Content: s.text.String()}}
}
