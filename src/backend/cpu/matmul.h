/* Matrix multiplication on the CPU against weights in any supported type, with SIMD kernels picked at run time.
 *
 *   Y[m][n] = X[m][k] · W[n][k]^T       W: n rows (output channels) of k values, each row contiguous in its
 *                                        stored type (HF [out, in] / GGUF ne0 = k, ne1 = n); X, Y float32.
 *
 * Float weights (F32/F16/BF16) multiply float32 activations (exact products, f32 accumulation). Quantized
 * weights (Q8_0, Q4_0, Q4_K, Q6_K) multiply activations quantized once per call to 8-bit blocks (Q8_0 or Q8_K),
 * so that the inner loop is an integer dot product. Preparing X once lets several weights share it (Q, K, V). */
#ifndef G3_BACKEND_CPU_MATMUL_H
#define G3_BACKEND_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"

typedef struct g3_act {
    uint32_t wtype;   /* weight type these activations were prepared for */
    int m, k;
    const float *x;   /* [m][k] float32 (kept for float weights) */
    void *q;          /* quantized copy (quantized weights), in the scratch given to prepare */
    int layout;       /* private: how q is laid out (kernels.h) */
    size_t xs;        /* private: bytes between prepared rows */
    const void *kset; /* private: the kernel set it was prepared for */
} g3_act;

/* Scratch bytes that g3_act_prepare needs for m rows of k values against weights of type wtype. */
size_t g3_act_scratch_bytes(uint32_t wtype, int m, int k);
/* Prepares X for weights of type wtype (quantizes it if needed), in parallel. x must outlive a. */
void g3_act_prepare(g3_pool *p, g3_act *a, uint32_t wtype, const float *x, int m, int k, void *scratch);
/* Y = X·W^T for W of n rows; y row i starts at y + i*ldy. Parallel over n (and m for large m). */
void g3_matmul(g3_pool *p, const g3_act *a, const void *w, int n, float *y, int ldy);

/* Name of the kernel set chosen for this CPU ("avx512", "avx2", "scalar"); G3_CPU_KERNELS=scalar|avx2 forces one. */
const char *g3_cpu_kernels_name(void);
/* Switches the kernel set for later prepare/matmul calls (tests, benchmarks); -1 if this CPU or build lacks it.
 * Not to be called while a matmul runs. Activations already prepared keep the set they were prepared for. */
int g3_cpu_kernels_select(const char *name);
/* Decodes prepared row r back to floats (what the kernels actually multiply): for tests. */
void g3_act_dequant_row(const g3_act *a, int r, float *out);

#endif
