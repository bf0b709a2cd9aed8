#version 450
// Greedy pick on the device: ids[i] = argmax over the vocab of logits row i (ties -> lowest id), for the rows of the
// current logits chunk. The vocab is cut into nb slabs (g3vk_argmax_groups(): ~8 values per invocation); workgroup g
// of row i takes slab g, every invocation loading its values of a pass at once (8 in flight), then a shared-memory
// reduction. nb == 1: that workgroup writes the id. Otherwise it stores its (value, id) pair coherently in
// part[i][g], fences, counts itself in cnt[i] (0 before and after), and the workgroup that counts last fences again
// and reduces the nb pairs (no workgroup waits on another). Grid: (nb, rows).
#define WG 256
#define U 8
#define NONE 0xFFFFFFFFu
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t logits, ids, params;
    uint V, nb;
    uint64_t part, cnt; // [rows][nb] (float bits, id) pairs; [rows] counters
} pc;
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer UBufC { uint v[]; };

shared float best_v[WG];
shared uint best_i[WG];
shared uint last_sh;

// (v, i) beats (bv, bi): a larger value, or the same value at a lower id; NONE never wins and always loses.
bool beats(float v, uint i, float bv, uint bi) {
    return i != NONE && (bi == NONE || v > bv || (v == bv && i < bi));
}

// The workgroup's best of (bv, bi) into best_v[0], best_i[0] (uniform control flow).
void reduce(float bv, uint bi) {
    uint tid = gl_LocalInvocationID.x;
    best_v[tid] = bv;
    best_i[tid] = bi;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (tid < s && beats(best_v[tid + s], best_i[tid + s], best_v[tid], best_i[tid])) {
            best_v[tid] = best_v[tid + s];
            best_i[tid] = best_i[tid + s];
        }
        barrier();
    }
}

void main() {
    uint g = gl_WorkGroupID.x, i = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (i >= uint(prm(pc.params, P_NOUT))) return;
    uint per = (pc.V + pc.nb - 1u) / pc.nb, lo = g * per, hi = min(pc.V, lo + per);
    uint64_t row = uint64_t(i) * pc.V;
    float bv = -1.0 / 0.0;
    uint bi = NONE;
    for (uint k0 = lo + tid; k0 < hi; k0 += WG * U) {
        float v[U];
        [[unroll]] for (uint u = 0; u < U; u++) {
            uint k = k0 + u * WG;
            v[u] = k < hi ? ldf(pc.logits, row + k) : 0.0;
        }
        [[unroll]] for (uint u = 0; u < U; u++) { // increasing k: ties keep the lowest id
            uint k = k0 + u * WG;
            if (k < hi && (v[u] > bv || bi == NONE)) bv = v[u], bi = k;
        }
    }
    reduce(bv, bi);
    if (pc.nb == 1u) {
        if (tid == 0u) IBufW(pc.ids + uint64_t(i) * 4u).v[0] = int(best_i[0]);
        return;
    }
    if (tid == 0u) {
        uint64_t pp = pc.part + (uint64_t(i) * pc.nb + g) * 8u;
        UBufC(pp).v[0] = floatBitsToUint(best_v[0]);
        UBufC(pp).v[1] = best_i[0];
        memoryBarrierBuffer();
        uint old = atomicAdd(UBufC(pc.cnt).v[i], 1u);
        last_sh = old + 1u == pc.nb ? 1u : 0u;
        if (old + 1u == pc.nb) atomicExchange(UBufC(pc.cnt).v[i], 0u); // for the next dispatch
    }
    barrier();
    if (last_sh == 0u) return;
    memoryBarrierBuffer();
    bv = -1.0 / 0.0, bi = NONE;
    for (uint j = tid; j < pc.nb; j += WG) { // increasing slab: ties keep the lowest id
        uint64_t pp = pc.part + (uint64_t(i) * pc.nb + j) * 8u;
        float v = uintBitsToFloat(UBufC(pp).v[0]);
        uint id = UBufC(pp).v[1];
        if (beats(v, id, bv, bi)) bv = v, bi = id;
    }
    reduce(bv, bi);
    if (tid == 0u) IBufW(pc.ids + uint64_t(i) * 4u).v[0] = int(best_i[0]);
}
