/* The CPU backend: the whole Gemma 3 forward for a batch of rows, float32 activations and residual stream, matrix
 * products by the SIMD kernels of matmul.h against the weights in their stored type, attention over the paged
 * KV cache (float32 K/V). Every buffer is sized at create for max_rows rows; forward allocates nothing.
 *
 * Per layer (GEMMA3.md):  x = rms(h)*(1+w_in); q,k,v = x W; q,k = rms_head(.)*(1+w_qk); rope(q,k);
 *   h += rms(attn(q,K,V) Wo)*(1+w_post); x = rms(h)*(1+w_pre_ffn); h += rms((gelu(x Wg)*(x Wu)) Wd)*(1+w_post_ffn) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/matmul.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "model/dtype.h"
#include "sample/kernels.h"

/* The matrices as the kernels read them: the model's (in the mmap) or a repacked copy (8 rows interleaved per
 * block, for the integer kernels) owned by the backend. */
typedef struct cpu_weights {
    g3_weight w[7]; /* wq, wk, wv, wo, w_gate, w_up, w_down */
} cpu_weights;

enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN };

struct g3_backend {
    const g3_model *m;
    cpu_weights *lw;              /* [n_layers] */
    g3_weight head;               /* output projection (the tied embedding) */
    void **owned;                 /* repacked copies to free, [7 * n_layers + 1] */
    int n_owned;
    g3_backend_cfg cfg;
    g3_pool *pool;
    int n_layers_kind[2];         /* global, sliding */
    int *layer_index;             /* [n_layers] index of the layer within its kind */
    float *kv[2];                 /* pools: [n_blocks][n_layers_kind][2][kv_heads][B][D] */
    size_t block_floats[2];       /* floats per physical block */
    float *inv_freq[2];           /* [D/2] rope frequencies: global (scaled), sliding */
    /* activations, [max_rows][...] */
    float *h, *x, *q, *k, *v, *att, *tmp, *gate, *up, *xo;
    void *act_scratch;
    float *scores;                /* [n_threads][ctx] attention scratch */
    int ctx;                      /* max_blocks_per_seq * kv_block */
    /* forward_submit / forward_collect: run at submit (the CPU has nothing to overlap), ids kept until collected */
    float *sub_logits;            /* [sub_cap rows][vocab] */
    int sub_cap;
    int32_t *sub_tok;             /* [max_rows] a fed step's tokens */
    int32_t *sub_ids[2];          /* [max_rows] picked ids of the steps submitted and not collected */
    int sub_n[2], sub_k, sub_cnt, sub_last;
};

static size_t max_act_scratch(const g3_model *m, int rows) {
    const g3_config *c = &m->cfg;
    size_t best = g3_act_scratch_bytes(m->embed.type, rows, c->hidden);
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *L = &m->layers[l];
        const g3_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            size_t s = g3_act_scratch_bytes(ws[i]->type, rows, (int)ws[i]->k);
            if (s > best) best = s;
        }
    }
    return best;
}

static size_t cpu_block_bytes(const g3_model *m, const g3_backend_cfg *cfg, int kind) {
    const g3_config *c = &m->cfg;
    return sizeof(float) * (size_t)g3_layers_of_kind(c, kind) * 2 * (size_t)c->n_kv_heads * (size_t)cfg->kv_block *
           (size_t)c->head_dim;
}

static void cpu_destroy(g3_backend *b) {
    if (!b) return;
    for (int i = 0; i < b->n_owned; i++) free(b->owned[i]);
    free(b->owned);
    free(b->lw);
    g3_pool_free(b->pool);
    free(b->layer_index);
    for (int i = 0; i < 2; i++) free(b->kv[i]), free(b->inv_freq[i]);
    free(b->h), free(b->x), free(b->q), free(b->k), free(b->v), free(b->att), free(b->tmp);
    free(b->gate), free(b->up), free(b->xo), free(b->act_scratch), free(b->scores);
    free(b->sub_logits), free(b->sub_tok), free(b->sub_ids[0]), free(b->sub_ids[1]);
    free(b);
}

static float *falloc(size_t n, int *ok) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    if (!p) *ok = 0;
    return p;
}

/* Uses a weight as stored, or repacked when the kernels are faster on the repacked form. 0 = out of memory. */
static int bind_weight(g3_backend *b, g3_weight *dst, const g3_weight *src) {
    *dst = *src;
    if (getenv("G3_CPU_NO_REPACK")) return 1;
    if (!g3_matmul_repack_type(src->type, (int)src->n, (int)src->k)) return 1;
    void *p = malloc(g3_matmul_repack_bytes(src->type, (int)src->n, (int)src->k));
    if (!p) return 0;
    dst->type = g3_matmul_repack(src->type, src->data, (int)src->n, (int)src->k, p);
    dst->data = p;
    b->owned[b->n_owned++] = p;
    return 1;
}

