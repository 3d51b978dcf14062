package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrSessionClosed is returned when an interaction is captured for a
// session that is ended, forgotten, or owned by another tenant.
var ErrSessionClosed = errors.New("session is closed or unknown")

// NewInteraction is one captured model call, with the session it belongs
// to (created on first use in header, path and stitched modes).
type NewInteraction struct {
	TenantID     string
	SessionID    string
	IdentityMode string
	EndUser      string
	CompletionID string
	Protocol     string
	Stream       bool
	Deployment   string
	ModelVersion string
	// Request and Response are JSON documents.
	Request            json.RawMessage
	Response           json.RawMessage
	PromptTokenIDs     []int32
	CompletionTokenIDs []int32
	Logprobs           []float32
	PromptTokens       int
	CompletionTokens   int
	FinishReason       string
	Status             string
	Error              string
	LatencyMS          float64
	ContinuationHash   []byte
	RequestID          string
	// KeyID is the tenant key the call is accounted to (0: none).
	KeyID int64
	// Prefix, when set, stores the row as a suffix of an earlier row of
	// its session: Request's messages and PromptTokenIDs are only those
	// beyond it. Readers get the whole row back (expand).
	Prefix Prefix
}

// Prefix names the earlier interaction of the same session a row
// continues: the first Messages messages of its conversation (its request's
// messages, then its reply) and the first Tokens of its prompt then
// completion token ids are the start of this row's. ID 0: the row is whole.
type Prefix struct {
	ID       int64
	Messages int
	Tokens   int
}

// Captured is where a committed interaction landed.
type Captured struct {
	ID  int64
	Seq int
}

// insertInteractionSQL upserts the session (advancing its step counter
// under the row lock, so concurrent gateways agree on seq) and inserts the
// interaction in one statement. No row comes back when the session is no
// longer open. Session ids are the tenant's own: another tenant's session
// of the same name is a different row.
const insertInteractionSQL = `
WITH s AS (
	INSERT INTO sessions (id, tenant_id, deployment, end_user, identity_mode, next_seq)
	VALUES ($1, $2, $3, $4, $5, 1)
	ON CONFLICT (tenant_id, id) DO UPDATE SET next_seq = sessions.next_seq + 1, last_active_at = now(),
		deployment = CASE WHEN sessions.deployment = '' THEN EXCLUDED.deployment ELSE sessions.deployment END
	WHERE sessions.status = 'open'
	RETURNING next_seq - 1 AS seq
), i AS (
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, stream, deployment,
	model_version, request, response, prompt_token_ids, completion_token_ids, logprobs,
	prompt_tokens, completion_tokens, finish_reason, status, error, latency_ms,
	continuation_hash, request_id, key_id, prefix_id, prefix_messages, prefix_tokens)
SELECT $2, $1, s.seq, $6, $7, $8, $3, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, nullif($23, 0::bigint),
	nullif($24, 0::bigint), $25, $26
FROM s
RETURNING id, seq, tenant_id, key_id, deployment, status, prompt_tokens, completion_tokens
)
, u AS (
	INSERT INTO usage_daily AS u (tenant_id, day, key_id, deployment, requests, errors, prompt_tokens, completion_tokens)
	SELECT tenant_id, (now() AT TIME ZONE 'UTC')::date, coalesce(key_id, 0), deployment, count(*),
		count(*) FILTER (WHERE status <> 'ok'), sum(prompt_tokens), sum(completion_tokens)
	FROM i GROUP BY tenant_id, coalesce(key_id, 0), deployment
	ON CONFLICT (tenant_id, day, key_id, deployment) DO UPDATE SET requests = u.requests + EXCLUDED.requests,
		errors = u.errors + EXCLUDED.errors, prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
		completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens
)
SELECT id, seq FROM i`

