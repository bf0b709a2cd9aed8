/* Sampling distributions: top-k 1 = greedy, chi-square tests of the draws against softmax (plain, tempered,
 * truncated by top-k / top-p / min-p), exact candidate sets on the full 262,144 vocabulary, and the partial
 * selection / sort helpers against qsort. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sampler.h"
#include "sample/select.h"

/* ---- helpers --------------------------------------------------------------------------------------------- */

static uint64_t trng_state;
static uint64_t trng(void) { /* splitmix64, independent of the sampler's generator */
    uint64_t z = (trng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double trand(double lo, double hi) { return lo + (hi - lo) * (double)(trng() >> 11) * 0x1.0p-53; }

static g3_sampler *make(float temp, int top_k, float top_p, float min_p, uint64_t seed, int vocab) {
    g3_sampling p;
    g3_sampling_default(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    g3_error err = {0};
    g3_sampler *s = g3_sampler_create(&p, vocab, &err);
    if (!s) print_error("create failed: %s\n", err.msg);
    assert_non_null(s);
    return s;
}

/* Reference: the truncated distribution in double. probs[vocab] out (0 outside the support); returns the support
 * size. Test preconditions: margin[0] = distance of the top-p cut's cumulative masses (just before and at the cut)
 * to top_p; margin[1] = smallest relative distance of any p / p_max to min_p. The sampler computes in float, so a
 * cut closer than rounding (~1e-7 for top-p sums, ~1e-6 for one token's p) may legitimately differ. */
typedef struct {
    double p;
    int id;
} ref_t;
static int cmp_ref(const void *a, const void *b) {
    const ref_t *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}
static int ref_dist(const float *l, int n, double temp, int top_k, double top_p, double min_p, double *probs,
                    double margin[2]) {
    ref_t *r = malloc((size_t)n * sizeof *r);
    double m = -INFINITY;
    for (int i = 0; i < n; i++) m = fmax(m, (double)l[i]);
    for (int i = 0; i < n; i++) {
        r[i].p = exp(((double)l[i] - m) / temp);
        r[i].id = i;
    }
    qsort(r, (size_t)n, sizeof *r, cmp_ref);
    int k = n;
    margin[0] = margin[1] = 1.0;
    if (top_k > 0 && top_k < k) k = top_k;
    if (top_p < 1.0) {
        double z = 0, acc = 0;
        for (int j = 0; j < k; j++) z += r[j].p;
        int cut = k;
        for (int j = 0; j < k; j++) {
            double before = acc;
            acc += r[j].p;
            if (acc >= top_p * z) {
                cut = j + 1;
                margin[0] = fmin(fabs(acc / z - top_p), fabs(before / z - top_p));
                break;
            }
        }
        k = cut;
    }
    if (min_p > 0.0) {
        int cut = k;
        for (int j = 0; j < k; j++) {
            margin[1] = fmin(margin[1], fabs(r[j].p - min_p) / min_p);
            if (r[j].p < min_p) {
                cut = j;
                break;
            }
        }
        k = cut;
    }
    double z = 0;
    for (int j = 0; j < k; j++) z += r[j].p;
    for (int i = 0; i < n; i++) probs[i] = 0;
    for (int j = 0; j < k; j++) probs[r[j].id] = r[j].p / z;
    free(r);
    return k;
}

/* 99.9% critical value of chi-square with df degrees of freedom (Wilson-Hilferty; 37.84 for df 15, exact 37.70). */
static double chi2_crit(int df) {
    double a = 2.0 / (9.0 * df);
    double t = 1.0 - a + 3.0902 * sqrt(a);
    return df * t * t * t;
}
static double chi2(const long *counts, const double *probs, int n, long draws) {
    double x = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0) {
            double e = probs[i] * (double)draws;
            x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
        }
    return x;
}

/* Draws `draws` tokens and counts them; fails if any drawn token has zero reference probability. */
static void draw_counts(g3_sampler *s, const float *l, int n, long draws, const double *probs, long *counts) {
    float *work = malloc((size_t)n * sizeof *work);
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (long d = 0; d < draws; d++) {
        memcpy(work, l, (size_t)n * sizeof *work);
        int32_t t = g3_sampler_sample(s, work, NULL, NULL, NULL);
        assert_true(t >= 0 && t < n);
        if (probs[t] == 0) fail_msg("drew token %d outside the expected support", t);
        counts[t]++;
    }
    free(work);
}

/* ---- tests ----------------------------------------------------------------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    g3_sampling p;
    memset(&p, 0x5a, sizeof p);
    g3_sampling_default(&p);
    assert_true(p.temperature == 0.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f);
    assert_int_equal(p.penalty_last_n, 64);
    assert_true(p.seed == 0 && p.n_logprobs == 0 && p.logit_bias == NULL && p.n_logit_bias == 0);
}

static void test_top_k1_equals_greedy(void **state) {
    (void)state;
    enum { V = 3000, CASES = 300 };
    float l[V], a[V], b[V];
    trng_state = 1;
    g3_sampler *greedy = make(0.0f, 0, 1.0f, 0.0f, 0, V);
    for (int c = 0; c < CASES; c++) {
        /* quantized logits: ties at the top are common, and must go to the lowest id */
        for (int i = 0; i < V; i++) l[i] = (float)(floor(trand(-8, 8) * 2.0) / 2.0);
        int ref = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[ref]) ref = i;
        float temp = (c % 3 == 0) ? 1.0f : (c % 3 == 1) ? 0.3f : 2.5f;
        g3_sampler *k1 = make(temp, 1, c % 2 ? 1.0f : 0.9f, 0.0f, (uint64_t)c * 7919u, V);
        memcpy(a, l, sizeof l);
        memcpy(b, l, sizeof l);
        int32_t tg = g3_sampler_sample(greedy, a, NULL, NULL, NULL);
        int32_t tk = g3_sampler_sample(k1, b, NULL, NULL, NULL);
        assert_int_equal(tg, ref);
        assert_int_equal(tk, ref);
        g3_sampler_free(k1);
    }
    g3_sampler_free(greedy);
}

