/* g3_tokenizer_load: picks the vocabulary source of a model path (a .gguf file, an HF folder with tokenizer.model
 * or else tokenizer.json, or one of those files directly) and reads the HF folder's tokenizer_config.json for the
 * special flags of added tokens and the chat template. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tokenizer.h"

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Whole file, NUL-terminated; NULL with errno set when unreadable. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 1 << 17;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, 65536, f);
        n += got;
        if (got < 65536) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* A JSON file of an HF folder: NULL without error when missing. */
static g3_status read_json(const char *path, cJSON **out, g3_error *err) {
    *out = NULL;
    if (!is_file(path)) return G3_OK;
    size_t len;
    char *s = slurp(path, &len);
    if (!s) return g3_fail(err, G3_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, len, &end, 0);
    if (!j) {
        size_t at = end ? (size_t)(end - s) : 0;
        free(s);
        return g3_fail(err, G3_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
    }
    free(s);
    *out = j;
    return G3_OK;
}

g3_status g3_tok_load_hfconfig(g3_tokenizer *t, const char *dir, g3_error *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *cfg;
    G3_TRY(read_json(path, &cfg, err));
    if (cfg) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        const char *tmpl = NULL;
        if (cJSON_IsString(ct)) {
            tmpl = ct->valuestring;
        } else if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": "..."}, ...] */
            const cJSON *e;
            cJSON_ArrayForEach(e, ct) {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (cJSON_IsString(tp) && (!tmpl || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))))
                    tmpl = tp->valuestring;
            }
        }
        if (tmpl && !t->chat_template) {
            t->chat_template = strdup(tmpl);
            if (!t->chat_template) {
                cJSON_Delete(cfg);
                return g3_fail(err, G3_ERR_NOMEM, "out of memory");
            }
        }
        /* "added_tokens_decoder": {"106": {"content": "<end_of_turn>", "special": true}, ...}: a user-defined
         * piece is a markup marker (matched only with parse_special) exactly when it is listed as special. */
        const cJSON *atd = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
        if (cJSON_IsObject(atd)) {
            for (int i = 0; i < t->n; i++)
                if (t->pieces[i].type == G3_PIECE_USER_DEFINED) g3_tok_set_special(t, i, 0);
            const cJSON *e;
            cJSON_ArrayForEach(e, atd) {
                char *endp;
                long id = strtol(e->string, &endp, 10);
                const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
                if (*endp || id < 0 || id >= t->n || !cJSON_IsString(content)) continue;
                g3_tok_piece *p = &t->pieces[id];
                size_t cl = strlen(content->valuestring);
                if (p->type != G3_PIECE_USER_DEFINED || cl != p->len || memcmp(content->valuestring, t->arena + p->off, cl))
                    continue;
                g3_tok_set_special(t, (int)id, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")));
            }
            t->special_known = 1;
        }
        cJSON_Delete(cfg);
    }
    if (!t->chat_template) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        if (is_file(path)) {
            t->chat_template = slurp(path, NULL);
            if (!t->chat_template) return g3_fail(err, G3_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        }
    }
    return G3_OK;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char m[4] = {0};
    size_t got = fread(m, 1, 4, f);
    fclose(f);
    return got == 4 && memcmp(m, "GGUF", 4) == 0;
}

g3_status g3_tokenizer_load(const char *model_path, g3_tokenizer **out, g3_error *err) {
    *out = NULL;
    if (!model_path || !*model_path) return g3_fail(err, G3_ERR_ARG, "g3_tokenizer_load: empty model path");
    struct stat st;
    if (stat(model_path, &st) != 0) return g3_fail(err, G3_ERR_IO, "%s: %s", model_path, strerror(errno));
    g3_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    char dir[1024], path[1200];
    g3_status rc;
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", model_path);
        snprintf(path, sizeof path, "%s/tokenizer.model", dir);
        if (is_file(path)) {
            rc = g3_tok_load_spm(t, path, err);
        } else {
            snprintf(path, sizeof path, "%s/tokenizer.json", dir);
            if (is_file(path)) rc = g3_tok_load_hfjson(t, path, err);
            else
                rc = g3_fail(err, G3_ERR_IO, "%s: no tokenizer.model or tokenizer.json in this folder", model_path);
        }
        if (rc == G3_OK) rc = g3_tok_load_hfconfig(t, dir, err);
    } else if (is_gguf(model_path)) {
        rc = g3_tok_load_gguf(t, model_path, err);
    } else {
        snprintf(dir, sizeof dir, "%s", model_path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        if (has_suffix(model_path, ".json")) rc = g3_tok_load_hfjson(t, model_path, err);
        else rc = g3_tok_load_spm(t, model_path, err);
        if (rc == G3_OK) rc = g3_tok_load_hfconfig(t, dir, err);
    }
    if (rc != G3_OK) {
        g3_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return G3_OK;
}
