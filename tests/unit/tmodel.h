/* tmodel: helpers the oracle tests share — open a plan, decode a prompt's logits, run a
 * greedy continuation, read id lists from oracle JSON. Failures are CHECKs. */
#ifndef TMODEL_H
#define TMODEL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "inferrt.h"

/* Opens a plan on 2 threads; NULL (with a failed CHECK) on error. */
irt_model *tmodel_open(const char *plan);
/* Logits of every position of a prompt decoded alone: (n, vocab), malloc'd. */
float *tmodel_prompt_logits(irt_model *m, const int32_t *ids, int64_t n);
/* n_out greedy tokens after the prompt, through the KV cache one token at a time. */
irt_status tmodel_greedy(irt_model *m, const int32_t *ids, int64_t n, int32_t *out, int n_out);
/* max |ours - ref| / (1 + |ref|) over rows x vocab logits against a JSON array of rows
 * (the oracle fixtures' form); *out_rows gets the row count, *out_short any row whose
 * length is not V. */
double tmodel_max_rel_error(const float *lg, const cJSON *rows, int64_t V, int64_t *out_rows,
                            bool *out_short);
/* Up to cap integers of a JSON array; returns how many. */
int64_t tmodel_json_ids(const cJSON *arr, int32_t *out, int64_t cap);
/* Longrope: transformers takes the short factors for a sequence within the original context
 * (orig positions) and the long ones past it; a plan takes them by its own context. Each
 * oracle prompt's logits on the plan of its side (ms: context orig, ml: past it) against
 * the oracle's rows, within tol (CHECKs); the two plans must differ on a long prompt's first
 * orig positions. Returns the worst relative error; counts the prompts of each side. */
double tmodel_longrope_check(irt_model *ms, irt_model *ml, const cJSON *prompts,
                             const cJSON *logits, int64_t orig, double tol, const char *name,
                             int *n_short, int *n_long);

#endif
