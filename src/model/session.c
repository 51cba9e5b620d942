/* session.c: inference over a model for several independent sequences: KV caches, DeltaNet
 * states, prefill and batched one-token decode.
 *
 * Storage, per layer, in one buffer of the first backend:
 *   attention: k, v [head_dim, n_head_kv, n_ctx, n_seq_max] (kv_type), roped keys
 *   DeltaNet:  conv [d_conv - 1, channels, n_seq_max], ssm [S_v, S_k, H_v, n_seq_max] (F32)
 * A prefill builds a graph, places it, runs it and frees it. New keys and values are
 * copied into the cache before attention reads it; since the read is not a data
 * dependency of the copy, the copies are added to the graph first and the graph runs in
 * build order. A decode batch reads its sequences' caches with get_rows over the sequence
 * axis (so any set of sequences decodes together) and masks, per sequence, the positions
 * it has not reached. Cached values past a sequence's position are stale but finite (the
 * buffer starts zeroed), so masked positions weigh exactly 0.
 *
 * Decode keeps its step (struct decode_plan): everything that changes from token to token
 * is an input (tokens, positions, sequence ids, the cache rows to write, the mask), the
 * stores are SET_ROWS at rows read from the device, and the window of positions read is
 * rounded up to DECODE_KV_STEP (no window when every attention layer reads the cache itself,
 * ATTN_DECODE). The same graph at the same addresses then runs token after token, on its
 * own scheduler; up to DECODE_PLANS steps (batch sizes, windows) are kept, the least
 * recently used replaced. A device sees the same kernels with the same arguments each time
 * (the CUDA backend replays them as one graph). decode_rebuild builds every step anew,
 * with copies to host-chosen offsets, as prefill does: the reference the kept step is
 * tested against. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/sched.h"
#include "model/model_impl.h"

/* Decode steps kept at once (batch sizes come and go as a server's streams do). */
#define DECODE_PLANS 4

struct decode_plan;

struct lt_session {
    const struct lt_model *m;
    struct lt_session_params p;
    struct lt_backend *own_cpu;
    struct lt_backend *be[LT_SCHED_MAX_BACKENDS];
    int n_be;
    struct lt_sched *sched;
    struct lt_ctx *ctx; /* cache headers */
    struct lt_buffer *buffer;
    struct lt_tensor **k, **v;      /* [n_layer]; NULL for DeltaNet layers */
    struct lt_tensor **conv, **ssm; /* [n_layer]; NULL for attention layers */
    int *pos;                       /* [n_seq_max] */
    struct decode_plan *plans[DECODE_PLANS]; /* kept decode steps; NULL: a free slot */
    uint64_t clock;                          /* for the least recently used plan */
    bool flash; /* prefill's attention as FLASH_ATTN (lt_model_flash_attn_on of be[0]) */
};

/* Positions a kept decode step reads are a multiple of this (at most n_ctx). */
#define DECODE_KV_STEP 256

/* A step's graph and inputs. */
struct built {
    struct lt_ctx *ctx;
    struct lt_graph *g;
    struct lt_tensor *tok, *pos, *seq_ids, *kv_rows, *mask, *last, *tok_mask, *conv_rows, *logits;
    struct lt_tensor *pick; /* decode with pick_vocab: I32 [n], each row's greedy pick */
    int64_t n_out; /* rows of logits */
    int64_t n_col; /* their width: n_vocab, or n_embd for hidden states */
};

/* A kept decode step: for n sequences reading n_kv positions (any number, when no node
 * reads the mask: every attention layer reads the cache itself), on a scheduler of its own
 * so its buffers stay where they are while other steps run. */
struct decode_plan {
    struct built b;
    struct lt_sched *sched;
    int n, n_kv;
    bool any_window;
    uint64_t last_used;
};

/* One prefill or decode call. A batch is a prefill of several sequences side by side,
 * each at its own position: T columns a sequence, the shorter ones padded after their last
 * token (a padding token's key and value are not stored, it leaves the DeltaNet state as
 * it was, and its logits are not read). */
struct step {
    struct lt_session *s;
    bool decode, batch;
    int seq, p0;               /* prefill: the sequence and its first new position */
    int n;                     /* prefill: tokens; decode and batch: sequences */
    const int *seqs;           /* decode and batch */
    int T;                     /* batch: columns a sequence (the longest one's tokens) */
    const int *lens;           /* batch: each sequence's tokens (1..T) */
    int n_kv;                  /* decode and batch: positions attended (max end) */
    bool kept;                 /* decode: the kept step (stores by SET_ROWS at kv_rows) */
    bool hidden;               /* prefill: the output is the final norm's [n, n_embd], no head */
    struct lt_tensor *seq_ids; /* decode: I32 [n], input */
    struct lt_tensor *kv_rows; /* kept decode, batch: I32 [T * n], seq * n_ctx + position (-1:
                                * padding, not stored), input */
    struct lt_tensor *last;    /* batch: I32 [n], each sequence's last token's column, input */
    /* padded batch: I32 [d_conv - 1, n], the conv input steps each sequence keeps (its last
     * d_conv - 1 before its own end), input */
    struct lt_tensor *conv_rows;
    /* decode_pick: the rows of logits copied out (NULL: all), and the picks' destination */
    const bool *want;
    int32_t *ids;
};

static lt_status zero_tensor_range(struct lt_tensor *t, size_t offset, size_t n)
{
    static const char zeros[1 << 16];
    lt_status st = LT_OK;
    while (n > 0 && st == LT_OK) {
        size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
        st = lt_tensor_set(t, zeros, offset, k);
        offset += k;
        n -= k;
    }
    return st;
}

