/* The Vulkan backend against the CPU backend on random models of every weight type (K-quants on a 256-wide model),
 * with softcaps, a sliding window spanning several small KV blocks and contexts long enough for split attention;
 * and its table-level behaviour: copy_block, greedy picks on the device, staging uploads, bad batches, bad device
 * indices, too little memory. */
#ifdef G3_HAVE_VULKAN
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/vulkan/vulkan_api.h"
#include "gemma3.h"
#include "model/config.h"
#include "model/dtype.h"
#include "model/model.h"
#include "testutil.h"
#include "vk_testutil.h"


static uint64_t rng = 0x243f6a8885a308d3ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* A random 3-layer model (layer 2 global) whose rows are 256 wide, so that every type (Q4_K, Q6_K) fits. */
static g3_model *custom_model(uint32_t type, float attn_cap, float final_cap) {
    g3_error err = {0};
    g3_model *m = calloc(1, sizeof *m);
    assert_non_null(m);
    assert_int_equal(g3_config_preset(&m->cfg, "tiny", &err), G3_OK);
    g3_config *c = &m->cfg;
    c->vocab = 320, c->hidden = 256, c->ffn = 512, c->n_layers = 3, c->n_heads = 4, c->n_kv_heads = 2;
    c->head_dim = 64, c->query_pre_attn_scalar = 48, c->sliding_window = 11, c->sliding_pattern = 3;
    for (int l = 0; l < G3_MAX_LAYERS; l++) c->layer_global[l] = l < 3 && (l + 1) % 3 == 0;
    c->embed_scale = 16.0f, c->attn_softcap = attn_cap, c->final_softcap = final_cap;
    m->source = G3_SRC_RANDOM;
    int H = c->hidden, F = c->ffn, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim, D = c->head_dim;
    size_t bh = g3_row_bytes(type, H), bq = g3_row_bytes(type, Q), bf = g3_row_bytes(type, F);
    size_t total = bh * (size_t)c->vocab + (size_t)c->n_layers * (bh * (size_t)(Q + 2 * KV + 2 * F) + bq * H + bf * H);
    m->owned = malloc(total);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->norm_storage = malloc(sizeof(float) * ((size_t)c->n_layers * (4 * H + 2 * D) + H));
    assert_true(m->owned && m->layers && m->norm_storage);
    uint8_t *cur = m->owned;
    float *row = malloc(sizeof(float) * (size_t)F);
#define FILL(w, n_, k_)                                                                                                \
    do {                                                                                                               \
        (w).type = type, (w).n = (n_), (w).k = (k_), (w).data = cur;                                                   \
        size_t rb = g3_row_bytes(type, (k_));                                                                          \
        (w).nbytes = rb * (size_t)(n_);                                                                                \
        for (int r = 0; r < (n_); r++) {                                                                               \
            for (int i = 0; i < (k_); i++) row[i] = frand() * 1.7f / sqrtf((float)(k_));                                \
            assert_int_equal(g3_quantize_row(type, row, cur, (k_), &err), G3_OK);                                      \
            cur += rb;                                                                                                 \
        }                                                                                                              \
    } while (0)
    FILL(m->embed, c->vocab, H);
    float *ns = m->norm_storage;
    m->final_norm = ns, ns += H;
    for (int i = 0; i < H; i++) m->final_norm[i] = 1.0f + 0.3f * frand();
    for (int l = 0; l < c->n_layers; l++) {
        g3_layer_weights *L = &m->layers[l];
        FILL(L->wq, Q, H);
        FILL(L->wk, KV, H);
        FILL(L->wv, KV, H);
        FILL(L->wo, H, Q);
        FILL(L->w_gate, F, H);
        FILL(L->w_up, F, H);
        FILL(L->w_down, H, F);
        float **norms[] = {&L->attn_norm, &L->post_attn_norm, &L->pre_ffn_norm, &L->post_ffn_norm};
        for (int i = 0; i < 4; i++) {
            *norms[i] = ns, ns += H;
            for (int j = 0; j < H; j++) (*norms[i])[j] = 1.0f + 0.3f * frand();
        }
        L->q_norm = ns, ns += D;
        L->k_norm = ns, ns += D;
        for (int j = 0; j < D; j++) L->q_norm[j] = 1.0f + 0.3f * frand(), L->k_norm[j] = 1.0f + 0.3f * frand();
    }
#undef FILL
    free(row);
    return m;
}

