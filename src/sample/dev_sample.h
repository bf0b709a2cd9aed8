/* What a backend needs to run a request's sampling chain (sampler.h, steps 1-9) on its device: the per-row
 * settings, the row's uniform and its logit adjustments as a sparse list. Plain data, shared by the sampler (which
 * fills it: g3_sampler_device_row), the engine and the backends (backend.h's forward_sample). */
#ifndef G3_SAMPLE_DEV_SAMPLE_H
#define G3_SAMPLE_DEV_SAMPLE_H

#include <stdint.h>

/* One out row. Filled by g3_sampler_device_row (sample/sampler.h), which also draws u, so the row's random stream
 * advances as g3_sampler_sample's would. Steps 1-3 come as sparse adjustments: one entry per distinct token that has
 * a logit bias (the sum of its biases) or occurs in the penalty window (its count there). */
typedef struct g3_dev_adjust {
    int32_t token;
    int32_t count; /* occurrences in the penalty window (0: bias only) */
    float bias;    /* summed logit bias (0: penalties only) */
} g3_dev_adjust;
typedef struct g3_dev_sample {
    float temperature; /* 0 = greedy: argmax after the adjustments */
    float top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int32_t top_k;     /* 0 = off */
    int32_t adj0;      /* first of this row's entries in the batch's adjustment array */
    int32_t n_adj;     /* its number of entries */
    int32_t pad;
    double u;          /* the draw's uniform in [0, 1) (temperature > 0) */
} g3_dev_sample;
typedef struct g3_dev_sampling {
    const g3_dev_sample *row;  /* [n_out] */
    const g3_dev_adjust *adj;  /* [n_adj] */
    int n_adj;
} g3_dev_sampling;
/* Adjustment entries a backend's forward_sample takes per out row (rows needing more are sampled on the host). */
#define G3_DEV_ADJ_PER_ROW 2048

#endif
