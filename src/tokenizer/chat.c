/* Gemma 3's chat format, rendered natively (no Jinja engine) exactly as the model's chat template does:
 *
 *   <start_of_turn>user\n{system}\n\n{user text}<end_of_turn>\n<start_of_turn>model\n{reply}<end_of_turn>\n
 *   ... <start_of_turn>model\n                                         (add_generation_prompt)
 *
 * Message text is trimmed as Jinja's `trim` does (Python's str.strip: Unicode whitespace); the system text is
 * not trimmed (the template appends "\n\n" to it as is). Roles must alternate user/model after the optional
 * system message. For ids, the turn markers become their special tokens and the text between them is encoded
 * with special parsing off: a marker typed inside a message stays literal text. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* Python's str.isspace() code points. */
static int is_py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Code point of the well-formed character at s, or UINT32_MAX (then *l = 1). */
static uint32_t decode_at(const uint8_t *s, size_t n, int *l) {
    *l = g3_utf8_valid_len(s, n);
    if (*l == 0) {
        *l = 1;
        return UINT32_MAX;
    }
    if (*l == 1) return s[0];
    uint32_t c = s[0] & (0x7F >> *l);
    for (int k = 1; k < *l; k++) c = (c << 6) | (s[k] & 0x3F);
    return c;
}

static void trim(const char *s, size_t *start, size_t *end) {
    const uint8_t *u = (const uint8_t *)s;
    size_t n = strlen(s), a = 0, b = n;
    while (a < b) {
        int l;
        uint32_t c = decode_at(u + a, b - a, &l);
        if (!is_py_space(c)) break;
        a += (size_t)l;
    }
    while (b > a) {
        size_t p = b - 1; /* start of the last character: back over continuation bytes (at most 3) */
        while (p > a && b - p < 4 && (u[p] & 0xC0) == 0x80) p--;
        int l;
        uint32_t c = decode_at(u + p, b - p, &l);
        if ((size_t)l != b - p) { /* not one whole character: the last byte alone is not whitespace */
            break;
        }
        if (!is_py_space(c)) break;
        b = p;
    }
    *start = a;
    *end = b;
}

/* The rendered prompt as pieces: text runs and markers (0 = <start_of_turn>, 1 = <end_of_turn>). */
typedef struct seg {
    const char *s;
    size_t len;
    int marker; /* -1 = text */
} seg;

typedef struct segs {
    seg *v;
    int n, cap;
} segs;

static g3_status add(segs *a, const char *s, size_t len, int marker, g3_error *err) {
    if (marker < 0 && len == 0) return G3_OK;
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 32;
        seg *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return g3_fail(err, G3_ERR_NOMEM, "out of memory rendering the chat");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (seg){s, len, marker};
    return G3_OK;
}

static g3_status build(const g3_chat_message *msgs, int n, int add_gen, segs *out, g3_error *err) {
    if (n < 0 || (n > 0 && !msgs)) return g3_fail(err, G3_ERR_ARG, "chat: bad message list (n = %d)", n);
    const char *sys = NULL;
    int first = 0;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return g3_fail(err, G3_ERR_ARG, "chat: message %d has no role or content", i);
    if (n > 0 && !strcmp(msgs[0].role, "system")) {
        sys = msgs[0].content;
        first = 1;
    }
    for (int i = first; i < n; i++) {
        const char *r = msgs[i].role;
        int k = i - first;
        int user = !strcmp(r, "user");
        int model = !strcmp(r, "assistant") || !strcmp(r, "model");
        if (!user && !model)
            return g3_fail(err, G3_ERR_ARG,
                           "chat: message %d has role '%s'; expected user or assistant/model (system only first)", i, r);
        if (user != (k % 2 == 0))
            return g3_fail(err, G3_ERR_ARG,
                           "chat: message %d (%s): roles must alternate user/assistant/user/... after the system message",
                           i, r);
        G3_TRY(add(out, NULL, 0, 0, err));
        G3_TRY(add(out, user ? "user\n" : "model\n", user ? 5 : 6, -1, err));
        if (k == 0 && sys) {
            G3_TRY(add(out, sys, strlen(sys), -1, err));
            G3_TRY(add(out, "\n\n", 2, -1, err));
        }
        size_t a, b;
        trim(msgs[i].content, &a, &b);
        G3_TRY(add(out, msgs[i].content + a, b - a, -1, err));
        G3_TRY(add(out, NULL, 0, 1, err));
        G3_TRY(add(out, "\n", 1, -1, err));
    }
    if (add_gen) {
        G3_TRY(add(out, NULL, 0, 0, err));
        G3_TRY(add(out, "model\n", 6, -1, err));
    }
    return G3_OK;
}

