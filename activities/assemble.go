package activities

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
)

// Redactor removes personal data from every free-text field of a step in
// place and records what it removed in the step's metadata;
// *redact.Redactor implements it.
type Redactor interface {
	Step(s *atdp.Step) []atdp.Redaction
}

// assembled is one step ready to write.
type assembled struct {
	step  atdp.Step
	row   store.NewStep
	merge *float64
}

// capturedRequest and capturedResponse are the parts of the stored
// request/response JSON a step needs; the gateway stores inference.Request
// and inference.Response.
type capturedRequest struct {
	Model    string              `json:"model"`
	Messages []inference.Message `json:"messages"`
	Tools    []inference.Tool    `json:"tools"`
	// MaxTokens is the client's bound (0: none given); a gate replaying
	// the request keeps it, so a side is not asked for more than users get.
	MaxTokens int `json:"max_tokens"`
}

type capturedResponse struct {
	Message      inference.Message `json:"message"`
	FinishReason string            `json:"finish_reason"`
}

// assembleSteps turns a session's interactions and rewards into ATDP steps:
// redacted, rewarded (rewards bound to a step are averaged; outcome rewards
// — the final ones when any arrived — are added to the last step),
// discounted (G_t = r_t + γ·G_{t+1}) and judged for eligibility with one
// reason per untrainable step. It is pure, so table tests cover it.
func assembleSteps(sess store.SessionInfo, key string, inter []store.InteractionRow, rewards []store.RewardRow, discount float64, red Redactor) ([]assembled, *float64, error) {
	byStep := map[int64][]store.RewardRow{}
	var outcome, finalOutcome []store.RewardRow
	for _, r := range rewards {
		switch {
		case r.InteractionID != nil:
			byStep[*r.InteractionID] = append(byStep[*r.InteractionID], r)
		case r.Final:
			finalOutcome = append(finalOutcome, r)
		default:
			outcome = append(outcome, r)
		}
	}
	if len(finalOutcome) > 0 {
		outcome = finalOutcome
	}

	out := make([]assembled, len(inter))
	var total *float64
	addTotal := func(v float64) {
		if total == nil {
			total = new(float64)
		}
		*total += v
	}
	for i, it := range inter {
		var req capturedRequest
		var resp capturedResponse
		if len(it.Request) > 0 {
			if err := json.Unmarshal(it.Request, &req); err != nil {
				return nil, nil, fmt.Errorf("interaction %d: decode request: %w", it.ID, err)
			}
		}
		if len(it.Response) > 0 && string(it.Response) != "null" {
			if err := json.Unmarshal(it.Response, &resp); err != nil {
				return nil, nil, fmt.Errorf("interaction %d: decode response: %w", it.ID, err)
			}
		}
		st := atdp.Step{ATDPVersion: atdp.Version}
		for _, msg := range req.Messages {
			st.Observation.Messages = append(st.Observation.Messages, toATDP(msg))
		}
		for _, t := range req.Tools {
			var params any
			if len(t.Parameters) > 0 {
				_ = json.Unmarshal(t.Parameters, &params) // a schema that is not JSON is left out
			}
			st.Observation.Tools = append(st.Observation.Tools, atdp.Tool{Name: t.Name, Description: t.Description, Parameters: params})
		}
		st.InternalState.Reasoning = resp.Message.Reasoning
		st.Action.Message = toATDP(resp.Message)
		st.Action.Tokens = atdp.Tokens{
			PromptIDs:     ints(it.PromptTokenIDs),
			CompletionIDs: ints(it.CompletionTokenIDs),
			Logprobs:      floats(it.Logprobs),
			Versions:      []string{it.ModelVersion},
		}
		if st.Action.Tokens.PromptIDs == nil {
			st.Action.Tokens.PromptIDs = []int{}
		}
		if st.Action.Tokens.CompletionIDs == nil {
			st.Action.Tokens.CompletionIDs = []int{}
		}
		if st.Action.Tokens.Logprobs == nil || len(st.Action.Tokens.Logprobs) != len(st.Action.Tokens.CompletionIDs) {
			st.Action.Tokens.Logprobs = []float64{}
		}
		finish := it.FinishReason
		if finish == "" {
			finish = resp.FinishReason
		}
		st.Result = atdp.Result{FinishReason: finish, LatencyMS: it.LatencyMS, Error: it.ErrorText}
		if i+1 < len(inter) {
			st.Result.ToolResults = toolResultsAfter(inter[i+1].Request, len(req.Messages))
		}
		var merged *float64
		st.Reward.Values = []atdp.RewardValue{}
		if rs := byStep[it.ID]; len(rs) > 0 {
			var sum float64
			for _, r := range rs {
				sum += r.Value
				st.Reward.Values = append(st.Reward.Values, atdp.RewardValue{Value: r.Value, Source: r.Source, At: r.CreatedAt.UTC().Format(time.RFC3339)})
			}
			m := sum / float64(len(rs))
			merged = &m
		}
		if i == len(inter)-1 && len(outcome) > 0 {
			var sum float64
			for _, r := range outcome {
				sum += r.Value
				st.Reward.Values = append(st.Reward.Values, atdp.RewardValue{Value: r.Value, Source: r.Source, At: r.CreatedAt.UTC().Format(time.RFC3339)})
			}
			m := sum / float64(len(outcome))
			if merged != nil {
				m += *merged
			}
			merged = &m
		}
		if merged != nil {
			addTotal(*merged)
		}
		st.Reward.Merged = merged
		st.Metadata = atdp.Metadata{
			TrajectoryID: key, SessionID: sess.ID, StepID: fmt.Sprintf("%s/%d", sess.ID, i), StepIndex: i,
			CompletionID: it.CompletionID, Tenant: sess.TenantID, Model: it.Deployment, ModelVersion: it.ModelVersion,
			Usage:      atdp.Usage{PromptTokens: it.PromptTokens, CompletionTokens: it.CompletionTokens},
			Redactions: []atdp.Redaction{}, Consent: atdp.Consent{OptOut: sess.OptOut, Basis: sess.ConsentBasis},
			CreatedAt: it.CreatedAt.UTC().Format(time.RFC3339),
		}
		if i > 0 {
			st.Metadata.ParentStepID = fmt.Sprintf("%s/%d", sess.ID, i-1)
		}
		actionRedacted := false
		if red != nil {
			for _, r := range red.Step(&st) {
				// The completion's token ids still spell what was removed
				// from the action (or its reasoning).
				if strings.HasPrefix(r.Field, "action.") || strings.HasPrefix(r.Field, "internal_state.") {
					actionRedacted = true
				}
			}
		}
		reason := ""
		switch {
		case sess.OptOut:
			reason = atdp.ReasonOptedOut
		case it.Status != "ok":
			reason = atdp.ReasonUpstreamError
		case len(it.CompletionTokenIDs) == 0 || len(it.Logprobs) != len(it.CompletionTokenIDs) || len(it.PromptTokenIDs) == 0:
			reason = atdp.ReasonZeroTrainableTokens
		case actionRedacted:
			reason = atdp.ReasonRedacted
		}
		out[i] = assembled{step: st, merge: merged, row: store.NewStep{InteractionID: it.ID, Index: i, Reward: merged}}
		out[i].row.Reason = reason
	}

	// Returns run backwards; a step with no reward at or after it has none.
	var g *float64
	for i := len(out) - 1; i >= 0; i-- {
		if m := out[i].merge; m != nil || g != nil {
			v := 0.0
			if m != nil {
				v = *m
			}
			if g != nil {
				v += discount * *g
			}
			g = &v
		}
		if g != nil {
			r := *g
			out[i].row.Return = &r
		}
		out[i].step.Reward.Return = out[i].row.Return
		if out[i].row.Reason == "" && out[i].row.Return == nil {
			out[i].row.Reason = atdp.ReasonNoReward
		}
		out[i].row.Eligible = out[i].row.Reason == ""
		out[i].step.Metadata.Eligibility = atdp.Eligibility{Trainable: out[i].row.Eligible, Reason: out[i].row.Reason}
	}
	for i := range out {
		if err := out[i].step.Validate(); err != nil {
			return nil, nil, fmt.Errorf("step %d of session %s: %w", i, sess.ID, err)
		}
		raw, err := json.Marshal(out[i].step)
		if err != nil {
			return nil, nil, fmt.Errorf("encode step %d: %w", i, err)
		}
		out[i].row.Step = raw
		out[i].row.Redactions, _ = json.Marshal(out[i].step.Metadata.Redactions)
	}
	return out, total, nil
}

func toATDP(m inference.Message) atdp.Message {
	out := atdp.Message{Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID, Content: m.Content}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, atdp.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
	}
	return out
}

// toolResultsAfter finds the tool messages the next request appended after
// this step's prompt and answer.
func toolResultsAfter(nextRequest []byte, promptLen int) []atdp.Message {
	var next capturedRequest
	if json.Unmarshal(nextRequest, &next) != nil || len(next.Messages) <= promptLen+1 {
		return nil
	}
	var out []atdp.Message
	for _, m := range next.Messages[promptLen+1:] {
		if m.Role != inference.RoleTool {
			break
		}
		out = append(out, toATDP(m))
	}
	return out
}

func ints(v []int32) []int {
	if v == nil {
		return nil
	}
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func floats(v []float32) []float64 {
	if v == nil {
		return nil
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
