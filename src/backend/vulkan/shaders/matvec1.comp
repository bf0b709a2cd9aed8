#version 450
// Decode y[r][c] = sum_k x[r][k] * W[c][k] for up to RMAX rows (built with RMAX 1 for the one-row bucket and 8 for the
// 2..8-row buckets) and the weight types that decode carries in bulk: F16, BF16, Q8_0, Q4_0 (K a multiple of 32).
// Same grid and results as matvec.comp (NR = 2 output channels per workgroup; GEGLU: channel c of gate and up; mode 1
// softcap, mode 2 the post-norm tail of tail_norm.glsl), but built for memory throughput:
//   - every weight chunk is loaded once and used for all nr rows (the rows' activations are read per chunk);
//   - each thread takes 16-byte chunks of the rows (8 f16/bf16, 16 Q8_0, 32 Q4_0 values: a Q4_0 chunk is one block),
//     two chunks per iteration per row, all loads issued before any arithmetic (4 x 16 B in flight per thread);
//   - integers become floats through the exponent (2^23 + byte as a float bit pattern, minus 2^23 + offset: exact),
//     not int-to-float conversions, which run at a quarter rate or less on NVIDIA;
//   - the block scale multiplies the chunk's dot product once instead of every weight.
// $G3_VULKAN_MATVEC1=0 selects matvec.comp for the one-row bucket, $G3_VULKAN_MATVECN=0 for the 2..8-row ones.
#ifndef RMAX
#define RMAX 1
#endif
#define WG 64
#define NR 2
layout(local_size_x = WG) in;
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform PC {
    uint64_t w, waux, w2, w2aux, x, y, params;
    uint N, K, ldx, ldy, nrows_idx, mode;
    float cap;
    uint64_t h, xo, cnt; // mode 2 (tail_norm.glsl)
} pc;
#ifndef GEGLU
#include "tail_norm.glsl"
#endif

#if WTYPE == T_F16 || WTYPE == T_BF16
#define VPC 8u
#elif WTYPE == T_Q8_0
#define VPC 16u
#elif WTYPE == T_Q4_0
#define VPC 32u
#else
#error matvec1 serves F16, BF16, Q8_0 and Q4_0
#endif

shared float part_sh[NR * RMAX][WG];

// 4 bytes of w as floats 2^23 + byte (exact).
vec4 mag4(uint w) {
    return vec4(uintBitsToFloat(0x4B000000u | (w & 0xFFu)), uintBitsToFloat(0x4B000000u | ((w >> 8) & 0xFFu)),
                uintBitsToFloat(0x4B000000u | ((w >> 16) & 0xFFu)), uintBitsToFloat(0x4B000000u | (w >> 24)));
}

// sum over the chunk's values of x * (weight / scale); xp: the chunk's activations (VPC floats).
float chunk_dot(uvec4 q, F4Buf xp) {
    float s = 0.0;
#if WTYPE == T_F16 || WTYPE == T_BF16
    vec4 x0 = xp.v[0], x1 = xp.v[1];
#if WTYPE == T_F16
    vec2 h0 = unpackHalf2x16(q.x), h1 = unpackHalf2x16(q.y), h2 = unpackHalf2x16(q.z), h3 = unpackHalf2x16(q.w);
    s = dot(x0, vec4(h0, h1)) + dot(x1, vec4(h2, h3));
#else
    s = dot(x0, vec4(bf16lo(q.x), bf16hi(q.x), bf16lo(q.y), bf16hi(q.y))) +
        dot(x1, vec4(bf16lo(q.z), bf16hi(q.z), bf16lo(q.w), bf16hi(q.w)));
#endif
#elif WTYPE == T_Q8_0
    const float off = 8388736.0; // 2^23 + 128: bytes are q + 128 after the xor
    s = dot(xp.v[0], mag4(q.x ^ 0x80808080u) - off) + dot(xp.v[1], mag4(q.y ^ 0x80808080u) - off) +
        dot(xp.v[2], mag4(q.z ^ 0x80808080u) - off) + dot(xp.v[3], mag4(q.w ^ 0x80808080u) - off);
#else // Q4_0: word j holds values 8j..8j+7, byte b = value 2b (low nibble), 2b+1 (high nibble)
    const float off = 8388616.0; // 2^23 + 8
    [[unroll]] for (uint j = 0; j < 4; j++) {
        vec4 xa = xp.v[2 * j], xb = xp.v[2 * j + 1];
        vec4 lo = mag4(q[j] & 0x0F0F0F0Fu) - off, hi = mag4((q[j] >> 4) & 0x0F0F0F0Fu) - off;
        s += dot(vec4(xa.xz, xb.xz), lo) + dot(vec4(xa.yw, xb.yw), hi);
    }
#endif
    return s;
}

