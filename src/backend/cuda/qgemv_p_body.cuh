/* The body of the persistent one- and two-row dp4a product (k_qgemv_p; qgemv_p.cu launches it, and qgemv_gd.cu's
 * fused gate/up + down kernel runs it twice), with its device helpers: the activations' quantization into shared
 * memory, the add-norm prologue, the weight ring and the fused launch's counters. What each variant is for and what it
 * measured: qgemv_p.cu and qgemv_p_policy.cu. */
#pragma once
#include "backend/cuda/qgemv_p_policy.cuh"
#include "backend/cuda/scale_codes.cuh"

/* One block of QP_T threads per SM: the block quantizes x into shared memory itself (same layout and rounding as k_q8,
 * no separate launch), then each warp walks its row groups (2 rows; row group g = warp id + total warps * j) step by
 * step (U chunks per row and lane, whole rows per warp: no cross-warp reduction), the next step's weights always in
 * flight across row-group boundaries, and writes each row group's outputs (or GeGLU) after a warp reduction. The
 * first step's weights are loaded before the programmatic-dependent-launch wait. Shared memory: q [M][k], q_lo [M][k]
 * (HL), (d, sum) [M][k/32]: at k = 21504, M = 2 with the residual plane 97 KB. */

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
