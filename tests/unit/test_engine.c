/* Engine and scheduler: continuous batching gives every request the same greedy tokens as running alone, KV blocks
 * come back when requests finish or are cancelled, sliding-window layers hold only their window, admission
 * control queues what does not fit, and bad requests get clear errors. Uses the tiny fixture and random models. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "gemma3.h"
#include "model/model.h"
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

/* One scripted run for test_overlap: 3 slots, chunked prefill, 7 requests of different lengths; two more arrive once
 * request 0 has 4 tokens and two more at 12, request 1 is cancelled once it has 5. stop: eos counts (the model's
 * eos_id set by the caller); n_blocks: the KV pool (0: enough for all). */
static void overlap_run(g3_model *m, int overlap, int stop, int n_blocks, collect *c, int64_t *n_overlapped,
                        int64_t *n_preempted) {
    int V = g3_model_config(m)->vocab;
    g3_engine_opts o;
    g3_engine_opts_default(&o);
    o.backend = "cpu", o.max_seqs = 3, o.ctx_size = 128, o.prefill_chunk = 16, o.overlap = overlap;
    o.n_kv_blocks = n_blocks;
    g3_engine *e;
    g3_error err = {0};
    if (g3_engine_create(m, &o, &e, &err) != G3_OK) fail_msg("engine: %s", err.msg);
    memset(c, 0, sizeof *c);
    static int32_t p[7][48];
    for (int i = 0; i < 7; i++) make_prompt(p[i], 5 + 6 * i, 30 + i, V);
    int submitted = 0, active = 1, guard = 0, cancelled = 0;
    while (active) {
        /* request i: prompt of 5 + 6 i tokens, 30 - 3 i generated; 3 at first, 5 once request 0 has 4, then 7 */
        int want = c->n[0] >= 12 || c->fin[0] ? 7 : c->n[0] >= 4 ? 5 : 3;
        for (; submitted < want; submitted++) {
            g3_request r = {.prompt = p[submitted], .n_prompt = 5 + 6 * submitted,
                            .max_tokens = 30 - 3 * submitted, .ignore_eos = !stop};
            g3_sampling_default(&r.sampling);
            if (g3_engine_submit(e, &r, &c->ids[c->n_req++], &err) != G3_OK) fail_msg("submit: %s", err.msg);
        }
        if (g3_engine_step(e, on_ev, c, &active, &err) != G3_OK) fail_msg("step: %s", err.msg);
        assert_true(++guard < 10000);
        active |= submitted < 7;
        if (!cancelled && c->n[1] >= 5) g3_engine_cancel(e, c->ids[1]), cancelled = 1, active = 1;
    }
    g3_engine_stats st;
    g3_engine_get_stats(e, &st);
    *n_overlapped = st.overlapped_steps;
    if (n_preempted) *n_preempted = st.n_preempted;
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.n_running + st.n_waiting, 0);
    g3_engine_free(e);
}

/* The overlapped decode (each decode step queued before the previous one's picks are back, the backend feeding
 * them; on the CPU run synchronously through the same protocol, off by default): the same tokens and finishes as
 * without, through arrivals, a cancellation, different lengths and stop tokens that end sequences while the next step
 * is in flight; the default (0) is off on the CPU. */
static void test_overlap(void **state) {
    (void)state;
    g3_model *m = tiny();
    collect *on = calloc(1, sizeof *on), *off = calloc(1, sizeof *off);
    for (int stop = 0; stop < 2; stop++) {
        if (stop) { /* a token request 0 picks at its 7th step (greedy, as seen without stops) becomes eos */
            m->cfg.eos_id = off->toks[0][6];
        }
        int64_t n_on = 0, n_off = 0;
        overlap_run(m, 1, stop, 0, on, &n_on, NULL);
        overlap_run(m, -1, stop, 0, off, &n_off, NULL);
        assert_int_equal(on->n_req, 7);
        assert_int_equal(off->n_req, 7);
        int stops = 0;
        for (int i = 0; i < 7; i++) {
            assert_int_equal(on->n[i], off->n[i]);
            assert_int_equal(on->fin[i], off->fin[i]);
            assert_memory_equal(on->toks[i], off->toks[i], sizeof(int32_t) * (size_t)on->n[i]);
            stops += on->fin[i] == G3_FINISH_STOP;
            if (i != 1 && !stop) assert_int_equal(on->n[i], 30 - 3 * i);
        }
        assert_int_equal(on->fin[1], G3_FINISH_CANCELLED);
        assert_int_equal(on->n[1], 5);
        if (stop) {
            assert_int_equal(on->fin[0], G3_FINISH_STOP);
            assert_true(on->n[0] <= 7);
            assert_int_equal(on->toks[0][on->n[0] - 1], m->cfg.eos_id);
        }
        assert_true(n_on > 10);
        assert_int_equal(n_off, 0);
        if (!stop) { /* the default on the CPU: off */
            collect *d = calloc(1, sizeof *d);
            int64_t n_def = -1;
            overlap_run(m, 0, stop, 0, d, &n_def, NULL);
            assert_int_equal(n_def, 0);
            for (int i = 0; i < 7; i++) assert_memory_equal(d->toks[i], off->toks[i], sizeof(int32_t) * (size_t)d->n[i]);
            free(d);
        }
        printf("  %s: %lld decode steps overlapped, tokens and finishes identical to overlap off (%d stopped)\n",
               stop ? "with stop tokens" : "by length", (long long)n_on, stops);
    }
    /* a pool of 10 blocks for 3 sequences of up to 71 tokens: preemptions (outside chained steps) and rows that sit a
     * chained step out for lack of a block */
    int64_t n_on = 0, n_off = 0, pre_on = 0, pre_off = 0;
    overlap_run(m, 1, 0, 10, on, &n_on, &pre_on);
    overlap_run(m, -1, 0, 10, off, &n_off, &pre_off);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(on->n[i], off->n[i]);
        assert_int_equal(on->fin[i], off->fin[i]);
        assert_memory_equal(on->toks[i], off->toks[i], sizeof(int32_t) * (size_t)on->n[i]);
    }
    assert_true(n_on > 0);
    assert_true(pre_off > 0);
    printf("  small KV pool: %lld decode steps overlapped, %lld / %lld preemptions (on / off), tokens and finishes "
           "identical\n", (long long)n_on, (long long)pre_on, (long long)pre_off);
    free(on);
    free(off);
    g3_model_free(m);
}

