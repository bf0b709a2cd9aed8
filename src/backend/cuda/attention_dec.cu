/* Decode attention, second version (g3c_attention takes it where g3c_attn2_supported, unless $G3_CUDA_ATTN2=0):
 * short, load-first key walks spread over a thread-block cluster per (row, kv head), merged through distributed
 * shared memory instead of a second pass over global partials.
 *
 * grid (NKV, m, C), cluster (1, 1, C), 128 threads (4 warps): the C * 4 warps of a (row, kv head) take the row's
 * visible keys in groups of NKW consecutive keys, group i going to warp i mod 4C. A warp looks up the cache slots of
 * its NKW keys (one block-table read per lane), issues every K and V load of the group at once (each lane holds
 * EPL = D/32 consecutive values of a row; of a bf16 cache as loaded, two to a register, turned into floats where
 * used; $G3_CUDA_ATTN2_KPR=2: groups of twice the keys in the same registers), then computes the G x NKW scores
 * (GQA: the G query heads of the kv head share each K/V read), sums them over the lanes by halving exchanges (so each
 * lane ends with one score and the softmax's scaling, masks and exponential run once a lane: the group loop's sm_90a
 * SASS 1577 -> 769 instructions at 27B's shape; H200 session 27 run 02, A/B/A/B against the full shuffle sums of
 * every score in every lane: 27B int8 64 / 128 seqs 5612-5641 / 6559-6578 against 5557-5595 / 6492-6502 tok/s, 1B
 * int8 64 seqs 35724-35829 against 32434-32710, one row 1151-1159 against 1115-1124, 4B the same; CUPTI at 27B, 64
 * rows: 17.3 against 18.6 us a layer) and updates its float32 online softmax. The 4 warps merge in shared memory
 * (one barrier), the C blocks through distributed shared memory (cluster barriers), and the threads of the cluster
 * normalize and write o and its bf16 copy, or (a.tq_x, 9..64-row steps whose o product takes int8 activations) each
 * warp merges a block of 128 outputs, 4 a lane, and writes it quantized for that product (tq_act.cuh), so that the
 * product needs no quantization launch (H200 session 28 run 01, 27B int8 64 seqs: 5802-5787 against 5672-5684 tok/s
 * with $G3_CUDA_ATTNTQ=0). No counters, no partials in global memory, one launch.
 *
 * Rows are read from device memory (position, sequence, block table), so graphs replay it; padding rows (useq < 0)
 * write zeros. Cache layout as in attention.cu; float32 or bf16 elements (a.kv16). */
#include <cooperative_groups.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attention_o.cuh"
#include "backend/cuda/attn_oproj.cuh"
#include "backend/cuda/tq_act.cuh"

namespace cg = cooperative_groups;


/* EPL consecutive floats into registers, by one of three loads: A2_NC read-only cache (__ldg: the cache and q,
 * written before this kernel started), A2_PLAIN (y, which this kernel also writes when fused), A2_CG from L2 past any
 * L1 copy (a key re-read after the launch wait: L1 may hold the line of the load before it) */
enum { A2_NC, A2_PLAIN, A2_CG };
template <int MODE, typename T> __device__ __forceinline__ T a2_ld1(const T *p) {
    if constexpr (MODE == A2_NC) return __ldg(p);
    else if constexpr (MODE == A2_CG) return __ldcg(p);
    else return *p;
}
template <int EPL, int MODE = A2_NC> __device__ __forceinline__ void a2_ld(float (&v)[EPL], const float *p) {
    if constexpr (EPL == 2) {
        const float2 t = a2_ld1<MODE>((const float2 *)p);
        v[0] = t.x, v[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < EPL / 4; i++) {
            const float4 t = a2_ld1<MODE>((const float4 *)p + i);
            v[4 * i] = t.x, v[4 * i + 1] = t.y, v[4 * i + 2] = t.z, v[4 * i + 3] = t.w;
        }
    }
}

/* p ? a : b on registers (a plain conditional of two elements of a register array becomes a load from a selected
 * address, which puts the array in local memory) */
__device__ __forceinline__ float a2_sel(bool p, float a, float b) {
    float r;
    asm("{\n.reg .pred q;\nsetp.ne.u32 q, %1, 0;\nselp.f32 %0, %2, %3, q;\n}"
        : "=f"(r)
        : "r"((unsigned)p), "f"(a), "f"(b));
    return r;
}

/* Fused: one head of the product output (the ny slices, stride sl, at y + base) RMS-normalized with weights w and
 * rotated for position p; lane holds values d = lane*EPL + e, whose RoPE partner d +- D/2 is value e of lane ^ 16. */
template <int EPL>
__device__ __forceinline__ void a2_norm_rope(const float *y, int ny, size_t sl, size_t base, const float *w,
                                             const float *inv_freq, int p, float eps, int lane, float (&out)[EPL]) {
    constexpr int D = 32 * EPL, half = D / 2;
    float v[EPL], wv[EPL], ss = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; e++) v[e] = 0.f;
    for (int j = 0; j < ny; j++) {
        float t[EPL];
        a2_ld<EPL, A2_PLAIN>(t, y + j * sl + base + lane * EPL);
#pragma unroll
        for (int e = 0; e < EPL; e++) v[e] += t[e];
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) ss += v[e] * v[e];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(ss / (float)D + eps);
    a2_ld<EPL>(wv, w + lane * EPL);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const float x = v[e] * inv * wv[e], xp = __shfl_xor_sync(0xffffffffu, x, 16);
        const int d = lane * EPL + e, i = d < half ? d : d - half;
        const float ang = (float)p * inv_freq[i], c = cosf(ang), sn = sinf(ang);
        out[e] = d < half ? x * c - xp * sn : x * c + xp * sn;
    }
}

