/* The Vulkan backend's g3_backend_ops: create (device, weights uploaded once, KV pools, activations, parameter and
 * logits buffers, pipelines and command buffers, all fixed for the backend's life), forward (write the parameter
 * block, re-submit the recorded command buffers, copy logits out), block copies and memory planning. It mirrors
 * the CPU backend's forward (src/backend/cpu/cpu_backend.c): float32 activations, residual and KV cache. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_backend.h"
#include "backend/vulkan/vulkan_api.h"
#include "model/dtype.h"

/* KV cache element: float32, or f16 with $G3_VULKAN_KV=f16 (half the cache and the attention reads; head_dim must
 * be a multiple of 4, else float32). */
static int vk_kv_f16(const g3_model *m) {
    const char *e = getenv("G3_VULKAN_KV");
    return e && !strcmp(e, "f16") && m->cfg.head_dim % 4 == 0;
}

static size_t vk_block_bytes(const g3_model *m, const g3_backend_cfg *cfg, int kind) {
    const g3_config *c = &m->cfg;
    return (vk_kv_f16(m) ? 2 : 4) * (size_t)g3_layers_of_kind(c, kind) * 2 * (size_t)c->n_kv_heads * (size_t)cfg->kv_block *
           (size_t)c->head_dim;
}

static void vk_destroy(g3_backend *b) {
    if (!b) return;
    g3vk *vk = &b->vk;
    for (int l = 0; b->layers && l < b->m->cfg.n_layers; l++) {
        vk_layer *L = &b->layers[l];
        g3vk_weight *ws[] = {&L->qkv, &L->q, &L->k, &L->v, &L->wo, &L->gate, &L->up, &L->down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) g3vk_weight_free(vk, ws[i]);
    }
    free(b->layers);
    g3vk_weight_free(vk, &b->embed);
    g3vk_buf *bufs[] = {&b->norms, &b->kv[0],     &b->kv[1], &b->act, &b->params,
                        &b->logits, &b->logits_dev, &b->ids,   &b->cnt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g3vk_buf_free(vk, bufs[i]);
    g3vk_deinit(vk); /* frees the command pool and with it the command buffers */
    free(b);
}

const char *g3_vulkan_device_name(const g3_backend *b) { return b->device_name; }

int g3_vulkan_body_dispatches(const g3_backend *b, int rows) {
    for (int i = 0; i < b->n_buckets; i++)
        if (b->bucket_rows[i] >= rows) return b->body_dispatches[i];
    return -1;
}

/* Shapes and types the kernels handle. */
static g3_status check_model(const g3_model *m, g3_error *err) {
    const g3_config *c = &m->cfg;
    if (c->head_dim > 256 || c->head_dim % 4 || c->hidden % 32 || c->ffn % 32 || (c->n_heads * c->head_dim) % 32 ||
        c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return g3_fail(err, G3_ERR_UNSUPPORTED,
                       "vulkan: unsupported shape (head_dim %d must be <= 256 and a multiple of 4; hidden %d, ffn %d, "
                       "heads*head_dim %d multiples of 32; heads %d a multiple of kv heads %d)",
                       c->head_dim, c->hidden, c->ffn, c->n_heads * c->head_dim, c->hidden, c->n_kv_heads);
    const g3_weight *ws[7] = {&m->embed};
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *L = &m->layers[l];
        const g3_weight *lw[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            if (g3vk_type_index(g3vk_resident_type(lw[i]->type)) < 0)
                return g3_fail(err, G3_ERR_UNSUPPORTED, "vulkan: layer %d: weight type %s has no Vulkan kernels", l,
                               g3_dtype_name((g3_dtype)lw[i]->type));
    }
    if (g3vk_type_index(g3vk_resident_type(ws[0]->type)) < 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "vulkan: embedding type %s has no Vulkan kernels",
                       g3_dtype_name((g3_dtype)ws[0]->type));
    return G3_OK;
}

static g3_status upload_weights(g3_backend *b, g3vk_upload *up, g3_error *err) {
    const g3_model *m = b->m;
    const g3_config *c = &m->cfg;
    char what[96];
    const g3_weight *e = &m->embed;
    G3_TRY(g3vk_weight_upload(up, &e, 1, "the embedding", &b->embed, err));
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *W = &m->layers[l];
        vk_layer *L = &b->layers[l];
        const uint32_t tq = g3vk_resident_type(W->wq.type); /* llama.cpp's 1B Q4_K_M: Q5_0 q/k, Q8_0 v: one Q8_0 */
        L->fused_qkv = tq == g3vk_resident_type(W->wk.type) && tq == g3vk_resident_type(W->wv.type);
        snprintf(what, sizeof what, "layer %d attention weights", l);
        if (L->fused_qkv) {
            const g3_weight *parts[3] = {&W->wq, &W->wk, &W->wv};
            G3_TRY(g3vk_weight_upload(up, parts, 3, what, &L->qkv, err));
        } else {
            const g3_weight *q = &W->wq, *k = &W->wk, *v = &W->wv;
            G3_TRY(g3vk_weight_upload(up, &q, 1, what, &L->q, err));
            G3_TRY(g3vk_weight_upload(up, &k, 1, what, &L->k, err));
            G3_TRY(g3vk_weight_upload(up, &v, 1, what, &L->v, err));
        }
        const g3_weight *o = &W->wo, *g = &W->w_gate, *u = &W->w_up, *d = &W->w_down;
        G3_TRY(g3vk_weight_upload(up, &o, 1, what, &L->wo, err));
        snprintf(what, sizeof what, "layer %d MLP weights", l);
        L->fused_geglu = g3vk_resident_type(W->w_gate.type) == g3vk_resident_type(W->w_up.type);
        G3_TRY(g3vk_weight_upload(up, &g, 1, what, &L->gate, err));
        G3_TRY(g3vk_weight_upload(up, &u, 1, what, &L->up, err));
        G3_TRY(g3vk_weight_upload(up, &d, 1, what, &L->down, err));
    }
    /* norms: per layer in, q, k, post_attn, pre_ffn, post_ffn; final; rope frequencies (global, sliding) */
    size_t H = (size_t)c->hidden, D = (size_t)c->head_dim;
    size_t per_layer = 4 * H + 2 * D, total = per_layer * (size_t)c->n_layers + H + D;
    G3_TRY(g3vk_buf_create(&b->vk, total * 4, G3VK_MEM_DEVICE, "norm weights", &b->norms, err));
    size_t off = 0;
#define PUT(ptr, n, addr_out)                                                                                          \
    do {                                                                                                               \
        G3_TRY(g3vk_upload_write(up, &b->norms, off * 4, (ptr), (n) * 4, err));                                        \
        (addr_out) = b->norms.addr + off * 4;                                                                          \
        off += (n);                                                                                                    \
    } while (0)
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *W = &m->layers[l];
        vk_layer *L = &b->layers[l];
        PUT(W->attn_norm, H, L->n_in);
        PUT(W->q_norm, D, L->n_q);
        PUT(W->k_norm, D, L->n_k);
        PUT(W->post_attn_norm, H, L->n_post_attn);
        PUT(W->pre_ffn_norm, H, L->n_pre_ffn);
        PUT(W->post_ffn_norm, H, L->n_post_ffn);
    }
    PUT(m->final_norm, H, b->n_final);
    float inv[2][128];
    for (int kind = 0; kind < 2; kind++) {
        float base = kind == 0 ? c->rope_base_global : c->rope_base_local;
        float scale = kind == 0 ? c->rope_scale_global : 1.0f;
        for (size_t i = 0; i < D / 2; i++) /* exactly as the CPU backend: 1 / base^(2i/D) in float32, then / factor */
            inv[kind][i] = (1.0f / powf(base, (float)(2 * i) / (float)D)) / scale;
        PUT(inv[kind], D / 2, b->inv_freq[kind]);
    }
#undef PUT
    return G3_OK;
}

