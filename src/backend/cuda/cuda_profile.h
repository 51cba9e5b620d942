/* cuda_profile.h (internal, CUDA C++): LATHE_CUDA_PROFILE's timing of the nodes the CUDA
 * backend queues (cuda_profile.cu). Each node is bracketed by two events; the table of
 * device and host (issue) time per op is printed when the backend is freed. */
#ifndef LATHE_BACKEND_CUDA_PROFILE_H
#define LATHE_BACKEND_CUDA_PROFILE_H

#include "backend/cuda/cuda_common.h"

/* one compute call being timed */
struct cu_profile_call {
    double t_call, t_node; /* host milliseconds at its start and at the node's */
    int n;                 /* nodes bracketed and not yet collected */
};

/* c->profile when LATHE_CUDA_PROFILE is 1, 2 or 3 (LATHE_CUDA_PROFILE_SKIP: calls not
 * timed) */
void cu_profile_new(struct cu_ctx *c);
/* prints the table and frees c->profile; nothing when profiling is off */
void cu_profile_free(struct cu_ctx *c);
/* false when this call is not timed (profiling off, or among the skipped calls) */
bool cu_profile_call_begin(struct cu_ctx *c, struct cu_profile_call *pc);
void cu_profile_node_begin(struct cu_ctx *c, struct cu_profile_call *pc);
void cu_profile_node_end(struct cu_ctx *c, struct cu_profile_call *pc,
                         const struct lt_tensor *node);
void cu_profile_call_end(struct cu_ctx *c, struct cu_profile_call *pc);

#endif