static lt_status alloc_state(struct lt_session *s)
{
    const struct lt_model *m = s->m;
    const struct lt_model_hparams *hp = &m->hp;
    int64_t L = hp->n_layer, nc = s->p.n_ctx, ns = s->p.n_seq_max;
    s->ctx = lt_ctx_init((struct lt_ctx_params){
        .mem_size = (size_t)(4 * L + 8) * sizeof(struct lt_tensor), .no_alloc = true});
    s->k = calloc((size_t)L, sizeof(*s->k));
    s->v = calloc((size_t)L, sizeof(*s->v));
    s->conv = calloc((size_t)L, sizeof(*s->conv));
    s->ssm = calloc((size_t)L, sizeof(*s->ssm));
    s->pos = calloc((size_t)ns, sizeof(*s->pos));
    if (!s->ctx || !s->k || !s->v || !s->conv || !s->ssm || !s->pos)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a session");
    int64_t C = 2 * hp->ssm_d_state * hp->ssm_n_k_heads + hp->ssm_d_inner;
    int64_t Hv = hp->ssm_n_v_heads, Sv = Hv ? hp->ssm_d_inner / Hv : 0;
    for (int il = 0; il < L; il++) {
        if (m->layers[il].recurrent) {
            s->conv[il] = lt_new_tensor_3d(s->ctx, LT_TYPE_F32, hp->ssm_d_conv - 1, C, ns);
            s->ssm[il] = lt_new_tensor_4d(s->ctx, LT_TYPE_F32, Sv, hp->ssm_d_state, Hv, ns);
            if (!s->conv[il] || !s->ssm[il])
                return lt_fail(LT_ERR_NOMEM, "out of memory for a session");
            lt_format_name(s->conv[il], "cache_conv-%d", il);
            lt_format_name(s->ssm[il], "cache_ssm-%d", il);
        } else {
            s->k[il] = lt_new_tensor_4d(s->ctx, s->p.kv_type, hp->head_dim, hp->n_head_kv, nc, ns);
            s->v[il] = lt_new_tensor_4d(s->ctx, s->p.kv_type, hp->head_dim, hp->n_head_kv, nc, ns);
            if (!s->k[il] || !s->v[il])
                return lt_fail(LT_ERR_NOMEM, "out of memory for a session");
            lt_format_name(s->k[il], "cache_k-%d", il);
            lt_format_name(s->v[il], "cache_v-%d", il);
        }
    }
    size_t total = 0;
    struct lt_tensor *all[4];
    for (int il = 0; il < L; il++) {
        all[0] = s->k[il], all[1] = s->v[il], all[2] = s->conv[il], all[3] = s->ssm[il];
        for (int j = 0; j < 4; j++)
            total += all[j] ? (lt_nbytes(all[j]) + 255) & ~(size_t)255 : 0;
    }
    lt_status st = lt_backend_buffer_alloc(s->be[0], total ? total : 256, &s->buffer);
    if (st != LT_OK)
        return st;
    size_t at = 0;
    for (int il = 0; il < L && st == LT_OK; il++) {
        all[0] = s->k[il], all[1] = s->v[il], all[2] = s->conv[il], all[3] = s->ssm[il];
        for (int j = 0; j < 4 && st == LT_OK; j++) {
            if (!all[j])
                continue;
            all[j]->buffer = s->buffer;
            all[j]->data = (char *)s->buffer->base + at;
            at += (lt_nbytes(all[j]) + 255) & ~(size_t)255;
            st = zero_tensor_range(all[j], 0, lt_nbytes(all[j]));
        }
    }
    return st;
}

lt_status lt_session_new(const struct lt_model *m, const struct lt_session_params *params,
                         struct lt_session **out)
{
    *out = NULL;
    if (params->n_ctx < 1 || params->n_seq_max < 1)
        return lt_fail(LT_ERR_INVALID, "a session needs n_ctx >= 1 and n_seq_max >= 1 (got %d, %d)",
                       params->n_ctx, params->n_seq_max);
    if (params->kv_type != LT_TYPE_F32 && params->kv_type != LT_TYPE_F16)
        return lt_fail(LT_ERR_INVALID, "KV cache type %s; f32 and f16 are supported",
                       lt_type_name(params->kv_type));
    if (params->backends && (params->n_backends < 1 || params->n_backends > LT_SCHED_MAX_BACKENDS))
        return lt_fail(LT_ERR_INVALID, "a session takes 1 to %d backends", LT_SCHED_MAX_BACKENDS);
    struct lt_session *s = calloc(1, sizeof(*s));
    if (!s)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a session");
    lt_status st;
    s->m = m;
    s->p = *params;
    if (params->backends) {
        for (int i = 0; i < params->n_backends; i++)
            s->be[i] = params->backends[i];
        s->n_be = params->n_backends;
    } else {
        s->own_cpu = lt_backend_cpu_new(params->n_threads);
        if (!s->own_cpu) {
            st = lt_fail(LT_ERR_NOMEM, "cannot start the CPU backend");
            goto out_free;
        }
        s->be[0] = s->own_cpu;
        s->n_be = 1;
    }
    s->p.backends = NULL;
    /* a device's prefill takes FLASH_ATTN by default (LATHE_FLASH_ATTN=0 keeps the chain) */
    s->flash = lt_model_flash_attn_on(m, s->be[0], !s->be[0]->is_host);
    s->sched = lt_sched_new(s->be, s->n_be);
    if (!s->sched) {
        st = LT_ERR_NOMEM;
        goto out_free;
    }
    if ((st = alloc_state(s)) != LT_OK)
        goto out_free;
    *out = s;
    return LT_OK;
out_free:
    lt_session_free(s);
    return st;
}

static void plan_free(struct decode_plan *pl)
{
    if (!pl)
        return;
    lt_sched_free(pl->sched);
    lt_ctx_free(pl->b.ctx);
    free(pl);
}

void lt_session_free(struct lt_session *s)
{
    if (!s)
        return;
    for (int i = 0; i < DECODE_PLANS; i++)
        plan_free(s->plans[i]);
    lt_sched_free(s->sched);
    if (s->buffer)
        lt_buffer_free(s->buffer);
    lt_ctx_free(s->ctx);
    free(s->k);
    free(s->v);
    free(s->conv);
    free(s->ssm);
    free(s->pos);
    if (s->own_cpu)
        lt_backend_free(s->own_cpu);
    free(s);
}

int lt_session_seq_pos(const struct lt_session *s, int seq)
{
    return seq >= 0 && seq < s->p.n_seq_max ? s->pos[seq] : -1;
}

