/* Matmul kernels: every kernel set this CPU supports (scalar, avx2, avx512), every weight type, against a
 * double-precision reference, for many shapes (k = 17..4096, n not a multiple of any tile, m = 1..200), thread
 * counts 1..4, and ldy != n. Two checks per output:
 *   tight: against sum(dequant(W) * prepared X decoded back), i.e. exactly what the kernel should compute, up to
 *          float rounding: |err| <= 2e-5 * sum|w*x| (+ tiny);
 *   loose: against sum(dequant(W) * X) with the original activations: |err| <= sum_i |w_i| * delta_i + tight,
 *          where delta_i bounds the activation preparation error (half a quantization step, or 2^-17 |x| for
 *          the bf16 hi+lo split, 0 for float);
 * and each SIMD set against scalar within the tight bound. Columns past n in each y row must stay untouched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "model/dtype.h"
#include "testutil.h"

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rng_normal(void) {
    float u = ((rng_u32() >> 8) + 0.5f) / 16777216.0f, v = ((rng_u32() >> 8) + 0.5f) / 16777216.0f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

typedef struct shape { int m, n, k, threads; } shape;

static const shape shapes[] = {
    {1, 37, 256, 1},   {1, 100, 4096, 2}, {3, 19, 1152, 3}, {17, 50, 512, 2}, {64, 33, 2048, 4},
    {200, 40, 4096, 2}, {1, 1, 256, 2},   {5, 9, 100, 2},   {2, 3, 17, 1},    {130, 70, 768, 3},
    {1, 64, 1152, 2},  {9, 24, 512, 3},  {21, 16, 6912, 2}, {20, 300, 2048, 2}, /* several L2 n-blocks */
};

/* the repacked types (n % 8 == 0 only) are built from Q8_0 / Q4_0 rows */
static const uint32_t types[] = {G3_DTYPE_F32,  G3_DTYPE_F16,  G3_DTYPE_BF16,  G3_DTYPE_Q8_0,  G3_DTYPE_Q4_0,
                                 G3_DTYPE_Q4_K, G3_DTYPE_Q6_K, G3_CPU_Q8_0_R8, G3_CPU_Q4_0_R8, G3_DTYPE_Q4_1,
                                 G3_DTYPE_Q5_0, G3_DTYPE_Q5_1, G3_DTYPE_Q5_K, G3_CPU_Q5_0_R8, G3_CPU_Q4_1_R8,
                                 G3_CPU_Q5_1_R8, G3_CPU_Q4_K_R8, G3_CPU_Q6_K_R8, G3_CPU_Q5_K_R8};

static uint32_t base_type(uint32_t t) { return g3_matmul_repack_source(t) ? g3_matmul_repack_source(t) : t; }
static const char *tname(uint32_t t) {
    static char buf[5][16];
    static int at;
    if (!g3_matmul_repack_source(t)) return g3_dtype_get(t)->name;
    char *b = buf[at++ % 5];
    snprintf(b, sizeof buf[0], "%s_R8", g3_dtype_get(g3_matmul_repack_source(t))->name);
    return b;
}

/* Half-step bound of the activation preparation for weights of type t, per element. */
static void prep_delta(uint32_t t, const float *x, int k, double *delta) {
    t = base_type(t);
    const g3_dtype_info *ti = g3_dtype_get(t);
    int blk = ti->quantized ? ti->block : 0; /* 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) or 256 (K-quants) */
    for (int i = 0; i < k; i++) delta[i] = t == G3_DTYPE_BF16 ? fabs(x[i]) * ldexp(1.0, -17) : 0.0;
    if (!blk) return;
    for (int b = 0; b < k / blk; b++) {
        double amax = 0;
        for (int j = 0; j < blk; j++) amax = fmax(amax, fabs(x[b * blk + j]));
        for (int j = 0; j < blk; j++) delta[b * blk + j] = amax / 254.0 * 1.0001 + 1e-30;
    }
}

