/* GGUF v2/v3 reader. Every count, length, dimension and offset is checked against the bytes that remain in the
 * mapping before it is used, so a damaged or hostile file yields an error naming the file, the item and the byte
 * offset, never an out-of-bounds read or an allocation sized by an unchecked number.
 *
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   kv:     u64 key_len, key bytes, u32 type, value (scalar | u64 len + bytes | u32 elem_type u64 n elems)
 *   tensor: u64 name_len, name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset (relative to the data section)
 *   padding to `general.alignment` (default 32), then the data section. */
#include "format/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MIN_KV_BYTES 14     /* u64 key_len + 1 key byte + u32 type + 1 value byte */
#define GGUF_MIN_TENSOR_BYTES 33 /* u64 name_len + 1 name byte + u32 n_dims + 1 ne + u32 type + u64 offset */
#define GGUF_MAX_ALIGNMENT (1u << 24)
#define GGUF_MAX_KV (1u << 16)      /* real files hold ~40 keys */
#define GGUF_MAX_TENSORS (1u << 20) /* real files hold up to a few thousand tensors */

/* ---- tensor element types (ggml numbering) -------------------------------------------------------------- */
typedef struct dtype_row { const char *name; int block; int block_bytes; } dtype_row;

static const dtype_row k_dtypes[40] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},     [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},     [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},    [11] = {"Q3_K", 256, 110},  [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},  [20] = {"IQ4_NL", 32, 18}, [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},   [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},      [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},      [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},  [35] = {"TQ2_0", 256, 66}, [39] = {"MXFP4", 32, 17},
};

int g3_gguf_dtype_layout(uint32_t type, const char **name, int *block, size_t *block_bytes) {
    if (type >= sizeof k_dtypes / sizeof k_dtypes[0] || !k_dtypes[type].name) return 0;
    if (name) *name = k_dtypes[type].name;
    if (block) *block = k_dtypes[type].block;
    if (block_bytes) *block_bytes = (size_t)k_dtypes[type].block_bytes;
    return 1;
}

size_t g3_gguf_tensor_nbytes(uint32_t type, int n_dims, const int64_t *ne) {
    int block;
    size_t bb;
    if (!g3_gguf_dtype_layout(type, NULL, &block, &bb) || n_dims < 1 || n_dims > 4) return 0;
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 1) return 0;
    if (ne[0] % block != 0) return 0;
    uint64_t bytes = (uint64_t)(ne[0] / block) * bb, elems = (uint64_t)ne[0];
    for (int d = 1; d < n_dims; d++) {
        if (__builtin_mul_overflow(bytes, (uint64_t)ne[d], &bytes)) return 0;
        if (__builtin_mul_overflow(elems, (uint64_t)ne[d], &elems)) return 0;
    }
    if (elems > (uint64_t)INT64_MAX || bytes > SIZE_MAX) return 0;
    return (size_t)bytes;
}

size_t g3_gguf_type_size(uint32_t t) {
    switch (t) {
    case G3_GGUF_U8: case G3_GGUF_I8: case G3_GGUF_BOOL: return 1;
    case G3_GGUF_U16: case G3_GGUF_I16: return 2;
    case G3_GGUF_U32: case G3_GGUF_I32: case G3_GGUF_F32: return 4;
    case G3_GGUF_U64: case G3_GGUF_I64: case G3_GGUF_F64: return 8;
    default: return 0;
    }
}

/* ---- bounded reader ------------------------------------------------------------------------------------ */
typedef struct rd {
    const uint8_t *p;
    uint64_t size, pos; /* invariant: pos <= size */
    const char *path;
    g3_error *err;
    char what[200];     /* the item being read, for messages */
} rd;

static g3_status rd_short(rd *r, uint64_t need) {
    return g3_fail(r->err, G3_ERR_FORMAT, "%s: truncated: %s at byte %llu needs %llu bytes, only %llu left", r->path,
                   r->what, (unsigned long long)r->pos, (unsigned long long)need,
                   (unsigned long long)(r->size - r->pos));
}

static g3_status rd_bytes(rd *r, void *dst, uint64_t n) {
    if (n > r->size - r->pos) return rd_short(r, n);
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return G3_OK;
}

static g3_status rd_u32(rd *r, uint32_t *v) { return rd_bytes(r, v, 4); } /* little-endian hosts only */
static g3_status rd_u64(rd *r, uint64_t *v) { return rd_bytes(r, v, 8); }

