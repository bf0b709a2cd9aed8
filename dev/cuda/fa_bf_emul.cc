/* Host-only check of the fragment index math of the 3xBF16 form of the tensor-core flash kernel
 * (src/backend/cuda/attention_tc.cu, $G3_CUDA_FATC=3|4) without a GPU: one warp's S = Q K^T and O += P V emulated lane
 * by lane from the PTX m16n8k16 .bf16 fragment tables (A a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..),
 * a3 (g+8, 2t+8..); B b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t),
 * c3 (g+8, 2t+1)), with the kernel's shared-memory addressing, its hi + lo bf16 split (round to nearest even) and
 * its P fragments taken from the accumulators of key groups 2 kk, 2 kk + 1, against float64 products; also counts the
 * shared-memory wavefronts of each fragment load. Build and run:
 *   g++ -O2 -o /tmp/fa_bf_emul dev/cuda/fa_bf_emul.cc && /tmp/fa_bf_emul
 * (expected: relative errors ~1e-5 (3xBF16), 1 wavefront per 32-bit load, 2 per 64-bit load). */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fa_emul_c.h"
const int DP = 128, QS = DP + 4, KS = DP + 4, VS = DP + 4, NJ = DP / 8;
float Qs[64 * QS], Ks[64 * KS], Vs[64 * VS];
static float bf(float x) { /* round to bf16, nearest even */
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
struct pr { float hi[2], lo[2]; }; /* one register pair: (x, y) as hi and lo bf16 pairs */
static pr split(float x, float y) {
    pr p;
    p.hi[0] = bf(x), p.hi[1] = bf(y), p.lo[0] = bf(x - p.hi[0]), p.lo[1] = bf(y - p.hi[1]);
    return p;
}
/* D (16x8) += A (16x16) B (16x8) with A, B given per lane as pairs; which = 0: a.lo b.hi, 1: a.hi b.lo, 2: hi hi */
static void mma(float d[32][4], pr a[32][4], pr b[32][2], int which) {
    double A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        for (int e = 0; e < 2; e++) {
            const float *a0 = which == 0 ? a[l][0].lo : a[l][0].hi, *a1 = which == 0 ? a[l][1].lo : a[l][1].hi;
            const float *a2 = which == 0 ? a[l][2].lo : a[l][2].hi, *a3 = which == 0 ? a[l][3].lo : a[l][3].hi;
            const float *b0 = which == 1 ? b[l][0].lo : b[l][0].hi, *b1 = which == 1 ? b[l][1].lo : b[l][1].hi;
            A[g][2 * t + e] = a0[e], A[g + 8][2 * t + e] = a1[e], A[g][2 * t + 8 + e] = a2[e];
            A[g + 8][2 * t + 8 + e] = a3[e];
            B[2 * t + e][g] = b0[e], B[2 * t + 8 + e][g] = b1[e];
        }
    }
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        int rr[4] = {g, g, g + 8, g + 8}, cc[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        for (int i = 0; i < 4; i++) {
            double s = 0;
            for (int k = 0; k < 16; k++) s += A[rr[i]][k] * B[k][cc[i]];
            d[l][i] += (float)s;
        }
    }
}
static void mma3(float d[32][4], pr a[32][4], pr b[32][2]) { mma(d, a, b, 0), mma(d, a, b, 1), mma(d, a, b, 2); }
/* shared-memory wavefronts of one warp-wide load of `words` 32-bit words per lane at word addresses addr */
static int wavefronts(const int *addr, int words) {
    int n = 0;
    for (int b = 0; b < 32; b++) {
        int cnt = 0; /* distinct words in bank b */
        int seen[64], ns = 0;
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < words; k++) {
                int wd = addr[l] + k;
                if ((wd & 31) != b) continue;
                int dup = 0;
                for (int i = 0; i < ns; i++) dup |= seen[i] == wd;
                if (!dup) seen[ns++] = wd, cnt++;
            }
        if (cnt > n) n = cnt;
    }
    return n;
}
int main() {
    for (auto &x : Qs) x = 4.f * (rand() / (float)RAND_MAX - .5f);
    for (auto &x : Ks) x = 4.f * (rand() / (float)RAND_MAX - .5f);
    for (auto &x : Vs) x = 4.f * (rand() / (float)RAND_MAX - .5f);
    const int w = 2;
    static float s[8][32][4], oacc[NJ][32][4];
    for (int kk = 0; kk < DP / 16; kk++) {
        pr a[32][4];
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, t = l & 3;
            const float *q0 = Qs + (16 * w + g) * QS + 2 * t, *q1 = q0 + 8 * QS;
            a[l][0] = split(q0[16 * kk], q0[16 * kk + 1]), a[l][1] = split(q1[16 * kk], q1[16 * kk + 1]);
            a[l][2] = split(q0[16 * kk + 8], q0[16 * kk + 9]), a[l][3] = split(q1[16 * kk + 8], q1[16 * kk + 9]);
        }
        for (int j = 0; j < 8; j++) {
            pr b[32][2];
            for (int l = 0; l < 32; l++) {
                int g = l >> 2, t = l & 3;
                const float *kr = Ks + (8 * j + g) * KS + 16 * kk + 2 * t;
                b[l][0] = split(kr[0], kr[1]), b[l][1] = split(kr[8], kr[9]);
            }
            mma3(s[j], a, b);
        }
    }
    double e1 = 0, m1 = 0;
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) {
                int g = l >> 2, t = l & 3, r = 16 * w + g + 8 * (i >> 1), key = 8 * j + 2 * t + (i & 1);
                double ref = 0, mag = 0;
                for (int d = 0; d < DP; d++) {
                    const double qk = (double)Qs[r * QS + d] * Ks[key * KS + d];
                    ref += qk, mag += fabs(qk);
                }
                e1 = fmax(e1, fabs(ref - s[j][l][i]) / mag), m1 = fmax(m1, fabs(ref));
            }
    printf("S max error %.3g of sum |q k| (largest |S| %.1f)\n", e1, m1);
    for (int j = 0; j < 8; j++) /* P in [0, 1] as the kernel's softmax leaves it */
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) s[j][l][i] = (float)exp(-fabs(s[j][l][i]) / 8);
    for (int kk = 0; kk < 4; kk++) {
        pr a[32][4], b[32][2];
        for (int l = 0; l < 32; l++) {
            a[l][0] = split(s[2 * kk][l][0], s[2 * kk][l][1]), a[l][1] = split(s[2 * kk][l][2], s[2 * kk][l][3]);
            a[l][2] = split(s[2 * kk + 1][l][0], s[2 * kk + 1][l][1]);
            a[l][3] = split(s[2 * kk + 1][l][2], s[2 * kk + 1][l][3]);
        }
        for (int j = 0; j < NJ; j++) {
            for (int l = 0; l < 32; l++) {
                int g = l >> 2, t = l & 3;
                const float *vr = Vs + (16 * kk + 2 * t) * VS + g;
                b[l][0] = split(vr[8 * j], vr[VS + 8 * j]), b[l][1] = split(vr[8 * VS + 8 * j], vr[9 * VS + 8 * j]);
            }
            mma3(oacc[j], a, b);
        }
    }
    static float P[16][64];
    c_to_rows(s, P);
    const double e2 = o_max_err(P, Vs, VS, NJ, oacc, true);
    printf("O max error %.3g of sum |p v|\n", e2);
    int aq[32], ak[32], av0[32], av1[32], av8[32];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        aq[l] = (16 * w + g) * QS + 2 * t, ak[l] = g * KS + 2 * t;
        av0[l] = (2 * t) * VS + g, av1[l] = (2 * t + 1) * VS + g, av8[l] = (2 * t + 8) * VS + g;
    }
    printf("wavefronts: Q (64-bit) %d, K (64-bit) %d, V rows 2t / 2t+1 / 2t+8 (32-bit) %d %d %d\n", wavefronts(aq, 2),
           wavefronts(ak, 2), wavefronts(av0, 1), wavefronts(av1, 1), wavefronts(av8, 1));
    return e1 < 1e-4 && e2 < 1e-4 ? 0 : 1;
}
