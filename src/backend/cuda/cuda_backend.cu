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
 * launched with programmatic dependent launch so that each one's blocks are scheduled while its predecessor drains.
 * This file: create / destroy, the step (parameter upload, graph capture and replay) and the ops table; the weights
 * are loaded by cuda_weights.cu, the launches of one forward issued by cuda_forward.cu (state: cuda_backend.cuh). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attention_o.cuh"
#include "backend/cuda/cuda_backend.cuh"

static int parse_quant(const char *s) {
    if (!s || !*s || !strcmp(s, "bf16")) return G3Q_BF16;
    if (!strcmp(s, "int8")) return G3Q_INT8;
    if (!strcmp(s, "int4")) return G3Q_INT4;
    if (!strcmp(s, "fp8")) return G3Q_FP8;
    return -1;
}

/* ---- create / destroy ------------------------------------------------------------------------------------------ */
static void cuda_destroy(g3_backend *b) {
    if (!b) return;
    cudaStreamSynchronize(b->st);
    for (int i = 0; i < NBUCKET; i++)
        if (b->graph[i]) cudaGraphExecDestroy(b->graph[i]);
    g3cb_free_dmat(&b->embed);
    if (b->L)
        for (int l = 0; l < b->c.n_layers; l++)
            g3cb_free_dmat(&b->L[l].qkv), g3cb_free_dmat(&b->L[l].o), g3cb_free_dmat(&b->L[l].gu),
                g3cb_free_dmat(&b->L[l].down), g3cb_free_dmat(&b->L[l].v);
    free(b->L);
    void *dev[] = {b->norms, b->inv_freq, b->pool[0], b->pool[1], b->x, b->xn, b->y, b->pnb, b->q, b->o, b->a, b->part,
                   b->hx, b->logy, b->logits, b->xh, b->oh, b->ah, b->hxh, b->wscratch, b->d_par, b->d_ids, b->d_srow,
                   b->d_sadj, b->cub_ws, b->tq8, b->tq8g, b->acnt, b->tcnt, b->q8, b->fa_useq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    for (int k = 0; k < 2; k++) {
        cudaFreeHost(b->h_parb[k]);
        if (b->ev_par[k]) cudaEventDestroy(b->ev_par[k]);
        if (b->ev_ids[k]) cudaEventDestroy(b->ev_ids[k]);
    }
    cudaFreeHost(b->h_ids), cudaFreeHost(b->h_srow), cudaFreeHost(b->h_sadj);
    free(b->seq_map);
    if (b->cub) cublasDestroy(b->cub);
    if (b->st) cudaStreamDestroy(b->st);
    free(b);
}

/* whether the decode attention kernel that reads bf16 caches (attention_dec.cu) takes this shape */
static int kv16_shape_ok(const g3_config *c) {
    g3c_attn_args probe;
    memset(&probe, 0, sizeof probe);
    probe.NH = c->n_heads, probe.NKV = c->n_kv_heads, probe.D = c->head_dim, probe.m = 1;
    return g3c_attn2_enabled() && g3c_attn2_supported(&probe);
}

int g3c_kv16_for(const g3_config *c) {
    const char *e = getenv("G3_CUDA_KV");
    if (e && !strcmp(e, "bf16")) return 1;
    if (e && !strcmp(e, "f32")) return 0;
    return kv16_shape_ok(c); /* auto (unset, empty or "auto"): bf16 wherever the kernels take it */
}

static size_t kv_block_bytes(const g3_config *c, const g3_backend_cfg *cfg, int kind) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += (c->layer_global[l] ? 0 : 1) == kind;
    const size_t el = g3c_kv16_for(c) ? 2 : sizeof(float);
    return (size_t)n * 2 * c->n_kv_heads * cfg->kv_block * c->head_dim * el;
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
    const char *kve = getenv("G3_CUDA_KV");
    if (kve && *kve && strcmp(kve, "f32") && strcmp(kve, "bf16") && strcmp(kve, "auto"))
        return g3c_fail(err, G3_ERR_ARG, "cuda: unknown KV cache type \"%s\" (auto, bf16 or f32)", kve);
    const int kv16 = g3c_kv16_for(c);
    if (kv16 && !kv16_shape_ok(c)) /* asked for by name: auto takes bf16 only where the shape is ok */
        return g3c_fail(err, G3_ERR_ARG,
                        "cuda: a bf16 KV cache needs the cluster decode attention (head_dim 64, 128 or 256, "
                        "heads/kv_heads 1, 2, 4 or 8, G3_CUDA_ATTN2 not 0); this model: head_dim %d, %d/%d heads",
                        D, c->n_heads, c->n_kv_heads);
    const char *qs = opts && opts->quant ? opts->quant : getenv("G3_CUDA_QUANT");
    int qt = parse_quant(qs);
    if (qt < 0) return g3c_fail(err, G3_ERR_ARG, "cuda: unknown quantization \"%s\" (bf16, int8, int4 or fp8)", qs);
    G3C_CK(cudaSetDevice(cfg->device), "cudaSetDevice");

    g3_backend *b = (g3_backend *)calloc(1, sizeof *b);
    if (!b) return g3c_fail(err, G3_ERR_NOMEM, "cuda: out of memory");
    b->c = *c, b->bc = *cfg, b->qt_req = qt, b->kv16 = kv16;
    const char *gm = getenv("G3_CUDA_GEMM");
    b->split = opts && opts->gemm ? opts->gemm == 1 : !(gm && !strcmp(gm, "bf16"));
    const char *amk = getenv("G3_CUDA_ATTN_MIN");
    b->attn_min_keys = amk && atoi(amk) > 0 ? atoi(amk) : 32;
    const char *gr = getenv("G3_CUDA_GRAPHS");
    b->graphs_on = !(opts && opts->no_graphs) && !(gr && !strcmp(gr, "0"));
    snprintf(b->desc, sizeof b->desc, "%s%s, gemm %s", qs && *qs ? qs : "bf16", kv16 ? ", kv bf16" : "",
             b->split ? "bf16x2" : "bf16");
    g3_status rc = G3_OK;
#define CK(call, what) G3C_CK_GOTO(call, what, fail)
    {
        CK(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking), "stream");
        CK(cudaDeviceGetAttribute(&b->n_sm, cudaDevAttrMultiProcessorCount, cfg->device), "device query");
        if (cublasCreate(&b->cub) != CUBLAS_STATUS_SUCCESS) CK(cudaErrorUnknown, "cublasCreate");
        CK(g3c_tc_init(), "tensor-core kernel occupancy");
        CK(g3c_qgemv_init(), "dp4a kernel shared memory");
        CK(g3c_aop_init(), "fused attention + o product shared memory");
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
        rc = g3cb_load_weights(b, m, opts ? opts->seed : 1, err);
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
        b->inv_freq = (float *)g3cb_dalloc(sizeof(float) * D, &ok);
        if (ok) CK(cudaMemcpy(b->inv_freq, hf, sizeof(float) * D, cudaMemcpyHostToDevice), "rope table");

        /* KV pools */
        for (int k = 0; k < 2; k++) {
            b->block_bytes[k] = kv_block_bytes(c, cfg, k);
            int nb = k == 0 ? cfg->n_blocks_global : cfg->n_blocks_local;
            b->pool[k] = (float *)g3cb_dalloc(b->block_bytes[k] * (size_t)nb, &ok);
        }
        /* activations */
        const int R = cfg->max_rows, F = c->ffn, NQ = c->n_heads * D, NQKV = (c->n_heads + 2 * c->n_kv_heads) * D;
        b->R = R;
        int maxN = NQKV > 2 * F ? NQKV : 2 * F;
        if (H > maxN) maxN = H;
        int maxS = 0;
        for (int mm = 1; mm <= R; mm++) {
            int v = mm * g3cb_n_splits(b, mm);
            if (v > maxS) maxS = v;
        }
        b->HC = R < 64 ? R : 64;
        b->x = (float *)g3cb_dalloc((size_t)R * H * 4, &ok), b->xn = (float *)g3cb_dalloc((size_t)R * H * 4, &ok);
        b->y = (float *)g3cb_dalloc((size_t)2 * R * maxN * 4, &ok);
        const size_t pnb_floats = (size_t)2 * (3 * H + NQKV);
        b->pnb = (float *)g3cb_dalloc(pnb_floats * 4, &ok);
        b->q = (float *)g3cb_dalloc((size_t)R * NQ * 4, &ok), b->o = (float *)g3cb_dalloc((size_t)R * NQ * 4, &ok);
        b->a = (float *)g3cb_dalloc((size_t)R * F * 4, &ok);
        b->part = (float *)g3cb_dalloc(g3c_attn_part_floats(maxS, c->n_heads, D) * 4, &ok);
        b->hx = (float *)g3cb_dalloc((size_t)b->HC * H * 4, &ok);
        b->logy = (float *)g3cb_dalloc((size_t)2 * b->HC * c->vocab * 4, &ok);
        b->logits = (float *)g3cb_dalloc((size_t)R * c->vocab * 4, &ok);
        b->xh = (__nv_bfloat16 *)g3cb_dalloc((size_t)2 * R * H * 2, &ok);
        b->oh = (__nv_bfloat16 *)g3cb_dalloc((size_t)2 * R * NQ * 2, &ok);
        b->ah = (__nv_bfloat16 *)g3cb_dalloc((size_t)2 * R * F * 2, &ok);
        b->hxh = (__nv_bfloat16 *)g3cb_dalloc((size_t)2 * b->HC * H * 2, &ok);
        /* bf16 scratch for cuBLAS on quantized matrices, when some batch is large enough to want it (beyond 64
         * rows with the tensor-core kernels, 16 without) */
        size_t big = 0;
        int anyq = 0;
        const g3_dmat *all[5];
        for (int l = 0; l <= c->n_layers; l++) {
            int na = 0;
            if (l == c->n_layers) all[na++] = &b->embed;
            else all[na++] = &b->L[l].qkv, all[na++] = &b->L[l].o, all[na++] = &b->L[l].gu, all[na++] = &b->L[l].down;
            if (l < c->n_layers && b->L[l].v.q) all[na++] = &b->L[l].v;
            for (int i = 0; i < na; i++)
                if (all[i]->qt != G3Q_BF16) {
                    anyq = 1;
                    size_t nk = (size_t)all[i]->n * all[i]->k;
                    if (nk > big) big = nk;
                }
        }
        if (anyq && R > 16) b->wscratch = (__nv_bfloat16 *)g3cb_dalloc(big * 2, &ok);
        b->acnt = (unsigned *)g3cb_dalloc((size_t)R * c->n_kv_heads * 4, &ok);
        b->fa_useq = (int32_t *)g3cb_dalloc((size_t)R * 4, &ok);
        b->tcnt_n = (2 * F + 15) / 16;
        b->tcnt = (unsigned *)g3cb_dalloc(((size_t)b->tcnt_n + G3C_GD_WORDS) * 4, &ok);
        b->gdcnt = b->tcnt ? b->tcnt + b->tcnt_n : NULL; /* the fused gate/up + down product's (g3c_qgemv_gd) */
        {
            int kq = H > F ? H : F;
            if (NQ > kq) kq = NQ;
            b->q8_bytes = g3c_qgemv_q8_bytes(R < 8 ? R : 8, kq);
            b->q8 = g3cb_dalloc(b->q8_bytes, &ok);
            if (R >= 3) { /* int8 / bf16 activations of 64 rows, or fp8's hi + lo parts (128 rows of d); the int8
                           * tensor cores take products from 3 rows (g3c_tq_small_min) */
                const size_t qb = g3c_tq_q8_bytes(64, H > F ? H : F), fb = g3c_wgf_q_bytes(64, H > F ? H : F);
                b->tq8 = (int8_t *)g3cb_dalloc(qb > fb ? qb : fb, &ok);
                /* the down product's activations from the gate/up product's GeGLU epilogue: only where some layer
                 * can take it (33..64 rows; g3c_wg_geglu_ok, with $G3_CUDA_WGGG as at create) */
                int gg = 0;
                for (int l = 0; l < c->n_layers && !gg; l++)
                    for (int mm = 33; mm <= 64 && mm <= R && !gg; mm++)
                        gg = g3c_wg_geglu_ok(&b->L[l].gu, mm, g3c_tq_order(&b->L[l].down, mm), b->n_sm);
                if (gg) b->tq8g = (int8_t *)g3cb_dalloc(qb > fb ? qb : fb, &ok);
            }
        }
        b->par_ints = off_bt(b) + (size_t)R * 2 * cfg->max_blocks_per_seq;
        b->d_par = (int32_t *)g3cb_dalloc(b->par_ints * 4, &ok);
        b->d_ids = (int32_t *)g3cb_dalloc((size_t)R * 4, &ok);
        b->d_srow = (g3_dev_sample *)g3cb_dalloc((size_t)cfg->max_seqs * sizeof(g3_dev_sample), &ok);
        b->d_sadj = (g3_dev_adjust *)g3cb_dalloc((size_t)cfg->max_seqs * G3_DEV_ADJ_PER_ROW * sizeof(g3_dev_adjust),
                                                 &ok);
        if (!ok) { rc = g3c_fail(err, G3_ERR_NOMEM, "cuda: out of device memory for the KV cache or buffers"); goto fail; }
        /* product outputs start (and stay, between uses) at zero */
        CK(cudaMemsetAsync(b->y, 0, (size_t)2 * R * maxN * 4, b->st), "clearing buffers");
        CK(cudaMemsetAsync(b->pnb, 0, pnb_floats * 4, b->st), "clearing buffers");
        CK(cudaMemsetAsync(b->logy, 0, (size_t)2 * b->HC * c->vocab * 4, b->st), "clearing buffers");
        CK(cudaMemsetAsync(b->acnt, 0, (size_t)R * c->n_kv_heads * 4, b->st), "clearing counters");
        CK(cudaMemsetAsync(b->tcnt, 0, ((size_t)b->tcnt_n + G3C_GD_WORDS) * 4, b->st), "clearing counters");
        for (int k = 0; k < 2; k++) {
            CK(cudaMallocHost((void **)&b->h_parb[k], b->par_ints * 4), "pinned parameter buffer");
            CK(cudaEventCreateWithFlags(&b->ev_par[k], cudaEventDisableTiming), "events");
            CK(cudaEventCreateWithFlags(&b->ev_ids[k], cudaEventDisableTiming), "events");
        }
        b->h_par = b->h_parb[0];
        CK(cudaMallocHost((void **)&b->h_ids, (size_t)2 * R * 4), "pinned id buffer");
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
    /* a failed cudaMalloc is also recorded as the runtime's last error, which the next launch check
     * (cudaGetLastError) would report: a later create in this process (a smaller context, another model) must not
     * fail on it */
    (void)cudaGetLastError();
    return rc;
}

