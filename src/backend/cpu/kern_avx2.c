/* AVX2 + FMA + F16C kernels, for x86 CPUs without AVX-512 (16 ymm registers).
 *
 *   F32/F16/BF16  ymm FMA on f32 activations; F16 widened with vcvtph2ps, BF16 by a 16-bit shift
 *   Q8_0          activations stored +128 (Q8U) are flipped back to signed, then the sign trick:
 *                 maddubs(|w|, sign(x, w)) -> i16 pairs (|w|, |x| <= 127, so no saturation), madd -> i32
 *   Q4_0          maddubs(nibble, x) (15 * 127 * 2 fits in i16), madd -> i32, plus -sum(x) per lane for the -8
 *   Q4_1/Q5_0/Q5_1  Q4_0's loop with the fifth bits and the offset m * sum(x)
 *   Q4_K/Q5_K/Q6_K  maddubs kernels from kern_simd.h */
#if defined(__x86_64__) || defined(__i386__)

#include "backend/cpu/kern_simd.h"

enum { WT_F32, WT_F16, WT_BF16 };

AI __m256 load_w8(const uint8_t *p, const int WT) {
    if (WT == WT_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (WT == WT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AI float w_scalar(const uint8_t *p, int i, const int WT) {
    uint16_t h;
    if (WT == WT_F32) return ld_f32(p + 4 * (size_t)i);
    memcpy(&h, p + 2 * (size_t)i, 2);
    if (WT == WT_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

AI void mk_float(const g3_tile *t, int i0, int j0, const int MR, const int NR, const int WT) {
    const int esz = WT == WT_F32 ? 4 : 2;
    __m256 acc[G3_MRX][G3_NRX];
    const uint8_t *wp[G3_NRX];
    const float *xp[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < NR; c++) wp[c] = t->w + (size_t)(j0 + c) * t->ws;
    const size_t pf = (size_t)NR * t->ws;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        xp[r] = (const float *)(t->xq + (size_t)(i0 + r) * t->xs);
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) acc[r][c] = _mm256_setzero_ps();
    }
    int k = t->k, l = 0;
    for (; l + 8 <= k; l += 8) {
        __m256 w[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) {
            w[c] = load_w8(wp[c] + (size_t)l * esz, WT);
            if ((l & 15) == 0) _mm_prefetch((const char *)(wp[c] + pf + (size_t)l * esz), _MM_HINT_T0);
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m256 x = _mm256_loadu_ps(xp[r] + l);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) acc[r][c] = _mm256_fmadd_ps(w[c], x, acc[r][c]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) {
            float s = hsum256(acc[r][c]);
            for (int q = l; q < k; q++) s += w_scalar(wp[c], q, WT) * xp[r][q];
            put_y(t, i0 + r, j0 + c, s);
        }
}

#define MK_F32(t, i, j, MR, NR) mk_float(t, i, j, MR, NR, WT_F32)
#define MK_F16(t, i, j, MR, NR) mk_float(t, i, j, MR, NR, WT_F16)
#define MK_BF16(t, i, j, MR, NR) mk_float(t, i, j, MR, NR, WT_BF16)
static void tile_f32(const g3_tile *t) { G3_TILE_WALK(t, MK_F32, 3, 3, 4); }
static void tile_f16(const g3_tile *t) { G3_TILE_WALK(t, MK_F16, 3, 3, 4); }
static void tile_bf16(const g3_tile *t) { G3_TILE_WALK(t, MK_BF16, 3, 3, 4); }

/* ---- Q8_0 weights x Q8U activations ------------------------------------------------------------------------- */

AI void mk_q8_0(const g3_tile *t, int i0, int j0, const int MR, const int NR) {
    const __m256i c128 = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[G3_MRX][G3_NRX];
    const uint8_t *wp[G3_NRX], *xq[G3_MRX], *xd[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < NR; c++) wp[c] = t->w + (size_t)(j0 + c) * t->ws;
    const size_t pf = (size_t)NR * t->ws;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        xq[r] = t->xq + (size_t)(i0 + r) * t->xs;
        xd[r] = t->xd + (size_t)(i0 + r) * t->xs;
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) acc[r][c] = _mm256_setzero_ps();
    }
    for (int b = 0; b < t->k / 32; b++) {
        __m256i wq[G3_NRX], wa[G3_NRX];
        __m256 dw[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) {
            const uint8_t *blk = wp[c] + 34 * (size_t)b;
            wq[c] = _mm256_loadu_si256((const __m256i *)(blk + 2));
            _mm_prefetch((const char *)(blk + pf), _MM_HINT_T0);
            wa[c] = _mm256_abs_epi8(wq[c]);
            dw[c] = _mm256_set1_ps(f16_at(blk));
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m256i xs = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xq[r] + 32 * (size_t)b)), c128);
            __m256 dx = _mm256_set1_ps(ld_f32(xd[r] + 4 * (size_t)b));
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) {
                __m256i p = _mm256_maddubs_epi16(wa[c], _mm256_sign_epi8(xs, wq[c]));
                __m256i dot = _mm256_madd_epi16(p, ones);
                acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), dx), dw[c], acc[r][c]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) put_y(t, i0 + r, j0 + c, hsum256(acc[r][c]));
}

