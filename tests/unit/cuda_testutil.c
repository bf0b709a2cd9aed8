/* Helpers shared by the CUDA kernel tests (cuda_testutil.h): the GPU check, the random stream and the matrix-product
 * runner. Built into the test_cuda_* binaries of a CUDA build only (CMakeLists.txt). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "cuda_testutil.h"

#include "backend/cuda/cuda_api.h"
#include "model/dtype.h"

void need_gpu(void) {
    if (g3_cuda_device_count() == 0) {
        printf("  no CUDA device: skipped\n");
        skip();
    }
}

#define FRAND_SEED 88172645463325252ull
static uint64_t rs = FRAND_SEED;
float frand(void) { /* uniform [-1, 1) */
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

int frand_restart(void **state) {
    (void)state;
    const char *e = getenv("G3_TEST_SEED");
    const unsigned long long v = e ? strtoull(e, NULL, 10) : 0;
    rs = v ? FRAND_SEED ^ (v * 0x9E3779B97F4A7C15ull) : FRAND_SEED;
    if (!rs) rs = FRAND_SEED; /* xorshift's one fixed point */
    if (v) printf("  G3_TEST_SEED=%llu\n", v);
    return 0;
}

void test_filter_from_env(void) {
    const char *f = getenv("G3_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
}

/* gelu_tanh(g) * u in double (the GeGLU of a gate and up pair) */
double geglu_ref(double g, double u) {
    return 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
}

/* y = x W^T in double from the dequantized weights; returns max |y - ref| / max|ref| */
double check_mm(const float *wdeq, int n, int k, const float *x, int m, const float *y, int geglu) {
    int outw = geglu ? n / 2 : n;
    double mx = 1e-30, d = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < outw; j++) {
            double r;
            if (!geglu) {
                r = 0;
                for (int t = 0; t < k; t++) r += (double)x[(size_t)i * k + t] * wdeq[(size_t)j * k + t];
            } else {
                double g = 0, u = 0;
                for (int t = 0; t < k; t++) {
                    g += (double)x[(size_t)i * k + t] * wdeq[(size_t)(2 * j) * k + t];
                    u += (double)x[(size_t)i * k + t] * wdeq[(size_t)(2 * j + 1) * k + t];
                }
                r = geglu_ref(g, u);
            }
            double e = fabs(r - y[(size_t)i * outw + j]);
            if (isnan(e)) e = INFINITY;
            if (fabs(r) > mx) mx = fabs(r);
            if (e > d) d = e;
        }
    return d / mx;
}

void run_mm(const char *quant, int n, int k, int m, int gemm, int geglu, double tol_w, double tol_y) {
    float *w = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)m * k);
    float *y = malloc(sizeof(float) * (size_t)m * n), *wd = malloc(sizeof(float) * (size_t)n * k);
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand() * 0.1f;
    for (size_t i = 0; i < (size_t)m * k; i++) x[i] = frand();
    for (size_t i = 0; i < (size_t)m * n; i++) y[i] = NAN; /* poison: every output must be written */
    g3_error err = {0};
    if (g3_cuda_test_matmul(G3_DTYPE_F32, w, n, k, quant, gemm, geglu, x, m, y, wd, &err) != G3_OK)
        fail_msg("%s: %s", quant, err.msg);
    double dw = 0;
    for (size_t i = 0; i < (size_t)n * k; i++) dw = fmax(dw, fabs(wd[i] - w[i]));
    double dy = check_mm(wd, n, k, x, m, y, geglu);
    static const char *paths[] = {"gemv", "tc", "cublas", "qgemv"};
    int path = g3_cuda_test_mm_path(G3_DTYPE_F32, n, k, quant, gemm, m);
    printf("  %-4s n=%-4d k=%-4d m=%-3d gemm=%d geglu=%d %-6s max|w-w'|=%.2e  rel y err=%.2e\n", quant, n, k, m, gemm,
           geglu, path >= 0 && path <= 3 ? paths[path] : "?", dw, dy);
    if (dw > tol_w) fail_msg("%s: weight error %g > %g", quant, dw, tol_w);
    if (!(dy <= tol_y)) fail_msg("%s m=%d: product error %g > %g", quant, m, dy, tol_y);
    free(w), free(x), free(y), free(wd);
}

/* relative product error allowed: exact weights with hi + lo activations (tensor cores up to 8 rows, cuBLAS split
 * beyond for bf16) land near float32 rounding; quantized weights beyond 8 rows go in with bf16 activations (and
 * bf16-rounded weights where scales are per group), ~2^-9 relative per term */
double tol_for(const char *quant, int m, int gemm) {
    if (gemm == 2) return 2e-2;
    if (!strcmp(quant, "bf16") || m <= 8) return 2e-5;
    return 1e-2;
}
