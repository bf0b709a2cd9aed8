/* One-row decode attention with the o product fused in (attention_dec.cu, kernel side in attn_oproj.cuh): y[n] += the
 * o matrix . the attention's output (y zeroed before), o not written. g3c_attention_o_ok: taken for this row count,
 * cache and matrix (per-channel int8 or fp8, int4 in groups of 128; Gemma 3's head shapes; the slice fits shared
 * memory and the clusters fit the GPU), where $G3_CUDA_AOFUSE=1 (read at every call; off by default: measured slower,
 * bench/logs/2026-12-03-session36/). */
#ifndef G3_BACKEND_CUDA_ATTENTION_O_CUH
#define G3_BACKEND_CUDA_ATTENTION_O_CUH

#include "backend/cuda/cuda_common.cuh"

cudaError_t g3c_aop_init(void); /* the kernels' shared memory allowed (at create: not inside a graph capture) */
int g3c_attention_o_ok(const g3c_attn_args *a, const g3_dmat *w);
cudaError_t g3c_attention_o(const g3c_attn_args *a, const float *q, const g3_dmat *w, float *y, cudaStream_t st);

#endif
