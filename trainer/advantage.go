package trainer

import (
	"fmt"
	"math"
	"sort"
)

// Advantage estimators for a group of samples answering the same prompt.
const (
	AdvMeanStd     = "mean_std"      // (r − mean) / std (GRPO)
	AdvMean        = "mean"          // r − mean (Dr. GRPO: no std division)
	AdvLeaveOneOut = "leave_one_out" // r − mean of the others (RLOO)
)

// AdvantageConfig configures how rewards become advantages.
type AdvantageConfig struct {
	// Estimator is AdvMeanStd, AdvMean or AdvLeaveOneOut. Default AdvMeanStd.
	Estimator string `json:"estimator"`
	// BaselineRate is the step size of the per-task running baseline used
	// for singleton groups. Default 0.1.
	BaselineRate float64 `json:"baseline_rate"`
	// PerfectAdvantage is the advantage of every sample in a group whose
	// answers all earned the top reward (1 or more), instead of the zero
	// every group estimator gives it. Default 0 (off).
	//
	// A behaviour the policy has mastered (a refusal it always gives) makes
	// only such flat groups, so plain GRPO never reinforces it while the
	// rest of the batch moves the shared weights: it erodes one prompt at a
	// time. A small positive advantage keeps it trained, the way PPO-ptx
	// mixes likelihood on known-good data into RL. The demo uses 0.2.
	PerfectAdvantage float64 `json:"perfect_advantage"`
	// NegativeWeight scales every negative advantage, in (0, 1]. Default 1.
	// Below 1 the update leans on the samples that did well (asymmetric
	// REINFORCE): where most samples fail, their negative advantages push
	// down the tokens they share with the good ones (a tool call's format)
	// as hard as the good ones push them up, and with stale samples that
	// balance drifts. The tools demo uses 0.2.
	NegativeWeight float64 `json:"negative_weight"`
}

// WithDefaults fills the zero fields with the defaults.
func (c AdvantageConfig) WithDefaults() AdvantageConfig { return c.withDefaults() }

func (c AdvantageConfig) withDefaults() AdvantageConfig {
	if c.Estimator == "" {
		c.Estimator = AdvMeanStd
	}
	if c.BaselineRate == 0 {
		c.BaselineRate = 0.1
	}
	if c.NegativeWeight == 0 {
		c.NegativeWeight = 1
	}
	return c
}

func (c AdvantageConfig) validate() error {
	switch c.Estimator {
	case AdvMeanStd, AdvMean, AdvLeaveOneOut:
	default:
		return fmt.Errorf("advantage estimator %q must be %s, %s or %s", c.Estimator, AdvMeanStd, AdvMean, AdvLeaveOneOut)
	}
	if c.BaselineRate <= 0 || c.BaselineRate > 1 {
		return fmt.Errorf("baseline_rate %v must be in (0, 1]", c.BaselineRate)
	}
	if c.PerfectAdvantage < 0 || c.PerfectAdvantage > 1 || math.IsNaN(c.PerfectAdvantage) {
		return fmt.Errorf("perfect_advantage %v must be in [0, 1]", c.PerfectAdvantage)
	}
	if !(c.NegativeWeight > 0 && c.NegativeWeight <= 1) {
		return fmt.Errorf("negative_weight %v must be in (0, 1]", c.NegativeWeight)
	}
	return nil
}

// Baseline is a running mean reward per task. Online traffic often arrives
// one sample per prompt; a group of one has zero advantage under every group
// estimator and would silently teach nothing, so those samples are compared
// with what the task usually scores instead.
type Baseline struct {
	rate float64
	task map[string]float64
	all  float64
	seen bool
}

// NewBaseline returns an empty baseline moving at rate per sample.
func NewBaseline(rate float64) *Baseline {
	return &Baseline{rate: rate, task: map[string]float64{}}
}

// NewBaselineFrom continues stored per-task means (a training loop keeps
// them between steps); the all-task mean starts as their mean.
func NewBaselineFrom(rate float64, tasks map[string]float64) *Baseline {
	b := NewBaseline(rate)
	for k, v := range tasks {
		b.task[k] = v
		b.all += v
	}
	if len(tasks) > 0 {
		b.all /= float64(len(tasks))
		b.seen = true
	}
	return b
}

// Task is task's own running mean, if it has one.
func (b *Baseline) Task(task string) (float64, bool) {
	v, ok := b.task[task]
	return v, ok
}

// Value is the baseline for task: its own running mean, else the mean over
// all tasks, else 0.
func (b *Baseline) Value(task string) float64 {
	if v, ok := b.task[task]; ok {
		return v
	}
	if b.seen {
		return b.all
	}
	return 0
}

// Observe moves the task's and the global running means toward reward.
func (b *Baseline) Observe(task string, reward float64) {
	if v, ok := b.task[task]; ok {
		b.task[task] = v + b.rate*(reward-v)
	} else {
		b.task[task] = reward
	}
	if b.seen {
		b.all += b.rate * (reward - b.all)
	} else {
		b.all, b.seen = reward, true
	}
}

// AdvantageStats says how advantages were formed.
type AdvantageStats struct {
	Groups int `json:"groups"`
	// BaselineSamples were singleton groups scored against the running
	// baseline.
	BaselineSamples int `json:"baseline_samples"`
	// ZeroSignalGroups had equal rewards throughout, so they teach nothing.
	ZeroSignalGroups int `json:"zero_signal_groups"`
	// PerfectGroups had the top reward throughout and were given
	// PerfectAdvantage.
	PerfectGroups int `json:"perfect_groups,omitempty"`
	// NoBaseline singletons came before any baseline existed; they are
	// scored against the batch's mean reward instead.
	NoBaseline int `json:"no_baseline_samples"`
}

