/* Paged KV-cache bookkeeping: two pools of physical block ids (global layers, sliding layers) with free lists
 * and reference counts, and each sequence slot's two block tables. The storage itself belongs to the backend;
 * this module only decides which block holds which positions. Sliding-window layers give back the blocks that
 * no later query can see, so a long sequence holds about window/B of them. */
#ifndef G3_ENGINE_KV_CACHE_H
#define G3_ENGINE_KV_CACHE_H

#include <stdint.h>

#include "core/status.h"

typedef struct g3_kv {
    int block;            /* tokens per block (B) */
    int max_seqs;
    int blocks_per_seq;   /* block-table width */
    int n_blocks[2];      /* pool sizes: [0] global layers, [1] sliding layers */
    int *free_list[2];    /* stacks of free ids */
    int n_free[2];
    int *refs[2];         /* reference count per block */
    int32_t *table[2];    /* [max_seqs][blocks_per_seq], -1 = none */
    int window;           /* sliding window in tokens */
    int has_kind[2];      /* whether any layer of the kind exists */
} g3_kv;

g3_status g3_kv_init(g3_kv *kv, int block, int max_seqs, int blocks_per_seq, int n_global, int n_local, int window,
                     int has_global, int has_local, g3_error *err);
void g3_kv_deinit(g3_kv *kv);
/* Maps blocks so that positions [from, to] of a slot have storage in every kind. Fails with G3_ERR_FULL. */
g3_status g3_kv_map(g3_kv *kv, int slot, int from, int to, g3_error *err);
/* Gives back the sliding-layer blocks that a query at position >= next_pos cannot see, except blocks that
 * start below keep_below (a prompt's blocks kept for prefix reuse). */
void g3_kv_trim_window(g3_kv *kv, int slot, int next_pos, int keep_below);
/* Puts an existing block into a slot's table and takes a reference to it (prefix sharing). */
void g3_kv_adopt(g3_kv *kv, int kind, int slot, int block_index, int id);
/* Drops one reference to a block id (not through a table). */
void g3_kv_unref_id(g3_kv *kv, int kind, int id);
/* Blocks needed to map positions [from, to] of a slot that are not mapped yet, per kind. */
void g3_kv_missing(const g3_kv *kv, int slot, int from, int to, int missing[2]);
/* Releases every block of a slot. */
void g3_kv_release(g3_kv *kv, int slot);
int g3_kv_used(const g3_kv *kv, int kind);

#endif
