/* test_model_util.h: tiny random GGUF models of each architecture, written with lathe's own
 * GGUF writer, and the full-sequence forward (the loss graph) run on the CPU, for the model
 * tests. Weights are random with norms near 1, so every tensor matters to the output. */
#ifndef LATHE_TESTS_MODEL_UTIL_H
#define LATHE_TESTS_MODEL_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/autodiff.h"
#include "lathe/gguf.h"
#include "lathe/model.h"
#include "lathe/sched.h"

struct tm_spec {
    const char *arch;
    int n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_rot;
    float rope_base, rms_eps;
    bool tied;
    /* qwen35 */
    int interval, d_conv, d_state, n_k_heads, n_v_heads, n_mtp;
    int d_v; /* value head dim; 0: d_state */
};

/* One small model per architecture: GQA everywhere, qwen2 untied with biases, qwen35 with
 * partial rope, grouped value heads and an MTP block the loader must skip. */
static const struct tm_spec tm_specs[] = {
    {.arch = "llama",
     .n_vocab = 40,
     .n_embd = 32,
     .n_ff = 48,
     .n_layer = 2,
     .n_head = 4,
     .n_head_kv = 2,
     .head_dim = 8,
     .n_rot = 8,
     .rope_base = 10000.0f,
     .rms_eps = 1e-5f,
     .tied = true},
    {.arch = "qwen2",
     .n_vocab = 40,
     .n_embd = 32,
     .n_ff = 48,
     .n_layer = 2,
     .n_head = 4,
     .n_head_kv = 1,
     .head_dim = 8,
     .n_rot = 8,
     .rope_base = 1e6f,
     .rms_eps = 1e-6f,
     .tied = false},
    {.arch = "qwen35",
     .n_vocab = 48,
     .n_embd = 32,
     .n_ff = 40,
     .n_layer = 4,
     .n_head = 2,
     .n_head_kv = 1,
     .head_dim = 16,
     .n_rot = 4,
     .rope_base = 1e4f,
     .rms_eps = 1e-6f,
     .tied = true,
     .interval = 2,
     .d_conv = 4,
     .d_state = 8,
     .n_k_heads = 2,
     .n_v_heads = 4,
     .n_mtp = 1},
    /* value heads wider than key heads, three DeltaNet layers per attention layer */
    {.arch = "qwen35",
     .n_vocab = 48,
     .n_embd = 32,
     .n_ff = 40,
     .n_layer = 4,
     .n_head = 4,
     .n_head_kv = 2,
     .head_dim = 8,
     .n_rot = 8,
     .rope_base = 1e4f,
     .rms_eps = 1e-6f,
     .tied = false,
     .interval = 4,
     .d_conv = 3,
     .d_state = 8,
     .n_k_heads = 1,
     .n_v_heads = 3,
     .d_v = 12},
};
#define TM_N_SPECS ((int)(sizeof(tm_specs) / sizeof(tm_specs[0])))

/* Largest |a - b| relative to b's largest magnitude (NaN counts as infinitely off). */
static inline double tm_rel_err(const float *a, const float *b, int n)
{
    double mx = 0, d = 0;
    for (int i = 0; i < n; i++) {
        mx = fabs(b[i]) > mx ? fabs(b[i]) : mx;
        double e = fabs((double)a[i] - b[i]);
        d = e > d || e != e ? e : d;
    }
    return d / (mx > 0 ? mx : 1);
}

static uint64_t tm_rng = 1;
static float tm_rand(void) /* uniform in [-1, 1) */
{
    tm_rng = tm_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((tm_rng >> 40) / 16777216.0) * 2.0f - 1.0f;
}

struct tm_writer {
    struct lt_gguf_writer *w;
    float *bufs[512];
    int n_bufs;
};

/* The type tm_write_model stores the projection matrices in (every matrix but the token
 * embedding and the DeltaNet conv kernel): F32, F16 or BF16. The values drawn are the same;
 * a half type rounds them. */
static enum lt_type tm_matrix_type = LT_TYPE_F32;

/* A random tensor: offset + scale * U(-1, 1), F32 (or tm_matrix_type, for a projection). */
static void tm_tensor(struct tm_writer *tw, const char *name, int64_t ne0, int64_t ne1, float scale,
                      float offset)
{
    int64_t n = ne0 * ne1;
    float *d = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        d[i] = offset + scale * tm_rand();
    tw->bufs[tw->n_bufs++] = d;
    int64_t ne[2] = {ne0, ne1};
    enum lt_type type = ne1 > 1 && !strstr(name, "token_embd") && !strstr(name, "conv1d")
                            ? tm_matrix_type
                            : LT_TYPE_F32;
    if (type != LT_TYPE_F32) { /* halves written over the first half of d */
        uint16_t *h = (uint16_t *)d;
        for (int64_t i = 0; i < n; i++)
            h[i] = type == LT_TYPE_BF16 ? lt_fp32_to_bf16(d[i]) : lt_fp32_to_fp16(d[i]);
    }
    lt_gguf_writer_add_tensor(tw->w, name, type, ne1 > 1 ? 2 : 1, ne, d,
                              lt_row_size(type, ne0) * (size_t)ne1);
}

