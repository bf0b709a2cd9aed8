/* What the int8 tensor-core kernels of tc_q8.cu (per-channel int8, int4 in groups of 128 * j) and tc_q8g.cu (GGUF
 * groups of 16 / 32) share: an instance of a kernel (function, shared memory, channel rows per block tile, resident blocks
 * per SM), its launch over units (tile, stage) cut evenly and contiguously among a grid that fills the GPU
 * (stream-K), the occupancy choice, and on the device the walk over a block's units three deep (the unit being
 * computed and the two whose copies are in flight). */
#ifndef G3_BACKEND_CUDA_TQ_INST_CUH
#define G3_BACKEND_CUDA_TQ_INST_CUH

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

#define TQ_THREADS 256 /* 8 warps a block */

typedef void (*tq_kernel)(g3_dmat, const int8_t *, const float2 *, int, float *, int, long long);
typedef struct tq_inst {
    tq_kernel k;
    int smem, rows; /* dynamic shared memory bytes, weight rows per block tile */
    int bps;        /* resident blocks per SM (0: not yet set up) */
} tq_inst;

static inline cudaError_t tq_inst_setup(tq_inst *ti) { return g3c_smem_setup(ti->k, ti->smem, TQ_THREADS, &ti->bps); }

/* two blocks per SM (1) or one (0) for a product of m rows on w, both kernels: $G3_CUDA_TQOCC=1|2 forces one, else
 * two for int8 and for int4 at <= 8 rows, one for int4 beyond. Measured on the H200 (27B, tok/s): tc_q8.cu at 32 / 64
 * seqs int8 two 2550 / 3590 against one 2409 / 3453, int4 one 2899 / 3792 against two 2697 / 3379; at 8 seqs two for
 * int4 (tc_q8g.cu Q4_K 956 against 924, session 34; tc_q8.cu 1045 against 955, session 35) */
static inline int tq_occ2(const g3_dmat *w, int m) {
    const char *oe = getenv("G3_CUDA_TQOCC");
    return oe && *oe ? !strcmp(oe, "2") : w->qt == G3Q_INT8 || m <= 8;
}

/* the launch; a stage is 128 weight bytes a row (int4 256 values, int8 128) */
static inline cudaError_t tq_inst_run(const tq_inst *ti, const g3_dmat *w, const int8_t *xq, const float2 *xd, int m,
                                      float *y, int n_sm, cudaStream_t st) {
    const int KS = w->qt == G3Q_INT4 ? 256 : 128;
    const int S = (w->k + KS - 1) / KS, tiles = (w->n + ti->rows - 1) / ti->rows;
    const long long L = (long long)tiles * S;
    long long blocks = (long long)(n_sm > 0 ? n_sm : 1) * ti->bps;
    if (blocks > L) blocks = L;
    if (blocks < 1) blocks = 1;
    return g3c_launch(ti->k, dim3((unsigned)blocks), dim3(TQ_THREADS), (size_t)ti->smem, st, *w, xq, xd, m, y, S, L);
}

#ifdef __CUDACC__
#include "backend/cuda/device_util.cuh"

/* weights of unit (tile, stage) into a warp's ring slot: [round][T][2 rows][32 positions] 16-byte words; lane (g, t)
 * copies chunk t of each round (8 chunks of 16 bytes a row and stage) of rows g and g + 8 of each of the warp's T
 * tiles of 16 rows (tiles of 8 warps a block tile) to position pos of its rows; chunks beyond the row are zeros */
template <int T>
static __device__ __forceinline__ void tq_load_w(const g3_dmat &w, int tile, int stage, int wi, int lane, int pos,
                                                 uint4 *slot) {
    const int n = w.n, nch = (w.qt == G3Q_INT4 ? w.k / 2 : w.k) / 16, g = lane >> 2, t = lane & 3;
    const uint4 *W = (const uint4 *)w.q;
#pragma unroll
    for (int rl = 0; rl < 2; rl++)
#pragma unroll
        for (int tt = 0; tt < T; tt++) {
            const int base = ((tile * (TQ_THREADS / 32) + wi) * T + tt) * 16;
            const int ra = min(base + g, n - 1), rb = min(base + g + 8, n - 1), kc = stage * 8 + 4 * rl + t;
            uint4 *da = slot + ((rl * T + tt) * 2) * 32 + pos, *db = da + 32;
            if (kc < nch) g3c_cp16(da, W + (size_t)ra * nch + kc), g3c_cp16(db, W + (size_t)rb * nch + kc);
            else *da = make_uint4(0, 0, 0, 0), *db = make_uint4(0, 0, 0, 0);
        }
}

/* rows m..MP-1 of the three activation buffers xs ([3][MP][UPR] units) and ds ([3][SEGS][MP]) as zeros: never
 * copied into, they stay so */
template <int UPR, int SEGS>
static __device__ __forceinline__ void tq_zero_rows(uint4 *xs, float2 *ds, int MP, int m) {
    for (int idx = threadIdx.x; idx < 3 * MP * UPR; idx += TQ_THREADS)
        if ((idx / UPR) % MP >= m) xs[idx] = make_uint4(0, 0, 0, 0);
    for (int idx = threadIdx.x; idx < 3 * SEGS * MP; idx += TQ_THREADS)
        if (idx % MP >= m) ds[idx] = make_float2(0.f, 0.f);
}

/* the activations' (d, d * sum q) of stage `stage` (SEGS blocks of 128 a stage) into ds [SEGS][MP], for rows < m */
template <int SEGS>
static __device__ __forceinline__ void tq_stage_d(float2 *ds, const float2 *xd, int m, int MP, int K, int stage) {
    const int nb = K / 128;
    for (int idx = threadIdx.x; idx < m * SEGS; idx += TQ_THREADS) {
        const int i = idx / SEGS, sg = idx % SEGS, b = stage * SEGS + sg;
        float2 *d = ds + sg * MP + i;
        if (b < nb) {
            const unsigned da = (unsigned)__cvta_generic_to_shared(d);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(da), "l"(xd + (size_t)i * nb + b) : "memory");
        } else *d = make_float2(0.f, 0.f);
    }
}

/* (tile, stage) of units u, u + 1, u + 2 of S stages a tile */
struct tq_walk {
    int tl0, st0, tl1, st1, tl2, st2;
    __device__ __forceinline__ tq_walk(long long u, int S) {
        tl0 = (int)(u / S), st0 = (int)(u % S);
        tl1 = st0 + 1 == S ? tl0 + 1 : tl0, st1 = st0 + 1 == S ? 0 : st0 + 1;
        tl2 = st1 + 1 == S ? tl1 + 1 : tl1, st2 = st1 + 1 == S ? 0 : st1 + 1;
    }
    __device__ __forceinline__ void next(int S) {
        tl0 = tl1, st0 = st1, tl1 = tl2, st1 = st2;
        tl2 = st1 + 1 == S ? tl1 + 1 : tl1, st2 = st1 + 1 == S ? 0 : st1 + 1;
    }
};
#endif

#endif
