/* SPV_NV_cooperative_matrix -> SPV_KHR_cooperative_matrix (spv_khr.h): a word-level rewrite of one module.
 *
 * The two extensions differ in four ways that matter here (checked against the extension texts): the capability
 * (5357 -> 6022) and extension string; the type gains a Use operand (MatrixA 0, MatrixB 1, Accumulator 2: a uint
 * constant id) after (component type, scope, rows, columns); Load (5359: type, result, pointer, stride, column-major
 * bool id, [memory operands]) becomes 4457 (type, result, pointer, layout id (RowMajor 0 / ColumnMajor 1), stride,
 * [memory operands]), Store (5360: pointer, object, stride, column-major, [..]) becomes 4458 (pointer, object,
 * layout, stride, [..]); MulAdd (5361 -> 4459) and Length (5362 -> 4460) keep their operands. Because KHR matrix
 * types carry their use, one NV type that serves as both A and B operand is split: every id of that type (or of a
 * pointer to it, an array of it, a pointer to such an array) joins a class with the ids it exchanges values with
 * (union-find over loads, stores, copies, phis, selects, access chains, composites, element-wise arithmetic); a
 * class that reaches a MulAdd's A operand takes the A type, one reaching B the B type (the original type id stays
 * the A version; B versions get new ids); a class reaching both, or an id used by an instruction outside the table
 * below, fails the rewrite. */
#include "backend/vulkan/spv_khr.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SH_UNKNOWN, SH_N, SH_R, SH_TR }; /* no result, result only, result type + result */

/* Result shape of the opcodes this rewriter knows (core SPIR-V 1.6 and the cooperative-matrix ones). */
static int op_shape(uint32_t op) {
    static const uint16_t none[] = {0,   2,   3,   4,   5,   6,   8,   10,  14,  15,  16,  17,  39,  56,
                                    62,  63,  64,  71,  72,  74,  75,  224, 225, 228, 246, 247, 249, 250,
                                    251, 252, 253, 254, 255, 256, 257, 317, 330, 331, 332, 4416, 5360, 4458};
    static const uint16_t res[] = {7, 11, 73, 248, 5358, 4456};
    static const uint16_t tr_ranges[][2] = {{1, 1},     {12, 12},   {41, 46},   {48, 52},   {54, 55},
                                            {57, 57},   {59, 61},   {65, 70},   {77, 84},   {109, 124},
                                            {126, 191}, {194, 205}, {207, 215}, {227, 227}, {229, 242},
                                            {245, 245}, {333, 366}, {400, 403}, {4457, 4457}, {4459, 4460},
                                            {5359, 5359}, {5361, 5362}};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
        if (op == none[i]) return SH_N;
    for (size_t i = 0; i < sizeof res / sizeof res[0]; i++)
        if (op == res[i]) return SH_R;
    if (op >= 19 && op <= 38) return SH_R; /* OpTypeVoid .. OpTypePipe */
    for (size_t i = 0; i < sizeof tr_ranges / sizeof tr_ranges[0]; i++)
        if (op >= tr_ranges[i][0] && op <= tr_ranges[i][1]) return SH_TR;
    return SH_UNKNOWN;
}

typedef struct rw {
    const uint32_t *w;
    size_t n, bound;
    char *msg;
    size_t cap;
    uint32_t *type_of; /* [bound] result type of value ids, 0 for others */
    uint8_t *kind;     /* [bound] K_* of type ids */
    uint32_t *base;    /* [bound] for derived types: the matrix type they are built on */
    uint32_t *parent;  /* [bound] union-find over ids of split-derived types */
    uint8_t *use;      /* [bound] at class roots: 1 reaches A, 2 reaches B */
    uint32_t *b_of;    /* [bound] B version of split-derived type ids (0 = none) */
    int8_t *boolc;     /* [bound] OpConstantTrue 1 / OpConstantFalse 0 / other -1 */
} rw;

enum { K_NONE, K_COOPMAT, K_DERIVED }; /* kind of a type id: NV matrix type, pointer / array built on one */
enum { R_ACC = 1, R_AB = 2 };          /* roles of a matrix type in MulAdds */

static int fail(rw *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, r->cap, fmt, ap);
    va_end(ap);
    return -1;
}

