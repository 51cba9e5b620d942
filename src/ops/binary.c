/* binary.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_add = {.name = "ADD", .n_src = 2};
const struct lt_op_def lt_op_def_sub = {.name = "SUB", .n_src = 2};
const struct lt_op_def lt_op_def_mul = {.name = "MUL", .n_src = 2};
const struct lt_op_def lt_op_def_div = {.name = "DIV", .n_src = 2};
