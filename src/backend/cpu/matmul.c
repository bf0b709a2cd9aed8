/* CPU matmul driver: picks the kernel set at run time, prepares (quantizes) activations, and runs the tiles in
 * parallel with cache blocking.
 *
 * Blocking: each thread owns a contiguous range of output channels (weight rows), so every weight byte is read
 * by one thread. For large m the k dimension is cut into chunks and the m rows into blocks so that one block of
 * prepared activations (MB rows x KC values) stays in L2 while the thread's weight rows stream past it; inside a
 * tile the kernel walks NR weight rows at a time (kept in L1) against MR activation rows. Decode (m = 1) is one
 * tile per thread over the whole k: a plain streaming GEMV. */
#include "backend/cpu/matmul.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "core/fp16.h"
#include "model/dtype.h"

#define ALIGN 64
#define L2_BUDGET (384 * 1024) /* bytes of prepared activations per block */
#define L1_BUDGET (40 * 1024)
#define MB_MAX 128

/* ---- kernel set selection ---------------------------------------------------------------------------------- */

static _Atomic(const g3_kernel_set *) g_set;

static const g3_kernel_set *set_by_name(const char *name) {
    if (!strcmp(name, "scalar")) return g3_kernels_scalar();
    if (!strcmp(name, "avx2")) return g3_kernels_avx2();
    if (!strcmp(name, "avx512")) return g3_kernels_avx512();
    return NULL;
}

static const g3_kernel_set *kset(void) {
    const g3_kernel_set *s = atomic_load_explicit(&g_set, memory_order_acquire);
    if (s) return s;
    const char *e = getenv("G3_CPU_KERNELS");
    if (e && *e) s = set_by_name(e);
    if (!s) s = g3_kernels_avx512();
    if (!s) s = g3_kernels_avx2();
    if (!s) s = g3_kernels_scalar();
    atomic_store_explicit(&g_set, s, memory_order_release);
    return s;
}

const char *g3_cpu_kernels_name(void) { return kset()->name; }

int g3_cpu_kernels_select(const char *name) {
    const g3_kernel_set *s = set_by_name(name);
    if (!s) return -1;
    atomic_store_explicit(&g_set, s, memory_order_release);
    return 0;
}

static g3_tile_fn tile_fn(const g3_kernel_set *s, uint32_t wtype) {
    switch (wtype) {
    case G3_CPU_Q8_0_R8: return s->q8_0_r8 ? s->q8_0_r8 : g3_kernels_scalar()->q8_0_r8;
    case G3_CPU_Q4_0_R8: return s->q4_0_r8 ? s->q4_0_r8 : g3_kernels_scalar()->q4_0_r8;
    case G3_CPU_Q5_0_R8: return s->q5_0_r8 ? s->q5_0_r8 : g3_kernels_scalar()->q5_0_r8;
    case G3_CPU_Q4_1_R8: return s->q4_1_r8 ? s->q4_1_r8 : g3_kernels_scalar()->q4_1_r8;
    case G3_CPU_Q5_1_R8: return s->q5_1_r8 ? s->q5_1_r8 : g3_kernels_scalar()->q5_1_r8;
    case G3_CPU_Q4_K_R8: return s->q4_k_r8 ? s->q4_k_r8 : g3_kernels_scalar()->q4_k_r8;
    case G3_CPU_Q6_K_R8: return s->q6_k_r8 ? s->q6_k_r8 : g3_kernels_scalar()->q6_k_r8;
    case G3_CPU_Q5_K_R8: return s->q5_k_r8 ? s->q5_k_r8 : g3_kernels_scalar()->q5_k_r8;
    case G3_DTYPE_F32: return s->f32;
    case G3_DTYPE_F16: return s->f16;
    case G3_DTYPE_BF16: return s->bf16;
    case G3_DTYPE_Q8_0: return s->q8_0;
    case G3_DTYPE_Q4_0: return s->q4_0;
    case G3_DTYPE_Q4_K: return s->q4_k;
    case G3_DTYPE_Q6_K: return s->q6_k;
    case G3_DTYPE_Q4_1: return s->q4_1 ? s->q4_1 : g3_kernels_scalar()->q4_1;
    case G3_DTYPE_Q5_0: return s->q5_0 ? s->q5_0 : g3_kernels_scalar()->q5_0;
    case G3_DTYPE_Q5_1: return s->q5_1 ? s->q5_1 : g3_kernels_scalar()->q5_1;
    case G3_DTYPE_Q5_K: return s->q5_k ? s->q5_k : g3_kernels_scalar()->q5_k;
    default: return NULL;
    }
}

