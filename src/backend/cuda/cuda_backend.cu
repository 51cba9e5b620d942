/* cuda_backend.cu: the CUDA backend's vtable: device buffers, host copies, the verdict and
 * the loop that queues a list of nodes on the stream, plus the helpers every family file
 * uses (status conversion, scratch, source checks). CUDA graph replay is cuda_graphs.cu,
 * LATHE_CUDA_PROFILE's timing cuda_profile.cu.
 *
 * Which op runs where is not decided here: each family file lists its ops and exports one
 * precondition; the op -> family table is built from those lists, and supports_op and
 * compute both go through it (compute calls the family's launcher, which re-checks the
 * precondition). The only verdict this file adds is LATHE_CUDA_DISABLE_OPS, read once when
 * the backend is made. compute only queues work; errors of kernels that fail while
 * running surface at synchronize (the scheduler calls it after every run of nodes). */
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_graphs.h"
#include "backend/cuda/cuda_profile.h"
#include "backend/cuda/cuda_verdict.h"
#include "lathe/backend_cuda.h"

/* ---- status ---- */

lt_status cu_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return LT_OK;
    (void)cudaGetLastError(); /* clear it, so that the next launch check does not see it */
    return lt_fail(LT_ERR_BACKEND, "CUDA error in %s: %s (%s)", what, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

lt_status cu_check_blas(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return LT_OK;
    return lt_fail(LT_ERR_BACKEND, "cuBLAS error in %s: %s (%s)", what, cublasGetStatusString(s),
                   cublasGetStatusName(s));
}

lt_status cu_launched(const char *kernel)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return LT_OK;
    return lt_fail(LT_ERR_BACKEND, "CUDA error launching %s: %s (%s)", kernel,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

lt_status cu_refuse(const struct lt_tensor *node, const char *reason)
{
    return lt_fail(LT_ERR_UNSUPPORTED, "CUDA cannot run %s '%s': %s", lt_op_name(node->op),
                   node->name, reason);
}

/* What a slot holding `held` bytes holds after a request of `bytes`: as it is when it is
 * large enough, else the request (256 at least) and a quarter, some headroom against
 * creeping growth. cu_scratch grows by it and cuda_scratch_bytes foresees by it. */
static size_t scratch_grown(size_t held, size_t bytes)
{
    if (bytes == 0)
        bytes = 256;
    return held >= bytes ? held : bytes + bytes / 4;
}

lt_status cu_scratch(struct cu_ctx *c, enum cu_scratch_slot slot, size_t bytes, void **out)
{
    if (c->check_scratch && bytes > c->scratch_said[slot])
        return lt_fail(LT_ERR_BACKEND,
                       "%s: a node asked for %zu bytes of scratch (slot %d) where its family's "
                       "scratch function said %zu: the admission estimate would be short",
                       c->name, bytes, (int)slot, c->scratch_said[slot]);
    const size_t want = scratch_grown(c->scratch_size[slot], bytes);
    if (want == c->scratch_size[slot]) {
        *out = c->scratch[slot];
        return LT_OK;
    }
    if (c->capturing) /* no synchronising during a capture: the caller runs eagerly */
        return lt_fail(LT_ERR_BACKEND, "%s: scratch growth during a graph capture", c->name);
    /* a queued kernel may still read the old buffer */
    lt_status st = cu_check(cudaStreamSynchronize(c->stream), "synchronising before scratch growth");
    if (st != LT_OK)
        return st;
    if (c->scratch[slot])
        cudaFree(c->scratch[slot]);
    c->scratch_epoch++; /* kept graphs that read the old buffer are not replayed */
    c->scratch[slot] = NULL;
    c->scratch_size[slot] = 0;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return lt_fail(LT_ERR_NOMEM, "%s: cudaMalloc of %zu bytes of scratch failed: %s", c->name,
                       want, cudaGetErrorString(e));
    }
    c->scratch[slot] = p;
    c->scratch_size[slot] = want;
    *out = p;
    return LT_OK;
}

/* ---- checks shared by preconditions ---- */

bool cu_type_is_float(enum lt_type t)
{
    return t == LT_TYPE_F32 || t == LT_TYPE_F16 || t == LT_TYPE_BF16;
}

bool cu_type_readable(enum lt_type t)
{
    return (int)t >= 0 && (int)t < 64 && (CU_TYPES_READABLE & CU_TYPE_BIT(t)) != 0;
}

bool cu_check_source(const struct lt_tensor *node, int i, uint64_t types, char *reason,
                     size_t reason_size)
{
    const struct lt_tensor *s = node->src[i];
    if (!s) {
        snprintf(reason, reason_size, "source %d is missing", i);
        return false;
    }
    if ((int)s->type < 0 || (int)s->type >= 64 || !(types & CU_TYPE_BIT(s->type))) {
        snprintf(reason, reason_size, "source %d is %s, which the CUDA kernel does not take", i,
                 lt_type_name(s->type));
        return false;
    }
    const struct lt_type_traits *tt = lt_type_traits(s->type);
    if (tt->is_quantized) {
        if (s->nb[0] != tt->type_size) {
            snprintf(reason, reason_size, "source %d is quantised with split blocks", i);
            return false;
        }
        return true;
    }
    bool aligned = s->view_offs % tt->type_size == 0;
    for (int k = 0; k < LT_MAX_DIMS; k++)
        aligned = aligned && (s->ne[k] <= 1 || s->nb[k] % tt->type_size == 0);
    if (!aligned) {
        snprintf(reason, reason_size, "source %d (%s) is not aligned to its %zu-byte elements", i,
                 lt_layout_name(s), tt->type_size);
        return false;
    }
    return true;
}

bool cu_check_result_f32(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node) || node->view_offs % 4 != 0) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    return true;
}

