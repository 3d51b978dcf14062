package redact

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
)

func newDefault(t *testing.T) *Redactor {
	r, err := New(Options{})
	require.NoError(t, err)
	return r
}

func TestRedactKinds(t *testing.T) {
	r := newDefault(t)
	cases := []struct {
		name, in, want string
		kinds          []Redaction
	}{
		{"email", "mail jane.doe+x@example.co.uk now", "mail [REDACTED_EMAIL] now", []Redaction{{KindEmail, 1}}},
		{"visa with spaces", "card 4111 1111 1111 1111 ok", "card [REDACTED_CARD_NUMBER] ok", []Redaction{{KindCard, 1}}},
		{"amex dashes", "3782-822463-10005", "[REDACTED_CARD_NUMBER]", []Redaction{{KindCard, 1}}},
		{"luhn failure kept", "order 4111111111111112 shipped", "order 4111111111111112 shipped", nil},
		{"ipv4", "from 192.168.1.20:8080", "from [REDACTED_IP_ADDRESS]:8080", []Redaction{{KindIP, 1}}},
		{"ipv6", "peer 2001:db8:85a3::8a2e:370:7334 up", "peer [REDACTED_IP_ADDRESS] up", []Redaction{{KindIP, 1}}},
		{"us phone", "call (555) 123-4567 or 555.987.6543", "call [REDACTED_PHONE] or [REDACTED_PHONE]", []Redaction{{KindPhone, 2}}},
		{"intl phone", "ring +44 20 7946 0958 today", "ring [REDACTED_PHONE] today", []Redaction{{KindPhone, 1}}},
		{"openai key", "key sk-proj-abcdefghijklmnopqrstuvwxyz012345", "key [REDACTED_SECRET]", []Redaction{{KindSecret, 1}}},
		{"aws key", "AKIAIOSFODNN7EXAMPLE", "[REDACTED_SECRET]", []Redaction{{KindSecret, 1}}},
		{"github token", "ghp_" + strings.Repeat("a1", 18), "[REDACTED_SECRET]", []Redaction{{KindSecret, 1}}},
		{"assignment", `password="hunter22hunter"`, `[REDACTED_SECRET]"`, []Redaction{{KindSecret, 1}}},
		{"bearer", "Authorization: Bearer abcdefghijklmnop1234", "Authorization: [REDACTED_SECRET]", []Redaction{{KindSecret, 1}}},
		{"private key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "[REDACTED_SECRET]", []Redaction{{KindSecret, 1}}},
		{"mixed", "a@b.io 10.0.0.1", "[REDACTED_EMAIL] [REDACTED_IP_ADDRESS]", []Redaction{{KindEmail, 1}, {KindIP, 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reds := r.Text(c.in)
			require.Equal(t, c.want, got)
			require.Equal(t, c.kinds, reds)
		})
	}
}

func TestRedactLeavesOrdinaryText(t *testing.T) {
	r := newDefault(t)
	for _, s := range []string{
		"version 1.2.3 released on 2026-01-02 at 12:30:45",
		"std::vector<int> v; a::b::c",
		"pi is 3.14159265, the answer is 42, order #123456",
		"def f(x): return x*2",
		"the token count was 1234",
	} {
		got, reds := r.Text(s)
		require.Equal(t, s, got)
		require.Empty(t, reds)
	}
}

func TestCustomPatternsAndDisable(t *testing.T) {
	r, err := New(Options{Patterns: []string{`employee_id=EMP-\d{6}`}, Disable: []string{KindEmail}})
	require.NoError(t, err)
	got, reds := r.Text("EMP-123456 wrote to bob@example.com")
	require.Equal(t, "[REDACTED_EMPLOYEE_ID] wrote to bob@example.com", got)
	require.Equal(t, []Redaction{{"employee_id", 1}}, reds)

	for _, bad := range []string{"noequals", "=x", "k=(", "k=a*", "bad kind=x"} {
		_, err := New(Options{Patterns: []string{bad}})
		require.Error(t, err, bad)
	}
}

func TestLuhn(t *testing.T) {
	require.True(t, Luhn("79927398713"))
	require.False(t, Luhn("79927398710"))
	require.False(t, Luhn(""))
	require.False(t, Luhn("12a4"))
}

func TestStep(t *testing.T) {
	r := newDefault(t)
	s := &atdp.Step{}
	s.Observation.Messages = []atdp.Message{{Role: "user", Content: "I am ann@corp.com, call +1 415 555 0100"}}
	s.Action.Message = atdp.Message{Role: "assistant", ToolCalls: []atdp.ToolCall{{ID: "c", Name: "send", Arguments: `{"to":"ann@corp.com"}`}}}
	s.InternalState.Reasoning = "user ip 8.8.8.8"
	applied := r.Step(s)
	require.Equal(t, "I am [REDACTED_EMAIL], call [REDACTED_PHONE]", s.Observation.Messages[0].Content)
	require.Equal(t, `{"to":"[REDACTED_EMAIL]"}`, s.Action.Message.ToolCalls[0].Arguments)
	require.Equal(t, "user ip [REDACTED_IP_ADDRESS]", s.InternalState.Reasoning)
	require.Equal(t, applied, s.Metadata.Redactions)
	require.ElementsMatch(t, []atdp.Redaction{
		{Kind: KindEmail, Field: "observation.messages[0].content", Count: 1},
		{Kind: KindPhone, Field: "observation.messages[0].content", Count: 1},
		{Kind: KindEmail, Field: "action.message.tool_calls[0].arguments", Count: 1},
		{Kind: KindIP, Field: "internal_state.reasoning", Count: 1},
	}, applied)
}

func FuzzText(f *testing.F) {
	f.Add("mail a@b.co 4111111111111111 +1 415 555 0100 ::1 fe80::1:2:3")
	r, err := New(Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, reds := r.Text(s)
		n := 0
		for _, red := range reds {
			n += red.Count
		}
		// Every reported redaction left exactly one placeholder (s itself
		// may contain placeholder-like text, hence the offset).
		require.Equal(t, strings.Count(s, "[REDACTED_")+n, strings.Count(out, "[REDACTED_"))
		// Placeholders never match a rule, so a second pass keeps them all.
		again, _ := r.Text(out)
		require.GreaterOrEqual(t, strings.Count(again, "[REDACTED_"), strings.Count(out, "[REDACTED_"))
		if len(reds) == 0 {
			require.Equal(t, s, out)
		}
	})
}