/* ---- activation layouts ------------------------------------------------------------------------------------- */

static int layout_for(uint32_t wtype, const g3_kernel_set *s) {
    switch (wtype) {
    case G3_DTYPE_BF16: return s->bf16_layout;
    case G3_DTYPE_Q8_0: return G3_ACT_Q8U;
    case G3_DTYPE_Q4_0:
    case G3_DTYPE_Q4_1:
    case G3_DTYPE_Q5_0:
    case G3_DTYPE_Q5_1:
    case G3_CPU_Q8_0_R8:
    case G3_CPU_Q4_0_R8:
    case G3_CPU_Q5_0_R8:
    case G3_CPU_Q4_1_R8:
    case G3_CPU_Q5_1_R8: return G3_ACT_Q8S;
    case G3_DTYPE_Q4_K:
    case G3_DTYPE_Q5_K:
    case G3_DTYPE_Q6_K:
    case G3_CPU_Q4_K_R8:
    case G3_CPU_Q5_K_R8:
    case G3_CPU_Q6_K_R8: return G3_ACT_Q8K;
    default: return G3_ACT_F32;
    }
}

static size_t align_up(size_t v) { return (v + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* Bytes of one prepared row (0 for F32, which uses x in place). */
static size_t layout_row_bytes(int layout, int k) {
    size_t K = (size_t)k;
    switch (layout) {
    case G3_ACT_BF16X2: return align_up(4 * K);
    case G3_ACT_Q8U: return align_up(K + 4 * (K / 32));
    case G3_ACT_Q8S: return align_up(K + 8 * (K / 32));
    case G3_ACT_Q8K: return align_up(K + 4 * (K / 256) + 2 * (K / 16));
    default: return 0;
    }
}

/* Q8_0 weights get a second pass over the residual of the activations: with 8-bit activations alone, a model of
 * Q8_0 weights drifts measurably from the float reference (mean KL 0.013 on the tiny fixture); with the residual
 * pass the activations are good to ~2^-15 and only the weights' own rounding remains. Integer dot products are
 * cheap next to the memory traffic, and the pass reuses each weight block from L2 (mm_task). */
static int wants_residual(uint32_t wtype) { return wtype == G3_DTYPE_Q8_0 || wtype == G3_CPU_Q8_0_R8; }

size_t g3_act_scratch_bytes(uint32_t wtype, int m, int k) {
    if (m <= 0 || k <= 0) return 0;
    int layout = wtype == G3_DTYPE_BF16 ? G3_ACT_BF16X2 : layout_for(wtype, g3_kernels_scalar());
    size_t rb = layout_row_bytes(layout, k);
    /* Q8_0 weights may be repacked (Q8S activations, a little larger than Q8U): cover both */
    if (layout == G3_ACT_Q8U) rb = layout_row_bytes(G3_ACT_Q8S, k);
    return rb ? rb * (size_t)m * (wants_residual(wtype) ? 2 : 1) + ALIGN : 0;
}

/* Quantizes 32 (Q8U/Q8S) values: returns the scale, writes q (int8, or +128 when `offset`). */
static float quant_block32(const float *x, uint8_t *q, int offset, int *sum) {
    float amax = 0;
    for (int j = 0; j < 32; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax; /* not fmaxf: that is a libm call without -ffast-math */
    }
    float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    int s = 0;
    for (int j = 0; j < 32; j++) {
        float v = x[j] * id;
        int qi = (int)(v + (v >= 0 ? 0.5f : -0.5f));
        s += qi;
        q[j] = (uint8_t)(qi + offset);
    }
    *sum = s;
    return d;
}

static void prepare_row(int layout, const float *x, int k, uint8_t *row) {
    switch (layout) {
    case G3_ACT_BF16X2: {
        uint16_t *hi = (uint16_t *)row, *lo = hi + k;
        for (int i = 0; i < k; i++) {
            hi[i] = g3_f32_to_bf16(x[i]);
            lo[i] = g3_f32_to_bf16(x[i] - g3_bf16_to_f32(hi[i]));
        }
        break;
    }
    case G3_ACT_Q8U:
    case G3_ACT_Q8S: {
        float *d = (float *)(row + k);
        int32_t *ns = (int32_t *)(d + k / 32);
        for (int b = 0; b < k / 32; b++) {
            int sum;
            d[b] = quant_block32(x + 32 * b, row + 32 * b, layout == G3_ACT_Q8U ? 128 : 0, &sum);
            if (layout == G3_ACT_Q8S) ns[b] = -sum;
        }
        break;
    }
    case G3_ACT_Q8K: {
        float *d = (float *)(row + k);
        int16_t *bs = (int16_t *)(d + k / 256);
        int8_t *q = (int8_t *)row;
        for (int b = 0; b < k / 256; b++) {
            const float *xb = x + 256 * b;
            float amax = 0;
            for (int j = 0; j < 256; j++) {
                float a = fabsf(xb[j]);
                amax = a > amax ? a : amax;
            }
            float id = amax > 0 ? 127.0f / amax : 0.0f;
            d[b] = amax / 127.0f;
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 16 * g; j < 16 * g + 16; j++) {
                    float v = xb[j] * id;
                    int qi = (int)(v + (v >= 0 ? 0.5f : -0.5f));
                    q[256 * b + j] = (int8_t)qi;
                    s += qi;
                }
                bs[16 * b + g] = (int16_t)s;
            }
        }
        break;
    }
    default: break;
    }
}

