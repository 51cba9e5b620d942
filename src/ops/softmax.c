/* softmax.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_soft_max = {.name = "SOFT_MAX", .n_src = 2};
const struct lt_op_def lt_op_def_soft_max_back = {.name = "SOFT_MAX_BACK", .n_src = 2};
