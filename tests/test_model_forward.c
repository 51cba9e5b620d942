/* test_model_forward.c: the model graphs against a plain forward pass written here with
 * loops, for each architecture (tiny random GGUFs from test_model_util.h). The reference
 * reads the weights straight from the file and follows the math of Hugging Face's
 * modeling code (and llama.cpp's GGUF conventions: llama's rotary pairs interleaved, qwen35's
 * value heads tiled so value head h reads key head h % n_k_heads), token by token:
 *   attention: q, k, v (+ bias), qwen35 q/k RMSNorm and sigmoid output gate, rope on the
 *   first n_rot dims, causal softmax with grouped KV heads;
 *   Gated DeltaNet: causal conv1d + silu, l2-normalised q and k, g = a * softplus(alpha + dt),
 *   beta = sigmoid(b), S = exp(g) S + k (beta (v - S^T k))^T, o = S^T q / sqrt(d_k),
 *   RMSNorm(o) * w * silu(z);
 *   SwiGLU FFN, RMSNorm with eps from the file. */
#include <string.h>

#include "check.h"
#include "test_model_util.h"

#define T_LEN 9
#define MAXV 4096

struct ref {
    const struct tm_spec *s;
    struct lt_gguf *g;
};

/* Weight `name` (F32 in these files). */
static const float *wt(struct ref *r, const char *fmt, int il)
{
    char name[LT_MAX_NAME];
    snprintf(name, sizeof(name), fmt, il);
    int64_t i = lt_gguf_find_tensor(r->g, name);
    return i < 0 ? NULL : lt_gguf_tensor(r->g, i)->data;
}

/* y[out] = W x, W stored [n_in, n_out] (n_in fastest). */
static void matvec(const float *w, const float *x, int n_in, int n_out, float *y)
{
    for (int o = 0; o < n_out; o++) {
        double acc = 0;
        for (int i = 0; i < n_in; i++)
            acc += (double)w[(size_t)o * n_in + i] * x[i];
        y[o] = (float)acc;
    }
}

static void rmsnorm(const float *x, const float *w, int n, float eps, float *y)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        y[i] = x[i] * inv * (w ? w[i] : 1.0f);
}

