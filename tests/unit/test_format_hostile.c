/* Damaged and hostile files for the GGUF and safetensors readers. Every really broken file must give an error
 * with a message (naming the file) and never crash or read outside the mapping; run under the sanitizer build.
 *   - truncation at every byte through the whole header, then a spread of lengths through the data;
 *   - random bit flips with fixed seeds (a flipped file may stay valid: then its invariants are checked);
 *   - hand-made files, each a valid base with exactly one defect, next to the undamaged base as a control. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "format_testutil.h"
#include "testutil.h"

static char g_dir[256];

static const char *tmp_path(const char *name) {
    static char p[600];
    if (!g_dir[0]) snprintf(g_dir, sizeof g_dir, "%s", tu_tmpdir());
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

/* ---- what a successful open must guarantee ----------------------------------------------------------------- */
static volatile uint8_t g_sink;

/* [p, p+n) lies in the mapping; its first and last bytes are read (a stray pointer would fault here). */
static int inside(const g3_mmap *m, const void *p, uint64_t n) {
    const uint8_t *b = p;
    if (!(b >= m->data && b <= m->data + m->size && n <= (uint64_t)(m->data + m->size - b))) return 0;
    if (n) g_sink = (uint8_t)(b[0] ^ b[n - 1]);
    return 1;
}

static void check_gguf_invariants(const g3_gguf *g) {
    assert_true(g->alignment >= 1 && (g->alignment & (g->alignment - 1)) == 0);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const g3_gguf_kv *kv = &g->kv[i];
        assert_true(kv->key.len > 0 && inside(&g->map, kv->key.s, kv->key.len));
        if (kv->type == G3_GGUF_STRING) assert_true(inside(&g->map, kv->str.s, kv->str.len));
        if (kv->type != G3_GGUF_ARRAY) continue;
        if (kv->arr_type == G3_GGUF_STRING) {
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                g3_gguf_str s = g3_gguf_arr_str(kv, j);
                assert_true(s.s && inside(&g->map, s.s, s.len));
            }
        } else {
            assert_true(inside(&g->map, kv->arr_data, kv->arr_n * g3_gguf_type_size(kv->arr_type)));
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const g3_gguf_tensor *t = &g->tensors[i];
        assert_true(strlen(t->name) > 0 && strlen(t->name) < sizeof t->name);
        assert_true(t->n_dims >= 1 && t->n_dims <= 4);
        assert_true(t->nbytes > 0 && inside(&g->map, t->data, t->nbytes));
        assert_true(t->data >= g->map.data + g->data_offset);
        assert_ptr_equal(g3_gguf_find_tensor(g, t->name), t);
    }
}

static void check_st_invariants(const g3_safetensors *st) {
    for (size_t i = 0; i < st->n_tensors; i++) {
        const g3_st_tensor *t = &st->tensors[i];
        assert_true(t->file >= 0 && t->file < st->n_files);
        assert_true(inside(&st->files[t->file], t->data, t->nbytes));
        assert_true(t->n_dims >= 0 && t->n_dims <= 4);
        assert_ptr_equal(g3_st_find(st, t->name), t);
    }
}

/* Opens path; returns 1 when it opened (invariants checked), 0 on an error (with a message naming the file). */
static int try_gguf(const char *path) {
    g3_gguf g;
    g3_error err = {0};
    if (g3_gguf_open(&g, path, &err) == G3_OK) {
        check_gguf_invariants(&g);
        g3_gguf_close(&g);
        return 1;
    }
    if (err.msg[0] == 0 || !strstr(err.msg, path)) fail_msg("error message '%s' does not name %s", err.msg, path);
    assert_null(g.kv); /* released on failure */
    return 0;
}

static int try_st(const char *path) {
    g3_safetensors st;
    g3_error err = {0};
    if (g3_st_open_file(&st, path, &err) == G3_OK) {
        check_st_invariants(&st);
        g3_st_close(&st);
        return 1;
    }
    if (err.msg[0] == 0 || !strstr(err.msg, path)) fail_msg("error message '%s' does not name %s", err.msg, path);
    assert_null(st.tensors);
    return 0;
}

