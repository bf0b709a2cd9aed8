/* Internals shared by the Vulkan backend's files: the dynamically loaded Vulkan entry points, the device context
 * (instance, device, queue, one-shot command buffer, pipeline layout and pipelines), buffers reached by their
 * device addresses, resident weights in the repacked layouts of shaders/dequant.glsl, and the uploader.
 *
 * Every shader reads and writes memory through buffer device addresses passed in push constants: there are no
 * descriptor sets at all, one pipeline layout (128 bytes of push constants) serves every pipeline. */
#ifndef G3_BACKEND_VULKAN_VK_INTERNAL_H
#define G3_BACKEND_VULKAN_VK_INTERNAL_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"

/* VK_KHR_cooperative_matrix, which Debian 12's headers (1.3.239) lack: the few declarations used here, from the
 * Vulkan registry (structure types 1000506000..2; VkComponentTypeKHR and VkScopeKHR share the NV enums' values). */
#ifndef VK_KHR_cooperative_matrix
#define VK_KHR_cooperative_matrix 1
#define VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME "VK_KHR_cooperative_matrix"
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR ((VkStructureType)1000506000)
#define VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR ((VkStructureType)1000506001)
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR ((VkStructureType)1000506002)
typedef VkComponentTypeNV VkComponentTypeKHR; /* FLOAT16 0, FLOAT32 1, ... */
typedef VkScopeNV VkScopeKHR;                 /* DEVICE 1, WORKGROUP 2, SUBGROUP 3, QUEUE_FAMILY 5 */
typedef struct VkCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void *pNext;
    uint32_t MSize, NSize, KSize;
    VkComponentTypeKHR AType, BType, CType, ResultType;
    VkBool32 saturatingAccumulation;
    VkScopeKHR scope;
} VkCooperativeMatrixPropertiesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
} VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
typedef VkResult(VKAPI_PTR *PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(VkPhysicalDevice, uint32_t *,
                                                                                   VkCooperativeMatrixPropertiesKHR *);
#endif

#define G3VK_GLOBAL_FNS(X) X(vkCreateInstance) X(vkEnumerateInstanceVersion) X(vkEnumerateInstanceLayerProperties)

#define G3VK_INSTANCE_FNS(X)                                                                                           \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)                               \
    X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceFeatures2) X(vkGetPhysicalDeviceMemoryProperties)          \
    X(vkGetPhysicalDeviceQueueFamilyProperties) X(vkCreateDevice) X(vkGetDeviceProcAddr)                              \
    X(vkEnumerateDeviceExtensionProperties) X(vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)                      \
    X(vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)

#define G3VK_DEVICE_FNS(X)                                                                                             \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements)      \
    X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) X(vkUnmapMemory)                         \
    X(vkInvalidateMappedMemoryRanges) X(vkFlushMappedMemoryRanges) X(vkGetBufferDeviceAddress)                        \
    X(vkCreateShaderModule) X(vkDestroyShaderModule) X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout)             \
    X(vkCreateComputePipelines) X(vkDestroyPipeline) X(vkCreatePipelineCache) X(vkDestroyPipelineCache)               \
    X(vkCreateCommandPool) X(vkDestroyCommandPool) X(vkAllocateCommandBuffers) X(vkFreeCommandBuffers)                \
    X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkCmdBindPipeline) X(vkCmdPushConstants) X(vkCmdDispatch)         \
    X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer) X(vkCmdFillBuffer) X(vkQueueSubmit) X(vkCreateFence)                   \
    X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences) X(vkDeviceWaitIdle) X(vkCreateQueryPool)                  \
    X(vkDestroyQueryPool) X(vkCmdResetQueryPool) X(vkCmdWriteTimestamp) X(vkGetQueryPoolResults)

#define G3VK_DECL_FN(name) PFN_##name name;

/* Pipelines: kernels templated on the weight type, then the type-independent ones. */
enum { G3VK_K_MATVEC, G3VK_K_MATVEC_GEGLU, G3VK_K_MATMUL, G3VK_K_MATMUL_GEGLU, G3VK_K_EMBED, G3VK_K_MATVEC1,
       G3VK_K_MATVEC1_GEGLU, G3VK_K_MATMUL_CM, G3VK_K_MATMUL_CM_GEGLU, G3VK_K_MATVEC1N, G3VK_K_MATVEC1N_GEGLU,
       G3VK_K_MATVEC2, G3VK_K_MATVEC2_GEGLU, G3VK_K_MATVEC2N, G3VK_K_MATVEC2N_GEGLU, G3VK_K_MATVECQ,
       G3VK_K_MATVECQ_GEGLU, G3VK_K_TYPED };
