/* Microbenchmark of the one-row decode products as the batch-1 forward launches them (g3c_gemv for bf16, g3c_qgemv
 * for int8 per channel and int4 groups of 128: the persistent dp4a kernel), to split each product's time into a fixed
 * cost per launch and a streaming rate. A CUDA graph of N back-to-back launches of one product on one stream, with
 * programmatic dependent launch as in the forward (each launch waits for the one before, as a product waits for its
 * input), replayed several times; per launch: us, GB/s of weight bytes (payload + scales), ratio to the streaming read
 * of the same run. Shapes: the 27B decode products (qkv 8192 x 5376, o 5376 x 4096, gate/up 43008 x 5376 with GeGLU,
 * down 5376 x 21504) and the same row lengths with 4x the rows, so that the fixed cost t0 and the streaming time per
 * byte can be solved from each pair: t = t0 + bytes / rate. First, for scale: what a kernel boundary costs by itself
 * (a graph of empty kernels of the persistent kernel's shape, with and without programmatic dependent launch) and a
 * grid-wide barrier inside one kernel (the alternative a fused chain of products would pay).
 * Findings on the H200 (session 11, bench/logs/2026-11-22-session11/, bench/RESULTS.md): once running, the bf16 GEMV
 * and the int8 / int4 dp4a kernel stream at 0.95-1.0 of the read bandwidth; each launch pays a fixed ~4 us (~8 us at
 * k = 21504) on top, of which an empty boundary is 0.6 us; a grid barrier costs 1.9 us. The small shapes partly read
 * from L2 here (one matrix 20 times in a row), which the forward never does for weights.
 * Third argument "balance": the gate/up product (GeGLU: whole row groups of 2 rows a warp, no stream-K) at exactly
 * 10, 11 and 12 row groups a warp of the persistent grid (16 warps a SM) and at the 27B shape (43008 rows: 10.2 a
 * warp on 132 SMs), to see what the unequal last round of row groups costs.
 *   g3qgemv_bench [quants, bf16,int8,int4] [launches per graph, 20] [balance] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "model/dtype.h"

#include "dev_check.cuh"

__global__ void k_read_all(const uint4 *p, size_t n, unsigned *sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc; /* keeps the loads alive */
}

/* What a kernel boundary costs by itself: a persistent-shaped kernel (one 512-thread block per SM, kept alone on its
 * SM by its shared memory) that only waits for the kernel before (programmatic dependent launch) */
__global__ void __launch_bounds__(512, 1) k_empty_p(unsigned *sink) {
    extern __shared__ unsigned char sm_pad[];
    g3c_pdl_wait();
    if (threadIdx.x == 0 && blockIdx.x == 0) sm_pad[0] = 1, *sink += sm_pad[0];
}

/* ... and what a grid-wide barrier inside one such kernel costs instead: every block arrives on a counter (the last
 * one resets it and bumps the generation), the others spin on the generation; n barriers in a row. All blocks must be
 * resident (grid <= SMs, one block per SM). */
__global__ void __launch_bounds__(512, 1) k_barriers_p(unsigned *count, volatile unsigned *gen, int n) {
    extern __shared__ unsigned char sm_pad[];
    for (int i = 0; i < n; i++) dev_grid_barrier(count, gen);
    if (threadIdx.x == 0 && blockIdx.x == 0 && n < 0) sm_pad[0] = 1;
}

