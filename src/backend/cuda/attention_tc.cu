/* Prefill flash attention on tensor cores ($G3_CUDA_FATC=1|2; 3|4 below, the default): the flash kernel of
 * attention_prefill.cu (same row plan, tiles, masks and float32 online softmax) with both products, S = Q K^T and
 * O += P V, on mma.sync m16n8k8 TF32 in the 3xTF32 form: every float32 operand x is split into hi = tf32(x) and
 * lo = tf32(x - hi) (together ~22 mantissa bits) and a b = lo_a hi_b + hi_a lo_b + hi_a hi_b (the dropped lo_a lo_b
 * is below 2^-22 |a b|), accumulated in float32: products as accurate as the float32 CUDA-core kernel's, at
 * tensor-core rates.
 *
 * Block: 4 warps per (pair of query tiles, kv head), each warp 16 of the tile's 64 query vectors; key tiles of 64 keys
 * double-buffered in shared memory through cp.async (the next tile loads while this one is used; missing keys and
 * padding columns are zero-filled). $G3_CUDA_FATC=2: 8 warps, two groups taking alternate key tiles (see k_fa_tc).
 * Row strides are padded (Q, K: DP + 4 floats, V: DP + 8) so that the fragment loads hit 32 distinct banks. P goes
 * from the accumulator layout to the A-operand layout by quad shuffles.
 * Fragments (PTX m16n8k8 .tf32; g = lane / 4, t = lane % 4): A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4);
 * B b0 (k t, n g), b1 (k t+4, n g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1). D % 4 == 0, D <= 128.
 *
 * $G3_CUDA_FATC=3 (4: two groups, the default): the same kernel with both products on mma.sync m16n8k16 BF16 in
 * the 3xBF16 form (x = hi + lo, hi = bf16(x), lo = bf16(x - hi): ~2^-18 relative; a b = lo_a hi_b + hi_a lo_b +
 * hi_a hi_b, the dropped lo_a lo_b below 2^-18 |a b|): twice the k of a TF32 step at twice its rate, and P's A
 * fragments come straight from the accumulators of two key groups (no shuffles). Fragments (PTX m16n8k16 .bf16,
 * pairs in one register, lower column in the low half): A a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..),
 * a3 (g+8, 2t+8..); B b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C as above. V rows are padded to DP + 4 floats there
 * (key rows 2t, 2t+1 of the fragment land on distinct banks).
 *
 * A bf16 cache (KV16, the default cache where the kernels take the model; BF16 forms only, D % 8 == 0): K and V tiles
 * stay bf16 in shared memory (rows padded to DP + 8 values, 16-byte multiples), their B fragments come by ldmatrix
 * (K as stored: lane (g, t) gets key g, dims 2t, 2t+1; V transposed: keys 2t, 2t+1 of dim g), and since K and V are
 * exact in bf16 each product is two MMAs (lo_a b + hi_a b), not three. */
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

#define FT_QR 64  /* query vectors per tile: must be attention_prefill.cu's FA_QR (the row plan's tiles) */
#define FT_TK 64  /* keys per key tile */
#define FT_NT 128 /* threads of a group: 4 warps x 16 query vectors */

static __device__ __forceinline__ void tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    uint32_t h, l;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(x));
    const float r = x - __uint_as_float(h); /* exact */
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(l) : "f"(r));
    hi = h, lo = l;
}

static __device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* hi + lo of two floats as bf16 pairs (x in the low half) */
static __device__ __forceinline__ void bf_split2(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y); /* the differences are exact */
    memcpy(&hi, &h, 4), memcpy(&lo, &l, 4);
}

static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d += a b in 3xBF16 (small terms first); b = (b00, b01) in b0, (b10, b11) in b1 */
static __device__ __forceinline__ void mma3_bf(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                               float b00, float b01, float b10, float b11) {
    uint32_t bh0, bl0, bh1, bl1;
    bf_split2(b00, b01, bh0, bl0), bf_split2(b10, b11, bh1, bl1);
    mma_bf16(d, al, bh0, bh1);
    mma_bf16(d, ah, bl0, bl1);
    mma_bf16(d, ah, bh0, bh1);
}

