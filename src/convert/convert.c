/* convert.c: `lathe convert`: an HF model folder to one GGUF file.
 *
 * Plans first, writes second: every tensor of the checkpoint is mapped to its GGUF name,
 * shape and type (and refused, with its name, if it has none) before the writer is given
 * anything, so a checkpoint the converter does not understand fails before a byte is written.
 * Tensor bytes are produced one tensor at a time inside the writer's fill callback (read as
 * float32, transformed, converted to the output type), so memory holds one tensor, not the
 * model. The writer writes to a temporary file and renames it: a failed convert leaves no
 * output behind. Metadata keys and their order follow llama.cpp's converter. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert/convert_impl.h"
#include "convert/safetensors.h"
#include "lathe/convert.h"
#include "lathe/gguf.h"

void lt_convert_logf(const struct lt_convert_log *l, const char *fmt, ...)
{
    if (!l || !l->fn)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    l->fn(l->user, line);
}

lt_status lt_convert_join(char *dst, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(dst, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return lt_fail(LT_ERR_INVALID, "path too long: %s/%s", dir, name);
    return LT_OK;
}

bool lt_convert_is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* One output tensor: where its values come from and what they become. */
struct conv_job {
    const struct lt_st_tensor *src;
    struct lt_convert_map map;
    enum lt_type type;
    int n_dims;
    int64_t ne[LT_MAX_DIMS];
    size_t nbytes;
};

/* The writer's fill callback: HF values -> float32 -> transform -> output type. */
static lt_status conv_fill(void *user, void *dst, size_t nbytes)
{
    const struct conv_job *job = user;
    const struct lt_st_tensor *t = job->src;
    size_t n = (size_t)t->n_elements;
    lt_status st = LT_OK;
    if (nbytes != job->nbytes)
        return lt_fail(LT_ERR_INVALID, "tensor '%s': the writer asks for %zu bytes, not %zu",
                       job->map.gguf_name, nbytes, job->nbytes);
    /* without a permutation the element-wise map runs in place: one buffer, not two */
    bool in_place = job->map.perm == LT_CONVERT_PERM_NONE;
    float *hf = malloc((n ? n : 1) * sizeof(float));
    float *out = in_place ? hf : malloc((n ? n : 1) * sizeof(float));
    if (!hf || !out) {
        st = lt_fail(LT_ERR_NOMEM, "tensor '%s': out of memory for %zu floats", t->name, n);
        goto out_free;
    }
    lt_st_tensor_read_f32(t, hf);
    if ((st = lt_convert_values(&job->map, t->n_dims, t->shape, hf, out)) != LT_OK)
        goto out_free;
    const struct lt_type_traits *tr = lt_type_traits(job->type);
    if (!tr || !tr->from_float) {
        st = lt_fail(LT_ERR_UNSUPPORTED, "tensor '%s': lathe cannot write type %s",
                     job->map.gguf_name, lt_type_name(job->type));
        goto out_free;
    }
    tr->from_float(out, dst, (int64_t)n);
out_free:
    if (!in_place)
        free(out);
    free(hf);
    return st;
}

static int64_t file_type_of(enum lt_convert_outtype t)
{
    switch (t) {
    case LT_CONVERT_OUT_F16:
        return 1; /* MOSTLY_F16 */
    case LT_CONVERT_OUT_BF16:
        return 32; /* MOSTLY_BF16 */
    case LT_CONVERT_OUT_Q8_0:
        return 7; /* MOSTLY_Q8_0 */
    case LT_CONVERT_OUT_F32:
        break;
    }
    return 0; /* ALL_F32 */
}

/* "{arch}.suffix" */
static const char *akey(char *buf, size_t cap, const struct lt_hf_config *cfg, const char *suffix)
{
    snprintf(buf, cap, "%s.%s", lt_hf_arch_gguf_name(cfg->arch), suffix);
    return buf;
}

