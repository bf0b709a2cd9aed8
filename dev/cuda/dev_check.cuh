/* For the device microbenchmarks in dev/cuda: CK(call) prints the failing CUDA call with its place and exits;
 * replay_us, the time of a captured graph per launch; dev_fit, a fixed cost and a rate from two timings;
 * dev_grid_barrier, a barrier of all blocks of a grid. */
#ifndef G3_DEV_CUDA_DEV_CHECK_CUH
#define G3_DEV_CUDA_DEV_CHECK_CUH

#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Every block of the grid arrives (thread 0 on count; the last one resets it and bumps the generation) and waits
 * for the generation to move. All blocks must be resident (grid <= SMs x blocks per SM); a block that spins too
 * long gives up and counts itself in count[32] instead of hanging. Called by all threads of every block. */
static __device__ __forceinline__ void dev_grid_barrier(unsigned *count, volatile unsigned *gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            *count = 0;
            __threadfence();
            atomicAdd((unsigned *)gen, 1u);
        } else {
            for (long long spin = 0; *gen == g; spin++)
                if (spin > (1ll << 16)) {
                    atomicAdd(count + 32, 1u);
                    break;
                }
        }
        __threadfence();
    }
    __syncthreads();
}

/* Ends the capture on st, replays its graph 6 times and returns the best of the last 5 in us per launch (nl launches
 * per graph). */
static inline double replay_us(cudaStream_t st, int nl) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0 && ms * 1e3 / nl < best) best = ms * 1e3 / nl;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    return best;
}

/* t = t0 + bytes / rate through (b0 bytes, us0) and (b1 bytes, us1): *t0 in us, *gbs the rate in GB/s */
static inline void dev_fit(double b0, double us0, double b1, double us1, double *t0, double *gbs) {
    *gbs = (b1 - b0) / ((us1 - us0) * 1e-6) / 1e9;
    *t0 = us0 - b0 / (*gbs * 1e9) * 1e6;
}

#endif
