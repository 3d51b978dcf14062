package trainer

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Parallelism is spread by Go, not by OpenBLAS: BLAS runs one thread per
// call and the passes split big products by rows or columns and attention by
// (tree, head) across goroutines. OpenBLAS's own threads spin-wait between
// the many small products of a transformer step (a quarter of the CPU went
// to sched_yield in the profile), while goroutines keep both cores on work.

var workers atomic.Int32

func init() { workers.Store(int32(runtime.GOMAXPROCS(0))) }

// SetParallelism sets how many goroutines one pass uses (default GOMAXPROCS).
func SetParallelism(n int) {
	if n < 1 {
		n = 1
	}
	workers.Store(int32(n))
}

// parallelFor runs fn over [0, n) in contiguous chunks, one per worker, when
// the work (n·costPer, in rough flops) is worth the goroutines.
func parallelFor(n int, costPer float64, fn func(lo, hi int)) {
	w := int(workers.Load())
	if w > n {
		w = n
	}
	if w <= 1 || float64(n)*costPer < 2e5 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		lo, hi := i*n/w, (i+1)*n/w
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// psgemm is sgemm split across workers along the larger of m and n.
func psgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	w := int(workers.Load())
	if w <= 1 || 2*float64(m)*float64(n)*float64(k) < 4e6 {
		sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	if m >= n {
		parallelFor(m, 1e9, func(lo, hi int) {
			aOff := lo * lda
			if transA {
				aOff = lo
			}
			sgemm(transA, transB, hi-lo, n, k, alpha, a[aOff:], lda, b, ldb, beta, c[lo*ldc:], ldc)
		})
		return
	}
	parallelFor(n, 1e9, func(lo, hi int) {
		bOff := lo
		if transB {
			bOff = lo * ldb
		}
		sgemm(transA, transB, m, hi-lo, k, alpha, a, lda, b[bOff:], ldb, beta, c[lo:], ldc)
	})
}
