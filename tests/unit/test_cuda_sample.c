/* The sampling chain on the device (sample.cu, backend.h's forward_sample) against the host sampler
 * (sample/sampler.h): the same settings and history exported by g3_sampler_device_row, the logits after the
 * adjustments compared with the host's, and the kept distribution probed through the draw: for a token of the host's
 * distribution with probability p and cumulative probability c before it (tokens in id order, as the device walks
 * them), u = c + p / 2 must draw exactly that token. That checks the kept set and every weight down to ~1e-6 at each
 * probed token. Skipped without CUDA or a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "cuda_testutil.h"
#include "sample/sampler.h"

#define MAX_PROBES 1024
#define MIN_P_PROBE 2e-5 /* tokens less probable than this are not probed (their interval is below the tolerance) */

typedef struct scase {
    const char *name;
    int V;
    g3_sampling sp;
    const int32_t *hist; /* tokens accepted before sampling */
    int n_hist;
} scase;

/* Samples the host's distribution (g3_sampler_candidates) of `logits` and probes the device with u at the middle of
 * up to MAX_PROBES of its tokens (all of them when few, else evenly spread, the two ends included). Returns the
 * number of probes that drew another token. */
static int run_case(const scase *c, const float *logits) {
    const int V = c->V;
    g3_error err = {0};
    g3_sampler *host = g3_sampler_create(&c->sp, V, &err), *dev = g3_sampler_create(&c->sp, V, &err);
    if (!host || !dev) fail_msg("%s: %s", c->name, err.msg);
    for (int i = 0; i < c->n_hist; i++) g3_sampler_accept(host, c->hist[i]), g3_sampler_accept(dev, c->hist[i]);

    float *work = malloc(sizeof(float) * V), *cp = malloc(sizeof(float) * V);
    int32_t *cid = malloc(sizeof(int32_t) * V);
    double *p = calloc((size_t)V, sizeof(double));
    memcpy(work, logits, sizeof(float) * V);
    int n = g3_sampler_candidates(host, work, cid, cp); /* work: the logits after bias and penalties */
    for (int j = 0; j < n; j++) p[cid[j]] = cp[j];

    /* probes: token ids of the host's distribution in id order, the u at the middle of each one's interval */
    int n_tok = 0;
    for (int t = 0; t < V; t++) n_tok += p[t] > 0;
    int32_t *probe_tok = malloc(sizeof(int32_t) * (MAX_PROBES + 2));
    double *probe_u = malloc(sizeof(double) * (MAX_PROBES + 2));
    int np = 0, k = 0;
    double cum = 0.0;
    const int every = n_tok <= MAX_PROBES ? 1 : (n_tok + MAX_PROBES - 1) / MAX_PROBES;
    for (int t = 0; t < V; t++) {
        if (!(p[t] > 0)) continue;
        if (k++ % every == 0 && p[t] >= MIN_P_PROBE && np < MAX_PROBES)
            probe_tok[np] = t, probe_u[np++] = cum + p[t] / 2;
        cum += p[t];
    }
    /* the ends, u = 0 and the largest u below 1: the first / last token of the distribution, up to a negligible mass
     * (the device drops tokens below ~e^-30.5 of the most probable one; the host keeps them down to e^-87) */
    double *before = malloc(sizeof(double) * ((size_t)V + 1));
    before[0] = 0.0;
    for (int t = 0; t < V; t++) before[t + 1] = before[t] + p[t];
    probe_tok[np] = -1, probe_u[np++] = 0.0;
    probe_tok[np] = -2, probe_u[np++] = 1.0 - 0x1.0p-53;

    /* the device rows: the exported row (its uniform replaced by the probe's), logits replicated */
    g3_dev_sample *rows = malloc(sizeof *rows * np);
    g3_dev_adjust *adj = malloc(sizeof *adj * (g3_sampler_device_entries(dev) + 1));
    assert_true(g3_sampler_device_entries(dev) >= 0);
    int n_adj = g3_sampler_device_row(dev, &rows[0], adj);
    for (int i = 0; i < np; i++) rows[i] = rows[0], rows[i].adj0 = 0, rows[i].u = probe_u[i];
    float *all = malloc(sizeof(float) * (size_t)np * V), *adjusted = malloc(sizeof(float) * (size_t)np * V);
    for (int i = 0; i < np; i++) memcpy(all + (size_t)i * V, logits, sizeof(float) * V);
    int32_t *ids = malloc(sizeof(int32_t) * np);
    if (g3_cuda_test_sample(all, np, V, rows, adj, n_adj, ids, adjusted, &err) != G3_OK) fail_msg("%s", err.msg);

    int bad_adj = 0;
    for (int t = 0; t < V; t++) {
        const float a = adjusted[t], b = work[t];
        if (!(a == b || (isnan(a) && isnan(b)) || fabsf(a - b) <= 1e-6f * fabsf(b))) bad_adj++;
    }
    int wrong = 0;
    for (int i = 0; i < np; i++) {
        if (probe_tok[i] < 0) { /* an end: a kept token with (almost) nothing before / after it */
            const int g = ids[i];
            const int ok = g >= 0 && g < V && p[g] > 0 &&
                           (probe_tok[i] == -1 ? before[g] < 1e-6 : before[V] - before[g + 1] < 1e-6);
            if (!ok) printf("    end probe u %.17g drew %d (p %.3g)\n", probe_u[i], g, g >= 0 && g < V ? p[g] : -1.0);
            wrong += !ok;
            continue;
        }
        if (ids[i] != probe_tok[i]) {
            if (wrong < 5)
                printf("    probe %d: u %.9f drew %d (p %.3g), the host's token there %d (p %.3g)\n", i, probe_u[i],
                       ids[i], ids[i] >= 0 && ids[i] < V ? p[ids[i]] : -1.0, probe_tok[i], p[probe_tok[i]]);
            wrong++;
        }
    }
    printf("  %-28s V=%6d: %6d tokens kept by the host, %4d probes, %d drew another token, %d adjusted logits "
           "differ (%d adjustments)\n",
           c->name, V, n_tok, np, wrong, bad_adj, n_adj);
    assert_int_equal(bad_adj, 0);
    g3_sampler_free(host), g3_sampler_free(dev);
    free(work), free(cp), free(cid), free(p), free(probe_tok), free(probe_u), free(rows), free(adj), free(all);
    free(adjusted), free(ids), free(before);
    return wrong;
}

