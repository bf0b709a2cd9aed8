/* Shared declarations of the CUDA backend: the resident matrix formats, error helpers, the launch helper and the
 * launchers that cuda_forward.cu strings together. Internal to src/backend/cuda (C++ linkage); the C-callable extras
 * are in cuda_api.h.
 *
 * Resident matrix formats (W: n rows = output channels, k values per row, row-major):
 *   G3Q_BF16  bf16 w[n][k]
 *   G3Q_INT8  int8 q[n][k], float s[n][k/g]                      w = s*q          (g = k: per channel)
 *   G3Q_INT4  u8 q[n][k/2] (byte j: lo nibble = value 2j, hi = 2j+1), float s[n][k/g], z[n][k/g]   w = s*q + z
 *   G3Q_FP8   e4m3 q[n][k], float s[n][k/g]                      w = s*float(q)   (g = k)
 * Activations entering a matrix product: float32 [m][k] for the CUDA-core GEMV (gemv.cu), bf16 for the tensor-core
 * kernels (tc_gemv.cu) and cuBLAS: xh = hi rows [m][k], then (split) lo rows [m][k] with lo = bf16(x - hi), so that
 * hi + lo keeps ~16 mantissa bits of each activation.
 *
 * Output buffers of matrix products ("y"): every kernel that consumes one (QK-norm, add-norm, GeGLU, logits) reads
 * its ny slices ([ny][m][n]) and writes zeros back, so that y is all zeros whenever a product starts: the
 * tensor-core kernels split K across warps and add their partial sums with atomics. */
#ifndef G3_CUDA_COMMON_CUH
#define G3_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "gemma3.h"
#include "sample/dev_sample.h"
}

enum { G3Q_BF16 = 0, G3Q_INT8 = 1, G3Q_INT4 = 2, G3Q_FP8 = 3 };

typedef struct g3_dmat {
    int qt;       /* G3Q_* */
    int n, k;     /* rows (outputs), values per row */
    int g;        /* group size of the scales (k for per-channel) */
    void *q;      /* payload, layout per qt */
    float *s;     /* [n][k/g] scales (quantized types) */
    float *z;     /* [n][k/g] offsets (int4) */
    size_t bytes; /* device bytes of q + s + z (+ kc + kd) */
    /* GGUF Q4_K / Q4_0 / Q8_0 (groups of 32), or NULL: the scales as the file has them, for the one-row products
     * (qgemv_p.cu). Q4_K: kc [n][k/32] = sc | m << 8 (6-bit integers), kd [n][k/256] = half2 (d, -dmin) bits, so that
     * s = d sc and z = -dmin m (2.5 bytes a group instead of s and z's 8); Q4_0 / Q8_0: kc = the fp16 bits of d, kd
     * NULL (s = d, Q4_0's z = -8 d). The same floats as s and z. */
    uint16_t *kc;
    uint32_t *kd;
    /* int4 quantized here from floats in groups of 128 (unless $G3_CUDA_Q4SZ=0 at create), or NULL: (s, z) of each group as
     * a half2 (s low), the one-row products' copy (4 bytes a group of 64 weight bytes instead of s and z's 8); s and z
     * are rounded to float16 when quantized, so these are the same values bit for bit */
    uint32_t *sz;
} g3_dmat;
/* Floats allocated (zeroed) past the end of every scale and offset array: the one-row dp4a kernel (qgemv_p.cu) loads
 * the scales of a step's chunks past the end of a row without a predicate, at most 3 * 32 - 1 chunks (one group each)
 * past it */
#define G3C_DMAT_SPAD 128
/* a resident matrix of n rows of k values in format qt (scale groups of g), uninitialized but for that padding; free
 * with g3cb_free_dmat (cuda_weights.cu; the backend's weights and the test hooks' matrices alike) */
g3_status g3cb_alloc_dmat(g3_dmat *d, int qt, int n, int k, int g, g3_error *err);
/* kc (/ kd) of a matrix whose rows all come from src_type Q4_K, Q4_0 or Q8_0 (g3c_convert_rows then fills them);
 * $G3_CUDA_Q4KC=0: none (the one-row products read s and z) */
g3_status g3cb_alloc_kcodes(g3_dmat *d, uint32_t src_type, g3_error *err);
int g3cb_kcodes_wanted(const g3_dmat *d, uint32_t src_type); /* g3cb_alloc_kcodes allocates them for d */
/* g3_dmat.sz for int4 in groups of 128 from a float source unless $G3_CUDA_Q4SZ=0 (before the conversion) */
g3_status g3cb_alloc_sz(g3_dmat *d, uint32_t src_type, g3_error *err);
int g3cb_q4sz_wanted(const g3_dmat *d, uint32_t src_type);
void g3cb_free_dmat(g3_dmat *d);

/* Element i of row r of a resident matrix, dequantized. */
static __device__ __forceinline__ float dmat_val(const g3_dmat &w, size_t r, int i) {
    size_t gi = r * (w.k / w.g) + i / w.g;
    switch (w.qt) {
    case G3Q_BF16: return __bfloat162float(((const __nv_bfloat16 *)w.q)[r * w.k + i]);
    case G3Q_INT8: return w.s[gi] * (float)((const int8_t *)w.q)[r * w.k + i];
    case G3Q_FP8: {
        __nv_fp8_e4m3 f;
        f.__x = ((const __nv_fp8_storage_t *)w.q)[r * w.k + i];
        return w.s[gi] * (float)f;
    }
    default: {
        uint8_t b = ((const uint8_t *)w.q)[(r * w.k + i) / 2];
        int q = (i & 1) ? (b >> 4) : (b & 15);
        return w.s[gi] * (float)q + w.z[gi];
    }
    }
}
/* Fills err and returns G3_ERR_DEVICE when a CUDA call failed. */
g3_status g3c_fail(g3_error *err, g3_status code, const char *fmt, ...);
#define G3C_CK(call, what)                                                                                             \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
            return g3c_fail(err, G3_ERR_DEVICE, "cuda: %s failed (%s:%d): %s", what, __FILE__, __LINE__,               \
                            cudaGetErrorString(e_));                                                                   \
    } while (0)
