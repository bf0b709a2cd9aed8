/* CUDA attention against a double reference: QK-norm + RoPE + paged-cache attention with GQA, sliding window, softcap
 * and split keys (attention.cu), the decode kernels separate and fused (attention_dec.cu), and prefill attention with
 * the flash kernels, float32 and tensor-core (attention_prefill.cu, attention_tc.cu). Skipped without CUDA or a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "testutil.h"

#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/prefill_api.h"
#include "cuda_testutil.h"

/* bf16 K/V cache ($G3_CUDA_KV=bf16): set by test_attention_kv16; the references then round K (after QK-norm and
 * RoPE) and V to bf16 as the cache write does, and the bound is KV16_TOL: the GPU's K can differ from the host's by
 * a float ulp before rounding, which flips a bf16 rounding now and then (one score off by ~2^-8 relative: ~1e-3 of
 * an output at worst in these shapes), while a wrong element, stride or key moves outputs by O(0.1). */
static int g_kv16;
#define KV16_TOL 5e-3
static void bf16r_all(float *v, size_t n) { /* round to nearest even, as __float2bfloat16_rn */
    if (g_kv16)
        for (size_t i = 0; i < n; i++) v[i] = g3_bf16_to_f32(g3_f32_to_bf16(v[i]));
}
/* The 3xBF16 flash kernel ($G3_CUDA_FATC=3|4) sets g_tol to BF3_TOL: its products carry ~1.4e-6 of sum |q k|
 * (dev/cuda/fa_bf_emul.cc), ~2e-5 on a score here (sum |q k| ~ 80 at D 128, scale 0.2), so outputs within ~5e-5 of
 * the double reference at worst, against O(0.1) for a wrong fragment or key. */
#define BF3_TOL 2e-4
static double g_tol = 1e-4;
static double attn_tol(void) { return g_kv16 ? KV16_TOL : g_tol; }

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

/* The reference q, k, v of m rows of a product output qkv [m][(NH + 2 NKV) D]: q and k RMS-normalized and rotated
 * for their row's position, v as is (q [m][NH][D], k and v [m][NKV][D]). */
