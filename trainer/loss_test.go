package trainer

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPPOTokenHandComputed(t *testing.T) {
	c := LossConfig{}.withDefaults()
	cases := []struct {
		name          string
		in            tokenIn
		loss, dlogp   float64
		clipped, mask bool
	}{
		// w = e^0.5, r = 1: loss = −w·A, d/dlogp = −w·A·r.
		{"on-policy ratio, stale behaviour", tokenIn{Logp: -1, LogpProx: -1, LogpBehav: -1.5, Adv: 2}, -2 * math.Exp(0.5), -2 * math.Exp(0.5), false, false},
		// r = 1.5 > 1+0.28 with A > 0: the clipped branch wins, no gradient.
		{"clip high", tokenIn{Logp: math.Log(1.5) - 1, LogpProx: -1, LogpBehav: -1, Adv: 1}, -1.28, 0, true, false},
		// r = 0.5 < 1−0.2 with A < 0: clipped at 0.8, loss = 0.8.
		{"clip low", tokenIn{Logp: math.Log(0.5) - 1, LogpProx: -1, LogpBehav: -1, Adv: -1}, 0.8, 0, true, false},
		// r = 1.5 with A < 0: the unclipped branch is the minimum.
		{"negative advantage not clipped", tokenIn{Logp: math.Log(1.5) - 1, LogpProx: -1, LogpBehav: -1, Adv: -1}, 1.5, 1.5, false, false},
		// π_prox/μ = e³ ≈ 20 is capped at 5.
		{"weight cap", tokenIn{Logp: -1, LogpProx: -1, LogpBehav: -4, Adv: 1}, -5, -5, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := ppoToken(c, tc.in)
			require.InDelta(t, tc.loss, out.Loss, 1e-9)
			require.InDelta(t, tc.dlogp, out.DLogp, 1e-9)
			require.Equal(t, tc.clipped, out.Clipped)
			require.Equal(t, tc.mask, out.Masked)
		})
	}
}

func TestKLEstimatorsHandComputed(t *testing.T) {
	in := tokenIn{Logp: -1, LogpProx: -1, LogpBehav: -1, LogpRef: -1.2, Adv: 0}
	for _, tc := range []struct {
		est     string
		kl, dkl float64
	}{
		{KLk1, 0.2, 1},
		{KLk2, 0.02, 0.2},
		{KLk3, math.Exp(-0.2) - 0.8, 1 - math.Exp(-0.2)},
	} {
		c := LossConfig{KLCoef: 0.5, KLEstimator: tc.est}.withDefaults()
		out := ppoToken(c, in)
		require.InDelta(t, tc.kl, out.KL, 1e-9, tc.est)
		require.InDelta(t, 0.5*tc.kl, out.Loss, 1e-9, tc.est)
		require.InDelta(t, 0.5*tc.dkl, out.DLogp, 1e-9, tc.est)
	}
	require.InDelta(t, 0.018730753, math.Exp(-0.2)-0.8, 1e-8)
}

func TestLossGradientMatchesFiniteDifference(t *testing.T) {
	c := LossConfig{KLCoef: 0.3}.withDefaults()
	for _, in := range []tokenIn{
		{Logp: -1.1, LogpProx: -1, LogpBehav: -1.3, LogpRef: -0.7, Adv: 0.8},
		{Logp: -0.95, LogpProx: -1, LogpBehav: -0.9, LogpRef: -1.4, Adv: -1.2},
	} {
		out := ppoToken(c, in)
		const h = 1e-6
		up, down := in, in
		up.Logp += h
		down.Logp -= h
		num := (ppoToken(c, up).Loss - ppoToken(c, down).Loss) / (2 * h)
		require.InDelta(t, num, out.DLogp, 1e-6)
	}
}

func TestIcePopAndKPopMasks(t *testing.T) {
	// IcePop: ratio e¹ ≈ 2.72 leaves [0.5, 2]; e^0.5 ≈ 1.65 stays.
	require.False(t, icePopKeep(-1, -2, 0.5, 2))
	require.True(t, icePopKeep(-1, -1.5, 0.5, 2))
	require.False(t, icePopKeep(-2, -1, 0.5, 2)) // ratio e⁻¹ ≈ 0.37

	// KPop: p = 0.5, q = 0.25.
	pq := 0.5*math.Log(2) + 0.5*math.Log(0.5/0.75)
	qp := 0.25*math.Log(0.5) + 0.75*math.Log(1.5)
	require.InDelta(t, 0.143841, pq, 1e-6)
	require.InDelta(t, 0.130812, qp, 1e-6)
	require.InDelta(t, math.Max(pq, qp), kPopScore(math.Log(0.5), math.Log(0.25)), 1e-9)
	require.InDelta(t, 0, kPopScore(math.Log(0.3), math.Log(0.3)), 1e-12)
	// Tiny probabilities far apart in ratio are close as coins: kept by KPop
	// although IcePop would drop them.
	require.Less(t, kPopScore(math.Log(1e-4), math.Log(1e-5)), 0.001)
	require.False(t, icePopKeep(math.Log(1e-4), math.Log(1e-5), 0.5, 2))

	c := LossConfig{KPop: true, IcePop: true}.withDefaults()
	out := ppoToken(c, tokenIn{Logp: math.Log(0.5), LogpProx: math.Log(0.5), LogpBehav: math.Log(0.25), Adv: 1})
	require.True(t, out.Masked)
	require.True(t, out.KPopMasked)
	require.False(t, out.IcePopMasked) // ratio 2 is inside [0.5, 2]
	require.Zero(t, out.Loss)
	require.Zero(t, out.DLogp)
}

