/* Weights on the device: the file's blocks repacked once, at upload, into the layouts of shaders/dequant.glsl
 * (aligned quants with scales split off for Q8_0/Q4_0/Q4_1/Q5_1/Q6_K, nibbles in value order for the 4- and 5-bit
 * types, fifth bits in value order), written
 * straight into mapped memory where device memory is host-visible (UMA, lavapipe) or through a staging buffer. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "model/dtype.h"

#define STAGING_BYTES (32u << 20)

static size_t row_dev_bytes(uint32_t type, int64_t k) {
    switch (type) {
    case G3_DTYPE_F32: return (size_t)k * 4;
    case G3_DTYPE_F16:
    case G3_DTYPE_BF16: return (size_t)k * 2;
    case G3_DTYPE_Q8_0: return (size_t)k;
    case G3_DTYPE_Q4_0:
    case G3_DTYPE_Q4_1:
    case G3_DTYPE_Q5_1: return (size_t)k / 2;
    case G3_DTYPE_Q4_K: return (size_t)k / 256 * 144;
    case G3_DTYPE_Q5_K: return (size_t)k / 256 * 176;
    case G3_DTYPE_Q6_K: return (size_t)k / 256 * 208;
    default: return 0;
    }
}

/* f16 scales per row kept apart from the quants (Q4_1: d, m a block; Q5_1: d, m and the block's 32 fifth bits) */
static size_t row_aux_halves(uint32_t type, int64_t k) {
    switch (type) {
    case G3_DTYPE_Q8_0:
    case G3_DTYPE_Q4_0: return (size_t)k / 32;
    case G3_DTYPE_Q4_1: return (size_t)k / 16;
    case G3_DTYPE_Q5_1: return (size_t)k / 8;
    case G3_DTYPE_Q6_K: return (size_t)k / 256;
    default: return 0;
    }
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

uint32_t g3vk_resident_type(uint32_t type) { return type == G3_DTYPE_Q5_0 ? (uint32_t)G3_DTYPE_Q8_0 : type; }

uint64_t g3vk_weight_bytes(uint32_t type, int64_t n, int64_t k) {
    type = g3vk_resident_type(type);
    return align256(row_dev_bytes(type, k) * (size_t)n) + row_aux_halves(type, k) * 2 * (size_t)n;
}

static void set_nibble(uint8_t *p, int i, int v) {
    if (i & 1) p[i >> 1] = (uint8_t)((p[i >> 1] & 0x0F) | (v << 4));
    else p[i >> 1] = (uint8_t)((p[i >> 1] & 0xF0) | (v & 0x0F));
}

/* One row of k values from the file's layout into data (row_dev_bytes) and aux (row_aux_halves f16). */
static void repack_row(uint32_t type, const uint8_t *src, int64_t k, uint8_t *data, uint16_t *aux) {
    switch (type) {
    case G3_DTYPE_F32:
    case G3_DTYPE_F16:
    case G3_DTYPE_BF16: memcpy(data, src, row_dev_bytes(type, k)); break;
    case G3_DTYPE_Q8_0: {
        for (int64_t i = 0; i < k / 32; i++) {
            const uint8_t *b = src + (size_t)i * sizeof(g3_block_q8_0);
            memcpy(&aux[i], b + offsetof(g3_block_q8_0, d), 2);
            memcpy(data + 32 * i, b + offsetof(g3_block_q8_0, qs), 32);
        }
        break;
    }
    case G3_DTYPE_Q5_0: { /* as Q8_0: q - 16 with the block's d (exact) */
        for (int64_t i = 0; i < k / 32; i++) {
            g3_block_q5_0 blk;
            memcpy(&blk, src + (size_t)i * sizeof blk, sizeof blk);
            aux[i] = blk.d;
            uint32_t qh;
            memcpy(&qh, blk.qh, 4);
            for (int j = 0; j < 32; j++) data[32 * i + j] = (uint8_t)(int8_t)(g3_q5_code(blk.qs, qh, j) - 16);
        }
        break;
    }
    case G3_DTYPE_Q4_0:
    case G3_DTYPE_Q4_1:
    case G3_DTYPE_Q5_1: { /* value j's low 4 bits in nibble j; the block's d (Q4_1 / Q5_1: d, m; Q5_1: then its
                           * fifth bits, bit j for value j, as two halves) in aux */
        const size_t bb = g3_dtype_get(type)->block_bytes; /* qs[16] ends each block, Q5_1's qh[4] before it */
        const size_t na = row_aux_halves(type, 32); /* halves a block: 1, 2, 4 */
        for (int64_t i = 0; i < k / 32; i++) {
            const uint8_t *blk = src + (size_t)i * bb;
            memcpy(&aux[na * i], blk, 2 * (na < 2 ? na : 2)); /* d (and m) lead every block */
            uint32_t qh = 0;
            if (type == G3_DTYPE_Q5_1) {
                memcpy(&qh, blk + bb - 20, 4);
                aux[na * i + 2] = (uint16_t)(qh & 0xFFFFu), aux[na * i + 3] = (uint16_t)(qh >> 16);
            }
            for (int j = 0; j < 32; j++) set_nibble(data + 16 * i, j, g3_q5_code(blk + bb - 16, qh, j) & 0x0F);
        }
        break;
    }
    case G3_DTYPE_Q4_K:
    case G3_DTYPE_Q5_K: { /* d, dmin and the 12 scale bytes as in the file, then value-ordered low nibbles; Q5_K:
                           * then 32 bytes of fifth bits in value order */
        const int five = type == G3_DTYPE_Q5_K;
        const size_t bb = five ? sizeof(g3_block_q5_k) : sizeof(g3_block_q4_k), ob = five ? 176 : 144;
        for (int64_t i = 0; i < k / 256; i++) {
            const uint8_t *blk = src + (size_t)i * bb;
            const uint8_t *qs = blk + (five ? offsetof(g3_block_q5_k, qs) : offsetof(g3_block_q4_k, qs));
            const uint8_t *qh = five ? blk + offsetof(g3_block_q5_k, qh) : NULL;
            uint8_t *o = data + ob * i;
            memcpy(o, blk, 16);
            if (five) memset(o + 144, 0, 32);
            for (int e = 0; e < 256; e++) {
                const int c = g3_kq_code(qs, qh, e);
                set_nibble(o + 16, e, c & 0x0F);
                if (five) o[144 + e / 8] |= (uint8_t)((c >> 4) << (e % 8));
            }
        }
        break;
    }
    case G3_DTYPE_Q6_K: {
        for (int64_t i = 0; i < k / 256; i++) {
            g3_block_q6_k blk;
            memcpy(&blk, src + (size_t)i * sizeof blk, sizeof blk);
            uint8_t *o = data + 208 * i;
            memset(o, 0, 192);
            for (int e = 0; e < 256; e++) {
                int q = g3_q6k_code(&blk, e);
                set_nibble(o, e, q & 0x0F);
                o[128 + e / 4] |= (uint8_t)((q >> 4) << (2 * (e % 4)));
            }
            memcpy(o + 192, blk.scales, 16);
            aux[i] = blk.d;
        }
        break;
    }
    default: break;
    }
}

/* ---- uploader ------------------------------------------------------------------------------------------------ */

g3_status g3vk_upload_begin(g3vk *vk, g3vk_upload *up, g3_error *err) {
    (void)err;
    memset(up, 0, sizeof *up);
    up->vk = vk;
    return G3_OK;
}

static g3_status upload_flush(g3vk_upload *up, g3_error *err) {
    if (up->n_regions) {
        g3vk *vk = up->vk;
        G3_TRY(g3vk_once_begin(vk, err));
        vk->vkCmdCopyBuffer(vk->once, up->staging.buf, up->dst, (uint32_t)up->n_regions, up->regions);
        G3_TRY(g3vk_once_submit(vk, err));
    }
    up->n_regions = 0;
    up->fill = 0;
    return G3_OK;
}

g3_status g3vk_upload_write(g3vk_upload *up, g3vk_buf *dst, size_t off, const void *src, size_t len, g3_error *err) {
    g3vk *vk = up->vk;
    if (off + len > dst->size) return g3_fail(err, G3_ERR_DEVICE, "vulkan: upload beyond the end of a buffer");
    if (dst->map && !vk->force_staging) {
        memcpy((uint8_t *)dst->map + off, src, len);
        return G3_OK;
    }
    if (!up->staging.buf) G3_TRY(g3vk_buf_create(vk, STAGING_BYTES, G3VK_MEM_STAGING, "the staging buffer", &up->staging, err));
    const uint8_t *s = src;
    while (len > 0) {
        if (up->n_regions && (up->dst != dst->buf || up->fill == up->staging.size ||
                              up->n_regions == (int)(sizeof up->regions / sizeof up->regions[0])))
            G3_TRY(upload_flush(up, err));
        size_t chunk = up->staging.size - up->fill;
        if (chunk > len) chunk = len;
        memcpy((uint8_t *)up->staging.map + up->fill, s, chunk);
        VkBufferCopy *last = up->n_regions ? &up->regions[up->n_regions - 1] : NULL;
        if (last && last->srcOffset + last->size == up->fill && last->dstOffset + last->size == off) {
            last->size += chunk;
        } else {
            up->regions[up->n_regions++] = (VkBufferCopy){.srcOffset = up->fill, .dstOffset = off, .size = chunk};
            up->dst = dst->buf;
        }
        up->fill += chunk, off += chunk, s += chunk, len -= chunk;
    }
    return G3_OK;
}

g3_status g3vk_upload_end(g3vk_upload *up, g3_error *err) {
    g3_status rc = upload_flush(up, err);
    g3vk_buf_free(up->vk, &up->staging);
    return rc;
}

/* ---- weights ------------------------------------------------------------------------------------------------- */

g3_status g3vk_weight_upload(g3vk_upload *up, const g3_weight *const *parts, int n_parts, const char *what,
                             g3vk_weight *out, g3_error *err) {
    memset(out, 0, sizeof *out);
    uint32_t type = parts[0]->type;
    int64_t k = parts[0]->k, n = 0;
    for (int i = 0; i < n_parts; i++) { /* the parts may differ in file type where the device type is one (Q5_0, Q8_0) */
        if (g3vk_resident_type(parts[i]->type) != g3vk_resident_type(type) || parts[i]->k != k)
            return g3_fail(err, G3_ERR_ARG, "vulkan: %s: parts differ in type or width", what);
        n += parts[i]->n;
    }
    const uint32_t dev = g3vk_resident_type(type);
    size_t rb = row_dev_bytes(dev, k), ah = row_aux_halves(dev, k), src_rb = g3_row_bytes(type, k);
    if (!rb || !src_rb || k % 32 != 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "vulkan: %s: %s rows of %lld values are not supported", what,
                       g3_dtype_name((g3_dtype)type), (long long)k);
    out->type = dev, out->n = (int)n, out->k = (int)k;
    size_t aux_off = align256(rb * (size_t)n);
    G3_TRY(g3vk_buf_create(up->vk, g3vk_weight_bytes(type, n, k), G3VK_MEM_DEVICE, what, &out->buf, err));
    out->addr = out->buf.addr;
    out->aux = out->buf.addr + aux_off;
    uint8_t *data = malloc(rb);
    uint16_t *aux = malloc(ah * 2 + 2);
    if (!data || !aux) {
        free(data), free(aux);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    g3_status rc = G3_OK;
    /* two passes (quants, then scales) so that each pass is one contiguous destination range */
    for (int pass = 0; pass < (ah ? 2 : 1) && rc == G3_OK; pass++) {
        size_t row = 0;
        for (int i = 0; i < n_parts && rc == G3_OK; i++)
            for (int64_t r = 0; r < parts[i]->n && rc == G3_OK; r++, row++) {
                const uint32_t pt = parts[i]->type;
                repack_row(pt, (const uint8_t *)parts[i]->data + (size_t)r * g3_row_bytes(pt, k), k, data, aux);
                rc = pass == 0 ? g3vk_upload_write(up, &out->buf, row * rb, data, rb, err)
                               : g3vk_upload_write(up, &out->buf, aux_off + row * ah * 2, aux, ah * 2, err);
            }
    }
    free(data), free(aux);
    if (rc == G3_OK && out->buf.map && !out->buf.coherent && !up->vk->force_staging) {
        VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = out->buf.mem,
                                  .size = VK_WHOLE_SIZE};
        rc = g3vk_check(up->vk->vkFlushMappedMemoryRanges(up->vk->dev, 1, &mr), "vkFlushMappedMemoryRanges", err);
    }
    return rc;
}

void g3vk_weight_free(g3vk *vk, g3vk_weight *w) {
    g3vk_buf_free(vk, &w->buf);
    memset(w, 0, sizeof *w);
}