func (n *NewInteraction) args() []any {
	var resp any
	if len(n.Response) > 0 {
		resp = n.Response
	}
	return []any{n.SessionID, n.TenantID, n.Deployment, n.EndUser, n.IdentityMode,
		n.CompletionID, n.Protocol, n.Stream, n.ModelVersion, n.Request, resp,
		n.PromptTokenIDs, n.CompletionTokenIDs, n.Logprobs, n.PromptTokens, n.CompletionTokens,
		n.FinishReason, n.Status, n.Error, n.LatencyMS, n.ContinuationHash, n.RequestID, n.KeyID,
		n.Prefix.ID, n.Prefix.Messages, n.Prefix.Tokens}
}

// Both insert statements also add the inserted rows to usage_daily (per
// tenant, key, deployment and UTC day): what is acknowledged is counted in
// the same commit, once; a refused row is neither stored nor counted.

// insertBatchSQL inserts a whole batch in one statement: it upserts each
// distinct (tenant, session) once ($1-$6), advancing its step counter by the number
// of its rows (under the row lock, so concurrent gateways agree on seq),
// and inserts the rows ($7-), each numbered back from the new counter by
// the offset the caller computed (its session's row count minus its place
// among them). Rows whose session is no longer open find no session row
// and are not inserted.
//
// Token ids and logprobs travel in binary, every row's concatenated into
// one flat array ($27-$29), and each row takes its slice by offset and
// length (length -1: NULL). Postgres cannot unnest ragged arrays, and as
// text literals their parsing (array_in) was a quarter of the statement's
// server CPU for 4-20 KB conversations. The empty string stands for NULL
// in the nullable response column: pgx encodes []string directly but
// nullable strings by reflection. The numbering is done by the caller
// rather than by window functions here: Postgres CPU per captured row is
// what bounds capture throughput.
const insertBatchSQL = `
WITH s AS (
	INSERT INTO sessions (id, tenant_id, deployment, end_user, identity_mode, next_seq)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[])
	ON CONFLICT (tenant_id, id) DO UPDATE SET next_seq = sessions.next_seq + EXCLUDED.next_seq, last_active_at = now(),
		deployment = CASE WHEN sessions.deployment = '' THEN EXCLUDED.deployment ELSE sessions.deployment END
	WHERE sessions.status = 'open'
	RETURNING id, tenant_id, next_seq
), i AS (
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, stream, deployment,
	model_version, request, response, prompt_token_ids, completion_token_ids, logprobs,
	prompt_tokens, completion_tokens, finish_reason, status, error, latency_ms,
	continuation_hash, request_id, key_id, prefix_id, prefix_messages, prefix_tokens)
SELECT s.tenant_id, s.id, s.next_seq - r.back, r.completion_id, r.protocol, r.stream, r.deployment, r.model_version,
	r.request::jsonb, nullif(r.response, '')::jsonb,
	CASE WHEN r.p_len >= 0 THEN ($27::int[])[r.p_off + 1 : r.p_off + r.p_len] END,
	CASE WHEN r.c_len >= 0 THEN ($28::int[])[r.c_off + 1 : r.c_off + r.c_len] END,
	CASE WHEN r.l_len >= 0 THEN ($29::real[])[r.l_off + 1 : r.l_off + r.l_len] END,
	r.prompt_tokens, r.completion_tokens, r.finish_reason, r.status, r.error, r.latency_ms, r.continuation_hash, r.request_id,
	nullif(r.key_id, 0), nullif(r.prefix_id, 0), r.prefix_messages, r.prefix_tokens
FROM unnest($7::text[], $8::int[], $9::text[], $10::text[], $11::bool[], $12::text[], $13::text[], $14::text[],
		$15::text[], $16::int[], $17::int[], $18::int[], $19::int[], $20::int[], $21::int[], $22::int[], $23::int[],
		$24::text[], $25::text[], $26::text[], $30::float8[], $31::bytea[], $32::text[], $33::text[], $34::bigint[],
		$35::bigint[], $36::int[], $37::int[])
	AS r(session_id, back, completion_id, protocol, stream, deployment, model_version, request, response,
		p_off, p_len, c_off, c_len, l_off, l_len, prompt_tokens, completion_tokens, finish_reason, status, error,
		latency_ms, continuation_hash, request_id, tenant_id, key_id, prefix_id, prefix_messages, prefix_tokens)
JOIN s ON s.tenant_id = r.tenant_id AND s.id = r.session_id
RETURNING completion_id, id, seq, tenant_id, key_id, deployment, status, prompt_tokens, completion_tokens
)
, u AS (
	INSERT INTO usage_daily AS u (tenant_id, day, key_id, deployment, requests, errors, prompt_tokens, completion_tokens)
	SELECT tenant_id, (now() AT TIME ZONE 'UTC')::date, coalesce(key_id, 0), deployment, count(*),
		count(*) FILTER (WHERE status <> 'ok'), sum(prompt_tokens), sum(completion_tokens)
	FROM i GROUP BY tenant_id, coalesce(key_id, 0), deployment
	ON CONFLICT (tenant_id, day, key_id, deployment) DO UPDATE SET requests = u.requests + EXCLUDED.requests,
		errors = u.errors + EXCLUDED.errors, prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
		completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens
)
SELECT completion_id, id, seq FROM i`

