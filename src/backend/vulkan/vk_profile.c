/* g3_vulkan_profile: where the time of one step goes, per dispatch. The step's body and head are recorded again, for
 * this call only, into their own command buffers with timestamps around every dispatch (vk_record.c's rec.prof hook;
 * the command buffers of normal steps carry none), submitted as run_step submits them, and the stamps are summed per
 * label ("qkv", "attn", ...) over the layers, like the CUDA backend's g3_cuda_profile.
 *
 * Per dispatch i (stamps: s = its command buffer's start, b_i before it at the top of the pipe, e_i after it):
 *   total_i = e_i - e_{i-1}  (e_0 = s): the dispatch with the barrier and launch gap before it; these add up to the
 *                                       command buffers' GPU time
 *   exec_i  = e_i - b_i, at most total_i: the dispatch alone where the driver latches top-of-pipe stamps after the
 *                                       preceding barrier has drained (else exec = total and the gaps read 0) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/vulkan/vk_backend.h"
#include "backend/vulkan/vulkan_api.h"

/* ---- the recording hook (called from vk_record.c) -------------------------------------------------------------- */

void g3vk_prof_start(g3vk *vk, g3vk_prof *p, VkCommandBuffer cb) {
    if (p->overflow || p->n >= p->cap) {
        p->overflow = 1;
        return;
    }
    vk->vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, p->pool, p->n++);
}

void g3vk_prof_before(g3vk *vk, g3vk_prof *p, VkCommandBuffer cb, const char *label) {
    if (p->overflow || p->n + 2 > p->cap) {
        p->overflow = 1;
        return;
    }
    p->ev[p->n_ev].label = label ? label : "?";
    p->ev[p->n_ev++].q = p->n;
    vk->vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, p->pool, p->n++);
}

void g3vk_prof_after(g3vk *vk, g3vk_prof *p, VkCommandBuffer cb) {
    if (p->overflow) return;
    vk->vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, p->pool, p->n++);
}

/* ---- the profiled step --------------------------------------------------------------------------------------------- */

#define MAX_LABELS 32

typedef struct tally {
    const char *label[MAX_LABELS];
    double total[MAX_LABELS], exec[MAX_LABELS]; /* microseconds */
    int count[MAX_LABELS];
    int n;
    double sum, sum_exec, wall;
    int dispatches, submissions;
} tally;

/* A recorded command buffer: its queries [q0, q0 + nq) and events [e0, e0 + ne). */
typedef struct segment {
    VkCommandBuffer cb;
    int recorded;
    uint32_t q0, nq;
    int e0, ne;
} segment;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Records segment s (0: the body of bucket bi; 1 + h: head h) on first use. */
static g3_status record_segment(g3_backend *b, g3vk_prof *p, segment *s, int which, int bi, int argmax, g3_error *err) {
    if (s->recorded) return G3_OK;
    s->q0 = p->n, s->e0 = p->n_ev;
    if (which == 0) {
        G3_TRY(g3vk_record_body(b, s->cb, bi, p, err));
    } else {
        int h = which - 1, rows = h == 2 ? 1 : h == 1 ? b->lch : (b->lch < G3VK_MV_ROWS ? b->lch : G3VK_MV_ROWS);
        G3_TRY(g3vk_record_head(b, s->cb, rows, argmax, p, err));
    }
    if (p->overflow)
        return g3_fail(err, G3_ERR_DEVICE, "vulkan profile: more timestamps than the %u queries planned", p->cap);
    s->nq = p->n - s->q0, s->ne = p->n_ev - s->e0;
    s->recorded = 1;
    return G3_OK;
}

static void add(tally *t, const char *label, double total, double exec) {
    int k = 0;
    while (k < t->n && strcmp(t->label[k], label)) k++;
    if (k == t->n) {
        if (t->n == MAX_LABELS) return;
        t->label[k] = label, t->total[k] = t->exec[k] = 0, t->count[k] = 0, t->n++;
    }
    t->total[k] += total, t->exec[k] += exec, t->count[k]++;
    t->sum += total, t->sum_exec += exec, t->dispatches++;
}

