/* g3_vulkan_profile on the t-gqa test model (lavapipe in CI): the profiled step is a real step (its logits and greedy
 * ids equal those of the same step through forward / forward_argmax), and the text has the structure of the recorded
 * forward: every label of the path taken, each per-layer label once per layer, embed/gather/logits/argmax once per
 * submission, the dispatch count of the body plus the head, non-negative times. Decode (split attention, one and two
 * rows), prefill (tiled products), a head in two submissions (70 output rows), the fused decode tails, and separate
 * q/k/v and gate/up products. Nothing is asserted on the times themselves. */
#ifdef G3_HAVE_VULKAN
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/vulkan/vulkan_api.h"
#include "gemma3.h"
#include "model/dtype.h"
#include "model/model.h"
#include "testutil.h"
#include "vk_testutil.h"

#define SEQS 2
#define BPS 16 /* blocks per sequence */
#define BLOCK 8

typedef struct line {
    char label[64];
    double total, per, exec;
    int count;
} line;

typedef struct parsed {
    line l[64];
    int n;
} parsed;

static void parse(const char *text, parsed *p) {
    p->n = 0;
    const char *s = text;
    while (*s && p->n < 64) {
        line *l = &p->l[p->n];
        l->exec = 0;
        int k = sscanf(s, "%63[^\t]\t%lf\t%d\t%lf\t%lf", l->label, &l->total, &l->count, &l->per, &l->exec);
        if (k < 4) fail_msg("profile line not understood: %.80s", s);
        p->n++;
        const char *nl = strchr(s, '\n');
        if (!nl) fail_msg("profile text does not end its lines");
        s = nl + 1;
    }
}

static const line *find(const parsed *p, const char *label) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->l[i].label, label)) return &p->l[i];
    return NULL;
}

/* Checks that exactly the labels of `want` (name, count pairs, NULL-terminated) are present with those counts, that
 * their counts add up to all_dispatches' and their totals to its total (to the printed rounding), and that the wall
 * line has `subs` submissions. */
static void check_structure(const char *text, const char *const *want, const int *counts, int dispatches, int subs) {
    parsed p;
    parse(text, &p);
    int n_want = 0, sum_count = 0;
    double sum_total = 0, sum_exec = 0;
    for (int i = 0; want[i]; i++, n_want++) {
        const line *l = find(&p, want[i]);
        if (!l) fail_msg("label %s missing from the profile:\n%s", want[i], text);
        if (l->count != counts[i]) fail_msg("label %s: count %d, expected %d", want[i], l->count, counts[i]);
        assert_true(l->total >= 0 && l->exec >= 0 && l->per >= 0);
        assert_true(l->exec <= l->total); /* exec is clamped to total per dispatch; both rounded alike */
        sum_count += l->count, sum_total += l->total, sum_exec += l->exec;
    }
    assert_int_equal(p.n, n_want + 2); /* nothing else but the two summary lines */
    const line *all = find(&p, "all_dispatches"), *wall = find(&p, "wall");
    assert_non_null(all);
    assert_non_null(wall);
    assert_int_equal(all->count, dispatches);
    assert_int_equal(sum_count, dispatches);
    assert_true(all->total >= 0 && all->exec >= 0 && all->exec <= all->total + 0.05 * n_want);
    assert_true(fabs(all->total - sum_total) <= 0.05 * (n_want + 1) + 1e-9);
    assert_true(fabs(all->exec - sum_exec) <= 0.05 * (n_want + 1) + 1e-9);
    assert_int_equal(wall->count, subs);
    assert_true(wall->total >= 0);
}

typedef struct ctx {
    g3_model *m;
    g3_backend *b;
    int32_t bt[SEQS * BPS];
    float *f32; /* unfused: every layer's wv and w_up as float32 */
} ctx;

/* Every layer's wv and w_up converted to float32: types differ from wq/wk and w_gate, so the backend runs separate
 * q, k, v products and gate, up, geglu dispatches. */
