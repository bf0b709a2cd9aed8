/* Microbenchmark of the per-channel int8 wgmma product (tc_wg.cu, g3c_wg_mm) at the 27B matrix shapes (qkv, o,
 * gate/up, down; m <= 64 rows), against variants that each change one thing, to find what keeps it at ~0.6 of the
 * memory bandwidth. Columns (us per launch, GB/s of weight bytes):
 *   lib              g3c_wg_mm as the forward runs it (row-major weights, cp.async of 16 bytes from every thread)
 *   loads only       the same stage pattern and pipeline (128 rows x 128 B per stage), no MMA, no output
 *   x0               a copy of the library kernel (the baseline of x1..x5; its result is checked against lib)
 *   x1 / x2          x0 without the MMAs / without the scaling of the int32 sums
 *   x0 ST4           four stages, two blocks per SM
 *   x3               two accumulator sets (the MMAs of a stage in flight while the last one's sums are scaled);
 *                    ptxas serializes the wgmma here (C7514), so it measures nothing better than x0 ST4
 *   x4               16-byte reductions (red.global.add.v4.f32, lane pairs trading halves) instead of float2 atomics
 *   x5               no output at all (the sums only kept alive): the cost of writing y
 *   x6               x0 with the channel scales of the block's (first two) tiles in shared memory, loaded at the
 *                    start, so that writing a tile does not wait for global loads
 *   loads only, tiled (bulk)   each stage one contiguous 16 KB block of repacked weights, by cp.async (by one
 *                    cp.async.bulk with an mbarrier)
 *   wgt              the MMA kernel on the repacked weights with bulk copies
 * Findings on the H200 (session 8, bench/logs/2026-11-22-session8/, bench/RESULTS.md): the loads alone stream at
 * ~0.95 of the read bandwidth in every layout; MMAs and scaling are hidden (x1, x2 ~ x0); writing y cost ~20% of the
 * product (x5: gate/up 63 against 77-80 us), by atomics or by plain stores alike (a cluster variant that reduced each
 * tile through distributed shared memory and stored once was no faster for gate/up and slower in the forward), and
 * most of it was the wait for the channel scales read just before the output (x6), which the library now reads at
 * the block's start: its column equals x6 or better since. Checks x0, x3, x4, wgt and x6 against lib (max difference
 * relative to max |y|). Usage: g3wg_bench [rows 1..64, 64] [repetitions, 50] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/wgmma.cuh"

#include "dev_check.cuh"

#define T 128

static __device__ __forceinline__ void mb_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(count)
                 : "memory");
}
static __device__ __forceinline__ void mb_expect(uint64_t *b, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)),
                 "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mb_wait(uint64_t *b, int parity) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(b);
    asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(a),
                 "r"(parity)
                 : "memory");
}
static __device__ __forceinline__ void bulk_g2s(void *dst, const void *src, int bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(b))
                 : "memory");
}
static __device__ __forceinline__ void cp16pf(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
}

/* ---- loads only -------------------------------------------------------------------------------------------------- */
/* MODE 0 row-major cp.async, 1 tiled cp.async, 2 tiled bulk. ST stages of 16 KB weights + 8 KB activations (cp.async,
 * as the real kernel). Each stage's data is touched (one word per thread) so nothing is elided. */
