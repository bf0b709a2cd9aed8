/* Matrix-vector products on CUDA cores (m <= 8 activation rows, float32) against resident weights in bf16, int8,
 * int4 or fp8: the weights are streamed once from device memory with 16-byte loads, decoded in registers and
 * multiplied with float32 activations, accumulating in float32. Exact for every format; since the tensor-core
 * kernels (tc_gemv.cu) it serves the GGUF formats with scale groups of 16/32 values at m <= 8, and everything with
 * $G3_CUDA_TC=0.
 *
 * Work split: a block of 4 warps; KS of them (1, 2 or 4, by row length) form a row group that owns R consecutive
 * output rows and takes interleaved 16-byte chunks of each row (lane l of warp j of the group reads chunk
 * l + 32*j + 32*KS*i); the group's partial sums are combined in shared memory.
 * bf16 weights ($G3_CUDA_GEMVPF, see gemv_mode): k_gemv (the default at one row) loads its first chunk of each row
 * before the programmatic-dependent-launch wait ($G3_CUDA_GEMVPRE, see gemv_pre); k_gemv_pf keeps the next step's
 * weight loads in flight during the current step's math and issues the first step before the wait (default from 2
 * rows); k_gemv_p is a persistent variant (one block per SM, equal step ranges per warp). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"

template <int QT> struct qtraits;
template <> struct qtraits<G3Q_BF16> { static constexpr int C = 8; };  /* values per 16-byte chunk */
template <> struct qtraits<G3Q_INT8> { static constexpr int C = 16; };
template <> struct qtraits<G3Q_FP8> { static constexpr int C = 16; };
template <> struct qtraits<G3Q_INT4> { static constexpr int C = 32; };

__device__ __forceinline__ float magic_byte(uint32_t w, int b) { /* 2^23 + byte b of w, as float */
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + b));
}

/* 8 consecutive weights (sub-chunk j of a 16-byte chunk) as floats, before scaling. */
template <int QT> __device__ __forceinline__ void decode8(const uint4 &v, int j, float f[8]) {
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    if constexpr (QT == G3Q_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(wd[i] << 16), f[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
    } else if constexpr (QT == G3Q_INT8) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t u = wd[2 * j + h] ^ 0x80808080u;
#pragma unroll
            for (int b = 0; b < 4; b++) f[4 * h + b] = magic_byte(u, b) - 8388736.f;
        }
    } else if constexpr (QT == G3Q_FP8) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t u = wd[2 * j + h];
#pragma unroll
            for (int p = 0; p < 2; p++) {
                __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> (16 * p)), __NV_E4M3);
                float2 ff = __half22float2(*(__half2 *)&hr);
                f[4 * h + 2 * p] = ff.x, f[4 * h + 2 * p + 1] = ff.y;
            }
        }
    } else { /* int4: word j holds values 8j..8j+7, byte b = (2b lo, 2b+1 hi) */
        uint32_t t = wd[j] & 0x0F0F0F0Fu, u = (wd[j] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int b = 0; b < 4; b++) f[2 * b] = magic_byte(t, b) - 8388608.f, f[2 * b + 1] = magic_byte(u, b) - 8388608.f;
    }
}

/* Sums each row group's partials (lanes, then the KS warps through shared memory) and writes y (or GeGLU). */
template <int R, int M>
__device__ __forceinline__ void finish(const float (&acc)[R][M], int lane, int warp, int ks, int KS, int n0, int n, int m,
                                       float *__restrict__ y, int ldy, int geglu) {
    __shared__ float red[4][R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) {
            float v = acc[r][i];
#pragma unroll
            for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][r][i] = v;
        }
    __syncthreads();
    if (ks != 0) return; /* the first warp of each row group sums its group's partials */
    if (!geglu) {
        for (int t = lane; t < R * M; t += 32) {
            int r = t / M, i = t % M;
            float v = 0.f;
            for (int j = 0; j < KS; j++) v += red[warp + j][r][i];
            if (n0 + r < n && i < m) y[(size_t)i * ldy + n0 + r] = v;
        }
    } else {
        for (int t = lane; t < (R / 2) * M; t += 32) {
            int p = t / M, i = t % M, r = 2 * p;
            float g = 0.f, u = 0.f;
            for (int j = 0; j < KS; j++) g += red[warp + j][r][i], u += red[warp + j][r + 1][i];
            if (n0 + r + 1 < n && i < m) y[(size_t)i * ldy + (n0 + r) / 2] = gelu_tanh(g) * u;
        }
    }
}