/* Fails early, with the sizes, when weights + KV cache + activations exceed the device's largest local heap. */
static g3_status check_memory(g3_backend *b, g3_error *err) {
    const g3_model *m = b->m;
    const g3_config *c = &m->cfg;
    uint64_t w = g3vk_weight_bytes(m->embed.type, m->embed.n, m->embed.k);
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *L = &m->layers[l];
        const g3_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) w += g3vk_weight_bytes(ws[i]->type, ws[i]->n, ws[i]->k);
    }
    uint64_t kv = (uint64_t)vk_block_bytes(m, &b->cfg, 0) * (uint64_t)b->cfg.n_blocks_global +
                  (uint64_t)vk_block_bytes(m, &b->cfg, 1) * (uint64_t)b->cfg.n_blocks_local;
    uint64_t act = 4ull * (uint64_t)b->cfg.max_rows *
                   (uint64_t)(4 * c->hidden + 2 * c->ffn + 2 * c->n_heads * c->head_dim + 2 * c->n_kv_heads * c->head_dim);
    uint64_t heap = 0;
    for (uint32_t i = 0; i < b->vk.memp.memoryHeapCount; i++)
        if ((b->vk.memp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && b->vk.memp.memoryHeaps[i].size > heap)
            heap = b->vk.memp.memoryHeaps[i].size;
    if (heap && w + kv + act > heap)
        return g3_fail(err, G3_ERR_NOMEM,
                       "vulkan: not enough device memory on device %d (%s): the model needs %.2f GB (weights %.2f GB, "
                       "KV cache %.2f GB, activations %.2f GB), the device has %.2f GB",
                       b->vk.index, b->device_name, (double)(w + kv + act) / 1e9, (double)w / 1e9, (double)kv / 1e9,
                       (double)act / 1e9, (double)heap / 1e9);
    return G3_OK;
}

