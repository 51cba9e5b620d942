/* attn_decode.c: ATTN_DECODE, one decode token's attention read straight from the KV cache
 * (inference only: no backward rule), with its CPU kernel.
 *
 * It stands for the chain a decode step builds otherwise: gather the sequences' keys and
 * values out of the cache (GET_ROWS twice), q.k (MUL_MAT), SOFT_MAX with the scale and a
 * mask hiding the positions past the sequence's own, p.v (MUL_MAT), the merge of the heads
 * (CONT) and Qwen3.5's output gate (SIGMOID, MUL): eight kernels a layer become one. The
 * arithmetic follows the chain's: each score is a dot product summed in double and rounded
 * once, then times the scale; the softmax subtracts the maximum, takes expf, sums in
 * double and scales by the rounded reciprocal; each output element sums p_j v_j in double.
 * So it agrees with the chain to float rounding (the products of the chain sum in float).
 *
 * Sources: q [D, H, S], k_cache, v_cache [D, Hkv, n_ctx, n_slots], seq_ids [S], pos [S],
 * gate [D, H, S] (optional), k_new, v_new [D, Hkv, 1, S] (optional: this token's keys and
 * values, stored first into the caches at (pos[s], seq_ids[s]), by threads that split the
 * (KV head, sequence) pairs, then a barrier: the SET_ROWS of the two caches folded in). Query head
 * h reads KV head h / (H / Hkv), as MUL_MAT broadcasts a's heads over b's. An id or a position
 * outside the cache gives a column of NaN (the kernel cannot fail, and NaN cannot go unnoticed);
 * the session never passes one. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/op.h"

enum { AD_Q, AD_K, AD_V, AD_IDS, AD_POS, AD_GATE, AD_KNEW, AD_VNEW, AD_SRC_COUNT };

static bool kv_cache_ok(const struct lt_tensor *c, const struct lt_tensor *q)
{
    return (c->type == LT_TYPE_F32 || c->type == LT_TYPE_F16) &&
           c->nb[0] == lt_type_traits(c->type)->type_size && c->ne[0] == q->ne[0] &&
           c->ne[1] >= 1 && q->ne[1] % c->ne[1] == 0;
}

/* the constructor's rule, for a node however it was made; NULL: fine, else what is wrong */
static const char *attn_decode_check(struct lt_tensor *const *s)
{
    const struct lt_tensor *q = s[AD_Q], *k = s[AD_K], *v = s[AD_V], *ids = s[AD_IDS],
                           *pos = s[AD_POS], *gate = s[AD_GATE];
    if (q->type != LT_TYPE_F32 || q->ne[3] != 1)
        return "q must be f32 [D, H, S]";
    if (!kv_cache_ok(k, q) || !kv_cache_ok(v, q) || !lt_same_shape(k, v) || k->type != v->type)
        return "the caches must be f32 or f16 [D, Hkv, n_ctx, n_slots] alike, Hkv dividing H";
    const int64_t S = q->ne[2];
    if (ids->type != LT_TYPE_I32 || pos->type != LT_TYPE_I32 || ids->ne[0] != S ||
        pos->ne[0] != S || lt_nelements(ids) != S || lt_nelements(pos) != S)
        return "seq_ids and pos must be i32 [S]";
    if (gate && (gate->type != LT_TYPE_F32 || !lt_same_shape(gate, q)))
        return "the gate must be f32 of q's shape";
    const struct lt_tensor *kn = s[AD_KNEW], *vn = s[AD_VNEW];
    if (!kn != !vn)
        return "k_new and v_new come together";
    if (kn) {
        const bool shape = kn->ne[0] == k->ne[0] && kn->ne[1] == k->ne[1] && kn->ne[2] == 1 &&
                           kn->ne[3] == S && lt_same_shape(kn, vn);
        if (kn->type != LT_TYPE_F32 || vn->type != LT_TYPE_F32 || !shape)
            return "k_new and v_new must be f32 [D, Hkv, 1, S]";
        if (lt_shares_memory(k) || lt_shares_memory(v))
            return "the caches, written in place, have elements that share memory";
    }
    return NULL;
}

struct lt_tensor *lt_attn_decode(struct lt_ctx *ctx, struct lt_tensor *q, struct lt_tensor *k_cache,
                                 struct lt_tensor *v_cache, struct lt_tensor *seq_ids,
                                 struct lt_tensor *pos, struct lt_tensor *gate, float scale,
                                 struct lt_tensor *k_new, struct lt_tensor *v_new)
{
    LT_REQUIRE("attn_decode", q, k_cache, v_cache, seq_ids, pos);
    struct lt_tensor *srcs[AD_SRC_COUNT] = {q, k_cache, v_cache, seq_ids, pos, gate, k_new, v_new};
    const char *why = attn_decode_check(srcs);
    if (why) {
        lt_fail(LT_ERR_INVALID, "attn_decode of '%s' over '%s': %s", q->name, k_cache->name, why);
        return NULL;
    }
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_ATTN_DECODE, LT_TYPE_F32, 2,
                                           (int64_t[]){q->ne[0] * q->ne[1], q->ne[2]}, srcs,
                                           k_new || v_new ? AD_SRC_COUNT
                                           : gate         ? 6
                                                          : 5);
    if (t)
        lt_set_param_f32(t, 0, scale);
    return t;
}

