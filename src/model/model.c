/* Model loading: finds the configuration and binds every Gemma 3 weight by name from a Hugging Face folder
 * (single or sharded safetensors, both checkpoint layouts) or a GGUF file, checking each tensor's type and shape
 * against the configuration. Matrices stay in the memory mapping; norm vectors are converted to float (1 + w). */
#include "model/model.h"


#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "model/config.h"
#include "model/dtype.h"

/* A tensor as found in a file, normalized: ne[0] is the contiguous dimension (GGUF order). */
typedef struct found_tensor {
    uint32_t type;
    int n_dims;
    int64_t ne[4];
    const void *data;
    size_t nbytes;
} found_tensor;

/* ---- name lookup in either source ---------------------------------------------------------------------------- */

static const char *hf_prefixes[] = {"model.", "language_model.model.", "model.language_model."};

static int find_hf(const g3_model *m, const char *hf_suffix, found_tensor *t, char *name_out, size_t cap) {
    for (size_t p = 0; p < sizeof hf_prefixes / sizeof hf_prefixes[0]; p++) {
        char name[256];
        snprintf(name, sizeof name, "%s%s", hf_prefixes[p], hf_suffix);
        const g3_st_tensor *st = g3_st_find(&m->st, name);
        if (!st) continue;
        snprintf(name_out, cap, "%s", name);
        t->type = st->dtype < 0 ? 0xffffffffu : (uint32_t)st->dtype;
        t->n_dims = st->n_dims;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (int d = 0; d < st->n_dims && d < 4; d++) t->ne[d] = st->shape[st->n_dims - 1 - d];
        t->data = st->data;
        t->nbytes = st->nbytes;
        return 1;
    }
    snprintf(name_out, cap, "model.%s", hf_suffix);
    return 0;
}

static int find_gguf(const g3_model *m, const char *name, found_tensor *t) {
    const g3_gguf_tensor *gt = g3_gguf_find_tensor(&m->gguf, name);
    if (!gt) return 0;
    t->type = gt->type;
    t->n_dims = (int)gt->n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = gt->ne[d];
    t->data = gt->data;
    t->nbytes = gt->nbytes;
    return 1;
}

/* Looks a tensor up under its HF name (suffix after the model prefix) or its GGUF name. */
static g3_status lookup(const g3_model *m, const char *hf_suffix, const char *gguf_name, found_tensor *t,
                        char *name, size_t cap, g3_error *err) {
    int ok;
    if (m->source == G3_SRC_HF) {
        ok = find_hf(m, hf_suffix, t, name, cap);
    } else {
        snprintf(name, cap, "%s", gguf_name);
        ok = find_gguf(m, gguf_name, t);
    }
    if (!ok) return g3_fail(err, G3_ERR_FORMAT, "%s: tensor %s is missing", m->path, name);
    if (!g3_dtype_get(t->type))
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: tensor %s has a type (%u) this engine cannot use", m->path, name,
                       t->type);
    return G3_OK;
}

static void shape_str(const found_tensor *t, char *buf, size_t cap) {
    /* printed outermost first, as PyTorch does */
    if (t->n_dims <= 1) snprintf(buf, cap, "[%lld]", (long long)t->ne[0]);
    else if (t->n_dims == 2) snprintf(buf, cap, "[%lld, %lld]", (long long)t->ne[1], (long long)t->ne[0]);
    else snprintf(buf, cap, "[%d-D]", t->n_dims);
}

/* A matrix of n rows by k columns ([n, k] in PyTorch order). rows_min < n allowed for the padded embedding. */
static g3_status bind_matrix(g3_model *m, const char *hf, const char *gg, int64_t n, int64_t k, int allow_more_rows,
                             g3_weight *w, g3_error *err) {
    found_tensor t;
    char name[256];
    G3_TRY(lookup(m, hf, gg, &t, name, sizeof name, err));
    int rows_ok = allow_more_rows ? t.ne[1] >= n : t.ne[1] == n;
    if (t.n_dims != 2 || t.ne[0] != k || !rows_ok) {
        char got[64];
        shape_str(&t, got, sizeof got);
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor %s has shape %s, the config implies [%lld, %lld]", m->path,
                       name, got, (long long)n, (long long)k);
    }
    size_t need = g3_tensor_bytes(t.type, k, t.ne[1]);
    if (need == 0 || need != t.nbytes)
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor %s holds %zu bytes, its type and shape need %zu", m->path, name,
                       t.nbytes, need);
    w->type = t.type;
    w->n = t.ne[1];
    w->k = k;
    w->data = t.data;
    w->nbytes = t.nbytes;
    m->n_params += (uint64_t)(n * k);
    m->weight_bytes += t.nbytes;
    return G3_OK;
}

