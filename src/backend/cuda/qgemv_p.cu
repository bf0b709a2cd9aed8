/* The dp4a decode product at 1-2 rows (g3c_qgemv's default there, and g3c_qgemv_pn) as one persistent kernel.
 *
 * Where the quantization runs: 3..8 rows, its own kernel k_q8 (one extra launch per product) before k_qgemv. 1-2 rows
 * (the decode case, unless $G3_CUDA_QGEMVP=0): k_qgemv_p, one persistent block of 16 warps per SM that quantizes x
 * into its shared memory itself (same layout and rounding; every block re-reads the m*k floats from L2: 86 KB at
 * k = 21504, cheap next to a launch) and streams the weights with the next step always in flight across rows;
 * without GeGLU the warps take equal contiguous ranges of (row pair, step) work and add their partial rows into y
 * atomically (y holds zeros on entry, as for the tensor-core kernels), so the small matrices end without a tail of
 * block waves. Measured on the H200 (27B, batch-1 decode, argmax on the GPU): int4 161.9 tok/s against 138.6 with
 * $G3_CUDA_QGEMVP=0, int8 116.9 against 106.7; per layer (eager profile) int4 gate/up 43 us against 52, down 29
 * against 31, qkv 16 against 17, o 12 against 14.
 *
 * Add-norm in the prologue (g3c_qgemv_pn, batch-1 decode; $G3_CUDA_PNORM=0: off): the qkv and gate/up products take
 * the residual add + post-norm + pre-norm that a one-block kernel (decode_norm.cu) did before them: every block
 * recomputes it (two block-wide sums over H values; xi and the norm weights copied to shared memory before the launch
 * wait, the previous product's output read after it) and stores its slice of the new residual. Two launches less per
 * layer; measured on the H200 (session 5, batch-1 decode tok/s, argmax on the GPU, off -> on): 27B int4 159.3 ->
 * 159.8, int8 114.3 -> 114.8; 4B int4 548.2 -> 546.7, int8 482.6 -> 488.7; 1B int4 810.6 -> 846.7, int8 838.6 ->
 * 869.4. Per layer (27B int4, CUPTI under graph replay) the products grew by about what the add-norm kernels took:
 * after the wait, the prologue is a chain of dependent steps (an L2 round trip for y, two block sums, the
 * quantization) wherever it runs.
 *
 * K-slices (products without GeGLU or add-norm, $G3_CUDA_QPKS, qp_kslices): the grid is split into ks groups of
 * blocks, group j streaming slice j of K of every row and quantizing only that slice of x; the slices' partial sums
 * meet in y through the atomics of the stream-K outputs. Measured on the H200 (session 20, 27B int8 one row, CUPTI):
 * the down product (4 slices of 5376) 35.9 -> 32.8 us a layer; batch-1 decode int8 113.9 -> 117.1, int4 157.0 ->
 * 161.4 tok/s; at two rows +3-4% (27B), +4-6% (4B / 1B).
 *
 * fp8 (e4m3 per channel, QT = G3Q_FP8): the same kernel with float16 activations (x / amax per block of 32, h16_quant,
 * in the two bytes an activation that the residual plane takes for int8) and float16 fused multiply-adds on the
 * weights converted by cvt.rn.f16x2.e4m3x2 (doth16 in qgemv_common.cuh); ring, K-slices and prologue as for
 * per-channel int8. H200, session 23 run 01: 27B one / two rows 128 / 230 tok/s against 106 / 202 on the tensor-core
 * kernel with hi + lo bf16 activations ($G3_CUDA_QGEMV=0), 4B +20% / +13%, 1B +19% / +4%. Per-channel int8 in rows
 * shorter than 4096 values takes the same float16 products (weights turned into float16 exactly; qp_q8f16). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/qgemv_p_body.cuh"

/* The parts: the kernel body (qgemv_p_body.cuh), the launch policy (qgemv_p_policy.cu), the one-row gate/up and down
 * products in one launch (qgemv_gd.cu); here the kernels built, their set-up and the launches. */