/* d += a b in 3xTF32 (small terms first) */
static __device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                            float b0, float b1) {
    uint32_t bh0, bl0, bh1, bl1;
    tf32_split(b0, bh0, bl0), tf32_split(b1, bh1, bl1);
    mma_tf32(d, al, bh0, bh1);
    mma_tf32(d, ah, bl0, bl1);
    mma_tf32(d, ah, bh0, bh1);
}

static __device__ __forceinline__ void cp16(float *dst, const float *src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}

static __host__ __device__ constexpr int ft_vs(int dp, bool bf) { return dp + (bf ? 4 : 8); } /* V row stride */
/* K / V row strides in elements: floats DP + 4 (K), ft_vs (V); bf16 caches (KV16) DP + 8 for both (rows of 16-byte
 * multiples for ldmatrix, 8 rows on distinct banks) */
static __host__ __device__ constexpr int ft_ks(int dp, bool kv16) { return kv16 ? dp + 8 : dp + 4; }
static __host__ __device__ constexpr int ft_vsx(int dp, bool bf, bool kv16) { return kv16 ? dp + 8 : ft_vs(dp, bf); }
/* bytes of Q (floats), 2 x K and 2 x V (floats or bf16); the two-group merge reuses the K slots as FT_QR x (DP + 4)
 * floats, which fit in either form */
static __host__ __device__ constexpr int ft_bytes(int dp, bool bf, bool kv16) {
    return 4 * FT_QR * (dp + 4) + (kv16 ? 2 : 4) * 2 * FT_TK * (ft_ks(dp, kv16) + ft_vsx(dp, bf, kv16));
}
static size_t ft_smem(int dp, bool bf, bool kv16) {
    return (size_t)ft_bytes(dp, bf, kv16) + sizeof(const void *) * 4 * FT_TK + sizeof(int) * 3 * FT_QR;
}

/* two 8x8 b16 matrices per pair of registers from shared memory, rows given by lanes 8i..8i+7 for matrix i; .trans:
 * lane (g, t) gets elements (2t, g), (2t+1, g) of each matrix, else (g, 2t), (g, 2t+1) */
template <bool TR> static __device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if constexpr (TR)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}
/* d += a b with b exact in bf16 (a bf16 cache's K or V): two MMAs, small term first */
static __device__ __forceinline__ void mma2_bf(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                               uint32_t b0, uint32_t b1) {
    mma_bf16(d, al, b0, b1);
    mma_bf16(d, ah, b0, b1);
}

/* Barrier of one group of 128 threads (NG = 2: named barriers 1 and 2; barrier 0 is __syncthreads). */
template <int NG> static __device__ __forceinline__ void gbar(int gi) {
    if (NG == 1) __syncthreads();
    else asm volatile("bar.sync %0, 128;" ::"r"(1 + gi) : "memory");
}

/* NG = 1: 4 warps, key tiles double-buffered (slots 0, 1). NG = 2: 8 warps in two groups of 4, group gi takes the key
 * tiles it = gi, gi + 2, ... into its own slot gi (its loads overlap the other group's math), synchronized by its own
 * barrier; the groups' (max, sum, O) are merged through shared memory at the end of each pass. */