/* A norm vector of `len` values, converted to float (1 + w); GGUF files already hold 1 + w. */
static g3_status bind_norm(g3_model *m, const char *hf, const char *gg, int64_t len, float *out, g3_error *err) {
    found_tensor t;
    char name[256];
    G3_TRY(lookup(m, hf, gg, &t, name, sizeof name, err));
    if (t.n_dims != 1 || t.ne[0] != len) {
        char got[64];
        shape_str(&t, got, sizeof got);
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor %s has shape %s, the config implies [%lld]", m->path, name, got,
                       (long long)len);
    }
    if (t.type != G3_DTYPE_F32 && t.type != G3_DTYPE_F16 && t.type != G3_DTYPE_BF16)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: norm tensor %s must be F32, F16 or BF16, not %s", m->path, name,
                       g3_dtype_name((g3_dtype)t.type));
    if (g3_tensor_bytes(t.type, len, 1) != t.nbytes)
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor %s holds %zu bytes for %lld values", m->path, name, t.nbytes,
                       (long long)len);
    g3_dequant_row(t.type, t.data, out, len);
    if (m->source == G3_SRC_HF)
        for (int64_t i = 0; i < len; i++) out[i] += 1.0f;
    m->n_params += (uint64_t)len;
    return G3_OK;
}

/* ---- progress ------------------------------------------------------------------------------------------------ */

typedef struct progress {
    int on;
    uint64_t done, total;
    int last_pct;
} progress;

static void progress_draw(progress *p) {
    if (!p->on || p->total == 0) return;
    int pct = (int)(100.0 * (double)p->done / (double)p->total);
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    int bars = pct * 40 / 100;
    fprintf(stderr, "\rloading [%.*s%*s] %3d%%  %.2f / %.2f GB", bars, "########################################",
            40 - bars, "", pct, (double)p->done / 1e9, (double)p->total / 1e9);
    if (p->done >= p->total) fprintf(stderr, "\n");
    fflush(stderr);
}

/* Reads one byte of every page so that the weights are resident before the first token (and the user sees the
 * disk read happen with a progress bar rather than as a slow first token). */
static void prefault(progress *p, const g3_weight *w) {
    volatile uint8_t sink = 0;
    const uint8_t *d = w->data;
    for (size_t off = 0; off < w->nbytes; off += 4096) {
        sink ^= d[off];
        if ((off & ((64u << 20) - 1)) == 0) {
            p->done += off ? (64u << 20) : 0;
            progress_draw(p);
        }
    }
    (void)sink;
}

/* ---- binding ------------------------------------------------------------------------------------------------- */

static g3_status bind_all(g3_model *m, const g3_load_opts *opts, g3_error *err) {
    const g3_config *c = &m->cfg;
    int64_t H = c->hidden, F = c->ffn, D = c->head_dim, Q = (int64_t)c->n_heads * D, KV = (int64_t)c->n_kv_heads * D;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    size_t per_layer = (size_t)(4 * H + 2 * D);
    m->norm_storage = malloc(sizeof(float) * ((size_t)c->n_layers * per_layer + (size_t)H));
    if (!m->layers || !m->norm_storage) return g3_fail(err, G3_ERR_NOMEM, "out of memory binding weights");
    float *ns = m->norm_storage;
    G3_TRY(bind_matrix(m, "embed_tokens.weight", "token_embd.weight", c->vocab, H, 1, &m->embed, err));
    m->cfg.vocab = (int)m->embed.n; /* 262144 or the padded 262208 */
    m->final_norm = ns, ns += H;
    G3_TRY(bind_norm(m, "norm.weight", "output_norm.weight", H, m->final_norm, err));
    for (int l = 0; l < c->n_layers; l++) {
        g3_layer_weights *L = &m->layers[l];
        char hf[128], gg[128];
#define NAMES(hfs, ggs) (snprintf(hf, sizeof hf, "layers.%d." hfs, l), snprintf(gg, sizeof gg, "blk.%d." ggs, l), hf), gg
        G3_TRY(bind_matrix(m, NAMES("self_attn.q_proj.weight", "attn_q.weight"), Q, H, 0, &L->wq, err));
        G3_TRY(bind_matrix(m, NAMES("self_attn.k_proj.weight", "attn_k.weight"), KV, H, 0, &L->wk, err));
        G3_TRY(bind_matrix(m, NAMES("self_attn.v_proj.weight", "attn_v.weight"), KV, H, 0, &L->wv, err));
        G3_TRY(bind_matrix(m, NAMES("self_attn.o_proj.weight", "attn_output.weight"), H, Q, 0, &L->wo, err));
        G3_TRY(bind_matrix(m, NAMES("mlp.gate_proj.weight", "ffn_gate.weight"), F, H, 0, &L->w_gate, err));
        G3_TRY(bind_matrix(m, NAMES("mlp.up_proj.weight", "ffn_up.weight"), F, H, 0, &L->w_up, err));
        G3_TRY(bind_matrix(m, NAMES("mlp.down_proj.weight", "ffn_down.weight"), H, F, 0, &L->w_down, err));
        L->attn_norm = ns, ns += H;
        L->post_attn_norm = ns, ns += H;
        L->pre_ffn_norm = ns, ns += H;
        L->post_ffn_norm = ns, ns += H;
        L->q_norm = ns, ns += D;
        L->k_norm = ns, ns += D;
        G3_TRY(bind_norm(m, NAMES("input_layernorm.weight", "attn_norm.weight"), H, L->attn_norm, err));
        G3_TRY(bind_norm(m, NAMES("post_attention_layernorm.weight", "post_attention_norm.weight"), H,
                         L->post_attn_norm, err));
        G3_TRY(bind_norm(m, NAMES("pre_feedforward_layernorm.weight", "ffn_norm.weight"), H, L->pre_ffn_norm, err));
        G3_TRY(bind_norm(m, NAMES("post_feedforward_layernorm.weight", "post_ffw_norm.weight"), H, L->post_ffn_norm,
                         err));
        G3_TRY(bind_norm(m, NAMES("self_attn.q_norm.weight", "attn_q_norm.weight"), D, L->q_norm, err));
        G3_TRY(bind_norm(m, NAMES("self_attn.k_norm.weight", "attn_k_norm.weight"), D, L->k_norm, err));
#undef NAMES
    }
    if (opts && opts->progress && isatty(2)) {
        progress p = {1, 0, m->weight_bytes, -1};
        prefault(&p, &m->embed);
        for (int l = 0; l < c->n_layers; l++) {
            const g3_weight *ws[] = {&m->layers[l].wq, &m->layers[l].wk, &m->layers[l].wv, &m->layers[l].wo,
                                     &m->layers[l].w_gate, &m->layers[l].w_up, &m->layers[l].w_down};
            for (int i = 0; i < 7; i++) {
                uint64_t before = p.done;
                prefault(&p, ws[i]);
                p.done = before + ws[i]->nbytes;
                progress_draw(&p);
            }
        }
        p.done = p.total;
        progress_draw(&p);
    }
    return G3_OK;
}

