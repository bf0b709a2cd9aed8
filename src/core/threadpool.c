/* A fixed pool of persistent worker threads running data-parallel regions; the caller is thread 0.
 *
 * A region is published by bumping a generation counter; workers spin on it (with `pause`) for a short while
 * and then sleep on a condition variable. Completion is a countdown the caller spins on, again falling back
 * to sleeping. Sleepers announce themselves in a counter before their final check, and the other side takes the
 * mutex before signalling, so no wake-up can be lost (both sides use sequentially consistent atomics).
 * Nothing is allocated per region. */
#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* How long a thread spins before it sleeps: long enough to bridge the gaps between the parallel regions of one
 * decode step, short enough not to burn a core between tokens. G3_SPIN_US overrides it; pools with more threads
 * than cores do not spin. */
#define SPIN_NS 200000L

struct g3_pool {
    int n;                       /* threads including the caller */
    pthread_t *threads;          /* [n - 1] workers */
    struct worker *workers;      /* [n - 1] */
    g3_task_fn fn;               /* current region (written before gen is bumped) */
    void *arg;
    _Atomic unsigned gen;        /* region counter */
    _Atomic int pending;         /* workers that have not finished the current region */
    _Atomic int stop;
    _Atomic int sleepers;        /* workers inside the sleep path */
    _Atomic int caller_sleeping; /* the caller waits on done_cv */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    long spin_ns;
};

struct worker {
    g3_pool *p;
    int ith;
};

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Waits until gen differs from `seen`; returns the new value. */
static unsigned wait_work(g3_pool *p, unsigned seen) {
    unsigned g;
    long t0 = 0;
    for (int i = 0;; i++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if ((i & 255) == 255) {
            long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > p->spin_ns) break;
        }
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->work_cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *v) {
    struct worker *w = v;
    g3_pool *p = w->p;
    unsigned seen = 0;
    for (;;) {
        seen = wait_work(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->arg, w->ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_broadcast(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

g3_pool *g3_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    g3_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    p->spin_ns = SPIN_NS;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && n_threads > cores) p->spin_ns = 0; /* oversubscribed: a spinner would hold a needed core */
    const char *e = getenv("G3_SPIN_US");
    if (e && *e) p->spin_ns = atol(e) * 1000L;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
    if (pthread_mutex_init(&p->mu, NULL)) goto out_free;
    if (pthread_cond_init(&p->work_cv, NULL)) goto out_mutex;
    if (pthread_cond_init(&p->done_cv, NULL)) goto out_work_cv;
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->threads || !p->workers) goto out_arrays;
        for (int i = 1; i < n_threads; i++) {
            p->workers[i - 1] = (struct worker){p, i};
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->workers[i - 1])) {
                p->n = i; /* join the ones that started */
                g3_pool_free(p);
                return NULL;
            }
        }
    }
    return p;

out_arrays:
    free(p->threads);
    free(p->workers);
    pthread_cond_destroy(&p->done_cv);
out_work_cv:
    pthread_cond_destroy(&p->work_cv);
out_mutex:
    pthread_mutex_destroy(&p->mu);
out_free:
    free(p);
    return NULL;
}

void g3_pool_free(g3_pool *p) {
    if (!p) return;
    if (p->n > 1) {
        atomic_store(&p->stop, 1);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n - 1; i++) pthread_join(p->threads[i], NULL);
    }
    free(p->threads);
    free(p->workers);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int g3_pool_size(const g3_pool *p) { return p ? p->n : 1; }

void g3_pool_run(g3_pool *p, g3_task_fn fn, void *arg) {
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* publishes fn, arg, pending */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n);
    long t0 = 0;
    for (int i = 0;; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        cpu_relax();
        if ((i & 255) == 255) {
            long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > p->spin_ns) break;
        }
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_sleeping, 1);
    while (atomic_load(&p->pending) != 0) pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->caller_sleeping, 0);
    pthread_mutex_unlock(&p->mu);
}

void g3_split_range(long total, long align, int ith, int nth, long *begin, long *end) {
    if (align < 1) align = 1;
    if (nth < 1) nth = 1;
    if (total < 0) total = 0;
    long units = (total + align - 1) / align;
    long per = units / nth, rem = units % nth;
    long u0 = ith * per + (ith < rem ? ith : rem);
    long u1 = u0 + per + (ith < rem ? 1 : 0);
    long b = u0 * align, e = u1 * align;
    *begin = b < total ? b : total;
    *end = e < total ? e : total;
}
