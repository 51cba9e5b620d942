/* cuda_profile.cu: LATHE_CUDA_PROFILE=1, where the device's time goes, per op (and with
 * =2 per node kind; =3 as 2 with the host's own issue cost), printed to stderr when the
 * backend is freed. The CUDA backend's node
 * loop (cuda_backend.cu) brackets each node it queues with the calls below. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_profile.h"

/* Each node is bracketed by two events; at the end of a compute call the stream is
 * synchronised and the elapsed times added up per op, with the host's time spent issuing
 * the node (precondition, plan, launch). The table is printed to stderr when the backend is
 * freed. The events and the synchronisation cost time themselves: use it to find where time
 * goes, not to measure speed. */
#define CU_PROFILE_EVENTS 8192
/* LATHE_CUDA_PROFILE=2 also sums by node kind: the op, the node's name without its layer
 * number, and the sources' types and shapes (which product, which copy), printed by device
 * time, the first CU_PROFILE_KINDS kinds kept */
#define CU_PROFILE_KINDS 1024
#define CU_PROFILE_KIND_LEN 160
/* kinds printed: enough for a training step's small elementwise kinds, which add up */
#define CU_PROFILE_PRINTED 160

struct cu_profile {
    cudaEvent_t ev[2 * CU_PROFILE_EVENTS];
    enum lt_op op[CU_PROFILE_EVENTS];
    int kind[CU_PROFILE_EVENTS]; /* -1: not kept */
    double gpu_ms[LT_OP_COUNT], host_ms[LT_OP_COUNT];
    long count[LT_OP_COUNT];
    long calls;
    double wall_ms;
    bool by_kind;
    /* LATHE_CUDA_PROFILE=3: each node waits for the queue to drain before it is issued.
     * Otherwise a node's issue time includes the wait of a launch into a full queue (when
     * the device is the bottleneck, the host's issue time then reads about the device's);
     * with it, issue time is the host's own cost (precondition, plan, launch calls), and the
     * wall time says nothing. */
    bool sync_nodes;
    long skip; /* LATHE_CUDA_PROFILE_SKIP: compute calls not timed (a training job's first
                  step grows scratch, and each growth waits for the queue inside a node) */
    int n_kinds;
    char kind_name[CU_PROFILE_KINDS][CU_PROFILE_KIND_LEN];
    double kind_ms[CU_PROFILE_KINDS];
    long kind_count[CU_PROFILE_KINDS];
};

/* the node's kind (LATHE_CUDA_PROFILE=2): "OP name-without-digits <- type[ne..] ..." */
static int profile_kind(struct cu_profile *p, const struct lt_tensor *node)
{
    char key[CU_PROFILE_KIND_LEN];
    int n = snprintf(key, sizeof(key), "%s ", lt_op_name(node->op));
    for (const char *s = node->name; *s && n < (int)sizeof(key) - 1; s++)
        if (!isdigit((unsigned char)*s))
            key[n++] = *s;
    key[n] = '\0';
    for (int i = 0; i < LT_MAX_SRC && node->src[i] && n < (int)sizeof(key) - 1; i++) {
        const struct lt_tensor *t = node->src[i];
        n += snprintf(key + n, sizeof(key) - (size_t)n, " %s%s[%lld,%lld,%lld,%lld]",
                      lt_type_name(t->type), lt_is_contiguous(t) ? "" : "~", (long long)t->ne[0],
                      (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    }
    for (int i = 0; i < p->n_kinds; i++)
        if (strcmp(p->kind_name[i], key) == 0)
            return i;
    if (p->n_kinds == CU_PROFILE_KINDS)
        return -1;
    snprintf(p->kind_name[p->n_kinds], CU_PROFILE_KIND_LEN, "%s", key);
    return p->n_kinds++;
}

static double host_ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

void cu_profile_new(struct cu_ctx *c)
{
    const char *env = getenv("LATHE_CUDA_PROFILE");
    if (!env || (strcmp(env, "1") != 0 && strcmp(env, "2") != 0 && strcmp(env, "3") != 0))
        return;
    struct cu_profile *p = (struct cu_profile *)calloc(1, sizeof(*p));
    if (!p)
        return;
    p->by_kind = env[0] == '2' || env[0] == '3';
    p->sync_nodes = env[0] == '3';
    const char *skip = getenv("LATHE_CUDA_PROFILE_SKIP");
    p->skip = skip ? atol(skip) : 0;
    for (int i = 0; i < 2 * CU_PROFILE_EVENTS; i++)
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            for (int j = 0; j < i; j++)
                cudaEventDestroy(p->ev[j]);
            free(p);
            return;
        }
    c->profile = p;
}

static void profile_collect(struct cu_ctx *c, int n)
{
    struct cu_profile *p = c->profile;
    if (cudaEventSynchronize(p->ev[2 * n - 1]) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    for (int i = 0; i < n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) == cudaSuccess) {
            p->gpu_ms[p->op[i]] += ms;
            if (p->by_kind && p->kind[i] >= 0) {
                p->kind_ms[p->kind[i]] += ms;
                p->kind_count[p->kind[i]]++;
            }
        } else
            (void)cudaGetLastError();
    }
}

