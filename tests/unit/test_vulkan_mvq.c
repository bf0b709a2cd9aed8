/* The Vulkan int8 decode products (shaders/q8act.comp + matvecq.comp, docs/VULKAN.md "int8 decode products"): the
 * activation quantization against its contract; one-row Q8_0 / Q4_0 products at the widths of the 1B, 4B and 27B
 * matrices (K up to 21504), GeGLU, a logits-sized grid, the $G3_VULKAN_MVQ_* variants and the shared-memory
 * reductions, each against the host twice: exactly (float32 rounding) on the activations the shader quantized, and
 * within the quantization's own bound on the float activations; the switches; whole models decoded one row at a time
 * with it on and off (random tiny Q4_0 / Q8_0 models and a one-layer model of the 1B shape, against the float
 * kernels and the CPU backend; the fused post-norm tails; dispatch counts) and the tiny-gqa Q8_0 GGUF against its
 * Hugging Face reference. Skipped with a message where device 0 has no int8 dot products (lavapipe has them). */
#ifdef G3_HAVE_VULKAN
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/vulkan/vulkan_api.h"
#include "gemma3.h"
#include "model/dtype.h"
#include "model/model.h"
#include "testutil.h"
#include "vk_testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* Device 0 runs the int8 products with the switches as they are now; prints why not otherwise. */
static int mvq_on(void) {
    if (!have_device()) return 0;
    g3_error err = {0};
    int on = g3_vulkan_test_mvq(&err);
    if (on < 0) fail_msg("device 0: %s", err.msg);
    if (!on) printf("  device 0 has no int8 dot products (VK_KHR_shader_integer_dot_product): skipped\n");
    return on;
}

/* Activations shaped like a decoder's: uniform values, every 97th twenty times larger (outlier channels), one block
 * of zeros and one of tiny values (1e-6). */
static void make_x(float *x, int k) {
    for (int i = 0; i < k; i++) x[i] = frand() * (i % 97 == 5 ? 20.0f : 1.0f);
    if (k >= 96) {
        for (int i = 32; i < 64; i++) x[i] = 0.0f;
        for (int i = 64; i < 96; i++) x[i] *= 1e-6f;
    }
}

/* Position of value i of a block in a q8act plane: natural order, or (il) (x0 x2 x4 x6)(x1 x3 x5 x7) per 8. */
static int plane_pos(int i, int il) { return il ? (i & ~7) + (i & 1) * 4 + ((i & 7) >> 1) : i; }

/* The shader's reconstruction xh = d (q + q_lo / 254) of every value of a q8act row, and each value's block amax. */
static void q8_reconstruct(const uint8_t *row, const float *x, int k, int il, double *xh, double *amax) {
    const float *ds = (const float *)(row + 2 * (size_t)k);
    for (int b = 0; b < k / 32; b++) {
        double am = 0;
        for (int i = 0; i < 32; i++) am = fmax(am, fabs(x[32 * b + i]));
        for (int i = 0; i < 32; i++) {
            int p = 32 * b + plane_pos(i, il);
            int q = (int8_t)row[p], l = (int8_t)row[k + p];
            xh[32 * b + i] = (double)ds[2 * b] * (q + l / 254.0);
            amax[32 * b + i] = am;
        }
    }
}

/* q8act.comp against its contract (shaders/q8act.comp): d = amax / 127, q = the rounding of x / d, q_lo the rounding of
 * the rest times 254, both within [-127, 127], x within amax / 64516 of d (q + q_lo / 254), the block sum, the value
 * order for Q4_0 (il = 1), zero and tiny blocks; rows of 32 values to the 27B FFN width. */