/* ---- truncation and bit flips of real files ------------------------------------------------------------------ */
/* A copy of src at dst; returns its bytes (caller frees). */
static char *copy_fixture(const char *name, const char *dst, size_t *n) {
    const char *dir = tu_fixture("tiny-gqa");
    if (!dir) return NULL;
    char src[1200];
    snprintf(src, sizeof src, "%s/%s", dir, name);
    char *buf = tu_read_file(src, n);
    assert_non_null(buf);
    assert_true(ft_write(dst, buf, *n));
    return buf;
}

/* Truncates path to `spread` lengths between header_end and size-1, then to every length below header_end: each
 * must fail. Lengths only go down, so every file is a true prefix of the original (truncate() pads with zeros
 * when it grows a file). Returns the number of files tried. */
static int truncations(const char *path, size_t size, size_t header_end, int spread, int (*try_open)(const char *)) {
    int tried = 0;
    for (int i = spread; i >= 0 && header_end < size; i--, tried++) {
        size_t len = header_end + (size - 1 - header_end) * (size_t)i / (size_t)spread;
        assert_int_equal(truncate(path, (off_t)len), 0);
        if (try_open(path)) fail_msg("%s truncated to %zu bytes opened", path, len);
    }
    for (size_t len = header_end < size ? header_end : size; len-- > 0; tried++) {
        assert_int_equal(truncate(path, (off_t)len), 0);
        if (try_open(path)) fail_msg("%s truncated to %zu bytes opened", path, len);
    }
    return tried;
}

/* n_copies files with 1..4 flipped bits each; 7 in 8 land in [0, hot) (the header), the rest anywhere. */
static void bit_flips(const char *path, const char *orig, size_t size, size_t hot, int n_copies,
                      int (*try_open)(const char *), const char *label) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    int opened = 0;
    for (int c = 0; c < n_copies; c++) {
        uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(c + 1);
        size_t pos[4];
        int nf = 1 + (int)(ft_rand(&s) % 4);
        for (int k = 0; k < nf; k++) {
            size_t range = ft_rand(&s) % 8 ? hot : size;
            pos[k] = (size_t)(ft_rand(&s) % range);
            uint8_t b;
            assert_int_equal(pread(fd, &b, 1, (off_t)pos[k]), 1); /* flips on one byte compose */
            b ^= (uint8_t)(1u << (ft_rand(&s) % 8));
            assert_int_equal(pwrite(fd, &b, 1, (off_t)pos[k]), 1);
        }
        opened += try_open(path);
        for (int k = 0; k < nf; k++) assert_int_equal(pwrite(fd, orig + pos[k], 1, (off_t)pos[k]), 1);
    }
    close(fd);
    print_message("%s: %d bit-flipped copies, %d still opened (checked), %d refused\n", label, n_copies, opened,
                  n_copies - opened);
}

static void test_gguf_truncation_and_flips(void **state) {
    (void)state;
    const char *path = tmp_path("trunc.gguf");
    size_t size;
    char *orig = copy_fixture("model-q8_0.gguf", path, &size);
    if (!orig) skip();
    g3_gguf g;
    g3_error err = {0};
    assert_int_equal(g3_gguf_open(&g, path, &err), G3_OK);
    uint64_t end = 0, header_end = g.data_offset;
    for (uint64_t i = 0; i < g.n_tensors; i++)
        if (g.tensors[i].offset + g.tensors[i].nbytes > end) end = g.tensors[i].offset + g.tensors[i].nbytes;
    assert_int_equal(g.data_offset + end, size); /* so every shorter length is really broken */
    g3_gguf_close(&g);
    int n = truncations(path, size, header_end + 64, 300, try_gguf);
    print_message("gguf: %d truncated copies refused (every byte below %llu, then 300 through the data)\n", n,
                  (unsigned long long)header_end + 64);
    assert_true(ft_write(path, orig, size));
    bit_flips(path, orig, size, header_end, 400, try_gguf, "gguf");
    assert_int_equal(try_gguf(path), 1); /* restored copy opens again */
    free(orig);
}

