/* train_graph.c: training graphs and their admission.
 *
 * Two graphs: the gradient graph (forward, backward, and for every trainable tensor
 * "accumulator += gradient"), run once per micro-batch, and the optimizer graph, run once
 * per optimizer step. Splitting them keeps every step after every reader of the old
 * weights without ordering tricks. Both are placed and measured in lt_train_graph_new;
 * nothing is allocated on any backend until lt_train_graph_alloc.
 *
 * The optimizer state is flat: the trainable tensors, their accumulators and AdamW's
 * moments each live in one F32 tensor ([n_flat], every tensor at the same offset in all
 * four, 64-element aligned, zeros between), so one step is one node that streams them
 * once. The accumulators are views of the flat one. The trainable tensors are the
 * caller's: lt_train_graph_alloc copies them into the flat tensor (on the optimizer's
 * backend) and points them there, and lt_train_graph_free copies the values back and
 * points them home again, so a caller sees its tensors trained in place. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/ptrmap.h"
#include "lathe/autodiff.h"
#include "lathe/ops.h"
#include "lathe/opt.h"
#include "lathe/sched.h"
#include "opt/remat.h"

#define TRAIN_GRAPH_CAP (1 << 18)

struct lt_train_graph {
    struct lt_ctx *ctx;
    struct lt_train_graph_params p;
    struct lt_backend *backends[LT_SCHED_MAX_BACKENDS];
    struct lt_tensor *loss;
    struct lt_graph *grads; /* forward + backward + accumulate */
    int n_forward;
    struct lt_graph *steps; /* optimizer */
    struct lt_sched *grads_sched, *steps_sched;
    struct lt_tensor **params, **accum, **stores; /* stores: the accumulation's last node */
    int n_params;
    /* the flat optimizer state, [n_flat] each; m and v for AdamW only */
    struct lt_tensor *w_flat, *acc_flat, *m_flat, *v_flat;
    int64_t n_flat;
    int64_t *offset;   /* per trainable tensor: its first element in the flat tensors, -1: none */
    void **home_data;  /* per trainable tensor: its own storage while it lives in w_flat */
    struct lt_buffer **home_buffer;
    bool bound;        /* the trainable tensors point into w_flat */
    struct lt_tensor *hp;
    size_t estimate, budget;
    size_t est_scratch; /* kernels' working memory the job adds on backend 0 (in estimate) */
    size_t est_in_use;  /* backend 0 memory in use before the job: context, weights (in estimate) */
    int step, n_accumulated;
    int n_recomputed; /* forward tensors the backward recomputes (checkpointing) */
};

static lt_status refuse_from(struct lt_refusal *r, lt_status st)
{
    if (r && r->kind != LT_REFUSAL_NONE)
        return lt_fail(LT_ERR_REFUSED, "%s", r->sentence);
    return st;
}

static lt_status collect_params(struct lt_train_graph *tg)
{
    struct lt_graph *g = tg->grads;
    size_t n = (size_t)g->n_leafs + 1;
    tg->params = calloc(n, sizeof(*tg->params));
    tg->accum = calloc(n, sizeof(*tg->accum));
    tg->stores = calloc(n, sizeof(*tg->stores));
    tg->offset = calloc(n, sizeof(*tg->offset));
    tg->home_data = calloc(n, sizeof(*tg->home_data));
    tg->home_buffer = calloc(n, sizeof(*tg->home_buffer));
    if (!tg->params || !tg->accum || !tg->stores || !tg->offset || !tg->home_data ||
        !tg->home_buffer)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the parameter list");
    for (int i = 0; i < g->n_leafs; i++) {
        struct lt_tensor *t = g->leafs[i];
        if (!(t->flags & LT_FLAG_PARAM))
            continue;
        if (tg->p.param_filter && !tg->p.param_filter(tg->p.user, t)) {
            t->flags &= ~(uint32_t)LT_FLAG_PARAM;
            continue;
        }
        if (t->type != LT_TYPE_F32)
            return lt_fail(LT_ERR_INVALID,
                           "trainable tensor '%s' is %s; trainable tensors are F32 (master weights)",
                           t->name, lt_type_name(t->type));
        tg->params[tg->n_params++] = t;
    }
    if (tg->n_params == 0)
        return lt_fail(LT_ERR_INVALID, "the loss '%s' depends on no trainable tensor", tg->loss->name);
    return LT_OK;
}

