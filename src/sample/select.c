/* Partial selection and sorting of sampling candidates, best first (see select.h). In-place, no allocation:
 * qsort is avoided because glibc's may allocate a merge buffer. */
#include "sample/select.h"

#include <math.h>
#include <string.h>

/* x goes before y: larger logit first, then lower id. */
static inline int before(const g3_cand *x, const g3_cand *y) {
    return x->logit > y->logit || (x->logit == y->logit && x->id < y->id);
}

static inline void swap(g3_cand *a, int i, int j) {
    g3_cand t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* Partitions a[lo..hi] (inclusive) around the median of a[lo], a[mid], a[hi]; returns the pivot's final index p:
 * a[lo..p) go before a[p], a(p..hi] after. */
static int partition(g3_cand *a, int lo, int hi) {
    int mid = lo + (hi - lo) / 2;
    if (before(&a[mid], &a[lo])) swap(a, lo, mid);
    if (before(&a[hi], &a[lo])) swap(a, lo, hi);
    if (before(&a[hi], &a[mid])) swap(a, mid, hi);
    swap(a, mid, hi); /* the median becomes the pivot at hi */
    g3_cand pivot = a[hi];
    int store = lo;
    for (int i = lo; i < hi; i++)
        if (before(&a[i], &pivot)) swap(a, i, store++);
    swap(a, store, hi);
    return store;
}

/* Heapsort of a[0..n) best first: a heap whose root is the element that goes last. */
static void sift_down(g3_cand *a, int root, int n) {
    for (;;) {
        int c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && before(&a[c], &a[c + 1])) c++; /* the child that goes later */
        if (!before(&a[root], &a[c])) return;
        swap(a, root, c);
        root = c;
    }
}

static void heap_sort(g3_cand *a, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(a, i, n);
    for (int end = n - 1; end > 0; end--) {
        swap(a, 0, end);
        sift_down(a, 0, end);
    }
}

static void insertion_sort(g3_cand *a, int n) {
    for (int i = 1; i < n; i++) {
        g3_cand x = a[i];
        int j = i - 1;
        while (j >= 0 && before(&x, &a[j])) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = x;
    }
}

static int depth_limit(int n) {
    int d = 0;
    while (n > 1) {
        n >>= 1;
        d++;
    }
    return 2 * d + 4;
}

/* One token into the k-entry heap h[0..*n) (root = the kept entry that goes last). Returns the new root logit
 * once the heap is full (the value a token must beat), else -inf. */
static inline float heap_offer(g3_cand *h, int *n, int k, float x, int32_t id) {
    if (!(x > -INFINITY)) return *n < k ? -INFINITY : h[0].logit; /* -inf and NaN */
    if (*n < k) {
        int j = (*n)++;
        g3_cand c = {x, 0.0f, id};
        while (j > 0) { /* sift up */
            int parent = (j - 1) / 2;
            if (!before(&h[parent], &c)) break;
            h[j] = h[parent];
            j = parent;
        }
        h[j] = c;
    } else if (x > h[0].logit) { /* ids ascend, so an equal logit never goes before the root */
        h[0].logit = x;
        h[0].id = id;
        sift_down(h, 0, k);
    }
    return *n < k ? -INFINITY : h[0].logit;
}

int g3_cand_top_k_scan(const float *l, int vocab, int k, g3_cand *h) {
    typedef float v4f __attribute__((vector_size(16)));
    typedef int32_t v4i __attribute__((vector_size(16)));
    if (k <= 0) return 0;
    int n = 0, i = 0;
    float thr = -INFINITY; /* a token must beat this to enter: -inf until the heap is full */
    for (; i + 4 <= vocab; i += 4) {
        v4f x;
        memcpy(&x, l + i, sizeof x);
        v4i gt = x > ((v4f){0} + thr);
        if (!(gt[0] | gt[1] | gt[2] | gt[3])) continue; /* nearly always, once the heap is full */
        for (int q = 0; q < 4; q++) thr = heap_offer(h, &n, k, l[i + q], i + q);
    }
    for (; i < vocab; i++) thr = heap_offer(h, &n, k, l[i], i);
    return n;
}

void g3_cand_select(g3_cand *a, int n, int k) {
    if (k <= 0 || k >= n) return;
    int lo = 0, hi = n - 1, depth = depth_limit(n);
    /* Invariant: a[0..lo) go before a[lo..n), a[0..hi] go before a(hi..n), and lo <= k <= hi + 1. */
    while (lo < hi) {
        if (depth-- == 0) {
            heap_sort(a + lo, hi - lo + 1);
            return;
        }
        int p = partition(a, lo, hi);
        if (p == k) return;
        if (p < k) lo = p + 1;
        else hi = p - 1;
    }
}

int g3_cand_mass_prefix(g3_cand *a, int n, double need) {
    int lo = 0, hi = n, depth = depth_limit(n);
    double acc = 0.0; /* weight of a[0..lo), all of which go before a[lo..n) */
    /* Invariant: the cut is in (lo, hi]: a[0..lo) weigh < need, and a[0..hi) weigh >= need (or hi = n). */
    while (hi - lo > 32 && depth-- > 0) {
        int p = partition(a, lo, hi - 1);
        double left = 0.0;
        for (int j = lo; j < p; j++) left += (double)a[j].w;
        if (acc + left >= need) {
            hi = p;
        } else {
            acc += left;
            if (acc + (double)a[p].w >= need) return p + 1;
            acc += (double)a[p].w;
            lo = p + 1;
        }
    }
    g3_cand_sort(a + lo, hi - lo);
    for (int j = lo; j < hi; j++) {
        acc += (double)a[j].w;
        if (acc >= need) return j + 1;
    }
    return hi; /* only through rounding (or when all of a[0..n) falls short) */
}

static void intro_sort(g3_cand *a, int lo, int hi, int depth) {
    while (hi - lo + 1 > 16) {
        if (depth-- == 0) {
            heap_sort(a + lo, hi - lo + 1);
            return;
        }
        int p = partition(a, lo, hi);
        /* recurse into the smaller side, loop on the larger: stack depth O(log n) */
        if (p - lo < hi - p) {
            intro_sort(a, lo, p - 1, depth);
            lo = p + 1;
        } else {
            intro_sort(a, p + 1, hi, depth);
            hi = p - 1;
        }
    }
    if (hi > lo) insertion_sort(a + lo, hi - lo + 1);
}

void g3_cand_sort(g3_cand *a, int n) {
    if (n > 1) intro_sort(a, 0, n - 1, depth_limit(n));
}
