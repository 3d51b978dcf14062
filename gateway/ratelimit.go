package gateway

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/time/rate"
)

// Rate limits per API key, two of them:
//
//   - requests: a token bucket of gateway.rate_limit_rps that bursts to
//     rate_limit_burst, taken from by every authenticated request, one per
//     presented key (a per-session key has its own);
//   - tokens: a bucket of the key's tokens per minute (its own tpm, or
//     gateway.rate_limit_tpm) that refills continuously, shared by a tenant
//     key and its session keys. A call's tokens are
//     known only once it has been answered, so they are charged after it,
//     and a call is refused while the bucket holds less than one token: one
//     large call can take the bucket below zero, and then the key waits
//     until the minute's refill has paid it back.
//
// Both are held in each replica's memory: a shared count would cost a
// write on every call, and usage_daily, which every replica keeps, counts
// by day, too coarse for a minute. So each replica enforces its share of
// every limit, the limit divided by gateway.replicas: with calls spread
// evenly (round robin) a key gets about its whole limit across the
// replicas; with all its calls on one replica it gets that replica's share
// only. A key is never let through past its limit, the full limit on each
// replica would let it through N times over. The hard cap across replicas
// is the token budget (budget.go), which reads the shared usage.

// maxTrackedKeys bounds the buckets a limiter holds.
const maxTrackedKeys = 100000

// codeRateLimit is OpenAI's error type and code for a rate limit.
const codeRateLimit = "rate_limit_exceeded"

// Where the limits are named in OpenAI's rate-limit headers.
const (
	limitRequests = "requests"
	limitTokens   = "tokens"
)

// limitState is what a limit's x-ratelimit-* headers say: its size on
// this replica, what is left, and how long until it is full again.
type limitState struct {
	limit     int64
	remaining int64
	reset     time.Duration
}

// writeLimitHeaders sets OpenAI's x-ratelimit-{limit,remaining,reset}-KIND.
func writeLimitHeaders(c *gin.Context, kind string, st limitState) {
	c.Header("x-ratelimit-limit-"+kind, strconv.FormatInt(st.limit, 10))
	c.Header("x-ratelimit-remaining-"+kind, strconv.FormatInt(st.remaining, 10))
	c.Header("x-ratelimit-reset-"+kind, st.reset.Round(time.Millisecond).String())
}

// requestLimiter is the requests bucket of each key, by key hash.
type requestLimiter struct {
	rps   float64
	burst int
	mu    sync.Mutex
	m     map[string]*rate.Limiter
}

func newRequestLimiter(rps float64, burst, replicas int) *requestLimiter {
	return &requestLimiter{rps: rps / float64(replicas), burst: max(1, burst/replicas), m: map[string]*rate.Limiter{}}
}

// allow takes one request from key's bucket. off is true when requests
// are not limited; otherwise st is the bucket after the request and, when
// it was refused, retry is how long until a request would pass.
func (r *requestLimiter) allow(key string, now time.Time) (ok, off bool, st limitState, retry time.Duration) {
	if r.rps <= 0 {
		return true, true, st, 0
	}
	r.mu.Lock()
	l, found := r.m[key]
	if !found {
		if len(r.m) >= maxTrackedKeys {
			clear(r.m) // a fresh bucket is full: forgetting one only forgives
		}
		l = rate.NewLimiter(rate.Limit(r.rps), r.burst)
		r.m[key] = l
	}
	r.mu.Unlock()
	ok = l.AllowN(now, 1)
	left := l.TokensAt(now)
	st = limitState{limit: int64(r.burst), remaining: int64(math.Max(0, math.Floor(left))),
		reset: seconds((float64(r.burst) - left) / r.rps)}
	if !ok {
		retry = seconds((1 - left) / r.rps)
	}
	return ok, false, st, retry
}

// refused says, without taking from key's bucket, whether a request would
// be refused now, and how long until one would pass.
func (r *requestLimiter) refused(key string, now time.Time) (time.Duration, bool) {
	if r.rps <= 0 {
		return 0, false
	}
	r.mu.Lock()
	l, found := r.m[key]
	r.mu.Unlock()
	if !found {
		return 0, false
	}
	if left := l.TokensAt(now); left < 1 {
		return seconds((1 - left) / r.rps), true
	}
	return 0, false
}

// tokenBucket is one key's tokens-per-minute bucket.
type tokenBucket struct {
	// level is the tokens left at the time at; below zero after a call
	// that used more than was left.
	level float64
	at    time.Time
	// size is the bucket's capacity, this replica's share of the limit.
	size float64
}

