/* Portable C reference kernels for every weight type (see kernels.h for the tile contract and activation
 * layouts). They are the fallback on any CPU and the yardstick the SIMD kernels are tested against: integer
 * block dot products are exact, float sums use four partial accumulators. */
#include <string.h>

#include "backend/cpu/kernels.h"
#include "core/fp16.h"
#include "model/dtype.h"

static void put(const g3_tile *t, int i, int j, float v) {
    float *y = t->y + (size_t)i * t->ldy + j;
    *y = t->accumulate ? *y + v : v;
}

static float ld_f32(const uint8_t *p, int idx) {
    float v;
    memcpy(&v, p + 4 * (size_t)idx, 4);
    return v;
}

static uint16_t ld_u16(const uint8_t *p, int idx) {
    uint16_t v;
    memcpy(&v, p + 2 * (size_t)idx, 2);
    return v;
}

/* Float weights against float activations (BF16X2 is not used by this set). One loop per type, so that the
 * conversion is not re-decided per element. */
#define DOT4(conv)                                                                                              \
    do {                                                                                                        \
        for (; i + 4 <= k; i += 4) {                                                                            \
            s0 += conv(i) * ld_f32(x, i);                                                                       \
            s1 += conv(i + 1) * ld_f32(x, i + 1);                                                               \
            s2 += conv(i + 2) * ld_f32(x, i + 2);                                                               \
            s3 += conv(i + 3) * ld_f32(x, i + 3);                                                               \
        }                                                                                                       \
        for (; i < k; i++) s0 += conv(i) * ld_f32(x, i);                                                        \
    } while (0)

static float dot_float(uint32_t wtype, const uint8_t *w, const uint8_t *x, int k) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
#define W_F32(i) ld_f32(w, i)
#define W_F16(i) g3_f16_to_f32(ld_u16(w, i))
#define W_BF16(i) g3_bf16_to_f32(ld_u16(w, i))
    if (wtype == G3_DTYPE_F32) DOT4(W_F32);
    else if (wtype == G3_DTYPE_F16) DOT4(W_F16);
    else DOT4(W_BF16);
    return (s0 + s1) + (s2 + s3);
}

#define FLOAT_TILE(name, wtype)                                                                                 \
    static void name(const g3_tile *t) {                                                                       \
        for (int i = 0; i < t->nx; i++)                                                                        \
            for (int j = 0; j < t->nw; j++)                                                                    \
                put(t, i, j, dot_float(wtype, t->w + (size_t)j * t->ws, t->xq + (size_t)i * t->xs, t->k));      \
    }
FLOAT_TILE(tile_f32, G3_DTYPE_F32)
FLOAT_TILE(tile_f16, G3_DTYPE_F16)
FLOAT_TILE(tile_bf16, G3_DTYPE_BF16)

/* Q8_0 weights x Q8U activations: x = dx*(u - 128). */
static void tile_q8_0(const g3_tile *t) {
    int nb = t->k / 32;
    for (int i = 0; i < t->nx; i++) {
        const uint8_t *xq = t->xq + (size_t)i * t->xs, *xd = t->xd + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const g3_block_q8_0 *b = (const g3_block_q8_0 *)(t->w + (size_t)j * t->ws);
            float s = 0;
            for (int bi = 0; bi < nb; bi++) {
                int sum = 0;
                for (int l = 0; l < 32; l++) sum += b[bi].qs[l] * ((int)xq[32 * bi + l] - 128);
                s += (float)sum * (g3_f16_to_f32(b[bi].d) * ld_f32(xd, bi));
            }
            put(t, i, j, s);
        }
    }
}

/* Q4_0 weights x Q8S activations. */
static void tile_q4_0(const g3_tile *t) {
    int nb = t->k / 32;
    for (int i = 0; i < t->nx; i++) {
        const int8_t *xq = (const int8_t *)(t->xq + (size_t)i * t->xs);
        const uint8_t *xd = t->xd + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const g3_block_q4_0 *b = (const g3_block_q4_0 *)(t->w + (size_t)j * t->ws);
            float s = 0;
            for (int bi = 0; bi < nb; bi++) {
                int sum = 0;
                for (int l = 0; l < 16; l++) {
                    sum += ((b[bi].qs[l] & 0x0F) - 8) * xq[32 * bi + l];
                    sum += ((b[bi].qs[l] >> 4) - 8) * xq[32 * bi + l + 16];
                }
                s += (float)sum * (g3_f16_to_f32(b[bi].d) * ld_f32(xd, bi));
            }
            put(t, i, j, s);
        }
    }
}