/* A string: u64 length then bytes, left in the mapping. */
static g3_status rd_str(rd *r, g3_gguf_str *s) {
    uint64_t len = 0, at = r->pos;
    G3_TRY(rd_u64(r, &len));
    if (len > r->size - r->pos)
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s at byte %llu: string length %llu exceeds the %llu bytes left",
                       r->path, r->what, (unsigned long long)at, (unsigned long long)len,
                       (unsigned long long)(r->size - r->pos));
    s->s = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += len;
    return G3_OK;
}

static int printable_len(g3_gguf_str s) { return s.len > 80 ? 80 : (int)s.len; }

static const char *type_name(uint32_t t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
                                  "u64", "i64", "f64"};
    return t < 13 ? names[t] : "?";
}

/* ---- kv values ------------------------------------------------------------------------------------------ */
static g3_status read_scalar(rd *r, uint32_t type, g3_gguf_kv *kv) {
    uint8_t b[8] = {0};
    uint64_t at = r->pos;
    size_t n = g3_gguf_type_size(type);
    G3_TRY(rd_bytes(r, b, n));
    switch (type) {
    case G3_GGUF_U8: kv->v.u = b[0]; break;
    case G3_GGUF_I8: kv->v.i = (int8_t)b[0]; break;
    case G3_GGUF_U16: { uint16_t x; memcpy(&x, b, 2); kv->v.u = x; } break;
    case G3_GGUF_I16: { int16_t x; memcpy(&x, b, 2); kv->v.i = x; } break;
    case G3_GGUF_U32: { uint32_t x; memcpy(&x, b, 4); kv->v.u = x; } break;
    case G3_GGUF_I32: { int32_t x; memcpy(&x, b, 4); kv->v.i = x; } break;
    case G3_GGUF_F32: { float x; memcpy(&x, b, 4); kv->v.f = x; } break;
    case G3_GGUF_U64: memcpy(&kv->v.u, b, 8); break;
    case G3_GGUF_I64: memcpy(&kv->v.i, b, 8); break;
    case G3_GGUF_F64: memcpy(&kv->v.f, b, 8); break;
    case G3_GGUF_BOOL:
        if (b[0] > 1)
            return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s at byte %llu: bool value %u is neither 0 nor 1", r->path,
                           r->what, (unsigned long long)at, b[0]);
        kv->v.u = b[0];
        break;
    }
    return G3_OK;
}

static g3_status read_array(rd *r, g3_gguf_kv *kv) {
    uint32_t et = 0;
    uint64_t at = r->pos;
    G3_TRY(rd_u32(r, &et));
    if (et == G3_GGUF_ARRAY)
        return g3_fail(r->err, G3_ERR_UNSUPPORTED,
                       "%s: %s at byte %llu: nested arrays (array of array) are not supported", r->path, r->what,
                       (unsigned long long)at);
    if (et > G3_GGUF_F64)
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s at byte %llu: unknown array element type %u", r->path, r->what,
                       (unsigned long long)at, et);
    kv->arr_type = (g3_gguf_type)et;
    at = r->pos;
    G3_TRY(rd_u64(r, &kv->arr_n));
    uint64_t left = r->size - r->pos;
    size_t es = g3_gguf_type_size(et);
    if (et != G3_GGUF_STRING) {
        if (kv->arr_n > left / es)
            return g3_fail(r->err, G3_ERR_FORMAT,
                           "%s: %s at byte %llu: array of %llu %s elements needs more than the %llu bytes left",
                           r->path, r->what, (unsigned long long)at, (unsigned long long)kv->arr_n, type_name(et),
                           (unsigned long long)left);
        kv->arr_data = r->p + r->pos;
        if (et == G3_GGUF_BOOL)
            for (uint64_t i = 0; i < kv->arr_n; i++)
                if (kv->arr_data[i] > 1)
                    return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s: bool element %llu at byte %llu is %u", r->path,
                                   r->what, (unsigned long long)i, (unsigned long long)(r->pos + i), kv->arr_data[i]);
        r->pos += kv->arr_n * es;
        return G3_OK;
    }
    /* strings: each needs at least its 8-byte length, which bounds the offset table by the file size */
    if (kv->arr_n > left / 8)
        return g3_fail(r->err, G3_ERR_FORMAT,
                       "%s: %s at byte %llu: array of %llu strings cannot fit in the %llu bytes left", r->path,
                       r->what, (unsigned long long)at, (unsigned long long)kv->arr_n, (unsigned long long)left);
    /* first pass: validate every length without allocating; second: record each element's offset */
    kv->arr_data = r->p + r->pos;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t len = 0;
        if (r->size - r->pos >= 8) memcpy(&len, r->p + r->pos, 8);
        if (r->size - r->pos < 8 || len > r->size - r->pos - 8) {
            size_t wl = strlen(r->what);
            snprintf(r->what + wl, sizeof r->what - wl, " element %llu", (unsigned long long)i);
            g3_gguf_str s;
            g3_status rc = rd_str(r, &s); /* fails, with the message */
            return rc != G3_OK ? rc : g3_fail(r->err, G3_ERR_FORMAT, "%s: %s: bad string", r->path, r->what);
        }
        r->pos += 8 + len;
    }
    kv->arr_str_off = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof(uint64_t));
    if (!kv->arr_str_off)
        return g3_fail(r->err, G3_ERR_NOMEM, "%s: %s: no memory for %llu string offsets", r->path, r->what,
                       (unsigned long long)kv->arr_n);
    for (uint64_t i = 0, off = 0; i < kv->arr_n; i++) {
        uint64_t len;
        memcpy(&len, kv->arr_data + off, 8);
        kv->arr_str_off[i] = off;
        off += 8 + len;
    }
    return G3_OK;
}

