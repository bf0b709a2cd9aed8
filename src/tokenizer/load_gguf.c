/* Loader of the vocabulary in GGUF metadata (tokenizer.ggml.model "llama" = SentencePiece):
 *   tokenizer.ggml.tokens [n] string, .scores [n] f32, .token_type [n] i32 (SentencePiece's type numbers),
 *   .bos/.eos/.unknown/.padding_token_id, .add_space_prefix, .remove_extra_whitespaces, tokenizer.chat_template.
 * llama.cpp's converter types every added special token CONTROL (<unk>, <mask>, <start_of_turn>, ... alike), so
 * the SentencePiece types are restored: bos/eos/pad stay CONTROL, the unknown id becomes UNKNOWN, and the other
 * CONTROL tokens become user-defined markers (matched whole only with parse_special), as in tokenizer.model. */
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

/* Element i of a numeric array as double; 0 if the type is not numeric. */
static double arr_num(const g3_gguf_kv *kv, uint64_t i) {
    size_t es = g3_gguf_type_size(kv->arr_type);
    const uint8_t *p = kv->arr_data + i * es;
    switch (kv->arr_type) {
    case G3_GGUF_F32: { float v; memcpy(&v, p, 4); return v; }
    case G3_GGUF_F64: { double v; memcpy(&v, p, 8); return v; }
    case G3_GGUF_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case G3_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case G3_GGUF_I8: return (int8_t)p[0];
    case G3_GGUF_U8: return p[0];
    case G3_GGUF_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case G3_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case G3_GGUF_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case G3_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    default: return 0;
    }
}

static int is_numeric(g3_gguf_type t) { return t != G3_GGUF_STRING && t != G3_GGUF_ARRAY && t != G3_GGUF_BOOL; }

static int get_id(const g3_gguf *g, const char *key, int n) {
    int64_t v;
    if (!g3_gguf_get_int(g, key, &v) || v < 0 || v >= n) return -1;
    return (int)v;
}

static int get_bool(const g3_gguf *g, const char *key, int dflt) {
    const g3_gguf_kv *kv = g3_gguf_find(g, key);
    if (!kv || kv->type == G3_GGUF_STRING || kv->type == G3_GGUF_ARRAY) return dflt;
    return kv->v.u != 0;
}

static g3_status load(g3_tokenizer *t, const g3_gguf *g, const char *path, g3_error *err) {
    char model[64] = "";
    if (!g3_gguf_get_str(g, "tokenizer.ggml.model", model, sizeof model))
        return g3_fail(err, G3_ERR_FORMAT, "%s: no tokenizer.ggml.model key (no vocabulary in this file)", path);
    if (strcmp(model, "llama") != 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.model is '%s'; only SentencePiece vocabularies ('llama') are supported", path,
                       model);
    const g3_gguf_kv *toks = g3_gguf_find(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != G3_GGUF_ARRAY || toks->arr_type != G3_GGUF_STRING)
        return g3_fail(err, G3_ERR_FORMAT, "%s: tokenizer.ggml.tokens missing or not a string array", path);
    if (toks->arr_n == 0 || toks->arr_n > (1u << 24))
        return g3_fail(err, G3_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", path,
                       (unsigned long long)toks->arr_n);
    int n = (int)toks->arr_n;
    const g3_gguf_kv *scores = g3_gguf_find(g, "tokenizer.ggml.scores");
    const g3_gguf_kv *types = g3_gguf_find(g, "tokenizer.ggml.token_type");
    if (!scores || scores->type != G3_GGUF_ARRAY || !is_numeric(scores->arr_type) || scores->arr_n != toks->arr_n)
        return g3_fail(err, G3_ERR_FORMAT, "%s: tokenizer.ggml.scores missing, not numeric, or not %d long", path, n);
    if (types && (types->type != G3_GGUF_ARRAY || !is_numeric(types->arr_type) || types->arr_n != toks->arr_n))
        return g3_fail(err, G3_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not a numeric array of %d", path, n);

    G3_TRY(g3_tok_init(t, n, path, err));
    int bos = get_id(g, "tokenizer.ggml.bos_token_id", n);
    int eos = get_id(g, "tokenizer.ggml.eos_token_id", n);
    int pad = get_id(g, "tokenizer.ggml.padding_token_id", n);
    int unk = get_id(g, "tokenizer.ggml.unknown_token_id", n);
    int eot = get_id(g, "tokenizer.ggml.eot_token_id", n);
    if (unk < 0) { /* fall back to a piece named <unk> */
        for (int i = 0; i < n && unk < 0; i++) {
            g3_gguf_str s = g3_gguf_arr_str(toks, (uint64_t)i);
            if (s.len == 5 && memcmp(s.s, "<unk>", 5) == 0) unk = i;
        }
    }
    int n_byte = 0, n_marker_control = 0;
    for (int i = 0; i < n; i++) {
        g3_gguf_str s = g3_gguf_arr_str(toks, (uint64_t)i);
        if (!s.s || !s.len) return g3_fail(err, G3_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%d] is empty", path, i);
        int type = types ? (int)arr_num(types, (uint64_t)i) : G3_PIECE_NORMAL;
        if (type < G3_PIECE_NORMAL || type > G3_PIECE_BYTE)
            return g3_fail(err, G3_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%d] = %d is not a known type", path, i, type);
        uint8_t special = 0;
        if (i == unk) {
            type = G3_PIECE_UNKNOWN;
        } else if (type == G3_PIECE_UNKNOWN) {
            type = G3_PIECE_CONTROL; /* only one UNKNOWN piece */
        } else if (type == G3_PIECE_CONTROL && i != bos && i != eos && i != pad) {
            type = G3_PIECE_USER_DEFINED;
            special = 1;
            n_marker_control++;
        }
        if (type == G3_PIECE_BYTE) n_byte++;
        G3_TRY(g3_tok_set_piece(t, i, s.s, (size_t)s.len, (float)arr_num(scores, (uint64_t)i), type, err));
        t->pieces[i].special = special;
    }
    /* Files that follow llama.cpp's convention type their markers CONTROL. One that has no CONTROL piece beyond
     * bos/eos/pad typed its markers USER_DEFINED (as tokenizer.model does): then, as for a bare tokenizer.model,
     * user-defined pieces that look like markers (<...>, [...]) are taken for markers. */
    t->special_known = n_marker_control > 0;
    t->byte_fallback = n_byte > 0;
    t->add_dummy_prefix = get_bool(g, "tokenizer.ggml.add_space_prefix", 0);
    t->remove_extra_ws = get_bool(g, "tokenizer.ggml.remove_extra_whitespaces", 0);
    t->unk_id = unk;
    t->bos_id = bos;
    t->eos_id = eos;
    t->pad_id = pad;
    t->eot_id = eot;
    G3_TRY(g3_tok_finalize(t, err));
    const g3_gguf_kv *ct = g3_gguf_find(g, "tokenizer.chat_template");
    if (ct && ct->type == G3_GGUF_STRING) {
        t->chat_template = strndup(ct->str.s, (size_t)ct->str.len);
        if (!t->chat_template) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    }
    return G3_OK;
}

g3_status g3_tok_load_gguf(g3_tokenizer *t, const char *path, g3_error *err) {
    g3_gguf g;
    G3_TRY(g3_gguf_open(&g, path, err));
    g3_status rc = load(t, &g, path, err);
    g3_gguf_close(&g);
    if (rc != G3_OK) g3_tok_deinit(t);
    return rc;
}
