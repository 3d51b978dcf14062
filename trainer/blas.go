package trainer

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// sgemm computes C = alpha·op(A)·op(B) + beta·C on row-major float32
// matrices, where op(X) is X or Xᵀ. A is m×k after op, B is k×n after op and
// C is m×n; lda, ldb and ldc are the row strides as stored.
//
// The implementation is chosen at build time: OpenBLAS through cgo (about
// ten times faster here) or gonum's pure-Go kernel.
func sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		if beta != 1 {
			for i := 0; i < m; i++ {
				row := c[i*ldc : i*ldc+n]
				for j := range row {
					row[j] *= beta
				}
			}
		}
		return
	}
	sgemmImpl(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// BLASName says which SGEMM implementation this binary uses.
func BLASName() string { return blasName }

// sgemmGonum is the pure-Go kernel, kept in every build so the benchmark can
// show both numbers side by side.
func sgemmGonum(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ta, tb := blas.NoTrans, blas.NoTrans
	if transA {
		ta = blas.Trans
	}
	if transB {
		tb = blas.Trans
	}
	gonum.Implementation{}.Sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}
