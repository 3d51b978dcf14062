//go:build cgo && !noopenblas

package trainer

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import (
	"os"
	"unsafe"
)

const blasName = "openblas"

func sgemmImpl(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ta, tb := uint32(C.CblasNoTrans), uint32(C.CblasNoTrans)
	if transA {
		ta = uint32(C.CblasTrans)
	}
	if transB {
		tb = uint32(C.CblasTrans)
	}
	C.cblas_sgemm(C.CblasRowMajor, C.enum_CBLAS_TRANSPOSE(ta), C.enum_CBLAS_TRANSPOSE(tb),
		C.blasint(m), C.blasint(n), C.blasint(k), C.float(alpha),
		(*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb), C.float(beta),
		(*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}

// SetBLASThreads bounds the threads OpenBLAS uses for one call.
func SetBLASThreads(n int) { C.openblas_set_num_threads(C.int(n)) }

// The policy's matrices are small (tens to hundreds of rows): OpenBLAS's
// thread hand-off costs more than it gains there (measured: a GRPO step ran
// twice as fast on one thread), and the sampler and trainer already run
// concurrently. OPENBLAS_NUM_THREADS still wins when set.
func init() {
	if os.Getenv("OPENBLAS_NUM_THREADS") == "" {
		SetBLASThreads(1)
	}
}
