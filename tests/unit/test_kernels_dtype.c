/* Tensor types: info table and sizes, bit layouts of the K-quants against an independent decoding written the
 * way ggml documents it, quantize->dequantize error bounds on random data, and the tiny-gqa fixture's Q8_0 and
 * BF16 GGUF tensors against its F32 file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "format/gguf.h"
#include "model/dtype.h"
#include "testutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rng_uniform(void) { return (float)((rng_u32() >> 8) + 0.5) / 16777216.0f; }
static float rng_normal(void) {
    float u = rng_uniform(), v = rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static void test_info_and_sizes(void **state) {
    (void)state;
    struct { uint32_t t; int block; size_t bytes; int q; } want[] = {
        {G3_DTYPE_F32, 1, 4, 0},      {G3_DTYPE_F16, 1, 2, 0},      {G3_DTYPE_BF16, 1, 2, 0},
        {G3_DTYPE_Q8_0, 32, 34, 1},   {G3_DTYPE_Q4_0, 32, 18, 1},   {G3_DTYPE_Q4_K, 256, 144, 1},
        {G3_DTYPE_Q6_K, 256, 210, 1}, {G3_DTYPE_Q4_1, 32, 20, 1},   {G3_DTYPE_Q5_0, 32, 22, 1},
        {G3_DTYPE_Q5_1, 32, 24, 1},   {G3_DTYPE_Q5_K, 256, 176, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const g3_dtype_info *t = g3_dtype_get(want[i].t);
        assert_non_null(t);
        assert_int_equal(t->block, want[i].block);
        assert_int_equal(t->block_bytes, want[i].bytes);
        assert_int_equal(t->quantized, want[i].q);
        assert_int_equal(g3_row_bytes(want[i].t, 1024), 1024 / want[i].block * want[i].bytes);
    }
    assert_null(g3_dtype_get(10)); /* Q2_K: not supported */
    assert_null(g3_dtype_get(20)); /* IQ4_NL */
    /* llama.cpp's fallbacks for K-quant rows that 256 does not divide (Gemma 3 1B's 1152) */
    assert_int_equal(g3_dtype_fallback(G3_DTYPE_Q4_K, 1152), G3_DTYPE_Q5_0);
    assert_int_equal(g3_dtype_fallback(G3_DTYPE_Q5_K, 1152), G3_DTYPE_Q5_1);
    assert_int_equal(g3_dtype_fallback(G3_DTYPE_Q6_K, 1152), G3_DTYPE_Q8_0);
    assert_int_equal(g3_dtype_fallback(G3_DTYPE_Q4_K, 6912), G3_DTYPE_Q4_K);
    assert_int_equal(g3_dtype_fallback(G3_DTYPE_Q4_0, 1152), G3_DTYPE_Q4_0);
    assert_null(g3_dtype_get(99));
    assert_int_equal(g3_row_bytes(G3_DTYPE_Q8_0, 48), 0);   /* not a multiple of 32 */
    assert_int_equal(g3_row_bytes(G3_DTYPE_Q4_K, 1152), 0); /* not a multiple of 256 */
    assert_int_equal(g3_row_bytes(G3_DTYPE_Q8_0, 1152), 36 * 34);
    assert_int_equal(g3_row_bytes(G3_DTYPE_F32, 0), 0);
    assert_int_equal(g3_row_bytes(G3_DTYPE_F32, -4), 0);
    assert_int_equal(g3_row_bytes(99, 32), 0);
    assert_int_equal(g3_tensor_bytes(G3_DTYPE_BF16, 1152, 262144), (size_t)1152 * 2 * 262144);
    assert_int_equal(g3_tensor_bytes(G3_DTYPE_F32, 1 << 20, (int64_t)1 << 62), 0); /* overflow */
    assert_int_equal(g3_tensor_bytes(G3_DTYPE_F32, (int64_t)1 << 62, 1), 0);
    assert_int_equal(g3_tensor_bytes(G3_DTYPE_F32, 16, 0), 0);
    g3_error err = {0};
    float x[32] = {0};
    uint8_t out[64];
    assert_int_equal(g3_quantize_row(G3_DTYPE_Q8_0, x, out, 20, &err), G3_ERR_ARG);
    assert_int_equal(g3_quantize_row(77, x, out, 32, &err), G3_ERR_UNSUPPORTED);
    x[5] = NAN;
    assert_int_equal(g3_quantize_row(G3_DTYPE_Q8_0, x, out, 32, &err), G3_ERR_ARG);
    assert_non_null(strstr(err.msg, "index 5"));
}

