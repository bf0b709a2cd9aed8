/* int4 products (groups of 128), per-channel int8 and fp8 (e4m3) products at 1..32 activation rows on the tensor cores
 * (mma.sync m16n8k32) with the weights loaded straight into registers: y += x W^T, the activations already quantized
 * per row and block of 128 by their producer in the order the int8 tensor-core products read (tq_act.cuh: il 1 for
 * int4, 0 for int8; fp8: e4m3 hi + lo parts, the lo rows after the m hi rows, g3c_wgf_lo_row). Taken by g3c_tq_mm /
 * g3c_tq_mm_pre (before any other kernel) for int4 matrices of >= 20 MB and int8 / fp8 ones of >= 100 MB, at 3..8
 * rows by default (g3c_tq_min_rows; fp8 from 3 rows through g3c_tq_small) instead of tc_q8.cu's one-tile kernel
 * (int4, int8) or tc_gemv.cu's bf16 hi + lo activations (fp8), and fp8 matrices of k <= 5376 also at 9..16 rows
 * instead of tc_stage.cu's staged bf16 kernel (q4r_max_env). $G3_CUDA_Q4R=0: never; $G3_CUDA_Q4RMIN=n: from n MB;
 * $G3_CUDA_Q4RMAX=8|16|32: up to that many rows for every format and k; fp8 also follows $G3_CUDA_WGF=0 (no e4m3
 * MMAs). Beyond 8 rows the MMAs' 8 columns hold NT column tiles of 8 activation rows (NT = 2 at 9..16, 4 at 17..32),
 * each A fragment (the weights) taken by NT MMAs.
 *
 * Why: tc_q8.cu at 3..8 rows stages the weights through a cp.async ring in shared memory with a block barrier every
 * unit: the 27B int4 gate/up product at 8 rows read its 130 MB at ~2.2 TB/s (58.5 us a layer, session 35). Here a
 * warp waits on nothing but its own loads. It takes units of (16 rows, G groups of 128 values); lane (gid = lane / 4,
 * t = lane % 4) loads the 16 bytes at byte 16 t of each group's 64 (int4; int8: 32 bytes at 32 t of 128) of rows gid
 * and gid + 8 (a partial last tile repeats the last row), D units ahead, with the L2 256-byte prefetch hint and no L1
 * allocation, and mma.sync m16n8k32 takes them as A fragments as loaded: for int4 the lo nibbles of words 0-1 (a0 / a2
 * row gid, a1 / a3 row gid + 8) one MMA (u8 x s8), words 2-3 a second, the hi nibbles masked in place (16 x their
 * value) two more, so a weight word costs two logic ops and no shift; for int8 a lane's 8 words are four MMAs' A words
 * (s8 x s8). The MMA's k order is free as long as A and B agree: B column c is activation row c (lanes gid >= m repeat
 * the last row), lane t's b0 / b1 the activation bytes of the same values (il 1 stores each 8 values as
 * (x0,x2,x4,x6)(x1,x3,x5,x7), so they are the 32 bytes at 32 t of the group either way). Lane (gid, t) ends a group
 * with C[gid][2t], C[gid][2t+1], C[gid+8][2t], C[gid+8][2t+1]: int4 y[2t (+1)][row] += s d (16 lo + hi) / 16 +
 * z d sum q, with (d, d sum q) from the activations' producer; int8 y += d C, the channel scale once a tile; fp8 the
 * same with C = the e4m3 MMAs' float sums over the hi and the lo rows (eight MMAs a group). Units are
 * split in equal contiguous ranges over all warps of the grid (stream-K: each tile's partial sums are added into y
 * atomically, y zeroed on entry as for tc_q8.cu), K in slices of <= 42 groups (slice-major) so that each block copies
 * only the activations of the groups it uses into shared memory (16-byte units XOR (row & 1): the two rows of a phase
 * of 8 lanes hit distinct banks). The first D units' weights and scales are requested before the launch wait.
 *
 * Measured on the H200 (session 39, bench/logs/2026-12-04-session39/, aggregate decode tok/s at 3 / 4 / 8 seqs against
 * $G3_CUDA_Q4R=0, A/B/A/B): 27B int4 489-490 / 652-653 / 1245-1246 against 406-407 / 540-541 / 1030-1031 (+20%), int8
 * 352 / 467-468 / 903-907 against 324 / 431 / 818-820 (+9-10%) (run 06); fp8 332-333 / 441-442 / 816-817 against
 * 299-300 / 396-397 / 689-690 on tc_gemv.cu (+11-18%, run 07); 4B and 1B within 2% (only their heads and 4B's int4
 * gate/up are large enough). Under --profile at 8 rows (a 27B layer): int4 gate/up 59.7 -> 44.5 us, down 29.2 ->
 * 26.6, the head 330 -> 248; fp8 gate/up 83.9 -> 66.9, down 50.2 -> 39.1. At one row the same form streams no faster
 * than the persistent dp4a kernel of qgemv_p.cu once a matrix is not in L2 (dev/cuda/q4mma_bench.cu: 27B int4
 * gate/up x4 142 against 126 us), so that stays. Session 40 (bench/logs/2026-12-04-session40/, against
 * $G3_CUDA_Q4RMAX=8, A/B/A/B): fp8 at 9 / 12 / 16 seqs (the 27B gate/up product and head here) 27B 806-808 / 1071 /
 * 1422-1426 against 796-797 / 1057-1060 / 1403-1410, 4B +1-2%; the other formats and the down product stay where they
 * were (q4r_max_env). Accuracy: W_deq . xq exactly up to float rounding, as tc_q8.cu; fp8
 * within 2e-7 of max|y| of the e4m3 hi + lo emulation (test_matmul_q4r: run_wgq). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/q4r_frag.cuh"

#define Q4R_T 384 /* threads a block, one block a SM */

