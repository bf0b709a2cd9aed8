/* AVX-512 kernels (F, BW, VL, DQ, VNNI; BF16 when the CPU has it), picked at run time.
 *
 *   F32/F16    zmm FMA, F16 weights widened with vcvtph2ps; 16 values per step
 *   BF16       with AVX512-BF16: vdpbf16ps on the activations split as hi + lo bf16 parts (both products
 *              exact in f32, so the result matches f32 math to ~1e-5); otherwise widened by a shift + FMA
 *   Q8_0/Q4_0  one 32-value block per ymm: vpdpbusd (u8 x s8 -> i32), then scale by d_w*d_x in f32. Q8_0 reads
 *              activations stored +128 (unsigned side) and starts each sum at -128*sum(w); Q4_0 uses its nibbles
 *              as the unsigned side and starts at -sum(x) per lane (the -8 offset)
 *   Q4_1/Q5_0/Q5_1  Q4_0's loop with the fifth bit (one masked byte broadcast) and the offset m * sum(x)
 *   Q4_K/Q5_K/Q6_K  64 values per zmm with maddubs (kern_kquant_avx512.c)
 *   *_R8       the repacked forms (matmul.h) of every quantized type: 8 weight rows a 512-bit dot product
 * Micro-kernels hold an MR x NR block of accumulators in registers (NR weight rows, MR activation rows). */
#if defined(__x86_64__) || defined(__i386__)

#include "backend/cpu/kern_simd.h"

/* kern_kquant_avx512.c */
void g3_avx512_tile_q4_k(const g3_tile *t);
void g3_avx512_tile_q6_k(const g3_tile *t);
void g3_avx512_tile_q5_k(const g3_tile *t);

/* ---- float weights: F32, F16, BF16 widened ------------------------------------------------------------------ */

enum { WT_F32, WT_F16, WT_BF16 };

AI __m512 load_w(const uint8_t *p, const int WT) {
    if (WT == WT_F32) return _mm512_loadu_ps(p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (WT == WT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AI __m512 load_w_tail(const uint8_t *p, __mmask16 m, const int WT) {
    if (WT == WT_F32) return _mm512_maskz_loadu_ps(m, p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (WT == WT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AI void mk_float(const g3_tile *t, int i0, int j0, const int MR, const int NR, const int WT) {
    const int esz = WT == WT_F32 ? 4 : 2;
    __m512 acc[G3_MRX][G3_NRX];
    const uint8_t *wp[G3_NRX];
    const float *xp[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < NR; c++) wp[c] = t->w + (size_t)(j0 + c) * t->ws;
    const size_t pf = (size_t)NR * t->ws; /* prefetch the next group's rows: too short to train the prefetcher */
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        xp[r] = (const float *)(t->xq + (size_t)(i0 + r) * t->xs);
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
    }
    int k = t->k, l = 0;
    for (; l + 16 <= k; l += 16) {
        __m512 w[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) {
            w[c] = load_w(wp[c] + (size_t)l * esz, WT);
            _mm_prefetch((const char *)(wp[c] + pf + (size_t)l * esz), _MM_HINT_T0);
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m512 x = _mm512_loadu_ps(xp[r] + l);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) acc[r][c] = _mm512_fmadd_ps(w[c], x, acc[r][c]);
        }
    }
    if (l < k) {
        __mmask16 m = (__mmask16)((1u << (k - l)) - 1);
        __m512 w[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) w[c] = load_w_tail(wp[c] + (size_t)l * esz, m, WT);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m512 x = _mm512_maskz_loadu_ps(m, xp[r] + l);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) acc[r][c] = _mm512_fmadd_ps(w[c], x, acc[r][c]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) put_y(t, i0 + r, j0 + c, _mm512_reduce_add_ps(acc[r][c]));
}

#define MK_F32(t, i, j, MR, NR) mk_float(t, i, j, MR, NR, WT_F32)
#define MK_F16(t, i, j, MR, NR) mk_float(t, i, j, MR, NR, WT_F16)
#define MK_BF16W(t, i, j, MR, NR) mk_float(t, i, j, MR, NR, WT_BF16)
static void tile_f32(const g3_tile *t) { G3_TILE_WALK_XO(t, MK_F32, 4, 4, 4); }
static void tile_f16(const g3_tile *t) { G3_TILE_WALK_XO(t, MK_F16, 4, 4, 4); }
static void tile_bf16_widen(const g3_tile *t) { G3_TILE_WALK_XO(t, MK_BF16W, 4, 4, 4); }

/* ---- BF16 weights x (hi + lo) bf16 activations with vdpbf16ps ----------------------------------------------- */

AI void mk_bf16x2(const g3_tile *t, int i0, int j0, const int MR, const int NR) {
    __m512 acc[G3_MRX][G3_NRX];
    const uint8_t *wp[G3_NRX], *hp[G3_MRX], *lp[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < NR; c++) wp[c] = t->w + (size_t)(j0 + c) * t->ws;
    const size_t pf = (size_t)NR * t->ws; /* prefetch the next group's rows: too short to train the prefetcher */
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        hp[r] = t->xq + (size_t)(i0 + r) * t->xs;
        lp[r] = t->xd + (size_t)(i0 + r) * t->xs;
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
    }
    int k = t->k, l = 0;
    for (; l + 32 <= k; l += 32) {
        __m512bh w[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) {
            w[c] = (__m512bh)_mm512_loadu_si512(wp[c] + 2 * (size_t)l);
            _mm_prefetch((const char *)(wp[c] + pf + 2 * (size_t)l), _MM_HINT_T0);
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m512bh hi = (__m512bh)_mm512_loadu_si512(hp[r] + 2 * (size_t)l);
            __m512bh lo = (__m512bh)_mm512_loadu_si512(lp[r] + 2 * (size_t)l);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) {
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], hi, w[c]);
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], lo, w[c]);
            }
        }
    }
    if (l < k) {
        __mmask32 m = (__mmask32)((1ull << (k - l)) - 1);
        __m512bh w[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) w[c] = (__m512bh)_mm512_maskz_loadu_epi16(m, wp[c] + 2 * (size_t)l);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m512bh hi = (__m512bh)_mm512_maskz_loadu_epi16(m, hp[r] + 2 * (size_t)l);
            __m512bh lo = (__m512bh)_mm512_maskz_loadu_epi16(m, lp[r] + 2 * (size_t)l);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) {
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], hi, w[c]);
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], lo, w[c]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) put_y(t, i0 + r, j0 + c, _mm512_reduce_add_ps(acc[r][c]));
}

