/* OpenAI-style requests and errors: parsing and validation of the JSON bodies of /v1/chat/completions,
 * /v1/completions, /tokenize and /detokenize into g3_oai_request, and the error body every failure answers with:
 *   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}} */
#ifndef G3_SERVER_OAI_H
#define G3_SERVER_OAI_H

#include "gemma3.h"
#include "server/ops.h"
#include "tokenizer/textstream.h"

#define G3_SRV_MAX_N 16

typedef enum g3_oai_kind {
    G3_OAI_CHAT = 1,
    G3_OAI_COMPLETION,
    G3_OAI_TOKENIZE,
    G3_OAI_DETOKENIZE,
} g3_oai_kind;

typedef struct g3_oai_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code; /* NULL (JSON null) or a short machine-readable code */
    char param[64];   /* offending field ("" = null) */
    char message[768];
} g3_oai_error;

void g3_oai_error_set(g3_oai_error *e, int status, const char *type, const char *code, const char *param,
                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
/* Appends the JSON error body to out. */
void g3_oai_error_json(const g3_oai_error *e, g3_buf *out);

typedef struct g3_oai_request {
    g3_oai_kind kind;
    char *model;               /* as requested; NULL when absent */
    /* chat (and /tokenize with messages) */
    g3_srv_msg *msgs;          /* [n_msgs]; strings owned (freed with the request) */
    int n_msgs;
    /* completions / tokenize: text or token ids */
    char *prompt;              /* NULL when the prompt was given as ids */
    int32_t *ids;              /* [n_ids]: prompt ids (completions, tokenize) or the ids to detokenize */
    int n_ids;
    int add_special;           /* tokenize: add BOS (default 1) */
    /* generation */
    int stream, include_usage;
    int max_tokens;            /* 0 = absent (up to the context) */
    int n;                     /* choices */
    g3_sampling sampling;      /* logit_bias -> lb */
    g3_logit_bias *lb;
    int n_lb;
    int seed_given;
    int logprobs;              /* 1 = return logprobs */
    int top_logprobs;          /* alternatives per token */
    char *stops[16];
    int n_stops;
    int ignore_eos;            /* extension (vLLM's name): keep generating past end-of-turn */
} g3_oai_request;

/* Parses and validates a request body. defaults: sampling used for fields the request leaves out. vocab bounds
 * token ids (prompt ids, logit_bias keys). Returns 0, or -1 with e filled (status 400 and a message naming the
 * field). */
int g3_oai_parse(g3_oai_kind kind, const char *body, size_t len, const g3_sampling *defaults, int vocab,
                 g3_oai_request *r, g3_oai_error *e);
void g3_oai_request_free(g3_oai_request *r);

#endif