bool cu_check_result_float(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const size_t es = node->type == LT_TYPE_F32 ? 4 : 2;
    if (!cu_type_is_float(node->type) || !lt_is_contiguous(node) || node->view_offs % es != 0) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32, f16 or bf16",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    return true;
}

/* ---- the op -> family table ---- */

static const struct cu_family *const all_families[] = {
    &cu_family_fill,       &cu_family_copy,      &cu_family_binary,    &cu_family_unary,
    &cu_family_reduce,     &cu_family_norm,      &cu_family_rope,      &cu_family_softmax,
    &cu_family_matmul,     &cu_family_ssm_conv,  &cu_family_delta_net, &cu_family_gdn_decode,
    &cu_family_loss,       &cu_family_linear_ce, &cu_family_optim,     &cu_family_attn_decode,
    &cu_family_flash_attn, &cu_family_conv_silu,
};

static const struct cu_family *const *family_table(void)
{
    static const struct cu_family *table[LT_OP_COUNT];
    static const bool built = [] {
        for (const struct cu_family *f : all_families)
            for (int i = 0; i < f->n_ops; i++) {
                assert(f->ops[i] > LT_OP_NONE && f->ops[i] < LT_OP_COUNT);
                assert(!table[f->ops[i]] && "an op listed by two CUDA families");
                table[f->ops[i]] = f;
            }
        return true;
    }();
    (void)built;
    return table;
}

/* ---- the backend ---- */

static struct cu_ctx *ctx_of(struct lt_backend *be) { return (struct cu_ctx *)be->impl; }

/* disabled: per op, or NULL for none; name: the backend's name for reasons */
static bool verdict(const bool *disabled, const char *name, const struct lt_tensor *node,
                    char *reason, size_t reason_size)
{
    if ((int)node->op < 0 || node->op >= LT_OP_COUNT) {
        snprintf(reason, reason_size, "unknown op %d", (int)node->op);
        return false;
    }
    if (lt_op_is_view(node->op))
        return true;
    if (disabled && disabled[node->op]) {
        snprintf(reason, reason_size, "disabled by LATHE_CUDA_DISABLE_OPS");
        return false;
    }
    const struct cu_family *f = family_table()[node->op];
    if (!f) {
        snprintf(reason, reason_size, "%s has no kernel for %s", name, lt_op_name(node->op));
        return false;
    }
    return f->supported(node, reason, reason_size);
}

static bool cuda_verdict(const struct cu_ctx *c, const struct lt_tensor *node, char *reason,
                         size_t reason_size)
{
    return verdict(c->disabled, c->name, node, reason, reason_size);
}

extern "C" bool lt_cuda_verdict(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    return verdict(NULL, "CUDA0", node, reason, reason_size);
}

extern "C" bool lt_cuda_compiled(void) { return true; }

static bool cuda_supports_op(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                             size_t reason_size)
{
    return cuda_verdict(ctx_of(be), node, reason, reason_size);
}

