/* `gemma3 tokenize` / `gemma3 detokenize`: the output contract (ids comma-separated on one line; the exact text
 * back), --parse-special, --bos, --file, and usage errors (exit 2) vs load errors (exit 1). The subcommands are
 * compiled into this test (the command line is not part of the library); when $G3_BIN is a built gemma3, the
 * same calls also go through it. */
#include "tok_testutil.h"

#include <fcntl.h>
#include <unistd.h>

#include "../../src/cli/cmd_tokenize.c"

static char out_buf[1 << 16], err_buf[1 << 14];

/* Runs fn(argv) with stdout/stderr captured into out_buf/err_buf; returns its exit status. */
static int run(int (*fn)(int, char **), const char *const *args) {
    char *argv[32];
    int argc = 0;
    while (args[argc]) {
        argv[argc] = (char *)args[argc];
        argc++;
    }
    argv[argc] = NULL;
    char po[600], pe[600];
    const char *dir = tu_tmpdir();
    snprintf(po, sizeof po, "%s/out", dir);
    snprintf(pe, sizeof pe, "%s/err", dir);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(so >= 0 && se >= 0 && fo >= 0 && fe >= 0);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so), close(se), close(fo), close(fe);
    size_t n;
    char *s = tu_read_file(po, &n);
    assert_non_null(s);
    assert_true(n < sizeof out_buf);
    memcpy(out_buf, s, n + 1);
    free(s);
    s = tu_read_file(pe, &n);
    assert_non_null(s);
    snprintf(err_buf, sizeof err_buf, "%s", s);
    free(s);
    unlink(po);
    unlink(pe);
    rmdir(dir);
    return rc;
}

static char model[1024];

static int setup(void **state) {
    (void)state;
    const char *d = tu_fixture("tiny-gqa");
    if (d) snprintf(model, sizeof model, "%s", d);
    return 0;
}

static void test_tokenize(void **state) {
    (void)state;
    if (!model[0]) skip();
    const char *a1[] = {"tokenize", "-m", model, "--text", "Hello world", NULL};
    assert_int_equal(run(g3_cli_tokenize, a1), 0);
    assert_string_equal(out_buf, "482,438,449,449,440,385,369,449,448\n");
    const char *a3[] = {"tokenize", "--bos", "-m", model, "--text=Hello world", NULL};
    assert_int_equal(run(g3_cli_tokenize, a3), 0);
    assert_string_equal(out_buf, "2,482,438,449,449,440,385,369,449,448\n");
    /* markers: literal by default, special tokens with --parse-special */
    const char *a4[] = {"tokenize", "-m", model, "--text", "<end_of_turn>", NULL};
    assert_int_equal(run(g3_cli_tokenize, a4), 0);
    assert_null(strstr(out_buf, "106"));
    const char *a5[] = {"tokenize", "-m", model, "--parse-special", "--text", "<end_of_turn>", NULL};
    assert_int_equal(run(g3_cli_tokenize, a5), 0);
    assert_string_equal(out_buf, "106\n");
    const char *a6[] = {"tokenize", "-m", model, "--text", "", NULL};
    assert_int_equal(run(g3_cli_tokenize, a6), 0);
    assert_string_equal(out_buf, "\n");
    /* --file: bytes as they are, invalid UTF-8 included; same ids as the library call */
    char path[600];
    const char *dir = tu_tmpdir();
    snprintf(path, sizeof path, "%s/in.txt", dir);
    static const char bytes[] = "line one\n\xff\xe4\xb8 tab\there\n";
    FILE *f = fopen(path, "wb");
    fwrite(bytes, 1, sizeof bytes - 1, f);
    fclose(f);
    const char *a7[] = {"tokenize", "-m", model, "--file", path, NULL};
    assert_int_equal(run(g3_cli_tokenize, a7), 0);
    g3_error err = {0};
    g3_tokenizer *t;
    assert_int_equal(g3_tokenizer_load(model, &t, &err), G3_OK);
    int32_t *ids;
    int n;
    assert_int_equal(g3_tokenize(t, bytes, sizeof bytes - 1, 0, &ids, &n, &err), G3_OK);
    char want[4096];
    size_t o = 0;
    for (int i = 0; i < n; i++) o += (size_t)snprintf(want + o, sizeof want - o, i ? ",%d" : "%d", ids[i]);
    snprintf(want + o, sizeof want - o, "\n");
    assert_string_equal(out_buf, want);
    free(ids);
    g3_tokenizer_free(t);
    unlink(path);
    rmdir(dir);
}

