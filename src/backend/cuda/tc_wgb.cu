/* Decode batches of 65..128 rows on int4 weights (affine groups of 128 * j) with bf16 warpgroup MMA on weights
 * dequantized in registers: y += x W^T in one pass over the weights (g3c_tq_mm takes it where g3c_wgb_supported; g3c_mm
 * sends 129..256-row batches in two launches). $G3_CUDA_WGB=0: launches of <= 64 rows on tc_wg4.cu, as before;
 * $G3_CUDA_WGBMIN=n: from n >= 9 rows (16 / 32 / 64-token tiles below 65; measured slower, for measurements).
 *
 * Why: tc_wg4.cu (int8 MMAs on int8 activations) must scale every int32 sum by its group's scale and offset and the
 * token's activation scale (~5 operations per channel, token and group of 128) and takes 64 rows at a time, so a
 * 128-row batch read every weight twice and cost as much as two 64-row steps. Here each weight becomes bf16 once per
 * block, w = s (q - 8) + (z + 8 s) (s and z of its group rounded to bf16 first; q - 8 exact; w rounded once),
 * whatever the number of tokens, and the MMA accumulates in float32 across the row; the activations stay bf16 (no
 * int8 quantization: within ~3e-3 of max|y| of bf16(x) . W, where the int8-activation kernels sit at ~4e-3 of the
 * float product). Measured (27B int4, H100, bench/logs/2026-11-27-session15): 128 / 256 seqs 4421 / 4463 tok/s
 * against 4280 / 4378 in launches of 64 (run 09); at 16..64 rows (run 07) 2.5x slower than tc_wg4.cu / tc_q8.cu:
 * the per-weight dequantization (~2 instructions a weight) outweighs per-sum scaling over few tokens. Nsight Compute
 * (runs 05-09): the kernel is latency-bound, ~2 warps per scheduler (registers: 128 accumulators a thread) at 6
 * cycles per issued instruction, the bf16 tensor pipe ~27% busy; a warp-specialized form (producer warps for the
 * copies and the dequantization, consumer warpgroups only issuing MMAs) is what would be left to try.
 *
 * Roles as in tc_wg4.cu: A = weights (64 output channels per MMA, from registers), B = activations (N = NP tokens:
 * 128, or 16 / 32 / 64 below 65 rows; rows past m zero), K-major bf16 in shared memory with the 128-byte swizzle: a
 * stage is 64 values, one swizzle atom per token row. D[channel][token]: thread (warp w, lane g*4+t) holds channels
 * 16w + g (+8) and tokens 8i + 2t (+1).
 * Dequantization: a stage is 32 bytes of each weight row; lane t of a quad takes bytes 8t..8t+7 (values 16t..16t+15)
 * of rows g and g + 8 as two words. Byte b of word J holds values v, v + 1 (low, high nibble); one byte permute puts
 * the low nibble in the low half and the high one (from word >> 4) in the high half, a mask and an or make bf16
 * 128 + q of each (exact), one bf16x2 add gives q - 8 and one fma the weight. k step j = 2J + e (one m64nNPk16 MMA)
 * takes bytes 2e (a0, a1: rows g, g + 8) and 2e + 1 (a2, a3) of word J: fragment slots 2t, 2t + 1 (+ 8 for h = 1)
 * of step j hold values 16t + 8J + 4e + 2h + {0, 1}. In pairs of values: position P = 8j + 4h + t of the stage's 32
 * pairs holds pair V = 8t + 4J + 2e + h, i.e. P = ((V & 7) << 2) | (V >> 3): the order k_tq_quant writes for value
 * order 3 (tq_act.cuh), per 64 values, pairs (4 bytes) moved whole.
 *
 * Shared memory: a ring of ST stages, each [activation tile: NP rows x 128 B, swizzled][weights: CT tiles x 2
 * halves x 128 threads x 8 B, each thread's own words][(s, z) per channel]. Weights and scales are requested before
 * the programmatic-launch wait, ST - 1 stages ahead. Work: units (channel tile of 64 CT, stage) in tile-major order
 * split evenly over the blocks (stream-K: a tile's share of each block is added into y with atomics; y holds zeros
 * on entry). */
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/wgmma.cuh"

#define WB_T 128 /* one warpgroup */

template <int NP, int CT> struct wb_cfg {
    static constexpr int XB = NP * 128;          /* activation tile: one swizzle atom per row */
    static constexpr int WB = CT * 2 * WB_T * 8; /* weights */
    static constexpr int SCB = CT * 64 * 8;      /* (s, z) per channel */
    static constexpr int SB = (XB + WB + SCB + 1023) / 1024 * 1024;
};