static const char *const marker_text[2] = {"<start_of_turn>", "<end_of_turn>"};

g3_status g3_chat_render(const g3_tokenizer *t, const g3_chat_message *msgs, int n, int add_generation_prompt,
                         char **out, g3_error *err) {
    (void)t; /* Gemma 3's format does not depend on the vocabulary */
    *out = NULL;
    segs a = {0};
    g3_status rc = build(msgs, n, add_generation_prompt, &a, err);
    size_t total = 1;
    for (int i = 0; rc == G3_OK && i < a.n; i++) total += a.v[i].marker < 0 ? a.v[i].len : strlen(marker_text[a.v[i].marker]);
    char *s = rc == G3_OK ? malloc(total) : NULL;
    if (rc == G3_OK && !s) rc = g3_fail(err, G3_ERR_NOMEM, "out of memory rendering the chat");
    if (rc == G3_OK) {
        size_t o = 0;
        for (int i = 0; i < a.n; i++) {
            const char *p = a.v[i].marker < 0 ? a.v[i].s : marker_text[a.v[i].marker];
            size_t l = a.v[i].marker < 0 ? a.v[i].len : strlen(p);
            memcpy(s + o, p, l);
            o += l;
        }
        s[o] = 0;
        *out = s;
    }
    free(a.v);
    return rc;
}

g3_status g3_chat_tokenize(const g3_tokenizer *t, const g3_chat_message *msgs, int n, int add_generation_prompt,
                           int32_t **ids, int *n_ids, g3_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!t) return g3_fail(err, G3_ERR_ARG, "g3_chat_tokenize: no tokenizer");
    if (t->sot_id < 0 || t->eot_id < 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: the vocabulary has no <start_of_turn>/<end_of_turn> pieces",
                       t->source);
    segs a = {0};
    g3_i32vec v = {0};
    char *buf = NULL;
    g3_status rc = build(msgs, n, add_generation_prompt, &a, err);
    if (rc == G3_OK && t->bos_id >= 0) rc = g3_i32vec_push(&v, t->bos_id, err);
    /* text between two markers is encoded as one string (merges may cross message boundaries, as they do when
     * the whole rendered prompt is encoded) */
    size_t cap = 0;
    for (int i = 0; rc == G3_OK && i < a.n;) {
        if (a.v[i].marker >= 0) {
            rc = g3_i32vec_push(&v, a.v[i].marker == 0 ? t->sot_id : t->eot_id, err);
            i++;
            continue;
        }
        size_t len = 0;
        int j = i;
        for (; j < a.n && a.v[j].marker < 0; j++) len += a.v[j].len;
        if (len > cap) {
            char *nb = realloc(buf, len);
            if (!nb) {
                rc = g3_fail(err, G3_ERR_NOMEM, "out of memory rendering the chat");
                break;
            }
            buf = nb;
            cap = len;
        }
        size_t o = 0;
        for (int k = i; k < j; k++) {
            memcpy(buf + o, a.v[k].s, a.v[k].len);
            o += a.v[k].len;
        }
        rc = g3_tok_encode(t, buf, len, 0, &v, err);
        i = j;
    }
    free(buf);
    free(a.v);
    if (rc != G3_OK) {
        free(v.v);
        return rc;
    }
    *ids = v.v;
    *n_ids = v.n;
    return G3_OK;
}