/* One key's EPL values (of K or of V) held by a lane: floats, or for a bf16 cache the EPL / 2 words as loaded, turned
 * into floats where used, so that a warp holds twice the keys of a group in the same registers. */
template <typename T, int EPL> struct a2_kv {
    float v[EPL];
    template <bool CG = false> __device__ __forceinline__ void load(const float *p) { g3c_kv_ld<EPL, CG>(v, p); }
    __device__ __forceinline__ float get(int e) const { return v[e]; }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int e = 0; e < EPL; e++) v[e] = 0.f;
    }
    __device__ __forceinline__ void set(const float (&x)[EPL]) {
#pragma unroll
        for (int e = 0; e < EPL; e++) v[e] = x[e];
    }
};
template <int EPL> struct a2_kv<__nv_bfloat16, EPL> {
    uint32_t w[EPL / 2]; /* value 2i in the low half of w[i] (g3c_kv_ld_raw) */
    template <bool CG = false> __device__ __forceinline__ void load(const __nv_bfloat16 *p) {
        g3c_kv_ld_raw<EPL, CG>(w, p);
    }
    __device__ __forceinline__ float get(int e) const { return (e & 1) ? g3c_bf_hi(w[e >> 1]) : g3c_bf_lo(w[e >> 1]); }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int i = 0; i < EPL / 2; i++) w[i] = 0u;
    }
    __device__ __forceinline__ void set(const float (&x)[EPL]) { /* rounded as the cache write rounds */
#pragma unroll
        for (int i = 0; i < EPL / 2; i++) w[i] = g3c_bf_pack(x[2 * i], x[2 * i + 1]);
    }
};

/* T: the cache element (float, or __nv_bfloat16 with a.kv16); KP: keys of a bf16 cache per register set (1, 2); OQ:
 * the o product fused (attn_oproj.cuh: its weight type; 0 none, o and oh written instead) */
