/* Attention over the paged KV cache: QK-norm + RoPE + cache write for each row's q/k/v, then flash-decoding
 * (each (row, kv head) pair's keys split across blocks, float32 online softmax, partials merged by the last
 * block of the pair to finish). Every row reads its position and its sequence's block table from device memory,
 * so the same launches serve decode rows, prefill chunks and graph replays. GQA: kv head h serves query heads
 * h*G .. h*G+G-1.
 *
 * Decode rows (every row of its own sequence, $G3_CUDA_DFUSE != 0): one launch does QK-norm + RoPE + cache write +
 * attention: each block normalizes and rotates its q heads straight from the product output, the block of the last
 * split writes the new key and value into the cache before walking its keys, and the block that finishes the
 * (row, kv head) zeroes the product output it read.
 *
 * g3c_attention and g3c_attention_fused hand their work to the second decode kernel (attention_dec.cu: clusters
 * merging in distributed shared memory) where it supports the shape, unless $G3_CUDA_ATTN2=0; the kernels here then
 * serve the other shapes. The fused launch is the default only with $G3_CUDA_ATTN2=0 (g3c_dfuse_enabled): with the
 * second kernel, the separate QK-norm launch plus attention measured faster on the H200.
 *
 * Cache block layout (float32, or bf16 with a.kv16: the round-1 kernels here take float32 only, the QK-norm kernel
 * both): [n_layers_of_kind][2 (K, V)][NKV][kv_block][D]; a key at position p of sequence u
 * lives in physical block bt[u][kind][p / kv_block], slot p % kv_block. Sliding layers see keys p-W+1..p. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

template <typename T = float>
__device__ __forceinline__ T *kv_row(const g3c_attn_args &a, int u, int p, int kv, int h) {
    int blk = a.rows.bt[((size_t)u * 2 + a.kind) * a.rows.mbps + p / a.kv_block];
    if (blk < 0) return NULL;
    size_t off = (((size_t)blk * a.n_layers_kind + a.layer_in_kind) * 2 + kv) * a.NKV;
    return (T *)a.pool + ((off + h) * a.kv_block + p % a.kv_block) * a.D;
}

/* What the fused decode kernel needs of RoPE and the norm weights for lane `lane`'s values d = lane + 32e (and
 * their RoPE partners pd = d +- D/2): computed before the PDL wait, since it depends only on the position. */
template <int EPL> struct rope_lane {
    float c[EPL], s[EPL];  /* cos, sin of p * inv_freq[d mod D/2] */
    float wq[EPL], wqp[EPL]; /* q norm weight at d and pd */
    float wk[EPL], wkp[EPL]; /* k norm weight at d and pd */
};
template <int EPL>
__device__ __forceinline__ void rope_prep(rope_lane<EPL> &R, int D, int p, const float *inv_freq, const float *qn,
                                          const float *kn, int lane) {
    const int half = D / 2;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e, pd = d < half ? d + half : d - half, i = d < half ? d : pd;
        R.c[e] = 1.f, R.s[e] = 0.f, R.wq[e] = R.wqp[e] = R.wk[e] = R.wkp[e] = 0.f;
        if (d < D) {
            const float ang = (float)p * inv_freq[i];
            R.c[e] = cosf(ang), R.s[e] = sinf(ang);
            R.wq[e] = qn[d], R.wqp[e] = qn[pd], R.wk[e] = kn[d], R.wkp[e] = kn[pd];
        }
    }
}
/* One head of the product output (ny slices at y + j*sl + base, D values) RMS-normalized with weights (w at d, wp
 * at the partner) and rotated, into out[e] = value d = lane + 32e of the head (a warp per head; each lane also reads
 * the RoPE partner d +- D/2 of each of its values, so any even D works). */
template <int EPL>
__device__ __forceinline__ void norm_rope(const float *y, int ny, size_t sl, size_t base, int D, float eps, int lane,
                                          const rope_lane<EPL> &R, const float *w, const float *wp, float out[EPL]) {
    const int half = D / 2;
    float v[EPL], u[EPL], ss = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e, pd = d < half ? d + half : d - half;
        v[e] = u[e] = 0.f;
        if (d < D)
            for (int j = 0; j < ny; j++) v[e] += y[j * sl + base + d], u[e] += y[j * sl + base + pd];
        ss += v[e] * v[e];
    }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(ss / (float)D + eps);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        const float x = v[e] * inv * w[e], xp = u[e] * inv * wp[e];
        out[e] = d >= D ? 0.f : d < half ? x * R.c[e] - xp * R.s[e] : x * R.c[e] + xp * R.s[e];
    }
}

