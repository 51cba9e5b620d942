/* delta_net_plan.h (internal, C and C++): how the CUDA backward of the gated delta rule
 * (DELTA_NET_BACK, src/backend/cuda/delta_net.cu) splits one problem over blocks, worked
 * out on the host from the shape alone. Plain C so that a test without a GPU can check it,
 * and so that the precondition (which must not touch the device) and the launcher read the
 * same numbers.
 *
 * A block takes one column chunk of one (value head, sequence): `cols` value columns, each
 * walked by `row_groups` threads that own the key rows r, r + row_groups, ... So a thread
 * owns the same elements of S and dS for the whole recurrence. The plan does not depend on
 * the device (the same shape always sums in the same order). */
#ifndef LATHE_BACKEND_CUDA_DELTA_NET_PLAN_H
#define LATHE_BACKEND_CUDA_DELTA_NET_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DN_BACK_THREADS 256             /* the most threads a block */
#define DN_BACK_TARGET_BLOCKS 128       /* narrow the chunks until there are this many */
#define DN_BACK_MAX_SHARED (200u << 10) /* of Hopper's 227 KiB a block may opt into */

struct dn_back_plan {
    int64_t cols;           /* value columns a block: 8, 16 or 32 (a power of two <= a warp) */
    int64_t chunks;         /* column chunks of a value head: ceil(S_v / cols) */
    int64_t row_groups;     /* threads a column (a power of two) */
    int64_t threads;        /* cols * row_groups: a multiple of 32, at most DN_BACK_THREADS */
    int64_t blocks;         /* H_v * B * chunks; block (c, h, b) is (b * H_v + h) * chunks + c */
    int64_t seg, n_seg;     /* a checkpoint every seg tokens, n_seg of them */
    int64_t part_per_token; /* floats of partial sums a token: dq [S_k], dk [S_k], dg, dbeta */
    int64_t part_per_block; /* T * part_per_token */
    int64_t work_per_block; /* floats: checkpoints [n_seg][S_k][cols], one segment's states
                               [seg][S_k][cols], its e values [seg][cols] */
    size_t shared_bytes;    /* S, dS [S_k][cols]; q, k, dq, dk rows [S_k]; [row_groups][cols] */
};

/* The plan for S_k, S_v, H_v value heads, B sequences and T tokens. False, with a reason,
 * when the kernel cannot run it (shared memory over DN_BACK_MAX_SHARED, too many blocks). */
bool dn_back_plan_init(struct dn_back_plan *p, int64_t sk, int64_t sv, int64_t hv, int64_t nb,
                       int64_t nt, char *reason, size_t reason_size);

#ifdef __cplusplus
}
#endif
#endif
