#version 450
// Y[m][n] = X[m][k] * W[n][k]^T for many activation rows (prefill, large batches): 64x64 output tiles, K in steps
// of 32, weights dequantized into shared memory once per tile, f32 accumulation, 4x4 outputs per thread.
// With GEGLU, tile columns alternate gate / up rows of the same 32 channels and the result is gelu(gate) * up.
#define WG 256
#define TM 64
#define TN 64
#define TK 32
layout(local_size_x = WG) in;
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform PC {
    uint64_t w, waux, w2, w2aux, x, y, params;
    uint N, K, ldx, ldy, nrows_idx, mode;
    float cap;
} pc;

shared float Xs[TK][TM + 4];
shared float Ws[TK][TN + 4];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint nr = uint(prm(pc.params, pc.nrows_idx));
    uint m0 = gl_WorkGroupID.y * TM;
    if (m0 >= nr) return;
#ifdef GEGLU
    uint n0 = gl_WorkGroupID.x * (TN / 2); // channels n0 .. n0+31; tile column c: channel n0 + c/2, gate if c even
#else
    uint n0 = gl_WorkGroupID.x * TN;
#endif
    uint tx = tid % 16u, ty = tid / 16u;
    float acc[4][4];
    [[unroll]] for (uint i = 0; i < 4; i++)
        [[unroll]] for (uint j = 0; j < 4; j++) acc[i][j] = 0.0;

    for (uint k0 = 0; k0 < pc.K; k0 += TK) {
        if (tid < 128u) { // weights: tile column c, half h (16 values)
            uint c = tid >> 1, h = tid & 1u;
            float v[16];
#ifdef GEGLU
            uint ch = n0 + (c >> 1);
            if (ch < pc.N) {
                if ((c & 1u) == 0u) dq16(pc.w, pc.waux, ch, pc.K, k0 / 16u + h, v);
                else dq16(pc.w2, pc.w2aux, ch, pc.K, k0 / 16u + h, v);
            } else {
                [[unroll]] for (uint i = 0; i < 16; i++) v[i] = 0.0;
            }
#else
            uint ch = n0 + c;
            if (ch < pc.N) dq16(pc.w, pc.waux, ch, pc.K, k0 / 16u + h, v);
            else [[unroll]] for (uint i = 0; i < 16; i++) v[i] = 0.0;
#endif
            [[unroll]] for (uint i = 0; i < 16; i++) Ws[16u * h + i][c] = v[i];
        } else { // activations: row r, half h
            uint t = tid - 128u, r = t >> 1, h = t & 1u;
            if (m0 + r < nr) {
                F4Buf xp = F4Buf(pc.x + (uint64_t(m0 + r) * pc.ldx + k0 + 16u * h) * 4u);
                [[unroll]] for (uint i = 0; i < 4; i++) {
                    vec4 a = xp.v[i];
                    Xs[16u * h + 4u * i][r] = a.x, Xs[16u * h + 4u * i + 1u][r] = a.y;
                    Xs[16u * h + 4u * i + 2u][r] = a.z, Xs[16u * h + 4u * i + 3u][r] = a.w;
                }
            } else {
                [[unroll]] for (uint i = 0; i < 16; i++) Xs[16u * h + i][r] = 0.0;
            }
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < TK; kk++) {
            vec4 a = vec4(Xs[kk][4u * ty], Xs[kk][4u * ty + 1u], Xs[kk][4u * ty + 2u], Xs[kk][4u * ty + 3u]);
            vec4 b = vec4(Ws[kk][4u * tx], Ws[kk][4u * tx + 1u], Ws[kk][4u * tx + 2u], Ws[kk][4u * tx + 3u]);
            [[unroll]] for (uint i = 0; i < 4; i++) {
                acc[i][0] += a[i] * b[0];
                acc[i][1] += a[i] * b[1];
                acc[i][2] += a[i] * b[2];
                acc[i][3] += a[i] * b[3];
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0; i < 4; i++) {
        uint r = m0 + 4u * ty + i;
        if (r >= nr) continue;
#ifdef GEGLU
        [[unroll]] for (uint j = 0; j < 2; j++) {
            uint ch = n0 + 2u * tx + j;
            if (ch < pc.N) stf(pc.y, uint64_t(r) * pc.ldy + ch, gelu_tanh(acc[i][2u * j]) * acc[i][2u * j + 1u]);
        }
#else
        [[unroll]] for (uint j = 0; j < 4; j++) {
            uint ch = n0 + 4u * tx + j;
            if (ch < pc.N) stf(pc.y, uint64_t(r) * pc.ldy + ch, pc.mode == 1u ? softcap(acc[i][j], pc.cap) : acc[i][j]);
        }
#endif
    }
}
