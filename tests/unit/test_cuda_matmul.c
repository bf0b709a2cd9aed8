/* CUDA matrix products against CPU references: every resident format on every path (tensor-core kernels for decode
 * and small batches, the staged and int8 tensor-core kernels for 9..64 rows, CUDA-core GEMV, dp4a GEMV on q8
 * activations, cuBLAS for many rows), long rows, GGUF block types. Skipped without CUDA or a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "model/dtype.h"
#include "cuda_testutil.h"

/* n random rows of k values (row r: frand() * scale * (1 + r % 3)) stored as type t in raw (row_bytes(t, k) each;
 * F32 as is); ref (if not NULL) gets them dequantized back to float */
static void random_rows(uint32_t t, int n, int k, float scale, uint8_t *raw, float *ref) {
    const size_t rb = t == G3_DTYPE_F32 ? sizeof(float) * (size_t)k : g3_row_bytes(t, k);
    float *src = malloc(sizeof(float) * k);
    g3_error err = {0};
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < k; i++) src[i] = frand() * scale * (1 + r % 3);
        if (t == G3_DTYPE_F32) memcpy(raw + rb * r, src, rb);
        else assert_int_equal(g3_quantize_row(t, src, raw + rb * r, k, &err), G3_OK);
        if (ref) g3_dequant_row(t, raw + rb * r, ref + (size_t)r * k, k);
    }
    free(src);
}

static void test_matmul_formats(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_QGEMV", "0", 1); /* the exact paths (q8 activations: test_qgemv) */
    setenv("G3_CUDA_TQMIN", "9", 1); /* 3..8 rows: not the int8 tensor cores of tc_q8.cu (test_matmul_tq_small) */
    /* weights uniform in +-0.1: bf16 rounding <= 0.1*2^-9, int8 step 0.2/254, int4 step 0.2/15, fp8 3 bits */
    const int ms[] = {1, 2, 3, 5, 8, 13, 20, 40, 64, 72};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        run_mm("bf16", 96, 384, ms[i], 1, 0, 3.0e-4, tol_for("bf16", ms[i], 1));
        run_mm("int8", 96, 384, ms[i], 1, 0, 5.0e-4, tol_for("int8", ms[i], 1));
        run_mm("int4", 96, 384, ms[i], 1, 0, 7.0e-3, tol_for("int4", ms[i], 1));
        run_mm("fp8", 96, 384, ms[i], 1, 0, 7.0e-3, tol_for("fp8", ms[i], 1));
    }
    run_mm("bf16", 64, 256, 20, 2, 0, 3.0e-4, 2e-2); /* plain bf16 activations: ~2^-9 relative */
    run_mm("bf16", 64, 256, 3, 2, 0, 3.0e-4, 2e-2);  /* plain, tensor cores, one column per row */
    run_mm("int4", 64, 256, 6, 2, 0, 7.0e-3, 2e-2);
    run_mm("bf16", 128, 256, 1, 1, 1, 3.0e-4, 2e-5); /* GeGLU fused into the CUDA-core GEMV */
    run_mm("int4", 128, 256, 4, 1, 1, 7.0e-3, 2e-5); /* GeGLU after the tensor-core product */
    run_mm("int8", 128, 256, 30, 1, 1, 5.0e-4, 1e-2);
    setenv("G3_CUDA_FUSE", "1", 1); /* GeGLU fused into the tensor-core product (tile finisher) */
    run_mm("int4", 128, 256, 4, 1, 1, 7.0e-3, 2e-5);
    run_mm("int8", 160, 256, 30, 1, 1, 5.0e-4, 1e-2);
    unsetenv("G3_CUDA_FUSE");
    run_mm("bf16", 128, 256, 24, 1, 1, 3.0e-4, 2e-5); /* GeGLU after cuBLAS */
    run_mm("bf16", 2, 8, 1, 1, 0, 3.0e-4, 2e-5);      /* fewer chunks than lanes, one partial tile */
    /* the tensor-core kernel for bf16 weights (not the default path) and the L2-prefetch variant */
    setenv("G3_CUDA_TC", "all", 1);
    setenv("G3_CUDA_TCPF", "1", 1);
    run_mm("bf16", 96, 384, 1, 1, 0, 3.0e-4, 2e-5);
    run_mm("bf16", 96, 384, 7, 1, 0, 3.0e-4, 2e-5);
    run_mm("bf16", 2, 8, 1, 1, 0, 3.0e-4, 2e-5);
    run_mm("int4", 96, 384, 3, 1, 0, 7.0e-3, 2e-5);
    unsetenv("G3_CUDA_TC");
    unsetenv("G3_CUDA_TCPF");
    unsetenv("G3_CUDA_TQMIN");
}

/* long rows (many rounds per tile, split among warps) and a partial last tile */
static void test_matmul_long_rows(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_QGEMV", "0", 1); /* the exact paths (q8 activations: test_qgemv) */
    setenv("G3_CUDA_TQMIN", "9", 1); /* as in test_matmul_formats */
    const int ms[] = {1, 4, 8, 24, 64};
    const char *qs[] = {"bf16", "int8", "int4", "fp8"};
    const double tw[] = {3.0e-4, 5.0e-4, 7.0e-3, 7.0e-3};
    for (size_t qi = 0; qi < 4; qi++)
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            if (!strcmp(qs[qi], "bf16") && ms[i] > 8) continue; /* cuBLAS, covered above */
            run_mm(qs[qi], 300, 4096, ms[i], 1, 0, tw[qi], tol_for(qs[qi], ms[i], 1));
        }
    run_mm("int4", 40, 21504, 1, 1, 0, 7.0e-3, 2e-5); /* a down-projection's row length */
    run_mm("bf16", 40, 21504, 2, 1, 0, 3.0e-4, 2e-5);
    setenv("G3_CUDA_TC", "all", 1); /* bf16 through the tensor cores too */
    run_mm("bf16", 300, 4096, 1, 1, 0, 3.0e-4, 2e-5);
    run_mm("bf16", 40, 21504, 5, 1, 0, 3.0e-4, 2e-5);
    unsetenv("G3_CUDA_TC");
    unsetenv("G3_CUDA_TQMIN");
}

/* GGUF block types: the resident copy must equal the portable dequantizer's values. */
static void test_gguf_types(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_QGEMV", "0", 1); /* the exact paths (q8 activations: test_qgemv) */
    const uint32_t types[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K, G3_DTYPE_Q6_K, G3_DTYPE_F16, G3_DTYPE_BF16,
                              G3_DTYPE_Q4_1, G3_DTYPE_Q5_0, G3_DTYPE_Q5_1, G3_DTYPE_Q5_K};
    const int n = 24, k = 512;
    setenv("G3_CUDA_TQGMIN", "9", 1); /* 3 rows: not the int8 tensor cores of tc_q8g.cu (test_matmul_tqg) */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const int m = pass ? 24 : 3; /* decode (exact paths) and a small batch (bf16 activations) */
            uint32_t t = types[ti];
            size_t rb = g3_row_bytes(t, k);
            assert_true(rb > 0);
            uint8_t *raw = malloc(rb * n);
            float *ref = malloc(sizeof(float) * (size_t)n * k);
            float *wd = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)m * k);
            float *y = malloc(sizeof(float) * (size_t)m * n);
            g3_error err = {0};
            random_rows(t, n, k, 1.f, raw, ref);
            for (int i = 0; i < m * k; i++) x[i] = frand();
            if (g3_cuda_test_matmul(t, raw, n, k, "bf16", 1, 0, x, m, y, wd, &err) != G3_OK) fail_msg("%s", err.msg);
            double d = 0, mx = 0;
            for (size_t i = 0; i < (size_t)n * k; i++) d = fmax(d, fabs(wd[i] - ref[i])), mx = fmax(mx, fabs(ref[i]));
            double dy = check_mm(ref, n, k, x, m, y, 0);
            printf("  type %2u m=%-2d path %d: max|resident - dequant_row| = %.2e (of %.2f), product rel err %.2e\n", t, m,
                   g3_cuda_test_mm_path(t, n, k, "bf16", 1, m), d, mx, dy);
            /* F16 / BF16 become bf16: F16 loses 3 bits; block types are repacked exactly, except Q5_1 / Q5_K, which
             * become int8 groups of 32 with float16 scales: within half a step, 1/254 of the group's largest value */
            const int near = t == G3_DTYPE_Q5_1 || t == G3_DTYPE_Q5_K;
            double tol = t == G3_DTYPE_F16 ? mx * 4e-3 : near ? mx / 254 * 1.01 : mx * 1e-6;
            assert_true(d <= tol);
            if (near) assert_true(d > 0); /* requantized, not the source values */
            int is_float = t == G3_DTYPE_F16 || t == G3_DTYPE_BF16;
            assert_true(dy <= (t == G3_DTYPE_F16 ? 4e-3 : near ? 1e-2 : is_float || m <= 8 ? 2e-5 : 1e-2));
            free(raw), free(ref), free(wd), free(x), free(y);
        }
    }
    unsetenv("G3_CUDA_TQGMIN");
}

/* 9..64 rows on quantized weights: the staged tensor-core kernel (tc_stage.cu; $G3_CUDA_TCM=2: its cp.async weight
 * variant) and, with $G3_CUDA_TCM=0, the warp kernel it replaces. n = 264: two 256-row block tiles, the second
 * partial; n = 37: odd (scalar atomics), with a down projection's row length. Tolerance 1e-2 of max|y| as for every bf16-activation path (tol_for): activations
 * rounded to bf16 (2^-9 relative) and, for int4 and grouped int8, weights dequantized to bf16 in registers (2^-9);
 * with random signs the sum over k keeps the relative error near 2^-8 (~4e-3 seen in the host emulation). */
static void run_gguf_mm(uint32_t t, int n, int k, int m) {
    size_t rb = g3_row_bytes(t, k);
    assert_true(rb > 0);
    uint8_t *raw = malloc(rb * n);
    float *ref = malloc(sizeof(float) * (size_t)n * k);
    float *x = malloc(sizeof(float) * (size_t)m * k), *y = malloc(sizeof(float) * (size_t)m * n);
    g3_error err = {0};
    random_rows(t, n, k, 1.f, raw, ref);
    for (int i = 0; i < m * k; i++) x[i] = frand();
    for (int i = 0; i < m * n; i++) y[i] = NAN;
    if (g3_cuda_test_matmul(t, raw, n, k, "bf16", 1, 0, x, m, y, NULL, &err) != G3_OK) fail_msg("%s", err.msg);
    double dy = check_mm(ref, n, k, x, m, y, 0);
    int path = g3_cuda_test_mm_path(t, n, k, "bf16", 1, m);
    printf("  type %2u n=%d k=%d m=%-2d path %d: product rel err %.2e\n", t, n, k, m, path, dy);
    assert_int_equal(path, 1); /* tensor cores */
    assert_true(dy <= 1e-2);
    free(raw), free(ref), free(x), free(y);
}

static void test_matmul_staged(void **state) {
    (void)state;
    need_gpu();
    const int ms[] = {9, 17, 32, 64};
    const char *qs[] = {"int8", "int4", "fp8"};
    const double tw[] = {5.0e-4, 7.0e-3, 7.0e-3};
    /* default (int4: int8 tensor cores of tc_q8.cu; others staged), staged (weights in registers), staged
     * (cp.async), warp kernel, int8 tensor cores for int8 per channel too (fp8 falls back to the staged kernel).
     * tc_q8.cu quantizes the activations to int8 per block of 128 (|xq - x| <= amax/254, ~0.4% of a uniform block's
     * values, ~2e-3 relative to max|y| with random signs; 5e-3 seen), so the same 1e-2 bound holds. */
    static const char *modes[] = {NULL, "1", "2", "0", "3"};
    setenv("G3_CUDA_WG", "0", 1);  /* per-channel int8 on mma.sync here (the wgmma kernel: test_matmul_wgmma) */
    setenv("G3_CUDA_WGF", "0", 1); /* fp8 on the staged kernel here (e4m3 wgmma: test_matmul_wgmma_fp8) */
    setenv("G3_CUDA_WG4", "0", 1); /* int4 likewise (tc_wg4.cu: test_matmul_wg4) */
    for (int pass = 0; pass < 5; pass++) {
        if (modes[pass]) setenv("G3_CUDA_TCM", modes[pass], 1);
        printf("  G3_CUDA_TCM=%s\n", modes[pass] ? modes[pass] : "(default)");
        for (size_t qi = 0; qi < 3; qi++)
            for (size_t i = 0; i < 4; i++) {
                assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 5376, qs[qi], 1, ms[i]), 1);
                run_mm(qs[qi], 264, 5376, ms[i], 1, 0, tw[qi], 1e-2);
                run_mm(qs[qi], 37, 21504, ms[i], 1, 0, tw[qi], 1e-2);
            }
        run_mm("int4", 160, 512, 32, 1, 1, 7.0e-3, 2e-2); /* GeGLU after the product: gelu(g)*u compounds the
                                                           * ~5e-3 errors of g and u (measured up to 1.04e-2) */
        run_mm("int8", 96, 384, 20, 2, 0, 5.0e-4, 2e-2);  /* plain activations requested */
        unsetenv("G3_CUDA_TCM");
    }
    setenv("G3_CUDA_FUSE", "1", 1); /* fused GeGLU keeps the warp kernel (tile finisher) */
    run_mm("int4", 160, 512, 32, 1, 1, 7.0e-3, 2e-2); /* as above */
    unsetenv("G3_CUDA_FUSE");
    setenv("G3_CUDA_TCMPF", "1", 1); /* with the L2 prefetch of the stage after next */
    run_mm("int4", 264, 5376, 32, 1, 0, 7.0e-3, 1e-2);
    run_mm("int8", 37, 21504, 64, 1, 0, 5.0e-4, 1e-2);
    unsetenv("G3_CUDA_TCMPF");
    /* GGUF-derived formats: Q8_0 -> int8/32, Q6_K -> int8/16, Q4_0 and Q4_K -> int4/32: on tc_q8g.cu by default,
     * on this kernel with $G3_CUDA_TQG=0 */
    const uint32_t types[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q6_K, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K};
    for (int pass = 0; pass < 2; pass++) {
        if (pass) setenv("G3_CUDA_TQG", "0", 1);
        for (size_t ti = 0; ti < 4; ti++)
            for (size_t i = 0; i < 4; i++) run_gguf_mm(types[ti], 40, 2816, ms[i]);
        unsetenv("G3_CUDA_TQG");
    }
    run_gguf_mm(G3_DTYPE_Q4_K, 37, 21504, 32);
    /* $G3_CUDA_TCM=3: the GGUF groups as by default (tc_q8g.cu: test_matmul_tqg); int4 with a half last stage (k =
     * 384: 256 + 128), int8 with one stage, odd n, every row count of a tile variant */
    setenv("G3_CUDA_TCM", "3", 1);
    for (size_t ti = 0; ti < 4; ti++) run_gguf_mm(types[ti], 40, 2816, 32);
    const int ms3[] = {9, 16, 24, 33, 48, 63};
    for (size_t i = 0; i < 6; i++) {
        run_mm("int4", 96, 384, ms3[i], 1, 0, 7.0e-3, 1e-2);
        run_mm("int8", 45, 128, ms3[i], 1, 0, 5.0e-4, 1e-2);
    }
    run_mm("int8", 160, 256, 30, 1, 1, 5.0e-4, 2e-2); /* GeGLU after the product (as above) */
    setenv("G3_CUDA_TQOCC", "2", 1); /* one tile per warp, two blocks per SM (registers capped) */
    for (size_t i = 0; i < 4; i++) {
        run_mm("int4", 264, 5376, ms[i], 1, 0, 7.0e-3, 1e-2);
        run_mm("int8", 37, 21504, ms[i], 1, 0, 5.0e-4, 1e-2);
    }
    run_mm("int4", 96, 384, 48, 1, 0, 7.0e-3, 1e-2);
    unsetenv("G3_CUDA_TQOCC");
    unsetenv("G3_CUDA_TCM");
    unsetenv("G3_CUDA_WG");
    unsetenv("G3_CUDA_WGF");
    unsetenv("G3_CUDA_WG4");
}
/* ---- per-channel int8 on Hopper's warpgroup MMA (tc_wg.cu) ------------------------------------------------------- */
/* One int8 product of m rows checked against the kernel's own arithmetic: activations quantized per row and block of
 * 128 (d = amax/127, q = rint(x * 127/amax), in float as tq_act.cuh does), y = sum over blocks of d * (q . w). The
 * activations are small integers times a power of two that differs per (row, block) (exact in bf16, the copy the
 * product quantizes; amax spread over 2^-6 .. 2^6), so a block's d taken from the wrong stage or token moves y by
 * far more than the 1e-4 of max|y| allowed, which float rounding of the sums stays well inside. Also checked: the
 * path, and against W . x (the quantization's own error: 1e-2, as for every 9..64-row quantized path). */