static void test_q8act(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    static const int ks[] = {32, 1152, 5376, 21504};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (int il = 0; il < 2; il++) {
            int k = ks[ki];
            float *x = malloc(sizeof(float) * (size_t)k);
            uint8_t *row = malloc((size_t)k * 9 / 4 + 16);
            make_x(x, k);
            g3_error err = {0};
            if (g3_vulkan_test_q8act(x, k, il, row, &err) != G3_OK) fail_msg("%s", err.msg);
            const float *ds = (const float *)(row + 2 * (size_t)k);
            double worst = 0; /* |x - xh| / (amax / 64516) */
            for (int b = 0; b < k / 32; b++) {
                double am = 0, sum = 0;
                for (int i = 0; i < 32; i++) am = fmax(am, fabs(x[32 * b + i]));
                double d = ds[2 * b];
                if (fabs(d - am / 127) > 1e-6 * am / 127) fail_msg("k %d block %d: d %g, amax / 127 %g", k, b, d, am / 127);
                for (int i = 0; i < 32; i++) {
                    int p = 32 * b + plane_pos(i, il);
                    int q = (int8_t)row[p], l = (int8_t)row[k + p];
                    assert_true(q >= -127 && q <= 127 && l >= -127 && l <= 127);
                    double v = x[32 * b + i];
                    if (am == 0) {
                        assert_true(q == 0 && l == 0);
                        continue;
                    }
                    double t = v / d; /* q is the nearest integer to t, q_lo to (t - q) * 254 */
                    if (fabs(t - q) > 0.5 + 1e-4 || fabs((t - q) * 254 - l) > 0.5 + 1e-2)
                        fail_msg("k %d il %d value %d: x / d = %.6f, q %d, q_lo %d", k, il, 32 * b + i, t, q, l);
                    double e = fabs(v - d * (q + l / 254.0)) / (am / 64516);
                    if (e > worst) worst = e;
                    sum += q + l / 254.0;
                }
                if (fabs(ds[2 * b + 1] - d * sum) > 1e-6 * (fabs(d * sum) + d))
                    fail_msg("k %d block %d: sum %g, expected %g", k, b, (double)ds[2 * b + 1], d * sum);
            }
            printf("  k %5d %s order: |x - d (q + q_lo/254)| at most %.3f x amax/64516\n", k, il ? "Q4_0" : "Q8_0",
                   worst);
            /* 1% over the exact bound: x / d is rounded to float32 before the roundings (x 127 ulp in units of q,
             * x 254 more in units of q_lo: ~0.4% of the bound's half unit), and d itself carries a rounding */
            assert_true(worst <= 1.01);
            free(x), free(row);
        }
}

/* Random weights of `type`, n rows of k, and their dequantized floats. */
static void *make_weights(uint32_t type, int n, int k, float **deq) {
    size_t rb = g3_row_bytes(type, k);
    uint8_t *w = malloc(rb * (size_t)n);
    float *row = malloc(sizeof(float) * (size_t)k);
    *deq = malloc(sizeof(float) * (size_t)n * (size_t)k);
    g3_error err = {0};
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < k; i++) row[i] = frand() * (1.0f + (float)(i % 7));
        assert_int_equal(g3_quantize_row(type, row, w + (size_t)r * rb, k, &err), G3_OK);
        g3_dequant_row(type, w + (size_t)r * rb, *deq + (size_t)r * k, k);
    }
    free(row);
    return w;
}

static double gelu(double a) { return 0.5 * a * (1 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))); }

/* Per output: exact dot products on x and on the shader's xh, their magnitudes and the quantization bound. */
typedef struct dots {
    double a, ah, mag, magh, bound; /* x.w, xh.w, sum |x w|, sum |xh w|, sum |w| amax / 64516 */
} dots;

static dots dot_all(const float *x, const double *xh, const double *amax, const float *w, int k) {
    dots s = {0};
    for (int i = 0; i < k; i++) {
        s.a += (double)x[i] * w[i], s.ah += xh[i] * w[i];
        s.mag += fabs((double)x[i] * w[i]), s.magh += fabs(xh[i] * w[i]);
        s.bound += fabs((double)w[i]) * amax[i] / 64516;
    }
    return s;
}

/* One-row product through the default kernel (matvecq where on) vs the host: against W . xh (the activations as the
 * shader quantized them, read back through g3_vulkan_test_q8act) within 2e-6 of sum |xh w| (float32 rounding only:
 * the integer sums are exact; without the residual plane, or on float activations, it would be off by ~1e-3 /
 * sqrt(k) of it), and against W . x within the quantization bound sum |w| amax / 64516 (GeGLU: propagated through
 * gelu, |gelu'| < 1.13) plus the same rounding term. q8 = 0 (the int8 products switched off): against W . x within
 * 2e-6 of sum |x w| instead. Returns the worst ratio to its bound. */