static float silu(float x)
{
    return x / (1.0f + expf(-x));
}
static float sigm(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static void rope(float *v, int pos, int n_rot, float base, bool neox)
{
    for (int j = 0; j < n_rot / 2; j++) {
        double th = pos * pow(base, -2.0 * j / n_rot);
        int a = neox ? j : 2 * j, b = neox ? j + n_rot / 2 : 2 * j + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = (float)(x0 * cos(th) - x1 * sin(th));
        v[b] = (float)(x0 * sin(th) + x1 * cos(th));
    }
}

/* Attention layer il over the normed inputs h [T][E]; adds its output into out [T][E]. */
static void ref_attention(struct ref *r, int il, float (*h)[64], float (*out)[64])
{
    const struct tm_spec *s = r->s;
    bool q35 = !strcmp(s->arch, "qwen35"), neox = strcmp(s->arch, "llama") != 0;
    int E = s->n_embd, D = s->head_dim, H = s->n_head, Hkv = s->n_head_kv;
    static float q[T_LEN][256], gate[T_LEN][256], k[T_LEN][256], v[T_LEN][256], tmp[512];
    const float *bq = wt(r, "blk.%d.attn_q.bias", il), *bk = wt(r, "blk.%d.attn_k.bias", il),
                *bv = wt(r, "blk.%d.attn_v.bias", il);
    for (int t = 0; t < T_LEN; t++) {
        matvec(wt(r, "blk.%d.attn_q.weight", il), h[t], E, D * H * (q35 ? 2 : 1), tmp);
        for (int hh = 0; hh < H; hh++)
            for (int d = 0; d < D; d++) {
                q[t][hh * D + d] =
                    q35 ? tmp[hh * 2 * D + d] : tmp[hh * D + d] + (bq ? bq[hh * D + d] : 0);
                gate[t][hh * D + d] = q35 ? tmp[hh * 2 * D + D + d] : 0;
            }
        matvec(wt(r, "blk.%d.attn_k.weight", il), h[t], E, D * Hkv, k[t]);
        matvec(wt(r, "blk.%d.attn_v.weight", il), h[t], E, D * Hkv, v[t]);
        for (int i = 0; i < D * Hkv; i++) {
            k[t][i] += bk ? bk[i] : 0;
            v[t][i] += bv ? bv[i] : 0;
        }
        for (int hh = 0; hh < H; hh++) {
            if (q35)
                rmsnorm(&q[t][hh * D], wt(r, "blk.%d.attn_q_norm.weight", il), D, s->rms_eps,
                        &q[t][hh * D]);
            rope(&q[t][hh * D], t, s->n_rot, s->rope_base, neox);
        }
        for (int hh = 0; hh < Hkv; hh++) {
            if (q35)
                rmsnorm(&k[t][hh * D], wt(r, "blk.%d.attn_k_norm.weight", il), D, s->rms_eps,
                        &k[t][hh * D]);
            rope(&k[t][hh * D], t, s->n_rot, s->rope_base, neox);
        }
    }
    for (int t = 0; t < T_LEN; t++) {
        float o[256] = {0}, p[T_LEN];
        for (int hh = 0; hh < H; hh++) {
            int kvh = hh / (H / Hkv);
            float mx = -INFINITY;
            for (int u = 0; u <= t; u++) {
                double dot = 0;
                for (int d = 0; d < D; d++)
                    dot += (double)q[t][hh * D + d] * k[u][kvh * D + d];
                p[u] = (float)(dot / sqrt((double)D));
                mx = fmaxf(mx, p[u]);
            }
            double sum = 0;
            for (int u = 0; u <= t; u++)
                sum += p[u] = expf(p[u] - mx);
            for (int u = 0; u <= t; u++)
                for (int d = 0; d < D; d++)
                    o[hh * D + d] += (float)(p[u] / sum) * v[u][kvh * D + d];
        }
        if (q35)
            for (int i = 0; i < D * H; i++)
                o[i] *= sigm(gate[t][i]);
        matvec(wt(r, "blk.%d.attn_output.weight", il), o, D * H, E, tmp);
        for (int i = 0; i < E; i++)
            out[t][i] += tmp[i];
    }
}

/* Gated DeltaNet layer il (qwen35). */
static void ref_delta(struct ref *r, int il, float (*h)[64], float (*out)[64])
{
    const struct tm_spec *s = r->s;
    int E = s->n_embd, Sk = s->d_state, Sv = s->d_v ? s->d_v : s->d_state, Hk = s->n_k_heads,
        Hv = s->n_v_heads;
    int key_dim = Sk * Hk, value_dim = Sv * Hv, C = 2 * key_dim + value_dim, K = s->d_conv;
    static float qkv[T_LEN][256], z[T_LEN][256], beta[T_LEN][16], g[T_LEN][16], conv[T_LEN][256];
    static float S[16][32][32];
    const float *dt = wt(r, "blk.%d.ssm_dt.bias", il), *A = wt(r, "blk.%d.ssm_a", il);
    const float *cw = wt(r, "blk.%d.ssm_conv1d.weight", il); /* [K, C] */
    for (int t = 0; t < T_LEN; t++) {
        float a[16];
        matvec(wt(r, "blk.%d.attn_qkv.weight", il), h[t], E, C, qkv[t]);
        matvec(wt(r, "blk.%d.attn_gate.weight", il), h[t], E, value_dim, z[t]);
        matvec(wt(r, "blk.%d.ssm_beta.weight", il), h[t], E, Hv, beta[t]);
        matvec(wt(r, "blk.%d.ssm_alpha.weight", il), h[t], E, Hv, a);
        for (int hh = 0; hh < Hv; hh++) {
            beta[t][hh] = sigm(beta[t][hh]);
            float x = a[hh] + dt[hh];
            g[t][hh] = A[hh] * (x > 20 ? x : log1pf(expf(x)));
        }
    }
    for (int t = 0; t < T_LEN; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int src = t - (K - 1) + j; /* zeros before the first token */
                acc += src >= 0 ? (double)cw[(size_t)c * K + j] * qkv[src][c] : 0;
            }
            conv[t][c] = silu((float)acc);
        }
    memset(S, 0, sizeof(S));
    float scale = 1.0f / sqrtf((float)Sk);
    for (int t = 0; t < T_LEN; t++) {
        float *q = conv[t], *k = conv[t] + key_dim, *v = conv[t] + 2 * key_dim, o[256], tmp[64];
        for (int hh = 0; hh < 2 * Hk; hh++) { /* q heads, then k heads: x / sqrt(sum x^2 + 1e-6) */
            float *e = q + hh * Sk;
            double ss = 0;
            for (int i = 0; i < Sk; i++)
                ss += (double)e[i] * e[i];
            for (int i = 0; i < Sk; i++)
                e[i] = (float)(e[i] / sqrt(ss + 1e-6));
        }
        for (int hh = 0; hh < Hv; hh++) {
            const float *qh = q + (hh % Hk) * Sk, *kh = k + (hh % Hk) * Sk, *vh = v + hh * Sv;
            float decay = expf(g[t][hh]);
            for (int j = 0; j < Sv; j++) {
                double mem = 0;
                for (int i = 0; i < Sk; i++) {
                    S[hh][j][i] *= decay;
                    mem += (double)S[hh][j][i] * kh[i];
                }
                float delta = (vh[j] - (float)mem) * beta[t][hh];
                double acc = 0;
                for (int i = 0; i < Sk; i++) {
                    S[hh][j][i] += kh[i] * delta;
                    acc += (double)S[hh][j][i] * qh[i];
                }
                o[hh * Sv + j] = (float)acc * scale;
            }
            rmsnorm(o + hh * Sv, wt(r, "blk.%d.ssm_norm.weight", il), Sv, s->rms_eps, o + hh * Sv);
            for (int j = 0; j < Sv; j++)
                o[hh * Sv + j] *= silu(z[t][hh * Sv + j]);
        }
        matvec(wt(r, "blk.%d.ssm_out.weight", il), o, value_dim, E, tmp);
        for (int i = 0; i < E; i++)
            out[t][i] += tmp[i];
    }
}

