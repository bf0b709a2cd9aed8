/* The Vulkan loader (opened at run time) and the one instance every context of the process shares, the device
 * list (best first) with what each device offers, and its printing for `gemma3 info --devices`. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "backend/vulkan/vulkan_api.h"
#include "gemma3.h"

/* ---- loader and instance ------------------------------------------------------------------------------------- */

static g3_status create_instance(g3vk *vk, g3_error *err) {
    const char *names[] = {"libvulkan.so.1", "libvulkan.so"};
    for (size_t i = 0; i < 2 && !vk->lib; i++) vk->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!vk->lib)
        return g3_fail(err, G3_ERR_DEVICE, "vulkan: cannot open the Vulkan loader libvulkan.so.1 (install libvulkan1 "
                                           "and a driver, e.g. mesa-vulkan-drivers)");
    vk->vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(vk->lib, "vkGetInstanceProcAddr");
    if (!vk->vkGetInstanceProcAddr) return g3_fail(err, G3_ERR_DEVICE, "vulkan: the loader has no vkGetInstanceProcAddr");
#define LOAD_GLOBAL(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(NULL, #name);
    G3VK_GLOBAL_FNS(LOAD_GLOBAL)
#undef LOAD_GLOBAL
    if (!vk->vkCreateInstance) return g3_fail(err, G3_ERR_DEVICE, "vulkan: the loader has no vkCreateInstance");
    uint32_t api = VK_API_VERSION_1_0;
    if (vk->vkEnumerateInstanceVersion) vk->vkEnumerateInstanceVersion(&api);
    if (api < VK_API_VERSION_1_2)
        return g3_fail(err, G3_ERR_DEVICE, "vulkan: the loader supports Vulkan %u.%u; this backend needs 1.2",
                       VK_API_VERSION_MAJOR(api), VK_API_VERSION_MINOR(api));
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "gemma3",
                             .pEngineName = "gemma3", .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    const char *layer = "VK_LAYER_KHRONOS_validation";
    const char *val = getenv("G3_VULKAN_VALIDATE");
    if (val && *val == '1' && vk->vkEnumerateInstanceLayerProperties) {
        uint32_t nl = 0;
        vk->vkEnumerateInstanceLayerProperties(&nl, NULL);
        VkLayerProperties *lp = calloc(nl ? nl : 1, sizeof *lp);
        if (lp && vk->vkEnumerateInstanceLayerProperties(&nl, lp) == VK_SUCCESS)
            for (uint32_t i = 0; i < nl; i++)
                if (!strcmp(lp[i].layerName, layer)) ici.enabledLayerCount = 1, ici.ppEnabledLayerNames = &layer;
        free(lp);
        if (!ici.enabledLayerCount) fprintf(stderr, "gemma3: G3_VULKAN_VALIDATE=1 but %s is not installed\n", layer);
    }
    VkResult r = vk->vkCreateInstance(&ici, NULL, &vk->inst);
    if (r != VK_SUCCESS) return g3_fail(err, G3_ERR_DEVICE, "vulkan: cannot create an instance (VkResult %d)", (int)r);
#define LOAD_INST(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(vk->inst, #name);
    G3VK_INSTANCE_FNS(LOAD_INST)
#undef LOAD_INST
    if (!vk->vkEnumeratePhysicalDevices || !vk->vkGetPhysicalDeviceProperties2 || !vk->vkCreateDevice)
        return g3_fail(err, G3_ERR_DEVICE, "vulkan: the loader lacks Vulkan 1.1 instance functions");
    return G3_OK;
}

/* One instance per process, shared by every backend and device listing and destroyed at exit. The loader unloads
 * the driver (ICD) with the last instance; NVIDIA's driver, loaded and unloaded a few dozen times in one process
 * (a test creating one backend per case), then fails to load again (vkCreateInstance returns
 * VK_ERROR_INCOMPATIBLE_DRIVER; glibc does not give back the static TLS of an unloaded library). Keeping one
 * instance alive keeps the driver loaded once. Devices, buffers and pipelines are still created and destroyed per
 * backend. $G3_VULKAN_VALIDATE is read when the instance is created (the first use in the process). */
