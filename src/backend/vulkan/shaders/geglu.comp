#version 450
// gate[r][i] = gelu_tanh(gate[r][i]) * up[r][i], for layers whose gate and up weights differ in type (the fused
// matvec/matmul GEGLU path needs one type). Grid: (F / WG, rows).
#define WG 256
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t gate, up, params;
    uint F;
} pc;

void main() {
    uint r = gl_WorkGroupID.y, i = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x;
    if (r >= uint(prm(pc.params, P_NROWS)) || i >= pc.F) return;
    uint64_t k = uint64_t(r) * pc.F + i;
    stf(pc.gate, k, gelu_tanh(ldf(pc.gate, k)) * ldf(pc.up, k));
}
