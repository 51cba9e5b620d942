/* convert_config.c: reading an HF config.json into struct lt_hf_config.
 *
 * Field by field as llama.cpp's converter reads them: a nested "text_config" wins over the top
 * level; rope_theta comes from rope_parameters (or rope_scaling), else from the top level;
 * Qwen3.5's partial_rotary_factor and full_attention_interval default to 0.25 and 4. The
 * layer pattern of a Qwen3.5 config (layer_types) must be the one full_attention_interval
 * describes, since that interval is all a GGUF file records. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_impl.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>
#endif

const char *lt_hf_arch_gguf_name(enum lt_hf_arch a)
{
    static const char *const names[LT_HF_ARCH_COUNT] = {
        [LT_HF_ARCH_LLAMA] = "llama", [LT_HF_ARCH_QWEN2] = "qwen2", [LT_HF_ARCH_QWEN35] = "qwen35"};
    return (unsigned)a < LT_HF_ARCH_COUNT ? names[a] : "?";
}

#ifdef LATHE_HAVE_JANSSON

struct cfg_src {
    json_t *root, *text; /* text: "text_config" or NULL */
    const char *label;
};

static json_t *cfg_get(const struct cfg_src *s, const char *key)
{
    json_t *v = s->text ? json_object_get(s->text, key) : NULL;
    return v ? v : json_object_get(s->root, key);
}

/* An integer field; absent or null leaves *out and returns false. */
static lt_status cfg_int(const struct cfg_src *s, const char *key, bool required, int64_t *out,
                         bool *present)
{
    json_t *v = cfg_get(s, key);
    if (present)
        *present = false;
    if (!v || json_is_null(v)) {
        if (required)
            return lt_fail(LT_ERR_FORMAT, "%s: \"%s\" is missing", s->label, key);
        return LT_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return lt_fail(LT_ERR_FORMAT, "%s: \"%s\" is not a non-negative integer", s->label, key);
    *out = (int64_t)json_integer_value(v);
    if (present)
        *present = true;
    return LT_OK;
}

static lt_status num_value(const char *label, const char *key, json_t *v, double *out)
{
    if (!json_is_number(v))
        return lt_fail(LT_ERR_FORMAT, "%s: \"%s\" is not a number", label, key);
    *out = json_number_value(v);
    return LT_OK;
}

static lt_status cfg_num(const struct cfg_src *s, const char *key, double *out, bool *present)
{
    json_t *v = cfg_get(s, key);
    *present = false;
    if (!v || json_is_null(v))
        return LT_OK;
    lt_status st = num_value(s->label, key, v, out);
    *present = st == LT_OK;
    return st;
}

static lt_status read_arch(const struct cfg_src *s, struct lt_hf_config *cfg)
{
    static const struct {
        const char *name;
        enum lt_hf_arch arch;
    } known[] = {
        {"LlamaForCausalLM", LT_HF_ARCH_LLAMA},
        {"LLaMAForCausalLM", LT_HF_ARCH_LLAMA},
        {"Qwen2ForCausalLM", LT_HF_ARCH_QWEN2},
        {"Qwen3_5ForCausalLM", LT_HF_ARCH_QWEN35},
        {"Qwen3_5ForConditionalGeneration", LT_HF_ARCH_QWEN35},
        /* model_type, when "architectures" is absent */
        {"llama", LT_HF_ARCH_LLAMA},
        {"qwen2", LT_HF_ARCH_QWEN2},
        {"qwen3_5_text", LT_HF_ARCH_QWEN35},
        {"qwen3_5", LT_HF_ARCH_QWEN35},
    };
    const char *name = NULL;
    json_t *archs = json_object_get(s->root, "architectures");
    if (json_is_array(archs) && json_array_size(archs) > 0 &&
        json_is_string(json_array_get(archs, 0)))
        name = json_string_value(json_array_get(archs, 0));
    else if (json_is_string(cfg_get(s, "model_type")))
        name = json_string_value(cfg_get(s, "model_type"));
    if (!name)
        return lt_fail(LT_ERR_FORMAT, "%s: neither \"architectures\" nor \"model_type\" says what "
                                      "model this is",
                       s->label);
    snprintf(cfg->hf_arch, sizeof(cfg->hf_arch), "%s", name);
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (!strcmp(name, known[i].name)) {
            cfg->arch = known[i].arch;
            return LT_OK;
        }
    return lt_fail(LT_ERR_UNSUPPORTED,
                   "%s: architecture '%s' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
                   "Qwen3_5ForCausalLM)",
                   s->label, name);
}

/* rope_theta, rope_type and scaling, mrope sections, partial rotary factor. */
static lt_status read_rope(const struct cfg_src *s, struct lt_hf_config *cfg, double *partial)
{
    json_t *rope = cfg_get(s, "rope_parameters");
    if (!json_is_object(rope))
        rope = cfg_get(s, "rope_scaling");
    if (!json_is_object(rope))
        rope = NULL;
    if (rope && json_is_object(json_object_get(rope, "full_attention")))
        rope = json_object_get(rope, "full_attention");
    lt_status st;
    json_t *v = rope ? json_object_get(rope, "rope_theta") : NULL;
    if (v && !json_is_null(v)) {
        if ((st = num_value(s->label, "rope_theta", v, &cfg->rope_theta)) != LT_OK)
            return st;
        cfg->has_rope_theta = true;
    } else {
        static const char *const keys[] = {"global_rope_theta", "rope_global_theta",
                                           "rope_theta_global", "rope_theta", "rotary_emb_base"};
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && !cfg->has_rope_theta; i++)
            if ((st = cfg_num(s, keys[i], &cfg->rope_theta, &cfg->has_rope_theta)) != LT_OK)
                return st;
    }
    if (rope) {
        json_t *t = json_object_get(rope, "rope_type");
        if (!json_is_string(t))
            t = json_object_get(rope, "type");
        if (json_is_string(t))
            snprintf(cfg->rope_type, sizeof(cfg->rope_type), "%s", json_string_value(t));
        json_t *f = json_object_get(rope, "factor");
        if (json_is_number(f))
            cfg->rope_factor = json_number_value(f);
        json_t *o = json_object_get(rope, "original_max_position_embeddings");
        if (json_is_integer(o))
            cfg->rope_orig_ctx = (int64_t)json_integer_value(o);
    }
    /* Qwen3.5 always applies interleaved MRoPE; llama.cpp writes [11, 11, 10, 0] when the
     * config has no sections */
    const int32_t dflt[4] = {11, 11, 10, 0};
    memcpy(cfg->rope_sections, dflt, sizeof(dflt));
    json_t *sec = rope ? json_object_get(rope, "mrope_section") : NULL;
    if (json_is_array(sec)) {
        if (json_array_size(sec) > 4)
            return lt_fail(LT_ERR_FORMAT, "%s: \"mrope_section\" has more than 4 entries",
                           s->label);
        memset(cfg->rope_sections, 0, sizeof(cfg->rope_sections));
        for (size_t i = 0; i < json_array_size(sec); i++) {
            json_t *e = json_array_get(sec, i);
            if (!json_is_integer(e))
                return lt_fail(LT_ERR_FORMAT, "%s: \"mrope_section\"[%zu] is not an integer",
                               s->label, i);
            cfg->rope_sections[i] = (int32_t)json_integer_value(e);
        }
    }
    bool has_partial;
    *partial = 0.25;
    if ((st = cfg_num(s, "partial_rotary_factor", partial, &has_partial)) != LT_OK)
        return st;
    if (!has_partial && rope && json_is_number(json_object_get(rope, "partial_rotary_factor")))
        *partial = json_number_value(json_object_get(rope, "partial_rotary_factor"));
    return LT_OK;
}

