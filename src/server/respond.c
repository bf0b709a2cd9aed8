/* Channel -> text -> OpenAI JSON for one generation request (see respond.h). */
#include "server/respond.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

void g3_resp_error_from_status(g3_status st, const char *msg, g3_oai_error *e) {
    switch (st) {
    case G3_ERR_ARG: g3_oai_error_set(e, 400, "invalid_request_error", NULL, NULL, "%s", msg); break;
    case G3_ERR_FULL: g3_oai_error_set(e, 429, "requests", "rate_limit_exceeded", NULL, "%s", msg); break;
    case G3_ERR_CANCELLED:
        g3_oai_error_set(e, 503, "server_error", "shutting_down", NULL, "the request was cancelled: %s", msg);
        break;
    default: g3_oai_error_set(e, 500, "server_error", NULL, NULL, "%s", msg); break;
    }
}

g3_resp *g3_resp_create(const g3_srv_ops *ops, g3_worker *w, g3_srv_job *job, g3_oai_request *rq,
                        const char *model) {
    g3_resp *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->ch = calloc((size_t)job->n_choices, sizeof *r->ch);
    if (!r->ch) {
        free(r);
        return NULL;
    }
    r->ops = ops;
    r->worker = w;
    r->job = job;
    atomic_fetch_add(&job->refs, 1);
    r->kind = rq->kind;
    r->stream = rq->stream;
    r->include_usage = rq->include_usage;
    r->logprobs = rq->logprobs;
    r->top_logprobs = rq->top_logprobs;
    r->model = model;
    r->n_stops = rq->n_stops;
    memcpy(r->stops, rq->stops, sizeof r->stops);
    rq->n_stops = 0;
    unsigned char rnd[12];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t x = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)r;
        memcpy(rnd, &x, 8);
        memset(rnd + 8, 0, 4);
    }
    int k = snprintf(r->id, sizeof r->id, "%s", r->kind == G3_OAI_CHAT ? "chatcmpl-" : "cmpl-");
    for (int i = 0; i < 12; i++) k += snprintf(r->id + k, sizeof r->id - (size_t)k, "%02x", rnd[i]);
    r->created = (long long)time(NULL);
    for (int i = 0; i < job->n_choices; i++) {
        g3_textstream_init(&r->ch[i].ts, (const char *const *)r->stops, r->n_stops);
        r->ch[i].detok = ops->detok_create(ops->ctx);
        if (!r->ch[i].detok) {
            g3_resp_free(r);
            return NULL;
        }
    }
    return r;
}

void g3_resp_free(g3_resp *r) {
    if (!r) return;
    for (int i = 0; i < r->job->n_choices; i++) {
        if (r->ch[i].detok) r->ops->detok_free(r->ops->ctx, r->ch[i].detok);
        g3_textstream_deinit(&r->ch[i].ts);
        g3_buf_free(&r->ch[i].text);
        cJSON_Delete(r->ch[i].lp);
    }
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    g3_buf_free(&r->out);
    g3_job_unref(r->job);
    free(r->ch);
    free(r);
}

/* ---- JSON pieces ------------------------------------------------------------------------------------------- */
/* Generated text may hold NUL bytes (a <0x00> piece), which C strings and cJSON cannot carry. Text goes into the JSON
 * with each NUL replaced by the byte 0xFF, which never occurs in the (repaired, valid UTF-8) text, and the printed
 * JSON gets "\u0000" back in its place: the client sees exactly the bytes the model produced. */
void g3_json_nul_marker(char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] == 0) p[i] = (char)0xFF;
}

void g3_json_put(g3_buf *out, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    if (!s) {
        out->oom = 1;
        return;
    }
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p == 0xFF) g3_buf_puts(out, "\\u0000");
        else g3_buf_append(out, p, 1);
    }
    free(s);
}

static void add_token_text(cJSON *o, const char *key, const char *p, size_t n) {
    g3_buf b = {0};
    g3_utf8_sanitize(p, n, &b);
    if (b.data) g3_json_nul_marker(b.data, b.len);
    cJSON_AddStringToObject(o, key, b.data ? b.data : "");
    g3_buf_free(&b);
}

static cJSON *bytes_array(const char *p, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

/* Chat: one entry of logprobs.content. */
static cJSON *chat_lp_entry(const g3_resp *r, const g3_srv_tok *t, const g3_token_logprob *top, int n_top) {
    size_t n;
    const char *p = r->ops->token_piece(r->ops->ctx, t->token, &n);
    cJSON *o = cJSON_CreateObject();
    add_token_text(o, "token", p, n);
    cJSON_AddNumberToObject(o, "logprob", t->logprob);
    cJSON_AddItemToObject(o, "bytes", bytes_array(p, n));
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int i = 0; i < n_top && i < r->top_logprobs; i++) {
        if (top[i].token < 0) break;
        size_t m;
        const char *q = r->ops->token_piece(r->ops->ctx, top[i].token, &m);
        cJSON *x = cJSON_CreateObject();
        add_token_text(x, "token", q, m);
        cJSON_AddNumberToObject(x, "logprob", top[i].logprob);
        cJSON_AddItemToObject(x, "bytes", bytes_array(q, m));
        cJSON_AddItemToArray(tops, x);
    }
    return o;
}

