/* CUDA row-wise kernels against double references: the decode add-norm and greedy argmax (decode_norm.cu), and the
 * add-norm, GeGLU, bf16 copy and logit finish at 1 and 512 rows with the prefill flags (kernels.cu). Skipped without
 * CUDA or a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/prefill_api.h"
#include "cuda_testutil.h"

/* ---- decode add-norm and argmax (decode_norm.cu) -------------------------------------------------------------- */
/* Decode add-norm against a double reference: x' = x + rms(sum_j y_j) * w1, xn = rms(x') * w2; the bf16 copies must
 * be the round-to-nearest of the kernel's own xn (hi) and of the remainder (lo), and y must come back zeroed.
 * Tolerance 1e-5 relative to the row's largest value: float32 sums over H <= 10240 values. */
static uint16_t bf16_bits(float f) { /* round to nearest even (finite inputs) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void run_add_norm(int variant, int m, int H, int ny, int split) {
    const size_t n = (size_t)m * H;
    float *y = malloc(sizeof(float) * n * ny), *x = malloc(sizeof(float) * n), *x0 = malloc(sizeof(float) * n);
    float *w1 = malloc(sizeof(float) * H), *w2 = malloc(sizeof(float) * H), *xn = malloc(sizeof(float) * n);
    float *ya = malloc(sizeof(float) * n * ny);
    uint16_t *xh = malloc(sizeof(uint16_t) * 2 * n);
    for (size_t i = 0; i < n * ny; i++) y[i] = frand() * 3;
    for (size_t i = 0; i < n; i++) x0[i] = x[i] = frand() * 10;
    for (int i = 0; i < H; i++) w1[i] = 1 + 0.5f * frand(), w2[i] = 1 + 0.5f * frand();
    g3_error err = {0};
    if (g3_cuda_test_add_norm(variant, m, H, ny, y, x, w1, w2, 1e-6f, split, xn, xh, ya, &err) != G3_OK)
        fail_msg("%s", err.msg);
    double ex = 0, exn = 0;
    size_t bad_h = 0, nonzero = 0;
    for (int r = 0; r < m; r++) {
        double ss = 0, s2 = 0, mx = 1e-30, mxn = 1e-30;
        double *v = malloc(sizeof(double) * H), *xr = malloc(sizeof(double) * H);
        for (int i = 0; i < H; i++) {
            v[i] = 0;
            for (int j = 0; j < ny; j++) v[i] += y[(size_t)j * n + (size_t)r * H + i];
            ss += v[i] * v[i];
        }
        double inv = 1 / sqrt(ss / H + 1e-6);
        for (int i = 0; i < H; i++) xr[i] = x0[(size_t)r * H + i] + v[i] * inv * w1[i], s2 += xr[i] * xr[i];
        double inv2 = 1 / sqrt(s2 / H + 1e-6);
        for (int i = 0; i < H; i++) mx = fmax(mx, fabs(xr[i])), mxn = fmax(mxn, fabs(xr[i] * inv2 * w2[i]));
        for (int i = 0; i < H; i++) {
            size_t k = (size_t)r * H + i;
            double e1 = fabs(x[k] - xr[i]) / mx, e2 = fabs(xn[k] - xr[i] * inv2 * w2[i]) / mxn;
            ex = fmax(ex, isnan(e1) ? INFINITY : e1), exn = fmax(exn, isnan(e2) ? INFINITY : e2);
            uint16_t hi = bf16_bits(xn[k]);
            bad_h += xh[k] != hi;
            if (split) bad_h += xh[n + k] != bf16_bits(xn[k] - bf16_float(hi));
        }
        free(v), free(xr);
    }
    for (size_t i = 0; i < n * ny; i++) nonzero += ya[i] != 0.f;
    printf("  add-norm variant %d m=%-2d H=%-5d ny=%d split=%d: x err %.2e, xn err %.2e, bf16 mismatches %zu, y left "
           "non-zero %zu\n", variant, m, H, ny, split, ex, exn, bad_h, nonzero);
    assert_true(ex < 1e-5 && exn < 1e-5);
    assert_int_equal(bad_h, 0);
    assert_int_equal(nonzero, 0);
    free(y), free(x), free(x0), free(w1), free(w2), free(xn), free(ya), free(xh);
}

static void test_add_norm_decode(void **state) {
    (void)state;
    need_gpu();
    run_add_norm(1, 1, 5376, 1, 1); /* 27B */
    run_add_norm(1, 8, 5376, 2, 1);
    run_add_norm(1, 64, 5376, 1, 0);
    run_add_norm(1, 3, 1152, 1, 1); /* 1B */
    run_add_norm(1, 2, 64, 2, 1);   /* tiny fixtures: most threads idle */
    run_add_norm(1, 5, 8192, 1, 1); /* largest register variant */
    run_add_norm(1, 2, 10240, 1, 1); /* beyond it: falls back to the three-pass kernel */
    run_add_norm(0, 8, 5376, 2, 1); /* the old kernel, same checks */
}