lt_status lt_session_seq_clear(struct lt_session *s, int seq)
{
    if (seq < 0 || seq >= s->p.n_seq_max)
        return lt_fail(LT_ERR_INVALID, "sequence %d of a session of %d", seq, s->p.n_seq_max);
    lt_status st = LT_OK;
    for (int il = 0; il < s->m->hp.n_layer && st == LT_OK; il++) {
        if (!s->conv[il])
            continue;
        st = zero_tensor_range(s->conv[il], (size_t)seq * s->conv[il]->nb[2], s->conv[il]->nb[2]);
        if (st == LT_OK)
            st = zero_tensor_range(s->ssm[il], (size_t)seq * s->ssm[il]->nb[3], s->ssm[il]->nb[3]);
    }
    s->pos[seq] = 0;
    return st;
}

/* ---- hooks ---- */

static lt_status add_to_graph(struct lt_mb *b, struct lt_tensor *t, const char *what, int il)
{
    lt_status st = lt_mb_check(t, what, il);
    return st ? st : lt_graph_build(b->g, t);
}

/* cpy(src, dst), added to the graph now so that it runs before later readers of dst. */
static lt_status store(struct lt_mb *b, struct lt_tensor *src, struct lt_tensor *dst,
                       const char *what, int il, int seq)
{
    struct lt_tensor *c = dst ? lt_cpy(b->ctx, src, dst) : NULL;
    if (c)
        lt_format_name(c, "%s-%d (seq %d)", what, il, seq);
    return add_to_graph(b, c, what, il);
}

/* [D, Hkv, T, 1] of cache (k or v) at sequence seq, positions p..p+T-1. */
static struct lt_tensor *kv_slot(struct lt_mb *b, struct lt_tensor *cache, int seq, int p, int T)
{
    return lt_view_4d(b->ctx, cache, cache->ne[0], cache->ne[1], T, 1, cache->nb[1], cache->nb[2],
                      cache->nb[3], (size_t)seq * cache->nb[3] + (size_t)p * cache->nb[2]);
}

/* The slot of sequence seq in a state whose axis `ax` (2: conv, 3: ssm) is the sequence. */
static struct lt_tensor *state_slot(struct lt_mb *b, struct lt_tensor *state, int ax, int seq)
{
    if (ax == 3)
        return lt_view_4d(b->ctx, state, state->ne[0], state->ne[1], state->ne[2], 1, state->nb[1],
                          state->nb[2], state->nb[3], (size_t)seq * state->nb[3]);
    return lt_view_3d(b->ctx, state, state->ne[0], state->ne[1], 1, state->nb[1], state->nb[2],
                      (size_t)seq * state->nb[2]);
}

/* Rows [0, n_per_seq) of every sequence's slot (slots are `stride` bytes apart), gathered
 * for the batch's sequences: F32 [n_per_seq, n]. */
static struct lt_tensor *gather(struct lt_mb *b, struct step *sp, struct lt_tensor *storage,
                                int64_t n_per_seq, size_t stride)
{
    struct lt_tensor *rows = lt_view_2d(b->ctx, storage, n_per_seq, sp->s->p.n_seq_max, stride, 0);
    return rows ? lt_get_rows(b->ctx, rows, sp->seq_ids) : NULL;
}

/* New keys or values [D, Hkv, T, S] as [D, Hkv, T * S], one token a slice (v may be a view
 * of a joint product's rows); NULL when the tokens are not evenly spaced. */
static struct lt_tensor *token_slices(struct lt_mb *b, struct lt_tensor *t)
{
    size_t step = t->ne[2] == 1 ? t->nb[3] : t->nb[2];
    if (t->ne[2] > 1 && t->ne[3] > 1 && t->nb[3] != t->nb[2] * (size_t)t->ne[2])
        return NULL;
    return lt_view_3d(b->ctx, t, t->ne[0], t->ne[1], t->ne[2] * t->ne[3], t->nb[1], step, 0);
}

