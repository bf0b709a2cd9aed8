/* Paged KV-cache bookkeeping (see kv_cache.h). */
#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

g3_status g3_kv_init(g3_kv *kv, int block, int max_seqs, int blocks_per_seq, int n_global, int n_local, int window,
                     int has_global, int has_local, g3_error *err) {
    memset(kv, 0, sizeof *kv);
    kv->block = block, kv->max_seqs = max_seqs, kv->blocks_per_seq = blocks_per_seq, kv->window = window;
    kv->n_blocks[0] = n_global, kv->n_blocks[1] = n_local;
    kv->has_kind[0] = has_global, kv->has_kind[1] = has_local;
    for (int k = 0; k < 2; k++) {
        size_t nb = (size_t)(kv->n_blocks[k] > 0 ? kv->n_blocks[k] : 1);
        kv->free_list[k] = malloc(sizeof(int) * nb);
        kv->refs[k] = calloc(nb, sizeof(int));
        kv->table[k] = malloc(sizeof(int32_t) * (size_t)max_seqs * (size_t)blocks_per_seq);
        if (!kv->free_list[k] || !kv->refs[k] || !kv->table[k]) {
            g3_kv_deinit(kv);
            return g3_fail(err, G3_ERR_NOMEM, "out of memory for KV block tables");
        }
        for (int i = 0; i < kv->n_blocks[k]; i++) kv->free_list[k][i] = kv->n_blocks[k] - 1 - i;
        kv->n_free[k] = kv->n_blocks[k];
        for (size_t i = 0; i < (size_t)max_seqs * (size_t)blocks_per_seq; i++) kv->table[k][i] = -1;
    }
    return G3_OK;
}

void g3_kv_deinit(g3_kv *kv) {
    for (int k = 0; k < 2; k++) {
        free(kv->free_list[k]);
        free(kv->refs[k]);
        free(kv->table[k]);
    }
    memset(kv, 0, sizeof *kv);
}

static void unref(g3_kv *kv, int kind, int32_t *entry) {
    int id = *entry;
    if (id < 0) return;
    if (--kv->refs[kind][id] == 0) kv->free_list[kind][kv->n_free[kind]++] = id;
    *entry = -1;
}

g3_status g3_kv_map(g3_kv *kv, int slot, int from, int to, g3_error *err) {
    if (to >= kv->blocks_per_seq * kv->block || from < 0)
        return g3_fail(err, G3_ERR_ARG, "positions %d..%d exceed the context of %d tokens", from, to,
                       kv->blocks_per_seq * kv->block);
    for (int k = 0; k < 2; k++) {
        if (!kv->has_kind[k]) continue;
        int32_t *tab = kv->table[k] + (size_t)slot * (size_t)kv->blocks_per_seq;
        for (int b = from / kv->block; b <= to / kv->block; b++) {
            if (tab[b] >= 0) continue;
            if (kv->n_free[k] == 0)
                return g3_fail(err, G3_ERR_FULL, "no free %s KV block (%d in use)", k ? "sliding" : "global",
                               kv->n_blocks[k]);
            int id = kv->free_list[k][--kv->n_free[k]];
            kv->refs[k][id] = 1;
            tab[b] = id;
        }
    }
    return G3_OK;
}

void g3_kv_trim_window(g3_kv *kv, int slot, int next_pos, int keep_below) {
    if (!kv->has_kind[1]) return;
    int32_t *tab = kv->table[1] + (size_t)slot * (size_t)kv->blocks_per_seq;
    int first_visible = next_pos - kv->window + 1;
    for (int b = 0; (b + 1) * kv->block - 1 < first_visible && b < kv->blocks_per_seq; b++)
        if (b * kv->block >= keep_below) unref(kv, 1, &tab[b]);
}

void g3_kv_adopt(g3_kv *kv, int kind, int slot, int block_index, int id) {
    int32_t *e = kv->table[kind] + (size_t)slot * (size_t)kv->blocks_per_seq + block_index;
    unref(kv, kind, e);
    kv->refs[kind][id]++;
    *e = id;
}

void g3_kv_unref_id(g3_kv *kv, int kind, int id) {
    int32_t e = id;
    if (id >= 0) unref(kv, kind, &e);
}

void g3_kv_missing(const g3_kv *kv, int slot, int from, int to, int missing[2]) {
    for (int k = 0; k < 2; k++) {
        missing[k] = 0;
        if (!kv->has_kind[k]) continue;
        const int32_t *tab = kv->table[k] + (size_t)slot * (size_t)kv->blocks_per_seq;
        for (int b = from / kv->block; b <= to / kv->block && b < kv->blocks_per_seq; b++) missing[k] += tab[b] < 0;
    }
}

void g3_kv_release(g3_kv *kv, int slot) {
    for (int k = 0; k < 2; k++) {
        int32_t *tab = kv->table[k] + (size_t)slot * (size_t)kv->blocks_per_seq;
        for (int b = 0; b < kv->blocks_per_seq; b++) unref(kv, k, &tab[b]);
    }
}

int g3_kv_used(const g3_kv *kv, int kind) { return kv->n_blocks[kind] - kv->n_free[kind]; }
