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
    const char *kv_cache; /* CUDA K/V cache elements: "f32" (default) or "bf16", or NULL */
} g3_cli_model_opts;

void g3_cli_model_opts_default(g3_cli_model_opts *o);
/* Loads o->model and creates an engine; prints the error and returns 0 on failure. */
int g3_cli_open(const char *cmd, const g3_cli_model_opts *o, g3_model **m, g3_engine **e);
double g3_now(void); /* seconds, monotonic */
/* Checks and applies --quant and --gemm (before the engine is created); prints a message and returns 0 if one is
 * invalid. */
int g3_cli_apply_quant(const char *cmd, const g3_cli_model_opts *o);

#endif