template <int MODE, int ST>
__global__ void __launch_bounds__(T, 3) k_ld(const int8_t *W, const int8_t *xq, int n, int K, float *sink, int S,
                                             long long L) {
    extern __shared__ uint8_t raw[];
    const uint32_t rs = (uint32_t)__cvta_generic_to_shared(raw);
    uint8_t *sm = raw + (((rs + 1023u) & ~1023u) - rs);
    constexpr int SB = 24576;
    uint64_t *mb = (uint64_t *)(sm + ST * SB);
    const int tid = threadIdx.x;
    const long long u0 = L * blockIdx.x / gridDim.x, u1 = L * (blockIdx.x + 1) / gridDim.x;
    if (MODE == 2 && tid == 0)
        for (int i = 0; i < ST; i++) mb_init(mb + i, 1);
    if (MODE == 2) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    auto load = [&](long long u, int slot) {
        const int tile = (int)(u / S), st = (int)(u % S);
        uint8_t *dst = sm + slot * SB;
        if (MODE == 0) {
            for (int j = 0; j < 8; j++) {
                const int idx = tid + T * j, r = idx >> 3, c = idx & 7, row = min(tile * 128 + r, n - 1);
                cp16pf(dst + r * 128 + ((c ^ (r & 7)) << 4), W + (size_t)row * K + st * 128 + c * 16);
            }
        } else if (MODE == 1) {
            const int8_t *src = W + (size_t)u * 16384;
            for (int j = 0; j < 8; j++) g3c_cp16(dst + (tid + T * j) * 16, src + (tid + T * j) * 16);
        } else if (tid == 0) {
            mb_expect(mb + slot, 16384);
            bulk_g2s(dst, W + (size_t)u * 16384, 16384, mb + slot);
        }
        for (int j = 0; j < 4; j++) {
            const int idx = tid + T * j, r = idx >> 3, c = idx & 7;
            g3c_cp16(dst + 16384 + r * 128 + ((c ^ (r & 7)) << 4), xq + (size_t)r * K + st * 128 + c * 16);
        }
    };
    for (int i = 0; i < ST - 1; i++) {
        if (u0 + i < u1) load(u0 + i, i);
        g3c_cp_commit();
    }
    float acc = 0.f;
    int slot = 0;
    for (long long u = u0; u < u1; u++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
        if (MODE == 2) mb_wait(mb + slot, (int)(((u - u0) / ST) & 1));
        __syncthreads();
        acc += (float)sm[slot * SB + tid * 128 + (tid & 127)] + (float)sm[slot * SB + 16384 + tid * 64];
        __syncthreads();
        const int sn = slot == 0 ? ST - 1 : slot - 1;
        if (u + ST - 1 < u1) load(u + ST - 1, sn);
        g3c_cp_commit();
        slot = slot + 1 == ST ? 0 : slot + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (acc == 1234567.f) sink[blockIdx.x] = acc;
}

/* ---- pieces shared by the two MMA kernels below (both: BM = 64 tokens, stages of 16 KB weights + 8 KB activations) */
#define XB_SB 24576
#define XB_WB 16384
/* activation rows m..63 of every stage and their scales: zeros, never loaded */
static __device__ __forceinline__ void x_zero_pad(uint8_t *sm, float *ds, int st_count, int m) {
    for (int idx = threadIdx.x; idx < st_count * (64 - m) * 8; idx += T) {
        const int slot = idx / ((64 - m) * 8), rem = idx % ((64 - m) * 8), r = m + (rem >> 3);
        *(uint4 *)(sm + slot * XB_SB + XB_WB + r * 128 + ((rem & 7) << 4)) = make_uint4(0, 0, 0, 0);
    }
    for (int idx = threadIdx.x; idx < st_count * 64; idx += T)
        if (idx % 64 >= m) ds[idx] = 0.f;
}
/* stage st of the activations (m rows of 128 bytes, swizzled) and their d into ring slot `slot` */
static __device__ __forceinline__ void x_stage(uint8_t *sm, float *ds, const int8_t *xq, const float2 *xd, int m, int K,
                                               int st, int slot) {
    uint8_t *dst = sm + slot * XB_SB + XB_WB;
    for (int idx = threadIdx.x; idx < m * 8; idx += T) {
        const int r = idx >> 3, c = idx & 7;
        g3c_cp16(dst + r * 128 + ((c ^ (r & 7)) << 4), xq + (size_t)r * K + st * 128 + c * 16);
    }
    if ((int)threadIdx.x < m) g3c_cp4(ds + slot * 64 + threadIdx.x, &xd[(size_t)threadIdx.x * (K / 128) + st].x);
}
/* the four k steps of one stage into ai (wgmma group committed, not waited for) */
static __device__ __forceinline__ void x_mma(int (&ai)[64], const uint8_t *base) {
    const uint64_t db = wg_desc(base), da = wg_desc(base + XB_WB);
    wg_fence_regs(ai);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ks++) wg_mma_n128(ai, da + 2 * ks, db + 2 * ks, ks);
    wg_commit();
}

/* a finished tile's sums, times the channel scales (sc: the tile's 128 scales in shared memory, else from ws), added
 * into y (float2 atomics), and zeroed; tr: this thread's first token of the m64 fragment */
