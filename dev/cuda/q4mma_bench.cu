/* Microbenchmark of a one-row int4 product on the int8 tensor cores (mma.sync m16n8k32 u8 x s8) against the
 * persistent dp4a kernel the batch-1 forward uses (g3c_qgemv, qgemv_p.cu), on the 27B shapes.
 *
 * Why: the one-row int4 products are bound by their instruction issue and latency, not by DRAM (docs/CUDA.md, "What
 * the one-row targets need": the 27B int4 gate/up step ~278 instructions for 6 chunks a lane, DRAM 62% busy). An MMA
 * takes 512 weights a warp in one instruction where dp4a takes 4 a lane, so the weights' unpacking (one mask a word
 * and nibble plane) is what is left a weight. At one activation row 7 of the MMA's 8 columns are wasted, which the
 * tensor cores can afford (27B int4 at 250 tok/s needs ~7 TOPS of the ~1000).
 *
 * The form measured here (natural weight layout, nothing repacked): a warp takes units of (16 rows, one group of 128
 * values); lane (gid = lane / 4, t = lane % 4) loads 16 bytes of row gid and of row gid + 8 at byte 16 t of the
 * group's 64. The MMA's k order is free as long as A and B agree: the lo nibbles of words 0-1 of those chunks are
 * one MMA's A fragment (a0 / a2 row gid, a1 / a3 row gid + 8), words 2-3 a second, and the hi nibbles, masked in place
 * (16 x their value, u8), two more; B holds, for lane t, the activations of the same values, written in that order by
 * the block's quantization into shared memory (x per group of 128: q = rint(x 127 / amax)). Every column of B is the
 * same vector, so every lane ends with its two rows' sums: 16 lo + hi in one shift-add, scaled by s d / 16 and the
 * offset by z d sum(q). Units are split in equal contiguous ranges over the warps (stream-K: a warp adds each tile's
 * partial sums into y atomically, y zeroed first), K in slices for long rows so that each block quantizes only the
 * groups it uses. The first D units' weights are requested before the launch wait.
 *
 *   g3q4mma_bench [launches per graph, 20] [depth check: 1] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/q4r_frag.cuh"
#include "model/dtype.h"

#include "dev_check.cuh"


/* 16 weight bytes; H: with the L2 256-byte prefetch hint and no L1 allocation */
template <bool H> static __device__ __forceinline__ uint4 q4m_ld(const uint8_t *p) {
    if constexpr (H) return q4r_ld(p);
    else return __ldg((const uint4 *)p);
}