template <int DP, int NG, bool BF, bool KV16>
__global__ void __launch_bounds__(FT_NT * NG, 1) k_fa_tc(g3c_attn_args a, const float *__restrict__ q,
                                                       const int32_t *__restrict__ fa_useq, float *__restrict__ o,
                                                       __nv_bfloat16 *__restrict__ oh, int split) {
    using KT = typename std::conditional<KV16, __nv_bfloat16, float>::type; /* cache element */
    constexpr int QS = DP + 4, KS = ft_ks(DP, KV16), VS = ft_vsx(DP, BF, KV16), NJ = DP / 8;
    constexpr int CE = 16 / (int)sizeof(KT), CC = DP / CE; /* elements per 16-byte copy, copies per row */
    constexpr int MS = DP + 4;                              /* row stride of the two-group merge's O (floats) */
    static_assert(!BF || DP % 16 == 0, "3xBF16 steps of 16 dims");
    static_assert(!KV16 || BF, "bf16 caches on the BF16 form only");
    extern __shared__ __align__(16) float fsm[];
    float *Qs = fsm;
    KT *Ks = (KT *)(Qs + FT_QR * QS), *Vs = Ks + 2 * FT_TK * KS;
    const KT **kptr = (const KT **)((unsigned char *)fsm + ft_bytes(DP, BF, KV16)), **vptr = kptr + 2 * FT_TK;
    int *su = (int *)(vptr + 2 * FT_TK), *sp = su + FT_QR, *slo = sp + FT_QR;
    g3c_pdl_wait();
    const int tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
    const int gi = NG == 2 ? tid >> 7 : 0, gt = tid & (FT_NT - 1); /* group, thread in the group */
    const int D = a.D, G = a.NH / a.NKV, TQ = FT_QR / G, kh = blockIdx.y;
    const int n_tiles = (a.m + TQ - 1) / TQ;
    for (int pass_t = 0; pass_t < 2; pass_t++) {
        const int tile = pass_t == 0 ? n_tiles - 1 - (int)blockIdx.x : (int)blockIdx.x;
        if (pass_t == 1 && tile >= n_tiles - 1 - (int)blockIdx.x) break; /* the middle tile once */
        if (tile < 0) break;
        const int r0 = tile * TQ;
        __syncthreads(); /* shared memory of the previous tile is no longer read */
        if (tid < TQ) {
            const int r = r0 + tid;
            int u = -1, p = -1, lo = 0;
            if (r < a.m) {
                const int uu = a.rows.useq[r];
                if (uu >= 0 && fa_useq[r] < 0) {
                    u = uu, p = a.rows.pos[r];
                    lo = a.kind == 1 ? max(0, p - a.window + 1) : 0;
                }
            }
            su[tid] = u, sp[tid] = p, slo[tid] = lo;
        }
        __syncthreads();
        int any = 0;
        for (int i = 0; i < TQ; i++) any |= su[i] >= 0;
        if (!any) continue; /* uniform */
        /* Q tile: query vector qi = tr * G + gh (row r0 + tr, head kh * G + gh); columns >= D are zeros */
        for (int e = tid; e < FT_QR * (DP / 4); e += FT_NT * NG) {
            const int qi = e / (DP / 4), c = e - qi * (DP / 4), tr = qi / G, gh = qi - tr * G, r = r0 + tr;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < a.m && su[tr] >= 0 && 4 * c < D)
                v = *(const float4 *)(q + (size_t)r * a.NH * D + (size_t)(kh * G + gh) * D + 4 * c);
            *(float4 *)(Qs + qi * QS + 4 * c) = v;
        }
        /* one pass per sequence with flash rows in this tile (in order of first row) */
        for (int t0 = 0; t0 < TQ; t0++) {
            const int u = su[t0];
            if (u < 0) continue;
            int seen = 0;
            for (int i = 0; i < t0; i++) seen |= su[i] == u;
            if (seen) continue;
            int klo = 0x7fffffff, khi = -1;
            for (int i = 0; i < TQ; i++)
                if (su[i] == u) klo = min(klo, slo[i]), khi = max(khi, sp[i]);
            int pr[2], lr[2]; /* this thread's rows 16 w + g + 8 h */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int tr = (16 * w + g + 8 * h) / G;
                const bool act = su[tr] == u;
                pr[h] = act ? sp[tr] : -1, lr[h] = act ? slo[tr] : 0x7fffffff;
            }
            float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f}, oacc[NJ][4];
