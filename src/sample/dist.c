/* The tempered, truncated distribution of one step (steps 5-8 of sampler.h) and the draw from it. Two shapes:
 *   dense   no top-k: weights w[vocab] from one vectorized pass (min-p folded in as a threshold when there is no
 *           top-p; top-p applied as a threshold mask); the draw walks the per-64 partial sums, then one block.
 *   sparse  top-k: the k best as candidates cand[0..n) with their weights (a one-pass heap for k <= 2048, else a
 *           count histogram plus a quickselect inside one bin), then top-p and min-p on them.
 * Nothing sorts the vocabulary. Histograms of s = (l - max) / T in bins of 1/16 (bin = (int)(-s * 16) for s > -64,
 * a tail bin below) locate the bin where the best-first cumulative weight (top-p) or count (top-k) crosses its
 * target; the bins above are kept whole, and only that bin's members go through a (weighted) quickselect. The kept
 * set is exactly the sorted prefix (up to the order of floating-point sums). Bins <= b are exactly the tokens with
 * s > -(b + 1) / 16, and s grows with the logit, so each such set is "l >= a threshold logit" (logit_floor). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sample/sampler_internal.h"

/* Histogram bin of a logit: 16 per unit of s = (l - m) / T <= 0, best first; everything below -64 in the tail
 * bin. The same float expression as the weight kernels, so a token always lands in the same bin. */
static inline int bin_of(float logit, float m, float temp) {
    float s = (logit - m) / temp;
    return s > -64.0f ? (int)(-s * 16.0f) : G3_TOPP_BINS;
}

/* Floats as ordered integers (-0 and +0 both 0) and back. */
static int64_t fkey(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
}
static float funkey(int64_t k) {
    uint32_t u = k >= 0 ? (uint32_t)k : (0x80000000u | (uint32_t)(-k));
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The smallest logit l with (l - m) / temp > edge (edge < 0), by bisection over the floats in (-inf, m]: the same
 * float expression as the kernels, so "l >= logit_floor" is exactly "s > edge". */
static float logit_floor(float m, float temp, float edge) {
    int64_t lo = fkey(-INFINITY), hi = fkey(m); /* false at lo, true at hi (s = 0 > edge) */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((funkey(mid) - m) / temp > edge) hi = mid;
        else lo = mid;
    }
    return funkey(hi);
}

/* Logit bounds of histogram bin b: its tokens have lo <= l < hi (lo = -inf for the tail bin, hi = +inf for 0). */
static void bin_bounds(float m, float temp, int b, float *lo, float *hi) {
    *lo = b < G3_TOPP_BINS ? logit_floor(m, temp, -(float)(b + 1) / 16.0f) : -INFINITY;
    *hi = b > 0 ? logit_floor(m, temp, -(float)b / 16.0f) : INFINITY;
}

static void single(g3_sampler *s, g3_dist *d, int32_t id) {
    s->cand[0].logit = 0.0f;
    s->cand[0].w = 1.0f;
    s->cand[0].id = id;
    d->dense = 0;
    d->n = 1;
    d->z = 1.0;
    d->argmax = id;
}

/* Index of the first bin where the cumulative weight reaches target; *above = weight of the bins before it. */
static int crossing_bin(const double *bins, double target, double *above) {
    double acc = 0.0;
    int b = 0;
    for (; b < G3_TOPP_BINS; b++) {
        if (acc + bins[b] >= target) break;
        acc += bins[b];
    }
    *above = acc;
    return b; /* the tail bin when the others fall short */
}

/* Top-p over candidates c[0..n) with weights (total z): moves the kept prefix to the front, returns its size. */
static int top_p_sparse(g3_sampler *s, g3_cand *c, int n, float m, double z) {
    const float temp = s->p.temperature;
    const double target = (double)s->p.top_p * z;
    if (n <= G3_TOPP_SMALL) {
        g3_cand_sort(c, n);
        double acc = 0.0;
        for (int j = 0; j < n; j++) {
            acc += (double)c[j].w;
            if (acc >= target) return j + 1;
        }
        return n;
    }
    memset(s->bins, 0, sizeof s->bins);
    for (int j = 0; j < n; j++) s->bins[bin_of(c[j].logit, m, temp)] += (double)c[j].w;
    double above;
    int cross = crossing_bin(s->bins, target, &above);
    int na = 0, nb = 0; /* members of the bins above, then of the crossing bin, to the front */
    for (int j = 0; j < n; j++)
        if (bin_of(c[j].logit, m, temp) < cross) {
            g3_cand t = c[j];
            c[j] = c[na];
            c[na++] = t;
        }
    for (int j = na; j < n; j++)
        if (bin_of(c[j].logit, m, temp) == cross) {
            g3_cand t = c[j];
            c[j] = c[na + nb];
            c[na + nb++] = t;
        }
    return na + g3_cand_mass_prefix(c + na, nb, target - above);
}

