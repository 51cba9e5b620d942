/* norm.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_rms_norm = {.name = "RMS_NORM", .n_src = 1};
const struct lt_op_def lt_op_def_l2_norm = {.name = "L2_NORM", .n_src = 1};
const struct lt_op_def lt_op_def_rms_norm_back = {.name = "RMS_NORM_BACK", .n_src = 2};
const struct lt_op_def lt_op_def_l2_norm_back = {.name = "L2_NORM_BACK", .n_src = 2};
