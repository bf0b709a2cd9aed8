/* Shared set-up of the model-using subcommands. */
#include "cli/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void g3_cli_model_opts_default(g3_cli_model_opts *o) {
    o->model = NULL;
    o->backend = "auto";
    o->threads = 0;
    o->ctx_size = 0;
    o->max_seqs = 1;
    o->quiet = 0;
    o->quant = NULL;
    o->device = 0;
    o->gemm = NULL;
    o->kv_cache = NULL;
}

double g3_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int g3_cli_apply_quant(const char *cmd, const g3_cli_model_opts *o) {
    if (o->gemm) {
        if (strcmp(o->gemm, "exact") && strcmp(o->gemm, "fast")) {
            fprintf(stderr, "gemma3 %s: --gemm must be exact or fast (got '%s')\n", cmd, o->gemm);
            return 0;
        }
        /* read by the CUDA backend at create: hi+lo split activations (exact) or plain bf16 (fast) */
        setenv("G3_CUDA_GEMM", strcmp(o->gemm, "fast") ? "split" : "bf16", 1);
    }
    if (o->kv_cache) {
        if (strcmp(o->kv_cache, "auto") && strcmp(o->kv_cache, "f32") && strcmp(o->kv_cache, "bf16")) {
            fprintf(stderr, "gemma3 %s: --kv-cache must be auto, bf16 or f32 (got '%s')\n", cmd, o->kv_cache);
            return 0;
        }
        setenv("G3_CUDA_KV", o->kv_cache, 1); /* read by the CUDA backend at create */
    }
    if (!o->quant) return 1;
    static const char *ok[] = {"bf16", "int8", "int4", "fp8"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(o->quant, ok[i])) {
            if (o->backend && !strcmp(o->backend, "cpu")) {
                fprintf(stderr, "gemma3 %s: --quant converts weights on the GPU (cuda backend); for the CPU write a "
                                "quantized file with gemma3 quantize\n", cmd);
                return 0;
            }
            setenv("G3_CUDA_QUANT", o->quant, 1); /* read by the CUDA backend at create */
            return 1;
        }
    fprintf(stderr, "gemma3 %s: --quant must be bf16, int8, int4 or fp8 (got '%s')\n", cmd, o->quant);
    return 0;
}

int g3_cli_open(const char *cmd, const g3_cli_model_opts *o, g3_model **m, g3_engine **e) {
    g3_error err = {0};
    *m = NULL;
    *e = NULL;
    if (!g3_cli_apply_quant(cmd, o)) return 0;
    if (!o->model) {
        fprintf(stderr, "gemma3 %s: no model given (-m MODEL: a Hugging Face folder or a .gguf file)\n", cmd);
        return 0;
    }
    g3_load_opts lo = {.progress = !o->quiet, .ctx_hint = o->ctx_size};
    if (g3_model_load(o->model, &lo, m, &err) != G3_OK) {
        fprintf(stderr, "gemma3 %s: %s\n", cmd, err.msg);
        return 0;
    }
    g3_engine_opts eo;
    g3_engine_opts_default(&eo);
    eo.backend = o->backend;
    eo.n_threads = o->threads;
    eo.ctx_size = o->ctx_size;
    eo.max_seqs = o->max_seqs;
    eo.device = o->device;
    if (g3_engine_create(*m, &eo, e, &err) != G3_OK) {
        fprintf(stderr, "gemma3 %s: %s\n", cmd, err.msg);
        g3_model_free(*m);
        *m = NULL;
        return 0;
    }
    return 1;
}
