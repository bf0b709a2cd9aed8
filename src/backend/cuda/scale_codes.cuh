/* The scale codes as the products read them: the GGUF files' (g3_dmat.kc, kd; convert.cu writes them): Q4_K's code
 * c = sc | m << 8 with dm = (d, -dmin) as two halves gives s = d sc, z = -dmin m; Q4_0's / Q8_0's c = fp16 d gives
 * s = d, z = -8 d (Q4_0's offset; unused for Q8_0); and int4 quantized here in groups of 128 (g3_dmat.sz): c = (s, z)
 * as a half2. The same floats as g3_dmat.s and z, bit for bit. */
#ifndef G3_BACKEND_CUDA_SCALE_CODES_CUH
#define G3_BACKEND_CUDA_SCALE_CODES_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* KC 1: Q4_K; 2: an fp16 d (Q4_0, Q8_0); 3: int4 in groups of 128 quantized here, c = (s, z) as a half2 (g3_dmat.sz,
 * the same values as s and z) */
template <int KC> static __device__ __forceinline__ void g3c_kc_scales(uint32_t c, uint32_t dm, float &s, float &z) {
    if constexpr (KC == 3) {
        __half2 h;
        memcpy(&h, &c, 4);
        s = __low2float(h), z = __high2float(h);
    } else if constexpr (KC == 1) {
        __half2 h;
        memcpy(&h, &dm, 4);
        s = __low2float(h) * (float)(c & 0xFFu), z = __high2float(h) * (float)(c >> 8);
    } else {
        s = __half2float(__ushort_as_half((unsigned short)c)), z = -8.f * s;
    }
}

#endif
