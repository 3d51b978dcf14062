package store_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

func TestKeysAreStoredHashedAndResolveToTheirTenant(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	require.NoError(t, store.EnsureTenant(ctx, pool, "acme"))
	require.NoError(t, store.EnsureTenant(ctx, pool, "acme"), "ensuring twice is fine")

	key, err := store.CreateKey(ctx, pool, "acme", "", "ci")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(key, store.KeyPrefix))
	require.Greater(t, len(key), 30)

	owner, err := store.LookupKey(ctx, pool, key)
	require.NoError(t, err)
	require.Equal(t, store.KeyOwner{TenantID: "acme"}, owner)

	_, err = store.LookupKey(ctx, pool, key+"x")
	require.ErrorIs(t, err, store.ErrNotFound)

	var stored []byte
	var prefix string
	require.NoError(t, pool.QueryRow(ctx, `SELECT key_hash, prefix FROM api_keys`).Scan(&stored, &prefix))
	require.False(t, bytes.Contains(stored, []byte(key[len(store.KeyPrefix):])), "plaintext must not be stored")
	require.Equal(t, store.HashKey(key), stored)
	require.True(t, strings.HasPrefix(key, prefix))

	_, err = pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now()`)
	require.NoError(t, err)
	_, err = store.LookupKey(ctx, pool, key)
	require.ErrorIs(t, err, store.ErrNotFound, "a revoked key no longer resolves")
}

func TestTenantNamesAreValidated(t *testing.T) {
	for _, bad := range []string{"", "Acme", "a b", "-x", strings.Repeat("a", 64), "x;drop"} {
		require.Error(t, store.ValidTenantName(bad), bad)
	}
	for _, good := range []string{"a", "acme", "acme-prod_2"} {
		require.NoError(t, store.ValidTenantName(good), good)
	}
}

func TestNewKeysDiffer(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		k, err := store.NewKey()
		require.NoError(t, err)
		require.False(t, seen[k])
		seen[k] = true
	}
}
