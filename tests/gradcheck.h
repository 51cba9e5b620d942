/* gradcheck.h: finite-difference checks of backward rules, over layouts.
 *
 * A case builds y = f(x_1..x_n) with a callback. Each input is given in a layout:
 * contiguous, transposed (storage [ne1, ne0, ...], viewed transposed), permuted, a slice
 * (a view into a larger tensor) or broadcast-ready as is. The storage leaves of trainable
 * inputs are flagged PARAM, so the gradient also passes the view's own backward rule.
 * loss = sum(y * w) with a fixed random w; autodiff's gradient of every trainable storage
 * leaf is compared with central differences of the loss:
 *     ||analytic - numeric|| / ||numeric|| <= tol.
 * Everything is float32 (h = 1e-3 scaled), so tol ~ 1e-2.
 *
 * By default everything runs on the CPU backend. gc_device_use({CUDA0, CPU}) sends the same
 * cases through the scheduler instead: each node on the first backend that takes it (a
 * fallback is counted, not refused), the inputs' storage in host memory. The scheduler
 * copies a host leaf a device node reads into device memory before every run of device
 * nodes (refresh_copies in sched.c), so an input perturbed on the host between computes is
 * uploaded again each time; the loss and the gradients are read back with lt_tensor_get. */
#ifndef LATHE_TESTS_GRADCHECK_H
#define LATHE_TESTS_GRADCHECK_H

#include <stdint.h>
#include <string.h>

#include "check.h"
#include "lathe/autodiff.h"
#include "lathe/backend.h"
#include "lathe/ops.h"
#include "lathe/sched.h"
#include "ops/op.h"

enum gc_layout {
    GC_CONTIGUOUS = 0,
    GC_TRANSPOSED, /* axes 0 and 1 swapped in storage */
    GC_PERMUTED,   /* axes (0 1 2) stored as (1 2 0) */
    GC_SLICED,     /* a window of a tensor twice as wide in ne0 and one row taller */
    GC_LAYOUT_COUNT
};

static const char *const gc_layout_names[GC_LAYOUT_COUNT] = {"contiguous", "transposed", "permuted",
                                                             "sliced"};

struct gc_input {
    enum lt_type type; /* F32, or I32 for ids (never trainable) */
    int64_t ne[4];
    enum gc_layout layout;
    bool trainable;
    float lo, hi; /* uniform range of values (ids: integers in [lo, hi)) */
};

typedef struct lt_tensor *(*gc_build_fn)(struct lt_ctx *ctx, struct lt_tensor **x, void *user);

static uint64_t gc_rng = 0x1234567;
static float gc_uniform(float lo, float hi)
{
    gc_rng = gc_rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((gc_rng >> 40) / 16777216.0);
}

/* Makes the storage leaf for an input and the view the op sees. */
static struct lt_tensor *gc_make_input(struct lt_ctx *ctx, const struct gc_input *in,
                                       struct lt_tensor **storage)
{
    const int64_t *ne = in->ne;
    struct lt_tensor *s = NULL, *x = NULL;
    switch (in->layout) {
    case GC_CONTIGUOUS: s = x = lt_new_tensor_4d(ctx, in->type, ne[0], ne[1], ne[2], ne[3]); break;
    case GC_TRANSPOSED:
        s = lt_new_tensor_4d(ctx, in->type, ne[1], ne[0], ne[2], ne[3]);
        x = lt_transpose(ctx, s);
        break;
    case GC_PERMUTED:
        s = lt_new_tensor_4d(ctx, in->type, ne[1], ne[2], ne[0], ne[3]);
        x = lt_permute(ctx, s, 1, 2, 0, 3);
        break;
    case GC_SLICED: {
        s = lt_new_tensor_4d(ctx, in->type, ne[0] * 2, ne[1] + 1, ne[2], ne[3]);
        size_t es = lt_type_traits(in->type)->type_size;
        x = lt_view_4d(ctx, s, ne[0], ne[1], ne[2], ne[3], s->nb[1], s->nb[2], s->nb[3],
                       es * (size_t)(ne[0] / 2) + s->nb[1]);
        break;
    }
    default: break;
    }
    int64_t n = lt_nelements(s);
    for (int64_t i = 0; i < n; i++) {
        if (in->type == LT_TYPE_I32)
            ((int32_t *)s->data)[i] = (int32_t)gc_uniform(in->lo, in->hi);
        else
            ((float *)s->data)[i] = gc_uniform(in->lo, in->hi);
    }
    lt_set_name(s, in->layout == GC_CONTIGUOUS ? "x" : "x storage");
    if (x != s)
        lt_set_name(x, "x view");
    if (in->trainable)
        s->flags |= LT_FLAG_PARAM;
    *storage = s;
    return x;
}