/* Chi-square of `draws` samples at temperature temp against softmax(l / temp); with a negative control showing
 * the statistic does reject a slightly different distribution (softmax(l / (0.9 temp))). */
static void check_softmax_fit(float temp, uint64_t seed) {
    enum { V = 16 };
    const long draws = 200000;
    float l[V];
    double probs[V], wrong[V], margin[2];
    long counts[V];
    trng_state = seed;
    for (int i = 0; i < V; i++) l[i] = (float)trand(-3, 3);
    assert_int_equal(ref_dist(l, V, temp, 0, 1.0, 0.0, probs, margin), V);
    ref_dist(l, V, 0.9 * temp, 0, 1.0, 0.0, wrong, margin);
    g3_sampler *s = make(temp, 0, 1.0f, 0.0f, seed, V);
    draw_counts(s, l, V, draws, probs, counts);
    double x = chi2(counts, probs, V, draws), xw = chi2(counts, wrong, V, draws);
    print_message("temperature %.2f: chi2 = %.2f (critical 37.70 at 99.9%%, 15 dof); vs softmax(l/%.2f): %.1f\n",
                  temp, x, 0.9 * temp, xw);
    assert_true(x < 37.70);
    assert_true(xw > 37.70);
    g3_sampler_free(s);
}

static void test_chi_square_softmax(void **state) {
    (void)state;
    check_softmax_fit(1.0f, 12345);
}

static void test_chi_square_temperature_half(void **state) {
    (void)state;
    check_softmax_fit(0.5f, 777);
}

/* A vocabulary of several 64-token blocks (the dense draw first picks a block by its partial sum), plain and with
 * min-p folded into the weights: frequencies against the reference over every token. */
static void test_chi_square_multi_block(void **state) {
    (void)state;
    enum { V = 300 };
    const long draws = 120000;
    float l[V];
    double probs[V], margin[2];
    long counts[V];
    trng_state = 31;
    for (int i = 0; i < V; i++) l[i] = (float)trand(-2, 2);
    const float min_ps[2] = {0.0f, 0.1f};
    for (int c = 0; c < 2; c++) {
        int k = ref_dist(l, V, 1.0, 0, 1.0, min_ps[c], probs, margin);
        assert_true(margin[1] > 1e-3);
        g3_sampler *s = make(1.0f, 0, 1.0f, min_ps[c], 2024 + c, V);
        draw_counts(s, l, V, draws, probs, counts);
        int seen = 0;
        for (int i = 0; i < V; i++) seen += counts[i] > 0;
        double x = chi2(counts, probs, V, draws);
        print_message("min_p %.2f: support %d, seen %d, chi2 %.1f (critical %.1f)\n", min_ps[c], k, seen, x,
                      chi2_crit(k - 1));
        assert_int_equal(seen, k);
        assert_true(x < chi2_crit(k - 1));
        g3_sampler_free(s);
    }
}

