/* Prefill attention and the many-row QK-norm: the flash-attention kernel for runs of rows of one sequence (a
 * prefill chunk), its row plan, the QK-norm + RoPE + cache write for many rows, and their test hooks.
 *
 * Plan (once per forward, rows in device memory): batch rows are cut into tiles of TQ = 64 / G consecutive rows
 * (G = query heads per kv head). A row goes to the flash kernel when its sequence has at least max(2, TQ/4) rows in
 * its tile; fa_useq[r] is then -1, else useq[r]. The decode kernel (attention.cu) runs first with fa_useq as the
 * rows' sequences, so it does the other rows and writes zeros for the flash rows, which the flash kernel then
 * overwrites. Correct for any batch (decode rows of other sequences, several chunks, padding rows).
 *
 * Flash kernel: a block per (pair of query tiles, kv head), 256 threads. A query tile is 64 query vectors (TQ rows x
 * the G heads of the kv head), Q [64][D] in shared memory; for each sequence with flash rows in the tile, key tiles
 * of 64 keys over the union of the rows' key ranges are read once from the paged float32 cache into shared memory
 * (K, V [64][D]); each thread holds a 4 x 4 block of scores (rows ty + 16a, keys tx + 16b) and 4 rows x D/16 columns
 * of the output; float32 online softmax with the decode kernel's masks (causal, sliding window kind 1, missing
 * blocks) and softcap. Pairs (tile n-1-b, tile b) even out the causal work. Q and K rows are stored with their
 * 16-byte chunks XOR-swizzled by row & 7 (conflict-free reads); P reuses the K buffer.
 * $G3_CUDA_FA = 0: never; 1: whenever a batch has such a run; default: also when the grid fills half the SMs.
 * Where D % 4 == 0, D <= 128 and the cache is float32, the same kernel on tensor cores runs instead (attention_tc.cu:
 * 3xBF16 with 8 warps by default; $G3_CUDA_FATC=0 keeps this one, 1 / 2 3xTF32, 3 3xBF16 with 4 warps). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "backend/cuda/prefill_api.h"
}

#define FA_QR 64  /* query vectors per tile */
#define FA_TK 64  /* keys per key tile */
#define FA_PST 80 /* row stride of P in shared memory (floats): rows ty and ty+1 land 16 banks apart */

static __host__ __device__ __forceinline__ int fa_thr(int tq) { return tq / 4 > 2 ? tq / 4 : 2; }

/* ---- plan -------------------------------------------------------------------------------------------------- */
__global__ void k_fa_plan(const int32_t *useq, int m, int tq, int32_t *fa_useq) {
    g3c_pdl_wait();
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    const int u = useq[r], t0 = r / tq * tq, t1 = min(m, t0 + tq);
    int n = 0;
    for (int t = t0; t < t1; t++) n += useq[t] == u;
    fa_useq[r] = u >= 0 && n >= fa_thr(tq) ? -1 : u;
}

/* ---- QK-norm + RoPE + cache write, many rows ---------------------------------------------------------------- */
/* A warp per (row, head) of q, k or v, 8 per block; every slice of the head is loaded before any is zeroed. T: pairs
 * (i, i + D/2) per lane, i = lane + 32t. Same arithmetic as k_qkv_post (attention.cu). What does not depend on the
 * kernel before (the row's position, sequence and cache slot: uploaded before the step; the norm weights and the
 * rotation's cosines and sines) is read and computed before the programmatic-dependent-launch wait, so that after it
 * only the loads of y stand between the product and the writes (they were three dependent round trips after it). */
