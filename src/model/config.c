/* Gemma 3 configuration: parsing config.json (Gemma3ForCausalLM and the text_config of
 * Gemma3ForConditionalGeneration), GGUF metadata (llama.cpp's converter keys plus ours), presets for the released
 * sizes, validation and printing. Where a file is silent we use transformers' Gemma3TextConfig defaults, which is
 * what the 4B/12B/27B checkpoints rely on (their text_config omits many fields). */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"

/* transformers' Gemma3TextConfig defaults */
static void config_defaults(g3_config *c) {
    memset(c, 0, sizeof *c);
    c->vocab = 262208;
    c->hidden = 2304;
    c->ffn = 9216;
    c->n_layers = 26;
    c->n_heads = 8;
    c->n_kv_heads = 4;
    c->head_dim = 256;
    c->query_pre_attn_scalar = 256;
    c->sliding_window = 4096;
    c->sliding_pattern = 6;
    c->rope_base_global = 1e6f;
    c->rope_base_local = 1e4f;
    c->rope_scale_global = 1.0f;
    c->rms_eps = 1e-6f;
    c->max_ctx = 131072;
    c->bos_id = 2;
    c->eos_id = 1;
    c->eot_id = 106;
    c->pad_id = 0;
}

static void layers_from_pattern(g3_config *c) {
    for (int i = 0; i < c->n_layers && i < G3_MAX_LAYERS; i++)
        c->layer_global[i] = c->sliding_pattern > 0 ? ((i + 1) % c->sliding_pattern == 0) : 1;
}

/* ---- JSON -------------------------------------------------------------------------------------------------- */

/* Reads an integer field; absent or null leaves *out unchanged. Wrong type is an error. */
static g3_status json_int(const cJSON *o, const char *key, int *out, const char *path, g3_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return G3_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 1e9)
        return g3_fail(err, G3_ERR_FORMAT, "%s: field \"%s\" must be an integer", path, key);
    *out = (int)v->valuedouble;
    return G3_OK;
}

static g3_status json_float(const cJSON *o, const char *key, float *out, const char *path, g3_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return G3_OK;
    if (!cJSON_IsNumber(v)) return g3_fail(err, G3_ERR_FORMAT, "%s: field \"%s\" must be a number", path, key);
    *out = (float)v->valuedouble;
    return G3_OK;
}

