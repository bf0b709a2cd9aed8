/* The HTTP side of one generation request: drains the job's channels (tokens from the engine thread), turns
 * tokens into text with stop strings applied, and writes either server-sent events (stream: true) or, at the end,
 * one chat.completion / text_completion JSON body, shaped as OpenAI shapes them. */
#ifndef G3_SERVER_RESPOND_H
#define G3_SERVER_RESPOND_H

#include <cjson/cJSON.h>

#include "server/oai.h"
#include "tokenizer/textstream.h"
#include "server/worker.h"

typedef struct g3_resp_choice {
    void *detok;               /* ops->detok_create */
    g3_textstream ts;
    int read;                  /* tokens consumed from the channel */
    int finished;              /* finish decided here */
    const char *finish_reason; /* "stop" / "length" */
    int n_completion;          /* tokens consumed (the end-of-turn token included) */
    size_t text_len;           /* bytes of text released so far */
    g3_buf text;               /* non-streaming: the whole text */
    void *lp;                  /* non-streaming logprobs (cJSON) */
    int failed;
} g3_resp_choice;

typedef struct g3_resp {
    const g3_srv_ops *ops;
    g3_worker *worker;
    g3_srv_job *job;           /* our reference */
    g3_oai_kind kind;
    int stream, include_usage, logprobs, top_logprobs;
    char id[48];
    long long created;
    const char *model;         /* borrowed */
    char *stops[16];           /* owned copies */
    int n_stops;
    g3_resp_choice *ch;        /* [job->n_choices] */
    int n_finished;
    int n_cached;
    g3_buf out;                /* SSE bytes not yet handed to the connection */
    int role_sent;             /* streaming chat: the role chunks went out */
    int done;                  /* every choice finished (and, streaming, [DONE] written) */
    g3_oai_error err;          /* first failure of a choice */
    int failed;
} g3_resp;

/* Takes over r's stop strings (r->n_stops set to 0) and a reference to job. */
g3_resp *g3_resp_create(const g3_srv_ops *ops, g3_worker *w, g3_srv_job *job, g3_oai_request *r,
                        const char *model);
void g3_resp_free(g3_resp *r);
/* Consumes what arrived. Streaming: appends events to r->out (the role chunk first, [DONE] last).
 * Returns 1 once everything is finished, else 0. */
int g3_resp_pump(g3_resp *r);
/* After the job finished, non-streaming: the response body, or 0 and e (status 400/429/500/503) on failure.
 * Returns 1 when body holds a 200 response. */
int g3_resp_final(g3_resp *r, g3_buf *body, g3_oai_error *e);
/* Whether any choice has output or an end yet (for deciding the HTTP status before streaming starts). */
int g3_resp_started(g3_resp *r);
/* Maps an engine failure to an OpenAI error (status and type). */
void g3_resp_error_from_status(g3_status st, const char *msg, g3_oai_error *e);

/* JSON text with NUL bytes: g3_json_nul_marker turns each NUL of a text about to go into a cJSON string into the
 * byte 0xFF (absent from valid UTF-8); g3_json_put prints the object with "\u0000" in place of each 0xFF. */
void g3_json_nul_marker(char *p, size_t n);
void g3_json_put(g3_buf *out, cJSON *o);

#endif
