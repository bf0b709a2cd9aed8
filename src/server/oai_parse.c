/* Parsing and validation of OpenAI-style request bodies (cJSON) into g3_oai_request, and the OpenAI error body.
 * Every rejection names the field and says what was expected. Top-level fields we do not know are rejected the
 * way OpenAI rejects them ("Unrecognized request argument supplied"), except a few harmless ones we accept and
 * ignore; features we know but do not implement (tools, images, response_format json, echo, suffix) get a 400
 * that says so instead of being silently dropped. */
#include "server/oai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void g3_oai_error_set(g3_oai_error *e, int status, const char *type, const char *code, const char *param,
                      const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

void g3_oai_error_json(const g3_oai_error *e, g3_buf *out) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    g3_buf msg = {0};
    g3_utf8_sanitize(e->message, strlen(e->message), &msg); /* messages may quote client bytes */
    cJSON_AddStringToObject(err, "message", msg.data ? msg.data : "");
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    if (s) g3_buf_puts(out, s);
    else g3_buf_puts(out, "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                          "\"code\":null}}");
    free(s);
    g3_buf_free(&msg);
    cJSON_Delete(root);
}

#define SETBAD(param, ...) g3_oai_error_set(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)
#define BAD(param, ...) (SETBAD(param, __VA_ARGS__), -1)

static const char *json_type_name(const cJSON *v) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "invalid";
}

/* Each getter: 0 = absent or null (out untouched), 1 = present (out set), -1 = error (e set). */
static int get_number(const cJSON *root, const char *key, double lo, double hi, int lo_open, double *out,
                      g3_oai_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return BAD(key, "'%s' must be a number, got %s", key, json_type_name(v));
    double x = v->valuedouble;
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return BAD(key, "'%s' must be in %s%g, %g], got %g", key, lo_open ? "(" : "[", lo, hi, x);
    *out = x;
    return 1;
}

static int get_int(const cJSON *root, const char *key, long long lo, long long hi, long long *out,
                   g3_oai_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return BAD(key, "'%s' must be an integer, got %s", key, json_type_name(v));
    double x = v->valuedouble;
    if (!isfinite(x) || x != floor(x)) return BAD(key, "'%s' must be an integer, got %g", key, x);
    if (x < (double)lo || x > (double)hi)
        return BAD(key, "'%s' must be between %lld and %lld, got %.0f", key, lo, hi, x);
    *out = (long long)x;
    return 1;
}

static int get_bool(const cJSON *root, const char *key, int *out, g3_oai_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return BAD(key, "'%s' must be a boolean, got %s", key, json_type_name(v));
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 1;
}

static char *dupstr(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

#define SETOOM() g3_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory parsing the request")
#define OOM() (SETOOM(), -1)

/* ---- field tables ------------------------------------------------------------------------------------------ */
static const char *const k_common[] = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p",
                                       "top_k", "min_p", "presence_penalty", "frequency_penalty",
                                       "repetition_penalty", "seed", "stop", "n", "logprobs", "logit_bias",
                                       "user", "ignore_eos",
                                       /* accepted and ignored */
                                       "store", "metadata", "service_tier", "parallel_tool_calls", NULL};
static const char *const k_chat[] = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                                     "functions", "function_call", "response_format", "modalities", "audio",
                                     "prediction", "reasoning_effort", NULL};
static const char *const k_completion[] = {"prompt", "echo", "suffix", "best_of", NULL};
static const char *const k_tokenize[] = {"model", "prompt", "messages", "add_special_tokens",
                                         "add_generation_prompt", NULL};
static const char *const k_detokenize[] = {"model", "tokens", NULL};

static int in_list(const char *const *l, const char *k) {
    for (; l && *l; l++)
        if (strcmp(*l, k) == 0) return 1;
    return 0;
}

static int check_fields(g3_oai_kind kind, const cJSON *root, g3_oai_error *e) {
    for (const cJSON *f = root->child; f; f = f->next) {
        const char *k = f->string ? f->string : "";
        int ok;
        switch (kind) {
        case G3_OAI_CHAT: ok = in_list(k_common, k) || in_list(k_chat, k); break;
        case G3_OAI_COMPLETION: ok = in_list(k_common, k) || in_list(k_completion, k); break;
        case G3_OAI_TOKENIZE: ok = in_list(k_tokenize, k); break;
        default: ok = in_list(k_detokenize, k); break;
        }
        if (!ok) return BAD(k, "Unrecognized request argument supplied: %s", k);
    }
    return 0;
}

