/* Batched products on int4 weights (affine groups of 128 * j) with Hopper's warpgroup MMA: y += x W^T for 9..64
 * activation rows (g3c_tq_mm / g3c_tq_mm_pre; 65..256-row decode batches reach it only in launches of <= 64 rows
 * that tc_wgb.cu does not take: all with $G3_CUDA_WGB=0, else the 64 of 129 = 65 + 64).
 * $G3_CUDA_WG4=0: tc_q8.cu's mma.sync kernel, as before.
 *
 * Why: at 32 rows an int4 weight byte carries 2 x 32 multiply-adds, 128 int8 operations, which is about what
 * mma.sync issues on Hopper at the bandwidth: tc_q8.cu streamed int4 at ~0.45 of it (27B, 32 rows, CUPTI, session 8:
 * products 119 us per layer against 53 at the bandwidth). The asynchronous warpgroup MMA issues 64 x N x 32 per
 * instruction from one warpgroup and frees the warps for the nibble unpacking and the scaling.
 *
 * Roles (the opposite of tc_wg.cu's): A = weights, M = 64 output channels per MMA, from registers (int4 nibbles
 * become int8 bytes 0..15 with one mask per 4 values, which wgmma can only take from registers, not shared memory);
 * B = activations, N = tokens (16, 32 or 64: the rows padded to the next), K-major in shared memory with the
 * 128-byte swizzle (tc_wg.cu's descriptor). D[channel][token]: thread (warp w, lane g*4+t) holds channels
 * 16w + g (+8) and tokens 8i + 2t (+1) of each 64-channel tile.
 *
 * Data: activations quantized per row and block of 128 values (tq_act.cuh, d = amax/127, q = rint(x/d)) in this
 * kernel's value order (il 2), so one stage = 128 values = one int4 group: per stage and output
 * y += s_g d (q_w . q_x) + z_g (d sum q_x) (w = s_g q_w + z_g), the int32 sums exact.
 * k order: a stage is 64 bytes of each weight row; lane t of a quad takes bytes 16t..16t+15 (values 32t..32t+31) of
 * rows g and g + 8 as four words, and k step j (one m64nNk32 MMA) uses word j: a0/a1 = word & 0x0F0F0F0F (values
 * 32t + 8j + {0,2,4,6} of rows g / g+8), a2/a3 = (word >> 4) & 0x0F0F0F0F (the odd ones). In the m16n8k32 A fragment
 * a0 covers k 4t..4t+3 and a2 k 16+4t..16+4t+3, so byte 32j + 16h + 4t + i of an activation row holds value
 * 32t + 8j + 2i + h: the order g3c_tq_quant4 writes for il 2.
 *
 * Shared memory: a ring of ST stages, each [activation tile NP x 128 B, swizzled][weights: CT tiles x 2 halves x 128
 * threads x 16 B, each thread's own words][(s, z) per channel][(d, d sum q) per token]. Weights and scales are
 * requested before the programmatic-launch wait (they do not depend on the previous kernel), ST - 1 stages ahead.
 * Work: units (channel tile of 64 CT, stage) in tile-major order split evenly over the blocks (stream-K: a tile's
 * share of each block is added into y with atomics; y holds zeros on entry). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/wgmma.cuh"

#define W4_T 128 /* one warpgroup */

/* G int4 groups (128 values each) per stage */
template <int NP, int CT, int G, int ST> struct w4_cfg {
    static constexpr int XB = G * NP * 128;          /* activation tiles, one per group, each a multiple of 1024 */
    static constexpr int WB = G * CT * 2 * W4_T * 16; /* weights */
    static constexpr int SCB = G * CT * 64 * 8;       /* (s, z) per group and channel */
    static constexpr int DB = G * NP * 8;             /* (d, d sum q) per group and token */
    static constexpr int SB = (XB + WB + SCB + DB + 1023) / 1024 * 1024;
    static constexpr int SMEM = ST * SB + 1024; /* + alignment slack */
};

