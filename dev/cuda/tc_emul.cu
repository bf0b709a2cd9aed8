/* Host-only check of the tensor-core kernels' register layouts (src/backend/cuda/tc_frag.cuh) without a GPU: one
 * warp of k_tc is emulated lane by lane for a 16-row tile — the same tc_decode / tc_bregs calls on the same
 * resident formats, an mma.sync m16n8k16 emulated from the PTX fragment tables, the same epilogue mapping — and the
 * result is compared with a float64 dot product of the dequantized weights and the (hi + lo) activations.
 *
 *   nvcc -std=c++17 -I include -I src dev/cuda/tc_emul.cu -o /tmp/tc_emul && /tmp/tc_emul
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

static void make_tile(tile *T, int qt, int k, int g) {
    T->qt = qt, T->k = k, T->g = g;
    T->rowb = qt == TC_BF16 ? (size_t)k * 2 : qt == TC_INT4 ? (size_t)k / 2 : (size_t)k;
    T->q = (uint8_t *)calloc(16, T->rowb);
    T->s = (float *)calloc(16 * (k / g), 4), T->z = (float *)calloc(16 * (k / g), 4);
    T->wd = (double *)calloc(16 * (size_t)k, 8);
    for (int r = 0; r < 16; r++)
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
    printf("%s\n", bad ? "FAILED" : "all layouts agree");
    return bad ? 1 : 0;
}
