/* Batched products on per-channel int8 weights with Hopper's warpgroup MMA (wgmma, s8 x s8 -> s32): y += x W^T; the
 * same kernel for per-channel fp8 (e4m3) weights with e4m3 x e4m3 -> f32 MMAs (F8, at the end of this comment).
 * Taken by g3c_tq_mm / g3c_tq_mm_pre for int8 per channel from 33 rows ($G3_CUDA_WGMIN; below, tc_q8.cu's mma.sync
 * kernel is faster) up to 64, and by g3c_mm for decode batches of 65..256 distinct sequences (g3c_mm_ctx.qact) in
 * one or two launches of up to 128 rows, where the weights were dequantized to bf16 for cuBLAS before.
 * $G3_CUDA_WG=0: the previous paths.
 *
 * Measured on the H200 (27B int8, g3cuda_bench aggregate decode tok/s, argmax on the GPU; session 7 run 5, default
 * against $G3_CUDA_WG=0): 64 seqs 4260 against 3803, 128 seqs 5266 against 2446, 256 seqs 5051 against 3250.
 * At 64 rows the products stream at ~0.73 of the bandwidth (dev/cuda/wg_bench.cu, session 8: gate/up 68 us for
 * 231 MB, the loads alone 57): each block waits for its stage's MMAs before scaling their sums, and throughput comes
 * from three independent blocks per SM, which hide the MMAs and the scaling (measured: removing either changes
 * nothing); what remains is mostly the output of the stream-K shares at the end of the kernel.
 *
 * Data: the activations are quantized per row and block of 128 values (tq_act.cuh: d = amax/127, natural order),
 * so one 128-byte row segment of weights and activations is one stage: int32 sums of a stage are exact, turned into
 * float and scaled by the token's d of that block (y += d acc), the channel scale applied once at the end. That
 * rounding of the activations is the price of the path (small-a fixture, int8: KL 0.028 against 0.018 with bf16
 * activations; test_cuda_model), which is why prefill chunks beyond 64 rows keep cuBLAS.
 *
 * Roles: A = activations (M = 64 tokens per MMA), B = weights (N = channels), both K-major (the only layout wgmma
 * takes for 8-bit types), so D[token][channel] and each thread holds pairs of adjacent channels of a token: float2
 * atomics into y [m][n] (y holds zeros on entry, as for every tensor-core product). One warpgroup per block, BM
 * tokens x BN channels per tile: 64 x 128 (m64n128k32) up to 64 rows, 128 x 64 (two m64n64k32 per k step on the
 * same weights) beyond.
 *
 * Shared memory: a ring of ST stages, each the weight tile [BN rows][128 B] then the activation tile [BM][128 B], in
 * the 128-byte swizzle wgmma expects (16-byte chunk c of row r at chunk c ^ (r & 7), tiles 1024-byte aligned;
 * descriptor: stride 1024 B between 8-row groups, K advanced by adding 32 B to the start address), plus the tokens' d
 * per stage and the channel scales of the block's first two tiles (read at the start). Copies by cp.async from all
 * threads, ST - 1 stages in flight (the weights of the first stages are requested before the programmatic-launch wait:
 * they do not depend on the previous kernel), their addresses kept from unit to unit: the form before rebuilt each
 * copy's address from the unit index (a 64-bit division, ~250 of ~640 instructions a unit and warp; now ~375), and the
 * kernel is bound by its instruction issue (Nsight Compute, session 25 run 04: the 64-row gate/up product 1.42x slower
 * at the profiler's 1.31 GHz clock than in the forward, issue slots 51% busy with 2.9 warps a scheduler). H200 session
 * 26 run 01, A/B/A/B, aggregate decode tok/s against the addresses rebuilt: 27B int8 64 / 128 / 256 seqs 5470 /
 * 6285-6301 / 5948-5951 against 5300-5305 / 5761-5773 / 5340-5346, fp8 32 / 64 / 128 / 256 2733-2737 / 4725-4732 /
 * 5145-5162 / 5188-5189 against 2464-2465 / 4062-4111 / 4184-4186 / 4231-4235; 4B int8 +6-7%, fp8 +13-16%, 1B +1-7%;
 * alone (g3wg_bench, 64 rows) qkv / gate/up / down 16.2 / 67.0 / 34.2 against 18.6 / 67.7 / 36.2 us. Rows >= m of the
 * activation tiles are zeroed once and never loaded. Work: a block takes an equal contiguous range of the (channel
 * tile, stage) units, so small matrices split K across blocks (stream-K, atomic adds); where the tiles fill >= 3/4 of
 * the resident slots, a block takes one whole tile instead (wg_tile_blocks). The block's last share (BR,
 * $G3_CUDA_WGBR=0: off) is written into the idle ring as [token][channel] rows and added into y by one bulk reduction
 * per row (cp.reduce.async.bulk .add.f32) instead of 8-byte atomics from every thread; shares that end mid-kernel keep
 * the atomics (the ring is busy then). Measured on the H200 (session 19 run 01, 27B, 64 rows): alone (g3wg_bench) qkv /
 * o / gate/up / down 18.6 / 12.3 / 67.4 / 36.3 us against 19.4 / 13.0 / 68.1 / 37.0; in the replayed step (CUPTI) the o
 * product 1 us faster, the others the same, a layer 185.4 against 186.3 us; aggregate decode within noise at 27B (int8
 * 64 seqs 5247 / 5226 against 5221 / 5220), +1-2% at 4B / 1B int8 128-256 seqs.
 *
 * fp8 (F8; g3c_tq_mm from 33 rows, g3c_tq_mm_pre when the producers wrote the parts): the weights are e4m3 bytes in
 * the int8 layout, so tiles, swizzle and copies are the same; the activations come as two e4m3 parts per value, hi =
 * e4m3(x/d) and lo = e4m3(x/d - hi) with d = amax/448 per row and block of 128 (tq_act.cuh), hi in rows [0, m) and
 * lo in rows [mo, mo + m) of xq. Up to 32 rows (mo = m): a 64-row tile whose rows m..2m-1 are the lo parts, added
 * into y as rows of their own. 33..64 rows (mo = 64): the hi and lo tiles of the same 64 tokens are the two halves of
 * a 128-row stage and go through two MMAs into one accumulator (same d), 128 channels a tile, so the registers are
 * those of the int8 64-row kernel; two stages of 32 KB, three blocks per SM ($G3_CUDA_WGFST=3: three, two). e4m3
 * MMAs keep fewer bits in their sums than float32, which is why each stage's sums are still scaled and added in
 * float32 (test_matmul_wgmma_fp8: within 2.1e-4 / 1.03e-3 of max|y| of an exact emulation at k = 5376). Measured on
 * the H100 (session 16, run 05, aggregate decode tok/s, argmax on the GPU, against the staged bf16 kernel): 27B fp8
 * 64 seqs 3765 against 2539, 128 seqs 3323 against 2576; 4B 64 seqs 13245 against 11553; 1B 26502 against 24651; at
 * 17..32 rows slower at 4B / 1B (7559 / 14819 against 8319 / 17996 at 32 seqs), so from 33 rows ($G3_CUDA_WGFMIN).
 * 65..128 rows (decode batches, g3c_mm; mo = 128): the warpgroups of a block read one weight tile of 128 channels,
 * each against the hi and lo tiles of its 64 tokens, so a 128-row batch reads the weights once instead of once per
 * launch of 64 (128 tokens in one warpgroup would need twice the accumulators): four warpgroups (NWG 4: two token
 * groups x two channel groups of 64, 114 registers) or two (NWG 2, 128 channels each, 152 registers;
 * $G3_CUDA_WGF2W=2); three stages of 48 KB, one block per SM ($G3_CUDA_WGF2ST=4: four). Measured on the H100
 * (session 17, run 02, against launches of <= 64, $G3_CUDA_WGF2=0): 27B fp8 128 / 256 seqs 3975 / 4014 against 3299
 * / 3261; 4B 17154 / 17930 against 13829 / 14483 and 1B 34637 / 38296 against 28427 / 30745 with every matrix taking
 * it (the launches of 64 kept the staged kernel for matrices of < 16 M weights); four stages 3890 / 3908 at 27B
 * (all with two warpgroups; four: +0-3%, wgf2_groups below). At
 * 128 rows the products run at ~0.35 of the bandwidth (CUPTI: gate/up 213 us for 231 MB): each 16 KB weight stage
 * brings 32 KB of activations from L2. */
