package responses

import (
	"encoding/json"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// Response statuses.
const (
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusInProgress = "in_progress"
	StatusFailed     = "failed"
)

// Response is the response object: what POST /v1/responses answers (or
// streams in its response.* events) and GET /v1/responses/{id} returns.
type Response struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	CompletedAt        *int64             `json:"completed_at"`
	Status             string             `json:"status"`
	Error              *Error             `json:"error"`
	IncompleteDetails  *IncompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int               `json:"max_output_tokens"`
	Model              string             `json:"model"`
	Output             []Item             `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Store              bool               `json:"store"`
	Temperature        float64            `json:"temperature"`
	TopP               float64            `json:"top_p"`
	TopLogprobs        int                `json:"top_logprobs"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              []Tool             `json:"tools"`
	Text               TextConfig         `json:"text"`
	Truncation         string             `json:"truncation"`
	Usage              *Usage             `json:"usage"`
	User               string             `json:"user,omitempty"`
	Metadata           map[string]string  `json:"metadata"`
}

// Error is a failed response's error.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// IncompleteDetails says why a response stopped short.
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// Usage counts a response's tokens.
type Usage struct {
	InputTokens         int          `json:"input_tokens"`
	InputTokensDetails  InputDetails `json:"input_tokens_details"`
	OutputTokens        int          `json:"output_tokens"`
	OutputTokensDetails OutDetails   `json:"output_tokens_details"`
	TotalTokens         int          `json:"total_tokens"`
}

// InputDetails and OutDetails are the usage breakdowns OpenAI sends; the
// gateway does not split cached or reasoning tokens out, so they are 0.
type InputDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type OutDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// Item is one output item: a message, a function call or a reasoning item.
type Item struct {
	Type   string `json:"type"`
	ID     string `json:"id"`
	Status string `json:"status,omitempty"`
	// A message's role and content; a reasoning item's reasoning_text
	// content.
	Role    string `json:"role,omitempty"`
	Content []Part `json:"content,omitempty"`
	// A reasoning item's summary (always present, maybe empty).
	Summary *[]Part `json:"summary,omitempty"`
	// A function call's id, name and arguments.
	CallID    string  `json:"call_id,omitempty"`
	Name      string  `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
}

// Logprob is one sampled token's log probability, with alternatives: the
// same shape as Chat Completions'.
type (
	Logprob    = openai.TokenLogprob
	TopLogprob = openai.TopLogprob
)

// IDs are the output items' ids, given when the items are first shown
// (streamed) so the final response repeats them; an empty one is made.
type IDs struct {
	Reasoning, Message string
	Calls              []string
	// New makes an id with a prefix ("rs_", "msg_", "fc_").
	New func(prefix string) string
}

func (ids *IDs) get(have *string, prefix string) string {
	if *have == "" {
		*have = ids.New(prefix)
	}
	return *have
}

// OutputItems renders an assistant message as output items: its reasoning,
// its text and its function calls, in that order. logprobs are the text's
// (nil when not asked for).
func OutputItems(m inference.Message, logprobs []Logprob, ids *IDs) []Item {
	var out []Item
	if m.Reasoning != "" {
		out = append(out, ReasoningItem(ids.get(&ids.Reasoning, "rs_"), m.Reasoning, StatusCompleted))
	}
	if m.Content != "" || (m.Reasoning == "" && len(m.ToolCalls) == 0) {
		out = append(out, MessageItem(ids.get(&ids.Message, "msg_"), m.Content, logprobs, StatusCompleted))
	}
	for i, tc := range m.ToolCalls {
		for len(ids.Calls) <= i {
			ids.Calls = append(ids.Calls, "")
		}
		out = append(out, CallItem(ids.get(&ids.Calls[i], "fc_"), tc.ID, tc.Name, tc.Arguments, StatusCompleted))
	}
	return out
}

// MessageItem is an assistant message item with one output_text part.
func MessageItem(id, text string, logprobs []Logprob, status string) Item {
	it := Item{Type: "message", ID: id, Status: status, Role: inference.RoleAssistant, Content: []Part{}}
	if status != StatusInProgress {
		it.Content = []Part{TextPart(text, logprobs)}
	}
	return it
}

// TextPart is an output_text part.
func TextPart(text string, logprobs []Logprob) Part {
	if logprobs == nil {
		logprobs = []Logprob{}
	}
	return Part{Type: "output_text", Text: text, Annotations: &[]json.RawMessage{}, Logprobs: &logprobs}
}

// ReasoningItem is a reasoning item whose content is the model's exposed
// reasoning.
func ReasoningItem(id, text, status string) Item {
	it := Item{Type: "reasoning", ID: id, Status: status, Summary: &[]Part{}, Content: []Part{}}
	if status != StatusInProgress {
		it.Content = []Part{{Type: "reasoning_text", Text: text}}
	}
	return it
}

// CallItem is a function call item.
func CallItem(id, callID, name, args, status string) Item {
	return Item{Type: "function_call", ID: id, Status: status, CallID: callID, Name: name, Arguments: &args}
}

// Envelope is a response's request-side fields, the same in every event
// of a stream and in the final object.
func (r *Request) Envelope(id string, created int64) Response {
	resp := Response{
		ID: id, Object: "response", CreatedAt: created, Status: StatusInProgress,
		Instructions: r.Instructions, MaxOutputTokens: r.MaxOutputTokens, Model: r.Model, Output: []Item{},
		ParallelToolCalls: r.ParallelToolCalls == nil || *r.ParallelToolCalls, Store: r.Stored(),
		Temperature: 1, TopP: 1, ToolChoice: r.ToolChoice, Tools: r.Tools, Truncation: r.Truncation,
		User: r.User, Metadata: r.Metadata, Text: TextConfig{Format: json.RawMessage(`{"type":"text"}`)},
	}
	if r.PreviousResponseID != "" {
		prev := r.PreviousResponseID
		resp.PreviousResponseID = &prev
	}
	if r.Temperature != nil {
		resp.Temperature = *r.Temperature
	}
	if r.TopP != nil {
		resp.TopP = *r.TopP
	}
	if r.TopLogprobs != nil {
		resp.TopLogprobs = *r.TopLogprobs
	}
	if !isSet(resp.ToolChoice) {
		resp.ToolChoice = json.RawMessage(`"auto"`)
	}
	if resp.Tools == nil {
		resp.Tools = []Tool{}
	}
	if resp.Truncation == "" {
		resp.Truncation = "disabled"
	}
	if resp.Metadata == nil {
		resp.Metadata = map[string]string{}
	}
	if r.Text != nil && isSet(r.Text.Format) {
		resp.Text = *r.Text
	}
	return resp
}

// Finish fills in a finished generation: the output, the status and the
// usage. finishedAt is the completion's Unix time.
func (resp *Response) Finish(g *inference.Response, logprobs []Logprob, ids *IDs, finishedAt int64) {
	resp.Output = OutputItems(g.Message, logprobs, ids)
	resp.Status = StatusCompleted
	if g.FinishReason == inference.FinishLength {
		resp.Status = StatusIncomplete
		resp.IncompleteDetails = &IncompleteDetails{Reason: "max_output_tokens"}
	}
	resp.CompletedAt = &finishedAt
	resp.Usage = &Usage{InputTokens: g.Usage.PromptTokens, OutputTokens: g.Usage.CompletionTokens,
		TotalTokens: g.Usage.PromptTokens + g.Usage.CompletionTokens}
}
