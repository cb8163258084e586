/* ir: the graph every frontend lowers to and every pass rewrites. Tensors are typed,
 * with static or symbolic dims; weights are referenced in place (a source mmap or a
 * plan mapping), never copied unless a pass creates new constant data, and new data of any
 * size is a recipe (ir_lazy.h) made a chunk at a time when the plan is written. */
#ifndef IR_H
#define IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ir_dtype.h"
#include "ir_status.h"

#define IR_MAX_RANK 6
#define IR_MAX_TP 64 /* tensor-parallel ranks of a plan */
#define IR_MAX_DECODE_BUCKETS 16
#define IR_MAX_IO 16
#define IR_MAX_ATTRS 12

/* Symbolic extents, bound per runtime step. Values are stored in plans: append only. */
typedef enum ir_sym {
  IR_SYM_NONE = 0,
  IR_SYM_TOKENS = 1, /* T: tokens in the step (prompt chunks and decodes, flat) */
  IR_SYM_SEQS = 2,   /* S: sequences in the step */
  IR_SYM_LOGITS = 3, /* L: tokens whose logits are wanted */
  IR_SYM_COUNT
} ir_sym;

typedef struct ir_dim {
  int64_t n;  /* the extent when sym == IR_SYM_NONE */
  ir_sym sym; /* otherwise the extent is the symbol's value */
} ir_dim;

typedef enum ir_tensor_kind {
  IR_TENSOR_ACT = 0,    /* produced by a node; lives in the activation arena */
  IR_TENSOR_WEIGHT = 1, /* constant data */
  IR_TENSOR_INPUT = 2,  /* filled by the runtime each step (in the arena) */
} ir_tensor_kind;

typedef struct ir_tensor {
  char *name;
  ir_dtype dtype;
  int rank;
  ir_dim dims[IR_MAX_RANK];
  ir_tensor_kind kind;
  const void *data;     /* WEIGHT: nbytes of data (borrowed, or owned by the graph), or */
  struct ir_lazy *lazy; /* WEIGHT: the recipe that makes them (ir_lazy.h) */
  uint64_t nbytes;      /* WEIGHT: bytes of data */
  int64_t arena_offset; /* ACT/INPUT: byte offset in the arena, -1 until planned */
  int32_t producer;     /* node index, -1 for weights and inputs */
} ir_tensor;

/* The op vocabulary. Values are stored in plans: append only, never renumber.
 * Shapes and attributes of each op are documented in ir_op.c next to its checker. */
