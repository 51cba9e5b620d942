/* delta_net.c: the gated delta rule of Gated DeltaNet (DELTA_NET) and its backward
 * (DELTA_NET_BACK): the backward rule and the CPU kernels (the constructors, view helpers
 * and shape rules are delta_net_build.c's).
 *
 * Per value head h of sequence b (key head h % H_k), with S a [S_k, S_v] matrix:
 *   S = exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = scale S^T q_t
 * The state tensor [S_v, S_k, H_v, B] stores S[i][j] (key dim i, value dim j) at (j, i),
 * so one key row of S is S_v contiguous floats in every buffer here.
 *
 * Two forward paths compute the same thing. The recurrent one steps token by token (the
 * oracle, and decode). The chunked one (chunks of 64) uses, within a chunk starting from
 * S0 with G_r = g_0 + ... + g_r, the corrected values u_r (delta_r above):
 *   u_r = beta_r (v_r - e^{G_r} S0^T k_r) - sum_{s<r} beta_r e^{G_r - G_s} (k_r.k_s) u_s
 *   o_r = scale (e^{G_r} S0^T q_r + sum_{s<=r} e^{G_r - G_s} (q_r.k_s) u_s)
 *   S   = e^{G_L-1} S0 + sum_s e^{G_L-1 - G_s} k_s u_s^T
 * The first line is the unit lower-triangular system (I + A) U = B V' of the WY/UT form,
 * solved here by forward substitution on U directly. Every exponent is G_r - G_s with
 * s <= r, never a ratio of two exponentials, so nothing overflows when g <= 0.
 *
 * The backward recomputes the states: one recurrent pass keeps a checkpoint every `seg`
 * (~sqrt T) tokens, then each segment, last first, is replayed to keep its per-token
 * states and the adjoint recurrence runs back through it. Threads take (key head,
 * sequence) pairs so the value heads that share a key head add into dq and dk on one
 * thread; the forward takes (value head, sequence) pairs.
 *
 * DELTA_NET_BACK's result is one flat F32 tensor: dq, dk, dv, dg, dbeta, dstate, each
 * contiguous and shaped like its source (enum lt_delta_net_grad). */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/delta_net_impl.h"
#include "ops/grad.h"
#include "ops/op.h"

#define CHUNK 64

/* ---- CPU: shared helpers ---- */

static bool dn_cpu_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    for (int i = 0; i < LT_MAX_SRC && node->src[i]; i++) {
        if (node->src[i]->type != LT_TYPE_F32) {
            snprintf(reason, reason_size, "source %d is %s; the CPU kernel reads F32", i,
                     lt_type_name(node->src[i]->type));
            return false;
        }
    }
    return true;
}

