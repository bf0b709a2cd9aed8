/* The engine: requests, the scheduler (continuous batching with chunked prefill) and the KV block bookkeeping,
 * driving one backend. Each step batches one decode row of every running sequence with as many pending prompt
 * rows as fit in max_rows, runs one forward, and samples the rows that end a prompt or decode a token.
 * Admission reserves the KV blocks a request can need (prompt + max_tokens, windows for sliding layers), so a
 * running sequence never runs out of blocks; requests that do not fit wait in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/status.h"
#include "engine/kv_cache.h"
#include "sample/sampler.h"

typedef enum req_state { REQ_WAITING, REQ_RUNNING, REQ_DONE } req_state;

typedef struct req {
    g3_request_id id;
    req_state state;
    int32_t *tokens;      /* prompt then generated tokens, capacity cap */
    int cap;
    int n_prompt, n_tokens;
    int n_computed;       /* tokens whose K/V are in the cache */
    int max_tokens, ignore_eos;
    int slot;
    int reserve[2];       /* KV blocks reserved per kind */
    int cancelled;
    g3_sampler *sampler;
    int n_logprobs;
    void *user;
    struct req *next;
} req;

struct g3_engine {
    g3_model *model;
    const g3_backend_ops *ops;
    g3_backend *be;
    g3_engine_opts opts;
    g3_kv kv;
    int ctx;
    int reserved[2];
    req **slots;          /* [max_seqs] running request per slot */
    req *queue_head, *queue_tail; /* waiting, in order */
    g3_request_id next_id;
    /* per-step buffers, [max_rows] */
    int32_t *b_token, *b_pos, *b_seq, *b_out;
    req **b_out_req;
    float *logits;        /* [max_seqs][vocab] */
    g3_token_logprob top[64];
    g3_engine_stats stats;
};