/* The residual of one prepared Q8U/Q8S row: r = x - dequant(row), quantized in the same layout into out. */
static void prepare_residual(int layout, const float *x, int k, const uint8_t *row, uint8_t *out) {
    const float *d = (const float *)(row + k);
    float *d2 = (float *)(out + k);
    int32_t *ns = (int32_t *)(d2 + k / 32);
    int offset = layout == G3_ACT_Q8U ? 128 : 0;
    for (int b = 0; b < k / 32; b++) {
        float r[32];
        const uint8_t *q = row + 32 * b;
        for (int j = 0; j < 32; j++) r[j] = x[32 * b + j] - d[b] * (float)((int)(int8_t)(uint8_t)(q[j] ^ (uint8_t)offset));
        int sum;
        d2[b] = quant_block32(r, out + 32 * b, offset, &sum);
        if (layout == G3_ACT_Q8S) ns[b] = -sum;
    }
}

typedef struct prep_job {
    const g3_act *a;
    const float *x;
} prep_job;

static void prep_task(void *arg, int ith, int nth) {
    prep_job *j = arg;
    long r0, r1;
    g3_split_range(j->a->m, 1, ith, nth, &r0, &r1);
    g3_prep_fn fn = ((const g3_kernel_set *)j->a->kset)->prep;
    if (!fn) fn = prepare_row;
    for (long r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * j->a->k;
        uint8_t *row = (uint8_t *)j->a->q + (size_t)r * j->a->xs;
        fn(j->a->layout, x, j->a->k, row);
        if (j->a->q2) prepare_residual(j->a->layout, x, j->a->k, row, (uint8_t *)j->a->q2 + (size_t)r * j->a->xs);
    }
}

