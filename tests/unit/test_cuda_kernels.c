/* CUDA backend kernels against CPU references written here: matrix products in every resident format and on every
 * path (tensor-core kernels for decode and small batches, CUDA-core GEMV for GGUF small groups, cuBLAS for many
 * rows), long rows that the tensor-core kernels split across warps, rows not a multiple of the 16-row tile, the
 * load-time conversions of GGUF blocks (checked against the portable dequantizer), and QK-norm + RoPE +
 * paged-cache attention with GQA, sliding window and split keys. Skipped with a message where the build has no
 * CUDA or the machine no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/prefill_api.h"
#include "model/dtype.h"

static void need_gpu(void) {
    if (g3_cuda_device_count() == 0) {
        printf("  no CUDA device: skipped\n");
        skip();
    }
}

static uint64_t rs = 88172645463325252ull;
static float frand(void) { /* uniform [-1, 1) */
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* y = x W^T in double from the dequantized weights; returns max |y - ref| / max|ref| */
static double check_mm(const float *wdeq, int n, int k, const float *x, int m, const float *y, int geglu) {
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
                r = 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
            }
            double e = fabs(r - y[(size_t)i * outw + j]);
            if (isnan(e)) e = INFINITY;
            if (fabs(r) > mx) mx = fabs(r);
            if (e > d) d = e;
        }
    return d / mx;
}

static void run_mm(const char *quant, int n, int k, int m, int gemm, int geglu, double tol_w, double tol_y) {
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
static double tol_for(const char *quant, int m, int gemm) {
    if (gemm == 2) return 2e-2;
    if (!strcmp(quant, "bf16") || m <= 8) return 2e-5;
    return 1e-2;
}

static void test_matmul_formats(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_QGEMV", "0", 1); /* the exact paths (q8 activations: test_qgemv) */
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
}

/* long rows (many rounds per tile, split among warps) and a partial last tile */
static void test_matmul_long_rows(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_QGEMV", "0", 1); /* the exact paths (q8 activations: test_qgemv) */
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
}

/* GGUF block types: the resident copy must equal the portable dequantizer's values. */
static void test_gguf_types(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_QGEMV", "0", 1); /* the exact paths (q8 activations: test_qgemv) */
    const uint32_t types[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K, G3_DTYPE_Q6_K, G3_DTYPE_F16, G3_DTYPE_BF16};
    const int n = 24, k = 512;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const int m = pass ? 24 : 3; /* decode (exact paths) and a small batch (bf16 activations) */
            uint32_t t = types[ti];
            size_t rb = g3_row_bytes(t, k);
            assert_true(rb > 0);
            uint8_t *raw = malloc(rb * n);
            float *src = malloc(sizeof(float) * k), *ref = malloc(sizeof(float) * (size_t)n * k);
            float *wd = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)m * k);
            float *y = malloc(sizeof(float) * (size_t)m * n);
            g3_error err = {0};
            for (int r = 0; r < n; r++) {
                for (int i = 0; i < k; i++) src[i] = frand() * (1 + r % 3);
                assert_int_equal(g3_quantize_row(t, src, raw + rb * r, k, &err), G3_OK);
                g3_dequant_row(t, raw + rb * r, ref + (size_t)r * k, k);
            }
            for (int i = 0; i < m * k; i++) x[i] = frand();
            if (g3_cuda_test_matmul(t, raw, n, k, "bf16", 1, 0, x, m, y, wd, &err) != G3_OK) fail_msg("%s", err.msg);
            double d = 0, mx = 0;
            for (size_t i = 0; i < (size_t)n * k; i++) d = fmax(d, fabs(wd[i] - ref[i])), mx = fmax(mx, fabs(ref[i]));
            double dy = check_mm(ref, n, k, x, m, y, 0);
            printf("  type %2u m=%-2d path %d: max|resident - dequant_row| = %.2e (of %.2f), product rel err %.2e\n", t, m,
                   g3_cuda_test_mm_path(t, n, k, "bf16", 1, m), d, mx, dy);
            /* F16 / BF16 become bf16: F16 loses 3 bits; block types are repacked exactly */
            double tol = t == G3_DTYPE_F16 ? mx * 4e-3 : mx * 1e-6;
            assert_true(d <= tol);
            int is_float = t == G3_DTYPE_F16 || t == G3_DTYPE_BF16;
            assert_true(dy <= (t == G3_DTYPE_F16 ? 4e-3 : is_float || m <= 8 ? 2e-5 : 1e-2));
            free(raw), free(src), free(ref), free(wd), free(x), free(y);
        }
    }
}

/* ---- attention ------------------------------------------------------------------------------------------------ */
static void rms_rope(float *v, int D, const float *w, float eps, int pos, const float *inv_freq) {
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)v[i] * v[i];
    float inv = 1.f / sqrtf((float)(ss / D) + eps);
    for (int i = 0; i < D; i++) v[i] = v[i] * inv * w[i];
    for (int i = 0; i < D / 2; i++) {
        float a = (float)pos * inv_freq[i], c = cosf(a), s = sinf(a), x0 = v[i], x1 = v[i + D / 2];
        v[i] = x0 * c - x1 * s, v[i + D / 2] = x1 * c + x0 * s;
    }
}

