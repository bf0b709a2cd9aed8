#version 450
// Attention of one row, GQA-aware: a workgroup takes GH query heads of one KV head (GH = 4, 2 or 1, the largest
// dividing NH/KVH: every K/V element it reads serves GH heads) over one chunk of the row's span first..pos
// (first = pos - W + 1 on sliding layers), walked in tiles of T keys (pc.chunk_len, g3vk_attn_tile() on the host)
// with an online float32 softmax. Per tile:
//   1. every invocation issues all its loads at once: JM K vec4s of one key (P = ceil(D/4 / JM) invocations per key,
//      T*P <= WG) and the V vec4 of one 4-dim column for up to JM keys (Q = WG / (D/4) key groups, T <= JM*Q), each
//      after its block-table lookup; nothing else in the tile touches global memory;
//   2. partial dot products with the GH queries (held in shared memory) -> dot_sh; barrier; the P partials of each
//      (head, key) summed, scaled, soft-capped, masked -> s_sh; barrier;
//   3. every invocation takes each head's tile max from s_sh, rescales its running output and sum, adds p * V of its
//      keys (registers only).
// At the end the Q key groups' outputs and sums are added through shared memory.
// Chunks (attn_merge.glsl): n_chunks == 1 (prefill): the whole span. n_chunks > 1 (decode buckets): the span is cut
// into nc <= n_chunks chunks of CL keys, CL the smallest multiple of T with n_chunks * CL >= span, so a short span
// runs as many workgroups as tiles; chunks past nc exit. nc == 1: the normalized output goes straight to
// out[r][h*D..] (attn_combine then has nothing to do). Otherwise (max, sum, unnormalized out) go to
// part[(r*NH + h)*n_chunks + c]: mode 1 leaves the merge to attn_combine.comp; mode 2 ($G3_VULKAN_FUSE=1): the
// workgroup that stores the last chunk of a (row, head group) merges them (counter cnt[r*NH + h0], 0 before and
// after; partials stored coherently and fenced before the count, fenced again before the merge; no workgroup waits
// on another). Grid: (n_chunks, NH / GH, rows).
// KV16: the cache holds f16 (qk_rope.comp built with KV16 writes it); offsets below count elements either way.
#define WG 128
#define JM 8   // K vec4s and V keys per invocation per tile
#define GHM 4  // query heads per workgroup, at most
#define DMAX 256
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t q, kv, out_, part, params;
    uint ld, NH, KVH, D, B, li, block_floats, table, window, chunk_len, n_chunks, mode, out_ld;
    float scale, cap;
    uint64_t cnt; // mode 2: [rows][NH] counters
} pc;
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CntBuf { uint v[]; };
#include "attn_merge.glsl"

#ifdef KV16
// elements 4i..4i+3 from element e0 (e0 a multiple of 4)
vec4 ldkv4(uint64_t e0, uint i) {
    uvec2 w = U2Buf(pc.kv + e0 * 2u).v[i];
    return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
}
#else
vec4 ldkv4(uint64_t e0, uint i) { return F4Buf(pc.kv + e0 * 4u).v[i]; }
#endif

shared vec4 q_sh[GHM * DMAX / 4]; // [GH][D/4] queries
shared float dot_sh[GHM * WG];    // [GH][WG] partial dot products (invocation k*P + p: key k, part p)
shared float s_sh[GHM * WG];      // [GH][T] scores of the tile
shared vec4 o_sh[GHM * WG];       // [Q][GH][D/4] outputs of the key groups
shared float l_sh[GHM * WG];      // [Q][GH] sums of the key groups
shared uint last_sh;