/* Runs all types for one kernel set; if `scalar_y` is non-NULL its rows hold the scalar set's results to compare
 * with (filled when `fill` is set). Returns the number of (shape, type) cases checked. */
static int run_set(const char *set, float **scalar_y, int fill) {
    int cases = 0;
    g3_pool *pools[5] = {0};
    for (int t = 1; t <= 4; t++) pools[t] = g3_pool_create(t);
    size_t si = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const shape *sh = &shapes[s];
        float *x = malloc(sizeof(float) * (size_t)sh->m * sh->k);
        float *xd = malloc(sizeof(float) * (size_t)sh->k);
        float *wd = malloc(sizeof(float) * (size_t)sh->n * sh->k);
        double *delta = malloc(sizeof(double) * (size_t)sh->m * sh->k);
        for (int i = 0; i < sh->m * sh->k; i++) x[i] = rng_normal() * (rng_u32() % 50 == 0 ? 8.0f : 1.0f);
        for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++, si++) {
            uint32_t type = types[ti], qtype = base_type(type);
            size_t rb = g3_row_bytes(qtype, sh->k);
            if (!rb || (type != qtype && sh->n % 8)) continue;
            uint8_t *w = malloc(rb * (size_t)sh->n);
            float *wrow = malloc(sizeof(float) * (size_t)sh->k);
            for (int r = 0; r < sh->n; r++) {
                for (int i = 0; i < sh->k; i++) wrow[i] = rng_normal() / sqrtf((float)sh->k);
                g3_error err = {0};
                assert_int_equal(g3_quantize_row(qtype, wrow, w + (size_t)r * rb, sh->k, &err), G3_OK);
                g3_dequant_row(qtype, w + (size_t)r * rb, wd + (size_t)r * sh->k, sh->k);
            }
            if (type != qtype) { /* repack in place through a copy */
                uint8_t *packed = malloc(g3_matmul_repack_bytes(qtype, sh->n, sh->k));
                assert_int_equal(g3_matmul_repack(qtype, w, sh->n, sh->k, packed), type);
                for (int r = 0; r < sh->n; r += 3) { /* rows read back from the repacked layout */
                    g3_matmul_repacked_row(type, packed, sh->k, r, wrow);
                    for (int i = 0; i < sh->k; i++) assert_true(wrow[i] == wd[(size_t)r * sh->k + i]);
                }
                free(w);
                w = packed;
            }
            int ldy = sh->n + 5;
            float *y = malloc(sizeof(float) * (size_t)sh->m * ldy);
            for (int i = 0; i < sh->m * ldy; i++) y[i] = -12345.0f;
            void *scratch = malloc(g3_act_scratch_bytes(type, sh->m, sh->k) + 1);
            g3_act a;
            g3_pool *p = pools[sh->threads];
            g3_act_prepare(p, &a, type, x, sh->m, sh->k, scratch);
            g3_matmul(p, &a, w, sh->n, y, ldy);
            double worst_tight = 0, worst_loose = 0, worst_scalar = 0;
            for (int i = 0; i < sh->m; i++) {
                const float *xi = x + (size_t)i * sh->k;
                g3_act_dequant_row(&a, i, xd);
                prep_delta(type, xi, sh->k, delta);
                for (int j = 0; j < sh->n; j++) {
                    const float *wj = wd + (size_t)j * sh->k;
                    double ref = 0, ref0 = 0, mag = 0, qerr = 0;
                    for (int l = 0; l < sh->k; l++) {
                        ref += (double)wj[l] * xd[l];
                        ref0 += (double)wj[l] * xi[l];
                        mag += fabs((double)wj[l] * xi[l]);
                        qerr += fabs((double)wj[l]) * delta[l];
                    }
                    double got = y[(size_t)i * ldy + j];
                    double tight = 2e-5 * mag + 1e-30;
                    double e1 = fabs(got - ref), e2 = fabs(got - ref0);
                    if (e1 / tight > worst_tight) worst_tight = e1 / tight;
                    if (e2 / (qerr + tight) > worst_loose) worst_loose = e2 / (qerr + tight);
                    if (!(e1 <= tight) || !(e2 <= qerr + tight))
                        fail_msg("%s %s m=%d n=%d k=%d: y[%d][%d] = %.7g, exact %.7g, with original x %.7g "
                                 "(limits %.3g, %.3g)",
                                 set, tname(type), sh->m, sh->n, sh->k, i, j, got, ref, ref0, tight,
                                 qerr + tight);
                    if (scalar_y) {
                        float *sy = scalar_y[si];
                        if (fill) {
                            sy[(size_t)i * sh->n + j] = (float)got;
                        } else {
                            double e3 = fabs(got - sy[(size_t)i * sh->n + j]);
                            if (e3 / tight > worst_scalar) worst_scalar = e3 / tight;
                            if (!(e3 <= tight))
                                fail_msg("%s vs scalar %s m=%d n=%d k=%d: y[%d][%d] %.7g vs %.7g", set,
                                         tname(type), sh->m, sh->n, sh->k, i, j, got,
                                         sy[(size_t)i * sh->n + j]);
                        }
                    }
                }
                for (int j = sh->n; j < ldy; j++) assert_true(y[(size_t)i * ldy + j] == -12345.0f);
            }
            if (sh->k >= 1024 && sh->m >= 17)
                printf("  %-6s %-5s m=%3d n=%3d k=%4d: worst err / limit: exact %.3f, original x %.3f, vs scalar %.3f\n",
                       set, tname(type), sh->m, sh->n, sh->k, worst_tight, worst_loose, worst_scalar);
            cases++;
            free(scratch);
            free(y);
            free(w);
            free(wrow);
        }
        free(x);
        free(xd);
        free(wd);
        free(delta);
    }
    for (int t = 1; t <= 4; t++) g3_pool_free(pools[t]);
    return cases;
}