static g3_status cuda_create(const g3_model *m, const g3_backend_cfg *cfg, g3_backend **out, g3_error *err) {
    return g3_cuda_create(m, NULL, cfg, NULL, out, err);
}

static int bucket_of(int m) {
    for (int i = 0; i < NBUCKET; i++)
        if (m <= (1 << i)) return i;
    return -1;
}

/* Captures the forward of bucket bk (1 << bk rows, every row's logits wanted) as the graph of that bucket, for steps
 * of b->distinct's kind; 0 when capture failed (the bucket then runs eagerly from now on). Capture issues no work. */
static int capture(g3_backend *b, int bk) {
    const int mrun = 1 << bk;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal);
    cudaError_t e2 = e == cudaSuccess ? g3cb_record(b, mrun, mrun) : e;
    if (e == cudaSuccess) e = cudaStreamEndCapture(b->st, &g);
    if (e == cudaSuccess && e2 == cudaSuccess) e = cudaGraphInstantiate(&b->graph[bk], g, 0);
    b->graph_distinct[bk] = b->distinct;
    size_t nn = 0;
    if (e == cudaSuccess && e2 == cudaSuccess && cudaGraphGetNodes(g, NULL, &nn) == cudaSuccess)
        b->graph_nodes[bk] = (int)nn;
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess || e2 != cudaSuccess) {
        b->graph[bk] = NULL, b->graph_failed[bk] = 1;
        cudaGetLastError();
        return 0;
    }
    return 1;
}