static g3_status cpu_create(const g3_model *m, const g3_backend_cfg *cfg, g3_backend **out, g3_error *err) {
    *out = NULL;
    const g3_config *c = &m->cfg;
    if (cfg->max_rows <= 0 || cfg->kv_block <= 0 || cfg->max_blocks_per_seq <= 0 || cfg->max_seqs <= 0)
        return g3_fail(err, G3_ERR_ARG, "cpu backend: bad configuration (rows %d, block %d, blocks/seq %d, seqs %d)",
                       cfg->max_rows, cfg->kv_block, cfg->max_blocks_per_seq, cfg->max_seqs);
    g3_backend *b = calloc(1, sizeof *b);
    if (!b) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    b->m = m;
    b->cfg = *cfg;
    b->ctx = cfg->max_blocks_per_seq * cfg->kv_block;
    b->pool = g3_pool_create(cfg->n_threads);
    if (!b->pool) {
        cpu_destroy(b);
        return g3_fail(err, G3_ERR_NOMEM, "cannot start %d threads", cfg->n_threads);
    }
    int ok = 1;
    b->lw = calloc((size_t)c->n_layers, sizeof *b->lw);
    b->owned = calloc((size_t)c->n_layers * 7 + 1, sizeof *b->owned);
    if (!b->lw || !b->owned) ok = 0;
    for (int l = 0; ok && l < c->n_layers; l++) {
        const g3_layer_weights *L = &m->layers[l];
        const g3_weight *src[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; ok && i < 7; i++) ok = bind_weight(b, &b->lw[l].w[i], src[i]);
    }
    if (ok) ok = bind_weight(b, &b->head, &m->embed);
    if (!ok) {
        cpu_destroy(b);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory repacking the weights");
    }
    b->layer_index = calloc((size_t)c->n_layers, sizeof(int));
    if (!b->layer_index) ok = 0;
    for (int l = 0; ok && l < c->n_layers; l++) {
        int kind = c->layer_global[l] ? 0 : 1;
        b->layer_index[l] = b->n_layers_kind[kind]++;
    }
    int nblocks[2] = {cfg->n_blocks_global, cfg->n_blocks_local};
    for (int kind = 0; ok && kind < 2; kind++) {
        b->block_floats[kind] = cpu_block_bytes(m, cfg, kind) / sizeof(float);
        size_t n = b->block_floats[kind] * (size_t)nblocks[kind];
        if (n) {
            b->kv[kind] = calloc(n, sizeof(float));
            if (!b->kv[kind]) {
                cpu_destroy(b);
                return g3_fail(err, G3_ERR_NOMEM, "cannot allocate the KV cache (%.2f GB)",
                               (double)(n * sizeof(float)) / 1e9);
            }
        }
    }
    int D = c->head_dim;
    for (int kind = 0; ok && kind < 2; kind++) {
        b->inv_freq[kind] = falloc((size_t)D / 2, &ok);
        if (!ok) break;
        float base = kind == 0 ? c->rope_base_global : c->rope_base_local;
        float scale = kind == 0 ? c->rope_scale_global : 1.0f;
        for (int i = 0; i < D / 2; i++) /* as transformers: 1 / base^(2i/D) in float32, then / factor */
            b->inv_freq[kind][i] = (1.0f / powf(base, (float)(2 * i) / (float)D)) / scale;
    }
    size_t R = (size_t)cfg->max_rows, H = (size_t)c->hidden, F = (size_t)c->ffn;
    size_t Q = (size_t)c->n_heads * (size_t)D, KV = (size_t)c->n_kv_heads * (size_t)D;
    b->h = falloc(R * H, &ok), b->x = falloc(R * H, &ok), b->tmp = falloc(R * H, &ok), b->xo = falloc(R * H, &ok);
    b->q = falloc(R * Q, &ok), b->att = falloc(R * Q, &ok), b->k = falloc(R * KV, &ok), b->v = falloc(R * KV, &ok);
    b->gate = falloc(R * F, &ok), b->up = falloc(R * F, &ok);
    b->act_scratch = malloc(max_act_scratch(m, (int)R) + 64);
    b->scores = falloc((size_t)g3_pool_size(b->pool) * (size_t)b->ctx, &ok);
    if (!ok || !b->act_scratch) {
        cpu_destroy(b);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory for activations of %d rows", cfg->max_rows);
    }
    *out = b;
    return G3_OK;
}

