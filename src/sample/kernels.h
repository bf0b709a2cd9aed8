/* The passes of the sampler that touch every one of the vocab logits, in GCC/Clang vector extensions (4 lanes on
 * every machine, 8 with AVX2 + FMA where the CPU has them, chosen at run time): argmax, exp weights with partial
 * sums, the top-p histogram and threshold mask. With FMA the weights may differ from the 4-lane build's in the last
 * bit, so draws are reproducible on one machine (and one kind of CPU), not across kinds. */
#ifndef G3_SAMPLE_KERNELS_H
#define G3_SAMPLE_KERNELS_H

#include <stdint.h>

#include "gemma3.h"
#include "sample/select.h"

#define G3_SMP_BLOCK 64 /* weights per partial sum written by g3_smp_weights */

/* Lowest index of the largest l[i] > -inf (NaN never wins); *max_out gets that value. Returns 0 with *max_out =
 * -inf when no l[i] is > -inf. */
int32_t g3_smp_argmax(const float *l, int n, float *max_out);

/* w[i] = exp(s) if s >= thr else 0, with s = (l[i] - m) / temp computed exactly so (IEEE float):
 * callers that recompute s get the same value. thr must be >= -87 (where exp leaves the normal range); NaN and -inf
 * logits get 0. blocks[b] = sum of w[b*G3_SMP_BLOCK ...] (float lanes of 8 terms each, then double: relative error
 * ~1e-7; a draw rescales within the block, so it stays consistent); returns the total. exp: ~2 ulp. */
double g3_smp_weights(const float *l, int n, float m, float temp, float thr, float *w, double *blocks);

/* g3_smp_weights with thr = -87 and no block sums, plus a histogram of the weights for top-p: hist[k][bin] +=
 * w[i] (k = i % 4: four partial histograms to add up), bin = (int)(-s * 16) for s > -64, else nbins (nbins <
 * G3_SMP_HIST_MAX; the caller zeroes hist[0..4)[0..nbins]). Bins <= b hold exactly the tokens with
 * s > -(b + 1) / 16 (for b < nbins), as -s * 16 is exact. */
#define G3_SMP_HIST_MAX 1032
void g3_smp_weights_hist(const float *l, int n, float m, float temp, float *w, double (*hist)[G3_SMP_HIST_MAX],
                         int nbins);
/* The same bins, counting the tokens with l[i] > -inf (for a large top-k): cnt[k][bin] += 1. */
void g3_smp_count_hist(const float *l, int n, float m, float temp, int32_t (*cnt)[G3_SMP_HIST_MAX], int nbins);

/* Zeroes w[i] unless token i is at or above the threshold in the candidate order (l[i] > lstar, or l[i] == lstar
 * and i <= idstar) and has s >= thr (s as above; thr = -INFINITY for none); rewrites blocks like g3_smp_weights
 * and returns the new total. */
double g3_smp_mask(const float *l, int n, float m, float temp, float thr, float lstar, int32_t idstar, float *w,
                   double *blocks);

/* c[j].w = exp((c[j].logit - m) / temp) (the same exp as above); returns the sum in double. */
double g3_smp_cand_weights(g3_cand *c, int n, float m, float temp);

/* The nt (>= 1) largest l[i] > -inf into top[0..k) as (i, l[i]), best first, lower id first among equal values;
 * returns k = min(nt, number of such l[i]). */
int g3_smp_top_n(const float *l, int n, int nt, g3_token_logprob *top);

/* Appends to out (in index order) every token with lo <= l[i] < hi and w[i] > 0 as (l[i], w[i], i); returns
 * how many. out must hold n entries. */
int g3_smp_collect(const float *l, const float *w, int n, float lo, float hi, g3_cand *out);

/* Sum of exp(l[i] - m) over the l[i] > -inf (NaN and terms below exp(-87.5) count 0), m >= every l[i]: the
 * log-softmax normalizer. Float lanes per 64 terms, then double: relative error ~1e-7. */
double g3_smp_sumexp(const float *l, int n, float m);

/* The variants behind the functions above, for the kernel tests: _base (4 lanes) always; _avx2 (8 lanes) where
 * G3_SMP_HAVE_AVX2, callable when g3_smp_cpu_avx2() says the CPU has AVX2 and FMA. They return nothing: the sums
 * are left in blocks (or c[j].w). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define G3_SMP_HAVE_AVX2 1
#else
#define G3_SMP_HAVE_AVX2 0
#endif
int g3_smp_cpu_avx2(void);
#define G3_SMP_DECLARE(sfx)                                                                                            \
    int32_t g3_smp_argmax_##sfx(const float *l, int n, float *max_out);                                                \
    void g3_smp_weights_##sfx(const float *l, int n, float m, float temp, float thr, float *w, double *blocks);         \
    void g3_smp_weights_hist_##sfx(const float *l, int n, float m, float temp, float *w,                               \
                                   double (*hist)[G3_SMP_HIST_MAX], int nbins);                                        \
    void g3_smp_count_hist_##sfx(const float *l, int n, float m, float temp, int32_t (*cnt)[G3_SMP_HIST_MAX],         \
                                 int nbins);                                                                           \
    void g3_smp_mask_##sfx(const float *l, int n, float m, float temp, float thr, float lstar, int32_t idstar,          \
                           float *w, double *blocks);                                                                  \
    void g3_smp_cand_weights_##sfx(g3_cand *c, int n, float m, float temp);                                           \
    double g3_smp_sumexp_##sfx(const float *l, int n, float m);                                                       \
    int g3_smp_collect_##sfx(const float *l, const float *w, int n, float lo, float hi, g3_cand *out);                 \
    int g3_smp_top_n_##sfx(const float *l, int n, int nt, g3_token_logprob *top);
G3_SMP_DECLARE(base)
#if G3_SMP_HAVE_AVX2
G3_SMP_DECLARE(avx2)
#endif

#endif