/* n floats from p, stride bytes apart */
static void load_vec(const char *p, size_t stride, int64_t n, float *out)
{
    if (stride == sizeof(float)) {
        memcpy(out, p, sizeof(float) * (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = *(const float *)(p + (size_t)i * stride);
}

static float scalar_at(const struct lt_tensor *t, int64_t h, int64_t tt, int64_t b)
{
    return *(const float *)((const char *)t->data + h * t->nb[0] + tt * t->nb[1] + b * t->nb[2]);
}

/* Vector helpers over rows of S. Their bodies are unrolled by 8 so that -O2's cheap
 * vectoriser (which will not add a remainder loop itself) turns each into SIMD; dot keeps
 * 8 partial sums because the compiler may not reassociate one. */
static float dot(const float *restrict a, const float *restrict b, int64_t n)
{
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] += a[i + l] * b[i + l];
    for (; i < n; i++)
        s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* y = a x */
static void vscale_to(float *restrict y, float a, const float *restrict x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] = a * x[i + l];
    for (; i < n; i++)
        y[i] = a * x[i];
}

/* S[i][j] = state(j, i, h, b) */
static void load_state(const struct lt_tensor *st, int64_t h, int64_t b, float *S, int64_t sk,
                       int64_t sv)
{
    for (int64_t i = 0; i < sk; i++)
        load_vec((const char *)st->data + i * st->nb[1] + h * st->nb[2] + b * st->nb[3],
                 st->nb[0], sv, S + i * sv);
}

/* A bump allocator over one thread's part of the scratch; pieces stay 64-byte aligned. */
struct scratch {
    float *p;
    size_t used; /* floats */
};

static float *scratch_take(struct scratch *s, size_t n)
{
    float *r = s->p ? s->p + s->used : NULL;
    s->used += (n + 15) & ~(size_t)15;
    return r;
}

/* ---- CPU: forward ---- */

struct fwd_bufs {
    float *S;          /* [S_k][S_v] */
    float *qv, *kv, *vv; /* one token: q, k [S_k]; v [S_v] */
    float *Q, *K, *U;  /* chunk: [CHUNK][S_k], [CHUNK][S_k], [CHUNK][S_v] (v, then u) */
    float *W, *O;      /* chunk: [CHUNK][S_v] */
    float *KK, *QK;    /* [CHUNK][CHUNK] */
    float *G, *B;      /* [CHUNK] */
};

static size_t fwd_layout(struct fwd_bufs *f, float *base, struct dn_dims d)
{
    struct scratch s = {base, 0};
    size_t sk = (size_t)d.sk, sv = (size_t)d.sv;
    f->S = scratch_take(&s, sk * sv);
    f->qv = scratch_take(&s, sk);
    f->kv = scratch_take(&s, sk);
    f->vv = scratch_take(&s, sv);
    f->Q = scratch_take(&s, CHUNK * sk);
    f->K = scratch_take(&s, CHUNK * sk);
    f->U = scratch_take(&s, CHUNK * sv);
    f->W = scratch_take(&s, CHUNK * sv);
    f->O = scratch_take(&s, CHUNK * sv);
    f->KK = scratch_take(&s, CHUNK * CHUNK);
    f->QK = scratch_take(&s, CHUNK * CHUNK);
    f->G = scratch_take(&s, CHUNK);
    f->B = scratch_take(&s, CHUNK);
    return s.used;
}

static size_t dn_work_size(const struct lt_tensor *node, int nth)
{
    struct fwd_bufs f;
    return sizeof(float) * fwd_layout(&f, NULL, dn_dims_of(node->src[SRC_Q], node->src[SRC_V])) *
           (size_t)nth;
}

/* what every token reader needs: the sources and the (h, b) being computed */
struct dn_head {
    const struct lt_tensor *q, *k, *v, *g, *beta;
    struct dn_dims d;
    int64_t h, hk, b;
};

/* the final state's gradient dS [S_k][S_v] of head c: rows T.. of grad, or zeros when grad
 * holds the output's gradient alone (its T rows) */
static void load_dstate(const struct lt_tensor *grad, const struct dn_head *c, float *dS)
{
    const int64_t sk = c->d.sk, sv = c->d.sv, nt = c->d.nt;
    if (grad->ne[2] == nt) {
        memset(dS, 0, sizeof(float) * (size_t)(sk * sv));
        return;
    }
    for (int64_t i = 0; i < sk; i++)
        load_vec((const char *)grad->data + c->h * grad->nb[1] + (nt + i) * grad->nb[2] +
                     c->b * grad->nb[3],
                 grad->nb[0], sv, dS + i * sv);
}

static void load_q(const struct dn_head *c, int64_t t, float *out)
{
    const struct lt_tensor *q = c->q;
    load_vec((const char *)q->data + c->hk * q->nb[1] + t * q->nb[2] + c->b * q->nb[3], q->nb[0],
             c->d.sk, out);
}

static void load_k(const struct dn_head *c, int64_t t, float *out)
{
    const struct lt_tensor *k = c->k;
    load_vec((const char *)k->data + c->hk * k->nb[1] + t * k->nb[2] + c->b * k->nb[3], k->nb[0],
             c->d.sk, out);
}

static void load_v(const struct dn_head *c, int64_t t, float *out)
{
    const struct lt_tensor *v = c->v;
    load_vec((const char *)v->data + c->h * v->nb[1] + t * v->nb[2] + c->b * v->nb[3], v->nb[0],
             c->d.sv, out);
}

/* One recurrent step on S [S_k][S_v]. Writes e = v - S~^T k (S~ the decayed state) when
 * e_out is given and the output o (scaled) when o is given. */
static void recurrent_step(float *S, const float *q, const float *k, const float *v, float a,
                           float beta, float scale, int64_t sk, int64_t sv, float *delta,
                           float *e_out, float *o)
{
    for (int64_t j = 0; j < sv; j++)
        delta[j] = 0;
    for (int64_t i = 0; i < sk; i++) {
        float *row = S + i * sv;
        lt_vec_scale(row, a, sv);
        lt_vec_axpy(delta, k[i], row, sv);
    }
    for (int64_t j = 0; j < sv; j++) {
        float e = v[j] - delta[j];
        if (e_out)
            e_out[j] = e;
        delta[j] = beta * e;
    }
    if (o)
        for (int64_t j = 0; j < sv; j++)
            o[j] = 0;
    for (int64_t i = 0; i < sk; i++) {
        float *row = S + i * sv;
        lt_vec_axpy(row, k[i], delta, sv);
        if (o)
            lt_vec_axpy(o, q[i], row, sv);
    }
    if (o)
        lt_vec_scale(o, scale, sv);
}

/* output row t of (h, b) in the packed result */
static float *out_row(struct lt_tensor *node, const struct dn_head *c, int64_t t)
{
    return (float *)node->data + ((c->b * node->ne[2] + t) * c->d.hv + c->h) * c->d.sv;
}

static void forward_recurrent(struct lt_tensor *node, const struct dn_head *c, struct fwd_bufs *f,
                              float scale)
{
    for (int64_t t = 0; t < c->d.nt; t++) {
        load_q(c, t, f->qv);
        load_k(c, t, f->kv);
        load_v(c, t, f->vv);
        float a = expf(scalar_at(c->g, c->h, t, c->b));
        float beta = scalar_at(c->beta, c->h, t, c->b);
        recurrent_step(f->S, f->qv, f->kv, f->vv, a, beta, scale, c->d.sk, c->d.sv, f->W, NULL,
                       out_row(node, c, t));
    }
}

/* tokens [t0, t0 + n) as one chunk, from and into f->S (see the file comment) */
static void forward_chunk(struct lt_tensor *node, const struct dn_head *c, struct fwd_bufs *f,
                          int64_t t0, int64_t n, float scale)
{
    const int64_t sk = c->d.sk, sv = c->d.sv;
    float *S = f->S;
    float gsum = 0;
    for (int64_t r = 0; r < n; r++) {
        load_q(c, t0 + r, f->Q + r * sk);
        load_k(c, t0 + r, f->K + r * sk);
        load_v(c, t0 + r, f->U + r * sv);
        gsum += scalar_at(c->g, c->h, t0 + r, c->b);
        f->G[r] = gsum;
        f->B[r] = scalar_at(c->beta, c->h, t0 + r, c->b);
    }
    const int L = (int)n, isk = (int)sk, isv = (int)sv;
    /* KK = K K^T and QK = Q K^T (lower triangles used), W = K S0, O = Q S0 */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, isk, 1, f->K, isk, f->K, isk, 0,
                f->KK, CHUNK);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, isk, 1, f->Q, isk, f->K, isk, 0,
                f->QK, CHUNK);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, isv, isk, 1, f->K, isk, S, isv, 0,
                f->W, isv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, isv, isk, 1, f->Q, isk, S, isv, 0,
                f->O, isv);
    /* KK becomes A of (I + A) U = rhs (strictly lower; trsm takes the unit diagonal as
     * given), QK the decayed causal P of O += P U; U holds rhs = beta (v - e^G W) */
    for (int64_t r = 0; r < n; r++) {
        const float gr = f->G[r], br = f->B[r], er = expf(gr);
        float *kk = f->KK + r * CHUNK, *qk = f->QK + r * CHUNK;
        for (int64_t s = 0; s < r; s++)
            kk[s] *= br * expf(gr - f->G[s]);
        for (int64_t s = 0; s <= r; s++)
            qk[s] *= expf(gr - f->G[s]);
        for (int64_t s = r + 1; s < n; s++)
            qk[s] = 0;
        float *u = f->U + r * sv, *w = f->W + r * sv;
        for (int64_t j = 0; j < sv; j++)
            u[j] = br * (u[j] - er * w[j]);
        lt_vec_scale(f->O + r * sv, er, sv);
    }
    cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, L, isv, 1, f->KK,
                CHUNK, f->U, isv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, isv, L, 1, f->QK, CHUNK, f->U, isv,
                1, f->O, isv);
    for (int64_t r = 0; r < n; r++)
        vscale_to(out_row(node, c, t0 + r), scale, f->O + r * sv, sv);
    /* S = e^{G_last} S0 + sum_s e^{G_last - G_s} k_s u_s^T, the decayed keys in Q's place */
    const float glast = f->G[n - 1];
    for (int64_t s = 0; s < n; s++)
        vscale_to(f->Q + s * sk, expf(glast - f->G[s]), f->K + s * sk, sk);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, isk, isv, L, 1, f->Q, isk, f->U, isv,
                expf(glast), S, isv);
}

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
/* the pool's threads each call BLAS on their own heads; BLAS must not add threads */
static void blas_single_thread(void) { openblas_set_num_threads(1); }

