package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/flywheel-ai/flywheel/statusapi"
)

// decisionsOf lists the deployment's latest evolution decisions, their
// evidence cut to what the tenant may see.
func decisionsOf(ctx context.Context, db DBTX, deployment, tenantID string, limit int) ([]statusapi.DecisionStatus, error) {
	rows, err := ListDecisions(ctx, db, deployment, limit)
	if err != nil {
		return nil, err
	}
	out := make([]statusapi.DecisionStatus, len(rows))
	for i, r := range rows {
		ev, theirs, err := scrubEvidence(r.Evidence, tenantID)
		if err != nil {
			return nil, fmt.Errorf("decision %d: %w", r.ID, err)
		}
		d := statusapi.DecisionStatus{ID: r.ID, Decision: r.Decision, Reason: r.Reason, Evidence: ev, CreatedAt: r.CreatedAt,
			Expected: r.Expected, Release: r.ReleaseStatus, Outcome: r.Outcome}
		if theirs {
			// Another tenant's change: what failed and what it did are
			// theirs.
			d.Reason, d.Expected, d.Outcome = "another tenant's sessions failed: its own "+r.Decision+" changes, for it alone", "", nil
		}
		out[i] = d
	}
	return out, nil
}

// scrubEvidence keeps, of a decision's evidence, what the tenant may see:
// the deployment's decisions are shown to every tenant that uses it, and
// tool failure clusters are one tenant's tool names and results. Other
// tenants' clusters (and clusters of no tenant, recorded before clusters
// were per tenant) go; theirs reports a decision about another tenant's
// tool, whose target goes too.
func scrubEvidence(raw json.RawMessage, tenantID string) (json.RawMessage, bool, error) {
	if len(raw) == 0 {
		return json.RawMessage(`{}`), false, nil
	}
	var ev map[string]any
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, false, fmt.Errorf("decode evidence: %w", err)
	}
	if tools, ok := ev["tool_failures"].([]any); ok {
		mine := []any{}
		for _, t := range tools {
			if m, ok := t.(map[string]any); ok && m["tenant"] == tenantID {
				mine = append(mine, m)
			}
		}
		ev["tool_failures"] = mine
	}
	if outcomes, ok := ev["tenant_outcomes"].([]any); ok {
		mine := []any{}
		for _, o := range outcomes {
			if m, ok := o.(map[string]any); ok && m["tenant"] == tenantID {
				mine = append(mine, m)
			}
		}
		ev["tenant_outcomes"] = mine
	}
	theirs := false
	if t, ok := ev["tenant"].(string); ok && t != tenantID {
		theirs = true
		delete(ev, "target")
		delete(ev, "tenant")
	}
	out, err := json.Marshal(ev)
	if err != nil {
		return nil, false, fmt.Errorf("encode evidence: %w", err)
	}
	return out, theirs, nil
}
