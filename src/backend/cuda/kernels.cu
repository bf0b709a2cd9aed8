/* Row-wise kernels of the forward: embedding + first norm, residual add with post-norm fused with the next
 * pre-norm, GeGLU over interleaved (gate, up) outputs, bf16 (hi/lo) copies of activations for the tensor-core
 * kernels and cuBLAS, logits finishing (softcap) and argmax. One block per row for the norms; float32 arithmetic
 * throughout. Kernels that consume a matrix product's output sum its slices and zero them (cuda_common.cuh).
 * Many rows (prefill): variants with 16-byte accesses whose loads are all issued before any store (the zeroing
 * stores into y otherwise serialize each thread's loads), chosen by row count; $G3_CUDA_ROWK=0 keeps the old ones.
 * Their _f entry points take G3C_KEEP_Y / G3C_NO_F32 (cuda_common.cuh); the other variants ignore the flags. */
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/tq_act.cuh"

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
    g3c_pdl_wait();
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

__global__ void __launch_bounds__(NT) k_add_norm(float *x, float *y, int ny, const float *w1, const float *w2,
                                                 float eps, int m, int H, float *xn, __nv_bfloat16 *xh, int split) {
    __shared__ float red[NT / 32];
    g3c_pdl_wait();
    const int r = blockIdx.x;
    const size_t sl = (size_t)m * H;
    float *yr = y + (size_t)r * H;
    float *xr = x + (size_t)r * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = 0.f;
        for (int j = 0; j < ny; j++) v += yr[j * sl + i];
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float inv = 1.f / sqrtf(ss / (float)H + eps);
    float s2 = 0.f;
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = 0.f;
        for (int j = 0; j < ny; j++) v += yr[j * sl + i], yr[j * sl + i] = 0.f;
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

/* The same with the row held in registers by 1024 threads (EPT values each, H <= 1024*EPT): one pass over y and x
 * instead of three, for the latency-bound decode rows. */
template <int EPT>
__global__ void __launch_bounds__(1024) k_add_norm_r(float *x, float *y, int ny, const float *w1, const float *w2,
                                                     float eps, int m, int H, float *xn, __nv_bfloat16 *xh,
                                                     int split) {
    __shared__ float red[32];
    g3c_pdl_wait();
    const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t sl = (size_t)m * H;
    float *yr = y + (size_t)r * H, *xr = x + (size_t)r * H;
    float v[EPT], xv[EPT], ss = 0.f;
#pragma unroll
    for (int e = 0; e < EPT; e++) {
        const int i = threadIdx.x + 1024 * e;
        v[e] = 0.f, xv[e] = 0.f;
        if (i < H) {
            for (int j = 0; j < ny; j++) v[e] += yr[j * sl + i], yr[j * sl + i] = 0.f;
            xv[e] = xr[i];
        }
        ss += v[e] * v[e];
    }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    ss = red[lane];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(ss / (float)H + eps);
    float s2 = 0.f;
#pragma unroll
    for (int e = 0; e < EPT; e++) {
        const int i = threadIdx.x + 1024 * e;
        if (i < H) {
            xv[e] += v[e] * inv * w1[i];
            xr[i] = xv[e];
            s2 += xv[e] * xv[e];
        }
    }
    __syncthreads(); /* red reused */
    for (int o = 16; o; o >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    if (lane == 0) red[warp] = s2;
    __syncthreads();
    s2 = red[lane];
    for (int o = 16; o; o >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    const float inv2 = 1.f / sqrtf(s2 / (float)H + eps);
#pragma unroll
    for (int e = 0; e < EPT; e++) {
        const int i = threadIdx.x + 1024 * e;
        if (i < H) {
            const float o = xv[e] * inv2 * w2[i];
            xn[(size_t)r * H + i] = o;
            if (xh) put_bf16(xh, split, m, r, H, i, o);
        }
    }
}

__global__ void k_geglu(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah, int split) {
    g3c_pdl_wait();
    const size_t n = (size_t)m * F, sl = 2 * n;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / F, i = e % F, j = r * 2 * F + 2 * i;
        float g = 0.f, u = 0.f;
        for (int s = 0; s < ny; s++) {
            float2 p = *(float2 *)(y + s * sl + j);
            g += p.x, u += p.y;
            *(float2 *)(y + s * sl + j) = make_float2(0.f, 0.f);
        }
        float v = gelu_tanh(g) * u;
        a[e] = v;
        if (ah) put_bf16(ah, split, m, (int)r, F, (int)i, v);
    }
}

__global__ void k_to_bf16(const float *x, int m, int n, __nv_bfloat16 *xh, int split) {
    g3c_pdl_wait();
    size_t tot = (size_t)m * n;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < tot; e += (size_t)gridDim.x * blockDim.x)
        put_bf16(xh, split, m, (int)(e / n), n, (int)(e % n), x[e]);
}

__global__ void k_gather(const float *src, const int32_t *rows, int n, int w, float *dst) {
    g3c_pdl_wait();
    size_t tot = (size_t)n * w;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < tot; e += (size_t)gridDim.x * blockDim.x)
        dst[e] = src[(size_t)rows[e / w] * w + e % w];
}

