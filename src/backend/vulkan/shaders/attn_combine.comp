#version 450
// Merges the split-attention chunks of one (row, head): out = sum_c o_c * exp(m_c - M) / sum_c l_c * exp(m_c - M).
// Grid: (NH, rows).
#define WG 64
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t out_, part, params;
    uint NH, D, window, chunk_len, n_chunks, out_ld;
} pc;

void main() {
    uint h = gl_WorkGroupID.x, r = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (r >= uint(prm(pc.params, P_NROWS))) return;
    uint D = pc.D;
    int pos = prm(pc.params, uint(prm(pc.params, P_POS)) + r);
    int first = pc.window > 0u ? max(0, pos - int(pc.window) + 1) : 0;
    uint nc = (uint(pos - first) + pc.chunk_len) / pc.chunk_len; // chunks holding keys
    uint64_t base = uint64_t(r * pc.NH + h) * pc.n_chunks * (D + 2u);
    float M = -1.0 / 0.0;
    for (uint c = 0; c < nc; c++) M = max(M, ldf(pc.part, base + c * (D + 2u)));
    float L = 0.0;
    for (uint c = 0; c < nc; c++) {
        uint64_t pb = base + c * (D + 2u);
        L += ldf(pc.part, pb + 1u) * exp(ldf(pc.part, pb) - M);
    }
    float inv = 1.0 / L;
    for (uint d = tid; d < D; d += WG) {
        float a = 0.0;
        for (uint c = 0; c < nc; c++) {
            uint64_t pb = base + c * (D + 2u);
            a += ldf(pc.part, pb + 2u + d) * exp(ldf(pc.part, pb) - M);
        }
        stf(pc.out_, uint64_t(r) * pc.out_ld + h * D + d, a * inv);
    }
}
