/* GGUF reader and writer: the tiny-gqa fixture files (known facts, cross-checked against model.safetensors),
 * a round trip of every kv type and several tensor types through the writer, a byte-exact rewrite of a
 * fixture file, the typed getters, and the writer's own error reporting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "format_testutil.h"
#include "testutil.h"

static const char *fixture_file(const char *name) {
    static char path[1200];
    const char *dir = tu_fixture("tiny-gqa");
    if (!dir) return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

static void check_fixture(const char *file, uint32_t embd_type) {
    const char *path = fixture_file(file);
    if (!path) {
        print_message("tiny-gqa fixture not found: skipped\n");
        skip();
    }
    g3_gguf g;
    g3_error err = {0};
    assert_int_equal(g3_gguf_open(&g, path, &err), G3_OK);
    assert_int_equal(g.version, 3);
    assert_int_equal(g.alignment, 32);
    assert_int_equal(g.n_tensors, 80); /* 6 layers x 13 + token_embd + output_norm (no output: tied) */
    char s[64];
    assert_true(g3_gguf_get_str(&g, "general.architecture", s, sizeof s));
    assert_string_equal(s, "gemma3");
    int64_t v;
    assert_true(g3_gguf_get_int(&g, "gemma3.block_count", &v));
    assert_int_equal(v, 6);
    assert_true(g3_gguf_get_int(&g, "gemma3.attention.head_count_kv", &v));
    assert_int_equal(v, 2);
    assert_true(g3_gguf_get_int(&g, "tokenizer.ggml.eos_token_id", &v));
    assert_int_equal(v, 1);
    double f;
    assert_true(g3_gguf_get_float(&g, "gemma3.rope.freq_base", &f));
    assert_true(f == 1e6);
    assert_true(g3_gguf_get_float(&g, "gemma3.attention.layer_norm_rms_epsilon", &f));
    assert_true(f > 0.99e-6 && f < 1.01e-6);
    assert_false(g3_gguf_get_int(&g, "general.architecture", &v)); /* a string is not an int */
    assert_false(g3_gguf_get_str(&g, "no.such.key", s, sizeof s));

    const g3_gguf_kv *tok = g3_gguf_find(&g, "tokenizer.ggml.tokens");
    assert_non_null(tok);
    assert_int_equal(tok->type, G3_GGUF_ARRAY);
    assert_int_equal(tok->arr_type, G3_GGUF_STRING);
    assert_int_equal(tok->arr_n, 512);
    g3_gguf_str t0 = g3_gguf_arr_str(tok, 0), t2 = g3_gguf_arr_str(tok, 2), t107 = g3_gguf_arr_str(tok, 107);
    assert_true(t0.len == 5 && memcmp(t0.s, "<pad>", 5) == 0);
    assert_true(t2.len == 5 && memcmp(t2.s, "<bos>", 5) == 0);
    assert_true(t107.len == 6 && memcmp(t107.s, "<0x00>", 6) == 0);
    assert_null(g3_gguf_arr_str(tok, 512).s);
    const g3_gguf_kv *sc = g3_gguf_find(&g, "tokenizer.ggml.scores");
    assert_non_null(sc);
    assert_int_equal(sc->arr_type, G3_GGUF_F32);
    assert_int_equal(sc->arr_n, 512);

    const g3_gguf_tensor *q = g3_gguf_find_tensor(&g, "blk.0.attn_q.weight");
    assert_non_null(q);
    assert_int_equal(q->n_dims, 2);
    assert_int_equal(q->ne[0], 64);
    assert_int_equal(q->ne[1], 64);
    const g3_gguf_tensor *k = g3_gguf_find_tensor(&g, "blk.5.attn_k.weight");
    assert_non_null(k);
    assert_int_equal(k->ne[0], 64);
    assert_int_equal(k->ne[1], 32);
    const g3_gguf_tensor *e = g3_gguf_find_tensor(&g, "token_embd.weight");
    assert_non_null(e);
    assert_int_equal(e->type, embd_type);
    assert_int_equal(e->ne[0], 64);
    assert_int_equal(e->ne[1], 512);
    const g3_gguf_tensor *on = g3_gguf_find_tensor(&g, "output_norm.weight");
    assert_non_null(on);
    assert_int_equal(on->type, 0); /* norms stay F32 */
    assert_null(g3_gguf_find_tensor(&g, "output.weight"));
    assert_null(g3_gguf_find_tensor(&g, "blk.6.attn_q.weight"));
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const g3_gguf_tensor *t = &g.tensors[i];
        assert_ptr_equal(g3_gguf_find_tensor(&g, t->name), t);
        assert_true(t->data >= g.map.data + g.data_offset && t->data + t->nbytes <= g.map.data + g.map.size);
        assert_int_equal((uintptr_t)(t->data - g.map.data) % 32, 0);
    }
    print_message("%s: %llu kv, %llu tensors, data at byte %llu\n", file, (unsigned long long)g.n_kv,
                  (unsigned long long)g.n_tensors, (unsigned long long)g.data_offset);
    g3_gguf_close(&g);
    g3_gguf_close(&g); /* idempotent */
}

