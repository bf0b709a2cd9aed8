/* Prometheus text exposition of the server's counters, gauges and histograms (see metrics.h). */
#include "server/metrics.h"

#include <string.h>

static const int k_codes[G3_M_CODES] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 0, 0, 0};

/* TTFT and end-to-end latency: 1 ms .. 5 min; inter-token latency: 0.5 ms .. 10 s. */
static const double k_ttft_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                       2.5,   5,      10,    20,   40,    80,   160, 300};
static const double k_itl_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05,
                                      0.075,  0.1,   0.15,   0.2,   0.3,  0.5,   1,    2.5,  10};

void g3_metrics_init(g3_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.bounds = k_ttft_bounds;
    m->ttft.n_bounds = (int)(sizeof k_ttft_bounds / sizeof k_ttft_bounds[0]);
    m->e2e.bounds = k_ttft_bounds;
    m->e2e.n_bounds = m->ttft.n_bounds;
    m->itl.bounds = k_itl_bounds;
    m->itl.n_bounds = (int)(sizeof k_itl_bounds / sizeof k_itl_bounds[0]);
}

void g3_metrics_deinit(g3_metrics *m) { pthread_mutex_destroy(&m->mu); }

void g3_histo_observe(g3_histo *h, double s) {
    int i = 0;
    while (i < h->n_bounds && s > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += s;
    h->count++;
}

void g3_metrics_response(g3_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int slot = G3_M_CODES - 1; /* "other" */
    for (int i = 0; i < G3_M_CODES; i++)
        if (k_codes[i] == status) slot = i;
    m->responses[slot]++;
    pthread_mutex_unlock(&m->mu);
}

static void render_histo(g3_buf *o, const char *name, const char *help, const g3_histo *h) {
    g3_buf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        g3_buf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    g3_buf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
                  h->sum, name, (unsigned long long)h->count);
}

static void counter(g3_buf *o, const char *name, const char *help, uint64_t v) {
    g3_buf_printf(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void gauge(g3_buf *o, const char *name, const char *help, long long v) {
    g3_buf_printf(o, "# HELP %s %s\n# TYPE %s gauge\n%s %lld\n", name, help, name, name, v);
}

void g3_metrics_render(g3_metrics *m, int ready, g3_buf *o) {
    static const char *finish_names[5] = {"none", "stop", "length", "cancelled", "error"};
    pthread_mutex_lock(&m->mu);
    gauge(o, "gemma3_ready", "1 once the model is loaded and requests are served", ready);
    g3_buf_puts(o, "# HELP gemma3_http_responses_total HTTP responses by status code\n"
                   "# TYPE gemma3_http_responses_total counter\n");
    for (int i = 0; i < G3_M_CODES; i++) {
        if (k_codes[i])
            g3_buf_printf(o, "gemma3_http_responses_total{code=\"%d\"} %llu\n", k_codes[i],
                          (unsigned long long)m->responses[i]);
        else if (i == G3_M_CODES - 1)
            g3_buf_printf(o, "gemma3_http_responses_total{code=\"other\"} %llu\n",
                          (unsigned long long)m->responses[i]);
    }
    counter(o, "gemma3_requests_total", "generation requests admitted to the engine queue", m->requests_admitted);
    counter(o, "gemma3_client_disconnects_total", "generation requests whose client went away before the end",
            m->disconnects);
    g3_buf_puts(o, "# HELP gemma3_sequences_finished_total sequences (choices) finished, by reason\n"
                   "# TYPE gemma3_sequences_finished_total counter\n");
    for (int i = 1; i < 5; i++)
        g3_buf_printf(o, "gemma3_sequences_finished_total{reason=\"%s\"} %llu\n", finish_names[i],
                      (unsigned long long)m->finished[i]);
    counter(o, "gemma3_prompt_tokens_total", "prompt tokens of admitted sequences", m->prompt_tokens);
    counter(o, "gemma3_prompt_tokens_cached_total", "prompt tokens served from the prefix cache",
            m->cached_prompt_tokens);
    counter(o, "gemma3_generation_tokens_total", "generated tokens", m->generated_tokens);
    gauge(o, "gemma3_queue_length", "requests waiting: server queue plus engine waiting list",
          (long long)m->queued + m->engine.n_waiting);
    gauge(o, "gemma3_requests_running", "sequences being decoded", m->engine.n_running);
    gauge(o, "gemma3_sequences_outstanding", "sequences admitted and not finished", m->outstanding);
    gauge(o, "gemma3_kv_blocks_total", "KV-cache blocks in the pool", m->engine.kv_blocks_total);
    gauge(o, "gemma3_kv_blocks_used", "KV-cache blocks held by running sequences", m->engine.kv_blocks_used);
    gauge(o, "gemma3_kv_blocks_free", "KV-cache blocks free",
          m->engine.kv_blocks_total - m->engine.kv_blocks_used - m->engine.kv_blocks_cached);
    gauge(o, "gemma3_kv_blocks_cached", "KV-cache blocks held only by the prefix cache (reclaimable)",
          m->engine.kv_blocks_cached);
    counter(o, "gemma3_preemptions_total", "sequences sent back to the queue for lack of KV blocks",
            (uint64_t)m->engine.n_preempted);
    counter(o, "gemma3_decode_steps_overlapped_total",
            "decode steps queued on the backend before the tokens of the step before them were back",
            (uint64_t)m->engine.overlapped_steps);
    counter(o, "gemma3_engine_prompt_tokens_total", "prompt tokens processed by the engine (its own count)",
            (uint64_t)m->engine.prompt_tokens);
    counter(o, "gemma3_engine_cached_prompt_tokens_total", "prompt tokens the engine took from its prefix cache",
            (uint64_t)m->engine.cached_prompt_tokens);
    render_histo(o, "gemma3_time_to_first_token_seconds", "request arrival to first generated token", &m->ttft);
    render_histo(o, "gemma3_inter_token_latency_seconds", "time between consecutive tokens of a sequence", &m->itl);
    render_histo(o, "gemma3_request_duration_seconds", "request arrival to last token", &m->e2e);
    pthread_mutex_unlock(&m->mu);
}
