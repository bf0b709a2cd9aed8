/* Vulkan kernels against CPU references: the device list, matrix products of every weight type through both the
 * matvec (decode) and tiled matmul (prefill) kernels, plain and fused GeGLU, and the rope shader's sin/cos at
 * large angles. Runs on any Vulkan device (Mesa's lavapipe in CI); skipped only when no Vulkan device exists. */
#ifdef G3_HAVE_VULKAN
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vulkan_api.h"
#include "model/dtype.h"
#include "testutil.h"
#include "vk_testutil.h"


static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void test_list_devices(void **state) {
    (void)state;
    if (!have_device()) skip();
    g3_vulkan_device d[8];
    int n = 0;
    g3_error err = {0};
    assert_int_equal(g3_vulkan_list_devices(d, 8, &n, &err), G3_OK);
    assert_true(n >= 1);
    int usable = 0;
    for (int i = 0; i < n && i < 8; i++) {
        assert_int_equal(d[i].index, i);
        assert_true(d[i].name[0] != 0);
        usable += d[i].usable;
        if (i > 0) { /* best first: a CPU implementation never precedes a GPU */
            int gpu_prev = strcmp(d[i - 1].type, "cpu") != 0;
            int gpu_cur = strcmp(d[i].type, "cpu") != 0;
            assert_true(gpu_prev || !gpu_cur);
        }
    }
    assert_true(usable >= 1);
    assert_true(g3_vulkan_print_devices(stdout) == n);
}

/* Random weights of `type`, n rows of k, plus their dequantized floats. */
static void *make_weights(uint32_t type, int n, int k, float **deq) {
    size_t rb = g3_row_bytes(type, k);
    uint8_t *w = malloc(rb * (size_t)n);
    float *row = malloc(sizeof(float) * (size_t)k);
    *deq = malloc(sizeof(float) * (size_t)n * (size_t)k);
    g3_error err = {0};
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < k; i++) row[i] = frand() * (1.0f + (float)(i % 7)); /* uneven block scales */
        assert_int_equal(g3_quantize_row(type, row, w + (size_t)r * rb, k, &err), G3_OK);
        g3_dequant_row(type, w + (size_t)r * rb, *deq + (size_t)r * k, k);
    }
    free(row);
    return w;
}

static double tol = 2e-5; /* bound on the error relative to sum |x w| (f32 kernels) */

/* Activations of check_matmul: X_UNIT uniform in [-1, 1); X_WIDE rows beyond f16's range and below its precision:
 * by row, all ~1e6, all ~1e-3, or mixed (every 7th value ~1e6, the others ~1e-3), in turn. */
enum { X_UNIT, X_WIDE };
static float xval(int mode, int r, int i) {
    if (mode == X_UNIT) return frand();
    int big = r % 3 == 0 || (r % 3 == 2 && i % 7 == 0);
    return frand() * (big ? 1e6f : 1e-3f);
}

/* Largest error of y = x W^T (GeGLU: gelu(x W^T) * (x W2^T)) by path against float64 dot products of the reference
 * dequantization, relative to sum |x w| (GeGLU: the bound of the product); INFINITY for NaN. */
