/* delta_net.c: (being written) */
#include "ops/op.h"

const struct lt_op_def lt_op_def_delta_net = {.name = "DELTA_NET", .n_src = 6};
const struct lt_op_def lt_op_def_delta_net_back = {.name = "DELTA_NET_BACK", .n_src = 6};
