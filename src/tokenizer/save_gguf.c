/* Writes a vocabulary as GGUF metadata in llama.cpp's convention, so that our GGUF loader and llama.cpp read it
 * back with the same meaning: markers (user-defined pieces matched only with parse_special) are typed CONTROL,
 * plain user-defined pieces USER_DEFINED, and the normalizer settings go to add_space_prefix /
 * remove_extra_whitespaces. */
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

g3_status g3_tok_write_gguf(const g3_tokenizer *t, g3_gguf_writer *gw, g3_error *err) {
    char **strs = calloc((size_t)t->n, sizeof *strs);
    float *scores = malloc(sizeof(float) * (size_t)t->n);
    int32_t *types = malloc(sizeof(int32_t) * (size_t)t->n);
    g3_status rc = G3_OK;
    if (!strs || !scores || !types) rc = g3_fail(err, G3_ERR_NOMEM, "out of memory writing the vocabulary");
    for (int i = 0; rc == G3_OK && i < t->n; i++) {
        const g3_tok_piece *p = &t->pieces[i];
        if (memchr(t->arena + p->off, 0, p->len)) {
            rc = g3_fail(err, G3_ERR_UNSUPPORTED, "%s: piece %d contains a NUL byte; GGUF strings are written as C strings",
                         t->source, i);
            break;
        }
        strs[i] = t->arena + p->off; /* NUL-terminated in the arena */
        scores[i] = p->score;
        types[i] = p->type == G3_PIECE_USER_DEFINED && p->special ? G3_PIECE_CONTROL : p->type;
    }
    if (rc == G3_OK) {
        g3_gguf_w_str(gw, "tokenizer.ggml.model", "llama");
        g3_gguf_w_str(gw, "tokenizer.ggml.pre", "default");
        g3_gguf_w_arr_str(gw, "tokenizer.ggml.tokens", (const char *const *)strs, (uint64_t)t->n);
        g3_gguf_w_arr_f32(gw, "tokenizer.ggml.scores", scores, (uint64_t)t->n);
        g3_gguf_w_arr_i32(gw, "tokenizer.ggml.token_type", types, (uint64_t)t->n);
        if (t->bos_id >= 0) g3_gguf_w_u32(gw, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos_id);
        if (t->eos_id >= 0) g3_gguf_w_u32(gw, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos_id);
        if (t->unk_id >= 0) g3_gguf_w_u32(gw, "tokenizer.ggml.unknown_token_id", (uint32_t)t->unk_id);
        if (t->pad_id >= 0) g3_gguf_w_u32(gw, "tokenizer.ggml.padding_token_id", (uint32_t)t->pad_id);
        if (t->eot_id >= 0) g3_gguf_w_u32(gw, "tokenizer.ggml.eot_token_id", (uint32_t)t->eot_id);
        g3_gguf_w_bool(gw, "tokenizer.ggml.add_bos_token", 1);
        g3_gguf_w_bool(gw, "tokenizer.ggml.add_eos_token", 0);
        g3_gguf_w_bool(gw, "tokenizer.ggml.add_space_prefix", t->add_dummy_prefix);
        g3_gguf_w_bool(gw, "tokenizer.ggml.remove_extra_whitespaces", t->remove_extra_ws);
        if (t->chat_template) g3_gguf_w_str(gw, "tokenizer.chat_template", t->chat_template);
    }
    free(strs);
    free(scores);
    free(types);
    return rc;
}
