/* test_ops_recurrent.c: SSM_CONV and DELTA_NET (Gated DeltaNet's recurrent ops) and their
 * backward ops, against plain reference loops written here: the conv in float, the delta
 * rule token by token in double; GDN_DECODE (the fused decode step) against the unfused
 * chain of ops it replaces, and on the session's caches (read at sequence ids, the ssm
 * cache written in place) against itself on the gathered states, bit for bit. The chunked path is
 * held to the recurrent one (and to the reference) over lengths around the chunk size of 64;
 * backward ops to central differences of the double reference (delta rule) or of the op itself (the
 * conv is linear); their rules through autodiff over layouts (grad_recurrent_cases.h). */
#include <assert.h>
#include <string.h>

#include "backend/cuda/cuda_verdict.h"
#include "check.h"
#include "cuda_emu.h"
#include "grad_recurrent_cases.h"
#include "lathe/backend.h"
#include "lathe/ops.h"
#include "lathe/sched.h"
#include "model/model_impl.h" /* LT_MB_GATE_RESET */
#include "ops/op.h"

static struct lt_backend *cpu;

/* ---- helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double urand(void) /* [0, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static void fill_rand(float *x, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = frand(lo, hi);
}

static struct lt_ctx *new_ctx(void)
{
    return lt_ctx_init((struct lt_ctx_params){.mem_size = 16u << 20});
}

static struct lt_tensor *tensor_from(struct lt_ctx *ctx, const int64_t ne[4], const float *x)
{
    struct lt_tensor *t = lt_new_tensor_4d(ctx, LT_TYPE_F32, ne[0], ne[1], ne[2], ne[3]);
    if (x)
        memcpy(t->data, x, lt_nbytes(t));
    return t;
}

static struct lt_graph *graph_of(struct lt_ctx *ctx, struct lt_tensor *t)
{
    struct lt_graph *g = lt_graph_new(ctx, 4096);
    CHECK(g && lt_graph_build(g, t) == LT_OK, "%s", lt_last_error());
    return g;
}

static bool compute(struct lt_graph *g)
{
    lt_status st = lt_cpu_graph_compute(cpu, g);
    CHECK(st == LT_OK, "%s", lt_last_error());
    return st == LT_OK;
}

/* largest |a - b| over the largest |b| */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double m = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = d > m || d != d ? d : m;
        s = fabs((double)b[i]) > s ? fabs((double)b[i]) : s;
    }
    return s > 0 ? m / s : m;
}

/* ---- ssm_conv ---- */

/* y[c, t, s] = sum_k w[k, c] x[t + k, c, s] with x dense [L, C, S], w dense [d, C] */
static void conv_ref(const float *x, const float *w, int64_t d, int64_t n_l, int64_t n_c,
                     int64_t n_s, float *y)
{
    int64_t n_t = n_l - d + 1;
    for (int64_t s = 0; s < n_s; s++)
        for (int64_t t = 0; t < n_t; t++)
            for (int64_t c = 0; c < n_c; c++) {
                float acc = 0;
                for (int64_t k = 0; k < d; k++)
                    acc += w[c * d + k] * x[(s * n_c + c) * n_l + t + k];
                y[(s * n_t + t) * n_c + c] = acc;
            }
}

static void test_ssm_conv_case(int64_t d, int64_t n_t, int64_t n_c, int64_t n_s, bool transposed,
                               bool w_f16)
{
    struct lt_ctx *ctx = new_ctx();
    const int64_t n_l = d - 1 + n_t;
    float *x = malloc(sizeof(float) * (size_t)(n_l * n_c * n_s));
    float *w = malloc(sizeof(float) * (size_t)(d * n_c));
    float *y = malloc(sizeof(float) * (size_t)(n_t * n_c * n_s));
    float *got = malloc(sizeof(float) * (size_t)(n_t * n_c * n_s));
    fill_rand(x, n_l * n_c * n_s, -1, 1);
    fill_rand(w, d * n_c, -1, 1);
    struct lt_tensor *sx;
    if (transposed) {
        /* xt [C, L, S] dense, viewed as [L, C, S] */
        struct lt_tensor *xt = lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_l, n_s);
        for (int64_t s = 0; s < n_s; s++)
            for (int64_t t = 0; t < n_l; t++)
                for (int64_t c = 0; c < n_c; c++)
                    lt_set_f32_nd(xt, c, t, s, 0, x[(s * n_c + c) * n_l + t]);
        sx = lt_transpose(ctx, xt);
        CHECK(!lt_is_contiguous(sx));
    } else {
        sx = tensor_from(ctx, (int64_t[]){n_l, n_c, n_s, 1}, x);
    }
    struct lt_tensor *wt = lt_new_tensor_2d(ctx, w_f16 ? LT_TYPE_F16 : LT_TYPE_F32, d, n_c);
    lt_tensor_fill_f32(wt, w);
    if (w_f16)
        for (int64_t i = 0; i < d * n_c; i++)
            w[i] = lt_fp16_to_fp32(lt_fp32_to_fp16(w[i]));
    struct lt_tensor *r = lt_ssm_conv(ctx, sx, wt);
    CHECK(r && r->ne[0] == n_c && r->ne[1] == n_t && r->ne[2] == n_s, "%s", lt_last_error());
    if (r && compute(graph_of(ctx, r))) {
        conv_ref(x, w, d, n_l, n_c, n_s, y);
        lt_tensor_read_f32(r, got);
        double e = rel_err(got, y, n_t * n_c * n_s);
        CHECK(e < 1e-6, "ssm_conv d=%lld T=%lld transposed=%d f16=%d: rel err %g", (long long)d,
              (long long)n_t, transposed, w_f16, e);
    }
    free(x), free(w), free(y), free(got);
    lt_ctx_free(ctx);
}

static void test_ssm_conv(void)
{
    test_ssm_conv_case(4, 6, 5, 2, false, false);
    test_ssm_conv_case(4, 6, 5, 2, true, false);
    test_ssm_conv_case(4, 1, 37, 3, true, false); /* decode */
    test_ssm_conv_case(4, 9, 7, 1, false, true);
    test_ssm_conv_case(1, 3, 4, 2, false, false);

    struct lt_ctx *ctx = new_ctx();
    struct lt_tensor *sx = lt_new_tensor_3d(ctx, LT_TYPE_F32, 3, 5, 2);
    CHECK(lt_ssm_conv(ctx, sx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 5)) == NULL); /* T = 0 */
    CHECK(lt_ssm_conv(ctx, sx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 2, 4)) == NULL); /* channels */
    CHECK(lt_ssm_conv(ctx, sx, lt_new_tensor_2d(ctx, LT_TYPE_I32, 2, 5)) == NULL);
    struct lt_tensor *r = lt_ssm_conv(ctx, sx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 2, 5));
    CHECK(lt_ssm_conv_back(ctx, lt_new_tensor_3d(ctx, LT_TYPE_F32, 5, 3, 2), sx, r->src[1]) ==
          NULL);
    CHECK(lt_ssm_conv_back_sx(ctx, r) == NULL); /* not a SSM_CONV_BACK */
    lt_ctx_free(ctx);
}

/* the loss sum(y * R), R random, differentiated by the op and by central differences of
 * the op itself in float (exact up to rounding: y is linear in sx and in w) */
static void test_ssm_conv_back(bool transposed)
{
    const int64_t d = 4, n_t = 5, n_c = 3, n_s = 2, n_l = d - 1 + n_t;
    struct lt_ctx *ctx = new_ctx();
    struct lt_tensor *base = transposed ? lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_l, n_s)
                                        : lt_new_tensor_3d(ctx, LT_TYPE_F32, n_l, n_c, n_s);
    fill_rand(base->data, n_l * n_c * n_s, -1, 1);
    struct lt_tensor *sx = transposed ? lt_transpose(ctx, base) : base;
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, d, n_c);
    fill_rand(w->data, d * n_c, -1, 1);
    struct lt_tensor *y = lt_ssm_conv(ctx, sx, w);
    struct lt_tensor *gr = lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_t, n_s);
    fill_rand(gr->data, n_c * n_t * n_s, -1, 1);
    struct lt_tensor *back = lt_ssm_conv_back(ctx, gr, sx, w);
    struct lt_tensor *dsx = lt_ssm_conv_back_sx(ctx, back), *dw = lt_ssm_conv_back_w(ctx, back);
    CHECK(dsx && dw && lt_same_shape(dsx, sx) && lt_same_shape(dw, w) && lt_is_contiguous(dsx) &&
          lt_is_contiguous(dw));
    struct lt_graph *gy = graph_of(ctx, y), *gb = graph_of(ctx, back);
    if (!compute(gb))
        goto out_free_ctx;
    const float h = 1e-3f;
    const float *R = gr->data;
    float fd[64], an[64];
    for (int part = 0; part < 2; part++) {
        struct lt_tensor *leaf = part ? w : sx;
        struct lt_tensor *dleaf = part ? dw : dsx;
        int64_t n = lt_nelements(leaf), k = 0;
        for (int64_t i3 = 0; i3 < 1; i3++)
            for (int64_t i2 = 0; i2 < leaf->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < leaf->ne[1]; i1++)
                    for (int64_t i0 = 0; i0 < leaf->ne[0]; i0++, k++) {
                        float x0 = lt_get_f32_nd(leaf, i0, i1, i2, i3);
                        double loss[2];
                        for (int sgn = 0; sgn < 2; sgn++) {
                            lt_set_f32_nd(leaf, i0, i1, i2, i3, x0 + (sgn ? -h : h));
                            compute(gy);
                            loss[sgn] = 0;
                            for (int64_t e = 0; e < n_c * n_t * n_s; e++)
                                loss[sgn] += (double)((float *)y->data)[e] * R[e];
                        }
                        lt_set_f32_nd(leaf, i0, i1, i2, i3, x0);
                        fd[k] = (float)((loss[0] - loss[1]) / (2 * h));
                        an[k] = lt_get_f32_nd(dleaf, i0, i1, i2, i3);
                    }
        double e = rel_err(an, fd, n);
        CHECK(e < 1e-2, "ssm_conv_back d %s (transposed %d): rel err %g", part ? "w" : "sx",
              transposed, e);
    }
out_free_ctx:
    lt_ctx_free(ctx);
}