/* The same where the caller cleans up: sets the caller's g3_status rc and jumps to `label`. */
#define G3C_CK_GOTO(call, what, label)                                                                                 \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            rc = g3c_fail(err, G3_ERR_DEVICE, "cuda: %s: %s", what, cudaGetErrorString(e_));                           \
            goto label;                                                                                                \
        }                                                                                                              \
    } while (0)

/* ---- launches ------------------------------------------------------------------------------------------------ */
/* Programmatic dependent launch: forward kernels are launched with programmatic stream serialization, so the next
 * kernel's blocks are scheduled while the previous kernel drains; each forward kernel starts with g3c_pdl_wait(),
 * which returns once the previous kernel has completed and its writes are visible, then lets its own successor be
 * scheduled. Without the launch attribute both instructions are no-ops. */
/* the two halves; g3c_pdl_wait_only + a later g3c_pdl_trigger lets the successor in later than at this kernel's start
 * (tc_wg.cu's late trigger) */
static __device__ __forceinline__ void g3c_pdl_wait_only() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void g3c_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ void g3c_pdl_wait() {
    g3c_pdl_wait_only();
    g3c_pdl_trigger();
}
/* 1 unless $G3_CUDA_PDL=0 (read once). */
int g3c_pdl_enabled(void);
template <typename... KArgs, typename... Args>
static cudaError_t g3c_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                              Args... args) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = g3c_pdl_enabled() && st ? 1 : 0; /* not on the legacy stream */
    return cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
}
/* Once per kernel instance (no-op when *bps is set): allows `smem` bytes of dynamic shared memory and sets *bps to the
 * kernel's resident blocks per SM at `threads` threads per block (at least 1). */
template <typename K> static cudaError_t g3c_smem_setup(K k, int smem, int threads, int *bps) {
    if (*bps) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    int b = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, threads, (size_t)smem);
    if (e != cudaSuccess) return e;
    *bps = b < 1 ? 1 : b;
    return cudaSuccess;
}

/* ---- conversion at load (convert.cu) ---------------------------------------------------------------------- */
/* Converts rows [0, n_rows) of a raw source tensor (GGUF/our dtype `src_type`, k values per row, already on the
 * device) into rows dst_row0 + i*dst_step of dst. `exact` picks the lossless repack of a quantized source. */
cudaError_t g3c_convert_rows(const void *src, uint32_t src_type, int n_rows, g3_dmat *dst, int dst_row0, int dst_step,
                             cudaStream_t st);
/* Fills n*k bf16 values with uniform random numbers of standard deviation sd (deterministic in seed). */
cudaError_t g3c_fill_random_bf16(__nv_bfloat16 *dst, size_t n, float sd, uint64_t seed, cudaStream_t st);
/* Dequantizes the whole matrix to bf16 [n][k] (for cuBLAS on quantized weights; 8 values per thread). */
cudaError_t g3c_dequant_bf16(const g3_dmat *w, __nv_bfloat16 *dst, cudaStream_t st);
/* Row-wise dequantization to float32 [n][k] (tests). */
cudaError_t g3c_dequant_f32(const g3_dmat *w, float *dst, cudaStream_t st);
/* Format chosen for a source type when the user asked for `want` (float sources) — quantized sources keep
 * their own family: Q8_0 -> int8/32, Q6_K -> int8/16, Q4_0 and Q4_K -> int4/32. Returns -1 if unsupported. */
int g3c_target_format(uint32_t src_type, int want, int k, int *group);
/* 1 when src_type converts into (qt, g) losslessly or as a requested quantization (is the pair supported). */
int g3c_can_convert(uint32_t src_type, int qt, int g);
/* Bytes of a source row of k values of a file type; 0 if unsupported. */
size_t g3c_src_row_bytes(uint32_t t, int k);
size_t g3c_dmat_bytes(int qt, int n, int k, int g);

/* ---- matrix products on CUDA cores (gemv.cu) -------------------------------------------------------------- */
/* y[i][j] = sum_k x[i][k] * W[j][k] for i < m (m <= 8), x float32 with row stride ldx, y row stride ldy (written,
 * not accumulated). geglu: W rows come in (gate, up) pairs and y[i][j/2] = gelu_tanh(gate) * up instead.
 * Exact for every format (GGUF groups of 16/32 included); the tensor-core kernels take over where they can. */
cudaError_t g3c_gemv(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu, cudaStream_t st);

/* ---- decode products on quantized weights with q8 activations and dp4a (qgemv.cu) ------------------------------ */
/* Same contract as g3c_gemv (y written, geglu fused) for int8 (per channel, groups of 16 * 2^j) and int4 (groups of
 * 32 * 2^j) weights, k a multiple of 32, m <= 8: x is quantized to int8 in blocks of 32 values (one float scale each)
 * into q8 (g3c_qgemv_q8_bytes(m, k) bytes; NULL or smaller: a stream-ordered scratch), then multiplied with dp4a.
 * Error: W_deq . xh exactly up to float rounding, |xh - x| <= max|x| of the block / 254 per value. */
int g3c_qgemv_supported(const g3_dmat *w, int m);
size_t g3c_qgemv_q8_bytes(int m, int k);
cudaError_t g3c_qgemv(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu, void *q8,
                      size_t q8_bytes, cudaStream_t st);
/* 1-2 rows (unless $G3_CUDA_QGEMVP=0): one persistent kernel that quantizes x itself into shared memory (no q8 buffer,
 * no second launch); without geglu it ADDS into y, which must hold zeros (as every product output does between
 * uses; so does the persistent bf16 GEMV, $G3_CUDA_GEMVPF=2). g3c_qgemv_init: its shared-memory limits (call once
 * before capturing graphs; idempotent). */
