/* unary.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_scale = {.name = "SCALE", .n_src = 1};
const struct lt_op_def lt_op_def_silu = {.name = "SILU", .n_src = 1};
const struct lt_op_def lt_op_def_sigmoid = {.name = "SIGMOID", .n_src = 1};
const struct lt_op_def lt_op_def_softplus = {.name = "SOFTPLUS", .n_src = 1};
const struct lt_op_def lt_op_def_exp = {.name = "EXP", .n_src = 1};
const struct lt_op_def lt_op_def_log = {.name = "LOG", .n_src = 1};
const struct lt_op_def lt_op_def_sqr = {.name = "SQR", .n_src = 1};
const struct lt_op_def lt_op_def_sqrt = {.name = "SQRT", .n_src = 1};
const struct lt_op_def lt_op_def_sin = {.name = "SIN", .n_src = 1};
const struct lt_op_def lt_op_def_cos = {.name = "COS", .n_src = 1};
const struct lt_op_def lt_op_def_abs = {.name = "ABS", .n_src = 1};
const struct lt_op_def lt_op_def_neg = {.name = "NEG", .n_src = 1};
const struct lt_op_def lt_op_def_relu = {.name = "RELU", .n_src = 1};
const struct lt_op_def lt_op_def_silu_back = {.name = "SILU_BACK", .n_src = 2};
const struct lt_op_def lt_op_def_swiglu = {.name = "SWIGLU", .n_src = 2};