static lt_status cuda_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out)
{
    struct cu_ctx *c = ctx_of(be);
    struct lt_buffer *buf = (struct lt_buffer *)calloc(1, sizeof(*buf));
    if (!buf)
        return lt_fail(LT_ERR_NOMEM, "out of host memory");
    lt_status st = cu_check(cudaSetDevice(c->device), "cudaSetDevice");
    if (st != LT_OK) {
        free(buf);
        return st;
    }
    /* a request over the free memory is refused here, with the figures, not by a failing
     * cudaMalloc (which leaves an error for cudaGetLastError to clear and that
     * compute-sanitizer reports); cudaMalloc still decides the close cases */
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
    } else if (size > free_b) {
        free(buf);
        return lt_fail(LT_ERR_NOMEM,
                       "%s: a buffer of %.1f MiB does not fit: %.1f MiB free of %.1f MiB", c->name,
                       size / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size ? size : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(buf);
        return lt_fail(LT_ERR_NOMEM, "%s: cudaMalloc of %zu bytes failed: %s", c->name, size,
                       cudaGetErrorString(e));
    }
    buf->backend = be;
    buf->base = p;
    buf->size = size;
    *out = buf;
    return LT_OK;
}

static void cuda_buffer_free(struct lt_buffer *buf)
{
    struct cu_ctx *c = ctx_of(buf->backend);
    cudaSetDevice(c->device);
    cudaFree(buf->base);
    (void)cudaGetLastError();
    free(buf);
}

static lt_status cuda_copy(struct cu_ctx *c, void *dst, const void *src, size_t size,
                           cudaMemcpyKind kind, const char *what)
{
    lt_status st = cu_check(cudaSetDevice(c->device), "cudaSetDevice");
    if (st == LT_OK && size > 0)
        st = cu_check(cudaMemcpyAsync(dst, src, size, kind, c->stream), what);
    if (st == LT_OK)
        st = cu_check(cudaStreamSynchronize(c->stream), what);
    return st;
}

static lt_status cuda_tensor_set(struct lt_tensor *t, const void *src, size_t offset, size_t size)
{
    return cuda_copy(ctx_of(t->buffer->backend), (char *)t->data + offset, src, size,
                     cudaMemcpyHostToDevice, "a copy to the device");
}

static lt_status cuda_tensor_get(const struct lt_tensor *t, void *dst, size_t offset, size_t size)
{
    return cuda_copy(ctx_of(t->buffer->backend), dst, (const char *)t->data + offset, size,
                     cudaMemcpyDeviceToHost, "a copy from the device");
}

/* Is every source of node in this backend's memory? (The scheduler arranges it; a host
 * address handed to a kernel would corrupt the context, so it is checked, cheaply.) */
static bool sources_on_device(struct lt_backend *be, const struct lt_tensor *node, int *bad)
{
    for (int i = 0; i < LT_MAX_SRC; i++) {
        const struct lt_tensor *s = node->src[i];
        if (!s)
            continue;
        const struct lt_tensor *r = s->view_src ? s->view_src : s;
        if (!r->buffer || r->buffer->backend != be || !s->data) {
            *bad = i;
            return false;
        }
    }
    return true;
}

/* Queues nodes on the stream one by one (each through its family's launcher). */
static lt_status issue_nodes(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes)
{
    struct cu_ctx *c = ctx_of(be);
    lt_status st;
    char reason[CU_REASON_MAX];
    struct cu_profile_call pc;
    bool prof = cu_profile_call_begin(c, &pc);
    for (int i = 0; i < n_nodes; i++) {
        struct lt_tensor *node = nodes[i];
        if (lt_op_is_view(node->op))
            continue;
        if (prof)
            cu_profile_node_begin(c, &pc);
        reason[0] = '\0';
        if (!cuda_verdict(c, node, reason, sizeof(reason)))
            return lt_fail(LT_ERR_UNSUPPORTED, "%s cannot run %s '%s': %s", c->name,
                           lt_op_name(node->op), node->name, reason);
        int bad = -1;
        if (!node->data)
            return lt_fail(LT_ERR_INVALID, "node '%s' has no storage", node->name);
        if (!sources_on_device(be, node, &bad))
            return lt_fail(LT_ERR_INVALID, "%s '%s': source %d '%s' is not in %s memory",
                           lt_op_name(node->op), node->name, bad, node->src[bad]->name, c->name);
        const struct cu_family *fam = family_table()[node->op];
        if (c->check_scratch) {
            memset(c->scratch_said, 0, sizeof(c->scratch_said));
            if (fam->scratch)
                fam->scratch(node, c->scratch_said);
        }
        st = fam->compute(c, node);
        if (st != LT_OK)
            return st;
        if (prof)
            cu_profile_node_end(c, &pc, node);
    }
    if (prof)
        cu_profile_call_end(c, &pc);
    return LT_OK;
}

