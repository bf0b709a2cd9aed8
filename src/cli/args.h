/* Table-driven command-line options for the subcommands: parsing with clear errors and --help with defaults. */
#ifndef G3_CLI_ARGS_H
#define G3_CLI_ARGS_H

typedef enum g3_arg_kind { G3_ARG_STR, G3_ARG_INT, G3_ARG_FLOAT, G3_ARG_FLAG } g3_arg_kind;

typedef struct g3_arg {
    const char *name;  /* long name without dashes, e.g. "model" */
    char short_name;   /* 'm', or 0 */
    g3_arg_kind kind;
    void *dst;         /* const char **, int *, float *, or int * (flag) */
    const char *help;
} g3_arg;

/* Parses argv[1..]; returns 0 to go on, 1 when --help was printed (exit 0), 2 on an error (message printed). */
int g3_args_parse(const char *cmd, const char *summary, const g3_arg *args, int n_args, int argc, char **argv);
/* Parses "2,17,33" into a malloc'd array. Returns 0 and prints a message on error. */
int g3_parse_ids(const char *s, int **ids, int *n);

#endif