/* e4m3 rounding to nearest even, saturating at 448 (as cvt.rn.satfinite.e4m3x2.f32) */
static float e4m3_rn(float v) {
    const float a = fabsf(v);
    if (!(a > 0.f)) return 0.f;
    int e;
    frexpf(a, &e); /* a in [2^(e-1), 2^e) */
    const float step = ldexpf(1.f, (e - 1 < -6 ? -6 : e - 1) - 3), r = fminf(rintf(a / step) * step, 448.f);
    return v < 0.f ? -r : r;
}

/* x [m][k] as described above, and xe what the kernels make of it: quantized per row and block of 128 (int8, or
 * with f8 e4m3 hi + lo parts; xe_hi: the hi parts alone) */
static void quantized_acts(float *x, double *xe, double *xe_hi, int m, int k, int f8) {
    for (int i = 0; i < m; i++)
        for (int b = 0; b < k / 128; b++) {
            const float sc = ldexpf(1.f, (i * 7 + b * 3) % 13 - 6);
            float amax = 0.f;
            for (int t = 0; t < 128; t++) {
                float v = (float)(int)(frand() * 100.f) * sc;
                if ((i + b) % 5 == 0 && t == 17) v = 0.f;
                x[(size_t)i * k + 128 * b + t] = v, amax = fmaxf(amax, fabsf(v));
            }
            const float qm = f8 ? 448.f : 127.f, inv = amax > 0.f ? qm / amax : 0.f, d = amax * (1.f / qm);
            for (int t = 0; t < 128; t++) {
                const size_t ix = (size_t)i * k + 128 * b + t;
                volatile float p = x[ix] * inv;
                if (f8) {
                    const float hi = e4m3_rn(p), lo = e4m3_rn(p - hi);
                    xe[ix] = (double)d * ((double)hi + lo), xe_hi[ix] = (double)d * hi;
                } else xe[ix] = xe_hi[ix] = (double)d * rintf(p);
            }
        }
}

/* fp8 weights (tc_wg.cu's e4m3 kernel): the activations split per row and block of 128 into e4m3 hi + lo parts of
 * x * 448/amax (d = amax/448): y = sum over blocks of d * ((hi + lo) . w). xe_hi: d * hi alone (the test's own check
 * that dropping the lo part would be seen). */
static void run_wgq(const char *qt, int n, int k, int m, int want_path) {
    float *w = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)m * k);
    float *y = malloc(sizeof(float) * (size_t)m * n), *wd = malloc(sizeof(float) * (size_t)n * k);
    double *xe = malloc(sizeof(double) * (size_t)m * k), *xe_hi = malloc(sizeof(double) * (size_t)m * k);
    const int f8 = !strcmp(qt, "fp8");
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand() * 0.1f;
    quantized_acts(x, xe, xe_hi, m, k, f8);
    for (size_t i = 0; i < (size_t)m * n; i++) y[i] = NAN;
    g3_error err = {0};
    if (g3_cuda_test_matmul(G3_DTYPE_F32, w, n, k, qt, 1, 0, x, m, y, wd, &err) != G3_OK)
        fail_msg("%s: %s", qt, err.msg);
    double mx = 1e-30, de = 0, dh = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double r = 0, rh = 0;
            for (int t = 0; t < k; t++)
                r += xe[(size_t)i * k + t] * wd[(size_t)j * k + t], rh += xe_hi[(size_t)i * k + t] * wd[(size_t)j * k + t];
            double e = fabs(r - y[(size_t)i * n + j]);
            if (isnan(e)) e = INFINITY;
            mx = fmax(mx, fabs(r)), de = fmax(de, e), dh = fmax(dh, fabs(r - rh));
        }
    const double dq = check_mm(wd, n, k, x, m, y, 0);
    const int path = g3_cuda_test_mm_path(G3_DTYPE_F32, n, k, qt, 1, m);
    double dk = 0; /* fp8: how far the staged bf16 kernel's y is (G3_CUDA_WGF=0): a different kernel ran */
    if (f8) {
        float *y0 = malloc(sizeof(float) * (size_t)m * n);
        setenv("G3_CUDA_WGF", "0", 1);
        if (g3_cuda_test_matmul(G3_DTYPE_F32, w, n, k, qt, 1, 0, x, m, y0, NULL, &err) != G3_OK)
            fail_msg("%s: %s", qt, err.msg);
        unsetenv("G3_CUDA_WGF");
        for (size_t i = 0; i < (size_t)m * n; i++) dk = fmax(dk, fabs((double)y0[i] - y[i]));
        dk /= mx;
        free(y0);
    }
    printf("  %s n=%-4d k=%-5d m=%-3d path %d: vs emulation %.2e, vs W.x %.2e", qt, n, k, m, path, de / mx, dq);
    if (f8) printf(" (hi parts alone: %.2e; the staged kernel: %.2e)", dh / mx, dk);
    printf("\n");
    assert_int_equal(path, want_path);
    /* e4m3 MMAs keep fewer bits in their sums than float: measured up to 2.1e-4 of max|y| with the lo rows as rows
     * of their own (<= 32 rows), up to 1.03e-3 with hi and lo summed in one accumulator (33..64 rows) */
    const double bound = f8 ? 2e-3 : 1e-4;
    if (!(de / mx <= bound))
        fail_msg("%s n=%d k=%d m=%d: %g of max|y| from the emulated product", qt, n, k, m, de / mx);
    if (f8 && !(dh / mx >= 1e-2)) fail_msg("fp8 n=%d k=%d m=%d: the lo parts move y by %g only", n, k, m, dh / mx);
    /* e4m3 hi + lo against bf16 activations: ~1e-4 and more apart; the same kernel twice: the order of its atomic
     * additions only (~1e-7) */
    if (f8 && !(dk >= 1e-5)) fail_msg("fp8 n=%d k=%d m=%d: the e4m3 kernel did not run (%g)", n, k, m, dk);
    if (!(dq <= 1e-2)) fail_msg("%s n=%d k=%d m=%d: product error %g", qt, n, k, m, dq);
    free(w), free(x), free(y), free(wd), free(xe), free(xe_hi);
}

static void run_wg(int n, int k, int m, int want_path) { run_wgq("int8", n, k, m, want_path); }

/* GGUF groups of 32 (Q8_0, Q4_0, Q4_K) and 16 (Q6_K) at 3..64 rows on the int8 tensor cores, a group an MMA
 * (tc_q8g.cu: m16n8k32, m16n8k16 for groups of 16), against
 * the same emulation as run_wgq (activations quantized per 128; the resident weights as the device dequantizes them):
 * a group's scale, offset or activations taken from the wrong group, row, token or stage moves y far beyond the 1e-4
 * of max|y| allowed. want: whether that kernel must be the one that runs ($G3_CUDA_TQG=0: the staged bf16 kernel,
 * checked against W . x only). */
static void run_tqg(uint32_t t, int n, int k, int m, int want) {
    const size_t rb = g3_row_bytes(t, k);
    uint8_t *raw = malloc(rb * n);
    float *x = malloc(sizeof(float) * (size_t)m * k), *y = malloc(sizeof(float) * (size_t)m * n);
    float *wd = malloc(sizeof(float) * (size_t)n * k);
    double *xe = malloc(sizeof(double) * (size_t)m * k), *xe_hi = malloc(sizeof(double) * (size_t)m * k);
    random_rows(t, n, k, 1.f, raw, NULL);
    quantized_acts(x, xe, xe_hi, m, k, 0);
    for (size_t i = 0; i < (size_t)m * n; i++) y[i] = NAN;
    g3_error err = {0};
    if (g3_cuda_test_matmul(t, raw, n, k, "bf16", 1, 0, x, m, y, wd, &err) != G3_OK) fail_msg("type %u: %s", t, err.msg);
    double mx = 1e-30, de = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double r = 0;
            for (int c = 0; c < k; c++) r += xe[(size_t)i * k + c] * wd[(size_t)j * k + c];
            double e = fabs(r - y[(size_t)i * n + j]);
            if (isnan(e)) e = INFINITY;
            mx = fmax(mx, fabs(r)), de = fmax(de, e);
        }
    const double dq = check_mm(wd, n, k, x, m, y, 0);
    const int taken = g3_cuda_test_tqg(t, n, k, m);
    printf("  type %2u n=%-4d k=%-5d m=%-2d tqg %d: vs emulation %.2e, vs W.x %.2e\n", t, n, k, m, taken, de / mx, dq);
    assert_int_equal(taken, want);
    assert_int_equal(g3_cuda_test_mm_path(t, n, k, "bf16", 1, m), 1);
    if (want && !(de / mx <= 1e-4)) fail_msg("type %u n=%d k=%d m=%d: %g of max|y| from the emulation", t, n, k, m, de / mx);
    /* the staged kernel reads bf16 activations: it must be seen to differ from the quantized emulation */
    if (!want && !(de / mx >= 1e-5)) fail_msg("type %u n=%d k=%d m=%d: the staged kernel did not run (%g)", t, n, k, m, de / mx);
    if (!(dq <= 1e-2)) fail_msg("type %u n=%d k=%d m=%d: product error %g", t, n, k, m, dq);
    free(raw), free(x), free(y), free(wd), free(xe), free(xe_hi);
}

/* The scale codes: Q8_0 / Q4_0 (and Q4_K up to 16 rows; beyond with $G3_CUDA_TQGKC=all) on the files' own codes by
 * default (a call counter proves it), on the floats with $G3_CUDA_TQGKC=0, both against the same emulation. n = 264: tiles of 256 (two tiles a warp) or 128 rows, the
 * last partial; 37: odd (scalar atomics), a down
 * projection's k split across blocks; k = 384: Q4_0's last stage half (256 + 128), Q8_0's three stages; every row
 * count of each tile variant (3..8, 9..16, 17..32, 33..64; below 9 instead of dp4a, from $G3_CUDA_TQGMIN rows);
 * two blocks per SM ($G3_CUDA_TQOCC=2, the int8 default) and
 * one ($G3_CUDA_TQOCC=1, the int4 default beyond 8 rows); and the policy: the staged kernel (and dp4a below 9 rows)
 * with $G3_CUDA_TQG=0, 1-2 rows on qgemv_p.cu, from $G3_CUDA_TQGMIN rows, not beyond 64. */
static void test_matmul_tqg(void **state) {
    (void)state;
    need_gpu();
    const uint32_t types[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K, G3_DTYPE_Q6_K};
    const int ms[] = {3, 5, 8, 9, 16, 17, 32, 33, 64};
    for (size_t ti = 0; ti < 4; ti++) {
        const long long k0 = g3_cuda_test_tqg_kc_launches();
        for (size_t i = 0; i < 9; i++) run_tqg(types[ti], 264, 2816, ms[i], 1);
        run_tqg(types[ti], 37, 21504, 24, 1);
        const int kb = types[ti] == G3_DTYPE_Q4_K || types[ti] == G3_DTYPE_Q6_K ? 768 : 384; /* K: blocks of 256 */
        run_tqg(types[ti], 40, kb, 48, 1);
        for (int occ = 1; occ <= 2; occ++) {
            setenv("G3_CUDA_TQOCC", occ == 1 ? "1" : "2", 1);
            run_tqg(types[ti], 264, 2816, 12, 1);
            run_tqg(types[ti], 37, 5376, 40, 1);
            unsetenv("G3_CUDA_TQOCC");
        }
        /* Q8_0 / Q4_0 / Q4_K read the files' scale codes (g3_dmat.kc, kd) by default, Q6_K its float scales; with
         * $G3_CUDA_TQGKC=0 the same products on the floats (the emulation's dequantized weights come from those) */
        const long long k1 = g3_cuda_test_tqg_kc_launches();
        printf("  type %u: launches on the scale codes %lld\n", types[ti], k1 - k0);
        if (types[ti] == G3_DTYPE_Q6_K) assert_true(k1 == k0);
        else if (types[ti] == G3_DTYPE_Q4_K) assert_true(k1 - k0 >= 6); /* up to 16 rows (3, 5, 8, 9, 16, 12 x 2) */
        else assert_true(k1 - k0 >= 11);
        long long k2 = k1;
        if (types[ti] == G3_DTYPE_Q4_K) { /* beyond 16 rows with $G3_CUDA_TQGKC=all */
            setenv("G3_CUDA_TQGKC", "all", 1);
            run_tqg(types[ti], 264, 2816, 33, 1);
            run_tqg(types[ti], 37, 21504, 24, 1);
            unsetenv("G3_CUDA_TQGKC");
            k2 = g3_cuda_test_tqg_kc_launches();
            assert_true(k2 == k1 + 2);
        }
        setenv("G3_CUDA_TQGKC", "0", 1);
        run_tqg(types[ti], 264, 2816, 8, 1);
        run_tqg(types[ti], 40, kb, 48, 1);
        assert_true(g3_cuda_test_tqg_kc_launches() == k2);
        unsetenv("G3_CUDA_TQGKC");
        setenv("G3_CUDA_TQG", "0", 1);
        run_tqg(types[ti], 264, 2816, 32, 0);
        assert_int_equal(g3_cuda_test_tqg(types[ti], 264, 2816, 5), 0);
        unsetenv("G3_CUDA_TQG");
        assert_int_equal(g3_cuda_test_tqg(types[ti], 264, 2816, 2), 0); /* 1-2 rows: qgemv_p.cu */
        setenv("G3_CUDA_TQGMIN", "6", 1);
        assert_int_equal(g3_cuda_test_tqg(types[ti], 264, 2816, 5), 0);
        run_tqg(types[ti], 40, 2816, 6, 1);
        unsetenv("G3_CUDA_TQGMIN");
    }
    assert_int_equal(g3_cuda_test_tqg(G3_DTYPE_Q8_0, 264, 2816, 65), 0);
}

/* int8 per channel and int4 in groups of 128 at 3..8 rows on tc_q8.cu's int8 tensor cores (one 8-row activation
 * tile, NT = 1; from $G3_CUDA_TQMIN rows), against run_wgq's emulation (activations quantized per 128; a block's
 * scale or a row taken from the wrong place moves y far beyond the 1e-4 of max|y| allowed, and the paths these rows
 * took before, dp4a on activations quantized per 32 or hi + lo bf16 activations, are ~1e-3 off it): every row count,
 * n = 264 (a partial last block tile) and 37 (odd), a down projection's row length, int4 with a half last stage (k =
 * 384), both occupancies and the register caps for 3 / 4 blocks a SM ($G3_CUDA_TQSB), int4 with and without the hi
 * nibbles in MMAs of their own ($G3_CUDA_TQHI=0: without); then
 * the policy: $G3_CUDA_TQMIN gives the rows below it back to dp4a. */