static lt_status cuda_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes)
{
    struct cu_ctx *c = ctx_of(be);
    lt_status st = cu_check(cudaSetDevice(c->device), "cudaSetDevice");
    if (st != LT_OK)
        return st;
    if (!c->profile && cu_graph_worthy(c, nodes, n_nodes)) {
        bool eager;
        st = cu_graph_compute(be, c, nodes, n_nodes, issue_nodes, &eager);
        if (!eager)
            return st;
    }
    return issue_nodes(be, nodes, n_nodes);
}

static lt_status cuda_synchronize(struct lt_backend *be)
{
    struct cu_ctx *c = ctx_of(be);
    lt_status st = cu_check(cudaSetDevice(c->device), "cudaSetDevice");
    if (st == LT_OK)
        st = cu_check(cudaStreamSynchronize(c->stream), "running the queued kernels");
    return st;
}

static lt_status cuda_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    struct cu_ctx *c = ctx_of(be);
    lt_status st = cu_check(cudaSetDevice(c->device), "cudaSetDevice");
    if (st == LT_OK)
        st = cu_check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
    return st;
}

static void ctx_free(struct cu_ctx *c)
{
    if (!c)
        return;
    cudaSetDevice(c->device);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    cu_profile_free(c); /* prints the table */
    for (int i = 0; i < CU_SCRATCH_COUNT; i++)
        if (c->scratch[i])
            cudaFree(c->scratch[i]);
    if (c->counters)
        cudaFree(c->counters);
    if (c->blas)
        cublasDestroy(c->blas);
    cu_graphs_free(c); /* after the handle that used its workspace */
    if (c->stream)
        cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
}

static void cuda_free(struct lt_backend *be)
{
    ctx_free(ctx_of(be));
    free(be);
}

/* page-locks host memory for the copies (cudaHostRegister: the whole process sees it so) */
static lt_status cuda_host_pin(struct lt_backend *be, void *ptr, size_t size)
{
    lt_status st = cu_check(cudaSetDevice(ctx_of(be)->device), "cudaSetDevice");
    return st != LT_OK ? st
                       : cu_check(cudaHostRegister(ptr, size, cudaHostRegisterDefault),
                                  "page-locking host memory");
}

static void cuda_host_unpin(struct lt_backend *be, void *ptr)
{
    cudaSetDevice(ctx_of(be)->device);
    cudaHostUnregister(ptr);
    (void)cudaGetLastError();
}

/* What the scratch slots will hold after running nodes (each family says what its nodes
 * ask for); nodes this backend cannot run add nothing (placement refuses them). */
static size_t cuda_scratch_bytes(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes,
                                 size_t *held)
{
    struct cu_ctx *c = ctx_of(be);
    size_t most[CU_SCRATCH_COUNT] = {0}; /* the largest request of each slot; 0: none */
    char reason[CU_REASON_MAX];
    for (int i = 0; i < n_nodes; i++) {
        const struct lt_tensor *node = nodes[i];
        if (lt_op_is_view(node->op))
            continue;
        const struct cu_family *f = family_table()[node->op];
        if (!f || !f->scratch || !cuda_verdict(c, node, reason, sizeof(reason)))
            continue;
        size_t need[CU_SCRATCH_COUNT] = {0};
        f->scratch(node, need);
        for (int k = 0; k < CU_SCRATCH_COUNT; k++)
            most[k] = need[k] > most[k] ? need[k] : most[k];
    }
    size_t total = 0;
    *held = 0;
    for (int k = 0; k < CU_SCRATCH_COUNT; k++) {
        *held += c->scratch_size[k];
        total += most[k] ? scratch_grown(c->scratch_size[k], most[k]) : c->scratch_size[k];
    }
    return total;
}

static const struct lt_backend_iface cuda_iface = {
    .supports_op = cuda_supports_op,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .tensor_set = cuda_tensor_set,
    .tensor_get = cuda_tensor_get,
    .compute = cuda_compute,
    .synchronize = cuda_synchronize,
    .memory = cuda_memory,
    .free = cuda_free,
    .host_pin = cuda_host_pin,
    .host_unpin = cuda_host_unpin,
    .scratch_bytes = cuda_scratch_bytes,
};

