/* C-callable extras of the CUDA backend beyond the g3_backend_ops table: creation with explicit options (weight
 * format, GEMM precision, random weights generated on the device for benchmarks), greedy argmax on the device,
 * bandwidth / tensor-core probes, and test hooks that run single kernels on host data.
 *
 * Environment (read by g3_backend_cuda.create, i.e. with default options):
 *   G3_CUDA_QUANT = bf16 | int8 | int4 | fp8   resident format of float-typed weights (default bf16);
 *                                              GGUF Q8_0/Q6_K/Q4_0/Q4_K weights keep their own family
 *   G3_CUDA_VSPLIT = 0                         (read at create) a GGUF v of another type than q and k makes the
 *                                              whole qkv matrix bf16, as before (default: v a product of its own)
 *   G3_CUDA_GEMM  = split | bf16               activations of tensor-core products as bf16 hi+lo (default) or
 *                                              plain bf16 (half the cuBLAS work; ~2^-9 relative rounding)
 *   G3_CUDA_GRAPHS = 0                         run every step eagerly (no CUDA graphs)
 *   G3_CUDA_PREPARE = 0                        capture each decode graph on first use, not when the engine is
 *                                              created (the backend's prepare op; read per call)
 *   G3_CUDA_TC = 0 | all                       no tensor-core decode kernels (CUDA-core GEMV up to 8/16 rows), or
 *                                              tensor cores for bf16 weights too (default: quantized weights only)
 *   G3_CUDA_PDL = 0                            no programmatic dependent launch
 *   G3_HOST_SAMPLING = 1                       (the engine's, read at create) sample on the host, not sample.cu
 * For comparisons: G3_CUDA_TCPF=1 (L2 prefetch in the tensor-core kernels), G3_CUDA_FUSE=1 (GeGLU fused into the
 * tensor-core product), G3_CUDA_NORM=loop|reg (add-norm kernel; default by batch size), G3_CUDA_ATTN_MIN=n (fewest
 * keys per attention split, 32).
 * Prefill: G3_CUDA_FA=0 (no flash attention; 1: also small grids), G3_CUDA_ROWK=0 (old many-row kernels), G3_CUDA_FIN=1 (the logit finish one float4 a thread at every size; default: a strided grid from 4 rows of 262144 logits), G3_CUDA_NOZERO=1 (row kernels leave y to cuBLAS, which overwrites it; opt-in, not yet run whole-model on a GPU), G3_CUDA_FATC=0|1|2|3|4 (flash attention: 0 CUDA cores, float32; on tensor cores 1 / 2 3xTF32, 3 / 4 3xBF16 with 4 / 8 warps; default 4 where it applies: float32 cache, head_dim % 4 == 0, <= 128)
 * Decode batches of 65..256 rows on quantized weights: G3_CUDA_QBIG=0 (cuBLAS on a bf16 copy, not the 9..64-row kernels in launches of 64)
 * Per-channel int8 on wgmma (tc_wg.cu): G3_CUDA_WG=0 (off: mma.sync up to 64 rows and in launches of 64 beyond), G3_CUDA_WGMIN=n (fewest rows, 33), G3_CUDA_WGST=4 (two blocks per SM with four stages instead of three with three), G3_CUDA_WGPF=0 (no L2 prefetch hint on the weights), G3_CUDA_WGBR=0 (every tile share added into y by float2 atomics; default: each block's last share through shared memory and bulk reductions, int8 and fp8 from 33 rows, n % 4 == 0), G3_CUDA_WGTILE=0 (equal stream-K ranges always; default: a block a channel tile where the tiles fill >= 3/4 of the resident slots), G3_CUDA_WGGG=0|1|2 (GeGLU and the down product's quantization in the gate/up product's last step where it takes whole tiles: never / int8 and fp8, the default / everywhere the kernel can, whole tiles forced), G3_CUDA_WGLT=0|2 (when the wgmma blocks let the next kernel be scheduled: at their launch wait / late only with the GeGLU epilogue; default: after the K loop in every launch)
 * fp8 on e4m3 wgmma (tc_wg.cu, hi + lo e4m3 activations): G3_CUDA_WGF=0 (off: the staged bf16 kernel), G3_CUDA_WGFMIN=n (fewest rows for every matrix, 33), G3_CUDA_WGFW=n (fewest weights of a matrix that takes it from 17 rows, and with WGF2=0 in the launches of decode batches beyond 64 rows, 16777216), G3_CUDA_WGFST=3 (33..64 rows: three stages, two blocks per SM instead of two stages, three blocks), G3_CUDA_WGF2=0 (decode batches of 65..256 rows in launches of <= 64 instead of one launch of two warpgroups per <= 128 rows), G3_CUDA_WGF2ST=4 (65..128 rows: four stages instead of three), G3_CUDA_WGF2W=2 (65..128 rows: two warpgroups a block, 128 channels each, instead of four of 64)
 * int4 on wgmma (tc_wg4.cu): G3_CUDA_WG4=0 (off: tc_q8.cu's mma.sync at 9..64 rows), G3_CUDA_WG4=all (9..64 rows; default 9..16 and 33..64), G3_CUDA_WG4V=0..3 (tile shape: channel tiles per block and int4 groups per stage; default 3 at <= 16 rows, 0 beyond)
 * int4 decode batches of 65..256 rows on bf16 wgmma with the weights dequantized in registers (tc_wgb.cu, launches of <= 128 rows): G3_CUDA_WGB=0 (off: launches of <= 64 on tc_wg4.cu), G3_CUDA_WGBMIN=n (from n >= 9 rows; default 65; slower below, for measurements), G3_CUDA_WGBV=0..2 (tile shape: two channel tiles per block, the same with more stages and one block per SM, one tile)
 * K/V cache: G3_CUDA_KV=f32 (float32 elements, read at create; `--kv-cache f32`), bf16, auto (the default: bf16 where the decode attention kernel takes the shape, head_dim 64 / 128 / 256, else f32)
 * Batches of 3..64 rows on quantized weights: G3_CUDA_TCM=0 (warp kernel), 1 (staged bf16 kernel for all; default: int8 tensor cores, tc_q8.cu, for per-channel int8 and int4), G3_CUDA_TQOCC=1|2 (int8-core kernel at 1 or 2 blocks/SM; default 2 for int8 and for int4 at <= 8 rows, 1 for int4 beyond), G3_CUDA_TQPRE=0 (each int8-core product quantizes its input in a launch of its own, instead of the add-norm / GeGLU before it), G3_CUDA_TQG=0 (GGUF groups of 32, Q8_0 / Q4_0 / Q4_K, on the staged bf16 kernel at 9..64 rows and dp4a at 3..8, instead of the int8 tensor cores a group an MMA, tc_q8g.cu), G3_CUDA_TQGMIN=n (fewest rows those take tc_q8g.cu, 3..9, default 3), G3_CUDA_TQGKC=0|all (tc_q8g.cu reads the float scales and offsets instead of the files' scale codes; all: Q4_K's codes beyond 16 rows too), G3_CUDA_TQMIN=n (fewest rows per-channel int8 and int4 in groups of 128 take tc_q8.cu, 3..9, default 3; 9: dp4a at 3..8 rows, and for int8 tc_gemv.cu's hi + lo activations at 5..8), G3_CUDA_TQHI=0 (int4 there with a mask and a shift per hi nibble instead of its own u8 x s8 MMA), G3_CUDA_TQSB=3|4 (3..8 rows with registers capped for 3 / 4 resident blocks a SM; for A/B, not yet measured), G3_CUDA_Q4R=0 (int4 / per-channel int8 at 3..8 rows on tc_q8.cu, fp8 on tc_gemv.cu (at 9..16 tc_stage.cu), instead of tc_q4r.cu, whose weights go straight into registers), G3_CUDA_Q4RMIN=n (tc_q4r.cu from n MB of weights; default int4 20, int8 / fp8 100), G3_CUDA_Q4RMAX=8|16|32 (the most rows tc_q4r.cu takes, for every format and K-slice count; unset: 8, and 16 for fp8 matrices of k <= 5376)
 * Decode: G3_CUDA_ATTN2=0 (round-1 attention kernels; G3_CUDA_ATTN2_C/_W: cluster size, warps a block (2, 4, 16; default 4, 2 where the (row, kv head) pairs exceed one wave of 4-warp blocks); G3_CUDA_ATTN2_KPR=2: a bf16 cache's keys in groups of twice the float32 group, faster at long contexts with many rows), G3_CUDA_DFUSE=0|1 (QK-norm/RoPE/cache write fused into attention: default 1 only with ATTN2=0), G3_CUDA_DNORM=0 (old add-norm, argmax), G3_CUDA_ATTNTQ=0 (9..64 rows: the o product quantizes the attention's bf16 output in a launch of its own; default: the attention writes it quantized), G3_CUDA_GELU=tanhf (the many-row GeGLU kernel with tanhf instead of one exponential), G3_CUDA_AOFUSE=1 (one row: the o product inside the decode attention launch for per-channel int8 / fp8 and int4 in groups of 128, attn_oproj.cuh; default off until measured on a GPU)
 * dp4a decode (int8/int4; fp8 at 1-2 rows on float16 products): G3_CUDA_QGEMV=n (rows; default 4 for per-channel int8, 2 for GGUF groups of 32 (then tc_q8g.cu), 8 for the rest, fp8 at most 2; 0 off: fp8 on the tensor-core kernel), G3_CUDA_Q8F16=0|1 (per-channel int8 at 1-2 rows on the float16 products too: 0 never, 1 always; default in rows or K-slices of < 4096 values), G3_CUDA_Q8LO=n (rows up to which int8 weights' products add the activations' residual plane, 2), G3_CUDA_Q4LO=n (the same for int4 weights, 0), G3_CUDA_QGEMVP=0 (k_q8 + k_qgemv at 1-2 rows too), G3_CUDA_QPQS=0 (the 1-2-row kernel runs every quantization item slot, predicated off past the row; default: left out), G3_CUDA_QPGS=0 (int4 in groups of 128 with the 1-2-row kernel's group arithmetic at run time; default: compile time), G3_CUDA_PNORM=0|1 (the decode add-norm as its own kernel / in the qkv and gate/up products' prologue; default: the prologue at one row, its own kernel at two), G3_CUDA_QPKS=n (the 1-2-row kernel's K-slices for products without GeGLU or add-norm: slices of <= n values, default 5376, 0 whole rows), G3_CUDA_QPRING=0|1|2 (the 1-2-row kernel's weights through a shared-memory ring of bulk copies: 0 never, 1 the int4 / per-channel int8 products without add-norm, 2 all; default: per-channel int8 and fp8 products in rows or K-slices of >= 4096 values, and int4 in groups of 128 without the plane in the products without add-norm; G3_CUDA_QPRINGMIN=n: only matrices of >= n MB; else the register double buffer; G3_CUDA_QPD=n: the ring's depth in steps, 2..6, default 3 at one row and 2 at two; G3_CUDA_QPU=0: int4 through the ring at one row in steps of 3 chunks a lane everywhere (default: 2 where they cover the row with fewer lane slots); G3_CUDA_QPNW=1: the add-norm prologue reads its norm weights from global memory instead of shared, so that a ring of 4 steps fits beside it; G3_CUDA_QPRPRE=n: the ring fills n of its slots before the launch wait and the rest after the prologue's loads or x's quantization, default 2, 0 all before); G3_CUDA_QPGD=1 (one row: the gate/up and down products in one launch, the down product's K-slices starting as their inputs are complete; default off: measured slower, session 45); G3_CUDA_Q4SZ=0 (at create: int4 in groups of 128 not also stored as half2 (scale, offset) pairs, which the 1-2-row kernel reads by default instead of the float scales and offsets; =0 at a call: the floats; default on, measured faster in session 45); G3_CUDA_GEMVPF=0|1|2 (bf16 GEMV: first, pipelined, persistent; default 0 at 1-2 rows, 1 at 3-4), G3_CUDA_GEMVPRE=0|1|2 (chunks per lane and row the first bf16 GEMV loads before its launch wait; default 1), G3_CUDA_BF16TC=n (fewest rows, up to 8, at which bf16 weights take the tensor-core kernel; default 5, 9 never) */
