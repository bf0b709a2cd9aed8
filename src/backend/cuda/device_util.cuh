/* Small device helpers shared by several kernel files (gemv.cu, qgemv.cu, qgemv_p.cu, kernels.cu, tc_gemv.cu,
 * tc_stage.cu, tc_q8.cu, tc_wg.cu): the tanh-approximated GELU of GeGLU, the streaming 16-byte weight load, the
 * 16-byte cp.async copy, the exact int32 -> float of the int8 tensor-core sums, the step schedule and output stage
 * of the persistent GEMV kernels, and the warp argmax (kernels.cu, decode_norm.cu, sample.cu).
 * Internal to src/backend/cuda. */
#ifndef G3_CUDA_DEVICE_UTIL_CUH
#define G3_CUDA_DEVICE_UTIL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* The warp's largest v and its lowest index i (v NaN never wins over a number): every lane gets them. The reduction of
 * the argmax kernels and of the device sampler's maximum. */
static __device__ __forceinline__ void g3c_warp_argmax(float &v, int &i) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
    }
}

/* gelu(x), tanh approximation (GeGLU's gate): 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715
 * x^3), as one exponential and one fast division (exp(-2u) = inf for very negative x gives -0) instead of tanhf's
 * polynomial and branches; the CPU kernels use the same form. gelu_tanh_ref: the tanhf form ($G3_CUDA_GELU=tanhf in
 * the many-row GeGLU kernel, for comparison). */
static __device__ __forceinline__ float gelu_tanh(float x) {
    return __fdividef(x, 1.f + __expf(-1.5957691216057308f * fmaf(0.044715f * x, x * x, x)));
}
static __device__ __forceinline__ float gelu_tanh_ref(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* A persistent GEMV warp's first step: warp gw of tw, over nrg row groups of spr steps each. sk (no GeGLU): an equal
 * contiguous range of the nrg * spr steps (left: its length), partial row groups added to y atomically (y holds zeros
 * on entry); else row groups gw + tw * j, whole, outputs stored (left unbounded). */
static __device__ __forceinline__ void g3c_warp_steps(int gw, int tw, int nrg, int spr, int sk, int &rg, int &s,
                                                      int &left) {
    rg = gw, s = 0, left = 0x7fffffff;
    if (sk) {
        const long long T = (long long)nrg * spr, t0 = T * gw / tw, t1 = T * (gw + 1) / tw;
        rg = (int)(t0 / spr), s = (int)(t0 % spr), left = (int)(t1 - t0);
    }
}

/* A persistent GEMV warp's finished row group n0 .. n0+R-1 (rows < n exist): acc[r][i] summed over the warp, times
 * sc[r], and acc zeroed; lane i < min(M, m) writes activation row i's outputs: added atomically (sk: the warp had
 * part of the rows' K, y holds zeros on entry), stored, or (geglu) pairs of gate row r and up row r + 1 as
 * y[i][(n0 + r) / 2] = gelu(gate) * up. */
template <int R, int M>
static __device__ __forceinline__ void g3c_rowgroup_out(float (&acc)[R][M], const float (&sc)[R], int lane, int m,
                                                        int n0, int n, int sk, int geglu, float *y, int ldy) {
    float v[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) {
            float t = acc[r][i];
#pragma unroll
            for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            v[r][i] = t * sc[r], acc[r][i] = 0.f;
        }
    if (lane < M && lane < m) {
#pragma unroll
        for (int i = 0; i < M; i++) {
            if (i != lane) continue;
            if (sk) {
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (n0 + r < n) atomicAdd(y + (size_t)i * ldy + n0 + r, v[r][i]);
            } else if (!geglu) {
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (n0 + r < n) y[(size_t)i * ldy + n0 + r] = v[r][i];
            } else {
#pragma unroll
                for (int r = 0; r < R; r += 2)
                    if (n0 + r + 1 < n) y[(size_t)i * ldy + (n0 + r) / 2] = gelu_tanh(v[r][i]) * v[r + 1][i];
            }
        }
    }
}

/* int32 -> float of the int8 tensor-core kernels' sums (tc_q8.cu, tc_wg.cu, tc_wg4.cu; |v| < 2^22, so exact): one
 * I2FP (sm_90). The magic-number add and subtraction used before (two instructions, on the belief that conversions
 * were a quarter-rate pipe) lost 0.3-3% (H200 session 26 run 03, A/B/A/B, tok/s: 27B int8 64 / 128 seqs 5498-5518 /
 * 6320-6340 against 5424-5434 / 6173-6176, int4 64 seqs 4753-4762 against 4684, 4B int8 +1-3%). */
static __device__ __forceinline__ float g3c_i2f_exact(int v) { return __int2float_rn(v); }

/* streamed weights: no L1 allocation (activations and scales keep L1), 256-byte L2 prefetch */
static __device__ __forceinline__ uint4 g3c_ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* 16 bytes global -> shared, asynchronous (cp.async, cached in L2 only); g3c_cp_commit closes a group of them */
static __device__ __forceinline__ void g3c_cp16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
/* 8 / 4 bytes global -> shared (cp.async.ca: the forms below 16 bytes) */
static __device__ __forceinline__ void g3c_cp8(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
}
static __device__ __forceinline__ void g3c_cp4(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}
static __device__ __forceinline__ void g3c_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Bulk copies (cp.async.bulk, the copy engine of sm_90) completing on an mbarrier in shared memory: init with an
 * arrival count (then g3c_mb_init_fence before the copy engine uses it), expect_tx (one arrival that also announces
 * the bytes to come), the copy (16-byte aligned, a multiple of 16 bytes), and the wait on a phase's parity.
 * g3c_fence_async orders this thread's earlier reads of shared memory before a later bulk copy into it. */
static __device__ __forceinline__ void g3c_mb_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(count)
                 : "memory");
}
/* before the mbarrier's shared memory is used for anything else */
static __device__ __forceinline__ void g3c_mb_inval(uint64_t *b) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
}
static __device__ __forceinline__ void g3c_mb_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
static __device__ __forceinline__ void g3c_mb_expect(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)),
                 "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void g3c_mb_wait(uint64_t *b, unsigned parity) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(b);
    asm volatile("{\n.reg .pred p;\nWAIT_%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(a),
                 "r"(parity)
                 : "memory");
}
static __device__ __forceinline__ void g3c_bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(b))
                 : "memory");
}
static __device__ __forceinline__ void g3c_fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

#endif
