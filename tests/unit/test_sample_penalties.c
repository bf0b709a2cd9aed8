/* Sampler behaviour around the draw: penalties change exactly the tokens in the window by the documented
 * amounts, logit bias bans and forces, seeds reproduce (and differ), log-probabilities equal a double-precision
 * log_softmax, bad settings are refused with a message. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sampler.h"

static uint64_t trng_state;
static uint64_t trng(void) {
    uint64_t z = (trng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double trand(double lo, double hi) { return lo + (hi - lo) * (double)(trng() >> 11) * 0x1.0p-53; }

static g3_sampler *make(const g3_sampling *p, int vocab) {
    g3_error err = {0};
    g3_sampler *s = g3_sampler_create(p, vocab, &err);
    if (!s) print_error("create failed: %s\n", err.msg);
    assert_non_null(s);
    return s;
}

/* ---- penalties ---------------------------------------------------------------------------------------------- */

enum { PV = 32 };

/* Accepts {5, 5, 9} into a greedy sampler with the given penalties, samples once and checks: every logit except
 * 5 and 9 is bit-identical, and 5 / 9 moved to exactly want5 / want9. */
static void check_penalty(float rep, float pres, float freq, double want5, double want9) {
    g3_sampling p;
    g3_sampling_default(&p);
    p.repetition_penalty = rep;
    p.presence_penalty = pres;
    p.frequency_penalty = freq;
    float l[PV], before[PV];
    trng_state = 3;
    for (int i = 0; i < PV; i++) l[i] = (float)trand(-3, 3);
    l[5] = 2.0f;  /* positive: repetition divides */
    l[9] = -1.5f; /* negative: repetition multiplies */
    memcpy(before, l, sizeof l);
    g3_sampler *s = make(&p, PV);
    g3_sampler_accept(s, 5);
    g3_sampler_accept(s, 5);
    g3_sampler_accept(s, 9);
    g3_sampler_sample(s, l, NULL, NULL, NULL);
    for (int i = 0; i < PV; i++) {
        if (i == 5 || i == 9) continue;
        if (memcmp(&l[i], &before[i], sizeof(float)) != 0) fail_msg("token %d changed: %g -> %g", i, before[i], l[i]);
    }
    assert_true(fabs(l[5] - want5) < 1e-6);
    assert_true(fabs(l[9] - want9) < 1e-6);
    g3_sampler_free(s);
}

static void test_penalties_each_kind(void **state) {
    (void)state;
    check_penalty(1.3f, 0.0f, 0.0f, 2.0 / 1.3, -1.5 * 1.3);               /* repetition */
    check_penalty(1.0f, 0.7f, 0.0f, 2.0 - 0.7, -1.5 - 0.7);                /* presence: once each */
    check_penalty(1.0f, 0.0f, 0.4f, 2.0 - 2 * 0.4, -1.5 - 0.4);            /* frequency: count 2 and 1 */
    check_penalty(1.0f, -0.5f, 0.0f, 2.0 + 0.5, -1.5 + 0.5);               /* negative presence encourages */
    check_penalty(1.5f, 0.5f, 0.25f, 2.0 / 1.5 - 0.5 - 0.5, -1.5 * 1.5 - 0.5 - 0.25); /* all, in order */
}

/* penalty_last_n = 2: after {5, 5, 9, 7} only 9 and 7 are in the window. */
static void test_penalty_window(void **state) {
    (void)state;
    g3_sampling p;
    g3_sampling_default(&p);
    p.presence_penalty = 1.0f;
    p.penalty_last_n = 2;
    g3_sampler *s = make(&p, PV);
    const int32_t seq[] = {5, 5, 9, 7};
    for (int i = 0; i < 4; i++) g3_sampler_accept(s, seq[i]);
    float l[PV];
    for (int i = 0; i < PV; i++) l[i] = 0.0f;
    g3_sampler_apply_penalties(s, l);
    for (int i = 0; i < PV; i++) assert_true(l[i] == ((i == 9 || i == 7) ? -1.0f : 0.0f));
    /* out-of-range tokens are ignored, not recorded */
    g3_sampler_accept(s, -1);
    g3_sampler_accept(s, PV);
    for (int i = 0; i < PV; i++) l[i] = 0.0f;
    g3_sampler_apply_penalties(s, l);
    for (int i = 0; i < PV; i++) assert_true(l[i] == ((i == 9 || i == 7) ? -1.0f : 0.0f));
    /* reset forgets everything */
    g3_sampler_reset(s);
    for (int i = 0; i < PV; i++) l[i] = 0.0f;
    g3_sampler_apply_penalties(s, l);
    for (int i = 0; i < PV; i++) assert_true(l[i] == 0.0f);
    g3_sampler_free(s);
}