static void test_all_sets(void **state) {
    (void)state;
    size_t nslots = sizeof shapes / sizeof *shapes * (sizeof types / sizeof *types);
    float **sy = calloc(nslots, sizeof *sy);
    size_t si = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++, si++)
            sy[si] = malloc(sizeof(float) * (size_t)shapes[s].m * shapes[s].n);
    const char *sets[] = {"scalar", "avx2", "avx512"};
    int ran = 0;
    for (int s = 0; s < 3; s++) {
        if (g3_cpu_kernels_select(sets[s]) != 0) {
            printf("  kernel set %s: not available on this CPU/build, skipped\n", sets[s]);
            continue;
        }
        assert_string_equal(g3_cpu_kernels_name(), sets[s]);
        rng_state = 0x1234567887654321ull; /* same data for every set */
        int n = run_set(sets[s], sy, s == 0);
        printf("  kernel set %s: %d cases passed\n", sets[s], n);
        assert_true(n >= 100);
        ran++;
    }
    assert_true(ran >= 1);
    assert_int_equal(g3_cpu_kernels_select("nonsense"), -1);
    for (size_t i = 0; i < nslots; i++) free(sy[i]);
    free(sy);
}

/* The same activations prepared once serve several weight matrices (Q, K, V); results match separate runs. */
static void test_shared_activation(void **state) {
    (void)state;
    const int m = 4, k = 512, n = 24;
    float *x = malloc(sizeof(float) * m * k), *y1 = malloc(sizeof(float) * m * n), *y2 = malloc(sizeof(float) * m * n);
    for (int i = 0; i < m * k; i++) x[i] = rng_normal();
    size_t rb = g3_row_bytes(G3_DTYPE_Q8_0, k);
    uint8_t *w1 = malloc(rb * n), *w2 = malloc(rb * n);
    float *row = malloc(sizeof(float) * k);
    g3_error err = {0};
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < k; i++) row[i] = rng_normal();
        assert_int_equal(g3_quantize_row(G3_DTYPE_Q8_0, row, w1 + r * rb, k, &err), G3_OK);
        for (int i = 0; i < k; i++) row[i] = rng_normal();
        assert_int_equal(g3_quantize_row(G3_DTYPE_Q8_0, row, w2 + r * rb, k, &err), G3_OK);
    }
    g3_pool *p = g3_pool_create(2);
    void *scratch = malloc(g3_act_scratch_bytes(G3_DTYPE_Q8_0, m, k));
    g3_act a;
    g3_act_prepare(p, &a, G3_DTYPE_Q8_0, x, m, k, scratch);
    g3_matmul(p, &a, w1, n, y1, n);
    g3_matmul(p, &a, w2, n, y2, n);
    float *z = malloc(sizeof(float) * m * n);
    g3_act_prepare(p, &a, G3_DTYPE_Q8_0, x, m, k, scratch);
    g3_matmul(p, &a, w2, n, z, n);
    for (int i = 0; i < m * n; i++) assert_true(z[i] == y2[i]);
    assert_true(tu_max_abs_diff(y1, y2, (size_t)m * n) > 0); /* really different weights */
    g3_pool_free(p);
    free(scratch), free(x), free(y1), free(y2), free(w1), free(w2), free(row), free(z);
}