__global__ void k_finish(float *y, int ny, size_t n, float cap, float *out) {
    g3c_pdl_wait();
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float v = 0.f;
        for (int s = 0; s < ny; s++) v += y[s * n + e], y[s * n + e] = 0.f;
        if (cap > 0.f) v = cap * tanhf(v / cap);
        out[e] = v;
    }
}

__global__ void __launch_bounds__(NT) k_argmax(const float *logits, int V, int32_t *ids) {
    __shared__ float bv[NT / 32];
    __shared__ int bi[NT / 32];
    g3c_pdl_wait();
    const float *l = logits + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += NT) {
        float v = l[i];
        if (v > best) best = v, idx = i; /* first max of this thread's strided run */
    }
    g3c_warp_argmax(best, idx);
    if ((threadIdx.x & 31) == 0) bv[threadIdx.x >> 5] = best, bi[threadIdx.x >> 5] = idx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < NT / 32; w++)
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) best = bv[w], idx = bi[w];
        ids[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}

/* ---- many rows ------------------------------------------------------------------------------------------- */
/* 4 consecutive values (index i, a multiple of 4) into bf16 hi rows and, when split, lo rows at +lo_off. */
__device__ __forceinline__ void put_bf16x4(__nv_bfloat16 *xh, int split, size_t lo_off, size_t i, float4 v) {
    const __nv_bfloat162 h0 = __floats2bfloat162_rn(v.x, v.y), h1 = __floats2bfloat162_rn(v.z, v.w);
    __nv_bfloat162 *d = (__nv_bfloat162 *)(xh + i);
    d[0] = h0, d[1] = h1;
    if (split) {
        const float2 f0 = __bfloat1622float2(h0), f1 = __bfloat1622float2(h1);
        __nv_bfloat162 *e = (__nv_bfloat162 *)(xh + lo_off + i);
        e[0] = __floats2bfloat162_rn(v.x - f0.x, v.y - f0.y), e[1] = __floats2bfloat162_rn(v.z - f1.x, v.w - f1.y);
    }
}
__device__ __forceinline__ float4 f4add(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* One 256-thread block per row, the row in registers (V4 float4 per thread: H <= 1024 V4): y slices, x and the
 * weights are all loaded first, then y is zeroed, x updated and xn / xh written, each with 16-byte accesses. */
template <int V4>
__global__ void __launch_bounds__(NT) k_add_norm_v(float *x, float *y, int ny, const float *w1, const float *w2,
                                                   float eps, int m, int H, float *xn, __nv_bfloat16 *xh, int split,
                                                   int flags) {
    __shared__ float red[NT / 32];
    g3c_pdl_wait();
    const int r = blockIdx.x, H4 = H / 4;
    const size_t sl4 = (size_t)m * H4, rb = (size_t)r * H;
    float4 *yr = (float4 *)(y + rb), *xr = (float4 *)(x + rb);
    const float4 *w14 = (const float4 *)w1, *w24 = (const float4 *)w2;
    float4 v[V4], xv[V4];
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < V4; e++) {
        const int i = threadIdx.x + NT * e;
        v[e] = xv[e] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < H4) {
            v[e] = yr[i];
            for (int j = 1; j < ny; j++) v[e] = f4add(v[e], yr[j * sl4 + i]);
            xv[e] = xr[i];
        }
    }
