/* Private interface between matmul.c (threads, cache blocking, activation preparation) and the kernel sets
 * (kern_scalar.c, kern_avx2.c, kern_avx512.c), which compute one tile: nx activation rows against nw weight rows
 * over one chunk of k.
 *
 * Prepared activation layouts (one row each, rows `xs` bytes apart, 64-byte aligned):
 *   F32     float x[k]                                   (F32/F16 weights; BF16 weights without the split)
 *   BF16X2  u16 hi[k] | u16 lo[k]       x ~ hi + lo, both bf16: hi = bf16(x), lo = bf16(x - hi), so products
 *                                        with bf16 weights are exact and the error is ~2^-17 relative
 *   Q8U     u8 q[k] (= int8 + 128) | float d[k/32]                      (Q8_0 weights)   x = d*(q-128)
 *   Q8S     i8 q[k] | float d[k/32] | i32 negsum[k/32] (= -sum(q))   (Q4_0/Q4_1/Q5_0/Q5_1)   x = d*q
 *   Q8K     i8 q[k] | float d[k/256] | i16 bsum[k/16] (sums of 16 q)    (Q4_K/Q5_K/Q6_K) x = d*q
 * Q8U lets VNNI's unsigned x signed dot take the activation as the unsigned side with Q8_0 weights; Q8S's
 * negsum folds Q4_0's -8 offset into the integer accumulator's starting value. The repacked types (Q8_0_R8,
 * Q4_0_R8, Q5_0_R8, Q4_1_R8, Q5_1_R8) read Q8S, Q4_K_R8 and Q6_K_R8 Q8K; for them a tile's w points at the first group of 8 rows at the chunk start, `ws` is the
 * source type's row bytes (so a group is 8*ws bytes) and nw is a multiple of 8. */
#ifndef G3_BACKEND_CPU_KERNELS_H
#define G3_BACKEND_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "gemma3.h"

enum g3_act_layout { G3_ACT_F32 = 0, G3_ACT_BF16X2, G3_ACT_Q8U, G3_ACT_Q8S, G3_ACT_Q8K };

/* One tile: y[i][j] (+)= sum over the chunk of x_i . w_j, for i < nx, j < nw. */
typedef struct g3_tile {
    int k;              /* values in this chunk (a multiple of the weight block; any count for float types) */
    const uint8_t *w;   /* weight row 0 at the chunk start */
    size_t ws;          /* bytes between weight rows */
    int nw;
    const uint8_t *xq;  /* activation row 0: values at the chunk start (float, bf16 hi, or 8-bit) */
    const uint8_t *xd;  /* row 0: float scales at the chunk start (Q8 layouts); bf16 lo (BF16X2) */
    const uint8_t *xe;  /* row 0: negsum (Q8S) or bsum (Q8K) at the chunk start */
    size_t xs;          /* bytes between activation rows (same for xq, xd, xe) */
    int nx;
    float *y;           /* y[i*ldy + j] */
    size_t ldy;
    int accumulate;     /* add to y (later k chunks) instead of storing */
} g3_tile;

typedef void (*g3_tile_fn)(const g3_tile *t);
/* Prepares one activation row of k values in `layout` (never G3_ACT_F32). SIMD versions must produce the same
 * bytes as the portable one in matmul.c for the Q8 layouts (same float operations, round half away from 0). */
typedef void (*g3_prep_fn)(int layout, const float *x, int k, uint8_t *row);

typedef struct g3_kernel_set {
    const char *name;
    int bf16_layout;    /* activation layout its BF16 kernel reads: G3_ACT_F32 or G3_ACT_BF16X2 */
    g3_tile_fn f32, f16, bf16, q8_0, q4_0, q4_k, q6_k;
    g3_tile_fn q4_1, q5_0, q5_1, q5_k; /* NULL: scalar's are used */
    g3_tile_fn q8_0_r8, q4_0_r8; /* repacked weights (matmul.h) with Q8S activations; NULL: scalar's are used */
    g3_tile_fn q5_0_r8, q4_1_r8, q5_1_r8, q4_k_r8, q6_k_r8, q5_k_r8;
    g3_prep_fn prep;             /* NULL: the portable one */
} g3_kernel_set;

/* Each returns NULL when the set is not compiled in or the CPU lacks its instructions. */
const g3_kernel_set *g3_kernels_scalar(void);
const g3_kernel_set *g3_kernels_avx2(void);
const g3_kernel_set *g3_kernels_avx512(void);

static inline int g3_kmin(int a, int b) { return a < b ? a : b; }

/* The repacked forms' block layout (matmul.h), from the form: 0 Q8_0_R8, 1 Q4_0_R8, 2 Q5_0_R8, 3 Q4_1_R8, 4 Q5_1_R8 */
enum { G3_R8_Q8_0, G3_R8_Q4_0, G3_R8_Q5_0, G3_R8_Q4_1, G3_R8_Q5_1, G3_R8_Q4_K, G3_R8_Q6_K, G3_R8_Q5_K };
static inline int g3_r8_five(int f) { return f == G3_R8_Q5_0 || f == G3_R8_Q5_1; }
static inline int g3_r8_aff(int f) { return f == G3_R8_Q4_1 || f == G3_R8_Q5_1; } /* u16 m[8] after d[8] */
static inline int g3_r8_qoff(int f) { return g3_r8_aff(f) ? 32 : 16; }           /* the 8-bit or nibble slices */
static inline int g3_r8_hoff(int f) { return g3_r8_qoff(f) + 128; }              /* the fifth-bit masks */
static inline int g3_r8_bytes(int f) {
    return f == G3_R8_Q5_K ? 1440 : f == G3_R8_Q6_K ? 1680 : f == G3_R8_Q4_K ? 1184 : f == G3_R8_Q8_0 ? 272 : 144 + (g3_r8_aff(f) ? 16 : 0) + (g3_r8_five(f) ? 32 : 0);
}
/* Q4_K_R8, per group of 8 rows and 256-value block (1184 bytes): */
#define G3_Q4KR8_D 0     /* u16 d[8] */
#define G3_Q4KR8_DMIN 16 /* u16 dmin[8] */
#define G3_Q4KR8_SC 32   /* u8 sc[8 sub-blocks][8 rows] (6-bit scales, unpacked) */
#define G3_Q4KR8_M 96    /* u8 mins by lane pair, [2][32]: byte p = 2L + t (lane L = 2r + h) holds m[r][4h + t] in the
                          * first 32, m[r][4h + 2 + t] in the second */
#define G3_Q4KR8_Q 160   /* per sub-block s, 128 bytes of nibbles in Q4_0_R8's layout */
#define G3_Q5KR8_H 1184  /* Q5_K_R8 (1440 bytes): Q4_K_R8's, then per sub-block 4 u64 fifth-bit masks as Q5_0_R8's */
/* Q6_K_R8, per group of 8 rows and 256-value block (1680 bytes, as 8 Q6_K blocks): */
#define G3_Q6KR8_SC 16   /* i8 sc[16 groups of 16][8 rows], after u16 d[8] */
#define G3_Q6KR8_Q 144   /* per sub-block s, 128 bytes of low nibbles in Q4_0_R8's layout */
#define G3_Q6KR8_H 1168  /* per sub-block s, 64 bytes: bits 2j..2j+1 of byte P are the high bits of slice j's byte P */

#endif
