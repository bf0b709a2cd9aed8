/* The sampler's vocabulary-wide kernels at baseline width (4 lanes, every machine) and the dispatch to the 8-lane
 * AVX2 + FMA build (kernels_avx2.c) where the CPU has it. The bodies are in kernels_impl.h. */
#define G3_SMP_W 4
#define G3_SMP_SFX base
#include "sample/kernels_impl.h"

/* Read on every call (a load of a flag set by libgcc at startup): no static state to initialize. */
int g3_smp_cpu_avx2(void) {
#if G3_SMP_HAVE_AVX2
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

#if G3_SMP_HAVE_AVX2
#define G3_SMP_DISPATCH(name, ...) (g3_smp_cpu_avx2() ? name##_avx2(__VA_ARGS__) : name##_base(__VA_ARGS__))
#else
#define G3_SMP_DISPATCH(name, ...) name##_base(__VA_ARGS__)
#endif

static double sum_blocks(const double *blocks, int n) {
    double total = 0.0;
    for (int b = 0; b * G3_SMP_BLOCK < n; b++) total += blocks[b];
    return total;
}

int32_t g3_smp_argmax(const float *l, int n, float *max_out) {
    return G3_SMP_DISPATCH(g3_smp_argmax, l, n, max_out);
}

double g3_smp_weights(const float *l, int n, float m, float temp, float thr, float *w, double *blocks) {
    G3_SMP_DISPATCH(g3_smp_weights, l, n, m, temp, thr, w, blocks);
    return sum_blocks(blocks, n);
}

void g3_smp_weights_hist(const float *l, int n, float m, float temp, float *w, double (*hist)[G3_SMP_HIST_MAX],
                         int nbins) {
    G3_SMP_DISPATCH(g3_smp_weights_hist, l, n, m, temp, w, hist, nbins);
}

void g3_smp_count_hist(const float *l, int n, float m, float temp, int32_t (*cnt)[G3_SMP_HIST_MAX], int nbins) {
    G3_SMP_DISPATCH(g3_smp_count_hist, l, n, m, temp, cnt, nbins);
}

double g3_smp_mask(const float *l, int n, float m, float temp, float thr, float lstar, int32_t idstar, float *w,
                   double *blocks) {
    G3_SMP_DISPATCH(g3_smp_mask, l, n, m, temp, thr, lstar, idstar, w, blocks);
    return sum_blocks(blocks, n);
}

double g3_smp_cand_weights(g3_cand *c, int n, float m, float temp) {
    G3_SMP_DISPATCH(g3_smp_cand_weights, c, n, m, temp);
    double total = 0.0;
    for (int j = 0; j < n; j++) total += (double)c[j].w;
    return total;
}

double g3_smp_sumexp(const float *l, int n, float m) { return G3_SMP_DISPATCH(g3_smp_sumexp, l, n, m); }

int g3_smp_collect(const float *l, const float *w, int n, float lo, float hi, g3_cand *out) {
    return G3_SMP_DISPATCH(g3_smp_collect, l, w, n, lo, hi, out);
}

int g3_smp_top_n(const float *l, int n, int nt, g3_token_logprob *top) {
    return G3_SMP_DISPATCH(g3_smp_top_n, l, n, nt, top);
}