template <int T, typename KT>
__global__ void __launch_bounds__(256) k_qkv_rows(g3c_attn_args a, float *y, int ny, const float *qn,
                                                  const float *kn, float *qout, int flags) {
    const int lane = threadIdx.x & 31, D = a.D, half = D / 2, NHT = a.NH + 2 * a.NKV;
    const int unit = blockIdx.x * 8 + (threadIdx.x >> 5);
    const bool live = unit < a.m * NHT;
    const int r = live ? unit / NHT : 0, hh = unit - r * NHT;
    const int u = live ? a.rows.useq[r] : -1, p = live ? a.rows.pos[r] : 0;
    const bool isv = hh >= a.NH + a.NKV;
    float *dst = NULL;
    KT *kd = NULL; /* the cache row (k, v) */
    bool put = hh < a.NH; /* q: always written; k / v: where the row has a cache slot */
    if (live && hh >= a.NH && u >= 0) {
        const int h = hh - a.NH - isv * a.NKV;
        const int blk = a.rows.bt[((size_t)u * 2 + a.kind) * a.rows.mbps + p / a.kv_block];
        if (blk >= 0) {
            const size_t off = (((size_t)blk * a.n_layers_kind + a.layer_in_kind) * 2 + isv) * a.NKV;
            kd = (KT *)a.pool + ((off + h) * a.kv_block + p % a.kv_block) * D;
            put = true;
        }
    } else if (live && hh < a.NH) {
        dst = qout + (size_t)r * a.NH * D + (size_t)hh * D;
    }
    float w0[T], w1[T], cs[T], sn[T]; /* q / k: norm weights and rotation of pair t */
    const float *nw = hh < a.NH ? qn : kn;
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        w0[t] = w1[t] = cs[t] = sn[t] = 0.f;
        if (live && put && !isv && i < half) {
            w0[t] = nw[i], w1[t] = nw[i + half];
            const float ang = (float)p * a.inv_freq[i];
            cs[t] = cosf(ang), sn[t] = sinf(ang);
        }
    }
    g3c_pdl_wait();
    if (!live) return;
    const int np = g3c_qkv_slices(a, ny, hh); /* <= 2 */
    float *y0 = y + g3c_qkv_at(a, ny, 0, r, hh), *y1 = np > 1 ? y + g3c_qkv_at(a, ny, 1, r, hh) : NULL;
    float v0[T], v1[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        v0[t] = v1[t] = 0.f;
        if (i < half) {
            v0[t] = y0[i], v1[t] = y0[i + half];
            if (y1) v0[t] += y1[i], v1[t] += y1[i + half];
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        if (i < half && !(flags & G3C_KEEP_Y)) {
            y0[i] = 0.f, y0[i + half] = 0.f;
            if (y1) y1[i] = 0.f, y1[i + half] = 0.f;
        }
    }
    if (!put) return; /* k / v of a padding row, or of a row without a cache slot */
    if (isv) {
#pragma unroll
        for (int t = 0; t < T; t++) {
            const int i = lane + 32 * t;
            if (i < half) g3c_kv_put(kd + i, v0[t]), g3c_kv_put(kd + i + half, v1[t]);
        }
        return;
    }
    float ss = 0.f;
#pragma unroll
    for (int t = 0; t < T; t++) ss += v0[t] * v0[t] + v1[t] * v1[t];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(ss / (float)D + a.eps);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        if (i < half) {
            const float x0 = v0[t] * inv * w0[t], x1 = v1[t] * inv * w1[t];
            const float r0 = x0 * cs[t] - x1 * sn[t], r1 = x1 * cs[t] + x0 * sn[t];
            if (kd) g3c_kv_put(kd + i, r0), g3c_kv_put(kd + i + half, r1);
            else dst[i] = r0, dst[i + half] = r1;
        }
    }
}

cudaError_t g3c_qkv_post_rows(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn,
                              float *qout, cudaStream_t st) {
    return g3c_qkv_post_rows_f(a, y, ny, qn, kn, qout, 0, st);
}
cudaError_t g3c_qkv_post_rows_f(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn,
                                float *qout, int flags, cudaStream_t st) {
    if (a->m < G3C_ROWK_MIN || ny > 2 || a->nyv > 2 || !g3c_rowk_enabled())
        return g3c_qkv_post(a, y, ny, qn, kn, qout, st);
    if (a->D > 256 || a->D % 2) return cudaErrorInvalidValue;
    const int units = a->m * (a->NH + 2 * a->NKV), half = a->D / 2;
    dim3 grid((units + 7) / 8), blk(256);
    if (a->kv16) {
        if (half <= 32) return g3c_launch(k_qkv_rows<1, __nv_bfloat16>, grid, blk, 0, st, *a, y, ny, qn, kn, qout, flags);
        if (half <= 64) return g3c_launch(k_qkv_rows<2, __nv_bfloat16>, grid, blk, 0, st, *a, y, ny, qn, kn, qout, flags);
        return g3c_launch(k_qkv_rows<4, __nv_bfloat16>, grid, blk, 0, st, *a, y, ny, qn, kn, qout, flags);
    }
    if (half <= 32) return g3c_launch(k_qkv_rows<1, float>, grid, blk, 0, st, *a, y, ny, qn, kn, qout, flags);
    if (half <= 64) return g3c_launch(k_qkv_rows<2, float>, grid, blk, 0, st, *a, y, ny, qn, kn, qout, flags);
    return g3c_launch(k_qkv_rows<4, float>, grid, blk, 0, st, *a, y, ny, qn, kn, qout, flags);
}

/* ---- flash attention -------------------------------------------------------------------------------------- */
/* Shared memory (floats): Q [FA_QR][DP] swizzled, KP: K [FA_TK][DP] swizzled, then P [FA_QR][FA_PST], V [FA_TK][DP];
 * then per-key source rows and per-tile-row sequence / position / window start. */
static __host__ __device__ constexpr int fa_kp_floats(int dp) {
    return FA_TK * dp > FA_QR * FA_PST ? FA_TK * dp : FA_QR * FA_PST;
}
static size_t fa_smem(int dp) {
    return sizeof(float) * ((size_t)FA_QR * dp + fa_kp_floats(dp) + (size_t)FA_TK * dp) +
           sizeof(const float *) * 2 * FA_TK + sizeof(int) * 3 * FA_QR;
}

