/* Small-batch products (3..64 activation rows; $G3_CUDA_TQGMIN) on GGUF weights in groups of 32 (Q8_0 as int8, Q4_0 /
 * Q4_K as int4: one float scale, and for int4 an offset, per group) and 16 (Q6_K as int8) with int8 tensor cores:
 * y += x W^T, each mma.sync m16n8k32 (m16n8k16 for groups of 16) one group, its int32 sums scaled by the group's
 * scale as they come out.
 *
 * Why: these formats ran on the staged bf16 kernel (tc_stage.cu: weights dequantized to bf16 in registers, two bf16
 * MMAs per 32 values, ~12.8 instructions per MMA) from 9 rows and on the dp4a kernel (qgemv.cu) at 3..8 (H200, 27B
 * Q4_K at 8 rows: 13.1 ms a step there, 8.7 here), while int4 in groups of 128 takes the int8 tensor cores of
 * tc_q8.cu, which turn int32 sums into floats once per 128 values. A group of 32 is one k32 MMA, so here each MMA's
 * four sums are scaled at once: per output and group one int -> float, one fma by the group's scale, and for int4 one
 * fma of the offset by the activations' sum over the group; per block of 128 one fma by the activations' scale.
 *
 * Layout. The activations are tc_q8.cu's (quantized per row and block of 128 by their producer or k_tq_quant: value
 * order 0 for int8, 1 for int4), so nothing upstream changes. A stage is 128 weight bytes per row (int4: 256 values,
 * 8 groups; int8: 128 values, 4 groups), 8 chunks of 16 bytes, copied by cp.async into a per-warp ring as in tc_q8.cu
 * (lane (g, t) copies chunks t and 4 + t of rows g and g + 8 of each tile), but each MMA must hold one group, while a
 * lane's chunk is a whole group (int4) or half of one (int8). So the lanes read each other's chunks: for the MMA of
 * group j of a round (4 chunks; int4 4 groups, int8 2),
 *   int4: lane t takes word t (values 8t..8t+7) of chunk j: a0 / a1 = its low nibbles (values 0, 2, 4, 6) of rows g /
 *         g + 8, a2 / a3 the high ones (1, 3, 5, 7); b0 / b1 the activations of those values (value order 1 stores
 *         each 8 as x0 x2 x4 x6 x1 x3 x5 x7, so one 8-byte load);
 *   int8: lane t takes bytes 8t..8t+7 of the group (chunk 2j + t / 2, half t % 2): a0 / a1 the first 4, a2 / a3 the
 *         next 4, b0 / b1 the activations of the same values (natural order);
 *   int8 in groups of 16 (8 a stage, 4 a round): the chunk is the group; lane t takes word t (values 4t..4t+3) of
 *         chunk j as a0 / a1 of m16n8k16, b0 its activations.
 * Chunks sit in the ring at a permuted position (tg_pos) so that these cross-lane reads are free of bank conflicts;
 * the activation rows' 32-byte segments are XORed with the row (mod 4) for the same reason. The groups' scales (and
 * offsets) of a unit come through the same cp.async groups into a per-warp scale ring; int4's per-group sums of the
 * quantized activations are made once per unit by the threads that copied each group (from their own copies, before
 * the unit's barrier). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/scale_codes.cuh"
#include "backend/cuda/tc_frag.cuh"
#include "backend/cuda/tq_inst.cuh"

#define TG_WARPS 8
static_assert(TG_WARPS * 32 == TQ_THREADS, "tq_inst.cuh launches 8 warps a block");

/* the formats, as the kernel's QT: G3Q_INT8 (groups of 32, Q8_0), G3Q_INT4 (groups of 32, Q4_0 / Q4_K), TG_Q8G16
 * (int8 in groups of 16, Q6_K: one m16n8k16 MMA a group) */