cudaError_t g3c_qgemv_init(void);
int g3c_qgemvp_enabled(void);
/* The persistent kernel with the decode add-norm in its prologue (batch-1 decode; $G3_CUDA_PNORM=0: off): every
 * block computes, for the m rows of H = k values, xo = xi + rms(y) * w1 and xn = rms(xo) * w2 (the separate add-norm
 * kernel's arithmetic), quantizes xn as g3c_qgemv does, and stores its slice of xo (xo != xi: other blocks still read
 * xi; y is not zeroed here, since they also read it). y == NULL: no norm, the product of x = xi as g3c_qgemv.
 * zero (optional): zero_n floats set to 0 after the launch wait (a buffer an earlier kernel finished reading, so
 * that the chain of decode kernels keeps every product output at zero between uses without extra launches). */
typedef struct g3c_qp_pre {
    const float *xi, *y, *w1, *w2; /* y: [m][k] (one slice) */
    float *xo;
    float eps;
    float *zero;
    int zero_n;
    int xi_late; /* xi was written by the previous kernel (not two or more back): read after the launch wait */
} g3c_qp_pre;
int g3c_pnorm_mode(void); /* $G3_CUDA_PNORM: 0 off, 1 on, -1 auto (cuda_forward.cu's pnorm_ok) */
int g3c_qgemv_pn_supported(const g3_dmat *w, int m, int geglu);
int g3c_qgemvp_kslices(const g3_dmat *w, int geglu, int *n_sm); /* K-slices at 1-2 rows (0: no GPU); the SM count */
int g3c_qgemvp_ring(const g3_dmat *w, int m, int geglu, int pn); /* 1: the product's weights go through the ring */
int g3c_qgemvp_f16(const g3_dmat *w, int m, int geglu, int pn); /* 1: on float16 products (fp8, int8 by policy) */
int g3c_qgemvp_kc(const g3_dmat *w, int m, int geglu, int pn);  /* 1: reads the GGUF scale codes (g3_dmat.kc) */
int g3c_qgemvp_sz(const g3_dmat *w, int m, int geglu, int pn);  /* 1: reads int4's half2 pairs (g3_dmat.sz) */
/* The gate/up product with the add-norm prologue and GeGLU (g3c_qgemv_pn's, into a [m][lda]) and the down product of
 * a (y [m][ldy] += a . dn, y zeroed by pre->zero) in one launch at one row, the down product's K-slices starting as
 * the gate/up outputs they read are complete ($G3_CUDA_QPGD=1; qgemv_gd.cu's k_qgemv_gd). cnt: G3C_GD_WORDS zeroed
 * counters, reset by each launch for the next; word 10 set means a wait ran out (the outputs are wrong). */
#define G3C_GD_WORDS 16
int g3c_qgemv_gd_enabled(void);
int g3c_qgemv_gd_ok(const g3_dmat *gu, const g3_dmat *dn, int m);
cudaError_t g3c_qgemv_gd(const g3_dmat *gu, const g3c_qp_pre *pre, const g3_dmat *dn, int m, float *a, int lda,
                         float *y, int ldy, unsigned *cnt, cudaStream_t st);
cudaError_t g3c_qgemv_pn(const g3_dmat *w, const g3c_qp_pre *pre, int m, float *y, int ldy, int geglu,
                         cudaStream_t st);

/* ---- matrix products on tensor cores (tc_gemv.cu) ----------------------------------------------------------- */
/* y[i][j] += sum_k x[i][k] W[j][k] for i < m (atomically; y must hold zeros or a partial sum), with xh the bf16
 * activations ([m][k] hi, then [m][k] lo when split). Weights are streamed once with 16-byte loads, decoded in
 * registers (int4 nibbles by mask-and-or into bf16, int8 through float, fp8 through half) and multiplied with
 * mma.sync m16n8k16 into float32 accumulators; the work (16-row tiles x rounds of 4 16-byte chunks per row) is cut
 * into equal contiguous pieces, one per warp of a persistent grid (stream-K).
 * split (m <= 8): hi and lo are two columns each, exact weights (int4 scales and offsets applied per 128 values
 * through an all-ones product that gives the sums of x); plain (m <= 64): bf16 activations, weights in groups
 * smaller than a row dequantized to bf16 in registers. */
struct g3c_tc_geglu {      /* GeGLU fused into the product (a == NULL: none) */
    float *a;               /* [m][n/2] gelu_tanh(gate) * up, rows of W in (gate, up) pairs */
    __nv_bfloat16 *ah;      /* its bf16 copy: hi [m][n/2], then lo when split */
    unsigned *cnt;          /* [tiles] zero between launches (g3c_tc_tiles) */
    int split;
};
int g3c_tc_supported(const g3_dmat *w, int m, int split);
/* Row tiles of the kernel g3c_tc_mm picks for (w, m, split): the counters a fused GeGLU needs. */
int g3c_tc_tiles(const g3_dmat *w, int m, int split);
cudaError_t g3c_tc_mm(const g3_dmat *w, const __nv_bfloat16 *xh, int m, int split, float *y, const g3c_tc_geglu *gg,
                      int n_sm, cudaStream_t st);
/* Occupancy of the tensor-core kernels (call once before capturing graphs; later calls are no-ops). */
cudaError_t g3c_tc_init(void);
/* 9..64 plain rows on quantized weights with the activations staged in shared memory (tc_stage.cu); g3c_tc_mm
 * takes it where g3c_tcm_supported (0 with $G3_CUDA_TCM=0). g3c_tcm_init: shared-memory limits and occupancy. */
int g3c_tcm_supported(const g3_dmat *w, int m);
/* tc_wg.cu: per-channel int8 products of 1..128 rows on Hopper's warpgroup MMA (activations quantized as for
 * g3c_tq_mm_pre); g3c_tq_mm and g3c_tq_mm_pre take it from g3c_wg_min_rows() rows ($G3_CUDA_WGMIN, 33), g3c_mm for
 * decode batches of 65..256 rows in equal launches of up to 128. g3c_wg_supported is 0 with $G3_CUDA_WG=0. */
