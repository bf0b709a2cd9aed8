/* The CUDA backend: weights resident on the GPU (fused QKV and interleaved gate/up matrices, converted at load),
 * every buffer allocated at create, and the whole Gemma 3 forward as a fixed sequence of launches that read the
 * step's tokens, positions and block tables from one device parameter block. Batches with logits for every row
 * and at most 256 rows run as CUDA graphs, one per row-count bucket (1, 2, 4, ..., 256), captured on first use
 * and replayed; other batches (prefill chunks) run the same launches eagerly.
 *
 * Per layer (GEMMA3.md):  y = xn Wqkv^T -> QK-norm, RoPE, K/V into the cache -> paged attention -> o Wo^T ->
 *   x += rms(.)*(1+w_post_attn), xn = rms(x)*(1+w_pre_ffn) -> GeGLU(xn Wgu^T) -> Wdown -> x += rms(.)*(1+w_post_ffn),
 *   xn = rms(x)*(1+w_next).  Head: logits = softcap(xn_final E^T) for the rows asked for.
 * Every producer of a matrix-product input writes float32 and bf16 (hi, lo) copies; every product's output buffer
 * is zero between uses (the consumer zeroes it), since the tensor-core kernels accumulate with atomics. Kernels are
 * launched with programmatic dependent launch so that each one's blocks are scheduled while its predecessor drains. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "backend/cuda/cuda_api.h"
}

#define NBUCKET 9 /* graphs for 1, 2, 4, ..., 256 rows */

typedef struct layer_dev {
    g3_dmat qkv, o, gu, down; /* [(NH+2NKV)D][H], [H][NH D], [2F][H] (gate, up interleaved), [H][F] */
    float *attn_norm, *q_norm, *k_norm, *post_attn, *pre_ffn, *post_ffn; /* device, as 1+w */
    int kind, index_in_kind;
} layer_dev;

struct g3_backend {
    g3_config c;
    g3_backend_cfg bc;
    int qt_req, split, graphs_on;
    char desc[64];
    cudaStream_t st;
    cublasHandle_t cub;
    void *cub_ws;
    int n_sm;
    g3_dmat embed;
    layer_dev *L;
    float *final_norm, *norms, *inv_freq; /* inv_freq: [2][D/2], kind 0 = global (scaled), 1 = sliding */
    int n_kind[2];
    float *pool[2];
    size_t block_bytes[2];
    int R;                                      /* rows per forward */
    float *x, *xn, *y, *q, *o, *a, *part, *hx, *logy, *logits;
    float *pnb; /* decode of 1-2 rows with the add-norms inside the products (record): x2 [2][H], then the product
                 * outputs yq [2][NQKV], yo [2][H], yd [2][H], zero between uses like y */
    __nv_bfloat16 *xh, *oh, *ah, *hxh, *wscratch;
    void *q8;                                   /* q8 activations of the dp4a products (qgemv.cu) */
    int8_t *tq8;                                /* 9..64 rows: activations quantized by their producer for the int8
                                                 * tensor-core products (tc_q8.cu), [64][max(H, F)] + scales */
    size_t q8_bytes;
    int HC;                                     /* head chunk rows */
    int32_t *d_par, *h_par, *d_ids, *seq_map;
    unsigned *acnt, *tcnt;                      /* attention split counters [R][NKV]; GeGLU tile counters */
    int attn_min_keys;                          /* $G3_CUDA_ATTN_MIN, default 32 */
    int distinct;                               /* this step's rows are all of different sequences (decode) */
    int32_t *fa_useq;                           /* [R] row plan of the prefill attention (attention_prefill.cu) */
    int fa_step;                                /* this step takes the prefill attention (run eagerly) */
    int tcnt_n;
    size_t par_ints;
    cudaGraphExec_t graph[NBUCKET];
    int graph_failed[NBUCKET];
    int graph_nodes[NBUCKET];
    uint64_t resident;
    cudaEvent_t *prof_ev;                       /* g3_cuda_profile: an event after each launch group */
    const char **prof_lbl;
    int prof_n;
};

#define PROF_MAX 4096
static void prof_mark(g3_backend *b, const char *lbl) {
    if (!b->prof_ev || b->prof_n >= PROF_MAX) return;
    cudaEventRecord(b->prof_ev[b->prof_n], b->st);
    b->prof_lbl[b->prof_n++] = lbl;
}

static size_t off_bt(const g3_backend *b) { return (size_t)4 * b->R; }

static int parse_quant(const char *s) {
    if (!s || !*s || !strcmp(s, "bf16")) return G3Q_BF16;
    if (!strcmp(s, "int8")) return G3Q_INT8;
    if (!strcmp(s, "int4")) return G3Q_INT4;
    if (!strcmp(s, "fp8")) return G3Q_FP8;
    return -1;
}

static void *dalloc(size_t bytes, int *ok) {
    void *p = NULL;
    if (!*ok) return NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) *ok = 0, p = NULL;
    return p;
}

/* ---- weights ---------------------------------------------------------------------------------------------------- */
typedef struct src_mat { const g3_weight *w; int n; } src_mat; /* w NULL: random */

