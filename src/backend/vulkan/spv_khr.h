/* The rewrite of SPIR-V modules from SPV_NV_cooperative_matrix to SPV_KHR_cooperative_matrix (spv_khr.c), used at
 * build time by tools/spv_coopmat_khr.c on what glslc makes of shaders/matmul_cm.comp (Debian 12's glslc compiles
 * GL_NV_cooperative_matrix but not GL_KHR_cooperative_matrix), and by its unit test. Plain C and libc only, so that
 * the tool builds before the library. */
#ifndef G3_BACKEND_VULKAN_SPV_KHR_H
#define G3_BACKEND_VULKAN_SPV_KHR_H

#include <stddef.h>
#include <stdint.h>

/* SPIR-V numbers of both extensions (SPV_NV_cooperative_matrix rev. 3, SPV_KHR_cooperative_matrix rev. 10). */
enum {
    G3SPV_CAP_COOPMAT_NV = 5357, G3SPV_CAP_COOPMAT_KHR = 6022, G3SPV_CAP_VULKAN_MEMORY_MODEL = 5345,
    G3SPV_OP_TYPE_COOPMAT_NV = 5358, G3SPV_OP_COOPMAT_LOAD_NV = 5359, G3SPV_OP_COOPMAT_STORE_NV = 5360,
    G3SPV_OP_COOPMAT_MULADD_NV = 5361, G3SPV_OP_COOPMAT_LENGTH_NV = 5362,
    G3SPV_OP_TYPE_COOPMAT_KHR = 4456, G3SPV_OP_COOPMAT_LOAD_KHR = 4457, G3SPV_OP_COOPMAT_STORE_KHR = 4458,
    G3SPV_OP_COOPMAT_MULADD_KHR = 4459, G3SPV_OP_COOPMAT_LENGTH_KHR = 4460,
    G3SPV_USE_A = 0, G3SPV_USE_B = 1, G3SPV_USE_ACC = 2, /* Cooperative Matrix Use */
    G3SPV_LAYOUT_ROW = 0, G3SPV_LAYOUT_COL = 1,          /* Cooperative Matrix Layout */
};

/* Rewrites the module in[n] (words, host byte order) into *out (*n_out words, malloc'ed; the caller frees it):
 *   OpCapability CooperativeMatrixNV -> CooperativeMatrixKHR; OpExtension "SPV_NV_cooperative_matrix" -> "..._KHR";
 *   OpTypeCooperativeMatrixNV -> OpTypeCooperativeMatrixKHR with a Use: Accumulator for types that are MulAdd results
 *   or C operands; the others split into a MatrixA and a MatrixB type, every value (and pointer, variable, array of
 *   them) taking the one of the MulAdd operand it reaches through loads, stores, copies, phis, selects, access chains
 *   and composites; Load/Store: (stride, column-major bool) -> (layout constant, stride); MulAdd, Length: new
 *   opcodes. Needs the Vulkan memory model (which glslc emits for cooperative matrices). Returns 0, or -1 with a
 *   message in msg (cap bytes) for a malformed module or one it does not handle: a value reaching both A and B, a
 *   type both an accumulator and an operand, matrices in structs, function parameters, conversions or opcodes
 *   outside its table. */
int g3vk_spv_nv_to_khr(const uint32_t *in, size_t n, uint32_t **out, size_t *n_out, char *msg, size_t cap);

#endif