typedef enum ir_op {
  IR_OP_INVALID = 0,
  IR_OP_EMBED = 1,
  IR_OP_RMS_NORM = 2,
  IR_OP_ADD_RMS_NORM = 3,
  IR_OP_MATMUL = 4,
  IR_OP_ROPE = 5,
  IR_OP_ATTENTION = 6,
  IR_OP_SWIGLU = 7,
  IR_OP_ADD = 8,
  IR_OP_MUL = 9,
  IR_OP_GATHER_ROWS = 10,
  IR_OP_CAST = 11,
  /* n-d generic ops: ONNX semantics over static shapes, for graphs run as programs
   * (contracts in ir_op_nd.c; the ONNX frontend lowers to them, part (b) canonicalizes
   * LLM patterns over them onto the fused ops above). */
  IR_OP_ND_RESHAPE = 12, /* also Identity, Flatten, Squeeze, Unsqueeze */
  IR_OP_ND_CAST = 13,
  IR_OP_ND_NEG = 14,
  IR_OP_ND_ABS = 15,
  IR_OP_ND_SQRT = 16,
  IR_OP_ND_RECIPROCAL = 17,
  IR_OP_ND_EXP = 18,
  IR_OP_ND_LOG = 19,
  IR_OP_ND_TANH = 20,
  IR_OP_ND_SIGMOID = 21,
  IR_OP_ND_ERF = 22,
  IR_OP_ND_RELU = 23,
  IR_OP_ND_SIN = 24,
  IR_OP_ND_COS = 25,
  IR_OP_ND_TAN = 26,
  IR_OP_ND_ASIN = 27,
  IR_OP_ND_ACOS = 28,
  IR_OP_ND_ATAN = 29,
  IR_OP_ND_SINH = 30,
  IR_OP_ND_COSH = 31,
  IR_OP_ND_ASINH = 32,
  IR_OP_ND_ACOSH = 33,
  IR_OP_ND_ATANH = 34,
  IR_OP_ND_FLOOR = 35,
  IR_OP_ND_CEIL = 36,
  IR_OP_ND_ROUND = 37,
  IR_OP_ND_SIGN = 38,
  IR_OP_ND_SOFTPLUS = 39,
  IR_OP_ND_SOFTSIGN = 40,
  IR_OP_ND_GELU = 41,
  IR_OP_ND_ELU = 42,
  IR_OP_ND_SELU = 43,
  IR_OP_ND_LEAKY_RELU = 44,
  IR_OP_ND_HARD_SIGMOID = 45,
  IR_OP_ND_HARD_SWISH = 46,
  IR_OP_ND_THRESHOLDED_RELU = 47,
  IR_OP_ND_CELU = 48,
  IR_OP_ND_MISH = 49,
  IR_OP_ND_CLIP = 50,
  IR_OP_ND_NOT = 51,
  IR_OP_ND_ISNAN = 52,
  IR_OP_ND_ISINF = 53,
  IR_OP_ND_ADD = 54,
  IR_OP_ND_SUB = 55,
  IR_OP_ND_MUL = 56,
  IR_OP_ND_DIV = 57,
  IR_OP_ND_POW = 58,
  IR_OP_ND_MOD = 59,
  IR_OP_ND_MIN = 60,
  IR_OP_ND_MAX = 61,
  IR_OP_ND_AND = 62,
  IR_OP_ND_OR = 63,
  IR_OP_ND_XOR = 64,
  IR_OP_ND_EQUAL = 65,
  IR_OP_ND_LESS = 66,
  IR_OP_ND_LESS_EQUAL = 67,
  IR_OP_ND_GREATER = 68,
  IR_OP_ND_GREATER_EQUAL = 69,
  IR_OP_ND_PRELU = 70,
  IR_OP_ND_WHERE = 71,
  IR_OP_ND_REDUCE_SUM = 72,
  IR_OP_ND_REDUCE_MEAN = 73,
  IR_OP_ND_REDUCE_MAX = 74,
  IR_OP_ND_REDUCE_MIN = 75,
  IR_OP_ND_REDUCE_PROD = 76,
  IR_OP_ND_REDUCE_L1 = 77,
  IR_OP_ND_REDUCE_L2 = 78,
  IR_OP_ND_REDUCE_LOG_SUM = 79,
  IR_OP_ND_REDUCE_LOG_SUM_EXP = 80,
  IR_OP_ND_REDUCE_SUM_SQUARE = 81,
  IR_OP_ND_ARGMAX = 82,
  IR_OP_ND_ARGMIN = 83,
  IR_OP_ND_SOFTMAX = 84,
  IR_OP_ND_LOG_SOFTMAX = 85,
  IR_OP_ND_HARDMAX = 86,
  IR_OP_ND_CUMSUM = 87,
  IR_OP_ND_MATMUL = 88,
  IR_OP_ND_GEMM = 89,
  IR_OP_ND_TRANSPOSE = 90,
  IR_OP_ND_CONCAT = 91,
  IR_OP_ND_SPLIT = 92,
  IR_OP_ND_SLICE = 93,
  IR_OP_ND_EXPAND = 94,
  IR_OP_ND_TILE = 95,
  IR_OP_ND_PAD = 96,
  IR_OP_ND_GATHER = 97,
  IR_OP_ND_GATHER_ELEMENTS = 98,
  IR_OP_ND_TRILU = 99,
  IR_OP_ND_LAYER_NORM = 100,
  IR_OP_ND_SKIP_LAYER_NORM = 101,
  IR_OP_ND_RMS_NORM = 102,
  IR_OP_ND_ATTENTION = 103,
  IR_OP_ND_ROTARY_EMBEDDING = 104,
  IR_OP_SOFTCAP = 105, /* y = cap * tanh(x / cap) (Gemma 2's final logits) */
  /* n-d generic ops, second range */
  IR_OP_ND_CONV = 106, /* Conv: 1-3 spatial dims, groups, strides, pads, dilations */
  IR_OP_ND_POOL = 107, /* MaxPool / AveragePool */
  /* tensor parallelism: collectives over the plan's tp_size ranks */
  IR_OP_ALL_REDUCE = 108, /* the ranks' x summed, on every rank */
  IR_OP_ALL_GATHER = 109, /* the ranks' column blocks side by side, on every rank */
  IR_OP_COUNT
} ir_op;