static void dn_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct dn_dims d = dn_dims_of(node->src[SRC_Q], node->src[SRC_V]);
    const float scale = lt_get_param_f32(node, 0);
    int path = lt_get_param_i32(node, 1);
    if (path == LT_DELTA_NET_PATH_AUTO)
        path = d.nt > 1 ? LT_DELTA_NET_PATH_CHUNKED : LT_DELTA_NET_PATH_RECURRENT;
    if (path == LT_DELTA_NET_PATH_CHUNKED)
        pthread_once(&blas_once, blas_single_thread);
    struct fwd_bufs f;
    size_t per = fwd_layout(&f, NULL, d);
    fwd_layout(&f, (float *)p->wdata + per * (size_t)p->ith, d);
    struct dn_head c = {node->src[SRC_Q], node->src[SRC_K], node->src[SRC_V], node->src[SRC_G],
                        node->src[SRC_BETA], d, 0, 0, 0};
    const struct lt_tensor *st = node->src[SRC_STATE];
    for (int64_t item = p->ith; item < d.hv * d.nb; item += p->nth) {
        c.h = item % d.hv;
        c.b = item / d.hv;
        c.hk = c.h % d.hk;
        load_state(st, c.h, c.b, f.S, d.sk, d.sv);
        if (path == LT_DELTA_NET_PATH_RECURRENT) {
            forward_recurrent(node, &c, &f, scale);
        } else {
            for (int64_t t0 = 0; t0 < d.nt; t0 += CHUNK)
                forward_chunk(node, &c, &f, t0, d.nt - t0 < CHUNK ? d.nt - t0 : CHUNK, scale);
        }
        for (int64_t i = 0; i < d.sk; i++)
            memcpy(out_row(node, &c, d.nt + i), f.S + i * d.sv, sizeof(float) * (size_t)d.sv);
    }
}

/* ---- CPU: backward ---- */

static int64_t back_segment(int64_t nt)
{
    int64_t seg = (int64_t)ceil(sqrt((double)nt));
    return seg < 1 ? 1 : seg;
}

struct back_bufs {
    float *ckpt;      /* [n_seg][S_k][S_v]: the state before each segment */
    float *prev;      /* [seg][S_k][S_v]: the state before each token of one segment */
    float *E;         /* [seg][S_v]: v - S~^T k of each token of the segment */
    float *S, *dS;    /* [S_k][S_v] */
    float *q, *k, *v; /* one token */
    float *dout, *delta, *ddelta, *dkv, *row; /* [S_v] */
    float *dq, *dk;                     /* [S_k] */
};

static size_t back_layout(struct back_bufs *f, float *base, struct dn_dims d)
{
    struct scratch s = {base, 0};
    size_t sk = (size_t)d.sk, sv = (size_t)d.sv, seg = (size_t)back_segment(d.nt);
    size_t n_seg = ((size_t)d.nt + seg - 1) / seg;
    f->ckpt = scratch_take(&s, (n_seg ? n_seg : 1) * sk * sv);
    f->prev = scratch_take(&s, seg * sk * sv);
    f->E = scratch_take(&s, seg * sv);
    f->S = scratch_take(&s, sk * sv);
    f->dS = scratch_take(&s, sk * sv);
    f->q = scratch_take(&s, sk);
    f->k = scratch_take(&s, sk);
    f->v = scratch_take(&s, sv);
    f->dout = scratch_take(&s, sv);
    f->delta = scratch_take(&s, sv);
    f->ddelta = scratch_take(&s, sv);
    f->dkv = scratch_take(&s, sv);
    f->row = scratch_take(&s, sv);
    f->dq = scratch_take(&s, sk);
    f->dk = scratch_take(&s, sk);
    return s.used;
}



