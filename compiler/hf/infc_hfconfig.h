/* infc_hfconfig: reads an HF config.json into the Llama-family template parameters.
 * Supported model_type: llama, mistral, qwen2 (SmolLM checkpoints are llama). */
#ifndef INFC_HFCONFIG_H
#define INFC_HFCONFIG_H

#include "ir_status.h"
#include "llama.h"

/* Parses the JSON text of a config.json. A missing required key, a wrong type, or an
 * unsupported feature (rope_scaling, an activation other than silu) is an error naming
 * the key. */
ir_status infc_hfconfig_parse(const char *json, model_llama_params *out, ir_diag *d);

/* Reads and parses the file at path; messages are prefixed with the path. */
ir_status infc_hfconfig_load(const char *path, model_llama_params *out, ir_diag *d);

#endif
