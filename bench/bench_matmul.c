/* Matmul throughput on the shapes of Gemma 3 1B, per weight type: for m = 1 (decode) the GB/s of weight reads
 * and their ratio to the measured read bandwidth; for m > 1 (prefill) GFLOP/s. Weights are cycled through enough
 * copies (>= 256 MiB) that they come from DRAM, as in a real decode step. Times are the best of many runs. Ends with the per-token matmul time
 * of the whole 1B model (26 layers + logits head for decode; 26 layers for prefill).
 *
 *   bench_matmul [-t threads] [-T f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_k,q5_k,q6_k,TYPE_r8 (q8_0, q4_0, q5_0, q4_1,
 *                q5_1 repacked)] [-m 1,128]
 *                [-s NxK[,NxK...]]
 *                [-b GB/s] [-k scalar|avx2|avx512] [-r seconds per case] [-c copies (1: cache-resident)] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/matmul.h"
#include "core/threadpool.h"
#include "model/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
/* Software prefetch this far ahead of the loads: hardware prefetch alone leaves bandwidth unused here. */
#define PF_AHEAD 2048
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
    return (uint64_t)_mm256_extract_epi64(a0, 0);
}
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bw_job {
    const uint8_t *buf;
    size_t bytes;
    uint64_t sink[64];
} bw_job;

static void bw_task(void *arg, int ith, int nth) {
    bw_job *j = arg;
    long b, e;
    g3_split_range((long)(j->bytes / 4096), 1, ith, nth, &b, &e);
    const uint8_t *p = j->buf + (size_t)b * 4096;
    size_t n = (size_t)(e - b) * 4096;
    uint64_t r = 0;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) r = read_avx2(p, n);
    else
#endif
        for (size_t i = 0; i < n; i += 8) r ^= *(const uint64_t *)(p + i);
    j->sink[ith & 63] ^= r;
}

/* Best of 20 passes over 512 MiB (give -b with bench_membw's figure to compare runs). */
static double measure_bw(g3_pool *p) {
    size_t bytes = (size_t)512 << 20;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    bw_job j = {.buf = buf, .bytes = bytes};
    double best = 0;
    for (int r = 0; r < 20; r++) {
        double t0 = now_s();
        g3_pool_run(p, bw_task, &j);
        double g = (double)bytes / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(buf);
    return best;
}

static void empty_task(void *arg, int ith, int nth) { (void)arg, (void)ith, (void)nth; }

/* Microseconds per empty parallel region (best of 20 batches of 1000): the fixed cost of each g3_pool_run. */
static double region_us(g3_pool *p) {
    double best = 1e30;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = now_s();
        for (int i = 0; i < 1000; i++) g3_pool_run(p, empty_task, NULL);
        double us = (now_s() - t0) * 1e3;
        if (us < best) best = us;
    }
    return best;
}

static uint64_t rng = 88172645463325252ull;
static float rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static int g_copies; /* -c: weight copies to cycle through (0 = enough for 256 MiB) */

typedef struct shape { int n, k, per_layer; const char *name; } shape;

/* Gemma 3 1B: hidden 1152, 4 heads x 256 (q 1024), 1 kv head (256), ffn 6912, vocab 262144, 26 layers. */
static const shape k_1b[] = {
    {1024, 1152, 1, "q"}, {256, 1152, 2, "k,v"}, {1152, 1024, 1, "o"}, {6912, 1152, 2, "gate,up"},
    {1152, 6912, 1, "down"}, {262144, 1152, 0, "head"},
};

static uint32_t parse_type(const char *s) {
    g3_dtype t;
    char base[32];
    size_t n = strlen(s);
    if (n > 3 && n < sizeof base && !strcmp(s + n - 3, "_r8")) { /* the repacked form of a type: q5_0_r8, ... */
        memcpy(base, s, n - 3), base[n - 3] = 0;
        if (!g3_dtype_from_name(base, &t)) return 999;
        static const uint32_t r8[] = {G3_CPU_Q8_0_R8, G3_CPU_Q4_0_R8, G3_CPU_Q5_0_R8, G3_CPU_Q4_1_R8, G3_CPU_Q5_1_R8,
                                      G3_CPU_Q4_K_R8, G3_CPU_Q6_K_R8, G3_CPU_Q5_K_R8};
        for (size_t i = 0; i < sizeof r8 / sizeof r8[0]; i++)
            if (g3_matmul_repack_source(r8[i]) == (uint32_t)t) return r8[i];
        return 999;
    }
    return g3_dtype_from_name(s, &t) ? (uint32_t)t : 999;
}

