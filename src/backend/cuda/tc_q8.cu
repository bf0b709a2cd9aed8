/* Small-batch products (3..64 activation rows) on int8 and int4 weights with int8 tensor cores: y += x W^T, the
 * activations quantized to int8 by a small kernel first (or by their producer), then mma.sync m16n8k32 s8.s8.s32.
 * Taken by default for int4 at 3..8 and 17..32 rows (tc_wg4.cu at 9..16 and 33..64) and for int8 per channel at 3..32
 * (tc_wg.cu's wgmma beyond; tc_stage.cu decides; $G3_CUDA_TCM=1: never). 3..8 rows (session 35, from
 * $G3_CUDA_TQMIN): one 8-row activation tile (NT = 1) instead of the dp4a kernel (int4; int8 up to 4 rows) or
 * tc_gemv.cu's hi + lo bf16 activations (int8 at 5..8 rows).
 * Measured on the H200 (27B, g3cuda_bench --profile 1, 32 rows; staged bf16 kernel -> this one): int4 gate/up 110 ->
 * 67 us, down 62 -> 40, qkv 30 -> 21, o 20 -> 17; int8 gate/up 120 -> 81 us; aggregate decode int4 32 seqs 2145 ->
 * 3115 tok/s, 64 seqs 2828 -> 3902; int8 32 seqs 1997 -> 2580, 64 seqs 2592 -> 3536.
 *
 * Why (arithmetic, measured with ncu on the H200 for the staged bf16 kernel of tc_stage.cu, 27B int4 gate/up at 32
 * rows): 46e6 instructions for 3.6e6 bf16 mma (12.8 per mma: nibble masks, per-value scale/offset hfma2 + hsub2,
 * activation permutes, 64-bit unit divisions), at 0.47 issued per cycle per scheduler with 2 warps each: 110 us for
 * 130 MB. Weights at 4.4 TB/s would take 30 us, and at 32 rows int4 (or 64 rows int8) that is 128 FLOP per weight
 * byte: ~560 TFLOP/s, more than mma.sync reaches in bf16 on this chip. Here:
 *  - int8 mma does k = 32 per instruction (2x the bf16 rate): int8 weights are A fragments as loaded (no decode);
 *    int4 nibbles become int8 bytes (0..15) with one mask per 4 values (the activations of each 8 are stored in the
 *    matching order x0,x2,x4,x6,x1,x3,x5,x7 when quantized, so no permutes in the loop);
 *  - activations are quantized per row and block of 128 values (d = amax/127, q = rint(x/d)) by k_tq_quant into a
 *    scratch (quantizing inside the product, every block redoing it per stage, cost a third of its instructions);
 *    stages of xq and (d, d sum q) are copied to shared memory with cp.async along with the weights;
 *  - int32 sums are turned into float once per block of 128 values (= one int4 group, g % 128 == 0): per output
 *    y += s_g d_x acc (+ z_g d_x sum(q_x) for int4), int8 per channel: y += d_x acc, the channel scale at the end.
 *    ~4 float ops per 4 k32 mma per output element: ~3.5 instructions per bf16-mma-equivalent instead of 12.8.
 *  - weights stream through cp.async into a ring of 3 stages per warp (two stages in flight: ~64 KB per SM);
 *  - int32 -> float by one I2FP (g3c_i2f_exact).
 * ncu (first version, quantizing in the loop): 35e6 instructions, 0.39 issued per cycle and scheduler (2 warps each:
 * 238 registers), stalls mostly on fixed-latency dependencies. $G3_CUDA_TQOCC=2 takes a variant with one tile per
 * warp and registers capped at 128 (two blocks, 4 warps per scheduler; small spills at int4 NT >= 4), the default
 * for int8 (measured faster there, slower for int4: see g3c_tq_mm).
 * Accuracy: the product is W_deq . xq exactly up to float rounding, |xq - x| <= amax/254 per value of a block of 128
 * (about the bf16 rounding of x for well-spread blocks, worse next to outliers; qgemv.cu uses blocks of 32 for <= 8
 * rows). Supported: int8 per channel and int4 in groups of 128*j, k % 128 == 0; the GGUF int8 and int4 groups of
 * 16 / 32 take tc_q8g.cu's kernel on the same activations (g3c_tq_mm dispatches), fp8 tc_wg.cu or tc_stage.cu.
 *
 * Layouts. A stage is 128 weight bytes per row (int4: 256 values = 2 blocks; int8: 128 values = 1 block), 8 chunks
 * of 16 bytes; lane (g, t) takes chunks t and 4 + t (rounds 0, 1) of rows g and g + 8 of each of its tiles.
 * mma.m16n8k32 s8: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..],
 * b0 = B[4t..4t+3][g], b1 = B[16+4t..][g], c as in tc_frag.cuh; the k order inside one mma is free as long as A and
 * B agree, and lane t's k slots hold its own chunk:
 *   int8, mma h of a chunk (words w0..w3): a0/a1 = word 2h of rows g/g+8, a2/a3 = word 2h+1; b0/b1 = activation
 *     words 2h, 2h+1 of the same 16 values (natural order);
 *   int4, mma j (word j = 8 values): a0/a1 = word & 0x0F0F0F0F (values 0,2,4,6), a2/a3 = (word >> 4) & 0x0F0F0F0F
 *     (1,3,5,7); b0/b1 = the 8 activation bytes of those values, stored as (x0,x2,x4,x6)(x1,x3,x5,x7).
 * Shared activations: [3 buffers][MP rows][KS bytes] (16-byte units, unit XOR (row & 1) for int4 and (row & 1) << 2
 * for int8, so the 8 lanes of a phase, rows g, g+1 x t = 0..3, hit distinct banks), then per buffer [SEGS][MP] float2
 * (d, d * sum q). Unit u of a block uses ring slot and buffer (u - u0) % 3; its copies are issued at the top of unit
 * u - 2 in one cp.async group, so at the top of unit u everything but the newest group must have landed. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/tq_act.cuh"
#include "backend/cuda/tq_inst.cuh"

#define TQ_WARPS 8
static_assert(TQ_WARPS * 32 == TQ_THREADS, "tq_inst.cuh launches 8 warps a block");

template <int QT> struct tq_c {
    static constexpr int KS = QT == G3Q_INT4 ? 256 : 128; /* values per row and stage */
    static constexpr int SEGS = KS / 128;                   /* activation blocks per stage */
    static constexpr int UPR = KS / 16;                     /* 16-byte units per activation row */
};

