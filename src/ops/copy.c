/* copy.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_cont = {.name = "CONT", .n_src = 1};
const struct lt_op_def lt_op_def_cpy = {.name = "CPY", .n_src = 2};
const struct lt_op_def lt_op_def_concat = {.name = "CONCAT", .n_src = 2};
const struct lt_op_def lt_op_def_repeat = {.name = "REPEAT", .n_src = 1};
const struct lt_op_def lt_op_def_repeat_back = {.name = "REPEAT_BACK", .n_src = 1};
const struct lt_op_def lt_op_def_acc = {.name = "ACC", .n_src = 2};
const struct lt_op_def lt_op_def_get_rows = {.name = "GET_ROWS", .n_src = 2};
const struct lt_op_def lt_op_def_get_rows_back = {.name = "GET_ROWS_BACK", .n_src = 2};
