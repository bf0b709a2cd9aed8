/* Matrix products on tensor cores for decode and small batches (m <= 64 activation rows): y += x W^T with every
 * resident weight format decoded in registers straight from 16-byte loads (nothing dequantized to memory), bf16
 * mma.sync m16n8k16 with float32 accumulators.
 *
 * Work: the matrix is cut into tiles of 16*T rows, each row into rounds of 4 chunks of 16 bytes (a round = 32 bf16,
 * 64 int8/fp8 or 128 int4 values). The L = tiles x rounds units are split evenly and contiguously among the warps
 * of a grid that exactly fills the GPU (stream-K): a warp walks its units tile by tile, keeps U rounds of loads in
 * flight, and adds each tile's partial sums into y with atomics (y starts at zero; cuda_common.cuh). Lane t of a
 * warp reads chunk t of each round from rows g and g+8 of the tile (tc_frag.cuh for the fragment layouts).
 *
 * Activation columns (B): split (m <= 8) -> column 2i = hi of row i, 2i+1 = lo of row i, so lane (g, t)'s C pair
 * (2t, 2t+1) is one row's hi + lo; plain -> column i = row i (bf16). Columns beyond the rows are zero.
 *
 * Optionally ($G3_CUDA_TCPF=1) each warp prefetches its first rounds of weights into L2 before waiting for the
 * previous kernel (programmatic dependent launch), and the next batch while computing one. With gg.a set, the warp that
 * completes a tile (a counter per tile adds the rounds done) applies GeGLU to its (gate, up) row pairs.
 *
 * Scales: per-channel int8/fp8 at the end; int4 (split, groups a multiple of 128) exactly, as
 * sum (128+q) x from the weights and sum x from an all-ones A, combined per round with s and z - 128 s;
 * otherwise (plain) weights are dequantized to bf16 per chunk.
 * Plain products of 9..64 rows on quantized weights go to tc_stage.cu instead (activations staged in shared memory
 * once per 256-row block tile rather than re-read from L2 per 32 rows), unless $G3_CUDA_TCM=0 or GeGLU is fused;
 * fp8 from 17 rows ($G3_CUDA_WGFMIN) to tc_wg.cu's e4m3 warpgroup MMA (g3c_wgf_supported). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/tc_frag.cuh"

template <int QT> struct tcv { static constexpr int V = QT == G3Q_BF16 ? 8 : QT == G3Q_INT4 ? 32 : 16; };
static int tcv_values(int qt) { return qt == G3Q_BF16 ? 8 : qt == G3Q_INT4 ? 32 : 16; } /* values per 16 bytes */

