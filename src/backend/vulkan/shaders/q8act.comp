#version 450
// Activation rows to int8 for matvecq.comp: x [rows][ldx] float32 -> per row, blocks of 32 values quantized as
//   d = amax / 127, q = rint(x / d), q_lo = rint((x / d - q) * 254), so that x = d * (q + q_lo / 254) within
//   amax / 64516 (~2^-16 of the block's largest |x|; q alone: amax / 254), both planes int8 in [-127, 127].
// Layout of a row (Q8ACT_ROW_BYTES(K) bytes, 16-byte aligned; vk_internal.h g3vk_q8_row_bytes mirrors it):
//   q [K] int8 | q_lo [K] int8 | [K/32] float2 (d, d * (sum of q + sum of q_lo / 254) over the block)
// il = 1 (for Q4_0 weights): the 8 values 8j..8j+7 are stored as (x0 x2 x4 x6)(x1 x3 x5 x7) -- the order in which a
// weight word's low nibbles (mask 0x0F0F0F0F) and high nibbles ((w >> 4) & 0x0F0F0F0F) come out as bytes -- so that
// matvecq.comp takes one packed 4 x 8-bit dot product per mask; il = 0 (Q8_0): natural order.
// One invocation per 8 values; the 4 of a block are neighbours and combine their amax and sums through shared
// memory. Grid: (ceil(K / 8 / 64), rows of the bucket); rows past the step's row count return at once.
#define WG 64
layout(local_size_x = WG) in;
#include "common.glsl"
#include "q8act.glsl"

layout(push_constant) uniform PC {
    uint64_t x, xq, params;
    uint K, ldx, nrows_idx, il;
} pc;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer U2BufW { uvec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer F2BufW { vec2 v[]; };

shared float am_sh[WG];
shared int sq_sh[WG], sl_sh[WG];

uint pack4(int a, int b, int c, int d) {
    return (uint(a) & 255u) | ((uint(b) & 255u) << 8) | ((uint(c) & 255u) << 16) | ((uint(d) & 255u) << 24);
}

void main() {
    uint tid = gl_LocalInvocationID.x, r = gl_WorkGroupID.y;
    if (r >= uint(prm(pc.params, pc.nrows_idx))) return; // uniform per workgroup
    uint K = pc.K, j8 = gl_WorkGroupID.x * WG + tid;
    bool ok = j8 < K / 8u;
    float v[8];
    if (ok) {
        F4Buf p = F4Buf(pc.x + (uint64_t(r) * pc.ldx + uint64_t(j8) * 8u) * 4u);
        vec4 a = p.v[0], b = p.v[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        [[unroll]] for (uint e = 0; e < 8; e++) v[e] = 0.0;
    }
    float amax = 0.0;
    [[unroll]] for (uint e = 0; e < 8; e++) amax = max(amax, abs(v[e]));
    am_sh[tid] = amax;
    barrier();
    uint b0 = tid & ~3u;
    amax = max(max(am_sh[b0], am_sh[b0 + 1u]), max(am_sh[b0 + 2u], am_sh[b0 + 3u]));
    float inv = amax > 0.0 ? 127.0 / amax : 0.0, d = amax / 127.0;
    int q[8], ql[8], sq = 0, sl = 0;
    [[unroll]] for (uint e = 0; e < 8; e++) {
        float p = v[e] * inv;
        q[e] = clamp(int(roundEven(p)), -127, 127);
        ql[e] = clamp(int(roundEven((p - float(q[e])) * 254.0)), -127, 127);
        sq += q[e], sl += ql[e];
    }
    sq_sh[tid] = sq, sl_sh[tid] = sl;
    barrier();
    if (!ok) return;
    uint64_t row = pc.xq + uint64_t(r) * Q8ACT_ROW_BYTES(K);
    uint w = j8 * 8u; // byte offset of the 8 values in each plane
    uvec2 wq, wl;
    if (pc.il != 0u) {
        wq = uvec2(pack4(q[0], q[2], q[4], q[6]), pack4(q[1], q[3], q[5], q[7]));
        wl = uvec2(pack4(ql[0], ql[2], ql[4], ql[6]), pack4(ql[1], ql[3], ql[5], ql[7]));
    } else {
        wq = uvec2(pack4(q[0], q[1], q[2], q[3]), pack4(q[4], q[5], q[6], q[7]));
        wl = uvec2(pack4(ql[0], ql[1], ql[2], ql[3]), pack4(ql[4], ql[5], ql[6], ql[7]));
    }
    U2BufW(row + w).v[0] = wq;
    U2BufW(row + K + w).v[0] = wl;
    if ((tid & 3u) == 0u) {
        int bq = sq_sh[b0] + sq_sh[b0 + 1u] + sq_sh[b0 + 2u] + sq_sh[b0 + 3u];
        int bl = sl_sh[b0] + sl_sh[b0 + 1u] + sl_sh[b0 + 2u] + sl_sh[b0 + 3u];
        F2BufW(row + 2u * uint64_t(K)).v[j8 >> 2] = vec2(d, d * (float(bq) + float(bl) * (1.0 / 254.0)));
    }
}
