/* The o product fused into the one-row decode attention (attention_dec.cu, g3c_attention_o; $G3_CUDA_AOFUSE).
 *
 * Why: at one row the o product is a launch of its own whose time is mostly fixed cost (launch, the quantization of
 * x, the first weight loads; 27B int8 ~10 us a layer for 22 MB), while the attention before it keeps DRAM nearly idle.
 * Here each block of the decode attention's cluster for kv head kh (C blocks, one row) owns the rows [rank * rb, +rb)
 * of the o matrix restricted to that head's G * D columns: it requests that slice into shared memory by bulk copies at
 * its start, before its launch wait (the weights do not depend on any kernel), so they stream during the QK-norm
 * launch and the attention; after the cluster merge every block holds the kv head's G * D outputs, quantizes them as
 * the one-row product does (qgemv_common.cuh: per 32 values, int8 with its residual plane, int4 in even / odd order,
 * fp8 as float16), multiplies its slice from shared memory and adds each row's sum into y atomically (y zeroed
 * before: the qkv product's prologue does it). The kv heads' columns are disjoint blocks of 32, so the activations'
 * quantization blocks are those of the separate product; only the order of the additions differs.
 *
 * Layout of the dynamic shared memory (aop_lay): rb rows of the slice at a stride of its bytes + 16 (conflict-free
 * 16-byte reads of consecutive rows), the scales (per channel: rb floats; int4: s then z, rb x G D / 128 each), the
 * quantized activations and their (d, d * sum) per 32, the copies' mbarrier. */
#ifndef G3_BACKEND_CUDA_ATTN_OPROJ_CUH
#define G3_BACKEND_CUDA_ATTN_OPROJ_CUH

#include "backend/cuda/qgemv_common.cuh"

/* The o matrix and its output, as the kernel takes them */
struct g3c_aop {
    const void *q;    /* payload, g3_dmat's layout */
    const float *s;   /* per-channel scales [n], or int4 scales [n][k / 128] */
    const float *z;   /* int4 offsets [n][k / 128] (else NULL) */
    int n, k;         /* rows (hidden) and values a row (NH D) */
    int rb;           /* rows a block of the cluster (a multiple of 4) */
    float *y;         /* [n], sums added atomically */
};

/* OQ: the weight type (G3Q_INT8 per channel with the residual plane, G3Q_INT4 in groups of 128, G3Q_FP8 per channel
 * with float16 activations); GD: the columns of one kv head (G D) */
template <int OQ, int GD> struct aop_lay {
    static constexpr bool PC = OQ != G3Q_INT4;                 /* per-channel scales, applied to the row's sum */
    static constexpr int SB = OQ == G3Q_INT4 ? GD / 2 : GD;    /* bytes of a row's slice */
    static constexpr int RS = SB + 16;                         /* their stride in shared memory */
    static constexpr int CPR = SB / 16;                        /* 16-byte chunks a row */
    /* lanes a row: each lane takes 4 chunks (its activations in registers for every row), so that a warp walks 32 /
     * LPR rows at once and a row's sum costs log2(LPR) shuffles (27B int8: 4 lanes, 8 rows) */
    static constexpr int LPR = CPR >= 4 ? CPR / 4 : 1;
    static constexpr int NCL = CPR / LPR;                      /* chunks a lane */
    static_assert(LPR <= 32 && CPR % LPR == 0, "a row's chunks over at most one warp");
    static constexpr int NG = GD / 128;                        /* int4 groups a row's slice */
    static constexpr int XB = OQ == G3Q_INT4 ? GD : 2 * GD;    /* activation bytes (int8: q and the residual q_lo) */
    static __host__ __device__ constexpr size_t scales(int rb) { return (size_t)rb * 4 * (PC ? 1 : 2 * NG); }
    static __host__ __device__ constexpr size_t off_s(int rb) { return (size_t)rb * RS; }
    static __host__ __device__ constexpr size_t off_x(int rb) { return (off_s(rb) + scales(rb) + 15) / 16 * 16; }
    static __host__ __device__ constexpr size_t off_d(int rb) { return off_x(rb) + XB; }
    static __host__ __device__ constexpr size_t off_bar(int rb) { return off_d(rb) + (size_t)GD / 32 * 8; }
    static __host__ __device__ constexpr size_t bytes(int rb) { return off_bar(rb) + 8; }
};

/* Requests block `rank`'s slice of kv head kh's columns (all NT threads; before the launch wait). */
template <int OQ, int GD, int NT>
static __device__ __forceinline__ void aop_fetch(const g3c_aop &op, int kh, int rank, unsigned char *sm) {
    using L = aop_lay<OQ, GD>;
    const int r0 = rank * op.rb, nr = max(0, min(op.rb, op.n - r0));
    uint64_t *bar = (uint64_t *)(sm + L::off_bar(op.rb));
    if (threadIdx.x == 0) {
        g3c_mb_init(bar, 1);
        g3c_mb_init_fence();
        g3c_mb_expect(bar, (unsigned)nr * (L::SB + (L::PC ? 4u : 0u)));
    }
    __syncthreads();
    const char *src = (const char *)op.q + ((size_t)r0 * op.k + (size_t)kh * GD) * L::SB / GD;
    for (int i = threadIdx.x; i < nr; i += NT)
        g3c_bulk_g2s(sm + (size_t)i * L::RS, src + (size_t)i * op.k * L::SB / GD, L::SB, bar);
    if constexpr (L::PC) {
        if (threadIdx.x == 0 && nr > 0) g3c_bulk_g2s(sm + L::off_s(op.rb), op.s + r0, (unsigned)nr * 4, bar);
    } else { /* s and z of the row's NG groups, 8 bytes a copy */
        float *ss = (float *)(sm + L::off_s(op.rb)), *sz = ss + (size_t)op.rb * L::NG;
        const int gpr = op.k / 128, per = L::NG / 2;
        for (int t = threadIdx.x; t < nr * per; t += NT) {
            const int i = t / per, j = t % per;
            const size_t g = (size_t)(r0 + i) * gpr + (size_t)kh * L::NG + 2 * j;
            g3c_cp8(ss + (size_t)i * L::NG + 2 * j, op.s + g);
            g3c_cp8(sz + (size_t)i * L::NG + 2 * j, op.z + g);
        }
        g3c_cp_commit();
    }
}

