/* Tokenizer against the sentencepiece library itself (python3-sentencepiece, run by this test through
 * tests/tok/spm_ref.py): a few MB of varied text (tests/tok/make_corpus.py) and thousands of random strings, on
 * the fixture vocabularies, a 32k Gemma-like vocabulary trained with spm_train (tests/tok/train_vocab.py, cached
 * in a temp folder), its tokenizer.json and GGUF forms, the same grown to 262,144 pieces, and a vocabulary with
 * the dummy prefix and whitespace folding on. Ids must be identical everywhere; decoding must equal the library's on random id lists. */
#include "tok_testutil.h"

#include <unistd.h>

#include "format/gguf.h"
#include "gemma3.h"
#include "tokenizer/tokenizer.h"

static const char *py;          /* python with sentencepiece */
static char tmp[512];           /* scratch folder of this run */
static tt_texts corpus, props;  /* the varied corpus and the random strings */
static char corpus_path[600], props_path[600];

/* ---- random strings ------------------------------------------------------------------------------------- */
static const char *MARKERS[] = {"<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
                                "[multimodal]", "<unused0>", "<unused7>", "<unused98>", "<unused99>", "<start_of",
                                "_turn>", "<<end_of_turn>", "<0x41>", "\xE2\x96\x81", "\xE2\x96\x81\xE2\x96\x81"};

static size_t gen_part(char *o) {
    static const char *alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    static const char *punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
    static const uint32_t ranges[][2] = {{0xA0, 0xFF},     {0x100, 0x17F},   {0x370, 0x3FF},    {0x400, 0x4FF},
                                         {0x300, 0x36F},   {0x4E00, 0x9FFF}, {0x3040, 0x30FF},  {0xAC00, 0xD7A3},
                                         {0x1F300, 0x1FAFF}, {0x2000, 0x206F}, {0xE000, 0xE0FF}, {0xFFF0, 0xFFFF},
                                         {0x10FFF0, 0x10FFFF}, {0x600, 0x6FF}, {0x900, 0x97F},  {0x2580, 0x2582}};
    size_t n = 0;
    switch (tt_randint(0, 11)) {
    case 0:
    case 1:
        for (int k = tt_randint(1, 10); k > 0; k--) o[n++] = alpha[tt_randint(0, 51)];
        break;
    case 2:
        for (int k = tt_randint(1, 12); k > 0; k--) o[n++] = ' ';
        break;
    case 3:
        for (int k = tt_randint(1, 4); k > 0; k--) o[n++] = " \t\n\r\v\f"[tt_randint(0, 5)];
        break;
    case 4:
        for (int k = tt_randint(1, 12); k > 0; k--) o[n++] = (char)('0' + tt_randint(0, 9));
        break;
    case 5:
        for (int k = tt_randint(1, 3); k > 0; k--) o[n++] = punct[tt_randint(0, 31)];
        break;
    case 6: {
        const char *m = MARKERS[tt_randint(0, (int)(sizeof MARKERS / sizeof *MARKERS) - 1)];
        memcpy(o, m, strlen(m));
        n = strlen(m);
        break;
    }
    case 7:
    case 8:
        for (int k = tt_randint(1, 6); k > 0; k--) {
            int r = tt_randint(0, (int)(sizeof ranges / sizeof *ranges) - 1);
            n += tt_put_cp(o + n, (uint32_t)tt_randint((int)ranges[r][0], (int)ranges[r][1]));
        }
        break;
    case 9: /* invalid UTF-8: stray bytes, truncated sequences, surrogates, overlong forms */
        for (int k = tt_randint(1, 3); k > 0; k--) {
            int r = tt_randint(0, 3);
            if (r == 0) o[n++] = (char)tt_randint(0x80, 0xFF);
            else if (r == 1) n += tt_put_cp(o + n, (uint32_t)tt_randint(0xD800, 0xDFFF));
            else if (r == 2) { o[n++] = (char)0xE4; o[n++] = (char)0xB8; }
            else { o[n++] = (char)0xC0; o[n++] = (char)0xAF; }
        }
        break;
    case 10:
        for (int k = tt_randint(1, 3); k > 0; k--) o[n++] = (char)(tt_randint(0, 32) == 32 ? 0x7F : tt_randint(0, 31));
        break;
    default: /* a repeated letter run */
        for (int k = tt_randint(2, 40), c = alpha[tt_randint(0, 51)]; k > 0; k--) o[n++] = (char)c;
        break;
    }
    return n;
}

