/* Small device helpers shared by several kernel files (gemv.cu, qgemv.cu, kernels.cu, tc_gemv.cu, tc_stage.cu,
 * tc_q8.cu): the tanh-approximated GELU of GeGLU, the streaming 16-byte weight load and the 16-byte cp.async copy.
 * Internal to src/backend/cuda. */
#ifndef G3_CUDA_DEVICE_UTIL_CUH
#define G3_CUDA_DEVICE_UTIL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* gelu(x), tanh approximation (GeGLU's gate) */
static __device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* streamed weights: no L1 allocation (activations and scales keep L1), 256-byte L2 prefetch */
static __device__ __forceinline__ uint4 g3c_ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* 16 bytes global -> shared, asynchronous (cp.async, cached in L2 only); g3c_cp_commit closes a group of them */
static __device__ __forceinline__ void g3c_cp16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
static __device__ __forceinline__ void g3c_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

#endif