/* Packed CONV_SILU (positions restarting at each example) against each example alone: the
 * outputs and d x the same (the same terms in the same order), d w the sum of the
 * examples' (in another order); two rows of examples of 5, 1 and 7 steps and of 2 and 11 */
static void test_conv_silu_packed(void)
{
    const int64_t d = 4, n_c = 6, n_t = 13, n_s = 2;
    static const int64_t lens[2][3] = {{5, 1, 7}, {2, 11, 0}};
    struct lt_ctx *ctx = new_ctx();
    struct lt_tensor *x = lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_t, n_s);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, d, n_c);
    struct lt_tensor *gr = lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_t, n_s);
    struct lt_tensor *pos = lt_new_tensor_2d(ctx, LT_TYPE_I32, n_t, n_s);
    fill_rand(x->data, n_c * n_t * n_s, -2, 2);
    fill_rand(w->data, d * n_c, -1, 1);
    fill_rand(gr->data, n_c * n_t * n_s, -1, 1);
    for (int s = 0; s < n_s; s++)
        for (int e = 0, t = 0; e < 3; e++)
            for (int64_t i = 0; i < lens[s][e]; i++, t++)
                ((int32_t *)pos->data)[s * n_t + t] = (int32_t)i;
    struct lt_tensor *y = lt_conv_silu_packed(ctx, x, w, pos);
    struct lt_tensor *back = lt_conv_silu_back(ctx, gr, x, w, pos);
    if (!y || !back || !compute(graph_of(ctx, y)) || !compute(graph_of(ctx, back))) {
        CHECK(false, "packed conv_silu: %s", lt_last_error());
        lt_ctx_free(ctx);
        return;
    }
    struct lt_tensor *dx = lt_conv_silu_back_x(ctx, back), *dw = lt_conv_silu_back_w(ctx, back);
    double dw_sum[4 * 6] = {0}, ey = 0, ex = 0, ew = 0, sw = 0;
    for (int s = 0; s < n_s; s++)
        for (int e = 0, t0 = 0; e < 3 && lens[s][e] > 0; t0 += (int)lens[s][e], e++) {
            const int64_t L = lens[s][e];
            /* the example alone: views of its steps */
            struct lt_tensor *xe = lt_cont(ctx, lt_view_3d(ctx, x, n_c, L, 1, x->nb[1], x->nb[2],
                                                           s * x->nb[2] + t0 * x->nb[1]));
            struct lt_tensor *ge = lt_cont(ctx, lt_view_3d(ctx, gr, n_c, L, 1, gr->nb[1], gr->nb[2],
                                                           s * gr->nb[2] + t0 * gr->nb[1]));
            struct lt_tensor *ye = lt_conv_silu(ctx, xe, w),
                             *be = lt_conv_silu_back(ctx, ge, xe, w, NULL);
            if (!ye || !be || !compute(graph_of(ctx, ye)) || !compute(graph_of(ctx, be))) {
                CHECK(false, "conv_silu of an example: %s", lt_last_error());
                continue;
            }
            struct lt_tensor *dxe = lt_conv_silu_back_x(ctx, be),
                             *dwe = lt_conv_silu_back_w(ctx, be);
            for (int64_t t = 0; t < L; t++)
                for (int64_t c = 0; c < n_c; c++) {
                    ey = fmax(ey, fabs((double)lt_get_f32_nd(y, c, t0 + t, s, 0) -
                                       lt_get_f32_nd(ye, c, t, 0, 0)));
                    ex = fmax(ex, fabs((double)lt_get_f32_nd(dx, c, t0 + t, s, 0) -
                                       lt_get_f32_nd(dxe, c, t, 0, 0)));
                }
            for (int64_t c = 0; c < n_c; c++)
                for (int64_t k = 0; k < d; k++)
                    dw_sum[c * d + k] += lt_get_f32_nd(dwe, k, c, 0, 0);
        }
    for (int64_t c = 0; c < n_c; c++)
        for (int64_t k = 0; k < d; k++) {
            ew = fmax(ew, fabs(lt_get_f32_nd(dw, k, c, 0, 0) - dw_sum[c * d + k]));
            sw = fmax(sw, fabs(dw_sum[c * d + k]));
        }
    CHECK(ey == 0 && ex == 0 && ew <= 1e-6 * sw,
          "packed conv_silu against its examples alone: y %g, d x %g, d w %g (of %g)", ey, ex, ew,
          sw);
    printf("packed conv_silu: each example's outputs and d x as alone, d w their sum (%.1e)\n",
           ew / (sw > 0 ? sw : 1));
    /* positions that are not one a step are refused */
    CHECK(!lt_conv_silu_packed(ctx, x, w, lt_new_tensor_2d(ctx, LT_TYPE_I32, n_t - 1, n_s)) &&
              strstr(lt_last_error(), "positions"),
          "%s", lt_last_error());
    lt_ctx_free(ctx);
}

/* CONV_SILU and its backward against the form a session's layer takes: silu(ssm_conv(
 * concat(zeros, transpose(x)), w)), SILU_BACK and SSM_CONV_BACK, whose sums and roundings
 * they repeat (the same values up to the compiler's contraction of a product and a sum);
 * T below d - 1 included, and the shape checks */
static void test_conv_silu(int64_t n_t)
{
    const int64_t d = 4, n_c = 5, n_s = 3;
    struct lt_ctx *ctx = new_ctx();
    struct lt_tensor *x = lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_t, n_s);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, d, n_c);
    struct lt_tensor *gr = lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_t, n_s);
    fill_rand(x->data, n_c * n_t * n_s, -2, 2);
    fill_rand(w->data, d * n_c, -1, 1);
    fill_rand(gr->data, n_c * n_t * n_s, -1, 1);
    struct lt_tensor *y = lt_conv_silu(ctx, x, w);
    struct lt_tensor *back = lt_conv_silu_back(ctx, gr, x, w, NULL);
    struct lt_tensor *dx = lt_conv_silu_back_x(ctx, back), *dw = lt_conv_silu_back_w(ctx, back);
    CHECK(y && dx && dw && lt_same_shape(y, x) && lt_same_shape(dx, x) && lt_same_shape(dw, w) &&
          lt_is_contiguous(dx) && lt_is_contiguous(dw));
    struct lt_tensor *zero = lt_fill(ctx, lt_new_tensor_3d(ctx, LT_TYPE_F32, d - 1, n_c, n_s), 0);
    struct lt_tensor *sx = lt_concat(ctx, zero, lt_transpose(ctx, x), 0);
    struct lt_tensor *pre = lt_ssm_conv(ctx, sx, w), *yr = lt_silu(ctx, pre);
    struct lt_tensor *br = lt_ssm_conv_back(ctx, lt_silu_back(ctx, gr, pre), sx, w);
    struct lt_tensor *dsx = lt_ssm_conv_back_sx(ctx, br), *dwr = lt_ssm_conv_back_w(ctx, br);
    struct lt_graph *g1 = graph_of(ctx, y), *g2 = graph_of(ctx, back), *g3 = graph_of(ctx, yr),
                    *g4 = graph_of(ctx, br);
    if (!compute(g1) || !compute(g2) || !compute(g3) || !compute(g4))
        goto out_free_ctx;
    double ey = 0, ex = 0, ew = 0, sy = 0, sxm = 0, sw = 0;
    for (int64_t s = 0; s < n_s; s++)
        for (int64_t t = 0; t < n_t; t++)
            for (int64_t c = 0; c < n_c; c++) {
                const float a = lt_get_f32_nd(y, c, t, s, 0), b = lt_get_f32_nd(yr, c, t, s, 0);
                const float u = lt_get_f32_nd(dx, c, t, s, 0),
                            v = lt_get_f32_nd(dsx, d - 1 + t, c, s, 0);
                ey = fmax(ey, fabs((double)a - b)), sy = fmax(sy, fabs((double)b));
                ex = fmax(ex, fabs((double)u - v)), sxm = fmax(sxm, fabs((double)v));
            }
    for (int64_t c = 0; c < n_c; c++)
        for (int64_t k = 0; k < d; k++) {
            const float a = lt_get_f32_nd(dw, k, c, 0, 0), b = lt_get_f32_nd(dwr, k, c, 0, 0);
            ew = fmax(ew, fabs((double)a - b)), sw = fmax(sw, fabs((double)b));
        }
    CHECK(ey <= 1e-6 * sy && ex <= 1e-6 * sxm && ew <= 1e-6 * sw,
          "conv_silu (T %lld) against silu(ssm_conv(concat)): y %g, d x %g, d w %g (of %g, %g, %g)",
          (long long)n_t, ey, ex, ew, sy, sxm, sw);
    /* d x in BF16 (lt_conv_silu_back_as): each element the F32 one rounded once, d w the
     * same bits after it (past a pad where n_c n_t n_s is odd: T 7) */
    struct lt_tensor *bh = lt_conv_silu_back_as(ctx, gr, x, w, NULL, LT_TYPE_BF16);
    struct lt_tensor *dxh = bh ? lt_conv_silu_back_x(ctx, bh) : NULL,
                     *dwh = bh ? lt_conv_silu_back_w(ctx, bh) : NULL;
    CHECK(dxh && dwh && dxh->type == LT_TYPE_BF16 && dwh->type == LT_TYPE_F32 &&
              lt_same_shape(dxh, x) && lt_same_shape(dwh, w),
          "conv_silu_back into bf16: %s", lt_last_error());
    if (dxh && dwh && compute(graph_of(ctx, bh))) {
        int bad = 0;
        for (int64_t s = 0; s < n_s; s++)
            for (int64_t t = 0; t < n_t; t++)
                for (int64_t c = 0; c < n_c; c++)
                    bad += lt_get_f32_nd(dxh, c, t, s, 0) !=
                           lt_bf16_to_fp32(lt_fp32_to_bf16(lt_get_f32_nd(dx, c, t, s, 0)));
        for (int64_t c = 0; c < n_c; c++)
            for (int64_t k = 0; k < d; k++)
                bad += lt_get_f32_nd(dwh, k, c, 0, 0) != lt_get_f32_nd(dw, k, c, 0, 0);
        CHECK(bad == 0, "conv_silu_back into bf16 (T %lld): %d elements differ from the f32 one's",
              (long long)n_t, bad);
    }
    CHECK(lt_conv_silu_back_as(ctx, gr, x, w, NULL, LT_TYPE_F16) == NULL &&
              strstr(lt_last_error(), "f32 or bf16"),
          "%s", lt_last_error());
    /* shape and type checks name what is wrong */
    CHECK(lt_conv_silu(ctx, x, lt_new_tensor_2d(ctx, LT_TYPE_F32, d, n_c + 1)) == NULL);
    CHECK(lt_conv_silu(ctx, x, lt_new_tensor_2d(ctx, LT_TYPE_I32, d, n_c)) == NULL);
    CHECK(lt_conv_silu_back(ctx, lt_new_tensor_3d(ctx, LT_TYPE_F32, n_c, n_t + 1, n_s), x, w,
                            NULL) == NULL);
    CHECK(lt_conv_silu_back_x(ctx, y) == NULL); /* not a CONV_SILU_BACK */
