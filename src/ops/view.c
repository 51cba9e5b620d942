/* view.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_none = {.name = "NONE", .n_src = 0};
const struct lt_op_def lt_op_def_view = {.name = "VIEW", .n_src = 1};
const struct lt_op_def lt_op_def_reshape = {.name = "RESHAPE", .n_src = 1};
const struct lt_op_def lt_op_def_permute = {.name = "PERMUTE", .n_src = 1};
const struct lt_op_def lt_op_def_transpose = {.name = "TRANSPOSE", .n_src = 1};
