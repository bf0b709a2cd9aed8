/* The one-row gate/up and down products in one launch (k_qgemv_gd, $G3_CUDA_QPGD): the persistent dp4a product's body
 * (qgemv_p_body.cuh) run twice by every block, the down phase waiting on per-K-slice counters instead of a kernel
 * boundary. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/qgemv_p_body.cuh"

/* ---- the gate/up and down products in one launch (one row, $G3_CUDA_QPGD) ---------------------------------------- */
/* k_qgemv_gd: every block runs its share of the gate/up product with the add-norm prologue and GeGLU (GD 1: each warp
 * counts its finished outputs into its K-slice's counter of the down product), then takes a down unit (block vb of
 * the down product's K-sliced grid) in the order the blocks get there, slice-major, so the first blocks done take
 * slice 0, which is complete long before the last outputs of slice ks - 1: the down product's weights start streaming
 * while the gate/up product's tail still runs, where the kernel boundary left the DRAM idle between the last gate/up
 * block and the down product's first loads. The wait is the down unit's own (qp_gd_wait); no block waits at its end.
 * No deadlock: the down units wait only for gate/up work, which waits for nothing, and the grid is at most one block an
 * SM (launch bounds and shared memory), all resident. The last block out resets the counters for the next launch. */
template <int QT_, int M_, int U_, bool PC_, bool HL_, bool PN_, bool RG_, int GS_, int KC_> struct qp_k {
    static constexpr int QT = QT_, M = M_, U = U_, GS = GS_, KC = KC_;
    static constexpr bool PC = PC_, HL = HL_, PN = PN_, RG = RG_;
};
/* The down phase, a call of its own: inlined, the compiler computed what derives from the down product's shape and
 * the thread index at the kernel's start and kept it live through the gate/up phase's loop (in the int4 pairs, whose
 * gate/up product is at 128 registers alone, three scale registers a step went through local memory); through the
 * call, the kernel has no spills and no local memory in its loops (sm_90a: the 64 bytes of stack are the arguments) */
template <class D>
static __device__ __noinline__ void qp_gd_down(const g3_dmat &wd, float *a, int lda, int m, float *y, int ldy,
                                               int gsh_d, int ks, int opt_d, unsigned vb, unsigned nb_d,
                                               const qp_gd &gd) {
    const g3c_qp_pre none = {};
    qp_body<D::QT, D::M, D::U, D::PC, D::HL, D::PN, D::RG, D::GS, D::KC, 2>(wd, a, lda, m, y, ldy, 0, gsh_d, 1, ks,
                                                                           none, opt_d, vb, nb_d, threadIdx.x, gd);
}
template <class G, class D>
__global__ void __launch_bounds__(QP_T, 1) k_qgemv_gd(g3_dmat wg, g3_dmat wd, int m, float *a, int lda, float *y,
                                                      int ldy, int gsh_g, int gsh_d, int ks, int nb_d,
                                                      g3c_qp_pre pre, int opt_g, int opt_d, qp_gd gd) {
    __shared__ int vb_s;
    qp_body<G::QT, G::M, G::U, G::PC, G::HL, G::PN, G::RG, G::GS, G::KC, 1>(
        wg, pre.xi, wg.k, m, a, lda, 1, gsh_g, 0, 1, pre, opt_g, blockIdx.x, gridDim.x, threadIdx.x, gd);
    __syncthreads(); /* the block's warps are done with the gate/up phase's shared memory */
    if (threadIdx.x == 0) {
        const int t = (int)atomicAdd(gd.cnt + QP_GD_TICKET, 1u), nkb = nb_d / ks;
        vb_s = t < nb_d ? (t % nkb) * ks + t / nkb : -1; /* block vb takes slice vb % ks (qp_body) */
    }
    __syncthreads();
    const int vb = vb_s;
    if (vb >= 0) {
        qp_gd_down<D>(wd, a, lda, m, y, ldy, gsh_d, ks, opt_d, (unsigned)vb, (unsigned)nb_d, gd);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(gd.cnt + QP_GD_DONE, 1u) == gridDim.x - 1) {
            for (int i = 0; i < ks; i++) atomicExch(gd.cnt + i, 0u);
            atomicExch(gd.cnt + QP_GD_TICKET, 0u);
            atomicExch(gd.cnt + QP_GD_DONE, 0u);
        }
    }
}
typedef void (*qp_gd_fn)(g3_dmat, g3_dmat, int, float *, int, float *, int, int, int, int, int, g3c_qp_pre, int, int,
                         qp_gd);
