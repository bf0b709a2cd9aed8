/* Safetensors reader: the tiny-gqa model.safetensors (known shapes and dtypes), a sharded folder made here
 * from its tensors (index.json; a missing shard, a duplicate tensor and a wrong index are refused by name),
 * dtypes other than F32/F16/BF16 kept with dtype -1, and folder-level errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "format_testutil.h"
#include "testutil.h"

static void test_fixture(void **state) {
    (void)state;
    const char *dir = tu_fixture("tiny-gqa");
    if (!dir) {
        print_message("tiny-gqa fixture not found: skipped\n");
        skip();
    }
    g3_safetensors st;
    g3_error err = {0};
    assert_int_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    assert_int_equal(st.n_files, 1);
    assert_int_equal(st.n_tensors, 80); /* 6 x 13 + embed + final norm; the head is tied */
    const g3_st_tensor *q = g3_st_find(&st, "model.layers.0.self_attn.q_proj.weight");
    assert_non_null(q);
    assert_int_equal(q->dtype, G3_DTYPE_BF16);
    assert_string_equal(q->dtype_name, "BF16");
    assert_int_equal(q->n_dims, 2);
    assert_int_equal(q->shape[0], 64);
    assert_int_equal(q->shape[1], 64);
    assert_int_equal(q->nbytes, 64 * 64 * 2);
    const g3_st_tensor *k = g3_st_find(&st, "model.layers.5.self_attn.k_proj.weight");
    assert_true(k && k->shape[0] == 32 && k->shape[1] == 64); /* 2 kv heads x head_dim 16 */
    const g3_st_tensor *e = g3_st_find(&st, "model.embed_tokens.weight");
    assert_true(e && e->shape[0] == 512 && e->shape[1] == 64 && e->nbytes == 512 * 64 * 2);
    const g3_st_tensor *n = g3_st_find(&st, "model.norm.weight");
    assert_true(n && n->n_dims == 1 && n->shape[0] == 64 && n->shape[1] == 1);
    assert_null(g3_st_find(&st, "lm_head.weight"));
    assert_null(g3_st_find(&st, "__metadata__"));
    assert_null(g3_st_find(&st, ""));
    for (size_t i = 0; i < st.n_tensors; i++) {
        const g3_st_tensor *t = &st.tensors[i];
        assert_ptr_equal(g3_st_find(&st, t->name), t);
        assert_true(t->data >= st.files[0].data && t->data + t->nbytes <= st.files[0].data + st.files[0].size);
        if (i) assert_true(strcmp(st.tensors[i - 1].name, t->name) < 0);
    }
    g3_st_close(&st);
    g3_st_close(&st); /* idempotent */

    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(g3_st_open_file(&st, path, &err), G3_OK);
    assert_int_equal(st.n_tensors, 80);
    g3_st_close(&st);
}

static void write_index(const char *dir, const char *const *names, const char *const *files, int n) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", 1234);
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < n; i++) cJSON_AddStringToObject(wm, names[i], files[i]);
    char *js = cJSON_Print(root);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_true(ft_write(path, js, strlen(js)));
    free(js);
    cJSON_Delete(root);
}

/* Splits the fixture into two shards plus an index; checks the sharded open and its error cases. */
static void test_sharded(void **state) {
    (void)state;
    const char *fix = tu_fixture("tiny-gqa");
    if (!fix) skip();
    char fixdir[1024];
    snprintf(fixdir, sizeof fixdir, "%s", fix);
    g3_safetensors src, st;
    g3_error err = {0};
    assert_int_equal(g3_st_open_dir(&src, fixdir, &err), G3_OK);
    size_t n = src.n_tensors;
    ft_st_entry *ent = calloc(n, sizeof *ent);
    const char **names = calloc(n, sizeof *names), **files = calloc(n, sizeof *files);
    for (size_t i = 0; i < n; i++) {
        const g3_st_tensor *t = &src.tensors[i];
        ent[i] = (ft_st_entry){t->name, t->dtype_name, t->n_dims, {t->shape[0], t->shape[1], t->shape[2], t->shape[3]},
                               t->data, t->nbytes};
        names[i] = t->name;
        files[i] = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    /* shard 1: even tensors, shard 2: odd ones */
    ft_st_entry *s1 = calloc(n, sizeof *s1), *s2 = calloc(n, sizeof *s2);
    int n1 = 0, n2 = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % 2) s2[n2++] = ent[i];
        else s1[n1++] = ent[i];
    }
    char dir[512], p1[700], p2[700];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(p1, sizeof p1, "%s/%s", dir, files[0]);
    snprintf(p2, sizeof p2, "%s/%s", dir, files[1]);
    assert_true(ft_st_write(p1, s1, n1));
    assert_true(ft_st_write(p2, s2, n2));
    write_index(dir, names, files, (int)n);

    assert_int_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    assert_int_equal(st.n_files, 2);
    assert_int_equal(st.n_tensors, n);
    for (size_t i = 0; i < n; i++) {
        const g3_st_tensor *t = g3_st_find(&st, src.tensors[i].name);
        assert_non_null(t);
        assert_int_equal(t->file, (int)(i % 2));
        assert_int_equal(t->dtype, src.tensors[i].dtype);
        assert_int_equal(t->nbytes, src.tensors[i].nbytes);
        assert_memory_equal(t->data, src.tensors[i].data, t->nbytes);
    }
    g3_st_close(&st);
    print_message("sharded: %zu tensors across 2 shards found\n", n);

    /* index names a tensor under the wrong shard */
    files[0] = "model-00002-of-00002.safetensors";
    write_index(dir, names, files, (int)n);
    assert_int_not_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    if (!strstr(err.msg, names[0])) fail_msg("message lacks the tensor name: %s", err.msg);
    files[0] = "model-00001-of-00002.safetensors";

    /* a tensor present in both shards */
    s2[n2++] = s1[0];
    assert_true(ft_st_write(p2, s2, n2));
    write_index(dir, names, files, (int)n);
    assert_int_not_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    if (!strstr(err.msg, "duplicate") || !strstr(err.msg, s1[0].name)) fail_msg("unexpected message: %s", err.msg);
    n2--;
    assert_true(ft_st_write(p2, s2, n2));

    /* missing shard */
    assert_int_equal(unlink(p2), 0);
    assert_int_not_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    if (!strstr(err.msg, "model-00002-of-00002.safetensors")) fail_msg("message lacks the shard: %s", err.msg);
    print_message("missing shard: %s\n", err.msg);

    /* a shard name that leaves the folder */
    files[1] = "../model-00002-of-00002.safetensors";
    write_index(dir, names, files, (int)n);
    assert_int_not_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    assert_non_null(strstr(err.msg, "plain file name"));

    g3_st_close(&src);
    free(ent);
    free(names);
    free(files);
    free(s1);
    free(s2);
}

