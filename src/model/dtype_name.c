/* Printable names of tensor types (public API). */
#include "gemma3.h"

const char *g3_dtype_name(g3_dtype t) {
    switch (t) {
    case G3_DTYPE_F32: return "F32";
    case G3_DTYPE_F16: return "F16";
    case G3_DTYPE_BF16: return "BF16";
    case G3_DTYPE_Q8_0: return "Q8_0";
    case G3_DTYPE_Q4_0: return "Q4_0";
    case G3_DTYPE_Q4_K: return "Q4_K";
    case G3_DTYPE_Q6_K: return "Q6_K";
    default: return "unknown";
    }
}
