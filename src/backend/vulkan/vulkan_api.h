/* The Vulkan backend seen from outside: its g3_backend_ops table, the device list behind `gemma3 info --devices`
 * and `--device N`, and test hooks that run single kernels on host data.
 *
 * Devices are listed best first (discrete GPUs, then integrated, virtual, other, and CPU implementations such as
 * Mesa's lavapipe last); g3_backend_cfg.device is an index into that list, so the default 0 is the best device.
 * $G3_VULKAN_DEVICE=N overrides the index. The Vulkan loader (libvulkan.so.1) is opened at run time: a build with
 * this backend runs unchanged where Vulkan is missing, and create() then fails with G3_ERR_DEVICE.
 *
 * Environment: G3_VULKAN_DEVICE=N (device index), G3_VULKAN_STAGING=1 (upload through a staging buffer even where
 * device memory is host-visible; for tests), G3_VULKAN_NO_SUBGROUPS=1 (use the shared-memory reduction variants of the
 * shaders even where subgroup arithmetic exists; for tests), G3_VULKAN_VALIDATE=1 (enable VK_LAYER_KHRONOS_validation
 * if present); A/B switches of the decode kernels in docs/VULKAN.md (G3_VULKAN_MATVEC1, _MATVECN, _FUSE, ...). */
#ifndef G3_BACKEND_VULKAN_VULKAN_API_H
#define G3_BACKEND_VULKAN_VULKAN_API_H

#include <stdio.h>

#include "backend/backend.h"

extern const g3_backend_ops g3_backend_vulkan;

typedef struct g3_vulkan_device {
    int index;                /* position in the list: what g3_backend_cfg.device / --device select */
    char name[256];
    const char *type;         /* "discrete", "integrated", "virtual", "cpu", "other" */
    uint32_t api_version;     /* VK_MAKE_API_VERSION encoded */
    uint32_t vendor_id, device_id;
    char driver[256];         /* driver name and info where the device reports them */
    uint64_t device_local_bytes; /* size of the largest device-local heap */
    uint32_t subgroup_size;
    int subgroup_arithmetic;  /* subgroup reductions in compute shaders */
    int int8_dot;             /* VK_KHR_shader_integer_dot_product with shaderIntegerDotProduct: the int8 decode
                                 products (matvecq) can run */
    int int8_dot_fast;        /* the driver reports 4 x 8-bit packed signed dot products as accelerated */
    int coopmat;              /* cooperative-matrix flavours prefill can run on: 1 NV, 2 KHR, 3 both (0 none) */
    int coopmat_sg32;         /* the KHR one through subgroups of 32 asked for (VK_EXT_subgroup_size_control) */
    int usable;               /* has everything this backend needs */
    char missing[160];        /* what it lacks when !usable */
} g3_vulkan_device;

/* Fills up to max entries (best first) and sets *n to the number of devices found (may exceed max).
 * G3_ERR_DEVICE when the loader cannot be opened or no instance can be created; *n = 0 then. */
g3_status g3_vulkan_list_devices(g3_vulkan_device *out, int max, int *n, g3_error *err);
/* Prints the list as `gemma3 info --devices` shows it; returns the number of devices (0 when none/no loader). */
int g3_vulkan_print_devices(FILE *f);
/* Name of the device a backend runs on. */
const char *g3_vulkan_device_name(const g3_backend *b);
/* Dispatches recorded into the body command buffer (embedding to final norm) that serves `rows` rows; -1 if rows is
 * beyond max_rows. For dispatch-count tests and docs/VULKAN.md's figures. */
int g3_vulkan_body_dispatches(const g3_backend *b, int rows);