/* PRE (0..2): the first PRE chunks of each lane's rows are loaded before the programmatic-dependent-launch wait
 * ($G3_CUDA_GEMVPRE): the first wave's weights are in flight while the kernel before finishes, and every later block
 * starts with one more chunk per row in flight (see gemv_pre for what that measured). */
template <int QT, int M, int R, int PRE>
__global__ void __launch_bounds__(128) k_gemv(g3_dmat w, const float *__restrict__ x, int ldx, int m,
                                              float *__restrict__ y, int ldy, int geglu, int KS) {
    constexpr int C = qtraits<QT>::C;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = warp / KS, ks = warp % KS;
    const int n0 = (blockIdx.x * (4 / KS) + grp) * R, K = w.k, nch = K / C, cstep = 32 * KS;
    const size_t row_bytes = QT == G3Q_BF16 ? (size_t)K * 2 : QT == G3Q_INT4 ? (size_t)K / 2 : (size_t)K;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int nr = min(n0 + r, w.n - 1);
        wr[r] = (const uint4 *)((const uint8_t *)w.q + (size_t)nr * row_bytes);
    }
    const int c0 = lane + 32 * ks;
    uint4 pre[PRE > 0 ? PRE : 1][R];
#pragma unroll
    for (int u = 0; u < PRE; u++)
#pragma unroll
        for (int r = 0; r < R; r++) pre[u][r] = c0 + u * cstep < nch ? __ldg(wr[r] + c0 + u * cstep) : make_uint4(0, 0, 0, 0);
    g3c_pdl_wait();
    const float *xr[M];
#pragma unroll
    for (int i = 0; i < M; i++) xr[i] = x + (size_t)min(i, m - 1) * ldx;
    const int ngr = K / w.g;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) acc[r][i] = 0.f;

    auto chunk = [&](int c, const uint4 (&wv)[R]) {
        float part[R][M], sx[M];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int i = 0; i < M; i++) part[r][i] = 0.f;
#pragma unroll
        for (int i = 0; i < M; i++) sx[i] = 0.f;
#pragma unroll
        for (int j = 0; j < C / 8; j++) {
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) decode8<QT>(wv[r], j, wf[r]);
#pragma unroll
            for (int i = 0; i < M; i++) {
                const float4 *xp = (const float4 *)(xr[i] + (size_t)c * C + 8 * j);
                float4 a = xp[0], b = xp[1];
                float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                if constexpr (QT == G3Q_INT4) sx[i] += ((xv[0] + xv[1]) + (xv[2] + xv[3])) + ((xv[4] + xv[5]) + (xv[6] + xv[7]));
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = part[r][i];
#pragma unroll
                    for (int e = 0; e < 8; e++) s = fmaf(wf[r][e], xv[e], s);
                    part[r][i] = s;
                }
            }
        }
        if constexpr (QT == G3Q_BF16) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int i = 0; i < M; i++) acc[r][i] += part[r][i];
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                size_t gi = (size_t)min(n0 + r, w.n - 1) * ngr + (size_t)c * C / w.g;
                float s = __ldg(w.s + gi), z = QT == G3Q_INT4 ? __ldg(w.z + gi) : 0.f;
#pragma unroll
                for (int i = 0; i < M; i++) {
                    acc[r][i] = fmaf(s, part[r][i], acc[r][i]);
                    if constexpr (QT == G3Q_INT4) acc[r][i] = fmaf(z, sx[i], acc[r][i]);
                }
            }
        }
    };
    int c = c0;
#pragma unroll
    for (int u = 0; u < PRE; u++, c += cstep)
        if (c < nch) chunk(c, pre[u]);