/* Greedy pick: first index of the maximum, against a host scan; planted ties (the maximum repeated later in the row,
 * and in the same float4) and NaNs must not change the pick. */
static void run_argmax(int variant, int m, int V) {
    float *l = malloc(sizeof(float) * (size_t)m * V);
    int32_t *ids = malloc(sizeof(int32_t) * m);
    for (size_t i = 0; i < (size_t)m * V; i++) l[i] = frand() * 30;
    for (int r = 0; r < m; r++) {
        float *lr = l + (size_t)r * V;
        int at = (int)((unsigned)(r * 7919 + 13) % (unsigned)V);
        lr[at] = 40.f + r;                       /* the maximum */
        if (at + 1 < V) lr[at + 1] = 40.f + r;   /* a tie right after it */
        lr[V - 1 - (r % 3)] = r % 2 ? 40.f + r : NAN; /* a late tie or a NaN */
        if (r % 2 == 0 && at == V - 1 - (r % 3)) lr[at] = 40.f + r; /* keep the planted maximum */
    }
    g3_error err = {0};
    if (g3_cuda_test_argmax(variant, l, m, V, ids, &err) != G3_OK) fail_msg("%s", err.msg);
    int bad = 0;
    for (int r = 0; r < m; r++) {
        const float *lr = l + (size_t)r * V;
        int best = 0;
        for (int i = 1; i < V; i++)
            if (lr[i] > lr[best] || (isnan(lr[best]) && !isnan(lr[i]))) best = i;
        bad += ids[r] != best;
    }
    printf("  argmax variant %d m=%d V=%d: %d wrong\n", variant, m, V, bad);
    assert_int_equal(bad, 0);
    free(l), free(ids);
}

static void test_argmax_decode(void **state) {
    (void)state;
    need_gpu();
    run_argmax(1, 1, 262144); /* Gemma 3 vocabulary */
    run_argmax(1, 9, 262144);
    run_argmax(1, 3, 1000);   /* shorter than one pass of the block */
    run_argmax(1, 2, 1001);   /* not a multiple of 4: the old kernel */
    run_argmax(0, 3, 262144);
}

/* ---- the many-row kernels (kernels.cu) ------------------------------------------------------------------------ */
/* Row kernels at 1 and 512 rows (old and many-row variants by row count), with and without $G3_CUDA_ROWK=0, against
 * double references: outputs within 1e-5 relative to the row scale (float32 sums over <= 5376 values err ~1e-6), the
 * bf16 copies exact (hi = bf16(v), lo = bf16(v - hi)), and the product slices zeroed. */
static uint16_t bf16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void check_bf16(const float *ref, const float *xh, size_t n, int split, const char *what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float hi = bf16_f(bf16_rn(ref[i])), lo = bf16_f(bf16_rn(ref[i] - hi));
        if (xh[i] != hi || (split && xh[n + i] != lo)) bad++;
    }
    if (bad) fail_msg("%s: %zu bf16 copies differ from bf16(v) / bf16(v - hi)", what, bad);
}

/* flags (ADD_NORM, GEGLU; m = 512, so the many-row kernels take them unless $G3_CUDA_ROWK=0): KEEP_Y leaves the
 * slices as they were, NO_F32 leaves xn / a unwritten, checked through hi + lo (within 2^-16 relative of v). */