#define TG_Q8G16 16
template <int QT> struct tg_c {
    static constexpr int KS = QT == G3Q_INT4 ? 256 : 128; /* values per row and stage */
    static constexpr int GS = QT == TG_Q8G16 ? 16 : 32;    /* values per group */
    static constexpr int GPS = KS / GS;                     /* groups per stage */
    static constexpr int GPB = 128 / GS;                    /* groups per activation block */
    static constexpr int GPR = GPS / 2;                     /* groups per round (4 chunks) */
    static constexpr int SEGS = KS / 128;                   /* activation blocks per stage */
    static constexpr int SEGX = KS / 32;                    /* 32-byte activation segments per row and stage */
    static constexpr int UPR = KS / 16;                     /* 16-byte activation units per row */
    static constexpr int ZS = QT == G3Q_INT4 ? 2 : 1;       /* scale arrays: s (and z) */
};

/* ring position of chunk c (0..3) of a round for row g of a tile: int4 and int8/16 read word t of chunk j in every
 * lane t (LDS.32: banks 16 (g & 1) + 4 (j ^ ((g >> 1) & 3)) + t, all 32 distinct), int8/32 bytes 8 (t & 1) of chunk
 * 2j + t/2 (LDS.64, per half warp g = 0..3 or 4..7: 8 distinct 16-byte units) */
template <int QT> static __device__ __forceinline__ int tg_pos(int g, int c) {
    return 4 * g + (QT != G3Q_INT8 ? c ^ ((g >> 1) & 3) : c ^ (((g >> 1) & 1) << 1));
}

/* index of group G of row r (0..15) of tile tt in a scale slot [ZS][T][16][GPS] floats; int4's 8 groups a row are
 * two 16-byte halves, swapped in rows 4..7 and 12..15 so that rows g = 0..7 read distinct banks */
template <int QT, int T> static __device__ __forceinline__ int tg_sidx(int zi, int tt, int r, int G) {
    constexpr int GPS = tg_c<QT>::GPS;
    return ((zi * T + tt) * 16 + r) * GPS + (GPS == 8 ? G ^ (((r >> 2) & 1) << 2) : G);
}

/* KC: the scale slot holds the file's scale codes instead (g3_dmat.kc: [T][16][GPS] u16, then for Q4_K kd: [T][16]
 * u32 at byte 32 T GPS) */
template <int QT, int T> static __device__ __forceinline__ int tg_kd_off() { return 32 * T * tg_c<QT>::GPS; }

/* the groups' scales (and offsets) of unit (tile, stage) into the warp's scale slot; groups past the row as zeros.
 * KC 1 (Q4_K) / 2 (Q4_0, Q8_0): their codes (2 bytes a group, Q4_K's d and -dmin 4 bytes a row and stage of 8) */