/* rope_scaling {"rope_type"|"type": "linear", "factor": f} */
static g3_status json_rope_scaling(const cJSON *rs, float *factor, const char *path, g3_error *err) {
    if (!rs || cJSON_IsNull(rs)) return G3_OK;
    if (!cJSON_IsObject(rs)) return g3_fail(err, G3_ERR_FORMAT, "%s: rope_scaling must be an object", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    if (!strcmp(type, "default")) return G3_OK;
    if (strcmp(type, "linear") != 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: rope scaling type \"%s\" is not supported (only linear)", path,
                       type);
    return json_float(rs, "factor", factor, path, err);
}

g3_status g3_config_from_json(g3_config *c, const char *json_text, const char *path, int *multimodal,
                              g3_error *err) {
    config_defaults(c);
    *multimodal = 0;
    cJSON *root = cJSON_Parse(json_text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return g3_fail(err, G3_ERR_FORMAT, "%s: not a valid JSON object", path);
    }
    g3_status rc = G3_OK;
    const cJSON *o = root;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(tc)) {
        o = tc;
        *multimodal = 1;
    } else if (cJSON_IsString(mt) && strcmp(mt->valuestring, "gemma3_text") != 0 &&
               strcmp(mt->valuestring, "gemma3") != 0) {
        rc = g3_fail(err, G3_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not a Gemma 3 text model", path,
                     mt->valuestring);
        goto out;
    }
    if ((rc = json_int(o, "vocab_size", &c->vocab, path, err)) ||
        (rc = json_int(o, "hidden_size", &c->hidden, path, err)) ||
        (rc = json_int(o, "intermediate_size", &c->ffn, path, err)) ||
        (rc = json_int(o, "num_hidden_layers", &c->n_layers, path, err)) ||
        (rc = json_int(o, "num_attention_heads", &c->n_heads, path, err)) ||
        (rc = json_int(o, "num_key_value_heads", &c->n_kv_heads, path, err)) ||
        (rc = json_int(o, "head_dim", &c->head_dim, path, err)) ||
        (rc = json_float(o, "query_pre_attn_scalar", &c->query_pre_attn_scalar, path, err)) ||
        (rc = json_int(o, "sliding_window", &c->sliding_window, path, err)) ||
        (rc = json_int(o, "sliding_window_pattern", &c->sliding_pattern, path, err)) ||
        (rc = json_float(o, "rope_theta", &c->rope_base_global, path, err)) ||
        (rc = json_float(o, "rope_local_base_freq", &c->rope_base_local, path, err)) ||
        (rc = json_float(o, "rms_norm_eps", &c->rms_eps, path, err)) ||
        (rc = json_float(o, "attn_logit_softcapping", &c->attn_softcap, path, err)) ||
        (rc = json_float(o, "final_logit_softcapping", &c->final_softcap, path, err)) ||
        (rc = json_int(o, "max_position_embeddings", &c->max_ctx, path, err)) ||
        (rc = json_int(o, "bos_token_id", &c->bos_id, path, err)) ||
        (rc = json_int(o, "pad_token_id", &c->pad_id, path, err)) ||
        (rc = json_rope_scaling(cJSON_GetObjectItemCaseSensitive(o, "rope_scaling"), &c->rope_scale_global, path,
                                err)))
        goto out;
    /* transformers >= 4.56 style: rope_parameters {full_attention: {...}, sliding_attention: {...}} */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (cJSON_IsObject(rp)) {
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        const cJSON *slid = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        if (cJSON_IsObject(full)) {
            if ((rc = json_float(full, "rope_theta", &c->rope_base_global, path, err)) ||
                (rc = json_rope_scaling(full, &c->rope_scale_global, path, err)))
                goto out;
        }
        if (cJSON_IsObject(slid) && (rc = json_float(slid, "rope_theta", &c->rope_base_local, path, err))) goto out;
    }
    /* eos_token_id may be an int or a list; generation stops on 1 and 106 either way. */
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    if (cJSON_IsNumber(eos)) c->eos_id = eos->valueint;
    else if (cJSON_IsArray(eos) && cJSON_GetArraySize(eos) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(eos, 0)))
        c->eos_id = cJSON_GetArrayItem(eos, 0)->valueint;
    if (c->rope_scale_global <= 0) c->rope_scale_global = 1;
    if (c->n_layers <= 0 || c->n_layers > G3_MAX_LAYERS) {
        rc = g3_fail(err, G3_ERR_FORMAT, "%s: num_hidden_layers %d is out of range 1..%d", path, c->n_layers,
                     G3_MAX_LAYERS);
        goto out;
    }
    layers_from_pattern(c);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (cJSON_IsArray(lt)) {
        if (cJSON_GetArraySize(lt) != c->n_layers) {
            rc = g3_fail(err, G3_ERR_FORMAT, "%s: layer_types has %d entries for %d layers", path,
                         cJSON_GetArraySize(lt), c->n_layers);
            goto out;
        }
        c->sliding_pattern = 0;
        for (int i = 0; i < c->n_layers; i++) {
            const cJSON *e = cJSON_GetArrayItem(lt, i);
            if (!cJSON_IsString(e)) {
                rc = g3_fail(err, G3_ERR_FORMAT, "%s: layer_types[%d] must be a string", path, i);
                goto out;
            }
            if (!strcmp(e->valuestring, "full_attention")) c->layer_global[i] = 1;
            else if (!strcmp(e->valuestring, "sliding_attention")) c->layer_global[i] = 0;
            else {
                rc = g3_fail(err, G3_ERR_UNSUPPORTED, "%s: layer_types[%d] = \"%s\" is not supported", path, i,
                             e->valuestring);
                goto out;
            }
        }
    }
    c->embed_scale = sqrtf((float)c->hidden);
    rc = g3_config_validate(c, err);
    if (rc) g3_fail_prefix(err, "%s: ", path);
out:
    cJSON_Delete(root);
    return rc;
}

/* ---- GGUF -------------------------------------------------------------------------------------------------- */

