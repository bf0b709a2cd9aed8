/* Fallbacks for subcommands whose part is not in this build (weak symbols: a real implementation wins). */
#include <stdio.h>

#include "cli/cli.h"

#define MISSING(fn, what)                                                                                              \
    __attribute__((weak)) int fn(int argc, char **argv) {                                                              \
        (void)argc, (void)argv;                                                                                        \
        fprintf(stderr, "gemma3: %s is not available in this build\n", what);                                         \
        return 2;                                                                                                      \
    }

MISSING(g3_cli_serve, "serve (needs libmicrohttpd at build time)")
MISSING(g3_cli_chat, "chat")
MISSING(g3_cli_tokenize, "tokenize")
MISSING(g3_cli_detokenize, "detokenize")
MISSING(g3_cli_quantize, "quantize")
