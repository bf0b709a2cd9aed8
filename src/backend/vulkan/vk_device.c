/* The Vulkan device context: the choice among the devices (vk_instance.c lists them), the logical device with its
 * compute queue, buffers with device addresses, pipelines built from the embedded SPIR-V (and the decode-kernel
 * switches), and one-shot submissions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "backend/vulkan/vulkan_api.h"
#include "gemma3.h"
#include "model/dtype.h"


g3_status g3vk_check(VkResult r, const char *what, g3_error *err) {
    if (r == VK_SUCCESS) return G3_OK;
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        return g3_fail(err, G3_ERR_NOMEM, "vulkan: %s: out of %s memory", what,
                       r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host");
    return g3_fail(err, G3_ERR_DEVICE, "vulkan: %s failed (VkResult %d)", what, (int)r);
}

/* ---- the device ---------------------------------------------------------------------------------------------- */

static int has_ext(const VkExtensionProperties *ep, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(ep[i].extensionName, name)) return 1;
    return 0;
}

/* A 16x16x16 f16 x f16 -> f32 subgroup product among the device's NV / KHR property lists (same enum values). */
static int cm_nv_shape(g3vk *vk, VkPhysicalDevice pd) {
    uint32_t n = 0;
    vk->vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, NULL);
    VkCooperativeMatrixPropertiesNV *cp = calloc(n ? n : 1, sizeof *cp);
    int ok = 0;
    for (uint32_t i = 0; cp && i < n; i++) cp[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
    if (cp && vk->vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, cp) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            ok |= cp[i].MSize == 16 && cp[i].NSize == 16 && cp[i].KSize == 16 &&
                  cp[i].AType == VK_COMPONENT_TYPE_FLOAT16_NV && cp[i].BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                  cp[i].CType == VK_COMPONENT_TYPE_FLOAT32_NV && cp[i].DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                  cp[i].scope == VK_SCOPE_SUBGROUP_NV;
    free(cp);
    return ok;
}

static int cm_khr_shape(g3vk *vk, VkPhysicalDevice pd) {
    uint32_t n = 0;
    vk->vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR(pd, &n, NULL);
    VkCooperativeMatrixPropertiesKHR *cp = calloc(n ? n : 1, sizeof *cp);
    int ok = 0;
    for (uint32_t i = 0; cp && i < n; i++) cp[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR;
    if (cp && vk->vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR(pd, &n, cp) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            ok |= cp[i].MSize == 16 && cp[i].NSize == 16 && cp[i].KSize == 16 &&
                  cp[i].AType == VK_COMPONENT_TYPE_FLOAT16_NV && cp[i].BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                  cp[i].CType == VK_COMPONENT_TYPE_FLOAT32_NV && cp[i].ResultType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                  cp[i].scope == VK_SCOPE_SUBGROUP_NV;
    free(cp);
    return ok;
}

/* Subgroups of exactly 32 on request (VK_EXT_subgroup_size_control: the instance is Vulkan 1.2, so not the 1.3 core
 * feature): for wave64-by-default devices (AMD RDNA) whose compute subgroups can be 32. */
static int sg32_control(g3vk *vk, VkPhysicalDevice pd) {
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT sf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &sf};
    vk->vkGetPhysicalDeviceFeatures2(pd, &f2);
    VkPhysicalDeviceSubgroupSizeControlPropertiesEXT sp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sp};
    vk->vkGetPhysicalDeviceProperties2(pd, &p2);
    return sf.subgroupSizeControl && sp.minSubgroupSize <= 32 && sp.maxSubgroupSize >= 32 &&
           (sp.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) && sp.maxComputeWorkgroupSubgroups >= 4;
}