enum { G3VK_K_QK_ROPE = G3VK_K_TYPED, G3VK_K_ATTN, G3VK_K_ATTN_COMBINE, G3VK_K_ADD_NORM, G3VK_K_GATHER, G3VK_K_GEGLU,
       G3VK_K_ARGMAX, G3VK_K_TEST_SINCOS, G3VK_K_QK_ROPE_KV16, G3VK_K_ATTN_KV16, G3VK_K_Q8ACT, G3VK_K_CM_SCALE,
       G3VK_K_COUNT };
#define G3VK_NTYPES 10 /* F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q4_1, Q5_1, Q5_K */
#define G3VK_NPIPES (G3VK_K_TYPED * G3VK_NTYPES + (G3VK_K_COUNT - G3VK_K_TYPED))

/* Memory placement of a buffer. */
typedef enum g3vk_mem {
    G3VK_MEM_DEVICE,   /* device-local; host-visible only where all memory is (UMA, software) */
    G3VK_MEM_UPLOAD,   /* host-visible + coherent, device-local if such memory exists (small, read by shaders) */
    G3VK_MEM_READBACK, /* host-visible, cached if possible (written by shaders, read by the host) */
    G3VK_MEM_STAGING,  /* host-visible + coherent, for transfers */
} g3vk_mem;

typedef struct g3vk_buf {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;
    VkDeviceAddress addr; /* device address of byte 0 */
    void *map;            /* persistent mapping when host-visible, else NULL */
    int coherent;         /* host-coherent (no flush/invalidate needed) */
} g3vk_buf;

typedef struct g3vk {
    void *lib; /* dlopen handle of libvulkan.so.1 */
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    G3VK_GLOBAL_FNS(G3VK_DECL_FN)
    G3VK_INSTANCE_FNS(G3VK_DECL_FN)
    G3VK_DEVICE_FNS(G3VK_DECL_FN)
    VkInstance inst;
    VkPhysicalDevice pdev;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    uint32_t ts_bits;       /* timestampValidBits of the queue family: 0 = no timestamps (g3_vulkan_profile) */
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memp;
    int subgroups;          /* subgroup arithmetic in compute shaders: the *_sg pipelines */
    uint32_t subgroup_size;
    int force_staging;      /* $G3_VULKAN_STAGING=1: upload through a staging buffer even into mappable memory */
    int matvec1;            /* one-row buckets use matvec1.comp where it serves the type ($G3_VULKAN_MATVEC1=0: no) */
    int matvecn;            /* 2..8-row buckets use matvec1.comp built for 8 rows ($G3_VULKAN_MATVECN=0: matvec.comp) */
    int mv2;                /* 1..8-row buckets use matvec2.comp where it serves the type (default; $G3_VULKAN_MV2=0: matvec1 / matvec1n) */
    int mv2_spec;           /* one-row matvec2 through matvec2s* with the three below as specialization constants */
    uint32_t mv2_wg, mv2_nc, mv2_cols; /* $G3_VULKAN_MV2_WG / _NC / _COLS: threads, channels, chunk columns (64 8 2) */
    int idot;               /* VK_KHR_shader_integer_dot_product enabled (shaderIntegerDotProduct): matvecq.comp can run */
    int mvq;                /* one-row Q8_0/Q4_0 products through q8act.comp + matvecq.comp: 0 off, 1 all ($G3_VULKAN_MVQ=1),
                               2 Q4_0 only (the default where idot, unless $G3_VULKAN_MV2=0) */
    uint32_t mvq_wg, mvq_nc, mvq_cols; /* $G3_VULKAN_MVQ_WG / _NC / _COLS: matvecq's threads, channels, chunk columns */
    int fuse;               /* decode Wo/down products end with the post-norm tail ($G3_VULKAN_FUSE=0: add_norm.comp) */
    int coopmat;            /* G3VK_CM_*: prefill through matmul_cm.comp on NV or (rewritten) KHR cooperative matrices */
    int cm_sg32;            /* the cooperative-matrix pipelines ask for subgroups of 32 (VK_EXT_subgroup_size_control) */
    g3vk_buf cm_exp;        /* [rows] uint32 exponents of matmul_cm's overflow guard (cm_scale.comp), sized at record */
    VkCommandPool pool;
    VkCommandBuffer once;   /* one-shot work: uploads, block copies */
    VkFence fence;
    VkPipelineLayout layout;
    VkPipelineCache cache;
    VkPipeline pipes[G3VK_NPIPES];
    uint64_t allocated;     /* bytes of device memory allocated so far */
    int index;              /* position in the device list */
} g3vk;