static void run_rows_f(int op, int flags, int m, int n) {
    const int ny = 2, split = 1, on = op == 1 ? n / 2 : n;
    const char *rke = getenv("G3_CUDA_ROWK");
    const int eff = flags && !(rke && !strcmp(rke, "0")) && m >= (op == G3C_TEST_ADD_NORM ? 65 : 16) ? flags : 0;
    const size_t ysz = (size_t)ny * m * n;
    float *x = malloc(sizeof(float) * (size_t)m * n), *x0 = malloc(sizeof(float) * (size_t)m * n);
    float *y = malloc(sizeof(float) * ysz), *y0 = malloc(sizeof(float) * ysz);
    float *w1 = malloc(sizeof(float) * n), *w2 = malloc(sizeof(float) * n);
    float *xn = malloc(sizeof(float) * (size_t)m * on);
    float *xh = malloc(sizeof(float) * 2 * (size_t)m * on), *ref = malloc(sizeof(float) * (size_t)m * on);
    for (size_t i = 0; i < (size_t)m * n; i++) x[i] = x0[i] = frand() * 3;
    for (size_t i = 0; i < ysz; i++) y[i] = y0[i] = frand() * 2;
    for (int i = 0; i < n; i++) w1[i] = 1 + 0.5f * frand(), w2[i] = 1 + 0.5f * frand();
    float cap = 7.f;
    g3_error err = {0};
    if (g3_cuda_test_rows_f(op, flags, m, n, ny, split, x, y, op == G3C_TEST_FINISH ? &cap : w1, w2, xn, xh, &err) !=
        G3_OK)
        fail_msg("%s", err.msg);
    double worst_hl = 0; /* NO_F32: |hi + lo - v| relative */
    size_t nan_xn = 0;
    double worst = 0;
    const size_t sl = (size_t)m * n;
    for (int r = 0; r < m; r++) {
        if (op == G3C_TEST_ADD_NORM) {
            double ss = 0, s2 = 0;
            for (int i = 0; i < n; i++) {
                double v = (double)y0[(size_t)r * n + i] + y0[sl + (size_t)r * n + i];
                ss += v * v;
            }
            double inv = 1 / sqrt(ss / n + 1e-6);
            double *hrow = malloc(sizeof(double) * n);
            for (int i = 0; i < n; i++) {
                double v = (double)y0[(size_t)r * n + i] + y0[sl + (size_t)r * n + i];
                hrow[i] = x0[(size_t)r * n + i] + v * inv * w1[i];
                s2 += hrow[i] * hrow[i];
                worst = fmax(worst, fabs(hrow[i] - x[(size_t)r * n + i]) / fmax(1, fabs(hrow[i])));
            }
            double inv2 = 1 / sqrt(s2 / n + 1e-6);
            for (int i = 0; i < n; i++) {
                const double o = hrow[i] * inv2 * w2[i];
                if (eff & G3C_TEST_NO_F32) {
                    const size_t ii = (size_t)r * n + i;
                    nan_xn += isnan(xn[ii]);
                    worst_hl = fmax(worst_hl, fabs((double)xh[ii] + xh[(size_t)m * n + ii] - o) / fmax(1, fabs(o)));
                    continue;
                }
                ref[(size_t)r * n + i] = xn[(size_t)r * n + i]; /* bf16 copies of what the kernel wrote */
                worst = fmax(worst, fabs(o - xn[(size_t)r * n + i]) / fmax(1, fabs(o)));
            }
            free(hrow);
        } else if (op == G3C_TEST_GEGLU) {
            for (int i = 0; i < on; i++) {
                double g = (double)y0[(size_t)r * n + 2 * i] + y0[sl + (size_t)r * n + 2 * i];
                double u = (double)y0[(size_t)r * n + 2 * i + 1] + y0[sl + (size_t)r * n + 2 * i + 1];
                double a = geglu_ref(g, u);
                if (eff & G3C_TEST_NO_F32) {
                    const size_t ii = (size_t)r * on + i;
                    nan_xn += isnan(xn[ii]);
                    worst_hl = fmax(worst_hl, fabs((double)xh[ii] + xh[(size_t)m * on + ii] - a) / fmax(1, fabs(a)));
                    continue;
                }
                ref[(size_t)r * on + i] = xn[(size_t)r * on + i];
                worst = fmax(worst, fabs(a - xn[(size_t)r * on + i]) / fmax(1, fabs(a)));
            }
        } else if (op == G3C_TEST_TO_BF16) {
            for (int i = 0; i < n; i++) ref[(size_t)r * n + i] = x0[(size_t)r * n + i];
        } else {
            for (int i = 0; i < n; i++) {
                double v = (double)y0[(size_t)r * n + i] + y0[sl + (size_t)r * n + i];
                worst = fmax(worst, fabs(cap * tanh(v / cap) - xn[(size_t)r * n + i]) / cap);
            }
        }
    }
    size_t nz = 0, changed = 0;
    for (size_t i = 0; i < ysz; i++) nz += op != G3C_TEST_TO_BF16 && y[i] != 0.f, changed += y[i] != y0[i];
    static const char *names[] = {"add_norm", "geglu", "to_bf16", "finish_logits"};
    const char *rk = getenv("G3_CUDA_ROWK");
    printf("  %-13s m=%-3d n=%-5d ROWK=%s flags %d (taken %d): max rel err %.2e, hi+lo %.2e, %zu product values left "
           "nonzero, %zu changed\n", names[op], m, n, rk ? rk : "default", flags, eff, worst, worst_hl, nz, changed);
    assert_true(worst < 1e-5);
    if (eff & G3C_TEST_KEEP_Y) assert_int_equal(changed, 0); /* left for the next cuBLAS product to overwrite */
    else assert_int_equal(nz, 0);
    if (eff & G3C_TEST_NO_F32) {
        /* hi + lo keeps ~16 bits: |lo| <= 2^-9 |v|, its own rounding <= 2^-9 |lo| -> 2^-18 |v|, plus float math */
        assert_true(worst_hl < 1e-5);
        assert_int_equal(nan_xn, (size_t)m * on); /* poisoned and never written */
    } else if (op != G3C_TEST_FINISH) {
        check_bf16(ref, xh, (size_t)m * on, split, names[op]);
    }
    free(x), free(x0), free(y), free(y0), free(w1), free(w2), free(xn), free(xh), free(ref);
}
static void run_rows(int op, int m, int n) { run_rows_f(op, 0, m, n); }