static uint32_t find(rw *r, uint32_t x) {
    while (r->parent[x] != x) x = r->parent[x] = r->parent[r->parent[x]];
    return x;
}
static void unite(rw *r, uint32_t a, uint32_t b) {
    a = find(r, a), b = find(r, b);
    if (a != b) r->parent[a] = b, r->use[b] |= r->use[a];
}

/* The matrix type an id's type is built on, if that type is split (0 otherwise). */
static uint32_t split_base(const rw *r, const uint8_t *split, uint32_t id) {
    if (id == 0 || id >= r->bound) return 0;
    uint32_t t = r->type_of[id];
    if (!t) return 0;
    uint32_t b = r->kind[t] == K_COOPMAT ? t : r->kind[t] == K_DERIVED ? r->base[t] : 0;
    return b && split[b] ? b : 0;
}

/* Appends words to the output. */
typedef struct outbuf {
    uint32_t *w;
    size_t n, cap;
} outbuf;
static int put(outbuf *o, const uint32_t *w, size_t k) {
    if (o->n + k > o->cap) {
        size_t c = (o->n + k) * 2;
        uint32_t *nw = realloc(o->w, c * sizeof *nw);
        if (!nw) return -1;
        o->w = nw, o->cap = c;
    }
    memcpy(o->w + o->n, w, k * sizeof *w);
    o->n += k;
    return 0;
}

/* OpExtension with a string literal (nul-terminated, padded to words). */
static int put_ext(outbuf *o, const char *s) {
    uint32_t ins[16] = {0};
    size_t len = strlen(s), words = len / 4 + 1;
    memcpy(ins + 1, s, len);
    ins[0] = (uint32_t)((1 + words) << 16) | 10u;
    return put(o, ins, 1 + words);
}

static int ext_is(const uint32_t *ins, uint32_t wc, const char *s) {
    size_t len = strlen(s);
    return (wc - 1) * 4 > len && !memcmp(ins + 1, s, len + 1);
}

static int scan(rw *r, uint8_t *split, uint8_t *roles) {
    const uint32_t *w = r->w;
    int have_cap = 0, have_vmm = 0, vk_model = 0;
    for (size_t i = 5; i < r->n;) {
        uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
        if (wc == 0 || i + wc > r->n) return fail(r, "malformed module: instruction at word %zu runs past the end", i);
        const uint32_t *p = w + i;
        int sh = op_shape(op);
        if (sh == SH_UNKNOWN) return fail(r, "opcode %u (word %zu) is not in the rewriter's table", op, i);
        if ((sh == SH_TR && wc < 3) || (sh == SH_R && wc < 2))
            return fail(r, "malformed module: opcode %u at word %zu too short", op, i);
        uint32_t res = sh == SH_TR ? p[2] : sh == SH_R ? p[1] : 0;
        if (res >= r->bound) return fail(r, "malformed module: id %u at word %zu is past the bound %zu", res, i, r->bound);
        if (sh == SH_TR) r->type_of[res] = p[1];
        if (op == 17 && p[1] == G3SPV_CAP_COOPMAT_NV) have_cap = 1;
        if (op == 17 && p[1] == G3SPV_CAP_VULKAN_MEMORY_MODEL) have_vmm = 1;
        if (op == 14 && wc >= 3) vk_model = p[2] == 3; /* OpMemoryModel addressing Vulkan */
        if (op == 41 || op == 42) r->boolc[res] = op == 41;
        if (op == G3SPV_OP_TYPE_COOPMAT_NV) {
            if (wc != 6) return fail(r, "OpTypeCooperativeMatrixNV %%%u: %u words, expected 6", res, wc);
            r->kind[res] = K_COOPMAT;
        }
        if ((op == 32 && wc == 4) || (op == 28 && wc == 4) || (op == 29 && wc == 3)) { /* pointer, array, runtime array */
            uint32_t e = op == 32 ? p[3] : p[2];
            if (e < r->bound && r->kind[e] != K_NONE) {
                r->kind[res] = K_DERIVED;
                r->base[res] = r->kind[e] == K_COOPMAT ? e : r->base[e];
            }
        }
        if (op == 30 || op == 33) /* struct members, function parameters / return */
            for (uint32_t k = 2; k < wc; k++)
                if (p[k] < r->bound && r->kind[p[k]] != K_NONE)
                    return fail(r, "%s %%%u holds a cooperative matrix: not handled", op == 30 ? "struct" : "function type",
                                res);
        if (op == G3SPV_OP_COOPMAT_MULADD_NV) {
            if (wc != 6) return fail(r, "OpCooperativeMatrixMulAddNV at word %zu: %u words", i, wc);
            uint32_t ta = r->type_of[p[3]], tb = r->type_of[p[4]], tc = r->type_of[p[5]];
            if (!ta || !tb || !tc || r->kind[ta] != K_COOPMAT || r->kind[tb] != K_COOPMAT || r->kind[tc] != K_COOPMAT ||
                r->kind[p[1]] != K_COOPMAT)
                return fail(r, "OpCooperativeMatrixMulAddNV %%%u: operands not of matrix types defined before", p[2]);
            roles[ta] |= R_AB, roles[tb] |= R_AB, roles[tc] |= R_ACC, roles[p[1]] |= R_ACC;
        }
        i += wc;
    }
    if (!have_cap) return fail(r, "no OpCapability CooperativeMatrixNV: not an NV cooperative-matrix module");
    if (!have_vmm || !vk_model)
        return fail(r, "the module does not use the Vulkan memory model, which SPV_KHR_cooperative_matrix requires");
    for (size_t t = 0; t < r->bound; t++) {
        if (r->kind[t] != K_COOPMAT) continue;
        if (roles[t] == (R_ACC | R_AB))
            return fail(r, "matrix type %%%zu is both a MulAdd accumulator and an A/B operand: not handled", t);
        split[t] = !(roles[t] & R_ACC); /* operands (and unused types) split into A and B versions */
    }
    return 0;
}

