/* Safetensors reader: maps one file or every shard named by model.safetensors.index.json, parses each JSON
 * header with cJSON and checks every tensor's dtype, shape and byte range against its file before use.
 *
 *   u64 N (little-endian) | N bytes of JSON {"name": {"dtype": "BF16", "shape": [out, in],
 *                                            "data_offsets": [begin, end]}, "__metadata__": {...}}
 *   | data section (offsets relative to its start, i.e. file byte 8 + N)
 *
 * The tensor table ends up sorted by name, and names must be unique across all shards. */
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gemma3.h"

#define ST_MAX_HEADER (100u * 1000u * 1000u)
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact in a double */

/* Element size of a dtype string; 0 when unknown (the tensor is kept, its size is only range-checked). */
static size_t dtype_size(const char *s, int *g3type) {
    static const struct { const char *name; size_t size; int g3; } k[] = {
        {"F32", 4, G3_DTYPE_F32}, {"F16", 2, G3_DTYPE_F16}, {"BF16", 2, G3_DTYPE_BF16}, {"F64", 8, -1},
        {"I64", 8, -1},           {"U64", 8, -1},           {"I32", 4, -1},            {"U32", 4, -1},
        {"I16", 2, -1},           {"U16", 2, -1},           {"I8", 1, -1},             {"U8", 1, -1},
        {"BOOL", 1, -1},          {"F8_E4M3", 1, -1},       {"F8_E5M2", 1, -1},        {"F8_E8M0", 1, -1},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcmp(s, k[i].name) == 0) {
            *g3type = k[i].g3;
            return k[i].size;
        }
    *g3type = -1;
    return 0;
}

/* A JSON number that is an exact non-negative integer. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double d = j->valuedouble;
    if (!(d >= 0) || d > ST_MAX_EXACT || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static g3_status push_tensor(g3_safetensors *st, size_t *cap, const g3_st_tensor *t, const char *path,
                             g3_error *err) {
    if (st->n_tensors == *cap) {
        size_t nc = *cap ? 2 * *cap : 256;
        g3_st_tensor *p = realloc(st->tensors, nc * sizeof *p);
        if (!p) return g3_fail(err, G3_ERR_NOMEM, "%s: no memory for the tensor table", path);
        st->tensors = p;
        *cap = nc;
    }
    st->tensors[st->n_tensors++] = *t;
    return G3_OK;
}

/* Validates one header entry and fills t (name not yet set). */
static g3_status parse_entry(const cJSON *e, const char *path, const char *name, const uint8_t *data,
                             uint64_t data_size, g3_st_tensor *t, g3_error *err) {
    if (!cJSON_IsObject(e))
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd) || !jd->valuestring)
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': field \"dtype\" is missing or not a string", path, name);
    if (!cJSON_IsArray(js))
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': field \"shape\" is missing or not an array", path, name);
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': field \"data_offsets\" is not an array of 2 numbers",
                       path, name);
    size_t es = dtype_size(jd->valuestring, &t->dtype);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", jd->valuestring);
    int nd = cJSON_GetArraySize(js);
    if (nd > 4)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: tensor '%s': %d dimensions (at most 4 are supported)", path, name,
                       nd);
    t->n_dims = nd;
    uint64_t elems = 1;
    for (int d = 0; d < 4; d++) t->shape[d] = 1;
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        const cJSON *x = cJSON_GetArrayItem(js, d);
        if (!json_uint(x, &v))
            return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer below 2^53",
                           path, name, d);
        if (__builtin_mul_overflow(elems, v, &elems) || elems > (uint64_t)INT64_MAX)
            return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': element count of the shape overflows at shape[%d]",
                           path, name, d);
        t->shape[d] = (int64_t)v;
    }
    uint64_t b, en;
    if (!json_uint(cJSON_GetArrayItem(jo, 0), &b) || !json_uint(cJSON_GetArrayItem(jo, 1), &en))
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s': data_offsets are not non-negative integers", path, name);
    if (b > en || en > data_size)
        return g3_fail(err, G3_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] are not an in-order range inside the %llu-byte data "
                       "section",
                       path, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
    uint64_t want;
    if (es && (__builtin_mul_overflow(elems, (uint64_t)es, &want) || want != en - b))
        return g3_fail(err, G3_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s with %llu elements needs "
                       "%llu",
                       path, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b),
                       t->dtype_name, (unsigned long long)elems, (unsigned long long)(elems * es));
    t->data = data + b;
    t->nbytes = (size_t)(en - b);
    return G3_OK;
}

