/* `gemma3 chat`: an interactive multi-turn conversation in Gemma's turn format. The history is kept and rendered
 * whole each turn; /reset, /system TEXT, /quit; Ctrl-C stops the current reply and returns to the prompt;
 * Ctrl-D (end of input) leaves. A conversation that outgrows the context is reported, not silently cut. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/common.h"

typedef struct chat_msg {
    char *role, *content;
} chat_msg;

typedef struct chat_reply {
    g3_detok *detok;
    char *text;
    size_t len, cap;
    int n_tokens;
    g3_finish finish;
    double t0, t_first, t_last;
} chat_reply;

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
}

static void append(chat_reply *r, const char *s, size_t n) {
    if (r->len + n + 1 > r->cap) {
        size_t cap = (r->len + n + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t) return;
        r->text = t, r->cap = cap;
    }
    memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = 0;
}

static void on_event(const g3_event *ev, void *ctx) {
    chat_reply *r = ctx;
    if (ev->has_token) {
        double now = g3_now();
        if (!r->n_tokens) r->t_first = now;
        r->t_last = now;
        r->n_tokens++;
        if (ev->finish != G3_FINISH_STOP) {
            const char *t;
            size_t n;
            g3_error err;
            if (g3_detok_push(r->detok, ev->token, &t, &n, &err) == G3_OK && n) {
                fwrite(t, 1, n, stdout);
                fflush(stdout);
                append(r, t, n);
            }
        }
    }
    if (ev->finish != G3_FINISH_NONE) r->finish = ev->finish;
}

static void free_history(chat_msg *h, int n) {
    for (int i = 0; i < n; i++) free(h[i].role), free(h[i].content);
}

int g3_cli_chat(int argc, char **argv) {
    g3_cli_model_opts mo;
    g3_cli_model_opts_default(&mo);
    const char *system0 = NULL;
    int n_predict = 1024, top_k = 64, seed = -1, verbose = 0, ignore_eos = 0;
    float temp = 1.0f, top_p = 0.95f, min_p = 0, rep = 1;
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &mo.model, "model: Hugging Face folder or .gguf file"},
        {"system", 0, G3_ARG_STR, &system0, "system text (folded into the first user turn)"},
        {"n-predict", 'n', G3_ARG_INT, &n_predict, "tokens per reply at most"},
        {"temp", 0, G3_ARG_FLOAT, &temp, "temperature (0 = greedy)"},
        {"top-k", 0, G3_ARG_INT, &top_k, "top-k (0 = off)"},
        {"top-p", 0, G3_ARG_FLOAT, &top_p, "top-p (1 = off)"},
        {"min-p", 0, G3_ARG_FLOAT, &min_p, "min-p (0 = off)"},
        {"repeat-penalty", 0, G3_ARG_FLOAT, &rep, "repetition penalty (1 = off)"},
        {"seed", 's', G3_ARG_INT, &seed, "random seed (-1 = from the clock)"},
        {"verbose", 'v', G3_ARG_FLAG, &verbose, "print speed after each reply"},
        {"ignore-eos", 0, G3_ARG_FLAG, &ignore_eos, "replies run to --n-predict instead of ending at <end_of_turn>"},
        {"backend", 0, G3_ARG_STR, &mo.backend, "cpu, cuda, vulkan or auto"},
        {"device", 0, G3_ARG_INT, &mo.device, "GPU index (gemma3 info --devices)"},
        {"quant", 0, G3_ARG_STR, &mo.quant, G3_CLI_HELP_QUANT},
        {"gemm", 0, G3_ARG_STR, &mo.gemm, G3_CLI_HELP_GEMM},
        {"kv-cache", 0, G3_ARG_STR, &mo.kv_cache, G3_CLI_HELP_KV_CACHE},
        {"threads", 't', G3_ARG_INT, &mo.threads, "CPU threads (0 = all cores)"},
        {"ctx-size", 'c', G3_ARG_INT, &mo.ctx_size, "context size in tokens (0 = min(model, 4096))"},
    };
    int rc = g3_args_parse("chat", "Interactive chat. Commands: /reset, /system TEXT, /quit (or Ctrl-D); "
                                   "Ctrl-C stops a reply.", args, sizeof args / sizeof args[0], argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (n_predict <= 0 || temp < 0 || top_p <= 0 || top_p > 1 || min_p < 0 || min_p > 1 || rep <= 0 || top_k < 0) {
        fprintf(stderr, "gemma3 chat: sampling settings out of range\n");
        return 2;
    }
    g3_model *m;
    g3_engine *e;
    if (!g3_cli_open("chat", &mo, &m, &e)) return 1;
    g3_error err = {0};
    g3_tokenizer *tok = NULL;
    chat_reply reply = {0};
    if (g3_tokenizer_load(mo.model, &tok, &err) != G3_OK || g3_detok_create(tok, &reply.detok, &err) != G3_OK) {
        fprintf(stderr, "gemma3 chat: %s\n", err.msg);
        g3_tokenizer_free(tok);
        g3_engine_free(e);
        g3_model_free(m);
        return 1;
    }
    int ctx = mo.ctx_size > 0 ? mo.ctx_size : (g3_model_config(m)->max_ctx < 4096 ? g3_model_config(m)->max_ctx : 4096);
    chat_msg hist[512];
    int n_hist = 0;
    char *system = system0 ? strdup(system0) : NULL;
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, &old);
    uint64_t seed_base = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL);
    fprintf(stderr, "gemma3 chat: %s on %s, context %d tokens. /reset, /system TEXT, /quit; Ctrl-C stops a reply.\n",
            mo.model, g3_engine_backend_name(e), ctx);
    char line[16384];
    for (int turn = 0;; turn++) {
        printf("\n> ");
        fflush(stdout);
        g_stop = 0;
        if (!fgets(line, sizeof line, stdin)) {
            if (g_stop) { clearerr(stdin); continue; } /* Ctrl-C at the prompt: stay */
            printf("\n");
            break;
        }
        size_t ln = strlen(line);
        while (ln && (line[ln - 1] == '\n' || line[ln - 1] == '\r')) line[--ln] = 0;
        if (!ln) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            free_history(hist, n_hist);
            n_hist = 0;
            printf("(conversation cleared)\n");
            continue;
        }
        if (!strncmp(line, "/system", 7)) {
            free(system);
            system = line[7] ? strdup(line + 8) : NULL;
            free_history(hist, n_hist);
            n_hist = 0;
            printf(system ? "(system text set; conversation cleared)\n" : "(system text removed; conversation cleared)\n");
            continue;
        }
        if (line[0] == '/') {
            printf("(unknown command %s: /reset, /system TEXT, /quit)\n", line);
            continue;
        }
        if (n_hist + 2 > (int)(sizeof hist / sizeof hist[0])) {
            printf("(the conversation has too many turns: /reset to start over)\n");
            continue;
        }
        hist[n_hist].role = strdup("user"), hist[n_hist].content = strdup(line), n_hist++;
        g3_chat_message msgs[515];
        int n = 0;
        if (system) msgs[n++] = (g3_chat_message){"system", system};
        for (int i = 0; i < n_hist; i++) msgs[n++] = (g3_chat_message){hist[i].role, hist[i].content};
        int32_t *ids = NULL;
        int n_ids = 0;
        if (g3_chat_tokenize(tok, msgs, n, 1, &ids, &n_ids, &err) != G3_OK) {
            printf("(error: %s)\n", err.msg);
            n_hist--, free(hist[n_hist].role), free(hist[n_hist].content);
            continue;
        }
        if (n_ids >= ctx - 1) {
            printf("(the conversation is %d tokens and the context holds %d: /reset to start a new one, or restart "
                   "with a larger --ctx-size)\n", n_ids, ctx);
            free(ids);
            n_hist--, free(hist[n_hist].role), free(hist[n_hist].content);
            continue;
        }
        g3_request req = {.prompt = ids, .n_prompt = n_ids, .max_tokens = n_predict, .ignore_eos = ignore_eos};
        g3_sampling_default(&req.sampling);
        req.sampling.temperature = temp, req.sampling.top_k = top_k, req.sampling.top_p = top_p;
        req.sampling.min_p = min_p, req.sampling.repetition_penalty = rep, req.sampling.seed = seed_base + (uint64_t)turn;
        g3_request_id rid;
        reply.len = 0, reply.n_tokens = 0, reply.finish = G3_FINISH_NONE, reply.t0 = g3_now();
        g3_detok_reset(reply.detok);
        if (g3_engine_submit(e, &req, &rid, &err) != G3_OK) {
            printf("(error: %s)\n", err.msg);
            free(ids);
            n_hist--, free(hist[n_hist].role), free(hist[n_hist].content);
            continue;
        }
        free(ids);
        int active = 1;
        while (active) {
            if (g_stop) {
                g3_engine_cancel(e, rid);
                g_stop = 0;
            }
            if (g3_engine_step(e, on_event, &reply, &active, &err) != G3_OK) {
                printf("\n(error: %s)\n", err.msg);
                break;
            }
        }
        size_t rest_n;
        const char *rest = g3_detok_flush(reply.detok, &rest_n);
        if (rest_n) fwrite(rest, 1, rest_n, stdout), append(&reply, rest, rest_n);
        if (reply.finish == G3_FINISH_CANCELLED) printf(" [stopped]");
        else if (reply.finish == G3_FINISH_LENGTH) printf(" [reply cut at %d tokens]", reply.n_tokens);
        printf("\n");
        if (verbose && reply.n_tokens > 1)
            fprintf(stderr, "[%d tokens, first token %.0f ms, %.1f tok/s]\n", reply.n_tokens,
                    1e3 * (reply.t_first - reply.t0), (reply.n_tokens - 1) / (reply.t_last - reply.t_first));
        hist[n_hist].role = strdup("model");
        hist[n_hist].content = strdup(reply.text ? reply.text : "");
        n_hist++;
    }
    sigaction(SIGINT, &old, NULL);
    free_history(hist, n_hist);
    free(system);
    free(reply.text);
    g3_detok_free(reply.detok);
    g3_tokenizer_free(tok);
    g3_engine_free(e);
    g3_model_free(m);
    return 0;
}