#pragma unroll
    for (int e = 0; e < V4; e++) {
        const int i = threadIdx.x + NT * e;
        if (i < H4 && !(flags & G3C_KEEP_Y))
            for (int j = 0; j < ny; j++) yr[j * sl4 + i] = make_float4(0.f, 0.f, 0.f, 0.f);
        ss += v[e].x * v[e].x + v[e].y * v[e].y + v[e].z * v[e].z + v[e].w * v[e].w;
    }
    ss = block_sum(ss, red);
    const float inv = 1.f / sqrtf(ss / (float)H + eps);
    float s2 = 0.f;
#pragma unroll
    for (int e = 0; e < V4; e++) {
        const int i = threadIdx.x + NT * e;
        if (i < H4) {
            const float4 w = w14[i];
            xv[e].x += v[e].x * inv * w.x, xv[e].y += v[e].y * inv * w.y;
            xv[e].z += v[e].z * inv * w.z, xv[e].w += v[e].w * inv * w.w;
            xr[i] = xv[e];
            s2 += xv[e].x * xv[e].x + xv[e].y * xv[e].y + xv[e].z * xv[e].z + xv[e].w * xv[e].w;
        }
    }
    s2 = block_sum(s2, red);
    const float inv2 = 1.f / sqrtf(s2 / (float)H + eps);
#pragma unroll
    for (int e = 0; e < V4; e++) {
        const int i = threadIdx.x + NT * e;
        if (i < H4) {
            const float4 w = w24[i];
            const float4 o = make_float4(xv[e].x * inv2 * w.x, xv[e].y * inv2 * w.y, xv[e].z * inv2 * w.z,
                                         xv[e].w * inv2 * w.w);
            if (!(flags & G3C_NO_F32) || !xh) ((float4 *)(xn + rb))[i] = o;
            if (xh) put_bf16x4(xh, split, (size_t)m * H, rb + (size_t)4 * i, o);
        }
    }
}

/* GeGLU, 4 outputs per thread: two float4 (gate, up, gate, up) per slice, every slice loaded before zeroing.
 * xq (optional, F % 128 == 0): the outputs also quantized for the int8 tensor-core product (tq_act.cuh); the 32
 * lanes of a warp hold one block of 128 (consecutive e, warp-aligned, F / 4 a multiple of 32). a and ah may be NULL
 * (with xq: the product reads only the quantized copy). */
