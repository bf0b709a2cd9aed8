/* The CPU forward's small operations: the SIMD GeGLU (vector exp) against the libm one over a wide range of
 * inputs, and the SIMD attention inner loops against the portable ones (through G3_CPU_KERNELS). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_ops.h"
#include "testutil.h"

static void test_geglu_matches_libm(void **state) {
    (void)state;
    enum { N = 20011 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        g[i] = -30.0f + 60.0f * (float)i / (N - 1); /* through the saturated tails and around 0 */
        u[i] = 1.0f + 0.001f * (float)(i % 97);
    }
    for (int i = 0; i < N; i++) {
        double x = g[i];
        ref[i] = (float)(0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[i]);
    }
    g3_geglu(g, u, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double err = fabs((double)g[i] - ref[i]) / (fabs(ref[i]) + 1e-6);
        if (err > worst) worst = err;
    }
    printf("  geglu: worst relative error %.3g over %d inputs in [-30, 30]\n", worst, N);
    assert_true(worst < 2e-6);
    free(g), free(u), free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_geglu_matches_libm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
