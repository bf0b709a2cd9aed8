/* Read-only memory-mapped files. */
#ifndef G3_CORE_MMAP_FILE_H
#define G3_CORE_MMAP_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct g3_mmap {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
    char path[512];
} g3_mmap;

g3_status g3_mmap_open(g3_mmap *m, const char *path, g3_error *err);
void g3_mmap_close(g3_mmap *m);

#endif