static g3_status alloc_dmat(g3_dmat *d, int qt, int n, int k, int g, g3_error *err) {
    memset(d, 0, sizeof *d);
    d->qt = qt, d->n = n, d->k = k, d->g = g;
    size_t nk = (size_t)n * k, ng = (size_t)n * (k / g);
    size_t qb = qt == G3Q_BF16 ? nk * 2 : qt == G3Q_INT4 ? nk / 2 : nk;
    G3C_CK(cudaMalloc(&d->q, qb), "weight allocation");
    if (qt != G3Q_BF16) G3C_CK(cudaMalloc((void **)&d->s, ng * 4), "scale allocation");
    if (qt == G3Q_INT4) G3C_CK(cudaMalloc((void **)&d->z, ng * 4), "offset allocation");
    d->bytes = g3c_dmat_bytes(qt, n, k, g);
    return G3_OK;
}

static void free_dmat(g3_dmat *d) {
    cudaFree(d->q), cudaFree(d->s), cudaFree(d->z);
    memset(d, 0, sizeof *d);
}

/* Builds one resident matrix from nsrc sources stacked by rows (interleave: row i of source j -> i*nsrc + j). */
static g3_status load_mat(g3_backend *b, g3_dmat *d, const src_mat *src, int nsrc, int k, int interleave,
                          void *stage, size_t stage_bytes, uint64_t seed, const char *what, g3_error *err) {
    int n = 0, qt = -1, g = 0, mixed = 0;
    for (int j = 0; j < nsrc; j++) {
        uint32_t t = src[j].w ? src[j].w->type : (uint32_t)G3_DTYPE_BF16;
        if (src[j].w && (src[j].w->k != k || src[j].w->n != src[j].n || !src[j].w->data))
            return g3c_fail(err, G3_ERR_FORMAT, "cuda: %s: source %d is [%lld][%lld], expected [%d][%d]", what, j,
                            (long long)src[j].w->n, (long long)src[j].w->k, src[j].n, k);
        int gj, qj = g3c_target_format(t, b->qt_req, k, &gj);
        if (qj < 0) {
            qj = g3c_target_format(t, G3Q_BF16, k, &gj);
            if (qj < 0)
                return g3c_fail(err, G3_ERR_UNSUPPORTED, "cuda: %s: tensor type %u with %d values per row is not supported",
                                what, t, k);
        }
        if (j == 0) qt = qj, g = gj;
        else if (qj != qt || gj != g) mixed = 1;
        n += src[j].n;
    }
    if (mixed) qt = G3Q_BF16, g = k; /* e.g. Q4_K q/k with Q6_K v: a common lossless format */
    G3_TRY(alloc_dmat(d, qt, n, k, g, err));
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

static g3_status load_weights(g3_backend *b, const g3_model *m, uint64_t seed, g3_error *err) {
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
        rc = load_mat(b, &L->qkv, qkv, 3, H, 0, stage, stage_bytes, seed + 10 * l + 1, what, err);
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

/* ---- create / destroy ------------------------------------------------------------------------------------------ */
static void cuda_destroy(g3_backend *b) {
    if (!b) return;
    cudaStreamSynchronize(b->st);
    for (int i = 0; i < NBUCKET; i++)
        if (b->graph[i]) cudaGraphExecDestroy(b->graph[i]);
    free_dmat(&b->embed);
    if (b->L)
        for (int l = 0; l < b->c.n_layers; l++)
            free_dmat(&b->L[l].qkv), free_dmat(&b->L[l].o), free_dmat(&b->L[l].gu), free_dmat(&b->L[l].down);
    free(b->L);
    void *dev[] = {b->norms, b->inv_freq, b->pool[0], b->pool[1], b->x, b->xn, b->y, b->pnb, b->q, b->o, b->a, b->part,
                   b->hx, b->logy, b->logits, b->xh, b->oh, b->ah, b->hxh, b->wscratch, b->d_par, b->d_ids, b->cub_ws, b->tq8,
                   b->acnt, b->tcnt, b->q8, b->fa_useq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    cudaFreeHost(b->h_par);
    free(b->seq_map);
    if (b->cub) cublasDestroy(b->cub);
    if (b->st) cudaStreamDestroy(b->st);
    free(b);
}

static int n_splits_for(const g3_backend *b, int m) { /* ~4 blocks per SM of keys split for decode */
    int want = (4 * b->n_sm + m * b->c.n_kv_heads - 1) / (m * b->c.n_kv_heads);
    return want < 1 ? 1 : want > 64 ? 64 : want;
}

static size_t kv_block_bytes(const g3_config *c, const g3_backend_cfg *cfg, int kind) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += (c->layer_global[l] ? 0 : 1) == kind;
    return (size_t)n * 2 * c->n_kv_heads * cfg->kv_block * c->head_dim * sizeof(float);
}

static size_t cuda_block_bytes(const g3_model *m, const g3_backend_cfg *cfg, int kind) {
    return kv_block_bytes(&m->cfg, cfg, kind);
}

extern "C" g3_status g3_cuda_create(const g3_model *m, const g3_config *shape, const g3_backend_cfg *cfg,
                                    const g3_cuda_opts *opts, g3_backend **out, g3_error *err) {
    *out = NULL;
    const g3_config *c = m ? &m->cfg : shape;
    if (!c || !cfg) return g3c_fail(err, G3_ERR_ARG, "cuda: no model or configuration");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
        return g3c_fail(err, G3_ERR_DEVICE, "cuda: no CUDA device is available");
    if (cfg->device < 0 || cfg->device >= ndev)
        return g3c_fail(err, G3_ERR_ARG, "cuda: device %d out of range (%d devices)", cfg->device, ndev);
    const int H = c->hidden, D = c->head_dim, G = c->n_heads / c->n_kv_heads;
    if (D > 256 || D % 2 || H % 32 || c->ffn % 32 || (c->n_heads * D) % 32 || (G != 1 && G != 2 && G != 4 && G != 8))
        return g3c_fail(err, G3_ERR_UNSUPPORTED,
                        "cuda: shape not supported (head_dim %d must be even and <= 256; hidden %d, ffn %d and "
                        "heads*head_dim must be multiples of 32; heads/kv_heads %d must be 1, 2, 4 or 8)",
                        D, H, c->ffn, G);
    if (cfg->max_rows < 1 || cfg->max_seqs < 1 || cfg->kv_block < 1 || cfg->max_blocks_per_seq < 1 ||
        cfg->n_blocks_global < 0 || cfg->n_blocks_local < 0)
        return g3c_fail(err, G3_ERR_ARG, "cuda: bad backend configuration (rows %d, seqs %d, block %d, width %d)",
                        cfg->max_rows, cfg->max_seqs, cfg->kv_block, cfg->max_blocks_per_seq);
    const char *qs = opts && opts->quant ? opts->quant : getenv("G3_CUDA_QUANT");
    int qt = parse_quant(qs);
    if (qt < 0) return g3c_fail(err, G3_ERR_ARG, "cuda: unknown quantization \"%s\" (bf16, int8, int4 or fp8)", qs);
    G3C_CK(cudaSetDevice(cfg->device), "cudaSetDevice");

    g3_backend *b = (g3_backend *)calloc(1, sizeof *b);
    if (!b) return g3c_fail(err, G3_ERR_NOMEM, "cuda: out of memory");
    b->c = *c, b->bc = *cfg, b->qt_req = qt;
    const char *gm = getenv("G3_CUDA_GEMM");
    b->split = opts && opts->gemm ? opts->gemm == 1 : !(gm && !strcmp(gm, "bf16"));
    const char *amk = getenv("G3_CUDA_ATTN_MIN");
    b->attn_min_keys = amk && atoi(amk) > 0 ? atoi(amk) : 32;
    const char *gr = getenv("G3_CUDA_GRAPHS");
    b->graphs_on = !(opts && opts->no_graphs) && !(gr && !strcmp(gr, "0"));
    snprintf(b->desc, sizeof b->desc, "%s, gemm %s", qs && *qs ? qs : "bf16", b->split ? "bf16x2" : "bf16");
    g3_status rc = G3_OK;
#define CK(call, what) G3C_CK_GOTO(call, what, fail)
    {
        CK(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking), "stream");
        CK(cudaDeviceGetAttribute(&b->n_sm, cudaDevAttrMultiProcessorCount, cfg->device), "device query");
        if (cublasCreate(&b->cub) != CUBLAS_STATUS_SUCCESS) CK(cudaErrorUnknown, "cublasCreate");
        CK(g3c_tc_init(), "tensor-core kernel occupancy");
        CK(g3c_qgemv_init(), "dp4a kernel shared memory");
        size_t ws = 64u << 20;
        CK(cudaMalloc(&b->cub_ws, ws), "cuBLAS workspace");
        cublasSetStream(b->cub, b->st);
        cublasSetWorkspace(b->cub, b->cub_ws, ws);
        cublasSetMathMode(b->cub, CUBLAS_DEFAULT_MATH);

        b->L = (layer_dev *)calloc((size_t)c->n_layers, sizeof *b->L);
        if (!b->L) { rc = g3c_fail(err, G3_ERR_NOMEM, "cuda: out of memory"); goto fail; }
        for (int l = 0; l < c->n_layers; l++) {
            int k = c->layer_global[l] ? 0 : 1;
            b->L[l].kind = k, b->L[l].index_in_kind = b->n_kind[k]++;
        }
        rc = load_weights(b, m, opts ? opts->seed : 1, err);
        if (rc) goto fail;

        /* rope tables */
        float hf[2 * 128];
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < D / 2; i++) {
                float base = k == 0 ? c->rope_base_global : c->rope_base_local;
                float scale = k == 0 ? c->rope_scale_global : 1.0f;
                hf[k * (D / 2) + i] = (1.0f / powf(base, (float)(2 * i) / (float)D)) / scale;
            }
        int ok = 1;
        b->inv_freq = (float *)dalloc(sizeof(float) * D, &ok);
        if (ok) CK(cudaMemcpy(b->inv_freq, hf, sizeof(float) * D, cudaMemcpyHostToDevice), "rope table");

        /* KV pools */
        for (int k = 0; k < 2; k++) {
            b->block_bytes[k] = kv_block_bytes(c, cfg, k);
            int nb = k == 0 ? cfg->n_blocks_global : cfg->n_blocks_local;
            b->pool[k] = (float *)dalloc(b->block_bytes[k] * (size_t)nb, &ok);
        }
        /* activations */
        const int R = cfg->max_rows, F = c->ffn, NQ = c->n_heads * D, NQKV = (c->n_heads + 2 * c->n_kv_heads) * D;
        b->R = R;
        int maxN = NQKV > 2 * F ? NQKV : 2 * F;
        if (H > maxN) maxN = H;
        int maxS = 0;
        for (int mm = 1; mm <= R; mm++) {
            int v = mm * n_splits_for(b, mm);
            if (v > maxS) maxS = v;
        }
        b->HC = R < 64 ? R : 64;
        b->x = (float *)dalloc((size_t)R * H * 4, &ok), b->xn = (float *)dalloc((size_t)R * H * 4, &ok);
        b->y = (float *)dalloc((size_t)2 * R * maxN * 4, &ok);
        const size_t pnb_floats = (size_t)2 * (3 * H + NQKV);
        b->pnb = (float *)dalloc(pnb_floats * 4, &ok);
        b->q = (float *)dalloc((size_t)R * NQ * 4, &ok), b->o = (float *)dalloc((size_t)R * NQ * 4, &ok);
        b->a = (float *)dalloc((size_t)R * F * 4, &ok);
        b->part = (float *)dalloc(g3c_attn_part_floats(maxS, c->n_heads, D) * 4, &ok);
        b->hx = (float *)dalloc((size_t)b->HC * H * 4, &ok);
        b->logy = (float *)dalloc((size_t)2 * b->HC * c->vocab * 4, &ok);
        b->logits = (float *)dalloc((size_t)R * c->vocab * 4, &ok);
        b->xh = (__nv_bfloat16 *)dalloc((size_t)2 * R * H * 2, &ok);
        b->oh = (__nv_bfloat16 *)dalloc((size_t)2 * R * NQ * 2, &ok);
        b->ah = (__nv_bfloat16 *)dalloc((size_t)2 * R * F * 2, &ok);
        b->hxh = (__nv_bfloat16 *)dalloc((size_t)2 * b->HC * H * 2, &ok);
        /* bf16 scratch for cuBLAS on quantized matrices, when some batch is large enough to want it (beyond 64
         * rows with the tensor-core kernels, 16 without) */
        size_t big = 0;
        int anyq = 0;
        const g3_dmat *all[4];
        for (int l = 0; l <= c->n_layers; l++) {
            int na = 0;
            if (l == c->n_layers) all[na++] = &b->embed;
            else all[na++] = &b->L[l].qkv, all[na++] = &b->L[l].o, all[na++] = &b->L[l].gu, all[na++] = &b->L[l].down;
            for (int i = 0; i < na; i++)
                if (all[i]->qt != G3Q_BF16) {
                    anyq = 1;
                    size_t nk = (size_t)all[i]->n * all[i]->k;
                    if (nk > big) big = nk;
                }
        }
        if (anyq && R > 16) b->wscratch = (__nv_bfloat16 *)dalloc(big * 2, &ok);
        b->acnt = (unsigned *)dalloc((size_t)R * c->n_kv_heads * 4, &ok);
        b->fa_useq = (int32_t *)dalloc((size_t)R * 4, &ok);
        b->tcnt_n = (2 * F + 15) / 16;
        b->tcnt = (unsigned *)dalloc((size_t)b->tcnt_n * 4, &ok);
        {
            int kq = H > F ? H : F;
            if (NQ > kq) kq = NQ;
            b->q8_bytes = g3c_qgemv_q8_bytes(R < 8 ? R : 8, kq);
            b->q8 = dalloc(b->q8_bytes, &ok);
            if (R >= 9) b->tq8 = (int8_t *)dalloc(g3c_tq_q8_bytes(64, H > F ? H : F), &ok);
        }
        b->par_ints = off_bt(b) + (size_t)R * 2 * cfg->max_blocks_per_seq;
        b->d_par = (int32_t *)dalloc(b->par_ints * 4, &ok);
        b->d_ids = (int32_t *)dalloc((size_t)R * 4, &ok);
        if (!ok) { rc = g3c_fail(err, G3_ERR_NOMEM, "cuda: out of device memory for the KV cache or buffers"); goto fail; }
        /* product outputs start (and stay, between uses) at zero */
        CK(cudaMemsetAsync(b->y, 0, (size_t)2 * R * maxN * 4, b->st), "clearing buffers");
        CK(cudaMemsetAsync(b->pnb, 0, pnb_floats * 4, b->st), "clearing buffers");
        CK(cudaMemsetAsync(b->logy, 0, (size_t)2 * b->HC * c->vocab * 4, b->st), "clearing buffers");
        CK(cudaMemsetAsync(b->acnt, 0, (size_t)R * c->n_kv_heads * 4, b->st), "clearing counters");
        CK(cudaMemsetAsync(b->tcnt, 0, (size_t)b->tcnt_n * 4, b->st), "clearing counters");
        CK(cudaMallocHost((void **)&b->h_par, b->par_ints * 4), "pinned parameter buffer");
        b->seq_map = (int32_t *)malloc(sizeof(int32_t) * cfg->max_seqs);
        if (!b->seq_map) { rc = g3c_fail(err, G3_ERR_NOMEM, "cuda: out of memory"); goto fail; }
        for (int i = 0; i < cfg->max_seqs; i++) b->seq_map[i] = -1;
        /* device-wide: the norms and RoPE tables went up by legacy-stream copies, which b->st does not wait for */
        CK(cudaDeviceSynchronize(), "create");
    }
#undef CK
    *out = b;
    return G3_OK;
fail:
    cuda_destroy(b);
    return rc;
}

