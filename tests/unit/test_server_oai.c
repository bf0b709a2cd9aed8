/* Tests of OpenAI request parsing: a table of bad bodies (each must give 400 and name the field), good bodies
 * parsed into the right values, and the error JSON shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/oai.h"
#include "testutil.h"

static g3_sampling defaults(void) {
    g3_sampling s;
    g3_sampling_default(&s);
    s.temperature = 1.0f;
    return s;
}

typedef struct bad_case {
    g3_oai_kind kind;
    const char *body;
    const char *param;   /* expected param ("" = null) */
    const char *needle;  /* expected in the message */
} bad_case;

static const bad_case k_bad[] = {
    {G3_OAI_CHAT, "{\"messages\": [", "", "not valid JSON"},
    {G3_OAI_CHAT, "", "", "not valid JSON"},
    {G3_OAI_CHAT, "{} {}", "", "unexpected data"},
    {G3_OAI_CHAT, "[1,2]", "", "must be a JSON object"},
    {G3_OAI_CHAT, "{}", "messages", "is required"},
    {G3_OAI_CHAT, "{\"messages\": []}", "messages", "at least one message"},
    {G3_OAI_CHAT, "{\"messages\": \"hi\"}", "messages", "must be an array"},
    {G3_OAI_CHAT, "{\"messages\": [1]}", "messages[0]", "must be an object"},
    {G3_OAI_CHAT, "{\"messages\": [{\"content\": \"x\"}]}", "messages[0].role", "must be a string"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "messages[0].role", "robot"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "messages[0].role", "not supported"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content", "is required"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content", "got a number"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
     "messages[0].content", "image_url"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
     "messages[0].content", ".text' must be a string"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": \"hot\"}", "temperature",
     "must be a number"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": 3}", "temperature",
     "[0, 2]"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_p\": 0}", "top_p", "(0, 1]"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0}", "max_tokens",
     "between 1"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2.5}", "max_tokens",
     "integer"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 99}", "n", "between 1 and 16"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": \"yes\"}", "stream",
     "boolean"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream_options\": {}}",
     "stream_options", "only allowed when"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": [\"\"]}", "stop",
     "must not be empty"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": 3}", "stop",
     "string or an array"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": {\"abc\": 1}}",
     "logit_bias", "not a token id"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": {\"5000\": 1}}",
     "logit_bias", "not a token id"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": {\"5\": 101}}",
     "logit_bias", "[-100, 100]"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 3}", "top_logprobs",
     "requires 'logprobs'"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}", "tools",
     "not supported"},
    {G3_OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_object\"}}",
     "response_format", "not supported"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokenz\": 5}", "max_tokenz",
     "Unrecognized request argument"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"model\": 7}", "model",
     "must be a string"},
    {G3_OAI_COMPLETION, "{}", "prompt", "is required"},
    {G3_OAI_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt", "batched prompts"},
    {G3_OAI_COMPLETION, "{\"prompt\": [1, 99999]}", "prompt", "out of range"},
    {G3_OAI_COMPLETION, "{\"prompt\": [1, \"x\"]}", "prompt", "integer token id"},
    {G3_OAI_COMPLETION, "{\"prompt\": []}", "prompt", "must not be empty"},
    {G3_OAI_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", "echo", "not supported"},
    {G3_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 50}", "logprobs", "between 0 and 20"},
    {G3_OAI_COMPLETION, "{\"prompt\": \"x\", \"messages\": []}", "messages", "Unrecognized"},
    {G3_OAI_TOKENIZE, "{}", "", "exactly one of"},
    {G3_OAI_DETOKENIZE, "{\"tokens\": [1, -1]}", "tokens", "out of range"},
    {G3_OAI_DETOKENIZE, "{\"tokens\": \"1 2\"}", "tokens", "array of token ids"},
    /* a NUL would cut the C string short: refused, with where it is */
    {G3_OAI_COMPLETION, "{\"prompt\": \"ab\\u0000cd\"}", "", "NUL character (\\u0000) in a string at byte 14"},
    {G3_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"\\u0000\"}]}", "", "NUL character"},
    {G3_OAI_TOKENIZE, "{\"prompt\": \"x\\\\\\u0000\"}", "", "NUL character"},
};

static void test_bad_bodies_are_rejected_with_the_field(void **st) {
    g3_sampling d = defaults();
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_case *c = &k_bad[i];
        g3_oai_request r;
        g3_oai_error e;
        memset(&e, 0, sizeof e);
        int rc = g3_oai_parse(c->kind, c->body, strlen(c->body), &d, 1024, &r, &e);
        if (rc != -1 || e.status != 400 || strcmp(e.param, c->param) != 0 || !strstr(e.message, c->needle)) {
            fprintf(stderr, "case %zu: body %s\n  rc %d status %d param '%s' message '%s'\n", i, c->body, rc, e.status,
                    e.param, e.message);
            fail();
        }
    }
    printf("%zu bad bodies rejected with status 400 and the field named\n", sizeof k_bad / sizeof k_bad[0]);
}

/* An escaped backslash before "u0000" is text, not a NUL: accepted, and the prompt keeps every character. */
static void test_escaped_backslash_is_not_a_nul(void **st) {
    (void)st;
    g3_sampling d = defaults();
    g3_oai_request r;
    g3_oai_error e;
    const char *body = "{\"prompt\": \"a\\\\u0000b\"}"; /* JSON text: "a\\u0000b" */
    assert_int_equal(g3_oai_parse(G3_OAI_COMPLETION, body, strlen(body), &d, 1024, &r, &e), 0);
    assert_non_null(r.prompt);
    assert_string_equal(r.prompt, "a\\u0000b");
    g3_oai_request_free(&r);
}

