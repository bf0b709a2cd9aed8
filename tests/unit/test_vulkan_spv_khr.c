/* The build-time rewrite of the cooperative-matrix prefill kernel from SPV_NV_cooperative_matrix to
 * SPV_KHR_cooperative_matrix (src/backend/vulkan/spv_khr.c, run by tools/spv_coopmat_khr.c): every embedded
 * matmul_cmk* module, checked by a reader of its own (not the rewriter's code): a well-formed word stream, no NV
 * capability, extension or opcode left, every KHR matrix type with a Use that is a uint constant 0..2, MulAdds
 * typed A (MatrixA) x B (MatrixB) + C (Accumulator) with consistent shapes, loads and stores with a layout constant
 * matching the NV module's column-major flag, one for one; the rewrite redone in memory gives the embedded words; and
 * modules it must refuse (a value feeding both A and B, no Vulkan memory model, an opcode outside its table, a
 * truncated stream, a module without NV cooperative matrices). Needs no device: runs everywhere the backend is built. */
#ifdef G3_HAVE_VULKAN
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/spv_khr.h"
#include "backend/vulkan/vk_internal.h"
#include "testutil.h"

enum { MAXID = 1 << 16 };

typedef struct seen {
    int loads, stores, muladds, types, layouts[64]; /* layouts of the loads then stores, in order (first 64) */
    int n_layouts;
} seen;

static const g3vk_spirv *module(const char *name) {
    for (int i = 0; i < g3vk_spirv_count; i++)
        if (!strcmp(g3vk_spirv_table[i].name, name)) return &g3vk_spirv_table[i];
    return NULL;
}

static int str_is(const uint32_t *ins, uint32_t wc, const char *s) {
    size_t len = strlen(s);
    return (wc - 1) * 4 > len && !memcmp(ins + 1, s, len + 1);
}

/* Walks the NV module: its loads' and stores' column-major flags (true 1, false 0), in order. */
static void read_nv(const uint32_t *w, size_t n, seen *s) {
    static int8_t boolc[MAXID];
    memset(boolc, -1, sizeof boolc);
    memset(s, 0, sizeof *s);
    assert_true(w[3] <= MAXID);
    for (size_t i = 5; i < n; i += w[i] >> 16) {
        uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
        assert_true(wc >= 1 && i + wc <= n);
        if (op == 41 || op == 42) boolc[w[i + 2]] = op == 41;
        if (op == 5358) s->types++;
        if (op == 5361) s->muladds++;
        if (op == 5359 || op == 5360) {
            uint32_t cm = w[i + (op == 5359 ? 5 : 4)];
            assert_true(cm < MAXID && boolc[cm] >= 0);
            if (s->n_layouts < 64) s->layouts[s->n_layouts++] = boolc[cm];
            op == 5359 ? s->loads++ : s->stores++;
        }
    }
}