/* where each gradient of one (h, b) lives in the flat result */
struct back_out {
    float *dq, *dk, *dv, *dg, *dbeta, *dstate;
};

/* The adjoint of one token t, given the state before it (prev), e = v - S~^T k and dS
 * (the gradient of the state after it), which becomes the gradient of the state before.
 * Adds into dq/dk of the key head; writes dv, dg, dbeta of t. */
static void back_token(const struct dn_head *c, struct back_bufs *f, const struct back_out *o,
                       const struct lt_tensor *grad, const float *prev, const float *e, int64_t t,
                       float scale)
{
    const int64_t sk = c->d.sk, sv = c->d.sv;
    const int64_t tok = c->b * c->d.nt + t; /* token index in the flat [.., T, B] layouts */
    load_q(c, t, f->q);
    load_k(c, t, f->k);
    load_vec((const char *)grad->data + c->h * grad->nb[1] + t * grad->nb[2] + c->b * grad->nb[3],
             grad->nb[0], sv, f->dout);
    const float a = expf(scalar_at(c->g, c->h, t, c->b));
    const float beta = scalar_at(c->beta, c->h, t, c->b);
    for (int64_t j = 0; j < sv; j++) {
        f->delta[j] = beta * e[j];
        f->ddelta[j] = 0;
    }
    /* o = scale S^T q with S = a prev + k delta^T: dq, then dS += scale q dout^T; then
     * S = S~ + k delta^T: dk += dS delta, ddelta = dS^T k */
    for (int64_t i = 0; i < sk; i++) {
        float *ds = f->dS + i * sv;
        const float ki = f->k[i];
        vscale_to(f->row, a, prev + i * sv, sv);
        lt_vec_axpy(f->row, ki, f->delta, sv);
        f->dq[i] = scale * dot(f->row, f->dout, sv);
        lt_vec_axpy(ds, scale * f->q[i], f->dout, sv);
        f->dk[i] = dot(ds, f->delta, sv);
        lt_vec_axpy(f->ddelta, ki, ds, sv);
    }
    /* delta = beta (v - S~^T k) */
    float dbeta = 0;
    float *dv = o->dv + (tok * c->d.hv + c->h) * sv;
    for (int64_t j = 0; j < sv; j++) {
        dbeta += f->ddelta[j] * e[j];
        dv[j] = beta * f->ddelta[j];
        f->dkv[j] = -beta * f->ddelta[j];
    }
    /* kv = S~^T k with S~ = a prev: dS~ = dS + k dkv^T, dk += S~ dkv, dg = <dS~, S~>,
     * and the gradient of prev is a dS~ */
    double dg = 0;
    for (int64_t i = 0; i < sk; i++) {
        float *ds = f->dS + i * sv;
        vscale_to(f->row, a, prev + i * sv, sv);
        lt_vec_axpy(ds, f->k[i], f->dkv, sv);
        f->dk[i] += dot(f->row, f->dkv, sv);
        dg += dot(ds, f->row, sv);
        lt_vec_scale(ds, a, sv);
    }
    o->dg[tok * c->d.hv + c->h] = (float)dg;
    o->dbeta[tok * c->d.hv + c->h] = dbeta;
    float *dq = o->dq + (tok * c->d.hk + c->hk) * sk, *dk = o->dk + (tok * c->d.hk + c->hk) * sk;
    for (int64_t i = 0; i < sk; i++) {
        dq[i] += f->dq[i];
        dk[i] += f->dk[i];
    }
}

/* value head c->h of sequence c->b: recompute, then run the adjoint back to the start */
static void back_head(const struct dn_head *c, struct back_bufs *f, const struct back_out *o,
                      const struct lt_tensor *grad, const struct lt_tensor *st, float scale)
{
    const int64_t sk = c->d.sk, sv = c->d.sv, nt = c->d.nt, seg = back_segment(nt);
    const size_t ssz = sizeof(float) * (size_t)(sk * sv);
    load_state(st, c->h, c->b, f->S, sk, sv);
    for (int64_t t = 0; t < nt; t++) {
        if (t % seg == 0)
            memcpy(f->ckpt + (t / seg) * sk * sv, f->S, ssz);
        load_k(c, t, f->k);
        load_v(c, t, f->v);
        recurrent_step(f->S, NULL, f->k, f->v, expf(scalar_at(c->g, c->h, t, c->b)),
                       scalar_at(c->beta, c->h, t, c->b), scale, sk, sv, f->delta, NULL, NULL);
    }
    /* the gradient of the final state: rows T.. of grad */
    load_dstate(grad, c, f->dS);
    for (int64_t t0 = (nt - 1) / seg * seg; nt > 0 && t0 >= 0; t0 -= seg) {
        const int64_t n = nt - t0 < seg ? nt - t0 : seg;
        memcpy(f->S, f->ckpt + (t0 / seg) * sk * sv, ssz);
        for (int64_t r = 0; r < n; r++) {
            memcpy(f->prev + r * sk * sv, f->S, ssz);
            load_k(c, t0 + r, f->k);
            load_v(c, t0 + r, f->v);
            recurrent_step(f->S, NULL, f->k, f->v, expf(scalar_at(c->g, c->h, t0 + r, c->b)),
                           scalar_at(c->beta, c->h, t0 + r, c->b), scale, sk, sv, f->delta,
                           f->E + r * sv, NULL);
        }
        for (int64_t r = n - 1; r >= 0; r--)
            back_token(c, f, o, grad, f->prev + r * sk * sv, f->E + r * sv, t0 + r, scale);
    }
    /* dstate(j, i, h, b) = dS[i][j] */
    memcpy(o->dstate + (c->b * c->d.hv + c->h) * sk * sv, f->dS, ssz);
}