/* Fused decode: zeroes the product output read by the (row r, kv head kh) pair: its G q heads, its k and v head. */
__device__ __forceinline__ void zero_qkv(float *y, int ny, size_t sl, size_t rowb, int kh, int G, int NH, int NKV,
                                         int D) {
    const int per = (G + 2) * D;
    for (int t = threadIdx.x; t < ny * per; t += blockDim.x) {
        const int j = t / per, rem = t % per, sec = rem / D, d = rem % D;
        const int head = sec < G ? kh * G + sec : sec == G ? NH + kh : NH + NKV + kh;
        y[j * sl + rowb + (size_t)head * D + d] = 0.f;
    }
}

/* grid (m, ceil(heads/4)), block (32, 4): one warp per head of q, k or v. Reads (and zeroes) the ny slices of y.
 * T: the cache element (float, or __nv_bfloat16 with a.kv16). */
template <typename T>
__global__ void k_qkv_post(g3c_attn_args a, float *y, int ny, const float *qn, const float *kn, float *qout) {
    const int r = blockIdx.x, hh = blockIdx.y * 4 + threadIdx.y, lane = threadIdx.x;
    const int D = a.D, NHT = a.NH + 2 * a.NKV, half = D / 2;
    /* before the programmatic-dependent-launch wait: what depends only on the position and the weights (row
     * parameters and block tables are uploaded before the step): the cache slot, the norm weights, cos and sin */
    const int u = hh < NHT ? a.rows.useq[r] : -1, p = hh < NHT ? a.rows.pos[r] : 0;
    const bool qh = hh < a.NH, vh = hh >= a.NH + a.NKV;
    T *slot = hh < NHT && !qh && u >= 0 ? kv_row<T>(a, u, p, vh ? 1 : 0, vh ? hh - a.NH - a.NKV : hh - a.NH) : NULL;
    const float *nw = qh ? qn : kn;
    float w0[4], w1[4], cs[4], sn[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const int i = lane + 32 * t;
        w0[t] = w1[t] = cs[t] = sn[t] = 0.f;
        if (hh < NHT && !vh && i < half) {
            w0[t] = nw[i], w1[t] = nw[i + half];
            const float ang = (float)p * a.inv_freq[i];
            cs[t] = cosf(ang), sn[t] = sinf(ang);
        }
    }
    g3c_pdl_wait();
    if (hh >= NHT) return;
    const int np = g3c_qkv_slices(a, ny, hh);
    if (vh) { /* v: straight into the cache */
        for (int i = lane; i < D; i += 32) {
            float v = 0.f;
            for (int j = 0; j < np; j++) {
                float *p = y + g3c_qkv_at(a, ny, j, r, hh) + i;
                v += *p, *p = 0.f;
            }
            if (slot) g3c_kv_put(slot + i, v);
        }
        return;
    }
    float v0[4], v1[4], ss = 0.f; /* pairs (i, i + D/2), i = lane + 32t */
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int i = lane + 32 * t;
        v0[t] = v1[t] = 0.f;
        if (i < half) {
            for (int j = 0; j < np; j++) {
                float *p = y + g3c_qkv_at(a, ny, j, r, hh) + i;
                v0[t] += p[0], v1[t] += p[half];
                p[0] = 0.f, p[half] = 0.f;
            }
            ss += v0[t] * v0[t] + v1[t] * v1[t];
        }
    }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(ss / (float)D + a.eps);
    float *qd = qh ? qout + (size_t)r * a.NH * D + (size_t)hh * D : NULL;
    if (!qd && !slot) return;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int i = lane + 32 * t;
        if (i < half) {
            float x0 = v0[t] * inv * w0[t], x1 = v1[t] * inv * w1[t];
            const float r0 = x0 * cs[t] - x1 * sn[t], r1 = x1 * cs[t] + x0 * sn[t];
            if (qd) qd[i] = r0, qd[i + half] = r1;
            else g3c_kv_put(slot + i, r0), g3c_kv_put(slot + i + half, r1);
        }
    }
}

/* grid (NKV, m, n_splits), 128 threads: the keys of one (row, kv head) split into n_splits ranges. Each warp walks
 * its keys four at a time (block-table lookups, then all K and V rows loaded before use), keeping a float32 online
 * softmax per query head; the 4 warps merge in shared memory. With one split the block normalizes and writes o;
 * otherwise it writes {max, sum, o[G][D] unnormalized} per head to part, and the last block of the (row, kv head)
 * to finish (a counter, reset by that block) merges all splits and writes o. */