static float *all_logits(g3_model *m, const char *backend, const int32_t *prompt, int n, int chunk) {
    g3_engine_opts o;
    g3_engine_opts_default(&o);
    o.backend = backend;
    o.ctx_size = 256;
    o.prefill_chunk = chunk;
    o.kv_block = 4;
    g3_engine *e = NULL;
    g3_error err = {0};
    if (g3_engine_create(m, &o, &e, &err) != G3_OK) fail_msg("%s engine: %s", backend, err.msg);
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)m->cfg.vocab);
    if (g3_engine_logits(e, prompt, n, 1, out, &err) != G3_OK) fail_msg("%s logits: %s", backend, err.msg);
    g3_engine_free(e);
    return out;
}

/* Vulkan vs CPU over every position; float weights: within 1e-3 * max(1, max|cpu|) per row. Quantized weights: the
 * CPU multiplies 8-bit-quantized activations, the Vulkan kernels float32 ones, so rows agree only to ~1e-2 and the
 * argmax mostly. */
static void compare(uint32_t type, float attn_cap, float final_cap, int n, int chunk) {
    g3_model *m = custom_model(type, attn_cap, final_cap);
    int V = m->cfg.vocab;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)((unsigned)(i * 2654435761u) % (unsigned)V);
    float *cpu = all_logits(m, "cpu", prompt, n, chunk), *vk = all_logits(m, "vulkan", prompt, n, chunk);
    double worst = 0;
    int agree = 0;
    for (int p = 0; p < n; p++) {
        const float *a = cpu + (size_t)p * V, *b = vk + (size_t)p * V;
        double mx = 1, d = 0;
        int ia = 0, ib = 0;
        for (int i = 0; i < V; i++) {
            if (fabs(a[i]) > mx) mx = fabs(a[i]);
            double x = fabs((double)a[i] - b[i]);
            if (x > d || isnan(x)) d = isnan(x) ? INFINITY : x;
            if (a[i] > a[ia]) ia = i;
            if (b[i] > b[ib]) ib = i;
        }
        if (d / mx > worst) worst = d / mx;
        agree += ia == ib;
    }
    int quantized = g3_dtype_get(type)->quantized;
    printf("  %-5s caps %g/%g, %d positions, chunk %d: max relative difference %.2e, argmax equal %d/%d\n",
           g3_dtype_name((g3_dtype)type), (double)attn_cap, (double)final_cap, n, chunk, worst, agree, n);
    if (quantized) {
        assert_true(worst < 5e-2);
        assert_true(agree >= n * 9 / 10);
    } else {
        assert_true(worst < 1e-3);
    }
    free(prompt), free(cpu), free(vk);
    g3_model_free(m);
}

static void test_vs_cpu_all_types(void **state) {
    (void)state;
    if (!have_device()) skip();
    static const uint32_t types[] = {G3_DTYPE_F32,  G3_DTYPE_F16,  G3_DTYPE_BF16, G3_DTYPE_Q8_0, G3_DTYPE_Q4_0,
                                     G3_DTYPE_Q4_K, G3_DTYPE_Q6_K, G3_DTYPE_Q4_1, G3_DTYPE_Q5_1, G3_DTYPE_Q5_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) compare(types[t], 0, 0, 40, 16);
    compare(G3_DTYPE_F32, 20.0f, 10.0f, 40, 16); /* softcaps */
    compare(G3_DTYPE_BF16, 0, 0, 150, 1);        /* decode path at every position: split attention, 3 chunks */
    compare(G3_DTYPE_Q4_K, 0, 0, 70, 7);
    compare(G3_DTYPE_F16, 0, 0, 40, 3); /* 4-row bucket: matvec1n, fused post-norm tails */
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1); /* every kernel's shared-memory reduction variant */
    compare(G3_DTYPE_F16, 5.0f, 0, 70, 16);
    compare(G3_DTYPE_F16, 0, 0, 70, 1);
    compare(G3_DTYPE_BF16, 0, 0, 40, 5);
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
}