/* DP: D rounded up to 32, 64, 128 or 256 (padding columns hold zeros). Columns per thread: NC chunks of VW. */
template <int DP, typename KT>
__global__ void __launch_bounds__(256, 1) k_fa(g3c_attn_args a, const float *__restrict__ q,
                                            const int32_t *__restrict__ fa_useq, float *__restrict__ o,
                                            __nv_bfloat16 *__restrict__ oh, int split) {
    constexpr int C4 = DP / 4;                  /* 16-byte chunks per row */
    constexpr int VW = DP >= 64 ? 4 : DP / 16;  /* output columns per chunk of a thread */
    constexpr int NC = DP / (16 * VW);          /* chunks per thread */
    extern __shared__ __align__(16) float fsm[];
    float *Qs = fsm, *KPs = Qs + FA_QR * DP, *Vs = KPs + fa_kp_floats(DP);
    const KT **kptr = (const KT **)(Vs + FA_TK * DP), **vptr = kptr + FA_TK;
    int *su = (int *)(vptr + FA_TK), *sp = su + FA_QR, *slo = sp + FA_QR;
    g3c_pdl_wait();
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int D = a.D, G = a.NH / a.NKV, TQ = FA_QR / G, kh = blockIdx.y;
    const int n_tiles = (a.m + TQ - 1) / TQ;
    const float4 *Q4 = (const float4 *)Qs, *K4 = (const float4 *)KPs;
    for (int pass_t = 0; pass_t < 2; pass_t++) {
        const int tile = pass_t == 0 ? n_tiles - 1 - (int)blockIdx.x : (int)blockIdx.x;
        if (pass_t == 1 && tile >= n_tiles - 1 - (int)blockIdx.x) break; /* the middle tile once */
        if (tile < 0) break;
        const int r0 = tile * TQ;
        __syncthreads(); /* shared memory of the previous tile is no longer read */
        if (tid < TQ) {
            const int r = r0 + tid;
            int u = -1, p = -1, lo = 0;
            if (r < a.m) {
                const int uu = a.rows.useq[r];
                if (uu >= 0 && fa_useq[r] < 0) {
                    u = uu, p = a.rows.pos[r];
                    lo = a.kind == 1 ? max(0, p - a.window + 1) : 0;
                }
            }
            su[tid] = u, sp[tid] = p, slo[tid] = lo;
        }
        __syncthreads();
        int any = 0;
        for (int t = 0; t < TQ; t++) any |= su[t] >= 0;
        if (!any) continue; /* uniform */
        /* Q tile: query vector qi = t * G + g (row r0 + t, head kh * G + g) */
        for (int e = tid; e < FA_QR * C4; e += 256) {
            const int qi = e / C4, c = e - qi * C4, t = qi / G, g = qi - t * G, r = r0 + t;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < a.m && su[t] >= 0) {
                const float *src = q + (size_t)r * a.NH * D + (size_t)(kh * G + g) * D;
                if (D % 4 == 0) {
                    if (4 * c < D) v = *(const float4 *)(src + 4 * c);
                } else {
                    float w[4];
                    for (int k = 0; k < 4; k++) w[k] = 4 * c + k < D ? src[4 * c + k] : 0.f;
                    v = make_float4(w[0], w[1], w[2], w[3]);
                }
            }
            ((float4 *)Qs)[qi * C4 + (c ^ (qi & 7))] = v;
        }
        /* one pass per sequence with flash rows in this tile (in order of first row) */
        for (int t0 = 0; t0 < TQ; t0++) {
            const int u = su[t0];
            if (u < 0) continue;
            int seen = 0;
            for (int t = 0; t < t0; t++) seen |= su[t] == u;
            if (seen) continue;
            int klo = 0x7fffffff, khi = -1;
            for (int t = 0; t < TQ; t++)
                if (su[t] == u) klo = min(klo, slo[t]), khi = max(khi, sp[t]);
            int pr[4], lr[4];
#pragma unroll
            for (int aa = 0; aa < 4; aa++) {
                const int t = (ty + 16 * aa) / G;
                const bool act = su[t] == u;
                pr[aa] = act ? sp[t] : -1, lr[aa] = act ? slo[t] : 0x7fffffff;
            }
            float mrow[4], lrow[4], acc[4][NC][VW];
#pragma unroll
            for (int aa = 0; aa < 4; aa++) {
                mrow[aa] = -INFINITY, lrow[aa] = 0.f;
#pragma unroll
                for (int c = 0; c < NC; c++)
#pragma unroll
                    for (int v = 0; v < VW; v++) acc[aa][c][v] = 0.f;
            }
            for (int kb = klo; kb <= khi; kb += FA_TK) {
                __syncthreads(); /* previous key tile fully consumed */
                if (tid < FA_TK) {
                    const int kp = kb + tid;
                    const KT *kr = NULL, *vr = NULL;
                    if (kp <= khi) {
                        const int blk = a.rows.bt[((size_t)u * 2 + a.kind) * a.rows.mbps + kp / a.kv_block];
                        if (blk >= 0) {
                            const size_t off = (((size_t)blk * a.n_layers_kind + a.layer_in_kind) * 2) * a.NKV;
                            kr = (const KT *)a.pool + ((off + kh) * a.kv_block + kp % a.kv_block) * D;
                            vr = (const KT *)a.pool + ((off + a.NKV + kh) * a.kv_block + kp % a.kv_block) * D;
                        }
                    }
                    kptr[tid] = kr, vptr[tid] = vr;
                }
                __syncthreads();
                /* global loads issued in groups of up to 8 chunks per thread before their shared stores */
                constexpr int NL = FA_TK * C4 / 256, NLG = NL < 8 ? NL : 8;
#pragma unroll
                for (int g0 = 0; g0 < NL; g0 += NLG) {
                    float4 kl[NLG], vl[NLG];
#pragma unroll
                    for (int it = 0; it < NLG; it++) {
                        const int e = tid + 256 * (g0 + it), j = e / C4, c = e - j * C4;
                        const KT *kr = kptr[j], *vr = vptr[j];
                        kl[it] = vl[it] = make_float4(0.f, 0.f, 0.f, 0.f);
                        if (kr && 4 * c < D) {
                            if (D % 4 == 0) {
                                float w[4], z[4];
                                g3c_kv_ld<4, true>(w, kr + 4 * c), g3c_kv_ld<4, true>(z, vr + 4 * c);
                                kl[it] = make_float4(w[0], w[1], w[2], w[3]);
                                vl[it] = make_float4(z[0], z[1], z[2], z[3]);
                            } else {
                                float w[4], z[4];
                                for (int k = 0; k < 4; k++) {
                                    const bool in = 4 * c + k < D;
                                    float t1[1] = {0.f}, t2[1] = {0.f};
                                    if (in) g3c_kv_ld<1, true>(t1, kr + 4 * c + k), g3c_kv_ld<1, true>(t2, vr + 4 * c + k);
                                    w[k] = t1[0], z[k] = t2[0];
                                }
                                kl[it] = make_float4(w[0], w[1], w[2], w[3]);
                                vl[it] = make_float4(z[0], z[1], z[2], z[3]);
                            }
                        }
                    }
#pragma unroll
                    for (int it = 0; it < NLG; it++) {
                        const int e = tid + 256 * (g0 + it), j = e / C4, c = e - j * C4;
                        ((float4 *)KPs)[j * C4 + (c ^ (j & 7))] = kl[it];
                        ((float4 *)Vs)[j * C4 + c] = vl[it];
                    }
                }
                __syncthreads();
                /* scores: rows ty + 16a, keys tx + 16b */
                float s[4][4];
#pragma unroll
                for (int aa = 0; aa < 4; aa++)
#pragma unroll
                    for (int b = 0; b < 4; b++) s[aa][b] = 0.f;
                const int qsw = ty & 7, ksw = tx & 7;
                float4 qf[4], kf[4]; /* operands of chunk c; those of c + 1 are loaded before c is used */
#pragma unroll
                for (int aa = 0; aa < 4; aa++) qf[aa] = Q4[(ty + 16 * aa) * C4 + qsw];
#pragma unroll
                for (int b = 0; b < 4; b++) kf[b] = K4[(tx + 16 * b) * C4 + ksw];
#pragma unroll 4
                for (int c = 0; c < C4; c++) {
                    float4 qn[4], kn[4];
                    const int cn = c + 1 < C4 ? c + 1 : c;
#pragma unroll
                    for (int aa = 0; aa < 4; aa++) qn[aa] = Q4[(ty + 16 * aa) * C4 + (cn ^ qsw)];
#pragma unroll
                    for (int b = 0; b < 4; b++) kn[b] = K4[(tx + 16 * b) * C4 + (cn ^ ksw)];
#pragma unroll
                    for (int aa = 0; aa < 4; aa++)
#pragma unroll
                        for (int b = 0; b < 4; b++) {
                            float t = s[aa][b];
                            t = fmaf(qf[aa].x, kf[b].x, t), t = fmaf(qf[aa].y, kf[b].y, t);
                            t = fmaf(qf[aa].z, kf[b].z, t), t = fmaf(qf[aa].w, kf[b].w, t);
                            s[aa][b] = t;
                        }
#pragma unroll
                    for (int aa = 0; aa < 4; aa++) qf[aa] = qn[aa];
#pragma unroll
                    for (int b = 0; b < 4; b++) kf[b] = kn[b];
                }
                bool kok[4];
#pragma unroll
                for (int b = 0; b < 4; b++) kok[b] = kptr[tx + 16 * b] != NULL;
#pragma unroll
                for (int aa = 0; aa < 4; aa++) {
                    float mt = -INFINITY;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        const int kp = kb + tx + 16 * b;
                        float t = s[aa][b] * a.scale;
                        if (a.softcap > 0.f) t = a.softcap * tanhf(t / a.softcap);
                        s[aa][b] = kok[b] && kp <= pr[aa] && kp >= lr[aa] ? t : -INFINITY;
                        mt = fmaxf(mt, s[aa][b]);
                    }
#pragma unroll
                    for (int of = 8; of; of >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, of));
                    const float mn = fmaxf(mrow[aa], mt);
                    const float corr = mn == -INFINITY ? 1.f : expf(mrow[aa] - mn);
                    float rs = 0.f;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        s[aa][b] = s[aa][b] == -INFINITY ? 0.f : expf(s[aa][b] - mn);
                        rs += s[aa][b];
                    }
#pragma unroll
                    for (int of = 8; of; of >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, of);
                    lrow[aa] = lrow[aa] * corr + rs, mrow[aa] = mn;
#pragma unroll
                    for (int c = 0; c < NC; c++)
#pragma unroll
                        for (int v = 0; v < VW; v++) acc[aa][c][v] *= corr;
                }
                __syncthreads(); /* K no longer read: P takes its place */
