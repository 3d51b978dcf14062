package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/statusapi"
)

// UsageFilter selects usage to report.
type UsageFilter struct {
	// TenantID limits the report to one tenant; empty: every tenant.
	TenantID string
	// KeyID limits it to one tenant key; 0: every key.
	KeyID int64
	// Since and Until bound the UTC days, Until exclusive (zero: open).
	Since, Until time.Time
	// ByDay reports each day on its own row; otherwise the range is summed.
	ByDay bool
}

// UsageRow is what one tenant key spent on one deployment (on Day, when
// reported by day).
type UsageRow struct {
	TenantID         string `json:"tenant"`
	KeyID            int64  `json:"key_id"`
	KeyName          string `json:"key_name,omitempty"`
	KeyPrefix        string `json:"key_prefix,omitempty"`
	Deployment       string `json:"deployment"`
	Day              string `json:"day,omitempty"`
	Requests         int64  `json:"requests"`
	Errors           int64  `json:"errors"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
}

// Usage reports the accounted calls and tokens, largest first.
func Usage(ctx context.Context, db DBTX, f UsageFilter) ([]UsageRow, error) {
	day := `''`
	if f.ByDay {
		day = `to_char(u.day, 'YYYY-MM-DD')`
	}
	var since, until *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Until.IsZero() {
		until = &f.Until
	}
	rows, err := db.Query(ctx, `SELECT u.tenant_id, u.key_id, coalesce(k.name, ''), coalesce(k.prefix, ''), u.deployment, `+day+`,
			sum(u.requests)::bigint, sum(u.errors)::bigint, sum(u.prompt_tokens)::bigint, sum(u.completion_tokens)::bigint
		FROM usage_daily u LEFT JOIN api_keys k ON k.id = u.key_id
		WHERE ($1 = '' OR u.tenant_id = $1) AND ($2 = 0 OR u.key_id = $2)
		  AND ($3::date IS NULL OR u.day >= $3::date) AND ($4::date IS NULL OR u.day < $4::date)
		GROUP BY 1, 2, 3, 4, 5, 6
		ORDER BY 6, sum(u.prompt_tokens + u.completion_tokens) DESC, 1, 2, 5`,
		f.TenantID, f.KeyID, since, until)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UsageRow, error) {
		var u UsageRow
		err := r.Scan(&u.TenantID, &u.KeyID, &u.KeyName, &u.KeyPrefix, &u.Deployment, &u.Day,
			&u.Requests, &u.Errors, &u.PromptTokens, &u.CompletionTokens)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return out, nil
}

// TenantUsage is the tenant's usage from the UTC day of since on, in total
// and per deployment (only the one named, when one is): the status view's
// aggregate of what Usage reports per key.
func TenantUsage(ctx context.Context, db DBTX, tenantID, deployment string, since time.Time) (statusapi.Usage, error) {
	day := since.UTC().Format(time.DateOnly)
	u := statusapi.Usage{Since: day, Deployments: []statusapi.DeploymentUsage{}}
	rows, err := db.Query(ctx, `SELECT deployment, sum(requests)::bigint, sum(errors)::bigint,
			sum(prompt_tokens)::bigint, sum(completion_tokens)::bigint
		FROM usage_daily
		WHERE tenant_id = $1 AND ($2 = '' OR deployment = $2) AND day >= $3::date
		GROUP BY deployment
		ORDER BY sum(prompt_tokens + completion_tokens) DESC, deployment`, tenantID, deployment, day)
	if err != nil {
		return u, fmt.Errorf("usage of tenant %s: %w", tenantID, err)
	}
	deps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (statusapi.DeploymentUsage, error) {
		var d statusapi.DeploymentUsage
		err := r.Scan(&d.Deployment, &d.Requests, &d.Errors, &d.PromptTokens, &d.CompletionTokens)
		return d, err
	})
	if err != nil {
		return u, fmt.Errorf("usage of tenant %s: %w", tenantID, err)
	}
	for _, d := range deps {
		u.Requests += d.Requests
		u.Errors += d.Errors
		u.PromptTokens += d.PromptTokens
		u.CompletionTokens += d.CompletionTokens
	}
	u.Deployments = append(u.Deployments, deps...)
	return u, nil
}
