package trajectory

import (
	"sort"

	"github.com/flywheel-ai/flywheel/store"
)

// MergeRewards merges one step's rewards: each source's latest value (in
// arrival order), averaged with the source weights (a source not listed
// weighs 1). nil when there is none or every weight is zero.
func MergeRewards(rs []store.RewardRow, weights map[string]float64) *float64 {
	latest := map[string]float64{}
	for _, r := range rs {
		latest[r.Source] = r.Value
	}
	srcs := make([]string, 0, len(latest))
	for s := range latest {
		srcs = append(srcs, s)
	}
	sort.Strings(srcs) // a stable summation order
	var sum, wsum float64
	for _, s := range srcs {
		w, ok := weights[s]
		if !ok {
			w = 1
		}
		sum += w * latest[s]
		wsum += w
	}
	if wsum == 0 {
		return nil
	}
	v := sum / wsum
	return &v
}

// BindRewards binds rewards to steps: a reward that names its step goes to
// it; one that rewards the session's outcome goes to the last step; one
// naming a step outside the session is ignored. It returns each step's
// rewards (arrival order) and merged value.
func BindRewards(stepIDs []int64, rs []store.RewardRow, weights map[string]float64) ([][]store.RewardRow, []*float64) {
	idx := make(map[int64]int, len(stepIDs))
	for i, id := range stepIDs {
		idx[id] = i
	}
	per := make([][]store.RewardRow, len(stepIDs))
	for _, r := range rs {
		i := len(stepIDs) - 1
		if r.InteractionID != nil {
			j, ok := idx[*r.InteractionID]
			if !ok {
				continue
			}
			i = j
		}
		if i >= 0 {
			per[i] = append(per[i], r)
		}
	}
	merged := make([]*float64, len(stepIDs))
	for i := range per {
		merged[i] = MergeRewards(per[i], weights)
	}
	return per, merged
}

// Returns is G_t = r_t + γ·G_{t+1}. A step with no reward at or after it
// has no return (unknown, not 0); a missing reward before a known one
// counts as 0.
func Returns(rewards []*float64, gamma float64) []*float64 {
	out := make([]*float64, len(rewards))
	var g *float64
	for i := len(rewards) - 1; i >= 0; i-- {
		if r := rewards[i]; r != nil || g != nil {
			v := 0.0
			if r != nil {
				v = *r
			}
			if g != nil {
				v += gamma * *g
			}
			g = &v
		}
		if g != nil {
			v := *g
			out[i] = &v
		}
	}
	return out
}