/* The n-d generic ops occupy one contiguous range of the enum. */
#define IR_OP_ND_FIRST IR_OP_ND_RESHAPE
#define IR_OP_ND_LAST IR_OP_ND_ROTARY_EMBEDDING
#define IR_OP_ND2_FIRST IR_OP_ND_CONV /* the n-d ops appended after the fused ones */
#define IR_OP_ND2_LAST IR_OP_ND_POOL
static inline bool ir_op_is_nd(ir_op op) {
  return (op >= IR_OP_ND_FIRST && op <= IR_OP_ND_LAST) ||
         (op >= IR_OP_ND2_FIRST && op <= IR_OP_ND2_LAST);
}

/* A matmul's epilogue (attribute "act"), and the gate activation of the swiglu op (its
 * "act": SWIGLU when absent). Values are stored in plans: append only.
 * SWIGLU: w is [2N,K] (gate rows, then up rows) and y[:, j] = silu(z[:, j]) * z[:, N + j]
 * for z = x . w^T + bias, so y is [M,N]. GEGLU: the same gate with GELU's tanh
 * approximation, gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (Gemma's
 * gelu_pytorch_tanh); only the swiglu op takes it (no matmul epilogue yet). */
typedef enum ir_act { IR_ACT_NONE = 0, IR_ACT_SWIGLU = 1, IR_ACT_GEGLU = 2 } ir_act;

/* Longest K of a matmul with act_int8 on a block-quantized weight (int8 activations in
 * 32-value blocks; kernels/cpu/kn_cpu.h's KN_Q8_MAX_K). */
#define IR_Q8_ACT_MAX_K 16384 /* (ir_op.c names it in an error as text) */

/* Values are stored in plans: append only. */
typedef enum ir_attr_type { IR_ATTR_INT = 0, IR_ATTR_FLOAT = 1, IR_ATTR_INTS = 2 } ir_attr_type;

#define IR_MAX_ATTR_INTS 64 /* longest int list (perm, axes, pads, split sizes, ...) */

typedef struct ir_attr {
  const char *name; /* a static string from ir_attr_intern (plans keep the text) */
  ir_attr_type type;
  int64_t i; /* INT: the value; INTS: the number of values */
  double f;
  const int64_t *ints; /* INTS: i values, owned by the graph (or the plan mapping) */
} ir_attr;

typedef struct ir_node {
  ir_op op;
  char *name;
  int n_in, n_out;
  int32_t in[IR_MAX_IO];  /* tensor indices; -1 for an absent optional input */
  int32_t out[IR_MAX_IO]; /* tensor indices */
  int n_attrs;
  ir_attr attrs[IR_MAX_ATTRS];
} ir_node;

/* Model-level facts the runtime needs, and the step limits the plan was built for. */
typedef struct ir_model_config {
  char arch[32]; /* "llama", "qwen2", ... */
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t n_layers;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t intermediate_size;
  int64_t max_position; /* longest context the rope table covers */
  double rms_norm_eps;
  double rope_theta;
  bool tie_word_embeddings;
  bool attention_bias;
  int64_t bos_token_id; /* -1 if none */
  int64_t eos_token_id; /* -1 if none */
  /* step limits: the memory plan is sized for these */
  int64_t max_tokens; /* T max */
  int64_t max_seqs;   /* S max */
  int64_t max_logits; /* L max */
  int64_t kv_block_size;
  /* CUDA Graph capture plan (pass_capture_plan): decode steps of up to decode_buckets[i]
   * tokens replay the graph of the smallest such bucket; ascending, each in
   * [1, min(max_tokens, max_seqs, max_logits)]. 0 buckets: none planned. */
  int32_t n_decode_buckets;
  int64_t decode_buckets[IR_MAX_DECODE_BUCKETS];
  /* tensor parallelism: 0 or 1, one rank; N > 1, the graph is one rank's shard of N (its
   * n_heads, n_kv_heads and intermediate_size are the rank's; vocab_size and hidden_size
   * the model's), with all_reduce / all_gather nodes where the ranks meet */
  int32_t tp_size;
} ir_model_config;

