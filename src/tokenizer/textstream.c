/* UTF-8 repair and stop-string hold-back for streamed completions (see textstream.h). */
#include "tokenizer/textstream.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- g3_buf ------------------------------------------------------------------------------------------------ */
static int buf_reserve(g3_buf *b, size_t extra) {
    if (b->oom) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

void g3_buf_append(g3_buf *b, const void *p, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void g3_buf_puts(g3_buf *b, const char *s) { g3_buf_append(b, s, strlen(s)); }

void g3_buf_printf(g3_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0 && buf_reserve(b, (size_t)n)) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void g3_buf_consume(g3_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data) b->data[b->len] = 0;
}

void g3_buf_free(g3_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- UTF-8 ------------------------------------------------------------------------------------------------- */
/* Classifies the sequence at s[0..n): returns its length (1..4) when valid and complete, 0 when invalid (the
 * first byte is to be replaced), or -k when s holds a valid but incomplete prefix of k bytes (only at the end). */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        len = 2;
    } else if (c < 0xF0) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        if (c == 0xED) hi = 0x9F;      /* surrogates */
    } else if (c < 0xF5) {
        len = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        if (c == 0xF4) hi = 0x8F;      /* > U+10FFFF */
    } else {
        return 0;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -i;
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return 0;
    }
    return len;
}

static const char k_replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */

size_t g3_utf8_complete_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k <= 0) break;
        i += (size_t)k;
    }
    return i;
}

/* Appends the valid text of s[0..n) to out, replacing invalid bytes. Returns how many trailing bytes form an
 * incomplete sequence (not consumed) when keep_tail, else replaces them too and returns 0. */
static size_t utf8_repair(const char *s, size_t n, g3_buf *out, int keep_tail) {
    size_t i = 0, run = 0; /* run: start of the current stretch of valid bytes */
    while (i < n) {
        int k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        g3_buf_append(out, s + run, i - run);
        if (k < 0 && keep_tail) return n - i;
        g3_buf_append(out, k_replacement, 3);
        i += k < 0 ? n - i : 1;
        run = i;
    }
    g3_buf_append(out, s + run, n - run);
    return 0;
}

void g3_utf8_sanitize(const char *s, size_t n, g3_buf *out) { utf8_repair(s, n, out, 0); }

/* ---- stop strings ------------------------------------------------------------------------------------------ */
void g3_textstream_init(g3_textstream *t, const char *const *stops, int n_stops) {
    memset(t, 0, sizeof *t);
    t->stops = stops;
    t->n_stops = n_stops;
}

void g3_textstream_deinit(g3_textstream *t) { g3_buf_free(&t->held); }

/* Length of the longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t stop_prefix_suffix(const g3_textstream *t, const char *s, size_t n) {
    size_t best = 0;
    for (int j = 0; j < t->n_stops; j++) {
        size_t sl = strlen(t->stops[j]);
        size_t maxk = sl - 1 < n ? sl - 1 : n;
        for (size_t k = maxk; k > best; k--) {
            if (memcmp(s + n - k, t->stops[j], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* Moves what can be released from held to out; returns 1 when a stop string matched. */
static int release(g3_textstream *t, g3_buf *out, int final) {
    const char *s = t->held.data;
    size_t n = t->held.len;
    if (!n) return 0;
    size_t cut = n;
    int hit = 0;
    for (int j = 0; j < t->n_stops; j++) {
        const char *p = memmem(s, n, t->stops[j], strlen(t->stops[j]));
        if (p && (size_t)(p - s) < cut) {
            cut = (size_t)(p - s);
            hit = 1;
        }
    }
    if (hit) {
        g3_buf_append(out, s, cut);
        t->held.len = 0;
        t->stopped = 1;
        return 1;
    }
    size_t keep = final ? 0 : stop_prefix_suffix(t, s, n);
    g3_buf_append(out, s, n - keep);
    g3_buf_consume(&t->held, n - keep);
    return 0;
}

int g3_textstream_push(g3_textstream *t, const char *bytes, size_t n, g3_buf *out) {
    if (t->stopped) return 1;
    /* Join the previous incomplete tail with the new bytes, repair, keep the new tail. */
    g3_buf tmp = {0};
    g3_buf_append(&tmp, t->utf8_tail, (size_t)t->n_tail);
    g3_buf_append(&tmp, bytes, n);
    size_t tail = utf8_repair(tmp.data ? tmp.data : "", tmp.len, &t->held, 1);
    t->n_tail = (int)tail; /* at most 3 */
    if (tail) memcpy(t->utf8_tail, tmp.data + tmp.len - tail, tail);
    g3_buf_free(&tmp);
    return release(t, out, 0);
}

void g3_textstream_flush(g3_textstream *t, g3_buf *out) {
    if (t->stopped) return;
    if (t->n_tail) {
        g3_buf_append(&t->held, k_replacement, 3);
        t->n_tail = 0;
    }
    release(t, out, 1);
}
