// Weight access for one weight type (WTYPE, the g3_dtype value), in the layouts that vk_weights.c repacks the
// file's blocks into at upload. A row of K values is read in units of 16 consecutive values.
//   F32   row: float[K]                      F16/BF16 row: uint16[K]
//   Q8_0  row: int8 q[K];            scales: f16 d[K/32] in a separate array (aux)         x = d*q
//   Q4_0  row: u8 q[K/2], value i in nibble i (low nibble first); scales as Q8_0           x = d*(q-8)
//   Q4_K  row: K/256 blocks of 144 B: f16 d, dmin; u8 scales[12] (ggml packing); u8 q[128] value i in nibble i
//                                                                        x = d*sc[j]*q - dmin*m[j], j = i/32
//   Q6_K  row: K/256 blocks of 208 B: u8 ql[128] (low 4 bits, nibble i); u8 qh[64] (high 2 bits, 2-bit field i);
//              i8 scales[16] (one per 16 values); block scales f16 d[K/256] in aux      x = d*sc[i/16]*(q-32)
//   Q4_1  row: as Q4_0;              aux: f16 (d, m) a block of 32 (one 32-bit word)     x = d*q + m
//   Q5_1  row: low nibbles as Q4_0;  aux: f16 d, m, then the block's 32 fifth bits (bit i: value i) as two halves
//                                                                                         x = d*q + m, q = 0..31
//   Q5_K  row: K/256 blocks of 176 B: Q4_K's 144 B (low nibbles), then u8 qh[32] (bit i: value i's fifth bit)
//                                                                        x = d*sc[j]*q - dmin*m[j], q = 0..31
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

#if WTYPE == T_F32
#define ROW_BYTES(K) (uint64_t(K) * 4)
#elif WTYPE == T_F16 || WTYPE == T_BF16
#define ROW_BYTES(K) (uint64_t(K) * 2)
#elif WTYPE == T_Q8_0
#define ROW_BYTES(K) (uint64_t(K))
#elif WTYPE == T_Q4_0 || WTYPE == T_Q4_1 || WTYPE == T_Q5_1
#define ROW_BYTES(K) (uint64_t(K) / 2)
#elif WTYPE == T_Q4_K
#define ROW_BYTES(K) (uint64_t(K) / 256 * 144)
#elif WTYPE == T_Q5_K
#define ROW_BYTES(K) (uint64_t(K) / 256 * 176)
#elif WTYPE == T_Q6_K
#define ROW_BYTES(K) (uint64_t(K) / 256 * 208)
#else
#error unknown WTYPE
#endif

// f16 number idx of an array of halves at address base (4-byte aligned base).
float half_at(uint64_t base, uint idx) {
    uint w = UBuf(base).v[idx >> 1];
    return unpackHalf2x16(w >> ((idx & 1u) * 16u)).x;
}

float bf16lo(uint w) { return uintBitsToFloat(w << 16); }
float bf16hi(uint w) { return uintBitsToFloat(w & 0xFFFF0000u); }

// Small integers to float through the exponent: the bit pattern 2^23 + n (n < 2^23) is the float 2^23 + n, so
// subtracting 2^23 + offset gives n - offset exactly, without int-to-float conversions (a quarter rate or less on
// NVIDIA). u8f(n, off) = float(n) - off for 0 <= n < 256.
float u8f(uint n, float off) { return uintBitsToFloat(0x4B000000u | n) - (8388608.0 + off); }

void i8x4(uint w, float d, out float a, out float b, out float c, out float e) {
    w ^= 0x80808080u; // bytes q + 128
    a = d * u8f(w & 0xFFu, 128.0);
    b = d * u8f((w >> 8) & 0xFFu, 128.0);
    c = d * u8f((w >> 16) & 0xFFu, 128.0);
    e = d * u8f(w >> 24, 128.0);
}

