/* The launch policy of the persistent one- and two-row dp4a product (qgemv_p_policy.cuh): the switches, each with
 * what it measured on the H200, the variant a matrix takes at m rows (g3c_qp_variant), and the policy queries the
 * tests use (g3c_qgemvp_ring, _f16, _kc, _sz, _kslices, _usable). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/qgemv_p_policy.cuh"

int g3c_qp_n_sm = 0;
int g3c_qp_ring_ok = 0;

/* bytes of the ring variant of depth d and u chunks a lane, row and step (qp_ring_u; pn as for qp_smem); + 127: the
 * ring aligned to 128 bytes by address */
static size_t qp_smem_rg(int m, int k, int hl, int pn, int d, int u) {
    return qp_smem(m, k, hl, pn) + 127 + (size_t)(QP_T / 32) * d * (2 * 32 * u * 16 + 8);
}
/* $G3_CUDA_QPU=0: U = 3 at one row everywhere. By default int4 through the ring at one row (no prologue) takes steps
 * of 2 chunks a lane where they cover the row's (or K-slice's) nch chunks with fewer lane slots than steps of 3: the
 * 27B o product's 128 chunks in two steps of 2 instead of two of 3 (a third of the slots idle), the 4B / 1B o
 * products, the 1B head and down. Steps of 4 (the 27B o product's 128 chunks in one) were slower, 27B one row 184-185
 * against 188-189 tok/s (session 25 run 07): the ring of 4-chunk steps takes 202 KB of shared memory, so the gate/up
 * product's blocks (71 KB) no longer start beside the o product's under programmatic launch (gate/up 39.6 against
 * 37.4 us a layer under CUPTI). */
static int qp_u1(int nch) {
    const char *e = getenv("G3_CUDA_QPU");
    if (e && !strcmp(e, "0")) return 3;
    return (nch + 63) / 64 * 64 < (nch + 95) / 96 * 96 ? 2 : 3;
}
/* U of the ring variant for this product (int4 in groups of 128 at one row without the prologue: qp_u1) */
static int qp_ring_u(const g3_dmat *w, int m, int ks, int hl, int pn) {
    return w->qt == G3Q_INT4 && !hl && m <= 1 && !pn ? qp_u1(w->k / ks / 32) : m <= 1 ? 3 : 2;
}
/* The ring's depth in steps at m rows: 3 at one row, 2 at two ($G3_CUDA_QPD=2..6: that depth at both). Measured on the
 * H200 (session 24 run 02, A/B/A/B, tok/s one / two rows): depth 2 everywhere 27B int8 128 / 236 against 128-129 /
 * 230-231 for depth 3, fp8 128 / 228 against 128-129 / 227-229, 4B within 1%; depth 4 (with $G3_CUDA_QPNW=1, so that
 * it fits beside the prologue) 27B int8 127 / 227, fp8 126 / 225, 4B 1-2% slower. */
static int qp_ring_depth(int m) {
    const char *e = getenv("G3_CUDA_QPD");
    const int d = e && *e ? atoi(e) : m <= 1 ? 3 : 2;
    return d < 2 ? 2 : d > 6 ? 6 : d;
}
/* $G3_CUDA_QPNW=1: the add-norm prologue reads its norm weights from global memory instead of copying them to shared
 * memory before the launch wait (so that a deeper ring fits beside it); qp_smem's pn 2 */
static int qp_pn_w(void) {
    const char *e = getenv("G3_CUDA_QPNW");
    return e && !strcmp(e, "1");
}
static int qp_pn(int pn) { return pn ? 1 + qp_pn_w() : 0; } /* qp_smem's pn for a launch with (pn) or without it */

int g3c_qgemvp_fits(int m, int k) { return qp_smem(m, k, 1, 0) <= QP_SMEM_MAX; }

int g3c_qgemvp_enabled(void) { /* $G3_CUDA_QGEMVP: 0 = the two-launch path at 1-2 rows too; read at every call */
    const char *e = getenv("G3_CUDA_QGEMVP");
    return !(e && !strcmp(e, "0"));
}

/* $G3_CUDA_Q4KC: matrices from GGUF Q4_K, Q4_0 and Q8_0 (groups of 32) read the file's own scales at 1-2 rows
 * (g3_dmat.kc, kd): Q4_K 2.5 bytes a group of 32 weights against 8 for the float s and z (0.58 bytes a weight instead
 * of 0.75), Q4_0 2 (0.56), Q8_0 2 against 4 (1.06 instead of 1.13). 0: no codes at all (g3cb_alloc_kcodes, at
 * create); 2: codes kept, the kernel reads s and z (comparisons); read at every call. H200, session 33 run 03 (tok/s
 * one / two rows, against 2): 27B Q4_K 176 / 325 against 149-150 / 281, Q4_K_M 150 / 279 against 132-133 / 251-252,
 * 4B Q4_K 677 against 631 at one row. */