/* Cooperative-matrix flavours (g3vk.coopmat; bits in g3vk_coopmat_probe's result). */
enum { G3VK_CM_NONE = 0, G3VK_CM_NV = 1, G3VK_CM_KHR = 2 };

/* A weight matrix on the device: n rows of k values in the repacked layout of its type (dequant.glsl). */
typedef struct g3vk_weight {
    uint32_t type;
    int n, k;
    g3vk_buf buf;
    uint64_t addr, aux; /* data and (Q8_0, Q4_0, Q4_1, Q5_1, Q6_K) f16 scale array */
} g3vk_weight;

/* Streams bytes into device buffers: memcpy where the buffer is mapped, through a staging buffer otherwise. */
typedef struct g3vk_upload {
    g3vk *vk;
    g3vk_buf staging;
    size_t fill;
    VkBuffer dst;        /* pending copy regions all target one buffer at a time */
    VkBufferCopy regions[64];
    int n_regions;
} g3vk_upload;

/* ---- loader, instance, device list (vk_instance.c) ------------------------------------------------------------ */
#define G3VK_MAX_PDEV 16 /* devices listed at most */
/* Opens the loader and takes a reference on the process's one instance (created on first use); close drops it. */
g3_status g3vk_open_instance(g3vk *vk, g3_error *err);
void g3vk_close_instance(g3vk *vk);
/* The instance's devices, best first (discrete, integrated, virtual, CPU); at most G3VK_MAX_PDEV. */
int g3vk_sorted_devices(g3vk *vk, VkPhysicalDevice *out);
/* What device pd offers (name, type, memory, subgroups, driver), as listed by `gemma3 info --devices`. */
struct g3_vulkan_device;
void g3vk_describe(g3vk *vk, VkPhysicalDevice pd, int index, struct g3_vulkan_device *d);

/* ---- device (vk_device.c) ------------------------------------------------------------------------------------- */
/* Loads the loader, creates the instance, picks device `index` of the sorted list (or $G3_VULKAN_DEVICE), creates
 * the device, queue, command pool, fence and pipeline layout. */
g3_status g3vk_init(g3vk *vk, int index, g3_error *err);
void g3vk_deinit(g3vk *vk);
/* Which cooperative-matrix flavours device pd can run matmul_cm.comp on (G3VK_CM_NV | G3VK_CM_KHR bits): f16 x f16
 * -> f32 16x16x16 subgroup products, shaderFloat16, vulkanMemoryModel, subgroup arithmetic and subgroups of 32
 * (KHR: also through VK_EXT_subgroup_size_control; *sg32 = 1 then). The default pick is g3vk_coopmat_pick's. */
int g3vk_coopmat_probe(g3vk *vk, VkPhysicalDevice pd, int *sg32);
/* The flavour $G3_VULKAN_COOPMAT (unset or 1: KHR where usable, else NV; khr; nv; 0: none) picks among `usable`. */
int g3vk_coopmat_pick(int usable);
const char *g3vk_type_suffix(uint32_t type); /* "q8_0", ...; NULL for a type without shaders */
int g3vk_type_index(uint32_t type);         /* 0..G3VK_NTYPES-1, -1 if unsupported */
/* The pipeline of kernel `kind` (typed kernels: for weight type `type`), created on first use. */
g3_status g3vk_pipeline(g3vk *vk, int kind, uint32_t type, VkPipeline *out, g3_error *err);
/* The kernel for y = x W^T over a bucket of `rows` rows (W: type, k values per row; geglu: with W2): for F16/BF16/
 * Q8_0/Q4_0 with k % 32 == 0 matvec1 (one row) or matvec1n (2..8 rows) (with $G3_VULKAN_MV2=1: matvec2 / matvec2n),
 * else matvec up to G3VK_MV_ROWS rows (8), the tiled matmul beyond (on cooperative matrices where enabled; same
 * grid). Channels per matvec workgroup: g3vk_matvec_outputs(). */