/* U (chunks per row and lane per step): 3 at one row, 2 at two; measured on the H200 (27B, one row): U = 4 slower
 * (int4 152.9 against 161.9 tok/s, int8 114.9 against 116.9). Also measured slower (session 4, CUPTI per-kernel
 * times with dev/cuda/kprof.cc): more weight traffic before the programmatic-dependent-launch wait (the next 3-8 steps
 * of every warp prefetched into L2: int4 150.1 / 140.7 tok/s at 24 / 48 MB against 163.0 without; the kernels before
 * slowed down, and so did these) and a cp.async ring of 3-4 stages in shared memory instead of the register double
 * buffer (more steps in flight: int4 150.1, 2 stages 154.2; every product slower, so the stream is not limited by the
 * bytes in flight). Also tried: the residual plane's dp4a continuing the
 * main plane's int32 sum (254 q + q_lo, one conversion and float product less per row and chunk): no change
 * (int4 170.8 against 171.1, int8 121.5 against 121.6), so the arithmetic is not what limits these kernels. */
template <int QT, int M, bool PC, bool HL, bool PN, int GS = -1> static void *qp_kernel(void) {
    return (void *)k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, false, GS>;
}
template <int QT, bool HL, int KC, int GS = -1> static void qp_kc_kernels(void **k) { /* M 1, 2 x PN off, on */
    k[0] = (void *)k_qgemv_p<QT, 1, 3, false, HL, false, false, GS, KC>;
    k[1] = (void *)k_qgemv_p<QT, 2, 2, false, HL, false, false, GS, KC>;
    k[2] = (void *)k_qgemv_p<QT, 1, 3, false, HL, true, false, GS, KC>;
    k[3] = (void *)k_qgemv_p<QT, 2, 2, false, HL, true, false, GS, KC>;
}
template <int QT, bool PC, bool PN, int GS = -1> static void qp_kernels(void **k) { /* M 1, 2 x HL off, on */
    k[0] = qp_kernel<QT, 1, PC, false, PN, GS>(), k[1] = qp_kernel<QT, 1, PC, true, PN, GS>();
    k[2] = qp_kernel<QT, 2, PC, false, PN, GS>(), k[3] = qp_kernel<QT, 2, PC, true, PN, GS>();
}

