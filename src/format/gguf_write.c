/* GGUF v3 writer: collects kv pairs (kept serialized) and tensors (pointers or fill callbacks), then writes
 * header, metadata, tensor infos and the data section, every tensor aligned to general.alignment (default 32).
 * The file is written under a temporary name and renamed into place, so a failed write leaves no partial file.
 * Setter errors are remembered and returned by g3_gguf_writer_write; the setters themselves return nothing. */
#include "format/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* serialized value, as it follows the type field in the file */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[4];
    const void *data;     /* or NULL with fill */
    g3_gguf_fill_fn fill;
    void *fill_ctx;
    size_t nbytes;
    uint64_t offset;      /* assigned at write time */
} wtensor;

struct g3_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    g3_status rc;  /* first setter error */
    g3_error err;
};

g3_status g3_gguf_writer_create(g3_gguf_writer **w, g3_error *err) {
    *w = calloc(1, sizeof **w);
    if (!*w) return g3_fail(err, G3_ERR_NOMEM, "gguf writer: no memory");
    return G3_OK;
}

void g3_gguf_writer_free(g3_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

#define W_FAIL(w, code, ...)                                                                                           \
    do {                                                                                                               \
        if ((w)->rc == G3_OK) (w)->rc = g3_fail(&(w)->err, code, __VA_ARGS__);                                         \
    } while (0)

/* Takes ownership of val. Replaces the value of an existing key. */
static void put_kv(g3_gguf_writer *w, const char *key, uint32_t type, uint8_t *val, size_t val_len) {
    if (!w) {
        free(val);
        return;
    }
    if (!val) {
        W_FAIL(w, G3_ERR_NOMEM, "gguf writer: no memory for the value of '%s'", key ? key : "(null)");
        return;
    }
    if (!key || !*key || strlen(key) > 65535) {
        free(val);
        W_FAIL(w, G3_ERR_ARG, "gguf writer: empty or over-long key");
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_len = val_len;
            return;
        }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        wkv *p = realloc(w->kv, cap * sizeof *p);
        if (!p) {
            free(val);
            W_FAIL(w, G3_ERR_NOMEM, "gguf writer: no memory for key '%s'", key);
            return;
        }
        w->kv = p;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(val);
        W_FAIL(w, G3_ERR_NOMEM, "gguf writer: no memory for key '%s'", key);
        return;
    }
    w->kv[w->n_kv++] = (wkv){k, type, val, val_len};
}

static void put_scalar(g3_gguf_writer *w, const char *key, uint32_t type, const void *v) {
    size_t n = g3_gguf_type_size(type);
    uint8_t *val = malloc(n);
    if (val) memcpy(val, v, n);
    put_kv(w, key, type, val, n);
}

void g3_gguf_w_u32(g3_gguf_writer *w, const char *key, uint32_t v) { put_scalar(w, key, G3_GGUF_U32, &v); }
void g3_gguf_w_i32(g3_gguf_writer *w, const char *key, int32_t v) { put_scalar(w, key, G3_GGUF_I32, &v); }
void g3_gguf_w_u64(g3_gguf_writer *w, const char *key, uint64_t v) { put_scalar(w, key, G3_GGUF_U64, &v); }
void g3_gguf_w_i64(g3_gguf_writer *w, const char *key, int64_t v) { put_scalar(w, key, G3_GGUF_I64, &v); }
void g3_gguf_w_f32(g3_gguf_writer *w, const char *key, float v) { put_scalar(w, key, G3_GGUF_F32, &v); }
void g3_gguf_w_f64(g3_gguf_writer *w, const char *key, double v) { put_scalar(w, key, G3_GGUF_F64, &v); }
void g3_gguf_w_bool(g3_gguf_writer *w, const char *key, int v) {
    uint8_t b = v ? 1 : 0;
    put_scalar(w, key, G3_GGUF_BOOL, &b);
}

void g3_gguf_w_str(g3_gguf_writer *w, const char *key, const char *v) {
    uint64_t len = v ? strlen(v) : 0;
    uint8_t *val = malloc(8 + len);
    if (val) {
        memcpy(val, &len, 8);
        if (len) memcpy(val + 8, v, len);
    }
    put_kv(w, key, G3_GGUF_STRING, val, 8 + len);
}