static float *random_logits(int V, float scale) {
    float *l = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) { /* roughly normal: the sum of three uniforms */
        float g = frand() + frand() + frand();
        l[i] = scale * g;
    }
    return l;
}

static g3_sampling settings(float temp, int top_k, float top_p, float min_p) {
    g3_sampling s;
    g3_sampling_default(&s);
    s.temperature = temp, s.top_k = top_k, s.top_p = top_p, s.min_p = min_p;
    return s;
}

/* Temperature, top-k, top-p and min-p alone and together, on the Gemma 3 vocabulary and a small one. */
static void test_sample_truncation(void **state) {
    (void)state;
    need_gpu();
    float *big = random_logits(262144, 4.0f), *small = random_logits(20000, 3.0f);
    const scase cases[] = {
        {"temperature 0.8", 262144, settings(0.8f, 0, 1.0f, 0.0f), NULL, 0},
        {"top-k 40", 262144, settings(1.0f, 40, 1.0f, 0.0f), NULL, 0},
        {"top-p 0.95", 262144, settings(1.0f, 0, 0.95f, 0.0f), NULL, 0},
        {"top-k 64, top-p 0.9", 262144, settings(0.7f, 64, 0.9f, 0.0f), NULL, 0},
        {"temperature 1.5", 20000, settings(1.5f, 0, 1.0f, 0.0f), NULL, 0},
        {"top-k 5000", 20000, settings(1.0f, 5000, 1.0f, 0.0f), NULL, 0},
        {"top-p 0.5", 20000, settings(1.2f, 0, 0.5f, 0.0f), NULL, 0},
        {"top-p 0.99, min-p 0.01", 20000, settings(1.0f, 0, 0.99f, 0.01f), NULL, 0},
        {"top-k 300, top-p 0.8, min-p", 20000, settings(0.6f, 300, 0.8f, 0.05f), NULL, 0},
        {"min-p 0.2", 20000, settings(1.0f, 0, 1.0f, 0.2f), NULL, 0},
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        wrong += run_case(&cases[i], cases[i].V == 262144 ? big : small);
    assert_int_equal(wrong, 0);
    free(big), free(small);
}

/* Logit bias (duplicates, a ban, a forced token) and the three penalties over a window, greedy and sampled. */
static void test_sample_adjustments(void **state) {
    (void)state;
    need_gpu();
    const int V = 20000;
    float *l = random_logits(V, 3.0f);
    int am = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[am]) am = i;
    int32_t hist[200];
    for (int i = 0; i < 200; i++) hist[i] = i % 3 == 0 ? am : (int32_t)((i * 7919) % V); /* the argmax repeats */
    const g3_logit_bias bias[] = {{am, -100.0f}, {17, 2.5f}, {17, 1.25f}, {19999, -INFINITY}, {4242, 3.0f}};
    g3_sampling g = settings(0.0f, 0, 1.0f, 0.0f), s = settings(0.9f, 50, 0.95f, 0.0f);
    g3_sampling t = settings(1.0f, 0, 1.0f, 0.0f);
    g.repetition_penalty = s.repetition_penalty = 1.3f;
    g.presence_penalty = s.presence_penalty = 0.5f;
    g.frequency_penalty = s.frequency_penalty = 0.2f;
    g.penalty_last_n = s.penalty_last_n = 64;
    s.logit_bias = t.logit_bias = bias, s.n_logit_bias = t.n_logit_bias = 5;
    g3_sampling forced = t;
    const g3_logit_bias force[] = {{123, INFINITY}, {77, INFINITY}};
    forced.logit_bias = force, forced.n_logit_bias = 2;
    const scase cases[] = {
        {"greedy, penalties", V, g, hist, 200},
        {"penalties, bias, top-k, top-p", V, s, hist, 200},
        {"bias only", V, t, NULL, 0},
        {"two forced tokens", V, forced, NULL, 0},
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) wrong += run_case(&cases[i], l);
    assert_int_equal(wrong, 0);
    free(l);
}