static void test_st_truncation_and_flips(void **state) {
    (void)state;
    const char *path = tmp_path("trunc.safetensors");
    size_t size;
    char *orig = copy_fixture("model.safetensors", path, &size);
    if (!orig) skip();
    uint64_t hl;
    memcpy(&hl, orig, 8);
    g3_safetensors st;
    g3_error err = {0};
    assert_int_equal(g3_st_open_file(&st, path, &err), G3_OK);
    size_t end = 0;
    for (size_t i = 0; i < st.n_tensors; i++) {
        size_t e = (size_t)(st.tensors[i].data - st.files[0].data) + st.tensors[i].nbytes;
        if (e > end) end = e;
    }
    assert_int_equal(end, size);
    g3_st_close(&st);
    int n = truncations(path, size, 8 + hl + 64, 300, try_st);
    print_message("safetensors: %d truncated copies refused (every byte below %llu, then 300 through the data)\n",
                  n, (unsigned long long)(8 + hl + 64));
    assert_true(ft_write(path, orig, size));
    bit_flips(path, orig, size, 8 + hl, 400, try_st, "safetensors");
    assert_int_equal(try_st(path), 1);
    free(orig);
}

/* ---- hand-made GGUF files: a valid base with one defect ------------------------------------------------------ */
enum {
    M_NONE, M_MAGIC, M_VERSION, M_NTENSORS, M_NKV, M_KEYLEN, M_STRLEN, M_KVTYPE, M_BOOL, M_ARR_TYPE, M_ARR_STR_N,
    M_ARR_ELEM_LEN, M_ARR_N, M_ALIGN, M_ALIGN_TYPE, M_DUP_KEY, M_NAMELEN, M_NAME_LONG, M_NDIMS, M_NE0, M_NE_OVF,
    M_TTYPE, M_QBLOCK, M_OFFSET, M_DUP_TENSOR, M_OVERLAP, M_TRUNC,
};

/* kvs: general.architecture="gemma3", general.alignment=32 (u32), test.flag=true, tokenizer.ggml.tokens=
 * ["a","bb","ccc"], test.scores=f32[4]; tensors: a F32 [8,4] @0 (128 B), b Q8_0 [32,2] @128 (68 B),
 * c F16 [16] @224 (32 B); data section 256 bytes. */