out_free_ctx:
    lt_ctx_free(ctx);
}

/* ---- delta_net: the problem, dense, in the op's contiguous layouts ---- */

struct dn_case {
    int64_t sk, sv, hk, hv, nt, nb;
    float scale;
    double *q, *k; /* [sk, hk, T, B] */
    double *v;     /* [sv, hv, T, B] */
    double *g, *beta; /* [hv, T, B] */
    double *s0;    /* [sv, sk, hv, B] */
};

static int64_t n_qk(const struct dn_case *c) { return c->sk * c->hk * c->nt * c->nb; }
static int64_t n_v(const struct dn_case *c) { return c->sv * c->hv * c->nt * c->nb; }
static int64_t n_g(const struct dn_case *c) { return c->hv * c->nt * c->nb; }
static int64_t n_s(const struct dn_case *c) { return c->sv * c->sk * c->hv * c->nb; }
static int64_t n_packed(const struct dn_case *c) { return c->sv * c->hv * (c->nt + c->sk) * c->nb; }

static void normalize_rows(double *x, int64_t n, int64_t rows)
{
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t i = 0; i < n; i++)
            s += x[r * n + i] * x[r * n + i];
        for (int64_t i = 0; i < n; i++)
            x[r * n + i] /= sqrt(s);
    }
}

static struct dn_case dn_case_new(int64_t sk, int64_t sv, int64_t hk, int64_t hv, int64_t nt,
                                  int64_t nb)
{
    struct dn_case c = {.sk = sk, .sv = sv, .hk = hk, .hv = hv, .nt = nt, .nb = nb,
                        .scale = (float)(1.0 / sqrt((double)sk))};
    c.q = malloc(sizeof(double) * (size_t)n_qk(&c));
    c.k = malloc(sizeof(double) * (size_t)n_qk(&c));
    c.v = malloc(sizeof(double) * (size_t)n_v(&c));
    c.g = malloc(sizeof(double) * (size_t)n_g(&c));
    c.beta = malloc(sizeof(double) * (size_t)n_g(&c));
    c.s0 = malloc(sizeof(double) * (size_t)n_s(&c));
    /* values rounded to float so the op and the reference see the same inputs */
    for (int64_t i = 0; i < n_qk(&c); i++) {
        c.q[i] = frand(-1, 1);
        c.k[i] = frand(-1, 1);
    }
    normalize_rows(c.q, sk, n_qk(&c) / sk);
    normalize_rows(c.k, sk, n_qk(&c) / sk);
    for (int64_t i = 0; i < n_qk(&c); i++) {
        c.q[i] = (float)c.q[i];
        c.k[i] = (float)c.k[i];
    }
    for (int64_t i = 0; i < n_v(&c); i++)
        c.v[i] = frand(-1, 1);
    for (int64_t i = 0; i < n_g(&c); i++) {
        c.g[i] = frand(-2, 0);
        c.beta[i] = frand(0.02f, 0.98f);
    }
    for (int64_t i = 0; i < n_s(&c); i++)
        c.s0[i] = frand(-0.5f, 0.5f);
    return c;
}

static void dn_case_free(struct dn_case *c)
{
    free(c->q), free(c->k), free(c->v), free(c->g), free(c->beta), free(c->s0);
}

/* The delta rule token by token in double, written out as packed [sv, hv, T + sk, B]. */
static void dn_ref(const struct dn_case *c, double *packed)
{
    const int64_t sk = c->sk, sv = c->sv, nt = c->nt, hv = c->hv;
    double *S = malloc(sizeof(double) * (size_t)(sk * sv));
    double *kv = malloc(sizeof(double) * (size_t)sv);
    for (int64_t b = 0; b < c->nb; b++)
        for (int64_t h = 0; h < hv; h++) {
            const int64_t hk = h % c->hk;
            for (int64_t i = 0; i < sk; i++)
                for (int64_t j = 0; j < sv; j++)
                    S[i * sv + j] = c->s0[((b * hv + h) * sk + i) * sv + j];
            for (int64_t t = 0; t < nt; t++) {
                const double *q = c->q + ((b * nt + t) * c->hk + hk) * sk;
                const double *k = c->k + ((b * nt + t) * c->hk + hk) * sk;
                const double *v = c->v + ((b * nt + t) * hv + h) * sv;
                const double a = exp(c->g[(b * nt + t) * hv + h]);
                const double beta = c->beta[(b * nt + t) * hv + h];
                for (int64_t j = 0; j < sv; j++) {
                    kv[j] = 0;
                    for (int64_t i = 0; i < sk; i++) {
                        S[i * sv + j] *= a;
                        kv[j] += S[i * sv + j] * k[i];
                    }
                    double delta = beta * (v[j] - kv[j]);
                    double o = 0;
                    for (int64_t i = 0; i < sk; i++) {
                        S[i * sv + j] += k[i] * delta;
                        o += S[i * sv + j] * q[i];
                    }
                    packed[((b * (nt + sk) + t) * hv + h) * sv + j] = o * c->scale;
                }
            }
            for (int64_t i = 0; i < sk; i++)
                for (int64_t j = 0; j < sv; j++)
                    packed[((b * (nt + sk) + nt + i) * hv + h) * sv + j] = S[i * sv + j];
        }
    free(S), free(kv);
}

static struct lt_tensor *tensor_from_d(struct lt_ctx *ctx, const int64_t ne[4], const double *x)
{
    struct lt_tensor *t = lt_new_tensor_4d(ctx, LT_TYPE_F32, ne[0], ne[1], ne[2], ne[3]);
    for (int64_t i = 0; i < lt_nelements(t); i++)
        ((float *)t->data)[i] = (float)x[i];
    return t;
}

struct dn_inputs {
    struct lt_tensor *q, *k, *v, *g, *beta, *s0;
};

static struct dn_inputs dn_inputs_new(struct lt_ctx *ctx, const struct dn_case *c)
{
    struct dn_inputs in;
    in.q = tensor_from_d(ctx, (int64_t[]){c->sk, c->hk, c->nt, c->nb}, c->q);
    in.k = tensor_from_d(ctx, (int64_t[]){c->sk, c->hk, c->nt, c->nb}, c->k);
    in.v = tensor_from_d(ctx, (int64_t[]){c->sv, c->hv, c->nt, c->nb}, c->v);
    in.g = tensor_from_d(ctx, (int64_t[]){c->hv, c->nt, c->nb, 1}, c->g);
    in.beta = tensor_from_d(ctx, (int64_t[]){c->hv, c->nt, c->nb, 1}, c->beta);
    in.s0 = tensor_from_d(ctx, (int64_t[]){c->sv, c->sk, c->hv, c->nb}, c->s0);
    return in;
}

/* runs DELTA_NET on the path given; returns the packed result (malloc'd) or NULL */
static float *dn_run(const struct dn_case *c, enum lt_delta_net_path path)
{
    struct lt_ctx *ctx = new_ctx();
    struct dn_inputs in = dn_inputs_new(ctx, c);
    struct lt_tensor *r = lt_delta_net(ctx, in.q, in.k, in.v, in.g, in.beta, in.s0, c->scale);
    float *out = NULL;
    CHECK(r != NULL, "%s", lt_last_error());
    if (r) {
        lt_delta_net_set_path(r, path);
        if (compute(graph_of(ctx, r))) {
            out = malloc(lt_nbytes(r));
            memcpy(out, r->data, lt_nbytes(r));
        }
    }
    lt_ctx_free(ctx);
    return out;
}

/* both paths against the double reference */
static void test_delta_net_reference(void)
{
    const int64_t lens[] = {1, 5, 70};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        struct dn_case c = dn_case_new(16, 12, 2, 4, lens[li], 2);
        int64_t n = n_packed(&c);
        double *ref = malloc(sizeof(double) * (size_t)n);
        float *reff = malloc(sizeof(float) * (size_t)n);
        dn_ref(&c, ref);
        for (int64_t i = 0; i < n; i++)
            reff[i] = (float)ref[i];
        for (int path = LT_DELTA_NET_PATH_RECURRENT; path <= LT_DELTA_NET_PATH_CHUNKED; path++) {
            float *got = dn_run(&c, path);
            if (got) {
                double e = rel_err(got, reff, n);
                CHECK(e < 1e-5, "delta_net %s T=%lld vs reference: rel err %g",
                      path == LT_DELTA_NET_PATH_RECURRENT ? "recurrent" : "chunked",
                      (long long)c.nt, e);
                printf("delta_net %-9s T=%-3lld vs double reference: rel err %.2e\n",
                       path == LT_DELTA_NET_PATH_RECURRENT ? "recurrent" : "chunked",
                       (long long)c.nt, e);
            }
            free(got);
        }
        free(ref), free(reff);
        dn_case_free(&c);
    }
}

/* chunked against recurrent around the chunk size, grouped heads, two sequences */
static void test_delta_net_chunked(void)
{
    const int64_t lens[] = {1, 5, 64, 70, 130};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        struct dn_case c = dn_case_new(32, 24, 2, 4, lens[li], 2);
        float *rec = dn_run(&c, LT_DELTA_NET_PATH_RECURRENT);
        float *chk = dn_run(&c, LT_DELTA_NET_PATH_CHUNKED);
        float *aut = dn_run(&c, LT_DELTA_NET_PATH_AUTO);
        if (rec && chk && aut) {
            int64_t n = n_packed(&c);
            double e = rel_err(chk, rec, n);
            CHECK(e < 1e-5, "delta_net chunked vs recurrent T=%lld: rel err %g",
                  (long long)c.nt, e);
            CHECK(memcmp(aut, c.nt > 1 ? chk : rec, sizeof(float) * (size_t)n) == 0,
                  "AUTO takes the other path at T=%lld", (long long)c.nt);
            printf("delta_net chunked vs recurrent T=%-3lld: rel err %.2e\n", (long long)c.nt, e);
        }
        free(rec), free(chk), free(aut);
        dn_case_free(&c);
    }
}