int g3vk_matmul_kind(const g3vk *vk, int rows, uint32_t type, int k, int geglu);
/* Whether kind multiplies int8-quantized activations (matvecq): its x is a q8act row (g3vk_q8_row_bytes(k) bytes)
 * that a q8act dispatch writes first (il = 1 for Q4_0 weights: the nibble order of shaders/q8act.comp). */
static inline int g3vk_kind_q8(int kind) { return kind == G3VK_K_MATVECQ || kind == G3VK_K_MATVECQ_GEGLU; }
static inline uint64_t g3vk_q8_row_bytes(uint64_t k) { return (k * 9 / 4 + 15) & ~(uint64_t)15; }
/* Output channels one workgroup of a matvec kind computes (grid = ceil(N / this)): matvec/matvec1/matvec1n 2
 * (GeGLU 1); matvec2 8 (GeGLU 4), or vk->mv2_nc (halved for GeGLU) with a $G3_VULKAN_MV2_* variant; matvec2n 4
 * (GeGLU 2), the NC of shaders/matvec2.comp (halved for GeGLU). */
int g3vk_matvec_outputs(const g3vk *vk, int kind);
g3_status g3vk_buf_create(g3vk *vk, VkDeviceSize size, g3vk_mem where, const char *what, g3vk_buf *b, g3_error *err);
void g3vk_buf_free(g3vk *vk, g3vk_buf *b);
/* Starts recording the one-shot command buffer / submits it and waits. */
g3_status g3vk_once_begin(g3vk *vk, g3_error *err);
g3_status g3vk_once_submit(g3vk *vk, g3_error *err);
/* Submits command buffers in order and waits for them. */
g3_status g3vk_submit_wait(g3vk *vk, const VkCommandBuffer *cbs, int n, g3_error *err);
/* Compute->compute (and transfer) memory barrier over everything. */
void g3vk_barrier(g3vk *vk, VkCommandBuffer cb);
g3_status g3vk_check(VkResult r, const char *what, g3_error *err);

/* ---- weights (vk_weights.c) ----------------------------------------------------------------------------------- */
g3_status g3vk_upload_begin(g3vk *vk, g3vk_upload *up, g3_error *err);
g3_status g3vk_upload_write(g3vk_upload *up, g3vk_buf *dst, size_t off, const void *src, size_t len, g3_error *err);
g3_status g3vk_upload_end(g3vk_upload *up, g3_error *err); /* flushes and frees the staging buffer */
/* Uploads the rows of n_parts matrices (same type and k) as one matrix: QKV fused into one projection. */
g3_status g3vk_weight_upload(g3vk_upload *up, const g3_weight *const *parts, int n_parts, const char *what,
                             g3vk_weight *out, g3_error *err);
void g3vk_weight_free(g3vk *vk, g3vk_weight *w);
/* Device bytes the repacked matrix takes (for memory planning). */
uint64_t g3vk_weight_bytes(uint32_t type, int64_t n, int64_t k);
/* The type a file type is kept as on the device (g3vk_weight.type, whose kernels run): itself, or Q8_0 for Q5_0
 * (its values q - 16 and scale d, exactly; no 5-bit kernels) */
uint32_t g3vk_resident_type(uint32_t type);

/* ---- embedded SPIR-V (generated at build time) ---------------------------------------------------------------- */
typedef struct g3vk_spirv {
    const char *name;
    const uint32_t *code;
    size_t size; /* bytes */
} g3vk_spirv;
extern const g3vk_spirv g3vk_spirv_table[];
extern const int g3vk_spirv_count;

/* ---- push constants (layouts match the shaders' push_constant blocks) ----------------------------------------- */
typedef struct pc_matmul {
    uint64_t w, waux, w2, w2aux, x, y, params;
    uint32_t N, K, ldx, ldy, nrows_idx, mode; /* mode: 0 plain, 1 softcap, 2 post-norm tail (matvec kernels) */
    float cap;
    uint64_t h, xo, cnt; /* mode 2 (shaders/tail_norm.glsl): residual, normed output, zeroed counter */
    uint64_t sc;         /* matmul_cm: [rows] uint32 guard exponents (cm_scale.comp) */
} pc_matmul;