static void tm_blk(struct tm_writer *tw, int il, const char *suffix, int64_t ne0, int64_t ne1,
                   float scale, float offset)
{
    char name[LT_MAX_NAME];
    snprintf(name, sizeof(name), "blk.%d.%s", il, suffix);
    tm_tensor(tw, name, ne0, ne1, scale, offset);
}

static void tm_key(struct tm_writer *tw, const struct tm_spec *s, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", s->arch, suffix);
    lt_gguf_writer_set_u32(tw->w, key, v);
}

/* Writes the model of spec s to path; LT_OK or the writer's failure. */
static lt_status tm_write_model(const struct tm_spec *s, const char *path, uint64_t seed)
{
    struct tm_writer tw = {.w = lt_gguf_writer_new()};
    bool q35 = !strcmp(s->arch, "qwen35"), qwen2 = !strcmp(s->arch, "qwen2");
    int E = s->n_embd, D = s->head_dim;
    tm_rng = seed;
    char key[96];
    lt_gguf_writer_set_str(tw.w, "general.architecture", s->arch);
    tm_key(&tw, s, "context_length", 4096);
    tm_key(&tw, s, "embedding_length", (uint32_t)E);
    tm_key(&tw, s, "block_count", (uint32_t)(s->n_layer + s->n_mtp));
    tm_key(&tw, s, "feed_forward_length", (uint32_t)s->n_ff);
    tm_key(&tw, s, "attention.head_count", (uint32_t)s->n_head);
    tm_key(&tw, s, "attention.head_count_kv", (uint32_t)s->n_head_kv);
    tm_key(&tw, s, "attention.key_length", (uint32_t)D);
    tm_key(&tw, s, "attention.value_length", (uint32_t)D);
    tm_key(&tw, s, "rope.dimension_count", (uint32_t)s->n_rot);
    snprintf(key, sizeof(key), "%s.rope.freq_base", s->arch);
    lt_gguf_writer_set_f32(tw.w, key, s->rope_base);
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", s->arch);
    lt_gguf_writer_set_f32(tw.w, key, s->rms_eps);
    int d_v = s->d_v ? s->d_v : s->d_state;
    int key_dim = s->d_state * s->n_k_heads, value_dim = d_v * s->n_v_heads;
    int C = 2 * key_dim + value_dim;
    if (q35) {
        tm_key(&tw, s, "full_attention_interval", (uint32_t)s->interval);
        tm_key(&tw, s, "ssm.conv_kernel", (uint32_t)s->d_conv);
        tm_key(&tw, s, "ssm.state_size", (uint32_t)s->d_state);
        tm_key(&tw, s, "ssm.group_count", (uint32_t)s->n_k_heads);
        tm_key(&tw, s, "ssm.time_step_rank", (uint32_t)s->n_v_heads);
        tm_key(&tw, s, "ssm.inner_size", (uint32_t)value_dim);
        if (s->n_mtp)
            tm_key(&tw, s, "nextn_predict_layers", (uint32_t)s->n_mtp);
    }
    float se = 1.0f / sqrtf((float)E);
    tm_tensor(&tw, "token_embd.weight", E, s->n_vocab, 1.0f, 0);
    tm_tensor(&tw, "output_norm.weight", E, 1, 0.2f, 1.0f);
    if (!s->tied)
        tm_tensor(&tw, "output.weight", E, s->n_vocab, se, 0);
    for (int il = 0; il < s->n_layer; il++) {
        tm_blk(&tw, il, "attn_norm.weight", E, 1, 0.2f, 1.0f);
        tm_blk(&tw, il, q35 ? "post_attention_norm.weight" : "ffn_norm.weight", E, 1, 0.2f, 1.0f);
        tm_blk(&tw, il, "ffn_gate.weight", E, s->n_ff, se, 0);
        tm_blk(&tw, il, "ffn_up.weight", E, s->n_ff, se, 0);
        tm_blk(&tw, il, "ffn_down.weight", s->n_ff, E, 1.0f / sqrtf((float)s->n_ff), 0);
        if (q35 && (il + 1) % s->interval != 0) {
            tm_blk(&tw, il, "attn_qkv.weight", E, C, se, 0);
            tm_blk(&tw, il, "attn_gate.weight", E, value_dim, se, 0);
            tm_blk(&tw, il, "ssm_beta.weight", E, s->n_v_heads, se, 0);
            tm_blk(&tw, il, "ssm_alpha.weight", E, s->n_v_heads, se, 0);
            tm_blk(&tw, il, "ssm_conv1d.weight", s->d_conv, C, 0.5f, 0);
            tm_blk(&tw, il, "ssm_dt.bias", s->n_v_heads, 1, 0.5f, 0);
            tm_blk(&tw, il, "ssm_a", s->n_v_heads, 1, 0.3f, -1.0f);
            tm_blk(&tw, il, "ssm_norm.weight", d_v, 1, 0.2f, 1.0f);
            tm_blk(&tw, il, "ssm_out.weight", value_dim, E, 1.0f / sqrtf((float)value_dim), 0);
            continue;
        }
        int q_rows = D * s->n_head * (q35 ? 2 : 1), kv_rows = D * s->n_head_kv;
        tm_blk(&tw, il, "attn_q.weight", E, q_rows, se, 0);
        tm_blk(&tw, il, "attn_k.weight", E, kv_rows, se, 0);
        tm_blk(&tw, il, "attn_v.weight", E, kv_rows, se, 0);
        tm_blk(&tw, il, "attn_output.weight", D * s->n_head, E,
               1.0f / sqrtf((float)(D * s->n_head)), 0);
        if (qwen2) {
            tm_blk(&tw, il, "attn_q.bias", q_rows, 1, 0.3f, 0);
            tm_blk(&tw, il, "attn_k.bias", kv_rows, 1, 0.3f, 0);
            tm_blk(&tw, il, "attn_v.bias", kv_rows, 1, 0.3f, 0);
        }
        if (q35) {
            tm_blk(&tw, il, "attn_q_norm.weight", D, 1, 0.2f, 1.0f);
            tm_blk(&tw, il, "attn_k_norm.weight", D, 1, 0.2f, 1.0f);
        }
    }
    lt_status st = lt_gguf_writer_write(tw.w, path);
    lt_gguf_writer_free(tw.w);
    for (int i = 0; i < tw.n_bufs; i++)
        free(tw.bufs[i]);
    return st;
}