template <int G, int EPL, bool FU>
__global__ void __launch_bounds__(128) k_attn(g3c_attn_args a, const float *__restrict__ q, float *__restrict__ part,
                                              unsigned *__restrict__ cnt, float *__restrict__ o,
                                              __nv_bfloat16 *__restrict__ oh, int split, float *y, int ny,
                                              const float *qn, const float *kn) {
    constexpr int NK = 4; /* keys per warp per step */
    if (!FU) g3c_pdl_wait(); /* fused: the row parameters (written before the step, by no kernel) are read first */
    const int kh = blockIdx.x, r = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, D = a.D;
    const int u = a.rows.useq[r], p = a.rows.pos[r];
    /* at least min_keys keys per split: Se <= S splits are used, the other blocks leave at once */
    int k0 = 0, k1 = 0, Se = 1;
    if (u >= 0) {
        int lo = a.kind == 1 ? max(0, p - a.window + 1) : 0;
        int n = p - lo + 1, chunk = max((n + S - 1) / S, a.min_keys);
        chunk = (chunk + 3) & ~3;
        Se = (n + chunk - 1) / chunk;
        k0 = lo + s * chunk, k1 = min(p + 1, k0 + chunk);
    }
    if (s >= Se) return;
    rope_lane<EPL> R;
    if (FU) {
        rope_prep<EPL>(R, D, p, a.inv_freq, qn, kn, lane); /* constants and the position only */
        g3c_pdl_wait();
    }
    float qv[G][EPL], acc[G][EPL], mx[G], l[G];
    const int NHT = a.NH + 2 * a.NKV;
    const size_t rowb = (size_t)r * NHT * D, sl = (size_t)a.m * NHT * D; /* fused: this row of y, slice stride */
#pragma unroll
    for (int g = 0; g < G; g++) {
        mx[g] = -INFINITY, l[g] = 0.f;
        if (FU) norm_rope<EPL>(y, ny, sl, rowb + (size_t)(kh * G + g) * D, D, a.eps, lane, R, R.wq, R.wqp, qv[g]);
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int d = lane + 32 * e;
            if (!FU) qv[g][e] = d < D ? q[(size_t)r * a.NH * D + (size_t)(kh * G + g) * D + d] : 0.f;
            acc[g][e] = 0.f;
        }
    }
    if (FU && u >= 0 && s == Se - 1) { /* the split holding position p writes its key and value first */
        if (warp == 0) {
            float kv[EPL];
            norm_rope<EPL>(y, ny, sl, rowb + (size_t)(a.NH + kh) * D, D, a.eps, lane, R, R.wk, R.wkp, kv);
            float *dst = kv_row(a, u, p, 0, kh);
#pragma unroll
            for (int e = 0; e < EPL; e++)
                if (dst && lane + 32 * e < D) dst[lane + 32 * e] = kv[e];
        } else if (warp == 1) {
            float *dst = kv_row(a, u, p, 1, kh);
            const size_t vb = rowb + (size_t)(a.NH + a.NKV + kh) * D;
            for (int d = lane; d < D; d += 32) {
                float v = 0.f;
                for (int j = 0; j < ny; j++) v += y[j * sl + vb + d];
                if (dst) dst[d] = v;
            }
        }
        __syncthreads(); /* the block's own cache writes are visible to its warps from here */
    }
    if (FU) { /* the same walk with the G x NK dot products reduced together (independent shuffle chains) */
        for (int k = k0 + warp; k < k1; k += 4 * NK) {
            const float *kp[NK], *vp[NK];
#pragma unroll
            for (int j = 0; j < NK; j++) {
                const int kk = k + 4 * j;
                kp[j] = kk < k1 ? kv_row(a, u, kk, 0, kh) : NULL;
                vp[j] = kk < k1 ? kv_row(a, u, kk, 1, kh) : NULL;
            }
            float kr[NK][EPL], vr[NK][EPL], t[NK][G];
#pragma unroll
            for (int j = 0; j < NK; j++)
#pragma unroll
                for (int e = 0; e < EPL; e++) {
                    int d = lane + 32 * e;
                    kr[j][e] = kp[j] && d < D ? kp[j][d] : 0.f;
                    vr[j][e] = vp[j] && d < D ? vp[j][d] : 0.f;
                }
#pragma unroll
            for (int j = 0; j < NK; j++)
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float tt = 0.f;
#pragma unroll
                    for (int e = 0; e < EPL; e++) tt = fmaf(qv[g][e], kr[j][e], tt);
                    t[j][g] = tt;
                }
#pragma unroll
            for (int of = 16; of; of >>= 1)
#pragma unroll
                for (int j = 0; j < NK; j++)
#pragma unroll
                    for (int g = 0; g < G; g++) t[j][g] += __shfl_xor_sync(0xffffffffu, t[j][g], of);
#pragma unroll
            for (int j = 0; j < NK; j++) {
                if (!kp[j]) continue; /* warp-uniform */
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float tt = t[j][g] * a.scale;
                    if (a.softcap > 0.f) tt = a.softcap * tanhf(tt / a.softcap);
                    float mn = fmaxf(mx[g], tt), corr = expf(mx[g] - mn), pw = expf(tt - mn);
                    l[g] = l[g] * corr + pw;
#pragma unroll
                    for (int e = 0; e < EPL; e++) acc[g][e] = acc[g][e] * corr + pw * vr[j][e];
                    mx[g] = mn;
                }
            }
        }
    }
    for (int k = k0 + warp; !FU && k < k1; k += 4 * NK) {
        const float *kp[NK], *vp[NK];
#pragma unroll
        for (int j = 0; j < NK; j++) {
            const int kk = k + 4 * j;
            kp[j] = kk < k1 ? kv_row(a, u, kk, 0, kh) : NULL;
            vp[j] = kk < k1 ? kv_row(a, u, kk, 1, kh) : NULL;
        }
        float kr[NK][EPL], vr[NK][EPL];
#pragma unroll
        for (int j = 0; j < NK; j++)
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                int d = lane + 32 * e;
                kr[j][e] = kp[j] && d < D ? kp[j][d] : 0.f;
                vr[j][e] = vp[j] && d < D ? vp[j][d] : 0.f;
            }