static void test_matmul_tq_small(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_QGEMV"), unsetenv("G3_CUDA_TQMIN"); /* test_matmul_formats leaves $G3_CUDA_QGEMV=0 */
    static const char *const qs[] = {"int8", "int4"};
    for (int qi = 0; qi < 2; qi++) {
        setenv("G3_CUDA_Q4R", "0", 1); /* tc_q8.cu here at any size; tc_q4r.cu: test_matmul_q4r */
        for (int m = 3; m <= 8; m++) run_wgq(qs[qi], 264, 2560, m, 1);
        run_wgq(qs[qi], 37, 21504, 5, 1);
        run_wgq(qs[qi], 40, 384, 4, 1);
        for (int occ = 1; occ <= 2; occ++) {
            setenv("G3_CUDA_TQOCC", occ == 1 ? "1" : "2", 1);
            run_wgq(qs[qi], 264, 5376, 8, 1);
            run_wgq(qs[qi], 37, 1152, 3, 1);
            unsetenv("G3_CUDA_TQOCC");
        }
        for (int sb = 3; sb <= 4; sb++) { /* registers capped for 3 / 4 blocks a SM */
            setenv("G3_CUDA_TQSB", sb == 3 ? "3" : "4", 1);
            run_wgq(qs[qi], 264, 5376, 8, 1);
            run_wgq(qs[qi], 37, 1152, 3, 1);
            unsetenv("G3_CUDA_TQSB");
        }
        if (qi == 1) { /* int4 without the hi-nibble MMAs (k_tq's HI) */
            setenv("G3_CUDA_TQHI", "0", 1);
            for (int m = 3; m <= 8; m += 5) run_wgq(qs[qi], 264, 2560, m, 1);
            run_wgq(qs[qi], 37, 1152, 4, 1);
            unsetenv("G3_CUDA_TQHI");
        }
        setenv("G3_CUDA_TQMIN", "6", 1);
        run_wgq(qs[qi], 264, 2560, 6, 1);
        assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 2560, qs[qi], 1, 4), 3); /* dp4a */
        setenv("G3_CUDA_TQMIN", "9", 1);
        assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 2560, "int4", 1, 8), 3);
        unsetenv("G3_CUDA_TQMIN");
    }
    unsetenv("G3_CUDA_Q4R");
}

/* int4 in groups of 128, per-channel int8 and fp8 at 3..8 rows (fp8 matrices of k <= 5376 to 16; every format to 16
 * / 32 with $G3_CUDA_Q4RMAX) with the weights loaded straight into registers
 * (tc_q4r.cu, the default there for matrices of >= $G3_CUDA_Q4RMIN MB, 0 here), against run_wgq's emulation (the same
 * activations quantized per 128, fp8's as e4m3 hi + lo parts, the resident weights dequantized; for fp8 also: the lo
 * parts count, and the staged kernel's result differs): every m (an activation row a B column, lanes past m
 * repeating the last row), n = 264 / 37 / 40 (a partial last tile of 16 rows, its rows clamped and not written), k =
 * 2560 (int4: 20 groups, two a unit), 384 / 1152 (3 / 9 groups: one a unit), 5376 and 4096 (the 27B qkv / o rows),
 * 21504 (four K-slices of 42 groups, each block copying the activations of the slices it touches), n = 5376 (full
 * tiles, stream-K ranges across tiles). The launch counter proves that this kernel ran, that $G3_CUDA_Q4R=0 gives the
 * product back to tc_q8.cu, and that the default threshold keeps a small matrix there. */
static void test_matmul_q4r(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_QGEMV"), unsetenv("G3_CUDA_TQMIN"), unsetenv("G3_CUDA_Q4R");
    static const char *const qs[] = {"int4", "int8", "fp8"};
    for (int qi = 0; qi < 3; qi++) {
        setenv("G3_CUDA_Q4RMIN", "0", 1);
        const long long c0 = g3_cuda_test_q4r_launches();
        for (int m = 3; m <= 8; m++) run_wgq(qs[qi], 264, 2560, m, 1);
        /* k = 21504 in two slices a block (fp8's 37-row matrix would copy all 168 groups: too much shared memory) */
        run_wgq(qs[qi], qi == 2 ? 2048 : 37, 21504, 5, 1);
        run_wgq(qs[qi], 40, 384, 4, 1);
        run_wgq(qs[qi], 37, 1152, 3, 1);
        run_wgq(qs[qi], 264, 5376, 8, 1);
        run_wgq(qs[qi], 5376, 4096, 7, 1);
        /* 9..16 rows ($G3_CUDA_Q4RMAX=16: every format, several K-slices too): two column tiles of 8 activation rows
         * (the second's lanes past m repeating the last row) */
        setenv("G3_CUDA_Q4RMAX", "16", 1);
        for (int m = 9; m <= 16; m++) run_wgq(qs[qi], 264, 2560, m, 1);
        run_wgq(qs[qi], qi == 2 ? 2048 : 37, 21504, 13, 1); /* fp8: 26 activation rows, slices of 28 groups */
        run_wgq(qs[qi], 37, 1152, 10, 1);
        run_wgq(qs[qi], 5376, 4096, 16, 1);
        /* 17..32 rows with $G3_CUDA_Q4RMAX=32: four column tiles, slices sized to the shared memory */
        setenv("G3_CUDA_Q4RMAX", "32", 1);
        for (int m = 17; m <= 32; m += 15) run_wgq(qs[qi], 264, 2560, m, 1);
        run_wgq(qs[qi], qi == 2 ? 2048 : 37, 21504, 27, 1);
        const long long c1 = g3_cuda_test_q4r_launches();
        printf("  %s: tc_q4r.cu launches: %lld\n", qs[qi], c1 - c0);
        assert_true(c1 - c0 >= 25);
        /* 9..16 rows given back by $G3_CUDA_Q4RMAX=8 */
        setenv("G3_CUDA_Q4RMAX", "8", 1);
        run_mm(qs[qi], 264, 2560, 12, 1, 0, 7.0e-3, 1e-2);
        assert_true(g3_cuda_test_q4r_launches() == c1);
        /* unset: beyond 8 rows only fp8 matrices of rows of <= 42 groups (k = 2560: 20 groups; 21504: 168) */
        unsetenv("G3_CUDA_Q4RMAX");
        run_mm(qs[qi], 264, 2560, 12, 1, 0, 7.0e-3, 1e-2);
        const long long c2 = c1 + (qi == 2);
        assert_true(g3_cuda_test_q4r_launches() == c2);
        run_mm(qs[qi], 37, 21504, 12, 1, 0, 7.0e-3, 1e-2);
        assert_true(g3_cuda_test_q4r_launches() == c2);
        /* the products elsewhere (fp8 at <= 8 rows then on tc_gemv.cu's bf16 hi + lo, not run_wgq's e4m3 form):
         * checked against W . x only, the counter not moving */
        setenv("G3_CUDA_Q4R", "0", 1);
        run_mm(qs[qi], 264, 2560, 5, 1, 0, 7.0e-3, 1e-2);
        assert_true(g3_cuda_test_q4r_launches() == c2);
        unsetenv("G3_CUDA_Q4R"), unsetenv("G3_CUDA_Q4RMIN");
        run_mm(qs[qi], 264, 2560, 5, 1, 0, 7.0e-3, 1e-2); /* < 1 MB: below the default threshold */
        assert_true(g3_cuda_test_q4r_launches() == c2);
    }
}

/* 9..64 rows: 64-token tiles; 65..128: 128-token tiles; 129..256: two launches (g3c_mm). n = 37: odd (scalar
 * atomics), one partial channel tile; 264: three tiles, the last partial; k = 128: one stage per tile (a block per
 * tile); 21504: a down projection's row, split across blocks (stream-K). $G3_CUDA_WG=0: mma.sync at 9..64 rows and
 * in launches of <= 64 beyond, or cuBLAS beyond with $G3_CUDA_QBIG=0 (the emulation bound is for this kernel only). */
static void test_matmul_wgmma(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_WGMIN", "9", 1); /* from 9 rows (default 33: mma.sync is faster below) */
    const int ms[] = {9, 16, 33, 64, 65, 100, 128, 129, 256};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        run_wg(264, 5376, ms[i], 1);
        run_wg(37, 21504, ms[i], 1);
        run_wg(45, 128, ms[i], 1);
    }
    run_mm("int8", 160, 256, 100, 1, 1, 5.0e-4, 2e-2); /* GeGLU after the product */
    /* blocks of several units: shares that end mid-kernel (atomics) and each block's last (bulk reductions) */
    run_wg(2048, 5376, 64, 1);
    run_wg(2048, 5376, 100, 1);
    /* 336 channel tiles (the 27B gate/up product's) for 3 blocks a SM on a 132-SM H200: a block a tile, its whole K
     * range ($G3_CUDA_WGTILE=0: stream-K ranges) */
    run_wg(43008, 256, 64, 1);
    setenv("G3_CUDA_WGTILE", "0", 1);
    run_wg(43008, 256, 40, 1);
    unsetenv("G3_CUDA_WGTILE");
    setenv("G3_CUDA_WGBR", "0", 1); /* every share by float2 atomics */
    run_wg(264, 5376, 64, 1);
    run_wg(2048, 5376, 100, 1);
    unsetenv("G3_CUDA_WGBR");
    setenv("G3_CUDA_WGST", "4", 1); /* four stages, two blocks per SM */
    run_wg(264, 5376, 40, 1);
    run_wg(37, 21504, 100, 1);
    unsetenv("G3_CUDA_WGST");
    setenv("G3_CUDA_WGPF", "0", 1); /* without the L2 prefetch hint */
    run_wg(264, 5376, 64, 1);
    run_wg(37, 21504, 128, 1);
    unsetenv("G3_CUDA_WGPF");
    unsetenv("G3_CUDA_WGMIN");
    setenv("G3_CUDA_WG", "0", 1); /* mma.sync, beyond 64 rows in launches of <= 64 (test_matmul_big_decode) */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 5376, "int8", 1, 100), 1);
    run_mm("int8", 264, 5376, 33, 1, 0, 5.0e-4, 1e-2);
    run_mm("int8", 264, 5376, 100, 1, 0, 5.0e-4, 1e-2);
    setenv("G3_CUDA_QBIG", "0", 1); /* and cuBLAS beyond 64 rows */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 5376, "int8", 1, 100), 2);
    run_mm("int8", 264, 5376, 100, 1, 0, 5.0e-4, 1e-2);
    unsetenv("G3_CUDA_QBIG");
    unsetenv("G3_CUDA_WG");
}

/* The gate/up product with GeGLU and the down product's quantization in its last step (g3c_wg_mm_geglu: each block
 * one whole tile of 128 interleaved (gate, up) channels, the second block of each pair quantizing their 128 values)
 * against the product then k_geglu4's quantization, from the same quantized x: equal to float rounding (the
 * reference's stream-K sums add in another order; at the 27B width both take whole tiles and agree exactly), at most
 * 1 in 50 values a quantization step apart; both within a few percent of the float GeGLU of the unquantized weights
 * (a wrong pairing or placement is off by the values themselves); the pair counters zero again after `calls`
 * launches. */
static void run_wg_geglu(const char *quant, int n, int k, int m, int calls, int want_taken) {
    const int F = n / 2;
    float *w = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)m * k);
    float *hf = calloc((size_t)m * F, sizeof(float)), *hr = calloc((size_t)m * F, sizeof(float));
    random_rows(G3_DTYPE_F32, n, k, 0.08f, (uint8_t *)w, NULL);
    for (size_t i = 0; i < (size_t)m * k; i++) x[i] = frand();
    int taken = -1, cnt_zero = -1;
    g3_error err = {0};
    assert_int_equal(g3_cuda_test_wg_geglu(G3_DTYPE_F32, w, n, k, quant, x, m, calls, hf, hr, &taken, &cnt_zero, &err),
                     G3_OK);
    assert_int_equal(taken, want_taken);
    double worst = 0, worst_cpu = 0, hmax = 0;
    int diff = 0;
    for (int r = 0; r < m; r++)
        for (int j0 = 0; j0 < F; j0 += 128) {
            double amax = 0;
            for (int j = j0; j < j0 + 128; j++) {
                const float *wg = w + (size_t)(2 * j) * k, *wu = wg + k, *xr = x + (size_t)r * k;
                double g = 0, u = 0;
                for (int i = 0; i < k; i++) g += (double)wg[i] * xr[i], u += (double)wu[i] * xr[i];
                const double h = geglu_ref(g, u);
                const double e = fabs(hr[(size_t)r * F + j] - h);
                if (e > worst_cpu) worst_cpu = e;
                if (fabs(h) > amax) amax = fabs(h);
            }
            if (amax > hmax) hmax = amax;
            if (!want_taken) continue;
            for (int j = j0; j < j0 + 128; j++) {
                const double e = fabs((double)hf[(size_t)r * F + j] - hr[(size_t)r * F + j]) / amax;
                if (e > worst) worst = e;
                diff += e > 1e-4; /* beyond float rounding: a quantization step (1/127 of amax for int8) */
            }
        }
    printf("  wg geglu %s n %d k %d m %d x%d: taken %d, max |fused - ref| %.2e of the block max (%d of %d values "
           "differ by more than 1e-4 of it), ref vs float %.2e of max|h| %.3f\n",
           quant, n, k, m, calls, taken, worst, diff, m * F, worst_cpu / hmax, hmax);
    assert_true(hmax > 0.1);
    assert_true(worst_cpu < 0.05 * hmax);
    if (want_taken) {
        assert_int_equal(cnt_zero, 1);
        assert_true(worst <= (strcmp(quant, "fp8") ? 1.01 / 127 : 0.02));
        assert_true(diff <= m * F / 50);
    }
    free(w), free(x), free(hf), free(hr);
}

static void test_matmul_wg_geglu(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_WGGG", "2", 1); /* whole tiles wherever the kernel can (by default: where they are the policy) */
    const char *qs[] = {"int8", "fp8"};
    for (int qi = 0; qi < 2; qi++) {
        run_wg_geglu(qs[qi], 512, 384, 33, 1, 1);
        run_wg_geglu(qs[qi], 512, 384, 64, 3, 1); /* the counters cleared by each launch */
        run_wg_geglu(qs[qi], 1024, 1280, 47, 2, 1);
    }
    run_wg_geglu("int8", 512, 384, 32, 1, 0); /* 32 rows: not this kernel */
    setenv("G3_CUDA_WGGG", "0", 1);
    run_wg_geglu("fp8", 512, 384, 64, 1, 0);
    unsetenv("G3_CUDA_WGGG");
    /* the 27B gate/up shape (336 tiles): whole tiles by default on a GPU of 112..149 SMs at three blocks a SM (the
     * H200's 132), where int8 and fp8 take the epilogue by default; with the early trigger ($G3_CUDA_WGLT=0, which
     * changes only when the down product's blocks are scheduled) the values are the same */
    int n_sm = 0;
    g3_cuda_test_qp_kslices(G3_DTYPE_F32, 64, 256, "int8", 0, &n_sm);
    const int whole = n_sm >= 112 && n_sm <= 149;
    run_wg_geglu("fp8", 43008, 256, 64, 2, whole);
    run_wg_geglu("int8", 43008, 256, 48, 2, whole);
    setenv("G3_CUDA_WGLT", "0", 1);
    run_wg_geglu("int8", 43008, 256, 64, 1, whole);
    unsetenv("G3_CUDA_WGLT");
    setenv("G3_CUDA_WGGG", "0", 1);
    run_wg_geglu("int8", 43008, 256, 64, 1, 0);
    unsetenv("G3_CUDA_WGGG");
}

/* fp8 on e4m3 warpgroup MMA (tc_wg.cu): up to 32 rows as 64-row tiles (lo parts at rows m..2m-1), 33..64 as hi and
 * lo tiles of 64 tokens summed in one accumulator (lo parts at 64..), decode batches of 65..128 rows in one launch
 * of four (or two) warpgroups on one weight tile (lo parts at 128..), beyond in equal launches (129 = 65 + 64; with
 * $G3_CUDA_WGF2=0 every launch <= 64 rows); shapes as for int8 (odd n, one stage, stream-K), every stage count and
 * the prefetch variant. Against the emulation
 * of hi + lo e4m3 activations (2e-3 of max|y|, where the hi parts alone are >= 1e-2 away), W . x, and the staged
 * bf16 kernel ($G3_CUDA_WGF=0), which must give a different y (else the e4m3 kernel did not run). */
