/* model.h: language models from GGUF files: loading, inference sessions and loss graphs.
 *
 * Architectures (GGUF general.architecture): "llama" (SmolLM2 and kin), "qwen2" (Qwen2.5:
 * QKV bias, GQA) and "qwen35" (Qwen3.5: Gated DeltaNet layers with a gated full-attention
 * layer every full_attention_interval; an MTP block, when present, is loaded by name only
 * and never run). Tensor names and metadata keys are llama.cpp's, so its files load as
 * they are.
 *
 * A model is immutable after loading and may serve several sessions at once. Its weights
 * are used in place (the GGUF mapping, any type mul_mat and get_rows read) or, when a
 * backend is given, uploaded to that backend's buffer.
 *
 * A session holds the per-sequence state of inference for up to n_seq_max independent
 * sequences of up to n_ctx tokens each: the KV cache of attention layers, the conv and
 * recurrent states of DeltaNet layers, and each sequence's position. Prefill appends a
 * run of tokens to one sequence; decode appends one token to each of several sequences
 * (at their own positions) in one graph. Both return logits. A session is used by one
 * thread at a time.
 *
 * The loss graph is the training forward pass: mean next-token cross-entropy of a batch
 * [n_tokens, n_seqs], built in a caller's context over the model's weights, or over the
 * replacements and LoRA adapters the caller passes (lt_model_adapters). Every intermediate
 * keeps llama.cpp's names ("Qcur-3", "k_conv-2", "attn_norm-0"), which appear in refusals. */
#ifndef LATHE_MODEL_H
#define LATHE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "lathe/backend.h"
#include "lathe/gguf.h"
#include "lathe/ops.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum lt_arch { LT_ARCH_LLAMA = 0, LT_ARCH_QWEN2, LT_ARCH_QWEN35, LT_ARCH_COUNT };

const char *lt_arch_name(enum lt_arch a); /* "llama", "qwen2", "qwen35" */

struct lt_model_hparams {
    enum lt_arch arch;
    int64_t n_vocab;
    int64_t n_ctx_train; /* {arch}.context_length */
    int64_t n_embd;
    int64_t n_layer;      /* layers run (an MTP block is not counted) */
    int64_t n_layer_file; /* {arch}.block_count */
    int64_t n_ff;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;            /* attention.key_length, else n_embd / n_head */
    int64_t n_rot;               /* rope.dimension_count, else head_dim */
    enum lt_rope_mode rope_mode; /* llama: NORMAL (the converter permuted q, k); else NEOX */
    float rope_base;
    float rms_eps;
    bool tied_output; /* no output.weight: the head is token_embd */
    /* qwen35 (0 otherwise) */
    int64_t full_attn_interval; /* layer il is full attention when (il + 1) % this == 0 */
    int64_t ssm_d_conv;         /* conv kernel */
    int64_t ssm_d_state;        /* head_k_dim */
    int64_t ssm_n_k_heads;      /* ssm.group_count */
    int64_t ssm_n_v_heads;      /* ssm.time_step_rank */
    int64_t ssm_d_inner;        /* head_v_dim * n_v_heads (ssm.inner_size) */
};

struct lt_model;

struct lt_model_params {
    /* Where the weights live. NULL: on the host, in place in the GGUF mapping (read by the
     * CPU backend). Otherwise uploaded into one buffer of this backend. */
    struct lt_backend *weights_backend;
};

/* Opens and validates a GGUF model. A missing tensor or key, a tensor of the wrong shape or
 * an unknown architecture is refused (LT_ERR_FORMAT / LT_ERR_UNSUPPORTED) with a message
 * naming it. params may be NULL. */
lt_status lt_model_load(const char *path, const struct lt_model_params *params,
                        struct lt_model **out);
void lt_model_free(struct lt_model *m); /* NULL is fine */

const struct lt_model_hparams *lt_model_hparams(const struct lt_model *m);
const struct lt_gguf *lt_model_gguf(const struct lt_model *m); /* for the tokenizer */
/* Layer il is a Gated DeltaNet layer (qwen35), not attention. */
bool lt_model_layer_is_recurrent(const struct lt_model *m, int il);