/* The path of test `name`'s model file for spec idx: "<name>_<idx>.gguf" in the build folder
 * (LATHE_BUILD_DIR) or /tmp */
static inline void tm_model_path(char *out, size_t size, const char *name, int idx)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    snprintf(out, size, "%s/%s_%d.gguf", dir && *dir ? dir : "/tmp", name, idx);
}

/* Writes sp's model (weights from seed) to path, loads it, and makes an F32 trainable copy
 * of every weight (*rep, *n_rep). Returns their elements in all; 0 when a step failed
 * (lt_last_error says why; *m and *fp are then whatever was made, for the caller to free). */
static inline size_t tm_load_f32(const struct tm_spec *sp, const char *path, uint64_t seed,
                                 struct lt_model **m, struct lt_model_f32_params **fp,
                                 const struct lt_model_replace **rep, int *n_rep)
{
    *m = NULL;
    *fp = NULL;
    if (tm_write_model(sp, path, seed) != LT_OK || lt_model_load(path, NULL, m) != LT_OK ||
        lt_model_f32_params_new(*m, NULL, NULL, fp) != LT_OK)
        return 0;
    *rep = lt_model_f32_params_list(*fp, n_rep);
    size_t n = 0;
    for (int i = 0; i < *n_rep; i++)
        n += (size_t)lt_nelements((*rep)[i].with);
    return n;
}

/* n token ids (i * 7 + 3) % V into tok, in rows of t_row, and each one's label: the next
 * token of its row, -1 at a row's end */
static inline void tm_next_tokens(int32_t *tok, int32_t *lab, int t_row, int n, int V)
{
    for (int i = 0; i < n; i++) {
        tok[i] = (i * 7 + 3) % V;
        lab[i] = i % t_row + 1 < t_row ? ((i + 1) * 7 + 3) % V : -1;
    }
}

/* The loss of tokens [n_seqs][t_row] and labels lab through lt_model_build_loss (pos NULL:
 * each row one example) or lt_model_build_loss_packed (pos: each step's position within its
 * example), with adapters ad, on cpu; and d loss / d each trainable copy of ad->replace,
 * concatenated into grads (zeros for a copy that got none). inspect (NULL: none) sees the
 * graph with its gradients before it is placed. */
