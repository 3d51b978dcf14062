package evolution

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/inference"
)

func TestApplyDeltasCuratesAsSpecified(t *testing.T) {
	keep := artefact.PlaybookItem{ID: "pkeep", Content: "Ask for the order number first.", Tenant: "acme", Helpful: 4, Sessions: []string{"s0"}}
	edit := artefact.PlaybookItem{ID: "pedit", Content: "Be brief.", Tenant: "acme", Sessions: []string{"s0"}}
	gone := artefact.PlaybookItem{ID: "pgone", Content: "Always apologise twice.", Tenant: "acme"}
	other := artefact.PlaybookItem{ID: "pother", Content: "Be brief.", Tenant: "globex"}
	old := artefact.Playbook{Items: []artefact.PlaybookItem{keep, edit, gone, other}}
	cited := map[string]bool{"s1": true, "s2": true}
	deltas := []Delta{
		{Op: DeltaAdd, Content: "  Quote the  invoice total from the tool's answer. ", Sessions: []string{"s1", "s9"}},
		{Op: DeltaAdd, Content: "quote the invoice total from the tool's answer.", Sessions: []string{"s2"}}, // a duplicate
		{Op: DeltaEdit, ID: "pedit", Content: "Answer in one sentence.", Sessions: []string{"s2"}},
		{Op: DeltaRetire, ID: "pgone", Sessions: []string{"s1"}},
		{Op: DeltaRetire, ID: "pother", Sessions: []string{"s1"}},                   // another tenant's
		{Op: DeltaAdd, Content: "Invented.", Sessions: []string{"s9"}},              // cites nothing shown
		{Op: DeltaAdd, Content: strings.Repeat("x", 401), Sessions: []string{"s1"}}, // too long
		{Op: "rename", ID: "pkeep", Sessions: []string{"s1"}},
	}
	pb, c := ApplyDeltas(old, "acme", deltas, cited, 10)
	require.Equal(t, 2, c.Added)
	require.Equal(t, 1, c.Edited)
	require.Equal(t, 1, c.Retired)
	require.Len(t, c.Refused, 4, c.Refused)
	byID := map[string]artefact.PlaybookItem{}
	for _, it := range pb.Items {
		byID[it.Tenant+"/"+it.ID] = it
	}
	require.Len(t, pb.Items, 4, "keep, the edited one, one merged addition, and globex's untouched")
	added := byID["acme/"+ItemID("acme", "Quote the invoice total from the tool's answer.")]
	require.Equal(t, "Quote the invoice total from the tool's answer.", added.Content)
	require.Equal(t, []string{"s1", "s2"}, added.Sessions, "duplicates merge; a session not shown is not cited")
	require.Equal(t, "Answer in one sentence.", byID["acme/pedit"].Content)
	require.Equal(t, []string{"s0", "s2"}, byID["acme/pedit"].Sessions)
	require.NotContains(t, byID, "acme/pgone")
	require.Equal(t, other, byID["globex/pother"], "another tenant's items are untouched")
	require.Equal(t, ItemID("acme", "quote THE invoice total from the tool's answer."), added.ID, "ids ignore case and spacing")
	require.NotEqual(t, ItemID("acme", "Be brief."), ItemID("globex", "Be brief."), "ids are per tenant")

	capped, _ := ApplyDeltas(old, "acme", deltas, cited, 1)
	n := 0
	for _, it := range capped.Items {
		if it.Tenant == "acme" {
			n++
		}
	}
	require.Equal(t, 1, n, "the cap holds per tenant")
}

func TestCountOutcomesRetiresHarmfulItems(t *testing.T) {
	pb := artefact.Playbook{Items: []artefact.PlaybookItem{
		{ID: "a", Content: "A", Tenant: "acme", Helpful: 9}, {ID: "b", Content: "B", Tenant: "acme"}, {ID: "a", Content: "A", Tenant: "globex"}}}
	saw := func(tenant string, outcome float64, ids ...string) ItemSession {
		m := map[string]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return ItemSession{Tenant: tenant, Items: m, Outcome: outcome}
	}
	counted := CountOutcomes(pb, []ItemSession{
		saw("acme", 1, "a"), saw("acme", -1, "a", "b"), saw("acme", -0.5, "b"), saw("acme", -1, "b"), saw("acme", 0, "b"),
		saw("globex", -1, "a"), saw("initech", 1, "a")})
	require.Equal(t, [2]int{1, 1}, [2]int{counted.Items[0].Helpful, counted.Items[0].Harmful}, "counts are live, not carried over")
	require.Equal(t, [2]int{0, 3}, [2]int{counted.Items[1].Helpful, counted.Items[1].Harmful})
	require.Equal(t, [2]int{0, 1}, [2]int{counted.Items[2].Helpful, counted.Items[2].Harmful}, "a tenant's sessions count only its own items")
	curated := CuratePlaybook(counted, nil, 0)
	require.Len(t, curated.Items, 2, "b failed three sessions and helped none: retired")
	for _, it := range curated.Items {
		require.NotEqual(t, "b", it.ID)
	}
	require.False(t, Harmful(counted.Items[2]), "one failure is not enough to retire")
}