#pragma unroll
            for (int j = 0; j < NJ; j++) oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.f;
            const int nkt = (khi - klo) / FT_TK + 1;
            /* key tile it into slot s: pointers (first FT_TK threads), then (all threads) the copies */
            auto ptrs = [&](int it, int s) {
                if (gt < FT_TK) {
                    const int kp = klo + it * FT_TK + gt;
                    const KT *kr = NULL, *vr = NULL;
                    if (kp <= khi) {
                        const int blk = a.rows.bt[((size_t)u * 2 + a.kind) * a.rows.mbps + kp / a.kv_block];
                        if (blk >= 0) {
                            const size_t off = (((size_t)blk * a.n_layers_kind + a.layer_in_kind) * 2) * a.NKV;
                            kr = (const KT *)a.pool + ((off + kh) * a.kv_block + kp % a.kv_block) * D;
                            vr = (const KT *)a.pool + ((off + a.NKV + kh) * a.kv_block + kp % a.kv_block) * D;
                        }
                    }
                    kptr[s * FT_TK + gt] = kr, vptr[s * FT_TK + gt] = vr;
                }
            };
            auto copies = [&](int s) {
                KT *kd = Ks + s * FT_TK * KS, *vd = Vs + s * FT_TK * VS;
                for (int e = gt; e < FT_TK * CC; e += FT_NT) {
                    const int j = e / CC, c = e - j * CC;
                    const KT *kr = kptr[s * FT_TK + j], *vr = vptr[s * FT_TK + j];
                    const bool ok = kr != NULL && CE * c < D;
                    cp16((float *)(kd + j * KS + CE * c), (const float *)(ok ? kr + CE * c : (const KT *)a.pool),
                         ok ? 16 : 0);
                    cp16((float *)(vd + j * VS + CE * c), (const float *)(ok ? vr + CE * c : (const KT *)a.pool),
                         ok ? 16 : 0);
                }
                asm volatile("cp.async.commit_group;" ::: "memory");
            };
            __syncthreads(); /* the slots (and merge area) of the previous pass are no longer read */
            if (NG == 1) {
                ptrs(0, 0);
                __syncthreads();
                copies(0);
            }
            for (int it = gi; it < nkt; it += NG) {
                const int kb = klo + it * FT_TK, cur = NG == 1 ? it & 1 : gi;
                if (NG == 1) {
                    __syncthreads(); /* slot cur ^ 1 (tile it - 1) is no longer read */
                    if (it + 1 < nkt) ptrs(it + 1, cur ^ 1);
                    __syncthreads();
                    if (it + 1 < nkt) {
                        copies(cur ^ 1);
                        asm volatile("cp.async.wait_group 1;" ::: "memory");
                    } else {
                        asm volatile("cp.async.wait_group 0;" ::: "memory");
                    }
                } else {
                    gbar<NG>(gi); /* this group's slot (tile it - 2) is no longer read */
                    ptrs(it, cur);
                    gbar<NG>(gi);
                    copies(cur);
                    asm volatile("cp.async.wait_group 0;" ::: "memory");
                }
                gbar<NG>(gi); /* tile it (and Q) visible to the group */
                const KT *Kc = Ks + cur * FT_TK * KS, *Vc = Vs + cur * FT_TK * VS;
                const KT **kpc = kptr + cur * FT_TK;
                /* S = Q K^T: warp rows 16 w .. + 15, keys 8 j + (C layout) */
                float s[8][4];
#pragma unroll
                for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
                if constexpr (BF) { /* steps of 16 dims: A = Q rows (g, g + 8), B = K rows 8 j + g */
                    const float *q0 = Qs + (16 * w + g) * QS + 2 * t, *q1 = q0 + 8 * QS;
#pragma unroll 2
                    for (int kk = 0; kk < DP / 16; kk++) {
                        uint32_t ah[4], al[4];
                        const float2 x0 = *(const float2 *)(q0 + 16 * kk), x1 = *(const float2 *)(q1 + 16 * kk);
                        const float2 x2 = *(const float2 *)(q0 + 16 * kk + 8), x3 = *(const float2 *)(q1 + 16 * kk + 8);
                        bf_split2(x0.x, x0.y, ah[0], al[0]), bf_split2(x1.x, x1.y, ah[1], al[1]);
                        bf_split2(x2.x, x2.y, ah[2], al[2]), bf_split2(x3.x, x3.y, ah[3], al[3]);
                        if constexpr (KV16) { /* K rows 8 j + g: matrices (j, dims 16 kk +0 / +8), (j + 1, ...) */
                            const int mi = lane >> 3;
                            const KT *kb = Kc + (8 * (mi >> 1) + (lane & 7)) * KS + 16 * kk + 8 * (mi & 1);
#pragma unroll
                            for (int j = 0; j < 8; j += 2) {
                                uint32_t b[4];
                                ldsm4<false>(b, kb + 8 * j * KS);
                                mma2_bf(s[j], ah, al, b[0], b[1]), mma2_bf(s[j + 1], ah, al, b[2], b[3]);
                            }
                        } else {
#pragma unroll
                            for (int j = 0; j < 8; j++) {
                                const float *kr = (const float *)Kc + (8 * j + g) * KS + 16 * kk + 2 * t;
                                const float2 k0 = *(const float2 *)kr, k1 = *(const float2 *)(kr + 8);
                                mma3_bf(s[j], ah, al, k0.x, k0.y, k1.x, k1.y);
                            }
                        }
                    }
                } else {
                    const float *q0 = Qs + (16 * w + g) * QS + t, *q1 = q0 + 8 * QS;
#pragma unroll 2
                    for (int kk = 0; kk < NJ; kk++) {
                        uint32_t ah[4], al[4];
                        tf32_split(q0[8 * kk], ah[0], al[0]), tf32_split(q1[8 * kk], ah[1], al[1]);
                        tf32_split(q0[8 * kk + 4], ah[2], al[2]), tf32_split(q1[8 * kk + 4], ah[3], al[3]);
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const float *kr = (const float *)Kc + (8 * j + g) * KS + 8 * kk + t;
                            mma3(s[j], ah, al, kr[0], kr[4]);
                        }
                    }
                }
                /* masks and online softmax per row (h: rows g, g + 8), the row spread over the 4 lanes of a quad */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float mt = -INFINITY;