/* Keeps the candidates with p / p_max = exp((l - m) / T) >= min_p (order preserved); the argmax always stays. */
static int min_p_filter(const g3_sampler *s, g3_cand *c, int n, float m) {
    const float thr = logf(s->p.min_p), temp = s->p.temperature;
    int kept = 0;
    for (int j = 0; j < n; j++)
        if ((c[j].logit - m) / temp >= thr) c[kept++] = c[j];
    return kept;
}

/* Finishes a sparse distribution c[0..n) (weights set, total z): top-p, min-p, the new total. */
static void finish_sparse(g3_sampler *s, int n, float m, double z, g3_dist *d) {
    g3_cand *c = s->cand;
    int n0 = n;
    if (s->p.top_p < 1.0f) n = top_p_sparse(s, c, n, m, z);
    if (s->p.min_p > 0.0f) n = min_p_filter(s, c, n, m);
    if (n != n0) {
        z = 0.0;
        for (int j = 0; j < n; j++) z += (double)c[j].w;
    }
    d->dense = 0;
    d->n = n;
    d->z = z;
}

/* top-k above the heap's range: count the tokens per bin, keep the bins above the one where the count reaches k, and
 * quickselect the rest of k inside that bin. Returns the number of candidates in cand (k, or fewer valid ones). */
static int top_k_large(g3_sampler *s, const float *l, float m) {
    const int k = s->p.top_k;
    const float temp = s->p.temperature;
    memset(s->lane_counts, 0, sizeof s->lane_counts);
    g3_smp_count_hist(l, s->vocab, m, temp, s->lane_counts, G3_TOPP_BINS);
    int cross = 0, above = 0;
    for (; cross <= G3_TOPP_BINS; cross++) {
        int cnt = (s->lane_counts[0][cross] + s->lane_counts[1][cross]) +
                  (s->lane_counts[2][cross] + s->lane_counts[3][cross]);
        if (above + cnt >= k) break;
        above += cnt;
    }
    float lo = -INFINITY, hi = INFINITY; /* fewer than k valid tokens: take them all */
    if (cross <= G3_TOPP_BINS) bin_bounds(m, temp, cross, &lo, &hi);
    g3_cand *c = s->cand;
    int na = 0, nb = 0; /* the bins above from the front, the crossing bin from the back */
    for (int i = 0; i < s->vocab; i++) {
        float x = l[i];
        if (!(x >= lo && x > -INFINITY)) continue; /* mostly false: predictable */
        g3_cand *dst = x >= hi ? &c[na++] : &c[s->vocab - 1 - nb++];
        dst->logit = x;
        dst->id = i;
    }
    memmove(c + na, c + s->vocab - nb, (size_t)nb * sizeof *c);
    if (na + nb <= k) return na + nb;
    g3_cand_select(c + na, nb, k - na);
    return k;
}

/* top-k active: the k best as candidates. */
static void build_top_k(g3_sampler *s, const float *l, g3_dist *d) {
    g3_cand *c = s->cand;
    const int k = s->p.top_k;
    int n = 0;
    float m = -INFINITY;
    int32_t am = 0;
    if (k <= G3_TOPK_HEAP) {
        n = g3_cand_top_k_scan(l, s->vocab, k, c);
        for (int j = 0; j < n; j++)
            if (c[j].logit > m || (c[j].logit == m && c[j].id < am)) {
                m = c[j].logit;
                am = c[j].id;
            }
    } else {
        am = g3_smp_argmax(l, s->vocab, &m);
        if (m > -INFINITY && m < INFINITY) n = top_k_large(s, l, m);
    }
    if (n == 0 || m == INFINITY) {
        single(s, d, am);
        return;
    }
    d->argmax = am;
    finish_sparse(s, n, m, g3_smp_cand_weights(c, n, m, s->p.temperature), d);
}

