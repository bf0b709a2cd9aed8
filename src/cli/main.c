/* gemma3 command: dispatches to subcommands. */
#include <stdio.h>
int main(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "gemma3: not yet\n");
    return 1;
}
