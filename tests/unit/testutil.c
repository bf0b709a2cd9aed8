/* Helpers shared by the cmocka tests. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *tu_source_dir(void) {
    const char *s = getenv("G3_SOURCE_DIR");
    return s && *s ? s : ".";
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

const char *tu_fixture(const char *name) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/%s", tu_source_dir(), name);
    if (is_dir(path)) return path;
    const char *f = getenv("G3_FIXTURES");
    if (f && *f) {
        snprintf(path, sizeof path, "%s/%s", f, name);
        if (is_dir(path)) return path;
    }
    snprintf(path, sizeof path, "%s/../shared/fixtures/%s", tu_source_dir(), name);
    if (is_dir(path)) return path;
    return NULL;
}

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); return NULL; }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return NULL; }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    if (len) *len = got;
    return buf;
}

const char *tu_tmpdir(void) {
    static char dir[256];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/g3test.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) return "/tmp";
    return dir;
}

double tu_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}