#define FLAT_ALIGN 64 /* elements: 256 bytes, so every tensor's slice starts aligned */

/* Lays the trainable tensors that get a gradient out in the flat tensors. */
static lt_status build_flat(struct lt_train_graph *tg)
{
    tg->n_flat = 0;
    for (int i = 0; i < tg->n_params; i++) {
        tg->offset[i] = -1;
        if (!tg->params[i]->grad)
            continue; /* trainable but not on a path to the loss: nothing to update */
        tg->offset[i] = tg->n_flat;
        tg->n_flat += (lt_nelements(tg->params[i]) + FLAT_ALIGN - 1) / FLAT_ALIGN * FLAT_ALIGN;
    }
    if (tg->n_flat == 0)
        return LT_OK;
    bool adamw = tg->p.optimizer != LT_OPTIMIZER_SGD;
    tg->w_flat = lt_new_tensor_1d(tg->ctx, LT_TYPE_F32, tg->n_flat);
    tg->acc_flat = lt_new_tensor_1d(tg->ctx, LT_TYPE_F32, tg->n_flat);
    if (adamw) {
        tg->m_flat = lt_new_tensor_1d(tg->ctx, LT_TYPE_F32, tg->n_flat);
        tg->v_flat = lt_new_tensor_1d(tg->ctx, LT_TYPE_F32, tg->n_flat);
    }
    if (!tg->w_flat || !tg->acc_flat || (adamw && (!tg->m_flat || !tg->v_flat)))
        return lt_fail(LT_ERR_NOMEM, "out of memory for the optimizer state");
    lt_set_name(tg->w_flat, "trainable tensors (flat)");
    lt_set_name(tg->acc_flat, "grad accumulators (flat)");
    if (adamw) {
        lt_set_name(tg->m_flat, "adamw m (flat)");
        lt_set_name(tg->v_flat, "adamw v (flat)");
    }
    return LT_OK;
}

/* acc += grad, written over acc (the result is a view of it). A gradient that is one
 * product (a weight read by one MUL_MAT: its rule's fresh product, which nothing else reads),
 * or one scaled product, becomes MUL_MAT_ACC into acc, the sum (and the scale) in the
 * product's epilogue; any other is added by an ACC over the whole of acc. Before, an ADD
 * made the sum and a CPY stored it: five passes over every gradient a step (~11 ms of a 16 x
 * 512 full fine-tune's 506 over two steps of Qwen3.5-0.8B on an H100), where the product
 * writes it once and the ACC takes three. */
static struct lt_tensor *accumulate_into(struct lt_ctx *ctx, struct lt_tensor *acc,
                                         struct lt_tensor *grad)
{
    if (grad->op == LT_OP_MUL_MAT && !grad->view_src && lt_same_shape(grad, acc))
        return lt_mul_mat_acc(ctx, grad->src[0], grad->src[1], acc);
    /* a scaled product (a LoRA adapter's A, scaled as the graph rounds it: SCALE's rule
     * scales A's gradient): the scale goes into the product's epilogue with the sum */
    const struct lt_tensor *p = grad->op == LT_OP_SCALE ? grad->src[0] : NULL;
    if (p && p->op == LT_OP_MUL_MAT && p->type == LT_TYPE_F32 && !p->view_src &&
        lt_same_shape(p, acc) && lt_is_contiguous(p))
        return lt_mul_mat_acc_scaled(ctx, p->src[0], p->src[1], acc, lt_get_param_f32(grad, 0));
    return lt_acc_inplace(ctx, acc, grad, acc->nb[1], acc->nb[2], acc->nb[3], 0);
}