static lt_status set_u32(struct lt_gguf_writer *w, const struct lt_hf_config *cfg,
                         const char *suffix, int64_t v)
{
    char k[128];
    if (v < 0 || v > UINT32_MAX)
        return lt_fail(LT_ERR_FORMAT, "%s = %lld does not fit a u32", suffix, (long long)v);
    return lt_gguf_writer_set_u32(w, akey(k, sizeof(k), cfg, suffix), (uint32_t)v);
}

static lt_status set_f32(struct lt_gguf_writer *w, const struct lt_hf_config *cfg,
                         const char *suffix, double v)
{
    char k[128];
    return lt_gguf_writer_set_f32(w, akey(k, sizeof(k), cfg, suffix), (float)v);
}

/* The model's hyperparameters, in the order llama.cpp's TextModel.set_gguf_parameters and its
 * architecture subclasses write them. */
static lt_status write_hparams(struct lt_gguf_writer *w, const struct lt_hf_config *cfg,
                               enum lt_convert_outtype outtype, const struct lt_convert_log *log)
{
    lt_status st;
    char k[128];
    if ((st = set_u32(w, cfg, "block_count", cfg->n_layer)) != LT_OK)
        return st;
    if (cfg->n_ctx && (st = set_u32(w, cfg, "context_length", cfg->n_ctx)) != LT_OK)
        return st;
    if ((st = set_u32(w, cfg, "embedding_length", cfg->n_embd)) != LT_OK)
        return st;
    if (cfg->n_ff && (st = set_u32(w, cfg, "feed_forward_length", cfg->n_ff)) != LT_OK)
        return st;
    if ((st = set_u32(w, cfg, "attention.head_count", cfg->n_head)) != LT_OK)
        return st;
    if (cfg->has_n_head_kv && (st = set_u32(w, cfg, "attention.head_count_kv", cfg->n_head_kv)))
        return st;

    if (cfg->rope_type[0] && strcmp(cfg->rope_type, "default")) {
        if (!strcmp(cfg->rope_type, "linear") && cfg->rope_factor > 0) {
            if ((st = lt_gguf_writer_set_str(w, akey(k, sizeof(k), cfg, "rope.scaling.type"),
                                             "linear")) != LT_OK ||
                (st = set_f32(w, cfg, "rope.scaling.factor", cfg->rope_factor)) != LT_OK)
                return st;
        } else if (!strcmp(cfg->rope_type, "yarn") && cfg->rope_factor > 0) {
            if ((st = lt_gguf_writer_set_str(w, akey(k, sizeof(k), cfg, "rope.scaling.type"),
                                             "yarn")) != LT_OK ||
                (st = set_f32(w, cfg, "rope.scaling.factor", cfg->rope_factor)) != LT_OK ||
                (st = set_u32(w, cfg, "rope.scaling.original_context_length",
                              cfg->rope_orig_ctx)) != LT_OK)
                return st;
        } else if (!strcmp(cfg->rope_type, "llama3")) {
            return lt_fail(LT_ERR_UNSUPPORTED,
                           "rope_type 'llama3' needs a rope_freqs tensor, which lathe's converter "
                           "does not make yet");
        } else {
            lt_convert_logf(log, "warning: rope_type '%s' is not written", cfg->rope_type);
        }
    }
    if (cfg->has_rope_theta && (st = set_f32(w, cfg, "rope.freq_base", cfg->rope_theta)) != LT_OK)
        return st;
    if (cfg->has_rms_eps &&
        (st = set_f32(w, cfg, "attention.layer_norm_rms_epsilon", cfg->rms_eps)) != LT_OK)
        return st;
    if (cfg->has_head_dim && ((st = set_u32(w, cfg, "attention.key_length", cfg->head_dim)) ||
                              (st = set_u32(w, cfg, "attention.value_length", cfg->head_dim))))
        return st;
    if ((st = lt_gguf_writer_set_u32(w, "general.file_type", (uint32_t)file_type_of(outtype))))
        return st;