/* q, k, v slices of one fused projection; g and beta slices of another; the state a
 * transposed view: the same numbers as the contiguous run */
static void test_delta_net_strided(void)
{
    const int64_t lens[] = {1, 70};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        struct dn_case c = dn_case_new(16, 8, 2, 4, lens[li], 2);
        const int64_t sk = c.sk, sv = c.sv, hk = c.hk, hv = c.hv, nt = c.nt, nb = c.nb;
        float *dense = dn_run(&c, LT_DELTA_NET_PATH_AUTO);
        struct lt_ctx *ctx = new_ctx();
        const int64_t width = 2 * sk * hk + sv * hv;
        struct lt_tensor *qkv = lt_new_tensor_3d(ctx, LT_TYPE_F32, width, nt, nb);
        struct lt_tensor *gb = lt_new_tensor_3d(ctx, LT_TYPE_F32, 2 * hv, nt, nb);
        struct lt_tensor *st = lt_new_tensor_4d(ctx, LT_TYPE_F32, sk, sv, hv, nb);
        for (int64_t b = 0; b < nb; b++)
            for (int64_t t = 0; t < nt; t++) {
                for (int64_t x = 0; x < sk * hk; x++) {
                    lt_set_f32_nd(qkv, x, t, b, 0, (float)c.q[(b * nt + t) * sk * hk + x]);
                    lt_set_f32_nd(qkv, sk * hk + x, t, b, 0,
                                  (float)c.k[(b * nt + t) * sk * hk + x]);
                }
                for (int64_t x = 0; x < sv * hv; x++)
                    lt_set_f32_nd(qkv, 2 * sk * hk + x, t, b, 0,
                                  (float)c.v[(b * nt + t) * sv * hv + x]);
                for (int64_t h = 0; h < hv; h++) {
                    lt_set_f32_nd(gb, h, t, b, 0, (float)c.g[(b * nt + t) * hv + h]);
                    lt_set_f32_nd(gb, hv + h, t, b, 0, (float)c.beta[(b * nt + t) * hv + h]);
                }
            }
        for (int64_t b = 0; b < nb; b++)
            for (int64_t h = 0; h < hv; h++)
                for (int64_t i = 0; i < sk; i++)
                    for (int64_t j = 0; j < sv; j++)
                        lt_set_f32_nd(st, i, j, h, b, (float)c.s0[((b * hv + h) * sk + i) * sv + j]);
        const size_t f = sizeof(float);
        struct lt_tensor *q = lt_view_4d(ctx, qkv, sk, hk, nt, nb, sk * f, qkv->nb[1], qkv->nb[2], 0);
        struct lt_tensor *k =
            lt_view_4d(ctx, qkv, sk, hk, nt, nb, sk * f, qkv->nb[1], qkv->nb[2], sk * hk * f);
        struct lt_tensor *v = lt_view_4d(ctx, qkv, sv, hv, nt, nb, sv * f, qkv->nb[1], qkv->nb[2],
                                         2 * sk * hk * f);
        struct lt_tensor *g = lt_view_3d(ctx, gb, hv, nt, nb, gb->nb[1], gb->nb[2], 0);
        struct lt_tensor *beta = lt_view_3d(ctx, gb, hv, nt, nb, gb->nb[1], gb->nb[2], hv * f);
        struct lt_tensor *s0 = lt_transpose(ctx, st);
        CHECK(!lt_is_contiguous(q) && !lt_is_contiguous(v) && !lt_is_contiguous(s0));
        struct lt_tensor *r = lt_delta_net(ctx, q, k, v, g, beta, s0, c.scale);
        CHECK(r != NULL, "%s", lt_last_error());
        if (r && dense && compute(graph_of(ctx, r)))
            CHECK(rel_err(r->data, dense, n_packed(&c)) < 1e-6, "strided T=%lld: rel err %g",
                  (long long)nt, rel_err(r->data, dense, n_packed(&c)));
        free(dense);
        lt_ctx_free(ctx);
        dn_case_free(&c);
    }
}

/* one token at a time, each step reading the previous step's state view, against the
 * whole sequence at once (chunked) */
static void test_delta_net_decode(void)
{
    struct dn_case c = dn_case_new(16, 12, 2, 4, 70, 2);
    const int64_t sk = c.sk, sv = c.sv, hv = c.hv, nt = c.nt, nb = c.nb;
    struct lt_ctx *ctx = new_ctx();
    struct dn_inputs in = dn_inputs_new(ctx, &c);
    struct lt_tensor *full = lt_delta_net(ctx, in.q, in.k, in.v, in.g, in.beta, in.s0, c.scale);
    struct lt_tensor *state = in.s0;
    struct lt_tensor **steps = malloc(sizeof(*steps) * (size_t)nt);
    for (int64_t t = 0; t < nt; t++) {
        struct lt_tensor *q = lt_view_4d(ctx, in.q, sk, c.hk, 1, nb, in.q->nb[1], in.q->nb[2],
                                         in.q->nb[3], t * in.q->nb[2]);
        struct lt_tensor *k = lt_view_4d(ctx, in.k, sk, c.hk, 1, nb, in.k->nb[1], in.k->nb[2],
                                         in.k->nb[3], t * in.k->nb[2]);
        struct lt_tensor *v = lt_view_4d(ctx, in.v, sv, hv, 1, nb, in.v->nb[1], in.v->nb[2],
                                         in.v->nb[3], t * in.v->nb[2]);
        struct lt_tensor *g =
            lt_view_3d(ctx, in.g, hv, 1, nb, in.g->nb[1], in.g->nb[2], t * in.g->nb[1]);
        struct lt_tensor *beta =
            lt_view_3d(ctx, in.beta, hv, 1, nb, in.beta->nb[1], in.beta->nb[2], t * in.beta->nb[1]);
        steps[t] = lt_delta_net(ctx, q, k, v, g, beta, state, c.scale);
        state = lt_delta_net_state(ctx, steps[t]);
    }
    struct lt_graph *gr = lt_graph_new(ctx, 4096);
    CHECK(lt_graph_build(gr, full) == LT_OK && lt_graph_build(gr, state) == LT_OK);
    if (compute(gr)) {
        struct lt_tensor *out = lt_delta_net_output(ctx, full);
        struct lt_tensor *fs = lt_delta_net_state(ctx, full);
        double worst = 0;
        float a[64], b[64];
        for (int64_t t = 0; t < nt; t++) {
            struct lt_tensor *o = lt_delta_net_output(ctx, steps[t]);
            for (int64_t bb = 0; bb < nb; bb++)
                for (int64_t h = 0; h < hv; h++) {
                    for (int64_t j = 0; j < sv; j++) {
                        a[j] = lt_get_f32_nd(o, j, h, 0, bb);
                        b[j] = lt_get_f32_nd(out, j, h, t, bb);
                    }
                    double e = rel_err(a, b, sv);
                    worst = e > worst ? e : worst;
                }
        }
        CHECK(worst < 1e-4, "decode outputs: rel err %g", worst);
        float *s1 = malloc(sizeof(float) * (size_t)n_s(&c)), *s2 = malloc(sizeof(float) * (size_t)n_s(&c));
        lt_tensor_read_f32(state, s1);
        lt_tensor_read_f32(fs, s2);
        double es = rel_err(s1, s2, n_s(&c));
        CHECK(es < 1e-5, "decode final state: rel err %g", es);
        printf("delta_net decode x%lld vs whole sequence: outputs %.2e, state %.2e\n",
               (long long)nt, worst, es);
        free(s1), free(s2);
    }
    free(steps);
    lt_ctx_free(ctx);
    dn_case_free(&c);
}

static void test_delta_net_shapes(void)
{
    struct lt_ctx *ctx = new_ctx();
    struct dn_case c = dn_case_new(4, 3, 2, 4, 2, 1);
    struct dn_inputs in = dn_inputs_new(ctx, &c);
    struct lt_tensor *v3 = lt_new_tensor_4d(ctx, LT_TYPE_F32, 3, 3, 2, 1); /* 2 does not divide 3 */
    CHECK(lt_delta_net(ctx, in.q, in.k, v3, in.g, in.beta, in.s0, 1) == NULL);
    CHECK(lt_delta_net(ctx, in.q, in.k, in.v, in.g, in.beta, in.q, 1) == NULL);
    CHECK(lt_delta_net(ctx, in.q, in.k, in.v, in.beta, in.q, in.s0, 1) == NULL);
    struct lt_tensor *r = lt_delta_net(ctx, in.q, in.k, in.v, in.g, in.beta, in.s0, 1);
    CHECK(r && r->ne[0] == 3 && r->ne[1] == 4 && r->ne[2] == 2 + 4 && r->ne[3] == 1);
    struct lt_tensor *o = lt_delta_net_output(ctx, r), *s = lt_delta_net_state(ctx, r);
    CHECK(o && lt_same_shape(o, in.v) && s && lt_same_shape(s, in.s0));
    /* the gradient of the whole result or of the output alone (v's shape); no other */
    struct lt_tensor *g_bad = lt_new_tensor_4d(ctx, LT_TYPE_F32, 3, 4, 2 + 1, 1);
    CHECK(lt_delta_net_back(ctx, g_bad, in.q, in.k, in.v, in.g, in.beta, in.s0, 1) == NULL);
    CHECK(lt_delta_net_back(ctx, in.v, in.q, in.k, in.v, in.g, in.beta, in.s0, 1) != NULL,
          "the output's gradient alone: %s", lt_last_error());
    CHECK(lt_delta_net_back_grad(ctx, r, LT_DELTA_NET_GRAD_Q) == NULL);
    struct lt_tensor *f16 = lt_new_tensor_4d(ctx, LT_TYPE_F16, 4, 2, 2, 1);
    struct lt_tensor *rh = lt_delta_net(ctx, f16, in.k, in.v, in.g, in.beta, in.s0, 1);
    char reason[LT_REASON_MAX] = "";
    CHECK(rh && !lt_cpu_supports_op(rh, reason, sizeof(reason)) && strstr(reason, "source 0"),
          "%s", reason);
    dn_case_free(&c);
    lt_ctx_free(ctx);
}

/* ---- delta_net_back against central differences of the double reference ---- */

