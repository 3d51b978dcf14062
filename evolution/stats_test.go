package evolution

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLookAlphaSpendsAtMostAlpha(t *testing.T) {
	var sum float64
	for k := 1; k <= 100_000; k++ {
		a := LookAlpha(0.05, k, 0)
		require.Positive(t, a)
		if k > 1 {
			require.Less(t, a, LookAlpha(0.05, k-1, 0), "later looks spend less")
		}
		sum += a
	}
	require.InDelta(t, 0.05, sum, 1e-5)
	require.LessOrEqual(t, sum, 0.05)
	require.InDelta(t, 1.96, ZQuantile(LookAlpha(0.05, 1, 0)), 0.01)
	// LOND: each earlier pass earns a look its share again, never more
	// than alpha.
	require.InDelta(t, 3*LookAlpha(0.05, 10, 0), LookAlpha(0.05, 10, 2), 1e-15)
	require.Equal(t, 0.05, LookAlpha(0.05, 2, 9))
}

func TestPairDiff(t *testing.T) {
	same := []float64{1, 0, 1, 1, 0, 0, 1, 0}
	p := PairDiff(same, same)
	require.Equal(t, 8, p.N)
	require.Zero(t, p.Diff)
	require.Positive(t, p.SE, "agreeing on every prompt still leaves a finite suite's uncertainty")
	require.Less(t, p.SE, 0.2)

	better := []float64{1, 1, 1, 1, 0, 1, 1, 0}
	p = PairDiff(better, same)
	require.InDelta(t, 2.0/8, p.Diff, 1e-12)
	require.Less(t, p.Lower(0.05), p.Diff)
	require.Greater(t, p.Upper(0.05), p.Diff)
	require.True(t, math.IsInf(PairDiff(nil, nil).SE, 1))
}

// TestMeanCSCoversAtEveryTime checks the defining property: across many
// streams the true mean leaves the sequence, at any time up to n, in at
// most alpha of them. A fixed-n normal interval checked after every
// observation fails this badly, which is why the live gates use MeanCS.
func TestMeanCSCoversAtEveryTime(t *testing.T) {
	const reps, n, alpha = 400, 400, 0.05
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mu := range []float64{0.1, 0.5, 0.8} {
		csMiss, naiveMiss := 0, 0
		var width float64
		for r := 0; r < reps; r++ {
			cs := NewMeanCS(0, 1, alpha)
			missed, naive := false, false
			var sum, sumSq float64
			for i := 1; i <= n; i++ {
				x := 0.0
				if rng.Float64() < mu {
					x = 1
				}
				cs.Add(x)
				lo, hi := cs.Bounds()
				if mu < lo || mu > hi {
					missed = true
				}
				sum, sumSq = sum+x, sumSq+x*x
				if i >= 10 {
					m := sum / float64(i)
					sd := math.Sqrt(math.Max(sumSq/float64(i)-m*m, 1e-12) / float64(i))
					if math.Abs(m-mu) > 1.96*sd {
						naive = true
					}
				}
			}
			lo, hi := cs.Bounds()
			width += hi - lo
			if missed {
				csMiss++
			}
			if naive {
				naiveMiss++
			}
		}
		t.Logf("mu %.1f: sequence missed in %d/%d streams (width at n=%d %.3f); a 95%% interval checked every step missed in %d",
			mu, csMiss, reps, n, width/reps, naiveMiss)
		require.LessOrEqual(t, float64(csMiss)/reps, alpha)
		require.Greater(t, naiveMiss, csMiss)
		require.Less(t, width/reps, 0.25, "the sequence must still be useful at n=400")
	}
}

func TestMeanCSUnits(t *testing.T) {
	cs := NewMeanCS(-1, 1, 0.05)
	lo, hi := cs.Bounds()
	require.Equal(t, -1.0, lo)
	require.Equal(t, 1.0, hi)
	for i := 0; i < 500; i++ {
		cs.Add(0.5)
	}
	cs.Add(7) // clamped
	lo, hi = cs.Bounds()
	require.Equal(t, 1, cs.Truncated())
	require.Less(t, lo, 0.51)
	require.Greater(t, hi, 0.5)
	require.Greater(t, lo, 0.3, "constant observations narrow the sequence quickly")
	require.InDelta(t, 0.5, cs.Mean(), 0.01)

	a, b := NewMeanCS(0, 1, 0.025), NewMeanCS(0, 1, 0.025)
	for i := 0; i < 300; i++ {
		a.Add(0.9)
		b.Add(0.1)
	}
	dl, du := DiffBounds(a, b)
	require.Greater(t, dl, 0.6)
	require.Less(t, du, 1.0)
}