/* Completions: appends one token to the {tokens, token_logprobs, top_logprobs, text_offset} object. */
static void completion_lp_add(const g3_resp *r, cJSON *lp, const g3_srv_tok *t, const g3_token_logprob *top,
                              int n_top, size_t offset) {
    size_t n;
    const char *p = r->ops->token_piece(r->ops->ctx, t->token, &n);
    g3_buf b = {0};
    g3_utf8_sanitize(p, n, &b);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "tokens"), cJSON_CreateString(b.data ? b.data : ""));
    g3_buf_free(&b);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs"), cJSON_CreateNumber(t->logprob));
    cJSON *m = cJSON_CreateObject();
    for (int i = 0; i < n_top && i < r->top_logprobs; i++) {
        if (top[i].token < 0) break;
        size_t k;
        const char *q = r->ops->token_piece(r->ops->ctx, top[i].token, &k);
        g3_buf c = {0};
        g3_utf8_sanitize(q, k, &c);
        if (!cJSON_GetObjectItemCaseSensitive(m, c.data ? c.data : ""))
            cJSON_AddNumberToObject(m, c.data ? c.data : "", top[i].logprob);
        g3_buf_free(&c);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs"), m);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *new_lp(g3_oai_kind kind) {
    cJSON *lp = cJSON_CreateObject();
    if (kind == G3_OAI_CHAT) {
        cJSON_AddArrayToObject(lp, "content");
    } else {
        cJSON_AddArrayToObject(lp, "tokens");
        cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON_AddArrayToObject(lp, "top_logprobs");
        cJSON_AddArrayToObject(lp, "text_offset");
    }
    return lp;
}

static cJSON *usage_json(const g3_resp *r) {
    int completion = 0;
    for (int i = 0; i < r->job->n_choices; i++) completion += r->ch[i].n_completion;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->job->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", r->job->n_prompt + completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->n_cached);
    return u;
}

static cJSON *envelope(const g3_resp *r, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object",
                            r->kind == G3_OAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                   : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    return o;
}

static void emit(g3_resp *r, cJSON *o) {
    g3_buf_puts(&r->out, "data: ");
    g3_json_put(&r->out, o);
    g3_buf_puts(&r->out, "\n\n");
    cJSON_Delete(o);
}

/* One streamed chunk for choice i: text delta (may be NULL), logprobs (taken; may be NULL), finish (may be NULL). */
static void emit_chunk(g3_resp *r, int i, const char *text, int role, cJSON *lp, const char *finish) {
    cJSON *o = envelope(r, 1);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", i);
    if (r->kind == G3_OAI_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (r->include_usage) cJSON_AddNullToObject(o, "usage");
    emit(r, o);
}

/* ---- pump -------------------------------------------------------------------------------------------------- */
typedef struct snap {
    g3_srv_tok *toks;
    g3_token_logprob *tops;
    int n;
    g3_finish finish;
    g3_status code;
    char msg[256];
} snap;

int g3_resp_started(g3_resp *r) {
    g3_srv_job *j = r->job;
    int started = 0;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].n_toks > 0 || j->choices[i].finish != G3_FINISH_NONE) started = 1;
    pthread_mutex_unlock(&j->mu);
    return started;
}

static void choice_fail(g3_resp *r, int i, g3_status code, const char *msg) {
    g3_resp_choice *c = &r->ch[i];
    c->failed = 1;
    if (!r->failed) {
        r->failed = 1;
        g3_resp_error_from_status(code, msg, &r->err);
    }
    if (r->stream) {
        g3_oai_error e;
        g3_resp_error_from_status(code, msg, &e);
        g3_buf_puts(&r->out, "data: ");
        g3_oai_error_json(&e, &r->out);
        g3_buf_puts(&r->out, "\n\n");
    }
}

