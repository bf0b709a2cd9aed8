/* The engine thread: takes jobs from the pending queue, submits one engine request per choice, loops
 * ops->step and writes every token into its choice's channel; cancels what the HTTP side gave up (see worker.h). */
#include "server/worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"

double g3_srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* ---- jobs ---------------------------------------------------------------------------------------------------- */
g3_srv_job *g3_job_create(int n_choices) {
    if (n_choices < 1) return NULL;
    g3_srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->choices = calloc((size_t)n_choices, sizeof *j->choices);
    if (!j->choices) {
        free(j);
        return NULL;
    }
    j->n_choices = n_choices;
    for (int i = 0; i < n_choices; i++) {
        j->choices[i].job = j;
        j->choices[i].index = i;
    }
    pthread_mutex_init(&j->mu, NULL);
    cond_init_monotonic(&j->cv);
    atomic_init(&j->refs, 1);
    return j;
}

void g3_job_unref(g3_srv_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    for (int i = 0; i < j->n_choices; i++) {
        free(j->choices[i].toks);
        free(j->choices[i].tops);
    }
    free(j->choices);
    free(j->prompt);
    free(j->lb);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void g3_job_wait(g3_srv_job *j, unsigned seen, int timeout_ms) {
    struct timespec ts;
    deadline_in(&ts, timeout_ms);
    pthread_mutex_lock(&j->mu);
    while (j->seq == seen) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&j->mu);
}

/* ---- id -> choice map (linear probing, backward-shift deletion); engine thread only --------------------------- */
typedef struct idmap {
    g3_request_id *keys;
    g3_srv_choice **vals; /* NULL = empty slot */
    size_t cap, n;        /* cap: power of two */
} idmap;

static size_t id_hash(g3_request_id id, size_t cap) {
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

static int idmap_put(idmap *m, g3_request_id id, g3_srv_choice *c) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        g3_request_id *k = calloc(cap, sizeof *k);
        g3_srv_choice **v = calloc(cap, sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return 0;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->vals[i]) continue;
            size_t h = id_hash(m->keys[i], cap);
            while (v[h]) h = (h + 1) & (cap - 1);
            k[h] = m->keys[i];
            v[h] = m->vals[i];
        }
        free(m->keys);
        free(m->vals);
        m->keys = k;
        m->vals = v;
        m->cap = cap;
    }
    size_t h = id_hash(id, m->cap);
    while (m->vals[h]) h = (h + 1) & (m->cap - 1);
    m->keys[h] = id;
    m->vals[h] = c;
    m->n++;
    return 1;
}

static size_t idmap_slot(const idmap *m, g3_request_id id) {
    if (!m->cap) return (size_t)-1;
    size_t h = id_hash(id, m->cap);
    while (m->vals[h]) {
        if (m->keys[h] == id) return h;
        h = (h + 1) & (m->cap - 1);
    }
    return (size_t)-1;
}

static void idmap_del(idmap *m, g3_request_id id) {
    size_t i = idmap_slot(m, id);
    if (i == (size_t)-1) return;
    m->vals[i] = NULL;
    m->n--;
    /* backward shift: move later entries of the cluster into the hole when their home allows it */
    size_t j = i;
    for (;;) {
        j = (j + 1) & (m->cap - 1);
        if (!m->vals[j]) break;
        size_t home = id_hash(m->keys[j], m->cap);
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (between) continue;
        m->keys[i] = m->keys[j];
        m->vals[i] = m->vals[j];
        m->vals[j] = NULL;
        i = j;
    }
}

/* ---- worker ------------------------------------------------------------------------------------------------- */
struct g3_worker {
    g3_srv_ops ops;
    g3_metrics *m;
    g3_worker_opts o;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;      /* guards the fields down to cancel_all */
    pthread_cond_t cv;       /* wakes the engine thread */
    pthread_cond_t idle_cv;  /* outstanding went down */
    g3_srv_job *pending_head, *pending_tail;
    int n_pending;
    int outstanding;         /* choices admitted and not finished */
    int draining, cancel_all, quit;
    atomic_uint cancel_gen;  /* bumped by every cancel request */
    /* engine thread only */
    g3_srv_job *active;      /* jobs with submitted choices */
    int n_live;              /* submitted choices not finished */
    unsigned seen_cancel_gen;
    idmap ids;
};