static __device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <int QT, int MODE, int NT, int SPLIT, int T, int U>
__global__ void __launch_bounds__(128, T == 2 ? 2 : QT == G3Q_INT4 ? 3 : 4)
    k_tc(g3_dmat w, const __nv_bfloat16 *__restrict__ xh, int m, float *__restrict__ y, long long L, int R,
         g3c_tc_geglu gg, int pf) {
    constexpr int V = tcv<QT>::V, Q = V / 8, PF = QT == G3Q_BF16 ? U : 2 * U;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const long long gw = (long long)blockIdx.x * 4 + (threadIdx.x >> 5), GW = (long long)gridDim.x * 4;
    const int n = w.n, K = w.k, nch = K / V, ngr = K / w.g;
    const uint4 *W = (const uint4 *)w.q;
    const uint4 zero4 = make_uint4(0, 0, 0, 0);

    /* the weights do not depend on the previous kernel: pull this warp's first rounds into L2 while it drains */
    if (pf) {
        const long long p0 = L * gw / GW, p1 = L * (gw + 1) / GW, pe = p1 < p0 + PF ? p1 : p0 + PF;
        for (long long up = p0; up < pe; up++) {
            const int tile = (int)(up / R), kc = (int)(up % R) * 4 + t;
            if (kc >= nch) continue;
#pragma unroll
            for (int tt = 0; tt < T; tt++) {
                const int base = (tile * T + tt) * 16;
                prefetch_l2(W + (size_t)min(base + g, n - 1) * nch + kc);
                prefetch_l2(W + (size_t)min(base + g + 8, n - 1) * nch + kc);
            }
        }
    }
    g3c_pdl_wait();

    /* this lane's activation column in each n-tile */
    const uint4 *xp[NT];
    bool xv[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int i = SPLIT ? 4 * nt + (g >> 1) : 8 * nt + g;
        xv[nt] = i < m;
        size_t row = (SPLIT && (g & 1) ? (size_t)m : 0) + (size_t)(xv[nt] ? i : 0);
        xp[nt] = (const uint4 *)(xh + row * K);
    }

    long long u = L * gw / GW;
    const long long u1 = L * (gw + 1) / GW;
    while (u < u1) {
        const int tile = (int)(u / R), r0 = (int)(u % R);
        const int r1 = (int)(r0 + (u1 - u) < R ? r0 + (u1 - u) : R);
        u += r1 - r0;
        int rowA[T], rowB[T];
        const uint4 *pa[T], *pb[T];
#pragma unroll
        for (int tt = 0; tt < T; tt++) {
            int base = (tile * T + tt) * 16;
            rowA[tt] = base + g, rowB[tt] = base + g + 8;
            pa[tt] = W + (size_t)min(rowA[tt], n - 1) * nch;
            pb[tt] = W + (size_t)min(rowB[tt], n - 1) * nch;
        }
        float acc[T][NT][4];
        tc_zero(acc);

        for (int r = r0; r < r1; r += U) {
            if (pf) /* keep the stream going while this batch computes: the next batch into L2 */
#pragma unroll
                for (int uu = 0; uu < U; uu++) {
                    const int rr = r + U + uu, kc = rr * 4 + t;
                    if (rr < r1 && kc < nch)
#pragma unroll
                        for (int tt = 0; tt < T; tt++) prefetch_l2(pa[tt] + kc), prefetch_l2(pb[tt] + kc);
                }
            uint4 wa[U][T], wb[U][T];
            float sa[U][T], za[U][T], sb[U][T], zb[U][T];
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int rr = r + uu, kc = rr * 4 + t;
                const bool ok = rr < r1 && kc < nch;
#pragma unroll
                for (int tt = 0; tt < T; tt++) {
                    wa[uu][tt] = ok ? g3c_ld_stream(pa[tt] + kc) : zero4;
                    wb[uu][tt] = ok ? g3c_ld_stream(pb[tt] + kc) : zero4;
                    sa[uu][tt] = za[uu][tt] = sb[uu][tt] = zb[uu][tt] = 0.f;
                    if constexpr (MODE != 0) {
                        int grp = MODE == 1 ? (rr * 4 * V) / w.g : (kc * V) / w.g;
                        grp = ok ? grp : 0;
                        const size_t ia = (size_t)min(rowA[tt], n - 1) * ngr + grp;
                        const size_t ib = (size_t)min(rowB[tt], n - 1) * ngr + grp;
                        sa[uu][tt] = __ldg(w.s + ia), sb[uu][tt] = __ldg(w.s + ib);
                        if constexpr (QT == G3Q_INT4) za[uu][tt] = __ldg(w.z + ia), zb[uu][tt] = __ldg(w.z + ib);
                    }
                }
            }
#pragma unroll
            for (int uu = 0; uu < U; uu++) {
                const int rr = r + uu;
                if (rr >= r1) break;
                const int kc = rr * 4 + t;
                const bool okx = kc < nch;
                float cq[T][NT][4], co[NT][4];
                (void)cq, (void)co;
                if constexpr (MODE == 1) {
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            co[nt][e] = 0.f;
#pragma unroll
                            for (int tt = 0; tt < T; tt++) cq[tt][nt][e] = 0.f;
                        }
                }
#pragma unroll
                for (int q = 0; q < Q; q++) {
                    uint4 xb[NT];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        xb[nt] = xv[nt] && okx ? __ldg(xp[nt] + (size_t)kc * Q + q) : zero4;
#pragma unroll
                    for (int jj = 0; jj < 2; jj++) {
                        const int j = 2 * q + jj;
                        uint32_t b0[NT], b1[NT];
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) tc_bregs<QT>(xb[nt], jj, b0[nt], b1[nt]);
#pragma unroll
                        for (int tt = 0; tt < T; tt++) {
                            uint32_t a0, a1, a2, a3;
                            tc_decode<QT, MODE>(wa[uu][tt], j, sa[uu][tt], za[uu][tt], a0, a2);
                            tc_decode<QT, MODE>(wb[uu][tt], j, sb[uu][tt], zb[uu][tt], a1, a3);
#pragma unroll
                            for (int nt = 0; nt < NT; nt++) {
                                if constexpr (MODE == 1) tc_mma(cq[tt][nt], a0, a1, a2, a3, b0[nt], b1[nt]);
                                else tc_mma(acc[tt][nt], a0, a1, a2, a3, b0[nt], b1[nt]);
                            }
                        }
                        if constexpr (MODE == 1) {
                            const uint32_t one = 0x3F803F80u; /* bf16 1.0, 1.0 */
#pragma unroll
                            for (int nt = 0; nt < NT; nt++) tc_mma(co[nt], one, one, one, one, b0[nt], b1[nt]);
                        }
                    }
                }
                if constexpr (MODE == 1) { /* sum w x = s sum (128+q) x + (z - 128 s) sum x */
#pragma unroll
                    for (int tt = 0; tt < T; tt++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const float s = e < 2 ? sa[uu][tt] : sb[uu][tt], z = e < 2 ? za[uu][tt] : zb[uu][tt];
                                acc[tt][nt][e] += s * cq[tt][nt][e] + (z - 128.f * s) * co[nt][e];
                            }
                }
            }
        }
        /* epilogue: per-channel scale, atomics into y[i][row] */
