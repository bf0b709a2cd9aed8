/* Printable names of tensor types (public API). */
#include <strings.h>

#include "gemma3.h"

const char *g3_dtype_name(g3_dtype t) {
    switch (t) {
    case G3_DTYPE_F32: return "F32";
    case G3_DTYPE_F16: return "F16";
    case G3_DTYPE_BF16: return "BF16";
    case G3_DTYPE_Q8_0: return "Q8_0";
    case G3_DTYPE_Q4_0: return "Q4_0";
    case G3_DTYPE_Q4_1: return "Q4_1";
    case G3_DTYPE_Q5_0: return "Q5_0";
    case G3_DTYPE_Q5_1: return "Q5_1";
    case G3_DTYPE_Q4_K: return "Q4_K";
    case G3_DTYPE_Q5_K: return "Q5_K";
    case G3_DTYPE_Q6_K: return "Q6_K";
    default: return "unknown";
    }
}

int g3_dtype_from_name(const char *name, g3_dtype *out) {
    static const g3_dtype all[] = {G3_DTYPE_F32,  G3_DTYPE_F16,  G3_DTYPE_BF16, G3_DTYPE_Q8_0,
                                   G3_DTYPE_Q4_0, G3_DTYPE_Q4_1, G3_DTYPE_Q5_0, G3_DTYPE_Q5_1,
                                   G3_DTYPE_Q4_K, G3_DTYPE_Q5_K, G3_DTYPE_Q6_K};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcasecmp(name, g3_dtype_name(all[i]))) return *out = all[i], 1;
    return 0;
}
