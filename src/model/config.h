/* Gemma 3 configuration from Hugging Face config.json (both layouts) or GGUF metadata, with the defaults of
 * GEMMA3.md where a file is silent, and recognition of the released sizes. */
#ifndef G3_MODEL_CONFIG_H
#define G3_MODEL_CONFIG_H

#include "gemma3.h"
#include "format/gguf.h"

/* json_text: contents of config.json. Sets *multimodal when the text settings are nested under text_config
 * (Gemma3ForConditionalGeneration: tensors live under language_model.). */
g3_status g3_config_from_json(g3_config *c, const char *json_text, const char *path, int *multimodal, g3_error *err);
g3_status g3_config_from_gguf(g3_config *c, const g3_gguf *g, g3_error *err);
/* Fills a released shape: "270m", "1b", "4b", "12b", "27b"; "tiny" = the tiny-gqa fixture's shape. */
g3_status g3_config_preset(g3_config *c, const char *size, g3_error *err);
/* Checks ranges and consistency; fills size_name. */
g3_status g3_config_validate(g3_config *c, g3_error *err);
/* Writes the config as readable lines (for `gemma3 info`). */
void g3_config_print(const g3_config *c, void *file /* FILE* */);

#endif
