// Shared declarations of the compute shaders: buffer references (every buffer is reached through its device
// address, passed in push constants), workgroup reductions (subgroup operations when G3_SG is 1, shared memory
// otherwise), the accurate sin/cos/tanh used by rope, GELU and softcaps, and the per-step parameter block.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_control_flow_attributes : require
#if G3_SG
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

layout(buffer_reference, std430, buffer_reference_align = 4) buffer FBuf { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer FBufC { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer F4Buf { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer IBuf { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer IBufW { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer UBuf { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer U2Buf { uvec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer U4Buf { uvec4 v[]; };

// Per-step parameter block (int32, host-visible; layout in vk_internal.h):
//   [0] n_rows  [1] rows in this logits chunk  [2] first output row of the chunk
//   [4] offset of token[]  [5] pos[]  [6] seq[]  [7] out_rows[]  [8] global block tables  [9] local block tables
//   [10] block-table width (blocks per sequence)
#define P_NROWS 0
#define P_NOUT 1
#define P_OUTBASE 2
#define P_TOK 4
#define P_POS 5
#define P_SEQ 6
#define P_OUT 7
#define P_BTG 8
#define P_BTL 9
#define P_BPS 10

int prm(uint64_t params, uint i) { return IBuf(params).v[i]; }
// float element idx of an array at base (64-bit element index)
float ldf(uint64_t base, uint64_t idx) { return FBuf(base + idx * 4u).v[0]; }
void stf(uint64_t base, uint64_t idx, float v) { FBuf(base + idx * 4u).v[0] = v; }
// coherent store: visible to other workgroups of the same dispatch after a memoryBarrierBuffer (tail_norm.glsl)
void stfc(uint64_t base, uint64_t idx, float v) { FBufC(base + idx * 4u).v[0] = v; }

// ---- reductions over the workgroup (WG threads, 1-D) -----------------------------------------------------------
// wg_sum/wg_max: every thread gets the result. Callers keep control flow uniform.
#if G3_SG
shared float red_sh[WG];
float wg_sum(float v) {
    v = subgroupAdd(v);
    if (gl_NumSubgroups == 1) return v;
    barrier();
    if (subgroupElect()) red_sh[gl_SubgroupID] = v;
    barrier();
    float s = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) s += red_sh[i];
    return s;
}
float wg_max(float v) {
    v = subgroupMax(v);
    if (gl_NumSubgroups == 1) return v;
    barrier();
    if (subgroupElect()) red_sh[gl_SubgroupID] = v;
    barrier();
    float s = red_sh[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) s = max(s, red_sh[i]);
    return s;
}
#else
shared float red_sh[WG];
float wg_sum(float v) {
    barrier();
    red_sh[gl_LocalInvocationID.x] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (gl_LocalInvocationID.x < s) red_sh[gl_LocalInvocationID.x] += red_sh[gl_LocalInvocationID.x + s];
        barrier();
    }
    return red_sh[0];
}
float wg_max(float v) {
    barrier();
    red_sh[gl_LocalInvocationID.x] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (gl_LocalInvocationID.x < s)
            red_sh[gl_LocalInvocationID.x] = max(red_sh[gl_LocalInvocationID.x], red_sh[gl_LocalInvocationID.x + s]);
        barrier();
    }
    return red_sh[0];
}
#endif

// ---- accurate elementary functions ------------------------------------------------------------------------------
// Vulkan only bounds sin/cos inside [-pi, pi] (and loosely); rope angles reach pos * 1 rad. Cody-Waite reduction by
// pi/2 with 7-bit parts (k * part is exact for k < 2^17, and each subtraction is exact by Sterbenz), then the
// cephes single-precision polynomials on [-pi/4, pi/4]: about 1e-7 absolute error for angles up to 1e5.
void sincos_acc(float a, out float s, out float c) {
    precise float k = round(a * 0.636619772f);
    precise float r = a - k * 1.5625f;
    r = r - k * 0.0081787109375f;
    r = r - k * 0.00011730194091796875f;
    r = r - k * 3.1391647326017846e-07f;
    float z = r * r;
    float sn = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
    float cs = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z - 0.5f * z + 1.0f;
    int q = int(k) & 3;
    if (q == 0) { s = sn; c = cs; }
    else if (q == 1) { s = cs; c = -sn; }
    else if (q == 2) { s = -sn; c = -cs; }
    else { s = -cs; c = sn; }
}

// tanh through exp (some drivers lower tanh to a coarse approximation).
float tanh_acc(float u) {
    if (abs(u) < 0.0005f) return u;
    float e = exp(2.0f * u);
    return 1.0f - 2.0f / (e + 1.0f);
}

float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanh_acc(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

float softcap(float v, float cap) { return cap > 0.0f ? cap * tanh_acc(v / cap) : v; }
