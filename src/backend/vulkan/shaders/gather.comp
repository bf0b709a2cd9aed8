#version 450
// Logits chunk: xo[i] = x[out_rows[out_base + i]] for the rows whose logits are wanted. One workgroup per row.
#define WG 256
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t x, xo, params;
    uint H;
} pc;

void main() {
    uint i = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (i >= uint(prm(pc.params, P_NOUT))) return;
    uint src = uint(prm(pc.params, uint(prm(pc.params, P_OUT)) + uint(prm(pc.params, P_OUTBASE)) + i));
    for (uint k = tid; k < pc.H; k += WG) stf(pc.xo, uint64_t(i) * pc.H + k, ldf(pc.x, uint64_t(src) * pc.H + k));
}