static void test_matmul_wgmma_fp8(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_WGFMIN", "9", 1); /* from 9 rows (default 33) */
    setenv("G3_CUDA_WGFW", "0", 1);   /* beyond 64 rows on every matrix (default: 16 M weights and more) */
    const int ms[] = {9, 16, 32, 33, 64, 65, 100, 128, 129, 256};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        run_wgq("fp8", 264, 5376, ms[i], 1);
        run_wgq("fp8", 37, 21504, ms[i], 1);
        run_wgq("fp8", 45, 128, ms[i], 1);
    }
    run_wgq("fp8", 2048, 5376, 64, 1); /* blocks of several units (mid-kernel shares by atomics) */
    run_wgq("fp8", 43008, 256, 48, 1);  /* a block a channel tile (336 tiles, 396 slots on an H200) */
    run_wgq("fp8", 2048, 5376, 128, 1);
    setenv("G3_CUDA_WGBR", "0", 1); /* every share by float2 atomics */
    run_wgq("fp8", 264, 5376, 64, 1);
    run_wgq("fp8", 264, 5376, 100, 1);
    unsetenv("G3_CUDA_WGBR");
    setenv("G3_CUDA_WGF2ST", "4", 1); /* 65..128 rows: four stages */
    run_wgq("fp8", 264, 5376, 100, 1);
    run_wgq("fp8", 37, 21504, 128, 1);
    unsetenv("G3_CUDA_WGF2ST");
    setenv("G3_CUDA_WGF2W", "2", 1); /* 65..128 rows: two warpgroups (128 channels each; default four) */
    const int m4[] = {65, 100, 128, 256};
    for (size_t i = 0; i < sizeof m4 / sizeof m4[0]; i++) {
        run_wgq("fp8", 264, 5376, m4[i], 1);
        run_wgq("fp8", 37, 21504, m4[i], 1);
        run_wgq("fp8", 45, 128, m4[i], 1);
    }
    unsetenv("G3_CUDA_WGF2W");
    setenv("G3_CUDA_WGF2", "0", 1); /* beyond 64 rows in launches of <= 64 */
    run_wgq("fp8", 264, 5376, 100, 1);
    run_wgq("fp8", 37, 21504, 128, 1);
    unsetenv("G3_CUDA_WGF2");
    setenv("G3_CUDA_WGST", "4", 1); /* up to 32 rows: four stages */
    run_wgq("fp8", 264, 5376, 20, 1);
    unsetenv("G3_CUDA_WGST");
    setenv("G3_CUDA_WGFST", "3", 1); /* 33..64 rows: three stages */
    run_wgq("fp8", 264, 5376, 50, 1);
    run_wgq("fp8", 37, 21504, 64, 1);
    unsetenv("G3_CUDA_WGFST");
    setenv("G3_CUDA_WGPF", "0", 1);
    run_wgq("fp8", 264, 5376, 64, 1);
    run_wgq("fp8", 264, 5376, 100, 1);
    unsetenv("G3_CUDA_WGPF");
    setenv("G3_CUDA_WGFMIN", "1", 1); /* from one row (default: the bf16 kernels below 33) */
    {   /* and not the persistent float16 kernel, which takes fp8 at 1-2 rows before any tensor-core path */
        const char *qg = getenv("G3_CUDA_QGEMV");
        char *keep = qg ? strdup(qg) : NULL;
        setenv("G3_CUDA_QGEMV", "0", 1);
        run_wgq("fp8", 264, 5376, 1, 1);
        if (keep) setenv("G3_CUDA_QGEMV", keep, 1);
        else unsetenv("G3_CUDA_QGEMV");
        free(keep);
    }
    run_wgq("fp8", 37, 21504, 5, 1);
    unsetenv("G3_CUDA_WGFMIN");
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 5376, "fp8", 1, 40), 1);
    unsetenv("G3_CUDA_WGFW");
    run_mm("fp8", 160, 256, 40, 1, 1, 7.0e-3, 2e-2); /* GeGLU after the product */
}

/* ---- int4 on warpgroup MMA with the weights in registers (tc_wg4.cu) ---------------------------------------------- */
/* The same emulation (int4 weights dequantized: y = sum over blocks of d * (q . (s q_w + z))), which also checks the
 * kernel's activation order (a value paired with the wrong weight moves y by far more than 1e-4 of max|y|). Rows
 * 9..16 / 17..32 / 33..64: 16 / 32 / 64-token tiles, in every tile shape ($G3_CUDA_WG4V); beyond 64 (decode batches)
 * in launches of <= 64. n = 37: one partial channel tile; 264: five tiles of 64, the last partial; k = 128: one
 * stage; 21504: stream-K across blocks. $G3_CUDA_WG4=all: every row count here (by default 17..32
 * rows stay on tc_q8.cu's mma.sync kernel, as everything does with $G3_CUDA_WG4=0). */
static void test_matmul_wg4(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_WGB", "0", 1);   /* beyond 64 rows in launches of <= 64 here, not tc_wgb.cu's of <= 128 */
    setenv("G3_CUDA_WG4", "all", 1); /* 17..32 rows too (by default tc_q8.cu's, measured faster there) */
    const int ms[] = {9, 16, 17, 31, 32, 33, 48, 64, 100};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        run_wgq("int4", 264, 5376, ms[i], 1);
        run_wgq("int4", 37, 21504, ms[i], 1);
        run_wgq("int4", 45, 128, ms[i], 1);
    }
    run_mm("int4", 160, 512, 40, 1, 1, 7.0e-3, 2e-2); /* GeGLU after the product */
    const char *vs[] = {"0", "1", "2", "3"}; /* every tile shape ($G3_CUDA_WG4V; k = 384: two groups a stage fall back) */
    for (size_t v = 0; v < 4; v++) {
        setenv("G3_CUDA_WG4V", vs[v], 1);
        printf("  G3_CUDA_WG4V=%s\n", vs[v]);
        const int mv[] = {9, 24, 32, 40, 64};
        for (size_t i = 0; i < 5; i++) {
            run_wgq("int4", 264, 5376, mv[i], 1);
            run_wgq("int4", 37, 21504, mv[i], 1);
            run_wgq("int4", 96, 384, mv[i], 1);
        }
    }
    unsetenv("G3_CUDA_WG4V");
    const int g[] = {G3_DTYPE_Q4_0, G3_DTYPE_Q4_K}; /* groups of 32: not this kernel (tc_q8g.cu), still right */
    for (size_t i = 0; i < 2; i++) run_gguf_mm((uint32_t)g[i], 40, 2816, 32);
    const char *vz[] = {"0", NULL}; /* as before: mma.sync; the default (17..32 rows there) */
    for (size_t v = 0; v < 2; v++) {
        if (vz[v]) setenv("G3_CUDA_WG4", vz[v], 1);
        else unsetenv("G3_CUDA_WG4");
        const int mv[] = {12, 32, 64};
        for (size_t i = 0; i < 3; i++) run_wgq("int4", 264, 5376, mv[i], 1);
        run_wgq("int4", 37, 21504, 24, 1);
    }
    unsetenv("G3_CUDA_WGB");
}

/* ---- int4 on bf16 warpgroup MMA with the weights dequantized in registers (tc_wgb.cu) ---------------------------- */
static float bf16_round(float f) { /* to the nearest bf16, ties to even (finite values) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}
/* One int4 product of m rows against the bf16-rounded activations times the resident weights in double: the kernel
 * rounds each weight once more to bf16 (its scale and offset first), ~2^-9 of a group's range, so the product is
 * within a few 1e-3 of max|y| (H100, session 15: 1.9-3.5e-3; 2.7-4.2e-3 when the weights were rounded as s q + z;
 * H200, session 19: 4.2e-3 at n = 96, k = 384, m = 16 once other tests drew more random numbers first, hence the
 * bound 6e-3); an activation paired with the wrong weight (the k order of the producers and of the kernel
 * disagreeing) moves it by the order of max|y| itself. Activations of mixed scales per block. */
static void run_wgb(int n, int k, int m) {
    float *w = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)m * k);
    float *y = malloc(sizeof(float) * (size_t)m * n), *wd = malloc(sizeof(float) * (size_t)n * k);
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand() * 0.1f;
    for (int i = 0; i < m; i++)
        for (int t = 0; t < k; t++) x[(size_t)i * k + t] = frand() * ldexpf(1.f, (i * 7 + t / 128 * 3) % 9 - 4);
    for (size_t i = 0; i < (size_t)m * n; i++) y[i] = NAN;
    g3_error err = {0};
    if (g3_cuda_test_matmul(G3_DTYPE_F32, w, n, k, "int4", 1, 0, x, m, y, wd, &err) != G3_OK) fail_msg("%s", err.msg);
    double mx = 1e-30, de = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double r = 0;
            for (int t = 0; t < k; t++) r += (double)bf16_round(x[(size_t)i * k + t]) * wd[(size_t)j * k + t];
            double e = fabs(r - y[(size_t)i * n + j]);
            if (isnan(e)) e = INFINITY;
            mx = fmax(mx, fabs(r)), de = fmax(de, e);
        }
    const int path = g3_cuda_test_mm_path(G3_DTYPE_F32, n, k, "int4", 1, m);
    printf("  int4 n=%-4d k=%-5d m=%-3d path %d: vs bf16(x) . W %.2e of max|y|\n", n, k, m, path, de / mx);
    assert_int_equal(path, 1);
    if (!(de / mx <= 6e-3)) fail_msg("int4 n=%d k=%d m=%d: %g of max|y| from bf16(x) . W", n, k, m, de / mx);
    free(w), free(x), free(y), free(wd);
}

/* every row count of ms in every tile shape ($G3_CUDA_WGBV), the odd matrix shapes in the first */
static void run_wgb_shapes(const int *ms, size_t nm, const char *what) {
    const char *vs[] = {"0", "1", "2"};
    for (size_t v = 0; v < 3; v++) {
        setenv("G3_CUDA_WGBV", vs[v], 1);
        printf("  %sG3_CUDA_WGBV=%s\n", what, vs[v]);
        for (size_t i = 0; i < nm; i++) {
            run_wgb(264, 5376, ms[i]);
            run_wgb(37, 21504, ms[i]);
            if (v == 0) run_wgb(45, 128, ms[i]), run_wgb(96, 384, ms[i]);
        }
    }
    unsetenv("G3_CUDA_WGBV");
}

/* Decode batches of 65..128 rows in one launch (128-token tiles), 129..256 in two, in every tile shape
 * ($G3_CUDA_WGBV); with $G3_CUDA_WGBMIN=9 also 9..64 rows (16 / 32 / 64-token tiles). n = 37: one partial channel
 * tile; 264: three tiles of 128 (five of 64), the last partial; k = 128: two stages; 384: six; 21504: stream-K across
 * blocks. Then $G3_CUDA_WGB=0 leaves it (launches of <= 64 on tc_wg4.cu: the bound of their int8 activations). */
static void test_matmul_wgb(void **state) {
    (void)state;
    need_gpu();
    const int ms[] = {65, 100, 128, 130, 200, 256}; /* 129 = 65 + 64: the 64 on tc_wg4.cu (test_matmul_big_decode) */
    run_wgb_shapes(ms, sizeof ms / sizeof ms[0], "");
    setenv("G3_CUDA_WGBMIN", "9", 1); /* 9..64 rows too: 16 / 32 / 64-token tiles (not the default) */
    const int ml[] = {9, 16, 17, 32, 33, 64};
    run_wgb_shapes(ml, sizeof ml / sizeof ml[0], "G3_CUDA_WGBMIN=9 ");
    unsetenv("G3_CUDA_WGBMIN");
    run_mm("int4", 160, 512, 100, 1, 1, 7.0e-3, 2e-2); /* GeGLU after the product */
    setenv("G3_CUDA_WGB", "0", 1);
    run_mm("int4", 264, 5376, 100, 1, 0, 7.0e-3, 1e-2);
    unsetenv("G3_CUDA_WGB");
}

/* Decode batches of 65..256 rows on the other quantized formats: int4 in groups of 128 on tc_wgb.cu in launches of
 * <= 128 (129 = 65 + 64: the 64 on tc_wg4.cu), fp8 and the GGUF groups of 32 on the staged kernel in launches of
 * <= 64, against cuBLAS on a bf16 copy before ($G3_CUDA_QBIG=0). Bounds as for the 9..64-row kernels (int8 / bf16
 * activations). */
static void test_matmul_big_decode(void **state) {
    (void)state;
    need_gpu();
    const int ms[] = {65, 100, 129, 256};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 5376, "int4", 1, ms[i]), 1);
        run_mm("int4", 264, 5376, ms[i], 1, 0, 7.0e-3, 1e-2);
        run_mm("int4", 37, 21504, ms[i], 1, 0, 7.0e-3, 1e-2);
        run_mm("fp8", 96, 384, ms[i], 1, 0, 7.0e-3, 1e-2);
        run_gguf_mm(G3_DTYPE_Q4_0, 40, 2816, ms[i]);
    }
    run_mm("int4", 160, 512, 100, 1, 1, 7.0e-3, 2e-2); /* GeGLU after the product */
    setenv("G3_CUDA_QBIG", "0", 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 264, 5376, "int4", 1, 100), 2);
    run_mm("int4", 264, 5376, 100, 1, 0, 7.0e-3, 1e-2);
    unsetenv("G3_CUDA_QBIG");
}

/* ---- decode products with q8 activations and dp4a (qgemv.cu) ----------------------------------------------------- */
/* The activation quantization of qgemv.cu, reproduced: per block of 32 values d = amax/127, q = rint(x * 127/amax),
 * with the residual plane (lo) q_lo = rint((x*127/amax - q) * 254); xh = d * (q + q_lo/254). The products are
 * rounded one at a time (volatile: no contraction) as the kernel does with __fmul_rn. */
static void q8_emulate(const float *x, int m, int k, int lo, float *xh) {
    for (int i = 0; i < m; i++)
        for (int b = 0; b < k / 32; b++) {
            const float *v = x + (size_t)i * k + 32 * b;
            float amax = 0.f;
            for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(v[e]));
            const float inv = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
            for (int e = 0; e < 32; e++) {
                volatile float p = v[e] * inv;
                float q = rintf(p), ql = 0.f;
                if (lo) {
                    volatile float r = p - q;
                    volatile float r2 = r * 254.f;
                    ql = rintf(r2);
                }
                xh[(size_t)i * k + 32 * b + e] = (float)((double)d * ((double)q + (double)ql / 254.0));
            }
        }
}

/* float16 rounding to nearest even, subnormals included (|v| < 65520) */
static double f16_rn(double v) {
    if (v == 0) return 0;
    int e;
    frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
    const double q = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
    return rint(v / q) * q;
}

/* A block of 32 activations as h16_quant takes it: its largest |x| into amax, and the factor 1 / amax (0 for zeros) */
static float h16_block(const float *v, float *amax) {
    float a = 0.f;
    for (int e = 0; e < 32; e++) a = fmaxf(a, fabsf(v[e]));
    *amax = a;
    return a > 0.f ? 1.f / a : 0.f;
}

/* The float16 decode product (fp8, or per-channel int8 with i8) as the persistent kernel computes it (qgemv_common.cuh:
 * h16_quant, doth16), into yref [m][n] (GeGLU pairs: [m][n/2]). The resident weights come back dequantized (wd = q *
 * s per row): s = max|row| / 448 (127 for int8: the row maximum is stored as the largest value) and the e4m3 (int8)
 * values wd / s, checked to reproduce wd. Activations per block of
 * 32: amax, h = f16(float(x * float(1 / amax))); per chunk of 16 weights two chains of float16 fused multiply-adds
 * (pairs 0, 2, 4, 6 and 1, 3, 5, 7 of the chunk, each half on its own), every step rounded to float16 (products and
 * sums exact in double before that rounding), the chains summed in float32 as the kernel does; then amax times the
 * chunk, s times the row. */
