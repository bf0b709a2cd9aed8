/* Engine and scheduler: continuous batching gives every request the same greedy tokens as running alone, KV blocks
 * come back when requests finish or are cancelled, sliding-window layers hold only their window, admission
 * control queues what does not fit, and bad requests get clear errors. Uses the tiny fixture and random models. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma3.h"
#include "testutil.h"

#define MAXR 64

typedef struct collect {
    g3_request_id ids[MAXR];
    int32_t toks[MAXR][64];
    int n[MAXR];
    g3_finish fin[MAXR];
    int n_req;
} collect;

static int index_of(collect *c, g3_request_id id) {
    for (int i = 0; i < c->n_req; i++)
        if (c->ids[i] == id) return i;
    return -1;
}

static void on_ev(const g3_event *ev, void *ctx) {
    collect *c = ctx;
    int i = index_of(c, ev->id);
    if (i < 0) return;
    if (ev->has_token && c->n[i] < 64) c->toks[i][c->n[i]++] = ev->token;
    if (ev->finish != G3_FINISH_NONE) c->fin[i] = ev->finish;
}

static int g_prefix_cache = 0;

static g3_engine *engine(g3_model *m, int max_seqs, int ctx, int chunk, int n_blocks) {
    g3_engine_opts o;
    g3_engine_opts_default(&o);
    o.prefix_cache = g_prefix_cache;
    o.backend = "cpu";
    o.max_seqs = max_seqs;
    o.ctx_size = ctx;
    o.prefill_chunk = chunk;
    o.n_kv_blocks = n_blocks;
    g3_engine *e;
    g3_error err = {0};
    if (g3_engine_create(m, &o, &e, &err) != G3_OK) fail_msg("engine: %s", err.msg);
    return e;
}

static void make_prompt(int32_t *p, int n, int seed, int vocab) {
    p[0] = 2;
    for (int i = 1; i < n; i++) p[i] = 107 + (seed * 131 + i * 17) % (vocab - 107);
}

static void run_all(g3_engine *e, collect *c) {
    int active = 1;
    g3_error err = {0};
    int guard = 0;
    while (active) {
        if (g3_engine_step(e, on_ev, c, &active, &err) != G3_OK) fail_msg("step: %s", err.msg);
        assert_true(++guard < 100000);
    }
}

static g3_request_id submit(g3_engine *e, collect *c, const int32_t *p, int n, int max_tokens) {
    g3_request r = {.prompt = p, .n_prompt = n, .max_tokens = max_tokens, .ignore_eos = 1};
    g3_sampling_default(&r.sampling);
    g3_error err = {0};
    g3_request_id id;
    if (g3_engine_submit(e, &r, &id, &err) != G3_OK) fail_msg("submit: %s", err.msg);
    c->ids[c->n_req++] = id;
    return id;
}

static g3_model *tiny(void) {
    const char *dir = tu_fixture("tiny-gqa");
    g3_model *m = NULL;
    g3_error err = {0};
    if (dir) {
        if (g3_model_load(dir, NULL, &m, &err) != G3_OK) fail_msg("load: %s", err.msg);
    } else if (g3_model_random("tiny", G3_DTYPE_F32, 7, 0, &m, &err) != G3_OK) {
        fail_msg("random: %s", err.msg);
    }
    return m;
}

/* 24 requests of different lengths, alone one by one vs all together (max_seqs 8, chunked prefill 13):
 * identical greedy tokens. */
static void test_batching_equals_alone(void **state) {
    (void)state;
    g3_model *m = tiny();
    int V = g3_model_config(m)->vocab;
    enum { N = 24 };
    static int32_t prompts[N][80];
    int lens[N], gen[N];
    for (int i = 0; i < N; i++) {
        lens[i] = 3 + (i * 7) % 70;
        gen[i] = 5 + (i * 11) % 30;
        make_prompt(prompts[i], lens[i], i, V);
    }
    collect *alone = calloc(1, sizeof *alone), *together = calloc(1, sizeof *together);
    g3_engine *e1 = engine(m, 1, 128, 512, 0);
    for (int i = 0; i < N; i++) {
        submit(e1, alone, prompts[i], lens[i], gen[i]);
        run_all(e1, alone);
    }
    g3_engine *e2 = engine(m, 8, 128, 13, 0);
    for (int i = 0; i < N; i++) submit(e2, together, prompts[i], lens[i], gen[i]);
    run_all(e2, together);
    for (int i = 0; i < N; i++) {
        assert_int_equal(alone->n[i], gen[i]);
        assert_int_equal(together->n[i], gen[i]);
        assert_int_equal(together->fin[i], G3_FINISH_LENGTH);
        assert_memory_equal(alone->toks[i], together->toks[i], sizeof(int32_t) * (size_t)gen[i]);
    }
    g3_engine_stats st;
    g3_engine_get_stats(e2, &st);
    assert_int_equal(st.kv_blocks_used, 0); /* what is left belongs to the prefix cache */
    assert_true(st.kv_blocks_cached > 0);
    assert_int_equal(st.n_running + st.n_waiting, 0);
    printf("  %d requests: batched greedy tokens identical to running alone\n", N);
    g3_engine_free(e1);
    g3_engine_free(e2);
    free(alone);
    free(together);
    g3_model_free(m);
}