static double dn_loss(const struct dn_case *c, const double *R, double *packed)
{
    dn_ref(c, packed);
    double l = 0;
    for (int64_t i = 0; i < n_packed(c); i++)
        l += packed[i] * R[i];
    return l;
}

static void test_delta_net_back_case(int64_t sk, int64_t sv, int64_t hk, int64_t hv, int64_t nt,
                                     int64_t nb, enum lt_delta_net_path path)
{
    struct dn_case c = dn_case_new(sk, sv, hk, hv, nt, nb);
    const int64_t np = n_packed(&c);
    double *R = malloc(sizeof(double) * (size_t)np), *packed = malloc(sizeof(double) * (size_t)np);
    for (int64_t i = 0; i < np; i++)
        R[i] = (float)frand(-1, 1);
    struct lt_ctx *ctx = new_ctx();
    struct dn_inputs in = dn_inputs_new(ctx, &c);
    struct lt_tensor *grad = tensor_from_d(ctx, (int64_t[]){sv, hv, nt + sk, nb}, R);
    struct lt_tensor *back =
        lt_delta_net_back(ctx, grad, in.q, in.k, in.v, in.g, in.beta, in.s0, c.scale);
    CHECK(back != NULL, "%s", lt_last_error());
    lt_delta_net_set_path(back, path);
    if (!back || !compute(graph_of(ctx, back)))
        goto out_free;
    double *vars[LT_DELTA_NET_GRAD_COUNT] = {c.q, c.k, c.v, c.g, c.beta, c.s0};
    const int64_t counts[LT_DELTA_NET_GRAD_COUNT] = {n_qk(&c), n_qk(&c), n_v(&c),
                                                     n_g(&c),  n_g(&c),  n_s(&c)};
    const char *names[LT_DELTA_NET_GRAD_COUNT] = {"q", "k", "v", "g", "beta", "state"};
    for (int w = 0; w < LT_DELTA_NET_GRAD_COUNT; w++) {
        struct lt_tensor *d = lt_delta_net_back_grad(ctx, back, w);
        CHECK(d && lt_is_contiguous(d) && lt_nelements(d) == counts[w]);
        if (!d)
            continue;
        float *fd = malloc(sizeof(float) * (size_t)counts[w]);
        const double h = 1e-5;
        for (int64_t i = 0; i < counts[w]; i++) {
            double x0 = vars[w][i];
            vars[w][i] = x0 + h;
            double lp = dn_loss(&c, R, packed);
            vars[w][i] = x0 - h;
            double lm = dn_loss(&c, R, packed);
            vars[w][i] = x0;
            fd[i] = (float)((lp - lm) / (2 * h));
        }
        double e = rel_err(d->data, fd, counts[w]);
        CHECK(e < 1e-3, "delta_net_back d%s (S_k %lld S_v %lld H %lld/%lld T %lld B %lld): rel "
              "err %g", names[w], (long long)sk, (long long)sv, (long long)hk, (long long)hv,
              (long long)nt, (long long)nb, e);
        printf("delta_net_back %s T=%-3lld d%-5s vs central differences: rel err %.2e\n",
               path == LT_DELTA_NET_PATH_CHUNKED ? "chunked" : "auto", (long long)nt, names[w], e);
        free(fd);
    }
out_free:
    lt_ctx_free(ctx);
    free(R), free(packed);
    dn_case_free(&c);
}

static void test_delta_net_back(void)
{
    test_delta_net_back_case(4, 3, 1, 2, 1, 2, LT_DELTA_NET_PATH_AUTO);
    test_delta_net_back_case(5, 3, 1, 2, 5, 2, LT_DELTA_NET_PATH_AUTO);
    test_delta_net_back_case(4, 3, 2, 4, 70, 2, LT_DELTA_NET_PATH_AUTO);
    test_delta_net_back_case(5, 3, 1, 2, 5, 2, LT_DELTA_NET_PATH_CHUNKED);
    test_delta_net_back_case(4, 3, 2, 4, 70, 2, LT_DELTA_NET_PATH_CHUNKED);
}

/* runs DELTA_NET_BACK of case c with gradient R on the path given; the flat result
 * (malloc'd) or NULL */
static float *dn_back_run(const struct dn_case *c, const double *R, enum lt_delta_net_path path)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 64u << 20});
    struct dn_inputs in = dn_inputs_new(ctx, c);
    struct lt_tensor *grad = tensor_from_d(ctx, (int64_t[]){c->sv, c->hv, c->nt + c->sk, c->nb}, R);
    struct lt_tensor *back =
        lt_delta_net_back(ctx, grad, in.q, in.k, in.v, in.g, in.beta, in.s0, c->scale);
    float *out = NULL;
    CHECK(back != NULL, "%s", lt_last_error());
    if (back) {
        lt_delta_net_set_path(back, path);
        if (compute(graph_of(ctx, back))) {
            out = malloc(lt_nbytes(back));
            memcpy(out, back->data, lt_nbytes(back));
        }
    }
    lt_ctx_free(ctx);
    return out;
}

/* the chunked backward against the recurrent one around the chunk size, each gradient
 * apart, grouped heads, two sequences */
static void test_delta_net_back_chunked(void)
{
    const int64_t lens[] = {1, 5, 63, 64, 65, 150};
    const char *names[LT_DELTA_NET_GRAD_COUNT] = {"q", "k", "v", "g", "beta", "state"};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        struct dn_case c = dn_case_new(16, 12, 2, 4, lens[li], 2);
        const int64_t np = n_packed(&c);
        double *R = malloc(sizeof(double) * (size_t)np);
        for (int64_t i = 0; i < np; i++)
            R[i] = (float)frand(-1, 1);
        float *rec = dn_back_run(&c, R, LT_DELTA_NET_PATH_RECURRENT);
        float *chk = dn_back_run(&c, R, LT_DELTA_NET_PATH_CHUNKED);
        const int64_t counts[LT_DELTA_NET_GRAD_COUNT] = {n_qk(&c), n_qk(&c), n_v(&c),
                                                         n_g(&c),  n_g(&c),  n_s(&c)};
        int64_t off = 0;
        for (int w = 0; rec && chk && w < LT_DELTA_NET_GRAD_COUNT; w++) {
            double e = rel_err(chk + off, rec + off, counts[w]);
            CHECK(e < 2e-5, "delta_net_back chunked vs recurrent T=%lld d%s: rel err %g",
                  (long long)c.nt, names[w], e);
            printf("delta_net_back chunked vs recurrent T=%-3lld d%-5s: rel err %.2e\n",
                   (long long)c.nt, names[w], e);
            off += counts[w];
        }
        free(rec), free(chk), free(R);
        dn_case_free(&c);
    }
}

/* Packed examples in one row (training's padding-free packing): a gate of -30 at an
 * example's first step (LT_MB_GATE_RESET) ends the state before it, so each example's
 * outputs and its end state are those of the example alone from zero state, on the
 * recurrent path and on the chunked one, whose running gate sums carry the -30 (examples
 * starting at 40, inside the first 64-step chunk, and at 100) */
static void test_delta_net_reset(void)
{
    const int64_t nt = 150, starts[3] = {0, 40, 100}, ends[3] = {40, 100, 150};
    struct dn_case c = dn_case_new(16, 12, 2, 4, nt, 1);
    for (int e = 1; e < 3; e++)
        for (int64_t h = 0; h < c.hv; h++)
            c.g[starts[e] * c.hv + h] += LT_MB_GATE_RESET;
    for (int path = LT_DELTA_NET_PATH_RECURRENT; path <= LT_DELTA_NET_PATH_CHUNKED; path++) {
        float *packed = dn_run(&c, (enum lt_delta_net_path)path);
        double worst = 0;
        for (int e = 1; packed && e < 3; e++) {
            /* example e alone: its steps, from zero state */
            const int64_t L = ends[e] - starts[e];
            struct dn_case a = dn_case_new(16, 12, 2, 4, L, 1);
            memcpy(a.q, c.q + starts[e] * c.hk * c.sk, sizeof(double) * (size_t)n_qk(&a));
            memcpy(a.k, c.k + starts[e] * c.hk * c.sk, sizeof(double) * (size_t)n_qk(&a));
            memcpy(a.v, c.v + starts[e] * c.hv * c.sv, sizeof(double) * (size_t)n_v(&a));
            memcpy(a.g, c.g + starts[e] * c.hv, sizeof(double) * (size_t)n_g(&a));
            memcpy(a.beta, c.beta + starts[e] * c.hv, sizeof(double) * (size_t)n_g(&a));
            for (int64_t h = 0; h < a.hv; h++)
                a.g[h] -= LT_MB_GATE_RESET; /* alone, its first gate is the plain one */
            memset(a.s0, 0, sizeof(double) * (size_t)n_s(&a));
            float *alone = dn_run(&a, (enum lt_delta_net_path)path);
            if (alone) {
                const int64_t row = c.hv * c.sv;
                double e1 = rel_err(packed + starts[e] * row, alone, L * row);
                worst = e1 > worst ? e1 : worst;
                if (e == 2) { /* the row's end state is the last example's */
                    double e2 = rel_err(packed + nt * row, alone + L * row, c.sk * row);
                    worst = e2 > worst ? e2 : worst;
                }
            }
            free(alone);
            dn_case_free(&a);
        }
        CHECK(packed && worst < 1e-5, "delta_net %s with resets against each example alone: %g",
              path == LT_DELTA_NET_PATH_RECURRENT ? "recurrent" : "chunked", worst);
        printf("delta_net %-9s packed examples (gate reset -30) against each alone: rel err %.2e\n",
               path == LT_DELTA_NET_PATH_RECURRENT ? "recurrent" : "chunked", worst);
        free(packed);
    }
    dn_case_free(&c);
}

/* ---- gdn_decode: the fused decode step against the unfused graph ---- */

/* a [n0, n1, n2] F32 tensor filled from [lo, hi): contiguous, or (strided) a transposed
 * view of a [n1, n0, n2] one */
static struct lt_tensor *gdn_input(struct lt_ctx *ctx, int64_t n0, int64_t n1, int64_t n2,
                                   int64_t n3, float lo, float hi, bool strided)
{
    struct lt_tensor *t = strided ? lt_new_tensor_4d(ctx, LT_TYPE_F32, n1, n0, n2, n3)
                                  : lt_new_tensor_4d(ctx, LT_TYPE_F32, n0, n1, n2, n3);
    fill_rand(t->data, lt_nelements(t), lo, hi);
    return strided ? lt_transpose(ctx, t) : t;
}

