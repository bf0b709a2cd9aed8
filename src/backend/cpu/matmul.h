/* Matrix multiplication on the CPU against weights in any supported type, with SIMD kernels picked at run time.
 *
 *   Y[m][n] = X[m][k] · W[n][k]^T       W: n rows (output channels) of k values, each row contiguous in its
 *                                        stored type (HF [out, in] / GGUF ne0 = k, ne1 = n); X, Y float32.
 *
 * Float weights (F32/F16/BF16) multiply float32 activations (exact products, f32 accumulation; with AVX512-BF16
 * the activations are split into bf16 hi + lo parts, both products exact, ~2^-17 relative). Quantized weights
 * (Q8_0, Q4_0, Q4_K, Q6_K) multiply activations quantized once per call to 8-bit blocks (32 values with a float
 * scale, or 256 for the K-quants), so that the inner loop is an integer dot product. Preparing X once lets several
 * weights share it (Q, K, V). Nothing is allocated per call: scratch comes from the caller. */
#ifndef G3_BACKEND_CPU_MATMUL_H
#define G3_BACKEND_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"

typedef struct g3_act {
    uint32_t wtype;   /* weight type these activations were prepared for */
    int m, k;
    const float *x;   /* [m][k] float32 (kept for float weights) */
    void *q;          /* quantized copy (quantized weights), in the scratch given to prepare */
    int layout;       /* private: how q is laid out (kernels.h) */
    size_t xs;        /* private: bytes between prepared rows */
    const void *kset; /* private: the kernel set it was prepared for */
    void *q2;         /* private: Q8_0 weights only: the residual x - dequant(q), quantized in the same layout, for a
                       * second integer pass that brings the activations' error from ~2^-8 to ~2^-15 */
} g3_act;

/* Scratch bytes that g3_act_prepare needs for m rows of k values against weights of type wtype (enough for the
 * repacked form of wtype too). */
size_t g3_act_scratch_bytes(uint32_t wtype, int m, int k);
/* Prepares X for weights of type wtype (quantizes it if needed), in parallel. x must outlive a. */
void g3_act_prepare(g3_pool *p, g3_act *a, uint32_t wtype, const float *x, int m, int k, void *scratch);
/* Y = X·W^T for W of n rows; y row i starts at y + i*ldy. Threads split n; m and k are blocked for the caches. */
void g3_matmul(g3_pool *p, const g3_act *a, const void *w, int n, float *y, int ldy);

/* Repacked weights (CPU-private type ids, outside GGUF's range). Eight output channels are interleaved per
 * 32-value block, with their eight f16 scales side by side, so that one 512-bit integer dot product serves 8
 * channels and the scales load as one vector (no per-row horizontal sums or scalar scale conversions):
 *   Q8_0_R8  per (group of 8 rows, block): u16 d[8]; u8 q[256] (= int8 + 128)                        272 bytes
 *   Q4_0_R8  per (group of 8 rows, block): u16 d[8]; u8 q[128] (two nibbles per byte)                 144 bytes
 *   Q5_0_R8  u16 d[8]; u8 q[128] (nibbles as Q4_0_R8); u64 h[4] (fifth bits)                          176 bytes
 *   Q4_1_R8  u16 d[8]; u16 m[8]; u8 q[128]                                                            160 bytes
 *   Q5_1_R8  u16 d[8]; u16 m[8]; u8 q[128]; u64 h[4]                                                  192 bytes
 *   Q4_K_R8  per (group of 8 rows, 256-value block): u16 d[8], dmin[8]; the 6-bit scales and mins unpacked to
 *            bytes (scales by sub-block, mins in the order the kernel's lane pairs take them: kernels.h); the 8
 *            sub-blocks' nibbles, 128 bytes each as Q4_0_R8's                                        1184 bytes
 *   Q5_K_R8  Q4_K_R8's, then each sub-block's fifth bits as Q5_0_R8's masks                          1440 bytes
 *   Q6_K_R8  u16 d[8]; i8 scales by group of 16; each sub-block's low nibbles as Q4_0_R8's, then its 2-bit highs
 *            (4 slices' in one 64-byte vector)                                                      1680 bytes
 * Byte 4L+e of 64-byte slice j (lane L = 2r+h) holds value 8j+4h+e of row r (nibble types: slice j's nibbles are
 * in bytes of slice j/2, low nibble for even j; bit 4L+e of h[j] is that value's fifth bit). Same bytes per weight
 * as the source type, except Q4_K_R8 / Q5_K_R8 (+2.8% / +2.3%: their scales unpacked). */
#define G3_CPU_Q8_0_R8 100u
#define G3_CPU_Q4_0_R8 101u
#define G3_CPU_Q5_0_R8 102u
#define G3_CPU_Q4_1_R8 103u
#define G3_CPU_Q5_1_R8 104u
#define G3_CPU_Q4_K_R8 105u
#define G3_CPU_Q6_K_R8 106u
#define G3_CPU_Q5_K_R8 107u
/* Bytes of the repacked copy of an n x k weight of `type` (g3_matmul_repack's dst); 0 when it has no repacked form. */
size_t g3_matmul_repack_bytes(uint32_t type, int n, int k);
/* The source type of a repacked type (Q8_0 for Q8_0_R8, ...), or 0 when rtype is not one. */
uint32_t g3_matmul_repack_source(uint32_t rtype);
/* The repacked type for an n x k weight of `type` on this CPU, or 0 when it is best used as it is. */
uint32_t g3_matmul_repack_type(uint32_t type, int n, int k);
/* Writes the repacked copy (g3_matmul_repack_bytes bytes) of w into dst; returns its type (0: not repackable: only
 * Q8_0/Q4_0/Q5_0/Q4_1/Q5_1/Q4_K/Q5_K/Q6_K with n % 8 == 0; nothing written). Pass that type to g3_act_prepare and dst to
 * g3_matmul. Every kernel set can multiply repacked weights; g3_matmul_repack_type says when it pays off. */
uint32_t g3_matmul_repack(uint32_t type, const void *w, int n, int k, void *dst);

/* Dequantizes row `row` (k values) of a repacked n x k weight (e.g. an embedding lookup in a tied head). */
void g3_matmul_repacked_row(uint32_t rtype, const void *w, int k, long row, float *out);

/* Name of the kernel set chosen for this CPU ("avx512", "avx2", "scalar"); G3_CPU_KERNELS=scalar|avx2|avx512
 * forces one (ignored when the CPU lacks it). */
const char *g3_cpu_kernels_name(void);
/* Switches the kernel set for later prepare/matmul calls (tests, benchmarks); -1 if this CPU or build lacks it.
 * Not to be called while a matmul runs. Activations already prepared keep the set they were prepared for. */
int g3_cpu_kernels_select(const char *name);
/* Decodes prepared row r back to floats (what the kernels actually multiply): for tests. */
void g3_act_dequant_row(const g3_act *a, int r, float *out);

#endif