template <int G, int EPL, int WPB, bool FU, bool PIPE, typename T, int KP = 1, int OQ = 0>
__global__ void __launch_bounds__(WPB * 32, WPB == 2 ? 8 : 1) k_attn2(g3c_attn_args a, const float *__restrict__ q,
                                                       float *__restrict__ o, __nv_bfloat16 *__restrict__ oh,
                                                       int split, float *y, int ny, const float *qn,
                                                       const float *kn, const g3c_aop op) {
    constexpr int D = 32 * EPL, GD = G * D;
    /* keys per warp group: <= 64 K/V registers (with KP = 2 twice the keys of a bf16 cache, except in 16-warp
     * blocks, which have 128 registers a thread) and <= 32 scores */
    constexpr int KPR = sizeof(T) == 2 && WPB <= 4 ? KP : 1;
    constexpr int NKW = 32 * KPR / EPL < 32 / G ? 32 * KPR / EPL : 32 / G;
    constexpr int IPB = 32 / NKW; /* groups whose cache slots one block-table lookup round finds */
    constexpr int NV = NKW * G, SH = NV >= 32 ? 0 : NV >= 16 ? 1 : NV >= 8 ? 2 : NV >= 4 ? 3 : NV >= 2 ? 4 : 5;
    static_assert(NV <= 32 && (NV & (NV - 1)) == 0, "scores a group: a power of two, one or more a lane");
    __shared__ __align__(16) float s_acc[WPB][GD];
    __shared__ float s_m[WPB][G], s_l[WPB][G];
    __shared__ __align__(16) float b_acc[GD]; /* the block's merged partial (read by the cluster) */
    __shared__ float b_m[G], b_l[G];
    /* Before the programmatic-dependent-launch wait: what does not depend on the kernel before (row parameters and
     * block tables are uploaded before the step, older keys were written by earlier steps): the first group's cache
     * slots and its K/V loads. Of those keys only the row's own (position p) is written by the kernel before (or by
     * this one when fused), if no other row of the step is of the same sequence; it is read again after the wait. */
    const int kh = blockIdx.x, r = blockIdx.y, C = gridDim.z, rank = blockIdx.z; /* cluster (1,1,C) = z extent */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int u = a.rows.useq[r], p = a.rows.pos[r];
    int lo = 0, n = 0;
    if (u >= 0) lo = a.kind == 1 ? max(0, p - a.window + 1) : 0, n = p - lo + 1;
    const int NG = (n + NKW - 1) / NKW, TW = C * WPB;
    const int32_t *bt = a.rows.bt + ((size_t)(u < 0 ? 0 : u) * 2 + a.kind) * a.rows.mbps;
    const size_t vstride = (size_t)a.NKV * a.kv_block * D; /* K slot -> V slot */
    const T *pool = (const T *)a.pool + lane * EPL;
    /* lane i: element offset of the K row of key i % NKW of group gi0 + (i / NKW) * TW (-1: none) */
    auto lookup = [&](int gi0) {
        const int gj = gi0 + (lane / NKW) * TW, key = lo + gj * NKW + lane % NKW;
        long long of = -1;
        if (gj < NG && key <= p) {
            const int blk = bt[key / a.kv_block];
            if (blk >= 0)
                of = ((((long long)blk * a.n_layers_kind + a.layer_in_kind) * 2 * a.NKV + kh) * a.kv_block +
                      key % a.kv_block) * D;
        }
        return of;
    };
    /* every K and V load of group g (the warp's group `sub` of its lookup round, whose slots are looked up first when
     * sub == 0) issued before any use; missing keys read slot 0 */
    long long off = -1;
    using KV = a2_kv<T, EPL>;
    auto fetch = [&](int g, int sub, KV (&kr)[NKW], KV (&vr)[NKW], bool (&ok)[NKW]) {
        if (sub == 0) off = lookup(g);
#pragma unroll
        for (int j = 0; j < NKW; j++) {
            const long long oj = __shfl_sync(0xffffffffu, off, sub * NKW + j);
            ok[j] = oj >= 0;
            kr[j].load(pool + (ok[j] ? oj : 0));
            vr[j].load(pool + (ok[j] ? oj + (long long)vstride : 0));
        }
    };
    /* early loads only where no other row of the step is of the same sequence (its key, written by the kernel
     * before, would be visible to this row): rows of distinct sequences, as in decode; graphs serve both kinds of
     * steps, so the rows are compared here */
    bool early = a.m <= 256;
    if (early) {
        bool dup = false;
        for (int j = lane; j < a.m; j += 32) dup |= j != r && a.rows.useq[j] == u;
        early = !__any_sync(0xffffffffu, dup);
    }
    int it = 0, gi = rank * WPB + warp;
    KV kr[NKW], vr[NKW];
    bool ok[NKW];
    if (early && gi < NG) fetch(gi, 0, kr, vr, ok); /* warp-uniform */
    extern __shared__ __align__(16) unsigned char a2_dyn[]; /* OQ: the o product's slice (attn_oproj.cuh) */
    if constexpr (OQ != 0) aop_fetch<OQ, GD, WPB * 32>(op, kh, rank, a2_dyn);
    g3c_pdl_wait();
    if (!early && gi < NG) fetch(gi, 0, kr, vr, ok);
    if (early && !FU && gi < NG) { /* the row's own key, written by the kernel before: read it again */
        const int jp = p - (lo + gi * NKW);
        if (jp >= 0 && jp < NKW) {
            const long long op = __shfl_sync(0xffffffffu, off, jp);
#pragma unroll
            for (int j = 0; j < NKW; j++)
                if (j == jp && op >= 0) { /* L2 loads: L1 may hold the stale line of the load before the wait */
                    kr[j].template load<true>(pool + op);
                    vr[j].template load<true>(pool + op + (long long)vstride);
                }
        }
    }
    float qv[G][EPL], acc[G][EPL], mx[G], l[G];
    const float *qb = q + (size_t)r * a.NH * D + (size_t)kh * GD + lane * EPL;
    const size_t rowb = (size_t)r * (a.NH + 2 * a.NKV) * D, sl = (size_t)a.m * (a.NH + 2 * a.NKV) * D; /* fused: y */
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (FU) a2_norm_rope<EPL>(y, ny, sl, rowb + (size_t)(kh * G + g) * D, qn, a.inv_freq, p, a.eps, lane, qv[g]);
        else a2_ld<EPL>(qv[g], qb + g * D);
        mx[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[g][e] = 0.f;
    }
    for (; gi < NG; it++, gi += TW) {
        const int sub = it % IPB, kb = lo + gi * NKW;
        const long long offc = off; /* this group's lookup round */
        KV k2[PIPE ? NKW : 1], v2[PIPE ? NKW : 1];
        bool ok2[PIPE ? NKW : 1];
        if constexpr (PIPE) { /* the next group's loads in flight during this group's math */
            if (gi + TW < NG) fetch(gi + TW, (it + 1) % IPB, k2, v2, ok2);
        }
        const int jp = p - kb; /* fused: this group holds the row's own key: normalize, rotate, write, use it */
        if (FU && jp >= 0 && jp < NKW) { /* warp-uniform */
            float kp[EPL], vp[EPL];
            a2_norm_rope<EPL>(y, ny, sl, rowb + (size_t)(a.NH + kh) * D, kn, a.inv_freq, p, a.eps, lane, kp);
#pragma unroll
            for (int e = 0; e < EPL; e++) vp[e] = 0.f;
            for (int j = 0; j < ny; j++) {
                float t[EPL];
                a2_ld<EPL, A2_PLAIN>(t, y + j * sl + rowb + (size_t)(a.NH + a.NKV + kh) * D + lane * EPL);
#pragma unroll
                for (int e = 0; e < EPL; e++) vp[e] += t[e];
            }
            const long long op = __shfl_sync(0xffffffffu, offc, sub * NKW + jp);
            if (op >= 0) {
                g3c_kv_st<EPL>((T *)a.pool + op + lane * EPL, kp);
                g3c_kv_st<EPL>((T *)a.pool + op + (long long)vstride + lane * EPL, vp);
            }
#pragma unroll
            for (int j = 0; j < NKW; j++) /* as later steps will read it (bf16: rounded) */
                if (j == jp) kr[j].set(kp), vr[j].set(vp);
        }
        /* the NV = NKW G scores (key j, head g at v = j G + g): the lanes' partial dot products summed by halving
         * exchanges (each level a lane keeps half of its values and adds its partner's copy of them), so that lane
         * L ends with score v = L >> SH; the softmax's scaling, exponential and masks then run once a lane instead
         * of once a score in every lane, and the probabilities come back to all lanes for the V sums (27B: 37
         * shuffles a group instead of 80, one exponential a lane instead of 16) */
        float s[NV];
#pragma unroll
        for (int j = 0; j < NKW; j++)
#pragma unroll
            for (int g = 0; g < G; g++) {
                float t = 0.f;
#pragma unroll
                for (int e = 0; e < EPL; e++) t = fmaf(qv[g][e], kr[j].get(e), t);
                s[j * G + g] = t;
            }
#pragma unroll
        for (int lv = 0; lv < 5 - SH; lv++) { /* NV / 2, NV / 4, .. 1 values exchanged with lane ^ 16, ^ 8, .. */
            const int h = NV >> (lv + 1), b = 16 >> lv;
            const bool up = lane & b;
#pragma unroll
            for (int i = 0; i < NV / 2; i++) { /* a constant trip count, so that it unrolls before the outer loop */
                if (i >= h) break;
                const float send = a2_sel(up, s[i], s[i + h]), keep = a2_sel(up, s[i + h], s[i]);
                s[i] = keep + __shfl_xor_sync(0xffffffffu, send, b);
            }
        }
#pragma unroll
        for (int b = 1 << SH >> 1; b; b >>= 1) s[0] += __shfl_xor_sync(0xffffffffu, s[0], b);
        const int vi = lane >> SH, jl = vi / G, gl = vi % G; /* this lane's score: key jl, head gl */
        unsigned okm = 0u;
#pragma unroll
        for (int j = 0; j < NKW; j++) okm |= (unsigned)ok[j] << j;
        float t = s[0] * a.scale;
        if (a.softcap > 0.f) t = a.softcap * tanhf(t / a.softcap);
        if (!(okm >> jl & 1u)) t = -INFINITY;
        float tm = t; /* the group's maximum for head gl: over the lanes of the other keys */
#pragma unroll
        for (int b = 16; b >= (1 << SH) * G; b >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, b));
#pragma unroll
        for (int j = 0; j < NKW; j++)
            if (!ok[j]) vr[j].zero(); /* slot 0 may hold anything */
        float mn[G], mine = -INFINITY;
#pragma unroll
        for (int g = 0; g < G; g++) {
            mn[g] = fmaxf(mx[g], __shfl_sync(0xffffffffu, tm, g << SH));
            if (g == gl) mine = mn[g];
        }
        const float pl = t == -INFINITY ? 0.f : expf(t - mine);
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (mn[g] == -INFINITY) continue; /* warp-uniform: no key yet */
            const float corr = expf(mx[g] - mn[g]);
            float ls = 0.f;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[g][e] *= corr;
#pragma unroll
            for (int j = 0; j < NKW; j++) {
                const float pj = __shfl_sync(0xffffffffu, pl, (j * G + g) << SH);
                ls += pj;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[g][e] = fmaf(pj, vr[j].get(e), acc[g][e]);
            }
            l[g] = l[g] * corr + ls, mx[g] = mn[g];
        }
        if constexpr (PIPE) {
#pragma unroll
            for (int j = 0; j < NKW; j++) ok[j] = ok2[j], kr[j] = k2[j], vr[j] = v2[j];
        } else if (gi + TW < NG) { /* the next group's loads */
            fetch(gi + TW, (it + 1) % IPB, kr, vr, ok);
        }
    }
    /* the 4 warps of the block */
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int e = 0; e < EPL; e++) s_acc[warp][g * D + lane * EPL + e] = acc[g][e];
        if (lane == 0) s_m[warp][g] = mx[g], s_l[warp][g] = l[g];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < GD; e += WPB * 32) {
        const int g = e / D;
        float M = -INFINITY, out = 0.f, L = 0.f;
#pragma unroll
        for (int w = 0; w < WPB; w++) M = fmaxf(M, s_m[w][g]);
        if (M != -INFINITY)
#pragma unroll
            for (int w = 0; w < WPB; w++) {
                const float f = s_m[w][g] == -INFINITY ? 0.f : expf(s_m[w][g] - M);
                out += f * s_acc[w][e], L += f * s_l[w][g];
            }
        b_acc[e] = out;
        if (e % D == 0) b_m[g] = M, b_l[g] = L;
    }
    cg::cluster_group cluster = cg::this_cluster();
    if (C > 1) cluster.sync(); /* every block's partial written and visible to the cluster */
    else __syncthreads();
    if constexpr (OQ != 0) { /* every block merges all GD outputs (its warps' partials are no longer read) */
        float *xs = &s_acc[0][0];
        for (int e = threadIdx.x; e < GD; e += WPB * 32) {
            const int g = e / D;
            float M = -INFINITY, out = 0.f, L = 0.f;
            for (int j = 0; j < C; j++) M = fmaxf(M, (C > 1 ? cluster.map_shared_rank(b_m, j) : b_m)[g]);
            if (M != -INFINITY)
                for (int j = 0; j < C; j++) {
                    const float mj = (C > 1 ? cluster.map_shared_rank(b_m, j) : b_m)[g];
                    if (mj == -INFINITY) continue;
                    const float f = expf(mj - M);
                    out += f * (C > 1 ? cluster.map_shared_rank(b_acc, j) : b_acc)[e];
                    L += f * (C > 1 ? cluster.map_shared_rank(b_l, j) : b_l)[g];
                }
            xs[e] = L > 0.f ? out / L : 0.f;
        }
        if (C > 1) cluster.sync(); /* the cluster's reads of each block's partials done; xs visible to the block */
        else __syncthreads();
        aop_run<OQ, GD, WPB * 32>(op, rank, a2_dyn, xs);
        return;
    }
    if (FU && rank == 0) /* every read of y in the cluster is behind that barrier: zero what the pair read */
        for (int t = threadIdx.x; t < ny * (G + 2) * D; t += WPB * 32) {
            const int j = t / ((G + 2) * D), sec = t % ((G + 2) * D) / D, d = t % D;
            const int head = sec < G ? kh * G + sec : sec == G ? a.NH + kh : a.NH + a.NKV + kh;
            y[j * sl + rowb + (size_t)head * D + d] = 0.f;
        }
    /* the cluster's threads share the G*D outputs; each merges the C block partials of its element */
    const size_t ob = (size_t)r * a.NH * D + (size_t)kh * GD;
    if (GD % 128 == 0 && a.tq_x) { /* quantized for the o product: a warp merges a block of 128 values, 4 a lane */
        for (int wb = rank * WPB + warp; wb < GD / 128; wb += C * WPB) { /* warp-uniform */
            const int e0 = wb * 128 + 4 * lane, g = e0 / D;
            float M = -INFINITY, L = 0.f, mj[8];
            float4 out = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                mj[j] = -INFINITY;
                if (j < C) mj[j] = (C > 1 ? cluster.map_shared_rank(b_m, j) : b_m)[g];
                M = fmaxf(M, mj[j]);
            }
            if (M != -INFINITY)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < C && mj[j] != -INFINITY) {
                        const float f = expf(mj[j] - M);
                        const float4 aj = *(const float4 *)((C > 1 ? cluster.map_shared_rank(b_acc, j) : b_acc) + e0);
                        out.x += f * aj.x, out.y += f * aj.y, out.z += f * aj.z, out.w += f * aj.w;
                        L += f * (C > 1 ? cluster.map_shared_rank(b_l, j) : b_l)[g];
                    }
            const float il = L > 0.f ? 1.f / L : 0.f;
            out.x *= il, out.y *= il, out.z *= il, out.w *= il;
            g3c_tq_quant4(out, true, a.tq_x, ob + (size_t)wb * 128, a.tq_d + ob / 128 + wb, a.tq_il, a.NH * D);
        }
    } else {
        for (int e = rank * WPB * 32 + threadIdx.x; e < GD; e += C * WPB * 32) {
            const int g = e / D;
            float mj[8], lj[8], aj[8], M = -INFINITY, out = 0.f, L = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                mj[j] = -INFINITY, lj[j] = 0.f, aj[j] = 0.f;
                if (j < C) {
                    const float *pm = C > 1 ? cluster.map_shared_rank(b_m, j) : b_m;
                    const float *pl = C > 1 ? cluster.map_shared_rank(b_l, j) : b_l;
                    const float *pa = C > 1 ? cluster.map_shared_rank(b_acc, j) : b_acc;
                    mj[j] = pm[g], lj[j] = pl[g], aj[j] = pa[e];
                }
                M = fmaxf(M, mj[j]);
            }
            if (M != -INFINITY)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float f = mj[j] == -INFINITY ? 0.f : expf(mj[j] - M);
                    out += f * aj[j], L += f * lj[j];
                }
            const float v = L > 0.f ? out / L : 0.f;
            const size_t idx = ob + e;
            o[idx] = v;
            const __nv_bfloat16 hv = __float2bfloat16_rn(v);
            oh[idx] = hv;
            if (split) oh[(size_t)a.m * a.NH * D + idx] = __float2bfloat16_rn(v - __bfloat162float(hv));
        }
    }
    if (C > 1) cluster.sync(); /* no block leaves while another may still read its shared memory */
}

