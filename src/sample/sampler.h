/* The sampling chain of one request: logit bias -> penalties (repetition, presence, frequency over the last
 * penalty_last_n tokens) -> temperature -> top-k -> top-p -> min-p -> seeded draw; greedy when temperature is 0.
 * Log-probabilities (of the raw logits' softmax) with top-N alternatives on request. All buffers are allocated at
 * creation: sampling a token allocates nothing.
 *
 * Semantics, step by step, on logits l[vocab] (what OpenAI / vLLM / llama.cpp users expect):
 *   1. logit bias      l[t] += bias for every (token, bias) pair (duplicates add up). -inf (or a large negative
 *                      value such as -100) bans a token; +100 practically forces it; +inf forces it outright.
 *   2. repetition      for every token t that occurs in the penalty window (CTRL / llama.cpp / vLLM style):
 *                      l[t] = l[t] > 0 ? l[t] / repetition_penalty : l[t] * repetition_penalty.
 *   3. presence and    l[t] -= presence_penalty (once, if count(t) > 0) + count(t) * frequency_penalty
 *      frequency       (OpenAI style), count(t) = occurrences of t in the window.
 *      The window is the last penalty_last_n tokens given to g3_sampler_accept (0 = all of them). Tokens outside
 *      the window are untouched. Steps 1-3 are written back into the caller's logits[] array.
 *   4. temperature 0   argmax of the result (ties -> lowest id): a single pass, no random number is drawn.
 *   5. otherwise       p(t) = softmax(l / temperature); tokens whose logit is -inf (or NaN) have p = 0.
 *   6. top-k           keep the top_k most probable (top_k <= 0: off; ties broken towards the lowest id).
 *   7. top-p           renormalize over the survivors, sort by probability and keep the smallest prefix whose
 *                      cumulative probability >= top_p (top_p = 1: off). The most probable token always stays.
 *   8. min-p           drop tokens with p < min_p * p_max (min_p = 0: off). Since p_max's token survives 6 and 7,
 *                      the ratio is the same before or after renormalizing, i.e. min-p sees the tempered probs.
 *   9. draw            renormalize the survivors and draw one with the sampler's own generator: xoshiro256**
 *                      seeded from the 64-bit seed through splitmix64. Same seed and settings (and the same
 *                      logits) give the same tokens run after run on one machine; seed 0 is an ordinary
 *                      deterministic seed (a caller wanting randomness picks a random seed). One 53-bit uniform per
 *                      stochastic token, none when greedy. (Machines whose CPUs differ in AVX2/FMA may round the
 *                      weights differently in the last bit, and so rarely differ in a draw.)
 * Edge cases: a +inf logit (after step 3) forces the lowest such id; if every logit is -inf or NaN, token 0 is
 * returned. Tokens whose probability is below exp(-87) ~ 1.6e-38 times the most probable one's have weight 0 (never
 * drawn). Out-of-range ids given to g3_sampler_accept are ignored.
 *
 * Log-probabilities (n_logprobs = N in 1..20): log_softmax of the logits after steps 1-3 but BEFORE temperature
 * and truncation (vLLM's default "raw logprobs" view): the chosen token's value plus the N most probable tokens
 * sorted descending (ties: lowest id first). Tokens with a -inf logit are never listed, so *n_top may be < N.
 *
 * Cost per token at vocab 262,144 (nothing allocates, nothing sorts the vocabulary; the vocabulary-wide passes are
 * vectorized, 8 lanes with AVX2 + FMA where the CPU has them):
 *   greedy        one argmax pass (the penalties touch only the tokens in the window).
 *   top-k <= 2048 one pass with a k-entry heap (a vector compare skips tokens below the heap's root); the k
 *                 survivors are sorted (k log k) only for top-p.
 *   top-k > 2048  a count histogram of (l - max) / T (1024 bins of 1/16, plus a tail), then a quickselect inside
 *                 the one bin where the count reaches k.
 *   otherwise     one pass computing exp weights with per-64 partial sums for the draw (min-p folds in as a
 *                 threshold). Top-p adds a histogram of the weights in the same pass: the bins above the one where
 *                 the cumulative mass crosses top_p are kept whole, only that bin's members go through a weighted
 *                 quickselect, and the result becomes a threshold mask (kernels_impl.h, dist.c, select.c).
 *                 The kept set is the exact sorted-prefix set, up to the order of floating-point sums.
 *   logprobs      a top-N pass and a normalizer pass on top. */
