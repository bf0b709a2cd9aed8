/* Attention over the paged KV cache: QK-norm + RoPE + cache write for each row's q/k/v, then flash-decoding
 * (each (row, kv head) pair's keys split across blocks, float32 online softmax, partials merged by a second
 * kernel). Every row reads its position and its sequence's block table from device memory, so the same launches
 * serve decode rows, prefill chunks and graph replays. GQA: kv head h serves query heads h*G .. h*G+G-1.
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

/* grid (m, ceil(heads/4)), block (32, 4): one warp per head of q, k or v. */
__global__ void k_qkv_post(g3c_attn_args a, const float *y, const float *y2, const float *qn, const float *kn,
                           float *qout) {
    const int r = blockIdx.x, hh = blockIdx.y * 4 + threadIdx.y, lane = threadIdx.x;
    const int D = a.D, NHT = a.NH + 2 * a.NKV, half = D / 2;
    if (hh >= NHT) return;
    const size_t src = (size_t)r * NHT * D + (size_t)hh * D;
    const int u = a.rows.useq[r], p = a.rows.pos[r];
    if (hh >= a.NH + a.NKV) { /* v: straight into the cache */
        if (u < 0) return;
        float *dst = kv_row(a, u, p, 1, hh - a.NH - a.NKV);
        if (!dst) return;
        for (int i = lane; i < D; i += 32) dst[i] = y[src + i] + (y2 ? y2[src + i] : 0.f);
        return;
    }
    const float *nw = hh < a.NH ? qn : kn;
    float v0[4], v1[4], ss = 0.f; /* pairs (i, i + D/2), i = lane + 32t */
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int i = lane + 32 * t;
        v0[t] = v1[t] = 0.f;
        if (i < half) {
            v0[t] = y[src + i] + (y2 ? y2[src + i] : 0.f);
            v1[t] = y[src + i + half] + (y2 ? y2[src + i + half] : 0.f);
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

/* grid (NKV, m, n_splits), 128 threads. Writes per split: {max, sum, o[G][D] unnormalized} for each q head. */
template <int G, int EPL>
__global__ void __launch_bounds__(128) k_attn(g3c_attn_args a, const float *__restrict__ q, float *__restrict__ part) {
    const int kh = blockIdx.x, r = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, D = a.D;
    const int u = a.rows.useq[r], p = a.rows.pos[r];
    int k0 = 0, k1 = 0;
    if (u >= 0) {
        int lo = a.kind == 1 ? max(0, p - a.window + 1) : 0;
        int n = p - lo + 1, chunk = (n + S - 1) / S;
        chunk = (chunk + 7) & ~7;
        k0 = lo + s * chunk, k1 = min(p + 1, k0 + chunk);
    }
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
    for (int k = k0 + warp; k < k1; k += 8) {
        const int nk = k + 4 < k1 ? 2 : 1;
        float kr[2][EPL], sc[2][G];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const float *kp = j < nk ? kv_row(a, u, k + 4 * j, 0, kh) : NULL;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                int d = lane + 32 * e;
                kr[j][e] = kp && d < D ? kp[d] : 0.f;
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                float t = 0.f;
#pragma unroll
                for (int e = 0; e < EPL; e++) t = fmaf(qv[g][e], kr[j][e], t);
                for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                t *= a.scale;
                if (a.softcap > 0.f) t = a.softcap * tanhf(t / a.softcap);
                sc[j][g] = (j < nk && kp) ? t : -INFINITY;
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if (j >= nk) break;
            const float *vp = kv_row(a, u, k + 4 * j, 1, kh);
            float vr[EPL];
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                int d = lane + 32 * e;
                vr[e] = vp && d < D ? vp[d] : 0.f;
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                float sv = sc[j][g];
                if (sv == -INFINITY) continue;
                float mn = fmaxf(mx[g], sv), corr = expf(mx[g] - mn), pw = expf(sv - mn);
                l[g] = l[g] * corr + pw;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[g][e] = acc[g][e] * corr + pw * vr[e];
                mx[g] = mn;
            }
        }
    }
    /* merge the 4 warps */
    extern __shared__ float sm[]; /* [4][G][D + 2] */
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
    for (int t = threadIdx.x; t < G * (D + 2); t += 128) {
        int g = t / W, c = t % W;
        float M = -INFINITY;
        for (int w = 0; w < 4; w++) M = fmaxf(M, sm[((size_t)w * G + g) * W]);
        float out;
        if (c == 0) {
            out = M;
        } else {
            out = 0.f;
            if (M != -INFINITY)
                for (int w = 0; w < 4; w++) {
                    const float *b = sm + ((size_t)w * G + g) * W;
                    if (b[0] != -INFINITY) out += b[c] * expf(b[0] - M);
                }
        }
        part[(((size_t)r * S + s) * a.NH + kh * G + g) * W + c] = out;
    }
}