static void tile_bf16x2(const g3_tile *t) { G3_TILE_WALK_XO(t, mk_bf16x2, 4, 4, 4); }

/* ---- Q8_0 weights x Q8U activations ------------------------------------------------------------------------- */

AI void mk_q8_0(const g3_tile *t, int i0, int j0, const int MR, const int NR) {
    const __m256i c128 = _mm256_set1_epi8((char)0x80);
    __m256 acc[G3_MRX][G3_NRX];
    const uint8_t *wp[G3_NRX], *xq[G3_MRX], *xd[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < NR; c++) wp[c] = t->w + (size_t)(j0 + c) * t->ws;
    const size_t pf = (size_t)NR * t->ws; /* prefetch the next group's rows: too short to train the prefetcher */
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        xq[r] = t->xq + (size_t)(i0 + r) * t->xs;
        xd[r] = t->xd + (size_t)(i0 + r) * t->xs;
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) acc[r][c] = _mm256_setzero_ps();
    }
    int nb = t->k / 32;
    for (int b = 0; b < nb; b++) {
        __m256i wq[G3_NRX], neg[G3_NRX];
        __m256 dw[G3_NRX];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) {
            const uint8_t *blk = wp[c] + 34 * (size_t)b;
            wq[c] = _mm256_loadu_si256((const __m256i *)(blk + 2));
            _mm_prefetch((const char *)(blk + pf), _MM_HINT_T0);
            neg[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), c128, wq[c]));
            dw[c] = _mm256_set1_ps(f16_at(blk));
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m256i xu = _mm256_loadu_si256((const __m256i *)(xq[r] + 32 * (size_t)b));
            __m256 dx = _mm256_set1_ps(ld_f32(xd[r] + 4 * (size_t)b));
            _Pragma("GCC unroll 8")
            for (int c = 0; c < NR; c++) {
                __m256i dot = _mm256_dpbusd_epi32(neg[c], xu, wq[c]);
                acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), dx), dw[c], acc[r][c]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) put_y(t, i0 + r, j0 + c, hsum256(acc[r][c]));
}

