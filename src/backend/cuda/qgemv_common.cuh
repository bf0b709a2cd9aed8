/* Shared by the dp4a decode products (qgemv.cu: k_q8 + k_qgemv, 3..8 rows; qgemv_p.cu: the persistent kernel, 1-2
 * rows): the activation quantization into q8 blocks of 32 (layout and rounding: qgemv.cu's header), the int8 / int4
 * dot products, the float16 activations and products of fp8 (and short-row int8) at 1-2 rows, and two host helpers. */
#ifndef G3_BACKEND_CUDA_QGEMV_COMMON_CUH
#define G3_BACKEND_CUDA_QGEMV_COMMON_CUH

#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"

/* ---- activation quantization ------------------------------------------------------------------------------------ */
/* One thread per 8 values; the 4 threads of a block of 32 are consecutive lanes. */
static __device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
    return (uint32_t)(a & 255) | (uint32_t)(b & 255) << 8 | (uint32_t)(c & 255) << 16 | (uint32_t)(d & 255) << 24;
}

/* Quantizes item t (8 values: row t / (k/8), values 8*(t % (k/8)) ...) of x into xq / xl / xd (global or shared
 * memory, same layout): q8_load reads the values (split off so that a thread can have several items' loads in
 * flight at once), q8_quant quantizes and stores them. ok = 0: the thread only takes part in the shuffles (the 4
 * threads of a block of 32 values are consecutive lanes, all in or all out). hl: also the residual plane xl
 * (q_lo = rint((x*inv - q) * 254), so that x = d * (q + q_lo/254) within amax/64516); the products are rounded
 * explicitly (no FMA contraction) so that a CPU reference can reproduce q and q_lo. The _at forms take item t as
 * (row i, item j8 of the row), for callers that have them without a division (the persistent kernel, M <= 2 rows: the
 * forms with t divide a 64-bit index by k / 8, twice an item). */
/* CG: x through L2 only (written during the same launch by other blocks: qgemv_gd.cu's k_qgemv_gd) */
template <bool CG = false>
static __device__ __forceinline__ void q8_load_at(const float *__restrict__ x, int ldx, int i, int j8, bool ok,
                                                  float (&v)[8]) {
    if (ok) {
        const float4 *p = (const float4 *)(x + (size_t)i * ldx + 8 * j8);
        float4 a = CG ? __ldcg(p) : p[0], b = CG ? __ldcg(p + 1) : p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = 0.f;
    }
}
static __device__ __forceinline__ void q8_load(const float *__restrict__ x, int ldx, int k, long long t, bool ok,
                                               float (&v)[8]) {
    const int k8 = k / 8;
    q8_load_at(x, ldx, ok ? (int)(t / k8) : 0, ok ? (int)(t % k8) : 0, ok, v);
}
/* The largest |x| of the block of 32 values whose 8-value items are held by 4 consecutive lanes (every lane of the warp
 * takes part in the shuffles). */
static __device__ __forceinline__ float q8_block_amax(const float (&v)[8]) {
    float amax = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v[e]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    return fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
}
static __device__ __forceinline__ void q8_quant_at(const float (&v)[8], int k, int i, int j8, bool ok, int8_t *xq,
                                                   int8_t *xl, float2 *xd, int il, int hl) {
    const float amax = q8_block_amax(v);
    const float inv = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
    int q[8], ql[8], sq = 0, sl = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const float p = __fmul_rn(v[e], inv);
        q[e] = max(-127, min(127, __float2int_rn(p)));
        ql[e] = hl ? max(-127, min(127, __float2int_rn(__fmul_rn(__fsub_rn(p, (float)q[e]), 254.f)))) : 0;
        sq += q[e], sl += ql[e];
    }
    sq += __shfl_xor_sync(0xffffffffu, sq, 1);
    sq += __shfl_xor_sync(0xffffffffu, sq, 2);
    sl += __shfl_xor_sync(0xffffffffu, sl, 1);
    sl += __shfl_xor_sync(0xffffffffu, sl, 2);
    if (!ok) return;
    const int blk = j8 >> 2, sub = j8 & 3;
    size_t off = (size_t)i * k + (il ? (size_t)(sub >> 1) * (k / 2) + 16 * blk + 8 * (sub & 1) : (size_t)8 * j8);
    if (il) {
        *(uint2 *)(xq + off) = make_uint2(pack4(q[0], q[2], q[4], q[6]), pack4(q[1], q[3], q[5], q[7]));
        if (hl) *(uint2 *)(xl + off) = make_uint2(pack4(ql[0], ql[2], ql[4], ql[6]), pack4(ql[1], ql[3], ql[5], ql[7]));
    } else {
        *(uint2 *)(xq + off) = make_uint2(pack4(q[0], q[1], q[2], q[3]), pack4(q[4], q[5], q[6], q[7]));
        if (hl) *(uint2 *)(xl + off) = make_uint2(pack4(ql[0], ql[1], ql[2], ql[3]), pack4(ql[4], ql[5], ql[6], ql[7]));
    }
    if (sub == 0) xd[(size_t)i * (k / 32) + blk] = make_float2(d, d * ((float)sq + (float)sl * (1.f / 254.f)));
}
static __device__ __forceinline__ void q8_quant(const float (&v)[8], int k, long long t, bool ok, int8_t *xq,
                                                int8_t *xl, float2 *xd, int il, int hl) {
    const int k8 = k / 8;
    q8_quant_at(v, k, ok ? (int)(t / k8) : 0, ok ? (int)(t % k8) : 0, ok, xq, xl, xd, il, hl);
}