/* $G3_VULKAN_KV=f16: the KV cache in f16 (K and V rounded to 11 bits), prefill and split decode attention. */
static void test_kv_f16(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_KV", "f16", 1);
    compare(G3_DTYPE_F32, 20.0f, 10.0f, 40, 16);
    compare(G3_DTYPE_BF16, 0, 0, 150, 1);
    compare(G3_DTYPE_Q8_0, 0, 0, 40, 1);
    unsetenv("G3_VULKAN_KV");
}

/* ---- the ops table directly ------------------------------------------------------------------------------------- */

enum { MAXS = 2, BPS = 16, NB = 40, BLK = 4 };

typedef struct tables {
    int32_t g[MAXS][BPS], l[MAXS][BPS];
} tables;

static g3_status run(const g3_backend_ops *ops, g3_backend *b, tables *t, const int32_t *tok, const int32_t *pos,
                     const int32_t *seq, int n, float *logits, g3_error *err) {
    int32_t out = n - 1;
    g3_batch bt = {.n_rows = n, .token = tok, .pos = pos, .seq = seq, .n_out = 1, .out_rows = &out,
                   .bt_global = &t->g[0][0], .bt_local = &t->l[0][0]};
    return ops->forward(b, &bt, logits, err);
}

static void test_ops_copy_block_staging_errors(void **state) {
    (void)state;
    if (!have_device()) skip();
    /* the mixed-batch check below holds the one-row decode (matvec) and the 11-row batch (tiled matmul) to 1e-4 of
     * each other: both on float activations; the int8 one-row products (default where the device has int8 dot
     * products) are held to their own bound in test_vulkan_mvq */
    setenv("G3_VULKAN_MVQ", "0", 1);
    /* and the portable tiled matmul for the 11-row batch: on cooperative matrices the Q8_0 weights' d * q are rounded
     * to f16 (test_coopmat and test_vulkan_coopmat bound that path) */
    setenv("G3_VULKAN_COOPMAT", "0", 1);
    const g3_backend_ops *ops = g3_backend_find("vulkan");
    assert_non_null(ops);
    g3_model *m = custom_model(G3_DTYPE_Q8_0, 0, 0);
    int V = m->cfg.vocab;
    g3_backend_cfg cfg = {.max_seqs = MAXS, .max_rows = 12, .kv_block = BLK, .max_blocks_per_seq = BPS,
                          .n_blocks_global = NB, .n_blocks_local = NB};
    g3_backend *b = NULL;
    g3_error err = {0};
    if (ops->create(m, &cfg, &b, &err) != G3_OK) fail_msg("create: %s", err.msg);
    printf("  device: %s\n", g3_vulkan_device_name(b));
    tables t;
    memset(&t, -1, sizeof t);
    for (int i = 0; i < 3; i++) t.g[0][i] = i, t.l[0][i] = i;
    int32_t tok[11], pos[11], seq[11];
    for (int i = 0; i < 11; i++) tok[i] = (i * 37 + 5) % V, pos[i] = i, seq[i] = 0;
    float *pre = malloc(sizeof(float) * V), *a = malloc(sizeof(float) * V), *c = malloc(sizeof(float) * V);
    if (run(ops, b, &t, tok, pos, seq, 10, pre, &err)) fail_msg("prefill: %s", err.msg);
    /* seq 1 starts as a copy of seq 0's blocks */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ops->copy_block(b, 0, i, 10 + i, &err), G3_OK);
        assert_int_equal(ops->copy_block(b, 1, i, 10 + i, &err), G3_OK);
        t.g[1][i] = 10 + i, t.l[1][i] = 10 + i;
    }
    int32_t dtok = 7, dpos = 10, s0 = 0, s1 = 1;
    if (run(ops, b, &t, &dtok, &dpos, &s0, 1, a, &err)) fail_msg("decode: %s", err.msg);
    if (run(ops, b, &t, &dtok, &dpos, &s1, 1, c, &err)) fail_msg("decode: %s", err.msg);
    double d = 0;
    for (int i = 0; i < V; i++) d = fmax(d, fabs(a[i] - c[i]));
    printf("  decode after copy_block: max difference %.3g\n", d);
    assert_true(d < 1e-6);
    /* the same row over blocks that were never written gives something else */
    for (int i = 0; i < 3; i++) t.g[1][i] = 20 + i, t.l[1][i] = 20 + i;
    if (run(ops, b, &t, &dtok, &dpos, &s1, 1, c, &err)) fail_msg("decode: %s", err.msg);
    d = 0;
    for (int i = 0; i < V; i++) d = fmax(d, fabs(a[i] - c[i]));
    assert_true(d > 1e-3);
    /* one batch mixing seq 0's decode row with seq 1's prefill rows matches the separate forwards */
    for (int i = 0; i < 3; i++) t.g[1][i] = 30 + i, t.l[1][i] = 30 + i;
    int32_t mtok[11], mpos[11], mseq[11], outs[2] = {0, 10};
    mtok[0] = dtok, mpos[0] = dpos, mseq[0] = 0;
    for (int i = 0; i < 10; i++) mtok[1 + i] = tok[i], mpos[1 + i] = i, mseq[1 + i] = 1;
    float *two = malloc(sizeof(float) * 2 * V);
    g3_batch mb = {.n_rows = 11, .token = mtok, .pos = mpos, .seq = mseq, .n_out = 2, .out_rows = outs,
                   .bt_global = &t.g[0][0], .bt_local = &t.l[0][0]};
    if (ops->forward(b, &mb, two, &err)) fail_msg("mixed batch: %s", err.msg);
    double d0 = 0, d1 = 0;
    for (int i = 0; i < V; i++) d0 = fmax(d0, fabs(two[i] - a[i])), d1 = fmax(d1, fabs(two[V + i] - pre[i]));
    printf("  mixed batch vs separate forwards: %.3g, %.3g\n", d0, d1);
    assert_true(d0 < 1e-4 && d1 < 1e-4);
    /* greedy picks on the device: the argmax of the same logits (matvec head for 2 rows, matmul head for 11) */
    assert_non_null(ops->forward_argmax);
    int32_t ids[11], all_rows[11];
    if (ops->forward_argmax(b, &mb, ids, &err)) fail_msg("forward_argmax: %s", err.msg);
    for (int r = 0; r < 2; r++) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (two[(size_t)r * V + i] > two[(size_t)r * V + best]) best = i;
        assert_int_equal(ids[r], best);
    }
    float *every = malloc(sizeof(float) * 11 * V);
    for (int i = 0; i < 11; i++) all_rows[i] = i;
    mb.n_out = 11, mb.out_rows = all_rows;
    if (ops->forward(b, &mb, every, &err) || ops->forward_argmax(b, &mb, ids, &err)) fail_msg("%s", err.msg);
    for (int r = 0; r < 11; r++) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (every[(size_t)r * V + i] > every[(size_t)r * V + best]) best = i;
        assert_int_equal(ids[r], best);
    }
    free(every);
    /* bad batches */
    int32_t bad = V;
    assert_int_equal(run(ops, b, &t, &bad, &dpos, &s0, 1, c, &err), G3_ERR_ARG);
    int32_t far = 13; /* block 3 of seq 0 is unmapped */
    assert_int_equal(run(ops, b, &t, &dtok, &far, &s0, 1, c, &err), G3_ERR_ARG);
    assert_non_null(strstr(err.msg, "not mapped"));
    assert_int_equal(ops->copy_block(b, 0, 0, NB, &err), G3_ERR_ARG);
    ops->destroy(b);
    /* staging uploads give the same numbers */
    setenv("G3_VULKAN_STAGING", "1", 1);
    g3_status rc = ops->create(m, &cfg, &b, &err);
    unsetenv("G3_VULKAN_STAGING");
    if (rc) fail_msg("create (staging): %s", err.msg);
    memset(&t, -1, sizeof t);
    for (int i = 0; i < 3; i++) t.g[0][i] = i, t.l[0][i] = i;
    if (run(ops, b, &t, tok, pos, seq, 10, c, &err)) fail_msg("prefill: %s", err.msg);
    assert_memory_equal(c, pre, sizeof(float) * V);
    ops->destroy(b);
    /* a KV cache larger than any device: refused with the sizes before anything is allocated */
    cfg.n_blocks_global = 1 << 30;
    assert_int_equal(ops->create(m, &cfg, &b, &err), G3_ERR_NOMEM);
    printf("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, "not enough device memory"));
    cfg.n_blocks_global = NB;
    /* no such device */
    cfg.device = 99;
    assert_int_equal(ops->create(m, &cfg, &b, &err), G3_ERR_DEVICE);
    assert_non_null(strstr(err.msg, "does not exist"));
    free(pre), free(a), free(c), free(two);
    g3_model_free(m);
    unsetenv("G3_VULKAN_MVQ");
    unsetenv("G3_VULKAN_COOPMAT");
}