/* Q4_1 / Q5_0 / Q5_1 weights x Q8S activations. Codes q (0..15 or 0..31) with x = d*q + m (Q5_0: m = -16 d):
 * sum = dx*(d*sum(q*xq) + m*sum(xq)), and sum(xq) = -negsum. */
static void tile_q4q5(const g3_tile *t, uint32_t wtype) {
    const int nb = t->k / 32, five = wtype != G3_DTYPE_Q4_1, has_m = wtype != G3_DTYPE_Q5_0;
    const size_t bb = wtype == G3_DTYPE_Q4_1 ? 20 : wtype == G3_DTYPE_Q5_0 ? 22 : 24, qs_at = bb - 16;
    for (int i = 0; i < t->nx; i++) {
        const int8_t *xq = (const int8_t *)(t->xq + (size_t)i * t->xs);
        const uint8_t *xd = t->xd + (size_t)i * t->xs, *xe = t->xe + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const uint8_t *row = t->w + (size_t)j * t->ws;
            float s = 0;
            for (int bi = 0; bi < nb; bi++) {
                const uint8_t *blk = row + bb * (size_t)bi;
                uint32_t qh = 0;
                if (five) memcpy(&qh, blk + qs_at - 4, 4);
                int sum = 0;
                for (int l = 0; l < 32; l++) sum += g3_q5_code(blk + qs_at, qh, l) * xq[32 * bi + l];
                int32_t negsum;
                memcpy(&negsum, xe + 4 * (size_t)bi, 4);
                float d = g3_f16_to_f32(ld_u16(blk, 0)), m = has_m ? g3_f16_to_f32(ld_u16(blk, 1)) : -16.0f * d;
                s += ld_f32(xd, bi) * (d * (float)sum - m * (float)negsum);
            }
            put(t, i, j, s);
        }
    }
}

static void tile_q4_1(const g3_tile *t) { tile_q4q5(t, G3_DTYPE_Q4_1); }
static void tile_q5_0(const g3_tile *t) { tile_q4q5(t, G3_DTYPE_Q5_0); }
static void tile_q5_1(const g3_tile *t) { tile_q4q5(t, G3_DTYPE_Q5_1); }

/* Q4_K weights x Q8K activations: per 256 values, sum_j sc_j*dot_j*d*dx - dmin*dx*sum_j m_j*xsum_j. With `five`,
 * Q5_K: the same with qh[32] before qs (g3_kq_code). */
static void tile_qk(const g3_tile *t, int five) {
    const int nb = t->k / 256;
    const size_t bb = five ? 176 : 144, qs_at = five ? 48 : 16;
    for (int i = 0; i < t->nx; i++) {
        const int8_t *xq = (const int8_t *)(t->xq + (size_t)i * t->xs);
        const uint8_t *xd = t->xd + (size_t)i * t->xs, *xe = t->xe + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const uint8_t *row = t->w + (size_t)j * t->ws;
            float s = 0;
            for (int bi = 0; bi < nb; bi++) {
                const uint8_t *blk = row + bb * (size_t)bi, *sc = blk + 4, *qh = five ? blk + 16 : NULL;
                const int8_t *x = xq + 256 * bi;
                int sumi = 0, summ = 0;
                for (int sb = 0; sb < 8; sb++) {
                    int scv, mv;
                    g3_kq_scale_min(sc, sb, &scv, &mv);
                    int dot = 0;
                    for (int l = 0; l < 32; l++) dot += g3_kq_code(blk + qs_at, qh, 32 * sb + l) * x[32 * sb + l];
                    sumi += scv * dot;
                    int16_t b0, b1;
                    memcpy(&b0, xe + 2 * (size_t)(16 * bi + 2 * sb), 2);
                    memcpy(&b1, xe + 2 * (size_t)(16 * bi + 2 * sb + 1), 2);
                    summ += mv * (b0 + b1);
                }
                float dx = ld_f32(xd, bi);
                s += dx * (g3_f16_to_f32(ld_u16(blk, 0)) * (float)sumi - g3_f16_to_f32(ld_u16(blk, 1)) * (float)summ);
            }
            put(t, i, j, s);
        }
    }
}

static void tile_q4_k(const g3_tile *t) { tile_qk(t, 0); }
static void tile_q5_k(const g3_tile *t) { tile_qk(t, 1); }

