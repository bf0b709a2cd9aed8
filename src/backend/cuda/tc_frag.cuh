/* Register-level helpers of the tensor-core matrix kernels (tc_gemv.cu): weight decoding into mma A fragments,
 * activation fragments, bf16 packing. Host-callable, so that dev/cuda/tc_emul.cu checks the layouts against plain
 * dot products on a machine without a GPU.
 *
 * mma.sync m16n8k16, bf16 inputs, float32 accumulators; lane = 4*g + t (g = 0..7, t = 0..3):
 *   A (16 x 16):  reg0 = A[g][2t, 2t+1]   reg1 = A[g+8][2t, 2t+1]   reg2 = A[g][2t+8, 2t+9]   reg3 = A[g+8][2t+8, 2t+9]
 *   B (16 x 8):   reg0 = B[2t, 2t+1][g]   reg1 = B[2t+8, 2t+9][g]
 *   C (16 x 8):   c0 = C[g][2t]   c1 = C[g][2t+1]   c2 = C[g+8][2t]   c3 = C[g+8][2t+1]
 * (the lower k in the low 16 bits). A product sums over k, so the order of k inside one mma is free as long as A
 * and B agree: lane t reads one 16-byte chunk of V values from each of its rows (g and g+8) per round, and mma j of
 * the round takes values 4j..4j+3 of that chunk: "row part" r0 = values (4j, 4j+1) -> A cols (2t, 2t+1), r1 =
 * (4j+2, 4j+3) -> cols (2t+8, 2t+9); the B registers of lane (g, t) hold activation column g at the same k.
 * int4 words hold value s in nibble s (bits 4s..4s+3); one mask-and-or turns nibbles (a, a+4) into the bf16 pair
 * (128+q_a, 128+q_{a+4}), so mma j = 2i+h pairs values (2h, 2h+4) and (2h+1, 2h+5) of word i, and the activations
 * of each group of 8 are taken in the order 0,4,1,5,2,6,3,7 (two byte permutes per 8 values). */
#ifndef G3_CUDA_TC_FRAG_CUH
#define G3_CUDA_TC_FRAG_CUH

#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define TC_HD __host__ __device__ __forceinline__

enum { TC_BF16 = 0, TC_INT8 = 1, TC_INT4 = 2, TC_FP8 = 3 }; /* = G3Q_* */
/* MODE 0: exact weights, one scale per row applied at the end (bf16: none); MODE 1: int4 exact as 128+q, scale and
 * offset per round of 128 values; MODE 2: weights dequantized to bf16 in registers (scale [+ offset] per chunk). */

TC_HD uint32_t tc_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, sel);
#else
    uint64_t v = ((uint64_t)b << 32) | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
#endif
}

TC_HD float tc_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

TC_HD float tc_bf2f(uint32_t h16) { return tc_f32(h16 << 16); }

static inline __host__ uint32_t tc_bf16_rn_host(float f) { /* round to nearest even (finite inputs) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

/* bf16x2 of (lo, hi), rounded to nearest even */
TC_HD uint32_t tc_pack(float lo, float hi) {
#ifdef __CUDA_ARCH__
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return tc_bf16_rn_host(lo) | (tc_bf16_rn_host(hi) << 16);
#endif
}

/* 2^23 + byte b of w, as a float */
TC_HD float tc_magic_byte(uint32_t w, int b) { return tc_f32(tc_prmt(w, 0x4B000000u, 0x7540u + (uint32_t)b)); }

/* two e4m3 bytes (low byte first) as floats */
TC_HD void tc_fp8x2(uint32_t two, float &lo, float &hi) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    __half_raw a, b;
    a.x = hr.x, b.x = hr.y;
    lo = __half2float(__half(a)), hi = __half2float(__half(b));
}