/* fp8 weights (the persistent kernel only): item t's 8 values as float16 of x / amax per block of 32 (amax kept in xd's
 * .x, .y unused), the block's values at byte offsets (j8 & 1) * k + 16 * (j8 >> 1) of row i (2k bytes a row): chunk
 * cc's first 8 values at 16 cc, its last 8 at k + 16 cc, so a warp's lanes read consecutive 16-byte words (no bank
 * conflicts). x * (1/amax) is rounded to float (IEEE reciprocal and product), then to float16, so that a CPU
 * reference can reproduce the values. */
static __device__ __forceinline__ void h16_quant_at(const float (&v)[8], int k, int i, int j8, bool ok, int8_t *xq,
                                                    float2 *xd) {
    const float amax = q8_block_amax(v);
    if (!ok) return;
    const float inv = amax > 0.f ? __frcp_rn(amax) : 0.f;
    uint32_t h[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const __half2 p = __floats2half2_rn(__fmul_rn(v[2 * e], inv), __fmul_rn(v[2 * e + 1], inv));
        memcpy(&h[e], &p, 4);
    }
    int8_t *dst = xq + (size_t)i * 2 * k + (size_t)(j8 & 1) * k + 16 * (size_t)(j8 >> 1);
    *(uint4 *)dst = make_uint4(h[0], h[1], h[2], h[3]);
    if ((j8 & 3) == 0) xd[(size_t)i * (k / 32) + (j8 >> 2)] = make_float2(amax, 0.f);
}
static __device__ __forceinline__ void h16_quant(const float (&v)[8], int k, long long t, bool ok, int8_t *xq,
                                                 float2 *xd) {
    const int k8 = k / 8;
    h16_quant_at(v, k, ok ? (int)(t / k8) : 0, ok ? (int)(t % k8) : 0, ok, xq, xd);
}

/* ---- dot products ---- */
/* Kernel-internal weight type of qgemv_p.cu: per-channel int8 weights on the float16 products of fp8 (by default the
 * products in rows shorter than 4096 values, $G3_CUDA_Q8F16: qgemv_p_policy.cu's qp_q8f16) */
#define G3C_QT_I8H 9
/* the weight types whose products take float16 activations (h16_quant, two bytes each) and sums (doth16) */
static __host__ __device__ constexpr bool qt_f16(int qt) { return qt == G3Q_FP8 || qt == G3C_QT_I8H; }
/* int8: the 4 weights of word w as float16 pairs, exact: byte b + 128 into the low byte of 0x6400 (1024 + b + 128),
 * less 1152 */