static g3_status cuda_create(const g3_model *m, const g3_backend_cfg *cfg, g3_backend **out, g3_error *err) {
    return g3_cuda_create(m, NULL, cfg, NULL, out, err);
}

/* ---- the forward ------------------------------------------------------------------------------------------------- */
/* Decode of 1-2 rows with every product on the persistent dp4a kernel (qgemv.cu) can take the add-norms into the
 * qkv and gate/up products' prologues (g3c_qgemv_pn): two launches less per layer. */
static int pnorm_ok(const g3_backend *b, const g3c_mm_ctx *mc, int m) {
    if (m > 2 || !g3c_pnorm_enabled()) return 0;
    for (int l = 0; l < b->c.n_layers; l++) {
        const layer_dev *L = &b->L[l];
        if (g3c_mm_path(mc, &L->qkv, m) != G3C_PATH_QGEMV || g3c_mm_path(mc, &L->o, m) != G3C_PATH_QGEMV ||
            g3c_mm_path(mc, &L->gu, m) != G3C_PATH_QGEMV || g3c_mm_path(mc, &L->down, m) != G3C_PATH_QGEMV ||
            !g3c_qgemv_pn_supported(&L->qkv, m, 0) || !g3c_qgemv_pn_supported(&L->gu, m, 1))
            return 0;
    }
    return 1;
}