static void f16_emulate(const float *wd, int n, int k, const float *x, int m, int geglu, double *yref, int i8) {
    float *wq = malloc(sizeof(float) * (size_t)n * k), *h = malloc(sizeof(float) * (size_t)m * k);
    float *am = malloc(sizeof(float) * (size_t)m * (k / 32));
    double *s = malloc(sizeof(double) * n), *yf = malloc(sizeof(double) * (size_t)m * n);
    for (int j = 0; j < n; j++) {
        float mx = 0.f;
        for (int t = 0; t < k; t++) mx = fmaxf(mx, fabsf(wd[(size_t)j * k + t]));
        s[j] = mx / (i8 ? 127.0 : 448.0);
        for (int t = 0; t < k; t++) {
            const float w = wd[(size_t)j * k + t];
            const float q = !(mx > 0.f) ? 0.f : i8 ? rintf((float)(w / s[j])) : e4m3_rn((float)(w / s[j]));
            if (!(fabs(q * s[j] - w) <= 1e-6 * mx)) fail_msg("row %d: %g is not a weight value times %g", j, w, s[j]);
            wq[(size_t)j * k + t] = q;
        }
    }
    for (int i = 0; i < m; i++)
        for (int b = 0; b < k / 32; b++) {
            const float *v = x + (size_t)i * k + 32 * b;
            float amax;
            const float inv = h16_block(v, &amax);
            am[(size_t)i * (k / 32) + b] = amax;
            for (int e = 0; e < 32; e++) {
                volatile float p = v[e] * inv;
                h[(size_t)i * k + 32 * b + e] = (float)f16_rn(p);
            }
        }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int c = 0; c < k / 16; c++) {
                const float *w = wq + (size_t)j * k + 16 * c, *a = h + (size_t)i * k + 16 * c;
                double ch[4]; /* p.x, p.y, q.x, q.y: pair j of the chunk (values 2j, 2j + 1) into p (even j) or q */
                for (int e = 0; e < 4; e++) ch[e] = f16_rn((double)w[e] * a[e]);
                for (int pr = 2; pr < 8; pr++)
                    for (int hf = 0; hf < 2; hf++) {
                        double *c2 = &ch[2 * (pr & 1) + hf];
                        *c2 = f16_rn((double)w[2 * pr + hf] * a[2 * pr + hf] + *c2);
                    }
                volatile float s0 = (float)ch[0] + (float)ch[1], s1 = (float)ch[2] + (float)ch[3];
                volatile float sum = s0 + s1;
                acc += (double)am[(size_t)i * (k / 32) + c / 2] * sum;
            }
            yf[(size_t)i * n + j] = acc * s[j];
        }
    for (int i = 0; i < m; i++) {
        if (!geglu) {
            memcpy(yref + (size_t)i * n, yf + (size_t)i * n, sizeof(double) * n);
            continue;
        }
        for (int p = 0; p < n / 2; p++) {
            const double g = yf[(size_t)i * n + 2 * p], u = yf[(size_t)i * n + 2 * p + 1];
            yref[(size_t)i * (n / 2) + p] = geglu_ref(g, u);
        }
    }
    free(wq), free(h), free(am), free(s), free(yf);
}

/* max |y - yref| / max |yref| over m rows of w outputs */
static double rel_err(const float *y, const double *yref, size_t cnt) {
    double mx = 1e-30, d = 0;
    for (size_t i = 0; i < cnt; i++) {
        const double e = fabs(y[i] - yref[i]);
        mx = fmax(mx, fabs(yref[i]));
        d = fmax(d, isnan(e) ? INFINITY : e);
    }
    return d / mx;
}

/* Rows up to which the dp4a products add the activations' residual plane (qgemv_common.cuh lo_rows): int8 weights
 * $G3_CUDA_Q8LO (default 2), int4 ($G3_DTYPE_Q4_0 / _Q4_K sources too) $G3_CUDA_Q4LO (default 0). */
static int lo_rows_for(uint32_t src_type, const char *quant) {
    const int i4 = !strcmp(quant, "int4") || src_type == G3_DTYPE_Q4_0 || src_type == G3_DTYPE_Q4_1 ||
                   src_type == G3_DTYPE_Q4_K;
    const char *e = getenv(i4 ? "G3_CUDA_Q4LO" : "G3_CUDA_Q8LO");
    return e && *e ? atoi(e) : i4 ? 0 : 2;
}

/* One qgemv product: weights `quant` from float (src_type F32) or a GGUF block type; checks (1) the path is the dp4a
 * one, (2) y against W_deq . xh in double (xh emulated as above): the kernel computes exactly that up to float32
 * rounding of ~k/16 partial terms per output (int32 dot products are exact), so 5e-5 of max|y| is ample while a
 * single misplaced activation byte or scale moves y by ~1e-3 of max|y| or more; (2b) without geglu, y against
 * W_deq . x with the bound sum_t |w_t| |xh_t - x_t| (+ 1e-5 max|y| of rounding) on every output: the error the
 * quantization of x alone may cause. */
static void run_qgemv(uint32_t src_type, const char *quant, int n, int k, int m, int geglu) {
    size_t rb = src_type == G3_DTYPE_F32 ? sizeof(float) * (size_t)k : g3_row_bytes(src_type, k);
    assert_true(rb > 0);
    uint8_t *raw = malloc(rb * n);
    float *x = malloc(sizeof(float) * (size_t)m * k);
    float *xh = malloc(sizeof(float) * (size_t)m * k), *y = malloc(sizeof(float) * (size_t)m * n);
    float *wd = malloc(sizeof(float) * (size_t)n * k);
    g3_error err = {0};
    random_rows(src_type, n, k, 0.1f, raw, NULL);
    /* activations with outliers (every 97th value x20, as in real residual streams) and one all-zero block */
    for (size_t i = 0; i < (size_t)m * k; i++) x[i] = frand() * (i % 97 == 5 ? 20.f : 1.f);
    for (int i = 0; i < 32; i++) x[(size_t)(m - 1) * k + 32 + i] = 0.f;
    for (size_t i = 0; i < (size_t)m * n; i++) y[i] = NAN;
    const int path = g3_cuda_test_mm_path(src_type, n, k, quant, 1, m);
    if (g3_cuda_test_matmul(src_type, raw, n, k, quant, 1, geglu, x, m, y, wd, &err) != G3_OK)
        fail_msg("%s: %s", quant, err.msg);
    /* float16 products (fp8; per-channel int8 where $G3_CUDA_Q8F16's policy puts it: test_qgemv_ring_policy) */
    const int f8 = g3_cuda_test_qp_f16(src_type, n, k, quant, m, geglu, 0) == 1;
    if (!strcmp(quant, "fp8")) assert_int_equal(f8, 1);
    const int lo = m <= lo_rows_for(src_type, quant);
    double dq, worst = 0;
    if (f8) { /* float16 activations and sums (f16_emulate); against the exact product: within ~2^-11 */
        double *yr = malloc(sizeof(double) * (size_t)m * n);
        f16_emulate(wd, n, k, x, m, geglu, yr, strcmp(quant, "fp8") != 0);
        dq = rel_err(y, yr, (size_t)m * (geglu ? n / 2 : n));
        worst = check_mm(wd, n, k, x, m, y, geglu);
        free(yr);
        if (!(worst <= 4e-3)) fail_msg("%s m=%d: float16 product error vs W.x %g > 4e-3", quant, m, worst);
    } else {
        q8_emulate(x, m, k, lo, xh);
        dq = check_mm(wd, n, k, xh, m, y, geglu);
    }
    if (!geglu && !f8) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double r = 0, bound = 0, absum = 0;
                for (int t = 0; t < k; t++) {
                    double wv = wd[(size_t)j * k + t];
                    r += wv * x[(size_t)i * k + t];
                    absum += fabs(wv * x[(size_t)i * k + t]);
                    bound += fabs(wv) * fabs((double)xh[(size_t)i * k + t] - x[(size_t)i * k + t]);
                }
                /* float32 rounding: ~40 roundings in series, each <= 2^-24 of a partial sum <= sum |w x| */
                const double e = fabs(y[(size_t)i * n + j] - r), slack = 3e-6 * absum;
                worst = fmax(worst, isnan(e) ? INFINITY : e / (bound + slack));
                if (!(e <= bound + slack))
                    fail_msg("%s m=%d row %d out %d: |y - W x| = %g beyond the q8 bound %g", quant, m, i, j, e, bound);
            }
    }
    printf("  qgemv %-4s type %2u n=%-3d k=%-5d m=%d geglu=%d path %d %s: rel err vs %s %.2e, %s %.3g\n", quant,
           src_type, n, k, m, geglu, path, f8 ? "f16 " : lo ? "lo=1" : "lo=0", f8 ? "the emulation" : "W.xh", dq,
           f8 ? "rel err vs W.x" : "|err vs W.x| / bound", worst);
    assert_int_equal(path, 3);
    if (!(dq <= 5e-5)) fail_msg("%s m=%d: product error vs the emulated activations %g > 5e-5", quant, m, dq);
    free(raw), free(x), free(xh), free(y), free(wd);
}

static void test_qgemv(void **state) {
    (void)state;
    need_gpu();
    /* a failed test may have left them set */
    unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_QGEMVP"), unsetenv("G3_CUDA_QGEMV"), unsetenv("G3_CUDA_QPKS");
    unsetenv("G3_CUDA_Q8F16"), unsetenv("G3_CUDA_TQMIN"), unsetenv("G3_CUDA_TQGMIN");
    unsetenv("G3_CUDA_QPRING"), unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_QPRPRE");
    const int ms[] = {1, 2, 3, 4, 8}; /* 1-2: the persistent kernel (passes 0, 1, 4, 5, 6), else two launches */
    for (int pass = 0; pass < 8; pass++) {
        /* pass 0: default residual plane up to 2 rows; pass 1: q alone at every m (the faster variant); passes 2, 3:
         * the same with $G3_CUDA_QGEMVP=0 (two launches, not the persistent kernel at 1-2 rows); the persistent
         * kernel takes K in slices of <= 5376 by default (on 132 SMs: k 21504 in 4); pass 4: whole rows per block
         * ($G3_CUDA_QPKS=0); pass 5: slices of <= 1800 (5376 in 3, 4096 in 4, 2816 in 2), q alone; passes 4 and 6
         * (default slices): the weights through the shared-memory ring of bulk copies ($G3_CUDA_QPRING=2; int4 and
         * per-channel int8 with the residual plane; by default per-channel int8 rows or slices of >= 4096 values
         * and int4 in groups of 128 without the plane (products without the add-norm prologue) take it anyway; int4
         * with its residual plane there, $G3_CUDA_Q4LO=2, off by default); pass 7: never the ring
         * ($G3_CUDA_QPRING=0) */
        setenv("G3_CUDA_QGEMV", "8", 1);
        if (pass == 1 || pass == 3 || pass == 5) setenv("G3_CUDA_Q8LO", "0", 1);
        if (pass == 2 || pass == 3) setenv("G3_CUDA_QGEMVP", "0", 1);
        if (pass == 4 || pass == 5) setenv("G3_CUDA_QPKS", pass == 5 ? "1800" : "0", 1);
        if (pass == 4 || pass == 6) setenv("G3_CUDA_QPRING", "2", 1), setenv("G3_CUDA_Q4LO", "2", 1);
        if (pass == 7) setenv("G3_CUDA_QPRING", "0", 1);
        /* passes 1, 7: per-channel int8 on dp4a at every row length (by default rows < 4096 take float16 products) */
        if (pass == 1 || pass == 7) setenv("G3_CUDA_Q8F16", "0", 1);
        /* pass 5: every quantization item slot run, predicated off past the row (by default left out), and int4 in
         * groups of 128 with the group arithmetic at run time (by default at compile time) */
        if (pass == 5) setenv("G3_CUDA_QPQS", "0", 1), setenv("G3_CUDA_QPGS", "0", 1);
        /* the ring's depth (by default 3 at one row, 2 at two): 3 at both in pass 4, 4 in pass 6 */
        if (pass == 4 || pass == 6) setenv("G3_CUDA_QPD", pass == 4 ? "3" : "4", 1);
        /* the ring's slots filled before the launch wait (by default 2, the rest after x's quantization): pass 4 all
         * of them, pass 6 one of 4 */
        if (pass == 4 || pass == 6) setenv("G3_CUDA_QPRPRE", pass == 4 ? "0" : "1", 1);
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            /* n = 45: not a multiple of any row tile (8 rows per block at short rows, 2-4 at long ones) */
            run_qgemv(G3_DTYPE_F32, "int8", 45, 5376, ms[i], 0);  /* per channel, 2 warps per row */
            run_qgemv(G3_DTYPE_F32, "int8", 45, 21504, ms[i], 0); /* 4 warps per row */
            run_qgemv(G3_DTYPE_F32, "int4", 45, 5376, ms[i], 0);  /* groups of 128 */
            run_qgemv(G3_DTYPE_F32, "int4", 37, 21504, ms[i], 0);
            run_qgemv(G3_DTYPE_Q8_0, "bf16", 45, 4096, ms[i], 0); /* int8 groups of 32 */
            run_qgemv(G3_DTYPE_Q6_K, "bf16", 45, 5376, ms[i], 0); /* int8 groups of 16 */
            run_qgemv(G3_DTYPE_Q4_0, "bf16", 45, 21504, ms[i], 0); /* int4 groups of 32 */
            run_qgemv(G3_DTYPE_Q4_K, "bf16", 45, 2816, ms[i], 0);
            if (pass == 0) { /* the types of llama.cpp's fallbacks and Q5 files: int8/32 (Q5_x) and int4/32 (Q4_1) */
                run_qgemv(G3_DTYPE_Q5_0, "bf16", 45, 1152, ms[i], 0);
                run_qgemv(G3_DTYPE_Q5_1, "bf16", 45, 1152, ms[i], 0);
                run_qgemv(G3_DTYPE_Q5_K, "bf16", 45, 2816, ms[i], 0);
                run_qgemv(G3_DTYPE_Q4_1, "bf16", 45, 1152, ms[i], 0);
            }
            if (ms[i] <= 2 && pass != 2 && pass != 3) { /* fp8: the persistent kernel only (not with QGEMVP=0) */
                run_qgemv(G3_DTYPE_F32, "fp8", 45, 5376, ms[i], 0);
                run_qgemv(G3_DTYPE_F32, "fp8", 37, 21504, ms[i], 0);
            }
        }
        run_qgemv(G3_DTYPE_F32, "int4", 6, 96, 1, 0);     /* fewer chunks than lanes */
        /* int4 in groups of 128 through the ring at one row in steps of 2 chunks a lane where they take fewer lane
         * slots than steps of 3 (qgemv_p_policy.cu's qp_u1): 4096 (128 chunks), 6912 (K-slices of 108), 2048, 1152 (36) */
        run_qgemv(G3_DTYPE_F32, "int4", 45, 4096, 1, 0);
        run_qgemv(G3_DTYPE_F32, "int4", 45, 6912, 1, 0);
        run_qgemv(G3_DTYPE_F32, "int4", 9001, 2048, 1, 0);
        run_qgemv(G3_DTYPE_F32, "int4", 37, 1152, 1, 0);
        /* per-channel int8 and fp8 through the ring at one row: 4096 (the 27B o product's 256 chunks, the last of its
         * three steps of 3 a third idle), 10240 (the 4B down product's K-slices of 320) */
        run_qgemv(G3_DTYPE_F32, "int8", 45, 4096, 1, 0);
        run_qgemv(G3_DTYPE_F32, "int8", 45, 10240, 1, 0);
        if (pass != 2 && pass != 3) {
            run_qgemv(G3_DTYPE_F32, "fp8", 45, 4096, 1, 0);
            run_qgemv(G3_DTYPE_F32, "fp8", 45, 10240, 1, 0);
        }
        run_qgemv(G3_DTYPE_F32, "int8", 130, 512, 2, 1);  /* GeGLU fused (gate, up pairs) */
        run_qgemv(G3_DTYPE_F32, "int8", 130, 512, 1, 1);
        run_qgemv(G3_DTYPE_F32, "int4", 132, 5376, 5, 1);
        /* more row groups (2 rows) than warps of the persistent grid (16 per SM, 132 SMs on the H200: 4224): each
         * warp walks several row groups, its pipeline crossing row-group boundaries; odd n leaves a half group */
        run_qgemv(G3_DTYPE_F32, "int4", 9001, 160, 1, 0);
        run_qgemv(G3_DTYPE_F32, "int8", 9001, 96, 2, 0);
        run_qgemv(G3_DTYPE_F32, "int4", 9002, 128, 2, 1);
        run_qgemv(G3_DTYPE_F32, "int8", 9002, 256, 1, 1);
        if (pass != 2 && pass != 3) {
            run_qgemv(G3_DTYPE_F32, "fp8", 6, 96, 1, 0);    /* fewer chunks than lanes */
            run_qgemv(G3_DTYPE_F32, "fp8", 130, 512, 2, 1); /* GeGLU */
            run_qgemv(G3_DTYPE_F32, "fp8", 9001, 160, 1, 0);
            run_qgemv(G3_DTYPE_F32, "fp8", 9002, 96, 2, 1);
            run_qgemv(G3_DTYPE_F32, "fp8", 130, 21504, 1, 1); /* GeGLU on long rows */
        }
        if (pass >= 4) run_qgemv(G3_DTYPE_F32, "int8", 9001, 5376, 2, 0); /* slices of many row groups per warp */
        { /* the slices taken: by default 21504 in 4 where the SMs divide by 4 (H100 / H200: 132), 5376 whole; at
           * <= 1800: 5376 in 3 (132 SMs); none with GeGLU or =0; every slice whole groups of 128 */
            int n_sm = 0, k4 = g3_cuda_test_qp_kslices(G3_DTYPE_F32, 45, 21504, "int8", 0, &n_sm);
            const int k5 = g3_cuda_test_qp_kslices(G3_DTYPE_F32, 45, 5376, "int4", 0, &n_sm);
            const int kg = g3_cuda_test_qp_kslices(G3_DTYPE_F32, 45, 21504, "int8", 1, &n_sm);
            printf("  K-slices (pass %d, %d SMs): 21504 int8 %d, 5376 int4 %d, GeGLU %d\n", pass, n_sm, k4, k5, kg);
            assert_int_equal(kg, 1);
            if (pass != 4 && pass != 5) {
                assert_int_equal(k5, 1);
                if (n_sm % 4 == 0) assert_int_equal(k4, 4);
            } else if (pass == 4) {
                assert_int_equal(k4, 1), assert_int_equal(k5, 1);
            } else if (n_sm % 3 == 0) {
                assert_int_equal(k5, 3);
            }
            assert_true(k4 >= 1 && 21504 % (128 * k4) == 0 && n_sm % k4 == 0);
        }
        /* GeGLU at 1-2 rows on row groups of 14 steps (fewer row groups than warps) and of 3 steps */
        run_qgemv(G3_DTYPE_F32, "int8", 130, 21504, 1, 1);
        run_qgemv(G3_DTYPE_F32, "int4", 9002, 5376, 2, 1);
        unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_QGEMVP"), unsetenv("G3_CUDA_QPKS"), unsetenv("G3_CUDA_QPRING");
        unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_Q8F16"), unsetenv("G3_CUDA_QPQS"), unsetenv("G3_CUDA_QPD");
        unsetenv("G3_CUDA_QPGS"), unsetenv("G3_CUDA_QPRPRE");
    }
    /* the switch: 0 = today's choice (tensor cores for exact int4/int8 per channel, CUDA-core GEMV for groups < 128) */
    setenv("G3_CUDA_QGEMV", "0", 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 1), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_Q8_0, 45, 4096, "bf16", 1, 1), 0);
    setenv("G3_CUDA_QGEMV", "2", 1); /* up to 2 rows */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 2), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 3), 1);
    unsetenv("G3_CUDA_QGEMV");
    /* defaults: dp4a up to 2 rows, then the int8 tensor cores (tc_q8.cu; tc_q8g.cu for the GGUF groups of 16 / 32);
     * $G3_CUDA_TQMIN=9: dp4a up to 4 rows for per-channel int8 (tc_gemv.cu at 5..8), up to 8 for int4;
     * $G3_CUDA_TQGMIN=9 likewise dp4a up to 8 for the GGUF groups; tensor cores beyond */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 2), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 3), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 2), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 3), 1);
    setenv("G3_CUDA_TQMIN", "9", 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 4), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 5), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 8), 3);
    setenv("G3_CUDA_TQMIN", "7", 1); /* per-channel int8: dp4a up to 4 still, tc_gemv.cu at 5-6 */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 4), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 6), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 6), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 7), 1);
    unsetenv("G3_CUDA_TQMIN");
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_Q8_0, 45, 4096, "bf16", 1, 2), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_Q8_0, 45, 4096, "bf16", 1, 3), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_Q6_K, 45, 4096, "bf16", 1, 2), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_Q6_K, 45, 4096, "bf16", 1, 8), 1);
    setenv("G3_CUDA_TQGMIN", "9", 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_Q8_0, 45, 4096, "bf16", 1, 8), 3);
    unsetenv("G3_CUDA_TQGMIN");
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 9), 1);
    /* fp8: the persistent kernel at 1-2 rows (float16 products), tensor cores from 3; with QGEMVP=0 tensor cores */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "fp8", 1, 1), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "fp8", 1, 2), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "fp8", 1, 3), 1);
    setenv("G3_CUDA_QGEMVP", "0", 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "fp8", 1, 1), 1);
    unsetenv("G3_CUDA_QGEMVP");
    /* bf16 weights: the CUDA-core GEMV up to 4 rows, the tensor-core kernel at 5..8 ($G3_CUDA_BF16TC), cuBLAS beyond */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, 1), 0);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, 4), 0);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, 5), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, 8), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, 9), 2);
    setenv("G3_CUDA_BF16TC", "9", 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, 8), 0);
    unsetenv("G3_CUDA_BF16TC");
}

