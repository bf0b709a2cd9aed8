/* Thread pool: every thread runs each region exactly once with the right (ith, nth); results are complete when
 * g3_pool_run returns; many back-to-back regions; pools of 1..4 threads created and freed repeatedly;
 * g3_split_range covers [0, total) exactly with aligned, balanced pieces. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "testutil.h"

typedef struct sum_job {
    const int *v;
    long n;
    long long partial[8];
    int seen_nth[8];
    _Atomic int calls;
} sum_job;

static void sum_task(void *arg, int ith, int nth) {
    sum_job *j = arg;
    long b, e;
    g3_split_range(j->n, 16, ith, nth, &b, &e);
    long long s = 0;
    for (long i = b; i < e; i++) s += j->v[i];
    j->partial[ith] = s;
    j->seen_nth[ith] = nth;
    atomic_fetch_add(&j->calls, 1);
}

static void test_sums(void **state) {
    (void)state;
    long n = 100003;
    int *v = malloc(sizeof(int) * (size_t)n);
    assert_non_null(v);
    long long want = 0;
    for (long i = 0; i < n; i++) v[i] = (int)(i % 97) - 40, want += v[i];
    for (int t = 1; t <= 4; t++) {
        g3_pool *p = g3_pool_create(t);
        assert_non_null(p);
        assert_int_equal(g3_pool_size(p), t);
        for (int rep = 0; rep < 20; rep++) {
            sum_job j = {.v = v, .n = n};
            atomic_init(&j.calls, 0);
            g3_pool_run(p, sum_task, &j);
            assert_int_equal(atomic_load(&j.calls), t);
            long long s = 0;
            for (int i = 0; i < t; i++) {
                s += j.partial[i];
                assert_int_equal(j.seen_nth[i], t);
            }
            assert_true(s == want);
        }
        g3_pool_free(p);
    }
    free(v);
}

/* Each region increments a per-thread counter; thousands of tiny regions in a row, as in a decode step. */
typedef struct count_job {
    long counts[8];
    long round;
    int bad;
} count_job;

static void count_task(void *arg, int ith, int nth) {
    count_job *j = arg;
    if (j->counts[ith] != j->round) j->bad = 1; /* previous region must have completed for every thread */
    j->counts[ith]++;
    (void)nth;
}

static void test_many_regions(void **state) {
    (void)state;
    for (int t = 1; t <= 4; t++) {
        g3_pool *p = g3_pool_create(t);
        assert_non_null(p);
        count_job j;
        memset(&j, 0, sizeof j);
        for (long r = 0; r < 3000; r++) {
            j.round = r;
            g3_pool_run(p, count_task, &j);
            for (int i = 0; i < t; i++) assert_int_equal(j.counts[i], r + 1);
        }
        assert_int_equal(j.bad, 0);
        g3_pool_free(p);
    }
}

/* Regions separated by pauses longer than the spin time, so that workers go to sleep and must be woken. */
static void test_sleep_wake(void **state) {
    (void)state;
    g3_pool *p = g3_pool_create(3);
    assert_non_null(p);
    count_job j;
    memset(&j, 0, sizeof j);
    for (long r = 0; r < 6; r++) {
        usleep(r % 2 ? 300000 : 1000);
        j.round = r;
        g3_pool_run(p, count_task, &j);
        for (int i = 0; i < 3; i++) assert_int_equal(j.counts[i], r + 1);
    }
    assert_int_equal(j.bad, 0);
    g3_pool_free(p);
}

/* A worker that is slow (sleeps) makes the caller fall back to sleeping on completion. */
static void slow_task(void *arg, int ith, int nth) {
    _Atomic int *done = arg;
    if (ith == nth - 1) usleep(300000);
    atomic_fetch_add(done, 1);
}

static void test_slow_worker(void **state) {
    (void)state;
    g3_pool *p = g3_pool_create(2);
    assert_non_null(p);
    _Atomic int done;
    atomic_init(&done, 0);
    g3_pool_run(p, slow_task, (void *)&done);
    assert_int_equal(atomic_load(&done), 2);
    g3_pool_free(p);
}

static void test_create_free(void **state) {
    (void)state;
    for (int rep = 0; rep < 50; rep++) {
        g3_pool *p = g3_pool_create(1 + rep % 4);
        assert_non_null(p);
        if (rep % 2) {
            count_job j;
            memset(&j, 0, sizeof j);
            g3_pool_run(p, count_task, &j);
            assert_int_equal(j.counts[0], 1);
        }
        g3_pool_free(p);
    }
    g3_pool_free(NULL);
    g3_pool *p = g3_pool_create(0); /* one per core */
    assert_non_null(p);
    assert_true(g3_pool_size(p) >= 1);
    g3_pool_free(p);
    /* a NULL pool runs the region inline as a single thread */
    count_job j;
    memset(&j, 0, sizeof j);
    g3_pool_run(NULL, count_task, &j);
    assert_int_equal(j.counts[0], 1);
}

static void test_split_range(void **state) {
    (void)state;
    long totals[] = {0, 1, 5, 16, 17, 100, 1000, 1001, 262144};
    long aligns[] = {1, 4, 16, 64};
    for (size_t a = 0; a < sizeof totals / sizeof *totals; a++)
        for (size_t b = 0; b < sizeof aligns / sizeof *aligns; b++)
            for (int nth = 1; nth <= 7; nth++) {
                long total = totals[a], align = aligns[b], prev_end = 0, maxlen = 0, minlen = total + 1;
                for (int i = 0; i < nth; i++) {
                    long s, e;
                    g3_split_range(total, align, i, nth, &s, &e);
                    assert_int_equal(s, prev_end);
                    assert_true(e >= s);
                    if (s < total) assert_int_equal(s % align, 0);
                    prev_end = e;
                    if (e - s > maxlen) maxlen = e - s;
                    if (e - s < minlen) minlen = e - s;
                }
                assert_int_equal(prev_end, total);
                /* balanced to within one alignment unit (the last piece may be short) */
                if (total >= align * nth) assert_true(maxlen - minlen <= align + align);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums),        cmocka_unit_test(test_many_regions), cmocka_unit_test(test_sleep_wake),
        cmocka_unit_test(test_slow_worker), cmocka_unit_test(test_create_free),  cmocka_unit_test(test_split_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