cudaError_t g3c_qgemv_init(void) {
    static int done = 0;
    if (done) return cudaSuccess;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&g3c_qp_n_sm, cudaDevAttrMultiProcessorCount, dev);
    void *ks[56];
    qp_kernels<G3Q_INT4, false, false>(ks), qp_kernels<G3Q_INT8, false, false>(ks + 4);
    qp_kernels<G3Q_INT8, true, false>(ks + 8), qp_kernels<G3Q_INT4, false, true>(ks + 12);
    qp_kernels<G3Q_INT8, false, true>(ks + 16), qp_kernels<G3Q_INT8, true, true>(ks + 20);
    ks[24] = qp_kernel<G3Q_FP8, 1, true, false, false>(), ks[25] = qp_kernel<G3Q_FP8, 2, true, false, false>();
    ks[26] = qp_kernel<G3Q_FP8, 1, true, false, true>(), ks[27] = qp_kernel<G3Q_FP8, 2, true, false, true>();
    ks[28] = qp_kernel<G3C_QT_I8H, 1, true, false, false>(), ks[29] = qp_kernel<G3C_QT_I8H, 2, true, false, false>();
    ks[30] = qp_kernel<G3C_QT_I8H, 1, true, false, true>(), ks[31] = qp_kernel<G3C_QT_I8H, 2, true, false, true>();
    /* int4 in groups of 128 (qp_gs), without and with the prologue */
    qp_kernels<G3Q_INT4, false, false, 2>(ks + 32), qp_kernels<G3Q_INT4, false, true, 2>(ks + 36);
    /* the GGUF scale codes (qp_kc): Q4_K, Q4_0 without the residual plane, Q8_0 with it */
    qp_kc_kernels<G3Q_INT4, false, 1>(ks + 40), qp_kc_kernels<G3Q_INT4, false, 2>(ks + 44);
    qp_kc_kernels<G3Q_INT8, true, 2>(ks + 48);
    qp_kc_kernels<G3Q_INT4, false, 3, 2>(ks + 52); /* int4 in groups of 128 with the half2 pairs (qp_q4sz) */
    for (size_t i = 0; i < sizeof ks / sizeof ks[0] && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(ks[i], cudaFuncAttributeMaxDynamicSharedMemorySize, QP_SMEM_MAX);
    void *kr[26] = {(void *)k_qgemv_p<G3Q_INT4, 1, 3, false, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, true, true, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, true, true, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 1, 3, true, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 2, 2, true, true, false, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 1, 3, true, true, true, true>,
                   (void *)k_qgemv_p<G3Q_INT8, 2, 2, true, true, true, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 1, 3, true, false, false, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 2, 2, true, false, false, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 1, 3, true, false, true, true>,
                   (void *)k_qgemv_p<G3Q_FP8, 2, 2, true, false, true, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 1, 3, true, false, false, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 2, 2, true, false, false, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 1, 3, true, false, true, true>,
                   (void *)k_qgemv_p<G3C_QT_I8H, 2, 2, true, false, true, true>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, false, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, false, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, true, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, true, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 2, false, false, false, true, 2>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, false, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, false, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 3, false, false, true, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 2, 2, false, false, true, true, 2, 3>,
                   (void *)k_qgemv_p<G3Q_INT4, 1, 2, false, false, false, true, 2, 3>};
    cudaError_t er = cudaSuccess; /* a device with less shared memory a block: no ring, nothing else lost */
    for (size_t i = 0; i < sizeof kr / sizeof kr[0] && e == cudaSuccess && er == cudaSuccess; i++)
        er = cudaFuncSetAttribute(kr[i], cudaFuncAttributeMaxDynamicSharedMemorySize, QP_SMEM_RG);
    g3c_qp_ring_ok = er == cudaSuccess;
    if (er != cudaSuccess) (void)cudaGetLastError();
    if (e == cudaSuccess) done = 1;
    return e;
}

template <int QT, int M, bool PC, bool HL, bool PN>
static cudaError_t launch_p(const g3_dmat *w, const qp_var &v, const float *x, int ldx, int m, float *y, int ldy,
                            int geglu, const g3c_qp_pre *pre, cudaStream_t st) {
    constexpr bool H2 = HL || qt_f16(QT);
    const int ks = v.ks, blocks = g3c_qp_blocks(w, ks);
    g3c_qp_pre none;
    memset(&none, 0, sizeof none);
    if constexpr (QT == G3Q_INT4 || (H2 && PC))
        if (v.rg) {
            auto kr = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, true, H2 ? -1 : 2>;
            if constexpr (QT == G3Q_INT4 && !H2) /* the half2 pairs (g3_dmat.sz) */
                if (v.kc == 3) kr = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, true, 2, 3>;
            if constexpr (M == 1 && !PN && !H2)
                if (v.u == 2)
                    kr = v.kc == 3 ? k_qgemv_p<QT, 1, 2, PC, HL, false, true, 2, 3> : k_qgemv_p<QT, 1, 2, PC, HL, false, true, 2>;
            return g3c_launch(kr, dim3(blocks), dim3(QP_T), v.smem, st, *w, x, ldx, m, y, ldy, geglu, v.gsh,
                              geglu ? 0 : 1, ks, pre ? *pre : none, g3c_qp_opt(M));
        }
    auto kern = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN>;
    if constexpr (QT == G3Q_INT4) {
        if (v.gs == 2) kern = k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, HL, PN, false, 2>;
        if constexpr (!HL)
            if (v.kc)
                kern = v.kc == 3   ? k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, false, PN, false, 2, 3>
                       : v.kc == 1 ? k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, false, PN, false, -1, 1>
                                   : k_qgemv_p<QT, M, M == 1 ? 3 : 2, PC, false, PN, false, -1, 2>;
    }
    if constexpr (QT == G3Q_INT8 && !PC && HL)
        if (v.kc) kern = k_qgemv_p<QT, M, M == 1 ? 3 : 2, false, true, PN, false, -1, 2>;
    return g3c_launch(kern, dim3(blocks), dim3(QP_T), v.smem, st, *w, x, ldx, m, y, ldy, geglu, v.gsh,
                      geglu ? 0 : 1, ks, pre ? *pre : none, g3c_qp_opt(M));
}