/* Maps st->files[fi] (already opened) and appends its tensors. */
static g3_status parse_file(g3_safetensors *st, int fi, size_t *cap, g3_error *err) {
    const g3_mmap *m = &st->files[fi];
    const char *path = m->path;
    uint64_t n;
    if (m->size < 8)
        return g3_fail(err, G3_ERR_FORMAT, "%s: file of %zu bytes is too short for a safetensors header", path,
                       m->size);
    memcpy(&n, m->data, 8);
    if (n < 2 || n > m->size - 8 || n >= ST_MAX_HEADER)
        return g3_fail(err, G3_ERR_FORMAT,
                       "%s: header length %llu at byte 0 is not in 2..%llu (file has %zu bytes, limit %u)", path,
                       (unsigned long long)n, (unsigned long long)(m->size - 8), m->size, ST_MAX_HEADER);
    const char *js = (const char *)m->data + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(js, (size_t)n, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= js && at <= js + n ? (size_t)(at - js) : 0;
        return g3_fail(err, G3_ERR_FORMAT, "%s: header is not valid JSON (near header byte %zu, file byte %zu)", path,
                       off, off + 8);
    }
    for (const char *p = end ? end : js + n; p < js + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != 0) {
            cJSON_Delete(root);
            return g3_fail(err, G3_ERR_FORMAT, "%s: unexpected bytes after the JSON header at file byte %zu", path,
                           (size_t)(p - js) + 8);
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g3_fail(err, G3_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    const uint8_t *data = m->data + 8 + n;
    uint64_t data_size = m->size - 8 - n;
    g3_status rc = G3_OK;
    for (const cJSON *e = root->child; e && rc == G3_OK; e = e->next) {
        if (!e->string) continue;
        if (strcmp(e->string, "__metadata__") == 0) continue;
        g3_st_tensor t = {.file = fi};
        rc = parse_entry(e, path, e->string, data, data_size, &t, err);
        if (rc != G3_OK) break;
        if (!(t.name = strdup(e->string))) rc = g3_fail(err, G3_ERR_NOMEM, "%s: no memory", path);
        if (rc == G3_OK) rc = push_tensor(st, cap, &t, path, err);
        if (rc != G3_OK) free(t.name);
    }
    cJSON_Delete(root);
    return rc;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const g3_st_tensor *)a)->name, ((const g3_st_tensor *)b)->name);
}

static g3_status finish(g3_safetensors *st, g3_error *err) {
    if (st->n_tensors) qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_tensor);
    for (size_t i = 1; i < st->n_tensors; i++) {
        const g3_st_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (strcmp(a->name, b->name) == 0)
            return g3_fail(err, G3_ERR_FORMAT, "duplicate tensor '%s' in %s and %s", a->name, st->files[a->file].path,
                           st->files[b->file].path);
    }
    return G3_OK;
}

/* Opens the given paths as shards 0..n-1. */
static g3_status open_paths(g3_safetensors *st, char **paths, int n, g3_error *err) {
    memset(st, 0, sizeof *st);
    st->files = calloc((size_t)(n ? n : 1), sizeof *st->files);
    if (!st->files) return g3_fail(err, G3_ERR_NOMEM, "safetensors: no memory");
    size_t cap = 0;
    g3_status rc = G3_OK;
    for (int i = 0; i < n && rc == G3_OK; i++) {
        rc = g3_mmap_open(&st->files[i], paths[i], err);
        if (rc == G3_OK) st->n_files = i + 1;
        if (rc == G3_OK) rc = parse_file(st, i, &cap, err);
    }
    if (rc == G3_OK) rc = finish(st, err);
    if (rc != G3_OK) g3_st_close(st);
    return rc;
}

g3_status g3_st_open_file(g3_safetensors *st, const char *path, g3_error *err) {
    char *p = (char *)path;
    return open_paths(st, &p, 1, err);
}

static int file_exists(const char *p) {
    struct stat s;
    return stat(p, &s) == 0;
}

