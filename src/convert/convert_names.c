/* convert_names.c: which GGUF tensor each HF parameter becomes, and how its values move.
 *
 * One table of per-layer rules (HF suffix, GGUF suffix, element-wise map, permutation, the
 * architectures it applies to) serves both directions: HF -> GGUF for the converter and
 * GGUF -> HF for the model checker, so the two cannot disagree. Every permutation is applied
 * as an index map along one HF axis (lt_convert_perm_index): the forward transform scatters
 * HF element x to GGUF position p(x); the gradient gathers it back from p(x), so no inverse
 * permutation is ever built. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_impl.h"
#include "lathe/convert.h"

#include <math.h>

#define A_LLAMA (1u << LT_HF_ARCH_LLAMA)
#define A_QWEN2 (1u << LT_HF_ARCH_QWEN2)
#define A_QWEN35 (1u << LT_HF_ARCH_QWEN35)
#define A_ALL (A_LLAMA | A_QWEN2 | A_QWEN35)

enum rule_perm {
    RP_NONE,
    RP_ROPE_Q,   /* llama: rows of q_proj, n_head heads */
    RP_ROPE_K,   /* llama: rows of k_proj, n_head_kv heads */
    RP_V_QKV,    /* qwen35: the v rows of in_proj_qkv (after 2 * Hk * dk rows of q and k) */
    RP_V_ROWS,   /* qwen35: rows, d_v per value head (in_proj_z) */
    RP_V_ROWS_1, /* qwen35: rows, one per value head (in_proj_a/b, A_log, dt_bias) */
    RP_V_CONV,   /* qwen35: conv1d channels, the v part (squeezed) */
    RP_V_COLS,   /* qwen35: columns, d_v per value head (out_proj) */
};

struct layer_rule {
    const char *hf;   /* after "model.layers.N." */
    const char *gguf; /* after "blk.N." */
    enum lt_convert_fn fn;
    enum rule_perm perm;
    unsigned archs;
};

/* llama.cpp's names (gguf-py constants / tensor_mapping) and its converter's transforms
 * (LlamaModel.permute for llama's q/k; Qwen3NextModel and _LinearAttentionVReorderBase for
 * qwen35). */
