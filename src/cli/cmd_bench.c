/* `gemma3 bench`: prefill and decode speed of a model file or of random weights in any released shape, through
 * the same engine as run/serve. Reports tokens/s, time to first token, and the effective weight-read bandwidth of
 * decode (bytes of all matrices per token x tokens/s), as a ratio to --bw when given. With --profile, the GPU
 * backends' time per kind of dispatch / launch group of one decode step (g3_vulkan_profile, g3_cuda_profile). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "model/model.h"
#ifdef G3_HAVE_VULKAN
#include "backend/vulkan/vulkan_api.h"
#endif
#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_ev {
    double t_first, t_last;
    int n_tokens;
    int n_first; /* sequences that have their first token */
    int n_done;
} bench_ev;

static void on_ev(const g3_event *ev, void *ctx) {
    bench_ev *b = ctx;
    if (ev->has_token) {
        double t = g3_now();
        if (b->n_tokens == 0) b->t_first = t;
        b->t_last = t;
        b->n_tokens++;
        if (ev->n_generated == 1) b->n_first++;
    }
    if (ev->finish != G3_FINISH_NONE) b->n_done++;
}

/* Prints one profile (the backend's text: "label\ttotal_us\tcount\tper_us[\texec_us]" lines) as
 * `profile | backend | what | label | total | count x per | share of the dispatches' sum [| exec]`. */
static void print_profile(const char *backend, const char *what, char *text) {
    enum { MAX = 64 };
    char name[MAX][64];
    double tot[MAX], per[MAX], exec[MAX], sum = 0, all = -1;
    int cnt[MAX], k[MAX], n = 0;
    for (char *l = strtok(text, "\n"); l && n < MAX; l = strtok(NULL, "\n")) {
        k[n] = sscanf(l, "%63[^\t]\t%lf\t%d\t%lf\t%lf", name[n], &tot[n], &cnt[n], &per[n], &exec[n]);
        if (k[n] < 4) continue;
        if (!strcmp(name[n], "all_dispatches")) all = tot[n];
        else if (strcmp(name[n], "wall")) sum += tot[n];
        n++;
    }
    if (all < 0) all = sum; /* the CUDA profile has no summary line */
    for (int i = 0; i < n; i++) {
        printf("profile | %s | %s | %s | %.1f us total | %d x %.2f us", backend, what, name[i], tot[i], cnt[i], per[i]);
        int summary = !strcmp(name[i], "wall") || !strcmp(name[i], "all_dispatches");
        if (!summary && all > 0) printf(" | %.1f%%", 100.0 * tot[i] / all);
        if (k[i] == 5) printf(" | exec %.1f us", exec[i]);
        printf("\n");
    }
}

/* --profile: one decode step of B sequences at position pos (each row its own sequence, its blocks up to pos mapped,
 * so the pool holds B * (pos / blk + 1) blocks, not B whole contexts) through the backend's profile, on a backend of
 * its own configured as the engine's, blocks of blk tokens (the engine is freed before: no two copies of the
 * weights). The step runs twice (the first warms up) and the second is printed. */
