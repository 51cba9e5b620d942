/* convert.h: Hugging Face checkpoints to GGUF, and back again for gradients.
 *
 * `lt_convert_hf_to_gguf` turns an HF model folder (config.json, model.safetensors or shards,
 * optionally tokenizer.json) into a GGUF file with llama.cpp's tensor names, metadata keys and
 * conversion transforms, for the architectures llama (LlamaForCausalLM, SmolLM2), qwen2
 * (Qwen2ForCausalLM) and qwen35 (Qwen3_5ForCausalLM / qwen3_5_text). The file is written to a
 * temporary name and renamed into place: a failed convert leaves nothing behind.
 *
 * Every transform from one HF parameter to one GGUF tensor is a permutation of its elements
 * (value heads reordered from grouped to tiled order, llama's rotary row permutation, dropping
 * conv1d's size-1 axis) followed by an element-wise map (x + 1 for Qwen3.5's (1 + w) RMSNorm
 * weights, -exp(x) for A_log). Both parts invert exactly, which is what the model checker
 * needs: `lt_convert_grad_to_hf` turns lathe's gradient of a GGUF tensor into the gradient of
 * the HF parameter it came from, in the HF layout, for comparison with transformers'.
 *
 * Layouts: an HF tensor of shape [d0, d1, ...] (outermost first, row-major) and the GGUF
 * tensor made from it share their flat element order up to the permutation; the GGUF ne[] is
 * the HF shape reversed (ne[0] = the last HF dimension). */
#ifndef LATHE_CONVERT_H
#define LATHE_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/status.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum lt_hf_arch {
    LT_HF_ARCH_LLAMA,  /* GGUF "llama" */
    LT_HF_ARCH_QWEN2,  /* GGUF "qwen2" */
    LT_HF_ARCH_QWEN35, /* GGUF "qwen35" */
    LT_HF_ARCH_COUNT
};

const char *lt_hf_arch_gguf_name(enum lt_hf_arch a); /* "llama", "qwen2", "qwen35" */

/* What the converter reads from config.json (a nested "text_config" is merged over the top
 * level, as llama.cpp does). Counts absent from the file are 0 unless noted. */
struct lt_hf_config {
    enum lt_hf_arch arch;
    char hf_arch[64]; /* architectures[0], or model_type when that is absent */

    int64_t n_vocab;   /* vocab_size */
    int64_t n_ctx;     /* max_position_embeddings */
    int64_t n_embd;    /* hidden_size */
    int64_t n_ff;      /* intermediate_size */
    int64_t n_layer;   /* num_hidden_layers */
    int64_t n_head;    /* num_attention_heads */
    int64_t n_head_kv; /* num_key_value_heads; n_head when absent */
    bool has_n_head_kv;
    int64_t head_dim; /* head_dim; n_embd / n_head when absent */
    bool has_head_dim;
    int64_t n_rot; /* rotary dims: head_dim (llama), head_dim * partial_rotary_factor (qwen35) */
    double rms_eps;
    bool has_rms_eps;
    double rope_theta;
    bool has_rope_theta;
    char rope_type[32]; /* "" or rope_parameters.rope_type ("default", "linear", "yarn") */
    double rope_factor;
    int64_t rope_orig_ctx;
    bool tie_word_embeddings;
    bool has_tie_word_embeddings; /* else decided by whether lm_head.weight exists */

    /* qwen35: Gated DeltaNet layers and the gated attention layers between them */
    int64_t ssm_d_conv;      /* linear_conv_kernel_dim */
    int64_t ssm_n_k_heads;   /* linear_num_key_heads */
    int64_t ssm_n_v_heads;   /* linear_num_value_heads */
    int64_t ssm_d_k;         /* linear_key_head_dim */
    int64_t ssm_d_v;         /* linear_value_head_dim */
    int64_t full_attn_every; /* full_attention_interval (4 when absent, as llama.cpp) */
    int32_t rope_sections[4]; /* mrope_section padded to 4, or llama.cpp's [11, 11, 10, 0] */
};

/* Reads HF_DIR/config.json. Refuses (LT_ERR_UNSUPPORTED) an architecture other than the
 * three above, and (LT_ERR_FORMAT) a config missing a field the converter needs. */
lt_status lt_hf_config_load(const char *hf_dir, struct lt_hf_config *cfg);
/* The same from JSON text (label names it in messages). */
lt_status lt_hf_config_parse(const char *json, size_t len, const char *label,
                             struct lt_hf_config *cfg);

/* ---- one parameter: names and transforms ---- */

enum lt_convert_fn {
    LT_CONVERT_FN_COPY,     /* y = x */
    LT_CONVERT_FN_PLUS_ONE, /* y = x + 1 (qwen35 RMSNorm weights stored as w for (1 + w)) */
    LT_CONVERT_FN_NEG_EXP,  /* y = -exp(x) (A_log -> ssm_a); dy/dx = y */
};

enum lt_convert_perm {
    LT_CONVERT_PERM_NONE,
    /* value heads, grouped by key head in HF ([G0 v0..v(R-1), G1 v0..] ) to tiled order
     * ([G0 v0, G1 v0, ..., G0 v1, G1 v1, ...]): HF head g*R + r goes to r*n_groups + g, so
     * tiled head h reads key head h % n_groups */
    LT_CONVERT_PERM_V_HEADS,
    /* llama's rotary permutation: within each head of head_dim rows, HF row j*(hd/2) + i
     * (the halves layout) goes to row 2*i + j (the interleaved pairs layout) */
    LT_CONVERT_PERM_ROPE,
};

