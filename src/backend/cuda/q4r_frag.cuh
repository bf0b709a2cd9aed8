/* The pieces of tc_q4r.cu's products with the weights loaded straight into mma.sync m16n8k32 A fragments, shared with
 * its one-row benchmark (dev/cuda/q4mma_bench.cu): the MMAs on 8-bit operands, the weights' load, an int4 group's
 * nibbles (a lane's 16 bytes of rows gid and gid + 8: words 0-1 and 2-3 the A words of two MMAs each, lo nibbles as
 * bytes, hi nibbles masked in place = 16 x their value, u8) and MMAs, a unit's slot, and the walk over a warp's
 * units. */
#ifndef G3_BACKEND_CUDA_Q4R_FRAG_CUH
#define G3_BACKEND_CUDA_Q4R_FRAG_CUH

#include <stdint.h>

/* c += A (u8) . B (s8) */
static __device__ __forceinline__ void q4r_mma(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* c += A (s8) . B (s8) */
static __device__ __forceinline__ void q8r_mma(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* c += A (e4m3) . B (e4m3), float sums */
static __device__ __forceinline__ void f8r_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* 16 weight bytes, read once: no L1 allocation, and the L2 fetches 256 bytes around them (the next groups of the
 * same row, which the warp's next units read: 64-byte pieces a row otherwise go to DRAM one by one; measured on the
 * 27B gate/up shape alone, 42.2 -> 31.6 us, session 39) */
static __device__ __forceinline__ uint4 q4r_ld(const uint8_t *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* An int4 group's A words from the 16 bytes of row gid (wa) and row gid + 8 (wb): lo[0..3] / hi[0..3] the lo / hi
 * nibbles of words 0-1 (a0 a1 a2 a3 = word 0 of gid, of gid + 8, word 1 of gid, of gid + 8), lo[4..7] / hi[4..7]
 * words 2-3 */
static __device__ __forceinline__ void q4r_nibbles(const uint4 &wa, const uint4 &wb, uint32_t (&lo)[8],
                                                   uint32_t (&hi)[8]) {
    const uint32_t wv[8] = {wa.x, wb.x, wa.y, wb.y, wa.z, wb.z, wa.w, wb.w};
#pragma unroll
    for (int e = 0; e < 8; e++) lo[e] = wv[e] & 0x0F0F0F0Fu, hi[e] = wv[e] & 0xF0F0F0F0u;
}

/* One unit's operands in flight: G groups of rows gid and gid + 8, C 16-byte chunks a lane and group (int4 1, int8 /
 * fp8 2); int4's group scales and offsets (the per-channel types' scales are applied once a tile) */
template <int G, int C> struct q4r_unit {
    uint4 wa[G * C], wb[G * C];
    float sa[G], sb[G], za[G], zb[G];
};

/* An int4 unit's A words and scales out of its slot (which the caller then refills) */
template <int G>
static __device__ __forceinline__ void q4r_take(const q4r_unit<G, 1> &b, uint32_t (&lo)[G][8], uint32_t (&hi)[G][8],
                                                float (&sa)[G], float (&sb)[G], float (&za)[G], float (&zb)[G]) {
#pragma unroll
    for (int j = 0; j < G; j++) {
        q4r_nibbles(b.wa[j], b.wb[j], lo[j], hi[j]);
        sa[j] = b.sa[j], sb[j] = b.sb[j], za[j] = b.za[j], zb[j] = b.zb[j];
    }
}

/* The group's four MMAs: cl += lo . B (words 0-1: b (x0, x1), words 2-3: (x2, x3)), ch += hi . B (y0..y3); the
 * caller's sums are 16 cl + ch */
static __device__ __forceinline__ void q4r_group(int (&cl)[4], int (&ch)[4], const uint32_t (&lo)[8],
                                                 const uint32_t (&hi)[8], uint32_t x0, uint32_t x1, uint32_t x2,
                                                 uint32_t x3, uint32_t y0, uint32_t y1, uint32_t y2, uint32_t y3) {
    q4r_mma(cl, lo[0], lo[1], lo[2], lo[3], x0, x1);
    q4r_mma(cl, lo[4], lo[5], lo[6], lo[7], x2, x3);
    q4r_mma(ch, hi[0], hi[1], hi[2], hi[3], y0, y1);
    q4r_mma(ch, hi[4], hi[5], hi[6], hi[7], y2, y3);
}

/* The units a warp walks and the groups its block uses. Units are (slice, tile of 16 rows, block of the slice's gs /
 * gb groups), slice-major, ntile tiles, ngr groups a row; the grid's warps (W a block) take equal contiguous ranges
 * [u0, u1); the block's groups run from its first unit's slice to its last one's, [g_lo, g_hi). */
struct q4r_range {
    int u0, u1, g_lo, g_hi;
};
static __device__ __forceinline__ q4r_range q4r_split(int ntile, int gb, int gs, int ngr, int W) {
    const int per_slice = ntile * gb;
    const long long tot = (long long)per_slice * (ngr / gs), nw = (long long)gridDim.x * W;
    const long long wi = (long long)blockIdx.x * W + (threadIdx.x >> 5);
    q4r_range r;
    r.u0 = (int)(wi * tot / nw), r.u1 = (int)((wi + 1) * tot / nw);
    const int ub0 = (int)((long long)blockIdx.x * W * tot / nw), ub1 = (int)((long long)(blockIdx.x + 1) * W * tot / nw);
    r.g_lo = (ub0 / per_slice) * gs, r.g_hi = ub1 > ub0 ? ((ub1 - 1) / per_slice + 1) * gs : r.g_lo;
    return r;
}

/* The stream-K walk of a warp's units [u0, u1): step(slot, last) consumes the unit in slot d (and refills it with the
 * unit D ahead), the D slots in turn; last marks the range's final unit. */
template <int D, typename U, typename Step>
static __device__ __forceinline__ void q4r_units(U (&buf)[D], int u0, int u1, Step &&step) {
    int u = u0;
    for (; u + D <= u1; u += D)
#pragma unroll
        for (int d = 0; d < D; d++) step(buf[d], u + d + 1 == u1);
#pragma unroll
    for (int d = 0; d < D; d++)
        if (u + d < u1) step(buf[d], u + d + 1 == u1);
}

/* After a tile's last unit: the next tile of the slice (its groups again from the slice's first, cgl back by gs), or
 * the first tile of the next slice (whose groups follow) */
static __device__ __forceinline__ void q4r_next_tile(int &crem, int gb, int &ctile, int ntile, int &cgl, int gs) {
    crem = gb;
    if (++ctile == ntile) ctile = 0;
    else cgl -= gs;
}

#endif
