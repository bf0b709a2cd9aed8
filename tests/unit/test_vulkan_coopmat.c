/* Prefill on cooperative matrices through the whole model, for each flavour device 0 can run ($G3_VULKAN_COOPMAT=nv,
 * =khr): the tiny-gqa fixture's Q8_0 GGUF (cooperative matrices serve GGUF block weights only), every prompt
 * position's logits from one 512-row prefill chunk (the tiled products on tensor cores) against the same prefill on
 * the portable matmul ($G3_VULKAN_COOPMAT=0): within 1e-2 * max(1, max|portable|) per row (f16 tiles round the
 * activations and the d * q weights to 11 bits; H200: 3.4e-3, a broken product is off by ~1; the Q8_0 model itself is
 * KL 0.007 nats from the float references) and the same top-1 token at >= 97% of the positions (near ties may flip:
 * 182 of 183 on the H200). The Q8_0 model's KL against the references with
 * cooperative matrices on (the default) is test_vulkan_model's. Skipped with a message where the device has no
 * cooperative matrices (lavapipe). */
#ifdef G3_HAVE_VULKAN
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vulkan_api.h"
#include "gemma3.h"
#include "testutil.h"
#include "vk_testutil.h"

static g3_engine *make_engine(g3_model *m, int chunk) {
    g3_engine_opts o;
    g3_engine_opts_default(&o);
    o.backend = "vulkan";
    o.ctx_size = 256;
    o.prefill_chunk = chunk;
    o.max_seqs = 1;
    g3_engine *e = NULL;
    g3_error err = {0};
    if (g3_engine_create(m, &o, &e, &err) != G3_OK) fail_msg("engine: %s", err.msg);
    return e;
}

/* Logits of every position of every reference prompt, one prefill chunk each, with $G3_VULKAN_COOPMAT = flavour. */
static float *all_logits(g3_model *m, const tu_reference *r, const char *flavour, size_t *rows) {
    setenv("G3_VULKAN_COOPMAT", flavour, 1);
    g3_engine *e = make_engine(m, 512);
    int V = g3_model_config(m)->vocab;
    size_t total = 0;
    for (int pi = 0; pi < r->n_prompts; pi++) total += (size_t)r->p[pi].n;
    float *out = malloc(sizeof(float) * total * (size_t)V);
    size_t at = 0;
    g3_error err = {0};
    for (int pi = 0; pi < r->n_prompts; pi++) {
        if (r->p[pi].n <= 8) printf("  (prompt %s has %d rows: the matvec path, not the tiled products)\n", r->p[pi].kind, r->p[pi].n);
        if (g3_engine_logits(e, r->p[pi].ids, r->p[pi].n, 1, out + at * (size_t)V, &err) != G3_OK)
            fail_msg("logits (%s): %s", flavour, err.msg);
        at += (size_t)r->p[pi].n;
    }
    g3_engine_free(e);
    unsetenv("G3_VULKAN_COOPMAT");
    *rows = total;
    return out;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void test_prefill_coopmat_vs_portable(void **state) {
    (void)state;
    if (!have_device()) skip();
    const char *dir0 = tu_fixture("tiny-gqa");
    if (!dir0) {
        printf("  fixture tiny-gqa not found: skipped\n");
        skip();
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/model-q8_0.gguf", dir0);
    static const char *const flavours[2] = {"nv", "khr"};
    int runnable[2], any = 0;
    for (int f = 0; f < 2; f++) {
        setenv("G3_VULKAN_COOPMAT", flavours[f], 1);
        g3_error err = {0};
        int has = g3_vulkan_test_coopmat(&err);
        unsetenv("G3_VULKAN_COOPMAT");
        if (has < 0) fail_msg("device 0: %s", err.msg);
        runnable[f] = has == f + 1;
        any |= runnable[f];
        if (!runnable[f]) printf("  device 0 cannot run %s cooperative matrices: that flavour skipped\n", flavours[f]);
    }
    if (!any) {
        printf("  device 0 has no usable cooperative matrices: skipped\n");
        skip();
    }
    tu_reference r;
    assert_true(tu_ref_load(dir0, &r));
    g3_model *m = NULL;
    g3_error err = {0};
    if (g3_model_load(dir, NULL, &m, &err) != G3_OK) fail_msg("load %s: %s", dir, err.msg);
    int V = g3_model_config(m)->vocab;
    size_t rows = 0, rows2 = 0;
    float *base = all_logits(m, &r, "0", &rows);
    for (int f = 0; f < 2; f++) {
        if (!runnable[f]) continue;
        float *cm = all_logits(m, &r, flavours[f], &rows2);
        assert_int_equal(rows, rows2);
        double worst = 0;
        int same = 0;
        for (size_t i = 0; i < rows; i++) {
            double d = tu_rel_err(cm + i * (size_t)V, base + i * (size_t)V, V);
            if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
            same += argmax(cm + i * (size_t)V, V) == argmax(base + i * (size_t)V, V);
        }
        printf("  %s: %zu positions, max relative logit difference to the portable matmul %.3g, top-1 equal at %d\n",
               flavours[f], rows, worst, same);
        if (!(worst < 1e-2)) fail_msg("%s: logits differ from the portable prefill by %.3g", flavours[f], worst);
        assert_true(worst > 0); /* the two runs took different paths */
        assert_true(same * 100 >= (int)rows * 97);
        free(cm);
    }
    free(base);
    g3_model_free(m);
    tu_ref_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_coopmat_vs_portable),
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