static void test_fixture_f32(void **state) { (void)state; check_fixture("model-f32.gguf", 0); }
static void test_fixture_bf16(void **state) { (void)state; check_fixture("model-bf16.gguf", 30); }
static void test_fixture_q8_0(void **state) { (void)state; check_fixture("model-q8_0.gguf", 8); }

/* bf16 GGUF projections are the safetensors bytes unchanged (no permutation for Gemma). */
static void test_bf16_matches_safetensors(void **state) {
    (void)state;
    const char *dir = tu_fixture("tiny-gqa");
    if (!dir) skip();
    char path[1200];
    snprintf(path, sizeof path, "%s/model-bf16.gguf", dir);
    g3_gguf g;
    g3_safetensors st;
    g3_error err = {0};
    assert_int_equal(g3_gguf_open(&g, path, &err), G3_OK);
    assert_int_equal(g3_st_open_dir(&st, dir, &err), G3_OK);
    static const char *pairs[][2] = {{"token_embd.weight", "model.embed_tokens.weight"},
                                     {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
                                     {"blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"},
                                     {"blk.5.ffn_down.weight", "model.layers.5.mlp.down_proj.weight"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const g3_gguf_tensor *a = g3_gguf_find_tensor(&g, pairs[i][0]);
        const g3_st_tensor *b = g3_st_find(&st, pairs[i][1]);
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_int_equal(a->ne[0], b->shape[1]); /* GGUF ne is innermost-first */
        assert_int_equal(a->ne[1], b->shape[0]);
        assert_memory_equal(a->data, b->data, a->nbytes);
    }
    g3_st_close(&st);
    g3_gguf_close(&g);
}

/* ---- round trip ---------------------------------------------------------------------------------------------- */
static g3_status fill_ramp(void *ctx, void *dst, size_t n, g3_error *err) {
    (void)err;
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)(i * 7 + *(int *)ctx);
    return G3_OK;
}

static void test_roundtrip_all_types(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/rt.gguf", tu_tmpdir());
    g3_gguf_writer *w;
    g3_error err = {0};
    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    /* scalars of the types that have no dedicated setter go through g3_gguf_w_kv */
    struct { const char *key; g3_gguf_type type; int64_t i; uint64_t u; } sc[] = {
        {"t.u8", G3_GGUF_U8, 0, 250},  {"t.i8", G3_GGUF_I8, -100, 0},   {"t.u16", G3_GGUF_U16, 0, 65000},
        {"t.i16", G3_GGUF_I16, -30000, 0}, {"t.u32b", G3_GGUF_U32, 0, 4000000000u},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        g3_gguf_kv kv = {.key = {sc[i].key, strlen(sc[i].key)}, .type = sc[i].type};
        if (sc[i].type == G3_GGUF_I8 || sc[i].type == G3_GGUF_I16) kv.v.i = sc[i].i;
        else kv.v.u = sc[i].u;
        g3_gguf_w_kv(w, &kv);
    }
    g3_gguf_w_u32(w, "t.u32", 123456);
    g3_gguf_w_i32(w, "t.i32", -123456);
    g3_gguf_w_f32(w, "t.f32", 0.5f);
    g3_gguf_w_bool(w, "t.bool", 1);
    g3_gguf_w_str(w, "t.str", "hello, gguf");
    g3_gguf_w_str(w, "t.empty", "");
    g3_gguf_w_u64(w, "t.u64", 0xfedcba9876543210ull);
    g3_gguf_w_i64(w, "t.i64", -1234567890123ll);
    g3_gguf_w_f64(w, "t.f64", 3.141592653589793);
    const char *strs[] = {"<pad>", "", "\xe2\x96\x81hello", "z"};
    g3_gguf_w_arr_str(w, "t.arr_str", strs, 4);
    const float fa[] = {1.5f, -2.25f, 1e30f};
    g3_gguf_w_arr_f32(w, "t.arr_f32", fa, 3);
    const int32_t ia[] = {-1, 0, 2147483647};
    g3_gguf_w_arr_i32(w, "t.arr_i32", ia, 3);
    const uint8_t ba[] = {0, 1, 1, 0};
    g3_gguf_w_arr(w, "t.arr_bool", G3_GGUF_BOOL, ba, 4);
    const double da[] = {-0.0, 1e-300};
    g3_gguf_w_arr(w, "t.arr_f64", G3_GGUF_F64, da, 2);
    g3_gguf_w_arr(w, "t.arr_empty", G3_GGUF_U16, NULL, 0);
    g3_gguf_w_u32(w, "t.replaced", 1);
    g3_gguf_w_u32(w, "t.replaced", 2); /* same key again: replaces */

    float f32[12];
    for (int i = 0; i < 12; i++) f32[i] = (float)i - 5.5f;
    uint16_t f16[96];
    for (int i = 0; i < 96; i++) f16[i] = (uint16_t)(i * 1000);
    uint8_t q8[2 * 34];
    for (int i = 0; i < 68; i++) q8[i] = (uint8_t)(255 - i);
    int seed = 3;
    g3_gguf_w_tensor(w, "a.f32", 0, 2, (const int64_t[]){3, 4}, f32, sizeof f32);
    g3_gguf_w_tensor(w, "b.bf16", 30, 3, (const int64_t[]){4, 6, 4}, f16, sizeof f16);
    g3_gguf_w_tensor(w, "c.q8_0", 8, 2, (const int64_t[]){32, 2}, q8, sizeof q8);
    g3_gguf_w_tensor_fill(w, "d.fill", 1, 1, (const int64_t[]){50}, 100, fill_ramp, &seed);
    assert_int_equal(g3_gguf_writer_write(w, path, &err), G3_OK);
    g3_gguf_writer_free(w);

    g3_gguf g;
    assert_int_equal(g3_gguf_open(&g, path, &err), G3_OK);
    assert_int_equal(g.version, 3);
    assert_int_equal(g.n_kv, 21);
    assert_int_equal(g.n_tensors, 4);
    int64_t v;
    double d;
    assert_true(g3_gguf_get_int(&g, "t.u8", &v) && v == 250 && g3_gguf_find(&g, "t.u8")->type == G3_GGUF_U8);
    assert_true(g3_gguf_get_int(&g, "t.i8", &v) && v == -100 && g3_gguf_find(&g, "t.i8")->type == G3_GGUF_I8);
    assert_true(g3_gguf_get_int(&g, "t.u16", &v) && v == 65000);
    assert_true(g3_gguf_get_int(&g, "t.i16", &v) && v == -30000);
    assert_true(g3_gguf_get_int(&g, "t.u32b", &v) && v == 4000000000ll);
    assert_true(g3_gguf_get_int(&g, "t.u32", &v) && v == 123456);
    assert_true(g3_gguf_get_int(&g, "t.i32", &v) && v == -123456);
    assert_true(g3_gguf_get_float(&g, "t.f32", &d) && d == 0.5);
    assert_true(g3_gguf_get_int(&g, "t.bool", &v) && v == 1 && g3_gguf_find(&g, "t.bool")->type == G3_GGUF_BOOL);
    assert_int_equal(g3_gguf_find(&g, "t.u64")->v.u, 0xfedcba9876543210ull);
    assert_false(g3_gguf_get_int(&g, "t.u64", &v)); /* does not fit int64 */
    assert_true(g3_gguf_get_int(&g, "t.i64", &v) && v == -1234567890123ll);
    assert_true(g3_gguf_get_float(&g, "t.f64", &d) && d == 3.141592653589793);
    assert_true(g3_gguf_get_float(&g, "t.i32", &d) && d == -123456.0);
    assert_true(g3_gguf_get_int(&g, "t.replaced", &v) && v == 2);
    char s[64];
    assert_true(g3_gguf_get_str(&g, "t.str", s, sizeof s));
    assert_string_equal(s, "hello, gguf");
    assert_true(g3_gguf_get_str(&g, "t.str", s, 6)); /* truncated to cap */
    assert_string_equal(s, "hello");
    assert_true(g3_gguf_get_str(&g, "t.empty", s, sizeof s));
    assert_string_equal(s, "");
    const g3_gguf_kv *as = g3_gguf_find(&g, "t.arr_str");
    assert_true(as && as->arr_type == G3_GGUF_STRING && as->arr_n == 4);
    for (int i = 0; i < 4; i++) {
        g3_gguf_str x = g3_gguf_arr_str(as, (uint64_t)i);
        assert_int_equal(x.len, strlen(strs[i]));
        assert_memory_equal(x.s, strs[i], x.len);
    }
    const g3_gguf_kv *af = g3_gguf_find(&g, "t.arr_f32");
    assert_true(af && af->arr_type == G3_GGUF_F32 && af->arr_n == 3);
    assert_memory_equal(af->arr_data, fa, sizeof fa);
    const g3_gguf_kv *ai = g3_gguf_find(&g, "t.arr_i32");
    assert_true(ai && ai->arr_type == G3_GGUF_I32 && ai->arr_n == 3);
    assert_memory_equal(ai->arr_data, ia, sizeof ia);
    const g3_gguf_kv *ab = g3_gguf_find(&g, "t.arr_bool");
    assert_true(ab && ab->arr_type == G3_GGUF_BOOL && ab->arr_n == 4);
    assert_memory_equal(ab->arr_data, ba, sizeof ba);
    const g3_gguf_kv *ad = g3_gguf_find(&g, "t.arr_f64");
    assert_true(ad && ad->arr_type == G3_GGUF_F64 && ad->arr_n == 2);
    assert_memory_equal(ad->arr_data, da, sizeof da);
    const g3_gguf_kv *ae = g3_gguf_find(&g, "t.arr_empty");
    assert_true(ae && ae->arr_type == G3_GGUF_U16 && ae->arr_n == 0);
    assert_null(g3_gguf_arr_str(af, 0).s); /* not a string array */

    const g3_gguf_tensor *t = g3_gguf_find_tensor(&g, "a.f32");
    assert_true(t && t->type == 0 && t->n_dims == 2 && t->ne[0] == 3 && t->ne[1] == 4 && t->nbytes == sizeof f32);
    assert_memory_equal(t->data, f32, sizeof f32);
    t = g3_gguf_find_tensor(&g, "b.bf16");
    assert_true(t && t->type == 30 && t->n_dims == 3 && t->ne[2] == 4 && t->ne[3] == 1);
    assert_memory_equal(t->data, f16, sizeof f16);
    t = g3_gguf_find_tensor(&g, "c.q8_0");
    assert_true(t && t->type == 8 && t->nbytes == 68);
    assert_memory_equal(t->data, q8, sizeof q8);
    t = g3_gguf_find_tensor(&g, "d.fill");
    assert_true(t && t->type == 1 && t->nbytes == 100);
    for (int i = 0; i < 100; i++) assert_int_equal(t->data[i], (uint8_t)(i * 7 + 3));
    for (uint64_t i = 0; i < g.n_tensors; i++) assert_int_equal(g.tensors[i].offset % 32, 0);
    assert_int_equal(g.data_offset % 32, 0);
    g3_gguf_close(&g);
    unlink(path);
}

/* Reading a converter-made file and writing every kv and tensor back gives the same bytes. */
static void test_rewrite_fixture_byte_exact(void **state) {
    (void)state;
    const char *src = fixture_file("model-q8_0.gguf");
    if (!src) skip();
    g3_gguf g;
    g3_error err = {0};
    assert_int_equal(g3_gguf_open(&g, src, &err), G3_OK);
    g3_gguf_writer *w;
    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    for (uint64_t i = 0; i < g.n_kv; i++) g3_gguf_w_kv(w, &g.kv[i]);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const g3_gguf_tensor *t = &g.tensors[i];
        g3_gguf_w_tensor(w, t->name, t->type, (int)t->n_dims, t->ne, t->data, t->nbytes);
    }
    char out[512];
    snprintf(out, sizeof out, "%s/copy.gguf", tu_tmpdir());
    assert_int_equal(g3_gguf_writer_write(w, out, &err), G3_OK);
    g3_gguf_writer_free(w);
    size_t na, nb;
    char *a = tu_read_file(src, &na), *b = tu_read_file(out, &nb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    print_message("rewrote %s: %zu bytes, identical\n", src, nb);
    free(a);
    free(b);
    g3_gguf_close(&g);
    unlink(out);
}

static g3_status fill_fail(void *ctx, void *dst, size_t n, g3_error *err) {
    (void)ctx; (void)dst; (void)n;
    return g3_fail(err, G3_ERR_IO, "source went away");
}

static void expect_write_error(g3_gguf_writer *w, const char *needle) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.gguf", tu_tmpdir());
    g3_error err = {0};
    assert_int_not_equal(g3_gguf_writer_write(w, path, &err), G3_OK);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    assert_int_not_equal(access(path, F_OK), 0); /* nothing left behind */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
    g3_gguf_writer_free(w);
}

