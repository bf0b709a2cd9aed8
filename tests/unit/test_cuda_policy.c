/* The one-row dp4a kernel's launch policy (qgemv_p_policy.cu) and the fused gate/up + down pairs (qgemv_gd.cu) on the
 * Gemma 3 shapes, computed on the host for a simulated GPU: no device needed, so these run in CI. What they pin is what
 * docs/CUDA.md says each product takes at one and two rows on the H200 (132 SMs), and two properties every launch
 * needs: its shared memory within the variant's limit, its grid whole groups of K-slices of at most one block an SM.
 * Skipped only in builds without CUDA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"

#define H200_SMS 132

/* a model's one-row products: (n, k, geglu, add-norm prologue) as the forward launches them */
typedef struct {
    const char *name;
    int hidden, inter, heads, kv_heads, head_dim;
} shape;
static const shape S27 = {"27b", 5376, 21504, 32, 16, 128};
static const shape S4 = {"4b", 2560, 10240, 8, 4, 256};
static const shape S1 = {"1b", 1152, 6912, 4, 1, 256};

enum { QKV, O, GATE_UP, DOWN, HEAD, NPROD };
static void product(const shape *s, int p, int *n, int *k, int *geglu, int *pn) {
    const int q = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim;
    *geglu = p == GATE_UP, *pn = p == QKV || p == GATE_UP;
    switch (p) {
    case QKV: *n = q + 2 * kv, *k = s->hidden; break;
    case O: *n = s->hidden, *k = q; break;
    case GATE_UP: *n = 2 * s->inter, *k = s->hidden; break;
    case DOWN: *n = s->hidden, *k = s->inter; break;
    default: *n = 262144, *k = s->hidden; break;
    }
}

static g3_cuda_qp_variant variant(uint32_t t, const char *quant, const shape *s, int p, int m, int sz, int n_sm) {
    int n, k, geglu, pn;
    product(s, p, &n, &k, &geglu, &pn);
    g3_cuda_qp_variant v;
    memset(&v, 0, sizeof v);
    const int r = g3_cuda_test_qp_variant(t, n, k, quant, m, geglu, pn, sz, n_sm, &v);
    if (r != 0) fprintf(stderr, "  %s %s product %d at %d rows: policy returned %d\n", s->name, quant, p, m, r);
    assert_int_equal(r, 0);
    return v;
}

/* Every product of every shape and format at one and two rows, on the H200's and on other SM counts: the launch's
 * shared memory fits the variant's limit, the grid is ks groups of equal size and at most one block an SM, each
 * K-slice whole blocks of 32 activations, the rows as asked. */
static void test_policy_limits(void **state) {
    (void)state;
    const shape *shapes[] = {&S27, &S4, &S1};
    const char *quants[] = {"int8", "int4", "fp8"};
    const int sms[] = {H200_SMS, 114, 78, 16};
    int checked = 0;
    for (size_t si = 0; si < 3; si++)
        for (size_t qi = 0; qi < 3; qi++)
            for (size_t ni = 0; ni < sizeof sms / sizeof sms[0]; ni++)
                for (int p = 0; p < NPROD; p++)
                    for (int m = 1; m <= 2; m++)
                        for (int sz = 0; sz <= 1; sz++) {
                            const g3_cuda_qp_variant v = variant(G3_DTYPE_F32, quants[qi], shapes[si], p, m, sz, sms[ni]);
                            int n, k, geglu, pn;
                            product(shapes[si], p, &n, &k, &geglu, &pn);
                            assert_int_equal(v.M, m);
                            assert_true(v.smem > 0 && v.smem <= v.smem_max);
                            assert_true(v.ks >= 1 && k % v.ks == 0 && (k / v.ks) % 32 == 0);
                            assert_true(v.blocks >= v.ks && v.blocks % v.ks == 0 && v.blocks <= sms[ni]);
                            assert_true(v.ks == 1 || (!geglu && !pn)); /* slices only without GeGLU and prologue */
                            checked++;
                        }
    printf("  %d launches within their shared memory and grid limits\n", checked);
}