static void gen_props(int count) {
    char buf[4096];
    tt_seed(20260521);
    for (int i = 0; i < count; i++) {
        size_t n = 0;
        for (int p = tt_randint(0, 14); p > 0 && n < sizeof buf - 256; p--) n += gen_part(buf + n);
        tt_texts_add(&props, buf, n);
    }
}

static int setup(void **state) {
    (void)state;
    py = tt_python_spm();
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(corpus_path, sizeof corpus_path, "%s/corpus.bin", tmp);
    snprintf(props_path, sizeof props_path, "%s/props.bin", tmp);
    if (!py) return 0; /* every test then fails with the install hint */
    if (tt_sh("%s %s/tests/tok/make_corpus.py records %s --mb 4 --seed 7 >/dev/null", py, tu_source_dir(),
              corpus_path) != 0)
        return -1;
    tt_read_texts(corpus_path, &corpus);
    gen_props(6000);
    tt_write_texts(props_path, &props);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tt_texts_free(&corpus);
    tt_texts_free(&props);
    tt_sh_quiet("rm -rf %s", tmp);
    return 0;
}

/* Library ids of a record file for one model: a cached file per (model, texts). */
static void reference_ids(const char *model, const char *texts, const char *tag, tt_ids *out) {
    char path[1200];
    snprintf(path, sizeof path, "%s/ref-%s.bin", tmp, tag);
    if (access(path, R_OK) != 0)
        assert_int_equal(tt_sh("%s %s/tests/tok/spm_ref.py encode '%s' '%s' '%s'", py, tu_source_dir(), model, texts,
                               path),
                         0);
    tt_read_ids(path, out);
}

static int contains_marker(const g3_tokenizer *t, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (t->pieces[ids[i]].special) return 1;
    return 0;
}

/* Compares t on texts against the reference ids; prints and returns the mismatch count. With check_off, the
 * special-parsing-off encoding must equal the library's wherever the library produced no marker, and decode to
 * the same text everywhere. */
static int compare(const g3_tokenizer *t, const tt_texts *texts, const tt_ids *ref, const char *label, int check_off) {
    assert_int_equal(texts->n, ref->count);
    int bad = 0, bad_off = 0, with_markers = 0;
    size_t bytes = 0;
    for (int i = 0; i < texts->n; i++) {
        g3_error err = {0};
        int32_t *ids;
        int n;
        bytes += texts->len[i];
        assert_int_equal(g3_tokenize(t, texts->s[i], texts->len[i], 1, &ids, &n, &err), G3_OK);
        if (n != ref->n[i] || memcmp(ids, ref->v[i], (size_t)n * 4) != 0) {
            if (bad++ < 3) {
                int k = 0;
                while (k < n && k < ref->n[i] && ids[k] == ref->v[i][k]) k++;
                fprintf(stderr, "%s: text %d (%zu bytes) differs at id %d: ours %d, library %d\n", label, i,
                        texts->len[i], k, k < n ? ids[k] : -1, k < ref->n[i] ? ref->v[i][k] : -1);
            }
        }
        free(ids);
        if (!check_off) continue;
        assert_int_equal(g3_tokenize(t, texts->s[i], texts->len[i], 0, &ids, &n, &err), G3_OK);
        assert_false(contains_marker(t, ids, n));
        if (contains_marker(t, ref->v[i], ref->n[i])) {
            with_markers++;
            char *a, *b;
            size_t la, lb;
            assert_int_equal(g3_detokenize(t, ids, n, &a, &la, &err), G3_OK);
            assert_int_equal(g3_detokenize(t, ref->v[i], ref->n[i], &b, &lb, &err), G3_OK);
            if (la != lb || memcmp(a, b, la) != 0) bad_off++;
            free(a);
            free(b);
        } else if (n != ref->n[i] || memcmp(ids, ref->v[i], (size_t)n * 4) != 0) {
            bad_off++;
        }
        free(ids);
    }
    fprintf(stderr, "%s: %d texts (%.2f MB), %d mismatches", label, texts->n, bytes / 1e6, bad);
    if (check_off) fprintf(stderr, "; special parsing off: %d mismatches (%d texts with markers)", bad_off, with_markers);
    fprintf(stderr, "\n");
    return bad + bad_off;
}

