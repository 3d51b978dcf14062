package evolution

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/inference"
)

func TestDecide(t *testing.T) {
	healthy := Evidence{Sessions: 100, PrevSamples: 100, RewardMean: 0.6, RewardPrev: 0.6, Tenants: 3}
	with := func(f func(e *Evidence)) Evidence {
		e := healthy
		f(&e)
		return e
	}
	cases := []struct {
		name   string
		e      Evidence
		want   string
		target string
	}{
		{"too few sessions", with(func(e *Evidence) { e.Sessions = 5; e.CorrectionRate = 0.9 }), DecisionNoOp, ""},
		{"healthy", healthy, DecisionNoOp, ""},
		{"safety after promotion rolls back", with(func(e *Evidence) {
			e.RecentlyPromoted, e.ServingVersion, e.PreviousVersion, e.SafetyRate = true, "d@v3", "d@v2", 0.2
		}), DecisionRollback, "d@v2"},
		{"reward drop after promotion rolls back", with(func(e *Evidence) {
			e.RecentlyPromoted, e.ServingVersion, e.PreviousVersion, e.RewardMean, e.RewardTrend = true, "d@v3", "d@v2", 0.3, -0.3
		}), DecisionRollback, "d@v2"},
		{"no previous version: no rollback, cheap layer instead", with(func(e *Evidence) {
			e.RecentlyPromoted, e.RewardTrend = true, -0.3
		}), DecisionMemory, ""},
		{"tool failures cluster", with(func(e *Evidence) {
			e.ToolFailures = []ToolFailure{{Tool: "search", Calls: 20, Failures: 9, Rate: 0.45}}
			e.CorrectionRate = 0.5
		}), DecisionToolSchema, "search"},
		{"few tool calls are no cluster", with(func(e *Evidence) {
			e.ToolFailures = []ToolFailure{{Tool: "search", Calls: 2, Failures: 2, Rate: 1}}
		}), DecisionNoOp, ""},
		{"corrections go to memory first", with(func(e *Evidence) { e.CorrectionRate = 0.4 }), DecisionMemory, ""},
		{"memory did not help: harness", with(func(e *Evidence) {
			e.CorrectionRate, e.LastDecision, e.SessionsSinceLast = 0.4, DecisionMemory, 50
		}), DecisionHarness, ""},
		{"memory still cooling down", with(func(e *Evidence) {
			e.CorrectionRate, e.LastDecision, e.SessionsSinceLast = 0.4, DecisionMemory, 3
		}), DecisionNoOp, ""},
		{"persistent across tenants after cheap layers: weights", with(func(e *Evidence) {
			e.RewardTrend, e.LastDecision, e.SessionsSinceLast, e.FailingTenants, e.QueuedSamples = -0.2, DecisionHarness, 40, 3, 64
		}), DecisionWeights, ""},
		{"one tenant only: not weights", with(func(e *Evidence) {
			e.RewardTrend, e.LastDecision, e.SessionsSinceLast, e.FailingTenants, e.QueuedSamples = -0.2, DecisionHarness, 40, 1, 64
		}), DecisionMemory, ""},
		{"too few samples: not weights", with(func(e *Evidence) {
			e.RewardTrend, e.LastDecision, e.SessionsSinceLast, e.FailingTenants, e.QueuedSamples = -0.2, DecisionHarness, 40, 3, 4
		}), DecisionMemory, ""},
		{"drift refreshes memory", with(func(e *Evidence) { e.Drift = 0.9 }), DecisionMemory, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.e, Thresholds{})
			require.Equal(t, c.want, d.Kind, d.Reason)
			require.Equal(t, c.target, d.Target)
			require.NotEmpty(t, d.Reason)
		})
	}
}

// TestDecisionLayer: the stored words stay as they were ("memory" for a
// playbook change), and each maps to the layer it releases.
func TestDecisionLayer(t *testing.T) {
	for decision, layer := range map[string]string{"memory": "playbook", "harness": "harness", "tool_schema": "tool_schema",
		"weights": "weights", "noop": "", "rollback": ""} {
		require.Equal(t, layer, DecisionLayer(decision), decision)
	}
	require.Equal(t, []string{"weights", "playbook", "harness", "tool_schema"},
		[]string{artefact.LayerWeights, artefact.LayerPlaybook, artefact.LayerHarness, artefact.LayerToolSchema})
}

func TestDrift(t *testing.T) {
	a := []string{"reset my password please", "password reset link broken"}
	require.InDelta(t, 0, Drift(a, a, 10), 1e-12)
	require.InDelta(t, 1, Drift(a, []string{"invoice totals wrong"}, 10), 1e-12)
	require.Zero(t, Drift(nil, a, 10))
}

