/* Recording of the forward into command buffers, once, at create. Every dispatch takes its addresses and sizes
 * from push constants fixed at record time and the per-step values (rows, positions, block tables) from the
 * parameter block, so the same command buffers are re-submitted every step. Rows beyond n_rows exit early.
 *
 * Body, per layer (rows R of the bucket; dispatch grids in brackets):
 *   embed+norm [R]  ->  QKV projection  ->  QK-norm+rope+KV write [NH+KVH, R]  ->  attention [chunks, NH/GH, R]
 *   (+ combine [NH, R] for split decode)  ->  Wo  ->  post-norm + residual + pre-FFN norm [R]
 *   ->  gate/up + GeGLU  ->  down  ->  post-norm + residual + next norm [R]
 * In buckets of up to 8 rows, with $G3_VULKAN_FUSE=1 (opt-in), the two post-norm dispatches are folded into the Wo and
 * down products (their last workgroup runs the norm tail, shaders/tail_norm.glsl) and the combine into attention
 * (the last chunk of each row and head merges): 6 dispatches per layer instead of 9 for decode (with fused QKV and
 * gate/up; b->body_dispatches counts them per bucket).
 * Head: gather the wanted rows [lch] -> logits = x E^T (softcap) into host-visible memory; or, for greedy steps,
 * into device memory followed by an argmax per row [vocab slabs, lch], so that only token ids travel.
 * g3_vulkan_profile (vk_profile.c) records the same body and head again into its own command buffers with a
 * timestamp around every dispatch (rec.prof), each dispatch labelled by the step it belongs to (rec.what). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_backend.h"
#include "model/dtype.h"

typedef struct rec {
    g3_backend *b;
    VkCommandBuffer cb;
    g3_error *err;
    g3_status rc;
    int dispatches; /* recorded so far */
    g3vk_prof *prof; /* profiled recording (timestamps around dispatches), else NULL */
    const char *what; /* label of the dispatches that follow, for the profile */
    int unfenced;     /* dispatches recorded since the last barrier */
    uint64_t sc_x;    /* x of the last cooperative-matrix product, whose guard exponents vk.cm_exp holds ... */
    uint32_t sc_ld, sc_k;
    int sc_at;        /* ... valid while r->dispatches still equals this (nothing recorded since that product) */
} rec;

static void bind(rec *r, int kind, uint32_t type) {
    VkPipeline p;
    if (r->rc) return;
    r->rc = g3vk_pipeline(&r->b->vk, kind, type, &p, r->err);
    if (r->rc == G3_OK) r->b->vk.vkCmdBindPipeline(r->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
}

static void push_dispatch(rec *r, const void *pc, size_t size, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (r->rc) return;
    g3vk *vk = &r->b->vk;
    vk->vkCmdPushConstants(r->cb, vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)size, pc);
    if (r->prof) g3vk_prof_before(vk, r->prof, r->cb, r->what);
    vk->vkCmdDispatch(r->cb, gx, gy, gz);
    if (r->prof) g3vk_prof_after(vk, r->prof, r->cb);
    r->dispatches++;
    r->unfenced++;
}

/* Between dispatches of one command buffer: shader writes before shader reads and writes, compute stage only (the
 * transfers, uploads and block copies, happen in other submissions, ordered by the full barrier of begin()). */
static void barrier(rec *r) {
    if (r->rc) return;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
    r->b->vk.vkCmdPipelineBarrier(r->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0,
                                  1, &mb, 0, NULL, 0, NULL);
    r->unfenced = 0;
}