static void tile_q8_0(const g3_tile *t) { G3_TILE_WALK(t, mk_q8_0, 4, 3, 4); }

/* ---- Q4_0 / Q4_1 / Q5_0 / Q5_1 weights x Q8S activations ------------------------------------------------------
 * The nibbles (values 0..15: low nibbles x[0..15], high x[16..31]) are the unsigned side; Q4_0 (x = d*(q-8)) starts
 * each of the 8 lanes at -sum(x) (negsum), Q5_0 (x = d*(q-16), its fifth bit of value j is bit j of qh, one masked
 * byte broadcast) at -2*sum(x); the types with an offset m (x = d*q + m) add m*sum(x) per block, an eighth in each
 * lane, so that the final sum over the 8 lanes holds it once. */

AI void mk_q4x(const g3_tile *t, int i0, int j0, const int MR, const int NR, const int FIVE, const int AFF) {
    const size_t BB = 18 + (AFF ? 2 : 0) + (FIVE ? 4 : 0); /* Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24; qs the last 16 */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[G3_MRX][G3_NRX];
    const uint8_t *wp[G3_NRX], *xq[G3_MRX], *xd[G3_MRX], *xe[G3_MRX];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < NR; c++) wp[c] = t->w + (size_t)(j0 + c) * t->ws;
    const size_t pf = (size_t)NR * t->ws; /* prefetch the next group's rows: too short to train the prefetcher */
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        size_t o = (size_t)(i0 + r) * t->xs;
        xq[r] = t->xq + o, xd[r] = t->xd + o, xe[r] = t->xe + o;
        _Pragma("GCC unroll 8")
        for (int c = 0; c < NR; c++) acc[r][c] = _mm256_setzero_ps();
    }
    int nb = t->k / 32;
    for (int b = 0; b < nb; b++) {
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
                wn[c] = _mm256_or_si256(wn[c], _mm256_maskz_set1_epi8((__mmask32)qh, 0x10));
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
                __m256i dot = _mm256_dpbusd_epi32(init, wn[c], xs);
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
static void tile_q4_0(const g3_tile *t) { G3_TILE_WALK(t, MK_Q4_0, 4, 3, 4); }
static void tile_q4_1(const g3_tile *t) { G3_TILE_WALK(t, MK_Q4_1, 4, 3, 4); }
static void tile_q5_0(const g3_tile *t) { G3_TILE_WALK(t, MK_Q5_0, 4, 3, 4); }
static void tile_q5_1(const g3_tile *t) { G3_TILE_WALK(t, MK_Q5_1, 4, 3, 4); }

/* ---- repacked Q8_0_R8 / Q4_0_R8 / Q5_0_R8 / Q4_1_R8 / Q5_1_R8 weights x Q8S activations ---------------------
 * One group = 8 weight rows. Per 32-value block, four 64-byte slices U_j (lane 2r+h = values 8j+4h..+3 of row r)
 * each meet the activation's 8 values x[8j..8j+7] broadcast as a qword, so lanes 2r and 2r+1 collect row r's
 * dot product. The offset (-8 for Q4_0 nibbles, -16 for Q5_0, +128 stored for Q8_0) is the starting value
 * -c*sum(x)/2 of each lane; Q4_1 / Q5_1 add half of m*sum(x) to each lane of the row. Scales: 8 f16 -> 8 floats,
 * duplicated to the 16 lanes. */

#define R8_MAXROWS 8
#define R8_PF 2048 /* prefetch distance in bytes */

/* The MR activation rows' pointers (values, scales, sums) and zeroed accumulators */
AI void r8_rows(const g3_tile *t, int i0, const int MR, const uint8_t **xq, const uint8_t **xd, const uint8_t **xe,
                __m512 *acc) {
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        size_t o = (size_t)(i0 + r) * t->xs;
        xq[r] = t->xq + o, xd[r] = t->xd + o, xe[r] = t->xe + o;
        acc[r] = _mm512_setzero_ps();
    }
}

