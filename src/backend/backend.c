/* Backend registry. */
#include "backend/backend.h"

#include <string.h>

#include "core/status.h"

#ifdef G3_HAVE_VULKAN
#include "backend/vulkan/vulkan_api.h"
#endif

int g3_layers_of_kind(const g3_config *c, int kind) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += (c->layer_global[l] ? 0 : 1) == kind;
    return n;
}

const g3_backend_ops *g3_backend_find(const char *name) {
    static const g3_backend_ops *all[] = {
#ifdef G3_HAVE_CUDA
        &g3_backend_cuda,
#endif
        &g3_backend_cpu,
#ifdef G3_HAVE_VULKAN
        &g3_backend_vulkan, /* after the CPU: "auto" must not pick a software Vulkan device (lavapipe) */
#endif
    };
    if (!name || !*name || !strcmp(name, "auto")) return all[0];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    return NULL;
}

/* Checks a batch against the configuration before a backend touches memory through it: token ids, positions,
 * sequence slots, every KV block a row reads or writes mapped, output rows increasing. */
g3_status g3_batch_check(const g3_config *c, const g3_backend_cfg *cfg, const g3_batch *bt, g3_error *err) {
    int ctx = cfg->max_blocks_per_seq * cfg->kv_block;
    int has_kind[2] = {g3_layers_of_kind(c, 0) > 0, g3_layers_of_kind(c, 1) > 0};
    if (bt->n_rows <= 0 || bt->n_rows > cfg->max_rows)
        return g3_fail(err, G3_ERR_ARG, "batch of %d rows (this backend takes 1..%d)", bt->n_rows, cfg->max_rows);
    int nb[2] = {cfg->n_blocks_global, cfg->n_blocks_local};
    for (int r = 0; r < bt->n_rows; r++) {
        int tok = bt->token[r], pos = bt->pos[r], seq = bt->seq[r];
        if (tok < 0 || tok >= c->vocab)
            return g3_fail(err, G3_ERR_ARG, "token id %d at row %d is outside the vocabulary (0..%d)", tok, r,
                           c->vocab - 1);
        if (pos < 0 || pos >= ctx) return g3_fail(err, G3_ERR_ARG, "position %d outside the context %d", pos, ctx);
        if (seq < 0 || seq >= cfg->max_seqs) return g3_fail(err, G3_ERR_ARG, "sequence slot %d out of range", seq);
        for (int kind = 0; kind < 2; kind++) {
            if (!has_kind[kind]) continue;
            const int32_t *tab = (kind ? bt->bt_local : bt->bt_global) + (size_t)seq * (size_t)cfg->max_blocks_per_seq;
            int first = kind ? (pos - c->sliding_window + 1) : 0;
            if (first < 0) first = 0;
            for (int blk = first / cfg->kv_block; blk <= pos / cfg->kv_block; blk++)
                if (tab[blk] < 0 || tab[blk] >= nb[kind])
                    return g3_fail(err, G3_ERR_ARG, "row %d (seq %d, pos %d): %s KV block %d is not mapped (%d)", r,
                                   seq, pos, kind ? "sliding" : "global", blk, tab[blk]);
        }
    }
    for (int i = 0; i < bt->n_out; i++)
        if (bt->out_rows[i] < 0 || bt->out_rows[i] >= bt->n_rows || (i && bt->out_rows[i] <= bt->out_rows[i - 1]))
            return g3_fail(err, G3_ERR_ARG, "output row list is not increasing within 0..%d", bt->n_rows - 1);
    return G3_OK;
}
