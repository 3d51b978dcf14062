package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/store"
)

// A key's token budget is checked before each model call against its
// accounted usage in Postgres (usage_daily, which every replica's capture
// statement keeps), read at most once a second per key and process. So a
// key may overshoot its budget by what its calls in flight use, plus what
// it spends within that second on each replica; it is never answered past
// that.

const budgetReadEvery = time.Second

type budgetEntry struct {
	from time.Time // the period the figure is for
	used int64
	read time.Time
}

type budgets struct {
	mu sync.Mutex
	m  map[int64]budgetEntry
}

// used is the tokens key has used since from, read from db unless a figure
// for that period is fresher than budgetReadEvery.
func (b *budgets) used(ctx context.Context, db store.DBTX, key int64, from, now time.Time) (int64, error) {
	b.mu.Lock()
	e, ok := b.m[key]
	b.mu.Unlock()
	if ok && e.from.Equal(from) && now.Sub(e.read) < budgetReadEvery {
		return e.used, nil
	}
	n, err := store.TokensUsed(ctx, db, key, from)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil || len(b.m) > 100000 {
		b.m = map[int64]budgetEntry{} // crude bound; a figure is one query away
	}
	b.m[key] = budgetEntry{from: from, used: n, read: now}
	return n, nil
}

// checkBudget refuses a call of a key whose token budget is spent: 429
// with OpenAI's insufficient_quota, and Retry-After until it renews.
func (s *Server) checkBudget(ctx context.Context, p *principal) error {
	if p.TokenBudget <= 0 {
		return nil
	}
	now := time.Now()
	from, renews := store.BudgetWindow(p.BudgetPeriod, now)
	used, err := s.budgets.used(ctx, s.deps.DB, p.AccountTo(), from, now)
	if err != nil {
		return &apiError{Status: http.StatusServiceUnavailable, Message: "cannot check this API key's token budget now", RetryAfter: time.Second}
	}
	if used < p.TokenBudget {
		return nil
	}
	return &apiError{Status: http.StatusTooManyRequests, Code: "insufficient_quota", RetryAfter: renews.Sub(now),
		Message: fmt.Sprintf("token budget spent: this API key may use %d tokens per %s and has used %d; it renews at %s",
			p.TokenBudget, p.BudgetPeriod, used, renews.Format(time.RFC3339))}
}