/* Validates the batch, fills and uploads the parameter block, runs the step (graph or eager). feed (NULL: none): row
 * r's token is d_ids[feed[r]] where feed[r] >= 0 (the ids picked by the step before, which the stream ran first),
 * copied over the uploaded one, a copy a run of consecutive rows. */
static g3_status run_step(g3_backend *b, const g3_batch *bt, const int32_t *feed, g3_error *err) {
    const int M = bt->n_rows, R = b->R, W = b->bc.max_blocks_per_seq;
    if (M < 1 || M > R) return g3c_fail(err, G3_ERR_ARG, "cuda: batch of %d rows (1..%d allowed)", M, R);
    if (bt->n_out < 0 || bt->n_out > M) return g3c_fail(err, G3_ERR_ARG, "cuda: n_out %d of %d rows", bt->n_out, M);
    for (int r = 0; feed && r < M; r++)
        if (feed[r] >= b->last_nout)
            return g3c_fail(err, G3_ERR_ARG, "cuda: row %d fed from pick %d of a step of %d", r, feed[r], b->last_nout);
    /* the other block: its upload (queued by the step before last) must have run before the host rewrites it */
    b->par_k ^= 1, b->h_par = b->h_parb[b->par_k];
    G3C_CK(cudaEventSynchronize(b->ev_par[b->par_k]), "parameter block");
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
    /* the forward of distinct rows may differ (int8 activations beyond 64 rows: g3c_mm_ctx.qact): such a graph
     * serves only steps of the same kind, others run eagerly */
    if (bk >= 0 && b->graph[bk] && b->graph_distinct[bk] != b->distinct) bk = -1;
    int mrun = bk >= 0 ? 1 << bk : M;
    for (int r = M; r < mrun; r++) h[r] = 0, h[R + r] = 0, h[2 * R + r] = -1, h[3 * R + r] = r;
    G3C_CK(cudaMemcpyAsync(b->d_par, h, (off_bt(b) + (size_t)n_u * 2 * W) * 4, cudaMemcpyHostToDevice, b->st),
           "parameter upload");
    G3C_CK(cudaEventRecord(b->ev_par[b->par_k], b->st), "parameter upload");
    for (int r = 0; feed && r < M;) { /* runs of rows fed from consecutive picks: one device copy each */
        if (feed[r] < 0) {
            r++;
            continue;
        }
        int r1 = r + 1;
        while (r1 < M && feed[r1] == feed[r] + (r1 - r)) r1++;
        G3C_CK(cudaMemcpyAsync(b->d_par + r, b->d_ids + feed[r], (size_t)(r1 - r) * 4, cudaMemcpyDeviceToDevice, b->st),
               "token feed");
        r = r1;
    }
    if (bk >= 0 && !b->graph[bk] && !capture(b, bk)) bk = -1, mrun = M;
    if (bk >= 0) G3C_CK(cudaGraphLaunch(b->graph[bk], b->st), "graph launch");
    else G3C_CK(g3cb_record(b, mrun, bt->n_out), "forward");
    return G3_OK;
}

