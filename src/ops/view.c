/* view.c: the table entries of leaves and views (NONE, VIEW, RESHAPE, PERMUTE, TRANSPOSE).
 *
 * Views are made in src/core/tensor.c and compute nothing: their data is view_src's data
 * plus view_offs, so they have no CPU kernel (cpu_forward NULL) and every backend runs
 * them by skipping them. */
#include "ops/op.h"

const struct lt_op_def lt_op_def_none = {.name = "NONE", .n_src = 0};
const struct lt_op_def lt_op_def_view = {.name = "VIEW", .n_src = 1};
const struct lt_op_def lt_op_def_reshape = {.name = "RESHAPE", .n_src = 1};
const struct lt_op_def lt_op_def_permute = {.name = "PERMUTE", .n_src = 1};
const struct lt_op_def lt_op_def_transpose = {.name = "TRANSPOSE", .n_src = 1};