#pragma unroll
                    for (int j = 0; j < 8; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int kl = 8 * j + 2 * t + e, kp = kb + kl;
                            float x = s[j][2 * h + e] * a.scale;
                            if (a.softcap > 0.f) x = a.softcap * tanhf(x / a.softcap);
                            x = kpc[kl] != NULL && kp <= pr[h] && kp >= lr[h] ? x : -INFINITY;
                            s[j][2 * h + e] = x;
                            mt = fmaxf(mt, x);
                        }
                    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
                    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
                    const float mn = fmaxf(mrow[h], mt);
                    const float corr = mn == -INFINITY ? 1.f : expf(mrow[h] - mn);
                    float rs = 0.f;
#pragma unroll
                    for (int j = 0; j < 8; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float x = s[j][2 * h + e];
                            const float p = x == -INFINITY ? 0.f : expf(x - mn);
                            s[j][2 * h + e] = p;
                            rs += p;
                        }
                    rs += __shfl_xor_sync(0xffffffffu, rs, 1);
                    rs += __shfl_xor_sync(0xffffffffu, rs, 2);
                    lrow[h] = lrow[h] * corr + rs, mrow[h] = mn;
#pragma unroll
                    for (int j = 0; j < NJ; j++) oacc[j][2 * h] *= corr, oacc[j][2 * h + 1] *= corr;
                }
                if constexpr (BF) { /* O += P V over keys 16 kk ..: P's A fragment is key groups 2 kk, 2 kk + 1 */
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        uint32_t ah[4], al[4];
                        bf_split2(s[2 * kk][0], s[2 * kk][1], ah[0], al[0]);
                        bf_split2(s[2 * kk][2], s[2 * kk][3], ah[1], al[1]);
                        bf_split2(s[2 * kk + 1][0], s[2 * kk + 1][1], ah[2], al[2]);
                        bf_split2(s[2 * kk + 1][2], s[2 * kk + 1][3], ah[3], al[3]);
                        if constexpr (KV16) { /* transposed: matrices (keys 16 kk +0 / +8, dims 8 j), (..., 8 j + 8) */
                            const int mi = lane >> 3;
                            const KT *vb = Vc + (16 * kk + 8 * (mi & 1) + (lane & 7)) * VS + 8 * (mi >> 1);
#pragma unroll
                            for (int j = 0; j < NJ; j += 2) {
                                uint32_t b[4];
                                ldsm4<true>(b, vb + 8 * j);
                                mma2_bf(oacc[j], ah, al, b[0], b[1]), mma2_bf(oacc[j + 1], ah, al, b[2], b[3]);
                            }
                        } else {
                            const float *vr = (const float *)Vc + (16 * kk + 2 * t) * VS + g; /* keys 2t, 2t+1, +8 */
#pragma unroll
                            for (int j = 0; j < NJ; j++)
                                mma3_bf(oacc[j], ah, al, vr[8 * j], vr[VS + 8 * j], vr[8 * VS + 8 * j],
                                        vr[9 * VS + 8 * j]);
                        }
                    }
                } else {
                    /* O += P V: P's A fragments of keys 8 kk .. + 7 from the C layout (lane (g, t/2) holds columns t,
                     * t+1 as c0, c1 and c2, c3 for row g + 8; lane (g, t/2 + 2) holds t + 4) */
                    const int src0 = (lane & ~3) | (t >> 1), src1 = src0 + 2;
                    const bool odd = t & 1;
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) {
                        const unsigned all = 0xffffffffu;
                        const float x0 = __shfl_sync(all, s[kk][0], src0), x1 = __shfl_sync(all, s[kk][1], src0);
                        const float x2 = __shfl_sync(all, s[kk][2], src0), x3 = __shfl_sync(all, s[kk][3], src0);
                        const float y0 = __shfl_sync(all, s[kk][0], src1), y1 = __shfl_sync(all, s[kk][1], src1);
                        const float y2 = __shfl_sync(all, s[kk][2], src1), y3 = __shfl_sync(all, s[kk][3], src1);
                        uint32_t ah[4], al[4];
                        tf32_split(odd ? x1 : x0, ah[0], al[0]), tf32_split(odd ? x3 : x2, ah[1], al[1]);
                        tf32_split(odd ? y1 : y0, ah[2], al[2]), tf32_split(odd ? y3 : y2, ah[3], al[3]);
                        const float *vr = (const float *)Vc + (8 * kk + t) * VS + g;
#pragma unroll
                        for (int j = 0; j < NJ; j++) mma3(oacc[j], ah, al, vr[8 * j], vr[4 * VS + 8 * j]);
                    }
                }
            }
            if (NG == 2) { /* group 1's (max, sum, O) into the slots' memory, merged by group 0 */
                float *Om = (float *)Ks, *Mm = (float *)Vs, *Lm = Mm + FT_QR; /* [FT_QR][MS], [FT_QR], [FT_QR] */
                __syncthreads(); /* both groups done with their tiles */
                if (gi == 1) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = 16 * w + g + 8 * h;
                        if (t == 0) Mm[row] = mrow[h], Lm[row] = lrow[h];
#pragma unroll
                        for (int j = 0; j < NJ; j++) {
                            Om[row * MS + 8 * j + 2 * t] = oacc[j][2 * h];
                            Om[row * MS + 8 * j + 2 * t + 1] = oacc[j][2 * h + 1];
                        }
                    }
                }
                __syncthreads();
                if (gi == 0) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = 16 * w + g + 8 * h;
                        const float m1 = Mm[row], mn = fmaxf(mrow[h], m1);
                        const float f0 = mrow[h] == -INFINITY ? 0.f : expf(mrow[h] - mn);
                        const float f1 = m1 == -INFINITY ? 0.f : expf(m1 - mn);
                        lrow[h] = lrow[h] * f0 + Lm[row] * f1;
