/* The HTTP server against a fake engine (no model needed): readiness, chat/completions bodies, SSE framing with
 * UTF-8 split across byte tokens, stop strings cancelling the sequence, engine errors mapped to statuses,
 * disconnect -> cancel, queue limit -> 429, shutdown with a stream in flight. The fake echoes the prompt body:
 * generated token k is prompt[1 + k % (n_prompt - 1)]; a '!' byte ends the reply with eos (finish STOP). */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/server.h"
#include "tokenizer/textstream.h"
#include "testutil.h"

/* ---- fake tokenizer: id 1 eos, 2 bos, 3 + b = byte b ------------------------------------------------------ */
#define F_VOCAB 300
#define F_BYTE(b) (3 + (int)(unsigned char)(b))

static g3_status f_tokenize(void *ctx, const char *text, size_t len, int ps, int32_t **out, int *n, g3_error *err) {
    *out = malloc((len + 1) * sizeof **out);
    for (size_t i = 0; i < len; i++) (*out)[i] = F_BYTE(text[i]);
    *n = (int)len;
    return G3_OK;
}

static g3_status f_chat(void *ctx, const g3_srv_msg *m, int n, int32_t **out, int *n_out, g3_error *err) {
    char buf[4096];
    size_t k = 0;
    for (int i = 0; i < n; i++) k += (size_t)snprintf(buf + k, sizeof buf - k, "%s", m[i].content);
    *out = malloc((k + 2) * sizeof **out);
    (*out)[0] = 2;
    for (size_t i = 0; i < k; i++) (*out)[i + 1] = F_BYTE(buf[i]);
    *n_out = (int)k + 1;
    return G3_OK;
}

typedef struct f_detok { char b[2]; } f_detok;
static void *f_detok_create(void *ctx) { return calloc(1, sizeof(f_detok)); }
static const char *f_detok_push(void *ctx, void *d, int32_t id, size_t *len) {
    f_detok *t = d;
    *len = 0;
    if (id < 3 || id >= 3 + 256) return "";
    t->b[0] = (char)(id - 3);
    *len = 1;
    return t->b;
}
static const char *f_detok_flush(void *ctx, void *d, size_t *len) {
    *len = 0;
    return "";
}
static void f_detok_free(void *ctx, void *d) { free(d); }
static int f_is_eog(void *ctx, int32_t id) { return id == 1; }
static g3_status f_detokenize(void *ctx, const int32_t *ids, int n, char **out, size_t *len, g3_error *err) {
    *out = malloc((size_t)n + 1);
    *len = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 3 && ids[i] < 259) (*out)[(*len)++] = (char)(ids[i] - 3);
    (*out)[*len] = 0;
    return G3_OK;
}
static const char *f_piece(void *ctx, int32_t id, size_t *len) {
    static char bytes[256][2];
    if (id == 1) return *len = 5, "<eos>";
    if (id == 2) return *len = 5, "<bos>";
    if (id < 3 || id >= 259) return *len = 0, "";
    bytes[id - 3][0] = (char)(id - 3);
    *len = 1;
    return bytes[id - 3];
}

/* ---- fake engine -------------------------------------------------------------------------------------------- */
typedef struct f_req {
    g3_request_id id;
    int32_t *prompt;
    int n_prompt, max_tokens, n_gen, cancelled, live;
    void *user;
} f_req;

typedef struct fake {
    f_req reqs[64];
    g3_request_id next_id;
    atomic_int n_cancel;      /* cancel calls seen */
    atomic_int step_delay_us;
    atomic_int fail_next_step;
} fake;

static int contains(const int32_t *p, int n, const char *s) {
    int m = (int)strlen(s);
    for (int i = 0; i + m <= n; i++) {
        int k = 0;
        while (k < m && p[i + k] == F_BYTE(s[k])) k++;
        if (k == m) return 1;
    }
    return 0;
}

static g3_status f_submit(void *ctx, const g3_request *r, g3_request_id *id, g3_error *err) {
    fake *f = ctx;
    if (contains(r->prompt, r->n_prompt, "FAILSUBMIT")) {
        snprintf(err->msg, sizeof err->msg, "fake: the prompt does not fit");
        return err->code = G3_ERR_ARG;
    }
    if (contains(r->prompt, r->n_prompt, "FULLSUBMIT")) {
        snprintf(err->msg, sizeof err->msg, "fake: no room");
        return err->code = G3_ERR_FULL;
    }
    for (int i = 0; i < 64; i++) {
        f_req *q = &f->reqs[i];
        if (q->live) continue;
        memset(q, 0, sizeof *q);
        q->prompt = malloc((size_t)r->n_prompt * sizeof *q->prompt);
        memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof *q->prompt);
        q->n_prompt = r->n_prompt;
        q->max_tokens = r->max_tokens;
        q->user = r->user;
        q->id = *id = ++f->next_id;
        q->live = 1;
        return G3_OK;
    }
    return err->code = G3_ERR_FULL;
}