    switch (cfg->arch) {
    case LT_HF_ARCH_LLAMA:
        if ((st = set_u32(w, cfg, "vocab_size", cfg->n_vocab)) != LT_OK ||
            (st = set_u32(w, cfg, "rope.dimension_count", cfg->n_rot)) != LT_OK)
            return st;
        break;
    case LT_HF_ARCH_QWEN35:
        if ((st = set_u32(w, cfg, "ssm.conv_kernel", cfg->ssm_d_conv)) != LT_OK ||
            (st = set_u32(w, cfg, "ssm.state_size", cfg->ssm_d_k)) != LT_OK ||
            (st = set_u32(w, cfg, "ssm.group_count", cfg->ssm_n_k_heads)) != LT_OK ||
            (st = set_u32(w, cfg, "ssm.time_step_rank", cfg->ssm_n_v_heads)) != LT_OK ||
            (st = set_u32(w, cfg, "ssm.inner_size", cfg->ssm_d_v * cfg->ssm_n_v_heads)) !=
                LT_OK ||
            (st = set_u32(w, cfg, "full_attention_interval", cfg->full_attn_every)) != LT_OK ||
            (st = set_u32(w, cfg, "rope.dimension_count", cfg->n_rot)) != LT_OK ||
            (st = lt_gguf_writer_set_arr(w, akey(k, sizeof(k), cfg, "rope.dimension_sections"),
                                         LT_GGUF_TYPE_I32, cfg->rope_sections, 4)) != LT_OK)
            return st;
        break;
    case LT_HF_ARCH_QWEN2:
    case LT_HF_ARCH_COUNT:
        break;
    }
    return LT_OK;
}

/* basename of the HF folder, as llama.cpp names a model with no model card */
static void model_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

static lt_status plan_jobs(const struct lt_hf_config *cfg, const struct lt_st_checkpoint *ck,
                           enum lt_convert_outtype outtype, const struct lt_convert_log *log,
                           struct conv_job *jobs, int64_t *n_jobs)
{
    int64_t n = 0;
    lt_status st;
    for (int64_t i = 0; i < lt_st_checkpoint_n_tensors(ck); i++) {
        const struct lt_st_tensor *t = lt_st_checkpoint_tensor(ck, i);
        struct conv_job *j = &jobs[n];
        if ((st = lt_convert_map_hf(cfg, t->name, &j->map)) != LT_OK)
            return st;
        if (j->map.skip) {
            lt_convert_logf(log, "skipped %s", t->name);
            continue;
        }
        for (int64_t k = 0; k < n; k++)
            if (!strcmp(jobs[k].map.gguf_name, j->map.gguf_name))
                return lt_fail(LT_ERR_FORMAT, "tensors '%s' and '%s' both become '%s'",
                               jobs[k].src->name, t->name, j->map.gguf_name);
        if ((st = lt_convert_gguf_shape(&j->map, t->n_dims, t->shape, &j->n_dims, j->ne)) != LT_OK)
            return st;
        j->src = t;
        j->type = lt_convert_tensor_type(outtype, j->map.gguf_name, j->n_dims, j->ne);
        j->nbytes = lt_row_size(j->type, j->ne[0]) * (size_t)(j->ne[1] * j->ne[2] * j->ne[3]);
        n++;
    }
    *n_jobs = n;
    bool have_embd = false, have_norm = false;
    for (int64_t k = 0; k < n; k++) {
        have_embd |= !strcmp(jobs[k].map.gguf_name, "token_embd.weight");
        have_norm |= !strcmp(jobs[k].map.gguf_name, "output_norm.weight");
    }
    if (!have_embd || !have_norm)
        return lt_fail(LT_ERR_FORMAT, "the checkpoint lacks %s",
                       !have_embd ? "model.embed_tokens.weight" : "model.norm.weight");
    return LT_OK;
}