/* A fragments of one channel tile from this thread's words (rows g, g + 8): k step j = word j, low nibbles then high */
template <int CT>
static __device__ __forceinline__ void w4_unpack(const uint4 *ws, int tid, uint32_t (&a)[CT][4][4]) {
    const uint32_t MK = 0x0F0F0F0Fu;
#pragma unroll
    for (int tt = 0; tt < CT; tt++) {
        const uint4 r0 = ws[(tt * 2) * W4_T + tid], r1 = ws[(tt * 2 + 1) * W4_T + tid];
        const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            a[tt][j][0] = w0[j] & MK, a[tt][j][1] = w1[j] & MK;
            a[tt][j][2] = (w0[j] >> 4) & MK, a[tt][j][3] = (w1[j] >> 4) & MK;
        }
    }
}
/* the four k steps of each tile (the caller fences before and commits after) */
template <int CT, int NR>
static __device__ __forceinline__ void w4_mma(int (&ai)[CT][NR], const uint32_t (&a)[CT][4][4], uint64_t dx) {
#pragma unroll
    for (int tt = 0; tt < CT; tt++)
#pragma unroll
        for (int j = 0; j < 4; j++) wg_mma_rs<NR>(ai[tt], a[tt][j][0], a[tt][j][1], a[tt][j][2], a[tt][j][3], dx + 2 * j, j);
}
/* the A registers belong to the MMAs until their wait: this keeps the compiler from reusing them before it */
template <int CT> static __device__ __forceinline__ void w4_hold(uint32_t (&a)[CT][4][4]) {
#pragma unroll
    for (int tt = 0; tt < CT; tt++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(a[tt][j][0]), "+r"(a[tt][j][1]), "+r"(a[tt][j][2]), "+r"(a[tt][j][3]));
}
/* acc += s d sum + z (d sum q) for one group: sz [BN] (s, z) per channel, dd [NP/2] float4 (d, ds) of tokens 2i, 2i+1 */
template <int CT, int NR>
static __device__ __forceinline__ void w4_scale(float (&acc)[CT][NR], const int (&ai)[CT][NR], const float2 *sz,
                                                const float4 *dd, int wq, int g, int t) {
    float2 zs[CT][2];
#pragma unroll
    for (int tt = 0; tt < CT; tt++) zs[tt][0] = sz[tt * 64 + 16 * wq + g], zs[tt][1] = sz[tt * 64 + 16 * wq + g + 8];
#pragma unroll
    for (int q = 0; q < NR / 4; q++) {
        const float4 dq = dd[4 * q + t]; /* tokens 8q + 2t, 8q + 2t + 1 */
#pragma unroll
        for (int tt = 0; tt < CT; tt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 sc = zs[tt][e >> 1];
                const float d = (e & 1) ? dq.z : dq.x, ds = (e & 1) ? dq.w : dq.y;
                float &f = acc[tt][4 * q + e]; /* |sum| <= 128 * 15 * 127 < 2^22 */
                f = fmaf(sc.x, d * g3c_i2f_exact(ai[tt][4 * q + e]), fmaf(sc.y, ds, f));
            }
    }
}