// flatSlices concatenates parts into one array and records each part's
// offset and length in it, -1 for a nil part (NULL).
type flatSlices[T any] struct {
	flat     []T
	off, len []int32
}

func (f *flatSlices[T]) add(xs []T) {
	if f.flat == nil {
		f.flat = []T{} // an empty array, not NULL, when every part is empty
	}
	f.off = append(f.off, int32(len(f.flat)))
	if xs == nil {
		f.len = append(f.len, -1)
		return
	}
	f.len = append(f.len, int32(len(xs)))
	f.flat = append(f.flat, xs...)
}

// InsertInteractions inserts rows in one statement, so the batch commits
// with one WAL flush. On a pool (autocommit) the statement is its own
// transaction and has committed when this returns without error. errs[i] is
// ErrSessionClosed for a row whose session refused it.
func InsertInteractions(ctx context.Context, db DBTX, rows []*NewInteraction) ([]Captured, []error, error) {
	if len(rows) == 1 {
		// The single-row statement starts up cheaper (no unnested arrays
		// to scan and join): about 60 µs less Postgres CPU per commit,
		// and at low load most commits hold one row.
		c, err := InsertInteraction(ctx, db, rows[0])
		if err != nil && !errors.Is(err, ErrSessionClosed) {
			return nil, nil, err
		}
		return []Captured{c}, []error{err}, nil
	}
	n := len(rows)
	// Sessions in first-seen order, each with its rows' count; a row's
	// offset back from the session's new counter is count - place.
	type sess struct{ first, count int }
	type key struct{ tenant, id string }
	sessions := make(map[key]*sess, n)
	order := make([]*sess, 0, n)
	place := make([]int, n)
	for i, r := range rows {
		e, ok := sessions[key{r.TenantID, r.SessionID}]
		if !ok {
			e = &sess{first: i}
			sessions[key{r.TenantID, r.SessionID}] = e
			order = append(order, e)
		}
		place[i] = e.count
		e.count++
	}
	m := len(order)
	var (
		sid, sTenant, sDep, sUser, sMode = make([]string, m), make([]string, m), make([]string, m), make([]string, m), make([]string, m)
		sCount                           = make([]int32, m)
	)
	for j, e := range order {
		r := rows[e.first]
		sid[j], sTenant[j], sDep[j], sUser[j], sMode[j], sCount[j] = r.SessionID, r.TenantID, r.Deployment, r.EndUser, r.IdentityMode, int32(e.count)
	}
	var (
		rSid, rTenant, cid, proto, dep, version, finish, status, errText, reqID = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		back, ptok, ctok                                                        = make([]int32, 0, n), make([]int32, 0, n), make([]int32, 0, n)
		stream                                                                  = make([]bool, 0, n)
		req, resp                                                               = make([]string, 0, n), make([]string, 0, n)
		pids, cids                                                              flatSlices[int32]
		lps                                                                     flatSlices[float32]
		lat                                                                     = make([]float64, 0, n)
		hash                                                                    = make([][]byte, 0, n)
		keyID, prefixID                                                         = make([]int64, 0, n), make([]int64, 0, n)
		prefixMsgs, prefixToks                                                  = make([]int32, 0, n), make([]int32, 0, n)
	)
	index := make(map[string]int, n)
	for i, r := range rows {
		rSid, rTenant, cid, proto, dep, version = append(rSid, r.SessionID), append(rTenant, r.TenantID), append(cid, r.CompletionID), append(proto, r.Protocol), append(dep, r.Deployment), append(version, r.ModelVersion)
		finish, status, errText, reqID = append(finish, r.FinishReason), append(status, r.Status), append(errText, r.Error), append(reqID, r.RequestID)
		back = append(back, int32(sessions[key{r.TenantID, r.SessionID}].count-place[i]))
		ptok, ctok, stream, lat, hash = append(ptok, int32(r.PromptTokens)), append(ctok, int32(r.CompletionTokens)), append(stream, r.Stream), append(lat, r.LatencyMS), append(hash, r.ContinuationHash)
		req, resp, keyID = append(req, string(r.Request)), append(resp, string(r.Response)), append(keyID, r.KeyID)
		prefixID, prefixMsgs, prefixToks = append(prefixID, r.Prefix.ID), append(prefixMsgs, int32(r.Prefix.Messages)), append(prefixToks, int32(r.Prefix.Tokens))
		pids.add(r.PromptTokenIDs)
		cids.add(r.CompletionTokenIDs)
		lps.add(r.Logprobs)
		index[r.CompletionID] = i
	}
	res, err := db.Query(ctx, insertBatchSQL, sid, sTenant, sDep, sUser, sMode, sCount,
		rSid, back, cid, proto, stream, dep, version, req, resp, pids.off, pids.len, cids.off, cids.len, lps.off, lps.len,
		ptok, ctok, finish, status, errText, pids.flat, cids.flat, lps.flat, lat, hash, reqID, rTenant, keyID,
		prefixID, prefixMsgs, prefixToks)
	if err != nil {
		return nil, nil, fmt.Errorf("insert interactions: %w", err)
	}
	defer res.Close()
	out := make([]Captured, n)
	errs := make([]error, n)
	got := make([]bool, n)
	for res.Next() {
		var c string
		var cap Captured
		if err := res.Scan(&c, &cap.ID, &cap.Seq); err != nil {
			return nil, nil, fmt.Errorf("insert interactions: %w", err)
		}
		if i, ok := index[c]; ok {
			out[i], got[i] = cap, true
		}
	}
	if err := res.Err(); err != nil {
		return nil, nil, fmt.Errorf("insert interactions: %w", err)
	}
	for i := range rows {
		if !got[i] {
			errs[i] = ErrSessionClosed
		}
	}
	return out, errs, nil
}

