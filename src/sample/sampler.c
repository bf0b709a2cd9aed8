/* The per-request sampling chain (semantics in sampler.h): logit bias, penalties over a window of accepted
 * tokens, greedy argmax, raw log-probabilities, a seeded xoshiro256**; the tempered distribution is dist.c's.
 * Everything is allocated in g3_sampler_create; the per-token functions never allocate. */
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "sample/kernels.h"
#include "sample/sampler_internal.h"

/* ---- random numbers: splitmix64 seeding, xoshiro256** ---------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t st[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) st[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static double rng_uniform53(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

float g3_sampler_uniform(g3_sampler *s) { return s ? (float)(rng_next(s->rng) >> 40) * 0x1.0p-24f : 0.0f; }

/* ---- settings ---------------------------------------------------------------------------------------------- */

void g3_sampling_default(g3_sampling *s) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->temperature = 0.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
    s->min_p = 0.0f;
    s->repetition_penalty = 1.0f;
    s->presence_penalty = 0.0f;
    s->frequency_penalty = 0.0f;
    s->penalty_last_n = 64;
    s->seed = 0;
    s->n_logprobs = 0;
    s->logit_bias = NULL;
    s->n_logit_bias = 0;
}

static g3_status check_settings(const g3_sampling *p, int vocab, g3_error *err) {
    if (vocab <= 0) return g3_fail(err, G3_ERR_ARG, "sampler: vocabulary size %d must be positive", vocab);
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return g3_fail(err, G3_ERR_ARG, "sampler: temperature %g must be a finite number >= 0", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return g3_fail(err, G3_ERR_ARG, "sampler: top_p %g must be in (0, 1] (1 = off)", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return g3_fail(err, G3_ERR_ARG, "sampler: min_p %g must be in [0, 1] (0 = off)", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return g3_fail(err, G3_ERR_ARG, "sampler: repetition_penalty %g must be a finite number > 0 (1 = off)",
                       p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return g3_fail(err, G3_ERR_ARG, "sampler: presence_penalty %g must be finite", p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return g3_fail(err, G3_ERR_ARG, "sampler: frequency_penalty %g must be finite", p->frequency_penalty);
    if (p->penalty_last_n < 0 || p->penalty_last_n > G3_MAX_PENALTY_WINDOW)
        return g3_fail(err, G3_ERR_ARG, "sampler: penalty_last_n %d must be in 0..%d (0 = the whole history)",
                       p->penalty_last_n, G3_MAX_PENALTY_WINDOW);
    if (p->n_logprobs < 0 || p->n_logprobs > G3_MAX_LOGPROBS)
        return g3_fail(err, G3_ERR_ARG, "sampler: n_logprobs %d must be in 0..%d", p->n_logprobs, G3_MAX_LOGPROBS);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return g3_fail(err, G3_ERR_ARG, "sampler: logit_bias has %d entries but %s", p->n_logit_bias,
                       p->n_logit_bias < 0 ? "a negative count" : "no array");
    for (int i = 0; i < p->n_logit_bias; i++) {
        const g3_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= vocab)
            return g3_fail(err, G3_ERR_ARG, "sampler: logit_bias[%d]: token %d outside the vocabulary 0..%d", i,
                           (int)b->token, vocab - 1);
        if (isnan(b->bias))
            return g3_fail(err, G3_ERR_ARG, "sampler: logit_bias[%d] (token %d): bias is NaN", i, (int)b->token);
    }
    return G3_OK;
}

/* The biases by token, ascending, one entry per token: a token's biases summed in the order given (so "duplicates
 * add up" costs one addition per token in the chain, and the device sampler applies the same sums). Returns the
 * number of distinct tokens, -1 when out of memory. */
typedef struct bias_ix {
    int32_t token, ix;
} bias_ix;
static int cmp_bias_ix(const void *a, const void *b) {
    const bias_ix *x = a, *y = b;
    if (x->token != y->token) return x->token < y->token ? -1 : 1;
    return (x->ix > y->ix) - (x->ix < y->ix);
}
static int merge_bias(const g3_logit_bias *in, int n, g3_logit_bias *out) {
    bias_ix *o = malloc((size_t)n * sizeof *o);
    if (!o) return -1;
    for (int i = 0; i < n; i++) o[i].token = in[i].token, o[i].ix = i;
    qsort(o, (size_t)n, sizeof *o, cmp_bias_ix);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k > 0 && out[k - 1].token == o[i].token) out[k - 1].bias += in[o[i].ix].bias;
        else out[k].token = o[i].token, out[k++].bias = in[o[i].ix].bias;
    }
    free(o);
    return k;
}

g3_sampler *g3_sampler_create(const g3_sampling *settings, int vocab, g3_error *err) {
    g3_sampling def;
    if (!settings) {
        g3_sampling_default(&def);
        settings = &def;
    }
    if (check_settings(settings, vocab, err) != G3_OK) return NULL;

    g3_sampler *s = calloc(1, sizeof *s);
    if (!s) goto out_nomem;
    s->p = *settings;
    s->vocab = vocab;
    if (s->p.top_k < 0) s->p.top_k = 0; /* vLLM spells "off" as -1 */
    s->penalties = s->p.repetition_penalty != 1.0f || s->p.presence_penalty != 0.0f ||
                   s->p.frequency_penalty != 0.0f;
    if (s->p.n_logit_bias > 0) {
        s->bias = malloc((size_t)s->p.n_logit_bias * sizeof *s->bias);
        if (!s->bias) goto out_free;
        s->p.n_logit_bias = merge_bias(settings->logit_bias, s->p.n_logit_bias, s->bias);
        if (s->p.n_logit_bias < 0) goto out_free;
    }
    s->p.logit_bias = s->bias;
    if (s->penalties) {
        s->ring_cap = s->p.penalty_last_n;
        s->list_cap = (s->ring_cap == 0 || s->ring_cap >= vocab / 2) ? vocab : 2 * s->ring_cap;
        s->count = calloc((size_t)vocab, sizeof *s->count);
        s->in_list = calloc((size_t)vocab, 1);
        s->list = malloc((size_t)s->list_cap * sizeof *s->list);
        if (s->ring_cap > 0) s->ring = malloc((size_t)s->ring_cap * sizeof *s->ring);
        if (!s->count || !s->in_list || !s->list || (s->ring_cap > 0 && !s->ring)) goto out_free;
    }
    if (s->p.temperature > 0.0f) {
        s->cand = malloc((size_t)vocab * sizeof *s->cand);
        s->w = malloc((size_t)vocab * sizeof *s->w);
        s->blocks = malloc(((size_t)vocab / G3_SMP_BLOCK + 1) * sizeof *s->blocks);
        if (!s->cand || !s->w || !s->blocks) goto out_free;
    }
    rng_seed(s->rng, s->p.seed);
    return s;

out_free:
    g3_sampler_free(s);
out_nomem:
    g3_fail(err, G3_ERR_NOMEM, "sampler: out of memory for a vocabulary of %d", vocab);
    return NULL;
}

void g3_sampler_free(g3_sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->ring);
    free(s->count);
    free(s->in_list);
    free(s->list);
    free(s->cand);
    free(s->w);
    free(s->blocks);
    free(s);
}

/* ---- penalty history ------------------------------------------------------------------------------------- */

/* Drops stale entries (count 0) from the list. */
static void compact_list(g3_sampler *s) {
    int n = 0;
    for (int i = 0; i < s->n_list; i++) {
        int32_t t = s->list[i];
        if (s->count[t] > 0) s->list[n++] = t;
        else s->in_list[t] = 0;
    }
    s->n_list = n;
}

void g3_sampler_accept(g3_sampler *s, int32_t t) {
    if (!s || !s->penalties || t < 0 || t >= s->vocab) return;
    if (s->ring_cap > 0) {
        if (s->ring_len == s->ring_cap) s->count[s->ring[s->ring_head]]--; /* the oldest leaves the window */
        else s->ring_len++;
        s->ring[s->ring_head] = t;
        s->ring_head = s->ring_head + 1 == s->ring_cap ? 0 : s->ring_head + 1;
    }
    if (s->count[t]++ == 0 && !s->in_list[t]) {
        /* live tokens <= window <= list_cap / 2 (or <= vocab = list_cap), so compacting always makes room */
        if (s->n_list == s->list_cap) compact_list(s);
        s->list[s->n_list++] = t;
        s->in_list[t] = 1;
    }
}

void g3_sampler_reset(g3_sampler *s) {
    if (!s) return;
    if (s->penalties) {
        for (int i = 0; i < s->n_list; i++) {
            s->count[s->list[i]] = 0;
            s->in_list[s->list[i]] = 0;
        }
        s->n_list = 0;
        s->ring_len = s->ring_head = 0;
    }
    rng_seed(s->rng, s->p.seed);
}

void g3_sampler_apply_penalties(g3_sampler *s, float *l) {
    if (!s || !l) return;
    for (int i = 0; i < s->p.n_logit_bias; i++) l[s->bias[i].token] += s->bias[i].bias;
    if (!s->penalties) return;
    const float rep = s->p.repetition_penalty, pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    for (int i = 0; i < s->n_list; i++) {
        int32_t t = s->list[i];
        int32_t c = s->count[t];
        if (c <= 0) continue;
        float x = l[t];
        if (rep != 1.0f) x = x > 0.0f ? x / rep : x * rep;
        x -= (float)c * freq + pres;
        l[t] = x;
    }
}

/* ---- greedy and log-probabilities ---------------------------------------------------------------------- */

/* Index of the largest logit, lowest id on ties; 0 if none is > -inf (all -inf or NaN). */
static int32_t argmax(const float *l, int n) {
    float m;
    return g3_smp_argmax(l, n, &m);
}

/* log_softmax normalizer of l (NaN = -inf) and the best nt logits into s->top (raw logits, best first, lowest
 * id on ties, -inf never listed). Returns lse; *argmax_out gets the argmax (same rule as argmax()). A +inf
 * logit makes the distribution uniform over the +inf tokens: lse is then +inf and *n_inf counts them. */
static double lse_and_top(g3_sampler *s, const float *l, int nt, int *n_top, int32_t *argmax_out, int *n_inf) {
    int k = g3_smp_top_n(l, s->vocab, nt, s->top); /* nt >= 1, so top[0] is the argmax */
    *n_top = k;
    *n_inf = 0;
    *argmax_out = k > 0 ? s->top[0].token : 0;
    float m = k > 0 ? s->top[0].logprob : -INFINITY;
    if (m == -INFINITY) return -INFINITY;
    if (m == INFINITY) {
        for (int i = 0; i < s->vocab; i++) *n_inf += l[i] == INFINITY;
        return INFINITY;
    }
    return (double)m + log(g3_smp_sumexp(l, s->vocab, m));
}

/* log p of a token with logit x under the normalizer from lse_and_top. */
static float logprob_of(float x, double lse, int n_inf) {
    if (n_inf > 0) return x == INFINITY ? (float)-log((double)n_inf) : -INFINITY;
    if (!(x > -INFINITY)) return -INFINITY;
    return (float)((double)x - lse);
}

/* ---- entry points ---------------------------------------------------------------------------------------- */

int32_t g3_sampler_sample(g3_sampler *s, float *logits, float *logprob, g3_token_logprob *top, int *n_top) {
    if (n_top) *n_top = 0;
    if (!s || !logits) return 0;
    g3_sampler_apply_penalties(s, logits);

    const int want_lp = s->p.n_logprobs > 0;
    double lse = 0.0;
    int nt = 0, n_inf = 0;
    int32_t tok = 0;
    if (want_lp) lse = lse_and_top(s, logits, s->p.n_logprobs, &nt, &tok, &n_inf); /* tok = argmax */

    if (s->p.temperature == 0.0f) {
        if (!want_lp) tok = argmax(logits, s->vocab);
    } else {
        g3_dist d;
        g3_dist_build(s, logits, &d);
        tok = g3_dist_draw(s, &d, rng_uniform53(s->rng));
    }

    if (want_lp) {
        if (logprob) *logprob = logprob_of(logits[tok], lse, n_inf);
        if (top)
            for (int j = 0; j < nt; j++) {
                top[j].token = s->top[j].token;
                top[j].logprob = logprob_of(s->top[j].logprob, lse, n_inf);
            }
        if (n_top) *n_top = nt;
    }
    return tok;
}

int g3_sampler_candidates(g3_sampler *s, float *logits, int32_t *ids, float *probs) {
    if (!s || !logits || !ids || !probs) return 0;
    g3_sampler_apply_penalties(s, logits);
    if (s->p.temperature == 0.0f) {
        ids[0] = argmax(logits, s->vocab);
        probs[0] = 1.0f;
        return 1;
    }
    g3_dist d;
    g3_dist_build(s, logits, &d);
    return g3_dist_export(s, &d, ids, probs);
}

/* ---- the chain on a device (backend.h's forward_sample) ---------------------------------------------------------- */

/* Index of token t in the merged biases, -1 if it has none (binary search: they are sorted by token). */
static int bias_index(const g3_sampler *s, int32_t t) {
    int lo = 0, hi = s->p.n_logit_bias - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (s->bias[mid].token == t) return mid;
        if (s->bias[mid].token < t) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Token t is in the penalty window but has no bias (so it needs an entry of its own). */
static int window_only(const g3_sampler *s, int32_t t) { return s->count[t] > 0 && bias_index(s, t) < 0; }

int g3_sampler_device_entries(const g3_sampler *s) {
    if (!s || s->p.n_logprobs > 0) return -1;
    int n = s->p.n_logit_bias;
    if (s->penalties)
        for (int i = 0; i < s->n_list; i++) n += window_only(s, s->list[i]);
    return n;
}

int g3_sampler_history_free(const g3_sampler *s) { return s && !s->penalties && s->p.n_logprobs <= 0; }

int g3_sampler_device_row(g3_sampler *s, g3_dev_sample *row, g3_dev_adjust *adj) {
    memset(row, 0, sizeof *row);
    row->temperature = s->p.temperature;
    row->top_k = s->p.top_k < s->vocab ? s->p.top_k : 0;
    row->top_p = s->p.top_p;
    row->min_p = s->p.min_p;
    row->repetition_penalty = s->p.repetition_penalty;
    row->presence_penalty = s->p.presence_penalty;
    row->frequency_penalty = s->p.frequency_penalty;
    int n = 0;
    for (int i = 0; i < s->p.n_logit_bias; i++) {
        adj[n].token = s->bias[i].token;
        adj[n].bias = s->bias[i].bias;
        adj[n++].count = s->penalties ? s->count[s->bias[i].token] : 0;
    }
    if (s->penalties)
        for (int i = 0; i < s->n_list; i++) {
            int32_t t = s->list[i];
            if (window_only(s, t)) adj[n].token = t, adj[n].bias = 0.0f, adj[n++].count = s->count[t];
        }
    row->n_adj = n;
    if (s->p.temperature > 0.0f) row->u = rng_uniform53(s->rng); /* as g3_sampler_sample: one per stochastic token */
    return n;
}
