package evolution

import (
	"slices"
	"sort"
	"strings"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/inference"
)

// The artefacts' stored form lives in package artefact, which store reads
// without importing this decision logic; these names stay for the
// callers of evolution. The layer names are artefact's alone
// (artefact.LayerPlaybook, …).
const (
	AllTenants     = artefact.AllTenants
	PlaybookHeader = artefact.PlaybookHeader
)

type (
	ArtefactSet  = artefact.Set
	Playbook     = artefact.Playbook
	PlaybookItem = artefact.PlaybookItem
	Harness      = artefact.Harness
	ToolSchema   = artefact.ToolSchema
	ToolOverride = artefact.ToolOverride
)

// InjectSystem is artefact.InjectSystem.
func InjectSystem(msgs []inference.Message, system string) []inference.Message {
	return artefact.InjectSystem(msgs, system)
}

// CuratePlaybook merges new lessons into a playbook deterministically:
// a tenant's items with the same normalised content merge (counts add up,
// sessions join), items that hurt more than they helped are dropped, and
// the rest are kept up to max per tenant, most helpful first (ties by id),
// so one tenant's lessons never crowd out another's. Items of no tenant
// are dropped: they were shown to no one.
func CuratePlaybook(old Playbook, add []PlaybookItem, max int) Playbook {
	byKey := map[string]*PlaybookItem{}
	var order []string
	for _, it := range append(append([]PlaybookItem(nil), old.Items...), add...) {
		norm := strings.Join(strings.Fields(strings.ToLower(it.Content)), " ")
		if norm == "" || it.Tenant == "" {
			continue
		}
		k := it.Tenant + "\x00" + norm
		if cur, ok := byKey[k]; ok {
			cur.Helpful += it.Helpful
			cur.Harmful += it.Harmful
			cur.Sessions = joinSessions(cur.Sessions, it.Sessions)
			continue
		}
		c := it
		c.Sessions = joinSessions(nil, it.Sessions)
		byKey[k] = &c
		order = append(order, k)
	}
	var items []PlaybookItem
	for _, k := range order {
		if it := byKey[k]; it.Harmful <= it.Helpful {
			items = append(items, *it)
		}
	}
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].Tenant != items[j].Tenant {
			return items[i].Tenant < items[j].Tenant
		}
		if items[i].Helpful-items[i].Harmful != items[j].Helpful-items[j].Harmful {
			return items[i].Helpful-items[i].Harmful > items[j].Helpful-items[j].Harmful
		}
		return items[i].ID < items[j].ID
	})
	if max > 0 {
		kept, per := items[:0], map[string]int{}
		for _, it := range items {
			if per[it.Tenant] < max {
				per[it.Tenant]++
				kept = append(kept, it)
			}
		}
		items = kept
	}
	return Playbook{Items: items}
}

// joinSessions is a ∪ b, sorted, without repeats.
func joinSessions(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	out := append(append([]string(nil), a...), b...)
	sort.Strings(out)
	return slices.Compact(out)
}