__global__ void __launch_bounds__(256) k_geglu4(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah,
                                                int split, int flags, int8_t *xq, float2 *xd, int il) {
    g3c_pdl_wait();
    const int F4 = F / 4, n4 = m * F4;
    const size_t sl4 = (size_t)m * F / 2; /* slice stride in float4: 2 m F floats */
    float4 *y4 = (float4 *)y;
    for (int e = blockIdx.x * 256 + threadIdx.x; e < n4; e += gridDim.x * 256) {
        const int r = e / F4, i4 = e - r * F4;
        const size_t j = (size_t)r * F4 * 2 + (size_t)2 * i4; /* float4 index of (g0, u0, g1, u1) */
        float4 p0 = y4[j], p1 = y4[j + 1];
        if (ny > 1) {
            const float4 q0 = y4[sl4 + j], q1 = y4[sl4 + j + 1];
            p0 = f4add(p0, q0), p1 = f4add(p1, q1);
        }
        if (!(flags & G3C_KEEP_Y)) {
            y4[j] = y4[j + 1] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (ny > 1) y4[sl4 + j] = y4[sl4 + j + 1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        const float4 v = flags & G3C_GELU_TANHF ? make_float4(gelu_tanh_ref(p0.x) * p0.y, gelu_tanh_ref(p0.z) * p0.w,
                                                              gelu_tanh_ref(p1.x) * p1.y, gelu_tanh_ref(p1.z) * p1.w)
                                                : make_float4(gelu_tanh(p0.x) * p0.y, gelu_tanh(p0.z) * p0.w,
                                                              gelu_tanh(p1.x) * p1.y, gelu_tanh(p1.z) * p1.w);
        if (a && (!(flags & G3C_NO_F32) || !ah)) ((float4 *)a)[e] = v;
        if (ah) put_bf16x4(ah, split, (size_t)m * F, (size_t)4 * e, v);
        if (xq) g3c_tq_quant4(v, true, xq, (size_t)4 * (e & ~31), xd + (e >> 5), il, F); /* n4 % 32 == 0 */
    }
}

__global__ void __launch_bounds__(256) k_to_bf16_4(const float *x, int n4, size_t lo_off, __nv_bfloat16 *xh,
                                                   int split) {
    g3c_pdl_wait();
    for (int e = blockIdx.x * 256 + threadIdx.x; e < n4; e += gridDim.x * 256)
        put_bf16x4(xh, split, lo_off, (size_t)4 * e, ((const float4 *)x)[e]);
}

__global__ void __launch_bounds__(256) k_finish4(float *y, int ny, size_t n4, float cap, float *out) {
    g3c_pdl_wait();
    float4 *y4 = (float4 *)y;
    for (size_t e = blockIdx.x * (size_t)256 + threadIdx.x; e < n4; e += (size_t)gridDim.x * 256) {
        float4 v = y4[e];
        if (ny > 1) v = f4add(v, y4[n4 + e]);
        y4[e] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ny > 1) y4[n4 + e] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (cap > 0.f)
            v = make_float4(cap * tanhf(v.x / cap), cap * tanhf(v.y / cap), cap * tanhf(v.z / cap),
                            cap * tanhf(v.w / cap));
        ((float4 *)out)[e] = v;
    }
}

/* 1 when $G3_CUDA_NOZERO=1 (read at every call). Off by default: the row kernels' flags passed their kernel tests on
 * the H200, but the whole-model protocol (y left dirty through the layers, cleared once at the end) has not run
 * through test_cuda_model on a GPU yet. */
int g3c_nozero_enabled(void) {
    const char *e = getenv("G3_CUDA_NOZERO");
    return e && !strcmp(e, "1");
}

/* 1 unless $G3_CUDA_ROWK=0 (read at every call, so tests and benchmarks can switch). */
int g3c_rowk_enabled(void) {
    const char *e = getenv("G3_CUDA_ROWK");
    return !(e && !strcmp(e, "0"));
}

static int grid4(size_t n4) { /* blocks of 256 threads, one float4 each, at most 65535 (then grid-stride) */
    size_t g = (n4 + 255) / 256;
    return g > 65535 ? 65535 : g < 1 ? 1 : (int)g;
}

static int grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    return g > 8192 ? 8192 : g < 1 ? 1 : (int)g;
}

int g3c_pdl_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("G3_CUDA_PDL");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