int g3c_wg_supported(const g3_dmat *w, int m);
int g3c_wg_min_rows(void);
cudaError_t g3c_wg_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                      cudaStream_t st);
cudaError_t g3c_wg_init(void);
/* tc_wg.cu, fp8 (e4m3 per channel): products of 1..128 rows on e4m3 warpgroup MMA, the activations split into e4m3 hi
 * + lo parts per row and block of 128 values (d = amax/448; ~8 bits of each value, as the bf16 copy the staged kernel
 * reads), written by the producer or k_tq_quant (tq_act.cuh, il G3C_TQ_FP8 + g3c_wgf_lo_row(m)): hi rows [0, m), lo
 * rows from g3c_wgf_lo_row(m), xd [rows][k/128] (g3c_wgf_q_bytes(m, k) with xd right after the rows). g3c_wgf_taken:
 * the forward's 9..64-row products and g3c_tc_mm take it from g3c_wgf_min_rows() rows ($G3_CUDA_WGF=0: never,
 * $G3_CUDA_WGFMIN: 33), and from 17 rows on matrices where g3c_wgf_big (n k >= $G3_CUDA_WGFW, 16 M); g3c_mm for
 * decode batches of 65..256 rows in equal launches of up to 128 (65..128 rows: two warpgroups, lo rows from 128;
 * with $G3_CUDA_WGF2=0 launches of up to 64, on matrices where g3c_wgf_big, as before). */
int g3c_wgf_supported(const g3_dmat *w, int m);
int g3c_wgf_taken(const g3_dmat *w, int m);
int g3c_wgf_big(const g3_dmat *w);
int g3c_wgf_min_rows(void);
int g3c_wgf_lo_row(int m);
size_t g3c_wgf_q_bytes(int m, int k);
cudaError_t g3c_wgf_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st);
/* tc_wg.cu: the gate/up product with GeGLU and the down product's quantization in its last step, where each block
 * takes one whole channel tile (33..64 rows, per-channel int8 or fp8; tiles of 128 interleaved (gate, up) channels:
 * 64 GeGLU values). The two blocks of a 128-value quantization block meet through h and cnt: each writes its 64
 * values to h, the second to arrive quantizes all 128 into xq / xd (tq_act.cuh, value order il) and clears the
 * counter. y is not touched, and no GeGLU launch follows. g3c_wg_geglu_ok: the forward may take it for (gu, m) with
 * the down product's order il ($G3_CUDA_WGGG=0: never; =2: also where whole tiles are not the policy, for tests). */
typedef struct g3c_wg_gg {
    float *h;      /* [m][n/2] scratch */
    unsigned *cnt; /* [n/256], zero on entry; zero again on exit */
    int8_t *xq;    /* [m][n/2] (fp8: + lo rows at il - G3C_TQ_FP8), then xd [rows][n/256] */
    float2 *xd;
    int il, tanhf; /* tanhf: gelu_tanh_ref, as k_geglu4 with G3C_GELU_TANHF */
} g3c_wg_gg;
int g3c_wg_geglu_ok(const g3_dmat *gu, int m, int il, int n_sm);
cudaError_t g3c_wg_mm_geglu(const g3_dmat *gu, const int8_t *xq, const float2 *xd, int m, const g3c_wg_gg *gg,
                            int n_sm, cudaStream_t st);
int g3c_gelu_tanhf(void); /* 1 with $G3_CUDA_GELU=tanhf (read once) */
/* tc_wg4.cu: int4 products (groups of 128 * j) of 9..16 and 33..64 rows on warpgroup MMA with the weights in
 * registers (activations quantized as for g3c_tq_mm_pre, value order 2); g3c_tq_mm and g3c_tq_mm_pre take it where
 * g3c_wg4_supported ($G3_CUDA_WG4=0: never; all: 9..64 rows). */
int g3c_wg4_supported(const g3_dmat *w, int m);
cudaError_t g3c_wg4_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st);
cudaError_t g3c_wg4_init(void);
/* tc_q4r.cu: int4 (groups of 128), per-channel int8 and fp8 products of 1..32 rows on tensor cores with the weights
 * loaded straight into registers (activations quantized as for g3c_tq_mm_pre: value order 1 / 0, fp8's e4m3 hi + lo
 * rows); g3c_tq_mm and g3c_tq_mm_pre take it first where g3c_q4r_taken (large matrices, up to $G3_CUDA_Q4RMAX rows,
 * default 16; $G3_CUDA_Q4R=0: never), at the rows they get (3..16 by default). */
int g3c_q4r_taken(const g3_dmat *w, int m);
cudaError_t g3c_q4r_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st);
long long g3c_q4r_launches(void); /* launches so far (the test hooks' proof that it ran) */
/* tc_wgb.cu: int4 products (groups of 128 * j) of 65..128 rows (from $G3_CUDA_WGBMIN rows, >= 9) on bf16 warpgroup
 * MMA with the weights dequantized in registers (activations bf16 in value order 3); g3c_tq_mm and g3c_tq_mm_pre take
 * it where g3c_wgb_supported ($G3_CUDA_WGB=0: never), g3c_mm for decode batches of 65..256 rows in equal launches of
 * up to 128. xb: [m][k] bf16 in that order. */
int g3c_wgb_supported(const g3_dmat *w, int m);
cudaError_t g3c_wgb_mm(const g3_dmat *w, const __nv_bfloat16 *xb, int m, float *y, int n_sm, cudaStream_t st);
cudaError_t g3c_wgb_init(void);
/* tc_q8g.cu: GGUF products in groups of 32 (Q8_0 as int8, Q4_0 / Q4_K as int4) of 9..64 rows on int8 tensor cores,
 * one k32 MMA a group (activations quantized as for g3c_tq_mm_pre, value order 0 / 1); g3c_tq_mm and g3c_tq_mm_pre
 * take it where g3c_tqg_supported ($G3_CUDA_TQG=0: never; those formats then stay on tc_stage.cu's bf16 kernel). */