static bool attn_decode_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const char *why = attn_decode_check(node->src);
    if (!why && (node->type != LT_TYPE_F32 || !lt_is_contiguous(node) ||
                 node->ne[0] != node->src[AD_Q]->ne[0] * node->src[AD_Q]->ne[1] ||
                 node->ne[1] != node->src[AD_Q]->ne[2]))
        why = "the result is not contiguous f32 [D * H, S]";
    if (why)
        snprintf(reason, reason_size, "%s", why);
    return why == NULL;
}

/* scores of one (head, sequence) pair: n_ctx floats a thread */
static size_t attn_decode_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)nth * (size_t)node->src[AD_K]->ne[2] * sizeof(float);
}

static float cache_at(const struct lt_tensor *c, int64_t d, int64_t h, int64_t j, int64_t slot)
{
    const char *p = (const char *)c->data + d * c->nb[0] + h * c->nb[1] + j * c->nb[2] +
                    slot * c->nb[3];
    return c->type == LT_TYPE_F16 ? lt_fp16_to_fp32(*(const uint16_t *)p) : *(const float *)p;
}

static float q_at(const struct lt_tensor *t, int64_t d, int64_t h, int64_t s)
{
    return *(const float *)((const char *)t->data + d * t->nb[0] + h * t->nb[1] + s * t->nb[2]);
}

/* this token's keys or values of sequence s, KV head kh, into the cache c at its position
 * (rounded to the cache's type) */
static void store_new(const struct lt_tensor *c, const struct lt_tensor *x, int64_t kh, int64_t s,
                      int64_t j, int64_t slot)
{
    for (int64_t d = 0; d < c->ne[0]; d++) {
        const float v =
            *(const float *)((const char *)x->data + d * x->nb[0] + kh * x->nb[1] + s * x->nb[3]);
        char *p = (char *)c->data + d * c->nb[0] + kh * c->nb[1] + j * c->nb[2] + slot * c->nb[3];
        if (c->type == LT_TYPE_F16)
            *(uint16_t *)p = lt_fp32_to_fp16(v);
        else
            *(float *)p = v;
    }
}

static void attn_decode_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *q = node->src[AD_Q], *k = node->src[AD_K], *v = node->src[AD_V],
                           *gate = node->src[AD_GATE];
    const int32_t *ids = node->src[AD_IDS]->data, *pos = node->src[AD_POS]->data;
    const int64_t D = q->ne[0], H = q->ne[1], S = q->ne[2], group = H / k->ne[1];
    const int64_t n_ctx = k->ne[2], n_slots = k->ne[3];
    const float scale = lt_get_param_f32(node, 0);
    float *sc = (float *)p->wdata + (size_t)p->ith * (size_t)n_ctx;
    int64_t lo, hi;
    if (node->src[AD_KNEW]) { /* this token's keys and values into the caches first */
        const int64_t Hkv = k->ne[1];
        lt_split_range(Hkv * S, p->ith, p->nth, &lo, &hi);
        for (int64_t r = lo; r < hi; r++) {
            const int64_t kh = r % Hkv, s = r / Hkv, slot = ids[s], j = pos[s];
            if (slot < 0 || slot >= n_slots || j < 0 || j >= n_ctx)
                continue;
            store_new(k, node->src[AD_KNEW], kh, s, j, slot);
            store_new(v, node->src[AD_VNEW], kh, s, j, slot);
        }
        lt_compute_barrier(p);
    }
    lt_split_range(H * S, p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const int64_t h = r % H, s = r / H, kh = h / group;
        float *y = (float *)node->data + s * node->ne[0] + h * D;
        const int64_t slot = ids[s], n = (int64_t)pos[s] + 1;
        if (slot < 0 || slot >= n_slots || n < 1 || n > n_ctx) {
            for (int64_t d = 0; d < D; d++)
                y[d] = NAN;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            double dot = 0;
            for (int64_t d = 0; d < D; d++)
                dot += (double)q_at(q, d, h, s) * cache_at(k, d, kh, j, slot);
            sc[j] = (float)dot * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < n; j++)
            sc[j] *= inv;
        for (int64_t d = 0; d < D; d++) {
            double o = 0;
            for (int64_t j = 0; j < n; j++)
                o += (double)sc[j] * cache_at(v, d, kh, j, slot);
            float of = (float)o;
            if (gate) {
                float g = q_at(gate, d, h, s);
                of *= 1.0f / (1.0f + expf(-g));
            }
            y[d] = of;
        }
    }
}

const struct lt_op_def lt_op_def_attn_decode = {.name = "ATTN_DECODE",
                                                .n_src = AD_SRC_COUNT,
                                                .cpu_supported = attn_decode_supported,
                                                .cpu_work_size = attn_decode_work_size,
                                                .cpu_forward = attn_decode_forward};
