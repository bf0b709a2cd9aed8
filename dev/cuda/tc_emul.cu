/* Host-only check of the tensor-core kernels' register layouts (src/backend/cuda/tc_frag.cuh) without a GPU: one
 * warp of k_tc is emulated lane by lane for a 16-row tile — the same tc_decode / tc_bregs calls on the same
 * resident formats, an mma.sync m16n8k16 emulated from the PTX fragment tables, the same epilogue mapping — and the
 * result is compared with a float64 dot product of the dequantized weights and the (hi + lo) activations. The
 * staged kernel of tc_stage.cu (9..64 rows) is emulated whole: blocks, shared-memory stages, float2 epilogue.
 *
 *   nvcc -std=c++17 -arch=sm_90a -I include -I src dev/cuda/tc_emul.cu -o /tmp/tc_emul && /tmp/tc_emul
 *
 * Prints one line per case and exits 1 if any case is off by more than bf16 rounding allows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/tc_frag.cuh"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* one 16-row tile in a resident format, with its exact dequantized values */
struct tile {
    int qt, k, g;
    uint8_t *q;   /* rows of k values in the format */
    float *s, *z; /* [16][k/g] */
    double *wd;   /* [16][k] dequantized */
    size_t rowb;
};

static void make_tile(tile *T, int qt, int k, int g, int rows = 16) {
    T->qt = qt, T->k = k, T->g = g;
    T->rowb = qt == TC_BF16 ? (size_t)k * 2 : qt == TC_INT4 ? (size_t)k / 2 : (size_t)k;
    T->q = (uint8_t *)calloc(rows, T->rowb);
    T->s = (float *)calloc(rows * (k / g), 4), T->z = (float *)calloc(rows * (k / g), 4);
    T->wd = (double *)calloc(rows * (size_t)k, 8);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < k; i++) {
            size_t gi = (size_t)r * (k / g) + i / g;
            if (i % g == 0) T->s[gi] = 0.01f + 0.02f * fabsf(frand()), T->z[gi] = 0.1f * frand();
            double v;
            if (qt == TC_BF16) {
                uint16_t h = (uint16_t)tc_bf16_rn_host(frand());
                memcpy(T->q + r * T->rowb + 2 * i, &h, 2);
                v = tc_bf2f(h);
            } else if (qt == TC_INT8) {
                int8_t q = (int8_t)(rand() % 255 - 127);
                T->q[r * T->rowb + i] = (uint8_t)q;
                v = (double)T->s[gi] * q;
            } else if (qt == TC_FP8) {
                uint8_t b = (uint8_t)(rand() & 0xff);
                if ((b & 0x7f) == 0x7f) b = 0x10; /* no NaN */
                T->q[r * T->rowb + i] = b;
                float lo, hi;
                tc_fp8x2(b, lo, hi);
                v = (double)T->s[gi] * lo;
            } else {
                int q = rand() % 16;
                uint8_t *p = T->q + r * T->rowb + i / 2;
                *p = (uint8_t)(i & 1 ? (*p & 0x0f) | (q << 4) : (*p & 0xf0) | q);
                v = (double)T->s[gi] * q + T->z[gi];
            }
            T->wd[(size_t)r * k + i] = v;
        }
}

/* emulated mma: lanes' A/B registers -> C += A B (PTX m16n8k16 tables) */
static void emu_mma(float c[32][4], const uint32_t a[32][4], const uint32_t b[32][2]) {
    double A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        A[g][2 * t] = tc_bf2f(a[l][0] & 0xffff), A[g][2 * t + 1] = tc_bf2f(a[l][0] >> 16);
        A[g + 8][2 * t] = tc_bf2f(a[l][1] & 0xffff), A[g + 8][2 * t + 1] = tc_bf2f(a[l][1] >> 16);
        A[g][2 * t + 8] = tc_bf2f(a[l][2] & 0xffff), A[g][2 * t + 9] = tc_bf2f(a[l][2] >> 16);
        A[g + 8][2 * t + 8] = tc_bf2f(a[l][3] & 0xffff), A[g + 8][2 * t + 9] = tc_bf2f(a[l][3] >> 16);
        B[2 * t][g] = tc_bf2f(b[l][0] & 0xffff), B[2 * t + 1][g] = tc_bf2f(b[l][0] >> 16);
        B[2 * t + 8][g] = tc_bf2f(b[l][1] & 0xffff), B[2 * t + 9][g] = tc_bf2f(b[l][1] >> 16);
    }
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        for (int e = 0; e < 4; e++) {
            int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
            double s = 0;
            for (int kk = 0; kk < 16; kk++) s += A[row][kk] * B[kk][col];
            c[l][e] += (float)s;
        }
    }
}

