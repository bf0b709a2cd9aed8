/* One forward of the CUDA backend as a fixed sequence of launches (recorded into a CUDA graph per row-count bucket,
 * or run eagerly): embedding, per layer QKV product -> QK-norm/RoPE/cache write -> attention -> O product -> add-norm
 * -> gate/up + GeGLU -> down -> add-norm, then the head. Which kernel serves each step depends on the rows (see
 * matmul.cu and docs/CUDA.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attention_o.cuh"
#include "backend/cuda/cuda_backend.cuh"

int g3cb_n_splits(const g3_backend *b, int m) { /* ~4 blocks per SM of keys split for decode */
    int want = (4 * b->n_sm + m * b->c.n_kv_heads - 1) / (m * b->c.n_kv_heads);
    return want < 1 ? 1 : want > 64 ? 64 : want;
}

/* ---- the forward ------------------------------------------------------------------------------------------------- */
/* Decode of 1-2 rows with every product on the persistent dp4a kernel (qgemv_p.cu) can take the add-norms into the
 * qkv and gate/up products' prologues (g3c_qgemv_pn): two launches less per layer. By default ($G3_CUDA_PNORM unset)
 * at one row only. Measured on the H200 (session 21, tok/s, prologue on -> off): two rows 27B int4 274 -> 287, int8
 * 218 -> 224 (219-221 -> 230 with the ring: run 05), 4B int4 962-976 -> 1006-1014, 1B int8 1635-1647 -> 1696-1734;
 * one row 27B int4 167 -> 165, int8 with the ring 124 -> 122 (runs 01, 04, 05). */
static int pnorm_ok(const g3_backend *b, const g3c_mm_ctx *mc, int m) {
    const int mode = g3c_pnorm_mode();
    if (m > 2 || !mode || (mode < 0 && m > 1)) return 0; /* auto: one row */
    for (int l = 0; l < b->c.n_layers; l++) {
        const layer_dev *L = &b->L[l];
        if (g3c_mm_path(mc, &L->qkv, m) != G3C_PATH_QGEMV || g3c_mm_path(mc, &L->o, m) != G3C_PATH_QGEMV ||
            g3c_mm_path(mc, &L->gu, m) != G3C_PATH_QGEMV || g3c_mm_path(mc, &L->down, m) != G3C_PATH_QGEMV ||
            !g3c_qgemv_pn_supported(&L->qkv, m, 0) || !g3c_qgemv_pn_supported(&L->gu, m, 1))
            return 0;
        if (L->v.q && (g3c_mm_path(mc, &L->v, m) != G3C_PATH_QGEMV || !g3c_qgemv_pn_supported(&L->v, m, 0))) return 0;
    }
    return 1;
}

