/* loss.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_cross_entropy = {.name = "CROSS_ENTROPY", .n_src = 2};
const struct lt_op_def lt_op_def_cross_entropy_back = {.name = "CROSS_ENTROPY_BACK", .n_src = 3};