/* Reads index.json: the deduplicated shard file names (in order of first appearance) as full paths. */
static g3_status read_index(const char *dir, const char *ipath, char ***out_paths, int *out_n, cJSON **out_root,
                            g3_error *err) {
    g3_mmap m;
    G3_TRY(g3_mmap_open(&m, ipath, err));
    if (m.size >= ST_MAX_HEADER) {
        g3_mmap_close(&m);
        return g3_fail(err, G3_ERR_FORMAT, "%s: %zu bytes is too large for an index", ipath, m.size);
    }
    cJSON *root = m.size ? cJSON_ParseWithLength((const char *)m.data, m.size) : NULL;
    g3_mmap_close(&m);
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return g3_fail(err, G3_ERR_FORMAT, "%s: %s", ipath,
                       root ? "field \"weight_map\" is missing or not an object" : "not valid JSON");
    }
    int n = 0, cap = cJSON_GetArraySize(wm);
    char **paths = calloc((size_t)(cap ? cap : 1), sizeof *paths);
    if (!paths) {
        cJSON_Delete(root);
        return g3_fail(err, G3_ERR_NOMEM, "%s: no memory", ipath);
    }
    g3_status rc = G3_OK;
    for (const cJSON *e = wm->child; e && rc == G3_OK; e = e->next) {
        const char *f = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!f || !*f || strchr(f, '/') || strcmp(f, "..") == 0) {
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a plain file name in the folder", ipath,
                         e->string ? e->string : "");
            break;
        }
        char full[1024];
        snprintf(full, sizeof full, "%s/%s", dir, f);
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = strcmp(paths[i], full) == 0;
        if (seen) continue;
        if (!file_exists(full))
            rc = g3_fail(err, G3_ERR_IO, "%s: shard '%s' (holding '%s') does not exist", ipath, full,
                         e->string ? e->string : "");
        else if (!(paths[n] = strdup(full)))
            rc = g3_fail(err, G3_ERR_NOMEM, "%s: no memory", ipath);
        else
            n++;
    }
    if (rc == G3_OK && n == 0) rc = g3_fail(err, G3_ERR_FORMAT, "%s: weight_map lists no shards", ipath);
    if (rc != G3_OK) {
        for (int i = 0; i < n; i++) free(paths[i]);
        free(paths);
        cJSON_Delete(root);
        return rc;
    }
    *out_paths = paths;
    *out_n = n;
    *out_root = root;
    return G3_OK;
}

/* Every tensor the index names must be in the shard it names. */
static g3_status check_index(const g3_safetensors *st, const cJSON *root, const char *dir, const char *ipath,
                             g3_error *err) {
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    for (const cJSON *e = wm->child; e; e = e->next) {
        const g3_st_tensor *t = g3_st_find(st, e->string);
        char full[1024];
        snprintf(full, sizeof full, "%s/%s", dir, e->valuestring);
        if (!t || strcmp(st->files[t->file].path, full) != 0)
            return g3_fail(err, G3_ERR_FORMAT, "%s: tensor '%s' is listed in shard %s but %s", ipath, e->string,
                           e->valuestring, t ? "found in another shard" : "not found in it");
    }
    return G3_OK;
}

g3_status g3_st_open_dir(g3_safetensors *st, const char *dir, g3_error *err) {
    memset(st, 0, sizeof *st);
    char ipath[1024], single[1024];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    if (!file_exists(ipath)) {
        if (!file_exists(single))
            return g3_fail(err, G3_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json found", dir);
        return g3_st_open_file(st, single, err);
    }
    char **paths = NULL;
    int n = 0;
    cJSON *root = NULL;
    G3_TRY(read_index(dir, ipath, &paths, &n, &root, err));
    g3_status rc = open_paths(st, paths, n, err);
    if (rc == G3_OK) {
        rc = check_index(st, root, dir, ipath, err);
        if (rc != G3_OK) g3_st_close(st);
    }
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
    cJSON_Delete(root);
    return rc;
}

void g3_st_close(g3_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_files; i++) g3_mmap_close(&st->files[i]);
    free(st->files);
    memset(st, 0, sizeof *st);
}

const g3_st_tensor *g3_st_find(const g3_safetensors *st, const char *name) {
    if (!st || !st->tensors || !name) return NULL;
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