template <int QT, int MODE>
static int run_case(int k, int g, int m, int split, const char *name) {
    constexpr int V = QT == TC_BF16 ? 8 : QT == TC_INT4 ? 32 : 16, Q = V / 8;
    tile T;
    make_tile(&T, QT, k, g);
    const int nch = k / V, R = (nch + 3) / 4, NT = split ? (m <= 4 ? 1 : 2) : (m + 7) / 8, ngr = k / g;
    /* activations: xh = hi rows [m][k], then lo rows [m][k] */
    float *x = (float *)malloc(sizeof(float) * m * k);
    uint16_t *xh = (uint16_t *)calloc(2 * (size_t)m * k, 2);
    for (int i = 0; i < m * k; i++) {
        x[i] = frand() * 3;
        uint16_t h = (uint16_t)tc_bf16_rn_host(x[i]);
        xh[i] = h;
        xh[(size_t)m * k + i] = (uint16_t)tc_bf16_rn_host(x[i] - tc_bf2f(h));
    }
    float acc[32][8][4], cq[32][8][4], co[32][8][4];
    memset(acc, 0, sizeof acc);
    for (int r = 0; r < R; r++) {
        memset(cq, 0, sizeof cq), memset(co, 0, sizeof co);
        for (int j = 0; j < V / 4; j++) {
            uint32_t a[32][4], b[8][32][2], one[32][4];
            for (int l = 0; l < 32; l++) {
                int gg = l >> 2, t = l & 3, kc = r * 4 + t;
                bool ok = kc < nch;
                uint4 wa = {0, 0, 0, 0}, wb = {0, 0, 0, 0};
                if (ok) memcpy(&wa, T.q + gg * T.rowb + (size_t)kc * 16, 16), memcpy(&wb, T.q + (gg + 8) * T.rowb + (size_t)kc * 16, 16);
                int grp = MODE == 1 ? (r * 4 * V) / g : (kc * V) / g;
                grp = ok ? grp : 0;
                float sa = T.s[gg * ngr + grp], za = T.z[gg * ngr + grp], sb = T.s[(gg + 8) * ngr + grp], zb = T.z[(gg + 8) * ngr + grp];
                tc_decode<QT, MODE>(wa, j, sa, za, a[l][0], a[l][2]);
                tc_decode<QT, MODE>(wb, j, sb, zb, a[l][1], a[l][3]);
                for (int e = 0; e < 4; e++) one[l][e] = 0x3F803F80u;
                for (int nt = 0; nt < NT; nt++) {
                    int i = split ? 4 * nt + (gg >> 1) : 8 * nt + gg;
                    bool xv = i < m;
                    size_t row = (split && (gg & 1) ? (size_t)m : 0) + (size_t)(xv ? i : 0);
                    uint4 xb = {0, 0, 0, 0};
                    if (xv && ok) memcpy(&xb, xh + row * k + (size_t)kc * V + (j / 2) * 8, 16);
                    tc_bregs<QT>(xb, j & 1, b[nt][l][0], b[nt][l][1]);
                }
            }
            (void)Q;
            for (int nt = 0; nt < NT; nt++) {
                float c[32][4], c1[32][4];
                for (int l = 0; l < 32; l++)
                    for (int e = 0; e < 4; e++) c[l][e] = MODE == 1 ? cq[l][nt][e] : acc[l][nt][e], c1[l][e] = co[l][nt][e];
                emu_mma(c, a, b[nt]);
                if (MODE == 1) emu_mma(c1, one, b[nt]);
                for (int l = 0; l < 32; l++)
                    for (int e = 0; e < 4; e++) {
                        if (MODE == 1) cq[l][nt][e] = c[l][e], co[l][nt][e] = c1[l][e];
                        else acc[l][nt][e] = c[l][e];
                    }
            }
        }
        if (MODE == 1)
            for (int l = 0; l < 32; l++) {
                int gg = l >> 2, grp = (r * 4 * V) / g;
                for (int nt = 0; nt < NT; nt++)
                    for (int e = 0; e < 4; e++) {
                        int row = gg + (e >= 2 ? 8 : 0);
                        float s = T.s[row * ngr + grp], z = T.z[row * ngr + grp];
                        acc[l][nt][e] += s * cq[l][nt][e] + (z - 128.f * s) * co[l][nt][e];
                    }
            }
    }
    /* epilogue as in k_tc */
    double *y = (double *)calloc((size_t)m * 16, 8);
    for (int l = 0; l < 32; l++) {
        int gg = l >> 2, t = l & 3;
        for (int nt = 0; nt < NT; nt++)
            for (int hf = 0; hf < 2; hf++) {
                int row = gg + 8 * hf;
                float sc = MODE == 0 && QT != TC_BF16 ? T.s[row] : 1.f;
                float c0 = acc[l][nt][2 * hf], c1 = acc[l][nt][2 * hf + 1];
                if (split) {
                    int i = 4 * nt + t;
                    if (i < m) y[i * 16 + row] += (c0 + c1) * sc;
                } else {
                    int i = 8 * nt + 2 * t;
                    if (i < m) y[i * 16 + row] += c0 * sc;
                    if (i + 1 < m) y[(i + 1) * 16 + row] += c1 * sc;
                }
            }
    }
    double worst = 0, mx = 1e-30;
    for (int i = 0; i < m; i++)
        for (int row = 0; row < 16; row++) {
            double ref = 0, refx = 0;
            for (int kk = 0; kk < k; kk++) {
                double xv = split ? (double)tc_bf2f(xh[(size_t)i * k + kk]) + tc_bf2f(xh[(size_t)(m + i) * k + kk])
                                  : (double)tc_bf2f(xh[(size_t)i * k + kk]);
                ref += T.wd[(size_t)row * k + kk] * xv;
                refx += fabs(T.wd[(size_t)row * k + kk] * xv);
            }
            mx = fmax(mx, refx / sqrt((double)k));
            worst = fmax(worst, fabs(ref - y[i * 16 + row]));
        }
    double rel = worst / mx;
    /* exact modes: float32 accumulation only; MODE 2 rounds weights to bf16 */
    double tol = MODE == 2 ? 2e-2 : 1e-4;
    printf("  %-24s k=%-4d g=%-4d m=%d split=%d: rel err %.2e %s\n", name, k, g, m, split, rel, rel <= tol ? "ok" : "FAIL");
    free(T.q), free(T.s), free(T.z), free(T.wd), free(x), free(xh), free(y);
    return rel <= tol ? 0 : 1;
}

