/* The dp4a decode product at 1-2 rows (g3c_qgemv's default there, and g3c_qgemv_pn) as one persistent kernel.
 *
 * Where the quantization runs: 3..8 rows, its own kernel k_q8 (one extra launch per product) before k_qgemv. 1-2 rows
 * (the decode case, unless $G3_CUDA_QGEMVP=0): k_qgemv_p, one persistent block of 16 warps per SM that quantizes x
 * into its shared memory itself (same layout and rounding; every block re-reads the m*k floats from L2: 86 KB at
 * k = 21504, cheap next to a launch) and streams the weights with the next step always in flight across rows;
 * without GeGLU the warps take equal contiguous ranges of (row pair, step) work and add their partial rows into y
 * atomically (y holds zeros on entry, as for the tensor-core kernels), so the small matrices end without a tail of
 * block waves. Measured on the H200 (27B, batch-1 decode, argmax on the GPU): int4 161.9 tok/s against 138.6 with
 * $G3_CUDA_QGEMVP=0, int8 116.9 against 106.7; per layer (eager profile) int4 gate/up 43 us against 52, down 29
 * against 31, qkv 16 against 17, o 12 against 14.
 *
 * Add-norm in the prologue (g3c_qgemv_pn, batch-1 decode; $G3_CUDA_PNORM=0: off): the qkv and gate/up products take
 * the residual add + post-norm + pre-norm that a one-block kernel (decode_norm.cu) did before them: every block
 * recomputes it (two block-wide sums over H values; xi and the norm weights copied to shared memory before the launch
 * wait, the previous product's output read after it) and stores its slice of the new residual. Two launches less per
 * layer; measured on the H200 (session 5, batch-1 decode tok/s, argmax on the GPU, off -> on): 27B int4 159.3 ->
 * 159.8, int8 114.3 -> 114.8; 4B int4 548.2 -> 546.7, int8 482.6 -> 488.7; 1B int4 810.6 -> 846.7, int8 838.6 ->
 * 869.4. Per layer (27B int4, CUPTI under graph replay) the products grew by about what the add-norm kernels took:
 * after the wait, the prologue is a chain of dependent steps (an L2 round trip for y, two block sums, the
 * quantization) wherever it runs.
 *
 * K-slices (products without GeGLU or add-norm, $G3_CUDA_QPKS, qp_kslices): the grid is split into ks groups of
 * blocks, group j streaming slice j of K of every row and quantizing only that slice of x; the slices' partial sums
 * meet in y through the atomics of the stream-K outputs. Measured on the H200 (session 20, 27B int8 one row, CUPTI):
 * the down product (4 slices of 5376) 35.9 -> 32.8 us a layer; batch-1 decode int8 113.9 -> 117.1, int4 157.0 ->
 * 161.4 tok/s; at two rows +3-4% (27B), +4-6% (4B / 1B).
 *
 * fp8 (e4m3 per channel, QT = G3Q_FP8): the same kernel with float16 activations (x / amax per block of 32, h16_quant,
 * in the two bytes an activation that the residual plane takes for int8) and float16 fused multiply-adds on the
 * weights converted by cvt.rn.f16x2.e4m3x2 (doth16 in qgemv_common.cuh); ring, K-slices and prologue as for
 * per-channel int8. H200, session 23 run 01: 27B one / two rows 128 / 230 tok/s against 106 / 202 on the tensor-core
 * kernel with hi + lo bf16 activations ($G3_CUDA_QGEMV=0), 4B +20% / +13%, 1B +19% / +4%. Per-channel int8 in rows
 * shorter than 4096 values takes the same float16 products (weights turned into float16 exactly; qp_q8f16). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/qgemv_common.cuh"
#include "backend/cuda/scale_codes.cuh"

/* ---- persistent variant with the quantization inside (m <= 2, $G3_CUDA_QGEMVP) ----------------------------------- */
/* shared memory of the activations: q (and q_lo), (d, sum) per 32, and with the add-norm prologue (pn 1, 2) x and (pn
 * 1: copied, 2: read from global memory, qp_pn_w) its norm weights */
static __host__ __device__ size_t qp_smem(int m, int k, int hl, int pn) {
    return (size_t)(hl ? 2 : 1) * m * k + (size_t)m * (k / 32) * 8 + (pn ? (size_t)(m + (pn == 1 ? 2 : 0)) * k * 4 : 0);
}

/* One block of QP_T threads per SM: the block quantizes x into shared memory itself (same layout and rounding as k_q8,
 * no separate launch), then each warp walks its row groups (2 rows; row group g = warp id + total warps * j) step by
 * step (U chunks per row and lane, whole rows per warp: no cross-warp reduction), the next step's weights always in
 * flight across row-group boundaries, and writes each row group's outputs (or GeGLU) after a warp reduction. The
 * first step's weights are loaded before the programmatic-dependent-launch wait. Shared memory: q [M][k], q_lo [M][k]
 * (HL), (d, sum) [M][k/32]: at k = 21504, M = 2 with the residual plane 97 KB. */
#define QP_T 512

/* Sums each of the M values of v over the block (every thread gets the totals); red: [QP_T/32][M] floats. */
template <int M> static __device__ __forceinline__ void qp_block_sum(float (&v)[M], float (*red)[M]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int o = 16; o; o >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
    __syncthreads(); /* red may still be read by an earlier call */
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < M; i++) red[warp][i] = v[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < M; i++) {
        float t = 0.f;
#pragma unroll
        for (int j = 0; j < QP_T / 32; j++) t += red[j][i];
        v[i] = t;
    }
}

/* The add-norm prologue (g3c_qgemv_pn), in two parts. Before the launch wait, qp_pre_load starts copies of what
 * does not depend on the previous kernel into shared memory: xi into sf [m][K] and the norm weights into sw [2][K]
 * (xi was written two or more kernels back: every kernel lets its successor launch only after its own wait, so the
 * kernel before the previous one has completed when this one starts). After the wait, qp_add_norm: sf <- xo = xi +
 * rms(y) * w1 (this block also stores its slice of xo), inv2[i] <- 1 / rms(xo row i); the arithmetic of
 * k_add_norm_dec (decode_norm.cu). y, written by the previous kernel's atomics, is read through L2 (__ldcg).
 * m <= M <= 2, rows contiguous ([m][K]). */
template <bool LATE = false>
static __device__ __forceinline__ void qp_copy_xi(const g3c_qp_pre &pre, int K, int m, float *sf) {
    if constexpr (LATE) { /* rolled: the rare path, no second unrolled copy of the loop in every kernel */
#pragma unroll 1
        for (int t = threadIdx.x; t < m * (K / 4); t += QP_T) g3c_cp16((float4 *)sf + t, (const float4 *)pre.xi + t);
    } else {
        for (int t = threadIdx.x; t < m * (K / 4); t += QP_T) g3c_cp16((float4 *)sf + t, (const float4 *)pre.xi + t);
    }
}
/* pre.xi_late: xi was written by the previous kernel itself (k_qgemv_gd's gate/up phase stores it), so it is copied
 * after the launch wait instead, beside the loads of y */
static __device__ __forceinline__ void qp_pre_load(const g3c_qp_pre &pre, int K, int m, float *sf, float *sw,
                                                   bool gw) {
    const int K4 = K / 4;
    if (!pre.xi_late) qp_copy_xi(pre, K, m, sf);
    if (!gw) /* gw: the weights are read from global memory where used */
        for (int t = threadIdx.x; t < 2 * K4; t += QP_T)
            g3c_cp16((float4 *)sw + t, (const float4 *)(t < K4 ? pre.w1 : pre.w2) + (t < K4 ? t : t - K4));
    g3c_cp_commit();
}
template <int M>
static __device__ __forceinline__ void qp_add_norm(const g3c_qp_pre &pre, int K, int m, float *sf, const float *sw,
                                                   bool gw, float *inv2, float (*red)[M]) {
    const int K4 = K / 4, tot4 = m * K4;
    const float4 *y4 = (const float4 *)pre.y, *w4 = (const float4 *)sw;
    float4 *s4 = (float4 *)sf;
    float ss[M];
#pragma unroll
    for (int i = 0; i < M; i++) ss[i] = 0.f;
    constexpr int NV = 3 * M; /* float4s of y in flight per thread (27B: 5376 values = 2.6 per thread and row) */
    float4 v[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int t = threadIdx.x + j * QP_T;
        v[j] = t < tot4 ? __ldcg(y4 + t) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int t = threadIdx.x + NV * QP_T; t < tot4; t += QP_T) { /* rows beyond NV * QP_T * 4 values */
        const float4 u = __ldcg(y4 + t);
        const float q = u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
        if (M == 1 || t < K4) ss[0] += q;
        else ss[M - 1] += q;
    }
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int t = threadIdx.x + j * QP_T;
        const float q = v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
        if (M == 1 || t < K4) ss[0] += q;
        else ss[M - 1] += q;
    }
    qp_block_sum<M>(ss, red);
    asm volatile("cp.async.wait_group 0;" ::: "memory"); /* this thread's copies of xi and the weights */
    __syncthreads();                                      /* everyone's */
    float inv[M], s2[M];