static g3_status cuda_forward(g3_backend *b, const g3_batch *batch, float *logits, g3_error *err) {
    G3_TRY(run_step(b, batch, NULL, err));
    if (batch->n_out > 0 && logits)
        G3C_CK(cudaMemcpyAsync(logits, b->logits, (size_t)batch->n_out * b->c.vocab * 4, cudaMemcpyDeviceToHost, b->st),
               "logits download");
    G3C_CK(cudaStreamSynchronize(b->st), "forward");
    return G3_OK;
}

/* A sampled step's rows and adjustment entries against what the device buffers hold. */
static g3_status sampling_fits(const g3_backend *b, int n_out, const g3_dev_sampling *smp, g3_error *err) {
    if (n_out > b->bc.max_seqs || smp->n_adj > b->bc.max_seqs * G3_DEV_ADJ_PER_ROW)
        return g3c_fail(err, G3_ERR_ARG, "cuda: %d sampled rows with %d adjustments (room for %d rows, %d each)", n_out,
                        smp->n_adj, b->bc.max_seqs, G3_DEV_ADJ_PER_ROW);
    return G3_OK;
}

/* Queues the pick of the step's n_out (>= 1) out rows into d_ids: the greedy argmax (rows NULL), or the sampling chain
 * (sample.cu) with its settings rows[n_out] and adjustments adj[n_adj] uploaded from host memory first. */
