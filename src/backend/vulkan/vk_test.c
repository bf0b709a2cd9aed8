/* Test hooks of the Vulkan backend: single kernels run on host data (matrix products of every weight type through
 * the matvec and tiled matmul paths, the rope shader's sin/cos), so that tests can compare them with the CPU. */
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "backend/vulkan/vulkan_api.h"
#include "model/dtype.h"

typedef struct test_ctx {
    g3vk vk;
    g3vk_buf bufs[6]; /* per hook: inputs, outputs, scratch (matmul: x, params, y, q8 row, guard exponents) */
    g3vk_weight w[2];
} test_ctx;

static void ctx_free(test_ctx *t) {
    for (int i = 0; i < 6; i++) g3vk_buf_free(&t->vk, &t->bufs[i]);
    for (int i = 0; i < 2; i++) g3vk_weight_free(&t->vk, &t->w[i]);
    g3vk_deinit(&t->vk);
    free(t);
}

/* Host data into a new device buffer. */
static g3_status put(test_ctx *t, int slot, const void *data, size_t bytes, g3_error *err) {
    G3_TRY(g3vk_buf_create(&t->vk, bytes, G3VK_MEM_DEVICE, "test data", &t->bufs[slot], err));
    g3vk_upload up;
    g3vk_upload_begin(&t->vk, &up, err);
    g3_status rc = g3vk_upload_write(&up, &t->bufs[slot], 0, data, bytes, err);
    g3_status rc2 = g3vk_upload_end(&up, rc ? NULL : err);
    return rc ? rc : rc2;
}

/* One dispatch into the one-shot command buffer, after a compute barrier. */
static g3_status record(test_ctx *t, int kind, uint32_t type, const void *pc, size_t pc_size, uint32_t gx, uint32_t gy,
                        g3_error *err) {
    g3vk *vk = &t->vk;
    VkPipeline p;
    G3_TRY(g3vk_pipeline(vk, kind, type, &p, err));
    g3vk_barrier(vk, vk->once);
    vk->vkCmdBindPipeline(vk->once, VK_PIPELINE_BIND_POINT_COMPUTE, p);
    vk->vkCmdPushConstants(vk->once, vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)pc_size, pc);
    vk->vkCmdDispatch(vk->once, gx, gy, 1);
    return G3_OK;
}

/* Submits the one-shot command buffer (begun by the caller, dispatches recorded) with shader writes made visible to
 * the host; ends the recording even after an error. */
static g3_status submit(test_ctx *t, g3_status rc, g3_error *err) {
    g3vk *vk = &t->vk;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vk->vkCmdPipelineBarrier(vk->once, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                             NULL, 0, NULL);
    g3_status rc2 = g3vk_once_submit(vk, rc ? NULL : err);
    return rc ? rc : rc2;
}

static g3_status run_one(test_ctx *t, int kind, uint32_t type, const void *pc, size_t pc_size, uint32_t gx,
                         uint32_t gy, g3_error *err) {
    G3_TRY(g3vk_once_begin(&t->vk, err));
    return submit(t, record(t, kind, type, pc, pc_size, gx, gy, err), err);
}

static g3_status read_back(test_ctx *t, g3vk_buf *b, void *dst, size_t bytes, g3_error *err) {
    if (!b->coherent) {
        VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = b->mem, .size = VK_WHOLE_SIZE};
        G3_TRY(g3vk_check(t->vk.vkInvalidateMappedMemoryRanges(t->vk.dev, 1, &mr), "invalidate", err));
    }
    memcpy(dst, b->map, bytes);
    return G3_OK;
}

