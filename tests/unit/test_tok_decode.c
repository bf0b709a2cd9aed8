/* Decoding, whole and streamed, on a small hand-written vocabulary (a tokenizer.json made by this test): byte
 * pieces held until their character is complete, invalid bytes as U+FFFD exactly where sentencepiece puts them,
 * control/unknown/marker pieces, the leading-space rule of the dummy prefix, and stream == whole decode. */
#include "tok_testutil.h"

#include <unistd.h>

#include "gemma3.h"
#include "tokenizer/tokenizer.h"

#define FFFD "\xEF\xBF\xBD"

/* ids: 0 <pad> 1 <eos> 2 <bos> 3 <unk> 4 <start_of_turn> 5 <end_of_turn> 6..261 <0x00>..<0xFF>,
 * 262 ▁ 263 a 264 b 265 ▁a 266 ab 267 ▁ab 268 ▁▁ */
enum { BYTE0 = 6, SP = 262, A = 263, B = 264, SPA = 265, AB = 266, SPAB = 267, SPSP = 268 };

static g3_tokenizer *make_vocab(int dummy_prefix) {
    char *json = malloc(1 << 16);
    size_t o = 0;
    o += (size_t)sprintf(json + o, "{\"added_tokens\": [");
    static const char *sp[6] = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"};
    for (int i = 0; i < 6; i++)
        o += (size_t)sprintf(json + o, "%s{\"id\": %d, \"content\": \"%s\", \"special\": true}", i ? ", " : "", i, sp[i]);
    o += (size_t)sprintf(json + o, "], \"normalizer\": %s, \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, "
                                   "\"unk_token\": \"<unk>\", \"vocab\": {",
                         dummy_prefix ? "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                                        "\"\xE2\x96\x81\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                                        "\"content\": \"\xE2\x96\x81\"}]}"
                                      : "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": "
                                        "\"\xE2\x96\x81\"}");
    for (int i = 0; i < 6; i++) o += (size_t)sprintf(json + o, "\"%s\": %d, ", sp[i], i);
    for (int b = 0; b < 256; b++) o += (size_t)sprintf(json + o, "\"<0x%02X>\": %d, ", b, BYTE0 + b);
    o += (size_t)sprintf(json + o, "\"\xE2\x96\x81\": 262, \"a\": 263, \"b\": 264, \"\xE2\x96\x81" "a\": 265, "
                                   "\"ab\": 266, \"\xE2\x96\x81" "ab\": 267, \"\xE2\x96\x81\xE2\x96\x81\": 268}, "
                                   "\"merges\": [\"\xE2\x96\x81 a\", \"a b\", \"\xE2\x96\x81 ab\", \"\xE2\x96\x81" "a b\", "
                                   "\"\xE2\x96\x81 \xE2\x96\x81\"]}}");
    const char *dir = tu_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(json, 1, o, f);
    fclose(f);
    free(json);
    g3_error err = {0};
    g3_tokenizer *t = NULL;
    if (g3_tokenizer_load(dir, &t, &err) != G3_OK) fail_msg("%s", err.msg);
    unlink(path);
    rmdir(dir);
    return t;
}

/* Pushes ids one by one; each push must return exactly want[i] (NULL = ""). Then flush must return rest. */
static void stream_expect(g3_tokenizer *t, const int32_t *ids, int n, const char *const *want, const char *rest) {
    g3_error err = {0};
    g3_detok *d;
    assert_int_equal(g3_detok_create(t, &d, &err), G3_OK);
    for (int i = 0; i < n; i++) {
        const char *s;
        size_t len;
        assert_int_equal(g3_detok_push(d, ids[i], &s, &len, &err), G3_OK);
        const char *w = want[i] ? want[i] : "";
        if (len != strlen(w) || memcmp(s, w, len) != 0) fail_msg("push %d (id %d): got '%.*s', want '%s'", i, ids[i], (int)len, s, w);
        assert_true(tt_valid_utf8(s, len));
    }
    size_t rl;
    const char *r = g3_detok_flush(d, &rl);
    assert_int_equal(rl, strlen(rest));
    assert_memory_equal(r, rest, rl);
    g3_detok_free(d);
}

static void whole_expect(g3_tokenizer *t, const int32_t *ids, int n, const char *want) {
    g3_error err = {0};
    char *s;
    size_t len;
    assert_int_equal(g3_detokenize(t, ids, n, &s, &len, &err), G3_OK);
    if (len != strlen(want) || memcmp(s, want, len) != 0) fail_msg("decode: got '%s', want '%s'", s, want);
    assert_int_equal(s[len], 0);
    free(s);
}

