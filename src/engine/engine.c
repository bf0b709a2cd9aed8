/* The engine: requests, the scheduler (continuous batching with chunked prefill), the KV block bookkeeping and
 * the prefix cache, driving one backend. Each step batches one decode row of every running sequence with as many
 * pending prompt rows as fit, runs one forward, and samples the rows that end a prompt or decode a token.
 * Blocks are mapped as positions are reached. Waiting requests are admitted in order while a free slot and the
 * blocks of their first chunk exist (evicting prefix-cache entries if needed). If a running sequence cannot get a
 * block, cache entries go first, then the most recently admitted other sequence is preempted: its blocks are freed
 * and it goes back to the queue to recompute its tokens later (its generated tokens are kept, nothing is re-sent).
 * With the overlapped decode (g3_engine_opts.overlap, backends with forward_submit) a step is submitted and its tokens
 * taken by the next call, after that call has submitted the step after it (g3_engine_step; docs/ARCHITECTURE.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/status.h"
#include "engine/kv_cache.h"
#include "engine/prefix_cache.h"
#include "sample/sampler.h"

typedef enum req_state { REQ_WAITING, REQ_RUNNING, REQ_DONE } req_state;

typedef struct req {
    g3_request_id id;
    req_state state;
    int32_t *tokens;      /* prompt then generated tokens, capacity cap */
    int cap;
    int n_prompt, n_tokens;
    int n_computed;       /* tokens whose K/V are in the cache; rows feed tokens[n_computed..n_tokens) */
    int max_tokens, ignore_eos;
    int slot;
    uint64_t admitted;    /* admission order (preemption takes the newest) */
    int cancelled;
    int n_cached;         /* prompt tokens served from the prefix cache */
    int in_batch;         /* has rows in the step being built (never preempted then) */
    int pure_greedy;      /* argmax of the raw logits: the backend may pick on the device */
    int fly_row;          /* its out row in the submitted step in flight (-1: none; the overlapped decode) */
    int pickable;         /* its tokens can be picked by a submitted step: greedy, or the device's sampling chain with
                           * a next draw that does not read the tokens before it (no penalties, no logprobs) */
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
    g3_prefix_cache pc;
    int ctx;
    int keep_prompt;      /* sliding blocks of a prompt's first keep_prompt tokens stay until it finishes */
    uint64_t admit_clock;
    req **slots;          /* [max_seqs] running request per slot */
    req *queue_head, *queue_tail; /* waiting, in order */
    g3_request_id next_id;
    /* per-step buffers, [max_rows] */
    int32_t *b_token, *b_pos, *b_seq, *b_out;
    req **b_out_req;
    float *logits;        /* [max_seqs][vocab] */
    int32_t *picked;      /* [max_rows] tokens picked by the backend (forward_argmax, forward_sample) */
    g3_dev_sample *dev_row; /* [max_seqs] sampling rows for forward_sample (NULL: the backend has none) */
    g3_dev_adjust *dev_adj; /* [max_seqs * G3_DEV_ADJ_PER_ROW] their logit adjustments */
    int host_sampling;    /* $G3_HOST_SAMPLING=1 at create: never forward_sample (for comparisons) */
    /* the overlapped decode (backend.h's forward_submit / forward_collect; opts.overlap, $G3_OVERLAP): a
     * decode step submitted and not collected, and the one chained after it */
    int overlap;
    int fly_n;            /* out rows of the step in flight (>= 1); 0: none */
    req **fly_req;        /* [max_seqs] their requests (NULL: finished since, the row's pick is dropped) */
    req **nx_req;         /* [max_seqs] the out rows of the step chained after it */
    int32_t *b_feed;      /* [max_rows] per row of the step being built: the out row of the step in flight whose pick
                           * is its token, or -1 */
    int *cache_refs[2];   /* [n_blocks] scratch for the stats: references held by the prefix cache */
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

