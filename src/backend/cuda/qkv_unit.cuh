/* QK-norm + RoPE + cache write of one (row, head) of the qkv product's output by one warp, in two parts: what does not
 * depend on the product (the row's position, sequence and cache slot, uploaded before the step; the norm weights and
 * the rotation's cosines and sines: qkv_unit_prep) and what does (the loads of y, their zeroing, the norm, the
 * rotation and the writes: qkv_unit_run). Used by the many-row launch (attention_prefill.cu's k_qkv_rows, prep before
 * its launch wait) and by the tail of the one-row qkv product (qgemv_p.cu, G3C_QN: the last block to finish runs every
 * unit, so the QK-norm needs no launch of its own). Pairs (i, i + D/2) per lane, i = lane + 32t, t < T; the same
 * arithmetic as k_qkv_post (attention.cu). */
#pragma once

#include "backend/cuda/cuda_common.cuh"

template <int T, typename KT> struct qkv_unit {
    bool live, put, isv; /* put: q always written; k / v where the row has a cache slot */
    int r, hh;
    float *dst; /* q: its row in qout */
    KT *kd;     /* k / v: the cache row */
    float w0[T], w1[T], cs[T], sn[T];
};

/* unit = r * (NH + 2 NKV) + hh; units past a.m rows are not live */
template <int T, typename KT>
static __device__ __forceinline__ void qkv_unit_prep(qkv_unit<T, KT> &s, const g3c_attn_args &a, const float *qn,
                                                     const float *kn, float *qout, int unit, int lane) {
    const int D = a.D, half = D / 2, NHT = a.NH + 2 * a.NKV;
    s.live = unit < a.m * NHT;
    s.r = s.live ? unit / NHT : 0, s.hh = unit - s.r * NHT;
    const int u = s.live ? a.rows.useq[s.r] : -1, p = s.live ? a.rows.pos[s.r] : 0;
    s.isv = s.hh >= a.NH + a.NKV;
    s.dst = NULL, s.kd = NULL;
    s.put = s.hh < a.NH;
    if (s.live && s.hh >= a.NH && u >= 0) {
        const int h = s.hh - a.NH - s.isv * a.NKV;
        const int blk = a.rows.bt[((size_t)u * 2 + a.kind) * a.rows.mbps + p / a.kv_block];
        if (blk >= 0) {
            const size_t off = (((size_t)blk * a.n_layers_kind + a.layer_in_kind) * 2 + s.isv) * a.NKV;
            s.kd = (KT *)a.pool + ((off + h) * a.kv_block + p % a.kv_block) * D;
            s.put = true;
        }
    } else if (s.live && s.hh < a.NH) {
        s.dst = qout + (size_t)s.r * a.NH * D + (size_t)s.hh * D;
    }
    const float *nw = s.hh < a.NH ? qn : kn;
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        s.w0[t] = s.w1[t] = s.cs[t] = s.sn[t] = 0.f;
        if (s.live && s.put && !s.isv && i < half) {
            s.w0[t] = nw[i], s.w1[t] = nw[i + half];
            const float ang = (float)p * a.inv_freq[i];
            s.cs[t] = cosf(ang), s.sn[t] = sinf(ang);
        }
    }
}

/* y: [ny][m][...] as g3c_qkv_at says, read through L2 (the product's atomics wrote it there); every slice of the head
 * is loaded before any is zeroed (flags & G3C_KEEP_Y: not zeroed) */
template <int T, typename KT>
static __device__ __forceinline__ void qkv_unit_run(const qkv_unit<T, KT> &s, const g3c_attn_args &a, float *y,
                                                    int ny, int flags, int lane) {
    if (!s.live) return;
    const int D = a.D, half = D / 2;
    const int np = g3c_qkv_slices(a, ny, s.hh); /* <= 2 */
    float *y0 = y + g3c_qkv_at(a, ny, 0, s.r, s.hh), *y1 = np > 1 ? y + g3c_qkv_at(a, ny, 1, s.r, s.hh) : NULL;
    float v0[T], v1[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        v0[t] = v1[t] = 0.f;
        if (i < half) {
            v0[t] = __ldcg(y0 + i), v1[t] = __ldcg(y0 + i + half);
            if (y1) v0[t] += __ldcg(y1 + i), v1[t] += __ldcg(y1 + i + half);
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        if (i < half && !(flags & G3C_KEEP_Y)) {
            y0[i] = 0.f, y0[i + half] = 0.f;
            if (y1) y1[i] = 0.f, y1[i + half] = 0.f;
        }
    }
    if (!s.put) return; /* k / v of a padding row, or of a row without a cache slot */
    if (s.isv) {
#pragma unroll
        for (int t = 0; t < T; t++) {
            const int i = lane + 32 * t;
            if (i < half) g3c_kv_put(s.kd + i, v0[t]), g3c_kv_put(s.kd + i + half, v1[t]);
        }
        return;
    }
    float ss = 0.f;
#pragma unroll
    for (int t = 0; t < T; t++) ss += v0[t] * v0[t] + v1[t] * v1[t];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.f / sqrtf(ss / (float)D + a.eps);
#pragma unroll
    for (int t = 0; t < T; t++) {
        const int i = lane + 32 * t;
        if (i < half) {
            const float x0 = v0[t] * inv * s.w0[t], x1 = v1[t] * inv * s.w1[t];
            const float r0 = x0 * s.cs[t] - x1 * s.sn[t], r1 = x1 * s.cs[t] + x0 * s.sn[t];
            if (s.kd) g3c_kv_put(s.kd + i, r0), g3c_kv_put(s.kd + i + half, r1);
            else s.dst[i] = r0, s.dst[i + half] = r1;
        }
    }
}
