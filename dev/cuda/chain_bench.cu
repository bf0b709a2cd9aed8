/* Microbenchmark of a chain of dependent streaming phases (the shape of a decode layer's products at one row, without
 * their arithmetic): P phases, each reading its own S bytes of "weights" once (16-byte loads, 3 per lane and step, as
 * the dp4a kernel does) after a prologue that reads a small activation vector through L2 into shared memory, each
 * phase depending on the one before. What it asks: how much of the fixed cost per product that qgemv_bench.cu
 * measured (~4 us) goes away when the weight stream does not stop at the phase boundary. Variants, each one block of
 * 512 threads per SM:
 *   kernels, regs      one kernel per phase (programmatic dependent launch), the next step's loads in registers
 *                      during this one's math (the library's k_qgemv_p), its first step before the launch wait
 *   kernels, ring D    the same with a per-warp ring of D steps in shared memory (cp.async), D issued before the wait
 *   barriers, regs     all phases in one kernel with grid barriers; the next phase's first step is loaded before the
 *                      barrier
 *   barriers, ring D   all phases in one kernel, the ring running D steps ahead through the barriers
 *   ..., dp4a          with the dp4a kernel's work per 16-byte chunk (4 activation loads from shared memory, 16 dp4a)
 * us per phase at two phase sizes, and the fixed cost per phase t0 from t = t0 + bytes / rate. Findings on the H200
 * (session 11 run 08, bench/RESULTS.md): kernels with registers t0 2.4 us at 0.86 of the bandwidth, kernels with a
 * 4-step ring t0 2.2 us at 1.0; grid barriers t0 ~4 us with either. With the dp4a work (run 10): registers t0 2.5 us
 * at 0.83, ring of 4 t0 4.1 at 1.02, ring of 2 t0 3.1 at 0.95.
 *   g3chain_bench [phases, 16] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "dev_check.cuh"

#define CH_W 16  /* warps per block */
#define CH_K 5376 /* activation values read by each phase's prologue */

template <int D, bool ACT>
__global__ void __launch_bounds__(CH_W * 32, 1) k_chain(const uint4 *__restrict__ W, long long S16, int P,
                                                        const float *x, unsigned *out, unsigned *count,
                                                        volatile unsigned *gen) {
    extern __shared__ uint4 ring[];
    constexpr int DD = D > 0 ? D : 1;
    float *xs = (float *)(ring + (size_t)CH_W * DD * 96);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long gw = (long long)blockIdx.x * CH_W + warp, tw = (long long)gridDim.x * CH_W;
    const long long T = S16 / 96, s0 = T * gw / tw, n = T * (gw + 1) / tw - s0, J = (long long)P * n;
    auto src = [&](long long j, int u) { return W + (j / n) * S16 + (s0 + j % n) * 96 + u * 32 + lane; };
    uint4 *my = ring + (size_t)warp * DD * 96;
    auto issue = [&](long long j) { /* one cp.async group per step, empty past the end */
        if (j < J)
#pragma unroll
            for (int u = 0; u < 3; u++) g3c_cp16(my + (j % DD) * 96 + u * 32 + lane, src(j, u));
        g3c_cp_commit();
    };
    uint4 cur[3];
    if constexpr (D > 0) {
        for (int j = 0; j < D; j++) issue(j);
    } else if (J > 0) {
#pragma unroll
        for (int u = 0; u < 3; u++) cur[u] = g3c_ld_stream(src(0, u));
    }
    g3c_pdl_wait();
    unsigned acc = 0;
    long long j = 0;
    for (int p = 0; p < P; p++) {
        if (p > 0) dev_grid_barrier(count, gen);
        for (int i = threadIdx.x; i < CH_K / 4; i += CH_W * 32) ((float4 *)xs)[i] = __ldcg((const float4 *)x + i);
        __syncthreads();
        const unsigned xv = __float_as_uint(xs[(lane * 7 + p) % CH_K]);
        for (long long t = 0; t < n; t++, j++) {
            uint4 v[3];
            if constexpr (D > 0) {
                asm volatile("cp.async.wait_group %0;" ::"n"(D - 1) : "memory");
#pragma unroll
                for (int u = 0; u < 3; u++) v[u] = my[(j % DD) * 96 + u * 32 + lane];
            } else {
#pragma unroll
                for (int u = 0; u < 3; u++) v[u] = cur[u];
                if (j + 1 < J)
#pragma unroll
                    for (int u = 0; u < 3; u++) cur[u] = g3c_ld_stream(src(j + 1, u));
            }
#pragma unroll
            for (int u = 0; u < 3; u++) {
                if constexpr (ACT) { /* the dp4a kernel's work per chunk: 4 activation loads from shared memory (two
                                      * int8 planes of 32 values), 16 dp4a */
                    const int c = (int)((s0 + j + 32 * u + lane) % (CH_K / 8 - 4));
                    const uint4 *a = (const uint4 *)xs + c; /* q and q_lo of 32 values: 4 x 16 bytes */
                    int t = 0;
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        const uint4 av = a[h];
                        t = __dp4a((int)v[u].x, (int)av.x, t), t = __dp4a((int)v[u].y, (int)av.y, t);
                        t = __dp4a((int)v[u].z, (int)av.z, t), t = __dp4a((int)v[u].w, (int)av.w, t);
                    }
                    acc ^= (unsigned)t;
                } else {
                    acc ^= (v[u].x + v[u].y) ^ (v[u].z * 3u + v[u].w) ^ xv;
                }
            }
            if constexpr (D > 0) issue(j + D); /* after v is used: the slot is free */
        }
        if (lane == 0) atomicXor(out + (p & 63), acc);
    }
}

