package ggraph

import (
	"sync"
	"sync/atomic"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"

	"github.com/flywheel-ai/flywheel/trainer"
)

// fastBLAS is the BLAS gorgonia and gorgonia/tensor call: gonum's pure-Go
// implementation for everything, with SGEMM replaced by the kernel the
// hand-written passes use (OpenBLAS through cgo, see trainer.BLASName),
// split across the same goroutines (trainer.SetParallelism). Matrix
// products are nearly all of a transformer step's FLOPs and the graph only
// runs float32, so the other routines (Sgemv, Sdot, the float64 and complex
// ones) stay in Go.
type fastBLAS struct {
	gonum.Implementation
}

// sgemmCalls counts fastBLAS.Sgemm calls, so a test can see that the
// graph's products really run on it.
var sgemmCalls atomic.Int64

// Sgemm implements blas.Float32 (row-major, like gonum's).
func (fastBLAS) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmCalls.Add(1)
	trainer.ParallelSgemm(tA != blas.NoTrans, tB != blas.NoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

var useOnce sync.Once

// useFastBLAS installs fastBLAS in gorgonia and gorgonia/tensor (gorgonia.Use
// forwards to tensor.Use). Process-wide, like the BLAS choice of the
// hand-written path.
func useFastBLAS() { useOnce.Do(func() { gorgonia.Use(fastBLAS{}) }) }

// BLASName says which SGEMM the graph's matrix products run on.
func BLASName() string { return trainer.BLASName() }