static g3_status read_kv(rd *r, uint64_t idx, g3_gguf_kv *kv) {
    uint64_t at = r->pos;
    snprintf(r->what, sizeof r->what, "key of kv %llu", (unsigned long long)idx);
    G3_TRY(rd_str(r, &kv->key));
    if (kv->key.len == 0 || kv->key.len > 65535)
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: kv %llu at byte %llu: key length %llu is not in 1..65535", r->path,
                       (unsigned long long)idx, (unsigned long long)at, (unsigned long long)kv->key.len);
    snprintf(r->what, sizeof r->what, "kv %llu '%.*s'", (unsigned long long)idx, printable_len(kv->key), kv->key.s);
    uint32_t type = 0;
    at = r->pos;
    G3_TRY(rd_u32(r, &type));
    if (type > G3_GGUF_F64)
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s at byte %llu: unknown value type %u", r->path, r->what,
                       (unsigned long long)at, type);
    kv->type = (g3_gguf_type)type;
    if (type == G3_GGUF_STRING) return rd_str(r, &kv->str);
    if (type == G3_GGUF_ARRAY) return read_array(r, kv);
    return read_scalar(r, type, kv);
}

static int str_eq(g3_gguf_str a, const char *b) {
    size_t n = strlen(b);
    return a.len == n && memcmp(a.s, b, n) == 0;
}

static int cmp_str(g3_gguf_str a, g3_gguf_str b) {
    int c = memcmp(a.s, b.s, a.len < b.len ? a.len : b.len);
    return c ? c : (a.len < b.len ? -1 : a.len > b.len);
}

/* qsort contexts: indices into kv / tensor arrays (C11 qsort has no context pointer, so a file-local one). */
static _Thread_local const g3_gguf *t_sort_g;

static int cmp_kv_idx(const void *a, const void *b) {
    return cmp_str(t_sort_g->kv[*(const uint32_t *)a].key, t_sort_g->kv[*(const uint32_t *)b].key);
}
static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(t_sort_g->tensors[*(const uint32_t *)a].name, t_sort_g->tensors[*(const uint32_t *)b].name);
}
static int cmp_tensor_off(const void *a, const void *b) {
    uint64_t x = t_sort_g->tensors[*(const uint32_t *)a].offset, y = t_sort_g->tensors[*(const uint32_t *)b].offset;
    return x < y ? -1 : x > y;
}

static g3_status check_duplicate_keys(g3_gguf *g, g3_error *err) {
    if (g->n_kv < 2) return G3_OK;
    uint32_t *idx = malloc(g->n_kv * sizeof *idx);
    if (!idx) return g3_fail(err, G3_ERR_NOMEM, "%s: no memory to index %llu keys", g->map.path,
                             (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) idx[i] = (uint32_t)i;
    t_sort_g = g;
    qsort(idx, g->n_kv, sizeof *idx, cmp_kv_idx);
    g3_status rc = G3_OK;
    for (uint64_t i = 1; i < g->n_kv && rc == G3_OK; i++)
        if (cmp_str(g->kv[idx[i - 1]].key, g->kv[idx[i]].key) == 0) {
            g3_gguf_str k = g->kv[idx[i]].key;
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: duplicate key '%.*s' (kv %u and kv %u)", g->map.path,
                         printable_len(k), k.s, idx[i - 1] < idx[i] ? idx[i - 1] : idx[i],
                         idx[i - 1] < idx[i] ? idx[i] : idx[i - 1]);
        }
    free(idx);
    return rc;
}