static const struct layer_rule layer_rules[] = {
    {"input_layernorm.weight", "attn_norm.weight", LT_CONVERT_FN_COPY, RP_NONE, A_LLAMA | A_QWEN2},
    {"input_layernorm.weight", "attn_norm.weight", LT_CONVERT_FN_PLUS_ONE, RP_NONE, A_QWEN35},
    {"post_attention_layernorm.weight", "ffn_norm.weight", LT_CONVERT_FN_COPY, RP_NONE,
     A_LLAMA | A_QWEN2},
    {"post_attention_layernorm.weight", "post_attention_norm.weight", LT_CONVERT_FN_PLUS_ONE,
     RP_NONE, A_QWEN35},

    {"self_attn.q_proj.weight", "attn_q.weight", LT_CONVERT_FN_COPY, RP_ROPE_Q, A_LLAMA},
    {"self_attn.q_proj.bias", "attn_q.bias", LT_CONVERT_FN_COPY, RP_ROPE_Q, A_LLAMA},
    {"self_attn.k_proj.weight", "attn_k.weight", LT_CONVERT_FN_COPY, RP_ROPE_K, A_LLAMA},
    {"self_attn.k_proj.bias", "attn_k.bias", LT_CONVERT_FN_COPY, RP_ROPE_K, A_LLAMA},
    {"self_attn.q_proj.weight", "attn_q.weight", LT_CONVERT_FN_COPY, RP_NONE, A_QWEN2 | A_QWEN35},
    {"self_attn.q_proj.bias", "attn_q.bias", LT_CONVERT_FN_COPY, RP_NONE, A_QWEN2 | A_QWEN35},
    {"self_attn.k_proj.weight", "attn_k.weight", LT_CONVERT_FN_COPY, RP_NONE, A_QWEN2 | A_QWEN35},
    {"self_attn.k_proj.bias", "attn_k.bias", LT_CONVERT_FN_COPY, RP_NONE, A_QWEN2 | A_QWEN35},
    {"self_attn.v_proj.weight", "attn_v.weight", LT_CONVERT_FN_COPY, RP_NONE, A_ALL},
    {"self_attn.v_proj.bias", "attn_v.bias", LT_CONVERT_FN_COPY, RP_NONE, A_ALL},
    {"self_attn.o_proj.weight", "attn_output.weight", LT_CONVERT_FN_COPY, RP_NONE, A_ALL},
    {"self_attn.o_proj.bias", "attn_output.bias", LT_CONVERT_FN_COPY, RP_NONE, A_ALL},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", LT_CONVERT_FN_PLUS_ONE, RP_NONE, A_QWEN35},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", LT_CONVERT_FN_PLUS_ONE, RP_NONE, A_QWEN35},

    {"mlp.gate_proj.weight", "ffn_gate.weight", LT_CONVERT_FN_COPY, RP_NONE, A_ALL},
    {"mlp.up_proj.weight", "ffn_up.weight", LT_CONVERT_FN_COPY, RP_NONE, A_ALL},
    {"mlp.down_proj.weight", "ffn_down.weight", LT_CONVERT_FN_COPY, RP_NONE, A_ALL},

    {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight", LT_CONVERT_FN_COPY, RP_V_QKV, A_QWEN35},
    {"linear_attn.in_proj_z.weight", "attn_gate.weight", LT_CONVERT_FN_COPY, RP_V_ROWS, A_QWEN35},
    {"linear_attn.in_proj_a.weight", "ssm_alpha.weight", LT_CONVERT_FN_COPY, RP_V_ROWS_1,
     A_QWEN35},
    {"linear_attn.in_proj_b.weight", "ssm_beta.weight", LT_CONVERT_FN_COPY, RP_V_ROWS_1, A_QWEN35},
    {"linear_attn.A_log", "ssm_a", LT_CONVERT_FN_NEG_EXP, RP_V_ROWS_1, A_QWEN35},
    {"linear_attn.dt_bias", "ssm_dt.bias", LT_CONVERT_FN_COPY, RP_V_ROWS_1, A_QWEN35},
    {"linear_attn.conv1d.weight", "ssm_conv1d.weight", LT_CONVERT_FN_COPY, RP_V_CONV, A_QWEN35},
    /* the gated norm is per value-head-dim, shared by all heads: neither +1 nor reordered */
    {"linear_attn.norm.weight", "ssm_norm.weight", LT_CONVERT_FN_COPY, RP_NONE, A_QWEN35},
    {"linear_attn.out_proj.weight", "ssm_out.weight", LT_CONVERT_FN_COPY, RP_V_COLS, A_QWEN35},
};

#define N_LAYER_RULES (sizeof(layer_rules) / sizeof(layer_rules[0]))

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Names llama.cpp's converter drops without a word (buffers, other modalities, MTP heads). */
static bool dropped(const struct lt_hf_config *cfg, const char *name)
{
    if (ends_with(name, ".rotary_emb.inv_freq") || ends_with(name, ".attention.masked_bias") ||
        ends_with(name, ".attention.bias"))
        return true;
    if (strstr(name, "visual.") || strstr(name, "vision.") || strstr(name, "vision_") ||
        strstr(name, "audio.") || strstr(name, "audio_"))
        return true;
    return cfg->arch == LT_HF_ARCH_QWEN35 && !strncmp(name, "mtp.", 4);
}