static void build_gguf(ft_buf *b, int m, uint64_t p) {
    ft_put(b, m == M_MAGIC ? "GGUX" : "GGUF", 4);
    ft_u32(b, m == M_VERSION ? (uint32_t)p : 3);
    ft_u64(b, m == M_NTENSORS ? p : 3);
    ft_u64(b, m == M_NKV ? p : 5);
    if (m == M_KEYLEN) {
        ft_u64(b, p);
        ft_put(b, "general.architecture", 20);
    } else {
        ft_str(b, "general.architecture");
    }
    ft_u32(b, G3_GGUF_STRING);
    if (m == M_STRLEN) {
        ft_u64(b, p);
        ft_put(b, "gemma3", 6);
    } else {
        ft_str(b, "gemma3");
    }
    ft_str(b, "general.alignment");
    if (m == M_ALIGN_TYPE) {
        ft_u32(b, G3_GGUF_STRING);
        ft_str(b, "32");
    } else {
        ft_u32(b, G3_GGUF_U32);
        ft_u32(b, m == M_ALIGN ? (uint32_t)p : 32);
    }
    ft_str(b, m == M_DUP_KEY ? "general.architecture" : "test.flag");
    ft_u32(b, m == M_KVTYPE ? (uint32_t)p : G3_GGUF_BOOL);
    uint8_t flag = m == M_BOOL ? (uint8_t)p : 1;
    ft_put(b, &flag, 1);
    ft_str(b, "tokenizer.ggml.tokens");
    ft_u32(b, G3_GGUF_ARRAY);
    ft_u32(b, m == M_ARR_TYPE ? (uint32_t)p : G3_GGUF_STRING);
    ft_u64(b, m == M_ARR_STR_N ? p : 3);
    ft_str(b, "a");
    if (m == M_ARR_ELEM_LEN) {
        ft_u64(b, p);
        ft_put(b, "bb", 2);
    } else {
        ft_str(b, "bb");
    }
    ft_str(b, "ccc");
    ft_str(b, "test.scores");
    ft_u32(b, G3_GGUF_ARRAY);
    ft_u32(b, G3_GGUF_F32);
    ft_u64(b, m == M_ARR_N ? p : 4);
    const float sc[4] = {0.f, -1.f, 2.5f, 1e9f};
    ft_put(b, sc, sizeof sc);
    /* tensor a */
    if (m == M_NAMELEN) {
        ft_u64(b, p);
        ft_put(b, "a", 1);
    } else if (m == M_NAME_LONG) {
        char name[201];
        memset(name, 'x', 200);
        name[200] = 0;
        ft_str(b, name);
    } else {
        ft_str(b, "a");
    }
    ft_u32(b, 2);
    ft_u64(b, m == M_NE0 ? p : m == M_NE_OVF ? 1ull << 32 : 8);
    ft_u64(b, m == M_NE_OVF ? 1ull << 32 : 4);
    ft_u32(b, 0);
    ft_u64(b, 0);
    /* tensor b */
    ft_str(b, "b");
    ft_u32(b, m == M_NDIMS ? (uint32_t)p : 2);
    ft_u64(b, m == M_QBLOCK ? 48 : 32);
    ft_u64(b, 2);
    ft_u32(b, m == M_TTYPE ? (uint32_t)p : 8);
    ft_u64(b, 128);
    /* tensor c */
    ft_str(b, m == M_DUP_TENSOR ? "a" : "c");
    ft_u32(b, 1);
    ft_u64(b, 16);
    ft_u32(b, 1);
    ft_u64(b, m == M_OFFSET ? p : m == M_OVERLAP ? 160 : 224);
    ft_pad(b, 32);
    for (int i = 0; i < 256; i++) {
        uint8_t x = (uint8_t)(i * 37 + 11);
        ft_put(b, &x, 1);
    }
    if (m == M_TRUNC) b->n -= (size_t)p;
}

typedef struct gcase { int m; uint64_t p; const char *needle; } gcase; /* needle NULL: the file must open */