static void run_attention(int NH, int NKV, int D, int kind, int window, int n_splits, float softcap) {
    const int B = 4, mbps = 8, n_blocks = 16, L = 2, li = 1, n_u = 2;
    const int lens[2] = {13, 7};
    const int m = lens[0] + lens[1], NQKV = (NH + 2 * NKV) * D;
    int32_t pos[20], useq[20], bt[2 * 2 * 8];
    /* interleave rows of the two sequences, each in increasing position order */
    int r = 0, p0 = 0, p1 = 0;
    while (r < m) {
        if (p0 < lens[0]) pos[r] = p0++, useq[r++] = 0;
        if (p1 < lens[1]) pos[r] = p1++, useq[r++] = 1;
    }
    for (int i = 0; i < 2 * 2 * mbps; i++) bt[i] = -1;
    const int phys0[4] = {9, 2, 14, 5}, phys1[2] = {7, 0};
    for (int j = 0; j < 4; j++) bt[(0 * 2 + kind) * mbps + j] = phys0[j];
    for (int j = 0; j < 2; j++) bt[(1 * 2 + kind) * mbps + j] = phys1[j];
    float *qkv = malloc(sizeof(float) * m * NQKV), *o = malloc(sizeof(float) * m * NH * D);
    float qn[256], kn[256], inv_freq[128];
    for (int i = 0; i < m * NQKV; i++) qkv[i] = frand() * 2;
    for (int i = 0; i < D; i++) qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
    for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.f / powf(10000.f, (float)(2 * i) / D) / (kind == 0 ? 8.f : 1.f);
    g3_cuda_attn_test t = {.NH = NH, .NKV = NKV, .D = D, .kind = kind, .window = window, .kv_block = B, .mbps = mbps,
                           .n_blocks = n_blocks, .n_layers_kind = L, .layer_in_kind = li, .n_splits = n_splits,
                           .scale = 1.f / sqrtf(24.f), .softcap = softcap, .eps = 1e-6f, .inv_freq = inv_freq,
                           .q_norm = qn, .k_norm = kn};
    for (int i = 0; i < m * NH * D; i++) o[i] = NAN;
    g3_error err = {0};
    if (g3_cuda_test_attention(&t, qkv, pos, useq, bt, n_u, m, o, &err) != G3_OK) fail_msg("%s", err.msg);
    /* reference */
    float *q = malloc(sizeof(float) * m * NH * D), *k = malloc(sizeof(float) * m * NKV * D);
    float *v = malloc(sizeof(float) * m * NKV * D);
    for (int i = 0; i < m; i++) {
        for (int h = 0; h < NH; h++) {
            memcpy(q + ((size_t)i * NH + h) * D, qkv + (size_t)i * NQKV + h * D, sizeof(float) * D);
            rms_rope(q + ((size_t)i * NH + h) * D, D, qn, 1e-6f, pos[i], inv_freq);
        }
        for (int h = 0; h < NKV; h++) {
            memcpy(k + ((size_t)i * NKV + h) * D, qkv + (size_t)i * NQKV + (NH + h) * D, sizeof(float) * D);
            rms_rope(k + ((size_t)i * NKV + h) * D, D, kn, 1e-6f, pos[i], inv_freq);
            memcpy(v + ((size_t)i * NKV + h) * D, qkv + (size_t)i * NQKV + (NH + NKV + h) * D, sizeof(float) * D);
        }
    }
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int h = 0; h < NH; h++) {
            int kh = h / (NH / NKV);
            double sc[20], mx = -1e300, l = 0;
            for (int j = 0; j < m; j++) {
                sc[j] = -INFINITY;
                if (useq[j] != useq[i] || pos[j] > pos[i]) continue;
                if (kind == 1 && pos[i] - pos[j] >= window) continue;
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)q[((size_t)i * NH + h) * D + d] * k[((size_t)j * NKV + kh) * D + d];
                s *= t.scale;
                if (softcap > 0) s = softcap * tanh(s / softcap);
                sc[j] = s, mx = fmax(mx, s);
            }
            for (int j = 0; j < m; j++) l += sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j < m; j++)
                    if (sc[j] != -INFINITY) acc += exp(sc[j] - mx) / l * v[((size_t)j * NKV + kh) * D + d];
                double e = fabs(acc - o[((size_t)i * NH + h) * D + d]);
                if (isnan(e)) e = INFINITY;
                worst = fmax(worst, e);
            }
        }
    printf("  attention NH=%d NKV=%d D=%d kind=%d window=%d splits=%d softcap=%g: max err %.2e\n", NH, NKV, D, kind,
           window, n_splits, softcap, worst);
    assert_true(worst < 1e-4);
    free(qkv), free(o), free(q), free(k), free(v);
}

static void test_attention(void **state) {
    (void)state;
    need_gpu();
    run_attention(4, 2, 16, 1, 5, 1, 0);
    run_attention(4, 2, 16, 0, 5, 3, 0);
    run_attention(8, 4, 32, 1, 8, 2, 0);
    run_attention(4, 1, 256, 1, 5, 4, 0);
    run_attention(4, 2, 128, 0, 1024, 2, 50.f);
    run_attention(8, 1, 64, 0, 1024, 1, 0);
}

