/* Quantization of activations for the int8 tensor-core products (tc_q8.cu), by the kernels that produce them (the
 * decode add-norm, GeGLU: from their float32 values), so that the product needs no quantization launch of its own, or
 * else by tc_q8.cu's k_tq_quant (from the bf16 copies): per row and block of 128 values d = amax/127,
 * q = rint(x * 127/amax), q stored [m][K] in the value order of the product that reads them (il 0: natural, for
 * int8 weights; 1: each 8 values as x0,x2,x4,x6,x1,x3,x5,x7, for int4 on tc_q8.cu; 2: the order of tc_wg4.cu's k
 * steps, for int4 on wgmma), (d, d * sum q) [m][K/128]. Value order 3 is no quantization: the values rounded to
 * bf16 [m][K] in tc_wgb.cu's k order (pairs of values moved whole), no (d, d * sum q). G3C_TQ_FP8 + mo: e4m3 hi + lo
 * parts for fp8 weights on tc_wg.cu (below).
 * record (cuda_forward.cu) takes it for the qkv, gate/up and down products on the int8 tensor cores ($G3_CUDA_TQPRE=0:
 * k_tq_quant before each, as before). Measured on the H200 (session 5, 27B, aggregate decode tok/s, argmax on the GPU,
 * off -> on): int4 32 seqs 2880 -> 2944, 64 seqs 3791 -> 3857; int8 32 seqs 2515 -> 2711, 64 seqs 3589 -> 3819. */
#ifndef G3_BACKEND_CUDA_TQ_ACT_CUH
#define G3_BACKEND_CUDA_TQ_ACT_CUH

#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda/tc_frag.cuh"

/* The 32 lanes of a warp hold the 128 values of one block, lane l values 4l..4l+3 (v); every lane calls, ok equal
 * across the warp. The block starts at value `off` of the buffer xq ([m][K] bytes, or bf16 values for il 3); xd: its
 * (d, d * sum q); il: the value order (above), or G3C_TQ_FP8 + mo: e4m3 hi + lo parts for tc_wg.cu's fp8 kernel
 * (natural order, d = amax/448, hi = e4m3(x/d) in this row, lo = e4m3(x/d - hi) in row r + mo, i.e. mo K bytes
 * further, (d, 0) at both rows' xd). */
#define G3C_TQ_FP8 4
static __device__ __forceinline__ void g3c_tq_quant4(float4 v, bool ok, int8_t *xq0, size_t off, float2 *xd, int il,
                                                     int K) {
    const int lane = threadIdx.x & 31;
    if (il == 3) { /* pair V (of 32) of each 64 values to position ((V & 7) << 2) | (V >> 3): tc_wgb.cu */
        if (!ok) return;
        uint32_t *p = (uint32_t *)((__nv_bfloat16 *)xq0 + off) + 32 * (lane >> 4);
        const __nv_bfloat162 h0 = __floats2bfloat162_rn(v.x, v.y), h1 = __floats2bfloat162_rn(v.z, v.w);
        const int V = (2 * lane) & 31;
        uint32_t u0, u1;
        memcpy(&u0, &h0, 4), memcpy(&u1, &h1, 4);
        p[((V & 7) << 2) | (V >> 3)] = u0, p[(((V + 1) & 7) << 2) | ((V + 1) >> 3)] = u1;
        return;
    }
    int8_t *xq = xq0 + off;
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (il >= G3C_TQ_FP8) {
        if (!ok) return;
        const size_t lo_off = (size_t)(il - G3C_TQ_FP8) * K;
        const float inv = amax > 0.f ? 448.f / amax : 0.f;
        const float q[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
        uint32_t hi = 0, lo = 0;
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const __nv_fp8x2_storage_t h =
                __nv_cvt_float2_to_fp8x2(make_float2(q[2 * p], q[2 * p + 1]), __NV_SATFINITE, __NV_E4M3);
            float b0, b1;
            tc_fp8x2(h, b0, b1);
            const __nv_fp8x2_storage_t l =
                __nv_cvt_float2_to_fp8x2(make_float2(q[2 * p] - b0, q[2 * p + 1] - b1), __NV_SATFINITE, __NV_E4M3);
            hi |= (uint32_t)h << (16 * p), lo |= (uint32_t)l << (16 * p);
        }
        ((uint32_t *)xq)[lane] = hi, ((uint32_t *)(xq + lo_off))[lane] = lo;
        if (lane == 0) {
            const float2 dd = make_float2(amax * (1.f / 448.f), 0.f);
            xd[0] = dd, xd[lo_off / 128] = dd;
        }
        return;
    }
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    const int q0 = __float2int_rn(v.x * inv), q1 = __float2int_rn(v.y * inv);
    const int q2 = __float2int_rn(v.z * inv), q3 = __float2int_rn(v.w * inv);
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const uint32_t p02 = (uint32_t)(q0 & 255) | (uint32_t)(q2 & 255) << 8;
    const uint32_t p13 = (uint32_t)(q1 & 255) | (uint32_t)(q3 & 255) << 8;
    const bool odd = lane & 1;
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? p02 : p13, 1); /* the pair's other half */
    if (!ok) return;
    if (il == 2) { /* tc_wg4.cu: value v at byte 32 ((v >> 3) & 3) + 16 (v & 1) + 4 (v >> 5) + ((v >> 1) & 3) */
        const int p0 = 32 * ((lane >> 1) & 3) + 4 * (lane >> 3) + 2 * (lane & 1);
        ((uint16_t *)xq)[p0 >> 1] = (uint16_t)p02, ((uint16_t *)xq)[(p0 >> 1) + 8] = (uint16_t)p13;
    } else {
        uint32_t word;
        if (il) word = odd ? (got | p13 << 16) : (p02 | got << 16); /* even: x0 x2 x4 x6, odd: x1 x3 x5 x7 */
        else word = p02 & 255 | (p13 & 255) << 8 | (p02 >> 8) << 16 | (p13 >> 8) << 24;
        ((uint32_t *)xq)[lane] = word;
    }
    if (lane == 0) {
        const float d = amax * (1.f / 127.f);
        *xd = make_float2(d, d * (float)sum);
    }
}

#endif