static double matmul_error(uint32_t type, int n, int k, int m, int path, int geglu, int xmode) {
    float *deq, *deq2 = NULL;
    void *w = make_weights(type, n, k, &deq);
    void *w2 = geglu ? make_weights(type, n, k, &deq2) : NULL;
    float *x = malloc(sizeof(float) * (size_t)m * k), *y = malloc(sizeof(float) * (size_t)m * n);
    for (int r = 0; r < m; r++)
        for (int i = 0; i < k; i++) x[(size_t)r * k + i] = xval(xmode, r, i);
    g3_error err = {0};
    if (g3_vulkan_test_matmul(type, w, w2, n, k, x, m, path, y, &err) != G3_OK) fail_msg("%s", err.msg);
    double worst = 0;
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++) {
            double a = 0, mag = 0, a2 = 0;
            for (int i = 0; i < k; i++) {
                a += (double)x[(size_t)r * k + i] * deq[(size_t)c * k + i];
                mag += fabs((double)x[(size_t)r * k + i] * deq[(size_t)c * k + i]);
                if (geglu) a2 += (double)x[(size_t)r * k + i] * deq2[(size_t)c * k + i];
            }
            if (geglu) {
                double g = 0.5 * a * (1 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
                mag = mag * (1 + fabs(a2)) + fabs(g) * fabs(a2);
                a = g * a2;
            }
            double d = fabs(y[(size_t)r * n + c] - a) / (mag + 1e-6);
            if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
        }
    printf("  %-5s n %d k %d m %d %s%s%s: max error %.2e (relative to sum |x w|)\n", g3_dtype_name((g3_dtype)type), n,
           k, m, path == 1 ? "matvec" : path == 3 ? "matmul unguarded" : "matmul", geglu ? " geglu" : "",
           xmode == X_WIDE ? " wide x" : "", worst);
    free(w), free(w2), free(deq), free(deq2), free(x), free(y);
    return worst;
}

static void check_matmul_x(uint32_t type, int n, int k, int m, int path, int geglu, int xmode) {
    double worst = matmul_error(type, n, k, m, path, geglu, xmode);
    if (!(worst < tol)) fail_msg("%s: result differs from the reference by %.3g", g3_dtype_name((g3_dtype)type), worst);
}

static void check_matmul(uint32_t type, int n, int k, int m, int path, int geglu) {
    check_matmul_x(type, n, k, m, path, geglu, X_UNIT);
}

static void test_matmul_all_types(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MVQ", "0", 1); /* float-activation kernels: the int8 products in test_vulkan_mvq */
    setenv("G3_VULKAN_COOPMAT", "0", 1); /* the portable matmul (f32): cooperative matrices in test_coopmat */
    static const uint32_t types[] = {G3_DTYPE_F32,  G3_DTYPE_F16,  G3_DTYPE_BF16, G3_DTYPE_Q8_0, G3_DTYPE_Q4_0,
                                     G3_DTYPE_Q4_K, G3_DTYPE_Q6_K, G3_DTYPE_Q5_0, /* Q5_0: as Q8_0 */
                                     G3_DTYPE_Q4_1, G3_DTYPE_Q5_1, G3_DTYPE_Q5_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int k = g3_dtype_get(types[t])->block == 256 ? 512 : 160;
        check_matmul(types[t], 37, k, 1, 1, 0);  /* odd n: the last matvec workgroup has one channel */
        check_matmul(types[t], 37, k, 1, 1, 1);  /* one row: matvec1 for F16/BF16/Q8_0/Q4_0, GeGLU */
        check_matmul(types[t], 37, 1024, 1, 1, 0); /* one row, several chunks per thread (and a partial pair) */
        check_matmul(types[t], 70, k, 8, 1, 0);  /* 2..8 rows: matvec1n for F16/BF16/Q8_0/Q4_0 */
        check_matmul(types[t], 70, k, 5, 1, 1);
        check_matmul(types[t], 37, 1024, 2, 1, 0); /* odd n, several chunks per thread and a partial pair */
        check_matmul(types[t], 37, 1024, 7, 1, 1);
        check_matmul(types[t], 70, k, 70, 2, 0); /* partial 64x64 tiles in both directions */
        check_matmul(types[t], 45, k, 9, 2, 1);
    }
    unsetenv("G3_VULKAN_MVQ");
    unsetenv("G3_VULKAN_COOPMAT");
}

/* $G3_VULKAN_MV2=0: the 1..8-row products on matvec1 (one row) and matvec1n (2..8 rows), the kernels before matvec2. */
static void test_matvec1_kernels(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MV2", "0", 1);
    static const uint32_t types[] = {G3_DTYPE_F16, G3_DTYPE_BF16, G3_DTYPE_Q8_0, G3_DTYPE_Q4_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        check_matmul(types[t], 37, 160, 1, 1, 1);
        check_matmul(types[t], 37, 1024, 1, 1, 0);
        check_matmul(types[t], 70, 160, 8, 1, 0);
        check_matmul(types[t], 37, 1024, 7, 1, 1);
    }
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1);
    check_matmul(G3_DTYPE_Q8_0, 37, 160, 3, 1, 0);
    check_matmul(G3_DTYPE_Q4_0, 37, 1024, 1, 1, 1);
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
    unsetenv("G3_VULKAN_MV2");
}