/* Features we know but do not implement: refuse rather than silently ignore. */
static int check_unsupported(g3_oai_kind kind, const cJSON *root, g3_oai_error *e) {
    const cJSON *v;
    if (kind == G3_OAI_CHAT) {
        v = cJSON_GetObjectItemCaseSensitive(root, "tools");
        if (v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
            return BAD("tools", "tool calling is not supported by this server");
        v = cJSON_GetObjectItemCaseSensitive(root, "functions");
        if (v && !cJSON_IsNull(v)) return BAD("functions", "function calling is not supported by this server");
        v = cJSON_GetObjectItemCaseSensitive(root, "function_call");
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0))
            return BAD("function_call", "function calling is not supported by this server");
        v = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
        if (v && !cJSON_IsNull(v) &&
            !(cJSON_IsString(v) && (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto"))))
            return BAD("tool_choice", "tool calling is not supported by this server");
        v = cJSON_GetObjectItemCaseSensitive(root, "response_format");
        if (v && !cJSON_IsNull(v)) {
            const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
            if (!cJSON_IsString(t)) return BAD("response_format", "'response_format' must be {\"type\": \"text\"}");
            if (strcmp(t->valuestring, "text") != 0)
                return BAD("response_format", "response_format type '%s' is not supported (only 'text')",
                           t->valuestring);
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "modalities");
        if (v && !cJSON_IsNull(v)) {
            if (!cJSON_IsArray(v)) return BAD("modalities", "'modalities' must be an array of strings");
            for (const cJSON *m = v->child; m; m = m->next)
                if (!cJSON_IsString(m) || strcmp(m->valuestring, "text") != 0)
                    return BAD("modalities", "only the 'text' modality is supported");
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "audio");
        if (v && !cJSON_IsNull(v)) return BAD("audio", "audio output is not supported");
        v = cJSON_GetObjectItemCaseSensitive(root, "prediction");
        if (v && !cJSON_IsNull(v)) return BAD("prediction", "predicted outputs are not supported");
        v = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
        if (v && !cJSON_IsNull(v)) return BAD("reasoning_effort", "'reasoning_effort' is not supported by this model");
    } else if (kind == G3_OAI_COMPLETION) {
        int echo = 0;
        if (get_bool(root, "echo", &echo, e) < 0) return -1;
        if (echo) return BAD("echo", "'echo' is not supported by this server");
        v = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && v->valuestring[0] == 0))
            return BAD("suffix", "'suffix' (insertion) is not supported by this model");
        long long best_of = 1;
        if (get_int(root, "best_of", 1, G3_SRV_MAX_N, &best_of, e) < 0) return -1;
        if (best_of != 1) return BAD("best_of", "'best_of' other than 1 is not supported; use 'n'");
    }
    return 0;
}

/* ---- messages ---------------------------------------------------------------------------------------------- */
static int parse_content(const cJSON *c, int idx, g3_buf *out, g3_oai_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    if (cJSON_IsString(c)) {
        g3_buf_puts(out, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return BAD(param, "'%s' must be a string or an array of content parts, got %s", param, json_type_name(c));
    int k = 0;
    for (const cJSON *p = c->child; p; p = p->next, k++) {
        const cJSON *type = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "type") : NULL;
        if (!cJSON_IsString(type))
            return BAD(param, "'%s[%d]' must be an object with a string 'type'", param, k);
        if (strcmp(type->valuestring, "text") != 0)
            return BAD(param, "content part type '%s' in '%s[%d]' is not supported (text only)", type->valuestring,
                       param, k);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(text)) return BAD(param, "'%s[%d].text' must be a string", param, k);
        g3_buf_puts(out, text->valuestring);
    }
    return 0;
}