static void test_detokenize(void **state) {
    (void)state;
    if (!model[0]) skip();
    const char *a1[] = {"detokenize", "-m", model, "--ids", "2,482,438,449,449,440,385,369,449,448", NULL};
    assert_int_equal(run(g3_cli_detokenize, a1), 0);
    assert_string_equal(out_buf, "Hello world");
    const char *a2[] = {"detokenize", "-m", model, "--ids", " 105, 117 117,", NULL}; /* spaces and commas */
    assert_int_equal(run(g3_cli_detokenize, a2), 0);
    assert_string_equal(out_buf, "<start_of_turn>\n\n");
    const char *a3[] = {"detokenize", "-m", model, "--ids", "", NULL};
    assert_int_equal(run(g3_cli_detokenize, a3), 0);
    assert_string_equal(out_buf, "");
}

static void expect_usage_error(int (*fn)(int, char **), const char *const *args, const char *needle) {
    assert_int_equal(run(fn, args), 2);
    if (!strstr(err_buf, needle)) fail_msg("stderr '%s' lacks '%s'", err_buf, needle);
    assert_string_equal(out_buf, "");
}

static void test_errors(void **state) {
    (void)state;
    const char *m = model[0] ? model : "/nonexistent";
    const char *h1[] = {"tokenize", "--help", NULL};
    assert_int_equal(run(g3_cli_tokenize, h1), 0);
    assert_non_null(strstr(out_buf, "default"));
    assert_non_null(strstr(out_buf, "--parse-special"));
    const char *h2[] = {"detokenize", "-h", NULL};
    assert_int_equal(run(g3_cli_detokenize, h2), 0);
    assert_non_null(strstr(out_buf, "--ids"));

    const char *e1[] = {"tokenize", "--text", "x", NULL};
    expect_usage_error(g3_cli_tokenize, e1, "-m MODEL");
    const char *e2[] = {"tokenize", "-m", m, "--text", "x", "--frobnicate", NULL};
    expect_usage_error(g3_cli_tokenize, e2, "unknown option '--frobnicate'");
    const char *e3[] = {"tokenize", "-m", m, "--text", "x", "--file", "y", NULL};
    expect_usage_error(g3_cli_tokenize, e3, "exactly one");
    const char *e4[] = {"tokenize", "-m", m, NULL};
    expect_usage_error(g3_cli_tokenize, e4, "exactly one");
    const char *e5[] = {"tokenize", "-m", m, "--text", NULL};
    expect_usage_error(g3_cli_tokenize, e5, "needs a value");
    const char *e6[] = {"detokenize", "-m", m, "--ids", "1,x2", NULL};
    expect_usage_error(g3_cli_detokenize, e6, "'x2' is not a token id");
    const char *e7[] = {"detokenize", "-m", m, "--ids", "-3", NULL};
    expect_usage_error(g3_cli_detokenize, e7, "'-3' is not a token id");
    const char *e8[] = {"detokenize", "-m", m, NULL};
    expect_usage_error(g3_cli_detokenize, e8, "--ids");
    const char *e9[] = {"detokenize", "-m", m, "--ids", "1", "--bogus", NULL};
    expect_usage_error(g3_cli_detokenize, e9, "unknown option '--bogus'");
    if (model[0]) {
        const char *e10[] = {"detokenize", "-m", model, "--ids", "1,512", NULL}; /* vocab is 512 */
        expect_usage_error(g3_cli_detokenize, e10, "out of range");
    }
    /* a model that cannot be loaded is not a usage error */
    const char *l1[] = {"tokenize", "-m", "/nonexistent/model", "--text", "x", NULL};
    assert_int_equal(run(g3_cli_tokenize, l1), 1);
    assert_non_null(strstr(err_buf, "/nonexistent/model"));
    const char *l2[] = {"tokenize", "-m", m, "--file", "/nonexistent/file.txt", NULL};
    assert_int_equal(run(g3_cli_tokenize, l2), 1);
    assert_non_null(strstr(err_buf, "/nonexistent/file.txt"));
}

/* The same contract through the gemma3 binary, when it is built with these subcommands. */
static void test_binary(void **state) {
    (void)state;
    const char *bin = getenv("G3_BIN");
    if (!model[0] || !bin || access(bin, X_OK) != 0) skip();
    char cmd[2048], line[4096] = "";
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' --text 'Hello world' 2>/dev/null", bin, model);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    if (!fgets(line, sizeof line, p)) line[0] = 0;
    int st = pclose(p);
    if (WEXITSTATUS(st) == 2 && !line[0]) skip(); /* this build has no tokenize subcommand */
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_string_equal(line, "482,438,449,449,440,385,369,449,448\n");
    snprintf(cmd, sizeof cmd, "'%s' detokenize -m '%s' --ids 482,438,449,449,440,385,369,449,448", bin, model);
    p = popen(cmd, "r");
    assert_non_null(p);
    if (!fgets(line, sizeof line, p)) line[0] = 0;
    assert_int_equal(WEXITSTATUS(pclose(p)), 0);
    assert_string_equal(line, "Hello world");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_detokenize),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_binary),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