#pragma unroll
    for (int i = 0; i < M; i++) inv[i] = 1.f / sqrtf(ss[i] / (float)K + pre.eps), s2[i] = 0.f;
    const int per = (tot4 + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * per, b1 = min(tot4, b0 + per);
#pragma unroll 2
    for (int t = threadIdx.x; t < tot4; t += QP_T) {
        const bool r1 = M > 1 && t >= K4;
        const int j = (t - threadIdx.x) / QP_T;
        float4 yv;
        if (j < NV) { /* registers, constant index after unrolling the selection */
            yv = v[0];
#pragma unroll
            for (int jj = 1; jj < NV; jj++)
                if (j == jj) yv = v[jj];
        } else {
            yv = __ldcg(y4 + t);
        }
        const float4 xv = s4[t], wv = gw ? __ldg((const float4 *)pre.w1 + (r1 ? t - K4 : t)) : w4[r1 ? t - K4 : t];
        const float iv = r1 ? inv[M - 1] : inv[0];
        float4 o;
        o.x = xv.x + yv.x * iv * wv.x, o.y = xv.y + yv.y * iv * wv.y;
        o.z = xv.z + yv.z * iv * wv.z, o.w = xv.w + yv.w * iv * wv.w;
        s4[t] = o;
        if (t >= b0 && t < b1) ((float4 *)pre.xo)[t] = o;
        const float q = o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w;
        if (r1) s2[M - 1] += q;
        else s2[0] += q;
    }
    qp_block_sum<M>(s2, red);
#pragma unroll
    for (int i = 0; i < M; i++) /* constant indices: s2 stays in registers */
        if (threadIdx.x == i) inv2[i] = 1.f / sqrtf(s2[i] / (float)K + pre.eps);
    __syncthreads();
}

/* q8_load_at for the add-norm prologue: the 8 values of item j8 of row i are sf * inv2[i] * w2 (as k_add_norm_dec's
 * xn). */
static __device__ __forceinline__ void q8_load_pn(const float *sf, const float *w2, const float *gw2, const float *inv2,
                                                  int k, int i, int j8, bool ok, float (&v)[8]) {
    if (ok) { /* gw2: the weights from global memory (w2 unused) */
        const float4 *p = (const float4 *)(sf + (size_t)i * k + 8 * j8), *wp = (const float4 *)(w2 + 8 * j8);
        const float4 *gp = (const float4 *)(gw2 + 8 * j8);
        const float4 a = p[0], b = p[1], wa = gw2 ? __ldg(gp) : wp[0], wb = gw2 ? __ldg(gp + 1) : wp[1];
        const float iv = inv2[i];
        v[0] = a.x * iv * wa.x, v[1] = a.y * iv * wa.y, v[2] = a.z * iv * wa.z, v[3] = a.w * iv * wa.w;
        v[4] = b.x * iv * wb.x, v[5] = b.y * iv * wb.y, v[6] = b.z * iv * wb.z, v[7] = b.w * iv * wb.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = 0.f;
    }
}

/* RG ($G3_CUDA_QPRING; by default for per-channel int8 rows of >= 4096 values: qp_ring_take): the weights come through
 * a ring of qd steps a warp in shared memory (qp_ring_depth: 3 at one row, 2 at two), filled by bulk copies
 * (cp.async.bulk, one per row and step, issued by lane 0, completing on the slot's mbarrier) that run qd steps ahead,
 * so each warp has qd - 1 steps in flight while it works on one (the register double buffer: one; Nsight Compute
 * finds the products waiting on their loads, DRAM 70-73% busy). Measured on the H200 (session 20, runs 08-09, CUPTI
 * at 27B int8 one row): the down product 32.8 -> 29.2-29.6 us a layer; the gate/up product with its add-norm prologue
 * lost 1-12 us until the ring was aligned to 128 bytes by address (session 21). */
/* The gate/up product and the down product in one launch (k_qgemv_gd, $G3_CUDA_QPGD) share this body: GD 1 is the
 * gate/up phase (it counts each K-slice's finished GeGLU outputs into gd.cnt), GD 2 the down phase (its wait is for
 * its K-slice's count, not for the previous kernel, and it reads x, written during this launch, through L2). bid / nb:
 * the block's index and the grid (a virtual index in the down phase), tid the thread's (unsigned, as blockIdx.x and
 * threadIdx.x are: the same arithmetic as before the body was shared). */
struct qp_gd {
    unsigned *cnt; /* [0, 8) the K-slices' finished outputs, QP_GD_TICKET, QP_GD_DONE, QP_GD_FLAG (qp_gd_words) */
    int slice;     /* GeGLU outputs (down K values) a slice */
};
#define QP_GD_TICKET 8 /* the down units taken */
#define QP_GD_DONE 9   /* the blocks finished */
#define QP_GD_FLAG 10  /* set when a down unit's wait ran out (QP_GD_TIMEOUT_NS): its outputs are wrong */
#define QP_GD_TIMEOUT_NS 2000000000ull

static __device__ __forceinline__ unsigned qp_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ unsigned long long qp_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* GD 1: a warp's row groups (GeGLU outputs) are gw + tw * j, ascending. qp_gd_last: the last of them in rg's K-slice
 * (rg its first there), -1 past nrg; qp_gd_count, at that one: adds the warp's count in the slice to the slice's
 * counter (its stores of y made visible first: lane 0 stores them at one row, a release add; each storing lane's fence
 * at two) and returns the next slice's last. Off the step loop's common path: one compare a row group. */
static __device__ __forceinline__ int qp_gd_last(const qp_gd &gd, int rg, int tw, int nrg) {
    if (rg >= nrg) return -1;
    const int end = min(nrg, (rg / gd.slice + 1) * gd.slice); /* past the slice */
    return rg + (end - 1 - rg) / tw * tw;
}
template <int M>
static __device__ __forceinline__ int qp_gd_count(const qp_gd &gd, int rg, int gw, int tw, int nrg, int lane) {
    const int sl = rg / gd.slice, lo = sl * gd.slice, j0 = lo > gw ? (lo - gw + tw - 1) / tw : 0;
    const unsigned n = (unsigned)((rg - gw) / tw - j0 + 1);
    if (M > 1) __threadfence();
    __syncwarp();
    if (lane == 0) asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(gd.cnt + sl), "r"(n) : "memory");
    return qp_gd_last(gd, rg + tw, tw, nrg);
}
/* GD 2: the block waits until slice 0 (every block of the gate/up phase past its prologue, so y's zeros are stored)
 * and slice sl are complete */
static __device__ __forceinline__ void qp_gd_wait(const qp_gd &gd, int sl) {
    if (threadIdx.x == 0) {
        const unsigned need = (unsigned)gd.slice;
        const unsigned long long t0 = qp_globaltimer();
        while (qp_ld_acquire(gd.cnt) < need || qp_ld_acquire(gd.cnt + sl) < need) {
            __nanosleep(100);
            if (qp_globaltimer() - t0 > QP_GD_TIMEOUT_NS) {
                atomicExch(gd.cnt + QP_GD_FLAG, 1u);
                break;
            }
        }
        __threadfence();
    }
    __syncthreads();
}