/* top-k / top-p / min-p on a small vocabulary: exact support, exact renormalized probabilities, and frequencies. */
static void test_truncation_support_and_frequencies(void **state) {
    (void)state;
    enum { V = 32 };
    struct {
        float temp;
        int top_k;
        float top_p, min_p;
    } cases[] = {
        {1.0f, 10, 1.0f, 0.0f},  {1.0f, 0, 0.7f, 0.0f},   {1.0f, 0, 1.0f, 0.1f},
        {0.8f, 12, 0.8f, 0.05f}, {1.5f, 20, 0.9f, 0.0f},  {0.7f, 0, 0.95f, 0.2f},
    };
    float l[V], work[V];
    double probs[V], margin[2];
    long counts[V];
    int32_t ids[V];
    float cp[V];
    trng_state = 99;
    for (int i = 0; i < V; i++) l[i] = (float)trand(-4, 4);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int k = ref_dist(l, V, cases[c].temp, cases[c].top_k, cases[c].top_p, cases[c].min_p, probs, margin);
        assert_true(margin[0] > 1e-3 && margin[1] > 1e-3); /* precondition: no cut on a rounding knife-edge */
        assert_true(k > 1 && k < V); /* the case really truncates and still samples */
        g3_sampler *s = make(cases[c].temp, cases[c].top_k, cases[c].top_p, cases[c].min_p, 4242 + c, V);
        memcpy(work, l, sizeof l);
        int n = g3_sampler_candidates(s, work, ids, cp);
        assert_int_equal(n, k);
        double sum = 0;
        for (int j = 0; j < n; j++) {
            assert_true(probs[ids[j]] > 0);
            assert_true(fabs(cp[j] - probs[ids[j]]) < 1e-5);
            sum += cp[j];
        }
        assert_true(fabs(sum - 1.0) < 1e-5);
        const long draws = 40000;
        draw_counts(s, l, V, draws, probs, counts);
        int seen = 0;
        for (int i = 0; i < V; i++) seen += counts[i] > 0;
        double x = chi2(counts, probs, V, draws);
        print_message("case %zu: support %d, seen %d, chi2 %.2f (critical %.2f)\n", c, k, seen, x,
                      chi2_crit(k - 1));
        assert_int_equal(seen, k);
        assert_true(x < chi2_crit(k - 1));
        g3_sampler_free(s);
    }
}

/* The full Gemma vocabulary: top-p needing far more than the first 1024 sorted candidates (the extension path),
 * top-k by quickselect, min-p; the candidate set must equal the double-precision reference exactly. */