/* The dp4a product with the decode add-norm in its prologue (g3c_qgemv_pn, the batch-1 decode of int8/int4 weights):
 * xo = x + rms(yin) * w1 computed in float32 by every block (each stores its slice), then xn = rms(xo) * w2 quantized
 * and multiplied as in run_qgemv. Checked against the same arithmetic on the host: xo within 1e-6 of max|xo| (only
 * the order of the sums of squares differs), y within 5e-5 of max|y| of W_deq . xh (xh: the q8 or float16 emulation
 * of the host's xn) plus what the activations near a float16 rounding midpoint can move it (below), and the zero
 * buffer cleared. */
static int pn_pass; /* test_qgemv_pn's pass, in the printed lines */
static void run_qgemv_pn(uint32_t src_type, const char *quant, int n, int k, int m, int geglu) {
    const size_t rb = src_type == G3_DTYPE_F32 ? sizeof(float) * (size_t)k : g3_row_bytes(src_type, k);
    const size_t mk = (size_t)m * k, outw = geglu ? (size_t)n / 2 : (size_t)n;
    uint8_t *raw = malloc(rb * n);
    float *x = malloc(sizeof(float) * mk), *yin = malloc(sizeof(float) * mk), *w1 = malloc(sizeof(float) * k);
    float *w2 = malloc(sizeof(float) * k), *xo = malloc(sizeof(float) * mk), *xr = malloc(sizeof(float) * mk);
    float *xn = malloc(sizeof(float) * mk), *xh = malloc(sizeof(float) * mk);
    float *y = malloc(sizeof(float) * (size_t)m * outw), *wd = malloc(sizeof(float) * (size_t)n * k);
    const float eps = 1e-6f;
    g3_error err = {0};
    random_rows(src_type, n, k, 0.1f, raw, NULL);
    for (size_t i = 0; i < mk; i++) x[i] = frand() * (i % 97 == 5 ? 20.f : 1.f), yin[i] = frand() * 3.f;
    for (int i = 0; i < k; i++) w1[i] = 1.f + 0.5f * frand(), w2[i] = 1.f + 0.5f * frand();
    int zero_ok = 0;
    if (g3_cuda_test_qgemv_pn(src_type, raw, n, k, quant, geglu, x, yin, w1, w2, eps, m, y, xo, wd, &zero_ok, &err) !=
        G3_OK)
        fail_msg("%s: %s", quant, err.msg);
    double xmax = 0, xerr = 0;
    for (int i = 0; i < m; i++) { /* k_add_norm_dec's arithmetic, sums in double */
        const float *xi = x + (size_t)i * k, *yi = yin + (size_t)i * k;
        double ss = 0, s2 = 0;
        for (int t = 0; t < k; t++) ss += (double)yi[t] * yi[t];
        const float inv = 1.f / sqrtf((float)(ss / k) + eps);
        for (int t = 0; t < k; t++) {
            xr[(size_t)i * k + t] = xi[t] + yi[t] * inv * w1[t];
            s2 += (double)xr[(size_t)i * k + t] * xr[(size_t)i * k + t];
        }
        const float inv2 = 1.f / sqrtf((float)(s2 / k) + eps);
        for (int t = 0; t < k; t++) xn[(size_t)i * k + t] = xr[(size_t)i * k + t] * inv2 * w2[t];
    }
    for (size_t i = 0; i < mk; i++) {
        xmax = fmax(xmax, fabs(xr[i]));
        xerr = fmax(xerr, isnan(xo[i]) ? INFINITY : fabs(xo[i] - xr[i]));
    }
    double dq;
    const int i8h = strcmp(quant, "fp8") && g3_cuda_test_qp_f16(src_type, n, k, quant, m, geglu, 1) == 1;
    const int f16 = !strcmp(quant, "fp8") || i8h, lo = m <= lo_rows_for(src_type, quant);
    /* The reference quantizes the host's xn, the kernel its own, which differs in the last bits (the sums of squares
     * in another order): a value x / amax within that difference of a float16 rounding midpoint can round the other
     * way, by one float16 step of its block. Such values are found here (within 1e-6 relative of a midpoint, ~8 ulp),
     * and each output is allowed twice what they can move it: sum of step * amax * |w| over them (a GeGLU output gelu(g)
     * u by 1.13 |u| dg + |g| du), on top of 5e-5; where none lies that close, 5e-5 alone. (H200 session 32: two seeds
     * in six, and the data of session 31's test order, gave 5.9e-5 and 6.7e-5 on float16 products; 1e-7..3e-5
     * elsewhere.) The q8 paths keep 5e-5: without the residual plane their steps are 16x coarser, so flips are 16x
     * rarer (none seen over seeds 1-8); with it 16x finer, so a flip moves y 16x less. */
    double ymax = 1e-30, flip = 0;
    int n_near = 0;
    for (size_t i = 0; i < (size_t)m * outw; i++) ymax = fmax(ymax, fabs(y[i]));
    if (f16) {
        double *dv = calloc(mk, sizeof(double)); /* per activation: how far a flip moves it (0: cannot flip) */
        for (int i = 0; i < m; i++)
            for (int b = 0; b < k / 32; b++) {
                const float *v = xn + (size_t)i * k + 32 * b;
                float amax;
                const float inv = h16_block(v, &amax);
                for (int e = 0; e < 32; e++) {
                    volatile float pv = v[e] * inv;
                    const double p = pv, h = f16_rn(p);
                    int ex;
                    frexp(fmax(fmin(fabs(p), fabs(h)), 0x1p-14), &ex);
                    const double sp = ldexp(1.0, ex - 11); /* the float16 step between h and p's side of it */
                    if (sp / 2 - fabs(p - h) <= 1e-6 * fabs(p)) dv[(size_t)i * k + 32 * b + e] = sp * amax, n_near++;
                }
            }
        for (int i = 0; i < m && n_near; i++)
            for (int j = 0; j < (int)outw; j++) {
                double d[2] = {0, 0}, pr[2] = {0, 0};
                for (int h = 0; h < (geglu ? 2 : 1); h++) {
                    const float *wr = wd + (size_t)(geglu ? 2 * j + h : j) * k;
                    for (int t = 0; t < k; t++) {
                        d[h] += dv[(size_t)i * k + t] * fabs(wr[t]);
                        pr[h] += (double)wr[t] * xn[(size_t)i * k + t];
                    }
                }
                flip = fmax(flip, geglu ? 1.13 * fabs(pr[1]) * d[0] + fabs(pr[0]) * d[1] : d[0]);
            }
        free(dv);
    }
    const double tol = 5e-5 + 2.0 * flip / ymax;
    if (f16) {
        double *yr = malloc(sizeof(double) * (size_t)m * outw);
        f16_emulate(wd, n, k, xn, m, geglu, yr, i8h);
        dq = rel_err(y, yr, (size_t)m * outw);
        free(yr);
    } else {
        q8_emulate(xn, m, k, lo, xh); /* by default: int8 weights, 1-2 rows */
        dq = check_mm(wd, n, k, xh, m, y, geglu);
    }
    printf("  qgemv_pn pass %d %-4s type %2u n=%-4d k=%-5d m=%d geglu=%d: xo err %.2e of max, y rel err vs W.xh %.2e "
           "(allowed %.1e; %d activations near a float16 midpoint), zero %d\n",
           pn_pass, quant, src_type, n, k, m, geglu, xerr / xmax, dq, tol, n_near, zero_ok);
    if (!(xerr <= 1e-6 * xmax)) fail_msg("%s m=%d: residual out differs by %g (max %g)", quant, m, xerr, xmax);
    if (!(dq <= tol))
        fail_msg("%s m=%d: product error vs the emulated quantization of the host's norm %g > %g", quant, m, dq, tol);
    assert_true(zero_ok);
    free(raw), free(x), free(yin), free(w1), free(w2), free(xo), free(xr), free(xn), free(xh), free(y), free(wd);
}

/* Which one-row products take the shared-memory ring (qgemv_p.cu): by default per-channel int8 matrices in rows (or
 * K-slices) of >= 4096 values, with or without the add-norm prologue, at 1-2 rows (the residual plane);
 * $G3_CUDA_QPRING 0 / 1 / 2 and $G3_CUDA_QPRINGMIN (MB) override. A device without the ring's 226 KB of shared memory
 * a block takes it nowhere. */