#pragma unroll
                for (int aa = 0; aa < 4; aa++)
#pragma unroll
                    for (int b = 0; b < 4; b++) KPs[(ty + 16 * aa) * FA_PST + tx + 16 * b] = s[aa][b];
                __syncthreads();
#pragma unroll 2
                for (int j4 = 0; j4 < FA_TK / 4; j4++) {
                    float4 pf[4];
#pragma unroll
                    for (int aa = 0; aa < 4; aa++) pf[aa] = *(const float4 *)(KPs + (ty + 16 * aa) * FA_PST + 4 * j4);
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        const int j = 4 * j4 + jj;
                        float vv[NC][VW];
#pragma unroll
                        for (int c = 0; c < NC; c++) {
                            const float *vp = Vs + j * DP + c * 16 * VW + tx * VW;
                            if constexpr (VW == 4) {
                                const float4 f = *(const float4 *)vp;
                                vv[c][0] = f.x, vv[c][1] = f.y, vv[c][2] = f.z, vv[c][3] = f.w;
                            } else {
#pragma unroll
                                for (int v = 0; v < VW; v++) vv[c][v] = vp[v];
                            }
                        }
#pragma unroll
                        for (int aa = 0; aa < 4; aa++) {
                            const float pw = jj == 0 ? pf[aa].x : jj == 1 ? pf[aa].y : jj == 2 ? pf[aa].z : pf[aa].w;
#pragma unroll
                            for (int c = 0; c < NC; c++)
#pragma unroll
                                for (int v = 0; v < VW; v++) acc[aa][c][v] = fmaf(pw, vv[c][v], acc[aa][c][v]);
                        }
                    }
                }
            }
            /* normalized output of this pass's rows */