static lt_status hook_attn_kv(struct lt_mb *b, int il, struct lt_tensor *k_new,
                              struct lt_tensor *v_new, struct lt_mb_layer_state *ls)
{
    struct step *sp = b->hooks->user;
    struct lt_session *s = sp->s;
    struct lt_tensor *kc = s->k[il], *vc = s->v[il];
    int64_t D = kc->ne[0], Hkv = kc->ne[1];
    lt_status st;
    /* the new keys and values one token a slice, for SET_ROWS (NULL: not evenly spaced) */
    struct lt_tensor *k3 = sp->kept || sp->batch ? token_slices(b, k_new) : NULL;
    struct lt_tensor *v3 = sp->kept || sp->batch ? token_slices(b, v_new) : NULL;
    if (!sp->decode && !sp->batch) {
        int T = sp->n;
        if ((st = store(b, k_new, kv_slot(b, kc, sp->seq, sp->p0, T), "k_store", il, sp->seq)) ||
            (st = store(b, v_new, kv_slot(b, vc, sp->seq, sp->p0, T), "v_store", il, sp->seq)))
            return st;
        ls->k = kv_slot(b, kc, sp->seq, 0, sp->p0 + T);
        ls->v = kv_slot(b, vc, sp->seq, 0, sp->p0 + T);
    } else if (sp->kept || (k3 && v3)) {
        /* every token at once, at the cache rows kv_rows names (a batch's padding at -1,
         * which stores nothing): the caches as rows of one position, [D * Hkv, n_ctx *
         * n_seq_max] */
        if (sp->kept && b->n_tokens == 1 && b->fused) {
            /* the kept step's ATTN_DECODE stores this token's K and V at (pos, slot) itself,
             * the rows kv_rows would name */
            ls->k_cache = kc;
            ls->v_cache = vc;
            ls->seq_ids = sp->seq_ids;
            ls->kv_to_attn = true;
            return LT_OK;
        }
        int64_t rows = kc->ne[2] * kc->ne[3];
        struct lt_tensor *kr = lt_view_2d(b->ctx, kc, D * Hkv, rows, kc->nb[2], 0);
        struct lt_tensor *vr = lt_view_2d(b->ctx, vc, D * Hkv, rows, vc->nb[2], 0);
        struct lt_tensor *ks = k3 && kr ? lt_set_rows(b->ctx, k3, kr, sp->kv_rows) : NULL;
        struct lt_tensor *vs = v3 && vr ? lt_set_rows(b->ctx, v3, vr, sp->kv_rows) : NULL;
        if (ks)
            lt_format_name(ks, "k_store-%d", il);
        if (vs)
            lt_format_name(vs, "v_store-%d", il);
        if ((st = add_to_graph(b, ks, "k_store", il)) || (st = add_to_graph(b, vs, "v_store", il)))
            return st;
        if (sp->kept) {
            ls->k_cache = kc;
            ls->v_cache = vc;
            ls->seq_ids = sp->seq_ids;
        }
    } else { /* each sequence's own tokens (a batch's padding is not stored) */
        for (int i = 0; i < sp->n; i++) {
            int seq = sp->seqs[i], p = s->pos[seq], len = sp->batch ? sp->lens[i] : 1;
            struct lt_tensor *ki = lt_view_4d(b->ctx, k_new, D, Hkv, len, 1, k_new->nb[1],
                                              k_new->nb[2], k_new->nb[3], (size_t)i * k_new->nb[3]);
            struct lt_tensor *vi = lt_view_4d(b->ctx, v_new, D, Hkv, len, 1, v_new->nb[1],
                                              v_new->nb[2], v_new->nb[3], (size_t)i * v_new->nb[3]);
            if ((st = lt_mb_check(ki && vi ? ki : NULL, "Kcur", il)) ||
                (st = store(b, ki, kv_slot(b, kc, seq, p, len), "k_store", il, seq)) ||
                (st = store(b, vi, kv_slot(b, vc, seq, p, len), "v_store", il, seq)))
                return st;
        }
    }
    if (sp->decode || sp->batch) {
        struct lt_tensor *k = gather(b, sp, kc, D * Hkv * sp->n_kv, kc->nb[3]);
        struct lt_tensor *v = gather(b, sp, vc, D * Hkv * sp->n_kv, vc->nb[3]);
        k = k ? lt_format_name(lt_reshape_4d(b->ctx, k, D, Hkv, sp->n_kv, sp->n), "k_cached-%d", il)
              : NULL;
        v = v ? lt_format_name(lt_reshape_4d(b->ctx, v, D, Hkv, sp->n_kv, sp->n), "v_cached-%d", il)
              : NULL;
        ls->k = k;
        ls->v = v;
    }
    if ((st = lt_mb_check(ls->k, "k_cached", il)) || (st = lt_mb_check(ls->v, "v_cached", il)))
        return st;
    return LT_OK;
}

static lt_status hook_recr_load(struct lt_mb *b, int il, struct lt_mb_layer_state *ls)
{
    struct step *sp = b->hooks->user;
    struct lt_session *s = sp->s;
    struct lt_tensor *cs = s->conv[il], *ss = s->ssm[il];
    /* a sequence's first prefill carries no conv inputs in: zeros (NULL), so the layer may
     * take CONV_SILU over the projection as it lies */
    const bool fresh = !sp->decode && !sp->batch && sp->p0 == 0;
    if (!sp->decode && !sp->batch) {
        ls->conv = fresh ? NULL : state_slot(b, cs, 2, sp->seq);
        ls->ssm = state_slot(b, ss, 3, sp->seq);
    } else {
        if (sp->kept) {
            ls->conv_cache = cs;
            ls->ssm_cache = ss;
            ls->seq_ids = sp->seq_ids;
        }
        struct lt_tensor *c = gather(b, sp, cs, cs->ne[0] * cs->ne[1], cs->nb[2]);
        struct lt_tensor *r = gather(b, sp, ss, ss->ne[0] * ss->ne[1] * ss->ne[2], ss->nb[3]);
        ls->conv = c ? lt_reshape_3d(b->ctx, c, cs->ne[0], cs->ne[1], sp->n) : NULL;
        ls->ssm = r ? lt_reshape_4d(b->ctx, r, ss->ne[0], ss->ne[1], ss->ne[2], sp->n) : NULL;
    }
    lt_status st;
    if ((!fresh && (st = lt_mb_check(ls->conv, "conv_state", il))) ||
        (st = lt_mb_check(ls->ssm, "state", il)))
        return st;
    if (ls->conv)
        lt_format_name(ls->conv, "conv_state-%d", il);
    lt_format_name(ls->ssm, "state_predelta-%d", il);
    return LT_OK;
}