#pragma unroll
        for (int j = 0; j < NK; j++) {
            if (!kp[j]) continue; /* warp-uniform */
#pragma unroll
            for (int g = 0; g < G; g++) {
                float t = 0.f;
#pragma unroll
                for (int e = 0; e < EPL; e++) t = fmaf(qv[g][e], kr[j][e], t);
                for (int of = 16; of; of >>= 1) t += __shfl_xor_sync(0xffffffffu, t, of);
                t *= a.scale;
                if (a.softcap > 0.f) t = a.softcap * tanhf(t / a.softcap);
                float mn = fmaxf(mx[g], t), corr = expf(mx[g] - mn), pw = expf(t - mn);
                l[g] = l[g] * corr + pw;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[g][e] = acc[g][e] * corr + pw * vr[j][e];
                mx[g] = mn;
            }
        }
    }
    /* merge the 4 warps */
    extern __shared__ float sm[]; /* [4][G][D + 2], then [G][2] */
    __shared__ int last;
    const int W = D + 2;
#pragma unroll
    for (int g = 0; g < G; g++) {
        float *b = sm + ((size_t)warp * G + g) * W;
        if (lane == 0) b[0] = mx[g], b[1] = l[g];
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int d = lane + 32 * e;
            if (d < D) b[2 + d] = acc[g][e];
        }
    }
    __syncthreads();
    const size_t ob = (size_t)r * a.NH * D + (size_t)kh * G * D; /* o of head kh*G, row r */
    for (int t = threadIdx.x; t < G * W; t += 128) {
        int g = t / W, c = t % W;
        float M = -INFINITY;
        for (int w = 0; w < 4; w++) M = fmaxf(M, sm[((size_t)w * G + g) * W]);
        float out = 0.f, L = 0.f;
        if (M != -INFINITY)
            for (int w = 0; w < 4; w++) {
                const float *b = sm + ((size_t)w * G + g) * W;
                if (b[0] != -INFINITY) out += b[c] * expf(b[0] - M), L += b[1] * expf(b[0] - M);
            }
        if (c == 0) out = M;
        if (Se == 1) { /* this block has every key: normalize */
            if (c >= 2) {
                float v = L > 0.f ? out / L : 0.f;
                size_t idx = ob + (size_t)g * D + (c - 2);
                o[idx] = v;
                __nv_bfloat16 hv = __float2bfloat16_rn(v);
                oh[idx] = hv;
                if (split) oh[(size_t)a.m * a.NH * D + idx] = __float2bfloat16_rn(v - __bfloat162float(hv));
            }
        } else {
            part[(((size_t)r * S + s) * a.NH + kh * G + g) * W + c] = out;
        }
    }
    if (Se == 1) {
        if (FU) zero_qkv(y, ny, sl, rowb, kh, G, a.NH, a.NKV, D); /* every read of y is behind the barrier above */
        return;
    }
    /* last block of this (row, kv head) merges the splits */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&cnt[(size_t)r * a.NKV + kh], 1u) == (unsigned)(Se - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    float *wt = sm + (size_t)4 * G * W; /* [G][S]: weight of each split, exp(m_j - M) / L */
    for (int g = warp; g < G; g += 4) { /* a warp per head, a lane per split (S <= 64) */
        float mj[2], lj[2], M = -INFINITY, L = 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = lane + 32 * h;
            const float *b = part + (((size_t)r * S + j) * a.NH + kh * G + g) * W;
            mj[h] = j < Se ? __ldcg(b) : -INFINITY, lj[h] = j < Se ? __ldcg(b + 1) : 0.f;
            M = fmaxf(M, mj[h]);
        }
        for (int of = 16; of; of >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, of));