static void set_perm(const struct lt_hf_config *cfg, enum rule_perm rp, struct lt_convert_map *m)
{
    int64_t hk = cfg->ssm_n_k_heads, hv = cfg->ssm_n_v_heads;
    bool reorder = hk > 0 && hv > 0 && hk != hv; /* llama.cpp reorders only then */
    m->perm = LT_CONVERT_PERM_NONE;
    m->perm_axis = 0;
    m->perm_offset = 0;
    m->perm_head_dim = 1;
    m->perm_n_groups = 1;
    m->perm_per_group = 1;
    switch (rp) {
    case RP_NONE:
        return;
    case RP_ROPE_Q:
    case RP_ROPE_K:
        m->perm = LT_CONVERT_PERM_ROPE;
        m->perm_head_dim = cfg->head_dim;
        m->perm_n_groups = rp == RP_ROPE_Q ? cfg->n_head : cfg->n_head_kv;
        return;
    case RP_V_CONV:
        m->squeeze = true;
        /* fall through */
    case RP_V_QKV:
        m->perm_offset = 2 * hk * cfg->ssm_d_k;
        m->perm_head_dim = cfg->ssm_d_v;
        break;
    case RP_V_ROWS:
        m->perm_head_dim = cfg->ssm_d_v;
        break;
    case RP_V_ROWS_1:
        m->perm_head_dim = 1;
        break;
    case RP_V_COLS:
        m->perm_axis = 1;
        m->perm_head_dim = cfg->ssm_d_v;
        break;
    }
    if (reorder) {
        m->perm = LT_CONVERT_PERM_V_HEADS;
        m->perm_n_groups = hk;
        m->perm_per_group = hv / hk;
    }
}

static void map_clear(struct lt_convert_map *m)
{
    memset(m, 0, sizeof(*m));
    m->perm_head_dim = 1;
    m->perm_n_groups = 1;
    m->perm_per_group = 1;
}

/* "model.language_model.x" -> "model.x" (every "language_model." dropped, as llama.cpp). */
static lt_status canonical_name(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    static const char drop[] = "language_model.";
    for (const char *p = in; *p;) {
        if (!strncmp(p, drop, sizeof(drop) - 1)) {
            p += sizeof(drop) - 1;
            continue;
        }
        if (o + 1 >= cap)
            return lt_fail(LT_ERR_UNSUPPORTED, "tensor name too long: %s", in);
        out[o++] = *p++;
    }
    out[o] = 0;
    return LT_OK;
}

lt_status lt_convert_map_hf(const struct lt_hf_config *cfg, const char *hf_name,
                            struct lt_convert_map *m)
{
    map_clear(m);
    lt_status st = canonical_name(hf_name, m->hf_name, sizeof(m->hf_name));
    if (st != LT_OK)
        return st;
    const char *name = m->hf_name;
    unsigned arch = 1u << cfg->arch;
    if (dropped(cfg, name)) {
        m->skip = true;
        return LT_OK;
    }
    if (!strcmp(name, "model.embed_tokens.weight")) {
        snprintf(m->gguf_name, sizeof(m->gguf_name), "token_embd.weight");
        return LT_OK;
    }
    if (!strcmp(name, "model.norm.weight")) {
        snprintf(m->gguf_name, sizeof(m->gguf_name), "output_norm.weight");
        if (cfg->arch == LT_HF_ARCH_QWEN35)
            m->fn = LT_CONVERT_FN_PLUS_ONE;
        return LT_OK;
    }
    if (!strcmp(name, "lm_head.weight")) {
        snprintf(m->gguf_name, sizeof(m->gguf_name), "output.weight");
        m->skip = cfg->tie_word_embeddings;
        return LT_OK;
    }
    static const char prefix[] = "model.layers.";
    if (!strncmp(name, prefix, sizeof(prefix) - 1)) {
        const char *p = name + sizeof(prefix) - 1;
        char *end;
        long long bid = strtoll(p, &end, 10);
        if (end != p && *end == '.' && p[0] != '-' && p[0] != '+') {
            if (bid >= cfg->n_layer)
                return lt_fail(LT_ERR_FORMAT, "tensor '%s': layer %lld but the config has %lld "
                                              "layers",
                               hf_name, bid, (long long)cfg->n_layer);
            const char *suffix = end + 1;
            for (size_t i = 0; i < N_LAYER_RULES; i++) {
                const struct layer_rule *r = &layer_rules[i];
                if (!(r->archs & arch) || strcmp(r->hf, suffix))
                    continue;
                snprintf(m->gguf_name, sizeof(m->gguf_name), "blk.%lld.%s", bid, r->gguf);
                m->fn = r->fn;
                set_perm(cfg, r->perm, m);
                return LT_OK;
            }
        }
    }
    return lt_fail(LT_ERR_UNSUPPORTED, "tensor '%s' has no GGUF name for %s (%s)", hf_name,
                   lt_hf_arch_gguf_name(cfg->arch), cfg->hf_arch);
}

