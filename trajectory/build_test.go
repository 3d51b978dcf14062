package trajectory

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
)

var now = time.Unix(1_700_000_000, 123_000_000)

// row is an interaction as the gateway stores it; the byte policy's ids.
func row(id int64, deployment, status, prompt, completion string, tokens bool) store.InteractionRow {
	var tok trainer.Tokenizer
	req, _ := json.Marshal(StoredRequest{Request: &inference.Request{Model: deployment, Messages: []inference.Message{{Role: "user", Content: prompt}}}, Protocol: "openai"})
	resp, _ := json.Marshal(inference.Response{Message: inference.Message{Role: "assistant", Content: completion}, FinishReason: "stop"})
	r := store.InteractionRow{ID: id, Seq: int(id), Deployment: deployment, ModelVersion: deployment + "@v1", Status: status,
		Request: req, Response: resp, CreatedAt: now, CompletionID: "c" + string(rune('0'+id))}
	if tokens {
		for _, x := range append([]int{trainer.TokImStart}, tok.Encode("user\n"+prompt)...) {
			r.PromptTokenIDs = append(r.PromptTokenIDs, int32(x))
		}
		for _, x := range tok.Encode(completion) {
			r.CompletionTokenIDs = append(r.CompletionTokenIDs, int32(x))
			r.Logprobs = append(r.Logprobs, -0.5)
		}
	}
	return r
}

func rules(t *testing.T, tokenizers map[string]Tokenizer) Rules {
	r, err := NewRules(config.GatewayConfig{RewardWeights: map[string]float64{"user": 1, "judge": 3}, Discount: 0.5,
		RedactPatterns: []string{"ticket=TKT-[0-9]{4}"}}, tokenizers)
	require.NoError(t, err)
	return r
}

func f(x float64) *float64 { return &x }

func TestBuildRewardsReturnsAndEligibility(t *testing.T) {
	sess := store.SessionInfo{ID: "s", TenantID: "t", ConsentBasis: "tenant_default"}
	inter := []store.InteractionRow{
		row(1, "d", "ok", "one", "fine", true),
		row(2, "d", "upstream_error", "two", "", false),
		row(3, "d", "ok", "three", "", false),
		row(4, "d", "ok", "four", "done", true),
	}
	one := int64(1)
	rewards := []store.RewardRow{
		{InteractionID: &one, Value: 0.2, Source: "user", CreatedAt: now},
		{InteractionID: &one, Value: 0.6, Source: "user", CreatedAt: now.Add(time.Hour)}, // a later value of the source wins
		{Value: 1, Source: "user", Final: true, CreatedAt: now},                          // outcome: the last step
		{Value: -1, Source: "judge", CreatedAt: now},                                     // weighs 3
	}
	steps, total, err := Build(sess, inter, rewards, rules(t, nil), nil)
	require.NoError(t, err)
	require.Len(t, steps, 4)
	// Last step: (1·1 + 3·(−1)) / 4 = −0.5. G_3 = −0.5, G_2 = −0.25, G_1 = −0.125, G_0 = 0.6 − 0.0625.
	require.InDelta(t, 0.1, *total, 1e-12)
	wantReturn := []float64{0.5375, -0.125, -0.25, -0.5}
	wantReason := []string{"", atdp.ReasonUpstreamError, atdp.ReasonZeroTrainableTokens, ""}
	for i, s := range steps {
		require.InDelta(t, wantReturn[i], *s.ATDP.Reward.Return, 1e-12, "step %d", i)
		require.Equal(t, wantReason[i], s.Reason(), "step %d", i)
		require.Equal(t, wantReason[i] == "", s.Eligible(), "step %d", i)
		require.Equal(t, StepID(inter[i].ID), s.ATDP.Metadata.StepID)
		require.Equal(t, "2023-11-14T22:13:20.123Z", s.ATDP.Metadata.CreatedAt)
		require.NoError(t, s.ATDP.Validate())
	}
	require.Equal(t, "1", steps[1].ATDP.Metadata.ParentStepID)
	require.Len(t, steps[0].ATDP.Reward.Values, 2, "every value stays on record")
	require.InDelta(t, 0.6, *steps[0].ATDP.Reward.Merged, 1e-12)

	// Without any reward, every step says so; a step after the last reward has no return.
	steps, total, err = Build(sess, inter[:1], nil, rules(t, nil), nil)
	require.NoError(t, err)
	require.Nil(t, total)
	require.Equal(t, atdp.ReasonNoReward, steps[0].Reason())
	steps, _, err = Build(sess, []store.InteractionRow{inter[0], inter[3]}, rewards[:1], rules(t, nil), nil)
	require.NoError(t, err)
	require.Nil(t, steps[1].ATDP.Reward.Return)
	require.Equal(t, atdp.ReasonNoReward, steps[1].Reason())

	// Opting out wins over everything.
	out := sess
	out.OptOut, out.ConsentBasis = true, "end_user"
	steps, _, err = Build(out, inter[:1], rewards[:1], rules(t, nil), nil)
	require.NoError(t, err)
	require.Equal(t, atdp.ReasonOptedOut, steps[0].Reason())

	// What only the training queue knows wins; what Build sees afresh does not.
	steps, _, err = Build(sess, inter[:1], rewards[:1], rules(t, nil), map[int64]store.StepStatus{1: {IneligibleReason: atdp.ReasonArrivedAfterTraining, TrainedInto: []string{"d@v7"}}})
	require.NoError(t, err)
	require.Equal(t, atdp.ReasonArrivedAfterTraining, steps[0].Reason())
	require.Equal(t, []string{"d@v7"}, steps[0].TrainedInto)
	steps, _, err = Build(sess, inter[:1], rewards[:1], rules(t, nil), map[int64]store.StepStatus{1: {IneligibleReason: atdp.ReasonNoReward}})
	require.NoError(t, err)
	require.True(t, steps[0].Eligible(), "the reward arrived after the assembly: the step trains")

	// A stored row that does not decode is an error, not a panic.
	bad := inter[0]
	bad.Request = []byte("{")
	_, _, err = Build(sess, []store.InteractionRow{bad}, nil, rules(t, nil), nil)
	require.Error(t, err)
}

