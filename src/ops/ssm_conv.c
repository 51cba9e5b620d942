/* ssm_conv.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_ssm_conv = {.name = "SSM_CONV", .n_src = 2};
const struct lt_op_def lt_op_def_ssm_conv_back = {.name = "SSM_CONV_BACK", .n_src = 3};