static __device__ __forceinline__ void x_out(float (&acc)[64], const float *ws, const float *sc, int tile, int n, int m,
                                             float *y, int tr) {
    const int ch0 = tile * 128 + 2 * (threadIdx.x & 3);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int ch = ch0 + 8 * j;
        if (ch >= n) continue;
        const float s0 = sc ? sc[ch - tile * 128] : __ldg(ws + ch);
        const float s1 = ch + 1 < n ? (sc ? sc[ch + 1 - tile * 128] : __ldg(ws + ch + 1)) : 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int tok = tr + 8 * h;
            if (tok < m)
                atomicAdd((float2 *)(y + (size_t)tok * n + ch),
                          make_float2(acc[4 * j + 2 * h] * s0, acc[4 * j + 2 * h + 1] * s1));
        }
    }
#pragma unroll
    for (int r = 0; r < 64; r++) acc[r] = 0.f;
}

/* ---- wgmma on the tiled weights (bulk copies) ---------------------------------------------------------------------- */
/* m <= 64 rows, BN = 128 channels; Wt: [tile][stage][128 rows][128 B pre-swizzled]; s: channel scales */
template <int ST>
__global__ void __launch_bounds__(T, 3) k_wgt(const int8_t *Wt, const float *ws, int n, int K, const int8_t *xq,
                                              const float2 *xd, int m, float *y, int S, long long L) {
    constexpr int SB = 24576, WB = 16384, BM = 64;
    extern __shared__ uint8_t raw[];
    const uint32_t rs = (uint32_t)__cvta_generic_to_shared(raw);
    uint8_t *sm = raw + (((rs + 1023u) & ~1023u) - rs);
    float *ds = (float *)(sm + ST * SB);
    uint64_t *mb = (uint64_t *)(ds + ST * BM);
    const int tid = threadIdx.x, wq = tid >> 5, lane = tid & 31;
    const long long u0 = L * blockIdx.x / gridDim.x, u1 = L * (blockIdx.x + 1) / gridDim.x;
    if (tid == 0) {
        for (int i = 0; i < ST; i++) mb_init(mb + i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    x_zero_pad(sm, ds, ST, m);
    __syncthreads();
    auto load_w = [&](long long u, int slot) {
        if (tid == 0) {
            mb_expect(mb + slot, WB);
            bulk_g2s(sm + slot * SB, Wt + (size_t)u * WB, WB, mb + slot);
        }
    };
    auto load_x = [&](long long u, int slot) { x_stage(sm, ds, xq, xd, m, K, (int)(u % S), slot); };
    for (int i = 0; i < ST - 1; i++)
        if (u0 + i < u1) load_w(u0 + i, i);
    g3c_pdl_wait();
    for (int i = 0; i < ST - 1; i++) {
        if (u0 + i < u1) load_x(u0 + i, i);
        g3c_cp_commit();
    }
    const int tr = 16 * wq + (lane >> 2);
    float acc[64];
    int ai[64];
#pragma unroll
    for (int r = 0; r < 64; r++) acc[r] = 0.f, ai[r] = 0;
    int slot = 0, ph = 0;
    for (long long u = u0; u < u1; u++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
        mb_wait(mb + slot, ph);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        {
            const int sn = slot == 0 ? ST - 1 : slot - 1;
            if (u + ST - 1 < u1) load_w(u + ST - 1, sn), load_x(u + ST - 1, sn);
            g3c_cp_commit();
        }
        x_mma(ai, sm + slot * SB);
        wg_wait0();
        wg_fence_regs(ai);
        {
            const float d0 = ds[slot * BM + tr], d1 = ds[slot * BM + tr + 8];
#pragma unroll
            for (int r = 0; r < 64; r++) acc[r] = fmaf((r & 2) ? d1 : d0, g3c_i2f_exact(ai[r]), acc[r]);
        }
        const int tile = (int)(u / S), st = (int)(u % S);
        if (u + 1 == u1 || st + 1 == S) x_out(acc, ws, nullptr, tile, n, m, y, tr);
        slot = slot + 1 == ST ? 0 : slot + 1;
        ph ^= slot == 0;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ---- the forward's kernel with one thing changed (row-major weights, cp.async from every thread, as tc_wg.cu) ---- */
/* VAR 0: as tc_wg.cu (one accumulator set: MMAs, wait, scale); 1: no MMAs (the scaling and the loop only);
 * 2: no scaling (MMAs and the loop only; wrong sums); 3: two accumulator sets, the MMAs of unit u in flight while the
 * sums of unit u - 1 are scaled (ST - 2 stages ahead: a stage is free only once its MMAs are known complete). */
template <int VAR, int ST, int BPS>
__global__ void __launch_bounds__(T, BPS) k_wgx(const int8_t *W, const float *ws, int n, int K, const int8_t *xq,
                                                const float2 *xd, int m, float *y, int S, long long L) {
    constexpr int SB = 24576, BM = 64, AHEAD = VAR == 3 ? ST - 2 : ST - 1;
    extern __shared__ uint8_t raw[];
    const uint32_t rs = (uint32_t)__cvta_generic_to_shared(raw);
    uint8_t *sm = raw + (((rs + 1023u) & ~1023u) - rs);
    float *ds = (float *)(sm + ST * SB);
    float *scs = ds + ST * BM; /* VAR 6: the channel scales of the block's first two tiles, loaded at the start */
    const int tid = threadIdx.x, wq = tid >> 5, lane = tid & 31;
    const long long u0 = L * blockIdx.x / gridDim.x, u1 = L * (blockIdx.x + 1) / gridDim.x;
    x_zero_pad(sm, ds, ST, m);
    const int tf = (int)(u0 / S), sc_ok = VAR == 6 && u1 > u0 && (int)((u1 - 1) / S) - tf < 2;
    if (sc_ok)
        for (int i = tid; i < 256; i += T) scs[i] = tf * 128 + i < n ? __ldg(ws + tf * 128 + i) : 0.f;
    auto load_w = [&](long long u, int slot) {
        const int tile = (int)(u / S), st = (int)(u % S);
        uint8_t *dst = sm + slot * SB;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int idx = tid + T * j, r = idx >> 3, c = idx & 7, row = tile * 128 + r;
            const int8_t *src = W + (size_t)(row < n ? row : 0) * K + st * 128 + c * 16;
            wg_cp16<true>(dst + r * 128 + ((c ^ (r & 7)) << 4), src, row < n ? 16 : 0);
        }
    };
    auto load_x = [&](long long u, int slot) { x_stage(sm, ds, xq, xd, m, K, (int)(u % S), slot); };
#pragma unroll
    for (int i = 0; i < AHEAD; i++)
        if (u0 + i < u1) load_w(u0 + i, i);
    g3c_pdl_wait();
#pragma unroll
    for (int i = 0; i < AHEAD; i++) {
        if (u0 + i < u1) load_x(u0 + i, i);
        g3c_cp_commit();
    }
    const int tr = 16 * wq + (lane >> 2);
    float acc[64];
    int a0[64], a1[64];
#pragma unroll
    for (int r = 0; r < 64; r++) acc[r] = 0.f, a0[r] = 0, a1[r] = 0;
    auto top = [&](long long u, int i) {
        asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - 1) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (u + AHEAD < u1) load_w(u + AHEAD, (i + AHEAD) % ST), load_x(u + AHEAD, (i + AHEAD) % ST);
        g3c_cp_commit();
    };
    auto mma = [&](int(&ai)[64], int slot) { x_mma(ai, sm + slot * SB); };
    auto scale = [&](int(&ai)[64], int slot) {
        wg_fence_regs(ai);
        const float d0 = ds[slot * BM + tr], d1 = ds[slot * BM + tr + 8];
#pragma unroll
        for (int r = 0; r < 64; r++) acc[r] = fmaf((r & 2) ? d1 : d0, g3c_i2f_exact(ai[r]), acc[r]);
    };
    auto flush = [&](long long u) {
        const int tile = (int)(u / S), st = (int)(u % S);
        if (VAR == 5 && (u + 1 == u1 || st + 1 == S)) { /* no output: the sums only kept alive */
            float t = 0.f;
#pragma unroll
            for (int r = 0; r < 64; r++) t += acc[r], acc[r] = 0.f;
            if (t == 1234567.f) y[tid] = t;
            return;
        }
        if (VAR == 4 && (u + 1 == u1 || st + 1 == S)) { /* 16-byte reductions: lane pairs trade halves */
            const int odd = lane & 1, c4 = tile * 128 + 4 * ((lane & 3) >> 1), tok = tr + 8 * odd;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float s0 = odd ? acc[4 * j] : acc[4 * j + 2], s1 = odd ? acc[4 * j + 1] : acc[4 * j + 3];
                const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                const int ch = c4 + 8 * j;
                if (ch >= n || tok >= m) continue;
                const float4 v = odd ? make_float4(r0, r1, acc[4 * j + 2], acc[4 * j + 3])
                                     : make_float4(acc[4 * j], acc[4 * j + 1], r0, r1);
                const float4 sc = make_float4(__ldg(ws + ch), __ldg(ws + ch + 1), __ldg(ws + ch + 2), __ldg(ws + ch + 3));
                float *p = y + (size_t)tok * n + ch;
                asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x * sc.x), "f"(v.y * sc.y),
                             "f"(v.z * sc.z), "f"(v.w * sc.w)
                             : "memory");
            }
#pragma unroll
            for (int r = 0; r < 64; r++) acc[r] = 0.f;
            return;
        }
        if (u + 1 == u1 || st + 1 == S) x_out(acc, ws, sc_ok ? scs + (tile - tf) * 128 : nullptr, tile, n, m, y, tr);
    };
    if constexpr (VAR != 3) {
        for (long long u = u0; u < u1; u++) {
            const int i = (int)(u - u0), slot = i % ST;
            top(u, i);
            if (VAR != 1) {
                mma(a0, slot);
                wg_wait0();
            }
            if (VAR != 2) scale(a0, slot);
            else wg_fence_regs(a0);
            flush(u);
        }
    } else {
        long long u = u0;
        for (; u + 1 < u1; u += 2) {
            const int i = (int)(u - u0);
            top(u, i);
            mma(a0, i % ST);
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (u > u0) scale(a1, (i + ST - 1) % ST), flush(u - 1);
            top(u + 1, i + 1);
            mma(a1, (i + 1) % ST);
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            scale(a0, i % ST), flush(u);
        }
        if (u < u1) {
            const int i = (int)(u - u0);
            top(u, i);
            mma(a0, i % ST);
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (u > u0) scale(a1, (i + ST - 1) % ST), flush(u - 1);
            wg_wait0();
            scale(a0, i % ST), flush(u);
        } else if (u1 > u0) {
            wg_wait0();
            scale(a1, (int)(u1 - 1 - u0) % ST), flush(u1 - 1);
        }
        wg_wait0();
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ---- helpers --------------------------------------------------------------------------------------------------- */
__global__ void k_fill(int8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = (int8_t)((int)(h % 255) - 127);
    }
}
/* row-major [n][K] -> [tile][stage][128][128 B swizzled], rows >= n zero */
__global__ void k_tile(const int8_t *W, int8_t *Wt, int n, int K) {
    const int S = K / 128;
    const size_t tot = (size_t)((n + 127) / 128) * S * 1024; /* 16-byte chunks */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < tot; i += (size_t)gridDim.x * blockDim.x) {
        const size_t u = i / 1024;
        const int w = (int)(i % 1024), r = w >> 3, cs = w & 7, c = cs ^ (r & 7); /* dst chunk cs holds src chunk c */
        const int tile = (int)(u / S), st = (int)(u % S), row = tile * 128 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row < n) v = *(const uint4 *)(W + (size_t)row * K + st * 128 + c * 16);
        *(uint4 *)(Wt + u * 16384 + r * 128 + cs * 16) = v;
    }
}
__global__ void k_stream(const uint4 *p, size_t n, float *sink) {
    uint32_t a = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = g3c_ld_stream(p + i);
        a ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (a == 0x12345678u) sink[0] = (float)a;
}

