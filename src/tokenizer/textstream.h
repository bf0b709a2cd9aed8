/* Text side of a streamed completion: turns the bytes of generated tokens into valid UTF-8 text deltas and cuts
 * the text at the first stop string. Text that might still become part of a stop string, and the incomplete tail
 * of a UTF-8 sequence, are held back until the next bytes decide them.
 *
 *   token bytes ──utf8 stage──▶ valid UTF-8 (invalid bytes -> U+FFFD, incomplete tail held)
 *               ──stop stage──▶ released text (suffix that is a prefix of a stop string held) ──▶ client
 */
#ifndef G3_TOKENIZER_TEXTSTREAM_H
#define G3_TOKENIZER_TEXTSTREAM_H

#include <stddef.h>

/* A growable byte buffer, always NUL-terminated when data != NULL. */
typedef struct g3_buf {
    char *data;
    size_t len, cap;
    int oom; /* set once an allocation failed; later appends are dropped */
} g3_buf;

void g3_buf_append(g3_buf *b, const void *p, size_t n);
void g3_buf_puts(g3_buf *b, const char *s);
void g3_buf_printf(g3_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void g3_buf_consume(g3_buf *b, size_t n); /* drops the first n bytes */
void g3_buf_free(g3_buf *b);

#define G3_SRV_MAX_STOPS 16

typedef struct g3_textstream {
    char utf8_tail[4];  /* bytes of an incomplete UTF-8 sequence */
    int n_tail;
    g3_buf held;        /* valid UTF-8 not yet released (could start a stop string) */
    const char *const *stops; /* borrowed; each non-empty, NUL-terminated */
    int n_stops;
    int stopped;        /* a stop string matched: everything after it is dropped */
} g3_textstream;

void g3_textstream_init(g3_textstream *t, const char *const *stops, int n_stops);
void g3_textstream_deinit(g3_textstream *t);
/* Feeds n bytes; appends the text that can be released to out. Returns 1 once a stop string has matched (the text
 * before it is released, the rest and all later input dropped), else 0. */
int g3_textstream_push(g3_textstream *t, const char *bytes, size_t n, g3_buf *out);
/* End of generation: releases what is held (an incomplete UTF-8 tail becomes U+FFFD). */
void g3_textstream_flush(g3_textstream *t, g3_buf *out);

/* Length of the longest valid UTF-8 prefix of s[0..n) that ends on a character boundary, replacing nothing:
 * helper for callers that must not split characters. */
size_t g3_utf8_complete_prefix(const char *s, size_t n);
/* Appends s[0..n) to out with every invalid UTF-8 sequence replaced by U+FFFD (an incomplete tail included). */
void g3_utf8_sanitize(const char *s, size_t n, g3_buf *out);

#endif