static int parse_messages(const cJSON *root, g3_oai_request *r, g3_oai_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs || cJSON_IsNull(msgs)) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD("messages", "'messages' must be an array, got %s", json_type_name(msgs));
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return BAD("messages", "'messages' must contain at least one message");
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs) return OOM();
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return BAD(param, "'%s' must be an object, got %s", param, json_type_name(m));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) return BAD(param, "'%s' must be a string", param);
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            if (!strcmp(rs, "tool") || !strcmp(rs, "function"))
                return BAD(param, "role '%s' in '%s' is not supported (no tool calling)", rs, param);
            return BAD(param, "'%s' must be one of 'system', 'developer', 'user', 'assistant', got '%s'", param, rs);
        }
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (tc && !cJSON_IsNull(tc) && !(cJSON_IsArray(tc) && cJSON_GetArraySize(tc) == 0))
            return BAD(param, "'messages[%d].tool_calls': tool calling is not supported", i);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        g3_buf text = {0};
        g3_buf_puts(&text, "");
        if (!content || cJSON_IsNull(content)) {
            if (strcmp(rs, "assistant") != 0) {
                g3_buf_free(&text);
                snprintf(param, sizeof param, "messages[%d].content", i);
                return BAD(param, "'%s' is required for role '%s'", param, rs);
            }
        } else if (parse_content(content, i, &text, e) < 0) {
            g3_buf_free(&text);
            return -1;
        }
        if (text.oom) {
            g3_buf_free(&text);
            return OOM();
        }
        /* static strings: valid after the JSON tree is freed */
        r->msgs[i].role = !strcmp(rs, "system") ? "system" : !strcmp(rs, "user") ? "user" : "assistant";
        r->msgs[i].content = text.data;
        r->n_msgs = i + 1;
    }
    return 0;
}

/* ---- prompt / ids ------------------------------------------------------------------------------------------- */
static int parse_ids(const cJSON *arr, const char *param, int vocab, g3_oai_request *r, g3_oai_error *e) {
    int n = cJSON_GetArraySize(arr);
    r->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *r->ids);
    if (!r->ids) return OOM();
    int i = 0;
    for (const cJSON *v = arr->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
            return BAD(param, "'%s[%d]' must be an integer token id, got %s", param, i, json_type_name(v));
        if (v->valuedouble < 0 || v->valuedouble >= vocab)
            return BAD(param, "token id %.0f at '%s[%d]' is out of range [0, %d)", v->valuedouble, param, i, vocab);
        r->ids[i] = (int32_t)v->valuedouble;
    }
    r->n_ids = n;
    return 0;
}

static int parse_prompt(const cJSON *root, int vocab, g3_oai_request *r, g3_oai_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p || cJSON_IsNull(p)) return BAD("prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child; /* a batch of one */
    if (cJSON_IsString(p)) {
        r->prompt = dupstr(p->valuestring);
        return r->prompt ? 0 : OOM();
    }
    if (cJSON_IsArray(p)) {
        if (cJSON_GetArraySize(p) == 0) return BAD("prompt", "'prompt' must not be empty");
        if (cJSON_IsString(p->child) || cJSON_IsArray(p->child))
            return BAD("prompt", "batched prompts are not supported; send one request per prompt");
        return parse_ids(p, "prompt", vocab, r, e);
    }
    return BAD("prompt", "'prompt' must be a string or an array of token ids, got %s", json_type_name(p));
}

/* ---- sampling and generation fields ------------------------------------------------------------------------ */
static int parse_stop(const cJSON *root, g3_oai_request *r, g3_oai_error *e) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!s || cJSON_IsNull(s)) return 0;
    const cJSON *one = cJSON_IsString(s) ? s : NULL;
    if (!one && !cJSON_IsArray(s))
        return BAD("stop", "'stop' must be a string or an array of strings, got %s", json_type_name(s));
    if (!one && cJSON_GetArraySize(s) > G3_SRV_MAX_STOPS)
        return BAD("stop", "'stop' may hold at most %d strings", G3_SRV_MAX_STOPS);
    for (const cJSON *v = one ? one : s->child; v; v = one ? NULL : v->next) {
        if (!cJSON_IsString(v)) return BAD("stop", "'stop' entries must be strings, got %s", json_type_name(v));
        if (!v->valuestring[0]) return BAD("stop", "'stop' strings must not be empty");
        if (strlen(v->valuestring) > 256) return BAD("stop", "'stop' strings must be at most 256 bytes");
        if (!(r->stops[r->n_stops] = dupstr(v->valuestring))) return OOM();
        r->n_stops++;
    }
    return 0;
}