static void test_other_dtypes_kept(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/mixed.safetensors", tu_tmpdir());
    uint8_t buf[64];
    for (int i = 0; i < 64; i++) buf[i] = (uint8_t)i;
    const ft_st_entry e[] = {
        {"w.bf16", "BF16", 2, {2, 4}, buf, 16},  {"w.f32", "F32", 1, {3}, buf, 12},
        {"w.f16", "F16", 3, {1, 2, 2}, buf, 8},  {"pos.ids", "I64", 2, {1, 3}, buf, 24},
        {"v.fp8", "F8_E4M3", 1, {5}, buf, 5},   {"v.u8", "U8", 0, {0}, buf, 1}, /* 0-d scalar */
        {"v.f4", "F4", 1, {6}, buf, 3},         /* unknown dtype: kept, size not checked */
        {"empty", "F32", 2, {0, 7}, buf, 0},
    };
    assert_true(ft_st_write(path, e, 8));
    g3_safetensors st;
    g3_error err = {0};
    assert_int_equal(g3_st_open_file(&st, path, &err), G3_OK);
    assert_int_equal(st.n_tensors, 8);
    assert_int_equal(g3_st_find(&st, "w.bf16")->dtype, G3_DTYPE_BF16);
    assert_int_equal(g3_st_find(&st, "w.f32")->dtype, G3_DTYPE_F32);
    assert_int_equal(g3_st_find(&st, "w.f16")->dtype, G3_DTYPE_F16);
    assert_int_equal(g3_st_find(&st, "w.f16")->n_dims, 3);
    const g3_st_tensor *t = g3_st_find(&st, "pos.ids");
    assert_true(t && t->dtype == -1 && strcmp(t->dtype_name, "I64") == 0 && t->nbytes == 24);
    t = g3_st_find(&st, "v.fp8");
    assert_true(t && t->dtype == -1 && strcmp(t->dtype_name, "F8_E4M3") == 0);
    t = g3_st_find(&st, "v.u8");
    assert_true(t && t->dtype == -1 && t->n_dims == 0 && t->nbytes == 1);
    t = g3_st_find(&st, "v.f4");
    assert_true(t && t->dtype == -1 && strcmp(t->dtype_name, "F4") == 0 && t->nbytes == 3);
    t = g3_st_find(&st, "empty");
    assert_true(t && t->nbytes == 0 && t->shape[0] == 0);
    assert_memory_equal(g3_st_find(&st, "w.f32")->data, buf, 12); /* each entry wrote buf from its start */
    assert_ptr_equal(g3_st_find(&st, "w.f32")->data, g3_st_find(&st, "w.bf16")->data + 16);
    g3_st_close(&st);
    unlink(path);
}

static void test_dir_errors(void **state) {
    (void)state;
    g3_safetensors st;
    g3_error err = {0};
    const char *dir = tu_tmpdir();
    assert_int_not_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    assert_non_null(strstr(err.msg, dir));
    assert_int_equal(g3_st_open_file(&st, "/nonexistent/model.safetensors", &err), G3_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/model.safetensors"));

    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    const char *bad[] = {"", "{", "[]", "{\"weight_map\": 3}", "{\"weight_map\": {}}", "{\"weight_map\": {\"a\": 5}}",
                         "{\"weight_map\": {\"a\": \"\"}}", "{\"weight_map\": {\"a\": \"nofile.safetensors\"}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_true(ft_write(path, bad[i], strlen(bad[i])));
        memset(&err, 0, sizeof err);
        assert_int_not_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
        assert_true(err.msg[0] != 0);
    }
    assert_non_null(strstr(err.msg, "nofile.safetensors"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_other_dtypes_kept),
        cmocka_unit_test(test_dir_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
