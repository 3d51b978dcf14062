package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// MaxResponseChain bounds how many responses one previous_response_id may
// chain: past it, the conversation is refused rather than read whole.
const MaxResponseChain = 10000

// StoredResponse is one Responses API response as kept for GET and
// chaining.
type StoredResponse struct {
	TenantID, ID, SessionID string
	// PreviousID is the response this one continued ("" for none).
	PreviousID string
	// Input is this request's input items (not the chain's); Body is the
	// response object answered.
	Input, Body json.RawMessage
}

// InsertResponse keeps a response.
func InsertResponse(ctx context.Context, db DBTX, r StoredResponse) error {
	var prev *string
	if r.PreviousID != "" {
		prev = &r.PreviousID
	}
	if _, err := db.Exec(ctx, `INSERT INTO responses (tenant_id, id, session_id, previous_id, input, body)
		VALUES ($1, $2, $3, $4, $5, $6)`, r.TenantID, r.ID, r.SessionID, prev, r.Input, r.Body); err != nil {
		return fmt.Errorf("insert response %s: %w", r.ID, err)
	}
	return nil
}

// ResponseBody is a tenant's stored response object and its session;
// ErrNotFound when the tenant has none by that id.
func ResponseBody(ctx context.Context, db DBTX, tenantID, id string) (json.RawMessage, string, error) {
	var body json.RawMessage
	var session string
	if err := db.QueryRow(ctx, `SELECT body, session_id FROM responses WHERE tenant_id = $1 AND id = $2`, tenantID, id).Scan(&body, &session); err != nil {
		return nil, "", notFound(err)
	}
	return body, session, nil
}

// DeleteResponse deletes a tenant's stored response (the interaction it
// captured stays, as the session's record). Responses that continued it
// keep their own turns but can no longer be chained past it.
func DeleteResponse(ctx context.Context, db DBTX, tenantID, id string) error {
	ct, err := db.Exec(ctx, `DELETE FROM responses WHERE tenant_id = $1 AND id = $2`, tenantID, id)
	if err != nil {
		return fmt.Errorf("delete response %s: %w", id, err)
	}
	if ct.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// ChainLink is one response of a chain: its request's input items and its
// output items.
type ChainLink struct {
	Input, Output json.RawMessage
}

// ResponseChain is the conversation that a tenant's response ends, from
// the chain's first response to it, and the session it belongs to.
// ErrNotFound when the tenant has no such response, or a response of the
// chain was deleted.
func ResponseChain(ctx context.Context, db DBTX, tenantID, id string) (string, []ChainLink, error) {
	rows, err := db.Query(ctx, `
WITH RECURSIVE chain(id, previous_id, depth) AS (
    SELECT id, previous_id, 0 FROM responses WHERE tenant_id = $1 AND id = $2
    UNION ALL
    SELECT r.id, r.previous_id, c.depth + 1 FROM responses r JOIN chain c ON r.tenant_id = $1 AND r.id = c.previous_id
    WHERE c.depth < $3
)
SELECT c.previous_id, r.session_id, r.input, coalesce(r.body->'output', '[]'::jsonb)
FROM chain c JOIN responses r ON r.tenant_id = $1 AND r.id = c.id ORDER BY c.depth DESC`, tenantID, id, MaxResponseChain)
	if err != nil {
		return "", nil, fmt.Errorf("read response chain of %s: %w", id, err)
	}
	defer rows.Close()
	var (
		session string
		links   []ChainLink
		broken  bool
	)
	for rows.Next() {
		var prev *string
		var l ChainLink
		if err := rows.Scan(&prev, &session, &l.Input, &l.Output); err != nil {
			return "", nil, fmt.Errorf("read response chain of %s: %w", id, err)
		}
		if len(links) == 0 && prev != nil {
			// The chain's first row still names a predecessor: that one
			// was deleted, or the chain is longer than the bound.
			broken = true
		}
		links = append(links, l)
	}
	if err := rows.Err(); err != nil {
		return "", nil, fmt.Errorf("read response chain of %s: %w", id, err)
	}
	if len(links) == 0 || broken {
		return "", nil, ErrNotFound
	}
	return session, links, nil
}
