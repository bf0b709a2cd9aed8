/* Body of the sampler's vocabulary-wide kernels (kernels.h), written once for a vector width of G3_SMP_W floats in
 * GCC/Clang vector extensions and included by kernels.c (4 lanes: SSE2 / NEON, every machine) and kernels_avx2.c
 * (8 lanes, compiled with AVX2 + FMA). Functions are named g3_smp_<name>_<G3_SMP_SFX>. exp follows the classic
 * Cephes expf scheme (round to a power of two, Cody-Waite reduction, degree-5 polynomial): ~2 ulp. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gemma3.h"
#include "sample/kernels.h"

#define G3_SMP_CAT2(a, b) a##_##b
#define G3_SMP_CAT(a, b) G3_SMP_CAT2(a, b)
#define G3_SMP_FN(name) G3_SMP_CAT(name, G3_SMP_SFX)

typedef float vf __attribute__((vector_size(4 * G3_SMP_W)));
typedef int32_t vi __attribute__((vector_size(4 * G3_SMP_W)));
enum { W = G3_SMP_W };

static inline vf splat(float x) { return (vf){0} + x; }
static inline vi splati(int32_t x) { return (vi){0} + x; }
static inline vi iota(void) {
    vi v;
    for (int k = 0; k < W; k++) v[k] = k;
    return v;
}
static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline vf blend(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }
static inline double lanes_sum(vf a) {
    double s = 0.0;
    for (int k = 0; k < W; k++) s += (double)a[k];
    return s;
}

/* exp(s) for s <= 0; 0 for s < -87.5 (below the normal range) and for NaN. */
static inline vf exp_v(vf s) {
    vi in_range = s >= splat(-87.5f);
    s = blend(in_range, s, splat(-87.5f));
    vf t = s * splat(1.44269504088896341f) + splat(12582912.0f); /* 1.5 * 2^23: round to nearest integer */
    vf n = t - splat(12582912.0f);
    vf r = s - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    vi e = (__builtin_convertvector(n, vi) + 127) << 23; /* 2^n, n in [-126, 0] */
    return (vf)((vi)(p * (vf)e) & in_range);
}

/* Loads l[i..i+W), padding lanes at or past n with -inf. */
static inline vf load_padded(const float *l, int i, int n) {
    if (i + W <= n) return load(l + i);
    vf x = splat(-INFINITY);
    for (int k = 0; k < n - i; k++) x[k] = l[i + k];
    return x;
}
static inline void store_part(float *w, int i, int n, vf e) {
    if (i + W <= n) memcpy(w + i, &e, sizeof e);
    else
        for (int k = 0; k < n - i; k++) w[i + k] = e[k];
}