void main() {
    uint c = gl_WorkGroupID.x, gy = gl_WorkGroupID.y, r = gl_WorkGroupID.z, tid = gl_LocalInvocationID.x;
    if (r >= uint(prm(pc.params, P_NROWS))) return;
    uint D = pc.D, D4 = D / 4u, T = pc.chunk_len;
    uint P = (D4 + JM - 1u) / JM, Q = WG / D4;
    uint G = pc.NH / pc.KVH, GH = G % 4u == 0u ? 4u : (G % 2u == 0u ? 2u : 1u), NG = G / GH;
    uint hk = gy / NG, h0 = hk * G + (gy % NG) * GH;
    int pos = prm(pc.params, uint(prm(pc.params, P_POS)) + r);
    int seq = prm(pc.params, uint(prm(pc.params, P_SEQ)) + r);
    int first = pc.window > 0u ? max(0, pos - int(pc.window) + 1) : 0;
    uint CL, nc = attn_chunks(uint(pos - first + 1), T, pc.n_chunks, CL);
    if (c >= nc) return;
    int k0 = first + int(c * CL), k1 = min(pos, k0 + int(CL) - 1);
    uint tab = uint(prm(pc.params, pc.table == 0u ? P_BTG : P_BTL)) + uint(seq) * uint(prm(pc.params, P_BPS));
    uint64_t head_off = uint64_t((pc.li * 2u) * pc.KVH + hk) * pc.B * D; // K of (layer, kv head) in a block
    uint64_t vshift = uint64_t(pc.KVH) * pc.B * D;                       // V follows K
    for (uint x = tid; x < GH * D4; x += WG)
        q_sh[x] = F4Buf(pc.q + (uint64_t(r) * pc.ld + (h0 + x / D4) * D) * 4u).v[x % D4];
    uint ks = tid / P, ps = tid % P; // score phase: key ks of the tile, vec4s ps, ps + P, ...
    uint dv = tid % D4, qv = tid / D4; // value phase: column dv, keys qv, qv + Q, ... (qv < Q)
    vec4 o[GHM];
    float m[GHM], l[GHM];
    [[unroll]] for (uint h = 0; h < GHM; h++) o[h] = vec4(0.0), m[h] = -1.0 / 0.0, l[h] = 0.0;
    barrier();
    for (int t0 = k0; t0 <= k1; t0 += int(T)) {
        // 1. loads
        vec4 kr[JM], vr[JM];
        int kp = t0 + int(ks);
        bool kval = ks < T && kp <= k1;
        uint64_t kbase = 0;
        if (kval) {
            int blk = prm(pc.params, tab + uint(kp) / pc.B);
            kbase = uint64_t(blk) * pc.block_floats + head_off + uint64_t(uint(kp) % pc.B) * D;
        }
        [[unroll]] for (uint j = 0; j < JM; j++) {
            kr[j] = vec4(0.0);
            if (kval && ps + P * j < D4) kr[j] = ldkv4(kbase, ps + P * j);
        }
        [[unroll]] for (uint j = 0; j < JM; j++) {
            uint key = qv + Q * j;
            int kpv = t0 + int(key);
            vr[j] = vec4(0.0);
            if (qv < Q && key < T && kpv <= k1) {
                int blk = prm(pc.params, tab + uint(kpv) / pc.B);
                vr[j] = ldkv4(uint64_t(blk) * pc.block_floats + head_off + vshift + uint64_t(uint(kpv) % pc.B) * D, dv);
            }
        }
        // 2. scores
        [[unroll]] for (uint h = 0; h < GHM; h++) {
            if (h < GH) {
                float a = 0.0;
                [[unroll]] for (uint j = 0; j < JM; j++)
                    if (ps + P * j < D4) a += dot(q_sh[h * D4 + ps + P * j], kr[j]);
                dot_sh[h * WG + tid] = a;
            }
        }
        barrier();
        for (uint x = tid; x < GH * T; x += WG) {
            uint h = x / T, k = x % T;
            float s = 0.0;
            for (uint p = 0; p < P; p++) s += dot_sh[h * WG + k * P + p];
            s_sh[x] = t0 + int(k) <= k1 ? softcap(s * pc.scale, pc.cap) : -1.0 / 0.0;
        }
        barrier();
        // 3. online softmax and p * V
        [[unroll]] for (uint h = 0; h < GHM; h++) {
            if (h < GH) {
                float mt = -1.0 / 0.0;
                for (uint k = 0; k < T; k++) mt = max(mt, s_sh[h * T + k]);
                float mn = max(m[h], mt), corr = exp(m[h] - mn);
                vec4 a = o[h] * corr;
                float ls = l[h] * corr;
                [[unroll]] for (uint j = 0; j < JM; j++) {
                    uint key = qv + Q * j;
                    if (qv < Q && key < T) {
                        float p = exp(s_sh[h * T + key] - mn); // 0 for masked keys
                        a += p * vr[j];
                        ls += p;
                    }
                }
                o[h] = a, l[h] = ls, m[h] = mn;
            }
        }
    }
    // the key groups' outputs and sums
    if (qv < Q) {
        [[unroll]] for (uint h = 0; h < GHM; h++) {
            if (h < GH) {
                o_sh[(qv * GH + h) * D4 + dv] = o[h];
                if (dv == 0u) l_sh[qv * GH + h] = l[h];
            }
        }
    }
    barrier();
    for (uint x = tid; x < GH * D4; x += WG) {
        uint h = x / D4, i = x % D4;
        vec4 a = vec4(0.0);
        float L = 0.0;
        for (uint g = 0; g < Q; g++) a += o_sh[(g * GH + h) * D4 + i], L += l_sh[g * GH + h];
        if (nc == 1u) {
            F4Buf(pc.out_ + (uint64_t(r) * pc.out_ld + (h0 + h) * D) * 4u).v[i] = a / L;
        } else {
            uint64_t pb = (uint64_t(r * pc.NH + h0 + h) * pc.n_chunks + c) * (D + 2u);
            if (i == 0u) {
                float mh = m[0]; // m[] is the same in every invocation; picked without indexing by a variable
                [[unroll]] for (uint hh = 1; hh < GHM; hh++) mh = hh == h ? m[hh] : mh;
                stfc(pc.part, pb, mh);
                stfc(pc.part, pb + 1u, L);
            }
            stfc(pc.part, pb + 2u + 4u * i, a.x);
            stfc(pc.part, pb + 3u + 4u * i, a.y);
            stfc(pc.part, pb + 4u + 4u * i, a.z);
            stfc(pc.part, pb + 5u + 4u * i, a.w);
        }
    }
    if (nc == 1u || pc.mode != 2u) return;
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        memoryBarrierBuffer(); // after the workgroup barrier: the other invocations' stores come first too
        uint old = atomicAdd(CntBuf(pc.cnt).v[r * pc.NH + h0], 1u);
        last_sh = old + 1u == nc ? 1u : 0u;
        if (old + 1u == nc) atomicExchange(CntBuf(pc.cnt).v[r * pc.NH + h0], 0u); // for the next dispatch
    }
    barrier();
    if (last_sh == 0u) return;
    memoryBarrierBuffer();
    for (uint h = 0; h < GH; h++) attn_merge(pc.part, pc.out_, pc.out_ld, r, h0 + h, pc.NH, D, pc.n_chunks, nc);
}