static int gguf_i(const g3_gguf *g, const char *key, int *out) {
    int64_t v;
    if (!g3_gguf_get_int(g, key, &v) || v < -2147483647 || v > 2147483647) return 0;
    *out = (int)v;
    return 1;
}

static int gguf_f(const g3_gguf *g, const char *key, float *out) {
    double v;
    if (!g3_gguf_get_float(g, key, &v)) return 0;
    *out = (float)v;
    return 1;
}

g3_status g3_config_from_gguf(g3_config *c, const g3_gguf *g, g3_error *err) {
    config_defaults(c);
    char arch[64] = "";
    if (!g3_gguf_get_str(g, "general.architecture", arch, sizeof arch))
        return g3_fail(err, G3_ERR_FORMAT, "%s: no general.architecture", g->map.path);
    if (strcmp(arch, "gemma3") != 0)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not gemma3", g->map.path, arch);
    static const struct { const char *key; int off; } req[] = {
        {"gemma3.embedding_length", offsetof(g3_config, hidden)},
        {"gemma3.feed_forward_length", offsetof(g3_config, ffn)},
        {"gemma3.block_count", offsetof(g3_config, n_layers)},
        {"gemma3.attention.head_count", offsetof(g3_config, n_heads)},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (!gguf_i(g, req[i].key, (int *)((char *)c + req[i].off)))
            return g3_fail(err, G3_ERR_FORMAT, "%s: missing or invalid metadata key %s", g->map.path, req[i].key);
    c->n_kv_heads = c->n_heads;
    gguf_i(g, "gemma3.attention.head_count_kv", &c->n_kv_heads);
    c->head_dim = 256;
    gguf_i(g, "gemma3.attention.key_length", &c->head_dim);
    int vlen = c->head_dim;
    if (gguf_i(g, "gemma3.attention.value_length", &vlen) && vlen != c->head_dim)
        return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: key_length %d != value_length %d", g->map.path, c->head_dim,
                       vlen);
    gguf_i(g, "gemma3.context_length", &c->max_ctx);
    gguf_i(g, "gemma3.attention.sliding_window", &c->sliding_window);
    c->sliding_pattern = 6;
    gguf_i(g, "gemma3.attention.sliding_window_pattern", &c->sliding_pattern);
    gguf_f(g, "gemma3.rope.freq_base", &c->rope_base_global);
    gguf_f(g, "gemma3.rope.freq_base_swa", &c->rope_base_local);
    gguf_f(g, "gemma3.attention.layer_norm_rms_epsilon", &c->rms_eps);
    gguf_f(g, "gemma3.attn_logit_softcapping", &c->attn_softcap);
    gguf_f(g, "gemma3.final_logit_softcapping", &c->final_softcap);
    char rtype[32] = "";
    if (g3_gguf_get_str(g, "gemma3.rope.scaling.type", rtype, sizeof rtype) && strcmp(rtype, "none") != 0) {
        if (strcmp(rtype, "linear") != 0)
            return g3_fail(err, G3_ERR_UNSUPPORTED, "%s: rope scaling type \"%s\" is not supported", g->map.path,
                           rtype);
        gguf_f(g, "gemma3.rope.scaling.factor", &c->rope_scale_global);
    }
    if (c->rope_scale_global <= 0) c->rope_scale_global = 1;
    /* Attention scale: our key when present, else llama.cpp's rule (1/sqrt(head_dim), but hidden/heads for the
     * 62-layer 27B). */
    float scale = 0;
    if (gguf_f(g, "gemma3.attention.scale", &scale) && scale > 0 && isfinite(scale))
        c->query_pre_attn_scalar = 1.0f / (scale * scale);
    else if (c->n_layers == 62 && c->n_heads > 0)
        c->query_pre_attn_scalar = (float)c->hidden / (float)c->n_heads;
    else
        c->query_pre_attn_scalar = (float)c->head_dim;
    const g3_gguf_tensor *emb = g3_gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return g3_fail(err, G3_ERR_FORMAT, "%s: tensor token_embd.weight is missing or not 2-D", g->map.path);
    if (emb->ne[1] > 2147483647) return g3_fail(err, G3_ERR_FORMAT, "%s: token_embd.weight too large", g->map.path);
    c->vocab = (int)emb->ne[1];
    gguf_i(g, "tokenizer.ggml.bos_token_id", &c->bos_id);
    gguf_i(g, "tokenizer.ggml.eos_token_id", &c->eos_id);
    gguf_i(g, "tokenizer.ggml.padding_token_id", &c->pad_id);
    if (c->n_layers <= 0 || c->n_layers > G3_MAX_LAYERS)
        return g3_fail(err, G3_ERR_FORMAT, "%s: block_count %d is out of range 1..%d", g->map.path, c->n_layers,
                       G3_MAX_LAYERS);
    layers_from_pattern(c);
    /* our own per-layer list (written by gemma3 quantize) wins over the pattern */
    const g3_gguf_kv *lg = g3_gguf_find(g, "gemma3.attention.layer_global");
    if (lg) {
        if (lg->type != G3_GGUF_ARRAY || (lg->arr_type != G3_GGUF_I32 && lg->arr_type != G3_GGUF_U32) ||
            lg->arr_n != (uint64_t)c->n_layers)
            return g3_fail(err, G3_ERR_FORMAT, "%s: gemma3.attention.layer_global must be %d int32 values",
                           g->map.path, c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            int32_t v;
            memcpy(&v, lg->arr_data + 4 * (size_t)i, 4);
            c->layer_global[i] = v != 0;
        }
        c->sliding_pattern = 0;
    }
    c->embed_scale = sqrtf((float)c->hidden);
    g3_status rc = g3_config_validate(c, err);
    if (rc) g3_fail_prefix(err, "%s: ", g->map.path);
    return rc;
}