static const int smem_max = 224 << 10;
template <int D> static int smem_of(void) { /* with or without ACT */
    const int need = CH_W * (D > 0 ? D : 1) * 96 * 16 + CH_K * 4;
    return need > (120 << 10) ? need : 120 << 10; /* at least 120 KB: one block per SM in every variant */
}

/* us per phase: the chain of P phases of S16 uint4 each, as `kernels` launches of P / kernels phases */
template <int D, bool ACT>
static double run_chain(const uint4 *W, long long S16, int P, int kernels, const float *x, unsigned *buf, int sms,
                        cudaStream_t st) {
    CK(cudaFuncSetAttribute(k_chain<D, ACT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
    const int per = P / kernels;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < kernels; i++)
        CK(g3c_launch(k_chain<D, ACT>, dim3(sms), dim3(CH_W * 32), (size_t)smem_of<D>(), st, W + (size_t)i * per * S16,
                      S16, per, x, buf, buf + 64, (volatile unsigned *)(buf + 72)));
    return replay_us(st, P);
}

int main(int argc, char **argv) {
    const int P = argc > 1 ? atoi(argv[1]) : 16;
    setvbuf(stdout, NULL, _IOLBF, 0);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const long long sizes[2] = {(12400000 / 1536) * 96LL, (65000000 / 1536) * 96LL}; /* uint4 per phase */
    uint4 *W;
    float *x;
    unsigned *buf;
    CK(cudaMalloc((void **)&W, (size_t)P * sizes[1] * 16));
    CK(cudaMemset(W, 0x5a, (size_t)P * sizes[1] * 16));
    CK(cudaMalloc((void **)&x, CH_K * 4));
    CK(cudaMemset(x, 0, CH_K * 4));
    CK(cudaMalloc((void **)&buf, 512));
    CK(cudaMemset(buf, 0, 512));
    printf("%d phases per chain; us per phase (GB/s); t0 and rate from the two sizes\n", P);
    printf("| variant | 12.4 MB | 65 MB | t0 (us) | rate GB/s |\n|---|---|---|---|---|\n");
    struct { const char *name; int d, kernels, act; } vs[] = {
        {"kernels, regs", 0, P, 0},         {"kernels, ring 4", 4, P, 0},          {"barriers, regs", 0, 1, 0},
        {"barriers, ring 4", 4, 1, 0},      {"barriers, ring 8", 8, 1, 0},         {"kernels, regs, dp4a", 0, P, 1},
        {"kernels, ring 4, dp4a", 4, P, 1}, {"kernels, ring 2, dp4a", 2, P, 1},
    };
    for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
        double us[2];
        for (int i = 0; i < 2; i++) {
            const long long S16 = sizes[i];
            const int k = vs[v].kernels;
            if (vs[v].act)
                us[i] = vs[v].d == 0   ? run_chain<0, true>(W, S16, P, k, x, buf, sms, st)
                        : vs[v].d == 2 ? run_chain<2, true>(W, S16, P, k, x, buf, sms, st)
                                       : run_chain<4, true>(W, S16, P, k, x, buf, sms, st);
            else
                us[i] = vs[v].d == 0   ? run_chain<0, false>(W, S16, P, k, x, buf, sms, st)
                        : vs[v].d == 4 ? run_chain<4, false>(W, S16, P, k, x, buf, sms, st)
                                       : run_chain<8, false>(W, S16, P, k, x, buf, sms, st);
        }
        const double b0 = sizes[0] * 16.0, b1 = sizes[1] * 16.0;
        double t0, rate;
        dev_fit(b0, us[0], b1, us[1], &t0, &rate);
        printf("| %s | %.2f (%.0f) | %.2f (%.0f) | %.2f | %.0f |\n", vs[v].name, us[0], b0 / us[0] / 1e3, us[1],
               b1 / us[1] / 1e3, t0, rate);
    }
    unsigned timeouts = 0;
    CK(cudaMemcpy(&timeouts, buf + 64 + 32, 4, cudaMemcpyDeviceToHost));
    if (timeouts) printf("INVALID: %u barrier waits gave up (blocks not all resident)\n", timeouts);
    cudaFree(W), cudaFree(x), cudaFree(buf);
    cudaStreamDestroy(st);
    return 0;
}
