package store_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

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
	require.Equal(t, "acme", owner.TenantID)
	require.Empty(t, owner.SessionID)
	require.Positive(t, owner.KeyID)
	require.Empty(t, owner.Models, "a key with no models may use every model")
	require.True(t, owner.ExpiresAt.IsZero())
	require.True(t, owner.Allows("any-model"))

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

func TestKeysExpireRevokeWithTheirSessionKeysAndRotate(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	require.NoError(t, store.EnsureTenant(ctx, pool, "acme"))

	// Model scopes and expiry.
	scoped, sk, err := store.IssueKey(ctx, pool, store.KeySpec{TenantID: "acme", Name: "scoped", Models: []string{"m1"},
		ExpiresAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	owner, err := store.LookupKey(ctx, pool, scoped)
	require.NoError(t, err)
	require.Equal(t, sk.ID, owner.KeyID)
	require.True(t, owner.Allows("m1"))
	require.False(t, owner.Allows("m2"))
	require.WithinDuration(t, time.Now().Add(time.Hour), owner.ExpiresAt, time.Minute)
	expired, ek, err := store.IssueKey(ctx, pool, store.KeySpec{TenantID: "acme", ExpiresAt: time.Now().Add(-time.Second)})
	require.NoError(t, err)
	_, err = store.LookupKey(ctx, pool, expired)
	require.ErrorIs(t, err, store.ErrNotFound, "an expired key no longer resolves")

	// Listing: live tenant keys by default, everything with All.
	tenantKey, tk, err := store.IssueKey(ctx, pool, store.KeySpec{TenantID: "acme", Name: "ci"})
	require.NoError(t, err)
	session, _, err := store.IssueKey(ctx, pool, store.KeySpec{TenantID: "acme", SessionID: "s1", ParentID: tk.ID})
	require.NoError(t, err)
	live, err := store.ListKeys(ctx, pool, store.KeyFilter{TenantID: "acme"})
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{sk.ID, tk.ID}, keyIDs(live))
	all, err := store.ListKeys(ctx, pool, store.KeyFilter{TenantID: "acme", All: true, Sessions: true})
	require.NoError(t, err)
	require.Len(t, all, 4)
	require.Contains(t, keyIDs(all), ek.ID)
	other, err := store.ListKeys(ctx, pool, store.KeyFilter{TenantID: "other"})
	require.NoError(t, err)
	require.Empty(t, other)

	// Rotation with grace: both work until the grace ends; the new key
	// keeps the old one's scope and names it.
	fresh, fk, err := store.RotateKey(ctx, pool, sk.ID, time.Hour)
	require.NoError(t, err)
	require.Equal(t, sk.ID, fk.RotatedFrom)
	require.Equal(t, []string{"m1"}, fk.Models)
	require.Equal(t, sk.ExpiresAt.Unix(), fk.ExpiresAt.Unix())
	_, err = store.LookupKey(ctx, pool, scoped)
	require.NoError(t, err, "the old key works during the grace")
	_, err = store.LookupKey(ctx, pool, fresh)
	require.NoError(t, err)
	// Rotation without grace revokes the old key at once.
	fresh2, _, err := store.RotateKey(ctx, pool, fk.ID, 0)
	require.NoError(t, err)
	_, err = store.LookupKey(ctx, pool, fresh)
	require.ErrorIs(t, err, store.ErrNotFound)
	_, err = store.LookupKey(ctx, pool, fresh2)
	require.NoError(t, err)
	_, _, err = store.RotateKey(ctx, pool, fk.ID, time.Hour)
	require.ErrorIs(t, err, store.ErrKeyNotLive, "a revoked key cannot rotate")
	_, _, err = store.RotateKey(ctx, pool, 1<<40, time.Hour)
	require.ErrorIs(t, err, store.ErrNotFound)

	// Revoking a tenant key revokes the session keys it issued.
	rk, err := store.RevokeKey(ctx, pool, tk.ID)
	require.NoError(t, err)
	require.NotNil(t, rk.RevokedAt)
	require.False(t, rk.Live(time.Now()))
	for _, k := range []string{tenantKey, session} {
		_, err = store.LookupKey(ctx, pool, k)
		require.ErrorIs(t, err, store.ErrNotFound)
	}
	again, err := store.RevokeKey(ctx, pool, tk.ID)
	require.NoError(t, err)
	require.Equal(t, rk.RevokedAt.UnixMicro(), again.RevokedAt.UnixMicro(), "revoking twice keeps the first time")
	_, err = store.RevokeKey(ctx, pool, 1<<40)
	require.ErrorIs(t, err, store.ErrNotFound)
}

func keyIDs(keys []store.Key) []int64 {
	out := make([]int64, len(keys))
	for i, k := range keys {
		out[i] = k.ID
	}
	return out
}

func TestKeyLabelsAreStoredBoundedAndRotated(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	require.NoError(t, store.EnsureTenant(ctx, pool, "acme"))
	_, plain, err := store.IssueKey(ctx, pool, store.KeySpec{TenantID: "acme", Name: "plain"})
	require.NoError(t, err)
	require.Equal(t, map[string]string{}, plain.Labels, "no labels is {}, not null")
	labels := map[string]string{"team": "search", "env": ""}
	_, k, err := store.IssueKey(ctx, pool, store.KeySpec{TenantID: "acme", Name: "labelled", Labels: labels})
	require.NoError(t, err)
	require.Equal(t, labels, k.Labels)
	_, rotated, err := store.RotateKey(ctx, pool, k.ID, 0)
	require.NoError(t, err)
	require.Equal(t, labels, rotated.Labels)
	got, err := store.GetKey(ctx, pool, rotated.ID)
	require.NoError(t, err)
	require.Equal(t, labels, got.Labels)

	_, _, err = store.IssueKey(ctx, pool, store.KeySpec{TenantID: "acme", Labels: map[string]string{"": "x"}})
	require.ErrorContains(t, err, "label key")
	_, err = pool.Exec(ctx, `UPDATE api_keys SET labels = '[]' WHERE id = $1`, k.ID)
	require.Error(t, err, "the column holds an object")
}

func TestKeyMetaBounds(t *testing.T) {
	many := map[string]string{}
	for i := range store.MaxKeyLabels {
		many[strings.Repeat("k", i+1)] = strings.Repeat("é", store.MaxKeyLabelValue)
	}
	require.NoError(t, store.ValidKeyMeta(strings.Repeat("n", store.MaxKeyName), many), "at the bounds, counted in characters")
	many["one-more"] = ""
	require.ErrorContains(t, store.ValidKeyMeta("", many), "at most 16 labels")
	for _, bad := range []map[string]string{
		{"": "x"}, {strings.Repeat("k", store.MaxKeyLabelKey+1): "x"}, {"k": strings.Repeat("v", store.MaxKeyLabelValue+1)},
		{"k\t": "x"}, {"k": "\x00"}, {"k": "\xff"},
	} {
		require.Error(t, store.ValidKeyMeta("", bad), "%q", bad)
	}
	require.Error(t, store.ValidKeyMeta(strings.Repeat("n", store.MaxKeyName+1), nil))
	require.Error(t, store.ValidKeyMeta("two\nlines", nil))
}
