/* Helpers shared by the cmocka tests: where the sources and fixtures are, reading files, float comparisons. */
#ifndef G3_TESTUTIL_H
#define G3_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "gemma3.h"

/* $G3_SOURCE_DIR (set by ctest) or ".". */
const char *tu_source_dir(void);
/* Path of a fixture model folder: tests/data/NAME in the repository if present, else $G3_FIXTURES/NAME.
 * Returns NULL when neither exists. The string is static (overwritten by the next call). */
const char *tu_fixture(const char *name);
/* The one test of a CUDA test binary built without CUDA (no nvcc): prints why and skips. */
void tu_skip_no_cuda(void **state);
/* The same for the test binaries of a build without the Vulkan backend. */
void tu_skip_no_vulkan(void **state);
/* Whole file into a malloc'd NUL-terminated buffer; NULL if unreadable. */
char *tu_read_file(const char *path, size_t *len);
/* A fresh temporary directory (removed by the OS eventually); static string. */
const char *tu_tmpdir(void);
/* Max |a-b| over n floats. */
double tu_max_abs_diff(const float *a, const float *b, size_t n);

/* A fixture's reference.json (schema in ../shared/fixtures/README.md), as the parity tests read it. */
typedef struct tu_ref_prompt {
    const char *kind;
    int32_t *ids;          /* n prompt ids followed by the 32 generated ones */
    int n;
    int32_t gen[32];       /* greedy continuation */
    float margins[32];     /* top1 - top2 of the logits that chose gen[k] */
    const cJSON *last;     /* last_prompt_logits */
    const cJSON *all;      /* all_prompt_logits or NULL */
    const cJSON *steps;    /* generated_step_logits or NULL */
} tu_ref_prompt;

typedef struct tu_reference {
    cJSON *root;
    char *text;
    int vocab;
    tu_ref_prompt p[4];
    int n_prompts;
} tu_reference;

/* Loads DIR/reference.json; returns 0 when the file is absent (asserts on a malformed one). */
int tu_ref_load(const char *dir, tu_reference *r);
void tu_ref_free(tu_reference *r);
/* A JSON array of n numbers into floats (asserts the length). */
void tu_row_from_json(const cJSON *arr, float *out, int n);
/* KL(softmax(ref) || softmax(ours)) in nats over one row of n logits; *same_top1 = 1 when both rows have their
 * (first) largest logit at the same index. */
double tu_kl(const float *ref, const float *ours, int n, int *same_top1);
/* max |ours - ref| / max(1, max |ref|) over one row (NaN counts as infinite). */
double tu_rel_err(const float *ours, const float *ref, int n);
/* The largest tu_rel_err over `rows` consecutive rows of n values each. */
double tu_rel_err_rows(const float *ours, const float *ref, int rows, int n);
/* Logits of every reference prompt through the engine e (each prompt in a fresh sequence): every position that has
 * reference logits, and with steps also the decode-step logits (prompt + generated_ids[:k]). Fails the test naming
 * `what`, the prompt and the position when one differs by more than tol (relative, as tu_rel_err); tol < 0 only
 * measures. Returns the largest error. */
double tu_ref_logit_error(g3_engine *e, const tu_reference *r, int steps, double tol, const char *what);

#endif
