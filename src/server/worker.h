/* The engine thread and the hand-off between it and the HTTP threads.
 *
 *   HTTP thread ──g3_worker_enqueue(job)──▶ pending queue ──engine thread──▶ ops->submit (one engine request
 *                                                                            per choice)
 *   engine thread: loop { take new jobs and cancels; ops->step(on_event) } ── tokens ──▶ job channels
 *   HTTP thread  ◀── g3_job_wait / read channel (job->mu, job->cv) ─────────────────────────┘
 *
 * Only the engine thread touches the engine (ops submit/cancel/step/get_stats). A job is reference-counted: the
 * HTTP side holds one reference, the engine thread one while any of its choices is unfinished.
 * Admission control: at most max_seqs + max_queue sequences (choices) may be outstanding; past that, enqueue
 * answers G3_ERR_FULL (HTTP 429). Requests the engine cannot place yet (KV pool full) wait inside it. */
#ifndef G3_SERVER_WORKER_H
#define G3_SERVER_WORKER_H

#include <pthread.h>
#include <stdatomic.h>

#include "gemma3.h"
#include "server/metrics.h"
#include "server/ops.h"

#define G3_SRV_MAX_TOP 20 /* top_logprobs limit */

typedef struct g3_srv_tok {
    int32_t token;
    float logprob;
} g3_srv_tok;

/* One sequence of a job (OpenAI "choice"). Channel fields are guarded by the job's mutex. */
typedef struct g3_srv_choice {
    struct g3_srv_job *job;
    int index;
    /* engine thread only */
    g3_request_id id;
    int submitted;
    double t_last;             /* time of the previous token */
    /* channel (job->mu) */
    g3_srv_tok *toks;          /* [n_toks] */
    g3_token_logprob *tops;    /* [n_toks][job->n_top] */
    int n_toks, cap_toks;
    g3_finish finish;          /* != NONE: no more tokens will come */
    g3_status err_code;        /* when finish == ERROR */
    char err_msg[256];
    int n_cached;              /* prompt tokens from the prefix cache */
    int stop_wanted;           /* HTTP side: stop generating (a stop string matched) */
} g3_srv_choice;

typedef struct g3_srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* signalled on new tokens and on finish */
    atomic_int refs;
    /* the request, filled by the HTTP side before enqueue and read-only afterwards */
    int32_t *prompt;           /* [n_prompt], malloc'd, owned */
    int n_prompt;
    int max_tokens;
    int ignore_eos;
    g3_sampling sampling;      /* logit_bias -> lb */
    g3_logit_bias *lb;         /* owned */
    int n_top;                 /* top alternatives per token (0..G3_SRV_MAX_TOP); logprobs when want_logprobs */
    int want_logprobs;
    int n_choices;
    g3_srv_choice *choices;    /* [n_choices] */
    double t_arrival;          /* seconds, monotonic clock */
    /* guarded by mu */
    unsigned seq;              /* bumped on every change of a channel (see g3_job_wait) */
    int n_done;                /* choices with finish != NONE */
    int cancel;                /* HTTP side gave up: cancel every choice */
    /* worker's lists */
    struct g3_srv_job *next_pending;
    struct g3_srv_job *next_active, *prev_active;
    int first_token_seen;      /* engine thread */
} g3_srv_job;

/* A job with n choices and its own copy of nothing yet: the caller fills prompt, sampling etc. refs = 1. */
g3_srv_job *g3_job_create(int n_choices);
void g3_job_unref(g3_srv_job *j);
/* Blocks while j->seq == seen (nothing new since the caller read seq under mu) for at most timeout_ms.
 * Caller must NOT hold mu. */
void g3_job_wait(g3_srv_job *j, unsigned seen, int timeout_ms);

typedef struct g3_worker g3_worker;

typedef struct g3_worker_opts {
    int max_queue;     /* sequences allowed to wait beyond ops->max_seqs running */
    int step_delay_ms; /* test hook: sleep this long after every step (0 = never) */
} g3_worker_opts;

g3_status g3_worker_create(const g3_srv_ops *ops, g3_metrics *metrics, const g3_worker_opts *o, g3_worker **out,
                           g3_error *err);
/* Hands a job to the engine thread (taking a reference). G3_ERR_FULL: over the queue limit; G3_ERR_CANCELLED:
 * shutting down. */
g3_status g3_worker_enqueue(g3_worker *w, g3_srv_job *j, g3_error *err);
/* The HTTP side gave up on the job (client gone): every unfinished choice is cancelled at the next step. */
void g3_worker_cancel(g3_worker *w, g3_srv_job *j);
/* The HTTP side no longer wants more tokens of one choice (stop string matched). */
void g3_worker_stop_choice(g3_worker *w, g3_srv_choice *c);
/* Stops admitting, lets running jobs finish for up to grace_ms, then cancels the rest; returns when idle. */
void g3_worker_drain(g3_worker *w, int grace_ms);
/* Stops the thread (after g3_worker_drain, or cancelling everything) and frees the worker. */
void g3_worker_free(g3_worker *w);

double g3_srv_now(void); /* monotonic seconds */

#endif