/* Sliding layers give blocks back: during a long generation the sliding pool holds about window/B blocks. */
static void test_sliding_blocks_released(void **state) {
    (void)state;
    g3_model *m = tiny();
    const g3_config *c = g3_model_config(m);
    g_prefix_cache = -1; /* pure trimming: no prompt blocks kept for reuse */
    g3_engine *e = engine(m, 1, 256, 4, 0);
    g_prefix_cache = 0;
    int32_t p[40];
    make_prompt(p, 40, 3, c->vocab);
    collect *col = calloc(1, sizeof *col);
    submit(e, col, p, 40, 60);
    int active = 1, max_used = 0, steps = 0;
    g3_error err = {0};
    while (active) {
        assert_int_equal(g3_engine_step(e, on_ev, col, &active, &err), G3_OK);
        g3_engine_stats st;
        g3_engine_get_stats(e, &st);
        if (++steps > 20 && st.kv_blocks_used > max_used) max_used = st.kv_blocks_used;
    }
    /* global: ceil(100/16) = 7 blocks at the end; sliding (window 8, chunk 4, block 16): at most 2 */
    printf("  most KV blocks in use late in a 100-token sequence: %d (window %d)\n", max_used, c->sliding_window);
    assert_true(max_used <= (100 + 15) / 16 + 2);
    g3_engine_stats st;
    g3_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    g3_engine_free(e);
    free(col);
    g3_model_free(m);
}

/* A pool too small for everyone: sequences are preempted and recomputed, all finish with the tokens they would
 * have had alone; cancellation (running or waiting) frees everything. */