/* ---- decode attention (fused QK-norm + RoPE + cache write + attention) and the decode add-norm ---------------- */
/* Rows r < m of distinct sequences (useq[r] = r, or -1 for a padding row) decode at position lens[r] after a history
 * of lens[r] rows (positions 0..lens[r]-1, cache writes only). The separate kernels and the fused one, each with the
 * second decode kernel (attention_dec.cu) and the round-1 one, are checked against a double reference; every mode
 * must leave the qkv buffer zeroed. Tolerance 1e-4 absolute as in run_attention: outputs are O(1) convex
 * combinations of values in [-2, 2], float32 softmax over <= ~700 keys keeps errors near 1e-6. */
static void run_attention_decode(int NH, int NKV, int D, int kind, int window, int n_splits, float softcap, int B,
                                 int m, const int *lens, int pad_row) {
    const int NQKV = (NH + 2 * NKV) * D;
    int mbps = 1, m_hist = 0, nb = 0;
    for (int r = 0; r < m; r++) {
        int need = lens[r] / B + 1;
        if (need > mbps) mbps = need;
        m_hist += lens[r], nb += need;
    }
    const int n_u = m, n_blocks = (nb + 3) % 7 ? nb + 3 : nb + 4; /* prime to 7: the scramble below is a permutation */
    int32_t *bt = malloc(sizeof(int32_t) * n_u * 2 * mbps), *pos = malloc(sizeof(int32_t) * m);
    int32_t *useq = malloc(sizeof(int32_t) * m), *hpos = malloc(sizeof(int32_t) * (m_hist + 1));
    int32_t *huseq = malloc(sizeof(int32_t) * (m_hist + 1));
    for (int i = 0; i < n_u * 2 * mbps; i++) bt[i] = -1;
    /* physical blocks handed out in a scrambled order: block i of the pool sequence goes to (7 i + 3) mod n_blocks */
    int next = 0;
    for (int r = 0; r < m; r++)
        for (int j = 0; j <= lens[r] / B; j++) bt[(r * 2 + kind) * mbps + j] = (7 * next++ + 3) % n_blocks;
    float *hq = malloc(sizeof(float) * ((size_t)m_hist + 1) * NQKV), *qkv = malloc(sizeof(float) * (size_t)m * NQKV);
    int h = 0;
    for (int r = 0; r < m; r++) /* history rows interleaved across sequences does not matter: cache writes only */
        for (int p = 0; p < lens[r]; p++) hpos[h] = p, huseq[h] = r, h++;
    for (size_t i = 0; i < (size_t)m_hist * NQKV; i++) hq[i] = frand() * 2;
    for (size_t i = 0; i < (size_t)m * NQKV; i++) qkv[i] = frand() * 2;
    for (int r = 0; r < m; r++) pos[r] = lens[r], useq[r] = r == pad_row ? -1 : r;
    if (pad_row >= 0) pos[pad_row] = 0;
    float qn[256], kn[256], inv_freq[128];
    for (int i = 0; i < D; i++) qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
    for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.f / powf(10000.f, (float)(2 * i) / D) / (kind == 0 ? 8.f : 1.f);
    g3_cuda_attn_test t = {.NH = NH, .NKV = NKV, .D = D, .kind = kind, .window = window, .kv_block = B, .mbps = mbps,
                           .n_blocks = n_blocks, .n_layers_kind = 3, .layer_in_kind = 2, .n_splits = n_splits,
                           .scale = 1.f / sqrtf(24.f), .softcap = softcap, .eps = 1e-6f, .inv_freq = inv_freq,
                           .q_norm = qn, .k_norm = kn};
    /* reference: keys of row r are the history rows of its sequence plus its own */
    double *ref = calloc((size_t)m * NH * D, sizeof(double));
    float *qv = malloc(sizeof(float) * D), *kk = malloc(sizeof(float) * ((size_t)m_hist + m) * NKV * D);
    float *vv = malloc(sizeof(float) * ((size_t)m_hist + m) * NKV * D);
    double *sc = malloc(sizeof(double) * (m_hist + m));
    int *kpos = malloc(sizeof(int) * (m_hist + m)), *kseq = malloc(sizeof(int) * (m_hist + m));
    for (int i = 0; i < m_hist + m; i++) {
        const float *src = i < m_hist ? hq + (size_t)i * NQKV : qkv + (size_t)(i - m_hist) * NQKV;
        kpos[i] = i < m_hist ? hpos[i] : pos[i - m_hist];
        kseq[i] = i < m_hist ? huseq[i] : useq[i - m_hist];
        for (int hh = 0; hh < NKV; hh++) {
            memcpy(kk + ((size_t)i * NKV + hh) * D, src + (NH + hh) * D, sizeof(float) * D);
            rms_rope(kk + ((size_t)i * NKV + hh) * D, D, kn, 1e-6f, kpos[i], inv_freq);
            memcpy(vv + ((size_t)i * NKV + hh) * D, src + (NH + NKV + hh) * D, sizeof(float) * D);
        }
    }
    for (int r = 0; r < m; r++) {
        if (useq[r] < 0) continue; /* padding: output 0 */
        for (int hh = 0; hh < NH; hh++) {
            const int kh = hh / (NH / NKV);
            memcpy(qv, qkv + (size_t)r * NQKV + hh * D, sizeof(float) * D);
            rms_rope(qv, D, qn, 1e-6f, pos[r], inv_freq);
            double mx = -1e300, l = 0;
            for (int j = 0; j < m_hist + m; j++) {
                sc[j] = -INFINITY;
                if (kseq[j] != useq[r] || kpos[j] > pos[r]) continue;
                if (kind == 1 && pos[r] - kpos[j] >= window) continue;
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)qv[d] * kk[((size_t)j * NKV + kh) * D + d];
                s *= t.scale;
                if (softcap > 0) s = softcap * tanh(s / softcap);
                sc[j] = s, mx = fmax(mx, s);
            }
            for (int j = 0; j < m_hist + m; j++) l += sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
            for (int j = 0; j < m_hist + m; j++)
                if (sc[j] != -INFINITY)
                    for (int d = 0; d < D; d++)
                        ref[((size_t)r * NH + hh) * D + d] += exp(sc[j] - mx) / l * vv[((size_t)j * NKV + kh) * D + d];
        }
    }
    float *o = malloc(sizeof(float) * (size_t)m * NH * D), *ya = malloc(sizeof(float) * (size_t)m * NQKV);
    /* the hook's bit 0: fused, bit 1: round-1 kernels (else attention_dec.cu) */
    static const int modes[4] = {0, 2, 1, 3};
    static const char *mode_name[4] = {"separate", "separate-r1", "fused", "fused-r1"};
    for (int mi = 0; mi < 4; mi++) {
        const int fused = modes[mi];
        for (size_t i = 0; i < (size_t)m * NH * D; i++) o[i] = NAN;
        for (size_t i = 0; i < (size_t)m * NQKV; i++) ya[i] = NAN;
        g3_error err = {0};
        if (g3_cuda_test_attention_decode(&t, fused, hq, hpos, huseq, m_hist, qkv, pos, useq, m, bt, n_u, o, ya,
                                          &err) != G3_OK)
            fail_msg("%s", err.msg);
        double worst = 0;
        for (size_t i = 0; i < (size_t)m * NH * D; i++) {
            double e = fabs(ref[i] - o[i]);
            if (isnan(e)) e = INFINITY;
            worst = fmax(worst, e);
        }
        size_t nonzero = 0;
        for (size_t i = 0; i < (size_t)m * NQKV; i++) nonzero += ya[i] != 0.f;
        printf("  decode attention %s NH=%d NKV=%d D=%d kind=%d window=%d splits=%d softcap=%g block=%d rows=%d: "
               "max err %.2e, qkv left non-zero %zu\n", mode_name[mi], NH, NKV, D, kind, window,
               n_splits, softcap, B, m, worst, nonzero);
        assert_true(worst < 1e-4);
        assert_int_equal(nonzero, 0);
    }
    free(bt), free(pos), free(useq), free(hpos), free(huseq), free(hq), free(qkv), free(ref), free(qv), free(kk);
    free(vv), free(sc), free(kpos), free(kseq), free(o), free(ya);
}

