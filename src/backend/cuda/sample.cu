/* The sampling chain of sample/sampler.h on the device (backend.h's forward_sample): one block of 1024 threads per
 * out row, over the row's logits where the forward left them, so only the token ids come back to the host.
 *
 * Steps, per row (l = the row's logits, V of them):
 *   1-3  the sparse adjustments (summed bias, window count) applied in place, one thread per distinct token.
 *   4    m = max l, am = its lowest id (NaN never wins). Temperature 0, or m = +-inf: the token is am (as the host).
 *   5    s = (l - m) / T and an integer weight W = round(exp(s) * 2^44) per token (0 below ~e^-30.5: such tokens are
 *        never drawn; their total mass is < 2^-26 of the most probable one's). Integer weights make every sum exact,
 *        so a row's result does not depend on the order of the atomics and reductions: same u, same token.
 *   6-7  top-k by count, then top-p by mass over the top-k survivors, each as a cut in the order (s descending, id
 *        ascending) found by select_cut: a 256-bin histogram over the row's s range locates the bin where the
 *        running count or mass crosses its target, and the bin's members are refined (another histogram over their
 *        own s range) until at most 2048 are left, which are sorted in shared memory and scanned. If more than 2048
 *        share one s value (so one weight), the cut falls among them by id, lowest first.
 *   8    min-p: s >= log(min_p), the host's expression.
 *   9    r = u * Z (Z = the kept tokens' total weight); the token is the first in id order whose running weight
 *        exceeds r.
 * Ties in s between distinct logits (possible only through rounding) are broken by id here and by logit on the host.
 * The host sampler walks its candidates in another order for the draw, so the same u can pick another token; the
 * distribution is the same. Cost: about ten passes over the row's logits from L2 per row, the rows in parallel. */
#include <float.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "sample/dev_sample.h"

#define SP_T 1024
#define SP_NW (SP_T / 32)
#define SP_BINS 256
#define SP_SORT 2048
#define SP_ONE 17592186044416.0f /* 2^44: the weight of s = 0 */

typedef unsigned long long u64;

struct sp_cut { /* keeps (s, id) with s > cs, or s == cs and id <= cid; {-inf, INT_MAX} keeps every weighted token */
    float s;
    int id;
};
struct sp_shared {
    unsigned cnt[SP_BINS];
    u64 mass[SP_BINS];
    u64 key[SP_SORT];
    float f0[SP_NW], f1[SP_NW];
    int i0[SP_NW];
    u64 u0[SP_NW];
    int crossing, n_key;
    double above, target;
    float a, b;
    sp_cut cut;
};

static __device__ __forceinline__ u64 sp_weight(float s) {
    return s > -31.0f ? __float2ull_rn(expf(s) * SP_ONE) : 0ull;
}
static __device__ __forceinline__ bool sp_keeps(sp_cut c, float s, int id) {
    return s > c.s || (s == c.s && id <= c.id);
}
/* (s, id) as one integer, larger = earlier in the order (s descending, id ascending). */
static __device__ __forceinline__ u64 sp_key(float s, int id) {
    unsigned u = __float_as_uint(s);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((u64)u << 32) | (u64)(0xffffffffu - (unsigned)id);
}
static __device__ __forceinline__ void sp_unkey(u64 k, float &s, int &id) {
    unsigned u = (unsigned)(k >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    s = __uint_as_float(u), id = (int)(0xffffffffu - (unsigned)k);
}

static __device__ __forceinline__ u64 sp_warp_sum(u64 v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* Inclusive prefix sum of v over the warp's lanes. */
static __device__ __forceinline__ u64 sp_warp_scan(u64 v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}
/* Block min and max of s (every thread gets them). */
static __device__ void sp_block_minmax(float &lo, float &hi, sp_shared &sh) {
#pragma unroll
    for (int o = 16; o; o >>= 1)
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o)), hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.f0[threadIdx.x >> 5] = lo, sh.f1[threadIdx.x >> 5] = hi;
    __syncthreads();
    lo = FLT_MAX, hi = -FLT_MAX;
    for (int w = 0; w < SP_NW; w++) lo = fminf(lo, sh.f0[w]), hi = fmaxf(hi, sh.f1[w]);
}

/* The row's setting-independent view: s of token i (its weight: sp_weight(s), 0 = not a candidate). */
struct sp_row {
    const float *l;
    int V;
    float m, T;
    float s_lo; /* the lowest s of a finite logit (at least -32; weights are 0 below -31) */
    __device__ __forceinline__ float s_of(int i) const { return (l[i] - m) / T; }
};

/* Histogram bin of s within [a, b], best first: 256 equal parts of the range (monotone in s, so each bin holds the
 * tokens of an s interval). The first level spans the row's own range, so flat and peaked rows both spread out. */
