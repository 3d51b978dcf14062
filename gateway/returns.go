package gateway

import (
	"math"
	"sort"

	"github.com/flywheel-ai/flywheel/store"
)

// mergeRewards merges a step's rewards: each source's latest value,
// averaged with the configured source weights (unlisted sources weigh 1).
// nil when there is none or every weight is zero.
func mergeRewards(rs []store.RewardRow, weights map[string]float64) *float64 {
	latest := map[string]float64{}
	for _, r := range rs { // arrival order: later values of a source win
		latest[r.Source] = r.Value
	}
	srcs := make([]string, 0, len(latest))
	for s := range latest {
		srcs = append(srcs, s)
	}
	sort.Strings(srcs) // stable float summation
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

// stepRewards binds rewards to steps: a reward names its step, or rewards
// the session's outcome, which binds to the last step. It returns each
// step's rewards and merged value.
func stepRewards(stepIDs []int64, rs []store.RewardRow, weights map[string]float64) ([][]store.RewardRow, []*float64) {
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
		merged[i] = mergeRewards(per[i], weights)
	}
	return per, merged
}

// discountedReturns is G_t = r_t + γ G_{t+1}, a missing reward counting
// as 0; all nil when no step has a reward (the return is unknown, not 0).
func discountedReturns(rewards []*float64, gamma float64) []*float64 {
	out := make([]*float64, len(rewards))
	any := false
	for _, r := range rewards {
		if r != nil {
			any = true
		}
	}
	if !any {
		return out
	}
	g := 0.0
	for i := len(rewards) - 1; i >= 0; i-- {
		r := 0.0
		if rewards[i] != nil {
			r = *rewards[i]
		}
		g = r + gamma*g
		v := g
		out[i] = &v
	}
	return out
}

// validReward checks a reward value against the configured range.
func (s *Server) validReward(v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return errf(422, "value: must be a finite number")
	}
	if v < s.cfg.RewardMin || v > s.cfg.RewardMax {
		return errf(422, "value: must be within [%g, %g], got %g", s.cfg.RewardMin, s.cfg.RewardMax, v)
	}
	return nil
}