static void ref_qkv(const float *qkv, int m, int NH, int NKV, int D, const int32_t *pos, const float *qn,
                    const float *kn, const float *inv_freq, float *q, float *k, float *v) {
    const int NQKV = (NH + 2 * NKV) * D;
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
    ref_qkv(qkv, m, NH, NKV, D, pos, qn, kn, inv_freq, q, k, v);
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

/* ---- decode attention (fused QK-norm + RoPE + cache write + attention) ---------------------------------------- */
/* Rows r < m of distinct sequences (useq[r] = r, or -1 for a padding row) decode at position lens[r] after a history
 * of lens[r] rows (positions 0..lens[r]-1, cache writes only). The separate kernels and the fused one, each with the
 * second decode kernel (attention_dec.cu) and the round-1 one, are checked against a double reference; every mode
 * must leave the qkv buffer zeroed. Tolerance 1e-4 absolute as in run_attention: outputs are O(1) convex
 * combinations of values in [-2, 2], float32 softmax over <= ~700 keys keeps errors near 1e-6. */
/* shared = 0: row r is sequence r with lens[r] positions of history. shared = 1: all m rows are of sequence 0, at
 * positions lens[0] .. lens[0] + m - 1 after lens[0] positions of history (a chunk of consecutive tokens decoded in
 * one step: row r also sees the keys of rows < r written in the same step; the fused kernels need distinct rows
 * and are not run). */
static void run_attention_decode_x(int NH, int NKV, int D, int kind, int window, int n_splits, float softcap, int B,
                                   int m, const int *lens, int pad_row, int shared) {
    const int NQKV = (NH + 2 * NKV) * D;
    int mbps = 1, m_hist = 0, nb = 0;
    for (int r = 0; r < (shared ? 1 : m); r++) {
        int need = (lens[r] + (shared ? m - 1 : 0)) / B + 1;
        if (need > mbps) mbps = need;
        m_hist += lens[r], nb += need;
    }
    const int n_u = shared ? 1 : m, n_blocks = (nb + 3) % 7 ? nb + 3 : nb + 4; /* prime to 7: a permutation below */
    int32_t *bt = malloc(sizeof(int32_t) * n_u * 2 * mbps), *pos = malloc(sizeof(int32_t) * m);
    int32_t *useq = malloc(sizeof(int32_t) * m), *hpos = malloc(sizeof(int32_t) * (m_hist + 1));
    int32_t *huseq = malloc(sizeof(int32_t) * (m_hist + 1));
    for (int i = 0; i < n_u * 2 * mbps; i++) bt[i] = -1;
    /* physical blocks handed out in a scrambled order: block i of the pool sequence goes to (7 i + 3) mod n_blocks */
    int next = 0;
    for (int r = 0; r < n_u; r++)
        for (int j = 0; j <= (lens[r] + (shared ? m - 1 : 0)) / B; j++)
            bt[(r * 2 + kind) * mbps + j] = (7 * next++ + 3) % n_blocks;
    float *hq = malloc(sizeof(float) * ((size_t)m_hist + 1) * NQKV), *qkv = malloc(sizeof(float) * (size_t)m * NQKV);
    int h = 0;
    for (int r = 0; r < n_u; r++) /* history rows interleaved across sequences does not matter: cache writes only */
        for (int p = 0; p < lens[r]; p++) hpos[h] = p, huseq[h] = r, h++;
    for (size_t i = 0; i < (size_t)m_hist * NQKV; i++) hq[i] = frand() * 2;
    for (size_t i = 0; i < (size_t)m * NQKV; i++) qkv[i] = frand() * 2;
    for (int r = 0; r < m; r++) pos[r] = shared ? lens[0] + r : lens[r], useq[r] = r == pad_row ? -1 : shared ? 0 : r;
    if (pad_row >= 0) pos[pad_row] = 0;
    float qn[256], kn[256], inv_freq[128];
    for (int i = 0; i < D; i++) qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
    for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.f / powf(10000.f, (float)(2 * i) / D) / (kind == 0 ? 8.f : 1.f);
    g3_cuda_attn_test t = {.NH = NH, .NKV = NKV, .D = D, .kind = kind, .window = window, .kv_block = B, .mbps = mbps,
                           .n_blocks = n_blocks, .n_layers_kind = 3, .layer_in_kind = 2, .n_splits = n_splits,
                           .scale = 1.f / sqrtf(24.f), .softcap = softcap, .eps = 1e-6f, .inv_freq = inv_freq,
                           .q_norm = qn, .k_norm = kn, .kv16 = g_kv16};
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
            bf16r_all(kk + ((size_t)i * NKV + hh) * D, (size_t)D), bf16r_all(vv + ((size_t)i * NKV + hh) * D, (size_t)D);
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
    /* the hook's bit 0: fused, bit 1: round-1 kernels (else attention_dec.cu), bit 2: its 2-warp blocks, bit 3: o
     * quantized per block of 128 values for the o product (where G * D % 128 == 0), returned dequantized */
    static const int modes[9] = {0, 2, 4, 1, 3, 5, 8, 12, 9};
    static const char *mode_name[9] = {"separate",    "separate-r1", "separate-w2", "fused",   "fused-r1",
                                       "fused-w2",    "separate-tq", "separate-w2-tq", "fused-tq"};
    const int tq_ok = NH / NKV * D % 128 == 0;
    for (int mi = 0; mi < 9; mi++) {
        const int fused = modes[mi];
        if ((shared && (fused & 1)) || ((fused & 8) && !tq_ok)) continue;
        for (size_t i = 0; i < (size_t)m * NH * D; i++) o[i] = NAN;
        for (size_t i = 0; i < (size_t)m * NQKV; i++) ya[i] = NAN;
        g3_error err = {0};
        if (g_kv16 && (fused & 2)) { /* the round-1 kernels read float32 caches only: a clear refusal */
            assert_int_not_equal(g3_cuda_test_attention_decode(&t, fused, hq, hpos, huseq, m_hist, qkv, pos, useq, m, bt,
                                                               n_u, o, ya, &err),
                                 G3_OK);
            continue;
        }
        if (g3_cuda_test_attention_decode(&t, fused, hq, hpos, huseq, m_hist, qkv, pos, useq, m, bt, n_u, o, ya,
                                          &err) != G3_OK)
            fail_msg("%s", err.msg);
        double worst = 0; /* quantized: the error beyond half a step of the block's d = amax / 127 */
        for (size_t b = 0; b < (size_t)m * NH * D / (fused & 8 ? 128 : 1); b++) {
            const size_t n = fused & 8 ? 128 : 1;
            double amax = 0;
            for (size_t i = b * n; i < (b + 1) * n; i++) amax = fmax(amax, fabs(ref[i]));
            const double half = fused & 8 ? amax / 254 * 1.0001 : 0;
            for (size_t i = b * n; i < (b + 1) * n; i++) {
                double e = fabs(ref[i] - o[i]) - half;
                if (isnan(e)) e = INFINITY;
                worst = fmax(worst, e);
            }
        }
        size_t nonzero = 0;
        for (size_t i = 0; i < (size_t)m * NQKV; i++) nonzero += ya[i] != 0.f;
        printf("  decode attention %s%s NH=%d NKV=%d D=%d kind=%d window=%d splits=%d softcap=%g block=%d rows=%d%s: "
               "max err %.2e, qkv left non-zero %zu\n", mode_name[mi], g_kv16 ? " (bf16 cache)" : "", NH, NKV, D,
               kind, window, n_splits, softcap, B, m, shared ? " (one sequence)" : "", worst, nonzero);
        assert_true(worst < attn_tol());
        assert_int_equal(nonzero, 0);
    }
    free(bt), free(pos), free(useq), free(hpos), free(huseq), free(hq), free(qkv), free(ref), free(qv), free(kk);
    free(vv), free(sc), free(kpos), free(kseq), free(o), free(ya);
}

static void run_attention_decode(int NH, int NKV, int D, int kind, int window, int n_splits, float softcap, int B,
                                 int m, const int *lens, int pad_row) {
    run_attention_decode_x(NH, NKV, D, kind, window, n_splits, softcap, B, m, lens, pad_row, 0);
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
    /* 4B head shape at 40 rows: one block a (row, kv head) on a GPU of <= 160 SMs (160 pairs; the H200 has 132), 2-warp
     * blocks in the -w2 modes */
    run_attention_decode(8, 4, 256, 1, 100, 9, 0, 16, 40, many27, 5);
    const int two[2] = {0, 700};                                    /* a row with no history, a long one */
    run_attention_decode(4, 1, 256, 1, 512, 12, 0, 32, 2, two, -1);  /* 1B head shape, window 512 < 701 keys */
    /* rows of one sequence in one step (the decode kernel loads keys before its launch wait only for rows of distinct
     * sequences: here each row must see the keys the same step wrote for the rows before it) */
    const int hist[1] = {600};
    run_attention_decode_x(32, 16, 128, 0, 1024, 33, 0, 16, 4, hist, -1, 1); /* 27B shape, 1 cluster a row */
    /* 27B shape, 40 rows of one sequence, window 50: one block a (row, kv head), in 2-warp blocks where 640 pairs
     * exceed 4 a SM (the H200's 132 SMs), every load after the launch wait (rows of one sequence) */
    run_attention_decode_x(32, 16, 128, 1, 50, 4, 0, 16, 40, hist, -1, 1);
    run_attention_decode_x(8, 4, 256, 1, 100, 9, 0, 16, 8, hist, -1, 1);    /* 4B head shape, window 100 */
    const int hist0[1] = {3};
    run_attention_decode_x(4, 1, 256, 0, 1024, 7, 0, 16, 12, hist0, -1, 1); /* 1B head shape, short history */
}

/* ---- prefill attention (attention_prefill.cu, attention_tc.cu) ------------------------------------------------ */
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
                           .q_norm = qn, .k_norm = kn, .kv16 = g_kv16};
    /* reference q, k, v of every row */
    float *q = malloc(sizeof(float) * (size_t)m * NH * D), *k = malloc(sizeof(float) * (size_t)m * NKV * D);
    float *v = malloc(sizeof(float) * (size_t)m * NKV * D);
    ref_qkv(qkv, m, NH, NKV, D, pos, qn, kn, inv_freq, q, k, v);
    bf16r_all(k, (size_t)m * NKV * D), bf16r_all(v, (size_t)m * NKV * D);
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
        const char *fe = getenv("G3_CUDA_FATC"); /* the tensor-core kernel: the default where it applies */
        const int fv = fe && *fe ? atoi(fe) : 4, tc = fv >= 1 && fv <= 4 && D % 4 == 0 && D <= 128 &&
                                                       (!g_kv16 || (fv >= 3 && D % 8 == 0));
        printf("  prefill attention %s%s NH=%d NKV=%d D=%d kind=%d window=%d softcap=%g chunk %d at %d (+2 decode "
               "rows): max err %.2e\n",
               flash ? (tc ? "flash tc" : "flash ") : "decode", g_kv16 ? " (bf16 cache)" : "", NH,
               NKV, D, kind, window, softcap, L, P0, worst);
        assert_true(worst < attn_tol());
    }
    free(pos), free(useq), free(bt), free(qkv), free(o), free(q), free(k), free(v), free(sc);
}