static g3_status vk_create(const g3_model *m, const g3_backend_cfg *cfg, g3_backend **out, g3_error *err) {
    *out = NULL;
    const g3_config *c = &m->cfg;
    if (cfg->max_rows <= 0 || cfg->kv_block <= 0 || cfg->max_blocks_per_seq <= 0 || cfg->max_seqs <= 0)
        return g3_fail(err, G3_ERR_ARG, "vulkan backend: bad configuration (rows %d, block %d, blocks/seq %d, seqs %d)",
                       cfg->max_rows, cfg->kv_block, cfg->max_blocks_per_seq, cfg->max_seqs);
    G3_TRY(check_model(m, err));
    g3_backend *b = calloc(1, sizeof *b);
    if (!b) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    b->m = m;
    b->cfg = *cfg;
    b->ctx = cfg->max_blocks_per_seq * cfg->kv_block;
    g3_status rc = g3vk_init(&b->vk, cfg->device, err);
    if (rc) goto fail;
    snprintf(b->device_name, sizeof b->device_name, "%s", b->vk.props.deviceName);
    b->layers = calloc((size_t)c->n_layers, sizeof *b->layers);
    if (!b->layers) {
        rc = g3_fail(err, G3_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layers; l++) {
        int kind = c->layer_global[l] ? 0 : 1;
        b->layers[l].kind = kind;
        b->layers[l].li = b->n_layers_kind[kind]++;
    }
    if ((rc = check_memory(b, err))) goto fail;
    /* weights, uploaded once */
    g3vk_upload up;
    g3vk_upload_begin(&b->vk, &up, err);
    rc = upload_weights(b, &up, err);
    g3_status rc2 = g3vk_upload_end(&up, rc ? NULL : err);
    if (rc || (rc = rc2)) goto fail;
    /* KV pools */
    int nblocks[2] = {cfg->n_blocks_global, cfg->n_blocks_local};
    b->kv16 = vk_kv_f16(m);
    size_t kv_elem = b->kv16 ? 2 : 4;
    for (int kind = 0; kind < 2; kind++) {
        b->block_floats[kind] = vk_block_bytes(m, cfg, kind) / kv_elem;
        uint64_t bytes = (uint64_t)b->block_floats[kind] * kv_elem * (uint64_t)nblocks[kind];
        if (b->block_floats[kind] > UINT32_MAX) {
            rc = g3_fail(err, G3_ERR_UNSUPPORTED, "vulkan: KV block of %zu floats is too large", b->block_floats[kind]);
            goto fail;
        }
        if ((rc = g3vk_buf_create(&b->vk, bytes, G3VK_MEM_DEVICE, kind ? "the sliding-layer KV cache"
                                                                       : "the global-layer KV cache",
                                  &b->kv[kind], err)))
            goto fail;
    }
    /* split attention for decode buckets: up to 64 chunks of whole tiles, sized per step by the span (attn.comp) */
    b->chunk_len = (int)g3vk_attn_tile((uint32_t)c->head_dim);
    b->n_chunks = (int)g3vk_attn_chunks((uint32_t)b->ctx, (uint32_t)c->head_dim);
    /* activations */
    int R = cfg->max_rows;
    b->lch = R < 64 ? R : 64;
    int any_unfused = 0;
    for (int l = 0; l < c->n_layers; l++) any_unfused |= !b->layers[l].fused_geglu;
    size_t H = (size_t)c->hidden, F = (size_t)c->ffn, D = (size_t)c->head_dim, Q = (size_t)c->n_heads * D,
           KV = (size_t)c->n_kv_heads * D;
    size_t kmax = H > F ? H : F;
    kmax = kmax > Q ? kmax : Q;
    size_t q8_floats = (size_t)g3vk_q8_row_bytes(kmax) / 4; /* one row: matvecq serves the one-row bucket only */
    size_t sizes[] = {R * H, R * H, R * H, R * (Q + 2 * KV), R * Q, R * F, any_unfused ? R * F : 1, (size_t)b->lch * H,
                      (size_t)G3VK_MV_ROWS * (size_t)c->n_heads * (size_t)b->n_chunks * (D + 2),
                      (size_t)b->lch * G3VK_ARGMAX_MAX_GROUPS * 2, q8_floats};
    uint64_t *addrs[] = {&b->a_h,    &b->a_x,  &b->a_t,  &b->a_qkv,  &b->a_att,
                         &b->a_gate, &b->a_up, &b->a_xo, &b->a_part, &b->a_amx, &b->a_q8};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] * 4 + 255) & ~(size_t)255;
    if ((rc = g3vk_buf_create(&b->vk, total, G3VK_MEM_DEVICE, "activations", &b->act, err))) goto fail;
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *addrs[i] = b->act.addr + off;
        off += (sizes[i] * 4 + 255) & ~(size_t)255;
    }
    /* parameter block and logits */
    size_t tab = (size_t)cfg->max_seqs * (size_t)cfg->max_blocks_per_seq;
    b->off_tok = G3VK_P_HEADER, b->off_pos = b->off_tok + R, b->off_seq = b->off_pos + R, b->off_out = b->off_seq + R;
    b->off_btg = b->off_out + R, b->off_btl = b->off_btg + (int)tab;
    b->p_ints = (size_t)b->off_btl + tab;
    if ((rc = g3vk_buf_create(&b->vk, b->p_ints * 4, G3VK_MEM_UPLOAD, "step parameters", &b->params, err))) goto fail;
    if ((rc = g3vk_buf_create(&b->vk, (size_t)b->lch * (size_t)c->vocab * 4, G3VK_MEM_READBACK, "logits", &b->logits,
                              err)))
        goto fail;
    if ((rc = g3vk_buf_create(&b->vk, (size_t)b->lch * (size_t)c->vocab * 4, G3VK_MEM_DEVICE, "logits", &b->logits_dev,
                              err)) ||
        (rc = g3vk_buf_create(&b->vk, (size_t)b->lch * 4, G3VK_MEM_READBACK, "token ids", &b->ids, err)) ||
        (rc = g3vk_buf_create(&b->vk, 4 * ((size_t)G3VK_CNT_ARGMAX(c->n_heads) + (size_t)b->lch),
                              G3VK_MEM_DEVICE, "kernel counters", &b->cnt, err)))
        goto fail;
    int32_t *P = b->params.map;
    memset(P, 0, b->p_ints * 4);
    P[G3VK_P_TOK] = b->off_tok, P[G3VK_P_POS] = b->off_pos, P[G3VK_P_SEQ] = b->off_seq, P[G3VK_P_OUT] = b->off_out;
    P[G3VK_P_BTG] = b->off_btg, P[G3VK_P_BTL] = b->off_btl, P[G3VK_P_BPS] = cfg->max_blocks_per_seq;
    /* zero the KV pools once (nothing reads unwritten positions; this only makes runs reproducible) */
    if ((rc = g3vk_once_begin(&b->vk, err))) goto fail;
    for (int kind = 0; kind < 2; kind++) b->vk.vkCmdFillBuffer(b->vk.once, b->kv[kind].buf, 0, VK_WHOLE_SIZE, 0);
    b->vk.vkCmdFillBuffer(b->vk.once, b->cnt.buf, 0, VK_WHOLE_SIZE, 0); /* the tails' counters start at 0 */
    if ((rc = g3vk_once_submit(&b->vk, err))) goto fail;
    /* row buckets 1, 2, 4, ... and max_rows; pipelines and command buffers */
    for (int r = 1; b->n_buckets < G3VK_MAX_BUCKETS - 1; r *= 2) {
        if (r >= R) break;
        b->bucket_rows[b->n_buckets++] = r;
    }
    b->bucket_rows[b->n_buckets++] = R;
    if ((rc = g3vk_record_all(b, err))) goto fail;
    *out = b;
    return G3_OK;