template <int QT, int M, int U, bool PC, bool HL, bool PN, bool RG = false, int GS = -1, int KC = 0, int GD = 0>
static __device__ __forceinline__ void qp_body(g3_dmat w, const float *__restrict__ x, int ldx, int m,
                                               float *__restrict__ y, int ldy, int geglu, int gsh, int sk, int ks,
                                               g3c_qp_pre pre, int opt, unsigned bid, unsigned nb,
                                               unsigned tid, qp_gd gd) {
    constexpr int R = 2, V = QT == G3Q_INT4 ? 32 : 16, NW = QP_T / 32, SB = 32 * U * 16; /* SB: bytes a row and step */
    /* fp8 and per-channel int8 by qp_q8f16's rule (G3C_QT_I8H): float16 activations, 2 bytes each (h16_quant) */
    constexpr bool F8 = qt_f16(QT), H2 = HL || F8;
    /* opt bit 1: the prologue's norm weights read from global memory (qp_pn_w); bits 2-4: the ring's depth; bits 5-7:
     * its slots filled before the launch wait (qp_ring_pre) */
    const bool gw = PN && (opt & 2);
    const int qd = (opt >> 2) & 7;
    extern __shared__ __align__(16) unsigned char qp_sm[];
    __shared__ float pn_red[NW][M], pn_inv2[M];
    /* ks K-slices (sk only): block b takes slice b % ks of every row (K values from kof); the ks-th part of the grid
     * on that slice shares its (row group, step) units, and each block quantizes only its slice of x */
    const int kb = bid / ks, nkb = nb / ks, K = w.k / ks, kof = (bid % ks) * K;
    const int lane = tid & 31, warp = tid >> 5, nch = K / V, ngr = w.k / w.g, gof = kof / w.g;
    const int nrg = (w.n + R - 1) / R, spr = (nch + 32 * U - 1) / (32 * U), tw = nkb * NW;
    const size_t row_bytes = QT == G3Q_INT4 ? (size_t)w.k / 2 : (size_t)w.k;
    const size_t wof = QT == G3Q_INT4 ? (size_t)kof / 2 : (size_t)kof;
    x += kof;
    int8_t *sq = (int8_t *)qp_sm, *sl = sq + (size_t)M * K;
    float2 *sd = (float2 *)(sq + (size_t)(H2 ? 2 : 1) * M * K);
    float *sf = (float *)(sd + (size_t)M * (K / 32)), *sw = sf + (size_t)M * K; /* PN: [M][K], [2][K] floats */
    /* RG: the ring [NW][qd][R][SB] after the above (128-byte aligned), then its mbarriers [NW][qd] */
    /* aligned by address: the dynamic shared memory starts after the static (pn_red, pn_inv2 with the prologue), only
     * 16-byte aligned; bulk copies into a ring off the 128-byte grid went to L2 as 32-byte requests (run 03) */
    const size_t act = qp_smem(M, K, H2, PN ? (gw ? 2 : 1) : 0);
    /* kept an offset from qp_sm, so that the slots are read by LDS, not by generic loads (an address rounded as an
     * integer lost its state space: 3-10% more instructions a step; H200 session 25 run 02: 27B int8 / fp8 one row 129
     * against 127-128 tok/s) */
    const unsigned ra = (unsigned)__cvta_generic_to_shared(qp_sm + act);
    uint8_t *ring = qp_sm + act + (((ra + 127u) & ~127u) - ra);
    uint64_t *mbar = (uint64_t *)(ring + (size_t)NW * qd * R * SB);
    /* weights and scales of step s of row group rg. Row r's chunks at constant offsets from one address (rows
     * row_bytes apart), its scales / offsets (GS: groups known at compile time) at constant offsets from one index;
     * the weight loads of chunks past the row (or of no row group) are not issued and leave their registers as they
     * were: q_chunk never reads them (the step loop stops at the first chunk past the row). The form before (zeros
     * past the row, every scale and offset load predicated) rebuilt each of their addresses from the kernel's
     * parameters: 365 instructions a step in the 27B int4 gate/up product at one row (sm_90a SASS), 292 after (278
     * with int4's hi nibbles multiplied in place, qgemv_common.cuh's dot8_16). */
    const int rs16 = (int)(row_bytes / 16);
    auto load = [&](bool any, int rg, int s, uint4 (&wv)[U][R], float (&sv)[U][R], float (&zv)[U][R]) {
        const int c0 = s * 32 * U + lane, n0 = min(rg * R, w.n - 1);
        const uint4 *w0 = (const uint4 *)((const uint8_t *)w.q + (size_t)n0 * row_bytes + wof) + c0;
        const size_t g0 = (size_t)n0 * ngr + gof + (GS >= 0 ? c0 >> GS : 0);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int dr = min(rg * R + r, w.n - 1) - n0; /* 0 or r */
            const uint4 *wr = w0 + dr * rs16;
            const size_t gr = g0 + (size_t)(dr * ngr);
            const float *sp = w.s + gr, *zp = QT == G3Q_INT4 ? w.z + gr : w.s;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int cc = c0 + 32 * u, gi = GS >= 0 ? u * (32 >> GS) : cc >> gsh;
                if constexpr (!RG)
                    if (any && cc < nch) wv[u][r] = g3c_ld_stream(wr + 32 * u);
                /* not predicated: the scale arrays are padded past their end (G3C_DMAT_SPAD). KC: the GGUF scale codes
                 * (g3_dmat.kc, kd; 1 Q4_K's, 2 an fp16 d), their bits kept in the float buffers until the step uses
                 * them */
                if constexpr (KC == 3) { /* int4 in groups of 128: (s, z) as one half2 (g3_dmat.sz) */
                    sv[u][r] = __uint_as_float(__ldg(w.sz + gr + gi));
                } else if constexpr (KC) {
                    sv[u][r] = __uint_as_float((uint32_t)__ldg(w.kc + gr + gi));
                    if constexpr (KC == 1) zv[u][r] = __uint_as_float(__ldg(w.kd + ((gr + gi) >> 3)));
                } else {
                    if constexpr (!PC) sv[u][r] = __ldg(sp + gi);
                    if constexpr (QT == G3Q_INT4) zv[u][r] = __ldg(zp + gi);
                }
            }
        }
    };
    int rg, s, left; /* the warp's steps (g3c_warp_steps) */
    g3c_warp_steps(kb * NW + warp, tw, nrg, spr, sk, rg, s, left);
    auto more = [&](int g, int l) { return sk ? l > 0 : g < nrg; };
    uint4 wa[U][R];
    float sa[U][R], za[U][R];
    load(more(rg, left), rg, s, wa, sa, za); /* independent of the previous kernel */
    /* RG: the issue cursor (gi, si, li) runs qd steps ahead of (rg, s, left) over the same sequence */
    int gi = rg, si = s, li = left;
    /* opt bits 5-7 (qp_ring_pre): the ring's slots filled before the launch wait, the rest after the prologue's
     * loads (PN) or x's quantization; 0: all before */
    const int qpre = (opt >> 5) & 7, npre = qpre && qpre < qd ? qpre : qd;
    int filled = 0;
    auto issue = [&](int slot) { /* lane 0: step (gi, si) into the warp's slot */
        uint64_t *bar = mbar + warp * qd + slot;
        uint8_t *dst = ring + (size_t)(warp * qd + slot) * R * SB;
        const int c0 = si * 32 * U, cnt = min(32 * U, nch - c0);
        g3c_fence_async();
        g3c_mb_expect(bar, (unsigned)(R * cnt * 16));
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int nr = min(gi * R + r, w.n - 1);
            g3c_bulk_g2s(dst + r * SB, (const uint8_t *)w.q + (size_t)nr * row_bytes + wof + (size_t)c0 * 16,
                         (unsigned)(cnt * 16), bar);
        }
    };
    auto advance_issue = [&]() {
        if (si + 1 == spr) gi += sk ? 1 : tw, si = 0;
        else si++;
        li--;
    };
    if constexpr (RG) {
        if (lane == 0) {
            for (int d = 0; d < qd; d++) g3c_mb_init(mbar + warp * qd + d, 1);
            g3c_mb_init_fence();
        }
        __syncwarp();
        for (; filled < npre && more(gi, li); filled++) {
            if (lane == 0) issue(filled);
            advance_issue();
        }
    }
    auto fill_rest = [&]() { /* RG: the slots not filled before the launch wait */
        for (; RG && filled < qd && more(gi, li); filled++) {
            if (lane == 0) issue(filled);
            advance_issue();
        }
    };
    if constexpr (PN) qp_pre_load(pre, K, m, sf, sw, gw);
    if constexpr (GD == 2) qp_gd_wait(gd, bid % ks);
    else g3c_pdl_wait();
    if (pre.zero) {
        for (int i = bid * QP_T + tid; i < pre.zero_n; i += nb * QP_T) pre.zero[i] = 0.f;
        if constexpr (GD == 1) __threadfence(); /* before this block's first count (qp_gd_wait's slice 0) */
    }
    if constexpr (PN) {
        if (pre.xi_late) qp_copy_xi<true>(pre, K, m, sf), g3c_cp_commit(); /* qp_add_norm waits for every group */
        qp_add_norm<M>(pre, K, m, sf, sw, gw, pn_inv2, pn_red);
        fill_rest();
    }
    { /* QI items per thread with their loads in flight together: one L2 round trip per QI items, not per item */
        constexpr int QI = 4;
        /* items of at most M <= 2 rows of K <= 64 K values: the row and item without a division */
        const int k8 = K / 8, tot = m * k8; /* a multiple of 4, like QP_T: blocks of 32 all in or all out */
        const bool skip = opt & 1; /* item slots wholly past tot left out (block-uniform: no lane diverges) */
        for (int b0 = 0; b0 < tot; b0 += QI * QP_T) {
            float v[QI][8];
            int ti[QI], tj[QI];
#pragma unroll
            for (int j = 0; j < QI; j++) {
                const int t = b0 + j * QP_T + tid, r1 = M > 1 && t >= k8;
                ti[j] = t < tot ? r1 : 0, tj[j] = t < tot ? t - r1 * k8 : 0;
            }
#pragma unroll
            for (int j = 0; j < QI; j++) {
                const int t = b0 + j * QP_T + tid;
                if (skip && b0 + j * QP_T >= tot) break;
                if constexpr (PN) q8_load_pn(sf, sw + K, gw ? pre.w2 : NULL, pn_inv2, K, ti[j], tj[j], t < tot, v[j]);
                else q8_load_at<GD == 2>(x, ldx, ti[j], tj[j], t < tot, v[j]);
            }
#pragma unroll
            for (int j = 0; j < QI; j++) {
                const int t = b0 + j * QP_T + tid;
                if (skip && b0 + j * QP_T >= tot) break;
                if constexpr (F8) h16_quant_at(v[j], K, ti[j], tj[j], t < tot, sq, sd);
                else q8_quant_at(v[j], K, ti[j], tj[j], t < tot, sq, sl, sd, QT == G3Q_INT4, HL);
            }
        }
    }
    if constexpr (!PN) fill_rest();
    __syncthreads();
    const int8_t *xq[M], *xl[M]; /* the activation rows in shared memory */
    const float2 *xd[M];
