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

/* Portable reference conversions of one row of k values (k a multiple of the block size). */
void g3_dequant_row(uint32_t type, const void *src, float *dst, int64_t k);
/* Returns G3_ERR_UNSUPPORTED for types without a quantizer. Q4_K/Q6_K use a search for good scales. */
g3_status g3_quantize_row(uint32_t type, const float *src, void *dst, int64_t k, g3_error *err);
/* The type llama.cpp's quantizer stores a row of k values in when `type` is a K-quant whose 256-value blocks do
 * not divide k (Gemma 3 1B's 1152-wide rows): Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0. Returns `type` itself
 * when it fits (or is not a K-quant). This is why real Q4_K_M files of the 1B model hold Q5_0 tensors. */
uint32_t g3_dtype_fallback(uint32_t type, int64_t k);

#endif
