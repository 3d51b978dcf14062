//go:build cgo && !noopenblas

package trainer

/*
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));

// gelu8 is tanhf and gelu of fastmath.go and ops.go on 8 lanes: e^2z by a
// degree-6 polynomial after reducing by multiples of ln 2, then
// (e − 1)/(e + 1), branch-free.
static inline __attribute__((always_inline)) void gelu8(const vf *u, vf *t, vf *g) {
	const vf zero = {0}, v = *u;
	vf z = 0.7978845608028654f * (v + 0.044715f * v * v * v);
	vi hi = z > 9.0f, lo = z < -9.0f;
	z = (vf)((hi & (vi)(zero + 9.0f)) | (lo & (vi)(zero - 9.0f)) | (~(hi | lo) & (vi)z));
	vf x = 2.0f * z;
	vi neg = x < 0.0f;
	vf h = (vf)((neg & (vi)(zero - 0.5f)) | (~neg & (vi)(zero + 0.5f)));
	vi k = __builtin_convertvector(x * 1.44269504088896341f + h, vi);
	vf kf = __builtin_convertvector(k, vf);
	vf r = x - kf * 0.693359375f - kf * -2.12194440e-4f;
	vf p = zero + 1.0f / 720;
	p = p * r + 1.0f / 120;
	p = p * r + 1.0f / 24;
	p = p * r + 1.0f / 6;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	vf e = p * (vf)((k + 127) << 23);
	*t = (e - 1.0f) / (e + 1.0f);
	*g = 0.5f * v * (1.0f + *t);
}

// gelu_fwd writes t = tanh(√(2/π)·(u + 0.044715·u³)) and g = ½·u·(1 + t)
// for n values, eight at a time, with AVX2 and FMA where the processor
// has them.
__attribute__((target_clones("arch=haswell", "default")))
static void gelu_fwd(const float *u, float *t, float *g, long n) {
	long i = 0;
	vf v, tv, gv;
	for (; i + 8 <= n; i += 8) {
		memcpy(&v, u + i, sizeof v);
		gelu8(&v, &tv, &gv);
		memcpy(t + i, &tv, sizeof tv);
		memcpy(g + i, &gv, sizeof gv);
	}
	if (i < n) {
		long rest = n - i;
		v = (vf){0};
		memcpy(&v, u + i, rest * sizeof(float));
		gelu8(&v, &tv, &gv);
		memcpy(t + i, &tv, rest * sizeof(float));
		memcpy(g + i, &gv, rest * sizeof(float));
	}
}
*/
import "C"

import "unsafe"

// geluForward sets t[i] = geluT(u[i]) and g[i] = gelu(u[i], t[i]); g may
// be u.
func geluForward(u, t, g []float32) {
	if len(u) == 0 {
		return
	}
	_, _ = t[len(u)-1], g[len(u)-1]
	C.gelu_fwd((*C.float)(unsafe.Pointer(&u[0])), (*C.float)(unsafe.Pointer(&t[0])), (*C.float)(unsafe.Pointer(&g[0])), C.long(len(u)))
}
