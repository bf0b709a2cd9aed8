/* Small float32 operations of the CPU forward (see cpu_ops.h). Sums of squares and attention dot products are
 * accumulated in double where it is cheap, so that our float32 results sit within rounding of the reference. */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define G3_X86 1
#endif

/* ---- attention inner loops: q.k and out += w*v over head_dim, SIMD where the CPU has it ---------------------- */

static float dot_scalar(const float *a, const float *b, int n) {
    float acc = 0;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void axpy_scalar(float *y, float w, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += w * x[i];
}

#ifdef G3_X86
__attribute__((target("avx512f"))) static float dot_avx512(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    float r = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

__attribute__((target("avx512f"))) static void axpy_avx512(float *y, float w, const float *x, int n) {
    __m512 vw = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vw, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += w * x[i];
}

__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, float w, const float *x, int n) {
    __m256 vw = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += w * x[i];
}
#endif

typedef float (*dot_fn)(const float *, const float *, int);
typedef void (*axpy_fn)(float *, float, const float *, int);

/* The widest variant this CPU runs (the same matmul.c picks; G3_CPU_KERNELS=scalar forces the portable one). */
static void pick(dot_fn *dot, axpy_fn *axpy) {
    *dot = dot_scalar, *axpy = axpy_scalar;
#ifdef G3_X86
    const char *force = getenv("G3_CPU_KERNELS");
    if (force && !strcmp(force, "scalar")) return;
    if (__builtin_cpu_supports("avx512f") && !(force && !strcmp(force, "avx2"))) {
        *dot = dot_avx512, *axpy = axpy_avx512;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *dot = dot_avx2, *axpy = axpy_avx2;
    }
#endif
}

void g3_rmsnorm(float *dst, const float *src, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)src[i] * (double)src[i];
    float inv = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) dst[i] = src[i] * inv * w[i];
}

void g3_add_rmsnorm(float *h, float *t, const float *w, int n, float eps) {
    g3_rmsnorm(t, t, w, n, eps);
    for (int i = 0; i < n; i++) h[i] += t[i];
}

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)) computed as x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3), as the
 * AVX-512 variant does: 1 + tanhf(u) cancels for negative x (relative error 0.07 at x = -30 on a machine without
 * AVX-512, test_cpu_ops), the quotient keeps full relative precision (exp overflows to inf: -0 in the tail) */
static void geglu_scalar(float *gate, const float *up, int n) {
    const float k0 = -2.0f * 0.7978845608028654f; /* -2 sqrt(2/pi) */
    for (int i = 0; i < n; i++) {
        const float x = gate[i];
        gate[i] = x / (1.0f + expf(k0 * (x + 0.044715f * x * x * x))) * up[i];
    }
}

#ifdef G3_X86
/* exp(x) to ~1e-7 relative: x = k ln2 + r, |r| <= ln2/2, degree-6 Taylor polynomial, scaled by 2^k. */
__attribute__((target("avx512f"))) static __m512 exp_avx512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
__attribute__((target("avx512f"))) static void geglu_avx512(float *gate, const float *up, int n) {
    const __m512 k0 = _mm512_set1_ps(-2.0f * 0.7978845608028654f), k1 = _mm512_set1_ps(0.044715f);
    const __m512 one = _mm512_set1_ps(1.0f);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(gate + i);
        __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        __m512 m2u = _mm512_mul_ps(k0, _mm512_fmadd_ps(k1, x3, x));
        __m512 g = _mm512_div_ps(x, _mm512_add_ps(one, exp_avx512(m2u)));
        _mm512_storeu_ps(gate + i, _mm512_mul_ps(g, _mm512_loadu_ps(up + i)));
    }
    if (i < n) geglu_scalar(gate + i, up + i, n - i);
}
#endif

void g3_geglu(float *gate, const float *up, int n) {
#ifdef G3_X86
    const char *force = getenv("G3_CPU_KERNELS");
    if (!(force && (!strcmp(force, "scalar") || !strcmp(force, "avx2"))) && __builtin_cpu_supports("avx512f")) {
        geglu_avx512(gate, up, n);
        return;
    }
#endif
    geglu_scalar(gate, up, n);
}

void g3_rope(float *x, int D, int pos, const float *inv_freq) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

void g3_attend(const float *pool, size_t block_floats, int li, int KVH, int hk, int B, int D, const int32_t *table,
               int first, int pos, const float *q, float scale, float softcap, float *scores, float *out) {
    dot_fn dot;
    axpy_fn axpy;
    pick(&dot, &axpy);
    int n = pos - first + 1;
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) {
        int p = first + t;
        const float *blk = pool + (size_t)table[p / B] * block_floats;
        const float *k = blk + ((((size_t)li * 2 + 0) * KVH + hk) * B + p % B) * D;
        float s = dot(q, k, D) * scale;
        if (softcap > 0) s = softcap * tanhf(s / softcap);
        scores[t] = s;
        if (s > mx) mx = s;
    }
    double sum = 0;
    for (int t = 0; t < n; t++) {
        scores[t] = expf(scores[t] - mx);
        sum += scores[t];
    }
    float inv = (float)(1.0 / sum);
    memset(out, 0, sizeof(float) * (size_t)D);
    for (int t = 0; t < n; t++) {
        int p = first + t;
        const float *blk = pool + (size_t)table[p / B] * block_floats;
        const float *v = blk + ((((size_t)li * 2 + 1) * KVH + hk) * B + p % B) * D;
        axpy(out, scores[t] * inv, v, D);
    }
}