static void test_preemption_and_cancel(void **state) {
    (void)state;
    g3_model *m = tiny();
    int V = g3_model_config(m)->vocab;
    g3_engine *e = engine(m, 4, 64, 512, 8); /* 8 blocks per pool: not enough for four 60-token sequences */
    collect *col = calloc(1, sizeof *col);
    int32_t p[20];
    make_prompt(p, 20, 9, V);
    for (int i = 0; i < 6; i++) submit(e, col, p, 20, 40);
    int active;
    g3_error err = {0};
    assert_int_equal(g3_engine_step(e, on_ev, col, &active, &err), G3_OK);
    g3_engine_cancel(e, col->ids[0]);
    g3_engine_cancel(e, col->ids[5]);
    run_all(e, col);
    assert_int_equal(col->fin[0], G3_FINISH_CANCELLED);
    assert_int_equal(col->fin[5], G3_FINISH_CANCELLED);
    assert_int_equal(col->n[5], 0);
    for (int i = 1; i < 5; i++) {
        assert_int_equal(col->fin[i], G3_FINISH_LENGTH);
        assert_int_equal(col->n[i], 40);
        assert_memory_equal(col->toks[i], col->toks[1], sizeof(int32_t) * 40);
    }
    g3_engine_stats st;
    g3_engine_get_stats(e, &st);
    printf("  preemptions: %lld, prompt tokens from the prefix cache: %lld\n", (long long)st.n_preempted,
           (long long)st.cached_prompt_tokens);
    assert_true(st.n_preempted > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    g3_engine_free(e);
    free(col);
    g3_model_free(m);
}

/* Prefix reuse: a second request sharing a long prefix (past the sliding window) reuses its blocks, and its
 * greedy tokens equal those of a fresh engine without a cache. */
static void test_prefix_reuse(void **state) {
    (void)state;
    g3_model *m = tiny();
    int V = g3_model_config(m)->vocab;
    int32_t a[90], b[90];
    make_prompt(a, 90, 4, V);
    memcpy(b, a, sizeof a);
    for (int i = 70; i < 90; i++) b[i] = 200 + i; /* shares 70 tokens, then differs */
    collect *c1 = calloc(1, sizeof *c1), *c2 = calloc(1, sizeof *c2);
    g3_engine *e = engine(m, 2, 256, 512, 0);
    submit(e, c1, a, 90, 10);
    run_all(e, c1);
    submit(e, c1, b, 90, 10);
    run_all(e, c1);
    g3_engine_stats st;
    g3_engine_get_stats(e, &st);
    printf("  cached prompt tokens: %lld of %lld\n", (long long)st.cached_prompt_tokens, (long long)st.prompt_tokens);
    assert_int_equal(st.cached_prompt_tokens, 64); /* 70 shared, cut to the 16-token block boundary */
    g_prefix_cache = -1;
    g3_engine *f = engine(m, 1, 256, 512, 0);
    g_prefix_cache = 0;
    submit(f, c2, b, 90, 10);
    run_all(f, c2);
    assert_memory_equal(c1->toks[1], c2->toks[0], sizeof(int32_t) * 10);
    /* a continuation of the whole first conversation (prompt + reply) reuses nearly all of it */
    int32_t cont[110];
    memcpy(cont, a, sizeof a);
    memcpy(cont + 90, c1->toks[0], sizeof(int32_t) * 10);
    for (int i = 100; i < 110; i++) cont[i] = 150 + i;
    int64_t before = st.cached_prompt_tokens;
    submit(e, c1, cont, 110, 5);
    run_all(e, c1);
    g3_engine_get_stats(e, &st);
    assert_true(st.cached_prompt_tokens - before >= 96);
    g3_engine_free(e);
    g3_engine_free(f);
    free(c1);
    free(c2);
    g3_model_free(m);
}

static void test_bad_requests(void **state) {
    (void)state;
    g3_model *m = tiny();
    g3_engine *e = engine(m, 1, 32, 512, 0);
    g3_error err = {0};
    int32_t p[40];
    make_prompt(p, 40, 1, g3_model_config(m)->vocab);
    g3_request r = {.prompt = p, .n_prompt = 40, .max_tokens = 4};
    g3_sampling_default(&r.sampling);
    assert_int_equal(g3_engine_submit(e, &r, NULL, &err), G3_ERR_ARG);
    assert_non_null(strstr(err.msg, "40 tokens"));
    r.n_prompt = 0;
    assert_int_equal(g3_engine_submit(e, &r, NULL, &err), G3_ERR_ARG);
    p[3] = 1 << 20;
    r.n_prompt = 5;
    assert_int_equal(g3_engine_submit(e, &r, NULL, &err), G3_ERR_ARG);
    assert_non_null(strstr(err.msg, "vocabulary"));
    float lg[1];
    assert_int_equal(g3_engine_logits(e, p, 5, 0, lg, &err), G3_ERR_ARG);
    g3_engine_free(e);
    g3_model_free(m);
}

/* Random-weight models of a released shape, cut to 2 layers, run and are deterministic. */
static void test_random_shapes(void **state) {
    (void)state;
    const g3_dtype types[] = {G3_DTYPE_BF16, G3_DTYPE_Q8_0, G3_DTYPE_Q4_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        g3_model *m;
        g3_error err = {0};
        if (g3_model_random("270m", types[t], 5, 2, &m, &err) != G3_OK) fail_msg("random: %s", err.msg);
        assert_string_equal(g3_model_config(m)->size_name, "270m");
        g3_engine *e = engine(m, 2, 64, 512, 0);
        collect *col = calloc(1, sizeof *col);
        int32_t p[12];
        make_prompt(p, 12, 2, 262144);
        submit(e, col, p, 12, 6);
        submit(e, col, p, 12, 6);
        run_all(e, col);
        assert_int_equal(col->n[0], 6);
        assert_memory_equal(col->toks[0], col->toks[1], sizeof(int32_t) * 6);
        g3_engine_free(e);
        free(col);
        g3_model_free(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batching_equals_alone), cmocka_unit_test(test_sliding_blocks_released),
        cmocka_unit_test(test_preemption_and_cancel), cmocka_unit_test(test_prefix_reuse),  cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_random_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
