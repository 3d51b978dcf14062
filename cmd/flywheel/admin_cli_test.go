package main

import (
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// stdout runs f and returns what it printed to os.Stdout.
func stdout(t *testing.T, f func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	ferr := f()
	os.Stdout = saved
	require.NoError(t, w.Close())
	return <-done, ferr
}

// cliDatabase is a fresh migrated database and the flag that names it.
func cliDatabase(t *testing.T) (*pgxpool.Pool, []string) {
	t.Helper()
	url := testenv.DatabaseURL(t, true)
	pool, err := store.Open(context.Background(), url, 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, []string{"--database-url", url}
}

// TestKeysCLI: create a scoped, expiring key, list it, rotate it with a
// grace, revoke it; every step is what the store then says.
func TestKeysCLI(t *testing.T) {
	ctx := context.Background()
	pool, db := cliDatabase(t)

	out, err := stdout(t, func() error {
		return run(ctx, append([]string{"keys", "create", "--tenant", "acme", "--name", "ci", "--label", "team=search", "--label", "env=",
			"--models", "m1, m2", "--expires", "720h", "--tpm", "5000"}, db...))
	})
	require.NoError(t, err)
	key := strings.TrimSpace(out)
	owner, err := store.LookupKey(ctx, pool, key)
	require.NoError(t, err)
	require.Equal(t, []string{"m1", "m2"}, owner.Models)
	require.False(t, owner.ExpiresAt.IsZero())
	require.NotNil(t, owner.TPM)
	require.Equal(t, int64(5000), *owner.TPM)
	id := strconv.FormatInt(owner.KeyID, 10)

	out, err = stdout(t, func() error { return run(ctx, append([]string{"usage", "--tenant", "acme", "--by-day"}, db...)) })
	require.NoError(t, err)
	require.Contains(t, out, "PROMPT TOKENS", "no calls yet: the header only")
	_, err = stdout(t, func() error { return run(ctx, append([]string{"usage", "--since", "yesterday"}, db...)) })
	require.Error(t, err)

	out, err = stdout(t, func() error { return run(ctx, append([]string{"keys", "list", "--tenant", "acme"}, db...)) })
	require.NoError(t, err)
	require.Contains(t, out, "m1,m2")
	require.Contains(t, out, "TPM")
	require.Contains(t, out, "5000")
	require.Contains(t, out, "env=,team=search", "labels are listed, sorted")
	require.Contains(t, out, key[:len(store.KeyPrefix)+6])
	require.NotContains(t, out, key[len(store.KeyPrefix):], "never the secret")

	// The flag after the id is parsed.
	out, err = stdout(t, func() error { return run(ctx, append([]string{"keys", "rotate", id, "--grace", "1h"}, db...)) })
	require.NoError(t, err)
	fresh := strings.TrimSpace(out)
	_, err = store.LookupKey(ctx, pool, key)
	require.NoError(t, err, "the old key lives through the grace")
	fo, err := store.LookupKey(ctx, pool, fresh)
	require.NoError(t, err)
	require.Equal(t, owner.Models, fo.Models)
	require.Equal(t, owner.TPM, fo.TPM, "a rotated key keeps its limits")
	rotated, err := store.GetKey(ctx, pool, fo.KeyID)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"team": "search", "env": ""}, rotated.Labels, "and its labels")

	_, err = stdout(t, func() error {
		return run(ctx, append([]string{"keys", "revoke", strconv.FormatInt(fo.KeyID, 10)}, db...))
	})
	require.NoError(t, err)
	_, err = store.LookupKey(ctx, pool, fresh)
	require.ErrorIs(t, err, store.ErrNotFound)

	for _, bad := range [][]string{
		{"keys", "create"},
		{"keys", "create", "--tenant", "acme", "--tpm", "-1"},
		{"keys", "create", "--tenant", "acme", "--tpm", "many"},
		{"keys", "create", "--tenant", "acme", "--label", "team"},
		{"keys", "create", "--tenant", "acme", "--label", "=x"},
		{"keys", "create", "--tenant", "acme", "--label", "a=1", "--label", "a=2"},
		{"keys", "create", "--tenant", "acme", "--label", strings.Repeat("k", 65) + "=x"},
		{"keys", "create", "--tenant", "acme", "--name", strings.Repeat("n", 129)},
		{"keys", "revoke"},
		{"keys", "revoke", "x"},
		{"keys", "revoke", "999999999"},
		{"keys", "rotate", strconv.FormatInt(fo.KeyID, 10)},
	} {
		_, err := stdout(t, func() error { return run(ctx, append(bad, db...)) })
		require.Error(t, err, bad)
	}
}