static __device__ __forceinline__ void int8x4_h2(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t u = w ^ 0x80808080u;
    const uint32_t a = __byte_perm(u, 0x64646464u, 0x4140), b = __byte_perm(u, 0x64646464u, 0x4342);
    const __half2 off = __half2half2(__ushort_as_half((unsigned short)0x6480)); /* 1152 */
    __half2 ha, hb;
    memcpy(&ha, &a, 4), memcpy(&hb, &b, 4);
    ha = __hsub2(ha, off), hb = __hsub2(hb, off);
    memcpy(&lo, &ha, 4), memcpy(&hi, &hb, 4);
}
/* fp8 (e4m3): the 4 weights of word w as float16 pairs (lo: bytes 0, 1; hi: bytes 2, 3), exact */
static __device__ __forceinline__ void e4m3x4_h2(uint32_t w, uint32_t &lo, uint32_t &hi) {
    asm("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
}
/* fp8: 16 weights (as float16 pairs wh) . 16 float16 activations (a0: values 0-7, a1: 8-15), in two chains of four
 * float16 fused multiply-adds per half (p: pairs 0, 2, 4, 6; q: 1, 3, 5, 7), summed in float32 as (p.x + p.y) +
 * (q.x + q.y). Each chain sums four products of e4m3 weights (<= 448) and activations scaled to |a| <= 1: no
 * overflow; each fused step rounds to float16 once (2^-11 relative). test_cuda_matmul reproduces this order. */
static __device__ __forceinline__ float doth16(const uint32_t (&wh)[8], const uint4 &a0, const uint4 &a1) {
    const uint32_t a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    __half2 hw[8], ha[8];
    memcpy(hw, wh, sizeof hw), memcpy(ha, a, sizeof ha);
    __half2 p = __hmul2(hw[0], ha[0]), q = __hmul2(hw[1], ha[1]);
    p = __hfma2(hw[2], ha[2], p), q = __hfma2(hw[3], ha[3], q);
    p = __hfma2(hw[4], ha[4], p), q = __hfma2(hw[5], ha[5], q);
    p = __hfma2(hw[6], ha[6], p), q = __hfma2(hw[7], ha[7], q);
    const float2 fp = __half22float2(p), fq = __half22float2(q);
    return (fp.x + fp.y) + (fq.x + fq.y);
}
/* int8: 16 weights . 16 activations */
static __device__ __forceinline__ int dot4(const uint4 &w, const uint4 &x) {
    int s = __dp4a((int)w.x, (int)x.x, 0);
    s = __dp4a((int)w.y, (int)x.y, s);
    s = __dp4a((int)w.z, (int)x.z, s);
    return __dp4a((int)w.w, (int)x.w, s);
}
/* dp4a of unsigned bytes a with signed bytes b */
static __device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* int4: 16 x (the 4 weight words . the activations in their order; x0: words 0-1, x1: 2-3), exact in int32 (at most
 * 32 * 15 * 127 * 16). lo: the lo nibbles as bytes (w & 0x0F0F0F0F); hi16: the hi nibbles left in place (w &
 * 0xF0F0F0F0, 16x their values as unsigned bytes), one logic op instead of a shift and a mask, so the lo sum is
 * scaled by 16 once instead (the callers fold the 1/16 into the activations' scale: the same float result). No
 * measurable change when first tried (H200, session 22); after the one-row kernel's load addressing was cut (session
 * 25, 292 -> 278 instructions a step of the 27B int4 gate/up product) +0.5-1% at one row at 27B, +1% at 4B, +1-3% at
 * 1B, two rows within noise (run 01). */
static __device__ __forceinline__ int dot8_16(const uint32_t (&lo)[4], const uint32_t (&hi16)[4], const uint4 &x0,
                                              const uint4 &x1) {
    int s = __dp4a((int)lo[0], (int)x0.x, 0);
    s = __dp4a((int)lo[1], (int)x0.z, s);
    s = __dp4a((int)lo[2], (int)x1.x, s);
    s = __dp4a((int)lo[3], (int)x1.z, s) << 4;
    s = dp4a_us(hi16[0], (int)x0.y, s);
    s = dp4a_us(hi16[1], (int)x0.w, s);
    s = dp4a_us(hi16[2], (int)x1.y, s);
    return dp4a_us(hi16[3], (int)x1.w, s);
}

/* One load of an activation operand: from shared memory (SH: the persistent kernel's quantized copy) or from global
 * memory through the read-only path. */
template <bool SH, typename T> static __device__ __forceinline__ T q_ld(const T *p) {
    if constexpr (SH) return *p;
    else return __ldg(p);
}

/* The dp4a work of 16-byte weight chunk cc of R rows (wv; scales s, int4 offsets z; PC: per-channel scales applied
 * after the sums) against M activation rows: row i's quantized values xq[i], residual plane xl[i] (HL) and per-32
 * (d, d * sum q) pairs xd[i], in k_q8's layout. acc[r][i] += the chunk's share of row r . activation row i. */
template <int QT, int R, int M, bool PC, bool HL, bool SH>
static __device__ __forceinline__ void q_chunk(const uint4 (&wv)[R], const float (&s)[R], const float (&z)[R], int cc,
                                               int K, const int8_t *const (&xq)[M], const int8_t *const (&xl)[M],
                                               const float2 *const (&xd)[M], float (&acc)[R][M]) {
    const uint4 zero4 = make_uint4(0, 0, 0, 0);
    if constexpr (qt_f16(QT)) { /* h16_quant's layout: row i at xq[i] (2K bytes), (amax, -) per 32 in xd[i] */
        uint32_t wh[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if constexpr (QT == G3Q_FP8) {
                e4m3x4_h2(wv[r].x, wh[r][0], wh[r][1]), e4m3x4_h2(wv[r].y, wh[r][2], wh[r][3]);
                e4m3x4_h2(wv[r].z, wh[r][4], wh[r][5]), e4m3x4_h2(wv[r].w, wh[r][6], wh[r][7]);
            } else {
                int8x4_h2(wv[r].x, wh[r][0], wh[r][1]), int8x4_h2(wv[r].y, wh[r][2], wh[r][3]);
                int8x4_h2(wv[r].z, wh[r][4], wh[r][5]), int8x4_h2(wv[r].w, wh[r][6], wh[r][7]);
            }
        }
#pragma unroll
        for (int i = 0; i < M; i++) {
            const uint4 a0 = q_ld<SH>((const uint4 *)xq[i] + cc), a1 = q_ld<SH>((const uint4 *)(xq[i] + K) + cc);
            const float d = q_ld<SH>(&xd[i][cc >> 1].x);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][i] = fmaf(d, doth16(wh[r], a0, a1), acc[r][i]);
        }
    } else if constexpr (QT == G3Q_INT4) {
        uint32_t lo[R][4], hi[R][4];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t wd[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
#pragma unroll
            for (int j = 0; j < 4; j++) lo[r][j] = wd[j] & 0x0F0F0F0Fu, hi[r][j] = wd[j] & 0xF0F0F0F0u;
        }
#pragma unroll
        for (int i = 0; i < M; i++) {
            const uint4 x0 = q_ld<SH>((const uint4 *)xq[i] + cc), x1 = q_ld<SH>((const uint4 *)(xq[i] + K / 2) + cc);
            uint4 l0 = zero4, l1 = zero4;
            if constexpr (HL) l0 = q_ld<SH>((const uint4 *)xl[i] + cc), l1 = q_ld<SH>((const uint4 *)(xl[i] + K / 2) + cc);
            const float2 dd = q_ld<SH>(xd[i] + cc);
            const float d16 = dd.x * (1.f / 16.f); /* dot8_16's sums are 16x: exact powers of two, same products */
#pragma unroll
            for (int r = 0; r < R; r++) {
                float f = (float)dot8_16(lo[r], hi[r], x0, x1);
                if constexpr (HL) f = fmaf((float)dot8_16(lo[r], hi[r], l0, l1), 1.f / 254.f, f);
                acc[r][i] = fmaf(s[r] * d16, f, fmaf(z[r], dd.y, acc[r][i]));
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < M; i++) {
            const uint4 xv = q_ld<SH>((const uint4 *)xq[i] + cc);
            uint4 lv = zero4;
            if constexpr (HL) lv = q_ld<SH>((const uint4 *)xl[i] + cc);
            const float d = q_ld<SH>(&xd[i][cc >> 1].x);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float f = (float)dot4(wv[r], xv);
                if constexpr (HL) f = fmaf((float)dot4(wv[r], lv), 1.f / 254.f, f);
                acc[r][i] = fmaf(PC ? d : s[r] * d, f, acc[r][i]);
            }
        }
    }
}

