/* Server metrics: counters, gauges and latency histograms, rendered in the Prometheus text format for
 * GET /metrics. Written by the engine thread (tokens, finishes, latencies, engine gauges) and the HTTP threads
 * (responses by status); one mutex guards everything (updates are a handful per step). */
#ifndef G3_SERVER_METRICS_H
#define G3_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "gemma3.h"
#include "tokenizer/textstream.h"

#define G3_HISTO_MAX_BUCKETS 24

typedef struct g3_histo {
    const double *bounds; /* upper bounds in seconds, ascending; +Inf implied */
    int n_bounds;
    uint64_t counts[G3_HISTO_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last = above every bound */
    double sum;
    uint64_t count;
} g3_histo;

enum { G3_M_CODES = 12 };

typedef struct g3_metrics {
    pthread_mutex_t mu;
    uint64_t responses[G3_M_CODES]; /* by status code, see metrics.c k_codes */
    uint64_t requests_admitted;     /* generation requests handed to the engine thread */
    uint64_t disconnects;           /* generation requests whose client went away before the end */
    uint64_t finished[5];           /* by g3_finish (choices) */
    uint64_t prompt_tokens, generated_tokens, cached_prompt_tokens;
    g3_histo ttft;                  /* request arrival -> first generated token */
    g3_histo itl;                   /* between consecutive tokens of one sequence */
    g3_histo e2e;                   /* request arrival -> last token */
    /* gauges, refreshed by the engine thread after every step */
    g3_engine_stats engine;
    int queued;      /* requests in the server's queue, not yet given to the engine */
    int outstanding; /* sequences admitted and not finished */
} g3_metrics;

void g3_metrics_init(g3_metrics *m);
void g3_metrics_deinit(g3_metrics *m);
void g3_histo_observe(g3_histo *h, double seconds); /* caller holds m->mu */
void g3_metrics_response(g3_metrics *m, int status);
/* Appends the Prometheus text exposition to out. ready: 1 once the model is loaded. */
void g3_metrics_render(g3_metrics *m, int ready, g3_buf *out);

#endif
