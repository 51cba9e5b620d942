/* op.h (internal): the op table entry and what a CPU kernel is handed.
 *
 * Each op family file in src/ops/ defines the entries of its ops (lt_op_def_<name>) next to
 * their constructors, CPU kernels and backward rules; op_table.c indexes them by enum
 * lt_op. A CPU kernel runs on every thread of the pool at once: thread ith of nth does its
 * share (usually rows ith, ith + nth, ...) and may wait for the others with
 * lt_compute_barrier(). */
#ifndef LATHE_OPS_OP_H
#define LATHE_OPS_OP_H

#include <stdbool.h>
#include <stddef.h>

#include "core/tensor_access.h"
#include "core/threadpool.h"
#include "lathe/tensor.h"

struct lt_compute_params {
    int ith, nth;
    void *wdata; /* scratch shared by all threads of this node, wsize bytes */
    size_t wsize;
    struct lt_barrier *barrier;
};

static inline void lt_compute_barrier(const struct lt_compute_params *p)
{
    if (p->barrier)
        lt_barrier_wait(p->barrier);
}

/* A verdict: can a backend run this node? reason is filled when not. */
#define LT_REASON_MAX 160

struct lt_autodiff; /* src/autodiff: the backward pass being built */

struct lt_op_def {
    const char *name; /* upper case, as in messages: "SQR" */
    int n_src;        /* sources the op reads (optional ones may be NULL) */
    /* Preconditions of the CPU kernel (NULL: every layout and type the constructor
     * accepts). Returns false and writes reason when the kernel cannot run `node`. */
    bool (*cpu_supported)(const struct lt_tensor *node, char *reason, size_t reason_size);
    /* Scratch bytes the CPU kernel needs for `node` on nth threads (NULL: none). */
    size_t (*cpu_work_size)(const struct lt_tensor *node, int nth);
    /* The CPU kernel (NULL for views, which compute nothing). */
    void (*cpu_forward)(const struct lt_compute_params *p, struct lt_tensor *node);
    /* Backward rule: adds the gradients of node's sources given node->grad (NULL: the op
     * has no backward rule; training through it is refused). */
    lt_status (*backward)(struct lt_autodiff *ad, struct lt_tensor *node);
};

const struct lt_op_def *lt_op_def(enum lt_op op);

/* ---- helpers shared by kernels ---- */

/* Split [0, n) into nth nearly equal parts; part ith is [*lo, *hi). */
static inline void lt_split_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi)
{
    int64_t per = (n + nth - 1) / nth;
    *lo = per * ith < n ? per * ith : n;
    *hi = *lo + per < n ? *lo + per : n;
}

/* The node of an op that writes `into` in place (CPY, ACC in place, MUL_MAT_ACC): a view of
 * it with its own strides, made into an `op` node, which the scheduler then treats as writing
 * that storage (a non-view op with a view_src). The caller sets the sources. */
static inline struct lt_tensor *lt_writer_over(struct lt_ctx *ctx, struct lt_tensor *into,
                                               enum lt_op op)
{
    struct lt_tensor *t = lt_view_4d(ctx, into, into->ne[0], into->ne[1], into->ne[2], into->ne[3],
                                     into->nb[1], into->nb[2], into->nb[3], 0);
    if (t) {
        t->nb[0] = into->nb[0];
        t->op = op;
    }
    return t;
}

static inline bool lt_type_is_float(enum lt_type t)
{
    return t == LT_TYPE_F32 || t == LT_TYPE_F16 || t == LT_TYPE_BF16;
}

/* y += a x and y *= a over n floats, unrolled by 8 (element-wise: the unrolling changes no
 * bit), for the recurrent kernels (delta_net.c, gdn_decode.c) */
static inline void lt_vec_axpy(float *restrict y, float a, const float *restrict x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] += a * x[i + l];
    for (; i < n; i++)
        y[i] += a * x[i];
}

static inline void lt_vec_scale(float *y, float a, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] *= a;
    for (; i < n; i++)
        y[i] *= a;
}

/* Floats of scratch for a row of n, rounded up to whole cache lines. */
static inline size_t lt_scratch_floats(int64_t n) { return (size_t)((n + 15) & ~(int64_t)15); }

/* All op definitions, one per family file. */
#define LT_DECLARE_OP(name) extern const struct lt_op_def lt_op_def_##name
LT_DECLARE_OP(none);
LT_DECLARE_OP(view);
LT_DECLARE_OP(reshape);
LT_DECLARE_OP(permute);
LT_DECLARE_OP(transpose);
LT_DECLARE_OP(fill);
LT_DECLARE_OP(cont);
LT_DECLARE_OP(cpy);
LT_DECLARE_OP(concat);
LT_DECLARE_OP(repeat);
LT_DECLARE_OP(get_rows);
LT_DECLARE_OP(set_rows);
LT_DECLARE_OP(mul_mat);
LT_DECLARE_OP(mul_mat_acc);
LT_DECLARE_OP(mul_mat_glu);
LT_DECLARE_OP(mul_mat_add_rms_norm);
LT_DECLARE_OP(rms_norm_mul_mat);
LT_DECLARE_OP(add);
LT_DECLARE_OP(sub);
LT_DECLARE_OP(mul);
LT_DECLARE_OP(div);
LT_DECLARE_OP(scale);
LT_DECLARE_OP(silu);
LT_DECLARE_OP(sigmoid);
LT_DECLARE_OP(softplus);
LT_DECLARE_OP(exp);
LT_DECLARE_OP(log);
LT_DECLARE_OP(sqr);
LT_DECLARE_OP(sqrt);
LT_DECLARE_OP(sin);
LT_DECLARE_OP(cos);
LT_DECLARE_OP(abs);
LT_DECLARE_OP(neg);
LT_DECLARE_OP(relu);
LT_DECLARE_OP(sum_rows);
LT_DECLARE_OP(mean);
LT_DECLARE_OP(sum);
LT_DECLARE_OP(argmax);
LT_DECLARE_OP(rms_norm);
LT_DECLARE_OP(add_rms_norm);
LT_DECLARE_OP(l2_norm);
LT_DECLARE_OP(rope);
LT_DECLARE_OP(rms_norm_rope);
LT_DECLARE_OP(soft_max);
LT_DECLARE_OP(attn_decode);
LT_DECLARE_OP(flash_attn);
LT_DECLARE_OP(flash_attn_back);
LT_DECLARE_OP(swiglu);
LT_DECLARE_OP(ssm_conv);
LT_DECLARE_OP(conv_silu);
LT_DECLARE_OP(delta_net);
LT_DECLARE_OP(gdn_decode);
LT_DECLARE_OP(cross_entropy);
LT_DECLARE_OP(acc);
LT_DECLARE_OP(repeat_back);
LT_DECLARE_OP(get_rows_back);
LT_DECLARE_OP(silu_back);
LT_DECLARE_OP(swiglu_back);
LT_DECLARE_OP(rms_norm_back);
LT_DECLARE_OP(rms_norm_mul_back);
LT_DECLARE_OP(l2_norm_back);
LT_DECLARE_OP(rope_back);
LT_DECLARE_OP(soft_max_back);
LT_DECLARE_OP(ssm_conv_back);
LT_DECLARE_OP(conv_silu_back);
LT_DECLARE_OP(delta_net_back);
LT_DECLARE_OP(cross_entropy_back);
LT_DECLARE_OP(linear_ce);
LT_DECLARE_OP(linear_ce_back);
LT_DECLARE_OP(adamw);
LT_DECLARE_OP(sgd);

#endif