// ComputeAdvantages fills Advantage for every sample that has none, group by
// group (samples with the same GroupID), and updates the baseline with the
// rewards seen.
func ComputeAdvantages(samples []Sample, cfg AdvantageConfig, base *Baseline) (AdvantageStats, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return AdvantageStats{}, err
	}
	groups := map[string][]int{}
	for i, s := range samples {
		if math.IsNaN(s.Reward) || math.IsInf(s.Reward, 0) {
			return AdvantageStats{}, fmt.Errorf("sample %d: reward %v is not finite", i, s.Reward)
		}
		if s.Advantage != nil {
			continue
		}
		key := s.GroupID
		if key == "" {
			key = fmt.Sprintf("\x00sample-%d", i) // ungrouped: a group of one
		}
		groups[key] = append(groups[key], i)
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic baseline updates
	var st AdvantageStats
	// With no baseline yet, a singleton is compared with the batch.
	fresh := !base.seen
	var batchMean float64
	for _, s := range samples {
		batchMean += s.Reward
	}
	batchMean /= float64(max(len(samples), 1))
	for _, k := range keys {
		idx := groups[k]
		st.Groups++
		if len(idx) == 1 {
			s := &samples[idx[0]]
			b := base.Value(s.TaskID)
			if fresh {
				b = batchMean
				st.NoBaseline++
			}
			a := weigh(s.Reward-b, cfg.NegativeWeight)
			s.Advantage = &a
			base.Observe(s.TaskID, s.Reward)
			st.BaselineSamples++
			continue
		}
		rs := make([]float64, len(idx))
		sessions := make([]string, len(idx))
		for j, i := range idx {
			rs[j], sessions[j] = samples[i].Reward, samples[i].SessionID
		}
		adv := sessionAdvantages(rs, sessions, cfg.Estimator)
		if cfg.PerfectAdvantage > 0 && allAtLeast(rs, 1) {
			for j := range adv {
				adv[j] = cfg.PerfectAdvantage
			}
			st.PerfectGroups++
		}
		allZero := true
		for j, i := range idx {
			a := weigh(adv[j], cfg.NegativeWeight)
			if a != 0 {
				allZero = false
			}
			samples[i].Advantage = &a
			base.Observe(samples[i].TaskID, samples[i].Reward)
		}
		if allZero {
			st.ZeroSignalGroups++
		}
	}
	return st, nil
}

// weigh scales a negative advantage by neg.
func weigh(a, neg float64) float64 {
	if a < 0 {
		return a * neg
	}
	return a
}

// sessionAdvantages applies the estimator to a group whose samples are
// the steps of whole sessions: the baseline compares sessions, each
// counted once (its score is the mean of its steps' returns), and each
// step's advantage is its own return against it. A group of single-step
// sessions (or samples of no session) is groupAdvantages itself; with a
// discount of 1 every step of a session gets the session's advantage.
func sessionAdvantages(rs []float64, sessions []string, estimator string) []float64 {
	order, sum, n := []string{}, map[string]float64{}, map[string]int{}
	for j, s := range sessions {
		if s == "" {
			s = fmt.Sprintf("\x00step-%d", j)
			sessions[j] = s
		}
		if n[s] == 0 {
			order = append(order, s)
		}
		sum[s] += rs[j]
		n[s]++
	}
	if len(order) == len(rs) {
		return groupAdvantages(rs, estimator)
	}
	scores := make([]float64, len(order))
	for k, s := range order {
		scores[k] = sum[s] / float64(n[s])
	}
	out := make([]float64, len(rs))
	scale := estimatorScale(scores, estimator)
	if scale == 0 {
		return out // the sessions scored alike: no signal
	}
	base := groupAdvantages(scores, estimator)
	index := map[string]int{}
	for k, s := range order {
		index[s] = k
	}
	for j := range rs {
		k := index[sessions[j]]
		// base[k] = (score_k − b_k)/σ; the step's own return replaces the
		// session's score: (r_j − b_k)/σ = base[k] + (r_j − score_k)/σ.
		out[j] = base[k] + (rs[j]-scores[k])/scale
	}
	return out
}

// estimatorScale is what the estimator divides a reward's distance from
// its baseline by: the group's standard deviation for the default, 1 for
// the others; 0 when the rewards are all equal (no signal).
func estimatorScale(rs []float64, estimator string) float64 {
	var mean, ss float64
	for _, r := range rs {
		mean += r
	}
	mean /= float64(len(rs))
	for _, r := range rs {
		ss += (r - mean) * (r - mean)
	}
	std := math.Sqrt(ss / float64(len(rs)))
	switch {
	case std < 1e-8:
		return 0
	case estimator == AdvLeaveOneOut || estimator == AdvMean:
		return 1
	}
	return std
}

// groupAdvantages applies one estimator to a group's rewards.
func groupAdvantages(rs []float64, estimator string) []float64 {
	n := float64(len(rs))
	var sum float64
	for _, r := range rs {
		sum += r
	}
	mean := sum / n
	out := make([]float64, len(rs))
	switch estimator {
	case AdvLeaveOneOut:
		for i, r := range rs {
			out[i] = r - (sum-r)/(n-1)
		}
	case AdvMean:
		for i, r := range rs {
			out[i] = r - mean
		}
	default:
		var ss float64
		for _, r := range rs {
			ss += (r - mean) * (r - mean)
		}
		std := math.Sqrt(ss / n)
		if std < 1e-8 {
			return out // all equal: no signal, not a division by zero
		}
		for i, r := range rs {
			out[i] = (r - mean) / std
		}
	}
	return out
}

// allAtLeast says every reward is at least v.
func allAtLeast(rs []float64, v float64) bool {
	for _, r := range rs {
		if r < v {
			return false
		}
	}
	return true
}