#pragma unroll
                        for (int j = 0; j < NJ; j++) {
                            oacc[j][2 * h] = oacc[j][2 * h] * f0 + Om[row * MS + 8 * j + 2 * t] * f1;
                            oacc[j][2 * h + 1] = oacc[j][2 * h + 1] * f0 + Om[row * MS + 8 * j + 2 * t + 1] * f1;
                        }
                    }
                }
            }
            /* normalized output of this pass's rows (C layout: rows g + 8 h, columns 8 j + 2 t + e) */
#pragma unroll
            for (int h = 0; h < 2 && gi == 0; h++) {
                const int qi = 16 * w + g + 8 * h, tr = qi / G, gh = qi - tr * G, r = r0 + tr;
                if (su[tr] != u || r >= a.m) continue;
                const float il = lrow[h] > 0.f ? 1.f / lrow[h] : 0.f;
                const size_t ob = (size_t)r * a.NH * D + (size_t)(kh * G + gh) * D;
#pragma unroll
                for (int j = 0; j < NJ; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int d = 8 * j + 2 * t + e;
                        if (d < D) {
                            const float val = oacc[j][2 * h + e] * il;
                            o[ob + d] = val;
                            const __nv_bfloat16 hv = __float2bfloat16_rn(val);
                            oh[ob + d] = hv;
                            if (split)
                                oh[(size_t)a.m * a.NH * D + ob + d] = __float2bfloat16_rn(val - __bfloat162float(hv));
                        }
                    }
            }
        }
    }
}