static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *lib;
    PFN_vkGetInstanceProcAddr gipa;
    PFN_vkDestroyInstance destroy;
    VkInstance inst;
    int users; /* g3vk contexts holding the instance now */
    int created; /* instances created in this process (1 unless creation failed and was retried) */
} shared;

static void shared_at_exit(void) {
    pthread_mutex_lock(&shared_mu);
    if (shared.inst && shared.users == 0) { /* a backend never freed keeps its device: leave the instance then */
        shared.destroy(shared.inst, NULL);
        shared.inst = VK_NULL_HANDLE;
    }
    pthread_mutex_unlock(&shared_mu);
}

g3_status g3vk_open_instance(g3vk *vk, g3_error *err) {
    g3_status rc = G3_OK;
    pthread_mutex_lock(&shared_mu);
    if (!shared.inst) {
        g3vk tmp;
        memset(&tmp, 0, sizeof tmp);
        rc = create_instance(&tmp, err);
        if (rc) {
            if (tmp.inst && tmp.vkDestroyInstance) tmp.vkDestroyInstance(tmp.inst, NULL);
            if (tmp.lib) dlclose(tmp.lib);
        } else {
            shared.lib = tmp.lib, shared.gipa = tmp.vkGetInstanceProcAddr, shared.destroy = tmp.vkDestroyInstance;
            shared.inst = tmp.inst;
            if (shared.created++ == 0) atexit(shared_at_exit);
        }
    }
    if (!rc) {
        vk->lib = shared.lib, vk->vkGetInstanceProcAddr = shared.gipa, vk->inst = shared.inst;
        shared.users++;
    }
    pthread_mutex_unlock(&shared_mu);
    if (rc) return rc;
#define LOAD_GLOBAL(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(NULL, #name);
    G3VK_GLOBAL_FNS(LOAD_GLOBAL)
#undef LOAD_GLOBAL
#define LOAD_INST(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(vk->inst, #name);
    G3VK_INSTANCE_FNS(LOAD_INST)
#undef LOAD_INST
    return G3_OK;
}

/* Gives the shared instance back (it stays alive until exit). */
void g3vk_close_instance(g3vk *vk) {
    if (vk->inst) {
        pthread_mutex_lock(&shared_mu);
        shared.users--;
        pthread_mutex_unlock(&shared_mu);
    }
    vk->inst = VK_NULL_HANDLE;
    vk->lib = NULL;
}

int g3_vulkan_instances_created(void) {
    pthread_mutex_lock(&shared_mu);
    int n = shared.created;
    pthread_mutex_unlock(&shared_mu);
    return n;
}

static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 4;
    default: return 3;
    }
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

/* Physical devices sorted best first (stable within a kind). */
int g3vk_sorted_devices(g3vk *vk, VkPhysicalDevice *out) {
    uint32_t n = G3VK_MAX_PDEV;
    VkPhysicalDevice all[G3VK_MAX_PDEV];
    VkResult r = vk->vkEnumeratePhysicalDevices(vk->inst, &n, all);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return 0;
    int k = 0;
    for (int rank = 0; rank <= 4; rank++)
        for (uint32_t i = 0; i < n; i++) {
            VkPhysicalDeviceProperties p;
            vk->vkGetPhysicalDeviceProperties(all[i], &p);
            if (type_rank(p.deviceType) == rank) out[k++] = all[i];
        }
    return k;
}