static void test_prefill_attention(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_FA", "1", 1);
    setenv("G3_CUDA_FATC", "0", 1); /* the CUDA-core flash kernel (test_prefill_attention_tc: the tensor-core ones) */
    run_prefill_attention(4, 2, 128, 0, 1024, 0, 100, 300);  /* 27B-like heads, global, history from the cache */
    run_prefill_attention(4, 2, 128, 1, 64, 50.f, 70, 200);  /* sliding window smaller than the chunk, softcap */
    run_prefill_attention(8, 1, 64, 1, 100, 0, 0, 90);       /* GQA 8: tiles of 8 rows, chunk from position 0 */
    run_prefill_attention(4, 4, 32, 0, 1024, 30.f, 20, 150); /* no GQA: tiles of 64 rows */
    run_prefill_attention(8, 2, 256, 1, 40, 0, 33, 77);      /* D 256, GQA 4 */
    run_prefill_attention(4, 2, 18, 0, 1024, 0, 5, 40);      /* D not a multiple of 4: padded, scalar loads */
    setenv("G3_CUDA_ROWK", "0", 1); /* the old QK-norm kernel feeding both paths */
    run_prefill_attention(4, 2, 128, 1, 64, 0, 3, 60);
    unsetenv("G3_CUDA_ROWK");
    unsetenv("G3_CUDA_FATC");
    unsetenv("G3_CUDA_FA");
}

