// Split decode attention, shared by attn.comp and attn_combine.comp: how a row's span is cut into chunks, and the
// merge of a (row, head)'s chunk partials. Needs WG (threads, >= the grid's n_chunks), common.glsl's wg_max/wg_sum.
// Partials: part[(r*NH + h)*n_chunks + c][D + 2] = (max score, sum of exp, unnormalized output[D]) of chunk c.

// Chunks of a span of `span` keys over a grid of n_chunks chunks of tiles of T keys: CL keys each, the smallest
// multiple of T with n_chunks * CL >= span (a short span gets one-tile chunks, i.e. as many workgroups as tiles);
// returns how many chunks hold keys (the rest of the grid exits). n_chunks == 1: one chunk, the whole span.
uint attn_chunks(uint span, uint T, uint n_chunks, out uint CL) {
    if (n_chunks <= 1u) {
        CL = span;
        return 1u;
    }
    uint per = (span + n_chunks - 1u) / n_chunks;
    CL = (per + T - 1u) / T * T;
    return (span + CL - 1u) / CL;
}

float ldfc(uint64_t base, uint64_t idx) { return FBufC(base + idx * 4u).v[0]; }

shared float mw_sh[WG]; // per-chunk weights exp(m_c - M) / L

// out[r][h*D .. +D] = sum_c o_c * exp(m_c - M) / sum_c l_c * exp(m_c - M) over the nc chunks (nc <= WG). Called by
// every invocation (uniform control flow); reads the partials coherently (attn.comp's fused merge reads what other
// workgroups of the same dispatch stored). The chunk loop keeps 8 loads in flight per invocation.
void attn_merge(uint64_t part, uint64_t out_, uint out_ld, uint r, uint h, uint NH, uint D, uint n_chunks, uint nc) {
    uint tid = gl_LocalInvocationID.x;
    uint64_t base = uint64_t(r * NH + h) * n_chunks * (D + 2u);
    float mc = -1.0 / 0.0, lc = 0.0;
    if (tid < nc) {
        mc = ldfc(part, base + uint64_t(tid) * (D + 2u));
        lc = ldfc(part, base + uint64_t(tid) * (D + 2u) + 1u);
    }
    float M = wg_max(mc);
    float w = tid < nc ? exp(mc - M) : 0.0;
    float L = wg_sum(w * lc);
    barrier(); // mw_sh of the previous call read by everyone
    if (tid < nc) mw_sh[tid] = w / L;
    barrier();
    for (uint d = tid; d < D; d += WG) {
        float a = 0.0;
        for (uint c0 = 0; c0 < nc; c0 += 8u) {
            [[unroll]] for (uint u = 0; u < 8u; u++) {
                uint c = c0 + u;
                if (c < nc) a += mw_sh[c] * ldfc(part, base + uint64_t(c) * (D + 2u) + 2u + d);
            }
        }
        stf(out_, uint64_t(r) * out_ld + h * D + d, a);
    }
}