/* ---- where the checks run ---- */

#define GC_FALLBACK_KINDS 32

/* Nodes of one op that fell back off backends[0], with the first of its reasons. */
struct gc_fallback_kind {
    enum lt_op op;
    long count;
    char reason[LT_REASON_MAX];
};

/* The backends of the scheduler path (none: the CPU alone), and what the cases run since
 * the last gc_device_reset met there. */
struct gc_device {
    struct lt_backend *backends[LT_SCHED_MAX_BACKENDS];
    int n_backends;
    int n_cases;
    unsigned layouts; /* bit l: an input in layout l */
    double worst;     /* relative error */
    long n_first;     /* nodes placed on backends[0] */
    long n_fallback;  /* nodes placed on a later backend */
    struct gc_fallback_kind fallback[GC_FALLBACK_KINDS];
    int n_fallback_kinds;
};

static struct gc_device gc_device;

/* Runs the following gradchecks through a scheduler over backends (n = 0: the CPU alone). */
static inline void gc_device_use(struct lt_backend *const *backends, int n)
{
    memset(&gc_device, 0, sizeof(gc_device));
    for (int i = 0; i < n && i < LT_SCHED_MAX_BACKENDS; i++)
        gc_device.backends[i] = backends[i];
    gc_device.n_backends = n;
}

/* Clears the totals (the backends stay). */
static inline void gc_device_reset(void)
{
    struct gc_device d = {0};
    memcpy(d.backends, gc_device.backends, sizeof(d.backends));
    d.n_backends = gc_device.n_backends;
    gc_device = d;
}

static inline void gc_device_note_fallback(const struct lt_tensor *node)
{
    struct gc_device *d = &gc_device;
    d->n_fallback++;
    for (int k = 0; k < d->n_fallback_kinds; k++)
        if (d->fallback[k].op == node->op) {
            d->fallback[k].count++;
            return;
        }
    if (d->n_fallback_kinds == GC_FALLBACK_KINDS)
        return;
    struct gc_fallback_kind *f = &d->fallback[d->n_fallback_kinds++];
    f->op = node->op;
    f->count = 1;
    f->reason[0] = '\0';
    lt_backend_supports_op(d->backends[0], node, f->reason, sizeof(f->reason));
}

/* One case's graph, ready to run: on the CPU backend, or placed and allocated by sched. */
struct gc_run {
    struct lt_backend *cpu;
    struct lt_sched *sched;
    struct lt_graph *g;
    struct lt_tensor *loss;
    int n_forward;
};

/* The loss after a run of the whole graph, or (scheduler, forward_only) of its forward
 * part alone. */
static double gc_loss(struct gc_run *r, bool forward_only)
{
    if (!r->sched) {
        CHECK(lt_cpu_graph_compute(r->cpu, r->g) == LT_OK, "%s", lt_last_error());
        return *(float *)r->loss->data;
    }
    lt_status st =
        lt_sched_compute_range(r->sched, r->g, 0, forward_only ? r->n_forward : r->g->n_nodes);
    float loss = NAN;
    if (st == LT_OK)
        st = lt_tensor_get(r->loss, &loss, 0, sizeof(loss));
    CHECK(st == LT_OK, "%s", lt_last_error());
    return loss;
}

/* Places and allocates g on gc_device's backends, counting fallbacks. */
static lt_status gc_run_sched(struct gc_run *r, const char *name)
{
    struct lt_sched *s = lt_sched_new(gc_device.backends, gc_device.n_backends);
    if (!s)
        return LT_ERR_NOMEM;
    r->sched = s;
    lt_status st = lt_sched_place(s, r->g, false, NULL);
    CHECK(st == LT_OK, "%s: placement: %s", name, lt_last_error());
    if (st != LT_OK)
        return st;
    gc_device.n_first += lt_sched_count(s, 0);
    for (int i = 0; i < lt_sched_n_fallback(s); i++)
        gc_device_note_fallback(lt_sched_fallback_node(s, i));
    st = lt_sched_alloc(s, r->g);
    CHECK(st == LT_OK, "%s: allocation: %s", name, lt_last_error());
    return st;
}

