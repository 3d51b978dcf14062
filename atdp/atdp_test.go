package atdp

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func f64(v float64) *float64 { return &v }

func sampleStep() *Step {
	s := &Step{
		Observation: Observation{
			Messages: []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "weather?"}},
			Tools:    []Tool{{Name: "get_weather", Parameters: map[string]any{"type": "object"}}},
		},
		Action: Action{
			Message: Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
			Tokens:  Tokens{PromptIDs: []int{1, 2, 3}, CompletionIDs: []int{7, 8}, Logprobs: []float64{-0.1, -2.5}, Versions: []string{"v1"}},
		},
		Result: Result{FinishReason: "tool_calls", LatencyMS: 12.5},
		Reward: Reward{Values: []RewardValue{{Value: 1, Source: "user", At: "2026-01-02T03:04:05Z"}}, Merged: f64(1), Return: f64(0.9)},
		Metadata: Metadata{
			TrajectoryID: "7", SessionID: "s1", StepID: "42", StepIndex: 0, Tenant: "acme",
			Model: "flywheel-policy", ModelVersion: "v1", Usage: Usage{PromptTokens: 3, CompletionTokens: 2},
			Redactions:  []Redaction{{Kind: "email", Field: "observation.messages[1].content", Count: 1}},
			Eligibility: Eligibility{Trainable: true}, CreatedAt: "2026-01-02T03:04:05Z",
		},
	}
	s.Normalize()
	return s
}

func TestStepRoundTrip(t *testing.T) {
	s := sampleStep()
	require.NoError(t, s.Validate())
	raw, err := json.Marshal(s)
	require.NoError(t, err)
	got, err := Decode(raw)
	require.NoError(t, err)
	require.Equal(t, s, got)
}

func TestZeroStepNormalizesToValid(t *testing.T) {
	s := &Step{Metadata: Metadata{SessionID: "s", StepID: "1", Tenant: "t", CreatedAt: "2026-01-02T03:04:05Z",
		Eligibility: Eligibility{Reason: ReasonNoReward}}}
	s.Action.Message.Role = "assistant"
	require.NoError(t, s.Validate())
}

func TestValidateRejects(t *testing.T) {
	cases := map[string]func(s *Step){
		"wrong version":            func(s *Step) { s.ATDPVersion = "2" },
		"bad role":                 func(s *Step) { s.Observation.Messages[0].Role = "robot" },
		"positive logprob":         func(s *Step) { s.Action.Tokens.Logprobs[0] = 0.5 },
		"logprobs misaligned":      func(s *Step) { s.Action.Tokens.Logprobs = []float64{-1} },
		"versions misaligned":      func(s *Step) { s.Action.Tokens.Versions = []string{"a", "b", "c"} },
		"untrainable without why":  func(s *Step) { s.Metadata.Eligibility = Eligibility{} },
		"unknown reason":           func(s *Step) { s.Metadata.Eligibility = Eligibility{Reason: "vibes"} },
		"bad timestamp":            func(s *Step) { s.Metadata.CreatedAt = "yesterday" },
		"missing tenant":           func(s *Step) { s.Metadata.Tenant = "" },
		"negative token id":        func(s *Step) { s.Action.Tokens.PromptIDs[0] = -1 },
		"reward without source":    func(s *Step) { s.Reward.Values[0].Source = "" },
		"redaction with zero hits": func(s *Step) { s.Metadata.Redactions[0].Count = 0 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			s := sampleStep()
			mutate(s)
			require.Error(t, s.Validate())
		})
	}
}

func TestDecodeRejectsUnknownAndTrailing(t *testing.T) {
	raw, err := json.Marshal(sampleStep())
	require.NoError(t, err)
	extra := strings.Replace(string(raw), `"atdp_version":"1"`, `"atdp_version":"1","extra":1`, 1)
	_, err = Decode([]byte(extra))
	require.Error(t, err)
	_, err = Decode(append(append([]byte{}, raw...), raw...))
	require.Error(t, err)
	_, err = Decode([]byte(`{`))
	require.Error(t, err)
}

func TestReaderJSONL(t *testing.T) {
	raw, err := json.Marshal(sampleStep())
	require.NoError(t, err)
	r := NewReader(strings.NewReader(string(raw) + "\n\n" + string(raw) + "\n{\"atdp_version\":\"1\"}\n"))
	for range 2 {
		_, err := r.Next()
		require.NoError(t, err)
	}
	_, err = r.Next()
	require.ErrorContains(t, err, "line 4")
	r = NewReader(strings.NewReader(""))
	_, err = r.Next()
	require.ErrorIs(t, err, io.EOF)
}

func FuzzDecode(f *testing.F) {
	raw, _ := json.Marshal(sampleStep())
	f.Add(raw)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"atdp_version":"1","observation":{"messages":[]}}`))
	f.Add([]byte(`[1,2,3]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			return
		}
		// Whatever decodes must validate and survive a round trip, and its
		// encoding is a fixed point: re-decoding loses nothing.
		require.NoError(t, s.Validate())
		again, err := json.Marshal(s)
		require.NoError(t, err)
		s2, err := Decode(again)
		require.NoError(t, err, "%s", again)
		twice, err := json.Marshal(s2)
		require.NoError(t, err)
		require.JSONEq(t, string(again), string(twice))
		// The JSONL reader agrees with Decode on a one-line stream.
		if !bytes.ContainsAny(b, "\r\n") {
			s3, err := NewReader(bytes.NewReader(b)).Next()
			require.NoError(t, err)
			require.Equal(t, s, s3)
		}
	})
}