static __device__ __forceinline__ int sp_bin(float s, float a, float b) {
    return b > a ? (int)fminf(255.0f, (b - s) / (b - a) * 256.0f) : 0;
}

/* The cut after which the running count (mass = 0: target = k) or weight (mass = 1: target = frac * total weight)
 * of the candidates kept by prev, walked in the order (s descending, id ascending), first reaches the target; the
 * cut keeps everything if it is never reached. */
static __device__ __noinline__ sp_cut select_cut(const sp_row &r, sp_cut prev, int mass, double k_or_frac,
                                                 sp_shared &sh) {
    const int tid = threadIdx.x;
    float a = r.s_lo, b = 0.0f;
    for (int level = 0;; level++) {
        for (int j = tid; j < SP_BINS; j += SP_T) sh.cnt[j] = 0, sh.mass[j] = 0;
        __syncthreads();
#pragma unroll 8
        for (int i = tid; i < r.V; i += SP_T) {
            const float s = r.s_of(i);
            if (!(s >= a && s <= b) || !sp_keeps(prev, s, i)) continue;
            const u64 w = sp_weight(s);
            if (!w) continue;
            const int bin = sp_bin(s, a, b);
            atomicAdd(&sh.cnt[bin], 1u);
            if (mass) atomicAdd(&sh.mass[bin], w);
        }
        __syncthreads();
        if (tid == 0) {
            double above = level == 0 ? 0.0 : sh.above, target = mass ? sh.target : k_or_frac;
            if (level == 0 && mass) {
                u64 tot = 0;
                for (int j = 0; j < SP_BINS; j++) tot += sh.mass[j];
                target = k_or_frac * (double)tot;
                sh.target = target;
            }
            int c = -1;
            for (int j = 0; j < SP_BINS; j++) {
                const double v = mass ? (double)sh.mass[j] : (double)sh.cnt[j];
                if (above + v >= target && sh.cnt[j] > 0) {
                    c = j;
                    break;
                }
                above += v;
            }
            sh.crossing = c, sh.above = above, sh.n_key = 0;
        }
        __syncthreads();
        const int c = sh.crossing;
        if (c < 0) return sp_cut{-INFINITY, 0x7fffffff}; /* fewer than k candidates (or rounding): keep them all */
        const unsigned n_c = sh.cnt[c];
        /* the crossing bin's members: their s range, or (few enough) the members themselves */
        float lo = FLT_MAX, hi = -FLT_MAX;
#pragma unroll 8
        for (int i = tid; i < r.V; i += SP_T) {
            const float s = r.s_of(i);
            if (!(s >= a && s <= b) || !sp_keeps(prev, s, i) || !sp_weight(s) || sp_bin(s, a, b) != c) continue;
            lo = fminf(lo, s), hi = fmaxf(hi, s);
            if (n_c <= SP_SORT) sh.key[atomicAdd(&sh.n_key, 1)] = sp_key(s, i);
        }
        sp_block_minmax(lo, hi, sh);
        if (n_c <= SP_SORT) break;
        if (lo == hi) { /* many tokens with one s, so one weight: the cut falls among them by id */
            const double w = (double)sp_weight(lo), left = (mass ? sh.target : k_or_frac) - sh.above;
            double need = mass ? ceil(left / w) : left;
            need = fmin(fmax(need, 1.0), (double)n_c);
            int ilo = 0, ihi = r.V; /* the need-th lowest id among them lies in [ilo, ihi) */
            unsigned before = 0;
            while (ihi - ilo > 1) {
                for (int j = tid; j < SP_BINS; j += SP_T) sh.cnt[j] = 0;
                __syncthreads();
                const long long span = ihi - ilo;
                for (int i = ilo + tid; i < ihi; i += SP_T) {
                    const float s = r.s_of(i);
                    if (s == lo && sp_keeps(prev, s, i))
                        atomicAdd(&sh.cnt[(int)((long long)(i - ilo) * SP_BINS / span)], 1u);
                }
                __syncthreads();
                int cb = SP_BINS - 1;
                unsigned acc = before;
                for (int j = 0; j < SP_BINS; j++) {
                    if (acc + sh.cnt[j] >= (unsigned)need) {
                        cb = j;
                        break;
                    }
                    acc += sh.cnt[j];
                }
                before = acc;
                const int nlo = ilo + (int)((cb * span + SP_BINS - 1) / SP_BINS);
                const int nhi = ilo + (int)(((cb + 1) * span + SP_BINS - 1) / SP_BINS);
                ilo = nlo, ihi = nhi > nlo ? nhi : nlo + 1;
                __syncthreads();
            }
            return sp_cut{lo, ilo};
        }
        if (tid == 0) sh.a = lo, sh.b = hi;
        __syncthreads();
        a = sh.a, b = sh.b;
    }
    /* at most SP_SORT members: sort them (bitonic, descending), then walk them in order */
    const int n = sh.n_key;
    for (int j = n + tid; j < SP_SORT; j += SP_T) sh.key[j] = 0;
    __syncthreads();
    for (int size = 2; size <= SP_SORT; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = tid; t < SP_SORT / 2; t += SP_T) {
                const int i = 2 * t - (t & (stride - 1)), j = i + stride;
                const bool desc = (i & size) == 0;
                const u64 x = sh.key[i], y = sh.key[j];
                if ((x < y) == desc) sh.key[i] = y, sh.key[j] = x;
            }
            __syncthreads();
        }
    if (tid < 32) {
        const double target = mass ? sh.target : k_or_frac;
        double acc = sh.above;
        int found = n - 1;
        for (int base = 0; base < n; base += 32) {
            const int j = base + tid;
            float s = 0.0f;
            int id = 0;
            if (j < n) sp_unkey(sh.key[j], s, id);
            const u64 incl = sp_warp_scan(j < n ? (mass ? sp_weight(s) : 1ull) : 0ull, tid);
            const unsigned hit = __ballot_sync(0xffffffffu, j < n && acc + (double)incl >= target);
            if (hit) {
                found = base + __ffs(hit) - 1;
                break;
            }
            acc += (double)__shfl_sync(0xffffffffu, incl, 31);
        }
        if (tid == 0) {
            float s;
            int id;
            sp_unkey(sh.key[found], s, id);
            sh.cut = sp_cut{s, id};
        }
    }
    __syncthreads();
    return sh.cut;
}