static inline lt_status tm_loss_and_grads(const struct lt_model *m, struct lt_backend *cpu,
                                          const struct lt_model_adapters *ad, const int32_t *tok,
                                          const int32_t *lab, int t_row, int n_seqs,
                                          const int32_t *pos, float *loss, float *grads,
                                          void (*inspect)(const struct lt_graph *g, void *user),
                                          void *user)
{
    struct lt_ctx *ctx =
        lt_ctx_init((struct lt_ctx_params){.mem_size = 16 << 20, .no_alloc = true});
    struct lt_graph *g = lt_graph_new(ctx, 1 << 16);
    struct lt_sched *s = lt_sched_new(&cpu, 1);
    struct lt_model_loss_graph lg;
    const struct lt_model_replace *rep = ad->replace;
    const int n_rep = ad->n_replace;
    size_t bytes = sizeof(int32_t) * (size_t)(t_row * n_seqs);
    lt_status st = pos ? lt_model_build_loss_packed(m, ctx, t_row, n_seqs, ad, &lg)
                       : lt_model_build_loss(m, ctx, t_row, n_seqs, ad, &lg);
    if (st == LT_OK) {
        lg.loss->flags |= LT_FLAG_LOSS; /* kept to the end of the graph */
        st = lt_graph_build(g, lg.loss);
    }
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, lg.loss, 1.0f, NULL);
    if (st == LT_OK && inspect)
        inspect(g, user);
    for (int i = 0; i < n_rep && st == LT_OK; i++)
        if (rep[i].with->grad)
            rep[i].with->grad->flags |= LT_FLAG_OUTPUT;
    if (st == LT_OK)
        st = lt_sched_place(s, g, false, NULL);
    if (st == LT_OK)
        st = lt_sched_alloc(s, g);
    if (st == LT_OK)
        st = lt_tensor_set(lg.tokens, tok, 0, bytes);
    if (st == LT_OK)
        st = lt_tensor_set(lg.labels, lab, 0, bytes);
    if (st == LT_OK)
        st =
            pos ? lt_model_loss_graph_set_packed(&lg, pos, NULL) : lt_model_loss_graph_set_pos(&lg);
    if (st == LT_OK)
        st = lt_sched_compute(s, g);
    if (st == LT_OK)
        st = lt_tensor_get(lg.loss, loss, 0, sizeof(float));
    size_t at = 0;
    for (int i = 0; i < n_rep && st == LT_OK; i++) {
        size_t n = (size_t)lt_nelements(rep[i].with);
        if (rep[i].with->grad)
            st = lt_tensor_get(rep[i].with->grad, grads + at, 0, n * sizeof(float));
        else
            memset(grads + at, 0, n * sizeof(float));
        at += n;
    }
    lt_sched_free(s);
    lt_ctx_free(ctx);
    return st;
}

/* The full-sequence forward: logits [n_seqs][n_tokens][n_vocab] of tokens [n_seqs][n_tokens]
 * through the loss graph on the CPU. */
static inline lt_status tm_forward_ad(const struct lt_model *m, struct lt_backend *cpu,
                               const struct lt_model_adapters *ad, const int32_t *tokens,
                               int n_tokens, int n_seqs, float *logits)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20, .no_alloc = true});
    struct lt_graph *g = lt_graph_new(ctx, 1 << 16);
    struct lt_sched *s = lt_sched_new(&cpu, 1);
    struct lt_model_loss_graph lg;
    int64_t N = (int64_t)n_tokens * n_seqs;
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++)
        labels[i] = -1;
    lt_status st = lt_model_build_loss(m, ctx, n_tokens, n_seqs, ad, &lg);
    if (st == LT_OK)
        st = lt_graph_build(g, lg.loss);
    if (st == LT_OK)
        st = lt_sched_place(s, g, false, NULL);
    if (st == LT_OK)
        st = lt_sched_alloc(s, g);
    if (st == LT_OK)
        st = lt_tensor_set(lg.tokens, tokens, 0, sizeof(int32_t) * (size_t)N);
    if (st == LT_OK)
        st = lt_tensor_set(lg.labels, labels, 0, sizeof(int32_t) * (size_t)N);
    if (st == LT_OK)
        st = lt_model_loss_graph_set_pos(&lg);
    if (st == LT_OK)
        st = lt_sched_compute(s, g);
    if (st == LT_OK)
        st = lt_tensor_get(lg.logits, logits, 0,
                           sizeof(float) * (size_t)(N * lt_model_hparams(m)->n_vocab));
    free(labels);
    lt_sched_free(s);
    lt_ctx_free(ctx);
    return st;
}

static inline lt_status tm_forward(const struct lt_model *m, struct lt_backend *cpu, const int32_t *tokens,
                            int n_tokens, int n_seqs, float *logits)
{
    return tm_forward_ad(m, cpu, NULL, tokens, n_tokens, n_seqs, logits);
}

#endif
