/* Read-only memory-mapped files. */
#include "core/mmap_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

g3_status g3_mmap_open(g3_mmap *m, const char *path, g3_error *err) {
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return g3_fail(err, G3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return g3_fail(err, G3_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return g3_fail(err, G3_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return g3_fail(err, G3_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, m->size, strerror(errno));
        }
        m->data = p;
    }
    close(fd);
    return G3_OK;
}

void g3_mmap_close(g3_mmap *m) {
    if (m && m->data) munmap((void *)m->data, m->size);
    if (m) {
        m->data = NULL;
        m->size = 0;
    }
}