/* $G3_CUDA_FATC: 0 the CUDA-core float32 kernel (attention_prefill.cu), 1 / 2 3xTF32 with one / two groups of 4
 * warps, 3 / 4 BF16 with one / two groups; unset: 4 (where this kernel applies, g3c_fa_tc_takes: D <= 128, % 4 == 0
 * for a float32 cache, % 8 for a bf16 one, which the TF32 forms leave to the CUDA-core kernel). Measured on an H100 (27B int4 prefill tok/s, session 13 run 04): 8K prompt 3686 with 4, 3525 with 3,
 * 3405 with the CUDA-core kernel (3xTF32: 3356 against 3452 in run 01); 32K 3013 with 3 against 2774 (run 03). */
int g3c_fatc_enabled(void) {
    const char *e = getenv("G3_CUDA_FATC");
    if (!e || !*e) return 4;
    const int v = atoi(e);
    return v >= 1 && v <= 4 ? v : 0;
}

template <int DP, int NG, bool BF, bool KV16>
static cudaError_t launch_fa_tc(const g3c_attn_args *a, const float *q, const int32_t *fa_useq, float *o,
                                __nv_bfloat16 *oh, int split, cudaStream_t st) {
    static int attr_set = 0; /* dynamic shared memory beyond 48 KB, once per instantiation */
    const size_t sm = ft_smem(DP, BF, KV16);
    if (!attr_set) {
        cudaError_t e =
            cudaFuncSetAttribute(k_fa_tc<DP, NG, BF, KV16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
        attr_set = 1;
    }
    const int G = a->NH / a->NKV, tq = FT_QR / G, n_tiles = (a->m + tq - 1) / tq;
    dim3 grid((n_tiles + 1) / 2, a->NKV);
    return g3c_launch(k_fa_tc<DP, NG, BF, KV16>, grid, dim3(FT_NT * NG), sm, st, *a, q, fa_useq, o, oh, split);
}

template <int NG, bool BF, bool KV16 = false>
static cudaError_t launch_fa_tc_d(const g3c_attn_args *a, const float *q, const int32_t *fa_useq, float *o,
                                  __nv_bfloat16 *oh, int split, cudaStream_t st) {
    if (a->D <= 32) return launch_fa_tc<32, NG, BF, KV16>(a, q, fa_useq, o, oh, split, st);
    if (a->D <= 64) return launch_fa_tc<64, NG, BF, KV16>(a, q, fa_useq, o, oh, split, st);
    return launch_fa_tc<128, NG, BF, KV16>(a, q, fa_useq, o, oh, split, st);
}

/* whether g3c_fa_tc takes these arguments under the current $G3_CUDA_FATC: GQA 1, 2, 4 or 8; D % 4 == 0 and <= 128
 * for a float32 cache; a bf16 cache only in the BF16 forms (3, 4) and with D % 8 == 0 (16-byte copies of 8 values) */
int g3c_fa_tc_takes(const g3c_attn_args *a) {
    const int v = g3c_fatc_enabled();
    const int G = a->NKV > 0 && a->NH % a->NKV == 0 ? a->NH / a->NKV : 0;
    if (!v || (G != 1 && G != 2 && G != 4 && G != 8) || a->D > 128 || a->D % 4 || a->D < 4) return 0;
    return !a->kv16 || (v >= 3 && a->D % 8 == 0);
}

cudaError_t g3c_fa_tc(const g3c_attn_args *a, const float *q, const int32_t *fa_useq, float *o, __nv_bfloat16 *oh,
                      int split, cudaStream_t st) {
    if (!g3c_fa_tc_takes(a)) return cudaErrorNotSupported;
    switch (g3c_fatc_enabled()) {
    case 2: return launch_fa_tc_d<2, false>(a, q, fa_useq, o, oh, split, st);
    case 3:
        return a->kv16 ? launch_fa_tc_d<1, true, true>(a, q, fa_useq, o, oh, split, st)
                       : launch_fa_tc_d<1, true>(a, q, fa_useq, o, oh, split, st);
    case 4:
        return a->kv16 ? launch_fa_tc_d<2, true, true>(a, q, fa_useq, o, oh, split, st)
                       : launch_fa_tc_d<2, true>(a, q, fa_useq, o, oh, split, st);
    default: return launch_fa_tc_d<1, false>(a, q, fa_useq, o, oh, split, st);
    }
}