/* ---- CPU: chunked backward ---- */

/* The chunked backward runs the forward's chunk algebra (see the file comment) backward,
 * chunk by chunk from the last: a first pass keeps the state at every chunk start, then
 * each chunk recomputes its quantities from that state (nothing per token is stored) and
 * turns the gradient of its end state dS and of its outputs into the gradient of its
 * start state and of its tokens. Within a chunk (C rows, the unused rows of a last, short
 * chunk zero, which makes them steps that change nothing), with e_rs = e^{G_r - G_s}:
 *   Ab_rs = e_rs k_r.k_s (s < r),  P_rs = e_rs q_r.k_s (s <= r),  W = K S0,
 *   X_r = v_r - e^{G_r} W_r,  (I + diag(B) Ab) U = diag(B) X,
 *   O = scale (diag(e^G) Q S0 + P U),  S = e^{G_last} S0 + sum_s e^{G_last - G_s} k_s u_s^T.
 * Gradients with respect to the gates collect in dgam_r, the gradient of G_r (each e_rs
 * gives +x to r and -x to s); dg_t is then the sum of dgam_r over r >= t in the chunk. This
 * is the specification of the CUDA kernel (delta_net.cu), which runs the same steps with
 * the value columns split over blocks; the recurrent backward above stays the oracle. */

struct cback_bufs {
    float *ckpt;                       /* [n_chunks][S_k][S_v] */
    float *S0, *dS, *T;                /* [S_k][S_v] */
    float *K, *Q, *dQ, *dK;            /* [CHUNK][S_k] */
    float *X, *W, *U, *Do, *dU, *Y;    /* [CHUNK][S_v] */
    float *Ab, *P, *M;                 /* [CHUNK][CHUNK] */
    float *G, *eG, *B, *dgam, *dB;     /* [CHUNK] */
};

static size_t cback_layout(struct cback_bufs *f, float *base, struct dn_dims d)
{
    struct scratch s = {base, 0};
    size_t sk = (size_t)d.sk, sv = (size_t)d.sv, nch = ((size_t)d.nt + CHUNK - 1) / CHUNK;
    f->ckpt = scratch_take(&s, (nch ? nch : 1) * sk * sv);
    f->S0 = scratch_take(&s, sk * sv);
    f->dS = scratch_take(&s, sk * sv);
    f->T = scratch_take(&s, sk * sv);
    float **rows_k[] = {&f->K, &f->Q, &f->dQ, &f->dK};
    for (size_t i = 0; i < sizeof(rows_k) / sizeof(rows_k[0]); i++)
        *rows_k[i] = scratch_take(&s, CHUNK * sk);
    float **rows_v[] = {&f->X, &f->W, &f->U, &f->Do, &f->dU, &f->Y};
    for (size_t i = 0; i < sizeof(rows_v) / sizeof(rows_v[0]); i++)
        *rows_v[i] = scratch_take(&s, CHUNK * sv);
    f->Ab = scratch_take(&s, CHUNK * CHUNK);
    f->P = scratch_take(&s, CHUNK * CHUNK);
    f->M = scratch_take(&s, CHUNK * CHUNK);
    float **vecs[] = {&f->G, &f->eG, &f->B, &f->dgam, &f->dB};
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++)
        *vecs[i] = scratch_take(&s, CHUNK);
    return s.used;
}

/* Cm[m][n] (+)= alpha sum_k A(m, k) B(k, n), A(m, k) = A[m * ar + k * ac], B(k, n) =
 * B[k * br + n * bc], Cm row-major with leading dimension ldc */
static void cb_mm(float *Cm, int64_t ldc, const float *A, int64_t ar, int64_t ac, const float *B,
                  int64_t br, int64_t bc, int64_t M, int64_t N, int64_t K, float alpha, bool acc)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float x = 0;
            for (int64_t k = 0; k < K; k++)
                x += A[m * ar + k * ac] * B[k * br + n * bc];
            Cm[m * ldc + n] = (acc ? Cm[m * ldc + n] : 0) + alpha * x;
        }
}