static void check_model(const char *spm_model, const char *load_path, const char *label, const char *tag) {
    g3_error err = {0};
    g3_tokenizer *t = NULL;
    if (g3_tokenizer_load(load_path, &t, &err) != G3_OK) fail_msg("%s: %s", label, err.msg);
    tt_ids rc = {0}, rp = {0};
    char tc[128], tp[128], lc[256], lp[256];
    snprintf(tc, sizeof tc, "%s-corpus", tag);
    snprintf(tp, sizeof tp, "%s-props", tag);
    snprintf(lc, sizeof lc, "%s, varied corpus", label);
    snprintf(lp, sizeof lp, "%s, random strings", label);
    reference_ids(spm_model, corpus_path, tc, &rc);
    reference_ids(spm_model, props_path, tp, &rp);
    int bad = compare(t, &corpus, &rc, lc, 1) + compare(t, &props, &rp, lp, 1);
    tt_ids_free(&rc);
    tt_ids_free(&rp);
    g3_tokenizer_free(t);
    assert_int_equal(bad, 0);
}

static void test_fixture_vocabs(void **state) {
    (void)state;
    TT_REQUIRE_SPM(py);
    static const char *names[2] = {"tiny-gqa", "small-a"};
    int seen = 0;
    for (int f = 0; f < 2; f++) {
        const char *d = tu_fixture(names[f]);
        if (!d) continue;
        char dir[1024], model[1200], label[128];
        snprintf(dir, sizeof dir, "%s", d);
        snprintf(model, sizeof model, "%s/tokenizer.model", dir);
        snprintf(label, sizeof label, "%s tokenizer.model", names[f]);
        check_model(model, dir, label, names[f]);
        if (f == 0) {
            snprintf(model, sizeof model, "%s/model-q8_0.gguf", dir);
            char m2[1200];
            snprintf(m2, sizeof m2, "%s/tokenizer.model", dir);
            check_model(m2, model, "tiny-gqa model-q8_0.gguf", names[f]);
        }
        seen++;
    }
    if (!seen) skip();
}

static void trained(const char *opts, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s/tests/tok/train_vocab.py %s", py, tu_source_dir(), opts);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    if (!fgets(out, (int)cap, p)) out[0] = 0;
    int st = pclose(p);
    out[strcspn(out, "\n")] = 0;
    if (st != 0 || !out[0]) fail_msg("training a vocabulary failed: %s", cmd);
}

/* The 32k vocabulary as tokenizer.model, as tokenizer.json and as GGUF metadata. */
static void test_trained_32k(void **state) {
    (void)state;
    TT_REQUIRE_SPM(py);
    char model[1024];
    trained("--vocab 32768", model, sizeof model);
    check_model(model, model, "32k spm_train vocab, tokenizer.model", "v32k");

    char json[1200];
    snprintf(json, sizeof json, "%s/t32k.json", tmp);
    assert_int_equal(tt_sh("%s %s/tests/tok/make_hfjson.py '%s' %s --merges pairs", py, tu_source_dir(), model, json), 0);
    check_model(model, json, "32k vocab, tokenizer.json", "v32k");

    g3_error err = {0};
    g3_tokenizer *t;
    assert_int_equal(g3_tokenizer_load(model, &t, &err), G3_OK);
    g3_gguf_writer *w;
    assert_int_equal(g3_gguf_writer_create(&w, &err), G3_OK);
    assert_int_equal(g3_tok_write_gguf(t, w, &err), G3_OK);
    char gguf[1200];
    snprintf(gguf, sizeof gguf, "%s/t32k.gguf", tmp);
    assert_int_equal(g3_gguf_writer_write(w, gguf, &err), G3_OK);
    g3_gguf_writer_free(w);
    g3_tokenizer_free(t);
    check_model(model, gguf, "32k vocab, GGUF metadata", "v32k");

    /* grown to Gemma's 262,144 pieces with pieces made of two others (they do get merged) */
    char big[1200];
    snprintf(big, sizeof big, "%s/big.model", tmp);
    assert_int_equal(tt_sh("%s %s/tests/tok/grow_vocab.py '%s' %s", py, tu_source_dir(), model, big), 0);
    assert_int_equal(g3_tokenizer_load(big, &t, &err), G3_OK);
    assert_int_equal(g3_tokenizer_vocab(t), 262144);
    g3_tokenizer_free(t);
    check_model(big, big, "262k grown vocab, tokenizer.model", "v262k");
}

