/* `gemma3 logits`: float32 little-endian logits of the last prompt position (or of every position, row-major).
 * A fixed contract used by external checks. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/common.h"

int g3_cli_logits(int argc, char **argv) {
    g3_cli_model_opts mo;
    g3_cli_model_opts_default(&mo);
    const char *ids_s = NULL, *out_path = NULL;
    int all = 0;
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &mo.model, "model: Hugging Face folder or .gguf file"},
        {"prompt-ids", 0, G3_ARG_STR, &ids_s, "prompt token ids, comma-separated (BOS included if wanted)"},
        {"out", 'o', G3_ARG_STR, &out_path, "output file (float32 little-endian)"},
        {"all-positions", 0, G3_ARG_FLAG, &all, "write the logits of every prompt position, row-major"},
        {"backend", 0, G3_ARG_STR, &mo.backend, "cpu, cuda or auto"},
        {"threads", 't', G3_ARG_INT, &mo.threads, "CPU threads (0 = all cores)"},
    };
    int rc = g3_args_parse("logits", "Write raw logits of a prompt.", args, sizeof args / sizeof args[0], argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!ids_s || !out_path) {
        fprintf(stderr, "gemma3 logits: --prompt-ids and --out are required\n");
        return 2;
    }
    int *ids, n;
    if (!g3_parse_ids(ids_s, &ids, &n)) return 2;
    mo.quiet = 1;
    mo.ctx_size = n + 1;
    g3_model *m;
    g3_engine *e;
    if (!g3_cli_open("logits", &mo, &m, &e)) {
        free(ids);
        return 1;
    }
    size_t V = (size_t)g3_model_config(m)->vocab, rows = all ? (size_t)n : 1;
    float *lg = malloc(sizeof(float) * V * rows);
    g3_error err = {0};
    int status = 0;
    if (!lg) {
        fprintf(stderr, "gemma3 logits: out of memory\n");
        status = 1;
    } else if (g3_engine_logits(e, (const int32_t *)ids, n, all, lg, &err) != G3_OK) {
        fprintf(stderr, "gemma3 logits: %s\n", err.msg);
        status = 1;
    } else {
        FILE *f = fopen(out_path, "wb");
        if (!f || fwrite(lg, sizeof(float), V * rows, f) != V * rows) {
            fprintf(stderr, "gemma3 logits: cannot write %s\n", out_path);
            status = 1;
        }
        if (f && fclose(f) != 0) status = 1;
    }
    free(lg);
    free(ids);
    g3_engine_free(e);
    g3_model_free(m);
    return status;
}
