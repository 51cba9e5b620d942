/* cuda_graphs.cu: the CUDA backend's graph replay (see the comment below and
 * cuda_graphs.h): signatures of node lists, the kept executable graphs, capture. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_graphs.h"
#include "lathe/backend_cuda.h"

/* ---- CUDA graphs: a node list that comes back unchanged is replayed as one graph ----
 * Decode runs hundreds of small kernels a token. The session keeps its decode step (the
 * same nodes at the same addresses, new inputs written into the same buffers), so the
 * launches of one token are those of the last. Each small-batch list (every product over
 * at most CU_GRAPH_MAX_TOKENS activation columns, CU_GRAPH_MIN_NODES nodes or more) gets a
 * signature: every word a launcher reads from its nodes (op, type, shape, strides, op
 * params, data addresses, the same of every source) and the scratch generation. A list
 * whose signature equals a kept graph's is replayed (cudaGraphLaunch, no launcher runs);
 * one equal to a list run eagerly lately (the last CU_GRAPH_SEEN of them: a step split
 * around a CPU fallback comes as several lists) is recorded by stream capture,
 * instantiated and kept (CU_GRAPH_SLOTS of them, the least recently used replaced); any
 * other runs eagerly and is remembered. A list built anew every call (prefill, a graph
 * rebuilt per token) therefore never pays for a capture, only for its signature.
 * Scratch memory a kept graph's kernels read is freed when a slot grows; the generation
 * in the signature (bumped by every growth) keeps such a graph from being replayed.
 * Anything that would synchronise during a capture (scratch growth) spoils it, and the
 * list runs eagerly instead, as does any failure: an error is then reported by the eager
 * run itself; a list whose capture failed is not captured again while it is remembered (its
 * signature stays among the seen, marked), so a list that cannot be recorded costs one
 * extra issue, not one a call. LATHE_CUDA_GRAPHS=0 turns graphs off; LATHE_CUDA_GRAPHS=all
 * also keeps lists with wider products (a training step: its graph is built once, so its
 * lists repeat step after step). */
#define CU_GRAPH_SLOTS 4
#define CU_GRAPH_SEEN 4
#define CU_GRAPH_MIN_NODES 32
#define CU_GRAPH_MAX_TOKENS 64
#define CU_BLAS_WORKSPACE (32u << 20)

struct cu_sig {
    uint64_t *w;
    size_t n, cap;
};

struct cu_graphs {
    struct {
        cudaGraphExec_t exec; /* NULL: free */
        struct cu_sig sig;
        uint64_t last_used;
    } slot[CU_GRAPH_SLOTS];
    struct cu_sig cur;                /* this list's signature */
    struct cu_sig seen[CU_GRAPH_SEEN]; /* lists run eagerly lately (a ring) */
    bool failed[CU_GRAPH_SEEN];        /* seen[i]'s capture failed: run it eagerly */
    int next_seen;
    bool all; /* LATHE_CUDA_GRAPHS=all: lists of any width */
    uint64_t clock;
    void *blas_workspace; /* cuBLAS's, set once: no allocation inside a capture */
    long launched, instantiated, eager;
    long long launched_nodes; /* nodes of the lists launched as graphs, summed */
};

void cu_graphs_free(struct cu_ctx *c)
{
    struct cu_graphs *gs = c->graphs;
    if (!gs)
        return;
    if (getenv("LATHE_CUDA_GRAPHS_STATS"))
        fprintf(stderr,
                "%s graphs: %ld launched, %ld instantiated, %ld lists run eagerly; %.1f nodes a "
                "launch\n",
                c->name, gs->launched, gs->instantiated, gs->eager,
                gs->launched ? (double)gs->launched_nodes / (double)gs->launched : 0.0);
    for (int i = 0; i < CU_GRAPH_SLOTS; i++) {
        if (gs->slot[i].exec)
            cudaGraphExecDestroy(gs->slot[i].exec);
        free(gs->slot[i].sig.w);
    }
    free(gs->cur.w);
    for (int i = 0; i < CU_GRAPH_SEEN; i++)
        free(gs->seen[i].w);
    if (gs->blas_workspace)
        cudaFree(gs->blas_workspace);
    free(gs);
    c->graphs = NULL;
}

/* On unless LATHE_CUDA_GRAPHS=0; a failure here leaves graphs off, not the backend. */
void cu_graphs_new(struct cu_ctx *c)
{
    const char *env = getenv("LATHE_CUDA_GRAPHS");
    if (env && strcmp(env, "0") == 0)
        return;
    struct cu_graphs *gs = (struct cu_graphs *)calloc(1, sizeof(*gs));
    if (!gs)
        return;
    if (cudaMalloc(&gs->blas_workspace, CU_BLAS_WORKSPACE) != cudaSuccess ||
        cublasSetWorkspace(c->blas, gs->blas_workspace, CU_BLAS_WORKSPACE) !=
            CUBLAS_STATUS_SUCCESS) {
        (void)cudaGetLastError();
        if (gs->blas_workspace)
            cudaFree(gs->blas_workspace);
        free(gs);
        return;
    }
    gs->all = env && strcmp(env, "all") == 0;
    c->graphs = gs;
}

bool cu_graph_worthy(const struct cu_ctx *c, struct lt_tensor *const *nodes, int n_nodes)
{
    if (!c->graphs || n_nodes < CU_GRAPH_MIN_NODES)
        return false;
    if (c->graphs->all)
        return true;
    for (int i = 0; i < n_nodes; i++)
        if ((nodes[i]->op == LT_OP_MUL_MAT || nodes[i]->op == LT_OP_MUL_MAT_ACC ||
             nodes[i]->op == LT_OP_MUL_MAT_GLU || nodes[i]->op == LT_OP_MUL_MAT_ADD_RMS_NORM ||
             nodes[i]->op == LT_OP_RMS_NORM_MUL_MAT) &&
            nodes[i]->src[1]->ne[1] > CU_GRAPH_MAX_TOKENS)
            return false;
    return true;
}