static int qp_kc(void) {
    const char *e = getenv("G3_CUDA_Q4KC");
    return !(e && (!strcmp(e, "0") || !strcmp(e, "2")));
}
/* The product reads the codes (launch_p, g3c_qgemvp_kc); hl: with the activations' residual plane. The variants:
 * Q4_K / Q4_0 (int4 in groups of 32, one chunk a group) without the plane, Q8_0 with it. */
static int qp_kc_take(const g3_dmat *w, int hl) {
    return w->kc && w->g == 32 && qp_kc() && (w->qt == G3Q_INT4 ? !hl : w->qt == G3Q_INT8 && hl);
}

/* $G3_CUDA_QPGS=0: int4 in groups of 128 through the kernel with the group arithmetic at run time (the shift by gsh
 * per chunk and its address per load) instead of at compile time (one scale / offset address a row and step).
 * Nsight Compute on the 27B int4 gate/up product at one row (session 24 run 05): ~480 warp instructions a step, of
 * which 48 are the dp4a, the rest mostly address arithmetic, kernel parameters re-read from the constant bank and
 * register moves; the issue slots 58% busy. With the groups at compile time (run 06, A/B/A/B, tok/s one / two rows):
 * 27B 181 / 324 against 179-180 / 324-325, 4B 682-683 / 1175-1178 against 679-682 / 1173-1174; CUPTI: a 27B layer
 * 85.4 against 87.9 us. */
static int qp_gs(void) {
    const char *e = getenv("G3_CUDA_QPGS");
    return !(e && !strcmp(e, "0"));
}

/* $G3_CUDA_QPRING: weights through the shared-memory ring of bulk copies (k_qgemv_p's RG). Unset (auto): the
 * per-channel int8 products in rows (or K-slices) of >= 4096 values, with or without the add-norm prologue (every
 * 27B product and the 4B down product; none at 1B), and int4 in groups of 128 without its residual plane (the
 * default int4) in the products without the prologue (o, down, the head); 0: never; 1: every int4 / per-channel int8
 * product without the prologue; 2: with the prologue too. $G3_CUDA_QPRINGMIN=n: only matrices of >= n MB. Measured on
 * the H200 (session 21, A/B/A/B, tok/s): int4 with its residual plane through the ring 152-163 against 167-168 at one
 * row, 239-275 against 282-288 at two (its per-group scales and offsets still come through registers a step ahead).
 * Session 25, once the step's loads took fewer instructions (run 03, tok/s one / two rows, against no ring): 27B int4
 * 188-189 / 338-340 against 186 / 330, 4B 734-736 / 1226-1227 against 717-719 / 1217, 1B 1241-1259 / 2124-2143
 * against 1217-1226 / 2130-2153; the products with the prologue through the ring as well (run 02): 27B one row
 * 181-182 (gate/up 39.4 against 36.6 us a layer), two rows 338-340; the large ones only ($G3_CUDA_QPRINGMIN: down and
 * head) 27B 186 / 334-335, 4B 713-717 / 1206-1207, 1B 1200-1210 / 2074-2099. The 1B / 4B int8 heads (rows of
 * 1152 / 2560 values) through the ring cost 1B int8 3% at one row (run 03), hence the row length. The ring with the
 * prologue was slow until the ring was aligned by address (run 03, Nsight Compute: the prologue's static shared
 * memory left the dynamic part 16-byte aligned, and bulk copies off the 128-byte grid went to L2 as 4x the requests,
 * 9.6 M sectors for 7.3 M of weights; the gate/up product 79 against 66.5 us aligned, run 05). */
