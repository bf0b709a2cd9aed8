/* `gemma3 serve`: loads a model once and serves it over an OpenAI-compatible HTTP API (src/server/). The HTTP
 * side starts first so that GET /health answers 503 while the model loads; SIGINT/SIGTERM stop it gracefully
 * (in-flight requests get --grace seconds to finish, then are cancelled) and the process exits 0. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "server/ops_engine.h"
#include "server/server.h"

/* Sampling defaults from the model folder's generation_config.json (top_k, top_p, temperature), as vLLM applies
 * them to requests that leave the fields out. Returns 1 when the file was found. */
static int load_generation_config(const char *model, g3_sampling *s) {
    char path[2048];
    snprintf(path, sizeof path, "%s/generation_config.json", model);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!j) return 0;
    const cJSON *v;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "temperature")) && v->valuedouble >= 0)
        s->temperature = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_k")) && v->valuedouble >= 0)
        s->top_k = (int)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_p")) && v->valuedouble > 0 &&
        v->valuedouble <= 1)
        s->top_p = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "min_p")) && v->valuedouble >= 0 &&
        v->valuedouble <= 1)
        s->min_p = (float)v->valuedouble;
    cJSON_Delete(j);
    return 1;
}

/* "path/to/small-a/" -> "small-a"; "x/model-q8_0.gguf" -> "model-q8_0". */
static void default_model_name(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    size_t len = n - b;
    if (len > 5 && !strncmp(path + n - 5, ".gguf", 5)) len -= 5;
    if (len >= cap) len = cap - 1;
    memcpy(out, path + b, len);
    out[len] = 0;
    if (!out[0]) snprintf(out, cap, "gemma3");
}