int g3vk_coopmat_probe(g3vk *vk, VkPhysicalDevice pd, int *sg32) {
    *sg32 = 0;
    if (!vk->vkEnumerateDeviceExtensionProperties || !vk->vkGetPhysicalDeviceFeatures2) return 0;
    VkPhysicalDeviceProperties p;
    vk->vkGetPhysicalDeviceProperties(pd, &p);
    if (p.apiVersion < VK_API_VERSION_1_2) return 0;
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vk->vkGetPhysicalDeviceProperties2(pd, &p2);
    if (!(sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) || !(sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT))
        return 0;
    uint32_t n = 0;
    vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL);
    VkExtensionProperties *ep = calloc(n ? n : 1, sizeof *ep);
    if (!ep || vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, ep) != VK_SUCCESS) n = 0;
    int nv = has_ext(ep, n, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) && vk->vkGetPhysicalDeviceCooperativeMatrixPropertiesNV;
    int khr = has_ext(ep, n, VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME) && vk->vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR;
    int ctl = has_ext(ep, n, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    free(ep);
    if (!nv && !khr) return 0;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV fnv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR fkhr = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    if (nv) fnv.pNext = f12.pNext, f12.pNext = &fnv;
    if (khr) fkhr.pNext = f12.pNext, f12.pNext = &fkhr;
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vk->vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!f12.shaderFloat16 || !f12.vulkanMemoryModel) return 0;
    int got = 0;
    /* NV: NVIDIA's subgroups are 32 */
    if (nv && fnv.cooperativeMatrix && sg.subgroupSize == 32 && cm_nv_shape(vk, pd)) got |= G3VK_CM_NV;
    if (khr && fkhr.cooperativeMatrix && cm_khr_shape(vk, pd)) {
        if (sg.subgroupSize == 32) got |= G3VK_CM_KHR;
        else if (ctl && sg32_control(vk, pd)) got |= G3VK_CM_KHR, *sg32 = 1;
    }
    return got;
}

/* KHR by default: the cross-vendor extension (AMD RDNA3, Intel, NVIDIA), NV where only it exists (older NVIDIA
 * drivers); on a device with both (NVIDIA), the two run the same SPIR-V but for the rewrite, so the choice follows the
 * standard until a measurement says otherwise ($G3_VULKAN_COOPMAT=nv|khr picks one). */
int g3vk_coopmat_pick(int usable) {
    const char *e = getenv("G3_VULKAN_COOPMAT");
    if (e && !strcmp(e, "0")) return G3VK_CM_NONE;
    if (e && !strcmp(e, "nv")) return usable & G3VK_CM_NV;
    if (e && !strcmp(e, "khr")) return usable & G3VK_CM_KHR;
    return usable & G3VK_CM_KHR ? G3VK_CM_KHR : usable & G3VK_CM_NV;
}

/* $G3_VULKAN_MV2_WG (32|64|128|256 threads per workgroup), _NC (4|8|16 output channels per workgroup; GeGLU half of
 * them for gate and up each), _COLS (1|2|4 chunk columns per thread per iteration): the one-row matvec2 products
 * through matvec2s* (the same source with these as specialization constants) instead of the kernel compiled with
 * 64 / 8 / 2. The default is 64 / 4 / 2 (matvec2s*, below); _NC=8 gives the compiled kernel, and
 * $G3_VULKAN_MV2_SPEC=1 takes matvec2s* even at 64 / 8 / 2 (the control of a sweep). Unknown values and a variant
 * past the device's workgroup or shared-memory limits fall back to the compiled kernel. */
static uint32_t env_choice(const char *name, const uint32_t *allowed, int n, uint32_t def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long x = strtoul(v, &end, 10);
    for (int i = 0; i < n && !*end; i++)
        if (x == allowed[i]) return allowed[i];
    return def;
}

/* The specialization constants of a one-row product (matvec2s*, matvecq): $<prefix>_WG (32|64|128|256 threads),
 * _NC (channels per workgroup, one of ncs; default 4), _COLS (1|2|4 chunk columns; default 2), unknown values their
 * defaults; a variant past the device's workgroup or shared-memory limits (4 * wg * (nc + 1) + 64 bytes: part_sh,
 * red_sh, tail_last) becomes 64 / fb_nc / 2. Returns whether any of the three variables is set. */
static int spec_variant(const g3vk *vk, const char *prefix, const uint32_t *ncs, int n_ncs, uint32_t fb_nc,
                        uint32_t *wg, uint32_t *nc, uint32_t *col) {
    static const uint32_t wgs[] = {32, 64, 128, 256}, cols[] = {1, 2, 4};
    char nw[64], nn[64], nk[64];
    snprintf(nw, sizeof nw, "%s_WG", prefix), snprintf(nn, sizeof nn, "%s_NC", prefix);
    snprintf(nk, sizeof nk, "%s_COLS", prefix);
    *wg = env_choice(nw, wgs, 4, 64), *nc = env_choice(nn, ncs, n_ncs, 4), *col = env_choice(nk, cols, 3, 2);
    const VkPhysicalDeviceLimits *lim = &vk->props.limits;
    const uint64_t smem = 4ull * *wg * (*nc + 1) + 64;
    if (*wg > lim->maxComputeWorkGroupInvocations || *wg > lim->maxComputeWorkGroupSize[0] ||
        smem > lim->maxComputeSharedMemorySize)
        *wg = 64, *nc = fb_nc, *col = 2;
    return getenv(nw) || getenv(nn) || getenv(nk);
}

