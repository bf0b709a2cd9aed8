/* `gemma3 info`: configuration, tensor types, parameter count, memory for the weights and for a context, and the
 * model's chat template. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "model/config.h"
#include "model/model.h"
#ifdef G3_HAVE_VULKAN
#include "backend/vulkan/vulkan_api.h"
#endif
#ifdef G3_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

static void count_type(uint32_t type, uint64_t bytes, uint64_t counts[64], uint64_t sizes[64]) {
    uint32_t t = type < 64 ? type : 63;
    counts[t]++;
    sizes[t] += bytes;
}

int g3_cli_info(int argc, char **argv) {
    const char *model = NULL;
    int ctx = 0, show_template = 0, devices = 0;
    g3_arg args[] = {
        {"model", 'm', G3_ARG_STR, &model, "model: Hugging Face folder or .gguf file"},
        {"ctx-size", 'c', G3_ARG_INT, &ctx, "context size for the memory estimate (0 = the model's maximum)"},
        {"template", 0, G3_ARG_FLAG, &show_template, "print the whole chat template"},
        {"devices", 0, G3_ARG_FLAG, &devices, "list the GPUs the cuda and vulkan backends can use"},
    };
    /* also accept the model as a bare positional argument: gemma3 info MODEL */
    if (argc >= 2 && argv[1][0] != '-') {
        model = argv[1];
        argv[1] = argv[0];
        argv++, argc--;
    }
    int rc = g3_args_parse("info", "Describe a model.", args, sizeof args / sizeof args[0], argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (devices) {
#ifdef G3_HAVE_CUDA
        printf("cuda: %d device(s)\n", g3_cuda_device_count());
#else
        printf("cuda: not in this build\n");
#endif
#ifdef G3_HAVE_VULKAN
        g3_vulkan_print_devices(stdout);
#else
        printf("vulkan: not in this build\n");
#endif
        if (!model) return 0;
    }
    if (!model) {
        fprintf(stderr, "gemma3 info: no model given (gemma3 info MODEL)\n");
        return 2;
    }
    g3_model *m;
    g3_error err = {0};
    if (g3_model_load(model, NULL, &m, &err) != G3_OK) {
        fprintf(stderr, "gemma3 info: %s\n", err.msg);
        return 1;
    }
    const g3_config *c = &m->cfg;
    printf("model: %s (%s)\n", m->path,
           m->source == G3_SRC_GGUF ? "GGUF" : m->source == G3_SRC_HF ? "Hugging Face safetensors" : "random");
    printf("config:\n");
    g3_config_print(c, stdout);
    uint64_t counts[64] = {0}, sizes[64] = {0};
    count_type(m->embed.type, m->embed.nbytes, counts, sizes);
    for (int l = 0; l < c->n_layers; l++) {
        const g3_layer_weights *L = &m->layers[l];
        const g3_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) count_type(ws[i]->type, ws[i]->nbytes, counts, sizes);
    }
    printf("tensor types (matrices; norms are kept as float32):\n");
    for (int t = 0; t < 64; t++)
        if (counts[t]) printf("  %-6s %4llu tensors  %8.2f MB\n", g3_dtype_name((g3_dtype)t), (unsigned long long)counts[t],
                              (double)sizes[t] / 1e6);
    printf("parameters: %llu (%.3f B)\n", (unsigned long long)m->n_params, (double)m->n_params / 1e9);
    if (ctx <= 0) ctx = c->max_ctx;
    uint64_t kv32 = g3_model_kv_bytes(c, ctx, 4), kv16 = g3_model_kv_bytes(c, ctx, 2);
    g3_config all_global = *c;
    memset(all_global.layer_global, 1, sizeof all_global.layer_global);
    printf("memory: weights %.2f GB; KV cache for %d tokens: %.2f GB float32 / %.2f GB 16-bit per sequence "
           "(sliding layers keep %d tokens; %.2f GB if every layer kept everything)\n",
           (double)m->weight_bytes / 1e9, ctx, (double)kv32 / 1e9, (double)kv16 / 1e9, c->sliding_window,
           (double)g3_model_kv_bytes(&all_global, ctx, 2) / 1e9);
    printf("bytes read per decoded token: %.2f GB\n", (double)g3_model_decode_bytes(m) / 1e9);
    if (m->chat_template) {
        size_t len = strlen(m->chat_template);
        if (show_template || len <= 400) printf("chat template:\n%s\n", m->chat_template);
        else printf("chat template: %zu characters (--template to print it): %.200s...\n", len, m->chat_template);
    } else {
        printf("chat template: none in the model files (Gemma's turn format is built in)\n");
    }
    g3_model_free(m);
    return 0;
}