static double check_product_q8(uint32_t type, int n, int k, int geglu, int q8) {
    float *deq, *deq2 = NULL;
    void *w = make_weights(type, n, k, &deq);
    void *w2 = geglu ? make_weights(type, n, k, &deq2) : NULL;
    float *x = malloc(sizeof(float) * (size_t)k), *y = malloc(sizeof(float) * (size_t)n);
    uint8_t *row = malloc((size_t)k * 9 / 4 + 16);
    double *xh = malloc(sizeof(double) * (size_t)k), *amax = malloc(sizeof(double) * (size_t)k);
    make_x(x, k);
    g3_error err = {0};
    int il = type == G3_DTYPE_Q4_0;
    if (g3_vulkan_test_matmul(type, w, w2, n, k, x, 1, 1, y, &err) != G3_OK) fail_msg("%s", err.msg);
    if (g3_vulkan_test_q8act(x, k, il, row, &err) != G3_OK) fail_msg("%s", err.msg);
    q8_reconstruct(row, x, k, il, xh, amax);
    double worst_h = 0, worst_x = 0;
    for (int c = 0; c < n; c++) {
        dots s = dot_all(x, xh, amax, deq + (size_t)c * k, k);
        const double rnd = 2e-6;
        double qb = q8 ? 1 : 0; /* the quantization bound applies */
        double ref_h = s.ah, ref_x = s.a, tol_h = rnd * s.magh + 1e-30, tol_x = qb * s.bound + rnd * s.mag + 1e-30;
        if (geglu) {
            dots u = dot_all(x, xh, amax, deq2 + (size_t)c * k, k);
            ref_h = gelu(s.ah) * u.ah, ref_x = gelu(s.a) * u.a;
            tol_h = rnd * (1.13 * s.magh * fabs(u.ah) + fabs(gelu(s.ah)) * u.magh) + 1e-30;
            tol_x = qb * (1.13 * s.bound * (fabs(u.a) + u.bound) + fabs(gelu(s.a)) * u.bound) +
                    rnd * (1.13 * s.mag * (fabs(u.a) + qb * u.bound) + fabs(gelu(s.a)) * u.mag) + 1e-30;
        }
        if (!q8) tol_h = INFINITY; /* float activations: only W . x counts */
        double eh = fabs(y[c] - ref_h) / tol_h, ex = fabs(y[c] - ref_x) / tol_x;
        if (isnan(y[c])) eh = ex = INFINITY;
        worst_h = fmax(worst_h, eh), worst_x = fmax(worst_x, ex);
    }
    if (q8)
        printf("  %-4s n %6d k %5d%s: error / bound %.3f (on the quantized activations), %.3f (on x)\n",
               g3_dtype_name((g3_dtype)type), n, k, geglu ? " geglu" : "      ", worst_h, worst_x);
    else
        printf("  %-4s n %6d k %5d%s: float activations, error / bound %.3f\n", g3_dtype_name((g3_dtype)type), n, k,
               geglu ? " geglu" : "      ", worst_x);
    if (!(worst_h <= 1 && worst_x <= 1))
        fail_msg("%s n %d k %d%s: error beyond its bound (%.3g, %.3g)", g3_dtype_name((g3_dtype)type), n, k,
                 geglu ? " geglu" : "", worst_h, worst_x);
    free(w), free(w2), free(deq), free(deq2), free(x), free(y), free(row), free(xh), free(amax);
    return fmax(worst_h, worst_x);
}

/* check_product_q8 on the int8 path for either type ($G3_VULKAN_MVQ=1: by default only Q4_0 takes it) */
static double check_product(uint32_t type, int n, int k, int geglu) {
    setenv("G3_VULKAN_MVQ", "1", 1);
    const double r = check_product_q8(type, n, k, geglu, 1);
    unsetenv("G3_VULKAN_MVQ");
    return r;
}

/* The products of Gemma 3 1B, 4B and 27B at their K (QKV and gate/up: hidden; Wo: heads x head_dim; down: FFN width),
 * a few dozen output channels each (odd counts: a last workgroup with fewer channels), GeGLU at the hidden widths,
 * K = 32 and 64 (fewer chunks than threads), and a grid past 32768 workgroups in x (the logits head's shape). */