static void unfuse(ctx *c) {
    const g3_config *cf = &c->m->cfg;
    size_t kv = (size_t)cf->n_kv_heads * (size_t)cf->head_dim * (size_t)cf->hidden;
    size_t up = (size_t)cf->ffn * (size_t)cf->hidden;
    c->f32 = malloc(sizeof(float) * (kv + up) * (size_t)cf->n_layers);
    assert_non_null(c->f32);
    float *f = c->f32;
    for (int l = 0; l < cf->n_layers; l++) {
        g3_weight *ws[2] = {&c->m->layers[l].wv, &c->m->layers[l].w_up};
        for (int i = 0; i < 2; i++) {
            g3_weight *w = ws[i];
            size_t rb = g3_row_bytes(w->type, w->k);
            for (int64_t r = 0; r < w->n; r++)
                g3_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * rb, f + (size_t)r * (size_t)w->k, w->k);
            w->type = G3_DTYPE_F32, w->data = f, w->nbytes = sizeof(float) * (size_t)(w->n * w->k);
            f += w->n * w->k;
        }
    }
}

/* coopmat 0: the portable tiled matmul for prefill (the label lists below are those of the portable path); 1: the
 * device's default (cooperative matrices where it has them, each product after its overflow-guard pass) */
static int setup_cm(ctx *c, int unfused, int coopmat, const char *path) {
    memset(c, 0, sizeof *c);
    if (!have_device()) return 0;
    if (!coopmat) setenv("G3_VULKAN_COOPMAT", "0", 1);
    else unsetenv("G3_VULKAN_COOPMAT");
    const char *dir = path ? path : tu_fixture("t-gqa");
    if (!dir) {
        printf("  fixture t-gqa not found: skipped\n");
        return 0;
    }
    g3_error err = {0};
    if (g3_model_load(dir, NULL, &c->m, &err) != G3_OK) fail_msg("load %s: %s", dir, err.msg);
    if (unfused) unfuse(c);
    g3_backend_cfg bc = {.max_seqs = SEQS, .max_rows = 80, .kv_block = BLOCK, .max_blocks_per_seq = BPS,
                         .n_blocks_global = SEQS * BPS, .n_blocks_local = SEQS * BPS};
    if (g3_backend_vulkan.create(c->m, &bc, &c->b, &err) != G3_OK) fail_msg("vulkan backend: %s", err.msg);
    for (int i = 0; i < SEQS * BPS; i++) c->bt[i] = i;
    unsetenv("G3_VULKAN_COOPMAT");
    return 1;
}
static int setup(ctx *c, int unfused) { return setup_cm(c, unfused, 0, NULL); }

static void teardown(ctx *c) {
    if (c->b) g3_backend_vulkan.destroy(c->b);
    g3_model_free(c->m);
    free(c->f32);
}

/* rows of sequence seq at positions pos0.. with tokens tok, every row's logits wanted */
static g3_batch batch(const ctx *c, int n, const int32_t *tok, const int32_t *pos, const int32_t *seq,
                      const int32_t *out, int n_out) {
    g3_batch b = {.n_rows = n, .token = tok, .pos = pos, .seq = seq, .n_out = n_out, .out_rows = out,
                  .bt_global = c->bt, .bt_local = c->bt};
    return b;
}

/* The step through forward and through the profile (logits head) gives the same logits; through forward_argmax
 * and the profile's greedy head the same ids. Returns the greedy profile's text in text[]. */
