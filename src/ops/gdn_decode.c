/* gdn_decode.c: GDN_DECODE, one decode token of a Gated DeltaNet layer (Qwen3.5's linear
 * attention) for each of S sequences, from its input projections to its gated norm, as one
 * node: constructor, shape rule, view helpers and the CPU kernel. Inference only: there is
 * no backward rule, so a training graph keeps the unfused ops.
 *
 * It replaces the chain build_delta_layer (src/model/model_graph.c) makes at T = 1: concat
 * of the carried conv inputs with qkv, ssm_conv, silu, the q / k / v views, two l2_norms,
 * sigmoid, add, softplus, mul, delta_net, rms_norm and two muls, a kernel launch each on a
 * device, where decode is launch-bound. It computes the same numbers as that chain, step
 * by step in its order and rounding: the conv is ssm_conv.c's float sum over the taps, the
 * activations are unary.c's formulas, each norm factor is norm.c's (sum in double, rounded
 * to float once), the delta rule is delta_net.c's recurrent step (its vector helpers are
 * repeated here, element-wise, in the same order), and each binary op is one rounded float
 * operation. On the CPU the fused and the unfused graphs therefore agree to the bit in
 * practice (test_ops_recurrent.c holds them to 1e-5).
 *
 * Sources (lt_gdn_decode, ops.h) may have any strides; the result is one contiguous F32
 * tensor: y [S_v H_v, S], then the new conv state [K - 1, C, S], then the new ssm state
 * [S_v, S_k, H_v, S]. The kernel runs in two phases with a barrier between them: threads
 * split the channels for the conv (silu'd outputs into the node's shared scratch [C, S],
 * new conv state into the result), then the (value head, sequence) pairs, each of which
 * l2-normalises its key head's q and k from that scratch (a key head read by H_v / H_k
 * value heads is normalised once by each: cheap, and it saves a phase), runs the delta rule
 * in place in its block of the result's state part, and writes its gated norm.
 *
 * Given seq_ids, the states are the session's caches [.., N] and sequence s's slot is
 * seq_ids[s]: the conv inputs are read from the conv cache's slot and the new conv state
 * written back over them (each channel by the thread that read it, in phase 1), and the
 * delta rule runs in place in the ssm cache's slot, row by row (so its dim 0 must be
 * adjacent; the other strides are free), with the same arithmetic on the same numbers (so
 * the caches end bit for bit where the result's state parts would have). Each (value head,
 * sequence) item owns its slice of the cache, so threads never share one while the ids are
 * distinct (a repeated id is the caller's error). The result then holds y alone. A sequence
 * whose id is outside [0, N) is skipped: zeros for its y, no slot touched. */
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/op.h"

/* the sources, in lt_gdn_decode's argument order */
enum {
    GDN_QKV,
    GDN_Z,
    GDN_BETA,
    GDN_ALPHA,
    GDN_CONV_STATE,
    GDN_SSM_STATE,
    GDN_CONV_W,
    GDN_DT,
    GDN_A,
    GDN_NORM_W,
    GDN_SEQ_IDS, /* NULL, or the cache slot of each sequence */
    GDN_SRC_COUNT
};
static_assert(GDN_SRC_COUNT <= LT_MAX_SRC, "GDN_DECODE's sources fit in a tensor");
static_assert(GDN_CONV_STATE == 4 && GDN_SSM_STATE == 5 && GDN_SEQ_IDS == 10,
              "sched.c's writes_source names these slots by number");

/* op_params: 0 norm_eps (f32), 1 n_k_heads (i32) */
enum { GDN_PARAM_EPS, GDN_PARAM_HK };

/* HF/FLA's l2norm of q and k, as build_delta_layer asks lt_l2_norm for it */
#define GDN_L2_EPS 1e-6f

struct gdn_dims {
    int64_t sk, sv, hk, hv; /* key and value head sizes and counts */
    int64_t c, k, s;        /* conv channels, taps, sequences */
    int64_t n_slot;         /* slots of the caches given seq_ids; else S */
};

static struct gdn_dims gdn_dims_of(const struct lt_tensor *node)
{
    struct gdn_dims d;
    d.sv = node->src[GDN_NORM_W]->ne[0];
    d.hv = node->src[GDN_BETA]->ne[0];
    d.hk = lt_get_param_i32(node, GDN_PARAM_HK);
    d.c = node->src[GDN_QKV]->ne[0];
    d.s = node->src[GDN_QKV]->ne[1];
    d.k = node->src[GDN_CONV_W]->ne[0];
    d.sk = (d.c - d.sv * d.hv) / (2 * d.hk);
    d.n_slot = node->src[GDN_SSM_STATE]->ne[3];
    return d;
}