static void test_products(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    static const int widths[][4] = {{1152, 1024, 6912, 0}, {2560, 2048, 10240, 0}, {5376, 4096, 21504, 0}};
    static const uint32_t types[] = {G3_DTYPE_Q4_0, G3_DTYPE_Q8_0};
    for (size_t t = 0; t < 2; t++) {
        for (int s = 0; s < 3; s++) {
            check_product(types[t], 37, widths[s][0], 0);
            check_product(types[t], 19, widths[s][0], 1);
            check_product(types[t], 41, widths[s][1], 0);
            check_product(types[t], 13, widths[s][2], 0);
        }
        check_product(types[t], 5, 32, 0);
        check_product(types[t], 7, 64, 1);
        check_product(types[t], 3, 4128, 0); /* n below one workgroup's channels */
    }
    check_product(G3_DTYPE_Q8_0, 140001, 64, 0); /* 35001 workgroups of 4 channels: a grid of 32768 x 2 */
}

/* The tuning variants ($G3_VULKAN_MVQ_WG / _NC / _COLS: specialization constants of matvecq.comp), unknown values (the
 * defaults), and the shared-memory reductions ($G3_VULKAN_NO_SUBGROUPS=1). */
static void test_variants(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    static const char *const variants[][3] = {
        /* WG, NC, COLS */
        {"32", NULL, NULL}, {"128", NULL, NULL}, {"256", NULL, NULL}, {NULL, "2", NULL}, {NULL, "8", NULL},
        {NULL, "16", NULL}, {NULL, NULL, "1"},   {NULL, NULL, "4"},   {"256", "16", "4"}, {"32", "2", "1"},
        {"48", "3", "x"},
    };
    static const char *const names[3] = {"G3_VULKAN_MVQ_WG", "G3_VULKAN_MVQ_NC", "G3_VULKAN_MVQ_COLS"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        printf("  variant WG %s NC %s COLS %s\n", variants[v][0] ? variants[v][0] : "-",
               variants[v][1] ? variants[v][1] : "-", variants[v][2] ? variants[v][2] : "-");
        for (int i = 0; i < 3; i++)
            if (variants[v][i]) setenv(names[i], variants[v][i], 1);
        check_product(G3_DTYPE_Q4_0, 37, 5376, 0);
        check_product(G3_DTYPE_Q8_0, 21, 4128, 1);
        check_product(G3_DTYPE_Q4_0, 9, 1152, 1);
        for (int i = 0; i < 3; i++) unsetenv(names[i]);
    }
    setenv("G3_VULKAN_NO_SUBGROUPS", "1", 1);
    check_product(G3_DTYPE_Q4_0, 37, 5376, 0);
    check_product(G3_DTYPE_Q8_0, 19, 2560, 1);
    check_product(G3_DTYPE_Q4_0, 13, 21504, 0);
    unsetenv("G3_VULKAN_NO_SUBGROUPS");
}

/* $G3_VULKAN_MVQ=0 turns the int8 products off; unset, they follow $G3_VULKAN_MV2 (=0: the older float kernels;
 * else mode 2: Q4_0 only); $G3_VULKAN_MVQ=1 turns them on for every Q8_0/Q4_0 product even then. */
static void test_switches(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    g3_error err = {0};
    setenv("G3_VULKAN_MVQ", "0", 1);
    assert_int_equal(g3_vulkan_test_mvq(&err), 0);
    setenv("G3_VULKAN_MVQ", "1", 1);
    assert_int_equal(g3_vulkan_test_mvq(&err), 1);
    setenv("G3_VULKAN_MV2", "0", 1);
    assert_int_equal(g3_vulkan_test_mvq(&err), 1);
    unsetenv("G3_VULKAN_MVQ");
    assert_int_equal(g3_vulkan_test_mvq(&err), 0);
    unsetenv("G3_VULKAN_MV2");
    assert_int_equal(g3_vulkan_test_mvq(&err), 2);
    g3_vulkan_device d[8];
    int n = 0;
    assert_int_equal(g3_vulkan_list_devices(d, 8, &n, &err), G3_OK);
    assert_true(n >= 1 && d[0].int8_dot);
    /* with MVQ off a one-row Q4_0 product is matvec2's, on float activations (within 2e-6 of sum |x w|); with it on,
     * on xh (check_product's bounds, which float activations would miss) */
    setenv("G3_VULKAN_MVQ", "0", 1);
    check_product_q8(G3_DTYPE_Q4_0, 37, 1152, 0, 0);
    unsetenv("G3_VULKAN_MVQ");
    check_product_q8(G3_DTYPE_Q4_0, 37, 1152, 0, 1);
    /* the default for Q8_0: float activations (matvec2) at every width */
    check_product_q8(G3_DTYPE_Q8_0, 37, 2560, 0, 0);
    check_product_q8(G3_DTYPE_Q8_0, 37, 21504, 0, 0);
}

