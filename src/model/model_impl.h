/* model_impl.h (internal): the model's weights, and the graph builder shared by the loss
 * graph and the inference sessions.
 *
 * Shapes are GGUF's (ne0 first). Activations flow as [n_embd, n_tokens, n_seqs]; the
 * builder never needs to know whether it is building training, prefill or decode, except
 * through where attention reads keys and values and where DeltaNet reads and writes its
 * state (struct lt_mb_state). */
#ifndef LATHE_MODEL_IMPL_H
#define LATHE_MODEL_IMPL_H

#include "lathe/gguf.h"
#include "lathe/model.h"

struct lt_model_layer {
    struct lt_tensor *attn_norm; /* [n_embd] */
    struct lt_tensor *ffn_norm;  /* [n_embd]; qwen35: post_attention_norm */
    struct lt_tensor *ffn_gate;  /* [n_embd, n_ff] */
    struct lt_tensor *ffn_up;    /* [n_embd, n_ff] */
    struct lt_tensor *ffn_down;  /* [n_ff, n_embd] */

    /* attention layers */
    struct lt_tensor *wq;           /* [n_embd, head_dim * n_head] (qwen35: * 2, q and gate
                                     * interleaved per head) */
    struct lt_tensor *wk;           /* [n_embd, head_dim * n_head_kv] */
    struct lt_tensor *wv;           /* [n_embd, head_dim * n_head_kv] */
    struct lt_tensor *wo;           /* [head_dim * n_head, n_embd] */
    struct lt_tensor *bq, *bk, *bv; /* qwen2: biases */
    struct lt_tensor *q_norm;       /* qwen35: [head_dim] */
    struct lt_tensor *k_norm;       /* qwen35: [head_dim] */

    /* qwen35 Gated DeltaNet layers */
    bool recurrent;
    struct lt_tensor *ssm_qkv;    /* attn_qkv  [n_embd, 2 * key_dim + value_dim] */
    struct lt_tensor *ssm_z;      /* attn_gate [n_embd, value_dim] */
    struct lt_tensor *ssm_beta;   /* [n_embd, n_v_heads] */
    struct lt_tensor *ssm_alpha;  /* [n_embd, n_v_heads] */
    struct lt_tensor *ssm_conv1d; /* [d_conv, 2 * key_dim + value_dim] */
    struct lt_tensor *ssm_dt;     /* [n_v_heads] (the bias added before softplus) */
    struct lt_tensor *ssm_a;      /* [n_v_heads] = -exp(A_log) */
    struct lt_tensor *ssm_norm;   /* [head_v_dim] (gated norm: not 1 + w) */
    struct lt_tensor *ssm_out;    /* [value_dim, n_embd] */

    /* Projections of one input laid side by side when the weights were uploaded (NULL
     * otherwise): one matrix whose rows are its members' in order, which a product reads
     * at once (inference, model_products.c's lt_mb_mm_group). Not in lt_model.weights. */
    struct lt_tensor *ffn_gate_up; /* ffn_gate, ffn_up */
    struct lt_tensor *wqkv;        /* wq, wk, wv */
    struct lt_tensor *ssm_in;      /* ssm_qkv, ssm_z, ssm_beta, ssm_alpha */
};

struct lt_model {
    struct lt_model_hparams hp;
    struct lt_gguf *gguf;
    struct lt_ctx *ctx;            /* weight headers */
    struct lt_buffer *buffer;      /* weights uploaded to a backend, or NULL */
    struct lt_tensor *tok_embd;    /* [n_embd, n_vocab] */
    struct lt_tensor *out_norm;    /* [n_embd] */
    struct lt_tensor *output;      /* [n_embd, n_vocab]; == tok_embd when tied */
    struct lt_model_layer *layers; /* [n_layer] */
    struct lt_tensor **weights;    /* every tensor the graphs read, once */
    int n_weights;
};

/* ---- the graph builder ---- */

/* Where a layer's recurrent/attention state comes from and goes to. */
struct lt_mb_layer_state {
    /* attention: keys and values to attend over, [head_dim, n_head_kv, n_kv, n_seqs]
     * (any strides); NULL: the layer's own new K and V (training: no cache) */
    struct lt_tensor *k, *v;
    /* attention, a kept decode step: the caches themselves [head_dim, n_head_kv, n_ctx,
     * n_seq_max] and each sequence's slot (I32 [n_seqs]), for ATTN_DECODE; else NULL.
     * kv_to_attn: the hook did not store this token's K and V: ATTN_DECODE stores them (the
     * graph must then build one) */
    struct lt_tensor *k_cache, *v_cache, *seq_ids;
    bool kv_to_attn;
    /* DeltaNet, a kept decode step: the state caches themselves ([d_conv - 1, channels,
     * n_seq_max], [S_v, S_k, H_v, n_seq_max]) at slots seq_ids, for GDN_DECODE to read (and
     * the ssm state to update) in place; else NULL */
    struct lt_tensor *conv_cache, *ssm_cache;
    /* DeltaNet: the state before this batch; NULL: zeros */
    struct lt_tensor *conv; /* [d_conv - 1, channels, n_seqs] */
    struct lt_tensor *ssm;  /* [S_v, S_k, H_v, n_seqs] */
};