static const gcase k_gguf_cases[] = {
    {M_NONE, 0, NULL}, {M_VERSION, 2, NULL}, {M_ALIGN, 16, NULL}, {M_ALIGN, 32, NULL},
    {M_MAGIC, 0, "not a GGUF"}, {M_VERSION, 1, "version 1"}, {M_VERSION, 4, "version 4"},
    {M_VERSION, 0, "version 0"}, {M_VERSION, 0x03000000u, "big-endian"},
    {M_NTENSORS, 1ull << 60, "cannot fit"}, {M_NKV, 1ull << 60, "cannot fit"}, {M_NKV, UINT64_MAX, "cannot fit"},
    {M_NTENSORS, UINT64_MAX, "cannot fit"}, {M_NTENSORS, 4, "tensor 3"}, {M_NTENSORS, 1000, "cannot fit"},
    {M_KEYLEN, 0, "key length 0"}, {M_KEYLEN, 1ull << 62, "key of kv 0"}, {M_KEYLEN, UINT64_MAX, "key of kv 0"},
    {M_KEYLEN, 100000, "key of kv 0"},
    {M_STRLEN, 1ull << 40, "'general.architecture'"}, {M_STRLEN, UINT64_MAX, "'general.architecture'"},
    {M_STRLEN, UINT64_MAX - 7, "'general.architecture'"},
    {M_KVTYPE, 13, "unknown value type 13"}, {M_KVTYPE, 0xffffffffu, "unknown value type"},
    {M_BOOL, 2, "bool value 2"},
    {M_ARR_TYPE, G3_GGUF_ARRAY, "nested arrays"}, {M_ARR_TYPE, 13, "element type 13"},
    {M_ARR_STR_N, 1ull << 61, "'tokenizer.ggml.tokens'"}, {M_ARR_STR_N, UINT64_MAX, "'tokenizer.ggml.tokens'"},
    {M_ARR_STR_N, 1000, "'tokenizer.ggml.tokens'"},
    {M_ARR_ELEM_LEN, 1ull << 50, "element 1"}, {M_ARR_ELEM_LEN, UINT64_MAX, "element 1"},
    {M_ARR_N, 1ull << 62, "'test.scores'"}, {M_ARR_N, (1ull << 62) + 1, "'test.scores'"},
    {M_ARR_N, UINT64_MAX, "'test.scores'"},
    {M_ALIGN, 0, "general.alignment = 0"}, {M_ALIGN, 3, "general.alignment = 3"},
    {M_ALIGN, 1u << 31, "general.alignment"}, {M_ALIGN, 64, "alignment 64"}, {M_ALIGN_TYPE, 0, "general.alignment"},
    {M_DUP_KEY, 0, "duplicate key 'general.architecture'"},
    {M_NAMELEN, 0, "name length 0"}, {M_NAMELEN, 1ull << 63, "name of tensor 0"},
    {M_NAMELEN, 64, "tensor 0"}, {M_NAME_LONG, 0, "name length 200"},
    {M_NDIMS, 5, "n_dims 5"}, {M_NDIMS, 0, "n_dims 0"}, {M_NDIMS, 0xffffffffu, "n_dims"},
    {M_NE0, 0, "ne[0] = 0"}, {M_NE0, 1ull << 63, "ne[0]"}, {M_NE0, UINT64_MAX, "ne[0]"},
    {M_NE_OVF, 0, "overflows"}, {M_NE0, 1ull << 40, "'a'"}, {M_NE0, 1ull << 61, "'a'"},
    {M_TTYPE, 4, "unknown tensor type id 4"}, {M_TTYPE, 40, "type id 40"}, {M_TTYPE, 0xffffffffu, "type id"},
    {M_QBLOCK, 0, "block size 32"},
    {M_OFFSET, 256, "'c'"}, {M_OFFSET, 230, "not a multiple of the alignment"},
    {M_OFFSET, UINT64_MAX - 31, "'c'"}, {M_OFFSET, 1ull << 63, "'c'"},
    {M_DUP_TENSOR, 0, "duplicate tensor name 'a'"}, {M_OVERLAP, 0, "overlap"},
    /* M_TRUNC with no needle: must fail, with any message */
    {M_TRUNC, 1, "'c'"}, {M_TRUNC, 256, "past the end"}, {M_TRUNC, 270, NULL},
};