func TestGroupAdvantages(t *testing.T) {
	rs := []float64{1, 0, 0, 1}
	require.InDeltaSlice(t, []float64{1, -1, -1, 1}, groupAdvantages(rs, AdvMeanStd), 1e-12)
	require.InDeltaSlice(t, []float64{0.5, -0.5, -0.5, 0.5}, groupAdvantages(rs, AdvMean), 1e-12)
	require.InDeltaSlice(t, []float64{2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3}, groupAdvantages(rs, AdvLeaveOneOut), 1e-12)
	require.Equal(t, []float64{0, 0, 0}, groupAdvantages([]float64{3, 3, 3}, AdvMeanStd))
}

func TestSingletonGroupsUseRunningBaseline(t *testing.T) {
	base := NewBaseline(0.1)
	samples := []Sample{{TaskID: "t", Reward: 1}, {TaskID: "t", Reward: 0.5}}
	st, err := ComputeAdvantages(samples, AdvantageConfig{}, base)
	require.NoError(t, err)
	require.Equal(t, 2, st.BaselineSamples)
	require.Equal(t, 2, st.NoBaseline)
	require.InDelta(t, 0.25, *samples[0].Advantage, 1e-12) // nothing seen yet: the batch's mean 0.75
	base = NewBaseline(0.1)
	samples = []Sample{{TaskID: "t", Reward: 1}}
	_, err = ComputeAdvantages(samples, AdvantageConfig{}, base)
	require.NoError(t, err)

	samples = []Sample{{TaskID: "t", Reward: 0}, {TaskID: "u", Reward: 0.5}}
	_, err = ComputeAdvantages(samples, AdvantageConfig{}, base)
	require.NoError(t, err)
	require.InDelta(t, -1, *samples[0].Advantage, 1e-12)   // task t's baseline is 1
	require.InDelta(t, -0.4, *samples[1].Advantage, 1e-12) // unseen task u: global baseline 0.9
	require.InDelta(t, 0.9, base.Value("t"), 1e-12)

	// A real group never touches the baseline's advantage.
	samples = []Sample{{GroupID: "g", TaskID: "t", Reward: 1}, {GroupID: "g", TaskID: "t", Reward: 1}}
	st, err = ComputeAdvantages(samples, AdvantageConfig{}, base)
	require.NoError(t, err)
	require.Equal(t, 0, st.BaselineSamples)
	require.Equal(t, 1, st.ZeroSignalGroups)
	require.Zero(t, *samples[0].Advantage)

	// Unless a perfect group is to be reinforced: then every sample of a
	// group at the top reward gets PerfectAdvantage, and no other does.
	cfg := AdvantageConfig{Estimator: AdvMean, PerfectAdvantage: 0.2}
	samples = []Sample{
		{GroupID: "top", Reward: 1}, {GroupID: "top", Reward: 1},
		{GroupID: "flat", Reward: 0.5}, {GroupID: "flat", Reward: 0.5},
		{GroupID: "mixed", Reward: 1}, {GroupID: "mixed", Reward: 0},
	}
	st, err = ComputeAdvantages(samples, cfg, base)
	require.NoError(t, err)
	require.Equal(t, 1, st.PerfectGroups)
	require.Equal(t, 1, st.ZeroSignalGroups) // the perfect group trains now
	want := []float64{0.2, 0.2, 0, 0, 0.5, -0.5}
	for i, w := range want {
		require.InDelta(t, w, *samples[i].Advantage, 1e-12, "sample %d", i)
	}
	cfg.PerfectAdvantage = -0.1
	_, err = ComputeAdvantages([]Sample{{Reward: 1}}, cfg, base)
	require.ErrorContains(t, err, "perfect_advantage")

	// NegativeWeight scales the negative advantages only, a singleton's
	// against the baseline too.
	cfg = AdvantageConfig{Estimator: AdvMean, NegativeWeight: 0.2}
	samples = []Sample{
		{GroupID: "g", Reward: 1}, {GroupID: "g", Reward: 0}, {GroupID: "g", Reward: 0}, {GroupID: "g", Reward: 0},
		{TaskID: "t", Reward: 0},
	}
	_, err = ComputeAdvantages(samples, cfg, NewBaselineFrom(0.1, map[string]float64{"t": 0.5}))
	require.NoError(t, err)
	want = []float64{0.75, -0.05, -0.05, -0.05, -0.1}
	for i, w := range want {
		require.InDelta(t, w, *samples[i].Advantage, 1e-12, "sample %d", i)
	}
	for _, bad := range []float64{-0.5, 1.5, math.NaN()} {
		cfg.NegativeWeight = bad
		_, err = ComputeAdvantages([]Sample{{Reward: 1}}, cfg, base)
		require.ErrorContains(t, err, "negative_weight")
	}

	_, err = ComputeAdvantages([]Sample{{Reward: math.NaN()}}, AdvantageConfig{}, base)
	require.ErrorContains(t, err, "not finite")
}