// InsertInteraction inserts one row on its own (autocommit on a pool): the
// per-row baseline the capture benchmark compares group commit against.
func InsertInteraction(ctx context.Context, db DBTX, r *NewInteraction) (Captured, error) {
	var c Captured
	err := db.QueryRow(ctx, insertInteractionSQL, r.args()...).Scan(&c.ID, &c.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, ErrSessionClosed
	}
	if err != nil {
		return c, fmt.Errorf("insert interaction: %w", err)
	}
	return c, nil
}

// Interaction is a stored model call.
type Interaction struct {
	ID                 int64
	SessionID          string
	Seq                int
	CompletionID       string
	Protocol           string
	Stream             bool
	Deployment         string
	ModelVersion       string
	Request            json.RawMessage
	Response           json.RawMessage
	PromptTokenIDs     []int32
	CompletionTokenIDs []int32
	Logprobs           []float32
	PromptTokens       int
	CompletionTokens   int
	FinishReason       string
	Status             string
	Error              string
	LatencyMS          float64
	RequestID          string
	CreatedAt          time.Time
}

const interactionColumns = `id, session_id, seq, completion_id, protocol, stream, deployment, model_version,
	request, coalesce(response, 'null'::jsonb), coalesce(prompt_token_ids, '{}'), coalesce(completion_token_ids, '{}'),
	coalesce(logprobs, '{}'), prompt_tokens, completion_tokens, finish_reason, status, error, latency_ms, request_id, created_at,
	coalesce(prefix_id, 0), prefix_messages, prefix_tokens`