/* The shader variants for devices without subgroup arithmetic (shared-memory reductions). */
static void test_matmul_without_subgroups(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MVQ", "0", 1); /* float-activation kernels: the int8 products in test_vulkan_mvq */
    setenv("G3_VULKAN_COOPMAT", "0", 1);
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1);
    check_matmul(G3_DTYPE_Q8_0, 37, 160, 3, 1, 0);
    check_matmul(G3_DTYPE_Q4_K, 70, 512, 5, 1, 1);
    check_matmul(G3_DTYPE_Q5_K, 37, 512, 1, 1, 0);
    check_matmul(G3_DTYPE_Q5_1, 45, 160, 9, 2, 1);
    check_matmul(G3_DTYPE_BF16, 70, 160, 70, 2, 0);
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
    check_matmul(G3_DTYPE_Q4_0, 37, 1024, 1, 1, 1);
    unsetenv("G3_VULKAN_MVQ");
    unsetenv("G3_VULKAN_COOPMAT");
}

/* $G3_VULKAN_MATVEC1=0: one-row products through matvec.comp (the kernel before matvec1). */
static void test_matvec_without_matvec1(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MATVEC1", "0", 1);
    setenv("G3_VULKAN_MV2", "0", 1); /* matvec2 takes precedence */
    check_matmul(G3_DTYPE_Q8_0, 37, 1024, 1, 1, 0);
    check_matmul(G3_DTYPE_Q4_0, 37, 160, 1, 1, 1);
    unsetenv("G3_VULKAN_MATVEC1");
    unsetenv("G3_VULKAN_MV2");
}

/* $G3_VULKAN_MATVECN=0: 2..8-row products through matvec.comp (the kernel before matvec1n). */
static void test_matvec_without_matvecn(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MATVECN", "0", 1);
    setenv("G3_VULKAN_MV2", "0", 1);
    check_matmul(G3_DTYPE_Q8_0, 37, 1024, 4, 1, 0);
    check_matmul(G3_DTYPE_Q4_0, 37, 160, 8, 1, 1);
    unsetenv("G3_VULKAN_MATVECN");
    unsetenv("G3_VULKAN_MV2");
}

/* $G3_VULKAN_MV2=1 (the default; set explicitly): 1..8-row products of F16/BF16/Q8_0/Q4_0 through matvec2.comp (8 channels per workgroup at one
 * row, 4 at 2..8 rows; GeGLU half as many). Odd n (a last workgroup with fewer channels; n below one workgroup's),
 * K from one partial chunk column to several iterations of the 2 x 64-chunk stride (Q4_0: 4096 values, Q8_0: 2048)
 * with a partial last one (K = 4128: one chunk past a stride; 5376: the 27B hidden size), 1, 2, 5, 7 and 8 rows,
 * both reduction variants. */