/* Marks a choice finished (engine thread). */
static void finish_choice(g3_worker *w, g3_srv_choice *c, g3_finish f, g3_status code, const char *msg) {
    g3_srv_job *j = c->job;
    double now = g3_srv_now();
    pthread_mutex_lock(&j->mu);
    if (c->finish != G3_FINISH_NONE) {
        pthread_mutex_unlock(&j->mu);
        return;
    }
    c->finish = f;
    c->err_code = code;
    if (msg) snprintf(c->err_msg, sizeof c->err_msg, "%s", msg);
    j->n_done++;
    int job_done = j->n_done == j->n_choices;
    j->seq++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (c->submitted) {
        idmap_del(&w->ids, c->id);
        w->n_live--;
    }
    pthread_mutex_lock(&w->m->mu);
    w->m->finished[f]++;
    if (job_done) g3_histo_observe(&w->m->e2e, now - j->t_arrival);
    pthread_mutex_unlock(&w->m->mu);
    pthread_mutex_lock(&w->mu);
    w->outstanding--;
    pthread_cond_broadcast(&w->idle_cv);
    pthread_mutex_unlock(&w->mu);
}

static void on_event(const g3_event *ev, void *ctx) {
    g3_worker *w = ctx;
    size_t slot = idmap_slot(&w->ids, ev->id);
    if (slot == (size_t)-1) return; /* cancelled or unknown: ignore */
    g3_srv_choice *c = w->ids.vals[slot];
    g3_srv_job *j = c->job;
    double now = g3_srv_now();
    int first_of_choice = 0, first_of_job = 0;
    double itl = -1;
    if (ev->has_token) {
        pthread_mutex_lock(&j->mu);
        if (c->n_toks == c->cap_toks) {
            int cap = c->cap_toks ? c->cap_toks * 2 : 64;
            g3_srv_tok *t = realloc(c->toks, (size_t)cap * sizeof *t);
            g3_token_logprob *tp = t && j->n_top ? realloc(c->tops, (size_t)cap * (size_t)j->n_top * sizeof *tp)
                                                 : c->tops;
            if (t) c->toks = t;
            if (!t || (j->n_top && !tp)) {
                pthread_mutex_unlock(&j->mu);
                w->ops.cancel(w->ops.ctx, c->id);
                finish_choice(w, c, G3_FINISH_ERROR, G3_ERR_NOMEM, "out of memory storing generated tokens");
                return;
            }
            c->tops = tp;
            c->cap_toks = cap;
        }
        g3_srv_tok *t = &c->toks[c->n_toks];
        t->token = ev->token;
        t->logprob = ev->logprob;
        if (j->n_top) {
            g3_token_logprob *dst = c->tops + (size_t)c->n_toks * (size_t)j->n_top;
            int k = ev->n_top < j->n_top ? ev->n_top : j->n_top;
            if (k > 0 && ev->top) memcpy(dst, ev->top, (size_t)k * sizeof *dst);
            for (int i = k; i < j->n_top; i++) dst[i] = (g3_token_logprob){-1, 0};
        }
        first_of_choice = c->n_toks == 0;
        c->n_toks++;
        c->n_cached = ev->n_cached;
        j->seq++;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        if (!first_of_choice) itl = now - c->t_last;
        c->t_last = now;
        if (!j->first_token_seen) {
            j->first_token_seen = 1;
            first_of_job = 1;
        }
        pthread_mutex_lock(&w->m->mu);
        w->m->generated_tokens++;
        if (first_of_choice) w->m->cached_prompt_tokens += (uint64_t)(ev->n_cached > 0 ? ev->n_cached : 0);
        if (first_of_job) g3_histo_observe(&w->m->ttft, now - j->t_arrival);
        if (itl >= 0) g3_histo_observe(&w->m->itl, itl);
        pthread_mutex_unlock(&w->m->mu);
    }
    if (ev->finish != G3_FINISH_NONE)
        finish_choice(w, c, ev->finish, ev->finish == G3_FINISH_ERROR ? G3_ERR_DEVICE : G3_OK,
                      ev->finish == G3_FINISH_ERROR ? "the engine failed on this sequence" : NULL);
}