struct lt_convert_map {
    char hf_name[128];          /* canonical HF name ("model.layers.3.mlp.up_proj.weight") */
    char gguf_name[LT_MAX_NAME]; /* "blk.3.ffn_up.weight" */
    bool skip;                  /* not written (lm_head of a tied model, rotary inv_freq, MTP) */
    enum lt_convert_fn fn;
    enum lt_convert_perm perm;
    int perm_axis;          /* the HF axis the permutation acts on: 0 rows, 1 columns */
    int64_t perm_offset;    /* entries at the start of the axis left in place (q, k of qkv) */
    int64_t perm_head_dim;  /* entries per head along the axis */
    int64_t perm_n_groups;  /* V_HEADS: key heads; ROPE: heads */
    int64_t perm_per_group; /* V_HEADS: value heads per key head; ROPE: 1 */
    bool squeeze;           /* drop HF axis 1, of size 1 (conv1d [channels, 1, kernel]) */
};

/* The map for an HF parameter. "model.language_model." is read as "model." (multimodal
 * checkpoints). An unknown name is LT_ERR_UNSUPPORTED; a layer index >= n_layer is
 * LT_ERR_FORMAT. */
lt_status lt_convert_map_hf(const struct lt_hf_config *cfg, const char *hf_name,
                            struct lt_convert_map *m);
/* The map for a GGUF tensor name (the reverse lookup; m->hf_name is the canonical HF name). */
lt_status lt_convert_map_gguf(const struct lt_hf_config *cfg, const char *gguf_name,
                              struct lt_convert_map *m);

/* Where HF index i along the permuted axis lands in the GGUF tensor. */
int64_t lt_convert_perm_index(const struct lt_convert_map *m, int64_t i);

/* The GGUF tensor's dims from the HF shape: *n_dims_out (1..4) and ne[4]. LT_ERR_FORMAT when
 * the shape does not fit the map (an axis the config sizes differently, a squeezed axis that
 * is not 1, more than 4 dims left). */
lt_status lt_convert_gguf_shape(const struct lt_convert_map *m, int hf_n_dims,
                                const int64_t *hf_shape, int *n_dims_out, int64_t *ne);
/* The HF shape from the GGUF dims (the inverse of the above): *hf_n_dims and hf_shape. */
void lt_convert_hf_shape(const struct lt_convert_map *m, int n_dims, const int64_t *ne,
                         int *hf_n_dims, int64_t *hf_shape);

/* Forward: the HF parameter's values (dense, HF layout) -> the GGUF tensor's (dense, GGUF
 * order). hf and gguf may be the same buffer only when m->perm is NONE; otherwise they must
 * not overlap. */
lt_status lt_convert_values(const struct lt_convert_map *m, int hf_n_dims, const int64_t *hf_shape,
                            const float *hf, float *gguf);

/* Backward: d loss / d (GGUF tensor), dense in GGUF order, -> d loss / d (HF parameter), dense
 * in the HF layout. gguf_values (the GGUF tensor's values) is needed for NEG_EXP, whose
 * derivative is the value itself (d(-exp(a))/da = -exp(a)); NULL is fine otherwise. A +1 shift
 * leaves the gradient unchanged; permutations are undone. */
lt_status lt_convert_grad_to_hf(const struct lt_convert_map *m, int hf_n_dims,
                                const int64_t *hf_shape, const float *grad_gguf,
                                const float *gguf_values, float *grad_hf);

/* All of the above in one call, for the model checker: lathe's gradient of the GGUF tensor
 * `gguf_name` (dims n_dims/ne, dense float in GGUF order) and that tensor's values -> the HF
 * parameter's name (hf_name, cap bytes), shape (*hf_n_dims, hf_shape[LT_MAX_DIMS + 1]) and
 * gradient (grad_hf, as many floats as grad). */
lt_status lt_convert_grad_gguf_to_hf(const struct lt_hf_config *cfg, const char *gguf_name,
                                     int n_dims, const int64_t *ne, const float *grad,
                                     const float *gguf_values, char *hf_name, size_t cap,
                                     int *hf_n_dims, int64_t *hf_shape, float *grad_hf);

/* ---- the whole conversion ---- */

enum lt_convert_outtype {
    LT_CONVERT_OUT_F32,
    LT_CONVERT_OUT_F16,
    LT_CONVERT_OUT_BF16,
    LT_CONVERT_OUT_Q8_0,
};

/* "f32", "f16", "bf16", "q8_0" */
lt_status lt_convert_outtype_parse(const char *s, enum lt_convert_outtype *out);
const char *lt_convert_outtype_name(enum lt_convert_outtype t);

/* The GGUF type llama.cpp's converter gives a tensor: F32 for 1-D tensors, names ending in
 * "_norm.weight", ssm_conv1d and anything not ending in ".weight"; otherwise the outtype,
 * with Q8_0 falling back to F16 for rows not a multiple of 32. */
enum lt_type lt_convert_tensor_type(enum lt_convert_outtype t, const char *gguf_name, int n_dims,
                                    const int64_t *ne);

struct lt_convert_params {
    const char *hf_dir;
    const char *out_path;
    enum lt_convert_outtype outtype;
    /* progress and warnings, one line each, no newline; NULL: silent */
    void (*log)(void *user, const char *line);
    void *log_user;
};

struct lt_convert_stats {
    int64_t n_tensors; /* written */
    int64_t n_params;  /* elements written */
    int64_t n_bytes;   /* the output file's size */
    int64_t n_vocab;   /* tokens written, 0 when HF_DIR has no tokenizer.json */
};

/* Converts; stats may be NULL. */
lt_status lt_convert_hf_to_gguf(const struct lt_convert_params *p, struct lt_convert_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