/* Property test of the window bookkeeping (ring, counts, list compaction): with frequency penalty 1 on zero
 * logits, -l[t] is t's count among the last n accepted tokens; compared with a brute-force count every step. */
static void test_penalty_window_counts(void **state) {
    (void)state;
    enum { V = 50, STEPS = 3000 };
    const int windows[] = {0, 1, 2, 7, 64, 100};
    int32_t *hist = malloc(STEPS * sizeof *hist);
    float l[V];
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        g3_sampling p;
        g3_sampling_default(&p);
        p.frequency_penalty = 1.0f;
        p.penalty_last_n = windows[w];
        g3_sampler *s = make(&p, V);
        trng_state = 17 + w;
        for (int step = 0; step < STEPS; step++) {
            /* skewed stream: a few frequent tokens plus a long tail */
            int32_t t = (int32_t)(trng() % 4 == 0 ? trng() % V : trng() % 5);
            hist[step] = t;
            g3_sampler_accept(s, t);
            if (step % 7 != 0 && step < STEPS - 1) continue;
            for (int i = 0; i < V; i++) l[i] = 0.0f;
            g3_sampler_apply_penalties(s, l);
            int from = windows[w] == 0 ? 0 : step + 1 - windows[w];
            if (from < 0) from = 0;
            for (int i = 0; i < V; i++) {
                int c = 0;
                for (int j = from; j <= step; j++) c += hist[j] == i;
                if (l[i] != (float)-c)
                    fail_msg("window %d step %d token %d: count %d, penalty %g", windows[w], step, i, c, l[i]);
            }
        }
        g3_sampler_free(s);
    }
    free(hist);
}

/* ---- logit bias ----------------------------------------------------------------------------------------------- */

static void test_logit_bias(void **state) {
    (void)state;
    enum { V = 100 };
    float l[V], work[V];
    trng_state = 8;
    for (int i = 0; i < V; i++) l[i] = (float)trand(-2, 2);
    l[42] = 5.0f; /* the argmax */
    l[17] = 4.0f; /* the runner-up */
    g3_sampling p;
    g3_sampling_default(&p);

    /* greedy: -inf bans the argmax, -100 as well */
    g3_logit_bias ban_inf = {42, -INFINITY}, ban_100 = {42, -100.0f}, force = {3, 100.0f};
    p.logit_bias = &ban_inf;
    p.n_logit_bias = 1;
    g3_sampler *s = make(&p, V);
    memcpy(work, l, sizeof l);
    assert_int_equal(g3_sampler_sample(s, work, NULL, NULL, NULL), 17);
    assert_true(isinf(work[42]) && work[42] < 0);
    g3_sampler_free(s);

    /* stochastic, temperature 1 with nothing else on: -100 never drawn, +100 always drawn */
    p.temperature = 1.0f;
    p.seed = 5;
    p.logit_bias = &ban_100;
    s = make(&p, V);
    int n42 = 0;
    for (int d = 0; d < 2000; d++) {
        memcpy(work, l, sizeof l);
        n42 += g3_sampler_sample(s, work, NULL, NULL, NULL) == 42;
    }
    assert_int_equal(n42, 0);
    g3_sampler_free(s);

    /* without the ban 42 is drawn often (the control) */
    p.n_logit_bias = 0;
    s = make(&p, V);
    for (int d = 0; d < 2000; d++) {
        memcpy(work, l, sizeof l);
        n42 += g3_sampler_sample(s, work, NULL, NULL, NULL) == 42;
    }
    assert_true(n42 > 500);
    g3_sampler_free(s);

    p.logit_bias = &force;
    p.n_logit_bias = 1;
    p.temperature = 1.5f;
    p.top_p = 0.9f;
    s = make(&p, V);
    for (int d = 0; d < 2000; d++) {
        memcpy(work, l, sizeof l);
        assert_int_equal(g3_sampler_sample(s, work, NULL, NULL, NULL), 3);
    }
    g3_sampler_free(s);

    /* the bias array is copied: changing the caller's afterwards has no effect */
    g3_logit_bias mine[2] = {{60, 1000.0f}, {60, -1.0f}}; /* duplicates add up */
    p.logit_bias = mine;
    p.n_logit_bias = 2;
    s = make(&p, V);
    mine[0].bias = -1000.0f;
    memcpy(work, l, sizeof l);
    assert_int_equal(g3_sampler_sample(s, work, NULL, NULL, NULL), 60);
    assert_true(work[60] == l[60] + 999.0f);
    g3_sampler_free(s);
}