static void submit_job(g3_worker *w, g3_srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int cancelled = j->cancel;
    pthread_mutex_unlock(&j->mu);
    atomic_fetch_add(&j->refs, 1); /* the engine thread's reference, dropped when every choice is done */
    j->next_active = w->active;
    j->prev_active = NULL;
    if (w->active) w->active->prev_active = j;
    w->active = j;
    for (int i = 0; i < j->n_choices; i++) {
        g3_srv_choice *c = &j->choices[i];
        if (cancelled) {
            finish_choice(w, c, G3_FINISH_CANCELLED, G3_OK, NULL);
            continue;
        }
        g3_request r;
        memset(&r, 0, sizeof r);
        r.prompt = j->prompt;
        r.n_prompt = j->n_prompt;
        r.max_tokens = j->max_tokens;
        r.ignore_eos = j->ignore_eos;
        r.sampling = j->sampling;
        r.sampling.seed = j->sampling.seed + (uint64_t)i;
        r.sampling.n_logprobs = j->want_logprobs ? (j->n_top > 1 ? j->n_top : 1) : 0;
        r.user = c;
        g3_error err = {0};
        g3_status st = w->ops.submit(w->ops.ctx, &r, &c->id, &err);
        if (st == G3_OK && !idmap_put(&w->ids, c->id, c)) {
            w->ops.cancel(w->ops.ctx, c->id);
            st = g3_fail(&err, G3_ERR_NOMEM, "out of memory registering the request");
        }
        if (st != G3_OK) {
            finish_choice(w, c, G3_FINISH_ERROR, st, err.msg);
            continue;
        }
        c->submitted = 1;
        w->n_live++;
        pthread_mutex_lock(&w->m->mu);
        w->m->prompt_tokens += (uint64_t)j->n_prompt;
        pthread_mutex_unlock(&w->m->mu);
    }
}

/* Cancels what the HTTP side asked to cancel (or everything when all). */
static void apply_cancels(g3_worker *w, int all) {
    for (g3_srv_job *j = w->active; j; j = j->next_active) {
        for (int i = 0; i < j->n_choices; i++) {
            g3_srv_choice *c = &j->choices[i];
            pthread_mutex_lock(&j->mu);
            int want = c->finish == G3_FINISH_NONE && (all || j->cancel || c->stop_wanted);
            pthread_mutex_unlock(&j->mu);
            if (!want) continue;
            if (c->submitted) w->ops.cancel(w->ops.ctx, c->id);
            finish_choice(w, c, G3_FINISH_CANCELLED, G3_OK, NULL);
        }
    }
}

/* Drops finished jobs from the active list. */
static void sweep(g3_worker *w) {
    g3_srv_job *j = w->active;
    while (j) {
        g3_srv_job *next = j->next_active;
        pthread_mutex_lock(&j->mu);
        int done = j->n_done == j->n_choices;
        pthread_mutex_unlock(&j->mu);
        if (done) {
            if (j->prev_active) j->prev_active->next_active = next;
            else w->active = next;
            if (next) next->prev_active = j->prev_active;
            g3_job_unref(j);
        }
        j = next;
    }
}

static void fail_all(g3_worker *w, g3_status code, const char *msg) {
    for (g3_srv_job *j = w->active; j; j = j->next_active)
        for (int i = 0; i < j->n_choices; i++) {
            g3_srv_choice *c = &j->choices[i];
            if (c->finish != G3_FINISH_NONE) continue;
            if (c->submitted) w->ops.cancel(w->ops.ctx, c->id);
            finish_choice(w, c, G3_FINISH_ERROR, code, msg);
        }
}

static void *engine_thread(void *arg) {
    g3_worker *w = arg;
    int engine_active = 0; /* running + waiting as the engine last reported */
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->quit && !w->pending_head && w->n_live == 0 && engine_active == 0 &&
               atomic_load(&w->cancel_gen) == w->seen_cancel_gen && !w->cancel_all)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit && !w->pending_head && w->n_live == 0) {
            pthread_mutex_unlock(&w->mu);
            break;
        }
        g3_srv_job *take = w->pending_head;
        w->pending_head = w->pending_tail = NULL;
        w->n_pending = 0;
        int all = w->cancel_all;
        w->cancel_all = 0; /* one shot: nothing new is admitted once it is set (draining) */
        pthread_mutex_unlock(&w->mu);

        while (take) {
            g3_srv_job *next = take->next_pending;
            take->next_pending = NULL;
            submit_job(w, take);
            g3_job_unref(take); /* the queue's reference; submit_job took the engine thread's */
            take = next;
        }
        unsigned gen = atomic_load(&w->cancel_gen);
        if (all || gen != w->seen_cancel_gen) {
            w->seen_cancel_gen = gen;
            apply_cancels(w, all);
        }
        if (w->n_live > 0 || engine_active > 0) {
            g3_error err = {0};
            int n_active = 0;
            g3_status st = w->ops.step(w->ops.ctx, on_event, w, &n_active, &err);
            if (st != G3_OK) {
                fprintf(stderr, "gemma3 serve: engine step failed: %s\n", err.msg);
                fail_all(w, st, err.msg);
                n_active = 0;
            }
            engine_active = n_active;
            if (w->o.step_delay_ms > 0) usleep((useconds_t)w->o.step_delay_ms * 1000u);
        }
        sweep(w);
        g3_engine_stats s;
        memset(&s, 0, sizeof s);
        w->ops.get_stats(w->ops.ctx, &s);
        pthread_mutex_lock(&w->mu);
        int queued = w->n_pending, outstanding = w->outstanding;
        pthread_mutex_unlock(&w->mu);
        pthread_mutex_lock(&w->m->mu);
        w->m->engine = s;
        w->m->queued = queued;
        w->m->outstanding = outstanding;
        pthread_mutex_unlock(&w->m->mu);
    }
    return NULL;
}

