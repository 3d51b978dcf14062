package gateway

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTokenBucketChargesAfterAndRefills: a call is allowed while a token
// is left, its tokens are charged after it (overdrawing the bucket), and
// the bucket refills at its size a minute, never beyond it.
func TestTokenBucketChargesAfterAndRefills(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newTokenLimiter(3)
	ok, st, _ := l.check(7, 600, t0)
	require.True(t, ok)
	require.Equal(t, limitState{limit: 200, remaining: 200}, st, "a replica's share is the limit / replicas")

	l.charge(7, 600, 260, t0) // 60 over: 200 a minute pays it back in 18s, one more token in 0.3s
	ok, st, retry := l.check(7, 600, t0)
	require.False(t, ok)
	require.Equal(t, int64(0), st.remaining)
	require.Equal(t, 18300*time.Millisecond, retry)
	require.Equal(t, 78*time.Second, st.reset)
	ok, _, _ = l.check(8, 600, t0)
	require.True(t, ok, "buckets are per key")

	ok, st, _ = l.check(7, 600, t0.Add(retry))
	require.True(t, ok)
	require.Equal(t, int64(1), st.remaining)
	ok, st, _ = l.check(7, 600, t0.Add(time.Hour))
	require.True(t, ok)
	require.Equal(t, int64(200), st.remaining, "a bucket fills to its size, no more")
	require.Zero(t, st.reset)
}

// TestRequestLimiterReportsItsBucket: the requests bucket's state and how
// long a refused request waits.
func TestRequestLimiterReportsItsBucket(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newRequestLimiter(4, 4, 2) // 2 a second, bursting to 2, on this replica
	ok, off, st, _ := l.allow("k", t0)
	require.True(t, ok)
	require.False(t, off)
	require.Equal(t, limitState{limit: 2, remaining: 1, reset: 500 * time.Millisecond}, st)
	ok, _, _, _ = l.allow("k", t0)
	require.True(t, ok)
	ok, _, st, retry := l.allow("k", t0)
	require.False(t, ok)
	require.Equal(t, int64(0), st.remaining)
	require.Equal(t, 500*time.Millisecond, retry)
	_, off, _, _ = newRequestLimiter(0, 10, 1).allow("k", t0)
	require.True(t, off)
}
