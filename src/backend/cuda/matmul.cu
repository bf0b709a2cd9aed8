/* Picks the path of each matrix product: tensor-core kernels with weights decoded in registers (tc_gemv.cu) for
 * quantized weights in decode and small batches (up to 8 rows with hi + lo activations, up to 64 with bf16
 * activations), the CUDA-core GEMV (gemv.cu) for bf16 weights and the GGUF formats with small scale groups at
 * <= 8 rows ($G3_CUDA_TQG=0; by default those take the int8 tensor cores of tc_q8g.cu from 3 rows: g3c_tq_small),
 * and cuBLAS tensor-core GEMM beyond (bf16 weights directly; quantized weights dequantized to a bf16
 * scratch of one matrix first). With `split`, cuBLAS gets the bf16 activations as hi + lo halves stacked as 2m rows
 * of one GEMM, so the weights are read once and the product keeps ~16 bits of each activation.
 * Measured on the H200 (bench/RESULTS.md): for bf16 weights at batch 1 the CUDA-core GEMV streams faster than the
 * tensor-core kernel (27B: 64 against 53 tok/s), for int4 the tensor-core kernel wins (92 against 53).
 * Decode on int8/int4 weights at 1-2 rows: the dp4a kernels of qgemv.cu on q8-quantized activations; from 3 rows
 * (g3c_tq_min_rows: $G3_CUDA_TQMIN, $G3_CUDA_TQGMIN) the int8 tensor cores of tc_q8.cu / tc_q8g.cu (g3c_tq_small;
 * large int4 / int8 matrices at <= 8 rows on tc_q4r.cu, the weights straight into registers);
 * with $G3_CUDA_TQMIN=9 int4 keeps dp4a up to 8 rows and per-channel int8 up to 4 (tc_gemv.cu at 5..8).
 * $G3_CUDA_QGEMV=n takes dp4a up to n rows only (0: never, i.e. the choice below). fp8 (e4m3 per
 * channel) at 1-2 rows: the same persistent kernel on float16 products (qgemv_p.cu; 27B batch 1 128 against 106 tok/s
 * on the tensor-core kernel, H200 session 23).
 * bf16 weights take the tensor-core kernel from 5 rows ($G3_CUDA_BF16TC, below: the GEMV is bound by its float32
 * arithmetic there). $G3_CUDA_TC: 0 = the previous choice (GEMV up to 8 rows for bf16 and 16 for quantized, cuBLAS
 * beyond), all = tensor cores for bf16 weights at every row count; $G3_CUDA_FUSE=1 fuses GeGLU into the tensor-core
 * product (measured slightly slower). Read at every call, so tests and benchmarks can switch. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

static int tc_mode(void) { /* 0 off, 1 quantized weights (default), 2 all */
    const char *e = getenv("G3_CUDA_TC");
    return e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "all") ? 2 : 1;
}

/* $G3_CUDA_QGEMV: most rows on the dp4a path (qgemv.cu), 0 = off. Default: up to the row before the int8 tensor
 * cores take the format (g3c_tq_min_rows: 3 by default, so 2), else 4 for per-channel int8 and 8 for the rest, as
 * measured on the H200 (27B, aggregate decode tok/s, argmax on the GPU; session 10 run 05), the tensor-core kernel
 * (tc_gemv.cu, hi + lo activations) against dp4a: int8 8 seqs 669 against 605, 4 seqs 369 against 397; int4 8 seqs
 * 593 against 620, 4 seqs 405 against 481. */
static int qgemv_rows(const g3_dmat *w) {
    const char *e = getenv("G3_CUDA_QGEMV");
    if (!e || !*e) {
        const int tm = g3c_tq_min_rows(w), dflt = w->qt == G3Q_INT8 && w->g == w->k ? 4 : 8;
        /* int8 tensor cores from tm rows (tc_q8.cu, tc_q8g.cu) */
        return tm <= 8 && g3c_tq_small(w, tm) && tm - 1 < dflt ? tm - 1 : dflt;
    }
    int v = atoi(e);
    return v < 0 ? 0 : v > 8 ? 8 : v;
}

/* $G3_CUDA_BF16TC: fewest rows (up to 8) at which bf16 weights take the tensor-core kernel (tc_gemv.cu, hi + lo
 * activations) instead of the CUDA-core GEMV; default 5, 9 = never. Measured on the H200 (session 10 run 05, aggregate
 * decode tok/s, argmax on the GPU, tensor cores against GEMV): 27B 8 seqs 425 against 333, 4 seqs 222 against 224, 2
 * seqs 115 against 123, batch 1 58.1 against 73.2; 4B 8 seqs 2084 against 1753; 1B 5484 against 4416. */
static int bf16_tc_rows(void) {
    const char *e = getenv("G3_CUDA_BF16TC");
    return e && *e ? atoi(e) : 5;
}

static int qbig_enabled(void) { /* $G3_CUDA_QBIG=0: quantized decode batches beyond 64 rows on cuBLAS */
    const char *e = getenv("G3_CUDA_QBIG");
    return !(e && !strcmp(e, "0"));
}