/* Issues every launch of one forward over m rows (padded rows have useq -1) and n_out head rows; no host sync. */
cudaError_t g3cb_record(g3_backend *b, int m, int n_out) {
    const g3_config *c = &b->c;
    const int H = c->hidden, D = c->head_dim, F = c->ffn, V = c->vocab;
    const int32_t *P = b->d_par;
    g3c_rows rows = {P, P + b->R, P + 2 * b->R, P + off_bt(b), b->bc.max_blocks_per_seq};
    const int32_t *out_rows = P + 3 * b->R;
    const int split = b->split;
    g3c_mm_ctx mc = {b->cub, b->st, b->wscratch, split, b->n_sm, b->tcnt, b->tcnt_n, b->q8, b->q8_bytes, b->distinct};
    int ny, fused;
    /* prefill with every product on cuBLAS (beta = 0 overwrites y): the row kernels leave y as it is and skip the
     * float32 copies only GEMV paths read; y is cleared once after the last layer (opt-in: $G3_CUDA_NOZERO=1) */
    int rf = m > 64 && g3c_nozero_enabled() ? G3C_KEEP_Y | G3C_NO_F32 : 0;
    for (int l = 0; l < c->n_layers && rf; l++) {
        const layer_dev *L = &b->L[l];
        if (g3c_mm_path(&mc, &L->qkv, m) != G3C_PATH_CUBLAS || g3c_mm_path(&mc, &L->o, m) != G3C_PATH_CUBLAS ||
            g3c_mm_path(&mc, &L->gu, m) != G3C_PATH_CUBLAS || g3c_mm_path(&mc, &L->down, m) != G3C_PATH_CUBLAS ||
            (L->v.q && g3c_mm_path(&mc, &L->v, m) != G3C_PATH_CUBLAS))
            rf = 0;
    }
    cudaError_t e;
    /* decode-sized steps: fused QK-norm + attention (rows of distinct sequences only) and the decode add-norm */
    int vsplit = 0; /* some layer's v has a product of its own (layer_dev.v): not in the fused QK-norm + attention */
    for (int l = 0; l < c->n_layers; l++) vsplit |= b->L[l].v.q != NULL;
    const int dfuse = m <= 64 && b->distinct && g3c_dfuse_enabled() && !vsplit;
    cudaError_t (*add_norm)(float *, float *, int, const float *, const float *, float, int, int, float *,
                            __nv_bfloat16 *, int, cudaStream_t) =
        m <= 64 && g3c_dnorm_enabled() ? g3c_add_norm_dec : g3c_add_norm;
    /* add-norms in the products: the residual alternates between x (after the qkv products) and x2 (after gate/up);
     * qkv writes yq (zeroed by QK-norm), o yo (zeroed by the next qkv product), down yd (zeroed by the next gate/up
     * product, or by the final add-norm) */
    const int pn = !rf && !b->fa_step && !dfuse && pnorm_ok(b, &mc, m);
    /* one row with the prologues: the gate/up and down products in one launch where $G3_CUDA_QPGD=1 (qgemv_p.cu's
     * k_qgemv_gd; not the default until measured on a GPU) */
    const int gdf = pn && m == 1 && b->gdcnt && g3c_qgemv_gd_enabled();
    int gd_prev = 0; /* the previous layer's gate/up and down products ran as one launch */
    /* 9..64 rows (from g3c_tq_small_min() rows where the int8 tensor cores of tc_q8.cu / tc_q8g.cu take fewer): the
     * decode add-norms and GeGLU also quantize their outputs for the int8 tensor-core products that read them (one
     * launch less per product); tq_* below say which products take them, per layer */
    const int tq_min = g3c_tq_small_min() < 9 ? g3c_tq_small_min() : 9;
    const int tqp = b->tq8 && m >= tq_min && m <= 64 && !rf && H % 128 == 0 && F % 128 == 0 &&
                    add_norm == g3c_add_norm_dec;
    const int tq_k = H > F ? H : F; /* the widest activation row b->tq8 holds (cuda_backend.cu) */
    int8_t *tq_x = b->tq8;
    float2 *tq_d = (float2 *)(b->tq8 + (size_t)128 * tq_k); /* past [64][k] bf16 (g3c_tq_q8_bytes) */
    /* the down product's activations where the gate/up product quantizes them (its own inputs are still in tq8) */
    int8_t *tq_xg = b->tq8g;
    float2 *tq_dg = b->tq8g ? (float2 *)(b->tq8g + (size_t)128 * tq_k) : NULL;
    int tq_next = 0; /* the next qkv product reads activations the last add-norm quantized */
    const int NQKV = (c->n_heads + 2 * c->n_kv_heads) * D;
    float *x2 = b->pnb, *yq = x2 + 2 * H, *yo = yq + 2 * NQKV, *yd = yo + 2 * H;
/* a statement of its own (do/while): `if (x) RUN(a); else RUN(b);` must not bind the else to RUN's own if */
#define RUN(call)                                                                                                      \
    do {                                                                                                               \
        if ((e = (call)) != cudaSuccess) return e;                                                                     \
    } while (0)
#define PROF(lbl) prof_mark(b, lbl)
    PROF("start");
    RUN(g3c_embed_norm(&b->embed, rows.token, c->embed_scale, b->L[0].attn_norm, c->rms_eps, m, H, b->x, b->xn, b->xh,
                       split, b->st));
    if (b->fa_step) {
        RUN(g3c_fa_plan(&rows, m, c->n_heads, c->n_kv_heads, b->fa_useq, b->st));
    }
    PROF("embed + norm");
    for (int l = 0; l < c->n_layers; l++) {
        const layer_dev *L = &b->L[l];
        int gg = 0; /* the gate/up product writes the down product's activations (g3c_wg_mm_geglu) */
        int gd = 0; /* the down product ran in the gate/up product's launch (g3c_qgemv_gd) */
        const int xi_late = gd_prev; /* x2 from the launch right before this layer's qkv product */
        float *yqkv = pn ? yq : b->y;
        /* v in a product of its own (layer_dev.v): q and k as [ny][m][NQK], then v as [nyv][m][NK] */
        const int NQK = L->qkv.n, NK = c->n_kv_heads * D;
        int nyv = 0;
        if (pn) { /* layer 0: the embedding's xn as it is; then x2 + the previous down product -> x, xn */
            g3c_qp_pre pq;
            memset(&pq, 0, sizeof pq);
            pq.xi = l ? x2 : b->xn, pq.y = l ? yd : NULL, pq.xo = b->x, pq.eps = c->rms_eps;
            pq.w1 = l ? b->L[l - 1].post_ffn : NULL, pq.w2 = L->attn_norm, pq.zero = yo, pq.zero_n = m * H;
            pq.xi_late = xi_late; /* x2 written by the previous launch (the fused gate/up + down) */
            RUN(g3c_qgemv_pn(&L->qkv, &pq, m, yq, NQK, 0, b->st));
            ny = 1;
            if (L->v.q) { /* the same prologue again (its x is stored twice, the same values), no zeroing */
                pq.zero = NULL, pq.zero_n = 0;
                RUN(g3c_qgemv_pn(&L->v, &pq, m, yq + (size_t)m * NQK, NK, 0, b->st));
                nyv = 1;
            }
        } else if (tq_next) {
            RUN(g3c_tq_mm_pre(&L->qkv, tq_x, tq_d, m, b->y, b->n_sm, b->st));
            ny = 1;
        } else {
            RUN(g3c_mm(&mc, &L->qkv, b->xn, b->xh, m, b->y, &ny, NULL, NULL, 0, &fused));
            if (L->v.q) RUN(g3c_mm(&mc, &L->v, b->xn, b->xh, m, b->y + (size_t)ny * m * NQK, &nyv, NULL, NULL, 0, &fused));
        }
        tq_next = 0;
        PROF("qkv product");
        g3c_attn_args a;
        a.rows = rows, a.m = m, a.NH = c->n_heads, a.NKV = c->n_kv_heads, a.D = D, a.kind = L->kind;
        a.layer_in_kind = L->index_in_kind, a.n_layers_kind = b->n_kind[L->kind], a.kv_block = b->bc.kv_block;
        a.window = c->sliding_window, a.scale = 1.f / sqrtf(c->query_pre_attn_scalar), a.softcap = c->attn_softcap;
        a.eps = c->rms_eps, a.inv_freq = b->inv_freq + L->kind * (D / 2), a.pool = b->pool[L->kind];
        a.kv16 = b->kv16;
        a.n_splits = g3cb_n_splits(b, m), a.min_keys = b->attn_min_keys;
        a.tq_x = NULL, a.tq_d = NULL, a.tq_il = 0, a.nyv = nyv;
        /* 9..64 rows: the decode attention also quantizes o for the o product (no quantization launch; o and its
         * bf16 copies are not written) */
        const int tq_o = tqp && !b->fa_step && c->n_heads * D <= tq_k && g3c_tq_taken(&L->o, m) && g3c_attn_tq_ok(&a);
        if (tq_o) a.tq_x = tq_x, a.tq_d = tq_d, a.tq_il = g3c_tq_order(&L->o, m);
        /* one row: the o product inside the attention launch, its weights streaming during QK-norm and attention
         * (attn_oproj.cuh), its sums added into yo, which the qkv product's prologue zeroed */
        const int aof = pn && m == 1 && !dfuse && !b->fa_step && !tq_o && g3c_attention_o_ok(&a, &L->o);
        if (dfuse) { /* decode: one launch (attention.cu) */
            RUN(g3c_attention_fused(&a, yqkv, ny, L->q_norm, L->k_norm, b->part, b->acnt, b->o, b->oh, split, b->st));
            PROF("qk-norm + attention (fused)");
        } else {
            RUN(g3c_qkv_post_rows_f(&a, yqkv, ny, L->q_norm, L->k_norm, b->q, rf, b->st)); /* qkv_post below 16 */
            PROF("qk-norm, rope, cache write");
            if (b->fa_step) {
                RUN(g3c_attention_prefill(&a, b->q, b->part, b->acnt, b->fa_useq, b->fa_step == 2, b->o, b->oh, split,
                                          b->st));
            } else if (aof) {
                RUN(g3c_attention_o(&a, b->q, &L->o, yo, b->st));
            } else {
                RUN(g3c_attention(&a, b->q, b->part, b->acnt, b->o, b->oh, split, b->st));
            }
            PROF(aof ? "attention + o product" : "attention");
        }
        if (aof) {
            ny = 1;
        } else if (tq_o) {
            RUN(g3c_tq_mm_pre(&L->o, tq_x, tq_d, m, b->y, b->n_sm, b->st));
            ny = 1;
        } else {
            RUN(g3c_mm(&mc, &L->o, b->o, b->oh, m, pn ? yo : b->y, &ny, NULL, NULL, 0, &fused));
        }
        if (!aof) PROF("o product");
        if (pn) { /* x + the o product -> x2, xn: GeGLU */
            g3c_qp_pre pq;
            memset(&pq, 0, sizeof pq);
            pq.xi = b->x, pq.y = yo, pq.xo = x2, pq.w1 = L->post_attn, pq.w2 = L->pre_ffn, pq.eps = c->rms_eps;
            pq.zero = yd, pq.zero_n = m * H;
            if ((gd = gdf && g3c_qgemv_gd_ok(&L->gu, &L->down, m))) /* it writes x2, which the next qkv product reads */
                RUN(g3c_qgemv_gd(&L->gu, &pq, &L->down, m, b->a, F, yd, H, b->gdcnt, b->st));
            else RUN(g3c_qgemv_pn(&L->gu, &pq, m, b->a, F, 1, b->st));
            fused = 1;
        } else {
            const int tq_gu = tqp && g3c_tq_taken(&L->gu, m);
            /* 33..64 rows where the gate/up product takes whole channel tiles (27B): GeGLU and the down product's
             * quantization in its last step (g3c_wg_mm_geglu), no GeGLU launch */
            gg = tq_gu && tq_xg && g3c_tq_taken(&L->down, m) &&
                 g3c_wg_geglu_ok(&L->gu, m, g3c_tq_order(&L->down, m), b->n_sm);
            if (rf) RUN(g3c_add_norm_f(b->x, b->y, ny, L->post_attn, L->pre_ffn, c->rms_eps, m, H, b->xn, b->xh,
                                       split, rf, b->st));
            else if (tq_gu) /* the gate/up product reads only the quantized copy: no xn / xh */
                RUN(g3c_add_norm_dec_tq(b->x, b->y, ny, L->post_attn, L->pre_ffn, c->rms_eps, m, H, NULL, NULL, split,
                                        tq_x, tq_d, g3c_tq_order(&L->gu, m), b->st));
            else RUN(add_norm(b->x, b->y, ny, L->post_attn, L->pre_ffn, c->rms_eps, m, H, b->xn, b->xh, split, b->st));
            PROF("add + norms");
            if (gg) {
                g3c_wg_gg gp = {b->a, b->tcnt, tq_xg, tq_dg, g3c_tq_order(&L->down, m), g3c_gelu_tanhf()};
                RUN(g3c_wg_mm_geglu(&L->gu, tq_x, tq_d, m, &gp, b->n_sm, b->st));
                ny = 1, fused = 0;
            } else if (tq_gu) {
                RUN(g3c_tq_mm_pre(&L->gu, tq_x, tq_d, m, b->y, b->n_sm, b->st));
                ny = 1, fused = 0;
            } else {
                RUN(g3c_mm(&mc, &L->gu, b->xn, b->xh, m, b->y, &ny, b->a, b->ah, 1, &fused));
            }
        }
        PROF(gd ? "gate/up + down products" : "gate/up product");
        const int tq_dn = gg || (tqp && !fused && ny <= 2 && g3c_tq_taken(&L->down, m));
        /* the down product reads only the quantized copy: no float32 / bf16 copies (11 MB a layer at 27B, 64 rows) */
        if (tq_dn) {
            if (!gg) RUN(g3c_geglu_tq(b->y, ny, m, F, NULL, NULL, split, tq_x, tq_d, g3c_tq_order(&L->down, m), b->st));
        } else if (!fused) RUN(g3c_geglu_f(b->y, ny, m, F, b->a, b->ah, split, rf, b->st));
        else if (fused == 1 && g3c_mm_path(&mc, &L->down, m) != G3C_PATH_GEMV &&
                 g3c_mm_path(&mc, &L->down, m) != G3C_PATH_QGEMV)
            RUN(g3c_to_bf16(b->a, m, F, b->ah, split, b->st));
        PROF("geglu");
        if (gd) {
            ny = 1;
        } else if (tq_dn) {
            RUN(g3c_tq_mm_pre(&L->down, gg ? tq_xg : tq_x, gg ? tq_dg : tq_d, m, b->y, b->n_sm, b->st));
            ny = 1;
        } else {
            RUN(g3c_mm(&mc, &L->down, b->a, b->ah, m, pn ? yd : b->y, &ny, NULL, NULL, 0, &fused));
        }
        if (!gd) PROF("down product");
        gd_prev = gd;
        const float *next = l + 1 < c->n_layers ? b->L[l + 1].attn_norm : b->final_norm;
        if (pn) { /* the next qkv product adds and normalizes; after the last layer, the head's xn */
            if (l + 1 == c->n_layers) {
                RUN(add_norm(x2, yd, ny, L->post_ffn, next, c->rms_eps, m, H, b->xn, b->xh, split, b->st));
                PROF("add + norms");
            }
        } else if (rf) /* the head reads the last xn */
            RUN(g3c_add_norm_f(b->x, b->y, ny, L->post_ffn, next, c->rms_eps, m, H, b->xn, b->xh, split,
                               l + 1 < c->n_layers ? rf : G3C_KEEP_Y, b->st));
        else if ((tq_next = tqp && l + 1 < c->n_layers && !b->L[l + 1].v.q && g3c_tq_taken(&b->L[l + 1].qkv, m)))
            RUN(g3c_add_norm_dec_tq(b->x, b->y, ny, L->post_ffn, next, c->rms_eps, m, H, NULL, NULL, split, tq_x, tq_d,
                                    g3c_tq_order(&b->L[l + 1].qkv, m), b->st)); /* the next qkv reads only the copy */
        else RUN(add_norm(b->x, b->y, ny, L->post_ffn, next, c->rms_eps, m, H, b->xn, b->xh, split, b->st));
        PROF("add + norms");
    }
    if (rf) { /* [ny][m][widest product] */
        size_t wmax = (size_t)(c->n_heads + 2 * c->n_kv_heads) * D;
        if ((size_t)2 * F > wmax) wmax = (size_t)2 * F;
        if ((size_t)H > wmax) wmax = (size_t)H;
        RUN(cudaMemsetAsync(b->y, 0, (split ? 2 : 1) * (size_t)m * wmax * sizeof(float), b->st));
        PROF("clear y");
    }
    for (int c0 = 0; c0 < n_out; c0 += b->HC) {
        int hc = n_out - c0 < b->HC ? n_out - c0 : b->HC;
        RUN(g3c_gather_rows(b->xn, out_rows + c0, hc, H, b->hx, b->st));
        const int hp = g3c_mm_path(&mc, &b->embed, hc);
        if (hp != G3C_PATH_GEMV && hp != G3C_PATH_QGEMV) RUN(g3c_to_bf16(b->hx, hc, H, b->hxh, split, b->st));
        RUN(g3c_mm(&mc, &b->embed, b->hx, b->hxh, hc, b->logy, &ny, NULL, NULL, 0, &fused));
        RUN(g3c_finish_logits(b->logy, ny, hc, V, c->final_softcap, b->logits + (size_t)c0 * V, b->st));
    }
    PROF("head");
#undef PROF
#undef RUN
    return cudaSuccess;
}
