/* What the model-using subcommands share: the model/backend options and loading a model into an engine. */
#ifndef G3_CLI_COMMON_H
#define G3_CLI_COMMON_H

#include "gemma3.h"

typedef struct g3_cli_model_opts {
    const char *model;   /* path, or NULL */
    const char *backend; /* cpu, cuda, auto */
    int threads;
    int ctx_size;
    int max_seqs;
    int quiet;
    const char *quant;   /* GPU weight format: bf16, int8, int4, fp8 (cuda backend), or NULL */
    int device;          /* GPU index */
    const char *gemm;    /* CUDA products of many rows: "exact" (bf16 hi+lo activations) or "fast" (plain bf16), or NULL */
    const char *kv_cache; /* CUDA K/V cache elements: "auto" (default), "bf16" or "f32", or NULL */
} g3_cli_model_opts;

/* Help texts of the GPU options every model-using subcommand takes (--quant, --gemm, --kv-cache) */
#define G3_CLI_HELP_QUANT "weights on the GPU: bf16, int8, int4 or fp8 (cuda backend)"
#define G3_CLI_HELP_GEMM                                                                                               \
    "cuda products of many rows: exact (bf16 hi+lo activations, the default) or fast (plain bf16: ~2x prefill, "     \
    "~2^-9 rounding of activations)"
#define G3_CLI_HELP_KV_CACHE                                                                                           \
    "cuda K/V cache elements: auto (the default: bf16 where the kernels take the model, else f32), bf16 or f32 "     \
    "(float32: twice the memory)"

void g3_cli_model_opts_default(g3_cli_model_opts *o);
/* Loads o->model and creates an engine; prints the error and returns 0 on failure. */
int g3_cli_open(const char *cmd, const g3_cli_model_opts *o, g3_model **m, g3_engine **e);
double g3_now(void); /* seconds, monotonic */
/* Checks and applies --quant and --gemm (before the engine is created); prints a message and returns 0 if one is
 * invalid. */
int g3_cli_apply_quant(const char *cmd, const g3_cli_model_opts *o);

#endif