static void same_step(ctx *c, const g3_batch *bt, const char *const *want_l, const int *cnt_l,
                      const char *const *want_a, const int *cnt_a, int head_l, int head_a, int subs, char *text,
                      size_t cap) {
    g3_error err = {0};
    size_t V = (size_t)c->m->cfg.vocab, n = (size_t)bt->n_out;
    float *a = malloc(sizeof(float) * V * n), *p = malloc(sizeof(float) * V * n);
    int32_t ia[80], ip[80];
    assert_true(a && p && n <= 80);
    if (g3_backend_vulkan.forward(c->b, bt, a, &err) != G3_OK) fail_msg("forward: %s", err.msg);
    if (g3_vulkan_profile_out(c->b, bt, 0, p, text, cap, &err) != G3_OK) fail_msg("profile: %s", err.msg);
    if (memcmp(a, p, sizeof(float) * V * n)) fail_msg("profiled logits differ from forward's (max %g)",
                                                      tu_max_abs_diff(a, p, V * n));
    int body = g3_vulkan_body_dispatches(c->b, bt->n_rows);
    check_structure(text, want_l, cnt_l, body + head_l, subs);
    if (g3_backend_vulkan.forward_argmax(c->b, bt, ia, &err) != G3_OK) fail_msg("forward_argmax: %s", err.msg);
    if (g3_vulkan_profile_out(c->b, bt, 1, ip, text, cap, &err) != G3_OK) fail_msg("profile: %s", err.msg);
    for (size_t i = 0; i < n; i++) {
        int best = 0;
        for (size_t v = 1; v < V; v++)
            if (a[i * V + v] > a[i * V + (size_t)best]) best = (int)v;
        assert_int_equal(ia[i], best);
        assert_int_equal(ip[i], ia[i]);
    }
    check_structure(text, want_a, cnt_a, body + head_a, subs);
    /* the plain entry point: the greedy head, the same structure */
    if (g3_vulkan_profile(c->b, bt, text, cap, &err) != G3_OK) fail_msg("profile: %s", err.msg);
    check_structure(text, want_a, cnt_a, body + head_a, subs);
    free(a), free(p);
}

static void test_decode_and_prefill(void **state) {
    (void)state;
    unsetenv("G3_VULKAN_FUSE");
    ctx c;
    if (!setup(&c, 0)) skip();
    int L = c.m->cfg.n_layers;
    char text[4096];
    /* prefill of 12 rows (tiled products, one attention pass), the last row's logits */
    int32_t tok[80], pos[80], seq[80], out[80];
    for (int i = 0; i < 80; i++) tok[i] = (int32_t)((i * 37 + 2) % c.m->cfg.vocab), pos[i] = i, seq[i] = 0, out[i] = i;
    int32_t last = 11;
    g3_batch pf = batch(&c, 12, tok, pos, seq, &last, 1);
    const char *prefill_l[] = {"embed", "qkv", "qk_rope", "attn", "wo", "add_norm_attn", "gate_up", "down",
                               "add_norm_ffn", "gather", "logits", NULL};
    const char *prefill_a[] = {"embed", "qkv", "qk_rope", "attn", "wo", "add_norm_attn", "gate_up", "down",
                               "add_norm_ffn", "gather", "logits", "argmax", NULL};
    int pc[] = {1, L, L, L, L, L, L, L, L, 1, 1, 1};
    same_step(&c, &pf, prefill_l, pc, prefill_a, pc, 2, 3, 1, text, sizeof text);
    printf("  prefill 12 rows, greedy head:\n%s", text);
    /* decode: one row at position 12 (split attention with its merge), then two rows of two sequences */
    const char *dec_l[] = {"embed", "qkv", "qk_rope", "attn", "attn_combine", "wo", "add_norm_attn", "gate_up",
                           "down", "add_norm_ffn", "gather", "logits", NULL};
    const char *dec_a[] = {"embed", "qkv", "qk_rope", "attn", "attn_combine", "wo", "add_norm_attn", "gate_up",
                           "down", "add_norm_ffn", "gather", "logits", "argmax", NULL};
    int dc[] = {1, L, L, L, L, L, L, L, L, L, 1, 1, 1};
    int32_t zero = 0;
    g3_batch d1 = batch(&c, 1, tok + 12, pos + 12, seq, &zero, 1);
    same_step(&c, &d1, dec_l, dc, dec_a, dc, 2, 3, 1, text, sizeof text);
    printf("  decode 1 row, greedy head:\n%s", text);
    int32_t t2[2] = {tok[13], tok[0]}, p2[2] = {13, 0}, s2[2] = {0, 1}, o2[2] = {0, 1};
    g3_batch d2 = batch(&c, 2, t2, p2, s2, o2, 2);
    same_step(&c, &d2, dec_l, dc, dec_a, dc, 2, 3, 1, text, sizeof text);
    /* 70 rows, all logits: two head submissions (64 + 6 rows: the matmul head, then the matvec head) */
    g3_batch big = batch(&c, 70, tok, pos, seq, out, 70);
    int bc[] = {1, L, L, L, L, L, L, L, L, 2, 2, 2};
    same_step(&c, &big, prefill_l, bc, prefill_a, bc, 4, 6, 2, text, sizeof text);
    /* a buffer too small: truncated, still terminated */
    char tiny[16];
    g3_error err = {0};
    assert_int_equal(g3_vulkan_profile(c.b, &d1, tiny, sizeof tiny, &err), G3_OK);
    assert_true(strlen(tiny) < sizeof tiny);
    assert_int_equal(strncmp(tiny, "embed\t", 6), 0);
    teardown(&c);
}