lt_status lt_convert_map_gguf(const struct lt_hf_config *cfg, const char *gguf_name,
                              struct lt_convert_map *m)
{
    char hf[160];
    unsigned arch = 1u << cfg->arch;
    if (!strcmp(gguf_name, "token_embd.weight"))
        return lt_convert_map_hf(cfg, "model.embed_tokens.weight", m);
    if (!strcmp(gguf_name, "output_norm.weight"))
        return lt_convert_map_hf(cfg, "model.norm.weight", m);
    if (!strcmp(gguf_name, "output.weight"))
        return lt_convert_map_hf(cfg, "lm_head.weight", m);
    if (!strncmp(gguf_name, "blk.", 4)) {
        char *end;
        long long bid = strtoll(gguf_name + 4, &end, 10);
        if (end != gguf_name + 4 && *end == '.' && gguf_name[4] != '-' && gguf_name[4] != '+') {
            for (size_t i = 0; i < N_LAYER_RULES; i++) {
                const struct layer_rule *r = &layer_rules[i];
                if (!(r->archs & arch) || strcmp(r->gguf, end + 1))
                    continue;
                snprintf(hf, sizeof(hf), "model.layers.%lld.%s", bid, r->hf);
                return lt_convert_map_hf(cfg, hf, m);
            }
        }
    }
    map_clear(m);
    return lt_fail(LT_ERR_UNSUPPORTED, "GGUF tensor '%s' has no HF parameter for %s", gguf_name,
                   lt_hf_arch_gguf_name(cfg->arch));
}

int64_t lt_convert_perm_index(const struct lt_convert_map *m, int64_t i)
{
    switch (m->perm) {
    case LT_CONVERT_PERM_V_HEADS: {
        if (i < m->perm_offset)
            return i;
        int64_t y = i - m->perm_offset, hd = m->perm_head_dim;
        int64_t head = y / hd, d = y % hd;
        int64_t g = head / m->perm_per_group, r = head % m->perm_per_group;
        return m->perm_offset + (r * m->perm_n_groups + g) * hd + d;
    }
    case LT_CONVERT_PERM_ROPE: {
        int64_t hd = m->perm_head_dim, half = hd / 2;
        int64_t head = i / hd, x = i % hd;
        return head * hd + 2 * (x % half) + x / half;
    }
    case LT_CONVERT_PERM_NONE:
        break;
    }
    return i;
}

/* Axis length the permutation expects, and whether hf_shape has it. */
static lt_status check_perm_axis(const struct lt_convert_map *m, int hf_n_dims,
                                 const int64_t *hf_shape)
{
    if (m->perm == LT_CONVERT_PERM_NONE)
        return LT_OK;
    if (m->perm_axis >= hf_n_dims)
        return lt_fail(LT_ERR_FORMAT, "tensor '%s': %d dimensions, but its transform acts on "
                                      "axis %d",
                       m->hf_name, hf_n_dims, m->perm_axis);
    int64_t want = m->perm_offset + m->perm_n_groups * m->perm_per_group * m->perm_head_dim;
    if (m->perm == LT_CONVERT_PERM_ROPE && (m->perm_head_dim % 2 != 0 || m->perm_head_dim == 0))
        return lt_fail(LT_ERR_FORMAT, "tensor '%s': head_dim %lld is not even", m->hf_name,
                       (long long)m->perm_head_dim);
    if (hf_shape[m->perm_axis] != want)
        return lt_fail(LT_ERR_FORMAT,
                       "tensor '%s': axis %d has %lld entries but the config implies %lld",
                       m->hf_name, m->perm_axis, (long long)hf_shape[m->perm_axis],
                       (long long)want);
    return LT_OK;
}

