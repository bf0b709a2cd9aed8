#version 450
// Test kernel: s[i], c[i] = sin, cos of angle[i] as the rope shader computes them.
#define WG 64
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t angle, s, c;
    uint n;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) return;
    float s, c;
    sincos_acc(ldf(pc.angle, i), s, c);
    stf(pc.s, i, s);
    stf(pc.c, i, c);
}