static void f_cancel(void *ctx, g3_request_id id) {
    fake *f = ctx;
    atomic_fetch_add(&f->n_cancel, 1);
    for (int i = 0; i < 64; i++)
        if (f->reqs[i].live && f->reqs[i].id == id) f->reqs[i].cancelled = 1;
}

static void f_retire(f_req *q) {
    free(q->prompt);
    q->live = 0;
}

static g3_status f_step(void *ctx, g3_event_fn fn, void *fctx, int *n_active, g3_error *err) {
    fake *f = ctx;
    if (atomic_exchange(&f->fail_next_step, 0)) {
        snprintf(err->msg, sizeof err->msg, "fake: device lost");
        return err->code = G3_ERR_DEVICE;
    }
    if (atomic_load(&f->step_delay_us)) usleep((useconds_t)atomic_load(&f->step_delay_us));
    int active = 0;
    for (int i = 0; i < 64; i++) {
        f_req *q = &f->reqs[i];
        if (!q->live) continue;
        g3_event ev = {.id = q->id, .user = q->user, .n_prompt = q->n_prompt};
        if (q->cancelled) {
            ev.finish = G3_FINISH_CANCELLED;
            fn(&ev, fctx);
            f_retire(q);
            continue;
        }
        int32_t t = q->prompt[1 + q->n_gen % (q->n_prompt - 1)];
        if (t == F_BYTE('!')) t = 1;
        q->n_gen++;
        ev.token = t;
        ev.has_token = 1;
        ev.logprob = -0.5f;
        ev.n_generated = q->n_gen;
        ev.finish = t == 1 ? G3_FINISH_STOP : q->n_gen >= q->max_tokens ? G3_FINISH_LENGTH : G3_FINISH_NONE;
        fn(&ev, fctx);
        if (ev.finish) f_retire(q);
        else active++;
    }
    *n_active = active;
    return G3_OK;
}

static void f_stats(void *ctx, g3_engine_stats *s) {
    fake *f = ctx;
    memset(s, 0, sizeof *s);
    s->kv_blocks_total = 64;
    for (int i = 0; i < 64; i++)
        if (f->reqs[i].live) s->n_running++, s->kv_blocks_used++;
}

static fake g_fake;

static g3_srv_ops fake_ops(void) {
    g3_srv_ops o = {.ctx = &g_fake, .submit = f_submit, .cancel = f_cancel, .step = f_step, .get_stats = f_stats,
                    .tokenize = f_tokenize, .chat_tokens = f_chat, .detok_create = f_detok_create,
                    .detok_push = f_detok_push, .detok_flush = f_detok_flush, .detok_free = f_detok_free,
                    .is_eog = f_is_eog, .detokenize = f_detokenize, .token_piece = f_piece, .vocab = F_VOCAB,
                    .ctx_size = 1 << 20, .bos_id = 2, .max_seqs = 2};
    return o;
}

/* ---- a tiny HTTP client (Connection: close, reads to EOF, undoes chunked encoding) ----------------------------- */
typedef struct resp {
    int status;
    char head[2048];
    char *body;
} resp;

static int dial(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof a), 0);
    return s;
}

static int send_req(int port, const char *method, const char *path, const char *body, const char *extra) {
    int s = dial(port);
    char h[1024];
    int n = snprintf(h, sizeof h, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                     method, path, extra ? extra : "", body ? strlen(body) : 0);
    assert_int_equal(write(s, h, (size_t)n), n);
    if (body) assert_int_equal(write(s, body, strlen(body)), (ssize_t)strlen(body));
    return s;
}

static resp read_resp(int s) {
    size_t cap = 1 << 16, len = 0;
    char *raw = malloc(cap);
    ssize_t k;
    while ((k = read(s, raw + len, cap - len - 1)) > 0) {
        len += (size_t)k;
        if (len + 1 == cap) raw = realloc(raw, cap *= 2);
    }
    raw[len] = 0;
    close(s);
    resp r = {0};
    char *sep = strstr(raw, "\r\n\r\n");
    assert_non_null(sep);
    *sep = 0;
    snprintf(r.head, sizeof r.head, "%s", raw);
    sscanf(raw, "HTTP/1.1 %d", &r.status);
    char *b = sep + 4;
    if (strstr(r.head, "chunked")) { /* de-chunk in place */
        char *out = b, *p = b;
        for (;;) {
            long n = strtol(p, &p, 16);
            p = strstr(p, "\r\n") + 2;
            if (n <= 0) break;
            memmove(out, p, (size_t)n);
            out += n;
            p += n + 2;
        }
        *out = 0;
    }
    r.body = strdup(b);
    free(raw);
    return r;
}