cudaError_t g3c_embed_norm(const g3_dmat *E, const int32_t *token, float scale, const float *w, float eps, int m,
                           int H, float *x, float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st) {
    return g3c_launch(k_embed_norm, dim3(m), dim3(NT), 0, st, *E, token, scale, w, eps, m, H, x, xn, xh, split);
}
cudaError_t g3c_add_norm(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m, int H,
                         float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st) {
    return g3c_add_norm_f(x, y, ny, w1, w2, eps, m, H, xn, xh, split, 0, st);
}
cudaError_t g3c_add_norm_f(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m, int H,
                           float *xn, __nv_bfloat16 *xh, int split, int flags, cudaStream_t st) {
    void (*k)(float *, float *, int, const float *, const float *, float, int, int, float *, __nv_bfloat16 *, int) =
        H <= 2048 ? k_add_norm_r<2> : H <= 4096 ? k_add_norm_r<4> : H <= 6144 ? k_add_norm_r<6> : k_add_norm_r<8>;
    /* register version for decode-sized batches, the three-pass one for prefill (each measured faster in its
     * regime on the H200); $G3_CUDA_NORM=loop|reg forces one */
    const char *ne = getenv("G3_CUDA_NORM");
    const int loop = ne && !strcmp(ne, "loop") ? 1 : ne && !strcmp(ne, "reg") ? 0 : m > 64;
    if (H <= 8192 && !loop) return g3c_launch(k, dim3(m), dim3(1024), 0, st, x, y, ny, w1, w2, eps, m, H, xn, xh, split);
    if (!(ne && !strcmp(ne, "loop")) && g3c_rowk_enabled() && H <= 8192 && H % 4 == 0) { /* many rows */
        void (*kv)(float *, float *, int, const float *, const float *, float, int, int, float *, __nv_bfloat16 *,
                   int, int) = H <= 2048 ? k_add_norm_v<2> : H <= 4096 ? k_add_norm_v<4> : H <= 6144 ? k_add_norm_v<6>
                                                                                              : k_add_norm_v<8>;
        return g3c_launch(kv, dim3(m), dim3(NT), 0, st, x, y, ny, w1, w2, eps, m, H, xn, xh, split, flags);
    }
    return g3c_launch(k_add_norm, dim3(m), dim3(NT), 0, st, x, y, ny, w1, w2, eps, m, H, xn, xh, split);
}
cudaError_t g3c_geglu(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah, int split, cudaStream_t st) {
    return g3c_geglu_f(y, ny, m, F, a, ah, split, 0, st);
}
static int gelu_flag(void) { /* $G3_CUDA_GELU=tanhf: the many-row GeGLU kernel with tanhf (read once) */
    static int f = -1;
    if (f < 0) {
        const char *e = getenv("G3_CUDA_GELU");
        f = e && !strcmp(e, "tanhf") ? G3C_GELU_TANHF : 0;
    }
    return f;
}
cudaError_t g3c_geglu_f(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah, int split, int flags,
                        cudaStream_t st) {
    flags |= gelu_flag();
    if (m >= G3C_ROWK_MIN && ny <= 2 && F % 4 == 0 && g3c_rowk_enabled())
        return g3c_launch(k_geglu4, dim3(grid4((size_t)m * F / 4)), dim3(256), 0, st, y, ny, m, F, a, ah, split,
                          flags, (int8_t *)NULL, (float2 *)NULL, 0);
    return g3c_launch(k_geglu, dim3(grid_for((size_t)m * F)), dim3(256), 0, st, y, ny, m, F, a, ah, split);
}
int g3c_gelu_tanhf(void) { return gelu_flag() != 0; }

