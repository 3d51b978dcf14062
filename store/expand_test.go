package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// TestSuffixRowsReadWhole: rows stored as the suffix of an earlier row of
// their session (the single and the batch insert) come back whole from
// every reader: the session's list, one interaction by completion id (its
// chain read from Postgres) and the recent prompts replay reads. A suffix
// may share only part of its base (an edited conversation), and a suffix
// of a suffix counts into the rebuilt conversation. A row whose base is
// gone is an error, never a silently shorter conversation.
func TestSuffixRowsReadWhole(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	require.NoError(t, store.EnsureTenant(ctx, pool, "sx"))
	dep := "suffix-" + time.Now().Format("150405.000000")
	msg := suffixMessage
	row := func(id string, msgs []string, reply string, prompt, completion []int32, p store.Prefix) *store.NewInteraction {
		return suffixRow(dep, id, msgs, reply, prompt, completion, p)
	}
	sys, u1, a1, u2, a2, u3, edit := msg("system", "be brief"), msg("user", "hi"), msg("assistant", "a1"),
		msg("user", "more"), msg("assistant", "a2"), msg("user", "and?"), msg("user", "hi, edited")

	c1, err := store.InsertInteraction(ctx, pool, row("-1", []string{sys, u1}, "a1", []int32{1, 2, 3}, []int32{4, 5}, store.Prefix{}))
	require.NoError(t, err)
	c2, err := store.InsertInteraction(ctx, pool, row("-2", []string{u2}, "a2", []int32{6}, []int32{7},
		store.Prefix{ID: c1.ID, Messages: 3, Tokens: 5}))
	require.NoError(t, err)
	// The batch path: a suffix of the suffix, and an edit sharing only the
	// system message and one token with turn 1.
	_, errs, err := store.InsertInteractions(ctx, pool, []*store.NewInteraction{
		row("-3", []string{u3}, "a3", []int32{8}, []int32{9}, store.Prefix{ID: c2.ID, Messages: 5, Tokens: 7}),
		row("-4", []string{edit}, "a4", []int32{10}, []int32{11}, store.Prefix{ID: c1.ID, Messages: 1, Tokens: 1}),
	})
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, errs)

	want := map[string]struct {
		msgs   []string
		prompt []int32
	}{
		dep + "-1": {[]string{sys, u1}, []int32{1, 2, 3}},
		dep + "-2": {[]string{sys, u1, a1, u2}, []int32{1, 2, 3, 4, 5, 6}},
		dep + "-3": {[]string{sys, u1, a1, u2, a2, u3}, []int32{1, 2, 3, 4, 5, 6, 7, 8}},
		dep + "-4": {[]string{sys, edit}, []int32{1, 10}},
	}
	check := func(completionID string, request []byte, prompt []int32) {
		t.Helper()
		w, ok := want[completionID]
		require.True(t, ok, completionID)
		var got struct {
			Model     string            `json:"model"`
			MaxTokens int               `json:"max_tokens"`
			Messages  []json.RawMessage `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(request, &got))
		require.Equal(t, dep, got.Model, "the request's other fields are kept")
		require.Equal(t, 9, got.MaxTokens)
		require.Len(t, got.Messages, len(w.msgs), completionID)
		for i, m := range w.msgs {
			require.JSONEq(t, m, string(got.Messages[i]), "%s message %d", completionID, i)
		}
		if prompt != nil {
			require.Equal(t, w.prompt, prompt, completionID)
		}
	}

	rows, err := store.SessionInteractions(ctx, pool, "sx", dep)
	require.NoError(t, err)
	require.Len(t, rows, 4)
	for _, r := range rows {
		check(r.CompletionID, r.Request, r.PromptTokenIDs)
	}
	for id := range want {
		it, err := store.InteractionByCompletion(ctx, pool, "sx", id)
		require.NoError(t, err)
		check(id, it.Request, it.PromptTokenIDs)
	}
	recent, err := store.RecentPrompts(ctx, pool, dep, time.Time{}, 3, false)
	require.NoError(t, err)
	require.Len(t, recent, 3, "the newest three: their bases come from Postgres")
	for _, p := range recent {
		it, err := pool.Query(ctx, `SELECT completion_id FROM interactions WHERE id = $1`, p.InteractionID)
		require.NoError(t, err)
		require.True(t, it.Next())
		var cid string
		require.NoError(t, it.Scan(&cid))
		it.Close()
		check(cid, p.Request, nil)
	}

	// A base that is gone (never the case in a session, which loses its
	// interactions all at once) is an error.
	_, err = store.InsertInteraction(ctx, pool, row("-5", []string{u3}, "a5", []int32{12}, []int32{13},
		store.Prefix{ID: c2.ID + 1_000_000_000, Messages: 1, Tokens: 1}))
	require.NoError(t, err)
	_, err = store.SessionInteractions(ctx, pool, "sx", dep)
	require.ErrorContains(t, err, "which is gone")
	_, err = store.InteractionByCompletion(ctx, pool, "sx", dep+"-5")
	require.ErrorContains(t, err, "which is gone")
}

func suffixMessage(role, content string) string {
	return `{"role":"` + role + `","content":"` + content + `"}`
}

// suffixRow is interaction dep+id of tenant sx's session dep, asking with
// msgs and answered reply, stored as the suffix p says.
func suffixRow(dep, id string, msgs []string, reply string, prompt, completion []int32, p store.Prefix) *store.NewInteraction {
	req := `{"model":"` + dep + `","max_tokens":9,"messages":[`
	for i, m := range msgs {
		if i > 0 {
			req += ","
		}
		req += m
	}
	req += `],"protocol":"openai"}`
	return &store.NewInteraction{TenantID: "sx", SessionID: dep, IdentityMode: "header", CompletionID: dep + id,
		Protocol: "openai", Deployment: dep, ModelVersion: dep, Request: json.RawMessage(req),
		Response:       json.RawMessage(`{"message":` + suffixMessage("assistant", reply) + `,"finish_reason":"stop"}`),
		PromptTokenIDs: prompt, CompletionTokenIDs: completion, Logprobs: make([]float32, len(completion)),
		FinishReason: "stop", Status: "ok", Prefix: p}
}