lt_status lt_convert_gguf_shape(const struct lt_convert_map *m, int hf_n_dims,
                                const int64_t *hf_shape, int *n_dims_out, int64_t *ne)
{
    int64_t dims[LT_MAX_DIMS + 1];
    int nd = 0;
    if (m->squeeze && (hf_n_dims < 2 || hf_shape[1] != 1))
        return lt_fail(LT_ERR_FORMAT, "tensor '%s': expected a size-1 axis 1 to drop (shape "
                                      "[%lld, %lld, ...])",
                       m->hf_name, (long long)(hf_n_dims > 0 ? hf_shape[0] : 0),
                       (long long)(hf_n_dims > 1 ? hf_shape[1] : 0));
    for (int i = 0; i < hf_n_dims; i++) {
        if (m->squeeze && i == 1)
            continue;
        if (nd == LT_MAX_DIMS)
            return lt_fail(LT_ERR_FORMAT, "tensor '%s': %d dimensions (GGUF holds at most %d)",
                           m->hf_name, hf_n_dims, LT_MAX_DIMS);
        dims[nd++] = hf_shape[i];
    }
    lt_status st = check_perm_axis(m, hf_n_dims, hf_shape);
    if (st != LT_OK)
        return st;
    for (int i = 0; i < LT_MAX_DIMS; i++)
        ne[i] = 1;
    for (int i = 0; i < nd; i++)
        ne[i] = dims[nd - 1 - i];
    *n_dims_out = nd ? nd : 1;
    return LT_OK;
}

void lt_convert_hf_shape(const struct lt_convert_map *m, int n_dims, const int64_t *ne,
                         int *hf_n_dims, int64_t *hf_shape)
{
    int k = 0;
    for (int i = n_dims - 1; i >= 0; i--) {
        hf_shape[k++] = ne[i];
        if (m->squeeze && k == 1)
            hf_shape[k++] = 1;
    }
    *hf_n_dims = k;
}

/* outer x len x inner around the permuted axis */
static void axis_split(const struct lt_convert_map *m, int hf_n_dims, const int64_t *hf_shape,
                       int64_t *outer, int64_t *len, int64_t *inner)
{
    int axis = m->perm == LT_CONVERT_PERM_NONE ? 0 : m->perm_axis;
    *outer = 1;
    *len = hf_n_dims > axis ? hf_shape[axis] : 1;
    *inner = 1;
    for (int i = 0; i < axis && i < hf_n_dims; i++)
        *outer *= hf_shape[i];
    for (int i = axis + 1; i < hf_n_dims; i++)
        *inner *= hf_shape[i];
}

static inline float apply_fn(enum lt_convert_fn fn, float x)
{
    switch (fn) {
    case LT_CONVERT_FN_PLUS_ONE:
        return x + 1.0f;
    case LT_CONVERT_FN_NEG_EXP:
        return -expf(x);
    case LT_CONVERT_FN_COPY:
        break;
    }
    return x;
}

lt_status lt_convert_values(const struct lt_convert_map *m, int hf_n_dims, const int64_t *hf_shape,
                            const float *hf, float *gguf)
{
    lt_status st = check_perm_axis(m, hf_n_dims, hf_shape);
    if (st != LT_OK)
        return st;
    int64_t outer, len, inner;
    axis_split(m, hf_n_dims, hf_shape, &outer, &len, &inner);
    if (m->perm == LT_CONVERT_PERM_NONE && m->fn == LT_CONVERT_FN_COPY) {
        if (hf != gguf)
            memcpy(gguf, hf, (size_t)(outer * len * inner) * sizeof(float));
        return LT_OK;
    }
    for (int64_t x = 0; x < len; x++) {
        int64_t px = lt_convert_perm_index(m, x);
        for (int64_t o = 0; o < outer; o++) {
            const float *src = hf + (o * len + x) * inner;
            float *dst = gguf + (o * len + px) * inner;
            for (int64_t i = 0; i < inner; i++)
                dst[i] = apply_fn(m->fn, src[i]);
        }
    }
    return LT_OK;
}