template <int QT> static __device__ __forceinline__ int tq_swz(int unit, int row) {
    return QT == G3Q_INT4 ? unit ^ (row & 1) : unit ^ ((row & 1) << 2);
}

/* group scales (and int4 offsets) of unit (tile, stage) for rows g, g + 8 of each tile, per block of 128 */
template <int QT, int SC, int T> struct tq_sc {
    float s[tq_c<QT>::SEGS][T][2], z[tq_c<QT>::SEGS][T][2];
};
template <int QT, int SC, int T>
static __device__ __forceinline__ void tq_load_s(const g3_dmat &w, int tile, int stage, int wi, int g,
                                                 tq_sc<QT, SC, T> &r) {
    constexpr int SEGS = tq_c<QT>::SEGS, KS = tq_c<QT>::KS;
    const int n = w.n, ngr = w.k / w.g;
#pragma unroll
    for (int sg = 0; sg < SEGS; sg++)
#pragma unroll
        for (int tt = 0; tt < T; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                r.s[sg][tt][h] = r.z[sg][tt][h] = 0.f;
                if constexpr (SC) {
                    const int row = min(((tile * TQ_WARPS + wi) * T + tt) * 16 + g + 8 * h, n - 1);
                    const int grp = min((stage * KS + sg * 128) / w.g, ngr - 1);
                    r.s[sg][tt][h] = __ldg(w.s + (size_t)row * ngr + grp);
                    if constexpr (QT == G3Q_INT4) r.z[sg][tt][h] = __ldg(w.z + (size_t)row * ngr + grp);
                }
            }
}

/* ---- activation quantization (pre-pass) ------------------------------------------------------------------------- */
/* xh bf16 [m][K] -> xq int8 [m][K] (il, int4 weights: each 8 values stored as x0,x2,x4,x6,x1,x3,x5,x7) and xd
 * [m][K/128] float2 (d, d * sum q): tq_act.cuh's quantization, which the add-norm and GeGLU kernels also use. One
 * thread per 4 values, the 32 of one block of 128 a warp (K % 128 == 0). */