static uint32_t cdiv(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

uint32_t g3vk_attn_chunks(uint32_t ctx, uint32_t D) {
    uint32_t n = cdiv(ctx, g3vk_attn_tile(D)), cap = 64;
    const char *e = getenv("G3_VULKAN_ATTN_SPLIT");
    if (e && atoi(e) >= 1 && atoi(e) <= 64) cap = (uint32_t)atoi(e);
    return n < cap ? n : cap;
}

/* The post-norm tail folded into a decode product (mode 2): h += rms(y) * w1, then x = rms(h) * w2. */
typedef struct tail {
    uint64_t w1, w2;
} tail;

/* Whether this bucket's Wo/down products carry the post-norm tail (matvec kernels; vec4 rows). */
static int tail_fused(const g3_backend *b, int rows) {
    return b->vk.fuse && rows <= G3VK_MV_ROWS && b->m->cfg.hidden % 4 == 0;
}

/* Profile label of the activation quantization before a product labelled `what`. */
static const char *q8_label(const char *what) {
    static const char *const known[][2] = {{"qkv", "qkv.q8"}, {"q", "q.q8"}, {"k", "k.q8"}, {"v", "v.q8"},
                                           {"wo", "wo.q8"}, {"wo+norm", "wo.q8"}, {"gate_up", "gate_up.q8"},
                                           {"gate", "gate.q8"}, {"up", "up.q8"}, {"down", "down.q8"},
                                           {"down+norm", "down.q8"}, {"logits", "logits.q8"}};
    for (size_t i = 0; what && i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(what, known[i][0])) return known[i][1];
    return "q8";
}

/* The int8 products (matvecq): x [ldx] (one row) quantized into b->a_q8 by q8act.comp (a dispatch and a barrier of
 * its own; a barrier before it too when dispatches since the last one may still read a_q8: the separate q, k, v
 * or gate, up products). */
static void q8act(rec *r, uint32_t type, uint32_t K, uint64_t x, uint32_t ldx, int nrows_idx) {
    g3_backend *b = r->b;
    if (r->unfenced) barrier(r);
    const char *what = r->what;
    r->what = q8_label(what);
    bind(r, G3VK_K_Q8ACT, 0);
    pc_q8act pq = {.x = x, .xq = b->a_q8, .params = b->params.addr, .K = K, .ldx = ldx,
                   .nrows_idx = (uint32_t)nrows_idx, .il = type == G3_DTYPE_Q4_0};
    push_dispatch(r, &pq, sizeof pq, cdiv(K / 8, 64), 1, 1);
    barrier(r);
    r->what = what;
}

/* The overflow guard of the cooperative-matrix products: the exponents of x's rows into vk.cm_exp (cm_scale.comp,
 * one workgroup per row; a barrier before it when earlier dispatches may still read them, one after it), unless
 * they are there already: the q, k, v or gate, up products of one input, recorded one after the other. */
static void cm_scale(rec *r, int rows, uint64_t x, uint32_t ldx, uint32_t K, int nrows_idx) {
    g3_backend *b = r->b;
    if (r->sc_x == x && r->sc_ld == ldx && r->sc_k == K && r->sc_at == r->dispatches) return;
    if (r->unfenced) barrier(r);
    const char *what = r->what;
    r->what = "cm_scale";
    bind(r, G3VK_K_CM_SCALE, 0);
    pc_cm_scale ps = {.x = x, .e = b->vk.cm_exp.addr, .params = b->params.addr, .K = K, .ldx = ldx,
                      .nrows_idx = (uint32_t)nrows_idx};
    push_dispatch(r, &ps, sizeof ps, (uint32_t)rows, 1, 1);
    barrier(r);
    r->what = what;
    r->sc_x = x, r->sc_ld = ldx, r->sc_k = K;
}

/* y[row][ldy] = x W^T (+ GeGLU with W2, or followed by the norm tail tl): matvec for small buckets (for one row of
 * Q8_0/Q4_0 weights where the device has int8 dot products: q8act + matvecq), tiled matmul otherwise. */
static void matmul_t(rec *r, int rows, const g3vk_weight *w, const g3vk_weight *w2, uint64_t x, uint32_t ldx,
                     uint64_t y, uint32_t ldy, int nrows_idx, int softcap, const tail *tl) {
    g3_backend *b = r->b;
    int small = rows <= G3VK_MV_ROWS;
    int kind = g3vk_matmul_kind(&b->vk, rows, w->type, w->k, w2 != NULL);
    if (g3vk_kind_q8(kind)) {
        q8act(r, w->type, (uint32_t)w->k, x, ldx, nrows_idx);
        x = b->a_q8;
    }
    int cm = kind == G3VK_K_MATMUL_CM || kind == G3VK_K_MATMUL_CM_GEGLU;
    if (cm) cm_scale(r, rows, x, ldx, (uint32_t)w->k, nrows_idx);
    bind(r, kind, w->type);
    pc_matmul pc = {.w = w->addr, .waux = w->aux, .w2 = w2 ? w2->addr : 0, .w2aux = w2 ? w2->aux : 0, .x = x,
                    .y = y, .params = b->params.addr, .N = (uint32_t)w->n, .K = (uint32_t)w->k, .ldx = ldx,
                    .ldy = ldy, .nrows_idx = (uint32_t)nrows_idx, .mode = softcap ? 1u : 0u,
                    .cap = b->m->cfg.final_softcap, .sc = b->vk.cm_exp.addr};
    if (tl) { /* only with tail_fused(): one matvec, ldy = N = H */
        pc.mode = 2, pc.cap = b->m->cfg.rms_eps, pc.w2 = tl->w1, pc.w2aux = tl->w2;
        pc.h = b->a_h, pc.xo = b->a_x, pc.cnt = b->cnt.addr;
    }
    if (small) {
        uint32_t groups = cdiv((uint64_t)w->n, (uint64_t)g3vk_matvec_outputs(&b->vk, kind));
        uint32_t gx = groups < 32768 ? groups : 32768;
        push_dispatch(r, &pc, sizeof pc, gx, cdiv(groups, gx), 1);
    } else {
        push_dispatch(r, &pc, sizeof pc, cdiv((uint64_t)w->n, w2 ? 32 : 64), cdiv((uint64_t)rows, 64), 1);
        if (cm) r->sc_at = r->dispatches;
    }
}

static void matmul(rec *r, int rows, const g3vk_weight *w, const g3vk_weight *w2, uint64_t x, uint32_t ldx,
                   uint64_t y, uint32_t ldy, int nrows_idx, int softcap) {
    matmul_t(r, rows, w, w2, x, ldx, y, ldy, nrows_idx, softcap, NULL);
}

static void add_norm(rec *r, int rows, uint64_t w1, uint64_t w2) {
    g3_backend *b = r->b;
    bind(r, G3VK_K_ADD_NORM, 0);
    pc_add_norm pc = {.t = b->a_t, .h = b->a_h, .x = b->a_x, .w1 = w1, .w2 = w2, .params = b->params.addr,
                      .H = (uint32_t)b->m->cfg.hidden, .eps = b->m->cfg.rms_eps};
    push_dispatch(r, &pc, sizeof pc, (uint32_t)rows, 1, 1);
}

static void layer(rec *r, int rows, int l) {
    g3_backend *b = r->b;
    const g3_config *c = &b->m->cfg;
    const vk_layer *L = &b->layers[l];
    uint32_t H = (uint32_t)c->hidden, F = (uint32_t)c->ffn, D = (uint32_t)c->head_dim;
    uint32_t NH = (uint32_t)c->n_heads, KVH = (uint32_t)c->n_kv_heads, Q = NH * D, KV = KVH * D;
    uint32_t LD = Q + 2 * KV;
    /* QKV projection */
    if (L->fused_qkv) {
        r->what = "qkv";
        matmul(r, rows, &L->qkv, NULL, b->a_x, H, b->a_qkv, LD, G3VK_P_NROWS, 0);
    } else {
        r->what = "q";
        matmul(r, rows, &L->q, NULL, b->a_x, H, b->a_qkv, LD, G3VK_P_NROWS, 0);
        r->what = "k";
        matmul(r, rows, &L->k, NULL, b->a_x, H, b->a_qkv + 4ull * Q, LD, G3VK_P_NROWS, 0);
        r->what = "v";
        matmul(r, rows, &L->v, NULL, b->a_x, H, b->a_qkv + 4ull * (Q + KV), LD, G3VK_P_NROWS, 0);
    }
    barrier(r);
    /* QK-norm, rope, K/V into the cache */
    r->what = "qk_rope";
    bind(r, b->kv16 ? G3VK_K_QK_ROPE_KV16 : G3VK_K_QK_ROPE, 0);
    pc_qk_rope pq = {.qkv = b->a_qkv, .kv = b->kv[L->kind].addr, .params = b->params.addr, .qn = L->n_q, .kn = L->n_k,
                     .invf = b->inv_freq[L->kind], .ld = LD, .NH = NH, .KVH = KVH, .D = D,
                     .B = (uint32_t)b->cfg.kv_block, .li = (uint32_t)L->li,
                     .block_floats = (uint32_t)b->block_floats[L->kind], .table = (uint32_t)L->kind,
                     .eps = c->rms_eps};
    push_dispatch(r, &pq, sizeof pq, NH + KVH, (uint32_t)rows, 1);
    barrier(r);
    /* attention: GQA head groups, tiles of chunk_len keys; decode buckets split each row's span into up to n_chunks
     * chunks (sized per step by the shader) merged by attn_combine (or inside attn with fusion) */
    int split = rows <= G3VK_MV_ROWS;
    r->what = "attn";
    bind(r, b->kv16 ? G3VK_K_ATTN_KV16 : G3VK_K_ATTN, 0);
    pc_attn pa = {.q = b->a_qkv, .kv = b->kv[L->kind].addr, .out = b->a_att, .part = b->a_part,
                  .params = b->params.addr, .ld = LD, .NH = NH, .KVH = KVH, .D = D, .B = (uint32_t)b->cfg.kv_block,
                  .li = (uint32_t)L->li, .block_floats = (uint32_t)b->block_floats[L->kind],
                  .table = (uint32_t)L->kind, .window = L->kind ? (uint32_t)c->sliding_window : 0u,
                  .chunk_len = (uint32_t)b->chunk_len, .n_chunks = split ? (uint32_t)b->n_chunks : 1u,
                  .mode = split ? (b->vk.fuse ? 2u : 1u) : 0u, .out_ld = Q,
                  .scale = 1.0f / sqrtf(c->query_pre_attn_scalar), .cap = c->attn_softcap,
                  .cnt = b->cnt.addr + 4 * G3VK_CNT_ATTN};
    push_dispatch(r, &pa, sizeof pa, pa.n_chunks, NH / g3vk_attn_heads(NH, KVH), (uint32_t)rows);
    barrier(r);
    if (split && pa.mode == 1) { /* merge not fused into attn */
        r->what = "attn_combine";
        bind(r, G3VK_K_ATTN_COMBINE, 0);
        pc_attn_combine pcmb = {.out = b->a_att, .part = b->a_part, .params = b->params.addr, .NH = NH, .D = D,
                                .window = pa.window, .chunk_len = pa.chunk_len, .n_chunks = pa.n_chunks, .out_ld = Q};
        push_dispatch(r, &pcmb, sizeof pcmb, NH, (uint32_t)rows, 1);
        barrier(r);
    }
    /* output projection, post-attention norm + residual, pre-FFN norm */
    int fuse = tail_fused(b, rows);
    tail t_attn = {L->n_post_attn, L->n_pre_ffn};
    uint64_t next = l + 1 < c->n_layers ? b->layers[l + 1].n_in : b->n_final;
    tail t_ffn = {L->n_post_ffn, next};
    r->what = fuse ? "wo+norm" : "wo";
    matmul_t(r, rows, &L->wo, NULL, b->a_att, Q, b->a_t, H, G3VK_P_NROWS, 0, fuse ? &t_attn : NULL);
    barrier(r);
    if (!fuse) {
        r->what = "add_norm_attn";
        add_norm(r, rows, L->n_post_attn, L->n_pre_ffn);
        barrier(r);
    }
    /* MLP */
    if (L->fused_geglu) {
        r->what = "gate_up";
        matmul(r, rows, &L->gate, &L->up, b->a_x, H, b->a_gate, F, G3VK_P_NROWS, 0);
    } else {
        r->what = "gate";
        matmul(r, rows, &L->gate, NULL, b->a_x, H, b->a_gate, F, G3VK_P_NROWS, 0);
        r->what = "up";
        matmul(r, rows, &L->up, NULL, b->a_x, H, b->a_up, F, G3VK_P_NROWS, 0);
        barrier(r);
        r->what = "geglu";
        bind(r, G3VK_K_GEGLU, 0);
        pc_geglu pg = {.gate = b->a_gate, .up = b->a_up, .params = b->params.addr, .F = F};
        push_dispatch(r, &pg, sizeof pg, cdiv(F, 256), (uint32_t)rows, 1);
    }
    barrier(r);
    /* down projection, post-FFN norm + residual, then the next layer's input norm (or the final norm) */
    r->what = fuse ? "down+norm" : "down";
    matmul_t(r, rows, &L->down, NULL, b->a_gate, F, b->a_t, H, G3VK_P_NROWS, 0, fuse ? &t_ffn : NULL);
    barrier(r);
    if (!fuse) {
        r->what = "add_norm_ffn";
        add_norm(r, rows, L->n_post_ffn, next);
        barrier(r);
    }
}

static g3_status begin(rec *r, VkCommandBuffer cb) {
    r->cb = cb;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    G3_TRY(g3vk_check(r->b->vk.vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer", r->err));
    g3vk_barrier(&r->b->vk, cb); /* earlier submissions' writes (uploads, block copies, the previous step) first */
    if (r->prof) g3vk_prof_start(&r->b->vk, r->prof, cb);
    return G3_OK;
}

static g3_status end(rec *r) {
    if (r->rc) return r->rc;
    /* shader writes -> host reads (logits) */
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    r->b->vk.vkCmdPipelineBarrier(r->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb,
                                  0, NULL, 0, NULL);
    return g3vk_check(r->b->vk.vkEndCommandBuffer(r->cb), "vkEndCommandBuffer", r->err);
}

g3_status g3vk_record_body(g3_backend *b, VkCommandBuffer cb, int bucket, g3vk_prof *prof, g3_error *err) {
    int rows = b->bucket_rows[bucket];
    rec r = {.b = b, .err = err, .prof = prof, .what = "embed"};
    G3_TRY(begin(&r, cb));
    const g3_config *c = &b->m->cfg;
    bind(&r, G3VK_K_EMBED, b->embed.type);
    pc_embed pe = {.e = b->embed.addr, .eaux = b->embed.aux, .h = b->a_h, .x = b->a_x, .w = b->layers[0].n_in,
                   .params = b->params.addr, .H = (uint32_t)c->hidden, .scale = c->embed_scale, .eps = c->rms_eps};
    push_dispatch(&r, &pe, sizeof pe, (uint32_t)rows, 1, 1);
    barrier(&r);
    for (int l = 0; l < c->n_layers; l++) layer(&r, rows, l);
    if (!prof) b->body_dispatches[bucket] = r.dispatches;
    return end(&r);
}

g3_status g3vk_record_head(g3_backend *b, VkCommandBuffer cb, int rows, int argmax, g3vk_prof *prof, g3_error *err) {
    rec r = {.b = b, .err = err, .prof = prof, .what = "gather"};
    G3_TRY(begin(&r, cb));
    const g3_config *c = &b->m->cfg;
    bind(&r, G3VK_K_GATHER, 0);
    pc_gather pg = {.x = b->a_x, .xo = b->a_xo, .params = b->params.addr, .H = (uint32_t)c->hidden};
    push_dispatch(&r, &pg, sizeof pg, (uint32_t)rows, 1, 1);
    barrier(&r);
    r.what = "logits";
    matmul(&r, rows, &b->embed, NULL, b->a_xo, (uint32_t)c->hidden, argmax ? b->logits_dev.addr : b->logits.addr,
           (uint32_t)c->vocab, G3VK_P_NOUT, c->final_softcap > 0);
    if (argmax) {
        barrier(&r);
        r.what = "argmax";
        bind(&r, G3VK_K_ARGMAX, 0);
        pc_argmax pm = {.logits = b->logits_dev.addr, .ids = b->ids.addr, .params = b->params.addr,
                        .V = (uint32_t)c->vocab, .nb = g3vk_argmax_groups((uint32_t)c->vocab), .part = b->a_amx,
                        .cnt = b->cnt.addr + 4 * G3VK_CNT_ARGMAX(c->n_heads)};
        push_dispatch(&r, &pm, sizeof pm, pm.nb, (uint32_t)rows, 1);
    }
    return end(&r);
}

g3_status g3vk_record_all(g3_backend *b, g3_error *err) {
    g3vk *vk = &b->vk;
    if (vk->coopmat && !vk->cm_exp.buf) /* guard exponents of the largest product: max_rows body rows, lch head rows */
        G3_TRY(g3vk_buf_create(vk, 4ull * (uint64_t)(b->cfg.max_rows > b->lch ? b->cfg.max_rows : b->lch),
                               G3VK_MEM_DEVICE, "cooperative-matrix guard exponents", &vk->cm_exp, err));
    uint32_t n = (uint32_t)b->n_buckets + 6;
    VkCommandBuffer cbs[G3VK_MAX_BUCKETS + 6];
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = n};
    G3_TRY(g3vk_check(vk->vkAllocateCommandBuffers(vk->dev, &cai, cbs), "vkAllocateCommandBuffers", err));
    for (int i = 0; i < b->n_buckets; i++) b->body[i] = cbs[i];
    b->head[0] = cbs[b->n_buckets], b->head[1] = cbs[b->n_buckets + 1];
    b->head_argmax[0] = cbs[b->n_buckets + 2], b->head_argmax[1] = cbs[b->n_buckets + 3];
    b->head[2] = cbs[b->n_buckets + 4], b->head_argmax[2] = cbs[b->n_buckets + 5];
    for (int i = 0; i < b->n_buckets; i++) G3_TRY(g3vk_record_body(b, b->body[i], i, NULL, err));
    int small = b->lch < G3VK_MV_ROWS ? b->lch : G3VK_MV_ROWS;
    for (int am = 0; am < 2; am++) {
        G3_TRY(g3vk_record_head(b, am ? b->head_argmax[0] : b->head[0], small, am, NULL, err));
        G3_TRY(g3vk_record_head(b, am ? b->head_argmax[1] : b->head[1], b->lch, am, NULL, err));
        G3_TRY(g3vk_record_head(b, am ? b->head_argmax[2] : b->head[2], 1, am, NULL, err));
    }
    return G3_OK;
}