static __device__ __forceinline__ uint32_t wb_u32(__nv_bfloat162 v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
static __device__ __forceinline__ __nv_bfloat162 wb_h2(uint32_t u) {
    __nv_bfloat162 v;
    memcpy(&v, &u, 4);
    return v;
}
/* bf16x2 (s (q_lo - 8) + z8, s (q_hi - 8) + z8) of byte B of w (wh = w >> 4); z8 = z + 8 s */
template <int B>
static __device__ __forceinline__ uint32_t wb_deq(uint32_t w, uint32_t wh, __nv_bfloat162 s, __nv_bfloat162 z8) {
    const uint32_t x = (__byte_perm(w, wh, B | (4 + B) << 8) & 0x000F000Fu) | 0x43004300u; /* 128 + q, two lanes */
    const __nv_bfloat162 q = __hadd2(wb_h2(x), wb_h2(0xC308C308u));                       /* - 136: q - 8 exactly */
    return wb_u32(__hfma2(q, s, z8));
}

/* A fragments of CT channel tiles (4 k steps each) from this thread's words and its rows' (s, z) */
template <int CT>
static __device__ __forceinline__ void wb_unpack(const uint2 *ws, const float2 *sz, int tid, int wq, int g,
                                                 uint32_t (&a)[CT][4][4]) {
#pragma unroll
    for (int tt = 0; tt < CT; tt++) {
        const uint2 r0 = ws[(tt * 2) * WB_T + tid], r1 = ws[(tt * 2 + 1) * WB_T + tid];
        const float2 f0 = sz[tt * 64 + 16 * wq + g], f1 = sz[tt * 64 + 16 * wq + g + 8];
        const __nv_bfloat162 s0 = __float2bfloat162_rn(f0.x), z0 = __float2bfloat162_rn(fmaf(8.f, f0.x, f0.y));
        const __nv_bfloat162 s1 = __float2bfloat162_rn(f1.x), z1 = __float2bfloat162_rn(fmaf(8.f, f1.x, f1.y));
        const uint32_t w0[2] = {r0.x, r0.y}, w1[2] = {r1.x, r1.y};
#pragma unroll
        for (int J = 0; J < 2; J++) {
            const uint32_t h0 = w0[J] >> 4, h1 = w1[J] >> 4;
            a[tt][2 * J][0] = wb_deq<0>(w0[J], h0, s0, z0), a[tt][2 * J][1] = wb_deq<0>(w1[J], h1, s1, z1);
            a[tt][2 * J][2] = wb_deq<1>(w0[J], h0, s0, z0), a[tt][2 * J][3] = wb_deq<1>(w1[J], h1, s1, z1);
            a[tt][2 * J + 1][0] = wb_deq<2>(w0[J], h0, s0, z0), a[tt][2 * J + 1][1] = wb_deq<2>(w1[J], h1, s1, z1);
            a[tt][2 * J + 1][2] = wb_deq<3>(w0[J], h0, s0, z0), a[tt][2 * J + 1][3] = wb_deq<3>(w1[J], h1, s1, z1);
        }
    }
}
/* the A registers belong to the MMAs until their wait: this keeps the compiler from reusing them before it */
template <int CT> static __device__ __forceinline__ void wb_hold(uint32_t (&a)[CT][4][4]) {
#pragma unroll
    for (int tt = 0; tt < CT; tt++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            asm volatile("" : "+r"(a[tt][j][0]), "+r"(a[tt][j][1]), "+r"(a[tt][j][2]), "+r"(a[tt][j][3]));
}

template <int NP, int CT, int ST, int MINB>
__global__ void __launch_bounds__(WB_T, MINB) k_wgb(g3_dmat w, const __nv_bfloat16 *__restrict__ xb, int m,
                                                    float *__restrict__ y, int S, long long L) {
    constexpr int NR = NP / 2, BN = CT * 64;
    using C = wb_cfg<NP, CT>;
    constexpr int XB = C::XB, WB = C::WB, SB = C::SB;
    extern __shared__ uint8_t wb_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(wb_raw);
    uint8_t *sm = wb_raw + (((raw_s + 1023u) & ~1023u) - raw_s);
    const int tid = threadIdx.x, wq = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n = w.n, K = w.k, ngr = K / w.g, KB = K / 2;
    const int u0 = (int)(L * blockIdx.x / gridDim.x), u1 = (int)(L * (blockIdx.x + 1) / gridDim.x);
    const int spg = w.g / 64; /* stages per scale group */
    const uint8_t *W = (const uint8_t *)w.q;
    /* Per-thread copy offsets, so that a stage's copies cost a few instructions each (Nsight Compute, runs 06-09: the
     * per-copy index arithmetic, recomputed inside each predicated copy, was ~40% of the instructions). Weights: this thread's 8 bytes of rows
     * 16 wq + g (+ 8) of each channel tile of the loaded tile (byte offsets, < 2^32 for any matrix here), set per
     * tile; scales: channels tid / 2 and 64 + tid / 2 of it, s for even threads, z for odd. Activations: chunk
     * tid & 7 of rows tid / 8 + 16 i (the swizzle term is the same for every i). */
    uint32_t wo[CT][2], so[2];
    const float *sp = (tid & 1) ? w.z : w.s;
    auto set_tile = [&](int tile) {
#pragma unroll
        for (int tt = 0; tt < CT; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++) /* rows past n: clamped, never stored */
                wo[tt][h] = (uint32_t)min(tile * BN + tt * 64 + 16 * wq + g + 8 * h, n - 1) * (uint32_t)KB + 8u * t;
#pragma unroll
        for (int e = 0; e < 2; e++) so[e] = (uint32_t)min(tile * BN + 64 * e + (tid >> 1), n - 1) * (uint32_t)ngr;
    };
    auto load_w = [&](int st, int grp, int slot) {
        uint8_t *b = sm + slot * SB;
        uint2 *dw = (uint2 *)(b + XB) + tid; /* [CT][2][WB_T] */
#pragma unroll
        for (int tt = 0; tt < CT; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++) g3c_cp8(dw + (tt * 2 + h) * WB_T, W + wo[tt][h] + 32u * st);
        float *dsz = (float *)(b + XB + WB) + tid; /* [BN] (s, z) */
#pragma unroll
        for (int e = 0; e < 2 * BN / WB_T; e++) g3c_cp4(dsz + e * WB_T, sp + so[e] + grp);
    };
    const int xr0 = tid >> 3, xc = tid & 7, xrows = m > xr0 ? (m - xr0 + 15) / 16 : 0;
    const uint32_t xdst = (uint32_t)xr0 * 128u + (uint32_t)((xc ^ (xr0 & 7)) << 4);
    const __nv_bfloat16 *xsrc = xb + (size_t)min(xr0, m - 1) * K + xc * 8;
    const size_t xstep = (size_t)16 * K;
    /* every copy issued, rows past m with no source bytes (zeros): no per-copy branch for the compiler to sink the
     * address arithmetic into */
    auto load_x = [&](int st, int slot) {
        uint8_t *b = sm + slot * SB + xdst;
        const __nv_bfloat16 *src = xsrc + st * 64;
#pragma unroll
        for (int i = 0; i < NP / 16; i++)
            wg_cp16<false>(b + 2048 * i, src + (i < xrows ? i : 0) * xstep, i < xrows ? 16 : 0);
    };
    int ct = u0 / S, cs = u0 % S;                    /* the unit computed */
    int lt = ct, ls = cs, lg = cs / spg, lq = cs % spg; /* the next unit loaded; its scale group, stage in it */
    set_tile(lt);
    auto step_load = [&]() {
        if (++ls == S) ls = 0, lg = 0, lq = 0, set_tile(++lt);
        else if (++lq == spg) lq = 0, lg++;
    };
    int xs = cs;
    wg_ring_start<ST>(
        u1 - u0,
        [&](int i, bool on) {
            if (on) load_w(ls, lg, i);
            step_load();
        },
        [&](int i, bool on) {
            if (on) load_x(xs, i);
            if (++xs == S) xs = 0;
        });
    /* unit u0 + i has landed once group ST - 1 + i has: at the top of iteration i, 2 (ST - 1) + i groups exist */
    float acc[CT][NR];
#pragma unroll
    for (int tt = 0; tt < CT; tt++)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[tt][r] = 0.f;
    int slot = 0;
    for (int u = u0; u < u1; u++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async writes -> the MMA's reads */
        __syncthreads();
        { /* unit u + ST - 1 into the slot done before u */
            const int sn = slot == 0 ? ST - 1 : slot - 1;
            if (u + ST - 1 < u1) load_w(ls, lg, sn), load_x(ls, sn);
            g3c_cp_commit();
            step_load();
        }
        const uint8_t *b = sm + slot * SB;
        uint32_t a[CT][4][4];
        wb_unpack<CT>((const uint2 *)(b + XB), (const float2 *)(b + XB + WB), tid, wq, g, a);
#pragma unroll
        for (int tt = 0; tt < CT; tt++) wg_fence_regs(acc[tt]);
        wg_fence();
        const uint64_t dx = wg_desc(b);
#pragma unroll
        for (int tt = 0; tt < CT; tt++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                wg_mma_bf_rs<NR>(acc[tt], a[tt][j][0], a[tt][j][1], a[tt][j][2], a[tt][j][3], dx + 2 * j, 1);
        wg_commit();
        wg_wait0();
        wb_hold<CT>(a);
#pragma unroll
        for (int tt = 0; tt < CT; tt++) wg_fence_regs(acc[tt]);
        if (u + 1 == u1 || cs + 1 == S) { /* the tile's (or the block's) share into y */
#pragma unroll
            for (int tt = 0; tt < CT; tt++)
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    const int ch = ct * BN + tt * 64 + 16 * wq + g + 8 * ((r >> 1) & 1);
                    const int tok = 8 * (r >> 2) + 2 * t + (r & 1);
                    if (ch < n && tok < m) atomicAdd(y + (size_t)tok * n + ch, acc[tt][r]);
                    acc[tt][r] = 0.f;
                }
        }
        if (++cs == S) cs = 0, ct++;
        slot = slot + 1 == ST ? 0 : slot + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */
typedef struct wb_inst {
    void *k;
    int smem, ct, bps; /* bps: resident blocks per SM (0: not set up) */
} wb_inst;
/* [variant][tokens per tile 16, 32, 64, 128]; variant ($G3_CUDA_WGBV, for measurements): 0 two channel tiles per
 * block; 1 two tiles, more stages, fewer blocks per SM; 2 one tile */
#define WB_NV 3
static wb_inst wb_tab[WB_NV][4];
static int wb_ready;

template <int NP, int CT, int ST, int MINB> static wb_inst wb_mk(void) {
    wb_inst r = {(void *)k_wgb<NP, CT, ST, MINB>, ST * wb_cfg<NP, CT>::SB + 1024, CT, 0};
    return r;
}

static cudaError_t wb_setup(void) {
    if (!wb_ready) {
        wb_tab[0][0] = wb_mk<16, 2, 6, 4>(), wb_tab[0][1] = wb_mk<32, 2, 6, 4>();
        wb_tab[0][2] = wb_mk<64, 2, 5, 3>(), wb_tab[0][3] = wb_mk<128, 2, 4, 2>();
        wb_tab[1][0] = wb_mk<16, 2, 8, 2>(), wb_tab[1][1] = wb_mk<32, 2, 8, 2>();
        wb_tab[1][2] = wb_mk<64, 2, 8, 2>(), wb_tab[1][3] = wb_mk<128, 2, 6, 1>();
        wb_tab[2][0] = wb_mk<16, 1, 6, 4>(), wb_tab[2][1] = wb_mk<32, 1, 6, 4>();
        wb_tab[2][2] = wb_mk<64, 1, 5, 4>(), wb_tab[2][3] = wb_mk<128, 1, 3, 3>();
        wb_ready = 1;
    }
    for (int v = 0; v < WB_NV; v++)
        for (int i = 0; i < 4; i++) {
            cudaError_t e = g3c_smem_setup(wb_tab[v][i].k, wb_tab[v][i].smem, WB_T, &wb_tab[v][i].bps);
            if (e != cudaSuccess) return e;
        }
    return cudaSuccess;
}

cudaError_t g3c_wgb_init(void) { return wb_setup(); }

/* From $G3_CUDA_WGBMIN rows (default 65, at least 9) to 128; $G3_CUDA_WGB=0: never */
int g3c_wgb_supported(const g3_dmat *w, int m) {
    const char *e = getenv("G3_CUDA_WGB");
    if (e && !strcmp(e, "0")) return 0;
    const char *me = getenv("G3_CUDA_WGBMIN");
    const int lo = me && *me && atoi(me) > 9 ? atoi(me) : me && *me ? 9 : 65;
    return w->qt == G3Q_INT4 && w->k % 128 == 0 && w->g > 0 && w->g % 128 == 0 && w->k % w->g == 0 && w->n >= 1 &&
           m >= lo && m <= 128;
}

cudaError_t g3c_wgb_mm(const g3_dmat *w, const __nv_bfloat16 *xb, int m, float *y, int n_sm, cudaStream_t st) {
    if (!g3c_wgb_supported(w, m)) return cudaErrorInvalidValue;
    cudaError_t e = wb_setup(); /* no-op after g3c_wgb_init */
    if (e != cudaSuccess) return e;
    const char *ve = getenv("G3_CUDA_WGBV");
    int var = ve && *ve ? atoi(ve) : 0;
    if (var < 0 || var >= WB_NV) var = 0;
    const wb_inst *v = &wb_tab[var][m <= 16 ? 0 : m <= 32 ? 1 : m <= 64 ? 2 : 3];
    const int BN = 64 * v->ct, S = w->k / 64, tiles = (w->n + BN - 1) / BN;
    const long long L = (long long)tiles * S;
    long long blocks = (long long)(n_sm > 0 ? n_sm : 1) * v->bps;
    if (blocks > L) blocks = L;
    typedef void (*kfn)(g3_dmat, const __nv_bfloat16 *, int, float *, int, long long);
    return g3c_launch((kfn)v->k, dim3((unsigned)blocks), dim3(WB_T), (size_t)v->smem, st, *w, xb, m, y, S, L);
}