static void test_gguf_crafted(void **state) {
    (void)state;
    const char *path = tmp_path("crafted.gguf");
    int n = 0;
    for (size_t i = 0; i < sizeof k_gguf_cases / sizeof k_gguf_cases[0]; i++) {
        const gcase *c = &k_gguf_cases[i];
        ft_buf b = {0};
        build_gguf(&b, c->m, c->p);
        assert_true(ft_write(path, b.p, b.n));
        free(b.p);
        g3_gguf g;
        g3_error err = {0};
        g3_status rc = g3_gguf_open(&g, path, &err);
        int must_open = c->needle == NULL && c->m != M_TRUNC;
        if (must_open) {
            if (rc != G3_OK)
                fail_msg("case %zu (m=%d p=%llu) should open: %s", i, c->m, (unsigned long long)c->p, err.msg);
            check_gguf_invariants(&g);
            char s[16];
            assert_true(g3_gguf_get_str(&g, "general.architecture", s, sizeof s) && strcmp(s, "gemma3") == 0);
            assert_int_equal(g.n_tensors, 3);
            assert_int_equal(g3_gguf_find_tensor(&g, "b")->nbytes, 68);
            assert_int_equal(g3_gguf_arr_str(g3_gguf_find(&g, "tokenizer.ggml.tokens"), 2).len, 3);
            g3_gguf_close(&g);
            continue;
        }
        n++;
        if (rc == G3_OK) fail_msg("case %zu (m=%d p=%llu) opened but should fail", i, c->m, (unsigned long long)c->p);
        if (!strstr(err.msg, path)) fail_msg("case %zu: message does not name the file: %s", i, err.msg);
        if (c->needle && !strstr(err.msg, c->needle))
            fail_msg("case %zu (m=%d p=%llu): message '%s' lacks '%s'", i, c->m, (unsigned long long)c->p, err.msg,
                     c->needle);
        if (i < 12 || c->m == M_OFFSET || c->m == M_NE_OVF) print_message("  %s\n", err.msg + strlen(path) + 2);
    }
    /* counts that fit a large (sparse) file but exceed the reader's caps */
    const gcase big[] = {{M_NKV, 70000, "at most"}, {M_NTENSORS, 1u << 21, "at most"}};
    for (int i = 0; i < 2; i++, n++) {
        ft_buf b = {0};
        build_gguf(&b, big[i].m, big[i].p);
        assert_true(ft_write(path, b.p, b.n));
        free(b.p);
        assert_int_equal(truncate(path, 100ll << 20), 0);
        g3_gguf g;
        g3_error err = {0};
        assert_int_not_equal(g3_gguf_open(&g, path, &err), G3_OK);
        if (!strstr(err.msg, big[i].needle)) fail_msg("message '%s' lacks '%s'", err.msg, big[i].needle);
    }
    print_message("gguf: %d hand-made broken files refused, %d controls opened\n", n, 4);
}

/* ---- hand-made safetensors files ------------------------------------------------------------------------------ */
static void write_st(const char *path, const char *json, int64_t hl_override, size_t data_len) {
    ft_buf b = {0};
    ft_u64(&b, hl_override >= 0 ? (uint64_t)hl_override : strlen(json));
    ft_put(&b, json, strlen(json));
    for (size_t i = 0; i < data_len; i++) ft_put(&b, "\x5a", 1);
    assert_true(ft_write(path, b.p, b.n));
    free(b.p);
}

typedef struct scase { const char *json; int64_t hl; size_t data; const char *needle; } scase;
#define OK_T "{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}"