static inline int log2_exact(int v) { /* -1 unless v is a power of two */
    if (v < 1 || (v & (v - 1))) return -1;
    int s = 0;
    while (v > 1) v >>= 1, s++;
    return s;
}

/* Rows up to which the residual plane is used: int8 weights $G3_CUDA_Q8LO (default 2), int4 weights $G3_CUDA_Q4LO
 * (default 0: never); 0 = never, 8 = always. Why not for int4: its weights' own error (16 levels a group of 128) is
 * ~10x the q8 activations' rounding, so the plane does not move the model's KL (the fixtures' int4 KL one row at a
 * time with / without it, H200 session 22: t-gqa 0.890 / 0.892 nats, t-mm 0.793 / 0.784, t-softcap 1.906 / 1.911,
 * small-a 2.441 / 2.425), while its second dp4a pass over the unpacked nibbles costs (run 05, A/B/A/B, tok/s without /
 * with): 27B one / two rows 174-175 / 317-318 against 168-169 / 286-287, 4B 630-632 / 1121-1133 against 588-593 /
 * 1004-1015, 1B 1018-1030 / 1893-1937 against 935-949 / 1646-1659. */
static inline int lo_rows(const g3_dmat *w) {
    const int i4 = w->qt == G3Q_INT4;
    const char *e = getenv(i4 ? "G3_CUDA_Q4LO" : "G3_CUDA_Q8LO");
    return e && *e ? atoi(e) : i4 ? 0 : 2;
}

/* qgemv_p.cu: the persistent kernel at 1-2 rows where it applies ($G3_CUDA_QGEMVP, shared memory): g3c_qgemv
 * takes it when g3c_qgemvp_usable */
int g3c_qgemvp_usable(const g3_dmat *w, int m, int geglu);
int g3c_qgemvp_fits(int m, int k); /* the activations of m rows of k values fit its shared memory */
cudaError_t g3c_qgemvp(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu,
                       cudaStream_t st);

#endif