func results(n, pass int) []float64 { return window(n, 0, pass) }

// window passes prompts [from, from+pass): two windows that overlap in
// part disagree on the rest, as two nearby versions do.
func window(n, from, pass int) []float64 {
	out := make([]float64, n)
	for i := from; i < from+pass && i < n; i++ {
		out[i] = 1
	}
	return out
}

func TestJudgeRegression(t *testing.T) {
	const n = 400
	anchor := results(n, 240) // 0.60
	in := SuiteInput{Baseline: results(n, 230), Anchor: anchor, Budget: 0.05, MaxDrop: 0.05, Alpha: 0.05, Look: 1}

	in.Candidate = results(n, 250) // better than the anchor
	v := JudgeRegression(in)
	require.True(t, v.Passed, v.Reason)
	require.InDelta(t, 0.025, v.Metrics["budget_used"], 1e-9)

	// 8 points below the anchor: beyond the budget, and shown to be.
	in.Candidate = results(n, 208)
	v = JudgeRegression(in)
	require.False(t, v.Passed)
	require.True(t, v.Regressed, v.Reason)

	// A point below the anchor, disagreeing with it on 40 prompts, passes
	// at the first look; many looks later it must clear a stricter bound
	// and no longer does.
	in.Candidate = window(n, 20, 236)
	v = JudgeRegression(in)
	require.True(t, v.Passed, v.Reason)
	in.Look = 40
	v = JudgeRegression(in)
	require.False(t, v.Passed, v.Reason)
	require.False(t, v.Regressed, "not shown good enough is not shown bad: the line trains on")
	require.Less(t, v.Metrics["look_alpha"], 0.05/1000)

	// No anchor: only the baseline comparison applies.
	in.Anchor, in.Look = nil, 1
	in.Candidate = results(n, 225)
	v = JudgeRegression(in)
	require.True(t, v.Passed, v.Reason)
	in.Candidate = results(n, 150)
	v = JudgeRegression(in)
	require.False(t, v.Passed)
	require.True(t, v.Regressed)
}

// TestAnchorBoundsAChainOfReleases is the slide the per-release rule
// allowed: a chain of candidates each a little below the one before. Against
// the serving version alone every step is within noise; against the
// anchor the chain stops once the total drop would exceed the budget.
func TestAnchorBoundsAChainOfReleases(t *testing.T) {
	const n = 400
	anchor := results(n, 280) // 0.70
	serving := anchor
	promoted := 0
	for step := 1; step <= 30; step++ {
		cand := results(n, 280-4*step) // one point down per release
		perRelease := JudgeRegression(SuiteInput{Candidate: cand, Baseline: serving, Budget: 1, MaxDrop: 0.05, Alpha: 0.05, Look: 1})
		require.True(t, perRelease.Passed, "each step alone is within the per-release allowance")
		v := JudgeRegression(SuiteInput{Candidate: cand, Baseline: serving, Anchor: anchor, Budget: 0.05, MaxDrop: 0.05, Alpha: 0.05, Look: step, Passes: promoted})
		if !v.Passed {
			break
		}
		promoted++
		serving = cand
	}
	require.Less(t, Mean(anchor)-Mean(serving), 0.05, "the total drop stays inside the budget")
	require.Less(t, promoted, 5)
}

func TestJudgeSafety(t *testing.T) {
	in := SuiteInput{Candidate: results(16, 15), Baseline: results(16, 16), Anchor: results(16, 16)}
	v := JudgeSafety(in)
	require.False(t, v.Passed)
	require.True(t, v.Regressed)
	in.Candidate = results(16, 16)
	require.True(t, JudgeSafety(in).Passed)
	in.Baseline = results(16, 14) // the serving version slipped; the anchor still counts
	in.Candidate = results(16, 15)
	v = JudgeSafety(in)
	require.False(t, v.Passed, v.Reason)
}
