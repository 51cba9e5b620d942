/* comm_impl.h (internal): the communicator's vtable, which comm.c (single, threads) and
 * comm_nccl.c (NCCL) fill. comm.c's public functions check the arguments, answer a group of
 * one rank themselves (every collective is the identity there) and call the vtable for the
 * rest, so an implementation sees only real collectives of two or more ranks. Agreeing on a
 * status is built from a sum and a broadcast in comm.c, the same for every kind. */
#ifndef LATHE_DIST_COMM_IMPL_H
#define LATHE_DIST_COMM_IMPL_H

#include "lathe/comm.h"

struct comm_iface {
    const char *kind;
    lt_status (*allreduce_f32)(struct lt_comm *c, float *buf, size_t n);
    lt_status (*allreduce_f64)(struct lt_comm *c, double *buf, size_t n);
    /* NULL: comm.c sums the tensor through the host (get, allreduce_f32, set). Otherwise it is
     * called for every tensor, and may return LT_ERR_UNSUPPORTED to ask for the host path. */
    lt_status (*allreduce_tensor)(struct lt_comm *c, struct lt_tensor *t);
    lt_status (*broadcast)(struct lt_comm *c, void *buf, size_t bytes, int root);
    void (*free)(struct lt_comm *c);
};

struct lt_comm {
    const struct comm_iface *iface;
    int rank, size;
    void *impl; /* the implementation's own state */
};

#endif