static lt_status hook_recr_store(struct lt_mb *b, int il, struct lt_tensor *conv_new,
                                 struct lt_tensor *ssm_new)
{
    struct step *sp = b->hooks->user;
    struct lt_session *s = sp->s;
    lt_status st;
    if (sp->kept || sp->batch) {
        if (!conv_new && !ssm_new)
            return LT_OK; /* GDN_DECODE wrote both caches itself */
        /* each sequence's states at its slot seq_ids[i], one SET_ROWS each; a padded batch's
         * conv states (each at its own end) one copy a sequence */
        struct lt_tensor *cs = s->conv[il], *ss = s->ssm[il];
        struct lt_tensor *cr = lt_view_2d(b->ctx, cs, cs->ne[0] * cs->ne[1], cs->ne[2], cs->nb[2], 0);
        struct lt_tensor *sr =
            lt_view_2d(b->ctx, ss, ss->ne[0] * ss->ne[1] * ss->ne[2], ss->ne[3], ss->nb[3], 0);
        struct lt_tensor *keep = conv_new; /* [d_conv - 1, C, n] */
        if (b->tok_mask) {
            /* a padded batch hands over the whole conv input [d_conv - 1 + T, C, n]: each
             * sequence's steps conv_rows gathered (time as rows), then back to time innermost */
            struct lt_tensor *steps =
                lt_get_rows(b->ctx, lt_transpose(b->ctx, conv_new), sp->conv_rows);
            keep = steps ? lt_transpose(b->ctx, steps) : NULL;
        }
        struct lt_tensor *cw = cr && keep ? lt_set_rows(b->ctx, keep, cr, sp->seq_ids) : NULL;
        if (cw)
            lt_format_name(cw, "conv_store-%d", il);
        if ((st = add_to_graph(b, cw, "conv_store", il)))
            return st;
        if (!ssm_new)
            return LT_OK; /* GDN_DECODE wrote the ssm cache itself */
        struct lt_tensor *s3 = lt_is_contiguous(ssm_new) ? ssm_new : lt_cont(b->ctx, ssm_new);
        s3 = s3 ? lt_reshape_3d(b->ctx, s3, ss->ne[0], ss->ne[1] * ss->ne[2], sp->n) : NULL;
        struct lt_tensor *sw = sr && s3 ? lt_set_rows(b->ctx, s3, sr, sp->seq_ids) : NULL;
        if (sw)
            lt_format_name(sw, "state_store-%d", il);
        return add_to_graph(b, sw, "state_store", il);
    }
    int n = sp->decode ? sp->n : 1;
    for (int i = 0; i < n; i++) {
        int seq = sp->decode ? sp->seqs[i] : sp->seq;
        struct lt_tensor *ci =
            lt_view_3d(b->ctx, conv_new, conv_new->ne[0], conv_new->ne[1], 1, conv_new->nb[1],
                       conv_new->nb[2], (size_t)i * conv_new->nb[2]);
        struct lt_tensor *si =
            lt_view_4d(b->ctx, ssm_new, ssm_new->ne[0], ssm_new->ne[1], ssm_new->ne[2], 1,
                       ssm_new->nb[1], ssm_new->nb[2], ssm_new->nb[3], (size_t)i * ssm_new->nb[3]);
        if (!ci || !si)
            return lt_mb_check(NULL, "state_store", il);
        if ((st = store(b, ci, state_slot(b, s->conv[il], 2, seq), "conv_store", il, seq)) ||
            (st = store(b, si, state_slot(b, s->ssm[il], 3, seq), "state_store", il, seq)))
            return st;
    }
    return LT_OK;
}

/* ---- running a step ---- */

static lt_status set_i32(struct lt_tensor *t, const int32_t *v, int64_t n)
{
    return lt_tensor_set(t, v, 0, sizeof(int32_t) * (size_t)n);
}

static struct lt_tensor *input(struct lt_tensor *t, const char *name)
{
    return t ? lt_set_name(t, name) : NULL;
}

/* Builds the graph of one step into bt (its own context); logits [n_out, n_vocab]. */
static lt_status build_step(struct step *sp, bool all_logits, struct built *bt)
{
    struct lt_session *s = sp->s;
    const struct lt_model *m = s->m;
    int64_t T = sp->decode ? 1 : sp->batch ? sp->T : sp->n;
    int64_t S = sp->decode || sp->batch ? sp->n : 1, N = T * S;
    int64_t L = m->hp.n_layer;
    lt_status st;
    *bt = (struct built){0};
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){
        .mem_size = (size_t)(L * (160 + 12 * S) + 256) * sizeof(struct lt_tensor),
        .no_alloc = true});
    if (!ctx)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a graph");
    bt->ctx = ctx;
    int cap = (int)(L * (128 + 8 * S) + 256);
    bt->g = lt_graph_new(ctx, cap);
    bt->tok = input(lt_new_tensor_2d(ctx, LT_TYPE_I32, T, S), "inp_tokens");
    bt->pos = input(lt_new_tensor_1d(ctx, LT_TYPE_I32, N), "inp_pos");
    bool ok = bt->g && bt->tok && bt->pos;
    if (sp->decode || sp->batch) {
        bt->seq_ids = sp->seq_ids = input(lt_new_tensor_1d(ctx, LT_TYPE_I32, S), "inp_seq_ids");
        bt->mask = input(lt_new_tensor_4d(ctx, LT_TYPE_F32, sp->n_kv, T, 1, S), "kq_mask");
        ok = ok && bt->seq_ids && bt->mask;
        if (sp->batch) {
            bt->last = sp->last = input(lt_new_tensor_1d(ctx, LT_TYPE_I32, S), "inp_last");
            bt->kv_rows = sp->kv_rows = input(lt_new_tensor_1d(ctx, LT_TYPE_I32, N), "inp_kv_rows");
            ok = ok && bt->last && bt->kv_rows;
            for (int64_t i = 0; i < S; i++)
                if (sp->lens[i] < T) { /* padding */
                    const int64_t K1 = m->hp.ssm_d_conv > 1 ? m->hp.ssm_d_conv - 1 : 1;
                    bt->tok_mask =
                        input(lt_new_tensor_3d(ctx, LT_TYPE_F32, 1, T, S), "inp_tok_mask");
                    bt->conv_rows = sp->conv_rows =
                        input(lt_new_tensor_2d(ctx, LT_TYPE_I32, K1, S), "inp_conv_rows");
                    ok = ok && bt->tok_mask && bt->conv_rows;
                    break;
                }
        }
        if (sp->kept) {
            bt->kv_rows = sp->kv_rows =
                input(lt_new_tensor_1d(ctx, LT_TYPE_I32, S), "inp_kv_rows");
            ok = ok && bt->kv_rows;
        }
    }
    if (!ok)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a graph");
    struct lt_mb_hooks hooks = {sp, hook_attn_kv, hook_recr_load, hook_recr_store};
    struct lt_mb b = {
        .m = m,
        .ctx = ctx,
        .g = bt->g,
        .ad = s->p.adapters,
        .n_tokens = T,
        .n_seqs = S,
        .pos = bt->pos,
        .kq_mask = bt->mask,
        .tok_mask = bt->tok_mask,
        .causal = !sp->decode && !sp->batch,
        .half_acts = N > 8 && (s->p.half_acts > 0 || (s->p.half_acts == 0 && !s->be[0]->is_host)),
        .flash = T > 1 && !sp->decode && s->flash,
        .fused = true,
        .hooks = &hooks};
    struct lt_tensor *hidden;
    if ((st = lt_mb_forward(&b, bt->tok, &hidden)) != LT_OK)
        return st;
    bt->n_out = all_logits ? N : S;
    bt->n_col = m->hp.n_vocab;
    if (sp->hidden) { /* the tensor the head would read, every position */
        bt->n_out = N;
        bt->n_col = m->hp.n_embd;
        bt->logits = hidden;
        if ((st = lt_mb_check(bt->logits, "result_norm", -1)) != LT_OK)
            return st;
        if (hidden->type != LT_TYPE_F32 || !lt_is_contiguous(hidden))
            return lt_fail(LT_ERR_INVALID, "result_norm is not contiguous F32");
        bt->logits->flags |= LT_FLAG_OUTPUT;
        return lt_graph_build(bt->g, bt->logits);
    }
    if (sp->batch && !all_logits) /* each sequence's last token */
        hidden = lt_get_rows(ctx, hidden, bt->last);
    else if (!all_logits && !sp->decode)
        hidden = lt_view_2d(ctx, hidden, hidden->ne[0], 1, hidden->nb[1],
                            (size_t)(T - 1) * hidden->nb[1]);
    bt->logits = hidden ? lt_mb_logits(&b, hidden) : NULL;
    if ((st = lt_mb_check(bt->logits, "result_output", -1)) != LT_OK)
        return st;
    bt->logits->flags |= LT_FLAG_OUTPUT;
    if ((st = lt_graph_build(bt->g, bt->logits)) != LT_OK || !sp->decode || s->p.pick_vocab <= 0)
        return st;
    /* each row's greedy pick, where the logits are */
    int64_t nv = s->p.pick_vocab < bt->n_col ? s->p.pick_vocab : bt->n_col;
    bt->pick = lt_argmax(ctx, bt->logits, nv);
    if ((st = lt_mb_check(bt->pick, "pick", -1)) != LT_OK)
        return st;
    bt->pick->flags |= LT_FLAG_OUTPUT;
    return lt_graph_build(bt->g, lt_set_name(bt->pick, "pick"));
}