// The 16 values 16u..16u+15 of weight row `row` (K values per row). w: data, aux: scale array (Q8_0/Q4_0/Q6_K).
void dq16(uint64_t w, uint64_t aux, uint row, uint K, uint u, out float v[16]) {
    uint64_t rp = w + uint64_t(row) * ROW_BYTES(K);
#if WTYPE == T_F32
    F4Buf p = F4Buf(rp);
    [[unroll]] for (uint i = 0; i < 4; i++) {
        vec4 a = p.v[4u * u + i];
        v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
    }
#elif WTYPE == T_F16 || WTYPE == T_BF16
    U4Buf p = U4Buf(rp);
    [[unroll]] for (uint i = 0; i < 2; i++) {
        uvec4 a = p.v[2u * u + i];
        [[unroll]] for (uint j = 0; j < 4; j++) {
#if WTYPE == T_F16
            vec2 h = unpackHalf2x16(a[j]);
            v[8 * i + 2 * j] = h.x, v[8 * i + 2 * j + 1] = h.y;
#else
            v[8 * i + 2 * j] = bf16lo(a[j]), v[8 * i + 2 * j + 1] = bf16hi(a[j]);
#endif
        }
    }
#elif WTYPE == T_Q8_0
    uvec4 q = U4Buf(rp).v[u];
    float d = half_at(aux, row * (K / 32u) + (u >> 1));
    i8x4(q.x, d, v[0], v[1], v[2], v[3]);
    i8x4(q.y, d, v[4], v[5], v[6], v[7]);
    i8x4(q.z, d, v[8], v[9], v[10], v[11]);
    i8x4(q.w, d, v[12], v[13], v[14], v[15]);
#elif WTYPE == T_Q4_0
    uvec2 q = U2Buf(rp).v[u];
    float d = half_at(aux, row * (K / 32u) + (u >> 1));
    [[unroll]] for (uint i = 0; i < 8; i++) {
        v[i] = d * u8f((q.x >> (4u * i)) & 15u, 8.0);
        v[8 + i] = d * u8f((q.y >> (4u * i)) & 15u, 8.0);
    }
#elif WTYPE == T_Q4_K || WTYPE == T_Q5_K
    uint b = u >> 4, j16 = u & 15u, sub = j16 >> 1;
#if WTYPE == T_Q4_K
    uint64_t bp = rp + uint64_t(b) * 144u;
#else
    uint64_t bp = rp + uint64_t(b) * 176u;
#endif
    uvec4 hd = U4Buf(bp).v[0];
    vec2 dd = unpackHalf2x16(hd.x);
    // scales bytes s[0..11] = hd.y, hd.z, hd.w (little endian)
    uint sc, m;
    if (sub < 4u) {
        sc = (hd.y >> (8u * sub)) & 63u;
        m = (hd.z >> (8u * sub)) & 63u;
    } else {
        uint s4 = (hd.w >> (8u * (sub - 4u))) & 255u;   // s[j+4]
        uint sl = (hd.y >> (8u * (sub - 4u))) & 255u;   // s[j-4]
        uint sh = (hd.z >> (8u * (sub - 4u))) & 255u;   // s[j]
        sc = (s4 & 15u) | ((sl >> 6) << 4);
        m = (s4 >> 4) | ((sh >> 6) << 4);
    }
    float s = dd.x * float(sc), mm = dd.y * float(m);
    uvec2 q = U2Buf(bp + 16u).v[j16];
#if WTYPE == T_Q4_K
    uint h = 0u;
#else
    uint h = UBuf(bp + 144u).v[j16 >> 1] >> (16u * (j16 & 1u)); // the 16 values' fifth bits
#endif
    [[unroll]] for (uint i = 0; i < 8; i++) {
        v[i] = s * u8f(((q.x >> (4u * i)) & 15u) | (((h >> i) & 1u) << 4), 0.0) - mm;
        v[8 + i] = s * u8f(((q.y >> (4u * i)) & 15u) | (((h >> (8u + i)) & 1u) << 4), 0.0) - mm;
    }
#elif WTYPE == T_Q4_1 || WTYPE == T_Q5_1
    uvec2 q = U2Buf(rp).v[u];
#if WTYPE == T_Q4_1
    vec2 dm = unpackHalf2x16(UBuf(aux).v[row * (K / 32u) + (u >> 1)]);
    uint h = 0u;
#else
    uint bw = row * (K / 16u) + 2u * (u >> 1); // the block's words: (d, m), fifth bits
    vec2 dm = unpackHalf2x16(UBuf(aux).v[bw]);
    uint h = UBuf(aux).v[bw + 1u] >> (16u * (u & 1u));
#endif
    [[unroll]] for (uint i = 0; i < 8; i++) {
        v[i] = dm.x * u8f(((q.x >> (4u * i)) & 15u) | (((h >> i) & 1u) << 4), 0.0) + dm.y;
        v[8 + i] = dm.x * u8f(((q.y >> (4u * i)) & 15u) | (((h >> (8u + i)) & 1u) << 4), 0.0) + dm.y;
    }
#elif WTYPE == T_Q6_K
    uint b = u >> 4, j = u & 15u;
    uint64_t bp = rp + uint64_t(b) * 208u;
    uvec2 ql = U2Buf(bp).v[j];
    uint qh = UBuf(bp + 128u).v[j];
    int sc = bitfieldExtract(int(UBuf(bp + 192u).v[j >> 2]), int(8u * (j & 3u)), 8);
    float d = half_at(aux, row * (K / 256u) + b);
    float ds = d * float(sc);
    [[unroll]] for (uint i = 0; i < 8; i++) {
        uint lo0 = (ql.x >> (4u * i)) & 15u, lo1 = (ql.y >> (4u * i)) & 15u;
        uint h0 = (qh >> (2u * i)) & 3u, h1 = (qh >> (2u * (i + 8u))) & 3u;
        v[i] = ds * u8f(lo0 | (h0 << 4), 32.0);
        v[8 + i] = ds * u8f(lo1 | (h1 << 4), 32.0);
    }
#endif
}