/* the pairs built: the one-row variants the 27B / 4B / 1B shapes' gate/up and down products take by default (int4 in
 * groups of 128, per-channel int8 with the residual plane or on float16 products, fp8) */
struct qp_gd_pair {
    int g[9], d[9]; /* qt, M, u, pc, hl, pn, rg, gs, kc */
    qp_gd_fn fn;
};
template <class G, class D> static qp_gd_pair qp_gd_make() {
    return {{G::QT, G::M, G::U, G::PC, G::HL, G::PN, G::RG, G::GS, G::KC},
            {D::QT, D::M, D::U, D::PC, D::HL, D::PN, D::RG, D::GS, D::KC},
            k_qgemv_gd<G, D>};
}
typedef qp_k<G3Q_INT4, 1, 3, false, false, true, false, 2, 0> qp_g_i4;
typedef qp_k<G3Q_INT4, 1, 3, false, false, true, false, 2, 3> qp_g_i4sz;
typedef qp_k<G3C_QT_I8H, 1, 3, true, false, true, false, -1, 0> qp_g_i8h;
typedef qp_k<G3Q_INT8, 1, 3, true, true, true, true, -1, 0> qp_g_i8r;
typedef qp_k<G3Q_FP8, 1, 3, true, false, true, true, -1, 0> qp_g_f8r;
typedef qp_k<G3Q_FP8, 1, 3, true, false, true, false, -1, 0> qp_g_f8;
static const qp_gd_pair *qp_gd_pairs(int *n) {
    static qp_gd_pair p[10];
    static int np = 0;
    if (!np) {
        p[0] = qp_gd_make<qp_g_i4, qp_k<G3Q_INT4, 1, 3, false, false, false, true, 2, 0>>();
        p[1] = qp_gd_make<qp_g_i4, qp_k<G3Q_INT4, 1, 2, false, false, false, true, 2, 0>>();
        p[2] = qp_gd_make<qp_g_i8r, qp_k<G3Q_INT8, 1, 3, true, true, false, true, -1, 0>>();
        p[3] = qp_gd_make<qp_g_i8h, qp_k<G3Q_INT8, 1, 3, true, true, false, true, -1, 0>>();
        p[4] = qp_gd_make<qp_g_i8h, qp_k<G3C_QT_I8H, 1, 3, true, false, false, false, -1, 0>>();
        p[5] = qp_gd_make<qp_g_f8r, qp_k<G3Q_FP8, 1, 3, true, false, false, true, -1, 0>>();
        p[6] = qp_gd_make<qp_g_f8, qp_k<G3Q_FP8, 1, 3, true, false, false, true, -1, 0>>();
        p[7] = qp_gd_make<qp_g_f8, qp_k<G3Q_FP8, 1, 3, true, false, false, false, -1, 0>>();
        p[8] = qp_gd_make<qp_g_i4sz, qp_k<G3Q_INT4, 1, 3, false, false, false, true, 2, 3>>(); /* half2 pairs */
        p[9] = qp_gd_make<qp_g_i4sz, qp_k<G3Q_INT4, 1, 2, false, false, false, true, 2, 3>>();
        np = 10;
    }
    *n = np;
    return p;
}
static int qp_var_is(const qp_var &v, const int (&k)[9]) {
    return v.qt == k[0] && v.M == k[1] && v.u == k[2] && v.pc == k[3] && v.hl == k[4] && v.pn == k[5] &&
           v.rg == k[6] && v.gs == k[7] && v.kc == k[8];
}
/* the fused pair (its index in qp_gd_pairs) for these two products at m rows, -1 where none is built or the shapes do
 * not fit */