static lt_status read_qwen35(const struct cfg_src *s, struct lt_hf_config *cfg)
{
    lt_status st;
    if ((st = cfg_int(s, "linear_conv_kernel_dim", true, &cfg->ssm_d_conv, NULL)) != LT_OK ||
        (st = cfg_int(s, "linear_num_key_heads", true, &cfg->ssm_n_k_heads, NULL)) != LT_OK ||
        (st = cfg_int(s, "linear_num_value_heads", true, &cfg->ssm_n_v_heads, NULL)) != LT_OK ||
        (st = cfg_int(s, "linear_key_head_dim", true, &cfg->ssm_d_k, NULL)) != LT_OK ||
        (st = cfg_int(s, "linear_value_head_dim", true, &cfg->ssm_d_v, NULL)) != LT_OK)
        return st;
    if (cfg->ssm_n_k_heads == 0 || cfg->ssm_n_v_heads % cfg->ssm_n_k_heads != 0)
        return lt_fail(LT_ERR_FORMAT,
                       "%s: linear_num_value_heads (%lld) is not a multiple of "
                       "linear_num_key_heads (%lld)",
                       s->label, (long long)cfg->ssm_n_v_heads, (long long)cfg->ssm_n_k_heads);
    cfg->full_attn_every = 4;
    if ((st = cfg_int(s, "full_attention_interval", false, &cfg->full_attn_every, NULL)) != LT_OK)
        return st;
    if (cfg->full_attn_every == 0)
        return lt_fail(LT_ERR_FORMAT, "%s: \"full_attention_interval\" is 0", s->label);
    json_t *types = cfg_get(s, "layer_types");
    if (json_is_array(types)) {
        if ((int64_t)json_array_size(types) != cfg->n_layer)
            return lt_fail(LT_ERR_FORMAT, "%s: \"layer_types\" has %zu entries for %lld layers",
                           s->label, json_array_size(types), (long long)cfg->n_layer);
        for (int64_t i = 0; i < cfg->n_layer; i++) {
            const char *t = json_string_value(json_array_get(types, (size_t)i));
            bool full = (i + 1) % cfg->full_attn_every == 0;
            const char *want = full ? "full_attention" : "linear_attention";
            if (!t || strcmp(t, want))
                return lt_fail(LT_ERR_UNSUPPORTED,
                               "%s: layer %lld is '%s' but a GGUF file can only say "
                               "\"every %lld-th layer is full attention\" (it would be '%s')",
                               s->label, (long long)i, t ? t : "?",
                               (long long)cfg->full_attn_every, want);
        }
    }
    return LT_OK;
}