/* k_tcm (tc_stage.cu), emulated block by block and warp by warp: stream-K over (256-row tile, stage) units, the
 * swizzled shared-memory stage written as the block writes it, B fragments read back per lane, the float2 epilogue
 * through tc_pair_send / tc_pair_take with the lane ^ 4 exchange. Also checks that the stage writes are a
 * permutation and that each 8-lane phase of a 16-byte shared read touches 8 distinct bank groups. */
template <int QT, int MODE>
static int run_stage_case(int n, int k, int g, int m, int blocks, const char *name) {
    constexpr int V = QT == TC_BF16 ? 8 : QT == TC_INT4 ? 32 : 16, Q = V / 8, NW = 8, TT = 2, KR = 2;
    const int NT = m <= 16 ? 2 : m <= 32 ? 4 : 8, MP = 8 * NT;
    tile T;
    make_tile(&T, QT, k, g, n);
    const int nch = k / V, ngr = k / g, S = (nch + 4 * KR - 1) / (4 * KR), tiles = (n + 255) / 256;
    const long long L = (long long)tiles * S;
    uint16_t *xh = (uint16_t *)calloc((size_t)m * k, 2);
    for (int i = 0; i < m * k; i++) xh[i] = (uint16_t)tc_bf16_rn_host(frand() * 3);
    double *y = (double *)calloc((size_t)m * n, 8);
    uint4 *xs = (uint4 *)calloc((size_t)MP * V, 16);
    int *filled = (int *)calloc((size_t)MP * V, sizeof(int));
    static float acc[NW][TT][8][32][4];
    int conflicts = 0, perm_bad = 0;
    for (int b = 0; b < blocks; b++) {
        const long long u0 = L * b / blocks, u1 = L * (b + 1) / blocks;
        memset(acc, 0, sizeof acc);
        for (long long u = u0; u < u1; u++) {
            const int stage = (int)(u % S), tl = (int)(u / S);
            memset(filled, 0, sizeof(int) * MP * V);
            for (int idx = 0; idx < MP * V; idx++) {
                const int i = idx / V, p = idx % V, kk = stage * 8 * V + 8 * p, d = i * V + tc_swz<QT>(p, i);
                if (d < i * V || d >= (i + 1) * V || filled[d]++) perm_bad++;
                uint4 v = {0, 0, 0, 0};
                if (i < m && kk < k) memcpy(&v, xh + (size_t)i * k + kk, 16);
                xs[d] = v;
            }
            for (int wi = 0; wi < NW; wi++)
                for (int rl = 0; rl < KR; rl++)
                    for (int q = 0; q < Q; q++) {
                        uint4 xb[32][8];
                        for (int nt = 0; nt < NT; nt++) {
                            int bank[32];
                            for (int l = 0; l < 32; l++) {
                                const int gg = l >> 2, t = l & 3, p = (4 * rl + t) * Q + q;
                                const int a = (8 * nt + gg) * V + tc_swz<QT>(p, 8 * nt + gg);
                                xb[l][nt] = xs[a], bank[l] = a % 8;
                            }
                            for (int ph = 0; ph < 4; ph++)
                                for (int l1 = 8 * ph; l1 < 8 * ph + 8; l1++)
                                    for (int l2 = l1 + 1; l2 < 8 * ph + 8; l2++) conflicts += bank[l1] == bank[l2];
                        }
                        for (int jj = 0; jj < 2; jj++) {
                            const int j = 2 * q + jj;
                            uint32_t bb[8][32][2];
                            for (int nt = 0; nt < NT; nt++)
                                for (int l = 0; l < 32; l++) tc_bregs<QT>(xb[l][nt], jj, bb[nt][l][0], bb[nt][l][1]);
                            for (int tt = 0; tt < TT; tt++) {
                                uint32_t a[32][4];
                                for (int l = 0; l < 32; l++) {
                                    const int gg = l >> 2, t = l & 3, base = ((tl * NW + wi) * TT + tt) * 16;
                                    const int ra = base + gg < n ? base + gg : n - 1;
                                    const int rb = base + gg + 8 < n ? base + gg + 8 : n - 1;
                                    const int kc = (stage * KR + rl) * 4 + t;
                                    const bool ok = kc < nch;
                                    uint4 wa = {0, 0, 0, 0}, wb = {0, 0, 0, 0};
                                    if (ok)
                                        memcpy(&wa, T.q + ra * T.rowb + (size_t)kc * 16, 16),
                                            memcpy(&wb, T.q + rb * T.rowb + (size_t)kc * 16, 16);
                                    float sa = 0, sb = 0, za = 0, zb = 0;
                                    if (MODE == 2) {
                                        const int grp = ok ? (kc * V) / g : 0;
                                        sa = T.s[ra * ngr + grp], sb = T.s[rb * ngr + grp];
                                        if (QT == TC_INT4) za = T.z[ra * ngr + grp], zb = T.z[rb * ngr + grp];
                                    }
                                    tc_decode<QT, MODE>(wa, j, sa, za, a[l][0], a[l][2]);
                                    tc_decode<QT, MODE>(wb, j, sb, zb, a[l][1], a[l][3]);
                                }
                                for (int nt = 0; nt < NT; nt++) emu_mma(acc[wi][tt][nt], a, bb[nt]);
                            }
                        }
                    }
            if (u + 1 == u1 || (u + 1) / S != tl) { /* epilogue */
                const bool vec = (n & 1) == 0;
                for (int wi = 0; wi < NW; wi++)
                    for (int tt = 0; tt < TT; tt++) {
                        const int base = ((tl * NW + wi) * TT + tt) * 16;
                        for (int nt = 0; nt < NT; nt++) {
                            float (*c)[4] = acc[wi][tt][nt];
                            float s0[32], s1[32];
                            for (int l = 0; l < 32; l++) tc_pair_send(c[l], l >> 2, s0[l], s1[l]);
                            for (int l = 0; l < 32; l++) {
                                const int gg = l >> 2, t = l & 3;
                                if (vec) {
                                    float v[2][2];
                                    tc_pair_take(c[l], gg, s0[l ^ 4], s1[l ^ 4], v);
                                    const int col = 8 * nt + 2 * t + (gg & 1);
                                    for (int hf = 0; hf < 2; hf++) {
                                        const int row = base + 8 * hf + (gg & ~1);
                                        if (row >= n || col >= m) continue;
                                        float sc0 = 1.f, sc1 = 1.f;
                                        if (MODE == 0 && QT != TC_BF16)
                                            sc0 = T.s[row * ngr], sc1 = T.s[(row + 1) * ngr];
                                        y[(size_t)col * n + row] += v[hf][0] * sc0;
                                        y[(size_t)col * n + row + 1] += v[hf][1] * sc1;
                                    }
                                } else {
                                    for (int hf = 0; hf < 2; hf++) {
                                        const int row = base + gg + 8 * hf, i = 8 * nt + 2 * t;
                                        if (row >= n) continue;
                                        const float sc = MODE == 0 && QT != TC_BF16 ? T.s[row * ngr] : 1.f;
                                        if (i < m) y[(size_t)i * n + row] += c[l][2 * hf] * sc;
                                        if (i + 1 < m) y[(size_t)(i + 1) * n + row] += c[l][2 * hf + 1] * sc;
                                    }
                                }
                            }
                            memset(c, 0, sizeof(float) * 32 * 4);
                        }
                    }
            }
        }
    }
    double worst = 0, mx = 1e-30;
    for (int i = 0; i < m; i++)
        for (int row = 0; row < n; row++) {
            double ref = 0, refx = 0;
            for (int kk = 0; kk < k; kk++) {
                const double xv = tc_bf2f(xh[(size_t)i * k + kk]);
                ref += T.wd[(size_t)row * k + kk] * xv, refx += fabs(T.wd[(size_t)row * k + kk] * xv);
            }
            mx = fmax(mx, refx / sqrt((double)k));
            worst = fmax(worst, fabs(ref - y[(size_t)i * n + row]));
        }
    const double rel = worst / mx, tol = MODE == 2 ? 2e-2 : 1e-4;
    const int bad = !(rel <= tol) || conflicts || perm_bad;
    printf("  %-24s n=%-3d k=%-5d g=%-4d m=%-2d blocks=%-2d: rel err %.2e, bank conflicts %d, bad writes %d %s\n", name,
           n, k, g, m, blocks, rel, conflicts, perm_bad, bad ? "FAIL" : "ok");
    free(T.q), free(T.s), free(T.z), free(T.wd), free(xh), free(y), free(xs), free(filled);
    return bad;
}

