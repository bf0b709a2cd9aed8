/* Helpers shared by the tokenizer tests (header-only, static): the Python that has the sentencepiece library,
 * running the helper scripts in tests/tok/, record files (u32 length + bytes / u32 count + i32 ids), the
 * fixtures' reference.json, and a small seeded random generator. */
#ifndef G3_TOK_TESTUTIL_H
#define G3_TOK_TESTUTIL_H

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "testutil.h"

#define TT_FN static __attribute__((unused))

/* Runs a shell command line; returns its exit status (or -1). Prints the command when it fails. */
TT_FN int tt_sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    int rc = st == -1 ? -1 : (WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (rc != 0) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc;
}

TT_FN int tt_sh_quiet(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return st == -1 ? -1 : (WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* A python3 able to import sentencepiece ($G3_PYTHON, /usr/bin/python3, python3), or NULL. */
TT_FN const char *tt_python_spm(void) {
    static char found[512];
    const char *env = getenv("G3_PYTHON");
    const char *cands[3] = {env && *env ? env : NULL, "/usr/bin/python3", "python3"};
    for (int i = 0; i < 3; i++) {
        if (!cands[i]) continue;
        if (tt_sh_quiet("%s -c 'import sentencepiece' >/dev/null 2>&1", cands[i]) == 0) {
            snprintf(found, sizeof found, "%s", cands[i]);
            return found;
        }
    }
    return NULL;
}

/* Any python3 (for the standard-library-only helpers). */
TT_FN const char *tt_python_any(void) {
    const char *p = tt_python_spm();
    if (p) return p;
    if (tt_sh_quiet("/usr/bin/python3 -c 'pass' >/dev/null 2>&1") == 0) return "/usr/bin/python3";
    if (tt_sh_quiet("python3 -c 'pass' >/dev/null 2>&1") == 0) return "python3";
    return NULL;
}

/* Fails the test with the install hint when the reference library is missing. */
#define TT_REQUIRE_SPM(py)                                                                                         \
    do {                                                                                                           \
        (py) = tt_python_spm();                                                                                    \
        if (!(py))                                                                                                 \
            fail_msg("the reference library is missing: no python3 can import sentencepiece "                      \
                     "(Debian: apt-get install python3-sentencepiece; or set G3_PYTHON)");                         \
    } while (0)

/* ---- record files ---------------------------------------------------------------------------------------- */
typedef struct tt_texts {
    char **s;
    size_t *len;
    int n, cap;
} tt_texts;

TT_FN void tt_texts_add(tt_texts *t, const char *s, size_t len) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 256;
        t->s = realloc(t->s, (size_t)t->cap * sizeof *t->s);
        t->len = realloc(t->len, (size_t)t->cap * sizeof *t->len);
        assert_non_null(t->s);
        assert_non_null(t->len);
    }
    t->s[t->n] = malloc(len + 1);
    assert_non_null(t->s[t->n]);
    memcpy(t->s[t->n], s, len);
    t->s[t->n][len] = 0;
    t->len[t->n++] = len;
}

TT_FN void tt_texts_free(tt_texts *t) {
    for (int i = 0; i < t->n; i++) free(t->s[i]);
    free(t->s);
    free(t->len);
    memset(t, 0, sizeof *t);
}

TT_FN void tt_write_texts(const char *path, const tt_texts *t) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < t->n; i++) {
        uint32_t l = (uint32_t)t->len[i];
        fwrite(&l, 4, 1, f);
        fwrite(t->s[i], 1, t->len[i], f);
    }
    fclose(f);
}

TT_FN void tt_read_texts(const char *path, tt_texts *t) {
    size_t n;
    char *d = tu_read_file(path, &n);
    assert_non_null(d);
    for (size_t i = 0; i + 4 <= n;) {
        uint32_t l;
        memcpy(&l, d + i, 4);
        i += 4;
        assert_true(i + l <= n);
        tt_texts_add(t, d + i, l);
        i += l;
    }
    free(d);
}

typedef struct tt_ids {
    int32_t **v;
    int *n;
    int count, cap;
} tt_ids;

TT_FN void tt_ids_add(tt_ids *a, const int32_t *v, int n) {
    if (a->count == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->v = realloc(a->v, (size_t)a->cap * sizeof *a->v);
        a->n = realloc(a->n, (size_t)a->cap * sizeof *a->n);
        assert_non_null(a->v);
        assert_non_null(a->n);
    }
    a->v[a->count] = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    assert_non_null(a->v[a->count]);
    if (n) memcpy(a->v[a->count], v, (size_t)n * sizeof(int32_t));
    a->n[a->count++] = n;
}

TT_FN void tt_ids_free(tt_ids *a) {
    for (int i = 0; i < a->count; i++) free(a->v[i]);
    free(a->v);
    free(a->n);
    memset(a, 0, sizeof *a);
}

TT_FN void tt_read_ids(const char *path, tt_ids *a) {
    size_t n;
    char *d = tu_read_file(path, &n);
    assert_non_null(d);
    for (size_t i = 0; i + 4 <= n;) {
        uint32_t c;
        memcpy(&c, d + i, 4);
        i += 4;
        assert_true(i + 4 * (size_t)c <= n);
        int32_t *tmp = malloc(4 * (size_t)c + 4);
        assert_non_null(tmp);
        memcpy(tmp, d + i, 4 * (size_t)c);
        tt_ids_add(a, tmp, (int)c);
        free(tmp);
        i += 4 * (size_t)c;
    }
    free(d);
}

TT_FN void tt_write_ids(const char *path, const tt_ids *a) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < a->count; i++) {
        uint32_t c = (uint32_t)a->n[i];
        fwrite(&c, 4, 1, f);
        fwrite(a->v[i], 4, c, f);
    }
    fclose(f);
}

/* ---- fixtures --------------------------------------------------------------------------------------------- */
/* reference.json of a fixture folder, parsed (caller deletes); NULL if the fixture is absent. */
TT_FN cJSON *tt_reference(const char *fixture_dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/reference.json", fixture_dir);
    size_t n;
    char *s = tu_read_file(path, &n);
    if (!s) return NULL;
    cJSON *j = cJSON_ParseWithLength(s, n);
    free(s);
    return j;
}

/* ---- random ----------------------------------------------------------------------------------------------- */
TT_FN uint64_t tt_rng_state = 0x9E3779B97F4A7C15ull;
TT_FN void tt_seed(uint64_t s) { tt_rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
TT_FN uint64_t tt_rand(void) {
    uint64_t x = tt_rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return tt_rng_state = x;
}
TT_FN int tt_randint(int lo, int hi) { return lo + (int)(tt_rand() % (uint64_t)(hi - lo + 1)); }

/* Appends code point c as UTF-8 (surrogates allowed: they make invalid UTF-8 on purpose). */
TT_FN size_t tt_put_cp(char *o, uint32_t c) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | ((c >> 6) & 63)); o[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | ((c >> 12) & 63)); o[2] = (char)(0x80 | ((c >> 6) & 63));
    o[3] = (char)(0x80 | (c & 63));
    return 4;
}

/* 1 if s[0..n) is well-formed UTF-8. */
TT_FN int tt_valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t need = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
        if (!need || i + need > n) return 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (need > 1 && (u[i + 1] < lo || u[i + 1] > hi)) return 0;
        for (size_t k = 2; k < need; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        i += need;
    }
    return 1;
}

#endif