#pragma unroll 2
    for (; c < nch; c += cstep) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; r++) wv[r] = __ldg(wr[r] + c);
        chunk(c, wv);
    }
    finish<R, M>(acc, lane, warp, ks, KS, n0, w.n, m, y, ldy, geglu);
}

/* bf16 weights, pipelined ($G3_CUDA_GEMVPF=1): U chunks per row per step, the next step's weights loaded (no L1
 * allocation) before this step's math, the first step's before the programmatic-dependent-launch wait. Same work
 * split, arithmetic order within a chunk and epilogue as k_gemv. */
template <int M, int R, int U>
__global__ void __launch_bounds__(128) k_gemv_pf(g3_dmat w, const float *__restrict__ x, int ldx, int m,
                                                 float *__restrict__ y, int ldy, int geglu, int KS) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = warp / KS, ks = warp % KS;
    const int n0 = (blockIdx.x * (4 / KS) + grp) * R, K = w.k, nch = K / 8, step = 32 * KS;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = (const uint4 *)((const __nv_bfloat16 *)w.q + (size_t)min(n0 + r, w.n - 1) * K);
    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    int c = lane + 32 * ks;
    uint4 wa[U][R];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) wa[u][r] = c + u * step < nch ? g3c_ld_stream(wr[r] + c + u * step) : zero4;
    g3c_pdl_wait();
    const float *xr[M];
#pragma unroll
    for (int i = 0; i < M; i++) xr[i] = x + (size_t)min(i, m - 1) * ldx;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) acc[r][i] = 0.f;
    for (; c < nch; c += U * step) {
        uint4 wb[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int cc = c + (U + u) * step;
                wb[u][r] = cc < nch ? g3c_ld_stream(wr[r] + cc) : zero4;
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = c + u * step;
            if (cc >= nch) break;
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) decode8<G3Q_BF16>(wa[u][r], 0, wf[r]);
#pragma unroll
            for (int i = 0; i < M; i++) {
                const float4 *xp = (const float4 *)(xr[i] + (size_t)cc * 8);
                float4 a = xp[0], b = xp[1];
                float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = 0.f;
#pragma unroll
                    for (int e = 0; e < 8; e++) s = fmaf(wf[r][e], xv[e], s);
                    acc[r][i] += s;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) wa[u][r] = wb[u][r];
    }
    finish<R, M>(acc, lane, warp, ks, KS, n0, w.n, m, y, ldy, geglu);
}

/* bf16 weights, persistent ($G3_CUDA_GEMVPF=2): one block of GP_T threads per SM, each warp walks its row groups of
 * R rows (2; 4 from 4 activation rows; group g = warp id + total warps * j), whole rows per warp, U chunks per row
 * and lane per step, with the next step's weights always in flight, across row-group boundaries too, so that the
 * small matrices (qkv, o) end in one short tail instead of block waves; the first step is loaded before the
 * programmatic-dependent-launch wait. Same arithmetic order within a chunk as k_gemv. */
#define GP_T 512
template <int M, int R, int U>
__global__ void __launch_bounds__(GP_T, 1) k_gemv_p(g3_dmat w, const float *__restrict__ x, int ldx, int m,
                                                   float *__restrict__ y, int ldy, int geglu, int sk) {
    constexpr int NW = GP_T / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, K = w.k, nch = K / 8;
    const int nrg = (w.n + R - 1) / R, spr = (nch + 32 * U - 1) / (32 * U), tw = gridDim.x * NW;
    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    auto load = [&](bool any, int rg, int s, uint4 (&wv)[U][R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 *wr = (const uint4 *)((const __nv_bfloat16 *)w.q + (size_t)min(rg * R + r, w.n - 1) * K);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int cc = s * 32 * U + 32 * u + lane;
                wv[u][r] = any && cc < nch ? g3c_ld_stream(wr + cc) : zero4;
            }
        }
    };
    int rg, s, left; /* the warp's steps (g3c_warp_steps) */
    g3c_warp_steps(blockIdx.x * NW + warp, tw, nrg, spr, sk, rg, s, left);
    auto more = [&](int g, int l) { return sk ? l > 0 : g < nrg; };
    uint4 wa[U][R];
    load(more(rg, left), rg, s, wa);
    g3c_pdl_wait();
    const float *xr[M];