/* grid (m, NH), block 128: merges the splits and normalizes. */
__global__ void k_attn_combine(const float *part, int S, int NH, int D, float *o, __nv_bfloat16 *oh, int split, int m) {
    const int r = blockIdx.x, h = blockIdx.y, W = D + 2;
    float M = -INFINITY;
    for (int s = 0; s < S; s++) M = fmaxf(M, part[(((size_t)r * S + s) * NH + h) * W]);
    float L = 0.f;
    if (M != -INFINITY)
        for (int s = 0; s < S; s++) {
            const float *b = part + (((size_t)r * S + s) * NH + h) * W;
            if (b[0] != -INFINITY) L += b[1] * expf(b[0] - M);
        }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        if (L > 0.f)
            for (int s = 0; s < S; s++) {
                const float *b = part + (((size_t)r * S + s) * NH + h) * W;
                if (b[0] != -INFINITY) acc += b[2 + d] * expf(b[0] - M);
            }
        float v = L > 0.f ? acc / L : 0.f;
        size_t idx = (size_t)r * NH * D + (size_t)h * D + d;
        o[idx] = v;
        if (oh) {
            __nv_bfloat16 hv = __float2bfloat16_rn(v);
            oh[idx] = hv;
            if (split) oh[(size_t)m * NH * D + idx] = __float2bfloat16_rn(v - __bfloat162float(hv));
        }
    }
}

cudaError_t g3c_qkv_post(const g3c_attn_args *a, const float *y, const float *y2, const float *qn, const float *kn,
                         float *qout, cudaStream_t st) {
    if (a->D > 256 || a->D % 2) return cudaErrorInvalidValue;
    dim3 grid(a->m, (a->NH + 2 * a->NKV + 3) / 4), blk(32, 4);
    k_qkv_post<<<grid, blk, 0, st>>>(*a, y, y2, qn, kn, qout);
    return cudaGetLastError();
}

size_t g3c_attn_part_floats(int rows_x_splits, int NH, int D) { return (size_t)rows_x_splits * NH * (D + 2); }

template <int G> static cudaError_t launch_g(const g3c_attn_args *a, const float *q, float *part, cudaStream_t st) {
    dim3 grid(a->NKV, a->m, a->n_splits);
    size_t sm = (size_t)4 * G * (a->D + 2) * sizeof(float);
    int epl = (a->D + 31) / 32;
    if (epl <= 1) k_attn<G, 1><<<grid, 128, sm, st>>>(*a, q, part);
    else if (epl <= 2) k_attn<G, 2><<<grid, 128, sm, st>>>(*a, q, part);
    else if (epl <= 4) k_attn<G, 4><<<grid, 128, sm, st>>>(*a, q, part);
    else if (epl <= 8) k_attn<G, 8><<<grid, 128, sm, st>>>(*a, q, part);
    else return cudaErrorInvalidValue;
    return cudaGetLastError();
}

cudaError_t g3c_attention(const g3c_attn_args *a, const float *q, float *part, float *o, __nv_bfloat16 *oh, int split,
                          cudaStream_t st) {
    int G = a->NH / a->NKV;
    cudaError_t e;
    switch (G) {
    case 1: e = launch_g<1>(a, q, part, st); break;
    case 2: e = launch_g<2>(a, q, part, st); break;
    case 4: e = launch_g<4>(a, q, part, st); break;
    case 8: e = launch_g<8>(a, q, part, st); break;
    default: return cudaErrorInvalidValue;
    }
    if (e != cudaSuccess) return e;
    k_attn_combine<<<dim3(a->m, a->NH), 128, 0, st>>>(part, a->n_splits, a->NH, a->D, o, oh, split, a->m);
    return cudaGetLastError();
}
