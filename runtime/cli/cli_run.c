/* cli_run: `inferrt run model.plan --input [NAME=]FILE.pb ... [--output-dir DIR]`.
 * Inputs and outputs are serialized onnx.TensorProto files (the layout of the ONNX
 * backend tests: output K is written to DIR/output_K.pb, named after the output). */
#include "cli_run.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "inferrt.h"

#define MAX_INPUTS 256

typedef struct run_args {
  const char *plan, *out_dir;
  const char *inputs[MAX_INPUTS];
  int n_inputs, threads;
  bool quiet;
} run_args;

static int usage_run(FILE *f) {
  fputs("usage: inferrt run model.plan [--input [NAME=]FILE.pb]... [options]\n\n"
        "Runs a program plan (e.g. built from an ONNX model) on inputs read from serialized\n"
        "onnx.TensorProto files. An input is matched by NAME=, else by the tensor's own\n"
        "name, else it fills the next unset input in order.\n\n"
        "  -i, --input [NAME=]FILE   an input tensor (repeatable)\n"
        "  -o, --output-dir DIR      write output K to DIR/output_K.pb\n"
        "      --threads N           CPU threads (default: all cores)\n"
        "  -q, --quiet               print nothing on success\n",
        f);
  return f == stderr ? 2 : 0;
}

static int fail(const char *msg) { return cli_fail("%s", msg); }