#pragma unroll
    for (int i = 0; i < M; i++)
        xq[i] = sq + (size_t)i * (F8 ? 2 : 1) * K, xl[i] = sl + (size_t)i * K, xd[i] = sd + (size_t)i * (K / 32);
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) acc[r][i] = 0.f;
    int slot = 0, ph = 0; /* RG: this step's ring slot and the parity of its mbarrier phase */
    /* GD 1: the warp's last row group of its current K-slice (where it adds its count), or -1 */
    int pub_at = GD == 1 ? qp_gd_last(gd, rg, tw, nrg) : -1;
    while (more(rg, left)) { /* warp-uniform */
        const int rn = s + 1 == spr ? rg + (sk ? 1 : tw) : rg, sn = s + 1 == spr ? 0 : s + 1;
        uint4 wb[U][R];
        float sb[U][R], zb[U][R];
        load(more(rn, left - 1), rn, sn, wb, sb, zb); /* next step in flight during this one's math */
        if constexpr (RG) { /* this step's weights from its slot */
            g3c_mb_wait(mbar + warp * qd + slot, (unsigned)ph);
            const uint4 *src = (const uint4 *)(ring + (size_t)(warp * qd + slot) * R * SB);
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (s * 32 * U + 32 * u + lane < nch) wa[u][r] = src[r * (SB / 16) + 32 * u + lane];
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = s * 32 * U + 32 * u + lane;
            if (cc >= nch) break;
            if constexpr (KC) { /* the values g3_dmat.s and z hold, bit for bit */
                float s2[R], z2[R];
#pragma unroll
                for (int r = 0; r < R; r++) /* Q4_K: za holds the (d, -dmin) bits */
                    g3c_kc_scales<KC>(__float_as_uint(sa[u][r]), KC == 1 ? __float_as_uint(za[u][r]) : 0u, s2[r],
                                      z2[r]);
                q_chunk<QT, R, M, PC, HL, true>(wa[u], s2, z2, cc, K, xq, xl, xd, acc);
            } else {
                q_chunk<QT, R, M, PC, HL, true>(wa[u], sa[u], za[u], cc, K, xq, xl, xd, acc);
            }
        }
        if constexpr (RG) { /* the slot is read: refill it qd steps ahead */
            __syncwarp();
            if (more(gi, li)) {
                if (lane == 0) issue(slot);
                advance_issue();
            }
            if (++slot == qd) slot = 0, ph ^= 1;
        }
        if (s + 1 == spr || (sk && left == 1)) { /* row group (or the range) done: warp sums, outputs */
            float sc[R]; /* per-channel int8: the channel scales, applied once to the sums */
#pragma unroll
            for (int r = 0; r < R; r++) sc[r] = PC ? __ldg(w.s + min(rg * R + r, w.n - 1)) : 1.f;
            g3c_rowgroup_out<R, M>(acc, sc, lane, m, rg * R, w.n, sk, geglu, y, ldy);
            if constexpr (GD == 1)
                if (rg == pub_at) pub_at = qp_gd_count<M>(gd, rg, kb * NW + warp, tw, nrg, lane);
        }
        rg = rn, s = sn, left--;
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                if constexpr (!RG) wa[u][r] = wb[u][r];
                sa[u][r] = sb[u][r], za[u][r] = zb[u][r];
            }
    }
    if constexpr (GD == 1 && RG) /* the down phase lays out shared memory anew: these mbarriers are done with */
        if (lane == 0)
            for (int d = 0; d < qd; d++) g3c_mb_inval(mbar + warp * qd + d);
}

template <int QT, int M, int U, bool PC, bool HL, bool PN, bool RG = false, int GS = -1, int KC = 0>
__global__ void __launch_bounds__(QP_T, 1) k_qgemv_p(g3_dmat w, const float *__restrict__ x, int ldx, int m,
                                                     float *__restrict__ y, int ldy, int geglu, int gsh, int sk,
                                                     int ks, g3c_qp_pre pre, int opt) {
    qp_body<QT, M, U, PC, HL, PN, RG, GS, KC>(w, x, ldx, m, y, ldy, geglu, gsh, sk, ks, pre, opt, blockIdx.x,
                                              gridDim.x, threadIdx.x, qp_gd{NULL, 1});
}

/* ---- persistent variant: dispatch ---- */
#define QP_SMEM_MAX (200 << 10)
#define QP_SMEM_RG (226 << 10) /* the ring variants: the 227 KB a block may have, less its static shared memory */
/* bytes of the ring variant of depth d and u chunks a lane, row and step (qp_ring_u; pn as for qp_smem); + 127: the
 * ring aligned to 128 bytes by address */
static size_t qp_smem_rg(int m, int k, int hl, int pn, int d, int u) {
    return qp_smem(m, k, hl, pn) + 127 + (size_t)(QP_T / 32) * d * (2 * 32 * u * 16 + 8);
}
/* $G3_CUDA_QPU=0: U = 3 at one row everywhere. By default int4 through the ring at one row (no prologue) takes steps
 * of 2 chunks a lane where they cover the row's (or K-slice's) nch chunks with fewer lane slots than steps of 3: the
 * 27B o product's 128 chunks in two steps of 2 instead of two of 3 (a third of the slots idle), the 4B / 1B o
 * products, the 1B head and down. Steps of 4 (the 27B o product's 128 chunks in one) were slower, 27B one row 184-185
 * against 188-189 tok/s (session 25 run 07): the ring of 4-chunk steps takes 202 KB of shared memory, so the gate/up
 * product's blocks (71 KB) no longer start beside the o product's under programmatic launch (gate/up 39.6 against
 * 37.4 us a layer under CUPTI). */
static int qp_u1(int nch) {
    const char *e = getenv("G3_CUDA_QPU");
    if (e && !strcmp(e, "0")) return 3;
    return (nch + 63) / 64 * 64 < (nch + 95) / 96 * 96 ? 2 : 3;
}
/* U of the ring variant for this product (int4 in groups of 128 at one row without the prologue: qp_u1) */
static int qp_ring_u(const g3_dmat *w, int m, int ks, int hl, int pn) {
    return w->qt == G3Q_INT4 && !hl && m <= 1 && !pn ? qp_u1(w->k / ks / 32) : m <= 1 ? 3 : 2;
}
/* The ring's depth in steps at m rows: 3 at one row, 2 at two ($G3_CUDA_QPD=2..6: that depth at both). Measured on the
 * H200 (session 24 run 02, A/B/A/B, tok/s one / two rows): depth 2 everywhere 27B int8 128 / 236 against 128-129 /
 * 230-231 for depth 3, fp8 128 / 228 against 128-129 / 227-229, 4B within 1%; depth 4 (with $G3_CUDA_QPNW=1, so that
 * it fits beside the prologue) 27B int8 127 / 227, fp8 126 / 225, 4B 1-2% slower. */
static int qp_ring_depth(int m) {
    const char *e = getenv("G3_CUDA_QPD");
    const int d = e && *e ? atoi(e) : m <= 1 ? 3 : 2;
    return d < 2 ? 2 : d > 6 ? 6 : d;
}
/* $G3_CUDA_QPNW=1: the add-norm prologue reads its norm weights from global memory instead of copying them to shared
 * memory before the launch wait (so that a deeper ring fits beside it); qp_smem's pn 2 */
static int qp_pn_w(void) {
    const char *e = getenv("G3_CUDA_QPNW");
    return e && !strcmp(e, "1");
}
static int qp_pn(int pn) { return pn ? 1 + qp_pn_w() : 0; } /* qp_smem's pn for a launch with (pn) or without it */

int g3c_qgemvp_fits(int m, int k) { return qp_smem(m, k, 1, 0) <= QP_SMEM_MAX; }

int g3c_qgemvp_enabled(void) { /* $G3_CUDA_QGEMVP: 0 = the two-launch path at 1-2 rows too; read at every call */
    const char *e = getenv("G3_CUDA_QGEMVP");
    return !(e && !strcmp(e, "0"));
}

/* U (chunks per row and lane per step): 3 at one row, 2 at two; measured on the H200 (27B, one row): U = 4 slower
 * (int4 152.9 against 161.9 tok/s, int8 114.9 against 116.9). Also measured slower (session 4, CUPTI per-kernel
 * times with dev/cuda/kprof.cc): more weight traffic before the programmatic-dependent-launch wait (the next 3-8 steps
 * of every warp prefetched into L2: int4 150.1 / 140.7 tok/s at 24 / 48 MB against 163.0 without; the kernels before
 * slowed down, and so did these) and a cp.async ring of 3-4 stages in shared memory instead of the register double
 * buffer (more steps in flight: int4 150.1, 2 stages 154.2; every product slower, so the stream is not limited by the
 * bytes in flight). Also tried: the residual plane's dp4a continuing the
 * main plane's int32 sum (254 q + q_lo, one conversion and float product less per row and chunk): no change
 * (int4 170.8 against 171.1, int8 121.5 against 121.6), so the arithmetic is not what limits these kernels. */
template <int QT, int M, bool PC, bool HL, bool PN, int GS = -1> static void *qp_kernel(void) {
    return (void *)k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, false, GS>;
}
template <int QT, bool HL, int KC, int GS = -1> static void qp_kc_kernels(void **k) { /* M 1, 2 x PN off, on */
    k[0] = (void *)k_qgemv_p<QT, 1, 3, false, HL, false, false, GS, KC>;
    k[1] = (void *)k_qgemv_p<QT, 2, 2, false, HL, false, false, GS, KC>;
    k[2] = (void *)k_qgemv_p<QT, 1, 3, false, HL, true, false, GS, KC>;
    k[3] = (void *)k_qgemv_p<QT, 2, 2, false, HL, true, false, GS, KC>;
}
template <int QT, bool PC, bool PN, int GS = -1> static void qp_kernels(void **k) { /* M 1, 2 x HL off, on */
    k[0] = qp_kernel<QT, 1, PC, false, PN, GS>(), k[1] = qp_kernel<QT, 1, PC, true, PN, GS>();
    k[2] = qp_kernel<QT, 2, PC, false, PN, GS>(), k[3] = qp_kernel<QT, 2, PC, true, PN, GS>();
}

