/* delta_net_impl.h (internal, CUDA C++): what the files of the CUDA delta rule share.
 * delta_net.cu has the family (one predicate for claim and launcher), the per-token kernels
 * and the reduction of the backward's partials; delta_net_chunk.cu the chunked kernels (a
 * block walks a head's chunks); delta_net_wy.cu the chunk-parallel backward and forward,
 * the defaults (the forward where cu_dn_wy_fwd_auto says so). */
#ifndef LATHE_BACKEND_CUDA_DELTA_NET_IMPL_H
#define LATHE_BACKEND_CUDA_DELTA_NET_IMPL_H

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/delta_net_plan.h"

enum { SRC_Q, SRC_K, SRC_V, SRC_G, SRC_BETA, SRC_STATE, SRC_COUNT };

struct dn_srcs {
    struct cu_t q, k, v, g, beta, state;
};

/* the q, k, v, g, beta and state sources of a node, from source s0 on (1 for the backward,
 * whose gradient comes first) */
static inline struct dn_srcs dn_srcs_of(const struct lt_tensor *node, int s0)
{
    struct dn_srcs s = {cu_view(node->src[s0 + SRC_Q]),    cu_view(node->src[s0 + SRC_K]),
                        cu_view(node->src[s0 + SRC_V]),    cu_view(node->src[s0 + SRC_G]),
                        cu_view(node->src[s0 + SRC_BETA]), cu_view(node->src[s0 + SRC_STATE])};
    return s;
}

/* The dims and output offsets both backward kernels and the reduction read. */
struct dn_red {
    int64_t sk, sv, hk, hv, nt, nb;
    int64_t off_q, off_k, off_v, off_g, off_beta, off_state; /* in the flat result */
    int64_t chunks, part_per_block, part_per_token;           /* the blocks' partials */
};

/* the dims and offsets of a DELTA_NET_BACK node (no partials yet), or of a DELTA_NET node
 * (dims only) */
struct dn_red cu_dn_red_of(const struct lt_tensor *node);
/* dq, dk, dg and dbeta of the flat result `out` from the blocks' partials (either backward) */
lt_status cu_dn_launch_reduce(struct cu_ctx *c, const float *part, float *out,
                           const struct dn_red &R);
/* the chunked kernels (delta_net_chunk.cu), for a node whose plan P fits */
lt_status cu_dn_launch_chunked_forward(struct cu_ctx *c, struct lt_tensor *node,
                                    const struct dn_cback_plan &P);
lt_status cu_dn_launch_chunked_backward(struct cu_ctx *c, struct lt_tensor *node,
                                     const struct dn_cback_plan &P);
/* the chunk-parallel backward (delta_net_wy.cu), for a node whose plan P fits */
lt_status cu_dn_launch_wy_backward(struct cu_ctx *c, struct lt_tensor *node,
                                const struct dn_wy_plan &P);
/* the chunk-parallel forward (delta_net_wy.cu), for a DELTA_NET node whose forward plan P
 * (cu_dn_wy_fwd_plan_init) fits */
lt_status cu_dn_launch_wy_forward(struct cu_ctx *c, struct lt_tensor *node,
                               const struct dn_wy_plan &P);

#endif
