/* Vocabulary-wide passes of the sampler (see kernels.h), in GCC/Clang vector extensions of 4 floats (SSE2 / NEON
 * width, so no ABI questions and no intrinsics): the same source builds everywhere. exp follows the classic Cephes
 * expf scheme (round to a power of two, Cody-Waite reduction, degree-5 polynomial): about 2 ulp, and identical for
 * every lane and position. */
#include "sample/kernels.h"

#include <math.h>
#include <string.h>

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f splat(float x) { return (v4f){x, x, x, x}; }
static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline v4f blend(v4i mask, v4f a, v4f b) { return (v4f)(((v4i)a & mask) | ((v4i)b & ~mask)); }

/* exp(s) for s <= 0; 0 for s < -87.5 (below the normal range) and for NaN. */
static inline v4f exp4(v4f s) {
    v4i in_range = s >= splat(-87.5f);
    s = blend(in_range, s, splat(-87.5f));
    v4f t = s * splat(1.44269504088896341f) + splat(12582912.0f); /* 1.5 * 2^23: round to nearest integer */
    v4f n = t - splat(12582912.0f);
    v4f r = s - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    v4f p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    v4i e = (__builtin_convertvector(n, v4i) + 127) << 23; /* 2^n, n in [-126, 0] */
    return (v4f)((v4i)(p * (v4f)e) & in_range);
}

int32_t g3_smp_argmax(const float *l, int n, float *max_out) {
    /* two independent lane sets (even and odd groups of 4) to overlap the compare latency */
    v4f best0 = splat(-INFINITY), best1 = best0;
    v4i idx0 = {0, 1, 2, 3}, idx1 = {4, 5, 6, 7}, b0 = {0}, b1 = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v4f x0 = load4(l + i), x1 = load4(l + i + 4);
        v4i gt0 = x0 > best0, gt1 = x1 > best1; /* strict: the first occurrence per lane stays; NaN is false */
        best0 = blend(gt0, x0, best0);
        best1 = blend(gt1, x1, best1);
        b0 = (gt0 & idx0) | (~gt0 & b0);
        b1 = (gt1 & idx1) | (~gt1 & b1);
        idx0 += 8;
        idx1 += 8;
    }
    float m = -INFINITY;
    int32_t at = 0;
    for (int k = 0; k < 8; k++) {
        float v = k < 4 ? best0[k] : best1[k - 4];
        int32_t j = k < 4 ? b0[k] : b1[k - 4];
        if (v > m || (v == m && v > -INFINITY && j < at)) {
            m = v;
            at = j;
        }
    }
    for (; i < n; i++) /* the tail's indices are above every lane's: strict > keeps the lowest */
        if (l[i] > m) {
            m = l[i];
            at = i;
        }
    *max_out = m;
    return at;
}

/* Weights of l[i..i+4) into w[i..i+4), returned for summing. */
static inline v4f weights4(const float *l, int i, v4f vm, v4f vt, v4f vthr, float *w) {
    v4f s = (load4(l + i) - vm) / vt;
    v4i keep = s >= vthr; /* false for NaN and -inf; thr >= -87 keeps exp4 in range */
    v4f e = (v4f)((v4i)exp4(s) & keep);
    memcpy(w + i, &e, sizeof e);
    return e;
}

static inline double lanes_sum(v4f a) { return ((double)a[0] + (double)a[1]) + ((double)a[2] + (double)a[3]); }

double g3_smp_weights(const float *l, int n, float m, float temp, float thr, float *w, double *blocks) {
    const v4f vm = splat(m), vt = splat(temp), vthr = splat(thr);
    double total = 0.0;
    int b = 0, lo = 0;
    for (; lo + G3_SMP_BLOCK <= n; lo += G3_SMP_BLOCK, b++) { /* full blocks: float lanes, then one double */
        v4f acc = splat(0.0f);
        for (int i = lo; i < lo + G3_SMP_BLOCK; i += 4) acc += weights4(l, i, vm, vt, vthr, w);
        blocks[b] = lanes_sum(acc);
        total += blocks[b];
    }
    if (lo < n) { /* the ragged last block, through a padded copy (-inf pads weigh 0) */
        float pad[G3_SMP_BLOCK], wpad[G3_SMP_BLOCK];
        int k = n - lo, k4 = (k + 3) & ~3;
        for (int j = 0; j < k4; j++) pad[j] = j < k ? l[lo + j] : -INFINITY;
        v4f acc = splat(0.0f);
        for (int i = 0; i < k4; i += 4) acc += weights4(pad, i, vm, vt, vthr, wpad);
        memcpy(w + lo, wpad, (size_t)k * sizeof *w);
        blocks[b] = lanes_sum(acc);
        total += blocks[b];
    }
    return total;
}

double g3_smp_cand_weights(g3_cand *c, int n, float m, float temp) {
    const v4f vm = splat(m), vt = splat(temp);
    double total = 0.0;
    for (int j = 0; j < n; j += 4) {
        int k = n - j < 4 ? n - j : 4;
        v4f x = splat(m);
        for (int q = 0; q < k; q++) x[q] = c[j + q].logit;
        v4f e = exp4((x - vm) / vt);
        for (int q = 0; q < k; q++) {
            c[j + q].w = e[q];
            total += (double)e[q];
        }
    }
    return total;
}