/* Q6_K weights x Q8K activations: per 256 values, d*dx*sum_j sc_j*sum_l (q-32)*x. */
static void tile_q6_k(const g3_tile *t) {
    int nb = t->k / 256;
    for (int i = 0; i < t->nx; i++) {
        const int8_t *xq = (const int8_t *)(t->xq + (size_t)i * t->xs);
        const uint8_t *xd = t->xd + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const g3_block_q6_k *b = (const g3_block_q6_k *)(t->w + (size_t)j * t->ws);
            float s = 0;
            for (int bi = 0; bi < nb; bi++) {
                const int8_t *x = xq + 256 * bi;
                int sumi = 0;
                for (int half = 0; half < 2; half++) {
                    const uint8_t *ql = b[bi].ql + 64 * half, *qh = b[bi].qh + 32 * half;
                    for (int g = 0; g < 4; g++) {
                        int d0 = 0, d1 = 0; /* the two groups of 16 in these 32 values */
                        for (int l = 0; l < 32; l++) {
                            int q = ((ql[l + 32 * (g & 1)] >> (4 * (g >> 1))) & 0x0F) | (((qh[l] >> (2 * g)) & 3) << 4);
                            int v = (q - 32) * x[128 * half + 32 * g + l];
                            if (l < 16) d0 += v;
                            else d1 += v;
                        }
                        int sidx = 8 * half + 2 * g;
                        sumi += b[bi].scales[sidx] * d0 + b[bi].scales[sidx + 1] * d1;
                    }
                }
                s += g3_f16_to_f32(b[bi].d) * ld_f32(xd, bi) * (float)sumi;
            }
            put(t, i, j, s);
        }
    }
}

/* Repacked weights x Q8S activations (layouts in matmul.h, offsets in kernels.h): value v of row r of a group's
 * block lives at byte 64*(v/8) + 4*(2r + (v%8)/4) + v%4 of the 8-bit slices (nibble types: nibble v/8 % 2 of slice
 * v/16's byte at the same lane position; Q5: its fifth bit is that lane's bit of mask v/8). */
static void tile_r8(const g3_tile *t, int fm) {
    const int nb = t->k / 32, five = g3_r8_five(fm), aff = g3_r8_aff(fm), qo = g3_r8_qoff(fm), ho = g3_r8_hoff(fm);
    const size_t bb = (size_t)g3_r8_bytes(fm);
    for (int i = 0; i < t->nx; i++) {
        const int8_t *xq = (const int8_t *)(t->xq + (size_t)i * t->xs);
        const uint8_t *xd = t->xd + (size_t)i * t->xs, *xe = t->xe + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const uint8_t *grp = t->w + (size_t)(j / 8) * 8 * t->ws;
            int r = j % 8;
            float s = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = grp + bb * (size_t)b;
                int sum = 0;
                for (int v = 0; v < 32; v++) {
                    int lane = 4 * (2 * r + (v % 8) / 4) + v % 4, q;
                    if (fm == G3_R8_Q8_0) {
                        q = (int)blk[qo + 64 * (v / 8) + lane] - 128;
                    } else {
                        q = (blk[qo + 64 * (v / 16) + lane] >> (4 * ((v / 8) % 2))) & 0x0F;
                        if (five) {
                            uint64_t hm;
                            memcpy(&hm, blk + ho + 8 * (v / 8), 8);
                            q |= (int)((hm >> lane) & 1u) << 4;
                        }
                        if (!aff) q -= five ? 16 : 8;
                    }
                    sum += q * xq[32 * b + v];
                }
                float d = g3_f16_to_f32(ld_u16(blk, r)), dx = ld_f32(xd, b);
                s += (float)sum * (d * dx);
                if (aff) { /* + m * sum(x) = m * dx * -negsum */
                    int32_t ns;
                    memcpy(&ns, xe + 4 * (size_t)b, 4);
                    s -= g3_f16_to_f32(ld_u16(blk, 8 + r)) * dx * (float)ns;
                }
            }
            put(t, i, j, s);
        }
    }
}

static void tile_q8_0_r8(const g3_tile *t) { tile_r8(t, G3_R8_Q8_0); }
static void tile_q4_0_r8(const g3_tile *t) { tile_r8(t, G3_R8_Q4_0); }
static void tile_q5_0_r8(const g3_tile *t) { tile_r8(t, G3_R8_Q5_0); }
static void tile_q4_1_r8(const g3_tile *t) { tile_r8(t, G3_R8_Q4_1); }
static void tile_q5_1_r8(const g3_tile *t) { tile_r8(t, G3_R8_Q5_1); }

/* Q4_K_R8 x Q8K activations: per row, sum over sub-blocks of sc * dot(q, x) times d*dx, minus dmin*dx * sum of
 * m * (the sub-block's activation sum, from the sums of 16) */
