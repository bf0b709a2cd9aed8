/* Helpers shared by the CUDA kernel tests (tests/unit/test_cuda_*.c): the GPU check that skips a test, the
 * deterministic random stream, and the matrix-product runner with its double reference and tolerances. */
#ifndef G3_CUDA_TESTUTIL_H
#define G3_CUDA_TESTUTIL_H

#ifdef G3_HAVE_CUDA
#include <stdint.h>

/* Skips the calling test (cmocka) with a message when no CUDA device is present. */
void need_gpu(void);
/* uniform [-1, 1): one xorshift stream per test binary, same seed in every binary */
float frand(void);
/* cmocka setup: restarts the stream, so that a test's data do not depend on the tests run before it; from the seed
 * $G3_TEST_SEED (a nonzero integer) where set, to rerun a test on other data */
int frand_restart(void **state);
/* $G3_TEST_FILTER (a cmocka pattern, e.g. "test_qgemv_pn"): runs only the tests it matches */
void test_filter_from_env(void);
/* gelu (tanh form, as the kernels) of the gate g times the up value u, in double */
double geglu_ref(double g, double u);
/* y = x W^T in double from the dequantized weights; returns max |y - ref| / max|ref| */
double check_mm(const float *wdeq, int n, int k, const float *x, int m, const float *y, int geglu);
/* One product through g3_cuda_test_matmul on random float weights quantized to `quant`: fails the test when the
 * resident weights differ by more than tol_w or the product by more than tol_y (check_mm). */
void run_mm(const char *quant, int n, int k, int m, int gemm, int geglu, double tol_w, double tol_y);
/* relative product error allowed for a format, row count and gemm mode (see cuda_testutil.c) */
double tol_for(const char *quant, int m, int gemm);
#endif

#endif