/* ---- presets ----------------------------------------------------------------------------------------------- */

typedef struct preset {
    const char *name;
    int hidden, ffn, layers, heads, kv_heads, head_dim;
    float qpas;
    int window;
    float rope_scale;
    int ctx;
} preset;

static const preset presets[] = {
    {"270m", 640, 2048, 18, 4, 1, 256, 256, 512, 1, 32768},
    {"1b", 1152, 6912, 26, 4, 1, 256, 256, 512, 1, 32768},
    {"4b", 2560, 10240, 34, 8, 4, 256, 256, 1024, 8, 131072},
    {"12b", 3840, 15360, 48, 16, 8, 256, 256, 1024, 8, 131072},
    {"27b", 5376, 21504, 62, 32, 16, 128, 168, 1024, 8, 131072},
};

g3_status g3_config_preset(g3_config *c, const char *size, g3_error *err) {
    config_defaults(c);
    if (!strcmp(size, "tiny")) { /* the tiny-gqa fixture's shape */
        c->vocab = 512, c->hidden = 64, c->ffn = 256, c->n_layers = 6, c->n_heads = 4, c->n_kv_heads = 2;
        c->head_dim = 16, c->query_pre_attn_scalar = 24, c->sliding_window = 8, c->sliding_pattern = 3;
        c->rope_scale_global = 8, c->max_ctx = 1024;
    } else {
        const preset *p = NULL;
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
            if (!strcmp(presets[i].name, size)) p = &presets[i];
        if (!p)
            return g3_fail(err, G3_ERR_ARG, "unknown model size \"%s\" (expected 270m, 1b, 4b, 12b, 27b or tiny)",
                           size);
        c->vocab = 262144, c->hidden = p->hidden, c->ffn = p->ffn, c->n_layers = p->layers;
        c->n_heads = p->heads, c->n_kv_heads = p->kv_heads, c->head_dim = p->head_dim;
        c->query_pre_attn_scalar = p->qpas, c->sliding_window = p->window, c->sliding_pattern = 6;
        c->rope_scale_global = p->rope_scale, c->max_ctx = p->ctx;
    }
    layers_from_pattern(c);
    c->embed_scale = sqrtf((float)c->hidden);
    return g3_config_validate(c, err);
}

/* ---- validation -------------------------------------------------------------------------------------------- */