static g3_status queue_pick(g3_backend *b, int n_out, const g3_dev_sample *rows, const g3_dev_adjust *adj, int n_adj,
                            g3_error *err) {
    if (!rows) {
        G3C_CK((g3c_dnorm_enabled() ? g3c_argmax_dec : g3c_argmax)(b->logits, n_out, b->c.vocab, b->d_ids, b->st),
               "argmax");
        return G3_OK;
    }
    G3C_CK(cudaMemcpyAsync(b->d_srow, rows, (size_t)n_out * sizeof *rows, cudaMemcpyHostToDevice, b->st),
           "sampling rows upload");
    if (n_adj > 0)
        G3C_CK(cudaMemcpyAsync(b->d_sadj, adj, (size_t)n_adj * sizeof *adj, cudaMemcpyHostToDevice, b->st),
               "sampling adjustments upload");
    G3C_CK(g3c_sample(b->logits, n_out, b->c.vocab, b->d_srow, b->d_sadj, b->d_ids, b->st), "sampling");
    return G3_OK;
}

/* The forward with its pick on the device (smp NULL: greedy; else the sampling chain, sample.cu: settings and
 * adjustments up), token ids down, waited for. */
static g3_status forward_pick(g3_backend *b, const g3_batch *batch, const g3_dev_sampling *smp, int32_t *ids,
                              g3_error *err) {
    if (smp) G3_TRY(sampling_fits(b, batch->n_out, smp, err));
    G3_TRY(run_step(b, batch, NULL, err));
    b->last_nout = 0; /* d_ids now holds this step's ids: nothing to feed from */
    if (batch->n_out > 0) {
        G3_TRY(queue_pick(b, batch->n_out, smp ? smp->row : NULL, smp ? smp->adj : NULL, smp ? smp->n_adj : 0, err));
        G3C_CK(cudaMemcpyAsync(ids, b->d_ids, (size_t)batch->n_out * 4, cudaMemcpyDeviceToHost, b->st), "ids download");
    }
    G3C_CK(cudaStreamSynchronize(b->st), "forward");
    return G3_OK;
}