// TestDeploymentsCLI: create, show, list and update an upstream
// deployment; bad input is refused before anything is stored.
func TestDeploymentsCLI(t *testing.T) {
	ctx := context.Background()
	pool, db := cliDatabase(t)

	_, err := stdout(t, func() error {
		return run(ctx, append([]string{"deployments", "create", "qwen", "--base-url", "http://vllm:8000/v1", "--model", "Qwen/Qwen3-8B",
			"--timeout", "30s", "--retries", "2", "--fallbacks", "Qwen/Qwen3-4B", "--base-model", "Qwen/Qwen3-8B",
			"--gates", `{"allow_unevaluated": true, "max_reward_drop": 0.02}`}, db...))
	})
	require.NoError(t, err)
	_, err = stdout(t, func() error {
		return run(ctx, append([]string{"deployments", "create", "bad", "--base-url", "http://vllm:8000/v1", "--gates", `{"max_reward_dorp": 0.02}`}, db...))
	})
	require.ErrorContains(t, err, "max_reward_dorp", "a misspelt threshold is refused, not ignored")
	d, err := store.GetDeployment(ctx, pool, "qwen")
	require.NoError(t, err)
	require.Equal(t, deployment.BackendUpstream, d.Backend)
	c, err := deployment.Parse(d.Config)
	require.NoError(t, err)
	require.Equal(t, "Qwen/Qwen3-8B", c.Model)
	require.Equal(t, "30s", c.Timeout)
	require.Equal(t, 2, *c.Retries)
	require.Equal(t, []string{"Qwen/Qwen3-4B"}, c.Fallbacks)
	require.Nil(t, c.VLLM, "vLLM's extensions are the default")
	require.Equal(t, "Qwen/Qwen3-8B", c.ModelTokenizer(), "the tokenizer is the base model's own")
	gates, err := deployment.DefaultReleasePolicy().WithGates(c.Gates)
	require.NoError(t, err)
	require.True(t, gates.AllowUnevaluated)
	require.Equal(t, 0.02, gates.MaxRewardDrop)

	out, err := stdout(t, func() error { return run(ctx, append([]string{"deployments", "list"}, db...)) })
	require.NoError(t, err)
	require.Contains(t, out, "http://vllm:8000/v1 (Qwen/Qwen3-8B)")
	out, err = stdout(t, func() error { return run(ctx, append([]string{"deployments", "show", "qwen"}, db...)) })
	require.NoError(t, err)
	require.Contains(t, out, `"backend": "upstream"`)

	_, err = stdout(t, func() error {
		return run(ctx, append([]string{"deployments", "update", "qwen", "--base-url", "http://sglang:30000/v1", "--vllm=false", "--weight-sync", "sglang_disk"}, db...))
	})
	require.NoError(t, err)
	d, err = store.GetDeployment(ctx, pool, "qwen")
	require.NoError(t, err)
	c, err = deployment.Parse(d.Config)
	require.NoError(t, err)
	require.Equal(t, "http://sglang:30000/v1", c.BaseURL)
	require.False(t, *c.VLLM)
	require.Empty(t, c.Model, "update replaces the whole config")
	require.Equal(t, "sglang_disk", c.WeightSync.Kind)
	require.False(t, c.VersionsByName(), "full weights serve in place")
	require.Equal(t, deployment.DialectOpenAI, c.ServerDialect(), "--vllm=false is the plain OpenAI dialect")

	_, err = stdout(t, func() error {
		return run(ctx, append([]string{"deployments", "update", "qwen", "--base-url", "http://sglang:30000/v1", "--dialect", "sglang", "--weight-sync", "sglang_disk"}, db...))
	})
	require.NoError(t, err)
	d, err = store.GetDeployment(ctx, pool, "qwen")
	require.NoError(t, err)
	c, err = deployment.Parse(d.Config)
	require.NoError(t, err)
	require.Equal(t, deployment.DialectSGLang, c.Dialect)
	require.Nil(t, c.VLLM)

	_, err = stdout(t, func() error {
		return run(ctx, append([]string{"deployments", "update", "qwen", "--base-url", "https://api.openai.com/v1", "--dialect", "openai", "--responses"}, db...))
	})
	require.NoError(t, err)
	d, err = store.GetDeployment(ctx, pool, "qwen")
	require.NoError(t, err)
	c, err = deployment.Parse(d.Config)
	require.NoError(t, err)
	require.True(t, c.Responses, "--responses: the server speaks the Responses API")

	for _, bad := range [][]string{
		{"deployments", "create", "qwen", "--base-url", "http://x/v1"},
		{"deployments", "create", "other", "--base-url", "http://x/v1", "--dialect", "tgi"},
		{"deployments", "create", "other", "--base-url", "http://x/v1", "--responses"},
		{"deployments", "create", "other"},
		{"deployments", "create", "other", "--base-url", "nowhere"},
		{"deployments", "create", "other", "--base-url", "http://x/v1", "--weight-sync", "nccl"},
		{"deployments", "create", "a@b", "--base-url", "http://x/v1"},
		{"deployments", "update", "missing", "--base-url", "http://x/v1"},
		{"deployments", "show", "missing"},
		{"deployments", "show"},
	} {
		_, err := stdout(t, func() error { return run(ctx, append(bad, db...)) })
		require.Error(t, err, bad)
	}
	ds, err := store.ListDeployments(ctx, pool)
	require.NoError(t, err)
	require.Len(t, ds, 1, "nothing else was stored")
}