static int qp_n_sm = 0;
static int qp_ring_ok = 0; /* the ring variants' shared memory set up (g3c_qgemv_init) */
cudaError_t g3c_qgemv_init(void) {
    static int done = 0;
    if (done) return cudaSuccess;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&qp_n_sm, cudaDevAttrMultiProcessorCount, dev);
    void *ks[56];
    qp_kernels<G3Q_INT4, false, false>(ks), qp_kernels<G3Q_INT8, false, false>(ks + 4);
    qp_kernels<G3Q_INT8, true, false>(ks + 8), qp_kernels<G3Q_INT4, false, true>(ks + 12);
    qp_kernels<G3Q_INT8, false, true>(ks + 16), qp_kernels<G3Q_INT8, true, true>(ks + 20);
    ks[24] = qp_kernel<G3Q_FP8, 1, true, false, false>(), ks[25] = qp_kernel<G3Q_FP8, 2, true, false, false>();
    ks[26] = qp_kernel<G3Q_FP8, 1, true, false, true>(), ks[27] = qp_kernel<G3Q_FP8, 2, true, false, true>();
    ks[28] = qp_kernel<G3C_QT_I8H, 1, true, false, false>(), ks[29] = qp_kernel<G3C_QT_I8H, 2, true, false, false>();
    ks[30] = qp_kernel<G3C_QT_I8H, 1, true, false, true>(), ks[31] = qp_kernel<G3C_QT_I8H, 2, true, false, true>();
    /* int4 in groups of 128 (qp_gs), without and with the prologue */
    qp_kernels<G3Q_INT4, false, false, 2>(ks + 32), qp_kernels<G3Q_INT4, false, true, 2>(ks + 36);
    /* the GGUF scale codes (qp_kc): Q4_K, Q4_0 without the residual plane, Q8_0 with it */
    qp_kc_kernels<G3Q_INT4, false, 1>(ks + 40), qp_kc_kernels<G3Q_INT4, false, 2>(ks + 44);
    qp_kc_kernels<G3Q_INT8, true, 2>(ks + 48);
    qp_kc_kernels<G3Q_INT4, false, 3, 2>(ks + 52); /* int4 in groups of 128 with the half2 pairs (qp_q4sz) */
    for (size_t i = 0; i < sizeof ks / sizeof ks[0] && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(ks[i], cudaFuncAttributeMaxDynamicSharedMemorySize, QP_SMEM_MAX);
    void *kr[26] = {(void *)k_qgemv_p<G3Q_INT4, 1, 3, false, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, true, true, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, true, true, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 1, 3, true, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 2, 2, true, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 1, 3, true, true, true, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 2, 2, true, true, true, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 1, 3, true, false, false, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 2, 2, true, false, false, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 1, 3, true, false, true, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 2, 2, true, false, true, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 1, 3, true, false, false, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 2, 2, true, false, false, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 1, 3, true, false, true, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 2, 2, true, false, true, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, false, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, false, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, true, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, true, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 2, false, false, false, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, false, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, false, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, true, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, true, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 2, false, false, false, true, 2, 3>};
    cudaError_t er = cudaSuccess; /* a device with less shared memory a block: no ring, nothing else lost */
    for (size_t i = 0; i < sizeof kr / sizeof kr[0] && e == cudaSuccess && er == cudaSuccess; i++)
        er = cudaFuncSetAttribute(kr[i], cudaFuncAttributeMaxDynamicSharedMemorySize, QP_SMEM_RG);
    qp_ring_ok = er == cudaSuccess;
    if (er != cudaSuccess) (void)cudaGetLastError();
    if (e == cudaSuccess) done = 1;
    return e;
}

/* $G3_CUDA_Q4KC: matrices from GGUF Q4_K, Q4_0 and Q8_0 (groups of 32) read the file's own scales at 1-2 rows
 * (g3_dmat.kc, kd): Q4_K 2.5 bytes a group of 32 weights against 8 for the float s and z (0.58 bytes a weight instead
 * of 0.75), Q4_0 2 (0.56), Q8_0 2 against 4 (1.06 instead of 1.13). 0: no codes at all (g3cb_alloc_kcodes, at
 * create); 2: codes kept, the kernel reads s and z (comparisons); read at every call. H200, session 33 run 03 (tok/s
 * one / two rows, against 2): 27B Q4_K 176 / 325 against 149-150 / 281, Q4_K_M 150 / 279 against 132-133 / 251-252,
 * 4B Q4_K 677 against 631 at one row. */
static int qp_kc(void) {
    const char *e = getenv("G3_CUDA_Q4KC");
    return !(e && (!strcmp(e, "0") || !strcmp(e, "2")));
}
/* The product reads the codes (launch_p, g3c_qgemvp_kc); hl: with the activations' residual plane. The variants:
 * Q4_K / Q4_0 (int4 in groups of 32, one chunk a group) without the plane, Q8_0 with it. */
static int qp_kc_take(const g3_dmat *w, int hl) {
    return w->kc && w->g == 32 && qp_kc() && (w->qt == G3Q_INT4 ? !hl : w->qt == G3Q_INT8 && hl);
}

/* $G3_CUDA_QPGS=0: int4 in groups of 128 through the kernel with the group arithmetic at run time (the shift by gsh
 * per chunk and its address per load) instead of at compile time (one scale / offset address a row and step).
 * Nsight Compute on the 27B int4 gate/up product at one row (session 24 run 05): ~480 warp instructions a step, of
 * which 48 are the dp4a, the rest mostly address arithmetic, kernel parameters re-read from the constant bank and
 * register moves; the issue slots 58% busy. With the groups at compile time (run 06, A/B/A/B, tok/s one / two rows):
 * 27B 181 / 324 against 179-180 / 324-325, 4B 682-683 / 1175-1178 against 679-682 / 1173-1174; CUPTI: a 27B layer
 * 85.4 against 87.9 us. */
static int qp_gs(void) {
    const char *e = getenv("G3_CUDA_QPGS");
    return !(e && !strcmp(e, "0"));
}

/* $G3_CUDA_QPRING: weights through the shared-memory ring of bulk copies (k_qgemv_p's RG). Unset (auto): the
 * per-channel int8 products in rows (or K-slices) of >= 4096 values, with or without the add-norm prologue (every
 * 27B product and the 4B down product; none at 1B), and int4 in groups of 128 without its residual plane (the
 * default int4) in the products without the prologue (o, down, the head); 0: never; 1: every int4 / per-channel int8
 * product without the prologue; 2: with the prologue too. $G3_CUDA_QPRINGMIN=n: only matrices of >= n MB. Measured on
 * the H200 (session 21, A/B/A/B, tok/s): int4 with its residual plane through the ring 152-163 against 167-168 at one
 * row, 239-275 against 282-288 at two (its per-group scales and offsets still come through registers a step ahead).
 * Session 25, once the step's loads took fewer instructions (run 03, tok/s one / two rows, against no ring): 27B int4
 * 188-189 / 338-340 against 186 / 330, 4B 734-736 / 1226-1227 against 717-719 / 1217, 1B 1241-1259 / 2124-2143
 * against 1217-1226 / 2130-2153; the products with the prologue through the ring as well (run 02): 27B one row
 * 181-182 (gate/up 39.4 against 36.6 us a layer), two rows 338-340; the large ones only ($G3_CUDA_QPRINGMIN: down and
 * head) 27B 186 / 334-335, 4B 713-717 / 1206-1207, 1B 1200-1210 / 2074-2099. The 1B / 4B int8 heads (rows of
 * 1152 / 2560 values) through the ring cost 1B int8 3% at one row (run 03), hence the row length. The ring with the
 * prologue was slow until the ring was aligned by address (run 03, Nsight Compute: the prologue's static shared
 * memory left the dynamic part 16-byte aligned, and bulk copies off the 128-byte grid went to L2 as 4x the requests,
 * 9.6 M sectors for 7.3 M of weights; the gate/up product 79 against 66.5 us aligned, run 05). */
#define QP_RING_MIN_K 4096 /* auto: the shortest rows (or K-slices) that take the ring */
static int qp_ring_mode(void) { /* -1 auto, 0, 1, 2 */
    const char *e = getenv("G3_CUDA_QPRING");
    return e && *e ? atoi(e) : -1;
}
/* hl: the activations take two bytes each (the residual plane, or float16: qp_f16) */
static int qp_ring_take(const g3_dmat *w, int m, int ks, int hl, int pn) { /* pn: 0, 1 (the prologue) */
    const int mode = qp_ring_mode(), pc = (w->qt == G3Q_INT8 || w->qt == G3Q_FP8) && w->g == w->k;
    /* int4 in groups of 128 without the residual plane: the kernel with the group arithmetic at compile time */
    const int q4 = w->qt == G3Q_INT4 && !hl && w->g == 128 && qp_gs();
    if (!qp_ring_ok || !mode || !(hl ? pc || w->qt == G3Q_INT4 : q4)) return 0;
    if (mode < 0 ? (q4 ? pn : !pc || w->k / ks < QP_RING_MIN_K) : mode < (pn ? 2 : 1)) return 0;
    const char *e = getenv("G3_CUDA_QPRINGMIN");
    const size_t min = (size_t)(e && *e ? atol(e) : 0) << 20;
    const size_t bytes = (size_t)w->n * (w->qt == G3Q_INT4 ? w->k / 2 : w->k);
    return bytes >= min &&
           qp_smem_rg(m, w->k / ks, hl, qp_pn(pn), qp_ring_depth(m), qp_ring_u(w, m, ks, hl, pn)) <= QP_SMEM_RG;
}

/* K-slices of a product without GeGLU or add-norm prologue (27B: the down product's 21504-long rows in 4): the
 * fewest ks (up to 8) that divide the SMs and K into slices of <= $G3_CUDA_QPKS values (default 5376; 0: whole
 * rows), each whole quantization blocks and weight groups; 1 where none fits. Each block then quantizes k / ks
 * values of x instead of k (86 KB of floats read through L2 per block at k = 21504, two rounds of loads). */