#pragma unroll
            for (int aa = 0; aa < 4; aa++) {
                const int qi = ty + 16 * aa, t = qi / G, g = qi - t * G, r = r0 + t;
                if (su[t] != u || r >= a.m) continue;
                const float il = lrow[aa] > 0.f ? 1.f / lrow[aa] : 0.f;
                const size_t ob = (size_t)r * a.NH * D + (size_t)(kh * G + g) * D;
#pragma unroll
                for (int c = 0; c < NC; c++)
#pragma unroll
                    for (int v = 0; v < VW; v++) {
                        const int d = c * 16 * VW + tx * VW + v;
                        if (d < D) {
                            const float val = acc[aa][c][v] * il;
                            o[ob + d] = val;
                            const __nv_bfloat16 hv = __float2bfloat16_rn(val);
                            oh[ob + d] = hv;
                            if (split)
                                oh[(size_t)a.m * a.NH * D + ob + d] = __float2bfloat16_rn(val - __bfloat162float(hv));
                        }
                    }
            }
        }
    }
}

/* ---- host side -------------------------------------------------------------------------------------------- */
int g3c_fa_mode(void) { /* 0 off, 1 forced, 2 auto */
    const char *e = getenv("G3_CUDA_FA");
    return e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : 2;
}

int g3c_fa_wanted(const int32_t *seq, int M, int NH, int NKV, int D, int n_sm) {
    const int mode = g3c_fa_mode();
    if (!mode || M < G3C_ROWK_MIN || NKV < 1 || NH % NKV || D > 256 || D % 2) return 0;
    const int G = NH / NKV;
    if (G != 1 && G != 2 && G != 4 && G != 8) return 0;
    const int tq = FA_QR / G, n_tiles = (M + tq - 1) / tq;
    if (mode == 2 && (n_tiles + 1) / 2 * NKV < n_sm / 2) return 0; /* too few blocks to beat the decode kernel */
    int n_flash = 0; /* same rule as k_fa_plan, on sequence slots (one-to-one with useq) */
    for (int t0 = 0; t0 < M; t0 += tq) {
        const int t1 = M < t0 + tq ? M : t0 + tq;
        for (int r = t0; r < t1; r++) {
            int n = 0;
            for (int t = t0; t < t1; t++) n += seq[t] == seq[r];
            n_flash += n >= fa_thr(tq);
        }
    }
    return n_flash == M ? 2 : n_flash > 0;
}

cudaError_t g3c_fa_plan(const g3c_rows *rows, int m, int NH, int NKV, int32_t *fa_useq, cudaStream_t st) {
    if (NKV < 1 || NH % NKV || FA_QR % (NH / NKV)) return cudaErrorInvalidValue;
    return g3c_launch(k_fa_plan, dim3((m + 127) / 128), dim3(128), 0, st, rows->useq, m, FA_QR / (NH / NKV), fa_useq);
}