static void ref_forward(struct ref *r, const int32_t *tokens, float *logits)
{
    const struct tm_spec *s = r->s;
    bool q35 = !strcmp(s->arch, "qwen35");
    int E = s->n_embd;
    static float x[T_LEN][64], h[T_LEN][64], f1[256], f2[256];
    const float *emb = wt(r, "token_embd.weight", 0);
    for (int t = 0; t < T_LEN; t++)
        memcpy(x[t], emb + (size_t)tokens[t] * E, sizeof(float) * (size_t)E);
    for (int il = 0; il < s->n_layer; il++) {
        for (int t = 0; t < T_LEN; t++)
            rmsnorm(x[t], wt(r, "blk.%d.attn_norm.weight", il), E, s->rms_eps, h[t]);
        if (q35 && (il + 1) % s->interval != 0)
            ref_delta(r, il, h, x);
        else
            ref_attention(r, il, h, x);
        for (int t = 0; t < T_LEN; t++) {
            float hn[64], y[64];
            rmsnorm(x[t],
                    wt(r, q35 ? "blk.%d.post_attention_norm.weight" : "blk.%d.ffn_norm.weight", il),
                    E, s->rms_eps, hn);
            matvec(wt(r, "blk.%d.ffn_gate.weight", il), hn, E, s->n_ff, f1);
            matvec(wt(r, "blk.%d.ffn_up.weight", il), hn, E, s->n_ff, f2);
            for (int i = 0; i < s->n_ff; i++)
                f1[i] = silu(f1[i]) * f2[i];
            matvec(wt(r, "blk.%d.ffn_down.weight", il), f1, s->n_ff, E, y);
            for (int i = 0; i < E; i++)
                x[t][i] += y[i];
        }
    }
    const float *out = s->tied ? emb : wt(r, "output.weight", 0);
    for (int t = 0; t < T_LEN; t++) {
        float hn[64];
        rmsnorm(x[t], wt(r, "output_norm.weight", 0), E, s->rms_eps, hn);
        matvec(out, hn, E, s->n_vocab, logits + (size_t)t * s->n_vocab);
    }
}

/* The adapter hooks: a LoRA pair on a weight gives what the merged weight W + s B A gives
 * through a replacement; F32 copies of every weight (full fine-tuning) change nothing. */