/* GeGLU in the last step (GG, g3c_wg_mm_geglu; 33..64 rows where the gate/up product takes whole tiles): each block
 * applies GeGLU to its tile's 64 (gate, up) pairs and the second block of each pair of tiles quantizes their 128
 * values for the down product (wg_geglu_out), so no GeGLU launch follows and y is not touched. By default for int8
 * and fp8 (wg_gg_mode has the measurements). Every k_wg8 block lets the next kernel be scheduled after its K loop
 * (wg_late). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/tq_act.cuh"
#include "backend/cuda/wgmma.cuh"

#define WG_T 128 /* one warpgroup */

template <int BM, int BN, int ST> struct wg_cfg {
    static constexpr int WB = BN * 128, XB = BM * 128, SB = WB + XB; /* bytes of a stage (multiple of 1024) */
    static constexpr int SMEM = ST * SB + ST * BM * 4 + 2 * BN * 4 + 1024; /* + d [ST][BM] + scales [2][BN] + slack */
};

/* A stage's sums as float: int32 exact (|sum| <= 128 * 128 * 127), e4m3 products already float */
template <bool F8> struct wg_acc {
    typedef int T;
    static __device__ __forceinline__ float f(int v) { return g3c_i2f_exact(v); }
};
template <> struct wg_acc<true> {
    typedef float T;
    static __device__ __forceinline__ float f(float v) { return v; }
};

/* The GeGLU epilogue of a whole channel tile tl of interleaved (gate, up) channels (g3c_wg_mm_geglu): the tile's sums,
 * scaled, are in shared memory as rows [token][128 channels] of RS bytes. Each warp takes tokens wq, wq + 4, ...;
 * lane l makes GeGLU values 2l, 2l + 1 of the tile's 64 (h index 64 tl + j) into shared memory and into gg.h. The
 * tiles 2q and 2q + 1 make the 128 values of quantization block q: the block that arrives second at gg.cnt[q] (so
 * that the other's gg.h stores are visible to it) quantizes them, 32 lanes x 4 values as k_geglu4 does (the same
 * arithmetic: both paths give the same bytes for the same sums), and clears the counter for the next launch. No
 * block waits for another, so the grid need not be resident at once. */
template <int TOKS, int RS, int RING>
static __device__ __forceinline__ void wg_geglu_out(uint8_t *sm, int tl, int m, int F, int wq, int lane, int tid,
                                                    const g3c_wg_gg &gg) {
    float *hs = (float *)(sm + TOKS * RS); /* [TOKS][64] */
    unsigned *flag = (unsigned *)(hs + TOKS * 64);
    static_assert(TOKS * RS + TOKS * 64 * 4 + 16 <= RING, "the GeGLU rows fit in the ring");
    for (int tok = wq; tok < m && tok < TOKS; tok += 4) {
        const float4 p = *(const float4 *)(sm + tok * RS + 16 * lane);
        const float2 h = gg.tanhf ? make_float2(gelu_tanh_ref(p.x) * p.y, gelu_tanh_ref(p.z) * p.w)
                                  : make_float2(gelu_tanh(p.x) * p.y, gelu_tanh(p.z) * p.w);
        *(float2 *)(hs + tok * 64 + 2 * lane) = h;
        __stcg((float2 *)(gg.h + (size_t)tok * F + 64 * tl + 2 * lane), h);
    }
    /* the block's stores, then one count by thread 0 with release and acquire semantics at GPU scope (cumulative
     * over the stores the barrier ordered before it), as a semaphore in CUTLASS does: no fence in every thread */
    __syncthreads();
    if (tid == 0) {
        unsigned old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(gg.cnt + (tl >> 1)) : "memory");
        *flag = old;
    }
    __syncthreads();
    if (*flag == 0) return; /* the pair's other tile is not done yet: its block quantizes both */
    if (tid == 0) gg.cnt[tl >> 1] = 0; /* both have counted; the next launch finds it zero (stream order) */
    /* the other tile's values into shared memory (the staging rows, read by now), every load in flight at once: read
     * inside the quantization loop, each warp's 16 loads waited one after another behind its stores (~10 us a
     * launch at 27B, 64 rows: H200, session 31 run 04) */
    float *os = (float *)sm; /* [TOKS][64] */
    static_assert(TOKS * 64 * 4 <= TOKS * RS, "the other tile's rows fit in the staging rows");
    constexpr int OJ = TOKS * 16 / 128; /* float4s a thread (128 threads) */
    const float4 *src = (const float4 *)(gg.h + 64 * (tl ^ 1));
    float4 ov[OJ];