static int profile_decode(const g3_model *m, const char *backend, int device, int n_threads, int max_b, int max_rows,
                          int blk, int ctx, int pos, const int *bs, int n_bs, g3_error *err) {
    int is_vulkan = !strcmp(backend, "vulkan"), is_cuda = !strcmp(backend, "cuda");
#ifndef G3_HAVE_VULKAN
    is_vulkan = 0;
#endif
#ifndef G3_HAVE_CUDA
    is_cuda = 0;
#endif
    if (!is_vulkan && !is_cuda) {
        printf("profile | %s | --profile times the dispatches of the GPU backends (vulkan, cuda): nothing to show here\n",
               backend);
        return 0;
    }
    const g3_config *c = &m->cfg;
    const int bps = (ctx + blk - 1) / blk, need = pos / blk + 1; /* blocks a sequence reads and writes at pos */
    g3_backend_cfg bc = {.n_threads = n_threads, .max_seqs = max_b, .max_rows = max_rows, .kv_block = blk,
                         .max_blocks_per_seq = bps, .device = device};
    bc.n_blocks_global = g3_layers_of_kind(c, 0) ? max_b * need : 0;
    bc.n_blocks_local = g3_layers_of_kind(c, 1) ? max_b * need : 0;
    const g3_backend_ops *ops = g3_backend_find(backend);
    g3_backend *b = NULL;
    size_t cap = 16384;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)max_b * (size_t)bps);
    int32_t *rows = malloc(sizeof(int32_t) * 4 * (size_t)max_b);
    char *text = malloc(cap);
    int rc = 1;
    if (!bt || !rows || !text) {
        g3_fail(err, G3_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!ops || ops->create(m, &bc, &b, err) != G3_OK) {
        if (!ops) g3_fail(err, G3_ERR_ARG, "backend %s not found", backend);
        goto done;
    }
    for (int i = 0; i < max_b * bps; i++) bt[i] = i % bps < need ? i / bps * need + i % bps : 0;
    int32_t *tok = rows, *ps = rows + max_b, *seq = rows + 2 * max_b, *out = rows + 3 * max_b;
    for (int i = 0; i < max_b; i++)
        tok[i] = (int32_t)((1000u + 7919u * (unsigned)i) % (unsigned)c->vocab), ps[i] = pos, seq[i] = i, out[i] = i;
    for (int k = 0; k < n_bs; k++) {
        if (k > 0 && bs[k] == bs[k - 1]) continue;
        g3_batch batch = {.n_rows = bs[k], .token = tok, .pos = ps, .seq = seq, .n_out = bs[k], .out_rows = out,
                          .bt_global = bt, .bt_local = bt};
        (void)batch; /* unused in a build without GPU backends (which returned above) */
        for (int rep = 0; rep < 2; rep++) {
            g3_status st = G3_ERR_ARG;
#ifdef G3_HAVE_VULKAN
            if (is_vulkan) st = g3_vulkan_profile(b, &batch, text, cap, err);
#endif
#ifdef G3_HAVE_CUDA
            if (is_cuda) st = g3_cuda_profile(b, &batch, text, cap, err);
#endif
            if (st != G3_OK) goto done;
        }
        char what[64];
        snprintf(what, sizeof what, "decode %d", bs[k]);
        printf("profile | %s | %s | at position %d of a %d-token context: one step after a warm-up step\n", backend,
               what, pos, ctx);
        print_profile(backend, what, text);
    }
    rc = 0;
done:
    if (b) ops->destroy(b);
    free(bt), free(rows), free(text);
    return rc;
}