static void test_attention_decode(void **state) {
    (void)state;
    need_gpu();
    const int one[1] = {600};                               /* 27B shape, one row, ~600 keys over 38 blocks */
    run_attention_decode(32, 16, 128, 0, 1024, 33, 0, 16, 1, one, -1);
    const int eight[8] = {0, 1, 15, 16, 17, 63, 200, 301}; /* block edges, empty history */
    run_attention_decode(8, 4, 128, 1, 37, 5, 50.f, 16, 8, eight, 3);
    run_attention_decode(8, 4, 128, 0, 1024, 64, 0, 8, 8, eight, -1);
    const int three[3] = {5, 130, 257};
    run_attention_decode(4, 1, 256, 0, 1024, 7, 0, 16, 3, three, -1); /* 1B head shape */
    run_attention_decode(4, 2, 16, 1, 5, 3, 0, 4, 3, three, -1);      /* D = 16: RoPE partners in other lanes */
    int many[40];
    for (int i = 0; i < 40; i++) many[i] = (i * 37) % 90;
    run_attention_decode(8, 1, 64, 1, 20, 2, 0, 8, 40, many, 39); /* G = 8, 40 rows */
    /* 27B shape, 40 rows of different sequences (0..297 keys), sliding window 50 < context, softcap */
    int many27[40];
    for (int i = 0; i < 40; i++) many27[i] = (i * 53) % 300;
    run_attention_decode(32, 16, 128, 1, 50, 16, 30.f, 16, 40, many27, 7);
    run_attention_decode(32, 16, 128, 0, 1024, 4, 0, 16, 40, many27, -1);
    run_attention_decode(8, 4, 256, 1, 100, 9, 0, 16, 8, eight, 5); /* 4B head shape, window 100 */
    const int two[2] = {0, 700};                                    /* a row with no history, a long one */
    run_attention_decode(4, 1, 256, 1, 512, 12, 0, 32, 2, two, -1);  /* 1B head shape, window 512 < 701 keys */
}

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
/* 9..64 rows on quantized weights: the staged tensor-core kernel (tc_stage.cu; $G3_CUDA_TCM=2: its cp.async weight
 * variant) and, with $G3_CUDA_TCM=0, the warp kernel it replaces. n = 264: two 256-row block tiles, the second
 * partial; n = 37: odd (scalar atomics), with a down projection's row length. Tolerance 1e-2 of max|y| as for every bf16-activation path (tol_for): activations
 * rounded to bf16 (2^-9 relative) and, for int4 and grouped int8, weights dequantized to bf16 in registers (2^-9);
 * with random signs the sum over k keeps the relative error near 2^-8 (~4e-3 seen in the host emulation). */
