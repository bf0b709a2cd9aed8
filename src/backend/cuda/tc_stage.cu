/* Tensor-core products for small batches (9..64 activation rows, plain bf16 activations) on quantized weights with
 * the activations staged in shared memory: y += x W^T, weights decoded in registers (tc_frag.cuh) as in tc_gemv.cu.
 *
 * Why: the warp-level kernel (k_tc) reads every activation fragment from global memory (L2) once per 16*T weight
 * rows, i.e. 2m/(16T) bytes of L2 traffic per weight value: at 32 rows that is 4x the int4 weight bytes, and the
 * product runs at L2 speed, far under the HBM stream. Here a block of 8 warps owns a tile of 256 rows and walks it
 * in stages of 8V values (2 rounds of 4 chunks of 16 bytes per row; int4 256 values, int8/fp8 128): the block
 * copies the stage's activations [m][8V] into shared memory once (cp.async, double-buffered, XOR-swizzled so the
 * 16-byte reads are free of bank conflicts), and each warp multiplies its own 32 rows from there. L2 traffic per
 * weight value drops to 2m/256 bytes; the weights of the next stage are loaded into registers while the current one
 * computes. Units = (tile, stage), cut evenly and contiguously among the blocks of a grid that fills the GPU
 * (stream-K); a block adds each tile's partial sums into y with float2 atomics (y starts at zero; cuda_common.cuh).
 *
 * Scales: per-channel int8/fp8 at the end; grouped int8 (GGUF 16/32) and int4 (any group, a multiple of 32) are
 * dequantized to bf16 per 16-byte chunk (MODE 2 of tc_decode).
 * Default: int4 weights (groups of 128*j) go to the int8 tensor-core kernel of tc_q8.cu instead (2x the tensor rate,
 * ~4x fewer instructions: 27B gate/up at 32 rows 110 -> 67 us on the H200); $G3_CUDA_TCM=3 sends int8 per-channel
 * weights there too (120 -> 81 us), $G3_CUDA_TCM=1 keeps this kernel for every format. The GGUF groups of 16 / 32
 * go to tc_q8g.cu's int8 tensor-core kernel the same way (from 3 rows; $G3_CUDA_TQG=0: here from 9).
 * $G3_CUDA_TCM=0 keeps k_tc for these batches (for comparison); $G3_CUDA_TCM=2 takes the variant that streams the
 * weights through cp.async too (three stages in flight per warp instead of one, the register file no longer the
 * limit); $G3_CUDA_TCMPF=1 adds an L2 prefetch of the weights of the stage after next (register variant). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/tc_frag.cuh"

#define TCM_WARPS 8
#define TCM_T 2  /* 16-row tiles per warp */
#define TCM_KR 2 /* rounds per stage */

template <int QT> struct tcm_v { static constexpr int V = QT == G3Q_BF16 ? 8 : QT == G3Q_INT4 ? 32 : 16; };

static __device__ __forceinline__ void tcm_cp_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

/* one stage of weights of this lane: chunks of rows g and g+8 of each of the warp's T tiles, per round */
struct tcm_w {
    uint4 a[TCM_KR][TCM_T], b[TCM_KR][TCM_T];
    float sa[TCM_KR][TCM_T], sb[TCM_KR][TCM_T], za[TCM_KR][TCM_T], zb[TCM_KR][TCM_T];
};

/* Weights of unit u for this lane: into registers r.a / r.b (ring == NULL), or with cp.async into the warp's ring
 * slot (ring: [KR][T][2 rows][32 lanes] 16-byte words, each lane reads back only its own words, so its own
 * cp.async.wait_group makes them visible). Chunks beyond the row are zeros. */
template <int QT>
static __device__ __forceinline__ void tcm_load_w(const g3_dmat &w, long long u, int S, int wi, int g, int t,
                                                  tcm_w &r, uint4 *ring) {
    constexpr int V = tcm_v<QT>::V;
    const int n = w.n, nch = w.k / V, lane = 4 * g + t;
    const int tile = (int)(u / S), stage = (int)(u % S);
    const uint4 *W = (const uint4 *)w.q;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int rl = 0; rl < TCM_KR; rl++)