static void tile_qk_r8(const g3_tile *t, int five) {
    const int nb = t->k / 256;
    const size_t bb = five ? 1440 : 1184;
    for (int i = 0; i < t->nx; i++) {
        const int8_t *xq = (const int8_t *)(t->xq + (size_t)i * t->xs);
        const uint8_t *xd = t->xd + (size_t)i * t->xs, *xe = t->xe + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const uint8_t *grp = t->w + (size_t)(j / 8) * 8 * t->ws;
            const int r = j % 8;
            float s = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = grp + bb * (size_t)b;
                int sumi = 0, summ = 0;
                for (int sb = 0; sb < 8; sb++) {
                    int dot = 0;
                    for (int v = 0; v < 32; v++) {
                        int lane = 4 * (2 * r + (v % 8) / 4) + v % 4, jj = v / 8;
                        int q = (blk[G3_Q4KR8_Q + 128 * sb + 64 * (jj / 2) + lane] >> (4 * (jj % 2))) & 0x0F;
                        if (five) q |= ((blk[G3_Q5KR8_H + 32 * sb + 8 * jj + lane / 8] >> (lane % 8)) & 1) << 4;
                        dot += q * xq[256 * b + 32 * sb + v];
                    }
                    sumi += blk[G3_Q4KR8_SC + 8 * sb + r] * dot;
                    int16_t b0, b1;
                    memcpy(&b0, xe + 2 * (size_t)(16 * b + 2 * sb), 2);
                    memcpy(&b1, xe + 2 * (size_t)(16 * b + 2 * sb + 1), 2);
                    summ += blk[G3_Q4KR8_M + 32 * (sb % 4 >= 2) + 2 * (2 * r + sb / 4) + (sb & 1)] * (b0 + b1);
                }
                const float dx = ld_f32(xd, b);
                s += dx * (g3_f16_to_f32(ld_u16(blk, r)) * (float)sumi - g3_f16_to_f32(ld_u16(blk, 8 + r)) * (float)summ);
            }
            put(t, i, j, s);
        }
    }
}

static void tile_q4_k_r8(const g3_tile *t) { tile_qk_r8(t, 0); }
static void tile_q5_k_r8(const g3_tile *t) { tile_qk_r8(t, 1); }

/* Q6_K_R8 x Q8K activations: per row, d*dx * sum over groups of 16 of sc * sum (q - 32) x */
static void tile_q6_k_r8(const g3_tile *t) {
    const int nb = t->k / 256;
    for (int i = 0; i < t->nx; i++) {
        const int8_t *xq = (const int8_t *)(t->xq + (size_t)i * t->xs);
        const uint8_t *xd = t->xd + (size_t)i * t->xs;
        for (int j = 0; j < t->nw; j++) {
            const uint8_t *grp = t->w + (size_t)(j / 8) * 8 * t->ws;
            const int r = j % 8;
            float s = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = grp + 1680 * (size_t)b;
                int sumi = 0;
                for (int gi = 0; gi < 16; gi++) {
                    int dot = 0;
                    for (int e = 0; e < 16; e++) {
                        int idx = 16 * gi + e, sb = idx / 32, v = idx % 32, jj = v / 8;
                        int lane = 4 * (2 * r + (v % 8) / 4) + v % 4;
                        int q = ((blk[G3_Q6KR8_Q + 128 * sb + 64 * (jj / 2) + lane] >> (4 * (jj % 2))) & 0x0F) |
                                (((blk[G3_Q6KR8_H + 64 * sb + lane] >> (2 * jj)) & 3) << 4);
                        dot += (q - 32) * xq[256 * b + idx];
                    }
                    sumi += (int8_t)blk[G3_Q6KR8_SC + 8 * gi + r] * dot;
                }
                s += g3_f16_to_f32(ld_u16(blk, r)) * ld_f32(xd, b) * (float)sumi;
            }
            put(t, i, j, s);
        }
    }
}

static const g3_kernel_set set_scalar = {
    .name = "scalar",
    .bf16_layout = G3_ACT_F32,
    .f32 = tile_f32,
    .f16 = tile_f16,
    .bf16 = tile_bf16,
    .q8_0 = tile_q8_0,
    .q4_0 = tile_q4_0,
    .q4_k = tile_q4_k,
    .q6_k = tile_q6_k,
    .q4_1 = tile_q4_1,
    .q5_0 = tile_q5_0,
    .q5_1 = tile_q5_1,
    .q5_k = tile_q5_k,
    .q8_0_r8 = tile_q8_0_r8,
    .q4_0_r8 = tile_q4_0_r8,
    .q5_0_r8 = tile_q5_0_r8,
    .q4_1_r8 = tile_q4_1_r8,
    .q5_1_r8 = tile_q5_1_r8,
    .q4_k_r8 = tile_q4_k_r8,
    .q6_k_r8 = tile_q6_k_r8,
    .q5_k_r8 = tile_q5_k_r8,
};

const g3_kernel_set *g3_kernels_scalar(void) { return &set_scalar; }
