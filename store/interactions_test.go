package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// TestInsertInteractionsBatch checks the one-statement batch: rows of one
// session numbered in batch order after what the session already holds,
// new sessions starting at 0 (another tenant's session of the same name is
// not this tenant's), rows for a closed session refused without failing
// the others, and each row's own token ids and logprobs
// (of different lengths, empty, or absent) sliced out of the batch's flat
// arrays.
func TestInsertInteractionsBatch(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	require.NoError(t, store.EnsureTenant(ctx, pool, "a"))
	require.NoError(t, store.EnsureTenant(ctx, pool, "b"))
	n := 0
	row := func(tenant, session string) *store.NewInteraction {
		n++
		prompt := make([]int32, n%3) // every third row's is empty
		for i := range prompt {
			prompt[i] = int32(100*n + i)
		}
		var logprobs []float32 // every other row has none (NULL)
		if n%2 == 0 {
			logprobs = []float32{-float32(n) / 8, -0.25}
		}
		return &store.NewInteraction{TenantID: tenant, SessionID: session, IdentityMode: "header",
			CompletionID: fmt.Sprintf("c-%d", n), Protocol: "openai", Deployment: "d", ModelVersion: "d",
			Request: json.RawMessage(`{"x":1}`), Response: json.RawMessage(`{"y":2}`),
			PromptTokenIDs: prompt, CompletionTokenIDs: []int32{int32(n)}, Logprobs: logprobs,
			PromptTokens: len(prompt), CompletionTokens: 1, FinishReason: "stop", Status: "ok"}
	}
	// "old" already has two steps; "ended" is closed; "theirs" is b's.
	for range 2 {
		_, err := store.InsertInteraction(ctx, pool, row("a", "old"))
		require.NoError(t, err)
	}
	_, err := store.InsertInteraction(ctx, pool, row("a", "ended"))
	require.NoError(t, err)
	_, err = store.EndSession(ctx, pool, "a", "ended")
	require.NoError(t, err)
	_, err = store.InsertInteraction(ctx, pool, row("b", "theirs"))
	require.NoError(t, err)

	rows := []*store.NewInteraction{row("a", "new"), row("a", "old"), row("a", "ended"), row("a", "new"),
		row("a", "theirs"), row("a", "old"), row("a", "new")}
	for _, r := range rows {
		r.KeyID = 7 // accounted apart from the single inserts (no key)
	}
	var got []store.Captured
	var errs []error
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		got, errs, err = store.InsertInteractions(ctx, tx, rows)
		return err
	}))
	wantSeq := []int{0, 2, -1, 1, 0, 3, 2}
	for i, want := range wantSeq {
		if want < 0 {
			require.ErrorIs(t, errs[i], store.ErrSessionClosed, "row %d", i)
			continue
		}
		require.NoError(t, errs[i], "row %d", i)
		require.Equal(t, want, got[i].Seq, "row %d", i)
		it, err := store.InteractionByCompletion(ctx, pool, "a", rows[i].CompletionID)
		require.NoError(t, err)
		require.Equal(t, got[i].ID, it.ID)
		require.Equal(t, rows[i].SessionID, it.SessionID)
		require.Equal(t, rows[i].PromptTokenIDs, it.PromptTokenIDs, "row %d", i)
		require.Equal(t, rows[i].CompletionTokenIDs, it.CompletionTokenIDs, "row %d", i)
		var promptEmpty, logprobsNull bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT prompt_token_ids = '{}', logprobs IS NULL FROM interactions WHERE id = $1`,
			it.ID).Scan(&promptEmpty, &logprobsNull))
		require.Equal(t, len(rows[i].PromptTokenIDs) == 0, promptEmpty, "row %d: an empty prompt is stored empty, not NULL", i)
		require.Equal(t, rows[i].Logprobs == nil, logprobsNull, "row %d", i)
		if rows[i].Logprobs != nil {
			require.Equal(t, rows[i].Logprobs, it.Logprobs, "row %d", i)
		}
	}
	// Usage counts exactly the accepted rows, in the same statement.
	var wantTokens int64
	for i, r := range rows {
		if errs[i] == nil {
			wantTokens += int64(r.PromptTokens + r.CompletionTokens)
		}
	}
	usage, err := store.Usage(ctx, pool, store.UsageFilter{TenantID: "a", KeyID: 7})
	require.NoError(t, err)
	require.Len(t, usage, 1)
	require.EqualValues(t, 6, usage[0].Requests)
	require.Equal(t, wantTokens, usage[0].PromptTokens+usage[0].CompletionTokens)
	single, err := store.Usage(ctx, pool, store.UsageFilter{TenantID: "a"})
	require.NoError(t, err)
	require.Len(t, single, 2, "key 7 and no key")

	// The counters moved by exactly the accepted rows: the next step of
	// each session follows the batch's.
	c, err := store.InsertInteraction(ctx, pool, row("a", "new"))
	require.NoError(t, err)
	require.Equal(t, 3, c.Seq)
	c, err = store.InsertInteraction(ctx, pool, row("a", "old"))
	require.NoError(t, err)
	require.Equal(t, 4, c.Seq)
}

// TestInsertInteractionsBatchSessionIDOfTwoTenants: session ids are each
// tenant's own names, so when two tenants send the same session id in one
// batch, each tenant's rows land in order in its own session of that name
// and never in the other's.
func TestInsertInteractionsBatchSessionIDOfTwoTenants(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	require.NoError(t, store.EnsureTenant(ctx, pool, "a"))
	require.NoError(t, store.EnsureTenant(ctx, pool, "b"))
	n := 0
	row := func(tenant, session string) *store.NewInteraction {
		n++
		return &store.NewInteraction{TenantID: tenant, SessionID: session, IdentityMode: "header",
			CompletionID: fmt.Sprintf("t-%d", n), Protocol: "openai", Deployment: "d", ModelVersion: "d",
			Request: json.RawMessage(`{}`), Status: "ok"}
	}
	_, err := store.InsertInteraction(ctx, pool, row("b", "b-owned"))
	require.NoError(t, err)
	// "b-owned" is b's already, and a's first use of the name starts a's
	// own session; both tenants start a "fresh".
	rows := []*store.NewInteraction{row("a", "b-owned"), row("b", "b-owned"), row("a", "fresh"),
		row("b", "fresh"), row("b", "b-owned"), row("a", "fresh")}
	got, errs, err := store.InsertInteractions(ctx, pool, rows)
	require.NoError(t, err)
	wantSeq := []int{0, 1, 0, 0, 2, 1}
	for i, want := range wantSeq {
		require.NoError(t, errs[i], "row %d", i)
		require.Equal(t, want, got[i].Seq, "row %d", i)
		it, err := store.InteractionByCompletion(ctx, pool, rows[i].TenantID, rows[i].CompletionID)
		require.NoError(t, err)
		require.Equal(t, rows[i].SessionID, it.SessionID)
		other := map[string]string{"a": "b", "b": "a"}[rows[i].TenantID]
		_, err = store.InteractionByCompletion(ctx, pool, other, rows[i].CompletionID)
		require.ErrorIs(t, err, store.ErrNotFound, "row %d is not the other tenant's", i)
	}
	for _, tenant := range []string{"a", "b"} {
		for _, session := range []string{"b-owned", "fresh"} {
			var steps int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM interactions WHERE tenant_id = $1 AND session_id = $2`,
				tenant, session).Scan(&steps))
			want := map[string]int{"a/b-owned": 1, "a/fresh": 2, "b/b-owned": 3, "b/fresh": 1}[tenant+"/"+session]
			require.Equal(t, want, steps, "%s's %s", tenant, session)
		}
	}
	// No response and no token arrays are stored as NULL, not as empty
	// values; an empty token list stays an empty array.
	empty := row("a", "fresh")
	empty.CompletionTokenIDs = []int32{}
	_, errs, err = store.InsertInteractions(ctx, pool, []*store.NewInteraction{empty})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	var nulls, emptyArray bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT response IS NULL AND prompt_token_ids IS NULL AND logprobs IS NULL,
		completion_token_ids = '{}' FROM interactions WHERE completion_id = $1`, empty.CompletionID).Scan(&nulls, &emptyArray))
	require.True(t, nulls)
	require.True(t, emptyArray)
}

// TestOutcomesOfTheBase checks that version "" reads a deployment's base
// model: the calls no trained version of it answered, whatever the engine
// named its model, so a first release's canary has a baseline.
func TestOutcomesOfTheBase(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	require.NoError(t, store.EnsureTenant(ctx, pool, "a"))
	add := func(dep, version string, n int) {
		for i := range n {
			_, err := store.InsertInteraction(ctx, pool, &store.NewInteraction{TenantID: "a", SessionID: fmt.Sprintf("%s-%s-%d", dep, version, i),
				IdentityMode: "header", CompletionID: fmt.Sprintf("%s-%s-%d", dep, version, i), Protocol: "openai", Deployment: dep,
				ModelVersion: version, Request: json.RawMessage(`{}`), Response: json.RawMessage(`{}`), Status: "ok"})
			require.NoError(t, err)
		}
	}
	add("first_dep", "fake/base-model", 3)
	add("first_dep", "first_dep@v1", 2)
	add("first_dep@", "first_dep@v1", 1) // another deployment
	base, _, err := store.OutcomeSeries(ctx, pool, "first_dep", "", nil, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 3, base.Interactions, "the base model's calls, under the engine's name")
	v1, _, err := store.OutcomeSeries(ctx, pool, "first_dep", "first_dep@v1", nil, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 2, v1.Interactions)
}
