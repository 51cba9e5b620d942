/* rope.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_rope = {.name = "ROPE", .n_src = 2};
const struct lt_op_def lt_op_def_rope_back = {.name = "ROPE_BACK", .n_src = 2};
