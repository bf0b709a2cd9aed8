#version 450
// Decode y[r][c] = sum_k x[r][k] * W[c][k] (the default decode product; $G3_VULKAN_MV2=0: matvec1.comp instead):
// F16, BF16, Q8_0, Q4_0 with K a multiple of 32, up to RMAX rows (built with RMAX 1 for the one-row bucket, 8 for the
// 2..8-row buckets). Same contract as matvec1.comp (push constants, GEGLU, mode 1 softcap, mode 2 the post-norm tail
// of tail_norm.glsl), but
// a 64-thread workgroup computes NC weight rows ("slots") instead of 2:
//   RMAX 1: NC = 8 (8 output channels; GEGLU: 4 channels of gate and the same 4 of up);
//   RMAX 8: NC = 4 (4 output channels; GEGLU: 2 + 2). vk_internal.h (g3vk_matvec_outputs) mirrors these numbers.
// Every thread takes 16-byte chunks k-interleaved across the workgroup (lanes read consecutive chunks), U = 2 chunk
// columns per iteration, and issues all NC * U chunk loads (and their block scales) before any arithmetic: 16 x 16 B
// in flight per thread at one row, 8 at 8 rows (matvec1: 4). Each activation vec4 is loaded once per chunk and used
// for all NC slots (matvec1: 2), so the activation reads per weight byte drop by NC / 2.
// Integers become floats through the exponent without shifting each value down: a field of bits s..s+w-1 ORed into
// the exponent of 2^(23-s) is the float 2^(23-s) + n (exact for s + w <= 23), so one AND-OR (one LOP3 on NVIDIA)
// and one subtraction of the constant 2^(23-s) + offset give q - offset exactly; one shift per word brings the
// nibbles / bytes above bit 19 / 15 down. Q4_0: 1.1 integer ops + 1 add + 1 FMA per weight (matvec1: ~3 + 1 + 1).
// One row: per slot the chunk's dot product is accumulated unscaled and the block scale applied once per chunk.
// 2..8 rows: every weight is decoded once, times its block scale, and then multiplied into every row in use.
// MV2_SPEC (built as matvec2s*, one row only): WG, NC and U become specialization constants 0, 1, 2 (defaults the
// numbers above) that vk_device.c sets from $G3_VULKAN_MV2_WG / _NC / _COLS, for tuning sweeps with one binary; the
// default kernel (no MV2_SPEC) is compiled with them fixed as before.
#ifndef RMAX
#define RMAX 1
#endif
#ifdef MV2_SPEC
#if RMAX != 1
#error MV2_SPEC: one-row builds only
#endif
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NC = 8;
layout(constant_id = 2) const uint U = 2;
#else
#define WG 64
#if RMAX == 1
#define NC 8
#else
#define NC 4
#endif
#define U 2
layout(local_size_x = WG) in;
#endif
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

// VPC values per 16-byte chunk, NG groups of 8 values per chunk (one group = 2 activation vec4s).
#if WTYPE == T_F16 || WTYPE == T_BF16
#define VPC 8u
#define NG 1u
#elif WTYPE == T_Q8_0
#define VPC 16u
#define NG 2u
#elif WTYPE == T_Q4_0
#define VPC 32u
#define NG 4u
#else
#error matvec2 serves F16, BF16, Q8_0 and Q4_0
#endif

#ifdef GEGLU
#define OPW (NC / 2u) // outputs per workgroup
#else
#define OPW NC
#endif

shared float part_sh[NC * RMAX][WG];

float fb(uint bits) { return uintBitsToFloat(bits); }

// The 8 values of group g of chunk q, as exact floats (weight / block scale): values 8g..8g+3 in lo, +4..+7 in hi.
void group8(uvec4 q, uint g, out vec4 lo, out vec4 hi) {
#if WTYPE == T_F16
    lo = vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
    hi = vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w));
#elif WTYPE == T_BF16
    lo = vec4(bf16lo(q.x), bf16hi(q.x), bf16lo(q.y), bf16hi(q.y));
    hi = vec4(bf16lo(q.z), bf16hi(q.z), bf16lo(q.w), bf16hi(q.w));
#elif WTYPE == T_Q8_0
    // word: 4 int8 values; byte ^ 0x80 = q + 128 (folded into the OR: the fields do not overlap)
    uint a = q[2u * g], b = q[2u * g + 1u];
    uint a2 = a >> 16, b2 = b >> 16;
    const float c0 = 8388736.0, c8 = 32896.0; // 2^23 + 128, 2^15 + 128
    lo = vec4(fb((a & 0xFFu) ^ 0x4B000080u) - c0, fb((a & 0xFF00u) ^ 0x47008000u) - c8,
              fb((a2 & 0xFFu) ^ 0x4B000080u) - c0, fb((a2 & 0xFF00u) ^ 0x47008000u) - c8);
    hi = vec4(fb((b & 0xFFu) ^ 0x4B000080u) - c0, fb((b & 0xFF00u) ^ 0x47008000u) - c8,
              fb((b2 & 0xFFu) ^ 0x4B000080u) - c0, fb((b2 & 0xFF00u) ^ 0x47008000u) - c8);