#pragma unroll
        for (int h = 0; h < 2; h++) mj[h] = mj[h] == -INFINITY ? 0.f : expf(mj[h] - M), L += mj[h] * lj[h];
        for (int of = 16; of; of >>= 1) L += __shfl_xor_sync(0xffffffffu, L, of);
        const float iL = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (lane + 32 * h < Se) wt[g * S + lane + 32 * h] = mj[h] * iL;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * D; t += 128) {
        const int g = t / D, d = t % D;
        const float *b = part + (((size_t)r * S) * a.NH + kh * G + g) * W + 2 + d;
        const size_t js = (size_t)a.NH * W; /* stride between splits */
        float accv = 0.f;
        int j = 0;
        for (; j + 8 <= Se; j += 8) { /* eight loads in flight */
            float v[8];
#pragma unroll
            for (int h = 0; h < 8; h++) v[h] = __ldcg(b + (j + h) * js);
#pragma unroll
            for (int h = 0; h < 8; h++) accv += wt[g * S + j + h] * v[h];
        }
        for (; j < Se; j++) accv += wt[g * S + j] * __ldcg(b + j * js);
        const size_t idx = ob + (size_t)g * D + d;
        o[idx] = accv;
        __nv_bfloat16 hv = __float2bfloat16_rn(accv);
        oh[idx] = hv;
        if (split) oh[(size_t)a.m * a.NH * D + idx] = __float2bfloat16_rn(accv - __bfloat162float(hv));
    }
    if (threadIdx.x == 0) cnt[(size_t)r * a.NKV + kh] = 0u;
    if (FU) zero_qkv(y, ny, sl, rowb, kh, G, a.NH, a.NKV, D); /* the other splits read y before counting in */
}

cudaError_t g3c_qkv_post(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn, float *qout,
                         cudaStream_t st) {
    if (a->D > 256 || a->D % 2) return cudaErrorInvalidValue;
    dim3 grid(a->m, (a->NH + 2 * a->NKV + 3) / 4), blk(32, 4);
    if (a->kv16) return g3c_launch(k_qkv_post<__nv_bfloat16>, grid, blk, 0, st, *a, y, ny, qn, kn, qout);
    return g3c_launch(k_qkv_post<float>, grid, blk, 0, st, *a, y, ny, qn, kn, qout);
}

size_t g3c_attn_part_floats(int rows_x_splits, int NH, int D) { return (size_t)rows_x_splits * NH * (D + 2); }

template <int G, bool FU>
static cudaError_t launch_g(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt, float *o,
                            __nv_bfloat16 *oh, int split, float *y, int ny, const float *qn, const float *kn,
                            cudaStream_t st) {
    dim3 grid(a->NKV, a->m, a->n_splits);
    if (a->n_splits > 64 || a->n_splits < 1) return cudaErrorInvalidValue;
    size_t sm = (size_t)(4 * G * (a->D + 2) + G * a->n_splits) * sizeof(float);
    int epl = (a->D + 31) / 32;
#define G3_ATTN_LAUNCH(E)                                                                                              \
    return g3c_launch(k_attn<G, E, FU>, grid, dim3(128), sm, st, *a, q, part, cnt, o, oh, split, y, ny, qn, kn)
    if (epl <= 1) G3_ATTN_LAUNCH(1);
    if (epl <= 2) G3_ATTN_LAUNCH(2);
    if (epl <= 4) G3_ATTN_LAUNCH(4);
    if (epl <= 8) G3_ATTN_LAUNCH(8);
#undef G3_ATTN_LAUNCH
    return cudaErrorInvalidValue;
}

