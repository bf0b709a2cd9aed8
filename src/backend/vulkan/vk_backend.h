/* The Vulkan backend object, shared by vk_backend.c (create, forward, block copies) and vk_record.c (the command
 * buffers recorded once at create).
 *
 * Per step the host writes the parameter block (rows, positions, sequences, output rows, both block tables) into
 * a small host-visible buffer, then submits the body command buffer of the smallest row bucket >= n_rows and, for
 * the logits, the head command buffer (one submission per chunk of `lch` output rows); forward_argmax submits a head
 * that also picks the greedy token of every row, so that only the ids come back. */
#ifndef G3_BACKEND_VULKAN_VK_BACKEND_H
#define G3_BACKEND_VULKAN_VK_BACKEND_H

#include "backend/vulkan/vk_internal.h"

#define G3VK_MV_ROWS 8    /* buckets up to this many rows use matvec kernels and split attention */
#define G3VK_MAX_BUCKETS 24

typedef struct vk_layer {
    int fused_qkv;             /* wq, wk, wv share a type: one [Q+2KV][H] matrix */
    g3vk_weight qkv;           /* fused */
    g3vk_weight q, k, v;       /* not fused */
    g3vk_weight wo;            /* [H][Q] */
    int fused_geglu;           /* gate and up share a type: one kernel computes gelu(x Wg) * (x Wu) */
    g3vk_weight gate, up;      /* [F][H] */
    g3vk_weight down;          /* [H][F] */
    uint64_t n_in, n_q, n_k, n_post_attn, n_pre_ffn, n_post_ffn; /* norm vectors (1 + w), device addresses */
    int kind;                  /* 0 global, 1 sliding */
    int li;                    /* index within its kind */
} vk_layer;

#define G3VK_CNT_ATTN 64 /* first counter of the split-attention merges in g3_backend.cnt */
#define G3VK_CNT_ARGMAX(nh) (G3VK_CNT_ATTN + G3VK_MV_ROWS * (nh)) /* first of argmax's [lch] counters */

struct g3_backend {
    g3vk vk;
    const g3_model *m;
    g3_backend_cfg cfg;
    int n_layers_kind[2];
    vk_layer *layers;          /* [n_layers] */
    g3vk_weight embed;         /* [vocab][H]; also the output head */
    g3vk_buf norms;            /* all norm vectors, then the rope frequencies (global, sliding) */
    uint64_t n_final, inv_freq[2];
    g3vk_buf kv[2];            /* pools: [n_blocks][n_layers_kind][2][KVH][B][D] float32 (f16 when kv16) */
    size_t block_floats[2];    /* elements per block */
    int kv16;                  /* f16 KV cache ($G3_VULKAN_KV=f16) */
    g3vk_buf act;              /* activations, below */
    uint64_t a_h, a_x, a_t;    /* [max_rows][H]: residual, normed input, projection output */
    uint64_t a_qkv;            /* [max_rows][Q + 2 KV] */
    uint64_t a_att;            /* [max_rows][Q] attention output */
    uint64_t a_gate, a_up;     /* [max_rows][F] (a_up only when some layer's gate/up are not fused) */
    uint64_t a_xo;             /* [lch][H] final-normed rows whose logits are wanted */
    uint64_t a_part;           /* [G3VK_MV_ROWS][NH][n_chunks][D + 2] split-attention partials */
    uint64_t a_amx;            /* [lch][G3VK_ARGMAX_MAX_GROUPS] argmax (value, id) pairs of the vocab slabs */
    uint64_t a_q8;             /* one q8act row (g3vk_q8_row_bytes of the widest K): the matvecq products' input */
    g3vk_buf params;           /* int32 parameter block, host-visible */
    g3vk_buf logits;           /* [lch][vocab] float32, host-visible */
    g3vk_buf logits_dev;       /* [lch][vocab] float32, device-local: the greedy path's logits */
    g3vk_buf ids;              /* [lch] int32, host-visible: the greedy path's picks */
    g3vk_buf cnt;              /* uint32 counters, zero between dispatches: [0] post-norm tails, [64 + r*NH + h]
                                  split-attention merges (G3VK_CNT_ATTN), then argmax's per row (G3VK_CNT_ARGMAX) */
    int lch;                   /* logits rows per head submission */
    int ctx;                   /* max_blocks_per_seq * kv_block */
    int n_chunks, chunk_len;   /* split attention for small buckets: chunks at most (grid), keys per tile (attn.comp) */
    int off_tok, off_pos, off_seq, off_out, off_btg, off_btl; /* int32 offsets in the parameter block */
    size_t p_ints;
    int n_buckets, bucket_rows[G3VK_MAX_BUCKETS];
    VkCommandBuffer body[G3VK_MAX_BUCKETS]; /* embed + layers + final norm for rows <= bucket_rows[i] */
    int body_dispatches[G3VK_MAX_BUCKETS];  /* dispatches recorded into body[i] */
    VkCommandBuffer head[3];   /* gather + logits: [0] matvec (<= 8 rows), [1] matmul, [2] one row (matvec1) */
    VkCommandBuffer head_argmax[3]; /* gather + logits + argmax on the device (forward_argmax) */
    char device_name[256];
};

/* Builds the pipelines the model needs and records every command buffer. */
g3_status g3vk_record_all(g3_backend *b, g3_error *err);

/* Timestamps of a profiled recording (vk_profile.c): a start stamp at the top of each command buffer, then per
 * dispatch one stamp right before it (top of pipe, after the barrier that precedes it) and one after it (compute
 * stage done). Dispatch i's begin stamp is query ev[i].q, its end q + 1, and the end before it (or its command
 * buffer's start) q - 1. */
typedef struct g3vk_prof_ev {
    const char *label;
    uint32_t q;
} g3vk_prof_ev;

typedef struct g3vk_prof {
    VkQueryPool pool;
    uint32_t cap, n;   /* queries in the pool / written so far */
    g3vk_prof_ev *ev;  /* [cap / 2] */
    int n_ev;
    int overflow;      /* more stamps were recorded than the pool holds (a sizing bug: the profile fails) */
} g3vk_prof;
void g3vk_prof_start(g3vk *vk, g3vk_prof *p, VkCommandBuffer cb);
void g3vk_prof_before(g3vk *vk, g3vk_prof *p, VkCommandBuffer cb, const char *label);
void g3vk_prof_after(g3vk *vk, g3vk_prof *p, VkCommandBuffer cb);

/* The body command buffer of a row bucket / a head for `rows` output rows (argmax: with the device-side pick), as
 * g3vk_record_all records them; prof != NULL adds the timestamps (the profile's own command buffers only). */
g3_status g3vk_record_body(g3_backend *b, VkCommandBuffer cb, int bucket, g3vk_prof *prof, g3_error *err);
g3_status g3vk_record_head(g3_backend *b, VkCommandBuffer cb, int rows, int argmax, g3vk_prof *prof, g3_error *err);

/* A step's pieces (vk_backend.c), shared with the profile: checks the batch, writes the parameter block but its
 * output-chunk fields and returns the body bucket; the head for cnt output rows (0 matvec, 1 matmul, 2 one row);
 * copies a host-visible result buffer out. */
g3_status g3vk_step_params(g3_backend *b, const g3_batch *bt, int *bucket, g3_error *err);
int g3vk_head_index(const g3_backend *b, int cnt);
g3_status g3vk_read_back(g3_backend *b, g3vk_buf *src, void *dst, size_t bytes, g3_error *err);

#endif
