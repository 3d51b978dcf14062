package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// outcomeSQL is the outcome of the session s (columns tenant_id and
// session_id): the mean of its session rewards, else of its step rewards;
// NULL while it has none.
const outcomeSQL = `COALESCE(
    (SELECT avg(r.value) FROM rewards r WHERE r.tenant_id = s.tenant_id AND r.session_id = s.session_id AND r.interaction_id IS NULL),
    (SELECT avg(r.value) FROM rewards r WHERE r.tenant_id = s.tenant_id AND r.session_id = s.session_id))`

// SessionEvidence is one rewarded session as the reflector reads it: what
// the user asked last, what the deployment answered last, the outcome and
// the feedback texts that explain it. Text is as stored; the caller
// redacts it before it leaves the control plane.
type SessionEvidence struct {
	Tenant, SessionID string
	Outcome           float64
	Prompt, Answer    string
	Feedback          []string
}

// ReflectionSessions lists up to limit consented, rewarded sessions of a
// deployment active in [from, to) (of one tenant unless tenant is ""):
// the failed ones (outcome below zero) first, newest first, then up to a
// third of limit successful ones, so the reflector sees what went right
// beside what went wrong.
func ReflectionSessions(ctx context.Context, db DBTX, deployment, tenant string, from, to time.Time, limit int) ([]SessionEvidence, error) {
	rows, err := db.Query(ctx, `
WITH sess AS (
    SELECT i.tenant_id, i.session_id, max(i.seq) AS last_seq, max(i.created_at) AS at
    FROM interactions i
    WHERE i.deployment = $1 AND i.created_at >= $2 AND i.created_at < $3 AND ($4 = '' OR i.tenant_id = $4)
      AND jsonb_typeof(i.request->'messages') = 'array' AND `+consentedSQL+`
    GROUP BY i.tenant_id, i.session_id
), scored AS (
    SELECT s.*, `+outcomeSQL+` AS outcome FROM sess s
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY outcome < 0 ORDER BY at DESC, session_id) AS n FROM scored WHERE outcome IS NOT NULL
)
SELECT k.tenant_id, k.session_id, k.outcome,
  COALESCE((SELECT m->>'content' FROM interactions p,
              jsonb_array_elements(CASE WHEN jsonb_typeof(p.request->'messages') = 'array' THEN p.request->'messages' END) WITH ORDINALITY AS x(m, n)
            WHERE p.tenant_id = k.tenant_id AND p.session_id = k.session_id AND m->>'role' = 'user' AND jsonb_typeof(m->'content') = 'string'
            ORDER BY p.seq DESC, n DESC LIMIT 1), ''),
  COALESCE((SELECT l.response->'message'->>'content' FROM interactions l
            WHERE l.tenant_id = k.tenant_id AND l.session_id = k.session_id AND l.seq = k.last_seq), ''),
  COALESCE((SELECT array_agg(r.feedback ORDER BY r.id) FROM rewards r
            WHERE r.tenant_id = k.tenant_id AND r.session_id = k.session_id AND r.feedback <> ''), '{}')
FROM ranked k
WHERE (k.outcome < 0 AND k.n <= $5) OR (k.outcome >= 0 AND k.n <= greatest($5 / 3, 1))
ORDER BY k.outcome < 0 DESC, k.at DESC, k.session_id
LIMIT $5`, deployment, from, to, tenant, limit)
	if err != nil {
		return nil, fmt.Errorf("reflection sessions of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SessionEvidence, error) {
		var e SessionEvidence
		err := r.Scan(&e.Tenant, &e.SessionID, &e.Outcome, &e.Prompt, &e.Answer, &e.Feedback)
		return e, err
	})
}

// PlaybookSession is a rewarded session that was served under playbook
// artefacts: the playbook versions its calls carried and its outcome.
type PlaybookSession struct {
	Tenant   string
	Versions []int
	Outcome  float64
}

var playbookVersion = regexp.MustCompile(`\+playbook:(\d+)`)

// PlaybookSessions lists up to limit rewarded sessions of a deployment,
// newest first, whose calls were served under a playbook, with the
// playbook versions each saw: the live outcomes that keep its items'
// helpful and harmful counts.
func PlaybookSessions(ctx context.Context, db DBTX, deployment string, limit int) ([]PlaybookSession, error) {
	rows, err := db.Query(ctx, `
WITH s AS (
    SELECT i.tenant_id, i.session_id, array_agg(DISTINCT i.request->>'artefacts') AS artefacts, max(i.created_at) AS at
    FROM interactions i
    WHERE i.deployment = $1 AND i.request->>'artefacts' LIKE '%+playbook:%'
    GROUP BY i.tenant_id, i.session_id
)
SELECT s.tenant_id, s.artefacts, o.outcome FROM s, LATERAL (SELECT `+outcomeSQL+` AS outcome) o
WHERE o.outcome IS NOT NULL
ORDER BY s.at DESC LIMIT $2`, deployment, limit)
	if err != nil {
		return nil, fmt.Errorf("playbook sessions of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (PlaybookSession, error) {
		var p PlaybookSession
		var suffixes []string
		if err := r.Scan(&p.Tenant, &suffixes, &p.Outcome); err != nil {
			return p, err
		}
		seen := map[int]bool{}
		for _, s := range suffixes {
			for _, m := range playbookVersion.FindAllStringSubmatch(s, -1) {
				if v, err := strconv.Atoi(m[1]); err == nil && !seen[v] {
					seen[v] = true
					p.Versions = append(p.Versions, v)
				}
			}
		}
		return p, nil
	})
}

