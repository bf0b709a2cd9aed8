/* Batch invariance of the CPU matmul: a row's result is bit-identical whatever the number of rows multiplied with
 * it (1 .. 512), for every weight type and kernel set, stored and repacked. The engine relies on it: a request gets
 * the same greedy tokens alone or batched with 63 others. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "core/threadpool.h"
#include "model/dtype.h"
#include "testutil.h"

static void test_invariance(void **state) {
    (void)state;
    g3_pool *p = g3_pool_create(2);
    assert_non_null(p);
    const int n = 160, k = 1280, M = 300;
    const uint32_t types[] = {G3_DTYPE_F32,  G3_DTYPE_F16,  G3_DTYPE_BF16, G3_DTYPE_Q8_0, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K,
                              G3_DTYPE_Q6_K, G3_DTYPE_Q4_1, G3_DTYPE_Q5_0, G3_DTYPE_Q5_1, G3_DTYPE_Q5_K};
    const char *sets[] = {"scalar", "avx2", "avx512"};
    const int ms[] = {1, 2, 7, 9, 33, 130, 300};
    float *wf = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)M * k);
    uint64_t s = 12345;
    for (int i = 0; i < n * k; i++) wf[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    for (int i = 0; i < M * k; i++) x[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / 8388608.0f - 1.0f;
    int checked = 0;
    for (int si = 0; si < 3; si++) {
        if (g3_cpu_kernels_select(sets[si]) != 0) continue; /* not on this CPU */
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            size_t rb = g3_row_bytes(types[t], k);
            uint8_t *w = malloc(rb * (size_t)n);
            for (int r = 0; r < n; r++) assert_int_equal(g3_quantize_row(types[t], wf + (size_t)r * k, w + rb * r, k, NULL), G3_OK);
            for (int rp = 0; rp < 2; rp++) {
                uint32_t wt = types[t];
                void *wuse = w, *packed = NULL;
                if (rp) {
                    uint32_t rt = g3_matmul_repack_type(wt, n, k);
                    if (!rt) continue;
                    packed = malloc(g3_matmul_repack_bytes(wt, n, k));
                    wt = g3_matmul_repack(types[t], w, n, k, packed);
                    wuse = packed;
                }
                /* every row alone first: the reference each batched row must equal bit for bit */
                float *alone = malloc(sizeof(float) * (size_t)M * n);
                void *scr1 = malloc(g3_act_scratch_bytes(wt, 1, k));
                for (int r = 0; r < M; r++) {
                    g3_act a;
                    g3_act_prepare(p, &a, wt, x + (size_t)r * k, 1, k, scr1);
                    g3_matmul(p, &a, wuse, n, alone + (size_t)r * n, n);
                }
                free(scr1);
                for (size_t mi = 1; mi < sizeof ms / sizeof ms[0]; mi++) {
                    int m = ms[mi];
                    void *scr = malloc(g3_act_scratch_bytes(wt, m, k));
                    float *y = malloc(sizeof(float) * (size_t)m * n);
                    g3_act a;
                    g3_act_prepare(p, &a, wt, x, m, k, scr);
                    g3_matmul(p, &a, wuse, n, y, n);
                    for (int r = 0; r < m; r++)
                        if (memcmp(alone + (size_t)r * n, y + (size_t)r * n, sizeof(float) * (size_t)n) != 0)
                            fail_msg("%s %s%s: row %d of a %d-row product differs from that row alone", sets[si],
                                     g3_dtype_name((g3_dtype)types[t]), rp ? " repacked" : "", r, m);
                    checked++;
                    free(scr);
                    free(y);
                }
                free(alone);
                free(packed);
            }
            free(w);
        }
    }
    printf("  %d (kernel set, type, batch) products bit-identical to the single-row product\n", checked);
    assert_true(checked >= 7 * 6);
    if (g3_cpu_kernels_select("avx512") != 0 && g3_cpu_kernels_select("avx2") != 0) g3_cpu_kernels_select("scalar");
    free(wf);
    free(x);
    g3_pool_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_invariance)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