static int parse_logit_bias(const cJSON *root, int vocab, g3_oai_request *r, g3_oai_error *e) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb))
        return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to numbers, got %s",
                   json_type_name(lb));
    int n = cJSON_GetArraySize(lb);
    if (n > 1024) return BAD("logit_bias", "'logit_bias' may hold at most 1024 entries");
    if (!n) return 0;
    r->lb = calloc((size_t)n, sizeof *r->lb);
    if (!r->lb) return OOM();
    for (const cJSON *v = lb->child; v; v = v->next) {
        char *end = NULL;
        long id = strtol(v->string, &end, 10);
        if (!v->string[0] || *end || id < 0 || id >= vocab)
            return BAD("logit_bias", "'logit_bias' key '%s' is not a token id in [0, %d)", v->string, vocab);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < -100 || v->valuedouble > 100)
            return BAD("logit_bias", "'logit_bias' value for token %ld must be a number in [-100, 100]", id);
        r->lb[r->n_lb++] = (g3_logit_bias){(int32_t)id, (float)v->valuedouble};
    }
    r->sampling.logit_bias = r->lb;
    r->sampling.n_logit_bias = r->n_lb;
    return 0;
}

static int parse_generation(g3_oai_kind kind, const cJSON *root, const g3_sampling *defaults, int vocab,
                            g3_oai_request *r, g3_oai_error *e) {
    double d;
    long long ll;
    int rc;
    r->sampling = *defaults;
    r->sampling.logit_bias = NULL;
    r->sampling.n_logit_bias = 0;
    r->sampling.n_logprobs = 0;
    r->n = 1;
    if (get_bool(root, "stream", &r->stream, e) < 0) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (!r->stream) return BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
        if (get_bool(so, "include_usage", &r->include_usage, e) < 0) return -1;
    }
    if ((rc = get_int(root, "max_tokens", 1, 1 << 30, &ll, e)) < 0) return -1;
    if (rc) r->max_tokens = (int)ll;
    if (kind == G3_OAI_CHAT) {
        if ((rc = get_int(root, "max_completion_tokens", 1, 1 << 30, &ll, e)) < 0) return -1;
        if (rc) r->max_tokens = (int)ll;
    }
    if ((rc = get_number(root, "temperature", 0, 2, 0, &d, e)) < 0) return -1;
    if (rc) r->sampling.temperature = (float)d;
    if ((rc = get_number(root, "top_p", 0, 1, 1, &d, e)) < 0) return -1;
    if (rc) r->sampling.top_p = (float)d;
    if ((rc = get_int(root, "top_k", -1, 1 << 30, &ll, e)) < 0) return -1;
    if (rc) r->sampling.top_k = ll < 0 ? 0 : (int)ll;
    if ((rc = get_number(root, "min_p", 0, 1, 0, &d, e)) < 0) return -1;
    if (rc) r->sampling.min_p = (float)d;
    if ((rc = get_number(root, "presence_penalty", -2, 2, 0, &d, e)) < 0) return -1;
    if (rc) r->sampling.presence_penalty = (float)d;
    if ((rc = get_number(root, "frequency_penalty", -2, 2, 0, &d, e)) < 0) return -1;
    if (rc) r->sampling.frequency_penalty = (float)d;
    if ((rc = get_number(root, "repetition_penalty", 0, 10, 1, &d, e)) < 0) return -1;
    if (rc) r->sampling.repetition_penalty = (float)d;
    if ((rc = get_int(root, "seed", -(1LL << 53), 1LL << 53, &ll, e)) < 0) return -1;
    if (rc) {
        r->sampling.seed = (uint64_t)ll;
        r->seed_given = 1;
    }
    if ((rc = get_int(root, "n", 1, G3_SRV_MAX_N, &ll, e)) < 0) return -1;
    if (rc) r->n = (int)ll;
    if (kind == G3_OAI_CHAT) {
        if (get_bool(root, "logprobs", &r->logprobs, e) < 0) return -1;
        if ((rc = get_int(root, "top_logprobs", 0, 20, &ll, e)) < 0) return -1;
        if (rc) {
            if (!r->logprobs) return BAD("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
            r->top_logprobs = (int)ll;
        }
    } else {
        if ((rc = get_int(root, "logprobs", 0, 20, &ll, e)) < 0) return -1;
        if (rc) {
            r->logprobs = 1;
            r->top_logprobs = (int)ll;
        }
    }
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) return -1;
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (user && !cJSON_IsNull(user) && !cJSON_IsString(user))
        return BAD("user", "'user' must be a string, got %s", json_type_name(user));
    if (parse_stop(root, r, e) < 0) return -1;
    return parse_logit_bias(root, vocab, r, e);
}