g3_status g3_worker_create(const g3_srv_ops *ops, g3_metrics *metrics, const g3_worker_opts *o, g3_worker **out,
                           g3_error *err) {
    *out = NULL;
    g3_worker *w = calloc(1, sizeof *w);
    if (!w) return g3_fail(err, G3_ERR_NOMEM, "server: out of memory creating the engine thread");
    w->ops = *ops;
    w->m = metrics;
    if (o) w->o = *o;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    cond_init_monotonic(&w->idle_cv);
    atomic_init(&w->cancel_gen, 0);
    if (pthread_create(&w->thread, NULL, engine_thread, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        pthread_cond_destroy(&w->idle_cv);
        free(w);
        return g3_fail(err, G3_ERR_NOMEM, "server: cannot start the engine thread");
    }
    w->started = 1;
    *out = w;
    return G3_OK;
}

g3_status g3_worker_enqueue(g3_worker *w, g3_srv_job *j, g3_error *err) {
    pthread_mutex_lock(&w->mu);
    if (w->draining || w->quit) {
        pthread_mutex_unlock(&w->mu);
        return g3_fail(err, G3_ERR_CANCELLED, "the server is shutting down");
    }
    int limit = w->ops.max_seqs + w->o.max_queue;
    if (w->outstanding + j->n_choices > limit) {
        int out = w->outstanding;
        pthread_mutex_unlock(&w->mu);
        return g3_fail(err, G3_ERR_FULL,
                       "the server is busy: %d sequences running or queued, limit %d (%d running + %d queued); "
                       "retry later",
                       out, limit, w->ops.max_seqs, w->o.max_queue);
    }
    w->outstanding += j->n_choices;
    atomic_fetch_add(&j->refs, 1);
    j->next_pending = NULL;
    if (w->pending_tail) w->pending_tail->next_pending = j;
    else w->pending_head = j;
    w->pending_tail = j;
    w->n_pending++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&w->m->mu);
    w->m->requests_admitted++;
    pthread_mutex_unlock(&w->m->mu);
    return G3_OK;
}

static void poke(g3_worker *w) {
    atomic_fetch_add(&w->cancel_gen, 1);
    pthread_mutex_lock(&w->mu);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void g3_worker_cancel(g3_worker *w, g3_srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int live = j->n_done < j->n_choices;
    j->cancel = 1;
    pthread_mutex_unlock(&j->mu);
    if (live) poke(w);
}

void g3_worker_stop_choice(g3_worker *w, g3_srv_choice *c) {
    pthread_mutex_lock(&c->job->mu);
    int live = c->finish == G3_FINISH_NONE;
    c->stop_wanted = 1;
    pthread_mutex_unlock(&c->job->mu);
    if (live) poke(w);
}

void g3_worker_drain(g3_worker *w, int grace_ms) {
    struct timespec ts;
    deadline_in(&ts, grace_ms > 0 ? grace_ms : 0);
    pthread_mutex_lock(&w->mu);
    w->draining = 1;
    while (w->outstanding > 0 && grace_ms > 0)
        if (pthread_cond_timedwait(&w->idle_cv, &w->mu, &ts) == ETIMEDOUT) break;
    if (w->outstanding > 0) {
        w->cancel_all = 1;
        pthread_cond_signal(&w->cv);
        while (w->outstanding > 0) pthread_cond_wait(&w->idle_cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

void g3_worker_free(g3_worker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->draining = 1;
    w->cancel_all = 1;
    w->quit = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->started) pthread_join(w->thread, NULL);
    while (w->active) { /* only when the thread ended with jobs left (it cancels all before quitting) */
        g3_srv_job *n = w->active->next_active;
        g3_job_unref(w->active);
        w->active = n;
    }
    free(w->ids.keys);
    free(w->ids.vals);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->idle_cv);
    free(w);
}