int g3_cli_serve(int argc, char **argv) {
    const char *model = NULL, *host = "127.0.0.1", *api_key = NULL, *model_name = NULL, *backend = "auto";
    int port = 8006, threads = 0, ctx_size = 0, max_seqs = 16, kv_blocks = 0, kv_block = 0, prefill_chunk = 0;
    int max_queue = 256, max_body_kb = 4096, grace_s = 10, quiet = 0, step_delay_ms = 0, no_gen_config = 0;
    int no_prefix_cache = 0, device = 0;
    const char *quant = NULL, *gemm = NULL, *kv_cache = NULL;
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &model, "model: Hugging Face folder or .gguf file"},
        {"host", 0, G3_ARG_STR, &host, "address to listen on (0.0.0.0 = every interface)"},
        {"port", 0, G3_ARG_INT, &port, "TCP port (0 = any free port; the log line says which)"},
        {"api-key", 0, G3_ARG_STR, &api_key, "require 'Authorization: Bearer KEY' (or set GEMMA3_API_KEY)"},
        {"model-name", 0, G3_ARG_STR, &model_name, "model id to report and accept (default: the file/folder name)"},
        {"backend", 0, G3_ARG_STR, &backend, "cpu, cuda, vulkan or auto"},
        {"device", 0, G3_ARG_INT, &device, "GPU index (gemma3 info --devices)"},
        {"quant", 0, G3_ARG_STR, &quant, G3_CLI_HELP_QUANT},
        {"gemm", 0, G3_ARG_STR, &gemm, G3_CLI_HELP_GEMM},
        {"kv-cache", 0, G3_ARG_STR, &kv_cache, G3_CLI_HELP_KV_CACHE},
        {"threads", 't', G3_ARG_INT, &threads, "CPU threads (0 = all cores)"},
        {"ctx-size", 'c', G3_ARG_INT, &ctx_size, "tokens per sequence, prompt + reply (0 = min(model, 4096))"},
        {"max-seqs", 0, G3_ARG_INT, &max_seqs, "sequences decoded together (continuous batching)"},
        {"kv-blocks", 0, G3_ARG_INT, &kv_blocks, "KV blocks in the pool (0 = max-seqs full contexts)"},
        {"kv-block", 0, G3_ARG_INT, &kv_block, "tokens per KV block (0 = 16)"},
        {"prefill-chunk", 0, G3_ARG_INT, &prefill_chunk, "prompt tokens per step at most (0 = 512)"},
        {"no-prefix-cache", 0, G3_ARG_FLAG, &no_prefix_cache, "do not reuse KV blocks of shared prompt prefixes"},
        {"max-queue", 0, G3_ARG_INT, &max_queue, "sequences that may wait beyond max-seqs; more get 429"},
        {"max-body-kb", 0, G3_ARG_INT, &max_body_kb, "request body limit in KiB; larger bodies get 413"},
        {"grace", 0, G3_ARG_INT, &grace_s, "seconds in-flight requests get to finish on SIGINT/SIGTERM"},
        {"no-generation-config", 0, G3_ARG_FLAG, &no_gen_config,
         "ignore the model's generation_config.json (defaults: temperature 1, no top-k/top-p)"},
        {"quiet", 'q', G3_ARG_FLAG, &quiet, "no per-request log lines"},
        {"test-step-delay-ms", 0, G3_ARG_INT, &step_delay_ms, "tests only: sleep after every engine step"},
    };
    int rc = g3_args_parse("serve", "Serve a model over an OpenAI-compatible HTTP API.", args,
                           sizeof args / sizeof args[0], argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!model) {
        fprintf(stderr, "gemma3 serve: no model given (-m MODEL: a Hugging Face folder or a .gguf file)\n");
        return 2;
    }
    if (port < 0 || port > 65535 || max_seqs < 1 || max_queue < 0 || max_body_kb < 1 || grace_s < 0 ||
        ctx_size < 0 || kv_blocks < 0 || kv_block < 0 || prefill_chunk < 0 || step_delay_ms < 0) {
        fprintf(stderr, "gemma3 serve: option out of range (port 0..65535, max-seqs >= 1, others >= 0)\n");
        return 2;
    }
    if (!api_key || !*api_key) api_key = getenv("GEMMA3_API_KEY");
    g3_cli_model_opts mo;
    g3_cli_model_opts_default(&mo);
    mo.backend = backend, mo.quant = quant, mo.gemm = gemm, mo.kv_cache = kv_cache;
    if (device < 0 || !g3_cli_apply_quant("serve", &mo)) {
        if (device < 0) fprintf(stderr, "gemma3 serve: --device must be >= 0\n");
        return 2;
    }

    /* Signals are taken by sigwait below: block them before any thread starts so every thread inherits it. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    char name[256];
    if (model_name && *model_name) snprintf(name, sizeof name, "%s", model_name);
    else default_model_name(model, name, sizeof name);
    g3_server_opts so;
    g3_server_opts_default(&so);
    so.host = host;
    so.port = port;
    so.api_key = api_key;
    so.model_name = name;
    so.max_queue = max_queue;
    so.max_body = (size_t)max_body_kb * 1024;
    so.step_delay_ms = step_delay_ms;
    so.log_requests = !quiet;
    struct stat st;
    int gen_cfg = !no_gen_config && stat(model, &st) == 0 && S_ISDIR(st.st_mode) &&
                  load_generation_config(model, &so.defaults);

    g3_error err = {0};
    g3_server *srv = NULL;
    if (g3_server_start(&so, &srv, &err) != G3_OK) {
        fprintf(stderr, "gemma3 serve: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "gemma3 serve: listening on http://%s:%d (loading %s)\n", host, g3_server_port(srv), model);

    g3_model *m = NULL;
    g3_engine *e = NULL;
    g3_tokenizer *tok = NULL;
    int status = 1;
    g3_load_opts lo = {.progress = 0, .ctx_hint = ctx_size};
    if (g3_model_load(model, &lo, &m, &err) != G3_OK || g3_tokenizer_load(model, &tok, &err) != G3_OK) {
        fprintf(stderr, "gemma3 serve: %s\n", err.msg);
        goto out;
    }
    const g3_config *cfg = g3_model_config(m);
    g3_engine_opts eo;
    g3_engine_opts_default(&eo);
    eo.backend = backend;
    eo.device = device;
    eo.n_threads = threads;
    eo.ctx_size = ctx_size;
    eo.max_seqs = max_seqs;
    eo.n_kv_blocks = kv_blocks;
    eo.kv_block = kv_block;
    eo.prefill_chunk = prefill_chunk;
    eo.prefix_cache = no_prefix_cache ? -1 : 0;
    if (g3_engine_create(m, &eo, &e, &err) != G3_OK) {
        fprintf(stderr, "gemma3 serve: %s\n", err.msg);
        goto out;
    }
    int ctx = g3_engine_ctx_size(e);
    g3_srv_engine se = {.engine = e, .tok = tok, .ctx_size = ctx, .max_seqs = max_seqs};
    g3_srv_ops ops;
    g3_srv_ops_from_engine(&ops, &se);
    if (g3_server_attach(srv, &ops, &err) != G3_OK) {
        fprintf(stderr, "gemma3 serve: %s\n", err.msg);
        goto out;
    }
    g3_engine_stats es;
    g3_engine_get_stats(e, &es);
    fprintf(stderr,
            "gemma3 serve: ready: model '%s' (%s, %d layers) on %s, context %d, max-seqs %d, %d KV blocks, prefix cache "
            "%s, defaults temperature %g top_k %d top_p %g%s\n",
            name, cfg->size_name, cfg->n_layers, g3_engine_backend_name(e), ctx, max_seqs, es.kv_blocks_total,
            no_prefix_cache ? "off" : "on", (double)so.defaults.temperature,
            so.defaults.top_k, (double)so.defaults.top_p, gen_cfg ? " (generation_config.json)" : "");

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "gemma3 serve: %s received, finishing in-flight requests (up to %d s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", grace_s);
    g3_server_shutdown(srv, grace_s * 1000);
    fprintf(stderr, "gemma3 serve: stopped\n");
    status = 0;
out:
    g3_server_free(srv); /* stops the engine thread before the engine goes */
    g3_engine_free(e);
    g3_tokenizer_free(tok);
    g3_model_free(m);
    return status;
}
