/* Prefix cache (see prefix_cache.h). */
#include "engine/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

int g3_pc_init(g3_prefix_cache *pc, int cap) {
    memset(pc, 0, sizeof *pc);
    pc->cap = cap;
    pc->e = cap > 0 ? calloc((size_t)cap, sizeof *pc->e) : NULL;
    return cap <= 0 || pc->e != NULL;
}

static void drop(g3_prefix_cache *pc, g3_kv *kv, int i) {
    g3_prefix_entry *e = &pc->e[i];
    for (int k = 0; k < 2; k++) {
        for (int b = 0; b < e->n_blocks; b++) g3_kv_unref_id(kv, k, e->blocks[k][b]);
        free(e->blocks[k]);
    }
    free(e->tokens);
    pc->e[i] = pc->e[--pc->n];
}

void g3_pc_deinit(g3_prefix_cache *pc, g3_kv *kv) {
    while (pc->n) drop(pc, kv, pc->n - 1);
    free(pc->e);
    memset(pc, 0, sizeof *pc);
}

int g3_pc_evict_one(g3_prefix_cache *pc, g3_kv *kv, int *keep) {
    int k = keep ? *keep : -1, oldest = -1;
    for (int i = 0; i < pc->n; i++)
        if (i != k && (oldest < 0 || pc->e[i].stamp < pc->e[oldest].stamp)) oldest = i;
    if (oldest < 0) return 0;
    drop(pc, kv, oldest);
    if (k == pc->n) *keep = oldest; /* drop moved the last entry, the kept one, into the freed place */
    return 1;
}

void g3_pc_insert(g3_prefix_cache *pc, g3_kv *kv, int slot, const int32_t *tokens, int n) {
    int nb = n / kv->block;
    if (pc->cap <= 0 || nb == 0) return;
    for (int i = pc->n - 1; i >= 0; i--) /* superseded entries */
        if (pc->e[i].n <= n && !memcmp(pc->e[i].tokens, tokens, sizeof(int32_t) * (size_t)pc->e[i].n)) drop(pc, kv, i);
    if (pc->n == pc->cap) g3_pc_evict_one(pc, kv, NULL);
    g3_prefix_entry e = {0};
    e.tokens = malloc(sizeof(int32_t) * (size_t)n);
    e.blocks[0] = malloc(sizeof(int32_t) * (size_t)nb);
    e.blocks[1] = malloc(sizeof(int32_t) * (size_t)nb);
    if (!e.tokens || !e.blocks[0] || !e.blocks[1]) { /* no memory: simply do not cache */
        free(e.tokens), free(e.blocks[0]), free(e.blocks[1]);
        return;
    }
    memcpy(e.tokens, tokens, sizeof(int32_t) * (size_t)n);
    e.n = n;
    e.n_blocks = nb;
    for (int k = 0; k < 2; k++) {
        int32_t *tab = kv->table[k] + (size_t)slot * (size_t)kv->blocks_per_seq;
        for (int b = 0; b < nb; b++) { /* move the reference from the table to the entry */
            e.blocks[k][b] = tab[b];
            tab[b] = -1;
        }
    }
    e.stamp = ++pc->clock;
    pc->e[pc->n++] = e;
}

/* Whether an entry can serve positions [0, len): every global block, and the sliding blocks of the window. */
static int usable(const g3_kv *kv, const g3_prefix_entry *e, int len) {
    int B = kv->block;
    for (int b = 0; b < len / B; b++)
        if (kv->has_kind[0] && e->blocks[0][b] < 0) return 0;
    if (kv->has_kind[1]) {
        int first = len - kv->window + 1;
        if (first < 0) first = 0;
        for (int b = first / B; b < len / B; b++)
            if (e->blocks[1][b] < 0) return 0;
    }
    return 1;
}

int g3_pc_lookup(g3_prefix_cache *pc, const g3_kv *kv, const int32_t *prompt, int n_prompt, int *entry) {
    int best = 0, B = kv->block;
    *entry = -1;
    for (int i = 0; i < pc->n; i++) {
        const g3_prefix_entry *e = &pc->e[i];
        int lim = e->n < n_prompt - 1 ? e->n : n_prompt - 1, l = 0;
        while (l < lim && e->tokens[l] == prompt[l]) l++;
        for (int len = l / B * B; len > best; len -= B)
            if (usable(kv, e, len)) {
                best = len;
                *entry = i;
                break;
            }
    }
    if (*entry >= 0) pc->e[*entry].stamp = ++pc->clock;
    return best;
}

void g3_pc_adopt(g3_prefix_cache *pc, g3_kv *kv, int entry, int slot, int len) {
    const g3_prefix_entry *e = &pc->e[entry];
    int first_local = len - kv->window + 1;
    if (first_local < 0) first_local = 0;
    for (int b = 0; b < len / kv->block; b++) {
        if (kv->has_kind[0]) g3_kv_adopt(kv, 0, slot, b, e->blocks[0][b]);
        if (kv->has_kind[1] && b >= first_local / kv->block && e->blocks[1][b] >= 0)
            g3_kv_adopt(kv, 1, slot, b, e->blocks[1][b]);
    }
}

int g3_pc_blocks(const g3_prefix_cache *pc) {
    int n = 0;
    for (int i = 0; i < pc->n; i++)
        for (int k = 0; k < 2; k++)
            for (int b = 0; b < pc->e[i].n_blocks; b++) n += pc->e[i].blocks[k][b] >= 0;
    return n;
}