/* Array of n strings given as (pointer, length) pairs through a getter, so that both C strings and strings from
 * a mapped file can be written. */
static void put_arr_str(g3_gguf_writer *w, const char *key, uint64_t n, g3_gguf_str (*get)(const void *, uint64_t),
                        const void *src) {
    size_t total = 4 + 8;
    for (uint64_t i = 0; i < n; i++) total += 8 + get(src, i).len;
    uint8_t *val = malloc(total), *p = val;
    if (val) {
        uint32_t et = G3_GGUF_STRING;
        memcpy(p, &et, 4);
        memcpy(p + 4, &n, 8);
        p += 12;
        for (uint64_t i = 0; i < n; i++) {
            g3_gguf_str s = get(src, i);
            memcpy(p, &s.len, 8);
            if (s.len) memcpy(p + 8, s.s, s.len);
            p += 8 + s.len;
        }
    }
    put_kv(w, key, G3_GGUF_ARRAY, val, total);
}

static g3_gguf_str get_cstr(const void *src, uint64_t i) {
    const char *s = ((const char *const *)src)[i];
    return (g3_gguf_str){s ? s : "", s ? strlen(s) : 0};
}
static g3_gguf_str get_kvstr(const void *src, uint64_t i) { return g3_gguf_arr_str(src, i); }

void g3_gguf_w_arr_str(g3_gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    put_arr_str(w, key, n, get_cstr, v);
}

void g3_gguf_w_arr(g3_gguf_writer *w, const char *key, g3_gguf_type elem_type, const void *v, uint64_t n) {
    size_t es = g3_gguf_type_size(elem_type);
    if (es == 0) {
        if (w) W_FAIL(w, G3_ERR_ARG, "gguf writer: '%s': array element type %d is not a scalar type", key, elem_type);
        return;
    }
    if (n > (SIZE_MAX - 12) / es) {
        if (w) W_FAIL(w, G3_ERR_ARG, "gguf writer: '%s': array of %llu elements is too large", key,
                      (unsigned long long)n);
        return;
    }
    uint8_t *val = malloc(12 + n * es);
    if (val) {
        uint32_t et = elem_type;
        memcpy(val, &et, 4);
        memcpy(val + 4, &n, 8);
        if (n) memcpy(val + 12, v, n * es);
    }
    put_kv(w, key, G3_GGUF_ARRAY, val, 12 + n * es);
}

void g3_gguf_w_arr_f32(g3_gguf_writer *w, const char *key, const float *v, uint64_t n) {
    g3_gguf_w_arr(w, key, G3_GGUF_F32, v, n);
}
void g3_gguf_w_arr_i32(g3_gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
    g3_gguf_w_arr(w, key, G3_GGUF_I32, v, n);
}