/* Union-find over the ids of split-derived types: which values, variables and pointers exchange matrices. */
static int classes(rw *r, const uint8_t *split) {
    const uint32_t *w = r->w;
    int in_fn = 0; /* past the first OpFunction: the literals of the preamble (OpSource 450, ...) are not ids */
    for (size_t i = 5; i < r->n; i += w[i] >> 16) {
        uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
        const uint32_t *p = w + i;
        int sh = op_shape(op);
        in_fn |= op == 54;
        if (sh == SH_R) continue; /* types, labels, strings */
        uint32_t res = sh == SH_TR ? p[2] : 0, rb = sh == SH_TR ? split_base(r, split, res) : 0;
        switch (op) {
        case G3SPV_OP_COOPMAT_MULADD_NV:
            if (split_base(r, split, p[3])) r->use[find(r, p[3])] |= 1;
            if (split_base(r, split, p[4])) r->use[find(r, p[4])] |= 2;
            continue;
        case G3SPV_OP_COOPMAT_LOAD_NV: case G3SPV_OP_COOPMAT_STORE_NV: /* pointers to scalars; the value's class */
            continue;
        case G3SPV_OP_COOPMAT_LENGTH_NV:
            if (p[3] < r->bound && r->kind[p[3]] == K_COOPMAT && split[p[3]])
                return fail(r, "OpCooperativeMatrixLengthNV of the split type %%%u: not handled", p[3]);
            continue;
        case 61: /* OpLoad */
            if (rb) unite(r, res, p[3]);
            continue;
        case 62: /* OpStore */
            if (split_base(r, split, p[1])) unite(r, p[1], p[2]);
            continue;
        case 59: /* OpVariable [initializer] */
            if (rb && wc > 4) unite(r, res, p[4]);
            continue;
        case 65: case 66: /* OpAccessChain: the base and the pointer into it */
        case 81:          /* OpCompositeExtract: a matrix out of an array of them */
            if (rb && split_base(r, split, p[3])) unite(r, res, p[3]);
            continue;
        case 245: /* OpPhi (value, block) pairs */
            for (uint32_t k = 3; rb && k < wc; k += 2) unite(r, res, p[k]);
            continue;
        case 169: /* OpSelect cond a b */
            if (rb) unite(r, res, p[4]), unite(r, res, p[5]);
            continue;
        case 83: case 400:       /* OpCopyObject, OpCopyLogical */
        case 82: case 80:        /* OpCompositeInsert / Construct: matrix constituents */
        case 126: case 127: case 128: case 129: case 130: case 131: case 132: case 133: case 134: case 135: case 136:
        case 143:                /* negate, add, sub, mul, div; OpMatrixTimesScalar */
            for (uint32_t k = 3; rb && k < wc; k++)
                if (split_base(r, split, p[k])) unite(r, res, p[k]);
            continue;
        default: break;
        }
        /* any other instruction must neither produce nor take a split matrix (a literal that happens to equal such an
         * id fails here too: rather a clear build error than a guess) */
        if (rb) return fail(r, "opcode %u makes %%%u of a split cooperative-matrix type: not handled", op, res);
        for (uint32_t k = sh == SH_TR ? 3 : 1; in_fn && k < wc; k++)
            if (split_base(r, split, p[k]))
                return fail(r, "opcode %u (word %zu) uses %%%u of a split cooperative-matrix type: not handled", op, i,
                            p[k]);
    }
    return 0;
}