void cu_profile_free(struct cu_ctx *c)
{
    struct cu_profile *p = c->profile;
    if (!p)
        return;
    double gpu = 0, host = 0;
    for (int op = 0; op < LT_OP_COUNT; op++) {
        gpu += p->gpu_ms[op];
        host += p->host_ms[op];
    }
    fprintf(stderr, "%s profile: %ld compute calls (%ld not timed), %.1f ms wall inside them, "
            "%.1f ms on the device in nodes, %.1f ms issuing them\n%-16s %9s %10s %9s %10s %9s\n",
            c->name, p->calls, p->skip < p->calls ? p->skip : p->calls, p->wall_ms, gpu, host, "op", "nodes", "device ms", "us/node", "issue ms",
            "us/node");
    for (int op = 0; op < LT_OP_COUNT; op++)
        if (p->count[op])
            fprintf(stderr, "%-16s %9ld %10.2f %9.2f %10.2f %9.2f\n", lt_op_name((enum lt_op)op),
                    p->count[op], p->gpu_ms[op], 1e3 * p->gpu_ms[op] / (double)p->count[op],
                    p->host_ms[op], 1e3 * p->host_ms[op] / (double)p->count[op]);
    if (p->by_kind) { /* the costliest kinds, by selection (printed once) */
        fprintf(stderr, "%s profile by node kind (%d kinds):\n%10s %8s %9s  kind\n", c->name,
                p->n_kinds, "device ms", "nodes", "us/node");
        for (int r = 0; r < CU_PROFILE_PRINTED; r++) {
            int best = -1;
            for (int i = 0; i < p->n_kinds; i++)
                if (p->kind_count[i] >= 0 && (best < 0 || p->kind_ms[i] > p->kind_ms[best]))
                    best = i;
            if (best < 0 || p->kind_count[best] == 0)
                break;
            fprintf(stderr, "%10.2f %8ld %9.2f  %s\n", p->kind_ms[best], p->kind_count[best],
                    1e3 * p->kind_ms[best] / (double)p->kind_count[best], p->kind_name[best]);
            p->kind_count[best] = -1;
        }
    }
    for (int i = 0; i < 2 * CU_PROFILE_EVENTS; i++)
        cudaEventDestroy(p->ev[i]);
    free(p);
    c->profile = NULL;
}

bool cu_profile_call_begin(struct cu_ctx *c, struct cu_profile_call *pc)
{
    struct cu_profile *p = c->profile;
    *pc = (struct cu_profile_call){0};
    if (!p)
        return false;
    if (p->calls < p->skip) {
        p->calls++;
        return false;
    }
    pc->t_call = host_ms_now();
    return true;
}

void cu_profile_node_begin(struct cu_ctx *c, struct cu_profile_call *pc)
{
    struct cu_profile *p = c->profile;
    if (pc->n == CU_PROFILE_EVENTS) { /* before the node's clock starts: it synchronises */
        profile_collect(c, pc->n);
        pc->n = 0;
    }
    if (p->sync_nodes && cudaStreamSynchronize(c->stream) != cudaSuccess)
        (void)cudaGetLastError(); /* the node's own launch reports the stream's error */
    pc->t_node = host_ms_now();
    cudaEventRecord(p->ev[2 * pc->n], c->stream);
}

void cu_profile_node_end(struct cu_ctx *c, struct cu_profile_call *pc,
                         const struct lt_tensor *node)
{
    struct cu_profile *p = c->profile;
    cudaEventRecord(p->ev[2 * pc->n + 1], c->stream);
    /* the node's issue ends here: the kind's lookup below is the profiler's own cost */
    p->host_ms[node->op] += host_ms_now() - pc->t_node;
    p->kind[pc->n] = p->by_kind ? profile_kind(p, node) : -1;
    p->op[pc->n++] = node->op;
    p->count[node->op]++;
}

void cu_profile_call_end(struct cu_ctx *c, struct cu_profile_call *pc)
{
    struct cu_profile *p = c->profile;
    if (pc->n)
        profile_collect(c, pc->n);
    p->calls++;
    p->wall_ms += host_ms_now() - pc->t_call;
}