#pragma unroll
    for (int i = 0; i < M; i++) xr[i] = x + (size_t)min(i, m - 1) * ldx;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < M; i++) acc[r][i] = 0.f;
    while (more(rg, left)) { /* warp-uniform */
        const int rn = s + 1 == spr ? rg + (sk ? 1 : tw) : rg, sn = s + 1 == spr ? 0 : s + 1;
        uint4 wb[U][R];
        load(more(rn, left - 1), rn, sn, wb);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = s * 32 * U + 32 * u + lane;
            if (cc >= nch) break;
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) decode8<G3Q_BF16>(wa[u][r], 0, wf[r]);
#pragma unroll
            for (int i = 0; i < M; i++) {
                const float4 *xp = (const float4 *)(xr[i] + (size_t)cc * 8);
                float4 a = __ldg(xp), b = __ldg(xp + 1);
                float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float t = 0.f;
#pragma unroll
                    for (int e = 0; e < 8; e++) t = fmaf(wf[r][e], xv[e], t);
                    acc[r][i] += t;
                }
            }
        }
        if (s + 1 == spr || (sk && left == 1)) { /* row group (or the range) done: warp sums, outputs */
            float one[R];
#pragma unroll
            for (int r = 0; r < R; r++) one[r] = 1.f;
            g3c_rowgroup_out<R, M>(acc, one, lane, m, rg * R, w.n, sk, geglu, y, ldy);
        }
        rg = rn, s = sn, left--;
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) wa[u][r] = wb[u][r];
    }
}

static int gp_n_sm(void) {
    static int n = 0;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n = 0;
    }
    return n;
}

/* $G3_CUDA_GEMVPF for bf16 weights: 0 k_gemv, 1 k_gemv_pf, 2 k_gemv_p (persistent). Default, measured on the H200
 * (27B, tok/s): k_gemv at one row (69.8 against 66.9 pipelined and 67.5 persistent), the pipelined kernel from 2
 * rows (8 rows: 327 aggregate against 282 and 307; since session 10, 5..8 rows go to the tensor cores, matmul.cu).
 * Session 10 run 07, with k_gemv's first chunk before the wait (gemv_pre): k_gemv at 2 rows too (27B 135 / 134
 * against 124 / 123 aggregate, 4B 779 against 648), the pipelined kernel at 3..4 (27B 171 / 225 against 159 / 210).
 * Also measured slower at one row: k_gemv forced to 16 blocks per SM (32 registers, spills: 59.2), k_gemv with its
 * first chunks prefetched into L2 before the wait (68.1). */
static int gemv_mode(int m) {
    const char *e = getenv("G3_CUDA_GEMVPF");
    if (!e || !*e) return m <= 2 ? 0 : 1;
    const int v = atoi(e);
    return v < 0 || v > 2 ? 0 : v;
}

/* $G3_CUDA_GEMVPRE = 0 | 1 | 2: k_gemv's first 0, 1 (default) or 2 chunks per lane and row loaded before the launch
 * wait; read at every call (launches are captured once). Measured on the H200 (27B bf16, batch-1 decode, argmax on
 * the GPU; session 10): 72.8 tok/s with 1 against 70.3 with 0 (run 01; 69.7 with 2 and the kernels before letting
 * it launch early), 70.7 / 70.6 against 68.8 / 69.0 on a second machine (run 02); 4B 381 against 361, 1B 796 against
 * 722. CUPTI per layer (27B, run 02): gate/up 109.0 -> 104.9 us, down 57.3 -> 55.0, qkv 23.8 -> 22.7, o 13.1 -> 12.3
 * (the big products gain most, so it is not only the first wave's head start). Also measured (run 03, 72.0 / 71.5
 * with 1 against 69.5 / 69.7 with 0): unroll 4 instead of 2 the same (72.0 / 72.1); one row per row group (R = 1,
 * twice the blocks, 16 per SM) slower (69.6 / 69.6; 4B 366 against 381); run 04: every chunk of the row before
 * the wait where a lane has at most 6 (72 registers) slower (70.1 / 70.1 against 71.4 / 71.3). PRE = 2 takes 48
 * registers against 40 (10 blocks per SM instead of 12). */
