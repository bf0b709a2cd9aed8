/* Small helpers shared by the test_format_*.c tests (header-only, static): byte buffers for hand-made files,
 * whole-file writes, a seeded RNG and a minimal safetensors writer. */
#ifndef G3_FORMAT_TESTUTIL_H
#define G3_FORMAT_TESTUTIL_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FT_UNUSED __attribute__((unused))

typedef struct ft_buf {
    uint8_t *p;
    size_t n, cap;
} ft_buf;

static FT_UNUSED void ft_put(ft_buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort(); /* test helper: out of memory is fatal */
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static FT_UNUSED void ft_u32(ft_buf *b, uint32_t v) { ft_put(b, &v, 4); }
static FT_UNUSED void ft_u64(ft_buf *b, uint64_t v) { ft_put(b, &v, 8); }
static FT_UNUSED void ft_str(ft_buf *b, const char *s) {
    ft_u64(b, strlen(s));
    ft_put(b, s, strlen(s));
}
static FT_UNUSED void ft_pad(ft_buf *b, size_t align) {
    static const uint8_t z[64];
    while (b->n % align) ft_put(b, z, 1);
}

static FT_UNUSED int ft_write(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n;
}

/* xorshift64*: deterministic per seed. */
static FT_UNUSED uint64_t ft_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* One tensor for ft_st_write. */
typedef struct ft_st_entry {
    const char *name;
    const char *dtype;
    int n_dims;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
} ft_st_entry;

/* Writes a safetensors file holding the entries in order (header padded with spaces to 8 bytes, as the reference
 * writer does). Returns 1 on success. */
static FT_UNUSED int ft_st_write(const char *path, const ft_st_entry *e, int n) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(root, e[i].name);
        cJSON_AddStringToObject(t, "dtype", e[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e[i].n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + e[i].nbytes)));
        off += e[i].nbytes;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    ft_buf b = {0};
    uint64_t hl = strlen(js);
    while (hl % 8) hl++;
    ft_u64(&b, hl);
    ft_put(&b, js, strlen(js));
    while (b.n < 8 + hl) ft_put(&b, " ", 1);
    for (int i = 0; i < n; i++) ft_put(&b, e[i].data, e[i].nbytes);
    free(js);
    int ok = ft_write(path, b.p, b.n);
    free(b.p);
    return ok;
}

#endif