/* The tensor-core flash kernel ($G3_CUDA_FATC=1|2; 3xTF32: products within ~2^-21 relative, as float32, so the same
 * 1e-4 bound against the double reference; 3|4: 3xBF16, BF3_TOL; 4 is the default) where D % 4 == 0 and D <= 128:
 * several key tiles (double buffer), padding columns (D 96), partial tiles, GQA 1..8, softcap, sliding window. */
static void test_prefill_attention_tc(void **state) {
    (void)state;
    need_gpu();
    setenv("G3_CUDA_FA", "1", 1);
    for (int v = 1; v <= 4; v++) { /* one group of 4 warps (double buffer); two groups on alternate key tiles */
        char vs[2] = {(char)('0' + v), 0};
        setenv("G3_CUDA_FATC", vs, 1);
        g_tol = v >= 3 ? BF3_TOL : 1e-4;
        printf("  G3_CUDA_FATC=%d\n", v);
        run_prefill_attention(4, 2, 128, 0, 1024, 0, 100, 300);
        run_prefill_attention(4, 2, 128, 1, 64, 50.f, 70, 200);
        run_prefill_attention(8, 1, 64, 1, 100, 0, 0, 90);
        run_prefill_attention(4, 4, 32, 0, 1024, 30.f, 20, 150);
        run_prefill_attention(2, 1, 96, 0, 1024, 0, 0, 203);
        run_prefill_attention(8, 2, 256, 1, 40, 0, 33, 77); /* D 256: the float32 kernel */
    }
    g_tol = 1e-4;
    unsetenv("G3_CUDA_FATC");
    unsetenv("G3_CUDA_FA");
}