void g3_engine_opts_default(g3_engine_opts *o) {
    memset(o, 0, sizeof *o);
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* Sliding-layer blocks a sequence can hold at once: the window plus one prefill chunk, on block boundaries. */
static int local_blocks_per_seq(const g3_engine *e) {
    int n = ceil_div(e->model->cfg.sliding_window + e->opts.prefill_chunk, e->opts.kv_block) + 2;
    int full = ceil_div(e->ctx, e->opts.kv_block);
    return n < full ? n : full;
}

g3_status g3_engine_create(g3_model *m, const g3_engine_opts *opts, g3_engine **out, g3_error *err) {
    *out = NULL;
    g3_engine *e = calloc(1, sizeof *e);
    if (!e) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    e->model = m;
    if (opts) e->opts = *opts;
    g3_engine_opts *o = &e->opts;
    const g3_config *c = &m->cfg;
    if (o->ctx_size <= 0) o->ctx_size = c->max_ctx < 4096 ? c->max_ctx : 4096;
    if (o->ctx_size > c->max_ctx) o->ctx_size = c->max_ctx;
    if (o->max_seqs <= 0) o->max_seqs = 1;
    if (o->kv_block <= 0) o->kv_block = 16;
    if (o->prefill_chunk <= 0) o->prefill_chunk = 512;
    e->ctx = o->ctx_size;
    int bps = ceil_div(e->ctx, o->kv_block);
    int has[2] = {g3_layers_of_kind(c, 0) > 0, g3_layers_of_kind(c, 1) > 0};
    int n_global = o->n_kv_blocks > 0 ? o->n_kv_blocks : o->max_seqs * bps;
    int n_local = o->n_kv_blocks > 0 ? o->n_kv_blocks : o->max_seqs * local_blocks_per_seq(e);
    if (!has[0]) n_global = 0;
    if (!has[1]) n_local = 0;
    g3_status rc = g3_kv_init(&e->kv, o->kv_block, o->max_seqs, bps, n_global, n_local, c->sliding_window, has[0],
                              has[1], err);
    if (rc) {
        free(e);
        return rc;
    }
    int max_rows = o->prefill_chunk + o->max_seqs;
    e->slots = calloc((size_t)o->max_seqs, sizeof *e->slots);
    e->b_token = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_pos = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_seq = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_out = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_out_req = malloc(sizeof(req *) * (size_t)max_rows);
    e->logits = malloc(sizeof(float) * (size_t)o->max_seqs * (size_t)c->vocab);
    if (!e->slots || !e->b_token || !e->b_pos || !e->b_seq || !e->b_out || !e->b_out_req || !e->logits) {
        g3_engine_free(e);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory for engine buffers");
    }
    g3_backend_cfg bc = {.n_threads = o->n_threads, .max_seqs = o->max_seqs, .max_rows = max_rows,
                         .kv_block = o->kv_block, .max_blocks_per_seq = bps, .n_blocks_global = n_global,
                         .n_blocks_local = n_local};
    e->ops = g3_backend_find(o->backend);
    if (!e->ops) {
        g3_engine_free(e);
        return g3_fail(err, G3_ERR_ARG, "unknown or unavailable backend \"%s\" (this build has: %s)", o->backend,
                       g3_backend_find(NULL)->name);
    }
    rc = e->ops->create(m, &bc, &e->be, err);
    if (rc == G3_ERR_DEVICE && (!o->backend || !strcmp(o->backend, "auto"))) { /* no GPU: fall back to the CPU */
        e->ops = &g3_backend_cpu;
        rc = e->ops->create(m, &bc, &e->be, err);
    }
    if (rc) {
        g3_engine_free(e);
        return rc;
    }
    e->stats.kv_blocks_total = n_global + n_local;
    e->next_id = 1;
    *out = e;
    return G3_OK;
}

static void req_free(req *r) {
    if (!r) return;
    g3_sampler_free(r->sampler);
    free(r->tokens);
    free(r);
}

void g3_engine_free(g3_engine *e) {
    if (!e) return;
    if (e->be) e->ops->destroy(e->be);
    for (int s = 0; e->slots && s < e->opts.max_seqs; s++) req_free(e->slots[s]);
    for (req *r = e->queue_head; r;) {
        req *n = r->next;
        req_free(r);
        r = n;
    }
    g3_kv_deinit(&e->kv);
    free(e->slots), free(e->b_token), free(e->b_pos), free(e->b_seq), free(e->b_out), free(e->b_out_req);
    free(e->logits);
    free(e);
}

const char *g3_engine_backend_name(const g3_engine *e) { return e->ops->name; }

/* ---- requests ------------------------------------------------------------------------------------------------- */

static void compute_reserve(const g3_engine *e, int total_tokens, int reserve[2]) {
    int full = ceil_div(total_tokens, e->opts.kv_block);
    int local = local_blocks_per_seq(e);
    reserve[0] = e->kv.has_kind[0] ? full : 0;
    reserve[1] = e->kv.has_kind[1] ? (full < local ? full : local) : 0;
}

g3_status g3_engine_submit(g3_engine *e, const g3_request *r, g3_request_id *id, g3_error *err) {
    const g3_config *c = &e->model->cfg;
    if (!r->prompt || r->n_prompt <= 0) return g3_fail(err, G3_ERR_ARG, "the prompt is empty");
    if (r->n_prompt >= e->ctx)
        return g3_fail(err, G3_ERR_ARG, "the prompt has %d tokens; the context holds %d (at least one must be left "
                       "to generate)", r->n_prompt, e->ctx);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab)
            return g3_fail(err, G3_ERR_ARG, "prompt token %d (at %d) is outside the vocabulary 0..%d", r->prompt[i], i,
                           c->vocab - 1);
    req *q = calloc(1, sizeof *q);
    if (!q) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    int max_tokens = r->max_tokens > 0 ? r->max_tokens : e->ctx - r->n_prompt;
    if (max_tokens > e->ctx - r->n_prompt) max_tokens = e->ctx - r->n_prompt;
    q->cap = r->n_prompt + max_tokens;
    q->tokens = malloc(sizeof(int32_t) * (size_t)q->cap);
    q->sampler = g3_sampler_create(&r->sampling, c->vocab, err);
    if (!q->tokens || !q->sampler) {
        req_free(q);
        return err && err->code ? err->code : g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    memcpy(q->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    q->n_prompt = q->n_tokens = r->n_prompt;
    q->max_tokens = max_tokens;
    q->ignore_eos = r->ignore_eos;
    q->n_logprobs = r->sampling.n_logprobs < 0 ? 0 : (r->sampling.n_logprobs > 64 ? 64 : r->sampling.n_logprobs);
    q->user = r->user;
    q->slot = -1;
    compute_reserve(e, q->cap, q->reserve);
    if (q->reserve[0] > e->kv.n_blocks[0] || q->reserve[1] > e->kv.n_blocks[1]) {
        req_free(q);
        return g3_fail(err, G3_ERR_ARG, "the request needs more KV blocks than the whole pool holds");
    }
    q->id = e->next_id++;
    q->state = REQ_WAITING;
    if (e->queue_tail) e->queue_tail->next = q;
    else e->queue_head = q;
    e->queue_tail = q;
    e->stats.n_waiting++;
    if (id) *id = q->id;
    return G3_OK;
}

void g3_engine_cancel(g3_engine *e, g3_request_id id) {
    for (int s = 0; s < e->opts.max_seqs; s++)
        if (e->slots[s] && e->slots[s]->id == id) e->slots[s]->cancelled = 1;
    for (req *r = e->queue_head; r; r = r->next)
        if (r->id == id) r->cancelled = 1;
}

static void emit_finish(g3_engine *e, req *r, g3_finish f, g3_event_fn fn, void *ctx) {
    g3_event ev = {.id = r->id, .user = r->user, .finish = f, .n_prompt = r->n_prompt,
                   .n_generated = r->n_tokens - r->n_prompt};
    if (fn) fn(&ev, ctx);
    (void)e;
}

static void retire(g3_engine *e, req *r) {
    if (r->slot >= 0) {
        g3_kv_release(&e->kv, r->slot);
        e->slots[r->slot] = NULL;
        e->reserved[0] -= r->reserve[0];
        e->reserved[1] -= r->reserve[1];
        e->stats.n_running--;
    }
    req_free(r);
}

/* Moves waiting requests into free slots while their reservation fits; cancelled ones finish here. */
static void admit(g3_engine *e, g3_event_fn fn, void *ctx) {
    while (e->queue_head) {
        req *r = e->queue_head;
        if (r->cancelled) {
            e->queue_head = r->next;
            if (!e->queue_head) e->queue_tail = NULL;
            e->stats.n_waiting--;
            emit_finish(e, r, G3_FINISH_CANCELLED, fn, ctx);
            req_free(r);
            continue;
        }
        int slot = -1;
        for (int s = 0; s < e->opts.max_seqs && slot < 0; s++)
            if (!e->slots[s]) slot = s;
        if (slot < 0) break;
        if (e->reserved[0] + r->reserve[0] > e->kv.n_blocks[0] || e->reserved[1] + r->reserve[1] > e->kv.n_blocks[1])
            break;
        e->queue_head = r->next;
        if (!e->queue_head) e->queue_tail = NULL;
        r->next = NULL;
        r->slot = slot;
        r->state = REQ_RUNNING;
        e->slots[slot] = r;
        e->reserved[0] += r->reserve[0];
        e->reserved[1] += r->reserve[1];
        e->stats.n_waiting--;
        e->stats.n_running++;
        e->stats.prompt_tokens += r->n_prompt;
    }
}

static int is_stop_token(const g3_config *c, int32_t t) { return t == 1 || t == c->eos_id || t == c->eot_id; }

g3_status g3_engine_step(g3_engine *e, g3_event_fn fn, void *ctx, int *n_active, g3_error *err) {
    const g3_config *c = &e->model->cfg;
    /* cancelled running requests go first: their blocks are free for this very step */
    for (int s = 0; s < e->opts.max_seqs; s++) {
        req *r = e->slots[s];
        if (r && r->cancelled) {
            emit_finish(e, r, G3_FINISH_CANCELLED, fn, ctx);
            retire(e, r);
        }
    }
    admit(e, fn, ctx);
    int max_rows = e->opts.prefill_chunk + e->opts.max_seqs;
    int n = 0, n_out = 0;
    /* decode rows: every sequence whose prompt is done feeds its last token */
    for (int s = 0; s < e->opts.max_seqs; s++) {
        req *r = e->slots[s];
        if (!r || r->n_computed < r->n_prompt) continue;
        int pos = r->n_tokens - 1;
        G3_TRY(g3_kv_map(&e->kv, s, pos, pos, err));
        e->b_token[n] = r->tokens[pos], e->b_pos[n] = pos, e->b_seq[n] = s;
        e->b_out[n_out] = n, e->b_out_req[n_out++] = r;
        n++;
    }
    /* prefill rows: pending prompt tokens, in slot order, up to the chunk budget */
    int budget = e->opts.prefill_chunk;
    for (int s = 0; s < e->opts.max_seqs && budget > 0 && n < max_rows; s++) {
        req *r = e->slots[s];
        if (!r || r->n_computed >= r->n_prompt) continue;
        int take = r->n_prompt - r->n_computed;
        if (take > budget) take = budget;
        if (take > max_rows - n) take = max_rows - n;
        G3_TRY(g3_kv_map(&e->kv, s, r->n_computed, r->n_computed + take - 1, err));
        for (int i = 0; i < take; i++) {
            int pos = r->n_computed + i;
            e->b_token[n] = r->tokens[pos], e->b_pos[n] = pos, e->b_seq[n] = s;
            n++;
        }
        r->n_computed += take;
        budget -= take;
        if (r->n_computed == r->n_prompt) e->b_out[n_out] = n - 1, e->b_out_req[n_out++] = r;
    }
    if (n > 0) {
        /* out rows must be increasing: decode rows come first, prefill ends after them, so they are. */
        g3_batch b = {.n_rows = n, .token = e->b_token, .pos = e->b_pos, .seq = e->b_seq, .n_out = n_out,
                      .out_rows = e->b_out, .bt_global = e->kv.table[0], .bt_local = e->kv.table[1]};
        G3_TRY(e->ops->forward(e->be, &b, e->logits, err));
        for (int i = 0; i < n_out; i++) {
            req *r = e->b_out_req[i];
            float *lg = e->logits + (size_t)i * (size_t)c->vocab;
            float lp = 0;
            int n_top = 0;
            int32_t tok = g3_sampler_sample(r->sampler, lg, &lp, e->top, &n_top);
            g3_sampler_accept(r->sampler, tok);
            r->tokens[r->n_tokens++] = tok;
            r->n_computed = r->n_tokens - 1; /* the new token's K/V come with the next step */
            e->stats.generated_tokens++;
            g3_finish f = G3_FINISH_NONE;
            if (!r->ignore_eos && is_stop_token(c, tok)) f = G3_FINISH_STOP;
            else if (r->n_tokens - r->n_prompt >= r->max_tokens || r->n_tokens >= e->ctx) f = G3_FINISH_LENGTH;
            g3_event ev = {.id = r->id, .user = r->user, .token = tok, .has_token = 1, .logprob = lp,
                           .top = e->top, .n_top = r->n_logprobs ? n_top : 0, .finish = f,
                           .n_prompt = r->n_prompt, .n_generated = r->n_tokens - r->n_prompt};
            if (fn) fn(&ev, ctx);
            if (f != G3_FINISH_NONE) retire(e, r);
            else g3_kv_trim_window(&e->kv, r->slot, r->n_tokens - 1);
        }
        /* sequences still in prefill can give back sliding blocks behind their window */
        for (int s = 0; s < e->opts.max_seqs; s++)
            if (e->slots[s] && e->slots[s]->n_computed < e->slots[s]->n_prompt)
                g3_kv_trim_window(&e->kv, s, e->slots[s]->n_computed);
    }
    if (n_active) *n_active = e->stats.n_running + e->stats.n_waiting;
    return G3_OK;
}

g3_status g3_engine_logits(g3_engine *e, const int32_t *prompt, int n_prompt, int all_positions, float *out,
                           g3_error *err) {
    const g3_config *c = &e->model->cfg;
    if (n_prompt <= 0) return g3_fail(err, G3_ERR_ARG, "the prompt is empty");
    if (n_prompt > e->ctx) return g3_fail(err, G3_ERR_ARG, "the prompt has %d tokens; the context holds %d", n_prompt,
                                          e->ctx);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab)
            return g3_fail(err, G3_ERR_ARG, "prompt token %d (at %d) is outside the vocabulary 0..%d", prompt[i], i,
                           c->vocab - 1);
    int slot = -1;
    for (int s = 0; s < e->opts.max_seqs && slot < 0; s++)
        if (!e->slots[s]) slot = s;
    if (slot < 0) return g3_fail(err, G3_ERR_FULL, "no free sequence slot");
    int reserve[2];
    compute_reserve(e, n_prompt, reserve);
    if (e->reserved[0] + reserve[0] > e->kv.n_blocks[0] || e->reserved[1] + reserve[1] > e->kv.n_blocks[1])
        return g3_fail(err, G3_ERR_FULL, "not enough free KV blocks");
    g3_status rc = G3_OK;
    int chunk = e->opts.prefill_chunk;
    for (int done = 0; done < n_prompt && rc == G3_OK;) {
        int take = n_prompt - done < chunk ? n_prompt - done : chunk;
        rc = g3_kv_map(&e->kv, slot, done, done + take - 1, err);
        if (rc) break;
        for (int i = 0; i < take; i++) {
            e->b_token[i] = prompt[done + i], e->b_pos[i] = done + i, e->b_seq[i] = slot;
            e->b_out[i] = i;
        }
        int last = done + take == n_prompt;
        g3_batch b = {.n_rows = take, .token = e->b_token, .pos = e->b_pos, .seq = e->b_seq,
                      .bt_global = e->kv.table[0], .bt_local = e->kv.table[1]};
        if (all_positions) {
            b.n_out = take, b.out_rows = e->b_out;
            rc = e->ops->forward(e->be, &b, out + (size_t)done * (size_t)c->vocab, err);
        } else {
            b.n_out = last ? 1 : 0, b.out_rows = e->b_out + take - 1;
            e->b_out[take - 1] = take - 1;
            rc = e->ops->forward(e->be, &b, out, err);
        }
        done += take;
        g3_kv_trim_window(&e->kv, slot, done);
    }
    g3_kv_release(&e->kv, slot);
    return rc;
}

void g3_engine_get_stats(const g3_engine *e, g3_engine_stats *s) {
    *s = e->stats;
    s->kv_blocks_used = g3_kv_used(&e->kv, 0) + g3_kv_used(&e->kv, 1);
}