#define QP_RING_MIN_K 4096 /* auto: the shortest rows (or K-slices) that take the ring */
static int qp_ring_mode(void) { /* -1 auto, 0, 1, 2 */
    const char *e = getenv("G3_CUDA_QPRING");
    return e && *e ? atoi(e) : -1;
}
/* hl: the activations take two bytes each (the residual plane, or float16: qp_f16) */
static int qp_ring_take(const g3_dmat *w, int m, int ks, int hl, int pn) { /* pn: 0, 1 (the prologue) */
    const int mode = qp_ring_mode(), pc = (w->qt == G3Q_INT8 || w->qt == G3Q_FP8) && w->g == w->k;
    /* int4 in groups of 128 without the residual plane: the kernel with the group arithmetic at compile time */
    const int q4 = w->qt == G3Q_INT4 && !hl && w->g == 128 && qp_gs();
    if (!g3c_qp_ring_ok || !mode || !(hl ? pc || w->qt == G3Q_INT4 : q4)) return 0;
    if (mode < 0 ? (q4 ? pn : !pc || w->k / ks < QP_RING_MIN_K) : mode < (pn ? 2 : 1)) return 0;
    const char *e = getenv("G3_CUDA_QPRINGMIN");
    const size_t min = (size_t)(e && *e ? atol(e) : 0) << 20;
    const size_t bytes = (size_t)w->n * (w->qt == G3Q_INT4 ? w->k / 2 : w->k);
    return bytes >= min &&
           qp_smem_rg(m, w->k / ks, hl, qp_pn(pn), qp_ring_depth(m), qp_ring_u(w, m, ks, hl, pn)) <= QP_SMEM_RG;
}

/* K-slices of a product without GeGLU or add-norm prologue (27B: the down product's 21504-long rows in 4): the
 * fewest ks (up to 8) that divide the SMs and K into slices of <= $G3_CUDA_QPKS values (default 5376; 0: whole
 * rows), each whole quantization blocks and weight groups; 1 where none fits. Each block then quantizes k / ks
 * values of x instead of k (86 KB of floats read through L2 per block at k = 21504, two rounds of loads). */
static int qp_kslices(const g3_dmat *w, int geglu, int pn) {
    const char *e = getenv("G3_CUDA_QPKS");
    const int lim = e && *e ? atoi(e) : 5376;
    if (geglu || pn || lim <= 0 || w->k <= lim) return 1;
    const int unit = w->g > 128 && w->g < w->k ? w->g : 128;
    for (int ks = 2; ks <= 8; ks++)
        if (g3c_qp_n_sm % ks == 0 && w->k % (ks * unit) == 0 && w->k / ks <= lim) return ks;
    return 1;
}

/* $G3_CUDA_Q8F16: per-channel int8 at 1-2 rows on the float16 products of fp8 (weights turned into float16 exactly,
 * activations float16 per block of 32: ~2^-12 of each value, no residual plane) instead of dp4a on q8 + residual plane.
 * Unset: the products in rows (or K-slices) shorter than QP_RING_MIN_K, which take no ring; 1 every product, 0 none.
 * Measured on the H200 (session 23, tok/s one / two rows), every product (run 04): 27B 123 / 212-213 against 123 /
 * 227-228 (the gate/up product 64.4 against 60 us a layer: the conversion's byte permutes and subtractions; fp8's
 * cvt: 58.9), 4B 569-574 / 995-1004 against 531-535 / 957-961, 1B 1083-1099 / 1820-1842 against 960-962 / 1711-1712;
 * by the row rule (run 05): 27B unchanged (124-125 / 228-229), 4B 569-575 / 1000-1007 against 542-543 / 966-968, 1B
 * 1077-1105 / 1821-1859 against 968-974 / 1717-1722. The fixtures' int8 KL one row at a time the same (small-a 0.0167
 * against 0.0166 nats, t-gqa 0.0054 / 0.0053, t-softcap 0.0090 / 0.0090, t-mm 0.0034 / 0.0034). */
static int qp_q8f16(const g3_dmat *w, int geglu, int pn) {
    if (w->qt != G3Q_INT8 || w->g != w->k) return 0;
    const char *e = getenv("G3_CUDA_Q8F16");
    if (e && *e) return atoi(e) == 1;
    return w->k / qp_kslices(w, geglu, pn) < QP_RING_MIN_K;
}
static int qp_f16(const g3_dmat *w, int geglu, int pn) { /* the product runs on float16 products (qt_f16) */
    return w->qt == G3Q_FP8 || qp_q8f16(w, geglu, pn);
}