static resp req(int port, const char *method, const char *path, const char *body) {
    return read_resp(send_req(port, method, path, body, NULL));
}

static void fake_reset(void) { /* requests the server cancelled but never stepped again */
    for (int i = 0; i < 64; i++)
        if (g_fake.reqs[i].live) f_retire(&g_fake.reqs[i]);
}

static g3_server *start(int max_queue) {
    fake_reset();
    g3_server_opts o;
    g3_server_opts_default(&o);
    o.port = 0;
    o.log_requests = 0;
    o.max_queue = max_queue;
    o.model_name = "fake";
    g3_server *s = NULL;
    g3_error err;
    assert_int_equal(g3_server_start(&o, &s, &err), G3_OK);
    return s;
}

static void attach(g3_server *s) {
    g3_srv_ops ops = fake_ops();
    g3_error err;
    assert_int_equal(g3_server_attach(s, &ops, &err), G3_OK);
}

/* Polls /metrics until the sample `name` is at least v (5 s at most). */
static void wait_metric(int port, const char *name, double v) {
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    for (int i = 0; i < 500; i++) {
        resp r = req(port, "GET", "/metrics", NULL);
        const char *p = strstr(r.body, key);
        double x = p ? strtod(p + strlen(key), NULL) : -1;
        free(r.body);
        if (x >= v) return;
        usleep(10000);
    }
    fail_msg("metric %s never reached %g", name, v);
}

/* ---- tests ------------------------------------------------------------------------------------------------------ */
static void test_loading_then_ready(void **st) {
    g3_server *s = start(4);
    int port = g3_server_port(s);
    resp r = req(port, "GET", "/health", NULL);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "loading"));
    free(r.body);
    r = req(port, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "\"code\":\"model_loading\""));
    free(r.body);
    attach(s);
    r = req(port, "GET", "/health", NULL);
    assert_int_equal(r.status, 200);
    free(r.body);
    g3_server_free(s);
}

static void test_chat_and_completion_bodies(void **st) {
    g3_server *s = start(4);
    attach(s);
    int port = g3_server_port(s);
    resp r = req(port, "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"abc!\"}],\"max_tokens\":10}");
    assert_int_equal(r.status, 200);
    /* echo "abc" then '!' -> eos: finish stop, 4 completion tokens (eos included), prompt = bos + 4 bytes */
    assert_non_null(strstr(r.body, "\"content\":\"abc\""));
    assert_non_null(strstr(r.body, "\"finish_reason\":\"stop\""));
    assert_non_null(strstr(r.body, "\"prompt_tokens\":5,\"completion_tokens\":4,\"total_tokens\":9"));
    free(r.body);
    r = req(port, "POST", "/v1/completions", "{\"prompt\":\"xy\",\"max_tokens\":5}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"text\":\"xyxyx\""));
    assert_non_null(strstr(r.body, "\"finish_reason\":\"length\""));
    assert_non_null(strstr(r.body, "\"object\":\"text_completion\""));
    free(r.body);
    g3_server_free(s);
}

static void test_sse_utf8_and_stop(void **st) {
    g3_server *s = start(4);
    attach(s);
    int port = g3_server_port(s);
    /* "é" is two byte tokens: no event may carry half of it */
    resp r = req(port, "POST", "/v1/completions", "{\"prompt\":\"\xC3\xA9-\",\"max_tokens\":6,\"stream\":true}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "text/event-stream"));
    assert_null(strstr(r.body, "\"text\":\"\xC3\""));
    char *last = strstr(r.body, "data: [DONE]\n\n");
    assert_non_null(last);
    assert_string_equal(last, "data: [DONE]\n\n");
    g3_buf joined = {0};
    g3_buf_puts(&joined, "");
    for (char *p = r.body; (p = strstr(p, "\"text\":\"")); p += 8) {
        char *q = strchr(p + 8, '"');
        g3_buf_append(&joined, p + 8, (size_t)(q - p - 8));
    }
    assert_string_equal(joined.data, "\xC3\xA9-\xC3\xA9-"); /* 6 tokens = 2 x (2 bytes + '-') */
    g3_buf_free(&joined);
    free(r.body);
    /* a stop string cuts the text and cancels the engine's sequence */
    int before = atomic_load(&g_fake.n_cancel);
    atomic_store(&g_fake.step_delay_us, 2000);
    r = req(port, "POST", "/v1/completions",
            "{\"prompt\":\"hello world \",\"max_tokens\":100,\"stop\":[\"wor\"],\"stream\":false}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"text\":\"hello \""));
    assert_non_null(strstr(r.body, "\"finish_reason\":\"stop\""));
    free(r.body);
    for (int i = 0; i < 200 && atomic_load(&g_fake.n_cancel) == before; i++) usleep(10000);
    assert_int_equal(atomic_load(&g_fake.n_cancel), before + 1);
    atomic_store(&g_fake.step_delay_us, 0);
    g3_server_free(s);
}