// scanInteraction reads a row of interactionColumns and rebuilds it whole.
func scanInteraction(ctx context.Context, db DBTX, row pgx.Row) (*Interaction, error) {
	var it Interaction
	var p Prefix
	err := row.Scan(&it.ID, &it.SessionID, &it.Seq, &it.CompletionID, &it.Protocol, &it.Stream, &it.Deployment,
		&it.ModelVersion, &it.Request, &it.Response, &it.PromptTokenIDs, &it.CompletionTokenIDs, &it.Logprobs,
		&it.PromptTokens, &it.CompletionTokens, &it.FinishReason, &it.Status, &it.Error, &it.LatencyMS,
		&it.RequestID, &it.CreatedAt, &p.ID, &p.Messages, &p.Tokens)
	if err == nil {
		err = expand(ctx, db, []turn{{id: it.ID, prefix: p, request: (*[]byte)(&it.Request), response: (*[]byte)(&it.Response),
			prompt: &it.PromptTokenIDs, completion: &it.CompletionTokenIDs}})
	}
	if err != nil {
		return nil, err
	}
	return &it, nil
}

// Continuation is the latest interaction whose conversation a new request
// extends.
type Continuation struct {
	SessionID     string
	InteractionID int64
	// Hash is which of the candidate hashes matched.
	Hash       []byte
	Deployment string
	// InjectedSystem is the system text the gateway injected into that
	// call (the stored request's injected_system).
	InjectedSystem string
}

// FindContinuation finds, among hashes (candidate conversation prefixes of
// a request, longest first), the longest one a committed interaction of
// the tenant ended with, in an open session. ErrNotFound when none.
func FindContinuation(ctx context.Context, db DBTX, tenantID string, hashes [][]byte) (*Continuation, error) {
	if len(hashes) == 0 {
		return nil, ErrNotFound
	}
	var c Continuation
	err := db.QueryRow(ctx, `
		SELECT i.session_id, i.id, i.continuation_hash, i.deployment, coalesce(i.request->>'injected_system', '')
		FROM unnest($2::bytea[]) WITH ORDINALITY AS h(hash, ord)
		JOIN interactions i ON i.tenant_id = $1 AND i.continuation_hash = h.hash
		JOIN sessions s ON s.tenant_id = i.tenant_id AND s.id = i.session_id AND s.status = 'open'
		WHERE i.status = 'ok'
		ORDER BY h.ord, i.id DESC
		LIMIT 1`, tenantID, hashes).Scan(&c.SessionID, &c.InteractionID, &c.Hash,
		&c.Deployment, &c.InjectedSystem)
	if err != nil {
		return nil, notFound(err)
	}
	return &c, nil
}

// InteractionByCompletion finds the tenant's interaction by the id the
// client saw.
func InteractionByCompletion(ctx context.Context, db DBTX, tenantID, completionID string) (*Interaction, error) {
	it, err := scanInteraction(ctx, db, db.QueryRow(ctx, `SELECT `+interactionColumns+` FROM interactions
		WHERE tenant_id = $1 AND completion_id = $2`, tenantID, completionID))
	if err != nil {
		return nil, notFound(err)
	}
	return it, nil
}

// CountInteractions counts a tenant's interactions (tests and benchmarks).
func CountInteractions(ctx context.Context, db DBTX, tenantID string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM interactions WHERE tenant_id = $1`, tenantID).Scan(&n)
	return n, err
}
