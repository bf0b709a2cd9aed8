/* Decoding ids to text, whole or streamed, as sentencepiece's Decode does it: control pieces vanish, <unk> shows
 * its surface (" ⁇ "), '▁' becomes ' ', runs of byte pieces are joined into UTF-8 characters (a byte that cannot
 * start or continue a well-formed character becomes U+FFFD), and with add_dummy_prefix or
 * remove_extra_whitespaces the leading '▁' of the first visible piece is dropped.
 * The stream holds bytes of a character that is not complete yet, so it never hands out broken UTF-8. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

#define REPLACEMENT "\xEF\xBF\xBD"

struct g3_detok {
    const g3_tokenizer *t;
    uint8_t pend[4];  /* bytes of a character still incomplete (byte-fallback pieces) */
    int n_pend;
    int is_bos_ws;    /* the next visible piece may lose its leading '▁' */
    int bos_ws_seen;  /* the previous piece did lose it */
    size_t n_text;    /* bytes emitted since the stream began */
    char *out;        /* text of the current call */
    size_t out_len, out_cap;
};

static g3_status put(g3_detok *d, const void *s, size_t n, g3_error *err) {
    if (d->out_len + n + 1 > d->out_cap) {
        size_t cap = d->out_cap ? d->out_cap : 256;
        while (cap < d->out_len + n + 1) cap *= 2;
        char *o = realloc(d->out, cap);
        if (!o) return g3_fail(err, G3_ERR_NOMEM, "out of memory while decoding");
        d->out = o;
        d->out_cap = cap;
    }
    memcpy(d->out + d->out_len, s, n);
    d->out_len += n;
    d->out[d->out_len] = 0;
    d->n_text += n;
    return G3_OK;
}

/* Emits the complete characters of the pending bytes; with final, also what can no longer complete. */
static g3_status drain(g3_detok *d, int final, g3_error *err) {
    while (d->n_pend > 0) {
        int l = g3_utf8_valid_len(d->pend, (size_t)d->n_pend);
        if (l == 0 && !final && g3_utf8_incomplete(d->pend, (size_t)d->n_pend)) return G3_OK; /* wait */
        if (l > 0) {
            G3_TRY(put(d, d->pend, (size_t)l, err));
        } else {
            G3_TRY(put(d, REPLACEMENT, 3, err));
            l = 1;
        }
        memmove(d->pend, d->pend + l, (size_t)(d->n_pend - l));
        d->n_pend -= l;
    }
    return G3_OK;
}

static g3_status push_id(g3_detok *d, int32_t id, g3_error *err) {
    const g3_tokenizer *t = d->t;
    if (id < 0 || id >= t->n) return g3_fail(err, G3_ERR_ARG, "token id %d out of range (vocabulary %d)", id, t->n);
    /* the library decodes id -> piece -> id: duplicate piece strings resolve to their first id */
    const g3_tok_piece *p = &t->pieces[id];
    id = g3_tok_piece_to_id(t, t->arena + p->off, p->len);
    p = &t->pieces[id];
    if (p->type == G3_PIECE_BYTE) {
        d->pend[d->n_pend++] = p->byte;
        return drain(d, 0, err);
    }
    G3_TRY(drain(d, 1, err));
    if (d->bos_ws_seen || d->n_text > 0) d->is_bos_ws = 0;
    d->bos_ws_seen = 0;
    if (p->type == G3_PIECE_CONTROL) return G3_OK;
    if (p->type == G3_PIECE_UNKNOWN) return put(d, t->unk_surface, strlen(t->unk_surface), err);
    const char *s = t->arena + p->disp_off;
    size_t n = p->disp_len;
    if (d->is_bos_ws && (t->add_dummy_prefix || t->remove_extra_ws) && p->lead_ws) {
        s++; /* the display text has ' ' where the piece has '▁' */
        n--;
        d->bos_ws_seen = !t->remove_extra_ws;
    }
    return put(d, s, n, err);
}

g3_status g3_detok_create(const g3_tokenizer *t, g3_detok **out, g3_error *err) {
    *out = NULL;
    if (!t) return g3_fail(err, G3_ERR_ARG, "g3_detok_create: no tokenizer");
    g3_detok *d = calloc(1, sizeof *d);
    if (!d) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    d->t = t;
    g3_detok_reset(d);
    *out = d;
    return G3_OK;
}

void g3_detok_free(g3_detok *d) {
    if (!d) return;
    free(d->out);
    free(d);
}

void g3_detok_reset(g3_detok *d) {
    d->n_pend = 0;
    d->is_bos_ws = 1;
    d->bos_ws_seen = 0;
    d->n_text = 0;
    d->out_len = 0;
    if (d->out) d->out[0] = 0;
}

g3_status g3_detok_push(g3_detok *d, int32_t id, const char **text, size_t *len, g3_error *err) {
    d->out_len = 0;
    if (d->out) d->out[0] = 0;
    g3_status rc = push_id(d, id, err);
    *text = d->out ? d->out : "";
    *len = d->out_len;
    return rc;
}

const char *g3_detok_flush(g3_detok *d, size_t *len) {
    d->out_len = 0;
    if (d->out) d->out[0] = 0;
    g3_status rc = drain(d, 1, NULL);
    const char *s = d->out && rc == G3_OK ? d->out : "";
    if (len) *len = rc == G3_OK ? d->out_len : 0;
    /* a new stream starts; the text stays readable until the next call */
    d->n_pend = 0;
    d->is_bos_ws = 1;
    d->bos_ws_seen = 0;
    d->n_text = 0;
    return s;
}

g3_status g3_detokenize(const g3_tokenizer *t, const int32_t *ids, int n, char **out, size_t *len, g3_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (!t) return g3_fail(err, G3_ERR_ARG, "g3_detokenize: no tokenizer");
    if (n < 0 || (n > 0 && !ids)) return g3_fail(err, G3_ERR_ARG, "g3_detokenize: bad id list (n = %d)", n);
    g3_detok d = {0};
    d.t = t;
    d.is_bos_ws = 1;
    g3_status rc = put(&d, "", 0, err); /* allocates, so an empty result is a valid string */
    for (int i = 0; i < n && rc == G3_OK; i++) {
        rc = push_id(&d, ids[i], err);
        if (rc != G3_OK && rc == G3_ERR_ARG) g3_fail_prefix(err, "id %d of %d: ", i, n);
    }
    if (rc == G3_OK) rc = drain(&d, 1, err);
    if (rc != G3_OK) {
        free(d.out);
        return rc;
    }
    *out = d.out;
    if (len) *len = d.out_len;
    return G3_OK;
}
