/* The sampler's vocabulary-wide kernels, every variant this machine can run (4-lane base, 8-lane AVX2 + FMA),
 * against scalar double-precision references: argmax (ties, NaN, -inf, ragged lengths), exp weights and their
 * block sums, the top-p histogram, the threshold mask, candidate weights. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/kernels.h"

typedef struct {
    const char *name;
    int32_t (*argmax)(const float *, int, float *);
    void (*weights)(const float *, int, float, float, float, float *, double *);
    void (*hist)(const float *, int, float, float, float *, double (*)[G3_SMP_HIST_MAX], int);
    void (*count)(const float *, int, float, float, int32_t (*)[G3_SMP_HIST_MAX], int);
    void (*mask)(const float *, int, float, float, float, float, int32_t, float *, double *);
    void (*cand)(g3_cand *, int, float, float);
    double (*sumexp)(const float *, int, float);
    int (*collect)(const float *, const float *, int, float, float, g3_cand *);
    int (*top_n)(const float *, int, int, g3_token_logprob *);
} variant;

static variant variants[2];
static int n_variants;

static void pick_variants(void) {
    n_variants = 0;
    variants[n_variants++] = (variant){"base", g3_smp_argmax_base, g3_smp_weights_base, g3_smp_weights_hist_base,
                                       g3_smp_count_hist_base, g3_smp_mask_base, g3_smp_cand_weights_base,
                                       g3_smp_sumexp_base, g3_smp_collect_base,
                                       g3_smp_top_n_base};
#if G3_SMP_HAVE_AVX2
    if (g3_smp_cpu_avx2())
        variants[n_variants++] = (variant){"avx2", g3_smp_argmax_avx2, g3_smp_weights_avx2,
                                           g3_smp_weights_hist_avx2, g3_smp_count_hist_avx2, g3_smp_mask_avx2, g3_smp_cand_weights_avx2,
                                           g3_smp_sumexp_avx2, g3_smp_collect_avx2,
                                           g3_smp_top_n_avx2};
    else
        print_message("no AVX2+FMA on this CPU: only the base kernels are tested\n");
#endif
}

static uint64_t trng_state;
static uint64_t trng(void) {
    uint64_t z = (trng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double trand(double lo, double hi) { return lo + (hi - lo) * (double)(trng() >> 11) * 0x1.0p-53; }

static const int lengths[] = {1, 3, 7, 8, 15, 16, 17, 63, 64, 65, 127, 1000, 4099};

/* Random logits with some -inf, NaN and repeated values. */
static void fill(float *l, int n, double spread) {
    for (int i = 0; i < n; i++) {
        uint64_t r = trng() % 20;
        if (r == 0) l[i] = -INFINITY;
        else if (r == 1) l[i] = NAN;
        else if (r == 2) l[i] = 1.5f; /* ties */
        else l[i] = (float)trand(-spread, spread);
    }
}