// ErrBudget is returned when a reflection would exceed its tenant's daily
// budget.
var ErrBudget = errors.New("reflection budget exhausted")

// ReserveReflection reserves n tokens of tenant's reflection budget for
// the UTC day of at, if the day's spend stays within budget; ErrBudget
// otherwise. It returns what the day had spent before.
func ReserveReflection(ctx context.Context, db DBTX, tenant string, at time.Time, n, budget int) (int, error) {
	var after int
	err := db.QueryRow(ctx, `
INSERT INTO reflection_spend AS r (tenant_id, day, tokens) SELECT $1, $2::date, $3::bigint WHERE $3::bigint <= $4::bigint
ON CONFLICT (tenant_id, day) DO UPDATE SET tokens = r.tokens + excluded.tokens WHERE r.tokens + excluded.tokens <= $4::bigint
RETURNING tokens`, tenant, at.UTC().Format(time.DateOnly), n, budget).Scan(&after)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: tenant %q would spend %d more tokens on %s, beyond its daily %d", ErrBudget, tenant, n, at.UTC().Format(time.DateOnly), budget)
	}
	if err != nil {
		return 0, fmt.Errorf("reserve reflection tokens: %w", err)
	}
	return after - n, nil
}

// ReleaseReflection gives back n reserved tokens a reflection did not use.
func ReleaseReflection(ctx context.Context, db DBTX, tenant string, at time.Time, n int) error {
	if n <= 0 {
		return nil
	}
	_, err := db.Exec(ctx, `UPDATE reflection_spend SET tokens = greatest(tokens - $3, 0) WHERE tenant_id = $1 AND day = $2::date`,
		tenant, at.UTC().Format(time.DateOnly), n)
	if err != nil {
		return fmt.Errorf("release reflection tokens: %w", err)
	}
	return nil
}

// ReflectionSpent is what tenant's reflection spent on the UTC day of at.
func ReflectionSpent(ctx context.Context, db DBTX, tenant string, at time.Time) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT COALESCE((SELECT tokens FROM reflection_spend WHERE tenant_id = $1 AND day = $2::date), 0)`,
		tenant, at.UTC().Format(time.DateOnly)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reflection spend: %w", err)
	}
	return n, nil
}

// FailedToolCall is a call of a tool whose result reported an error: the
// interaction whose answer made the call (its request rebuilt whole),
// the arguments it passed and the error the tool returned.
type FailedToolCall struct {
	InteractionID int64
	SessionID     string
	Request       []byte
	Arguments     string
	Error         string
}

// FailedToolCalls lists up to limit failed calls of tool by tenant's
// consented sessions of a deployment in [from, to), newest first.
func FailedToolCalls(ctx context.Context, db DBTX, deployment, tenant, tool string, from, to time.Time, limit int) ([]FailedToolCall, error) {
	rows, err := db.Query(ctx, `
WITH results AS (
    SELECT DISTINCT ON (i.session_id, m->>'tool_call_id') i.session_id, m->>'tool_call_id' AS call_id, left(m->>'content', 500) AS content
    FROM interactions i, jsonb_array_elements(i.request->'messages') m
    WHERE i.deployment = $1 AND i.tenant_id = $2 AND i.created_at >= $3 AND i.created_at < $4
      AND jsonb_typeof(i.request->'messages') = 'array' AND m->>'role' = 'tool' AND m->>'content' `+toolFailedSQL+`
      AND `+consentedSQL+`
)
SELECT c.id, c.session_id, tc->>'arguments', r.content,
       c.request, COALESCE(c.response, 'null'::jsonb), coalesce(c.prefix_id, 0), c.prefix_messages, c.prefix_tokens
FROM results r
JOIN interactions c ON c.tenant_id = $2 AND c.session_id = r.session_id AND c.deployment = $1
CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(c.response->'message'->'tool_calls') = 'array'
                                             THEN c.response->'message'->'tool_calls' ELSE '[]'::jsonb END) tc
WHERE tc->>'id' = r.call_id AND tc->>'name' = $5
ORDER BY c.created_at DESC, c.id DESC LIMIT $6`, deployment, tenant, from, to, tool, limit)
	if err != nil {
		return nil, fmt.Errorf("failed calls of %s: %w", tool, err)
	}
	var turns []turn
	var responses [][]byte
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FailedToolCall, error) {
		var f FailedToolCall
		var resp []byte
		t := turn{prompt: new([]int32), completion: new([]int32)}
		err := r.Scan(&f.InteractionID, &f.SessionID, &f.Arguments, &f.Error, &f.Request, &resp, &t.prefix.ID, &t.prefix.Messages, &t.prefix.Tokens)
		turns, responses = append(turns, t), append(responses, resp)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("failed calls of %s: %w", tool, err)
	}
	for k := range out {
		turns[k].id, turns[k].request, turns[k].response = out[k].InteractionID, &out[k].Request, &responses[k]
	}
	if err := expand(ctx, db, turns); err != nil {
		return nil, fmt.Errorf("failed calls of %s: %w", tool, err)
	}
	return out, nil
}