template <int DP, typename KT>
static cudaError_t launch_fa(const g3c_attn_args *a, const float *q, const int32_t *fa_useq, float *o,
                             __nv_bfloat16 *oh, int split, cudaStream_t st) {
    static int attr_set = 0; /* dynamic shared memory beyond 48 KB, once per instantiation */
    const size_t sm = fa_smem(DP);
    if (!attr_set) {
        cudaError_t e = cudaFuncSetAttribute(k_fa<DP, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
        attr_set = 1;
    }
    const int G = a->NH / a->NKV, tq = FA_QR / G, n_tiles = (a->m + tq - 1) / tq;
    dim3 grid((n_tiles + 1) / 2, a->NKV);
    return g3c_launch(k_fa<DP, KT>, grid, dim3(256), sm, st, *a, q, fa_useq, o, oh, split);
}

cudaError_t g3c_attention_prefill(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt,
                                  const int32_t *fa_useq, int all_flash, float *o, __nv_bfloat16 *oh, int split,
                                  cudaStream_t st) {
    const int G = a->NKV > 0 && a->NH % a->NKV == 0 ? a->NH / a->NKV : 0;
    if ((G != 1 && G != 2 && G != 4 && G != 8) || a->D > 256 || a->D % 2 || a->tq_x) return cudaErrorInvalidValue;
    if (!all_flash) { /* the decode kernel takes the other rows; flash rows read as padding (zeros) */
        g3c_attn_args d = *a;
        d.rows.useq = fa_useq;
        cudaError_t e = g3c_attention(&d, q, part, cnt, o, oh, split, st);
        if (e != cudaSuccess) return e;
    }
    /* the 3xTF32 variant copies float32 cache rows as they are: not with a bf16 cache */
    if (g3c_fa_tc_takes(a)) return g3c_fa_tc(a, q, fa_useq, o, oh, split, st);
    if (a->kv16) {
        if (a->D <= 32) return launch_fa<32, __nv_bfloat16>(a, q, fa_useq, o, oh, split, st);
        if (a->D <= 64) return launch_fa<64, __nv_bfloat16>(a, q, fa_useq, o, oh, split, st);
        if (a->D <= 128) return launch_fa<128, __nv_bfloat16>(a, q, fa_useq, o, oh, split, st);
        return launch_fa<256, __nv_bfloat16>(a, q, fa_useq, o, oh, split, st);
    }
    if (a->D <= 32) return launch_fa<32, float>(a, q, fa_useq, o, oh, split, st);
    if (a->D <= 64) return launch_fa<64, float>(a, q, fa_useq, o, oh, split, st);
    if (a->D <= 128) return launch_fa<128, float>(a, q, fa_useq, o, oh, split, st);
    return launch_fa<256, float>(a, q, fa_useq, o, oh, split, st);
}

/* ---- test hooks (prefill_api.h) ------------------------------------------------------------------------------- */
#define CKT(call, what) G3C_CK_GOTO(call, what, out)

extern "C" g3_status g3_cuda_test_prefill_attention(const g3_cuda_attn_test *t, const float *qkv,
                                                    const int32_t *pos, const int32_t *useq, const int32_t *bt,
                                                    int n_u, int m0, int m, int flash, float *o, int *n_flash,
                                                    g3_error *err) {
    g3_status rc = G3_OK;
    const int D = t->D, NQKV = (t->NH + 2 * t->NKV) * D, m1 = m - m0; /* step 1: rows [0, m0); step 2: the rest */
    float *dqkv = NULL, *dq = NULL, *dpart = NULL, *dout = NULL, *pool = NULL, *dnorm = NULL, *h2 = NULL;
    __nv_bfloat16 *douth = NULL;
    unsigned *dcnt = NULL;
    int32_t *dpar = NULL, *dfa = NULL, *hfa = NULL;
    const size_t pool_elems = (size_t)t->n_blocks * t->n_layers_kind * 2 * t->NKV * t->kv_block * D;
    const size_t pool_bytes = pool_elems * (t->kv16 ? 2 : 4); /* bf16 or float32 elements */
    const size_t nbt = (size_t)n_u * 2 * t->mbps, ni = (size_t)3 * m + 2 * nbt;
    *n_flash = 0;
    if (m0 < 0 || m1 < 1) return g3c_fail(err, G3_ERR_ARG, "cuda test: rows %d of %d", m0, m);
    CKT(cudaMalloc((void **)&dqkv, (size_t)2 * m * NQKV * 4), "alloc");
    CKT(cudaMalloc((void **)&dq, (size_t)m * t->NH * D * 4), "alloc");
    CKT(cudaMalloc((void **)&dout, (size_t)m * t->NH * D * 4), "alloc");
    CKT(cudaMalloc((void **)&dpart, g3c_attn_part_floats(m * t->n_splits, t->NH, D) * 4), "alloc");
    CKT(cudaMalloc((void **)&douth, (size_t)2 * m * t->NH * D * 2), "alloc");
    CKT(cudaMalloc((void **)&dcnt, (size_t)m * t->NKV * 4), "alloc");
    CKT(cudaMemset(dcnt, 0, (size_t)m * t->NKV * 4), "clear");
    CKT(cudaMalloc((void **)&pool, pool_bytes), "alloc");
    CKT(cudaMemset(pool, 0xff, pool_bytes), "poison"); /* NaNs: reading an unwritten slot shows */
    CKT(cudaMalloc((void **)&dnorm, (size_t)(3 * D) * 4), "alloc");
    CKT(cudaMalloc((void **)&dpar, ni * 4), "alloc");
    CKT(cudaMalloc((void **)&dfa, (size_t)m * 4), "alloc");
    /* each step's qkv as two slices (half + rest), [2][rows][NQKV], to exercise the sum and the zeroing */
    h2 = (float *)malloc((size_t)2 * m * NQKV * 4);
    if (!h2) CKT(cudaErrorMemoryAllocation, "host memory");
    for (int st = 0; st < 2; st++) {
        const int ra = st ? m0 : 0, nr = st ? m1 : m0;
        float *dst = h2 + (size_t)2 * ra * NQKV;
        for (size_t i = 0; i < (size_t)nr * NQKV; i++) {
            const float v = qkv[(size_t)ra * NQKV + i];
            dst[i] = 0.5f * v, dst[(size_t)nr * NQKV + i] = v - 0.5f * v;
        }
    }
    CKT(cudaMemcpy(dqkv, h2, (size_t)2 * m * NQKV * 4, cudaMemcpyHostToDevice), "upload");
    CKT(cudaMemcpy(dnorm, t->q_norm, D * 4, cudaMemcpyHostToDevice), "upload");
    CKT(cudaMemcpy(dnorm + D, t->k_norm, D * 4, cudaMemcpyHostToDevice), "upload");
    CKT(cudaMemcpy(dnorm + 2 * D, t->inv_freq, D / 2 * 4, cudaMemcpyHostToDevice), "upload");
    for (int st = 0; st < 2; st++) { /* parameter blocks: [pos][useq][bt] per step */
        const int ra = st ? m0 : 0, nr = st ? m1 : m0;
        int32_t *pb = dpar + (st ? (size_t)2 * m0 + nbt : 0);
        if (!nr) continue;
        CKT(cudaMemcpy(pb, pos + ra, nr * 4, cudaMemcpyHostToDevice), "upload");
        CKT(cudaMemcpy(pb + nr, useq + ra, nr * 4, cudaMemcpyHostToDevice), "upload");
        CKT(cudaMemcpy(pb + 2 * nr, bt, nbt * 4, cudaMemcpyHostToDevice), "upload");
    }
    for (int st = 0; st < 2; st++) {
        const int ra = st ? m0 : 0, nr = st ? m1 : m0;
        const int32_t *pb = dpar + (st ? (size_t)2 * m0 + nbt : 0);
        if (!nr) continue;
        g3c_attn_args a;
        memset(&a, 0, sizeof a);
        a.rows.token = pb, a.rows.pos = pb, a.rows.useq = pb + nr, a.rows.bt = pb + 2 * nr;
        a.rows.mbps = t->mbps;
        a.m = nr, a.NH = t->NH, a.NKV = t->NKV, a.D = D, a.kind = t->kind, a.layer_in_kind = t->layer_in_kind;
        a.n_layers_kind = t->n_layers_kind, a.kv_block = t->kv_block, a.window = t->window, a.scale = t->scale;
        a.softcap = t->softcap, a.eps = t->eps, a.inv_freq = dnorm + 2 * D, a.pool = pool, a.n_splits = t->n_splits;
        a.kv16 = t->kv16;
        a.min_keys = 1;
        float *y = dqkv + (size_t)2 * ra * NQKV;
        CKT(g3c_qkv_post_rows(&a, y, 2, dnorm, dnorm + D, dq, 0), "qkv_post_rows");
        if (!st) continue;
        for (int rep = 0; rep < 2; rep++) { /* again over poisoned output */
            if (flash) {
                CKT(g3c_fa_plan(&a.rows, nr, t->NH, t->NKV, dfa, 0), "plan");
                const int all = g3c_fa_wanted(useq + ra, nr, t->NH, t->NKV, D, 132) == 2; /* as run_step */
                CKT(g3c_attention_prefill(&a, dq, dpart, dcnt, dfa, all, dout, douth, 1, 0), "prefill attention");
            } else {
                CKT(g3c_attention(&a, dq, dpart, dcnt, dout, douth, 1, 0), "attention");
            }
            CKT(cudaDeviceSynchronize(), "sync");
            if (!rep) CKT(cudaMemset(dout, 0xff, (size_t)nr * t->NH * D * 4), "poison");
        }
        CKT(cudaMemcpy(o, dout, (size_t)nr * t->NH * D * 4, cudaMemcpyDeviceToHost), "download");
        if (flash) {
            hfa = (int32_t *)malloc((size_t)nr * 4);
            if (!hfa) CKT(cudaErrorMemoryAllocation, "host memory");
            CKT(cudaMemcpy(hfa, dfa, (size_t)nr * 4, cudaMemcpyDeviceToHost), "download");
            for (int r = 0; r < nr; r++) *n_flash += hfa[r] < 0 && useq[ra + r] >= 0;
        }
    }
    /* the product output must be all zeros again */
    CKT(cudaMemcpy(h2, dqkv, (size_t)2 * m * NQKV * 4, cudaMemcpyDeviceToHost), "download");
    {
        size_t nz = 0;
        for (size_t i = 0; i < (size_t)2 * m * NQKV; i++) nz += h2[i] != 0.f;
        if (nz) rc = g3c_fail(err, G3_ERR_DEVICE, "cuda test: %zu values of the qkv product output left nonzero", nz);
    }
out:
    free(hfa), free(h2);
    cudaFree(dqkv), cudaFree(dq), cudaFree(dpart), cudaFree(dout), cudaFree(pool), cudaFree(dnorm), cudaFree(dpar),
        cudaFree(douth), cudaFree(dcnt), cudaFree(dfa);
    return rc;
}

extern "C" g3_status g3_cuda_test_rows(int op, int m, int n, int ny, int split, float *x, float *y, const float *w1,
                                       const float *w2, float *xn, float *xh_f, g3_error *err) {
    return g3_cuda_test_rows_f(op, 0, m, n, ny, split, x, y, w1, w2, xn, xh_f, err);
}
extern "C" g3_status g3_cuda_test_rows_f(int op, int flags, int m, int n, int ny, int split, float *x, float *y,
                                         const float *w1, const float *w2, float *xn, float *xh_f, g3_error *err) {
    static_assert((int)G3C_TEST_KEEP_Y == (int)G3C_KEEP_Y && (int)G3C_TEST_NO_F32 == (int)G3C_NO_F32, "flags");
    g3_status rc = G3_OK;
    float *dx = NULL, *dy = NULL, *dw = NULL, *dxn = NULL;
    __nv_bfloat16 *dxh = NULL, *hh = NULL;
    const int on = op == G3C_TEST_GEGLU ? n / 2 : n; /* output width */
    const size_t ysz = (size_t)ny * m * n;
    CKT(cudaMalloc((void **)&dx, (size_t)m * n * 4), "alloc");
    CKT(cudaMalloc((void **)&dy, ysz * 4), "alloc");
    CKT(cudaMalloc((void **)&dw, (size_t)2 * n * 4), "alloc");
    CKT(cudaMalloc((void **)&dxn, (size_t)m * n * 4), "alloc");
    CKT(cudaMemset(dxn, 0xff, (size_t)m * n * 4), "poison");
    CKT(cudaMalloc((void **)&dxh, (size_t)2 * m * n * 2), "alloc");
    CKT(cudaMemset(dxh, 0xff, (size_t)2 * m * n * 2), "poison");
    CKT(cudaMemcpy(dy, y, ysz * 4, cudaMemcpyHostToDevice), "upload");
    if (op == G3C_TEST_ADD_NORM) {
        CKT(cudaMemcpy(dx, x, (size_t)m * n * 4, cudaMemcpyHostToDevice), "upload");
        CKT(cudaMemcpy(dw, w1, (size_t)n * 4, cudaMemcpyHostToDevice), "upload");
        CKT(cudaMemcpy(dw + n, w2, (size_t)n * 4, cudaMemcpyHostToDevice), "upload");
        CKT(g3c_add_norm_f(dx, dy, ny, dw, dw + n, 1e-6f, m, n, dxn, dxh, split, flags, 0), "add_norm");
    } else if (op == G3C_TEST_GEGLU) {
        CKT(g3c_geglu_f(dy, ny, m, on, dxn, dxh, split, flags, 0), "geglu");
    } else if (op == G3C_TEST_FINISH) {
        CKT(g3c_finish_logits(dy, ny, m, n, w1 ? w1[0] : 0.f, dxn, 0), "finish_logits");
    } else {
        CKT(cudaMemcpy(dx, x, (size_t)m * n * 4, cudaMemcpyHostToDevice), "upload");
        CKT(g3c_to_bf16(dx, m, n, dxh, split, 0), "to_bf16");
    }
    CKT(cudaDeviceSynchronize(), "sync");
    if (op == G3C_TEST_ADD_NORM) CKT(cudaMemcpy(x, dx, (size_t)m * n * 4, cudaMemcpyDeviceToHost), "download");
    if (op != G3C_TEST_TO_BF16) CKT(cudaMemcpy(xn, dxn, (size_t)m * on * 4, cudaMemcpyDeviceToHost), "download");
    CKT(cudaMemcpy(y, dy, ysz * 4, cudaMemcpyDeviceToHost), "download");
    if (xh_f && op != G3C_TEST_FINISH) {
        const size_t nh = (size_t)(split ? 2 : 1) * m * on;
        hh = (__nv_bfloat16 *)malloc(nh * 2);
        if (!hh) CKT(cudaErrorMemoryAllocation, "host memory");
        CKT(cudaMemcpy(hh, dxh, nh * 2, cudaMemcpyDeviceToHost), "download");
        for (size_t i = 0; i < nh; i++) xh_f[i] = __bfloat162float(hh[i]);
    }
out:
    free(hh);
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(dxn), cudaFree(dxh);
    return rc;
}
