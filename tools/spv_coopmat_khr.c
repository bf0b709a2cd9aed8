/* Build-time tool: rewrites a SPIR-V module on SPV_NV_cooperative_matrix (glslc's output for shaders/matmul_cm.comp)
 * into the equivalent SPV_KHR_cooperative_matrix module (src/backend/vulkan/spv_khr.c does the work), because
 * Debian 12's glslc cannot compile GL_KHR_cooperative_matrix. Usage: spv_coopmat_khr IN.spv OUT.spv; exits 1 with a
 * message naming the input (and writes nothing) when the module is malformed or uses what the rewrite does not
 * handle. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/vulkan/spv_khr.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN.spv OUT.spv\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    long bytes = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    uint32_t *in = bytes > 0 && bytes % 4 == 0 ? malloc((size_t)bytes) : NULL;
    int ok = in && fseek(f, 0, SEEK_SET) == 0 && fread(in, 1, (size_t)bytes, f) == (size_t)bytes;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "spv_coopmat_khr: %s: cannot read a whole number of 32-bit words (%ld bytes)\n", argv[1], bytes);
        free(in);
        return 1;
    }
    uint32_t *out = NULL;
    size_t n_out = 0;
    char msg[512];
    if (g3vk_spv_nv_to_khr(in, (size_t)bytes / 4, &out, &n_out, msg, sizeof msg)) {
        fprintf(stderr, "spv_coopmat_khr: %s: %s\n", argv[1], msg);
        free(in);
        return 1;
    }
    free(in);
    FILE *g = fopen(argv[2], "wb");
    ok = g && fwrite(out, 4, n_out, g) == n_out;
    if (g && fclose(g)) ok = 0;
    free(out);
    if (!ok) {
        fprintf(stderr, "spv_coopmat_khr: cannot write %s\n", argv[2]);
        remove(argv[2]);
        return 1;
    }
    return 0;
}