lt_status lt_hf_config_parse(const char *text, size_t len, const char *label,
                             struct lt_hf_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return lt_fail(LT_ERR_FORMAT, "%s: line %d column %d: %s", label, jerr.line, jerr.column,
                       jerr.text);
    lt_status st;
    if (!json_is_object(root)) {
        st = lt_fail(LT_ERR_FORMAT, "%s: not a JSON object", label);
        goto out_free_json;
    }
    struct cfg_src s = {root, json_object_get(root, "text_config"), label};
    if (s.text && !json_is_object(s.text))
        s.text = NULL;
    if ((st = read_arch(&s, cfg)) != LT_OK)
        goto out_free_json;

    if ((st = cfg_int(&s, "num_hidden_layers", true, &cfg->n_layer, NULL)) != LT_OK ||
        (st = cfg_int(&s, "hidden_size", true, &cfg->n_embd, NULL)) != LT_OK ||
        (st = cfg_int(&s, "num_attention_heads", true, &cfg->n_head, NULL)) != LT_OK ||
        (st = cfg_int(&s, "vocab_size", true, &cfg->n_vocab, NULL)) != LT_OK ||
        (st = cfg_int(&s, "intermediate_size", false, &cfg->n_ff, NULL)) != LT_OK ||
        (st = cfg_int(&s, "max_position_embeddings", false, &cfg->n_ctx, NULL)) != LT_OK ||
        (st = cfg_int(&s, "num_key_value_heads", false, &cfg->n_head_kv, &cfg->has_n_head_kv)) !=
            LT_OK ||
        (st = cfg_int(&s, "head_dim", false, &cfg->head_dim, &cfg->has_head_dim)) != LT_OK ||
        (st = cfg_num(&s, "rms_norm_eps", &cfg->rms_eps, &cfg->has_rms_eps)) != LT_OK)
        goto out_free_json;
    if (cfg->n_head == 0 || cfg->n_layer == 0 || cfg->n_embd == 0) {
        st = lt_fail(LT_ERR_FORMAT, "%s: num_hidden_layers, hidden_size and num_attention_heads "
                                    "must be positive",
                     label);
        goto out_free_json;
    }
    if (!cfg->has_n_head_kv)
        cfg->n_head_kv = cfg->n_head;
    if (cfg->n_head_kv == 0 || cfg->n_head % cfg->n_head_kv != 0) {
        st = lt_fail(LT_ERR_FORMAT, "%s: num_attention_heads (%lld) is not a multiple of "
                                    "num_key_value_heads (%lld)",
                     label, (long long)cfg->n_head, (long long)cfg->n_head_kv);
        goto out_free_json;
    }
    if (!cfg->has_head_dim)
        cfg->head_dim = cfg->n_embd / cfg->n_head;
    json_t *tie = cfg_get(&s, "tie_word_embeddings");
    if (json_is_boolean(tie)) {
        cfg->tie_word_embeddings = json_is_true(tie);
        cfg->has_tie_word_embeddings = true;
    }
    double partial;
    if ((st = read_rope(&s, cfg, &partial)) != LT_OK)
        goto out_free_json;
    cfg->n_rot = cfg->head_dim;
    if (cfg->arch == LT_HF_ARCH_QWEN35) {
        cfg->n_rot = (int64_t)((double)cfg->head_dim * partial);
        if ((st = read_qwen35(&s, cfg)) != LT_OK)
            goto out_free_json;
    }
    st = LT_OK;
out_free_json:
    json_decref(root);
    return st;
}

#else

lt_status lt_hf_config_parse(const char *text, size_t len, const char *label,
                             struct lt_hf_config *cfg)
{
    (void)text;
    (void)len;
    memset(cfg, 0, sizeof(*cfg));
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: reading it needs jansson, which this build lacks",
                   label);
}

#endif

lt_status lt_hf_config_load(const char *hf_dir, struct lt_hf_config *cfg)
{
    char path[4096];
    lt_status st = lt_convert_join(path, sizeof(path), hf_dir, "config.json");
    if (st != LT_OK)
        return st;
    FILE *f = fopen(path, "rb");
    if (!f)
        return lt_fail(LT_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 16384;
            if (cap > ((size_t)64 << 20)) {
                st = lt_fail(LT_ERR_FORMAT, "%s: larger than 64 MiB", path);
                goto out_close;
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                st = lt_fail(LT_ERR_NOMEM, "%s: out of memory", path);
                goto out_close;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        st = lt_fail(LT_ERR_IO, "%s: read error", path);
        goto out_close;
    }
    st = lt_hf_config_parse(buf ? buf : "", len, path, cfg);
out_close:
    free(buf);
    fclose(f);
    return st;
}