#pragma unroll
    for (int j = 0; j < OJ; j++) {
        const int i = tid + 128 * j, tok = i >> 4;
        ov[j] = tok < m ? __ldcg(src + (size_t)tok * (F / 4) + (i & 15)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < OJ; j++) ((float4 *)os)[tid + 128 * j] = ov[j];
    __syncthreads();
    const int q = tl >> 1, mine = (lane >> 4) == (tl & 1); /* lanes 0-15: tile 2q's values, 16-31: 2q + 1's */
    /* every row slot, unrolled, rows >= m computed and not stored: the 16 rows' shuffle chains overlap instead of
     * following one another */
#pragma unroll
    for (int it = 0; it < TOKS / 4; it++) {
        const int tok = wq + 4 * it;
        const float4 v = *(const float4 *)((mine ? hs : os) + tok * 64 + 4 * (lane & 15));
        g3c_tq_quant4(v, tok < m, gg.xq, (size_t)tok * F + 128 * q, gg.xd + (size_t)tok * (F / 128) + q, gg.il, F);
    }
}

/* One warpgroup per block, two or three blocks per SM: while one block turns a stage's int32 sums into floats
 * (which needs the MMAs of that stage complete), another's MMAs run. BM tokens x BN channels per tile: 64 x 128
 * (m64n128k32) or 128 x 64 (two m64n64k32 per k step, same weights). Units u of (tile = u / S, stage = u % S);
 * [L * b / grid, L * (b + 1) / grid) for block b. */