/* bf16x2 p (128 + q per half, exact) -> bf16x2 of q*s + z, rounded once to bf16 */
TC_HD uint32_t tc_int4_affine(uint32_t p, float s, float z) {
#ifdef __CUDA_ARCH__
    __nv_bfloat162 v = *(__nv_bfloat162 *)&p, c128 = __float2bfloat162_rn(128.f);
    __nv_bfloat162 s2 = __float2bfloat162_rn(s), z2 = __float2bfloat162_rn(z);
    __nv_bfloat162 r = __hfma2(__hsub2(v, c128), s2, z2);
    return *(uint32_t *)&r;
#else
    float sb = tc_bf2f(tc_bf16_rn_host(s)), zb = tc_bf2f(tc_bf16_rn_host(z));
    float q0 = tc_bf2f(p & 0xffffu) - 128.f, q1 = tc_bf2f(p >> 16) - 128.f;
    return tc_pack(q0 * sb + zb, q1 * sb + zb);
#endif
}

/* A row part of mma j (0 .. V/4-1) from one 16-byte weight chunk c: r0 -> A cols (2t, 2t+1), r1 -> (2t+8, 2t+9).
 * s, z: the chunk's scale and offset (MODE 2 only). */
template <int QT, int MODE> TC_HD void tc_decode(const uint4 &c, int j, float s, float z, uint32_t &r0, uint32_t &r1) {
    const uint32_t wd[4] = {c.x, c.y, c.z, c.w};
    if constexpr (QT == TC_BF16) {
        r0 = wd[2 * j], r1 = wd[2 * j + 1];
    } else if constexpr (QT == TC_INT8) {
        const uint32_t u = wd[j] ^ 0x80808080u;
        float f0 = tc_magic_byte(u, 0) - 8388736.f, f1 = tc_magic_byte(u, 1) - 8388736.f;
        float f2 = tc_magic_byte(u, 2) - 8388736.f, f3 = tc_magic_byte(u, 3) - 8388736.f;
        if constexpr (MODE == 2) f0 *= s, f1 *= s, f2 *= s, f3 *= s;
        r0 = tc_pack(f0, f1), r1 = tc_pack(f2, f3);
    } else if constexpr (QT == TC_FP8) {
        float f0, f1, f2, f3;
        tc_fp8x2(wd[j], f0, f1);
        tc_fp8x2(wd[j] >> 16, f2, f3);
        r0 = tc_pack(f0, f1), r1 = tc_pack(f2, f3);
    } else { /* int4: word j/2, nibble pairs (2h, 2h+4) and (2h+1, 2h+5), h = j%2 */
        const uint32_t u = wd[j >> 1] >> (8 * (j & 1));
        uint32_t p0 = (u & 0x000F000Fu) | 0x43004300u, p1 = ((u >> 4) & 0x000F000Fu) | 0x43004300u;
        if constexpr (MODE == 2) p0 = tc_int4_affine(p0, s, z), p1 = tc_int4_affine(p1, s, z);
        r0 = p0, r1 = p1;
    }
}

/* B registers of mma j = 2q + jj from the q-th 16 bytes (8 bf16 activations, k order as stored) of this lane's
 * chunk of its activation column. */
template <int QT> TC_HD void tc_bregs(const uint4 &xb, int jj, uint32_t &b0, uint32_t &b1) {
    if constexpr (QT == TC_INT4) {
        const uint32_t lo = jj ? xb.y : xb.x, hi = jj ? xb.w : xb.z; /* (x0,x1),(x4,x5) or (x2,x3),(x6,x7) */
        b0 = tc_prmt(lo, hi, 0x5410u), b1 = tc_prmt(lo, hi, 0x7632u);
    } else {
        b0 = jj ? xb.z : xb.x, b1 = jj ? xb.w : xb.y;
    }
}

/* Staged activations (tc_stage.cu, 9..64 plain rows): a stage holds 8V values (2 rounds) of every activation row in
 * shared memory as V 16-byte units per row; unit p (values 8p..8p+7 of the stage) of row i sits at i*V +
 * tc_swz<QT>(p, i). Lane t reads units p = (4 rl + t) Q + q (round rl, q < Q = V/8), the activations of its own
 * weight chunk. Rows are V*16 bytes (a multiple of 128), and the XOR moves bit 1 of t (int4), or the row parity,
 * into the low unit bits, so the 8 lanes of one shared-memory phase (rows g, g+1 x t = 0..3) hit 8 distinct 16-byte
 * bank groups. The XOR changes bits below log2(V) only: a unit stays in its row. */