static const scase k_st_cases[] = {
    /* controls */
    {"{\"w\":" OK_T "}", -1, 16, NULL},
    {"{\"__metadata__\":{\"format\":\"pt\"},\"w\":" OK_T ",\"v\":{\"dtype\":\"BF16\",\"shape\":[4],"
     "\"data_offsets\":[16,24]}}   ", -1, 24, NULL},
    {"{}", -1, 0, NULL},
    /* header length */
    {"{}", 0, 0, "header length 0"}, {"{}", 1, 0, "header length 1"}, {"{}", 3, 0, "header length 3"},
    {"{}", 1ll << 62, 0, "header length"}, {"{}", -2 /* INT64_MAX */, 0, "header length"},
    /* JSON */
    {"{\"a\"", -1, 0, "not valid JSON"}, {"{\"a\":{\"dtype\":", -1, 0, "not valid JSON"},
    {"[]", -1, 0, "not a JSON object"}, {"\"x\"", -1, 0, "not a JSON object"},
    {"{} x", -1, 0, "unexpected bytes"}, {"{\"w\":1}", -1, 0, "'w': entry is not"},
    {"{\"w\":[1]}", -1, 0, "'w': entry is not"}, {"{\"w\":{}}", -1, 0, "\"dtype\""},
    {"{\"w\":{\"dtype\":5,\"shape\":[],\"data_offsets\":[0,0]}}", -1, 0, "\"dtype\""},
    {"{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", -1, 4, "\"shape\""},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":\"x\",\"data_offsets\":[0,4]}}", -1, 4, "\"shape\""},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-1,4],\"data_offsets\":[0,16]}}", -1, 16, "shape[0]"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4,-4],\"data_offsets\":[0,16]}}", -1, 16, "shape[1]"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,16]}}", -1, 16, "shape[0]"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,10]}}", -1, 10, "shape[0]"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", -1, 16, "shape[0]"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,16]}}", -1, 16,
     "overflows"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[9007199254740992],\"data_offsets\":[0,16]}}", -1, 16, "'w'"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}", -1, 16, "5 dimensions"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4]}}", -1, 16, "\"data_offsets\""},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}", -1, 16, "\"data_offsets\""},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8,16]}}", -1, 16, "\"data_offsets\""},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", -1, 16, "in-order range"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1000]}}", -1, 16, "in-order range"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", -1, 16, "in-order range"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-16,0]}}", -1, 16, "data_offsets"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[\"0\",\"16\"]}}", -1, 16, "data_offsets"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1e300]}}", -1, 16, "data_offsets"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", -1, 16, "needs 12"},
    {"{\"w\":{\"dtype\":\"BF16\",\"shape\":[4,4],\"data_offsets\":[0,16]}}", -1, 16, "needs 32"},
    {"{\"w\":{\"dtype\":\"I64\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1, 16, "needs 32"},
    {"{\"w\":" OK_T ",\"w\":" OK_T "}", -1, 16, "duplicate tensor 'w'"},
};

static void test_st_crafted(void **state) {
    (void)state;
    const char *path = tmp_path("crafted.safetensors");
    int n = 0, controls = 0;
    for (size_t i = 0; i < sizeof k_st_cases / sizeof k_st_cases[0]; i++) {
        const scase *c = &k_st_cases[i];
        int64_t hl = c->hl;
        if (hl == -2) hl = INT64_MAX;
        write_st(path, c->json, hl, c->data);
        if (!c->needle) {
            controls++;
            if (try_st(path) != 1) fail_msg("control case %zu did not open", i);
            continue;
        }
        n++;
        g3_safetensors st;
        g3_error err = {0};
        if (g3_st_open_file(&st, path, &err) == G3_OK) fail_msg("case %zu opened but should fail: %s", i, c->json);
        if (!strstr(err.msg, path) || !strstr(err.msg, c->needle))
            fail_msg("case %zu: message '%s' lacks the file or '%s'", i, err.msg, c->needle);
    }
    /* deep nesting and a header length at the 100 MB limit (sparse file: nothing is really written) */
    ft_buf deep = {0};
    for (int i = 0; i < 100000; i++) ft_put(&deep, "[", 1);
    ft_put(&deep, "", 1);
    write_st(path, (const char *)deep.p, -1, 0);
    free(deep.p);
    assert_int_equal(try_st(path), 0);
    write_st(path, "{}", 100ll * 1000 * 1000, 0);
    assert_int_equal(truncate(path, 150ll * 1000 * 1000), 0);
    g3_safetensors st;
    g3_error err = {0};
    assert_int_not_equal(g3_st_open_file(&st, path, &err), G3_OK);
    assert_non_null(strstr(err.msg, "limit"));
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(try_st(path), 0);
    assert_int_equal(truncate(path, 5), 0);
    assert_int_equal(try_st(path), 0);
    n += 4;
    print_message("safetensors: %d hand-made broken files refused, %d controls opened\n", n, controls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_crafted),
        cmocka_unit_test(test_st_crafted),
        cmocka_unit_test(test_gguf_truncation_and_flips),
        cmocka_unit_test(test_st_truncation_and_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
