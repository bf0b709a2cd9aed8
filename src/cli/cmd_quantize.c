/* `gemma3 quantize`: writes any loadable model (HF folder or GGUF) as a GGUF file of another weight type. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "model/export_gguf.h"
#include "model/model.h"

int g3_cli_quantize(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *type_s = "q8_0";
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &model, "input model: Hugging Face folder or .gguf file"},
        {"out", 'o', G3_ARG_STR, &out, "output .gguf file"},
        {"type", 0, G3_ARG_STR, &type_s, "weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k"},
    };
    int rc = g3_args_parse("quantize", "Convert a model to a GGUF file (norms stay float32; rows that do not fit a "
                                       "K-quant's 256-value blocks take llama.cpp's fallback: q5_0 for q4_k, q5_1 "
                                       "for q5_k, q8_0 for q6_k).",
                           args, sizeof args / sizeof args[0], argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!model || !out) {
        fprintf(stderr, "gemma3 quantize: -m MODEL and -o OUT are required\n");
        return 2;
    }
    g3_dtype type;
    if (!g3_dtype_from_name(type_s, &type)) {
        fprintf(stderr, "gemma3 quantize: unknown --type %s (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, "
                        "q6_k)\n", type_s);
        return 2;
    }
    g3_error err = {0};
    g3_model *m = NULL;
    g3_tokenizer *tok = NULL;
    if (g3_model_load(model, NULL, &m, &err) != G3_OK) {
        fprintf(stderr, "gemma3 quantize: %s\n", err.msg);
        return 1;
    }
    if (g3_tokenizer_load(model, &tok, &err) != G3_OK) {
        fprintf(stderr, "gemma3 quantize: warning: no tokenizer written (%s)\n", err.msg);
        tok = NULL;
    }
    int status = 0;
    if (g3_model_export_gguf(m, tok, type, out, 1, &err) != G3_OK) {
        fprintf(stderr, "gemma3 quantize: %s\n", err.msg);
        status = 1;
    } else {
        fprintf(stderr, "gemma3 quantize: wrote %s\n", out);
    }
    g3_tokenizer_free(tok);
    g3_model_free(m);
    return status;
}