/* Reads a storage leaf's gradient into analytic (n floats). */
static bool gc_read_grad(const struct gc_run *r, const struct lt_tensor *grad, float *analytic,
                         int64_t n)
{
    if (!r->sched) {
        lt_tensor_read_f32(grad, analytic);
        return true;
    }
    bool plain = grad->type == LT_TYPE_F32 && lt_is_contiguous(grad) && lt_nelements(grad) == n;
    CHECK(plain, "gradient '%s' is %s %s", grad->name, lt_type_name(grad->type),
          lt_layout_name(grad));
    return plain && lt_tensor_get(grad, analytic, 0, sizeof(float) * (size_t)n) == LT_OK;
}

/* Returns the worst relative error over the trainable inputs (or INFINITY on failure). */
static double gradcheck(const char *name, gc_build_fn build, void *user, const struct gc_input *in,
                        int n_in, double tol)
{
    bool sched = gc_device.n_backends > 0;
    /* with the scheduler, the inputs and w live in host memory (data) and every other
     * tensor gets its storage from the scheduler (ctx) */
    struct lt_ctx *data = lt_ctx_init((struct lt_ctx_params){.mem_size = 16 << 20});
    struct lt_ctx *ctx =
        sched ? lt_ctx_init((struct lt_ctx_params){.mem_size = 16 << 20, .no_alloc = true}) : data;
    struct gc_run run = {.cpu = sched ? NULL : lt_backend_cpu_new(2)};
    struct lt_tensor *x[8], *storage[8];
    double worst = 0;
    for (int i = 0; i < n_in; i++) {
        x[i] = gc_make_input(data, &in[i], &storage[i]);
        gc_device.layouts |= 1u << in[i].layout;
    }
    struct lt_tensor *y = build(ctx, x, user);
    CHECK(y != NULL, "%s: build failed: %s", name, lt_last_error());
    if (!y) {
        worst = INFINITY;
        goto out_free;
    }
    struct lt_tensor *w =
        lt_new_tensor_4d(data, LT_TYPE_F32, y->ne[0], y->ne[1], y->ne[2], y->ne[3]);
    for (int64_t i = 0; i < lt_nelements(w); i++)
        ((float *)w->data)[i] = gc_uniform(-1, 1);
    struct lt_tensor *loss = lt_sum(ctx, lt_mul(ctx, y, w));
    struct lt_graph *g = lt_graph_new(ctx, 4096);
    lt_status st = lt_graph_build(g, loss);
    run.g = g;
    run.loss = loss;
    run.n_forward = g->n_nodes;
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    CHECK(st == LT_OK, "%s: autodiff: %s", name, lt_last_error());
    if (st != LT_OK) {
        worst = INFINITY;
        goto out_free;
    }
    if (sched) {
        /* the loss and the gradients are read after the run: keep their storage */
        loss->flags |= LT_FLAG_LOSS;
        for (int i = 0; i < n_in; i++)
            if (in[i].trainable && storage[i]->grad)
                storage[i]->grad->flags |= LT_FLAG_OUTPUT;
        if (gc_run_sched(&run, name) != LT_OK) {
            worst = INFINITY;
            goto out_free;
        }
    }
    gc_device.n_cases++;
    gc_loss(&run, false);
    /* every gradient is read before the first perturbed run: with the scheduler, a forward
     * run may reuse a gradient's bytes for a forward intermediate */
    float *analytic[8] = {0};
    for (int i = 0; i < n_in; i++) {
        if (!in[i].trainable)
            continue;
        struct lt_tensor *s = storage[i];
        CHECK(s->grad != NULL, "%s: input %d got no gradient", name, i);
        analytic[i] = s->grad ? malloc(sizeof(float) * (size_t)lt_nelements(s)) : NULL;
        if (analytic[i] && !gc_read_grad(&run, s->grad, analytic[i], lt_nelements(s))) {
            free(analytic[i]);
            analytic[i] = NULL;
        }
        if (!analytic[i])
            worst = INFINITY;
    }
    for (int i = 0; i < n_in; i++) {
        if (!analytic[i])
            continue;
        struct lt_tensor *s = storage[i];
        int64_t n = lt_nelements(s);
        /* check up to 48 elements spread over the tensor */
        int64_t stride = n > 48 ? n / 48 : 1;
        double num2 = 0, err2 = 0;
        for (int64_t e = 0; e < n; e += stride) {
            float *p = (float *)s->data + e;
            float orig = *p;
            float h = 1e-3f * (fabsf(orig) > 1 ? fabsf(orig) : 1);
            *p = orig + h;
            double lp = gc_loss(&run, true);
            *p = orig - h;
            double lm = gc_loss(&run, true);
            *p = orig;
            double numeric = (lp - lm) / (2.0 * h);
            num2 += numeric * numeric;
            err2 += (numeric - analytic[i][e]) * (numeric - analytic[i][e]);
        }
        gc_loss(&run, true);
        double rel = sqrt(err2) / (sqrt(num2) > 1e-6 ? sqrt(num2) : 1e-6);
        if (isnan(rel) || rel > worst)
            worst = isnan(rel) ? INFINITY : rel;
        CHECK(rel <= tol, "%s: input %d (%s): gradient off by %.3g (tol %.3g)", name, i,
              gc_layout_names[in[i].layout], rel, tol);
        free(analytic[i]);
    }
out_free:
    if (worst > gc_device.worst)
        gc_device.worst = worst;
    lt_sched_free(run.sched);
    lt_backend_free(run.cpu);
    if (ctx != data)
        lt_ctx_free(ctx);
    lt_ctx_free(data);
    return worst;
}