/* Many equal logits: the top-k and top-p cuts fall inside a run of ties (more than the 2048 the sort takes), kept
 * lowest id first as on the host; all -inf / NaN gives token 0. */
static void test_sample_ties(void **state) {
    (void)state;
    need_gpu();
    const int V = 30000;
    float *l = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = i % 5 == 0 ? 1.0f : -2.0f - 0.001f * (float)(i % 997); /* 6000 ties at 1 */
    const scase cases[] = {
        {"top-k 3000 in 6000 ties", V, settings(1.0f, 3000, 1.0f, 0.0f), NULL, 0},
        {"top-p 0.3 in ties", V, settings(1.0f, 0, 0.3f, 0.0f), NULL, 0},
        {"top-k 7000 past the ties", V, settings(1.0f, 7000, 1.0f, 0.0f), NULL, 0},
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) wrong += run_case(&cases[i], l);
    assert_int_equal(wrong, 0);

    /* every logit -inf or NaN: token 0, greedy or not */
    for (int i = 0; i < V; i++) l[i] = i % 2 ? -INFINITY : NAN;
    g3_dev_sample rows[2];
    memset(rows, 0, sizeof rows);
    rows[1].temperature = 1.0f, rows[1].top_p = 0.9f, rows[1].u = 0.5;
    rows[0].top_p = 1.0f;
    float *two = malloc(sizeof(float) * 2 * V);
    memcpy(two, l, sizeof(float) * V), memcpy(two + V, l, sizeof(float) * V);
    int32_t ids[2] = {-1, -1};
    g3_error err = {0};
    if (g3_cuda_test_sample(two, 2, V, rows, NULL, 0, ids, NULL, &err) != G3_OK) fail_msg("%s", err.msg);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 0);
    free(l), free(two);
}

/* The same rows twice give the same tokens (integer weights: no order-dependent sums). */
static void test_sample_repeatable(void **state) {
    (void)state;
    need_gpu();
    const int V = 262144, m = 16;
    float *l = random_logits(V, 4.0f), *all = malloc(sizeof(float) * (size_t)m * V);
    g3_dev_sample rows[16];
    memset(rows, 0, sizeof rows);
    for (int i = 0; i < m; i++) {
        memcpy(all + (size_t)i * V, l, sizeof(float) * V);
        rows[i].temperature = 1.0f, rows[i].top_k = i % 2 ? 100 : 0, rows[i].top_p = i % 3 ? 0.9f : 1.0f;
        rows[i].u = (i + 0.37) / m;
    }
    int32_t a[16], b[16];
    g3_error err = {0};
    if (g3_cuda_test_sample(all, m, V, rows, NULL, 0, a, NULL, &err) != G3_OK) fail_msg("%s", err.msg);
    if (g3_cuda_test_sample(all, m, V, rows, NULL, 0, b, NULL, &err) != G3_OK) fail_msg("%s", err.msg);
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < m; i++) assert_true(a[i] >= 0 && a[i] < V);
    free(l), free(all);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef G3_HAVE_CUDA
        cmocka_unit_test(test_sample_truncation),
        cmocka_unit_test(test_sample_adjustments),
        cmocka_unit_test(test_sample_ties),
        cmocka_unit_test(test_sample_repeatable),
#else
        cmocka_unit_test(tu_skip_no_cuda),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
