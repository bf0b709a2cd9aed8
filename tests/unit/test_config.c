/* Configuration and model binding: both config.json layouts, transformers' defaults for the nested text_config,
 * GGUF metadata with and without our extra keys, recognition of the released sizes, and errors that name the
 * tensor and both shapes when a file disagrees with its config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gemma3.h"
#include "model/config.h"
#include "model/model.h"
#include "testutil.h"

static void test_causal_lm_json(void **state) {
    (void)state;
    const char *json = "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"hidden_size\":1152,"
                       "\"intermediate_size\":6912,\"num_hidden_layers\":26,\"num_attention_heads\":4,"
                       "\"num_key_value_heads\":1,\"head_dim\":256,\"query_pre_attn_scalar\":256,\"sliding_window\":512,"
                       "\"sliding_window_pattern\":6,\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,"
                       "\"rope_scaling\":null,\"vocab_size\":262144,\"max_position_embeddings\":32768,"
                       "\"eos_token_id\":[1,106],\"final_logit_softcapping\":null}";
    g3_config c;
    g3_error err = {0};
    int mm = -1;
    assert_int_equal(g3_config_from_json(&c, json, "x", &mm, &err), G3_OK);
    assert_int_equal(mm, 0);
    assert_string_equal(c.size_name, "1b");
    assert_int_equal(c.layer_global[5], 1);
    assert_int_equal(c.layer_global[4], 0);
    assert_int_equal(c.layer_global[11], 1);
    assert_int_equal(c.eos_id, 1);
    assert_true(c.rope_scale_global == 1.0f);
    assert_true(c.final_softcap == 0);
}

/* A 27B-style multimodal config: text settings nested, many fields left to the defaults. */
static void test_conditional_generation_json(void **state) {
    (void)state;
    const char *json = "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"model_type\":\"gemma3\","
                       "\"text_config\":{\"hidden_size\":5376,\"intermediate_size\":21504,\"model_type\":\"gemma3_text\","
                       "\"num_attention_heads\":32,\"num_hidden_layers\":62,\"num_key_value_heads\":16,\"head_dim\":128,"
                       "\"query_pre_attn_scalar\":168,\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"},"
                       "\"sliding_window\":1024},\"vision_config\":{\"hidden_size\":1152}}";
    g3_config c;
    g3_error err = {0};
    int mm = 0;
    assert_int_equal(g3_config_from_json(&c, json, "x", &mm, &err), G3_OK);
    assert_int_equal(mm, 1);
    assert_string_equal(c.size_name, "27b");
    assert_int_equal(c.vocab, 262208); /* transformers' default: the padded table */
    assert_true(c.query_pre_attn_scalar == 168.0f);
    assert_true(c.rope_scale_global == 8.0f);
    assert_true(c.rope_base_local == 10000.0f);
    assert_int_equal(c.sliding_pattern, 6);
}

static void test_layer_types_and_errors(void **state) {
    (void)state;
    g3_config c;
    g3_error err = {0};
    int mm;
    const char *lt = "{\"model_type\":\"gemma3_text\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":3,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16,\"layer_types\":"
                     "[\"full_attention\",\"sliding_attention\",\"full_attention\"],\"rope_parameters\":{\"full_attention\":"
                     "{\"rope_type\":\"linear\",\"factor\":4.0,\"rope_theta\":500000.0},\"sliding_attention\":"
                     "{\"rope_type\":\"default\",\"rope_theta\":20000.0}}}";
    assert_int_equal(g3_config_from_json(&c, lt, "x", &mm, &err), G3_OK);
    assert_int_equal(c.layer_global[0], 1);
    assert_int_equal(c.layer_global[1], 0);
    assert_int_equal(c.layer_global[2], 1);
    assert_true(c.rope_scale_global == 4.0f && c.rope_base_global == 500000.0f && c.rope_base_local == 20000.0f);
    const char *bad_type = "{\"model_type\":\"gemma3_text\",\"hidden_size\":\"big\"}";
    assert_int_equal(g3_config_from_json(&c, bad_type, "cfg.json", &mm, &err), G3_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "hidden_size"));
    const char *bad_heads = "{\"model_type\":\"gemma3_text\",\"num_attention_heads\":6,\"num_key_value_heads\":4}";
    assert_int_equal(g3_config_from_json(&c, bad_heads, "cfg.json", &mm, &err), G3_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "kv head"));
    assert_int_equal(g3_config_from_json(&c, "{not json", "cfg.json", &mm, &err), G3_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "cfg.json"));
    const char *llama = "{\"model_type\":\"llama\"}";
    assert_int_equal(g3_config_from_json(&c, llama, "cfg.json", &mm, &err), G3_ERR_UNSUPPORTED);
}

