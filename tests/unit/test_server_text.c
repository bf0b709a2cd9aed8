/* Tests of the server's text stage: UTF-8 repair across token boundaries and stop strings with hold-back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/textstream.h"
#include "testutil.h"

/* Feeds the pieces one by one; returns everything released (flushing at the end unless a stop matched). */
static char *run(const char *const *stops, int n_stops, const char *const *pieces, int n, int *stopped_at) {
    g3_textstream t;
    g3_textstream_init(&t, stops, n_stops);
    g3_buf out = {0};
    g3_buf_puts(&out, "");
    *stopped_at = -1;
    for (int i = 0; i < n; i++) {
        if (g3_textstream_push(&t, pieces[i], strlen(pieces[i]), &out)) {
            *stopped_at = i;
            break;
        }
    }
    g3_textstream_flush(&t, &out);
    g3_textstream_deinit(&t);
    return out.data;
}

static void test_plain_text_passes_through(void **st) {
    const char *p[] = {"Hello", ",", " world"};
    int at;
    char *s = run(NULL, 0, p, 3, &at);
    assert_string_equal(s, "Hello, world");
    assert_int_equal(at, -1);
    free(s);
}

static void test_utf8_split_across_tokens_is_held(void **st) {
    /* "é" = C3 A9 and "€" = E2 82 AC, split over byte tokens */
    g3_textstream t;
    g3_textstream_init(&t, NULL, 0);
    g3_buf out = {0};
    g3_buf_puts(&out, "");
    g3_textstream_push(&t, "caf\xC3", 4, &out);
    assert_string_equal(out.data, "caf"); /* the lead byte waits */
    g3_textstream_push(&t, "\xA9", 1, &out);
    assert_string_equal(out.data, "caf\xC3\xA9");
    g3_textstream_push(&t, "\xE2", 1, &out);
    g3_textstream_push(&t, "\x82", 1, &out);
    assert_string_equal(out.data, "caf\xC3\xA9");
    g3_textstream_push(&t, "\xAC!", 2, &out);
    assert_string_equal(out.data, "caf\xC3\xA9\xE2\x82\xAC!");
    g3_textstream_deinit(&t);
    g3_buf_free(&out);
}

static void test_invalid_bytes_become_replacement(void **st) {
    const char *p[] = {"a\xFF", "b\xC3", "(", "\xED\xA0\x80", "z\xE2\x82"};
    int at;
    char *s = run(NULL, 0, p, 5, &at);
    /* FF invalid; C3 followed by '(' invalid; ED A0 80 is a surrogate (3 bad bytes); E2 82 incomplete at end */
    assert_string_equal(s, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD");
    free(s);
}

static void test_stop_string_inside_one_token(void **st) {
    const char *stops[] = {"END"};
    const char *p[] = {"abc", "xENDyz", "more"};
    int at;
    char *s = run(stops, 1, p, 3, &at);
    assert_string_equal(s, "abcx");
    assert_int_equal(at, 1);
    free(s);
}

static void test_stop_string_across_tokens_is_held_back(void **st) {
    const char *stops[] = {"</stop>"};
    g3_textstream t;
    g3_textstream_init(&t, stops, 1);
    g3_buf out = {0};
    g3_buf_puts(&out, "");
    assert_int_equal(g3_textstream_push(&t, "hi </", 5, &out), 0);
    assert_string_equal(out.data, "hi "); /* "</" could start the stop string */
    assert_int_equal(g3_textstream_push(&t, "st", 2, &out), 0);
    assert_string_equal(out.data, "hi ");
    assert_int_equal(g3_textstream_push(&t, "op> tail", 8, &out), 1);
    assert_string_equal(out.data, "hi ");
    assert_int_equal(g3_textstream_push(&t, "ignored", 7, &out), 1);
    g3_textstream_flush(&t, &out);
    assert_string_equal(out.data, "hi ");
    g3_textstream_deinit(&t);
    g3_buf_free(&out);
}

static void test_false_start_is_released(void **st) {
    const char *stops[] = {"STOP"};
    g3_textstream t;
    g3_textstream_init(&t, stops, 1);
    g3_buf out = {0};
    g3_buf_puts(&out, "");
    g3_textstream_push(&t, "ST", 2, &out);
    assert_string_equal(out.data, "");
    g3_textstream_push(&t, "ART", 3, &out); /* "STAR" is not a prefix of STOP: all released */
    assert_string_equal(out.data, "START");
    g3_textstream_push(&t, "S", 1, &out);
    g3_textstream_flush(&t, &out); /* end of generation: the held "S" goes out */
    assert_string_equal(out.data, "STARTS");
    g3_textstream_deinit(&t);
    g3_buf_free(&out);
}

static void test_earliest_of_several_stops_wins(void **st) {
    const char *stops[] = {"world", "lo w", "\n\n"};
    const char *p[] = {"hel", "lo wor", "ld"};
    int at;
    char *s = run(stops, 3, p, 3, &at);
    assert_string_equal(s, "hel");
    assert_int_equal(at, 1);
    free(s);
}

static void test_multibyte_stop_string(void **st) {
    const char *stops[] = {"\xE2\x82\xAC"}; /* € */
    const char *p[] = {"5 ", "\xE2", "\x82", "\xAC", " more"};
    int at;
    char *s = run(stops, 1, p, 5, &at);
    assert_string_equal(s, "5 ");
    assert_int_equal(at, 3);
    free(s);
}

static void test_buf_printf_and_consume(void **st) {
    g3_buf b = {0};
    g3_buf_printf(&b, "%d-%s", 42, "x");
    g3_buf_printf(&b, "%05d", 7);
    assert_string_equal(b.data, "42-x00007");
    g3_buf_consume(&b, 3);
    assert_string_equal(b.data, "x00007");
    g3_buf_consume(&b, 100);
    assert_int_equal(b.len, 0);
    g3_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_text_passes_through),
        cmocka_unit_test(test_utf8_split_across_tokens_is_held),
        cmocka_unit_test(test_invalid_bytes_become_replacement),
        cmocka_unit_test(test_stop_string_inside_one_token),
        cmocka_unit_test(test_stop_string_across_tokens_is_held_back),
        cmocka_unit_test(test_false_start_is_released),
        cmocka_unit_test(test_earliest_of_several_stops_wins),
        cmocka_unit_test(test_multibyte_stop_string),
        cmocka_unit_test(test_buf_printf_and_consume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