/* The 8 outputs of a group from each activation row's accumulator: row q = lanes 2q + 2q+1 */
AI void r8_store(const g3_tile *t, int i0, int g, const int MR, const __m512 *acc) {
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        __m512 sw = _mm512_add_ps(acc[r], _mm512_permute_ps(acc[r], 0xB1));
        float tmp[16];
        _mm512_storeu_ps(tmp, sw);
        float *y = t->y + (size_t)(i0 + r) * t->ldy + 8 * g;
        for (int q = 0; q < 8; q++) y[q] = t->accumulate ? y[q] + tmp[2 * q] : tmp[2 * q];
    }
}

/* Every group of 8 weight rows against the activation rows, 8 at a time: MK(t, i0, g, MR) */
#define R8_WALK(t, MK)                                                                                          \
    do {                                                                                                        \
        for (int g_ = 0; g_ < (t)->nw / 8; g_++) {                                                              \
            int i_ = 0;                                                                                         \
            for (; i_ + 8 <= (t)->nx; i_ += 8) MK(t, i_, g_, 8);                                                \
            switch ((t)->nx - i_) {                                                                             \
            case 7: MK(t, i_, g_, 7); break;                                                                    \
            case 6: MK(t, i_, g_, 6); break;                                                                    \
            case 5: MK(t, i_, g_, 5); break;                                                                    \
            case 4: MK(t, i_, g_, 4); break;                                                                    \
            case 3: MK(t, i_, g_, 3); break;                                                                    \
            case 2: MK(t, i_, g_, 2); break;                                                                    \
            case 1: MK(t, i_, g_, 1); break;                                                                    \
            default: break;                                                                                     \
            }                                                                                                   \
        }                                                                                                       \
    } while (0)

AI void mk_r8(const g3_tile *t, int i0, int g, const int MR, const int FM) {
    const int Q4 = FM != G3_R8_Q8_0, FIVE = g3_r8_five(FM), AFF = g3_r8_aff(FM), QO = g3_r8_qoff(FM);
    const size_t bb = (size_t)g3_r8_bytes(FM);
    const uint8_t *grp = t->w + (size_t)g * 8 * t->ws;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[R8_MAXROWS];
    const uint8_t *xq[R8_MAXROWS], *xd[R8_MAXROWS], *xe[R8_MAXROWS];
    r8_rows(t, i0, MR, xq, xd, xe, acc);
    for (int b = 0; b < t->k / 32; b++) {
        const uint8_t *blk = grp + bb * (size_t)b;
        /* one linear stream per thread: prefetch well ahead to keep enough misses in flight */
        _Pragma("GCC unroll 5")
        for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)(blk + R8_PF + o), _MM_HINT_T0);
        __m512i u[4];
        if (Q4) {
            __m512i q0 = _mm512_loadu_si512(blk + QO), q1 = _mm512_loadu_si512(blk + QO + 64);
            u[0] = _mm512_and_si512(q0, m4);
            u[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
            u[2] = _mm512_and_si512(q1, m4);
            u[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
            if (FIVE) { /* the fifth bits: one 64-bit mask a slice, set as 0x10 bytes */
                _Pragma("GCC unroll 4")
                for (int j = 0; j < 4; j++) {
                    uint64_t hm;
                    memcpy(&hm, blk + g3_r8_hoff(FM) + 8 * j, 8);
                    u[j] = _mm512_or_si512(u[j], _mm512_maskz_set1_epi8((__mmask64)hm, 0x10));
                }
            }
        } else {
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) u[j] = _mm512_loadu_si512(blk + 16 + 64 * j);
        }
        __m512 s16 = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_cvtph_ps(
                                                    _mm_loadu_si128((const __m128i *)blk))));
        __m512 m16 = _mm512_setzero_ps(); /* half of each row's offset in each of its two lanes */
        if (AFF)
            m16 = _mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_cvtph_ps(
                                                          _mm_loadu_si128((const __m128i *)(blk + 16))))));
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            const uint8_t *x = xq[r] + 32 * (size_t)b;
            int32_t ns;
            memcpy(&ns, xe[r] + 4 * (size_t)b, 4);
            __m512i dot = _mm512_set1_epi32(AFF ? 0 : FIVE ? ns * 8 : Q4 ? ns * 4 : ns * 64);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                long long xv;
                memcpy(&xv, x + 8 * j, 8);
                dot = _mm512_dpbusd_epi32(dot, u[j], _mm512_set1_epi64(xv));
            }
            const float dxs = ld_f32(xd[r] + 4 * (size_t)b);
            __m512 sc = _mm512_mul_ps(s16, _mm512_set1_ps(dxs));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[r]);
            if (AFF) acc[r] = _mm512_fmadd_ps(m16, _mm512_set1_ps(-(float)ns * dxs), acc[r]);
        }
    }
    r8_store(t, i0, g, MR, acc);
}