/* The type an id of a split-derived type takes: its original type (the A version) or the B version. */
static uint32_t retype(rw *r, const uint8_t *split, uint32_t id, uint32_t t) {
    if (!split_base(r, split, id)) return t;
    int u = r->use[find(r, id)];
    return u == 2 ? r->b_of[t] : t;
}

static int emit(rw *r, const uint8_t *split, uint32_t cst[3], uint32_t *ins, outbuf *o) {
    const uint32_t *w = r->w;
    uint32_t hdr[5] = {w[0], w[1], w[2], 0, w[4]};
    if (put(o, hdr, 5)) return fail(r, "out of memory");
    int consts = 0;
    for (size_t i = 5; i < r->n; i += w[i] >> 16) {
        uint32_t wc = w[i] >> 16, op = w[i] & 0xffff;
        const uint32_t *p = w + i;
        memcpy(ins, p, wc * 4); /* ins: room for the longest instruction (65535 words) */
        int rc = 0;
        if (op == 17 && p[1] == G3SPV_CAP_COOPMAT_NV) {
            ins[1] = G3SPV_CAP_COOPMAT_KHR;
            rc = put(o, ins, wc);
        } else if (op == 10 && ext_is(p, wc, "SPV_NV_cooperative_matrix")) {
            rc = put_ext(o, "SPV_KHR_cooperative_matrix");
        } else if (op == 21 && wc == 4 && p[2] == 32 && p[3] == 0 && !consts) { /* uint: the Use / layout constants */
            rc = put(o, ins, wc);
            for (uint32_t v = 0; v < 3 && !rc; v++) {
                uint32_t c[4] = {(4u << 16) | 43u, p[1], cst[v], v};
                rc = put(o, c, 4);
            }
            consts = 1;
        } else if (op == G3SPV_OP_TYPE_COOPMAT_NV) {
            if (!consts) return fail(r, "matrix type %%%u declared before a 32-bit uint type", p[1]);
            uint32_t t[7] = {(7u << 16) | G3SPV_OP_TYPE_COOPMAT_KHR, p[1], p[2], p[3], p[4], p[5],
                             split[p[1]] ? cst[G3SPV_USE_A] : cst[G3SPV_USE_ACC]};
            rc = put(o, t, 7);
            if (!rc && split[p[1]]) {
                t[1] = r->b_of[p[1]], t[6] = cst[G3SPV_USE_B];
                rc = put(o, t, 7);
            }
        } else if ((op == 32 || op == 28 || op == 29) && r->kind[p[1]] == K_DERIVED && split[r->base[p[1]]]) {
            rc = put(o, ins, wc); /* the A version, then the B one over the element's B version */
            ins[1] = r->b_of[p[1]];
            ins[op == 32 ? 3 : 2] = r->b_of[p[op == 32 ? 3 : 2]];
            if (!rc) rc = put(o, ins, wc);
        } else if (op == G3SPV_OP_COOPMAT_LOAD_NV || op == G3SPV_OP_COOPMAT_STORE_NV) {
            int ld = op == G3SPV_OP_COOPMAT_LOAD_NV;
            uint32_t s = ld ? 4 : 3; /* stride, then the column-major bool */
            if (wc < s + 2) return fail(r, "cooperative matrix %s at word %zu: %u words", ld ? "load" : "store", i, wc);
            uint32_t cm = p[s + 1];
            if (cm >= r->bound || r->boolc[cm] < 0)
                return fail(r, "cooperative matrix %s at word %zu: ColumnMajor %%%u is not a boolean constant",
                            ld ? "load" : "store", i, cm);
            ins[0] = (wc << 16) | (ld ? G3SPV_OP_COOPMAT_LOAD_KHR : G3SPV_OP_COOPMAT_STORE_KHR);
            if (ld) ins[1] = retype(r, split, p[2], p[1]);
            ins[s] = cst[r->boolc[cm] ? G3SPV_LAYOUT_COL : G3SPV_LAYOUT_ROW];
            ins[s + 1] = p[s];
            rc = put(o, ins, wc);
        } else if (op == G3SPV_OP_COOPMAT_MULADD_NV || op == G3SPV_OP_COOPMAT_LENGTH_NV) {
            ins[0] = (wc << 16) | (op == G3SPV_OP_COOPMAT_MULADD_NV ? G3SPV_OP_COOPMAT_MULADD_KHR
                                                                    : G3SPV_OP_COOPMAT_LENGTH_KHR);
            rc = put(o, ins, wc);
        } else {
            if (op_shape(op) == SH_TR) ins[1] = retype(r, split, p[2], p[1]);
            rc = put(o, ins, wc);
        }
        if (rc) return fail(r, "out of memory");
    }
    if (!consts) return fail(r, "the module declares no 32-bit uint type for the Use constants");
    return 0;
}