/* After the cluster merge: x = the kv head's GD outputs (shared memory, block-visible); quantizes them, waits for the
 * slice and adds its rows' sums into y. */
template <int OQ, int GD, int NT>
static __device__ __forceinline__ void aop_run(const g3c_aop &op, int rank, unsigned char *sm, const float *x) {
    using L = aop_lay<OQ, GD>;
    constexpr int WPB = NT / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int8_t *xq = (int8_t *)(sm + L::off_x(op.rb));
    float2 *xd = (float2 *)(sm + L::off_d(op.rb));
    for (int t0 = 0; t0 < GD / 8; t0 += NT) { /* block-uniform: every lane takes part in the shuffles */
        const int t = t0 + threadIdx.x;
        const bool ok = t < GD / 8;
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = ok ? x[8 * t + e] : 0.f;
        if constexpr (OQ == G3Q_FP8) h16_quant(v, GD, t, ok, xq, xd);
        else q8_quant(v, GD, t, ok, xq, xq + GD, xd, OQ == G3Q_INT4, OQ == G3Q_INT8);
    }
    const int r0 = rank * op.rb, nr = max(0, min(op.rb, op.n - r0));
    if constexpr (!L::PC) asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    g3c_mb_wait((uint64_t *)(sm + L::off_bar(op.rb)), 0);
    const float *ss = (const float *)(sm + L::off_s(op.rb)), *sz = ss + (size_t)op.rb * L::NG;
    /* this lane's activation chunks, the same for every row */
    uint4 xa[L::NCL], xb[L::NCL];
    float2 dd[L::NCL];
#pragma unroll
    for (int j = 0; j < L::NCL; j++) {
        const int cc = lane % L::LPR + j * L::LPR;
        /* int4: even / odd halves, one (d, sum) a chunk of 32; int8 (q, q_lo) and fp8 (values 0-7, 8-15): GD apart,
         * one d a pair of 16-value chunks */
        xa[j] = ((const uint4 *)xq)[cc];
        xb[j] = ((const uint4 *)(xq + (OQ == G3Q_INT4 ? GD / 2 : GD)))[cc];
        dd[j] = xd[OQ == G3Q_INT4 ? cc : cc >> 1];
    }
    constexpr int RPI = 32 / L::LPR; /* rows a warp an iteration */
#pragma unroll 2
    for (int base = warp * RPI; base < nr; base += WPB * RPI) { /* warp-uniform */
        const int row = base + lane / L::LPR;
        const bool valid = row < nr;
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < L::NCL; j++) {
            const int cc = lane % L::LPR + j * L::LPR;
            const uint4 wv = valid ? *(const uint4 *)(sm + (size_t)row * L::RS + 16 * cc) : make_uint4(0, 0, 0, 0);
            if constexpr (OQ == G3Q_FP8) {
                uint32_t wh[8];
                e4m3x4_h2(wv.x, wh[0], wh[1]), e4m3x4_h2(wv.y, wh[2], wh[3]);
                e4m3x4_h2(wv.z, wh[4], wh[5]), e4m3x4_h2(wv.w, wh[6], wh[7]);
                acc = fmaf(dd[j].x, doth16(wh, xa[j], xb[j]), acc);
            } else if constexpr (OQ == G3Q_INT4) {
                const uint32_t wd[4] = {wv.x, wv.y, wv.z, wv.w};
                uint32_t lo[4], hi[4];
#pragma unroll
                for (int i = 0; i < 4; i++) lo[i] = wd[i] & 0x0F0F0F0Fu, hi[i] = wd[i] & 0xF0F0F0F0u;
                const int gi = valid ? row * L::NG + (cc >> 2) : 0; /* groups of 128: 4 chunks */
                const float f = (float)dot8_16(lo, hi, xa[j], xb[j]);
                acc = fmaf(ss[gi] * (dd[j].x * (1.f / 16.f)), f, fmaf(sz[gi], dd[j].y, acc));
            } else {
                float f = (float)dot4(wv, xa[j]);
                f = fmaf((float)dot4(wv, xb[j]), 1.f / 254.f, f);
                acc = fmaf(dd[j].x, f, acc);
            }
        }
#pragma unroll
        for (int o = L::LPR / 2; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (valid && lane % L::LPR == 0) atomicAdd(op.y + r0 + row, L::PC ? acc * ss[row] : acc);
    }
}

#endif