/* Issues every launch of one forward over m rows (padded rows have useq -1) and n_out head rows; no host sync. */
static cudaError_t record(g3_backend *b, int m, int n_out) {
    const g3_config *c = &b->c;
    const int H = c->hidden, D = c->head_dim, F = c->ffn, V = c->vocab;
    const int32_t *P = b->d_par;
    g3c_rows rows = {P, P + b->R, P + 2 * b->R, P + off_bt(b), b->bc.max_blocks_per_seq};
    const int32_t *out_rows = P + 3 * b->R;
    const int split = b->split;
    g3c_mm_ctx mc = {b->cub, b->st, b->wscratch, split, b->n_sm, b->tcnt, b->tcnt_n, b->q8, b->q8_bytes};
    int ny, fused;
    /* prefill with every product on cuBLAS (beta = 0 overwrites y): the row kernels leave y as it is and skip the
     * float32 copies only GEMV paths read; y is cleared once after the last layer (opt-in: $G3_CUDA_NOZERO=1) */
    int rf = m > 64 && g3c_nozero_enabled() ? G3C_KEEP_Y | G3C_NO_F32 : 0;
    for (int l = 0; l < c->n_layers && rf; l++) {
        const layer_dev *L = &b->L[l];
        if (g3c_mm_path(&mc, &L->qkv, m) != G3C_PATH_CUBLAS || g3c_mm_path(&mc, &L->o, m) != G3C_PATH_CUBLAS ||
            g3c_mm_path(&mc, &L->gu, m) != G3C_PATH_CUBLAS || g3c_mm_path(&mc, &L->down, m) != G3C_PATH_CUBLAS)
            rf = 0;
    }
    cudaError_t e;
    /* decode-sized steps: fused QK-norm + attention (rows of distinct sequences only) and the decode add-norm */
    const int dfuse = m <= 64 && b->distinct && g3c_dfuse_enabled();
    cudaError_t (*add_norm)(float *, float *, int, const float *, const float *, float, int, int, float *,
                            __nv_bfloat16 *, int, cudaStream_t) =
        m <= 64 && g3c_dnorm_enabled() ? g3c_add_norm_dec : g3c_add_norm;
    /* add-norms in the products: the residual alternates between x (after the qkv products) and x2 (after gate/up);
     * qkv writes yq (zeroed by QK-norm), o yo (zeroed by the next qkv product), down yd (zeroed by the next gate/up
     * product, or by the final add-norm) */
    const int pn = !rf && !b->fa_step && !dfuse && pnorm_ok(b, &mc, m);
    /* 9..64 rows: the add-norms and GeGLU also quantize their outputs for the int8 tensor-core products that read
     * them (one launch less per product); tq_* below say which products take them, per layer */
    const int tqp = b->tq8 && m >= 9 && m <= 64 && !rf && H % 128 == 0 && F % 128 == 0;
    int8_t *tq_x = b->tq8;
    float2 *tq_d = (float2 *)(b->tq8 + (size_t)64 * (H > F ? H : F)); /* 8-byte aligned: 64 * k, k % 128 == 0 */
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
        float *yqkv = pn ? yq : b->y;
        if (pn) { /* layer 0: the embedding's xn as it is; then x2 + the previous down product -> x, xn */
            g3c_qp_pre pq;
            memset(&pq, 0, sizeof pq);
            pq.xi = l ? x2 : b->xn, pq.y = l ? yd : NULL, pq.xo = b->x, pq.eps = c->rms_eps;
            pq.w1 = l ? b->L[l - 1].post_ffn : NULL, pq.w2 = L->attn_norm, pq.zero = yo, pq.zero_n = m * H;
            RUN(g3c_qgemv_pn(&L->qkv, &pq, m, yq, NQKV, 0, b->st));
            ny = 1;
        } else if (tq_next) {
            RUN(g3c_tq_mm_pre(&L->qkv, tq_x, tq_d, m, b->y, b->n_sm, b->st));
            ny = 1;
        } else {
            RUN(g3c_mm(&mc, &L->qkv, b->xn, b->xh, m, b->y, &ny, NULL, NULL, 0, &fused));
        }
        tq_next = 0;
        PROF("qkv product");
        g3c_attn_args a;
        a.rows = rows, a.m = m, a.NH = c->n_heads, a.NKV = c->n_kv_heads, a.D = D, a.kind = L->kind;
        a.layer_in_kind = L->index_in_kind, a.n_layers_kind = b->n_kind[L->kind], a.kv_block = b->bc.kv_block;
        a.window = c->sliding_window, a.scale = 1.f / sqrtf(c->query_pre_attn_scalar), a.softcap = c->attn_softcap;
        a.eps = c->rms_eps, a.inv_freq = b->inv_freq + L->kind * (D / 2), a.pool = b->pool[L->kind];
        a.n_splits = n_splits_for(b, m), a.min_keys = b->attn_min_keys;
        if (dfuse) { /* decode: one launch (attention.cu) */
            RUN(g3c_attention_fused(&a, yqkv, ny, L->q_norm, L->k_norm, b->part, b->acnt, b->o, b->oh, split, b->st));
            PROF("qk-norm + attention (fused)");
        } else {
            RUN(g3c_qkv_post_rows_f(&a, yqkv, ny, L->q_norm, L->k_norm, b->q, rf, b->st)); /* qkv_post below 16 */
            PROF("qk-norm, rope, cache write");
            if (b->fa_step) {
                RUN(g3c_attention_prefill(&a, b->q, b->part, b->acnt, b->fa_useq, b->fa_step == 2, b->o, b->oh, split,
                                          b->st));
            } else {
                RUN(g3c_attention(&a, b->q, b->part, b->acnt, b->o, b->oh, split, b->st));
            }
            PROF("attention");
        }
        RUN(g3c_mm(&mc, &L->o, b->o, b->oh, m, pn ? yo : b->y, &ny, NULL, NULL, 0, &fused));
        PROF("o product");
        if (pn) { /* x + the o product -> x2, xn: GeGLU */
            g3c_qp_pre pq;
            memset(&pq, 0, sizeof pq);
            pq.xi = b->x, pq.y = yo, pq.xo = x2, pq.w1 = L->post_attn, pq.w2 = L->pre_ffn, pq.eps = c->rms_eps;
            pq.zero = yd, pq.zero_n = m * H;
            RUN(g3c_qgemv_pn(&L->gu, &pq, m, b->a, F, 1, b->st));
            fused = 1;
        } else {
            const int tq_gu = tqp && add_norm == g3c_add_norm_dec && g3c_tq_taken(&L->gu, m);
            if (rf) RUN(g3c_add_norm_f(b->x, b->y, ny, L->post_attn, L->pre_ffn, c->rms_eps, m, H, b->xn, b->xh,
                                       split, rf, b->st));
            else if (tq_gu)
                RUN(g3c_add_norm_dec_tq(b->x, b->y, ny, L->post_attn, L->pre_ffn, c->rms_eps, m, H, b->xn, b->xh,
                                        split, tq_x, tq_d, g3c_tq_int4(&L->gu), b->st));
            else RUN(add_norm(b->x, b->y, ny, L->post_attn, L->pre_ffn, c->rms_eps, m, H, b->xn, b->xh, split, b->st));
            PROF("add + norms");
            if (tq_gu) {
                RUN(g3c_tq_mm_pre(&L->gu, tq_x, tq_d, m, b->y, b->n_sm, b->st));
                ny = 1, fused = 0;
            } else {
                RUN(g3c_mm(&mc, &L->gu, b->xn, b->xh, m, b->y, &ny, b->a, b->ah, 1, &fused));
            }
        }
        PROF("gate/up product");
        const int tq_dn = tqp && !fused && ny <= 2 && g3c_tq_taken(&L->down, m);
        if (tq_dn) RUN(g3c_geglu_tq(b->y, ny, m, F, b->a, b->ah, split, tq_x, tq_d, g3c_tq_int4(&L->down), b->st));
        else if (!fused) RUN(g3c_geglu_f(b->y, ny, m, F, b->a, b->ah, split, rf, b->st));
        else if (fused == 1 && g3c_mm_path(&mc, &L->down, m) != G3C_PATH_GEMV &&
                 g3c_mm_path(&mc, &L->down, m) != G3C_PATH_QGEMV)
            RUN(g3c_to_bf16(b->a, m, F, b->ah, split, b->st));
        PROF("geglu");
        if (tq_dn) {
            RUN(g3c_tq_mm_pre(&L->down, tq_x, tq_d, m, b->y, b->n_sm, b->st));
            ny = 1;
        } else {
            RUN(g3c_mm(&mc, &L->down, b->a, b->ah, m, pn ? yd : b->y, &ny, NULL, NULL, 0, &fused));
        }
        PROF("down product");
        const float *next = l + 1 < c->n_layers ? b->L[l + 1].attn_norm : b->final_norm;
        if (pn) { /* the next qkv product adds and normalizes; after the last layer, the head's xn */
            if (l + 1 == c->n_layers) {
                RUN(add_norm(x2, yd, ny, L->post_ffn, next, c->rms_eps, m, H, b->xn, b->xh, split, b->st));
                PROF("add + norms");
            }
        } else if (rf) /* the head reads the last xn */
            RUN(g3c_add_norm_f(b->x, b->y, ny, L->post_ffn, next, c->rms_eps, m, H, b->xn, b->xh, split,
                               l + 1 < c->n_layers ? rf : G3C_KEEP_Y, b->st));
        else if ((tq_next = tqp && l + 1 < c->n_layers && add_norm == g3c_add_norm_dec &&
                            g3c_tq_taken(&b->L[l + 1].qkv, m)))
            RUN(g3c_add_norm_dec_tq(b->x, b->y, ny, L->post_ffn, next, c->rms_eps, m, H, b->xn, b->xh, split, tq_x,
                                    tq_d, g3c_tq_int4(&b->L[l + 1].qkv), b->st));
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

static int bucket_of(int m) {
    for (int i = 0; i < NBUCKET; i++)
        if (m <= (1 << i)) return i;
    return -1;
}

/* Validates the batch, fills and uploads the parameter block, runs the step (graph or eager). */
static g3_status run_step(g3_backend *b, const g3_batch *bt, g3_error *err) {
    const int M = bt->n_rows, R = b->R, W = b->bc.max_blocks_per_seq;
    if (M < 1 || M > R) return g3c_fail(err, G3_ERR_ARG, "cuda: batch of %d rows (1..%d allowed)", M, R);
    if (bt->n_out < 0 || bt->n_out > M) return g3c_fail(err, G3_ERR_ARG, "cuda: n_out %d of %d rows", bt->n_out, M);
    int32_t *h = b->h_par;
    int n_u = 0;
    g3_status rc = G3_OK;
    for (int r = 0; r < M; r++) {
        int t = bt->token[r], p = bt->pos[r], s = bt->seq[r];
        if (t < 0 || t >= b->c.vocab) rc = g3c_fail(err, G3_ERR_ARG, "cuda: row %d: token %d out of range", r, t);
        else if (s < 0 || s >= b->bc.max_seqs) rc = g3c_fail(err, G3_ERR_ARG, "cuda: row %d: sequence slot %d", r, s);
        else if (p < 0 || p >= W * b->bc.kv_block) rc = g3c_fail(err, G3_ERR_ARG, "cuda: row %d: position %d", r, p);
        if (rc) break;
        if (b->seq_map[s] < 0) {
            b->seq_map[s] = n_u;
            memcpy(h + off_bt(b) + (size_t)n_u * 2 * W, bt->bt_global + (size_t)s * W, sizeof(int32_t) * W);
            memcpy(h + off_bt(b) + ((size_t)n_u * 2 + 1) * W, bt->bt_local + (size_t)s * W, sizeof(int32_t) * W);
            n_u++;
        }
        h[r] = t, h[R + r] = p, h[2 * R + r] = b->seq_map[s];
    }
    for (int r = 0; r < M; r++) b->seq_map[bt->seq[r] >= 0 && bt->seq[r] < b->bc.max_seqs ? bt->seq[r] : 0] = -1;
    b->seq_map[0] = -1;
    if (rc) return rc;
    for (int i = 0; i < bt->n_out; i++) {
        int o = bt->out_rows[i];
        if (o < 0 || o >= M || (i > 0 && o <= bt->out_rows[i - 1]))
            return g3c_fail(err, G3_ERR_ARG, "cuda: out_rows[%d] = %d invalid", i, o);
        h[3 * R + i] = o;
    }
    b->distinct = n_u == M;
    int bk = bt->n_out == M && b->graphs_on && (b->distinct || M > 64 || !g3c_dfuse_enabled()) ? bucket_of(M) : -1;
    /* a prefill chunk in the batch: eager, with the flash kernel (attention_prefill.cu) */
    b->fa_step = g3c_fa_wanted(bt->seq, M, b->c.n_heads, b->c.n_kv_heads, b->c.head_dim, b->n_sm);
    if (b->fa_step) bk = -1;
    if (bk >= 0 && ((1 << bk) > R || b->graph_failed[bk])) bk = -1;
    int mrun = bk >= 0 ? 1 << bk : M;
    for (int r = M; r < mrun; r++) h[r] = 0, h[R + r] = 0, h[2 * R + r] = -1, h[3 * R + r] = r;
    G3C_CK(cudaMemcpyAsync(b->d_par, h, (off_bt(b) + (size_t)n_u * 2 * W) * 4, cudaMemcpyHostToDevice, b->st),
           "parameter upload");
    if (bk >= 0 && !b->graph[bk]) {
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal);
        cudaError_t e2 = e == cudaSuccess ? record(b, mrun, mrun) : e;
        if (e == cudaSuccess) e = cudaStreamEndCapture(b->st, &g);
        if (e == cudaSuccess && e2 == cudaSuccess) e = cudaGraphInstantiate(&b->graph[bk], g, 0);
        size_t nn = 0;
        if (e == cudaSuccess && e2 == cudaSuccess && cudaGraphGetNodes(g, NULL, &nn) == cudaSuccess)
            b->graph_nodes[bk] = (int)nn;
        if (g) cudaGraphDestroy(g);
        if (e != cudaSuccess || e2 != cudaSuccess) {
            b->graph[bk] = NULL, b->graph_failed[bk] = 1, bk = -1, mrun = M;
            cudaGetLastError();
        }
    }
    if (bk >= 0) G3C_CK(cudaGraphLaunch(b->graph[bk], b->st), "graph launch");
    else G3C_CK(record(b, mrun, bt->n_out), "forward");
    return G3_OK;
}