static int qp_kslices(const g3_dmat *w, int geglu, int pn) {
    const char *e = getenv("G3_CUDA_QPKS");
    const int lim = e && *e ? atoi(e) : 5376;
    if (geglu || pn || lim <= 0 || w->k <= lim) return 1;
    const int unit = w->g > 128 && w->g < w->k ? w->g : 128;
    for (int ks = 2; ks <= 8; ks++)
        if (qp_n_sm % ks == 0 && w->k % (ks * unit) == 0 && w->k / ks <= lim) return ks;
    return 1;
}

/* $G3_CUDA_Q8F16: per-channel int8 at 1-2 rows on the float16 products of fp8 (weights turned into float16 exactly,
 * activations float16 per block of 32: ~2^-12 of each value, no residual plane) instead of dp4a on q8 + residual plane.
 * Unset: the products in rows (or K-slices) shorter than QP_RING_MIN_K, which take no ring; 1 every product, 0 none.
 * Measured on the H200 (session 23, tok/s one / two rows), every product (run 04): 27B 123 / 212-213 against 123 /
 * 227-228 (the gate/up product 64.4 against 60 us a layer: the conversion's byte permutes and subtractions; fp8's
 * cvt: 58.9), 4B 569-574 / 995-1004 against 531-535 / 957-961, 1B 1083-1099 / 1820-1842 against 960-962 / 1711-1712;
 * by the row rule (run 05): 27B unchanged (124-125 / 228-229), 4B 569-575 / 1000-1007 against 542-543 / 966-968, 1B
 * 1077-1105 / 1821-1859 against 968-974 / 1717-1722. The fixtures' int8 KL one row at a time the same (small-a 0.0167
 * against 0.0166 nats, t-gqa 0.0054 / 0.0053, t-softcap 0.0090 / 0.0090, t-mm 0.0034 / 0.0034). */
static int qp_q8f16(const g3_dmat *w, int geglu, int pn) {
    if (w->qt != G3Q_INT8 || w->g != w->k) return 0;
    const char *e = getenv("G3_CUDA_Q8F16");
    if (e && *e) return atoi(e) == 1;
    return w->k / qp_kslices(w, geglu, pn) < QP_RING_MIN_K;
}
static int qp_f16(const g3_dmat *w, int geglu, int pn) { /* the product runs on float16 products (qt_f16) */
    return w->qt == G3Q_FP8 || qp_q8f16(w, geglu, pn);
}

/* The ring variants fill n of their slots before the launch wait and the rest once the add-norm prologue's loads have
 * returned (or after x's quantization), so that those L2 loads do not queue behind the ring's copies (up to 147 KB a SM
 * at depth 3). $G3_CUDA_QPRPRE=n (1..7); 0: every slot before the wait (as before); default 2, which at two rows (depth
 * 2) is every slot. Measured on the H200 (session 38 runs 01-02, two rounds each, tok/s one row, argmax on the GPU):
 * 27B int8 / int4 / fp8 130 / 191 / 130 against 128 / 189-190 / 129 with 0 (n = 1: 129 / 191 / 129; 3, i.e. all: as 0;
 * run 03, n = 2 the default: 131 / 190-191 / 131 against 129 / 188-189 / 129), 4B / 1B within their noise (4B int8
 * 597-603 against 599-600, 1B int4 1265-1299 against 1270-1297); CUPTI at 27B int8: a layer 117.0 against 119.1 us (the
 * o product 1.6 us shorter, gate/up 1.9), int4 80.7 against 81.4. With a ring of 4 (G3_CUDA_QPD=4 G3_CUDA_QPNW=1) still
 * slower than 3 (27B int8 126 with n = 2). At two rows n = 1 gave 27B int8 / int4 243-244 / 351-352 against 241 /
 * 345-346 but fp8 227-231 against 231-232 and 4B int8 one row 589-590 against 599-600 when applied at one row too; not
 * taken. Session 23 had measured 0-1 slots before the wait for the products without the prologue alone (27B fp8 125-127
 * against 128): no better there. */
static int qp_ring_pre(void) {
    const char *e = getenv("G3_CUDA_QPRPRE");
    const int n = e && *e ? atoi(e) : 2;
    return n < 0 ? 0 : n > 7 ? 7 : n;
}

/* The kernel's opt: bit 1 as qp_pn_w says, bits 2-4 the ring's depth (qp_ring_depth), bits 5-7 qp_ring_pre; bit 0: the
 * quantization's item slots (QI of QP_T items per thread and round) that lie wholly past the m * k / 8 items are left
 * out instead of run with their loads and stores predicated off ($G3_CUDA_QPQS=0: run them, as before): the 27B shapes
 * need 1-2 of the 4 (k = 4096 / 5376), and q8_quant does all its arithmetic and shuffles before its predicated stores.
 * Nsight Compute on the 27B fp8 o product alone (session 23 run 08): 42% of its instructions and 61% of its stall
 * samples in each warp's one-time code. A/B/A/B (run 09, tok/s one row): 27B int8 / int4 / fp8 129 / 177-178 / 128-129
 * against 123 / 171 / 128, 4B 584-586 / 668-673 / 589-593 against 561-564 / 604-611 / 575-576. Measured in the same run
 * and not kept: issuing 0-1 of the ring's 3 slots before the launch wait and the rest right after x's loads, so that x
 * would not queue behind ~19 MB of copies (23% of the o product's stall samples wait for x there): 27B fp8 125-127, 4B
 * 564-577, no better. */
static int qp_opt(int m) {
    const char *q = getenv("G3_CUDA_QPQS");
    return (q && !strcmp(q, "0") ? 0 : 1) | qp_pn_w() << 1 | qp_ring_depth(m) << 2 | qp_ring_pre() << 5;
}

/* $G3_CUDA_Q4SZ: int4 in groups of 128 with their half2 (s, z) pairs (g3_dmat.sz, allocated where $G3_CUDA_Q4SZ=1 at
 * create) read them instead of s and z (4 bytes a group of 64 weight bytes instead of 8: 0.531 bytes a weight instead
 * of 0.5625, 5.6% less to stream at one row, and one load a group instead of two); =0 at a call: s and z. Not yet
 * measured (session 42 had no device), hence not allocated by default. The GGUF scale codes, the same idea at groups
 * of 32, took 27B Q4_K one row from 149-150 to 176 tok/s (session 33). */
static int qp_q4sz(void) {
    const char *e = getenv("G3_CUDA_Q4SZ");
    return !(e && !strcmp(e, "0"));
}

/* What one launch of k_qgemv_p runs for this matrix at m rows (one place for launch_p's choices and k_qgemv_gd's):
 * the kernel's template arguments, K-slices and shared memory */
struct qp_var {
    int qt, M, u, pc, hl, pn, rg, gs, kc, ks, gsh;
    size_t smem;
};
static qp_var qp_variant(const g3_dmat *w, int m, int geglu, int pn) {
    qp_var v;
    memset(&v, 0, sizeof v);
    v.M = m <= 1 ? 1 : 2, v.pn = pn, v.ks = qp_kslices(w, geglu, pn), v.hl = m <= lo_rows(w);
    if (qp_q8f16(w, geglu, pn)) v.qt = G3C_QT_I8H, v.pc = 1, v.hl = 0; /* float16 activations: no plane */
    else if (w->qt == G3Q_FP8) v.qt = G3Q_FP8, v.pc = 1, v.hl = 0;
    else if (w->qt == G3Q_INT4) v.qt = G3Q_INT4, v.pc = 0;
    else v.qt = G3Q_INT8, v.pc = w->g == w->k;
    const int h2 = v.hl || qt_f16(v.qt); /* activations of two bytes (the residual plane, or float16) */
    v.gsh = v.pc ? 0 : log2_exact(w->g / (v.qt == G3Q_INT4 ? 32 : 16));
    v.u = v.M == 1 ? 3 : 2, v.gs = -1;
    /* int4 without its plane: groups of 128 (qp_ring_take's q4) */
    if ((v.qt == G3Q_INT4 || (h2 && v.pc)) && qp_ring_take(w, v.M, v.ks, h2, pn)) {
        const int u = qp_ring_u(w, v.M, v.ks, h2, pn);
        v.rg = 1, v.gs = h2 ? -1 : 2;
        if (v.M == 1 && !pn && !h2 && u == 2) v.u = 2;
        if (v.gs == 2 && w->sz && qp_q4sz()) v.kc = 3;
        v.smem = qp_smem_rg(v.M, w->k / v.ks, h2, qp_pn(pn), qp_ring_depth(v.M), u);
        return v;
    }
    v.smem = qp_smem(v.M, w->k / v.ks, h2, qp_pn(pn));
    if (v.qt == G3Q_INT4) { /* groups of 128 (4 chunks): the group arithmetic at compile time (qp_gs) */
        if (v.gsh == 2 && qp_gs()) v.gs = 2;
        if (!v.hl && qp_kc_take(w, 0)) v.kc = w->kd ? 1 : 2, v.gs = -1; /* Q4_K / Q4_0: the scale codes */
        if (!v.hl && v.gs == 2 && w->sz && qp_q4sz()) v.kc = 3; /* groups of 128: the half2 pairs */
    }
    if (v.qt == G3Q_INT8 && !v.pc && v.hl && qp_kc_take(w, 1)) v.kc = 2; /* Q8_0: the fp16 scale codes */
    return v;
}
static int qp_blocks(const g3_dmat *w, int ks) { /* the grid: ks groups of at most qp_n_sm / ks blocks */
    const int per = qp_n_sm / ks, nrg = (w->n + 1) / 2, need = (nrg + QP_T / 32 - 1) / (QP_T / 32);
    return ks * (need < per ? need : per);
}