static int parse_run(int argc, char **argv, run_args *a) {
  static const struct option longs[] = {
      {"input", required_argument, 0, 'i'}, {"output-dir", required_argument, 0, 'o'},
      {"threads", required_argument, 0, 1}, {"quiet", no_argument, 0, 'q'},
      {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
  int c;
  char *end;
  optind = 1;
  while ((c = getopt_long(argc, argv, "i:o:qh", longs, NULL)) != -1) {
    switch (c) {
    case 'i':
      if (a->n_inputs == MAX_INPUTS) return fail("too many --input files");
      a->inputs[a->n_inputs++] = optarg;
      break;
    case 'o': a->out_dir = optarg; break;
    case 1:
      a->threads = (int)strtol(optarg, &end, 10);
      if (*end || a->threads < 0) return fail("--threads: expected a non-negative integer");
      break;
    case 'q': a->quiet = true; break;
    case 'h': usage_run(stdout); return -1;
    default: return usage_run(stderr);
    }
  }
  if (optind != argc - 1) return usage_run(stderr);
  a->plan = argv[optind];
  return 0;
}

/* "f32[1..64,16]": an input's dtype and dims (ranges where the plan has dynamic shapes). */
static void format_shape(irt_program *p, int in, const irt_tensor_info *t, char *buf, size_t len) {
  int64_t lo[IRT_MAX_RANK], hi[IRT_MAX_RANK];
  bool ranged = in >= 0 && irt_program_input_range(p, in, lo, hi) == IRT_OK;
  size_t o = (size_t)snprintf(buf, len, "%s[", irt_dtype_name(t->dtype));
  for (int i = 0; i < t->rank && o < len; i++) {
    if (ranged && lo[i] != hi[i])
      o += (size_t)snprintf(buf + o, len - o, "%s%lld..%lld", i ? "," : "", (long long)lo[i],
                            (long long)hi[i]);
    else o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
  }
  if (o < len) snprintf(buf + o, len - o, "]");
}

/* Which program input a file feeds: NAME=, the tensor's name, or the next unset one. */
static int pick_input(irt_program *p, const char *arg, const char **path, const irt_tensor_file *t,
                      const bool *set) {
  const char *eq = strchr(arg, '=');
  if (eq) {
    char name[512];
    snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
    int i = irt_program_find_input(p, name);
    if (i >= 0) {
      *path = eq + 1;
      return i;
    }
  }
  *path = arg;
  if (!t) return -1;
  int i = t->info.name[0] ? irt_program_find_input(p, t->info.name) : -1;
  for (int k = 0; i < 0 && k < irt_program_n_inputs(p); k++)
    if (!set[k]) i = k;
  return i;
}

static bool same_layout(const irt_tensor_info *in, const irt_tensor_info *t) {
  if (in->dtype != t->dtype || in->rank != t->rank) return false;
  for (int i = 0; i < t->rank; i++)
    if (in->shape[i] != t->shape[i]) return false;
  return true;
}

static int load_input(irt_program *p, const char *arg, bool *set) {
  const char *path;
  char msg[1024];
  irt_error err = {0};
  irt_tensor_file t;
  pick_input(p, arg, &path, NULL, set);
  if (irt_tensor_file_load(path, &t, &err) != IRT_OK) return fail(err.msg);
  int i = pick_input(p, arg, &path, &t, set);
  irt_tensor_info in;
  int rc = 0;
  if (i < 0 || irt_program_input_info(p, i, &in) != IRT_OK) {
    snprintf(msg, sizeof msg, "%s: no input of the plan is left for it", path);
    rc = fail(msg);
  } else if (in.dtype == t.info.dtype && in.rank == t.info.rank &&
             irt_program_set_input_shape(p, i, t.info.rank, t.info.shape, &err) != IRT_OK) {
    snprintf(msg, sizeof msg, "%s: %s", path, err.msg); /* outside a dynamic plan's range */
    rc = fail(msg);
  } else if (irt_program_input_info(p, i, &in) != IRT_OK || !same_layout(&in, &t.info)) {
    char want[160];
    format_shape(p, i, &in, want, sizeof want);
    snprintf(msg, sizeof msg, "%s: input '%s' takes %s; the file holds a %s tensor of rank %d",
             path, in.name, want, irt_dtype_name(t.info.dtype), t.info.rank);
    rc = fail(msg);
  } else if (irt_program_set_input(p, i, t.data, t.info.nbytes, &err) != IRT_OK) {
    rc = fail(err.msg);
  } else {
    set[i] = true;
  }
  irt_tensor_file_free(&t);
  return rc;
}

static int write_outputs(irt_program *p, const run_args *a) {
  for (int k = 0; k < irt_program_n_outputs(p); k++) {
    irt_tensor_info o;
    char shape[160], path[4096];
    irt_program_output_info(p, k, &o);
    format_shape(p, -1, &o, shape, sizeof shape);
    const void *data = irt_program_output(p, k, NULL);
    if (a->out_dir) {
      irt_error err = {0};
      snprintf(path, sizeof path, "%s/output_%d.pb", a->out_dir, k);
      if (irt_tensor_file_save(path, &o, data, &err) != IRT_OK) return fail(err.msg);
    }
    if (!a->quiet)
      printf("output %d '%s': %s%s%s\n", k, o.name, shape, a->out_dir ? " -> " : "",
             a->out_dir ? path : "");
  }
  return 0;
}

int cmd_run(int argc, char **argv) {
  run_args a = {0};
  int rc = parse_run(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  irt_model_opts o = irt_model_opts_default();
  cli_cuda env_only = {0};
  if (cli_model_opts(&o, &env_only)) return 1;
  o.n_threads = a.threads;
  irt_program *p = NULL;
  irt_error err = {0};
  if (irt_program_open(a.plan, &o, &p, &err) != IRT_OK) return fail(err.msg);
  bool *set = calloc((size_t)irt_program_n_inputs(p) + 1, sizeof *set);
  rc = set ? 0 : fail("out of memory");
  for (int i = 0; rc == 0 && i < a.n_inputs; i++) rc = load_input(p, a.inputs[i], set);
  for (int i = 0; rc == 0 && i < irt_program_n_inputs(p); i++)
    if (!set[i]) {
      irt_tensor_info in;
      char msg[600];
      irt_program_input_info(p, i, &in);
      snprintf(msg, sizeof msg, "input '%s' was not given (--input %s=FILE.pb)", in.name, in.name);
      rc = fail(msg);
    }
  if (rc == 0 && irt_program_run(p, &err) != IRT_OK) rc = fail(err.msg);
  if (rc == 0) rc = write_outputs(p, &a);
  free(set);
  irt_program_close(p);
  return rc;
}
