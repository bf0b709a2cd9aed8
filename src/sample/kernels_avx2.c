/* The sampler's vocabulary-wide kernels at 8 lanes, built with AVX2 + FMA (CMake gives *_avx2.c those flags);
 * kernels.c calls them when the CPU has both. The bodies are in kernels_impl.h. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define G3_SMP_W 8
#define G3_SMP_SFX avx2
#include "sample/kernels_impl.h"
#else
typedef int g3_smp_avx2_unused; /* ISO C: a translation unit needs one declaration */
#endif
