#version 450
// Row r:  h += rms(t) * w1 (post-attention / post-FFN norm and residual), then x = rms(h) * w2 (the next norm:
// pre-FFN, next layer's input norm, or the final norm). Norm weights hold 1 + w. One workgroup per row.
#define WG 256
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t t, h, x, w1, w2, params;
    uint H;
    float eps;
} pc;

void main() {
    uint r = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (r >= uint(prm(pc.params, P_NROWS))) return;
    uint64_t base = uint64_t(r) * pc.H;
    float ss = 0.0;
    for (uint i = tid; i < pc.H; i += WG) {
        float a = ldf(pc.t, base + i);
        ss += a * a;
    }
    float inv = 1.0 / sqrt(wg_sum(ss) / float(pc.H) + pc.eps);
    float ss2 = 0.0;
    for (uint i = tid; i < pc.H; i += WG) {
        float hn = ldf(pc.h, base + i) + ldf(pc.t, base + i) * inv * ldf(pc.w1, i);
        stf(pc.h, base + i, hn);
        ss2 += hn * hn;
    }
    float inv2 = 1.0 / sqrt(wg_sum(ss2) / float(pc.H) + pc.eps);
    for (uint i = tid; i < pc.H; i += WG) stf(pc.x, base + i, ldf(pc.h, base + i) * inv2 * ldf(pc.w2, i));
}