static int gemv_pre(void) {
    const char *e = getenv("G3_CUDA_GEMVPRE");
    const int v = e && *e ? atoi(e) : 1;
    return v < 0 || v > 2 ? 1 : v;
}

template <int QT, int M> static cudaError_t launch(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy,
                                            int geglu, cudaStream_t st) {
    constexpr int R = M <= 2 ? 2 : 4;
    /* warps per row group: enough chunks per lane for long rows, whole warps per row group for short ones */
    const int nch = w->k / qtraits<QT>::C, KS = nch >= 512 ? 4 : nch >= 192 ? 2 : 1, rows_blk = (4 / KS) * R;
    if constexpr (QT == G3Q_BF16) {
        const int mode = gemv_mode(M);
        if (mode == 2 && gp_n_sm() > 0 && (!geglu || w->n % 2 == 0)) {
            const int nrg = (w->n + R - 1) / R, need = (nrg + GP_T / 32 - 1) / (GP_T / 32), nsm = gp_n_sm();
            return g3c_launch(k_gemv_p<M, R, M == 1 ? 4 : M == 2 ? 3 : 1>, dim3(need < nsm ? need : nsm), dim3(GP_T), 0,
                              st, *w, x, ldx, m, y, ldy, geglu, geglu ? 0 : 1);
        }
        if (mode == 1)
            return g3c_launch(k_gemv_pf<M, R, M <= 2 ? 3 : 1>, dim3((w->n + rows_blk - 1) / rows_blk), dim3(128), 0, st,
                              *w, x, ldx, m, y, ldy, geglu, KS);
    }
    const dim3 grid((w->n + rows_blk - 1) / rows_blk);
    if constexpr (QT == G3Q_BF16) { /* the quantized formats keep PRE = 0 (their decode kernels are elsewhere) */
        const int pre = gemv_pre();
        if (pre == 1) return g3c_launch(k_gemv<QT, M, R, 1>, grid, dim3(128), 0, st, *w, x, ldx, m, y, ldy, geglu, KS);
        if (pre == 2) return g3c_launch(k_gemv<QT, M, R, 2>, grid, dim3(128), 0, st, *w, x, ldx, m, y, ldy, geglu, KS);
    }
    return g3c_launch(k_gemv<QT, M, R, 0>, grid, dim3(128), 0, st, *w, x, ldx, m, y, ldy, geglu, KS);
}

template <int QT> static cudaError_t launch_m(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy,
                                              int geglu, cudaStream_t st) {
    if (m <= 1) return launch<QT, 1>(w, x, ldx, m, y, ldy, geglu, st);
    if (m <= 2) return launch<QT, 2>(w, x, ldx, m, y, ldy, geglu, st);
    if (m <= 4) return launch<QT, 4>(w, x, ldx, m, y, ldy, geglu, st);
    return launch<QT, 8>(w, x, ldx, m, y, ldy, geglu, st);
}

cudaError_t g3c_gemv(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu, cudaStream_t st) {
    for (int i0 = 0; i0 < m; i0 += 8) {
        int mm = m - i0 < 8 ? m - i0 : 8;
        const float *xi = x + (size_t)i0 * ldx;
        float *yi = y + (size_t)i0 * ldy;
        cudaError_t e;
        switch (w->qt) {
        case G3Q_BF16: e = launch_m<G3Q_BF16>(w, xi, ldx, mm, yi, ldy, geglu, st); break;
        case G3Q_INT8: e = launch_m<G3Q_INT8>(w, xi, ldx, mm, yi, ldy, geglu, st); break;
        case G3Q_INT4: e = launch_m<G3Q_INT4>(w, xi, ldx, mm, yi, ldy, geglu, st); break;
        case G3Q_FP8: e = launch_m<G3Q_FP8>(w, xi, ldx, mm, yi, ldy, geglu, st); break;
        default: return cudaErrorInvalidValue;
        }
        if (e != cudaSuccess) return e;
    }
    return cudaGetLastError();
}
