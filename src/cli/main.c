/* gemma3 command: dispatches to the subcommands of cli.h. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

typedef struct subcommand {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} subcommand;

static const subcommand commands[] = {
    {"run", g3_cli_run, "generate text (or token ids) from a prompt"},
    {"chat", g3_cli_chat, "interactive multi-turn chat"},
    {"serve", g3_cli_serve, "OpenAI-compatible HTTP server"},
    {"bench", g3_cli_bench, "measure prefill and decode speed"},
    {"info", g3_cli_info, "describe a model file or folder"},
    {"logits", g3_cli_logits, "write the logits of a prompt (float32)"},
    {"tokenize", g3_cli_tokenize, "text to token ids"},
    {"detokenize", g3_cli_detokenize, "token ids to text"},
    {"quantize", g3_cli_quantize, "convert a model to a GGUF file of another type"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: gemma3 COMMAND [options]   (gemma3 COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "gemma3: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