/* The bf16 K/V cache: QK-norm kernels writing bf16 (one row at a time and many), the cluster decode kernel separate
 * and fused, the flash prefill kernels reading it (the BF16 tensor-core forms with K and V exact, the default where
 * D <= 128; the CUDA-core kernel for D 256, with $G3_CUDA_FATC=0, and for the 3xTF32 forms, which fall back to it),
 * against references that round K and V as the cache does; head dims 64, 128, 256 (the decode kernel's; the round-1
 * kernels refuse the cache). */
static void test_attention_kv16(void **state) {
    (void)state;
    need_gpu();
    g_kv16 = 1;
    const int one[1] = {600};
    run_attention_decode(32, 16, 128, 0, 1024, 33, 0, 16, 1, one, -1);
    const int eight[8] = {0, 1, 15, 16, 17, 63, 200, 301};
    run_attention_decode(8, 4, 128, 1, 37, 5, 50.f, 16, 8, eight, 3);
    const int three[3] = {5, 130, 257};
    run_attention_decode(4, 1, 256, 0, 1024, 7, 0, 16, 3, three, -1);
    int many[40];
    for (int i = 0; i < 40; i++) many[i] = (i * 37) % 90;
    run_attention_decode(8, 1, 64, 1, 20, 2, 0, 8, 40, many, 39);
    int many27[40];
    for (int i = 0; i < 40; i++) many27[i] = (i * 53) % 300;
    run_attention_decode(32, 16, 128, 1, 50, 16, 30.f, 16, 40, many27, 7);
    const int hist[1] = {600};
    run_attention_decode_x(32, 16, 128, 0, 1024, 33, 0, 16, 4, hist, -1, 1);
    setenv("G3_CUDA_FA", "1", 1);
    run_prefill_attention(4, 2, 128, 0, 1024, 0, 100, 300);
    run_prefill_attention(4, 2, 128, 1, 64, 50.f, 70, 200);
    run_prefill_attention(8, 1, 64, 1, 100, 0, 0, 90);
    run_prefill_attention(8, 2, 256, 1, 40, 0, 33, 77);
    setenv("G3_CUDA_FATC", "3", 1); /* one warp group */
    run_prefill_attention(4, 2, 128, 0, 1024, 0, 100, 300);
    run_prefill_attention(8, 1, 64, 1, 100, 0, 0, 90);
    setenv("G3_CUDA_FATC", "0", 1); /* the CUDA-core kernel */
    run_prefill_attention(4, 2, 128, 1, 64, 50.f, 70, 200);
    setenv("G3_CUDA_FATC", "1", 1); /* asked for, not taken with a bf16 cache */
    run_prefill_attention(4, 2, 128, 1, 64, 0, 3, 60);
    unsetenv("G3_CUDA_FATC");
    setenv("G3_CUDA_ROWK", "0", 1); /* the one-row QK-norm kernel writing the history */
    run_prefill_attention(4, 2, 128, 1, 64, 0, 3, 60);
    unsetenv("G3_CUDA_ROWK");
    unsetenv("G3_CUDA_FA");
    g_kv16 = 0;
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
#ifdef G3_HAVE_CUDA
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_prefill_attention),
        cmocka_unit_test(test_prefill_attention_tc),
        cmocka_unit_test(test_attention_kv16),
#else
        cmocka_unit_test(tu_skip_no_cuda),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