template <int BM, int BN, int ST, bool PF, bool F8, int NWG = 1, bool BR = false, bool GG = false>
__global__ void __launch_bounds__(WG_T * NWG, NWG == 1 ? 3 : 1)
    k_wg8(g3_dmat w, const int8_t *__restrict__ xq, const float2 *__restrict__ xd, int m, float *__restrict__ y, int S,
          long long L, int mo, g3c_wg_gg gg, int late) {
    constexpr int NT = WG_T * NWG; /* threads */
    /* warpgroups split the tile: NTH token groups (each its own activation rows) x NCH channel groups (each its own
     * weight rows): 1 x 1, 2 x 1 (NWG 2) or 2 x 2 (NWG 4: 64 channels a warpgroup) */
    constexpr int NTH = NWG == 1 ? 1 : 2, NCH = NWG / NTH, BNW = BN / NCH;
    constexpr int MT = BM / 64 / NTH, NR = BNW / 2; /* m64 tiles per warpgroup, accumulator registers per tile and thread */
    /* e4m3 with 128 activation rows a warpgroup: the hi tile (rows 0..63) and the lo tile (64..127) of the same 64
     * tokens accumulate into one set of sums (same d), so 64 tokens x BN = 128 channels fit the registers */
    constexpr int MA = F8 && BM / NTH == 128 ? 1 : MT;
    /* F8: activation rows [0, m) hold the hi parts, [mo, mo + m) the lo parts. Tile row r is activation row r, except
     * with several warpgroups (NWG 2 / 4, 65..128 tokens, mo = 128): token group g's 128 tile rows are the hi then the
     * lo rows of tokens 64 g .. 64 g + 63, read against the same weight tile */
    auto grow = [&](int r) { return NWG == 1 ? r : ((r & 64) ? mo : 0) + 64 * (r >> 7) + (r & 63); };
    auto present = [&](int r) {
        if constexpr (NWG > 1) return 64 * (r >> 7) + (r & 63) < m;
        else return r < m || (F8 && r >= mo && r < mo + m);
    };
    constexpr int WB = wg_cfg<BM, BN, ST>::WB, SB = wg_cfg<BM, BN, ST>::SB;
    extern __shared__ uint8_t wg_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(wg_raw);
    uint8_t *sm = wg_raw + (((raw_s + 1023u) & ~1023u) - raw_s);
    float *ds = (float *)(sm + ST * SB);
    float *scs = ds + ST * BM; /* the channel scales of the block's first two tiles */
    const int tid = threadIdx.x, wgi = NWG > 1 ? tid >> 7 : 0, wq = (tid & (WG_T - 1)) >> 5, lane = tid & 31;
    const int th = NTH > 1 ? wgi % NTH : 0, chg = NCH > 1 ? wgi / NTH : 0; /* this warpgroup's token / channel group */
    const int n = w.n, K = w.k, nb = K / 128;
    const long long u0 = L * blockIdx.x / gridDim.x, u1 = L * (blockIdx.x + 1) / gridDim.x;
    const int8_t *W = (const int8_t *)w.q;
    /* The copies of a unit (addresses kept from unit to unit: the header comment). Thread tid copies chunk c = tid % 8
     * of rows r0 + j NT/8 (weights) and r0 + i NT/8 (activations), r0 = tid / 8: their swizzled places in a stage are
     * one offset apart (NT/8 is a multiple of 8, so r & 7 is r0 & 7 for every row). */
    constexpr int WJ = BN * 8 / NT, XI = BM * 8 / NT; /* copies of weights / activations a thread and stage */
    const int c16 = (tid & 7) * 16, r0 = tid >> 3;
    const int so = r0 * 128 + ((c16 ^ ((r0 & 7) << 4))); /* chunk c of row r0 in a tile */
    const size_t wstep = (size_t)(NT / 8) * K;
    /* weights of stage st of tile t: rows t BN + r0 + j NT/8 (rows >= n copy no bytes from row 0); rows: n - t BN,
     * the tile's rows in the matrix (>= BN: all of them, a block-uniform branch) */
    auto load_w = [&](const int8_t *src, int rows, int slot) {
        uint8_t *dst = sm + slot * SB + so;
        if (rows >= BN) { /* every row of the tile (every tile where BN divides n) */
#pragma unroll
            for (int j = 0; j < WJ; j++) wg_cp16<PF>(dst + j * (NT / 8) * 128, src + j * wstep, 16);
        } else {
#pragma unroll
            for (int j = 0; j < WJ; j++) {
                const bool ok = r0 + j * (NT / 8) < rows;
                wg_cp16<PF>(dst + j * (NT / 8) * 128, ok ? src + j * wstep : W, ok ? 16 : 0);
            }
        }
    };
    auto wsrc = [&](int t, int st) { return W + (size_t)(t * BN + r0) * K + st * 128 + c16; };
    /* activation copies present for this thread: bit i (tile row r0 + i NT/8 < m, or present for e4m3) and their
     * rows' offsets in xq (F8 with several warpgroups: grow) */
    unsigned xm = 0;
#pragma unroll
    for (int i = 0; i < XI; i++) {
        const int r = r0 + i * (NT / 8);
        if (F8 ? present(r) : r < m) xm |= 1u << i;
    }
    auto xoff = [&](int i) { return (size_t)grow(r0 + i * (NT / 8)) * K + c16; };
    const float *xdp = tid < BM && present(tid) ? &xd[(size_t)grow(tid) * nb].x : NULL; /* BM <= NT */
    auto load_x = [&](int st, int slot) {
        uint8_t *dst = sm + slot * SB + WB + so;
#pragma unroll
        for (int i = 0; i < XI; i++)
            if (xm >> i & 1) g3c_cp16(dst + i * (NT / 8) * 128, xq + xoff(i) + st * 128);
        if (xdp) g3c_cp4(ds + slot * BM + tid, xdp + 2 * st);
    };
    /* activation rows not present in every stage: zeros, never loaded */
    if constexpr (F8) {
        for (int idx = tid; idx < ST * BM * 8; idx += NT) {
            const int slot = idx / (BM * 8), rem = idx % (BM * 8), r = rem >> 3;
            if (!present(r)) *(uint4 *)(sm + slot * SB + WB + r * 128 + ((rem & 7) << 4)) = make_uint4(0, 0, 0, 0);
        }
    } else {
        for (int idx = tid; idx < ST * (BM - m) * 8; idx += NT) {
            const int slot = idx / ((BM - m) * 8), rem = idx % ((BM - m) * 8), r = m + (rem >> 3);
            *(uint4 *)(sm + slot * SB + WB + r * 128 + ((rem & 7) << 4)) = make_uint4(0, 0, 0, 0);
        }
    }
    for (int idx = tid; idx < ST * BM; idx += NT)
        if (!present(idx % BM)) ds[idx] = 0.f;
    /* the scales of the tiles this block ends (at most two but for tiny K): read now, so that adding a finished tile
     * into y does not wait for global loads behind the weight streams of every other block (measured with
     * dev/cuda/wg_bench.cu, 27B at 64 rows, session 8, x0 -> x6: gate/up 79.5 -> 73.4 us, down 47.7 -> 40.5) */
    const int tf = (int)(u0 / S), sc_ok = u1 > u0 && (int)((u1 - 1) / S) - tf < 2;
    /* by cp.async, in the first unit's group (landed long before any tile ends): a plain load stored to shared memory
     * held every thread at its store for a memory round trip before the first weight copies were issued (sm_90a
     * SASS: LDG, STS, then the first LDGSTS). H200 session 27 run 01, A/B/A/B, tok/s: 27B int8 64 / 128 / 256 seqs
     * 5553-5541 / 6488-6502 / 6330-6315 against 5529-5539 / 6474-6468 / 6267-6264, fp8 64 seqs 4819-4823 against
     * 4762-4769, 4B int8 64 / 256 seqs 19230 / 27130 against 18910 / 26797 */
    if (sc_ok)
        for (int i = tid; i < 2 * BN; i += NT) {
            if (tf * BN + i < n) g3c_cp4(scs + i, w.s + tf * BN + i);
            else scs[i] = 0.f;
        }
    auto ch_scale = [&](int c) { return c < n ? (sc_ok ? scs[c - tf * BN] : __ldg(w.s + c)) : 0.f; }; /* c's scale */
    const int nu = (int)(u1 - u0); /* this block's units */
    int slot = 0, tile = tf, st = (int)(u0 - (long long)tf * S); /* the unit computed (one 64-bit division) */
    /* the unit requested next: one cursor, which the ring start's loaders advance whether or not they copy
     * (wg_ring_start's contract) and the loop continues from unit u0 + ST - 1 */
    int lt = tile, ls = st, xs = st;
    const int8_t *lw = wsrc(lt, ls);
    wg_ring_start<ST>(
        nu,
        [&](int i, bool on) {
            if (on) load_w(lw, n - lt * BN, i);
            if (++ls == S) ls = 0, lt++, lw = wsrc(lt, 0);
            else lw += 128;
        },
        [&](int i, bool on) {
            if (on) load_x(xs, i);
            if (++xs == S) xs = 0;
        },
        !late);
    /* unit u0 + i has landed once group ST - 1 + i has: at the top of iteration i, 2 (ST - 1) + i groups exist */
    const int tr = 16 * wq + (lane >> 2); /* this thread's tokens in each m64 tile: tr, tr + 8 */
    float acc[MA][NR];
    typename wg_acc<F8>::T ai[MA][NR]; /* one stage's sums: int32 (int8) or float (e4m3) */
#pragma unroll
    for (int t = 0; t < MA; t++)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[t][r] = 0.f, ai[t][r] = 0;
    for (int i = 0; i < nu; i++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async writes -> the MMA's reads */
        __syncthreads();
        {
            const int sn = slot == 0 ? ST - 1 : slot - 1; /* = (slot + ST - 1) % ST: the stage done last iteration */
            if (i + ST - 1 < nu) {
                load_w(lw, n - lt * BN, sn), load_x(ls, sn);
                if (++ls == S) ls = 0, lt++, lw = wsrc(lt, 0);
                else lw += 128;
            }
            g3c_cp_commit();
        }
        const uint8_t *base = sm + slot * SB;
        const uint64_t db = wg_desc(base + chg * BNW * 128);
#pragma unroll
        for (int t = 0; t < MA; t++) wg_fence_regs(ai[t]);
        wg_fence();
#pragma unroll
        for (int t = 0; t < MT; t++) {
            const uint64_t da = wg_desc(base + WB + (th * MT + t) * 64 * 128);
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
                wg_mma<NR>(ai[MA == 1 ? 0 : t], da + 2 * ks, db + 2 * ks, MA == 1 && t > 0 ? 1 : ks);
        }
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int t = 0; t < MA; t++) {
            wg_fence_regs(ai[t]);
            const int dr = slot * BM + th * (BM / NTH) + 64 * t + tr;
            const float d0 = ds[dr], d1 = ds[dr + 8];
#pragma unroll
            for (int r = 0; r < NR; r++) acc[t][r] = fmaf((r & 2) ? d1 : d0, wg_acc<F8>::f(ai[t][r]), acc[t][r]);
        }
        /* the tile (or this block's share of it) is done: add into y (BR: the block's last share after the loop) */
        if ((!BR && i + 1 == nu) || (st + 1 == S && !(BR && i + 1 == nu))) {
            const int ch0 = tile * BN + chg * BNW + 2 * (lane & 3);
#pragma unroll
            for (int j = 0; j < NR / 4; j++) {
                const int ch = ch0 + 8 * j;
                if (ch >= n) continue;
                const float s0 = ch_scale(ch), s1 = ch_scale(ch + 1);
#pragma unroll
                for (int t = 0; t < MA; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        int tok = 64 * (th * MA + t) + tr + 8 * h;
                        if constexpr (F8 && MA == 1 && MT == 1) /* lo rows stacked after the hi rows (mo = m) */
                            if (tok >= mo) tok -= mo;
                        if (tok >= m) continue;
                        const float v0 = acc[t][4 * j + 2 * h] * s0, v1 = acc[t][4 * j + 2 * h + 1] * s1;
                        float *p = y + (size_t)tok * n + ch;
                        if ((n & 1) == 0) atomicAdd((float2 *)p, make_float2(v0, v1));
                        else {
                            atomicAdd(p, v0);
                            if (ch + 1 < n) atomicAdd(p + 1, v1);
                        }
                    }
            }
#pragma unroll
            for (int t = 0; t < MA; t++)
#pragma unroll
                for (int r = 0; r < NR; r++) acc[t][r] = 0.f;
        }
        slot = slot + 1 == ST ? 0 : slot + 1;
        if (++st == S) st = 0, tile++;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (late) g3c_pdl_trigger(); /* wg_late */
    if constexpr (BR) { /* the last share: staged in the (now idle) ring as [token][channel] rows, then one bulk
                         * reduction per token row (cp.reduce.async.bulk ... add.f32), a whole row segment per request
                         * instead of 8-byte atomics from every thread; n % 4 == 0 (16-byte rows), no stacked lo rows */
        constexpr int TOKS = 64 * NTH * MA, RS = BN * 4 + 32; /* +32 B a row: the 8-byte stores of a half-warp hit
                                                               * distinct banks */
        static_assert(TOKS * RS <= ST * SB, "the staging rows fit in the ring");
        static_assert(!(F8 && MA == 1 && MT == 1), "stacked lo rows add into the same token: atomics only");
        if (u1 > u0) { /* block-uniform */
            __syncthreads(); /* every warpgroup's MMAs have read their last stage */
            const int tl = (int)((u1 - 1) / S), cr0 = chg * BNW + 2 * (lane & 3);
#pragma unroll
            for (int j = 0; j < NR / 4; j++) {
                const int cr = cr0 + 8 * j, ch = tl * BN + cr;
                if (ch >= n) continue;
                const float s0 = ch_scale(ch), s1 = ch_scale(ch + 1);
#pragma unroll
                for (int t = 0; t < MA; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int tok = 64 * (th * MA + t) + tr + 8 * h;
                        if (tok < m)
                            *(float2 *)(sm + tok * RS + cr * 4) =
                                make_float2(acc[t][4 * j + 2 * h] * s0, acc[t][4 * j + 2 * h + 1] * s1);
                    }
            }
            if constexpr (GG) { /* GeGLU and the down product's quantization (g3c_wg_mm_geglu) */
                __syncthreads();
                wg_geglu_out<TOKS, RS, ST * SB>(sm, tl, m, n >> 1, wq, lane, tid, gg);
                return;
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* st.shared -> the bulk copy's reads */
            __syncthreads();
            const int bytes = 4 * min(BN, n - tl * BN);
            for (int r = tid; r < m && r < TOKS; r += NT)
                asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                                 y + (size_t)r * n + (size_t)tl * BN),
                             "r"((unsigned)__cvta_generic_to_shared(sm + r * RS)), "r"(bytes)
                             : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); /* done (and visible) before the block exits */
        }
    }
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */
/* ST stages of 24 KB: 3 (three blocks per SM, two stages in flight each) or, $G3_CUDA_WGST=4, 4 (two blocks per SM,
 * three in flight each). Measured on the H200 (27B int8, aggregate decode tok/s, argmax on the GPU; session 7 run 4,
 * 4 -> 3): 64 seqs 3962 -> 4250, 128 seqs 4907 -> 5265, 256 seqs 4981 -> 4981: more independent blocks per SM
 * beat more stages per block (each block waits for its own MMAs before scaling their sums). */
