/* Test hooks of the attention and argmax shaders (vk_test_attn.h): the dispatches of one layer's attention with the
 * push constants, grid and chunking vk_record.c uses (g3vk_attn_tile / _heads / _chunks), and the greedy head's
 * argmax with its vocab slabs, on host data; the merge counters are read back to check they end at 0. */
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "backend/vulkan/vk_test_attn.h"
#include "core/fp16.h"

enum { NBUF = 8 };

typedef struct ta_ctx {
    g3vk vk;
    g3vk_buf b[NBUF];
} ta_ctx;

static void ta_free(ta_ctx *t) {
    if (!t) return;
    for (int i = 0; i < NBUF; i++) g3vk_buf_free(&t->vk, &t->b[i]);
    g3vk_deinit(&t->vk);
    free(t);
}

/* Host bytes into a new device-local buffer. */
static g3_status ta_put(ta_ctx *t, int slot, const void *data, size_t bytes, g3_error *err) {
    G3_TRY(g3vk_buf_create(&t->vk, bytes, G3VK_MEM_DEVICE, "test data", &t->b[slot], err));
    g3vk_upload up;
    g3vk_upload_begin(&t->vk, &up, err);
    g3_status rc = g3vk_upload_write(&up, &t->b[slot], 0, data, bytes, err);
    g3_status rc2 = g3vk_upload_end(&up, rc ? NULL : err);
    return rc ? rc : rc2;
}

/* A host-visible coherent buffer holding `bytes` of data (or zeros). */
static g3_status ta_mapped(ta_ctx *t, int slot, const void *data, size_t bytes, g3_error *err) {
    G3_TRY(g3vk_buf_create(&t->vk, bytes, G3VK_MEM_UPLOAD, "test parameters", &t->b[slot], err));
    if (!t->b[slot].map) return g3_fail(err, G3_ERR_DEVICE, "test: parameter buffer not mapped");
    if (data) memcpy(t->b[slot].map, data, bytes);
    else memset(t->b[slot].map, 0, bytes);
    return G3_OK;
}

static g3_status ta_read(ta_ctx *t, int slot, void *dst, size_t bytes, g3_error *err) {
    g3vk_buf *b = &t->b[slot];
    if (!b->coherent) {
        VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = b->mem, .size = VK_WHOLE_SIZE};
        G3_TRY(g3vk_check(t->vk.vkInvalidateMappedMemoryRanges(t->vk.dev, 1, &mr), "invalidate", err));
    }
    memcpy(dst, b->map, bytes);
    return G3_OK;
}

static void ta_dispatch(ta_ctx *t, VkPipeline p, const void *pc, size_t size, uint32_t gx, uint32_t gy, uint32_t gz) {
    g3vk *vk = &t->vk;
    vk->vkCmdBindPipeline(vk->once, VK_PIPELINE_BIND_POINT_COMPUTE, p);
    vk->vkCmdPushConstants(vk->once, vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)size, pc);
    vk->vkCmdDispatch(vk->once, gx, gy, gz);
    g3vk_barrier(vk, vk->once);
}

static g3_status ta_counters_zero(ta_ctx *t, int slot, size_t n, const char *what, g3_error *err) {
    const uint32_t *c = t->b[slot].map;
    for (size_t i = 0; i < n; i++)
        if (c[i]) return g3_fail(err, G3_ERR_DEVICE, "test: %s counter %zu is %u after the dispatch", what, i, c[i]);
    return G3_OK;
}