/* ---- matmul with activations prepared once per (input, weight type) ------------------------------------------ */

typedef struct prepared {
    g3_act act;
    const float *x;
    int valid;
} prepared;

static void mm(g3_backend *b, prepared *p, const float *x, int m, const g3_weight *w, float *y) {
    if (!p->valid || p->x != x || p->act.wtype != w->type || p->act.m != m) {
        g3_act_prepare(b->pool, &p->act, w->type, x, m, (int)w->k, b->act_scratch);
        p->x = x;
        p->valid = 1;
    }
    g3_matmul(b->pool, &p->act, w->data, (int)w->n, y, (int)w->n);
}

/* ---- the forward --------------------------------------------------------------------------------------------- */


/* Attention of every (row, query head) pair, in parallel. */
typedef struct attn_job {
    g3_backend *b;
    const g3_batch *bt;
    int layer, kind, li;
} attn_job;

static void attn_task(void *arg, int ith, int nth) {
    const attn_job *j = arg;
    g3_backend *b = j->b;
    const g3_config *c = &b->m->cfg;
    int D = c->head_dim, NH = c->n_heads, KVH = c->n_kv_heads, B = b->cfg.kv_block;
    int group = NH / KVH;
    float scale = 1.0f / sqrtf(c->query_pre_attn_scalar);
    float *scores = b->scores + (size_t)ith * (size_t)b->ctx;
    long begin, end;
    g3_split_range((long)j->bt->n_rows * NH, 1, ith, nth, &begin, &end);
    for (long t = begin; t < end; t++) {
        int r = (int)(t / NH), hq = (int)(t % NH), hk = hq / group;
        int pos = j->bt->pos[r], seq = j->bt->seq[r];
        int first = j->kind ? pos - c->sliding_window + 1 : 0;
        if (first < 0) first = 0;
        const int32_t *tab = (j->kind ? j->bt->bt_local : j->bt->bt_global) +
                             (size_t)seq * (size_t)b->cfg.max_blocks_per_seq;
        const float *qv = b->q + ((size_t)r * NH + hq) * D;
        float *out = b->att + ((size_t)r * NH + hq) * D;
        g3_attend(b->kv[j->kind], b->block_floats[j->kind], j->li, KVH, hk, B, D, tab, first, pos, qv, scale,
                  c->attn_softcap, scores, out);
    }
}

/* Per row: QK-norm, rope, and the K/V write into the cache. */
typedef struct qkv_job {
    g3_backend *b;
    const g3_batch *bt;
    int layer, kind, li;
} qkv_job;

static void qkv_task(void *arg, int ith, int nth) {
    const qkv_job *j = arg;
    g3_backend *b = j->b;
    const g3_config *c = &b->m->cfg;
    const g3_layer_weights *L = &b->m->layers[j->layer];
    int D = c->head_dim, NH = c->n_heads, KVH = c->n_kv_heads, B = b->cfg.kv_block;
    long begin, end;
    g3_split_range(j->bt->n_rows, 1, ith, nth, &begin, &end);
    for (long r = begin; r < end; r++) {
        int pos = j->bt->pos[r], seq = j->bt->seq[r];
        float *q = b->q + (size_t)r * NH * D, *k = b->k + (size_t)r * KVH * D, *v = b->v + (size_t)r * KVH * D;
        for (int h = 0; h < NH; h++) {
            g3_rmsnorm(q + (size_t)h * D, q + (size_t)h * D, L->q_norm, D, c->rms_eps);
            g3_rope(q + (size_t)h * D, D, pos, b->inv_freq[j->kind]);
        }
        const int32_t *tab = (j->kind ? j->bt->bt_local : j->bt->bt_global) +
                             (size_t)seq * (size_t)b->cfg.max_blocks_per_seq;
        float *blk = b->kv[j->kind] + (size_t)tab[pos / B] * b->block_floats[j->kind];
        for (int h = 0; h < KVH; h++) {
            g3_rmsnorm(k + (size_t)h * D, k + (size_t)h * D, L->k_norm, D, c->rms_eps);
            g3_rope(k + (size_t)h * D, D, pos, b->inv_freq[j->kind]);
            float *kd = blk + ((((size_t)j->li * 2 + 0) * KVH + h) * B + pos % B) * D;
            float *vd = blk + ((((size_t)j->li * 2 + 1) * KVH + h) * B + pos % B) * D;
            memcpy(kd, k + (size_t)h * D, sizeof(float) * D);
            memcpy(vd, v + (size_t)h * D, sizeof(float) * D);
        }
    }
}