static void test_qgemv_ring_policy(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_QGEMVP"), unsetenv("G3_CUDA_QPKS"), unsetenv("G3_CUDA_QPRINGMIN");
    unsetenv("G3_CUDA_Q8F16"), unsetenv("G3_CUDA_QPD"), unsetenv("G3_CUDA_QPNW");
    setenv("G3_CUDA_QPRING", "2", 1);
    const int dev = g3_cuda_test_qp_ring(G3_DTYPE_F32, 45, 5376, "int8", 1, 0, 1); /* the device has the ring */
    unsetenv("G3_CUDA_QPRING");
    /* 27B down (5376 x 21504 in slices of 5376), gate/up (43008 x 5376, GeGLU), o (5376 x 4096); 4B gate/up (20480 x
     * 2560), down (2560 x 10240: slices of 5120 where the SMs divide by 2, else whole rows) */
    const int down = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 21504, "int8", 1, 0, 0);
    const int gu = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 0);
    const int gu2 = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int8", 2, 1, 0);
    const int gu_pn = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 1);
    const int o27 = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 4096, "int8", 1, 0, 0);
    const int gu4b = g3_cuda_test_qp_ring(G3_DTYPE_F32, 20480, 2560, "int8", 1, 1, 0);
    const int down4b = g3_cuda_test_qp_ring(G3_DTYPE_F32, 2560, 10240, "int8", 1, 0, 0);
    /* int4 in groups of 128 (no residual plane): the products without the add-norm prologue; not in groups of 32 */
    const int down4 = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 21504, "int4", 1, 0, 0);
    const int o4 = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 4096, "int4", 2, 0, 0);
    const int gu4_pn = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int4", 1, 1, 1);
    const int q4_0 = g3_cuda_test_qp_ring(G3_DTYPE_Q4_0, 5376, 21504, "bf16", 1, 0, 0);
    const int q8_0 = g3_cuda_test_qp_ring(G3_DTYPE_Q8_0, 8192, 8192, "bf16", 1, 0, 0); /* groups of 32 */
    /* fp8 (per channel, no residual plane) as per-channel int8: 27B down and gate/up with its prologue, not 4B
     * gate/up */
    const int f8down = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 21504, "fp8", 1, 0, 0);
    const int f8gu = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "fp8", 2, 1, 1);
    const int f8gu4b = g3_cuda_test_qp_ring(G3_DTYPE_F32, 20480, 2560, "fp8", 1, 1, 0);
    /* heads (262144 rows): 27B (5376) takes it, 4B (2560) not */
    const int head27 = g3_cuda_test_qp_ring(G3_DTYPE_F32, 262144, 5376, "int8", 1, 0, 0);
    const int head4 = g3_cuda_test_qp_ring(G3_DTYPE_F32, 262144, 2560, "int8", 1, 0, 0);
    setenv("G3_CUDA_Q8LO", "0", 1); /* no residual plane: no ring variant */
    const int nolo = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 21504, "int8", 1, 0, 0);
    unsetenv("G3_CUDA_Q8LO");
    setenv("G3_CUDA_QPRINGMIN", "64", 1);
    const int min_o = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 4096, "int8", 1, 0, 0);      /* 22 MB */
    const int min_gu = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 1);    /* 231 MB */
    unsetenv("G3_CUDA_QPRINGMIN");
    setenv("G3_CUDA_QPRING", "0", 1);
    const int off = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 21504, "int8", 1, 0, 0);
    setenv("G3_CUDA_QPRING", "1", 1);
    const int one4_nolo = g3_cuda_test_qp_ring(G3_DTYPE_F32, 45, 5376, "int4", 1, 0, 0); /* no residual plane */
    setenv("G3_CUDA_Q4LO", "2", 1);
    const int one4 = g3_cuda_test_qp_ring(G3_DTYPE_F32, 45, 5376, "int4", 1, 0, 0);
    unsetenv("G3_CUDA_Q4LO");
    const int one_pn = g3_cuda_test_qp_ring(G3_DTYPE_F32, 45, 5376, "int8", 1, 0, 1);
    unsetenv("G3_CUDA_QPRING");
    printf("  ring: device %d; default: 27B down %d, gate/up %d (2 rows %d, prologue %d), o %d; 4B gate/up %d, down %d; "
           "Q8_0 %d, heads 27B %d / 4B %d, no residual plane %d; >= 64 MB: o %d, gate/up %d; =0: %d; =1: "
           "int4 %d (without its residual plane %d), prologue %d\n",
           dev, down, gu, gu2, gu_pn, o27, gu4b, down4b, q8_0, head27, head4, nolo, min_o, min_gu, off, one4,
           one4_nolo, one_pn);
    assert_true(dev == 0 || dev == 1);
    assert_int_equal(down, dev), assert_int_equal(gu, dev), assert_int_equal(gu2, dev), assert_int_equal(gu_pn, dev);
    assert_int_equal(o27, dev), assert_int_equal(gu4b, 0), assert_int_equal(down4b, dev);
    assert_int_equal(q8_0, 0), assert_int_equal(head27, dev), assert_int_equal(head4, 0);
    printf("  ring, int4: 27B down %d, o (2 rows) %d, gate/up (prologue) %d; Q4_0 %d\n", down4, o4, gu4_pn, q4_0);
    assert_int_equal(down4, dev), assert_int_equal(o4, dev), assert_int_equal(gu4_pn, 0), assert_int_equal(q4_0, 0);
    printf("  ring, fp8: 27B down %d, gate/up (2 rows, prologue) %d, 4B gate/up %d\n", f8down, f8gu, f8gu4b);
    assert_int_equal(f8down, dev), assert_int_equal(f8gu, dev), assert_int_equal(f8gu4b, 0);
    /* the ring's depth ($G3_CUDA_QPD): 4 steps fit beside the 27B o product's activations, and beside the gate/up
     * product's prologue only with its norm weights read from global memory ($G3_CUDA_QPNW=1); 5 fit neither */
    setenv("G3_CUDA_QPD", "4", 1);
    const int d4_o = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 4096, "int8", 1, 0, 0);
    const int d4_pn = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 1);
    setenv("G3_CUDA_QPNW", "1", 1);
    const int d4_pnw = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 1);
    setenv("G3_CUDA_QPD", "5", 1);
    const int d5_o = g3_cuda_test_qp_ring(G3_DTYPE_F32, 5376, 4096, "int8", 1, 0, 0);
    const int d5_pnw = g3_cuda_test_qp_ring(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 1);
    unsetenv("G3_CUDA_QPD"), unsetenv("G3_CUDA_QPNW");
    printf("  ring of 4 steps: o %d, gate/up prologue %d (norm weights from global memory %d); of 5: o %d, %d\n", d4_o,
           d4_pn, d4_pnw, d5_o, d5_pnw);
    assert_int_equal(d4_o, dev), assert_int_equal(d4_pn, 0), assert_int_equal(d4_pnw, dev);
    assert_int_equal(d5_o, 0), assert_int_equal(d5_pnw, 0);
    /* float16 products ($G3_CUDA_Q8F16): fp8 always; per-channel int8 by default where rows (or K-slices) are shorter
     * than 4096 (no ring): 4B gate/up and qkv (2560), 1B (1152); not the 27B products, the 4B down product (slices of
     * 5120 on 132 SMs) or int8 in groups of 32 (Q8_0); 1: every per-channel int8 product, 0: none */
    const int h_f8 = g3_cuda_test_qp_f16(G3_DTYPE_F32, 5376, 21504, "fp8", 1, 0, 0);
    const int h_27 = g3_cuda_test_qp_f16(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 1);
    const int h_4gu = g3_cuda_test_qp_f16(G3_DTYPE_F32, 20480, 2560, "int8", 1, 1, 1);
    const int h_4dn = g3_cuda_test_qp_f16(G3_DTYPE_F32, 2560, 10240, "int8", 2, 0, 0);
    const int h_1b = g3_cuda_test_qp_f16(G3_DTYPE_F32, 2048, 1152, "int8", 2, 0, 1);
    const int h_q80 = g3_cuda_test_qp_f16(G3_DTYPE_Q8_0, 2048, 1152, "bf16", 1, 0, 0);
    const int h_3 = g3_cuda_test_qp_f16(G3_DTYPE_F32, 2048, 1152, "int8", 3, 0, 0); /* not the one-row kernel */
    setenv("G3_CUDA_Q8F16", "1", 1);
    const int h_27on = g3_cuda_test_qp_f16(G3_DTYPE_F32, 43008, 5376, "int8", 1, 1, 1);
    setenv("G3_CUDA_Q8F16", "0", 1);
    const int h_4off = g3_cuda_test_qp_f16(G3_DTYPE_F32, 20480, 2560, "int8", 1, 1, 1);
    unsetenv("G3_CUDA_Q8F16");
    printf("  float16 products: fp8 %d; int8 27B gate/up %d, 4B gate/up %d, 4B down %d, 1B %d, Q8_0 %d, 3 rows %d; "
           "=1: 27B %d; =0: 4B %d\n", h_f8, h_27, h_4gu, h_4dn, h_1b, h_q80, h_3, h_27on, h_4off);
    assert_int_equal(h_f8, 1), assert_int_equal(h_27, 0), assert_int_equal(h_4gu, 1), assert_int_equal(h_1b, 1);
    assert_int_equal(h_4dn, 0); /* 10240 in 2 slices of 5120, or whole: >= 4096 either way */
    assert_int_equal(h_q80, 0), assert_int_equal(h_3, 0), assert_int_equal(h_27on, 1), assert_int_equal(h_4off, 0);
    assert_int_equal(nolo, 0), assert_int_equal(min_o, 0), assert_int_equal(min_gu, dev), assert_int_equal(off, 0);
    assert_int_equal(one4, dev), assert_int_equal(one4_nolo, dev), assert_int_equal(one_pn, 0);
}

/* Matrices from GGUF Q4_K, Q4_0 and Q8_0 read the file's own scale codes at 1-2 rows (g3_dmat.kc, kd: Q4_K 2.5 bytes a
 * group of 32 instead of the float s and z's 8, Q4_0 / Q8_0 the fp16 d). The scales they give are s and z bit for
 * bit, so each product must equal the same kernel's on s and z ($G3_CUDA_Q4KC=2): with and without GeGLU and the
 * add-norm prologue (its shared memory: k <= 5376), 1 and 2 rows, k = 2816, 5376, 21504 (11, 21, 84 super-blocks of
 * 256), n = 45 (a partial row group). Bit for bit with GeGLU (whole rows a warp); without it the outputs are partial
 * sums added atomically in any order, so within 1e-6 of max|y| there. A code read from the wrong place moves outputs
 * by ~1e-2 of max|y| or more. The policy: the three types at 1-2 rows (int4 without the activations' residual plane,
 * Q8_0 with it, as by default), not 3 rows (another kernel), not Q4_K with the residual plane ($G3_CUDA_Q4LO=2), nor
 * Q8_0 without ($G3_CUDA_Q8LO=0), not with $G3_CUDA_Q4KC=0 or 2. */
static double fdiff(const float *a, const float *b, size_t n) { /* max |a - b| / max |b| */
    double mx = 0, d = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i])), d = fmax(d, isfinite(a[i]) ? fabs(a[i] - b[i]) : INFINITY);
    return mx > 0 ? d / mx : 1.0;
}
static void test_scale_codes(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_Q4KC"), unsetenv("G3_CUDA_QGEMVP");
    unsetenv("G3_CUDA_QGEMV");
    const int p1 = g3_cuda_test_qp_kc(G3_DTYPE_Q4_K, 45, 2816, 1, 0, 0), p2 = g3_cuda_test_qp_kc(G3_DTYPE_Q4_K, 46, 2816, 2, 1, 1);
    const int p40 = g3_cuda_test_qp_kc(G3_DTYPE_Q4_0, 45, 2816, 1, 0, 0), p80 = g3_cuda_test_qp_kc(G3_DTYPE_Q8_0, 46, 2816, 2, 1, 1);
    const int p3 = g3_cuda_test_qp_kc(G3_DTYPE_Q4_K, 45, 2816, 3, 0, 0), p6 = g3_cuda_test_qp_kc(G3_DTYPE_Q6_K, 45, 2816, 1, 0, 0);
    setenv("G3_CUDA_Q4LO", "2", 1), setenv("G3_CUDA_Q8LO", "0", 1);
    const int plo = g3_cuda_test_qp_kc(G3_DTYPE_Q4_K, 45, 2816, 1, 0, 0), p8lo = g3_cuda_test_qp_kc(G3_DTYPE_Q8_0, 45, 2816, 1, 0, 0);
    unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_Q8LO");
    setenv("G3_CUDA_Q4KC", "2", 1);
    const int pk2 = g3_cuda_test_qp_kc(G3_DTYPE_Q4_K, 45, 2816, 1, 0, 0);
    setenv("G3_CUDA_Q4KC", "0", 1);
    const int pk0 = g3_cuda_test_qp_kc(G3_DTYPE_Q8_0, 45, 2816, 1, 0, 0);
    unsetenv("G3_CUDA_Q4KC");
    printf("  scale codes: Q4_K 1 row %d, 2 rows (GeGLU, prologue) %d; Q4_0 %d, Q8_0 %d; Q4_K 3 rows %d, Q6_K %d; with "
           "int4's residual plane %d, Q8_0 without its %d; G3_CUDA_Q4KC=2 %d, =0 %d\n", p1, p2, p40, p80, p3, p6, plo,
           p8lo, pk2, pk0);
    assert_int_equal(p1, 1), assert_int_equal(p2, 1), assert_int_equal(p40, 1), assert_int_equal(p80, 1);
    assert_int_equal(p3, 0), assert_int_equal(p6, 0), assert_int_equal(plo, 0), assert_int_equal(p8lo, 0);
    assert_int_equal(pk2, 0), assert_int_equal(pk0, 0);
    static const uint32_t types[] = {G3_DTYPE_Q4_K, G3_DTYPE_Q4_0, G3_DTYPE_Q8_0};
    static const int ks[] = {2816, 5376, 21504};
    for (int c = 0; c < 36; c++) {
        const uint32_t t = types[c % 3];
        const int k = ks[(c / 3) % 3], m = 1 + (c / 9) % 2, geglu = c / 18, n = geglu ? 46 : 45, pn = k <= 5376;
        const size_t rb = g3_row_bytes(t, k), mk = (size_t)m * k, outw = geglu ? (size_t)n / 2 : (size_t)n;
        uint8_t *raw = malloc(rb * n);
        float *x = malloc(sizeof(float) * mk), *yin = malloc(sizeof(float) * mk), *w1 = malloc(sizeof(float) * k);
        float *w2 = malloc(sizeof(float) * k), *xo = malloc(sizeof(float) * mk), *wd = malloc(sizeof(float) * (size_t)n * k);
        float *y[2][2];
        random_rows(t, n, k, 0.1f, raw, NULL);
        for (size_t i = 0; i < mk; i++) x[i] = frand() * (i % 97 == 5 ? 20.f : 1.f), yin[i] = frand() * 3.f;
        for (int i = 0; i < k; i++) w1[i] = 1.f + 0.5f * frand(), w2[i] = 1.f + 0.5f * frand();
        g3_error err = {0};
        for (int v = 0; v < 2; v++) { /* v 0: the codes; 1: s and z */
            if (v) setenv("G3_CUDA_Q4KC", "2", 1);
            y[v][0] = calloc((size_t)m * outw, sizeof(float)), y[v][1] = calloc((size_t)m * outw, sizeof(float));
            if (g3_cuda_test_matmul(t, raw, n, k, "bf16", 1, geglu, x, m, y[v][0], wd, &err) != G3_OK)
                fail_msg("%s", err.msg);
            int zero_ok = 0;
            if (pn && g3_cuda_test_qgemv_pn(t, raw, n, k, "bf16", geglu, x, yin, w1, w2, 1e-6f, m, y[v][1], xo, wd,
                                            &zero_ok, &err) != G3_OK)
                fail_msg("%s", err.msg);
            unsetenv("G3_CUDA_Q4KC");
        }
        const size_t cnt = (size_t)m * outw;
        const double d0 = fdiff(y[0][0], y[1][0], cnt), d1 = pn ? fdiff(y[0][1], y[1][1], cnt) : 0;
        printf("  scale codes against s and z: type %2u k=%-5d m=%d geglu=%d: max difference %.2e (plain), %.2e "
               "(prologue%s) of max|y|%s\n", t, k, m, geglu, d0, d1, pn ? "" : ": k too long", geglu ? " (must be 0)" : "");
        if (geglu) {
            assert_memory_equal(y[0][0], y[1][0], sizeof(float) * cnt);
            assert_memory_equal(y[0][1], y[1][1], sizeof(float) * cnt);
        } else {
            assert_true(d0 <= 1e-6 && d1 <= 1e-6);
        }
        free(raw), free(x), free(yin), free(w1), free(w2), free(xo), free(wd);
        free(y[0][0]), free(y[0][1]), free(y[1][0]), free(y[1][1]);
    }
}