/* c += A . B on bytes: e4m3 (float sums) or s8 (int32 sums) */
template <bool F8, typename T>
static __device__ __forceinline__ void b8_mma(T (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
    if constexpr (F8) f8r_mma(c, a0, a1, a2, a3, b0, b1);
    else q8r_mma(c, a0, a1, a2, a3, b0, b1);
}

/* units: (slice, tile of 16 rows, block of G groups of the slice), slice-major; gs groups a slice. xq [mr][K] in QT's
 * value order (int4: il 1; int8: natural; fp8: e4m3 hi rows, then the lo rows), xd [mr][K/128]; y [m][n]. Shared
 * memory: the block's groups of the mr rows ([group][mr][128], units swizzled), then (d, d sum q) [group][8 NT] of
 * the hi rows (rows >= m zero). NT column tiles of 8 activation rows. */
template <int QT, int D, int G, int NT>
__global__ void __launch_bounds__(Q4R_T, 1)
    k_q4r(const uint8_t *__restrict__ W, const float *__restrict__ S, const float *__restrict__ Z,
          const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int m, float *__restrict__ y, int n, int K,
          int gs) {
    extern __shared__ __align__(16) unsigned char q4r_sm[];
    const int lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
    const int ngr = K / 128, ntile = (n + 15) / 16, gb = gs / G, per_slice = ntile * gb;
    const q4r_range rg = q4r_split(ntile, gb, gs, ngr, Q4R_T / 32);
    const int u0 = rg.u0, u1 = rg.u1, g_lo = rg.g_lo, g_hi = rg.g_hi;
    const int ng = g_hi - g_lo;
    constexpr bool F8 = QT == G3Q_FP8, I8 = QT == G3Q_INT8 || F8; /* I8: a byte a weight, a scale a channel */
    constexpr int C = I8 ? 2 : 1, GB = 64 * C; /* chunks a lane and group; bytes a row and group */
    const int mr = F8 ? 2 * m : m; /* activation rows: fp8's hi rows, then its lo rows (g3c_wgf_lo_row(m) = m) */
    unsigned char *sq = q4r_sm;                                  /* [ng][mr][128] */
    float2 *sd = (float2 *)(q4r_sm + (size_t)ng * mr * 128);     /* [ng][8 NT] */
    const size_t rb = (size_t)K / 2 * C;

    /* load iterator: pointers to the chunks and scales of rows gid and gid + 8 (clamped to the last row: a partial
     * last tile reads a real row twice and writes neither copy) of the next unit to load; they stop at the range's
     * last unit, so that the loads past it (the pipeline's last D) need no predicate */
    int ls = u0 / per_slice, ltile = (u0 % per_slice) / gb, lrem = gb - (u0 % per_slice) % gb;
    const uint8_t *wpa, *wpb;
    const float *spa, *spb;
    size_t zo; /* int4's offsets: Z - S in floats (both arrays of one allocator, float-aligned), one pointer a row */
    auto seek = [&](int g) { /* rows of tile ltile at group g */
        const size_t ra = (size_t)min(ltile * 16 + gid, n - 1), rb8 = (size_t)min(ltile * 16 + gid + 8, n - 1);
        wpa = W + ra * rb + (size_t)g * GB + t * 16 * C, wpb = W + rb8 * rb + (size_t)g * GB + t * 16 * C;
        spa = S + ra * (I8 ? 1 : ngr) + (I8 ? 0 : g), spb = S + rb8 * (I8 ? 1 : ngr) + (I8 ? 0 : g);
    };
    zo = I8 ? 0 : (size_t)(Z - S);
    seek(ls * gs + (gb - lrem) * G);
    int lleft = u1 - u0; /* units still to load */
    auto load = [&](q4r_unit<G, C> &b) {
#pragma unroll
        for (int j = 0; j < G; j++)
#pragma unroll
            for (int c = 0; c < C; c++)
                b.wa[j * C + c] = q4r_ld(wpa + GB * j + 16 * c), b.wb[j * C + c] = q4r_ld(wpb + GB * j + 16 * c);
        if constexpr (!I8)
#pragma unroll
            for (int j = 0; j < G; j++)
                b.sa[j] = __ldg(spa + j), b.sb[j] = __ldg(spb + j), b.za[j] = __ldg(spa + zo + j),
                b.zb[j] = __ldg(spb + zo + j);
        if (--lleft > 0) {
            wpa += GB * G, wpb += GB * G, spa += G, spb += G;
            if (--lrem == 0) { /* the next tile of the slice, or the first of the next slice */
                lrem = gb;
                if (++ltile == ntile) ltile = 0, ls++;
                seek(ls * gs);
            }
        }
    };
    q4r_unit<G, C> buf[D];
    if (u0 < u1) {
#pragma unroll
        for (int d = 0; d < D; d++) load(buf[d]);
    }

    g3c_pdl_wait();
    /* the activations of the block's groups into shared memory: 16-byte unit v of (group, row) at v ^ (row & 1) */
    for (int i = threadIdx.x; i < ng * mr * 8; i += Q4R_T) {
        const int v = i & 7, r = (i >> 3) % mr, gl = (i >> 3) / mr;
        const uint4 q = __ldcg((const uint4 *)(xq + (size_t)r * K + (size_t)(g_lo + gl) * 128) + v);
        *(uint4 *)(sq + ((size_t)gl * mr + r) * 128 + 16 * (v ^ (r & 1))) = q;
    }
    for (int i = threadIdx.x; i < ng * 8 * NT; i += Q4R_T) {
        const int r = i % (8 * NT), gl = i / (8 * NT);
        sd[i] = r < m ? __ldcg(xd + (size_t)r * ngr + g_lo + gl) : make_float2(0.f, 0.f);
    }
    __syncthreads();
    if (u0 >= u1) return;

    /* column tile c (activation rows 8 c .. 8 c + 7): the activation row this lane's B column holds, its two 16-byte
     * pieces in a group's copy, and fp8's lo row of the same activation row */
    int xoff[NT], xoff2[NT], loff[NT], loff2[NT];
#pragma unroll
    for (int c = 0; c < NT; c++) {
        const int ar = min(8 * c + gid, m - 1), al = ar + m;
        xoff[c] = ar * 128 + 16 * ((2 * t) ^ (ar & 1)), xoff2[c] = ar * 128 + 16 * ((2 * t + 1) ^ (ar & 1));
        loff[c] = al * 128 + 16 * ((2 * t) ^ (al & 1)), loff2[c] = al * 128 + 16 * ((2 * t + 1) ^ (al & 1));
    }
    int ctile = (u0 % per_slice) / gb, crem = gb - (u0 % per_slice) % gb;
    int cgl = (u0 / per_slice) * gs + (gb - crem) * G - g_lo; /* the unit's first group in the block's copy */
    /* per column tile c: (row gid, act 8c+2t), (gid, 8c+2t+1), (gid+8, 8c+2t), (gid+8, 8c+2t+1) */
    float acc[NT][4];
#pragma unroll
    for (int c = 0; c < NT; c++) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
    auto step = [&](q4r_unit<G, C> &b, bool last) {
        if constexpr (I8) { /* a byte a weight: the words are A fragments as loaded (int8 s8; fp8 e4m3, its hi and
                             * lo activation rows into the same float sums), values in natural order */
            uint4 wa[G * C], wb[G * C];
#pragma unroll
            for (int j = 0; j < G * C; j++) wa[j] = b.wa[j], wb[j] = b.wb[j];
            load(b);
#pragma unroll
            for (int j = 0; j < G; j++) {
                const unsigned char *gq = sq + (size_t)(cgl + j) * mr * 128;
                const uint4 &p = wa[j * C], &q = wa[j * C + 1], &pb = wb[j * C], &qb = wb[j * C + 1];
                auto mmas = [&](auto &c4, int o1, int o2) { /* the group's four MMAs against one activation row */
                    const uint4 xa = *(const uint4 *)(gq + o1), xb = *(const uint4 *)(gq + o2);
                    b8_mma<F8>(c4, p.x, pb.x, p.y, pb.y, xa.x, xa.y), b8_mma<F8>(c4, p.z, pb.z, p.w, pb.w, xa.z, xa.w);
                    b8_mma<F8>(c4, q.x, qb.x, q.y, qb.y, xb.x, xb.y), b8_mma<F8>(c4, q.z, qb.z, q.w, qb.w, xb.z, xb.w);
                };
#pragma unroll
                for (int c = 0; c < NT; c++) {
                    const float4 dd = *(const float4 *)(sd + (cgl + j) * 8 * NT + 8 * c + 2 * t);
                    float f[4];
                    if constexpr (F8) {
                        float c4[4] = {0.f, 0.f, 0.f, 0.f};
                        mmas(c4, xoff[c], xoff2[c]), mmas(c4, loff[c], loff2[c]);
#pragma unroll
                        for (int i = 0; i < 4; i++) f[i] = c4[i];
                    } else {
                        int c4[4] = {0, 0, 0, 0};
                        mmas(c4, xoff[c], xoff2[c]);
#pragma unroll
                        for (int i = 0; i < 4; i++) f[i] = (float)c4[i];
                    }
                    acc[c][0] = fmaf(dd.x, f[0], acc[c][0]), acc[c][1] = fmaf(dd.z, f[1], acc[c][1]);
                    acc[c][2] = fmaf(dd.x, f[2], acc[c][2]), acc[c][3] = fmaf(dd.z, f[3], acc[c][3]);
                }
            }
        } else {
            uint32_t lo[G][8], hi[G][8];
            float sa[G], sb[G], za[G], zb[G];
            q4r_take(b, lo, hi, sa, sb, za, zb);
            load(b); /* the unit D ahead into the same slot */
#pragma unroll
            for (int j = 0; j < G; j++) {
                const unsigned char *gq = sq + (size_t)(cgl + j) * mr * 128;
#pragma unroll
                for (int c = 0; c < NT; c++) {
                    /* words: lo0 hi0 lo1 hi1 | lo2 hi2 lo3 hi3 (il 1: each 8 values as x0,x2,x4,x6,x1,x3,x5,x7) */
                    const uint4 xa = *(const uint4 *)(gq + xoff[c]), xb = *(const uint4 *)(gq + xoff2[c]);
                    /* (d, d sum q) of acts 8c+2t, 8c+2t+1 */
                    const float4 dd = *(const float4 *)(sd + (cgl + j) * 8 * NT + 8 * c + 2 * t);
                    int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
                    q4r_group(cl, ch, lo[j], hi[j], xa.x, xa.z, xb.x, xb.z, xa.y, xa.w, xb.y, xb.w);
                    const float d0 = dd.x * (1.f / 16.f), d1 = dd.z * (1.f / 16.f);
                    acc[c][0] = fmaf(sa[j] * d0, (float)((cl[0] << 4) + ch[0]), fmaf(za[j], dd.y, acc[c][0]));
                    acc[c][1] = fmaf(sa[j] * d1, (float)((cl[1] << 4) + ch[1]), fmaf(za[j], dd.w, acc[c][1]));
                    acc[c][2] = fmaf(sb[j] * d0, (float)((cl[2] << 4) + ch[2]), fmaf(zb[j], dd.y, acc[c][2]));
                    acc[c][3] = fmaf(sb[j] * d1, (float)((cl[3] << 4) + ch[3]), fmaf(zb[j], dd.w, acc[c][3]));
                }
            }
        }
        cgl += G;
        if (--crem == 0 || last) { /* the tile's (or the range's) last unit: its sums into y */
            const int row = ctile * 16 + gid;
            float s0 = 1.f, s8 = 1.f;
            if constexpr (I8) /* the channel scales (int8, fp8) */
                s0 = __ldg(S + min(row, n - 1)), s8 = __ldg(S + min(row + 8, n - 1));
#pragma unroll
            for (int c = 0; c < NT; c++) {
                const int a0 = 8 * c + 2 * t;
                float *y0 = y + (size_t)a0 * n + row, *y1 = y0 + n;
                if (a0 < m) {
                    if (row < n) atomicAdd(y0, acc[c][0] * s0);
                    if (row + 8 < n) atomicAdd(y0 + 8, acc[c][2] * s8);
                }
                if (a0 + 1 < m) {
                    if (row < n) atomicAdd(y1, acc[c][1] * s0);
                    if (row + 8 < n) atomicAdd(y1 + 8, acc[c][3] * s8);
                }
                acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
            }
            q4r_next_tile(crem, gb, ctile, ntile, cgl, gs);
        }
    };
    q4r_units(buf, u0, u1, step);
}
static int q4r_env(void) { /* read at every call: the tests switch it */
    const char *e = getenv("G3_CUDA_Q4R");
    return e && *e ? atoi(e) : 1;
}

/* $G3_CUDA_Q4RMIN=n: only matrices of >= n MB of weights (read at every call). Default: int4 20 MB, int8 / fp8 100 MB.
 * Smaller ones have too few units a warp for the pipeline to reach its rate and stay on tc_q8.cu, whose int8 form is
 * the stronger (two blocks a SM). H200, session 39, 3 / 4 / 8 seqs against tc_q8.cu: int4 on every matrix 27B +20%,
 * 4B -4%, 1B -10%, from 12 MB 27B +20% and 4B -1%, from 30 MB 27B +19% and 4B / 1B within 1% (run 04); int8 from
 * 20 MB 27B +9%, 4B -2% (run 05: under --profile at 8 rows the 27B qkv and o products 19.3 / 12.4 -> 20.2 / 13.9 us,
 * gate/up and down 75.3 / 40.1 -> 66.2 / 37.4). */
static double q4r_min_mb(int qt) {
    const char *e = getenv("G3_CUDA_Q4RMIN");
    return e && *e ? atof(e) : qt == G3Q_INT4 ? 20. : 100.;
}

static int q4r_sms(void) { /* the device's SMs (the launch's blocks), read once */
    static int n;
    if (!n) {
        int d = 0, v = 0;
        if (cudaGetDevice(&d) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || v < 1)
            v = 132;
        n = v;
    }
    return n;
}

/* $G3_CUDA_Q4RMAX=n: the most rows taken here (8, 16 or 32), for every matrix that passes q4r_min_mb, read at every
 * call. Unset: 8, and up to 16 for fp8 matrices of rows of <= 42 groups (k <= 5376). H200, session 40 (CUPTI on the
 * replayed 27B 16-row step, a layer's effective kernel times): at 16 rows this kernel took the fp8 gate/up product
 * 78.8 -> 69.4 us (from tc_stage.cu's staged bf16 kernel), but lost on fp8's down product (40.7 -> 46.9: 7 K-slices
 * of 24 groups for 32 activation rows, 198 KB of shared memory, and the qkv product after it waited 9 us longer), on
 * int4's gate/up (tc_wg4.cu, 44.9 -> 50.4) and was even on int8's (tc_q8.cu, a layer 150.2 -> 149.3 us); at 17..32
 * rows (four column tiles) every format lost 6-38% (aggregate decode tok/s). */
static int q4r_max_env(void) { /* 0: unset */
    const char *e = getenv("G3_CUDA_Q4RMAX");
    if (!e || !*e) return 0;
    const int v = atoi(e);
    return v <= 8 ? 8 : v <= 16 ? 16 : 32;
}
static int q4r_nt(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : 4; } /* column tiles of 8 activation rows */
static int q4r_act_rows(const g3_dmat *w, int m) { return w->qt == G3Q_FP8 ? 2 * m : m; } /* fp8: hi + lo rows */

/* groups a slice: the fewest slices of <= 42 groups (5376 values) that divide the row, and few enough that two
 * slices' activations of mr rows (and their (d, d sum q) for nt column tiles) fit in 200 KB of shared memory */
static int q4r_slice_groups(int ngr, int mr, int nt) {
    int cap = (200 << 10) / (2 * (mr * 128 + 64 * nt));
    if (cap > 42) cap = 42;
    for (int s = 1; s <= ngr; s++)
        if (ngr % s == 0 && ngr / s <= cap) return ngr / s;
    return 1;
}
static int q4r_gs(const g3_dmat *w, int m) { return q4r_slice_groups(w->k / 128, q4r_act_rows(w, m), q4r_nt(m)); }
static int q4r_unit_groups(const g3_dmat *w, int m) { /* G: two groups a unit where they divide the slice (int4) */
    return w->qt == G3Q_INT4 && q4r_gs(w, m) % 2 == 0 ? 2 : 1;
}
/* shared memory of a launch on n_sm blocks: the activations of the groups a block can touch (two slices, or all
 * groups where a block holds a slice's units or more) and their (d, d sum q) */
static size_t q4r_smem(const g3_dmat *w, int m, int n_sm) {
    const int ngr = w->k / 128, gs = q4r_gs(w, m), G = q4r_unit_groups(w, m);
    const long long ntile = (w->n + 15) / 16, units = ntile * (ngr / G), per_block = (units + n_sm - 1) / n_sm;
    const int span = per_block >= ntile * (gs / G) ? ngr : (2 * gs < ngr ? 2 * gs : ngr);
    return (size_t)span * q4r_act_rows(w, m) * 128 + (size_t)span * 64 * q4r_nt(m);
}

int g3c_q4r_taken(const g3_dmat *w, int m) {
    const int qt = w->qt, pc = w->g == w->k; /* per-channel scales */
    const int ok = (qt == G3Q_INT4 && w->g == 128) || (qt == G3Q_INT8 && pc) ||
                   (qt == G3Q_FP8 && g3c_wgf_supported(w, m)); /* fp8: unless $G3_CUDA_WGF=0 */
    const int mx = q4r_max_env();
    if (!q4r_env() || !ok || m < 1 || m > (mx ? mx : qt == G3Q_FP8 ? 16 : 8) || w->k % 128) return 0;
    if (m > 8 && !mx && w->k > 42 * 128) return 0; /* by default rows of <= 42 groups beyond 8 rows */
    const double mb = (double)w->n * w->k / (qt == G3Q_INT4 ? 2e6 : 1e6);
    return mb >= q4r_min_mb(qt) && q4r_smem(w, m, q4r_sms()) <= (200u << 10);
}

template <int QT, int D, int G, int NT>
static cudaError_t q4r_launch(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                              cudaStream_t st) {
    static int bps; /* once per instance: the largest shared memory any launch here takes */
    cudaError_t e = g3c_smem_setup(k_q4r<QT, D, G, NT>, 200 << 10, Q4R_T, &bps);
    if (e != cudaSuccess) return e;
    const size_t smem = q4r_smem(w, m, n_sm);
    if (smem > (200u << 10)) return cudaErrorInvalidValue;
    return g3c_launch(k_q4r<QT, D, G, NT>, dim3(n_sm), dim3(Q4R_T), smem, st, (const uint8_t *)w->q,
                      (const float *)w->s, (const float *)w->z, xq, xd, m, y, w->n, w->k, q4r_gs(w, m));
}

/* the instance for the format, unit groups and column tiles */
template <int NT>
static cudaError_t q4r_run(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                           cudaStream_t st) {
    if (w->qt != G3Q_INT4) /* a byte a weight: int8, or fp8 on its activations' e4m3 hi + lo rows */
        return w->qt == G3Q_FP8 ? q4r_launch<G3Q_FP8, 2, 1, NT>(w, xq, xd, m, y, n_sm, st)
                                : q4r_launch<G3Q_INT8, 2, 1, NT>(w, xq, xd, m, y, n_sm, st);
    return q4r_unit_groups(w, m) == 2 ? q4r_launch<G3Q_INT4, 2, 2, NT>(w, xq, xd, m, y, n_sm, st)
                                      : q4r_launch<G3Q_INT4, 4, 1, NT>(w, xq, xd, m, y, n_sm, st);
}

static long long q4r_count;
long long g3c_q4r_launches(void) { return q4r_count; }

cudaError_t g3c_q4r_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st) {
    if (!g3c_q4r_taken(w, m)) return cudaErrorInvalidValue;
    q4r_count++;
    const int nt = q4r_nt(m);
    return nt == 1 ? q4r_run<1>(w, xq, xd, m, y, n_sm, st)
           : nt == 2 ? q4r_run<2>(w, xq, xd, m, y, n_sm, st)
                     : q4r_run<4>(w, xq, xd, m, y, n_sm, st);
}