void g3vk_describe(g3vk *vk, VkPhysicalDevice pd, int index, g3_vulkan_device *d) {
    memset(d, 0, sizeof *d);
    d->index = index;
    VkPhysicalDeviceProperties p1;
    vk->vkGetPhysicalDeviceProperties(pd, &p1);
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                             .pNext = p1.apiVersion >= VK_API_VERSION_1_2 ? &drv : NULL};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vk->vkGetPhysicalDeviceProperties2(pd, &p2);
    const VkPhysicalDeviceProperties *p = &p2.properties;
    snprintf(d->name, sizeof d->name, "%s", p->deviceName);
    d->type = type_name(p->deviceType);
    d->api_version = p->apiVersion;
    d->vendor_id = p->vendorID, d->device_id = p->deviceID;
    if (p->apiVersion >= VK_API_VERSION_1_2)
        snprintf(d->driver, sizeof d->driver, "%.100s %.140s", drv.driverName, drv.driverInfo);
    VkPhysicalDeviceMemoryProperties mp;
    vk->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if ((mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[i].size > d->device_local_bytes)
            d->device_local_bytes = mp.memoryHeaps[i].size;
    d->subgroup_size = sg.subgroupSize;
    d->subgroup_arithmetic = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                             (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                             (sg.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
    /* int8 dot products (optional: the matvecq decode products) */
    uint32_t ne = 0;
    if (vk->vkEnumerateDeviceExtensionProperties) vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &ne, NULL);
    VkExtensionProperties *ep = calloc(ne ? ne : 1, sizeof *ep);
    int has_idot = 0;
    if (ep && ne && vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &ne, ep) == VK_SUCCESS)
        for (uint32_t i = 0; i < ne; i++)
            has_idot |= !strcmp(ep[i].extensionName, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    free(ep);
    if (has_idot && p->apiVersion >= VK_API_VERSION_1_2) {
        VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idf = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
        VkPhysicalDeviceFeatures2 fi = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &idf};
        vk->vkGetPhysicalDeviceFeatures2(pd, &fi);
        VkPhysicalDeviceShaderIntegerDotProductPropertiesKHR idp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES_KHR};
        VkPhysicalDeviceProperties2 pi = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &idp};
        vk->vkGetPhysicalDeviceProperties2(pd, &pi);
        d->int8_dot = !!idf.shaderIntegerDotProduct;
        d->int8_dot_fast = d->int8_dot && idp.integerDotProduct4x8BitPackedSignedAccelerated;
    }
    /* cooperative matrices (optional: prefill through matmul_cm) */
    d->coopmat = g3vk_coopmat_probe(vk, pd, &d->coopmat_sg32);
    /* requirements */
    char *miss = d->missing;
    size_t cap = sizeof d->missing;
#define MISSING(...) snprintf(miss + strlen(miss), cap - strlen(miss), __VA_ARGS__)
    if (p->apiVersion < VK_API_VERSION_1_2) MISSING("Vulkan 1.2; ");
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    if (p->apiVersion >= VK_API_VERSION_1_2) {
        vk->vkGetPhysicalDeviceFeatures2(pd, &f2);
        if (!f12.bufferDeviceAddress) MISSING("bufferDeviceAddress; ");
        if (!f2.features.shaderInt64) MISSING("shaderInt64; ");
    }
    if (p->limits.maxComputeSharedMemorySize < 24 * 1024)
        MISSING("24 KiB of shared memory (has %u); ", p->limits.maxComputeSharedMemorySize);
    if (p->limits.maxComputeWorkGroupInvocations < 256) MISSING("workgroups of 256 invocations; ");
    uint32_t nq = 0;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qf[32];
    if (nq > 32) nq = 32;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    int has_compute = 0;
    for (uint32_t i = 0; i < nq; i++) has_compute |= !!(qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT);
    if (!has_compute) MISSING("a compute queue; ");
#undef MISSING
    size_t ml = strlen(d->missing);
    if (ml >= 2) d->missing[ml - 2] = 0;
    d->usable = d->missing[0] == 0;
}