static g3_status cuda_forward(g3_backend *b, const g3_batch *batch, float *logits, g3_error *err) {
    G3_TRY(run_step(b, batch, err));
    if (batch->n_out > 0 && logits)
        G3C_CK(cudaMemcpyAsync(logits, b->logits, (size_t)batch->n_out * b->c.vocab * 4, cudaMemcpyDeviceToHost, b->st),
               "logits download");
    G3C_CK(cudaStreamSynchronize(b->st), "forward");
    return G3_OK;
}

extern "C" g3_status g3_cuda_forward_argmax(g3_backend *b, const g3_batch *batch, int32_t *ids, g3_error *err) {
    G3_TRY(run_step(b, batch, err));
    if (batch->n_out > 0) {
        G3C_CK((g3c_dnorm_enabled() ? g3c_argmax_dec : g3c_argmax)(b->logits, batch->n_out, b->c.vocab, b->d_ids,
                                                                   b->st), "argmax");
        G3C_CK(cudaMemcpyAsync(ids, b->d_ids, (size_t)batch->n_out * 4, cudaMemcpyDeviceToHost, b->st), "ids download");
    }
    G3C_CK(cudaStreamSynchronize(b->st), "forward");
    return G3_OK;
}

static g3_status cuda_copy_block(g3_backend *b, int kind, int src, int dst, g3_error *err) {
    int nb = kind == 0 ? b->bc.n_blocks_global : b->bc.n_blocks_local;
    if (kind < 0 || kind > 1 || src < 0 || dst < 0 || src >= nb || dst >= nb)
        return g3c_fail(err, G3_ERR_ARG, "cuda: copy_block kind %d %d -> %d out of range (%d blocks)", kind, src, dst, nb);
    size_t bb = b->block_bytes[kind];
    G3C_CK(cudaMemcpyAsync((char *)b->pool[kind] + dst * bb, (char *)b->pool[kind] + src * bb, bb,
                           cudaMemcpyDeviceToDevice, b->st), "copy_block");
    return G3_OK;
}