static bool in_place(const struct lt_tensor *node)
{
    return node->src[GDN_SEQ_IDS] != NULL;
}

/* sequence s's slot in the states, or -1 for an id outside the caches */
static int64_t slot_of(const struct lt_tensor *node, struct gdn_dims d, int64_t s)
{
    if (!in_place(node))
        return s;
    const int64_t id = *(const int32_t *)lt_elem_ptr(node->src[GDN_SEQ_IDS], s, 0, 0, 0);
    return id >= 0 && id < d.n_slot ? id : -1;
}

/* element offsets of the three parts of the result */
static int64_t off_conv(struct gdn_dims d)
{
    return d.sv * d.hv * d.s;
}
static int64_t off_state(struct gdn_dims d)
{
    return off_conv(d) + (d.k - 1) * d.c * d.s;
}

static bool has_shape(const struct lt_tensor *t, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    return t->ne[0] == n0 && t->ne[1] == n1 && t->ne[2] == n2 && t->ne[3] == n3;
}

/* fails naming source `what` and the shape it should have had */
static bool bad_shape(const char *what, const struct lt_tensor *t, const char *want)
{
    lt_fail(LT_ERR_INVALID, "gdn_decode: %s '%s' [%lld, %lld, %lld, %lld] is not %s", what, t->name,
            (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
            want);
    return false;
}

/* The shape rule; writes the problem's sizes. */
static bool gdn_check(struct lt_tensor *const *src, int64_t hk, struct gdn_dims *d)
{
    static const char *const names[GDN_SRC_COUNT] = {"qkv",        "z",         "beta",   "alpha",
                                                     "conv_state", "ssm_state", "conv_w", "dt",
                                                     "a",          "norm_w",    "seq_ids"};
    const bool caches = src[GDN_SEQ_IDS] != NULL;
    for (int i = 0; i < GDN_SRC_COUNT; i++) {
        if (i == GDN_SEQ_IDS && !caches)
            continue;
        if (!src[i]) {
            /* an earlier constructor failed: keep its reason */
            if (!lt_last_error()[0])
                lt_fail(LT_ERR_INVALID, "gdn_decode: %s is NULL", names[i]);
            return false;
        }
        const enum lt_type t = src[i]->type;
        bool ok = i == GDN_CONV_W    ? lt_type_is_float(t)
                  : i == GDN_SEQ_IDS ? t == LT_TYPE_I32
                                     : t == LT_TYPE_F32;
        if (!ok) {
            lt_fail(LT_ERR_INVALID, "gdn_decode: %s '%s' is %s, not %s", names[i], src[i]->name,
                    lt_type_name(t),
                    i == GDN_CONV_W    ? "f32, f16 or bf16"
                    : i == GDN_SEQ_IDS ? "i32"
                                       : "f32");
            return false;
        }
    }
    const struct lt_tensor *qkv = src[GDN_QKV], *beta = src[GDN_BETA], *w = src[GDN_CONV_W],
                           *nw = src[GDN_NORM_W];
    char want[128];
    if (hk < 1 || hk > INT32_MAX) {
        lt_fail(LT_ERR_INVALID, "gdn_decode: n_k_heads %lld is not a positive count",
                (long long)hk);
        return false;
    }
    d->hk = hk;
    d->sv = nw->ne[0];
    if (d->sv < 1 || !has_shape(nw, d->sv, 1, 1, 1))
        return bad_shape("norm_w", nw, "[S_v]");
    d->hv = beta->ne[0];
    d->s = beta->ne[1];
    if (d->hv < 1 || d->s < 1 || !has_shape(beta, d->hv, d->s, 1, 1))
        return bad_shape("beta", beta, "[H_v, S]");
    if (d->hv % hk != 0) {
        lt_fail(LT_ERR_INVALID,
                "gdn_decode: n_k_heads %lld does not divide the %lld value heads of beta '%s'",
                (long long)hk, (long long)d->hv, beta->name);
        return false;
    }
    snprintf(want, sizeof(want), "beta's shape [%lld, %lld]", (long long)d->hv, (long long)d->s);
    if (!has_shape(src[GDN_ALPHA], d->hv, d->s, 1, 1))
        return bad_shape("alpha", src[GDN_ALPHA], want);
    d->c = qkv->ne[0];
    const int64_t value_dim = d->sv * d->hv, key_dim2 = d->c - value_dim;
    if (!has_shape(qkv, d->c, d->s, 1, 1) || key_dim2 < 2 * hk || key_dim2 % (2 * hk) != 0) {
        snprintf(want, sizeof(want),
                 "[2 S_k %lld + S_v %lld * H_v %lld, S = %lld] (q, k then v channels)",
                 (long long)hk, (long long)d->sv, (long long)d->hv, (long long)d->s);
        return bad_shape("qkv", qkv, want);
    }
    d->sk = key_dim2 / (2 * hk);
    snprintf(want, sizeof(want), "[S_v H_v = %lld, S = %lld]", (long long)value_dim,
             (long long)d->s);
    if (!has_shape(src[GDN_Z], value_dim, d->s, 1, 1))
        return bad_shape("z", src[GDN_Z], want);
    d->k = w->ne[0];
    snprintf(want, sizeof(want), "[K >= 2, C = %lld]", (long long)d->c);
    if (d->k < 2 || !has_shape(w, d->k, d->c, 1, 1))
        return bad_shape("conv_w", w, want);
    /* the states: one per sequence, or the caches' N slots */
    const struct lt_tensor *ss = src[GDN_SSM_STATE];
    d->n_slot = caches ? ss->ne[3] : d->s;
    const char *slots = caches ? "N" : "S";
    if (caches) {
        snprintf(want, sizeof(want), "[S = %lld]", (long long)d->s);
        if (!has_shape(src[GDN_SEQ_IDS], d->s, 1, 1, 1))
            return bad_shape("seq_ids", src[GDN_SEQ_IDS], want);
        snprintf(want, sizeof(want), "[S_v = %lld, S_k = %lld, H_v = %lld, N >= 1]",
                 (long long)d->sv, (long long)d->sk, (long long)d->hv);
    } else {
        snprintf(want, sizeof(want), "[S_v = %lld, S_k = %lld, H_v = %lld, S = %lld]",
                 (long long)d->sv, (long long)d->sk, (long long)d->hv, (long long)d->s);
    }
    if (d->n_slot < 1 || !has_shape(ss, d->sv, d->sk, d->hv, d->n_slot))
        return bad_shape("ssm_state", ss, want);
    if (caches && ss->nb[0] != sizeof(float)) {
        lt_fail(LT_ERR_INVALID,
                "gdn_decode: ssm_state '%s', written in place, has elements %zu bytes apart in "
                "dim 0, not adjacent",
                ss->name, ss->nb[0]);
        return false;
    }
    snprintf(want, sizeof(want), "[K - 1 = %lld, C = %lld, %s = %lld]", (long long)(d->k - 1),
             (long long)d->c, slots, (long long)d->n_slot);
    if (!has_shape(src[GDN_CONV_STATE], d->k - 1, d->c, d->n_slot, 1))
        return bad_shape("conv_state", src[GDN_CONV_STATE], want);
    for (int i = 0; caches && i < 2; i++) {
        const struct lt_tensor *t = src[i ? GDN_SSM_STATE : GDN_CONV_STATE];
        if (lt_shares_memory(t)) {
            lt_fail(LT_ERR_INVALID,
                    "gdn_decode: %s '%s', written in place, has elements that share memory (a "
                    "broadcast or overlapping view)",
                    i ? "ssm_state" : "conv_state", t->name);
            return false;
        }
    }
    snprintf(want, sizeof(want), "[H_v = %lld]", (long long)d->hv);
    if (!has_shape(src[GDN_DT], d->hv, 1, 1, 1))
        return bad_shape("dt", src[GDN_DT], want);
    if (!has_shape(src[GDN_A], d->hv, 1, 1, 1))
        return bad_shape("a", src[GDN_A], want);
    return true;
}

struct lt_tensor *lt_gdn_decode(struct lt_ctx *ctx, struct lt_tensor *qkv, struct lt_tensor *z,
                                struct lt_tensor *beta, struct lt_tensor *alpha,
                                struct lt_tensor *conv_state, struct lt_tensor *ssm_state,
                                struct lt_tensor *conv_w, struct lt_tensor *dt, struct lt_tensor *a,
                                struct lt_tensor *norm_w, int64_t n_k_heads, float norm_eps,
                                struct lt_tensor *seq_ids)
{
    LT_REQUIRE("gdn_decode", qkv, z, beta, alpha, conv_state, ssm_state, conv_w, dt, a, norm_w);
    struct lt_tensor *srcs[GDN_SRC_COUNT] = {qkv,    z,  beta, alpha,  conv_state, ssm_state,
                                             conv_w, dt, a,    norm_w, seq_ids};
    struct gdn_dims d;
    if (!gdn_check(srcs, n_k_heads, &d))
        return NULL;
    if (!(norm_eps >= 0.0f)) {
        lt_fail(LT_ERR_INVALID, "gdn_decode of '%s': norm_eps %g is not >= 0", qkv->name,
                (double)norm_eps);
        return NULL;
    }
    /* given the caches, the new states go into them, not into the result */
    int64_t n = seq_ids ? off_conv(d) : off_state(d) + d.sv * d.sk * d.hv * d.s;
    struct lt_tensor *r =
        lt_new_op_tensor(ctx, LT_OP_GDN_DECODE, LT_TYPE_F32, 1, &n, srcs, GDN_SRC_COUNT);
    if (!r)
        return NULL;
    lt_set_param_f32(r, GDN_PARAM_EPS, norm_eps);
    lt_set_param_i32(r, GDN_PARAM_HK, (int32_t)n_k_heads);
    lt_format_name(r, "gdn_decode(%s)", qkv->name);
    return r;
}

static bool is_gdn(const struct lt_tensor *r, const char *what)
{
    if (r && r->op == LT_OP_GDN_DECODE)
        return true;
    lt_fail(LT_ERR_INVALID, "%s: '%s' is %s, not GDN_DECODE", what, r ? r->name : "(null)",
            r ? lt_op_name(r->op) : "nothing");
    return false;
}

struct lt_tensor *lt_gdn_decode_output(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("gdn_decode_output", r);
    if (!is_gdn(r, "gdn_decode_output"))
        return NULL;
    struct gdn_dims d = gdn_dims_of(r);
    struct lt_tensor *y =
        lt_view_2d(ctx, r, d.sv * d.hv, d.s, sizeof(float) * (size_t)(d.sv * d.hv), 0);
    if (y)
        lt_format_name(y, "%.50s out", r->name);
    return y;
}

struct lt_tensor *lt_gdn_decode_conv(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("gdn_decode_conv", r);
    if (!is_gdn(r, "gdn_decode_conv"))
        return NULL;
    if (in_place(r)) {
        lt_fail(LT_ERR_INVALID,
                "gdn_decode_conv of '%s': its new conv state is in the cache '%s', not the result",
                r->name, r->src[GDN_CONV_STATE]->name);
        return NULL;
    }
    struct gdn_dims d = gdn_dims_of(r);
    size_t nb1 = sizeof(float) * (size_t)(d.k - 1);
    struct lt_tensor *t = lt_view_3d(ctx, r, d.k - 1, d.c, d.s, nb1, nb1 * (size_t)d.c,
                                     sizeof(float) * (size_t)off_conv(d));
    if (t)
        lt_format_name(t, "%.50s conv", r->name);
    return t;
}

struct lt_tensor *lt_gdn_decode_state(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("gdn_decode_state", r);
    if (!is_gdn(r, "gdn_decode_state"))
        return NULL;
    if (in_place(r)) {
        lt_fail(LT_ERR_INVALID,
                "gdn_decode_state: '%s' writes its new ssm state into the cache '%s' in place "
                "(it was given seq_ids), and its result has no state part",
                r->name, r->src[GDN_SSM_STATE]->name);
        return NULL;
    }
    struct gdn_dims d = gdn_dims_of(r);
    size_t nb1 = sizeof(float) * (size_t)d.sv, nb2 = nb1 * (size_t)d.sk, nb3 = nb2 * (size_t)d.hv;
    struct lt_tensor *t = lt_view_4d(ctx, r, d.sv, d.sk, d.hv, d.s, nb1, nb2, nb3,
                                     sizeof(float) * (size_t)off_state(d));
    if (t)
        lt_format_name(t, "%.50s state", r->name);
    return t;
}

/* ---- CPU ---- */

/* The node's scratch: the silu'd conv outputs [C, S], shared, then each thread's buffers. */
struct gdn_bufs {
    float *conv;          /* [S][C] */
    float *wrow, *xin;    /* [K]: one channel's taps and inputs */
    float *q, *k;         /* [S_k] */
    float *v, *delta, *o; /* [S_v] */
};

static size_t thread_floats(struct gdn_dims d)
{
    return 2 * lt_scratch_floats(d.k) + 2 * lt_scratch_floats(d.sk) + 3 * lt_scratch_floats(d.sv);
}

static void gdn_layout(struct gdn_bufs *b, float *base, struct gdn_dims d, int ith)
{
    b->conv = base;
    float *p = base + lt_scratch_floats(d.c * d.s) + thread_floats(d) * (size_t)ith;
    b->wrow = p;
    b->xin = b->wrow + lt_scratch_floats(d.k);
    b->q = b->xin + lt_scratch_floats(d.k);
    b->k = b->q + lt_scratch_floats(d.sk);
    b->v = b->k + lt_scratch_floats(d.sk);
    b->delta = b->v + lt_scratch_floats(d.sv);
    b->o = b->delta + lt_scratch_floats(d.sv);
}

static size_t gdn_work_size(const struct lt_tensor *node, int nth)
{
    struct gdn_dims d = gdn_dims_of(node);
    return sizeof(float) * (lt_scratch_floats(d.c * d.s) + thread_floats(d) * (size_t)nth);
}

static float f32_at(const struct lt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return *(const float *)lt_elem_ptr(t, i0, i1, i2, i3);
}

/* norm.c's factor (S + eps)^(-1/2), S = sum(x^2) (/ n when rms), in double, rounded once */
static float norm_factor(const float *x, int64_t n, bool rms, float eps)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    if (rms && n > 0)
        s /= (double)n;
    return (float)(1.0 / sqrt(s + (double)eps));
}