/* Checks a KHR module as described at the top; fills what it saw. */
static void check_khr(const char *name, const uint32_t *w, size_t n, seen *s) {
    static uint32_t cval[MAXID], ctype[MAXID], type_of[MAXID], mt[MAXID][5]; /* matrix types: comp scope rows cols use */
    static uint8_t is_const[MAXID], is_mat[MAXID], defined[MAXID];
    memset(is_const, 0, sizeof is_const), memset(is_mat, 0, sizeof is_mat), memset(defined, 0, sizeof defined);
    memset(type_of, 0, sizeof type_of);
    memset(s, 0, sizeof *s);
    assert_true(n > 5 && w[0] == 0x07230203u && w[3] <= MAXID);
    uint32_t bound = w[3], uint_t = 0;
    int cap_khr = 0, cap_vmm = 0, ext_khr = 0, vk_model = 0;
    size_t i = 5;
    for (; i < n; i += w[i] >> 16) {
        uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
        const uint32_t *p = w + i;
        if (wc == 0 || i + wc > n) fail_msg("%s: instruction at word %zu runs past the end", name, i);
        if (op >= 5358 && op <= 5362) fail_msg("%s: NV opcode %u left at word %zu", name, op, i);
        if (op == 17 && p[1] == 5357) fail_msg("%s: OpCapability CooperativeMatrixNV left", name);
        if (op == 10 && str_is(p, wc, "SPV_NV_cooperative_matrix")) fail_msg("%s: NV extension left", name);
        cap_khr |= op == 17 && p[1] == 6022, cap_vmm |= op == 17 && p[1] == 5345;
        ext_khr |= op == 10 && str_is(p, wc, "SPV_KHR_cooperative_matrix");
        if (op == 14) vk_model = wc == 3 && p[2] == 3;
        if (op == 21 && wc == 4 && p[2] == 32 && p[3] == 0) uint_t = p[1];
        if (op == 43 && wc == 4) is_const[p[2]] = 1, cval[p[2]] = p[3], ctype[p[2]] = p[1];
        /* result ids of the instructions looked at below, each defined once and below the bound */
        uint32_t res = 0;
        if (op == 43 || op == 61 || op == 245 || op == 80 || op == 44 || op == 46 || op == 4457 || op == 4459)
            res = p[2];
        if (op == 4456 || op == 21) res = p[1];
        if (res) {
            if (res >= bound) fail_msg("%s: id %u past the bound %u", name, res, bound);
            if (defined[res]++) fail_msg("%s: id %u defined twice", name, res);
        }
        if (op == 61 || op == 245 || op == 80 || op == 44 || op == 46 || op == 4457 || op == 4459) type_of[p[2]] = p[1];
        if (op == 4456) {
            if (wc != 7) fail_msg("%s: OpTypeCooperativeMatrixKHR %%%u has %u words, not 7 (no Use?)", name, p[1], wc);
            for (int k = 3; k <= 6; k++)
                if (!is_const[p[k]] || ctype[p[k]] != uint_t)
                    fail_msg("%s: matrix type %%%u: operand %d is not a uint constant defined before", name, p[1], k);
            if (cval[p[6]] > 2) fail_msg("%s: matrix type %%%u: Use %u", name, p[1], cval[p[6]]);
            if (cval[p[3]] != 3) fail_msg("%s: matrix type %%%u: scope %u, not Subgroup", name, p[1], cval[p[3]]);
            is_mat[p[1]] = 1, s->types++;
            uint32_t d[5] = {p[2], cval[p[3]], cval[p[4]], cval[p[5]], cval[p[6]]};
            memcpy(mt[p[1]], d, sizeof d);
        }
        if (op == 4457 || op == 4458) {
            int ld = op == 4457;
            uint32_t lay = p[ld ? 4 : 3], obj_t = ld ? p[1] : type_of[p[2]];
            if (wc < (ld ? 6u : 5u)) fail_msg("%s: load/store at word %zu without a stride", name, i);
            if (!is_const[lay] || ctype[lay] != uint_t || cval[lay] > 1)
                fail_msg("%s: load/store at word %zu: layout %%%u is not the constant 0 or 1", name, i, lay);
            if (!is_mat[obj_t]) fail_msg("%s: load/store at word %zu of a non-matrix type", name, i);
            if (s->n_layouts < 64) s->layouts[s->n_layouts++] = (int)cval[lay];
            ld ? s->loads++ : s->stores++;
        }
        if (op == 4459) {
            if (wc != 6) fail_msg("%s: MulAdd at word %zu has %u words", name, i, wc);
            uint32_t tr = p[1], ta = type_of[p[3]], tb = type_of[p[4]], tc = type_of[p[5]];
            if (!is_mat[tr] || !is_mat[ta] || !is_mat[tb] || !is_mat[tc])
                fail_msg("%s: MulAdd %%%u: an operand of unknown or non-matrix type", name, p[2]);
            if (mt[tr][4] != 2 || mt[ta][4] != 0 || mt[tb][4] != 1 || mt[tc][4] != 2)
                fail_msg("%s: MulAdd %%%u: uses result %u A %u B %u C %u (want 2 0 1 2)", name, p[2], mt[tr][4],
                         mt[ta][4], mt[tb][4], mt[tc][4]);
            if (mt[ta][2] != mt[tc][2] || mt[tb][3] != mt[tc][3] || mt[ta][3] != mt[tb][2] || tc != tr)
                fail_msg("%s: MulAdd %%%u: shapes A %ux%u B %ux%u C %ux%u", name, p[2], mt[ta][2], mt[ta][3],
                         mt[tb][2], mt[tb][3], mt[tc][2], mt[tc][3]);
            s->muladds++;
        }
    }
    assert_true(i == n); /* the stream ends exactly at its last instruction */
    if (!cap_khr || !cap_vmm || !ext_khr || !vk_model)
        fail_msg("%s: capability KHR %d, VulkanMemoryModel %d, extension %d, Vulkan memory model %d", name, cap_khr,
                 cap_vmm, ext_khr, vk_model);
}

static const char *const types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k", "q4_1", "q5_1", "q5_k"};