/* lt_gdn_decode against the ops build_delta_layer chains at T = 1 (model_graph.c), on the
 * same inputs; strided: qkv a slice of a wider projection, conv_state and ssm_state
 * transposed views */
static void test_gdn_decode_case(int64_t sk, int64_t sv, int64_t hk, int64_t hv, int64_t K,
                                 int64_t S, bool strided)
{
    struct lt_ctx *ctx = new_ctx();
    const int64_t C = 2 * sk * hk + sv * hv;
    const size_t es = sizeof(float);
    const float eps = 1e-6f;
    struct lt_tensor *wide = lt_new_tensor_2d(ctx, LT_TYPE_F32, C + (strided ? 5 : 0), S);
    fill_rand(wide->data, lt_nelements(wide), -2, 2);
    struct lt_tensor *qkv = strided ? lt_view_2d(ctx, wide, C, S, wide->nb[1], 3 * es) : wide;
    struct lt_tensor *z = gdn_input(ctx, sv * hv, S, 1, 1, -2, 2, false);
    struct lt_tensor *beta = gdn_input(ctx, hv, S, 1, 1, -3, 3, false);
    struct lt_tensor *alpha = gdn_input(ctx, hv, S, 1, 1, -3, 3, false);
    struct lt_tensor *conv_state = gdn_input(ctx, K - 1, C, S, 1, -2, 2, strided);
    struct lt_tensor *ssm_state = gdn_input(ctx, sv, sk, hv, S, -0.5f, 0.5f, strided);
    struct lt_tensor *conv_w = gdn_input(ctx, K, C, 1, 1, -1, 1, false);
    struct lt_tensor *dt = gdn_input(ctx, hv, 1, 1, 1, -1, 1, false);
    struct lt_tensor *a = gdn_input(ctx, hv, 1, 1, 1, -2.5f, -0.4f, false); /* -exp(A_log) */
    struct lt_tensor *norm_w = gdn_input(ctx, sv, 1, 1, 1, 0.5f, 1.5f, false);
    lt_set_name(conv_state, "conv_state");
    struct lt_tensor *r = lt_gdn_decode(ctx, qkv, z, beta, alpha, conv_state, ssm_state, conv_w, dt,
                                        a, norm_w, hk, eps, NULL);
    CHECK(r != NULL, "%s", lt_last_error());
    if (!r)
        goto out_free;
    struct lt_tensor *y = lt_gdn_decode_output(ctx, r), *cn = lt_gdn_decode_conv(ctx, r),
                     *sn = lt_gdn_decode_state(ctx, r);
    CHECK(y && cn && sn && lt_is_contiguous(y) && lt_is_contiguous(cn) && lt_is_contiguous(sn));
    CHECK(y->ne[0] == sv * hv && y->ne[1] == S && lt_same_shape(cn, conv_state) &&
          lt_same_shape(sn, ssm_state));
    char reason[LT_REASON_MAX] = "";
    CHECK(!lt_cuda_compiled() || lt_cuda_verdict(r, reason, sizeof(reason)),
          "CUDA's precondition refuses gdn_decode: %s", reason);

    /* the unfused graph, step by step as build_delta_layer builds it (T = 1) */
    struct lt_tensor *qkv_t = lt_view_3d(ctx, qkv, 1, C, S, qkv->nb[0], qkv->nb[1], 0);
    struct lt_tensor *sx = lt_concat(ctx, conv_state, qkv_t, 0);         /* [K, C, S] */
    struct lt_tensor *conv = lt_silu(ctx, lt_ssm_conv(ctx, sx, conv_w)); /* [C, 1, S] */
    struct lt_tensor *q = lt_view_4d(ctx, conv, sk, hk, 1, S, sk * es, C * es, C * es, 0);
    struct lt_tensor *k =
        lt_view_4d(ctx, conv, sk, hk, 1, S, sk * es, C * es, C * es, sk * hk * es);
    struct lt_tensor *v =
        lt_view_4d(ctx, conv, sv, hv, 1, S, sv * es, C * es, C * es, 2 * sk * hk * es);
    q = lt_l2_norm(ctx, q, 1e-6f);
    k = lt_l2_norm(ctx, k, 1e-6f);
    struct lt_tensor *bs = lt_sigmoid(ctx, lt_reshape_3d(ctx, beta, hv, 1, S));
    struct lt_tensor *g = lt_add(ctx, lt_reshape_3d(ctx, alpha, hv, 1, S), dt);
    g = lt_mul(ctx, lt_softplus(ctx, g), a);
    struct lt_tensor *dn = lt_delta_net(ctx, q, k, v, g, bs, ssm_state, 1.0f / sqrtf((float)sk));
    struct lt_tensor *o = lt_delta_net_output(ctx, dn);
    struct lt_tensor *on = lt_mul(ctx, lt_rms_norm(ctx, o, eps), norm_w);
    struct lt_tensor *yr =
        lt_mul(ctx, on, lt_silu(ctx, lt_reshape_4d(ctx, z, sv, hv, 1, S))); /* [Sv, Hv, 1, S] */
    struct lt_tensor *cr = lt_view_3d(ctx, sx, K - 1, C, S, sx->nb[1], sx->nb[2], es);
    struct lt_tensor *sr = lt_delta_net_state(ctx, dn);
    CHECK(yr && cr && sr, "%s", lt_last_error());
    if (!yr || !cr || !sr)
        goto out_free;
    struct lt_graph *gr = lt_graph_new(ctx, 4096);
    CHECK(lt_graph_build(gr, r) == LT_OK && lt_graph_build(gr, yr) == LT_OK);
    if (!compute(gr))
        goto out_free;
    const int64_t n[3] = {sv * hv * S, (K - 1) * C * S, sv * sk * hv * S};
    struct lt_tensor *got[3] = {y, cn, sn}, *want[3] = {yr, cr, sr};
    static const char *const part[3] = {"output", "conv state", "ssm state"};
    double e[3];
    for (int i = 0; i < 3; i++) {
        float *ga = malloc(sizeof(float) * (size_t)n[i]),
              *wa = malloc(sizeof(float) * (size_t)n[i]);
        lt_tensor_read_f32(got[i], ga);
        lt_tensor_read_f32(want[i], wa);
        e[i] = rel_err(ga, wa, n[i]);
        CHECK(e[i] < 1e-5,
              "gdn_decode S_k %lld S_v %lld H %lld/%lld K %lld S %lld%s %s vs the "
              "unfused graph: rel err %g",
              (long long)sk, (long long)sv, (long long)hk, (long long)hv, (long long)K,
              (long long)S, strided ? " strided" : "", part[i], e[i]);
        free(ga), free(wa);
    }
    printf("gdn_decode S_k %-3lld S_v %-3lld H %lld/%lld S %lld%-8s vs unfused: output %.2e, "
           "conv state %.2e, ssm state %.2e\n",
           (long long)sk, (long long)sv, (long long)hk, (long long)hv, (long long)S,
           strided ? " strided" : "", e[0], e[1], e[2]);
out_free:
    lt_ctx_free(ctx);
}

/* lt_gdn_decode given seq_ids, on caches of S + 2 random slots, against the same op given
 * the slots gathered (ids < 0 or >= N: that sequence skipped): y equal, the caches' slots
 * ids[s] equal to that op's new conv and ssm states, all bit for bit (the same arithmetic
 * on the same numbers), and every other slot of both caches untouched */