g3_status g3_config_validate(g3_config *c, g3_error *err) {
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) return g3_fail(err, G3_ERR_FORMAT, __VA_ARGS__);                                                  \
    } while (0)
    CHECK(c->n_layers > 0 && c->n_layers <= G3_MAX_LAYERS, "n_layers %d out of range", c->n_layers);
    CHECK(c->hidden > 0 && c->hidden <= 65536, "hidden size %d out of range", c->hidden);
    CHECK(c->ffn > 0 && c->ffn <= 1 << 20, "intermediate size %d out of range", c->ffn);
    CHECK(c->vocab > 0 && c->vocab <= 1 << 22, "vocab size %d out of range", c->vocab);
    CHECK(c->n_heads > 0 && c->n_heads <= 1024, "head count %d out of range", c->n_heads);
    CHECK(c->n_kv_heads > 0 && c->n_kv_heads <= c->n_heads && c->n_heads % c->n_kv_heads == 0,
          "kv head count %d must divide head count %d", c->n_kv_heads, c->n_heads);
    CHECK(c->head_dim > 0 && c->head_dim <= 1024 && c->head_dim % 2 == 0, "head_dim %d out of range or odd",
          c->head_dim);
    CHECK(c->query_pre_attn_scalar > 0 && isfinite(c->query_pre_attn_scalar), "query_pre_attn_scalar %g invalid",
          (double)c->query_pre_attn_scalar);
    CHECK(c->sliding_window > 0, "sliding_window %d must be positive", c->sliding_window);
    CHECK(c->rope_base_global > 1 && c->rope_base_local > 1, "rope bases must be > 1");
    CHECK(c->rms_eps > 0 && c->rms_eps < 1, "rms_norm_eps %g out of range", (double)c->rms_eps);
    CHECK(c->attn_softcap >= 0 && c->final_softcap >= 0, "softcaps must not be negative");
    CHECK(c->max_ctx > 0, "max_position_embeddings %d must be positive", c->max_ctx);
#undef CHECK
    snprintf(c->size_name, sizeof c->size_name, "custom");
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *p = &presets[i];
        if (c->hidden == p->hidden && c->n_layers == p->layers && c->ffn == p->ffn && c->n_heads == p->heads &&
            c->n_kv_heads == p->kv_heads && c->head_dim == p->head_dim)
            snprintf(c->size_name, sizeof c->size_name, "%s", p->name);
    }
    return G3_OK;
}

void g3_config_print(const g3_config *c, void *file) {
    FILE *f = file;
    int n_global = 0;
    for (int i = 0; i < c->n_layers; i++) n_global += c->layer_global[i];
    fprintf(f, "  size                 %s\n", c->size_name);
    fprintf(f, "  vocab                %d\n", c->vocab);
    fprintf(f, "  hidden               %d\n", c->hidden);
    fprintf(f, "  ffn                  %d\n", c->ffn);
    fprintf(f, "  layers               %d (%d global, %d sliding)\n", c->n_layers, n_global, c->n_layers - n_global);
    fprintf(f, "  heads / kv heads     %d / %d\n", c->n_heads, c->n_kv_heads);
    fprintf(f, "  head_dim             %d\n", c->head_dim);
    fprintf(f, "  query_pre_attn_scalar %g (scale %.6g)\n", (double)c->query_pre_attn_scalar,
            1.0 / sqrt((double)c->query_pre_attn_scalar));
    fprintf(f, "  sliding window       %d\n", c->sliding_window);
    fprintf(f, "  global layers        ");
    for (int i = 0; i < c->n_layers; i++)
        if (c->layer_global[i]) fprintf(f, "%d ", i);
    fprintf(f, "\n");
    fprintf(f, "  rope base            global %g (linear x%g), sliding %g\n", (double)c->rope_base_global,
            (double)c->rope_scale_global, (double)c->rope_base_local);
    fprintf(f, "  rms eps              %g\n", (double)c->rms_eps);
    fprintf(f, "  softcaps             attention %g, final %g\n", (double)c->attn_softcap, (double)c->final_softcap);
    fprintf(f, "  embed scale          %g\n", (double)c->embed_scale);
    fprintf(f, "  context              %d\n", c->max_ctx);
    fprintf(f, "  bos / eos / eot      %d / %d / %d\n", c->bos_id, c->eos_id, c->eot_id);
}
