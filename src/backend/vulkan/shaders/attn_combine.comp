#version 450
// Merges the split-attention chunks of one (row, head): out = sum_c o_c * exp(m_c - M) / sum_c l_c * exp(m_c - M)
// (attn_merge.glsl: chunk maxima and sums read by one invocation each, reduced over the workgroup, then each
// invocation adds its output dims over the chunks with 8 loads in flight). A span that fit one chunk was written by
// attn.comp already: nothing to do. Grid: (NH, rows).
#define WG 64
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t out_, part, params;
    uint NH, D, window, chunk_len, n_chunks, out_ld; // chunk_len: attn.comp's tile T
} pc;
#include "attn_merge.glsl"

void main() {
    uint h = gl_WorkGroupID.x, r = gl_WorkGroupID.y;
    if (r >= uint(prm(pc.params, P_NROWS))) return;
    int pos = prm(pc.params, uint(prm(pc.params, P_POS)) + r);
    int first = pc.window > 0u ? max(0, pos - int(pc.window) + 1) : 0;
    uint CL, nc = attn_chunks(uint(pos - first + 1), pc.chunk_len, pc.n_chunks, CL);
    if (nc <= 1u) return;
    attn_merge(pc.part, pc.out_, pc.out_ld, r, h, pc.NH, pc.D, pc.n_chunks, nc);
}