g3_status g3_vulkan_list_devices(g3_vulkan_device *out, int max, int *n, g3_error *err) {
    *n = 0;
    g3vk vk;
    memset(&vk, 0, sizeof vk);
    g3_status rc = g3vk_open_instance(&vk, err);
    if (rc) {
        g3vk_close_instance(&vk);
        return rc;
    }
    VkPhysicalDevice pd[G3VK_MAX_PDEV];
    int k = g3vk_sorted_devices(&vk, pd);
    for (int i = 0; i < k && i < max; i++) g3vk_describe(&vk, pd[i], i, &out[i]);
    *n = k;
    g3vk_close_instance(&vk);
    return G3_OK;
}

/* What the device line says about int8 dot products and the one-row Q8_0/Q4_0 decode products (matvecq), with the
 * same switches as g3vk_init ($G3_VULKAN_MVQ, $G3_VULKAN_MV2). */
static const char *idot_note(const g3_vulkan_device *d) {
    if (!d->int8_dot) return ", no int8 dot products (decode products: matvec2)";
    const char *e = getenv("G3_VULKAN_MVQ"), *m2 = getenv("G3_VULKAN_MV2");
    int on = e && *e ? (*e != '0') : (m2 && *m2 == '0') ? 0 : 2;
    if (d->int8_dot_fast)
        return on == 1   ? ", int8 dot products (accelerated; Q8_0/Q4_0 decode products: matvecq)"
               : on == 2 ? ", int8 dot products (accelerated; Q4_0 decode products: matvecq)"
                         : ", int8 dot products (accelerated; matvecq off: G3_VULKAN_MVQ / G3_VULKAN_MV2)";
    return on == 1   ? ", int8 dot products (not accelerated; Q8_0/Q4_0 decode products: matvecq)"
           : on == 2 ? ", int8 dot products (not accelerated; Q4_0 decode products: matvecq)"
                     : ", int8 dot products (not accelerated; matvecq off: G3_VULKAN_MVQ / G3_VULKAN_MV2)";
}

int g3_vulkan_print_devices(FILE *f) {
    g3_vulkan_device d[G3VK_MAX_PDEV];
    int n = 0;
    g3_error err = {0};
    if (g3_vulkan_list_devices(d, G3VK_MAX_PDEV, &n, &err) != G3_OK) {
        fprintf(f, "vulkan: no devices (%s)\n", err.msg);
        return 0;
    }
    if (n == 0) fprintf(f, "vulkan: the loader found no Vulkan device\n");
    for (int i = 0; i < n && i < G3VK_MAX_PDEV; i++) {
        fprintf(f, "vulkan device %d: %s (%s), Vulkan %u.%u.%u, %.1f GiB device-local, subgroup %u%s%s%s%s%s\n", i,
                d[i].name, d[i].type, VK_API_VERSION_MAJOR(d[i].api_version), VK_API_VERSION_MINOR(d[i].api_version),
                VK_API_VERSION_PATCH(d[i].api_version), (double)d[i].device_local_bytes / (1024.0 * 1024 * 1024),
                d[i].subgroup_size, d[i].subgroup_arithmetic ? " (reductions)" : "", idot_note(&d[i]),
                d[i].driver[0] ? ", driver " : "", d[i].driver,
                d[i].usable ? (i == 0 ? " [default]" : "") : "");
        if (!d[i].usable) fprintf(f, "    not usable by gemma3: lacks %s\n", d[i].missing);
        static const char *const cmn[4] = {"none", "NV", "KHR", "NV, KHR"};
        int pick = g3vk_coopmat_pick(d[i].coopmat);
        if (d[i].usable)
            fprintf(f, "    cooperative matrices (f16 16x16x16): %s%s; prefill on %s%s\n", cmn[d[i].coopmat & 3],
                    d[i].coopmat_sg32 ? " (KHR with subgroups of 32 asked for)" : "",
                    pick ? cmn[pick] : "the portable matmul", pick ? " cooperative matrices" : "");
    }
    return n;
}