g3_status g3_vulkan_test_matmul(uint32_t type, const void *w, const void *w2, int n, int k, const float *x, int m,
                                int path, float *y, g3_error *err) {
    if (n <= 0 || k <= 0 || m <= 0 || !g3_row_bytes(type, k) || path < 0 || path > 3)
        return g3_fail(err, G3_ERR_ARG, "test_matmul: bad shape %d x %d for %s (path %d)", n, k,
                       g3_dtype_name((g3_dtype)type), path);
    int small = path == 1 || (path == 0 && m <= 8);
    if (small && m > 8) return g3_fail(err, G3_ERR_ARG, "test_matmul: matvec takes at most 8 rows");
    test_ctx *t = calloc(1, sizeof *t);
    if (!t) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = g3vk_init(&t->vk, 0, err);
    g3_weight src[2] = {{.type = type, .n = n, .k = k, .data = w}, {.type = type, .n = n, .k = k, .data = w2}};
    g3vk_upload up;
    if (!rc) {
        g3vk_upload_begin(&t->vk, &up, err);
        const g3_weight *p0 = &src[0], *p1 = &src[1];
        rc = g3vk_weight_upload(&up, &p0, 1, "test weights", &t->w[0], err);
        if (!rc && w2) rc = g3vk_weight_upload(&up, &p1, 1, "test weights", &t->w[1], err);
        g3_status rc2 = g3vk_upload_end(&up, rc ? NULL : err);
        if (!rc) rc = rc2;
    }
    /* the kernel the forward takes for m rows (path 0 / 1: matvec up to 8 rows), for more than 8 (path 2, 3) */
    type = g3vk_resident_type(type); /* the kernels of the device copy (Q5_0 is kept as Q8_0) */
    int kind = rc ? 0 : g3vk_matmul_kind(&t->vk, small ? m : (m > 8 ? m : 9), type, k, w2 != NULL);
    int cm = kind == G3VK_K_MATMUL_CM || kind == G3VK_K_MATMUL_CM_GEGLU;
    if (!rc && path == 3 && !cm)
        rc = g3_fail(err, G3_ERR_UNSUPPORTED, "test_matmul: no cooperative-matrix product on this device");
    int32_t params[16] = {m};
    if (!rc) rc = put(t, 0, x, sizeof(float) * (size_t)m * (size_t)k, err);
    if (!rc) rc = put(t, 1, params, sizeof params, err);
    if (!rc) rc = g3vk_buf_create(&t->vk, sizeof(float) * (size_t)m * (size_t)n, G3VK_MEM_READBACK, "test output",
                                  &t->bufs[2], err);
    if (!rc && cm) rc = g3vk_buf_create(&t->vk, 4 * (size_t)m, G3VK_MEM_DEVICE, "test guard exponents", &t->bufs[4], err);
    if (!rc) {
        pc_matmul pc = {.w = t->w[0].addr, .waux = t->w[0].aux, .w2 = w2 ? t->w[1].addr : 0, .w2aux = w2 ? t->w[1].aux : 0,
                        .x = t->bufs[0].addr, .y = t->bufs[2].addr, .params = t->bufs[1].addr, .N = (uint32_t)n,
                        .K = (uint32_t)k, .ldx = (uint32_t)k, .ldy = (uint32_t)n, .nrows_idx = 0,
                        .sc = cm ? t->bufs[4].addr : 0};
        int q8 = g3vk_kind_q8(kind); /* the activation row quantized into bufs[3] first (q8act.comp) */
        pc_q8act pq = {.x = pc.x, .params = pc.params, .K = (uint32_t)k, .ldx = (uint32_t)k, .nrows_idx = 0,
                       .il = type == G3_DTYPE_Q4_0};
        pc_cm_scale ps = {.x = pc.x, .e = pc.sc, .params = pc.params, .K = (uint32_t)k, .ldx = (uint32_t)k};
        if (q8 && !(rc = g3vk_buf_create(&t->vk, g3vk_q8_row_bytes((uint64_t)k), G3VK_MEM_DEVICE, "test q8 row",
                                         &t->bufs[3], err)))
            pq.xq = pc.x = t->bufs[3].addr;
        uint32_t gx = 1, gy = 1;
        if (small) {
            uint32_t groups = (uint32_t)(n + g3vk_matvec_outputs(&t->vk, kind) - 1) / (uint32_t)g3vk_matvec_outputs(&t->vk, kind);
            gx = groups < 32768 ? groups : 32768, gy = (groups + gx - 1) / gx;
        } else {
            gx = (uint32_t)(n + (w2 ? 31 : 63)) / (w2 ? 32 : 64), gy = (uint32_t)(m + 63) / 64;
        }
        if (!rc) rc = g3vk_once_begin(&t->vk, err);
        if (!rc) {
            g3_status r1 = q8 ? record(t, G3VK_K_Q8ACT, 0, &pq, sizeof pq, ((uint32_t)k / 8 + 63) / 64, 1, err) : G3_OK;
            if (!r1 && cm && path == 3) /* without the overflow guard: every exponent 0 */
                t->vk.vkCmdFillBuffer(t->vk.once, t->bufs[4].buf, 0, VK_WHOLE_SIZE, 0);
            else if (!r1 && cm)
                r1 = record(t, G3VK_K_CM_SCALE, 0, &ps, sizeof ps, (uint32_t)m, 1, err);
            if (!r1) r1 = record(t, kind, type, &pc, sizeof pc, gx, gy, err);
            rc = submit(t, r1, err);
        }
    }
    if (!rc) rc = read_back(t, &t->bufs[2], y, sizeof(float) * (size_t)m * (size_t)n, err);
    ctx_free(t);
    return rc;
}