#ifndef G3_BACKEND_CUDA_API_H
#define G3_BACKEND_CUDA_API_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct g3_cuda_opts {
    const char *quant; /* NULL: $G3_CUDA_QUANT or "bf16" */
    int gemm;          /* 0: $G3_CUDA_GEMM or split; 1: split (hi+lo); 2: plain bf16 */
    int no_graphs;     /* 1: never capture graphs (also $G3_CUDA_GRAPHS=0) */
    uint64_t seed;     /* random weights */
} g3_cuda_opts;

/* Number of CUDA devices (0 when there is no driver or no GPU). */
int g3_cuda_device_count(void);
/* m != NULL: that model's weights. m == NULL: random weights of the shape `shape` generated on the device. */
g3_status g3_cuda_create(const g3_model *m, const g3_config *shape, const g3_backend_cfg *cfg,
                         const g3_cuda_opts *opts, g3_backend **out, g3_error *err);
/* Like forward, but returns only the argmax token of each output row (greedy sampling on the device). */
g3_status g3_cuda_forward_argmax(g3_backend *b, const g3_batch *batch, int32_t *ids, g3_error *err);
/* Bytes of all resident matrices (embedding once): what one decode step reads. */
uint64_t g3_cuda_resident_bytes(const g3_backend *b);
/* Short description: "bf16", "int8", ... and the GEMM mode. */
const char *g3_cuda_describe(const g3_backend *b);
/* Switches the GEMM mode (1 split hi+lo, 2 plain bf16) of a created backend; drops the captured graphs. */
g3_status g3_cuda_set_gemm(g3_backend *b, int gemm, g3_error *err);
/* One eager forward (no graph) with an event between launch groups: writes "group\ttotal us\tcalls\tus per call"
 * lines into out (times include the launch gaps the events expose). */