static void test_embedded_khr_modules(void **state) {
    (void)state;
    int checked = 0;
    for (int g = 0; g < 2; g++)
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            char nn[64], kn[64];
            snprintf(nn, sizeof nn, "matmul_cm%s_%s", g ? "_geglu" : "", types[t]);
            snprintf(kn, sizeof kn, "matmul_cmk%s_%s", g ? "_geglu" : "", types[t]);
            const g3vk_spirv *nv = module(nn), *khr = module(kn);
            if (!nv || !khr) fail_msg("module %s or %s not embedded", nn, kn);
            seen a, b;
            read_nv(nv->code, nv->size / 4, &a);
            check_khr(kn, khr->code, khr->size / 4, &b);
            printf("  %-22s %d loads, %d stores, %d MulAdds, %d -> %d matrix types, %zu -> %zu words\n", kn, b.loads,
                   b.stores, b.muladds, a.types, b.types, nv->size / 4, khr->size / 4);
            assert_int_equal(a.loads, b.loads);
            assert_int_equal(a.stores, b.stores);
            assert_int_equal(a.muladds, b.muladds);
            assert_true(b.muladds >= 4 && b.loads >= 4);
            assert_int_equal(b.types, a.types + 1); /* the f16 operand type split into A and B */
            assert_int_equal(a.n_layouts, b.n_layouts);
            for (int k = 0; k < a.n_layouts; k++) assert_int_equal(a.layouts[k], b.layouts[k]);
            /* the rewrite is deterministic: redone here, the same words */
            uint32_t *out = NULL;
            size_t n_out = 0;
            char msg[256];
            if (g3vk_spv_nv_to_khr(nv->code, nv->size / 4, &out, &n_out, msg, sizeof msg)) fail_msg("%s: %s", nn, msg);
            assert_int_equal(n_out, khr->size / 4);
            assert_memory_equal(out, khr->code, khr->size);
            free(out);
            checked++;
        }
    assert_int_equal(checked, 20);
}

/* A copy of the NV module to break. */
static uint32_t *nv_copy(size_t *n) {
    const g3vk_spirv *nv = module("matmul_cm_q8_0");
    assert_non_null(nv);
    *n = nv->size / 4;
    uint32_t *w = malloc(nv->size);
    memcpy(w, nv->code, nv->size);
    return w;
}

/* Word offset of the first instruction with opcode op (0 if none). */
static size_t find_op(const uint32_t *w, size_t n, uint32_t op) {
    for (size_t i = 5; i < n; i += w[i] >> 16)
        if ((w[i] & 0xffff) == op) return i;
    return 0;
}

static void expect_refusal(const uint32_t *w, size_t n, const char *what, const char *part) {
    uint32_t *out = (uint32_t *)1;
    size_t n_out = 1;
    char msg[256];
    int rc = g3vk_spv_nv_to_khr(w, n, &out, &n_out, msg, sizeof msg);
    printf("  %s: %s\n", what, rc ? msg : "accepted");
    assert_int_equal(rc, -1);
    assert_null(out);
    assert_int_equal(n_out, 0);
    if (!strstr(msg, part)) fail_msg("%s: message \"%s\" lacks \"%s\"", what, msg, part);
}

static void test_refusals(void **state) {
    (void)state;
    size_t n;
    uint32_t *w = nv_copy(&n);
    size_t m = find_op(w, n, 5361);
    assert_true(m > 0);
    uint32_t b = w[m + 4];
    w[m + 4] = w[m + 3]; /* B := A: one value feeds both operands */
    expect_refusal(w, n, "a value feeding A and B", "both");
    w[m + 4] = b;
    size_t mm = find_op(w, n, 14);
    w[mm + 2] = 1; /* OpMemoryModel ... GLSL450 */
    expect_refusal(w, n, "GLSL450 memory model", "memory model");
    w[mm + 2] = 3;
    size_t ld = find_op(w, n, 5359);
    w[ld] = (w[ld] & 0xffff0000u) | 9999u;
    expect_refusal(w, n, "unknown opcode", "9999");
    w[ld] = (w[ld] & 0xffff0000u) | 5359u;
    expect_refusal(w, m + 3, "truncated module", "past the end"); /* ends inside a MulAdd */
    uint32_t *out = NULL;
    size_t n_out = 0;
    char msg[256];
    assert_int_equal(g3vk_spv_nv_to_khr(w, n, &out, &n_out, msg, sizeof msg), 0); /* restored: accepted again */
    expect_refusal(out, n_out, "a KHR module", "CooperativeMatrixNV");
    free(out);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedded_khr_modules),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else /* built without the Vulkan backend */
#include "testutil.h"

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tu_skip_no_vulkan)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
