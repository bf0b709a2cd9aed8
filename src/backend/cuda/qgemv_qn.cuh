/* The one- and two-row qkv product with the QK-norm in its tail (qgemv_p.cu; $G3_CUDA_QNTAIL=1): each block of the
 * persistent product counts itself done on a counter once its warps have added their sums into y; the last one runs
 * QK-norm + RoPE + cache write for every (row, head) (qkv_unit.cuh) and resets the counter, so the decode step needs
 * no QK-norm launch (g3c_qkv_post) between the qkv product and the attention. */
#pragma once

#include "backend/cuda/cuda_common.cuh"

typedef struct g3c_qn_tail {
    g3c_attn_args a;        /* the layer's attention arguments (a.nyv 0: q, k and v in the one product) */
    const float *qn, *kn;   /* q / k norm weights */
    float *qout;            /* normalized, rotated q: [m][NH][D] */
    unsigned *cnt;          /* zero between launches (the last block resets it) */
} g3c_qn_tail;

int g3c_qntail_enabled(void); /* $G3_CUDA_QNTAIL: 1 on; unset / 0 off */
/* 1 where the product takes the tail: the add-norm prologue product at 1-2 rows (g3c_qgemv_pn_supported), q, k and v in
 * it, heads of at most 256 values */
int g3c_qgemv_qn_ok(const g3_dmat *w, const g3c_attn_args *a, int m);
/* g3c_qgemv_pn (no GeGLU) with the tail; y: [m][(NH + 2 NKV) D], ldy = w->n */
cudaError_t g3c_qgemv_pn_qn(const g3_dmat *w, const g3c_qp_pre *pre, const g3c_qn_tail *qt, int m, float *y,
                            cudaStream_t st);