void g3_act_prepare(g3_pool *p, g3_act *a, uint32_t wtype, const float *x, int m, int k, void *scratch) {
    const g3_kernel_set *s = kset();
    a->kset = s;
    a->wtype = wtype;
    a->m = m;
    a->k = k;
    a->x = x;
    a->layout = layout_for(wtype, s);
    a->xs = layout_row_bytes(a->layout, k);
    a->q2 = NULL;
    if (a->layout == G3_ACT_F32) {
        a->q = NULL;
        a->xs = (size_t)k * sizeof(float);
        return;
    }
    a->q = (void *)(((uintptr_t)scratch + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
    a->q2 = wants_residual(wtype) ? (uint8_t *)a->q + (size_t)m * a->xs : NULL;
    prep_job j = {a, x};
    if ((size_t)m * (size_t)k < 65536 || m < 2) prep_task(&j, 0, 1);
    else g3_pool_run(p, prep_task, &j);
}

void g3_act_dequant_row(const g3_act *a, int r, float *out) {
    int k = a->k;
    const uint8_t *row = (const uint8_t *)a->q + (size_t)r * a->xs;
    switch (a->layout) {
    case G3_ACT_BF16X2: {
        const uint16_t *hi = (const uint16_t *)row, *lo = hi + k;
        for (int i = 0; i < k; i++) out[i] = g3_bf16_to_f32(hi[i]) + g3_bf16_to_f32(lo[i]);
        break;
    }
    case G3_ACT_Q8U:
    case G3_ACT_Q8S: {
        const float *d = (const float *)(row + k);
        for (int i = 0; i < k; i++)
            out[i] = d[i / 32] * (a->layout == G3_ACT_Q8U ? (float)((int)row[i] - 128) : (float)(int8_t)row[i]);
        if (a->q2) { /* plus the residual pass */
            const uint8_t *r2 = (const uint8_t *)a->q2 + (size_t)r * a->xs;
            const float *d2 = (const float *)(r2 + k);
            for (int i = 0; i < k; i++)
                out[i] += d2[i / 32] * (a->layout == G3_ACT_Q8U ? (float)((int)r2[i] - 128) : (float)(int8_t)r2[i]);
        }
        break;
    }
    case G3_ACT_Q8K: {
        const float *d = (const float *)(row + k);
        for (int i = 0; i < k; i++) out[i] = d[i / 256] * (float)(int8_t)row[i];
        break;
    }
    default: memcpy(out, a->x + (size_t)r * k, sizeof(float) * (size_t)k); break;
    }
}

/* ---- repacked weights ----------------------------------------------------------------------------------------- */

/* The repacked forms: type id, source type, form (kernels.h: its block layout) */
typedef struct r8_form { uint32_t rtype, src; int form; } r8_form;
static const r8_form k_r8[] = {
    {G3_CPU_Q8_0_R8, G3_DTYPE_Q8_0, G3_R8_Q8_0}, {G3_CPU_Q4_0_R8, G3_DTYPE_Q4_0, G3_R8_Q4_0},
    {G3_CPU_Q5_0_R8, G3_DTYPE_Q5_0, G3_R8_Q5_0}, {G3_CPU_Q4_1_R8, G3_DTYPE_Q4_1, G3_R8_Q4_1},
    {G3_CPU_Q5_1_R8, G3_DTYPE_Q5_1, G3_R8_Q5_1}, {G3_CPU_Q4_K_R8, G3_DTYPE_Q4_K, G3_R8_Q4_K},
    {G3_CPU_Q6_K_R8, G3_DTYPE_Q6_K, G3_R8_Q6_K}, {G3_CPU_Q5_K_R8, G3_DTYPE_Q5_K, G3_R8_Q5_K},
};

static const r8_form *r8_by_src(uint32_t type) {
    for (size_t i = 0; i < sizeof k_r8 / sizeof k_r8[0]; i++)
        if (k_r8[i].src == type) return &k_r8[i];
    return NULL;
}

static const r8_form *r8_by_rtype(uint32_t rtype) {
    for (size_t i = 0; i < sizeof k_r8 / sizeof k_r8[0]; i++)
        if (k_r8[i].rtype == rtype) return &k_r8[i];
    return NULL;
}

uint32_t g3_matmul_repack_source(uint32_t rtype) {
    const r8_form *f = r8_by_rtype(rtype);
    return f ? f->src : 0;
}

size_t g3_matmul_repack_bytes(uint32_t type, int n, int k) {
    const r8_form *f = r8_by_src(type);
    const int blk = f ? g3_dtype_get(type)->block : 0;
    if (!f || n <= 0 || n % 8 || k <= 0 || k % blk) return 0;
    return (size_t)(n / 8) * (size_t)(k / blk) * (size_t)g3_r8_bytes(f->form);
}

uint32_t g3_matmul_repack_type(uint32_t type, int n, int k) {
    if (!g3_matmul_repack_bytes(type, n, k)) return 0;
    const g3_kernel_set *s = kset();
    if (s == g3_kernels_scalar()) return 0; /* its repacked kernels are references, slower than the plain ones */
    const r8_form *f = r8_by_src(type);
    return f && tile_fn(s, f->rtype) != tile_fn(g3_kernels_scalar(), f->rtype) ? f->rtype : 0;
}

/* Q4_K_R8 / Q5_K_R8 (layouts in kernels.h): value l of sub-block s of row r is nibble s&1 of qs[32(s/2) + l] in the
 * source (Q5_K: its fifth bit is bit s of qh[l]). Both blocks start d, dmin, scales[12]; Q5_K's qs follow qh[32]. */
static void repack_q4k(const uint8_t *src, size_t rb, int g, int b, int five, uint8_t *out) {
    memset(out, 0, five ? 1440 : 1184); /* the nibbles and bits are or-ed in */
    const size_t sb_bytes = five ? 176 : 144;
    for (int r = 0; r < 8; r++) {
        const uint8_t *bp = src + (size_t)(8 * g + r) * rb + sb_bytes * (size_t)b;
        const uint8_t *sp = bp + 4, *qs_src = bp + (five ? 48 : 16), *qh = five ? bp + 16 : NULL;
        memcpy(out + G3_Q4KR8_D + 2 * r, bp, 2);
        memcpy(out + G3_Q4KR8_DMIN + 2 * r, bp + 2, 2);
        for (int s = 0; s < 8; s++) {
            int sc, m;
            g3_kq_scale_min(sp, s, &sc, &m);
            out[G3_Q4KR8_SC + 8 * s + r] = (uint8_t)sc;
            /* s = 4h + 2 second + t goes to lane 2r + h, pair position t of the first or second array */
            out[G3_Q4KR8_M + 32 * (s % 4 >= 2) + 2 * (2 * r + s / 4) + (s & 1)] = (uint8_t)m;
        }
        for (int s = 0; s < 8; s++) {
            uint8_t *o = out + G3_Q4KR8_Q + 128 * s;
            for (int v = 0; v < 32; v++) { /* value v: slice j = v/8, lane 2r + (v%8)/4, byte v%4 */
                int lane = 4 * (2 * r + (v % 8) / 4) + v % 4, j = v / 8, c = g3_kq_code(qs_src, qh, 32 * s + v);
                o[64 * (j / 2) + lane] |= (uint8_t)((c & 0x0F) << (4 * (j % 2)));
                if (c >> 4) out[G3_Q5KR8_H + 32 * s + 8 * j + lane / 8] |= (uint8_t)(1u << (lane % 8));
            }
        }
    }
}

/* Q6_K_R8 (layout in kernels.h) */
static void repack_q6k(const uint8_t *src, size_t rb, int g, int b, uint8_t *out) {
    memset(out, 0, 1680); /* nibbles and highs are or-ed in */
    for (int r = 0; r < 8; r++) {
        const g3_block_q6_k *blk = (const g3_block_q6_k *)(src + (size_t)(8 * g + r) * rb) + b;
        memcpy(out + 2 * r, &blk->d, 2);
        for (int gi = 0; gi < 16; gi++) out[G3_Q6KR8_SC + 8 * gi + r] = (uint8_t)blk->scales[gi];
        for (int i = 0; i < 256; i++) {
            int q = g3_q6k_code(blk, i);
            int s = i / 32, v = i % 32, j = v / 8, lane = 4 * (2 * r + (v % 8) / 4) + v % 4;
            out[G3_Q6KR8_Q + 128 * s + 64 * (j / 2) + lane] |= (uint8_t)((q & 0x0F) << (4 * (j % 2)));
            out[G3_Q6KR8_H + 64 * s + lane] |= (uint8_t)((q >> 4) << (2 * j));
        }
    }
}

/* Byte 4L+e (lane L = 2r+h) of 64-byte slice j holds value 8j+4h+e of row r. For the nibble types, slices 2s and
 * 2s+1 share the bytes of slice s (low / high nibble); with the source block's qs[i] = v[i] | v[i+16] << 4 that
 * byte is built from qs[4h+e] and qs[8+4h+e]: low nibbles for s = 0, high nibbles for s = 1. The fifth bits (Q5)
 * go to bit 4L+e of mask j. */
uint32_t g3_matmul_repack(uint32_t type, const void *w, int n, int k, void *dst) {
    const r8_form *f = r8_by_src(type);
    if (!g3_matmul_repack_bytes(type, n, k)) return 0;
    if (f->form == G3_R8_Q4_K || f->form == G3_R8_Q5_K || f->form == G3_R8_Q6_K) {
        const size_t bb = (size_t)g3_r8_bytes(f->form);
        for (int g = 0; g < n / 8; g++)
            for (int b = 0; b < k / 256; b++) {
                uint8_t *o = (uint8_t *)dst + ((size_t)g * (k / 256) + b) * bb;
                if (f->form == G3_R8_Q6_K) repack_q6k(w, g3_row_bytes(type, k), g, b, o);
                else repack_q4k(w, g3_row_bytes(type, k), g, b, f->form == G3_R8_Q5_K, o);
            }
        return f->rtype;
    }
    const int fm = f->form, five = g3_r8_five(fm), aff = g3_r8_aff(fm), qo = g3_r8_qoff(fm), ho = g3_r8_hoff(fm);
    const size_t rb = g3_row_bytes(type, k), sb = g3_dtype_get(type)->block_bytes;
    const size_t qs_at = sb - (fm == G3_R8_Q8_0 ? 32 : 16), qh_at = qs_at - 4; /* quants last, Q5's qh before */
    int nb = k / 32;
    const uint8_t *src = w;
    uint8_t *out = dst;
    for (int g = 0; g < n / 8; g++)
        for (int b = 0; b < nb; b++) {
            uint64_t hm[4] = {0, 0, 0, 0};
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = src + (size_t)(8 * g + r) * rb + (size_t)b * sb, *qs = blk + qs_at;
                memcpy(out + 2 * r, blk, 2); /* f16 scale */
                if (aff) memcpy(out + 16 + 2 * r, blk + 2, 2); /* f16 offset */
                uint32_t qh = 0;
                if (five) memcpy(&qh, blk + qh_at, 4);
                for (int h = 0; h < 2; h++)
                    for (int e = 0; e < 4; e++) {
                        int L = 2 * r + h;
                        if (fm == G3_R8_Q8_0) {
                            for (int j = 0; j < 4; j++) out[qo + 64 * j + 4 * L + e] = (uint8_t)(qs[8 * j + 4 * h + e] ^ 0x80);
                        } else {
                            uint8_t a0 = qs[4 * h + e], a1 = qs[8 + 4 * h + e];
                            out[qo + 4 * L + e] = (uint8_t)((a0 & 0x0F) | (a1 << 4));
                            out[qo + 64 + 4 * L + e] = (uint8_t)((a0 >> 4) | (a1 & 0xF0));
                            for (int j = 0; five && j < 4; j++)
                                hm[j] |= (uint64_t)((qh >> (8 * j + 4 * h + e)) & 1u) << (4 * L + e);
                        }
                    }
            }
            if (five) memcpy(out + ho, hm, sizeof hm);
            out += g3_r8_bytes(fm);
        }
    return f->rtype;
}

void g3_matmul_repacked_row(uint32_t rtype, const void *w, int k, long row, float *out) {
    const r8_form *f = r8_by_rtype(rtype);
    if (!f) return;
    if (f->form == G3_R8_Q6_K) { /* the same float operations as g3_dequant_row's Q6_K */
        const int r = (int)(row % 8), nb = k / 256;
        const uint8_t *grp = (const uint8_t *)w + (size_t)(row / 8) * nb * 1680;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = grp + (size_t)b * 1680;
            uint16_t dh;
            memcpy(&dh, blk + 2 * r, 2);
            const float d = g3_f16_to_f32(dh);
            for (int i = 0; i < 256; i++) {
                int s = i / 32, v = i % 32, j = v / 8, lane = 4 * (2 * r + (v % 8) / 4) + v % 4;
                int q = ((blk[G3_Q6KR8_Q + 128 * s + 64 * (j / 2) + lane] >> (4 * (j % 2))) & 0x0F) |
                        (((blk[G3_Q6KR8_H + 64 * s + lane] >> (2 * j)) & 3) << 4);
                out[256 * b + i] = d * (float)(int8_t)blk[G3_Q6KR8_SC + 8 * (i / 16) + r] * (float)(q - 32);
            }
        }
        return;
    }
    if (f->form == G3_R8_Q4_K || f->form == G3_R8_Q5_K) { /* the same float operations as g3_dequant_row's */
        const int r = (int)(row % 8), nb = k / 256, five = f->form == G3_R8_Q5_K;
        const size_t bb = (size_t)g3_r8_bytes(f->form);
        const uint8_t *grp = (const uint8_t *)w + (size_t)(row / 8) * nb * bb;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = grp + (size_t)b * bb;
            uint16_t dh, mh;
            memcpy(&dh, blk + G3_Q4KR8_D + 2 * r, 2);
            memcpy(&mh, blk + G3_Q4KR8_DMIN + 2 * r, 2);
            const float d = g3_f16_to_f32(dh), dmin = g3_f16_to_f32(mh);
            for (int s = 0; s < 8; s++) {
                const int m = blk[G3_Q4KR8_M + 32 * (s % 4 >= 2) + 2 * (2 * r + s / 4) + (s & 1)];
                const float sc = d * (float)blk[G3_Q4KR8_SC + 8 * s + r], mm = dmin * (float)m;
                for (int v = 0; v < 32; v++) {
                    int lane = 4 * (2 * r + (v % 8) / 4) + v % 4, j = v / 8;
                    int q = (blk[G3_Q4KR8_Q + 128 * s + 64 * (j / 2) + lane] >> (4 * (j % 2))) & 0x0F;
                    if (five) q |= ((blk[G3_Q5KR8_H + 32 * s + 8 * j + lane / 8] >> (lane % 8)) & 1) << 4;
                    out[256 * b + 32 * s + v] = sc * (float)q - mm;
                }
            }
        }
        return;
    }
    const int fm = f->form, nb = k / 32, r = (int)(row % 8), qo = g3_r8_qoff(fm), ho = g3_r8_hoff(fm);
    const size_t bb = (size_t)g3_r8_bytes(fm);
    const uint8_t *grp = (const uint8_t *)w + (size_t)(row / 8) * nb * bb;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = grp + (size_t)b * bb;
        uint16_t dh, mh = 0;
        memcpy(&dh, blk + 2 * r, 2);
        if (g3_r8_aff(fm)) memcpy(&mh, blk + 16 + 2 * r, 2);
        float d = g3_f16_to_f32(dh), m = g3_f16_to_f32(mh);
        for (int v = 0; v < 32; v++) {
            int lane = 4 * (2 * r + (v % 8) / 4) + v % 4, q;
            if (fm == G3_R8_Q8_0) {
                q = (int)blk[qo + 64 * (v / 8) + lane] - 128;
            } else {
                q = (blk[qo + 64 * (v / 16) + lane] >> (4 * ((v / 8) % 2))) & 0x0F;
                if (g3_r8_five(fm)) {
                    uint64_t hm;
                    memcpy(&hm, blk + ho + 8 * (v / 8), 8);
                    q |= (int)((hm >> lane) & 1u) << 4;
                }
                if (!g3_r8_aff(fm)) q -= g3_r8_five(fm) ? 16 : 8;
            }
            out[32 * b + v] = d * (float)q + m;
        }
    }
}