static void test_chat_request_parses(void **st) {
    const char *body = "{\"model\": \"m\", \"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"},"
                       "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \"},"
                       "{\"type\": \"text\", \"text\": \"there\"}]}, {\"role\": \"assistant\", \"content\": null}],"
                       "\"temperature\": 0.5, \"top_k\": -1, \"top_p\": 0.9, \"min_p\": 0.05, \"seed\": 7,"
                       "\"max_completion_tokens\": 12, \"n\": 3, \"stop\": [\"a\", \"bc\"], \"logprobs\": true,"
                       "\"top_logprobs\": 4, \"logit_bias\": {\"17\": -100, \"3\": 2.5}, \"stream\": true,"
                       "\"stream_options\": {\"include_usage\": true}, \"user\": \"u\", \"presence_penalty\": 1,"
                       "\"frequency_penalty\": -1, \"repetition_penalty\": 1.1, \"ignore_eos\": true}";
    g3_sampling d = defaults();
    g3_oai_request r;
    g3_oai_error e;
    assert_int_equal(g3_oai_parse(G3_OAI_CHAT, body, strlen(body), &d, 1024, &r, &e), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_msgs, 3);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[0].content, "Be brief.");
    assert_string_equal(r.msgs[1].role, "user");
    assert_string_equal(r.msgs[1].content, "Hi there");
    assert_string_equal(r.msgs[2].role, "assistant");
    assert_string_equal(r.msgs[2].content, "");
    assert_true(r.sampling.temperature == 0.5f);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.sampling.top_p == 0.9f);
    assert_true(r.sampling.min_p == 0.05f);
    assert_true(r.sampling.presence_penalty == 1.0f);
    assert_true(r.sampling.frequency_penalty == -1.0f);
    assert_true(r.sampling.repetition_penalty == 1.1f);
    assert_int_equal(r.sampling.seed, 7);
    assert_int_equal(r.seed_given, 1);
    assert_int_equal(r.max_tokens, 12);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.n_stops, 2);
    assert_string_equal(r.stops[1], "bc");
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 4);
    assert_int_equal(r.n_lb, 2);
    assert_int_equal(r.sampling.n_logit_bias, 2);
    assert_ptr_equal(r.sampling.logit_bias, r.lb);
    assert_int_equal(r.lb[0].token, 17);
    assert_true(r.lb[0].bias == -100.0f);
    assert_int_equal(r.stream, 1);
    assert_int_equal(r.include_usage, 1);
    assert_int_equal(r.ignore_eos, 1);
    g3_oai_request_free(&r);
}

static void test_defaults_fill_missing_fields(void **st) {
    const char *body = "{\"prompt\": \"hello\"}";
    g3_sampling d = defaults();
    d.top_k = 64;
    d.top_p = 0.95f;
    g3_oai_request r;
    g3_oai_error e;
    assert_int_equal(g3_oai_parse(G3_OAI_COMPLETION, body, strlen(body), &d, 1024, &r, &e), 0);
    assert_string_equal(r.prompt, "hello");
    assert_null(r.ids);
    assert_true(r.sampling.temperature == 1.0f);
    assert_int_equal(r.sampling.top_k, 64);
    assert_true(r.sampling.top_p == 0.95f);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.max_tokens, 0);
    assert_int_equal(r.seed_given, 0);
    assert_int_equal(r.stream, 0);
    assert_int_equal(r.logprobs, 0);
    g3_oai_request_free(&r);
}

static void test_completion_prompt_forms(void **st) {
    g3_sampling d = defaults();
    g3_oai_request r;
    g3_oai_error e;
    const char *ids = "{\"prompt\": [[2, 10, 11]], \"logprobs\": 0, \"stop\": \"x\"}";
    assert_int_equal(g3_oai_parse(G3_OAI_COMPLETION, ids, strlen(ids), &d, 1024, &r, &e), 0);
    assert_null(r.prompt);
    assert_int_equal(r.n_ids, 3);
    assert_int_equal(r.ids[2], 11);
    assert_int_equal(r.logprobs, 1); /* logprobs: 0 still asks for the chosen tokens' logprobs */
    assert_int_equal(r.top_logprobs, 0);
    assert_int_equal(r.n_stops, 1);
    g3_oai_request_free(&r);
    const char *one = "{\"prompt\": [\"just one\"]}";
    assert_int_equal(g3_oai_parse(G3_OAI_COMPLETION, one, strlen(one), &d, 1024, &r, &e), 0);
    assert_string_equal(r.prompt, "just one");
    g3_oai_request_free(&r);
}

static void test_error_json_shape(void **st) {
    g3_oai_error e;
    g3_oai_error_set(&e, 400, "invalid_request_error", NULL, "temperature", "bad \"value\" \xFF here");
    g3_buf b = {0};
    g3_oai_error_json(&e, &b);
    assert_string_equal(b.data, "{\"error\":{\"message\":\"bad \\\"value\\\" \xEF\xBF\xBD here\",\"type\":"
                                "\"invalid_request_error\",\"param\":\"temperature\",\"code\":null}}");
    g3_buf_free(&b);
    g3_oai_error_set(&e, 429, "requests", "rate_limit_exceeded", NULL, "busy");
    g3_oai_error_json(&e, &b);
    assert_string_equal(b.data,
                        "{\"error\":{\"message\":\"busy\",\"type\":\"requests\",\"param\":null,\"code\":"
                        "\"rate_limit_exceeded\"}}");
    g3_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_bodies_are_rejected_with_the_field),
        cmocka_unit_test(test_escaped_backslash_is_not_a_nul),
        cmocka_unit_test(test_chat_request_parses),
        cmocka_unit_test(test_defaults_fill_missing_fields),
        cmocka_unit_test(test_completion_prompt_forms),
        cmocka_unit_test(test_error_json_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
