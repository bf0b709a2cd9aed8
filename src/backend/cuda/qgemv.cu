/* Decode matrix products (m <= 8 activation rows) on quantized weights with integer dot products: the activations are
 * quantized to int8 in blocks of 32 values (q8) by a small kernel, then the weights are streamed once with 16-byte
 * loads and multiplied with __dp4a, int32 sums turned into float once per 16 or 32 values.
 *
 * Why: the CUDA-core GEMV (gemv.cu) decodes every weight into float (~3 instructions per value: compute-bound for
 * int4 on the H200, ~34e12 lane-ops/s against 8.6e12 int4 values/s at full bandwidth) and the tensor-core kernel
 * (tc_gemv.cu) needs two mma per value for exact int4 groups. Here an int4 chunk of 16 bytes (32 values) costs 12
 * logic ops to mask its nibbles into bytes (shared by all activation rows), then per activation row 8 dp4a + 4 float
 * ops: ~25 lane-ops per 16 bytes at one row, ~7e12 lane-ops/s at 4.4 TB/s. int8 needs no unpacking at all.
 *
 * Accuracy: x is replaced by xh = d*q, q = rint(x * 127/amax) with amax the largest |x| of its block of 32, so
 * |xh - x| <= amax/254 per value; the product is then computed exactly up to float32 rounding: sum over blocks of
 * d * (s * sum q_w q_x) (+ z * d * sum q_x for int4: the offset uses the block sum of the same xh, so the result is
 * exactly W_deq . xh). Quantized weights carry far larger errors (int4 ~1/30, int8 ~1/500 of a group's range), so
 * the KL the model tests judge is dominated by the weights. Still, q8 noise is ~4x the bf16 rounding of the exact
 * paths (KL ~ noise^2), so for int8 weights up to $G3_CUDA_Q8LO rows (default 2, i.e. batch-1 decode) a residual
 * plane is added (int4 weights: $G3_CUDA_Q4LO, default 0, see lo_rows):
 * q_lo = rint((x*127/amax - q) * 254), xh = d * (q + q_lo/254), |xh - x| <= amax/64516 (~2^-16 of the block max,
 * like the bf16 hi + lo of the tensor-core paths), for 2x the dp4a (cheap at one row: ~40 lane-ops per 16 bytes).
 * Beyond 2 rows dp4a work grows with the rows and the single plane is kept.
 *
 * q8 layout (buffer: q [m][k] int8, q_lo [m][k] int8 (same layout), then [m][k/32] float2 (d, d * sum of q +
 * q_lo/254)):
 *   int8 weights: natural order, 16-byte chunk c of a row = values 16c..16c+15 (half of block c/2).
 *   int4 weights: a weight word (4 bytes = 8 values, byte b: lo nibble value 2b, hi 2b+1) gives its lo nibbles
 *     (values 0,2,4,6) and hi nibbles (1,3,5,7) by one mask each; the activations of 8 values are stored in that
 *     order, (x0,x2,x4,x6)(x1,x3,x5,x7), and block c (32 values = one weight chunk) is split in two planes: words 0-1
 *     at byte 16c of the row, words 2-3 at k/2 + 16c, so that each 16-byte load of a warp is contiguous.
 *
 * Work split (as gemv.cu): blocks of 4 warps; KS warps (1, 2, 4 by row length) own R rows and take interleaved
 * chunks (warp j of the group, lane l: chunk l + 32j + 32*KS*i); U chunks per row are loaded per step (U = 3 at one
 * row: ~5.25 chunks per lane in every 27B matrix, so two steps, 3 KB per warp in flight), and the next
 * step's loads (weights and their group scales) are issued before the current step's math (register double
 * buffer). The first step's weights are loaded before the programmatic-dependent-launch wait, so they stream while
 * the quantization kernel before runs. Outputs are written (not accumulated); GeGLU fuses as in gemv.cu.
 *
 * Where the quantization runs: 3..8 rows, its own kernel k_q8 (one extra launch per product) before k_qgemv (this
 * file); 1-2 rows: the persistent kernel of qgemv_p.cu, which quantizes in shared memory (see there). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/qgemv_common.cuh"

__global__ void k_q8(const float *__restrict__ x, int ldx, int m, int k, int8_t *__restrict__ xq,
                     int8_t *__restrict__ xl, float2 *__restrict__ xd, int il, int hl) {
    g3c_pdl_wait();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x, tot = (long long)m * (k / 8);
    float v[8];
    q8_load(x, ldx, k, t, t < tot, v);
    q8_quant(v, k, t, t < tot, xq, xl, xd, il, hl);
}

/* ---- the product ------------------------------------------------------------------------------------------------ */
/* PC: int8 with one scale per row (applied at the end); else one scale (int4: and offset) per chunk's group, the
 * group of chunk c being c >> gsh. */