/* the chunk of tokens [t0, t0 + n) from the state f->S0: K, Q, G, eG, B, Ab, P, W, X, U */
static void cback_prepare(const struct dn_head *c, struct cback_bufs *f, int64_t t0, int64_t n)
{
    const int64_t sk = c->d.sk, sv = c->d.sv;
    memset(f->K, 0, sizeof(float) * CHUNK * (size_t)sk);
    memset(f->Q, 0, sizeof(float) * CHUNK * (size_t)sk);
    memset(f->X, 0, sizeof(float) * CHUNK * (size_t)sv);
    float gsum = 0;
    for (int64_t r = 0; r < CHUNK; r++) {
        if (r < n) {
            load_k(c, t0 + r, f->K + r * sk);
            load_q(c, t0 + r, f->Q + r * sk);
            load_v(c, t0 + r, f->X + r * sv);
            gsum += scalar_at(c->g, c->h, t0 + r, c->b);
        }
        f->G[r] = gsum;
        f->eG[r] = expf(gsum);
        f->B[r] = r < n ? scalar_at(c->beta, c->h, t0 + r, c->b) : 0;
    }
    cb_mm(f->W, sv, f->K, sk, 1, f->S0, sv, 1, CHUNK, sv, sk, 1, false);
    for (int64_t r = 0; r < CHUNK; r++)
        for (int64_t j = 0; j < sv; j++) {
            f->X[r * sv + j] -= f->eG[r] * f->W[r * sv + j];
            f->U[r * sv + j] = f->B[r] * f->X[r * sv + j];
        }
    cb_mm(f->Ab, CHUNK, f->K, sk, 1, f->K, 1, sk, CHUNK, CHUNK, sk, 1, false);
    cb_mm(f->P, CHUNK, f->Q, sk, 1, f->K, 1, sk, CHUNK, CHUNK, sk, 1, false);
    for (int64_t r = 0; r < CHUNK; r++)
        for (int64_t s = 0; s < CHUNK; s++) {
            const float e = s <= r ? expf(f->G[r] - f->G[s]) : 0;
            f->Ab[r * CHUNK + s] *= s < r ? e : 0;
            f->P[r * CHUNK + s] *= e;
        }
    for (int64_t r = 0; r < CHUNK; r++) /* forward substitution */
        for (int64_t s = 0; s < r; s++)
            lt_vec_axpy(f->U + r * sv, -f->B[r] * f->Ab[r * CHUNK + s], f->U + s * sv, sv);
}

/* S0 = e^{G_last} S0 + sum_s e^{G_last - G_s} k_s u_s^T (f->Y holds the scaled U) */
static void cback_advance(struct cback_bufs *f, int64_t sk, int64_t sv)
{
    const float gl = f->G[CHUNK - 1];
    for (int64_t s = 0; s < CHUNK; s++)
        vscale_to(f->Y + s * sv, expf(gl - f->G[s]), f->U + s * sv, sv);
    lt_vec_scale(f->S0, f->eG[CHUNK - 1], sk * sv);
    cb_mm(f->S0, sv, f->K, 1, sk, f->Y, sv, 1, sk, sv, CHUNK, 1, true);
}

/* the adjoint of one chunk [t0, t0 + n): f->dS from its end state's gradient to its start
 * state's; writes dv, dg, dbeta of its tokens and adds into their dq, dk */