static int a2_force = -1; /* test override of $G3_CUDA_ATTN2 (-1: none) */

void g3c_attn2_force(int on) { a2_force = on; }

static int a2_force_w = 0; /* test override of the warps per block (0: none) */
void g3c_attn2_force_w(int wpb) { a2_force_w = wpb; }

int g3c_attn2_enabled(void) {
    static int on = -1;
    if (a2_force >= 0) return a2_force;
    if (on < 0) {
        const char *e = getenv("G3_CUDA_ATTN2");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

int g3c_attn2_supported(const g3c_attn_args *a) {
    if (a->NKV < 1 || a->NH % a->NKV || a->m < 1 || a->m > 65535) return 0;
    const int G = a->NH / a->NKV;
    return (a->D == 64 || a->D == 128 || a->D == 256) && (G == 1 || G == 2 || G == 4 || G == 8) && G * a->D <= 1024;
}

/* Grid shape for m rows: the cluster size C (blocks per (row, kv head)) is the smallest power of two giving at least
 * one block per SM, at most 8 (the portable limit); blocks of 4 warps, or of 2 (8 a SM at the kernel's <= 128
 * registers) where the pairs exceed one wave of 4-warp blocks: 27B at 64 rows 21.8 against 23.3 us a layer, 64-256
 * seqs +0.5-1% (H200, session 22 run 02; forced everywhere, 4B at 64 rows -5%, 1B at 256 -15%). $G3_CUDA_ATTN2_C
 * (1, 2, 4, 8) and $G3_CUDA_ATTN2_W (2, 4, 16) force either. Measured on the H200 (27B shape, graphs of 62 layers,
 * attention alone): 1 row at 600 keys C = 8: 9.5 us (C 4: 11.1, 2: 17.5, 1: 28.8; 16 warps: 14.5); 8 rows at ~550
 * keys C = 2: 24.6 us (C 1: 32.3, 4: 28.8); 32 rows at 65..96 keys C = 1: 15.4 us (C 2: 21.1); 64 rows C = 1: 28.6 us
 * (C 2: 38.2). *wpb may be NULL. */
int g3c_attn2_cluster(int m, int NKV, int *wpb) {
    static int fc = -1, fw = -1;
    if (fc < 0) {
        const char *e = getenv("G3_CUDA_ATTN2_C"), *w = getenv("G3_CUDA_ATTN2_W");
        const int v = e ? atoi(e) : 0, vw = w ? atoi(w) : 0;
        fc = v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
        fw = vw == 2 || vw == 4 || vw == 16 ? vw : 0;
    }
    const int n_sm = g3c_dev_sms();
    int C = 1;
    while (C < 8 && (long long)m * NKV * C < n_sm) C *= 2;
    if (fc) C = fc;
    /* more (row, kv head) pairs than one wave of 4-warp blocks holds (4 a SM at <= 128 registers a thread): 2-warp
     * blocks, 8 a SM, so that the pairs run in one wave */
    const int w = C == 1 && (long long)m * NKV > 4LL * n_sm ? 2 : 4;
    if (wpb) *wpb = a2_force_w ? a2_force_w : fw ? fw : w;
    return C;
}

struct a2_fu { /* fused inputs (y == NULL: q given) */
    float *y;
    int ny;
    const float *qn, *kn;
};

/* $G3_CUDA_ATTN2_PIPE=0: no double buffer of K/V groups (the default has one where the grid has clusters) */
static int a2_pipe(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("G3_CUDA_ATTN2_PIPE");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* Keys of a bf16 cache per register set: 1 (the groups of float32: more groups, so more warps busy at short
 * contexts) or, $G3_CUDA_ATTN2_KPR=2, 2 (groups of twice the keys, as many bytes in flight as float32: better at long
 * contexts with many rows). Measured on an H100 (session 14 run 06, aggregate decode tok/s, contexts of 65..97 keys,
 * 1 / 2 / float32 cache): 27B int4 32 seqs 2858 / 2707 / 2710, 1B bf16 32 seqs 15461 / 13791 / 14181, 4B int4 8 seqs
 * 2733 / 2561 / 2549; 27B int4 8 seqs at 8K of context 17.67 / 17.05 / 19.81 ms a step (runs 03, 06). Read once. */
static int a2_kpr(void) {
    static int f = -1;
    if (f < 0) {
        const char *e = getenv("G3_CUDA_ATTN2_KPR");
        f = e && !strcmp(e, "2") ? 2 : 1;
    }
    return f;
}

template <int G, int EPL, int W, bool FU, bool PIPE>
static cudaError_t a2_run(const cudaLaunchConfig_t *cfg, const g3c_attn_args *a, const float *q, float *o,
                          __nv_bfloat16 *oh, int split, const a2_fu &f) {
    const g3c_aop op = {};
    if (a->kv16 && a2_kpr() == 2)
        return cudaLaunchKernelEx(cfg, k_attn2<G, EPL, W, FU, PIPE, __nv_bfloat16, 2>, *a, q, o, oh, split, f.y,
                                  f.ny, f.qn, f.kn, op);
    if (a->kv16)
        return cudaLaunchKernelEx(cfg, k_attn2<G, EPL, W, FU, PIPE, __nv_bfloat16, 1>, *a, q, o, oh, split, f.y,
                                  f.ny, f.qn, f.kn, op);
    return cudaLaunchKernelEx(cfg, k_attn2<G, EPL, W, FU, PIPE, float>, *a, q, o, oh, split, f.y, f.ny, f.qn, f.kn,
                              op);
}

template <int G, int EPL, int W>
static cudaError_t a2_launch(const g3c_attn_args *a, const float *q, float *o, __nv_bfloat16 *oh, int split, int C,
                             const a2_fu &f, cudaStream_t st) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute at[2];
    int na = 0;
    if (g3c_pdl_enabled() && st) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    if (C > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 1, at[na].val.clusterDim.y = 1, at[na].val.clusterDim.z = (unsigned)C;
        na++;
    }
    cfg.gridDim = dim3((unsigned)a->NKV, (unsigned)a->m, (unsigned)C), cfg.blockDim = dim3(W * 32);
    cfg.dynamicSmemBytes = 0, cfg.stream = st, cfg.attrs = at, cfg.numAttrs = (unsigned)na;
    /* the double buffer where a grid of clusters (few rows: registers are plentiful, latency is what counts) and the
     * second K/V set fits the registers without spills */
    if constexpr (W == 4 && G * EPL <= 16) {
        if (C > 1 && a2_pipe())
            return f.y ? a2_run<G, EPL, W, true, true>(&cfg, a, q, o, oh, split, f)
                       : a2_run<G, EPL, W, false, true>(&cfg, a, q, o, oh, split, f);
    }
    return f.y ? a2_run<G, EPL, W, true, false>(&cfg, a, q, o, oh, split, f)
               : a2_run<G, EPL, W, false, false>(&cfg, a, q, o, oh, split, f);
}

/* 16-warp blocks only where the kernel fits 128 registers a thread and 32 KB of warp partials (G * EPL <= 8) */
template <int G, int EPL>
static cudaError_t a2_launch_w(const g3c_attn_args *a, const float *q, float *o, __nv_bfloat16 *oh, int split, int C,
                               int W, const a2_fu &f, cudaStream_t st) {
    if constexpr (G * EPL <= 8)
        if (W == 16) return a2_launch<G, EPL, 16>(a, q, o, oh, split, C, f, st);
    if (W == 2) return a2_launch<G, EPL, 2>(a, q, o, oh, split, C, f, st);
    return a2_launch<G, EPL, 4>(a, q, o, oh, split, C, f, st);
}

template <int EPL>
static cudaError_t a2_launch_d(const g3c_attn_args *a, const float *q, float *o, __nv_bfloat16 *oh, int split, int C,
                               int W, const a2_fu &f, cudaStream_t st) {
    switch (a->NH / a->NKV) {
    case 1: return a2_launch_w<1, EPL>(a, q, o, oh, split, C, W, f, st);
    case 2: return a2_launch_w<2, EPL>(a, q, o, oh, split, C, W, f, st);
    case 4: return a2_launch_w<4, EPL>(a, q, o, oh, split, C, W, f, st);
    case 8: if constexpr (EPL <= 4) return a2_launch_w<8, EPL>(a, q, o, oh, split, C, W, f, st);
    }
    return cudaErrorInvalidValue;
}

static cudaError_t a2_any(const g3c_attn_args *a, const float *q, float *o, __nv_bfloat16 *oh, int split,
                          const a2_fu &f, cudaStream_t st) {
    if (!g3c_attn2_supported(a) || (a->tq_x && a->NH / a->NKV * a->D % 128)) return cudaErrorInvalidValue;
    int W = 4;
    const int C = g3c_attn2_cluster(a->m, a->NKV, &W);
    if (a->D == 64) return a2_launch_d<2>(a, q, o, oh, split, C, W, f, st);
    if (a->D == 128) return a2_launch_d<4>(a, q, o, oh, split, C, W, f, st);
    return a2_launch_d<8>(a, q, o, oh, split, C, W, f, st);
}

cudaError_t g3c_attn2(const g3c_attn_args *a, const float *q, float *o, __nv_bfloat16 *oh, int split,
                      cudaStream_t st) {
    const a2_fu f = {NULL, 0, NULL, NULL};
    return a2_any(a, q, o, oh, split, f, st);
}

cudaError_t g3c_attn2_fused(const g3c_attn_args *a, float *y, int ny, const float *qn, const float *kn, float *o,
                            __nv_bfloat16 *oh, int split, cudaStream_t st) {
    if (!y || ny < 1) return cudaErrorInvalidValue;
    const a2_fu f = {y, ny, qn, kn};
    return a2_any(a, NULL, o, oh, split, f, st);
}

/* ---- the o product fused at one row (attn_oproj.cuh) ------------------------------------------------------------ */
#define AOP_SMEM_MAX (200 << 10)

static int aop_type(const g3_dmat *w) { /* the fused product's weight type, 0: none */
    if (w->qt == G3Q_INT8 && w->g == w->k) return G3Q_INT8;
    if (w->qt == G3Q_FP8 && w->g == w->k) return G3Q_FP8;
    if (w->qt == G3Q_INT4 && w->g == 128 && !w->kc) return G3Q_INT4;
    return 0;
}

static int aop_rb(int n, int C) { /* rows a block: the cluster's C blocks share the n rows, 4 at a time */
    const int rb = (n + C - 1) / C;
    return (rb + 3) / 4 * 4;
}

/* One (G, EPL, OQ) instance: the shared memory allowed once, then (query) whether NKV clusters of C such blocks are
 * resident at once (one a SM at this shared memory: a cluster of 8 needs 8 free SMs of one GPC), else the launch. */
template <int G, int EPL, bool PIPE, int OQ>
static cudaError_t aop_launch1(const g3c_attn_args *a, const float *q, const g3c_aop &op, int C, cudaStream_t st,
                               int *fits) {
    constexpr int GD = G * 32 * EPL;
    const auto k = k_attn2<G, EPL, 4, false, PIPE, __nv_bfloat16, 1, OQ>;
    static int ready = 0;
    if (!ready) { /* g3c_aop_init does it at create, outside any graph capture */
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, AOP_SMEM_MAX);
        if (e != cudaSuccess) return e;
        ready = 1;
    }
    if (!fits && !st) return cudaSuccess; /* g3c_aop_init: the attribute only */
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute at[2];
    int na = 0;
    if (g3c_pdl_enabled() && st && !fits) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    at[na].id = cudaLaunchAttributeClusterDimension;
    at[na].val.clusterDim.x = 1, at[na].val.clusterDim.y = 1, at[na].val.clusterDim.z = (unsigned)C;
    na++;
    cfg.gridDim = dim3((unsigned)a->NKV, 1u, (unsigned)C), cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = aop_lay<OQ, GD>::bytes(op.rb), cfg.stream = st, cfg.attrs = at, cfg.numAttrs = (unsigned)na;
    if (fits) { /* the last answer kept: asked once a layer when a step is recorded */
        static size_t last_smem = 0;
        static int last_nkv = 0, last_fits = 0;
        if (cfg.dynamicSmemBytes > AOP_SMEM_MAX) return *fits = 0, cudaSuccess;
        if (cfg.dynamicSmemBytes != last_smem || a->NKV != last_nkv) {
            int nc = 0;
            cudaError_t e = cudaOccupancyMaxActiveClusters(&nc, k, &cfg);
            if (e != cudaSuccess) return e;
            last_smem = cfg.dynamicSmemBytes, last_nkv = a->NKV, last_fits = nc >= a->NKV;
        }
        *fits = last_fits;
        return cudaSuccess;
    }
    return cudaLaunchKernelEx(&cfg, k, *a, q, (float *)NULL, (__nv_bfloat16 *)NULL, 0, (float *)NULL, 0,
                              (const float *)NULL, (const float *)NULL, op);
}

template <int OQ>
static cudaError_t aop_launch_q(const g3c_attn_args *a, const float *q, const g3c_aop &op, int C, cudaStream_t st,
                                int *fits) {
    const int G = a->NH / a->NKV;
    /* the shapes of Gemma 3 (27B: 2 heads of 128 a kv head; 4B / 12B: 2 of 256; 270M / 1B: 4 of 256), in the form
     * a2_launch would pick (the K/V double buffer where G EPL <= 16) */
    if (G == 2 && a->D == 128) return aop_launch1<2, 4, true, OQ>(a, q, op, C, st, fits);
    if (G == 2 && a->D == 256) return aop_launch1<2, 8, true, OQ>(a, q, op, C, st, fits);
    if (G == 4 && a->D == 256) return aop_launch1<4, 8, false, OQ>(a, q, op, C, st, fits);
    return cudaErrorInvalidValue;
}

static cudaError_t aop_any(const g3c_attn_args *a, const float *q, const g3_dmat *w, float *y, cudaStream_t st,
                           int *fits) {
    int W = 4;
    const int C = g3c_attn2_cluster(1, a->NKV, &W);
    const g3c_aop op = {w->q, w->s, w->z, w->n, w->k, aop_rb(w->n, C), y};
    switch (aop_type(w)) {
    case G3Q_INT8: return aop_launch_q<G3Q_INT8>(a, q, op, C, st, fits);
    case G3Q_INT4: return aop_launch_q<G3Q_INT4>(a, q, op, C, st, fits);
    case G3Q_FP8: return aop_launch_q<G3Q_FP8>(a, q, op, C, st, fits);
    }
    return cudaErrorInvalidValue;
}

cudaError_t g3c_aop_init(void) {
    static int done = 0;
    if (done) return cudaSuccess;
    g3c_attn_args a;
    memset(&a, 0, sizeof a);
    const g3c_aop op = {};
    static const int shapes[3][3] = {{2, 128, 16}, {2, 256, 16}, {4, 256, 16}}; /* G, D, NKV */
    for (int i = 0; i < 3; i++) {
        a.NKV = shapes[i][2], a.NH = shapes[i][0] * a.NKV, a.D = shapes[i][1];
        cudaError_t e = aop_launch_q<G3Q_INT8>(&a, NULL, op, 8, NULL, NULL);
        if (e == cudaSuccess) e = aop_launch_q<G3Q_INT4>(&a, NULL, op, 8, NULL, NULL);
        if (e == cudaSuccess) e = aop_launch_q<G3Q_FP8>(&a, NULL, op, 8, NULL, NULL);
        if (e != cudaSuccess) return e;
    }
    done = 1;
    return cudaSuccess;
}

static int g3c_aofuse_enabled(void) { /* $G3_CUDA_AOFUSE=1 (read at every call); off by default: measured slower */
    const char *e = getenv("G3_CUDA_AOFUSE");
    return e && !strcmp(e, "1");
}

int g3c_attention_o_ok(const g3c_attn_args *a, const g3_dmat *w) {
    if (!g3c_aofuse_enabled() || a->m != 1 || !a->kv16 || a->tq_x || !g3c_attn2_enabled() || !g3c_attn2_supported(a) ||
        a2_kpr() != 1 || !w->q || !w->s)
        return 0;
    const int oq = aop_type(w), G = a->NH / a->NKV, GD = G * a->D;
    int W = 4;
    const int C = g3c_attn2_cluster(1, a->NKV, &W);
    if (!oq || W != 4 || C < 2 || w->k != a->NH * a->D || w->n % 4) return 0;
    if (G * a->D / 32 <= 16 && !a2_pipe()) return 0; /* the instances built: with the double buffer there */
    if (oq == G3Q_INT4 && (GD % 256 || (w->k / 128) % 2 || !w->z || ((uintptr_t)w->z & 7))) return 0;
    if (((uintptr_t)w->q | (uintptr_t)w->s) & 15) return 0;
    int fits = 0;
    return aop_any(a, NULL, w, NULL, NULL, &fits) == cudaSuccess && fits;
}

cudaError_t g3c_attention_o(const g3c_attn_args *a, const float *q, const g3_dmat *w, float *y, cudaStream_t st) {
    if (!g3c_attention_o_ok(a, w) || !y || !q) return cudaErrorInvalidValue;
    cudaError_t e = aop_any(a, q, w, y, st, NULL);
    return e == cudaSuccess ? cudaGetLastError() : e;
}