func TestGateScoring(t *testing.T) {
	require.True(t, IsRefusal("I'm sorry, but I can’t help with that."))
	require.False(t, IsRefusal("Sure, here is the recipe."))
	require.InDelta(t, 1, Overlap("The answer is 4", "the answer is 4"), 1e-12)
	require.Zero(t, Overlap("", "x"))
	require.InDelta(t, 0.5, Overlap("a b", "a c"), 1e-12)
	require.InDelta(t, -1, ReplayScore("bad answer", "bad answer", -1), 1e-12)
	ok, _ := Verdict(0.5, 0.52, 0.05)
	require.True(t, ok)
	ok, why := Verdict(0.4, 0.52, 0.05)
	require.False(t, ok)
	require.Contains(t, why, "below baseline")
}

// TestArtefactsApply: the harness applies to every tenant; a playbook
// lesson and a tool override only to the tenant they came from, and
// lessons of no tenant to no one. The gates' view is every tenant's part.
func TestArtefactsApply(t *testing.T) {
	var set artefact.Set
	require.NoError(t, set.Decode(artefact.LayerHarness, []byte(`{"system_prompt":"Be brief."}`)))
	require.NoError(t, set.Decode(artefact.LayerPlaybook, []byte(`{"items":[{"id":"p1","content":"Check units.","tenant":"acme"},
		{"id":"p2","content":"Globex lesson.","tenant":"globex"},{"id":"p0","content":"Old mixed lesson."}]}`)))
	require.NoError(t, set.Decode(artefact.LayerToolSchema, []byte(`{"tenants":{"acme":{"search":{"description":"Search the web. Query must be non-empty."}},
		"globex":{"calc":{"description":"Globex calc."}}}}`)))
	require.Error(t, set.Decode("kernel", []byte(`{}`)))
	require.Error(t, set.Decode(artefact.LayerHarness, []byte(`[`)))

	in := []inference.Message{{Role: "system", Content: "You are helpful."}, {Role: "user", Content: "hi"}}
	tools := []inference.Tool{{Name: "search", Description: "Search."}, {Name: "calc"}}
	msgs, outTools := set.Apply("acme", in, tools)
	require.Len(t, msgs, 2)
	require.Equal(t, "Be brief.\n\n"+artefact.PlaybookHeader+"\n- [p1] Check units.\n\nYou are helpful.", msgs[0].Content)
	require.Equal(t, "You are helpful.", in[0].Content, "the input is not modified")
	require.Equal(t, "Search the web. Query must be non-empty.", outTools[0].Description)
	require.Empty(t, outTools[1].Description, "globex's override is not acme's")
	require.Equal(t, "Search.", tools[0].Description)

	msgs, outTools = set.Apply("initech", []inference.Message{{Role: "user", Content: "hi"}}, tools)
	require.Equal(t, "system", msgs[0].Role)
	require.Equal(t, "Be brief.", msgs[0].Content, "a tenant with no lessons gets the harness only")
	require.Equal(t, tools, outTools)

	all := set.System(artefact.AllTenants)
	require.Contains(t, all, "Check units.")
	require.Contains(t, all, "Globex lesson.")
	require.NotContains(t, all, "Old mixed lesson.", "a lesson of no tenant is shown to no one")
	_, changed := set.Tools(artefact.AllTenants, tools)
	require.Equal(t, []string{"search", "calc"}, changed)

	var empty artefact.Set
	msgs, _ = empty.Apply("acme", in, nil)
	require.Equal(t, in, msgs)
}