/* blocks per SM asked of the register allocator where it costs no spills (ptxas -v): 20 (int8) / 16 (int4) warps */
#define QGEMV_MINB(QT, M) ((QT) == G3Q_INT8 ? ((M) <= 2 ? 5 : 1) : ((M) <= 2 ? 4 : 1))
template <int QT, int M, int R, int U, bool PC, bool HL>
__global__ void __launch_bounds__(128, QGEMV_MINB(QT, M)) k_qgemv(g3_dmat w, const int8_t *__restrict__ xq, const int8_t *__restrict__ xl,
                                               const float2 *__restrict__ xd, int m, float *__restrict__ y, int ldy,
                                               int geglu, int KS, int gsh) {
    constexpr int V = QT == G3Q_INT4 ? 32 : 16; /* values per 16-byte chunk */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = warp / KS, ks = warp % KS;
    const int n0 = (blockIdx.x * (4 / KS) + grp) * R, K = w.k, nch = K / V, ngr = K / w.g, step = 32 * KS;
    const size_t row_bytes = QT == G3Q_INT4 ? (size_t)K / 2 : (size_t)K;
    const uint4 *wr[R];
    const float *sr[R], *zr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int nr = min(n0 + r, w.n - 1);
        wr[r] = (const uint4 *)((const uint8_t *)w.q + (size_t)nr * row_bytes);
        sr[r] = w.s + (size_t)nr * ngr;
        zr[r] = QT == G3Q_INT4 ? w.z + (size_t)nr * ngr : w.s;
    }
    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    uint4 wa[U][R];
    float sa[U][R], za[U][R];
    int c = lane + 32 * ks;
    /* weights and scales of the step at chunk cb (zeros past the row) */
    auto load = [&](int cb, uint4 (&wv)[U][R], float (&sv)[U][R], float (&zv)[U][R]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = cb + u * step;
            const bool ok = cc < nch;
#pragma unroll
            for (int r = 0; r < R; r++) {
                wv[u][r] = ok ? g3c_ld_stream(wr[r] + cc) : zero4;
                sv[u][r] = !PC && ok ? __ldg(sr[r] + (cc >> gsh)) : 0.f;
                zv[u][r] = QT == G3Q_INT4 && ok ? __ldg(zr[r] + (cc >> gsh)) : 0.f;
            }
        }
    };
    load(c, wa, sa, za); /* independent of the previous kernel */
    g3c_pdl_wait();

    const int8_t *xr[M], *lr[M];
    const float2 *dr[M];
#pragma unroll
    for (int i = 0; i < M; i++) {
        const int ii = min(i, m - 1);
        xr[i] = xq + (size_t)ii * K;
        lr[i] = HL ? xl + (size_t)ii * K : xr[i];
        dr[i] = xd + (size_t)ii * (K / 32);
    }
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) acc[r][i] = 0.f;

    for (; c < nch; c += U * step) {
        uint4 wb[U][R];
        float sb[U][R], zb[U][R];
        load(c + U * step, wb, sb, zb); /* next step in flight during this one's math */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = c + u * step;
            if (cc >= nch) break;
            q_chunk<QT, R, M, PC, HL, false>(wa[u], sa[u], za[u], cc, K, xr, lr, dr, acc);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) wa[u][r] = wb[u][r], sa[u][r] = sb[u][r], za[u][r] = zb[u][r];
    }

    __shared__ float red[4][R][M];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float sc = PC ? __ldg(w.s + min(n0 + r, w.n - 1)) : 1.f;
#pragma unroll
        for (int i = 0; i < M; i++) {
            float v = acc[r][i];
#pragma unroll
            for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][r][i] = v * sc;
        }
    }
    __syncthreads();
    if (ks != 0) return; /* the first warp of each row group sums its group's partials */
    if (!geglu) {
        for (int t = lane; t < R * M; t += 32) {
            const int r = t / M, i = t % M;
            float v = 0.f;
            for (int j = 0; j < KS; j++) v += red[warp + j][r][i];
            if (n0 + r < w.n && i < m) y[(size_t)i * ldy + n0 + r] = v;
        }
    } else {
        for (int t = lane; t < (R / 2) * M; t += 32) {
            const int p = t / M, i = t % M, r = 2 * p;
            float g = 0.f, u = 0.f;
            for (int j = 0; j < KS; j++) g += red[warp + j][r][i], u += red[warp + j][r + 1][i];
            if (n0 + r + 1 < w.n && i < m) y[(size_t)i * ldy + (n0 + r) / 2] = gelu_tanh(g) * u;
        }
    }
}

