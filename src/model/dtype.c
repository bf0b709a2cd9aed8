/* Tensor element types: the info table, row/tensor sizes, and the portable reference dequantizers and
 * quantizers for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (block layouts in dtype.h, bit-compatible with
 * GGUF/ggml). The quantizers search each block's scale(s) for the least squared error; they run at model
 * conversion time, so they favour quality over speed. */
#include "model/dtype.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "gemma3.h"

_Static_assert(sizeof(g3_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(g3_block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(g3_block_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(g3_block_q6_k) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(g3_block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(g3_block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(g3_block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(g3_block_q5_k) == 176, "Q5_K block is 176 bytes");

static const g3_dtype_info info_f32 = {"F32", 1, 4, 0};
static const g3_dtype_info info_f16 = {"F16", 1, 2, 0};
static const g3_dtype_info info_bf16 = {"BF16", 1, 2, 0};
static const g3_dtype_info info_q8_0 = {"Q8_0", G3_QK8_0, sizeof(g3_block_q8_0), 1};
static const g3_dtype_info info_q4_0 = {"Q4_0", G3_QK4_0, sizeof(g3_block_q4_0), 1};
static const g3_dtype_info info_q4_k = {"Q4_K", G3_QK_K, sizeof(g3_block_q4_k), 1};
static const g3_dtype_info info_q6_k = {"Q6_K", G3_QK_K, sizeof(g3_block_q6_k), 1};
static const g3_dtype_info info_q4_1 = {"Q4_1", 32, sizeof(g3_block_q4_1), 1};
static const g3_dtype_info info_q5_0 = {"Q5_0", 32, sizeof(g3_block_q5_0), 1};
static const g3_dtype_info info_q5_1 = {"Q5_1", 32, sizeof(g3_block_q5_1), 1};
static const g3_dtype_info info_q5_k = {"Q5_K", G3_QK_K, sizeof(g3_block_q5_k), 1};

const g3_dtype_info *g3_dtype_get(uint32_t type) {
    switch (type) {
    case G3_DTYPE_F32: return &info_f32;
    case G3_DTYPE_F16: return &info_f16;
    case G3_DTYPE_BF16: return &info_bf16;
    case G3_DTYPE_Q8_0: return &info_q8_0;
    case G3_DTYPE_Q4_0: return &info_q4_0;
    case G3_DTYPE_Q4_K: return &info_q4_k;
    case G3_DTYPE_Q6_K: return &info_q6_k;
    case G3_DTYPE_Q4_1: return &info_q4_1;
    case G3_DTYPE_Q5_0: return &info_q5_0;
    case G3_DTYPE_Q5_1: return &info_q5_1;
    case G3_DTYPE_Q5_K: return &info_q5_k;
    default: return NULL;
    }
}

uint32_t g3_dtype_fallback(uint32_t type, int64_t k) {
    if (k % G3_QK_K == 0) return type;
    switch (type) {
    case G3_DTYPE_Q4_K: return G3_DTYPE_Q5_0;
    case G3_DTYPE_Q5_K: return G3_DTYPE_Q5_1;
    case G3_DTYPE_Q6_K: return G3_DTYPE_Q8_0;
    default: return type;
    }
}

size_t g3_row_bytes(uint32_t type, int64_t k) {
    const g3_dtype_info *t = g3_dtype_get(type);
    if (!t || k <= 0 || k % t->block) return 0;
    uint64_t blocks = (uint64_t)k / (uint64_t)t->block;
    if (blocks > SIZE_MAX / t->block_bytes) return 0;
    return (size_t)blocks * t->block_bytes;
}

size_t g3_tensor_bytes(uint32_t type, int64_t k, int64_t n_rows) {
    size_t rb = g3_row_bytes(type, k);
    if (!rb || n_rows <= 0 || (uint64_t)n_rows > SIZE_MAX / rb) return 0;
    return rb * (size_t)n_rows;
}

/* ---- unpacking helpers --------------------------------------------------------------------------------- */

static void q4k_pack_scales(const int sc[8], const int m[8], uint8_t s[12]) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= (uint8_t)(sc[j] & 63);
            s[j + 4] |= (uint8_t)(m[j] & 63);
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 0x0F) | ((m[j] & 0x0F) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

/* ---- dequantization ------------------------------------------------------------------------------------- */

void g3_dequant_row(uint32_t type, const void *src, float *dst, int64_t k) {
    switch (type) {
    case G3_DTYPE_F32: memcpy(dst, src, (size_t)k * 4); break;
    case G3_DTYPE_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < k; i++) dst[i] = g3_f16_to_f32(s[i]);
        break;
    }
    case G3_DTYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < k; i++) dst[i] = g3_bf16_to_f32(s[i]);
        break;
    }
    case G3_DTYPE_Q8_0: {
        const g3_block_q8_0 *b = src;
        for (int64_t i = 0; i < k / 32; i++) {
            float d = g3_f16_to_f32(b[i].d);
            for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)b[i].qs[j];
        }
        break;
    }
    case G3_DTYPE_Q4_0: {
        const g3_block_q4_0 *b = src;
        for (int64_t i = 0; i < k / 32; i++) {
            float d = g3_f16_to_f32(b[i].d);
            for (int j = 0; j < 16; j++) {
                dst[i * 32 + j] = d * (float)((b[i].qs[j] & 0x0F) - 8);
                dst[i * 32 + j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    case G3_DTYPE_Q4_1:
    case G3_DTYPE_Q5_0:
    case G3_DTYPE_Q5_1: {
        /* f16 d (and Q4_1 / Q5_1's f16 offset m; Q5_0: m = -16 d), Q5's qh[4], then qs[16] */
        const size_t bb = g3_dtype_get(type)->block_bytes;
        const uint8_t *p = src;
        for (int64_t i = 0; i < k / 32; i++, p += bb) {
            uint16_t dh, mh;
            memcpy(&dh, p, 2);
            memcpy(&mh, p + 2, 2);
            float d = g3_f16_to_f32(dh), m = type == G3_DTYPE_Q5_0 ? -16.0f * d : g3_f16_to_f32(mh);
            uint32_t qh = 0;
            if (type != G3_DTYPE_Q4_1) memcpy(&qh, p + bb - 20, 4);
            for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)g3_q5_code(p + bb - 16, qh, j) + m;
        }
        break;
    }
    case G3_DTYPE_Q4_K:
    case G3_DTYPE_Q5_K: {
        /* both: f16 d, dmin; scales[12]; Q5_K's qh[32]; qs[128] (g3_kq_code) */
        const int five = type == G3_DTYPE_Q5_K;
        const size_t bb = five ? 176 : 144;
        const uint8_t *p = src;
        for (int64_t i = 0; i < k / 256; i++, p += bb) {
            uint16_t dh, mh;
            memcpy(&dh, p, 2);
            memcpy(&mh, p + 2, 2);
            float d = g3_f16_to_f32(dh), dmin = g3_f16_to_f32(mh);
            const uint8_t *qh = five ? p + 16 : NULL, *qs = p + (five ? 48 : 16);
            float *y = dst + i * 256;
            for (int j = 0; j < 8; j++) {
                int sc, m;
                g3_kq_scale_min(p + 4, j, &sc, &m);
                float s = d * (float)sc, mm = dmin * (float)m;
                for (int l = 0; l < 32; l++) y[32 * j + l] = s * (float)g3_kq_code(qs, qh, 32 * j + l) - mm;
            }
        }
        break;
    }
    case G3_DTYPE_Q6_K: {
        const g3_block_q6_k *b = src;
        for (int64_t i = 0; i < k / 256; i++) {
            float d = g3_f16_to_f32(b[i].d);
            for (int e = 0; e < 256; e++)
                dst[i * 256 + e] = d * (float)b[i].scales[e / 16] * (float)(g3_q6k_code(&b[i], e) - 32);
        }
        break;
    }
    default: memset(dst, 0, (size_t)k * sizeof(float)); break;
    }
}

/* ---- quantization --------------------------------------------------------------------------------------- */

/* Nearest integer, clamped to [lo, hi] before conversion (no UB for huge values). */
static int qround(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo; /* also catches NaN */
    if (v >= (float)hi) return hi;
    return (int)lrintf(v);
}

static void quant_q8_0(const float *x, g3_block_q8_0 *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    b->d = g3_f32_to_f16(amax / 127.0f);
    float d = g3_f16_to_f32(b->d);
    float id = d > 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) b->qs[j] = (int8_t)qround(x[j] * id, -127, 127);
}

/* Q4_0: x = d*(q-8), q in 0..15. The value of largest magnitude anchors the scale (mapped near -8, where the
 * range is one step longer); a few scales around that are tried and the one with least squared error kept.
 * The f16 scale of a symmetric 32-value block with codes -half..half-1 (Q4_0: 8, Q5_0: 16): the value of largest
 * magnitude mapped to -half .. -3/4 half, 17 tries, least squared error kept. */
static float sym_scale_search(const float *x, int half) {
    float amax = 0, vmax = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), vmax = x[j];
    float best_d = 0, best_err = FLT_MAX;
    if (amax > 0) {
        for (int t = 0; t <= 16; t++) {
            float d = vmax / (-(float)half + ((float)half / 64.0f) * (float)t);
            float dq = g3_f16_to_f32(g3_f32_to_f16(d));
            if (dq == 0) continue;
            float id = 1.0f / dq, err = 0;
            for (int j = 0; j < 32; j++) {
                float e = dq * (float)(qround(x[j] * id, -half, half - 1)) - x[j];
                err += e * e;
            }
            if (err < best_err) best_err = err, best_d = dq;
        }
    }
    return best_d;
}

static void quant_q4_0(const float *x, g3_block_q4_0 *b) {
    float best_d = sym_scale_search(x, 8);
    b->d = g3_f32_to_f16(best_d);
    float id = best_d != 0 ? 1.0f / best_d : 0.0f;
    uint8_t q[32];
    for (int j = 0; j < 32; j++) q[j] = (uint8_t)(qround(x[j] * id, -8, 7) + 8);
    for (int j = 0; j < 16; j++) b->qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

/* Least-squares fit x ~ a*q + b over n values for fixed integer codes q; with `nonpos_b`, b is forced <= 0.
 * Returns the squared error. */
static float fit_affine(const float *x, const int *q, int n, int nonpos_b, float *pa, float *pb) {
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; i++) {
        sq += q[i];
        sqq += (double)q[i] * q[i];
        sx += x[i];
        sxq += (double)x[i] * q[i];
    }
    double det = n * sqq - sq * sq, a, bb;
    if (det > 0) {
        a = (n * sxq - sq * sx) / det;
        bb = (sx - a * sq) / n;
    } else {
        a = 0;
        bb = sx / n;
    }
    if (nonpos_b && bb > 0) {
        bb = 0;
        a = sqq > 0 ? sxq / sqq : 0;
    }
    if (a < 0) a = 0;
    double err = 0;
    for (int i = 0; i < n; i++) {
        double e = a * q[i] + bb - x[i];
        err += e * e;
    }
    *pa = (float)a;
    *pb = (float)bb;
    return (float)err;
}

/* Best x ~ a*q + b (a >= 0) over 32 values for codes q in 0..levels: grid spacings around (max - lo)/levels are tried,
 * each refit by least squares (fit_affine), the best kept. `nonpos`: b <= 0 and lo = min(0, min x) (the K-quants'
 * x = scale*q - min with min >= 0); else b free and lo = min x (Q4_1 / Q5_1). A constant block gets a = 0, b = lo. */
static void affine_grid_fit(const float *x, int levels, int nonpos, float *pa, float *pb) {
    float lo = nonpos ? 0 : FLT_MAX, hi = -FLT_MAX;
    for (int i = 0; i < 32; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    float best_err = FLT_MAX, best_a = 0, best_b = lo;
    if (hi > lo) {
        int q[32];
        for (int t = -8; t <= 12; t++) {
            float iscale = ((float)levels + 0.1f * (float)t) / (hi - lo);
            for (int i = 0; i < 32; i++) q[i] = qround((x[i] - lo) * iscale, 0, levels);
            float a, b;
            float err = fit_affine(x, q, 32, nonpos, &a, &b);
            if (err < best_err) best_err = err, best_a = a, best_b = b;
        }
    }
    *pa = best_a;
    *pb = best_b;
}

/* The super-block scales of a K-quant block (Q4_K / Q5_K: levels 15 / 31): each sub-block's fit, then d and dmin
 * (f16) and the 6-bit codes sc, m of each sub-block as stored (packed into scales[12]). */
static void kq_block_scales(const float *x, int levels, uint16_t *pd, uint16_t *pdmin, uint8_t scales[12], int sc[8],
                            int m[8]) {
    float scale[8], min[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float b;
        affine_grid_fit(x + 32 * j, levels, 1, &scale[j], &b);
        min[j] = -b;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, min[j]);
    }
    *pd = g3_f32_to_f16(max_scale / 63.0f);
    *pdmin = g3_f32_to_f16(max_min / 63.0f);
    float d = g3_f16_to_f32(*pd), dmin = g3_f16_to_f32(*pdmin);
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0 ? qround(scale[j] / d, 0, 63) : 0;
        m[j] = dmin > 0 ? qround(min[j] / dmin, 0, 63) : 0;
    }
    q4k_pack_scales(sc, m, scales);
}

/* Q4_K / Q5_K (qh not NULL): the block scales, then each value's code against the scales as stored; Q5_K's fifth
 * bit of value l of sub-block j is bit j of qh[l]. Both blocks start d, dmin, scales[12]. */
static void quant_kq(const float *x, int levels, uint16_t *pd, uint16_t *pdmin, uint8_t scales[12], uint8_t *qh,
                     uint8_t qs[128]) {
    int sc[8], m[8];
    kq_block_scales(x, levels, pd, pdmin, scales, sc, m);
    float d = g3_f16_to_f32(*pd), dmin = g3_f16_to_f32(*pdmin);
    memset(qs, 0, 128);
    if (qh) memset(qh, 0, 32);
    for (int j = 0; j < 8; j++) {
        float s = d * (float)sc[j], mm = dmin * (float)m[j];
        float is = s > 0 ? 1.0f / s : 0.0f;
        uint8_t *q = qs + 32 * (j / 2);
        for (int l = 0; l < 32; l++) {
            int v = qround((x[32 * j + l] + mm) * is, 0, levels);
            q[l] |= (uint8_t)((v & 0x0F) << (4 * (j & 1)));
            if (qh) qh[l] |= (uint8_t)((v >> 4) << j);
        }
    }
}

/* Q5_0: x = d*(q-16), q in 0..31: Q4_0's search over twice the levels. */
static void quant_q5_0(const float *x, g3_block_q5_0 *b) {
    float best_d = sym_scale_search(x, 16);
    b->d = g3_f32_to_f16(best_d);
    float id = best_d != 0 ? 1.0f / best_d : 0.0f;
    uint32_t qh = 0;
    memset(b->qs, 0, sizeof b->qs);
    for (int j = 0; j < 32; j++) {
        int q = qround(x[j] * id, -16, 15) + 16;
        b->qs[j % 16] |= (uint8_t)((q & 0x0F) << (4 * (j / 16)));
        qh |= (uint32_t)(q >> 4) << j;
    }
    memcpy(b->qh, &qh, 4);
}

/* Q4_1 / Q5_1: x = d*q + m, q in 0..levels (15 or 31), both f16: the grid fit, then the codes taken against the
 * scale and offset as stored. */
static void quant_affine32(const float *x, int levels, uint16_t *pd, uint16_t *pm, uint8_t qs[16], uint8_t *qh) {
    float best_a, best_b;
    affine_grid_fit(x, levels, 0, &best_a, &best_b);
    *pd = g3_f32_to_f16(best_a);
    *pm = g3_f32_to_f16(best_b);
    float d = g3_f16_to_f32(*pd), m = g3_f16_to_f32(*pm), id = d > 0 ? 1.0f / d : 0.0f;
    uint32_t h = 0;
    memset(qs, 0, 16);
    for (int j = 0; j < 32; j++) {
        int v = qround((x[j] - m) * id, 0, levels);
        qs[j % 16] |= (uint8_t)((v & 0x0F) << (4 * (j / 16)));
        h |= (uint32_t)(v >> 4) << j;
    }
    if (qh) memcpy(qh, &h, 4);
}


/* Best signed scale for one Q6_K group of 16 values: x ~ s*q, q in -32..31. The largest-magnitude value is put
 * near either end of the code range, and s is refit by least squares for each candidate. */
static float q6k_sub_fit(const float *x) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), vmax = x[i];
    if (amax == 0) return 0;
    float best_err = FLT_MAX, best_s = 0;
    for (int t = -12; t <= 12; t++) {
        for (int side = 0; side < 2; side++) {
            float target = side ? -(32.0f + 0.25f * (float)t) : (31.0f + 0.25f * (float)t);
            if (fabsf(target) < 20) continue;
            float iscale = target / vmax;
            double sxq = 0, sqq = 0;
            int q[16];
            for (int i = 0; i < 16; i++) {
                q[i] = qround(x[i] * iscale, -32, 31);
                sxq += (double)x[i] * q[i];
                sqq += (double)q[i] * q[i];
            }
            if (sqq == 0) continue;
            float s = (float)(sxq / sqq), err = 0;
            for (int i = 0; i < 16; i++) {
                float e = s * (float)q[i] - x[i];
                err += e * e;
            }
            if (err < best_err) best_err = err, best_s = s;
        }
    }
    return best_s;
}