static void test_row_kernels(void **state) {
    (void)state;
    need_gpu();
    for (int pass = 0; pass < 2; pass++) {
        if (pass) setenv("G3_CUDA_ROWK", "0", 1);
        const int ms[] = {1, 512};
        for (int i = 0; i < 2; i++) {
            run_rows(G3C_TEST_ADD_NORM, ms[i], 5376);
            run_rows(G3C_TEST_ADD_NORM, ms[i], 1152);
            run_rows(G3C_TEST_GEGLU, ms[i], 2 * 4096);
            run_rows(G3C_TEST_TO_BF16, ms[i], 5376);
            run_rows(G3C_TEST_FINISH, ms[i], 4096);
        }
        run_rows(G3C_TEST_FINISH, 300, 4100); /* many rows: the strided kernel, a partial last round */
        setenv("G3_CUDA_FIN", "1", 1);        /* one float4 a thread at any size */
        run_rows(G3C_TEST_FINISH, 512, 4096);
        unsetenv("G3_CUDA_FIN");
        for (int f = 1; f <= 3; f++) { /* the flags of the prefill forward ($G3_CUDA_NOZERO) */
            run_rows_f(G3C_TEST_ADD_NORM, f, 512, 5376);
            run_rows_f(G3C_TEST_GEGLU, f, 512, 2 * 4096);
        }
    }
    unsetenv("G3_CUDA_ROWK");
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef G3_HAVE_CUDA
        cmocka_unit_test(test_add_norm_decode),
        cmocka_unit_test(test_argmax_decode),
        cmocka_unit_test(test_row_kernels),
#else
        cmocka_unit_test(tu_skip_no_cuda),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
