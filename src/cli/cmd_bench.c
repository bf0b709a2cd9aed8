/* `gemma3 bench`: prefill and decode speed of a model file or of random weights in any released shape, through
 * the same engine as run/serve. Reports tokens/s, time to first token, and the effective weight-read bandwidth of
 * decode (bytes of all matrices per token x tokens/s), as a ratio to --bw when given. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "model/model.h"

static int parse_type(const char *s, g3_dtype *t) {
    static const struct { const char *n; g3_dtype t; } tab[] = {
        {"f32", G3_DTYPE_F32}, {"f16", G3_DTYPE_F16}, {"bf16", G3_DTYPE_BF16}, {"q8_0", G3_DTYPE_Q8_0},
        {"q4_0", G3_DTYPE_Q4_0}, {"q4_k", G3_DTYPE_Q4_K}, {"q6_k", G3_DTYPE_Q6_K}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcasecmp(s, tab[i].n)) return *t = tab[i].t, 1;
    return 0;
}

typedef struct bench_ev {
    double t_first, t_last;
    int n_tokens;
    int n_done;
} bench_ev;

static void on_ev(const g3_event *ev, void *ctx) {
    bench_ev *b = ctx;
    if (ev->has_token) {
        double t = g3_now();
        if (b->n_tokens == 0) b->t_first = t;
        b->t_last = t;
        b->n_tokens++;
    }
    if (ev->finish != G3_FINISH_NONE) b->n_done++;
}

int g3_cli_bench(int argc, char **argv) {
    g3_cli_model_opts mo;
    g3_cli_model_opts_default(&mo);
    const char *random = NULL, *type_s = "q8_0", *batches_s = "1";
    int n_prompt = 512, n_gen = 128, layers = 0, reps = 3; /* best of 3: the first also warms up (lazy driver work) */
    float bw = 0;
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &mo.model, "model: Hugging Face folder or .gguf file"},
        {"random-weights", 0, G3_ARG_STR, &random, "random weights of a released shape: 270m, 1b, 4b, 12b, 27b"},
        {"type", 0, G3_ARG_STR, &type_s, "weight type with --random-weights: bf16, f16, f32, q8_0, q4_0, q4_k, q6_k"},
        {"layers", 0, G3_ARG_INT, &layers, "with --random-weights: only this many layers (0 = all)"},
        {"n-prompt", 'p', G3_ARG_INT, &n_prompt, "prompt tokens for the prefill measurement"},
        {"n-gen", 'n', G3_ARG_INT, &n_gen, "tokens to decode"},
        {"batch", 'b', G3_ARG_STR, &batches_s, "concurrent sequences for decode, comma-separated list"},
        {"reps", 'r', G3_ARG_INT, &reps, "repetitions of the prefill measurement (the best is kept)"},
        {"bw", 0, G3_ARG_FLOAT, &bw, "measured memory read bandwidth in GB/s, to print decode as a ratio of it"},
        {"backend", 0, G3_ARG_STR, &mo.backend, "cpu, cuda, vulkan or auto"},
        {"device", 0, G3_ARG_INT, &mo.device, "GPU index (gemma3 info --devices)"},
        {"quant", 0, G3_ARG_STR, &mo.quant, "weights on the GPU: bf16, int8, int4 or fp8 (cuda backend)"},
        {"gemm", 0, G3_ARG_STR, &mo.gemm, "cuda products of many rows: exact (bf16 hi+lo activations, the default) or "
                                          "fast (plain bf16: ~2x prefill, ~2^-9 rounding of activations)"},
        {"threads", 't', G3_ARG_INT, &mo.threads, "CPU threads (0 = all cores)"},
    };
    int rc = g3_args_parse("bench", "Measure prefill and decode speed.", args, sizeof args / sizeof args[0], argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!!mo.model == !!random) {
        fprintf(stderr, "gemma3 bench: give -m MODEL or --random-weights SIZE\n");
        return 2;
    }
    int *batches, n_batches;
    if (!g3_parse_ids(batches_s, &batches, &n_batches)) return 2;
    int max_b = 1;
    for (int i = 0; i < n_batches; i++) {
        if (batches[i] < 1) {
            fprintf(stderr, "gemma3 bench: batch sizes must be >= 1\n");
            free(batches);
            return 2;
        }
        if (batches[i] > max_b) max_b = batches[i];
    }
    if (n_prompt < 1 || n_gen < 1 || reps < 1) {
        fprintf(stderr, "gemma3 bench: --n-prompt, --n-gen and --reps must be >= 1\n");
        free(batches);
        return 2;
    }
    g3_error err = {0};
    g3_model *m = NULL;
    g3_engine *e = NULL;
    int status = 1;
    if (!g3_cli_apply_quant("bench", &mo)) {
        free(batches);
        return 2;
    }
    double t0 = g3_now();
    if (random) {
        g3_dtype t;
        if (!parse_type(type_s, &t)) {
            fprintf(stderr, "gemma3 bench: unknown --type %s\n", type_s);
            free(batches);
            return 2;
        }
        if (g3_model_random(random, t, 1234, layers, &m, &err) != G3_OK) goto fail;
    } else {
        g3_load_opts lo = {.progress = 1};
        if (g3_model_load(mo.model, &lo, &m, &err) != G3_OK) goto fail;
    }
    double t_load = g3_now() - t0;
    const g3_config *c = g3_model_config(m);
    g3_engine_opts eo;
    g3_engine_opts_default(&eo);
    eo.backend = mo.backend;
    eo.n_threads = mo.threads;
    eo.device = mo.device;
    eo.max_seqs = max_b;
    eo.ctx_size = n_prompt + n_gen + 8;
    if (eo.ctx_size > c->max_ctx) eo.ctx_size = c->max_ctx;
    eo.prefill_chunk = n_prompt < 512 ? n_prompt : 512;
    if (g3_engine_create(m, &eo, &e, &err) != G3_OK) goto fail;
    /* bytes of weights a decode step reads: as stored, or as --quant converts them on the GPU (int8/fp8: 1 byte
     * per weight; int4: half a byte plus a 16-bit scale per group of 128) */
    double decode_bytes = (double)g3_model_decode_bytes(m);
    if (mo.quant && strcmp(g3_engine_backend_name(e), "cpu") != 0) {
        double bpw = !strcmp(mo.quant, "int4") ? 0.5 + 2.0 / 128 : !strcmp(mo.quant, "bf16") ? 2.0 : 1.0;
        decode_bytes = bpw * (double)m->n_params;
    }
    printf("model %s: %s, %.3f B parameters, %.2f GB of weights read per token%s%s; backend %s; load %.1f s\n",
           random ? random : mo.model, c->size_name, (double)m->n_params / 1e9, decode_bytes / 1e9,
           mo.quant ? " as " : "", mo.quant ? mo.quant : "", g3_engine_backend_name(e), t_load);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    float *lg = malloc(sizeof(float) * (size_t)c->vocab);
    if (!prompt || !lg) {
        free(prompt), free(lg);
        g3_fail(&err, G3_ERR_NOMEM, "out of memory");
        goto fail;
    }
    uint64_t s = 42;
    for (int i = 0; i < n_prompt; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int32_t lo = c->vocab > 2000 ? 1000 : 0; /* ordinary pieces, past the special ids, when there are enough */
        prompt[i] = i == 0 ? c->bos_id : (int32_t)(lo + (int32_t)((s >> 33) % (uint64_t)(c->vocab - lo)));
    }
    /* prefill: the whole prompt's logits of the last position, best of reps */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double a = g3_now();
        if (g3_engine_logits(e, prompt, n_prompt, 0, lg, &err) != G3_OK) {
            free(prompt), free(lg);
            goto fail;
        }
        double dt = g3_now() - a;
        if (dt < best) best = dt;
    }
    printf("prefill  %5d tokens: %9.1f tok/s  (%.1f ms; %.1f GFLOP/s)\n", n_prompt, n_prompt / best, 1e3 * best,
           2.0 * (double)m->n_params * n_prompt / best / 1e9);
    /* decode: B sequences, each a short prompt then n_gen tokens; rate measured after every first token */
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        int short_prompt = n_prompt < 16 ? n_prompt : 16;
        bench_ev be = {0};
        for (int i = 0; i < B; i++) {
            g3_request rq = {.prompt = prompt, .n_prompt = short_prompt, .max_tokens = n_gen, .ignore_eos = 1};
            g3_sampling_default(&rq.sampling);
            if (g3_engine_submit(e, &rq, NULL, &err) != G3_OK) {
                free(prompt), free(lg);
                goto fail;
            }
        }
        int active = 1, first_done = 0;
        double t_dec0 = 0;
        int tokens_at_t0 = 0;
        double a = g3_now();
        while (active) {
            if (g3_engine_step(e, on_ev, &be, &active, &err) != G3_OK) {
                free(prompt), free(lg);
                goto fail;
            }
            if (!first_done && be.n_tokens >= B) { /* every sequence has its first token: decode starts */
                first_done = 1;
                t_dec0 = g3_now();
                tokens_at_t0 = be.n_tokens;
            }
        }
        double ttft = be.t_first - a;
        double dt = be.t_last - t_dec0;
        int toks = be.n_tokens - tokens_at_t0;
        double tps = dt > 0 ? toks / dt : 0;
        double gbs = tps / B * decode_bytes / 1e9;
        printf("decode   batch %3d: %9.2f tok/s  (%d tokens; %.2f tok/s per sequence; weights %.1f GB/s", B, tps,
               toks, tps / B, gbs);
        if (bw > 0) printf(" = %.0f%% of %.1f GB/s", 100.0 * gbs / bw, (double)bw);
        printf("; first token %.1f ms)\n", 1e3 * ttft);
    }
    free(prompt), free(lg);
    status = 0;
    goto out;
fail:
    fprintf(stderr, "gemma3 bench: %s\n", err.msg);
out:
    free(batches);
    g3_engine_free(e);
    g3_model_free(m);
    return status;
}