/* The decode switches: $G3_VULKAN_FUSE=0 (post-norms and the split-attention merge as dispatches of their own) and
 * $G3_VULKAN_MATVECN=0 (2..8-row products through matvec.comp): 3 more dispatches per layer in buckets of up to 8
 * rows, none more beyond,
 * and give the same logits as the fused tails (opt-in, $G3_VULKAN_FUSE=1) for 1, 3 and 8 decode rows and a 10-row
 * prefill. */
static float *switch_run(g3_model *m, const char *fuse, const char *matvecn, int *disp) {
    const g3_backend_ops *ops = g3_backend_find("vulkan");
    g3_backend_cfg cfg = {.max_seqs = MAXS, .max_rows = 12, .kv_block = BLK, .max_blocks_per_seq = BPS,
                          .n_blocks_global = NB, .n_blocks_local = NB};
    g3_backend *b = NULL;
    g3_error err = {0};
    setenv("G3_VULKAN_FUSE", fuse, 1);
    setenv("G3_VULKAN_MATVECN", matvecn, 1);
    g3_status rc = ops->create(m, &cfg, &b, &err);
    unsetenv("G3_VULKAN_FUSE");
    unsetenv("G3_VULKAN_MATVECN");
    if (rc) fail_msg("create: %s", err.msg);
    static const int rows[5] = {1, 2, 4, 8, 12};
    for (int i = 0; i < 5; i++) disp[i] = g3_vulkan_body_dispatches(b, rows[i]);
    int V = m->cfg.vocab;
    tables t;
    memset(&t, -1, sizeof t);
    for (int i = 0; i < 6; i++) t.g[0][i] = i, t.l[0][i] = i;
    int32_t tok[12], pos[12], seq[12];
    float *out = malloc(sizeof(float) * 4 * (size_t)V);
    for (int i = 0; i < 12; i++) tok[i] = (i * 53 + 11) % V, pos[i] = i, seq[i] = 0;
    if (run(ops, b, &t, tok, pos, seq, 10, out, &err)) fail_msg("prefill: %s", err.msg); /* 12-row bucket */
    int steps[3] = {1, 3, 8}, p0 = 10;
    for (int s = 0; s < 3; s++) { /* decode-sized batches: rows p0..p0+n-1 of the same sequence */
        for (int i = 0; i < steps[s]; i++) pos[i] = p0 + i, tok[i] = (p0 * 7 + i) % V, seq[i] = 0;
        if (run(ops, b, &t, tok, pos, seq, steps[s], out + (size_t)(1 + s) * V, &err)) fail_msg("step: %s", err.msg);
        p0 += steps[s];
    }
    ops->destroy(b);
    return out;
}