/* The checks of test_matvec2; one_row: only the one-row products (those the $G3_VULKAN_MV2_* variants change). */
static void matvec2_checks(int one_row) {
    static const uint32_t types[] = {G3_DTYPE_Q4_0, G3_DTYPE_Q8_0, G3_DTYPE_F16, G3_DTYPE_BF16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        check_matmul(types[t], 37, 160, 1, 1, 0);
        check_matmul(types[t], 37, 160, 1, 1, 1);
        check_matmul(types[t], 3, 4128, 1, 1, 0); /* n below the 8 channels of one workgroup */
        if (one_row) continue;
        check_matmul(types[t], 70, 160, 8, 1, 0);
        check_matmul(types[t], 37, 4128, 2, 1, 1);
        check_matmul(types[t], 5, 1024, 7, 1, 0);
    }
    static const uint32_t q[] = {G3_DTYPE_Q4_0, G3_DTYPE_Q8_0};
    for (size_t t = 0; t < 2; t++) {
        check_matmul(q[t], 37, 4128, 1, 1, 1);
        check_matmul(q[t], 41, 5376, 1, 1, 0);
        check_matmul(q[t], 9, 8224, 1, 1, 0); /* Q4_0: two full strides and one chunk */
        check_matmul(q[t], 5, 1152, 1, 1, 1); /* the 1B hidden size: 36 Q4_0 chunks, fewer than 64 threads */
        if (one_row) continue;
        check_matmul(q[t], 19, 5376, 5, 1, 1);
        check_matmul(q[t], 11, 8224, 3, 1, 0);
    }
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1);
    check_matmul(G3_DTYPE_Q4_0, 37, 4128, 1, 1, 0);
    check_matmul(G3_DTYPE_Q4_0, 37, 1024, 1, 1, 1);
    if (!one_row) {
        check_matmul(G3_DTYPE_Q8_0, 37, 4128, 6, 1, 0);
        check_matmul(G3_DTYPE_Q8_0, 37, 160, 8, 1, 1);
    }
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
}

static void test_matvec2(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MVQ", "0", 1); /* float-activation kernels: the int8 products in test_vulkan_mvq */
    setenv("G3_VULKAN_MV2", "1", 1);
    matvec2_checks(0);
    unsetenv("G3_VULKAN_MV2");
    unsetenv("G3_VULKAN_MVQ");
}

/* The one-row matvec2 variants of a tuning sweep ($G3_VULKAN_MV2_WG / _NC / _COLS through matvec2s*, the same
 * source with specialization constants; _SPEC=1 at the defaults) pass test_matvec2's one-row checks: each switch
 * alone at every value it takes, a few combinations, and unknown values (the default kernel). */
static void test_matvec2_variants(void **state) {
    (void)state;
    if (!have_device()) skip();
    setenv("G3_VULKAN_MVQ", "0", 1); /* float-activation kernels: the int8 products in test_vulkan_mvq */
    static const char *const variants[][4] = {
        /* WG, NC, COLS, SPEC */
        {"64", "8", "2", "1"},  {NULL, "4", NULL, NULL},  {NULL, "16", NULL, NULL}, {"32", NULL, NULL, NULL},
        {"128", NULL, NULL, NULL}, {"256", NULL, NULL, NULL}, {NULL, NULL, "1", NULL}, {NULL, NULL, "4", NULL},
        {"32", "16", "1", NULL}, {"256", "4", "4", NULL},  {"128", "16", "4", NULL}, {"48", "12", "3x", NULL},
    };
    static const char *const names[4] = {"G3_VULKAN_MV2_WG", "G3_VULKAN_MV2_NC", "G3_VULKAN_MV2_COLS",
                                         "G3_VULKAN_MV2_SPEC"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        printf("  variant WG %s NC %s COLS %s SPEC %s\n", variants[v][0] ? variants[v][0] : "-",
               variants[v][1] ? variants[v][1] : "-", variants[v][2] ? variants[v][2] : "-",
               variants[v][3] ? variants[v][3] : "-");
        for (int i = 0; i < 4; i++)
            if (variants[v][i]) setenv(names[i], variants[v][i], 1);
        matvec2_checks(1);
        for (int i = 0; i < 4; i++) unsetenv(names[i]);
    }
    unsetenv("G3_VULKAN_MVQ");
}

/* Every backend, test context and device listing of this process shares one Vulkan instance: the NVIDIA driver fails
 * to load again after a few dozen instance create/destroy cycles in one process (VK_ERROR_INCOMPATIBLE_DRIVER). */
static void test_one_instance(void **state) {
    (void)state;
    if (!have_device()) skip();
    for (int i = 0; i < 3; i++) check_matmul(G3_DTYPE_Q8_0, 37, 160, 1, 1, 0);
    printf("  Vulkan instances created by this process: %d\n", g3_vulkan_instances_created());
    assert_int_equal(g3_vulkan_instances_created(), 1);
}