int g3_resp_pump(g3_resp *r) {
    g3_srv_job *j = r->job;
    int nc = j->n_choices, ntop = j->n_top;
    if (r->done) return 1;
    if (r->stream && r->kind == G3_OAI_CHAT && !r->role_sent) {
        /* first call: the role chunk of every choice, as OpenAI sends it */
        for (int i = 0; i < nc; i++) emit_chunk(r, i, "", 1, NULL, NULL);
        r->role_sent = 1;
    }
    for (int i = 0; i < nc; i++) {
        g3_resp_choice *c = &r->ch[i];
        if (c->finished) continue;
        snap s = {0};
        pthread_mutex_lock(&j->mu);
        g3_srv_choice *q = &j->choices[i];
        s.n = q->n_toks - c->read;
        if (s.n > 0) {
            s.toks = malloc((size_t)s.n * sizeof *s.toks);
            s.tops = ntop ? malloc((size_t)s.n * (size_t)ntop * sizeof *s.tops) : NULL;
            if (s.toks) memcpy(s.toks, q->toks + c->read, (size_t)s.n * sizeof *s.toks);
            if (s.tops)
                memcpy(s.tops, q->tops + (size_t)c->read * (size_t)ntop, (size_t)s.n * (size_t)ntop * sizeof *s.tops);
        }
        s.finish = q->finish;
        s.code = q->err_code;
        memcpy(s.msg, q->err_msg, sizeof s.msg);
        if (i == 0) r->n_cached = q->n_cached;
        pthread_mutex_unlock(&j->mu);
        if (s.n > 0 && (!s.toks || (ntop && !s.tops))) {
            free(s.toks);
            free(s.tops);
            continue; /* out of memory: try again at the next pump */
        }
        g3_buf delta = {0};
        g3_buf_puts(&delta, "");
        cJSON *lp = r->logprobs ? (r->stream || !c->lp ? new_lp(r->kind) : c->lp) : NULL;
        if (!r->stream && r->logprobs) c->lp = lp;
        int stopped = 0;
        for (int k = 0; k < s.n && !stopped; k++) {
            size_t tl = 0;
            int32_t tok = s.toks[k].token;
            /* end-of-generation tokens have no text (they still count as completion tokens). Not only when the
             * finish is already known: the engine thread may publish the token one pump before the finish. */
            int last_eog = r->ops->is_eog(r->ops->ctx, tok);
            const char *tx = last_eog ? "" : r->ops->detok_push(r->ops->ctx, c->detok, tok, &tl);
            size_t before = c->text_len + delta.len;
            c->n_completion++;
            stopped = g3_textstream_push(&c->ts, tx, tl, &delta);
            if (lp) {
                const g3_token_logprob *top = s.tops ? s.tops + (size_t)k * (size_t)ntop : NULL;
                if (r->kind == G3_OAI_CHAT)
                    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "content"),
                                         chat_lp_entry(r, &s.toks[k], top, ntop));
                else
                    completion_lp_add(r, lp, &s.toks[k], top, ntop, before);
            }
        }
        c->read += s.n;
        const char *finish = NULL;
        if (stopped) {
            finish = "stop";
            g3_worker_stop_choice(r->worker, &j->choices[i]);
        } else if (s.finish != G3_FINISH_NONE) {
            if (s.finish == G3_FINISH_STOP || s.finish == G3_FINISH_LENGTH) {
                size_t tl = 0;
                const char *tx = r->ops->detok_flush(r->ops->ctx, c->detok, &tl);
                int hit = g3_textstream_push(&c->ts, tx, tl, &delta);
                if (!hit) g3_textstream_flush(&c->ts, &delta);
                finish = hit || s.finish == G3_FINISH_STOP ? "stop" : "length";
            } else if (s.finish == G3_FINISH_CANCELLED) {
                choice_fail(r, i, G3_ERR_CANCELLED, "the server is shutting down");
            } else {
                choice_fail(r, i, s.code ? s.code : G3_ERR_DEVICE, s.msg[0] ? s.msg : "engine failure");
            }
        }
        free(s.toks);
        free(s.tops);
        if (delta.data) g3_json_nul_marker(delta.data, delta.len);
        c->text_len += delta.len;
        if (r->stream) {
            int has_lp = lp && (r->kind == G3_OAI_CHAT
                                    ? cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lp, "content")) > 0
                                    : cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lp, "tokens")) > 0);
            if (delta.len || has_lp) {
                emit_chunk(r, i, delta.data, 0, has_lp ? lp : NULL, NULL);
                if (has_lp) lp = NULL;
            }
            cJSON_Delete(lp);
            if (finish) emit_chunk(r, i, r->kind == G3_OAI_CHAT ? NULL : "", 0, NULL, finish);
        } else {
            g3_buf_append(&c->text, delta.data, delta.len);
        }
        g3_buf_free(&delta);
        if (finish || c->failed) {
            c->finished = 1;
            c->finish_reason = finish;
            r->n_finished++;
        }
    }
    if (r->n_finished < nc) return 0;
    if (r->stream) {
        if (r->include_usage && !r->failed) {
            cJSON *o = envelope(r, 1);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(r));
            emit(r, o);
        }
        g3_buf_puts(&r->out, "data: [DONE]\n\n");
    }
    r->done = 1;
    return 1;
}

int g3_resp_final(g3_resp *r, g3_buf *body, g3_oai_error *e) {
    if (r->failed) {
        *e = r->err;
        return 0;
    }
    cJSON *o = envelope(r, 0);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < r->job->n_choices; i++) {
        g3_resp_choice *c = &r->ch[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "index", i);
        if (r->kind == G3_OAI_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(x, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", c->text.data ? c->text.data : "");
        } else {
            cJSON_AddStringToObject(x, "text", c->text.data ? c->text.data : "");
        }
        if (c->lp) {
            cJSON_AddItemToObject(x, "logprobs", c->lp);
            c->lp = NULL;
        } else {
            cJSON_AddNullToObject(x, "logprobs");
        }
        cJSON_AddStringToObject(x, "finish_reason", c->finish_reason ? c->finish_reason : "stop");
        cJSON_AddItemToArray(choices, x);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(r));
    g3_json_put(body, o);
    cJSON_Delete(o);
    if (body->oom) {
        g3_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory writing the response");
        return 0;
    }
    return 1;
}
