/* Internals shared by server.c (daemon, routing, small endpoints) and generate.c (the generation endpoints). */
#ifndef G3_SERVER_SERVER_INT_H
#define G3_SERVER_SERVER_INT_H

#include <microhttpd.h>
#include <stdatomic.h>

#include "server/metrics.h"
#include "server/oai.h"
#include "server/respond.h"
#include "server/server.h"
#include "server/worker.h"

/* Idle keep-alive connections are closed after this long; a generation request lifts the limit while it runs. */
#define G3_SRV_IDLE_TIMEOUT_S 600u

struct g3_server {
    g3_server_opts o;          /* strings point at the copies below */
    char *host, *api_key, *model_name;
    struct MHD_Daemon *d;
    int port;
    g3_metrics metrics;
    g3_srv_ops ops;            /* valid once ready */
    g3_worker *worker;
    atomic_int ready;          /* model attached */
    atomic_int stopping;       /* shutdown began: new requests get 503 */
    atomic_int n_gen;          /* generation requests between admission and their completed callback */
    long long started_at;      /* unix seconds */
};

typedef enum g3_route {
    R_NONE = 0,
    R_HEALTH,
    R_METRICS,
    R_MODELS,
    R_MODEL_ONE,
    R_CHAT,
    R_COMPLETIONS,
    R_TOKENIZE,
    R_DETOKENIZE,
} g3_route;

/* Per-request state (MHD's con_cls), freed by the request-completed callback. */
typedef struct g3_conn {
    g3_server *s;
    g3_route route;
    g3_buf body;
    int too_large;
    int status;                /* status of the response queued, for the log */
    double t_arrival;
    int fd;                    /* the client socket, to notice a hang-up while we wait */
    g3_resp *resp;             /* generation requests */
    double last_write;         /* streaming: time of the last bytes handed to MHD (keep-alive comments) */
    char method[8];
    char url[96];
} g3_conn;

enum MHD_Result g3_srv_send(struct MHD_Connection *mc, g3_conn *c, int status, const char *ctype, const char *data,
                            size_t len);
enum MHD_Result g3_srv_send_error(struct MHD_Connection *mc, g3_conn *c, const g3_oai_error *e);
/* 1 when the client closed its end of the connection. */
int g3_srv_peer_gone(const g3_conn *c);
/* POST /v1/chat/completions and /v1/completions, body complete. */
enum MHD_Result g3_srv_generate(struct MHD_Connection *mc, g3_conn *c);
/* POST /tokenize and /detokenize, body complete. */
enum MHD_Result g3_srv_tokenize(struct MHD_Connection *mc, g3_conn *c);

#endif
