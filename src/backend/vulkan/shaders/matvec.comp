#version 450
// y[r][c] = sum_k x[r][k] * W[c][k] for up to RMAX activation rows (decode): a workgroup computes NR output
// channels for every row, so each weight value is read once per step. With GEGLU, the workgroup computes channel c
// of the gate (W) and of the up (W2) projection and stores gelu(gate) * up. mode 1 applies a softcap (logits); mode 2
// ends with the post-norm tail (tail_norm.glsl).
#define WG 64
#define RMAX 8
#define NR 2
layout(local_size_x = WG) in;
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform PC {
    uint64_t w, waux, w2, w2aux, x, y, params;
    uint N, K, ldx, ldy, nrows_idx, mode;
    float cap;
    uint64_t h, xo, cnt; // mode 2 (tail_norm.glsl)
} pc;
#ifndef GEGLU
#include "tail_norm.glsl"
#endif

#define NV (NR * RMAX)
shared float part_sh[NV][WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
#ifdef GEGLU
    uint c0 = wg;
#else
    uint c0 = wg * NR;
#endif
    if (c0 >= pc.N) return;
    uint nr = uint(prm(pc.params, pc.nrows_idx));
    if (nr > RMAX) nr = RMAX;
    float acc[NR][RMAX];
    [[unroll]] for (uint a = 0; a < NR; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++) acc[a][r] = 0.0;
    uint units = pc.K / 16u;
    for (uint u = tid; u < units; u += WG) {
        float wv[NR][16];
        [[unroll]] for (uint a = 0; a < NR; a++) {
#ifdef GEGLU
            if (a == 0) dq16(pc.w, pc.waux, c0, pc.K, u, wv[a]);
            else dq16(pc.w2, pc.w2aux, c0, pc.K, u, wv[a]);
#else
            if (c0 + a < pc.N) dq16(pc.w, pc.waux, c0 + a, pc.K, u, wv[a]);
            else [[unroll]] for (uint i = 0; i < 16; i++) wv[a][i] = 0.0;
#endif
        }
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) {
                F4Buf xp = F4Buf(pc.x + (uint64_t(r) * pc.ldx + 16u * u) * 4u);
                vec4 x0 = xp.v[0], x1 = xp.v[1], x2 = xp.v[2], x3 = xp.v[3];
                [[unroll]] for (uint a = 0; a < NR; a++) {
                    float s = acc[a][r];
                    s += dot(x0, vec4(wv[a][0], wv[a][1], wv[a][2], wv[a][3]));
                    s += dot(x1, vec4(wv[a][4], wv[a][5], wv[a][6], wv[a][7]));
                    s += dot(x2, vec4(wv[a][8], wv[a][9], wv[a][10], wv[a][11]));
                    s += dot(x3, vec4(wv[a][12], wv[a][13], wv[a][14], wv[a][15]));
                    acc[a][r] = s;
                }
            }
        }
    }
    // reduce the NV partial sums over the workgroup
#if G3_SG
    [[unroll]] for (uint a = 0; a < NR; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) { // nr is uniform: only the rows in use pay for a reduction
                float s = subgroupAdd(acc[a][r]);
                if (subgroupElect()) part_sh[a * RMAX + r][gl_SubgroupID] = s;
            }
        }
    barrier();
    uint nparts = gl_NumSubgroups;
#else
    [[unroll]] for (uint a = 0; a < NR; a++)
        [[unroll]] for (uint r = 0; r < RMAX; r++)
            if (r < nr) part_sh[a * RMAX + r][tid] = acc[a][r];
    barrier();
    uint nparts = WG;
#endif
    if (tid < RMAX && tid < nr) {
        uint r = tid;
        float v[NR];
        [[unroll]] for (uint a = 0; a < NR; a++) {
            float s = 0.0;
            for (uint i = 0; i < nparts; i++) s += part_sh[a * RMAX + r][i];
            v[a] = s;
        }
#ifdef GEGLU
        stf(pc.y, uint64_t(r) * pc.ldy + c0, gelu_tanh(v[0]) * v[1]);
#else
        [[unroll]] for (uint a = 0; a < NR; a++)
            if (c0 + a < pc.N) stfc(pc.y, uint64_t(r) * pc.ldy + c0 + a, pc.mode == 1u ? softcap(v[a], pc.cap) : v[a]);
#endif
    }
#ifndef GEGLU
    if (pc.mode == 2u) tail_add_norm(nr, (pc.N + NR - 1u) / NR);
#endif
}
