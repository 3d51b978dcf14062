package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// TestSuitePromptTemperature: a prompt may be sampled at a temperature in
// [0, 2]; it is stored with the prompt, and another temperature is
// another suite (its results were drawn otherwise).
func TestSuitePromptTemperature(t *testing.T) {
	for _, line := range []string{`{"prompt": "p", "expect": "x", "temperature": 2.5}`, `{"prompt": "p", "expect": "x", "temperature": -0.1}`} {
		_, err := store.SuitePrompts(store.SuiteRegression, []store.SuiteItem{suiteItem(t, line)})
		require.ErrorContains(t, err, "prompt 1: temperature", line)
		require.ErrorContains(t, err, "want 0..2", line)
	}

	ctx := context.Background()
	pool := testenv.Pool(t)
	items := []store.SuiteItem{suiteItem(t, `{"prompt": "p", "expect": "x", "temperature": 1}`), suiteItem(t, `{"prompt": "q", "expect": "y"}`)}
	prompts, err := store.SuitePrompts(store.SuiteRegression, items)
	require.NoError(t, err)
	_, err = store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	got, err := store.EvalSuite(ctx, pool, "dep", store.SuiteRegression)
	require.NoError(t, err)
	require.Equal(t, []float64{1, 0}, []float64{got[0].Temperature, got[1].Temperature}, "absent is greedy")

	changed, err := store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	require.False(t, changed)
	prompts[0].Temperature = 0.7
	changed, err = store.SetEvalSuite(ctx, pool, "dep", store.SuiteRegression, prompts)
	require.NoError(t, err)
	require.True(t, changed, "another temperature is another suite")
}
