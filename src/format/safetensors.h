/* Safetensors reader: one file or a sharded set (model.safetensors.index.json). Each file is memory-mapped; the
 * JSON header is parsed with cJSON and every tensor's dtype, shape and byte range is checked against the file.
 *
 * File layout: u64 little-endian header length N | N bytes of JSON {name: {dtype, shape, data_offsets:[b,e]}, ...}
 *              | data (offsets relative to the end of the header). */
#ifndef G3_FORMAT_SAFETENSORS_H
#define G3_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/mmap_file.h"
#include "core/status.h"

typedef struct g3_st_tensor {
    char *name;           /* malloc'd */
    int dtype;            /* g3_dtype: F32, F16 or BF16; -1 for any other dtype (kept so that a loader can skip
                             unneeded tensors, e.g. a vision tower, and refuse a needed one by name) */
    char dtype_name[16];  /* the dtype string as written ("BF16", "I64", "F8_E4M3", ...), truncated */
    int n_dims;
    int64_t shape[4];     /* as written: shape[0] outermost (HF weight [out, in]) */
    const uint8_t *data;  /* into the mapping */
    size_t nbytes;
    int file;             /* index of the shard */
} g3_st_tensor;

/* tensors[] is sorted by name (g3_st_find is a binary search); names are unique across all shards. */
typedef struct g3_safetensors {
    g3_mmap *files;
    int n_files;
    g3_st_tensor *tensors;
    size_t n_tensors;
} g3_safetensors;

/* dir is a folder: opens model.safetensors, or the shards listed by model.safetensors.index.json.
 * progress: if non-NULL, called with (bytes done, bytes total) while files are mapped/validated. */
g3_status g3_st_open_dir(g3_safetensors *st, const char *dir, g3_error *err);
/* A single .safetensors file. */
g3_status g3_st_open_file(g3_safetensors *st, const char *path, g3_error *err);
void g3_st_close(g3_safetensors *st);
const g3_st_tensor *g3_st_find(const g3_safetensors *st, const char *name);

#endif