/* y = l2_norm(x) over n, as lt_l2_norm(x, GDN_L2_EPS) */
static void l2_normalize(float *y, const float *x, int64_t n)
{
    const float f = norm_factor(x, n, false, GDN_L2_EPS);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * f;
}

/* Phase 1, channels [c0, c1): conv (ssm_conv.c's sum) and silu into b->conv, and the new
 * conv state (the last K - 1 inputs) into the result, or over the old one in the conv
 * cache's slot; zeros for a skipped sequence's conv output (and nothing written). */
static void conv_phase(struct lt_tensor *node, const struct gdn_bufs *b, struct gdn_dims d,
                       int64_t c0, int64_t c1)
{
    const struct lt_tensor *qkv = node->src[GDN_QKV], *cs = node->src[GDN_CONV_STATE],
                           *w = node->src[GDN_CONV_W];
    float *conv_new = (float *)node->data + off_conv(d);
    for (int64_t c = c0; c < c1; c++) {
        lt_row_to_f32(w, c, 0, 0, b->wrow);
        for (int64_t s = 0; s < d.s; s++) {
            const int64_t slot = slot_of(node, d, s);
            if (slot < 0) { /* only given seq_ids: the result has no conv part */
                b->conv[s * d.c + c] = 0;
                continue;
            }
            for (int64_t t = 0; t < d.k - 1; t++)
                b->xin[t] = f32_at(cs, t, c, slot, 0);
            b->xin[d.k - 1] = f32_at(qkv, c, s, 0, 0);
            float acc = 0;
            for (int64_t t = 0; t < d.k; t++)
                acc += b->wrow[t] * b->xin[t];
            b->conv[s * d.c + c] = acc / (1.0f + expf(-acc));
            if (in_place(node))
                for (int64_t t = 0; t < d.k - 1; t++)
                    *(float *)lt_elem_ptr(cs, t, c, slot, 0) = b->xin[t + 1];
            else
                memcpy(conv_new + (s * d.c + c) * (d.k - 1), b->xin + 1,
                       sizeof(float) * (size_t)(d.k - 1));
        }
    }
}

