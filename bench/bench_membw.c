/* Memory read bandwidth: every thread of a g3 pool streams its share of a large buffer (far larger than the
 * caches) with the widest SIMD loads the CPU has; prints the best GB/s over several passes. This is the ceiling
 * a memory-bound decode (m = 1 matmul) can reach.
 *
 *   bench_membw [-t threads] [-s MiB] [-r passes] [-H]    (-H: 4 KiB pages only, no transparent huge pages) */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
/* Software prefetch this far ahead of the loads: hardware prefetch alone leaves bandwidth unused here. */
#define PF_AHEAD 2048
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        _mm_prefetch((const char *)(p + i + PF_AHEAD), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + PF_AHEAD + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + PF_AHEAD + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + PF_AHEAD + 192), _MM_HINT_T0);
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
    }
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_or_epi64(a0);
}
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        _mm_prefetch((const char *)(p + i + PF_AHEAD), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + PF_AHEAD + 64), _MM_HINT_T0);
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}
#endif

static uint64_t read_plain(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) a ^= q[i], b ^= q[i + 1], c ^= q[i + 2], d ^= q[i + 3];
    return a ^ b ^ c ^ d;
}

typedef struct job {
    const uint8_t *buf;
    size_t bytes;
    int kind; /* 2 = avx512, 1 = avx2, 0 = plain */
    uint64_t sink[64];
} job;

static void task(void *arg, int ith, int nth) {
    job *j = arg;
    long b, e;
    g3_split_range((long)(j->bytes / 4096), 1, ith, nth, &b, &e);
    const uint8_t *p = j->buf + (size_t)b * 4096;
    size_t n = (size_t)(e - b) * 4096;
    uint64_t r;
#if defined(__x86_64__)
    if (j->kind == 2) r = read_avx512(p, n);
    else if (j->kind == 1) r = read_avx2(p, n);
    else
#endif
        r = read_plain(p, n);
    j->sink[ith & 63] ^= r;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = 0, passes = 10, small_pages = 0;
    size_t mib = 1024;
    int opt;
    while ((opt = getopt(argc, argv, "t:s:r:Hh")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 's': mib = (size_t)atol(optarg); break;
        case 'r': passes = atoi(optarg); break;
        case 'H': small_pages = 1; break;
        default: fprintf(stderr, "usage: %s [-t threads] [-s MiB] [-r passes] [-H]\n", argv[0]); return 2;
        }
    }
    size_t bytes = mib << 20;
    uint8_t *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!buf) {
        fprintf(stderr, "cannot allocate %zu MiB\n", mib);
        return 1;
    }
    /* huge pages keep TLB misses out of the figure (as a backend that allocates its weights this way sees it) */
    madvise(buf, bytes, small_pages ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = i * 0x9E3779B97F4A7C15ull;
        memcpy(buf + i, &v, 8);
    }
    g3_pool *p = g3_pool_create(threads);
    if (!p) return 1;
    job j = {.buf = buf, .bytes = bytes, .kind = 0};
#if defined(__x86_64__)
    __builtin_cpu_init();
    j.kind = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    double best = 0, sum = 0;
    g3_pool_run(p, task, &j); /* warm-up (page faults, clocks) */
    for (int r = 0; r < passes; r++) {
        double t0 = now_s();
        g3_pool_run(p, task, &j);
        double gbs = (double)bytes / (now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
        sum += gbs;
    }
    uint64_t s = 0;
    for (int i = 0; i < 64; i++) s ^= j.sink[i];
    printf("read bandwidth: %.1f GB/s best, %.1f GB/s mean (%d threads, %zu MiB, %s loads, %s pages, %d passes) [%llx]\n",
           best, sum / passes, g3_pool_size(p), mib, j.kind == 2 ? "avx512" : j.kind == 1 ? "avx2" : "64-bit",
           small_pages ? "4 KiB" : "huge", passes, (unsigned long long)(s & 0xf));
    g3_pool_free(p);
    free(buf);
    return 0;
}