/* ---- tensor infos --------------------------------------------------------------------------------------- */
static g3_status read_tensor_info(rd *r, uint64_t idx, g3_gguf_tensor *t) {
    uint64_t at = r->pos;
    g3_gguf_str name;
    snprintf(r->what, sizeof r->what, "name of tensor %llu", (unsigned long long)idx);
    G3_TRY(rd_str(r, &name));
    if (name.len == 0 || name.len >= sizeof t->name || memchr(name.s, 0, name.len))
        return g3_fail(r->err, G3_ERR_FORMAT,
                       "%s: tensor %llu at byte %llu: name length %llu is not in 1..%zu or the name holds a NUL byte",
                       r->path, (unsigned long long)idx, (unsigned long long)at, (unsigned long long)name.len,
                       sizeof t->name - 1);
    memcpy(t->name, name.s, name.len);
    t->name[name.len] = 0;
    snprintf(r->what, sizeof r->what, "tensor %llu '%s'", (unsigned long long)idx, t->name);
    at = r->pos;
    G3_TRY(rd_u32(r, &t->n_dims));
    if (t->n_dims < 1 || t->n_dims > 4)
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s at byte %llu: n_dims %u is not in 1..4", r->path, r->what,
                       (unsigned long long)at, t->n_dims);
    uint64_t elems = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v = 0;
        at = r->pos;
        G3_TRY(rd_u64(r, &v));
        if (v == 0 || v > (uint64_t)INT64_MAX)
            return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s at byte %llu: ne[%u] = %llu is not a positive size",
                           r->path, r->what, (unsigned long long)at, d, (unsigned long long)v);
        if (__builtin_mul_overflow(elems, v, &elems) || elems > (uint64_t)INT64_MAX)
            return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s at byte %llu: element count overflows at ne[%u] = %llu",
                           r->path, r->what, (unsigned long long)at, d, (unsigned long long)v);
        t->ne[d] = (int64_t)v;
    }
    at = r->pos;
    G3_TRY(rd_u32(r, &t->type));
    const char *tn;
    int block;
    if (!g3_gguf_dtype_layout(t->type, &tn, &block, NULL))
        return g3_fail(r->err, G3_ERR_UNSUPPORTED, "%s: %s at byte %llu: unknown tensor type id %u", r->path, r->what,
                       (unsigned long long)at, t->type);
    if (t->ne[0] % block != 0)
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s: ne[0] = %lld is not a multiple of the %s block size %d",
                       r->path, r->what, (long long)t->ne[0], tn, block);
    t->nbytes = g3_gguf_tensor_nbytes(t->type, (int)t->n_dims, t->ne);
    if (t->nbytes == 0)
        return g3_fail(r->err, G3_ERR_FORMAT, "%s: %s: byte size of %s [%lld, %lld, %lld, %lld] overflows", r->path,
                       r->what, tn, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3]);
    return rd_u64(r, &t->offset);
}