static void tile_q8_0(const g3_tile *t) { G3_TILE_WALK(t, mk_q8_0, 3, 3, 4); }


/* ---- Q4_0 / Q4_1 / Q5_0 / Q5_1 weights x Q8S activations ------------------------------------------------------
 * maddubs(nibble, x) (31 * 127 * 2 fits in i16), madd -> i32; Q4_0 (x = d*(q-8)) starts each lane at -sum(x), Q5_0
 * (x = d*(q-16), its fifth bits: qh's 32 bits spread to bytes by a shuffle and a compare) at -2*sum(x); the types
 * with an offset m add m*sum(x) per block, an eighth per lane. */

AI __m256i bits_to_x10(uint32_t m) { /* byte j = 0x10 where bit j of m is set */
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)m), shuf), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

AI void mk_q4x(const g3_tile *t, int i0, int j0, const int MR, const int NR, const int FIVE, const int AFF) {
    const size_t BB = 18 + (AFF ? 2 : 0) + (FIVE ? 4 : 0); /* Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24; qs the last 16 */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[G3_MRX][G3_NRX];
    const uint8_t *wp[G3_NRX], *xq[G3_MRX], *xd[G3_MRX], *xe[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < NR; c++) wp[c] = t->w + (size_t)(j0 + c) * t->ws;
    const size_t pf = (size_t)NR * t->ws;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        size_t o = (size_t)(i0 + r) * t->xs;
        xq[r] = t->xq + o, xd[r] = t->xd + o, xe[r] = t->xe + o;
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) acc[r][c] = _mm256_setzero_ps();
    }
    for (int b = 0; b < t->k / 32; b++) {
        __m256i wn[G3_NRX];
        __m256 dw[G3_NRX], mw[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) {
            const uint8_t *blk = wp[c] + BB * (size_t)b;
            __m128i v = _mm_loadu_si128((const __m128i *)(blk + BB - 16));
            _mm_prefetch((const char *)(blk + pf), _MM_HINT_T0);
            wn[c] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
            if (FIVE) {
                uint32_t qh;
                memcpy(&qh, blk + BB - 20, 4);
                wn[c] = _mm256_or_si256(wn[c], bits_to_x10(qh));
            }
            dw[c] = _mm256_set1_ps(f16_at(blk));
            if (AFF) mw[c] = _mm256_set1_ps(f16_at(blk + 2));
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m256i xs = _mm256_loadu_si256((const __m256i *)(xq[r] + 32 * (size_t)b));
            int32_t ns;
            memcpy(&ns, xe[r] + 4 * (size_t)b, 4);
            const float dxs = ld_f32(xd[r] + 4 * (size_t)b);
            __m256i init = AFF ? _mm256_setzero_si256() : _mm256_set1_epi32(FIVE ? 2 * ns : ns);
            __m256 dx = _mm256_set1_ps(dxs), sx = _mm256_set1_ps(-0.125f * (float)ns * dxs);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) {
                __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wn[c], xs), ones), init);
                acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), dx), dw[c], acc[r][c]);
                if (AFF) acc[r][c] = _mm256_fmadd_ps(sx, mw[c], acc[r][c]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) put_y(t, i0 + r, j0 + c, hsum256(acc[r][c]));
}

#define MK_Q4_0(t, i, j, MR, NR) mk_q4x(t, i, j, MR, NR, 0, 0)
#define MK_Q4_1(t, i, j, MR, NR) mk_q4x(t, i, j, MR, NR, 0, 1)
#define MK_Q5_0(t, i, j, MR, NR) mk_q4x(t, i, j, MR, NR, 1, 0)
#define MK_Q5_1(t, i, j, MR, NR) mk_q4x(t, i, j, MR, NR, 1, 1)
static void tile_q4_0(const g3_tile *t) { G3_TILE_WALK(t, MK_Q4_0, 3, 3, 4); }
static void tile_q4_1(const g3_tile *t) { G3_TILE_WALK(t, MK_Q4_1, 3, 3, 4); }
static void tile_q5_0(const g3_tile *t) { G3_TILE_WALK(t, MK_Q5_0, 3, 3, 4); }
static void tile_q5_1(const g3_tile *t) { G3_TILE_WALK(t, MK_Q5_1, 3, 3, 4); }

G3_Q4K_TILE(tile_q4_k)
G3_Q5K_TILE(tile_q5_k)
G3_Q6K_TILE(tile_q6_k)

static const g3_kernel_set set_avx2 = {
    .name = "avx2",
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
};

const g3_kernel_set *g3_kernels_avx2(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
        return NULL;
    return &set_avx2;
}

#else
#include "backend/cpu/kernels.h"
const g3_kernel_set *g3_kernels_avx2(void) { return NULL; }
#endif