/* add_dummy_prefix + remove_extra_whitespaces on: the normalizer paths Gemma does not use. */
static void test_trained_dummy_prefix(void **state) {
    (void)state;
    TT_REQUIRE_SPM(py);
    char model[1024];
    trained("--vocab 8000 --mb 3 --dummy", model, sizeof model);
    check_model(model, model, "8k vocab with dummy prefix", "vdummy");
}

/* Decoding random id lists (normal, byte, control, unknown, marker ids mixed) equals the library's decode, whole
 * and streamed; the stream never hands out invalid UTF-8. */
static void decode_against_library(const char *model, const char *label) {
    g3_error err = {0};
    g3_tokenizer *t;
    assert_int_equal(g3_tokenizer_load(model, &t, &err), G3_OK);
    tt_ids lists = {0};
    int32_t buf[64];
    tt_seed(99);
    int32_t first_byte = t->byte_id[0];
    for (int i = 0; i < 3000; i++) {
        int n = tt_randint(0, 40);
        for (int k = 0; k < n; k++) {
            int r = tt_randint(0, 9);
            if (r < 4) buf[k] = first_byte + tt_randint(0, 255);          /* byte pieces */
            else if (r < 5) buf[k] = first_byte + tt_randint(0xE0, 0xF4); /* lead bytes */
            else if (r < 6) buf[k] = first_byte + tt_randint(0x80, 0xBF); /* continuation bytes */
            else if (r < 7) buf[k] = tt_randint(0, 110);                  /* control, unk, markers */
            else buf[k] = tt_randint(0, t->n - 1);
        }
        tt_ids_add(&lists, buf, n);
    }
    char in[1200], out[1200];
    snprintf(in, sizeof in, "%s/dec-in.bin", tmp);
    snprintf(out, sizeof out, "%s/dec-out.bin", tmp);
    tt_write_ids(in, &lists);
    assert_int_equal(tt_sh("%s %s/tests/tok/spm_ref.py decode '%s' %s %s", py, tu_source_dir(), model, in, out), 0);
    tt_texts want = {0};
    tt_read_texts(out, &want);
    assert_int_equal(want.n, lists.count);
    g3_detok *d;
    assert_int_equal(g3_detok_create(t, &d, &err), G3_OK);
    int bad = 0, bad_stream = 0;
    char *acc = malloc(1 << 16);
    for (int i = 0; i < lists.count; i++) {
        char *s;
        size_t len;
        assert_int_equal(g3_detokenize(t, lists.v[i], lists.n[i], &s, &len, &err), G3_OK);
        if (len != want.len[i] || memcmp(s, want.s[i], len) != 0) bad++;
        free(s);
        size_t al = 0;
        for (int k = 0; k < lists.n[i]; k++) {
            const char *piece;
            size_t pl;
            assert_int_equal(g3_detok_push(d, lists.v[i][k], &piece, &pl, &err), G3_OK);
            assert_true(tt_valid_utf8(piece, pl));
            memcpy(acc + al, piece, pl);
            al += pl;
        }
        size_t rl;
        const char *rest = g3_detok_flush(d, &rl);
        assert_true(tt_valid_utf8(rest, rl));
        memcpy(acc + al, rest, rl);
        al += rl;
        if (al != want.len[i] || memcmp(acc, want.s[i], al) != 0) bad_stream++;
    }
    fprintf(stderr, "%s: decode of %d random id lists: %d mismatches whole, %d streamed\n", label, lists.count, bad,
            bad_stream);
    free(acc);
    g3_detok_free(d);
    tt_texts_free(&want);
    tt_ids_free(&lists);
    g3_tokenizer_free(t);
    assert_int_equal(bad + bad_stream, 0);
}

static void test_decode(void **state) {
    (void)state;
    TT_REQUIRE_SPM(py);
    const char *d = tu_fixture("tiny-gqa");
    if (d) {
        char model[1200];
        snprintf(model, sizeof model, "%s/tokenizer.model", d);
        decode_against_library(model, "tiny-gqa");
    }
    char model[1024];
    trained("--vocab 8000 --mb 3 --dummy", model, sizeof model);
    decode_against_library(model, "8k vocab with dummy prefix");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_vocabs),
        cmocka_unit_test(test_trained_32k),
        cmocka_unit_test(test_trained_dummy_prefix),
        cmocka_unit_test(test_decode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