#pragma unroll
        for (int tt = 0; tt < TCM_T; tt++) {
            const int base = ((tile * TCM_WARPS + wi) * TCM_T + tt) * 16;
            const int ra = min(base + g, n - 1), rb = min(base + g + 8, n - 1);
            const int kc = (stage * TCM_KR + rl) * 4 + t;
            const bool ok = kc < nch;
            if (ring) {
                uint4 *da = ring + ((rl * TCM_T + tt) * 2) * 32 + lane, *db = da + 32;
                if (ok) g3c_cp16(da, W + (size_t)ra * nch + kc), g3c_cp16(db, W + (size_t)rb * nch + kc);
                else *da = z4, *db = z4;
            } else {
                r.a[rl][tt] = ok ? g3c_ld_stream(W + (size_t)ra * nch + kc) : z4;
                r.b[rl][tt] = ok ? g3c_ld_stream(W + (size_t)rb * nch + kc) : z4;
            }
        }
}

/* scales (and int4 offsets) of unit u's chunks for this lane (MODE 2; zeros otherwise) */
template <int QT, int MODE>
static __device__ __forceinline__ void tcm_load_s(const g3_dmat &w, long long u, int S, int wi, int g, int t,
                                                  tcm_w &r) {
    constexpr int V = tcm_v<QT>::V;
    const int n = w.n, nch = w.k / V, ngr = w.k / w.g;
    const int tile = (int)(u / S), stage = (int)(u % S);
#pragma unroll
    for (int rl = 0; rl < TCM_KR; rl++)
#pragma unroll
        for (int tt = 0; tt < TCM_T; tt++) {
            r.sa[rl][tt] = r.sb[rl][tt] = r.za[rl][tt] = r.zb[rl][tt] = 0.f;
            if constexpr (MODE == 2) {
                const int base = ((tile * TCM_WARPS + wi) * TCM_T + tt) * 16;
                const int ra = min(base + g, n - 1), rb = min(base + g + 8, n - 1);
                const int kc = (stage * TCM_KR + rl) * 4 + t;
                const int grp = kc < nch ? (kc * V) / w.g : 0;
                r.sa[rl][tt] = __ldg(w.s + (size_t)ra * ngr + grp), r.sb[rl][tt] = __ldg(w.s + (size_t)rb * ngr + grp);
                if constexpr (QT == G3Q_INT4)
                    r.za[rl][tt] = __ldg(w.z + (size_t)ra * ngr + grp),
                    r.zb[rl][tt] = __ldg(w.z + (size_t)rb * ngr + grp);
            }
        }
}

/* L2 prefetch of unit u's weights: each row's stage is 8 chunks (128 bytes, two lines when not aligned); lanes
 * t = 0, 1 take tile t of the warp, rows g and g + 8 */
template <int QT>
static __device__ __forceinline__ void tcm_prefetch(const g3_dmat &w, long long u, int S, int wi, int g, int t) {
    constexpr int V = tcm_v<QT>::V;
    const int n = w.n, nch = w.k / V, tile = (int)(u / S), stage = (int)(u % S);
    if (t >= TCM_T) return;
    const int base = ((tile * TCM_WARPS + wi) * TCM_T + t) * 16, kc0 = stage * TCM_KR * 4;
    const int kc1 = min(kc0 + TCM_KR * 4, nch) - 1;
    const uint4 *W = (const uint4 *)w.q;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const size_t r = (size_t)min(base + g + 8 * h, n - 1) * nch;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(W + r + kc0));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(W + r + kc1));
    }
}

/* activations of stage `stage` ([8NT rows][V units], rows >= m and values >= k as zeros) into xs */
template <int QT, int NT>
static __device__ __forceinline__ void tcm_stage_x(uint4 *xs, const __nv_bfloat16 *xh, int m, int K, int stage) {
    constexpr int V = tcm_v<QT>::V, MP = 8 * NT;
    const int k0 = stage * 8 * V;
    for (int idx = threadIdx.x; idx < MP * V; idx += TCM_WARPS * 32) {
        const int i = idx / V, p = idx % V, kk = k0 + 8 * p;
        uint4 *d = xs + i * V + tc_swz<QT>(p, i);
        if (i < m && kk < K) g3c_cp16(d, xh + (size_t)i * K + kk);
        else *d = make_uint4(0, 0, 0, 0);
    }
}

/* AS = 0: weights of the next stage in registers, activations double-buffered (one cp.async group per stage).
 * AS = 1: weights and activations through cp.async, three stages deep (rings of 3 activation buffers and 3 weight
 * slots per warp): at the top of stage u everything but the newest group (unit u + 1's) must have landed. */
