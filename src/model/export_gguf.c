/* Writing a loaded model as GGUF (see export_gguf.h). Each matrix is converted row by row (dequantize to float,
 * quantize to the target) inside the writer's fill callback, so memory stays at one tensor's worth. */
#include "model/export_gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "format/gguf.h"
#include "model/dtype.h"
#include "tokenizer/tokenizer.h"

uint32_t g3_export_type_for(uint32_t type, int64_t k) {
    type = g3_dtype_fallback(type, k); /* llama.cpp's: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 */
    if (g3_row_bytes(type, k)) return type;
    if (g3_row_bytes(G3_DTYPE_Q8_0, k) && type != G3_DTYPE_F32 && type != G3_DTYPE_F16 && type != G3_DTYPE_BF16)
        return G3_DTYPE_Q8_0;
    return G3_DTYPE_F16;
}

typedef struct fill_ctx {
    const g3_weight *w;
    uint32_t type;
    int progress;
    const char *name;
} fill_ctx;

static g3_status fill_matrix(void *ctx, void *dst, size_t nbytes, g3_error *err) {
    const fill_ctx *f = ctx;
    const g3_weight *w = f->w;
    size_t in_row = g3_row_bytes(w->type, w->k), out_row = g3_row_bytes(f->type, w->k);
    if (out_row * (size_t)w->n != nbytes) return g3_fail(err, G3_ERR_ARG, "%s: size mismatch", f->name);
    if (f->type == w->type) { /* same type: copy the bytes as they are */
        memcpy(dst, w->data, nbytes);
        return G3_OK;
    }
    float *row = malloc(sizeof(float) * (size_t)w->k);
    if (!row) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    g3_status rc = G3_OK;
    for (int64_t r = 0; r < w->n && rc == G3_OK; r++) {
        g3_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * in_row, row, w->k);
        rc = g3_quantize_row(f->type, row, (uint8_t *)dst + (size_t)r * out_row, w->k, err);
    }
    free(row);
    if (f->progress) fprintf(stderr, "  %-28s %-5s -> %-5s [%lld, %lld]\n", f->name, g3_dtype_name((g3_dtype)w->type),
                             g3_dtype_name((g3_dtype)f->type), (long long)w->n, (long long)w->k);
    return rc;
}

static void put_norm(g3_gguf_writer *gw, const char *name, const float *v, int64_t n) {
    int64_t ne[1] = {n};
    g3_gguf_w_tensor(gw, name, G3_DTYPE_F32, 1, ne, v, sizeof(float) * (size_t)n); /* GGUF holds 1 + w: as we do */
}