static cudaStream_t g_st;
template <typename F> static float timeit(int reps, F f) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    f();
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(a, g_st));
    for (int i = 0; i < reps; i++) f();
    CK(cudaEventRecord(b, g_st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaGetLastError());
    return ms * 1000.f / reps;
}

template <int MODE, int ST> static void setup_ld(int *bps) {
    const int smem = ST * 24576 + 1024 + 64;
    CK(g3c_smem_setup(k_ld<MODE, ST>, smem, T, bps));
}

int main(int argc, char **argv) {
    const int m = argc > 1 ? atoi(argv[1]) : 64, reps = argc > 2 ? atoi(argv[2]) : 50;
    if (m < 1 || m > 64 || reps < 1) {
        fprintf(stderr, "usage: g3wg_bench [rows 1..64] [repetitions]\n");
        return 2;
    }
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    struct { const char *name; int n, k; } sh[] = {{"qkv", 8192, 5376}, {"o", 5376, 4096}, {"gate/up", 43008, 5376},
                                                   {"down", 5376, 21504}};
    const size_t maxb = (size_t)43008 * 5376 + (1 << 20);
    int8_t *W, *Wt, *xq;
    float *ws, *y, *y2, *sink;
    float2 *xd;
    CK(cudaMalloc(&W, maxb));
    CK(cudaMalloc(&Wt, maxb + 16 * 16384));
    CK(cudaMalloc(&xq, (size_t)128 * 21504));
    CK(cudaMalloc(&ws, 43008 * 4));
    CK(cudaMalloc(&xd, (size_t)128 * 168 * 8));
    CK(cudaMalloc(&y, (size_t)128 * 43008 * 4));
    CK(cudaMalloc(&y2, (size_t)128 * 43008 * 4));
    CK(cudaMalloc(&sink, 4096));
    k_fill<<<1024, 256>>>(W, maxb, 1u), k_fill<<<256, 256>>>(xq, (size_t)128 * 21504, 2u);
    {
        float *h = (float *)malloc(43008 * 4);
        for (int i = 0; i < 43008; i++) h[i] = 1e-3f * (1 + i % 7);
        CK(cudaMemcpy(ws, h, 43008 * 4, cudaMemcpyHostToDevice));
        float2 *d = (float2 *)malloc((size_t)128 * 168 * 8);
        for (int i = 0; i < 128 * 168; i++) d[i] = make_float2(ldexpf(1.f, (i * 37) % 13 - 6), 0.f);
        CK(cudaMemcpy(xd, d, (size_t)128 * 168 * 8, cudaMemcpyHostToDevice));
        free(h), free(d);
    }
    CK(cudaDeviceSynchronize());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    g_st = st;
    /* plain streaming read over 8 GB-ish worth of reps of the largest matrix */
    const float ts = timeit(reps, [&] { k_stream<<<nsm * 8, 512, 0, st>>>((const uint4 *)W, maxb / 16, sink); });
    const double bw = maxb / (ts * 1e3);
    printf("stream read: %.0f GB/s (%zu MB)  m=%d reps=%d SMs=%d\n", bw, maxb >> 20, m, reps, nsm);
    CK(g3c_wg_init());
    int b_ld = 0, b_tl = 0, b_bk = 0, b_wgt = 0, bx[5] = {0, 0, 0, 0, 0};
    setup_ld<0, 3>(&b_ld), setup_ld<1, 3>(&b_tl), setup_ld<2, 3>(&b_bk);
    const int smem_wgt = 3 * 24576 + 3 * 64 * 4 + 1024 + 64;
    CK(g3c_smem_setup(k_wgt<3>, smem_wgt, T, &b_wgt));
    const int sm3 = 3 * 24576 + 3 * 64 * 4 + 1024, sm4 = 4 * 24576 + 4 * 64 * 4 + 1024;
    CK(g3c_smem_setup(k_wgx<0, 3, 3>, sm3, T, &bx[0]));
    CK(g3c_smem_setup(k_wgx<1, 3, 3>, sm3, T, &bx[1]));
    CK(g3c_smem_setup(k_wgx<2, 3, 3>, sm3, T, &bx[2]));
    CK(g3c_smem_setup(k_wgx<0, 4, 2>, sm4, T, &bx[3]));
    CK(g3c_smem_setup(k_wgx<3, 4, 2>, sm4, T, &bx[4]));
    int bx6 = 0;
    CK(g3c_smem_setup(k_wgx<6, 3, 3>, sm3 + 1024, T, &bx6));
    int bx45[2] = {0, 0};
    CK(g3c_smem_setup(k_wgx<4, 3, 3>, sm3, T, &bx45[0]));
    CK(g3c_smem_setup(k_wgx<5, 3, 3>, sm3, T, &bx45[1]));
    printf("blocks/SM: ld %d, x0 %d x1 %d x2 %d x0/4 %d x3/4 %d\n", b_ld, bx[0], bx[1], bx[2], bx[3], bx[4]);
    printf("| matrix | MB | lib us (GB/s) | loads only | x0 as lib | x1 no MMA | x2 no scaling | x0 ST4 2/SM | x3 two sets ST4 2/SM "
           "| x4 float4 reductions | x5 no output | loads only, tiled | loads only, tiled, bulk | wgt: tiled, bulk "
           "| x6: scales loaded at the start | x0, x3, x4, wgt, x6 max rel diff to lib |\n");
    for (auto &s : sh) {
        const int S = s.k / 128, tiles = (s.n + 127) / 128;
        const long long L = (long long)tiles * S;
        const double mb = (double)s.n * s.k;
        g3_dmat w;
        memset(&w, 0, sizeof w);
        w.qt = G3Q_INT8, w.n = s.n, w.k = s.k, w.g = s.k, w.q = W, w.s = ws;
        auto grid = [&](int bps) { long long g = (long long)nsm * bps; return (unsigned)(g > L ? L : g); };
        float t[13];
        k_tile<<<1024, 256, 0, st>>>(W, Wt, s.n, s.k);
        t[0] = timeit(reps, [&] { CK(g3c_wg_mm(&w, xq, xd, m, y, nsm, st)); });
        t[1] = timeit(reps, [&] { k_ld<0, 3><<<grid(b_ld), T, 3 * 24576 + 1088, st>>>(W, xq, s.n, s.k, sink, S, L); });
        t[2] = timeit(reps, [&] { k_wgx<0, 3, 3><<<grid(bx[0]), T, sm3, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[3] = timeit(reps, [&] { k_wgx<1, 3, 3><<<grid(bx[1]), T, sm3, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[4] = timeit(reps, [&] { k_wgx<2, 3, 3><<<grid(bx[2]), T, sm3, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[5] = timeit(reps, [&] { k_wgx<0, 4, 2><<<grid(bx[3]), T, sm4, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[6] = timeit(reps, [&] { k_wgx<3, 4, 2><<<grid(bx[4]), T, sm4, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[7] = timeit(reps, [&] { k_wgx<4, 3, 3><<<grid(bx45[0]), T, sm3, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[8] = timeit(reps, [&] { k_wgx<5, 3, 3><<<grid(bx45[1]), T, sm3, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[9] = timeit(reps, [&] { k_ld<1, 3><<<grid(b_tl), T, 3 * 24576 + 1088, st>>>(Wt, xq, s.n, s.k, sink, S, L); });
        t[10] = timeit(reps, [&] { k_ld<2, 3><<<grid(b_bk), T, 3 * 24576 + 1088, st>>>(Wt, xq, s.n, s.k, sink, S, L); });
        t[11] = timeit(reps, [&] { k_wgt<3><<<grid(b_wgt), T, smem_wgt, st>>>(Wt, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        t[12] = timeit(reps, [&] { k_wgx<6, 3, 3><<<grid(bx6), T, sm3 + 1024, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L); });
        /* correctness: one launch each into zeroed outputs */
        const size_t ny = (size_t)m * s.n;
        float *h1 = (float *)malloc(ny * 4), *h2 = (float *)malloc(ny * 4);
        double rel[5];
        CK(cudaMemsetAsync(y, 0, ny * 4, st));
        CK(g3c_wg_mm(&w, xq, xd, m, y, nsm, st));
        CK(cudaMemcpyAsync(h1, y, ny * 4, cudaMemcpyDeviceToHost, st));
        for (int v = 0; v < 5; v++) {
            CK(cudaMemsetAsync(y2, 0, ny * 4, st));
            if (v == 0) k_wgx<0, 3, 3><<<grid(bx[0]), T, sm3, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L);
            else if (v == 1) k_wgx<3, 4, 2><<<grid(bx[4]), T, sm4, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L);
            else if (v == 2) k_wgx<4, 3, 3><<<grid(bx45[0]), T, sm3, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L);
            else if (v == 3) k_wgt<3><<<grid(b_wgt), T, smem_wgt, st>>>(Wt, ws, s.n, s.k, xq, xd, m, y2, S, L);
            else k_wgx<6, 3, 3><<<grid(bx6), T, sm3 + 1024, st>>>(W, ws, s.n, s.k, xq, xd, m, y2, S, L);
            CK(cudaMemcpyAsync(h2, y2, ny * 4, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            double mx = 0, dm = 0;
            for (size_t q = 0; q < ny; q++) mx = fmax(mx, fabs(h1[q])), dm = fmax(dm, fabs(h1[q] - h2[q]));
            rel[v] = mx > 0 ? dm / mx : dm;
        }
        free(h1), free(h2);
        printf("| %s | %.0f |", s.name, mb / 1e6);
        for (int q = 0; q < 13; q++) printf(" %.1f (%.0f) |", t[q], mb / (t[q] * 1e3));
        printf(" %.1e, %.1e, %.1e, %.1e, %.1e |\n", rel[0], rel[1], rel[2], rel[3], rel[4]);
    }
    printf("(us per launch, GB/s of weight bytes in brackets; ratio to the stream read: divide by %.0f)\n", bw);
    return 0;
}
