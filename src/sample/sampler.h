/* The sampling chain of one request: logit bias -> penalties (repetition, presence, frequency over the last
 * penalty_last_n tokens) -> temperature -> top-k -> top-p -> min-p -> seeded draw; greedy when temperature is 0.
 * Log-probabilities (of the raw logits' softmax) with top-N alternatives on request. All buffers are allocated at
 * creation: sampling a token allocates nothing. */
#ifndef G3_SAMPLE_SAMPLER_H
#define G3_SAMPLE_SAMPLER_H

#include "gemma3.h"

typedef struct g3_sampler g3_sampler;

/* The logit_bias array is copied. Returns NULL on allocation failure (err set). */
g3_sampler *g3_sampler_create(const g3_sampling *s, int vocab, g3_error *err);
void g3_sampler_free(g3_sampler *s);
/* Records a token in the history the penalties look at (generated tokens; the caller decides about prompts). */
void g3_sampler_accept(g3_sampler *s, int32_t token);
/* Picks a token from logits[vocab] (the array is modified). If the request asked for logprobs, fills
 * *logprob and top[0..n_logprobs) (top must hold n_logprobs entries) and sets *n_top. */
int32_t g3_sampler_sample(g3_sampler *s, float *logits, float *logprob, g3_token_logprob *top, int *n_top);
/* Draws a uniform float in [0,1) from the sampler's seeded generator (exposed for tests). */
float g3_sampler_uniform(g3_sampler *s);

#endif