static void test_full_vocab_exact_sets(void **state) {
    (void)state;
    enum { V = 262144 };
    struct {
        float temp, spread;
        int top_k;
        float top_p, min_p;
    } cases[] = {
        {1.0f, 2.0f, 0, 0.9f, 0.0f},     /* near-flat: the top-p set is ~200k tokens */
        {1.0f, 12.0f, 0, 0.5f, 0.0f},    /* a few thousand */
        {0.7f, 10.0f, 5000, 0.95f, 0.0f},
        {1.0f, 10.0f, 40, 1.0f, 0.0f},   /* plain top-k */
        {1.3f, 10.0f, 0, 1.0f, 0.02f},   /* plain min-p */
        {1.0f, 6.0f, 0, 0.8f, 0.3f},
        {1.0f, 200.0f, 3000, 1.0f, 0.3f}, /* top-k by quickselect, then min-p on the candidates */
        {0.9f, 100.0f, 1500, 0.9f, 0.7f}, /* top-k by the heap, top-p by sorting, min-p */
    };
    float *l = malloc(V * sizeof *l), *work = malloc(V * sizeof *work), *cp = malloc(V * sizeof *cp);
    double *probs = malloc(V * sizeof *probs);
    int32_t *ids = malloc(V * sizeof *ids);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        trng_state = 1000 + c;
        for (int i = 0; i < V; i++) l[i] = (float)trand(0, cases[c].spread);
        double margin[2];
        int k = ref_dist(l, V, cases[c].temp, cases[c].top_k, cases[c].top_p, cases[c].min_p, probs, margin);
        g3_sampler *s = make(cases[c].temp, cases[c].top_k, cases[c].top_p, cases[c].min_p, 1, V);
        memcpy(work, l, V * sizeof *l);
        int n = g3_sampler_candidates(s, work, ids, cp);
        print_message("case %zu: reference support %d, sampler %d (margins %.2g %.2g)\n", c, k, n, margin[0],
                      margin[1]);
        assert_true(margin[0] > 1e-7 && margin[1] > 3e-6);
        assert_int_equal(n, k);
        double maxd = 0;
        for (int j = 0; j < n; j++) {
            assert_true(probs[ids[j]] > 0);
            maxd = fmax(maxd, fabs(cp[j] - probs[ids[j]]) / probs[ids[j]]);
        }
        assert_true(maxd < 1e-4);
        /* and drawing stays inside the set */
        for (int d = 0; d < 5; d++) {
            memcpy(work, l, V * sizeof *l);
            int32_t t = g3_sampler_sample(s, work, NULL, NULL, NULL);
            assert_true(t >= 0 && t < V && probs[t] > 0);
        }
        g3_sampler_free(s);
    }
    free(l);
    free(work);
    free(cp);
    free(probs);
    free(ids);
}

/* top-k exactly: ties at the k-th value go to the lowest ids, for the heap (k <= 2048) and the histogram path;
 * fewer valid tokens than k keeps them all. The set is compared with a full sort. */
static int cmp_cand(const void *a, const void *b);
static void test_top_k_ties(void **state) {
    (void)state;
    enum { V = 20000 };
    float *l = malloc(V * sizeof *l), *work = malloc(V * sizeof *work), *cp = malloc(V * sizeof *cp);
    int32_t *ids = malloc(V * sizeof *ids);
    g3_cand *ref = malloc(V * sizeof *ref);
    char *in = malloc(V);
    const int ks[] = {1, 7, 2000, 2048, 2049, 3000, 9000};
    trng_state = 77;
    for (int round = 0; round < 3; round++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            int nvalid = 0;
            for (int i = 0; i < V; i++) {
                /* coarse values: hundreds of ties per value; round 2 bans all but 1500 tokens */
                l[i] = (float)(trng() % 40) * 0.25f;
                if (round == 1 && i % 3 == 0) l[i] = NAN;
                if (round == 2 && i >= 1500) l[i] = -INFINITY;
                if (l[i] > -INFINITY) {
                    ref[nvalid].logit = l[i];
                    ref[nvalid].id = i;
                    nvalid++;
                }
            }
            qsort(ref, (size_t)nvalid, sizeof *ref, cmp_cand);
            int k = ks[ki], want = k < nvalid ? k : nvalid;
            g3_sampler *s = make(1.0f, k, 1.0f, 0.0f, 3, V);
            memcpy(work, l, V * sizeof *l);
            int n = g3_sampler_candidates(s, work, ids, cp);
            assert_int_equal(n, want);
            memset(in, 0, V);
            for (int j = 0; j < n; j++) in[ids[j]] = 1;
            for (int j = 0; j < want; j++)
                if (!in[ref[j].id]) fail_msg("k=%d round %d: token %d (logit %g) missing", k, round, ref[j].id, ref[j].logit);
            g3_sampler_free(s);
        }
    free(l);
    free(work);
    free(cp);
    free(ids);
    free(ref);
    free(in);
}

/* Logits exactly on the histogram's bin edges (multiples of 1/16 below a max of 0, and the next float above
 * each, the first value of a bin): the top-p and large top-k sets must still equal the full sort's. */