template <int QT, int MODE, int NT, int AS>
__global__ void __launch_bounds__(TCM_WARPS * 32, 1)
    k_tcm(g3_dmat w, const __nv_bfloat16 *__restrict__ xh, int m, float *__restrict__ y, int S, long long L, int pf) {
    constexpr int V = tcm_v<QT>::V, Q = V / 8, MP = 8 * NT, T = TCM_T, NB = AS ? 3 : 2;
    constexpr int WSLOT = TCM_KR * T * 2 * 32; /* 16-byte words of one warp's ring slot */
    extern __shared__ uint4 tcm_xs[];          /* [NB][MP][V] activations, then (AS) [3][warps][WSLOT] weights */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wi = threadIdx.x >> 5;
    const int n = w.n, K = w.k;
    const long long u0 = L * blockIdx.x / gridDim.x, u1 = L * (blockIdx.x + 1) / gridDim.x;
    uint4 *ring = tcm_xs + NB * MP * V + wi * WSLOT; /* + slot * warps * WSLOT (AS only) */
    tcm_w cur, nxt;
#pragma unroll
    for (int rl = 0; rl < TCM_KR; rl++)
#pragma unroll
        for (int tt = 0; tt < T; tt++)
            cur.a[rl][tt] = cur.b[rl][tt] = nxt.a[rl][tt] = nxt.b[rl][tt] = make_uint4(0, 0, 0, 0);
    /* the weights do not depend on the previous kernel: start their loads before waiting for it */
    if (u0 < u1) {
        tcm_load_w<QT>(w, u0, S, wi, g, t, cur, AS ? ring : NULL);
        if (AS && u0 + 1 < u1) tcm_load_w<QT>(w, u0 + 1, S, wi, g, t, cur, ring + TCM_WARPS * WSLOT);
        tcm_load_s<QT, MODE>(w, u0, S, wi, g, t, cur);
    }
    if (AS) g3c_cp_commit();
    g3c_pdl_wait();
    if (u0 >= u1) {
        tcm_cp_wait0();
        return;
    }
    tcm_load_s<QT, MODE>(w, u0, S, wi, g, t, nxt); /* defined values for the copy at the end of the last stage */
    tcm_stage_x<QT, NT>(tcm_xs, xh, m, K, (int)(u0 % S));
    g3c_cp_commit();
    if (AS) {
        if (u0 + 1 < u1) tcm_stage_x<QT, NT>(tcm_xs + MP * V, xh, m, K, (int)((u0 + 1) % S));
        g3c_cp_commit();
    }
    float acc[T][NT][4];
    tc_zero(acc);
    int it = 0; /* buffer (and ring slot) of unit u: (u - u0) % NB */
    for (long long u = u0; u < u1; u++, it = it + 1 == NB ? 0 : it + 1) {
        if (AS) asm volatile("cp.async.wait_group 1;" ::: "memory");
        else tcm_cp_wait0();
        __syncthreads(); /* stage u has landed; every warp is done with unit u - 1's buffer and slot */
        if (AS) {
            const int nb = it + 2 >= NB ? it + 2 - NB : it + 2; /* = unit u - 1's, free now */
            if (u + 2 < u1) {
                tcm_stage_x<QT, NT>(tcm_xs + nb * MP * V, xh, m, K, (int)((u + 2) % S));
                tcm_load_w<QT>(w, u + 2, S, wi, g, t, nxt, ring + nb * TCM_WARPS * WSLOT);
            }
            g3c_cp_commit();
            if (u + 1 < u1) tcm_load_s<QT, MODE>(w, u + 1, S, wi, g, t, nxt);
        } else if (u + 1 < u1) {
            tcm_stage_x<QT, NT>(tcm_xs + (it ^ 1) * MP * V, xh, m, K, (int)((u + 1) % S));
            g3c_cp_commit();
            tcm_load_w<QT>(w, u + 1, S, wi, g, t, nxt, NULL);
            tcm_load_s<QT, MODE>(w, u + 1, S, wi, g, t, nxt);
            if (pf && u + 2 < u1) tcm_prefetch<QT>(w, u + 2, S, wi, g, t);
        }
        const uint4 *xs = tcm_xs + it * MP * V;
        const uint4 *ws = ring + it * TCM_WARPS * WSLOT + lane;
#pragma unroll
        for (int rl = 0; rl < TCM_KR; rl++) {
            uint4 wa[T], wb[T];
#pragma unroll
            for (int tt = 0; tt < T; tt++) {
                if (AS) wa[tt] = ws[((rl * T + tt) * 2) * 32], wb[tt] = ws[((rl * T + tt) * 2 + 1) * 32];
                else wa[tt] = cur.a[rl][tt], wb[tt] = cur.b[rl][tt];
            }
#pragma unroll
            for (int q = 0; q < Q; q++) {
                const int p = (4 * rl + t) * Q + q;
                uint4 xb[NT];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) xb[nt] = xs[(8 * nt + g) * V + tc_swz<QT>(p, 8 * nt + g)];
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    const int j = 2 * q + jj;
                    uint32_t b0[NT], b1[NT];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) tc_bregs<QT>(xb[nt], jj, b0[nt], b1[nt]);
#pragma unroll
                    for (int tt = 0; tt < T; tt++) {
                        uint32_t a0, a1, a2, a3;
                        tc_decode<QT, MODE>(wa[tt], j, cur.sa[rl][tt], cur.za[rl][tt], a0, a2);
                        tc_decode<QT, MODE>(wb[tt], j, cur.sb[rl][tt], cur.zb[rl][tt], a1, a3);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) tc_mma(acc[tt][nt], a0, a1, a2, a3, b0[nt], b1[nt]);
                    }
                }
            }
        }
        const int tile = (int)(u / S);
        if (u + 1 == u1 || (u + 1) / S != tile) { /* tile done (or this block's share of it): add into y */
            const float *cs = MODE == 0 && QT != G3Q_BF16 ? w.s : NULL; /* per-channel scales */
#pragma unroll
            for (int tt = 0; tt < T; tt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    tc_tile_add(acc[tt][nt], y, n, m, ((tile * TCM_WARPS + wi) * T + tt) * 16, nt, g, t, cs);
        }
        cur = nxt;
    }
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */
typedef void (*tcm_kernel)(g3_dmat, const __nv_bfloat16 *, int, float *, int, long long, int);
typedef struct tcm_inst {
    tcm_kernel k;
    int smem; /* dynamic shared memory bytes */
    int bps;  /* resident blocks per SM (0: not yet set up) */
} tcm_inst;