/* Largest |a - ref| over the V logits of step s, relative to max(1, max |ref|); a NaN in a counts as infinite. */
static double step_rel_diff(const float *a, const float *ref, int V, int s) {
    double mx = 1, d = 0;
    for (int i = 0; i < V; i++) {
        size_t k = (size_t)s * V + i;
        mx = fmax(mx, fabs(ref[k]));
        d = isnan(a[k]) ? INFINITY : fmax(d, fabs(a[k] - ref[k]));
    }
    return d / mx;
}

static void test_decode_switches(void **state) {
    (void)state;
    if (!have_device()) skip();
    g3_model *m = custom_model(G3_DTYPE_Q8_0, 0, 0);
    int V = m->cfg.vocab, L = m->cfg.n_layers, dn[5], d0[5], dv[5];
    setenv("G3_VULKAN_MV2", "0", 1); /* matvec1n vs matvec (matvec2, the default, is compared in test_matvec2) */
    float *fused = switch_run(m, "1", "1", dn), *plain = switch_run(m, "0", "1", d0);
    float *old = switch_run(m, "0", "0", dv);
    unsetenv("G3_VULKAN_MV2");
    printf("  dispatches per body (1, 2, 4, 8, 12 rows; %d layers): fused %d %d %d %d %d, "
           "G3_VULKAN_FUSE=0 %d %d %d %d %d\n",
           L, dn[0], dn[1], dn[2], dn[3], dn[4], d0[0], d0[1], d0[2], d0[3], d0[4]);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(d0[i] - dn[i], 3 * L);
        assert_int_equal(dn[i], 1 + 6 * L); /* embed; QKV, qk_rope, attn+merge, Wo+tail, gate/up, down+tail */
        assert_int_equal(dv[i], d0[i]);
    }
    assert_int_equal(dn[4], d0[4]); /* beyond 8 rows: tiled matmul, add_norm dispatches as before */
    for (int s = 0; s < 4; s++) {
        const double d1 = step_rel_diff(fused, plain, V, s), d2 = step_rel_diff(old, plain, V, s);
        printf("  step %d: fused vs separate %.2e, matvec1n vs matvec %.2e (relative)\n", s, d1, d2);
        assert_true(d1 < 1e-5 && d2 < 1e-5);
    }
    free(fused), free(plain), free(old);
    g3_model_free(m);
}