__global__ void __launch_bounds__(SP_T, 1) k_sample(float *logits, int V, const g3_dev_sample *rows,
                                                    const g3_dev_adjust *adj, int32_t *ids) {
    __shared__ sp_shared sh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float *l = logits + (size_t)blockIdx.x * V;
    const g3_dev_sample p = rows[blockIdx.x];
    /* steps 1-3: each adjusted token once */
    for (int j = tid; j < p.n_adj; j += SP_T) {
        const g3_dev_adjust e = adj[p.adj0 + j];
        float x = l[e.token] + e.bias;
        if (e.count > 0) {
            if (p.repetition_penalty != 1.0f) x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
            /* no FMA contraction: the host's rounding */
            x -= __fadd_rn(__fmul_rn((float)e.count, p.frequency_penalty), p.presence_penalty);
        }
        l[e.token] = x;
    }
    __syncthreads();
    /* step 4: max and its lowest id */
    float m = -INFINITY, lmin = INFINITY;
    int am = 0x7fffffff;
#pragma unroll 8
    for (int i = tid; i < V; i += SP_T) {
        const float x = l[i];
        if (x > m || (x == m && i < am)) m = x, am = i;
        if (x > -INFINITY) lmin = fminf(lmin, x);
    }
    g3c_warp_argmax(m, am);
#pragma unroll
    for (int o = 16; o; o >>= 1) lmin = fminf(lmin, __shfl_xor_sync(0xffffffffu, lmin, o));
    if (lane == 0) sh.f0[warp] = m, sh.i0[warp] = am, sh.f1[warp] = lmin;
    __syncthreads();
    m = sh.f0[0], am = sh.i0[0], lmin = sh.f1[0];
    for (int w = 1; w < SP_NW; w++) {
        if (sh.f0[w] > m || (sh.f0[w] == m && sh.i0[w] < am)) m = sh.f0[w], am = sh.i0[w];
        lmin = fminf(lmin, sh.f1[w]);
    }
    if (m == -INFINITY) am = 0; /* every logit -inf or NaN */
    if (p.temperature == 0.0f || m == -INFINITY || m == INFINITY) {
        if (tid == 0) ids[blockIdx.x] = am;
        return;
    }
    const sp_row r = {l, V, m, p.temperature, fmaxf((lmin - m) / p.temperature, -32.0f)};
    /* steps 6-7 */
    sp_cut ck = {-INFINITY, 0x7fffffff}, cp = ck;
    if (p.top_k > 0) ck = select_cut(r, ck, 0, (double)p.top_k, sh);
    if (p.top_p < 1.0f) cp = select_cut(r, ck, 1, (double)p.top_p, sh);
    /* step 8 and the draw: each warp owns a contiguous id range; the warp holding r walks it in order */
    const float smin = p.min_p > 0.0f ? logf(p.min_p) : -INFINITY;
    const int per = ((V + SP_NW - 1) / SP_NW + 31) & ~31, w0 = warp * per, w1 = min(V, w0 + per);
    auto kept_w = [&](int i) -> u64 {
        const float s = r.s_of(i);
        return s >= smin && sp_keeps(ck, s, i) && sp_keeps(cp, s, i) ? sp_weight(s) : 0ull;
    };
    u64 part = 0;
#pragma unroll 8
    for (int i = w0 + lane; i < w1; i += 32) part += kept_w(i);
    part = sp_warp_sum(part);
    __syncthreads();
    if (lane == 0) sh.u0[warp] = part;
    __syncthreads();
    if (tid == 0) {
        u64 z = 0;
        for (int w = 0; w < SP_NW; w++) z += sh.u0[w];
        u64 rr = (u64)(p.u * (double)z);
        if (rr >= z) rr = z ? z - 1 : 0;
        int ws = SP_NW - 1;
        for (int w = 0; w < SP_NW; w++) {
            if (rr < sh.u0[w]) {
                ws = w;
                break;
            }
            rr -= sh.u0[w];
        }
        sh.crossing = z ? ws : -1, sh.u0[0] = rr;
    }
    __syncthreads();
    if (sh.crossing < 0) {
        if (tid == 0) ids[blockIdx.x] = am;
        return;
    }
    if (warp == sh.crossing) {
        u64 rr = sh.u0[0];
        int tok = -1;
        for (int base = w0; base < w1 && tok < 0; base += 32) {
            const int i = base + lane;
            const u64 incl = sp_warp_scan(i < w1 ? kept_w(i) : 0ull, lane);
            const unsigned hit = __ballot_sync(0xffffffffu, i < w1 && rr < incl);
            if (hit) tok = base + __ffs(hit) - 1;
            else rr -= __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) ids[blockIdx.x] = tok >= 0 ? tok : am;
    }
}