/* The SIMD activation quantizers must produce exactly what the portable one does (the kernel sets are compared
 * with each other through them), ties and signed zeros included. */
static void test_prepare_identical(void **state) {
    (void)state;
    const int m = 3, k = 1024;
    float *x = malloc(sizeof(float) * m * k), *a = malloc(sizeof(float) * k), *b = malloc(sizeof(float) * k);
    for (int i = 0; i < m * k; i++) x[i] = rng_normal() * (rng_u32() % 16 == 0 ? 30.0f : 1.0f);
    /* a block with amax 127 (scale 1): halves must round away from zero */
    float ties[] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, -0.0f, 0.0f, 1.5f, -1.5f, 126.5f, -126.5f, 3.49999f};
    for (size_t i = 0; i < sizeof ties / sizeof *ties; i++) x[i] = ties[i];
    for (int i = 32; i < 64; i++) x[i] = 0.0f; /* an all-zero block */
    uint32_t wtypes[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K, G3_CPU_Q4_0_R8, G3_DTYPE_Q5_0, G3_DTYPE_Q5_K,
                         G3_CPU_Q5_1_R8};
    const char *sets[] = {"avx2", "avx512"};
    int compared = 0;
    for (size_t t = 0; t < sizeof wtypes / sizeof *wtypes; t++) {
        void *s1 = malloc(g3_act_scratch_bytes(wtypes[t], m, k)), *s2 = malloc(g3_act_scratch_bytes(wtypes[t], m, k));
        assert_int_equal(g3_cpu_kernels_select("scalar"), 0);
        g3_act ref;
        g3_act_prepare(NULL, &ref, wtypes[t], x, m, k, s1);
        for (int si = 0; si < 2; si++) {
            if (g3_cpu_kernels_select(sets[si]) != 0) continue;
            g3_act got;
            g3_act_prepare(NULL, &got, wtypes[t], x, m, k, s2);
            for (int r = 0; r < m; r++) {
                g3_act_dequant_row(&ref, r, a);
                g3_act_dequant_row(&got, r, b);
                for (int i = 0; i < k; i++)
                    if (memcmp(&a[i], &b[i], sizeof(float)))
                        fail_msg("%s prepare for %s differs at row %d value %d: %.9g vs %.9g (x %.9g)", sets[si],
                                 tname(wtypes[t]), r, i, b[i], a[i], x[r * k + i]);
            }
            compared++;
        }
        free(s1), free(s2);
    }
    printf("  %d prepared activations compared bit for bit\n", compared);
    free(x), free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_sets),
        cmocka_unit_test(test_shared_activation),
        cmocka_unit_test(test_prepare_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