cudaError_t g3c_geglu_tq(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah, int split, int8_t *xq,
                         float2 *xd, int il, cudaStream_t st) {
    if (F % 128 || ny > 2) return cudaErrorInvalidValue;
    return g3c_launch(k_geglu4, dim3(grid4((size_t)m * F / 4)), dim3(256), 0, st, y, ny, m, F, a, ah, split,
                      gelu_flag(), xq, xd, il);
}
cudaError_t g3c_to_bf16(const float *x, int m, int n, __nv_bfloat16 *xh, int split, cudaStream_t st) {
    if (m >= G3C_ROWK_MIN && n % 4 == 0 && g3c_rowk_enabled())
        return g3c_launch(k_to_bf16_4, dim3(grid4((size_t)m * n / 4)), dim3(256), 0, st, x, m * n / 4,
                          (size_t)m * n, xh, split);
    return g3c_launch(k_to_bf16, dim3(grid_for((size_t)m * n)), dim3(256), 0, st, x, m, n, xh, split);
}
cudaError_t g3c_gather_rows(const float *src, const int32_t *rows, int n, int n_cols, float *dst, cudaStream_t st) {
    return g3c_launch(k_gather, dim3(grid_for((size_t)n * n_cols)), dim3(256), 0, st, src, rows, n, n_cols, dst);
}
/* The same over many rows: a grid of a few blocks per SM striding over the float4s, FI of them in flight per thread
 * (k_finish4's one float4 per thread makes 16384 blocks at 64 rows of 262144 logits) */
#define FI 4
__global__ void __launch_bounds__(256) k_finish4s(float *y, int ny, size_t n4, float cap, float *out) {
    g3c_pdl_wait();
    float4 *y4 = (float4 *)y;
    const size_t stride = (size_t)gridDim.x * 256;
    for (size_t e0 = blockIdx.x * (size_t)256 + threadIdx.x; e0 < n4; e0 += FI * stride) {
        float4 v[FI];
#pragma unroll
        for (int h = 0; h < FI; h++) {
            const size_t e = e0 + h * stride;
            v[h] = e < n4 ? __ldcg(y4 + e) : make_float4(0.f, 0.f, 0.f, 0.f);
            if (ny > 1 && e < n4) v[h] = f4add(v[h], __ldcg(y4 + n4 + e));
        }
#pragma unroll
        for (int h = 0; h < FI; h++) {
            const size_t e = e0 + h * stride;
            if (e >= n4) continue;
            y4[e] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (ny > 1) y4[n4 + e] = make_float4(0.f, 0.f, 0.f, 0.f);
            float4 o = v[h];
            if (cap > 0.f)
                o = make_float4(cap * tanhf(o.x / cap), cap * tanhf(o.y / cap), cap * tanhf(o.z / cap),
                                cap * tanhf(o.w / cap));
            __stcs((float4 *)out + e, o);
        }
    }
}

/* $G3_CUDA_FIN=1: k_finish4 (one float4 a thread) at any size; by default k_finish4s from 256 K float4s (4 rows of 262144 logits) (read at every
 * call) */
static int finish_strided(size_t n4) {
    const char *e = getenv("G3_CUDA_FIN");
    return !(e && !strcmp(e, "1")) && n4 >= 262144;
}

int g3c_dev_sms(void) {
    static int n_sm = 0;
    if (!n_sm) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n_sm < 1)
            n_sm = 132;
    }
    return n_sm;
}

cudaError_t g3c_finish_logits(float *y, int ny, int m, int V, float cap, float *out, cudaStream_t st) {
    if (V % 4 == 0 && ny <= 2 && g3c_rowk_enabled()) { /* wide rows: vectorized at any m */
        const size_t n4 = (size_t)m * V / 4;
        if (finish_strided(n4)) {
            const size_t want = (n4 + FI * 256 - 1) / (FI * 256), most = (size_t)g3c_dev_sms() * 4;
            return g3c_launch(k_finish4s, dim3((unsigned)(want < most ? want : most)), dim3(256), 0, st, y, ny, n4,
                              cap, out);
        }
        return g3c_launch(k_finish4, dim3(grid4(n4)), dim3(256), 0, st, y, ny, n4, cap, out);
    }
    return g3c_launch(k_finish, dim3(grid_for((size_t)m * V)), dim3(256), 0, st, y, ny, (size_t)m * V, cap, out);
}
cudaError_t g3c_argmax(const float *logits, int m, int V, int32_t *ids, cudaStream_t st) {
    return g3c_launch(k_argmax, dim3(m), dim3(NT), 0, st, logits, V, ids);
}
