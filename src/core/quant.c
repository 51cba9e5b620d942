/* quant.c: (being written) */
#include <string.h>
#include "core/quant.h"
#define TODO_DEQ(n) void lt_dequant_##n(const void *s, float *d, int64_t k) { (void)s; memset(d, 0, (size_t)k * 4); }
#define TODO_Q(n) void lt_quant_##n(const float *s, void *d, int64_t k) { (void)s; (void)d; (void)k; }
TODO_DEQ(q4_0) TODO_DEQ(q4_1) TODO_DEQ(q5_0) TODO_DEQ(q5_1) TODO_DEQ(q8_0) TODO_DEQ(q8_1)
TODO_DEQ(q2_k) TODO_DEQ(q3_k) TODO_DEQ(q4_k) TODO_DEQ(q5_k) TODO_DEQ(q6_k) TODO_DEQ(q8_k)
TODO_Q(q4_0) TODO_Q(q4_1) TODO_Q(q5_0) TODO_Q(q5_1) TODO_Q(q8_0)
