/* The interface every backend implements: the whole Gemma 3 forward for a batch of rows, over a paged KV cache
 * whose block tables the engine owns. A backend owns its weights' device copies, its buffers and its kernels.
 *
 * Paged KV cache: positions of a sequence are grouped in logical blocks of `kv_block` tokens (block = pos / B).
 * Two pools of physical blocks: one for the global (full-attention) layers, one for the sliding-window layers.
 * One physical block id covers all layers of its kind:
 *     block storage = [n_layers_of_kind][2 (K, V)][n_kv_heads][kv_block][head_dim]   (float32 on the CPU)
 * Each sequence slot has two block tables (global, local) of max_blocks_per_seq entries, -1 = no block.
 * Sliding layers only read positions p-W+1..p, so the engine hands their older blocks back (sets -1). */
#ifndef G3_BACKEND_BACKEND_H
#define G3_BACKEND_BACKEND_H

#include "gemma3.h"
#include "model/model.h"
#include "sample/dev_sample.h"

typedef struct g3_backend g3_backend;

typedef struct g3_backend_cfg {
    int n_threads;          /* CPU threads (0 = all cores) */
    int max_seqs;           /* sequence slots */
    int max_rows;           /* most rows in one forward (decode rows + prefill chunk) */
    int kv_block;           /* tokens per KV block */
    int max_blocks_per_seq; /* block-table width = ceil(ctx / kv_block) */
    int n_blocks_global;    /* physical blocks in the global-layer pool */
    int n_blocks_local;     /* physical blocks in the sliding-layer pool */
    int device;             /* GPU ordinal (GPU backends) */
} g3_backend_cfg;

typedef struct g3_batch {
    int n_rows;
    const int32_t *token;    /* [n_rows] */
    const int32_t *pos;      /* [n_rows] position in its sequence */
    const int32_t *seq;      /* [n_rows] sequence slot */
    int n_out;               /* rows whose logits are wanted */
    const int32_t *out_rows; /* [n_out] row indices, increasing; logits[i] belongs to out_rows[i] */
    const int32_t *bt_global; /* [max_seqs][max_blocks_per_seq] */
    const int32_t *bt_local;  /* [max_seqs][max_blocks_per_seq] */
} g3_batch;
/* Rows of one sequence appear in increasing position order, and a row's keys are those of its own sequence at
 * positions <= its own (rows earlier in the same batch included): the backend writes K/V of every row before
 * attending. */

typedef struct g3_backend_ops {
    const char *name;
    g3_status (*create)(const g3_model *m, const g3_backend_cfg *cfg, g3_backend **out, g3_error *err);
    void (*destroy)(g3_backend *b);
    /* logits: [n_out][vocab] float32, host memory. */
    g3_status (*forward)(g3_backend *b, const g3_batch *batch, float *logits, g3_error *err);
    /* Copies one physical block's contents (all layers of the kind) to another: copy-on-write of shared blocks.
     * kind 0 = global pool, 1 = local pool. */
    g3_status (*copy_block)(g3_backend *b, int kind, int src, int dst, g3_error *err);
    /* Bytes of one physical block of each kind (for memory planning). */
    size_t (*block_bytes)(const g3_model *m, const g3_backend_cfg *cfg, int kind);
    /* Optional (NULL = absent): the forward with a greedy pick on the device, so only token ids come back:
     * tokens[i] = argmax of the logits of out_rows[i] (ties -> lowest id). Used when every sampled row is greedy
     * with no penalties, bias or logprobs. */
    g3_status (*forward_argmax)(g3_backend *b, const g3_batch *batch, int32_t *tokens, g3_error *err);
    /* Optional (NULL = absent): the forward with the whole sampling chain on the device: tokens[i] drawn for
     * out_rows[i] with smp->row[i] (sampler.h's steps and edge cases; the draw walks the kept tokens in id order,
     * so a given u may pick another token than the host sampler's walk, from the same distribution). Used when no
     * sampled row asks for logprobs and each has at most G3_DEV_ADJ_PER_ROW adjustments. */
    g3_status (*forward_sample)(g3_backend *b, const g3_batch *batch, const g3_dev_sampling *smp, int32_t *tokens,
                                g3_error *err);
    /* Optional (NULL = absent): does now the setup that the first decode step of each batch size up to max_rows
     * would otherwise do (the CUDA backend captures its step graphs), so that no request waits for it. Issues no
     * work on the KV cache. */
    g3_status (*prepare)(g3_backend *b, int max_rows, g3_error *err);
    /* Optional, both or neither (NULL = absent): the overlapped decode. forward_submit enqueues the forward of batch
     * with its out rows picked on the device (smp NULL: the greedy pick of forward_argmax; else forward_sample's chain
     * with smp, which the backend copies) and returns without waiting for it; forward_collect waits for the oldest
     * submitted step and stores its n_out (>= 1) picked ids in tokens. At most two steps are submitted and not
     * collected. feed (NULL: none): feed[r] >= 0 makes row r's token the id picked for out row feed[r] of the step
     * submitted just before (batch->token[r], any valid id, is then ignored), so the host need not have it yet;
     * -1 keeps batch->token[r]. Steps run in submission order, the synchronous calls above after every submitted one. */
    g3_status (*forward_submit)(g3_backend *b, const g3_batch *batch, const g3_dev_sampling *smp,
                                const int32_t *feed, g3_error *err);
    g3_status (*forward_collect)(g3_backend *b, int32_t *tokens, g3_error *err);
    /* 1: the engine overlaps decode steps through the two above unless told not to; 0: only when asked
     * (g3_engine_opts.overlap = 1, $G3_OVERLAP=1), for a backend whose overlapped steps have not been run on its
     * hardware yet */
    int overlap_default;
} g3_backend_ops;

/* Finds a backend by name ("cpu", "cuda", "vulkan"); NULL name = best available. */
const g3_backend_ops *g3_backend_find(const char *name);
/* Validates a batch for a backend created with cfg (shared by every backend; G3_ERR_ARG with the row at fault). */
g3_status g3_batch_check(const g3_config *c, const g3_backend_cfg *cfg, const g3_batch *bt, g3_error *err);
/* Number of layers of a kind (0 = global, 1 = sliding). */
int g3_layers_of_kind(const g3_config *c, int kind);

extern const g3_backend_ops g3_backend_cpu;
#ifdef G3_HAVE_CUDA
extern const g3_backend_ops g3_backend_cuda;
#endif

#endif
