/* A fixed pool of worker threads for data-parallel loops. The caller takes part as thread 0; workers spin
 * briefly before sleeping so that the many short parallel regions of a decode step stay cheap. */
#ifndef G3_CORE_THREADPOOL_H
#define G3_CORE_THREADPOOL_H

typedef struct g3_pool g3_pool;
typedef void (*g3_task_fn)(void *arg, int ith, int nth);

/* n_threads <= 0: one per online core. Returns NULL if threads cannot be started. */
g3_pool *g3_pool_create(int n_threads);
void g3_pool_free(g3_pool *p);
int g3_pool_size(const g3_pool *p);
/* Runs fn(arg, i, n) on every thread i in [0, n) and returns when all have finished. Not reentrant. */
void g3_pool_run(g3_pool *p, g3_task_fn fn, void *arg);
/* Splits [0, total) into n nearly equal ranges aligned to `align`; returns thread ith's [begin, end). */
void g3_split_range(long total, long align, int ith, int nth, long *begin, long *end);

#endif