/* $G3_VULKAN_FUSE=1: the post-norms inside Wo / down (wo+norm, down+norm) and the merge inside attention for decode
 * buckets; prefill keeps the separate dispatches. */
static void test_fused_tails(void **state) {
    (void)state;
    setenv("G3_VULKAN_FUSE", "1", 1);
    ctx c;
    if (!setup(&c, 0)) {
        unsetenv("G3_VULKAN_FUSE");
        skip();
    }
    int L = c.m->cfg.n_layers;
    char text[4096];
    int32_t tok[13], pos[13], seq[13];
    for (int i = 0; i < 13; i++) tok[i] = (int32_t)((i * 53 + 5) % c.m->cfg.vocab), pos[i] = i, seq[i] = 0;
    int32_t last = 11, zero = 0;
    g3_batch pf = batch(&c, 12, tok, pos, seq, &last, 1);
    const char *prefill_l[] = {"embed", "qkv", "qk_rope", "attn", "wo", "add_norm_attn", "gate_up", "down",
                               "add_norm_ffn", "gather", "logits", NULL};
    const char *prefill_a[] = {"embed", "qkv", "qk_rope", "attn", "wo", "add_norm_attn", "gate_up", "down",
                               "add_norm_ffn", "gather", "logits", "argmax", NULL};
    int pc[] = {1, L, L, L, L, L, L, L, L, 1, 1, 1};
    same_step(&c, &pf, prefill_l, pc, prefill_a, pc, 2, 3, 1, text, sizeof text);
    const char *dec_l[] = {"embed", "qkv", "qk_rope", "attn", "wo+norm", "gate_up", "down+norm", "gather", "logits",
                           NULL};
    const char *dec_a[] = {"embed",     "qkv",    "qk_rope", "attn",   "wo+norm", "gate_up",
                           "down+norm", "gather", "logits",  "argmax", NULL};
    int dc[] = {1, L, L, L, L, L, L, 1, 1, 1};
    g3_batch d1 = batch(&c, 1, tok + 12, pos + 12, seq, &zero, 1);
    same_step(&c, &d1, dec_l, dc, dec_a, dc, 2, 3, 1, text, sizeof text);
    printf("  fused tails, decode 1 row, greedy head:\n%s", text);
    teardown(&c);
    unsetenv("G3_VULKAN_FUSE");
}