/* Reads a segment's stamps after its submission and adds its dispatches to the tally. */
static g3_status tally_segment(g3_backend *b, g3vk_prof *p, const segment *s, uint64_t *ts, tally *t, g3_error *err) {
    g3vk *vk = &b->vk;
    if (!s->nq) return G3_OK;
    G3_TRY(g3vk_check(vk->vkGetQueryPoolResults(vk->dev, p->pool, s->q0, s->nq, sizeof(uint64_t) * s->nq, ts,
                                                sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
                      "vkGetQueryPoolResults", err));
    uint64_t mask = vk->ts_bits >= 64 ? ~0ull : (1ull << vk->ts_bits) - 1;
    double us_per_tick = (double)vk->props.limits.timestampPeriod * 1e-3;
    for (int i = s->e0; i < s->e0 + s->ne; i++) {
        uint32_t q = p->ev[i].q - s->q0; /* begin; end q + 1; the end before it q - 1 (q >= 1: the start stamp) */
        double total = (double)((ts[q + 1] - ts[q - 1]) & mask) * us_per_tick;
        double exec = (double)((ts[q + 1] - ts[q]) & mask) * us_per_tick;
        add(t, p->ev[i].label, total, exec < total ? exec : total);
    }
    return G3_OK;
}

static void write_text(const tally *t, char *out, size_t cap) {
    if (!cap) return;
    size_t o = 0;
    out[0] = 0;
    for (int k = 0; k <= t->n + 1 && o < cap; k++) {
        int w;
        if (k < t->n)
            w = snprintf(out + o, cap - o, "%s\t%.1f\t%d\t%.2f\t%.1f\n", t->label[k], t->total[k], t->count[k],
                         t->total[k] / t->count[k], t->exec[k]);
        else if (k == t->n)
            w = snprintf(out + o, cap - o, "all_dispatches\t%.1f\t%d\t%.2f\t%.1f\n", t->sum, t->dispatches,
                         t->dispatches ? t->sum / t->dispatches : 0.0, t->sum_exec);
        else
            w = snprintf(out + o, cap - o, "wall\t%.1f\t%d\t%.2f\n", t->wall, t->submissions,
                         t->submissions ? t->wall / t->submissions : 0.0);
        if (w < 0) break;
        o += (size_t)w;
    }
}

g3_status g3_vulkan_profile_out(g3_backend *b, const g3_batch *bt, int argmax, void *result, char *out, size_t cap,
                                g3_error *err) {
    g3vk *vk = &b->vk;
    if (cap) out[0] = 0;
    if (!vk->ts_bits || vk->props.limits.timestampPeriod <= 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED,
                       "vulkan profile: the compute queue (family %u) of device %d (%s) has no timestamps "
                       "(timestampValidBits %u, timestampComputeAndGraphics %u, timestampPeriod %g)",
                       vk->qfam, vk->index, b->device_name, vk->ts_bits,
                       (unsigned)vk->props.limits.timestampComputeAndGraphics,
                       (double)vk->props.limits.timestampPeriod);
    int bi;
    G3_TRY(g3vk_step_params(b, bt, &bi, err));
    /* queries: the body's start + 2 per dispatch, then up to three heads of at most 4 dispatches (gather, the
     * overflow-guard pass of a cooperative-matrix head, logits, argmax) */
    g3vk_prof p = {.cap = 1 + 2 * (uint32_t)b->body_dispatches[bi] + 3 * 9};
    segment seg[4] = {{0}};
    VkCommandBuffer cbs[4] = {0};
    uint64_t *ts = NULL;
    tally t = {0};
    g3_status rc = G3_OK;
    p.ev = calloc(p.cap / 2 + 1, sizeof *p.ev);
    ts = calloc(p.cap, sizeof *ts);
    if (!p.ev || !ts) {
        free(p.ev), free(ts);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                .queryCount = p.cap};
    rc = g3vk_check(vk->vkCreateQueryPool(vk->dev, &qi, NULL, &p.pool), "vkCreateQueryPool", err);
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 4};
    if (!rc) rc = g3vk_check(vk->vkAllocateCommandBuffers(vk->dev, &cai, cbs), "vkAllocateCommandBuffers", err);
    for (int i = 0; i < 4; i++) seg[i].cb = cbs[i];
    /* run_step's loop: the body with the first chunk of output rows, a head per chunk of lch rows */
    int32_t *P = b->params.map;
    size_t V = (size_t)b->m->cfg.vocab;
    for (int done = 0; !rc && (done == 0 || done < bt->n_out); done += b->lch) {
        int cnt = bt->n_out - done < b->lch ? bt->n_out - done : b->lch;
        P[G3VK_P_NOUT] = cnt, P[G3VK_P_OUTBASE] = done;
        segment *run[2] = {NULL, NULL};
        int n = 0;
        if (done == 0) run[n++] = &seg[0];
        if (cnt > 0) run[n++] = &seg[1 + g3vk_head_index(b, cnt)];
        for (int i = 0; i < n && !rc; i++) rc = record_segment(b, &p, run[i], (int)(run[i] - seg), bi, argmax, err);
        if (!rc) rc = g3vk_once_begin(vk, err); /* the stamps of this submission, unwritten again */
        if (!rc) {
            for (int i = 0; i < n; i++) vk->vkCmdResetQueryPool(vk->once, p.pool, run[i]->q0, run[i]->nq);
            rc = g3vk_once_submit(vk, err);
        }
        VkCommandBuffer sub[2] = {run[0]->cb, n > 1 ? run[1]->cb : VK_NULL_HANDLE};
        double t0 = now_s();
        if (!rc) rc = g3vk_submit_wait(vk, sub, n, err);
        t.wall += (now_s() - t0) * 1e6, t.submissions++;
        for (int i = 0; i < n && !rc; i++) rc = tally_segment(b, &p, run[i], ts, &t, err);
        if (!rc && cnt > 0 && result) {
            if (argmax)
                rc = g3vk_read_back(b, &b->ids, (int32_t *)result + done, sizeof(int32_t) * (size_t)cnt, err);
            else
                rc = g3vk_read_back(b, &b->logits, (float *)result + (size_t)done * V, sizeof(float) * cnt * V, err);
        }
        if (cnt <= 0) break;
    }
    if (!rc) write_text(&t, out, cap);
    else vk->vkDeviceWaitIdle(vk->dev); /* nothing of ours may still be pending when freed */
    if (cbs[0]) vk->vkFreeCommandBuffers(vk->dev, vk->pool, 4, cbs);
    if (p.pool) vk->vkDestroyQueryPool(vk->dev, p.pool, NULL);
    free(p.ev), free(ts);
    return rc;
}

g3_status g3_vulkan_profile(g3_backend *b, const g3_batch *batch, char *out, size_t cap, g3_error *err) {
    return g3_vulkan_profile_out(b, batch, 1, NULL, out, cap, err);
}
