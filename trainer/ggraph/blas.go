package ggraph

import (
	"runtime"
	"sync"
	"sync/atomic"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"

	"github.com/flywheel-ai/flywheel/trainer"
)

// fastBLAS is the BLAS gorgonia and gorgonia/tensor call: gonum's pure-Go
// implementation for everything, with SGEMM replaced by the kernel the
// hand-written passes use (OpenBLAS through cgo, see trainer.BLASName), split
// across goroutines the same way. Matrix products are nearly all of a
// transformer step's FLOPs and the graph only runs float32, so the other
// routines (Sgemv, Sdot, the float64 and complex ones) stay in Go.
type fastBLAS struct {
	gonum.Implementation
}

// sgemmCalls counts fastBLAS.Sgemm calls, so a test can see that the
// graph's products really run on it.
var sgemmCalls atomic.Int64

// Sgemm implements blas.Float32 (row-major, like gonum's).
func (fastBLAS) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmCalls.Add(1)
	parallelSgemm(tA != blas.NoTrans, tB != blas.NoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

var useOnce sync.Once

// useFastBLAS installs fastBLAS in gorgonia and gorgonia/tensor (gorgonia.Use
// forwards to tensor.Use). Process-wide, like the BLAS choice of the
// hand-written path.
func useFastBLAS() { useOnce.Do(func() { gorgonia.Use(fastBLAS{}) }) }

// BLASName says which SGEMM the graph's matrix products run on.
func BLASName() string { return trainer.BLASName() }

// parallelSgemm splits a product by rows (or columns when wider) across
// GOMAXPROCS goroutines, as the hand-written path does, so that the two
// paths are compared on the same kernel and the same parallelism.
func parallelSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	w := runtime.GOMAXPROCS(0)
	if w <= 1 || 2*float64(m)*float64(n)*float64(k) < 4e6 {
		trainer.Sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	split := m >= n
	total := n
	if split {
		total = m
	}
	if w > total {
		w = total
	}
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		lo, hi := i*total/w, (i+1)*total/w
		wg.Add(1)
		go func() {
			defer wg.Done()
			if split {
				aOff := lo * lda
				if transA {
					aOff = lo
				}
				trainer.Sgemm(transA, transB, hi-lo, n, k, alpha, a[aOff:], lda, b, ldb, beta, c[lo*ldc:], ldc)
				return
			}
			bOff := lo
			if transB {
				bOff = lo * ldb
			}
			trainer.Sgemm(transA, transB, m, hi-lo, k, alpha, a, lda, b[bOff:], ldb, beta, c[lo:], ldc)
		}()
	}
	wg.Wait()
}