g3_status g3_cuda_profile(g3_backend *b, const g3_batch *batch, char *out, size_t cap, g3_error *err);
/* Nodes (kernels and copies) of the captured decode graph of the bucket holding m rows; 0 if none captured. */
int g3_cuda_graph_nodes(const g3_backend *b, int m);

/* Device memory bandwidth (GB/s): read-only streaming kernel over `bytes`, and cudaMemcpy device-to-device
 * counting read + write. Dense bf16 GEMM rate (TFLOP/s) through cuBLAS at n x n x n. */
g3_status g3_cuda_probe(size_t bytes, int n, double *read_gbs, double *copy_gbs, double *bf16_tflops, g3_error *err);

/* ---- test hooks ------------------------------------------------------------------------------------------ */
/* Converts w (n rows of k values stored as src_type) into the resident format for `quant` and computes
 * y = x W^T for m rows of x (float32 [m][k]) by the path the forward would use for m rows (gemm as in opts).
 * geglu: W rows are (gate, up) pairs and y is [m][n/2]. wdeq (optional): the resident weights dequantized,
 * [n][k] float32. */
g3_status g3_cuda_test_matmul(uint32_t src_type, const void *w, int n, int k, const char *quant, int gemm,
                              int geglu, const float *x, int m, float *y, float *wdeq, g3_error *err);