static lt_status build_accumulators(struct lt_train_graph *tg)
{
    for (int i = 0; i < tg->n_params; i++) {
        struct lt_tensor *p = tg->params[i];
        if (tg->offset[i] < 0)
            continue;
        const size_t es = sizeof(float);
        struct lt_tensor *acc =
            lt_view_4d(tg->ctx, tg->acc_flat, p->ne[0], p->ne[1], p->ne[2], p->ne[3],
                       (size_t)p->ne[0] * es, (size_t)(p->ne[0] * p->ne[1]) * es,
                       (size_t)(p->ne[0] * p->ne[1] * p->ne[2]) * es, (size_t)tg->offset[i] * es);
        if (!acc)
            return lt_fail(LT_ERR_NOMEM, "cannot view the accumulator of '%s': %s", p->name,
                           lt_last_error());
        lt_format_name(acc, "grad accumulator for %s", p->name);
        struct lt_tensor *store = accumulate_into(tg->ctx, acc, p->grad);
        if (!store)
            return lt_fail(LT_ERR_NOMEM, "cannot build the accumulation of '%s': %s", p->name,
                           lt_last_error());
        lt_format_name(store, "accumulate grad for %s", p->name);
        tg->accum[i] = acc;
        tg->stores[i] = store;
    }
    return LT_OK;
}

/* One step node over the flat tensors. */
static lt_status build_steps(struct lt_train_graph *tg)
{
    tg->hp = lt_new_tensor_1d(tg->ctx, LT_TYPE_F32, 8);
    tg->steps = lt_graph_new(tg->ctx, 64);
    if (!tg->hp || !tg->steps)
        return LT_ERR_NOMEM;
    lt_set_name(tg->hp, "optimizer hyper-parameters");
    if (tg->n_flat == 0)
        return LT_OK;
    struct lt_tensor *step =
        tg->p.optimizer == LT_OPTIMIZER_SGD
            ? lt_sgd_step(tg->ctx, tg->w_flat, tg->acc_flat, tg->hp)
            : lt_adamw_step(tg->ctx, tg->w_flat, tg->acc_flat, tg->m_flat, tg->v_flat, tg->hp);
    if (!step)
        return lt_fail(LT_ERR_INVALID, "cannot build the optimizer step: %s", lt_last_error());
    lt_set_name(step, "optimizer step (flat)");
    return lt_graph_build(tg->steps, step);
}

/* Bytes on backend 0 the two graphs need; accumulators are counted once. */
static lt_status measure(struct lt_train_graph *tg, size_t *device_bytes)
{
    struct lt_sched_memory m1, m2;
    lt_status st = lt_sched_measure(tg->grads_sched, tg->grads, &m1);
    if (st == LT_OK)
        st = lt_sched_measure(tg->steps_sched, tg->steps, &m2);
    if (st != LT_OK)
        return st;
    size_t shared = 0;
    for (int i = 0; i < tg->steps->n_leafs; i++) {
        struct lt_tensor *t = tg->steps->leafs[i];
        if (!t->data && lt_graph_contains(tg->grads, t))
            shared += lt_sched_leaf_bytes(t);
    }
    /* the gradient graph was planned with the trainable tensors where the caller keeps
     * them; a device would read a copy of each host one, but they will live in w_flat
     * (counted in the optimizer graph) by then */
    size_t home_copies = 0;
    if (!tg->backends[0]->is_host)
        for (int i = 0; i < tg->n_params; i++) {
            const struct lt_tensor *p = tg->params[i];
            if (tg->offset[i] >= 0 && (!p->buffer || p->buffer->backend->is_host))
                home_copies += lt_sched_leaf_bytes(p);
        }
    tg->estimate = m1.total + m2.total - shared;
    tg->estimate = tg->estimate > home_copies ? tg->estimate - home_copies : 0;
    /* one scratch serves both graphs: the larger of the two, beyond what is held now */
    const size_t scratch = m1.scratch[0] > m2.scratch[0] ? m1.scratch[0] : m2.scratch[0];
    tg->est_scratch = scratch > m1.scratch_held[0] ? scratch - m1.scratch_held[0] : 0;
    tg->estimate += tg->est_scratch;
    *device_bytes = m1.compute[0] + m1.leafs[0] + m2.compute[0] + m2.leafs[0];
    *device_bytes = *device_bytes > shared ? *device_bytes - shared : 0;
    *device_bytes += tg->est_scratch;
    return LT_OK;
}

static int cmp_first_use_desc(const void *x, const void *y)
{
    const int *a = x, *b = y; /* {first forward reader, parameter} */
    return a[0] != b[0] ? (a[0] < b[0] ? 1 : -1) : (a[1] > b[1]) - (a[1] < b[1]);
}