template <int QT> TC_HD int tc_swz(int p, int row) {
    if constexpr (QT == TC_INT4) return p ^ (((p >> 3) & 1) | ((row & 1) << 1)); /* p: q | t << 2 | rl << 4 */
    else if constexpr (QT == TC_BF16) return p ^ ((row & 1) << 2);               /* p: t | rl << 2 */
    else return p ^ (row & 1);                                                   /* p: q | t << 1 | rl << 3 */
}

/* Epilogue in pairs of output channels (float2 atomics): lane (g, t) holds c = C[g][2t], C[g][2t+1], C[g+8][2t],
 * C[g+8][2t+1]; it sends (s0, s1) to lane ^ 4 (g ^ 1) and receives that lane's (r0, r1). Afterwards it owns column
 * 2t + (g & 1) at channels (g & ~1) + 8 hf + (0, 1): v[hf][0..1]. */
TC_HD void tc_pair_send(const float c[4], int g, float &s0, float &s1) {
    s0 = (g & 1) ? c[0] : c[1], s1 = (g & 1) ? c[2] : c[3];
}
TC_HD void tc_pair_take(const float c[4], int g, float r0, float r1, float v[2][2]) {
    if (g & 1) v[0][0] = r0, v[0][1] = c[1], v[1][0] = r1, v[1][1] = c[3];
    else v[0][0] = c[0], v[0][1] = r0, v[1][0] = c[2], v[1][1] = r1;
}

/* zeros into a [T][NT][4] set of tile sums */
template <int T, int NT> TC_HD void tc_zero(float (&a)[T][NT][4]) {
#pragma unroll
    for (int tt = 0; tt < T; tt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) a[tt][nt][e] = 0.f;
}

#ifdef __CUDA_ARCH__
/* c += A B for one m16n8k16 tile (A regs as listed above). */
__device__ __forceinline__ void tc_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* Adds one tile of sums c (lane (g, t) as above: output channels base + g, base + g + 8, activation rows 8 nt + 2t,
 * 8 nt + 2t + 1) into y ([m][n]) by atomics: float2 pairs of channels where n is even (tc_pair_send / take), else one
 * float at a time; cs: per-channel scales applied first (NULL: none). Every lane of the warp calls; c is cleared. */
__device__ __forceinline__ void tc_tile_add(float (&c)[4], float *y, int n, int m, int base, int nt, int g, int t,
                                            const float *cs) {
    if ((n & 1) == 0) {
        float s0, s1, v[2][2];
        tc_pair_send(c, g, s0, s1);
        const float r0 = __shfl_xor_sync(0xffffffffu, s0, 4), r1 = __shfl_xor_sync(0xffffffffu, s1, 4);
        tc_pair_take(c, g, r0, r1, v);
        const int col = 8 * nt + 2 * t + (g & 1);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = base + 8 * hf + (g & ~1);
            if (row >= n || col >= m) continue;
            float2 pv = make_float2(v[hf][0], v[hf][1]);
            if (cs) pv.x *= __ldg(cs + row), pv.y *= __ldg(cs + row + 1);
            atomicAdd((float2 *)(y + (size_t)col * n + row), pv);
        }
    } else {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = base + g + 8 * hf, i = 8 * nt + 2 * t;
            if (row >= n) continue;
            const float sc = cs ? __ldg(cs + row) : 1.f;
            if (i < m) atomicAdd(y + (size_t)i * n + row, c[2 * hf] * sc);
            if (i + 1 < m) atomicAdd(y + (size_t)(i + 1) * n + row, c[2 * hf + 1] * sc);
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) c[e] = 0.f;
}

/* c += A B for one m16n8k32 tile of signed bytes, int32 sums (tc_q8.cu, tc_q8g.cu): a0 = A[g][4t..4t+3], a1 =
 * A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]; c as above */
/* ua (a constant where called): A's bytes unsigned (u8 x s8; int4's hi nibbles kept in place, 16 x 0..15) */
__device__ __forceinline__ void tc_mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1, bool ua = false) {
    if (ua)
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* the same for m16n8k16: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..]; b0 = B[4t..4t+3][g] */
__device__ __forceinline__ void tc_mma_s8k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}
#endif

#endif