g3_status g3_model_export_gguf(const g3_model *m, const g3_tokenizer *tok, uint32_t type, const char *path,
                               int progress, g3_error *err) {
    const g3_config *c = &m->cfg;
    if (!g3_dtype_get(type)) return g3_fail(err, G3_ERR_ARG, "unknown target type %u", type);
    g3_gguf_writer *gw;
    G3_TRY(g3_gguf_writer_create(&gw, err));
    int n_mat = 1 + 7 * c->n_layers;
    fill_ctx *fc = calloc((size_t)n_mat, sizeof *fc);
    char (*names)[64] = calloc((size_t)n_mat + 6 * (size_t)c->n_layers + 1, sizeof *names);
    if (!fc || !names) {
        free(fc), free(names);
        g3_gguf_writer_free(gw);
        return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    g3_gguf_w_str(gw, "general.architecture", "gemma3");
    g3_gguf_w_str(gw, "general.name", "gemma3");
    g3_gguf_w_u32(gw, "general.quantization_version", 2);
    g3_gguf_w_u32(gw, "gemma3.context_length", (uint32_t)c->max_ctx);
    g3_gguf_w_u32(gw, "gemma3.embedding_length", (uint32_t)c->hidden);
    g3_gguf_w_u32(gw, "gemma3.feed_forward_length", (uint32_t)c->ffn);
    g3_gguf_w_u32(gw, "gemma3.block_count", (uint32_t)c->n_layers);
    g3_gguf_w_u32(gw, "gemma3.attention.head_count", (uint32_t)c->n_heads);
    g3_gguf_w_u32(gw, "gemma3.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    g3_gguf_w_u32(gw, "gemma3.attention.key_length", (uint32_t)c->head_dim);
    g3_gguf_w_u32(gw, "gemma3.attention.value_length", (uint32_t)c->head_dim);
    g3_gguf_w_f32(gw, "gemma3.attention.layer_norm_rms_epsilon", c->rms_eps);
    g3_gguf_w_f32(gw, "gemma3.rope.freq_base", c->rope_base_global);
    g3_gguf_w_f32(gw, "gemma3.rope.freq_base_swa", c->rope_base_local);
    g3_gguf_w_u32(gw, "gemma3.attention.sliding_window", (uint32_t)c->sliding_window);
    g3_gguf_w_f32(gw, "gemma3.attention.scale", (float)(1.0 / sqrt((double)c->query_pre_attn_scalar)));
    /* the pattern key when the layer kinds follow one; our own per-layer list always */
    int pattern = 0;
    for (int p = 1; p <= c->n_layers && !pattern; p++) {
        int ok = 1;
        for (int l = 0; l < c->n_layers && ok; l++) ok = c->layer_global[l] == ((l + 1) % p == 0);
        if (ok) pattern = p;
    }
    if (pattern) g3_gguf_w_u32(gw, "gemma3.attention.sliding_window_pattern", (uint32_t)pattern);
    int32_t kinds[G3_MAX_LAYERS];
    for (int l = 0; l < c->n_layers; l++) kinds[l] = c->layer_global[l];
    g3_gguf_w_arr_i32(gw, "gemma3.attention.layer_global", kinds, (uint64_t)c->n_layers);
    if (c->rope_scale_global != 1.0f) {
        g3_gguf_w_str(gw, "gemma3.rope.scaling.type", "linear");
        g3_gguf_w_f32(gw, "gemma3.rope.scaling.factor", c->rope_scale_global);
    }
    if (c->attn_softcap > 0) g3_gguf_w_f32(gw, "gemma3.attn_logit_softcapping", c->attn_softcap);
    if (c->final_softcap > 0) g3_gguf_w_f32(gw, "gemma3.final_logit_softcapping", c->final_softcap);
    if (tok) {
        g3_status trc = g3_tok_write_gguf(tok, gw, err);
        if (trc) {
            free(fc), free(names);
            g3_gguf_writer_free(gw);
            return trc;
        }
    } else if (m->chat_template) {
        g3_gguf_w_str(gw, "tokenizer.chat_template", m->chat_template);
    }

    int mi = 0, ni = 0;
    /* matrices: fill callbacks; norms: float vectors as they are */
#define MAT(wptr, fmt, ...)                                                                                            \
    do {                                                                                                               \
        snprintf(names[ni], sizeof names[ni], fmt, __VA_ARGS__);                                                       \
        fc[mi] = (fill_ctx){(wptr), g3_export_type_for(type, (wptr)->k), progress, names[ni]};                        \
        int64_t ne_[2] = {(wptr)->k, (wptr)->n};                                                                       \
        g3_gguf_w_tensor_fill(gw, names[ni], fc[mi].type, 2, ne_, g3_row_bytes(fc[mi].type, (wptr)->k) * (size_t)(wptr)->n, \
                              fill_matrix, &fc[mi]);                                                                   \
        mi++, ni++;                                                                                                    \
    } while (0)
#define NORM(vec, len, fmt, ...)                                                                                       \
    do {                                                                                                               \
        snprintf(names[ni], sizeof names[ni], fmt, __VA_ARGS__);                                                       \
        put_norm(gw, names[ni], (vec), (len));                                                                         \
        ni++;                                                                                                          \
    } while (0)
    MAT(&m->embed, "%s", "token_embd.weight");
    NORM(m->final_norm, c->hidden, "%s", "output_norm.weight");
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *L = &m->layers[l];
        MAT(&L->wq, "blk.%d.attn_q.weight", l);
        MAT(&L->wk, "blk.%d.attn_k.weight", l);
        MAT(&L->wv, "blk.%d.attn_v.weight", l);
        MAT(&L->wo, "blk.%d.attn_output.weight", l);
        MAT(&L->w_gate, "blk.%d.ffn_gate.weight", l);
        MAT(&L->w_up, "blk.%d.ffn_up.weight", l);
        MAT(&L->w_down, "blk.%d.ffn_down.weight", l);
        NORM(L->attn_norm, c->hidden, "blk.%d.attn_norm.weight", l);
        NORM(L->post_attn_norm, c->hidden, "blk.%d.post_attention_norm.weight", l);
        NORM(L->pre_ffn_norm, c->hidden, "blk.%d.ffn_norm.weight", l);
        NORM(L->post_ffn_norm, c->hidden, "blk.%d.post_ffw_norm.weight", l);
        NORM(L->q_norm, c->head_dim, "blk.%d.attn_q_norm.weight", l);
        NORM(L->k_norm, c->head_dim, "blk.%d.attn_k_norm.weight", l);
    }
#undef MAT
#undef NORM
    g3_status rc = g3_gguf_writer_write(gw, path, err);
    g3_gguf_writer_free(gw);
    free(fc), free(names);
    return rc;
}