template <bool FU>
static cudaError_t attention_any(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt, float *o,
                                 __nv_bfloat16 *oh, int split, float *y, int ny, const float *qn, const float *kn,
                                 cudaStream_t st) {
    if (a->NKV < 1 || a->NH % a->NKV) return cudaErrorInvalidValue;
    switch (a->NH / a->NKV) {
    case 1: return launch_g<1, FU>(a, q, part, cnt, o, oh, split, y, ny, qn, kn, st);
    case 2: return launch_g<2, FU>(a, q, part, cnt, o, oh, split, y, ny, qn, kn, st);
    case 4: return launch_g<4, FU>(a, q, part, cnt, o, oh, split, y, ny, qn, kn, st);
    case 8: return launch_g<8, FU>(a, q, part, cnt, o, oh, split, y, ny, qn, kn, st);
    }
    return cudaErrorInvalidValue;
}

int g3c_attn_tq_ok(const g3c_attn_args *a) { /* $G3_CUDA_ATTNTQ read at every call (once a layer when recording) */
    const char *e = getenv("G3_CUDA_ATTNTQ");
    return !(e && !strcmp(e, "0")) && g3c_attn2_enabled() && g3c_attn2_supported(a) && a->NH / a->NKV * a->D % 128 == 0;
}

cudaError_t g3c_attention(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt, float *o,
                          __nv_bfloat16 *oh, int split, cudaStream_t st) {
    if (g3c_attn2_enabled() && g3c_attn2_supported(a)) return g3c_attn2(a, q, o, oh, split, st); /* attention_dec.cu */
    if (a->kv16 || a->tq_x) return cudaErrorInvalidValue; /* the round-1 kernels: float32 caches, o in float32 only */
    return attention_any<false>(a, q, part, cnt, o, oh, split, NULL, 0, NULL, NULL, st);
}

cudaError_t g3c_attention_fused(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn,
                                float *part, unsigned *cnt, float *o, __nv_bfloat16 *oh, int split, cudaStream_t st) {
    if (a->D > 256 || a->D % 2 || a->m > 64 || ny < 1) return cudaErrorInvalidValue;
    if (g3c_attn2_enabled() && g3c_attn2_supported(a)) /* attention_dec.cu */
        return g3c_attn2_fused(a, y, ny, qn, kn, o, oh, split, st);
    if (a->kv16 || a->tq_x) return cudaErrorInvalidValue;
    return attention_any<true>(a, NULL, part, cnt, o, oh, split, y, ny, qn, kn, st);
}

int g3c_dfuse_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("G3_CUDA_DFUSE"); /* default: fused only with the round-1 attention kernel */
        on = e ? strcmp(e, "0") != 0 : !g3c_attn2_enabled();
    }
    return on;
}

/* ---- test hook: decode rows over a cache filled by history rows (fused: bit 0 fused, bit 1 round-1 kernels) -- */
extern "C" {
#include "backend/cuda/cuda_api.h"
}
#define AT_CK(call, what) G3C_CK_GOTO(call, "decode attention test: " what, out)

