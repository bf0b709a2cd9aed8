/* The OpenAI-compatible HTTP server behind `gemma3 serve`.
 *
 * Starts listening first (GET /health answers 503 while the model loads), then g3_server_attach hands it the
 * engine and tokenizer (as a g3_srv_ops table) and starts the engine thread; from then on it serves
 *   POST /v1/chat/completions, POST /v1/completions  (SSE when stream: true)
 *   GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize.
 * HTTP is libmicrohttpd with one thread per connection; JSON is cJSON. See docs/SERVER.md. */
#ifndef G3_SERVER_SERVER_H
#define G3_SERVER_SERVER_H

#include <stddef.h>

#include "gemma3.h"
#include "server/ops.h"

typedef struct g3_server g3_server;

typedef struct g3_server_opts {
    const char *host;        /* address to bind; default "127.0.0.1" */
    int port;                /* default 8006; 0 = any free port (see g3_server_port) */
    const char *api_key;     /* NULL or "" = no authentication */
    const char *model_name;  /* id in /v1/models and the accepted "model" value; default "gemma3" */
    int max_queue;           /* sequences allowed to wait beyond the running ones; default 256 */
    size_t max_body;         /* request body limit in bytes (413 above); default 4 MiB */
    int max_connections;     /* default 1024 */
    int step_delay_ms;       /* test hook: slow every engine step down (0 = off) */
    int log_requests;        /* one line per request on stderr */
    g3_sampling defaults;    /* sampling for fields a request leaves out */
} g3_server_opts;

void g3_server_opts_default(g3_server_opts *o);
/* Binds and starts answering (not ready yet). The strings in o are copied. */
g3_status g3_server_start(const g3_server_opts *o, g3_server **out, g3_error *err);
int g3_server_port(const g3_server *s);
/* Starts the engine thread on ops and marks the server ready. */
g3_status g3_server_attach(g3_server *s, const g3_srv_ops *ops, g3_error *err);
/* Graceful stop: refuses new requests (503) and closes the listening socket, lets in-flight requests finish for
 * up to grace_ms, cancels the rest, then stops the engine thread and the HTTP threads. */
void g3_server_shutdown(g3_server *s, int grace_ms);
void g3_server_free(g3_server *s);

#endif
