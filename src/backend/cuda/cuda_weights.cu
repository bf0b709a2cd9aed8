/* The CUDA backend's resident weights: each matrix converted at load into its resident format (bf16, int8, int4,
 * fp8; GGUF blocks kept or repacked) with q/k/v stacked and gate/up interleaved by rows, random weights generated on
 * the device for benchmarks, and the norm vectors (as 1 + w) in one buffer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.cuh"

void *g3cb_dalloc(size_t bytes, int *ok) {
    void *p = NULL;
    if (!*ok) return NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) /* reported by ok, not as the runtime's last error */
        *ok = 0, p = NULL, (void)cudaGetLastError();
    return p;
}

/* ---- weights ---------------------------------------------------------------------------------------------------- */
typedef struct src_mat { const g3_weight *w; int n; } src_mat; /* w NULL: random */

/* n elements of elem bytes and G3C_DMAT_SPAD more, zeroed: the scale-type arrays, which the one-row kernel loads a
 * step's worth past the end of a row from without a predicate */
static g3_status alloc_padded(void **p, size_t n, size_t elem, const char *what, g3_error *err) {
    G3C_CK(cudaMalloc(p, (n + G3C_DMAT_SPAD) * elem), what);
    G3C_CK(cudaMemset((uint8_t *)*p + n * elem, 0, G3C_DMAT_SPAD * elem), what);
    return G3_OK;
}

g3_status g3cb_alloc_dmat(g3_dmat *d, int qt, int n, int k, int g, g3_error *err) {
    memset(d, 0, sizeof *d);
    d->qt = qt, d->n = n, d->k = k, d->g = g;
    size_t nk = (size_t)n * k, ng = (size_t)n * (k / g);
    size_t qb = qt == G3Q_BF16 ? nk * 2 : qt == G3Q_INT4 ? nk / 2 : nk;
    G3C_CK(cudaMalloc(&d->q, qb), "weight allocation");
    if (qt != G3Q_BF16) G3_TRY(alloc_padded((void **)&d->s, ng, 4, "scale allocation", err));
    if (qt == G3Q_INT4) G3_TRY(alloc_padded((void **)&d->z, ng, 4, "offset allocation", err));
    d->bytes = g3c_dmat_bytes(qt, n, k, g);
    return G3_OK;
}

int g3cb_kcodes_wanted(const g3_dmat *d, uint32_t t) {
    const char *e = getenv("G3_CUDA_Q4KC");
    if ((e && !strcmp(e, "0")) || d->g != 32) return 0;
    return (d->qt == G3Q_INT4 && ((t == G3_DTYPE_Q4_K && d->k % 256 == 0) || t == G3_DTYPE_Q4_0)) ||
           (d->qt == G3Q_INT8 && (t == G3_DTYPE_Q8_0 || t == G3_DTYPE_Q5_0 || t == G3_DTYPE_Q5_1 ||
                                  (t == G3_DTYPE_Q5_K && d->k % 256 == 0)));
}

g3_status g3cb_alloc_kcodes(g3_dmat *d, uint32_t t, g3_error *err) {
    if (!g3cb_kcodes_wanted(d, t)) return G3_OK;
    const size_t ng = (size_t)d->n * (d->k / 32);
    G3_TRY(alloc_padded((void **)&d->kc, ng, 2, "scale code allocation", err));
    d->bytes += ng * 2;
    if (t == G3_DTYPE_Q4_K) {
        G3_TRY(alloc_padded((void **)&d->kd, ng / 8, 4, "scale code allocation", err));
        d->bytes += ng / 8 * 4;
    }
    return G3_OK;
}

/* On by default (measured faster, session 45); $G3_CUDA_Q4SZ=0 at create: not built */
int g3cb_q4sz_wanted(const g3_dmat *d, uint32_t t) {
    const char *e = getenv("G3_CUDA_Q4SZ");
    return !(e && !strcmp(e, "0")) && d->qt == G3Q_INT4 && d->g == 128 &&
           (t == G3_DTYPE_F32 || t == G3_DTYPE_F16 || t == G3_DTYPE_BF16);
}

g3_status g3cb_alloc_sz(g3_dmat *d, uint32_t t, g3_error *err) {
    if (!g3cb_q4sz_wanted(d, t)) return G3_OK;
    const size_t ng = (size_t)d->n * (d->k / 128);
    G3_TRY(alloc_padded((void **)&d->sz, ng, 4, "scale pair allocation", err));
    d->bytes += ng * 4;
    return G3_OK;
}

void g3cb_free_dmat(g3_dmat *d) {
    cudaFree(d->q), cudaFree(d->s), cudaFree(d->z), cudaFree(d->kc), cudaFree(d->kd), cudaFree(d->sz);
    memset(d, 0, sizeof *d);
}