/* The checks of test_coopmat on the flavour $G3_VULKAN_COOPMAT picks. */
static void coopmat_checks(void) {
    /* H200: plain products 1.2e-4 .. 1.4e-4 of sum |x w| (activations and d * q rounded to f16), GeGLU up to 2.3e-3
     * (the metric of check_matmul weighs the gate's error through gelu and the product); a broken fragment or an
     * overflow is off by ~1 */
    const double plain = 5e-4, geglu = 5e-3;
    static const uint32_t types[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K, G3_DTYPE_Q6_K,
                                     G3_DTYPE_Q4_1, G3_DTYPE_Q5_1, G3_DTYPE_Q5_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int k = g3_dtype_get(types[t])->block == 256 ? 512 : 160;
        tol = plain;
        check_matmul(types[t], 70, k, 70, 2, 0);
        check_matmul(types[t], 130, k, 200, 2, 0);
        tol = geglu;
        check_matmul(types[t], 45, k, 9, 2, 1);
        check_matmul(types[t], 37, k, 65, 2, 1); /* odd n, one row past a tile */
    }
    /* float weights keep the portable kernel: asking for the cooperative-matrix product (path 3) is refused */
    static const uint32_t f[] = {G3_DTYPE_F32, G3_DTYPE_F16, G3_DTYPE_BF16};
    for (size_t t = 0; t < 3; t++) {
        float *deq, *x = calloc((size_t)70 * 160, sizeof(float)), *y = malloc(sizeof(float) * 70 * 70);
        void *w = make_weights(f[t], 70, 160, &deq);
        g3_error err = {0};
        assert_int_equal(g3_vulkan_test_matmul(f[t], w, NULL, 70, 160, x, 70, 3, y, &err), G3_ERR_UNSUPPORTED);
        free(w), free(deq), free(x), free(y);
    }
    static const uint32_t q[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q4_0};
    for (size_t t = 0; t < 2; t++) {
        tol = plain;
        check_matmul_x(q[t], 70, 160, 70, 2, 0, X_WIDE);
        check_matmul_x(q[t], 130, 1024, 100, 2, 0, X_WIDE);
        tol = geglu;
        check_matmul_x(q[t], 45, 160, 9, 2, 1, X_WIDE);
        double bad = matmul_error(q[t], 70, 160, 70, 3, 0, X_WIDE);
        if (bad < 0.1) fail_msg("without the guard, rows of ~1e6 should overflow f16 (error %.3g)", bad);
    }
    tol = 2e-5;
}

/* The tiled matmul on cooperative matrices (tensor cores; f16 tiles: bounds 5e-4 of sum |x w| plain, 5e-3 with GeGLU;
 * measured on the H200 1.4e-4 and 2.3e-3), taken for GGUF block weights only (float weights are refused), for each flavour device 0 can run ($G3_VULKAN_COOPMAT=nv: VK_NV_cooperative_matrix; =khr: the same
 * kernel rewritten to VK_KHR_cooperative_matrix): every weight type, plain and GeGLU, partial tiles in both
 * directions, odd shapes; rows of activations beyond f16's range (~1e6) and below its precision (~1e-3), alone and
 * mixed, through the overflow guard (per-row exponents, shaders/cm_scale.comp) -- and the same rows without it
 * (path 3) must overflow, so that the guard is what passes. Skipped where the device has no cooperative matrices. */
static void test_coopmat(void **state) {
    (void)state;
    if (!have_device()) skip();
    static const char *const flavours[2] = {"nv", "khr"};
    int ran = 0;
    for (int f = 0; f < 2; f++) {
        setenv("G3_VULKAN_COOPMAT", flavours[f], 1);
        g3_error err = {0};
        int has = g3_vulkan_test_coopmat(&err);
        if (has < 0) fail_msg("device 0: %s", err.msg);
        if (has == f + 1) {
            printf("  %s cooperative matrices:\n", flavours[f]);
            coopmat_checks();
            ran++;
        } else {
            printf("  device 0 cannot run %s cooperative matrices (f16 16x16x16, subgroups of 32): skipped\n",
                   flavours[f]);
        }
        unsetenv("G3_VULKAN_COOPMAT");
    }
    if (!ran) skip();
}

