/* Helpers shared by the x86 kernel files (kern_avx2.c, kern_avx512.c), compiled into each with its own
 * instruction set: the tile walker that turns a tile into register-blocked micro-kernel calls with compile-time
 * shapes, horizontal sums, result stores, and the K-quant kernels (AVX2 maddubs based, which AVX-512 builds
 * reuse with EVEX encodings and 32 registers). Include only from those files. */
#ifndef G3_BACKEND_CPU_KERN_SIMD_H
#define G3_BACKEND_CPU_KERN_SIMD_H

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "model/dtype.h"

#define AI static inline __attribute__((always_inline))

/* Largest micro-kernel shape: arrays are sized for it, and the compile-time MR x NR part is used. */
#define G3_MRX 8
#define G3_NRX 4

AI float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI void put_y(const g3_tile *t, int i, int j, float v) {
    float *y = t->y + (size_t)i * t->ldy + j;
    *y = t->accumulate ? *y + v : v;
}

AI float ld_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

AI float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Walks a tile (MRP <= 8): groups of NRP weight rows (outer, stay in L1) x groups of MRP activation rows (inner). The
 * micro-kernel MK(t, i0, j0, MR, NR) gets literal shapes so that its accumulators live in registers. A single
 * activation row (decode) uses NRD weight rows per call. */
#define G3_TILE_WALK(t, MK, MRP, NRP, NRD)                                                                      \
    do {                                                                                                        \
        if ((t)->nx == 1) {                                                                                     \
            int j_ = 0;                                                                                         \
            for (; j_ + (NRD) <= (t)->nw; j_ += (NRD)) MK(t, 0, j_, 1, NRD);                                    \
            for (; j_ < (t)->nw; j_++) MK(t, 0, j_, 1, 1);                                                      \
            break;                                                                                              \
        }                                                                                                       \
        int j_ = 0;                                                                                             \
        for (; j_ + (NRP) <= (t)->nw; j_ += (NRP)) {                                                            \
            int i_ = 0;                                                                                         \
            for (; i_ + (MRP) <= (t)->nx; i_ += (MRP)) MK(t, i_, j_, MRP, NRP);                                 \
            switch ((t)->nx - i_) {                                                                             \
            case 7: MK(t, i_, j_, 7, NRP); break;                                                               \
            case 6: MK(t, i_, j_, 6, NRP); break;                                                               \
            case 5: MK(t, i_, j_, 5, NRP); break;                                                               \
            case 4: MK(t, i_, j_, 4, NRP); break;                                                               \
            case 3: MK(t, i_, j_, 3, NRP); break;                                                               \
            case 2: MK(t, i_, j_, 2, NRP); break;                                                               \
            case 1: MK(t, i_, j_, 1, NRP); break;                                                               \
            default: break;                                                                                     \
            }                                                                                                   \
        }                                                                                                       \
        for (; j_ < (t)->nw; j_++) {                                                                            \
            int i_ = 0;                                                                                         \
            for (; i_ + (MRP) <= (t)->nx; i_ += (MRP)) MK(t, i_, j_, MRP, 1);                                   \
            for (; i_ < (t)->nx; i_++) MK(t, i_, j_, 1, 1);                                                     \
        }                                                                                                       \
    } while (0)

/* The same with the activation rows outer: a group of MRP activation rows stays in L1 while the tile's weight rows
 * (which the driver keeps to an L2-sized block) stream past it. */
#define G3_TILE_WALK_XO(t, MK, MRP, NRP, NRD)                                                                   \
    do {                                                                                                        \
        if ((t)->nx == 1) {                                                                                     \
            int j_ = 0;                                                                                         \
            for (; j_ + (NRD) <= (t)->nw; j_ += (NRD)) MK(t, 0, j_, 1, NRD);                                    \
            for (; j_ < (t)->nw; j_++) MK(t, 0, j_, 1, 1);                                                      \
            break;                                                                                              \
        }                                                                                                       \
        int i_ = 0;                                                                                             \
        for (; i_ + (MRP) <= (t)->nx; i_ += (MRP)) {                                                            \
            int j_ = 0;                                                                                         \
            for (; j_ + (NRP) <= (t)->nw; j_ += (NRP)) MK(t, i_, j_, MRP, NRP);                                 \
            for (; j_ < (t)->nw; j_++) MK(t, i_, j_, MRP, 1);                                                   \
        }                                                                                                       \
        if (i_ < (t)->nx) {                                                                                     \
            int j_ = 0;                                                                                         \
            for (; j_ + (NRP) <= (t)->nw; j_ += (NRP)) {                                                        \
                switch ((t)->nx - i_) {                                                                         \
                case 7: MK(t, i_, j_, 7, NRP); break;                                                           \
                case 6: MK(t, i_, j_, 6, NRP); break;                                                           \
                case 5: MK(t, i_, j_, 5, NRP); break;                                                           \
                case 4: MK(t, i_, j_, 4, NRP); break;                                                           \
                case 3: MK(t, i_, j_, 3, NRP); break;                                                           \
                case 2: MK(t, i_, j_, 2, NRP); break;                                                           \
                case 1: MK(t, i_, j_, 1, NRP); break;                                                           \
                default: break;                                                                                 \
                }                                                                                               \
            }                                                                                                   \
            for (; j_ < (t)->nw; j_++)                                                                          \
                for (int r_ = i_; r_ < (t)->nx; r_++) MK(t, r_, j_, 1, 1);                                      \
        }                                                                                                       \
    } while (0)

/* ---- K-quants against Q8K activations (one weight row, MR activation rows) ---------------------------------- */

