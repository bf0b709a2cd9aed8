#version 450
// Attention of one query head of one row over the keys of a chunk of its span (first..pos; first = pos - W + 1 on
// sliding layers), in steps of WG keys with an online softmax. mode 0: the chunk is the whole span and the
// normalized output goes to out[r][h*D..]. mode 1 (split decode): writes the chunk's (max, sum, unnormalized out)
// to part[(r*NH + h)*n_chunks + c], to be merged by attn_combine. mode 2: mode 1, and the workgroup that stores the
// last of a (row, head)'s chunks merges them as attn_combine does (counter cnt[r*NH + h], 0 before and after; the
// partial states are stored coherently and fenced before the count, fenced again before the merge; no workgroup
// waits on another). $G3_VULKAN_FUSE=0: mode 1 and a separate attn_combine dispatch. Grid: (n_chunks, NH, rows).
// KV16: the cache holds f16 (qk_rope.comp built with KV16 writes it); offsets below count elements either way.
#define WG 64
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
shared uint merge_sh;

// mode 2, in the workgroup that stored the last chunk of (r, h): the merge of attn_combine.comp over nc chunks.
void merge(uint r, uint h, uint nc) {
    uint D = pc.D, tid = gl_LocalInvocationID.x;
    uint64_t base = uint64_t(r * pc.NH + h) * pc.n_chunks * (D + 2u);
    float M = -1.0 / 0.0;
    for (uint c = 0; c < nc; c++) M = max(M, FBufC(pc.part + (base + c * (D + 2u)) * 4u).v[0]);
    float L = 0.0;
    for (uint c = 0; c < nc; c++) {
        uint64_t pb = base + c * (D + 2u);
        L += FBufC(pc.part + (pb + 1u) * 4u).v[0] * exp(FBufC(pc.part + pb * 4u).v[0] - M);
    }
    float inv = 1.0 / L;
    for (uint d = tid; d < D; d += WG) {
        float a = 0.0;
        for (uint c = 0; c < nc; c++) {
            uint64_t pb = base + c * (D + 2u);
            a += FBufC(pc.part + (pb + 2u + d) * 4u).v[0] * exp(FBufC(pc.part + pb * 4u).v[0] - M);
        }
        stf(pc.out_, uint64_t(r) * pc.out_ld + h * D + d, a * inv);
    }
}

#ifdef KV16
// element e (f16) of the cache
float ldkv(uint64_t e) {
    uint w = UBuf(pc.kv + (e & ~uint64_t(1)) * 2u).v[0];
    return unpackHalf2x16(w >> ((uint(e) & 1u) * 16u)).x;
}
// elements 4i..4i+3 from element e0 (e0 a multiple of 4)
vec4 ldkv4(uint64_t e0, uint i) {
    uvec2 w = U2Buf(pc.kv + e0 * 2u).v[i];
    return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
}
#else
float ldkv(uint64_t e) { return ldf(pc.kv, e); }
vec4 ldkv4(uint64_t e0, uint i) { return F4Buf(pc.kv + e0 * 4u).v[i]; }
#endif

shared float q_sh[DMAX];
shared float p_sh[WG];
shared uint64_t kb_sh[WG];