void g3_gguf_w_kv(g3_gguf_writer *w, const g3_gguf_kv *kv) {
    if (!w || !kv) return;
    char *key = strndup(kv->key.s, kv->key.len);
    if (!key) {
        W_FAIL(w, G3_ERR_NOMEM, "gguf writer: no memory to copy a key");
        return;
    }
    if (kv->type == G3_GGUF_STRING) {
        uint8_t *val = malloc(8 + kv->str.len);
        if (val) {
            memcpy(val, &kv->str.len, 8);
            if (kv->str.len) memcpy(val + 8, kv->str.s, kv->str.len);
        }
        put_kv(w, key, G3_GGUF_STRING, val, 8 + kv->str.len);
    } else if (kv->type == G3_GGUF_ARRAY && kv->arr_type == G3_GGUF_STRING) {
        put_arr_str(w, key, kv->arr_n, get_kvstr, kv);
    } else if (kv->type == G3_GGUF_ARRAY) {
        g3_gguf_w_arr(w, key, kv->arr_type, kv->arr_data, kv->arr_n);
    } else {
        uint8_t b[8];
        switch (kv->type) {
        case G3_GGUF_U8: case G3_GGUF_BOOL: b[0] = (uint8_t)kv->v.u; break;
        case G3_GGUF_I8: b[0] = (uint8_t)(int8_t)kv->v.i; break;
        case G3_GGUF_U16: { uint16_t x = (uint16_t)kv->v.u; memcpy(b, &x, 2); } break;
        case G3_GGUF_I16: { int16_t x = (int16_t)kv->v.i; memcpy(b, &x, 2); } break;
        case G3_GGUF_U32: { uint32_t x = (uint32_t)kv->v.u; memcpy(b, &x, 4); } break;
        case G3_GGUF_I32: { int32_t x = (int32_t)kv->v.i; memcpy(b, &x, 4); } break;
        case G3_GGUF_F32: { float x = (float)kv->v.f; memcpy(b, &x, 4); } break;
        case G3_GGUF_U64: memcpy(b, &kv->v.u, 8); break;
        case G3_GGUF_I64: memcpy(b, &kv->v.i, 8); break;
        case G3_GGUF_F64: memcpy(b, &kv->v.f, 8); break;
        default:
            W_FAIL(w, G3_ERR_ARG, "gguf writer: '%s': unknown kv type %d", key, kv->type);
            free(key);
            return;
        }
        put_scalar(w, key, kv->type, b);
    }
    free(key);
}

static void add_tensor(g3_gguf_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
                       const void *data, size_t nbytes, g3_gguf_fill_fn fill, void *ctx) {
    if (!w) return;
    if (!name || !*name || strlen(name) > 127) {
        W_FAIL(w, G3_ERR_ARG, "gguf writer: tensor name '%s' is empty or longer than 127 bytes", name ? name : "");
        return;
    }
    size_t want = g3_gguf_tensor_nbytes(type, n_dims, ne);
    if (want == 0) {
        W_FAIL(w, G3_ERR_ARG, "gguf writer: tensor '%s': type %u with %d dims is not a valid shape/type", name, type,
               n_dims);
        return;
    }
    if (want != nbytes || (!data && !fill && nbytes)) {
        W_FAIL(w, G3_ERR_ARG, "gguf writer: tensor '%s': %zu bytes given, its type and shape need %zu", name, nbytes,
               want);
        return;
    }
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) {
            W_FAIL(w, G3_ERR_ARG, "gguf writer: duplicate tensor name '%s'", name);
            return;
        }
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *p = realloc(w->t, cap * sizeof *p);
        if (!p) {
            W_FAIL(w, G3_ERR_NOMEM, "gguf writer: no memory for tensor '%s'", name);
            return;
        }
        w->t = p;
        w->cap_t = cap;
    }
    wtensor t = {.name = strdup(name), .type = type, .n_dims = n_dims, .data = data, .fill = fill,
                 .fill_ctx = ctx, .nbytes = nbytes};
    if (!t.name) {
        W_FAIL(w, G3_ERR_NOMEM, "gguf writer: no memory for tensor '%s'", name);
        return;
    }
    for (int d = 0; d < 4; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
    w->t[w->n_t++] = t;
}

void g3_gguf_w_tensor(g3_gguf_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
                      const void *data, size_t nbytes) {
    add_tensor(w, name, type, n_dims, ne, data, nbytes, NULL, NULL);
}

void g3_gguf_w_tensor_fill(g3_gguf_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
                           size_t nbytes, g3_gguf_fill_fn fill, void *ctx) {
    if (!fill) {
        if (w) W_FAIL(w, G3_ERR_ARG, "gguf writer: tensor '%s': no fill function", name ? name : "");
        return;
    }
    add_tensor(w, name, type, n_dims, ne, NULL, nbytes, fill, ctx);
}

/* ---- output --------------------------------------------------------------------------------------------- */
typedef struct out {
    FILE *f;
    uint64_t pos;
    int failed;
} out;