template <int QT, int M, bool PC, bool HL, bool PN>
static cudaError_t launch_p(const g3_dmat *w, const qp_var &v, const float *x, int ldx, int m, float *y, int ldy,
                            int geglu, const g3c_qp_pre *pre, cudaStream_t st) {
    constexpr bool H2 = HL || qt_f16(QT);
    const int ks = v.ks, blocks = qp_blocks(w, ks);
    g3c_qp_pre none;
    memset(&none, 0, sizeof none);
    if constexpr (QT == G3Q_INT4 || (H2 && PC))
        if (v.rg) {
            auto kr = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, true, H2 ? -1 : 2>;
            if constexpr (QT == G3Q_INT4 && !H2) /* the half2 pairs (g3_dmat.sz) */
                if (v.kc == 3) kr = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, true, 2, 3>;
            if constexpr (M == 1 && !PN && !H2)
                if (v.u == 2)
                    kr = v.kc == 3 ? k_qgemv_p<QT, 1, 2, PC, HL, false, true, 2, 3> : k_qgemv_p<QT, 1, 2, PC, HL, false, true, 2>;
            return g3c_launch(kr, dim3(blocks), dim3(QP_T), v.smem, st, *w, x, ldx, m, y, ldy, geglu, v.gsh,
                              geglu ? 0 : 1, ks, pre ? *pre : none, qp_opt(M));
        }
    auto kern = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN>;
    if constexpr (QT == G3Q_INT4) {
        if (v.gs == 2) kern = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, false, 2>;
        if constexpr (!HL)
            if (v.kc)
                kern = v.kc == 3   ? k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, false, PN, false, 2, 3>
                       : v.kc == 1 ? k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, false, PN, false, -1, 1>
                                   : k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, false, PN, false, -1, 2>;
    }
    if constexpr (QT == G3Q_INT8 && !PC && HL)
        if (v.kc) kern = k_qgemv_p<QT, M, M == 1 ? 3 : 2, false, true, PN, false, -1, 2>;
    return g3c_launch(kern, dim3(blocks), dim3(QP_T), v.smem, st, *w, x, ldx, m, y, ldy, geglu, v.gsh,
                      geglu ? 0 : 1, ks, pre ? *pre : none, qp_opt(M));
}

/* launch_p for the variant qp_variant chose */
template <bool PN>
static cudaError_t launch_v(const g3_dmat *w, const qp_var &v, const float *x, int ldx, int m, float *y, int ldy,
                            int geglu, const g3c_qp_pre *pre, cudaStream_t st) {
#define QP_LV(QT, PC, HL)                                                                                              \
    return v.M == 1 ? launch_p<QT, 1, PC, HL, PN>(w, v, x, ldx, m, y, ldy, geglu, pre, st)                              \
                    : launch_p<QT, 2, PC, HL, PN>(w, v, x, ldx, m, y, ldy, geglu, pre, st)
    switch (v.qt) {
    case G3C_QT_I8H: QP_LV(G3C_QT_I8H, true, false);
    case G3Q_FP8: QP_LV(G3Q_FP8, true, false);
    case G3Q_INT4:
        if (v.hl) QP_LV(G3Q_INT4, false, true);
        QP_LV(G3Q_INT4, false, false);
    default:
        if (v.pc) {
            if (v.hl) QP_LV(G3Q_INT8, true, true);
            QP_LV(G3Q_INT8, true, false);
        }
        if (v.hl) QP_LV(G3Q_INT8, false, true);
        QP_LV(G3Q_INT8, false, false);
    }
#undef QP_LV
}

static int qp_usable(const g3_dmat *w, int m, int geglu, int pn) {
    return m >= 1 && m <= 2 && g3c_qgemv_supported(w, m) && g3c_qgemvp_enabled() && (!geglu || w->n % 2 == 0) &&
           qp_smem(m, w->k, 1, pn) <= QP_SMEM_MAX;
}

/* ---- the gate/up and down products in one launch (one row, $G3_CUDA_QPGD) ---------------------------------------- */
/* k_qgemv_gd: every block runs its share of the gate/up product with the add-norm prologue and GeGLU (GD 1: each warp
 * counts its finished outputs into its K-slice's counter of the down product), then takes a down unit (block vb of
 * the down product's K-sliced grid) in the order the blocks get there, slice-major, so the first blocks done take
 * slice 0, which is complete long before the last outputs of slice ks - 1: the down product's weights start streaming
 * while the gate/up product's tail still runs, where the kernel boundary left the DRAM idle between the last gate/up
 * block and the down product's first loads. The wait is the down unit's own (qp_gd_wait); no block waits at its end.
 * No deadlock: the down units wait only for gate/up work, which waits for nothing, and the grid is at most one block an
 * SM (launch bounds and shared memory), all resident. The last block out resets the counters for the next launch. */
template <int QT_, int M_, int U_, bool PC_, bool HL_, bool PN_, bool RG_, int GS_, int KC_> struct qp_k {
    static constexpr int QT = QT_, M = M_, U = U_, GS = GS_, KC = KC_;
    static constexpr bool PC = PC_, HL = HL_, PN = PN_, RG = RG_;
};
/* The down phase, a call of its own: inlined, the compiler computed what derives from the down product's shape and
 * the thread index at the kernel's start and kept it live through the gate/up phase's loop (in the int4 pairs, whose
 * gate/up product is at 128 registers alone, three scale registers a step went through local memory); through the
 * call, the kernel has no spills and no local memory in its loops (sm_90a: the 64 bytes of stack are the arguments) */
template <class D>
static __device__ __noinline__ void qp_gd_down(const g3_dmat &wd, float *a, int lda, int m, float *y, int ldy,
                                               int gsh_d, int ks, int opt_d, unsigned vb, unsigned nb_d,
                                               const qp_gd &gd) {
    const g3c_qp_pre none = {};
    qp_body<D::QT, D::M, D::U, D::PC, D::HL, D::PN, D::RG, D::GS, D::KC, 2>(wd, a, lda, m, y, ldy, 0, gsh_d, 1, ks,
                                                                           none, opt_d, vb, nb_d, threadIdx.x, gd);
}
template <class G, class D>
__global__ void __launch_bounds__(QP_T, 1) k_qgemv_gd(g3_dmat wg, g3_dmat wd, int m, float *a, int lda, float *y,
                                                      int ldy, int gsh_g, int gsh_d, int ks, int nb_d,
                                                      g3c_qp_pre pre, int opt_g, int opt_d, qp_gd gd) {
    __shared__ int vb_s;
    qp_body<G::QT, G::M, G::U, G::PC, G::HL, G::PN, G::RG, G::GS, G::KC, 1>(
        wg, pre.xi, wg.k, m, a, lda, 1, gsh_g, 0, 1, pre, opt_g, blockIdx.x, gridDim.x, threadIdx.x, gd);
    __syncthreads(); /* the block's warps are done with the gate/up phase's shared memory */
    if (threadIdx.x == 0) {
        const int t = (int)atomicAdd(gd.cnt + QP_GD_TICKET, 1u), nkb = nb_d / ks;
        vb_s = t < nb_d ? (t % nkb) * ks + t / nkb : -1; /* block vb takes slice vb % ks (qp_body) */
    }
    __syncthreads();
    const int vb = vb_s;
    if (vb >= 0) {
        qp_gd_down<D>(wd, a, lda, m, y, ldy, gsh_d, ks, opt_d, (unsigned)vb, (unsigned)nb_d, gd);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(gd.cnt + QP_GD_DONE, 1u) == gridDim.x - 1) {
            for (int i = 0; i < ks; i++) atomicExch(gd.cnt + i, 0u);
            atomicExch(gd.cnt + QP_GD_TICKET, 0u);
            atomicExch(gd.cnt + QP_GD_DONE, 0u);
        }
    }
}
typedef void (*qp_gd_fn)(g3_dmat, g3_dmat, int, float *, int, float *, int, int, int, int, int, g3c_qp_pre, int, int,
                         qp_gd);
/* the pairs built: the one-row variants the 27B / 4B / 1B shapes' gate/up and down products take by default (int4 in
 * groups of 128, per-channel int8 with the residual plane or on float16 products, fp8) */