#define BY(x) (BYTE0 + (x))

static void test_bytes_held(void **state) {
    (void)state;
    g3_tokenizer *t = make_vocab(0);
    int32_t zh[3] = {BY(0xE4), BY(0xB8), BY(0xAD)}; /* 中 */
    const char *w1[3] = {NULL, NULL, "\xE4\xB8\xAD"};
    stream_expect(t, zh, 3, w1, "");
    int32_t emoji[5] = {A, BY(0xF0), BY(0x9F), BY(0x98), BY(0x80)}; /* a😀 */
    const char *w2[5] = {"a", NULL, NULL, NULL, "\xF0\x9F\x98\x80"};
    stream_expect(t, emoji, 5, w2, "");
    whole_expect(t, emoji, 5, "a\xF0\x9F\x98\x80");
    g3_tokenizer_free(t);
}

static void test_invalid_bytes(void **state) {
    (void)state;
    g3_tokenizer *t = make_vocab(0);
    /* a lead byte cut short by a normal piece: U+FFFD for it, then the piece */
    int32_t s1[2] = {BY(0xE4), A};
    const char *w1[2] = {NULL, FFFD "a"};
    stream_expect(t, s1, 2, w1, "");
    whole_expect(t, s1, 2, FFFD "a");
    /* two bytes of a three-byte character, then a normal piece: one U+FFFD per byte */
    int32_t s2[3] = {BY(0xE4), BY(0xB8), B};
    const char *w2[3] = {NULL, NULL, FFFD FFFD "b"};
    stream_expect(t, s2, 3, w2, "");
    /* bytes that can never start a character come out at once */
    int32_t s3[4] = {BY(0x80), BY(0xF5), BY(0xC0), BY(0xFF)};
    const char *w3[4] = {FFFD, FFFD, FFFD, FFFD};
    stream_expect(t, s3, 4, w3, "");
    /* E0 80: overlong; ED A0: surrogate; F4 90: above U+10FFFF -- known bad at the second byte */
    int32_t s4[6] = {BY(0xE0), BY(0x80), BY(0xED), BY(0xA0), BY(0xF4), BY(0x90)};
    const char *w4[6] = {NULL, FFFD FFFD, NULL, FFFD FFFD, NULL, FFFD FFFD};
    stream_expect(t, s4, 6, w4, "");
    /* a bad byte in the middle of a good run, then a valid character in the same run */
    int32_t s5[5] = {BY(0xE4), BY(0x41), BY(0xC3), BY(0xA9), BY(0x42)};
    const char *w5[5] = {NULL, FFFD "A", NULL, "\xC3\xA9", "B"};
    stream_expect(t, s5, 5, w5, "");
    /* still incomplete at the end: flush turns the held bytes into U+FFFD each */
    int32_t s6[3] = {A, BY(0xF0), BY(0x9F)};
    const char *w6[3] = {"a", NULL, NULL};
    stream_expect(t, s6, 3, w6, FFFD FFFD);
    whole_expect(t, s6, 3, "a" FFFD FFFD);
    g3_tokenizer_free(t);
}

static void test_special_pieces(void **state) {
    (void)state;
    g3_tokenizer *t = make_vocab(0);
    int32_t ids[7] = {2, A, 4, B, 5, 3, 1}; /* <bos> a <start_of_turn> b <end_of_turn> <unk> <eos> */
    const char *w[7] = {NULL, "a", "<start_of_turn>", "b", "<end_of_turn>", " \xE2\x81\x87 ", NULL};
    stream_expect(t, ids, 7, w, "");
    whole_expect(t, ids, 7, "a<start_of_turn>b<end_of_turn> \xE2\x81\x87 ");
    /* a bad id is refused and leaves the stream as it was */
    g3_error err = {0};
    g3_detok *d;
    assert_int_equal(g3_detok_create(t, &d, &err), G3_OK);
    const char *s;
    size_t len;
    assert_int_equal(g3_detok_push(d, BY(0xE4), &s, &len, &err), G3_OK);
    assert_int_equal(g3_detok_push(d, 100000, &s, &len, &err), G3_ERR_ARG);
    assert_non_null(strstr(err.msg, "100000"));
    assert_int_equal(g3_detok_push(d, -1, &s, &len, &err), G3_ERR_ARG);
    assert_int_equal(g3_detok_push(d, BY(0xB8), &s, &len, &err), G3_OK);
    assert_int_equal(g3_detok_push(d, BY(0xAD), &s, &len, &err), G3_OK);
    assert_string_equal(s, "\xE4\xB8\xAD");
    g3_detok_free(d);
    g3_detok_free(NULL);
    g3_tokenizer_free(t);
}

