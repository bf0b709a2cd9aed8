/* Models with random weights in the shape of any released Gemma 3 size, for benchmarks and tests. To build a
 * 27B-shaped model in seconds, each matrix is filled with rows picked from a small pool of quantized random rows:
 * the bytes are as large and as spread as a real model's, which is all a speed measurement needs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/status.h"
#include "model/config.h"
#include "model/dtype.h"
#include "model/model.h"

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately normal: sum of four uniforms, scaled to unit variance. */
static float rng_normal(uint64_t *s) {
    float acc = 0;
    for (int i = 0; i < 4; i++) acc += (float)(rng_next(s) >> 40) * (1.0f / 16777216.0f);
    return (acc - 2.0f) * 1.7320508f;
}

#define POOL_ROWS 61 /* prime, so consecutive rows do not line up with matrix sizes */

typedef struct row_pool {
    uint8_t *rows; /* POOL_ROWS rows of row_bytes */
    size_t row_bytes;
    uint32_t type;
} row_pool;

static g3_status pool_make(row_pool *p, uint32_t type, int64_t k, float stddev, uint64_t *seed, g3_error *err) {
    p->type = type;
    p->row_bytes = g3_row_bytes(type, k);
    if (!p->row_bytes) return g3_fail(err, G3_ERR_ARG, "row of %lld values cannot be stored as %s", (long long)k,
                                      g3_dtype_name((g3_dtype)type));
    p->rows = malloc(p->row_bytes * POOL_ROWS);
    float *tmp = malloc(sizeof(float) * (size_t)k);
    if (!p->rows || !tmp) {
        free(tmp);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory for random rows");
    }
    g3_status rc = G3_OK;
    for (int r = 0; r < POOL_ROWS && rc == G3_OK; r++) {
        for (int64_t i = 0; i < k; i++) tmp[i] = rng_normal(seed) * stddev;
        rc = g3_quantize_row(type, tmp, p->rows + (size_t)r * p->row_bytes, k, err);
    }
    free(tmp);
    return rc;
}

static void fill(g3_weight *w, uint8_t **cursor, const row_pool *p, int64_t n, int64_t k, uint64_t *seed) {
    w->type = p->type, w->n = n, w->k = k, w->data = *cursor, w->nbytes = (size_t)n * p->row_bytes;
    for (int64_t r = 0; r < n; r++)
        memcpy(*cursor + (size_t)r * p->row_bytes, p->rows + (rng_next(seed) % POOL_ROWS) * p->row_bytes,
               p->row_bytes);
    *cursor += w->nbytes;
}

/* llama.cpp's quantizer keeps more bits in some tensors of its "_M" mixes (llama_tensor_get_type): the first and
 * last eighth of the layers and every third layer between them take attn_v and ffn_down one type up, and a tied
 * embedding (Gemma's token_embd, which is also the head) takes Q6_K. */
static int more_bits(int l, int n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }

/* mix: NULL every matrix `type`; "q4_k_m" / "q5_k_m" `type` Q4_K / Q5_K, with Q6_K where more_bits and in the
 * embedding, and llama.cpp's fallback types (g3_dtype_fallback) in rows that 256 does not divide */