static void quant_q6_k(const float *x, g3_block_q6_k *b) {
    float s[16], amax = 0;
    for (int j = 0; j < 16; j++) {
        s[j] = q6k_sub_fit(x + 16 * j);
        amax = fmaxf(amax, fabsf(s[j]));
    }
    b->d = g3_f32_to_f16(amax / 127.0f);
    float d = g3_f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) b->scales[j] = (int8_t)(d > 0 ? qround(s[j] / d, -128, 127) : 0);
    uint8_t L[256];
    for (int j = 0; j < 16; j++) {
        float sd = d * (float)b->scales[j];
        float is = sd != 0 ? 1.0f / sd : 0.0f;
        for (int i = 0; i < 16; i++) L[16 * j + i] = (uint8_t)(qround(x[16 * j + i] * is, -32, 31) + 32);
    }
    memset(b->ql, 0, sizeof b->ql);
    memset(b->qh, 0, sizeof b->qh);
    for (int e = 0; e < 256; e++) {
        int half = e / 128, r = e % 128, g = r / 32, l = r % 32;
        b->ql[64 * half + l + 32 * (g & 1)] |= (uint8_t)((L[e] & 0x0F) << (4 * (g >> 1)));
        b->qh[32 * half + l] |= (uint8_t)((L[e] >> 4) << (2 * g));
    }
}

