#version 450
// Greedy pick on the device: ids[i] = argmax over the vocab of logits row i (ties -> lowest id), for the rows of
// the current logits chunk. One workgroup per row.
#define WG 256
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t logits, ids, params;
    uint V;
} pc;

shared float best_v[WG];
shared uint best_i[WG];

void main() {
    uint i = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (i >= uint(prm(pc.params, P_NOUT))) return;
    float bv = -1.0 / 0.0;
    uint bi = 0xFFFFFFFFu;
    for (uint k = tid; k < pc.V; k += WG) {
        float v = ldf(pc.logits, uint64_t(i) * pc.V + k);
        if (v > bv || bi == 0xFFFFFFFFu) bv = v, bi = k; // increasing k: ties keep the lowest id
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (tid < s) {
            float ov = best_v[tid + s];
            uint oi = best_i[tid + s];
            if (oi != 0xFFFFFFFFu && (ov > best_v[tid] || (ov == best_v[tid] && oi < best_i[tid]) ||
                                      best_i[tid] == 0xFFFFFFFFu)) {
                best_v[tid] = ov;
                best_i[tid] = oi;
            }
        }
        barrier();
    }
    if (tid == 0u) IBufW(pc.ids + uint64_t(i) * 4u).v[0] = int(best_i[0]);
}