struct lt_mb;

/* Hooks a session gives the builder. Called once per layer while building. */
struct lt_mb_hooks {
    void *user;
    /* attention layer il: the new K and V [head_dim, n_head_kv, n_tokens, n_seqs] are
     * known; store them and fill st->k, st->v (and st->kq_mask via lt_mb). */
    lt_status (*attn_kv)(struct lt_mb *b, int il, struct lt_tensor *k_new, struct lt_tensor *v_new,
                         struct lt_mb_layer_state *st);
    /* DeltaNet layer il: fill st->conv and st->ssm before the layer is built */
    lt_status (*recr_load)(struct lt_mb *b, int il, struct lt_mb_layer_state *st);
    /* DeltaNet layer il: store the new states ([d_conv-1, channels, n_seqs] view of the
     * conv input, or all of it with tok_mask, and the [S_v, S_k, H_v, n_seqs] state view;
     * both NULL: GDN_DECODE updated the caches itself) */
    lt_status (*recr_store)(struct lt_mb *b, int il, struct lt_tensor *conv_new,
                            struct lt_tensor *ssm_new);
};

/* A gate that ends an example's state: exp(-30) is 9e-14, so what the example before left
 * weighs far below float's resolution (6e-8) of the state, and every exponent the kernels
 * take stays <= 0 (they exponentiate G_r - G_s, s <= r, of the gates' running sums within
 * a chunk). No lower, because those sums carry it: a difference of two of them within one
 * example keeps about 30 * 6e-8 = 2e-6 of absolute error (-80 gave 1.5e-5 in
 * test_train_packed's gradients, -30 1e-6). */
#define LT_MB_GATE_RESET (-30.0f)

#define LT_MB_SHARE_MAX                                                                            \
    8 /* adapters a shared A x product joins (model_products.c, lt_mb_lora_share_ax) */

struct lt_mb {
    const struct lt_model *m;
    struct lt_ctx *ctx;
    struct lt_graph *g; /* nodes that must run in build order go here at once */
    const struct lt_model_adapters *ad;
    int64_t n_tokens, n_seqs;
    struct lt_tensor *pos;     /* I32 [n_tokens * n_seqs]: each column's position */
    struct lt_tensor *kq_mask; /* optional additive mask [n_kv, n_tokens, 1, n_seqs] */
    bool causal;               /* causal mask in soft_max (prefill, training) */
    /* optional F32 [1, n_tokens, n_seqs]: 1 at a sequence's tokens, 0 at the padding after
     * its last one (a batched prefill of prompts of different lengths). A padding token
     * leaves the DeltaNet state as it was (its beta and gate are 0, so its update is 0 and
     * its decay 1), and recr_store gets the whole conv input [d_conv - 1 + n_tokens,
     * channels, n_seqs], for the hook to keep each sequence's last d_conv - 1 inputs. */
    struct lt_tensor *tok_mask;
    /* Packed examples (a training row holding several, one after another): pos restarts at
     * 0 at each example's first step, kq_mask keeps attention within an example (with
     * causal), gate_reset (F32 [1, n_tokens, n_seqs]) adds LT_MB_GATE_RESET to the DeltaNet
     * gate at each example's first step, so that step's decay exp(g) is 0 and no state flows
     * in from the example before, and the conv reads no step before the example's first
     * (CONV_SILU with pos). NULL: every row one example. */
    struct lt_tensor *gate_reset;
    /* packed training with FLASH_ATTN: attention reads the examples' boundaries from pos
     * (FLASH_ATTN's I32 positions), and kq_mask is NULL */
    bool attn_pos;
    /* inference only (no gradients): an activation that only F16 / BF16 weights multiply is
     * written in their type by the op producing it, so a device's product reads it as it
     * is instead of converting it first (set for batches of more than 8 tokens, which a
     * device multiplies with tensor cores; fewer stay F32 for its exact few-column kernel) */
    bool half_acts;
    /* attention as one FLASH_ATTN node: the loss graph's adapters->flash_attn, or a
     * session's prefill (lt_model_flash_attn_on); its products' operands in BF16 where the
     * step's products are BF16 or half_acts rounds the activations anyway */
    bool flash;
    /* inference only: fused ops that have no backward rule stand in for the chains they
     * replace (RMS_NORM with its weight), fewer kernels a decode step (set by the session) */
    bool fused;
    /* ad->bf16_products: the last activation rounded to BF16, and what it was rounded from
     * (the q/k/v and gate/up products of one input share one rounding) */
    struct lt_tensor *bf16_from, *bf16_act;
    /* the last LoRA adapter's scaled A x (lora_ax), for the products by its other rows, and
     * the input joined with it, [x ; A x] (lora_joined) */
    const struct lt_model_lora *ax_lora;
    struct lt_tensor *ax_x, *ax, *axz;
    /* the last LoRA adapter's B rounded to BF16 whole, for the products by its row ranges
     * (lora_b_half: one rounding a step for q, k and v, not one a range) */
    const struct lt_model_lora *bh_lora;
    struct lt_tensor *bh;
    /* the adapters of a layer's products that read one input share_x (lt_mb_lora_share_ax): each
     * one's scaled A x, a part of one product by their A's joined along the rank */
    struct lt_tensor *share_x;
    int n_share;
    const struct lt_model_lora *share_lora[LT_MB_SHARE_MAX];
    struct lt_tensor *share_ax[LT_MB_SHARE_MAX];
    /* the type a training step's plain BF16 products store (lt_mb_mm_rows: BF16 for the FFN's gate
     * and up, and Qwen3.5's q, k and v, which only SWIGLU / CONV_SILU and their backwards
     * read), F32 otherwise */
    enum lt_type product_type;
    /* the zero initial DeltaNet state of a graph with no state to read, shared by its layers
     * (all of one shape): one FILL where each layer kept its own until its backward */
    struct lt_tensor *state_zero;
    const struct lt_mb_hooks *hooks;
    /* optional, n_layer + 1 slots: the residual stream entering each layer, then the last
     * layer's output (the layer boundaries a training graph recomputes between) */
    struct lt_tensor **bounds;
};