/* The gradient graph, built from its outputs once autodiff, checkpointing and the
 * accumulations have made every node: the loss first, then the accumulations in the reverse
 * order of the trainable tensors' first forward readers, so that each tensor's gradient is
 * made, and added into its accumulator, as soon as the backward reaches it. A graph is built
 * depth first, sources before users; built from the loss, the gradients and the
 * accumulations in the order of collect_params, every gradient but the first came after the
 * whole backward, so each weight gradient's product, the activations and output gradients
 * it reads, and the gradient itself lived to the end of the step. That is what activation
 * checkpointing could not free: Qwen3.5-0.8B's shape at 16 x 512 tokens planned 46,494 MiB
 * of intermediates on the CPU with recomputation and 56,522 without. tg->grads is the graph
 * autodiff built (and checkpointing rewrote); its first n_forward nodes are the forward. */
static lt_status build_grads_graph(struct lt_train_graph *tg)
{
    struct lt_graph *old = tg->grads;
    int(*order)[2] = malloc(sizeof(*order) * (size_t)(tg->n_params + 1));
    struct lt_ptrmap index = {0};
    if (!order || !lt_ptrmap_init(&index, (size_t)tg->n_params + 16)) {
        free(order);
        return lt_fail(LT_ERR_NOMEM, "out of memory ordering the backward");
    }
    for (int i = 0; i < tg->n_params; i++) {
        lt_ptrmap_set(&index, tg->params[i], i);
        order[i][0] = -1;
        order[i][1] = i;
    }
    for (int j = 0; j < tg->n_forward && j < old->n_nodes; j++)
        for (int k = 0; k < LT_MAX_SRC; k++) {
            struct lt_tensor *src = old->nodes[j]->src[k];
            const int i = src ? lt_ptrmap_get(&index, lt_storage_root(src), -1) : -1;
            if (i >= 0 && order[i][0] < 0)
                order[i][0] = j;
        }
    lt_ptrmap_free(&index);
    qsort(order, (size_t)tg->n_params, sizeof(*order), cmp_first_use_desc);
    struct lt_graph *g = lt_graph_new(tg->ctx, TRAIN_GRAPH_CAP);
    lt_status st = g ? lt_graph_build(g, tg->loss) : LT_ERR_NOMEM;
    const int n_forward = g ? g->n_nodes : 0;
    for (int k = 0; st == LT_OK && k < tg->n_params; k++) {
        const int i = order[k][1];
        if (tg->stores[i]) /* every tensor with a gradient has its accumulation */
            st = lt_graph_build(g, tg->stores[i]);
    }
    free(order);
    if (st != LT_OK)
        return st;
    tg->grads = g;
    tg->n_forward = n_forward;
    return LT_OK;
}

/* The nodes of g's forward part, which ends with the loss (g was built from it alone). Not
 * the count before autodiff: a loss folded into its backward node (LINEAR_CE's) has that
 * node, and what it reads, before it now. */
static int forward_count(const struct lt_graph *g, const struct lt_tensor *loss)
{
    for (int i = g->n_nodes - 1; i >= 0; i--)
        if (g->nodes[i] == loss)
            return i + 1;
    return g->n_nodes;
}

int lt_train_graph_n_recomputed(const struct lt_train_graph *tg) { return tg->n_recomputed; }

