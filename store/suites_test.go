package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

func TestSuiteResultsKeepAnyAnswer(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	prompts, err := store.SuitePrompts(store.SuiteRegression, []store.SuiteItem{{Prompt: "a", Expect: "b"}, {Prompt: "c", Expect: "d"}})
	require.NoError(t, err)
	_, err = store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	prompts, err = store.EvalSuite(ctx, pool, "dep", store.SuiteRegression)
	require.NoError(t, err)
	require.Len(t, prompts, 2)
	// A byte-level policy answers invalid UTF-8 and NULs; Postgres text
	// takes neither, and a lost result would stall the gate.
	err = store.RecordSuiteResults(ctx, pool, "dep@v1", []store.SuiteResult{
		{PromptID: prompts[0].ID, Passed: true, Answer: "ok\xf2\xa2\x00"},
		{PromptID: prompts[1].ID, Passed: false, Answer: string(make([]byte, 1000))},
		{PromptID: 1 << 40, Passed: true}, // no such prompt (a suite replaced meanwhile): skipped
	})
	require.NoError(t, err)
	got, err := store.SuiteResults(ctx, pool, "dep@v1", prompts)
	require.NoError(t, err)
	require.Equal(t, map[int64]bool{prompts[0].ID: true, prompts[1].ID: false}, got)

	// Replacing the suite drops its results; the same prompts keep them.
	changed, err := store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	require.False(t, changed)
	got, err = store.SuiteResults(ctx, pool, "dep@v1", prompts)
	require.NoError(t, err)
	require.Len(t, got, 2)
	other, err := store.SuitePrompts(store.SuiteRegression, []store.SuiteItem{{Prompt: "e", Expect: "f"}})
	require.NoError(t, err)
	changed, err = store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, other)
	require.NoError(t, err)
	require.True(t, changed)
	got, err = store.SuiteResults(ctx, pool, "dep@v1", prompts)
	require.NoError(t, err)
	require.Empty(t, got)
}