static void test_gdn_decode_cache_case(int64_t sk, int64_t sv, int64_t hk, int64_t hv, int64_t K,
                                       int64_t S, const int32_t *ids)
{
    struct lt_ctx *ctx = new_ctx();
    const int64_t C = 2 * sk * hk + sv * hv, N = S + 2;
    const size_t conv_slot = sizeof(float) * (size_t)((K - 1) * C),
                 ssm_slot = sizeof(float) * (size_t)(sv * sk * hv);
    struct lt_tensor *qkv = gdn_input(ctx, C, S, 1, 1, -2, 2, false);
    struct lt_tensor *z = gdn_input(ctx, sv * hv, S, 1, 1, -2, 2, false);
    struct lt_tensor *beta = gdn_input(ctx, hv, S, 1, 1, -3, 3, false);
    struct lt_tensor *alpha = gdn_input(ctx, hv, S, 1, 1, -3, 3, false);
    struct lt_tensor *conv_cache = gdn_input(ctx, K - 1, C, N, 1, -2, 2, false);
    struct lt_tensor *ssm_cache = gdn_input(ctx, sv, sk, hv, N, -0.5f, 0.5f, false);
    struct lt_tensor *conv_w = gdn_input(ctx, K, C, 1, 1, -1, 1, false);
    struct lt_tensor *dt = gdn_input(ctx, hv, 1, 1, 1, -1, 1, false);
    struct lt_tensor *a = gdn_input(ctx, hv, 1, 1, 1, -2.5f, -0.4f, false);
    struct lt_tensor *norm_w = gdn_input(ctx, sv, 1, 1, 1, 0.5f, 1.5f, false);
    struct lt_tensor *seq = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
    memcpy(seq->data, ids, sizeof(int32_t) * (size_t)S);
    /* the slots gathered (slot 0 for a skipped sequence: its results are not compared) */
    struct lt_tensor *conv_g = lt_new_tensor_3d(ctx, LT_TYPE_F32, K - 1, C, S);
    struct lt_tensor *ssm_g = lt_new_tensor_4d(ctx, LT_TYPE_F32, sv, sk, hv, S);
    bool skip[8] = {false}; /* the cases have S <= 8 */
    assert(S <= 8);
    int n_skip = 0;
    for (int64_t s = 0; s < S; s++) {
        skip[s] = ids[s] < 0 || ids[s] >= N;
        n_skip += skip[s];
        const int64_t slot = skip[s] ? 0 : ids[s];
        memcpy((char *)conv_g->data + s * conv_slot, (char *)conv_cache->data + slot * conv_slot,
               conv_slot);
        memcpy((char *)ssm_g->data + s * ssm_slot, (char *)ssm_cache->data + slot * ssm_slot,
               ssm_slot);
    }
    char *before = malloc(lt_nbytes(ssm_cache)), *conv_before = malloc(lt_nbytes(conv_cache));
    memcpy(before, ssm_cache->data, lt_nbytes(ssm_cache));
    memcpy(conv_before, conv_cache->data, lt_nbytes(conv_cache));

    struct lt_tensor *r = lt_gdn_decode(ctx, qkv, z, beta, alpha, conv_cache, ssm_cache, conv_w, dt,
                                        a, norm_w, hk, 1e-6f, seq);
    struct lt_tensor *ref = lt_gdn_decode(ctx, qkv, z, beta, alpha, conv_g, ssm_g, conv_w, dt, a,
                                          norm_w, hk, 1e-6f, NULL);
    CHECK(r && ref, "%s", lt_last_error());
    if (!r || !ref)
        goto out_free;
    struct lt_tensor *y = lt_gdn_decode_output(ctx, r);
    CHECK(y && y->ne[1] == S, "%s", lt_last_error());
    CHECK(lt_gdn_decode_conv(ctx, r) == NULL, "the new conv state is in the cache");
    CHECK(lt_nelements(r) == sv * hv * S, "no state parts in the result");
    char reason[LT_REASON_MAX] = "";
    CHECK(!lt_cuda_compiled() || lt_cuda_verdict(r, reason, sizeof(reason)),
          "CUDA's precondition refuses gdn_decode on the caches: %s", reason);
    struct lt_graph *g = lt_graph_new(ctx, 256);
    CHECK(lt_graph_build(g, r) == LT_OK && lt_graph_build(g, ref) == LT_OK);
    if (!compute(g))
        goto out_free;

    /* y and the new conv state, per sequence: the reference's, or zeros when skipped */
    const float *got = r->data, *want = ref->data;
    const size_t y_seq = sizeof(float) * (size_t)(sv * hv);
    bool y_ok = true, conv_ok = true, ssm_ok = true, rest_ok = true;
    for (int64_t s = 0; s < S; s++) {
        const float *gy = got + s * sv * hv;
        if (skip[s]) {
            for (int64_t i = 0; i < sv * hv; i++)
                y_ok = y_ok && gy[i] == 0.0f;
            continue;
        }
        y_ok = y_ok && memcmp(gy, want + s * sv * hv, y_seq) == 0;
        conv_ok = conv_ok && memcmp((char *)conv_cache->data + ids[s] * conv_slot,
                                    want + sv * hv * S + s * (K - 1) * C, conv_slot) == 0;
        ssm_ok = ssm_ok &&
                 memcmp((char *)ssm_cache->data + ids[s] * ssm_slot,
                        want + sv * hv * S + (K - 1) * C * S + s * sv * sk * hv, ssm_slot) == 0;
    }
    /* slots no valid id names are as they were */
    for (int64_t slot = 0; slot < N; slot++) {
        bool named = false;
        for (int64_t s = 0; s < S; s++)
            named = named || (!skip[s] && ids[s] == slot);
        if (!named)
            rest_ok = rest_ok &&
                      memcmp((char *)ssm_cache->data + slot * ssm_slot, before + slot * ssm_slot,
                             ssm_slot) == 0 &&
                      memcmp((char *)conv_cache->data + slot * conv_slot,
                             conv_before + slot * conv_slot, conv_slot) == 0;
    }
    CHECK(y_ok && conv_ok && ssm_ok && rest_ok,
          "gdn_decode on caches (S_k %lld S_v %lld H %lld/%lld S %lld, %d skipped) vs gathered "
          "states: y %s, conv state %s, cache slots %s, other slots %s",
          (long long)sk, (long long)sv, (long long)hk, (long long)hv, (long long)S, n_skip,
          y_ok ? "equal" : "DIFFER", conv_ok ? "equal" : "DIFFER", ssm_ok ? "equal" : "DIFFER",
          rest_ok ? "untouched" : "CHANGED");
    printf("gdn_decode S_k %-3lld S_v %-3lld H %lld/%lld S %lld on caches of %lld slots, ids",
           (long long)sk, (long long)sv, (long long)hk, (long long)hv, (long long)S, (long long)N);
    for (int64_t s = 0; s < S; s++)
        printf(" %d", ids[s]);
    printf(": y, conv state and slots %s the gathered op's, other slots %s\n",
           y_ok && conv_ok && ssm_ok ? "equal to" : "NOT equal to",
           rest_ok ? "untouched" : "CHANGED");
out_free:
    free(before);
    free(conv_before);
    lt_ctx_free(ctx);
}

/* GDN_DECODE on caches in host memory, placed on a device that cannot read them (CUDA's
 * verdict, emulated on the CPU: cuda_emu.h): the scheduler gives it copies of the caches
 * and must copy both caches back after the run, as the op wrote them in place (sched.c's
 * writes_source). The result and the caches must equal the CPU's own run, bit for bit
 * (each item is one thread's whatever the thread count). Skipped without the CUDA backend,
 * whose verdict the emulation answers with. */
static void test_gdn_decode_copied_back(void)
{
    if (!lt_cuda_compiled()) {
        printf("gdn_decode on host caches through the scheduler: skipped (no CUDA backend)\n");
        return;
    }
    const int64_t sk = 8, sv = 6, hk = 2, hv = 4, K = 4, S = 3, N = 5, C = 2 * sk * hk + sv * hv;
    struct lt_ctx *ctx = new_ctx(); /* the inputs, in host memory, and the CPU's run */
    struct lt_ctx *nctx =
        lt_ctx_init((struct lt_ctx_params){.mem_size = 1u << 20, .no_alloc = true});
    struct lt_backend *dev = emu_new();
    struct lt_sched *sch = NULL;
    struct lt_tensor *qkv = gdn_input(ctx, C, S, 1, 1, -2, 2, false);
    struct lt_tensor *z = gdn_input(ctx, sv * hv, S, 1, 1, -2, 2, false);
    struct lt_tensor *beta = gdn_input(ctx, hv, S, 1, 1, -3, 3, false);
    struct lt_tensor *alpha = gdn_input(ctx, hv, S, 1, 1, -3, 3, false);
    struct lt_tensor *conv_dev = gdn_input(ctx, K - 1, C, N, 1, -2, 2, false);
    struct lt_tensor *conv_cpu = lt_dup_tensor(ctx, conv_dev);
    memcpy(conv_cpu->data, conv_dev->data, lt_nbytes(conv_dev));
    struct lt_tensor *ssm_dev = gdn_input(ctx, sv, sk, hv, N, -0.5f, 0.5f, false);
    struct lt_tensor *ssm_cpu = lt_dup_tensor(ctx, ssm_dev);
    memcpy(ssm_cpu->data, ssm_dev->data, lt_nbytes(ssm_dev));
    struct lt_tensor *conv_w = gdn_input(ctx, K, C, 1, 1, -1, 1, false);
    struct lt_tensor *dt = gdn_input(ctx, hv, 1, 1, 1, -1, 1, false);
    struct lt_tensor *a = gdn_input(ctx, hv, 1, 1, 1, -2.5f, -0.4f, false);
    struct lt_tensor *norm_w = gdn_input(ctx, sv, 1, 1, 1, 0.5f, 1.5f, false);
    struct lt_tensor *ids = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
    memcpy(ids->data, (const int32_t[]){3, 0, 4}, sizeof(int32_t) * (size_t)S);
    struct lt_tensor *r_cpu = lt_gdn_decode(ctx, qkv, z, beta, alpha, conv_cpu, ssm_cpu, conv_w, dt,
                                            a, norm_w, hk, 1e-6f, ids);
    struct lt_tensor *r_dev = lt_gdn_decode(nctx, qkv, z, beta, alpha, conv_dev, ssm_dev, conv_w,
                                            dt, a, norm_w, hk, 1e-6f, ids);
    CHECK(dev && nctx && r_cpu && r_dev, "%s", lt_last_error());
    if (!dev || !nctx || !r_cpu || !r_dev || !compute(graph_of(ctx, r_cpu)))
        goto out_free;
    r_dev->flags |= LT_FLAG_OUTPUT;
    struct lt_backend *bes[2] = {dev, cpu};
    struct lt_graph *g = lt_graph_new(nctx, 64);
    sch = lt_sched_new(bes, 2);
    bool ok = g && sch && lt_graph_build(g, r_dev) == LT_OK &&
              lt_sched_place(sch, g, false, NULL) == LT_OK;
    CHECK(ok, "%s", lt_last_error());
    if (!ok)
        goto out_free;
    int placed = -1;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i] == r_dev)
            placed = lt_sched_node_backend(sch, i);
    CHECK(placed == 0, "gdn_decode on host caches placed on backend %d, not the device", placed);
    ok = lt_sched_alloc(sch, g) == LT_OK && lt_sched_compute(sch, g) == LT_OK;
    CHECK(ok, "%s", lt_last_error());
    if (!ok)
        goto out_free;
    float *got = malloc(lt_nbytes(r_dev));
    CHECK(got && lt_tensor_get(r_dev, got, 0, lt_nbytes(r_dev)) == LT_OK, "%s", lt_last_error());
    const bool out_eq = got && memcmp(got, r_cpu->data, lt_nbytes(r_cpu)) == 0;
    const bool cache_eq = memcmp(ssm_dev->data, ssm_cpu->data, lt_nbytes(ssm_cpu)) == 0 &&
                          memcmp(conv_dev->data, conv_cpu->data, lt_nbytes(conv_cpu)) == 0;
    CHECK(out_eq && cache_eq,
          "gdn_decode on host caches run by the device: result %s, caches %s the CPU's",
          out_eq ? "equals" : "DIFFERS from",
          cache_eq ? "equal" : "DIFFER from (not copied back?)");
    printf("gdn_decode on host caches, placed on emulated CUDA0 (copies): result %s, conv and "
           "ssm caches %s the CPU's run\n",
           out_eq ? "equal to" : "NOT equal to", cache_eq ? "equal to" : "NOT equal to");
    free(got);
out_free:
    lt_sched_free(sch);
    if (dev)
        lt_backend_free(dev);
    lt_ctx_free(nctx);
    lt_ctx_free(ctx);
}

