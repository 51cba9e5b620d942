/* delta_net_impl.h (internal): what DELTA_NET's and DELTA_NET_BACK's constructors
 * (delta_net_build.c) and their rule and CPU kernels (delta_net.c) share: the sources'
 * order and a problem's dims. */
#ifndef LATHE_OPS_DELTA_NET_IMPL_H
#define LATHE_OPS_DELTA_NET_IMPL_H

#include <assert.h>
#include <stdint.h>

#include "lathe/ops.h"

enum { SRC_Q, SRC_K, SRC_V, SRC_G, SRC_BETA, SRC_STATE, SRC_COUNT };
static_assert(SRC_STATE == (int)LT_DELTA_NET_GRAD_STATE &&
                  SRC_COUNT == (int)LT_DELTA_NET_GRAD_COUNT,
              "DELTA_NET's sources and DELTA_NET_BACK's gradients are in the same order");

/* dims of one problem, read from q [S_k, H_k, T, B] and v [S_v, H_v, T, B] */
struct dn_dims {
    int64_t sk, sv, hk, hv, nt, nb;
};

static inline struct dn_dims dn_dims_of(const struct lt_tensor *q, const struct lt_tensor *v)
{
    return (struct dn_dims){q->ne[0], v->ne[0], q->ne[1], v->ne[1], q->ne[2], q->ne[3]};
}

/* element offset of gradient `which` in DELTA_NET_BACK's flat result */
static inline int64_t back_offset(const struct lt_tensor *r, int which)
{
    int64_t off = 0;
    for (int i = 0; i < which; i++)
        off += lt_nelements(r->src[1 + i]);
    return off;
}

#endif
