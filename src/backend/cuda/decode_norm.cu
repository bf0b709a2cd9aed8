/* Residual add + post-norm + next pre-norm for decode-sized batches (the latency-bound case): one 512-thread block
 * per row of H floats (H % 4 == 0, H <= 8192), the row held in registers as float4s, the two norm weights loaded
 * before the programmatic-dependent-launch wait (they do not depend on the previous kernel), one barrier per
 * reduction. Same contract as g3c_add_norm (kernels.cu): reads the ny slices of y [ny][m][H] and zeroes them,
 * x[r] += rms(sum) * w1, xn[r] = rms(x[r]) * w2 and its bf16 copies (hi rows, then lo rows at +m when split; with
 * the int8 copy for a quantized product, xn and the bf16 copies only where asked for).
 * Also the greedy pick of decode steps (argmax over the logits of a row, one block per row streaming it with float4
 * loads) and the test hooks g3_cuda_test_add_norm and g3_cuda_test_argmax. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/tq_act.cuh"
extern "C" {
#include "backend/cuda/cuda_api.h"
}

#define DN_T 512 /* threads per row */

/* Sum over the block of v (every thread passes its part); red: DN_T/32 floats used by this reduction only. */
__device__ __forceinline__ float dn_sum(float v, float *red) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[threadIdx.x & (DN_T / 32 - 1)];
    for (int o = DN_T / 64; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ void dn_put_bf16(__nv_bfloat16 *xh, size_t idx, size_t lo_off, int split, float4 v) {
    __nv_bfloat162 h0 = __floats2bfloat162_rn(v.x, v.y), h1 = __floats2bfloat162_rn(v.z, v.w);
    uint2 hv;
    memcpy(&hv.x, &h0, 4), memcpy(&hv.y, &h1, 4);
    *(uint2 *)(xh + idx) = hv;
    if (split) {
        float2 f0 = __bfloat1622float2(h0), f1 = __bfloat1622float2(h1);
        __nv_bfloat162 l0 = __floats2bfloat162_rn(v.x - f0.x, v.y - f0.y);
        __nv_bfloat162 l1 = __floats2bfloat162_rn(v.z - f1.x, v.w - f1.y);
        uint2 lv;
        memcpy(&lv.x, &l0, 4), memcpy(&lv.y, &l1, 4);
        *(uint2 *)(xh + lo_off + idx) = lv;
    }
}

/* grid m, block DN_T: row r; thread t holds float4s t + DN_T*e, e < V4 (V4 * 4 * DN_T >= H). */
/* xq (optional, H % 128 == 0): xn also quantized for the int8 tensor-core product (tq_act.cuh); for each e the 32
 * lanes of a warp hold float4s i4 = warp * 32 + lane + DN_T * e, one block of 128 values. */
template <int V4>
__global__ void __launch_bounds__(DN_T) k_add_norm_dec(float *x, float *y, int ny, const float *__restrict__ w1,
                                                       const float *__restrict__ w2, float eps, int m, int H,
                                                       float *xn, __nv_bfloat16 *xh, int split, int8_t *xq,
                                                       float2 *xd, int il) {
    __shared__ float red1[DN_T / 32], red2[DN_T / 32];
    const int r = blockIdx.x, H4 = H / 4;
    float4 a1[V4], a2[V4];
#pragma unroll
    for (int e = 0; e < V4; e++) { /* constants: before the wait, overlapping the previous kernel's tail */
        const int i4 = threadIdx.x + DN_T * e;
        if (i4 < H4) a1[e] = __ldg((const float4 *)w1 + i4), a2[e] = __ldg((const float4 *)w2 + i4);
        else a1[e] = a2[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    g3c_pdl_wait();
    const size_t sl4 = (size_t)m * H4, row4 = (size_t)r * H4;
    float4 *y4 = (float4 *)y + row4, *x4 = (float4 *)x + row4;
    float4 v[V4], xv[V4];
    /* every load of the first slice and of x issued at once (a loop over the ny slices inside each e issued them a
     * memory round trip apart: sm_90a SASS), the further slices after */
#pragma unroll
    for (int e = 0; e < V4; e++) {
        const int i4 = threadIdx.x + DN_T * e;
        v[e] = xv[e] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i4 < H4) v[e] = y4[i4], xv[e] = x4[i4];
    }
    for (int j = 1; j < ny; j++)
#pragma unroll
        for (int e = 0; e < V4; e++) {
            const int i4 = threadIdx.x + DN_T * e;
            if (i4 < H4) {
                const float4 t = y4[j * sl4 + i4];
                v[e].x += t.x, v[e].y += t.y, v[e].z += t.z, v[e].w += t.w;
            }
        }
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < V4; e++) ss += v[e].x * v[e].x + v[e].y * v[e].y + v[e].z * v[e].z + v[e].w * v[e].w;
#pragma unroll
    for (int e = 0; e < V4; e++) { /* the product's output goes back to zero */
        const int i4 = threadIdx.x + DN_T * e;
        if (i4 < H4)
            for (int j = 0; j < ny; j++) y4[j * sl4 + i4] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float inv = 1.f / sqrtf(dn_sum(ss, red1) / (float)H + eps);
    float s2 = 0.f;
#pragma unroll
    for (int e = 0; e < V4; e++) {
        const int i4 = threadIdx.x + DN_T * e;
        if (i4 < H4) {
            xv[e].x += v[e].x * inv * a1[e].x, xv[e].y += v[e].y * inv * a1[e].y;
            xv[e].z += v[e].z * inv * a1[e].z, xv[e].w += v[e].w * inv * a1[e].w;
            x4[i4] = xv[e];
        }
        s2 += xv[e].x * xv[e].x + xv[e].y * xv[e].y + xv[e].z * xv[e].z + xv[e].w * xv[e].w;
    }
    const float inv2 = 1.f / sqrtf(dn_sum(s2, red2) / (float)H + eps);
#pragma unroll
    for (int e = 0; e < V4; e++) {
        const int i4 = threadIdx.x + DN_T * e;
        const float4 o = make_float4(xv[e].x * inv2 * a2[e].x, xv[e].y * inv2 * a2[e].y, xv[e].z * inv2 * a2[e].z,
                                     xv[e].w * inv2 * a2[e].w);
        if (i4 < H4) {
            if (xn) ((float4 *)xn)[row4 + i4] = o;
            if (xh) dn_put_bf16(xh, (size_t)r * H + 4 * (size_t)i4, (size_t)m * H, split, o);
        }
        if (xq) { /* whole warps in or out: H4 % 32 == 0 */
            const int b = i4 >> 5;
            g3c_tq_quant4(o, i4 < H4, xq, (size_t)r * H + 128 * (size_t)b, xd + (size_t)r * (H / 128) + b, il, H);
        }
    }
}

/* ids[r] = argmax_v logits[r][v] (first index of the maximum; NaN never wins), one 1024-thread block per row:
 * float4 loads, eight in flight per thread, so one SM streams the row (V = 262144: 1 MB) instead of a 256-thread
 * loop of dependent scalar loads. V % 4 == 0 (rows 16-byte aligned). */
#define AM_T 1024
__global__ void __launch_bounds__(AM_T) k_argmax_dec(const float *__restrict__ logits, int V, int32_t *ids) {
    __shared__ float bv[AM_T / 32];
    __shared__ int bi[AM_T / 32];
    g3c_pdl_wait();
    const float4 *l4 = (const float4 *)(logits + (size_t)blockIdx.x * V);
    const int V4 = V / 4;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int b = threadIdx.x; b < V4; b += 8 * AM_T) { /* this thread's float4s b, b + AM_T, ... in order */
        float4 v[8];
#pragma unroll
        for (int h = 0; h < 8; h++) {
            const int i4 = b + h * AM_T;
            v[h] = i4 < V4 ? __ldcs(l4 + i4) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        }
#pragma unroll
        for (int h = 0; h < 8; h++) {
            const int i = 4 * (b + h * AM_T);
            if (v[h].x > best) best = v[h].x, idx = i;
            if (v[h].y > best) best = v[h].y, idx = i + 1;
            if (v[h].z > best) best = v[h].z, idx = i + 2;
            if (v[h].w > best) best = v[h].w, idx = i + 3;
        }
    }
    g3c_warp_argmax(best, idx);
    if ((threadIdx.x & 31) == 0) bv[threadIdx.x >> 5] = best, bi[threadIdx.x >> 5] = idx;
    __syncthreads();
    if (threadIdx.x < 32) {
        best = bv[threadIdx.x], idx = bi[threadIdx.x];
        g3c_warp_argmax(best, idx);
        if (threadIdx.x == 0) ids[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}

cudaError_t g3c_argmax_dec(const float *logits, int m, int V, int32_t *ids, cudaStream_t st) {
    if (V % 4 || ((uintptr_t)logits & 15) || m < 1) return g3c_argmax(logits, m, V, ids, st);
    return g3c_launch(k_argmax_dec, dim3(m), dim3(AM_T), 0, st, logits, V, ids);
}

int g3c_dnorm_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("G3_CUDA_DNORM");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

cudaError_t g3c_add_norm_dec_tq(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m,
                                int H, float *xn, __nv_bfloat16 *xh, int split, int8_t *xq, float2 *xd, int il,
                                cudaStream_t st) {
    const int v4 = (H / 4 + DN_T - 1) / DN_T;
    const int aligned = !(((uintptr_t)x | (uintptr_t)y | (uintptr_t)w1 | (uintptr_t)w2 | (uintptr_t)xn) & 15) &&
                        !((uintptr_t)xh & 7);
    if (H % 4 || H > 4 * DN_T * 4 || ny < 1 || !aligned) {
        if (xq) return cudaErrorInvalidValue;
        return g3c_add_norm(x, y, ny, w1, w2, eps, m, H, xn, xh, split, st);
    }
    if (xq && H % 128) return cudaErrorInvalidValue;
    void (*k)(float *, float *, int, const float *, const float *, float, int, int, float *, __nv_bfloat16 *, int,
              int8_t *, float2 *, int) =
        v4 <= 1 ? k_add_norm_dec<1> : v4 == 2 ? k_add_norm_dec<2> : v4 == 3 ? k_add_norm_dec<3> : k_add_norm_dec<4>;
    return g3c_launch(k, dim3(m), dim3(DN_T), 0, st, x, y, ny, w1, w2, eps, m, H, xn, xh, split, xq, xd, il);
}
cudaError_t g3c_add_norm_dec(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m, int H,
                             float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st) {
    return g3c_add_norm_dec_tq(x, y, ny, w1, w2, eps, m, H, xn, xh, split, NULL, NULL, 0, st);
}

/* ---- test hook ------------------------------------------------------------------------------------------------ */
#define DN_CK(call, what) G3C_CK_GOTO(call, "add_norm test: " what, out)

extern "C" g3_status g3_cuda_test_add_norm(int variant, int m, int H, int ny, const float *y, float *x,
                                           const float *w1, const float *w2, float eps, int split, float *xn,
                                           uint16_t *xh, float *y_after, g3_error *err) {
    g3_status rc = G3_OK;
    float *dx = NULL, *dy = NULL, *dw = NULL, *dxn = NULL;
    __nv_bfloat16 *dxh = NULL;
    const size_t n = (size_t)m * H, nh = (split ? 2 : 1) * n;
    cudaStream_t st = NULL;
    DN_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    DN_CK(cudaMalloc((void **)&dx, n * 4), "alloc");
    DN_CK(cudaMalloc((void **)&dy, n * ny * 4), "alloc");
    DN_CK(cudaMalloc((void **)&dw, (size_t)2 * H * 4), "alloc");
    DN_CK(cudaMalloc((void **)&dxn, n * 4), "alloc");
    DN_CK(cudaMalloc((void **)&dxh, nh * 2), "alloc");
    DN_CK(cudaMemset(dxn, 0xff, n * 4), "poison");
    DN_CK(cudaMemset(dxh, 0xff, nh * 2), "poison");
    DN_CK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice), "upload");
    DN_CK(cudaMemcpy(dy, y, n * ny * 4, cudaMemcpyHostToDevice), "upload");
    DN_CK(cudaMemcpy(dw, w1, (size_t)H * 4, cudaMemcpyHostToDevice), "upload");
    DN_CK(cudaMemcpy(dw + H, w2, (size_t)H * 4, cudaMemcpyHostToDevice), "upload");
    DN_CK(cudaDeviceSynchronize(), "upload"); /* legacy-stream copies before the kernels on st (non-blocking) */
    if (variant == 1) DN_CK(g3c_add_norm_dec(dx, dy, ny, dw, dw + H, eps, m, H, dxn, dxh, split, st), "launch");
    else DN_CK(g3c_add_norm(dx, dy, ny, dw, dw + H, eps, m, H, dxn, dxh, split, st), "launch");
    DN_CK(cudaStreamSynchronize(st), "run");
    DN_CK(cudaMemcpy(x, dx, n * 4, cudaMemcpyDeviceToHost), "download");
    DN_CK(cudaMemcpy(xn, dxn, n * 4, cudaMemcpyDeviceToHost), "download");
    DN_CK(cudaMemcpy(xh, dxh, nh * 2, cudaMemcpyDeviceToHost), "download");
    DN_CK(cudaMemcpy(y_after, dy, n * ny * 4, cudaMemcpyDeviceToHost), "download");
out:
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(dxn), cudaFree(dxh);
    if (st) cudaStreamDestroy(st);
    return rc;
}

extern "C" g3_status g3_cuda_test_argmax(int variant, const float *logits, int m, int V, int32_t *ids,
                                         g3_error *err) {
    g3_status rc = G3_OK;
    float *dl = NULL;
    int32_t *di = NULL;
    cudaStream_t st = NULL;
    DN_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    DN_CK(cudaMalloc((void **)&dl, (size_t)m * V * 4), "alloc");
    DN_CK(cudaMalloc((void **)&di, (size_t)m * 4), "alloc");
    DN_CK(cudaMemset(di, 0xff, (size_t)m * 4), "poison");
    DN_CK(cudaMemcpy(dl, logits, (size_t)m * V * 4, cudaMemcpyHostToDevice), "upload");
    DN_CK(cudaDeviceSynchronize(), "upload"); /* legacy-stream copies before the kernels on st (non-blocking) */
    if (variant == 1) DN_CK(g3c_argmax_dec(dl, m, V, di, st), "launch");
    else DN_CK(g3c_argmax(dl, m, V, di, st), "launch");
    DN_CK(cudaStreamSynchronize(st), "run");
    DN_CK(cudaMemcpy(ids, di, (size_t)m * 4, cudaMemcpyDeviceToHost), "download");
out:
    cudaFree(dl), cudaFree(di);
    if (st) cudaStreamDestroy(st);
    return rc;
}
