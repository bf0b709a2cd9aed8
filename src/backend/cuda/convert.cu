/* Weight conversion at load, on the device: raw tensors in any supported file type (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; block layouts in src/model/dtype.h) become one of the resident formats of
 * cuda_common.cuh, either as a lossless repack of a quantized source (Q8_0 and Q5_0 -> int8/32, Q6_K -> int8/16,
 * Q4_0, Q4_1 and Q4_K -> int4/32 affine), as a near-lossless one (Q5_1 and Q5_K, whose 32 levels with an offset
 * fit neither form exactly -> int8/32 with float16 scales: the added rounding is at most 1/254 of a group's largest
 * magnitude, against a source step of 1/31 of its range) or as a quantization of float values (bf16; int8 and fp8
 * per output channel; int4 affine in groups of 128).
 * Also: deterministic random bf16 fill (benchmarks) and dequantization back to bf16/f32. */
#include <cuda_fp16.h>
#include <stdarg.h>

#include "backend/cuda/cuda_common.cuh"

g3_status g3c_fail(g3_error *err, g3_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

/* ---- source element access ---------------------------------------------------------------------------------- */
__device__ __forceinline__ uint16_t u16le(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
__device__ __forceinline__ float h2f(const uint8_t *p) { return __half2float(__ushort_as_half(u16le(p))); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Q4_K sub-block sb's (0..7, of a 144-byte block) 6-bit scale a and min m */
__device__ __forceinline__ void q4k_am(const uint8_t *blk, int sb, int *a, int *m) {
    const uint8_t *sc = blk + 4;
    if (sb < 4) {
        *a = sc[sb] & 63, *m = sc[sb + 4] & 63;
    } else {
        *a = (sc[sb + 4] & 0xF) | ((sc[sb - 4] >> 6) << 4);
        *m = (sc[sb + 4] >> 4) | ((sc[sb] >> 6) << 4);
    }
}
/* its scale and offset: s = d a, z = -dmin m (a, m: q4k_am's) */
__device__ __forceinline__ void q4k_sz(const uint8_t *blk, int a, int m, float *s, float *z) {
    *s = h2f(blk) * (float)a;
    *z = -h2f(blk + 2) * (float)m;
}
__device__ __forceinline__ void q4k_sm(const uint8_t *blk, int sb, float *s, float *z) {
    int a, m;
    q4k_am(blk, sb, &a, &m);
    q4k_sz(blk, a, m, s, z);
}
__device__ __forceinline__ int q4k_q(const uint8_t *blk, int j) { /* j in 0..255 */
    int c = j >> 6, w = j & 63;
    uint8_t b = blk[16 + 32 * c + (w & 31)];
    return w < 32 ? (b & 15) : (b >> 4);
}
__device__ __forceinline__ int q6k_q(const uint8_t *blk, int j) { /* q - 32, j in 0..255 */
    int n = j >> 7, r = j & 127, l = r & 31, qu = r >> 5;
    const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
    int lo = (qu & 1) ? ql[l + 32] : ql[l];
    lo = (qu & 2) ? (lo >> 4) : (lo & 15);
    int hi = (qh[l] >> (2 * qu)) & 3;
    return (lo | (hi << 4)) - 32;
}
__device__ __forceinline__ float q6k_s(const uint8_t *blk, int j) {
    int n = j >> 7, r = j & 127, l = r & 31, qu = r >> 5;
    return h2f(blk + 208) * (float)(int8_t)blk[192 + 8 * n + 2 * qu + (l >> 4)];
}

/* nibble of value j (0..31) of a 32-value block's qs[16]: low nibbles values 0..15, high nibbles 16..31 */
__device__ __forceinline__ int q4_q(const uint8_t *qs, int j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }
/* 5-bit code of value j (0..31) of a Q5_0 / Q5_1 block whose qh starts at byte h (qs 4 bytes later) */
__device__ __forceinline__ int q5_q(const uint8_t *blk, int h, int j) {
    return q4_q(blk + h + 4, j) | (((blk[h + j / 8] >> (j % 8)) & 1) << 4);
}
/* 5-bit code of value j (0..255) of a Q5_K block (176 bytes: d, dmin, scales[12], qh[32], qs[128]) */
__device__ __forceinline__ int q5k_q(const uint8_t *blk, int j) {
    int c = j >> 6, w = j & 63, l = j & 31;
    uint8_t b = blk[48 + 32 * c + l];
    return (w < 32 ? (b & 15) : (b >> 4)) | (((blk[16 + l] >> (j >> 5)) & 1) << 4);
}

__device__ float src_val(const uint8_t *row, uint32_t t, int i) {
    switch (t) {
    case G3_DTYPE_F32: return ((const float *)row)[i];
    case G3_DTYPE_F16: return h2f(row + 2 * (size_t)i);
    case G3_DTYPE_BF16: return bf2f((uint16_t)(row[2 * (size_t)i] | (row[2 * (size_t)i + 1] << 8)));
    case G3_DTYPE_Q8_0: {
        const uint8_t *b = row + (size_t)(i / 32) * 34;
        return h2f(b) * (float)(int8_t)b[2 + i % 32];
    }
    case G3_DTYPE_Q4_0: {
        const uint8_t *b = row + (size_t)(i / 32) * 18;
        return h2f(b) * (float)(q4_q(b + 2, i % 32) - 8);
    }
    case G3_DTYPE_Q4_K: {
        const uint8_t *b = row + (size_t)(i / 256) * 144;
        float s, z;
        q4k_sm(b, (i % 256) / 32, &s, &z);
        return s * (float)q4k_q(b, i % 256) + z;
    }
    case G3_DTYPE_Q6_K: {
        const uint8_t *b = row + (size_t)(i / 256) * 210;
        return q6k_s(b, i % 256) * (float)q6k_q(b, i % 256);
    }
    case G3_DTYPE_Q4_1: {
        const uint8_t *b = row + (size_t)(i / 32) * 20;
        return h2f(b) * (float)q4_q(b + 4, i % 32) + h2f(b + 2);
    }
    case G3_DTYPE_Q5_0: {
        const uint8_t *b = row + (size_t)(i / 32) * 22;
        return h2f(b) * (float)(q5_q(b, 2, i % 32) - 16);
    }
    case G3_DTYPE_Q5_1: {
        const uint8_t *b = row + (size_t)(i / 32) * 24;
        return h2f(b) * (float)q5_q(b, 4, i % 32) + h2f(b + 2);
    }
    case G3_DTYPE_Q5_K: {
        const uint8_t *b = row + (size_t)(i / 256) * 176;
        float s, z;
        q4k_sm(b, (i % 256) / 32, &s, &z);
        return s * (float)q5k_q(b, i % 256) + z;
    }
    }
    return 0.f;
}

size_t g3c_src_row_bytes(uint32_t t, int k) {
    switch (t) {
    case G3_DTYPE_F32: return (size_t)k * 4;
    case G3_DTYPE_F16:
    case G3_DTYPE_BF16: return (size_t)k * 2;
    case G3_DTYPE_Q8_0: return (size_t)k / 32 * 34;
    case G3_DTYPE_Q4_0: return (size_t)k / 32 * 18;
    case G3_DTYPE_Q4_K: return (size_t)k / 256 * 144;
    case G3_DTYPE_Q6_K: return (size_t)k / 256 * 210;
    case G3_DTYPE_Q4_1: return (size_t)k / 32 * 20;
    case G3_DTYPE_Q5_0: return (size_t)k / 32 * 22;
    case G3_DTYPE_Q5_1: return (size_t)k / 32 * 24;
    case G3_DTYPE_Q5_K: return (size_t)k / 256 * 176;
    }
    return 0;
}

static int is_float_type(uint32_t t) { return t == G3_DTYPE_F32 || t == G3_DTYPE_F16 || t == G3_DTYPE_BF16; }

int g3c_target_format(uint32_t t, int want, int k, int *g) {
    *g = k;
    if (is_float_type(t)) {
        if (want == G3Q_INT4) {
            *g = k % 128 == 0 ? 128 : k % 64 == 0 ? 64 : k % 32 == 0 ? 32 : 0;
            return *g ? G3Q_INT4 : -1;
        }
        if (want == G3Q_INT8 || want == G3Q_FP8) return k % 16 == 0 ? want : -1;
        return k % 8 == 0 ? G3Q_BF16 : -1;
    }
    if ((t == G3_DTYPE_Q8_0 || t == G3_DTYPE_Q5_0 || t == G3_DTYPE_Q5_1) && k % 32 == 0) return *g = 32, G3Q_INT8;
    if (t == G3_DTYPE_Q5_K && k % 256 == 0) return *g = 32, G3Q_INT8;
    if (t == G3_DTYPE_Q6_K && k % 256 == 0) return *g = 16, G3Q_INT8;
    if (((t == G3_DTYPE_Q4_0 || t == G3_DTYPE_Q4_1) && k % 32 == 0) || (t == G3_DTYPE_Q4_K && k % 256 == 0))
        return *g = 32, G3Q_INT4;
    return -1;
}

int g3c_can_convert(uint32_t t, int qt, int g) {
    if (!g3c_src_row_bytes(t, 32 * 256)) return 0;
    if (qt == G3Q_BF16) return 1;
    if (is_float_type(t)) return qt == G3Q_INT4 ? (g % 32 == 0) : 1;
    if (t == G3_DTYPE_Q8_0 || t == G3_DTYPE_Q5_0 || t == G3_DTYPE_Q5_1 || t == G3_DTYPE_Q5_K)
        return qt == G3Q_INT8 && g == 32;
    if (t == G3_DTYPE_Q6_K) return qt == G3Q_INT8 && g == 16;
    return qt == G3Q_INT4 && g == 32; /* Q4_0, Q4_1, Q4_K */
}

size_t g3c_dmat_bytes(int qt, int n, int k, int g) {
    size_t nk = (size_t)n * k, ng = (size_t)n * (k / g);
    switch (qt) {
    case G3Q_BF16: return nk * 2;
    case G3Q_INT8:
    case G3Q_FP8: return nk + ng * 4;
    case G3Q_INT4: return nk / 2 + ng * 8;
    }
    return 0;
}

/* ---- conversion kernel: one block of 256 threads per source row ----------------------------------------------- */
__device__ __forceinline__ float block_max(float v, float *red) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) r = fmaxf(r, red[i]);
    __syncthreads();
    return r;
}

__global__ void k_convert(const uint8_t *src, size_t src_rb, uint32_t t, g3_dmat d, int row0, int step) {
    __shared__ float red[32];
    const int k = d.k, g = d.g, ng = k / g;
    const uint8_t *row = src + (size_t)blockIdx.x * src_rb;
    const size_t n = (size_t)row0 + (size_t)blockIdx.x * step; /* destination row */
    if (d.qt == G3Q_BF16) {
        __nv_bfloat16 *o = (__nv_bfloat16 *)d.q + n * k;
        for (int i = threadIdx.x; i < k; i += blockDim.x) o[i] = __float2bfloat16_rn(src_val(row, t, i));
        return;
    }
    if (d.qt == G3Q_INT8 || d.qt == G3Q_FP8) {
        int8_t *o = (int8_t *)d.q + n * k;
        float *s = d.s + n * ng;
        if (t == G3_DTYPE_Q8_0) { /* exact: q as stored, s = d per 32 */
            for (int i = threadIdx.x; i < k; i += blockDim.x) o[i] = (int8_t)row[(size_t)(i / 32) * 34 + 2 + i % 32];
            for (int b = threadIdx.x; b < ng; b += blockDim.x) {
                s[b] = h2f(row + (size_t)b * 34);
                if (d.kc) d.kc[n * ng + b] = u16le(row + (size_t)b * 34);
            }
            return;
        }
        if (t == G3_DTYPE_Q5_0) { /* exact: q-16 as int8, s = d per 32 (the scale codes as Q8_0's) */
            for (int i = threadIdx.x; i < k; i += blockDim.x)
                o[i] = (int8_t)(q5_q(row + (size_t)(i / 32) * 22, 2, i % 32) - 16);
            for (int b = threadIdx.x; b < ng; b += blockDim.x) {
                s[b] = h2f(row + (size_t)b * 22);
                if (d.kc) d.kc[n * ng + b] = u16le(row + (size_t)b * 22);
            }
            return;
        }
        if ((t == G3_DTYPE_Q5_1 || t == G3_DTYPE_Q5_K) && g == 32) { /* near-lossless: a warp a group of 32 */
            const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
            for (int gi = warp; gi < ng; gi += nw) {
                const float v = src_val(row, t, gi * 32 + lane);
                float a = fabsf(v);
                for (int off = 16; off; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
                const __half hd = __float2half_ru(a / 127.f); /* rounded up: every |v| / scale <= 127 */
                const float sc = __half2float(hd), inv = sc > 0.f ? 1.f / sc : 0.f;
                o[gi * 32 + lane] = (int8_t)fmaxf(-127.f, fminf(127.f, rintf(v * inv)));
                if (lane == 0) {
                    s[gi] = sc;
                    if (d.kc) d.kc[n * ng + gi] = __half_as_ushort(hd);
                }
            }
            return;
        }
        if (t == G3_DTYPE_Q6_K) { /* exact: q-32 per 16 values with scale d*sc */
            for (int i = threadIdx.x; i < k; i += blockDim.x) o[i] = (int8_t)q6k_q(row + (size_t)(i / 256) * 210, i % 256);
            for (int b = threadIdx.x; b < ng; b += blockDim.x)
                s[b] = q6k_s(row + (size_t)(b / 16) * 210, (b % 16) * 16);
            return;
        }
        /* float source, one scale per row */
        float a = 0.f;
        for (int i = threadIdx.x; i < k; i += blockDim.x) a = fmaxf(a, fabsf(src_val(row, t, i)));
        a = block_max(a, red);
        float sc = d.qt == G3Q_INT8 ? a / 127.f : a / 448.f;
        float inv = sc > 0.f ? 1.f / sc : 0.f;
        if (threadIdx.x == 0) s[0] = sc;
        for (int i = threadIdx.x; i < k; i += blockDim.x) {
            float v = src_val(row, t, i) * inv;
            if (d.qt == G3Q_INT8) {
                o[i] = (int8_t)fmaxf(-127.f, fminf(127.f, rintf(v)));
            } else {
                __nv_fp8_e4m3 f(v);
                o[i] = (int8_t)f.__x;
            }
        }
        return;
    }
    /* int4 */
    uint8_t *o = (uint8_t *)d.q + n * (k / 2);
    float *s = d.s + n * ng, *z = d.z + n * ng;
    if (t == G3_DTYPE_Q4_0 || t == G3_DTYPE_Q4_1) { /* exact: s = d, z = -8 d (Q4_0) or the block's m (Q4_1) */
        const int bb = t == G3_DTYPE_Q4_0 ? 18 : 20;
        for (int j = threadIdx.x; j < k / 2; j += blockDim.x) {
            const uint8_t *qs = row + (size_t)(j / 16) * bb + bb - 16;
            const int i0 = (2 * j) % 32;
            o[j] = (uint8_t)(q4_q(qs, i0) | (q4_q(qs, i0 + 1) << 4));
        }
        for (int b = threadIdx.x; b < ng; b += blockDim.x) {
            const uint8_t *blk = row + (size_t)b * bb;
            float dd = h2f(blk);
            s[b] = dd, z[b] = t == G3_DTYPE_Q4_0 ? -8.f * dd : h2f(blk + 2);
            if (d.kc) d.kc[n * ng + b] = u16le(blk); /* Q4_0 only (g3cb_kcodes_wanted) */
        }
        return;
    }
    if (t == G3_DTYPE_Q4_K) {
        for (int j = threadIdx.x; j < k / 2; j += blockDim.x) {
            const uint8_t *b = row + (size_t)(j / 128) * 144;
            int jj = (2 * j) % 256;
            o[j] = (uint8_t)(q4k_q(b, jj) | (q4k_q(b, jj + 1) << 4));
        }
        for (int b = threadIdx.x; b < ng; b += blockDim.x) {
            const uint8_t *blk = row + (size_t)(b / 8) * 144;
            int a, m;
            q4k_am(blk, b % 8, &a, &m);
            q4k_sz(blk, a, m, &s[b], &z[b]);
            if (d.kc) { /* the same scales as stored (g3_dmat.kc, kd): s = d sc, z = -dmin m */
                d.kc[n * ng + b] = (uint16_t)(a | m << 8);
                if (b % 8 == 0) d.kd[(n * ng + b) / 8] = u16le(blk) | (uint32_t)(u16le(blk + 2) ^ 0x8000u) << 16;
            }
        }
        return;
    }
    /* float source: affine per group, one warp per group */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int gi = warp; gi < ng; gi += nw) {
        float lo = 3.4e38f, hi = -3.4e38f;
        for (int i = lane; i < g; i += 32) {
            float v = src_val(row, t, gi * g + i);
            lo = fminf(lo, v), hi = fmaxf(hi, v);
        }
        for (int off = 16; off; off >>= 1) {
            lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, off));
            hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, off));
        }
        /* scale and offset float16 values, so that the one-row products' half2 copy (g3_dmat.sz) holds the same as s
         * and z: the offset rounded down and the scale up, so the 16 levels still cover [lo, hi] (every weight within
         * half a step; the step wider by at most 2^-11 of itself and of |lo| / 15) */
        const __half hz = __float2half_rd(lo);
        lo = __half2float(hz);
        const __half hs = __float2half_ru((hi - lo) / 15.f);
        const float sc = __half2float(hs), inv = sc > 0.f ? 1.f / sc : 0.f;
        if (lane == 0) {
            s[gi] = sc, z[gi] = lo;
            if (d.sz) d.sz[n * ng + gi] = (uint32_t)__half_as_ushort(hs) | (uint32_t)__half_as_ushort(hz) << 16;
        }
        for (int p = lane; p < g / 2; p += 32) {
            int i = gi * g + 2 * p;
            int q0 = (int)fminf(15.f, fmaxf(0.f, rintf((src_val(row, t, i) - lo) * inv)));
            int q1 = (int)fminf(15.f, fmaxf(0.f, rintf((src_val(row, t, i + 1) - lo) * inv)));
            o[i / 2] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

cudaError_t g3c_convert_rows(const void *src, uint32_t t, int n_rows, g3_dmat *dst, int row0, int step,
                             cudaStream_t st) {
    if (n_rows <= 0) return cudaSuccess;
    size_t rb = g3c_src_row_bytes(t, dst->k);
    for (int r = 0; r < n_rows; r += 65535) { /* grid.x limit kept small for old devices */
        int nr = n_rows - r < 65535 ? n_rows - r : 65535;
        k_convert<<<nr, 256, 0, st>>>((const uint8_t *)src + (size_t)r * rb, rb, t, *dst, row0 + r * step, step);
    }
    return cudaGetLastError();
}

/* ---- random fill ------------------------------------------------------------------------------------------------ */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__global__ void k_fill_random(__nv_bfloat16 *dst, size_t n, float a, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull * (i + 1));
        float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0,1) */
        dst[i] = __float2bfloat16_rn((2.f * u - 1.f) * a);
    }
}
cudaError_t g3c_fill_random_bf16(__nv_bfloat16 *dst, size_t n, float sd, uint64_t seed, cudaStream_t st) {
    k_fill_random<<<4096, 256, 0, st>>>(dst, n, sd * 1.7320508f, seed);
    return cudaGetLastError();
}