extern "C" g3_status g3_cuda_forward_argmax(g3_backend *b, const g3_batch *batch, int32_t *ids, g3_error *err) {
    return forward_pick(b, batch, NULL, ids, err);
}

extern "C" g3_status g3_cuda_forward_sample(g3_backend *b, const g3_batch *batch, const g3_dev_sampling *smp,
                                            int32_t *ids, g3_error *err) {
    return forward_pick(b, batch, smp, ids, err);
}

/* The overlapped decode (backend.h): the step's pick and its ids' download queued behind it, an event after them;
 * nothing waits. The sampling rows go up from pinned copies (an upload from pageable memory may wait for the stream). */
static g3_status cuda_forward_submit(g3_backend *b, const g3_batch *batch, const g3_dev_sampling *smp,
                                     const int32_t *feed, g3_error *err) {
    if (b->fly_cnt >= 2) return g3c_fail(err, G3_ERR_ARG, "cuda: two steps submitted and not collected");
    if (batch->n_out < 1) return g3c_fail(err, G3_ERR_ARG, "cuda: a submitted step picks no token");
    const int k = (b->fly_k + b->fly_cnt) & 1, S = b->bc.max_seqs, A = S * G3_DEV_ADJ_PER_ROW;
    if (smp) {
        G3_TRY(sampling_fits(b, batch->n_out, smp, err));
        if (!b->h_srow) {
            G3C_CK(cudaMallocHost((void **)&b->h_srow, (size_t)2 * S * sizeof *b->h_srow), "pinned sampling rows");
            G3C_CK(cudaMallocHost((void **)&b->h_sadj, (size_t)2 * A * sizeof *b->h_sadj), "pinned sampling rows");
        }
    }
    G3_TRY(run_step(b, batch, feed, err));
    g3_dev_sample *hr = NULL;
    g3_dev_adjust *ha = NULL;
    if (smp) { /* buffer k's last reader was the step collected before this one: done */
        hr = b->h_srow + (size_t)k * S, ha = b->h_sadj + (size_t)k * A;
        memcpy(hr, smp->row, (size_t)batch->n_out * sizeof *hr);
        if (smp->n_adj > 0) memcpy(ha, smp->adj, (size_t)smp->n_adj * sizeof *ha);
    }
    G3_TRY(queue_pick(b, batch->n_out, hr, ha, smp ? smp->n_adj : 0, err));
    G3C_CK(cudaMemcpyAsync(b->h_ids + (size_t)k * b->R, b->d_ids, (size_t)batch->n_out * 4, cudaMemcpyDeviceToHost,
                           b->st), "ids download");
    G3C_CK(cudaEventRecord(b->ev_ids[k], b->st), "ids download");
    b->fly_nout[k] = batch->n_out, b->last_nout = batch->n_out;
    b->fly_cnt++;
    return G3_OK;
}