extern "C" uint64_t g3_cuda_resident_bytes(const g3_backend *b) { return b->resident; }

/* One eager forward of `batch` with an event after each launch group; sums the time of each group over layers. */
extern "C" g3_status g3_cuda_profile(g3_backend *b, const g3_batch *batch, char *out, size_t cap, g3_error *err) {
    cudaEvent_t *ev = (cudaEvent_t *)calloc(PROF_MAX, sizeof *ev);
    const char **lbl = (const char **)calloc(PROF_MAX, sizeof *lbl);
    g3_status rc = G3_OK;
    int ne = 0;
    if (!ev || !lbl) rc = g3c_fail(err, G3_ERR_NOMEM, "cuda: out of memory");
    for (; rc == G3_OK && ne < PROF_MAX; ne++)
        if (cudaEventCreate(&ev[ne]) != cudaSuccess) rc = g3c_fail(err, G3_ERR_DEVICE, "cuda: event creation");
    if (rc == G3_OK) {
        int save = b->graphs_on;
        b->graphs_on = 0, b->prof_ev = ev, b->prof_lbl = lbl, b->prof_n = 0;
        rc = run_step(b, batch, err);
        if (rc == G3_OK && cudaStreamSynchronize(b->st) != cudaSuccess)
            rc = g3c_fail(err, G3_ERR_DEVICE, "cuda: profile step failed");
        b->graphs_on = save, b->prof_ev = NULL;
    }
    if (rc == G3_OK && cap) {
        const char *names[32];
        double tot[32];
        int cnt[32], nn = 0;
        for (int i = 1; i < b->prof_n; i++) {
            float ms = 0.f;
            cudaEventElapsedTime(&ms, ev[i - 1], ev[i]);
            int k = 0;
            while (k < nn && strcmp(names[k], lbl[i])) k++;
            if (k == nn && nn < 32) names[nn] = lbl[i], tot[nn] = 0, cnt[nn] = 0, nn++;
            if (k < nn) tot[k] += ms * 1e3, cnt[k]++;
        }
        size_t o = 0;
        out[0] = 0;
        for (int k = 0; k < nn && o < cap; k++)
            o += (size_t)snprintf(out + o, cap - o, "%s\t%.1f\t%d\t%.2f\n", names[k], tot[k], cnt[k], tot[k] / cnt[k]);
    }
    for (int i = 0; i < ne; i++) cudaEventDestroy(ev[i]);
    free(ev), free(lbl);
    return rc;
}