/* channels per tile: 128 with 64 activation rows (or e4m3's 64 tokens as hi + lo tiles), 64 with 128 int8 rows */
template <int BM, bool F8> struct wg_bn { static constexpr int BN = BM == 64 || F8 ? 128 : 64; };
template <int BM, int ST, bool PF, bool F8, bool BR> static void *wg_k(void) {
    return (void *)k_wg8<BM, wg_bn<BM, F8>::BN, ST, PF, F8, 1, BR>;
}
template <int BM, int ST, bool F8> static size_t wg_smem(void) { return wg_cfg<BM, wg_bn<BM, F8>::BN, ST>::SMEM; }

static int wg_stages(void) {
    const char *e = getenv("G3_CUDA_WGST");
    return e && !strcmp(e, "4") ? 4 : 3;
}
/* $G3_CUDA_WGPF=0: weights without the L2 prefetch hint (comparison) */
static int wg_pf(void) {
    const char *e = getenv("G3_CUDA_WGPF");
    return !(e && !strcmp(e, "0"));
}

/* $G3_CUDA_WGBR=0: every share of a tile added into y by float2 atomics; by default the block's last share goes
 * through shared memory and bulk reductions (where n % 4 == 0 and no lo rows are stacked) */
static int wg_br(void) {
    const char *e = getenv("G3_CUDA_WGBR");
    return !(e && !strcmp(e, "0"));
}