static g3_status cuda_forward_collect(g3_backend *b, int32_t *tokens, g3_error *err) {
    if (b->fly_cnt < 1) return g3c_fail(err, G3_ERR_ARG, "cuda: no submitted step to collect");
    const int k = b->fly_k;
    b->fly_k ^= 1, b->fly_cnt--;
    G3C_CK(cudaEventSynchronize(b->ev_ids[k]), "forward");
    memcpy(tokens, b->h_ids + (size_t)k * b->R, (size_t)b->fly_nout[k] * 4);
    return G3_OK;
}

/* The graphs of every bucket up to max_rows rows, captured now for decode steps (rows of distinct sequences, as
 * run_step would on first use): 30-150 ms each at the 27B shape on an H100 (session 13), otherwise paid by the first
 * request of each batch size. A bucket whose capture fails runs eagerly, as it would have. Switches read per call
 * (matmul.cu's) take their values at create for these graphs, as they did at the first step before. */
static g3_status cuda_prepare(g3_backend *b, int max_rows, g3_error *err) {
    (void)err;
    const char *pe = getenv("G3_CUDA_PREPARE");
    if (pe && !strcmp(pe, "0")) return G3_OK;
    const int save_d = b->distinct, save_f = b->fa_step;
    b->distinct = 1, b->fa_step = 0;
    for (int bk = 0; b->graphs_on && bk < NBUCKET && (1 << bk) <= b->R; bk++) {
        if (!b->graph[bk] && !b->graph_failed[bk]) capture(b, bk);
        if ((1 << bk) >= max_rows) break;
    }
    b->distinct = save_d, b->fa_step = save_f;
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
        rc = run_step(b, batch, NULL, err);
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
    g3_cuda_forward_sample, cuda_prepare, cuda_forward_submit, cuda_forward_collect,
    0, /* overlap_default: written in session 41, which had no GPU; on by default once measured there
        * (bench/logs/2026-12-04-session41/gpu_plan_s41a.txt) */
};