/* What docs/CUDA.md says the 27B / 4B / 1B products take on the H200 by default. */
static void test_policy_h200(void **state) {
    (void)state;
    /* 27B int8: every product per channel with the residual plane through the ring (rows of >= 4096 values); the down
     * product in 4 K-slices of 5376, the others whole rows */
    for (int p = 0; p < NPROD; p++) {
        const g3_cuda_qp_variant v = variant(G3_DTYPE_F32, "int8", &S27, p, 1, 0, H200_SMS);
        assert_true(v.pc && v.hl && v.rg && !v.f16);
        assert_int_equal(v.u, 3);
        assert_int_equal(v.ks, p == DOWN ? 4 : 1);
    }
    assert_int_equal(variant(G3_DTYPE_F32, "int8", &S27, DOWN, 2, 0, H200_SMS).u, 2); /* steps of 2 at two rows */
    /* 4B / 1B int8: rows (or K-slices) shorter than 4096 values on float16 products, without the ring; the 4B down
     * product (2 slices of 5120) keeps dp4a and the ring */
    for (int p = 0; p < NPROD; p++) {
        const g3_cuda_qp_variant v4 = variant(G3_DTYPE_F32, "int8", &S4, p, 1, 0, H200_SMS);
        assert_int_equal(v4.f16, p != DOWN);
        assert_int_equal(v4.rg, p == DOWN);
        assert_int_equal(v4.ks, p == DOWN ? 2 : 1);
        const g3_cuda_qp_variant v1 = variant(G3_DTYPE_F32, "int8", &S1, p, 1, 0, H200_SMS);
        assert_true(v1.f16 && !v1.rg && !v1.hl);
        assert_int_equal(v1.ks, p == DOWN ? 2 : 1);
    }
    /* 27B int4 in groups of 128 without the plane: the group arithmetic at compile time (gs 2) everywhere; the ring in
     * the products without the prologue; steps of 2 where they cover the row with fewer idle lanes (the o product's
     * 128 chunks), 3 otherwise (the down product's K-slices of 168); the half2 pairs wherever the matrix has them */
    for (int p = 0; p < NPROD; p++)
        for (int sz = 0; sz <= 1; sz++) {
            const g3_cuda_qp_variant v = variant(G3_DTYPE_F32, "int4", &S27, p, 1, sz, H200_SMS);
            const int pn = p == QKV || p == GATE_UP;
            assert_true(!v.pc && !v.hl && !v.f16);
            assert_int_equal(v.gs, 2);
            assert_int_equal(v.rg, !pn);
            assert_int_equal(v.u, p == O ? 2 : 3);
            assert_int_equal(v.kc, sz ? 3 : 0);
        }
    assert_int_equal(variant(G3_DTYPE_F32, "int4", &S27, O, 2, 0, H200_SMS).u, 2);
    /* fp8: float16 products; the ring for rows of >= 4096 values (all of 27B, the 4B down product) */
    for (int p = 0; p < NPROD; p++) {
        const g3_cuda_qp_variant v27 = variant(G3_DTYPE_F32, "fp8", &S27, p, 1, 0, H200_SMS);
        assert_true(v27.f16 && v27.pc && v27.rg);
        assert_int_equal(variant(G3_DTYPE_F32, "fp8", &S4, p, 1, 0, H200_SMS).rg, p == DOWN);
        assert_int_equal(variant(G3_DTYPE_F32, "fp8", &S1, p, 1, 0, H200_SMS).rg, 0);
    }
    /* GGUF at one row: Q4_K and Q4_0 read their own codes without the plane, Q8_0 its fp16 scales with it; none of
     * them through the ring (groups of 32) */
    const g3_cuda_qp_variant q4k = variant(G3_DTYPE_Q4_K, "bf16", &S27, DOWN, 1, 0, H200_SMS);
    const g3_cuda_qp_variant q40 = variant(G3_DTYPE_Q4_0, "bf16", &S27, DOWN, 1, 0, H200_SMS);
    const g3_cuda_qp_variant q80 = variant(G3_DTYPE_Q8_0, "bf16", &S27, DOWN, 1, 0, H200_SMS);
    assert_true(q4k.kc == 1 && !q4k.hl && !q4k.rg && q4k.gs == -1 && q4k.ks == 4);
    assert_true(q40.kc == 2 && !q40.hl && !q40.rg);
    assert_true(q80.kc == 2 && q80.hl && !q80.pc && !q80.rg);
}

/* The fused gate/up + down launch: a pair for every default one-row format of the three shapes on the H200 (the
 * table's order: int4 steps of 3 / 2, int8 with the plane through the ring, int8 on float16 products into int8 with
 * the ring, float16 products both, fp8 ring / ring, no ring / ring, no ring / no ring, the half2 pairs' two); none at
 * two rows; none where the down product is one K-slice (the wait would be a grid barrier); none for formats without a
 * pair (GGUF). */
static void test_gd_pairs(void **state) {
    (void)state;
    const struct {
        const shape *s;
        const char *quant;
        int sz, pair;
    } want[] = {
        {&S27, "int8", 0, 2}, {&S4, "int8", 0, 3}, {&S1, "int8", 0, 4}, {&S27, "int4", 0, 0}, {&S4, "int4", 0, 0},
        {&S1, "int4", 0, 1},  {&S27, "fp8", 0, 5}, {&S4, "fp8", 0, 6},  {&S1, "fp8", 0, 7},   {&S27, "int4", 1, 8},
        {&S1, "int4", 1, 9},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const int got = g3_cuda_test_qp_gd_pair(G3_DTYPE_F32, want[i].quant, want[i].s->hidden, want[i].s->inter, 1,
                                                want[i].sz, H200_SMS);
        if (got != want[i].pair)
            fprintf(stderr, "  %s %s%s: pair %d, want %d\n", want[i].s->name, want[i].quant, want[i].sz ? " sz" : "",
                    got, want[i].pair);
        assert_int_equal(got, want[i].pair);
        assert_int_equal(g3_cuda_test_qp_gd_pair(G3_DTYPE_F32, want[i].quant, want[i].s->hidden, want[i].s->inter, 2,
                                                 want[i].sz, H200_SMS),
                         -1);
    }
    assert_int_equal(g3_cuda_test_qp_gd_pair(G3_DTYPE_Q4_K, "bf16", S27.hidden, S27.inter, 1, 0, H200_SMS), -1);
    /* a down product of one K-slice: rows no longer than the slice limit */
    setenv("G3_CUDA_QPKS", "0", 1);
    assert_int_equal(g3_cuda_test_qp_gd_pair(G3_DTYPE_F32, "int8", S27.hidden, S27.inter, 1, 0, H200_SMS), -1);
    unsetenv("G3_CUDA_QPKS");
    assert_int_equal(g3_cuda_test_qp_gd_pair(G3_DTYPE_F32, "int8", S27.hidden, S27.inter, 1, 0, H200_SMS), 2);
    assert_int_equal(g3_cuda_test_qp_gd_pair(G3_DTYPE_F32, "no-such-format", 64, 128, 1, 0, H200_SMS), -2);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef G3_HAVE_CUDA
        cmocka_unit_test(test_policy_limits),
        cmocka_unit_test(test_policy_h200),
        cmocka_unit_test(test_gd_pairs),
#else
        cmocka_unit_test(tu_skip_no_cuda),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
