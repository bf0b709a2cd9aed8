/* The passes of the sampler that touch every one of the vocab logits, written with GCC/Clang vector extensions
 * (4 floats at a time): argmax, and exp weights with their sum. */
#ifndef G3_SAMPLE_KERNELS_H
#define G3_SAMPLE_KERNELS_H

#include <stdint.h>

#include "sample/select.h"

#define G3_SMP_BLOCK 64 /* weights per partial sum written by g3_smp_weights */

/* Lowest index of the largest l[i] > -inf (NaN never wins); *max_out gets that value. Returns 0 with *max_out =
 * -inf when no l[i] is > -inf. */
int32_t g3_smp_argmax(const float *l, int n, float *max_out);

/* w[i] = exp(s) if s >= thr else 0, with s = (l[i] - m) / temp computed exactly so (IEEE float):
 * callers that recompute s get the same value. thr must be >= -87 (where exp leaves the normal range); NaN and -inf
 * logits get 0. blocks[b] = sum of w[b*G3_SMP_BLOCK ...] (float lanes of 8 terms each, then double: relative error
 * ~1e-7; a draw rescales within the block, so it stays consistent); returns the total. exp: ~2 ulp. */
double g3_smp_weights(const float *l, int n, float m, float temp, float thr, float *w, double *blocks);

/* c[j].w = exp((c[j].logit - m) / temp) (the same exp as above); returns the sum in double. */
double g3_smp_cand_weights(g3_cand *c, int n, float m, float temp);

#endif