g3_status g3_quantize_row(uint32_t type, const float *src, void *dst, int64_t k, g3_error *err) {
    const g3_dtype_info *t = g3_dtype_get(type);
    if (!t) return g3_fail(err, G3_ERR_UNSUPPORTED, "quantize: unknown tensor type %u", (unsigned)type);
    if (k <= 0 || k % t->block)
        return g3_fail(err, G3_ERR_ARG, "quantize: row of %lld values is not a multiple of the %s block (%d)",
                       (long long)k, t->name, t->block);
    if (t->quantized) {
        for (int64_t i = 0; i < k; i++)
            if (!isfinite(src[i]))
                return g3_fail(err, G3_ERR_ARG, "quantize to %s: non-finite value %g at index %lld", t->name,
                               (double)src[i], (long long)i);
    }
    switch (type) {
    case G3_DTYPE_F32: memcpy(dst, src, (size_t)k * 4); break;
    case G3_DTYPE_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < k; i++) d[i] = g3_f32_to_f16(src[i]);
        break;
    }
    case G3_DTYPE_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < k; i++) d[i] = g3_f32_to_bf16(src[i]);
        break;
    }
    case G3_DTYPE_Q8_0:
        for (int64_t i = 0; i < k / 32; i++) quant_q8_0(src + 32 * i, (g3_block_q8_0 *)dst + i);
        break;
    case G3_DTYPE_Q4_0:
        for (int64_t i = 0; i < k / 32; i++) quant_q4_0(src + 32 * i, (g3_block_q4_0 *)dst + i);
        break;
    case G3_DTYPE_Q4_K:
        for (int64_t i = 0; i < k / 256; i++) {
            g3_block_q4_k *b = (g3_block_q4_k *)dst + i;
            quant_kq(src + 256 * i, 15, &b->d, &b->dmin, b->scales, NULL, b->qs);
        }
        break;
    case G3_DTYPE_Q6_K:
        for (int64_t i = 0; i < k / 256; i++) quant_q6_k(src + 256 * i, (g3_block_q6_k *)dst + i);
        break;
    case G3_DTYPE_Q5_0:
        for (int64_t i = 0; i < k / 32; i++) quant_q5_0(src + 32 * i, (g3_block_q5_0 *)dst + i);
        break;
    case G3_DTYPE_Q4_1:
        for (int64_t i = 0; i < k / 32; i++) {
            g3_block_q4_1 *b = (g3_block_q4_1 *)dst + i;
            quant_affine32(src + 32 * i, 15, &b->d, &b->m, b->qs, NULL);
        }
        break;
    case G3_DTYPE_Q5_1:
        for (int64_t i = 0; i < k / 32; i++) {
            g3_block_q5_1 *b = (g3_block_q5_1 *)dst + i;
            quant_affine32(src + 32 * i, 31, &b->d, &b->m, b->qs, b->qh);
        }
        break;
    case G3_DTYPE_Q5_K:
        for (int64_t i = 0; i < k / 256; i++) {
            g3_block_q5_k *b = (g3_block_q5_k *)dst + i;
            quant_kq(src + 256 * i, 31, &b->d, &b->dmin, b->scales, b->qh, b->qs);
        }
        break;
    default: return g3_fail(err, G3_ERR_UNSUPPORTED, "quantize: no quantizer for %s", t->name);
    }
    return G3_OK;
}