/* The ring variants fill n of their slots before the launch wait and the rest once the add-norm prologue's loads have
 * returned (or after x's quantization), so that those L2 loads do not queue behind the ring's copies (up to 147 KB a SM
 * at depth 3). $G3_CUDA_QPRPRE=n (1..7); 0: every slot before the wait (as before); default 2, which at two rows (depth
 * 2) is every slot. Measured on the H200 (session 38 runs 01-02, two rounds each, tok/s one row, argmax on the GPU):
 * 27B int8 / int4 / fp8 130 / 191 / 130 against 128 / 189-190 / 129 with 0 (n = 1: 129 / 191 / 129; 3, i.e. all: as 0;
 * run 03, n = 2 the default: 131 / 190-191 / 131 against 129 / 188-189 / 129), 4B / 1B within their noise (4B int8
 * 597-603 against 599-600, 1B int4 1265-1299 against 1270-1297); CUPTI at 27B int8: a layer 117.0 against 119.1 us (the
 * o product 1.6 us shorter, gate/up 1.9), int4 80.7 against 81.4. With a ring of 4 (G3_CUDA_QPD=4 G3_CUDA_QPNW=1) still
 * slower than 3 (27B int8 126 with n = 2). At two rows n = 1 gave 27B int8 / int4 243-244 / 351-352 against 241 /
 * 345-346 but fp8 227-231 against 231-232 and 4B int8 one row 589-590 against 599-600 when applied at one row too; not
 * taken. Session 23 had measured 0-1 slots before the wait for the products without the prologue alone (27B fp8 125-127
 * against 128): no better there. */
static int qp_ring_pre(void) {
    const char *e = getenv("G3_CUDA_QPRPRE");
    const int n = e && *e ? atoi(e) : 2;
    return n < 0 ? 0 : n > 7 ? 7 : n;
}

/* The kernel's opt: bit 1 as qp_pn_w says, bits 2-4 the ring's depth (qp_ring_depth), bits 5-7 qp_ring_pre; bit 0: the
 * quantization's item slots (QI of QP_T items per thread and round) that lie wholly past the m * k / 8 items are left
 * out instead of run with their loads and stores predicated off ($G3_CUDA_QPQS=0: run them, as before): the 27B shapes
 * need 1-2 of the 4 (k = 4096 / 5376), and q8_quant does all its arithmetic and shuffles before its predicated stores.
 * Nsight Compute on the 27B fp8 o product alone (session 23 run 08): 42% of its instructions and 61% of its stall
 * samples in each warp's one-time code. A/B/A/B (run 09, tok/s one row): 27B int8 / int4 / fp8 129 / 177-178 / 128-129
 * against 123 / 171 / 128, 4B 584-586 / 668-673 / 589-593 against 561-564 / 604-611 / 575-576. Measured in the same run
 * and not kept: issuing 0-1 of the ring's 3 slots before the launch wait and the rest right after x's loads, so that x
 * would not queue behind ~19 MB of copies (23% of the o product's stall samples wait for x there): 27B fp8 125-127, 4B
 * 564-577, no better. */
int g3c_qp_opt(int m) {
    const char *q = getenv("G3_CUDA_QPQS");
    return (q && !strcmp(q, "0") ? 0 : 1) | qp_pn_w() << 1 | qp_ring_depth(m) << 2 | qp_ring_pre() << 5;
}

/* $G3_CUDA_Q4SZ: int4 in groups of 128 with their half2 (s, z) pairs (g3_dmat.sz, built at create unless
 * $G3_CUDA_Q4SZ=0) read them instead of s and z (4 bytes a group of 64 weight bytes instead of 8: 0.531 bytes a weight
 * instead of 0.5625, 5.6% less to stream at one row, and one load a group instead of two); =0 at a call: s and z.
 * Measured on an H100 (session 45 run 01, g3cuda_bench one row, tok/s, pairs / s and z, two rounds): 27B int4 157 / 150,
 * 2 rows 296 / 281, 4B int4 703 / 684. The GGUF scale codes, the same idea at groups of 32, took 27B Q4_K one row from
 * 149-150 to 176 tok/s (session 33, H200). */
static int qp_q4sz(void) {
    const char *e = getenv("G3_CUDA_Q4SZ");
    return !(e && !strcmp(e, "0"));
}