static void mv2_variant(g3vk *vk) {
    /* 4 channels a workgroup by default: measured on the H200 (session 4, batch-1 decode tok/s, 8 -> 4): 1B Q4_0
     * 521.8 -> 572.4, 1B Q8_0 526.2 -> 546.3, 4B Q4_0 291.1 -> 326.1, 4B Q8_0 300.8 -> 318.5, 27B Q8_0 81.6 -> 83.2;
     * only 27B Q4_0 lost (86.6 -> 81.7; G3_VULKAN_MV2_NC=8 restores the compiled kernel) */
    static const uint32_t ncs[] = {4, 8, 16};
    const int set = spec_variant(vk, "G3_VULKAN_MV2", ncs, 3, 8, &vk->mv2_wg, &vk->mv2_nc, &vk->mv2_cols);
    const char *sp = getenv("G3_VULKAN_MV2_SPEC");
    vk->mv2_spec = (sp && *sp == '1') || vk->mv2_wg != 64 || vk->mv2_nc != 8 || vk->mv2_cols != 2;
    if (vk->mv2_spec && set)
        fprintf(stderr, "gemma3: vulkan: one-row matvec2 variant: %u threads, %u channels, %u chunk columns\n",
                vk->mv2_wg, vk->mv2_nc, vk->mv2_cols);
}

/* The one-row int8 product (matvecq.comp), where the device has int8 dot products: by default (vk->mvq 2) for Q4_0
 * only; measured on the H200 (session 5, batch-1 decode tok/s, matvec2 -> matvecq for every product): Q4_0 1B 561.9 ->
 * 551.6, 4B 322.5 -> 372.0, 27B 81.5 -> 117.1; Q8_0 1B 545.2 -> 512.1, 4B 318.6 -> 309.2, 27B 83.1 -> 86.4, and with
 * only the down products (k >= 4096) on it 1B 543.8 -> 532.6, 4B 320.5 -> 313.8: Q8_0 weights cost matvec2 little to
 * decode, so the extra quantization dispatch pays off only at 27B. $G3_VULKAN_MVQ=0: off (also, with $G3_VULKAN_MVQ
 * unset, $G3_VULKAN_MV2=0: back to the float kernels); $G3_VULKAN_MVQ=1: every Q8_0/Q4_0 one-row product, even with
 * $G3_VULKAN_MV2=0. $G3_VULKAN_MVQ_WG (32|64|128|256 threads), _NC (2|4|8|16 weight rows per workgroup, GeGLU: half
 * gate, half up), _COLS (1|2|4 chunk columns per iteration): its specialization constants (tuning sweeps; unknown
 * values and variants past the device's limits: the defaults 64 / 4 / 2, the numbers of matvec2's default). */
static void mvq_setup(g3vk *vk, int idot) {
    const char *e = getenv("G3_VULKAN_MVQ");
    int want = e && *e ? *e != '0' : vk->mv2 ? 2 : 0;
    vk->mvq = idot ? want : 0;
    if (e && *e == '1' && !idot)
        fprintf(stderr, "gemma3: vulkan: G3_VULKAN_MVQ=1 but the device has no int8 dot products: matvec2 instead\n");
    static const uint32_t ncs[] = {2, 4, 8, 16};
    const int set = spec_variant(vk, "G3_VULKAN_MVQ", ncs, 4, 4, &vk->mvq_wg, &vk->mvq_nc, &vk->mvq_cols);
    if (vk->mvq && set)
        fprintf(stderr, "gemma3: vulkan: one-row matvecq variant: %u threads, %u channels, %u chunk columns\n",
                vk->mvq_wg, vk->mvq_nc, vk->mvq_cols);
}