/* $G3_CUDA_VSPLIT=0: a v of another format than q and k makes the whole qkv matrix bf16, as before (comparisons) */
static int vsplit_off(void) {
    const char *e = getenv("G3_CUDA_VSPLIT");
    return e && !strcmp(e, "0");
}

/* The resident format a source takes (load_mat's choice for one source); -1 where none. */
static int src_format(const g3_backend *b, const g3_weight *w, int k, int *g) {
    const uint32_t t = w ? w->type : (uint32_t)G3_DTYPE_BF16;
    int q = g3c_target_format(t, b->qt_req, k, g);
    return q >= 0 ? q : g3c_target_format(t, G3Q_BF16, k, g);
}

/* Builds one resident matrix from nsrc sources stacked by rows (interleave: row i of source j -> i*nsrc + j). */
static g3_status load_mat(g3_backend *b, g3_dmat *d, const src_mat *src, int nsrc, int k, int interleave,
                          void *stage, size_t stage_bytes, uint64_t seed, const char *what, g3_error *err) {
    int n = 0, qt = -1, g = 0, mixed = 0, same = 1; /* same: every source a file tensor of one type */
    for (int j = 0; j < nsrc; j++) {
        uint32_t t = src[j].w ? src[j].w->type : (uint32_t)G3_DTYPE_BF16;
        if (src[j].w && (src[j].w->k != k || src[j].w->n != src[j].n || !src[j].w->data))
            return g3c_fail(err, G3_ERR_FORMAT, "cuda: %s: source %d is [%lld][%lld], expected [%d][%d]", what, j,
                            (long long)src[j].w->n, (long long)src[j].w->k, src[j].n, k);
        int gj, qj = src_format(b, src[j].w, k, &gj);
        if (qj < 0)
            return g3c_fail(err, G3_ERR_UNSUPPORTED, "cuda: %s: tensor type %u with %d values per row is not supported",
                            what, t, k);
        if (j == 0) qt = qj, g = gj;
        else if (qj != qt || gj != g) mixed = 1;
        same &= src[j].w && t == src[0].w->type;
        n += src[j].n;
    }
    if (mixed) qt = G3Q_BF16, g = k; /* e.g. Q4_K q/k with Q6_K v, where v is not split off (layer_dev.v) */
    G3_TRY(g3cb_alloc_dmat(d, qt, n, k, g, err));
    if (same) G3_TRY(g3cb_alloc_kcodes(d, src[0].w->type, err)); /* the file's scale codes (g3_dmat.kc) */
    if (same || !src[0].w) /* float sources (random weights: bf16) quantized to int4 here: the half2 pairs */
        G3_TRY(g3cb_alloc_sz(d, src[0].w ? src[0].w->type : (uint32_t)G3_DTYPE_BF16, err));
    int row0 = 0;
    for (int j = 0; j < nsrc; j++) {
        uint32_t t = src[j].w ? src[j].w->type : (uint32_t)G3_DTYPE_BF16;
        size_t rb = g3c_src_row_bytes(t, k);
        if (!rb) return g3c_fail(err, G3_ERR_UNSUPPORTED, "cuda: %s: bad row size", what);
        int per = (int)(stage_bytes / rb);
        if (per < 1) return g3c_fail(err, G3_ERR_NOMEM, "cuda: %s: row of %zu bytes exceeds the staging buffer", what, rb);
        for (int r = 0; r < src[j].n; r += per) {
            int nr = src[j].n - r < per ? src[j].n - r : per;
            if (src[j].w) {
                G3C_CK(cudaMemcpyAsync(stage, (const uint8_t *)src[j].w->data + (size_t)r * rb, (size_t)nr * rb,
                                       cudaMemcpyHostToDevice, b->st), "weight upload");
            } else {
                G3C_CK(g3c_fill_random_bf16((__nv_bfloat16 *)stage, (size_t)nr * k, 1.f / sqrtf((float)k),
                                            seed * 1000003ull + (uint64_t)j * 7919 + (uint64_t)r, b->st),
                       "random fill");
            }
            int dr0 = interleave ? r * nsrc + j : row0 + r;
            G3C_CK(g3c_convert_rows(stage, t, nr, d, dr0, interleave ? nsrc : 1, b->st), "weight conversion");
            G3C_CK(cudaStreamSynchronize(b->st), "weight conversion");
        }
        row0 += src[j].n;
    }
    b->resident += d->bytes;
    return G3_OK;
}

