/* Row-wise kernels of the forward: embedding + first norm, residual add with post-norm fused with the next
 * pre-norm, GeGLU over interleaved (gate, up) outputs, bf16 (hi/lo) copies of activations for cuBLAS, logits
 * finishing (softcap) and argmax. One block per row for the norms; float32 arithmetic throughout. */
#include "backend/cuda/cuda_common.cuh"

#define NT 256

__device__ __forceinline__ float block_sum(float v, float *red) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = 0.f;
    for (int i = 0; i < NT / 32; i++) r += red[i];
    __syncthreads();
    return r;
}

__device__ __forceinline__ void put_bf16(__nv_bfloat16 *xh, int split, int m, int r, int ld, int i, float v) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    xh[(size_t)r * ld + i] = h;
    if (split) xh[(size_t)(m + r) * ld + i] = __float2bfloat16_rn(v - __bfloat162float(h));
}

__global__ void __launch_bounds__(NT) k_embed_norm(g3_dmat E, const int32_t *token, float scale, const float *w,
                                                   float eps, int m, int H, float *x, float *xn, __nv_bfloat16 *xh,
                                                   int split) {
    __shared__ float red[NT / 32];
    const int r = blockIdx.x;
    int tok = token[r];
    if (tok < 0 || tok >= E.n) tok = 0;
    float *xr = x + (size_t)r * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = dmat_val(E, (size_t)tok, i) * scale;
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float inv = 1.f / sqrtf(ss / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = xr[i] * inv * w[i];
        xn[(size_t)r * H + i] = v;
        if (xh) put_bf16(xh, split, m, r, H, i, v);
    }
}

__global__ void __launch_bounds__(NT) k_add_norm(float *x, const float *y, const float *y2, const float *w1,
                                                 const float *w2, float eps, int m, int H, float *xn,
                                                 __nv_bfloat16 *xh, int split) {
    __shared__ float red[NT / 32];
    const int r = blockIdx.x;
    const float *yr = y + (size_t)r * H, *y2r = y2 ? y2 + (size_t)r * H : NULL;
    float *xr = x + (size_t)r * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = yr[i] + (y2r ? y2r[i] : 0.f);
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float inv = 1.f / sqrtf(ss / (float)H + eps);
    float s2 = 0.f;
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = yr[i] + (y2r ? y2r[i] : 0.f);
        float h = xr[i] + v * inv * w1[i];
        xr[i] = h;
        s2 += h * h;
    }
    s2 = block_sum(s2, red);
    float inv2 = 1.f / sqrtf(s2 / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = xr[i] * inv2 * w2[i];
        xn[(size_t)r * H + i] = v;
        if (xh) put_bf16(xh, split, m, r, H, i, v);
    }
}

__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

__global__ void k_geglu(const float *y, const float *y2, int m, int F, float *a, __nv_bfloat16 *ah, int split) {
    size_t n = (size_t)m * F;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / F, i = e % F, j = r * 2 * F + 2 * i;
        float g = y[j] + (y2 ? y2[j] : 0.f), u = y[j + 1] + (y2 ? y2[j + 1] : 0.f);
        float v = gelu_tanh(g) * u;
        a[e] = v;
        if (ah) put_bf16(ah, split, m, (int)r, F, (int)i, v);
    }
}

__global__ void k_to_bf16(const float *x, int m, int n, __nv_bfloat16 *xh, int split) {
    size_t tot = (size_t)m * n;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < tot; e += (size_t)gridDim.x * blockDim.x)
        put_bf16(xh, split, m, (int)(e / n), n, (int)(e % n), x[e]);
}

__global__ void k_gather(const float *src, const int32_t *rows, int n, int w, float *dst) {
    size_t tot = (size_t)n * w;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < tot; e += (size_t)gridDim.x * blockDim.x)
        dst[e] = src[(size_t)rows[e / w] * w + e % w];
}

__global__ void k_finish(const float *y, const float *y2, size_t n, float cap, float *out) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float v = y[e] + (y2 ? y2[e] : 0.f);
        if (cap > 0.f) v = cap * tanhf(v / cap);
        out[e] = v;
    }
}

__global__ void __launch_bounds__(NT) k_argmax(const float *logits, int V, int32_t *ids) {
    __shared__ float bv[NT / 32];
    __shared__ int bi[NT / 32];
    const float *l = logits + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += NT) {
        float v = l[i];
        if (v > best) best = v, idx = i; /* first max of this thread's strided run */
    }
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) best = ov, idx = oi;
    }
    if ((threadIdx.x & 31) == 0) bv[threadIdx.x >> 5] = best, bi[threadIdx.x >> 5] = idx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < NT / 32; w++)
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) best = bv[w], idx = bi[w];
        ids[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}

static int grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    return g > 8192 ? 8192 : g < 1 ? 1 : (int)g;
}

cudaError_t g3c_embed_norm(const g3_dmat *E, const int32_t *token, float scale, const float *w, float eps, int m,
                           int H, float *x, float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st) {
    k_embed_norm<<<m, NT, 0, st>>>(*E, token, scale, w, eps, m, H, x, xn, xh, split);
    return cudaGetLastError();
}
cudaError_t g3c_add_norm(float *x, const float *y, const float *y2, const float *w1, const float *w2, float eps, int m,
                         int H, float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st) {
    k_add_norm<<<m, NT, 0, st>>>(x, y, y2, w1, w2, eps, m, H, xn, xh, split);
    return cudaGetLastError();
}
cudaError_t g3c_geglu(const float *y, const float *y2, int m, int F, float *a, __nv_bfloat16 *ah, int split,
                      cudaStream_t st) {
    k_geglu<<<grid_for((size_t)m * F), 256, 0, st>>>(y, y2, m, F, a, ah, split);
    return cudaGetLastError();
}
cudaError_t g3c_to_bf16(const float *x, int m, int n, __nv_bfloat16 *xh, int split, cudaStream_t st) {
    k_to_bf16<<<grid_for((size_t)m * n), 256, 0, st>>>(x, m, n, xh, split);
    return cudaGetLastError();
}
cudaError_t g3c_gather_rows(const float *src, const int32_t *rows, int n, int n_cols, float *dst, cudaStream_t st) {
    k_gather<<<grid_for((size_t)n * n_cols), 256, 0, st>>>(src, rows, n, n_cols, dst);
    return cudaGetLastError();
}
cudaError_t g3c_finish_logits(const float *y, const float *y2, int m, int V, float cap, float *out, cudaStream_t st) {
    k_finish<<<grid_for((size_t)m * V), 256, 0, st>>>(y, y2, (size_t)m * V, cap, out);
    return cudaGetLastError();
}
cudaError_t g3c_argmax(const float *logits, int m, int V, int32_t *ids, cudaStream_t st) {
    k_argmax<<<m, NT, 0, st>>>(logits, V, ids);
    return cudaGetLastError();
}