/* The forward pass: token ids I32 [n_tokens, n_seqs] -> normalised hidden states
 * [n_embd, n_tokens * n_seqs] before the head. b->pos (I32 [n_tokens * n_seqs]) holds each
 * column's position. */
lt_status lt_mb_forward(struct lt_mb *b, struct lt_tensor *tokens, struct lt_tensor **hidden);
/* The head: logits [n_vocab, n] of hidden [n_embd, n]. */
struct lt_tensor *lt_mb_logits(struct lt_mb *b, struct lt_tensor *hidden);
struct lt_tensor *lt_mb_loss(struct lt_mb *b, struct lt_tensor *hidden, struct lt_tensor *labels,
                             struct lt_tensor **logits);

/* Fails with a message naming what went wrong when t is NULL (a constructor failed). */
lt_status lt_mb_check(struct lt_tensor *t, const char *what, int il);

/* model_products.c: the forward's products. lt_mb_w: the tensor the graph reads for weight
 * w; lt_mb_mm / lt_mb_mm_rows: w x (its rows [r0, r0 + n)) with the adapters of w and the
 * roundings b asks for; lt_mb_mm_group: the products of x by ws[0..n) (one by `joint` where
 * it may); lt_mb_product: w x with x's norm taken in where it may (decode); lt_mb_lora_share_ax:
 * before the products of ws[0..n) that read x, their adapters' A x as one product;
 * lt_mb_half_out: BF16 for a training step's product that one elementwise op reads, unless
 * the switch `name` is 0; lt_mb_rows_of: rows [r0, r0 + n) of a matrix; lt_mb_bf16_product:
 * whether the product by wr rounds it; lt_mb_norm_mm_off / lt_mb_norm_product_type: decode's
 * norm into the product (LATHE_FUSE_NORM_MM, the weight types); lt_mb_joint_takes: whether a
 * group's products may be the one by `joint` */
struct lt_tensor *lt_mb_w(struct lt_mb *b, struct lt_tensor *w);
struct lt_tensor *lt_mb_mm(struct lt_mb *b, struct lt_tensor *w, struct lt_tensor *x);
struct lt_tensor *lt_mb_mm_rows(struct lt_mb *b, struct lt_tensor *w, struct lt_tensor *x,
                                int64_t r0, int64_t n);
lt_status lt_mb_mm_group(struct lt_mb *b, struct lt_tensor *joint, struct lt_tensor *const *ws,
                         int n, struct lt_tensor *x, struct lt_tensor **out);
struct lt_tensor *lt_mb_product(struct lt_mb *b, struct lt_tensor *w, struct lt_tensor *x,
                                bool glu);
void lt_mb_lora_share_ax(struct lt_mb *b, struct lt_tensor *x, struct lt_tensor *const *ws, int n);
enum lt_type lt_mb_half_out(const struct lt_mb *b, const char *name);
struct lt_tensor *lt_mb_rows_of(struct lt_ctx *ctx, struct lt_tensor *w, int64_t r0, int64_t n);
bool lt_mb_bf16_product(const struct lt_mb *b, const struct lt_tensor *wr);
bool lt_mb_norm_mm_off(void);
bool lt_mb_norm_product_type(enum lt_type t);
bool lt_mb_joint_takes(struct lt_mb *b, struct lt_tensor *joint, struct lt_tensor *const *ws, int n,
                       struct lt_tensor *x);

#endif
