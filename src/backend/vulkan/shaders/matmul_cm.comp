#version 450
// Y[m][n] = X[m][k] * W[n][k]^T on tensor cores through GL_NV_cooperative_matrix: same tiles and grid as matmul.comp
// (64x64 outputs, K in steps of 32, K % 32 == 0; GEGLU: tile columns alternate gate / up rows of 32 channels), but the
// weight tile is dequantized to f16 and the activation tile rounded to f16 in shared memory, and each of the 4
// subgroups (32 invocations) multiplies 2x2 fragments of 16x16x16 with f32 accumulation. Built only with subgroups.
// Taken for GGUF block weights only (Q8_0, Q4_0, Q4_K, Q6_K: their d * q rounded to 11 bits, 2^-12 relative, far
// below their quantization error): measured on the H200, these products come out ~8e-5 of sum |x w| from the float64
// reference even with f16 weights and the activations split into two f16 halves (the tensor-core sums are not
// float32-exact), which puts float checkpoints' logits ~2e-3 from the references, past the float parity bound of 1e-3:
// f32 / f16 / bf16 weights stay on the portable kernel.
// Row scaling: row r of X is multiplied by 2^-e[r] (pc.sc, written by cm_scale.comp: the row's largest |x| lands in
// [2^13, 2^14), which guards against f16 overflow and keeps small rows out of f16's subnormals) before its rounding
// to f16, and its f32 sums by 2^e before the epilogue (softcap, GeGLU); both exact. Weights need no guard: Q8_0 / Q4_0 values d * q have |q| <= 127 and an f16 scale d, so they
// leave f16 only for d > 515 (no real model's); F16 weights are f16 already; F32 / BF16 / K-quant weights beyond
// 65504 would overflow (none in Gemma checkpoints).
// Runs through VK_NV_cooperative_matrix (NVIDIA) and, rewritten at build time by tools/spv_coopmat_khr.c into
// SPV_KHR_cooperative_matrix (matmul_cmk*: Debian 12's glslc cannot compile GL_KHR_cooperative_matrix), through
// VK_KHR_cooperative_matrix (AMD RDNA3, NVIDIA, ...). Subgroups of 32 (4 per workgroup): the host takes this kernel only
// where the device's compute subgroups are 32 or can be asked to be (VK_EXT_subgroup_size_control).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define WG 128
#define TM 64
#define TN 64
#define TK 32
#define SK (TK + 8) // f16 row stride of the tiles: 80 bytes (16-byte aligned rows, fewer bank conflicts)
layout(local_size_x = WG) in;
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform PC {
    uint64_t w, waux, w2, w2aux, x, y, params;
    uint N, K, ldx, ldy, nrows_idx, mode;
    float cap;
    uint64_t h, xo, cnt; // unused here (matvec tails)
    uint64_t sc;         // [rows] uint exponents of the overflow guard (cm_scale.comp)
} pc;

#define MATA fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MATC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

shared float16_t Xs[TM * SK]; // [row][k]
shared float16_t Ws[TN * SK]; // [tile column][k]
shared float Os[TM * TN];     // [row][tile column]

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint nr = uint(prm(pc.params, pc.nrows_idx));
    uint m0 = gl_WorkGroupID.y * TM;
    if (m0 >= nr) return;
#ifdef GEGLU
    uint n0 = gl_WorkGroupID.x * (TN / 2);
#else
    uint n0 = gl_WorkGroupID.x * TN;
#endif
    uint sg = gl_SubgroupID; // 4 subgroups of 32: each 2x2 fragments of the 64x64 tile
    uint mb = (sg >> 1) * 32u, nb = (sg & 1u) * 32u;
    MATC acc[2][2];
    [[unroll]] for (uint i = 0; i < 2; i++)
        [[unroll]] for (uint j = 0; j < 2; j++) acc[i][j] = MATC(0.0);
    uint c = tid >> 1, h = tid & 1u; // loads: tile column / row c, half h (16 values)
    int ex = m0 + c < nr ? int(UBuf(pc.sc).v[m0 + c]) : 0; // row c's scale exponent, in [-126, 126]
    float down = uintBitsToFloat(uint(127 - ex) << 23);       // 2^-ex
    for (uint k0 = 0; k0 < pc.K; k0 += TK) {
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
        [[unroll]] for (uint i = 0; i < 16; i++) Ws[c * SK + 16u * h + i] = float16_t(v[i]);
        if (m0 + c < nr) {
            F4Buf xp = F4Buf(pc.x + (uint64_t(m0 + c) * pc.ldx + k0 + 16u * h) * 4u);
            [[unroll]] for (uint i = 0; i < 4; i++) {
                f16vec4 a = f16vec4(xp.v[i] * down);
                uint o = c * SK + 16u * h + 4u * i;
                Xs[o] = a.x, Xs[o + 1u] = a.y, Xs[o + 2u] = a.z, Xs[o + 3u] = a.w;
            }
        } else {
            [[unroll]] for (uint i = 0; i < 16; i++) Xs[c * SK + 16u * h + i] = float16_t(0.0);
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < TK; kk += 16u) {
            MATA a[2], b[2];
            [[unroll]] for (uint i = 0; i < 2; i++) coopMatLoadNV(a[i], Xs, (mb + 16u * i) * SK + kk, SK, false);
            [[unroll]] for (uint j = 0; j < 2; j++) coopMatLoadNV(b[j], Ws, (nb + 16u * j) * SK + kk, SK, true);
            [[unroll]] for (uint i = 0; i < 2; i++)
                [[unroll]] for (uint j = 0; j < 2; j++) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
        }
        barrier();
    }
    [[unroll]] for (uint i = 0; i < 2; i++)
        [[unroll]] for (uint j = 0; j < 2; j++)
            coopMatStoreNV(acc[i][j], Os, (mb + 16u * i) * TN + nb + 16u * j, TN, false);
    barrier();
    uint r = m0 + c; // thread: row c, tile columns 32h .. 32h+31
    if (r < nr) {
        float up = uintBitsToFloat(uint(127 + ex) << 23); // 2^ex
#ifdef GEGLU
        [[unroll]] for (uint j = 0; j < 32; j += 2) {
            uint col = 32u * h + j, chn = n0 + (col >> 1);
            float g = Os[c * TN + col] * up, u = Os[c * TN + col + 1u] * up;
            if (chn < pc.N) stf(pc.y, uint64_t(r) * pc.ldy + chn, gelu_tanh(g) * u);
        }
#else
        [[unroll]] for (uint j = 0; j < 32; j++) {
            uint col = 32u * h + j, chn = n0 + col;
            float o = Os[c * TN + col] * up;
            if (chn < pc.N) stf(pc.y, uint64_t(r) * pc.ldy + chn, pc.mode == 1u ? softcap(o, pc.cap) : o);
        }
#endif
    }
}