/* Q4_K / Q5_K decoded the way ggml's reference loops walk them: 64 values at a time from 32 bytes of qs, low
 * nibbles first, with the scale/min pair of sub-blocks is and is+1; Q5_K (qh not NULL) adds 16 where bit u1 = 1 << 2i
 * / u2 = 2 << 2i of qh[l] is set, for the i-th 64 values. */
static void ref_qk(const uint8_t *s, const uint8_t *q, const uint8_t *qh, uint16_t dh, uint16_t mh, float *y) {
    float d = g3_f16_to_f32(dh), dmin = g3_f16_to_f32(mh);
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32, u1 <<= 2, u2 <<= 2) {
        int sc0, m0, sc1, m1;
        if (is < 4) sc0 = s[is] & 63, m0 = s[is + 4] & 63;
        else sc0 = (s[is + 4] & 0xF) | ((s[is - 4] >> 6) << 4), m0 = (s[is + 4] >> 4) | ((s[is] >> 6) << 4);
        int i1 = is + 1;
        if (i1 < 4) sc1 = s[i1] & 63, m1 = s[i1 + 4] & 63;
        else sc1 = (s[i1 + 4] & 0xF) | ((s[i1 - 4] >> 6) << 4), m1 = (s[i1 + 4] >> 4) | ((s[i1] >> 6) << 4);
        for (int l = 0; l < 32; l++) *y++ = d * sc0 * ((q[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) - dmin * m0;
        for (int l = 0; l < 32; l++) *y++ = d * sc1 * ((q[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - dmin * m1;
    }
}

static void ref_q6k(const g3_block_q6_k *b, float *y) {
    float d = g3_f16_to_f32(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            y[l + 0] = d * sc[is + 0] * (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
}

static void test_kquant_layouts(void **state) {
    (void)state;
    for (int rep = 0; rep < 50; rep++) {
        g3_block_q4_k b4;
        uint8_t *p = (uint8_t *)&b4;
        for (size_t i = 0; i < sizeof b4; i++) p[i] = (uint8_t)rng_u32();
        b4.d = g3_f32_to_f16(0.01f * rng_uniform());
        b4.dmin = g3_f32_to_f16(0.01f * rng_uniform());
        float y[256], r[256];
        g3_dequant_row(G3_DTYPE_Q4_K, &b4, y, 256);
        ref_qk(b4.scales, b4.qs, NULL, b4.d, b4.dmin, r);
        for (int i = 0; i < 256; i++) assert_float_equal(y[i], r[i], 1e-6);

        g3_block_q6_k b6;
        p = (uint8_t *)&b6;
        for (size_t i = 0; i < sizeof b6; i++) p[i] = (uint8_t)rng_u32();
        b6.d = g3_f32_to_f16(0.01f * rng_uniform());
        g3_dequant_row(G3_DTYPE_Q6_K, &b6, y, 256);
        ref_q6k(&b6, r);
        for (int i = 0; i < 256; i++) assert_float_equal(y[i], r[i], 1e-6);
    }
    /* Q5_K decoded the way ggml's reference loop walks it: per 64 values, the qh bits u1 = 1 << 2i, u2 = 2 << 2i */
    for (int rep = 0; rep < 50; rep++) {
        g3_block_q5_k b5;
        uint8_t *p = (uint8_t *)&b5;
        for (size_t i = 0; i < sizeof b5; i++) p[i] = (uint8_t)rng_u32();
        b5.d = g3_f32_to_f16(0.01f * rng_uniform());
        b5.dmin = g3_f32_to_f16(0.01f * rng_uniform());
        float y[256], r[256];
        g3_dequant_row(G3_DTYPE_Q5_K, &b5, y, 256);
        ref_qk(b5.scales, b5.qs, b5.qh, b5.d, b5.dmin, r);
        for (int i = 0; i < 256; i++) assert_float_equal(y[i], r[i], 1e-6);
    }
    /* Q5_0 / Q5_1 / Q4_1: bit j of qh is the fifth bit of x[j]; nibbles as Q4_0 */
    {
        g3_block_q5_0 b;
        b.d = g3_f32_to_f16(1.0f);
        uint32_t qh = 0xA5C3F00Fu;
        memcpy(b.qh, &qh, 4);
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        float y[32];
        g3_dequant_row(G3_DTYPE_Q5_0, &b, y, 32);
        for (int j = 0; j < 32; j++) {
            int q = (j < 16 ? j : 15 - (j - 16)) | (int)((qh >> j) & 1) << 4;
            assert_float_equal(y[j], q - 16, 0);
        }
        g3_block_q5_1 b1;
        b1.d = g3_f32_to_f16(0.5f), b1.m = g3_f32_to_f16(-3.0f);
        memcpy(b1.qh, &qh, 4);
        memcpy(b1.qs, b.qs, 16);
        g3_dequant_row(G3_DTYPE_Q5_1, &b1, y, 32);
        for (int j = 0; j < 32; j++) {
            int q = (j < 16 ? j : 15 - (j - 16)) | (int)((qh >> j) & 1) << 4;
            assert_float_equal(y[j], 0.5f * q - 3.0f, 0);
        }
        g3_block_q4_1 b4;
        b4.d = g3_f32_to_f16(2.0f), b4.m = g3_f32_to_f16(1.0f);
        memcpy(b4.qs, b.qs, 16);
        g3_dequant_row(G3_DTYPE_Q4_1, &b4, y, 32);
        for (int j = 0; j < 32; j++) assert_float_equal(y[j], 2.0f * (j < 16 ? j : 15 - (j - 16)) + 1.0f, 0);
    }
    /* Q4_0 layout: low nibbles are x[0..15], high nibbles x[16..31] */
    g3_block_q4_0 b0;
    b0.d = g3_f32_to_f16(1.0f);
    for (int j = 0; j < 16; j++) b0.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    g3_dequant_row(G3_DTYPE_Q4_0, &b0, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_float_equal(y[j], j - 8, 0);
        assert_float_equal(y[16 + j], 7 - j, 0);
    }
}

static double rel_rmse(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

/* Round-trip error on N(0,1) data, and on data with outliers (1 value in 64 twenty times larger, plus a mean
 * of 0.3, as in real activations and some weights). Expected relative RMSE on N(0,1):
 *   Q8_0: step amax/127 with amax ~ 2.1 sigma over 32 values -> rms step/sqrt(12) ~ 0.005
 *   Q4_0: 16 levels over about [-amax, amax]: step ~ 0.27 sigma -> ~0.08 (the scale search buys a little)
 *   Q4_K: 16 levels over [min, max] of 32 values (~4.2 sigma): step ~ 0.28 sigma -> ~0.08, less after the
 *         search, plus the 6-bit quantization of scales and mins
 *   Q6_K: 64 levels over a symmetric range of 16 values (~3.5 sigma): ~0.016
 *   F16/BF16: unit roundoff 2^-11 / 2^-8, uniform within a step -> ~2e-4 / ~1.7e-3
 * Outliers widen the blocks that hold them, about doubling the error. Measured (seeded data): Q8_0 0.0053/0.0115,
 * Q4_0 0.083/0.151, Q4_K 0.072/0.106, Q6_K 0.0165/0.033. Limits sit ~15-25% above, so that a regression in a
 * scale search shows up. */
/* the types added for llama.cpp's fallbacks and _1 / Q5 files, measured: Q4_1 0.070/0.100, Q5_0 0.041/0.086,
 * Q5_1 0.034/0.051, Q5_K 0.036/0.051 */
#define LIM_Q4_1 0.085, 0.12
#define LIM_Q5_0 0.05, 0.10
#define LIM_Q5_1 0.042, 0.062
#define LIM_Q5_K 0.044, 0.062
static void test_roundtrip(void **state) {
    (void)state;
    const int64_t k = 4096;
    float *x = malloc(sizeof(float) * k), *y = malloc(sizeof(float) * k);
    uint8_t *q = malloc(g3_row_bytes(G3_DTYPE_F32, k));
    assert_true(x && y && q);
    struct { uint32_t t; double lim[2]; } cases[] = {
        {G3_DTYPE_Q8_0, {0.0065, 0.014}}, {G3_DTYPE_Q4_0, {0.10, 0.18}}, {G3_DTYPE_Q4_K, {0.085, 0.13}},
        {G3_DTYPE_Q6_K, {0.02, 0.04}},    {G3_DTYPE_F16, {3e-4, 3e-4}},  {G3_DTYPE_BF16, {2.1e-3, 2.1e-3}},
        {G3_DTYPE_F32, {0, 0}},           {G3_DTYPE_Q4_1, {LIM_Q4_1}},   {G3_DTYPE_Q5_0, {LIM_Q5_0}},
        {G3_DTYPE_Q5_1, {LIM_Q5_1}},      {G3_DTYPE_Q5_K, {LIM_Q5_K}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int dist = 0; dist < 2; dist++) {
            for (int64_t i = 0; i < k; i++) {
                x[i] = rng_normal();
                if (dist == 1 && rng_u32() % 64 == 0) x[i] *= 20;
                if (dist == 1) x[i] += 0.3f; /* non-zero mean: exercises Q4_K's min */
            }
            g3_error err = {0};
            assert_int_equal(g3_quantize_row(cases[c].t, x, q, k, &err), G3_OK);
            g3_dequant_row(cases[c].t, q, y, k);
            double e = rel_rmse(y, x, k);
            printf("  %-5s %-9s rel RMSE %.5f\n", g3_dtype_get(cases[c].t)->name, dist ? "outliers" : "normal", e);
            assert_true(e <= cases[c].lim[dist]);
        }
    }
    /* zeros and constant rows quantize exactly */
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int v = 0; v < 2; v++) {
            for (int64_t i = 0; i < 256; i++) x[i] = v ? -0.75f : 0.0f;
            g3_error err = {0};
            assert_int_equal(g3_quantize_row(cases[c].t, x, q, 256, &err), G3_OK);
            g3_dequant_row(cases[c].t, q, y, 256);
            for (int64_t i = 0; i < 256; i++) assert_float_equal(y[i], x[i], 1e-3);
        }
    }
    free(x);
    free(y);
    free(q);
}

/* The fixture's Q8_0 file was written by llama.cpp's converter from the same weights as its F32 file; its BF16
 * file holds the original bf16 weights, so it must decode to the F32 values exactly. */
static void test_fixture_gguf(void **state) {
    (void)state;
    const char *dir = tu_fixture("tiny-gqa");
    if (!dir) {
        printf("  skipped: fixture tiny-gqa not found\n");
        skip();
    }
    char pf[1024], pq[1024], pb[1024];
    snprintf(pf, sizeof pf, "%s/model-f32.gguf", dir);
    snprintf(pq, sizeof pq, "%s/model-q8_0.gguf", dir);
    snprintf(pb, sizeof pb, "%s/model-bf16.gguf", dir);
    g3_gguf gf, gq, gb;
    g3_error err = {0};
    assert_int_equal(g3_gguf_open(&gf, pf, &err), G3_OK);
    assert_int_equal(g3_gguf_open(&gq, pq, &err), G3_OK);
    assert_int_equal(g3_gguf_open(&gb, pb, &err), G3_OK);
    int n_q8 = 0, n_bf16 = 0;
    double worst = 0;
    for (uint64_t t = 0; t < gf.n_tensors; t++) {
        const g3_gguf_tensor *tf = &gf.tensors[t];
        assert_int_equal(tf->type, G3_DTYPE_F32);
        int64_t k = tf->ne[0], rows = 1;
        for (uint32_t d = 1; d < tf->n_dims; d++) rows *= tf->ne[d];
        const float *ref = (const float *)tf->data;
        float *y = malloc(sizeof(float) * (size_t)k);
        const g3_gguf_tensor *others[2] = {g3_gguf_find_tensor(&gq, tf->name), g3_gguf_find_tensor(&gb, tf->name)};
        for (int o = 0; o < 2; o++) {
            const g3_gguf_tensor *tq = others[o];
            assert_non_null(tq);
            assert_int_equal(tq->ne[0], k);
            size_t rb = g3_row_bytes(tq->type, k);
            assert_true(rb > 0);
            assert_int_equal(tq->nbytes, rb * (size_t)rows);
            if (tq->type == G3_DTYPE_Q8_0) n_q8++;
            if (tq->type == G3_DTYPE_BF16) n_bf16++;
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = ref + r * k;
                g3_dequant_row(tq->type, tq->data + (size_t)r * rb, y, k);
                if (tq->type == G3_DTYPE_Q8_0) {
                    /* each value within half a step (d = amax/127) of the original, plus the f16 rounding of d
                     * times |q| <= 127: |d16 - d| * 127 <= d * 127/2048 */
                    for (int64_t b = 0; b < k / 32; b++) {
                        float amax = 0;
                        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xr[b * 32 + j]));
                        for (int j = 0; j < 32; j++) {
                            double e = fabs((double)y[b * 32 + j] - xr[b * 32 + j]);
                            double lim = amax / 127 * (0.5 + 127.0 / 2048) + 1e-7;
                            if (e / (amax + 1e-30) > worst) worst = e / (amax + 1e-30);
                            assert_true(e <= lim);
                        }
                    }
                } else {
                    for (int64_t i = 0; i < k; i++) assert_float_equal(y[i], xr[i], 0);
                }
            }
        }
        free(y);
    }
    printf("  fixture: %d Q8_0 and %d BF16 tensors checked; worst Q8_0 error %.5f of block amax (bound %.5f)\n",
           n_q8, n_bf16, worst, (0.5 + 127.0 / 2048) / 127);
    assert_true(n_q8 >= 6 * 7);   /* every projection of the 6 layers at least */
    assert_true(n_bf16 >= 6 * 7);
    g3_gguf_close(&gf);
    g3_gguf_close(&gq);
    g3_gguf_close(&gb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_and_sizes),
        cmocka_unit_test(test_kquant_layouts),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_fixture_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