lt_status lt_train_graph_new(struct lt_ctx *ctx, struct lt_tensor *loss,
                             const struct lt_train_graph_params *params, struct lt_train_graph **out,
                             struct lt_refusal *refusal)
{
    struct lt_refusal local_refusal;
    if (!refusal)
        refusal = &local_refusal;
    memset(refusal, 0, sizeof(*refusal));
    *out = NULL;
    if (!lt_ctx_no_alloc(ctx))
        return lt_fail(LT_ERR_INVALID, "build training graphs in a no_alloc context");
    if (params->n_backends < 1 || params->n_backends > LT_SCHED_MAX_BACKENDS)
        return lt_fail(LT_ERR_INVALID, "a training graph needs 1 to %d backends",
                       LT_SCHED_MAX_BACKENDS);
    struct lt_train_graph *tg = calloc(1, sizeof(*tg));
    if (!tg)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a training graph");
    lt_status st;
    tg->ctx = ctx;
    tg->p = *params;
    for (int i = 0; i < params->n_backends; i++)
        tg->backends[i] = params->backends[i];
    tg->p.backends = tg->backends;
    if (tg->p.beta1 == 0)
        tg->p.beta1 = 0.9f;
    if (tg->p.beta2 == 0)
        tg->p.beta2 = 0.999f;
    if (tg->p.eps == 0)
        tg->p.eps = 1e-8f;
    tg->loss = loss;
    loss->flags |= LT_FLAG_LOSS;
    tg->grads = lt_graph_new(ctx, TRAIN_GRAPH_CAP);
    if (!tg->grads) {
        st = LT_ERR_NOMEM;
        goto out_free;
    }
    st = lt_graph_build(tg->grads, loss);
    if (st != LT_OK)
        goto out_free;
    tg->n_forward = tg->grads->n_nodes;
    st = collect_params(tg);
    if (st != LT_OK)
        goto out_free;
    st = lt_autodiff_build(ctx, tg->grads, loss, 1.0f, refusal);
    if (st != LT_OK)
        goto out_free;
    tg->n_forward = forward_count(tg->grads, loss);
    if (params->n_remat_bounds >= 2) {
        st = lt_remat_rewrite(ctx, tg->grads, tg->n_forward, params->remat_bounds,
                              params->n_remat_bounds, params->remat_selective, &tg->n_recomputed);
        if (st != LT_OK)
            goto out_free;
    }
    st = build_flat(tg);
    if (st == LT_OK)
        st = build_accumulators(tg);
    if (st == LT_OK)
        st = build_grads_graph(tg);
    if (st == LT_OK)
        st = build_steps(tg);
    if (st != LT_OK)
        goto out_free;

    /* admission: placement of every node, then memory */
    tg->grads_sched = lt_sched_new(tg->backends, params->n_backends);
    tg->steps_sched = lt_sched_new(tg->backends, params->n_backends);
    if (!tg->grads_sched || !tg->steps_sched) {
        st = LT_ERR_NOMEM;
        goto out_free;
    }
    st = lt_sched_place(tg->grads_sched, tg->grads, params->device_only, refusal);
    if (st == LT_OK)
        st = lt_sched_place(tg->steps_sched, tg->steps, params->device_only, refusal);
    if (st != LT_OK) {
        st = refuse_from(refusal, st);
        goto out_free;
    }
    size_t device_bytes;
    st = measure(tg, &device_bytes);
    if (st != LT_OK)
        goto out_free;
    /* a caller's budget may lower what the device has free (less the reserve), never raise
     * it: a job that does not fit the device is refused whatever it asked for */
    size_t free_bytes = 0, total_bytes = 0;
    st = lt_backend_memory(tg->backends[0], &free_bytes, &total_bytes);
    if (st != LT_OK)
        goto out_free;
    /* a device's peak is what it holds already (the context, the weights, a server's
     * state, other processes) plus what the job adds; a host's is the job's alone */
    if (!tg->backends[0]->is_host && total_bytes > free_bytes) {
        tg->est_in_use = total_bytes - free_bytes;
        tg->estimate += tg->est_in_use;
    }
    tg->budget = free_bytes > params->serving_reserve ? free_bytes - params->serving_reserve : 0;
    if (params->memory_budget > 0 && params->memory_budget < tg->budget)
        tg->budget = params->memory_budget;
    if (device_bytes > tg->budget) {
        memset(refusal, 0, sizeof(*refusal));
        refusal->kind = LT_REFUSAL_MEMORY;
        refusal->need_bytes = device_bytes;
        refusal->budget_bytes = tg->budget;
        snprintf(refusal->backend, sizeof(refusal->backend), "%s", tg->backends[0]->name);
        snprintf(refusal->reason, sizeof(refusal->reason), "estimated peak over budget");
        lt_refusal_format(refusal);
        st = lt_fail(LT_ERR_REFUSED, "%s", refusal->sentence);
        goto out_free;
    }
    *out = tg;
    return LT_OK;
out_free:
    lt_train_graph_free(tg);
    return st;
}

/* Points the trainable tensors back at their own storage, with the values w_flat holds.
 * The first failure is returned; every tensor is pointed home regardless. */