/* units: (slice, tile of 16 rows, block of G groups of the slice), slice-major; gs groups a slice */
template <int D, int G, bool H, int Q4M_T>
__global__ void __launch_bounds__(Q4M_T, 1)
    k_q4mma(const uint8_t *__restrict__ W, const float *__restrict__ S, const float *__restrict__ Z,
            const float *__restrict__ x, float *__restrict__ y, int n, int K, int gs) {
    extern __shared__ __align__(16) unsigned char q4m_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, t = lane & 3;
    const int ngr = K / 128, ntile = n / 16, gb = gs / G, per_slice = ntile * gb;
    const q4r_range rg = q4r_split(ntile, gb, gs, ngr, Q4M_T / 32);
    const int u0 = rg.u0, u1 = rg.u1, g_lo = rg.g_lo, g_hi = rg.g_hi;
    unsigned char *sq = q4m_sm;                                    /* [g_hi - g_lo][128] quantized, lane order */
    float2 *sd = (float2 *)(q4m_sm + (size_t)(g_hi - g_lo) * 128); /* (d / 16, d * sum q) a group */
    const size_t rb = (size_t)K / 2;

    /* load iterator: pointers to row gid's chunk and scales of the next unit to load; they stop at the range's last
     * unit, so that the loads past it (the pipeline's last D) need no predicate */
    int ls = u0 / per_slice, ltile = (u0 % per_slice) / gb, lrem = gb - (u0 % per_slice) % gb;
    const uint8_t *wp = W + ((size_t)ltile * 16 + gid) * rb + (size_t)(ls * gs + (gb - lrem) * G) * 64 + t * 16;
    const float *sp = S + ((size_t)ltile * 16 + gid) * ngr + ls * gs + (gb - lrem) * G;
    const float *zp = Z + (sp - S);
    const size_t r8b = 8 * rb, r8s = (size_t)8 * ngr;
    int lleft = u1 - u0; /* units still to load */
    auto load = [&](q4r_unit<G, 1> &b) {
#pragma unroll
        for (int j = 0; j < G; j++) b.wa[j] = q4m_ld<H>(wp + 64 * j), b.wb[j] = q4m_ld<H>(wp + r8b + 64 * j);
#pragma unroll
        for (int j = 0; j < G; j++)
            b.sa[j] = __ldg(sp + j), b.sb[j] = __ldg(sp + r8s + j), b.za[j] = __ldg(zp + j), b.zb[j] = __ldg(zp + r8s + j);
        if (--lleft > 0) {
            wp += 64 * G, sp += G, zp += G;
            if (--lrem == 0) { /* the next tile of the slice, or the first of the next slice */
                lrem = gb;
                if (++ltile == ntile) ltile = 0, ls++;
                wp = W + ((size_t)ltile * 16 + gid) * rb + (size_t)ls * gs * 64 + t * 16;
                sp = S + ((size_t)ltile * 16 + gid) * ngr + ls * gs;
                zp = Z + (sp - S);
            }
        }
    };
    q4r_unit<G, 1> buf[D];
#pragma unroll
    for (int d = 0; d < D; d++) load(buf[d]);

    g3c_pdl_wait();
    /* quantize the block's groups of x: warp per group, lane l holds values 4l..4l+3 */
    for (int g = g_lo + warp; g < g_hi; g += Q4M_T / 32) {
        const float4 v = __ldg((const float4 *)(x + (size_t)g * 128) + lane);
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float inv = amax > 0.f ? 127.f / amax : 0.f, dd = amax / 127.f;
        const int q0 = __float2int_rn(__fmul_rn(v.x, inv)), q1 = __float2int_rn(__fmul_rn(v.y, inv)),
                  q2 = __float2int_rn(__fmul_rn(v.z, inv)), q3 = __float2int_rn(__fmul_rn(v.w, inv));
        int sum = q0 + q1 + q2 + q3;
#pragma unroll
        for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        /* values 4l + e, e = 0..3: lane t' = l / 8, word j = (l % 8) / 2, e' = 4 (l % 2) + e; even e' -> lo plane */
        unsigned char *gq = sq + (size_t)(g - g_lo) * 128 + (lane >> 3) * 16 + ((lane & 7) >> 1) * 4 + (lane & 1) * 2;
        *(uint16_t *)gq = (uint16_t)((q0 & 255) | (q2 & 255) << 8);
        *(uint16_t *)(gq + 64) = (uint16_t)((q1 & 255) | (q3 & 255) << 8);
        if (lane == 0) sd[g - g_lo] = make_float2(dd * (1.f / 16.f), dd * (float)sum);
    }
    __syncthreads();

    int ctile = (u0 % per_slice) / gb, crem = gb - (u0 % per_slice) % gb;
    int cgl = (u0 / per_slice) * gs + (gb - crem) * G - g_lo; /* the unit's first group in the block's copy */
    float acc_a = 0.f, acc_b = 0.f;
    auto step = [&](q4r_unit<G, 1> &b, bool last) {
        uint32_t lo[G][8], hi[G][8];
        float sa[G], sb[G], za[G], zb[G];
        q4r_take(b, lo, hi, sa, sb, za, zb);
        load(b); /* the unit D ahead into the same slot */
#pragma unroll
        for (int j = 0; j < G; j++) {
            const unsigned char *gq = sq + (size_t)(cgl + j) * 128 + t * 16;
            const uint4 xl = *(const uint4 *)gq, xh = *(const uint4 *)(gq + 64);
            const float2 dx = sd[cgl + j];
            int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
            q4r_group(cl, ch, lo[j], hi[j], xl.x, xl.y, xl.z, xl.w, xh.x, xh.y, xh.z, xh.w);
            const float fa = (float)((cl[0] << 4) + ch[0]), fb = (float)((cl[2] << 4) + ch[2]);
            acc_a = fmaf(sa[j] * dx.x, fa, fmaf(za[j], dx.y, acc_a));
            acc_b = fmaf(sb[j] * dx.x, fb, fmaf(zb[j], dx.y, acc_b));
        }
        cgl += G;
        if (--crem == 0 || last) { /* the tile's (or the range's) last unit: its rows' sums into y */
            if (t == 0) {
                atomicAdd(y + (size_t)ctile * 16 + gid, acc_a);
                atomicAdd(y + (size_t)ctile * 16 + gid + 8, acc_b);
            }
            acc_a = acc_b = 0.f;
            q4r_next_tile(crem, gb, ctile, ntile, cgl, gs);
        }
    };
    q4r_units(buf, u0, u1, step);
}

static size_t q4m_smem(int K) { return (size_t)K + (size_t)(K / 128) * 8; }