static void test_qgemv_pn(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_QGEMVP"), unsetenv("G3_CUDA_QGEMV"), unsetenv("G3_CUDA_QPRING");
    unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_Q8F16"), unsetenv("G3_CUDA_QPRPRE");
    /* 1, 2 rows; passes 2, 3: weights through the ring ($G3_CUDA_QPRING=2; int4 with its residual plane,
     * $G3_CUDA_Q4LO=2, so that the ring variant of the run-time group form is run too); pass 2: the norm weights read from global memory and a ring of 4 steps, pass 3:
     * of 3 (by default 3 at one row, 2 at two) */
    for (int pass = 0; pass < 4; pass++) {
        const int m = 1 + (pass & 1);
        pn_pass = pass;
        if (pass == 2) setenv("G3_CUDA_QPRING", "2", 1), setenv("G3_CUDA_Q4LO", "2", 1);
        if (pass == 2) setenv("G3_CUDA_QPNW", "1", 1), setenv("G3_CUDA_QPD", "4", 1);
        /* the ring's slots filled before the launch wait (by default 2, the rest after the prologue's loads): pass 2
         * all 4 of them (pass 3: the default) */
        if (pass == 2) setenv("G3_CUDA_QPRPRE", "0", 1);
        if (pass == 3) unsetenv("G3_CUDA_QPNW"), unsetenv("G3_CUDA_QPRPRE"), setenv("G3_CUDA_QPD", "3", 1);
        if (pass == 3) /* every quantization item slot run; int4 groups of 128 with their arithmetic at run time */
            setenv("G3_CUDA_QPQS", "0", 1), setenv("G3_CUDA_QPGS", "0", 1);
        run_qgemv_pn(G3_DTYPE_F32, "int4", 45, 5376, m, 0);   /* 27B qkv-like: k = hidden */
        run_qgemv_pn(G3_DTYPE_F32, "int8", 45, 5376, m, 0);   /* per channel */
        run_qgemv_pn(G3_DTYPE_F32, "int4", 9002, 1152, m, 1); /* gate/up: GeGLU, more row groups than warps */
        run_qgemv_pn(G3_DTYPE_F32, "int8", 130, 2560, m, 1);  /* 4B hidden */
        run_qgemv_pn(G3_DTYPE_Q4_0, "bf16", 45, 1152, m, 0);  /* int4 groups of 32 */
        run_qgemv_pn(G3_DTYPE_Q8_0, "bf16", 130, 1152, m, 1); /* int8 groups of 32 */
        run_qgemv_pn(G3_DTYPE_Q4_K, "bf16", 130, 2816, m, 1); /* int4 groups of 32: Q4_K's scale codes (not pass 2) */
        run_qgemv_pn(G3_DTYPE_F32, "fp8", 45, 5376, m, 0);    /* float16 products */
        run_qgemv_pn(G3_DTYPE_F32, "fp8", 130, 2560, m, 1);
    }
    unsetenv("G3_CUDA_QPRING"), unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_QPQS"), unsetenv("G3_CUDA_QPD");
    unsetenv("G3_CUDA_QPGS");
    setenv("G3_CUDA_Q8F16", "0", 1); /* short per-channel int8 rows on dp4a with the residual plane */
    pn_pass = 4;
    for (int m = 1; m <= 2; m++) run_qgemv_pn(G3_DTYPE_F32, "int8", 130, 2560, m, 1);
    /* per-channel int8 on the float16 products everywhere ($G3_CUDA_Q8F16=1; by default only rows < 4096): with and
     * without the ring */
    setenv("G3_CUDA_Q8F16", "1", 1);
    for (int pass = 0; pass < 2; pass++) {
        if (pass) setenv("G3_CUDA_QPRING", "0", 1);
        pn_pass = 5 + pass;
        for (int m = 1; m <= 2; m++) {
            run_qgemv_pn(G3_DTYPE_F32, "int8", 45, 5376, m, 0);
            run_qgemv_pn(G3_DTYPE_F32, "int8", 130, 2560, m, 1);
            run_qgemv(G3_DTYPE_F32, "int8", 45, 5376, m, 0);
            run_qgemv(G3_DTYPE_F32, "int8", 37, 21504, m, 0);
            run_qgemv(G3_DTYPE_F32, "int8", 130, 21504, m, 1);
            run_qgemv(G3_DTYPE_F32, "int8", 9001, 160, m, 0);
        }
    }
    unsetenv("G3_CUDA_Q8F16"), unsetenv("G3_CUDA_QPRING");
}

/* The one-row gate/up and down products in one launch (g3c_qgemv_gd, qgemv_gd.cu's k_qgemv_gd) against the same two
 * products in two launches, whose arithmetic the tests above check against the host: the gate/up phase is the same
 * code on the same inputs, so its GeGLU outputs a are equal bit for bit (a starts as NaNs, so an output the fused
 * kernel failed to write shows); the down phase's K-slices add into y atomically in another order, so y within 2e-5 of
 * max|y| (plus 1e-6 absolute); a down unit that read a slice of a before it was complete reads NaNs and fails the
 * check. Three launches in a row: each must leave its counters at zero (a counter left over would let the next
 * launch's down units start early, or wait out their timeout). The shapes cover the eight pairs of kernels built
 * (int8 on dp4a with the residual plane through the ring, or on float16 products; int4 in groups of 128 with steps of
 * 3 or 2 chunks; fp8 with and without the ring); where a shape does not take the fused kernel the test says so and
 * fails, as the defaults choose it for these shapes. */
static void run_qgemv_gd(const char *quant, int H, int F) {
    const size_t ng = (size_t)2 * F * H, nd = (size_t)H * F;
    float *wg = malloc(sizeof(float) * ng), *wd = malloc(sizeof(float) * nd);
    float *x = malloc(sizeof(float) * H), *yin = malloc(sizeof(float) * H), *w1 = malloc(sizeof(float) * H);
    float *w2 = malloc(sizeof(float) * H), *ar = malloc(sizeof(float) * F), *ao = malloc(sizeof(float) * F);
    float *yr = malloc(sizeof(float) * H), *yo = malloc(sizeof(float) * 3 * H);
    assert_non_null(wg), assert_non_null(wd), assert_non_null(yo);
    for (size_t i = 0; i < ng; i++) wg[i] = frand() * 0.05f;
    for (size_t i = 0; i < nd; i++) wd[i] = frand() * 0.02f;
    for (int i = 0; i < H; i++) {
        x[i] = frand() * (i % 97 == 5 ? 20.f : 1.f), yin[i] = frand() * 3.f;
        w1[i] = 1.f + 0.5f * frand(), w2[i] = 1.f + 0.5f * frand();
    }
    int taken = 0, cnt_ok = 0;
    g3_error err = {0};
    if (g3_cuda_test_qgemv_gd(quant, H, F, wg, wd, x, yin, w1, w2, 1e-6f, 3, ar, yr, ao, yo, &taken, &cnt_ok, &err) !=
        G3_OK)
        fail_msg("qgemv_gd %s H %d F %d: %s", quant, H, F, err.msg);
    if (!taken) fail_msg("qgemv_gd %s H %d F %d: the fused kernel was not taken", quant, H, F);
    size_t adiff = 0;
    for (int i = 0; i < F; i++)
        if (memcmp(&ar[i], &ao[i], sizeof(float)) || isnan(ar[i])) adiff++;
    double ymax = 0, yerr = 0;
    for (int i = 0; i < H; i++) ymax = fmax(ymax, fabs(yr[i]));
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < H; i++) {
            const double d = fabs((double)yo[(size_t)r * H + i] - yr[i]);
            yerr = isnan(d) ? INFINITY : fmax(yerr, d);
        }
    printf("  qgemv_gd %-4s H=%-5d F=%-5d: a %zu of %d differ, y err %.2e of max %.3f (3 launches), counters %s\n", quant,
           H, F, adiff, F, yerr, ymax, cnt_ok ? "clear" : "LEFT SET");
    assert_true(ymax > 0);
    assert_int_equal(adiff, 0);
    assert_true(yerr <= 2e-5 * ymax + 1e-6);
    assert_true(cnt_ok);
    free(wg), free(wd), free(x), free(yin), free(w1), free(w2), free(ar), free(ao), free(yr), free(yo);
}

static void test_qgemv_gd(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_QGEMVP"), unsetenv("G3_CUDA_QGEMV"), unsetenv("G3_CUDA_QPRING");
    unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_Q8F16"), unsetenv("G3_CUDA_QPRPRE"), unsetenv("G3_CUDA_QPKS");
    unsetenv("G3_CUDA_QPD"), unsetenv("G3_CUDA_QPU");
    run_qgemv_gd("int8", 4096, 10240); /* gate/up and down on dp4a with the plane, through the ring (27B's form) */
    run_qgemv_gd("int8", 2560, 10240); /* 4B: gate/up on float16 products, down through the ring */
    run_qgemv_gd("int8", 1152, 6912);  /* 1B: both on float16 products, no ring */
    run_qgemv_gd("int4", 2560, 10240); /* the down product in steps of 3 chunks */
    run_qgemv_gd("int4", 1152, 6912);  /* ... of 2 */
    run_qgemv_gd("fp8", 4096, 10240);  /* both through the ring */
    run_qgemv_gd("fp8", 2560, 10240);  /* the down product's only */
    run_qgemv_gd("fp8", 1152, 6912);   /* no ring */
}

/* int4 in groups of 128 with the half2 (s, z) pairs (built with the weights unless $G3_CUDA_Q4SZ=0, g3_dmat.sz): the
 * one-row products that read them instead of s and z, every variant of k_qgemv_p they take (the ring at steps of 3 and 2
 * chunks, K-slices, GeGLU, the add-norm prologue; 1 and 2 rows) and the fused gate/up + down launch, against the host
 * arithmetic on the dequantized weights (run_qgemv's, run_qgemv_pn's and run_qgemv_gd's checks: the pairs hold the
 * values of s and z, which the quantization rounds to float16). The policy first: the pairs are taken where they were
 * built (by default) and $G3_CUDA_Q4SZ is not 0 at the call, for int4 in groups of 128 without the residual plane
 * only. */
static void test_qgemv_q4sz(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_Q4LO"), unsetenv("G3_CUDA_QGEMVP"), unsetenv("G3_CUDA_QGEMV"), unsetenv("G3_CUDA_QPRING");
    unsetenv("G3_CUDA_QPGS"), unsetenv("G3_CUDA_QPKS"), unsetenv("G3_CUDA_QPD"), unsetenv("G3_CUDA_QPU");
    setenv("G3_CUDA_Q4SZ", "0", 1);
    const int off = g3_cuda_test_qp_sz(45, 5376, 1, 0, 0); /* =0: not built */
    unsetenv("G3_CUDA_Q4SZ"); /* the default: built and read */
    const int p1 = g3_cuda_test_qp_sz(45, 5376, 1, 0, 0), p2 = g3_cuda_test_qp_sz(46, 5376, 2, 1, 1);
    const int pk = g3_cuda_test_qp_sz(37, 21504, 1, 0, 0), p9 = g3_cuda_test_qp_sz(45, 5376, 9, 0, 0);
    const int p64 = g3_cuda_test_qp_sz(45, 5440, 1, 0, 0); /* 5440 = 85 x 64: groups of 64, no pairs */
    setenv("G3_CUDA_Q4LO", "2", 1); /* with int4's residual plane: the kernels of run-time groups */
    const int plo = g3_cuda_test_qp_sz(45, 5376, 1, 0, 0);
    unsetenv("G3_CUDA_Q4LO");
    printf("  int4 half2 pairs: =0 %d; unset: 1 row %d, 2 rows (GeGLU, prologue) %d, K-slices %d, 9 rows %d, groups of "
           "64 %d, with the residual plane %d\n", off, p1, p2, pk, p9, p64, plo);
    assert_int_equal(off, 0), assert_int_equal(p1, 1), assert_int_equal(p2, 1), assert_int_equal(pk, 1);
    assert_int_equal(p9, 0), assert_int_equal(p64, 0), assert_int_equal(plo, 0);
    for (int m = 1; m <= 2; m++) {
        run_qgemv(G3_DTYPE_F32, "int4", 45, 5376, m, 0);  /* the ring, steps of 3 */
        run_qgemv(G3_DTYPE_F32, "int4", 37, 21504, m, 0); /* K-slices */
        run_qgemv(G3_DTYPE_F32, "int4", 45, 4096, m, 0);  /* steps of 2 at one row */
        run_qgemv(G3_DTYPE_F32, "int4", 9002, 1152, m, 1);
        run_qgemv_pn(G3_DTYPE_F32, "int4", 45, 5376, m, 0);
        run_qgemv_pn(G3_DTYPE_F32, "int4", 9002, 1152, m, 1);
    }
    setenv("G3_CUDA_QPRING", "0", 1); /* the register double buffer */
    run_qgemv(G3_DTYPE_F32, "int4", 37, 21504, 1, 0);
    setenv("G3_CUDA_QPRING", "2", 1); /* the ring with the prologue too */
    run_qgemv_pn(G3_DTYPE_F32, "int4", 45, 5376, 1, 0);
    unsetenv("G3_CUDA_QPRING");
    run_qgemv_gd("int4", 2560, 10240); /* the fused pairs: down in steps of 3 */
    run_qgemv_gd("int4", 1152, 6912);  /* ... of 2 */
    setenv("G3_CUDA_Q4SZ", "0", 1); /* the float s and z again, which the default no longer reads at 1-2 rows */
    for (int m = 1; m <= 2; m++) {
        run_qgemv(G3_DTYPE_F32, "int4", 45, 5376, m, 0);
        run_qgemv(G3_DTYPE_F32, "int4", 37, 21504, m, 0);
        run_qgemv_pn(G3_DTYPE_F32, "int4", 9002, 1152, m, 1);
    }
    unsetenv("G3_CUDA_Q4SZ");
}

/* bf16 weights on every CUDA-core GEMV variant ($G3_CUDA_GEMVPF): exact float32 arithmetic as the first GEMV (same
 * order within a chunk; the persistent one adds partial sums of a row atomically, in any order), so the same 2e-5
 * of max|y| as the exact paths (tol_for). */
static void test_gemv_pipelined(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_GEMVPF"), unsetenv("G3_CUDA_GEMVPRE"); /* a failed test may have left them */
    setenv("G3_CUDA_BF16TC", "9", 1); /* the GEMV at every row count here (default: tensor cores from 5 rows) */
    const int ms[] = {1, 2, 3, 8};
    /* pipelined, persistent, the first GEMV (defaults: 0 at 1-2 rows, 1 at 3-4) with 1 (default), 0 and 2 of its
     * first chunks loaded before the launch wait ($G3_CUDA_GEMVPRE) */
    static const char *modes[] = {"1", "2", "0", "0", "0"}, *pre[] = {"1", "1", "1", "0", "2"};
    for (int mi = 0; mi < 5; mi++) {
        setenv("G3_CUDA_GEMVPF", modes[mi], 1);
        setenv("G3_CUDA_GEMVPRE", pre[mi], 1);
        printf("  G3_CUDA_GEMVPF=%s G3_CUDA_GEMVPRE=%s\n", modes[mi], pre[mi]);
        for (size_t i = 0; i < 4; i++) {
            assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, ms[i]), 0);
            run_mm("bf16", 45, 5376, ms[i], 1, 0, 3.0e-4, 2e-5);
            run_mm("bf16", 37, 21504, ms[i], 1, 0, 3.0e-4, 2e-5);
            run_mm("bf16", 45, 4096, ms[i], 1, 0, 3.0e-4, 2e-5);
        }
        run_mm("bf16", 2, 8, 1, 1, 0, 3.0e-4, 2e-5);      /* fewer chunks than lanes */
        run_mm("bf16", 130, 512, 1, 1, 1, 3.0e-4, 2e-5);  /* GeGLU fused */
        run_mm("bf16", 130, 512, 2, 1, 1, 3.0e-4, 2e-5);
        /* more row groups than warps of the persistent grid (4224 on the H200): several per warp; odd n */
        run_mm("bf16", 9001, 136, 1, 1, 0, 3.0e-4, 2e-5);
        run_mm("bf16", 9001, 264, 3, 1, 0, 3.0e-4, 2e-5);
        run_mm("bf16", 9002, 128, 2, 1, 1, 3.0e-4, 2e-5);
    }
    unsetenv("G3_CUDA_GEMVPF"), unsetenv("G3_CUDA_GEMVPRE"), unsetenv("G3_CUDA_BF16TC");
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef G3_HAVE_CUDA
        cmocka_unit_test_setup(test_matmul_formats, frand_restart),
        cmocka_unit_test_setup(test_matmul_long_rows, frand_restart),
        cmocka_unit_test_setup(test_gguf_types, frand_restart),
        cmocka_unit_test_setup(test_matmul_staged, frand_restart),
        cmocka_unit_test_setup(test_matmul_tqg, frand_restart),
        cmocka_unit_test_setup(test_matmul_tq_small, frand_restart),
        cmocka_unit_test_setup(test_matmul_q4r, frand_restart),
        cmocka_unit_test_setup(test_matmul_wgmma, frand_restart),
        cmocka_unit_test_setup(test_matmul_wgmma_fp8, frand_restart),
        cmocka_unit_test_setup(test_matmul_wg_geglu, frand_restart),
        cmocka_unit_test_setup(test_matmul_wg4, frand_restart),
        cmocka_unit_test_setup(test_matmul_wgb, frand_restart),
        cmocka_unit_test_setup(test_matmul_big_decode, frand_restart),
        cmocka_unit_test_setup(test_qgemv, frand_restart),
        cmocka_unit_test_setup(test_qgemv_ring_policy, frand_restart),
        cmocka_unit_test_setup(test_qgemv_pn, frand_restart),
        cmocka_unit_test_setup(test_qgemv_gd, frand_restart),
        cmocka_unit_test_setup(test_qgemv_q4sz, frand_restart),
        cmocka_unit_test_setup(test_scale_codes, frand_restart),
        cmocka_unit_test_setup(test_gemv_pipelined, frand_restart),
#else
        cmocka_unit_test(tu_skip_no_cuda),
#endif
    };
#ifdef G3_HAVE_CUDA
    test_filter_from_env();
#endif
    return cmocka_run_group_tests(tests, NULL, NULL);
}
