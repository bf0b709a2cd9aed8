/* Test hooks of the prefill attention and the many-row kernels of the CUDA backend (attention_prefill.cu): they run
 * the backend's own launchers on host data, so tests can compare them with CPU references. C-callable. */
#ifndef G3_BACKEND_CUDA_PREFILL_API_H
#define G3_BACKEND_CUDA_PREFILL_API_H

#include "backend/cuda/cuda_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Two steps over one paged cache: rows [0, m0) (QK-norm + RoPE + cache write only), then rows [m0, m) (the same,
 * then attention: the prefill path when flash, with its row plan, else the decode kernel). qkv: [m][(NH+2NKV)*D]
 * (fed to the kernels as two slices that must be zeroed); pos, useq: [m]; bt: [n_u][2][mbps]. o: [m - m0][NH*D];
 * *n_flash: rows of step 2 the plan gave to the flash kernel. Fails if the qkv slices were not zeroed. */
g3_status g3_cuda_test_prefill_attention(const g3_cuda_attn_test *t, const float *qkv, const int32_t *pos,
                                         const int32_t *useq, const int32_t *bt, int n_u, int m0, int m, int flash,
                                         float *o, int *n_flash, g3_error *err);

enum { G3C_TEST_ADD_NORM = 0, G3C_TEST_GEGLU = 1, G3C_TEST_TO_BF16 = 2, G3C_TEST_FINISH = 3 };
/* One row kernel (picked by m and $G3_CUDA_ROWK like the forward) on host data; y: [ny][m][n] in, left as the kernel
 * leaves it (zeros expected) on return.
 *   ADD_NORM: x [m][n] updated in place, w1, w2 [n], eps 1e-6; xn [m][n].
 *   GEGLU:    y holds (gate, up) pairs; xn = a [m][n/2].
 *   TO_BF16:  from x [m][n].
 *   FINISH:   xn = logits [m][n]; w1[0] = softcap (w1 NULL: none).
 * xh_f (optional): the bf16 copy as floats, hi rows then (split) lo rows, of the output width. */
g3_status g3_cuda_test_rows(int op, int m, int n, int ny, int split, float *x, float *y, const float *w1,
                            const float *w2, float *xn, float *xh_f, g3_error *err);
/* The same through the _f entry points with flags (ADD_NORM, GEGLU): KEEP_Y leaves y as it was, NO_F32 skips xn / a
 * (xn then returns NaNs where the kernel did not write). */
enum { G3C_TEST_KEEP_Y = 1, G3C_TEST_NO_F32 = 2 };
g3_status g3_cuda_test_rows_f(int op, int flags, int m, int n, int ny, int split, float *x, float *y,
                              const float *w1, const float *w2, float *xn, float *xh_f, g3_error *err);

#ifdef __cplusplus
}
#endif
#endif