template <int D, int G, bool H, int NT>
static cudaError_t q4mma(const g3_dmat *w, const float *x, float *y, int slices, int sms, cudaStream_t st) {
    const int gs = (w->k / 128) / slices;
    if (gs % G) return cudaErrorInvalidValue;
    static int done;
    if (!done) {
        CK(cudaFuncSetAttribute(k_q4mma<D, G, H, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
        done = 1;
    }
    return g3c_launch(k_q4mma<D, G, H, NT>, dim3(sms), dim3(NT), q4m_smem(w->k), st, (const uint8_t *)w->q,
                      (const float *)w->s, (const float *)w->z, x, y, w->n, w->k, gs);
}

#define NV 6
static const char *vname[NV] = {"D4 G1 T512", "D4 G1 hint T512", "D4 G1 hint T384", "D2 G2 hint T384",
                                "D3 G2 hint T384", "D2 G3 hint T384"};
static cudaError_t q4mma_v(int v, const g3_dmat *w, const float *x, float *y, int slices, int sms, cudaStream_t st) {
    switch (v) {
    case 0: return q4mma<4, 1, false, 512>(w, x, y, slices, sms, st);
    case 1: return q4mma<4, 1, true, 512>(w, x, y, slices, sms, st);
    case 2: return q4mma<4, 1, true, 384>(w, x, y, slices, sms, st);
    case 3: return q4mma<2, 2, true, 384>(w, x, y, slices, sms, st);
    case 4: return q4mma<3, 2, true, 384>(w, x, y, slices, sms, st);
    default: return q4mma<2, 3, true, 384>(w, x, y, slices, sms, st);
    }
}

/* what the forward does: y cleared by a kernel before (here a memset node, the same in both graphs) */
static double time_one(const g3_dmat *w, const float *x, float *y, int kind, int slices, int sms, int nl,
                       cudaStream_t st) {
    static const int vg[NV] = {1, 1, 1, 2, 2, 3};
    if (kind >= 0 && ((w->k / 128) / slices) % vg[kind]) return NAN; /* the variant's groups do not divide a slice */
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < nl; i++) {
        if (kind < 0) CK(g3c_qgemv(w, x, w->k, 1, y, w->n, 0, NULL, 0, st));
        else CK(q4mma_v(kind, w, x, y, slices, sms, st));
    }
    return replay_us(st, nl);
}

int main(int argc, char **argv) {
    const int nl = argc > 1 ? atoi(argv[1]) : 20;
    setvbuf(stdout, NULL, _IOLBF, 0);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(g3c_qgemv_init());
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int KX = 21504, NX = 172032;
    float *x, *y;
    CK(cudaMalloc((void **)&x, KX * 4));
    CK(cudaMalloc((void **)&y, (size_t)NX * 4));
    std::vector<float> hx(KX);
    {
        g3_dmat xd;
        memset(&xd, 0, sizeof xd);
        xd.qt = G3Q_BF16, xd.n = 1, xd.k = xd.g = KX;
        CK(cudaMalloc(&xd.q, KX * 2));
        CK(g3c_fill_random_bf16((__nv_bfloat16 *)xd.q, KX, 1.f, 7, st));
        CK(g3c_dequant_f32(&xd, x, st));
        CK(cudaStreamSynchronize(st));
        cudaFree(xd.q);
        CK(cudaMemcpy(hx.data(), x, KX * 4, cudaMemcpyDeviceToHost));
    }
    struct shape { const char *name; int n, k, slices; } sh[] = {
        {"qkv", 8192, 5376, 1},   {"o", 5376, 4096, 1},        {"gate/up (plain)", 43008, 5376, 1},
        {"down", 5376, 21504, 4}, {"down x4", 21504, 21504, 4}, {"gate/up x4", 172032, 5376, 1},
    };
    printf("| product | n x k | MB | dp4a (g3c_qgemv) us |");
    for (int j = 0; j < NV; j++) printf(" mma %s |", vname[j]);
    printf(" best mma / dp4a | max err mma D3 G2 T384 (exact emulation) | err mma / err dp4a vs W x |\n|---|---|---|---|");
    for (int j = 0; j < NV; j++) printf("---|");
    printf("---|---|---|\n");
    int fails = 0;
    for (int i = 0; i < (int)(sizeof sh / sizeof sh[0]); i++) {
        g3_dmat w;
        g3_error err = {};
        int g = 0;
        const int qt = g3c_target_format(G3_DTYPE_BF16, G3Q_INT4, sh[i].k, &g);
        if (qt != G3Q_INT4 || g != 128) { fprintf(stderr, "int4 groups of 128 expected\n"); return 1; }
        if (g3cb_alloc_dmat(&w, qt, sh[i].n, sh[i].k, g, &err) != G3_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
        __nv_bfloat16 *src;
        CK(cudaMalloc((void **)&src, (size_t)w.n * w.k * 2));
        CK(g3c_fill_random_bf16(src, (size_t)w.n * w.k, 0.02f, 11 + i, st));
        CK(g3c_convert_rows(src, G3_DTYPE_BF16, w.n, &w, 0, 1, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaFree(src));
        const int n = w.n, K = w.k, ngr = K / 128;
        const int check = i < 4; /* the x4 shapes: timings only (the host reference takes seconds) */
        /* correctness: both kernels once, against W x in double and against an exact emulation of the mma form */
        std::vector<float> ym(n), yd(n);
        CK(cudaMemsetAsync(y, 0, (size_t)n * 4, st));
        CK(q4mma_v(4, &w, x, y, sh[i].slices, sms, st));
        CK(cudaMemcpyAsync(ym.data(), y, (size_t)n * 4, cudaMemcpyDeviceToHost, st));
        CK(cudaMemsetAsync(y, 0, (size_t)n * 4, st));
        CK(g3c_qgemv(&w, x, K, 1, y, n, 0, NULL, 0, st));
        CK(cudaMemcpyAsync(yd.data(), y, (size_t)n * 4, cudaMemcpyDeviceToHost, st));
        std::vector<uint8_t> hq((size_t)n * K / 2);
        std::vector<float> hs((size_t)n * ngr), hz((size_t)n * ngr);
        CK(cudaMemcpyAsync(hq.data(), w.q, hq.size(), cudaMemcpyDeviceToHost, st));
        CK(cudaMemcpyAsync(hs.data(), w.s, hs.size() * 4, cudaMemcpyDeviceToHost, st));
        CK(cudaMemcpyAsync(hz.data(), w.z, hz.size() * 4, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        std::vector<int> xq(K);
        std::vector<double> xd(ngr), xs(ngr);
        for (int gg = 0; gg < ngr; gg++) {
            float amax = 0.f;
            for (int j = 0; j < 128; j++) amax = fmaxf(amax, fabsf(hx[gg * 128 + j]));
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            long s = 0;
            for (int j = 0; j < 128; j++) s += xq[gg * 128 + j] = (int)nearbyintf(hx[gg * 128 + j] * inv);
            xd[gg] = amax / 127.f, xs[gg] = (double)(amax / 127.f) * (double)s;
        }
        double emax = 0, ymax = 0, em = 0, ed = 0;
        for (int r = 0; r < (check ? n : 0); r++) {
            double ye = 0, yt = 0;
            for (int gg = 0; gg < ngr; gg++) {
                long sq = 0;
                double st_ = 0, sx = 0;
                for (int j = 0; j < 128; j++) {
                    const int kk = gg * 128 + j, byte = hq[(size_t)r * (K / 2) + kk / 2];
                    const int qv = kk & 1 ? byte >> 4 : byte & 15;
                    sq += (long)qv * xq[kk];
                    st_ += qv * (double)hx[kk], sx += hx[kk];
                }
                const double s = hs[(size_t)r * ngr + gg], z = hz[(size_t)r * ngr + gg];
                ye += s * xd[gg] * (double)sq + z * xs[gg];
                yt += s * st_ + z * sx;
            }
            emax = fmax(emax, fabs(ye - ym[r])), ymax = fmax(ymax, fabs(yt));
            em = fmax(em, fabs(yt - ym[r])), ed = fmax(ed, fabs(yt - yd[r]));
        }
        const int ok = !check || emax <= 1e-5 * ymax;
        fails += !ok;
        /* timings */
        const double td = time_one(&w, x, y, -1, 1, sms, nl, st);
        double tm[NV], best = 1e30;
        char cols[256] = "";
        for (int j = 0; j < NV; j++) {
            tm[j] = time_one(&w, x, y, j, sh[i].slices, sms, nl, st);
            if (tm[j] == tm[j]) best = fmin(best, tm[j]);
            snprintf(cols + strlen(cols), sizeof cols - strlen(cols), " %.2f |", tm[j]);
        }
        printf("| %s | %d x %d | %.1f | %.2f |%s %.3f | %.2e of max|y| %s | %.2f |\n", sh[i].name, n, K,
               w.bytes / 1e6, td, cols, best / td, check ? emax / ymax : 0., check ? (ok ? "ok" : "FAIL") : "not checked", check ? em / ed : 0.);
        g3cb_free_dmat(&w);
    }
    printf("%d shapes failed the exact-emulation check\n", fails);
    cudaFree(x), cudaFree(y);
    cudaStreamDestroy(st);
    return fails ? 1 : 0;
}