static lt_status unbind_params(struct lt_train_graph *tg)
{
    lt_status first = LT_OK;
    if (!tg->bound)
        return LT_OK;
    for (int i = 0; i < tg->n_params; i++) {
        struct lt_tensor *p = tg->params[i];
        if (tg->offset[i] < 0)
            continue;
        size_t n = lt_nbytes(p);
        void *tmp = malloc(n ? n : 1);
        lt_status st = tmp ? lt_tensor_get(p, tmp, 0, n)
                           : lt_fail(LT_ERR_NOMEM, "out of host memory for '%s'", p->name);
        p->data = tg->home_data[i];
        p->buffer = tg->home_buffer[i];
        if (st == LT_OK)
            st = lt_tensor_set(p, tmp, 0, n);
        free(tmp);
        if (first == LT_OK && st != LT_OK)
            first = st;
    }
    tg->bound = false;
    return first;
}

/* Copies each trainable tensor into its place in w_flat (allocated by now) and points it
 * there, so the gradient graph reads what the step updates. */
static lt_status bind_params(struct lt_train_graph *tg)
{
    lt_status st = LT_OK;
    for (int i = 0; i < tg->n_params && st == LT_OK; i++) {
        struct lt_tensor *p = tg->params[i];
        if (tg->offset[i] < 0)
            continue;
        size_t n = lt_nbytes(p), at = (size_t)tg->offset[i] * sizeof(float);
        void *tmp = malloc(n ? n : 1);
        st = tmp ? lt_tensor_get(p, tmp, 0, n)
                 : lt_fail(LT_ERR_NOMEM, "out of host memory for '%s'", p->name);
        if (st == LT_OK)
            st = lt_tensor_set(tg->w_flat, tmp, at, n);
        free(tmp);
        if (st != LT_OK)
            break;
        tg->home_data[i] = p->data;
        tg->home_buffer[i] = p->buffer;
        p->data = (char *)tg->w_flat->data + at;
        p->buffer = tg->w_flat->buffer;
        tg->bound = true;
    }
    return st;
}

void lt_train_graph_free(struct lt_train_graph *tg)
{
    if (!tg)
        return;
    (void)unbind_params(tg); /* best effort: the caller keeps what could be copied back */
    lt_sched_free(tg->grads_sched);
    lt_sched_free(tg->steps_sched);
    free(tg->params);
    free(tg->accum);
    free(tg->stores);
    free(tg->offset);
    free(tg->home_data);
    free(tg->home_buffer);
    free(tg);
}

size_t lt_train_graph_estimate(const struct lt_train_graph *tg) { return tg->estimate; }
void lt_train_graph_estimate_parts(const struct lt_train_graph *tg, size_t *scratch, size_t *in_use)
{
    *scratch = tg->est_scratch;
    *in_use = tg->est_in_use;
}
size_t lt_train_graph_budget(const struct lt_train_graph *tg) { return tg->budget; }
int lt_train_graph_n_fallback(const struct lt_train_graph *tg)
{
    return lt_sched_n_fallback(tg->grads_sched) + lt_sched_n_fallback(tg->steps_sched);
}

struct lt_tensor *lt_train_graph_fallback_node(const struct lt_train_graph *tg, int i)
{
    int n1 = lt_sched_n_fallback(tg->grads_sched);
    return i < n1 ? lt_sched_fallback_node(tg->grads_sched, i)
                  : lt_sched_fallback_node(tg->steps_sched, i - n1);
}

int lt_train_graph_n_params(const struct lt_train_graph *tg) { return tg->n_params; }
struct lt_tensor *lt_train_graph_param(const struct lt_train_graph *tg, int i) { return tg->params[i]; }

void lt_train_graph_print(const struct lt_train_graph *tg, FILE *f)
{
    fprintf(f, "gradient graph: %d nodes (%d forward); ", tg->grads->n_nodes, tg->n_forward);
    lt_sched_print(tg->grads_sched, f);
    fprintf(f, "optimizer graph: %d nodes; ", tg->steps->n_nodes);
    lt_sched_print(tg->steps_sched, f);
    fprintf(f,
            "trainable tensors: %d; memory estimate %.2f MiB (of which kernels' scratch %.2f, "
            "in use before the job %.2f; budget %.2f MiB)\n",
            tg->n_params, (double)tg->estimate / (1 << 20), (double)tg->est_scratch / (1 << 20),
            (double)tg->est_in_use / (1 << 20), (double)tg->budget / (1 << 20));
}