static void run_gguf_mm(uint32_t t, int n, int k, int m) {
    size_t rb = g3_row_bytes(t, k);
    assert_true(rb > 0);
    uint8_t *raw = malloc(rb * n);
    float *src = malloc(sizeof(float) * k), *ref = malloc(sizeof(float) * (size_t)n * k);
    float *x = malloc(sizeof(float) * (size_t)m * k), *y = malloc(sizeof(float) * (size_t)m * n);
    g3_error err = {0};
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < k; i++) src[i] = frand() * (1 + r % 3);
        assert_int_equal(g3_quantize_row(t, src, raw + rb * r, k, &err), G3_OK);
        g3_dequant_row(t, raw + rb * r, ref + (size_t)r * k, k);
    }
    for (int i = 0; i < m * k; i++) x[i] = frand();
    for (int i = 0; i < m * n; i++) y[i] = NAN;
    if (g3_cuda_test_matmul(t, raw, n, k, "bf16", 1, 0, x, m, y, NULL, &err) != G3_OK) fail_msg("%s", err.msg);
    double dy = check_mm(ref, n, k, x, m, y, 0);
    int path = g3_cuda_test_mm_path(t, n, k, "bf16", 1, m);
    printf("  type %2u n=%d k=%d m=%-2d path %d: product rel err %.2e\n", t, n, k, m, path, dy);
    assert_int_equal(path, 1); /* tensor cores */
    assert_true(dy <= 1e-2);
    free(raw), free(src), free(ref), free(x), free(y);
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
    /* GGUF-derived formats: Q8_0 -> int8/32, Q6_K -> int8/16, Q4_0 and Q4_K -> int4/32 */
    const uint32_t types[] = {G3_DTYPE_Q8_0, G3_DTYPE_Q6_K, G3_DTYPE_Q4_0, G3_DTYPE_Q4_K};
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t i = 0; i < 4; i++) run_gguf_mm(types[ti], 40, 2816, ms[i]);
    run_gguf_mm(G3_DTYPE_Q4_K, 37, 21504, 32);
    /* $G3_CUDA_TCM=3: GGUF groups of 16/32 stay on the staged kernel; int4 with a half last stage (k = 384: 256 +
     * 128), int8 with one stage, odd n, every row count of a tile variant */
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
    float *src = malloc(sizeof(float) * k), *x = malloc(sizeof(float) * (size_t)m * k);
    float *xh = malloc(sizeof(float) * (size_t)m * k), *y = malloc(sizeof(float) * (size_t)m * n);
    float *wd = malloc(sizeof(float) * (size_t)n * k);
    g3_error err = {0};
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < k; i++) src[i] = frand() * 0.1f * (1 + r % 3);
        if (src_type == G3_DTYPE_F32) memcpy(raw + rb * r, src, rb);
        else assert_int_equal(g3_quantize_row(src_type, src, raw + rb * r, k, &err), G3_OK);
    }
    /* activations with outliers (every 97th value x20, as in real residual streams) and one all-zero block */
    for (size_t i = 0; i < (size_t)m * k; i++) x[i] = frand() * (i % 97 == 5 ? 20.f : 1.f);
    for (int i = 0; i < 32; i++) x[(size_t)(m - 1) * k + 32 + i] = 0.f;
    for (size_t i = 0; i < (size_t)m * n; i++) y[i] = NAN;
    const int path = g3_cuda_test_mm_path(src_type, n, k, quant, 1, m);
    if (g3_cuda_test_matmul(src_type, raw, n, k, quant, 1, geglu, x, m, y, wd, &err) != G3_OK)
        fail_msg("%s: %s", quant, err.msg);
    const char *lo_env = getenv("G3_CUDA_Q8LO");
    const int lo = m <= (lo_env && *lo_env ? atoi(lo_env) : 2);
    q8_emulate(x, m, k, lo, xh);
    double dq = check_mm(wd, n, k, xh, m, y, geglu), worst = 0;
    if (!geglu) {
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
    printf("  qgemv %-4s type %2u n=%-3d k=%-5d m=%d geglu=%d path %d lo=%d: rel err vs W.xh %.2e, |err vs W.x| / bound "
           "%.3f\n", quant, src_type, n, k, m, geglu, path, lo, dq, worst);
    assert_int_equal(path, 3);
    if (!(dq <= 5e-5)) fail_msg("%s m=%d: product error vs the emulated q8 %g > 5e-5", quant, m, dq);
    free(raw), free(src), free(x), free(xh), free(y), free(wd);
}

