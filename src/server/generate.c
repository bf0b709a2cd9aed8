/* The generation endpoints (POST /v1/chat/completions, /v1/completions) and /tokenize, /detokenize, on a
 * connection thread: validate, render and tokenize the prompt, check it against the context, hand a job to the
 * engine thread, then either wait for the whole answer or stream it as server-sent events from MHD's content
 * reader callback. A client that hangs up is noticed by polling its socket while we wait. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define WAIT_SLICE_MS 50      /* how often a waiting connection thread looks at its socket */
#define KEEPALIVE_S 15.0      /* SSE comment after this long without output */

static unsigned job_seq(g3_srv_job *j) {
    pthread_mutex_lock(&j->mu);
    unsigned s = j->seq;
    pthread_mutex_unlock(&j->mu);
    return s;
}

/* Prompt ids for a request: rendered chat, or BOS + tokenized text, or the ids given. */
static int prompt_ids(g3_server *s, g3_oai_request *rq, int add_bos, int32_t **ids, int *n, g3_oai_error *e) {
    g3_error err = {0};
    g3_status st;
    *ids = NULL;
    *n = 0;
    if (rq->msgs) {
        st = s->ops.chat_tokens(s->ops.ctx, rq->msgs, rq->n_msgs, ids, n, &err);
        if (st != G3_OK) {
            if (st == G3_ERR_ARG) g3_oai_error_set(e, 400, "invalid_request_error", NULL, "messages", "%s", err.msg);
            else g3_resp_error_from_status(st, err.msg, e);
            return -1;
        }
        return 0;
    }
    if (!rq->prompt) { /* ids given */
        *ids = rq->ids;
        *n = rq->n_ids;
        rq->ids = NULL;
        rq->n_ids = 0;
        return 0;
    }
    int32_t *t = NULL;
    int nt = 0;
    st = s->ops.tokenize(s->ops.ctx, rq->prompt, strlen(rq->prompt), 1, &t, &nt, &err);
    if (st != G3_OK) {
        if (st == G3_ERR_ARG) g3_oai_error_set(e, 400, "invalid_request_error", NULL, "prompt", "%s", err.msg);
        else g3_resp_error_from_status(st, err.msg, e);
        return -1;
    }
    int bos = add_bos && !(nt > 0 && t[0] == s->ops.bos_id); /* no second BOS when the text starts with one */
    int32_t *out = malloc((size_t)(nt + bos) * sizeof *out + 1);
    if (!out) {
        free(t);
        g3_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory tokenizing the prompt");
        return -1;
    }
    if (bos) out[0] = s->ops.bos_id;
    if (nt) memcpy(out + bos, t, (size_t)nt * sizeof *t);
    free(t);
    *ids = out;
    *n = nt + bos;
    return 0;
}

