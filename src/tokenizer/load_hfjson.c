/* Loader of a Hugging Face tokenizer.json with a BPE model, as Gemma ships it:
 *   "model": {"type": "BPE", "vocab": {piece: id}, "merges": ["a b" | ["a", "b"]], "byte_fallback": true,
 *             "unk_token": "<unk>"},
 *   "added_tokens": [{"id", "content", "special"}], "normalizer": Replace(" " -> "▁") [+ Prepend("▁")],
 *   "pre_tokenizer": null (or Metaspace without splitting).
 * tokenizer.json has no scores: a piece's priority is the rank of the first merge that produces it, which is how
 * the converter ordered the merges (by the SentencePiece score of the merged piece), so the SentencePiece merge
 * rule run with these priorities gives the library's ids. Types: <0xXX> pieces are BYTE (with byte_fallback),
 * unk_token is UNKNOWN, special added tokens are CONTROL when they are bos/eos/pad and user-defined markers
 * otherwise, non-special added tokens are plain user-defined pieces (always matched whole). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* bos/eos/pad names: from tokenizer_config.json next to the file when it says, else Gemma's. */
static void control_names(const char *path, char names[3][64]) {
    snprintf(names[0], 64, "<bos>");
    snprintf(names[1], 64, "<eos>");
    snprintf(names[2], 64, "<pad>");
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s", path);
    char *slash = strrchr(cfg, '/');
    snprintf(slash ? slash + 1 : cfg, sizeof cfg - (size_t)(slash ? slash + 1 - cfg : 0), "tokenizer_config.json");
    FILE *f = fopen(cfg, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) == (size_t)n) {
        s[n] = 0;
        cJSON *j = cJSON_Parse(s);
        static const char *keys[3] = {"bos_token", "eos_token", "pad_token"};
        for (int k = 0; j && k < 3; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
            if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
            if (cJSON_IsString(v)) snprintf(names[k], 64, "%s", v->valuestring);
        }
        cJSON_Delete(j);
    }
    free(s);
    fclose(f);
}

