/* Writing a loaded model as a GGUF file (llama.cpp's gemma3 names and keys, plus the two keys it lacks:
 * gemma3.attention.scale and gemma3.attention.sliding_window_pattern), with every matrix converted to a target
 * type one tensor at a time. Used by `gemma3 quantize`. */
#ifndef G3_MODEL_EXPORT_GGUF_H
#define G3_MODEL_EXPORT_GGUF_H

#include "gemma3.h"
#include "model/model.h"

/* tok may be NULL (no tokenizer metadata). Matrices whose rows do not fit the target's block size take llama.cpp's
 * fallback type (g3_dtype_fallback), else Q8_0 (or F16 when even that does not fit). progress: print per-tensor progress to stderr. */
g3_status g3_model_export_gguf(const g3_model *m, const g3_tokenizer *tok, uint32_t type, const char *path,
                               int progress, g3_error *err);
/* The type a matrix with rows of k values gets when `type` is asked for. */
uint32_t g3_export_type_for(uint32_t type, int64_t k);

#endif
