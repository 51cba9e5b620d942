/* comm_nccl.c: the NCCL communicator, one rank per GPU of this process (compiled only with
 * cmake -DLATHE_NCCL=ON; comm.c stands in for lt_comm_nccl_group_new without it).
 *
 * The group is made at once (ncclCommInitAll), and each rank is then driven by a thread of
 * its own, as the threads communicator is. A tensor that lives in this rank's GPU memory is
 * summed where it is; anything else goes through a device scratch buffer of the rank's
 * (host -> device, the collective, device -> host). Every call waits for its collective to
 * finish, and a device tensor is summed only after the whole device is idle: the backend
 * that computed it may have used a stream of its own. Compiled and linked here against the
 * nvidia-nccl-cu13 wheel, but not yet run on GPUs (no multi-GPU machine was lent). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_impl.h"
#include "lathe/backend.h"

struct nccl_rank {
    ncclComm_t comm;
    int device;
    cudaStream_t stream;
    void *scratch; /* device memory for host buffers' collectives; grows */
    size_t scratch_size;
};

static lt_status nccl_check(ncclResult_t r, const char *what)
{
    if (r == ncclSuccess)
        return LT_OK;
    return lt_fail(LT_ERR_BACKEND, "NCCL %s: %s", what, ncclGetErrorString(r));
}

static lt_status cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return LT_OK;
    return lt_fail(LT_ERR_BACKEND, "CUDA %s: %s", what, cudaGetErrorString(e));
}

static lt_status grow_scratch(struct nccl_rank *nr, size_t bytes)
{
    if (bytes <= nr->scratch_size)
        return LT_OK;
    if (nr->scratch)
        cudaFree(nr->scratch);
    nr->scratch = NULL;
    nr->scratch_size = 0;
    lt_status st = cuda_check(cudaMalloc(&nr->scratch, bytes), "scratch for a collective");
    if (st == LT_OK)
        nr->scratch_size = bytes;
    return st;
}

/* Sums (or, with root >= 0, broadcasts) a host buffer of n elements through the scratch. */
static lt_status host_collective(struct lt_comm *c, void *buf, size_t n, ncclDataType_t type,
                                 size_t elem, int root)
{
    struct nccl_rank *nr = c->impl;
    size_t bytes = n * elem;
    lt_status st = cuda_check(cudaSetDevice(nr->device), "set device");
    if (st == LT_OK)
        st = grow_scratch(nr, bytes);
    if (st == LT_OK)
        st =
            cuda_check(cudaMemcpyAsync(nr->scratch, buf, bytes, cudaMemcpyHostToDevice, nr->stream),
                       "copy to the device");
    if (st == LT_OK && root < 0)
        st = nccl_check(
            ncclAllReduce(nr->scratch, nr->scratch, n, type, ncclSum, nr->comm, nr->stream),
            "all-reduce");
    else if (st == LT_OK)
        st =
            nccl_check(ncclBroadcast(nr->scratch, nr->scratch, n, type, root, nr->comm, nr->stream),
                       "broadcast");
    if (st == LT_OK)
        st =
            cuda_check(cudaMemcpyAsync(buf, nr->scratch, bytes, cudaMemcpyDeviceToHost, nr->stream),
                       "copy from the device");
    if (st == LT_OK)
        st = cuda_check(cudaStreamSynchronize(nr->stream), "wait for a collective");
    return st;
}

static lt_status nccl_f32(struct lt_comm *c, float *buf, size_t n)
{
    return host_collective(c, buf, n, ncclFloat32, sizeof(float), -1);
}

static lt_status nccl_f64(struct lt_comm *c, double *buf, size_t n)
{
    return host_collective(c, buf, n, ncclFloat64, sizeof(double), -1);
}

static lt_status nccl_broadcast(struct lt_comm *c, void *buf, size_t bytes, int root)
{
    return host_collective(c, buf, bytes, ncclUint8, 1, root);
}

/* In place when the tensor is in this rank's GPU memory; LT_ERR_UNSUPPORTED (the host path)
 * otherwise. Whether it is comes from CUDA itself, not from the backend's name. */