/* ---- streaming ----------------------------------------------------------------------------------------------- */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    g3_conn *c = cls;
    g3_resp *r = c->resp;
    for (;;) {
        if (r->out.len) {
            /* a client that hung up is noticed here, at its next token, not only when a write fails */
            if (g3_srv_peer_gone(c)) return MHD_CONTENT_READER_END_WITH_ERROR;
            size_t n = r->out.len < max ? r->out.len : max;
            memcpy(buf, r->out.data, n);
            g3_buf_consume(&r->out, n);
            c->last_write = g3_srv_now();
            return (ssize_t)n;
        }
        if (r->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (r->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        unsigned seq = job_seq(r->job);
        g3_resp_pump(r);
        if (r->out.len || r->done) continue;
        if (g3_srv_peer_gone(c)) return MHD_CONTENT_READER_END_WITH_ERROR; /* completed callback cancels */
        if (g3_srv_now() - c->last_write > KEEPALIVE_S) {
            g3_buf_puts(&r->out, ": keep-alive\n\n");
            continue;
        }
        g3_job_wait(r->job, seq, WAIT_SLICE_MS);
    }
}

static enum MHD_Result start_stream(struct MHD_Connection *mc, g3_conn *c) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, c, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    c->last_write = g3_srv_now();
    enum MHD_Result ret = MHD_queue_response(mc, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    c->status = 200;
    g3_metrics_response(&c->s->metrics, 200);
    return ret;
}

/* The job's error when every choice ended without a token (decided before any byte is sent). */
static int failed_before_start(g3_srv_job *j, g3_oai_error *e) {
    int failed = 1;
    g3_status code = G3_OK;
    char msg[256] = "";
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_choices; i++) {
        g3_srv_choice *q = &j->choices[i];
        if (q->n_toks > 0 || q->finish == G3_FINISH_NONE || q->finish == G3_FINISH_STOP ||
            q->finish == G3_FINISH_LENGTH) {
            failed = 0;
        } else if (code == G3_OK) {
            code = q->finish == G3_FINISH_CANCELLED ? G3_ERR_CANCELLED : (q->err_code ? q->err_code : G3_ERR_DEVICE);
            memcpy(msg, q->err_msg, sizeof msg);
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (failed) g3_resp_error_from_status(code, msg[0] ? msg : "the server is shutting down", e);
    return failed;
}

enum MHD_Result g3_srv_generate(struct MHD_Connection *mc, g3_conn *c) {
    g3_server *s = c->s;
    g3_oai_kind kind = c->route == R_CHAT ? G3_OAI_CHAT : G3_OAI_COMPLETION;
    g3_oai_request rq;
    g3_oai_error e;
    if (g3_oai_parse(kind, c->body.data ? c->body.data : "", c->body.len, &s->o.defaults, s->ops.vocab, &rq, &e) < 0)
        return g3_srv_send_error(mc, c, &e);
    g3_buf_free(&c->body);
    int32_t *ids = NULL;
    int n = 0;
    enum MHD_Result ret;
    if (rq.model && strcmp(rq.model, s->model_name) != 0) {
        g3_oai_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model '%.200s' does not exist; this server serves '%s'", rq.model, s->model_name);
        goto fail;
    }
    if (prompt_ids(s, &rq, 1, &ids, &n, &e) < 0) goto fail;
    int ctx = s->ops.ctx_size;
    int max_tokens = rq.max_tokens ? rq.max_tokens : kind == G3_OAI_COMPLETION ? 16 : ctx - n;
    if (n >= ctx || (long long)n + max_tokens > ctx) {
        g3_oai_error_set(&e, 400, "invalid_request_error", "context_length_exceeded",
                         kind == G3_OAI_CHAT ? "messages" : "prompt",
                         "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d "
                         "in the %s, %d in the completion). Please reduce the length of the %s or completion.",
                         ctx, (long long)n + (max_tokens > 0 ? max_tokens : 0), n,
                         kind == G3_OAI_CHAT ? "messages" : "prompt", max_tokens > 0 ? max_tokens : 0,
                         kind == G3_OAI_CHAT ? "messages" : "prompt");
        goto fail;
    }
    g3_srv_job *j = g3_job_create(rq.n);
    if (!j) {
        g3_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory creating the request");
        goto fail;
    }
    j->prompt = ids;
    j->n_prompt = n;
    ids = NULL;
    j->max_tokens = max_tokens;
    j->ignore_eos = rq.ignore_eos;
    j->sampling = rq.sampling;
    j->lb = rq.lb; /* sampling.logit_bias points here */
    rq.lb = NULL;
    if (!rq.seed_given && getrandom(&j->sampling.seed, sizeof j->sampling.seed, 0) != sizeof j->sampling.seed)
        j->sampling.seed = (uint64_t)(g3_srv_now() * 1e9);
    j->want_logprobs = rq.logprobs;
    j->n_top = rq.logprobs ? rq.top_logprobs : 0;
    j->t_arrival = c->t_arrival;
    c->resp = g3_resp_create(&s->ops, s->worker, j, &rq, s->model_name);
    g3_job_unref(j); /* the resp holds it now */
    if (!c->resp) {
        g3_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory creating the request");
        goto fail;
    }
    atomic_fetch_add(&s->n_gen, 1); /* undone in the completed callback */
    g3_error gerr = {0};
    g3_status st = g3_worker_enqueue(s->worker, j, &gerr);
    if (st != G3_OK) {
        g3_resp_error_from_status(st, gerr.msg, &e);
        g3_resp_free(c->resp);
        c->resp = NULL;
        atomic_fetch_sub(&s->n_gen, 1);
        goto fail;
    }
    g3_oai_request_free(&rq);
    /* a long generation is not an idle connection (restored in the completed callback) */
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, 0u);

    /* Wait for the first token or end, watching the client. */
    for (;;) {
        unsigned seq = job_seq(j);
        if (g3_resp_started(c->resp)) break;
        if (g3_srv_peer_gone(c)) return MHD_NO;
        g3_job_wait(j, seq, WAIT_SLICE_MS);
    }
    if (failed_before_start(j, &e)) {
        c->resp->done = 1; /* nothing left to cancel */
        return g3_srv_send_error(mc, c, &e);
    }
    if (c->resp->stream) return start_stream(mc, c);
    for (;;) {
        unsigned seq = job_seq(j);
        if (g3_resp_pump(c->resp)) break;
        if (g3_srv_peer_gone(c)) return MHD_NO;
        g3_job_wait(j, seq, WAIT_SLICE_MS);
    }
    g3_buf body = {0};
    if (!g3_resp_final(c->resp, &body, &e)) {
        g3_buf_free(&body);
        return g3_srv_send_error(mc, c, &e);
    }
    ret = g3_srv_send(mc, c, 200, "application/json", body.data, body.len);
    g3_buf_free(&body);
    return ret;
fail:
    free(ids);
    g3_oai_request_free(&rq);
    return g3_srv_send_error(mc, c, &e);
}

/* ---- /tokenize, /detokenize ---------------------------------------------------------------------------------- */
enum MHD_Result g3_srv_tokenize(struct MHD_Connection *mc, g3_conn *c) {
    g3_server *s = c->s;
    g3_oai_kind kind = c->route == R_TOKENIZE ? G3_OAI_TOKENIZE : G3_OAI_DETOKENIZE;
    g3_oai_request rq;
    g3_oai_error e;
    if (g3_oai_parse(kind, c->body.data ? c->body.data : "", c->body.len, &s->o.defaults, s->ops.vocab, &rq, &e) < 0)
        return g3_srv_send_error(mc, c, &e);
    if (rq.model && strcmp(rq.model, s->model_name) != 0) {
        g3_oai_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model '%.200s' does not exist; this server serves '%s'", rq.model, s->model_name);
        g3_oai_request_free(&rq);
        return g3_srv_send_error(mc, c, &e);
    }
    cJSON *o = cJSON_CreateObject();
    if (kind == G3_OAI_TOKENIZE) {
        int32_t *ids = NULL;
        int n = 0;
        if (prompt_ids(s, &rq, rq.add_special, &ids, &n, &e) < 0) {
            cJSON_Delete(o);
            g3_oai_request_free(&rq);
            return g3_srv_send_error(mc, c, &e);
        }
        cJSON_AddNumberToObject(o, "count", n);
        cJSON_AddNumberToObject(o, "max_model_len", s->ops.ctx_size);
        cJSON *t = cJSON_AddArrayToObject(o, "tokens");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids[i]));
        free(ids);
    } else {
        char *text = NULL;
        size_t len = 0;
        g3_error err = {0};
        g3_status st = s->ops.detokenize(s->ops.ctx, rq.ids, rq.n_ids, &text, &len, &err);
        if (st != G3_OK) {
            cJSON_Delete(o);
            g3_oai_request_free(&rq);
            g3_resp_error_from_status(st, err.msg, &e);
            return g3_srv_send_error(mc, c, &e);
        }
        g3_buf clean = {0};
        g3_utf8_sanitize(text, len, &clean);
        if (clean.data) g3_json_nul_marker(clean.data, clean.len);
        cJSON_AddStringToObject(o, "prompt", clean.data ? clean.data : "");
        g3_buf_free(&clean);
        free(text);
    }
    g3_oai_request_free(&rq);
    g3_buf js = {0};
    g3_json_put(&js, o);
    cJSON_Delete(o);
    if (js.oom || !js.data) {
        g3_buf_free(&js);
        g3_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory writing the response");
        return g3_srv_send_error(mc, c, &e);
    }
    enum MHD_Result ret = g3_srv_send(mc, c, 200, "application/json", js.data, js.len);
    g3_buf_free(&js);
    return ret;
}