#pragma unroll
        for (int tt = 0; tt < T; tt++) {
            float scA = 1.f, scB = 1.f;
            if constexpr (MODE == 0 && QT != G3Q_BF16) {
                scA = __ldg(w.s + min(rowA[tt], n - 1)), scB = __ldg(w.s + min(rowB[tt], n - 1));
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = hf ? rowB[tt] : rowA[tt];
                    const float sc = hf ? scB : scA, c0 = acc[tt][nt][2 * hf], c1 = acc[tt][nt][2 * hf + 1];
                    if (row >= n) continue;
                    if (SPLIT) {
                        const int i = 4 * nt + t;
                        if (i < m) atomicAdd(y + (size_t)i * n + row, (c0 + c1) * sc);
                    } else {
                        const int i = 8 * nt + 2 * t;
                        if (i < m) atomicAdd(y + (size_t)i * n + row, c0 * sc);
                        if (i + 1 < m) atomicAdd(y + (size_t)(i + 1) * n + row, c1 * sc);
                    }
                }
        }
        if (gg.a) { /* fused GeGLU: the warp that completes a tile turns its (gate, up) row pairs into a and ah */
            __threadfence();
            __syncwarp();
            unsigned old = 0;
            if (lane == 0) old = atomicAdd(gg.cnt + tile, (unsigned)(r1 - r0));
            old = __shfl_sync(0xffffffffu, old, 0);
            if (old + (unsigned)(r1 - r0) == (unsigned)R) {
                __threadfence();
                const int base = tile * T * 16, F = n / 2;
                for (int e = lane; e < 8 * T * m; e += 32) {
                    const int pr = e % (8 * T), i = e / (8 * T), row = base + 2 * pr;
                    if (row >= n) continue;
                    float2 *yp = (float2 *)(y + (size_t)i * n + row);
                    const float2 gu = __ldcg(yp);
                    *yp = make_float2(0.f, 0.f);
                    const float v = gelu_tanh(gu.x) * gu.y;
                    const size_t o = (size_t)i * F + row / 2;
                    gg.a[o] = v;
                    const __nv_bfloat16 hv = __float2bfloat16_rn(v);
                    gg.ah[o] = hv;
                    if (gg.split) gg.ah[(size_t)m * F + o] = __float2bfloat16_rn(v - __bfloat162float(hv));
                }
                if (lane == 0) gg.cnt[tile] = 0u;
            }
        }
    }
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */
typedef void (*tc_kernel)(g3_dmat, const __nv_bfloat16 *, int, float *, long long, int, g3c_tc_geglu, int);
typedef struct tc_inst {
    tc_kernel k;
    int T;
    int bps; /* resident blocks per SM (g3c_tc_init) */
} tc_inst;

/* configurations: 0,1 split NT 1,2; 2..5 plain NT 1,2,4,8 (n-tiles of 8 activation columns) */
#define NCFG 6

template <int QT, int MODE, int NT, int SPLIT> static tc_inst mk() {
    /* rows per warp step (T tiles share each activation load), rounds of loads in flight per warp */
    constexpr int T = NT >= 4 ? 2 : 1, U = T == 2 ? (QT == G3Q_INT4 && NT == 8 ? 1 : 2) : QT == G3Q_BF16 ? 8 : 4;
    tc_inst r = {k_tc<QT, MODE, NT, SPLIT, T, U>, T, 0};
    return r;
}
template <int QT, int MODE> static void mk_plain(tc_inst *row) {
    row[2] = mk<QT, MODE, 1, 0>(), row[3] = mk<QT, MODE, 2, 0>(), row[4] = mk<QT, MODE, 4, 0>();
    row[5] = mk<QT, MODE, 8, 0>();
}

/* table[variant][cfg]: variant 0 bf16, 1 int8 per channel, 2 int8 grouped, 3 fp8, 4 int4 */
static tc_inst table[5][NCFG];
static int table_ready;