/* The backends' overlapped-decode protocol (backend.h) on the CPU backend: a fed step picks what the same step with its
 * token given explicitly picks, and misuse (a third uncollected step, a collect with none, more fed rows than picked
 * ids, a sampling chain the CPU lacks) is refused with a message. */
static void test_submit_protocol(void **state) {
    (void)state;
    g3_model *m = tiny();
    const g3_backend_ops *ops = g3_backend_find("cpu");
    assert_non_null(ops->forward_submit);
    assert_non_null(ops->forward_collect);
    g3_backend_cfg cfg = {.n_threads = 1, .max_seqs = 2, .max_rows = 4, .kv_block = 16, .max_blocks_per_seq = 2,
                          .n_blocks_global = 4, .n_blocks_local = 4};
    g3_backend *b = NULL;
    g3_error err = {0};
    if (ops->create(m, &cfg, &b, &err) != G3_OK) fail_msg("create: %s", err.msg);
    int32_t bt[2][2] = {{0, -1}, {1, -1}}; /* slot s: block s of each pool */
    int32_t tok[2] = {2, 2}, pos[2] = {0, 0}, seq[2] = {0, 1}, out[2] = {0, 1}, ids[4] = {0}, feed[2] = {0, 1};
    g3_batch one = {.n_rows = 1, .token = tok, .pos = pos, .seq = seq, .n_out = 1, .out_rows = out,
                    .bt_global = &bt[0][0], .bt_local = &bt[0][0]};
    /* slot 0: token 2 at 0, then the fed pick at 1; slot 1: the same with the pick given */
    assert_int_equal(ops->forward_submit(b, &one, NULL, NULL, &err), G3_OK);
    pos[0] = 1;
    assert_int_equal(ops->forward_submit(b, &one, NULL, feed, &err), G3_OK);
    assert_int_equal(ops->forward_submit(b, &one, NULL, feed, &err), G3_ERR_ARG); /* two in flight already */
    assert_non_null(strstr(err.msg, "two steps"));
    assert_int_equal(ops->forward_collect(b, &ids[0], &err), G3_OK);
    assert_int_equal(ops->forward_collect(b, &ids[1], &err), G3_OK);
    assert_int_equal(ops->forward_collect(b, &ids[3], &err), G3_ERR_ARG);
    assert_non_null(strstr(err.msg, "no submitted step"));
    seq[0] = 1, pos[0] = 0, tok[0] = 2;
    assert_int_equal(ops->forward_submit(b, &one, NULL, NULL, &err), G3_OK);
    assert_int_equal(ops->forward_collect(b, &ids[2], &err), G3_OK);
    pos[0] = 1, tok[0] = ids[0];
    assert_int_equal(ops->forward_submit(b, &one, NULL, NULL, &err), G3_OK);
    assert_int_equal(ops->forward_collect(b, &ids[3], &err), G3_OK);
    assert_int_equal(ids[2], ids[0]);
    assert_int_equal(ids[3], ids[1]);
    g3_batch two = one;
    two.n_rows = 2, two.n_out = 2, pos[0] = pos[1] = 2, seq[0] = 0, seq[1] = 1;
    assert_int_equal(ops->forward_submit(b, &two, NULL, feed, &err), G3_ERR_ARG); /* the last step picked one id */
    assert_non_null(strstr(err.msg, "fed"));
    g3_dev_sample row = {0};
    g3_dev_sampling smp = {.row = &row};
    assert_int_equal(ops->forward_submit(b, &one, &smp, NULL, &err), G3_ERR_ARG);
    printf("  fed step picked %d as the explicit one did; misuse refused\n", ids[1]);
    ops->destroy(b);
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
        cmocka_unit_test(test_random_shapes), cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_submit_protocol),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
