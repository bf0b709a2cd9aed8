#version 450
// One-row decode product y[c] = sum_k x[k] * W[c][k] on Q8_0 / Q4_0 weights (WTYPE) with packed 4 x 8-bit integer dot
// products (SPV_KHR_integer_dot_product's OpSDot; vk_device.c enables VK_KHR_shader_integer_dot_product): the
// activation row comes quantized to int8 by q8act.comp (blocks of 32: d, q, residual plane q_lo; q8act.glsl), pc.x
// pointing at it. Same contract as matvec2.comp's one-row kernel otherwise (push constants, GEGLU, mode 1 softcap,
// mode 2 the post-norm tail of tail_norm.glsl), the same work split: a workgroup of WG threads computes NC weight
// rows (GeGLU: NC/2 channels of gate and the same of up), each thread taking 16-byte weight chunks k-interleaved
// across the workgroup, U chunk columns per iteration with every load issued before any arithmetic.
//
// Per 16-byte chunk and weight row (Q4_0: 32 values = one block; Q8_0: 16 values = half a block):
//   Q8_0: 4 dot products with q, 4 with q_lo (the weight bytes are the int8 quants as they are);
//   Q4_0: each weight word (8 nibbles, value i in nibble i) gives its even values as bytes by one mask
//         (w & 0x0F0F0F0F) and its odd ones by a shift and a mask, matching q8act's (x0 x2 x4 x6)(x1 x3 x5 x7) order:
//         8 dot products with q, 8 with q_lo, on the unsigned nibbles n; the offset 8 of x = d_w * (n - 8) comes
//         from the block sum of the activations: sum (n - 8) xh = d_x (sum n q + sum n q_lo / 254) - 8 s.
//   then per chunk: t = d_x / 254 * (254 iq + il) (- 8 s), acc += d_w * t: one int-to-float conversion per chunk
//   (254 iq + il < 2^27 is rounded to float32 there: a relative 6e-8, like any float32 product).
// Q4_0: ~12 integer ops for the masks + 16 dot products + ~4 other ops per 32 weights (matvec2: ~1.1 integer + 2
// float ops per weight), and 2 bytes of activations per value (+ 8 bytes per block) instead of 4.
// Accuracy: xh = d (q + q_lo / 254) is within amax / 64516 of x (the block's largest |x|), and the integer sums are
// exact, so the result is W . xh up to float32 rounding (cf. src/backend/cuda/qgemv.cu, which makes the same argument).
// WG, NC and U are specialization constants 0, 1, 2 (vk_device.c: 64 / 4 / 2, or $G3_VULKAN_MVQ_WG / _NC / _COLS).
#extension GL_EXT_spirv_intrinsics : require
#define RMAX 1
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NC = 4;
layout(constant_id = 2) const uint U = 2;
#include "common.glsl"
#include "dequant.glsl"
#include "q8act.glsl"

layout(push_constant) uniform PC {
    uint64_t w, waux, w2, w2aux, x, y, params; // x: the q8act row
    uint N, K, ldx, ldy, nrows_idx, mode;
    float cap;
    uint64_t h, xo, cnt; // mode 2 (tail_norm.glsl)
} pc;
#ifndef GEGLU
#include "tail_norm.glsl"
#endif

layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer F2Buf { vec2 v[]; };

// OpSDot (4450) on 32-bit words holding 4 signed bytes each (PackedVectorFormat4x8Bit = 0); capabilities DotProduct
// (6019) and DotProductInput4x8BitPacked (6018). Declared through GL_EXT_spirv_intrinsics: Debian 12's glslang
// (11.13) predates GL_EXT_integer_dot_product's dotPacked4x8EXT, which compiles to the same instruction.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(int a, int b, spirv_literal int fmt);
int dot4(uint a, uint b, int acc) { return sdot4x8(int(a), int(b), 0) + acc; }

#if WTYPE == T_Q8_0
#define VPC 16u // values per 16-byte chunk
#elif WTYPE == T_Q4_0
#define VPC 32u
#else
#error matvecq serves Q8_0 and Q4_0
#endif

#ifdef GEGLU
#define OPW (NC / 2u) // outputs per workgroup
#else
#define OPW NC
#endif

shared float part_sh[NC][WG];

