#version 450
// Per (head, row): QK-norm (rms over head_dim times 1 + w) and rope (rotate-half pairs (i, i + D/2), angle
// pos * inv_freq[i]) on the q heads in place, and on the k heads, which go to the KV cache together with the v
// heads. qkv rows: [q: NH*D][k: KVH*D][v: KVH*D]. Cache block: [n_layers_kind][2 (K, V)][KVH][B][D] float32.
// Grid: (NH + KVH, rows). KV16: the cache holds f16 (pairs of adjacent elements written as one 32-bit word).
#define WG 64
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t qkv, kv, params, qn, kn, invf;
    uint ld, NH, KVH, D, B, li, block_floats, table;
    float eps;
} pc;

#ifdef KV16
layout(buffer_reference, std430, buffer_reference_align = 4) buffer HWBuf { uint v[]; };
void st2h(uint64_t e, float a, float b) { HWBuf(pc.kv + e * 2u).v[0] = packHalf2x16(vec2(a, b)); } // e even
#endif

void main() {
    uint hd = gl_WorkGroupID.x, r = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (r >= uint(prm(pc.params, P_NROWS))) return;
    uint D = pc.D, half_d = D / 2u;
    int pos = prm(pc.params, uint(prm(pc.params, P_POS)) + r);
    bool isq = hd < pc.NH;
    uint64_t src = uint64_t(r) * pc.ld + (isq ? hd * D : pc.NH * D + (hd - pc.NH) * D);
    uint64_t nw = isq ? pc.qn : pc.kn;
    float ss = 0.0;
    for (uint i = tid; i < D; i += WG) {
        float a = ldf(pc.qkv, src + i);
        ss += a * a;
    }
    float inv = 1.0 / sqrt(wg_sum(ss) / float(D) + pc.eps);
    barrier(); // all reads of the head are done before any thread rewrites it in place
    uint64_t kdst = 0, vdst = 0;
    if (!isq) {
        uint hk = hd - pc.NH;
        int seq = prm(pc.params, uint(prm(pc.params, P_SEQ)) + r);
        uint tab = uint(prm(pc.params, pc.table == 0u ? P_BTG : P_BTL));
        int blk = prm(pc.params, tab + uint(seq) * uint(prm(pc.params, P_BPS)) + uint(pos) / pc.B);
        uint64_t off = uint64_t(blk) * pc.block_floats + uint64_t(uint(pos) % pc.B) * D;
        kdst = off + uint64_t((pc.li * 2u + 0u) * pc.KVH + hk) * pc.B * D;
        vdst = off + uint64_t((pc.li * 2u + 1u) * pc.KVH + hk) * pc.B * D;
#ifdef KV16
        for (uint i = 2u * tid; i < D; i += 2u * WG)
            st2h(vdst + i, ldf(pc.qkv, src + pc.KVH * D + i), ldf(pc.qkv, src + pc.KVH * D + i + 1u));
#else
        for (uint i = tid; i < D; i += WG) stf(pc.kv, vdst + i, ldf(pc.qkv, src + pc.KVH * D + i));
#endif
    }
#ifdef KV16
    if (!isq) { // pairs (2j, 2j + 1) of both halves, so that each f16 word is written whole
        for (uint j = tid; 2u * j < half_d; j += WG) {
            float ra[2], rb[2];
            [[unroll]] for (uint e = 0; e < 2; e++) {
                uint i = 2u * j + e;
                float a = ldf(pc.qkv, src + i) * inv * ldf(nw, i);
                float b = ldf(pc.qkv, src + i + half_d) * inv * ldf(nw, i + half_d);
                float s, c;
                sincos_acc(float(pos) * ldf(pc.invf, i), s, c);
                ra[e] = a * c - b * s, rb[e] = b * c + a * s;
            }
            st2h(kdst + 2u * j, ra[0], ra[1]);
            st2h(kdst + half_d + 2u * j, rb[0], rb[1]);
        }
        return;
    }
#endif
    for (uint i = tid; i < half_d; i += WG) {
        float a = ldf(pc.qkv, src + i) * inv * ldf(nw, i);
        float b = ldf(pc.qkv, src + i + half_d) * inv * ldf(nw, i + half_d);
        float s, c;
        sincos_acc(float(pos) * ldf(pc.invf, i), s, c);
        float ra = a * c - b * s, rb = b * c + a * s;
        if (isq) {
            stf(pc.qkv, src + i, ra);
            stf(pc.qkv, src + i + half_d, rb);
        } else {
            stf(pc.kv, kdst + i, ra);
            stf(pc.kv, kdst + i + half_d, rb);
        }
    }
}