/* Row-wise elementwise stages. */
typedef enum row_op { OP_EMBED, OP_NORM, OP_ADD_NORMED, OP_GEGLU } row_op;

typedef struct row_job {
    g3_backend *b;
    const g3_batch *bt;
    row_op op;
    const float *src;
    float *dst;
    const float *w;
    int n_rows, width;
} row_job;

static void row_task(void *arg, int ith, int nth) {
    const row_job *j = arg;
    const g3_config *c = &j->b->m->cfg;
    long begin, end;
    g3_split_range(j->n_rows, 1, ith, nth, &begin, &end);
    for (long r = begin; r < end; r++) {
        size_t off = (size_t)r * (size_t)j->width;
        switch (j->op) {
        case OP_EMBED: {
            const g3_weight *E = &j->b->m->embed;
            const uint8_t *row = (const uint8_t *)E->data + (size_t)j->bt->token[r] * g3_row_bytes(E->type, E->k);
            g3_dequant_row(E->type, row, j->dst + off, E->k);
            for (int i = 0; i < j->width; i++) j->dst[off + i] *= c->embed_scale;
            break;
        }
        case OP_NORM: g3_rmsnorm(j->dst + off, j->src + off, j->w, j->width, c->rms_eps); break;
        case OP_ADD_NORMED: g3_add_rmsnorm(j->dst + off, (float *)j->src + off, j->w, j->width, c->rms_eps); break;
        case OP_GEGLU: g3_geglu(j->dst + off, j->src + off, j->width); break;
        }
    }
}

static void rows(g3_backend *b, const g3_batch *bt, row_op op, const float *src, float *dst, const float *w, int n,
                 int width) {
    row_job j = {b, bt, op, src, dst, w, n, width};
    g3_pool_run(b->pool, row_task, &j);
}

static g3_status cpu_forward(g3_backend *b, const g3_batch *bt, float *logits, g3_error *err) {
    G3_TRY(g3_batch_check(&b->m->cfg, &b->cfg, bt, err));
    const g3_model *m = b->m;
    const g3_config *c = &m->cfg;
    int n = bt->n_rows, H = c->hidden, F = c->ffn;
    prepared p = {0};
    rows(b, bt, OP_EMBED, NULL, b->h, NULL, n, H);
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *L = &m->layers[l];
        const cpu_weights *W = &b->lw[l];
        int kind = c->layer_global[l] ? 0 : 1;
        rows(b, bt, OP_NORM, b->h, b->x, L->attn_norm, n, H);
        mm(b, &p, b->x, n, &W->w[W_Q], b->q);
        mm(b, &p, b->x, n, &W->w[W_K], b->k);
        mm(b, &p, b->x, n, &W->w[W_V], b->v);
        qkv_job qj = {b, bt, l, kind, b->layer_index[l]};
        g3_pool_run(b->pool, qkv_task, &qj);
        attn_job aj = {b, bt, l, kind, b->layer_index[l]};
        g3_pool_run(b->pool, attn_task, &aj);
        mm(b, &p, b->att, n, &W->w[W_O], b->tmp);
        rows(b, bt, OP_ADD_NORMED, b->tmp, b->h, L->post_attn_norm, n, H); /* h += rms(tmp)*(1+w) */
        rows(b, bt, OP_NORM, b->h, b->x, L->pre_ffn_norm, n, H);
        mm(b, &p, b->x, n, &W->w[W_GATE], b->gate);
        mm(b, &p, b->x, n, &W->w[W_UP], b->up);
        rows(b, bt, OP_GEGLU, b->up, b->gate, NULL, n, F); /* gate = gelu(gate) * up */
        mm(b, &p, b->gate, n, &W->w[W_DOWN], b->tmp);
        rows(b, bt, OP_ADD_NORMED, b->tmp, b->h, L->post_ffn_norm, n, H);
    }
    if (bt->n_out == 0) return G3_OK;
    for (int i = 0; i < bt->n_out; i++)
        memcpy(b->tmp + (size_t)i * H, b->h + (size_t)bt->out_rows[i] * H, sizeof(float) * H);
    rows(b, bt, OP_NORM, b->tmp, b->xo, m->final_norm, bt->n_out, H);
    p.valid = 0;
    mm(b, &p, b->xo, bt->n_out, &b->head, logits);
    if (c->final_softcap > 0) {
        size_t total = (size_t)bt->n_out * (size_t)c->vocab;
        float cap = c->final_softcap;
        for (size_t i = 0; i < total; i++) logits[i] = cap * tanhf(logits[i] / cap);
    }
    return G3_OK;
}

