/* comm.h: communicators: the ranks of a data-parallel job and the few collectives they share
 * (sum, broadcast, and agreeing on a status).
 *
 * A communicator is one rank's handle on a group of `size` ranks. Every collective is called
 * by every rank of the group, in the same order, with the same sizes; a rank that skips one
 * leaves the others waiting. Each handle belongs to one thread at a time. Three kinds:
 *
 * - single (lt_comm_single_new): one rank; every collective is the identity, so a job with
 *   it computes exactly what a job without a communicator does;
 * - threads (lt_comm_threads_new): N ranks in one process, one thread each, meeting at
 *   barriers; sums run in rank order, so every rank gets the same bits. It is how the CPU
 *   tests real multi-rank arithmetic;
 * - NCCL (lt_comm_nccl_new, only in a build with -DLATHE_NCCL=ON): one rank per GPU.
 *
 * Sums are in place: after lt_comm_allreduce_f32 every rank's buffer holds the sum of all the
 * ranks' buffers, element by element. */
#ifndef LATHE_COMM_H
#define LATHE_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "lathe/status.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct lt_comm;

/* What lt_comm_agree hands every rank. */
struct lt_comm_verdict {
    lt_status status;  /* LT_OK when every rank said LT_OK, else the first failing rank's */
    int rank;          /* that rank (the lowest that failed); -1 when none */
    char reason[1024]; /* its reason, as it gave it; "" when none */
};

int lt_comm_rank(const struct lt_comm *c);
int lt_comm_size(const struct lt_comm *c);
const char *lt_comm_kind(const struct lt_comm *c); /* "single", "threads", "nccl" */

/* Sums buf[0..n) over the ranks, in place, on the host. */
lt_status lt_comm_allreduce_f32(struct lt_comm *c, float *buf, size_t n);
lt_status lt_comm_allreduce_f64(struct lt_comm *c, double *buf, size_t n);
/* Sums a contiguous F32 tensor over the ranks, in place, on whatever backend holds it (through
 * the host unless the communicator can reach that backend's memory itself). */
lt_status lt_comm_allreduce_tensor(struct lt_comm *c, struct lt_tensor *t);
/* Copies root's buf[0..bytes) into every other rank's buf. */
lt_status lt_comm_broadcast(struct lt_comm *c, void *buf, size_t bytes, int root);
/* Every rank gives its status and, when it failed, its reason (NULL: lt_last_error()); every
 * rank gets the verdict: the lowest failing rank's status and reason, or LT_OK. The return
 * value says whether the communicator itself worked (the verdict is in *out). */
lt_status lt_comm_agree(struct lt_comm *c, lt_status st, const char *reason,
                        struct lt_comm_verdict *out);

/* A one-rank communicator; NULL (lt_last_error set) when out of memory. */
struct lt_comm *lt_comm_single_new(void);
/* A group of n ranks in this process: ranks[r] is rank r's handle, for one thread to use.
 * Each handle is freed by itself (lt_comm_free); the group goes with the last. */
lt_status lt_comm_threads_new(int n, struct lt_comm **ranks);
/* Whether this build has NCCL (-DLATHE_NCCL=ON). */
bool lt_comm_have_nccl(void);
/* One rank of an NCCL group of n ranks, on CUDA device `device` of this process (the caller's
 * threads, one a GPU); LT_ERR_UNSUPPORTED in a build without NCCL. The ranks of one group are
 * made together by lt_comm_nccl_group_new. */
lt_status lt_comm_nccl_group_new(int n, const int *devices, struct lt_comm **ranks);
void lt_comm_free(struct lt_comm *c);

#ifdef __cplusplus
}
#endif
#endif