/* Phase 2, value head h of sequence s: the delta rule (delta_net.c's recurrent_step, in
 * place in the result's state, or in the ssm cache's slot) and the gated norm. */
static void head_phase(struct lt_tensor *node, const struct gdn_bufs *b, struct gdn_dims d,
                       int64_t h, int64_t s)
{
    const struct lt_tensor *z = node->src[GDN_Z], *bt = node->src[GDN_BETA],
                           *al = node->src[GDN_ALPHA], *st = node->src[GDN_SSM_STATE],
                           *dt = node->src[GDN_DT], *ag = node->src[GDN_A],
                           *nw = node->src[GDN_NORM_W];
    const int64_t sk = d.sk, sv = d.sv, hk = h % d.hk, slot = slot_of(node, d, s);
    float *y = (float *)node->data + (s * d.hv + h) * sv;
    if (slot < 0) {
        memset(y, 0, sizeof(float) * (size_t)sv);
        return;
    }
    const float *conv = b->conv + s * d.c;
    l2_normalize(b->q, conv + hk * sk, sk);
    l2_normalize(b->k, conv + d.hk * sk + hk * sk, sk);
    memcpy(b->v, conv + 2 * d.hk * sk + h * sv, sizeof(float) * (size_t)sv);
    const float xb = f32_at(bt, h, s, 0, 0);
    const float beta = 1.0f / (1.0f + expf(-xb));
    const float x = f32_at(al, h, s, 0, 0) + f32_at(dt, h, 0, 0, 0);
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    const float decay = expf(sp * f32_at(ag, h, 0, 0, 0));
    const float scale = 1.0f / sqrtf((float)sk);

    /* row i of the state [S_k][S_v] is rs bytes after row i - 1: the cache's slot (dim 0
     * adjacent, the constructor checked), or the result's state part, filled first */
    char *S;
    size_t rs;
    if (in_place(node)) {
        S = lt_elem_ptr(st, 0, 0, h, slot);
        rs = st->nb[1];
    } else {
        float *part = (float *)node->data + off_state(d) + (s * d.hv + h) * sk * sv;
        S = (char *)part;
        rs = sizeof(float) * (size_t)sv;
        for (int64_t i = 0; i < sk; i++) {
            const float *src = lt_elem_ptr(st, 0, i, h, s);
            if (st->nb[0] == sizeof(float))
                memcpy(part + i * sv, src, sizeof(float) * (size_t)sv);
            else
                for (int64_t j = 0; j < sv; j++)
                    part[i * sv + j] = f32_at(st, j, i, h, s);
        }
    }
    float *delta = b->delta, *o = b->o;
    for (int64_t j = 0; j < sv; j++)
        delta[j] = 0;
    for (int64_t i = 0; i < sk; i++) {
        float *row = (float *)(S + (size_t)i * rs);
        lt_vec_scale(row, decay, sv);
        lt_vec_axpy(delta, b->k[i], row, sv);
    }
    for (int64_t j = 0; j < sv; j++)
        delta[j] = beta * (b->v[j] - delta[j]);
    for (int64_t j = 0; j < sv; j++)
        o[j] = 0;
    for (int64_t i = 0; i < sk; i++) {
        float *row = (float *)(S + (size_t)i * rs);
        lt_vec_axpy(row, b->k[i], delta, sv);
        lt_vec_axpy(o, b->q[i], row, sv);
    }
    lt_vec_scale(o, scale, sv);

    /* rms_norm(o) * norm_w * silu(z), each product rounded as its MUL rounds it */
    const float f = norm_factor(o, sv, true, lt_get_param_f32(node, GDN_PARAM_EPS));
    for (int64_t j = 0; j < sv; j++) {
        const float zj = f32_at(z, h * sv + j, s, 0, 0);
        const float zs = zj / (1.0f + expf(-zj));
        const float on = o[j] * f * f32_at(nw, j, 0, 0, 0);
        y[j] = on * zs;
    }
}

static void gdn_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct gdn_dims d = gdn_dims_of(node);
    struct gdn_bufs b;
    gdn_layout(&b, p->wdata, d, p->ith);
    int64_t c0, c1;
    lt_split_range(d.c, p->ith, p->nth, &c0, &c1);
    conv_phase(node, &b, d, c0, c1);
    lt_compute_barrier(p); /* every channel's conv output is in b.conv */
    for (int64_t item = p->ith; item < d.hv * d.s; item += p->nth)
        head_phase(node, &b, d, item % d.hv, item / d.hv);
}

const struct lt_op_def lt_op_def_gdn_decode = {
    .name = "GDN_DECODE",
    .n_src = GDN_SRC_COUNT,
    .cpu_work_size = gdn_work_size,
    .cpu_forward = gdn_forward,
};