/* tcm_table[variant][NT 2, 4, 8][AS]: variant 0 int8 per channel, 1 int8 grouped, 2 fp8 per channel, 3 int4 */
static tcm_inst tcm_table[4][3][2];
static int tcm_ready;

template <int QT, int MODE, int NT, int AS> static tcm_inst tcm_mk() {
    const int act = (AS ? 3 : 2) * 8 * NT * tcm_v<QT>::V * 16;
    const int wring = AS ? 3 * TCM_WARPS * TCM_KR * TCM_T * 2 * 32 * 16 : 0;
    tcm_inst r = {k_tcm<QT, MODE, NT, AS>, act + wring, 0};
    return r;
}
template <int QT, int MODE> static void tcm_row(tcm_inst (*row)[2]) {
    row[0][0] = tcm_mk<QT, MODE, 2, 0>(), row[1][0] = tcm_mk<QT, MODE, 4, 0>(), row[2][0] = tcm_mk<QT, MODE, 8, 0>();
    row[0][1] = tcm_mk<QT, MODE, 2, 1>(), row[1][1] = tcm_mk<QT, MODE, 4, 1>(), row[2][1] = tcm_mk<QT, MODE, 8, 1>();
}
static void tcm_build(void) {
    if (tcm_ready) return;
    tcm_row<G3Q_INT8, 0>(tcm_table[0]);
    tcm_row<G3Q_INT8, 2>(tcm_table[1]);
    tcm_row<G3Q_FP8, 0>(tcm_table[2]);
    tcm_row<G3Q_INT4, 2>(tcm_table[3]);
    tcm_ready = 1;
}

static int tcm_variant(const g3_dmat *w) {
    switch (w->qt) {
    case G3Q_INT8: return w->g == w->k ? 0 : w->g % 16 == 0 ? 1 : -1;
    case G3Q_FP8: return w->g == w->k ? 2 : -1;
    case G3Q_INT4: return w->g % 32 == 0 ? 3 : -1;
    }
    return -1;
}

/* $G3_CUDA_TCM: 0 off, 1 this kernel (weights in registers) for every format, 2 weights through cp.async (AS = 1);
 * unset or 3: int8 tensor cores (tc_q8.cu) for per-channel int8 and int4 where they apply, this kernel otherwise
 * (int8 per channel joined after the model-level KL check on the H200, 767102a: 27B 64 seqs 2527 -> 3453 tok/s) */