static g3_status resolve_tensors(g3_gguf *g, g3_error *err) {
    const char *path = g->map.path;
    uint64_t data_size = g->map.size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        g3_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': offset %llu is not a multiple of the alignment %llu",
                           path, t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return g3_fail(err, G3_ERR_FORMAT,
                           "%s: tensor '%s': bytes %llu..%llu of the data section (file bytes from %llu) run past the "
                           "end of the file (data section holds %llu bytes)",
                           path, t->name, (unsigned long long)t->offset,
                           (unsigned long long)(t->offset + (uint64_t)t->nbytes), (unsigned long long)g->data_offset,
                           (unsigned long long)data_size);
        t->data = g->map.data + g->data_offset + t->offset;
    }
    if (g->n_tensors == 0) return G3_OK;
    g->by_name = malloc(g->n_tensors * sizeof *g->by_name);
    uint32_t *by_off = malloc(g->n_tensors * sizeof *by_off);
    if (!g->by_name || !by_off) {
        free(by_off);
        return g3_fail(err, G3_ERR_NOMEM, "%s: no memory to index %llu tensors", path,
                       (unsigned long long)g->n_tensors);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) g->by_name[i] = by_off[i] = (uint32_t)i;
    t_sort_g = g;
    qsort(g->by_name, g->n_tensors, sizeof *g->by_name, cmp_tensor_name);
    qsort(by_off, g->n_tensors, sizeof *by_off, cmp_tensor_off);
    g3_status rc = G3_OK;
    for (uint64_t i = 1; i < g->n_tensors && rc == G3_OK; i++) {
        const g3_gguf_tensor *a = &g->tensors[g->by_name[i - 1]], *b = &g->tensors[g->by_name[i]];
        if (strcmp(a->name, b->name) == 0)
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: duplicate tensor name '%s' (tensors %u and %u)", path, a->name,
                         g->by_name[i - 1], g->by_name[i]);
    }
    for (uint64_t i = 1; i < g->n_tensors && rc == G3_OK; i++) {
        const g3_gguf_tensor *a = &g->tensors[by_off[i - 1]], *b = &g->tensors[by_off[i]];
        if (a->offset + a->nbytes > b->offset)
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: tensors '%s' (bytes %llu..%llu) and '%s' (from %llu) overlap", path,
                         a->name, (unsigned long long)a->offset, (unsigned long long)(a->offset + a->nbytes), b->name,
                         (unsigned long long)b->offset);
    }
    free(by_off);
    return rc;
}

static g3_status read_alignment(g3_gguf *g, g3_error *err) {
    g->alignment = 32;
    const g3_gguf_kv *kv = g3_gguf_find(g, "general.alignment");
    if (!kv) return G3_OK;
    int64_t a;
    if (!g3_gguf_get_int(g, "general.alignment", &a) || kv->type == G3_GGUF_BOOL)
        return g3_fail(err, G3_ERR_FORMAT, "%s: general.alignment has type %s, expected an unsigned integer",
                       g->map.path, type_name(kv->type));
    if (a <= 0 || a > GGUF_MAX_ALIGNMENT || (a & (a - 1)) != 0)
        return g3_fail(err, G3_ERR_FORMAT, "%s: general.alignment = %lld is not a power of two in 1..%u", g->map.path,
                       (long long)a, GGUF_MAX_ALIGNMENT);
    g->alignment = (uint64_t)a;
    return G3_OK;
}

static g3_status parse(g3_gguf *g, g3_error *err) {
    rd r = {.p = g->map.data, .size = g->map.size, .path = g->map.path, .err = err};
    char magic[4];
    snprintf(r.what, sizeof r.what, "magic");
    G3_TRY(rd_bytes(&r, magic, 4));
    if (memcmp(magic, "GGUF", 4) != 0)
        return g3_fail(err, G3_ERR_FORMAT, "%s: not a GGUF file (magic bytes %02x %02x %02x %02x, expected \"GGUF\")",
                       r.path, (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]);
    snprintf(r.what, sizeof r.what, "version");
    G3_TRY(rd_u32(&r, &g->version));
    if (g->version != 2 && g->version != 3) {
        if (g->version == 1)
            return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (2 or 3)", r.path);
        if ((g->version & 0xffff) == 0 && g->version != 0)
            return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: big-endian GGUF (version field 0x%08x) is not supported",
                           r.path, g->version);
        return g3_fail(err, G3_ERR_FORMAT, "%s: unknown GGUF version %u at byte 4 (expected 2 or 3)", r.path,
                       g->version);
    }
    snprintf(r.what, sizeof r.what, "tensor count");
    G3_TRY(rd_u64(&r, &g->n_tensors));
    snprintf(r.what, sizeof r.what, "kv count");
    G3_TRY(rd_u64(&r, &g->n_kv));
    uint64_t left = r.size - r.pos;
    if (g->n_kv > left / GGUF_MIN_KV_BYTES || g->n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        g->n_kv * GGUF_MIN_KV_BYTES + g->n_tensors * GGUF_MIN_TENSOR_BYTES > left)
        return g3_fail(err, G3_ERR_FORMAT,
                       "%s: header at byte 8 claims %llu tensors and %llu kv pairs, which cannot fit in the %llu bytes "
                       "that follow",
                       r.path, (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv, (unsigned long long)left);
    if (g->n_kv > GGUF_MAX_KV || g->n_tensors > GGUF_MAX_TENSORS)
        return g3_fail(err, G3_ERR_FORMAT,
                       "%s: header at byte 8 claims %llu tensors and %llu kv pairs; this reader accepts at most %u and %u",
                       r.path, (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv, GGUF_MAX_TENSORS,
                       GGUF_MAX_KV);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return g3_fail(err, G3_ERR_NOMEM, "%s: no memory for the header tables", r.path);
    for (uint64_t i = 0; i < g->n_kv; i++) G3_TRY(read_kv(&r, i, &g->kv[i]));
    G3_TRY(check_duplicate_keys(g, err));
    G3_TRY(read_alignment(g, err));
    for (uint64_t i = 0; i < g->n_tensors; i++) G3_TRY(read_tensor_info(&r, i, &g->tensors[i]));
    g->data_offset = (r.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors > 0 && g->data_offset > r.size)
        return g3_fail(err, G3_ERR_FORMAT, "%s: data section would start at byte %llu, past the end of the file (%llu)",
                       r.path, (unsigned long long)g->data_offset, (unsigned long long)r.size);
    if (g->data_offset > r.size) g->data_offset = r.size;
    return resolve_tensors(g, err);
}

g3_status g3_gguf_open(g3_gguf *g, const char *path, g3_error *err) {
    memset(g, 0, sizeof *g);
    G3_TRY(g3_mmap_open(&g->map, path, err));
    g3_status rc = parse(g, err);
    if (rc != G3_OK) g3_gguf_close(g);
    return rc;
}

void g3_gguf_close(g3_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].arr_str_off);
    free(g->kv);
    free(g->tensors);
    free(g->by_name);
    g3_mmap_close(&g->map);
    memset(g, 0, sizeof *g);
}

