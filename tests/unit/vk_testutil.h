/* What the Vulkan tests share: LeakSanitizer's suppression of lavapipe's JIT leak, and the device check that turns a
 * machine without any Vulkan device into a skip. Include once, from a test's main file (it defines functions). */
#ifndef G3_VK_TESTUTIL_H
#define G3_VK_TESTUTIL_H

#include <stdio.h>

#include "backend/vulkan/vulkan_api.h"

/* Mesa's lavapipe (22.3) leaks one 128-byte block per compiled compute pipeline, realloc'd from its JIT-compiled code,
 * which LeakSanitizer cannot attribute to a module. The Vulkan backend itself never calls realloc. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:realloc\n"; }

static int have_device(void) {
    g3_vulkan_device d[8];
    int n = 0;
    g3_error err = {0};
    if (g3_vulkan_list_devices(d, 8, &n, &err) != G3_OK || n == 0) {
        printf("  no Vulkan device (%s): skipped\n", err.msg[0] ? err.msg : "none found");
        return 0;
    }
    return 1;
}

#endif