/* ---- seeds ---------------------------------------------------------------------------------------------------- */

static void draw_seq(uint64_t seed, int32_t *out, int n) {
    enum { V = 1000 };
    float flat[V];
    g3_sampling p;
    g3_sampling_default(&p);
    p.temperature = 1.0f;
    p.seed = seed;
    g3_sampler *s = make(&p, V);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < V; j++) flat[j] = 0.0f;
        out[i] = g3_sampler_sample(s, flat, NULL, NULL, NULL);
    }
    g3_sampler_free(s);
}

static void test_seeds(void **state) {
    (void)state;
    enum { N = 500 };
    int32_t a[N], b[N], c[N], d[N];
    draw_seq(0, a, N);
    draw_seq(0, b, N);
    draw_seq(1, c, N);
    draw_seq(0xdeadbeefcafeull, d, N);
    assert_memory_equal(a, b, sizeof a);
    int diff_c = 0, diff_d = 0;
    for (int i = 0; i < N; i++) {
        diff_c += a[i] != c[i];
        diff_d += a[i] != d[i];
    }
    assert_true(diff_c > N * 9 / 10); /* flat over 1000 tokens: ~0.1% agree by chance */
    assert_true(diff_d > N * 9 / 10);

    /* known answers: xoshiro256** seeded by splitmix64, computed independently (Python, 64-bit integers) */
    const uint32_t want0[4] = {10087519, 12545567, 1728388, 6989204}, want42[4] = {1406987, 6358233, 11409235,
                                                                                   15513773};
    g3_sampling p;
    g3_sampling_default(&p);
    g3_sampler *s0 = make(&p, 8);
    p.seed = 42;
    g3_sampler *s42 = make(&p, 8);
    for (int i = 0; i < 4; i++) {
        assert_true(g3_sampler_uniform(s0) * 16777216.0f == (float)want0[i]);
        assert_true(g3_sampler_uniform(s42) * 16777216.0f == (float)want42[i]);
    }
    /* reset reseeds */
    g3_sampler_reset(s42);
    assert_true(g3_sampler_uniform(s42) * 16777216.0f == (float)want42[0]);
    /* uniform stays in [0, 1) and averages 1/2 */
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        float u = g3_sampler_uniform(s0);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.005);
    g3_sampler_free(s0);
    g3_sampler_free(s42);
}

/* ---- log-probabilities ---------------------------------------------------------------------------------------- */