/* Sets the inputs of a built step (placed and allocated). tokens: [N] (a batch: [T, n],
 * padded). */
static lt_status set_inputs(struct step *sp, const struct built *bt, const int32_t *tokens)
{
    struct lt_session *s = sp->s;
    /* decode: one token a sequence; a batch: T a sequence */
    int64_t S = sp->decode || sp->batch ? sp->n : 1, T = sp->batch ? sp->T : sp->decode ? 1 : sp->n;
    int64_t N = T * S;
    /* the mask only when a node reads it (a kept step reading the cache itself does not) */
    int64_t n_mask = (sp->decode || sp->batch) && bt->mask->data ? (int64_t)sp->n_kv * N : 0;
    /* the I32 inputs' values, the longest first: the columns' N, or the conv rows */
    int64_t n_iv = bt->conv_rows && bt->conv_rows->ne[0] * S > N ? bt->conv_rows->ne[0] * S : N;
    int32_t *iv = malloc(sizeof(int32_t) * (size_t)n_iv);
    /* the F32 inputs' values: the mask, or a padded batch's token mask */
    const bool need_mv = n_mask > 0 || (bt->tok_mask && bt->tok_mask->data);
    float *mv = need_mv ? malloc(sizeof(float) * (size_t)(n_mask > N ? n_mask : N)) : NULL;
    lt_status st = LT_OK;
    if (!iv || (need_mv && !mv)) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory for inputs");
        goto out;
    }
    /* an input no node reads has no storage (the mask, when every attention layer reads
     * the cache itself): it is not set */
    if ((st = set_i32(bt->tok, tokens, N)) != LT_OK)
        goto out;
    /* column t of sequence i: position p0 + t (a padding column goes on counting) */
    for (int64_t i = 0; i < S; i++)
        for (int64_t t = 0; t < T; t++)
            iv[i * T + t] =
                sp->decode || sp->batch ? s->pos[sp->seqs[i]] + (int32_t)t : sp->p0 + (int32_t)t;
    if ((st = set_i32(bt->pos, iv, N)) != LT_OK || (!sp->decode && !sp->batch))
        goto out;
    /* a column attends up to its own position; padding as its sequence's last token */
    for (int64_t i = 0; i < S; i++) {
        int p0 = s->pos[sp->seqs[i]], len = sp->batch ? sp->lens[i] : 1;
        iv[i] = sp->seqs[i];
        for (int64_t t = 0; t < (n_mask ? T : 0); t++) {
            int64_t upto = p0 + (t < len ? t : len - 1);
            for (int64_t j = 0; j < sp->n_kv; j++)
                mv[(i * T + t) * sp->n_kv + j] = j <= upto ? 0.0f : -INFINITY;
        }
    }
    if ((bt->seq_ids->data && (st = set_i32(bt->seq_ids, iv, S)) != LT_OK) ||
        (n_mask && (st = lt_tensor_set(bt->mask, mv, 0, sizeof(float) * (size_t)n_mask)) != LT_OK))
        goto out;
    if (bt->kv_rows && bt->kv_rows->data) { /* cache row of each column; padding: none */
        for (int64_t i = 0; i < S; i++)
            for (int64_t t = 0; t < T; t++)
                iv[i * T + t] = t < (sp->batch ? sp->lens[i] : 1)
                                    ? sp->seqs[i] * s->p.n_ctx + s->pos[sp->seqs[i]] + (int32_t)t
                                    : -1;
        st = set_i32(bt->kv_rows, iv, N);
    }
    if (st == LT_OK && bt->last && bt->last->data) {
        for (int64_t i = 0; i < S; i++)
            iv[i] = (int32_t)(i * T + sp->lens[i] - 1);
        st = set_i32(bt->last, iv, S);
    }
    if (st == LT_OK && bt->conv_rows && bt->conv_rows->data) {
        const int64_t K1 = bt->conv_rows->ne[0];
        for (int64_t i = 0; i < S; i++)
            for (int64_t k = 0; k < K1; k++)
                iv[i * K1 + k] = sp->lens[i] + (int32_t)k;
        st = set_i32(bt->conv_rows, iv, K1 * S);
    }
    if (st == LT_OK && bt->tok_mask && bt->tok_mask->data) {
        for (int64_t i = 0; i < S; i++)
            for (int64_t t = 0; t < T; t++)
                mv[i * T + t] = t < sp->lens[i] ? 1.0f : 0.0f;
        st = lt_tensor_set(bt->tok_mask, mv, 0, sizeof(float) * (size_t)N);
    }