int g3c_mm_path(const g3c_mm_ctx *c, const g3_dmat *w, int m) {
    const int quant = w->qt != G3Q_BF16;
    if (m <= qgemv_rows(w) && g3c_qgemv_supported(w, m)) return G3C_PATH_QGEMV;
    const int tc = tc_mode();
    if (tc && quant && g3c_tq_small(w, m)) return G3C_PATH_TC;
    if (!tc) {
        int lim = quant ? 16 : 8;
        return m <= lim || (quant && !c->wscratch) ? G3C_PATH_GEMV : G3C_PATH_CUBLAS;
    }
    if (m <= 8)
        return (quant || tc == 2 || m >= bf16_tc_rows()) && g3c_tc_supported(w, m, c->split) ? G3C_PATH_TC
                                                                                             : G3C_PATH_GEMV;
    if (quant && (m <= 64 || !c->wscratch) && g3c_tc_supported(w, 64, 0)) return G3C_PATH_TC;
    /* decode batches of 65..256 distinct sequences: per-channel int8 on wgmma (tc_wg.cu, launches of <= 128 rows),
     * the other quantized formats in launches of <= 128 (int4 in groups of 128 * j: tc_wgb.cu) or of 64 on the
     * 9..64-row kernels rather than cuBLAS on a bf16 copy of the weights ($G3_CUDA_QBIG=0: cuBLAS) */
    if (quant && m <= 256 && c->qact && g3c_wg_supported(w, 128)) return G3C_PATH_TC;
    if (quant && m <= 256 && c->qact && qbig_enabled() && g3c_tc_supported(w, 64, 0)) return G3C_PATH_TC;
    if (quant && !c->wscratch) return G3C_PATH_GEMV;
    return G3C_PATH_CUBLAS;
}

cudaError_t g3c_mm(const g3c_mm_ctx *c, const g3_dmat *w, const float *x, const __nv_bfloat16 *xh, int m, float *y,
                   int *ny, float *a, __nv_bfloat16 *ah, int geglu, int *fused) {
    *ny = 1;
    *fused = 0;
    const int path = g3c_mm_path(c, w, m);
    if (path == G3C_PATH_QGEMV) {
        if (geglu) {
            *fused = 1;
            return g3c_qgemv(w, x, w->k, m, a, w->n / 2, 1, c->q8, c->q8_bytes, c->st);
        }
        return g3c_qgemv(w, x, w->k, m, y, w->n, 0, c->q8, c->q8_bytes, c->st);
    }
    if (path == G3C_PATH_GEMV) {
        if (geglu) {
            *fused = 1;
            return g3c_gemv(w, x, w->k, m, a, w->n / 2, 1, c->st);
        }
        return g3c_gemv(w, x, w->k, m, y, w->n, 0, c->st);
    }
    if (path == G3C_PATH_TC) {
        if (g3c_tq_small(w, m)) return g3c_tq_mm(w, xh, m, y, c->n_sm, NULL, 0, c->st); /* hi rows of xh */
        const int sp = m <= 8 ? c->split : 0;
        if (m <= 64) {
            g3c_tc_geglu gg = {a, ah, c->tile_cnt, c->split};
            const char *fe = getenv("G3_CUDA_FUSE");
            const int fuse = fe && !strcmp(fe, "1") && geglu && a && ah && c->tile_cnt && g3c_tc_tiles(w, m, sp) <= c->tile_cnt_n;
            *fused = fuse ? 2 : 0;
            return g3c_tc_mm(w, xh, m, sp, y, fuse ? &gg : NULL, c->n_sm, c->st);
        }
        /* equal launches (>= 33 rows each) of <= 128 rows on wgmma for decode batches on per-channel int8, int4
         * and fp8 (tc_wg.cu, tc_wgb.cu, tc_wg.cu's two-warpgroup e4m3 kernel: g3c_tq_mm), else of <= 64 on the
         * 9..64-row kernels; plain activations: hi rows [0, m) of xh */
        const int wgp = c->qact && (g3c_wg_supported(w, 128) || g3c_wgb_supported(w, 128) || g3c_wgf_supported(w, 128)),
                  lim = wgp ? 128 : 64;
        const int nl = (m + lim - 1) / lim, per = (m + nl - 1) / nl;
        /* fp8 in launches of <= 64 ($G3_CUDA_WGF2=0): the e4m3 kernel (tc_wg.cu, each launch quantizing its own
         * rows) on matrices of 16 M weights or more ($G3_CUDA_WGFW), the staged kernel on smaller ones (measured on
         * the H100, session 16 run 05: 1B fp8 at 128 seqs 6% slower with every product on the e4m3 kernel, 4B 9% and
         * 27B 29% faster) */
        const int f8_staged = w->qt == G3Q_FP8 && !g3c_wgf_big(w);
        for (int i0 = 0; i0 < m; i0 += per) {
            const int mm = m - i0 < per ? m - i0 : per;
            const __nv_bfloat16 *xi = xh + (size_t)i0 * w->k;
            float *yi = y + (size_t)i0 * w->n;
            cudaError_t e = wgp                                       ? g3c_tq_mm(w, xi, mm, yi, c->n_sm, NULL, 0, c->st)
                            : f8_staged && g3c_tcm_supported(w, mm) ? g3c_tcm_mm(w, xi, mm, yi, c->n_sm, c->st)
                                                                      : g3c_tc_mm(w, xi, mm, 0, yi, NULL, c->n_sm, c->st);
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
    const __nv_bfloat16 *W = (const __nv_bfloat16 *)w->q;
    if (w->qt != G3Q_BF16) {
        cudaError_t e = g3c_dequant_bf16(w, c->wscratch, c->st);
        if (e != cudaSuccess) return e;
        W = c->wscratch;
    }
    int rows = c->split ? 2 * m : m;
    const float alpha = 1.f, beta = 0.f;
    /* column-major view: Y^T (n x rows) = W (k x n)^T * X^T (k x rows) */
    cublasStatus_t s = cublasGemmEx(c->cub, CUBLAS_OP_T, CUBLAS_OP_N, w->n, rows, w->k, &alpha, W, CUDA_R_16BF, w->k,
                                    xh, CUDA_R_16BF, w->k, &beta, y, CUDA_R_32F, w->n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    if (c->split) *ny = 2;
    return cudaGetLastError();
}