/* the caches' mode: cases, and refusals naming the tensor at fault */
static void test_gdn_decode_caches(void)
{
    test_gdn_decode_cache_case(8, 6, 2, 4, 4, 3, (const int32_t[]){3, 0, 4});
    test_gdn_decode_cache_case(8, 6, 2, 4, 4, 1, (const int32_t[]){2});
    test_gdn_decode_cache_case(16, 12, 1, 2, 4, 4, (const int32_t[]){5, 1, 2, 0});
    test_gdn_decode_cache_case(8, 8, 3, 6, 3, 2, (const int32_t[]){1, 3});     /* K = 3 */
    test_gdn_decode_cache_case(8, 6, 2, 4, 4, 3, (const int32_t[]){3, -1, 5}); /* skipped */

    struct lt_ctx *ctx = new_ctx();
    const int64_t sk = 4, sv = 3, hk = 1, hv = 2, K = 4, S = 2, N = 4, C = 2 * sk * hk + sv * hv;
    struct lt_tensor *qkv = lt_new_tensor_2d(ctx, LT_TYPE_F32, C, S);
    struct lt_tensor *z = lt_new_tensor_2d(ctx, LT_TYPE_F32, sv * hv, S);
    struct lt_tensor *bt = lt_new_tensor_2d(ctx, LT_TYPE_F32, hv, S);
    struct lt_tensor *al = lt_new_tensor_2d(ctx, LT_TYPE_F32, hv, S);
    struct lt_tensor *cs = lt_new_tensor_3d(ctx, LT_TYPE_F32, K - 1, C, N);
    struct lt_tensor *ss = lt_new_tensor_4d(ctx, LT_TYPE_F32, sv, sk, hv, N);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, K, C);
    struct lt_tensor *dt = lt_new_tensor_1d(ctx, LT_TYPE_F32, hv);
    struct lt_tensor *a = lt_new_tensor_1d(ctx, LT_TYPE_F32, hv);
    struct lt_tensor *nw = lt_new_tensor_1d(ctx, LT_TYPE_F32, sv);
    struct lt_tensor *ids = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
    struct lt_tensor *ids_f32 = lt_new_tensor_1d(ctx, LT_TYPE_F32, S);
    struct lt_tensor *ids_long = lt_new_tensor_1d(ctx, LT_TYPE_I32, S + 1);
    struct lt_tensor *cs_short = lt_new_tensor_3d(ctx, LT_TYPE_F32, K - 1, C, N - 1);
    lt_set_name(ids_f32, "blk.0.seq_ids_f32");
    lt_set_name(ids_long, "blk.0.seq_ids_long");
    lt_set_name(cs_short, "blk.0.conv_cache");
    lt_set_name(ss, "blk.0.ssm_cache");
    struct lt_tensor *r = lt_gdn_decode(ctx, qkv, z, bt, al, cs, ss, w, dt, a, nw, hk, 1e-6f, ids);
    CHECK(r != NULL, "%s", lt_last_error());
    CHECK(r && lt_gdn_decode_output(ctx, r), "%s", lt_last_error());
    CHECK(r && lt_gdn_decode_conv(ctx, r) == NULL); /* the new conv state is in the cache */
    CHECK(strstr(lt_last_error(), "conv state is in the cache") != NULL, "%s", lt_last_error());
    CHECK(r && lt_gdn_decode_state(ctx, r) == NULL); /* the new state is in the cache */
    CHECK(strstr(lt_last_error(), "blk.0.ssm_cache") != NULL, "%s", lt_last_error());
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, cs, ss, w, dt, a, nw, hk, 1e-6f, ids_f32) == NULL);
    CHECK(strstr(lt_last_error(), "seq_ids 'blk.0.seq_ids_f32' is f32, not i32") != NULL, "%s",
          lt_last_error());
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, cs, ss, w, dt, a, nw, hk, 1e-6f, ids_long) == NULL);
    CHECK(strstr(lt_last_error(), "seq_ids 'blk.0.seq_ids_long'") != NULL, "%s", lt_last_error());
    /* the caches must have the same slots */
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, cs_short, ss, w, dt, a, nw, hk, 1e-6f, ids) == NULL);
    CHECK(strstr(lt_last_error(), "conv_state 'blk.0.conv_cache'") != NULL, "%s", lt_last_error());
    /* a cache written in place cannot be a broadcast view */
    struct lt_tensor *cs_one = lt_new_tensor_2d(ctx, LT_TYPE_F32, K - 1, C);
    struct lt_tensor *cs_b = lt_view_3d(ctx, cs_one, K - 1, C, N, cs_one->nb[1], 0, 0);
    lt_set_name(cs_b, "blk.0.conv_bcast");
    CHECK(cs_b &&
          lt_gdn_decode(ctx, qkv, z, bt, al, cs_b, ss, w, dt, a, nw, hk, 1e-6f, ids) == NULL);
    CHECK(strstr(lt_last_error(), "conv_state 'blk.0.conv_bcast', written in place, has elements "
                                  "that share memory") != NULL,
          "%s", lt_last_error());
    /* the cache written in place needs dim 0 adjacent */
    struct lt_tensor *ss_t = lt_transpose(ctx, lt_new_tensor_4d(ctx, LT_TYPE_F32, sk, sv, hv, N));
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, cs, ss_t, w, dt, a, nw, hk, 1e-6f, ids) == NULL);
    CHECK(strstr(lt_last_error(), "written in place") != NULL, "%s", lt_last_error());
    lt_ctx_free(ctx);
}

static void test_gdn_decode(void)
{
    test_gdn_decode_case(8, 6, 2, 4, 4, 1, false);
    test_gdn_decode_case(8, 6, 2, 4, 4, 3, false);
    test_gdn_decode_case(16, 12, 1, 2, 4, 5, false);
    test_gdn_decode_case(32, 32, 2, 4, 4, 2, false);
    test_gdn_decode_case(16, 12, 2, 4, 4, 3, true);
    test_gdn_decode_case(8, 8, 3, 6, 3, 2, false); /* K = 3 */

    /* refusals name the tensor at fault */
    struct lt_ctx *ctx = new_ctx();
    const int64_t sk = 4, sv = 3, hk = 1, hv = 2, K = 4, S = 2, C = 2 * sk * hk + sv * hv;
    struct lt_tensor *qkv = lt_new_tensor_2d(ctx, LT_TYPE_F32, C, S);
    struct lt_tensor *z = lt_new_tensor_2d(ctx, LT_TYPE_F32, sv * hv, S);
    struct lt_tensor *bt = lt_new_tensor_2d(ctx, LT_TYPE_F32, hv, S);
    struct lt_tensor *al = lt_new_tensor_2d(ctx, LT_TYPE_F32, hv, S);
    struct lt_tensor *cs = lt_new_tensor_3d(ctx, LT_TYPE_F32, K - 1, C, S);
    struct lt_tensor *bad_cs = lt_new_tensor_3d(ctx, LT_TYPE_F32, K, C, S);
    struct lt_tensor *ss = lt_new_tensor_4d(ctx, LT_TYPE_F32, sv, sk, hv, S);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, K, C);
    struct lt_tensor *dt = lt_new_tensor_1d(ctx, LT_TYPE_F32, hv);
    struct lt_tensor *a = lt_new_tensor_1d(ctx, LT_TYPE_F32, hv);
    struct lt_tensor *nw = lt_new_tensor_1d(ctx, LT_TYPE_F32, sv);
    lt_set_name(bad_cs, "blk.0.conv_state");
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, cs, ss, w, dt, a, nw, hk, 1e-6f, NULL) != NULL, "%s",
          lt_last_error());
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, bad_cs, ss, w, dt, a, nw, hk, 1e-6f, NULL) == NULL);
    CHECK(strstr(lt_last_error(), "conv_state 'blk.0.conv_state'") != NULL, "%s", lt_last_error());
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, cs, ss, w, dt, a, nw, 3, 1e-6f, NULL) ==
          NULL); /* H_k */
    CHECK(lt_gdn_decode(ctx, qkv, z, bt, al, cs, ss, w, a, a, z, hk, 1e-6f, NULL) ==
          NULL); /* norm_w */
    CHECK(strstr(lt_last_error(), "norm_w") != NULL, "%s", lt_last_error());
    CHECK(lt_gdn_decode_state(ctx, qkv) == NULL); /* not a GDN_DECODE */
    lt_ctx_free(ctx);

    /* key heads too long for the CUDA kernel's shared memory: CUDA says no, the CPU runs it */
    if (lt_cuda_compiled()) {
        ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1u << 20, .no_alloc = true});
        const int64_t lk = 8192, lC = 2 * lk + sv;
        struct lt_tensor *r = lt_gdn_decode(
            ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, lC, 1),
            lt_new_tensor_2d(ctx, LT_TYPE_F32, sv, 1), lt_new_tensor_2d(ctx, LT_TYPE_F32, 1, 1),
            lt_new_tensor_2d(ctx, LT_TYPE_F32, 1, 1),
            lt_new_tensor_3d(ctx, LT_TYPE_F32, K - 1, lC, 1),
            lt_new_tensor_4d(ctx, LT_TYPE_F32, sv, lk, 1, 1),
            lt_new_tensor_2d(ctx, LT_TYPE_F32, K, lC), lt_new_tensor_1d(ctx, LT_TYPE_F32, 1),
            lt_new_tensor_1d(ctx, LT_TYPE_F32, 1), lt_new_tensor_1d(ctx, LT_TYPE_F32, sv), 1, 1e-6f,
            NULL);
        char reason[LT_REASON_MAX] = "";
        CHECK(r && !lt_cuda_verdict(r, reason, sizeof(reason)) && strstr(reason, "shared memory"),
              "%s", r ? reason : lt_last_error());
        CHECK(r && lt_cpu_supports_op(r, reason, sizeof(reason)), "%s", reason);
        lt_ctx_free(ctx);
    }
}

int main(void)
{
    cpu = lt_backend_cpu_new(3); /* more threads than some splits have items */
    if (!cpu) {
        fprintf(stderr, "no CPU backend: %s\n", lt_last_error());
        return 1;
    }
    test_ssm_conv();
    test_ssm_conv_back(false);
    test_ssm_conv_back(true);
    test_conv_silu(7);
    test_conv_silu(2); /* fewer steps than the history */
    test_conv_silu_packed();
    test_delta_net_reset();
    test_delta_net_shapes();
    test_delta_net_reference();
    test_delta_net_chunked();
    test_delta_net_strided();
    test_delta_net_decode();
    test_delta_net_back();
    test_delta_net_back_chunked();
    test_gdn_decode();
    test_gdn_decode_caches();
    test_gdn_decode_copied_back();
    test_backward_rules();
    lt_backend_free(cpu);
    return check_summary();
}