int g3vk_spv_nv_to_khr(const uint32_t *in, size_t n, uint32_t **out, size_t *n_out, char *msg, size_t cap) {
    *out = NULL, *n_out = 0;
    if (msg && cap) msg[0] = 0;
    char dummy[8];
    rw r = {.w = in, .n = n, .msg = msg ? msg : dummy, .cap = msg ? cap : sizeof dummy};
    if (n < 5 || in[0] != 0x07230203u) return fail(&r, "not a SPIR-V module (%zu words, magic 0x%08x)", n, n ? in[0] : 0);
    if (in[3] == 0 || in[3] > (1u << 24)) return fail(&r, "implausible id bound %u", in[3]);
    r.bound = in[3];
    size_t b = r.bound;
    r.type_of = calloc(b, sizeof *r.type_of), r.kind = calloc(b, 1), r.base = calloc(b, sizeof *r.base);
    r.parent = calloc(b, sizeof *r.parent), r.use = calloc(b, 1), r.b_of = calloc(b, sizeof *r.b_of);
    r.boolc = malloc(b);
    uint8_t *split = calloc(b, 1), *roles = calloc(b, 1);
    uint32_t *ins = malloc(65536 * sizeof *ins);
    outbuf o = {0};
    int rc = -1;
    if (!r.type_of || !r.kind || !r.base || !r.parent || !r.use || !r.b_of || !r.boolc || !split || !roles || !ins) {
        fail(&r, "out of memory");
        goto done;
    }
    memset(r.boolc, -1, b);
    for (size_t i = 0; i < b; i++) r.parent[i] = (uint32_t)i;
    if (scan(&r, split, roles) || classes(&r, split)) goto done;
    /* new ids: the three constants, then a B version of every split-derived type */
    uint32_t next = (uint32_t)b, cst[3] = {next, next + 1, next + 2};
    next += 3;
    for (size_t t = 0; t < b; t++)
        if ((r.kind[t] == K_COOPMAT && split[t]) || (r.kind[t] == K_DERIVED && split[r.base[t]])) r.b_of[t] = next++;
    for (size_t id = 0; id < b; id++) /* a class reaching both operands cannot take one type */
        if (split_base(&r, split, (uint32_t)id) && r.use[find(&r, (uint32_t)id)] == 3) {
            fail(&r, "%%%zu (of a split cooperative-matrix type) reaches both a MulAdd's A and its B operand", id);
            goto done;
        }
    if (emit(&r, split, cst, ins, &o)) goto done;
    o.w[3] = next;
    *out = o.w, *n_out = o.n, o.w = NULL;
    rc = 0;
done:
    free(o.w), free(r.type_of), free(r.kind), free(r.base), free(r.parent), free(r.use), free(r.b_of), free(r.boolc);
    free(split), free(roles), free(ins);
    return rc;
}