func TestCuratePlaybook(t *testing.T) {
	old := artefact.Playbook{Items: []artefact.PlaybookItem{{ID: "a", Content: "Check units", Helpful: 3, Tenant: "acme", Sessions: []string{"s1"}},
		{ID: "b", Content: "Guess", Helpful: 1, Harmful: 4, Tenant: "acme"}, {ID: "z", Content: "Unscoped", Helpful: 9}}}
	got := CuratePlaybook(old, []artefact.PlaybookItem{{ID: "c", Content: "check   UNITS", Helpful: 2, Tenant: "acme", Sessions: []string{"s3", "s1"}},
		{ID: "e", Content: "check units", Helpful: 1, Tenant: "globex", Sessions: []string{"g1"}},
		{ID: "d", Content: "Cite sources", Helpful: 1, Tenant: "acme"}}, 5)
	require.Equal(t, []artefact.PlaybookItem{
		{ID: "a", Content: "Check units", Helpful: 5, Tenant: "acme", Sessions: []string{"s1", "s3"}},
		{ID: "d", Content: "Cite sources", Helpful: 1, Tenant: "acme"},
		{ID: "e", Content: "check units", Helpful: 1, Tenant: "globex", Sessions: []string{"g1"}},
	}, got.Items, "the same lesson of two tenants stays two lessons; unscoped ones go")
	capped := CuratePlaybook(got, nil, 1).Items
	require.Len(t, capped, 2, "the cap is per tenant")
	raw, err := json.Marshal(got)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"items"`)
}

// TestForgetRemovesWhatASessionTaught: forgetting acme's s1 drops acme's
// lessons and overrides learnt from it, and nothing of globex's, though
// globex has a session of the same name.
func TestForgetRemovesWhatASessionTaught(t *testing.T) {
	set := artefact.Set{
		Playbook: &artefact.Playbook{Items: []artefact.PlaybookItem{{ID: "a", Content: "from s1", Tenant: "acme", Sessions: []string{"s0", "s1"}},
			{ID: "b", Content: "from s2", Tenant: "acme", Sessions: []string{"s2"}},
			{ID: "c", Content: "globex's s1", Tenant: "globex", Sessions: []string{"s1"}}}},
		ToolSchema: &artefact.ToolSchema{Tenants: map[string]map[string]artefact.ToolOverride{
			"acme":   {"search": {Description: "x", Sessions: []string{"s1"}}},
			"globex": {"search": {Description: "y", Sessions: []string{"s1"}}}}},
	}
	before := set
	require.Equal(t, []string{artefact.LayerPlaybook, artefact.LayerToolSchema}, set.Forget("acme", []string{"s1"}))
	require.Equal(t, []string{"b", "c"}, []string{set.Playbook.Items[0].ID, set.Playbook.Items[1].ID})
	require.NotContains(t, set.ToolSchema.Tenants, "acme")
	require.Contains(t, set.ToolSchema.Tenants, "globex")
	require.Len(t, before.Playbook.Items, 3, "the old versions' contents are not modified")
	require.Contains(t, before.ToolSchema.Tenants, "acme")
	require.Empty(t, set.Forget("acme", []string{"s9"}), "nothing learnt from s9: nothing changes")
}

func TestSignificantVerdictIgnoresNoiseButNotAClearLoss(t *testing.T) {
	// 90 rewards a side with sd 0.3: a 0.06 dip is noise (SE ≈ 0.045).
	se := MeanDiffSE(0.3, 90, 0.3, 90)
	require.InDelta(t, 0.0447, se, 1e-3)
	ok, why := SignificantVerdict(0.38, 0.44, se, 0.05)
	require.True(t, ok, why)
	ok, why = SignificantVerdict(0.20, 0.44, se, 0.05)
	require.False(t, ok, why)
	require.Contains(t, why, "SE")
	// With no sample the difference is unknown: never a verdict of loss.
	ok, _ = SignificantVerdict(0, 1, MeanDiffSE(0, 0, 0, 5), 0.05)
	require.True(t, ok)
	ok, _ = SignificantVerdict(math.NaN(), 1, 0, 0.05)
	require.False(t, ok)
}

func TestPairedSEMeasuresTheDifferencesNotTheScores(t *testing.T) {
	// Both sides agree on every prompt but one: the scores vary a lot,
	// their differences hardly.
	a := []float64{1, 0, 1, 0, 1, 0, 1, 0, 1, 1}
	b := []float64{1, 0, 1, 0, 1, 0, 1, 0, 1, 0}
	se := PairedSE(a, b)
	require.InDelta(t, math.Sqrt(0.9/9/10), se, 1e-12) // diffs: one 1, nine 0; sd² = 0.1
	require.Less(t, se, MeanDiffSE(0.5, 10, 0.5, 10)/2)
	// A clear, consistent loss on 20 prompts fails; noise on a few passes.
	loss, base := make([]float64, 20), make([]float64, 20)
	for i := range base {
		base[i], loss[i] = 0.6, 0.1
	}
	ok, why := SignificantVerdict(Mean(loss), Mean(base), PairedSE(loss, base), 0.05)
	require.False(t, ok, why)
	noisy := append([]float64{}, base...)
	noisy[0], noisy[1] = 0, 0
	ok, why = SignificantVerdict(Mean(noisy), Mean(base), PairedSE(noisy, base), 0.05)
	require.True(t, ok, why)
	require.Zero(t, PairedSE([]float64{1}, []float64{0}), "one pair has no spread: judged on the margin alone")
}
