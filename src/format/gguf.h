/* GGUF v2/v3 reader: parses the header, metadata and tensor infos of a memory-mapped file and validates every
 * offset, count and size against the file's length before anything is used. Tensor data stay in the mapping.
 *
 * Layout: magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv | kv[n_kv] | tensor_info[n_tensors] |
 *         padding to alignment (general.alignment, default 32) | tensor data. */
#ifndef G3_FORMAT_GGUF_H
#define G3_FORMAT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/mmap_file.h"
#include "core/status.h"

typedef enum g3_gguf_type {
    G3_GGUF_U8 = 0, G3_GGUF_I8 = 1, G3_GGUF_U16 = 2, G3_GGUF_I16 = 3, G3_GGUF_U32 = 4, G3_GGUF_I32 = 5,
    G3_GGUF_F32 = 6, G3_GGUF_BOOL = 7, G3_GGUF_STRING = 8, G3_GGUF_ARRAY = 9, G3_GGUF_U64 = 10,
    G3_GGUF_I64 = 11, G3_GGUF_F64 = 12,
} g3_gguf_type;

typedef struct g3_gguf_str {
    const char *s; /* points into the mapping: NOT NUL-terminated */
    uint64_t len;
} g3_gguf_str;

typedef struct g3_gguf_kv {
    g3_gguf_str key;
    g3_gguf_type type;
    /* scalar value (type != ARRAY/STRING) */
    union { uint64_t u; int64_t i; double f; } v;
    g3_gguf_str str;          /* type == STRING */
    g3_gguf_type arr_type;    /* type == ARRAY: element type */
    uint64_t arr_n;           /* type == ARRAY: element count */
    const uint8_t *arr_data;  /* type == ARRAY: first element in the mapping (strings: u64 len + bytes each) */
    uint64_t *arr_str_off;    /* ARRAY of STRING: byte offset of element i from arr_data (malloc'd, [arr_n]) */
} g3_gguf_kv;

typedef struct g3_gguf_tensor {
    char name[128];      /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[4];       /* ne[0] is the contiguous (innermost) dimension, as in GGUF */
    uint32_t type;       /* GGUF type id = g3_dtype value */
    uint64_t offset;     /* relative to the data section */
    const uint8_t *data; /* resolved pointer into the mapping */
    size_t nbytes;
} g3_gguf_tensor;

typedef struct g3_gguf {
    g3_mmap map;
    uint32_t version;
    uint64_t alignment;
    uint64_t n_kv, n_tensors;
    g3_gguf_kv *kv;
    g3_gguf_tensor *tensors;
    uint64_t data_offset;
    uint32_t *by_name;   /* [n_tensors] tensor indices sorted by name (for g3_gguf_find_tensor) */
} g3_gguf;

/* Opens and validates; on failure everything is released and err names the file, the field and the byte offset. */
g3_status g3_gguf_open(g3_gguf *g, const char *path, g3_error *err);
void g3_gguf_close(g3_gguf *g);

const g3_gguf_kv *g3_gguf_find(const g3_gguf *g, const char *key);
const g3_gguf_tensor *g3_gguf_find_tensor(const g3_gguf *g, const char *name);
/* Typed getters: return 1 and set *out when the key exists with a compatible (numeric) type, else 0. */
int g3_gguf_get_int(const g3_gguf *g, const char *key, int64_t *out);
int g3_gguf_get_float(const g3_gguf *g, const char *key, double *out);
/* Copies a string value, NUL-terminated and truncated to cap. */
int g3_gguf_get_str(const g3_gguf *g, const char *key, char *out, size_t cap);
/* Iterates a string array: returns the i-th string (validated at open). {NULL, 0} when kv is not a string
 * array or i is out of range. O(1). */
g3_gguf_str g3_gguf_arr_str(const g3_gguf_kv *kv, uint64_t i);

/* Bytes of one element of a scalar kv type (0 for STRING, ARRAY and unknown types). */
size_t g3_gguf_type_size(uint32_t kv_type);
/* Tensor element types known to this reader (the ggml list, removed ids excluded): name and block layout.
 * Returns 0 for an unknown id. */
int g3_gguf_dtype_layout(uint32_t type, const char **name, int *block, size_t *block_bytes);
/* Bytes of a tensor of this type and shape (ne[0] contiguous); 0 if the type is unknown, ne[0] is not a
 * multiple of the block size, a dimension is < 1, or the size overflows. */
size_t g3_gguf_tensor_nbytes(uint32_t type, int n_dims, const int64_t *ne);

/* ---- writer ---------------------------------------------------------------------------------------------- */
typedef struct g3_gguf_writer g3_gguf_writer;
g3_status g3_gguf_writer_create(g3_gguf_writer **w, g3_error *err);
void g3_gguf_writer_free(g3_gguf_writer *w);
void g3_gguf_w_u32(g3_gguf_writer *w, const char *key, uint32_t v);
void g3_gguf_w_f32(g3_gguf_writer *w, const char *key, float v);
void g3_gguf_w_bool(g3_gguf_writer *w, const char *key, int v);
void g3_gguf_w_str(g3_gguf_writer *w, const char *key, const char *v);
void g3_gguf_w_arr_str(g3_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
void g3_gguf_w_arr_f32(g3_gguf_writer *w, const char *key, const float *v, uint64_t n);
void g3_gguf_w_arr_i32(g3_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Tensor data is copied at write time from `data` (must stay valid until g3_gguf_writer_write). */
void g3_gguf_w_tensor(g3_gguf_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
                      const void *data, size_t nbytes);
g3_status g3_gguf_writer_write(g3_gguf_writer *w, const char *path, g3_error *err);

/* Additions. Setting a key that is already set replaces its value (so a copied file's keys can be overridden).
 * Errors (bad name, size mismatch, duplicate tensor, no memory) are kept and returned by g3_gguf_writer_write. */
void g3_gguf_w_i32(g3_gguf_writer *w, const char *key, int32_t v);
void g3_gguf_w_u64(g3_gguf_writer *w, const char *key, uint64_t v);
void g3_gguf_w_i64(g3_gguf_writer *w, const char *key, int64_t v);
void g3_gguf_w_f64(g3_gguf_writer *w, const char *key, double v);
/* Array of a scalar element type (not STRING/ARRAY); v holds n little-endian elements of that type. */
void g3_gguf_w_arr(g3_gguf_writer *w, const char *key, g3_gguf_type elem_type, const void *v, uint64_t n);
/* Copies a kv read by g3_gguf_open (any type), e.g. to carry a source file's metadata over. */
void g3_gguf_w_kv(g3_gguf_writer *w, const g3_gguf_kv *kv);
/* A tensor whose bytes are produced at write time (e.g. quantized one at a time, so that the whole output never
 * has to sit in memory): fill(ctx, dst, nbytes, err) writes exactly nbytes into dst. */
typedef g3_status (*g3_gguf_fill_fn)(void *ctx, void *dst, size_t nbytes, g3_error *err);
void g3_gguf_w_tensor_fill(g3_gguf_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
                           size_t nbytes, g3_gguf_fill_fn fill, void *ctx);

#endif