static void cback_chunk(const struct dn_head *c, struct cback_bufs *f, const struct back_out *o,
                        const struct lt_tensor *grad, int64_t t0, int64_t n, float scale)
{
    const int64_t sk = c->d.sk, sv = c->d.sv, L = CHUNK;
    float *Ab = f->Ab, *P = f->P, *M = f->M, *dgam = f->dgam, *dB = f->dB;
    memset(f->Do, 0, sizeof(float) * CHUNK * (size_t)sv);
    for (int64_t r = 0; r < n; r++) {
        load_vec((const char *)grad->data + c->h * grad->nb[1] + (t0 + r) * grad->nb[2] +
                     c->b * grad->nb[3],
                 grad->nb[0], sv, f->Do + r * sv);
        lt_vec_scale(f->Do + r * sv, scale, sv);
    }
    memset(dgam, 0, sizeof(float) * CHUNK);
    memset(dB, 0, sizeof(float) * CHUNK);
    /* O = P U (times scale, in Do): dU = P^T Do; dP = Do U^T on s <= r, then dQK */
    cb_mm(f->dU, sv, P, 1, L, f->Do, sv, 1, L, sv, L, 1, false);
    cb_mm(M, L, f->Do, sv, 1, f->U, 1, sv, L, L, sv, 1, false);
    for (int64_t r = 0; r < L; r++)
        for (int64_t s = 0; s < L; s++) {
            float *m = M + r * L + s;
            if (s > r) {
                *m = 0;
                continue;
            }
            const float x = *m * P[r * L + s];
            dgam[r] += x;
            dgam[s] -= x;
            *m *= expf(f->G[r] - f->G[s]);
        }
    cb_mm(f->dQ, sk, M, L, 1, f->K, sk, 1, L, sk, L, 1, false);
    cb_mm(f->dK, sk, M, 1, L, f->Q, sk, 1, L, sk, L, 1, false);
    /* O += diag(e^G) Q S0 (times scale): dQ += diag(e^G) Do S0^T, dgam_r += e^G_r Do_r.Y_r */
    cb_mm(f->Y, sv, f->Q, sk, 1, f->S0, sv, 1, L, sv, sk, 1, false);
    for (int64_t r = 0; r < L; r++)
        dgam[r] += f->eG[r] * dot(f->Do + r * sv, f->Y + r * sv, sv);
    for (int64_t r = 0; r < L; r++)
        cb_mm(f->dQ + r * sk, sk, f->Do + r * sv, 0, 1, f->S0, 1, sv, 1, sk, sv, f->eG[r], true);
    /* S = e^{G_last} S0 + sum_s e^{G_last - G_s} k_s u_s^T: dU_r += e_r (K dS)_r,
     * dK_r += e_r (U dS^T)_r, dgam gets e_r u_r.(K dS)_r at the last row less at r, and
     * e^{G_last} <dS, S0> at the last row */
    const float gl = f->G[L - 1];
    cb_mm(f->Y, sv, f->K, sk, 1, f->dS, sv, 1, L, sv, sk, 1, false);
    for (int64_t r = 0; r < L; r++) {
        const float e = expf(gl - f->G[r]);
        const float x = e * dot(f->U + r * sv, f->Y + r * sv, sv);
        dgam[L - 1] += x;
        dgam[r] -= x;
        lt_vec_axpy(f->dU + r * sv, e, f->Y + r * sv, sv);
        cb_mm(f->dK + r * sk, sk, f->U + r * sv, 0, 1, f->dS, 1, sv, 1, sk, sv, e, true);
    }
    dgam[L - 1] += f->eG[L - 1] * dot(f->dS, f->S0, sk * sv);
    /* (I + diag(B) Ab) U = diag(B) X: dRHS = (I + diag(B) Ab)^-T dU, in place */
    for (int64_t r = L - 1; r >= 0; r--)
        for (int64_t s = r + 1; s < L; s++)
            lt_vec_axpy(f->dU + r * sv, -f->B[s] * Ab[s * L + r], f->dU + s * sv, sv);
    /* dA_rs = -dRHS_r.U_s (s < r), A_rs = B_r Ab_rs: dB, dgam, then dKK into M */
    cb_mm(M, L, f->dU, sv, 1, f->U, 1, sv, L, L, sv, -1, false);
    for (int64_t r = 0; r < L; r++)
        for (int64_t s = 0; s < L; s++) {
            float *m = M + r * L + s;
            if (s >= r) {
                *m = 0;
                continue;
            }
            dB[r] += *m * Ab[r * L + s];
            const float x = *m * f->B[r] * Ab[r * L + s];
            dgam[r] += x;
            dgam[s] -= x;
            *m *= f->B[r] * expf(f->G[r] - f->G[s]);
        }
    cb_mm(f->dK, sk, M, L, 1, f->K, sk, 1, L, sk, L, 1, true);
    cb_mm(f->dK, sk, M, 1, L, f->K, sk, 1, L, sk, L, 1, true);
    /* RHS = diag(B) X, X = V - diag(e^G) K S0: dB, dv, then dW (into dU) */
    for (int64_t r = 0; r < L; r++) {
        float *du = f->dU + r * sv;
        dB[r] += dot(du, f->X + r * sv, sv);
        lt_vec_scale(du, f->B[r], sv); /* dX */
        if (r < n)
            memcpy(o->dv + ((c->b * c->d.nt + t0 + r) * c->d.hv + c->h) * sv, du,
                   sizeof(float) * (size_t)sv);
        lt_vec_scale(du, -f->eG[r], sv); /* dW */
        dgam[r] += dot(du, f->W + r * sv, sv);
    }
    cb_mm(f->dK, sk, f->dU, sv, 1, f->S0, 1, sv, L, sk, sv, 1, true);
    /* the start state's gradient: e^{G_last} dS + Q^T diag(e^G) Do + K^T dW */
    for (int64_t r = 0; r < L; r++)
        lt_vec_scale(f->Do + r * sv, f->eG[r], sv);
    lt_vec_scale(f->dS, f->eG[L - 1], sk * sv);
    cb_mm(f->dS, sv, f->Q, 1, sk, f->Do, sv, 1, sk, sv, L, 1, true);
    cb_mm(f->dS, sv, f->K, 1, sk, f->dU, sv, 1, sk, sv, L, 1, true);
    /* dg_t: the sum of dgam over the chunk's rows from t on */
    float acc = 0;
    for (int64_t r = L - 1; r >= 0; r--) {
        acc += dgam[r];
        if (r >= n)
            continue;
        const int64_t tok = c->b * c->d.nt + t0 + r;
        o->dg[tok * c->d.hv + c->h] = acc;
        o->dbeta[tok * c->d.hv + c->h] = dB[r];
        float *dq = o->dq + (tok * c->d.hk + c->hk) * sk, *dk = o->dk + (tok * c->d.hk + c->hk) * sk;
        lt_vec_axpy(dq, 1, f->dQ + r * sk, sk);
        lt_vec_axpy(dk, 1, f->dK + r * sk, sk);
    }
}

static void cback_head(const struct dn_head *c, struct cback_bufs *f, const struct back_out *o,
                       const struct lt_tensor *grad, const struct lt_tensor *st, float scale)
{
    const int64_t sk = c->d.sk, sv = c->d.sv, nt = c->d.nt;
    const size_t ssz = sizeof(float) * (size_t)(sk * sv);
    load_state(st, c->h, c->b, f->S0, sk, sv);
    for (int64_t t0 = 0; t0 < nt; t0 += CHUNK) {
        memcpy(f->ckpt + t0 / CHUNK * sk * sv, f->S0, ssz);
        cback_prepare(c, f, t0, nt - t0 < CHUNK ? nt - t0 : CHUNK);
        cback_advance(f, sk, sv);
    }
    load_dstate(grad, c, f->dS);
    for (int64_t t0 = nt > 0 ? (nt - 1) / CHUNK * CHUNK : -1; t0 >= 0; t0 -= CHUNK) {
        const int64_t n = nt - t0 < CHUNK ? nt - t0 : CHUNK;
        memcpy(f->S0, f->ckpt + t0 / CHUNK * sk * sv, ssz);
        cback_prepare(c, f, t0, n);
        cback_chunk(c, f, o, grad, t0, n, scale);
    }
    memcpy(o->dstate + (c->b * c->d.hv + c->h) * sk * sv, f->dS, ssz);
}

/* the CPU backward's path: AUTO is the recurrent one, the oracle */
static bool back_chunked(const struct lt_tensor *node)
{
    return lt_get_param_i32(node, 1) == LT_DELTA_NET_PATH_CHUNKED;
}

static size_t dn_back_work_size(const struct lt_tensor *node, int nth)
{
    struct dn_dims d = dn_dims_of(node->src[1 + SRC_Q], node->src[1 + SRC_V]);
    struct back_bufs f;
    struct cback_bufs cf;
    return sizeof(float) *
           (back_chunked(node) ? cback_layout(&cf, NULL, d) : back_layout(&f, NULL, d)) *
           (size_t)nth;
}

