/* The tempered, truncated distribution of one step (steps 5-8 of sampler.h) and the draw from it. Two shapes:
 *   dense   no top-k: weights w[vocab] from one vectorized pass (min-p folded in as a threshold when there is no
 *           top-p); the draw walks the per-64 partial sums, then one block.
 *   sparse  top-k (a one-pass heap for k <= 2048, else collect + quickselect), or top-p: the survivors in
 *           cand[0..n) with their weights.
 * Top-p never sorts the vocabulary: a histogram of s = (l - max) / T locates the bin where the best-first
 * cumulative weight crosses top_p; the bins above are kept whole, and only the crossing bin's members go through a
 * weighted quickselect. The kept set is exactly the sorted prefix (up to the order of floating-point sums). */
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

/* top-k active: the k best as candidates. */
static void build_top_k(g3_sampler *s, const float *l, g3_dist *d) {
    g3_cand *c = s->cand;
    const int k = s->p.top_k;
    int n = 0;
    if (k <= G3_TOPK_HEAP) {
        n = g3_cand_top_k_scan(l, s->vocab, k, c);
    } else {
        for (int i = 0; i < s->vocab; i++)
            if (l[i] > -INFINITY) { /* skips -inf and NaN */
                c[n].logit = l[i];
                c[n].id = i;
                n++;
            }
        g3_cand_select(c, n, k);
        if (n > k) n = k;
    }
    float m = -INFINITY;
    int32_t am = 0;
    for (int j = 0; j < n; j++)
        if (c[j].logit > m || (c[j].logit == m && c[j].id < am)) {
            m = c[j].logit;
            am = c[j].id;
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
    for (int b = 0; b <= G3_TOPP_BINS; b++) s->bin_lmin[b] = INFINITY;
    g3_smp_weights_hist(l, s->vocab, m, temp, s->w, s->lane_bins, s->bin_lmin, G3_TOPP_BINS);
    double total = 0.0, above;
    for (int b = 0; b <= G3_TOPP_BINS; b++) {
        s->bins[b] = (s->lane_bins[0][b] + s->lane_bins[1][b]) + (s->lane_bins[2][b] + s->lane_bins[3][b]);
        total += s->bins[b];
    }
    const double target = (double)s->p.top_p * total;
    int cross = crossing_bin(s->bins, target, &above);
    /* bin_of falls as the logit grows, so bins 0..cross hold exactly the tokens with l >= lcut, and the bins
     * before cross those with l >= lhi: the crossing bin's members are the tokens with lcut <= l < lhi */
    float lcut = INFINITY, lhi = INFINITY;
    for (int b = 0; b <= cross; b++) {
        lcut = fminf(lcut, s->bin_lmin[b]);
        if (b < cross) lhi = lcut;
    }
    g3_cand *c = s->cand;
    int nb = 0;
    for (int i = 0; i < s->vocab; i++) { /* branch-free: the test is a coin flip on flat distributions */
        c[nb].logit = l[i];
        c[nb].w = w[i];
        c[nb].id = i;
        nb += l[i] >= lcut && l[i] < lhi && w[i] > 0.0f;
    }
    int j = g3_cand_mass_prefix(c, nb, target - above);
    /* the last kept token in the best-first order is the threshold: keep everything at or above it */
    g3_cand last = {lhi, 0.0f, INT32_MAX}; /* j == 0 only through rounding: the bins above are then the set */
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