static void test_qgemv(void **state) {
    (void)state;
    need_gpu();
    /* a failed test may have left them set */
    unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_QGEMVP"), unsetenv("G3_CUDA_QGEMV");
    const int ms[] = {1, 2, 3, 8};
    for (int pass = 0; pass < 4; pass++) {
        /* pass 0: default residual plane up to 2 rows; pass 1: q alone at every m (the faster variant); passes 2, 3:
         * the same with $G3_CUDA_QGEMVP=0 (two launches, not the persistent kernel at 1-2 rows) */
        setenv("G3_CUDA_QGEMV", "8", 1);
        if (pass & 1) setenv("G3_CUDA_Q8LO", "0", 1);
        if (pass & 2) setenv("G3_CUDA_QGEMVP", "0", 1);
        for (size_t i = 0; i < 4; i++) {
            /* n = 45: not a multiple of any row tile (8 rows per block at short rows, 2-4 at long ones) */
            run_qgemv(G3_DTYPE_F32, "int8", 45, 5376, ms[i], 0);  /* per channel, 2 warps per row */
            run_qgemv(G3_DTYPE_F32, "int8", 45, 21504, ms[i], 0); /* 4 warps per row */
            run_qgemv(G3_DTYPE_F32, "int4", 45, 5376, ms[i], 0);  /* groups of 128 */
            run_qgemv(G3_DTYPE_F32, "int4", 37, 21504, ms[i], 0);
            run_qgemv(G3_DTYPE_Q8_0, "bf16", 45, 4096, ms[i], 0); /* int8 groups of 32 */
            run_qgemv(G3_DTYPE_Q6_K, "bf16", 45, 5376, ms[i], 0); /* int8 groups of 16 */
            run_qgemv(G3_DTYPE_Q4_0, "bf16", 45, 21504, ms[i], 0); /* int4 groups of 32 */
            run_qgemv(G3_DTYPE_Q4_K, "bf16", 45, 2816, ms[i], 0);
        }
        run_qgemv(G3_DTYPE_F32, "int4", 6, 96, 1, 0);     /* fewer chunks than lanes */
        run_qgemv(G3_DTYPE_F32, "int8", 130, 512, 2, 1);  /* GeGLU fused (gate, up pairs) */
        run_qgemv(G3_DTYPE_F32, "int8", 130, 512, 1, 1);
        run_qgemv(G3_DTYPE_F32, "int4", 132, 5376, 5, 1);
        /* more row groups (2 rows) than warps of the persistent grid (16 per SM, 132 SMs on the H200: 4224): each
         * warp walks several row groups, its pipeline crossing row-group boundaries; odd n leaves a half group */
        run_qgemv(G3_DTYPE_F32, "int4", 9001, 160, 1, 0);
        run_qgemv(G3_DTYPE_F32, "int8", 9001, 96, 2, 0);
        run_qgemv(G3_DTYPE_F32, "int4", 9002, 128, 2, 1);
        run_qgemv(G3_DTYPE_F32, "int8", 9002, 256, 1, 1);
        unsetenv("G3_CUDA_Q8LO"), unsetenv("G3_CUDA_QGEMVP");
    }
    /* the switch: 0 = today's choice (tensor cores for exact int4/int8 per channel, CUDA-core GEMV for groups < 128) */
    setenv("G3_CUDA_QGEMV", "0", 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 1), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_Q8_0, 45, 4096, "bf16", 1, 1), 0);
    setenv("G3_CUDA_QGEMV", "2", 1); /* up to 2 rows */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 2), 3);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int4", 1, 3), 1);
    unsetenv("G3_CUDA_QGEMV");
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 8), 3); /* default: on up to 8 */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "int8", 1, 9), 1);
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "fp8", 1, 1), 1); /* fp8 stays on tensor cores */
    assert_int_equal(g3_cuda_test_mm_path(G3_DTYPE_F32, 45, 5376, "bf16", 1, 1), 0);
}

/* bf16 weights on every CUDA-core GEMV variant ($G3_CUDA_GEMVPF): exact float32 arithmetic as the first GEMV (same
 * order within a chunk; the persistent one adds partial sums of a row atomically, in any order), so the same 2e-5
 * of max|y| as the exact paths (tol_for). */