/* Where the time of one step goes: runs `batch` once as a real step (K/V written as by forward_argmax, so run it on a
 * batch whose cache writes may be repeated or discarded) through command buffers recorded for this call, the body of
 * the batch's row bucket and the greedy head, with a timestamp before and after every dispatch (the command buffers
 * of normal steps carry none), and writes into out (cap bytes, NUL-terminated, truncated to fit) one line per label
 * in dispatch order, summed over layers as g3_cuda_profile's:
 *     label \t total_us \t count \t per_us \t exec_us
 * labels: embed; per layer qkv (or q, k, v), qk_rope, attn, attn_combine (split decode attention whose merge is not
 * fused), wo / wo+norm, add_norm_attn, gate_up (or gate, up, geglu), down / down+norm, add_norm_ffn (the post-norms
 * run inside wo / down in fused decode buckets: wo+norm, down+norm); head gather, logits, argmax (per submission of
 * 64 output rows). total = from the end of the dispatch before (or the command buffer's start) to the end of this
 * one: barrier and launch gaps included, so totals add up to the GPU time. exec = from a top-of-pipe stamp right
 * before the dispatch to its end (equals total on drivers that latch that stamp before the barrier has drained).
 * Then two summary lines: "all_dispatches \t sum_us \t n \t mean_us \t sum_exec_us" and "wall \t us \t submissions
 * \t us_per_submission", the host's time from vkQueueSubmit to the fence (wall - sum: submission and wake-up cost).
 * G3_ERR_UNSUPPORTED where the compute queue has no timestamps (timestampValidBits 0). */
g3_status g3_vulkan_profile(g3_backend *b, const g3_batch *batch, char *out, size_t cap, g3_error *err);
/* The same with the head of choice and the step's output: argmax 0 the logits head, result (if not NULL) = logits
 * [n_out][vocab] as forward gives them; argmax 1 the greedy head, result = token ids [n_out] as forward_argmax. */
g3_status g3_vulkan_profile_out(g3_backend *b, const g3_batch *batch, int argmax, void *result, char *out, size_t cap,
                                g3_error *err);

/* ---- test hooks ------------------------------------------------------------------------------------------ */
/* y = x W^T for m rows (float32 [m][k]) of weights w (n rows of k values stored as `type`, GGUF block layout),
 * by the kernel the forward uses for m rows (path 0: matvec when m <= 8, the tiled matmul otherwise), or as forced by
 * path: 1 matvec, 2 the tiled matmul the forward uses beyond 8 rows (on cooperative matrices where they are enabled,
 * $G3_VULKAN_COOPMAT), 3 the cooperative-matrix matmul without its overflow guard (every row's exponent 0: f16 tiles
 * overflow past 65504; G3_ERR_UNSUPPORTED where cooperative matrices are off; for tests that must see it fail).
 * geglu: W2 (same shape and type) is the up projection and y = gelu(x W^T) * (x W2^T). y: [m][n]. */
g3_status g3_vulkan_test_matmul(uint32_t type, const void *w, const void *w2, int n, int k, const float *x, int m,
                                int path, float *y, g3_error *err);

/* Vulkan instances this process has created: 1 after any number of backends and device listings (the instance is
 * shared and kept until exit; see vk_device.c), 0 before the first. */
int g3_vulkan_instances_created(void);

/* Which cooperative matrices device 0 runs prefill on, as $G3_VULKAN_COOPMAT picks now: 1 VK_NV_cooperative_matrix,
 * 2 VK_KHR_cooperative_matrix, 0 none (the portable matmul), -1 the device could not be created (err says why). */
int g3_vulkan_test_coopmat(g3_error *err);

/* Whether device 0 runs one-row Q8_0/Q4_0 products on int8 dot products (matvecq; $G3_VULKAN_MVQ): 1 yes, 0 no,
 * -1 the device could not be created (err says why). */
int g3_vulkan_test_mvq(g3_error *err);

/* The activation quantization of the int8 decode products (shaders/q8act.comp) on one row x[k] (k % 32 == 0), il = 1
 * in Q4_0 order: out gets the q8act row as the shader writes it (q [k] int8, q_lo [k] int8, [k/32] float (d, block
 * sum) pairs; g3vk_q8_row_bytes(k) bytes, at most 2.25 k + 15). */
g3_status g3_vulkan_test_q8act(const float *x, int k, int il, void *out, g3_error *err);

/* The overflow-guard exponents of the cooperative-matrix products (shaders/cm_scale.comp) for the first nrows of
 * x [rows][k] (k % 4 == 0): e[r] = max(0, E - 13) with 2^E <= max |x[r][.]| < 2^(E+1), at most 126; rows from nrows
 * on are left alone (0xabababab). Runs on any device (the shader needs no cooperative matrices). */
g3_status g3_vulkan_test_cm_scale(const float *x, int rows, int k, int nrows, uint32_t *e, g3_error *err);

/* sin/cos of float32 angles as the rope shader computes them (for precision tests). */
g3_status g3_vulkan_test_sincos(const float *angle, int n, float *s, float *c, g3_error *err);

#endif