int g3c_tqg_supported(const g3_dmat *w);
int g3c_tqg_min_rows(void);
/* Below 9 rows: the int8 tensor-core kernels (tc_q8.cu for int8 per channel and int4 in groups of 128 * j, tc_q8g.cu
 * for the GGUF groups) take a product of m rows on w from g3c_tq_min_rows(w) rows ($G3_CUDA_TQMIN, $G3_CUDA_TQGMIN;
 * 65 for formats they never take); g3c_tq_small: whether they take this one (tc_stage.cu, with $G3_CUDA_TCM's modes);
 * g3c_tq_small_min: the fewest rows at which any format goes there */
int g3c_tq_min_rows(const g3_dmat *w);
int g3c_tq_small_min(void);
int g3c_tq_small(const g3_dmat *w, int m);
cudaError_t g3c_tqg_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st);
cudaError_t g3c_tqg_init(void);
long long g3c_tqg_kc_launches(void); /* tc_q8g.cu launches that read the files' scale codes (test hooks) */
/* Activations quantized by their producer (tq_act.cuh) for the int8 tensor-core kernels (tc_q8.cu, tc_wg.cu,
 * tc_wg4.cu): g3c_tq_taken says whether the forward's product of m rows on w runs there (path TC, 9..64 rows,
 * $G3_CUDA_TQPRE != 0), g3c_tq_order which value order its activations need (tq_act.cuh's il); g3c_tq_mm_pre =
 * g3c_tq_mm on activations already quantized: xq [m][k] (bf16 for order 3), xd [m][k/128]. g3c_tq_q8_bytes: room
 * for either, xd at xq + 2 m k. */
int g3c_tq_taken(const g3_dmat *w, int m);
int g3c_tq_order(const g3_dmat *w, int m);
size_t g3c_tq_q8_bytes(int m, int k);
cudaError_t g3c_tq_mm_pre(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                          cudaStream_t st);
/* xh (bf16 [m][k], hi rows) quantized as g3c_tq_mm would for w (order g3c_tq_order(w, m)) into xq / xd. */
cudaError_t g3c_tq_quant(const g3_dmat *w, const __nv_bfloat16 *xh, int m, int8_t *xq, float2 *xd, cudaStream_t st);
/* g3c_tq_mm on bf16 activations (tc_q8.cu): quantizes them (k_tq_quant) into q8 (or a scratch of its own), then the
 * product; up to 64 rows, 128 where g3c_wg_supported; fp8 on tc_wg.cu's e4m3 kernel (g3c_wgf_mm) */
cudaError_t g3c_tq_mm(const g3_dmat *w, const __nv_bfloat16 *xh, int m, float *y, int n_sm, void *q8, size_t q8_bytes,
                      cudaStream_t st);
cudaError_t g3c_tcm_mm(const g3_dmat *w, const __nv_bfloat16 *xh, int m, float *y, int n_sm, cudaStream_t st);
cudaError_t g3c_tcm_init(void);

/* ---- matrix products on any path (matmul.cu) -------------------------------------------------------------- */
#include <cublas_v2.h>
struct g3c_mm_ctx {
    cublasHandle_t cub;
    cudaStream_t st;
    __nv_bfloat16 *wscratch; /* bf16 copy of one quantized matrix for cuBLAS (NULL: none, tensor cores up to 64) */
    int split;               /* activations as bf16 hi + lo (cuBLAS: two stacked row blocks; tc: two columns) */
    int n_sm;
    unsigned *tile_cnt;      /* zeroed counters for a fused GeGLU, >= g3c_tc_tiles of any GeGLU matrix; NULL: none */
    int tile_cnt_n;
    void *q8;                /* q8 activations of the dp4a path (qgemv.cu), q8_bytes; NULL: allocated per call */
    size_t q8_bytes;
    int qact;                /* 1: int8-quantized activations beyond 64 rows too (per-channel int8 on wgmma, tc_wg.cu;
                              * decode batches of distinct sequences); 0: cuBLAS there (prefill keeps its exact path) */
};
enum { G3C_PATH_GEMV = 0, G3C_PATH_TC = 1, G3C_PATH_CUBLAS = 2, G3C_PATH_QGEMV = 3 };
/* Path g3c_mm takes for m rows of w: the dp4a path for int8/int4 up to $G3_CUDA_QGEMV rows (default 8, 0 = off),
 * tensor cores for m <= 8 (exact formats) and for quantized m <= 64, the CUDA-core GEMV for the other m <= 8 (and
 * everything up to its old limit with $G3_CUDA_TC=0), else cuBLAS. GEMV and QGEMV read the float32 activations x,
 * the others the bf16 copies xh. */
int g3c_mm_path(const g3c_mm_ctx *c, const g3_dmat *w, int m);
/* y = x W^T for m rows. x: float32 [m][k] (GEMV path); xh: bf16 copies (tc and cuBLAS paths). y holds zeros on
 * entry; on return it holds *ny slices [*ny][m][n] whose sum is the product (2 for split cuBLAS, else 1).
 * geglu: gelu(gate)*up goes to a [m][n/2] directly where the path can fuse it: *fused = 1 (GEMV: a only) or 2
 * (tensor cores: a and its bf16 copy ah); *fused = 0 leaves the (gate, up) pairs in y for g3c_geglu. */
cudaError_t g3c_mm(const g3c_mm_ctx *c, const g3_dmat *w, const float *x, const __nv_bfloat16 *xh, int m, float *y,
                   int *ny, float *a, __nv_bfloat16 *ah, int geglu, int *fused);