__global__ void __launch_bounds__(256) k_tq_quant(const __nv_bfloat16 *__restrict__ xh, int m, int K,
                                                  int8_t *__restrict__ xq, float2 *__restrict__ xd, int il) {
    g3c_pdl_wait();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; /* float4 t of [m][K] */
    const bool ok = t < (long long)m * (K / 4);
    const uint2 v = ok ? __ldcg((const uint2 *)(xh + 4 * t)) : make_uint2(0, 0);
    const float4 f = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                                 __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
    g3c_tq_quant4(f, ok, xq, (size_t)(4 * (t & ~31ll)), xd + (t >> 5), il, K); /* blocks never cross rows */
}

/* activations of unit stage `stage` into buffer xs ([MP][UPR] units) and ds ([SEGS][MP] float2 (d, d * sum q)); rows
 * >= m hold zeros from the start and are not touched */
template <int QT, int NT>
static __device__ __forceinline__ void tq_stage_x(uint4 *xs, float2 *ds, const int8_t *xq, const float2 *xd, int m,
                                                  int K, int stage) {
    constexpr int KS = tq_c<QT>::KS, UPR = tq_c<QT>::UPR, MP = 8 * NT, SEGS = tq_c<QT>::SEGS;
    for (int idx = threadIdx.x; idx < m * UPR; idx += TQ_WARPS * 32) {
        const int i = idx / UPR, c = idx % UPR, kk = stage * KS + 16 * c;
        uint4 *d = xs + i * UPR + tq_swz<QT>(c, i);
        if (kk < K) g3c_cp16(d, xq + (size_t)i * K + kk);
        else *d = make_uint4(0, 0, 0, 0);
    }
    tq_stage_d<SEGS>(ds, xd, m, MP, K, stage);
}

/* SC: 0 int8 per channel (scale at the end), 1 int4 (group scales and offsets). T tiles of 16 rows per warp. HI (int4,
 * $G3_CUDA_TQHI): the nibbles unpacked with one mask each (lo: & 0x0F, hi: & 0xF0, 16 x its value, kept in place)
 * instead of a mask and a shift for the hi ones; the lo and hi values of two words go into separate MMAs (u8 x s8 for
 * the hi ones) whose sums meet as lo + (hi >> 4), exact since every hi product is a multiple of 16. The same MMA count,
 * 4 logic operations a word pair and row instead of 6. */
