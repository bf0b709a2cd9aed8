#version 450
// Row r:  h += rms(t) * w1 (post-attention / post-FFN norm and residual), then x = rms(h) * w2 (the next norm:
// pre-FFN, next layer's input norm, or the final norm). Norm weights hold 1 + w. One workgroup per row.
// Rows of up to WG * NV vec4s (8192 floats; H % 4 == 0): every invocation loads its t, h, w1 and w2 vec4s at once
// and keeps them in registers, so the row costs one round of loads, two reductions and the stores. Longer rows (or
// H % 4 != 0) loop over the row three times instead.
#define WG 256
#define NV 8
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
    uint H4 = pc.H / 4u;
    if (pc.H % 4u == 0u && H4 <= WG * NV) {
        vec4 t[NV], h[NV], w1[NV], w2[NV];
        float ss = 0.0;
        [[unroll]] for (uint j = 0; j < NV; j++) {
            uint i = tid + j * WG;
            t[j] = h[j] = w1[j] = w2[j] = vec4(0.0);
            if (i < H4) {
                t[j] = F4Buf(pc.t + base * 4u).v[i];
                h[j] = F4Buf(pc.h + base * 4u).v[i];
                w1[j] = F4Buf(pc.w1).v[i];
                w2[j] = F4Buf(pc.w2).v[i];
            }
        }
        [[unroll]] for (uint j = 0; j < NV; j++) ss += dot(t[j], t[j]);
        float inv = 1.0 / sqrt(wg_sum(ss) / float(pc.H) + pc.eps);
        float ss2 = 0.0;
        [[unroll]] for (uint j = 0; j < NV; j++) {
            h[j] += t[j] * inv * w1[j];
            ss2 += dot(h[j], h[j]);
            if (tid + j * WG < H4) F4Buf(pc.h + base * 4u).v[tid + j * WG] = h[j];
        }
        float inv2 = 1.0 / sqrt(wg_sum(ss2) / float(pc.H) + pc.eps);
        [[unroll]] for (uint j = 0; j < NV; j++)
            if (tid + j * WG < H4) F4Buf(pc.x + base * 4u).v[tid + j * WG] = h[j] * inv2 * w2[j];
        return;
    }
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
