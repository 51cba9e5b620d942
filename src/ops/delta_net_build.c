/* delta_net_build.c: the constructors of DELTA_NET and DELTA_NET_BACK, their shape rules
 * and the views of their packed results (the algebra, the rule and the CPU kernels are
 * delta_net.c's). DELTA_NET's result packs the output and the new state, [S_v, H_v, T + S_k,
 * B]; DELTA_NET_BACK's is one flat F32 tensor of dq, dk, dv, dg, dbeta and dstate, each
 * contiguous and shaped like its source (enum lt_delta_net_grad). */
#include <stdio.h>

#include "lathe/ops.h"
#include "ops/delta_net_impl.h"
#include "ops/op.h"

static bool dn_shapes_ok(const char *what, struct lt_tensor *const *s)
{
    const struct lt_tensor *q = s[SRC_Q], *k = s[SRC_K], *v = s[SRC_V], *g = s[SRC_G],
                           *beta = s[SRC_BETA], *st = s[SRC_STATE];
    struct dn_dims d = dn_dims_of(q, v);
    bool ok = d.sk > 0 && d.sv > 0 && d.hk > 0 && d.hv % d.hk == 0 && lt_same_shape(q, k) &&
              v->ne[2] == d.nt && v->ne[3] == d.nb;
    ok = ok && g->ne[0] == d.hv && g->ne[1] == d.nt && g->ne[2] == d.nb && g->ne[3] == 1 &&
         lt_same_shape(g, beta);
    ok = ok && st->ne[0] == d.sv && st->ne[1] == d.sk && st->ne[2] == d.hv && st->ne[3] == d.nb;
    if (ok)
        return true;
    char buf[6][64];
    for (int i = 0; i < SRC_COUNT; i++)
        snprintf(buf[i], sizeof(buf[i]), "'%.24s' [%lld, %lld, %lld, %lld]", s[i]->name,
                 (long long)s[i]->ne[0], (long long)s[i]->ne[1], (long long)s[i]->ne[2],
                 (long long)s[i]->ne[3]);
    lt_fail(LT_ERR_INVALID,
            "%s: q %s, k %s, v %s, g %s, beta %s, state %s do not fit (q, k [S_k, H_k, T, B]; "
            "v [S_v, H_v, T, B] with H_k | H_v; g, beta [H_v, T, B]; state [S_v, S_k, H_v, B])",
            what, buf[0], buf[1], buf[2], buf[3], buf[4], buf[5]);
    return false;
}

struct lt_tensor *lt_delta_net(struct lt_ctx *ctx, struct lt_tensor *q, struct lt_tensor *k,
                               struct lt_tensor *v, struct lt_tensor *g, struct lt_tensor *beta,
                               struct lt_tensor *state, float scale)
{
    LT_REQUIRE("delta_net", q, k, v, g, beta, state);
    struct lt_tensor *srcs[SRC_COUNT] = {q, k, v, g, beta, state};
    if (!dn_shapes_ok("delta_net", srcs))
        return NULL;
    struct dn_dims d = dn_dims_of(q, v);
    int64_t ne[4] = {d.sv, d.hv, d.nt + d.sk, d.nb};
    struct lt_tensor *r =
        lt_new_op_tensor(ctx, LT_OP_DELTA_NET, LT_TYPE_F32, 4, ne, srcs, SRC_COUNT);
    if (!r)
        return NULL;
    lt_set_param_f32(r, 0, scale);
    lt_set_param_i32(r, 1, LT_DELTA_NET_PATH_AUTO);
    lt_format_name(r, "delta_net(%s)", v->name);
    return r;
}

void lt_delta_net_set_path(struct lt_tensor *r, enum lt_delta_net_path path)
{
    if (r && (r->op == LT_OP_DELTA_NET || r->op == LT_OP_DELTA_NET_BACK))
        lt_set_param_i32(r, 1, (int32_t)path);
}

void lt_delta_net_set_prec(struct lt_tensor *r, enum lt_delta_net_prec prec)
{
    if (r && (r->op == LT_OP_DELTA_NET || r->op == LT_OP_DELTA_NET_BACK))
        lt_set_param_i32(r, 2, (int32_t)prec);
}

static bool is_op(const struct lt_tensor *r, enum lt_op op, const char *what)
{
    if (r && r->op == op)
        return true;
    lt_fail(LT_ERR_INVALID, "%s: '%s' is %s, not %s", what, r ? r->name : "(null)",
            r ? lt_op_name(r->op) : "nothing", lt_op_name(op));
    return false;
}

