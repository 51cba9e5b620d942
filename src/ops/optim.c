/* optim.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_adamw = {.name = "ADAMW", .n_src = 5};
const struct lt_op_def lt_op_def_sgd = {.name = "SGD", .n_src = 2};