extern "C" int g3_cuda_graph_nodes(const g3_backend *b, int m) {
    int bk = bucket_of(m);
    return bk < 0 || !b->graph[bk] ? 0 : b->graph_nodes[bk];
}

extern "C" g3_status g3_cuda_set_gemm(g3_backend *b, int gemm, g3_error *err) {
    if (gemm < 1 || gemm > 2) return g3c_fail(err, G3_ERR_ARG, "cuda: GEMM mode %d (1 split, 2 plain bf16)", gemm);
    G3C_CK(cudaStreamSynchronize(b->st), "set_gemm");
    for (int i = 0; i < NBUCKET; i++) {
        if (b->graph[i]) cudaGraphExecDestroy(b->graph[i]);
        b->graph[i] = NULL, b->graph_failed[i] = 0, b->graph_nodes[i] = 0;
    }
    b->split = gemm == 1;
    char *comma = strstr(b->desc, ", gemm");
    if (comma) snprintf(comma, sizeof b->desc - (size_t)(comma - b->desc), ", gemm %s", b->split ? "bf16x2" : "bf16");
    return G3_OK;
}
extern "C" const char *g3_cuda_describe(const g3_backend *b) { return b->desc; }
extern "C" int g3_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" const g3_backend_ops g3_backend_cuda = {
    "cuda", cuda_create, cuda_destroy, cuda_forward, cuda_copy_block, cuda_block_bytes, g3_cuda_forward_argmax,
};