static void dn_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *grad = node->src[0], *st = node->src[1 + SRC_STATE];
    const struct dn_dims d = dn_dims_of(node->src[1 + SRC_Q], node->src[1 + SRC_V]);
    const float scale = lt_get_param_f32(node, 0);
    const bool chunked = back_chunked(node);
    struct back_bufs f;
    struct cback_bufs cf;
    if (chunked) {
        size_t per = cback_layout(&cf, NULL, d);
        cback_layout(&cf, (float *)p->wdata + per * (size_t)p->ith, d);
    } else {
        size_t per = back_layout(&f, NULL, d);
        back_layout(&f, (float *)p->wdata + per * (size_t)p->ith, d);
    }
    float *base = node->data;
    struct back_out o = {
        .dq = base + back_offset(node, LT_DELTA_NET_GRAD_Q),
        .dk = base + back_offset(node, LT_DELTA_NET_GRAD_K),
        .dv = base + back_offset(node, LT_DELTA_NET_GRAD_V),
        .dg = base + back_offset(node, LT_DELTA_NET_GRAD_G),
        .dbeta = base + back_offset(node, LT_DELTA_NET_GRAD_BETA),
        .dstate = base + back_offset(node, LT_DELTA_NET_GRAD_STATE),
    };
    struct dn_head c = {node->src[1 + SRC_Q], node->src[1 + SRC_K], node->src[1 + SRC_V],
                        node->src[1 + SRC_G], node->src[1 + SRC_BETA], d, 0, 0, 0};
    for (int64_t item = p->ith; item < d.hk * d.nb; item += p->nth) {
        c.hk = item % d.hk;
        c.b = item / d.hk;
        for (int64_t t = 0; t < d.nt; t++) {
            int64_t at = ((c.b * d.nt + t) * d.hk + c.hk) * d.sk;
            memset(o.dq + at, 0, sizeof(float) * (size_t)d.sk);
            memset(o.dk + at, 0, sizeof(float) * (size_t)d.sk);
        }
        for (c.h = c.hk; c.h < d.hv; c.h += d.hk) {
            if (chunked)
                cback_head(&c, &cf, &o, grad, st, scale);
            else
                back_head(&c, &f, &o, grad, st, scale);
        }
    }
}

/* ---- backward rule ---- */

/* The output's gradient when node->grad is that alone added into a zero of the whole result
 * (the view rule's FILL and one ACC at the output's window: the new state unused, as in a
 * training step), else NULL */
static struct lt_tensor *output_grad_alone(const struct lt_tensor *node)
{
    const struct lt_tensor *g = node->grad;
    size_t nb[3], offset;
    if (!g || !lt_acc_window(g, nb, &offset) || offset != 0 || nb[0] != node->nb[1] ||
        nb[1] != node->nb[2] || nb[2] != node->nb[3])
        return NULL;
    const struct lt_tensor *zero = g->src[0];
    struct lt_tensor *o = g->src[1];
    const int64_t nt = node->src[SRC_Q]->ne[2];
    const bool fits = zero && zero->op == LT_OP_FILL && lt_get_param_f32(zero, 0) == 0.0f &&
                      lt_same_shape(zero, node) && o && o->type == LT_TYPE_F32 &&
                      lt_is_contiguous(o) && o->ne[0] == node->ne[0] && o->ne[1] == node->ne[1] &&
                      o->ne[2] == nt && o->ne[3] == node->ne[3];
    return fits ? o : NULL;
}

/* node->grad covers the whole packed result: the output's and the new state's gradients
 * arrive through the views' rules (zeros where a part is unused). Where only the output's
 * arrived, DELTA_NET_BACK reads it as it is (output_grad_alone): the zero and the copy into
 * it (FILL, ACC: ~84 and ~134 MB a DeltaNet layer of a 16 x 512 step) are not made. */
static lt_status dn_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    bool any = false;
    for (int i = 0; i < SRC_COUNT; i++)
        any = any || lt_ad_wants(ad, node->src[i]);
    if (!any)
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *const *s = node->src;
    struct lt_tensor *out = output_grad_alone(node);
    struct lt_tensor *r = lt_delta_net_back(ctx, out ? out : node->grad, s[SRC_Q], s[SRC_K],
                                            s[SRC_V], s[SRC_G], s[SRC_BETA], s[SRC_STATE],
                                            lt_get_param_f32(node, 0));
    if (!r)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient of '%s': %s", node->name,
                       lt_last_error());
    lt_delta_net_set_prec(r, (enum lt_delta_net_prec)lt_get_param_i32(node, 2));
    for (int i = 0; i < SRC_COUNT; i++) {
        if (!lt_ad_wants(ad, s[i]))
            continue;
        lt_status st = lt_ad_add(ad, s[i], lt_delta_net_back_grad(ctx, r, (enum lt_delta_net_grad)i));
        if (st != LT_OK)
            return st;
    }
    return LT_OK;
}

const struct lt_op_def lt_op_def_delta_net = {
    .name = "DELTA_NET",
    .n_src = SRC_COUNT,
    .cpu_supported = dn_cpu_supported,
    .cpu_work_size = dn_work_size,
    .cpu_forward = dn_forward,
    .backward = dn_backward,
};

const struct lt_op_def lt_op_def_delta_net_back = {
    .name = "DELTA_NET_BACK",
    .n_src = 1 + SRC_COUNT,
    .cpu_supported = dn_cpu_supported,
    .cpu_work_size = dn_back_work_size,
    .cpu_forward = dn_back_forward,
};