static void test_bin_edges(void **state) {
    (void)state;
    enum { V = 6000 };
    float *l = malloc(V * sizeof *l), *work = malloc(V * sizeof *work), *cp = malloc(V * sizeof *cp);
    double *probs = malloc(V * sizeof *probs);
    int32_t *ids = malloc(V * sizeof *ids);
    struct {
        int top_k;
        float top_p;
    } cases[] = {{0, 0.5f}, {0, 0.9f}, {0, 0.97f}, {0, 0.3f}, {0, 0.6f}, {0, 0.75f}, {0, 0.8f}, {0, 0.85f},
                 {2500, 1.0f}, {4000, 0.95f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        trng_state = 500 + c;
        for (int i = 0; i < V; i++) {
            float edge = -(float)(trng() % 48) / 16.0f;
            l[i] = trng() % 2 ? edge : nextafterf(edge, 0.0f);
        }
        l[V / 2] = 0.0f;
        double margin[2];
        int k = ref_dist(l, V, 1.0, cases[c].top_k, cases[c].top_p, 0.0, probs, margin);
        g3_sampler *s = make(1.0f, cases[c].top_k, cases[c].top_p, 0.0f, 1, V);
        memcpy(work, l, V * sizeof *l);
        int n = g3_sampler_candidates(s, work, ids, cp);
        print_message("case %zu: support %d, sampler %d (margin %.2g)\n", c, k, n, margin[0]);
        assert_true(margin[0] > 1e-6);
        assert_int_equal(n, k);
        for (int j = 0; j < n; j++)
            if (!(probs[ids[j]] > 0)) fail_msg("case %zu: token %d (logit %.9g) kept", c, ids[j], l[ids[j]]);
        g3_sampler_free(s);
    }
    free(l);
    free(work);
    free(cp);
    free(probs);
    free(ids);
}

static int cmp_cand(const void *a, const void *b) {
    const g3_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

static void test_select_and_sort(void **state) {
    (void)state;
    enum { N = 3000 };
    g3_cand *a = malloc(N * sizeof *a), *ref = malloc(N * sizeof *ref);
    trng_state = 5;
    for (int round = 0; round < 80; round++) {
        int n = 1 + (int)(trng() % N);
        for (int i = 0; i < n; i++) {
            float x;
            switch (round % 4) {
            case 0: x = (float)trand(-5, 5); break;
            case 1: x = (float)(trng() % 7); break;           /* many ties */
            case 2: x = (float)i; break;                        /* ascending */
            default: x = i % 2 ? -INFINITY : (float)(n - i); /* descending with -inf */
            }
            a[i].logit = x;
            a[i].w = (float)trand(0, 1);
            a[i].id = i;
        }
        memcpy(ref, a, (size_t)n * sizeof *a);
        qsort(ref, (size_t)n, sizeof *ref, cmp_cand);
        int k = (int)(trng() % (uint64_t)(n + 1));
        g3_cand_select(a, n, k);
        /* a[0..k) must be exactly the k best: as a set, equal to ref[0..k) */
        g3_cand_sort(a, k);
        for (int i = 0; i < k; i++) assert_true(a[i].id == ref[i].id);
        g3_cand_sort(a + k, n - k);
        for (int i = k; i < n; i++) assert_true(a[i].id == ref[i].id);

        /* weighted prefix: the smallest best-first prefix of weight >= need, against a scan of the sorted copy */
        double total = 0;
        for (int i = 0; i < n; i++) total += a[i].w;
        double need = trand(0.001, 0.999) * total, acc = 0;
        int want = n;
        for (int i = 0; i < n; i++) {
            acc += ref[i].w;
            if (acc >= need) {
                want = i + 1;
                break;
            }
        }
        int got = g3_cand_mass_prefix(a, n, need);
        assert_int_equal(got, want);
        g3_cand_sort(a, got);
        for (int i = 0; i < got; i++) assert_true(a[i].id == ref[i].id);
    }
    free(a);
    free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_top_k1_equals_greedy),
        cmocka_unit_test(test_chi_square_softmax),
        cmocka_unit_test(test_chi_square_temperature_half),
        cmocka_unit_test(test_chi_square_multi_block),
        cmocka_unit_test(test_truncation_support_and_frequencies),
        cmocka_unit_test(test_full_vocab_exact_sets),
        cmocka_unit_test(test_top_k_ties),
        cmocka_unit_test(test_bin_edges),
        cmocka_unit_test(test_select_and_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
