/* The HTTP daemon (libmicrohttpd, one thread per connection): binding, routing, authentication, body limits,
 * the small endpoints (/health, /metrics, /v1/models) and graceful shutdown. The generation endpoints live in
 * generate.c. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"

void g3_server_opts_default(g3_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8006;
    o->model_name = "gemma3";
    o->max_queue = 256;
    o->max_body = 4u << 20;
    o->max_connections = 1024;
    o->log_requests = 1;
    g3_sampling_default(&o->defaults);
    o->defaults.temperature = 1.0f; /* OpenAI's default when a request leaves it out */
}

/* ---- responses --------------------------------------------------------------------------------------------- */
enum MHD_Result g3_srv_send(struct MHD_Connection *mc, g3_conn *c, int status, const char *ctype, const char *data,
                            size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
                                c->route == R_HEALTH || c->route == R_METRICS || c->route == R_MODELS ||
                                        c->route == R_MODEL_ONE
                                    ? "GET"
                                    : "POST");
    enum MHD_Result ret = MHD_queue_response(mc, (unsigned)status, r);
    MHD_destroy_response(r);
    c->status = status;
    g3_metrics_response(&c->s->metrics, status);
    return ret;
}

enum MHD_Result g3_srv_send_error(struct MHD_Connection *mc, g3_conn *c, const g3_oai_error *e) {
    g3_buf b = {0};
    g3_oai_error_json(e, &b);
    enum MHD_Result ret = g3_srv_send(mc, c, e->status, "application/json", b.data ? b.data : "", b.len);
    g3_buf_free(&b);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *mc, g3_conn *c, int status, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) {
        g3_oai_error e;
        g3_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory writing the response");
        return g3_srv_send_error(mc, c, &e);
    }
    enum MHD_Result ret = g3_srv_send(mc, c, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

int g3_srv_peer_gone(const g3_conn *c) {
    if (c->fd < 0) return 0;
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- small endpoints --------------------------------------------------------------------------------------- */
static enum MHD_Result do_health(struct MHD_Connection *mc, g3_conn *c) {
    g3_server *s = c->s;
    if (atomic_load(&s->stopping)) return g3_srv_send(mc, c, 503, "application/json", "{\"status\":\"stopping\"}", 21);
    if (!atomic_load(&s->ready)) return g3_srv_send(mc, c, 503, "application/json", "{\"status\":\"loading\"}", 20);
    return g3_srv_send(mc, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

static enum MHD_Result do_metrics(struct MHD_Connection *mc, g3_conn *c) {
    g3_buf b = {0};
    g3_metrics_render(&c->s->metrics, atomic_load(&c->s->ready), &b);
    enum MHD_Result ret =
        g3_srv_send(mc, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data ? b.data : "", b.len);
    g3_buf_free(&b);
    return ret;
}

static cJSON *model_json(const g3_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started_at);
    cJSON_AddStringToObject(m, "owned_by", "gemma3");
    if (atomic_load(&s->ready)) cJSON_AddNumberToObject(m, "max_model_len", s->ops.ctx_size);
    return m;
}

static enum MHD_Result do_models(struct MHD_Connection *mc, g3_conn *c, const char *url) {
    if (c->route == R_MODEL_ONE) {
        const char *id = url + strlen("/v1/models/");
        if (strcmp(id, c->s->model_name) != 0) {
            g3_oai_error e;
            g3_oai_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                             "The model '%.200s' does not exist", id);
            return g3_srv_send_error(mc, c, &e);
        }
        return send_json(mc, c, 200, model_json(c->s));
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_json(c->s));
    return send_json(mc, c, 200, o);
}

/* ---- routing ----------------------------------------------------------------------------------------------- */
static g3_route match_route(const char *url) {
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    if (!strcmp(url, "/v1/models")) return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) return R_MODEL_ONE;
    if (!strcmp(url, "/v1/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/v1/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return R_DETOKENIZE;
    return R_NONE;
}

static int route_is_post(g3_route r) { return r >= R_CHAT; }
static int route_needs_model(g3_route r) { return r >= R_CHAT; }
static int route_needs_auth(g3_route r) { return r >= R_MODELS; }

/* Constant-time comparison of the bearer token with the key. */
static int auth_ok(const g3_server *s, struct MHD_Connection *mc) {
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *tok = h + 7;
    size_t a = strlen(tok), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)tok[i] ^ (unsigned char)s->api_key[i % (b ? b : 1)];
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    g3_server *s = cls;
    g3_conn *c = *con_cls;
    g3_oai_error e;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->s = s;
        c->t_arrival = g3_srv_now();
        c->fd = -1;
        snprintf(c->method, sizeof c->method, "%s", method);
        snprintf(c->url, sizeof c->url, "%s", url);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) c->fd = ci->connect_fd;
        *con_cls = c;
        c->route = match_route(url);
        if (c->route == R_NONE) {
            g3_oai_error_set(&e, 404, "invalid_request_error", "unknown_url", NULL, "Invalid URL (%s %.200s)",
                             method, url);
            return g3_srv_send_error(mc, c, &e);
        }
        int is_post = !strcmp(method, MHD_HTTP_METHOD_POST), is_get = !strcmp(method, MHD_HTTP_METHOD_GET);
        if (route_is_post(c->route) ? !is_post : !is_get) {
            g3_oai_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                             "%s is not allowed on %.200s; use %s", method, url,
                             route_is_post(c->route) ? "POST" : "GET");
            return g3_srv_send_error(mc, c, &e);
        }
        if (route_needs_auth(c->route) && !auth_ok(s, mc)) {
            g3_oai_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                             "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'");
            return g3_srv_send_error(mc, c, &e);
        }
        if (atomic_load(&s->stopping) && c->route != R_METRICS && c->route != R_HEALTH) {
            g3_oai_error_set(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
            return g3_srv_send_error(mc, c, &e);
        }
        if (route_needs_model(c->route) && !atomic_load(&s->ready)) {
            g3_oai_error_set(&e, 503, "server_error", "model_loading", NULL,
                             "the model is still loading; retry when GET /health answers 200");
            return g3_srv_send_error(mc, c, &e);
        }
        if (is_get) {
            if (c->route == R_HEALTH) return do_health(mc, c);
            if (c->route == R_METRICS) return do_metrics(mc, c);
            return do_models(mc, c, url);
        }
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) {
            g3_oai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                             "the request body has %s bytes; the limit is %zu bytes", cl, s->o.max_body);
            return g3_srv_send_error(mc, c, &e);
        }
        return MHD_YES; /* wait for the body */
    }
    if (*upload_data_size) {
        if (!c->too_large) {
            if (c->body.len + *upload_data_size > s->o.max_body) {
                c->too_large = 1;
                g3_buf_free(&c->body);
            } else {
                g3_buf_append(&c->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (c->too_large) {
        g3_oai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "the request body is over the limit of %zu bytes", s->o.max_body);
        return g3_srv_send_error(mc, c, &e);
    }
    if (c->body.oom) {
        g3_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory reading the request body");
        return g3_srv_send_error(mc, c, &e);
    }
    if (c->route == R_TOKENIZE || c->route == R_DETOKENIZE) return g3_srv_tokenize(mc, c);
    return g3_srv_generate(mc, c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    g3_server *s = cls;
    g3_conn *c = *con_cls;
    if (!c) return;
    if (c->resp) {
        atomic_fetch_sub(&s->n_gen, 1);
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, G3_SRV_IDLE_TIMEOUT_S);
        if (!c->resp->done) {
            g3_worker_cancel(s->worker, c->resp->job);
            pthread_mutex_lock(&s->metrics.mu);
            s->metrics.disconnects++;
            pthread_mutex_unlock(&s->metrics.mu);
        }
        g3_resp_free(c->resp);
    }
    if (s->o.log_requests)
        fprintf(stderr, "%s %s -> %d%s (%.1f ms)\n", c->method, c->url, c->status,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)",
                (g3_srv_now() - c->t_arrival) * 1e3);
    g3_buf_free(&c->body);
    free(c);
    *con_cls = NULL;
}

/* ---- lifecycle --------------------------------------------------------------------------------------------- */
static char *dup_or_null(const char *s) {
    if (!s || !*s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

g3_status g3_server_start(const g3_server_opts *o, g3_server **out, g3_error *err) {
    *out = NULL;
    g3_server *s = calloc(1, sizeof *s);
    if (!s) return g3_fail(err, G3_ERR_NOMEM, "server: out of memory");
    s->o = *o;
    s->host = dup_or_null(o->host ? o->host : "127.0.0.1");
    s->api_key = dup_or_null(o->api_key);
    s->model_name = dup_or_null(o->model_name && *o->model_name ? o->model_name : "gemma3");
    s->o.host = s->host;
    s->o.api_key = s->api_key;
    s->o.model_name = s->model_name;
    if (!s->o.max_body) s->o.max_body = 4u << 20;
    if (s->o.max_connections <= 0) s->o.max_connections = 1024;
    s->started_at = (long long)time(NULL);
    g3_metrics_init(&s->metrics);
    if (!s->host || !s->model_name || (o->api_key && *o->api_key && !s->api_key)) {
        g3_server_free(s);
        return g3_fail(err, G3_ERR_NOMEM, "server: out of memory");
    }

    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        g3_server_free(s);
        return g3_fail(err, G3_ERR_ARG, "server: cannot resolve host '%s': %s", o->host, gai_strerror(gai));
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,                            //
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,                                              //
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,                                   //
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,                    //
                            MHD_OPTION_CONNECTION_TIMEOUT, G3_SRV_IDLE_TIMEOUT_S,                           //
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,                                         //
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        g3_server_free(s);
        return g3_fail(err, G3_ERR_IO, "server: cannot listen on %s:%d (address in use or not allowed?)", o->host,
                       o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return G3_OK;
}

int g3_server_port(const g3_server *s) { return s->port; }

g3_status g3_server_attach(g3_server *s, const g3_srv_ops *ops, g3_error *err) {
    s->ops = *ops;
    if (s->ops.max_seqs < 1) s->ops.max_seqs = 1;
    g3_worker_opts wo = {.max_queue = s->o.max_queue, .step_delay_ms = s->o.step_delay_ms};
    G3_TRY(g3_worker_create(&s->ops, &s->metrics, &wo, &s->worker, err));
    atomic_store(&s->ready, 1);
    return G3_OK;
}

void g3_server_shutdown(g3_server *s, int grace_ms) {
    if (!s || atomic_exchange(&s->stopping, 1)) return;
    /* stop accepting: MHD hands the listening socket back to us, closed after the daemon stops */
    MHD_socket lsock = s->d ? MHD_quiesce_daemon(s->d) : MHD_INVALID_SOCKET;
    if (s->worker) g3_worker_drain(s->worker, grace_ms);
    /* every sequence has ended; give the connection threads a moment to send the last events */
    for (int i = 0; i < 200 && atomic_load(&s->n_gen) > 0; i++) usleep(10000);
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
    if (lsock != MHD_INVALID_SOCKET) close(lsock);
    g3_worker_free(s->worker);
    s->worker = NULL;
}

void g3_server_free(g3_server *s) {
    if (!s) return;
    g3_server_shutdown(s, 0);
    g3_metrics_deinit(&s->metrics);
    free(s->host);
    free(s->api_key);
    free(s->model_name);
    free(s);
}
