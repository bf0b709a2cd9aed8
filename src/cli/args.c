/* Table-driven command-line options (see args.h). */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_default(const g3_arg *a) {
    switch (a->kind) {
    case G3_ARG_STR: {
        const char *v = *(const char **)a->dst;
        if (v) fprintf(stdout, " (default: %s)", v);
        break;
    }
    case G3_ARG_INT: fprintf(stdout, " (default: %d)", *(int *)a->dst); break;
    case G3_ARG_FLOAT: fprintf(stdout, " (default: %g)", (double)*(float *)a->dst); break;
    case G3_ARG_FLAG: break;
    }
}

static void usage(const char *cmd, const char *summary, const g3_arg *args, int n) {
    fprintf(stdout, "usage: gemma3 %s [options]\n%s\n\noptions:\n", cmd, summary);
    for (int i = 0; i < n; i++) {
        const g3_arg *a = &args[i];
        char left[64];
        const char *val = a->kind == G3_ARG_FLAG ? "" : a->kind == G3_ARG_STR ? " S" : a->kind == G3_ARG_INT ? " N" : " X";
        if (a->short_name) snprintf(left, sizeof left, "-%c, --%s%s", a->short_name, a->name, val);
        else snprintf(left, sizeof left, "    --%s%s", a->name, val);
        fprintf(stdout, "  %-26s %s", left, a->help);
        print_default(a);
        fprintf(stdout, "\n");
    }
    fprintf(stdout, "  %-26s %s\n", "-h, --help", "show this help");
}

int g3_args_parse(const char *cmd, const char *summary, const g3_arg *args, int n_args, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(cmd, summary, args, n_args);
            return 1;
        }
        const g3_arg *a = NULL;
        const char *inline_val = NULL;
        char name[64];
        if (s[0] == '-' && s[1] == '-') {
            snprintf(name, sizeof name, "%s", s + 2);
            char *eq = strchr(name, '=');
            if (eq) {
                *eq = 0;
                inline_val = s + 2 + (eq - name) + 1;
            }
            for (int k = 0; k < n_args && !a; k++)
                if (!strcmp(args[k].name, name)) a = &args[k];
        } else if (s[0] == '-' && s[1] && !s[2]) {
            for (int k = 0; k < n_args && !a; k++)
                if (args[k].short_name == s[1]) a = &args[k];
        } else {
            fprintf(stderr, "gemma3 %s: unexpected argument '%s' (see gemma3 %s --help)\n", cmd, s, cmd);
            return 2;
        }
        if (!a) {
            fprintf(stderr, "gemma3 %s: unknown option '%s' (see gemma3 %s --help)\n", cmd, s, cmd);
            return 2;
        }
        if (a->kind == G3_ARG_FLAG) {
            if (inline_val) {
                fprintf(stderr, "gemma3 %s: option --%s takes no value\n", cmd, a->name);
                return 2;
            }
            *(int *)a->dst = 1;
            continue;
        }
        const char *v = inline_val;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gemma3 %s: option %s needs a value\n", cmd, s);
                return 2;
            }
            v = argv[++i];
        }
        char *end = NULL;
        errno = 0;
        switch (a->kind) {
        case G3_ARG_STR: *(const char **)a->dst = v; break;
        case G3_ARG_INT: {
            long x = strtol(v, &end, 10);
            if (errno || end == v || *end || x < -2147483647L || x > 2147483647L) {
                fprintf(stderr, "gemma3 %s: --%s expects an integer, got '%s'\n", cmd, a->name, v);
                return 2;
            }
            *(int *)a->dst = (int)x;
            break;
        }
        case G3_ARG_FLOAT: {
            float x = strtof(v, &end);
            if (errno || end == v || *end || !isfinite(x)) {
                fprintf(stderr, "gemma3 %s: --%s expects a number, got '%s'\n", cmd, a->name, v);
                return 2;
            }
            *(float *)a->dst = x;
            break;
        }
        case G3_ARG_FLAG: break;
        }
    }
    return 0;
}

int g3_parse_ids(const char *s, int **ids, int *n) {
    int cap = 16, cnt = 0;
    int *v = malloc(sizeof(int) * (size_t)cap);
    if (!v) return 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > 2147483647L || (*end && *end != ',' && *end != ' ')) {
            fprintf(stderr, "gemma3: bad token id list near '%.20s' (expected comma-separated non-negative integers)\n", p);
            free(v);
            return 0;
        }
        if (cnt == cap) {
            int *nv = realloc(v, sizeof(int) * (size_t)(cap *= 2));
            if (!nv) { free(v); return 0; }
            v = nv;
        }
        v[cnt++] = (int)x;
        p = end;
    }
    if (cnt == 0) {
        fprintf(stderr, "gemma3: the token id list is empty\n");
        free(v);
        return 0;
    }
    *ids = v;
    *n = cnt;
    return 1;
}