/* ---- dispatch --------------------------------------------------------------------------------------------------- */
int g3c_qgemv_supported(const g3_dmat *w, int m) {
    if (m < 1 || m > 8 || w->k % 32 || w->g < 1 || w->k % w->g) return 0;
    if (w->qt == G3Q_INT8) return w->g == w->k || (w->g % 16 == 0 && log2_exact(w->g / 16) >= 0);
    if (w->qt == G3Q_INT4) return w->g % 32 == 0 && log2_exact(w->g / 32) >= 0;
    /* fp8 per channel: the persistent kernel only (float16 products, qgemv_common.cuh), 1-2 rows */
    if (w->qt == G3Q_FP8) return m <= 2 && w->g == w->k && g3c_qgemvp_enabled() && g3c_qgemvp_fits(m, w->k);
    return 0;
}

size_t g3c_qgemv_q8_bytes(int m, int k) { return (size_t)2 * m * k + (size_t)m * (k / 32) * sizeof(float2); }

template <int QT, int M, bool PC, bool HL>
static cudaError_t launch(const g3_dmat *w, const int8_t *xq, const int8_t *xl, const float2 *xd, int m, float *y,
                          int ldy, int geglu, cudaStream_t st) {
    constexpr int R = M <= 2 ? 2 : 4, U = M == 1 ? 3 : M == 2 ? 2 : 1;
    const int V = QT == G3Q_INT4 ? 32 : 16, nch = w->k / V;
    const int KS = nch >= 512 ? 4 : nch >= 192 ? 2 : 1, rows_blk = (4 / KS) * R;
    const int gsh = PC ? 0 : log2_exact(w->g / V);
    return g3c_launch(k_qgemv<QT, M, R, U, PC, HL>, dim3((w->n + rows_blk - 1) / rows_blk), dim3(128), 0, st, *w, xq,
                      xl, xd, m, y, ldy, geglu, KS, gsh);
}

template <int QT, bool PC, bool HL>
static cudaError_t launch_m(const g3_dmat *w, const int8_t *xq, const int8_t *xl, const float2 *xd, int m, float *y,
                            int ldy, int geglu, cudaStream_t st) {
    if (m <= 1) return launch<QT, 1, PC, HL>(w, xq, xl, xd, m, y, ldy, geglu, st);
    if (m <= 2) return launch<QT, 2, PC, HL>(w, xq, xl, xd, m, y, ldy, geglu, st);
    if (m <= 4) return launch<QT, 4, PC, HL>(w, xq, xl, xd, m, y, ldy, geglu, st);
    return launch<QT, 8, PC, HL>(w, xq, xl, xd, m, y, ldy, geglu, st);
}

template <bool HL>
static cudaError_t launch_q(const g3_dmat *w, const int8_t *xq, const int8_t *xl, const float2 *xd, int m, float *y,
                            int ldy, int geglu, cudaStream_t st) {
    if (w->qt == G3Q_INT4) return launch_m<G3Q_INT4, false, HL>(w, xq, xl, xd, m, y, ldy, geglu, st);
    if (w->g == w->k) return launch_m<G3Q_INT8, true, HL>(w, xq, xl, xd, m, y, ldy, geglu, st);
    return launch_m<G3Q_INT8, false, HL>(w, xq, xl, xd, m, y, ldy, geglu, st);
}

cudaError_t g3c_qgemv(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu, void *q8,
                      size_t q8_bytes, cudaStream_t st) {
    if (!g3c_qgemv_supported(w, m) || ldx % 4) return cudaErrorInvalidValue;
    if (g3c_qgemvp_usable(w, m, geglu)) return g3c_qgemvp(w, x, ldx, m, y, ldy, geglu, st);
    if (w->qt == G3Q_FP8) return cudaErrorNotSupported; /* no two-launch form (odd n with GeGLU) */
    const size_t need = g3c_qgemv_q8_bytes(m, w->k);
    void *tmp = NULL;
    if (!q8 || q8_bytes < need) { /* test hooks: a stream-ordered scratch (the backend passes its own buffer) */
        cudaError_t e = cudaMallocAsync(&tmp, need, st);
        if (e != cudaSuccess) return e;
        q8 = tmp;
    }
    /* [m][k] q, [m][k] q_lo, [m][k/32] (d, sum): offsets are multiples of 32 bytes */
    int8_t *xq = (int8_t *)q8, *xl = xq + (size_t)m * w->k;
    float2 *xd = (float2 *)(xl + (size_t)m * w->k);
    const int il = w->qt == G3Q_INT4, hl = m <= lo_rows(w);
    const long long thr = (long long)m * (w->k / 8);
    cudaError_t e = g3c_launch(k_q8, dim3((unsigned)((thr + 127) / 128)), dim3(128), 0, st, x, ldx, m, w->k, xq, xl,
                               xd, il, hl);
    if (e == cudaSuccess) {
        e = hl ? launch_q<true>(w, xq, xl, xd, m, y, ldy, geglu, st)
               : launch_q<false>(w, xq, xl, xd, m, y, ldy, geglu, st);
    }
    if (tmp) {
        cudaError_t e2 = cudaFreeAsync(tmp, st);
        if (e == cudaSuccess) e = e2;
    }
    return e == cudaSuccess ? cudaGetLastError() : e;
}