static void test_writer_errors(void **state) {
    (void)state;
    g3_error err = {0};
    g3_gguf_writer *w;
    uint8_t buf[256] = {0};
    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    g3_gguf_w_tensor(w, "x", 0, 1, (const int64_t[]){4}, buf, 16);
    g3_gguf_w_tensor(w, "x", 0, 1, (const int64_t[]){4}, buf, 16);
    expect_write_error(w, "duplicate tensor name 'x'");

    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    g3_gguf_w_tensor(w, "y", 8, 1, (const int64_t[]){32}, buf, 32); /* Q8_0 of 32 needs 34 bytes */
    expect_write_error(w, "need 34");

    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    g3_gguf_w_tensor(w, "z", 4, 1, (const int64_t[]){32}, buf, 32); /* type 4 was removed from ggml */
    expect_write_error(w, "'z'");

    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    g3_gguf_w_tensor_fill(w, "f", 0, 1, (const int64_t[]){4}, 16, fill_fail, NULL);
    expect_write_error(w, "source went away");

    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    g3_gguf_w_u32(w, "general.alignment", 48);
    expect_write_error(w, "power of two");
}

/* general.alignment set by the caller is honoured by the writer and the reader. */
static void test_writer_alignment_64(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/a64.gguf", tu_tmpdir());
    g3_error err = {0};
    g3_gguf_writer *w;
    uint8_t buf[40] = {1, 2, 3};
    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    g3_gguf_w_u32(w, "general.alignment", 64);
    g3_gguf_w_tensor(w, "p", 0, 1, (const int64_t[]){10}, buf, 40);
    g3_gguf_w_tensor(w, "q", 0, 1, (const int64_t[]){10}, buf, 40);
    assert_int_equal(g3_gguf_writer_write(w, path, &err), G3_OK);
    g3_gguf_writer_free(w);
    g3_gguf g;
    assert_int_equal(g3_gguf_open(&g, path, &err), G3_OK);
    assert_int_equal(g.alignment, 64);
    assert_int_equal(g.data_offset % 64, 0);
    assert_int_equal(g3_gguf_find_tensor(&g, "q")->offset, 64);
    g3_gguf_close(&g);
    unlink(path);
}

static void test_missing_file(void **state) {
    (void)state;
    g3_gguf g;
    g3_error err = {0};
    assert_int_equal(g3_gguf_open(&g, "/nonexistent/x.gguf", &err), G3_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/x.gguf"));
    g3_gguf_close(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_f32),
        cmocka_unit_test(test_fixture_bf16),
        cmocka_unit_test(test_fixture_q8_0),
        cmocka_unit_test(test_bf16_matches_safetensors),
        cmocka_unit_test(test_roundtrip_all_types),
        cmocka_unit_test(test_rewrite_fixture_byte_exact),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_writer_alignment_64),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