static void test_gemv_pipelined(void **state) {
    (void)state;
    need_gpu();
    unsetenv("G3_CUDA_GEMVPF"); /* a failed test may have left it */
    const int ms[] = {1, 2, 3, 8};
    /* pipelined, persistent, the first GEMV (defaults: 0 at one row, 1 beyond) */
    static const char *modes[] = {"1", "2", "0"};
    for (int mi = 0; mi < 3; mi++) {
        setenv("G3_CUDA_GEMVPF", modes[mi], 1);
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
    unsetenv("G3_CUDA_GEMVPF");
}

/* ---- prefill attention and the many-row kernels (attention_prefill.cu, kernels.cu) ---------------------------- */
/* Sequences: A (a prefill chunk of L rows at positions P0.., after P0 positions of history in the cache), B and C
 * (one decode row each, after nB / nC positions of history). Step 1 writes the histories; step 2 is the batch
 * [B row, A chunk, C row]: the plan must give exactly the A rows to the flash kernel. Both the prefill path and the
 * decode kernel are checked against a double reference over the same rows; tolerance 1e-4 absolute as in
 * run_attention (O(1) convex combinations of values in [-2, 2]; float32 softmax over <= ~500 keys keeps errors near
 * 1e-6, while a wrong mask, key or position moves outputs by O(0.1)). */
static void run_prefill_attention(int NH, int NKV, int D, int kind, int window, float softcap, int P0, int L) {
    const int B = 16, nB = 37, nC = 5, NQKV = (NH + 2 * NKV) * D;
    const int lenA = P0 + L, n_u = 3;
    const int m0 = P0 + nB + nC, m = m0 + L + 2; /* step 1 rows, then step 2 rows */
    const int mbps = (lenA + B - 1) / B + 1, need = (lenA + nB + nC + 3 * B) / B + 3;
    const int n_blocks = need % 7 ? need : need + 1; /* prime to 7: the scramble below is a permutation */
    int32_t *pos = malloc(sizeof(int32_t) * m), *useq = malloc(sizeof(int32_t) * m);
    int32_t *bt = malloc(sizeof(int32_t) * n_u * 2 * mbps);
    int r = 0;
    for (int p = 0; p < P0; p++) pos[r] = p, useq[r++] = 0;
    for (int p = 0; p < nB; p++) pos[r] = p, useq[r++] = 1;
    for (int p = 0; p < nC; p++) pos[r] = p, useq[r++] = 2;
    pos[r] = nB, useq[r++] = 1;
    for (int p = P0; p < lenA; p++) pos[r] = p, useq[r++] = 0;
    pos[r] = nC, useq[r++] = 2;
    assert_int_equal(r, m);
    for (int i = 0; i < n_u * 2 * mbps; i++) bt[i] = -1;
    const int lens[3] = {lenA, nB + 1, nC + 1};
    int next = 0;
    for (int u = 0; u < n_u; u++)
        for (int j = 0; j < (lens[u] + B - 1) / B; j++) bt[(u * 2 + kind) * mbps + j] = (7 * next++ + 3) % n_blocks;
    assert_true(next <= n_blocks);
    float *qkv = malloc(sizeof(float) * (size_t)m * NQKV), *o = malloc(sizeof(float) * (size_t)(m - m0) * NH * D);
    float qn[256], kn[256], inv_freq[128];
    for (size_t i = 0; i < (size_t)m * NQKV; i++) qkv[i] = frand() * 2;
    for (int i = 0; i < D; i++) qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
    for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.f / powf(10000.f, (float)(2 * i) / D) / (kind == 0 ? 8.f : 1.f);
    g3_cuda_attn_test t = {.NH = NH, .NKV = NKV, .D = D, .kind = kind, .window = window, .kv_block = B, .mbps = mbps,
                           .n_blocks = n_blocks, .n_layers_kind = 2, .layer_in_kind = 1, .n_splits = 3,
                           .scale = 1.f / sqrtf(24.f), .softcap = softcap, .eps = 1e-6f, .inv_freq = inv_freq,
                           .q_norm = qn, .k_norm = kn};
    /* reference q, k, v of every row */
    float *q = malloc(sizeof(float) * (size_t)m * NH * D), *k = malloc(sizeof(float) * (size_t)m * NKV * D);
    float *v = malloc(sizeof(float) * (size_t)m * NKV * D);
    for (int i = 0; i < m; i++) {
        for (int h = 0; h < NH; h++) {
            memcpy(q + ((size_t)i * NH + h) * D, qkv + (size_t)i * NQKV + h * D, sizeof(float) * D);
            rms_rope(q + ((size_t)i * NH + h) * D, D, qn, 1e-6f, pos[i], inv_freq);
        }
        for (int h = 0; h < NKV; h++) {
            memcpy(k + ((size_t)i * NKV + h) * D, qkv + (size_t)i * NQKV + (NH + h) * D, sizeof(float) * D);
            rms_rope(k + ((size_t)i * NKV + h) * D, D, kn, 1e-6f, pos[i], inv_freq);
            memcpy(v + ((size_t)i * NKV + h) * D, qkv + (size_t)i * NQKV + (NH + NKV + h) * D, sizeof(float) * D);
        }
    }
    double *sc = malloc(sizeof(double) * m);
    for (int flash = 0; flash < 2; flash++) {
        for (int i = 0; i < (m - m0) * NH * D; i++) o[i] = NAN;
        g3_error err = {0};
        int n_flash = -1;
        if (g3_cuda_test_prefill_attention(&t, qkv, pos, useq, bt, n_u, m0, m, flash, o, &n_flash, &err) != G3_OK)
            fail_msg("%s", err.msg);
        if (flash) assert_int_equal(n_flash, L); /* the chunk, not the decode rows */
        double worst = 0;
        for (int i = m0; i < m; i++)
            for (int h = 0; h < NH; h++) {
                const int kh = h / (NH / NKV);
                double mx = -1e300, l = 0;
                for (int j = 0; j < m; j++) {
                    sc[j] = -INFINITY;
                    if (useq[j] != useq[i] || pos[j] > pos[i]) continue;
                    if (kind == 1 && pos[i] - pos[j] >= window) continue;
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += (double)q[((size_t)i * NH + h) * D + d] * k[((size_t)j * NKV + kh) * D + d];
                    s *= t.scale;
                    if (softcap > 0) s = softcap * tanh(s / softcap);
                    sc[j] = s, mx = fmax(mx, s);
                }
                for (int j = 0; j < m; j++) l += sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
                for (int j = 0; j < m; j++) sc[j] = sc[j] == -INFINITY ? 0 : exp(sc[j] - mx) / l;
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int j = 0; j < m; j++)
                        if (sc[j] != 0) acc += sc[j] * v[((size_t)j * NKV + kh) * D + d];
                    double e = fabs(acc - o[((size_t)(i - m0) * NH + h) * D + d]);
                    if (isnan(e)) e = INFINITY;
                    worst = fmax(worst, e);
                }
            }
        printf("  prefill attention %s NH=%d NKV=%d D=%d kind=%d window=%d softcap=%g chunk %d at %d (+2 decode "
               "rows): max err %.2e\n",
               flash ? (getenv("G3_CUDA_FATC") ? "flash tc" : "flash ") : "decode", NH, NKV, D, kind, window, softcap, L,
               P0, worst);
        assert_true(worst < 1e-4);
    }
    free(pos), free(useq), free(bt), free(qkv), free(o), free(q), free(k), free(v), free(sc);
}