static void test_presets(void **state) {
    (void)state;
    const char *sizes[] = {"270m", "1b", "4b", "12b", "27b"};
    for (int i = 0; i < 5; i++) {
        g3_config c;
        g3_error err = {0};
        assert_int_equal(g3_config_preset(&c, sizes[i], &err), G3_OK);
        assert_string_equal(c.size_name, sizes[i]);
    }
    g3_config c;
    g3_error err = {0};
    assert_int_equal(g3_config_preset(&c, "3b", &err), G3_ERR_ARG);
}

/* GGUF: the fixture's keys give the same config as its config.json. */
static void test_gguf_matches_json(void **state) {
    (void)state;
    const char *dir = tu_fixture("tiny-gqa");
    if (!dir) skip();
    char path[1200];
    snprintf(path, sizeof path, "%.1000s/model-bf16.gguf", dir);
    g3_model *a, *b;
    g3_error err = {0};
    assert_int_equal(g3_model_load(dir, NULL, &a, &err), G3_OK);
    assert_int_equal(g3_model_load(path, NULL, &b, &err), G3_OK);
    const g3_config *x = g3_model_config(a), *y = g3_model_config(b);
    assert_int_equal(x->n_layers, y->n_layers);
    assert_memory_equal(x->layer_global, y->layer_global, (size_t)x->n_layers);
    assert_true(x->query_pre_attn_scalar - y->query_pre_attn_scalar < 1e-3f &&
                y->query_pre_attn_scalar - x->query_pre_attn_scalar < 1e-3f);
    assert_true(x->rope_scale_global == y->rope_scale_global);
    assert_int_equal(x->sliding_window, y->sliding_window);
    assert_int_equal(x->vocab, y->vocab);
    /* norms: HF holds w, GGUF 1+w; both end as 1+w */
    assert_true(a->layers[1].q_norm[3] == b->layers[1].q_norm[3]);
    assert_true(a->final_norm[7] == b->final_norm[7]);
    g3_model_free(a);
    g3_model_free(b);
}