g3_status g3vk_init(g3vk *vk, int index, g3_error *err) {
    memset(vk, 0, sizeof *vk);
    G3_TRY(g3vk_open_instance(vk, err));
    const char *env = getenv("G3_VULKAN_DEVICE");
    if (env && *env) index = atoi(env);
    VkPhysicalDevice pd[G3VK_MAX_PDEV];
    int n = g3vk_sorted_devices(vk, pd);
    if (n == 0) return g3_fail(err, G3_ERR_DEVICE, "vulkan: no Vulkan device found");
    if (index < 0 || index >= n)
        return g3_fail(err, G3_ERR_DEVICE, "vulkan: device %d does not exist (%d found; `gemma3 info --devices` lists them)",
                       index, n);
    g3_vulkan_device info;
    g3vk_describe(vk, pd[index], index, &info);
    if (!info.usable)
        return g3_fail(err, G3_ERR_DEVICE, "vulkan: device %d (%s) lacks %s", index, info.name, info.missing);
    vk->pdev = pd[index];
    vk->index = index;
    const char *nosg = getenv("G3_VULKAN_NO_SUBGROUPS");
    vk->subgroups = info.subgroup_arithmetic && !(nosg && *nosg == '1');
    vk->subgroup_size = info.subgroup_size;
    const char *st = getenv("G3_VULKAN_STAGING");
    vk->force_staging = st && *st == '1';
    const char *mv1 = getenv("G3_VULKAN_MATVEC1");
    vk->matvec1 = !(mv1 && *mv1 == '0');
    const char *mvn = getenv("G3_VULKAN_MATVECN");
    vk->matvecn = !(mvn && *mvn == '0');
    const char *m2 = getenv("G3_VULKAN_MV2");
    /* default since the H200 A/B (batch-1 decode, tok/s, matvec2 vs matvec1: 27B Q4_0 70.5 vs 38.5, Q8_0 66.4 vs 57.4;
     * 4B Q4_0 213 vs 149, Q8_0 8 rows 666 vs 499; 1B Q4_0 351 vs 275); $G3_VULKAN_MV2=0: matvec1 / matvec1n */
    vk->mv2 = !(m2 && *m2 == '0');
    const char *fu = getenv("G3_VULKAN_FUSE");
    /* opt-in: test_vulkan_backend / test_vulkan_model pass with it on the H200's Vulkan driver (the last-workgroup
     * epilogue relies on cross-workgroup memory ordering that lavapipe cannot disprove), but it measured no faster
     * there (1B q8_0 decode, tok/s, fused vs separate: 1 row 353.9 / 353.1, 4 rows 795 / 860, 8 rows 1070 / 1178) */
    vk->fuse = fu && *fu == '1';
    vk->vkGetPhysicalDeviceProperties(vk->pdev, &vk->props);
    vk->vkGetPhysicalDeviceMemoryProperties(vk->pdev, &vk->memp);
    mv2_variant(vk);
    mvq_setup(vk, info.int8_dot);
    /* compute queue: prefer a family without graphics (dedicated compute) */
    uint32_t nq = 0;
    VkQueueFamilyProperties qf[32];
    vk->vkGetPhysicalDeviceQueueFamilyProperties(vk->pdev, &nq, NULL);
    if (nq > 32) nq = 32;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(vk->pdev, &nq, qf);
    int fam = -1;
    for (uint32_t i = 0; i < nq && fam < 0; i++)
        if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) fam = (int)i;
    for (uint32_t i = 0; i < nq && fam < 0; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) fam = (int)i;
    vk->qfam = (uint32_t)fam;
    vk->ts_bits = fam >= 0 ? qf[fam].timestampValidBits : 0;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = vk->qfam,
                                   .queueCount = 1, .pQueuePriorities = &prio};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .bufferDeviceAddress = VK_TRUE};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    f2.features.shaderInt64 = VK_TRUE;
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f2, .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci};
    /* cooperative matrices for prefill (matmul_cm): the flavour g3vk_coopmat_pick takes ($G3_VULKAN_COOPMAT) */
    const char *exts[4];
    uint32_t n_ext = 0;
    int sg32 = 0, usable = vk->subgroups ? g3vk_coopmat_probe(vk, vk->pdev, &sg32) : 0;
    vk->coopmat = g3vk_coopmat_pick(usable);
    const char *cme = getenv("G3_VULKAN_COOPMAT");
    if (cme && (!strcmp(cme, "nv") || !strcmp(cme, "khr")) && !vk->coopmat)
        fprintf(stderr, "gemma3: vulkan: G3_VULKAN_COOPMAT=%s but device %d cannot run it (usable: %s): prefill on "
                        "the portable matmul\n", cme, index, usable == 3 ? "nv, khr" : usable == 1 ? "nv" : usable ? "khr" : "none");
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cmf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR cmk = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT ssc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT, .subgroupSizeControl = VK_TRUE};
    if (vk->coopmat) { /* both modules declare the Vulkan memory model (glslc emits it for cooperative matrices) */
        f12.shaderFloat16 = VK_TRUE, f12.vulkanMemoryModel = VK_TRUE;
        if (vk->coopmat == G3VK_CM_NV) {
            cmf.pNext = f12.pNext, f12.pNext = &cmf;
            exts[n_ext++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
        } else {
            cmk.pNext = f12.pNext, f12.pNext = &cmk;
            exts[n_ext++] = VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME;
            vk->cm_sg32 = sg32;
            if (sg32) {
                ssc.pNext = f12.pNext, f12.pNext = &ssc;
                exts[n_ext++] = VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME;
            }
        }
    }
    /* int8 dot products for matvecq.comp (SPV_KHR_integer_dot_product): enabled only when it will run */
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR,
        .shaderIntegerDotProduct = VK_TRUE};
    if (vk->mvq) {
        vk->idot = 1;
        idf.pNext = f12.pNext, f12.pNext = &idf;
        exts[n_ext++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
    }
    dci.enabledExtensionCount = n_ext, dci.ppEnabledExtensionNames = n_ext ? exts : NULL;
    VkResult r = vk->vkCreateDevice(vk->pdev, &dci, NULL, &vk->dev);
    if (r != VK_SUCCESS)
        return g3_fail(err, G3_ERR_DEVICE, "vulkan: cannot create a device on %s (VkResult %d)", info.name, (int)r);
#define LOAD_DEV(name)                                                                                                 \
    vk->name = (PFN_##name)vk->vkGetDeviceProcAddr(vk->dev, #name);                                                    \
    if (!vk->name) return g3_fail(err, G3_ERR_DEVICE, "vulkan: the driver lacks %s", #name);
    G3VK_DEVICE_FNS(LOAD_DEV)
#undef LOAD_DEV
    vk->vkGetDeviceQueue(vk->dev, vk->qfam, 0, &vk->queue);
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = vk->qfam};
    G3_TRY(g3vk_check(vk->vkCreateCommandPool(vk->dev, &pci, NULL, &vk->pool), "vkCreateCommandPool", err));
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    G3_TRY(g3vk_check(vk->vkAllocateCommandBuffers(vk->dev, &cai, &vk->once), "vkAllocateCommandBuffers", err));
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    G3_TRY(g3vk_check(vk->vkCreateFence(vk->dev, &fci, NULL, &vk->fence), "vkCreateFence", err));
    VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = 128};
    VkPipelineLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                      .pushConstantRangeCount = 1, .pPushConstantRanges = &pcr};
    G3_TRY(g3vk_check(vk->vkCreatePipelineLayout(vk->dev, &lci, NULL, &vk->layout), "vkCreatePipelineLayout", err));
    VkPipelineCacheCreateInfo cci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    G3_TRY(g3vk_check(vk->vkCreatePipelineCache(vk->dev, &cci, NULL, &vk->cache), "vkCreatePipelineCache", err));
    return G3_OK;
}