func TestParseReplies(t *testing.T) {
	d, err := ParseDeltas("Here you go:\n```json\n{\"deltas\": [{\"op\": \"add\", \"content\": \"x\", \"sessions\": [\"s1\"]}]}\n```")
	require.NoError(t, err)
	require.Equal(t, []Delta{{Op: DeltaAdd, Content: "x", Sessions: []string{"s1"}}}, d)
	_, err = ParseDeltas("I think the agent should be nicer.")
	require.ErrorContains(t, err, "not the JSON object")

	tool := inference.Tool{Name: "lookup_invoice", Description: "Looks up an invoice.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"month":{"type":"integer","description":"Month."}},"required":["month"]}`)}
	o, err := ParseToolRewrite(`{"description":"Looks up an invoice by month number.","parameters":{"type":"object","properties":{"month":{"type":"integer","description":"Month as a number 1-12, not a name."}},"required":["month"]}}`, tool)
	require.NoError(t, err)
	require.Equal(t, "Looks up an invoice by month number.", o.Description)
	require.Contains(t, string(o.Parameters), "not a name")
	_, err = ParseToolRewrite(`{"description":"x","parameters":{"type":"object","properties":{"month":{"type":"string"}},"required":["month"]}}`, tool)
	require.ErrorContains(t, err, "beyond their descriptions", "a rewrite may not change what the tool accepts")
	o, err = ParseToolRewrite(`{"description":"Only the description."}`, tool)
	require.NoError(t, err)
	require.Nil(t, o.Parameters)
	_, err = ParseToolRewrite(`{"description":""}`, tool)
	require.Error(t, err)

	r := MemoryReflection([]artefact.PlaybookItem{{ID: "p1", Content: "Be brief.", Helpful: 2}},
		[]Episode{{Session: "s1", Outcome: -1, Prompt: "total?", Answer: "10", Feedback: []string{"it was 12"}}})
	require.Contains(t, r.User, "id p1 (helpful 2, harmful 0): Be brief.")
	require.Contains(t, r.User, "[session s1] outcome -1.00")
	require.Contains(t, r.User, "feedback: it was 12")
}

func TestFrontierKeepsWhatIsBestSomewhere(t *testing.T) {
	scores := [][]float64{
		{1, 0, 0, 0}, // best on prompt 0 alone
		{0, 1, 1, 0}, // best on prompts 1 and 2
		{0, 1, 0, 0}, // dominated by 1
		{0, 1, 1, 0}, // a copy of 1: one copy stays
	}
	idx, w := Frontier(scores)
	require.Equal(t, []int{0, 1}, idx)
	require.Equal(t, []int{2, 3}, w, "prompt 3 ties everyone at 0, so it counts for each")
	counts := map[int]int{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 700; i++ {
		p, err := PickParent(scores, rng)
		require.NoError(t, err)
		counts[p]++
	}
	require.Equal(t, 2, len(counts), "only frontier candidates are drawn")
	require.InDelta(t, 280, counts[0], 60, "in proportion to the prompts each is best on")

	h, err := ParseHarness(`{"harness": " Give units. "}`)
	require.NoError(t, err)
	require.Equal(t, "Give units.", h)
	_, err = ParseHarness(`{"harness": ""}`)
	require.Error(t, err)
}

func TestDecideRoutesFailuresByWhereTheyLive(t *testing.T) {
	th := Thresholds{MinSessions: 10}
	healthy := Evidence{Sessions: 40, RewardedSessions: 40, RewardMean: 0.4, PrevSamples: 40, RewardPrev: 0.4}
	require.Equal(t, DecisionNoOp, Decide(healthy, th).Kind)
	require.Contains(t, Decide(healthy, th).Reason, "rewarded sessions average 0.400 (40 of them, floor 0.000)")

	// No trend and no corrections, but the rewarded sessions average −0.73:
	// not healthy.
	low := healthy
	low.RewardMean, low.RewardPrev = -0.73, -0.73
	d := Decide(low, th)
	require.Equal(t, DecisionMemory, d.Kind, d.Reason)
	require.Contains(t, d.Reason, "rewarded sessions average -0.730 (40 of them), below the floor 0.000")
	require.Equal(t, "the mean session reward rises from -0.730", d.Expected)
	require.Equal(t, DecisionNoOp, Decide(low, Thresholds{MinSessions: 10, RewardFloor: -1}).Kind, "the floor is the operator's")

	// Only one tenant fails: its memory changes.
	one := low
	one.TenantOutcomes = []TenantOutcome{{Tenant: "acme", Sessions: 10, Rewarded: 10, Failed: 9, Mean: -0.9}, {Tenant: "globex", Sessions: 30, Rewarded: 30, Mean: 0.5},
		{Tenant: "initech", Sessions: 2, Rewarded: 2, Failed: 2, Mean: -1}} // too few to judge
	d = Decide(one, th)
	require.Equal(t, DecisionMemory, d.Kind)
	require.Equal(t, "acme", d.Tenant)
	require.Contains(t, d.Reason, "only tenant acme fails")
	require.Equal(t, "tenant acme's mean session reward rises from -0.900", d.Expected)

	// The same failure across tenants: the shared harness.
	shared := one
	shared.TenantOutcomes[1].Mean, shared.TenantOutcomes[1].Failed = -0.6, 20
	d = Decide(shared, th)
	require.Equal(t, DecisionHarness, d.Kind, d.Reason)
	require.Empty(t, d.Tenant)
	require.Contains(t, d.Reason, "2 tenants fail alike")

	// It persists after the cheap layers, across tenants, with samples
	// queued: weights.
	persists := shared
	persists.LastDecision, persists.SessionsSinceLast, persists.FailingTenants, persists.QueuedSamples = DecisionHarness, 50, 2, 64
	require.Equal(t, DecisionWeights, Decide(persists, th).Kind)
}