static lt_status zero_tensor(struct lt_tensor *t)
{
    if (!t)
        return LT_OK;
    size_t n = lt_nbytes(t), chunk = n < ((size_t)16 << 20) ? n : (size_t)16 << 20;
    void *z = calloc(1, chunk ? chunk : 1);
    if (!z)
        return lt_fail(LT_ERR_NOMEM, "out of host memory");
    lt_status st = LT_OK;
    for (size_t at = 0; at < n && st == LT_OK; at += chunk)
        st = lt_tensor_set(t, z, at, n - at < chunk ? n - at : chunk);
    free(z);
    return st;
}

/* The optimizer graph first: it holds the flat tensors, which the trainable tensors then
 * move into before the gradient graph binds its views of them. */
lt_status lt_train_graph_alloc(struct lt_train_graph *tg)
{
    if (tg->bound)
        return lt_fail(LT_ERR_INVALID, "the training graph is allocated already");
    lt_status st = lt_sched_alloc(tg->steps_sched, tg->steps);
    if (st == LT_OK)
        st = zero_tensor(tg->w_flat); /* the gaps between tensors stay zero */
    if (st == LT_OK)
        st = zero_tensor(tg->acc_flat);
    if (st == LT_OK)
        st = zero_tensor(tg->m_flat);
    if (st == LT_OK)
        st = zero_tensor(tg->v_flat);
    if (st == LT_OK)
        st = bind_params(tg);
    if (st == LT_OK)
        st = lt_sched_alloc(tg->grads_sched, tg->grads);
    if (st != LT_OK) {
        (void)unbind_params(tg);
        lt_sched_release(tg->grads_sched);
        lt_sched_release(tg->steps_sched);
    }
    tg->n_accumulated = 0;
    return st;
}

size_t lt_train_graph_allocated(const struct lt_train_graph *tg)
{
    return lt_sched_allocated(tg->grads_sched) + lt_sched_allocated(tg->steps_sched);
}

static lt_status read_loss(struct lt_train_graph *tg, float *loss_out)
{
    if (!loss_out)
        return LT_OK;
    return lt_tensor_get(tg->loss, loss_out, 0, sizeof(float));
}

lt_status lt_train_graph_accumulate(struct lt_train_graph *tg, float *loss_out)
{
    lt_status st = lt_sched_compute(tg->grads_sched, tg->grads);
    if (st != LT_OK)
        return st;
    tg->n_accumulated++;
    return read_loss(tg, loss_out);
}

lt_status lt_train_graph_eval(struct lt_train_graph *tg, float *loss_out)
{
    lt_status st = lt_sched_compute_range(tg->grads_sched, tg->grads, 0, tg->n_forward);
    if (st != LT_OK)
        return st;
    return read_loss(tg, loss_out);
}

struct lt_tensor *lt_train_graph_accumulators(const struct lt_train_graph *tg)
{
    return tg->acc_flat;
}

lt_status lt_train_graph_step(struct lt_train_graph *tg, float lr)
{
    if (tg->n_accumulated == 0)
        return lt_fail(LT_ERR_INVALID, "an optimizer step needs at least one accumulated micro-batch");
    return lt_train_graph_step_over(tg, lr, tg->n_accumulated);
}

lt_status lt_train_graph_step_over(struct lt_train_graph *tg, float lr, int n_micro)
{
    if (n_micro < 1)
        return lt_fail(LT_ERR_INVALID, "an optimizer step needs at least one accumulated micro-batch");
    tg->step++;
    if (tg->p.lr_schedule)
        lr = tg->p.lr_schedule(tg->p.user, tg->step, lr);
    float scale = 1.0f / (float)n_micro;
    float hp[8] = {0};
    if (tg->p.optimizer == LT_OPTIMIZER_SGD) {
        hp[0] = lr;
        hp[1] = tg->p.weight_decay;
        hp[2] = scale;
    } else {
        hp[0] = lr;
        hp[1] = tg->p.beta1;
        hp[2] = tg->p.beta2;
        hp[3] = tg->p.eps;
        hp[4] = tg->p.weight_decay;
        hp[5] = 1.0f - powf(tg->p.beta1, (float)tg->step);
        hp[6] = 1.0f - powf(tg->p.beta2, (float)tg->step);
        hp[7] = scale;
    }
    lt_status st = lt_tensor_set(tg->hp, hp, 0, sizeof(hp));
    if (st == LT_OK)
        st = lt_sched_compute(tg->steps_sched, tg->steps);
    tg->n_accumulated = 0;
    return st;
}