/* ---- whole models ----------------------------------------------------------------------------------------------- */

/* Logits of every position of prompt through an engine on `backend` (prefill in chunks of `chunk` rows; 1: every
 * position a one-row decode step), with the environment pairs env (NULL-terminated) set during engine creation. */
static float *all_logits(g3_model *m, const char *backend, const int32_t *prompt, int n, int chunk,
                         const char *const *env) {
    for (int i = 0; env && env[i]; i += 2) setenv(env[i], env[i + 1], 1);
    g3_engine_opts o;
    g3_engine_opts_default(&o);
    o.backend = backend;
    o.ctx_size = 128;
    o.prefill_chunk = chunk;
    o.kv_block = 4;
    g3_engine *e = NULL;
    g3_error err = {0};
    g3_status rc = g3_engine_create(m, &o, &e, &err);
    for (int i = 0; env && env[i]; i += 2) unsetenv(env[i]);
    if (rc != G3_OK) fail_msg("%s engine: %s", backend, err.msg);
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)m->cfg.vocab);
    if (g3_engine_logits(e, prompt, n, 1, out, &err) != G3_OK) fail_msg("%s logits: %s", backend, err.msg);
    g3_engine_free(e);
    return out;
}

/* Worst over positions of max |a - ref| / max(1, max |ref|), and how many positions share the argmax. */
static double rows_diff(const float *a, const float *ref, int n, int V, int *agree) {
    double worst = 0;
    *agree = 0;
    for (int p = 0; p < n; p++) {
        worst = fmax(worst, tu_rel_err(a + (size_t)p * V, ref + (size_t)p * V, V));
        int ia = 0, ib = 0;
        for (int i = 1; i < V; i++) {
            if (a[(size_t)p * V + i] > a[(size_t)p * V + ia]) ia = i;
            if (ref[(size_t)p * V + i] > ref[(size_t)p * V + ib]) ib = i;
        }
        *agree += ia == ib;
    }
    return worst;
}

/* Decodes n positions of a random model one row at a time on Vulkan with the int8 products on (fused tails too when
 * fuse) and off, and on the CPU backend: on vs off within tol (relative), argmax equal at all but one position; the
 * CPU (which multiplies 8-bit-quantized activations of its own, without a residual plane: it differs from both by far
 * more than they differ from each other) with the same argmax at 90% of the positions. */
static void model_on_off(g3_model *m, const char *what, int n, double tol, int fuse) {
    int V = m->cfg.vocab;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)((unsigned)(i * 2654435761u + 7) % (unsigned)V);
    const char *on_env[] = {"G3_VULKAN_MVQ", "1", "G3_VULKAN_FUSE", fuse ? "1" : "0", NULL}; /* Q8_0 too at any k */
    const char *off_env[] = {"G3_VULKAN_MVQ", "0", "G3_VULKAN_FUSE", fuse ? "1" : "0", NULL};
    float *on = all_logits(m, "vulkan", prompt, n, 1, on_env), *off = all_logits(m, "vulkan", prompt, n, 1, off_env);
    float *cpu = all_logits(m, "cpu", prompt, n, 1, NULL);
    int agree_off, agree_cpu, agree_fc;
    double d_off = rows_diff(on, off, n, V, &agree_off), d_cpu = rows_diff(on, cpu, n, V, &agree_cpu);
    double d_fc = rows_diff(off, cpu, n, V, &agree_fc);
    printf("  %s%s, %d one-row steps: int8 products vs float activations %.2e (argmax equal %d/%d), vs the CPU "
           "backend %.2e (%d/%d; float activations vs the CPU %.2e, %d/%d)\n",
           what, fuse ? ", fused tails" : "", n, d_off, agree_off, n, d_cpu, agree_cpu, n, d_fc, agree_fc, n);
    assert_true(d_off < tol);
    assert_true(agree_off >= n - 1);
    assert_true(agree_cpu >= n * 9 / 10);
    free(prompt), free(on), free(off), free(cpu);
}