// refill brings the bucket up to now: size tokens a minute, up to size.
func (b *tokenBucket) refill(now time.Time) {
	if now.After(b.at) {
		b.level = math.Min(b.size, b.level+b.size*now.Sub(b.at).Minutes())
		b.at = now
	}
}

// tokenLimiter is the tokens-per-minute bucket of each key, by the id of
// the key its calls are accounted to (a session key's parent), so session
// keys share their tenant key's limit.
type tokenLimiter struct {
	replicas int
	mu       sync.Mutex
	m        map[int64]*tokenBucket
}

func newTokenLimiter(replicas int) *tokenLimiter {
	return &tokenLimiter{replicas: replicas, m: map[int64]*tokenBucket{}}
}

// share is this replica's part of a per-minute limit.
func (t *tokenLimiter) share(tpm int64) float64 {
	return math.Max(1, float64(tpm)/float64(t.replicas))
}

// bucket is key's bucket, refilled to now; t.mu must be held.
func (t *tokenLimiter) bucket(key int64, tpm int64, now time.Time) *tokenBucket {
	size := t.share(tpm)
	b, ok := t.m[key]
	if !ok {
		if len(t.m) >= maxTrackedKeys {
			for k, old := range t.m {
				old.refill(now)
				if old.level >= old.size {
					delete(t.m, k) // a full bucket is a fresh one
				}
			}
			if len(t.m) >= maxTrackedKeys {
				clear(t.m)
			}
		}
		b = &tokenBucket{level: size, at: now, size: size}
		t.m[key] = b
	}
	b.size = size // a key's limit changes when the cached key is read again
	b.refill(now)
	return b
}

// check reports whether key may make a call now, with the bucket's state
// and, when it may not, how long until it may.
func (t *tokenLimiter) check(key int64, tpm int64, now time.Time) (ok bool, st limitState, retry time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.bucket(key, tpm, now)
	perSecond := b.size / 60
	st = limitState{limit: int64(b.size), remaining: int64(math.Max(0, math.Floor(b.level))),
		reset: seconds((b.size - b.level) / perSecond)}
	if b.level >= 1 {
		return true, st, 0
	}
	return false, st, seconds((1 - b.level) / perSecond)
}

// charge takes a finished call's tokens from key's bucket.
func (t *tokenLimiter) charge(key int64, tpm int64, tokens int, now time.Time) {
	if tokens <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.bucket(key, tpm, now)
	b.level -= float64(tokens)
}

func seconds(s float64) time.Duration {
	return time.Duration(math.Max(0, s) * float64(time.Second))
}

// limitRequests takes one request from the key's requests bucket, sets
// the -requests headers, and reports a refusal as a 429.
func (s *Server) limitRequests(c *gin.Context, keyHash string, now time.Time) error {
	ok, off, st, retry := s.requests.allow(keyHash, now)
	if off {
		return nil
	}
	writeLimitHeaders(c, limitRequests, st)
	if ok {
		return nil
	}
	return &apiError{Status: http.StatusTooManyRequests, Code: codeRateLimit, RetryAfter: max(time.Second, retry),
		Message: fmt.Sprintf("rate limit reached on requests: this API key may send %g requests per second, bursting to %d, on this gateway; try again in %s",
			s.requests.rps, s.requests.burst, retry.Round(time.Millisecond))}
}

// tpmOf is the tokens-per-minute limit of p's calls; 0: none.
func (s *Server) tpmOf(p *principal) int64 {
	if p.TPM != nil {
		return *p.TPM
	}
	return s.cfg.RateLimitTPM
}

// limitTokens refuses a model call while the key's tokens-per-minute
// bucket is spent, with 429 rate_limit_exceeded and Retry-After, and sets
// the -tokens headers, as they stand before this call, on every answer.
func (s *Server) limitTokens(c *gin.Context, p *principal) error {
	tpm := s.tpmOf(p)
	if tpm <= 0 {
		return nil
	}
	ok, st, retry := s.tokens.check(p.AccountTo(), tpm, s.now())
	writeLimitHeaders(c, limitTokens, st)
	if ok {
		return nil
	}
	return &apiError{Status: http.StatusTooManyRequests, Code: codeRateLimit, RetryAfter: max(time.Second, retry),
		Message: fmt.Sprintf("rate limit reached on tokens per min (TPM): this API key may use %d tokens per minute on this gateway and its calls have used them; try again in %s",
			st.limit, retry.Round(time.Millisecond))}
}

// chargeTokens charges a finished call's prompt and completion tokens to
// its key's tokens-per-minute bucket.
func (s *Server) chargeTokens(p *principal, tokens int) {
	if tpm := s.tpmOf(p); tpm > 0 {
		s.tokens.charge(p.AccountTo(), tpm, tokens, s.now())
	}
}