lt_status lt_convert_grad_to_hf(const struct lt_convert_map *m, int hf_n_dims,
                                const int64_t *hf_shape, const float *grad_gguf,
                                const float *gguf_values, float *grad_hf)
{
    if (m->fn == LT_CONVERT_FN_NEG_EXP && !gguf_values)
        return lt_fail(LT_ERR_INVALID, "tensor '%s': its gradient needs the GGUF values "
                                       "(d(-exp(a))/da = -exp(a))",
                       m->hf_name);
    lt_status st = check_perm_axis(m, hf_n_dims, hf_shape);
    if (st != LT_OK)
        return st;
    int64_t outer, len, inner;
    axis_split(m, hf_n_dims, hf_shape, &outer, &len, &inner);
    for (int64_t x = 0; x < len; x++) {
        int64_t px = lt_convert_perm_index(m, x);
        for (int64_t o = 0; o < outer; o++) {
            float *dst = grad_hf + (o * len + x) * inner;
            size_t at = (size_t)((o * len + px) * inner);
            for (int64_t i = 0; i < inner; i++)
                dst[i] = m->fn == LT_CONVERT_FN_NEG_EXP ? grad_gguf[at + i] * gguf_values[at + i]
                                                        : grad_gguf[at + i];
        }
    }
    return LT_OK;
}

lt_status lt_convert_grad_gguf_to_hf(const struct lt_hf_config *cfg, const char *gguf_name,
                                     int n_dims, const int64_t *ne, const float *grad,
                                     const float *gguf_values, char *hf_name, size_t cap,
                                     int *hf_n_dims, int64_t *hf_shape, float *grad_hf)
{
    struct lt_convert_map m;
    lt_status st = lt_convert_map_gguf(cfg, gguf_name, &m);
    if (st != LT_OK)
        return st;
    if (n_dims < 1 || n_dims > LT_MAX_DIMS)
        return lt_fail(LT_ERR_INVALID, "GGUF tensor '%s': %d dims", gguf_name, n_dims);
    if ((size_t)snprintf(hf_name, cap, "%s", m.hf_name) >= cap)
        return lt_fail(LT_ERR_INVALID, "HF name '%s' does not fit %zu bytes", m.hf_name, cap);
    lt_convert_hf_shape(&m, n_dims, ne, hf_n_dims, hf_shape);
    return lt_convert_grad_to_hf(&m, *hf_n_dims, hf_shape, grad, gguf_values, grad_hf);
}

enum lt_type lt_convert_tensor_type(enum lt_convert_outtype t, const char *gguf_name, int n_dims,
                                    const int64_t *ne)
{
    if (n_dims <= 1 || ends_with(gguf_name, "_norm.weight") ||
        ends_with(gguf_name, ".ssm_conv1d.weight") || !ends_with(gguf_name, ".weight"))
        return LT_TYPE_F32;
    switch (t) {
    case LT_CONVERT_OUT_F16:
        return LT_TYPE_F16;
    case LT_CONVERT_OUT_BF16:
        return LT_TYPE_BF16;
    case LT_CONVERT_OUT_Q8_0:
        return ne[0] % 32 == 0 ? LT_TYPE_Q8_0 : LT_TYPE_F16;
    case LT_CONVERT_OUT_F32:
        break;
    }
    return LT_TYPE_F32;
}

lt_status lt_convert_outtype_parse(const char *s, enum lt_convert_outtype *out)
{
    static const char *const names[] = {"f32", "f16", "bf16", "q8_0"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *out = (enum lt_convert_outtype)i;
            return LT_OK;
        }
    return lt_fail(LT_ERR_INVALID, "unknown outtype '%s' (f32, f16, bf16, q8_0)", s);
}

const char *lt_convert_outtype_name(enum lt_convert_outtype t)
{
    static const char *const names[] = {"f32", "f16", "bf16", "q8_0"};
    return (unsigned)t < 4 ? names[t] : "?";
}