template <int QT, int SC, int NT, int T, int MINB, bool HI = false>
__global__ void __launch_bounds__(TQ_WARPS * 32, MINB)
    k_tq(g3_dmat w, const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int m, float *__restrict__ y, int S,
         long long L) {
    constexpr int SEGS = tq_c<QT>::SEGS, UPR = tq_c<QT>::UPR, MP = 8 * NT;
    constexpr int WSLOT = 2 * T * 2 * 32;
    extern __shared__ uint4 tq_sm[]; /* ring [3][warps][WSLOT], xs [3][MP][UPR], ds [3][SEGS][MP] float2 */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wi = threadIdx.x >> 5;
    const int n = w.n, K = w.k;
    const long long u0 = L * blockIdx.x / gridDim.x, u1 = L * (blockIdx.x + 1) / gridDim.x;
    uint4 *ring = tq_sm + wi * WSLOT; /* + slot * warps * WSLOT */
    uint4 *xsb = tq_sm + 3 * TQ_WARPS * WSLOT;
    float2 *dsb = (float2 *)(xsb + 3 * MP * UPR);
    tq_walk wk(u0, S); /* (tile, stage) of units u, u + 1, u + 2 */
    /* the weights do not depend on the previous kernel: start their loads before waiting for it */
    if (u0 < u1) tq_load_w<T>(w, wk.tl0, wk.st0, wi, lane, lane, ring);
    g3c_cp_commit();
    if (u0 + 1 < u1) tq_load_w<T>(w, wk.tl1, wk.st1, wi, lane, lane, ring + TQ_WARPS * WSLOT);
    g3c_cp_commit();
    tq_sc<QT, SC, T> cur, nxt;
    if (u0 < u1) tq_load_s<QT, SC, T>(w, wk.tl0, wk.st0, wi, g, cur);
    g3c_pdl_wait();
    if (u0 >= u1) {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        return;
    }
    nxt = cur;
    tq_zero_rows<UPR, SEGS>(xsb, dsb, MP, m);
    tq_stage_x<QT, NT>(xsb, dsb, xq, xd, m, K, wk.st0);
    g3c_cp_commit();
    if (u0 + 1 < u1) tq_stage_x<QT, NT>(xsb + MP * UPR, dsb + SEGS * MP, xq, xd, m, K, wk.st1);
    g3c_cp_commit();
    float acc[T][NT][4];
    tc_zero(acc);
    int it = 0; /* ring slot and activation buffer of unit u: (u - u0) % 3 */
    for (long long u = u0; u < u1; u++) {
        asm volatile("cp.async.wait_group 1;" ::: "memory"); /* all but unit u + 1's copies have landed */
        __syncthreads(); /* everyone's copies of unit u are visible; everyone is done with unit u - 1's buffers */
        {
            const int ns = it == 0 ? 2 : it - 1; /* = unit u - 1's slot and buffer, free now */
            if (u + 2 < u1) {
                tq_load_w<T>(w, wk.tl2, wk.st2, wi, lane, lane, ring + ns * TQ_WARPS * WSLOT);
                tq_stage_x<QT, NT>(xsb + ns * MP * UPR, dsb + ns * SEGS * MP, xq, xd, m, K, wk.st2);
            }
            g3c_cp_commit();
        }
        if (u + 1 < u1) tq_load_s<QT, SC, T>(w, wk.tl1, wk.st1, wi, g, nxt);
        const uint4 *xs = xsb + it * MP * UPR;
        const float2 *ds = dsb + it * SEGS * MP;
        const uint4 *ws = ring + it * TQ_WARPS * WSLOT + lane;
#pragma unroll
        for (int sg = 0; sg < SEGS; sg++) {
            int ai[T][NT][4], ah[HI ? T : 1][HI ? NT : 1][4]; /* ah: HI's hi-nibble sums (16 x) */
#pragma unroll
            for (int tt = 0; tt < T; tt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) ai[tt][nt][e] = 0, ah[HI ? tt : 0][HI ? nt : 0][e] = 0;
#pragma unroll
            for (int rr = 0; rr < 2 / SEGS; rr++) {
                const int rl = sg * (2 / SEGS) + rr, c = 4 * rl + t; /* round, chunk of this lane */
                uint4 wa[T], wb[T];
#pragma unroll
                for (int tt = 0; tt < T; tt++)
                    wa[tt] = ws[((rl * T + tt) * 2) * 32], wb[tt] = ws[((rl * T + tt) * 2 + 1) * 32];
                if constexpr (QT == G3Q_INT4) {
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) { /* activation unit 2c + hh: words j = 2hh, 2hh + 1 */
                        uint4 xv[NT];
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                            const int row = 8 * nt + g;
                            xv[nt] = xs[row * UPR + tq_swz<QT>(2 * c + hh, row)];
                        }
                        if constexpr (HI) { /* one MMA the lo values of both words, one their hi values */
#pragma unroll
                            for (int tt = 0; tt < T; tt++) {
                                const uint32_t u0 = hh ? wa[tt].z : wa[tt].x, u1 = hh ? wa[tt].w : wa[tt].y;
                                const uint32_t v0 = hh ? wb[tt].z : wb[tt].x, v1 = hh ? wb[tt].w : wb[tt].y;
                                const uint32_t M = 0x0F0F0F0Fu, H = 0xF0F0F0F0u;
#pragma unroll
                                for (int nt = 0; nt < NT; nt++) {
                                    tc_mma_s8(ai[tt][nt], u0 & M, v0 & M, u1 & M, v1 & M, xv[nt].x, xv[nt].z);
                                    tc_mma_s8(ah[tt][nt], u0 & H, v0 & H, u1 & H, v1 & H, xv[nt].y, xv[nt].w, true);
                                }
                            }
                        } else {
#pragma unroll
                            for (int jj = 0; jj < 2; jj++) {
                                const int j = 2 * hh + jj;
#pragma unroll
                                for (int tt = 0; tt < T; tt++) {
                                    const uint32_t ua = j == 0   ? wa[tt].x
                                                        : j == 1 ? wa[tt].y
                                                        : j == 2 ? wa[tt].z
                                                                 : wa[tt].w;
                                    const uint32_t ub = j == 0   ? wb[tt].x
                                                        : j == 1 ? wb[tt].y
                                                        : j == 2 ? wb[tt].z
                                                                 : wb[tt].w;
                                    const uint32_t a0 = ua & 0x0F0F0F0Fu, a2 = (ua >> 4) & 0x0F0F0F0Fu;
                                    const uint32_t a1 = ub & 0x0F0F0F0Fu, a3 = (ub >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                                    for (int nt = 0; nt < NT; nt++)
                                        tc_mma_s8(ai[tt][nt], a0, a1, a2, a3, jj ? xv[nt].z : xv[nt].x,
                                                  jj ? xv[nt].w : xv[nt].y);
                                }
                            }
                        }
                    }
                } else {
                    uint4 xv[NT];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const int row = 8 * nt + g;
                        xv[nt] = xs[row * UPR + tq_swz<QT>(c, row)];
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int tt = 0; tt < T; tt++) {
                            const uint32_t a0 = h ? wa[tt].z : wa[tt].x, a2 = h ? wa[tt].w : wa[tt].y;
                            const uint32_t a1 = h ? wb[tt].z : wb[tt].x, a3 = h ? wb[tt].w : wb[tt].y;
#pragma unroll
                            for (int nt = 0; nt < NT; nt++)
                                tc_mma_s8(ai[tt][nt], a0, a1, a2, a3, h ? xv[nt].z : xv[nt].x, h ? xv[nt].w : xv[nt].y);
                        }
                }
            }
            /* block sg done: y += s d acc (+ z d sum q) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float4 dd = *(const float4 *)(ds + sg * MP + 8 * nt + 2 * t); /* (d, d sum q) of 2t, 2t+1 */
#pragma unroll
                for (int tt = 0; tt < T; tt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int sum = HI ? ai[tt][nt][e] + (ah[HI ? tt : 0][HI ? nt : 0][e] >> 4) : ai[tt][nt][e];
                        const float d = (e & 1) ? dd.z : dd.x, f = g3c_i2f_exact(sum);
                        if constexpr (SC == 0) acc[tt][nt][e] = fmaf(d, f, acc[tt][nt][e]);
                        else {
                            acc[tt][nt][e] = fmaf(cur.s[sg][tt][e >> 1] * d, f, acc[tt][nt][e]);
                            if constexpr (QT == G3Q_INT4)
                                acc[tt][nt][e] = fmaf(cur.z[sg][tt][e >> 1], (e & 1) ? dd.w : dd.y, acc[tt][nt][e]);
                        }
                    }
            }
        }
        if (u + 1 == u1 || wk.st0 + 1 == S) { /* tile done (or this block's share of it): add into y */
            const float *cs = SC == 0 ? w.s : NULL; /* int8 per channel: the channel scales */
#pragma unroll
            for (int tt = 0; tt < T; tt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    tc_tile_add(acc[tt][nt], y, n, m, ((wk.tl0 * TQ_WARPS + wi) * T + tt) * 16, nt, g, t, cs);
        }
        cur = nxt;
        wk.next(S);
        it = it == 2 ? 0 : it + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */
/* tq_table[occupancy][variant][NT 1, 2, 4, 8]: variant 0 int8 per channel, 1 int4; occupancy 0: one block per SM,
 * two tiles per warp (one at NT = 8); 1 ($G3_CUDA_TQOCC=2): one tile per warp, registers capped for two blocks per
 * SM (4 warps per scheduler instead of 2: ncu showed the single block issuing 0.39 per cycle). NT = 1: 3..8 rows
 * (from g3c_tq_min_rows) */
static tq_inst tq_table[2][2][4];
static int tq_ready;

/* MB: registers capped for MB resident blocks a SM instead of OCC's 1 / 2 */
template <int QT, int SC, int NT, int OCC, bool HI = false, int MB = 0> static tq_inst tq_mk() {
    constexpr int T = NT == 8 || OCC ? 1 : 2, MP = 8 * NT;
    const int smem = 3 * TQ_WARPS * 2 * T * 2 * 32 * 16 + 3 * MP * tq_c<QT>::KS + 3 * tq_c<QT>::SEGS * MP * 8;
    tq_inst r = {k_tq<QT, SC, NT, T, MB ? MB : OCC ? 2 : 1, HI>, smem, TQ_WARPS * T * 16, 0};
    return r;
}
/* int4 at 3..8 rows with HI's unpacking (k_tq), per occupancy */
static tq_inst tq_hi_table[2];
/* 3..8 rows with registers capped for 3 / 4 resident blocks a SM ($G3_CUDA_TQSB=3|4): [int8, int4 (HI)][3, 4] */
static tq_inst tq_sb_table[2][2];
template <int QT, int SC, int OCC> static void tq_row(tq_inst *row) {
    row[0] = tq_mk<QT, SC, 1, OCC>(), row[1] = tq_mk<QT, SC, 2, OCC>(), row[2] = tq_mk<QT, SC, 4, OCC>();
    row[3] = tq_mk<QT, SC, 8, OCC>();
}
static void tq_build(void) {
    if (tq_ready) return;
    tq_row<G3Q_INT8, 0, 0>(tq_table[0][0]);
    tq_row<G3Q_INT4, 1, 0>(tq_table[0][1]);
    tq_row<G3Q_INT8, 0, 1>(tq_table[1][0]);
    tq_row<G3Q_INT4, 1, 1>(tq_table[1][1]);
    tq_hi_table[0] = tq_mk<G3Q_INT4, 1, 1, 0, true>(), tq_hi_table[1] = tq_mk<G3Q_INT4, 1, 1, 1, true>();
    tq_sb_table[0][0] = tq_mk<G3Q_INT8, 0, 1, 1, false, 3>(), tq_sb_table[0][1] = tq_mk<G3Q_INT8, 0, 1, 1, false, 4>();
    tq_sb_table[1][0] = tq_mk<G3Q_INT4, 1, 1, 1, true, 3>(), tq_sb_table[1][1] = tq_mk<G3Q_INT4, 1, 1, 1, true, 4>();
    tq_ready = 1;
}

/* 0 int8 per channel, 1 int4 in groups of 128 * j (this file's kernel), 2 GGUF groups of 16 / 32 (tc_q8g.cu) */
static int tq_variant(const g3_dmat *w) {
    if (w->k % 128 != 0 || w->g <= 0 || w->k % w->g != 0) return -1;
    if (g3c_tqg_supported(w)) return 2;
    if (w->qt == G3Q_INT8) return w->g == w->k ? 0 : -1; /* GGUF groups with $G3_CUDA_TQG=0: tc_stage.cu */
    if (w->qt == G3Q_INT4) return w->g % 128 == 0 ? 1 : -1;
    return -1;
}

/* $G3_CUDA_TQMIN: fewest rows at which this file's formats (int8 per channel, int4 in groups of 128 * j) are taken
 * here (3..9, default 3): below 9 instead of the dp4a kernel of qgemv.cu (int4, and int8 up to 4 rows) and tc_gemv.cu
 * (int8 at 5..8 rows, hi + lo bf16 activations) */
static int tq_own_min_rows(void) {
    const char *e = getenv("G3_CUDA_TQMIN");
    const int v = e && *e ? atoi(e) : 3;
    return v < 3 ? 3 : v > 9 ? 9 : v;
}

/* the fewest rows taken here for variant v (tq_variant) */
static int tq_min_rows_of(int v) { return v < 0 ? 65 : v == 2 ? g3c_tqg_min_rows() : tq_own_min_rows(); }

int g3c_tq_min_rows(const g3_dmat *w) { return tq_min_rows_of(tq_variant(w)); }

int g3c_tq_small_min(void) {
    const int a = g3c_tqg_min_rows(), b = tq_own_min_rows();
    return a < b ? a : b;
}

int g3c_tq_supported(const g3_dmat *w, int m) {
    const int v = tq_variant(w);
    return v >= 0 && m >= tq_min_rows_of(v) && m <= 64 && w->n >= 1;
}

#define TQ_UNCLAIMED ((cudaStream_t)(intptr_t)-1)
static const size_t tq_scr_bytes = (size_t)8 << 20; /* 128 rows of bf16 (value order 3) up to k = 31775 */
/* scratch of the quantized activations when the caller has none: up to 8 buffers, each taken by the first stream
 * that needs one outside graph capture (g3c_tq_init makes the first before any capture) */
static struct {
    cudaStream_t st;
    void *p;
    size_t bytes;
} tq_scr[8];

cudaError_t g3c_tq_init(void) {
    if (!tq_scr[0].p) { /* before any graph capture: the scratch of the first stream that asks */
        cudaError_t e = cudaMalloc(&tq_scr[0].p, tq_scr_bytes);
        if (e != cudaSuccess) return e;
        tq_scr[0].st = TQ_UNCLAIMED, tq_scr[0].bytes = tq_scr_bytes;
    }
    tq_build();
    for (int v = 0; v < 4; v++)
        for (int c = 0; c < 4; c++) {
            cudaError_t e = tq_inst_setup(&tq_table[v / 2][v % 2][c]);
            if (e != cudaSuccess) return e;
        }
    for (int o = 0; o < 2; o++) {
        cudaError_t e = tq_inst_setup(&tq_hi_table[o]);
        if (e == cudaSuccess) e = tq_inst_setup(&tq_sb_table[o][0]);
        if (e == cudaSuccess) e = tq_inst_setup(&tq_sb_table[o][1]);
        if (e != cudaSuccess) return e;
    }
    cudaError_t e = g3c_wg_init();
    if (e == cudaSuccess) e = g3c_tqg_init();
    if (e == cudaSuccess) e = g3c_wgb_init();
    return e == cudaSuccess ? g3c_wg4_init() : e;
}

/* [m][k] int8 or (value order 3) bf16, then (d, d sum q) [m][k/128] at xq + 2 m k */
size_t g3c_tq_q8_bytes(int m, int k) { return (size_t)2 * m * k + (size_t)m * (k / 128) * sizeof(float2); }

int g3c_tq_order(const g3_dmat *w, int m) {
    if (w->qt == G3Q_FP8) return G3C_TQ_FP8 + g3c_wgf_lo_row(m);
    if (w->qt != G3Q_INT4) return 0;
    if (g3c_q4r_taken(w, m)) return 1; /* tc_q4r.cu before the wgmma kernels (at 9..16 rows with $G3_CUDA_Q4RMAX) */
    return g3c_wgb_supported(w, m) ? 3 : g3c_wg4_supported(w, m) ? 2 : 1;
}

static int tq_hi_enabled(void) { /* $G3_CUDA_TQHI=0: int4 at 3..8 rows without HI's unpacking (k_tq) */
    const char *e = getenv("G3_CUDA_TQHI");
    return !(e && !strcmp(e, "0"));
}
static int tq_sb(void) { /* $G3_CUDA_TQSB=3|4 (k_tq at 3..8 rows) */
    const char *e = getenv("G3_CUDA_TQSB");
    const int v = e && *e ? atoi(e) : 0;
    return v == 3 || v == 4 ? v : 0;
}
static tq_inst *tq_pick(const g3_dmat *w, int m) {
    const int occ = tq_occ2(w, m), v = tq_variant(w), sb = m <= 8 ? tq_sb() : 0;
    if (sb) return &tq_sb_table[v][sb - 3];
    if (v == 1 && m <= 8 && tq_hi_enabled()) return &tq_hi_table[occ];
    return &tq_table[occ][v][m <= 8 ? 0 : m <= 16 ? 1 : m <= 32 ? 2 : 3];
}

/* int8 per channel from 9 rows on: the wgmma kernel (tc_wg.cu) unless $G3_CUDA_WG=0 */
static int tq_wg(const g3_dmat *w, int m) { return m >= g3c_wg_min_rows() && g3c_wg_supported(w, m); }

cudaError_t g3c_tq_mm_pre(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                          cudaStream_t st) {
    /* large matrices up to g3c_q4r_taken's rows: tc_q4r.cu (tc_q8.cu's value orders; fp8 on the e4m3 hi + lo rows) */
    if (g3c_q4r_taken(w, m)) return g3c_q4r_mm(w, xq, xd, m, y, n_sm, st);
    if (tq_wg(w, m)) return g3c_wg_mm(w, xq, xd, m, y, n_sm, st);
    if (g3c_wgf_taken(w, m)) return g3c_wgf_mm(w, xq, xd, m, y, n_sm, st);
    if (g3c_wgb_supported(w, m)) return g3c_wgb_mm(w, (const __nv_bfloat16 *)xq, m, y, n_sm, st);
    if (g3c_wg4_supported(w, m)) return g3c_wg4_mm(w, xq, xd, m, y, n_sm, st);
    if (!g3c_tq_supported(w, m)) return cudaErrorInvalidValue;
    if (tq_variant(w) == 2) return g3c_tqg_mm(w, xq, xd, m, y, n_sm, st);
    tq_build();
    tq_inst *ti = tq_pick(w, m);
    cudaError_t e = tq_inst_setup(ti); /* no-op after g3c_tq_init */
    return e == cudaSuccess ? tq_inst_run(ti, w, xq, xd, m, y, n_sm, st) : e;
}

cudaError_t g3c_tq_quant(const g3_dmat *w, const __nv_bfloat16 *xh, int m, int8_t *xq, float2 *xd, cudaStream_t st) {
    if (w->k % 128) return cudaErrorInvalidValue;
    const long long th = (long long)m * (w->k / 4);
    return g3c_launch(k_tq_quant, dim3((unsigned)((th + 255) / 256)), dim3(256), 0, st, xh, m, w->k, xq, xd,
                      g3c_tq_order(w, m));
}

cudaError_t g3c_tq_mm(const g3_dmat *w, const __nv_bfloat16 *xh, int m, float *y, int n_sm, void *q8, size_t q8_bytes,
                      cudaStream_t st) {
    /* large int4 / int8 matrices up to 8 rows, fp8 ones (k <= 5376 beyond 8) up to 16 by default: tc_q4r.cu (fp8 on
     * the hi + lo rows quantized as for wgf) */
    const int q4r = g3c_q4r_taken(w, m);
    const int wg = !q4r && tq_wg(w, m), wgb = !q4r && !wg && g3c_wgb_supported(w, m); /* up to 128 rows, wg4 64 */
    const int wg4 = !q4r && !wg && !wgb && g3c_wg4_supported(w, m);
    const int wgf = !wg && !wgb && !wg4 && g3c_wgf_supported(w, m); /* fp8: hi + lo e4m3 activations */
    const int wmo = wgf ? g3c_wgf_lo_row(m) : 0;
    if (!wg && !wgb && !wg4 && !wgf && !g3c_tq_supported(w, m)) return cudaErrorInvalidValue;
    tq_build();
    const int tqg = !q4r && !wg && !wgb && !wg4 && !wgf && tq_variant(w) == 2; /* GGUF groups of 16 / 32: tc_q8g.cu */
    tq_inst *ti = wg || wgb || wg4 || wgf || tqg || q4r ? NULL : tq_pick(w, m);
    cudaError_t e = ti ? tq_inst_setup(ti) : cudaSuccess; /* no-op after g3c_tq_init */
    if (e != cudaSuccess) return e;
    const size_t need = wgf ? g3c_wgf_q_bytes(m, w->k) : g3c_tq_q8_bytes(m, w->k);
    void *tmp = NULL;
    if (!q8 || q8_bytes < need) {
        /* a buffer is never freed or replaced (captured graphs keep its address); with no slot left, or during a
         * capture, the product takes a stream-ordered allocation of its own */
        int slot = -1;
        for (int i = 0; i < 8 && slot < 0; i++)
            if (tq_scr[i].p && tq_scr[i].st == st && tq_scr[i].bytes >= need) slot = i;
        for (int i = 0; i < 8 && slot < 0; i++) /* the buffer of g3c_tq_init, not yet taken by a stream */
            if (tq_scr[i].p && tq_scr[i].st == TQ_UNCLAIMED && tq_scr[i].bytes >= need) slot = i, tq_scr[i].st = st;
        if (slot < 0) {
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            e = cudaStreamIsCapturing(st, &cs);
            if (e != cudaSuccess) return e;
            for (int i = 0; i < 8 && slot < 0 && cs == cudaStreamCaptureStatusNone; i++)
                if (!tq_scr[i].p) {
                    const size_t bytes = need > tq_scr_bytes ? need : tq_scr_bytes;
                    e = cudaMalloc(&tq_scr[i].p, bytes);
                    if (e != cudaSuccess) return e;
                    tq_scr[i].st = st, tq_scr[i].bytes = bytes, slot = i;
                }
        }
        if (slot >= 0) q8 = tq_scr[slot].p;
        else {
            e = cudaMallocAsync(&tmp, need, st);
            if (e != cudaSuccess) return e;
            q8 = tmp;
        }
    }
    int8_t *xq = (int8_t *)q8;
    /* past the rows (fp8: lo rows up to mo + m); m*k is a multiple of 128: 8-byte aligned */
    float2 *xd = (float2 *)(xq + (wgf ? (size_t)(wmo + m) * w->k : (size_t)2 * m * w->k));
    e = g3c_tq_quant(w, xh, m, xq, xd, st); /* every path here has k % 128 == 0 */
    if (e == cudaSuccess)
        e = q4r   ? g3c_q4r_mm(w, xq, xd, m, y, n_sm, st)
            : wgf ? g3c_wgf_mm(w, xq, xd, m, y, n_sm, st)
            : wg  ? g3c_wg_mm(w, xq, xd, m, y, n_sm, st)
            : wgb ? g3c_wgb_mm(w, (const __nv_bfloat16 *)xq, m, y, n_sm, st)
            : wg4 ? g3c_wg4_mm(w, xq, xd, m, y, n_sm, st)
            : tqg ? g3c_tqg_mm(w, xq, xd, m, y, n_sm, st)
                  : tq_inst_run(ti, w, xq, xd, m, y, n_sm, st);
    if (tmp) {
        cudaError_t e2 = cudaFreeAsync(tmp, st);
        if (e == cudaSuccess) e = e2;
    }
    return e;
}