/* No top-k: weights over the whole vocabulary; top-p turns them into candidates. */
static void build_dense(g3_sampler *s, const float *l, g3_dist *d) {
    const float temp = s->p.temperature;
    const int top_p = s->p.top_p < 1.0f;
    float m;
    int32_t am = g3_smp_argmax(l, s->vocab, &m);
    if (m == -INFINITY || m == INFINITY) {
        single(s, d, am);
        return;
    }
    d->argmax = am;
    if (!top_p) {
        /* min-p as a threshold on s = log(p / p_max): nothing downstream needs the tokens it removes */
        float thr = s->p.min_p > 0.0f ? fmaxf(logf(s->p.min_p), -87.0f) : -87.0f;
        d->dense = 1;
        d->n = s->vocab;
        d->z = g3_smp_weights(l, s->vocab, m, temp, thr, s->w, s->blocks);
        return;
    }
    /* top-p: weights and their histogram in one pass; then the crossing bin */
    const float *w = s->w;
    memset(s->lane_bins, 0, sizeof s->lane_bins);
    g3_smp_weights_hist(l, s->vocab, m, temp, s->w, s->lane_bins, G3_TOPP_BINS);
    double total = 0.0, above;
    for (int b = 0; b <= G3_TOPP_BINS; b++) {
        s->bins[b] = (s->lane_bins[0][b] + s->lane_bins[1][b]) + (s->lane_bins[2][b] + s->lane_bins[3][b]);
        total += s->bins[b];
    }
    const double target = (double)s->p.top_p * total;
    int cross = crossing_bin(s->bins, target, &above);
    float lo, hi;
    bin_bounds(m, temp, cross, &lo, &hi);
    g3_cand *c = s->cand;
    int nb = g3_smp_collect(l, w, s->vocab, lo, hi, c); /* the crossing bin's members */
    int j = g3_cand_mass_prefix(c, nb, target - above);
    /* the last kept token in the best-first order is the threshold: keep everything at or above it */
    g3_cand last = {hi, 0.0f, INT32_MAX}; /* j == 0 only through rounding: the bins above are then the set */
    for (int q = 0; q < j; q++)
        if (q == 0 || c[q].logit < last.logit || (c[q].logit == last.logit && c[q].id > last.id)) last = c[q];
    float thr = s->p.min_p > 0.0f ? logf(s->p.min_p) : -INFINITY;
    d->dense = 1;
    d->n = s->vocab;
    d->z = g3_smp_mask(l, s->vocab, m, temp, thr, last.logit, last.id, s->w, s->blocks);
}

void g3_dist_build(g3_sampler *s, const float *l, g3_dist *d) {
    if (s->p.top_k > 0 && s->p.top_k < s->vocab) build_top_k(s, l, d);
    else build_dense(s, l, d);
}

int32_t g3_dist_draw(const g3_sampler *s, const g3_dist *d, double u) {
    const double r = u * d->z;
    double acc = 0.0;
    if (!d->dense) {
        for (int j = 0; j < d->n; j++) {
            acc += (double)s->cand[j].w;
            if (r < acc) return s->cand[j].id;
        }
        return d->argmax;
    }
    const int n = d->n;
    for (int b = 0; b * G3_SMP_BLOCK < n; b++) {
        if (r < acc + s->blocks[b]) {
            /* inside block b: rescale the remainder from the block's float-lane sum to this exact walk's sum */
            int lo = b * G3_SMP_BLOCK, hi = lo + G3_SMP_BLOCK < n ? lo + G3_SMP_BLOCK : n;
            double exact = 0.0;
            for (int i = lo; i < hi; i++) exact += (double)s->w[i];
            double rr = (r - acc) * (exact / s->blocks[b]), a = 0.0;
            int32_t last = d->argmax;
            for (int i = lo; i < hi; i++) {
                if (!(s->w[i] > 0.0f)) continue;
                a += (double)s->w[i];
                last = i;
                if (rr < a) return i;
            }
            return last;
        }
        acc += s->blocks[b];
    }
    return d->argmax;
}

int g3_dist_export(const g3_sampler *s, const g3_dist *d, int32_t *ids, float *probs) {
    int k = 0;
    if (d->dense) {
        for (int i = 0; i < d->n; i++)
            if (s->w[i] > 0.0f) {
                ids[k] = i;
                probs[k++] = (float)((double)s->w[i] / d->z);
            }
    } else {
        for (int j = 0; j < d->n; j++)
            if (s->cand[j].w > 0.0f) {
                ids[k] = s->cand[j].id;
                probs[k++] = (float)((double)s->cand[j].w / d->z);
            }
    }
    return k;
}
