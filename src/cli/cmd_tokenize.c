/* `gemma3 tokenize` and `gemma3 detokenize`: text -> ids and ids -> text with a model's tokenizer.
 * Output contract (external checks rely on it): tokenize prints the ids comma-separated on one line;
 * detokenize prints exactly the decoded text. Usage errors exit 2, load/encode failures exit 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gemma3.h"

static void tokenize_help(FILE *f) {
    fprintf(f,
            "usage: gemma3 tokenize -m MODEL (--text TEXT | --file FILE) [options]\n"
            "\n"
            "Prints the token ids of the text, comma-separated on one line.\n"
            "\n"
            "  -m, --model MODEL   .gguf file or Hugging Face folder (tokenizer.model, else tokenizer.json)\n"
            "  --text TEXT         the text to encode\n"
            "  --file FILE         read the text from FILE ('-' = standard input), byte for byte\n"
            "  --parse-special     match special markers such as <start_of_turn> in the text (default: off;\n"
            "                      then a typed \"<end_of_turn>\" is ordinary characters)\n"
            "  --bos               put <bos> first (default: off)\n"
            "  -h, --help          this text\n");
}

static void detokenize_help(FILE *f) {
    fprintf(f,
            "usage: gemma3 detokenize -m MODEL --ids ID,ID,... [options]\n"
            "\n"
            "Prints the text of the ids exactly (no newline is added), as SentencePiece decodes it: control tokens\n"
            "such as <bos> print nothing, byte pieces are joined into characters.\n"
            "\n"
            "  -m, --model MODEL   .gguf file or Hugging Face folder (tokenizer.model, else tokenizer.json)\n"
            "  --ids LIST          token ids separated by commas and/or spaces (required, no default)\n"
            "  -h, --help          this text\n");
}

static int usage_error(const char *cmd, const char *fmt, const char *arg) {
    fprintf(stderr, "gemma3 %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see gemma3 %s --help)\n", cmd);
    return 2;
}

/* Value of an option at argv[*i]: "--opt value" or "--opt=value". NULL if this is not the option. */
static const char *opt_value(int argc, char **argv, int *i, const char *shortname, const char *longname, int *missing) {
    const char *a = argv[*i];
    size_t ll = strlen(longname);
    *missing = 0;
    if (!strncmp(a, longname, ll) && a[ll] == '=') return a + ll + 1;
    if (!strcmp(a, longname) || (shortname && !strcmp(a, shortname))) {
        if (*i + 1 >= argc) {
            *missing = 1;
            return NULL;
        }
        return argv[++*i];
    }
    return NULL;
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int g3_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int parse_special = 0, bos = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int missing;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            tokenize_help(stdout);
            return 0;
        } else if ((v = opt_value(argc, argv, &i, "-m", "--model", &missing)) || missing) {
            if (missing) return usage_error("tokenize", "%s needs a value", argv[i]);
            model = v;
        } else if ((v = opt_value(argc, argv, &i, NULL, "--text", &missing)) || missing) {
            if (missing) return usage_error("tokenize", "%s needs a value", argv[i]);
            text = v;
        } else if ((v = opt_value(argc, argv, &i, NULL, "--file", &missing)) || missing) {
            if (missing) return usage_error("tokenize", "%s needs a value", argv[i]);
            file = v;
        } else if (!strcmp(argv[i], "--parse-special")) {
            parse_special = 1;
        } else if (!strcmp(argv[i], "--bos")) {
            bos = 1;
        } else {
            return usage_error("tokenize", "unknown option '%s'", argv[i]);
        }
    }
    if (!model) return usage_error("tokenize", "%smissing -m MODEL", "");
    if (!text == !file) return usage_error("tokenize", "%sgive exactly one of --text and --file", "");

    char *buf = NULL;
    size_t len = 0;
    if (file) {
        FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "gemma3 tokenize: %s: %s\n", file, strerror(errno));
            return 1;
        }
        buf = read_all(f, &len);
        if (f != stdin) fclose(f);
        if (!buf) {
            fprintf(stderr, "gemma3 tokenize: %s: cannot read\n", file);
            return 1;
        }
        text = buf;
    } else {
        len = strlen(text);
    }
    g3_error err = {0};
    g3_tokenizer *t = NULL;
    if (g3_tokenizer_load(model, &t, &err) != G3_OK) {
        fprintf(stderr, "gemma3 tokenize: %s\n", err.msg);
        free(buf);
        return 1;
    }
    int32_t *ids = NULL;
    int n = 0, rc = 0;
    if (g3_tokenize(t, text, len, parse_special, &ids, &n, &err) != G3_OK) {
        fprintf(stderr, "gemma3 tokenize: %s\n", err.msg);
        rc = 1;
    } else {
        g3_special_tokens sp;
        g3_tokenizer_special(t, &sp);
        int first = 1;
        if (bos) {
            if (sp.bos < 0) {
                fprintf(stderr, "gemma3 tokenize: --bos: this vocabulary has no <bos> token\n");
                rc = 1;
            } else {
                printf("%d", sp.bos);
                first = 0;
            }
        }
        for (int k = 0; rc == 0 && k < n; k++) printf(first && k == 0 ? "%d" : ",%d", ids[k]);
        if (rc == 0) printf("\n");
    }
    free(ids);
    free(buf);
    g3_tokenizer_free(t);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
}