/* A config that disagrees with the weights: the error names the tensor and both shapes. */
static void test_shape_mismatch_named(void **state) {
    (void)state;
    const char *dir = tu_fixture("tiny-gqa");
    if (!dir) skip();
    const char *tmp = tu_tmpdir();
    char src[1200], dst[1200];
    snprintf(src, sizeof src, "%.1000s/config.json", dir);
    char *cfg = tu_read_file(src, NULL);
    assert_non_null(cfg);
    char *p = strstr(cfg, "\"intermediate_size\": 256");
    assert_non_null(p);
    memcpy(p, "\"intermediate_size\": 128", 24);
    snprintf(dst, sizeof dst, "%.1000s/config.json", tmp);
    FILE *f = fopen(dst, "w");
    fputs(cfg, f);
    fclose(f);
    free(cfg);
    snprintf(src, sizeof src, "%.1000s/model.safetensors", dir);
    snprintf(dst, sizeof dst, "%.1000s/model.safetensors", tmp);
    assert_int_equal(symlink(src, dst), 0);
    g3_model *m = NULL;
    g3_error err = {0};
    assert_int_equal(g3_model_load(tmp, NULL, &m, &err), G3_ERR_FORMAT);
    printf("  error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "model.layers.0.mlp.gate_proj.weight"));
    assert_non_null(strstr(err.msg, "[256, 64]"));
    assert_non_null(strstr(err.msg, "[128, 64]"));
    assert_null(m);
}

static void test_missing_model(void **state) {
    (void)state;
    g3_model *m = NULL;
    g3_error err = {0};
    assert_int_equal(g3_model_load("/nonexistent/model.gguf", NULL, &m, &err), G3_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/model.gguf"));
    const char *tmp = tu_tmpdir();
    assert_int_equal(g3_model_load(tmp, NULL, &m, &err), G3_ERR_IO); /* folder without config.json */
    assert_non_null(strstr(err.msg, "config.json"));
}

/* The q4_k_m random mix puts Q6_K where llama.cpp's quantizer does: the (tied) embedding, and attn_v / ffn_down in the
 * first and last eighth of the layers and every third between; everything else Q4_K. 4B shape, 8 layers: Q6_K in
 * layers 0, 3, 6, 7. */
static void test_random_mix(void **state) {
    (void)state;
    g3_model *m = NULL;
    g3_error err = {0};
    if (g3_model_random_mix("4b", "q4_k_m", 3, 8, &m, &err) != G3_OK) fail_msg("%s", err.msg);
    assert_int_equal(m->embed.type, G3_DTYPE_Q6_K);
    size_t bytes = m->embed.nbytes;
    for (int l = 0; l < 8; l++) {
        const g3_layer_weights *L = &m->layers[l];
        const uint32_t hi = l == 0 || l == 3 || l == 6 || l == 7 ? G3_DTYPE_Q6_K : G3_DTYPE_Q4_K;
        assert_int_equal(L->wv.type, hi);
        assert_int_equal(L->w_down.type, hi);
        const g3_weight *q4[] = {&L->wq, &L->wk, &L->wo, &L->w_gate, &L->w_up};
        for (int i = 0; i < 5; i++) assert_int_equal(q4[i]->type, G3_DTYPE_Q4_K);
        const g3_weight *all[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) bytes += all[i]->nbytes;
    }
    assert_int_equal(bytes, m->weight_bytes); /* the buffer holds exactly the matrices */
    g3_model_free(m);
    /* q5_k_m: Q5_K with the same Q6_K tensors */
    if (g3_model_random_mix("4b", "q5_k_m", 3, 8, &m, &err) != G3_OK) fail_msg("%s", err.msg);
    assert_int_equal(m->layers[0].wv.type, G3_DTYPE_Q6_K);
    assert_int_equal(m->layers[1].wv.type, G3_DTYPE_Q5_K);
    assert_int_equal(m->layers[1].w_gate.type, G3_DTYPE_Q5_K);
    g3_model_free(m);
    /* 1B rows of 1152 values are no whole K-quant blocks: llama.cpp's fallbacks there (Q4_K -> Q5_0, Q6_K -> Q8_0,
     * Q5_K -> Q5_1); o (1024 wide) and down (6912) keep their K-quants */
    if (g3_model_random_mix("1b", "q4_k_m", 3, 2, &m, &err) != G3_OK) fail_msg("%s", err.msg);
    assert_int_equal(m->embed.type, G3_DTYPE_Q8_0);
    assert_int_equal(m->layers[0].wq.type, G3_DTYPE_Q5_0);
    assert_int_equal(m->layers[0].wv.type, G3_DTYPE_Q5_0);
    assert_int_equal(m->layers[1].wv.type, G3_DTYPE_Q8_0); /* the last eighth: Q6_K's fallback */
    assert_int_equal(m->layers[0].w_up.type, G3_DTYPE_Q5_0);
    assert_int_equal(m->layers[0].wo.type, G3_DTYPE_Q4_K);
    assert_int_equal(m->layers[0].w_down.type, G3_DTYPE_Q4_K);
    assert_int_equal(m->layers[1].w_down.type, G3_DTYPE_Q6_K);
    g3_model_free(m);
    if (g3_model_random_mix("1b", "q5_k_m", 3, 2, &m, &err) != G3_OK) fail_msg("%s", err.msg);
    assert_int_equal(m->layers[1].wk.type, G3_DTYPE_Q5_1);
    assert_int_equal(m->layers[1].wo.type, G3_DTYPE_Q5_K);
    g3_model_free(m);
    assert_int_equal(g3_model_random_mix("1b", "q3_k_m", 3, 2, &m, &err), G3_ERR_ARG);
    assert_null(m);
    assert_non_null(strstr(err.msg, "q3_k_m"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_causal_lm_json),        cmocka_unit_test(test_conditional_generation_json),
        cmocka_unit_test(test_layer_types_and_errors), cmocka_unit_test(test_presets),
        cmocka_unit_test(test_gguf_matches_json),      cmocka_unit_test(test_shape_mismatch_named),
        cmocka_unit_test(test_missing_model),          cmocka_unit_test(test_random_mix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