static g3_status random_model(const char *size, g3_dtype type, const char *mix, uint64_t seed, int layers_override,
                              g3_model **out, g3_error *err) {
    *out = NULL;
    if (!g3_dtype_get(type)) return g3_fail(err, G3_ERR_ARG, "unknown weight type %d", (int)type);
    g3_model *m = calloc(1, sizeof *m);
    if (!m) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = g3_config_preset(&m->cfg, size, err);
    if (rc) goto fail;
    g3_config *c = &m->cfg;
    if (layers_override > 0 && layers_override < c->n_layers) c->n_layers = layers_override;
    m->source = G3_SRC_RANDOM;
    const char *tname = mix ? mix : g3_dtype_name(type);
    const g3_dtype hi = mix ? G3_DTYPE_Q6_K : type; /* the embedding's, and attn_v / ffn_down's in more_bits layers */
    snprintf(m->path, sizeof m->path, "random:%s:%s", size, tname);
    int64_t H = c->hidden, F = c->ffn, D = c->head_dim, Q = (int64_t)c->n_heads * D, KV = (int64_t)c->n_kv_heads * D;
    /* matrices grouped by input width: H (embed, q, k, v, gate, up), Q (o), F (down) */
    uint32_t th = type, tq = type, tf = type, th2 = hi, tf2 = hi;
    if (mix) {
        th = g3_dtype_fallback(type, H), tq = g3_dtype_fallback(type, Q), tf = g3_dtype_fallback(type, F);
        th2 = g3_dtype_fallback(hi, H), tf2 = g3_dtype_fallback(hi, F);
    }
    size_t bh = g3_row_bytes(th, H), bq = g3_row_bytes(tq, Q), bf = g3_row_bytes(tf, F);
    size_t bh2 = g3_row_bytes(th2, H), bf2 = g3_row_bytes(tf2, F);
    if (!bh || !bq || !bf || !bh2 || !bf2) {
        rc = g3_fail(err, G3_ERR_ARG, "shape %s cannot be stored as %s (row length not a multiple of its block)", size,
                     tname);
        goto fail;
    }
    size_t total = bh2 * (size_t)c->vocab;
    for (int l = 0; l < c->n_layers; l++) {
        const int up = mix && more_bits(l, c->n_layers);
        total += bh * (size_t)(Q + KV + 2 * F) + (up ? bh2 : bh) * (size_t)KV + bq * (size_t)H +
                 (up ? bf2 : bf) * (size_t)H;
    }
    m->owned = malloc(total);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->norm_storage = malloc(sizeof(float) * ((size_t)c->n_layers * (size_t)(4 * H + 2 * D) + (size_t)H));
    if (!m->owned || !m->layers || !m->norm_storage) {
        rc = g3_fail(err, G3_ERR_NOMEM, "out of memory: a random %s model in %s needs %.2f GB", size, tname,
                     (double)total / 1e9);
        goto fail;
    }
    uint64_t s = seed ? seed : 1;
    row_pool ph = {0}, pq = {0}, pf = {0}, pe = {0}, ph2 = {0}, pf2 = {0};
    if ((rc = pool_make(&pe, th2, H, 1.0f / sqrtf((float)H), &s, err)) ||
        (rc = pool_make(&ph, th, H, 1.0f / sqrtf((float)H), &s, err)) ||
        (rc = pool_make(&pq, tq, Q, 1.0f / sqrtf((float)Q), &s, err)) ||
        (rc = pool_make(&pf, tf, F, 1.0f / sqrtf((float)F), &s, err)) ||
        (mix && ((rc = pool_make(&ph2, th2, H, 1.0f / sqrtf((float)H), &s, err)) ||
                 (rc = pool_make(&pf2, tf2, F, 1.0f / sqrtf((float)F), &s, err))))) {
        free(pe.rows), free(ph.rows), free(pq.rows), free(pf.rows), free(ph2.rows), free(pf2.rows);
        goto fail;
    }
    uint8_t *cur = m->owned;
    fill(&m->embed, &cur, &pe, c->vocab, H, &s);
    float *ns = m->norm_storage;
    m->final_norm = ns, ns += H;
    for (int64_t i = 0; i < H; i++) m->final_norm[i] = 1.0f + 0.1f * rng_normal(&s);
    for (int l = 0; l < c->n_layers; l++) {
        g3_layer_weights *L = &m->layers[l];
        const int up = mix && more_bits(l, c->n_layers);
        fill(&L->wq, &cur, &ph, Q, H, &s);
        fill(&L->wk, &cur, &ph, KV, H, &s);
        fill(&L->wv, &cur, up ? &ph2 : &ph, KV, H, &s);
        fill(&L->wo, &cur, &pq, H, Q, &s);
        fill(&L->w_gate, &cur, &ph, F, H, &s);
        fill(&L->w_up, &cur, &ph, F, H, &s);
        fill(&L->w_down, &cur, up ? &pf2 : &pf, H, F, &s);
        float **norms[] = {&L->attn_norm, &L->post_attn_norm, &L->pre_ffn_norm, &L->post_ffn_norm};
        for (int i = 0; i < 4; i++) {
            *norms[i] = ns, ns += H;
            for (int64_t j = 0; j < H; j++) (*norms[i])[j] = 1.0f + 0.1f * rng_normal(&s);
        }
        L->q_norm = ns, ns += D;
        L->k_norm = ns, ns += D;
        for (int64_t j = 0; j < D; j++) L->q_norm[j] = 1.0f + 0.1f * rng_normal(&s);
        for (int64_t j = 0; j < D; j++) L->k_norm[j] = 1.0f + 0.1f * rng_normal(&s);
    }
    free(pe.rows), free(ph.rows), free(pq.rows), free(pf.rows), free(ph2.rows), free(pf2.rows);
    m->weight_bytes = total;
    m->n_params = (uint64_t)c->vocab * H + (uint64_t)c->n_layers * (uint64_t)(H * (Q + 2 * KV + 2 * F) + Q * H + F * H);
    *out = m;
    return G3_OK;
fail:
    g3_model_free(m);
    return rc;
}

g3_status g3_model_random(const char *size, g3_dtype type, uint64_t seed, int layers_override, g3_model **out,
                          g3_error *err) {
    return random_model(size, type, NULL, seed, layers_override, out, err);
}

g3_status g3_model_random_mix(const char *size, const char *mix, uint64_t seed, int layers_override, g3_model **out,
                              g3_error *err) {
    *out = NULL;
    if (mix && !strcasecmp(mix, "q4_k_m")) return random_model(size, G3_DTYPE_Q4_K, "q4_k_m", seed, layers_override, out, err);
    if (mix && !strcasecmp(mix, "q5_k_m")) return random_model(size, G3_DTYPE_Q5_K, "q5_k_m", seed, layers_override, out, err);
    return g3_fail(err, G3_ERR_ARG, "unknown weight mix '%s' (known: q4_k_m, q5_k_m)", mix ? mix : "");
}