static void time_boundaries(int sms, int nl, cudaStream_t st) {
    unsigned *buf;
    CK(cudaMalloc((void **)&buf, 256));
    CK(cudaMemset(buf, 0, 256));
    const int smem = 120 << 10;
    CK(cudaFuncSetAttribute(k_empty_p, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(k_barriers_p, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int nb = 50;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    k_barriers_p<<<sms, 512, smem, st>>>(buf, buf + 8, nb);
    const double best = replay_us(st, 1) / nb;
    unsigned timeouts = 0;
    CK(cudaMemcpy(&timeouts, buf + 32, 4, cudaMemcpyDeviceToHost));
    printf("grid barrier (%d blocks, counter + generation in global memory): %.2f us per barrier%s\n", sms, best,
           timeouts ? " (INVALID: blocks gave up waiting)" : "");
    for (int pdl = 1; pdl >= 0; pdl--) {
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < nl; i++) {
            if (pdl) CK(g3c_launch(k_empty_p, dim3(sms), dim3(512), smem, st, buf));
            else k_empty_p<<<sms, 512, smem, st>>>(buf);
        }
        const double us = replay_us(st, nl);
        printf("kernel boundary (empty %d x 512-thread kernels in a graph, %s): %.2f us per launch\n", sms,
               pdl ? "programmatic dependent launch" : "plain stream order", us);
    }
    cudaFree(buf);
}

static int qt_of(const char *s) {
    return !strcmp(s, "bf16") ? G3Q_BF16 : !strcmp(s, "int8") ? G3Q_INT8 : !strcmp(s, "int4") ? G3Q_INT4 : -1;
}

/* us per launch of the product (graph of nl launches, best of 5 replays after a warm-up) */
static double time_product(const g3_dmat *w, const float *x, float *y, int geglu, int nl, cudaStream_t st) {
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < nl; i++) {
        const int ldy = geglu ? w->n / 2 : w->n;
        if (w->qt == G3Q_BF16) CK(g3c_gemv(w, x, w->k, 1, y, ldy, geglu, st));
        else CK(g3c_qgemv(w, x, w->k, 1, y, ldy, geglu, NULL, 0, st));
    }
    return replay_us(st, nl);
}

int main(int argc, char **argv) {
    const char *qs = argc > 1 ? argv[1] : "bf16,int8,int4";
    const int nl = argc > 2 ? atoi(argv[2]) : 20;
    setvbuf(stdout, NULL, _IOLBF, 0);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(g3c_qgemv_init());
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

    /* streaming read of 2 GB, the limit the products are compared with */
    const size_t rb = (size_t)2 << 30;
    void *rbuf;
    unsigned *sink;
    CK(cudaMalloc(&rbuf, rb));
    CK(cudaMalloc((void **)&sink, 4));
    CK(cudaMemset(rbuf, 1, rb));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    k_read_all<<<sms * 8, 512, 0, st>>>((const uint4 *)rbuf, rb / 16, sink);
    const double bw = (double)rb / (replay_us(st, 1) * 1e-6) / 1e9;
    CK(cudaFree(rbuf));
    printf("streaming read: %.0f GB/s; %d launches per graph, best of 5 replays\n", bw, nl);
    printf("| weights | product | n x k | MB | us per launch | GB/s | of read | fixed cost t0 (us) | rate GB/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");

    struct shape { const char *name; int n, k, geglu; } sh[] = {
        {"qkv", 8192, 5376, 0},       {"qkv x4", 32768, 5376, 0},  {"o", 5376, 4096, 0},
        {"o x4", 21504, 4096, 0},     {"gate/up", 43008, 5376, 1}, {"gate/up x4", 172032, 5376, 1},
        {"down", 5376, 21504, 0},     {"down x4", 21504, 21504, 0},
    };
    int nsh = (int)(sizeof sh / sizeof sh[0]);
    if (argc > 3 && !strcmp(argv[3], "balance")) { /* pairs: (10, 11) a warp fitted; then 27B's 43008 and 12 a warp */
        const int rw = 2 * sms * 16;
        const shape b[] = {{"gate/up 10 a warp", 10 * rw, 5376, 1},
                           {"gate/up 11 a warp", 11 * rw, 5376, 1},
                           {"gate/up", 43008, 5376, 1},
                           {"gate/up 12 a warp", 12 * rw, 5376, 1}};
        memcpy(sh, b, sizeof b), nsh = 4;
    }
    float *x, *y;
    CK(cudaMalloc((void **)&x, 21504 * 4));
    CK(cudaMalloc((void **)&y, (size_t)172032 * 4));
    { /* random bf16 values as floats */
        g3_dmat xd;
        memset(&xd, 0, sizeof xd);
        xd.qt = G3Q_BF16, xd.n = 1, xd.k = xd.g = 21504;
        CK(cudaMalloc(&xd.q, 21504 * 2));
        CK(g3c_fill_random_bf16((__nv_bfloat16 *)xd.q, 21504, 1.f, 7, st));
        CK(g3c_dequant_f32(&xd, x, st));
        CK(cudaStreamSynchronize(st));
        cudaFree(xd.q);
    }
    char buf[64];
    snprintf(buf, sizeof buf, "%s", qs);
    for (char *q = strtok(buf, ","); q; q = strtok(NULL, ",")) {
        const int want = qt_of(q);
        if (want < 0) { fprintf(stderr, "unknown type %s\n", q); return 2; }
        double t_prev = 0, b_prev = 0;
        for (int i = 0; i < nsh; i++) {
            g3_dmat w;
            g3_error err = {};
            int g = 0;
            const int qt = g3c_target_format(G3_DTYPE_BF16, want, sh[i].k, &g);
            if (g3cb_alloc_dmat(&w, qt, sh[i].n, sh[i].k, g, &err) != G3_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            __nv_bfloat16 *src;
            CK(cudaMalloc((void **)&src, (size_t)w.n * w.k * 2));
            CK(g3c_fill_random_bf16(src, (size_t)w.n * w.k, 0.02f, 11 + i, st));
            CK(g3c_convert_rows(src, G3_DTYPE_BF16, w.n, &w, 0, 1, st));
            CK(cudaStreamSynchronize(st));
            CK(cudaFree(src));
            CK(cudaMemsetAsync(y, 0, (size_t)172032 * 4, st));
            const double bytes = (double)w.bytes;
            const double us = time_product(&w, x, y, sh[i].geglu, nl, st);
            const double gbs = bytes / (us * 1e-6) / 1e9;
            if (i % 2 == 0) {
                printf("| %s | %s | %d x %d | %.1f | %.2f | %.0f | %.2f | | |\n", q, sh[i].name, w.n, w.k, bytes / 1e6,
                       us, gbs, gbs / bw);
                t_prev = us, b_prev = bytes;
            } else { /* t = t0 + bytes / rate through this shape and the one before (same row length) */
                double t0, rate;
                dev_fit(b_prev, t_prev, bytes, us, &t0, &rate);
                printf("| %s | %s | %d x %d | %.1f | %.2f | %.0f | %.2f | %.2f | %.0f (%.2f) |\n", q, sh[i].name, w.n,
                       w.k, bytes / 1e6, us, gbs, gbs / bw, t0, rate, rate / bw);
            }
            g3cb_free_dmat(&w);
        }
    }
    time_boundaries(sms, nl, st);
    cudaFree(x), cudaFree(y), cudaFree(sink);
    cudaStreamDestroy(st);
    return 0;
}
