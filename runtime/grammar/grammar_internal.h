/* grammar_internal: the compiled form shared by grammar.c (GBNF to it) and
 * grammar_state.c (parse states over it). */
#ifndef IRT_GRAMMAR_INTERNAL_H
#define IRT_GRAMMAR_INTERNAL_H

#include "grammar.h"

typedef enum gel_type {
  G_END = 0,  /* end of an alternative: return to the caller */
  G_CHAR = 1, /* one character of class arg */
  G_REF = 2,  /* rule arg */
} gel_type;

typedef struct gel {
  uint32_t type;
  uint32_t arg;
} gel;

typedef struct gclass {
  uint32_t *r; /* (n) inclusive ranges as lo, hi pairs */
  int n, cap;
  bool neg; /* matches the characters outside them */
} gclass;

struct gram {
  gel *el;       /* every alternative's items, each ended by G_END */
  uint32_t *alt; /* alternative k starts at el[alt[k]] */
  int *rule_alt; /* (n_rules + 1) rule r's alternatives are alt[rule_alt[r] ..
                         rule_alt[r + 1]) */
  int n_rules, root;
  gclass *cls;
  int n_cls;
};

#endif