/* A block a channel tile, over the tile's whole K range, where the tiles fill at least 3/4 of the resident slots (the
 * 27B gate/up product at 33..64 rows: 336 tiles for 396 slots): no shares, so no atomics mid-kernel, each block's
 * one share added by the bulk reductions, and the SMs that hold two blocks instead of three free early for the
 * launches after it. $G3_CUDA_WGTILE=0: the equal stream-K ranges always (read at every call). Measured on the H200
 * (session 29 run 04, A/B/A/B, tok/s): 27B int8 33 / 48 / 64 seqs 3100-3110 / 4468-4489 / 5914-5945 against
 * 3040-3046 / 4393-4394 / 5827-5835, fp8 48 / 64 3893 / 5137 against 3768 / 5030; 4B / 1B at 64 seqs (no product
 * qualifies at those rows) unchanged. CUPTI at 27B, 64 rows: the gate/up launch 67.4 against 70.3 us, a layer 165.5
 * against 169.2. It also acts on 4B's int8 gate/up product in 65..128-row launches (320 tiles of 64 channels): run 06,
 * 4B int8 256 seqs 28661-28737 against 27676-27687, 128 seqs within noise. */
static int wg_tile_blocks(long long tiles, long long slots) {
    const char *e = getenv("G3_CUDA_WGTILE");
    return !(e && !strcmp(e, "0")) && tiles <= slots && 4 * tiles >= 3 * slots;
}

int g3c_wg_enabled(void) { /* $G3_CUDA_WG=0: off; read at every call */
    const char *e = getenv("G3_CUDA_WG");
    return !(e && !strcmp(e, "0"));
}

int g3c_wg_min_rows(void) { /* $G3_CUDA_WGMIN: fewest rows taken here from g3c_tq_mm (default 33) */
    const char *e = getenv("G3_CUDA_WGMIN");
    const int v = e && *e ? atoi(e) : 33;
    return v < 9 ? 9 : v;
}

int g3c_wg_supported(const g3_dmat *w, int m) {
    return g3c_wg_enabled() && w->qt == G3Q_INT8 && w->g == w->k && w->k % 128 == 0 && w->n >= 1 && m >= 1 &&
           m <= 128;
}

/* the variants [int8 / e4m3][BM 64 / 128][ST 4 / 3 (e4m3 with BM 128: 2 / 3)][PF on / off][BR off / on]: kernel,
 * shared memory, resident blocks per SM (0: not set up) */
typedef struct wg_inst {
    void *k;
    size_t smem;
    int bps;
} wg_inst;
static wg_inst wg_tab[2][2][2][2][2];
/* e4m3 at 65..128 rows: four (or two: $G3_CUDA_WGF2W=2) warpgroups a block on one weight tile
 * [warpgroups 2 / 4][ST 3 / 4][PF on / off][BR off / on] */
static wg_inst wgf2_tab[2][2][2][2];
/* GeGLU in the last step (g3c_wg_mm_geglu), the default variants only: [int8 (BM 64, 3 stages) / e4m3 (BM 128, 2)] */
static wg_inst wg_gg_tab[2];
static int wg_ready; /* wg_tab filled */
#define WGF2_BM 256 /* activation rows a stage: 2 warpgroups x (64 tokens' hi + lo rows) */

/* e4m3 up to 32 rows (BM 64) stacks its lo rows onto the hi rows' tokens: no BR variant (the atomics one twice) */
template <int BM, int ST, bool F8> static void wg_fill(wg_inst (&t)[2][2]) {
    constexpr bool BR = !(F8 && BM == 64);
    t[0][0].k = wg_k<BM, ST, true, F8, false>(), t[1][0].k = wg_k<BM, ST, false, F8, false>();
    t[0][1].k = wg_k<BM, ST, true, F8, BR>(), t[1][1].k = wg_k<BM, ST, false, F8, BR>();
    t[0][0].smem = t[1][0].smem = t[0][1].smem = t[1][1].smem = wg_smem<BM, ST, F8>();
}

template <int NWG, int ST> static void wgf2_fill(wg_inst (&t)[2][2]) {
    t[0][0].k = (void *)k_wg8<WGF2_BM, 128, ST, true, true, NWG, false>;
    t[1][0].k = (void *)k_wg8<WGF2_BM, 128, ST, false, true, NWG, false>;
    t[0][1].k = (void *)k_wg8<WGF2_BM, 128, ST, true, true, NWG, true>;
    t[1][1].k = (void *)k_wg8<WGF2_BM, 128, ST, false, true, NWG, true>;
    t[0][0].smem = t[1][0].smem = t[0][1].smem = t[1][1].smem = wg_cfg<WGF2_BM, 128, ST>::SMEM;
}