/* ---- elementwise / norm kernels (kernels.cu) -------------------------------------------------------------- */
struct g3c_rows { /* per-forward row parameters in device memory */
    const int32_t *token; /* [R] */
    const int32_t *pos;   /* [R] */
    const int32_t *useq;  /* [R] index into bt (unique sequence of the batch), -1 = padding row */
    const int32_t *bt;    /* [n_u][2][mbps]: global table then local table of each unique sequence */
    int mbps;
};

/* x[r] = E[token[r]] * scale; xn[r] = rms(x[r]) * w. Writes xh (bf16 hi rows, lo at +m rows when split). */
cudaError_t g3c_embed_norm(const g3_dmat *E, const int32_t *token, float scale, const float *w, float eps, int m,
                           int H, float *x, float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st);
/* x[r] += rms(sum of the ny slices of y[r]) * w1 (the slices are zeroed); xn[r] = rms(x[r]) * w2 (+ bf16 copies). */
cudaError_t g3c_add_norm(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m,
                         int H, float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st);
/* a[r][i] = gelu_tanh(y[r][2i]) * y[r][2i+1] over interleaved (gate, up) rows (ny slices, zeroed); bf16 copies. */
cudaError_t g3c_geglu(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah, int split,
                      cudaStream_t st);
/* Flags of the _f variants (many-row kernels; the others ignore them and do everything): G3C_KEEP_Y leaves the
 * product slices as they are (the next writer of y overwrites them: cuBLAS, beta = 0; the forward clears y after its
 * last layer), G3C_NO_F32 skips the float32 output (xn, a) when only its bf16 copies are read. $G3_CUDA_NOZERO=0: the
 * forward passes no flags. */
enum { G3C_KEEP_Y = 1, G3C_NO_F32 = 2, G3C_GELU_TANHF = 4 /* k_geglu4: gelu_tanh_ref ($G3_CUDA_GELU) */ };
int g3c_nozero_enabled(void);
cudaError_t g3c_add_norm_f(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m, int H,
                           float *xn, __nv_bfloat16 *xh, int split, int flags, cudaStream_t st);
cudaError_t g3c_geglu_f(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah, int split, int flags,
                        cudaStream_t st);
/* GeGLU with the outputs also quantized into xq / xd for g3c_tq_mm_pre (F % 128 == 0, ny <= 2; y zeroed); a (float32)
 * and ah (bf16) copies only where not NULL. */
cudaError_t g3c_geglu_tq(float *y, int ny, int m, int F, float *a, __nv_bfloat16 *ah, int split, int8_t *xq,
                         float2 *xd, int il, cudaStream_t st);
/* f32 [m][n] -> bf16 hi [m][n] (+ lo at +m rows). */
cudaError_t g3c_to_bf16(const float *x, int m, int n, __nv_bfloat16 *xh, int split, cudaStream_t st);
/* dst[i] = src[rows[i]] for i < n (rows of width n_cols). */
cudaError_t g3c_gather_rows(const float *src, const int32_t *rows, int n, int n_cols, float *dst, cudaStream_t st);
/* logits[i][v] = softcap(sum of the ny slices of y[i][v]) (slices zeroed) */
cudaError_t g3c_finish_logits(float *y, int ny, int m, int V, float cap, float *out, cudaStream_t st);
/* ids[i] = argmax_v logits[i][v] */
cudaError_t g3c_argmax(const float *logits, int m, int V, int32_t *ids, cudaStream_t st);

/* ---- attention (attention.cu) ----------------------------------------------------------------------------- */
struct g3c_attn_args {
    g3c_rows rows;
    int m;            /* rows */
    int NH, NKV, D;
    int kind;         /* 0 global, 1 sliding */
    int layer_in_kind, n_layers_kind;
    int kv_block;
    int window;       /* sliding window (kind 1) */
    float scale;      /* 1/sqrt(query_pre_attn_scalar) */
    float softcap;    /* 0 = none */
    float eps;
    const float *inv_freq; /* [D/2] for this kind */
    void *pool;       /* KV pool of this kind: float32, or bf16 where kv16 */
    int kv16;         /* 1: the cache holds bf16 K/V (g3c_kv_ld / g3c_kv_st) */
    int n_splits;     /* blocks per (row, kv head), <= 64 */
    int min_keys;     /* fewest keys a split takes (fewer splits are used for short contexts) */
    /* optional (NULL: none; g3c_attn_tq_ok says where taken): o quantized for the o product by the decode attention
     * (tq_act.cuh: [m][NH*D] int8 in value order tq_il, (d, d * sum q) [m][NH*D/128]) instead of o and its bf16
     * copies, which are then not written */
    int8_t *tq_x;
    float2 *tq_d;
    int tq_il;
    /* the qkv product's output y: 0, [ny][m][(NH + 2 NKV) D]; else v came from a product of its own (layer_dev.v) and
     * y holds [ny][m][(NH + NKV) D] for q and k, then [nyv][m][NKV D] for v */
    int nyv;
};
/* Slices of the qkv product's output that hold head hh (v heads: nyv where v had a product of its own). */
static __host__ __device__ __forceinline__ int g3c_qkv_slices(const g3c_attn_args &a, int ny, int hh) {
    return a.nyv && hh >= a.NH + a.NKV ? a.nyv : ny;
}
/* Offset in y of head hh (q, k, then v heads) of row r in slice j of the qkv product's output (g3c_attn_args.nyv). */
static __host__ __device__ __forceinline__ size_t g3c_qkv_at(const g3c_attn_args &a, int ny, int j, int r, int hh) {
    const int NQK = a.NH + a.NKV;
    if (!a.nyv) return ((size_t)j * a.m + r) * (NQK + a.NKV) * a.D + (size_t)hh * a.D;
    if (hh < NQK) return ((size_t)j * a.m + r) * NQK * a.D + (size_t)hh * a.D;
    return ((size_t)ny * a.m * NQK + ((size_t)j * a.m + r) * a.NKV + (hh - NQK)) * a.D;
}
/* K/V cache elements: bf16 (the default where the kernels take it: g3c_kv16_for) or float32 ($G3_CUDA_KV=f32,
 * `--kv-cache f32`): N consecutive values of a cache row as floats, and back (N = 1, 2, 4, 8; p aligned to N
 * elements). CG: through L2 past L1 (a row written by the kernel before, whose stale line L1 may hold). */
