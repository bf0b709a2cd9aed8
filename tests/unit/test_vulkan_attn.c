/* The Vulkan attention and argmax shaders against the CPU: attn.comp (+ attn_combine.comp) through the hook that
 * records them as a layer does, against g3_attend (src/backend/cpu/cpu_ops.c) per row and head, at the Gemma 3
 * shapes (1B: 4 query heads / 1 KV head, D 256; 4B: 8/4, 256; 27B: 32/16, 128) and odd ones (3/1, D 80; 6/2, 64),
 * 1, 47, 513 and 1500 keys, a sliding layer (window 512) and a global one, 1 and 8 rows (8 sequences at different
 * positions, block tables permuted), the split decode path with its merge dispatch and with the fused merge, the
 * one-chunk prefill path, a split capped to 3 chunks (chunks of many tiles), softcap, the f16 cache, and the shaders
 * built without subgroup operations. argmax.comp
 * against a host scan at Gemma's 262208-entry vocabulary and a small one, with planted ties and maxima at the ends.
 * Runs on any Vulkan device (lavapipe in CI); skipped only when none exists. */
#ifdef G3_HAVE_VULKAN
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/fp16.h"
#include "backend/vulkan/vk_test_attn.h"
#include "testutil.h"
#include "vk_testutil.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static uint32_t urand(uint32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)((rng >> 33) % n);
}

static float f16_round(float x) { return g3_f16_to_f32(g3_f32_to_f16(x)); }

typedef struct shape {
    int NH, KVH, D;
} shape;

/* One case: `rows` rows, row 0 at position n_keys - 1, the others earlier (different spans and chunk counts), each
 * its own sequence whose block table is a random draw from a pool shared by all (the kernel only reads). Returns the
 * worst absolute difference from g3_attend (outputs are convex combinations of V values in [-1, 1]). */
static double run_case(shape s, int n_keys, int window, int rows, int path, float softcap, int kv16, int ctx) {
    const int B = 16, NL = 2, li = 1;
    int bps = (ctx + B - 1) / B;
    int need = (n_keys + B - 1) / B;
    int n_blocks = need + 5;
    size_t per_block = (size_t)NL * 2 * (size_t)s.KVH * B * (size_t)s.D;
    float *pool = malloc(sizeof(float) * per_block * (size_t)n_blocks);
    assert_non_null(pool);
    for (size_t i = 0; i < per_block * (size_t)n_blocks; i++) {
        pool[i] = frand();
        if (kv16) pool[i] = f16_round(pool[i]); /* the reference sees what the f16 cache holds */
    }
    int32_t *table = malloc(sizeof(int32_t) * (size_t)rows * (size_t)bps);
    int32_t pos[8], seq[8];
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < bps; i++) table[r * bps + i] = (int32_t)urand((uint32_t)n_blocks);
        pos[r] = r == 0 ? n_keys - 1 : (int32_t)urand((uint32_t)n_keys);
        seq[r] = r;
    }
    int ld = (s.NH + 2 * s.KVH) * s.D; /* as in the QKV activation: queries first */
    float *q = malloc(sizeof(float) * (size_t)rows * (size_t)ld);
    for (int i = 0; i < rows * ld; i++) q[i] = 3.0f * frand(); /* scores spread over several units */
    float scale = 1.0f / sqrtf((float)s.D);
    size_t n_out = (size_t)rows * (size_t)s.NH * (size_t)s.D;
    float *out = malloc(sizeof(float) * n_out), *ref = malloc(sizeof(float) * (size_t)s.D);
    float *scores = malloc(sizeof(float) * (size_t)n_keys);
    g3_vulkan_attn_case c = {.NH = s.NH, .KVH = s.KVH, .D = s.D, .B = B, .n_layers_kind = NL, .li = li,
                             .window = window, .scale = scale, .softcap = softcap, .rows = rows, .pos = pos,
                             .seq = seq, .max_seqs = rows, .bps = bps, .table = table, .n_blocks = n_blocks,
                             .pool = pool, .q = q, .ld = ld, .path = path, .ctx = ctx, .kv16 = kv16};
    g3_error err = {0};
    if (g3_vulkan_test_attn(&c, out, &err) != G3_OK) fail_msg("test_attn: %s", err.msg);
    double worst = 0;
    int G = s.NH / s.KVH;
    for (int r = 0; r < rows; r++) {
        int first = window > 0 && pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
        for (int h = 0; h < s.NH; h++) {
            g3_attend(pool, per_block, li, s.KVH, h / G, B, s.D, table + r * bps, first, pos[r],
                      q + (size_t)r * ld + (size_t)h * s.D, scale, softcap, scores, ref);
            const float *o = out + ((size_t)r * s.NH + h) * s.D;
            for (int d = 0; d < s.D; d++) {
                double e = fabs((double)o[d] - ref[d]);
                if (!(e <= worst)) worst = e; /* NaN becomes the worst */
            }
        }
    }
    free(pool), free(table), free(q), free(out), free(ref), free(scores);
    return worst;
}

static const char *path_name[] = {"split+combine", "split, fused merge", "one chunk"};

static void check(shape s, int n_keys, int window, int rows, int path, float softcap, int kv16, int ctx) {
    double e = run_case(s, n_keys, window, rows, path, softcap, kv16, ctx);
    printf("  heads %2d/%2d D %3d, %4d keys, window %3d, %d rows, %-18s%s%s: max abs diff %.2e\n", s.NH, s.KVH, s.D,
           n_keys, window, rows, path_name[path], softcap > 0 ? ", softcap" : "", kv16 ? ", f16 KV" : "", e);
    if (!(e <= 2e-5)) fail_msg("attention differs from the CPU by %g", e);
}