static void test_adapters(struct lt_backend *cpu, const char *dir)
{
    const struct tm_spec *s = &tm_specs[2]; /* qwen35: LoRA on a DeltaNet and an attention weight */
    char path[512];
    snprintf(path, sizeof(path), "%s/test_model_forward_lora.gguf", dir);
    CHECK(tm_write_model(s, path, 99) == LT_OK);
    struct lt_model *m = NULL;
    CHECK(lt_model_load(path, NULL, &m) == LT_OK, "%s", lt_last_error());
    if (!m)
        return;
    int32_t tokens[T_LEN];
    for (int t = 0; t < T_LEN; t++)
        tokens[t] = (int32_t)((t * 5 + 1) % s->n_vocab);
    static float base[T_LEN * MAXV], lora[T_LEN * MAXV], merged[T_LEN * MAXV];
    CHECK(tm_forward(m, cpu, tokens, T_LEN, 1, base) == LT_OK);

    const char *names[2] = {"blk.0.attn_qkv.weight", "blk.1.attn_output.weight"};
    const int rank = 3;
    const float scale = 0.75f;
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_model_lora pairs[2];
    struct lt_model_replace reps[2];
    for (int p = 0; p < 2; p++) {
        struct lt_tensor *w = lt_model_find_weight(m, names[p]);
        CHECK(w != NULL, "%s", names[p]);
        if (!w)
            goto out_free;
        int64_t n_in = w->ne[0], n_out = w->ne[1];
        struct lt_tensor *a = lt_new_tensor_2d(ctx, LT_TYPE_F32, n_in, rank);
        struct lt_tensor *b = lt_new_tensor_2d(ctx, LT_TYPE_F32, rank, n_out);
        struct lt_tensor *wm = lt_new_tensor_2d(ctx, LT_TYPE_F32, n_in, n_out);
        float *A = a->data, *B = b->data, *Wm = wm->data;
        for (int64_t i = 0; i < n_in * rank; i++)
            A[i] = 0.3f * tm_rand();
        for (int64_t i = 0; i < rank * n_out; i++)
            B[i] = 0.3f * tm_rand();
        lt_tensor_read_f32(w, Wm);
        for (int64_t o = 0; o < n_out; o++)
            for (int64_t i = 0; i < n_in; i++) {
                double acc = 0;
                for (int r = 0; r < rank; r++)
                    acc += (double)B[o * rank + r] * A[r * n_in + i];
                Wm[o * n_in + i] += scale * (float)acc;
            }
        pairs[p] = (struct lt_model_lora){w, a, b, scale};
        reps[p] = (struct lt_model_replace){w, wm};
    }
    struct lt_model_adapters with_lora = {.lora = pairs, .n_lora = 2};
    struct lt_model_adapters with_merged = {.replace = reps, .n_replace = 2};
    CHECK(tm_forward_ad(m, cpu, &with_lora, tokens, T_LEN, 1, lora) == LT_OK, "%s",
          lt_last_error());
    CHECK(tm_forward_ad(m, cpu, &with_merged, tokens, T_LEN, 1, merged) == LT_OK, "%s",
          lt_last_error());
    long n = (long)T_LEN * s->n_vocab, worst;
    CHECK(check_max_ratio(lora, merged, n, 1e-4, 1e-4, &worst) <= 1.0, "LoRA vs merged at %ld",
          worst);
    CHECK(check_max_ratio(lora, base, n, 1e-3, 1e-3, &worst) > 1.0, "the adapter changes nothing");

    struct lt_model_f32_params *fp = NULL;
    CHECK(lt_model_f32_params_new(m, NULL, NULL, &fp) == LT_OK);
    if (fp) {
        int nr;
        const struct lt_model_replace *list = lt_model_f32_params_list(fp, &nr);
        CHECK(nr == lt_model_n_weights(m));
        bool flagged = true;
        for (int i = 0; i < nr; i++)
            flagged &= (list[i].with->flags & LT_FLAG_PARAM) && list[i].with->type == LT_TYPE_F32 &&
                       !strcmp(list[i].with->name, list[i].w->name);
        CHECK(flagged, "copies are F32, trainable and named as their weight");
        struct lt_model_adapters full = {.replace = list, .n_replace = nr};
        CHECK(tm_forward_ad(m, cpu, &full, tokens, T_LEN, 1, merged) == LT_OK);
        CHECK(check_max_ratio(merged, base, n, 1e-6, 1e-6, &worst) <= 1.0, "F32 copies at %ld",
              worst);
        lt_model_f32_params_free(fp);
    }
out_free:
    lt_ctx_free(ctx);
    lt_model_free(m);
    remove(path);
}

int main(void)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int si = 0; si < TM_N_SPECS; si++) {
        const struct tm_spec *s = &tm_specs[si];
        char path[512];
        snprintf(path, sizeof(path), "%s/test_model_forward_%s.gguf", dir, s->arch);
        CHECK(tm_write_model(s, path, 777 + (uint64_t)si) == LT_OK, "%s", lt_last_error());
        struct ref r = {.s = s};
        struct lt_model *m = NULL;
        CHECK(lt_gguf_open(path, &r.g) == LT_OK, "%s", lt_last_error());
        CHECK(lt_model_load(path, NULL, &m) == LT_OK, "%s", lt_last_error());
        if (!r.g || !m)
            continue;
        int32_t tokens[T_LEN];
        for (int t = 0; t < T_LEN; t++)
            tokens[t] = (int32_t)((t * 11 + 3 + si) % s->n_vocab);
        static float want[T_LEN * MAXV], got[T_LEN * MAXV];
        ref_forward(&r, tokens, want);
        CHECK(tm_forward(m, cpu, tokens, T_LEN, 1, got) == LT_OK, "%s", lt_last_error());
        long worst = -1;
        double ratio = check_max_ratio(got, want, (long)T_LEN * s->n_vocab, 1e-4, 1e-4, &worst);
        CHECK(ratio <= 1.0, "%s: logits differ from the plain forward (element %ld: %g vs %g)",
              s->arch, worst, worst >= 0 ? got[worst] : 0.0, worst >= 0 ? want[worst] : 0.0);
        printf("%-7s graph forward vs plain loops: max error ratio %.3f (atol 1e-4, rtol 1e-4)\n",
               s->arch, ratio);
        lt_model_free(m);
        lt_gguf_close(r.g);
        remove(path);
    }
    test_adapters(cpu, dir);
    lt_backend_free(cpu);
    return check_summary();
}
