/* Ordering of sampling candidates without allocating: partial selection (the k best, unordered) and sorting of
 * (logit, id) pairs, best first. "Best" is the larger logit; equal logits go to the lower id, so the order is
 * total and every result is deterministic. NaN logits must be filtered out before. */
#ifndef G3_SAMPLE_SELECT_H
#define G3_SAMPLE_SELECT_H

#include <stdint.h>

typedef struct g3_cand {
    float logit; /* logit after bias and penalties: the ordering key */
    float w;     /* unnormalized probability exp((logit - max) / temperature), once computed */
    int32_t id;  /* token id */
} g3_cand;

/* Rearranges a[0..n) so that a[0..k) holds the k best (in no particular order) and a[k..n) the rest.
 * Expected O(n) (quickselect, median-of-3); falls back to heapsort past a depth limit, so O(n log n) worst case. */
void g3_cand_select(g3_cand *a, int n, int k);
/* The k best of logits[0..vocab) (skipping -inf and NaN) in one pass with a k-entry heap in out[0..k): O(vocab)
 * compares plus O(k log(vocab/k) log k) expected heap updates. Returns how many were found (< k when fewer are
 * valid); out is in heap order, and .w is left unset. */
int g3_cand_top_k_scan(const float *logits, int vocab, int k, g3_cand *out);
/* Weighted selection: rearranges a[0..n) and returns the smallest j such that the j best candidates have total
 * weight (.w) >= need, with those j in a[0..j) (in no particular order); n if the whole array falls short.
 * Expected O(n) (quickselect that only descends into the side holding the cut). */
int g3_cand_mass_prefix(g3_cand *a, int n, double need);
/* Sorts a[0..n) best first (introsort: quicksort + insertion sort + heapsort fallback). */
void g3_cand_sort(g3_cand *a, int n);

#endif
