/* Small float32 operations of the CPU forward: norms, rope, GeGLU and single-query attention over paged K/V. */
#ifndef G3_BACKEND_CPU_OPS_H
#define G3_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

/* dst = src / sqrt(mean(src^2) + eps) * w   (w already holds 1 + weight); dst may equal src. */
void g3_rmsnorm(float *dst, const float *src, const float *w, int n, float eps);
/* h += rms(t) * w; t is overwritten. */
void g3_add_rmsnorm(float *h, float *t, const float *w, int n, float eps);
/* gate = gelu_tanh(gate) * up */
void g3_geglu(float *gate, const float *up, int n);
/* Rotate-half rope: pairs (i, i + D/2) turned by pos * inv_freq[i]. */
void g3_rope(float *x, int D, int pos, const float *inv_freq);
/* One query head against keys first..pos of a sequence in a paged pool.
 * Pool block layout: [n_layers_kind][2][KVH][B][D]; block_floats = floats per block; li = layer within kind. */
void g3_attend(const float *pool, size_t block_floats, int li, int KVH, int hk, int B, int D, const int32_t *table,
               int first, int pos, const float *q, float scale, float softcap, float *scores, float *out);

#endif