/* The weights the graphs read, by index (GGUF names, e.g. "blk.3.attn_q.weight"). */
int lt_model_n_weights(const struct lt_model *m);
struct lt_tensor *lt_model_weight(const struct lt_model *m, int i);
struct lt_tensor *lt_model_find_weight(const struct lt_model *m, const char *name);

/* ---- adapters: what a training graph reads instead of, or next to, a weight ---- */

/* y = W x + scale * B (A x). a [n_in, rank], b [rank, n_out] (GGUF layout: ne0 first). */
struct lt_model_lora {
    const struct lt_tensor *w; /* the model weight adapted (a 2-D matmul weight) */
    struct lt_tensor *a, *b;
    float scale;
};

/* The graph reads `with` wherever it would read `w` (same shape; e.g. an F32 copy). */
struct lt_model_replace {
    const struct lt_tensor *w;
    struct lt_tensor *with;
};

struct lt_model_adapters {
    const struct lt_model_replace *replace;
    int n_replace;
    const struct lt_model_lora *lora;
    int n_lora;
    /* products by an F32 weight (a trainable copy) read it and its activation rounded to
     * BF16, with F32 sums: a device runs them on its BF16 matrix units (training speed);
     * check-ref and the CPU oracle leave this off */
    bool bf16_products;
    /* the loss graph's head and loss as one LINEAR_CE (no [V, N] logits: the loss graph's
     * logits are then NULL) when the head is a float matrix without adapters; a device's
     * training job sets it, check-ref and the CPU leave it off */
    bool fused_loss;
    /* each attention layer's scores, softmax and values as one FLASH_ATTN node (no T x T
     * scores or probabilities, in the forward or the backward); a device's training job with
     * BF16 products sets it (lt_model_flash_attn_on; LATHE_FLASH_ATTN=0 or 1 decides
     * otherwise), check-ref leaves it off */
    bool flash_attn;
    /* with bf16_products: keep the weighted norms as their chain of ops (RMS_NORM, MUL by the
     * weight, and SILU and MUL for a gate) instead of one RMS_NORM with its weight and gate,
     * whose rule is one RMS_NORM_MUL_BACK; the same values, for a test to hold the two
     * to each other (no job sets it) */
    bool chain_norms;
};

/* Whether graphs for backend be should take their attention as FLASH_ATTN (no T x T scores):
 * LATHE_FLASH_ATTN=1 asks for it and =0 refuses it, else by_default decides (a device's
 * training job with BF16 products: yes; sessions' prefill: not yet); and be runs FLASH_ATTN
 * and FLASH_ATTN_BACK for m's heads (asked of one query against one key with a mask: a
 * claim looks at types and shapes only). A backend that cannot keeps the chain of products
 * and SOFT_MAX, so nothing that ran there before moves to the CPU or is refused for it. */
bool lt_model_flash_attn_on(const struct lt_model *m, struct lt_backend *be, bool by_default);

/* F32 copies of every weight (dequantised), flagged LT_FLAG_PARAM and named as the weight,
 * in host memory owned by the set: full fine-tuning, and gradients for checking. filter
 * (NULL: all) picks the weights to copy. */
struct lt_model_f32_params;
lt_status lt_model_f32_params_new(const struct lt_model *m,
                                  bool (*filter)(void *user, const struct lt_tensor *w), void *user,
                                  struct lt_model_f32_params **out);
/* The same set with its memory reserved, not committed, and nothing copied: shapes, flags
 * and final addresses only, enough to build, place and measure a training graph over it;
 * nothing may read or write the copies before lt_model_f32_params_commit, which commits the
 * memory and copies the weights. */
lt_status lt_model_f32_params_reserve(const struct lt_model *m,
                                      bool (*filter)(void *user, const struct lt_tensor *w),
                                      void *user, struct lt_model_f32_params **out);
lt_status lt_model_f32_params_commit(struct lt_model_f32_params *p); /* LT_OK when done before */
void lt_model_f32_params_free(struct lt_model_f32_params *p);
/* The replacement list, for lt_model_adapters.replace. */
const struct lt_model_replace *lt_model_f32_params_list(const struct lt_model_f32_params *p,
                                                        int *n);