static void build_table(void) {
    if (table_ready) return;
    memset(table, 0, sizeof table);
    table[0][0] = mk<G3Q_BF16, 0, 1, 1>(), table[0][1] = mk<G3Q_BF16, 0, 2, 1>();
    mk_plain<G3Q_BF16, 0>(table[0]);
    table[1][0] = mk<G3Q_INT8, 0, 1, 1>(), table[1][1] = mk<G3Q_INT8, 0, 2, 1>();
    mk_plain<G3Q_INT8, 0>(table[1]);
    mk_plain<G3Q_INT8, 2>(table[2]);
    table[3][0] = mk<G3Q_FP8, 0, 1, 1>(), table[3][1] = mk<G3Q_FP8, 0, 2, 1>();
    mk_plain<G3Q_FP8, 0>(table[3]);
    table[4][0] = mk<G3Q_INT4, 1, 1, 1>(), table[4][1] = mk<G3Q_INT4, 1, 2, 1>();
    mk_plain<G3Q_INT4, 2>(table[4]);
    table_ready = 1;
}

cudaError_t g3c_tc_init(void) {
    build_table();
    cudaError_t et = g3c_tcm_init();
    if (et != cudaSuccess) return et;
    for (int v = 0; v < 5; v++)
        for (int c = 0; c < NCFG; c++) {
            tc_inst *ti = &table[v][c];
            if (!ti->k || ti->bps) continue;
            int b = 0;
            cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, ti->k, 128, 0);
            if (e != cudaSuccess) return e;
            ti->bps = b < 1 ? 1 : b;
        }
    return cudaSuccess;
}

static int variant_of(const g3_dmat *w) {
    switch (w->qt) {
    case G3Q_BF16: return 0;
    case G3Q_INT8: return w->g == w->k ? 1 : 2;
    case G3Q_FP8: return w->g == w->k ? 3 : -1;
    case G3Q_INT4: return w->g % 32 == 0 ? 4 : -1;
    }
    return -1;
}

static int cfg_of(int m, int split) {
    if (split) return m <= 4 ? 0 : m <= 8 ? 1 : -1;
    return m <= 8 ? 2 : m <= 16 ? 3 : m <= 32 ? 4 : m <= 64 ? 5 : -1;
}

int g3c_tc_tiles(const g3_dmat *w, int m, int split) {
    if (!g3c_tc_supported(w, m, split)) return 0;
    const tc_inst *ti = &table[variant_of(w)][cfg_of(m, split)];
    return (w->n + 16 * ti->T - 1) / (16 * ti->T);
}

int g3c_tc_supported(const g3_dmat *w, int m, int split) {
    int v = variant_of(w), c = cfg_of(m, split);
    if (v < 0 || c < 0 || m < 1) return 0;
    if (w->k % tcv_values(w->qt) != 0) return 0;
    if (split && v == 4 && w->g % 128 != 0) return 0; /* exact int4 path needs whole rounds per group */
    if (split && v == 2) return 0;                    /* int8 groups of 16/32: CUDA-core GEMV (exact) */
    build_table();
    return table[v][c].k != NULL;
}

cudaError_t g3c_tc_mm(const g3_dmat *w, const __nv_bfloat16 *xh, int m, int split, float *y, const g3c_tc_geglu *gg,
                      int n_sm, cudaStream_t st) {
    if (!g3c_tc_supported(w, m, split)) return cudaErrorInvalidValue;
    /* fp8 from g3c_wgf_min_rows() rows: e4m3 warpgroup MMA on hi + lo e4m3 activations from the hi rows of xh */
    if (!(gg && gg->a) && g3c_wgf_taken(w, m))
        return g3c_tq_mm(w, xh, m, y, n_sm, NULL, 0, st);
    if (!split && !(gg && gg->a) && g3c_tcm_supported(w, m)) return g3c_tcm_mm(w, xh, m, y, n_sm, st);
    const tc_inst *ti = &table[variant_of(w)][cfg_of(m, split)];
    const int V = tcv_values(w->qt), nch = w->k / V, R = (nch + 3) / 4;
    const int tiles = (w->n + 16 * ti->T - 1) / (16 * ti->T);
    const long long L = (long long)tiles * R;
    long long blocks = (long long)n_sm * (ti->bps ? ti->bps : 4);
    long long need = (L + 4 * 4 - 1) / (4 * 4); /* at least ~4 rounds per warp */
    if (blocks > need) blocks = need;
    if (blocks < 1) blocks = 1;
    g3c_tc_geglu none;
    memset(&none, 0, sizeof none);
    if (gg && gg->a && w->n % 2) return cudaErrorInvalidValue;
    /* $G3_CUDA_TCPF=1: L2 prefetch of the first rounds before the PDL wait and of the next batch in the loop
     * (measured slower on the H200: 27B bf16 43 against 53 tok/s, int4 88 against 92; off by default) */
    const char *pe = getenv("G3_CUDA_TCPF");
    const int pf = pe && !strcmp(pe, "1");
    return g3c_launch(ti->k, dim3((unsigned)blocks), dim3(128), 0, st, *w, xh, m, y, L, R, gg ? *gg : none, pf);
}