/* Dynamic shapes of a generic program, as TensorRT's optimization profiles: named symbols
 * (the ONNX graph's symbolic dims) with ranges, and every tensor dim and int attribute value
 * that depends on them as an affine expression, value = off + sum_k coef[k] * sym[k]. The
 * graph itself holds every value at the symbols' maxima, so its memory plan covers the
 * largest run; ir_profile.h specializes a copy of it to any point of the ranges. */
#define IR_MAX_PROFILE_SYMS 8

typedef struct ir_shape_sym {
  char name[64];
  int64_t min, max;
} ir_shape_sym;

typedef struct ir_affine {
  int32_t at;       /* the tensor (dims) or node (attrs) */
  int32_t index;    /* the dim, or the value's index in the attribute (0 for an INT) */
  const char *attr; /* attrs: the attribute's name (ir_attr_intern) */
  int64_t coef[IR_MAX_PROFILE_SYMS];
  int64_t off;
} ir_affine;

typedef struct ir_profile {
  int n_syms;
  ir_shape_sym syms[IR_MAX_PROFILE_SYMS];
  int32_t n_dims, n_attrs;
  ir_affine *dims, *attrs;
} ir_profile;

typedef struct ir_graph {
  ir_profile *profile; /* NULL: every shape is static */
  ir_tensor *tensors;
  int32_t n_tensors, cap_tensors;
  ir_node *nodes;
  int32_t n_nodes, cap_nodes;
  int32_t *inputs; /* tensor indices of IR_TENSOR_INPUT tensors, in order */
  int32_t n_inputs;
  int32_t *outputs; /* tensor indices the runtime reads after a step */
  int32_t n_outputs;
  ir_model_config config;
  uint64_t arena_size; /* bytes, set by the memory planner */
  void **owned;        /* data buffers the graph frees (folded constants, tables) */
  int32_t n_owned, cap_owned;
  struct ir_lazy **lazies; /* recipes of lazy weights the graph drops (ir_lazy.h) */
  int32_t n_lazies, cap_lazies;
} ir_graph;

/* --- graph construction ------------------------------------------------------------ */

/* Returned graph is owned by the caller; ir_graph_destroy(NULL) is a no-op. */
ir_graph *ir_graph_create(void);
void ir_graph_destroy(ir_graph *g);

/* Adds a tensor (name copied). Returns its index, or -1 on allocation failure. */
int32_t ir_graph_add_tensor(ir_graph *g, const char *name, ir_dtype dt, int rank,
                            const ir_dim *dims, ir_tensor_kind kind);
/* A weight referencing `data` (borrowed: must outlive the graph, or be adopted). */
int32_t ir_graph_add_weight(ir_graph *g, const char *name, ir_dtype dt, int rank,
                            const int64_t *shape, const void *data, uint64_t nbytes);
/* Takes ownership of a malloc'd buffer: freed by ir_graph_destroy. Returns false (and
 * frees buf) on allocation failure. */
bool ir_graph_adopt(ir_graph *g, void *buf);
int32_t ir_graph_add_input(ir_graph *g, const char *name, ir_dtype dt, int rank,
                           const ir_dim *dims);
bool ir_graph_add_output(ir_graph *g, int32_t tensor);

/* Adds a node whose output tensors are created from shape inference, named
 * "<name>.out<i>" (or `name` itself for single-output nodes). Attributes are an array of
 * n_attrs entries built with IR_AI / IR_AF / IR_AIS (names from ir_attr_intern). On
 * success returns the node index and the first output tensor in *out_tensor; on a type or
 * shape error returns -1 with the reason in d. */
int32_t ir_graph_add_node(ir_graph *g, ir_op op, const char *name, const int32_t *in, int n_in,
                          const ir_attr *attrs, int n_attrs, int32_t *out_tensor, ir_diag *d);

