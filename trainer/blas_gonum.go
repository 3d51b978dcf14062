//go:build !cgo || noopenblas

package trainer

const blasName = "gonum"

func sgemmImpl(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmGonum(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SetBLASThreads is a no-op for the pure-Go kernel.
func SetBLASThreads(int) {}