struct lt_tensor *lt_delta_net_output(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("delta_net_output", r);
    if (!is_op(r, LT_OP_DELTA_NET, "delta_net_output"))
        return NULL;
    int64_t sv = r->ne[0], hv = r->ne[1], nt = r->src[SRC_Q]->ne[2], nb = r->ne[3];
    struct lt_tensor *o = lt_view_4d(ctx, r, sv, hv, nt, nb, r->nb[1], r->nb[2], r->nb[3], 0);
    if (o)
        lt_format_name(o, "%.50s out", r->name);
    return o;
}

struct lt_tensor *lt_delta_net_state(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("delta_net_state", r);
    if (!is_op(r, LT_OP_DELTA_NET, "delta_net_state"))
        return NULL;
    int64_t sv = r->ne[0], hv = r->ne[1], nt = r->src[SRC_Q]->ne[2], sk = r->src[SRC_Q]->ne[0];
    struct lt_tensor *s = lt_view_4d(ctx, r, sv, sk, hv, r->ne[3], r->nb[2], r->nb[1], r->nb[3],
                                     (size_t)nt * r->nb[2]);
    if (s)
        lt_format_name(s, "%.50s state", r->name);
    return s;
}

struct lt_tensor *lt_delta_net_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *q,
                                    struct lt_tensor *k, struct lt_tensor *v, struct lt_tensor *g,
                                    struct lt_tensor *beta, struct lt_tensor *state, float scale)
{
    LT_REQUIRE("delta_net_back", grad, q, k, v, g, beta, state);
    struct lt_tensor *srcs[1 + SRC_COUNT] = {grad, q, k, v, g, beta, state};
    if (!dn_shapes_ok("delta_net_back", srcs + 1))
        return NULL;
    struct dn_dims d = dn_dims_of(q, v);
    if (grad->ne[0] != d.sv || grad->ne[1] != d.hv ||
        (grad->ne[2] != d.nt + d.sk && grad->ne[2] != d.nt) || grad->ne[3] != d.nb) {
        lt_fail(LT_ERR_INVALID,
                "delta_net_back: gradient '%s' [%lld, %lld, %lld, %lld] is not the shape of "
                "delta_net's result [%lld, %lld, %lld, %lld] (or of its output alone)",
                grad->name, (long long)grad->ne[0], (long long)grad->ne[1], (long long)grad->ne[2],
                (long long)grad->ne[3], (long long)d.sv, (long long)d.hv, (long long)(d.nt + d.sk),
                (long long)d.nb);
        return NULL;
    }
    int64_t n = 0;
    for (int i = 0; i < SRC_COUNT; i++)
        n += lt_nelements(srcs[1 + i]);
    struct lt_tensor *r =
        lt_new_op_tensor(ctx, LT_OP_DELTA_NET_BACK, LT_TYPE_F32, 1, &n, srcs, 1 + SRC_COUNT);
    if (!r)
        return NULL;
    lt_set_param_f32(r, 0, scale);
    lt_set_param_i32(r, 1, LT_DELTA_NET_PATH_AUTO);
    lt_format_name(r, "delta_net_back(%s)", v->name);
    return r;
}

struct lt_tensor *lt_delta_net_back_grad(struct lt_ctx *ctx, struct lt_tensor *r,
                                         enum lt_delta_net_grad which)
{
    LT_REQUIRE("delta_net_back_grad", r);
    if (!is_op(r, LT_OP_DELTA_NET_BACK, "delta_net_back_grad"))
        return NULL;
    if ((int)which < 0 || which >= LT_DELTA_NET_GRAD_COUNT) {
        lt_fail(LT_ERR_INVALID, "delta_net_back_grad: no gradient %d", (int)which);
        return NULL;
    }
    const struct lt_tensor *s = r->src[1 + which];
    size_t nb1 = sizeof(float) * (size_t)s->ne[0], nb2 = nb1 * (size_t)s->ne[1],
           nb3 = nb2 * (size_t)s->ne[2];
    struct lt_tensor *t = lt_view_4d(ctx, r, s->ne[0], s->ne[1], s->ne[2], s->ne[3], nb1, nb2, nb3,
                                     sizeof(float) * (size_t)back_offset(r, which));
    if (t)
        lt_format_name(t, "d %s", s->name);
    return t;
}