/* ---- the parallel blocked loop ------------------------------------------------------------------------------ */

typedef struct mm_job {
    const g3_act *a;
    const uint8_t *w;
    size_t wrb;          /* bytes per weight row */
    int n;
    float *y;
    int ldy;
    g3_tile_fn fn;
    int kc, mb, nb;      /* k chunk (values), m block (rows), n block (rows, multiple of 16) */
    int kalign;          /* values per weight block */
    size_t kbytes_blk;   /* bytes per weight block */
} mm_job;

static void mm_task(void *arg, int ith, int nth) {
    const mm_job *j = arg;
    const g3_act *a = j->a;
    long n0, n1;
    g3_split_range(j->n, 16, ith, nth, &n0, &n1);
    if (n0 >= n1) return;
    int k = a->k;
    const uint8_t *xbase = a->layout == G3_ACT_F32 ? (const uint8_t *)a->x : (const uint8_t *)a->q;
    for (int kc0 = 0; kc0 < k; kc0 += j->kc) {
        int kc = g3_kmin(j->kc, k - kc0);
        g3_tile t;
        t.k = kc;
        t.w = j->w + (size_t)n0 * j->wrb + (size_t)(kc0 / j->kalign) * j->kbytes_blk;
        t.ws = j->wrb;
        t.nw = (int)(n1 - n0);
        t.xs = a->xs;
        t.ldy = (size_t)j->ldy;
        t.accumulate = kc0 > 0;
        const uint8_t *w0 = t.w;
        int passes = a->q2 ? 2 : 1;
        for (long nb0 = n0; nb0 < n1; nb0 += j->nb)
        for (int pass = 0; pass < passes; pass++) /* the residual pass re-reads the weight block from L2 */
        for (int m0 = 0; m0 < a->m; m0 += j->mb) {
            const uint8_t *row = (pass ? (const uint8_t *)a->q2 : xbase) + (size_t)m0 * a->xs;
            t.accumulate = kc0 > 0 || pass > 0;
            t.w = w0 + (size_t)(nb0 - n0) * j->wrb;
            t.nw = (int)(n1 - nb0 < j->nb ? n1 - nb0 : j->nb);
            t.nx = g3_kmin(j->mb, a->m - m0);
            t.y = j->y + (size_t)m0 * j->ldy + nb0;
            t.xd = t.xe = NULL;
            switch (a->layout) {
            case G3_ACT_F32: t.xq = row + 4 * (size_t)kc0; break;
            case G3_ACT_BF16X2:
                t.xq = row + 2 * (size_t)kc0;
                t.xd = row + 2 * ((size_t)k + kc0);
                break;
            case G3_ACT_Q8U:
            case G3_ACT_Q8S:
                t.xq = row + kc0;
                t.xd = row + k + 4 * (size_t)(kc0 / 32);
                t.xe = row + k + 4 * (size_t)(k / 32) + 4 * (size_t)(kc0 / 32);
                break;
            default: /* Q8K */
                t.xq = row + kc0;
                t.xd = row + k + 4 * (size_t)(kc0 / 256);
                t.xe = row + k + 4 * (size_t)(k / 256) + 2 * (size_t)(kc0 / 16);
                break;
            }
            j->fn(&t);
        }
    }
}