/* ---- lookups -------------------------------------------------------------------------------------------- */
const g3_gguf_kv *g3_gguf_find(const g3_gguf *g, const char *key) {
    if (!g || !g->kv || !key) return NULL;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.s && str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const g3_gguf_tensor *g3_gguf_find_tensor(const g3_gguf *g, const char *name) {
    if (!g || !g->by_name || !name) return NULL;
    size_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const g3_gguf_tensor *t = &g->tensors[g->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int g3_gguf_get_int(const g3_gguf *g, const char *key, int64_t *out) {
    const g3_gguf_kv *kv = g3_gguf_find(g, key);
    if (!kv) return 0;
    switch (kv->type) {
    case G3_GGUF_U8: case G3_GGUF_U16: case G3_GGUF_U32: case G3_GGUF_U64: case G3_GGUF_BOOL:
        if (kv->v.u > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)kv->v.u;
        return 1;
    case G3_GGUF_I8: case G3_GGUF_I16: case G3_GGUF_I32: case G3_GGUF_I64: *out = kv->v.i; return 1;
    default: return 0;
    }
}

int g3_gguf_get_float(const g3_gguf *g, const char *key, double *out) {
    const g3_gguf_kv *kv = g3_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type == G3_GGUF_F32 || kv->type == G3_GGUF_F64) {
        *out = kv->v.f;
        return 1;
    }
    if (kv->type == G3_GGUF_BOOL) return 0;
    int64_t i;
    if (!g3_gguf_get_int(g, key, &i)) {
        if (kv->type != G3_GGUF_U64) return 0;
        *out = (double)kv->v.u;
        return 1;
    }
    *out = (double)i;
    return 1;
}

int g3_gguf_get_str(const g3_gguf *g, const char *key, char *out, size_t cap) {
    const g3_gguf_kv *kv = g3_gguf_find(g, key);
    if (!kv || kv->type != G3_GGUF_STRING || cap == 0) return 0;
    size_t n = kv->str.len < cap - 1 ? (size_t)kv->str.len : cap - 1;
    memcpy(out, kv->str.s, n);
    out[n] = 0;
    return 1;
}

g3_gguf_str g3_gguf_arr_str(const g3_gguf_kv *kv, uint64_t i) {
    g3_gguf_str s = {NULL, 0};
    if (!kv || kv->type != G3_GGUF_ARRAY || kv->arr_type != G3_GGUF_STRING || !kv->arr_str_off || i >= kv->arr_n)
        return s;
    const uint8_t *p = kv->arr_data + kv->arr_str_off[i];
    memcpy(&s.len, p, 8);
    s.s = (const char *)p + 8;
    return s;
}