/* ---- sources ------------------------------------------------------------------------------------------------- */

static char *read_text_file(const char *path, size_t max) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static g3_status load_hf(g3_model *m, const char *dir, g3_error *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json = read_text_file(path, 1 << 20);
    if (!json) return g3_fail(err, G3_ERR_IO, "%s: cannot read config.json", dir);
    int multimodal = 0;
    g3_status rc = g3_config_from_json(&m->cfg, json, path, &multimodal, err);
    free(json);
    if (rc) return rc;
    m->source = G3_SRC_HF;
    G3_TRY(g3_st_open_dir(&m->st, dir, err));
    /* chat template, for `gemma3 info` */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *tc = read_text_file(path, 4 << 20);
    if (tc) {
        cJSON *root = cJSON_Parse(tc);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        if (cJSON_IsString(t)) m->chat_template = strdup(t->valuestring);
        cJSON_Delete(root);
        free(tc);
    }
    return G3_OK;
}

static g3_status load_gguf(g3_model *m, const char *file, g3_error *err) {
    G3_TRY(g3_gguf_open(&m->gguf, file, err));
    m->source = G3_SRC_GGUF;
    G3_TRY(g3_config_from_gguf(&m->cfg, &m->gguf, err));
    const g3_gguf_kv *kv = g3_gguf_find(&m->gguf, "tokenizer.chat_template");
    if (kv && kv->type == G3_GGUF_STRING && kv->str.len < (1u << 24)) m->chat_template = strndup(kv->str.s, kv->str.len);
    return G3_OK;
}

g3_status g3_model_load(const char *path, const g3_load_opts *opts, g3_model **out, g3_error *err) {
    *out = NULL;
    if (!path || !*path) return g3_fail(err, G3_ERR_ARG, "no model path given");
    g3_model *m = calloc(1, sizeof *m);
    if (!m) return g3_fail(err, G3_ERR_NOMEM, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", path);
    g3_status rc;
    if (is_dir(path)) rc = load_hf(m, path, err);
    else if (access(path, R_OK) == 0) rc = load_gguf(m, path, err);
    else rc = g3_fail(err, G3_ERR_IO, "%s: no such file or folder", path);
    if (rc == G3_OK) rc = bind_all(m, opts, err);
    if (rc != G3_OK) {
        g3_model_free(m);
        return rc;
    }
    *out = m;
    return G3_OK;
}

void g3_model_free(g3_model *m) {
    if (!m) return;
    if (m->source == G3_SRC_GGUF) g3_gguf_close(&m->gguf);
    if (m->source == G3_SRC_HF) g3_st_close(&m->st);
    free(m->layers);
    free(m->norm_storage);
    free(m->owned);
    free(m->chat_template);
    free(m);
}

const g3_config *g3_model_config(const g3_model *m) { return &m->cfg; }

uint64_t g3_model_decode_bytes(const g3_model *m) { return m->weight_bytes; }

uint64_t g3_model_kv_bytes(const g3_config *c, int ctx, int bytes_per_value) {
    uint64_t per_pos = 2ull * (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim * (uint64_t)bytes_per_value;
    uint64_t total = 0;
    for (int l = 0; l < c->n_layers; l++) {
        uint64_t kept = c->layer_global[l] ? (uint64_t)ctx : (uint64_t)(ctx < c->sliding_window ? ctx : c->sliding_window);
        total += kept * per_pos;
    }
    return total;
}