static g3_status warm_prefill(g3_engine *e, g3_error *err);

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
    e->keep_prompt = o->prefix_cache < 0 ? 0 : (e->ctx < 1024 ? e->ctx : 1024);
    int n_local = o->n_kv_blocks > 0 ? o->n_kv_blocks
                                     : o->max_seqs * (local_blocks_per_seq(e) + ceil_div(e->keep_prompt, o->kv_block));
    if (!has[0]) n_global = 0;
    if (!has[1]) n_local = 0;
    g3_status rc = g3_kv_init(&e->kv, o->kv_block, o->max_seqs, bps, n_global, n_local, c->sliding_window, has[0],
                              has[1], err);
    if (rc) {
        free(e);
        return rc;
    }
    if (!g3_pc_init(&e->pc, o->prefix_cache < 0 ? 0 : 4 * o->max_seqs + 4)) {
        g3_kv_deinit(&e->kv);
        free(e);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    int max_rows = o->prefill_chunk + o->max_seqs;
    e->slots = calloc((size_t)o->max_seqs, sizeof *e->slots);
    e->b_token = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_pos = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_seq = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_out = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->b_out_req = malloc(sizeof(req *) * (size_t)max_rows);
    e->b_feed = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->logits = malloc(sizeof(float) * (size_t)o->max_seqs * (size_t)c->vocab);
    e->picked = malloc(sizeof(int32_t) * (size_t)max_rows);
    e->cache_refs[0] = calloc((size_t)(n_global > 0 ? n_global : 1), sizeof(int));
    e->cache_refs[1] = calloc((size_t)(n_local > 0 ? n_local : 1), sizeof(int));
    if (!e->picked || !e->cache_refs[0] || !e->cache_refs[1] || !e->slots || !e->b_token || !e->b_pos || !e->b_seq || !e->b_out || !e->b_out_req || !e->b_feed || !e->logits) {
        g3_engine_free(e);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory for engine buffers");
    }
    g3_backend_cfg bc = {.n_threads = o->n_threads, .max_seqs = o->max_seqs, .max_rows = max_rows,
                         .kv_block = o->kv_block, .max_blocks_per_seq = bps, .n_blocks_global = n_global,
                         .n_blocks_local = n_local, .device = o->device};
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
    if (e->ops->forward_sample) {
        e->dev_row = malloc(sizeof *e->dev_row * (size_t)o->max_seqs);
        e->dev_adj = malloc(sizeof *e->dev_adj * (size_t)o->max_seqs * G3_DEV_ADJ_PER_ROW);
        if (!e->dev_row || !e->dev_adj) {
            g3_engine_free(e);
            return g3_fail(err, G3_ERR_NOMEM, "out of memory for engine buffers");
        }
    }
    if (e->ops->prepare && !o->lazy_setup &&
        ((rc = e->ops->prepare(e->be, o->max_seqs, err)) != G3_OK || (rc = warm_prefill(e, err)) != G3_OK)) {
        g3_engine_free(e);
        return rc;
    }
    const char *hs = getenv("G3_HOST_SAMPLING");
    e->host_sampling = hs && !strcmp(hs, "1");
    const char *ov = getenv("G3_OVERLAP");
    const int want = ov && *ov ? atoi(ov) : o->overlap; /* 1 on, -1 / 0 from the variable off, 0 the backend's */
    e->overlap = e->ops->forward_submit && e->ops->forward_collect &&
                 (want > 0 || (want == 0 && !(ov && *ov) && e->ops->overlap_default));
    if (e->overlap) {
        e->fly_req = calloc((size_t)o->max_seqs, sizeof *e->fly_req);
        e->nx_req = calloc((size_t)o->max_seqs, sizeof *e->nx_req);
        if (!e->fly_req || !e->nx_req) {
            g3_engine_free(e);
            return g3_fail(err, G3_ERR_NOMEM, "out of memory for engine buffers");
        }
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
    g3_pc_deinit(&e->pc, &e->kv);
    g3_kv_deinit(&e->kv);
    free(e->slots), free(e->b_token), free(e->b_pos), free(e->b_seq), free(e->b_out), free(e->b_out_req);
    free(e->logits);
    free(e->picked);
    free(e->dev_row), free(e->dev_adj);
    free(e->fly_req), free(e->nx_req), free(e->b_feed);
    free(e->cache_refs[0]), free(e->cache_refs[1]);
    free(e);
}

const char *g3_engine_backend_name(const g3_engine *e) { return e->ops->name; }

int g3_engine_ctx_size(const g3_engine *e) { return e->ctx; }

/* ---- requests ------------------------------------------------------------------------------------------------- */

/* Most blocks of each kind one sequence of `total` tokens holds at once. */
static void blocks_needed(const g3_engine *e, int total, int need[2]) {
    int full = ceil_div(total, e->opts.kv_block);
    int local = local_blocks_per_seq(e) + ceil_div(e->keep_prompt, e->opts.kv_block);
    need[0] = e->kv.has_kind[0] ? full : 0;
    need[1] = e->kv.has_kind[1] ? (full < local ? full : local) : 0;
}

/* Whether a request's next token can be drawn by the backend's sampling chain (backend.h's forward_sample). */
static int dev_sampleable(const g3_engine *e, const g3_sampler *s) {
    if (!e->dev_row || e->host_sampling) return 0;
    int n = g3_sampler_device_entries(s);
    return n >= 0 && n <= G3_DEV_ADJ_PER_ROW;
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
    int max_tokens = r->max_tokens > 0 ? r->max_tokens : e->ctx - r->n_prompt;
    if (max_tokens > e->ctx - r->n_prompt) max_tokens = e->ctx - r->n_prompt;
    int need[2];
    blocks_needed(e, r->n_prompt + max_tokens, need);
    if (need[0] > e->kv.n_blocks[0] || need[1] > e->kv.n_blocks[1])
        return g3_fail(err, G3_ERR_ARG, "the request needs %d+%d KV blocks; the whole pool has %d+%d", need[0], need[1],
                       e->kv.n_blocks[0], e->kv.n_blocks[1]);
    req *q = calloc(1, sizeof *q);
    if (!q) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    q->cap = r->n_prompt + max_tokens;
    q->tokens = malloc(sizeof(int32_t) * (size_t)q->cap);
    q->sampler = g3_sampler_create(&r->sampling, c->vocab, err);
    if (!q->tokens || !q->sampler) {
        int had_msg = q->tokens && !q->sampler;
        req_free(q);
        return had_msg && err ? err->code : g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    memcpy(q->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    q->n_prompt = q->n_tokens = r->n_prompt;
    q->max_tokens = max_tokens;
    q->ignore_eos = r->ignore_eos;
    q->n_logprobs = r->sampling.n_logprobs < 0 ? 0 : (r->sampling.n_logprobs > 64 ? 64 : r->sampling.n_logprobs);
    q->user = r->user;
    q->slot = -1;
    q->fly_row = -1;
    const g3_sampling *sp = &r->sampling;
    q->pure_greedy = sp->temperature <= 0 && sp->n_logit_bias == 0 && sp->repetition_penalty == 1.0f &&
                     sp->presence_penalty == 0 && sp->frequency_penalty == 0 && sp->n_logprobs == 0;
    /* history-free samplers need the same adjustment entries (their biases) at every token: fixed for the request */
    q->pickable = q->pure_greedy || (g3_sampler_history_free(q->sampler) && dev_sampleable(e, q->sampler));
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

static void emit_finish(req *r, g3_finish f, g3_event_fn fn, void *ctx) {
    g3_event ev = {.id = r->id, .user = r->user, .finish = f, .n_prompt = r->n_prompt,
                   .n_generated = r->n_tokens - r->n_prompt, .n_cached = r->n_cached};
    if (fn) fn(&ev, ctx);
}

/* Frees a slot; with keep, its computed prefix goes to the prefix cache first. */
static void vacate(g3_engine *e, req *r, int keep) {
    if (r->slot < 0) return;
    if (keep) g3_pc_insert(&e->pc, &e->kv, r->slot, r->tokens, r->n_computed);
    g3_kv_release(&e->kv, r->slot);
    e->slots[r->slot] = NULL;
    r->slot = -1;
    e->stats.n_running--;
}

static void retire(g3_engine *e, req *r, int keep) {
    vacate(e, r, keep);
    req_free(r);
}

static void queue_push_front(g3_engine *e, req *r) {
    r->next = e->queue_head;
    e->queue_head = r;
    if (!e->queue_tail) e->queue_tail = r;
    e->stats.n_waiting++;
}

/* Sends a running request back to the front of the queue: it recomputes its tokens when readmitted. */
static void requeue(g3_engine *e, req *r) {
    vacate(e, r, 1); /* its computed blocks go to the cache: the readmission may reuse them */
    r->n_computed = 0;
    r->state = REQ_WAITING;
    queue_push_front(e, r);
    e->stats.n_preempted++;
}

/* Preempts the most recently admitted running request that has no rows in this step, other than `keep`. */
static int preempt_one(g3_engine *e, const req *keep) {
    req *victim = NULL;
    for (int s = 0; s < e->opts.max_seqs; s++) {
        req *r = e->slots[s];
        if (r && r != keep && !r->in_batch && (!victim || r->admitted > victim->admitted)) victim = r;
    }
    if (!victim) return 0;
    requeue(e, victim);
    return 1;
}

/* Maps positions [from, to] of r, making room by evicting cache entries and then (preempt) preempting others. */
static g3_status map_or_make_room(g3_engine *e, req *r, int from, int to, int preempt, g3_error *err) {
    for (;;) {
        int miss[2];
        g3_kv_missing(&e->kv, r->slot, from, to, miss);
        if (miss[0] <= e->kv.n_free[0] && miss[1] <= e->kv.n_free[1]) return g3_kv_map(&e->kv, r->slot, from, to, err);
        if (g3_pc_evict_one(&e->pc, &e->kv, NULL)) continue;
        if (!preempt || !preempt_one(e, r))
            return g3_fail(err, G3_ERR_FULL, "the KV pool (%d+%d blocks) cannot hold one sequence of %d tokens",
                           e->kv.n_blocks[0], e->kv.n_blocks[1], to + 1);
    }
}

/* Moves waiting requests into free slots while the blocks of their first chunk exist. */
static void admit(g3_engine *e, g3_event_fn fn, void *ctx) {
    while (e->queue_head) {
        req *r = e->queue_head;
        if (r->cancelled) {
            e->queue_head = r->next;
            if (!e->queue_head) e->queue_tail = NULL;
            e->stats.n_waiting--;
            emit_finish(r, G3_FINISH_CANCELLED, fn, ctx);
            req_free(r);
            continue;
        }
        int slot = -1;
        for (int s = 0; s < e->opts.max_seqs && slot < 0; s++)
            if (!e->slots[s]) slot = s;
        if (slot < 0) break;
        int entry = -1, reuse = g3_pc_lookup(&e->pc, &e->kv, r->tokens, r->n_tokens, &entry);
        /* the blocks of the first chunk, plus one for each running sequence's next decode position */
        int end = r->n_tokens - 1 < reuse + e->opts.prefill_chunk - 1 ? r->n_tokens - 1 : reuse + e->opts.prefill_chunk - 1;
        int need[2] = {ceil_div(end + 1, e->opts.kv_block) - reuse / e->opts.kv_block, 0};
        need[1] = need[0] < local_blocks_per_seq(e) ? need[0] : local_blocks_per_seq(e);
        for (int k = 0; k < 2; k++) need[k] = e->kv.has_kind[k] ? need[k] + e->stats.n_running : 0;
        /* evict other entries first; the one we reuse goes last */
        while ((need[0] > e->kv.n_free[0] || need[1] > e->kv.n_free[1]) && g3_pc_evict_one(&e->pc, &e->kv, &entry)) {
        }
        if (need[0] > e->kv.n_free[0] || need[1] > e->kv.n_free[1]) {
            if (e->stats.n_running > 0) break; /* wait for blocks to come back */
            if (entry >= 0) { /* nothing runs: drop the reuse too and start fresh */
                g3_pc_evict_one(&e->pc, &e->kv, NULL);
                continue;
            }
        }
        e->queue_head = r->next;
        if (!e->queue_head) e->queue_tail = NULL;
        r->next = NULL;
        r->slot = slot;
        r->state = REQ_RUNNING;
        r->admitted = ++e->admit_clock;
        e->slots[slot] = r;
        if (reuse > 0 && entry >= 0) {
            g3_pc_adopt(&e->pc, &e->kv, entry, slot, reuse);
            r->n_computed = reuse;
            if (r->n_cached == 0 && reuse <= r->n_prompt) {
                r->n_cached = reuse;
                e->stats.cached_prompt_tokens += reuse;
            }
        }
        e->stats.n_waiting--;
        e->stats.n_running++;
        if (r->n_tokens == r->n_prompt) e->stats.prompt_tokens += r->n_prompt;
    }
}

static int is_stop_token(const g3_config *c, int32_t t) { return t == 1 || t == c->eos_id || t == c->eot_id; }

/* Whether this step's out rows can all be sampled on the device (backend.h's forward_sample). */
static int device_sampling(const g3_engine *e, int n_out) {
    if (!e->dev_row || e->host_sampling) return 0;
    for (int i = 0; i < n_out; i++)
        if (!dev_sampleable(e, e->b_out_req[i]->sampler)) return 0;
    return 1;
}

/* The device rows (settings, uniform, adjustments) of this step's n_out out rows, one token each (draws their
 * uniforms). */
static g3_dev_sampling dev_rows(g3_engine *e, int n_out) {
    int n_adj = 0;
    for (int i = 0; i < n_out; i++) {
        int k = g3_sampler_device_row(e->b_out_req[i]->sampler, &e->dev_row[i], e->dev_adj + n_adj);
        e->dev_row[i].adj0 = n_adj, n_adj += k;
    }
    return (g3_dev_sampling){.row = e->dev_row, .adj = e->dev_adj, .n_adj = n_adj};
}

/* The picks of the out rows of requests reqs[0..n) (NULL: a row whose request finished before its pick came back;
 * cancelled ones are dropped too): each token appended and sent as an event, finished requests retired. drop[0..nd):
 * the out rows of a step already submitted after this one, set to NULL where their request is retired here.
 * on_device: the ids are in e->picked; else sampled on the host from e->logits. */
static void take_tokens(g3_engine *e, req **reqs, int n, int on_device, g3_event_fn fn, void *ctx, req **drop, int nd) {
    const g3_config *c = &e->model->cfg;
    for (int i = 0; i < n; i++) {
        req *r = reqs[i];
        if (!r || r->cancelled) continue;
        float *lg = e->logits + (size_t)i * (size_t)c->vocab;
        float lp = 0;
        int n_top = 0;
        int32_t tok = on_device ? e->picked[i] : g3_sampler_sample(r->sampler, lg, &lp, e->top, &n_top);
        g3_sampler_accept(r->sampler, tok);
        r->n_computed = r->n_tokens; /* every fed token now has its K/V */
        r->tokens[r->n_tokens++] = tok;
        e->stats.generated_tokens++;
        g3_finish f = G3_FINISH_NONE;
        if (!r->ignore_eos && is_stop_token(c, tok)) f = G3_FINISH_STOP;
        else if (r->n_tokens - r->n_prompt >= r->max_tokens || r->n_tokens >= e->ctx) f = G3_FINISH_LENGTH;
        g3_event ev = {.id = r->id, .user = r->user, .token = tok, .has_token = 1, .logprob = lp,
                       .top = e->top, .n_top = r->n_logprobs ? n_top : 0, .finish = f,
                       .n_prompt = r->n_prompt, .n_generated = r->n_tokens - r->n_prompt,
                       .n_cached = r->n_cached};
        if (fn) fn(&ev, ctx);
        if (f != G3_FINISH_NONE) {
            for (int j = 0; j < nd; j++)
                if (drop[j] == r) drop[j] = NULL;
            retire(e, r, 1);
        }
    }
    /* sliding layers give back what no later query sees (a prompt's first keep_prompt tokens excepted) */
    for (int s = 0; s < e->opts.max_seqs; s++) {
        req *r = e->slots[s];
        if (r) g3_kv_trim_window(&e->kv, s, r->n_computed, r->n_prompt < e->keep_prompt ? r->n_prompt : e->keep_prompt);
    }
}

/* How a submitted step of out rows reqs[0..n) picks its tokens: 1 greedy (every row), 2 the device's sampling chain,
 * 0 it cannot be submitted (a row sampled on the host). */
static int submit_mode(req *const *reqs, int n) {
    int greedy = 1;
    for (int i = 0; i < n; i++) {
        if (!reqs[i]->pickable) return 0;
        greedy = greedy && reqs[i]->pure_greedy;
    }
    return greedy ? 1 : 2;
}

/* Submits the batch in e->b_* (n rows, n_out out rows of requests e->b_out_req) as an overlapped step: mode as
 * submit_mode; fed: rows with e->b_feed[r] >= 0 take the pick of that out row of the step in flight. */
static g3_status submit_step(g3_engine *e, int n, int n_out, int mode, int fed, g3_error *err) {
    g3_batch b = {.n_rows = n, .token = e->b_token, .pos = e->b_pos, .seq = e->b_seq, .n_out = n_out,
                  .out_rows = e->b_out, .bt_global = e->kv.table[0], .bt_local = e->kv.table[1]};
    g3_dev_sampling ds = {0};
    if (mode == 2) ds = dev_rows(e, n_out);
    return e->ops->forward_submit(e->be, &b, mode == 2 ? &ds : NULL, fed ? e->b_feed : NULL, err);
}

/* Whether the next step can be built and submitted while the one in flight runs: no running request cancelled (its
 * retirement waits for the picks), and every request that can have an out row in it, running or waiting, pickable
 * on the device (so the step will be submitted, not run with its fed tokens unknown to the host). */
static int chain_ok(const g3_engine *e) {
    for (int s = 0; s < e->opts.max_seqs; s++) {
        const req *r = e->slots[s];
        if (r && (r->cancelled || !r->pickable)) return 0;
    }
    for (const req *r = e->queue_head; r; r = r->next)
        if (!r->cancelled && !r->pickable) return 0;
    return 1;
}

/* Collects the step in flight and takes its tokens (drop: take_tokens'). */
static g3_status collect_step(g3_engine *e, g3_event_fn fn, void *ctx, req **drop, int nd, g3_error *err) {
    const int n = e->fly_n;
    e->fly_n = 0;
    for (int i = 0; i < n; i++)
        if (e->fly_req[i]) e->fly_req[i]->fly_row = -1;
    G3_TRY(e->ops->forward_collect(e->be, e->picked, err));
    take_tokens(e, e->fly_req, n, 1, fn, ctx, drop, nd);
    return G3_OK;
}

/* One step. Synchronous: run the batch, take its tokens. Overlapped (e->overlap, every out row pickable on the
 * device): the batch is submitted and its tokens are taken by the next call, which, if chain_ok, first builds and
 * submits the step after it (the running sequences' rows then at the position of the pick in flight, their tokens fed
 * on the device; rows whose sequence finishes by length with that pick, or whose position would need a preemption,
 * wait for a later step), then collects. */
g3_status g3_engine_step(g3_engine *e, g3_event_fn fn, void *ctx, int *n_active, g3_error *err) {
    const int chained = e->fly_n > 0 && chain_ok(e);
    if (e->fly_n && !chained) G3_TRY(collect_step(e, fn, ctx, NULL, 0, err));
    /* cancelled running requests go first: their blocks are free for this very step (none when chained) */
    for (int s = 0; s < e->opts.max_seqs; s++) {
        req *r = e->slots[s];
        if (r && r->cancelled) {
            emit_finish(r, G3_FINISH_CANCELLED, fn, ctx);
            retire(e, r, 0);
        }
    }
    admit(e, fn, ctx);
    int max_rows = e->opts.prefill_chunk + e->opts.max_seqs;
    int n = 0, n_out = 0;
    /* decode rows: every sequence with exactly one pending token (its last sampled one); chained, the sequences of the
     * step in flight at the position of its pick */
    for (int s = 0; s < e->opts.max_seqs; s++) {
        req *r = e->slots[s];
        const int fed = chained && r && r->fly_row >= 0;
        if (!r || (!fed && r->n_tokens - r->n_computed != 1)) continue;
        int pos = fed ? r->n_tokens : r->n_tokens - 1;
        if (fed && (pos + 1 - r->n_prompt >= r->max_tokens || pos + 1 >= e->ctx)) continue; /* ends with the pick */
        /* chained: no preemption with a step in flight; a row without a block sits this step out */
        g3_status rc = map_or_make_room(e, r, pos, pos, !chained, err);
        if (rc == G3_ERR_FULL && (chained || e->stats.n_running > 1)) { /* the others hold the pool: this one waits */
            if (!chained) requeue(e, r);
            continue;
        }
        if (rc) return rc;
        r->in_batch = 1;
    }
    for (int s = 0; s < e->opts.max_seqs; s++) {
        req *r = e->slots[s];
        if (!r || !r->in_batch) continue;
        const int fed = chained && r->fly_row >= 0;
        int pos = fed ? r->n_tokens : r->n_tokens - 1;
        /* fed: a placeholder token (any valid id); the device writes the pick over it */
        e->b_token[n] = r->tokens[r->n_tokens - 1], e->b_pos[n] = pos, e->b_seq[n] = s;
        e->b_feed[n] = fed ? r->fly_row : -1;
        e->b_out[n_out] = n, e->b_out_req[n_out++] = r;
        n++;
    }
    /* prefill rows: pending tokens of the other sequences, oldest admission first, up to the chunk budget */
    int budget = e->opts.prefill_chunk;
    while (budget > 0 && n < max_rows) {
        req *r = NULL;
        for (int s = 0; s < e->opts.max_seqs; s++) {
            req *q = e->slots[s];
            if (q && !q->in_batch && q->n_tokens - q->n_computed > 1 && (!r || q->admitted < r->admitted)) r = q;
        }
        if (!r) break;
        int take = r->n_tokens - r->n_computed;
        if (take > budget) take = budget;
        if (take > max_rows - n) take = max_rows - n;
        g3_status rc = map_or_make_room(e, r, r->n_computed, r->n_computed + take - 1, !chained, err);
        if (rc == G3_ERR_FULL && (chained || n > 0 || e->stats.n_running > 1)) break; /* others first; later */
        if (rc) return rc;
        r->in_batch = 1;
        for (int i = 0; i < take; i++) {
            int pos = r->n_computed + i;
            e->b_token[n] = r->tokens[pos], e->b_pos[n] = pos, e->b_seq[n] = r->slot, e->b_feed[n] = -1;
            n++;
        }
        budget -= take;
        int completes = r->n_computed + take == r->n_tokens;
        if (completes) e->b_out[n_out] = n - 1, e->b_out_req[n_out++] = r;
        r->n_computed += completes ? take - 1 : take; /* a completing chunk's last row counts when sampled */
    }
    for (int s = 0; s < e->opts.max_seqs; s++)
        if (e->slots[s]) e->slots[s]->in_batch = 0;
    const int mode = n_out > 0 && e->overlap ? submit_mode(e->b_out_req, n_out) : 0;
    if (mode) { /* submitted; its tokens are taken by the next call */
        G3_TRY(submit_step(e, n, n_out, mode, chained, err));
        req **nx = e->nx_req;
        memcpy(nx, e->b_out_req, sizeof(req *) * (size_t)n_out);
        if (chained) {
            G3_TRY(collect_step(e, fn, ctx, nx, n_out, err));
            e->stats.overlapped_steps++;
        }
        e->nx_req = e->fly_req, e->fly_req = nx, e->fly_n = n_out;
        int alive = 0;
        for (int i = 0; i < n_out; i++)
            if (nx[i]) nx[i]->fly_row = i, alive++;
        if (!alive) /* every row's sequence finished with the picks just taken: nothing stays in flight for them */
            G3_TRY(collect_step(e, fn, ctx, NULL, 0, err));
        n = 0;
    } else if (chained) { /* no out row (its rows all end with the step in flight, or wait): no fed row either */
        if (n_out > 0) /* chain_ok's promise broken: the fed rows' tokens are not on the host */
            return g3_fail(err, G3_ERR_UNSUPPORTED, "engine: a step built beside the one in flight cannot be submitted");
        G3_TRY(collect_step(e, fn, ctx, NULL, 0, err));
    }
    if (n > 0) {
        /* out rows are increasing: decode rows come first, then each prefill's last row in batch order */
        g3_batch b = {.n_rows = n, .token = e->b_token, .pos = e->b_pos, .seq = e->b_seq, .n_out = n_out,
                      .out_rows = e->b_out, .bt_global = e->kv.table[0], .bt_local = e->kv.table[1]};
        int on_device = e->ops->forward_argmax != NULL;
        for (int i = 0; i < n_out && on_device; i++) on_device = e->b_out_req[i]->pure_greedy;
        if (on_device) G3_TRY(e->ops->forward_argmax(e->be, &b, e->picked, err));
        else if (device_sampling(e, n_out)) {
            on_device = 1;
            g3_dev_sampling ds = dev_rows(e, n_out);
            G3_TRY(e->ops->forward_sample(e->be, &b, &ds, e->picked, err));
        } else
            G3_TRY(e->ops->forward(e->be, &b, e->logits, err));
        take_tokens(e, e->b_out_req, n_out, on_device, fn, ctx, NULL, 0);
    }
    if (n_active) *n_active = e->stats.n_running + e->stats.n_waiting;
    return G3_OK;
}

g3_status g3_engine_logits(g3_engine *e, const int32_t *prompt, int n_prompt, int all_positions, float *out,
                           g3_error *err) {
    const g3_config *c = &e->model->cfg;
    if (n_prompt <= 0) return g3_fail(err, G3_ERR_ARG, "the prompt is empty");
    if (n_prompt > e->ctx)
        return g3_fail(err, G3_ERR_ARG, "the prompt has %d tokens; the context holds %d", n_prompt, e->ctx);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab)
            return g3_fail(err, G3_ERR_ARG, "prompt token %d (at %d) is outside the vocabulary 0..%d", prompt[i], i,
                           c->vocab - 1);
    int slot = -1;
    for (int s = 0; s < e->opts.max_seqs && slot < 0; s++)
        if (!e->slots[s]) slot = s;
    if (slot < 0) return g3_fail(err, G3_ERR_FULL, "no free sequence slot");
    g3_status rc = G3_OK;
    int chunk = e->opts.prefill_chunk;
    for (int done = 0; done < n_prompt && rc == G3_OK;) {
        int take = n_prompt - done < chunk ? n_prompt - done : chunk;
        for (;;) { /* room: evict cache entries if needed (running requests are not preempted here) */
            int miss[2];
            g3_kv_missing(&e->kv, slot, done, done + take - 1, miss);
            if ((miss[0] <= e->kv.n_free[0] && miss[1] <= e->kv.n_free[1]) || !g3_pc_evict_one(&e->pc, &e->kv, NULL)) break;
        }
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
            rc = e->ops->forward(e->be, &b, out, err);
        }
        done += take;
        g3_kv_trim_window(&e->kv, slot, done, 0);
    }
    g3_kv_release(&e->kv, slot);
    return rc;
}

/* One prompt chunk through the forward at create, on backends that prepare (CUDA): the prefill path's kernels and
 * library set-up (cuBLAS heuristics, lazily loaded modules; the decode graphs are captured by prepare) are paid here,
 * not by the first request's time to first token (27B fp8 on an H100: a first 512-token prefill took 186 ms against
 * 121 once warm). Token 0 at positions 0..n-1 of a sequence released after; nothing is cached, no statistics change.
 * $G3_WARMUP=0: off. */
static g3_status warm_prefill(g3_engine *e, g3_error *err) {
    const char *w = getenv("G3_WARMUP");
    if (w && !strcmp(w, "0")) return G3_OK;
    int n = e->opts.prefill_chunk < e->ctx - 1 ? e->opts.prefill_chunk : e->ctx - 1;
    for (int k = 0; k < 2; k++) /* whole blocks of each pool that has any, minus one to spare */
        if (e->kv.n_blocks[k] > 0 && (e->kv.n_blocks[k] - 1) * e->opts.kv_block < n)
            n = (e->kv.n_blocks[k] - 1) * e->opts.kv_block;
    if (n < 1) return G3_OK;
    int32_t *tok = calloc((size_t)n, sizeof *tok);
    /* the logits land in the engine's own buffer, unused before the first step */
    g3_status rc = tok ? g3_engine_logits(e, tok, n, 0, e->logits, err) : g3_fail(err, G3_ERR_NOMEM, "out of memory");
    free(tok);
    return rc;
}

void g3_engine_get_stats(const g3_engine *e, g3_engine_stats *s) {
    *s = e->stats;
    /* a block is "cached" when only prefix-cache entries reference it (reclaimable), "used" when a sequence does */
    int used = g3_kv_used(&e->kv, 0) + g3_kv_used(&e->kv, 1), cached = 0;
    for (int k = 0; k < 2; k++) {
        int *cr = e->cache_refs[k];
        if (!cr) continue;
        for (int i = 0; i < e->pc.n; i++)
            for (int b = 0; b < e->pc.e[i].n_blocks; b++)
                if (e->pc.e[i].blocks[k][b] >= 0) cr[e->pc.e[i].blocks[k][b]]++;
        for (int id = 0; id < e->kv.n_blocks[k]; id++) {
            if (cr[id] && cr[id] == e->kv.refs[k][id]) cached++;
            cr[id] = 0;
        }
    }
    s->kv_blocks_used = used - cached;
    s->kv_blocks_cached = cached;
}