int32_t G3_SMP_FN(g3_smp_argmax)(const float *l, int n, float *max_out) {
    /* two independent lane sets to overlap the compare latency; strict > keeps each lane's first occurrence */
    vf best0 = splat(-INFINITY), best1 = best0;
    vi idx0 = iota(), idx1 = idx0 + W, b0 = splati(0), b1 = b0;
    int i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        vf x0 = load(l + i), x1 = load(l + i + W);
        vi gt0 = x0 > best0, gt1 = x1 > best1; /* NaN compares false */
        best0 = blend(gt0, x0, best0);
        best1 = blend(gt1, x1, best1);
        b0 = (gt0 & idx0) | (~gt0 & b0);
        b1 = (gt1 & idx1) | (~gt1 & b1);
        idx0 += 2 * W;
        idx1 += 2 * W;
    }
    float m = -INFINITY;
    int32_t at = 0;
    for (int k = 0; k < 2 * W; k++) {
        float v = k < W ? best0[k] : best1[k - W];
        int32_t j = k < W ? b0[k] : b1[k - W];
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

void G3_SMP_FN(g3_smp_weights)(const float *l, int n, float m, float temp, float thr, float *w, double *blocks) {
    const vf vm = splat(m), vt = splat(temp), vthr = splat(thr);
    for (int b = 0, lo = 0; lo < n; lo += G3_SMP_BLOCK, b++) {
        int hi = lo + G3_SMP_BLOCK < n ? lo + G3_SMP_BLOCK : n;
        vf acc = splat(0.0f);
        for (int i = lo; i < hi; i += W) {
            vf s = (load_padded(l, i, hi) - vm) / vt;
            vi keep = s >= vthr; /* false for NaN and -inf; thr >= -87 keeps exp_v in range */
            vf e = (vf)((vi)exp_v(s) & keep);
            store_part(w, i, hi, e);
            acc += e;
        }
        blocks[b] = lanes_sum(acc);
    }
}

/* Histogram bins of s (see kernels.h): (int)(-s * 16) for s > -64, else nbins. */
static inline vi bins_of(vf s, int nbins) {
    vi in_bins = s > splat(-64.0f);
    vf t = (vf)((vi)(-s * splat(16.0f)) & in_bins); /* 0 outside, so the conversion stays in range */
    return (__builtin_convertvector(t, vi) & in_bins) | (splati(nbins) & ~in_bins);
}

void G3_SMP_FN(g3_smp_weights_hist)(const float *l, int n, float m, float temp, float *w,
                                    double (*hist)[G3_SMP_HIST_MAX], int nbins) {
    const vf vm = splat(m), vt = splat(temp), vthr = splat(-87.0f);
    for (int i = 0; i < n; i += W) {
        vf s = (load_padded(l, i, n) - vm) / vt; /* pads: -inf, weight 0 */
        vi keep = s >= vthr;
        vf e = (vf)((vi)exp_v(s) & keep);
        vi bin = bins_of(s, nbins);
        store_part(w, i, n, e);
        /* four partial histograms: consecutive tokens often share a bin, and separate copies keep adds apart */
        for (int k = 0; k < W; k++) hist[k & 3][bin[k]] += (double)e[k];
    }
}

void G3_SMP_FN(g3_smp_count_hist)(const float *l, int n, float m, float temp, int32_t (*cnt)[G3_SMP_HIST_MAX],
                                  int nbins) {
    const vf vm = splat(m), vt = splat(temp);
    for (int i = 0; i < n; i += W) {
        vf x = load_padded(l, i, n);
        vi valid = x > splat(-INFINITY); /* false for NaN, -inf and the pads */
        vi bin = bins_of((x - vm) / vt, nbins);
        for (int k = 0; k < W; k++) cnt[k & 3][bin[k]] -= valid[k]; /* valid lanes are -1 */
    }
}

void G3_SMP_FN(g3_smp_mask)(const float *l, int n, float m, float temp, float thr, float lstar, int32_t idstar,
                            float *w, double *blocks) {
    const vf vm = splat(m), vt = splat(temp), vthr = splat(thr), vls = splat(lstar);
    const vi vid = splati(idstar);
    for (int b = 0, lo = 0; lo < n; lo += G3_SMP_BLOCK, b++) {
        int hi = lo + G3_SMP_BLOCK < n ? lo + G3_SMP_BLOCK : n;
        vf acc = splat(0.0f);
        for (int i = lo; i < hi; i += W) {
            vf x = load_padded(l, i, hi), wv = splat(0.0f);
            if (i + W <= hi) wv = load(w + i);
            else
                for (int k = 0; k < hi - i; k++) wv[k] = w[i + k];
            vi id = iota() + i;
            vi above = (x > vls) | ((x == vls) & (id <= vid));
            vi keep = above & ((x - vm) / vt >= vthr);
            vf e = (vf)((vi)wv & keep);
            store_part(w, i, hi, e);
            acc += e;
        }
        blocks[b] = lanes_sum(acc);
    }
}

int G3_SMP_FN(g3_smp_collect)(const float *l, const float *w, int n, float lo, float hi, g3_cand *out) {
    const vf vlo = splat(lo), vhi = splat(hi), zero = splat(0.0f);
    int nb = 0;
    for (int i = 0; i < n; i += W) {
        vf x = load_padded(l, i, n), wv = zero;
        if (i + W <= n) wv = load(w + i);
        else
            for (int k = 0; k < n - i; k++) wv[k] = w[i + k];
        vi in = (x >= vlo) & (x < vhi) & (wv > zero); /* pads have weight 0 */
        int any = 0;
        for (int k = 0; k < W; k++) any |= in[k];
        if (!any) continue; /* the common case when the range is narrow */
        int kn = n - i < W ? n - i : W;
        for (int k = 0; k < kn; k++) { /* branch-free: nb <= i + k < n */
            out[nb].logit = x[k];
            out[nb].w = wv[k];
            out[nb].id = i + k;
            nb -= in[k]; /* -1 when in */
        }
    }
    return nb;
}

int G3_SMP_FN(g3_smp_top_n)(const float *l, int n, int nt, g3_token_logprob *top) {
    int k = 0;
    float thr = -INFINITY; /* the value to beat: -inf until top is full (so -inf and NaN never enter) */
    for (int i = 0; i < n; i += W) {
        vi gt = load_padded(l, i, n) > splat(thr);
        int any = 0;
        for (int q = 0; q < W; q++) any |= gt[q];
        if (!any) continue; /* nearly always, once the threshold has risen */
        for (int q = 0; q < W && i + q < n; q++) {
            float v = l[i + q];
            if (!(v > thr)) continue;
            int j = k < nt ? k++ : nt - 1; /* full: the last entry drops out */
            while (j > 0 && v > top[j - 1].logprob) { /* strict: equal values keep the lower id first */
                top[j] = top[j - 1];
                j--;
            }
            top[j].token = i + q;
            top[j].logprob = v;
            if (k == nt) thr = top[nt - 1].logprob;
        }
    }
    return k;
}

double G3_SMP_FN(g3_smp_sumexp)(const float *l, int n, float m) {
    const vf vm = splat(m);
    double total = 0.0;
    for (int lo = 0; lo < n; lo += G3_SMP_BLOCK) {
        int hi = lo + G3_SMP_BLOCK < n ? lo + G3_SMP_BLOCK : n;
        vf acc = splat(0.0f);
        for (int i = lo; i < hi; i += W) acc += exp_v(load_padded(l, i, hi) - vm); /* -inf, NaN: 0 */
        total += lanes_sum(acc);
    }
    return total;
}

void G3_SMP_FN(g3_smp_cand_weights)(g3_cand *c, int n, float m, float temp) {
    const vf vm = splat(m), vt = splat(temp);
    for (int j = 0; j < n; j += W) {
        int k = n - j < W ? n - j : W;
        vf x = vm;
        for (int q = 0; q < k; q++) x[q] = c[j + q].logit;
        vf e = exp_v((x - vm) / vt);
        for (int q = 0; q < k; q++) c[j + q].w = e[q];
    }
}