void g3_matmul(g3_pool *p, const g3_act *a, const void *w, int n, float *y, int ldy) {
    if (n <= 0 || a->m <= 0) return;
    const uint32_t src = g3_matmul_repack_source(a->wtype), base = src ? src : a->wtype;
    const int r8 = src != 0;
    const g3_dtype_info *ti = g3_dtype_get(base);
    g3_tile_fn fn = tile_fn(a->kset, a->wtype); /* the set whose layout a was prepared in */
    if (!ti || !fn || (r8 && n % 8)) return;
    mm_job j = {.a = a, .w = w, .wrb = g3_row_bytes(base, a->k), .n = n, .y = y, .ldy = ldy, .fn = fn};
    j.kalign = ti->block;
    j.kbytes_blk = ti->block_bytes;
    if (r8) { /* a repacked block holds 8 rows; a "row" is an eighth of a group, for the kernels' group stride */
        j.kbytes_blk = g3_matmul_repack_bytes(base, 8, ti->block);
        j.wrb = j.kbytes_blk * (size_t)(a->k / ti->block) / 8;
    }
    /* bytes of prepared activation per value, and the chunking that keeps an MB x KC block in L2 */
    double xb = a->layout == G3_ACT_F32 || a->layout == G3_ACT_BF16X2 ? 4.0 : 1.25;
    int kq = ti->block > 64 ? ti->block : 256; /* chunk granularity in values */
    int mb_cap = MB_MAX;
    long budget = L2_BUDGET;
    if (a->layout == G3_ACT_Q8K) {
        /* the K-quant kernels take one weight row against up to 8 activation rows: keep the activation block in
         * L1 and let the weight rows (re-)stream from L2/L3 instead */
        mb_cap = 16;
        budget = L1_BUDGET;
    }
    j.mb = g3_kmin(a->m, mb_cap);
    /* The k chunk depends on k and the layout only, never on m: every output is then summed in the same order
     * whatever the batch, so a sequence gets bit-identical results alone or among others (batch invariance). */
    long kc = (long)(budget / (xb * mb_cap));
    if (kc >= a->k) {
        j.kc = a->k;
    } else {
        if (kc < kq) kc = kq;
        long nchunks = (a->k + kc - 1) / kc;
        kc = (a->k + nchunks - 1) / nchunks;
        kc = (kc + kq - 1) / kq * kq;
        j.kc = (int)(kc < a->k ? kc : a->k);
    }
    /* weight rows per block: one block x one k chunk within L2 beside the activations */
    j.nb = n;
    if (a->q2) { /* a block of weight rows small enough to stay in L2 for the residual pass; never depends on m */
        double wb = (double)j.wrb / a->k * j.kc;
        long nbr = (long)(L2_BUDGET / wb) / 16 * 16;
        j.nb = (int)(nbr < 16 ? 16 : nbr);
    } else if (a->m > 8 && (a->layout == G3_ACT_F32 || a->layout == G3_ACT_BF16X2)) {
        double wb = (double)j.wrb / a->k * j.kc; /* bytes of one weight row in a chunk */
        long nbr = (long)(L2_BUDGET / wb) / 16 * 16;
        j.nb = (int)(nbr < 16 ? 16 : nbr);
    }
    if (n < 32 && a->m == 1) mm_task(&j, 0, 1); /* too small to be worth a parallel region */
    else g3_pool_run(p, mm_task, &j);
}
