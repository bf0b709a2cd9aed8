/* Benchmark of the CUDA backend on random weights of released shapes, generated on the device (no host copy):
 * batch-1 decode, 512-token prefill (= time to first token), aggregate decode at several batch sizes, each with
 * its ratio to the measured ceilings (streaming read bandwidth for decode, cuBLAS bf16 GEMM rate for prefill).
 *
 *   g3cuda_bench [--sizes 1b,4b,27b] [--quants bf16,int8,int4] [--gemm split|bf16] [--steps 64] [--batches 8,32,64,256]
 *                [--profile 1]   (also: time of each launch group in one eager prefill, decode step and batch step of
 *                                 32 rows; --profile n > 1: the batch step of n rows)
 *                [--batch1 0]    (aggregate decode only: no prefill or batch-1 measurements, e.g. under a profiler)
 *                [--dump FILE]   (append each batch size's last decode logits to FILE, float32: dev/cuda/logits_diff.py)
 *
 * Prints one markdown row per measurement. Decode figures come twice: logits copied to the host (the backend
 * interface) and argmax on the device (only token ids come back). Prefill is timed in the chosen GEMM mode and
 * again with plain bf16 activations (half the tensor-core work of hi+lo); the decode graph's node count is shown. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_api.h"
#include "model/config.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define MAXB 256
#define PROMPT 512
#define CTX 640
#define BLK 16

static void profile(g3_backend *b, const g3_batch *bt, const char *size, const char *quant, const char *what) {
    char buf[4096];
    g3_error err = {0};
    if (g3_cuda_profile(b, bt, buf, sizeof buf, &err) != G3_OK) {
        fprintf(stderr, "profile: %s\n", err.msg);
        return;
    }
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char name[64];
        double tot = 0, per = 0;
        int n = 0;
        if (sscanf(line, "%63[^\t]\t%lf\t%d\t%lf", name, &tot, &n, &per) == 4)
            printf("profile | %s | %s | %s | %s | %.1f us total | %d x %.2f us\n", size, quant, what, name, tot, n, per);
    }
}

static int list(const char *s, char out[][16], int max) {
    int n = 0;
    while (s && *s && n < max) {
        const char *c = strchr(s, ',');
        size_t l = c ? (size_t)(c - s) : strlen(s);
        snprintf(out[n++], 16, "%.*s", (int)l, s);
        s = c ? c + 1 : NULL;
    }
    return n;
}

int main(int argc, char **argv) {
    char sizes[8][16], quants[8][16], batches_s[8][16];
    int ns = list("1b,4b,27b", sizes, 8), nq = list("bf16,int8,int4", quants, 8), nb = list("8,32,64,256", batches_s, 8);
    int gemm = 0, steps = 64, prof = 0, one = 1;
    const char *dump = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes")) ns = list(argv[i + 1], sizes, 8);
        else if (!strcmp(argv[i], "--quants")) nq = list(argv[i + 1], quants, 8);
        else if (!strcmp(argv[i], "--batches")) nb = list(argv[i + 1], batches_s, 8);
        else if (!strcmp(argv[i], "--gemm")) gemm = !strcmp(argv[i + 1], "bf16") ? 2 : 1;
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--profile")) prof = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch1")) one = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dump")) dump = argv[i + 1];
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (g3_cuda_device_count() == 0) {
        printf("no CUDA device\n");
        return 0;
    }
    g3_error err = {0};
    double rd = 0, cp = 0, tf = 0;
    if (g3_cuda_probe((size_t)4 << 30, 8192, &rd, &cp, &tf, &err) != G3_OK) {
        fprintf(stderr, "probe: %s\n", err.msg);
        return 1;
    }
    printf("ceilings: streaming read %.0f GB/s, device copy (read+write) %.0f GB/s, cuBLAS bf16 8192^3 %.0f TFLOP/s\n",
           rd, cp, tf);
    const int W = CTX / BLK, nblocks = W + MAXB * 8 + 8;
    int32_t *btg = malloc(sizeof(int32_t) * (MAXB + 1) * W), *btl = malloc(sizeof(int32_t) * (MAXB + 1) * W);
    /* slot 0: the long prompt (blocks 0..W-1); slot s >= 1: 8 blocks (128 tokens) each */
    for (int s = 0; s <= MAXB; s++)
        for (int j = 0; j < W; j++) {
            int v = s == 0 ? j : (j < 8 ? W + (s - 1) * 8 + j : -1);
            btg[s * W + j] = btl[s * W + j] = v;
        }
    int32_t *tok = malloc(sizeof(int32_t) * PROMPT * 2), *pos = malloc(sizeof(int32_t) * PROMPT * 2);
    int32_t *seq = malloc(sizeof(int32_t) * PROMPT * 2), *outr = malloc(sizeof(int32_t) * PROMPT * 2);
    int32_t *ids = malloc(sizeof(int32_t) * MAXB);
    printf("| shape | weights | GEMM | measure | value | limit | ratio |\n|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < ns; si++) {
        g3_config c;
        if (g3_config_preset(&c, sizes[si], &err) != G3_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
        for (int qi = 0; qi < nq; qi++) {
            g3_backend_cfg bc = {.max_seqs = MAXB + 1, .max_rows = PROMPT, .kv_block = BLK, .max_blocks_per_seq = W,
                                 .n_blocks_global = nblocks, .n_blocks_local = nblocks, .device = 0};
            g3_cuda_opts o = {.quant = quants[qi], .gemm = gemm, .seed = 7};
            g3_backend *b = NULL;
            double t0 = now();
            if (g3_cuda_create(NULL, &c, &bc, &o, &b, &err) != G3_OK) {
                printf("| %s | %s | | create failed: %s | | | |\n", sizes[si], quants[qi], err.msg);
                continue;
            }
            double tload = now() - t0;
            const char *gm = gemm == 2 ? "bf16" : "bf16 hi+lo";
            double wb = (double)g3_cuda_resident_bytes(b);
            /* FLOPs per token in the matrices (2 per weight) */
            double flops_tok = 2.0 * ((double)c.hidden * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim +
                                      (double)c.n_heads * c.head_dim * c.hidden + 3.0 * c.hidden * c.ffn) *
                               c.n_layers;
            fprintf(stderr, "%s %s: created in %.1f s, %.2f GB resident\n", sizes[si], quants[qi], tload, wb / 1e9);
            float *logits = malloc(sizeof(float) * (size_t)c.vocab * MAXB);
            const double lim = rd * 1e9 / wb; /* decode steps per second at the streaming read */
            if (one) {
                /* prefill 512 (slot 0) */
                for (int i = 0; i < PROMPT; i++) tok[i] = (i * 7919 + 3) % c.vocab, pos[i] = i, seq[i] = 0;
                outr[0] = PROMPT - 1;
                g3_batch bt = {.n_rows = PROMPT, .token = tok, .pos = pos, .seq = seq, .n_out = 1, .out_rows = outr,
                               .bt_global = btg, .bt_local = btl};
                if (g3_backend_cuda.forward(b, &bt, logits, &err) != G3_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
                double best = 1e9;
                for (int r = 0; r < 3; r++) {
                    t0 = now();
                    g3_backend_cuda.forward(b, &bt, logits, &err);
                    double t = now() - t0;
                    if (t < best) best = t;
                }
                double pf = PROMPT / best;
                printf("| %s | %s | %s | prefill 512 tok/s | %.0f | %.0f (at %.0f TFLOP/s) | %.2f |\n", sizes[si], quants[qi],
                       gm, pf, tf * 1e12 / flops_tok, tf, pf / (tf * 1e12 / flops_tok));
                printf("| %s | %s | %s | time to first token, 512 prompt (ms) | %.1f | | |\n", sizes[si], quants[qi], gm,
                       best * 1e3);
                if (gemm != 2) { /* the same prefill with plain bf16 activations, then back */
                    if (g3_cuda_set_gemm(b, 2, &err) != G3_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
                    g3_backend_cuda.forward(b, &bt, logits, &err);
                    double bp = 1e9;
                    for (int r = 0; r < 3; r++) {
                        t0 = now();
                        g3_backend_cuda.forward(b, &bt, logits, &err);
                        double t = now() - t0;
                        if (t < bp) bp = t;
                    }
                    printf("| %s | %s | bf16 | prefill 512 tok/s | %.0f | %.0f (at %.0f TFLOP/s) | %.2f |\n", sizes[si],
                           quants[qi], PROMPT / bp, tf * 1e12 / flops_tok, tf, PROMPT / bp / (tf * 1e12 / flops_tok));
                    printf("| %s | %s | bf16 | time to first token, 512 prompt (ms) | %.1f | | |\n", sizes[si], quants[qi],
                           bp * 1e3);
                    if (g3_cuda_set_gemm(b, 1, &err) != G3_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
                }
                /* batch-1 decode after the prompt */
                for (int mode = 0; mode < 2; mode++) {
                    int n = steps, p0 = PROMPT;
                    tok[0] = 5, seq[0] = 0, outr[0] = 0;
                    g3_batch d1 = {.n_rows = 1, .token = tok, .pos = pos, .seq = seq, .n_out = 1, .out_rows = outr,
                                   .bt_global = btg, .bt_local = btl};
                    pos[0] = p0;
                    g3_backend_cuda.forward(b, &d1, logits, &err); /* warm-up and graph capture */
                    t0 = now();
                    for (int i = 0; i < n && p0 + 1 + i < CTX; i++) {
                        pos[0] = p0 + 1 + i;
                        g3_status rc = mode ? g3_cuda_forward_argmax(b, &d1, ids, &err)
                                            : g3_backend_cuda.forward(b, &d1, logits, &err);
                        if (rc) { fprintf(stderr, "%s\n", err.msg); return 1; }
                        tok[0] = mode ? ids[0] : 5;
                    }
                    double t = (now() - t0) / n;
                    printf("| %s | %s | %s | batch-1 decode tok/s (%s) | %.1f | %.1f (%.2f GB at %.0f GB/s) | %.2f |\n",
                           sizes[si], quants[qi], gm, mode ? "argmax on GPU" : "logits to host", 1 / t, lim, wb / 1e9, rd,
                           (1 / t) / lim);
                    if (mode) fprintf(stderr, "%s %s: batch-1 decode graph has %d nodes\n", sizes[si], quants[qi],
                                      g3_cuda_graph_nodes(b, 1));
                    if (mode && prof) {
                        for (int i = 0; i < PROMPT; i++) tok[i] = (i * 7919 + 3) % c.vocab, pos[i] = i, seq[i] = 0;
                        outr[0] = PROMPT - 1;
                        profile(b, &bt, sizes[si], quants[qi], "prefill 512");
                        tok[0] = 5, pos[0] = p0 + n + 1, outr[0] = 0;
                        profile(b, &d1, sizes[si], quants[qi], "decode 1");
                    }
                }
            }
            /* aggregate decode */
            for (int bi = 0; bi < nb; bi++) {
                int B = atoi(batches_s[bi]);
                if (B < 1 || B > MAXB) continue;
                const int P = 64, G = 32;
                /* prefill all B prompts of P tokens, 8 sequences per forward */
                for (int s0 = 0; s0 < B; s0 += 8) {
                    int n = 0;
                    for (int s = s0; s < s0 + 8 && s < B; s++)
                        for (int i = 0; i < P; i++) tok[n] = (s * 31 + i) % c.vocab, pos[n] = i, seq[n] = s + 1, n++;
                    g3_batch pb = {.n_rows = n, .token = tok, .pos = pos, .seq = seq, .n_out = 0, .out_rows = outr,
                                   .bt_global = btg, .bt_local = btl};
                    if (g3_backend_cuda.forward(b, &pb, logits, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                }
                for (int mode = 0; mode < 2; mode++) {
                    for (int s = 0; s < B; s++) tok[s] = 9, seq[s] = s + 1, outr[s] = s;
                    g3_batch db = {.n_rows = B, .token = tok, .pos = pos, .seq = seq, .n_out = B, .out_rows = outr,
                                   .bt_global = btg, .bt_local = btl};
                    for (int s = 0; s < B; s++) pos[s] = P;
                    g3_backend_cuda.forward(b, &db, logits, &err); /* warm-up, capture */
                    t0 = now();
                    for (int i = 0; i < G; i++) {
                        for (int s = 0; s < B; s++) pos[s] = P + 1 + i + (mode ? 0 : 0);
                        g3_status rc = mode ? g3_cuda_forward_argmax(b, &db, ids, &err)
                                            : g3_backend_cuda.forward(b, &db, logits, &err);
                        if (rc) { fprintf(stderr, "%s\n", err.msg); return 1; }
                    }
                    double t = (now() - t0) / G;
                    /* --dump FILE: the last step's logits of each batch size appended as float32 rows, to compare two
                     * switch settings (dev/cuda/logits_diff.py) */
                    if (dump && !mode) {
                        FILE *f = fopen(dump, "ab");
                        const int ok = f && fwrite(logits, sizeof(float), (size_t)B * c.vocab, f) == (size_t)B * c.vocab;
                        if (f) fclose(f);
                        if (!ok) { fprintf(stderr, "cannot write %s\n", dump); return 1; }
                    }
                    if (mode && prof && B == (prof > 1 ? prof : 32)) {
                        char what[32];
                        snprintf(what, sizeof what, "decode %d", B);
                        profile(b, &db, sizes[si], quants[qi], what);
                    }
                    printf("| %s | %s | %s | aggregate decode tok/s, %d seqs (%s) | %.0f | %.0f (weights once per step) "
                           "| %.2f |\n",
                           sizes[si], quants[qi], gm, B, mode ? "argmax on GPU" : "logits to host", B / t, B * lim,
                           (B / t) / (B * lim));
                }
            }
            fflush(stdout);
            free(logits);
            g3_backend_cuda.destroy(b);
        }
    }
    free(btg), free(btl), free(tok), free(pos), free(seq), free(outr), free(ids);
    return 0;
}
