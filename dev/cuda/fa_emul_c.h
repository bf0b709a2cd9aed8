/* What the flash kernels' host emulations (fa_tc_emul.cc, fa_bf_emul.cc) share: the C (accumulator) layout of the PTX
 * m16n8 fragments (lane l = 4 g + t holds c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1) of an n-tile), P's
 * rows gathered from it, and the float64 check of one warp's O = P V. */
#ifndef G3_DEV_FA_EMUL_C_H
#define G3_DEV_FA_EMUL_C_H
#include <cmath>

static int c_row(int l, int i) { return (l >> 2) + 8 * (i >> 1); }
static int c_col(int l, int i) { return 2 * (l & 3) + (i & 1); }

/* P[r][key] of one warp's 8 key groups s[j] (keys 8 j ..) in the C layout */
static void c_to_rows(float s[8][32][4], float P[16][64]) {
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) P[c_row(l, i)][8 * j + c_col(l, i)] = s[j][l][i];
}

/* The largest |O - P V| over the warp's NJ output tiles (dims 8 j ..) against float64, divided by sum |p v| when rel */
static double o_max_err(float P[16][64], const float *Vs, int VS, int NJ, float (*oacc)[32][4], bool rel) {
    double e = 0;
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < NJ; j++)
            for (int i = 0; i < 4; i++) {
                const int r = c_row(l, i), d = 8 * j + c_col(l, i);
                double ref = 0, mag = 0;
                for (int k = 0; k < 64; k++) {
                    const double pv = (double)P[r][k] * Vs[k * VS + d];
                    ref += pv, mag += fabs(pv);
                }
                e = fmax(e, fabs(ref - oacc[j][l][i]) / (rel ? mag : 1.0));
            }
    return e;
}
#endif