static void test_random_models(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    static const uint32_t types[] = {G3_DTYPE_Q4_0, G3_DTYPE_Q8_0};
    for (size_t t = 0; t < 2; t++) {
        g3_model *m = NULL;
        g3_error err = {0};
        if (g3_model_random("tiny", (g3_dtype)types[t], 1234 + t, 0, &m, &err) != G3_OK) fail_msg("%s", err.msg);
        char what[64];
        snprintf(what, sizeof what, "tiny %s", g3_dtype_name((g3_dtype)types[t]));
        model_on_off(m, what, 40, 1e-3, 0);
        model_on_off(m, what, 16, 1e-3, 1); /* Wo / down with the post-norm tail (mode 2) */
        g3_model_free(m);
    }
}

/* Separate q, k, v and gate, up products (wv and w_up requantized to Q8_0, the rest Q4_0): a q8act before each, in
 * both value orders, rewriting the one q8 row that the product before may still read (the recorder puts a barrier
 * between them); on vs off as above. */
static void test_mixed_types(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    g3_model *m = NULL;
    g3_error err = {0};
    if (g3_model_random("tiny", G3_DTYPE_Q4_0, 99, 0, &m, &err) != G3_OK) fail_msg("%s", err.msg);
    const g3_config *c = &m->cfg;
    size_t per = g3_row_bytes(G3_DTYPE_Q8_0, c->hidden) * (size_t)(c->n_kv_heads * c->head_dim + c->ffn);
    uint8_t *store = malloc(per * (size_t)c->n_layers), *cur = store;
    float *row = malloc(sizeof(float) * (size_t)c->hidden);
    for (int l = 0; l < c->n_layers; l++) {
        g3_weight *ws[2] = {&m->layers[l].wv, &m->layers[l].w_up};
        for (int i = 0; i < 2; i++) {
            g3_weight *w = ws[i];
            size_t rb = g3_row_bytes(w->type, w->k), qb = g3_row_bytes(G3_DTYPE_Q8_0, w->k);
            uint8_t *start = cur;
            for (int64_t r = 0; r < w->n; r++, cur += qb) {
                g3_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * rb, row, w->k);
                assert_int_equal(g3_quantize_row(G3_DTYPE_Q8_0, row, cur, w->k, &err), G3_OK);
            }
            w->type = G3_DTYPE_Q8_0, w->data = start, w->nbytes = qb * (size_t)w->n;
        }
    }
    free(row);
    model_on_off(m, "tiny Q4_0 with Q8_0 wv and w_up (separate q, k, v, gate, up)", 24, 1e-3, 0);
    g3_model_free(m);
    free(store);
}

/* One layer of the 1B shape (hidden 1152, FFN 6912, 4 x 256 heads, the 262144-entry vocabulary: the logits head at its
 * real size) in Q4_0. */
static void test_1b_shape(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    g3_model *m = NULL;
    g3_error err = {0};
    if (g3_model_random("1b", G3_DTYPE_Q4_0, 77, 1, &m, &err) != G3_OK) fail_msg("%s", err.msg);
    model_on_off(m, "1B shape, 1 layer, Q4_0", 5, 1e-3, 0);
    g3_model_free(m);
}

/* The one-row bucket gains one q8act dispatch per product (QKV, Wo, gate/up, down: 4 per layer); the others keep
 * theirs; with the fused tails likewise. */
