/* The shipped demo model (models/gemma3-pydoc) against the transformers float32 reference stored beside it
 * (reference.json, made by tools/train_demo_model.py): last-prompt logits within 1e-3 * max(1, max|ref|), greedy
 * continuations equal up to the first step whose reference margin is below 0.01, and the tokenizer giving the
 * reference prompt ids for the prompts whose text is recorded. Skips when the model folder is absent. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma3.h"
#include "testutil.h"

#define N_GEN 32

static const char *model_dir(void) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/models/gemma3-pydoc", tu_source_dir());
    char ref[1100];
    snprintf(ref, sizeof ref, "%s/reference.json", path);
    FILE *f = fopen(ref, "rb");
    if (!f) return NULL;
    fclose(f);
    return path;
}

static cJSON *load_reference(const char *dir, char **text) {
    char path[1100];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    *text = tu_read_file(path, NULL);
    assert_non_null(*text);
    cJSON *root = cJSON_Parse(*text);
    assert_non_null(root);
    return root;
}

static int ids_from_json(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    for (const cJSON *e = arr ? arr->child : NULL; e && n < cap; e = e->next) out[n++] = (int32_t)e->valueint;
    return n;
}

typedef struct collected {
    int32_t ids[64];
    int n;
} collected;

static void on_event(const g3_event *ev, void *ctx) {
    collected *c = ctx;
    if (ev->has_token && c->n < 64) c->ids[c->n++] = ev->token;
}

static void test_logits_and_greedy(void **state) {
    (void)state;
    const char *dir = model_dir();
    if (!dir) {
        printf("  models/gemma3-pydoc not found: skipped\n");
        skip();
    }
    char *text = NULL;
    cJSON *root = load_reference(dir, &text);
    g3_model *m = NULL;
    g3_error err = {0};
    if (g3_model_load(dir, NULL, &m, &err) != G3_OK) fail_msg("load %s: %s", dir, err.msg);
    const int V = g3_model_config(m)->vocab;
    assert_int_equal(V, cJSON_GetObjectItem(cJSON_GetObjectItem(root, "config"), "vocab_size")->valueint);

    g3_engine_opts o;
    g3_engine_opts_default(&o);
    o.backend = "cpu";
    o.ctx_size = 256;
    g3_engine *e = NULL;
    if (g3_engine_create(m, &o, &e, &err) != G3_OK) fail_msg("engine: %s", err.msg);

    float *ours = malloc(sizeof(float) * (size_t)V);
    assert_non_null(ours);
    double worst = 0;
    int compared = 0, prompts = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(root, "prompts")) {
        const char *kind = cJSON_GetObjectItem(p, "kind")->valuestring;
        int32_t ids[256];
        int n = ids_from_json(cJSON_GetObjectItem(p, "ids"), ids, 256);
        assert_true(n > 0 && n < 200);
        /* last-position logits */
        if (g3_engine_logits(e, ids, n, 0, ours, &err) != G3_OK) fail_msg("logits %s: %s", kind, err.msg);
        const cJSON *ref = cJSON_GetObjectItem(p, "last_prompt_logits");
        assert_int_equal(cJSON_GetArraySize(ref), V);
        double mx = 1, d = 0;
        int k = 0;
        for (const cJSON *x = ref->child; x; x = x->next, k++) {
            double r = x->valuedouble, diff = fabs((double)ours[k] - r);
            if (fabs(r) > mx) mx = fabs(r);
            if (!(diff <= d)) d = isnan(diff) ? INFINITY : diff;
        }
        if (d / mx > worst) worst = d / mx;
        if (d / mx > 1e-3) fail_msg("%s: last-prompt logits differ by %.3g (relative)", kind, d / mx);

        /* greedy continuation through the scheduler */
        g3_request r = {.prompt = ids, .n_prompt = n, .max_tokens = N_GEN, .ignore_eos = 1};
        g3_sampling_default(&r.sampling);
        if (g3_engine_submit(e, &r, NULL, &err) != G3_OK) fail_msg("submit %s: %s", kind, err.msg);
        collected c = {.n = 0};
        int active = 1;
        while (active)
            if (g3_engine_step(e, on_event, &c, &active, &err) != G3_OK) fail_msg("step %s: %s", kind, err.msg);
        assert_int_equal(c.n, N_GEN);
        int32_t want[N_GEN];
        assert_int_equal(ids_from_json(cJSON_GetObjectItem(p, "generated_ids"), want, N_GEN), N_GEN);
        const cJSON *mar = cJSON_GetObjectItem(p, "margins");
        for (int s = 0; s < N_GEN; s++) {
            double margin = cJSON_GetArrayItem(mar, s)->valuedouble;
            if (c.ids[s] != want[s])
                fail_msg("%s: greedy token %d is %d, transformers gave %d (margin %.4f)", kind, s, c.ids[s], want[s],
                         margin);
            compared++;
            if (margin < 0.01) break; /* later tokens may legitimately differ */
        }
        prompts++;
    }
    assert_true(prompts >= 2);
    printf("  gemma3-pydoc: %d prompts, max relative logit error %.3g, %d greedy tokens equal\n", prompts, worst,
           compared);
    free(ours);
    g3_engine_free(e);
    g3_model_free(m);
    cJSON_Delete(root);
    free(text);
}

/* The engine's tokenizer on the prompts whose text reference.json records (ids = [2] + encode(text), special
 * pieces such as <start_of_turn> parsed). */
static void test_tokenizer_prompts(void **state) {
    (void)state;
    const char *dir = model_dir();
    if (!dir) {
        printf("  models/gemma3-pydoc not found: skipped\n");
        skip();
    }
    char *text = NULL;
    cJSON *root = load_reference(dir, &text);
    g3_tokenizer *t = NULL;
    g3_error err = {0};
    if (g3_tokenizer_load(dir, &t, &err) != G3_OK) fail_msg("tokenizer %s: %s", dir, err.msg);
    assert_int_equal(g3_tokenizer_vocab(t), 8192);
    int checked = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(root, "prompts")) {
        const cJSON *s = cJSON_GetObjectItem(p, "text");
        if (!cJSON_IsString(s)) continue;
        int32_t want[256];
        int n = ids_from_json(cJSON_GetObjectItem(p, "ids"), want, 256);
        int32_t *got = NULL;
        int n_got = 0;
        if (g3_tokenize(t, s->valuestring, strlen(s->valuestring), 1, &got, &n_got, &err) != G3_OK)
            fail_msg("tokenize: %s", err.msg);
        assert_int_equal(n_got + 1, n);
        assert_int_equal(want[0], 2);
        for (int i = 0; i < n_got; i++)
            if (got[i] != want[i + 1]) fail_msg("\"%s\": token %d is %d, reference %d", s->valuestring, i, got[i],
                                                want[i + 1]);
        free(got);
        checked++;
    }
    assert_true(checked >= 1);
    g3_tokenizer_free(t);
    cJSON_Delete(root);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_and_greedy),
        cmocka_unit_test(test_tokenizer_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