static cudaError_t wg_setup(void) {
    if (!wg_ready) {
        wgf2_fill<2, 3>(wgf2_tab[0][0]), wgf2_fill<2, 4>(wgf2_tab[0][1]);
        wgf2_fill<4, 3>(wgf2_tab[1][0]), wgf2_fill<4, 4>(wgf2_tab[1][1]);
        wg_fill<64, 4, false>(wg_tab[0][0][0]), wg_fill<64, 3, false>(wg_tab[0][0][1]);
        wg_fill<128, 4, false>(wg_tab[0][1][0]), wg_fill<128, 3, false>(wg_tab[0][1][1]);
        wg_fill<64, 4, true>(wg_tab[1][0][0]), wg_fill<64, 3, true>(wg_tab[1][0][1]);
        wg_fill<128, 2, true>(wg_tab[1][1][0]), wg_fill<128, 3, true>(wg_tab[1][1][1]);
        wg_gg_tab[0].k = (void *)k_wg8<64, 128, 3, true, false, 1, true, true>;
        wg_gg_tab[0].smem = wg_cfg<64, 128, 3>::SMEM;
        wg_gg_tab[1].k = (void *)k_wg8<128, 128, 2, true, true, 1, true, true>;
        wg_gg_tab[1].smem = wg_cfg<128, 128, 2>::SMEM;
        wg_ready = 1;
    }
    for (int i = 0; i < 32; i++) { /* no-op once bps is set */
        wg_inst *v = &wg_tab[i >> 4][(i >> 3) & 1][(i >> 2) & 1][(i >> 1) & 1][i & 1];
        cudaError_t e = g3c_smem_setup(v->k, (int)v->smem, WG_T, &v->bps);
        if (e != cudaSuccess) return e;
    }
    for (int i = 0; i < 2; i++) {
        cudaError_t e = g3c_smem_setup(wg_gg_tab[i].k, (int)wg_gg_tab[i].smem, WG_T, &wg_gg_tab[i].bps);
        if (e != cudaSuccess) return e;
    }
    for (int i = 0; i < 16; i++) {
        wg_inst *v = &wgf2_tab[i >> 3][(i >> 2) & 1][(i >> 1) & 1][i & 1];
        cudaError_t e = g3c_smem_setup(v->k, (int)v->smem, (i >> 3 ? 4 : 2) * WG_T, &v->bps);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t g3c_wg_init(void) { return wg_setup(); }

/* when the blocks let the next kernel's blocks be scheduled (programmatic launch): after their K loop, or (the form
 * every kernel else keeps, g3c_pdl_wait) at their launch wait, so that the successor's weight copies overlap this
 * kernel's tail. Early, the successor's blocks sit beside the product for most of its run: the down product's beside
 * the gate/up product with the GeGLU epilogue slowed it ~9 us a 27B layer (session 31). Late is the default for every
 * k_wg8 launch; $G3_CUDA_WGLT=0: early for all, 2: late for the GeGLU epilogue only. Measured on the H200 (session 32,
 * A/B within one binary, aggregate decode tok/s, 27B, two rounds): int8 with the GeGLU epilogue 33 / 48 / 64 seqs
 * 3216 / 4632-4653 / 6103-6126 late against 3110-3120 / 4510 / 5922-5929 late for the epilogue only (run 02) and
 * 3051-3055 / 4413-4419 / 5803-5821 early (run 01); int8 128 / 256 seqs 6506-6538 / 6499-6505 against 6513-6520 /
 * 6262-6284 early (run 02); fp8 within ~1% either way. */
static int wg_late(int gg) {
    const char *e = getenv("G3_CUDA_WGLT");
    if (e && !strcmp(e, "0")) return 0;
    if (e && !strcmp(e, "2")) return gg;
    return 1;
}
static int wgf_stages(void);
static int wgf2_stages(void);
static int wgf2_groups(void);
/* m rows of y; big: 128 activation rows per tile (int8: 128 tokens x 64 channels; e4m3: the hi and lo tiles of up
 * to 64 tokens x 128 channels), else 64 x 128; e4m3 beyond 64 rows: two warpgroups, 256 activation rows (hi and lo
 * tiles of up to 128 tokens) x 128 channels; mo: e4m3's first lo row */
static cudaError_t wg_run(int f8, const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, int big, int mo,
                          float *y, int n_sm, cudaStream_t st, const g3c_wg_gg *gg = NULL) {
    cudaError_t e = wg_setup(); /* no-op after g3c_wg_init */
    if (e != cudaSuccess) return e;
    const int two = f8 && m > 64, nwg = two ? wgf2_groups() : 1;
    const int BN = big && !f8 ? 64 : 128, S = w->k / 128, tiles = (w->n + BN - 1) / BN;
    const int br = wg_br() && w->n % 4 == 0 && !((uintptr_t)y & 15);
    const wg_inst *v = gg    ? &wg_gg_tab[f8]
                       : two ? &wgf2_tab[nwg == 4][wgf2_stages() == 4][!wg_pf()][br]
                             : &wg_tab[f8][big][f8 && big ? wgf_stages() == 3 : wg_stages() == 3][!wg_pf()][br];
    const long long L = (long long)tiles * S;
    long long blocks = (long long)(n_sm > 0 ? n_sm : 1) * v->bps;
    if (blocks > L) blocks = L;
    if (gg || wg_tile_blocks(tiles, blocks)) blocks = tiles; /* the GeGLU epilogue needs whole tiles */
    const g3c_wg_gg p = gg ? *gg : g3c_wg_gg{};
    typedef void (*kfn)(g3_dmat, const int8_t *, const float2 *, int, float *, int, long long, int, g3c_wg_gg, int);
    return g3c_launch((kfn)v->k, dim3((unsigned)blocks), dim3(WG_T * nwg), v->smem, st, *w, xq, xd, m, y, S, L, mo,
                      p, wg_late(gg != NULL));
}

cudaError_t g3c_wg_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                      cudaStream_t st) {
    if (!g3c_wg_supported(w, m)) return cudaErrorInvalidValue;
    return wg_run(0, w, xq, xd, m, m > 64, 0, y, n_sm, st);
}

/* ---- GeGLU in the gate/up product ------------------------------------------------------------------------------ */
/* Where the gate/up product takes whole tiles anyway (wg_tile_blocks: the 27B shape at 33..64 rows), int8 and fp8;
 * $G3_CUDA_WGGG=0: never, 2: wherever the kernel can, whole tiles forced (tests). Read at every call. Measured on the
 * H200 with the late trigger (wg_late; session 32 run 01, A/B within one binary, aggregate decode tok/s, 27B, two
 * rounds): int8 33 / 48 / 64 seqs 3217-3213 / 4624-4633 / 6085-6077 against 3113-3117 / 4485-4493 / 5921-5924 without
 * the epilogue. With the early trigger (session 31) int8 lost (5865-5869 against 5955-5957 at 64 seqs) and fp8 won
 * (48 / 64 seqs 3846 / 5041-5065 against 3777 / 4991-4994). Alone (CUPTI without programmatic launch) the int8 launch
 * takes 68.7 us against 63.7 + 6.5 for the product and the GeGLU launch (session 31). */
static int wg_gg_mode(void) {
    const char *e = getenv("G3_CUDA_WGGG");
    if (e && (!strcmp(e, "0") || !strcmp(e, "1") || !strcmp(e, "2"))) return *e - '0';
    return 1;
}

/* which kernel the gate/up product of m rows takes: 0 int8 (BM 64), 1 e4m3 (hi + lo tiles of 64 tokens), -1 neither
 * of the default variants the GeGLU epilogue exists for */
static int wg_gg_kind(const g3_dmat *gu, int m) {
    if (m < 33 || m > 64) return -1;
    if (gu->qt == G3Q_INT8 && m >= g3c_wg_min_rows() && g3c_wg_supported(gu, m))
        return wg_stages() == 3 && wg_pf() && wg_br() ? 0 : -1;
    if (gu->qt == G3Q_FP8 && g3c_wgf_taken(gu, m)) return wgf_stages() == 2 && wg_pf() && wg_br() ? 1 : -1;
    return -1;
}

int g3c_wg_geglu_ok(const g3_dmat *gu, int m, int il, int n_sm) {
    const int f8 = wg_gg_kind(gu, m), mode = f8 < 0 ? 0 : wg_gg_mode();
    /* 128 channels a tile = 64 GeGLU values; two tiles a quantization block of 128 */
    if (!mode || f8 < 0 || gu->n % 256 || il < 0 || wg_setup() != cudaSuccess) return 0;
    const long long tiles = gu->n / 128, slots = (long long)(n_sm > 0 ? n_sm : 1) * wg_gg_tab[f8].bps;
    return mode == 2 || wg_tile_blocks(tiles, slots);
}

cudaError_t g3c_wg_mm_geglu(const g3_dmat *gu, const int8_t *xq, const float2 *xd, int m, const g3c_wg_gg *gg,
                            int n_sm, cudaStream_t st) {
    const int f8 = wg_gg_kind(gu, m);
    if (f8 < 0 || gu->n % 256 || !gg || !gg->h || !gg->cnt || !gg->xq || !gg->xd) return cudaErrorInvalidValue;
    return wg_run(f8, gu, xq, xd, m, f8 ? m > 32 : m > 64, f8 ? g3c_wgf_lo_row(m) : 0, NULL, n_sm, st, gg);
}

/* ---- fp8 (e4m3, per channel) ----------------------------------------------------------------------------------- */
/* 33..64 rows: two stages of 32 KB (three blocks per SM) or, $G3_CUDA_WGFST=3, three (two blocks per SM); measured
 * on the H100 (27B fp8, 64 seqs, aggregate decode tok/s, argmax on the GPU; session 16 run 04): 3532 against 3309 */
static int wgf_stages(void) {
    const char *e = getenv("G3_CUDA_WGFST");
    return e && !strcmp(e, "3") ? 3 : 2;
}

/* 65..128 rows: $G3_CUDA_WGF2ST=4: four stages of 48 KB (default three); one block of two warpgroups per SM */
static int wgf2_stages(void) {
    const char *e = getenv("G3_CUDA_WGF2ST");
    return e && !strcmp(e, "4") ? 4 : 3;
}

/* warpgroups a block at 65..128 rows: 4 (two token groups x two channel groups of 64 channels) or, $G3_CUDA_WGF2W=2,
 * two (one channel group of 128). Measured on the H100 (session 17 run 06, aggregate decode tok/s, two rounds each,
 * 4 against 2): 27B fp8 128 seqs 4084 / 4059 against 4010 / 4029, 256 seqs 4093 / 4098 against 4094 / 4077; 4B 128
 * seqs 17192 / 17156 against 16685 / 16698, 256 seqs 17918 / 18016 against 17386 / 17458; 1B 256 seqs 39120 / 39036
 * against 38598 / 38600; four stages with four warpgroups no better (27B 3990 / 4024) */
static int wgf2_groups(void) {
    const char *e = getenv("G3_CUDA_WGF2W");
    return e && !strcmp(e, "2") ? 2 : 4;
}

/* $G3_CUDA_WGF2=0: no 65..128-row launches (decode batches beyond 64 rows in launches of <= 64, as before) */
static int wgf2_enabled(void) {
    const char *e = getenv("G3_CUDA_WGF2");
    return !(e && !strcmp(e, "0"));
}

static int wgf_enabled(void) { /* $G3_CUDA_WGF=0: off (the staged bf16 kernel, tc_stage.cu); read at every call */
    const char *e = getenv("G3_CUDA_WGF");
    return !(e && !strcmp(e, "0"));
}

int g3c_wgf_min_rows(void) { /* $G3_CUDA_WGFMIN: fewest rows taken here (default 33) */
    const char *e = getenv("G3_CUDA_WGFMIN");
    const int v = e && *e ? atoi(e) : 33;
    return v < 1 ? 1 : v;
}

int g3c_wgf_supported(const g3_dmat *w, int m) {
    return wgf_enabled() && w->qt == G3Q_FP8 && w->g == w->k && w->k % 128 == 0 && w->n >= 1 && m >= 1 &&
           m <= (wgf2_enabled() ? 128 : 64);
}

int g3c_wgf_lo_row(int m) { return m <= 32 ? m : m <= 64 ? 64 : 128; }

size_t g3c_wgf_q_bytes(int m, int k) {
    const size_t rows = (size_t)g3c_wgf_lo_row(m) + m;
    return rows * k + rows * (k / 128) * sizeof(float2);
}

/* $G3_CUDA_WGFW: fewest weights (n k) of an fp8 matrix that takes the e4m3 kernel from 17 rows (below
 * g3c_wgf_min_rows()) and, with $G3_CUDA_WGF2=0, in the launches of <= 64 rows of decode batches beyond 64 rows
 * (default 16 M; smaller ones keep the staged kernel there). Measured on the H100 (session 16 run 07, aggregate decode tok/s against the staged kernel):
 * 32 seqs 27B 2011 against 1843, 4B 8369 against 8353 (gate/up and down taken); at 16 seqs 27B 1093 against 1061
 * but 4B 4809 against 4990, hence from 17 rows */
int g3c_wgf_big(const g3_dmat *w) {
    const char *e = getenv("G3_CUDA_WGFW");
    return (double)w->n * w->k >= (e && *e ? atof(e) : 16777216.0);
}

int g3c_wgf_taken(const g3_dmat *w, int m) {
    return g3c_wgf_supported(w, m) && (m >= g3c_wgf_min_rows() || (m >= 17 && g3c_wgf_big(w)));
}

cudaError_t g3c_wgf_mm(const g3_dmat *w, const int8_t *xq, const float2 *xd, int m, float *y, int n_sm,
                       cudaStream_t st) {
    if (!g3c_wgf_supported(w, m)) return cudaErrorInvalidValue;
    return wg_run(1, w, xq, xd, m, m > 32, g3c_wgf_lo_row(m), y, n_sm, st);
}
