/* Helpers shared by the cmocka tests: where the sources and fixtures are, reading files, float comparisons. */
#ifndef G3_TESTUTIL_H
#define G3_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* $G3_SOURCE_DIR (set by ctest) or ".". */
const char *tu_source_dir(void);
/* Path of a fixture model folder: tests/data/NAME in the repository if present, else $G3_FIXTURES/NAME.
 * Returns NULL when neither exists. The string is static (overwritten by the next call). */
const char *tu_fixture(const char *name);
/* Whole file into a malloc'd NUL-terminated buffer; NULL if unreadable. */
char *tu_read_file(const char *path, size_t *len);
/* A fresh temporary directory (removed by the OS eventually); static string. */
const char *tu_tmpdir(void);
/* Max |a-b| over n floats. */
double tu_max_abs_diff(const float *a, const float *b, size_t n);

#endif
