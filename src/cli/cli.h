/* Subcommands of the gemma3 command. Each takes the arguments after its name (argv[0] = subcommand name) and
 * returns the process exit status. */
#ifndef G3_CLI_CLI_H
#define G3_CLI_CLI_H

int g3_cli_run(int argc, char **argv);        /* generate from a prompt (text or ids) */
int g3_cli_chat(int argc, char **argv);       /* interactive multi-turn chat */
int g3_cli_logits(int argc, char **argv);     /* write raw logits */
int g3_cli_info(int argc, char **argv);       /* describe a model */
int g3_cli_bench(int argc, char **argv);      /* speed of prefill/decode */
int g3_cli_tokenize(int argc, char **argv);   /* text -> ids */
int g3_cli_detokenize(int argc, char **argv); /* ids -> text */
int g3_cli_quantize(int argc, char **argv);   /* write a GGUF in another type */
int g3_cli_serve(int argc, char **argv);      /* OpenAI-compatible HTTP server */

#endif