void g3vk_deinit(g3vk *vk) {
    if (vk->dev && vk->vkDestroyDevice && vk->vkDeviceWaitIdle && vk->vkDestroyPipeline && vk->vkDestroyPipelineCache &&
        vk->vkDestroyPipelineLayout && vk->vkDestroyFence && vk->vkDestroyCommandPool) {
        vk->vkDeviceWaitIdle(vk->dev);
        g3vk_buf_free(vk, &vk->cm_exp);
        for (int i = 0; i < G3VK_NPIPES; i++)
            if (vk->pipes[i]) vk->vkDestroyPipeline(vk->dev, vk->pipes[i], NULL);
        if (vk->cache) vk->vkDestroyPipelineCache(vk->dev, vk->cache, NULL);
        if (vk->layout) vk->vkDestroyPipelineLayout(vk->dev, vk->layout, NULL);
        if (vk->fence) vk->vkDestroyFence(vk->dev, vk->fence, NULL);
        if (vk->pool) vk->vkDestroyCommandPool(vk->dev, vk->pool, NULL);
        vk->vkDestroyDevice(vk->dev, NULL);
    }
    g3vk_close_instance(vk);
    memset(vk, 0, sizeof *vk);
}

/* ---- pipelines ----------------------------------------------------------------------------------------------- */

static const struct {
    uint32_t type;
    const char *suffix;
} types[G3VK_NTYPES] = {{G3_DTYPE_F32, "f32"},   {G3_DTYPE_F16, "f16"},   {G3_DTYPE_BF16, "bf16"}, {G3_DTYPE_Q8_0, "q8_0"},
                        {G3_DTYPE_Q4_0, "q4_0"}, {G3_DTYPE_Q4_K, "q4_k"}, {G3_DTYPE_Q6_K, "q6_k"}, {G3_DTYPE_Q4_1, "q4_1"},
                        {G3_DTYPE_Q5_1, "q5_1"}, {G3_DTYPE_Q5_K, "q5_k"}};

