/* Prefix cache: when a request finishes, its full KV blocks (global layers, and the sliding-layer blocks it still
 * holds) move into an entry together with its tokens. A new request whose prompt starts with the same tokens adopts
 * those blocks (reference-counted, never written again: reuse is cut to a block boundary) instead of recomputing
 * them. Sliding-window layers need the window before the reuse point, so a request keeps its prompt's sliding blocks
 * (up to a cap) until it finishes; reuse at a point whose window is gone is not offered. Entries are evicted least
 * recently used first when the pool runs short. */
#ifndef G3_ENGINE_PREFIX_CACHE_H
#define G3_ENGINE_PREFIX_CACHE_H

#include <stdint.h>

#include "engine/kv_cache.h"

typedef struct g3_prefix_entry {
    int32_t *tokens;   /* [n] tokens whose K/V are in the blocks */
    int n;
    int32_t *blocks[2]; /* [n / B] block ids per kind (-1 = not held), one reference each */
    int n_blocks;
    uint64_t stamp;    /* last use, for LRU */
} g3_prefix_entry;

typedef struct g3_prefix_cache {
    g3_prefix_entry *e;
    int n, cap;
    uint64_t clock;
} g3_prefix_cache;

int g3_pc_init(g3_prefix_cache *pc, int cap);
void g3_pc_deinit(g3_prefix_cache *pc, g3_kv *kv);
/* Moves the full blocks of a slot into a new entry (tokens[0..n) have their K/V computed). Blocks not moved stay in
 * the slot's tables for the caller to release. Entries whose tokens are a prefix of this one are dropped. */
void g3_pc_insert(g3_prefix_cache *pc, g3_kv *kv, int slot, const int32_t *tokens, int n);
/* Finds the longest reusable prefix of a prompt (a multiple of the block size, below n_prompt, with the sliding
 * window before it still held). Returns its length (0 = none) and the entry in *entry. */
int g3_pc_lookup(g3_prefix_cache *pc, const g3_kv *kv, const int32_t *prompt, int n_prompt, int *entry);
/* Gives a slot references to the entry's blocks covering positions [0, len). */
void g3_pc_adopt(g3_prefix_cache *pc, g3_kv *kv, int entry, int slot, int len);
/* Drops the least recently used entry other than *keep (keep may be NULL), and keeps *keep pointing at the same entry;
 * returns 0 when there is nothing to drop. */
int g3_pc_evict_one(g3_prefix_cache *pc, g3_kv *kv, int *keep);
/* Blocks (both kinds) held by entries. */
int g3_pc_blocks(const g3_prefix_cache *pc);

#endif