/* Byte offset of the first \u0000 escape inside a JSON string of a (valid) body, or -1. cJSON hands strings over as
 * C strings, so a NUL would silently cut a prompt short: such requests are refused instead. */
static long nul_escape_at(const char *b, size_t len) {
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        if (b[i] == '"') in_str = !in_str;
        else if (in_str && b[i] == '\\' && i + 1 < len) {
            if (b[i + 1] == 'u' && i + 5 < len && b[i + 2] == '0' && b[i + 3] == '0' && b[i + 4] == '0' && b[i + 5] == '0')
                return (long)i;
            i++; /* the escaped character (an escaped quote does not end the string) */
        }
    }
    return -1;
}

int g3_oai_parse(g3_oai_kind kind, const char *body, size_t len, const g3_sampling *defaults, int vocab,
                 g3_oai_request *r, g3_oai_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->add_special = 1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t off = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return BAD(NULL, "the request body is not valid JSON (parse error at byte %zu of %zu)", off, len);
    }
    /* Anything but whitespace after the value is an error too. */
    const char *p = end;
    while (p && p < body + len && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
    int rc = -1;
    if (p && p < body + len) {
        SETBAD(NULL, "the request body is not valid JSON (unexpected data at byte %zu)", (size_t)(p - body));
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        SETBAD(NULL, "the request body must be a JSON object, got %s", json_type_name(root));
        goto out;
    }
    long nul = nul_escape_at(body, len);
    if (nul >= 0) {
        SETBAD(NULL, "the request has a NUL character (\\u0000) in a string at byte %ld; NUL is not supported in "
                     "prompts or parameters", nul);
        goto out;
    }
    if (check_fields(kind, root, e) < 0 || check_unsupported(kind, root, e) < 0) goto out;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) {
            SETBAD("model", "'model' must be a string, got %s", json_type_name(model));
            goto out;
        }
        if (!(r->model = dupstr(model->valuestring))) {
            SETOOM();
            goto out;
        }
    }
    switch (kind) {
    case G3_OAI_CHAT:
        if (parse_messages(root, r, e) < 0 || parse_generation(kind, root, defaults, vocab, r, e) < 0) goto out;
        break;
    case G3_OAI_COMPLETION:
        if (parse_prompt(root, vocab, r, e) < 0 || parse_generation(kind, root, defaults, vocab, r, e) < 0) goto out;
        break;
    case G3_OAI_TOKENIZE: {
        int has_p = cJSON_GetObjectItemCaseSensitive(root, "prompt") != NULL;
        int has_m = cJSON_GetObjectItemCaseSensitive(root, "messages") != NULL;
        if (has_p == has_m) {
            SETBAD(NULL, "give exactly one of 'prompt' or 'messages'");
            goto out;
        }
        if (get_bool(root, "add_special_tokens", &r->add_special, e) < 0) goto out;
        int agp = 1;
        if (get_bool(root, "add_generation_prompt", &agp, e) < 0) goto out;
        if (has_m && !agp) {
            SETBAD("add_generation_prompt", "'add_generation_prompt': false is not supported");
            goto out;
        }
        if (has_p ? parse_prompt(root, vocab, r, e) < 0 : parse_messages(root, r, e) < 0) goto out;
        break;
    }
    case G3_OAI_DETOKENIZE: {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
        if (!cJSON_IsArray(t)) {
            SETBAD("tokens", "'tokens' must be an array of token ids");
            goto out;
        }
        if (parse_ids(t, "tokens", vocab, r, e) < 0) goto out;
        break;
    }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc < 0) g3_oai_request_free(r);
    return rc;
}

void g3_oai_request_free(g3_oai_request *r) {
    if (!r) return;
    for (int i = 0; i < r->n_msgs; i++) free((void *)r->msgs[i].content);
    free(r->msgs);
    free(r->model);
    free(r->prompt);
    free(r->ids);
    free(r->lb);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}