/* ---- the loss graph ---- */

struct lt_model_loss_graph {
    struct lt_tensor *tokens; /* I32 [n_tokens, n_seqs], input */
    struct lt_tensor *pos;    /* I32 [n_tokens * n_seqs], input: 0..n_tokens-1 per sequence */
    struct lt_tensor *labels; /* I32 [n_tokens * n_seqs], input: the token expected after
                               * each position (the caller shifts), -1 = no loss there */
    struct lt_tensor *logits; /* F32 [n_vocab, n_tokens * n_seqs], flagged OUTPUT; NULL with
                                 adapters->fused_loss (LINEAR_CE) */
    struct lt_tensor *loss;   /* F32 [1]: mean over the unmasked labels */
    /* the residual stream entering each layer, then the last layer's output (n_layer + 1
     * tensors, in ctx): the boundaries between which a training graph may recompute a
     * layer's activations (lt_train_graph_params.remat_bounds) */
    struct lt_tensor **bounds;
    int n_bounds;
    /* a packed graph's inputs (lt_model_build_loss_packed; NULL otherwise), filled by
     * lt_model_loss_graph_set_packed: the attention mask F32 [n_tokens, n_tokens, 1,
     * n_seqs] (none with adapters->flash_attn: FLASH_ATTN reads the examples' boundaries
     * from pos) and the DeltaNet gate reset F32 [1, n_tokens, n_seqs] (qwen35 only) */
    struct lt_tensor *kq_mask, *gate_reset;
    bool packed; /* built by lt_model_build_loss_packed */
};

/* Builds the forward pass and loss in ctx (normally no_alloc; the inputs are leaves without
 * data, flagged INPUT). adapters may be NULL. Every sequence starts at position 0 with
 * empty state. */
lt_status lt_model_build_loss(const struct lt_model *m, struct lt_ctx *ctx, int64_t n_tokens,
                              int64_t n_seqs, const struct lt_model_adapters *adapters,
                              struct lt_model_loss_graph *out);
/* As lt_model_build_loss, for rows that hold several examples one after another (padding-
 * free packing): each example starts at position 0 with empty state, and nothing of one
 * example reaches another (attention, the DeltaNet state, the conv). The examples' places
 * are inputs, set by lt_model_loss_graph_set_packed for each micro-batch. */
lt_status lt_model_build_loss_packed(const struct lt_model *m, struct lt_ctx *ctx, int64_t n_tokens,
                                     int64_t n_seqs, const struct lt_model_adapters *adapters,
                                     struct lt_model_loss_graph *out);
/* Fills g->pos (after the graph's storage exists). */
lt_status lt_model_loss_graph_set_pos(struct lt_model_loss_graph *g);
/* A packed graph's inputs from pos (I32 [n_tokens * n_seqs], row after row: each step's
 * position within its example, 0 where one starts): g->pos, the mask and the gate reset.
 * scratch: host floats for them, n_tokens * (n_tokens + 1) * n_seqs, or n_tokens * n_seqs
 * when the graph has no mask (g->kq_mask NULL), kept by a caller that sets a graph's
 * inputs often (NULL: allocated and freed here). */
lt_status lt_model_loss_graph_set_packed(struct lt_model_loss_graph *g, const int32_t *pos,
                                         float *scratch);

/* ---- inference sessions ---- */

struct lt_session;