int g3vk_type_index(uint32_t type) {
    for (int i = 0; i < G3VK_NTYPES; i++)
        if (types[i].type == type) return i;
    return -1;
}

const char *g3vk_type_suffix(uint32_t type) {
    int i = g3vk_type_index(type);
    return i < 0 ? NULL : types[i].suffix;
}

static const char *kernel_names[G3VK_K_COUNT] = {
    "matvec",  "matvec_geglu", "matmul",   "matmul_geglu", "embed",  "matvec1", "matvec1_geglu", "matmul_cm",
    "matmul_cm_geglu", "matvec1n", "matvec1n_geglu", "matvec2", "matvec2_geglu", "matvec2n", "matvec2n_geglu",
    "matvecq", "matvecq_geglu", "qk_rope", "attn", "attn_combine", "add_norm", "gather", "geglu",
    "argmax", "test_sincos", "qk_rope_kv16", "attn_kv16", "q8act", "cm_scale"};

int g3vk_matmul_kind(const g3vk *vk, int rows, uint32_t type, int k, int geglu) {
    /* GGUF block weights only: the f16 tensor-core sums (~8e-5 of sum |x w| on the H200) are far inside their
     * quantization error, but would put float checkpoints past the float parity bound (matmul_cm.comp) */
    if (rows > 8 && vk->coopmat && k % 32 == 0 && g3_dtype_get(type)->quantized)
        return geglu ? G3VK_K_MATMUL_CM_GEGLU : G3VK_K_MATMUL_CM;
    if (rows > 8) return geglu ? G3VK_K_MATMUL_GEGLU : G3VK_K_MATMUL;
    if (rows == 1 && vk->mvq && k % 32 == 0 &&
        (type == G3_DTYPE_Q4_0 || (type == G3_DTYPE_Q8_0 && vk->mvq == 1)))
        return geglu ? G3VK_K_MATVECQ_GEGLU : G3VK_K_MATVECQ;
    int chunked = k % 32 == 0 &&
                  (type == G3_DTYPE_F16 || type == G3_DTYPE_BF16 || type == G3_DTYPE_Q8_0 || type == G3_DTYPE_Q4_0);
    if (chunked && vk->mv2) return rows == 1 ? (geglu ? G3VK_K_MATVEC2_GEGLU : G3VK_K_MATVEC2)
                                             : (geglu ? G3VK_K_MATVEC2N_GEGLU : G3VK_K_MATVEC2N);
    if (chunked && rows == 1 && vk->matvec1) return geglu ? G3VK_K_MATVEC1_GEGLU : G3VK_K_MATVEC1;
    if (chunked && rows > 1 && vk->matvecn) return geglu ? G3VK_K_MATVEC1N_GEGLU : G3VK_K_MATVEC1N;
    return geglu ? G3VK_K_MATVEC_GEGLU : G3VK_K_MATVEC;
}

int g3vk_matvec_outputs(const g3vk *vk, int kind) {
    switch (kind) {
    case G3VK_K_MATVEC2: return vk->mv2_spec ? (int)vk->mv2_nc : 8;
    case G3VK_K_MATVEC2_GEGLU: return vk->mv2_spec ? (int)vk->mv2_nc / 2 : 4;
    case G3VK_K_MATVECQ: return (int)vk->mvq_nc;
    case G3VK_K_MATVECQ_GEGLU: return (int)vk->mvq_nc / 2;
    case G3VK_K_MATVEC2N: return 4;
    case G3VK_K_MATVEC2N_GEGLU: return 2;
    case G3VK_K_MATVEC_GEGLU: case G3VK_K_MATVEC1_GEGLU: case G3VK_K_MATVEC1N_GEGLU: return 1;
    default: return 2;
    }
}

