/* reduce.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_sum_rows = {.name = "SUM_ROWS", .n_src = 1};
const struct lt_op_def lt_op_def_mean = {.name = "MEAN", .n_src = 1};
const struct lt_op_def lt_op_def_sum = {.name = "SUM", .n_src = 1};
