package fakeskyrl

import (
	"sync"
	"time"
)

// Faults are the failures and delays a test injects. The zero value
// injects nothing; all methods are safe for concurrent use.
type Faults struct {
	mu       sync.Mutex
	failures map[string]*Failure
	delay    time.Duration
}

// Failure answers a route's next Count requests with Status and
// {"detail": "injected fault"}, and Retry-After (whole seconds, rounded
// up) when RetryAfter > 0, before the route sees them.
type Failure struct {
	Status     int
	Count      int
	RetryAfter time.Duration
}

// FailNext makes the next n requests to route (a Route constant) answer
// status, with Retry-After when retryAfter > 0. It replaces any failure
// still pending on that route; n <= 0 clears it.
func (f *Faults) FailNext(route string, n, status int, retryAfter time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failures == nil {
		f.failures = map[string]*Failure{}
	}
	if n <= 0 {
		delete(f.failures, route)
		return
	}
	f.failures[route] = &Failure{Status: status, Count: n, RetryAfter: retryAfter}
}

// SetDelay makes the engine wait d before processing each request
// (create_model, forward_backward, optim_step, saves and loads), so that
// its future stays pending that long.
func (f *Faults) SetDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay = d
}

// Delay is the processing delay SetDelay set.
func (f *Faults) Delay() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.delay
}

// Clear removes every pending failure and the delay.
func (f *Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = nil
	f.delay = 0
}

// take consumes one injected failure of route, if any is pending.
func (f *Faults) take(route string) (Failure, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := f.failures[route]
	if !ok {
		return Failure{}, false
	}
	fl.Count--
	if fl.Count <= 0 {
		delete(f.failures, route)
	}
	return *fl, true
}
