package upstream

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/anthropic"
)

// The parts of Anthropic's answers that capture reads: a message, whole or
// as stream events (message_start, content_block_start,
// content_block_delta, content_block_stop, message_delta, message_stop,
// ping, error). Anything else is relayed and not read.

type anthropicMessage struct {
	Model        string           `json:"model"`
	Content      []anthropicBlock `json:"content"`
	StopReason   string           `json:"stop_reason"`
	StopSequence string           `json:"stop_sequence"`
	Usage        anthropicUsage   `json:"usage"`
}

type anthropicBlock struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Thinking string          `json:"thinking"`
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Input    json.RawMessage `json:"input"`
}

// anthropicUsage counts a message's tokens; the prompt is input_tokens
// plus the tokens written to and read from the prompt cache.
type anthropicUsage struct {
	InputTokens              *int `json:"input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
}

type anthropicEvent struct {
	Type         string            `json:"type"`
	Message      *anthropicMessage `json:"message"`
	Index        int               `json:"index"`
	ContentBlock *anthropicBlock   `json:"content_block"`
	Delta        struct {
		Type         string  `json:"type"`
		Text         string  `json:"text"`
		Thinking     string  `json:"thinking"`
		PartialJSON  string  `json:"partial_json"`
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// messageBuilder assembles an answer from a whole message or its stream
// events.
type messageBuilder struct {
	// delta is the last event's increment, as a neutral delta (nil: none).
	delta *inference.Delta
	// calls numbers the tool_use blocks, by block index, in order;
	// texts counts the blocks response joins as text.
	calls        map[int]int
	texts        int
	model        string
	blocks       []*builtBlock
	stopReason   string
	stopSequence string
	usage        anthropicUsage
}

type builtBlock struct {
	anthropicBlock
	text, thinking, input strings.Builder
}

// start takes a message: message_start's, or a whole answer.
func (mb *messageBuilder) start(m *anthropicMessage) {
	mb.model = m.Model
	mb.stopReason, mb.stopSequence = m.StopReason, m.StopSequence
	mb.addUsage(&m.Usage)
	for i := range m.Content {
		mb.open(len(mb.blocks), &m.Content[i])
	}
}

func (mb *messageBuilder) open(index int, b *anthropicBlock) {
	for len(mb.blocks) <= index {
		mb.blocks = append(mb.blocks, nil)
	}
	bb := &builtBlock{anthropicBlock: *b}
	bb.text.WriteString(b.Text)
	bb.thinking.WriteString(b.Thinking)
	mb.blocks[index] = bb
}

// addUsage keeps every count the server gives; message_delta's counts
// are cumulative.
func (mb *messageBuilder) addUsage(u *anthropicUsage) {
	for _, f := range []struct{ to, from **int }{{&mb.usage.InputTokens, &u.InputTokens},
		{&mb.usage.CacheCreationInputTokens, &u.CacheCreationInputTokens},
		{&mb.usage.CacheReadInputTokens, &u.CacheReadInputTokens}, {&mb.usage.OutputTokens, &u.OutputTokens}} {
		if *f.from != nil {
			*f.to = *f.from
		}
	}
}

// startDelta is a block's first increment, as response joins it: a tool
// call's id and name; a text block's newline after an earlier one, and
// a block of another kind as its placeholder.
func (mb *messageBuilder) startDelta(index int, b *anthropicBlock) {
	switch b.Type {
	case "thinking", "redacted_thinking":
		return
	case "tool_use":
		if mb.calls == nil {
			mb.calls = map[int]int{}
		}
		if _, seen := mb.calls[index]; !seen {
			mb.calls[index] = len(mb.calls)
		}
		mb.delta = &inference.Delta{ToolCalls: []inference.ToolCallDelta{{Index: mb.calls[index], ID: b.ID, Name: b.Name}}}
		return
	}
	text := b.Text
	if b.Type != "text" {
		text = anthropic.Placeholder(b.Type)
	}
	if mb.texts > 0 {
		text = "\n" + text
	}
	mb.texts++
	if text != "" {
		mb.delta = &inference.Delta{Text: text}
	}
}

// maxBlocks bounds a streamed answer's content blocks (an index is the
// server's to choose).
const maxBlocks = 4096

// event reads one stream event; done is true after message_stop, and an
// error event is returned as the error.
func (mb *messageBuilder) event(ev *SSEEvent) (done bool, err error) {
	var e anthropicEvent
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return false, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable stream event", Err: err}
	}
	if ev.Name == "" {
		ev.Name = e.Type
	}
	mb.delta = nil
	switch e.Type {
	case "message_start":
		if e.Message != nil {
			mb.start(e.Message)
		}
	case "content_block_start":
		if e.ContentBlock != nil && e.Index >= 0 && e.Index < maxBlocks {
			mb.open(e.Index, e.ContentBlock)
			mb.startDelta(e.Index, e.ContentBlock)
		}
	case "content_block_delta":
		if e.Index < 0 || e.Index >= len(mb.blocks) || mb.blocks[e.Index] == nil {
			return false, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent a delta for a block it did not start"}
		}
		b := mb.blocks[e.Index]
		switch e.Delta.Type {
		case "text_delta":
			b.text.WriteString(e.Delta.Text)
			if b.Type == "text" {
				mb.delta = &inference.Delta{Text: e.Delta.Text}
			}
		case "thinking_delta":
			b.thinking.WriteString(e.Delta.Thinking)
			mb.delta = &inference.Delta{Reasoning: e.Delta.Thinking}
		case "input_json_delta":
			b.input.WriteString(e.Delta.PartialJSON)
			if call, ok := mb.calls[e.Index]; ok && e.Delta.PartialJSON != "" {
				mb.delta = &inference.Delta{ToolCalls: []inference.ToolCallDelta{{Index: call, Arguments: e.Delta.PartialJSON}}}
			}
		}
	case "message_delta":
		if e.Delta.StopReason != nil {
			mb.stopReason = *e.Delta.StopReason
		}
		if e.Delta.StopSequence != nil {
			mb.stopSequence = *e.Delta.StopSequence
		}
		if e.Usage != nil {
			mb.addUsage(e.Usage)
		}
	case "message_stop":
		return true, nil
	case "error":
		kind, msg := "api_error", ""
		if e.Error != nil {
			kind, msg = e.Error.Type, e.Error.Message
		}
		ie := anthropicError(errorEventStatus(kind), kind, msg)
		return false, ie
	}
	return false, nil
}

// response is what capture records: the text blocks joined by newlines
// and every other block that a neutral message cannot hold as its
// placeholder (as the gateway reads the answer when the client sends it
// back), thinking as reasoning, tool_use blocks as tool calls. model is
// the name the call asked for, the version where the server names none.
func (mb *messageBuilder) response(model string) *inference.Response {
	resp := &inference.Response{ModelVersion: mb.model, StopSequence: mb.stopSequence}
	if resp.ModelVersion == "" {
		resp.ModelVersion = model
	}
	resp.Message.Role = inference.RoleAssistant
	var texts []string
	for _, b := range mb.blocks {
		if b == nil {
			continue
		}
		switch b.Type {
		case "text":
			texts = append(texts, b.text.String())
		case "thinking":
			resp.Message.Reasoning += b.thinking.String()
		case "redacted_thinking":
		case "tool_use":
			args := b.input.String()
			if args == "" {
				args = string(b.Input)
			}
			if strings.TrimSpace(args) == "" {
				args = "{}"
			}
			resp.Message.ToolCalls = append(resp.Message.ToolCalls, inference.ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
		default:
			texts = append(texts, anthropic.Placeholder(b.Type))
		}
	}
	resp.Message.Content = strings.Join(texts, "\n")
	switch mb.stopReason {
	case "max_tokens", "model_context_window_exceeded":
		resp.FinishReason = inference.FinishLength
	case "tool_use":
		resp.FinishReason = inference.FinishToolCalls
	default:
		resp.FinishReason = inference.FinishStop
	}
	if mb.stopReason != "stop_sequence" {
		resp.StopSequence = ""
	}
	u := mb.usage
	for _, n := range []*int{u.InputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens} {
		if n != nil {
			resp.Usage.PromptTokens += *n
		}
	}
	if u.OutputTokens != nil {
		resp.Usage.CompletionTokens = *u.OutputTokens
	}
	return resp
}