/* The row-scale exponents (shaders/cm_scale.comp), on any device: E - 13 for a row whose largest |x| is in
 * [2^E, 2^(E+1)) (so the scaled maximum lands in [2^13, 2^14)), -126 for a zero row, clamped to [-126, 126]; rows past
 * the live count are left as they were. */
static void test_cm_scale(void **state) {
    (void)state;
    if (!have_device()) skip();
    enum { R = 12, K = 1032 };
    float *x = malloc(sizeof(float) * R * K);
    static const float peak[R] = {0.0f, 1.0f, 16383.0f, 16384.0f, 32767.0f, 65504.0f, 1e6f, -3e9f, 1e-3f, 3e38f,
                                  -16384.5f, 5.0f};
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < K; i++) x[(size_t)r * K + i] = r == 0 ? 0.0f : frand() * 0.5f;
        x[(size_t)r * K + (r * 389) % K] = peak[r];
        if (r == 1) x[(size_t)r * K + K - 1] = -20000.0f; /* the largest value in the last vec4 */
    }
    uint32_t e[R];
    g3_error err = {0};
    if (g3_vulkan_test_cm_scale(x, R, K, R - 1, e, &err) != G3_OK) fail_msg("%s", err.msg);
    for (int r = 0; r < R - 1; r++) {
        double m = 0;
        for (int i = 0; i < K; i++) m = fmax(m, fabs((double)x[(size_t)r * K + i]));
        int E = 0;
        frexp(m, &E); /* m = f 2^E, f in [0.5, 1): 2^(E-1) <= m < 2^E */
        int want = m == 0 ? -126 : E - 1 - 13;
        want = want < -126 ? -126 : want > 126 ? 126 : want;
        printf("  row %2d max |x| %.4g: exponent %d (want %d)\n", r, m, (int32_t)e[r], want);
        assert_int_equal((int32_t)e[r], want);
        if (m > 0 && m < 1e30) { /* the scaled maximum lands in [2^13, 2^14) */
            double s = m * ldexp(1.0, -want);
            assert_true(s >= 8192.0 && s < 16384.0);
        }
    }
    assert_int_equal(e[R - 1], 0xababababu);
    free(x);
}

static void test_sincos_large_angles(void **state) {
    (void)state;
    if (!have_device()) skip();
    enum { N = 4096 };
    float *a = malloc(sizeof(float) * N), *s = malloc(sizeof(float) * N), *c = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) { /* positions up to 131072 times rope frequencies in (0, 1] */
        int pos = (int)((unsigned)i * 2654435761u % 131072u);
        float inv = 1.0f / powf(10000.0f, (float)(2 * (i % 64)) / 128.0f);
        a[i] = i < 16 ? (float)i * 0.4f - 3.0f : (float)pos * inv;
    }
    g3_error err = {0};
    if (g3_vulkan_test_sincos(a, N, s, c, &err) != G3_OK) fail_msg("%s", err.msg);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double es = fabs(s[i] - sin((double)a[i])), ec = fabs(c[i] - cos((double)a[i]));
        if (es > worst) worst = es;
        if (ec > worst) worst = ec;
    }
    printf("  sin/cos of %d angles up to 1.3e5 rad: max absolute error %.2e\n", N, worst);
    assert_true(worst < 2e-6);
    free(a), free(s), free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_devices),
        cmocka_unit_test(test_matmul_all_types),
        cmocka_unit_test(test_matmul_without_subgroups),
        cmocka_unit_test(test_matvec_without_matvec1),
        cmocka_unit_test(test_matvec_without_matvecn),
        cmocka_unit_test(test_matvec2),
        cmocka_unit_test(test_matvec2_variants),
        cmocka_unit_test(test_matvec1_kernels),
        cmocka_unit_test(test_cm_scale),
        cmocka_unit_test(test_coopmat),
        cmocka_unit_test(test_sincos_large_angles),
        cmocka_unit_test(test_one_instance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else /* built without the Vulkan backend */
#include "testutil.h"

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tu_skip_no_vulkan)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