struct qp_gd_pair {
    int g[9], d[9]; /* qt, M, u, pc, hl, pn, rg, gs, kc */
    qp_gd_fn fn;
};
template <class G, class D> static qp_gd_pair qp_gd_make() {
    return {{G::QT, G::M, G::U, G::PC, G::HL, G::PN, G::RG, G::GS, G::KC},
            {D::QT, D::M, D::U, D::PC, D::HL, D::PN, D::RG, D::GS, D::KC},
            k_qgemv_gd<G, D>};
}
typedef qp_k<G3Q_INT4, 1, 3, false, false, true, false, 2, 0> qp_g_i4;
typedef qp_k<G3Q_INT4, 1, 3, false, false, true, false, 2, 3> qp_g_i4sz;
typedef qp_k<G3C_QT_I8H, 1, 3, true, false, true, false, -1, 0> qp_g_i8h;
typedef qp_k<G3Q_INT8, 1, 3, true, true, true, true, -1, 0> qp_g_i8r;
typedef qp_k<G3Q_FP8, 1, 3, true, false, true, true, -1, 0> qp_g_f8r;
typedef qp_k<G3Q_FP8, 1, 3, true, false, true, false, -1, 0> qp_g_f8;
static const qp_gd_pair *qp_gd_pairs(int *n) {
    static qp_gd_pair p[10];
    static int np = 0;
    if (!np) {
        p[0] = qp_gd_make<qp_g_i4, qp_k<G3Q_INT4, 1, 3, false, false, false, true, 2, 0>>();
        p[1] = qp_gd_make<qp_g_i4, qp_k<G3Q_INT4, 1, 2, false, false, false, true, 2, 0>>();
        p[2] = qp_gd_make<qp_g_i8r, qp_k<G3Q_INT8, 1, 3, true, true, false, true, -1, 0>>();
        p[3] = qp_gd_make<qp_g_i8h, qp_k<G3Q_INT8, 1, 3, true, true, false, true, -1, 0>>();
        p[4] = qp_gd_make<qp_g_i8h, qp_k<G3C_QT_I8H, 1, 3, true, false, false, false, -1, 0>>();
        p[5] = qp_gd_make<qp_g_f8r, qp_k<G3Q_FP8, 1, 3, true, false, false, true, -1, 0>>();
        p[6] = qp_gd_make<qp_g_f8, qp_k<G3Q_FP8, 1, 3, true, false, false, true, -1, 0>>();
        p[7] = qp_gd_make<qp_g_f8, qp_k<G3Q_FP8, 1, 3, true, false, false, false, -1, 0>>();
        p[8] = qp_gd_make<qp_g_i4sz, qp_k<G3Q_INT4, 1, 3, false, false, false, true, 2, 3>>(); /* half2 pairs */
        p[9] = qp_gd_make<qp_g_i4sz, qp_k<G3Q_INT4, 1, 2, false, false, false, true, 2, 3>>();
        np = 10;
    }
    *n = np;
    return p;
}
static int qp_var_is(const qp_var &v, const int (&k)[9]) {
    return v.qt == k[0] && v.M == k[1] && v.u == k[2] && v.pc == k[3] && v.hl == k[4] && v.pn == k[5] &&
           v.rg == k[6] && v.gs == k[7] && v.kc == k[8];
}
/* the fused kernel for this pair of products at m rows, NULL where none is built or the shapes do not fit */
static qp_gd_fn qp_gd_pick(const g3_dmat *gu, const g3_dmat *dn, int m, qp_var *vg, qp_var *vd, int *nb_d) {
    if (m != 1 || gu->n != 2 * dn->k || !qp_usable(gu, m, 1, 1) || !qp_usable(dn, m, 0, 0)) return NULL;
    *vg = qp_variant(gu, m, 1, 1), *vd = qp_variant(dn, m, 0, 0);
    if (vd->ks < 2 || vd->ks > 8 || dn->k % vd->ks) return NULL; /* one slice: the wait would be a grid barrier */
    /* every warp's first row group in slice 0, so that slice 0 complete means every block has cleared its part of y
     * (qp_gd_wait) */
    if (dn->k / vd->ks < qp_blocks(gu, 1) * (QP_T / 32)) return NULL;
    *nb_d = qp_blocks(dn, vd->ks);
    if (*nb_d > qp_blocks(gu, 1)) return NULL; /* a down unit for every block at most */
    int n;
    const qp_gd_pair *p = qp_gd_pairs(&n);
    for (int i = 0; i < n; i++)
        if (qp_var_is(*vg, p[i].g) && qp_var_is(*vd, p[i].d)) return p[i].fn;
    return NULL;
}

int g3c_qgemv_gd_enabled(void) { /* $G3_CUDA_QPGD=1; read at every call */
    const char *e = getenv("G3_CUDA_QPGD");
    return e && !strcmp(e, "1");
}

static cudaError_t qp_gd_init(void) { /* the fused kernels' shared memory, once (g3c_qgemv_init first) */
    static int done = 0;
    cudaError_t e = g3c_qgemv_init();
    if (e != cudaSuccess || done) return e;
    if (qp_n_sm <= 0 || !qp_ring_ok) return cudaErrorNotSupported;
    int n;
    const qp_gd_pair *p = qp_gd_pairs(&n);
    for (int i = 0; i < n && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(p[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, QP_SMEM_RG);
    if (e == cudaSuccess) done = 1;
    return e;
}

int g3c_qgemv_gd_ok(const g3_dmat *gu, const g3_dmat *dn, int m) {
    if (qp_gd_init() != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    qp_var vg, vd;
    int nb;
    return qp_gd_pick(gu, dn, m, &vg, &vd, &nb) != NULL;
}

cudaError_t g3c_qgemv_gd(const g3_dmat *gu, const g3c_qp_pre *pre, const g3_dmat *dn, int m, float *a, int lda,
                         float *y, int ldy, unsigned *cnt, cudaStream_t st) {
    if (!pre || !pre->y || !pre->xo || !pre->xi || !cnt || lda < dn->k) return cudaErrorInvalidValue;
    const uintptr_t al = (uintptr_t)pre->xi | (uintptr_t)pre->y | (uintptr_t)pre->xo | (uintptr_t)pre->w1 |
                         (uintptr_t)pre->w2 | (uintptr_t)a | (uintptr_t)(lda * 4);
    if (al & 15) return cudaErrorInvalidValue;
    cudaError_t e = qp_gd_init();
    if (e != cudaSuccess) return e;
    qp_var vg, vd;
    int nb_d;
    const qp_gd_fn fn = qp_gd_pick(gu, dn, m, &vg, &vd, &nb_d);
    if (!fn) return cudaErrorNotSupported;
    qp_gd gd = {cnt, dn->k / vd.ks};
    e = g3c_launch(fn, dim3(qp_blocks(gu, 1)), dim3(QP_T), vg.smem > vd.smem ? vg.smem : vd.smem, st, *gu, *dn, m, a,
                   lda, y, ldy, vg.gsh, vd.gsh, vd.ks, nb_d, *pre, qp_opt(m), qp_opt(m), gd);
    return e == cudaSuccess ? cudaGetLastError() : e;
}

int g3c_pnorm_mode(void) { /* $G3_CUDA_PNORM: 0 the separate add-norm kernel, 1 the prologue, unset -1 (auto) */
    const char *e = getenv("G3_CUDA_PNORM");
    return e && *e ? !!atoi(e) : -1;
}

int g3c_qgemv_pn_supported(const g3_dmat *w, int m, int geglu) { return qp_usable(w, m, geglu, 1); }

/* The one launch of the persistent kernel: the residual plane up to lo_rows(w), the add-norm prologue when pre->y. */
static cudaError_t qp_launch(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu,
                             const g3c_qp_pre *pre, cudaStream_t st) {
    const int pn = pre && pre->y;
    const qp_var v = qp_variant(w, m, geglu, pn);
    cudaError_t e = pn ? launch_v<true>(w, v, x, ldx, m, y, ldy, geglu, pre, st)
                       : launch_v<false>(w, v, x, ldx, m, y, ldy, geglu, pre, st);
    return e == cudaSuccess ? cudaGetLastError() : e;
}

cudaError_t g3c_qgemv_pn(const g3_dmat *w, const g3c_qp_pre *pre, int m, float *y, int ldy, int geglu,
                         cudaStream_t st) {
    if (!qp_usable(w, m, geglu, pre->y != NULL) || (pre->y && !pre->xo) || !pre->xi) return cudaErrorInvalidValue;
    const uintptr_t al = (uintptr_t)pre->xi | (uintptr_t)pre->y | (uintptr_t)pre->xo | (uintptr_t)pre->w1 |
                         (uintptr_t)pre->w2;
    if (al & 15) return cudaErrorInvalidValue;
    cudaError_t e = g3c_qgemv_init();
    if (e != cudaSuccess) return e;
    if (qp_n_sm <= 0) return cudaErrorInvalidValue;
    return qp_launch(w, pre->xi, w->k, m, y, ldy, geglu, pre, st);
}

int g3c_qgemvp_kslices(const g3_dmat *w, int geglu, int *n_sm) {
    if (g3c_qgemv_init() != cudaSuccess || qp_n_sm <= 0) return 0;
    *n_sm = qp_n_sm;
    return qp_kslices(w, geglu, 0);
}

/* the policy queries below (tests): the product takes this kernel at m rows, on a GPU that was set up */
static int qp_query_ok(const g3_dmat *w, int m, int geglu, int pn) {
    return qp_usable(w, m, geglu, pn) && g3c_qgemv_init() == cudaSuccess && qp_n_sm > 0;
}

int g3c_qgemvp_ring(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return qp_ring_take(w, m, qp_kslices(w, geglu, pn), m <= lo_rows(w) || qp_f16(w, geglu, pn), pn);
}

int g3c_qgemvp_f16(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return qp_f16(w, geglu, pn);
}

int g3c_qgemvp_kc(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return qp_kc_take(w, m <= lo_rows(w)); /* qp_launch's hl */
}

int g3c_qgemvp_sz(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return qp_variant(w, m, geglu, pn).kc == 3;
}

int g3c_qgemvp_usable(const g3_dmat *w, int m, int geglu) {
    if (!qp_usable(w, m, geglu, 0) || g3c_qgemv_init() != cudaSuccess) return 0;
    return qp_n_sm > 0;
}

cudaError_t g3c_qgemvp(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu,
                       cudaStream_t st) {
    return qp_launch(w, x, ldx, m, y, ldy, geglu, NULL, st);
}
