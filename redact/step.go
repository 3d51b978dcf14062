package redact

import (
	"fmt"

	"github.com/flywheel-ai/flywheel/atdp"
)

// Step redacts every free-text field of an ATDP step in place (messages,
// tool arguments, tool results, reasoning, retrieved context, memory) and
// appends what it removed to s.Metadata.Redactions, by field. Token ids are
// not touched here: a step with redactions must not train on ids that
// still encode the removed text, which the eligibility check decides.
func (r *Redactor) Step(s *atdp.Step) []atdp.Redaction {
	var applied []atdp.Redaction
	do := func(field string, text *string) {
		if *text == "" {
			return
		}
		out, reds := r.Text(*text)
		*text = out
		for _, red := range reds {
			applied = append(applied, atdp.Redaction{Kind: red.Kind, Field: field, Count: red.Count})
		}
	}
	msg := func(prefix string, m *atdp.Message) {
		do(prefix+".content", &m.Content)
		for i := range m.ToolCalls {
			do(fmt.Sprintf("%s.tool_calls[%d].arguments", prefix, i), &m.ToolCalls[i].Arguments)
		}
	}
	for i := range s.Observation.Messages {
		msg(fmt.Sprintf("observation.messages[%d]", i), &s.Observation.Messages[i])
	}
	for i := range s.Observation.Context {
		do(fmt.Sprintf("observation.context[%d].content", i), &s.Observation.Context[i].Content)
	}
	for i := range s.Observation.Memory {
		do(fmt.Sprintf("observation.memory[%d].content", i), &s.Observation.Memory[i].Content)
	}
	do("internal_state.reasoning", &s.InternalState.Reasoning)
	msg("action.message", &s.Action.Message)
	for i := range s.Result.ToolResults {
		msg(fmt.Sprintf("result.tool_results[%d]", i), &s.Result.ToolResults[i])
	}
	do("result.error", &s.Result.Error)
	s.Metadata.Redactions = append(s.Metadata.Redactions, applied...)
	return applied
}