#else // Q4_0: word g holds values 8g..8g+7, value 8g+m in bits 4m..4m+3
    uint a = q[g], b = a >> 12;
    const float c0 = 8388616.0, c4 = 524296.0, c8 = 32776.0, c12 = 2056.0, c16 = 136.0; // 2^(23-s) + 8
    lo = vec4(fb((a & 0xFu) | 0x4B000000u) - c0, fb((a & 0xF0u) | 0x49000000u) - c4,
              fb((a & 0xF00u) | 0x47000000u) - c8, fb((a & 0xF000u) | 0x45000000u) - c12);
    hi = vec4(fb((a & 0xF0000u) | 0x43000000u) - c16, fb((b & 0xF00u) | 0x47000000u) - c8,
              fb((b & 0xF000u) | 0x45000000u) - c12, fb((b & 0xF0000u) | 0x43000000u) - c16);
#endif
}

// acc + x0 . lo + x1 . hi as one chain of 8 multiply-adds (two dot()s and their sums cost 10 operations).
float fma8(vec4 x0, vec4 x1, vec4 lo, vec4 hi, float acc) {
    acc = fma(x0.x, lo.x, acc), acc = fma(x0.y, lo.y, acc), acc = fma(x0.z, lo.z, acc), acc = fma(x0.w, lo.w, acc);
    acc = fma(x1.x, hi.x, acc), acc = fma(x1.y, hi.y, acc), acc = fma(x1.z, hi.z, acc), acc = fma(x1.w, hi.w, acc);
    return acc;
}

// Block scale of chunk ch of weight row `row` (1 for float types).
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
    uint c0 = wg * OPW;
    if (c0 >= pc.N) return;
    uint nr = uint(prm(pc.params, pc.nrows_idx));
    if (nr > RMAX) nr = RMAX;
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
    float acc[NC][RMAX];
    [[unroll]] for (uint a = 0; a < NC; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++) acc[a][r] = 0.0;
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
        [[unroll]] for (uint u = 0; u < U; u++) {
            if (ok[u]) { // false only in the last iteration, for threads past the end
#if RMAX == 1
                F4Buf xp = F4Buf(pc.x + uint64_t(cc[u]) * (VPC * 4u));
                float t[NC];
                [[unroll]] for (uint a = 0; a < NC; a++) t[a] = 0.0;
                [[unroll]] for (uint g = 0; g < NG; g++) {
                    vec4 x0 = xp.v[2u * g], x1 = xp.v[2u * g + 1u];
                    [[unroll]] for (uint a = 0; a < NC; a++) {
                        vec4 lo, hi;
                        group8(q[u][a], g, lo, hi);
                        t[a] = fma8(x0, x1, lo, hi, t[a]);
                    }
                }
                [[unroll]] for (uint a = 0; a < NC; a++) acc[a][0] += d[u][a] * t[a];
#else
                [[unroll]] for (uint g = 0; g < NG; g++) {
                    vec4 lo[NC], hi[NC];
                    [[unroll]] for (uint a = 0; a < NC; a++) {
                        group8(q[u][a], g, lo[a], hi[a]);
                        lo[a] *= d[u][a], hi[a] *= d[u][a];
                    }
                    [[unroll]] for (uint r = 0; r < RMAX; r++) {
                        if (r < nr) {
                            F4Buf xp = F4Buf(pc.x + uint64_t(r) * pc.ldx * 4u + uint64_t(cc[u]) * (VPC * 4u));
                            vec4 x0 = xp.v[2u * g], x1 = xp.v[2u * g + 1u];
                            [[unroll]] for (uint a = 0; a < NC; a++) acc[a][r] = fma8(x0, x1, lo[a], hi[a], acc[a][r]);
                        }
                    }
                }
#endif
            }
        }
    }
    // reduce the NC * nr partial sums over the workgroup
#if G3_SG
    [[unroll]] for (uint a = 0; a < NC; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) {
                float s = subgroupAdd(acc[a][r]);
                if (subgroupElect()) part_sh[a * RMAX + r][gl_SubgroupID] = s;
            }
        }
    barrier();
    uint nparts = gl_NumSubgroups;
#else
    [[unroll]] for (uint a = 0; a < NC; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++)
            if (r < nr) part_sh[a * RMAX + r][tid] = acc[a][r];
    barrier();
    uint nparts = WG;
#endif
    if (tid < OPW * nr) { // one thread per (output, row)
        uint o = tid % OPW, r = tid / OPW;
        float v = 0.0;
        for (uint i = 0; i < nparts; i++) v += part_sh[o * RMAX + r][i];
#ifdef GEGLU
        float vu = 0.0;
        for (uint i = 0; i < nparts; i++) vu += part_sh[(o + OPW) * RMAX + r][i];
        if (c0 + o < pc.N) stf(pc.y, uint64_t(r) * pc.ldy + c0 + o, gelu_tanh(v) * vu);
#else
        if (c0 + o < pc.N) stfc(pc.y, uint64_t(r) * pc.ldy + c0 + o, pc.mode == 1u ? softcap(v, pc.cap) : v);
#endif
    }
#ifndef GEGLU
    if (pc.mode == 2u) tail_add_norm(nr, (pc.N + OPW - 1u) / OPW);
#endif
}