static void put(out *o, const void *p, size_t n) {
    if (o->failed || n == 0) return;
    if (fwrite(p, 1, n, o->f) != n) o->failed = 1;
    o->pos += n;
}
static void put_u32(out *o, uint32_t v) { put(o, &v, 4); }
static void put_u64(out *o, uint64_t v) { put(o, &v, 8); }
static void put_pad(out *o, uint64_t align) {
    static const uint8_t zeros[64];
    uint64_t n = (align - o->pos % align) % align;
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        put(o, zeros, k);
        n -= k;
    }
}

static g3_status writer_alignment(const g3_gguf_writer *w, uint64_t *align, g3_error *err) {
    *align = 32;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment") != 0) continue;
        uint32_t a = 0;
        if (w->kv[i].type != G3_GGUF_U32) return g3_fail(err, G3_ERR_ARG, "gguf writer: general.alignment must be u32");
        memcpy(&a, w->kv[i].val, 4);
        if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 24))
            return g3_fail(err, G3_ERR_ARG, "gguf writer: general.alignment %u is not a power of two", a);
        *align = a;
    }
    return G3_OK;
}

static g3_status write_all(g3_gguf_writer *w, out *o, uint64_t align, const char *path, g3_error *err) {
    put(o, "GGUF", 4);
    put_u32(o, 3);
    put_u64(o, w->n_t);
    put_u64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        size_t kl = strlen(w->kv[i].key);
        put_u64(o, kl);
        put(o, w->kv[i].key, kl);
        put_u32(o, w->kv[i].type);
        put(o, w->kv[i].val, w->kv[i].val_len);
    }
    uint64_t off = 0, max_fill = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off += (t->nbytes + align - 1) / align * align;
        if (t->fill && t->nbytes > max_fill) max_fill = t->nbytes;
        size_t nl = strlen(t->name);
        put_u64(o, nl);
        put(o, t->name, nl);
        put_u32(o, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(o, (uint64_t)t->ne[d]);
        put_u32(o, t->type);
        put_u64(o, t->offset);
    }
    put_pad(o, align);
    uint8_t *buf = NULL;
    if (max_fill && !(buf = malloc(max_fill)))
        return g3_fail(err, G3_ERR_NOMEM, "%s: no memory for a %llu-byte tensor buffer", path,
                       (unsigned long long)max_fill);
    uint64_t data_start = o->pos;
    for (size_t i = 0; i < w->n_t && !o->failed; i++) {
        wtensor *t = &w->t[i];
        if (t->fill) {
            g3_status rc = t->fill(t->fill_ctx, buf, t->nbytes, err);
            if (rc != G3_OK) {
                free(buf);
                return g3_fail_prefix(err, "%s: tensor '%s': ", path, t->name);
            }
            put(o, buf, t->nbytes);
        } else {
            put(o, t->data, t->nbytes);
        }
        put_pad(o, align);
        if (o->pos - data_start != (i + 1 < w->n_t ? w->t[i + 1].offset : off)) o->failed = 1; /* cannot happen */
    }
    free(buf);
    return G3_OK;
}

g3_status g3_gguf_writer_write(g3_gguf_writer *w, const char *path, g3_error *err) {
    if (!w || !path) return g3_fail(err, G3_ERR_ARG, "gguf writer: no writer or path");
    if (w->rc != G3_OK) {
        if (err) *err = w->err;
        return w->rc;
    }
    uint64_t align;
    G3_TRY(writer_alignment(w, &align, err));
    char tmp[1100];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof tmp) return g3_fail(err, G3_ERR_ARG, "gguf writer: path too long: %s", path);
    out o = {.f = fopen(tmp, "wb")};
    if (!o.f) return g3_fail(err, G3_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    setvbuf(o.f, NULL, _IOFBF, 1 << 20);
    g3_status rc = write_all(w, &o, align, path, err);
    int saved = errno;
    if (fclose(o.f) != 0 && !o.failed) {
        o.failed = 1;
        saved = errno;
    }
    if (rc == G3_OK && o.failed) rc = g3_fail(err, G3_ERR_IO, "%s: write failed: %s", tmp, strerror(saved));
    if (rc == G3_OK && rename(tmp, path) != 0)
        rc = g3_fail(err, G3_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc != G3_OK) remove(tmp);
    return rc;
}