/* ---- Q4_K_R8 x Q8K activations ---------------------------------------------------------------------------------
 * Per 256-value block of a group of 8 rows: each sub-block's 32 values as Q4_0_R8's slices (lane 2r+h: row r),
 * its dot products times the 8 rows' 6-bit scales (one 32-bit multiply) summed over the sub-blocks; the mins meet
 * the activation's sub-block sums through two 16-bit madds whose lane pairs line up with the same lanes (kernels.h).
 * No scale unpacking in the loop: that is done once, at load. */

static const int16_t k_q4kr8_ix[2][32] = { /* X1 / X2 of lane-pair position p: xs[4*((p>>1)&1) + (p&1) (+2)] */
    {0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5},
    {2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7}};

AI void mk_q4k_r8(const g3_tile *t, int i0, int g, const int MR, const int FIVE) { /* FIVE: Q5_K_R8 */
    const uint8_t *grp = t->w + (size_t)g * 8 * t->ws;
    const size_t BB = FIVE ? 1440 : 1184;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i ix1 = _mm512_loadu_si512(k_q4kr8_ix[0]), ix2 = _mm512_loadu_si512(k_q4kr8_ix[1]);
    const __m256i ones = _mm256_set1_epi16(1);
    __m512 acc[R8_MAXROWS];
    const uint8_t *xq[R8_MAXROWS], *xd[R8_MAXROWS], *xe[R8_MAXROWS];
    r8_rows(t, i0, MR, xq, xd, xe, acc);
    for (int b = 0; b < t->k / 256; b++) {
        const uint8_t *blk = grp + BB * (size_t)b;
        for (size_t o = 0; o < BB; o += 64) _mm_prefetch((const char *)(blk + R8_PF + o), _MM_HINT_T0);
        const __m512 D = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_cvtph_ps(
                                                        _mm_loadu_si128((const __m128i *)(blk + G3_Q4KR8_D)))));
        const __m512 Dm = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_cvtph_ps(
                                                         _mm_loadu_si128((const __m128i *)(blk + G3_Q4KR8_DMIN)))));
        const __m512i M1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + G3_Q4KR8_M)));
        const __m512i M2 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + G3_Q4KR8_M + 32)));
        __m512i isum[R8_MAXROWS];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) isum[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2")
        for (int sb = 0; sb < 8; sb++) {
            const uint8_t *qp = blk + G3_Q4KR8_Q + 128 * sb;
            __m512i q0 = _mm512_loadu_si512(qp), q1 = _mm512_loadu_si512(qp + 64);
            __m512i u0 = _mm512_and_si512(q0, m4), u1 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
            __m512i u2 = _mm512_and_si512(q1, m4), u3 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
            if (FIVE) {
                uint64_t hm[4];
                memcpy(hm, blk + G3_Q5KR8_H + 32 * sb, 32);
                u0 = _mm512_or_si512(u0, _mm512_maskz_set1_epi8((__mmask64)hm[0], 0x10));
                u1 = _mm512_or_si512(u1, _mm512_maskz_set1_epi8((__mmask64)hm[1], 0x10));
                u2 = _mm512_or_si512(u2, _mm512_maskz_set1_epi8((__mmask64)hm[2], 0x10));
                u3 = _mm512_or_si512(u3, _mm512_maskz_set1_epi8((__mmask64)hm[3], 0x10));
            }
            __m512i sc = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(_mm256_cvtepu8_epi32(
                                                            _mm_loadl_epi64((const __m128i *)(blk + G3_Q4KR8_SC + 8 * sb)))));
            _Pragma("GCC unroll 8")
            for (int r = 0; r < MR; r++) {
                const uint8_t *x = xq[r] + 256 * (size_t)b + 32 * sb;
                long long x0, x1, x2, x3;
                memcpy(&x0, x, 8), memcpy(&x1, x + 8, 8), memcpy(&x2, x + 16, 8), memcpy(&x3, x + 24, 8);
                __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, _mm512_set1_epi64(x0));
                dot = _mm512_dpbusd_epi32(dot, u1, _mm512_set1_epi64(x1));
                dot = _mm512_dpbusd_epi32(dot, u2, _mm512_set1_epi64(x2));
                dot = _mm512_dpbusd_epi32(dot, u3, _mm512_set1_epi64(x3));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot, sc));
            }
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xe[r] + 32 * (size_t)b));
            __m128i xs = _mm256_cvtepi32_epi16(_mm256_madd_epi16(bs, ones)); /* the 8 sub-block sums */
            __m512i msum = _mm512_add_epi32(_mm512_madd_epi16(M1, _mm512_permutexvar_epi16(ix1, _mm512_castsi128_si512(xs))),
                                            _mm512_madd_epi16(M2, _mm512_permutexvar_epi16(ix2, _mm512_castsi128_si512(xs))));
            const __m512 dx = _mm512_set1_ps(ld_f32(xd[r] + 4 * (size_t)b));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(D, dx), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(Dm, dx), acc[r]);
        }
    }
    r8_store(t, i0, g, MR, acc);
}