out:
    free(iv);
    free(mv);
    return st;
}

/* Runs a placed and allocated step; its logits go to out (may be NULL). */
static lt_status compute_step(struct step *sp, struct lt_sched *sched, const struct built *bt,
                              const int32_t *tokens, float *out)
{
    lt_status st = set_inputs(sp, bt, tokens);
    if (st == LT_OK)
        st = lt_sched_compute(sched, bt->g);
    if (st == LT_OK && sp->ids)
        st = bt->pick ? lt_tensor_get(bt->pick, sp->ids, 0, sizeof(int32_t) * (size_t)bt->n_out)
                      : lt_fail(LT_ERR_INVALID, "the session picks no tokens (pick_vocab 0)");
    if (st != LT_OK || !out)
        return st;
    const size_t row = sizeof(float) * (size_t)bt->n_col;
    if (!sp->want)
        return lt_tensor_get(bt->logits, out, 0, row * (size_t)bt->n_out);
    /* the wanted rows, packed: each run of them one copy */
    size_t j = 0;
    for (int64_t r = 0; r < bt->n_out && st == LT_OK;) {
        int64_t e = r;
        while (e < bt->n_out && sp->want[e])
            e++;
        if (e > r) {
            st = lt_tensor_get(bt->logits, (char *)out + j * row, (size_t)r * row,
                               (size_t)(e - r) * row);
            j += (size_t)(e - r);
            r = e;
        } else
            r++;
    }
    return st;
}

/* Builds, runs and frees the graph of one step; logits [n_out, n_vocab] go to out. */
static lt_status run_step(struct step *sp, const int32_t *tokens, bool all_logits, float *out)
{
    struct lt_session *s = sp->s;
    struct built bt;
    lt_status st = build_step(sp, all_logits, &bt);
    if (st == LT_OK && (st = lt_sched_place(s->sched, bt.g, false, NULL)) == LT_OK &&
        (st = lt_sched_alloc(s->sched, bt.g)) == LT_OK)
        st = compute_step(sp, s->sched, &bt, tokens, out);
    /* keep the buffers for the next call; forget this call's graph before freeing it */
    lt_sched_reset(s->sched);
    lt_ctx_free(bt.ctx);
    return st;
}

/* *out: the kept step for sp's batch size and window, or a new one (built, placed and
 * allocated) in a free slot or the least recently used one's. */
static lt_status plan_for(struct step *sp, struct decode_plan **out)
{
    struct lt_session *s = sp->s;
    int k = -1;
    for (int i = 0; i < DECODE_PLANS; i++) {
        struct decode_plan *pl = s->plans[i];
        if (pl && pl->n == sp->n && (pl->any_window || pl->n_kv == sp->n_kv)) {
            *out = pl;
            return LT_OK;
        }
        if (!pl && k < 0)
            k = i;
    }
    if (k < 0) { /* every slot holds a plan: the least recently used goes */
        k = 0;
        for (int i = 1; i < DECODE_PLANS; i++)
            k = s->plans[i]->last_used < s->plans[k]->last_used ? i : k;
    }
    plan_free(s->plans[k]);
    struct decode_plan *pl = calloc(1, sizeof(*pl));
    s->plans[k] = pl;
    lt_status st = pl && (pl->sched = lt_sched_new(s->be, s->n_be))
                       ? LT_OK
                       : lt_fail(LT_ERR_NOMEM, "out of memory for a decode step");
    if (st == LT_OK) {
        pl->n = sp->n;
        pl->n_kv = sp->n_kv;
        st = build_step(sp, true, &pl->b);
    }
    if (st == LT_OK)
        st = lt_sched_place(pl->sched, pl->b.g, false, NULL);
    if (st == LT_OK)
        st = lt_sched_alloc(pl->sched, pl->b.g);
    if (st != LT_OK) {
        plan_free(pl);
        s->plans[k] = NULL;
        return st;
    }
    pl->any_window = !pl->b.mask->data;
    *out = pl;
    return LT_OK;
}

/* A decode step through a kept plan. A failure drops the plan: the next call builds it
 * again. */
static lt_status run_kept(struct step *sp, const int32_t *tokens, float *out)
{
    struct lt_session *s = sp->s;
    int n_kv = (sp->n_kv + DECODE_KV_STEP - 1) / DECODE_KV_STEP * DECODE_KV_STEP;
    sp->n_kv = n_kv < s->p.n_ctx ? n_kv : s->p.n_ctx;
    sp->kept = true;
    struct decode_plan *pl = NULL;
    lt_status st = plan_for(sp, &pl);
    if (st != LT_OK)
        return st;
    pl->last_used = ++s->clock;
    sp->n_kv = pl->n_kv; /* the mask's size (unread when any window will do) */
    st = compute_step(sp, pl->sched, &pl->b, tokens, out);
    for (int i = 0; st != LT_OK && i < DECODE_PLANS; i++)
        if (s->plans[i] == pl) {
            plan_free(pl);
            s->plans[i] = NULL;
        }
    return st;
}

lt_status lt_session_warmup(struct lt_session *s)
{
    if (s->pos[0] != 0)
        return lt_fail(LT_ERR_INVALID, "warm-up needs sequence 0 empty (it holds %d tokens)",
                       s->pos[0]);
    int n = s->p.n_ctx - 1 < 64 ? s->p.n_ctx - 1 : 64;
    int32_t tokens[64] = {0};
    const int seq = 0;
    lt_status st = n > 0 ? lt_session_prefill(s, 0, tokens, n, false, NULL) : LT_OK;
    if (st == LT_OK)
        st = lt_session_decode(s, 1, &seq, tokens, NULL);
    lt_status cl = lt_session_seq_clear(s, 0);
    return st != LT_OK ? st : cl;
}

static lt_status check_tokens(const struct lt_session *s, const int32_t *tokens, int n)
{
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->m->hp.n_vocab)
            return lt_fail(LT_ERR_INVALID, "token %d (%d of %d) is outside the vocabulary of %lld",
                           tokens[i], i, n, (long long)s->m->hp.n_vocab);
    return LT_OK;
}