g3_status g3_vulkan_test_attn(const g3_vulkan_attn_case *c, float *out, g3_error *err) {
    if (c->rows <= 0 || c->NH <= 0 || c->KVH <= 0 || c->NH % c->KVH || c->D <= 0 || c->D > 256 || c->D % 4 ||
        c->B <= 0 || c->path < 0 || c->path > 2 || (c->path < 2 && c->rows > 8))
        return g3_fail(err, G3_ERR_ARG, "test_attn: bad case (rows %d, heads %d/%d, D %d, path %d)", c->rows, c->NH,
                       c->KVH, c->D, c->path);
    ta_ctx *t = calloc(1, sizeof *t);
    if (!t) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = g3vk_init(&t->vk, 0, err);
    size_t per_block = (size_t)c->n_layers_kind * 2 * (size_t)c->KVH * (size_t)c->B * (size_t)c->D;
    size_t n_pool = per_block * (size_t)c->n_blocks, tab = (size_t)c->max_seqs * (size_t)c->bps;
    uint32_t split = c->path < 2, T = g3vk_attn_tile((uint32_t)c->D);
    uint32_t n_chunks = split ? g3vk_attn_chunks((uint32_t)c->ctx, (uint32_t)c->D) : 1;
    size_t n_cnt = (size_t)c->rows * (size_t)c->NH;
    /* parameter block: header, pos, seq, block tables (global and sliding the same) */
    size_t n_par = 16 + 2 * (size_t)c->rows + tab;
    int32_t *par = calloc(n_par, sizeof *par);
    if (!rc && !par) rc = g3_fail(err, G3_ERR_NOMEM, "out of memory");
    if (!rc) {
        par[0] = c->rows, par[5] = 16, par[6] = 16 + c->rows, par[8] = par[9] = 16 + 2 * c->rows, par[10] = c->bps;
        memcpy(par + 16, c->pos, sizeof(int32_t) * (size_t)c->rows);
        memcpy(par + 16 + c->rows, c->seq, sizeof(int32_t) * (size_t)c->rows);
        memcpy(par + 16 + 2 * c->rows, c->table, sizeof(int32_t) * tab);
        rc = ta_mapped(t, 0, par, sizeof(int32_t) * n_par, err);
    }
    free(par);
    if (!rc && c->kv16) {
        uint16_t *h = malloc(sizeof(uint16_t) * n_pool);
        if (!h) rc = g3_fail(err, G3_ERR_NOMEM, "out of memory");
        for (size_t i = 0; h && i < n_pool; i++) h[i] = g3_f32_to_f16(c->pool[i]);
        if (!rc) rc = ta_put(t, 1, h, sizeof(uint16_t) * n_pool, err);
        free(h);
    } else if (!rc) {
        rc = ta_put(t, 1, c->pool, sizeof(float) * n_pool, err);
    }
    if (!rc) rc = ta_put(t, 2, c->q, sizeof(float) * (size_t)c->rows * (size_t)c->ld, err);
    size_t n_out = (size_t)c->rows * (size_t)c->NH * (size_t)c->D;
    if (!rc) rc = g3vk_buf_create(&t->vk, sizeof(float) * n_out, G3VK_MEM_READBACK, "test output", &t->b[3], err);
    if (!rc) rc = g3vk_buf_create(&t->vk, sizeof(float) * n_cnt * n_chunks * (size_t)(c->D + 2), G3VK_MEM_DEVICE,
                                  "test partials", &t->b[4], err);
    if (!rc) rc = ta_mapped(t, 5, NULL, sizeof(uint32_t) * n_cnt, err);
    VkPipeline pa, pc;
    if (!rc) rc = g3vk_pipeline(&t->vk, c->kv16 ? G3VK_K_ATTN_KV16 : G3VK_K_ATTN, 0, &pa, err);
    if (!rc) rc = g3vk_pipeline(&t->vk, G3VK_K_ATTN_COMBINE, 0, &pc, err);
    if (!rc) rc = g3vk_once_begin(&t->vk, err);
    if (!rc) {
        uint32_t NH = (uint32_t)c->NH, KVH = (uint32_t)c->KVH;
        pc_attn a = {.q = t->b[2].addr, .kv = t->b[1].addr, .out = t->b[3].addr, .part = t->b[4].addr,
                     .params = t->b[0].addr, .ld = (uint32_t)c->ld, .NH = NH, .KVH = KVH, .D = (uint32_t)c->D,
                     .B = (uint32_t)c->B, .li = (uint32_t)c->li, .block_floats = (uint32_t)per_block, .table = 1,
                     .window = (uint32_t)c->window, .chunk_len = T, .n_chunks = n_chunks,
                     .mode = split ? (c->path == 1 ? 2u : 1u) : 0u, .out_ld = NH * (uint32_t)c->D,
                     .scale = c->scale, .cap = c->softcap, .cnt = t->b[5].addr};
        g3vk_barrier(&t->vk, t->vk.once);
        ta_dispatch(t, pa, &a, sizeof a, n_chunks, NH / g3vk_attn_heads(NH, KVH), (uint32_t)c->rows);
        if (a.mode == 1) {
            pc_attn_combine m = {.out = a.out, .part = a.part, .params = a.params, .NH = NH, .D = a.D,
                                 .window = a.window, .chunk_len = T, .n_chunks = n_chunks, .out_ld = a.out_ld};
            ta_dispatch(t, pc, &m, sizeof m, NH, (uint32_t)c->rows, 1);
        }
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                              .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        t->vk.vkCmdPipelineBarrier(t->vk.once, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                   &mb, 0, NULL, 0, NULL);
        rc = g3vk_once_submit(&t->vk, err);
    }
    if (!rc) rc = ta_read(t, 3, out, sizeof(float) * n_out, err);
    if (!rc) rc = ta_counters_zero(t, 5, n_cnt, "attention merge", err);
    ta_free(t);
    return rc;
}

