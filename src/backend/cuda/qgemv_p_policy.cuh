/* The launch policy of the persistent one- and two-row dp4a product (qgemv_p.cu; the kernel body is
 * qgemv_p_body.cuh): what every launch runs for a matrix at m rows. Shared by qgemv_p.cu's launches, qgemv_gd.cu's
 * fused gate/up + down launch and the policy queries the tests use; the switches and their measurements are in
 * qgemv_p_policy.cu. */
#pragma once
#include <stddef.h>

#include "backend/cuda/qgemv_common.cuh"

#define QP_T 512 /* threads a block: one block of 16 warps an SM (qgemv_p_body.cuh) */
/* shared memory of the activations: q (and q_lo), (d, sum) per 32, and with the add-norm prologue (pn 1, 2) x and (pn
 * 1: copied, 2: read from global memory, qp_pn_w) its norm weights */
static __host__ __device__ size_t qp_smem(int m, int k, int hl, int pn) {
    return (size_t)(hl ? 2 : 1) * m * k + (size_t)m * (k / 32) * 8 + (pn ? (size_t)(m + (pn == 1 ? 2 : 0)) * k * 4 : 0);
}
#define QP_SMEM_MAX (200 << 10)
#define QP_SMEM_RG (226 << 10) /* the ring variants: the 227 KB a block may have, less its static shared memory */

extern int g3c_qp_n_sm;    /* the SMs (g3c_qgemv_init) */
extern int g3c_qp_ring_ok; /* the ring variants' shared memory set up (g3c_qgemv_init) */

/* What one launch of k_qgemv_p runs for this matrix at m rows (one place for launch_p's choices and k_qgemv_gd's):
 * the kernel's template arguments, K-slices and shared memory */
struct qp_var {
    int qt, M, u, pc, hl, pn, rg, gs, kc, ks, gsh;
    size_t smem;
};
qp_var g3c_qp_variant(const g3_dmat *w, int m, int geglu, int pn);
int g3c_qp_blocks(const g3_dmat *w, int ks); /* the grid: ks groups of at most g3c_qp_n_sm / ks blocks */
int g3c_qp_usable(const g3_dmat *w, int m, int geglu, int pn); /* the product can take the kernel at m rows */
int g3c_qp_opt(int m); /* the kernel's opt argument (qgemv_p_body.cuh) */
/* The fused gate/up + down pair (qgemv_gd.cu's table) these two products take at m rows, -1 where none: the policy alone,
 * on the SM count in g3c_qp_n_sm (no GPU needed; g3c_qgemv_gd_ok also sets the kernels up) */
int g3c_qgemv_gd_pair(const g3_dmat *gu, const g3_dmat *dn, int m);