static lt_status prefill(struct lt_session *s, int seq, const int32_t *tokens, int n,
                         bool all_logits, bool hidden, float *out)
{
    if (seq < 0 || seq >= s->p.n_seq_max)
        return lt_fail(LT_ERR_INVALID, "sequence %d of a session of %d", seq, s->p.n_seq_max);
    if (n < 1)
        return lt_fail(LT_ERR_INVALID, "prefill of %d tokens", n);
    if (s->pos[seq] + n > s->p.n_ctx)
        return lt_fail(LT_ERR_INVALID, "sequence %d: %d + %d tokens exceed the context of %d", seq,
                       s->pos[seq], n, s->p.n_ctx);
    lt_status st = check_tokens(s, tokens, n);
    if (st != LT_OK)
        return st;
    struct step sp = {.s = s, .seq = seq, .p0 = s->pos[seq], .n = n, .hidden = hidden};
    st = run_step(&sp, tokens, all_logits, out);
    if (st == LT_OK)
        s->pos[seq] += n;
    return st;
}

lt_status lt_session_prefill(struct lt_session *s, int seq, const int32_t *tokens, int n,
                             bool all_logits, float *logits)
{
    return prefill(s, seq, tokens, n, all_logits, false, logits);
}

lt_status lt_session_prefill_hidden(struct lt_session *s, int seq, const int32_t *tokens, int n,
                                    float *hidden)
{
    return prefill(s, seq, tokens, n, true, true, hidden);
}

/* Sequences for a step of n: in range and distinct. */
static lt_status check_seqs(const struct lt_session *s, int n, const int *seqs, const char *what)
{
    if (n < 1 || n > s->p.n_seq_max)
        return lt_fail(LT_ERR_INVALID, "%s of %d sequences in a session of %d", what, n,
                       s->p.n_seq_max);
    for (int i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= s->p.n_seq_max)
            return lt_fail(LT_ERR_INVALID, "sequence %d of a session of %d", seqs[i],
                           s->p.n_seq_max);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return lt_fail(LT_ERR_INVALID, "sequence %d appears twice in one %s", seqs[i],
                               what);
    }
    return LT_OK;
}

lt_status lt_session_prefill_batch(struct lt_session *s, int n, const int *seqs,
                                   const int32_t *const *tokens, const int *lens, float *logits)
{
    lt_status st = check_seqs(s, n, seqs, "prefill");
    if (st != LT_OK)
        return st;
    int T = 0, n_kv = 0;
    for (int i = 0; i < n; i++) {
        int p = s->pos[seqs[i]];
        if (lens[i] < 1)
            return lt_fail(LT_ERR_INVALID, "prefill of %d tokens (sequence %d)", lens[i], seqs[i]);
        if (p + lens[i] > s->p.n_ctx)
            return lt_fail(LT_ERR_INVALID, "sequence %d: %d + %d tokens exceed the context of %d",
                           seqs[i], p, lens[i], s->p.n_ctx);
        if ((st = check_tokens(s, tokens[i], lens[i])) != LT_OK)
            return st;
        T = lens[i] > T ? lens[i] : T;
        n_kv = p + lens[i] > n_kv ? p + lens[i] : n_kv;
    }
    if (n == 1) /* the one-sequence prefill, with no mask to build */
        return prefill(s, seqs[0], tokens[0], lens[0], false, false, logits);
    /* [T, n]: each sequence's tokens, then its last one again as padding */
    int32_t *cols = malloc(sizeof(int32_t) * (size_t)T * (size_t)n);
    if (!cols)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a prefill of %d x %d tokens", n, T);
    for (int i = 0; i < n; i++)
        for (int t = 0; t < T; t++)
            cols[(size_t)i * T + t] = tokens[i][t < lens[i] ? t : lens[i] - 1];
    struct step sp = {
        .s = s, .batch = true, .n = n, .seqs = seqs, .T = T, .lens = lens, .n_kv = n_kv};
    st = run_step(&sp, cols, false, logits);
    free(cols);
    if (st == LT_OK)
        for (int i = 0; i < n; i++)
            s->pos[seqs[i]] += lens[i];
    return st;
}

static lt_status decode(struct lt_session *s, int n, const int *seqs, const int32_t *tokens,
                        const bool *want, float *logits, int32_t *ids)
{
    lt_status st = check_seqs(s, n, seqs, "decode");
    if (st != LT_OK)
        return st;
    int n_kv = 0;
    for (int i = 0; i < n; i++) {
        if (s->pos[seqs[i]] >= s->p.n_ctx)
            return lt_fail(LT_ERR_INVALID, "sequence %d is full (%d tokens)", seqs[i], s->p.n_ctx);
        n_kv = s->pos[seqs[i]] + 1 > n_kv ? s->pos[seqs[i]] + 1 : n_kv;
    }
    if ((st = check_tokens(s, tokens, n)) != LT_OK)
        return st;
    struct step sp = {
        .s = s, .decode = true, .want = want, .ids = ids, .n = n, .seqs = seqs, .n_kv = n_kv};
    st = s->p.decode_rebuild ? run_step(&sp, tokens, true, logits) : run_kept(&sp, tokens, logits);
    if (st == LT_OK)
        for (int i = 0; i < n; i++)
            s->pos[seqs[i]]++;
    return st;
}

int lt_session_pick_vocab(const struct lt_session *s)
{
    return s->p.pick_vocab > 0 ? s->p.pick_vocab : 0;
}

lt_status lt_session_decode(struct lt_session *s, int n, const int *seqs, const int32_t *tokens,
                            float *logits)
{
    return decode(s, n, seqs, tokens, NULL, logits, NULL);
}

lt_status lt_session_decode_pick(struct lt_session *s, int n, const int *seqs,
                                 const int32_t *tokens, const bool *want, float *logits,
                                 int32_t *ids)
{
    if (s->p.pick_vocab <= 0)
        return lt_fail(LT_ERR_INVALID, "the session picks no tokens (pick_vocab 0)");
    return decode(s, n, seqs, tokens, want, logits, ids);
}
