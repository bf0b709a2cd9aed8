/* Probes of the device's ceilings (streaming read bandwidth, device-to-device copy, dense bf16 GEMM rate) and the
 * test hooks of cuda_api.h that run single kernels of the backend on host data. */
#include <algorithm>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemv_p_policy.cuh"
#include "backend/cuda/tq_act.cuh"
extern "C" {
#include "backend/cuda/cuda_api.h"
}

__global__ void k_read(const uint4 *p, size_t n, unsigned *sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc; /* keeps the loads alive */
}

#define CKE(call, what) G3C_CK_GOTO(call, what, out)

extern "C" g3_status g3_cuda_probe(size_t bytes, int n, double *read_gbs, double *copy_gbs, double *tflops,
                                   g3_error *err) {
    g3_status rc = G3_OK;
    void *a = NULL, *b = NULL, *c = NULL;
    unsigned *sink = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cublasHandle_t h = NULL;
    float ms = 0;
    int sms = 0;
    bytes &= ~(size_t)15;
    CKE(cudaMalloc(&a, bytes), "probe allocation");
    CKE(cudaMalloc(&b, bytes), "probe allocation");
    CKE(cudaMalloc((void **)&sink, 4), "probe allocation");
    CKE(cudaMemset(a, 1, bytes), "memset");
    CKE(cudaEventCreate(&e0), "event");
    CKE(cudaEventCreate(&e1), "event");
    CKE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
    for (int it = 0; it < 2; it++) { /* warm-up, then timed */
        const int reps = 10;
        CKE(cudaEventRecord(e0), "event");
        for (int r = 0; r < reps; r++) k_read<<<sms * 8, 512>>>((const uint4 *)a, bytes / 16, sink);
        CKE(cudaEventRecord(e1), "event");
        CKE(cudaEventSynchronize(e1), "read probe");
        CKE(cudaEventElapsedTime(&ms, e0, e1), "event");
        *read_gbs = (double)bytes * reps / (ms * 1e-3) / 1e9;
        CKE(cudaEventRecord(e0), "event");
        for (int r = 0; r < reps; r++) CKE(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
        CKE(cudaEventRecord(e1), "event");
        CKE(cudaEventSynchronize(e1), "copy probe");
        CKE(cudaEventElapsedTime(&ms, e0, e1), "event");
        *copy_gbs = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    }
    cudaFree(b), b = NULL;
    if (n > 0) {
        size_t nn = (size_t)n * n;
        CKE(cudaMalloc(&b, nn * 2), "gemm allocation");
        CKE(cudaMalloc(&c, nn * 2), "gemm allocation");
        CKE(g3c_fill_random_bf16((__nv_bfloat16 *)a, nn, 1.f, 1, 0), "fill");
        CKE(g3c_fill_random_bf16((__nv_bfloat16 *)b, nn, 1.f, 2, 0), "fill");
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) CKE(cudaErrorUnknown, "cublasCreate");
        const float al = 1.f, be = 0.f;
        for (int it = 0; it < 2; it++) {
            const int reps = it ? 10 : 3;
            CKE(cudaEventRecord(e0), "event");
            for (int r = 0; r < reps; r++)
                if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &al, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &be,
                                 c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                    CKE(cudaErrorUnknown, "cublasGemmEx");
            CKE(cudaEventRecord(e1), "event");
            CKE(cudaEventSynchronize(e1), "gemm probe");
            CKE(cudaEventElapsedTime(&ms, e0, e1), "event");
            *tflops = 2.0 * n * (double)n * n * reps / (ms * 1e-3) / 1e12;
        }
    }
out:
    if (h) cublasDestroy(h);
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(sink);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

static int parse_q(const char *s) {
    if (!s || !strcmp(s, "bf16")) return G3Q_BF16;
    if (!strcmp(s, "int8")) return G3Q_INT8;
    if (!strcmp(s, "int4")) return G3Q_INT4;
    if (!strcmp(s, "fp8")) return G3Q_FP8;
    return -1;
}

/* The hooks' resident matrix: n rows of k values of src_type (host w) converted on the device into format qt with
 * groups of g, as the backend loads weights (its allocation, g3cb_alloc_dmat); free with g3cb_free_dmat. */
static cudaError_t test_dmat(uint32_t src_type, const void *w, int n, int k, int qt, int g, g3_dmat *d,
                             cudaStream_t st) {
    const size_t rb = g3c_src_row_bytes(src_type, k);
    void *src = NULL;
    g3_error err;
    cudaError_t e = g3cb_alloc_dmat(d, qt, n, k, g, &err) == G3_OK ? cudaSuccess : cudaErrorMemoryAllocation;
    if (e == cudaSuccess && (g3cb_alloc_kcodes(d, src_type, &err) != G3_OK || g3cb_alloc_sz(d, src_type, &err) != G3_OK))
        e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaMalloc(&src, rb * n);
    if (e == cudaSuccess) e = cudaMemcpy(src, w, rb * n, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize(); /* the legacy stream's copy before the conversion on st */
    if (e == cudaSuccess) e = g3c_convert_rows(src, src_type, n, d, 0, 1, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    cudaFree(src);
    return e;
}

/* The header of the resident matrix the forward would make of an n x k source of that type (no memory): 0, or -1
 * for a type / quantization it cannot convert. */
static int test_dmat_header(g3_dmat *d, uint32_t src_type, int n, int k, const char *quant) {
    memset(d, 0, sizeof *d);
    int g, want = parse_q(quant), qt = g3c_target_format(src_type, want, k, &g);
    if (want < 0 || qt < 0) return -1;
    d->qt = qt, d->n = n, d->k = k, d->g = g;
    return 0;
}

/* a matrix header as loaded: the GGUF scale codes and int4's half2 pairs as markers (never read: policy only) */
static int test_dmat_loaded(g3_dmat *d, uint32_t src_type, int n, int k, const char *quant, int sz) {
    if (test_dmat_header(d, src_type, n, k, quant)) return -1;
    if (g3cb_kcodes_wanted(d, src_type)) d->kc = (uint16_t *)d, d->kd = src_type == G3_DTYPE_Q4_K ? (uint32_t *)d : NULL;
    if (sz && d->qt == G3Q_INT4 && d->g == 128) d->sz = (uint32_t *)d;
    return 0;
}

extern "C" int g3_cuda_test_mm_path(uint32_t src_type, int n, int k, const char *quant, int gemm, int m) {
    g3_dmat d;
    if (test_dmat_header(&d, src_type, n, k, quant)) return -1;
    g3c_mm_ctx mc = {NULL, 0, (__nv_bfloat16 *)&d /* any non-NULL scratch */, gemm != 2, 132, NULL, 0};
    mc.qact = 1; /* as for decode batches (the engine's prefill chunks keep cuBLAS beyond 64 rows) */
    return g3c_mm_path(&mc, &d, m);
}

extern "C" long long g3_cuda_test_q4r_launches(void) { return g3c_q4r_launches(); }
extern "C" long long g3_cuda_test_tqg_kc_launches(void) { return g3c_tqg_kc_launches(); }

extern "C" int g3_cuda_test_qp_kslices(uint32_t src_type, int n, int k, const char *quant, int geglu, int *n_sm) {
    g3_dmat d;
    if (test_dmat_header(&d, src_type, n, k, quant)) return -1;
    return g3c_qgemvp_kslices(&d, geglu, n_sm);
}

extern "C" int g3_cuda_test_qp_ring(uint32_t src_type, int n, int k, const char *quant, int m, int geglu, int pn) {
    g3_dmat d;
    if (test_dmat_header(&d, src_type, n, k, quant)) return -1;
    return g3c_qgemvp_ring(&d, m, geglu, pn);
}

extern "C" int g3_cuda_test_qp_f16(uint32_t src_type, int n, int k, const char *quant, int m, int geglu, int pn) {
    g3_dmat d;
    if (test_dmat_header(&d, src_type, n, k, quant)) return -1;
    return g3c_qgemvp_f16(&d, m, geglu, pn);
}

extern "C" int g3_cuda_test_qp_kc(uint32_t src_type, int n, int k, int m, int geglu, int pn) {
    g3_dmat d;
    if (test_dmat_loaded(&d, src_type, n, k, "bf16", 0)) return -1;
    return g3c_qgemvp_kc(&d, m, geglu, pn);
}

extern "C" int g3_cuda_test_qp_sz(int n, int k, int m, int geglu, int pn) {
    g3_dmat d;
    if (test_dmat_header(&d, G3_DTYPE_F32, n, k, "int4")) return -1;
    if (g3cb_q4sz_wanted(&d, G3_DTYPE_F32)) d.sz = (uint32_t *)&d; /* as loaded: a marker, never read here */
    return g3c_qgemvp_sz(&d, m, geglu, pn);
}

/* the policy on a simulated GPU of n_sm SMs with the ring's shared memory; the real values restored after */
struct qp_sim {
    int sm, ring;
    explicit qp_sim(int n_sm) : sm(g3c_qp_n_sm), ring(g3c_qp_ring_ok) { g3c_qp_n_sm = n_sm, g3c_qp_ring_ok = 1; }
    ~qp_sim() { g3c_qp_n_sm = sm, g3c_qp_ring_ok = ring; }
};

extern "C" int g3_cuda_test_qp_variant(uint32_t src_type, int n, int k, const char *quant, int m, int geglu, int pn,
                                       int sz, int n_sm, g3_cuda_qp_variant *out) {
    g3_dmat d;
    if (n_sm <= 0 || test_dmat_loaded(&d, src_type, n, k, quant, sz)) return -1;
    qp_sim sim(n_sm);
    if (!g3c_qp_usable(&d, m, geglu, pn)) return 1;
    const qp_var v = g3c_qp_variant(&d, m, geglu, pn);
    out->f16 = qt_f16(v.qt), out->M = v.M, out->u = v.u, out->pc = v.pc, out->hl = v.hl, out->rg = v.rg;
    out->gs = v.gs, out->kc = v.kc, out->ks = v.ks, out->blocks = g3c_qp_blocks(&d, v.ks);
    out->smem = (long)v.smem, out->smem_max = v.rg ? QP_SMEM_RG : QP_SMEM_MAX;
    return 0;
}

extern "C" int g3_cuda_test_qp_gd_pair(uint32_t src_type, const char *quant, int hidden, int inter, int m, int sz,
                                       int n_sm) {
    g3_dmat gu, dn;
    if (n_sm <= 0 || test_dmat_loaded(&gu, src_type, 2 * inter, hidden, quant, sz) ||
        test_dmat_loaded(&dn, src_type, hidden, inter, quant, sz))
        return -2;
    qp_sim sim(n_sm);
    return g3c_qgemv_gd_pair(&gu, &dn, m);
}

extern "C" int g3_cuda_test_tqg(uint32_t src_type, int n, int k, int m) {
    g3_dmat d;
    if (test_dmat_header(&d, src_type, n, k, "bf16")) return -1;
    return g3c_tq_taken(&d, m) && g3c_tqg_supported(&d);
}

extern "C" g3_status g3_cuda_test_matmul(uint32_t src_type, const void *w, int n, int k, const char *quant, int gemm,
                                         int geglu, const float *x, int m, float *y, float *wdeq, g3_error *err) {
    g3_status rc = G3_OK;
    g3_dmat d;
    memset(&d, 0, sizeof d);
    float *dx = NULL, *dy = NULL, *dw = NULL, *ha = NULL, *da = NULL;
    __nv_bfloat16 *dxh = NULL, *scr = NULL, *dah = NULL;
    unsigned *cnt = NULL;
    cublasHandle_t h = NULL;
    cudaStream_t st = NULL;
    int g, ny = 1, fused = 0, n_sm = 0, want = parse_q(quant), qt = g3c_target_format(src_type, want, k, &g);
    size_t rb = g3c_src_row_bytes(src_type, k), nyf = (size_t)(2 * m) * n;
    if (want < 0 || qt < 0 || !rb) return g3c_fail(err, G3_ERR_UNSUPPORTED, "cuda test: type %u / %s", src_type, quant);
    size_t nk = (size_t)n * k;
    CKE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    CKE(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0), "attribute");
    CKE(g3c_tc_init(), "tc init");
    CKE(test_dmat(src_type, w, n, k, qt, g, &d, st), "weights");
    CKE(cudaMalloc((void **)&dx, (size_t)m * k * 4), "alloc");
    CKE(cudaMalloc((void **)&dxh, (size_t)2 * m * k * 2), "alloc");
    CKE(cudaMalloc((void **)&dy, nyf * 4 + 64), "alloc");
    CKE(cudaMemset(dy, 0, nyf * 4 + 64), "clear"); /* product outputs start at zero */
    CKE(cudaMalloc((void **)&da, (size_t)m * n * 4), "alloc");
    CKE(cudaMalloc((void **)&dah, (size_t)2 * m * n * 2), "alloc");
    CKE(cudaMalloc((void **)&cnt, (size_t)(n / 16 + 1) * 4), "alloc");
    CKE(cudaMemset(cnt, 0, (size_t)(n / 16 + 1) * 4), "clear");
    CKE(cudaMalloc((void **)&scr, nk * 2), "alloc");
    CKE(cudaMemcpy(dx, x, (size_t)m * k * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaDeviceSynchronize(), "sync"); /* the uploads (legacy stream) before the kernels on st */
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) CKE(cudaErrorUnknown, "cublasCreate");
    cublasSetStream(h, st);
    {
        g3c_mm_ctx mc = {h, st, scr, gemm != 2, n_sm, cnt, n / 16 + 1};
        mc.qact = 1;
        int outw = geglu ? n / 2 : n;
        CKE(g3c_to_bf16(dx, m, k, dxh, mc.split, st), "to_bf16");
        CKE(g3c_mm(&mc, &d, dx, dxh, m, dy, &ny, da, dah, geglu, &fused), "matmul");
        if (geglu && !fused) CKE(g3c_geglu(dy, ny, m, n / 2, da, NULL, 0, st), "geglu");
        CKE(cudaStreamSynchronize(st), "matmul");
        if (geglu) {
            CKE(cudaMemcpy(y, da, (size_t)m * outw * 4, cudaMemcpyDeviceToHost), "download");
        } else {
            ha = (float *)malloc((size_t)ny * m * outw * 4);
            if (!ha) CKE(cudaErrorMemoryAllocation, "host memory");
            CKE(cudaMemcpy(ha, dy, (size_t)ny * m * outw * 4, cudaMemcpyDeviceToHost), "download");
            for (size_t i = 0; i < (size_t)m * outw; i++) {
                y[i] = 0.f;
                for (int j = 0; j < ny; j++) y[i] += ha[(size_t)j * m * outw + i];
            }
        }
        if (wdeq) {
            CKE(cudaMalloc((void **)&dw, nk * 4), "alloc");
            CKE(g3c_dequant_f32(&d, dw, st), "dequant");
            CKE(cudaStreamSynchronize(st), "dequant"); /* st does not synchronize with the legacy stream's copies */
            CKE(cudaMemcpy(wdeq, dw, nk * 4, cudaMemcpyDeviceToHost), "download");
        }
        CKE(cudaDeviceSynchronize(), "sync");
    }
out:
    if (h) cublasDestroy(h);
    free(ha);
    g3cb_free_dmat(&d);
    cudaFree(dx), cudaFree(dxh), cudaFree(dy), cudaFree(scr), cudaFree(dw), cudaFree(da), cudaFree(dah), cudaFree(cnt);
    if (st) cudaStreamDestroy(st);
    return rc;
}

static float e4m3_host(uint8_t b) { /* cuda_fp8.h's conversion (host and device) */
    __nv_fp8_e4m3 v;
    v.__x = b;
    return (float)v;
}

/* quantized activations [m][F] (tq_act.cuh, order il: 0 or e4m3 hi + lo) back to float */
static void tq_dequant_host(const int8_t *q, const float2 *d, int m, int F, int il, float *h) {
    const size_t lo = il >= G3C_TQ_FP8 ? (size_t)(il - G3C_TQ_FP8) * F : 0;
    for (int r = 0; r < m; r++)
        for (int j = 0; j < F; j++) {
            const size_t i = (size_t)r * F + j;
            const float dd = d[(size_t)r * (F / 128) + j / 128].x;
            h[i] = il >= G3C_TQ_FP8 ? dd * (e4m3_host((uint8_t)q[i]) + e4m3_host((uint8_t)q[i + lo])) : dd * q[i];
        }
}

extern "C" g3_status g3_cuda_test_wg_geglu(uint32_t src_type, const void *w, int n, int k, const char *quant,
                                           const float *x, int m, int calls, float *h_fused, float *h_ref, int *taken,
                                           int *cnt_zero, g3_error *err) {
    g3_status rc = G3_OK;
    g3_dmat d;
    memset(&d, 0, sizeof d);
    float *dx = NULL, *dy = NULL, *dh = NULL;
    __nv_bfloat16 *dxh = NULL;
    int8_t *qin = NULL, *qf = NULL, *qr = NULL, *hq = NULL;
    unsigned *cnt = NULL, *hc = NULL;
    cudaStream_t st = NULL;
    int g, n_sm = 0, want = parse_q(quant), qt = g3c_target_format(src_type, want, k, &g);
    const int F = n / 2;
    *taken = 0, *cnt_zero = 0;
    if (want < 0 || qt < 0 || n % 256 || k % 128 || m < 1 || m > 64)
        return g3c_fail(err, G3_ERR_UNSUPPORTED, "cuda test: wg geglu %s n %d k %d m %d", quant, n, k, m);
    /* room for either form of quantized activations (int8 or fp8 hi + lo), as the backend's buffers */
    const size_t qb_in = std::max(g3c_tq_q8_bytes(64, k), g3c_wgf_q_bytes(64, k));
    const size_t qb_out = std::max(g3c_tq_q8_bytes(64, F), g3c_wgf_q_bytes(64, F));
    CKE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    CKE(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0), "attribute");
    CKE(g3c_tc_init(), "tc init");
    CKE(test_dmat(src_type, w, n, k, qt, g, &d, st), "weights");
    {
        const int il = g3c_tq_order(&d, m), f8 = il >= G3C_TQ_FP8;
        /* xd right after the rows, as g3c_tq_mm lays them out (fp8: lo rows up to mo + m) */
        const size_t xdo_in = f8 ? (size_t)(il - G3C_TQ_FP8 + m) * k : (size_t)2 * m * k;
        const size_t xdo_out = f8 ? (size_t)(il - G3C_TQ_FP8 + m) * F : (size_t)2 * m * F;
        CKE(cudaMalloc((void **)&dx, (size_t)m * k * 4), "alloc");
        CKE(cudaMalloc((void **)&dxh, (size_t)2 * m * k * 2), "alloc");
        CKE(cudaMalloc((void **)&dy, (size_t)m * n * 4), "alloc");
        CKE(cudaMemset(dy, 0, (size_t)m * n * 4), "clear"); /* product outputs start at zero */
        CKE(cudaMalloc((void **)&dh, (size_t)m * F * 4), "alloc");
        CKE(cudaMalloc((void **)&qin, qb_in), "alloc");
        CKE(cudaMalloc((void **)&qf, qb_out), "alloc");
        CKE(cudaMalloc((void **)&qr, qb_out), "alloc");
        CKE(cudaMemset(qf, 0, qb_out), "clear");
        CKE(cudaMemset(qr, 0, qb_out), "clear");
        CKE(cudaMalloc((void **)&cnt, (size_t)(n / 256) * 4), "alloc");
        CKE(cudaMemset(cnt, 0, (size_t)(n / 256) * 4), "clear");
        CKE(cudaMemcpy(dx, x, (size_t)m * k * 4, cudaMemcpyHostToDevice), "upload");
        CKE(cudaDeviceSynchronize(), "sync"); /* the uploads (legacy stream) before the kernels on st */
        CKE(g3c_to_bf16(dx, m, k, dxh, 0, st), "to_bf16");
        CKE(g3c_tq_quant(&d, dxh, m, qin, (float2 *)(qin + xdo_in), st), "quantize x");
        /* the reference: the product into y, then the GeGLU kernel's quantization */
        CKE(g3c_tq_mm_pre(&d, qin, (const float2 *)(qin + xdo_in), m, dy, n_sm, st), "product");
        CKE(g3c_geglu_tq(dy, 1, m, F, NULL, NULL, 0, qr, (float2 *)(qr + xdo_out), il, st), "geglu");
        if (g3c_wg_geglu_ok(&d, m, il, n_sm)) {
            *taken = 1;
            g3c_wg_gg gg = {dh, cnt, qf, (float2 *)(qf + xdo_out), il, g3c_gelu_tanhf()};
            for (int c = 0; c < (calls < 1 ? 1 : calls); c++)
                CKE(g3c_wg_mm_geglu(&d, qin, (const float2 *)(qin + xdo_in), m, &gg, n_sm, st), "fused product");
        }
        CKE(cudaStreamSynchronize(st), "products");
        hq = (int8_t *)malloc(qb_out);
        hc = (unsigned *)malloc((size_t)(n / 256) * 4);
        if (!hq || !hc) CKE(cudaErrorMemoryAllocation, "host memory");
        CKE(cudaMemcpy(hq, qr, qb_out, cudaMemcpyDeviceToHost), "download");
        tq_dequant_host(hq, (const float2 *)(hq + xdo_out), m, F, il, h_ref);
        CKE(cudaMemcpy(hq, qf, qb_out, cudaMemcpyDeviceToHost), "download");
        tq_dequant_host(hq, (const float2 *)(hq + xdo_out), m, F, il, h_fused);
        CKE(cudaMemcpy(hc, cnt, (size_t)(n / 256) * 4, cudaMemcpyDeviceToHost), "download");
        *cnt_zero = 1;
        for (int i = 0; i < n / 256; i++)
            if (hc[i]) *cnt_zero = 0;
    }
out:
    free(hq), free(hc);
    g3cb_free_dmat(&d);
    cudaFree(dx), cudaFree(dxh), cudaFree(dy), cudaFree(dh), cudaFree(qin), cudaFree(qf), cudaFree(qr), cudaFree(cnt);
    if (st) cudaStreamDestroy(st);
    return rc;
}

extern "C" g3_status g3_cuda_test_attention(const g3_cuda_attn_test *t, const float *qkv, const int32_t *pos,
                                            const int32_t *useq, const int32_t *bt, int n_u, int m, float *o,
                                            g3_error *err) {
    g3_status rc = G3_OK;
    const int D = t->D, NQKV = (t->NH + 2 * t->NKV) * D;
    float *dqkv = NULL, *dq = NULL, *dpart = NULL, *dout = NULL, *pool = NULL, *dnorm = NULL;
    __nv_bfloat16 *douth = NULL;
    unsigned *dcnt = NULL;
    int32_t *dpar = NULL;
    size_t pool_elems = (size_t)t->n_blocks * t->n_layers_kind * 2 * t->NKV * t->kv_block * D;
    const size_t pool_bytes = pool_elems * (t->kv16 ? 2 : 4); /* bf16 or float32 elements */
    size_t ni = (size_t)3 * m + (size_t)n_u * 2 * t->mbps;
    CKE(cudaMalloc((void **)&dqkv, (size_t)m * NQKV * 4), "alloc");
    CKE(cudaMalloc((void **)&dq, (size_t)m * t->NH * D * 4), "alloc");
    CKE(cudaMalloc((void **)&dout, (size_t)m * t->NH * D * 4), "alloc");
    CKE(cudaMalloc((void **)&dpart, g3c_attn_part_floats(m * t->n_splits, t->NH, D) * 4), "alloc");
    CKE(cudaMalloc((void **)&douth, (size_t)2 * m * t->NH * D * 2), "alloc");
    CKE(cudaMalloc((void **)&dcnt, (size_t)m * t->NKV * 4), "alloc");
    CKE(cudaMemset(dcnt, 0, (size_t)m * t->NKV * 4), "clear");
    CKE(cudaMalloc((void **)&pool, pool_bytes), "alloc");
    CKE(cudaMemset(pool, 0xff, pool_bytes), "poison"); /* NaNs: reading an unwritten slot shows */
    CKE(cudaMalloc((void **)&dnorm, (size_t)(3 * D) * 4), "alloc");
    CKE(cudaMalloc((void **)&dpar, ni * 4), "alloc");
    CKE(cudaMemcpy(dqkv, qkv, (size_t)m * NQKV * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dnorm, t->q_norm, D * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dnorm + D, t->k_norm, D * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dnorm + 2 * D, t->inv_freq, D / 2 * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dpar + m, pos, m * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dpar + 2 * m, useq, m * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dpar + 3 * m, bt, (size_t)n_u * 2 * t->mbps * 4, cudaMemcpyHostToDevice), "upload");
    {
        g3c_attn_args a;
        memset(&a, 0, sizeof a);
        a.rows.token = dpar, a.rows.pos = dpar + m, a.rows.useq = dpar + 2 * m, a.rows.bt = dpar + 3 * m;
        a.rows.mbps = t->mbps;
        a.m = m, a.NH = t->NH, a.NKV = t->NKV, a.D = D, a.kind = t->kind, a.layer_in_kind = t->layer_in_kind;
        a.n_layers_kind = t->n_layers_kind, a.kv_block = t->kv_block, a.window = t->window, a.scale = t->scale;
        a.softcap = t->softcap, a.eps = t->eps, a.inv_freq = dnorm + 2 * D, a.pool = pool, a.n_splits = t->n_splits;
        a.kv16 = t->kv16;
        a.min_keys = 1;
        CKE(g3c_qkv_post(&a, dqkv, 1, dnorm, dnorm + D, dq, 0), "qkv_post");
        CKE(g3c_attention(&a, dq, dpart, dcnt, dout, douth, 1, 0), "attention");
        /* again over poisoned output: the split counters must have been reset by the first launch */
        CKE(cudaMemset(dout, 0xff, (size_t)m * t->NH * D * 4), "poison");
        CKE(g3c_attention(&a, dq, dpart, dcnt, dout, douth, 1, 0), "attention");
        CKE(cudaMemcpy(o, dout, (size_t)m * t->NH * D * 4, cudaMemcpyDeviceToHost), "download");
        CKE(cudaDeviceSynchronize(), "sync");
    }
out:
    cudaFree(dqkv), cudaFree(dq), cudaFree(dpart), cudaFree(dout), cudaFree(pool), cudaFree(dnorm), cudaFree(dpar),
        cudaFree(douth), cudaFree(dcnt);
    return rc;
}

extern "C" g3_status g3_cuda_test_qgemv_gd(const char *quant, int H, int F, const float *wgu, const float *wdn,
                                           const float *x, const float *yin, const float *w1, const float *w2,
                                           float eps, int reps, float *a_ref, float *y_ref, float *a_out, float *y_out,
                                           int *taken, int *cnt_ok, g3_error *err) {
    g3_status rc = G3_OK;
    g3_dmat gu, dn;
    memset(&gu, 0, sizeof gu), memset(&dn, 0, sizeof dn);
    float *dbuf = NULL, *hz = NULL;
    unsigned *cnt = NULL, hc[G3C_GD_WORDS];
    cudaStream_t st = NULL;
    int g1, g2, want = parse_q(quant);
    const int qt1 = g3c_target_format(G3_DTYPE_F32, want, H, &g1), qt2 = g3c_target_format(G3_DTYPE_F32, want, F, &g2);
    /* device: x, yin, xo, w1, w2 [H] each, a [F], y [H] */
    const size_t off_a = 5 * (size_t)H, off_y = off_a + F, tot = off_y + H;
    *taken = 0, *cnt_ok = 0;
    if (want < 0 || qt1 < 0 || qt2 < 0 || H % 32 || F % 32 || reps < 1)
        return g3c_fail(err, G3_ERR_ARG, "cuda test: qgemv_gd %s H %d F %d", quant, H, F);
    CKE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    CKE(test_dmat(G3_DTYPE_F32, wgu, 2 * F, H, qt1, g1, &gu, st), "weights");
    CKE(test_dmat(G3_DTYPE_F32, wdn, H, F, qt2, g2, &dn, st), "weights");
    CKE(cudaMalloc((void **)&dbuf, tot * 4), "alloc");
    CKE(cudaMalloc((void **)&cnt, sizeof hc), "alloc");
    CKE(cudaMemset(cnt, 0, sizeof hc), "clear");
    CKE(cudaMemcpy(dbuf, x, (size_t)H * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dbuf + H, yin, (size_t)H * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dbuf + 3 * (size_t)H, w1, (size_t)H * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dbuf + 4 * (size_t)H, w2, (size_t)H * 4, cudaMemcpyHostToDevice), "upload");
    hz = (float *)malloc((size_t)H * 4);
    if (!hz) CKE(cudaErrorMemoryAllocation, "host memory");
    for (int i = 0; i < H; i++) hz[i] = 1.f;
    CKE(cudaDeviceSynchronize(), "upload");
    if (!g3c_qgemv_gd_ok(&gu, &dn, 1)) goto out; /* *taken = 0: nothing run */
    *taken = 1;
    for (int r = -1; r < reps; r++) { /* -1: the two launches (g3c_qgemv_pn, then the down product) */
        g3c_qp_pre pq;
        memset(&pq, 0, sizeof pq);
        pq.xi = dbuf, pq.y = dbuf + H, pq.xo = dbuf + 2 * H, pq.w1 = dbuf + 3 * H, pq.w2 = dbuf + 4 * H, pq.eps = eps;
        pq.zero = dbuf + off_y, pq.zero_n = H; /* y: ones, which the gate/up product's prologue must clear */
        CKE(cudaMemsetAsync(dbuf + off_a, 0xff, (size_t)F * 4, st), "poison"); /* a: NaNs until written */
        CKE(cudaMemcpyAsync(dbuf + off_y, hz, (size_t)H * 4, cudaMemcpyHostToDevice, st), "upload");
        if (r < 0) {
            CKE(g3c_qgemv_pn(&gu, &pq, 1, dbuf + off_a, F, 1, st), "qgemv_pn");
            CKE(g3c_qgemv(&dn, dbuf + off_a, F, 1, dbuf + off_y, H, 0, NULL, 0, st), "qgemv"); /* k_qgemv_p */
        } else {
            CKE(g3c_qgemv_gd(&gu, &pq, &dn, 1, dbuf + off_a, F, dbuf + off_y, H, cnt, st), "qgemv_gd");
        }
        CKE(cudaStreamSynchronize(st), "run");
        CKE(cudaMemcpy(r < 0 ? a_ref : a_out, dbuf + off_a, (size_t)F * 4, cudaMemcpyDeviceToHost), "download");
        CKE(cudaMemcpy(r < 0 ? y_ref : y_out + (size_t)r * H, dbuf + off_y, (size_t)H * 4, cudaMemcpyDeviceToHost),
            "download");
    }
    CKE(cudaMemcpy(hc, cnt, sizeof hc, cudaMemcpyDeviceToHost), "download");
    *cnt_ok = 1;
    for (int i = 0; i < G3C_GD_WORDS; i++)
        if (hc[i]) *cnt_ok = 0;
out:
    free(hz);
    g3cb_free_dmat(&gu), g3cb_free_dmat(&dn);
    cudaFree(dbuf), cudaFree(cnt);
    if (st) cudaStreamDestroy(st);
    return rc;
}

extern "C" g3_status g3_cuda_test_qgemv_pn(uint32_t src_type, const void *w, int n, int k, const char *quant,
                                           int geglu, const float *x, const float *yin, const float *w1,
                                           const float *w2, float eps, int m, float *y, float *xo, float *wdeq,
                                           int *zero_ok, g3_error *err) {
    g3_status rc = G3_OK;
    g3_dmat d;
    memset(&d, 0, sizeof d);
    float *dbuf = NULL, *hz = NULL;
    cudaStream_t st = NULL;
    int g, want = parse_q(quant), qt = g3c_target_format(src_type, want, k, &g);
    const size_t rb = g3c_src_row_bytes(src_type, k), nk = (size_t)n * k;
    const size_t mk = (size_t)m * k, outw = geglu ? (size_t)n / 2 : (size_t)n;
    if (want < 0 || qt < 0 || !rb) return g3c_fail(err, G3_ERR_UNSUPPORTED, "cuda test: type %u / %s", src_type, quant);
    /* device: x, yin, xo, w1, w2, zero, y, wdeq (each 16-byte aligned: m*k, k and n are multiples of 4 here) */
    const size_t off_y = 4 * mk + 2 * (size_t)k, off_wd = off_y + (size_t)m * outw, tot = off_wd + nk;
    if (k % 32 || m < 1 || m > 2) return g3c_fail(err, G3_ERR_ARG, "cuda test: qgemv_pn needs k %% 32 == 0, m 1..2");
    CKE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    CKE(test_dmat(src_type, w, n, k, qt, g, &d, st), "weights");
    CKE(cudaMalloc((void **)&dbuf, tot * 4), "alloc");
    CKE(cudaMemcpy(dbuf, x, mk * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dbuf + mk, yin, mk * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemset(dbuf + 2 * mk, 0xff, mk * 4), "poison"); /* xo: NaNs where a block forgets its slice */
    CKE(cudaMemcpy(dbuf + 3 * mk, w1, (size_t)k * 4, cudaMemcpyHostToDevice), "upload");
    CKE(cudaMemcpy(dbuf + 3 * mk + k, w2, (size_t)k * 4, cudaMemcpyHostToDevice), "upload");
    {
        hz = (float *)malloc(mk * 4);
        if (!hz) CKE(cudaErrorMemoryAllocation, "host memory");
        for (size_t i = 0; i < mk; i++) hz[i] = 1.f;
        CKE(cudaMemcpy(dbuf + 3 * mk + 2 * k, hz, mk * 4, cudaMemcpyHostToDevice), "upload"); /* the zero buffer */
    }
    CKE(cudaMemset(dbuf + off_y, 0, (size_t)m * outw * 4), "clear"); /* product outputs start at zero */
    CKE(cudaDeviceSynchronize(), "upload"); /* the legacy stream's copies before the kernels on st */
    {
        g3c_qp_pre pq;
        memset(&pq, 0, sizeof pq);
        pq.xi = dbuf, pq.y = dbuf + mk, pq.xo = dbuf + 2 * mk, pq.w1 = dbuf + 3 * mk, pq.w2 = dbuf + 3 * mk + k;
        pq.eps = eps, pq.zero = dbuf + 3 * mk + 2 * k, pq.zero_n = (int)mk;
        if (!g3c_qgemv_pn_supported(&d, m, geglu)) CKE(cudaErrorNotSupported, "qgemv_pn on this format");
        CKE(g3c_qgemv_pn(&d, &pq, m, dbuf + off_y, (int)outw, geglu, st), "qgemv_pn");
        CKE(g3c_dequant_f32(&d, dbuf + off_wd, st), "dequant");
        CKE(cudaStreamSynchronize(st), "run");
    }
    CKE(cudaMemcpy(y, dbuf + off_y, (size_t)m * outw * 4, cudaMemcpyDeviceToHost), "download");
    CKE(cudaMemcpy(xo, dbuf + 2 * mk, mk * 4, cudaMemcpyDeviceToHost), "download");
    CKE(cudaMemcpy(wdeq, dbuf + off_wd, nk * 4, cudaMemcpyDeviceToHost), "download");
    CKE(cudaMemcpy(hz, dbuf + 3 * mk + 2 * k, mk * 4, cudaMemcpyDeviceToHost), "download");
    *zero_ok = 1;
    for (size_t i = 0; i < mk; i++)
        if (hz[i] != 0.f) *zero_ok = 0;
out:
    free(hz);
    g3cb_free_dmat(&d);
    cudaFree(dbuf);
    if (st) cudaStreamDestroy(st);
    return rc;
}