/* ---- Q6_K_R8 x Q8K activations ---------------------------------------------------------------------------------
 * Per sub-block: the low nibbles as Q4_0_R8's slices with the 2-bit highs or-ed in (values 0..63), slices 0-1 and
 * 2-3 (the two groups of 16, each its own scale) summed apart; the -32 offset enters as -32 * (the group's
 * activation sum) at the start of the even lane of each row, so that the scale multiplies it too. */
AI void mk_q6k_r8(const g3_tile *t, int i0, int g, const int MR) {
    const uint8_t *grp = t->w + (size_t)g * 8 * t->ws;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[R8_MAXROWS];
    const uint8_t *xq[R8_MAXROWS], *xd[R8_MAXROWS], *xe[R8_MAXROWS];
    r8_rows(t, i0, MR, xq, xd, xe, acc);
    for (int b = 0; b < t->k / 256; b++) {
        const uint8_t *blk = grp + 1680 * (size_t)b;
        for (int o = 0; o < 1680; o += 64) _mm_prefetch((const char *)(blk + R8_PF + o), _MM_HINT_T0);
        const __m512 D = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_cvtph_ps(
                                                        _mm_loadu_si128((const __m128i *)blk))));
        __m512i isum[R8_MAXROWS];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) isum[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2")
        for (int sb = 0; sb < 8; sb++) {
            const uint8_t *qp = blk + G3_Q6KR8_Q + 128 * sb;
            __m512i q0 = _mm512_loadu_si512(qp), q1 = _mm512_loadu_si512(qp + 64);
            __m512i h = _mm512_loadu_si512(blk + G3_Q6KR8_H + 64 * sb);
            __m512i u0 = _mm512_or_si512(_mm512_and_si512(q0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
            __m512i u1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                                         _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
            __m512i u2 = _mm512_or_si512(_mm512_and_si512(q1, m4), _mm512_and_si512(h, m30));
            __m512i u3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q1, 4), m4),
                                         _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
            __m512i sa = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(_mm256_cvtepi8_epi32(
                                                            _mm_loadl_epi64((const __m128i *)(blk + G3_Q6KR8_SC + 16 * sb)))));
            __m512i sbv = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(_mm256_cvtepi8_epi32(
                                                             _mm_loadl_epi64((const __m128i *)(blk + G3_Q6KR8_SC + 16 * sb + 8)))));
            _Pragma("GCC unroll 8")
            for (int r = 0; r < MR; r++) {
                const uint8_t *x = xq[r] + 256 * (size_t)b + 32 * sb;
                int16_t bs0, bs1;
                memcpy(&bs0, xe[r] + 2 * (size_t)(16 * b + 2 * sb), 2);
                memcpy(&bs1, xe[r] + 2 * (size_t)(16 * b + 2 * sb + 1), 2);
                long long x0, x1, x2, x3;
                memcpy(&x0, x, 8), memcpy(&x1, x + 8, 8), memcpy(&x2, x + 16, 8), memcpy(&x3, x + 24, 8);
                __m512i da = _mm512_dpbusd_epi32(_mm512_maskz_set1_epi32(0x5555, -32 * bs0), u0, _mm512_set1_epi64(x0));
                da = _mm512_dpbusd_epi32(da, u1, _mm512_set1_epi64(x1));
                __m512i db = _mm512_dpbusd_epi32(_mm512_maskz_set1_epi32(0x5555, -32 * bs1), u2, _mm512_set1_epi64(x2));
                db = _mm512_dpbusd_epi32(db, u3, _mm512_set1_epi64(x3));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_add_epi32(_mm512_mullo_epi32(da, sa), _mm512_mullo_epi32(db, sbv)));
            }
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(D, _mm512_set1_ps(ld_f32(xd[r] + 4 * (size_t)b))),
                                     acc[r]);
    }
    r8_store(t, i0, g, MR, acc);
}