g3_status g3vk_pipeline(g3vk *vk, int kind, uint32_t type, VkPipeline *out, g3_error *err) {
    int slot, spec = vk->mv2_spec && (kind == G3VK_K_MATVEC2 || kind == G3VK_K_MATVEC2_GEGLU);
    char name[64];
    if (kind < G3VK_K_TYPED) {
        int ti = g3vk_type_index(type);
        if (ti < 0) return g3_fail(err, G3_ERR_UNSUPPORTED, "vulkan: no kernels for weight type %s",
                                   g3_dtype_name((g3_dtype)type));
        slot = kind * G3VK_NTYPES + ti;
        const char *kn = kernel_names[kind];
        if (spec) kn = kind == G3VK_K_MATVEC2 ? "matvec2s" : "matvec2s_geglu";
        if (vk->coopmat == G3VK_CM_KHR && (kind == G3VK_K_MATMUL_CM || kind == G3VK_K_MATMUL_CM_GEGLU))
            kn = kind == G3VK_K_MATMUL_CM ? "matmul_cmk" : "matmul_cmk_geglu"; /* matmul_cm rewritten to KHR */
        snprintf(name, sizeof name, "%s_%s%s", kn, types[ti].suffix, vk->subgroups ? "" : "_nosg");
    } else {
        slot = G3VK_K_TYPED * G3VK_NTYPES + (kind - G3VK_K_TYPED);
        snprintf(name, sizeof name, "%s%s", kernel_names[kind], vk->subgroups ? "" : "_nosg");
    }
    if (vk->pipes[slot]) {
        *out = vk->pipes[slot];
        return G3_OK;
    }
    const g3vk_spirv *sp = NULL;
    for (int i = 0; i < g3vk_spirv_count && !sp; i++)
        if (!strcmp(g3vk_spirv_table[i].name, name)) sp = &g3vk_spirv_table[i];
    if (!sp) return g3_fail(err, G3_ERR_DEVICE, "vulkan: shader %s is not in this build", name);
    VkShaderModuleCreateInfo smi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = sp->size,
                                    .pCode = sp->code};
    VkShaderModule mod;
    G3_TRY(g3vk_check(vk->vkCreateShaderModule(vk->dev, &smi, NULL, &mod), "vkCreateShaderModule", err));
    /* constant_id 0, 1, 2 of matvec2.comp (MV2_SPEC) and of matvecq.comp */
    uint32_t sv[3] = {vk->mv2_wg, vk->mv2_nc, vk->mv2_cols};
    if (g3vk_kind_q8(kind)) spec = 1, sv[0] = vk->mvq_wg, sv[1] = vk->mvq_nc, sv[2] = vk->mvq_cols;
    VkSpecializationMapEntry se[3] = {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}};
    VkSpecializationInfo si = {.mapEntryCount = 3, .pMapEntries = se, .dataSize = sizeof sv, .pData = sv};
    /* matmul_cm assumes 4 subgroups of 32: asked for where the device's default differs (g3vk_coopmat_probe) */
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT rss = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT, .requiredSubgroupSize = 32};
    int cm_kind = kind == G3VK_K_MATMUL_CM || kind == G3VK_K_MATMUL_CM_GEGLU;
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .pNext = cm_kind && vk->cm_sg32 ? &rss : NULL, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod, .pName = "main", .pSpecializationInfo = spec ? &si : NULL},
        .layout = vk->layout};
    VkResult r = vk->vkCreateComputePipelines(vk->dev, vk->cache, 1, &ci, NULL, &vk->pipes[slot]);
    vk->vkDestroyShaderModule(vk->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        vk->pipes[slot] = VK_NULL_HANDLE;
        return g3_fail(err, G3_ERR_DEVICE, "vulkan: cannot build pipeline %s (VkResult %d)", name, (int)r);
    }
    *out = vk->pipes[slot];
    return G3_OK;
}

/* ---- buffers ------------------------------------------------------------------------------------------------- */

/* Best memory type among allowed `bits`: all of `need`, as many of `want` as possible, none of `avoid` if it can. */
static int pick_memory(const g3vk *vk, uint32_t bits, VkMemoryPropertyFlags need, VkMemoryPropertyFlags want,
                       VkMemoryPropertyFlags avoid) {
    int best = -1, best_score = -1;
    for (uint32_t i = 0; i < vk->memp.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = vk->memp.memoryTypes[i].propertyFlags;
        if (!(bits & (1u << i)) || (f & need) != need) continue;
        int score = 4 * __builtin_popcount(f & want) + ((f & avoid) ? 0 : 2);
        if (score > best_score) best = (int)i, best_score = score;
    }
    return best;
}

