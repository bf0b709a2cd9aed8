/* Hopper warpgroup MMA (wgmma): the MMA instructions (int8: m64n64k32, m64n128k32 with A and B in shared memory;
 * fp8 e4m3 x e4m3 -> f32 in the same shapes and layouts;
 * m64n16k32, m64n32k32, m64n64k32 with A in registers, s8 x s8 -> s32; bf16: m64n16/32/64/128k16 with A in registers,
 * -> f32), fence / commit / wait, the register fence that keeps the compiler off the accumulators while an MMA is in
 * flight, the 128-byte-swizzle descriptor, and the cp.async copies that fill the tiles. Used by tc_wg.cu, tc_wg4.cu,
 * tc_wgb.cu and the microbenchmark dev/cuda/wg_bench.cu.
 * Internal to src/backend/cuda; sm_90a only. */
#ifndef G3_CUDA_WGMMA_CUH
#define G3_CUDA_WGMMA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"

/* D (s32, 32 registers) = or += A . B^T: m64n64k32, A and B K-major int8 tiles in shared memory (descriptors) */
static __device__ __forceinline__ void wg_mma_n64(int (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, %32, %33, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                   "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]),
                   "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]),
                   "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]),
                   "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}
/* D (s32, 64 registers) = or += A . B^T: m64n128k32, A and B K-major int8 tiles in shared memory (descriptors) */
static __device__ __forceinline__ void wg_mma_n128(int (&d)[64], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                 "}, %64, %65, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                   "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]),
                   "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]),
                   "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]),
                   "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]),
                   "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]),
                   "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]),
                   "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]),
                   "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "l"(da), "l"(db), "r"(acc));
}

/* D (f32, 32 registers) = or += A . B^T: m64n64k32, A and B K-major e4m3 tiles in shared memory (descriptors) */
static __device__ __forceinline__ void wg_mma_f8_n64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, %32, %33, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}
/* D (f32, 64 registers) = or += A . B^T: m64n128k32, A and B K-major e4m3 tiles in shared memory (descriptors) */
static __device__ __forceinline__ void wg_mma_f8_n128(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                 "}, %64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(acc));
}
/* D (s32, 8 registers) = or += A . B^T: m64n16k32, A from registers (a0..a3: the m16n8k32 A fragment of
 * this warp's 16 rows), B K-major in shared memory (descriptor) */
static __device__ __forceinline__ void wg_mma_rs_n16(int (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2,
                                                      uint32_t a3, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7"
                 "}, {%8,%9,%10,%11}, %12, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}
/* D (s32, 16 registers) = or += A . B^T: m64n32k32, A from registers (a0..a3: the m16n8k32 A fragment of
 * this warp's 16 rows), B K-major in shared memory (descriptor) */
static __device__ __forceinline__ void wg_mma_rs_n32(int (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2,
                                                      uint32_t a3, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
                 "}, {%16,%17,%18,%19}, %20, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                   "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}
/* D (s32, 32 registers) = or += A . B^T: m64n64k32, A from registers (a0..a3: the m16n8k32 A fragment of
 * this warp's 16 rows), B K-major in shared memory (descriptor) */
static __device__ __forceinline__ void wg_mma_rs_n64(int (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2,
                                                      uint32_t a3, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                 "}, {%32,%33,%34,%35}, %36, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                   "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                   "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                   "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}
template <int NR>
static __device__ __forceinline__ void wg_mma_rs(int (&d)[NR], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint64_t db, int acc) {
    if constexpr (NR == 8) wg_mma_rs_n16(d, a0, a1, a2, a3, db, acc);
    else if constexpr (NR == 16) wg_mma_rs_n32(d, a0, a1, a2, a3, db, acc);
    else wg_mma_rs_n64(d, a0, a1, a2, a3, db, acc);
}

/* D (f32, NR = N/2 registers) = or += A . B^T: m64nNk16 bf16 x bf16 -> f32 (N = 16, 32, 64, 128), A from registers
 * (a0..a3: the m16n8k16 A fragment of this warp's 16 rows), B K-major bf16 in shared memory (descriptor) */
template <int NR>
static __device__ __forceinline__ void wg_mma_bf_rs(float (&d)[NR], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t db, int acc) {
    if constexpr (NR == 8) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7"
                     "}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
    } else if constexpr (NR == 16) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
                     "}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                       "+f"(d[15])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
    } else if constexpr (NR == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                     "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                     "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
                     "}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                       "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                       "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                       "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                       "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
    } else {
        static_assert(NR == 32, "m64n16/32/64/128 only");
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                     "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                     "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
                     "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                       "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
    }
}

static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
/* keeps the compiler from touching the accumulators across the asynchronous MMA */
template <int N> static __device__ __forceinline__ void wg_fence_regs(int (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(d[i])::"memory");
}
template <int N> static __device__ __forceinline__ void wg_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> static __device__ __forceinline__ void wg_mma(int (&d)[N], uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 32) wg_mma_n64(d, da, db, acc);
    else wg_mma_n128(d, da, db, acc);
}
template <int N> static __device__ __forceinline__ void wg_mma(float (&d)[N], uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 32) wg_mma_f8_n64(d, da, db, acc);
    else wg_mma_f8_n128(d, da, db, acc);
}

/* The start of a block's ring of ST cp.async stages over its stream-K units: the weights of the first ST - 1 units,
 * which do not depend on the previous kernel, requested before the programmatic-launch wait, their activations after
 * it; one group per unit and kind (empty past the block's n units), so that unit i has landed once group ST - 1 + i
 * has. load_w(i, on) / load_x(i, on) put unit i into slot i, copying only if on (counters kept by the loaders advance
 * either way). trig false: the successor is not let in at the wait (the kernel calls g3c_pdl_trigger later).
 * tc_wg.cu, tc_wg4.cu, tc_wgb.cu. */
template <int ST, class LW, class LX>
static __device__ __forceinline__ void wg_ring_start(int n, LW &&load_w, LX &&load_x, bool trig = true) {
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        load_w(i, i < n);
        g3c_cp_commit();
    }
    if (trig) g3c_pdl_wait();
    else g3c_pdl_wait_only();
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        load_x(i, i < n);
        g3c_cp_commit();
    }
}

/* shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 B apart */
static __device__ __forceinline__ uint64_t wg_desc(const void *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* 16 weight bytes global -> shared, zero-filled past `bytes` (0 or 16, rows past n); PF: with the 256-byte L2
 * prefetch (a stage reads 128 bytes of each row, the prefetch brings the next stage's along in the same DRAM
 * access); 4 bytes (the activation scales) */
template <bool PF> static __device__ __forceinline__ void wg_cp16(void *dst, const void *src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (PF)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
    else asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}

#endif
