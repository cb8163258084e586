/* grammar: constrained decoding. A context-free grammar in llama.cpp's GBNF notation is
 * compiled once per request; each completion keeps a parse state that says which bytes
 * may come next, and from it which tokens (gram_mask, over a byte trie of the
 * vocabulary). irt_grammar_json turns a JSON Schema (or "any JSON object") into
 * such a grammar.
 *
 * GBNF: `name ::= alternatives`, one rule per line (a rule continues over newlines inside
 * parentheses and after `|`), `#` comments. Items: "literal", [class] / [^class] with
 * ranges, `.` (any character), rule names, ( groups ), and the postfixes *, +, ?, {m},
 * {m,}, {m,n}. Escapes: \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH. Matching is over
 * Unicode code points (UTF-8 text, never NUL); the start rule is `root`. Left-recursive
 * rules are refused (the parser is top-down). Token masks agree with llama.cpp's grammar
 * sampler on the same GBNF (tools/check-grammar-llamacpp.py). */
#ifndef IRT_GRAMMAR_H
#define IRT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "inferrt.h"
#include "ir_status.h"
#include "tokenizer.h"

typedef struct gram gram;             /* compiled; immutable, shared by threads */
typedef struct gram_state gram_state; /* one parse position; one thread at a time */
typedef struct gram_trie gram_trie;   /* the vocabulary's token bytes, sorted */

/* Compiles GBNF text. Errors (IR_INVALID_ARG) name the line and the problem: a syntax
 * error, an undefined rule, no root, a left-recursive rule. Owned by the caller. */
ir_status gram_compile(const char *src, gram **out, ir_diag *err);
void gram_destroy(gram *g);

/* A state at the start of g's root. Owned by the caller; g must outlive it. */
ir_status gram_state_create(const gram *g, gram_state **out, ir_diag *err);
void gram_state_destroy(gram_state *s);
/* Moves the state over n bytes and returns true if the grammar allows them (a character
 * may be split over calls); otherwise returns false and leaves the state as it was. */
bool gram_state_advance(gram_state *s, const uint8_t *p, size_t n);
/* Whether the text so far is a whole sentence of the grammar / may go on. */
bool gram_state_accepting(const gram_state *s);
bool gram_state_can_continue(const gram_state *s);

/* The byte strings of every ordinary token (special tokens left out). NULL on OOM. */
gram_trie *gram_trie_create(const irt_tokenizer *t);
void gram_trie_destroy(gram_trie *t);
/* Sets allowed[id] (vocab bytes, from the trie's tokenizer) to 1 for each token whose
 * bytes the grammar allows next and 0 for the others; end-of-generation tokens are allowed
 * exactly when the state is accepting. Returns the count allowed. The state is unchanged
 * (it only uses scratch it owns). */
int64_t gram_mask(gram_state *s, const gram_trie *t, uint8_t *allowed);
/* Whether token id may come next, as gram_mask would say. */
bool gram_allows(gram_state *s, const gram_trie *t, int32_t id);
/* Moves the state over token id (its bytes; an end-of-generation token moves nothing);
 * false if the grammar does not allow it. */
bool gram_state_take(gram_state *s, const gram_trie *t, int32_t id);

/* JSON: irt_grammar_json (inferrt.h) writes GBNF for the JSON values a JSON Schema
 * describes, or for any JSON object. Supported: type (one or a list), properties /
 * required / additionalProperties, items / prefixItems / minItems / maxItems, enum, const,
 * anyOf / oneOf (as anyOf), allOf of one schema, $ref to #/$defs/.. or #/definitions/..,
 * minLength / maxLength, pattern (irt_grammar_regex's subset), minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum on integers (within 16 digits), and annotations (title,
 * description, format, ...). Other assertions (bounds on a number, uniqueItems, ...) are
 * refused with IR_UNSUPPORTED naming them rather than ignored. Properties come in the schema's order; an object with properties takes no
 * others unless additionalProperties says so. Whitespace between JSON tokens is none, a
 * space, or a newline and up to 24 blanks. irt_grammar_choice: one of n strings.
 *
 * The public irt_grammar_* calls (inferrt.h) are these, with the public status
 * (runtime/model/api_grammar.c). */
ir_status gram_check(const char *gbnf, ir_diag *err);
ir_status gram_json(const char *schema, char **out, ir_diag *err);
ir_status gram_choice(const char *const *choices, int n, char **out, ir_diag *err);
ir_status gram_regex(const char *regex, char **out, ir_diag *err);

/* JSON Schema's pattern: GBNF (an alternative's items) for a JSON string whose value
 * matches the regex somewhere (^ and $ anchor it), each character written as JSON
 * writes it. NULL with *err set (IR_UNSUPPORTED naming the construct) if the regex is
 * beyond irt_grammar_regex's subset. malloc'd. */
char *gram_regex_json(const char *pattern, ir_diag *err);

#endif