static void test_argmax(void **state) {
    (void)state;
    float l[4099];
    trng_state = 1;
    for (int v = 0; v < n_variants; v++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (int rep = 0; rep < 20; rep++) {
                int n = lengths[li];
                fill(l, n, rep % 2 ? 1.0 : 3.0); /* spread 1: 1.5 ties are the max */
                if (rep == 5)
                    for (int i = 0; i < n; i++) l[i] = -INFINITY; /* nothing valid */
                if (rep == 6)
                    for (int i = 0; i < n; i++) l[i] = NAN;
                int want = 0;
                float wm = -INFINITY;
                for (int i = 0; i < n; i++)
                    if (l[i] > wm) {
                        wm = l[i];
                        want = i;
                    }
                float m = 0;
                int32_t got = variants[v].argmax(l, n, &m);
                if (got != want || !(m == wm))
                    fail_msg("%s n=%d rep=%d: argmax %d (%g), want %d (%g)", variants[v].name, n, rep, got, m, want,
                             wm);
            }
}

/* s as the kernels compute it (float). */
static float s_of(float x, float m, float t) { return (x - m) / t; }

static void test_weights(void **state) {
    (void)state;
    float l[4099], w[4099];
    double blocks[4099 / G3_SMP_BLOCK + 2];
    trng_state = 2;
    double worst = 0;
    for (int v = 0; v < n_variants; v++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (int rep = 0; rep < 6; rep++) {
                int n = lengths[li];
                fill(l, n, 60.0);
                float m = 40.0f, t = rep % 3 == 0 ? 1.0f : rep % 3 == 1 ? 0.37f : 2.5f;
                float thr = rep < 3 ? -87.0f : -2.0f;
                variants[v].weights(l, n, m, t, thr, w, blocks);
                for (int b = 0; b * G3_SMP_BLOCK < n; b++) {
                    double sum = 0;
                    for (int i = b * G3_SMP_BLOCK; i < n && i < (b + 1) * G3_SMP_BLOCK; i++) {
                        float s = s_of(l[i], m, t);
                        double want = s >= thr ? exp((double)s) : 0.0; /* NaN and -inf: 0 */
                        if (want == 0.0) assert_true(w[i] == 0.0f);
                        else {
                            double rel = fabs(w[i] - want) / want;
                            worst = fmax(worst, rel);
                            if (rel > 5e-7) fail_msg("%s: exp(%g) = %g, want %g", variants[v].name, s, w[i], want);
                        }
                        sum += w[i];
                    }
                    assert_true(fabs(blocks[b] - sum) <= 1e-6 * sum);
                }
            }
    print_message("largest relative exp error: %.2g\n", worst);
}

static void test_exp_range(void **state) {
    (void)state;
    enum { N = 100000 };
    float *l = malloc(N * sizeof *l), *w = malloc(N * sizeof *w);
    double *blocks = malloc((N / G3_SMP_BLOCK + 1) * sizeof *blocks);
    for (int i = 0; i < N; i++) l[i] = -87.0f * (float)i / (N - 1); /* s from 0 down to -87 */
    for (int v = 0; v < n_variants; v++) {
        variants[v].weights(l, N, 0.0f, 1.0f, -87.0f, w, blocks);
        double worst = 0;
        for (int i = 0; i < N; i++) worst = fmax(worst, fabs(w[i] - exp((double)l[i])) / exp((double)l[i]));
        print_message("%s: exp over [-87, 0]: max relative error %.2g\n", variants[v].name, worst);
        assert_true(worst < 3e-7);
        assert_true(w[0] == 1.0f);
    }
    free(l);
    free(w);
    free(blocks);
}

static int ref_bin(float s, int nb) { return s > -64.0f ? (int)(-s * 16.0f) : nb; }

static void test_hist(void **state) {
    (void)state;
    enum { NB = 1024 };
    float l[4099], w[4099];
    static double hist[4][G3_SMP_HIST_MAX];
    static int32_t cnt[4][G3_SMP_HIST_MAX];
    double want[NB + 1];
    int32_t want_cnt[NB + 1];
    trng_state = 3;
    for (int v = 0; v < n_variants; v++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            int n = lengths[li];
            fill(l, n, 40.0);
            float m = 40.0f, t = 0.8f;
            memset(hist, 0, sizeof hist);
            memset(cnt, 0, sizeof cnt);
            memset(want, 0, sizeof want);
            memset(want_cnt, 0, sizeof want_cnt);
            variants[v].hist(l, n, m, t, w, hist, NB);
            variants[v].count(l, n, m, t, cnt, NB);
            for (int i = 0; i < n; i++) {
                float s = s_of(l[i], m, t);
                int b = ref_bin(s, NB);
                double e = s >= -87.0f ? exp((double)s) : 0.0;
                assert_true(e == 0 ? w[i] == 0 : fabs(w[i] - e) <= 5e-7 * e);
                want[b] += w[i];
                want_cnt[b] += l[i] > -INFINITY;
            }
            for (int b = 0; b <= NB; b++) {
                double got = (hist[0][b] + hist[1][b]) + (hist[2][b] + hist[3][b]);
                if (fabs(got - want[b]) > 1e-12 * (want[b] + 1e-300))
                    fail_msg("%s n=%d bin %d: %g, want %g", variants[v].name, n, b, got, want[b]);
                int32_t c = (cnt[0][b] + cnt[1][b]) + (cnt[2][b] + cnt[3][b]);
                if (c != want_cnt[b]) fail_msg("%s n=%d bin %d: count %d, want %d", variants[v].name, n, b, c, want_cnt[b]);
            }
        }
}

static void test_mask(void **state) {
    (void)state;
    float l[4099], w[4099], w0[4099];
    double blocks[4099 / G3_SMP_BLOCK + 2];
    trng_state = 4;
    for (int v = 0; v < n_variants; v++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (int rep = 0; rep < 4; rep++) {
                int n = lengths[li];
                fill(l, n, 3.0);
                for (int i = 0; i < n; i++) w0[i] = w[i] = (float)trand(0, 1);
                float lstar = rep < 2 ? 1.5f : 0.2f; /* 1.5: ties at the threshold, cut by id */
                int32_t idstar = (int32_t)(n / 2);
                l[idstar] = lstar; /* a tie at the threshold itself, kept; the next tie is cut */
                if (idstar + 1 < n) l[idstar + 1] = lstar;
                float thr = rep % 2 ? -1.0f : -INFINITY, m = 3.0f, t = 1.3f;
                variants[v].mask(l, n, m, t, thr, lstar, idstar, w, blocks);
                double sum = 0;
                for (int i = 0; i < n; i++) {
                    int keep = (l[i] > lstar || (l[i] == lstar && i <= idstar)) && s_of(l[i], m, t) >= thr;
                    if (w[i] != (keep ? w0[i] : 0.0f))
                        fail_msg("%s n=%d token %d (l %g): w %g, keep %d", variants[v].name, n, i, l[i], w[i], keep);
                    sum += w[i];
                    if (i % G3_SMP_BLOCK == G3_SMP_BLOCK - 1 || i == n - 1) {
                        assert_true(fabs(blocks[i / G3_SMP_BLOCK] - sum) <= 1e-6 * sum);
                        sum = 0;
                    }
                }
            }
}

static void test_cand_weights(void **state) {
    (void)state;
    g3_cand c[37];
    trng_state = 5;
    for (int v = 0; v < n_variants; v++)
        for (int n = 0; n <= 37; n++) {
            for (int j = 0; j < n; j++) {
                c[j].logit = (float)trand(-100, 5);
                c[j].id = j;
                c[j].w = -1.0f;
            }
            variants[v].cand(c, n, 5.0f, 0.9f);
            for (int j = 0; j < n; j++) {
                float s = s_of(c[j].logit, 5.0f, 0.9f);
                double e = s >= -87.5f ? exp((double)s) : 0.0;
                assert_true(e == 0 ? c[j].w == 0.0f : fabs(c[j].w - e) <= 5e-7 * e);
            }
        }
}

static void test_sumexp(void **state) {
    (void)state;
    float l[4099];
    trng_state = 6;
    for (int v = 0; v < n_variants; v++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            int n = lengths[li];
            fill(l, n, 20.0);
            double want = 0;
            for (int i = 0; i < n; i++)
                if (l[i] > -INFINITY && l[i] - 20.0f >= -87.5f) want += exp((double)l[i] - 20.0);
            double got = variants[v].sumexp(l, n, 20.0f);
            if (!(fabs(got - want) <= 1e-6 * want))
                fail_msg("%s n=%d: sumexp %.9g, want %.9g", variants[v].name, n, got, want);
        }
}

static void test_collect(void **state) {
    (void)state;
    float l[4099], w[4099];
    g3_cand out[4099];
    trng_state = 7;
    for (int v = 0; v < n_variants; v++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (int rep = 0; rep < 4; rep++) {
                int n = lengths[li];
                fill(l, n, 4.0);
                for (int i = 0; i < n; i++) w[i] = trng() % 5 ? (float)trand(0.1, 1) : 0.0f;
                float lo = rep < 2 ? 1.5f : -1.0f, hi = rep % 2 ? 1.75f : 3.0f; /* 1.5: ties on the lower bound */
                int got = variants[v].collect(l, w, n, lo, hi, out), k = 0;
                for (int i = 0; i < n; i++)
                    if (l[i] >= lo && l[i] < hi && w[i] > 0) {
                        if (k >= got || out[k].id != i || out[k].logit != l[i] || out[k].w != w[i])
                            fail_msg("%s n=%d: member %d (token %d) missing or wrong", variants[v].name, n, k, i);
                        k++;
                    }
                assert_int_equal(got, k);
            }
}

static int cmp_desc_id(const void *a, const void *b) {
    const g3_token_logprob *x = a, *y = b;
    if (x->logprob != y->logprob) return x->logprob > y->logprob ? -1 : 1;
    return x->token - y->token;
}

static void test_top_n(void **state) {
    (void)state;
    float l[4099];
    static g3_token_logprob ref[4099];
    g3_token_logprob top[20];
    trng_state = 8;
    for (int v = 0; v < n_variants; v++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (int nt = 1; nt <= 20; nt += 6) {
                int n = lengths[li], nv = 0;
                fill(l, n, nt % 2 ? 1.0 : 5.0); /* spread 1: the 1.5 ties lead */
                for (int i = 0; i < n; i++)
                    if (l[i] > -INFINITY) ref[nv++] = (g3_token_logprob){i, l[i]};
                qsort(ref, (size_t)nv, sizeof *ref, cmp_desc_id);
                int got = variants[v].top_n(l, n, nt, top);
                assert_int_equal(got, nv < nt ? nv : nt);
                for (int j = 0; j < got; j++)
                    if (top[j].token != ref[j].token || top[j].logprob != ref[j].logprob)
                        fail_msg("%s n=%d nt=%d: entry %d is (%d, %g), want (%d, %g)", variants[v].name, n, nt, j,
                                 top[j].token, top[j].logprob, ref[j].token, ref[j].logprob);
            }
}

static int setup(void **state) {
    (void)state;
    pick_variants();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax),  cmocka_unit_test(test_weights),      cmocka_unit_test(test_exp_range),
        cmocka_unit_test(test_hist),    cmocka_unit_test(test_mask),         cmocka_unit_test(test_cand_weights),
        cmocka_unit_test(test_sumexp),
        cmocka_unit_test(test_collect),
        cmocka_unit_test(test_top_n),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