#ifndef G3_SAMPLE_SAMPLER_H
#define G3_SAMPLE_SAMPLER_H

#include "gemma3.h"
#include "sample/dev_sample.h"

typedef struct g3_sampler g3_sampler;

/* The logit_bias array is copied. Returns NULL on bad settings (G3_ERR_ARG: negative temperature, top_p outside
 * (0,1], min_p outside [0,1], repetition_penalty <= 0, penalty_last_n outside 0..1048576, n_logprobs outside 0..20,
 * a logit_bias token outside the vocabulary, NaNs) or on allocation failure (G3_ERR_NOMEM), with err set. NULL
 * settings mean g3_sampling_default. One sampler per request: it is not meant for concurrent use. */
g3_sampler *g3_sampler_create(const g3_sampling *s, int vocab, g3_error *err);
void g3_sampler_free(g3_sampler *s);
/* Records a token in the history the penalties look at. The caller decides about prompt tokens (OpenAI counts only
 * generated tokens for presence / frequency; llama.cpp feeds the prompt into its window too). */
void g3_sampler_accept(g3_sampler *s, int32_t token);
/* Forgets the history and reseeds the generator from the seed: the sampler behaves as if freshly created. */
void g3_sampler_reset(g3_sampler *s);
/* Picks a token from logits[vocab] (the array is modified: on return it holds the logits after bias and
 * penalties, steps 1-3). If the request asked for logprobs, fills *logprob and top[0..n_logprobs) (top must hold
 * n_logprobs entries; either may be NULL) and sets *n_top (may be NULL; set to 0 when no logprobs were asked). */
int32_t g3_sampler_sample(g3_sampler *s, float *logits, float *logprob, g3_token_logprob *top, int *n_top);
/* Steps 1-3 only (bias and penalties, in place). */
void g3_sampler_apply_penalties(g3_sampler *s, float *logits);
/* Steps 1-8 without the draw: writes the final distribution (ids[n], probs[n], renormalized, in no particular
 * order; both arrays must hold vocab entries) and returns n. Temperature 0 gives the argmax with probability 1.
 * For tests and diagnostics; consumes no random number. */
int g3_sampler_candidates(g3_sampler *s, float *logits, int32_t *ids, float *probs);
/* The chain on a device (backend.h's forward_sample). g3_sampler_device_entries: the adjustment entries this
 * request's next token needs (biased tokens plus penalized ones), or -1 if it must be sampled on the host
 * (logprobs). g3_sampler_device_row: fills row and adj[0..n) (adj must hold g3_sampler_device_entries() entries;
 * row->adj0 is left 0 for the caller to set), draws the row's uniform as g3_sampler_sample would (one per
 * stochastic token) and returns n. Call it once per token, instead of g3_sampler_sample. */
int g3_sampler_device_entries(const g3_sampler *s);
int g3_sampler_device_row(g3_sampler *s, g3_dev_sample *row, g3_dev_adjust *adj);
/* Whether the next token's device row is the same whatever tokens are accepted before it (no penalties: the
 * history is not read), so that it may be built before the previous token is known (the engine's overlapped
 * decode). */
int g3_sampler_history_free(const g3_sampler *s);
/* Draws a uniform float in [0,1) from the sampler's seeded generator (exposed for tests). */
float g3_sampler_uniform(g3_sampler *s);

#endif