static void test_dispatches(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    g3_model *m = NULL;
    g3_error err = {0};
    if (g3_model_random("tiny", G3_DTYPE_Q8_0, 5, 0, &m, &err) != G3_OK) fail_msg("%s", err.msg);
    const g3_backend_ops *ops = g3_backend_find("vulkan");
    assert_non_null(ops);
    int L = m->cfg.n_layers, d[2][2][3];
    for (int mvq = 0; mvq < 2; mvq++)
        for (int fuse = 0; fuse < 2; fuse++) {
            g3_backend_cfg cfg = {.max_seqs = 2, .max_rows = 12, .kv_block = 4, .max_blocks_per_seq = 8,
                                  .n_blocks_global = 16, .n_blocks_local = 16};
            setenv("G3_VULKAN_MVQ", mvq ? "1" : "0", 1);
            setenv("G3_VULKAN_FUSE", fuse ? "1" : "0", 1);
            g3_backend *b = NULL;
            g3_status rc = ops->create(m, &cfg, &b, &err);
            unsetenv("G3_VULKAN_MVQ"), unsetenv("G3_VULKAN_FUSE");
            if (rc) fail_msg("create: %s", err.msg);
            static const int rows[3] = {1, 2, 12};
            for (int i = 0; i < 3; i++) d[mvq][fuse][i] = g3_vulkan_body_dispatches(b, rows[i]);
            ops->destroy(b);
        }
    printf("  dispatches per body (1, 2, 12 rows; %d layers): int8 %d %d %d, fused tails %d %d %d; float %d %d %d, "
           "fused tails %d %d %d\n",
           L, d[1][0][0], d[1][0][1], d[1][0][2], d[1][1][0], d[1][1][1], d[1][1][2], d[0][0][0], d[0][0][1],
           d[0][0][2], d[0][1][0], d[0][1][1], d[0][1][2]);
    for (int fuse = 0; fuse < 2; fuse++) {
        assert_int_equal(d[1][fuse][0], d[0][fuse][0] + 4 * L);
        assert_int_equal(d[0][fuse][0], 1 + (fuse ? 6 : 9) * L);
        for (int i = 1; i < 3; i++) assert_int_equal(d[1][fuse][i], d[0][fuse][i]);
    }
    g3_model_free(m);
}

/* tiny-gqa's Q8_0 GGUF decoded one row per step (every position through the int8 products), against the Hugging Face
 * reference logits of its longest prompt: test_vulkan_model's quantized bounds (mean KL < 0.01 nats, top-1 > 95%),
 * and within 1e-3 of the same steps on float activations. */
static void test_tiny_gqa_q8_0(void **state) {
    (void)state;
    if (!mvq_on()) skip();
    const char *dir0 = tu_fixture("tiny-gqa");
    if (!dir0) {
        printf("  fixture tiny-gqa not found: skipped\n");
        skip();
    }
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s", dir0);
    snprintf(path, sizeof path, "%.1000s/model-q8_0.gguf", dir);
    tu_reference r;
    assert_true(tu_ref_load(dir, &r));
    g3_model *m = NULL;
    g3_error err = {0};
    if (g3_model_load(path, NULL, &m, &err) != G3_OK) fail_msg("load %s: %s", path, err.msg);
    int V = g3_model_config(m)->vocab;
    const tu_ref_prompt *p = &r.p[3];
    assert_non_null(p->all);
    const char *off_env[] = {"G3_VULKAN_MVQ", "0", NULL}, *on_env[] = {"G3_VULKAN_MVQ", "1", NULL};
    float *on = all_logits(m, "vulkan", p->ids, p->n, 1, on_env);
    float *off = all_logits(m, "vulkan", p->ids, p->n, 1, off_env);
    float *ref = malloc(sizeof(float) * (size_t)V);
    double kl[2] = {0, 0};
    int agree[2] = {0, 0};
    for (int pos = 0; pos < p->n; pos++) {
        tu_row_from_json(cJSON_GetArrayItem(p->all, pos), ref, V);
        for (int i = 0; i < 2; i++) {
            int same;
            kl[i] += tu_kl(ref, (i ? off : on) + (size_t)pos * V, V, &same);
            agree[i] += same;
        }
    }
    int agree_off;
    double d = rows_diff(on, off, p->n, V, &agree_off);
    printf("  %s, %d one-row steps: mean KL %.5f nats, top-1 %d/%d with int8 products; %.5f, %d/%d on float "
           "activations; logits of the two within %.2e (relative)\n",
           path, p->n, kl[0] / p->n, agree[0], p->n, kl[1] / p->n, agree[1], p->n, d);
    for (int i = 0; i < 2; i++) {
        assert_true(kl[i] / p->n < 0.01);
        assert_true((double)agree[i] / p->n > 0.95);
    }
    assert_true(d < 1e-3);
    free(on), free(off), free(ref);
    g3_model_free(m);
    tu_ref_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8act),         cmocka_unit_test(test_products),      cmocka_unit_test(test_variants),
        cmocka_unit_test(test_switches),      cmocka_unit_test(test_dispatches),    cmocka_unit_test(test_random_models),
        cmocka_unit_test(test_mixed_types),   cmocka_unit_test(test_tiny_gqa_q8_0), cmocka_unit_test(test_1b_shape),
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