/* Separate q, k, v products and gate, up + geglu (weights of different types): one label each, once per layer. */
static void test_unfused_products(void **state) {
    (void)state;
    unsetenv("G3_VULKAN_FUSE");
    ctx c;
    if (!setup(&c, 1)) skip();
    int L = c.m->cfg.n_layers;
    char text[4096];
    int32_t tok[13], pos[13], seq[13];
    for (int i = 0; i < 13; i++) tok[i] = (int32_t)((i * 29 + 3) % c.m->cfg.vocab), pos[i] = i, seq[i] = 0;
    int32_t last = 11, zero = 0;
    g3_batch pf = batch(&c, 12, tok, pos, seq, &last, 1);
    g3_error err = {0};
    float *lg = malloc(sizeof(float) * (size_t)c.m->cfg.vocab);
    assert_non_null(lg);
    if (g3_backend_vulkan.forward(c.b, &pf, lg, &err) != G3_OK) fail_msg("forward: %s", err.msg);
    free(lg);
    const char *dec_l[] = {"embed", "q", "k", "v", "qk_rope", "attn", "attn_combine", "wo", "add_norm_attn", "gate",
                           "up", "geglu", "down", "add_norm_ffn", "gather", "logits", NULL};
    const char *dec_a[] = {"embed", "q", "k", "v", "qk_rope", "attn", "attn_combine", "wo", "add_norm_attn", "gate",
                           "up", "geglu", "down", "add_norm_ffn", "gather", "logits", "argmax", NULL};
    int dc[] = {1, L, L, L, L, L, L, L, L, L, L, L, L, L, 1, 1, 1};
    g3_batch d1 = batch(&c, 1, tok + 12, pos + 12, seq, &zero, 1);
    same_step(&c, &d1, dec_l, dc, dec_a, dc, 2, 3, 1, text, sizeof text);
    printf("  separate q, k, v and gate, up, geglu, decode 1 row, greedy head:\n%s", text);
    teardown(&c);
}

/* Prefill on cooperative matrices (where device 0 has them; they serve GGUF block weights: the tiny-gqa fixture's
 * Q8_0 file): the same logits as forward, and the row-scale pass (cm_scale) before the products, in the profile. */
static void test_coopmat_prefill(void **state) {
    (void)state;
    g3_error err = {0};
    if (!have_device()) skip();
    unsetenv("G3_VULKAN_COOPMAT");
    int has = g3_vulkan_test_coopmat(&err);
    if (has < 0) fail_msg("device 0: %s", err.msg);
    if (has == 0) {
        printf("  no cooperative matrices on device 0: skipped\n");
        skip();
    }
    const char *fx = tu_fixture("tiny-gqa");
    if (!fx) {
        printf("  fixture tiny-gqa not found: skipped\n");
        skip();
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/model-q8_0.gguf", fx);
    ctx c;
    if (!setup_cm(&c, 0, 1, path)) skip();
    int32_t tok[12], pos[12], seq[12], last = 11;
    for (int i = 0; i < 12; i++) tok[i] = (int32_t)((i * 37 + 2) % c.m->cfg.vocab), pos[i] = i, seq[i] = 0;
    g3_batch pf = batch(&c, 12, tok, pos, seq, &last, 1);
    size_t V = (size_t)c.m->cfg.vocab;
    float *a = malloc(sizeof(float) * V), *p = malloc(sizeof(float) * V);
    char text[4096];
    if (g3_backend_vulkan.forward(c.b, &pf, a, &err) != G3_OK) fail_msg("forward: %s", err.msg);
    if (g3_vulkan_profile_out(c.b, &pf, 0, p, text, sizeof text, &err) != G3_OK) fail_msg("profile: %s", err.msg);
    printf("  prefill 12 rows on cooperative matrices:\n%s", text);
    assert_non_null(strstr(text, "cm_scale"));
    assert_true(tu_max_abs_diff(a, p, V) == 0);
    free(a), free(p);
    teardown(&c);
}

/* Bad batches are refused before anything is recorded, as forward refuses them. */
static void test_bad_batch(void **state) {
    (void)state;
    unsetenv("G3_VULKAN_FUSE");
    ctx c;
    if (!setup(&c, 0)) skip();
    int32_t tok = 2, pos = 0, seq = 5, out = 0; /* sequence slot 5 of 2 */
    g3_batch bad = batch(&c, 1, &tok, &pos, &seq, &out, 1);
    char text[256] = "x";
    g3_error err = {0};
    assert_int_equal(g3_vulkan_profile(c.b, &bad, text, sizeof text, &err), G3_ERR_ARG);
    assert_string_equal(text, "");
    assert_true(strlen(err.msg) > 0);
    teardown(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_and_prefill),
        cmocka_unit_test(test_fused_tails),
        cmocka_unit_test(test_unfused_products),
        cmocka_unit_test(test_coopmat_prefill),
        cmocka_unit_test(test_bad_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else /* built without the Vulkan backend */
#include "testutil.h"

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tu_skip_no_vulkan)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
