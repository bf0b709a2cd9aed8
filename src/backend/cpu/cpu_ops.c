/* Small float32 operations of the CPU forward (see cpu_ops.h). Sums of squares and attention dot products are
 * accumulated in double where it is cheap, so that our float32 results sit within rounding of the reference. */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

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

void g3_geglu(float *gate, const float *up, int n) {
    const float k0 = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int i = 0; i < n; i++) {
        float x = gate[i];
        float g = 0.5f * x * (1.0f + tanhf(k0 * (x + 0.044715f * x * x * x)));
        gate[i] = g * up[i];
    }
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
    int n = pos - first + 1;
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) {
        int p = first + t;
        const float *blk = pool + (size_t)table[p / B] * block_floats;
        const float *k = blk + ((((size_t)li * 2 + 0) * KVH + hk) * B + p % B) * D;
        float acc = 0;
        for (int d = 0; d < D; d++) acc += q[d] * k[d];
        float s = acc * scale;
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
        float w = scores[t] * inv;
        for (int d = 0; d < D; d++) out[d] += w * v[d];
    }
}