static int qp_gd_pick(const g3_dmat *gu, const g3_dmat *dn, int m, qp_var *vg, qp_var *vd, int *nb_d) {
    if (m != 1 || gu->n != 2 * dn->k || !g3c_qp_usable(gu, m, 1, 1) || !g3c_qp_usable(dn, m, 0, 0)) return -1;
    *vg = g3c_qp_variant(gu, m, 1, 1), *vd = g3c_qp_variant(dn, m, 0, 0);
    if (vd->ks < 2 || vd->ks > 8 || dn->k % vd->ks) return -1; /* one slice: the wait would be a grid barrier */
    /* every warp's first row group in slice 0, so that slice 0 complete means every block has cleared its part of y
     * (qp_gd_wait) */
    if (dn->k / vd->ks < g3c_qp_blocks(gu, 1) * (QP_T / 32)) return -1;
    *nb_d = g3c_qp_blocks(dn, vd->ks);
    if (*nb_d > g3c_qp_blocks(gu, 1)) return -1; /* a down unit for every block at most */
    int n;
    const qp_gd_pair *p = qp_gd_pairs(&n);
    for (int i = 0; i < n; i++)
        if (qp_var_is(*vg, p[i].g) && qp_var_is(*vd, p[i].d)) return i;
    return -1;
}

/* $G3_CUDA_QPGD=1; read at every call. Off: measured slower on an H100 (session 45 run 01, one row, tok/s fused /
 * two launches): g3cuda_bench 27B int8 92 / 98, fp8 93 / 98, int4 135 / 150; gemma3 bench 1B int4 998 / 1190, 4B int8
 * 439 / 498. CUPTI, 27B int8 a layer: the fused launch ~126 us effective against ~119 for gate/up + down
 * (bench/logs/2026-12-05-session45/kprof_gd0.txt, kprof_gd1.txt). */
int g3c_qgemv_gd_enabled(void) {
    const char *e = getenv("G3_CUDA_QPGD");
    return e && !strcmp(e, "1");
}

static cudaError_t qp_gd_init(void) { /* the fused kernels' shared memory, once (g3c_qgemv_init first) */
    static int done = 0;
    cudaError_t e = g3c_qgemv_init();
    if (e != cudaSuccess || done) return e;
    if (g3c_qp_n_sm <= 0 || !g3c_qp_ring_ok) return cudaErrorNotSupported;
    int n;
    const qp_gd_pair *p = qp_gd_pairs(&n);
    for (int i = 0; i < n && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(p[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, QP_SMEM_RG);
    if (e == cudaSuccess) done = 1;
    return e;
}

int g3c_qgemv_gd_pair(const g3_dmat *gu, const g3_dmat *dn, int m) {
    qp_var vg, vd;
    int nb;
    return qp_gd_pick(gu, dn, m, &vg, &vd, &nb);
}

int g3c_qgemv_gd_ok(const g3_dmat *gu, const g3_dmat *dn, int m) {
    if (qp_gd_init() != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return g3c_qgemv_gd_pair(gu, dn, m) >= 0;
}

cudaError_t g3c_qgemv_gd(const g3_dmat *gu, const g3c_qp_pre *pre, const g3_dmat *dn, int m, float *a, int lda,
                         float *y, int ldy, unsigned *cnt, cudaStream_t st) {
    if (!pre || !pre->y || !pre->xo || !pre->xi || !cnt || lda < dn->k) return cudaErrorInvalidValue;
    const uintptr_t al = (uintptr_t)pre->xi | (uintptr_t)pre->y | (uintptr_t)pre->xo | (uintptr_t)pre->w1 |
                         (uintptr_t)pre->w2 | (uintptr_t)a | (uintptr_t)(lda * 4);
    if (al & 15) return cudaErrorInvalidValue;
    cudaError_t e = qp_gd_init();
    if (e != cudaSuccess) return e;
    qp_var vg, vd;
    int nb_d;
    const int pair = qp_gd_pick(gu, dn, m, &vg, &vd, &nb_d);
    if (pair < 0) return cudaErrorNotSupported;
    int n;
    const qp_gd_fn fn = qp_gd_pairs(&n)[pair].fn;
    qp_gd gd = {cnt, dn->k / vd.ks};
    e = g3c_launch(fn, dim3(g3c_qp_blocks(gu, 1)), dim3(QP_T), vg.smem > vd.smem ? vg.smem : vd.smem, st, *gu, *dn, m, a,
                   lda, y, ldy, vg.gsh, vd.gsh, vd.ks, nb_d, *pre, g3c_qp_opt(m), g3c_qp_opt(m), gd);
    return e == cudaSuccess ? cudaGetLastError() : e;
}
