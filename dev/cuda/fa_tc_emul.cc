/* Host-only check of the fragment index math of the tensor-core flash kernel (src/backend/cuda/attention_tc.cu)
 * without a GPU: one warp's S = Q K^T and O += P V are emulated lane by lane from the PTX m16n8k8 .tf32 fragment
 * tables (A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B b0 (k t, n g), b1 (k t+4, n g); C c0 (g, 2t),
 * c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)), with the kernel's shared-memory addressing (padded strides) and its
 * quad shuffles from the C layout of P to the A layout, against float64 products; also checks that the fragment loads
 * hit 32 distinct banks. Build and run: g++ -O2 -o /tmp/fa_tc_emul dev/cuda/fa_tc_emul.cc && /tmp/fa_tc_emul
 * (expected: errors ~1e-7 (float accumulation), banks distinct 1 1 1). */
#include <cstdio>
#include <cmath>
#include <cstdlib>

#include "fa_emul_c.h"
const int DP = 128, QS = DP + 4, KS = DP + 4, VS = DP + 8, NJ = DP / 8;
float Qs[64 * QS], Ks[64 * KS], Vs[64 * VS];
// mma: lanes' fragments -> D (16x8) += A (16x8) B (8x8)
void mma(float d[32][4], float a[32][4], float b[32][2]) {
    float A[16][8], B[8][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        A[g][t] = a[l][0], A[g + 8][t] = a[l][1], A[g][t + 4] = a[l][2], A[g + 8][t + 4] = a[l][3];
        B[t][g] = b[l][0], B[t + 4][g] = b[l][1];
    }
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        int rr[4] = {g, g, g + 8, g + 8}, cc[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        for (int i = 0; i < 4; i++) {
            double s = 0;
            for (int k = 0; k < 8; k++) s += (double)A[rr[i]][k] * B[k][cc[i]];
            d[l][i] += s;
        }
    }
}
int main() {
    for (auto &x : Qs) x = rand() / (float)RAND_MAX - .5f;
    for (auto &x : Ks) x = rand() / (float)RAND_MAX - .5f;
    for (auto &x : Vs) x = rand() / (float)RAND_MAX - .5f;
    const int w = 2;
    static float s[8][32][4], oacc[NJ][32][4];
    for (int kk = 0; kk < NJ; kk++) {
        float a[32][4];
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, t = l & 3;
            const float *q0 = Qs + (16 * w + g) * QS + t, *q1 = q0 + 8 * QS;
            a[l][0] = q0[8 * kk], a[l][1] = q1[8 * kk], a[l][2] = q0[8 * kk + 4], a[l][3] = q1[8 * kk + 4];
        }
        for (int j = 0; j < 8; j++) {
            float b[32][2];
            for (int l = 0; l < 32; l++) {
                int g = l >> 2, t = l & 3;
                const float *kr = Ks + (8 * j + g) * KS + 8 * kk + t;
                b[l][0] = kr[0], b[l][1] = kr[4];
            }
            mma(s[j], a, b);
        }
    }
    double e1 = 0;
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) {
                int g = l >> 2, t = l & 3, r = 16 * w + g + 8 * (i >> 1), key = 8 * j + 2 * t + (i & 1);
                double ref = 0;
                for (int d = 0; d < DP; d++) ref += (double)Qs[r * QS + d] * Ks[key * KS + d];
                e1 = fmax(e1, fabs(ref - s[j][l][i]));
            }
    printf("S max err %.3g\n", e1);
    // P = s (as is); O = P V, P rows 16 w + ..., keys 0..63
    for (int kk = 0; kk < 8; kk++) {
        float a[32][4], b[32][2];
        for (int l = 0; l < 32; l++) {
            int t = l & 3, src0 = (l & ~3) | (t >> 1), src1 = src0 + 2;
            bool odd = t & 1;
            float x0 = s[kk][src0][0], x1 = s[kk][src0][1], x2 = s[kk][src0][2], x3 = s[kk][src0][3];
            float y0 = s[kk][src1][0], y1 = s[kk][src1][1], y2 = s[kk][src1][2], y3 = s[kk][src1][3];
            a[l][0] = odd ? x1 : x0, a[l][1] = odd ? x3 : x2, a[l][2] = odd ? y1 : y0, a[l][3] = odd ? y3 : y2;
        }
        for (int j = 0; j < NJ; j++) {
            for (int l = 0; l < 32; l++) {
                int g = l >> 2, t = l & 3;
                const float *vr = Vs + (8 * kk + t) * VS + g;
                b[l][0] = vr[8 * j], b[l][1] = vr[4 * VS + 8 * j];
            }
            mma(oacc[j], a, b);
        }
    }
    // reference P[r][key] from s via the C layout
    static float P[16][64];
    c_to_rows(s, P);
    const double e2 = o_max_err(P, Vs, VS, NJ, oacc, false);
    printf("O max err %.3g\n", e2);
    // bank check: Q A loads, K B loads, V B loads (words, 32 lanes distinct banks?)
    auto distinct = [](int *addr) { int seen[32] = {0}; for (int l = 0; l < 32; l++) if (seen[addr[l] & 31]++) return 0; return 1; };
    int aq[32], ak[32], av[32];
    for (int l = 0; l < 32; l++) { int g = l >> 2, t = l & 3; aq[l] = (16 * w + g) * QS + t; ak[l] = g * KS + t; av[l] = t * VS + g; }
    printf("banks distinct: Q %d K %d V %d\n", distinct(aq), distinct(ak), distinct(av));
}
