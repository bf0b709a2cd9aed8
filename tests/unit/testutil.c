/* Helpers shared by the cmocka tests. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *tu_source_dir(void) {
    const char *s = getenv("G3_SOURCE_DIR");
    return s && *s ? s : ".";
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

const char *tu_fixture(const char *name) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/%s", tu_source_dir(), name);
    if (is_dir(path)) return path;
    const char *f = getenv("G3_FIXTURES");
    if (f && *f) {
        snprintf(path, sizeof path, "%s/%s", f, name);
        if (is_dir(path)) return path;
    }
    snprintf(path, sizeof path, "%s/../shared/fixtures/%s", tu_source_dir(), name);
    if (is_dir(path)) return path;
    return NULL;
}

void tu_skip_no_cuda(void **state) {
    (void)state;
    printf("  built without CUDA (no nvcc): skipped\n");
    skip();
}

void tu_skip_no_vulkan(void **state) {
    (void)state;
    printf("  this build has no Vulkan backend (Vulkan headers or glslc missing): skipped\n");
    skip();
}

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); return NULL; }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return NULL; }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    if (len) *len = got;
    return buf;
}

const char *tu_tmpdir(void) {
    static char dir[256];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/g3test.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) return "/tmp";
    return dir;
}

double tu_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

int tu_ref_load(const char *dir, tu_reference *r) {
    char path[1100];
    snprintf(path, sizeof path, "%.1000s/reference.json", dir);
    memset(r, 0, sizeof *r);
    r->text = tu_read_file(path, NULL);
    if (!r->text) return 0;
    r->root = cJSON_Parse(r->text);
    assert_non_null(r->root);
    r->vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(r->root, "config"), "vocab_size")->valueint;
    const cJSON *ps = cJSON_GetObjectItem(r->root, "prompts");
    r->n_prompts = cJSON_GetArraySize(ps);
    assert_int_equal(r->n_prompts, 4);
    for (int i = 0; i < r->n_prompts; i++) {
        const cJSON *p = cJSON_GetArrayItem(ps, i);
        tu_ref_prompt *q = &r->p[i];
        q->kind = cJSON_GetObjectItem(p, "kind")->valuestring;
        const cJSON *ids = cJSON_GetObjectItem(p, "ids");
        q->n = cJSON_GetArraySize(ids);
        q->ids = malloc(sizeof(int32_t) * (size_t)(q->n + 32));
        assert_non_null(q->ids);
        for (int k = 0; k < q->n; k++) q->ids[k] = cJSON_GetArrayItem(ids, k)->valueint;
        const cJSON *gen = cJSON_GetObjectItem(p, "generated_ids"), *mar = cJSON_GetObjectItem(p, "margins");
        for (int k = 0; k < 32; k++) {
            q->gen[k] = cJSON_GetArrayItem(gen, k)->valueint;
            q->margins[k] = (float)cJSON_GetArrayItem(mar, k)->valuedouble;
            q->ids[q->n + k] = q->gen[k];
        }
        q->last = cJSON_GetObjectItem(p, "last_prompt_logits");
        q->all = cJSON_GetObjectItem(p, "all_prompt_logits");
        q->steps = cJSON_GetObjectItem(p, "generated_step_logits");
    }
    return 1;
}

void tu_ref_free(tu_reference *r) {
    for (int i = 0; i < r->n_prompts; i++) free(r->p[i].ids);
    cJSON_Delete(r->root);
    free(r->text);
    memset(r, 0, sizeof *r);
}

void tu_row_from_json(const cJSON *arr, float *out, int n) {
    assert_int_equal(cJSON_GetArraySize(arr), n);
    int k = 0;
    for (const cJSON *e = arr->child; e; e = e->next) out[k++] = (float)e->valuedouble;
}

double tu_kl(const float *ref, const float *ours, int n, int *same_top1) {
    double mr = -INFINITY, mo = -INFINITY, zr = 0, zo = 0, kl = 0;
    int ar = 0, ao = 0;
    for (int i = 0; i < n; i++) {
        if (ref[i] > mr) mr = ref[i], ar = i;
        if (ours[i] > mo) mo = ours[i], ao = i;
    }
    for (int i = 0; i < n; i++) zr += exp(ref[i] - mr), zo += exp(ours[i] - mo);
    double lzr = log(zr) + mr, lzo = log(zo) + mo;
    for (int i = 0; i < n; i++) {
        double lpr = ref[i] - lzr, lpo = ours[i] - lzo;
        kl += exp(lpr) * (lpr - lpo);
    }
    *same_top1 = ar == ao;
    return kl;
}

double tu_rel_err(const float *ours, const float *ref, int n) {
    double mx = 1, d = 0;
    for (int i = 0; i < n; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        double x = fabs((double)ours[i] - ref[i]);
        if (x > d || isnan(x)) d = isnan(x) ? INFINITY : x;
    }
    return d / mx;
}

double tu_rel_err_rows(const float *ours, const float *ref, int rows, int n) {
    double worst = 0;
    for (int r = 0; r < rows; r++) worst = fmax(worst, tu_rel_err(ours + (size_t)r * n, ref + (size_t)r * n, n));
    return worst;
}

double tu_ref_logit_error(g3_engine *e, const tu_reference *r, int steps, double tol, const char *what) {
    int V = r->vocab, max_n = 0;
    for (int i = 0; i < r->n_prompts; i++) max_n = r->p[i].n > max_n ? r->p[i].n : max_n;
    float *ref = malloc(sizeof(float) * (size_t)V), *ours = malloc(sizeof(float) * (size_t)V * (size_t)(max_n + 32));
    assert_non_null(ref);
    assert_non_null(ours);
    g3_error err = {0};
    double worst = 0;
    for (int pi = 0; pi < r->n_prompts; pi++) {
        const tu_ref_prompt *p = &r->p[pi];
        int all = p->all != NULL;
        if (g3_engine_logits(e, p->ids, p->n, all, ours, &err) != G3_OK) fail_msg("%s: logits: %s", what, err.msg);
        for (int pos = all ? 0 : p->n - 1; pos < p->n; pos++) {
            tu_row_from_json(all ? cJSON_GetArrayItem(p->all, pos) : p->last, ref, V);
            double d = tu_rel_err(ours + (size_t)(all ? pos : 0) * V, ref, V);
            if (d > worst) worst = d;
            if (tol >= 0 && d > tol)
                fail_msg("%s prompt %s pos %d: logits differ by %.3g (relative)", what, p->kind, pos, d);
        }
        if (!steps || !p->steps) continue;
        /* decode-step logits: the prompt plus generated_ids[:k], last row each step */
        if (g3_engine_logits(e, p->ids, p->n + 31, 1, ours, &err) != G3_OK) fail_msg("%s: logits: %s", what, err.msg);
        for (int k = 0; k < 32; k++) {
            tu_row_from_json(cJSON_GetArrayItem(p->steps, k), ref, V);
            double d = tu_rel_err(ours + (size_t)(p->n - 1 + k) * V, ref, V);
            if (d > worst) worst = d;
            if (tol >= 0 && d > tol)
                fail_msg("%s prompt %s step %d: logits differ by %.3g (relative)", what, p->kind, k, d);
        }
    }
    free(ref);
    free(ours);
    return worst;
}