/* Settings from the normalizer / pre_tokenizer that SentencePiece expresses in its normalizer_spec. */
static g3_status read_pipeline(g3_tokenizer *t, const cJSON *root, const char *path, g3_error *err) {
    t->escape_ws = 0;
    t->add_dummy_prefix = 0;
    t->remove_extra_ws = 0;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *list = NULL;
    if (cJSON_IsObject(norm)) {
        const char *ty = str_of(norm, "type");
        if (ty && !strcmp(ty, "Sequence")) list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
    }
    const cJSON *e = NULL;
    int count = list ? cJSON_GetArraySize(list) : (cJSON_IsObject(norm) ? 1 : 0);
    for (int i = 0; i < count; i++) {
        e = list ? cJSON_GetArrayItem(list, i) : norm;
        const char *ty = str_of(e, "type");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(e, "pattern");
        const char *pat_s = cJSON_IsObject(pat) ? str_of(pat, "String") : NULL;
        const char *content = str_of(e, "content");
        const char *prepend = str_of(e, "prepend");
        if (ty && !strcmp(ty, "Replace") && pat_s && content && !strcmp(pat_s, " ") &&
            !strcmp(content, "\xE2\x96\x81")) {
            t->escape_ws = 1;
        } else if (ty && !strcmp(ty, "Prepend") && prepend && !strcmp(prepend, "\xE2\x96\x81")) {
            t->add_dummy_prefix = 1;
        } else {
            return g3_fail(err, G3_ERR_UNSUPPORTED,
                           "%s: normalizer '%s' is not supported (only Replace ' '->'\xE2\x96\x81' and Prepend)", path,
                           ty ? ty : "?");
        }
    }
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (cJSON_IsObject(pre)) {
        const char *ty = str_of(pre, "type");
        const cJSON *split = cJSON_GetObjectItemCaseSensitive(pre, "split");
        if (!ty || strcmp(ty, "Metaspace") || cJSON_IsTrue(split))
            return g3_fail(err, G3_ERR_UNSUPPORTED,
                           "%s: pre_tokenizer '%s' is not supported (SentencePiece BPE has none; Metaspace without "
                           "split is accepted)",
                           path, ty ? ty : "?");
        t->escape_ws = 1;
        const char *scheme = str_of(pre, "prepend_scheme");
        if ((scheme && strcmp(scheme, "never") != 0) || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space")))
            t->add_dummy_prefix = 1;
    }
    return G3_OK;
}

static g3_status load(g3_tokenizer *t, const cJSON *root, const char *path, g3_error *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mtype = cJSON_IsObject(model) ? str_of(model, "type") : NULL;
    if (!mtype) return g3_fail(err, G3_ERR_FORMAT, "%s: no model.type", path);
    if (strcmp(mtype, "BPE") != 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: model.type is '%s'; only BPE is supported", path, mtype);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) return g3_fail(err, G3_ERR_FORMAT, "%s: model.vocab is not an object", path);
    if (!cJSON_IsArray(merges)) return g3_fail(err, G3_ERR_FORMAT, "%s: model.merges is not an array", path);
    int byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    const char *unk = str_of(model, "unk_token");

    /* size = largest id + 1 */
    long n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (1 << 24))
            return g3_fail(err, G3_ERR_FORMAT, "%s: model.vocab[\"%.40s\"] is not an id in 0..16777215", path, e->string);
        if (e->valueint + 1 > n) n = e->valueint + 1;
    }
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(e, added) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) || !str_of(e, "content"))
                return g3_fail(err, G3_ERR_FORMAT, "%s: an added_tokens entry has no valid id/content", path);
            if (id->valueint + 1 > n) n = id->valueint + 1;
        }
    }
    G3_TRY(g3_tok_init(t, (int)n, path, err));
    G3_TRY(read_pipeline(t, root, path, err));
    t->byte_fallback = byte_fallback;
    char names[3][64];
    control_names(path, names);

    cJSON_ArrayForEach(e, vocab) {
        const char *s = e->string;
        size_t len = strlen(s);
        int type = G3_PIECE_NORMAL;
        if (byte_fallback && len == 6 && !strncmp(s, "<0x", 3) && s[5] == '>') type = G3_PIECE_BYTE;
        if (unk && !strcmp(s, unk)) type = G3_PIECE_UNKNOWN;
        if (t->pieces[e->valueint].len != UINT32_MAX)
            return g3_fail(err, G3_ERR_FORMAT, "%s: model.vocab gives id %d to two pieces", path, e->valueint);
        G3_TRY(g3_tok_set_piece(t, e->valueint, s, len, 0.0f, type, err));
    }
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(e, added) {
            int id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
            const char *s = str_of(e, "content");
            int special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
            int type = G3_PIECE_USER_DEFINED;
            if (unk && !strcmp(s, unk)) type = G3_PIECE_UNKNOWN;
            else if (special && (!strcmp(s, names[0]) || !strcmp(s, names[1]) || !strcmp(s, names[2])))
                type = G3_PIECE_CONTROL;
            else if (byte_fallback && strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>')
                type = G3_PIECE_BYTE;
            /* an added token overrides the vocab entry of the same id */
            G3_TRY(g3_tok_set_piece(t, id, s, strlen(s), 0.0f, type, err));
            t->pieces[id].special = (uint8_t)(type == G3_PIECE_USER_DEFINED && special);
        }
    }
    t->special_known = 1;
    G3_TRY(g3_tok_finalize(t, err));

    /* priorities: score = -(rank of the first merge producing the piece); pieces no merge produces rank last */
    int n_merges = cJSON_GetArraySize(merges);
    const float unranked = -(float)n_merges - 1.0f;
    for (int i = 0; i < t->n; i++) t->pieces[i].score = unranked;
    char *buf = NULL;
    size_t cap = 0;
    int rank = 0;
    g3_status rc = G3_OK;
    cJSON_ArrayForEach(e, merges) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
            cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring;
            b = cJSON_GetArrayItem(e, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else if (cJSON_IsString(e)) {
            /* "left right": split at the space whose halves are both pieces */
            const char *s = e->valuestring;
            for (const char *sp = strchr(s, ' '); sp; sp = strchr(sp + 1, ' ')) {
                if (g3_tok_find_norm(t, s, (size_t)(sp - s)) >= 0 || g3_tok_find_resv(t, s, (size_t)(sp - s)) >= 0) {
                    a = s;
                    la = (size_t)(sp - s);
                    b = sp + 1;
                    lb = strlen(b);
                    break;
                }
            }
        }
        if (!a) {
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: model.merges[%d] is not a pair of pieces", path, rank);
            break;
        }
        if (la + lb > cap) {
            cap = (la + lb) * 2 + 64;
            char *nb = realloc(buf, cap);
            if (!nb) {
                rc = g3_fail(err, G3_ERR_NOMEM, "out of memory");
                break;
            }
            buf = nb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t id = g3_tok_find_norm(t, buf, la + lb);
        if (id >= 0 && t->pieces[id].score == unranked) t->pieces[id].score = -(float)rank;
        rank++;
    }
    free(buf);
    g3_tok_sync_slots(t); /* the maps were built before the ranks were known */
    return rc;
}

g3_status g3_tok_load_hfjson(g3_tokenizer *t, const char *path, g3_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return g3_fail(err, G3_ERR_IO, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        return g3_fail(err, G3_ERR_IO, "%s: cannot read %ld bytes", path, n);
    }
    fclose(f);
    s[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(s, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - s) : 0;
        free(s);
        return g3_fail(err, G3_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
    }
    free(s);
    g3_status rc = load(t, root, path, err);
    cJSON_Delete(root);
    if (rc != G3_OK) g3_tok_deinit(t);
    return rc;
}