#define MK_Q4K_R8(t, i, g, MR) mk_q4k_r8(t, i, g, MR, 0)
#define MK_Q5K_R8(t, i, g, MR) mk_q4k_r8(t, i, g, MR, 1)
static void tile_q4_k_r8(const g3_tile *t) { R8_WALK(t, MK_Q4K_R8); }
static void tile_q5_k_r8(const g3_tile *t) { R8_WALK(t, MK_Q5K_R8); }
static void tile_q6_k_r8(const g3_tile *t) { R8_WALK(t, mk_q6k_r8); }

#define MK_R8(f) AI void mk_r8_##f(const g3_tile *t, int i0, int g, const int MR) { mk_r8(t, i0, g, MR, G3_R8_##f); }
MK_R8(Q8_0)
MK_R8(Q4_0)
MK_R8(Q5_0)
MK_R8(Q4_1)
MK_R8(Q5_1)
static void tile_q8_0_r8(const g3_tile *t) { R8_WALK(t, mk_r8_Q8_0); }
static void tile_q4_0_r8(const g3_tile *t) { R8_WALK(t, mk_r8_Q4_0); }
static void tile_q5_0_r8(const g3_tile *t) { R8_WALK(t, mk_r8_Q5_0); }
static void tile_q4_1_r8(const g3_tile *t) { R8_WALK(t, mk_r8_Q4_1); }
static void tile_q5_1_r8(const g3_tile *t) { R8_WALK(t, mk_r8_Q5_1); }

/* ---- activation preparation (bit-identical to the portable version for the Q8 layouts) ---------------------- */

/* Rounds x * id half away from zero, as (int)(v + (v >= 0 ? 0.5f : -0.5f)) does. */
AI __m512i round_away(__m512 v) {
    const __m512 half = _mm512_set1_ps(0.5f);
    __m512 sgn = _mm512_and_ps(v, _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u)));
    /* the portable test is v >= 0, so -0.0 rounds like +0.0: both give 0 */
    return _mm512_cvttps_epi32(_mm512_add_ps(v, _mm512_or_ps(half, sgn)));
}

AI float amax_of(__m512 a) { return _mm512_reduce_max_ps(a); }

