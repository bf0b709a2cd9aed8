/* Decode attention micro-benchmark (27B shape: 32 q heads, 16 kv heads, D = 128, float32 paged cache of 62 layers,
 * kv_block 16): CUDA graphs of 62 layers of (QK-norm/RoPE/cache write + attention), timed per layer, for the
 * round-1 separate kernels, the round-1 fused kernel and the second attention kernel (attention_dec.cu).
 * Build (after the g3cuda and g3 libraries):
 *   nvcc -O3 -arch=sm_90a -std=c++17 -Iinclude -Isrc dev/cuda/attn2_bench.cu -o attn2_bench \
 *        -Lbuild/ -Xlinker --start-group -lg3cuda -lg3 -Xlinker --end-group -lcublas -lcublasLt -lm -lpthread
 * Run: ./attn2_bench (cluster size per $G3_CUDA_ATTN2_C, default automatic). */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"

#include "dev_check.cuh"

enum { NH = 32, NKV = 16, D = 128, BLK = 16, NL = 62, MAXB = 448 };

int main(void) {
    const int NQKV = (NH + 2 * NKV) * D;
    const size_t pool_floats = (size_t)MAXB * NL * 2 * NKV * BLK * D;
    float *pool, *y, *q, *o, *part, *norm;
    __nv_bfloat16 *oh;
    unsigned *cnt;
    int32_t *par;
    int n_sm = 132;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc((void **)&pool, pool_floats * 4));
    CK(cudaMemset(pool, 0, pool_floats * 4));
    CK(cudaMalloc((void **)&y, (size_t)64 * NQKV * 4));
    CK(cudaMemset(y, 0, (size_t)64 * NQKV * 4));
    CK(cudaMalloc((void **)&q, (size_t)64 * NH * D * 4));
    CK(cudaMalloc((void **)&o, (size_t)64 * NH * D * 4));
    CK(cudaMalloc((void **)&oh, (size_t)2 * 64 * NH * D * 2));
    CK(cudaMalloc((void **)&part, g3c_attn_part_floats(64 * 64, NH, D) * 4));
    CK(cudaMalloc((void **)&cnt, 64 * NKV * 4));
    CK(cudaMemset(cnt, 0, 64 * NKV * 4));
    CK(cudaMalloc((void **)&norm, 3 * D * 4));
    CK(cudaMemset(norm, 0, 3 * D * 4));
    const int MBPS = 64;
    CK(cudaMalloc((void **)&par, (3 * 64 + 64 * 2 * MBPS) * 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int ms[4] = {1, 8, 32, 64};
    for (int ci = 0; ci < 4; ci++) {
        const int m = ms[ci];
        int32_t h[3 * 64 + 64 * 2 * MBPS];
        int next = 0;
        for (int r = 0; r < m; r++) {
            const int p = m == 1 ? 600 : m == 8 ? 500 + 13 * r : 65 + (r * 7) % 32;
            h[r] = 0, h[64 + r] = p, h[128 + r] = r;
            for (int j = 0; j < 2 * MBPS; j++) h[192 + r * 2 * MBPS + j] = -1;
            for (int j = 0; j <= p / BLK; j++) h[192 + r * 2 * MBPS + j] = next++;
        }
        if (next > MAXB) return fprintf(stderr, "pool too small\n"), 1;
        CK(cudaMemcpy(par, h, sizeof h, cudaMemcpyHostToDevice));
        g3c_attn_args a;
        memset(&a, 0, sizeof a);
        a.rows.token = par, a.rows.pos = par + 64, a.rows.useq = par + 128, a.rows.bt = par + 192, a.rows.mbps = MBPS;
        a.m = m, a.NH = NH, a.NKV = NKV, a.D = D, a.kind = 0, a.n_layers_kind = NL, a.kv_block = BLK;
        a.window = 1024, a.scale = 1.f / 12.f, a.softcap = 0.f, a.eps = 1e-6f, a.inv_freq = norm + 2 * D;
        a.pool = pool;
        int S = (4 * n_sm + m * NKV - 1) / (m * NKV);
        a.n_splits = S < 1 ? 1 : S > 64 ? 64 : S, a.min_keys = 32;
        const char *names[6] = {"r1 separate (qk + attn)", "r1 fused", "new separate (qk + attn)", "r1 attn only",
                                "new attn only", "new fused"};
        for (int mode = 0; mode < 6; mode++) {
            g3c_attn2_force(mode == 2 || mode >= 4 ? 1 : 0);
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < NL; l++) {
                a.layer_in_kind = l;
                if (mode == 1 || mode == 5) {
                    CK(g3c_attention_fused(&a, y, 1, norm, norm + D, part, cnt, o, oh, 1, st));
                } else {
                    if (mode < 3) CK(g3c_qkv_post_rows(&a, y, 1, norm, norm + D, q, st));
                    CK(g3c_attention(&a, q, part, cnt, o, oh, 1, st));
                }
            }
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            CK(cudaEventRecord(e0, st));
            const int N = 20;
            for (int i = 0; i < N; i++) CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaStreamSynchronize(st));
            float ms_ = 0;
            CK(cudaEventElapsedTime(&ms_, e0, e1));
            int W = 0;
            const int C = g3c_attn2_cluster(m, NKV, &W);
            printf("attn bench | rows %2d | %-26s | cluster %d x %2d warps | %7.2f us per layer\n", m, names[mode], C,
                   W, ms_ * 1000.f / N / NL);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
        }
        g3c_attn2_force(-1);
    }
    return 0;
}
