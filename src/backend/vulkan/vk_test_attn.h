/* Test hooks for the attention and argmax shaders (vk_test_attn.c): one layer's attention dispatches, recorded as
 * vk_record.c records them, and the greedy pick, run on host data so that tests can compare them with the CPU. */
#ifndef G3_BACKEND_VULKAN_VK_TEST_ATTN_H
#define G3_BACKEND_VULKAN_VK_TEST_ATTN_H

#include <stdint.h>

#include "core/status.h"

typedef struct g3_vulkan_attn_case {
    int NH, KVH, D, B;       /* query heads, KV heads, head_dim, keys per KV block */
    int n_layers_kind, li;   /* layers in the pool's blocks; the layer attended */
    int window;              /* sliding window (0: a global layer) */
    float scale, softcap;    /* score scale; softcap (0: none) */
    int rows;                /* rows of the step (<= 8 for the split paths) */
    const int32_t *pos, *seq; /* [rows] position of the query (keys first..pos) and sequence of each row */
    int max_seqs, bps;       /* block tables [max_seqs][bps] */
    const int32_t *table;
    int n_blocks;            /* pool: [n_blocks][n_layers_kind][2][KVH][B][D] float32 */
    const float *pool;
    const float *q;          /* [rows][ld]: head h at h*D */
    int ld;
    int path;                /* 0 split decode + attn_combine, 1 split with the merge fused (mode 2), 2 one chunk
                                per row (prefill buckets) */
    int ctx;                 /* context the split is sized for (max_blocks_per_seq * B in the backend) */
    int kv16;                /* the f16 cache (the pool is rounded to f16 on upload) */
} g3_vulkan_attn_case;

/* out: [rows][NH * D]. Fails (G3_ERR_DEVICE) if a merge counter is not back to 0 after the dispatch. */
g3_status g3_vulkan_test_attn(const g3_vulkan_attn_case *c, float *out, g3_error *err);

/* ids[i] = argmax of logits row i (ties -> lowest id) by argmax.comp, as the greedy head runs it (rows <= 64). */
g3_status g3_vulkan_test_argmax(const float *logits, int rows, int V, int32_t *ids, g3_error *err);

#endif