/* Builds sum(y * w) and its backward pass as gradcheck does and checks each node autodiff
 * added: the CPU accepts it, and nodes of the ops contiguous_only names read only contiguous
 * sources. Returns the number of backward nodes (0 on failure); counts nodes of op `count_op`
 * into *n_counted when given. */
static inline int gc_check_backward_graph(const char *name, gc_build_fn build, void *user,
                                          const struct gc_input *in, int n_in,
                                          bool (*contiguous_only)(enum lt_op op),
                                          enum lt_op count_op, int *n_counted)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
    struct lt_tensor *x[8], *storage[8];
    int n_backward = 0;
    if (n_counted)
        *n_counted = 0;
    for (int i = 0; i < n_in; i++)
        x[i] = gc_make_input(ctx, &in[i], &storage[i]);
    struct lt_tensor *y = build(ctx, x, user);
    CHECK(y != NULL, "%s: build failed: %s", name, lt_last_error());
    if (!y)
        goto out_free_ctx;
    struct lt_tensor *w =
        lt_new_tensor_4d(ctx, LT_TYPE_F32, y->ne[0], y->ne[1], y->ne[2], y->ne[3]);
    struct lt_tensor *loss = lt_sum(ctx, lt_mul(ctx, y, w));
    struct lt_graph *g = lt_graph_new(ctx, 4096);
    lt_status st = lt_graph_build(g, loss);
    int n_forward = g->n_nodes;
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    CHECK(st == LT_OK, "%s: autodiff: %s", name, lt_last_error());
    if (st != LT_OK)
        goto out_free_ctx;
    for (int i = n_forward; i < g->n_nodes; i++) {
        const struct lt_tensor *node = g->nodes[i];
        char reason[LT_REASON_MAX] = "";
        CHECK(lt_cpu_supports_op(node, reason, sizeof(reason)), "%s: the CPU refuses %s '%s': %s",
              name, lt_op_name(node->op), node->name, reason);
        if (n_counted && node->op == count_op)
            (*n_counted)++;
        if (!contiguous_only(node->op))
            continue;
        for (int s = 0; s < LT_MAX_SRC; s++)
            CHECK(!node->src[s] || lt_is_contiguous(node->src[s]),
                  "%s: backward node %s '%s' reads '%s', %s", name, lt_op_name(node->op),
                  node->name, node->src[s]->name, lt_layout_name(node->src[s]));
    }
    n_backward = g->n_nodes - n_forward;
out_free_ctx:
    lt_ctx_free(ctx);
    return n_backward;
}

#endif