/* shaders/cm_scale.comp: per row of x [rows][ldx] (K values, K % 4 == 0) the guard exponent e[row] of matmul_cm */
typedef struct pc_cm_scale {
    uint64_t x, e, params;
    uint32_t K, ldx, nrows_idx;
} pc_cm_scale;

/* shaders/q8act.comp: rows of x [rows][ldx] (k values) into q8act rows at xq; il: Q4_0 nibble order */
typedef struct pc_q8act {
    uint64_t x, xq, params;
    uint32_t K, ldx, nrows_idx, il;
} pc_q8act;

typedef struct pc_embed {
    uint64_t e, eaux, h, x, w, params;
    uint32_t H;
    float scale, eps;
} pc_embed;

typedef struct pc_add_norm {
    uint64_t t, h, x, w1, w2, params;
    uint32_t H;
    float eps;
} pc_add_norm;

typedef struct pc_gather {
    uint64_t x, xo, params;
    uint32_t H;
} pc_gather;

typedef struct pc_argmax {
    uint64_t logits, ids, params;
    uint32_t V, nb;       /* vocab; workgroups per row (g3vk_argmax_groups) */
    uint64_t part, cnt;   /* nb > 1: [rows][nb] (value, id) pairs; [rows] zeroed counters */
} pc_argmax;

/* Workgroups per row of argmax.comp (256 invocations, <= 8 values each up to 512k entries, so one pass of loads):
 * 129 for Gemma's 262208-entry vocab, 1 for small ones. */
#define G3VK_ARGMAX_MAX_GROUPS 256
static inline uint32_t g3vk_argmax_groups(uint32_t V) {
    uint32_t g = (V + 2047) / 2048;
    return g < 1 ? 1 : g > G3VK_ARGMAX_MAX_GROUPS ? G3VK_ARGMAX_MAX_GROUPS : g;
}

typedef struct pc_geglu {
    uint64_t gate, up, params;
    uint32_t F;
} pc_geglu;

typedef struct pc_qk_rope {
    uint64_t qkv, kv, params, qn, kn, invf;
    uint32_t ld, NH, KVH, D, B, li, block_floats, table;
    float eps;
} pc_qk_rope;

typedef struct pc_attn {
    uint64_t q, kv, out, part, params;
    uint32_t ld, NH, KVH, D, B, li, block_floats, table, window, chunk_len, n_chunks, mode, out_ld;
    float scale, cap;
    uint64_t cnt; /* mode 2 (split decode, merge fused): [rows][NH] zeroed counters */
} pc_attn;

/* Geometry of attn.comp (128 invocations; mirrors the shader): keys per tile for head_dim D, T = min(128 / P,
 * 8 * Q) with P = ceil(D/4 / 8) invocations per key in the score phase and Q = 128 / (D/4) key groups in the value
 * phase (D 256: 16 keys; 128: 32; 64: 64); query heads per workgroup GH = 4, 2 or 1, the largest dividing NH / KVH
 * (grid y = NH / GH). */
static inline uint32_t g3vk_attn_tile(uint32_t D) {
    uint32_t d4 = D / 4, p = (d4 + 7) / 8, q = 128 / d4, t = 128 / p;
    return t < 8 * q ? t : 8 * q;
}
static inline uint32_t g3vk_attn_heads(uint32_t NH, uint32_t KVH) {
    uint32_t g = NH / KVH;
    return g % 4 == 0 ? 4 : g % 2 == 0 ? 2 : 1;
}
/* Chunks of the split decode attention (the grid's x): at most 64 (attn_combine's workgroup merges one per
 * invocation) and no more than tiles in the context; $G3_VULKAN_ATTN_SPLIT=N (1..64) caps them lower (tuning). */
uint32_t g3vk_attn_chunks(uint32_t ctx, uint32_t D);

typedef struct pc_attn_combine {
    uint64_t out, part, params;
    uint32_t NH, D, window, chunk_len, n_chunks, out_ld;
} pc_attn_combine;

/* Per-step parameter block (int32 indices; the shaders' P_* in common.glsl). */
enum { G3VK_P_NROWS = 0, G3VK_P_NOUT = 1, G3VK_P_OUTBASE = 2, G3VK_P_TOK = 4, G3VK_P_POS = 5, G3VK_P_SEQ = 6,
       G3VK_P_OUT = 7, G3VK_P_BTG = 8, G3VK_P_BTL = 9, G3VK_P_BPS = 10, G3VK_P_HEADER = 16 };

#endif
