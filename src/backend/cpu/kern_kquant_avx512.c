/* AVX-512 kernels for the K-quants (Q4_K, Q5_K, Q6_K) as stored, against Q8K activations (used where a matrix is not
 * repacked: kern_avx512.c's *_R8 kernels take every matrix of a multiple of 8 rows): 64 values per zmm, maddubs -> i16
 * pairs, madd with the sub-block scales -> i32; up to 8 activation rows share each unpacked weight block.
 * Registered in kern_avx512.c's kernel set (which checks the CPU). */
#if defined(__x86_64__) || defined(__i386__)

#include "backend/cpu/kern_simd.h"

void g3_avx512_tile_q4_k(const g3_tile *t);
void g3_avx512_tile_q6_k(const g3_tile *t);
void g3_avx512_tile_q5_k(const g3_tile *t);

/* ---- Q4_K weights x Q8K activations, 64 values per zmm ------------------------------------------------------
 * The 12 packed scale bytes are decoded with 32-bit word arithmetic; per 64 values (sub-blocks 2c, 2c+1, which
 * share 32 bytes of nibbles) maddubs -> i16 pairs, madd with the two sub-block scales -> i32. The mins meet the
 * activation's sums of 16 through one 256-bit madd. */

AI void q4k_scales8(const uint8_t *s, uint64_t *sc8, uint64_t *mn8) {
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    uint32_t sc_lo = a & 0x3f3f3f3fu, mn_lo = b & 0x3f3f3f3fu;
    uint32_t sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    *sc8 = sc_lo | (uint64_t)sc_hi << 32;
    *mn8 = mn_lo | (uint64_t)mn_hi << 32;
}

/* FIVE: Q5_K, whose fifth bit of value l of sub-block j is bit j of qh[l] (the 32 bytes after the scales). */
AI void mk_qk_512(const g3_tile *t, int i0, int j0, const int MR, const int FIVE) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i sel[4]; /* int16 lanes 0-15 take scale 2c, lanes 16-31 scale 2c+1 */
    _Pragma("GCC unroll 4")
    for (int c = 0; c < 4; c++)
        sel[c] = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * c)), _mm512_set1_epi16((short)(2 * c + 1)));
    __m512 acc[G3_MRX];
    __m256 accm[G3_MRX];
    /* Q4_K: f16 d, dmin; scales[12]; qs[128] (144 bytes). Q5_K: the same with qh[32] before qs (176 bytes). */
    const size_t BB = FIVE ? 176 : 144, QS = FIVE ? 48 : 16;
    const uint8_t *wb = t->w + (size_t)j0 * t->ws;
    const int8_t *xq[G3_MRX];
    const uint8_t *xd[G3_MRX], *xe[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        size_t o = (size_t)(i0 + r) * t->xs;
        xq[r] = (const int8_t *)(t->xq + o), xd[r] = t->xd + o, xe[r] = t->xe + o;
        acc[r] = _mm512_setzero_ps();
        accm[r] = _mm256_setzero_ps();
    }
    for (int b = 0; b < t->k / 256; b++) {
        const uint8_t *blk = wb + BB * (size_t)b;
        _Pragma("GCC unroll 4")
        for (size_t o = 0; o < BB; o += 64) _mm_prefetch((const char *)blk + 7 * BB + o, _MM_HINT_T0);
        uint64_t sc8, mn8;
        q4k_scales8(blk + 4, &sc8, &mn8);
        __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
        __m256i mn16 = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
        __m512i q[4], scv[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk + QS + 32 * c));
            q[c] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), m4);
            if (FIVE) { /* bit 2c of qh[l] for value l of sub-block 2c, bit 2c+1 for sub-block 2c+1, moved to bit 4 */
                __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 16));
                __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(hb, 2 * c)),
                                               _mm256_srli_epi16(hb, 2 * c + 1), 1);
                q[c] = _mm512_or_si512(q[c], _mm512_and_si512(_mm512_slli_epi16(h, 4), _mm512_set1_epi8(0x10)));
            }
            scv[c] = _mm512_permutexvar_epi16(sel[c], sc16);
        }
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        float d = _cvtsh_ss(dh), dmin = _cvtsh_ss(mh);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            const int8_t *x = xq[r] + 256 * b;
            __m512i sumi = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++) {
                __m512i p = _mm512_maddubs_epi16(q[c], _mm512_loadu_si512(x + 64 * c));
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, scv[c]));
            }
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xe[r] + 32 * (size_t)b));
            float dx = ld_f32(xd[r] + 4 * (size_t)b);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d * dx), acc[r]);
            accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mn16)), _mm256_set1_ps(dmin * dx), accm[r]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) put_y(t, i0 + r, j0, _mm512_reduce_add_ps(acc[r]) - hsum256(accm[r]));
}