struct lt_session_params {
    int n_ctx;     /* tokens per sequence */
    int n_seq_max; /* sequences held at once */
    /* Backends in priority order (e.g. {CUDA0, CPU}); the caches live on the first. NULL:
     * one CPU backend the session creates. With a device first, load the model with that
     * device as weights_backend: host weights would be copied to it at every call. */
    struct lt_backend *const *backends;
    int n_backends;
    enum lt_type kv_type; /* LT_TYPE_F32 (0, the default) or LT_TYPE_F16 */
    int n_threads;        /* for a CPU backend the session creates; <= 0: all cores */
    /* Batches of more than 8 tokens write the activations that only F16 / BF16 weights
     * multiply in that type, so a device's products read them without a conversion (they
     * are rounded once, as that product would round them anyway). 0: when the first
     * backend is a device (on the CPU it saves nothing and only rounds); > 0: always;
     * < 0: never. */
    int half_acts;
    /* LoRA adapters (and replacements) every graph of the session reads; NULL: none. The
     * list must outlive the session. */
    const struct lt_model_adapters *adapters;
    /* Decode keeps one step graph, built, placed and allocated for a number of sequences
     * and a window of cached positions (a multiple of 256), and runs it again while those
     * hold, with new inputs only: a device can then replay its kernels as they were. true:
     * build every decode step anew instead (the reference the kept step is tested
     * against). */
    bool decode_rebuild;
    /* > 0: decode steps also pick each row's token greedily where the logits are (ARGMAX
     * over the first pick_vocab logits: a tokenizer's count, when the head is padded past
     * it), for lt_session_decode_pick. 0: no picks. */
    int pick_vocab;
};

lt_status lt_session_new(const struct lt_model *m, const struct lt_session_params *params,
                         struct lt_session **out);
void lt_session_free(struct lt_session *s);

/* Runs a prefill of min(n_ctx - 1, 64) tokens and one decode step on sequence 0, then
 * clears it (as llama.cpp warms up): a device loads its kernels (CUDA loads each on its
 * first launch, milliseconds apiece) and the scheduler its buffers before the first real
 * request, so that request's latency and prompt speed are the steady ones. Sequence 0 must
 * be empty. */
lt_status lt_session_warmup(struct lt_session *s);

/* The session's pick_vocab (0: its decode steps pick no tokens). */
int lt_session_pick_vocab(const struct lt_session *s);
/* Tokens held for sequence seq (its next position). */
int lt_session_seq_pos(const struct lt_session *s, int seq);
/* Forgets sequence seq: position 0, empty caches and states. */
lt_status lt_session_seq_clear(struct lt_session *s, int seq);

/* Appends tokens[0..n) to sequence seq. logits (may be NULL) receives [n, n_vocab] (every
 * position) when all_logits, else [n_vocab] of the last token. */
lt_status lt_session_prefill(struct lt_session *s, int seq, const int32_t *tokens, int n,
                             bool all_logits, float *logits);
/* As lt_session_prefill, but hidden (may be NULL) receives [n, n_embd]: every position's
 * final hidden state after the output norm (what the head reads), for embeddings. */
lt_status lt_session_prefill_hidden(struct lt_session *s, int seq, const int32_t *tokens, int n,
                                    float *hidden);
/* Appends tokens[i][0..lens[i]) to sequence seqs[i] for i < n (distinct sequences, each at
 * its own position, prompts of any lengths), in one step: a server's prompts arriving
 * together cost one graph, not one each. logits (may be NULL) receives [n, n_vocab]: each
 * sequence's last token. The same results as a prefill of each sequence alone. */
lt_status lt_session_prefill_batch(struct lt_session *s, int n, const int *seqs,
                                   const int32_t *const *tokens, const int *lens, float *logits);
/* Appends tokens[i] to sequence seqs[i] for i < n (distinct sequences, each at its own
 * position); logits receives [n, n_vocab]. */
lt_status lt_session_decode(struct lt_session *s, int n, const int *seqs, const int32_t *tokens,
                            float *logits);
/* As lt_session_decode, in a session with pick_vocab, with each row's greedy pick made where
 * the logits are: ids[i] receives the lowest id of the largest of row i's first pick_vocab
 * logits (-1 when one of them is NaN), and logits (may be NULL) only the rows i with want[i],
 * packed in order ([count, n_vocab]; want NULL: every row). A device then copies out the
 * logits of the rows a sampler must read, not the whole batch's. */
lt_status lt_session_decode_pick(struct lt_session *s, int n, const int *seqs,
                                 const int32_t *tokens, const bool *want, float *logits,
                                 int32_t *ids);

#ifdef __cplusplus
}
#endif
#endif