static void test_engine_errors_map_to_statuses(void **st) {
    g3_server *s = start(4);
    attach(s);
    int port = g3_server_port(s);
    resp r = req(port, "POST", "/v1/completions", "{\"prompt\":\"FAILSUBMIT\"}");
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "fake: the prompt does not fit"));
    free(r.body);
    r = req(port, "POST", "/v1/completions", "{\"prompt\":\"FULLSUBMIT\",\"stream\":true}");
    assert_int_equal(r.status, 429); /* decided before the stream starts */
    free(r.body);
    atomic_store(&g_fake.step_delay_us, 20000);
    int sk = send_req(port, "POST", "/v1/completions", "{\"prompt\":\"abc\",\"max_tokens\":50}", NULL);
    usleep(30000);
    atomic_store(&g_fake.fail_next_step, 1);
    r = read_resp(sk);
    atomic_store(&g_fake.step_delay_us, 0);
    assert_int_equal(r.status, 500);
    assert_non_null(strstr(r.body, "device lost"));
    free(r.body);
    r = req(port, "POST", "/v1/completions", "{\"prompt\":\"ok\",\"max_tokens\":2}"); /* still serving */
    assert_int_equal(r.status, 200);
    free(r.body);
    g3_server_free(s);
}

static void test_disconnect_cancels_and_queue_limit(void **st) {
    g3_server *s = start(1); /* fake max_seqs 2 + 1 queued */
    attach(s);
    int port = g3_server_port(s);
    atomic_store(&g_fake.step_delay_us, 5000);
    const char *body = "{\"prompt\":\"long\",\"max_tokens\":100000,\"stream\":true}";
    int a = send_req(port, "POST", "/v1/completions", body, NULL);
    int b = send_req(port, "POST", "/v1/completions", body, NULL);
    int c = send_req(port, "POST", "/v1/completions", body, NULL);
    char buf[256];
    assert_true(read(a, buf, sizeof buf) > 0); /* a is streaming */
    wait_metric(port, "gemma3_sequences_outstanding", 3); /* b and c admitted too */
    resp r = req(port, "POST", "/v1/completions", body);
    assert_int_equal(r.status, 429);
    assert_non_null(strstr(r.body, "\"code\":\"rate_limit_exceeded\""));
    free(r.body);
    int before = atomic_load(&g_fake.n_cancel);
    close(a);
    close(b);
    close(c);
    for (int i = 0; i < 500 && atomic_load(&g_fake.n_cancel) < before + 3; i++) usleep(10000);
    assert_int_equal(atomic_load(&g_fake.n_cancel), before + 3);
    atomic_store(&g_fake.step_delay_us, 0);
    r = req(port, "GET", "/metrics", NULL);
    assert_non_null(strstr(r.body, "gemma3_client_disconnects_total 3\n"));
    assert_non_null(strstr(r.body, "gemma3_sequences_finished_total{reason=\"cancelled\"} 3\n"));
    free(r.body);
    g3_server_free(s);
}

static void test_shutdown_ends_streams(void **st) {
    g3_server *s = start(4);
    attach(s);
    int port = g3_server_port(s);
    atomic_store(&g_fake.step_delay_us, 5000);
    int a = send_req(port, "POST", "/v1/completions", "{\"prompt\":\"zz\",\"max_tokens\":100000,\"stream\":true}",
                     NULL);
    wait_metric(port, "gemma3_generation_tokens_total", 3); /* streaming */
    g3_server_shutdown(s, 0); /* no grace: cancel */
    resp r = read_resp(a);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "shutting down"));
    assert_non_null(strstr(r.body, "data: [DONE]\n\n"));
    free(r.body);
    atomic_store(&g_fake.step_delay_us, 0);
    g3_server_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loading_then_ready),
        cmocka_unit_test(test_chat_and_completion_bodies),
        cmocka_unit_test(test_sse_utf8_and_stop),
        cmocka_unit_test(test_engine_errors_map_to_statuses),
        cmocka_unit_test(test_disconnect_cancels_and_queue_limit),
        cmocka_unit_test(test_shutdown_ends_streams),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fake_reset();
    return rc;
}