func TestBuildRedactsTokenIDs(t *testing.T) {
	var tok trainer.Tokenizer
	sess := store.SessionInfo{ID: "s", TenantID: "t", ConsentBasis: "tenant_default"}
	pii := "mail bob@example.com, call +1 415 555 0100, card 4111 1111 1111 1111, ticket=TKT-1234"
	inter := []store.InteractionRow{
		row(1, "policy", "ok", pii, "ok", true),
		row(2, "policy", "ok", "hello", "write to bob@example.com", true),
		row(3, "upstream", "ok", pii, "ok", true),
	}
	rewards := []store.RewardRow{{InteractionID: &inter[0].ID, Value: 1, Source: "user"}, {InteractionID: &inter[1].ID, Value: 1, Source: "user"},
		{InteractionID: &inter[2].ID, Value: 1, Source: "user"}}
	steps, _, err := Build(sess, inter, rewards, rules(t, map[string]Tokenizer{"policy": tok}), nil)
	require.NoError(t, err)

	// The held tokenizer's prompt ids are rebuilt from the redacted text: the step trains.
	require.True(t, steps[0].Eligible(), steps[0].Reason())
	prompt := tok.Decode(steps[0].ATDP.Action.Tokens.PromptIDs)
	for _, secret := range []string{"bob@example.com", "555 0100", "4111 1111", "TKT-1234"} {
		require.NotContains(t, prompt, secret)
	}
	require.Contains(t, prompt, "[REDACTED_EMAIL]")
	require.Contains(t, prompt, "[REDACTED_TICKET]", "the configured patterns apply")
	require.Equal(t, "ok", tok.Decode(steps[0].ATDP.Action.Tokens.CompletionIDs))

	// A completion that spelled PII cannot keep its logprobs: it does not train, and keeps no ids.
	require.Equal(t, atdp.ReasonRedactedPII, steps[1].Reason())
	require.Empty(t, steps[1].ATDP.Action.Tokens.CompletionIDs)

	// An upstream's ids cannot be rebuilt: the step does not train and keeps no ids.
	require.Equal(t, atdp.ReasonRedactedPII, steps[2].Reason())
	require.Empty(t, steps[2].ATDP.Action.Tokens.PromptIDs)

	raw, err := json.Marshal([]atdp.Step{steps[0].ATDP, steps[1].ATDP, steps[2].ATDP})
	require.NoError(t, err)
	require.False(t, strings.Contains(string(raw), "bob@example.com"), "no PII in any text field")
}