template <int N, bool CG = false> static __device__ __forceinline__ void g3c_kv_ld(float (&v)[N], const float *p) {
    if constexpr (N == 1) v[0] = CG ? __ldcg(p) : __ldg(p);
    else if constexpr (N == 2) {
        const float2 t = CG ? __ldcg((const float2 *)p) : __ldg((const float2 *)p);
        v[0] = t.x, v[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            const float4 t = CG ? __ldcg((const float4 *)p + i) : __ldg((const float4 *)p + i);
            v[4 * i] = t.x, v[4 * i + 1] = t.y, v[4 * i + 2] = t.z, v[4 * i + 3] = t.w;
        }
    }
}
static __device__ __forceinline__ float g3c_bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float g3c_bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
/* N (2, 4, 8k) consecutive bf16 cache values as loaded, two to a word: value 2i in the low half of w[i] */
template <int N, bool CG = false>
static __device__ __forceinline__ void g3c_kv_ld_raw(uint32_t (&w)[N / 2], const __nv_bfloat16 *p) {
    if constexpr (N == 2) w[0] = CG ? __ldcg((const unsigned *)p) : __ldg((const unsigned *)p);
    else if constexpr (N == 4) {
        const uint2 t = CG ? __ldcg((const uint2 *)p) : __ldg((const uint2 *)p);
        w[0] = t.x, w[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < N / 8; i++) {
            const uint4 t = CG ? __ldcg((const uint4 *)p + i) : __ldg((const uint4 *)p + i);
            w[4 * i] = t.x, w[4 * i + 1] = t.y, w[4 * i + 2] = t.z, w[4 * i + 3] = t.w;
        }
    }
}
template <int N, bool CG = false>
static __device__ __forceinline__ void g3c_kv_ld(float (&v)[N], const __nv_bfloat16 *p) {
    if constexpr (N == 1) v[0] = __bfloat162float(CG ? __ldcg(p) : __ldg(p));
    else {
        uint32_t w[N / 2];
        g3c_kv_ld_raw<N, CG>(w, p);
#pragma unroll
        for (int i = 0; i < N / 2; i++) v[2 * i] = g3c_bf_lo(w[i]), v[2 * i + 1] = g3c_bf_hi(w[i]);
    }
}
/* one cache element */
static __device__ __forceinline__ void g3c_kv_put(float *p, float v) { *p = v; }
static __device__ __forceinline__ void g3c_kv_put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
template <int N> static __device__ __forceinline__ void g3c_kv_st(float *p, const float (&v)[N]) {
    if constexpr (N == 1) g3c_kv_put(p, v[0]);
    else if constexpr (N == 2) *(float2 *)p = make_float2(v[0], v[1]);
    else
#pragma unroll
        for (int i = 0; i < N / 4; i++) ((float4 *)p)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}
static __device__ __forceinline__ uint32_t g3c_bf_pack(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
}
template <int N> static __device__ __forceinline__ void g3c_kv_st(__nv_bfloat16 *p, const float (&v)[N]) {
    if constexpr (N == 1) g3c_kv_put(p, v[0]);
    else if constexpr (N == 2) *(uint32_t *)p = g3c_bf_pack(v[0], v[1]);
    else if constexpr (N == 4) *(uint2 *)p = make_uint2(g3c_bf_pack(v[0], v[1]), g3c_bf_pack(v[2], v[3]));
    else
#pragma unroll
        for (int i = 0; i < N / 8; i++)
            ((uint4 *)p)[i] = make_uint4(g3c_bf_pack(v[8 * i], v[8 * i + 1]), g3c_bf_pack(v[8 * i + 2], v[8 * i + 3]),
                                         g3c_bf_pack(v[8 * i + 4], v[8 * i + 5]),
                                         g3c_bf_pack(v[8 * i + 6], v[8 * i + 7]));
}
/* 1: the backend of this model keeps a bf16 K/V cache: $G3_CUDA_KV=bf16; or unset / auto where the cluster decode
 * attention (attention_dec.cu) takes the shape (head_dim 64, 128 or 256: every released Gemma 3); f32: never.
 * Read at create. */
int g3c_kv16_for(const g3_config *c);

/* QK-norm + RoPE of q and k, and the K/V write into the paged cache, from qkv = the ny slices of y
 * [ny][m][(NH+2NKV)*D] (zeroed after reading);
 * q goes to qout [m][NH*D]. */
cudaError_t g3c_qkv_post(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn,
                         float *qout, cudaStream_t st);
/* o[m][NH*D] = softmax(q k^T) v over the paged cache, and its bf16 copy oh (hi, then lo at +m rows when split):
 * flash-decoding with n_splits partials in part, merged by the last block of each (row, kv head), which finds
 * itself through cnt ([m][NKV] counters, zero between launches). */
cudaError_t g3c_attention(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt, float *o,
                          __nv_bfloat16 *oh, int split, cudaStream_t st);
size_t g3c_attn_part_floats(int rows_x_splits, int NH, int D);
/* 1 where g3c_attention / g3c_attention_fused take a.tq_x (the decode kernel of attention_dec.cu, G*D % 128 == 0;
 * not for prefill steps); $G3_CUDA_ATTNTQ=0: never (the o product quantizes its input itself, as before) */
int g3c_attn_tq_ok(const g3c_attn_args *a);

/* ---- many rows and prefill (kernels.cu, attention_prefill.cu) ------------------------------------------------- */
#define G3C_ROWK_MIN 16 /* rows from which the many-row variants of the row-wise kernels are used */
int g3c_rowk_enabled(void); /* 1 unless $G3_CUDA_ROWK=0 */
int g3c_dev_sms(void);      /* multiprocessors of the current device, asked once (132 if it cannot be asked) */
/* g3c_qkv_post for many rows (m >= G3C_ROWK_MIN, ny <= 2; otherwise it calls g3c_qkv_post). */
cudaError_t g3c_qkv_post_rows(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn,
                              float *qout, cudaStream_t st);