#define MK_Q4_K(t, i, j, MR, NR) mk_qk_512(t, i, j, MR, 0)
#define MK_Q5_K(t, i, j, MR, NR) mk_qk_512(t, i, j, MR, 1)
void g3_avx512_tile_q4_k(const g3_tile *t) { G3_TILE_WALK(t, MK_Q4_K, 8, 1, 1); }
void g3_avx512_tile_q5_k(const g3_tile *t) { G3_TILE_WALK(t, MK_Q5_K, 8, 1, 1); }

/* ---- Q6_K weights x Q8K activations, 64 values per zmm ------------------------------------------------------
 * Each half of a block (128 values) is 64 bytes of low nibbles and 32 bytes of 2-bit high parts: values 0-63
 * are the low nibbles of ql[0..63] with qh bits 0-1 (first 32) and 2-3 (next 32); values 64-127 the high
 * nibbles with qh bits 4-5 and 6-7. The -32 offset is taken off through the activation's sums of 16. */

static const int16_t k_lane_div8[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

AI void mk_q6_k_512(const g3_tile *t, int i0, int j0, const int MR, const int NR) {
    (void)NR;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    __m512i sel[4]; /* int16 lane 8q+e of zmm i takes scale 4i+q */
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++)
        sel[i] = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * i)), _mm512_loadu_si512(k_lane_div8));
    __m512 acc[G3_MRX];
    const g3_block_q6_k *wb = (const g3_block_q6_k *)(t->w + (size_t)j0 * t->ws);
    const int8_t *xq[G3_MRX];
    const uint8_t *xd[G3_MRX], *xe[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        size_t o = (size_t)(i0 + r) * t->xs;
        xq[r] = (const int8_t *)(t->xq + o), xd[r] = t->xd + o, xe[r] = t->xe + o;
        acc[r] = _mm512_setzero_ps();
    }
    for (int b = 0; b < t->k / 256; b++) {
        _Pragma("GCC unroll 4")
        for (int o = 0; o < 256; o += 64) _mm_prefetch((const char *)(wb + b) + 1024 + o, _MM_HINT_T0);
        __m512i q[4], scv[4];
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            __m512i l = _mm512_loadu_si512(wb[b].ql + 64 * h);
            __m256i hb = _mm256_loadu_si256((const __m256i *)(wb[b].qh + 32 * h));
            __m512i h01 = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
            __m512i h23 = _mm512_srli_epi16(h01, 4);
            q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(h01, m3), 4));
            q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                           _mm512_slli_epi16(_mm512_and_si512(h23, m3), 4));
        }
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb[b].scales));
        _Pragma("GCC unroll 4")
        for (int i = 0; i < 4; i++) scv[i] = _mm512_permutexvar_epi16(sel[i], _mm512_castsi256_si512(sc16));
        float d = _cvtsh_ss(wb[b].d);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            const int8_t *x = xq[r] + 256 * b;
            __m512i sumi = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int i = 0; i < 4; i++) {
                __m512i p = _mm512_maddubs_epi16(q[i], _mm512_loadu_si512(x + 64 * i));
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, scv[i]));
            }
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xe[r] + 32 * (size_t)b));
            __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
            sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(corr));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d * ld_f32(xd[r] + 4 * (size_t)b)),
                                     acc[r]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) put_y(t, i0 + r, j0, _mm512_reduce_add_ps(acc[r]));
}

void g3_avx512_tile_q6_k(const g3_tile *t) { G3_TILE_WALK(t, mk_q6_k_512, 8, 1, 1); }

#else
typedef int g3_kern_kquant_avx512_empty; /* keeps the translation unit non-empty */
#endif
