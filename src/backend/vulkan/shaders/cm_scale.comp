#version 450
// The row scaling of the cooperative-matrix products (matmul_cm.comp): per activation row r of x [rows][ldx] (K
// values), the exponent e[r] = E - 13 where 2^E <= max_i |x[r][i]| < 2^(E+1), so that x[r] * 2^-e[r] has its largest
// value in [2^13, 2^14): well inside f16 (65504: the overflow guard), and small rows' values far above f16's
// subnormals (below 2^-14; drivers may flush them). matmul_cm rounds x * 2^-e to f16 and multiplies its f32 sums by
// 2^e (exact) before the epilogue. e is an int stored as its uint bits, clamped to [-126, 126] (zero rows: -126; inf / NaN rows:
// their results are inf / NaN either way). One workgroup per row (grid: rows of the bucket); rows past the step's row
// count return at once. K % 4 == 0.
#define WG 128
layout(local_size_x = WG) in;
#include "common.glsl"

layout(push_constant) uniform PC {
    uint64_t x, e, params;
    uint K, ldx, nrows_idx;
} pc;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer UBufW { uint v[]; };

void main() {
    uint r = gl_WorkGroupID.x;
    if (r >= uint(prm(pc.params, pc.nrows_idx))) return;
    F4Buf xr = F4Buf(pc.x + uint64_t(r) * pc.ldx * 4u);
    vec4 m = vec4(0.0);
    for (uint i = gl_LocalInvocationID.x; i < pc.K / 4u; i += WG) m = max(m, abs(xr.v[i]));
    float mx = wg_max(max(max(m.x, m.y), max(m.z, m.w)));
    if (gl_LocalInvocationID.x == 0u) {
        int E = int(floatBitsToUint(mx) >> 23) - 127; // mx >= 0: the sign bit is clear
        UBufW(pc.e).v[r] = uint(clamp(E - 13, -126, 126));
    }
}