/* ---- dequantization ------------------------------------------------------------------------------------------- */
/* 8 consecutive values of a row per thread (groups are multiples of 8), one 16-byte store */
__global__ void k_dequant_bf16(g3_dmat w, __nv_bfloat16 *dst) {
    g3c_pdl_wait();
    const int k8 = w.k / 8, ngr = w.k / w.g;
    const size_t n8 = (size_t)w.n * k8;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n8; e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / k8;
        const int c = (int)(e % k8) * 8;
        const size_t gi = r * ngr + c / w.g;
        float f[8];
        if (w.qt == G3Q_INT4) {
            uint32_t q = *(const uint32_t *)((const uint8_t *)w.q + r * (w.k / 2) + c / 2); /* nibble i = value i */
            const float s = w.s[gi], z = w.z[gi];
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = s * (float)((q >> (4 * i)) & 15u) + z;
        } else if (w.qt == G3Q_INT8) {
            uint2 q = *(const uint2 *)((const int8_t *)w.q + r * w.k + c);
            const float s = w.s[gi];
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = s * (float)(int8_t)(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xffu);
        } else if (w.qt == G3Q_FP8) {
            uint2 q = *(const uint2 *)((const uint8_t *)w.q + r * w.k + c);
            const float s = w.s[gi];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                __nv_fp8_e4m3 v;
                v.__x = (__nv_fp8_storage_t)(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xffu);
                f[i] = s * (float)v;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = dmat_val(w, r, c + i);
        }
        uint4 o;
        __nv_bfloat162 h0 = __floats2bfloat162_rn(f[0], f[1]), h1 = __floats2bfloat162_rn(f[2], f[3]);
        __nv_bfloat162 h2 = __floats2bfloat162_rn(f[4], f[5]), h3 = __floats2bfloat162_rn(f[6], f[7]);
        o.x = *(uint32_t *)&h0, o.y = *(uint32_t *)&h1, o.z = *(uint32_t *)&h2, o.w = *(uint32_t *)&h3;
        *(uint4 *)(dst + r * w.k + c) = o;
    }
}
__global__ void k_dequant_f32(g3_dmat w, float *dst) {
    size_t n = (size_t)w.n * w.k;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dst[e] = dmat_val(w, e / w.k, (int)(e % w.k));
}
cudaError_t g3c_dequant_bf16(const g3_dmat *w, __nv_bfloat16 *dst, cudaStream_t st) {
    if (w->k % 8 || w->g % 8) return cudaErrorInvalidValue;
    return g3c_launch(k_dequant_bf16, dim3(4096), dim3(256), 0, st, *w, dst);
}
cudaError_t g3c_dequant_f32(const g3_dmat *w, float *dst, cudaStream_t st) {
    k_dequant_f32<<<1024, 256, 0, st>>>(*w, dst);
    return cudaGetLastError();
}