extern "C" g3_status g3_cuda_test_attention_decode(const g3_cuda_attn_test *t, int fused, const float *hist_qkv,
                                                   const int32_t *hist_pos, const int32_t *hist_useq, int m_hist,
                                                   const float *qkv, const int32_t *pos, const int32_t *useq, int m,
                                                   const int32_t *bt, int n_u, float *o, float *y_after,
                                                   g3_error *err) {
    g3_status rc = G3_OK;
    const int D = t->D, NQKV = (t->NH + 2 * t->NKV) * D;
    const size_t pool_elems = (size_t)t->n_blocks * t->n_layers_kind * 2 * t->NKV * t->kv_block * D;
    const size_t pool_bytes = pool_elems * (t->kv16 ? 2 : 4); /* bf16 or float32 elements */
    const int mh = m_hist > 0 ? m_hist : 1, mx = mh > m ? mh : m;
    float *dy = NULL, *dq = NULL, *dpart = NULL, *dout = NULL, *pool = NULL, *dnorm = NULL;
    __nv_bfloat16 *douth = NULL;
    unsigned *dcnt = NULL;
    int32_t *dpar = NULL; /* hist pos [mh], hist useq [mh], pos [m], useq [m], bt [n_u][2][mbps] */
    g3c_attn_args a;
    memset(&a, 0, sizeof a);
    cudaStream_t st = NULL;
    g3c_attn2_force(fused & 2 ? 0 : 1); /* bit 1: the round-1 attention kernel (separate launches) */
    g3c_attn2_force_w(fused & 4 ? 2 : 0); /* bit 2: the second kernel in 2-warp blocks */
    const int tq = fused & 8, K = t->NH * D; /* bit 3: o quantized (tq_act.cuh, value order 0), dequantized into o */
    int8_t *dxq = NULL;
    float2 *dxd = NULL;
    int8_t *hq = NULL;
    float2 *hd = NULL;
    fused &= 1;
    AT_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    AT_CK(cudaMalloc((void **)&dy, (size_t)mx * NQKV * 4), "alloc");
    AT_CK(cudaMalloc((void **)&dq, (size_t)mx * t->NH * D * 4), "alloc");
    AT_CK(cudaMalloc((void **)&dout, (size_t)m * t->NH * D * 4), "alloc");
    AT_CK(cudaMalloc((void **)&dpart, g3c_attn_part_floats(m * t->n_splits, t->NH, D) * 4), "alloc");
    AT_CK(cudaMalloc((void **)&douth, (size_t)2 * m * t->NH * D * 2), "alloc");
    AT_CK(cudaMalloc((void **)&dcnt, (size_t)m * t->NKV * 4), "alloc");
    AT_CK(cudaMemset(dcnt, 0, (size_t)m * t->NKV * 4), "clear");
    AT_CK(cudaMalloc((void **)&pool, pool_bytes), "alloc");
    AT_CK(cudaMemset(pool, 0xff, pool_bytes), "poison"); /* NaNs: reading an unwritten slot shows */
    AT_CK(cudaMalloc((void **)&dnorm, (size_t)(3 * D) * 4), "alloc");
    AT_CK(cudaMalloc((void **)&dpar, ((size_t)2 * mh + 2 * m + (size_t)n_u * 2 * t->mbps) * 4), "alloc");
    AT_CK(cudaMemcpy(dnorm, t->q_norm, D * 4, cudaMemcpyHostToDevice), "upload");
    AT_CK(cudaMemcpy(dnorm + D, t->k_norm, D * 4, cudaMemcpyHostToDevice), "upload");
    AT_CK(cudaMemcpy(dnorm + 2 * D, t->inv_freq, D / 2 * 4, cudaMemcpyHostToDevice), "upload");
    if (m_hist > 0) {
        AT_CK(cudaMemcpy(dpar, hist_pos, m_hist * 4, cudaMemcpyHostToDevice), "upload");
        AT_CK(cudaMemcpy(dpar + mh, hist_useq, m_hist * 4, cudaMemcpyHostToDevice), "upload");
    }
    AT_CK(cudaMemcpy(dpar + 2 * mh, pos, m * 4, cudaMemcpyHostToDevice), "upload");
    AT_CK(cudaMemcpy(dpar + 2 * mh + m, useq, m * 4, cudaMemcpyHostToDevice), "upload");
    AT_CK(cudaMemcpy(dpar + 2 * mh + 2 * m, bt, (size_t)n_u * 2 * t->mbps * 4, cudaMemcpyHostToDevice), "upload");
    a.rows.bt = dpar + 2 * mh + 2 * m, a.rows.mbps = t->mbps;
    a.NH = t->NH, a.NKV = t->NKV, a.D = D, a.kind = t->kind, a.layer_in_kind = t->layer_in_kind;
    a.n_layers_kind = t->n_layers_kind, a.kv_block = t->kv_block, a.window = t->window, a.scale = t->scale;
    a.softcap = t->softcap, a.eps = t->eps, a.inv_freq = dnorm + 2 * D, a.pool = pool, a.n_splits = t->n_splits;
    a.kv16 = t->kv16;
    a.min_keys = 1;
    if (m_hist > 0) AT_CK(cudaMemcpy(dy, hist_qkv, (size_t)m_hist * NQKV * 4, cudaMemcpyHostToDevice), "upload");
    /* the copies and memsets above ran on the legacy stream, which st (non-blocking) does not wait for; a copy from
     * pageable memory may return before its last bytes land (this made the 27B-shape case with 40 histories fail
     * now and then: the last history rows' keys were computed from a half-written dy) */
    AT_CK(cudaDeviceSynchronize(), "upload");
    if (m_hist > 0) { /* history: cache writes only */
        a.rows.token = dpar, a.rows.pos = dpar, a.rows.useq = dpar + mh, a.m = m_hist;
        AT_CK(g3c_qkv_post(&a, dy, 1, dnorm, dnorm + D, dq, st), "qkv_post (history)");
    }
    a.rows.token = dpar + 2 * mh, a.rows.pos = dpar + 2 * mh, a.rows.useq = dpar + 2 * mh + m, a.m = m;
    if (tq) {
        if (K % 128) {
            rc = g3c_fail(err, G3_ERR_ARG, "decode attention test: quantized o needs NH*D %% 128 == 0");
            goto out;
        }
        AT_CK(cudaMalloc((void **)&dxq, (size_t)m * K), "alloc");
        AT_CK(cudaMalloc((void **)&dxd, (size_t)m * (K / 128) * sizeof(float2)), "alloc");
        AT_CK(cudaMemset(dxq, 0x7f, (size_t)m * K), "poison");
        AT_CK(cudaMemset(dxd, 0xff, (size_t)m * (K / 128) * sizeof(float2)), "poison");
        AT_CK(cudaDeviceSynchronize(), "poison");
        a.tq_x = dxq, a.tq_d = dxd, a.tq_il = 0;
    }
    for (int rep = 0; rep < 2; rep++) { /* twice, the second time over poisoned output: counters were reset */
        AT_CK(cudaMemcpyAsync(dy, qkv, (size_t)m * NQKV * 4, cudaMemcpyHostToDevice, st), "upload");
        AT_CK(cudaMemsetAsync(dout, 0xff, (size_t)m * t->NH * D * 4, st), "poison");
        if (fused) {
            AT_CK(g3c_attention_fused(&a, dy, 1, dnorm, dnorm + D, dpart, dcnt, dout, douth, 1, st),
                  "fused attention");
        } else {
            AT_CK(g3c_qkv_post(&a, dy, 1, dnorm, dnorm + D, dq, st), "qkv_post");
            AT_CK(g3c_attention(&a, dq, dpart, dcnt, dout, douth, 1, st), "attention");
        }
    }
    AT_CK(cudaStreamSynchronize(st), "run");
    if (tq) { /* o[i] = q[i] d of its block; the block's second number must be d * sum q */
        hq = (int8_t *)malloc((size_t)m * K), hd = (float2 *)malloc((size_t)m * (K / 128) * sizeof(float2));
        if (!hq || !hd) {
            rc = g3c_fail(err, G3_ERR_NOMEM, "decode attention test: host buffers");
            goto out;
        }
        AT_CK(cudaMemcpy(hq, dxq, (size_t)m * K, cudaMemcpyDeviceToHost), "download");
        AT_CK(cudaMemcpy(hd, dxd, (size_t)m * (K / 128) * sizeof(float2), cudaMemcpyDeviceToHost), "download");
        for (size_t b = 0; b < (size_t)m * (K / 128); b++) {
            long sum = 0;
            for (int i = 0; i < 128; i++) sum += hq[b * 128 + i], o[b * 128 + i] = hq[b * 128 + i] * hd[b].x;
            if (!(fabsf(hd[b].y - hd[b].x * (float)sum) <= 1e-5f * (fabsf(hd[b].x * (float)sum) + 1e-6f))) {
                rc = g3c_fail(err, G3_ERR_DEVICE, "decode attention test: block %zu: d * sum q %g, expected %g", b,
                              (double)hd[b].y, (double)hd[b].x * sum);
                goto out;
            }
        }
    } else
        AT_CK(cudaMemcpy(o, dout, (size_t)m * t->NH * D * 4, cudaMemcpyDeviceToHost), "download");
    if (y_after) AT_CK(cudaMemcpy(y_after, dy, (size_t)m * NQKV * 4, cudaMemcpyDeviceToHost), "download");
out:
    g3c_attn2_force(-1), g3c_attn2_force_w(0);
    cudaFree(dy), cudaFree(dq), cudaFree(dpart), cudaFree(dout), cudaFree(pool), cudaFree(dnorm), cudaFree(dpar);
    cudaFree(douth), cudaFree(dcnt), cudaFree(dxq), cudaFree(dxd);
    free(hq), free(hd);
    if (st) cudaStreamDestroy(st);
    return rc;
}