static uint32_t base_type(uint32_t t) { return g3_matmul_repack_source(t) ? g3_matmul_repack_source(t) : t; }

/* Seconds per matmul of m rows against an n x k weight of `type`; NAN if the type cannot hold rows of k. */
static double time_case(g3_pool *p, uint32_t type, int n, int k, int m, double min_s) {
    uint32_t qtype = base_type(type);
    size_t rb = g3_row_bytes(qtype, k);
    if (!rb || (qtype != type && n % 8)) return NAN;
    size_t wbytes = rb * (size_t)n;
    int copies = g_copies > 0 ? g_copies : (int)((((size_t)256 << 20) + wbytes - 1) / wbytes);
    if (copies < 1) copies = 1;
    uint8_t **w = calloc((size_t)copies, sizeof *w);
    /* a pool of 64 random quantized rows, repeated */
    uint8_t *pool_rows = malloc(rb * 64);
    float *row = malloc(sizeof(float) * (size_t)k);
    g3_error err = {0};
    for (int r = 0; r < 64; r++) {
        for (int i = 0; i < k; i++) row[i] = rnd() * 0.05f;
        g3_quantize_row(qtype, row, pool_rows + (size_t)r * rb, k, &err);
    }
    for (int c = 0; c < copies; c++) {
        w[c] = aligned_alloc(64, (wbytes + 63) & ~(size_t)63);
        for (int r = 0; r < n; r++) memcpy(w[c] + (size_t)r * rb, pool_rows + (size_t)((r * 7 + c) % 64) * rb, rb);
        if (qtype != type) {
            uint8_t *packed = aligned_alloc(64, (g3_matmul_repack_bytes(qtype, n, k) + 63) & ~(size_t)63);
            g3_matmul_repack(qtype, w[c], n, k, packed);
            free(w[c]);
            w[c] = packed;
        }
    }
    float *x = malloc(sizeof(float) * (size_t)m * k), *y = malloc(sizeof(float) * (size_t)m * n);
    for (size_t i = 0; i < (size_t)m * k; i++) x[i] = rnd();
    void *scratch = malloc(g3_act_scratch_bytes(type, m, k) + 64);
    g3_act a;
    g3_act_prepare(p, &a, type, x, m, k, scratch);
    int warm = copies < 4 ? copies : 4;
    for (int c = 0; c < warm; c++) g3_matmul(p, &a, w[c], n, y, n); /* warm-up */
    /* the best of many timed runs: the machine is shared, and interference only ever adds time */
    int iters = 0;
    double t0 = now_s(), best = 1e30;
    do {
        double t1 = now_s();
        g3_act_prepare(p, &a, type, x, m, k, scratch); /* part of the cost, as in the forward pass */
        g3_matmul(p, &a, w[(warm + iters) % copies], n, y, n); /* the copies used longest ago: not in cache */
        double dt = now_s() - t1;
        if (dt < best) best = dt;
        iters++;
    } while (now_s() - t0 < min_s || iters < 3);
    for (int c = 0; c < copies; c++) free(w[c]);
    free(w), free(pool_rows), free(row), free(x), free(y), free(scratch);
    return best;
}

