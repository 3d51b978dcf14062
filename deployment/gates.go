package deployment

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// WithGates returns p with each setting that gates (a deployment's
// Settings.Gates) sets in its place: thresholds, and the phases' timings
// (durations as "90s"); empty gates leave p as it is. A key that is not
// a setting, a value of the wrong type or out of range is an error that
// names it.
func (p ReleasePolicy) WithGates(gates json.RawMessage) (ReleasePolicy, error) {
	if len(bytes.TrimSpace(gates)) == 0 || bytes.Equal(bytes.TrimSpace(gates), []byte("null")) {
		return p, nil
	}
	var set map[string]json.RawMessage
	if err := json.Unmarshal(gates, &set); err != nil {
		return p, fmt.Errorf("gates: want an object of thresholds: %w", err)
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// The policy's JSON names are its Go field names; encoding/json
	// matches them without regard to case, so the snake-case key without
	// its underscores finds its field, and one decoder fills every type.
	for _, k := range keys {
		if gateRange[k] == nil {
			return p, fmt.Errorf("gates.%s: unknown threshold, want one of %s", k, strings.Join(gateKeys(), ", "))
		}
		v := set[k]
		if durationKeys[k] {
			// A duration is written as Go writes one ("90s", "10m").
			var text string
			if err := json.Unmarshal(v, &text); err != nil {
				return p, fmt.Errorf("gates.%s %s: want a duration such as \"90s\"", k, v)
			}
			d, err := time.ParseDuration(text)
			if err != nil {
				return p, fmt.Errorf("gates.%s %q: want a duration such as \"90s\"", k, text)
			}
			v, _ = json.Marshal(int64(d))
		}
		field, err := json.Marshal(map[string]json.RawMessage{strings.ReplaceAll(k, "_", ""): v})
		if err != nil {
			return p, err
		}
		if err := json.Unmarshal(field, &p); err != nil {
			return p, fmt.Errorf("gates.%s %s: wrong type", k, set[k])
		}
	}
	for _, k := range keys {
		if err := gateRange[k](p); err != nil {
			return p, fmt.Errorf("gates.%s %w", k, err)
		}
	}
	return p, nil
}

// gateRange checks the range of each threshold a deployment may set, by
// its snake-case name.
var gateRange = map[string]func(ReleasePolicy) error{
	"allow_unevaluated": func(ReleasePolicy) error { return nil },
	"alpha":             func(p ReleasePolicy) error { return within(p.Alpha, p.Alpha > 0 && p.Alpha <= 0.5, "(0, 0.5]") },
	"anchor_budget":     func(p ReleasePolicy) error { return fraction(p.AnchorBudget) },
	"max_error_rise":    func(p ReleasePolicy) error { return fraction(p.MaxErrorRise) },
	"max_reward_drop":   func(p ReleasePolicy) error { return fraction(p.MaxRewardDrop) },
	"max_safety_drop":   func(p ReleasePolicy) error { return fraction(p.MaxSafetyDrop) },
	"min_canary_samples": func(p ReleasePolicy) error {
		n := p.MinCanarySamples
		return within(n, n >= 1 && n <= 1_000_000, "1..1000000")
	},
	// When the gates run.
	"shadow_duration":  func(p ReleasePolicy) error { return duration(p.ShadowDuration) },
	"canary_duration":  func(p ReleasePolicy) error { return duration(p.CanaryDuration) },
	"max_traffic_wait": func(p ReleasePolicy) error { return duration(p.MaxTrafficWait) },
	"weight_drain":     func(p ReleasePolicy) error { return duration(p.WeightDrain) },
	"approval_timeout": func(p ReleasePolicy) error { return duration(p.ApprovalTimeout) },
	"canary_share": func(p ReleasePolicy) error {
		return within(p.CanaryShare, p.CanaryShare > 0 && p.CanaryShare <= 1, "a share in (0, 1]")
	},
	"canary_checks": func(p ReleasePolicy) error {
		return within(p.CanaryChecks, p.CanaryChecks >= 1 && p.CanaryChecks <= 1000, "1..1000")
	},
	"require_approval": func(ReleasePolicy) error { return nil },
}

// durationKeys are the keys whose values are durations.
var durationKeys = map[string]bool{"shadow_duration": true, "canary_duration": true, "max_traffic_wait": true,
	"weight_drain": true, "approval_timeout": true}

func duration(d time.Duration) error {
	return within(d, d > 0 && d <= 30*24*time.Hour, "a duration in (0, 720h]")
}

func fraction(v float64) error { return within(v, v >= 0 && v <= 1, "a fraction in [0, 1]") }

func within[T any](v T, ok bool, want string) error {
	if ok {
		return nil
	}
	return fmt.Errorf("%v: want %s", v, want)
}

// gateKeys are the ReleasePolicy fields a deployment's settings may set, by
// their snake-case names: what the gates compute and when they run.
func gateKeys() []string {
	keys := make([]string, 0, len(gateRange))
	for k := range gateRange {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
