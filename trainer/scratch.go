package trainer

import (
	"math/bits"
	"sync"
)

// scratch hands out one pass's float32 buffers from pools by size class
// and takes them all back when the pass ends. A demo-sized train step
// allocates a few hundred MB of activations; made afresh they ran the
// garbage collector about ten times a step, whose worker then competed
// with OpenBLAS's threads for the cores (the step took 20 % longer than
// with GOGC=400). A nil scratch makes every buffer afresh.
type scratch struct {
	mu   sync.Mutex
	bufs []*[]float32
}

// minPooled is the smallest buffer worth pooling.
const minPooled = 1 << 10

// floatPools[c] holds buffers of capacity 1<<c.
var floatPools [48]sync.Pool

// floats is a zeroed buffer of n floats, good until release.
func (s *scratch) floats(n int) []float32 {
	if s == nil || n < minPooled {
		return make([]float32, n)
	}
	c := bits.Len(uint(n - 1)) // the smallest c with 1<<c >= n
	b, _ := floatPools[c].Get().(*[]float32)
	if b == nil {
		v := make([]float32, 1<<c)
		b = &v
	}
	out := (*b)[:n]
	clear(out)
	s.mu.Lock()
	s.bufs = append(s.bufs, b)
	s.mu.Unlock()
	return out
}

// release returns every buffer handed out; none may be used after.
func (s *scratch) release() {
	for _, b := range s.bufs {
		floatPools[bits.Len(uint(cap(*b)-1))].Put(b)
	}
	s.bufs = nil
}