static bool sig_push(struct cu_sig *s, uint64_t v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4096;
        uint64_t *w = (uint64_t *)realloc(s->w, cap * sizeof(*w));
        if (!w)
            return false;
        s->w = w;
        s->cap = cap;
    }
    s->w[s->n++] = v;
    return true;
}

static bool sig_tensor(struct cu_sig *s, const struct lt_tensor *t)
{
    bool ok = sig_push(s, (uint64_t)t->type) && sig_push(s, (uint64_t)(uintptr_t)t->data);
    for (int k = 0; k < LT_MAX_DIMS && ok; k++)
        ok = sig_push(s, (uint64_t)t->ne[k]) && sig_push(s, (uint64_t)t->nb[k]);
    return ok;
}

/* Everything the launchers of the list read from its nodes, and the scratch generation. */
static bool sig_build(struct cu_sig *s, const struct cu_ctx *c, struct lt_tensor *const *nodes,
                      int n_nodes)
{
    s->n = 0;
    bool ok = sig_push(s, c->scratch_epoch) && sig_push(s, (uint64_t)n_nodes);
    for (int i = 0; i < n_nodes && ok; i++) {
        const struct lt_tensor *t = nodes[i];
        if (lt_op_is_view(t->op))
            continue;
        ok = sig_push(s, (uint64_t)t->op) && sig_tensor(s, t);
        for (int k = 0; k < LT_MAX_OP_PARAMS && ok; k += 2)
            ok = sig_push(s, (uint64_t)(uint32_t)t->op_params[k] |
                                 (uint64_t)(uint32_t)t->op_params[k + 1] << 32);
        for (int k = 0; k < LT_MAX_SRC && ok; k++)
            ok = t->src[k] ? sig_tensor(s, t->src[k]) : sig_push(s, ~0ull);
    }
    return ok;
}

static bool sig_equal(const struct cu_sig *a, const struct cu_sig *b)
{
    return a->n == b->n && a->n > 0 && memcmp(a->w, b->w, a->n * sizeof(*a->w)) == 0;
}

static void sig_swap(struct cu_sig *a, struct cu_sig *b)
{
    struct cu_sig t = *a;
    *a = *b;
    *b = t;
}

/* Records the list by stream capture into a kept slot; -1 when it could not be (nothing
 * ran then). */
static int graph_capture(struct lt_backend *be, struct cu_ctx *c, struct lt_tensor *const *nodes,
                         int n_nodes, cu_issue_fn issue)
{
    struct cu_graphs *gs = c->graphs;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    c->capturing = true;
    lt_status st = issue(be, nodes, n_nodes);
    c->capturing = false;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (st != LT_OK || e != cudaSuccess || !graph) {
        (void)cudaGetLastError();
        if (graph)
            cudaGraphDestroy(graph);
        return -1;
    }
    int k = 0; /* a free slot, else the least recently used */
    for (int i = 1; i < CU_GRAPH_SLOTS; i++)
        if (!gs->slot[i].exec ||
            (gs->slot[k].exec && gs->slot[i].last_used < gs->slot[k].last_used))
            k = i;
    if (gs->slot[k].exec)
        cudaGraphExecDestroy(gs->slot[k].exec);
    gs->slot[k].exec = NULL;
    e = cudaGraphInstantiate(&gs->slot[k].exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        gs->slot[k].exec = NULL;
        return -1;
    }
    gs->instantiated++;
    sig_swap(&gs->slot[k].sig, &gs->cur);
    return k;
}

lt_status cu_graph_compute(struct lt_backend *be, struct cu_ctx *c,
                           struct lt_tensor *const *nodes, int n_nodes, cu_issue_fn issue,
                           bool *eager)
{
    struct cu_graphs *gs = c->graphs;
    *eager = true;
    if (!sig_build(&gs->cur, c, nodes, n_nodes)) {
        gs->eager++;
        return LT_OK;
    }
    int k = -1;
    for (int i = 0; i < CU_GRAPH_SLOTS && k < 0; i++)
        if (gs->slot[i].exec && sig_equal(&gs->slot[i].sig, &gs->cur))
            k = i;
    int seen = -1;
    for (int i = 0; i < CU_GRAPH_SEEN && k < 0 && seen < 0; i++)
        if (sig_equal(&gs->seen[i], &gs->cur))
            seen = i;
    if (seen >= 0 && !gs->failed[seen]) {
        if ((k = graph_capture(be, c, nodes, n_nodes, issue)) >= 0)
            gs->seen[seen].n = 0; /* kept now: forget it here */
        else
            gs->failed[seen] = true;
    }
    if (k < 0) {
        if (seen < 0) {
            sig_swap(&gs->cur, &gs->seen[gs->next_seen]);
            gs->failed[gs->next_seen] = false;
            gs->next_seen = (gs->next_seen + 1) % CU_GRAPH_SEEN;
        }
        gs->eager++;
        return LT_OK;
    }
    gs->slot[k].last_used = ++gs->clock;
    *eager = false;
    gs->launched++;
    gs->launched_nodes += n_nodes;
    return cu_check(cudaGraphLaunch(gs->slot[k].exec, c->stream), "launching a CUDA graph");
}

void cu_graphs_stats(const struct cu_ctx *c, struct lt_cuda_graph_stats *out)
{
    const struct cu_graphs *gs = c->graphs;
    if (!gs)
        return;
    out->launched = gs->launched;
    out->instantiated = gs->instantiated;
    out->eager = gs->eager;
}
