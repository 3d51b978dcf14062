package trajectory

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/redact"
	"github.com/flywheel-ai/flywheel/store"
)

// Tokenizer is a tokenizer Flywheel holds for a deployment, so token ids
// that spell redacted text can be rebuilt from the redacted text.
type Tokenizer interface {
	// RedactIDs returns ids with every run of text they spell passed
	// through redact; ids that spell no removed text come back unchanged.
	RedactIDs(ids []int, redact func(string) string) []int
}

// Rules are how steps are built: the reward merge and discount, the
// redaction rules, and which deployments' token ids Flywheel can rebuild.
type Rules struct {
	// Weights merge reward sources (gateway.reward_weights).
	Weights map[string]float64
	// Discount is γ (gateway.discount), in (0, 1].
	Discount float64
	Redactor *redact.Redactor
	// Tokenizers maps a deployment to the tokenizer of its token ids; a
	// deployment not listed (an upstream whose tokenizer Flywheel does not
	// hold) cannot have redacted ids rebuilt, so such steps do not train.
	Tokenizers map[string]Tokenizer
}

// NewRules builds the rules from the gateway configuration.
func NewRules(cfg config.GatewayConfig, tokenizers map[string]Tokenizer) (Rules, error) {
	red, err := redact.New(redact.Options{Patterns: cfg.RedactPatterns})
	if err != nil {
		return Rules{}, err
	}
	return Rules{Weights: cfg.RewardWeights, Discount: cfg.Discount, Redactor: red, Tokenizers: tokenizers}, nil
}

// Step is one built step with what the store records beside its JSON.
type Step struct {
	ATDP          atdp.Step
	InteractionID int64
	// Rewards are the rewards bound to the step, in arrival order.
	Rewards []store.RewardRow
	// Status is the interaction's capture status ("ok" or an error kind).
	Status string
	// TrainedInto is the model versions its sample trained (from the
	// verdicts; empty when it has not trained).
	TrainedInto []string
}

// queueVerdict are the reasons only the training queue knows; a stored
// verdict with one of them wins over what Build sees. Every other reason
// Build decides afresh, so a reward that arrived after the last assembly
// shows at once.
var queueVerdict = map[string]bool{atdp.ReasonStaleVersion: true, atdp.ReasonArrivedAfterTraining: true, atdp.ReasonFilteredGroup: true}

// Eligible says whether the step will train.
func (s *Step) Eligible() bool { return s.ATDP.Metadata.Eligibility.Trainable }

// Reason is why the step will not train ("" when it will).
func (s *Step) Reason() string { return s.ATDP.Metadata.Eligibility.Reason }

// StepID is the ATDP step id of an interaction: its id, which is unique
// and stable across re-assemblies.
func StepID(interactionID int64) string { return strconv.FormatInt(interactionID, 10) }