template <int NP, int CT, int G, int ST, int MINB>
__global__ void __launch_bounds__(W4_T, MINB) k_wg4(g3_dmat w, const int8_t *__restrict__ xq,
                                                    const float2 *__restrict__ xd, int m, float *__restrict__ y, int S,
                                                    long long L) {
    constexpr int NR = NP / 2, BN = CT * 64;
    using C = w4_cfg<NP, CT, G, ST>;
    constexpr int XB = C::XB, WB = C::WB, SCB = C::SCB, SB = C::SB;
    extern __shared__ uint8_t w4_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(w4_raw);
    uint8_t *sm = w4_raw + (((raw_s + 1023u) & ~1023u) - raw_s);
    const int tid = threadIdx.x, wq = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n = w.n, K = w.k, nb = K / 128, ngr = K / w.g, KB = K / 2;
    /* units in int (L < 2^31 for any matrix here); (tile, stage) of the units are stepped, not divided per stage */
    const int u0 = (int)(L * blockIdx.x / gridDim.x), u1 = (int)(L * (blockIdx.x + 1) / gridDim.x);
    const int gdiv = w.g / 128; /* stages of 128 values per scale group */
    const uint8_t *W = (const uint8_t *)w.q;
    auto load_w = [&](int tile, int st, int slot) {
        uint8_t *b = sm + slot * SB;
        uint4 *dw = (uint4 *)(b + XB); /* [G][CT][2][W4_T] */
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int tt = 0; tt < CT; tt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = tile * BN + tt * 64 + 16 * wq + g + 8 * h;
                    const uint8_t *src = W + (size_t)(row < n ? row : n - 1) * KB + (st * G + gi) * 64 + 16 * t;
                    wg_cp16<true>(dw + ((gi * CT + tt) * 2 + h) * W4_T + tid, src, row < n ? 16 : 0);
                }
        float *dsz = (float *)(b + XB + WB); /* [G][BN] (s, z) */
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            const int grp = gdiv == 1 ? st * G + gi : (st * G + gi) / gdiv;
#pragma unroll
            for (int i = tid; i < 2 * BN; i += W4_T) {
                const int row = min(tile * BN + (i >> 1), n - 1);
                g3c_cp4(dsz + gi * 2 * BN + i, ((i & 1) ? w.z : w.s) + (size_t)row * ngr + grp);
            }
        }
    };
    auto load_x = [&](int st, int slot) {
        uint8_t *b = sm + slot * SB;
        /* no divisions here: this runs every stage, and the kernel is bound by its instruction issue */
        for (int idx = tid; idx < m * 8; idx += W4_T) {
            const int r = idx >> 3, c = idx & 7;
#pragma unroll
            for (int gi = 0; gi < G; gi++)
                g3c_cp16(b + gi * NP * 128 + r * 128 + ((c ^ (r & 7)) << 4),
                         xq + (size_t)r * K + (st * G + gi) * 128 + c * 16);
        }
        if (tid < m) /* m <= NP <= W4_T */
#pragma unroll
            for (int gi = 0; gi < G; gi++)
                g3c_cp8(b + XB + WB + SCB + 8 * (gi * NP + tid), xd + (size_t)tid * nb + st * G + gi);
    };
    /* token rows m..NP-1 of every stage: zeros (activations and their d), never loaded */
    for (int idx = tid; idx < ST * G * (NP - m) * 8; idx += W4_T) {
        const int tl = idx / ((NP - m) * 8), rem = idx % ((NP - m) * 8), r = m + (rem >> 3);
        *(uint4 *)(sm + (tl / G) * SB + (tl % G) * NP * 128 + r * 128 + ((rem & 7) << 4)) = make_uint4(0, 0, 0, 0);
    }
    for (int idx = tid; idx < ST * G * NP; idx += W4_T)
        if (idx % NP >= m)
            *(float2 *)(sm + (idx / (G * NP)) * SB + XB + WB + SCB + 8 * (idx % (G * NP))) = make_float2(0.f, 0.f);
    int ct = u0 / S, cs = u0 % S; /* the unit computed */
    int lt = ct, ls = cs;         /* the next unit loaded */
    int xs = cs;
    wg_ring_start<ST>(
        u1 - u0,
        [&](int i, bool on) {
            if (on) load_w(lt, ls, i);
            if (++ls == S) ls = 0, lt++;
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
    /* the unit computed is done: (its share of) the tile into y at the tile's or the block's end */
    auto finish = [&](int u) {
        if (u + 1 == u1 || cs + 1 == S) {
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
    };
    auto load_next = [&](int u, int sn) { /* unit u + ST - 1 into slot sn (the one done before u) */
        if (u + ST - 1 < u1) load_w(lt, ls, sn), load_x(ls, sn);
        g3c_cp_commit();
        if (++ls == S) ls = 0, lt++;
    };
    int ai[G][CT][NR];
#pragma unroll
    for (int gi = 0; gi < G; gi++)
#pragma unroll
        for (int tt = 0; tt < CT; tt++)
#pragma unroll
            for (int r = 0; r < NR; r++) ai[gi][tt][r] = 0;
    for (int u = u0; u < u1; u++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async writes -> the MMA's reads */
        __syncthreads();
        load_next(u, slot == 0 ? ST - 1 : slot - 1);
        const uint8_t *b = sm + slot * SB;
        uint32_t a[G][CT][4][4];
#pragma unroll
        for (int gi = 0; gi < G; gi++) w4_unpack<CT>((const uint4 *)(b + XB) + gi * CT * 2 * W4_T, tid, a[gi]);
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int tt = 0; tt < CT; tt++) wg_fence_regs(ai[gi][tt]);
        wg_fence();
#pragma unroll
        for (int gi = 0; gi < G; gi++) w4_mma<CT, NR>(ai[gi], a[gi], wg_desc(b + gi * NP * 128));
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            w4_hold<CT>(a[gi]);
#pragma unroll
            for (int tt = 0; tt < CT; tt++) wg_fence_regs(ai[gi][tt]);
        }
#pragma unroll
        for (int gi = 0; gi < G; gi++)
            w4_scale<CT, NR>(acc, ai[gi], (const float2 *)(b + XB + WB) + gi * BN,
                             (const float4 *)(b + XB + WB + SCB) + gi * NP / 2, wq, g, t);
        finish(u);
        slot = slot + 1 == ST ? 0 : slot + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */
#define W4_ST 4

typedef struct w4_inst {
    void *k;
    int smem, np, ct, g, bps; /* bps: resident blocks per SM (0: not set up) */
} w4_inst;
/* [variant][NP 16, 32, 64]; variant ($G3_CUDA_WG4V, for measurements): 0 two channel tiles per block, one group per
 * stage; 1 two tiles, two groups (one tile at NP 64); 2 four tiles (two at NP 64), one group; 3 one tile, two groups.
 * Measured on the H200 (27B int4, aggregate decode tok/s at 16 / 32 / 64 seqs, session 9 run 03): 0: 1530 / 2843 /
 * 4321, 1: 1736 / 2375 / 3431, 2: 1604 / 2715 / 4323, 3: 2016 / 2457 / 3416. Default: 3 at 16 rows, 0 beyond. */
#define W4_NV 4
static w4_inst w4_tab[W4_NV][3];
static int w4_ready;

template <int NP, int CT, int G, int MINB> static w4_inst w4_mk(void) {
    w4_inst r = {(void *)k_wg4<NP, CT, G, W4_ST, MINB>, w4_cfg<NP, CT, G, W4_ST>::SMEM, NP, CT, G, 0};
    return r;
}

static cudaError_t w4_setup(void) {
    if (!w4_ready) {
        w4_tab[0][0] = w4_mk<16, 2, 1, 3>(), w4_tab[0][1] = w4_mk<32, 2, 1, 3>(), w4_tab[0][2] = w4_mk<64, 2, 1, 2>();
        w4_tab[1][0] = w4_mk<16, 2, 2, 2>(), w4_tab[1][1] = w4_mk<32, 2, 2, 2>(), w4_tab[1][2] = w4_mk<64, 1, 2, 2>();
        w4_tab[2][0] = w4_mk<16, 4, 1, 2>(), w4_tab[2][1] = w4_mk<32, 4, 1, 2>(), w4_tab[2][2] = w4_mk<64, 2, 1, 2>();
        w4_tab[3][0] = w4_mk<16, 1, 2, 3>(), w4_tab[3][1] = w4_mk<32, 1, 2, 3>(), w4_tab[3][2] = w4_mk<64, 1, 2, 2>();
        w4_ready = 1;
    }
    for (int v = 0; v < W4_NV; v++)
        for (int i = 0; i < 3; i++) {
            cudaError_t e = g3c_smem_setup(w4_tab[v][i].k, w4_tab[v][i].smem, W4_T, &w4_tab[v][i].bps);
            if (e != cudaSuccess) return e;
        }
    return cudaSuccess;
}

cudaError_t g3c_wg4_init(void) { return w4_setup(); }

/* Rows taken, as measured on the H200 (27B int4, aggregate decode tok/s, argmax on the GPU, session 9 run 03;
 * this kernel's best shape against tc_q8.cu's mma.sync): 16 seqs 2016 against 1698, 32 seqs 2843 against 2994, 64
 * seqs 4321 against 3882. So 9..16 and 33..64 rows by default; $G3_CUDA_WG4=all: 9..64 (tests, measurements);
 * $G3_CUDA_WG4=0: never. */
int g3c_wg4_supported(const g3_dmat *w, int m) {
    const char *e = getenv("G3_CUDA_WG4");
    if (e && !strcmp(e, "0")) return 0;
    const int all = e && !strcmp(e, "all");
    return w->qt == G3Q_INT4 && w->k % 128 == 0 && w->g > 0 && w->g % 128 == 0 && w->k % w->g == 0 && w->n >= 1 &&
           m >= 9 && m <= 64 && (all || m <= 16 || m >= 33);
}

cudaError_t g3c_wg4_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st) {
    if (!g3c_wg4_supported(w, m)) return cudaErrorInvalidValue;
    cudaError_t e = w4_setup(); /* no-op after g3c_wg4_init */
    if (e != cudaSuccess) return e;
    const int c = m <= 16 ? 0 : m <= 32 ? 1 : 2;
    const char *ve = getenv("G3_CUDA_WG4V");
    int var = ve && *ve ? atoi(ve) : c == 0 ? 3 : 0; /* the best measured (run 03): 3 at 16 rows, 0 beyond */
    if (var < 0 || var >= W4_NV) var = 0;
    const w4_inst *v = &w4_tab[var][c];
    if (w->k % (128 * v->g) != 0) v = &w4_tab[0][c]; /* two groups per stage need k % 256 == 0 */
    const int BN = 64 * v->ct, S = w->k / (128 * v->g), tiles = (w->n + BN - 1) / BN;
    const long long L = (long long)tiles * S;
    long long blocks = (long long)(n_sm > 0 ? n_sm : 1) * v->bps;
    if (blocks > L) blocks = L;
    typedef void (*kfn)(g3_dmat, const int8_t *, const float2 *, int, float *, int, long long);
    return g3c_launch((kfn)v->k, dim3((unsigned)blocks), dim3(W4_T), (size_t)v->smem, st, *w, xq, xd, m, y, S, L);
}