#define IR_AI(nm, v) ((ir_attr){.name = (nm), .type = IR_ATTR_INT, .i = (v)})
#define IR_AF(nm, v) ((ir_attr){.name = (nm), .type = IR_ATTR_FLOAT, .f = (v)})
/* An int list: add_node copies the n values into memory the graph owns. */
#define IR_AIS(nm, p, cnt) ((ir_attr){.name = (nm), .type = IR_ATTR_INTS, .i = (cnt), .ints = (p)})

/* Attribute lookup with a default. */
int64_t ir_node_attr_i(const ir_node *n, const char *name, int64_t def);
double ir_node_attr_f(const ir_node *n, const char *name, double def);
bool ir_node_has_attr(const ir_node *n, const char *name);
/* An int-list attribute: its values (borrowed from the graph) and count, or NULL with
 * *out_n = 0 when absent or not a list. */
const int64_t *ir_node_attr_ints(const ir_node *n, const char *name, int *out_n);
/* Returns the canonical static pointer for an attribute name, or NULL if unknown. */
const char *ir_attr_intern(const char *name);

/* --- queries ------------------------------------------------------------------------ */

const char *ir_op_name(ir_op op);
ir_op ir_op_from_name(const char *name);
const char *ir_sym_name(ir_sym s);
/* Extent of dim with symbols bound to `syms` (indexed by ir_sym; may be NULL, then the
 * model's step limits are used: the worst case). */
int64_t ir_dim_value(const ir_graph *g, ir_dim d, const int64_t *syms);
/* Element and byte counts saturate at UINT64_MAX where the product overflows (ir_graph_verify
 * refuses any tensor past IR_MAX_TENSOR_BYTES, so a verified graph's sizes are exact). */
#define IR_MAX_TENSOR_BYTES (1ull << 48)
uint64_t ir_tensor_elems(const ir_graph *g, const ir_tensor *t, const int64_t *syms);
uint64_t ir_tensor_bytes(const ir_graph *g, const ir_tensor *t, const int64_t *syms);
/* Index of the tensor with that name, or -1. Linear scan: for tools and tests. */
int32_t ir_graph_find_tensor(const ir_graph *g, const char *name);

/* --- checking and printing ---------------------------------------------------------- */

/* Checks every node's input/output types, shapes and attributes, tensor indices, that
 * each activation has exactly one producer that precedes its users, and that weights
 * carry data of the right size. The first problem found is reported in d. */
ir_status ir_graph_verify(const ir_graph *g, ir_diag *d);
/* For an LLM step program (a graph with attention nodes; others pass): the config against
 * the graph, as a plan from elsewhere may lie about either with valid checksums. The config's
 * sizes are bounded (the KV cache and host buffers are sized by them), each attention node's
 * layer indexes one of n_layers and its head geometry is the config's (the KV cache is laid
 * out by the config), rope tables cover max_position, the embedding covers vocab_size, and
 * tokens/positions/logit_rows are the i32 inputs the runtime writes. Run by ir_plan_open. */
#define IR_MAX_LAYERS 1024
ir_status ir_graph_verify_step(const ir_graph *g, ir_diag *d);
/* The most tokens one decode step can hold: min(max_tokens, max_seqs, max_logits). */
int64_t ir_max_decode_batch(const ir_model_config *c);
/* The default capture plan: 1, 2, 4, ... below that limit, then the limit itself (at most
 * IR_MAX_DECODE_BUCKETS entries into out). Returns the count. */
int32_t ir_default_decode_buckets(const ir_model_config *c, int64_t *out);
/* Checks a decode-bucket list against c's step limits (ascending, each in 1..min of
 * max_tokens, max_seqs, max_logits, at most IR_MAX_DECODE_BUCKETS); errors say which. */
ir_status ir_check_decode_buckets(const ir_model_config *c, const int64_t *b, int32_t n,
                                  ir_diag *d);

/* Infers the output dtypes and dims of node `n` from its inputs (used by add_node and
 * by the verifier). out_* arrays have IR_MAX_IO entries. */
ir_status ir_op_infer(const ir_graph *g, const ir_node *n, ir_dtype *out_dt, int *out_rank,
                      ir_dim (*out_dims)[IR_MAX_RANK], int *out_n, ir_diag *d);

/* Readable listing: config, inputs, weights summary, then one line per node. */
void ir_graph_print(const ir_graph *g, FILE *f);
void ir_tensor_format_shape(const ir_tensor *t, char *buf, size_t len);

#endif