int g3_cli_detokenize(int argc, char **argv) {
    const char *model = NULL, *list = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int missing;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            detokenize_help(stdout);
            return 0;
        } else if ((v = opt_value(argc, argv, &i, "-m", "--model", &missing)) || missing) {
            if (missing) return usage_error("detokenize", "%s needs a value", argv[i]);
            model = v;
        } else if ((v = opt_value(argc, argv, &i, NULL, "--ids", &missing)) || missing) {
            if (missing) return usage_error("detokenize", "%s needs a value", argv[i]);
            list = v;
        } else {
            return usage_error("detokenize", "unknown option '%s'", argv[i]);
        }
    }
    if (!model) return usage_error("detokenize", "%smissing -m MODEL", "");
    if (!list) return usage_error("detokenize", "%smissing --ids LIST", "");

    /* parse the list before loading anything */
    size_t cap = strlen(list) / 2 + 2;
    int32_t *ids = malloc(cap * sizeof *ids);
    int n = 0;
    if (!ids) return 1;
    for (const char *p = list;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\t' &&
                                                             *end != '\n')) {
            char bad[64];
            size_t l = strcspn(p, ", \t\n");
            snprintf(bad, sizeof bad, "%.*s", (int)(l > 40 ? 40 : l), p);
            free(ids);
            return usage_error("detokenize", "--ids: '%s' is not a token id", bad);
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    g3_error err = {0};
    g3_tokenizer *t = NULL;
    if (g3_tokenizer_load(model, &t, &err) != G3_OK) {
        fprintf(stderr, "gemma3 detokenize: %s\n", err.msg);
        free(ids);
        return 1;
    }
    int rc = 0;
    for (int k = 0; k < n; k++)
        if (ids[k] >= g3_tokenizer_vocab(t)) {
            fprintf(stderr, "gemma3 detokenize: --ids: id %d is out of range (vocabulary of %d)\n", ids[k],
                    g3_tokenizer_vocab(t));
            rc = 2;
            break;
        }
    char *text = NULL;
    size_t len = 0;
    if (rc == 0 && g3_detokenize(t, ids, n, &text, &len, &err) != G3_OK) {
        fprintf(stderr, "gemma3 detokenize: %s\n", err.msg);
        rc = 1;
    }
    if (rc == 0 && fwrite(text, 1, len, stdout) != len) rc = 1;
    if (fflush(stdout) != 0) rc = 1;
    free(text);
    free(ids);
    g3_tokenizer_free(t);
    return rc;
}
