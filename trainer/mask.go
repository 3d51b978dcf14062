package trainer

import "math"

// Token masks for off-policy correction. Both compare the proximal policy
// (the weights the step starts from) with the behaviour policy (the weights,
// and numerics, that sampled the token); a token whose two probabilities
// disagree too much carries more noise than signal and is left out.

// icePopKeep reports whether IcePop keeps a token: the importance ratio
// π_prox/μ must lie in [low, high].
func icePopKeep(logpProx, logpBehav, low, high float64) bool {
	r := math.Exp(logpProx - logpBehav)
	return r >= low && r <= high
}

// binaryKL is KL(Bern(p) ‖ Bern(q)), with probabilities clamped away from 0
// and 1 so that it stays finite.
func binaryKL(p, q float64) float64 {
	const e = 1e-12
	p = math.Min(math.Max(p, e), 1-e)
	q = math.Min(math.Max(q, e), 1-e)
	return p*math.Log(p/q) + (1-p)*math.Log((1-p)/(1-q))
}

// kPopScore is max(KL(p‖q), KL(q‖p)) for the probabilities the proximal and
// the behaviour policy gave the sampled token, each seen as a coin ("this
// token" vs "any other"). Unlike a ratio it is small when both probabilities
// are tiny and large when they sit on opposite sides of a decision.
func kPopScore(logpProx, logpBehav float64) float64 {
	p, q := math.Exp(logpProx), math.Exp(logpBehav)
	return math.Max(binaryKL(p, q), binaryKL(q, p))
}