// Block scale of chunk ch of row `row` (1 for float types).
float chunk_scale(uint64_t aux, uint row, uint ch) {
#if WTYPE == T_Q8_0
    return half_at(aux, row * (pc.K / 32u) + (ch >> 1));
#elif WTYPE == T_Q4_0
    return half_at(aux, row * (pc.K / 32u) + ch);
#else
    return 1.0;
#endif
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
#ifdef GEGLU
    uint c0 = wg;
#else
    uint c0 = wg * NR;
#endif
    if (c0 >= pc.N) return;
    uint nr = uint(prm(pc.params, pc.nrows_idx));
    if (nr > RMAX) nr = RMAX;
    uint64_t wb[NR], ab[NR];
    uint rowi[NR];
    [[unroll]] for (uint a = 0; a < NR; a++) {
#ifdef GEGLU
        wb[a] = a == 0 ? pc.w : pc.w2;
        ab[a] = a == 0 ? pc.waux : pc.w2aux;
        rowi[a] = c0;
#else
        wb[a] = pc.w, ab[a] = pc.waux;
        rowi[a] = min(c0 + a, pc.N - 1u); // a missing last channel reads a valid row; its sum is not stored
#endif
        wb[a] += uint64_t(rowi[a]) * ROW_BYTES(pc.K);
    }
    float acc[NR][RMAX];
    [[unroll]] for (uint a = 0; a < NR; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++) acc[a][r] = 0.0;
    uint nch = pc.K / VPC;
    for (uint c = tid; c < nch; c += 2u * WG) {
        uint c1 = c + WG;
        bool has1 = c1 < nch;
        uint c1c = has1 ? c1 : c;
        uvec4 q0[NR], q1[NR];
        float d0[NR], d1[NR];
        [[unroll]] for (uint a = 0; a < NR; a++) {
            q0[a] = U4Buf(wb[a]).v[c];
            q1[a] = U4Buf(wb[a]).v[c1c];
        }
        [[unroll]] for (uint a = 0; a < NR; a++) {
            d0[a] = chunk_scale(ab[a], rowi[a], c);
            d1[a] = has1 ? chunk_scale(ab[a], rowi[a], c1c) : 0.0;
        }
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) {
                uint64_t xr = pc.x + uint64_t(r) * pc.ldx * 4u;
                F4Buf x0 = F4Buf(xr + uint64_t(c) * (VPC * 4u)), x1 = F4Buf(xr + uint64_t(c1c) * (VPC * 4u));
                [[unroll]] for (uint a = 0; a < NR; a++) {
                    // d1 = 0 past the end: the clamped chunk c1c = c adds nothing (no branch)
                    acc[a][r] += d0[a] * chunk_dot(q0[a], x0) + d1[a] * chunk_dot(q1[a], x1);
                }
            }
        }
    }
    // reduce the NR * nr partial sums over the workgroup
#if G3_SG
    [[unroll]] for (uint a = 0; a < NR; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) {
                float s = subgroupAdd(acc[a][r]);
                if (subgroupElect()) part_sh[a * RMAX + r][gl_SubgroupID] = s;
            }
        }
    barrier();
    uint nparts = gl_NumSubgroups;
#else
    [[unroll]] for (uint a = 0; a < NR; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++)
            if (r < nr) part_sh[a * RMAX + r][tid] = acc[a][r];
    barrier();
    uint nparts = WG;
#endif
    if (tid < RMAX && tid < nr) {
        uint r = tid;
        float v[NR];
        [[unroll]] for (uint a = 0; a < NR; a++) {
            float s = 0.0;
            for (uint i = 0; i < nparts; i++) s += part_sh[a * RMAX + r][i];
            v[a] = s;
        }
#ifdef GEGLU
        stf(pc.y, uint64_t(r) * pc.ldy + c0, gelu_tanh(v[0]) * v[1]);
#else
        [[unroll]] for (uint a = 0; a < NR; a++)
            if (c0 + a < pc.N) stfc(pc.y, uint64_t(r) * pc.ldy + c0 + a, pc.mode == 1u ? softcap(v[a], pc.cap) : v[a]);
#endif
    }
#ifndef GEGLU
    if (pc.mode == 2u) tail_add_norm(nr, (pc.N + NR - 1u) / NR);
#endif
}
