/* For the device microbenchmarks in dev/cuda: CK(call) prints the failing CUDA call with its place and exits. */
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

#endif