template <int QT, int T, int KC>
static __device__ __forceinline__ void tg_load_s(const g3_dmat &w, int tile, int stage, int wi, int lane, float *ss) {
    constexpr int GPS = tg_c<QT>::GPS, CPR = GPS / 4, NCH = tg_c<QT>::ZS * T * 16 * CPR;
    const int n = w.n, ngr = w.k / tg_c<QT>::GS;
    if constexpr (KC) { /* 8 bytes (4 codes) a chunk: rows' code offsets are multiples of 4 (k % 128 == 0) */
        uint16_t *cs = (uint16_t *)ss;
#pragma unroll
        for (int q = lane; q < T * 16 * CPR; q += 32) {
            const int ci = q % CPR, r = (q / CPR) % 16, tt = q / (CPR * 16);
            const int row = min(((tile * TG_WARPS + wi) * T + tt) * 16 + r, n - 1), grp = stage * GPS + 4 * ci;
            uint16_t *d = cs + (tt * 16 + r) * GPS + 4 * ci;
            if (grp < ngr) g3c_cp8(d, w.kc + (size_t)row * ngr + grp);
            else *(uint2 *)d = make_uint2(0, 0);
        }
        if constexpr (KC == 1) /* Q4_K: k % 256 == 0, a stage is one super-block of 8 groups */
            for (int q = lane; q < T * 16; q += 32) {
                const int r = q % 16, tt = q / 16;
                const int row = min(((tile * TG_WARPS + wi) * T + tt) * 16 + r, n - 1);
                g3c_cp4((unsigned char *)ss + tg_kd_off<QT, T>() + 4 * q, w.kd + ((size_t)row * ngr + stage * GPS) / 8);
            }
    } else {
#pragma unroll
        for (int q = lane; q < NCH; q += 32) {
            const int ci = q % CPR, r = (q / CPR) % 16, tt = (q / (CPR * 16)) % T, zi = q / (CPR * 16 * T);
            const int row = min(((tile * TG_WARPS + wi) * T + tt) * 16 + r, n - 1), grp = stage * GPS + 4 * ci;
            float *d = ss + tg_sidx<QT, T>(zi, tt, r, 4 * ci);
            if (grp < ngr) g3c_cp16(d, (zi ? w.z : w.s) + (size_t)row * ngr + grp);
            else *(float4 *)d = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

/* activations of stage `stage` into buffer xs ([MP][UPR] units, 32-byte segment G of row i at G ^ (i & 3)) and ds
 * ([SEGS][MP] float2 (d, d * sum q)); each thread copies whole segments (two units: a group of 32), rows >= m stay
 * zero. The same threads take the same segments of every stage (tg_sums). */
template <int QT, int NT>
static __device__ __forceinline__ void tg_stage_x(uint4 *xs, float2 *ds, const int8_t *xq, const float2 *xd, int m,
                                                  int K, int stage) {
    constexpr int KS = tg_c<QT>::KS, UPR = tg_c<QT>::UPR, SEGX = tg_c<QT>::SEGX, MP = 8 * NT, SEGS = tg_c<QT>::SEGS;
    for (int idx = threadIdx.x; idx < m * SEGX; idx += TG_WARPS * 32) {
        const int i = idx / SEGX, G = idx % SEGX, kk = stage * KS + 32 * G;
        uint4 *d = xs + i * UPR + 2 * (G ^ (i & 3));
        if (kk < K) g3c_cp16(d, xq + (size_t)i * K + kk), g3c_cp16(d + 1, xq + (size_t)i * K + kk + 16);
        else d[0] = make_uint4(0, 0, 0, 0), d[1] = make_uint4(0, 0, 0, 0);
    }
    tq_stage_d<SEGS>(ds, xd, m, MP, K, stage);
}

/* int4: the sums of the quantized activations over each group of buffer xs into gs ([GPS][MP] floats), by the
 * threads that copied the groups (their own cp.async copies are visible to them once waited for) */
template <int QT, int NT>
static __device__ __forceinline__ void tg_sums(const uint4 *xs, float *gs, int m) {
    constexpr int UPR = tg_c<QT>::UPR, GPS = tg_c<QT>::GPS, MP = 8 * NT;
    for (int idx = threadIdx.x; idx < m * GPS; idx += TG_WARPS * 32) {
        const int i = idx / GPS, G = idx % GPS;
        const uint4 *d = xs + i * UPR + 2 * (G ^ (i & 3));
        const uint4 a = d[0], b = d[1];
        int s = __dp4a((int)a.x, 0x01010101, 0);
        s = __dp4a((int)a.y, 0x01010101, s), s = __dp4a((int)a.z, 0x01010101, s), s = __dp4a((int)a.w, 0x01010101, s);
        s = __dp4a((int)b.x, 0x01010101, s), s = __dp4a((int)b.y, 0x01010101, s), s = __dp4a((int)b.z, 0x01010101, s);
        s = __dp4a((int)b.w, 0x01010101, s);
        gs[G * MP + i] = (float)s;
    }
}

/* T tiles of 16 rows per warp, NT tiles of 8 activation rows */
template <int QT, int NT, int T, int MINB, int KC>
__global__ void __launch_bounds__(TG_WARPS * 32, MINB)
    k_tqg(g3_dmat w, const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int m, float *__restrict__ y, int S,
          long long L) {
    constexpr int GPS = tg_c<QT>::GPS, GPR = tg_c<QT>::GPR, GPB = tg_c<QT>::GPB, SEGS = tg_c<QT>::SEGS;
    constexpr int UPR = tg_c<QT>::UPR, MP = 8 * NT, G16 = QT == TG_Q8G16;
    constexpr int WSLOT = 2 * T * 2 * 32, SSLOT = tg_c<QT>::ZS * T * 16 * GPS, I4 = QT == G3Q_INT4;
    /* ring [3][warps][WSLOT] uint4, scale ring [3][warps][SSLOT] floats, xs [3][MP][UPR] uint4, ds [3][SEGS][MP]
     * float2, gs (int4) [3][GPS][MP] floats */
    extern __shared__ uint4 tg_sm[];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wi = threadIdx.x >> 5;
    const int n = w.n, K = w.k;
    const long long u0 = L * blockIdx.x / gridDim.x, u1 = L * (blockIdx.x + 1) / gridDim.x;
    uint4 *ring = tg_sm + wi * WSLOT; /* + slot * warps * WSLOT */
    float *sring = (float *)(tg_sm + 3 * TG_WARPS * WSLOT) + wi * SSLOT;
    uint4 *xsb = tg_sm + 3 * TG_WARPS * WSLOT + 3 * TG_WARPS * SSLOT / 4;
    float2 *dsb = (float2 *)(xsb + 3 * MP * UPR);
    float *gsb = (float *)(dsb + 3 * SEGS * MP);
    tq_walk wk(u0, S); /* (tile, stage) of units u, u + 1, u + 2 */
    const int wpos = tg_pos<QT>(g, t); /* where this lane's chunks go in the ring */
    /* the weights and scales do not depend on the previous kernel: start their copies before waiting for it */
    if (u0 < u1)
        tq_load_w<T>(w, wk.tl0, wk.st0, wi, lane, wpos, ring), tg_load_s<QT, T, KC>(w, wk.tl0, wk.st0, wi, lane, sring);
    g3c_cp_commit();
    if (u0 + 1 < u1)
        tq_load_w<T>(w, wk.tl1, wk.st1, wi, lane, wpos, ring + TG_WARPS * WSLOT),
            tg_load_s<QT, T, KC>(w, wk.tl1, wk.st1, wi, lane, sring + TG_WARPS * SSLOT);
    g3c_cp_commit();
    g3c_pdl_wait();
    if (u0 >= u1) {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        return;
    }
    tq_zero_rows<UPR, SEGS>(xsb, dsb, MP, m);
    if constexpr (I4)
        for (int idx = threadIdx.x; idx < 3 * GPS * MP; idx += TG_WARPS * 32)
            if (idx % MP >= m) gsb[idx] = 0.f;
    tg_stage_x<QT, NT>(xsb, dsb, xq, xd, m, K, wk.st0);
    g3c_cp_commit();
    if (u0 + 1 < u1) tg_stage_x<QT, NT>(xsb + MP * UPR, dsb + SEGS * MP, xq, xd, m, K, wk.st1);
    g3c_cp_commit();
    float acc[T][NT][4];
    tc_zero(acc);
    int it = 0; /* ring slot and activation buffer of unit u: (u - u0) % 3 */
    for (long long u = u0; u < u1; u++) {
        asm volatile("cp.async.wait_group 1;" ::: "memory"); /* all but unit u + 1's copies have landed */
        if constexpr (I4) tg_sums<QT, NT>(xsb + it * MP * UPR, gsb + it * GPS * MP, m);
        __syncthreads(); /* everyone's copies (and sums) of unit u are visible; unit u - 1's buffers are free */
        {
            const int ns = it == 0 ? 2 : it - 1;
            if (u + 2 < u1) {
                tq_load_w<T>(w, wk.tl2, wk.st2, wi, lane, wpos, ring + ns * TG_WARPS * WSLOT);
                tg_load_s<QT, T, KC>(w, wk.tl2, wk.st2, wi, lane, sring + ns * TG_WARPS * SSLOT);
                tg_stage_x<QT, NT>(xsb + ns * MP * UPR, dsb + ns * SEGS * MP, xq, xd, m, K, wk.st2);
            }
            g3c_cp_commit();
        }
        const uint2 *xs = (const uint2 *)(xsb + it * MP * UPR);
        const float2 *ds = dsb + it * SEGS * MP;
        const float *gs = gsb + it * GPS * MP;
        const uint4 *ws = ring + it * TG_WARPS * WSLOT;
        const float *ss = sring + it * TG_WARPS * SSLOT;
#pragma unroll
        for (int sg = 0; sg < SEGS; sg++) {
            float blk[T][NT][4];
            tc_zero(blk);
#pragma unroll
            for (int gi = 0; gi < GPB; gi++) {
                const int G = GPB * sg + gi, rl = G / GPR, j = G % GPR; /* group of the stage, its round and place */
                uint32_t b0[NT], b1[NT];
                float2 gx[NT];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int row = 8 * nt + g;
                    if constexpr (G16) { /* values 4t..4t+3 of the group: half G & 1 of segment G / 2 */
                        b0[nt] = ((const uint32_t *)xs)[row * (4 * UPR) + 8 * ((G >> 1) ^ (row & 3)) + 4 * (G & 1) + t];
                        b1[nt] = 0;
                    } else {
                        const uint2 xv = xs[row * (2 * UPR) + 4 * (G ^ (row & 3)) + t];
                        b0[nt] = xv.x, b1[nt] = xv.y;
                    }
                    if constexpr (I4) gx[nt] = *(const float2 *)(gs + G * MP + 8 * nt + 2 * t);
                }
#pragma unroll
                for (int tt = 0; tt < T; tt++) {
                    const uint4 *wr = ws + ((rl * T + tt) * 2) * 32;
                    uint32_t a0, a1, a2 = 0, a3 = 0;
                    if constexpr (G16) { /* word t of chunk j = group G */
                        const int p = tg_pos<QT>(g, j);
                        a0 = ((const uint32_t *)(wr + p))[t], a1 = ((const uint32_t *)(wr + 32 + p))[t];
                    } else if constexpr (I4) {
                        const int p = tg_pos<QT>(g, j);
                        const uint32_t ua = ((const uint32_t *)(wr + p))[t], ub = ((const uint32_t *)(wr + 32 + p))[t];
                        a0 = ua & 0x0F0F0F0Fu, a2 = (ua >> 4) & 0x0F0F0F0Fu;
                        a1 = ub & 0x0F0F0F0Fu, a3 = (ub >> 4) & 0x0F0F0F0Fu;
                    } else {
                        const int p = tg_pos<QT>(g, 2 * j + (t >> 1));
                        const uint2 va = ((const uint2 *)(wr + p))[t & 1], vb = ((const uint2 *)(wr + 32 + p))[t & 1];
                        a0 = va.x, a2 = va.y, a1 = vb.x, a3 = vb.y;
                    }
                    float sa, sb, za = 0.f, zb = 0.f;
                    if constexpr (KC) { /* the values g3_dmat.s and z hold, bit for bit (convert.cu) */
                        const uint16_t *cs = (const uint16_t *)ss;
                        const uint32_t *kd = (const uint32_t *)((const unsigned char *)ss + tg_kd_off<QT, T>());
                        const uint32_t da = KC == 1 ? kd[tt * 16 + g] : 0u, db = KC == 1 ? kd[tt * 16 + g + 8] : 0u;
                        g3c_kc_scales<KC>(cs[(tt * 16 + g) * GPS + G], da, sa, za);
                        g3c_kc_scales<KC>(cs[(tt * 16 + g + 8) * GPS + G], db, sb, zb);
                    } else {
                        sa = ss[tg_sidx<QT, T>(0, tt, g, G)], sb = ss[tg_sidx<QT, T>(0, tt, g + 8, G)];
                        if constexpr (I4)
                            za = ss[tg_sidx<QT, T>(1, tt, g, G)], zb = ss[tg_sidx<QT, T>(1, tt, g + 8, G)];
                    }
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        int c[4] = {0, 0, 0, 0};
                        if constexpr (G16) tc_mma_s8k16(c, a0, a1, b0[nt]);
                        else tc_mma_s8(c, a0, a1, a2, a3, b0[nt], b1[nt]);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float &b = blk[tt][nt][e];
                            b = fmaf(e >> 1 ? sb : sa, g3c_i2f_exact(c[e]), b);
                            if constexpr (I4) b = fmaf(e >> 1 ? zb : za, e & 1 ? gx[nt].y : gx[nt].x, b);
                        }
                    }
                }
            }
            /* block sg done: y += d blk (d of the activation rows 2t, 2t + 1) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float4 dd = *(const float4 *)(ds + sg * MP + 8 * nt + 2 * t);
#pragma unroll
                for (int tt = 0; tt < T; tt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[tt][nt][e] = fmaf(e & 1 ? dd.z : dd.x, blk[tt][nt][e], acc[tt][nt][e]);
            }
        }
        if (u + 1 == u1 || wk.st0 + 1 == S) { /* tile done (or this block's share of it): add into y */
#pragma unroll
            for (int tt = 0; tt < T; tt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    tc_tile_add(acc[tt][nt], y, n, m, ((wk.tl0 * TG_WARPS + wi) * T + tt) * 16, nt, g, t, NULL);
        }
        wk.next(S);
        it = it == 2 ? 0 : it + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */
/* tg_table[occupancy][int8, int4, int8 in groups of 16][NT 1, 2, 4, 8]; occupancy 0: one block per SM, two tiles
 * per warp (one at NT = 8); 1: one tile per warp, two blocks per SM */
static tq_inst tg_table[2][3][4];
/* the same reading the files' scale codes (g3_dmat.kc): [occupancy][Q4_K, Q4_0, Q8_0][NT] */
static tq_inst tg_kc_table[2][3][4];
static int tg_ready;
static long long tg_kc_count;
long long g3c_tqg_kc_launches(void) { return tg_kc_count; }

template <int QT, int NT, int OCC, int KC = 0> static tq_inst tg_mk() {
    constexpr int T = NT == 8 || OCC ? 1 : 2, MP = 8 * NT;
    constexpr int WSLOT = 2 * T * 2 * 32, SSLOT = tg_c<QT>::ZS * T * 16 * tg_c<QT>::GPS;
    const int smem = 3 * TG_WARPS * WSLOT * 16 + 3 * TG_WARPS * SSLOT * 4 + 3 * MP * tg_c<QT>::UPR * 16 +
                     3 * tg_c<QT>::SEGS * MP * 8 + (QT == G3Q_INT4 ? 3 * tg_c<QT>::GPS * MP * 4 : 0);
    tq_inst r = {k_tqg<QT, NT, T, OCC ? 2 : 1, KC>, smem, TG_WARPS * T * 16, 0};
    return r;
}
template <int QT, int OCC, int KC = 0> static void tg_row(tq_inst *row) {
    row[0] = tg_mk<QT, 1, OCC, KC>(), row[1] = tg_mk<QT, 2, OCC, KC>(), row[2] = tg_mk<QT, 4, OCC, KC>();
    row[3] = tg_mk<QT, 8, OCC, KC>();
}
template <int OCC> static void tg_kc_rows(tq_inst (*t)[4]) { /* tg_kc_table[OCC]: Q4_K, Q4_0, Q8_0 */
    tg_row<G3Q_INT4, OCC, 1>(t[0]), tg_row<G3Q_INT4, OCC, 2>(t[1]), tg_row<G3Q_INT8, OCC, 2>(t[2]);
}
static void tg_build(void) {
    if (tg_ready) return;
    tg_row<G3Q_INT8, 0>(tg_table[0][0]);
    tg_row<G3Q_INT4, 0>(tg_table[0][1]);
    tg_row<TG_Q8G16, 0>(tg_table[0][2]);
    tg_row<G3Q_INT8, 1>(tg_table[1][0]);
    tg_row<G3Q_INT4, 1>(tg_table[1][1]);
    tg_row<TG_Q8G16, 1>(tg_table[1][2]);
    tg_kc_rows<0>(tg_kc_table[0]), tg_kc_rows<1>(tg_kc_table[1]);
    tg_ready = 1;
}

int g3c_tqg_supported(const g3_dmat *w) {
    const char *e = getenv("G3_CUDA_TQG"); /* 0: the staged bf16 kernel (tc_stage.cu), dp4a below 9 rows */
    if (e && !strcmp(e, "0")) return 0;
    if (!((w->qt == G3Q_INT8 && (w->g == 32 || w->g == 16)) || (w->qt == G3Q_INT4 && w->g == 32))) return 0;
    if (w->k % 128 != 0 || w->n < 1) return 0;
    /* the scale copies are 16-byte cp.async from each row's groups (k / g a multiple of 4) */
    return ((uintptr_t)w->s & 15) == 0 && (w->qt != G3Q_INT4 || ((uintptr_t)w->z & 15) == 0);
}

/* Where the file's scale codes are resident (g3_dmat.kc, kd: kept unless $G3_CUDA_Q4KC=0 at create) the products
 * read them instead of the float scales and offsets (g3_dmat.s, z), decoding them as they use them: Q4_K 2.5 bytes a
 * group of 32 weights against 8 (0.58 bytes a weight instead of 0.75), Q4_0 2 (0.56), Q8_0 2 against 4 (1.06 instead
 * of 1.13); Q4_K up to 16 rows ($G3_CUDA_TQGKC=all: at every row count), where its decode (two conversions and two
 * products a group and row) costs less than the bytes it saves. $G3_CUDA_TQGKC=0: the floats always. Read at every
 * call. H200, session 40 run 06 (27B tok/s, against TQGKC=0, `gemma3 bench --random-weights 27b --type T --backend
 * cuda -p 16 -n 32 -r 1 -b ...`): Q4_K 4 / 8 / 16 / 32 seqs 522-524 / 1030 / 1721-1723 / 2361-2383 against 492 /
 * 949-951 / 1721-1726 / 2398-2412; Q4_0 8 / 32 1184 / 2602 against 949 / 2517; Q8_0 851 / 2540 against 772 / 2474;
 * Q4_K_M 925 / 2261 against 866 / 2279. The table row of tg_kc_table, or -1 for the floats. */
static int tg_kc_variant(const g3_dmat *w, int m) {
    const char *e = getenv("G3_CUDA_TQGKC");
    if ((e && !strcmp(e, "0")) || !w->kc || w->g != 32) return -1;
    if (w->qt == G3Q_INT4 && w->kd) return w->k % 256 == 0 && (m <= 16 || (e && !strcmp(e, "all"))) ? 0 : -1;
    return w->qt == G3Q_INT4 ? 1 : w->qt == G3Q_INT8 ? 2 : -1;
}

/* $G3_CUDA_TQGMIN: fewest rows taken here (3..9, default 3): below 9 instead of the dp4a kernel of qgemv.cu */
int g3c_tqg_min_rows(void) {
    const char *e = getenv("G3_CUDA_TQGMIN");
    const int v = e && *e ? atoi(e) : 3;
    return v < 3 ? 3 : v > 9 ? 9 : v;
}

cudaError_t g3c_tqg_init(void) {
    tg_build();
    for (int v = 0; v < 24; v++) {
        cudaError_t e = tq_inst_setup(&tg_table[v / 12][(v / 4) % 3][v % 4]);
        if (e == cudaSuccess) e = tq_inst_setup(&tg_kc_table[v / 12][(v / 4) % 3][v % 4]);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t g3c_tqg_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st) {
    if (!g3c_tqg_supported(w) || m < 1 || m > 64) return cudaErrorInvalidValue;
    tg_build();
    const int occ2 = tq_occ2(w, m);
    const int f = w->qt == G3Q_INT4 ? 1 : w->g == 16 ? 2 : 0, nt = m <= 8 ? 0 : m <= 16 ? 1 : m <= 32 ? 2 : 3;
    const int kc = tg_kc_variant(w, m);
    tq_inst *ti = kc >= 0 ? &tg_kc_table[occ2][kc][nt] : &tg_table[occ2][f][nt];
    tg_kc_count += kc >= 0;
    cudaError_t e = tq_inst_setup(ti); /* no-op after g3c_tqg_init */
    return e == cudaSuccess ? tq_inst_run(ti, w, xq, xd, m, y, n_sm, st) : e;
}
