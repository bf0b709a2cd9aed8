/* The sampler's state, shared by sampler.c (settings, history, penalties, logprobs, entry points) and dist.c (the
 * tempered, truncated distribution and the draw). Not part of any public interface. */
#ifndef G3_SAMPLE_SAMPLER_INTERNAL_H
#define G3_SAMPLE_SAMPLER_INTERNAL_H

#include "sample/sampler.h"
#include "sample/kernels.h"
#include "sample/select.h"

#define G3_MAX_LOGPROBS 20
#define G3_MAX_PENALTY_WINDOW (1 << 20)
#define G3_TOPK_HEAP 2048  /* top-k up to this uses a one-pass heap; above, collect + quickselect */
#define G3_TOPP_SMALL 2048 /* top-p over at most this many candidates just sorts them */
#define G3_TOPP_BINS 1024  /* top-p histogram: bins of width 1/16 in (l - max) / T over [-64, 0], + a tail */
_Static_assert(G3_TOPP_BINS < G3_SMP_HIST_MAX, "histogram size");

struct g3_sampler {
    g3_sampling p;        /* settings (p.logit_bias points at bias; top_k < 0 stored as 0) */
    int vocab;            /* logits per call */
    g3_logit_bias *bias;  /* [p.n_logit_bias] copy of the caller's biases */
    uint64_t rng[4];      /* xoshiro256** state */
    int penalties;        /* any of repetition / presence / frequency on (else no history is kept) */

    /* Penalty history (allocated only when penalties are on). The window is a ring of the last ring_cap
     * accepted tokens (ring_cap 0 = unbounded: counts only grow). count[t] = occurrences of t in the window.
     * list[0..n_list) holds every token with count > 0, plus possibly stale ones (count 0, in_list still 1)
     * that are compacted away when the list fills up; so penalties cost O(window), not O(vocab). */
    int32_t *ring;        /* [ring_cap] */
    int ring_cap, ring_len, ring_head;
    int32_t *count;       /* [vocab] */
    uint8_t *in_list;     /* [vocab] */
    int32_t *list;        /* [list_cap], list_cap = min(vocab, 2 * ring_cap) or vocab when unbounded */
    int n_list, list_cap;

    /* Stochastic path (allocated only when temperature > 0). */
    g3_cand *cand;        /* [vocab] candidates (sparse distributions) */
    float *w;             /* [vocab] weights over the whole vocabulary (dense distributions) */
    double *blocks;       /* [vocab / G3_SMP_BLOCK + 1] partial sums of w */
    double bins[G3_TOPP_BINS + 1]; /* top-p histogram of weights */
    double lane_bins[4][G3_SMP_HIST_MAX]; /* its four partial sums from the kernel */
    int32_t lane_counts[4][G3_SMP_HIST_MAX]; /* token counts per bin (top-k > G3_TOPK_HEAP), four partials */

    g3_token_logprob top[G3_MAX_LOGPROBS]; /* logprob alternatives, best first (raw logits until converted) */
};

/* One step's distribution after temperature, top-k, top-p and min-p (steps 5-8 of sampler.h). Dense: weight w[i]
 * for every token (0 = excluded), partial sums in blocks. Sparse: cand[0..n) with weights in .w. z = total weight. */
typedef struct g3_dist {
    int dense;
    int n;          /* sparse: candidates; dense: vocab */
    double z;       /* total weight */
    int32_t argmax; /* the most probable token (a fallback should rounding leave u * z past the last weight) */
} g3_dist;

/* Builds the distribution of logits l (after bias and penalties) with temperature > 0. */
void g3_dist_build(g3_sampler *s, const float *l, g3_dist *d);
/* The token whose cumulative weight interval holds u * z, u in [0, 1). */
int32_t g3_dist_draw(const g3_sampler *s, const g3_dist *d, double u);
/* Writes the tokens with nonzero weight and their probabilities; returns how many. */
int g3_dist_export(const g3_sampler *s, const g3_dist *d, int32_t *ids, float *probs);

#endif