int g3_cli_bench(int argc, char **argv) {
    g3_cli_model_opts mo;
    g3_cli_model_opts_default(&mo);
    const char *random = NULL, *type_s = "q8_0", *batches_s = "1";
    int n_prompt = 512, n_gen = 128, layers = 0, reps = 3; /* best of 3: the first also warms up (lazy driver work) */
    float bw = 0, temperature = 0, top_p = 1;
    int profile = 0, top_k = 0, dec_ctx = 0;
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &mo.model, "model: Hugging Face folder or .gguf file"},
        {"random-weights", 0, G3_ARG_STR, &random, "random weights of a released shape: 270m, 1b, 4b, 12b, 27b"},
        {"type", 0, G3_ARG_STR, &type_s, "weight type with --random-weights: bf16, f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, or the mixes q4_k_m, q5_k_m"},
        {"layers", 0, G3_ARG_INT, &layers, "with --random-weights: only this many layers (0 = all)"},
        {"n-prompt", 'p', G3_ARG_INT, &n_prompt, "prompt tokens for the prefill measurement"},
        {"n-gen", 'n', G3_ARG_INT, &n_gen, "tokens to decode"},
        {"context", 'c', G3_ARG_INT, &dec_ctx, "decode after a prompt of this many tokens per sequence, each sequence "
                                               "its own (no shared prefix); 0 = 16 tokens, one shared prompt"},
        {"batch", 'b', G3_ARG_STR, &batches_s, "concurrent sequences for decode, comma-separated list"},
        {"reps", 'r', G3_ARG_INT, &reps, "repetitions of the prefill measurement (the best is kept)"},
        {"bw", 0, G3_ARG_FLOAT, &bw, "measured memory read bandwidth in GB/s, to print decode as a ratio of it"},
        {"backend", 0, G3_ARG_STR, &mo.backend, "cpu, cuda, vulkan or auto"},
        {"device", 0, G3_ARG_INT, &mo.device, "GPU index (gemma3 info --devices)"},
        {"quant", 0, G3_ARG_STR, &mo.quant, G3_CLI_HELP_QUANT},
        {"gemm", 0, G3_ARG_STR, &mo.gemm, G3_CLI_HELP_GEMM},
        {"kv-cache", 0, G3_ARG_STR, &mo.kv_cache, G3_CLI_HELP_KV_CACHE},
        {"threads", 't', G3_ARG_INT, &mo.threads, "CPU threads (0 = all cores)"},
        {"temperature", 0, G3_ARG_FLOAT, &temperature, "decode by sampling at this temperature (0 = greedy, the "
                                                        "default); $G3_HOST_SAMPLING=1 samples on the host"},
        {"top-k", 0, G3_ARG_INT, &top_k, "with --temperature: keep the k most probable tokens (0 = off)"},
        {"top-p", 0, G3_ARG_FLOAT, &top_p, "with --temperature: nucleus sampling (1 = off)"},
        {"profile", 0, G3_ARG_FLAG, &profile, "then time each kind of dispatch of one decode step at batch 1 and at "
                                              "the largest --batch (vulkan, cuda backends)"},
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
    if (n_prompt < 1 || n_gen < 1 || reps < 1 || dec_ctx < 0) {
        fprintf(stderr, "gemma3 bench: --n-prompt, --n-gen and --reps must be >= 1, --context >= 0\n");
        free(batches);
        return 2;
    }
    g3_error err = {0};
    g3_model *m = NULL;
    g3_engine *e = NULL;
    int32_t *prompt = NULL; /* the measurements' buffers, freed at out */
    float *lg = NULL;
    double *step_ms = NULL;
    g3_request_id *ids = NULL;
    int status = 1;
    if (!g3_cli_apply_quant("bench", &mo)) {
        free(batches);
        return 2;
    }
    double t0 = g3_now();
    if (random) {
        g3_dtype t;
        if (!strcasecmp(type_s, "q4_k_m") || !strcasecmp(type_s, "q5_k_m")) {
            if (g3_model_random_mix(random, type_s, 1234, layers, &m, &err) != G3_OK) goto fail;
        } else if (!g3_dtype_from_name(type_s, &t)) {
            fprintf(stderr, "gemma3 bench: unknown --type %s\n", type_s);
            free(batches);
            return 2;
        } else if (g3_model_random(random, t, 1234, layers, &m, &err) != G3_OK) goto fail;
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
    const int n_tok = n_prompt > dec_ctx ? n_prompt : dec_ctx; /* the prompt buffer serves both measurements */
    const int dec_prompt = dec_ctx ? dec_ctx : n_prompt < 16 ? n_prompt : 16; /* each decode sequence's prompt */
    /* --context: the B long prompts are prefilled one chunk budget per step while the first ones already decode, so
     * each request may generate up to `extra` more tokens; the measurement stops after n_gen - 1 steps in which all
     * sequences decode together, and the requests are then cancelled */
    const int chunk = n_tok < 512 ? n_tok : 512, extra = dec_ctx ? max_b * (dec_ctx / chunk + 2) : 0;
    eo.ctx_size = n_tok + n_gen + extra + 8;
    if (eo.ctx_size > c->max_ctx) eo.ctx_size = c->max_ctx;
    eo.prefill_chunk = n_prompt < 512 ? n_prompt : 512;
    if (dec_ctx) eo.prefill_chunk = chunk;
    eo.kv_block = 16; /* the engine's default, named for the pool sizes below and in --profile */
    if (!dec_ctx) {
        /* the pool for what the bench holds at once, not max_b full contexts: one prefill of n_prompt tokens, or B
         * sequences of dec_prompt + n_gen tokens (27B at 256 seqs: ~1 GB of K/V instead of ~70 GB); a block more per
         * sequence for the last position, a few for the prefix cache's entries */
        const int blk = eo.kv_block, per_seq = (dec_prompt + n_gen + blk - 1) / blk + 1;
        const int pre = (n_tok + n_gen + 8) / blk + 2;
        eo.n_kv_blocks = (max_b * per_seq > pre ? max_b * per_seq : pre) + 8;
    }
    if (dec_ctx && dec_ctx + n_gen + extra > eo.ctx_size) {
        g3_fail(&err, G3_ERR_ARG, "--context %d + --n-gen %d does not fit the model's context (%d)", dec_ctx, n_gen,
                eo.ctx_size);
        goto fail;
    }
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
    g3_engine_stats st0;
    g3_engine_get_stats(e, &st0);
    printf("kv cache: %d blocks of %d tokens (global and sliding layers' pools), up to %d sequences of %d tokens\n",
           st0.kv_blocks_total, eo.kv_block, max_b, g3_engine_ctx_size(e));
    prompt = malloc(sizeof(int32_t) * (size_t)n_tok);
    lg = malloc(sizeof(float) * (size_t)c->vocab);
    step_ms = malloc(sizeof(double) * (size_t)n_gen);
    ids = malloc(sizeof(g3_request_id) * (size_t)max_b);
    if (!prompt || !lg || !step_ms || !ids) {
        g3_fail(&err, G3_ERR_NOMEM, "out of memory");
        goto fail;
    }
    uint64_t s = 42;
    for (int i = 0; i < n_tok; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int32_t lo = c->vocab > 2000 ? 1000 : 0; /* ordinary pieces, past the special ids, when there are enough */
        prompt[i] = i == 0 ? c->bos_id : (int32_t)(lo + (int32_t)((s >> 33) % (uint64_t)(c->vocab - lo)));
    }
    /* prefill: the whole prompt's logits of the last position, best of reps */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double a = g3_now();
        if (g3_engine_logits(e, prompt, n_prompt, 0, lg, &err) != G3_OK) {
            goto fail;
        }
        double dt = g3_now() - a;
        if (dt < best) best = dt;
    }
    printf("prefill  %5d tokens: %9.1f tok/s  (%.1f ms; %.1f GFLOP/s)\n", n_prompt, n_prompt / best, 1e3 * best,
           2.0 * (double)m->n_params * n_prompt / best / 1e9);
    if (temperature > 0) {
        const char *hs = getenv("G3_HOST_SAMPLING");
        printf("decode sampling: temperature %g, top-k %d, top-p %g, seeds 1..B%s\n", temperature, top_k, top_p,
               hs && !strcmp(hs, "1") ? " (G3_HOST_SAMPLING=1: on the host)" : "");
    }
    /* decode: B sequences, each a short prompt (or --context tokens) then n_gen tokens; the rate is measured over the
     * steps after every sequence has its first token, up to the first one finishing (n_gen - 1 steps of B rows) */
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        bench_ev be = {0};
        for (int i = 0; i < B; i++) {
            /* --context: sequence i's own prompt (its second token differs), so that no blocks are shared */
            if (dec_ctx > 1) prompt[1] = (int32_t)((prompt[1] + 7919) % c->vocab);
            g3_request rq = {.prompt = prompt, .n_prompt = dec_prompt, .max_tokens = n_gen + extra, .ignore_eos = 1};
            g3_sampling_default(&rq.sampling);
            rq.sampling.temperature = temperature, rq.sampling.top_k = top_k, rq.sampling.top_p = top_p;
            rq.sampling.seed = (uint64_t)i + 1;
            if (g3_engine_submit(e, &rq, &ids[i], &err) != G3_OK) {
                goto fail;
            }
        }
        g3_engine_stats sb;
        g3_engine_get_stats(e, &sb);
        int active = 1, first_done = 0;
        double t_dec0 = 0;
        int tokens_at_t0 = 0, n_steps = 0, stopped = 0, tokens_end = 0;
        double a = g3_now(), t_end = 0;
        while (active) {
            double s0 = g3_now();
            const int tokens_before = be.n_tokens;
            if (g3_engine_step(e, on_ev, &be, &active, &err) != G3_OK) {
                goto fail;
            }
            /* a decode step of all B sequences (with the overlapped decode, the first call only queues one: no tokens) */
            if (first_done && !stopped && be.n_tokens > tokens_before) {
                step_ms[n_steps++] = 1e3 * (g3_now() - s0);
                if (n_steps >= n_gen - 1 || be.n_done > 0) {
                    stopped = 1, t_end = be.t_last, tokens_end = be.n_tokens;
                    for (int i = 0; i < B; i++) g3_engine_cancel(e, ids[i]);
                }
            }
            if (!first_done && be.n_first >= B) { /* every sequence has its first token: decode starts */
                first_done = 1;
                t_dec0 = g3_now();
                tokens_at_t0 = be.n_tokens;
                if (n_gen <= 1) stopped = 1, t_end = t_dec0, tokens_end = tokens_at_t0;
            }
        }
        double ttft = be.t_first - a;
        double dt = t_end - t_dec0;
        int toks = tokens_end - tokens_at_t0;
        double tps = dt > 0 ? toks / dt : 0;
        double gbs = tps / B * decode_bytes / 1e9;
        printf("decode   batch %3d: %9.2f tok/s  (%d tokens; %.2f tok/s per sequence; weights %.1f GB/s", B, tps,
               toks, tps / B, gbs);
        if (dec_ctx) printf("; context %d..%d", dec_ctx, dec_ctx + n_gen);
        if (bw > 0) printf(" = %.0f%% of %.1f GB/s", 100.0 * gbs / bw, (double)bw);
        printf("; first token %.1f ms)\n", 1e3 * ttft);
        g3_engine_stats sa;
        g3_engine_get_stats(e, &sa);
        if (sa.n_preempted > sb.n_preempted) /* the B sequences did not all fit the KV pool at once */
            printf("decode   batch %3d: %lld sequences preempted for lack of KV blocks: not a rate of %d together\n", B,
                   (long long)(sa.n_preempted - sb.n_preempted), B);
        if (n_steps > 0) { /* one slow step (a graph captured on first use) shows as max far above the median */
            qsort(step_ms, (size_t)n_steps, sizeof *step_ms, cmp_double);
            printf("decode   batch %3d: step times min %.2f / median %.2f / max %.2f ms over %d steps (%lld "
                   "overlapped)\n", B, step_ms[0], step_ms[n_steps / 2], step_ms[n_steps - 1], n_steps,
                   (long long)(sa.overlapped_steps - sb.overlapped_steps));
        }
    }
    if (profile) {
        /* decode positions of the measurement above: short prompt, then n_gen tokens; profile the middle one */
        int pos = dec_prompt + n_gen / 2;
        int bs[2] = {1, max_b};
        char backend[32];
        snprintf(backend, sizeof backend, "%s", g3_engine_backend_name(e));
        int ctx = g3_engine_ctx_size(e);
        if (pos >= ctx) pos = ctx - 1;
        g3_engine_free(e);
        e = NULL;
        if (profile_decode(m, backend, eo.device, eo.n_threads, max_b, eo.prefill_chunk + max_b, eo.kv_block, ctx, pos,
                           bs, 2, &err)) {
            fprintf(stderr, "gemma3 bench: profile: %s\n", err.msg);
            goto out;
        }
    }
    status = 0;
    goto out;
fail:
    fprintf(stderr, "gemma3 bench: %s\n", err.msg);
out:
    free(prompt), free(lg), free(step_ms), free(ids);
    free(batches);
    g3_engine_free(e);
    g3_model_free(m);
    return status;
}
