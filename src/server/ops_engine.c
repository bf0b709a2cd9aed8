/* The server's g3_srv_ops backed by the real engine and tokenizer from gemma3.h. */
#include "server/ops_engine.h"

#include <stdlib.h>
#include <string.h>

static g3_status e_submit(void *ctx, const g3_request *r, g3_request_id *id, g3_error *err) {
    return g3_engine_submit(((g3_srv_engine *)ctx)->engine, r, id, err);
}

static void e_cancel(void *ctx, g3_request_id id) { g3_engine_cancel(((g3_srv_engine *)ctx)->engine, id); }

static g3_status e_step(void *ctx, g3_event_fn fn, void *fn_ctx, int *n_active, g3_error *err) {
    return g3_engine_step(((g3_srv_engine *)ctx)->engine, fn, fn_ctx, n_active, err);
}

static void e_stats(void *ctx, g3_engine_stats *s) { g3_engine_get_stats(((g3_srv_engine *)ctx)->engine, s); }

static g3_status t_tokenize(void *ctx, const char *text, size_t len, int parse_special, int32_t **out, int *n,
                            g3_error *err) {
    return g3_tokenize(((g3_srv_engine *)ctx)->tok, text, len, parse_special, out, n, err);
}

static g3_status t_chat(void *ctx, const g3_srv_msg *msgs, int n_msgs, int32_t **out, int *n, g3_error *err) {
    g3_chat_message *m = malloc((size_t)(n_msgs > 0 ? n_msgs : 1) * sizeof *m);
    if (!m) {
        if (err) {
            err->code = G3_ERR_NOMEM;
            strcpy(err->msg, "out of memory rendering the chat");
        }
        return G3_ERR_NOMEM;
    }
    for (int i = 0; i < n_msgs; i++) m[i] = (g3_chat_message){msgs[i].role, msgs[i].content};
    g3_status st = g3_chat_tokenize(((g3_srv_engine *)ctx)->tok, m, n_msgs, 1, out, n, err);
    free(m);
    return st;
}

static void *t_detok_create(void *ctx) {
    g3_detok *d = NULL;
    g3_error err;
    return g3_detok_create(((g3_srv_engine *)ctx)->tok, &d, &err) == G3_OK ? d : NULL;
}

static const char *t_detok_push(void *ctx, void *d, int32_t id, size_t *len) {
    const char *text = "";
    g3_error err;
    if (g3_detok_push(d, id, &text, len, &err) != G3_OK) {
        *len = 0;
        return "";
    }
    return text;
}

static const char *t_detok_flush(void *ctx, void *d, size_t *len) { return g3_detok_flush(d, len); }
static void t_detok_free(void *ctx, void *d) { g3_detok_free(d); }
static int t_is_eog(void *ctx, int32_t id) { return g3_token_is_eog(((g3_srv_engine *)ctx)->tok, id); }

static g3_status t_detokenize(void *ctx, const int32_t *ids, int n, char **out, size_t *len, g3_error *err) {
    return g3_detokenize(((g3_srv_engine *)ctx)->tok, ids, n, out, len, err);
}

static const char *t_piece(void *ctx, int32_t id, size_t *len) {
    const char *p = g3_token_piece(((g3_srv_engine *)ctx)->tok, id);
    if (!p) p = "";
    *len = strlen(p);
    return p;
}

void g3_srv_ops_from_engine(g3_srv_ops *ops, g3_srv_engine *se) {
    memset(ops, 0, sizeof *ops);
    ops->ctx = se;
    ops->submit = e_submit;
    ops->cancel = e_cancel;
    ops->step = e_step;
    ops->get_stats = e_stats;
    ops->tokenize = t_tokenize;
    ops->chat_tokens = t_chat;
    ops->detok_create = t_detok_create;
    ops->detok_push = t_detok_push;
    ops->detok_flush = t_detok_flush;
    ops->detok_free = t_detok_free;
    ops->is_eog = t_is_eog;
    ops->detokenize = t_detokenize;
    ops->token_piece = t_piece;
    ops->vocab = g3_tokenizer_vocab(se->tok);
    ops->ctx_size = se->ctx_size;
    ops->max_seqs = se->max_seqs;
    g3_special_tokens sp;
    g3_tokenizer_special(se->tok, &sp);
    ops->bos_id = sp.bos >= 0 ? sp.bos : 2;
}