/* The persistent dp4a product with the decode add-norm in its prologue (g3c_qgemv_pn), m = 1..2 rows of k: from the
 * residual x [m][k], the previous product's output yin [m][k] and the norm weights w1, w2 [k] (as 1 + w): xo = x +
 * rms(yin) * w1 ([m][k]) and y = (rms(xo) * w2) W^T ([m][n], or [m][n/2] with geglu); wdeq [n][k] the resident
 * weights dequantized; *zero_ok = 1 when the kernel cleared the m*k floats of its zero buffer (filled with ones). */
/* The gate/up product of m rows with GeGLU and the down product's quantization in its last step (g3c_wg_mm_geglu)
 * against the product then the GeGLU kernel (g3c_geglu_tq), both from the same quantized x [m][k]: the two outputs
 * dequantized into h_fused and h_ref ([m][n/2] float32); *taken = 0 where g3c_wg_geglu_ok refuses (nothing run);
 * *cnt_zero = 1 when the pair counters were zero again after the launch. calls: launches of the fused product (each
 * must leave the counters at zero for the next). */
g3_status g3_cuda_test_wg_geglu(uint32_t src_type, const void *w, int n, int k, const char *quant, const float *x,
                                int m, int calls, float *h_fused, float *h_ref, int *taken, int *cnt_zero,
                                g3_error *err);

/* The one-row gate/up product (add-norm prologue, GeGLU) and down product in one launch (g3c_qgemv_gd, whatever
 * $G3_CUDA_QPGD says) against the two launches, from float32 weights wgu [2F][H] (gate and up rows interleaved) and
 * wdn [H][F] quantized to `quant`, the residual x [H], the previous output yin [H] and the norm weights w1, w2 [H]:
 * a_ref / y_ref ([F] / [H]) from the two launches, a_out (the last) / y_out ([reps][H]) from reps fused launches
 * (each must leave its counters at zero for the next: *cnt_ok); *taken = 0 where g3c_qgemv_gd_ok refuses (then only
 * the weights are built). */
