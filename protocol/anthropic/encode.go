package anthropic

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
)

// DefaultMaxTokens is the max_tokens of a request converted from a
// protocol where it is optional; Anthropic's API requires one.
const DefaultMaxTokens = 4096

// FromNeutral is the Messages request for a neutral one, for a server of
// Anthropic's dialect called by a client of another protocol. What the
// Messages API cannot carry is lost: earlier turns' reasoning (a thinking
// block needs the signature only Anthropic's own answer holds), seed,
// penalties, logit_bias and logprobs; a response_format other than text
// is refused, as Anthropic has no such field. System messages, wherever
// they are, become the system prompt; tool messages become tool_result
// blocks of a user turn.
func FromNeutral(req *inference.Request) (*Request, error) {
	if len(req.ResponseFormat) > 0 {
		var rf struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(req.ResponseFormat, &rf) != nil || rf.Type != "text" {
			return nil, fmt.Errorf("response_format: a deployment of Anthropic's dialect has none; ask for the format in the prompt")
		}
	}
	maxTokens := req.MaxTokens
	if maxTokens <= 0 {
		maxTokens = DefaultMaxTokens
	}
	out := &Request{Model: req.Model, MaxTokens: &maxTokens, Temperature: req.Temperature, TopP: req.TopP, StopSequences: req.Stop,
		Messages: []Message{}}
	var system []string
	var turn *turnBlocks
	flush := func() {
		if turn != nil && len(turn.blocks) > 0 {
			content, _ := json.Marshal(turn.blocks)
			out.Messages = append(out.Messages, Message{Role: turn.role, Content: content})
		}
		turn = nil
	}
	add := func(role string, blocks ...Block) {
		if turn == nil || turn.role != role {
			flush()
			turn = &turnBlocks{role: role}
		}
		turn.blocks = append(turn.blocks, blocks...)
	}
	for i, m := range req.Messages {
		switch m.Role {
		case inference.RoleSystem:
			system = append(system, m.Content)
		case inference.RoleUser:
			if m.Content != "" {
				add(inference.RoleUser, Block{Type: "text", Text: m.Content})
			}
		case inference.RoleTool:
			if m.ToolCallID == "" {
				return nil, fmt.Errorf("messages.%d.tool_call_id: required", i)
			}
			content, _ := json.Marshal(m.Content)
			add(inference.RoleUser, Block{Type: "tool_result", ToolUseID: m.ToolCallID, Content: content})
		case inference.RoleAssistant:
			if m.Content != "" {
				add(inference.RoleAssistant, Block{Type: "text", Text: m.Content})
			}
			for _, tc := range m.ToolCalls {
				add(inference.RoleAssistant, Block{Type: "tool_use", ID: tc.ID, Name: tc.Name, Input: ToolInput(tc.Arguments)})
			}
		default:
			return nil, fmt.Errorf("messages.%d.role: %q has no Anthropic equivalent", i, m.Role)
		}
	}
	flush()
	if len(system) > 0 {
		out.System, _ = json.Marshal(strings.Join(system, "\n\n"))
	}
	for _, t := range req.Tools {
		schema := t.Parameters
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		out.Tools = append(out.Tools, Tool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	if len(req.Tools) > 0 {
		out.ToolChoice = toolChoice(req)
	}
	return out, nil
}

// turnBlocks is one turn being built: consecutive messages of one role.
type turnBlocks struct {
	role   string
	blocks []Block
}

func toolChoice(req *inference.Request) *ToolChoice {
	tc := &ToolChoice{Type: "auto"}
	switch req.ToolChoice {
	case "", "auto":
	case "none":
		tc.Type = "none"
	case "required":
		tc.Type = "any"
	default:
		tc.Type, tc.Name = "tool", req.ToolChoice
	}
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls && tc.Type != "none" {
		tc.DisableParallelToolUse = true
	}
	return tc
}