/* With a dummy prefix the first visible '▁' is dropped (once); control pieces before it do not count, text from
 * byte pieces does. Without one, spaces stay. */
static void test_leading_space(void **state) {
    (void)state;
    g3_tokenizer *t = make_vocab(1);
    int32_t s1[3] = {SPA, SPAB, SP};
    const char *w1[3] = {"a", " ab", " "};
    stream_expect(t, s1, 3, w1, "");
    int32_t s2[2] = {2, SPAB}; /* <bos> first: the rule still applies */
    const char *w2[2] = {NULL, "ab"};
    stream_expect(t, s2, 2, w2, "");
    int32_t s3[2] = {BY('x'), SPA};
    const char *w3[2] = {"x", " a"};
    stream_expect(t, s3, 2, w3, "");
    int32_t s4[2] = {SPSP, SPA}; /* only one '▁' is dropped, and only from the first piece */
    const char *w4[2] = {" ", " a"};
    stream_expect(t, s4, 2, w4, "");
    /* encoding adds the prefix: " ab" <- "ab", and a decode of it gives the text back */
    g3_error err = {0};
    int32_t *ids;
    int n;
    assert_int_equal(g3_tokenize(t, "ab ab", 5, 0, &ids, &n, &err), G3_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], SPAB);
    assert_int_equal(ids[1], SPAB);
    whole_expect(t, ids, n, "ab ab");
    free(ids);
    /* a new stream after flush drops the prefix again */
    g3_detok *d;
    assert_int_equal(g3_detok_create(t, &d, &err), G3_OK);
    const char *s;
    size_t len;
    for (int round = 0; round < 2; round++) {
        assert_int_equal(g3_detok_push(d, SPA, &s, &len, &err), G3_OK);
        assert_string_equal(s, "a");
        g3_detok_flush(d, &len);
    }
    assert_int_equal(g3_detok_push(d, SPA, &s, &len, &err), G3_OK);
    g3_detok_reset(d);
    assert_int_equal(g3_detok_push(d, SPA, &s, &len, &err), G3_OK);
    assert_string_equal(s, "a");
    g3_detok_free(d);
    g3_tokenizer_free(t);

    t = make_vocab(0);
    const char *w5[3] = {" a", " ab", " "};
    stream_expect(t, s1, 3, w5, "");
    g3_tokenizer_free(t);
}

/* Random id lists: the stream's pieces are valid UTF-8 and add up to the whole decode. */
static void test_stream_equals_whole(void **state) {
    (void)state;
    for (int dummy = 0; dummy < 2; dummy++) {
        g3_tokenizer *t = make_vocab(dummy);
        g3_error err = {0};
        g3_detok *d;
        assert_int_equal(g3_detok_create(t, &d, &err), G3_OK);
        tt_seed(5 + (uint64_t)dummy);
        char acc[4096];
        for (int iter = 0; iter < 5000; iter++) {
            int32_t ids[48];
            int n = tt_randint(0, 48);
            for (int k = 0; k < n; k++)
                ids[k] = tt_randint(0, 3) ? BY(tt_randint(0, 3) ? tt_randint(0x80, 0xF5) : tt_randint(0, 255))
                                          : tt_randint(0, g3_tokenizer_vocab(t) - 1);
            size_t al = 0;
            for (int k = 0; k < n; k++) {
                const char *s;
                size_t len;
                assert_int_equal(g3_detok_push(d, ids[k], &s, &len, &err), G3_OK);
                assert_true(tt_valid_utf8(s, len));
                memcpy(acc + al, s, len);
                al += len;
            }
            size_t rl;
            const char *r = g3_detok_flush(d, &rl);
            assert_true(tt_valid_utf8(r, rl));
            memcpy(acc + al, r, rl);
            al += rl;
            char *whole;
            size_t wl;
            assert_int_equal(g3_detokenize(t, ids, n, &whole, &wl, &err), G3_OK);
            assert_true(tt_valid_utf8(whole, wl));
            assert_int_equal(al, wl);
            assert_memory_equal(acc, whole, wl);
            free(whole);
        }
        g3_detok_free(d);
        g3_tokenizer_free(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_held),      cmocka_unit_test(test_invalid_bytes),
        cmocka_unit_test(test_special_pieces),  cmocka_unit_test(test_leading_space),
        cmocka_unit_test(test_stream_equals_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