static void prep_avx512(int layout, const float *x, int k, uint8_t *row) {
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    if (layout == G3_ACT_Q8U || layout == G3_ACT_Q8S) {
        float *d = (float *)(row + k);
        int32_t *ns = (int32_t *)(d + k / 32);
        for (int b = 0; b < k / 32; b++) {
            __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
            float amax = amax_of(_mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
            float id = amax > 0 ? 127.0f / amax : 0.0f;
            d[b] = amax / 127.0f;
            __m512 vid = _mm512_set1_ps(id);
            __m512i q0 = round_away(_mm512_mul_ps(v0, vid)), q1 = round_away(_mm512_mul_ps(v1, vid));
            if (layout == G3_ACT_Q8S) {
                ns[b] = -_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            } else {
                const __m512i off = _mm512_set1_epi32(128);
                q0 = _mm512_add_epi32(q0, off);
                q1 = _mm512_add_epi32(q1, off);
            }
            _mm_storeu_si128((__m128i *)(row + 32 * b), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(row + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
        }
    } else if (layout == G3_ACT_Q8K) {
        float *d = (float *)(row + k);
        int16_t *bs = (int16_t *)(d + k / 256);
        for (int b = 0; b < k / 256; b++) {
            const float *xb = x + 256 * b;
            __m512 m = _mm512_setzero_ps();
            for (int g = 0; g < 16; g++) m = _mm512_max_ps(m, _mm512_and_ps(_mm512_loadu_ps(xb + 16 * g), absmask));
            float amax = amax_of(m);
            float id = amax > 0 ? 127.0f / amax : 0.0f;
            d[b] = amax / 127.0f;
            __m512 vid = _mm512_set1_ps(id);
            for (int g = 0; g < 16; g++) {
                __m512i q = round_away(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * g), vid));
                bs[16 * b + g] = (int16_t)_mm512_reduce_add_epi32(q);
                _mm_storeu_si128((__m128i *)(row + 256 * b + 16 * g), _mm512_cvtepi32_epi8(q));
            }
        }
    } else { /* BF16X2: hi = bf16(x), lo = bf16(x - hi) */
        uint16_t *hi = (uint16_t *)row, *lo = hi + k;
        int i = 0;
        for (; i + 16 <= k; i += 16) {
            __m512 v = _mm512_loadu_ps(x + i);
            __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
            __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            __m256i l = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf));
            _mm256_storeu_si256((__m256i *)(hi + i), h);
            _mm256_storeu_si256((__m256i *)(lo + i), l);
        }
        for (; i < k; i++) {
            float f = x[i], hf;
            uint32_t u;
            memcpy(&u, &f, 4);
            u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (finite values) */
            hi[i] = (uint16_t)(u >> 16);
            u = (uint32_t)hi[i] << 16;
            memcpy(&hf, &u, 4);
            f -= hf;
            memcpy(&u, &f, 4);
            u += 0x7fffu + ((u >> 16) & 1u);
            lo[i] = (uint16_t)(u >> 16);
        }
    }
}

static const g3_kernel_set set_avx512_bf16 = {
    .name = "avx512",
    .bf16_layout = G3_ACT_BF16X2,
    .f32 = tile_f32,
    .f16 = tile_f16,
    .bf16 = tile_bf16x2,
    .q8_0 = tile_q8_0,
    .q4_0 = tile_q4_0,
    .q4_k = g3_avx512_tile_q4_k,
    .q6_k = g3_avx512_tile_q6_k,
    .q4_1 = tile_q4_1,
    .q5_0 = tile_q5_0,
    .q5_1 = tile_q5_1,
    .q5_k = g3_avx512_tile_q5_k,
    .q8_0_r8 = tile_q8_0_r8,
    .q4_0_r8 = tile_q4_0_r8,
    .q5_0_r8 = tile_q5_0_r8,
    .q4_1_r8 = tile_q4_1_r8,
    .q5_1_r8 = tile_q5_1_r8,
    .q4_k_r8 = tile_q4_k_r8,
    .q6_k_r8 = tile_q6_k_r8,
    .q5_k_r8 = tile_q5_k_r8,
    .prep = prep_avx512,
};

static const g3_kernel_set set_avx512 = {
    .name = "avx512",
    .bf16_layout = G3_ACT_F32,
    .f32 = tile_f32,
    .f16 = tile_f16,
    .bf16 = tile_bf16_widen,
    .q8_0 = tile_q8_0,
    .q4_0 = tile_q4_0,
    .q4_k = g3_avx512_tile_q4_k,
    .q6_k = g3_avx512_tile_q6_k,
    .q4_1 = tile_q4_1,
    .q5_0 = tile_q5_0,
    .q5_1 = tile_q5_1,
    .q5_k = g3_avx512_tile_q5_k,
    .q8_0_r8 = tile_q8_0_r8,
    .q4_0_r8 = tile_q4_0_r8,
    .q5_0_r8 = tile_q5_0_r8,
    .q4_1_r8 = tile_q4_1_r8,
    .q5_1_r8 = tile_q5_1_r8,
    .q4_k_r8 = tile_q4_k_r8,
    .q6_k_r8 = tile_q6_k_r8,
    .q5_k_r8 = tile_q5_k_r8,
    .prep = prep_avx512,
};

const g3_kernel_set *g3_kernels_avx512(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq") ||
        !__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
        return NULL;
    return __builtin_cpu_supports("avx512bf16") ? &set_avx512_bf16 : &set_avx512;
}

#else
#include "backend/cpu/kernels.h"
const g3_kernel_set *g3_kernels_avx512(void) { return NULL; }
#endif
