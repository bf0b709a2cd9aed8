// Fused post-norm tail of the decode products (matvec.comp, matvec1.comp; mode 2): the workgroup that finishes last
// applies, for every row r < nr, what add_norm.comp does in a dispatch of its own:
//   h += rms(t) * w1 (post-attention / post-FFN norm and residual), then x = rms(h) * w2 (the next norm),
// where t = y, the product just computed (ldy = H = N). One dispatch and one barrier less per use.
// Push constants reused in mode 2: w2 = w1 (post norm), w2aux = w2 (next norm), cap = eps; h, xo, cnt: residual,
// normed output, and a counter that is 0 before the dispatch and is left 0 after it (reset by the last workgroup).
// Ordering: each workgroup's y stores are coherent and fenced (memoryBarrierBuffer) before its atomic increment; the
// last one fences again before reading y. No workgroup waits on another (no forward-progress assumption).
// Needs H % 4 == 0 (vec4 accesses; the host falls back to add_norm.comp otherwise).
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CntBuf { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer F4BufC { vec4 v[]; };
shared uint tail_last;

// Called by every invocation of a workgroup that has stored its outputs (uniform control flow); `groups`: the number
// of workgroups that store outputs (those past N return before).
void tail_add_norm(uint nr, uint groups) {
    memoryBarrierBuffer();
    barrier();
    uint tid = gl_LocalInvocationID.x;
    if (tid == 0u) {
        memoryBarrierBuffer(); // after the workgroup barrier: the other invocations' stores come first too
        uint old = atomicAdd(CntBuf(pc.cnt).v[0], 1u);
        tail_last = old + 1u == groups ? 1u : 0u;
        if (old + 1u == groups) atomicExchange(CntBuf(pc.cnt).v[0], 0u); // ready for the next dispatch
    }
    barrier();
    if (tail_last == 0u) return;
    memoryBarrierBuffer();
    uint H = pc.N, n4 = H / 4u;
    float eps = pc.cap;
    float ss[RMAX];
    [[unroll]] for (uint r = 0; r < RMAX; r++) ss[r] = 0.0;
    for (uint i = tid; i < n4; i += WG) {
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) {
                vec4 a = F4BufC(pc.y + uint64_t(r) * pc.ldy * 4u).v[i];
                ss[r] += dot(a, a);
            }
        }
    }
    [[unroll]] for (uint r = 0; r < RMAX; r++)
        if (r < nr) ss[r] = 1.0 / sqrt(wg_sum(ss[r]) / float(H) + eps); // nr is uniform
    float ss2[RMAX];
    [[unroll]] for (uint r = 0; r < RMAX; r++) ss2[r] = 0.0;
    for (uint i = tid; i < n4; i += WG) {
        vec4 w1 = F4Buf(pc.w2).v[i];
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) {
                uint64_t ro = uint64_t(r) * H * 4u;
                vec4 t = F4BufC(pc.y + uint64_t(r) * pc.ldy * 4u).v[i];
                vec4 hn = F4Buf(pc.h + ro).v[i] + t * ss[r] * w1;
                F4Buf(pc.h + ro).v[i] = hn;
                ss2[r] += dot(hn, hn);
            }
        }
    }
    [[unroll]] for (uint r = 0; r < RMAX; r++)
        if (r < nr) ss2[r] = 1.0 / sqrt(wg_sum(ss2[r]) / float(H) + eps);
    for (uint i = tid; i < n4; i += WG) {
        vec4 w2 = F4Buf(pc.w2aux).v[i];
        [[unroll]] for (uint r = 0; r < RMAX; r++) {
            if (r < nr) {
                uint64_t ro = uint64_t(r) * H * 4u;
                F4Buf(pc.xo + ro).v[i] = F4Buf(pc.h + ro).v[i] * ss2[r] * w2;
            }
        }
    }
}