lt_status lt_convert_hf_to_gguf(const struct lt_convert_params *p, struct lt_convert_stats *stats)
{
    struct lt_convert_log log = {p->log, p->log_user};
    struct lt_hf_config cfg;
    struct lt_st_checkpoint *ck = NULL;
    struct lt_gguf_writer *w = NULL;
    struct conv_job *jobs = NULL;
    int64_t n_jobs = 0, n_tokens = 0;
    char name[256];
    if (stats)
        memset(stats, 0, sizeof(*stats));
    if (!p->hf_dir || !p->out_path)
        return lt_fail(LT_ERR_INVALID, "convert: the HF folder and the output path are needed");

    lt_status st = lt_hf_config_load(p->hf_dir, &cfg);
    if (st != LT_OK)
        return st;
    if ((st = lt_st_checkpoint_open(p->hf_dir, &ck)) != LT_OK)
        return st;
    if (!cfg.has_tie_word_embeddings)
        cfg.tie_word_embeddings = lt_st_checkpoint_find(ck, "lm_head.weight") == NULL;
    lt_convert_logf(&log, "%s (%s): %lld layers, %lld tensors in %d file(s), outtype %s",
                    cfg.hf_arch, lt_hf_arch_gguf_name(cfg.arch), (long long)cfg.n_layer,
                    (long long)lt_st_checkpoint_n_tensors(ck), lt_st_checkpoint_n_files(ck),
                    lt_convert_outtype_name(p->outtype));

    int64_t n_src = lt_st_checkpoint_n_tensors(ck);
    jobs = calloc((size_t)(n_src ? n_src : 1), sizeof(*jobs));
    if (!jobs) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory planning %lld tensors", (long long)n_src);
        goto out_close;
    }
    if ((st = plan_jobs(&cfg, ck, p->outtype, &log, jobs, &n_jobs)) != LT_OK)
        goto out_close;

    if (!(w = lt_gguf_writer_new())) {
        st = LT_ERR_NOMEM;
        goto out_close;
    }
    model_name(p->hf_dir, name, sizeof(name));
    if ((st = lt_gguf_writer_set_str(w, "general.architecture", lt_hf_arch_gguf_name(cfg.arch))) ||
        (st = lt_gguf_writer_set_str(w, "general.type", "model")) ||
        (st = lt_gguf_writer_set_str(w, "general.name", name)) ||
        (st = write_hparams(w, &cfg, p->outtype, &log)) ||
        (st = lt_convert_vocab(w, p->hf_dir, &cfg, &log, &n_tokens)) ||
        (st = lt_gguf_writer_set_u32(w, "general.quantization_version", 2)))
        goto out_close;

    int64_t n_params = 0;
    for (int64_t k = 0; k < n_jobs; k++) {
        struct conv_job *j = &jobs[k];
        if ((st = lt_gguf_writer_add_tensor_fill(w, j->map.gguf_name, j->type, j->n_dims, j->ne,
                                                 j->nbytes, conv_fill, j)) != LT_OK)
            goto out_close;
        n_params += j->src->n_elements;
        lt_convert_logf(&log, "%-32s <- %-48s %s [%lld, %lld, %lld, %lld]", j->map.gguf_name,
                        j->src->name, lt_type_name(j->type), (long long)j->ne[0],
                        (long long)j->ne[1], (long long)j->ne[2], (long long)j->ne[3]);
    }
    if ((st = lt_gguf_writer_write(w, p->out_path)) != LT_OK)
        goto out_close;
    if (stats) {
        struct stat sb;
        stats->n_tensors = n_jobs;
        stats->n_params = n_params;
        stats->n_vocab = n_tokens;
        stats->n_bytes = stat(p->out_path, &sb) == 0 ? (int64_t)sb.st_size : 0;
    }
out_close:
    lt_gguf_writer_free(w);
    free(jobs);
    lt_st_checkpoint_close(ck);
    return st;
}