static void test_prefill_attention(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_FA", "1", 1);
    run_prefill_attention(4, 2, 128, 0, 1024, 0, 100, 300);  /* 27B-like heads, global, history from the cache */
    run_prefill_attention(4, 2, 128, 1, 64, 50.f, 70, 200);  /* sliding window smaller than the chunk, softcap */
    run_prefill_attention(8, 1, 64, 1, 100, 0, 0, 90);       /* GQA 8: tiles of 8 rows, chunk from position 0 */
    run_prefill_attention(4, 4, 32, 0, 1024, 30.f, 20, 150); /* no GQA: tiles of 64 rows */
    run_prefill_attention(8, 2, 256, 1, 40, 0, 33, 77);      /* D 256, GQA 4 */
    run_prefill_attention(4, 2, 18, 0, 1024, 0, 5, 40);      /* D not a multiple of 4: padded, scalar loads */
    setenv("G3_CUDA_ROWK", "0", 1); /* the old QK-norm kernel feeding both paths */
    run_prefill_attention(4, 2, 128, 1, 64, 0, 3, 60);
    unsetenv("G3_CUDA_ROWK");
    unsetenv("G3_CUDA_FA");
}

/* The tensor-core flash kernel ($G3_CUDA_FATC=1; 3xTF32: products within ~2^-21 relative, as float32, so the same
 * 1e-4 bound against the double reference) where D % 4 == 0 and D <= 128: several key tiles (double buffer),
 * padding columns (D 96), partial tiles, GQA 1..8, softcap, sliding window. */
static void test_prefill_attention_tc(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_FA", "1", 1);
    for (int v = 1; v <= 2; v++) { /* one group of 4 warps (double buffer); two groups on alternate key tiles */
        setenv("G3_CUDA_FATC", v == 1 ? "1" : "2", 1);
        printf("  G3_CUDA_FATC=%d\n", v);
        run_prefill_attention(4, 2, 128, 0, 1024, 0, 100, 300);
        run_prefill_attention(4, 2, 128, 1, 64, 50.f, 70, 200);
        run_prefill_attention(8, 1, 64, 1, 100, 0, 0, 90);
        run_prefill_attention(4, 4, 32, 0, 1024, 30.f, 20, 150);
        run_prefill_attention(2, 1, 96, 0, 1024, 0, 0, 203);
        run_prefill_attention(8, 2, 256, 1, 40, 0, 33, 77); /* D 256: the float32 kernel */
    }
    unsetenv("G3_CUDA_FATC");
    unsetenv("G3_CUDA_FA");
}

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
                double a = 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
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
        for (int f = 1; f <= 3; f++) { /* the flags of the prefill forward ($G3_CUDA_NOZERO) */
            run_rows_f(G3C_TEST_ADD_NORM, f, 512, 5376);
            run_rows_f(G3C_TEST_GEGLU, f, 512, 2 * 4096);
        }
    }
    unsetenv("G3_CUDA_ROWK");
}
#else
static void no_cuda(void **state) {
    (void)state;
    printf("  built without CUDA (no nvcc): skipped\n");
    skip();
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef G3_HAVE_CUDA
        cmocka_unit_test(test_matmul_formats),
        cmocka_unit_test(test_matmul_long_rows),
        cmocka_unit_test(test_gguf_types),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_add_norm_decode),
        cmocka_unit_test(test_argmax_decode),
        cmocka_unit_test(test_matmul_staged),
        cmocka_unit_test(test_qgemv),
        cmocka_unit_test(test_gemv_pipelined),
        cmocka_unit_test(test_prefill_attention),
        cmocka_unit_test(test_prefill_attention_tc),
        cmocka_unit_test(test_row_kernels),
#else
        cmocka_unit_test(no_cuda),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
