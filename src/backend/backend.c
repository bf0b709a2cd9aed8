/* Backend registry. */
#include "backend/backend.h"

#include <string.h>

#ifdef G3_HAVE_VULKAN
#include "backend/vulkan/vulkan_api.h"
#endif

int g3_layers_of_kind(const g3_config *c, int kind) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += (c->layer_global[l] ? 0 : 1) == kind;
    return n;
}

const g3_backend_ops *g3_backend_find(const char *name) {
    static const g3_backend_ops *all[] = {
#ifdef G3_HAVE_CUDA
        &g3_backend_cuda,
#endif
        &g3_backend_cpu,
#ifdef G3_HAVE_VULKAN
        &g3_backend_vulkan, /* after the CPU: "auto" must not pick a software Vulkan device (lavapipe) */
#endif
    };
    if (!name || !*name || !strcmp(name, "auto")) return all[0];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    return NULL;
}
