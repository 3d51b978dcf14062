package evolution

import (
	"slices"
	"sort"
	"strings"

	"github.com/flywheel-ai/flywheel/artefact"
)

// CuratePlaybook merges new lessons into a playbook deterministically:
// a tenant's items with the same normalised content merge (counts add up,
// sessions join), harmful items (Harmful) are dropped, and
// the rest are kept up to max per tenant, most helpful first (ties by id),
// so one tenant's lessons never crowd out another's. Items of no tenant
// are dropped: they were shown to no one.
func CuratePlaybook(old artefact.Playbook, add []artefact.PlaybookItem, max int) artefact.Playbook {
	byKey := map[string]*artefact.PlaybookItem{}
	var order []string
	for _, it := range append(append([]artefact.PlaybookItem(nil), old.Items...), add...) {
		norm := strings.Join(strings.Fields(strings.ToLower(it.Content)), " ")
		if norm == "" || it.Tenant == "" {
			continue
		}
		k := it.Tenant + "\x00" + norm
		if cur, ok := byKey[k]; ok {
			cur.Helpful += it.Helpful
			cur.Harmful += it.Harmful
			cur.Sessions = JoinSessions(cur.Sessions, it.Sessions)
			continue
		}
		c := it
		c.Sessions = JoinSessions(nil, it.Sessions)
		byKey[k] = &c
		order = append(order, k)
	}
	var items []artefact.PlaybookItem
	for _, k := range order {
		if it := byKey[k]; !Harmful(*it) {
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
	return artefact.Playbook{Items: items}
}

// MinHarmful is how many rewarded sessions that saw an item must have
// failed before the item can retire as harmful: one bad session says
// little about a lesson.
const MinHarmful = 3

// Harmful reports whether an item retires: at least MinHarmful sessions
// that saw it failed, and more failed than succeeded.
func Harmful(it artefact.PlaybookItem) bool {
	return it.Harmful >= MinHarmful && it.Harmful > it.Helpful
}

// JoinSessions is a ∪ b, sorted, without repeats.
func JoinSessions(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	out := append(append([]string(nil), a...), b...)
	sort.Strings(out)
	return slices.Compact(out)
}