/* matvec2.comp for the 1..8-row products (the default; $G3_VULKAN_MV2=0: matvec1/matvec1n): the logits of 1-, 3-
 * and 8-row steps and a 10-row prefill equal to matvec1/matvec1n's within 1e-5, with the post-norm tails separate
 * and fused (mode 2), same dispatch counts; Vulkan vs CPU with Q4_0, Q8_0, F16 (softcaps: the one-row head's mode 1)
 * and BF16 weights decoded one and three rows at a time, and once without subgroup operations. */
static void test_matvec2(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MVQ", "0", 1); /* matvec2 at one row too, not the int8 products (test_vulkan_mvq) */
    g3_model *m = custom_model(G3_DTYPE_Q4_0, 0, 0);
    int V = m->cfg.vocab, d0[5], d1[5], d2[5];
    setenv("G3_VULKAN_MV2", "0", 1);
    float *base = switch_run(m, "0", "1", d0);
    setenv("G3_VULKAN_MV2", "1", 1);
    float *mv = switch_run(m, "0", "1", d1), *mvf = switch_run(m, "1", "1", d2);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(d1[i], d0[i]);
        assert_int_equal(d2[i], 1 + 6 * m->cfg.n_layers);
    }
    for (int s = 0; s < 4; s++) {
        const double e1 = step_rel_diff(mv, base, V, s), e2 = step_rel_diff(mvf, base, V, s);
        printf("  step %d: matvec2 vs matvec1 %.2e, matvec2 + fused tails vs matvec1 %.2e (relative)\n", s, e1, e2);
        assert_true(e1 < 1e-5 && e2 < 1e-5);
    }
    free(base), free(mv), free(mvf);
    g3_model_free(m);
    compare(G3_DTYPE_Q4_0, 0, 0, 40, 1);
    compare(G3_DTYPE_Q8_0, 0, 0, 40, 3);
    compare(G3_DTYPE_F16, 20.0f, 10.0f, 40, 1);
    compare(G3_DTYPE_BF16, 0, 0, 40, 3);
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1);
    compare(G3_DTYPE_Q4_0, 0, 0, 24, 3);
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
    unsetenv("G3_VULKAN_MV2");
    unsetenv("G3_VULKAN_MVQ");
}

