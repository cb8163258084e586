/* api_grammar: the public grammar calls (inferrt.h) over runtime/grammar, whose results
 * are the internal status: each converts once, through rt_error_from_diag. */
#include "grammar.h"
#include "model.h"

irt_status irt_grammar_check(const char *gbnf, irt_error *err) {
  ir_diag d = {0};
  return gram_check(gbnf, &d) == IR_OK ? IRT_OK : rt_error_from_diag(err, &d);
}

irt_status irt_grammar_json(const char *schema, char **out, irt_error *err) {
  ir_diag d = {0};
  return gram_json(schema, out, &d) == IR_OK ? IRT_OK : rt_error_from_diag(err, &d);
}

irt_status irt_grammar_choice(const char *const *choices, int n, char **out, irt_error *err) {
  ir_diag d = {0};
  return gram_choice(choices, n, out, &d) == IR_OK ? IRT_OK : rt_error_from_diag(err, &d);
}

irt_status irt_grammar_regex(const char *regex, char **out, irt_error *err) {
  ir_diag d = {0};
  return gram_regex(regex, out, &d) == IR_OK ? IRT_OK : rt_error_from_diag(err, &d);
}