static int tcm_mode(void) {
    const char *e = getenv("G3_CUDA_TCM");
    if (!e || !*e) return 4;
    return !strcmp(e, "0") ? 0 : !strcmp(e, "2") ? 2 : !strcmp(e, "3") ? 3 : 1;
}
/* tc_q8.cu */
int g3c_tq_supported(const g3_dmat *w, int m);
cudaError_t g3c_tq_init(void);
static int tcm_enabled(void) {
    return tcm_mode() != 0;
}

int g3c_tq_small(const g3_dmat *w, int m) {
    const int md = tcm_mode();
    /* from g3c_tq_min_rows(w); large fp8 matrices from 3 rows on tc_q4r.cu (e4m3 hi + lo activations) */
    return m <= 8 && (md == 3 || md == 4) &&
           (g3c_tq_supported(w, m) || (w->qt == G3Q_FP8 && m >= 3 && g3c_q4r_taken(w, m)));
}

int g3c_tq_taken(const g3_dmat *w, int m) {
    const char *e = getenv("G3_CUDA_TQPRE"); /* 0: every tq product quantizes its input itself (k_tq_quant) */
    if (e && !strcmp(e, "0")) return 0;
    if (m <= 8) return g3c_tq_small(w, m); /* tc_q8.cu / tc_q8g.cu from g3c_tq_min_rows(w) */
    const int md = tcm_mode();
    if ((md == 3 || md == 4) && g3c_q4r_taken(w, m)) return 1; /* tc_q4r.cu (by default fp8 at 9..16 rows) */
    if (g3c_wgf_taken(w, m)) return 1; /* fp8 on tc_wg.cu's e4m3 kernel: hi + lo parts by the producer */
    return (md == 3 || md == 4) && g3c_tcm_supported(w, m) && g3c_tq_supported(w, m);
}

int g3c_tcm_supported(const g3_dmat *w, int m) {
    const int v = tcm_variant(w);
    if (v < 0 || m < 9 || m > 64 || !tcm_enabled()) return 0;
    const int V = w->qt == G3Q_INT4 ? 32 : 16;
    return w->k % V == 0 && w->n >= 1;
}

static cudaError_t tcm_setup(tcm_inst *ti) { return g3c_smem_setup(ti->k, ti->smem, TCM_WARPS * 32, &ti->bps); }

cudaError_t g3c_tcm_init(void) {
    cudaError_t eq = g3c_tq_init();
    if (eq != cudaSuccess) return eq;
    tcm_build();
    for (int v = 0; v < 4; v++)
        for (int c = 0; c < 6; c++) {
            cudaError_t e = tcm_setup(&tcm_table[v][c / 2][c % 2]);
            if (e != cudaSuccess) return e;
        }
    return cudaSuccess;
}

cudaError_t g3c_tcm_mm(const g3_dmat *w, const __nv_bfloat16 *xh, int m, float *y, int n_sm, cudaStream_t st) {
    if (!g3c_tcm_supported(w, m)) return cudaErrorInvalidValue;
    const int md = tcm_mode();
    if ((md == 3 || md == 4) && (g3c_tq_supported(w, m) || g3c_q4r_taken(w, m))) /* fp8 on tc_q4r.cu too */
        return g3c_tq_mm(w, xh, m, y, n_sm, NULL, 0, st);
    tcm_build();
    tcm_inst *ti = &tcm_table[tcm_variant(w)][m <= 16 ? 0 : m <= 32 ? 1 : 2][tcm_mode() == 2];
    cudaError_t e = tcm_setup(ti); /* no-op after g3c_tcm_init */
    if (e != cudaSuccess) return e;
    const int V = w->qt == G3Q_INT4 ? 32 : 16, nch = w->k / V, S = (nch + 4 * TCM_KR - 1) / (4 * TCM_KR);
    const int rows = TCM_WARPS * TCM_T * 16, tiles = (w->n + rows - 1) / rows;
    const long long L = (long long)tiles * S;
    long long blocks = (long long)(n_sm > 0 ? n_sm : 1) * ti->bps;
    if (blocks > L) blocks = L;
    if (blocks < 1) blocks = 1;
    const char *pe = getenv("G3_CUDA_TCMPF"); /* 1: L2 prefetch of the stage after next (comparison switch) */
    const int pf = pe && !strcmp(pe, "1");
    return g3c_launch(ti->k, dim3((unsigned)blocks), dim3(TCM_WARPS * 32), (size_t)ti->smem, st, *w, xh, m, y, S, L,
                      pf);
}