static g3_status cpu_copy_block(g3_backend *b, int kind, int src, int dst, g3_error *err) {
    int nb = kind ? b->cfg.n_blocks_local : b->cfg.n_blocks_global;
    if (kind < 0 || kind > 1 || src < 0 || dst < 0 || src >= nb || dst >= nb)
        return g3_fail(err, G3_ERR_ARG, "copy_block: block %d -> %d out of range", src, dst);
    memcpy(b->kv[kind] + (size_t)dst * b->block_floats[kind], b->kv[kind] + (size_t)src * b->block_floats[kind],
           sizeof(float) * b->block_floats[kind]);
    return G3_OK;
}

/* The overlapped decode's protocol (backend.h), run synchronously: the forward and its greedy pick happen at submit,
 * collect hands the ids back in order. Nothing to overlap on the CPU (and each token would reach the client a step
 * later), so it is off unless asked for (g3_engine_opts.overlap = 1): it lets the tests drive the engine's overlapped
 * steps on any machine. */
static g3_status cpu_forward_submit(g3_backend *b, const g3_batch *bt, const g3_dev_sampling *smp,
                                    const int32_t *feed, g3_error *err) {
    const int V = b->m->cfg.vocab, R = b->cfg.max_rows;
    if (smp) return g3_fail(err, G3_ERR_ARG, "cpu backend: no sampling chain of its own (greedy picks only)");
    if (b->sub_cnt >= 2) return g3_fail(err, G3_ERR_ARG, "cpu backend: two steps submitted and not collected");
    if (bt->n_out < 1 || bt->n_rows < 1 || bt->n_rows > R)
        return g3_fail(err, G3_ERR_ARG, "cpu backend: a submitted step of %d rows picks %d tokens", bt->n_rows,
                       bt->n_out);
    for (int r = 0; feed && r < bt->n_rows; r++)
        if (feed[r] >= b->sub_last)
            return g3_fail(err, G3_ERR_ARG, "cpu backend: row %d fed from pick %d of a step of %d", r, feed[r],
                           b->sub_last);
    if (!b->sub_tok) {
        b->sub_tok = malloc(sizeof(int32_t) * (size_t)R);
        b->sub_ids[0] = malloc(sizeof(int32_t) * (size_t)R), b->sub_ids[1] = malloc(sizeof(int32_t) * (size_t)R);
        if (!b->sub_tok || !b->sub_ids[0] || !b->sub_ids[1]) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    if (bt->n_out > b->sub_cap) {
        float *l = realloc(b->sub_logits, sizeof(float) * (size_t)bt->n_out * (size_t)V);
        if (!l) return g3_fail(err, G3_ERR_NOMEM, "out of memory for %d rows of logits", bt->n_out);
        b->sub_logits = l, b->sub_cap = bt->n_out;
    }
    g3_batch fb = *bt;
    const int k = (b->sub_k + b->sub_cnt) & 1;
    if (feed) { /* the previous step's ids (buffer k ^ 1 when it is still uncollected, else the one collected last) */
        for (int r = 0; r < bt->n_rows; r++) b->sub_tok[r] = feed[r] >= 0 ? b->sub_ids[k ^ 1][feed[r]] : bt->token[r];
        fb.token = b->sub_tok;
    }
    G3_TRY(cpu_forward(b, &fb, b->sub_logits, err));
    for (int i = 0; i < bt->n_out; i++) {
        float mx;
        b->sub_ids[k][i] = g3_smp_argmax(b->sub_logits + (size_t)i * V, V, &mx);
    }
    b->sub_n[k] = bt->n_out, b->sub_last = bt->n_out;
    b->sub_cnt++;
    return G3_OK;
}

static g3_status cpu_forward_collect(g3_backend *b, int32_t *tokens, g3_error *err) {
    if (b->sub_cnt < 1) return g3_fail(err, G3_ERR_ARG, "cpu backend: no submitted step to collect");
    const int k = b->sub_k;
    memcpy(tokens, b->sub_ids[k], sizeof(int32_t) * (size_t)b->sub_n[k]);
    b->sub_k ^= 1, b->sub_cnt--;
    return G3_OK;
}

const g3_backend_ops g3_backend_cpu = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward = cpu_forward,
    .copy_block = cpu_copy_block,
    .block_bytes = cpu_block_bytes,
    .forward_submit = cpu_forward_submit,
    .forward_collect = cpu_forward_collect,
    .overlap_default = 0, /* run at submit, a step's tokens would only come a step later: for the tests */
};