g3_status g3cb_load_weights(g3_backend *b, const g3_model *m, uint64_t seed, g3_error *err) {
    const g3_config *c = &b->c;
    const int H = c->hidden, F = c->ffn, D = c->head_dim, NQ = c->n_heads * D, NK = c->n_kv_heads * D;
    size_t stage_bytes = 256u << 20;
    void *stage = NULL;
    G3C_CK(cudaMalloc(&stage, stage_bytes), "staging allocation");
    g3_status rc = G3_OK;
    src_mat e = {m ? &m->embed : NULL, c->vocab};
    rc = load_mat(b, &b->embed, &e, 1, H, 0, stage, stage_bytes, seed, "token_embd", err);
    for (int l = 0; l < c->n_layers && rc == G3_OK; l++) {
        const g3_layer_weights *lw = m ? &m->layers[l] : NULL;
        layer_dev *L = &b->L[l];
        char what[64];
        snprintf(what, sizeof what, "layer %d qkv", l);
        src_mat qkv[3] = {{lw ? &lw->wq : NULL, NQ}, {lw ? &lw->wk : NULL, NK}, {lw ? &lw->wv : NULL, NK}};
        /* v in another format than q and k (GGUF mixes): its own matrix, each keeping its format (layer_dev.v) */
        int gq, gk, gv, split = 0;
        if (lw) {
            const int fq = src_format(b, &lw->wq, H, &gq), fk = src_format(b, &lw->wk, H, &gk),
                      fv = src_format(b, &lw->wv, H, &gv);
            split = fq >= 0 && fv >= 0 && fq == fk && gq == gk && (fv != fq || gv != gq) && !vsplit_off();
        }
        rc = load_mat(b, &L->qkv, qkv, split ? 2 : 3, H, 0, stage, stage_bytes, seed + 10 * l + 1, what, err);
        if (rc == G3_OK && split) {
            snprintf(what, sizeof what, "layer %d attn_v", l);
            rc = load_mat(b, &L->v, qkv + 2, 1, H, 0, stage, stage_bytes, seed + 10 * l + 5, what, err);
        }
        snprintf(what, sizeof what, "layer %d attn_output", l);
        src_mat o = {lw ? &lw->wo : NULL, H};
        if (rc == G3_OK) rc = load_mat(b, &L->o, &o, 1, NQ, 0, stage, stage_bytes, seed + 10 * l + 2, what, err);
        snprintf(what, sizeof what, "layer %d gate/up", l);
        src_mat gu[2] = {{lw ? &lw->w_gate : NULL, F}, {lw ? &lw->w_up : NULL, F}};
        if (rc == G3_OK) rc = load_mat(b, &L->gu, gu, 2, H, 1, stage, stage_bytes, seed + 10 * l + 3, what, err);
        snprintf(what, sizeof what, "layer %d ffn_down", l);
        src_mat dn = {lw ? &lw->w_down : NULL, H};
        if (rc == G3_OK) rc = load_mat(b, &L->down, &dn, 1, F, 0, stage, stage_bytes, seed + 10 * l + 4, what, err);
    }
    cudaFree(stage);
    if (rc) return rc;
    /* norms: per layer attn, q, k, post_attn, pre_ffn, post_ffn; then final */
    size_t per = (size_t)4 * H + 2 * D, tot = per * c->n_layers + H;
    float *h = (float *)malloc(tot * sizeof(float));
    if (!h) return g3c_fail(err, G3_ERR_NOMEM, "cuda: out of host memory for norms");
    for (size_t i = 0; i < tot; i++) h[i] = 1.f;
    if (m) {
        for (int l = 0; l < c->n_layers; l++) {
            const g3_layer_weights *lw = &m->layers[l];
            float *p = h + per * l;
            memcpy(p, lw->attn_norm, H * 4), memcpy(p + H, lw->q_norm, D * 4), memcpy(p + H + D, lw->k_norm, D * 4);
            memcpy(p + H + 2 * D, lw->post_attn_norm, H * 4), memcpy(p + 2 * H + 2 * D, lw->pre_ffn_norm, H * 4);
            memcpy(p + 3 * H + 2 * D, lw->post_ffn_norm, H * 4);
        }
        memcpy(h + per * c->n_layers, m->final_norm, H * 4);
    }
    cudaError_t ce = cudaMalloc((void **)&b->norms, tot * 4);
    if (ce == cudaSuccess) ce = cudaMemcpy(b->norms, h, tot * 4, cudaMemcpyHostToDevice);
    free(h);
    G3C_CK(ce, "norm upload");
    for (int l = 0; l < c->n_layers; l++) {
        float *p = b->norms + per * l;
        layer_dev *L = &b->L[l];
        L->attn_norm = p, L->q_norm = p + H, L->k_norm = p + H + D, L->post_attn = p + H + 2 * D;
        L->pre_ffn = p + 2 * H + 2 * D, L->post_ffn = p + 3 * H + 2 * D;
    }
    b->final_norm = b->norms + per * c->n_layers;
    return G3_OK;
}
