// Activation rows quantized to int8 for the integer-dot decode product (q8act.comp writes them, matvecq.comp reads
// them): per row q [K] int8, q_lo [K] int8, then [K/32] float2 (d, block sum); rows 16-byte aligned. The host's
// g3vk_q8_row_bytes (vk_internal.h) is the same formula.
#define Q8ACT_ROW_BYTES(K) ((uint64_t(K) * 9u / 4u + 15u) & ~uint64_t(15))
