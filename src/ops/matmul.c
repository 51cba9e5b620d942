/* matmul.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_mul_mat = {.name = "MUL_MAT", .n_src = 2};