static const shape gemma[] = {{4, 1, 256}, {8, 4, 256}, {32, 16, 128}};

static void test_attn_decode(void **state) {
    (void)state;
    if (!have_device()) skip();
    unsetenv("G3_VULKAN_ATTN_SPLIT");
    static const int keys[] = {1, 47, 513, 1500};
    for (int si = 0; si < 3; si++)
        for (int ki = 0; ki < 4; ki++)
            for (int w = 0; w < 2; w++) {
                int window = w ? 512 : 0;
                check(gemma[si], keys[ki], window, 1, 0, 0, 0, 2048);
                check(gemma[si], keys[ki], window, 8, 0, 0, 0, 2048);
            }
}

static void test_attn_fused_and_prefill(void **state) {
    (void)state;
    if (!have_device()) skip();
    unsetenv("G3_VULKAN_ATTN_SPLIT");
    static const int keys[] = {1, 47, 513, 1500};
    for (int si = 0; si < 3; si++)
        for (int ki = 0; ki < 4; ki++) {
            check(gemma[si], keys[ki], ki % 2 ? 512 : 0, 8, 1, 0, 0, 2048); /* merge in the last workgroup */
            check(gemma[si], keys[ki], ki % 2 ? 0 : 512, 8, 2, 0, 0, 2048); /* prefill: whole span, no split */
        }
}

/* Geometry beyond the Gemma shapes: one head per workgroup (NH/KVH odd), D 80 (20-vec4 rows, 42-key tiles), D 64;
 * a split capped to 3 chunks (chunks of many tiles, the merge over 3); a context shorter than one tile (no split);
 * softcap; the f16 cache. */
static void test_attn_other(void **state) {
    (void)state;
    if (!have_device()) skip();
    shape odd[] = {{3, 1, 80}, {6, 2, 64}};
    for (int i = 0; i < 2; i++) {
        check(odd[i], 513, 512, 8, 0, 0, 0, 2048);
        check(odd[i], 200, 0, 3, 1, 0, 0, 2048);
        check(odd[i], 200, 0, 3, 2, 0, 0, 2048);
    }
    setenv("G3_VULKAN_ATTN_SPLIT", "3", 1);
    check(gemma[0], 1500, 0, 8, 0, 0, 0, 2048);
    check(gemma[2], 513, 512, 8, 1, 0, 0, 2048);
    unsetenv("G3_VULKAN_ATTN_SPLIT");
    check(gemma[0], 10, 0, 2, 0, 0, 0, 16);
    check(gemma[1], 513, 512, 4, 0, 30.0f, 0, 2048);
    check(gemma[2], 47, 0, 1, 1, 30.0f, 0, 2048);
    check(gemma[0], 513, 512, 8, 0, 0, 1, 2048);
    check(gemma[2], 1500, 0, 8, 1, 0, 1, 2048);
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1); /* the merges' reductions through shared memory */
    check(gemma[0], 1500, 512, 8, 0, 0, 0, 2048);
    check(gemma[1], 1500, 0, 8, 1, 0, 0, 2048);
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
}

static int host_argmax(const float *x, int V) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void check_argmax(int rows, int V) {
    float *x = malloc(sizeof(float) * (size_t)rows * (size_t)V);
    int32_t ids[64];
    assert_non_null(x);
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * V;
        for (int i = 0; i < V; i++) row[i] = 10.0f * frand();
        switch (r % 6) {
        case 0: row[V - 1] = 20.0f; break;                               /* the last id */
        case 1: row[0] = 20.0f; break;                                   /* the first id */
        case 2: row[V / 2 + 1] = row[V - 3] = row[V / 3] = 20.0f; break; /* a tie across slabs: the lowest id */
        case 3:
            for (int i = 0; i < V; i++) row[i] = -INFINITY;            /* all -inf but one */
            row[(r * 7919) % V] = -1e30f;
            break;
        case 4:
            for (int i = 0; i < V; i++) row[i] = 1.0f;                 /* all equal: id 0 */
            break;
        default: break; /* random */
        }
    }
    g3_error err = {0};
    if (g3_vulkan_test_argmax(x, rows, V, ids, &err) != G3_OK) fail_msg("test_argmax: %s", err.msg);
    for (int r = 0; r < rows; r++) {
        int want = host_argmax(x + (size_t)r * V, V);
        if (ids[r] != want) fail_msg("argmax of row %d (V %d): %d, want %d", r, V, ids[r], want);
    }
    printf("  argmax: %d rows of %d equal to the host's\n", rows, V);
    free(x);
}

static void test_argmax(void **state) {
    (void)state;
    if (!have_device()) skip();
    check_argmax(1, 262208);
    check_argmax(12, 262208);
    check_argmax(64, 262208);
    check_argmax(6, 1000);   /* one workgroup per row */
    check_argmax(6, 2049);   /* two slabs, the second of one value */
    check_argmax(6, 300000); /* 147 slabs */
    check_argmax(3, 600000); /* 256 slabs (the cap) of more than one pass */
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1);
    check_argmax(12, 262208);
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_decode),
        cmocka_unit_test(test_attn_fused_and_prefill),
        cmocka_unit_test(test_attn_other),
        cmocka_unit_test(test_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else /* built without the Vulkan backend */
#include "testutil.h"

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tu_skip_no_vulkan)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