void main() {
    uint c = gl_WorkGroupID.x, h = gl_WorkGroupID.y, r = gl_WorkGroupID.z, tid = gl_LocalInvocationID.x;
    if (r >= uint(prm(pc.params, P_NROWS))) return;
    uint D = pc.D;
    int pos = prm(pc.params, uint(prm(pc.params, P_POS)) + r);
    int seq = prm(pc.params, uint(prm(pc.params, P_SEQ)) + r);
    int first = pc.window > 0u ? max(0, pos - int(pc.window) + 1) : 0;
    int k0 = first + int(c * pc.chunk_len);
    if (k0 > pos) return;
    int k1 = min(pos, k0 + int(pc.chunk_len) - 1);
    uint hk = h / (pc.NH / pc.KVH);
    uint tab = uint(prm(pc.params, pc.table == 0u ? P_BTG : P_BTL)) + uint(seq) * uint(prm(pc.params, P_BPS));
    uint64_t qoff = uint64_t(r) * pc.ld + h * D;
    for (uint i = tid; i < D; i += WG) q_sh[i] = ldf(pc.q, qoff + i);
    uint64_t head_off = uint64_t((pc.li * 2u) * pc.KVH + hk) * pc.B * D; // K of (layer, kv head) in a block
    uint64_t vshift = uint64_t(pc.KVH) * pc.B * D;                       // V follows K
    float o[DMAX / WG];
    [[unroll]] for (uint j = 0; j < DMAX / WG; j++) o[j] = 0.0;
    float m = -1.0 / 0.0, l = 0.0;
    barrier();
    for (int kb = k0; kb <= k1; kb += WG) {
        int kp = kb + int(tid);
        bool valid = kp <= k1;
        float s = -1.0 / 0.0;
        if (valid) {
            int blk = prm(pc.params, tab + uint(kp) / pc.B);
            uint64_t kbase = uint64_t(blk) * pc.block_floats + head_off + uint64_t(uint(kp) % pc.B) * D;
            kb_sh[tid] = kbase;
            float acc = 0.0;
            for (uint d = 0; d < D / 4u; d++) {
                vec4 kv4 = ldkv4(kbase, d);
                acc += q_sh[4u * d] * kv4.x + q_sh[4u * d + 1u] * kv4.y + q_sh[4u * d + 2u] * kv4.z +
                       q_sh[4u * d + 3u] * kv4.w;
            }
            s = softcap(acc * pc.scale, pc.cap);
        }
        float mx = wg_max(s);
        float m_new = max(m, mx);
        float p = valid ? exp(s - m_new) : 0.0;
        p_sh[tid] = p;
        float corr = exp(m - m_new);
        l = l * corr + wg_sum(p);
        barrier();
        int nk = min(int(WG), k1 - kb + 1);
        [[unroll]] for (uint j = 0; j < DMAX / WG; j++) {
            uint d = tid + j * WG;
            if (d < D) {
                float a = o[j] * corr;
                for (int t = 0; t < nk; t++) a += p_sh[t] * ldkv(kb_sh[t] + vshift + d);
                o[j] = a;
            }
        }
        m = m_new;
        barrier();
    }
    if (pc.mode == 0u) {
        float inv = 1.0 / l;
        [[unroll]] for (uint j = 0; j < DMAX / WG; j++) {
            uint d = tid + j * WG;
            if (d < D) stf(pc.out_, uint64_t(r) * pc.out_ld + h * D + d, o[j] * inv);
        }
    } else {
        uint64_t pb = (uint64_t(r * pc.NH + h) * pc.n_chunks + c) * (D + 2u);
        if (tid == 0u) {
            stfc(pc.part, pb, m);
            stfc(pc.part, pb + 1u, l);
        }
        [[unroll]] for (uint j = 0; j < DMAX / WG; j++) {
            uint d = tid + j * WG;
            if (d < D) stfc(pc.part, pb + 2u + d, o[j]);
        }
        if (pc.mode == 2u) {
            uint nc = (uint(pos - first) + pc.chunk_len) / pc.chunk_len; // chunks holding keys (as attn_combine)
            memoryBarrierBuffer();
            barrier();
            if (tid == 0u) {
                memoryBarrierBuffer(); // after the workgroup barrier: the other invocations' stores come first too
                uint old = atomicAdd(CntBuf(pc.cnt).v[r * pc.NH + h], 1u);
                merge_sh = old + 1u == nc ? 1u : 0u;
                if (old + 1u == nc) atomicExchange(CntBuf(pc.cnt).v[r * pc.NH + h], 0u); // for the next dispatch
            }
            barrier();
            if (merge_sh != 0u) {
                memoryBarrierBuffer();
                merge(r, h, nc);
            }
        }
    }
}