cudaError_t g3c_qkv_post_rows_f(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn,
                                float *qout, int flags, cudaStream_t st); /* G3C_KEEP_Y */
/* $G3_CUDA_FA: 0 off, 1 forced, 2 auto (default). */
int g3c_fa_mode(void);
/* Host side: whether the batch (sequence slot of each of M rows) takes the prefill attention path: 0 no, 1 yes,
 * 2 yes and every row is a flash row (no decode rows: the decode kernel is left out). */
int g3c_fa_wanted(const int32_t *seq, int M, int NH, int NKV, int D, int n_sm);
/* Once per forward: fa_useq[r] = -1 for the rows the flash kernel takes, else useq[r] ([m] ints). */
cudaError_t g3c_fa_plan(const g3c_rows *rows, int m, int NH, int NKV, int32_t *fa_useq, cudaStream_t st);
/* g3c_attention for a batch planned by g3c_fa_plan: the decode kernel for the other rows, then the flash kernel. */
/* The flash kernel on tensor cores (attention_tc.cu): 3xTF32 ($G3_CUDA_FATC=1|2) or BF16 (3|4, unset = 4) products,
 * one or two warp groups; a bf16 cache on the BF16 forms with K and V exact (two MMAs a product, not three).
 * g3c_fa_tc_takes: whether it takes these arguments (else g3c_fa_tc returns cudaErrorNotSupported and
 * g3c_attention_prefill uses the CUDA-core kernel); g3c_fatc_enabled: the form, 0 = off. */
cudaError_t g3c_fa_tc(const g3c_attn_args *a, const float *q, const int32_t *fa_useq, float *o, __nv_bfloat16 *oh,
                      int split, cudaStream_t st);
int g3c_fa_tc_takes(const g3c_attn_args *a);
int g3c_fatc_enabled(void);
cudaError_t g3c_attention_prefill(const g3c_attn_args *a, const float *q, float *part, unsigned *cnt,
                                  const int32_t *fa_useq, int all_flash, float *o, __nv_bfloat16 *oh, int split,
                                  cudaStream_t st);
/* Decode (m <= 64, every row of its own sequence): g3c_qkv_post and g3c_attention in one launch, reading q, k, v
 * from the ny slices of y (zeroed by the block that finishes each (row, kv head)). 1 unless $G3_CUDA_DFUSE=0. */
cudaError_t g3c_attention_fused(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn,
                                float *part, unsigned *cnt, float *o, __nv_bfloat16 *oh, int split, cudaStream_t st);
int g3c_dfuse_enabled(void); /* default: 1 only where the second decode kernel is off ($G3_CUDA_ATTN2=0) */
/* Second decode attention (attention_dec.cu): one launch, a thread-block cluster of g3c_attn2_cluster(m, NKV) blocks
 * per (row, kv head) merging through distributed shared memory (no part/cnt). g3c_attention takes it where
 * g3c_attn2_supported (D 64/128/256, G*D <= 1024) unless $G3_CUDA_ATTN2=0; g3c_attn2_force(0/1) overrides the
 * switch for tests (-1: back to the environment), g3c_attn2_force_w(2, 4, 16) the warps per block (0: back). */
cudaError_t g3c_attn2(const g3c_attn_args *a, const float *q, float *o, __nv_bfloat16 *oh, int split,
                      cudaStream_t st);
/* The same with g3c_qkv_post fused in (g3c_attention_fused takes it where supported, unless $G3_CUDA_ATTN2=0): q, k,
 * v read from the ny slices of y (zeroed once read), the row's own key written to the cache by the warp using it. */
cudaError_t g3c_attn2_fused(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn, float *o,
                            __nv_bfloat16 *oh, int split, cudaStream_t st);
int g3c_attn2_supported(const g3c_attn_args *a);
int g3c_attn2_enabled(void);
void g3c_attn2_force(int on);
void g3c_attn2_force_w(int wpb);
int g3c_attn2_cluster(int m, int NKV, int *wpb); /* blocks per (row, kv head); *wpb: warps per block */

/* ---- decode add-norm (decode_norm.cu) ------------------------------------------------------------------------ */
/* g3c_add_norm for few rows (any m; meant for m <= 64): one 512-thread block per row, float4 accesses, the norm
 * weights loaded before the PDL wait. g3c_dnorm_enabled: 1 unless $G3_CUDA_DNORM=0 (also selects g3c_argmax_dec). */
cudaError_t g3c_add_norm_dec(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m, int H,
                             float *xn, __nv_bfloat16 *xh, int split, cudaStream_t st);
/* The same, xn also quantized into xq / xd for g3c_tq_mm_pre (H % 128 == 0; il: the value order of tq_act.cuh, from
 * g3c_tq_order); xn and xh
 * may be NULL when the product reads only the quantized copy. */
cudaError_t g3c_add_norm_dec_tq(float *x, float *y, int ny, const float *w1, const float *w2, float eps, int m,
                                int H, float *xn, __nv_bfloat16 *xh, int split, int8_t *xq, float2 *xd, int il,
                                cudaStream_t st);
/* g3c_argmax with one 1024-thread block per row and float4 loads (V % 4 == 0; else g3c_argmax). */
cudaError_t g3c_argmax_dec(const float *logits, int m, int V, int32_t *ids, cudaStream_t st);
int g3c_dnorm_enabled(void);
/* The sampling chain of sample/sampler.h for m rows of V logits (modified in place by the adjustments), one token id
 * per row (sample.cu). */
cudaError_t g3c_sample(float *logits, int m, int V, const g3_dev_sample *rows, const g3_dev_adjust *adj, int32_t *ids,
                       cudaStream_t st);

#endif