/* The one-row matvec2 variants of a tuning sweep ($G3_VULKAN_MV2_WG / _NC / _COLS, matvec2s*): the logits of a 10-row
 * prefill and 1-, 3- and 8-row steps within 1e-5 of the default kernel's (the 3- and 8-row steps run matvec2n, which
 * the variants leave as it is, after a one-row step through the variant), post-norm tails separate and fused. */
static void test_matvec2_variants(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MVQ", "0", 1); /* one-row products on matvec2 (its variants), not the int8 products */
    g3_model *m = custom_model(G3_DTYPE_Q4_0, 0, 0);
    int V = m->cfg.vocab, d0[5], d1[5];
    float *base = switch_run(m, "0", "1", d0);
    static const char *const variants[][3] = {
        /* WG, NC, COLS */
        {"64", "8", "2"}, {"64", "4", "2"},  {"64", "16", "2"}, {"32", "8", "2"}, {"128", "8", "2"},
        {"256", "8", "2"}, {"64", "8", "1"}, {"64", "8", "4"},  {"32", "16", "1"}, {"256", "4", "4"},
    };
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        setenv("G3_VULKAN_MV2_WG", variants[v][0], 1);
        setenv("G3_VULKAN_MV2_NC", variants[v][1], 1);
        setenv("G3_VULKAN_MV2_COLS", variants[v][2], 1);
        setenv("G3_VULKAN_MV2_SPEC", "1", 1);
        const char *fuse = v % 2 ? "1" : "0";
        float *out = switch_run(m, fuse, "1", d1);
        unsetenv("G3_VULKAN_MV2_WG"), unsetenv("G3_VULKAN_MV2_NC"), unsetenv("G3_VULKAN_MV2_COLS");
        unsetenv("G3_VULKAN_MV2_SPEC");
        for (int i = 0; i < 4; i++) assert_int_equal(d1[i], *fuse == '1' ? 1 + 6 * m->cfg.n_layers : d0[i]);
        double worst = 0;
        for (int s = 0; s < 4; s++) worst = fmax(worst, step_rel_diff(out, base, V, s));
        printf("  WG %s NC %s COLS %s, tails %s: worst step vs the default kernel %.2e (relative)\n", variants[v][0],
               variants[v][1], variants[v][2], *fuse == '1' ? "fused" : "separate", worst);
        assert_true(worst < 1e-5);
        free(out);
    }
    free(base);
    g3_model_free(m);
    unsetenv("G3_VULKAN_MVQ");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_switches),
        cmocka_unit_test(test_matvec2),
        cmocka_unit_test(test_matvec2_variants),
        cmocka_unit_test(test_vs_cpu_all_types),
        cmocka_unit_test(test_kv_f16),
        cmocka_unit_test(test_ops_copy_block_staging_errors),
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