fail:
    vk_destroy(b);
    return rc;
}


g3_status g3vk_read_back(g3_backend *b, g3vk_buf *src, void *dst, size_t bytes, g3_error *err) {
    if (!src->coherent) {
        VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = src->mem,
                                  .size = VK_WHOLE_SIZE};
        G3_TRY(g3vk_check(b->vk.vkInvalidateMappedMemoryRanges(b->vk.dev, 1, &mr), "vkInvalidateMappedMemoryRanges",
                          err));
    }
    memcpy(dst, src->map, bytes);
    return G3_OK;
}

g3_status g3vk_step_params(g3_backend *b, const g3_batch *bt, int *bucket, g3_error *err) {
    G3_TRY(g3_batch_check(&b->m->cfg, &b->cfg, bt, err));
    int32_t *P = b->params.map;
    size_t tab = (size_t)b->cfg.max_seqs * (size_t)b->cfg.max_blocks_per_seq;
    P[G3VK_P_NROWS] = bt->n_rows;
    memcpy(P + b->off_tok, bt->token, sizeof(int32_t) * (size_t)bt->n_rows);
    memcpy(P + b->off_pos, bt->pos, sizeof(int32_t) * (size_t)bt->n_rows);
    memcpy(P + b->off_seq, bt->seq, sizeof(int32_t) * (size_t)bt->n_rows);
    if (bt->n_out) memcpy(P + b->off_out, bt->out_rows, sizeof(int32_t) * (size_t)bt->n_out);
    if (b->n_layers_kind[0]) memcpy(P + b->off_btg, bt->bt_global, sizeof(int32_t) * tab);
    if (b->n_layers_kind[1]) memcpy(P + b->off_btl, bt->bt_local, sizeof(int32_t) * tab);
    int bi = 0;
    while (b->bucket_rows[bi] < bt->n_rows) bi++;
    *bucket = bi;
    return G3_OK;
}