g3_status g3_cuda_test_qgemv_gd(const char *quant, int H, int F, const float *wgu, const float *wdn, const float *x,
                                const float *yin, const float *w1, const float *w2, float eps, int reps, float *a_ref,
                                float *y_ref, float *a_out, float *y_out, int *taken, int *cnt_ok, g3_error *err);
g3_status g3_cuda_test_qgemv_pn(uint32_t src_type, const void *w, int n, int k, const char *quant, int geglu,
                                const float *x, const float *yin, const float *w1, const float *w2, float eps, int m,
                                float *y, float *xo, float *wdeq, int *zero_ok, g3_error *err);

/* Path the forward takes for m rows of such a matrix: 0 CUDA-core GEMV, 1 tensor-core kernel, 2 cuBLAS; -1 if the
 * format is not supported. */
int g3_cuda_test_mm_path(uint32_t src_type, int n, int k, const char *quant, int gemm, int m);
/* Host calls of tc_q4r.cu's kernel (int4 / int8 / fp8 at <= 16 rows, weights in registers) since the process started
 * (a replayed graph's launches are counted at its capture): a test's proof that the kernel it checks is the one that
 * ran */
long long g3_cuda_test_q4r_launches(void);
/* Host calls of tc_q8g.cu's kernels that read the GGUF files' scale codes (Q4_K, Q4_0, Q8_0 at 3..64 rows) */
long long g3_cuda_test_tqg_kc_launches(void);
/* K-slices the one-row dp4a kernel takes for that matrix ($G3_CUDA_QPKS; 0: no GPU); *n_sm: the SM count */
int g3_cuda_test_qp_kslices(uint32_t src_type, int n, int k, const char *quant, int geglu, int *n_sm);
/* 1 when the one-row product of an n x k float matrix quantized to int4 reads its half2 (s, z) pairs (g3_dmat.sz,
 * allocated as the matrix is built unless $G3_CUDA_Q4SZ=0) at m rows, 0 when not, -1 without a GPU */
int g3_cuda_test_qp_sz(int n, int k, int m, int geglu, int pn);
/* 1 when the one-row product of an n x k matrix of that type takes the shared-memory ring of bulk copies at m rows
 * (pn: with the add-norm prologue), 0 when not, -1 for a bad type (qgemv_p_policy.cu, $G3_CUDA_QPRING) */
int g3_cuda_test_qp_ring(uint32_t src_type, int n, int k, const char *quant, int m, int geglu, int pn);
/* The one-row dp4a kernel's launch policy alone (qgemv_p_policy.cu), on a GPU of n_sm SMs with the ring's shared
 * memory available, without touching a GPU: the variant the product of an n x k matrix of that type takes at m rows
 * (sz: the int4 matrix has its half2 pairs, as it is built unless $G3_CUDA_Q4SZ=0; GGUF Q4_K / Q4_0 / Q8_0 have their scale
 * codes, as loaded). Returns 0 and fills *v, 1 when the product does not take that kernel, -1 for a bad type. */
typedef struct {
    int f16;     /* runs on float16 products (fp8; per-channel int8 by $G3_CUDA_Q8F16's policy) */
    int M, u;    /* rows (1, 2) and chunks a lane and step */
    int pc, hl;  /* per-channel scales; the activations' residual plane */
    int rg, gs;  /* the shared-memory ring; log2 of int4's group in chunks at compile time (-1: at run time) */
    int kc;      /* 0 float scales, 1 Q4_K codes, 2 fp16 codes (Q4_0, Q8_0), 3 int4's half2 pairs */
    int ks;      /* K-slices */
    int blocks;  /* the grid */
    long smem;   /* dynamic shared memory a block */
    long smem_max; /* what the variant may have (the ring's limit, or the plain kernels') */
} g3_cuda_qp_variant;
int g3_cuda_test_qp_variant(uint32_t src_type, int n, int k, const char *quant, int m, int geglu, int pn, int sz,
                            int n_sm, g3_cuda_qp_variant *v);
/* The fused one-row gate/up + down pair (qgemv_gd.cu) that a model of that hidden and intermediate size takes, by the
 * same policy on n_sm SMs: its index in the table, -1 where the two launches stay, -2 for a bad type */