int main(void) {
    int bad = 0;
    const int ms[] = {1, 3, 4, 5, 8};
    for (int mi = 0; mi < 5; mi++) {
        int m = ms[mi];
        bad += run_case<TC_BF16, 0>(200, 200, m, 1, "bf16 split");
        bad += run_case<TC_INT8, 0>(208, 208, m, 1, "int8/channel split");
        bad += run_case<TC_FP8, 0>(208, 208, m, 1, "fp8/channel split");
        bad += run_case<TC_INT4, 1>(384, 128, m, 1, "int4/128 exact split");
        bad += run_case<TC_INT4, 1>(512, 256, m, 1, "int4/256 exact split");
    }
    const int mp[] = {1, 7, 9, 16, 24, 33, 64};
    for (int mi = 0; mi < 7; mi++) {
        int m = mp[mi];
        bad += run_case<TC_BF16, 0>(96, 96, m, 0, "bf16 plain");
        bad += run_case<TC_INT8, 0>(160, 160, m, 0, "int8/channel plain");
        bad += run_case<TC_INT8, 2>(160, 32, m, 0, "int8/32 dequant plain");
        bad += run_case<TC_INT8, 2>(160, 16, m, 0, "int8/16 dequant plain");
        bad += run_case<TC_FP8, 0>(160, 160, m, 0, "fp8 plain");
        bad += run_case<TC_INT4, 2>(384, 32, m, 0, "int4/32 dequant plain");
        bad += run_case<TC_INT4, 2>(384, 128, m, 0, "int4/128 dequant plain");
    }
    /* staged kernel (9..64 rows): partial tiles (n not a multiple of 256, odd n: scalar atomics), k not a multiple
     * of the stage, tiles split among blocks, a block over several tiles */
    const int ms2[] = {9, 17, 32, 64};
    for (int mi = 0; mi < 4; mi++) {
        int m = ms2[mi];
        bad += run_stage_case<TC_INT8, 0>(40, 320, 320, m, 3, "stage int8/channel");
        bad += run_stage_case<TC_INT8, 0>(37, 192, 192, m, 2, "stage int8/channel odd n");
        bad += run_stage_case<TC_INT8, 2>(40, 320, 32, m, 3, "stage int8/32");
        bad += run_stage_case<TC_INT8, 2>(40, 176, 16, m, 1, "stage int8/16");
        bad += run_stage_case<TC_FP8, 0>(24, 320, 320, m, 2, "stage fp8/channel");
        bad += run_stage_case<TC_INT4, 2>(40, 640, 128, m, 3, "stage int4/128");
        bad += run_stage_case<TC_INT4, 2>(21, 416, 32, m, 2, "stage int4/32 odd n");
    }
    bad += run_stage_case<TC_INT4, 2>(300, 512, 128, 20, 5, "stage int4 two tiles");
    bad += run_stage_case<TC_INT8, 0>(300, 256, 256, 40, 1, "stage int8 two tiles");
    printf("%s\n", bad ? "FAILED" : "all layouts agree");
    return bad ? 1 : 0;
}