int g3vk_head_index(const g3_backend *b, int cnt) {
    (void)b;
    return cnt == 1 ? 2 : cnt <= G3VK_MV_ROWS ? 0 : 1;
}

/* One step: the parameter block, the body of the row bucket, then the head per chunk of lch output rows. The
 * output is logits [n_out][vocab] or (argmax) token ids [n_out]. vk_profile.c runs the same loop on its own
 * timestamped command buffers. */
static g3_status run_step(g3_backend *b, const g3_batch *bt, int argmax, void *out, g3_error *err) {
    int bi;
    G3_TRY(g3vk_step_params(b, bt, &bi, err));
    int32_t *P = b->params.map;
    size_t V = (size_t)b->m->cfg.vocab;
    VkCommandBuffer *heads = argmax ? b->head_argmax : b->head;
    for (int done = 0; done == 0 || done < bt->n_out; done += b->lch) {
        int cnt = bt->n_out - done < b->lch ? bt->n_out - done : b->lch;
        P[G3VK_P_NOUT] = cnt, P[G3VK_P_OUTBASE] = done;
        VkCommandBuffer cbs[2];
        int n = 0;
        if (done == 0) cbs[n++] = b->body[bi];
        if (cnt > 0) cbs[n++] = heads[g3vk_head_index(b, cnt)];
        G3_TRY(g3vk_submit_wait(&b->vk, cbs, n, err));
        if (cnt > 0 && argmax)
            G3_TRY(g3vk_read_back(b, &b->ids, (int32_t *)out + done, sizeof(int32_t) * (size_t)cnt, err));
        else if (cnt > 0)
            G3_TRY(g3vk_read_back(b, &b->logits, (float *)out + (size_t)done * V, sizeof(float) * cnt * V, err));
        if (cnt <= 0) break;
    }
    return G3_OK;
}

static g3_status vk_forward(g3_backend *b, const g3_batch *bt, float *logits, g3_error *err) {
    return run_step(b, bt, 0, logits, err);
}

static g3_status vk_forward_argmax(g3_backend *b, const g3_batch *bt, int32_t *tokens, g3_error *err) {
    return run_step(b, bt, 1, tokens, err);
}

static g3_status vk_copy_block(g3_backend *b, int kind, int src, int dst, g3_error *err) {
    int nb = kind ? b->cfg.n_blocks_local : b->cfg.n_blocks_global;
    if (kind < 0 || kind > 1 || src < 0 || dst < 0 || src >= nb || dst >= nb)
        return g3_fail(err, G3_ERR_ARG, "copy_block: block %d -> %d out of range", src, dst);
    if (src == dst) return G3_OK;
    VkDeviceSize bb = (VkDeviceSize)b->block_floats[kind] * (b->kv16 ? 2 : 4);
    VkBufferCopy region = {.srcOffset = (VkDeviceSize)src * bb, .dstOffset = (VkDeviceSize)dst * bb, .size = bb};
    G3_TRY(g3vk_once_begin(&b->vk, err));
    b->vk.vkCmdCopyBuffer(b->vk.once, b->kv[kind].buf, b->kv[kind].buf, 1, &region);
    return g3vk_once_submit(&b->vk, err);
}

const g3_backend_ops g3_backend_vulkan = {
    .name = "vulkan",
    .create = vk_create,
    .destroy = vk_destroy,
    .forward = vk_forward,
    .copy_block = vk_copy_block,
    .block_bytes = vk_block_bytes,
    .forward_argmax = vk_forward_argmax,
};