// Block scale of chunk ch of weight row `row`.
float chunk_scale(uint64_t aux, uint row, uint ch) {
#if WTYPE == T_Q8_0
    return half_at(aux, row * (pc.K / 32u) + (ch >> 1));
#else
    return half_at(aux, row * (pc.K / 32u) + ch);
#endif
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint c0 = wg * OPW;
    if (c0 >= pc.N) return;
    uint nr = min(uint(prm(pc.params, pc.nrows_idx)), 1u);
    uint64_t wb[NC], ab[NC];
    uint rowi[NC];
    [[unroll]] for (uint a = 0; a < NC; a++) {
#ifdef GEGLU
        bool up = a >= OPW;
        wb[a] = up ? pc.w2 : pc.w;
        ab[a] = up ? pc.w2aux : pc.waux;
        rowi[a] = min(c0 + (up ? a - OPW : a), pc.N - 1u);
#else
        wb[a] = pc.w, ab[a] = pc.waux;
        rowi[a] = min(c0 + a, pc.N - 1u); // a missing channel past N reads a valid row; its sum is not stored
#endif
        wb[a] += uint64_t(rowi[a]) * ROW_BYTES(pc.K);
    }
    float acc[NC];
    [[unroll]] for (uint a = 0; a < NC; a++) acc[a] = 0.0;
    U4Buf xq = U4Buf(pc.x), xl = U4Buf(pc.x + pc.K);
    F2Buf xs = F2Buf(pc.x + 2u * uint64_t(pc.K));
    uint nch = pc.K / VPC;
    for (uint c = tid; c < nch; c += U * WG) {
        uint cc[U];
        bool ok[U];
        [[unroll]] for (uint u = 0; u < U; u++) {
            cc[u] = c + u * WG;
            ok[u] = cc[u] < nch;
            cc[u] = ok[u] ? cc[u] : c; // a valid address; not used
        }
        uvec4 q[U][NC];
        float d[U][NC];
        [[unroll]] for (uint u = 0; u < U; u++)
            [[unroll]] for (uint a = 0; a < NC; a++) q[u][a] = U4Buf(wb[a]).v[cc[u]];
        [[unroll]] for (uint u = 0; u < U; u++)
            [[unroll]] for (uint a = 0; a < NC; a++) d[u][a] = chunk_scale(ab[a], rowi[a], cc[u]);
#if WTYPE == T_Q4_0
        uvec4 aq[U][2], al[U][2]; // the chunk's 32 activation bytes of each plane
        vec2 ds[U];
        [[unroll]] for (uint u = 0; u < U; u++) {
            aq[u][0] = xq.v[2u * cc[u]], aq[u][1] = xq.v[2u * cc[u] + 1u];
            al[u][0] = xl.v[2u * cc[u]], al[u][1] = xl.v[2u * cc[u] + 1u];
            ds[u] = xs.v[cc[u]];
        }
#else
        uvec4 aq[U], al[U];
        vec2 ds[U];
        [[unroll]] for (uint u = 0; u < U; u++) {
            aq[u] = xq.v[cc[u]], al[u] = xl.v[cc[u]];
            ds[u] = xs.v[cc[u] >> 1];
        }
#endif
        float dd[U]; // d / 254: the chunk's two integer sums meet as 254 iq + il (< 2^27), one conversion
        [[unroll]] for (uint u = 0; u < U; u++) dd[u] = ds[u].x * (1.0 / 254.0);
        [[unroll]] for (uint u = 0; u < U; u++) {
            if (ok[u]) { // false only in the last iteration, for threads past the end
                [[unroll]] for (uint a = 0; a < NC; a++) {
                    int iq = 0, il = 0;
#if WTYPE == T_Q4_0
                    [[unroll]] for (uint g = 0; g < 4u; g++) { // weight word g: values 8g..8g+7
                        uint wv = q[u][a][g];
                        uint ev = wv & 0x0F0F0F0Fu, od = (wv >> 4) & 0x0F0F0F0Fu;
                        uint j = 2u * (g & 1u);
                        iq = dot4(ev, aq[u][g >> 1][j], iq), iq = dot4(od, aq[u][g >> 1][j + 1u], iq);
                        il = dot4(ev, al[u][g >> 1][j], il), il = dot4(od, al[u][g >> 1][j + 1u], il);
                    }
                    float t = fma(dd[u], float(254 * iq + il), -8.0 * ds[u].y);
#else
                    [[unroll]] for (uint g = 0; g < 4u; g++) {
                        iq = dot4(q[u][a][g], aq[u][g], iq);
                        il = dot4(q[u][a][g], al[u][g], il);
                    }
                    float t = dd[u] * float(254 * iq + il);
#endif
                    acc[a] = fma(d[u][a], t, acc[a]);
                }
            }
        }
    }
    // reduce the NC partial sums over the workgroup
#if G3_SG
    [[unroll]] for (uint a = 0; a < NC; a++) {
        float s = subgroupAdd(acc[a]);
        if (subgroupElect()) part_sh[a][gl_SubgroupID] = s;
    }
    barrier();
    uint nparts = gl_NumSubgroups;
#else
    [[unroll]] for (uint a = 0; a < NC; a++) part_sh[a][tid] = acc[a];
    barrier();
    uint nparts = WG;
#endif
    if (tid < OPW * nr) { // one thread per output
        uint o = tid;
        float v = 0.0;
        for (uint i = 0; i < nparts; i++) v += part_sh[o][i];
#ifdef GEGLU
        float vu = 0.0;
        for (uint i = 0; i < nparts; i++) vu += part_sh[o + OPW][i];
        if (c0 + o < pc.N) stf(pc.y, c0 + o, gelu_tanh(v) * vu);
#else
        if (c0 + o < pc.N) stfc(pc.y, c0 + o, pc.mode == 1u ? softcap(v, pc.cap) : v);
#endif
    }
#ifndef GEGLU
    if (pc.mode == 2u) tail_add_norm(nr, (pc.N + OPW - 1u) / OPW);
#endif
}