g3_status g3vk_buf_create(g3vk *vk, VkDeviceSize size, g3vk_mem where, const char *what, g3vk_buf *b, g3_error *err) {
    memset(b, 0, sizeof *b);
    if (size == 0) size = 256;
    size = (size + 255) & ~(VkDeviceSize)255;
    b->size = size;
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = size,
                              .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                       VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vk->vkCreateBuffer(vk->dev, &bci, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        b->buf = VK_NULL_HANDLE;
        return g3_fail(err, r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? G3_ERR_NOMEM
                                                                                                  : G3_ERR_DEVICE,
                       "vulkan: cannot create a buffer of %.3f GB for %s (VkResult %d)", (double)size / 1e9, what, (int)r);
    }
    VkMemoryRequirements req;
    vk->vkGetBufferMemoryRequirements(vk->dev, b->buf, &req);
    const VkMemoryPropertyFlags DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                HC = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, CA = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    int mt = -1;
    switch (where) {
    case G3VK_MEM_DEVICE: mt = pick_memory(vk, req.memoryTypeBits, 0, DL, HV); break;
    case G3VK_MEM_UPLOAD: mt = pick_memory(vk, req.memoryTypeBits, HV | HC, DL, 0); break;
    case G3VK_MEM_READBACK: mt = pick_memory(vk, req.memoryTypeBits, HV, CA | HC, 0); break;
    case G3VK_MEM_STAGING: mt = pick_memory(vk, req.memoryTypeBits, HV | HC, 0, DL); break;
    }
    if (mt < 0) return g3_fail(err, G3_ERR_DEVICE, "vulkan: no suitable memory type for %s", what);
    VkMemoryType t = vk->memp.memoryTypes[mt];
    VkDeviceSize heap = vk->memp.memoryHeaps[t.heapIndex].size;
    VkMemoryAllocateFlagsInfo afi = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                     .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = &afi,
                                .allocationSize = req.size, .memoryTypeIndex = (uint32_t)mt};
    r = vk->vkAllocateMemory(vk->dev, &mai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        b->mem = VK_NULL_HANDLE;
        g3vk_buf_free(vk, b);
        return g3_fail(err, r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? G3_ERR_NOMEM
                                                                                                  : G3_ERR_DEVICE,
                       "vulkan: not enough device memory for %s: %.3f GB more after %.3f GB (heap of %.2f GB; "
                       "VkResult %d)",
                       what, (double)req.size / 1e9, (double)vk->allocated / 1e9, (double)heap / 1e9, (int)r);
    }
    vk->allocated += req.size;
    G3_TRY(g3vk_check(vk->vkBindBufferMemory(vk->dev, b->buf, b->mem, 0), "vkBindBufferMemory", err));
    if (t.propertyFlags & HV) {
        G3_TRY(g3vk_check(vk->vkMapMemory(vk->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map), "vkMapMemory", err));
        b->coherent = !!(t.propertyFlags & HC);
    }
    VkBufferDeviceAddressInfo ai = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = b->buf};
    b->addr = vk->vkGetBufferDeviceAddress(vk->dev, &ai);
    return G3_OK;
}

void g3vk_buf_free(g3vk *vk, g3vk_buf *b) {
    if (!vk->dev) return;
    if (b->buf) vk->vkDestroyBuffer(vk->dev, b->buf, NULL);
    if (b->mem) {
        vk->vkFreeMemory(vk->dev, b->mem, NULL);
        vk->allocated -= b->size <= vk->allocated ? b->size : vk->allocated;
    }
    memset(b, 0, sizeof *b);
}

/* ---- submissions --------------------------------------------------------------------------------------------- */

g3_status g3vk_once_begin(g3vk *vk, g3_error *err) {
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    return g3vk_check(vk->vkBeginCommandBuffer(vk->once, &bi), "vkBeginCommandBuffer", err);
}

g3_status g3vk_once_submit(g3vk *vk, g3_error *err) {
    G3_TRY(g3vk_check(vk->vkEndCommandBuffer(vk->once), "vkEndCommandBuffer", err));
    return g3vk_submit_wait(vk, &vk->once, 1, err);
}

g3_status g3vk_submit_wait(g3vk *vk, const VkCommandBuffer *cbs, int n, g3_error *err) {
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = (uint32_t)n,
                       .pCommandBuffers = cbs};
    G3_TRY(g3vk_check(vk->vkResetFences(vk->dev, 1, &vk->fence), "vkResetFences", err));
    G3_TRY(g3vk_check(vk->vkQueueSubmit(vk->queue, 1, &si, vk->fence), "vkQueueSubmit", err));
    VkResult r;
    do r = vk->vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, 1000000000ull);
    while (r == VK_TIMEOUT);
    return g3vk_check(r, "vkWaitForFences", err);
}

void g3vk_barrier(g3vk *vk, VkCommandBuffer cb) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vk->vkCmdPipelineBarrier(cb, st, st, 0, 1, &mb, 0, NULL, 0, NULL);
}
