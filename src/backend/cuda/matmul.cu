/* Picks the path of each matrix product: the GEMV kernels (float32 activations, weights decoded in registers) for
 * few rows, cuBLAS tensor-core GEMM for many (bf16 weights directly; quantized weights dequantized to a bf16
 * scratch first). With `split`, the bf16 activations go in as hi + lo halves stacked as 2m rows of one GEMM, so
 * the weights are read once and the product keeps ~16 bits of each activation. */
#include "backend/cuda/cuda_common.cuh"

int g3c_gemv_limit(int qt) {
    switch (qt) {
    case G3Q_BF16: return 8;
    default: return 16; /* beyond: one dequantization to bf16 + cuBLAS beats 3+ GEMV passes */
    }
}

int g3c_mm_uses_gemv(const g3c_mm_ctx *c, const g3_dmat *w, int m) {
    return m <= g3c_gemv_limit(w->qt) || (w->qt != G3Q_BF16 && !c->wscratch);
}

cudaError_t g3c_mm(const g3c_mm_ctx *c, const g3_dmat *w, const float *x, const __nv_bfloat16 *xh, int m, float *y,
                   const float **y2, int geglu, int *fused) {
    *y2 = NULL;
    *fused = 0;
    if (g3c_mm_uses_gemv(c, w, m)) {
        *fused = geglu;
        return g3c_gemv(w, x, w->k, m, y, geglu ? w->n / 2 : w->n, geglu, c->st);
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
    if (c->split) *y2 = y + (size_t)m * w->n;
    return cudaGetLastError();
}