/* launch_p for the variant g3c_qp_variant chose */
template <bool PN>
static cudaError_t launch_v(const g3_dmat *w, const qp_var &v, const float *x, int ldx, int m, float *y, int ldy,
                            int geglu, const g3c_qp_pre *pre, cudaStream_t st) {
#define QP_LV(QT, PC, HL)                                                                                              \
    return v.M == 1 ? launch_p<QT, 1, PC, HL, PN>(w, v, x, ldx, m, y, ldy, geglu, pre, st)                              \
                    : launch_p<QT, 2, PC, HL, PN>(w, v, x, ldx, m, y, ldy, geglu, pre, st)
    switch (v.qt) {
    case G3C_QT_I8H: QP_LV(G3C_QT_I8H, true, false);
    case G3Q_FP8: QP_LV(G3Q_FP8, true, false);
    case G3Q_INT4:
        if (v.hl) QP_LV(G3Q_INT4, false, true);
        QP_LV(G3Q_INT4, false, false);
    default:
        if (v.pc) {
            if (v.hl) QP_LV(G3Q_INT8, true, true);
            QP_LV(G3Q_INT8, true, false);
        }
        if (v.hl) QP_LV(G3Q_INT8, false, true);
        QP_LV(G3Q_INT8, false, false);
    }
#undef QP_LV
}

/* The one launch of the persistent kernel: the residual plane up to lo_rows(w), the add-norm prologue when pre->y. */
static cudaError_t qp_launch(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu,
                             const g3c_qp_pre *pre, cudaStream_t st) {
    const int pn = pre && pre->y;
    const qp_var v = g3c_qp_variant(w, m, geglu, pn);
    cudaError_t e = pn ? launch_v<true>(w, v, x, ldx, m, y, ldy, geglu, pre, st)
                       : launch_v<false>(w, v, x, ldx, m, y, ldy, geglu, pre, st);
    return e == cudaSuccess ? cudaGetLastError() : e;
}

cudaError_t g3c_qgemv_pn(const g3_dmat *w, const g3c_qp_pre *pre, int m, float *y, int ldy, int geglu,
                         cudaStream_t st) {
    if (!g3c_qp_usable(w, m, geglu, pre->y != NULL) || (pre->y && !pre->xo) || !pre->xi) return cudaErrorInvalidValue;
    const uintptr_t al = (uintptr_t)pre->xi | (uintptr_t)pre->y | (uintptr_t)pre->xo | (uintptr_t)pre->w1 |
                         (uintptr_t)pre->w2;
    if (al & 15) return cudaErrorInvalidValue;
    cudaError_t e = g3c_qgemv_init();
    if (e != cudaSuccess) return e;
    if (g3c_qp_n_sm <= 0) return cudaErrorInvalidValue;
    return qp_launch(w, pre->xi, w->k, m, y, ldy, geglu, pre, st);
}
cudaError_t g3c_qgemvp(const g3_dmat *w, const float *x, int ldx, int m, float *y, int ldy, int geglu,
                       cudaStream_t st) {
    return qp_launch(w, x, ldx, m, y, ldy, geglu, NULL, st);
}