cudaError_t g3c_sample(float *logits, int m, int V, const g3_dev_sample *rows, const g3_dev_adjust *adj, int32_t *ids,
                       cudaStream_t st) {
    if (m < 1) return cudaSuccess;
    k_sample<<<m, SP_T, 0, st>>>(logits, V, rows, adj, ids);
    return cudaGetLastError();
}

/* ---- test hook ---- */
extern "C" g3_status g3_cuda_test_sample(const float *logits, int m, int V, const g3_dev_sample *rows,
                                         const g3_dev_adjust *adj, int n_adj, int32_t *ids, float *adjusted,
                                         g3_error *err) {
    g3_status rc = G3_OK;
    float *dl = NULL;
    int32_t *di = NULL;
    g3_dev_sample *dr = NULL;
    g3_dev_adjust *da = NULL;
    cudaStream_t st = NULL;
    G3C_CK_GOTO(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream", out);
    G3C_CK_GOTO(cudaMalloc((void **)&dl, (size_t)m * V * 4), "alloc", out);
    G3C_CK_GOTO(cudaMalloc((void **)&di, (size_t)m * 4), "alloc", out);
    G3C_CK_GOTO(cudaMalloc((void **)&dr, (size_t)m * sizeof *dr), "alloc", out);
    G3C_CK_GOTO(cudaMalloc((void **)&da, (size_t)(n_adj > 0 ? n_adj : 1) * sizeof *da), "alloc", out);
    G3C_CK_GOTO(cudaMemset(di, 0xff, (size_t)m * 4), "poison", out);
    G3C_CK_GOTO(cudaMemcpy(dl, logits, (size_t)m * V * 4, cudaMemcpyHostToDevice), "upload", out);
    G3C_CK_GOTO(cudaMemcpy(dr, rows, (size_t)m * sizeof *dr, cudaMemcpyHostToDevice), "upload", out);
    if (n_adj > 0) G3C_CK_GOTO(cudaMemcpy(da, adj, (size_t)n_adj * sizeof *da, cudaMemcpyHostToDevice), "upload", out);
    G3C_CK_GOTO(cudaDeviceSynchronize(), "upload", out); /* legacy-stream copies before the kernel on st */
    G3C_CK_GOTO(g3c_sample(dl, m, V, dr, da, di, st), "launch", out);
    G3C_CK_GOTO(cudaStreamSynchronize(st), "run", out);
    G3C_CK_GOTO(cudaMemcpy(ids, di, (size_t)m * 4, cudaMemcpyDeviceToHost), "download", out);
    if (adjusted) G3C_CK_GOTO(cudaMemcpy(adjusted, dl, (size_t)m * V * 4, cudaMemcpyDeviceToHost), "download", out);
out:
    cudaFree(dl), cudaFree(di), cudaFree(dr), cudaFree(da);
    if (st) cudaStreamDestroy(st);
    return rc;
}