int g3_cuda_test_qp_gd_pair(uint32_t src_type, const char *quant, int hidden, int inter, int m, int sz, int n_sm);
/* 1 when that product at m rows runs on the one-row kernel's float16 products (fp8; per-channel int8 by
 * $G3_CUDA_Q8F16's policy), 0 when not (dp4a, or not that kernel), -1 for a bad type */
int g3_cuda_test_qp_f16(uint32_t src_type, int n, int k, const char *quant, int m, int geglu, int pn);
/* 1 when that product of a GGUF type at m rows reads Q4_K's own scale codes (g3_dmat.kc; $G3_CUDA_Q4KC), 0 when not */
int g3_cuda_test_qp_kc(uint32_t src_type, int n, int k, int m, int geglu, int pn);
/* 1 when the forward's product of m rows on an n x k matrix of that GGUF type runs on the int8 tensor cores a group
 * of 32 an MMA (tc_q8g.cu; $G3_CUDA_TQG), 0 when not, -1 for a bad type */
int g3_cuda_test_tqg(uint32_t src_type, int n, int k, int m);

typedef struct g3_cuda_attn_test {
    int NH, NKV, D, kind, window, kv_block, mbps, n_blocks, n_layers_kind, layer_in_kind, n_splits;
    float scale, softcap, eps;
    const float *inv_freq; /* [D/2] */
    const float *q_norm, *k_norm; /* [D] */
    int kv16;                     /* 1: bf16 K/V cache (the round-1 kernels refuse it) */
} g3_cuda_attn_test;
/* Runs QK-norm + RoPE + cache write, then attention, for m rows of qkv ([m][(NH+2NKV)*D]) with positions pos,
 * unique-sequence indices useq and block tables bt ([n_u][2][mbps]); o: [m][NH*D]. */
g3_status g3_cuda_test_attention(const g3_cuda_attn_test *t, const float *qkv, const int32_t *pos,
                                 const int32_t *useq, const int32_t *bt, int n_u, int m, float *o, g3_error *err);

/* Decode attention: m_hist history rows (any sequences; QK-norm + RoPE + cache write only) fill the cache, then the
 * m decode rows (each of its own sequence) run through the separate kernels (fused 0) or the fused one (fused 1),
 * twice, the second time over poisoned output; fused bit 1: the round-1 kernels, bit 2: the second kernel in 2-warp
 * blocks. o: [m][NH*D]; y_after (optional): the qkv input buffer after the run, [m][(NH+2NKV)*D], all zeros when the
 * kernels kept the zeroing contract. */
g3_status g3_cuda_test_attention_decode(const g3_cuda_attn_test *t, int fused, const float *hist_qkv,
                                        const int32_t *hist_pos, const int32_t *hist_useq, int m_hist,
                                        const float *qkv, const int32_t *pos, const int32_t *useq, int m,
                                        const int32_t *bt, int n_u, float *o, float *y_after, g3_error *err);
/* Add-norm (variant 0: g3c_add_norm, 1: the decode kernel) of m rows of H: y [ny][m][H], x [m][H] updated in place,
 * xn [m][H], xh [2][m][H] bf16 bits (hi, then lo when split), y_after [ny][m][H] (zeros when kept). */
g3_status g3_cuda_test_add_norm(int variant, int m, int H, int ny, const float *y, float *x, const float *w1,
                                const float *w2, float eps, int split, float *xn, uint16_t *xh, float *y_after,
                                g3_error *err);

/* Argmax of m rows of V logits (variant 0: g3c_argmax, 1: the decode kernel) into ids. */
g3_status g3_cuda_test_argmax(int variant, const float *logits, int m, int V, int32_t *ids, g3_error *err);
/* The device sampling chain (sample.cu) over m rows of V logits with rows[m] and adj[n_adj]: ids[m]; adjusted
 * (optional, [m][V]): the logits after the adjustments. */
g3_status g3_cuda_test_sample(const float *logits, int m, int V, const g3_dev_sample *rows, const g3_dev_adjust *adj,
                              int n_adj, int32_t *ids, float *adjusted, g3_error *err);
/* The forward with the sampling chain on the device (backend.h's forward_sample). */
g3_status g3_cuda_forward_sample(g3_backend *b, const g3_batch *batch, const g3_dev_sampling *smp, int32_t *ids,
                                 g3_error *err);

#ifdef __cplusplus
}
#endif
#endif
