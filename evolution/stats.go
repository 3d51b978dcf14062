package evolution

import (
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// The statistics behind the release gates and the watchdog. Two kinds of
// evidence need two tools:
//
//   - A held-out suite is fixed and answered greedily, so each version's
//     result on it is one fixed sample of prompts. Comparing many candidates
//     with one anchor on the same suite is many looks at the same data; the
//     gate sets each look's error rate with LOND (LookAlpha), so that of the
//     candidates it accepts against an anchor, the expected share truly more
//     than the budget below it stays under alpha however many are judged.
//   - Live rewards arrive one by one and are checked as they come (canary
//     checks, the watchdog every minute). A fixed-sample interval checked
//     repeatedly would be wrong more often the more it is checked, so those
//     use a confidence sequence (MeanCS), valid at every sample size at once.

// LookAlpha is the error rate of the k-th look (1-based) at an anchor after
// passes of the earlier looks passed: LOND (Javanmard and Montanari,
// "Online rules for control of false discovery rate and false discovery
// exceedance", Ann. Statist. 2018), alpha·γ_k·(passes+1) with
// γ_k = 1/(k(k+1)), which sums to 1. Before any pass it is plain alpha
// spending (the family-wise rate over the looks is at most alpha); each
// pass earns the later looks their share back, and the guarantee is then on
// the false discovery rate, which LOND controls for independent or
// positively dependent (PRDS) tests. The looks at one anchor are positively
// dependent: they all subtract the same anchor results. Capped at alpha:
// no look is looser than a single test.
func LookAlpha(alpha float64, look, passes int) float64 {
	k := float64(max(look, 1))
	return min(alpha*float64(max(passes, 0)+1)/(k*(k+1)), alpha)
}

// ZQuantile is the one-sided normal critical value for error rate alpha.
func ZQuantile(alpha float64) float64 {
	if alpha <= 0 {
		return math.Inf(1)
	}
	if alpha >= 1 {
		return math.Inf(-1)
	}
	return distuv.UnitNormal.Quantile(1 - alpha)
}

// Paired summarises the per-prompt differences a[i] − b[i] of two sides
// answering the same prompts.
type Paired struct {
	N int
	// Diff is the mean difference; SE its standard error, with one
	// pseudo-disagreement added so that two sides agreeing on every prompt
	// still carry the uncertainty a finite suite leaves (about 1/N).
	Diff, SE float64
}

// PairDiff compares a with b prompt by prompt (the shorter length counts).
func PairDiff(a, b []float64) Paired {
	n := min(len(a), len(b))
	if n == 0 {
		return Paired{SE: math.Inf(1)}
	}
	var sum float64
	for i := 0; i < n; i++ {
		sum += a[i] - b[i]
	}
	mean := sum / float64(n)
	ss := 1.0 // the pseudo-disagreement
	for i := 0; i < n; i++ {
		d := a[i] - b[i] - mean
		ss += d * d
	}
	df := float64(max(n-1, 1))
	return Paired{N: n, Diff: mean, SE: math.Sqrt(ss / df / float64(n))}
}

// Lower is the one-sided lower confidence bound on the difference at
// error rate alpha; Upper the upper one.
func (p Paired) Lower(alpha float64) float64 { return p.Diff - ZQuantile(alpha)*p.SE }
func (p Paired) Upper(alpha float64) float64 { return p.Diff + ZQuantile(alpha)*p.SE }

// MeanCS is an anytime-valid confidence sequence for the mean of
// independent observations bounded in [Lo, Hi]: the predictable plug-in
// empirical-Bernstein sequence of Waudby-Smith and Ramdas ("Estimating
// means of bounded random variables by betting", JRSS-B 2023, §3.1). With
// probability 1 − alpha the mean lies inside Bounds() at every sample size
// simultaneously, so it may be checked after every observation. It adapts
// to the observed variance, so rewards that vary little get tight bounds
// quickly. The zero value is not usable; call NewMeanCS.
type MeanCS struct {
	lo, span float64
	logTerm  float64 // log(2/alpha)
	n        int
	// Running sums over the rescaled observations x ∈ [0, 1].
	sumX, sumSqDev        float64
	sumLambda, sumLambdaX float64
	sumPenalty            float64
	lower, upper          float64 // running intersection, rescaled
	meanPrev, varPrev     float64 // plug-in estimates before the next x
	truncated             int
}

// lambdaCap bounds each bet (the paper's c; 1/2 or 3/4).
const lambdaCap = 0.5

// NewMeanCS starts a sequence for observations in [lo, hi] with error rate
// alpha (two-sided).
func NewMeanCS(lo, hi, alpha float64) *MeanCS {
	if !(hi > lo) {
		hi = lo + 1
	}
	return &MeanCS{lo: lo, span: hi - lo, logTerm: math.Log(2 / alpha), lower: 0, upper: 1, meanPrev: 0.5, varPrev: 0.25}
}

// Add takes one observation; values outside [lo, hi] are clamped (and
// counted in Truncated).
func (c *MeanCS) Add(v float64) {
	if math.IsNaN(v) {
		return
	}
	x := (v - c.lo) / c.span
	if x < 0 || x > 1 {
		c.truncated++
		x = math.Min(math.Max(x, 0), 1)
	}
	c.n++
	t := float64(c.n)
	lambda := math.Min(math.Sqrt(2*c.logTerm/(c.varPrev*t*math.Log(1+t))), lambdaCap)
	dev := x - c.meanPrev
	c.sumLambda += lambda
	c.sumLambdaX += lambda * x
	// v·ψ_E(λ) with v = 4·dev² and ψ_E(λ) = (−log(1−λ) − λ)/4.
	c.sumPenalty += dev * dev * (-math.Log(1-lambda) - lambda)
	c.sumX += x
	mean := (0.5 + c.sumX) / (t + 1)
	c.sumSqDev += (x - mean) * (x - mean)
	c.meanPrev, c.varPrev = mean, (0.25+c.sumSqDev)/(t+1)
	center := c.sumLambdaX / c.sumLambda
	radius := (c.logTerm + c.sumPenalty) / c.sumLambda
	c.lower, c.upper = math.Max(c.lower, center-radius), math.Min(c.upper, center+radius)
	if c.lower > c.upper { // only possible off the model's assumptions
		c.lower, c.upper = center, center
	}
}

// N is the number of observations taken.
func (c *MeanCS) N() int { return c.n }

// Mean is the plain sample mean (0 with no observations).
func (c *MeanCS) Mean() float64 {
	if c.n == 0 {
		return 0
	}
	return c.lo + c.span*c.sumX/float64(c.n)
}

// Bounds is the current interval, in the observations' own units.
func (c *MeanCS) Bounds() (lower, upper float64) {
	return c.lo + c.span*c.lower, c.lo + c.span*c.upper
}

// Truncated counts observations clamped into [lo, hi].
func (c *MeanCS) Truncated() int { return c.truncated }

// DiffBounds bounds mean(a) − mean(b) for two independent sequences, each
// built at alpha/2, so the pair holds with probability 1 − alpha.
func DiffBounds(a, b *MeanCS) (lower, upper float64) {
	al, au := a.Bounds()
	bl, bu := b.Bounds()
	return al - bu, au - bl
}
