/* Encode throughput of our tokenizer next to the sentencepiece library's (its Python binding, run by
 * bench/bench_tokenizer.py), on the same documents and vocabularies, rounds alternating between the two; also the
 * load time of each vocabulary. Both sides encode one document per call on one thread; Python's per-call
 * overhead is part of the library's figure (that is how the library is used from Python). Throughput is given by
 * wall time and by the thread's CPU time (the latter is steadier on a machine shared with other work).
 *
 *   bench_tokenizer [--model PATH ...] [--corpus FILE] [--mb 4] [--rounds 5] [--python PY] [--no-big]
 *
 * Defaults: a 32k Gemma-like vocabulary trained with spm_train (tests/tok/train_vocab.py, cached) and the same
 * grown to 262,144 pieces (tests/tok/grow_vocab.py), and 4 MB of varied documents (tests/tok/make_corpus.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gemma3.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* First line of a command's output, or "" on failure. */
static int run_line(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    out[0] = 0;
    if (!fgets(out, (int)cap, p)) out[0] = 0;
    int st = pclose(p);
    out[strcspn(out, "\n")] = 0;
    return st == 0 && out[0] ? 0 : -1;
}

static const char *source_dir(void) {
    static char dir[1024];
    const char *env = getenv("G3_SOURCE_DIR");
    if (env && *env) return env;
    snprintf(dir, sizeof dir, "%s", __FILE__); /* .../bench/bench_tokenizer.c */
    char *s = strrchr(dir, '/');
    if (s) *s = 0;
    s = strrchr(dir, '/');
    if (s) *s = 0;
    else snprintf(dir, sizeof dir, ".");
    return dir;
}

typedef struct doc {
    const char *s;
    uint32_t len;
} doc;

int main(int argc, char **argv) {
    const char *models[8];
    int n_models = 0, rounds = 5, big = 1;
    const char *corpus = NULL, *py = "/usr/bin/python3";
    double mb = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc && n_models < 8) models[n_models++] = argv[++i];
        else if (!strcmp(argv[i], "--corpus") && i + 1 < argc) corpus = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--python") && i + 1 < argc) py = argv[++i];
        else if (!strcmp(argv[i], "--no-big")) big = 0;
        else {
            fprintf(stderr, "usage: bench_tokenizer [--model PATH ...] [--corpus FILE] [--mb 4] [--rounds 5] "
                            "[--python PY] [--no-big]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 100) rounds = 5;
    const char *src = source_dir();
    char tmp[256], cmd[4096], line[1024];
    snprintf(tmp, sizeof tmp, "/tmp/g3bench.XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    static char model_store[2][1024], corpus_store[512];
    if (n_models == 0) {
        snprintf(cmd, sizeof cmd, "%s %s/tests/tok/train_vocab.py --vocab 32768", py, src);
        if (run_line(cmd, model_store[0], sizeof model_store[0]) != 0) {
            fprintf(stderr, "bench_tokenizer: training the 32k vocabulary failed: %s\n", cmd);
            return 1;
        }
        models[n_models++] = model_store[0];
        if (big) {
            snprintf(model_store[1], sizeof model_store[1], "%s/big.model", tmp);
            snprintf(cmd, sizeof cmd, "%s %s/tests/tok/grow_vocab.py %s %s", py, src, model_store[0], model_store[1]);
            if (system(cmd) != 0) return 1;
            models[n_models++] = model_store[1];
        }
    }
    if (!corpus) {
        snprintf(corpus_store, sizeof corpus_store, "%s/corpus.bin", tmp);
        snprintf(cmd, sizeof cmd, "%s %s/tests/tok/make_corpus.py records %s --mb %g --seed 3 >/dev/null", py, src,
                 corpus_store, mb);
        if (system(cmd) != 0) return 1;
        corpus = corpus_store;
    }
    FILE *f = fopen(corpus, "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *data = malloc((size_t)size);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) return 1;
    fclose(f);
    int n_docs = 0;
    doc *docs = malloc(sizeof *docs * ((size_t)size / 4 + 1));
    size_t total = 0;
    for (long i = 0; i + 4 <= size;) {
        uint32_t l;
        memcpy(&l, data + i, 4);
        docs[n_docs++] = (doc){data + i + 4, l};
        total += l;
        i += 4 + l;
    }
    printf("corpus: %d documents, %.2f MB (%s)\n", n_docs, total / 1e6, corpus);

    for (int m = 0; m < n_models; m++) {
        g3_error err = {0};
        g3_tokenizer *t = NULL;
        double loads[5], load_cpu[5];
        for (int k = 0; k < 5; k++) {
            double t0 = now(), c0 = cpu_now();
            if (g3_tokenizer_load(models[m], &t, &err) != G3_OK) {
                fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                return 1;
            }
            loads[k] = now() - t0;
            load_cpu[k] = cpu_now() - c0;
            if (k < 4) g3_tokenizer_free(t);
        }
        double ours[100], lib[100], ours_cpu[100], lib_cpu[100];
        long n_ids = 0;
        for (int r = 0; r < rounds; r++) {
            double t0 = now(), c0 = cpu_now();
            n_ids = 0;
            for (int d = 0; d < n_docs; d++) {
                int32_t *ids;
                int n;
                if (g3_tokenize(t, docs[d].s, docs[d].len, 1, &ids, &n, &err) != G3_OK) {
                    fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                    return 1;
                }
                n_ids += n;
                free(ids);
            }
            ours[r] = total / 1e6 / (now() - t0);
            ours_cpu[r] = total / 1e6 / (cpu_now() - c0);
            snprintf(cmd, sizeof cmd, "%s %s/bench/bench_tokenizer.py '%s' '%s' 1", py, src, models[m], corpus);
            if (run_line(cmd, line, sizeof line) != 0) {
                fprintf(stderr, "bench_tokenizer: the library side failed (python3-sentencepiece installed?): %s\n", cmd);
                return 1;
            }
            if (sscanf(line, "%lf %lf", &lib[r], &lib_cpu[r]) != 2) {
                fprintf(stderr, "bench_tokenizer: unexpected output from the library side: %s\n", line);
                return 1;
            }
        }
        double lo = median(loads, 5) * 1e3, lc = median(load_cpu, 5) * 1e3;
        double mo = median(ours, rounds), ml = median(lib, rounds);
        double mco = median(ours_cpu, rounds), mcl = median(lib_cpu, rounds);
        printf("vocab %d (%s): load %.1f ms wall, %.1f ms CPU (medians of 5); %ld ids\n", g3_tokenizer_vocab(t),
               models[m], lo, lc, n_ids);
        printf("  encode MB/s, medians of %d alternating rounds: by wall time ours %.2f, sentencepiece %.2f, ratio "
               "%.2fx; by CPU time ours %.2f, sentencepiece %.2f, ratio %.2fx\n",
               rounds, mo, ml, mo / ml, mco, mcl, mco / mcl);
        g3_tokenizer_free(t);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) return 1;
    free(docs);
    free(data);
    return 0;
}
