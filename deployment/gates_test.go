package deployment

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWithGatesSetsOnlyWhatItNames(t *testing.T) {
	base := DefaultReleasePolicy()
	p, err := base.WithGates(json.RawMessage(`{"max_reward_drop": 0, "allow_unevaluated": true, "min_canary_samples": 7}`))
	require.NoError(t, err)
	require.Zero(t, p.MaxRewardDrop, "an explicit 0 is kept, not defaulted")
	require.True(t, p.AllowUnevaluated)
	require.Equal(t, 7, p.MinCanarySamples)
	p.MaxRewardDrop, p.AllowUnevaluated, p.MinCanarySamples = base.MaxRewardDrop, base.AllowUnevaluated, base.MinCanarySamples
	require.Equal(t, base, p, "what the gates do not name stays the release's")

	same, err := base.WithGates(nil)
	require.NoError(t, err)
	require.Equal(t, base, same)
}

func TestWithGatesNamesTheBadField(t *testing.T) {
	for raw, want := range map[string]string{
		`{"max_safety_drop": 2}`:      "gates.max_safety_drop 2: want a fraction in [0, 1]",
		`{"alpha": 0.7}`:              "gates.alpha 0.7: want (0, 0.5]",
		`{"min_canary_samples": 0}`:   "gates.min_canary_samples 0: want 1..1000000",
		`{"alpha": "high"}`:           "gates.alpha",
		`{"shadow_duration": 5}`:      `gates.shadow_duration 5: want a duration such as "90s"`,
		`{"canary_duration": "0s"}`:   "gates.canary_duration 0s: want a duration in (0, 720h]",
		`{"canary_share": 1.5}`:       "gates.canary_share 1.5: want a share in (0, 1]",
		`{"shadow": "1m"}`:            "gates.shadow: unknown threshold",
		`{"MaxRewardDrop": 0.1}`:      "gates.MaxRewardDrop: unknown threshold",
		`[1, 2]`:                      "gates: want an object of thresholds",
		`{"max_reward_drop": 0.1} {}`: "gates: want an object of thresholds",
	} {
		_, err := DefaultReleasePolicy().WithGates(json.RawMessage(raw))
		require.ErrorContains(t, err, want, raw)
	}
}

func TestSettingsRoundTripKeepsTheGates(t *testing.T) {
	raw := []byte(`{"base_url":"http://vllm:8000/v1","gates":{"max_reward_drop":0.02}}`)
	s, err := Parse(raw)
	require.NoError(t, err)
	out, err := json.Marshal(s)
	require.NoError(t, err)
	require.JSONEq(t, string(raw), string(out))
	_, err = Parse([]byte(`{"base_url":"http://vllm:8000/v1","gates":{"alpha":1}}`))
	require.ErrorContains(t, err, "deployment settings: gates.alpha 1")
}

// TestEveryGateKeyReachesItsField sets each threshold alone and checks that
// it changed the policy: a key whose name does not find its field would
// otherwise be accepted and do nothing.
func TestEveryGateKeyReachesItsField(t *testing.T) {
	values := map[string]string{"allow_unevaluated": "true", "alpha": "0.01", "anchor_budget": "0.2", "max_error_rise": "0.3",
		"max_reward_drop": "0.4", "max_safety_drop": "0.5", "min_canary_samples": "99",
		"shadow_duration": `"7s"`, "canary_duration": `"3m"`, "max_traffic_wait": `"1h"`, "weight_drain": `"9s"`,
		"approval_timeout": `"2h"`, "canary_share": "0.5", "canary_checks": "3", "require_approval": "true"}
	require.ElementsMatch(t, gateKeys(), func() []string {
		var ks []string
		for k := range values {
			ks = append(ks, k)
		}
		return ks
	}())
	base := DefaultReleasePolicy()
	for k, v := range values {
		p, err := base.WithGates(json.RawMessage(`{"` + k + `": ` + v + `}`))
		require.NoError(t, err, k)
		require.NotEqual(t, base, p, "%s changed nothing", k)
	}
}

func TestGatesSetTheReleaseTimings(t *testing.T) {
	p, err := DefaultReleasePolicy().WithGates(json.RawMessage(`{"shadow_duration": "90s", "canary_duration": "4m", "canary_share": 0.25}`))
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, p.ShadowDuration)
	require.Equal(t, 4*time.Minute, p.CanaryDuration)
	require.Equal(t, 0.25, p.CanaryShare)
}
