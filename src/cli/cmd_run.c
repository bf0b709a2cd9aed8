/* `gemma3 run`: one prompt (text, file, chat-wrapped text, or token ids) through the engine, the reply streamed to
 * stdout as it is generated, and a one-line summary on stderr. With --print-ids it prints only the generated ids,
 * comma-separated on one line (a fixed contract used by external checks). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "tokenizer/textstream.h"

#define MAX_STOPS 8

typedef struct run_state {
    int print_ids;
    int n_printed;
    g3_detok *detok;
    g3_textstream ts;       /* holds back text that may start a stop string */
    g3_buf out;
    int stop_hit;
    g3_engine *engine;
    g3_request_id id;
    const g3_tokenizer *tok;
    double t_start, t_first, t_last;
    int n_gen;
    g3_finish finish;
} run_state;

static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void on_event(const g3_event *ev, void *ctx) {
    run_state *s = ctx;
    if (ev->has_token) {
        double now = g3_now();
        if (s->n_gen == 0) s->t_first = now;
        s->t_last = now;
        s->n_gen++;
        int is_stop = ev->finish == G3_FINISH_STOP;
        if (s->print_ids) {
            printf("%s%d", s->n_printed++ ? "," : "", ev->token);
        } else if (!is_stop && s->detok && !s->stop_hit) {
            const char *text;
            size_t len;
            g3_error err;
            if (g3_detok_push(s->detok, ev->token, &text, &len, &err) == G3_OK && len) {
                s->out.len = 0;
                if (g3_textstream_push(&s->ts, text, len, &s->out)) { /* a stop string: end the request */
                    s->stop_hit = 1;
                    g3_engine_cancel(s->engine, s->id);
                }
                if (s->out.len) fwrite(s->out.data, 1, s->out.len, stdout);
            }
        }
        fflush(stdout);
    }
    if (ev->finish != G3_FINISH_NONE) s->finish = ev->finish;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

int g3_cli_run(int argc, char **argv) {
    g3_cli_model_opts mo;
    g3_cli_model_opts_default(&mo);
    const char *prompt = NULL, *file = NULL, *ids_s = NULL, *system = NULL;
    int n_predict = 256, print_ids = 0, ignore_eos = 0, chat = 0, parse_special = 0, seed = -1, top_k = 64;
    const char *stop_arg = NULL;
    float temp = 1.0f, top_p = 0.95f, min_p = 0, rep = 1, pres = 0, freq = 0;
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &mo.model, "model: Hugging Face folder or .gguf file"},
        {"prompt", 'p', G3_ARG_STR, &prompt, "prompt text"},
        {"file", 'f', G3_ARG_STR, &file, "read the prompt text from a file"},
        {"prompt-ids", 0, G3_ARG_STR, &ids_s, "prompt as token ids, comma-separated (BOS included if wanted)"},
        {"chat", 0, G3_ARG_FLAG, &chat, "wrap the prompt in Gemma's chat format"},
        {"system", 0, G3_ARG_STR, &system, "system text (with --chat; folded into the first user turn)"},
        {"parse-special", 0, G3_ARG_FLAG, &parse_special, "match <start_of_turn> etc. in the prompt text"},
        {"n-predict", 'n', G3_ARG_INT, &n_predict, "tokens to generate at most"},
        {"temp", 0, G3_ARG_FLOAT, &temp, "temperature (0 = greedy)"},
        {"top-k", 0, G3_ARG_INT, &top_k, "top-k (0 = off)"},
        {"top-p", 0, G3_ARG_FLOAT, &top_p, "top-p (1 = off)"},
        {"min-p", 0, G3_ARG_FLOAT, &min_p, "min-p (0 = off)"},
        {"repeat-penalty", 0, G3_ARG_FLOAT, &rep, "repetition penalty (1 = off)"},
        {"presence-penalty", 0, G3_ARG_FLOAT, &pres, "presence penalty (0 = off)"},
        {"frequency-penalty", 0, G3_ARG_FLOAT, &freq, "frequency penalty (0 = off)"},
        {"seed", 's', G3_ARG_INT, &seed, "random seed (-1 = from the clock)"},
        {"ignore-eos", 0, G3_ARG_FLAG, &ignore_eos, "keep generating past <eos> / <end_of_turn>"},
        {"stop", 0, G3_ARG_STR, &stop_arg, "stop strings, separated by '|' (the text ends before the first match)"},
        {"print-ids", 0, G3_ARG_FLAG, &print_ids, "print only the generated ids, comma-separated"},
        {"backend", 0, G3_ARG_STR, &mo.backend, "cpu, cuda, vulkan or auto"},
        {"device", 0, G3_ARG_INT, &mo.device, "GPU index (gemma3 info --devices)"},
        {"quant", 0, G3_ARG_STR, &mo.quant, G3_CLI_HELP_QUANT},
        {"gemm", 0, G3_ARG_STR, &mo.gemm, G3_CLI_HELP_GEMM},
        {"kv-cache", 0, G3_ARG_STR, &mo.kv_cache, G3_CLI_HELP_KV_CACHE},
        {"threads", 't', G3_ARG_INT, &mo.threads, "CPU threads (0 = all cores)"},
        {"ctx-size", 'c', G3_ARG_INT, &mo.ctx_size, "context size in tokens (0 = min(model, 4096))"},
    };
    int rc = g3_args_parse("run", "Generate a reply to one prompt.", args, sizeof args / sizeof args[0], argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    int n_src = (prompt != NULL) + (file != NULL) + (ids_s != NULL);
    if (n_src != 1) {
        fprintf(stderr, "gemma3 run: give exactly one of -p TEXT, -f FILE or --prompt-ids IDS\n");
        return 2;
    }
    if (n_predict <= 0 || temp < 0 || top_k < 0 || top_p <= 0 || top_p > 1 || min_p < 0 || min_p > 1 || rep <= 0) {
        fprintf(stderr, "gemma3 run: sampling settings out of range (n-predict > 0, temp >= 0, 0 < top-p <= 1, "
                        "0 <= min-p <= 1, repeat-penalty > 0)\n");
        return 2;
    }
    char *file_text = NULL;
    if (file && !(file_text = read_file(file))) {
        fprintf(stderr, "gemma3 run: cannot read prompt file %s\n", file);
        return 2;
    }
    mo.quiet = print_ids;
    int32_t *ids = NULL;
    int n_ids = 0, status = 1;
    g3_model *m = NULL;
    g3_engine *e = NULL;
    g3_tokenizer *tok = NULL;
    g3_error err = {0};
    run_state st = {.print_ids = print_ids, .finish = G3_FINISH_NONE};
    char *stop_copy = stop_arg ? strdup(stop_arg) : NULL;
    const char *stops[MAX_STOPS];
    int n_stops = 0;
    for (char *save = NULL, *tok_s = stop_copy ? strtok_r(stop_copy, "|", &save) : NULL; tok_s && n_stops < MAX_STOPS;
         tok_s = strtok_r(NULL, "|", &save))
        stops[n_stops++] = tok_s;
    g3_textstream_init(&st.ts, stops, n_stops);
    if (ids_s) {
        int *tmp;
        if (!g3_parse_ids(ids_s, &tmp, &n_ids)) goto out_status2;
        ids = (int32_t *)tmp;
    }
    if (!g3_cli_open("run", &mo, &m, &e)) goto out;
    if (!print_ids || !ids) {
        if (g3_tokenizer_load(mo.model, &tok, &err) != G3_OK) {
            fprintf(stderr, "gemma3 run: %s\n", err.msg);
            goto out;
        }
        if (g3_detok_create(tok, &st.detok, &err) != G3_OK) {
            fprintf(stderr, "gemma3 run: %s\n", err.msg);
            goto out;
        }
    }
    if (!ids) {
        const char *text = prompt ? prompt : file_text;
        if (chat) {
            g3_chat_message msgs[2];
            int n = 0;
            if (system) msgs[n++] = (g3_chat_message){"system", system};
            msgs[n++] = (g3_chat_message){"user", text};
            if (g3_chat_tokenize(tok, msgs, n, 1, &ids, &n_ids, &err) != G3_OK) {
                fprintf(stderr, "gemma3 run: %s\n", err.msg);
                goto out;
            }
        } else {
            int32_t *body;
            int n_body;
            if (g3_tokenize(tok, text, strlen(text), parse_special, &body, &n_body, &err) != G3_OK) {
                fprintf(stderr, "gemma3 run: %s\n", err.msg);
                goto out;
            }
            ids = malloc(sizeof(int32_t) * (size_t)(n_body + 1));
            if (!ids) { free(body); goto out; }
            ids[0] = g3_model_config(m)->bos_id;
            memcpy(ids + 1, body, sizeof(int32_t) * (size_t)n_body);
            n_ids = n_body + 1;
            free(body);
        }
    }
    g3_request req = {.prompt = ids, .n_prompt = n_ids, .max_tokens = n_predict, .ignore_eos = ignore_eos};
    g3_sampling_default(&req.sampling);
    req.sampling.temperature = temp, req.sampling.top_k = top_k, req.sampling.top_p = top_p;
    req.sampling.min_p = min_p, req.sampling.repetition_penalty = rep;
    req.sampling.presence_penalty = pres, req.sampling.frequency_penalty = freq;
    req.sampling.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    g3_request_id rid;
    st.t_start = g3_now();
    st.engine = e;
    if (g3_engine_submit(e, &req, &rid, &err) != G3_OK) {
        fprintf(stderr, "gemma3 run: %s\n", err.msg);
        goto out;
    }
    st.id = rid;
    void (*old)(int) = signal(SIGINT, on_sigint);
    int active = 1;
    while (active) {
        if (g_interrupted) {
            g3_engine_cancel(e, rid);
            g_interrupted = 0;
        }
        if (g3_engine_step(e, on_event, &st, &active, &err) != G3_OK) {
            fprintf(stderr, "\ngemma3 run: %s\n", err.msg);
            signal(SIGINT, old);
            goto out;
        }
    }
    signal(SIGINT, old);
    if (st.detok && !print_ids && !st.stop_hit) {
        size_t len;
        const char *rest = g3_detok_flush(st.detok, &len);
        st.out.len = 0;
        if (len) g3_textstream_push(&st.ts, rest, len, &st.out);
        g3_textstream_flush(&st.ts, &st.out);
        if (st.out.len) fwrite(st.out.data, 1, st.out.len, stdout);
    }
    printf("\n");
    fflush(stdout);
    if (!print_ids) {
        double ttft = st.t_first - st.t_start, dec = st.t_last - st.t_first;
        fprintf(stderr, "[prompt %d tokens, first token %.0f ms, prefill %.1f tok/s, decode %.2f tok/s (%d tokens), "
                        "%s, backend %s]\n",
                n_ids, 1e3 * ttft, ttft > 0 ? n_ids / ttft : 0.0, st.n_gen > 1 && dec > 0 ? (st.n_gen - 1) / dec : 0.0,
                st.n_gen, st.stop_hit ? "stopped at a stop string" : st.finish == G3_FINISH_STOP ? "stopped at end of turn" :
                          st.finish == G3_FINISH_CANCELLED ? "interrupted" : "length limit",
                g3_engine_backend_name(e));
    }
    status = 0;
    goto out;
out_status2:
    status = 2;
out:
    g3_textstream_deinit(&st.ts);
    g3_buf_free(&st.out);
    free(stop_copy);
    g3_detok_free(st.detok);
    g3_tokenizer_free(tok);
    g3_engine_free(e);
    g3_model_free(m);
    free(ids);
    free(file_text);
    return status;
}