g3_status g3_vulkan_test_sincos(const float *angle, int n, float *s, float *c, g3_error *err) {
    if (n <= 0) return g3_fail(err, G3_ERR_ARG, "test_sincos: n = %d", n);
    test_ctx *t = calloc(1, sizeof *t);
    if (!t) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = g3vk_init(&t->vk, 0, err);
    size_t bytes = sizeof(float) * (size_t)n;
    if (!rc) rc = put(t, 0, angle, bytes, err);
    if (!rc) rc = g3vk_buf_create(&t->vk, bytes, G3VK_MEM_READBACK, "test output", &t->bufs[1], err);
    if (!rc) rc = g3vk_buf_create(&t->vk, bytes, G3VK_MEM_READBACK, "test output", &t->bufs[2], err);
    if (!rc) {
        struct {
            uint64_t angle, s, c;
            uint32_t n;
        } pc = {t->bufs[0].addr, t->bufs[1].addr, t->bufs[2].addr, (uint32_t)n};
        rc = run_one(t, G3VK_K_TEST_SINCOS, 0, &pc, sizeof pc, (uint32_t)(n + 63) / 64, 1, err);
    }
    if (!rc) rc = read_back(t, &t->bufs[1], s, bytes, err);
    if (!rc) rc = read_back(t, &t->bufs[2], c, bytes, err);
    ctx_free(t);
    return rc;
}

g3_status g3_vulkan_test_q8act(const float *x, int k, int il, void *out, g3_error *err) {
    if (k <= 0 || k % 32) return g3_fail(err, G3_ERR_ARG, "test_q8act: k = %d is not a positive multiple of 32", k);
    test_ctx *t = calloc(1, sizeof *t);
    if (!t) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = g3vk_init(&t->vk, 0, err);
    int32_t params[16] = {1};
    size_t bytes = (size_t)g3vk_q8_row_bytes((uint64_t)k);
    if (!rc) rc = put(t, 0, x, sizeof(float) * (size_t)k, err);
    if (!rc) rc = put(t, 1, params, sizeof params, err);
    if (!rc) rc = g3vk_buf_create(&t->vk, bytes, G3VK_MEM_READBACK, "test output", &t->bufs[2], err);
    if (!rc) {
        pc_q8act pq = {.x = t->bufs[0].addr, .xq = t->bufs[2].addr, .params = t->bufs[1].addr, .K = (uint32_t)k,
                       .ldx = (uint32_t)k, .nrows_idx = 0, .il = il ? 1u : 0u};
        rc = run_one(t, G3VK_K_Q8ACT, 0, &pq, sizeof pq, ((uint32_t)k / 8 + 63) / 64, 1, err);
    }
    if (!rc) rc = read_back(t, &t->bufs[2], out, bytes, err);
    ctx_free(t);
    return rc;
}

int g3_vulkan_test_mvq(g3_error *err) {
    g3vk vk;
    int has = g3vk_init(&vk, 0, err) == G3_OK ? vk.mvq : -1;
    g3vk_deinit(&vk);
    return has;
}

int g3_vulkan_test_coopmat(g3_error *err) {
    g3vk vk;
    int has = g3vk_init(&vk, 0, err) == G3_OK ? vk.coopmat : -1;
    g3vk_deinit(&vk);
    return has;
}

g3_status g3_vulkan_test_cm_scale(const float *x, int rows, int k, int nrows, uint32_t *e, g3_error *err) {
    if (rows <= 0 || k <= 0 || k % 4 || nrows < 0 || nrows > rows)
        return g3_fail(err, G3_ERR_ARG, "test_cm_scale: bad shape %d x %d (%d rows live; k %% 4 == 0)", rows, k, nrows);
    test_ctx *t = calloc(1, sizeof *t);
    if (!t) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = g3vk_init(&t->vk, 0, err);
    int32_t params[16] = {nrows};
    size_t bytes = 4 * (size_t)rows;
    if (!rc) rc = put(t, 0, x, sizeof(float) * (size_t)rows * (size_t)k, err);
    if (!rc) rc = put(t, 1, params, sizeof params, err);
    if (!rc) rc = g3vk_buf_create(&t->vk, bytes, G3VK_MEM_READBACK, "test output", &t->bufs[2], err);
    if (!rc) { /* rows past nrows keep this marker */
        memset(t->bufs[2].map, 0xab, bytes);
        if (!t->bufs[2].coherent) {
            VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = t->bufs[2].mem,
                                      .size = VK_WHOLE_SIZE};
            rc = g3vk_check(t->vk.vkFlushMappedMemoryRanges(t->vk.dev, 1, &mr), "flush", err);
        }
    }
    if (!rc) {
        pc_cm_scale ps = {.x = t->bufs[0].addr, .e = t->bufs[2].addr, .params = t->bufs[1].addr, .K = (uint32_t)k,
                          .ldx = (uint32_t)k, .nrows_idx = 0};
        rc = run_one(t, G3VK_K_CM_SCALE, 0, &ps, sizeof ps, (uint32_t)rows, 1, err);
    }
    if (!rc) rc = read_back(t, &t->bufs[2], e, bytes, err);
    ctx_free(t);
    return rc;
}
