/* Attention over the paged KV cache: QK-norm + RoPE + cache write for each row's q/k/v, then flash-decoding
 * (each (row, kv head) pair's keys split across blocks, float32 online softmax, partials merged by the last
 * block of the pair to finish). Every row reads its position and its sequence's block table from device memory,
 * so the same launches serve decode rows, prefill chunks and graph replays. GQA: kv head h serves query heads
 * h*G .. h*G+G-1.
 *
 * Cache block layout (float32): [n_layers_of_kind][2 (K, V)][NKV][kv_block][D]; a key at position p of sequence u
 * lives in physical block bt[u][kind][p / kv_block], slot p % kv_block. Sliding layers see keys p-W+1..p. */
#include "backend/cuda/cuda_common.cuh"

__device__ __forceinline__ float *kv_row(const g3c_attn_args &a, int u, int p, int kv, int h) {
    int blk = a.rows.bt[((size_t)u * 2 + a.kind) * a.rows.mbps + p / a.kv_block];
    if (blk < 0) return NULL;
    size_t off = (((size_t)blk * a.n_layers_kind + a.layer_in_kind) * 2 + kv) * a.NKV;
    return a.pool + ((off + h) * a.kv_block + p % a.kv_block) * a.D;
}

/* grid (m, ceil(heads/4)), block (32, 4): one warp per head of q, k or v. Reads (and zeroes) the ny slices of y. */
__global__ void k_qkv_post(g3c_attn_args a, float *y, int ny, const float *qn, const float *kn, float *qout) {
    g3c_pdl_wait();
    const int r = blockIdx.x, hh = blockIdx.y * 4 + threadIdx.y, lane = threadIdx.x;
    const int D = a.D, NHT = a.NH + 2 * a.NKV, half = D / 2;
    if (hh >= NHT) return;
    const size_t src = (size_t)r * NHT * D + (size_t)hh * D, sl = (size_t)a.m * NHT * D;
    const int u = a.rows.useq[r], p = a.rows.pos[r];
    if (hh >= a.NH + a.NKV) { /* v: straight into the cache */
        float *dst = u < 0 ? NULL : kv_row(a, u, p, 1, hh - a.NH - a.NKV);
        for (int i = lane; i < D; i += 32) {
            float v = 0.f;
            for (int j = 0; j < ny; j++) v += y[j * sl + src + i], y[j * sl + src + i] = 0.f;
            if (dst) dst[i] = v;
        }
        return;
    }
    const float *nw = hh < a.NH ? qn : kn;
    float v0[4], v1[4], ss = 0.f; /* pairs (i, i + D/2), i = lane + 32t */
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int i = lane + 32 * t;
        v0[t] = v1[t] = 0.f;
        if (i < half) {
            for (int j = 0; j < ny; j++) {
                v0[t] += y[j * sl + src + i], v1[t] += y[j * sl + src + i + half];
                y[j * sl + src + i] = 0.f, y[j * sl + src + i + half] = 0.f;
            }
            ss += v0[t] * v0[t] + v1[t] * v1[t];
        }
    }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(ss / (float)D + a.eps);
    float *dst;
    if (hh < a.NH) {
        dst = qout + (size_t)r * a.NH * D + (size_t)hh * D;
    } else {
        if (u < 0) return;
        dst = kv_row(a, u, p, 0, hh - a.NH);
        if (!dst) return;
    }
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int i = lane + 32 * t;
        if (i < half) {
            float x0 = v0[t] * inv * nw[i], x1 = v1[t] * inv * nw[i + half];
            float ang = (float)p * a.inv_freq[i], c = cosf(ang), s = sinf(ang);
            dst[i] = x0 * c - x1 * s;
            dst[i + half] = x1 * c + x0 * s;
        }
    }
}

/* grid (NKV, m, n_splits), 128 threads: the keys of one (row, kv head) split into n_splits ranges. Each warp walks
 * its keys four at a time (block-table lookups, then all K and V rows loaded before use), keeping a float32 online
 * softmax per query head; the 4 warps merge in shared memory. With one split the block normalizes and writes o;
 * otherwise it writes {max, sum, o[G][D] unnormalized} per head to part, and the last block of the (row, kv head)
 * to finish (a counter, reset by that block) merges all splits and writes o. */
template <int G, int EPL>
__global__ void __launch_bounds__(128) k_attn(g3c_attn_args a, const float *__restrict__ q, float *__restrict__ part,
                                              unsigned *__restrict__ cnt, float *__restrict__ o,
                                              __nv_bfloat16 *__restrict__ oh, int split) {
    constexpr int NK = 4; /* keys per warp per step */
    g3c_pdl_wait();
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
    float qv[G][EPL], acc[G][EPL], mx[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        mx[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            int d = lane + 32 * e;
            qv[g][e] = d < D ? q[(size_t)r * a.NH * D + (size_t)(kh * G + g) * D + d] : 0.f;
            acc[g][e] = 0.f;
        }
    }
    for (int k = k0 + warp; k < k1; k += 4 * NK) {
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
    if (Se == 1) return;
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
}

cudaError_t g3c_qkv_post(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn, float *qout,
                         cudaStream_t st) {
    if (a->D > 256 || a->D % 2) return cudaErrorInvalidValue;
    dim3 grid(a->m, (a->NH + 2 * a->NKV + 3) / 4), blk(32, 4);
    return g3c_launch(k_qkv_post, grid, blk, 0, st, *a, y, ny, qn, kn, qout);
}

size_t g3c_attn_part_floats(int rows_x_splits, int NH, int D) { return (size_t)rows_x_splits * NH * (D + 2); }

template <int G>
static cudaError_t launch_g(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt, float *o,
                            __nv_bfloat16 *oh, int split, cudaStream_t st) {
    dim3 grid(a->NKV, a->m, a->n_splits);
    if (a->n_splits > 64) return cudaErrorInvalidValue;
    size_t sm = (size_t)(4 * G * (a->D + 2) + G * a->n_splits) * sizeof(float);
    int epl = (a->D + 31) / 32;
    if (epl <= 1) return g3c_launch(k_attn<G, 1>, grid, dim3(128), sm, st, *a, q, part, cnt, o, oh, split);
    if (epl <= 2) return g3c_launch(k_attn<G, 2>, grid, dim3(128), sm, st, *a, q, part, cnt, o, oh, split);
    if (epl <= 4) return g3c_launch(k_attn<G, 4>, grid, dim3(128), sm, st, *a, q, part, cnt, o, oh, split);
    if (epl <= 8) return g3c_launch(k_attn<G, 8>, grid, dim3(128), sm, st, *a, q, part, cnt, o, oh, split);
    return cudaErrorInvalidValue;
}

cudaError_t g3c_attention(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt, float *o,
                          __nv_bfloat16 *oh, int split, cudaStream_t st) {
    switch (a->NH / a->NKV) {
    case 1: return launch_g<1>(a, q, part, cnt, o, oh, split, st);
    case 2: return launch_g<2>(a, q, part, cnt, o, oh, split, st);
    case 4: return launch_g<4>(a, q, part, cnt, o, oh, split, st);
    case 8: return launch_g<8>(a, q, part, cnt, o, oh, split, st);
    }
    return cudaErrorInvalidValue;
}