g3_status g3_vulkan_test_argmax(const float *logits, int rows, int V, int32_t *ids, g3_error *err) {
    if (rows <= 0 || rows > 64 || V <= 0) return g3_fail(err, G3_ERR_ARG, "test_argmax: %d rows of %d", rows, V);
    ta_ctx *t = calloc(1, sizeof *t);
    if (!t) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = g3vk_init(&t->vk, 0, err);
    int32_t par[16] = {[0] = rows, [1] = rows};
    uint32_t nb = g3vk_argmax_groups((uint32_t)V);
    if (!rc) rc = ta_mapped(t, 0, par, sizeof par, err);
    if (!rc) rc = ta_put(t, 1, logits, sizeof(float) * (size_t)rows * (size_t)V, err);
    if (!rc) rc = g3vk_buf_create(&t->vk, sizeof(int32_t) * (size_t)rows, G3VK_MEM_READBACK, "test ids", &t->b[2], err);
    if (!rc) rc = g3vk_buf_create(&t->vk, 8 * (size_t)rows * nb, G3VK_MEM_DEVICE, "test pairs", &t->b[3], err);
    if (!rc) rc = ta_mapped(t, 4, NULL, sizeof(uint32_t) * (size_t)rows, err);
    VkPipeline p;
    if (!rc) rc = g3vk_pipeline(&t->vk, G3VK_K_ARGMAX, 0, &p, err);
    if (!rc) rc = g3vk_once_begin(&t->vk, err);
    if (!rc) {
        pc_argmax a = {.logits = t->b[1].addr, .ids = t->b[2].addr, .params = t->b[0].addr, .V = (uint32_t)V, .nb = nb,
                       .part = t->b[3].addr, .cnt = t->b[4].addr};
        g3vk_barrier(&t->vk, t->vk.once);
        ta_dispatch(t, p, &a, sizeof a, nb, (uint32_t)rows, 1);
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                              .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        t->vk.vkCmdPipelineBarrier(t->vk.once, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                   &mb, 0, NULL, 0, NULL);
        rc = g3vk_once_submit(&t->vk, err);
    }
    if (!rc) rc = ta_read(t, 2, ids, sizeof(int32_t) * (size_t)rows, err);
    if (!rc) rc = ta_counters_zero(t, 4, (size_t)rows, "argmax", err);
    ta_free(t);
    return rc;
}