qp_var g3c_qp_variant(const g3_dmat *w, int m, int geglu, int pn) {
    qp_var v;
    memset(&v, 0, sizeof v);
    v.M = m <= 1 ? 1 : 2, v.pn = pn, v.ks = qp_kslices(w, geglu, pn), v.hl = m <= lo_rows(w);
    if (qp_q8f16(w, geglu, pn)) v.qt = G3C_QT_I8H, v.pc = 1, v.hl = 0; /* float16 activations: no plane */
    else if (w->qt == G3Q_FP8) v.qt = G3Q_FP8, v.pc = 1, v.hl = 0;
    else if (w->qt == G3Q_INT4) v.qt = G3Q_INT4, v.pc = 0;
    else v.qt = G3Q_INT8, v.pc = w->g == w->k;
    const int h2 = v.hl || qt_f16(v.qt); /* activations of two bytes (the residual plane, or float16) */
    v.gsh = v.pc ? 0 : log2_exact(w->g / (v.qt == G3Q_INT4 ? 32 : 16));
    v.u = v.M == 1 ? 3 : 2, v.gs = -1;
    /* int4 without its plane: groups of 128 (qp_ring_take's q4) */
    if ((v.qt == G3Q_INT4 || (h2 && v.pc)) && qp_ring_take(w, v.M, v.ks, h2, pn)) {
        const int u = qp_ring_u(w, v.M, v.ks, h2, pn);
        v.rg = 1, v.gs = h2 ? -1 : 2;
        if (v.M == 1 && !pn && !h2 && u == 2) v.u = 2;
        if (v.gs == 2 && w->sz && qp_q4sz()) v.kc = 3;
        v.smem = qp_smem_rg(v.M, w->k / v.ks, h2, qp_pn(pn), qp_ring_depth(v.M), u);
        return v;
    }
    v.smem = qp_smem(v.M, w->k / v.ks, h2, qp_pn(pn));
    if (v.qt == G3Q_INT4) { /* groups of 128 (4 chunks): the group arithmetic at compile time (qp_gs) */
        if (v.gsh == 2 && qp_gs()) v.gs = 2;
        if (!v.hl && qp_kc_take(w, 0)) v.kc = w->kd ? 1 : 2, v.gs = -1; /* Q4_K / Q4_0: the scale codes */
        if (!v.hl && v.gs == 2 && w->sz && qp_q4sz()) v.kc = 3; /* groups of 128: the half2 pairs */
    }
    if (v.qt == G3Q_INT8 && !v.pc && v.hl && qp_kc_take(w, 1)) v.kc = 2; /* Q8_0: the fp16 scale codes */
    return v;
}
int g3c_qp_blocks(const g3_dmat *w, int ks) { /* the grid: ks groups of at most g3c_qp_n_sm / ks blocks */
    const int per = g3c_qp_n_sm / ks, nrg = (w->n + 1) / 2, need = (nrg + QP_T / 32 - 1) / (QP_T / 32);
    return ks * (need < per ? need : per);
}

int g3c_qp_usable(const g3_dmat *w, int m, int geglu, int pn) {
    return m >= 1 && m <= 2 && g3c_qgemv_supported(w, m) && g3c_qgemvp_enabled() && (!geglu || w->n % 2 == 0) &&
           qp_smem(m, w->k, 1, pn) <= QP_SMEM_MAX;
}

int g3c_pnorm_mode(void) { /* $G3_CUDA_PNORM: 0 the separate add-norm kernel, 1 the prologue, unset -1 (auto) */
    const char *e = getenv("G3_CUDA_PNORM");
    return e && *e ? !!atoi(e) : -1;
}

int g3c_qgemv_pn_supported(const g3_dmat *w, int m, int geglu) { return g3c_qp_usable(w, m, geglu, 1); }

int g3c_qgemvp_kslices(const g3_dmat *w, int geglu, int *n_sm) {
    if (g3c_qgemv_init() != cudaSuccess || g3c_qp_n_sm <= 0) return 0;
    *n_sm = g3c_qp_n_sm;
    return qp_kslices(w, geglu, 0);
}

/* the policy queries below (tests): the product takes this kernel at m rows, on a GPU that was set up */
static int qp_query_ok(const g3_dmat *w, int m, int geglu, int pn) {
    return g3c_qp_usable(w, m, geglu, pn) && g3c_qgemv_init() == cudaSuccess && g3c_qp_n_sm > 0;
}

int g3c_qgemvp_ring(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return qp_ring_take(w, m, qp_kslices(w, geglu, pn), m <= lo_rows(w) || qp_f16(w, geglu, pn), pn);
}

int g3c_qgemvp_f16(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return qp_f16(w, geglu, pn);
}

int g3c_qgemvp_kc(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return qp_kc_take(w, m <= lo_rows(w)); /* qp_launch's hl */
}

int g3c_qgemvp_sz(const g3_dmat *w, int m, int geglu, int pn) {
    if (!qp_query_ok(w, m, geglu, pn)) return 0;
    return g3c_qp_variant(w, m, geglu, pn).kc == 3;
}

int g3c_qgemvp_usable(const g3_dmat *w, int m, int geglu) {
    if (!g3c_qp_usable(w, m, geglu, 0) || g3c_qgemv_init() != cudaSuccess) return 0;
    return g3c_qp_n_sm > 0;
}