// Time is the one timestamp format of ATDP steps.
func Time(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// Build turns a session's interactions (in order) and rewards (in arrival
// order) into redacted, rewarded, discounted ATDP steps, each judged for
// eligibility with one reason when it will not train. verdicts, when
// given, are the stored verdicts of the session's assembly; the reasons
// only the training queue knows (queueVerdict) win. It returns the steps and the session's total reward
// (nil when none arrived). It is pure.
func Build(sess store.SessionInfo, inter []store.InteractionRow, rewards []store.RewardRow, rules Rules, verdicts map[int64]store.StepStatus) ([]Step, *float64, error) {
	ids := make([]int64, len(inter))
	for i, it := range inter {
		ids[i] = it.ID
	}
	per, merged := BindRewards(ids, rewards, rules.Weights)
	gamma := rules.Discount
	if gamma == 0 {
		gamma = 1
	}
	returns := Returns(merged, gamma)
	var total *float64
	for _, m := range merged {
		if m != nil {
			if total == nil {
				total = new(float64)
			}
			*total += *m
		}
	}
	out := make([]Step, len(inter))
	for i, it := range inter {
		req, err := DecodeRequest(it.Request)
		if err != nil {
			return nil, nil, fmt.Errorf("interaction %d: %w", it.ID, err)
		}
		resp, err := DecodeResponse(it.Response)
		if err != nil {
			return nil, nil, fmt.Errorf("interaction %d: %w", it.ID, err)
		}
		st := atdp.Step{ATDPVersion: atdp.Version}
		for _, m := range req.Messages {
			st.Observation.Messages = append(st.Observation.Messages, message(m))
		}
		for _, t := range req.Tools {
			var params any
			if len(t.Parameters) > 0 {
				_ = json.Unmarshal(t.Parameters, &params) // a schema that is not JSON is left out
			}
			st.Observation.Tools = append(st.Observation.Tools, atdp.Tool{Name: t.Name, Description: t.Description, Parameters: params, Version: req.ToolVersions[t.Name]})
		}
		st.InternalState.Reasoning = resp.Message.Reasoning
		st.Action.Message = message(resp.Message)
		st.Action.Message.Role = inference.RoleAssistant
		st.Action.Tokens = atdp.Tokens{PromptIDs: ints(it.PromptTokenIDs), CompletionIDs: ints(it.CompletionTokenIDs), Logprobs: floats(it.Logprobs)}
		if it.ModelVersion != "" {
			st.Action.Tokens.Versions = []string{it.ModelVersion}
		}
		if len(st.Action.Tokens.Logprobs) != len(st.Action.Tokens.CompletionIDs) {
			st.Action.Tokens.Logprobs = nil // not the behaviour policy's: it cannot train
		}
		finish := it.FinishReason
		if finish == "" {
			finish = resp.FinishReason
		}
		st.Result = atdp.Result{FinishReason: finish, LatencyMS: it.LatencyMS, Error: it.ErrorText}
		if i+1 < len(inter) {
			st.Result.ToolResults = toolResultsAfter(inter[i+1].Request, len(req.Messages))
		}
		for _, rw := range per[i] {
			st.Reward.Values = append(st.Reward.Values, atdp.RewardValue{Value: rw.Value, Source: rw.Source, At: Time(rw.CreatedAt)})
		}
		st.Reward.Merged, st.Reward.Return = merged[i], returns[i]
		st.Metadata = atdp.Metadata{
			TrajectoryID: sess.ID, SessionID: sess.ID, StepID: StepID(it.ID), StepIndex: i,
			CompletionID: it.CompletionID, Tenant: sess.TenantID, Model: it.Deployment, ModelVersion: it.ModelVersion,
			ToolVersions: req.ToolVersions,
			Usage:        atdp.Usage{PromptTokens: it.PromptTokens, CompletionTokens: it.CompletionTokens},
			Consent:      atdp.Consent{OptOut: sess.OptOut, Basis: sess.ConsentBasis},
			CreatedAt:    Time(it.CreatedAt),
		}
		if i > 0 {
			st.Metadata.ParentStepID = StepID(inter[i-1].ID)
		}
		pii := rules.redact(&st, req.InjectedSystem, it.Deployment)
		st.Metadata.Eligibility = eligibility(sess, it, &st, pii)
		v := verdicts[it.ID]
		if st.Metadata.Eligibility.Trainable && !v.Eligible && queueVerdict[v.IneligibleReason] {
			st.Metadata.Eligibility = atdp.Eligibility{Reason: v.IneligibleReason}
		}
		st.Normalize()
		out[i] = Step{ATDP: st, InteractionID: it.ID, Rewards: per[i], Status: it.Status, TrainedInto: v.TrainedInto}
	}
	return out, total, nil
}

// redact removes personal data from every text field of st and from its
// token ids. Where the deployment's tokenizer is known, ids are rebuilt
// from the redacted text: the prompt may then train; a completion whose
// ids changed may not (its logprobs are of the removed tokens). Where it is
// not known, a step with any redaction keeps no ids at all. It reports
// whether the ids could not be cleaned (the step must not train).
func (r Rules) redact(st *atdp.Step, injected, deployment string) (pii bool) {
	if r.Redactor == nil {
		return false
	}
	red := r.Redactor.Step(st)
	if injected != "" { // the artefact text in front of the system prompt is in the prompt's ids
		_, found := r.Redactor.Text(injected)
		for _, f := range found {
			x := atdp.Redaction{Kind: f.Kind, Field: "observation.injected_system", Count: f.Count}
			red = append(red, x)
			st.Metadata.Redactions = append(st.Metadata.Redactions, x)
		}
	}
	t := &st.Action.Tokens
	tok, known := r.Tokenizers[deployment]
	if !known {
		if len(red) == 0 {
			return false
		}
		t.PromptIDs, t.CompletionIDs, t.Logprobs = nil, nil, nil
		return true
	}
	text := func(s string) string { out, _ := r.Redactor.Text(s); return out }
	t.PromptIDs = tok.RedactIDs(t.PromptIDs, text)
	if clean := tok.RedactIDs(t.CompletionIDs, text); !equalInts(clean, t.CompletionIDs) {
		t.PromptIDs, t.CompletionIDs, t.Logprobs = nil, nil, nil
		return true
	}
	for _, x := range red {
		if strings.HasPrefix(x.Field, "action.") || strings.HasPrefix(x.Field, "internal_state.") {
			// Removed from what the model said, which its ids spell.
			t.PromptIDs, t.CompletionIDs, t.Logprobs = nil, nil, nil
			return true
		}
	}
	return false
}

// eligibility says whether a step will train and, if not, why.
func eligibility(sess store.SessionInfo, it store.InteractionRow, st *atdp.Step, pii bool) atdp.Eligibility {
	switch {
	case sess.OptOut:
		return atdp.Eligibility{Reason: atdp.ReasonOptedOut}
	case it.Status != "ok":
		return atdp.Eligibility{Reason: atdp.ReasonUpstreamError}
	case pii:
		return atdp.Eligibility{Reason: atdp.ReasonRedactedPII}
	case len(st.Action.Tokens.CompletionIDs) == 0 || len(st.Action.Tokens.Logprobs) != len(st.Action.Tokens.CompletionIDs) ||
		len(st.Action.Tokens.PromptIDs) == 0:
		return atdp.Eligibility{Reason: atdp.ReasonZeroTrainableTokens}
	case st.Reward.Return == nil:
		return atdp.Eligibility{Reason: atdp.ReasonNoReward}
	}
	return atdp.Eligibility{Trainable: true}
}

func message(m inference.Message) atdp.Message {
	out := atdp.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, atdp.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
	}
	return out
}

// toolResultsAfter is the tool messages the next call added after this
// call's prompt and reply.
func toolResultsAfter(next []byte, promptLen int) []atdp.Message {
	req, err := DecodeRequest(next)
	if err != nil || len(req.Messages) <= promptLen+1 {
		return nil
	}
	var out []atdp.Message
	for _, m := range req.Messages[promptLen+1:] {
		if m.Role != inference.RoleTool {
			break
		}
		out = append(out, message(m))
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func ints(xs []int32) []int {
	if xs == nil {
		return nil
	}
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}

func floats(xs []float32) []float64 {
	if xs == nil {
		return nil
	}
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}