/* LATHE_CUDA_DISABLE_OPS=SQR,ACC: names as lt_op_name gives them, any case, spaces allowed;
 * unknown names are ignored. */
static void parse_disabled(struct cu_ctx *c)
{
    const char *env = getenv("LATHE_CUDA_DISABLE_OPS");
    if (!env)
        return;
    const char *p = env;
    while (*p) {
        while (*p == ',' || isspace((unsigned char)*p))
            p++;
        const char *start = p;
        while (*p && *p != ',')
            p++;
        const char *end = p;
        while (end > start && isspace((unsigned char)end[-1]))
            end--;
        size_t len = (size_t)(end - start);
        for (int op = 0; op < LT_OP_COUNT && len > 0; op++) {
            const char *name = lt_op_name((enum lt_op)op);
            if (strlen(name) == len && strncasecmp(name, start, len) == 0)
                c->disabled[op] = true;
        }
    }
}

extern "C" int lt_backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" bool lt_backend_is_cuda(const struct lt_backend *be)
{
    return be && be->iface == &cuda_iface;
}

extern "C" void lt_backend_cuda_graph_stats(const struct lt_backend *be,
                                            struct lt_cuda_graph_stats *out)
{
    *out = (struct lt_cuda_graph_stats){0, 0, 0};
    if (lt_backend_is_cuda(be))
        cu_graphs_stats((const struct cu_ctx *)be->impl, out);
}

extern "C" struct lt_backend *lt_backend_cuda_new(int device)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        lt_fail(LT_ERR_BACKEND, "no usable CUDA driver or GPU: %s", cudaGetErrorString(e));
        return NULL;
    }
    if (device < 0 || device >= n) {
        lt_fail(LT_ERR_BACKEND, "CUDA device %d does not exist (%d found)", device, n);
        return NULL;
    }
    struct lt_backend *be = (struct lt_backend *)calloc(1, sizeof(*be));
    struct cu_ctx *c = (struct cu_ctx *)calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        lt_fail(LT_ERR_NOMEM, "out of host memory starting the CUDA backend");
        return NULL;
    }
    c->device = device;
    snprintf(c->name, sizeof(c->name), "CUDA%d", device);
    lt_status st = cu_check(cudaSetDevice(device), "cudaSetDevice");
    if (st == LT_OK)
        st = cu_check(cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device),
                      "reading the multiprocessor count");
    if (st == LT_OK)
        st = cu_check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                      "creating a stream");
    if (st == LT_OK)
        st = cu_check(cudaMalloc((void **)&c->counters, CU_COUNTERS * sizeof(int)),
                      "allocating the block counters");
    if (st == LT_OK)
        st = cu_check(cudaMemset(c->counters, 0, CU_COUNTERS * sizeof(int)),
                      "zeroing the block counters");
    if (st == LT_OK)
        st = cu_check_blas(cublasCreate(&c->blas), "cublasCreate");
    if (st == LT_OK)
        st = cu_check_blas(cublasSetStream(c->blas, c->stream), "cublasSetStream");
    /* F32 products stay F32 (no TF32); half types use tensor cores with F32 sums */
    if (st == LT_OK)
        st = cu_check_blas(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    if (st != LT_OK)
        goto out_free;
    parse_disabled(c);
    {
        const char *e = getenv("LATHE_CUDA_CHECK_SCRATCH");
        c->check_scratch = e && strcmp(e, "1") == 0;
        const char *pdl = getenv("LATHE_CUDA_PDL");
        int major = 0;
        /* on by default since the 2026-12-07 H100 measurements (decode +3%, a BF16 prefill
         * +11%, a training step +1.7%, the same greedy texts); LATHE_CUDA_PDL=0 turns it off */
        c->pdl = !(pdl && strcmp(pdl, "0") == 0) &&
                 cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                     cudaSuccess &&
                 major >= 9;
    }
    cu_profile_new(c);
    cu_graphs_new(c);
    be->iface = &cuda_iface;
    be->impl = c;
    be->is_host = false;
    snprintf(be->name, sizeof(be->name), "%s", c->name);
    return be;
out_free:
    ctx_free(c);
    free(be);
    return NULL;
}
