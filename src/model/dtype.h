/* Tensor element types: block layout of each quantized format (as GGUF/ggml define them), row sizes,
 * reference (portable C) dequantization and quantization. The SIMD kernels live in src/backend/cpu/.
 *
 * Block layouts (k values per block, bytes per block):
 *   F32 1/4, F16 1/2, BF16 1/2
 *   Q8_0 32/34:  f16 d; int8 q[32]                      x = d*q
 *   Q4_0 32/18:  f16 d; u8 qs[16] (lo nibbles = x[0..15], hi = x[16..31])   x = d*(q-8)
 *   Q4_1 32/20:  f16 d, m; u8 qs[16] (as Q4_0)                               x = d*q + m
 *   Q5_0 32/22:  f16 d; u8 qh[4] (bit j = 5th bit of x[j]); u8 qs[16] (as Q4_0)   x = d*(q-16)
 *   Q5_1 32/24:  f16 d, m; u8 qh[4]; u8 qs[16] (as Q5_0)                     x = d*q + m
 *   Q4_K 256/144: f16 d, dmin; u8 scales[12] (8 6-bit scales + 8 6-bit mins); u8 qs[128]
 *                x = d*sc[j]*q - dmin*m[j] per 32-value sub-block j
 *   Q5_K 256/176: f16 d, dmin; u8 scales[12] (as Q4_K); u8 qh[32]; u8 qs[128] (as Q4_K)
 *                x = d*sc[j]*q - dmin*m[j], q = nibble | (bit j of qh[l]) << 4 for value l of sub-block j
 *   Q6_K 256/210: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d   x = d*scales[j]*(q-32) per 16 values */
#ifndef G3_MODEL_DTYPE_H
#define G3_MODEL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define G3_QK8_0 32
#define G3_QK4_0 32
#define G3_QK_K 256

typedef struct g3_block_q8_0 { uint16_t d; int8_t qs[32]; } g3_block_q8_0;
typedef struct g3_block_q4_0 { uint16_t d; uint8_t qs[16]; } g3_block_q4_0;
typedef struct g3_block_q4_1 { uint16_t d, m; uint8_t qs[16]; } g3_block_q4_1;
typedef struct g3_block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } g3_block_q5_0;
typedef struct g3_block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } g3_block_q5_1;
typedef struct g3_block_q5_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } g3_block_q5_k;
typedef struct g3_block_q4_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } g3_block_q4_k;
typedef struct g3_block_q6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } g3_block_q6_k;

typedef struct g3_dtype_info {
    const char *name;
    int block;          /* values per block */
    size_t block_bytes; /* bytes per block */
    int quantized;
} g3_dtype_info;

/* NULL for a type this build does not know. */
const g3_dtype_info *g3_dtype_get(uint32_t type);
/* Bytes of a row of k values; 0 if k is not a multiple of the block size or the type is unknown. */
size_t g3_row_bytes(uint32_t type, int64_t k);
/* Checked n_rows * row_bytes; returns 0 on overflow or bad shape. */
size_t g3_tensor_bytes(uint32_t type, int64_t k, int64_t n_rows);

/* Code of value j (0..31) of a Q4_0 / Q4_1 / Q5_0 / Q5_1 block from its qs[16] (low nibbles values 0..15, high
 * nibbles 16..31) and qh (bit j: the fifth bit; 0 for the 4-bit types). */
static inline int g3_q5_code(const uint8_t *qs, uint32_t qh, int j) {
    return ((qs[j % 16] >> (4 * (j / 16))) & 0x0F) | (int)((qh >> j) & 1u) << 4;
}
/* Code of value e (0..255) of a Q4_K / Q5_K block from its qs[128] (sub-blocks 2c and 2c+1 share qs[32c..32c+31]:
 * low, then high nibbles) and Q5_K's qh[32] (the fifth bit of value l of sub-block j is bit j of qh[l]; NULL for
 * Q4_K). */
static inline int g3_kq_code(const uint8_t *qs, const uint8_t *qh, int e) {
    const int j = e / 32, l = e % 32;
    return ((qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0F) | (qh ? ((qh[l] >> j) & 1) << 4 : 0);
}
/* Scale and min (6 bits each) of sub-block j (0..7) from a Q4_K / Q5_K block's 12 packed bytes: bytes 0-3 hold
 * sc[0..3] in their low 6 bits and the top 2 bits of sc[4..7]; bytes 4-7 the same for the mins; bytes 8-11 the
 * low 4 bits of sc[4..7] (low nibble) and of m[4..7] (high nibble). */
static inline void g3_kq_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
/* 6-bit value (0..63) of element i (0..255) of a Q6_K block. Each half of 128 values uses 64 bytes of ql and 32 of
 * qh: element l + 32*g (l < 32, g = 0..3) takes its low 4 bits from ql[l + 32*(g&1)] (low nibble for g < 2, high
 * nibble otherwise) and its top 2 bits from bits 2g..2g+1 of qh[l]. */
static inline int g3_q6k_code(const g3_block_q6_k *b, int i) {
    int half = i / 128, r = i % 128, g = r / 32, l = r % 32;
    const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
    return ((ql[l + 32 * (g & 1)] >> (4 * (g >> 1))) & 0x0F) | (((qh[l] >> (2 * g)) & 3) << 4);
}

/* Portable reference conversions of one row of k values (k a multiple of the block size). */
void g3_dequant_row(uint32_t type, const void *src, float *dst, int64_t k);
/* Returns G3_ERR_UNSUPPORTED for types without a quantizer. Q4_K/Q6_K use a search for good scales. */
g3_status g3_quantize_row(uint32_t type, const float *src, void *dst, int64_t k, g3_error *err);
/* The type llama.cpp's quantizer stores a row of k values in when `type` is a K-quant whose 256-value blocks do
 * not divide k (Gemma 3 1B's 1152-wide rows): Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0. Returns `type` itself
 * when it fits (or is not a K-quant). This is why real Q4_K_M files of the 1B model hold Q5_0 tensors. */
uint32_t g3_dtype_fallback(uint32_t type, int64_t k);

#endif