static void test_logprobs(void **state) {
    (void)state;
    enum { V = 5000, N = 20 };
    float *l = malloc(V * sizeof *l), *work = malloc(V * sizeof *work);
    double *ref = malloc(V * sizeof *ref);
    g3_logit_bias bias[2] = {{11, 3.0f}, {12, -INFINITY}};
    for (int greedy = 0; greedy < 2; greedy++) {
        g3_sampling p;
        g3_sampling_default(&p);
        p.temperature = greedy ? 0.0f : 0.7f;
        p.top_k = 40;
        p.presence_penalty = 0.5f;
        p.n_logprobs = N;
        p.logit_bias = bias;
        p.n_logit_bias = 2;
        p.seed = 9;
        g3_sampler *s = make(&p, V);
        trng_state = 21;
        for (int step = 0; step < 40; step++) {
            for (int i = 0; i < V; i++) l[i] = (float)trand(-6, 6);
            memcpy(work, l, V * sizeof *l);
            float lp = 1.0f;
            g3_token_logprob top[N];
            int nt = -1;
            int32_t t = g3_sampler_sample(s, work, &lp, top, &nt);
            /* the array now holds the post-bias/penalty logits; check them independently */
            double m = -INFINITY;
            for (int i = 0; i < V; i++) {
                double x = l[i];
                if (i == 11) x += 3.0;
                if (i == 12) x = -INFINITY;
                assert_true(fabs(work[i] - x) < 1e-6 || (isinf(x) && isinf(work[i])) || work[i] < x);
                m = fmax(m, work[i]);
            }
            double sum = 0;
            for (int i = 0; i < V; i++) sum += exp((double)work[i] - m);
            for (int i = 0; i < V; i++) ref[i] = (double)work[i] - m - log(sum);
            assert_true(fabs(lp - ref[t]) < 1e-5);
            assert_int_equal(nt, N);
            for (int j = 0; j < N; j++) {
                assert_true(fabs(top[j].logprob - ref[top[j].token]) < 1e-5);
                if (j > 0) assert_true(top[j].logprob <= top[j - 1].logprob);
            }
            /* the list is the true top N: nothing outside it beats its last entry */
            int beat = 0;
            for (int i = 0; i < V; i++) beat += ref[i] > ref[top[N - 1].token];
            assert_int_equal(beat, N - 1);
            if (greedy) assert_int_equal(t, top[0].token);
            g3_sampler_accept(s, t);
        }
        g3_sampler_free(s);
    }
    free(l);
    free(work);
    free(ref);

    /* banned tokens are not listed, so fewer than N may come back; no logprobs asked -> n_top 0 */
    g3_sampling p;
    g3_sampling_default(&p);
    p.n_logprobs = 5;
    g3_sampler *s = make(&p, 8);
    float small[8] = {1, -INFINITY, 2, -INFINITY, -INFINITY, 0.5f, -INFINITY, -INFINITY};
    g3_token_logprob top[5];
    int nt = -1;
    float lp = 0;
    assert_int_equal(g3_sampler_sample(s, small, &lp, top, &nt), 2);
    assert_int_equal(nt, 3);
    assert_int_equal(top[0].token, 2);
    assert_int_equal(top[1].token, 0);
    assert_int_equal(top[2].token, 5);
    double z = exp(1.0) + exp(2.0) + exp(0.5);
    assert_true(fabs(lp - (2.0 - log(z))) < 1e-6);
    g3_sampler_free(s);
    g3_sampling_default(&p);
    s = make(&p, 8);
    float again[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    nt = -1;
    assert_int_equal(g3_sampler_sample(s, again, &lp, top, &nt), 7);
    assert_int_equal(nt, 0);
    g3_sampler_free(s);
}

/* ---- edge cases and validation ----------------------------------------------------------------------------- */

static void test_edge_logits(void **state) {
    (void)state;
    g3_sampling p;
    g3_sampling_default(&p);
    for (int stoch = 0; stoch < 2; stoch++) {
        p.temperature = stoch ? 1.0f : 0.0f;
        g3_sampler *s = make(&p, 6);
        float all_banned[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        assert_int_equal(g3_sampler_sample(s, all_banned, NULL, NULL, NULL), 0);
        int seen[6] = {0};
        for (int d = 0; d < 400; d++) {
            float with_nan[6] = {NAN, 1.0f, NAN, 3.0f, -INFINITY, NAN}; /* NaN counts as banned */
            seen[g3_sampler_sample(s, with_nan, NULL, NULL, NULL)]++;
        }
        assert_true(seen[0] == 0 && seen[2] == 0 && seen[4] == 0 && seen[5] == 0);
        assert_true(seen[3] > 0);
        assert_true(stoch ? seen[1] > 0 : seen[1] == 0);
        float forced[6] = {1.0f, INFINITY, 2.0f, INFINITY, 0.0f, 0.0f};
        assert_int_equal(g3_sampler_sample(s, forced, NULL, NULL, NULL), 1);
        g3_sampler_free(s);
    }
}

static void expect_refused(const g3_sampling *p, int vocab, const char *word) {
    g3_error err = {0};
    g3_sampler *s = g3_sampler_create(p, vocab, &err);
    assert_null(s);
    assert_int_equal(err.code, G3_ERR_ARG);
    if (!strstr(err.msg, word)) fail_msg("message '%s' does not name '%s'", err.msg, word);
}

static void test_validation(void **state) {
    (void)state;
    g3_sampling p;
    g3_logit_bias bad = {70, 1.0f}, nanb = {3, NAN};
#define REFUSE(field, value, word)                                                                                    \
    do {                                                                                                               \
        g3_sampling_default(&p);                                                                                     \
        p.field = value;                                                                                             \
        expect_refused(&p, 64, word);                                                                                \
    } while (0)
    REFUSE(temperature, -0.1f, "temperature");
    REFUSE(temperature, NAN, "temperature");
    REFUSE(top_p, 0.0f, "top_p");
    REFUSE(top_p, 1.5f, "top_p");
    REFUSE(min_p, -0.1f, "min_p");
    REFUSE(min_p, 2.0f, "min_p");
    REFUSE(repetition_penalty, 0.0f, "repetition_penalty");
    REFUSE(presence_penalty, INFINITY, "presence_penalty");
    REFUSE(frequency_penalty, NAN, "frequency_penalty");
    REFUSE(penalty_last_n, -1, "penalty_last_n");
    REFUSE(n_logprobs, 21, "n_logprobs");
    REFUSE(n_logprobs, -1, "n_logprobs");
    g3_sampling_default(&p);
    p.logit_bias = &bad;
    p.n_logit_bias = 1;
    expect_refused(&p, 64, "token 70");
    p.logit_bias = &nanb;
    expect_refused(&p, 64, "NaN");
    p.logit_bias = NULL;
    expect_refused(&p, 64, "logit_bias");
    g3_sampling_default(&p);
    expect_refused(&p, 0, "vocabulary");

    /* NULL settings = defaults (greedy); top_k -1 means off; NULL frees are no-ops */
    g3_error err = {0};
    g3_sampler *s = g3_sampler_create(NULL, 4, &err);
    assert_non_null(s);
    float l[4] = {0.0f, 3.0f, 3.0f, 1.0f};
    assert_int_equal(g3_sampler_sample(s, l, NULL, NULL, NULL), 1);
    g3_sampler_free(s);
    g3_sampler_free(NULL);
    g3_sampling_default(&p);
    p.top_k = -1;
    p.temperature = 1.0f;
    s = make(&p, 4);
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int seen[4] = {0};
    for (int i = 0; i < 400; i++) {
        m[0] = m[1] = m[2] = m[3] = 0.0f;
        seen[g3_sampler_sample(s, m, NULL, NULL, NULL)]++;
    }
    for (int i = 0; i < 4; i++) assert_true(seen[i] > 50);
    g3_sampler_free(s);
}

/* ---- the export for a device sampler (g3_sampler_device_row) ---------------------------------------------------- */

/* One entry per distinct token with a bias (its biases summed, in order) or a count in the window (the count), the
 * window sliding as tokens are accepted; the row's uniform is the draw g3_sampler_sample makes, so a request's
 * random stream is the same whichever side samples it; logprobs keep a request on the host. */
static void test_device_export(void **state) {
    (void)state;
    const int V = 1000;
    const g3_logit_bias bias[] = {{17, 2.5f}, {900, -INFINITY}, {17, 1.25f}, {5, 0.5f}};
    g3_sampling p;
    g3_sampling_default(&p);
    p.temperature = 0.9f, p.top_k = 40, p.top_p = 0.95f, p.min_p = 0.02f, p.seed = 77;
    p.repetition_penalty = 1.2f, p.presence_penalty = 0.3f, p.frequency_penalty = 0.1f, p.penalty_last_n = 8;
    p.logit_bias = bias, p.n_logit_bias = 4;
    g3_sampler *a = make(&p, V), *b = make(&p, V);
    const int32_t hist[] = {5, 3, 3, 9, 17, 3, 600, 601, 602, 603, 604}; /* 5, 3, 3 leave the window of 8 */
    for (size_t i = 0; i < sizeof hist / sizeof hist[0]; i++)
        g3_sampler_accept(a, hist[i]), g3_sampler_accept(b, hist[i]);
    /* window: 9, 17, 3, 600..604; biased: 5, 17, 900 -> distinct: 3 5 9 17 600 601 602 603 604 900 */
    assert_int_equal(g3_sampler_device_entries(a), 10);
    g3_dev_sample row;
    g3_dev_adjust adj[16];
    int n = g3_sampler_device_row(a, &row, adj);
    assert_int_equal(n, 10);
    assert_int_equal(row.n_adj, 10);
    int seen[1000] = {0};
    for (int i = 0; i < n; i++) {
        const g3_dev_adjust *e = &adj[i];
        assert_true(e->token >= 0 && e->token < V);
        assert_int_equal(seen[e->token]++, 0);
        const int want_count = e->token == 3 || e->token == 9 || e->token == 17 || (e->token >= 600 && e->token <= 604);
        assert_int_equal(e->count, want_count);
        const float want_bias =
            e->token == 17 ? 2.5f + 1.25f : e->token == 5 ? 0.5f : e->token == 900 ? -INFINITY : 0.0f;
        assert_true(e->bias == want_bias);
    }
    assert_true(row.temperature == 0.9f && row.top_k == 40 && row.top_p == 0.95f && row.min_p == 0.02f);
    assert_true(row.repetition_penalty == 1.2f && row.presence_penalty == 0.3f && row.frequency_penalty == 0.1f);
    assert_true(row.u >= 0.0 && row.u < 1.0);
    /* b samples on the host: one draw; both streams continue in step */
    float *l = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = (float)trand(-3, 3);
    g3_sampler_sample(b, l, NULL, NULL, NULL);
    assert_true(g3_sampler_uniform(a) == g3_sampler_uniform(b));
    /* the host applies the summed biases: l[17] + (2.5 + 1.25), then the penalties */
    float l2[1000];
    for (int i = 0; i < V; i++) l2[i] = 1.0f;
    g3_sampler_apply_penalties(a, l2);
    float x = 1.0f + (2.5f + 1.25f);
    x = x / 1.2f - (1.0f * 0.1f + 0.3f);
    assert_true(l2[17] == x);
    assert_true(l2[900] == -INFINITY);
    assert_true(l2[4] == 1.0f);
    /* a greedy row draws nothing */
    p.temperature = 0.0f;
    g3_sampler *g = make(&p, V), *h = make(&p, V);
    g3_sampler_device_row(g, &row, adj);
    assert_true(row.u == 0.0);
    assert_true(g3_sampler_uniform(g) == g3_sampler_uniform(h));
    /* logprobs stay on the host */
    p.n_logprobs = 3;
    g3_sampler *lp = make(&p, V);
    assert_int_equal(g3_sampler_device_entries(lp), -1);
    /* top-k at or beyond the vocabulary is off */
    p.n_logprobs = 0, p.top_k = V;
    g3_sampler *k = make(&p, V);
    g3_sampler_device_row(k, &row, adj);
    assert_int_equal(row.top_k, 0);
    g3_sampler_free(a), g3_sampler_free(b), g3_sampler_free(g), g3_sampler_free(h), g3_sampler_free(lp);
    g3_sampler_free(k);
    free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_penalties_each_kind),
        cmocka_unit_test(test_penalty_window),
        cmocka_unit_test(test_penalty_window_counts),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_edge_logits),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_device_export),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