static lt_status nccl_tensor(struct lt_comm *c, struct lt_tensor *t)
{
    struct nccl_rank *nr = c->impl;
    struct cudaPointerAttributes attr;
    if (!t->buffer || t->buffer->backend->is_host ||
        cudaPointerGetAttributes(&attr, t->data) != cudaSuccess ||
        attr.type != cudaMemoryTypeDevice || attr.device != nr->device) {
        (void)cudaGetLastError(); /* a host pointer's query leaves no error behind */
        return LT_ERR_UNSUPPORTED;
    }
    lt_status st = cuda_check(cudaSetDevice(nr->device), "set device");
    if (st == LT_OK)
        st = cuda_check(cudaDeviceSynchronize(), "wait for the device");
    if (st == LT_OK)
        st = nccl_check(ncclAllReduce(t->data, t->data, (size_t)lt_nelements(t), ncclFloat32,
                                      ncclSum, nr->comm, nr->stream),
                        "all-reduce");
    if (st == LT_OK)
        st = cuda_check(cudaStreamSynchronize(nr->stream), "wait for a collective");
    return st;
}

static void nccl_free(struct lt_comm *c)
{
    struct nccl_rank *nr = c->impl;
    cudaSetDevice(nr->device);
    if (nr->scratch)
        cudaFree(nr->scratch);
    if (nr->stream)
        cudaStreamDestroy(nr->stream);
    if (nr->comm)
        ncclCommDestroy(nr->comm);
    free(nr);
    free(c);
}

static const struct comm_iface nccl_iface = {
    .kind = "nccl",
    .allreduce_f32 = nccl_f32,
    .allreduce_f64 = nccl_f64,
    .allreduce_tensor = nccl_tensor,
    .broadcast = nccl_broadcast,
    .free = nccl_free,
};

bool lt_comm_have_nccl(void)
{
    return true;
}

/* Rank r's handle around its NCCL communicator, with a stream on its device. */
static lt_status rank_new(ncclComm_t comm, int r, int n, int device, struct lt_comm **out)
{
    struct lt_comm *c = calloc(1, sizeof(*c));
    struct nccl_rank *nr = calloc(1, sizeof(*nr));
    if (!c || !nr) {
        free(c);
        free(nr);
        ncclCommDestroy(comm);
        return lt_fail(LT_ERR_NOMEM, "out of memory for an NCCL rank");
    }
    nr->comm = comm;
    nr->device = device;
    *c = (struct lt_comm){.iface = &nccl_iface, .rank = r, .size = n, .impl = nr};
    lt_status st = cuda_check(cudaSetDevice(device), "set device");
    if (st == LT_OK)
        st = cuda_check(cudaStreamCreateWithFlags(&nr->stream, cudaStreamNonBlocking),
                        "create a stream");
    if (st != LT_OK) {
        nccl_free(c);
        return st;
    }
    *out = c;
    return LT_OK;
}

lt_status lt_comm_nccl_group_new(int n, const int *devices, struct lt_comm **ranks)
{
    if (n < 1 || n > 4096)
        return lt_fail(LT_ERR_INVALID, "an NCCL group of %d ranks; 1 to 4096 are possible", n);
    for (int r = 0; r < n; r++)
        ranks[r] = NULL;
    ncclComm_t *comms = calloc((size_t)n, sizeof(*comms));
    if (!comms)
        return lt_fail(LT_ERR_NOMEM, "out of memory for an NCCL group of %d ranks", n);
    lt_status st = nccl_check(ncclCommInitAll(comms, n, devices), "group of ranks");
    bool inited = st == LT_OK;
    int made = 0;
    for (; st == LT_OK && made < n; made++)
        st = rank_new(comms[made], made, n, devices[made], &ranks[made]);
    if (st != LT_OK) {
        /* rank_new released the communicator it failed with; the rest were never wrapped */
        for (int r = made; inited && r < n; r++)
            ncclCommDestroy(comms[r]);
        for (int r = 0; r < n; r++) {
            lt_comm_free(ranks[r]);
            ranks[r] = NULL;
        }
    }
    free(comms);
    return st;
}