/* The 8 scales and 8 mins of a Q4_K block as 16-bit values. */
AI void q4k_unpack_scales(const uint8_t *s, int16_t sc[8], int16_t mn[8]) {
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (int16_t)((s[j + 8] & 0x0F) | ((s[j] >> 6) << 4));
        mn[j + 4] = (int16_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

/* Q4_K, or with FIVE Q5_K (qh[32] after the scales: the fifth bit of value l of sub-block j is bit j of qh[l]) */
AI void mk_qk(const g3_tile *t, int i0, int j0, const int MR, const int FIVE) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const size_t BB = FIVE ? 176 : 144, QS = FIVE ? 48 : 16;
    __m256 acc[G3_MRX], accm[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    const uint8_t *wb = t->w + (size_t)j0 * t->ws;
    const int8_t *xq[G3_MRX];
    const uint8_t *xd[G3_MRX], *xe[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        size_t o = (size_t)(i0 + r) * t->xs;
        xq[r] = (const int8_t *)(t->xq + o), xd[r] = t->xd + o, xe[r] = t->xe + o;
    }
    for (int b = 0; b < t->k / 256; b++) {
        const uint8_t *blk = wb + BB * (size_t)b;
        int16_t sc[8], mn[8];
        q4k_unpack_scales(blk + 4, sc, mn);
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        float d = _cvtsh_ss(dh), dmin = _cvtsh_ss(mh);
        __m256i q[8]; /* the 256 values, 32 per register, in order */
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk + QS + 32 * c));
            q[2 * c] = _mm256_and_si256(v, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (FIVE) {
                __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 16));
                q[2 * c] = _mm256_or_si256(q[2 * c], _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(hb, 2 * c), 4), b4));
                q[2 * c + 1] = _mm256_or_si256(q[2 * c + 1],
                                               _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(hb, 2 * c + 1), 4), b4));
            }
        }
        /* mins paired with the 16 sums of 16: each min appears twice */
        __m256i mn16 = _mm256_setr_epi16(mn[0], mn[0], mn[1], mn[1], mn[2], mn[2], mn[3], mn[3], mn[4], mn[4], mn[5],
                                         mn[5], mn[6], mn[6], mn[7], mn[7]);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            const int8_t *x = xq[r] + 256 * b;
            __m256i sumi = _mm256_setzero_si256();
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++) {
                __m256i p = _mm256_maddubs_epi16(q[j], _mm256_loadu_si256((const __m256i *)(x + 32 * j)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(sc[j])));
            }
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xe[r] + 32 * (size_t)b));
            __m256i summ = _mm256_madd_epi16(bs, mn16);
            float dx = ld_f32(xd[r] + 4 * (size_t)b);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d * dx), acc[r]);
            accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_set1_ps(dmin * dx), accm[r]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) put_y(t, i0 + r, j0, hsum256(_mm256_sub_ps(acc[r], accm[r])));
}
#define G3_MK_Q4_K(t, i, j, MR, NR) mk_qk(t, i, j, MR, 0)
#define G3_MK_Q5_K(t, i, j, MR, NR) mk_qk(t, i, j, MR, 1)

AI void mk_q6_k(const g3_tile *t, int i0, int j0, const int MR, const int NR) {
    (void)NR;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256 acc[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();
    const g3_block_q6_k *wb = (const g3_block_q6_k *)(t->w + (size_t)j0 * t->ws);
    const int8_t *xq[G3_MRX];
    const uint8_t *xd[G3_MRX], *xe[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        size_t o = (size_t)(i0 + r) * t->xs;
        xq[r] = (const int8_t *)(t->xq + o), xd[r] = t->xd + o, xe[r] = t->xe + o;
    }
    for (int b = 0; b < t->k / 256; b++) {
        __m256i q[8], scv[8]; /* 6-bit values 0..63 in order, 32 per register; scales per 16 as int16 */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = wb[b].ql + 64 * h, *qh = wb[b].qh + 32 * h;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
        }
        const int8_t *s = wb[b].scales;
        _Pragma("GCC unroll 8")
        for (int g = 0; g < 8; g++) /* lanes 0-7: group 2g, lanes 8-15: group 2g+1 */
            scv[g] = _mm256_setr_epi16(s[2 * g], s[2 * g], s[2 * g], s[2 * g], s[2 * g], s[2 * g], s[2 * g], s[2 * g],
                                       s[2 * g + 1], s[2 * g + 1], s[2 * g + 1], s[2 * g + 1], s[2 * g + 1],
                                       s[2 * g + 1], s[2 * g + 1], s[2 * g + 1]);
        __m256i sc16 = _mm256_setr_epi16(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11],
                                         s[12], s[13], s[14], s[15]);
        float d = _cvtsh_ss(wb[b].d);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            const int8_t *x = xq[r] + 256 * b;
            __m256i sumi = _mm256_setzero_si256();
            _Pragma("GCC unroll 8")
            for (int g = 0; g < 8; g++) {
                __m256i p = _mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *)(x + 32 * g)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scv[g]));
            }
            /* the -32 offset: sum_j sc_j * 32 * bsum_j */
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xe[r] + 32 * (size_t)b));
            __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
            sumi = _mm256_sub_epi32(sumi, corr);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d * ld_f32(xd[r] + 4 * (size_t)b)),
                                     acc[r]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) put_y(t, i0 + r, j0, hsum256(acc[r]));
}

#define G3_Q4K_TILE(name) static void name(const g3_tile *t) { G3_TILE_WALK(t, G3_MK_Q4_K, 4, 1, 1); }
#define G3_Q5K_TILE(name) static void name(const g3_tile *t) { G3_TILE_WALK(t, G3_MK_Q5_K, 4, 1, 1); }
#define G3_Q6K_TILE(name) static void name(const g3_tile *t) { G3_TILE_WALK(t, mk_q6_k, 4, 1, 1); }

#endif
