#version 450
// Row r: h = E[token[r]] * embed_scale, then x = rms(h) * (1 + w_in) for the first layer. One workgroup per row.
#define WG 256
layout(local_size_x = WG) in;
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform PC {
    uint64_t e, eaux, h, x, w, params;
    uint H;
    float scale, eps;
} pc;

void main() {
    uint r = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (r >= uint(prm(pc.params, P_NROWS))) return;
    uint tok = uint(prm(pc.params, uint(prm(pc.params, P_TOK)) + r));
    float ss = 0.0;
    for (uint u = tid; u < pc.H / 16u; u += WG) {
        float v[16];
        dq16(pc.e, pc.eaux, tok, pc.H, u, v);
        [[unroll]] for (uint i = 0; i < 16; i++) {
            float a = v[i] * pc.scale;
            stf(pc.h, uint64_t(r) * pc.H + 16u * u + i, a);
            ss += a * a;
        }
    }
    float inv = 1.0 / sqrt(wg_sum(ss) / float(pc.H) + pc.eps);
    for (uint u = tid; u < pc.H / 16u; u += WG)
        [[unroll]] for (uint i = 0; i < 16; i++) {
            uint64_t k = uint64_t(r) * pc.H + 16u * u + i;
            stf(pc.x, k, ldf(pc.h, k) * inv * ldf(pc.w, 16u * u + i));
        }
}