int main(int argc, char **argv) {
    int threads = 2;
    double bw = 0, min_s = 0.3;
    char types_s[256] = "bf16,q8_0_r8,q4_0_r8,q8_0,q4_0,f16,f32,q4_k,q6_k", ms_s[128] = "1,128", shapes_s[512] = "";
    const char *kern = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "t:T:m:s:b:k:r:c:h")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 'T': snprintf(types_s, sizeof types_s, "%s", optarg); break;
        case 'm': snprintf(ms_s, sizeof ms_s, "%s", optarg); break;
        case 's': snprintf(shapes_s, sizeof shapes_s, "%s", optarg); break;
        case 'b': bw = atof(optarg); break;
        case 'k': kern = optarg; break;
        case 'r': min_s = atof(optarg); break;
        case 'c': g_copies = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-t threads] [-T types] [-m 1,128] [-s NxK,...] [-b GB/s] [-k kernels] [-r s] [-c copies]\n",
                    argv[0]);
            return 2;
        }
    }
    if (kern && g3_cpu_kernels_select(kern) != 0) {
        fprintf(stderr, "kernel set %s not available here\n", kern);
        return 1;
    }
    g3_pool *p = g3_pool_create(threads);
    if (!p) return 1;
    if (bw <= 0) bw = measure_bw(p);
    printf("kernels %s, %d threads, read bandwidth %.1f GB/s%s, empty parallel region %.2f us\n",
           g3_cpu_kernels_name(), g3_pool_size(p), bw, kern ? " (forced)" : "", region_us(p));

    shape custom[16];
    const shape *shapes = k_1b;
    int nshapes = (int)(sizeof k_1b / sizeof *k_1b);
    if (shapes_s[0]) {
        nshapes = 0;
        for (char *tok = strtok(shapes_s, ","); tok && nshapes < 16; tok = strtok(NULL, ","))
            if (sscanf(tok, "%dx%d", &custom[nshapes].n, &custom[nshapes].k) == 2)
                custom[nshapes].per_layer = -1, custom[nshapes].name = "", nshapes++;
        shapes = custom;
    }
    int ms[8], nms = 0;
    for (char *tok = strtok(ms_s, ","); tok && nms < 8; tok = strtok(NULL, ",")) ms[nms++] = atoi(tok);

    char *save = NULL;
    for (char *ts = strtok_r(types_s, ",", &save); ts; ts = strtok_r(NULL, ",", &save)) {
        uint32_t type = parse_type(ts);
        if (!g3_dtype_get(base_type(type))) {
            fprintf(stderr, "unknown type %s\n", ts);
            continue;
        }
        for (int mi = 0; mi < nms; mi++) {
            int m = ms[mi];
            double layer_s = 0, head_s = 0, layer_bytes = 0;
            int complete = 1;
            for (int s = 0; s < nshapes; s++) {
                const shape *sh = &shapes[s];
                double sec = time_case(p, type, sh->n, sh->k, m, min_s);
                if (isnan(sec)) {
                    printf("%-5s m=%-3d n=%6d k=%5d %-8s: k not a multiple of the block, skipped\n", ts, m, sh->n,
                           sh->k, sh->name);
                    complete = 0;
                    continue;
                }
                double wb = (double)g3_tensor_bytes(base_type(type), sh->k, sh->n);
                double gflops = 2.0 * m * sh->n * (double)sh->k / sec / 1e9;
                double gbs = wb / sec / 1e9;
                printf("%-5s m=%-3d n=%6d k=%5d %-8s: %9.1f us  %6.1f GB/s (%3.0f%% of bw)  %7.1f GFLOP/s\n", ts, m, sh->n,
                       sh->k, sh->name, sec * 1e6, gbs, 100 * gbs / bw, gflops);
                if (sh->per_layer > 0) layer_s += sh->per_layer * sec, layer_bytes += sh->per_layer * wb;
                if (sh->per_layer == 0) head_s = sec;
            }
            if (shapes == k_1b && complete) {
                if (m == 1) {
                    double tok = 26 * layer_s + head_s, bytes = 26 * layer_bytes + (double)g3_tensor_bytes(base_type(type), 1152, 262144);
                    printf("%-5s 1B decode, matmuls only: %.2f ms/token = %.1f tok/s, %.1f GB/s = %.0f%% of bandwidth\n",
                           ts, tok * 1e3, 1 / tok, bytes / tok / 1e9, 100 * bytes / tok / 1e9 / bw);
                } else {
                    double chunk = 26 * layer_s;
                    double flops = 0;
                    for (int s = 0; s < nshapes; s++)
                        if (shapes[s].per_layer > 0) flops += shapes[s].per_layer * 2.0 * m * shapes[s].n * shapes[s].k;
                    printf("%-5s 1B prefill m=%d, layer matmuls only: %.1f ms = %.1f tok/s, %.1f GFLOP/s\n", ts, m,
                           chunk * 1e3, m / chunk, 26 * flops / chunk / 1e9);
                }
            }
        }
    }
    g3_pool_free(p);
    return 0;
}
