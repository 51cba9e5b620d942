/* ops.h: graph constructors, one per op. Each records the op on a new tensor; nothing is
 * computed until the graph is run by a backend.
 *
 * Shapes use ne[0] as the innermost dimension. Matrix products follow GGUF's convention:
 * a weight stored as [in, out] (ne0 = in) times activations [in, tokens] gives
 * [out, tokens]. Broadcasting: the second source of a binary op is repeated over the first
 * when each of its dimensions divides the first's.
 *
 * A constructor given shapes that cannot work returns NULL and sets lt_last_error naming
 * the tensors; model code treats that as a bug in the model definition. */
#ifndef LATHE_OPS_H
#define LATHE_OPS_H

#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A new F32 tensor of like's shape (contiguous) with every element = value. */
struct lt_tensor *lt_fill(struct lt_ctx *ctx, struct lt_tensor *like, float value);

/* copies */
struct lt_tensor *lt_cont(struct lt_ctx *ctx, struct lt_tensor *a);
/* a contiguous copy of a stored as `type` (F32, F16 or BF16 from any readable type): the
 * rounding a product with half operands needs, made once where several read it */
struct lt_tensor *lt_cont_as(struct lt_ctx *ctx, struct lt_tensor *a, enum lt_type type);
/* Writes a (converted to dst's type) into dst, which may be a view; the result is a view
 * of dst that depends on the copy, so later readers of it see the new values. */
struct lt_tensor *lt_cpy(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *dst);
/* a and b equal in every dim but `dim`; the result is contiguous F32. */
struct lt_tensor *lt_concat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b, int dim);
/* lt_concat stored as `type` (F32, F16 or BF16): a LoRA target's weight and adapter, and its
 * input and the adapter's A x, joined along the contraction (dim 0) into one BF16 product
 * (src/model/model_products.c; MUL_MAT's rule then takes the parts' gradients apart). */
struct lt_tensor *lt_concat_as(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                               int dim, enum lt_type type);
/* a repeated (tiled) to the shape of `like`; each of a's dims divides like's. */
struct lt_tensor *lt_repeat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *like);
/* Rows of a [n, rows, ne2] picked by ids (I32 [k, ne2]): F32 [n, k, ne2]. Any type of a
 * that can be read is dequantised. */
struct lt_tensor *lt_get_rows(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *ids);
/* Writes slice i of src [a, b, k] (any readable type and strides; read i0 fastest) as row
 * ids[i] of dst [a * b, rows] (F32, F16 or BF16, rows of adjacent elements, any row
 * stride), converted; ids I32 [k]. The result is a view of dst, as lt_cpy's is, so
 * readers of it run after the writes. An id outside dst's rows writes nothing. The
 * scatter a replayed decode step stores new keys and states with (the row read from the
 * device). No backward rule: inference only. */
struct lt_tensor *lt_set_rows(struct lt_ctx *ctx, struct lt_tensor *src, struct lt_tensor *dst,
                              struct lt_tensor *ids);

/* a [K, M, A2, A3] (any readable type), b [K, N, B2, B3] (F32) -> F32 [M, N, B2, B3]:
 *   dst[m, n, i2, i3] = sum_k a[k, m, i2 / (B2 / A2), i3 / (B3 / A3)] * b[k, n, i2, i3]
 * a is broadcast over b's dims 2 and 3 in groups (B2 % A2 == 0): consecutive b heads
 * share one a head, as grouped-query attention shares a KV head. */
struct lt_tensor *lt_mul_mat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b);
/* lt_mul_mat stored as `type`: F32, or the type of a and b when both are that one half type
 * (F32 sums, each output rounded once): a device's training step's FFN gate and up
 * projections, which only SWIGLU and its backward read (src/model/model_graph.c) */
struct lt_tensor *lt_mul_mat_as(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                enum lt_type type);
/* c + mul_mat(a, b), written over c in place (the result is a view of c): c must be F32,
 * contiguous and of the product's shape, and read by nothing after this node. A device adds
 * the product in its epilogue (cuBLAS beta = 1), without a pass of its own: a LoRA target's
 * base product added into its adapter's output (src/model/model_graph.c). */
struct lt_tensor *lt_mul_mat_acc(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                 struct lt_tensor *c);
/* c + alpha mul_mat(a, b), the same written over c (op_params[0]: alpha; 1 for
 * lt_mul_mat_acc): a device scales the product in its epilogue (cuBLAS alpha). A training
 * step's accumulation of a gradient that is a scaled product (a LoRA adapter's A, scaled as
 * it is rounded: src/opt/train_graph.c). */
struct lt_tensor *lt_mul_mat_acc_scaled(struct lt_ctx *ctx, struct lt_tensor *a,
                                        struct lt_tensor *b, struct lt_tensor *c, float alpha);
/* the alpha of a MUL_MAT_ACC node (1 for any other node) */
float lt_mul_mat_acc_alpha(const struct lt_tensor *node);
/* A stacked gate and up projection and its SwiGLU in one MUL_MAT_GLU node (inference only,
 * no backward rule): a [K, 2 H] (any type mul_mat reads; rows 0 .. H - 1 the gate's, H ..
 * 2 H - 1 the up's), b [K, N] F32 -> F32 [H, N]:
 *   p = mul_mat(a, b); dst[h, n] = silu(p[h, n]) * p[H + h, n]
 * with SWIGLU's value of each element, so on the CPU it equals lt_swiglu of the product's
 * two halves bit for bit. A decode step's FFN (src/model/model_graph.c): one launch where a
 * device's few-column kernel computes both rows of an output and its SwiGLU at once. */
struct lt_tensor *lt_mul_mat_glu(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b);
/* A product added to the residual stream and the weighted RMS norm of the sum, in one
 * MUL_MAT_ADD_RMS_NORM node (inference only, no backward rule): a [K, M] (2-d, any type
 * lt_mul_mat takes), b [K, N] F32, x [M, N] F32, w [M] F32 -> F32 [M, N, 2]:
 *   r = add_rms_norm(x, mul_mat(a, b), w, eps)
 * laid out as ADD_RMS_NORM's result (lt_add_rms_norm_sum / _out view its halves), so on the
 * CPU it equals that chain bit for bit. A decode step's output and down projections
 * (src/model/model_graph.c): a device's few-column kernel adds the residual as it stores each
 * output, and the last of its blocks to finish norms the sums, where the norm took a launch
 * of its own. */
struct lt_tensor *lt_mul_mat_add_rms_norm(struct lt_ctx *ctx, struct lt_tensor *a,
                                          struct lt_tensor *b, struct lt_tensor *x,
                                          struct lt_tensor *w, float eps);
/* The product of a weight with the weighted RMS norm of F32 columns, in one
 * RMS_NORM_MUL_MAT node (inference only, no backward rule): a [K, M] (2-d, any type
 * lt_mul_mat takes), x [K, N] F32 (2-d), w [K] F32 -> F32 [M, N], or with glu (M even)
 * [M / 2, N]:
 *   h = rms_norm_mul(x, w, eps); p = mul_mat(a, h); glu ? swiglu of p's halves (as
 *   lt_mul_mat_glu) : p
 * so on the CPU it equals that chain bit for bit. A decode step's input projections and FFN
 * (src/model/model_graph.c): a device's few-column kernel norms the column in each block
 * before its products, so the product ahead (MUL_MAT_ACC, the residual added as it stores)
 * needs no last block to norm the sums. */
struct lt_tensor *lt_rms_norm_mul_mat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *x,
                                      struct lt_tensor *w, float eps, bool glu);
/* The parts a fused product node's kernels run (the CPU's, and a device's when it has no
 * one-kernel form), as tensors built on the stack. lt_fused_product: a MUL_MAT_GLU,
 * MUL_MAT_ADD_RMS_NORM or RMS_NORM_MUL_MAT node as the MUL_MAT writing its whole product [M, N] (M
 * = a's rows, N = b's columns) contiguous at data. lt_fused_add_norm: a MUL_MAT_ADD_RMS_NORM node
 * as the ADD_RMS_NORM of its residual and that product (at prod; *p, which must outlive the result,
 * holds it as the source), writing the node's result. */
struct lt_tensor lt_fused_product(const struct lt_tensor *node, void *data);
/* lt_fused_norm: an RMS_NORM_MUL_MAT node as the weighted RMS_NORM of its columns, writing
 * [K, N] F32 contiguous at data. lt_fused_norm_product: its product, lt_fused_product
 * reading *h (the norm, which must outlive the result) for its columns. */
struct lt_tensor lt_fused_norm(const struct lt_tensor *node, void *data);
struct lt_tensor lt_fused_norm_product(const struct lt_tensor *node, struct lt_tensor *h,
                                       void *data);
struct lt_tensor lt_fused_add_norm(const struct lt_tensor *node, void *prod, struct lt_tensor *p);

/* element-wise binary; b is broadcast over a (lt_can_repeat(b, a)) */
struct lt_tensor *lt_add(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b);
struct lt_tensor *lt_sub(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b);
struct lt_tensor *lt_mul(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b);
struct lt_tensor *lt_div(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b);
/* lt_mul with the result stored as type (F32, F16 or BF16): an activation that only
 * half-precision weights multiply, written in their type by the op that makes it (the
 * values are computed in F32 and rounded once). Gradients pass through as F32. */
struct lt_tensor *lt_mul_as(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                            enum lt_type type);

/* element-wise unary (F32 in, F32 out, same shape, contiguous result) */
struct lt_tensor *lt_scale(struct lt_ctx *ctx, struct lt_tensor *a, float s);
/* lt_scale with the result stored as type (F32, F16 or BF16; computed in F32, rounded once):
 * a LoRA adapter's A times its scale, in the half type its product reads (model_graph.c) */
struct lt_tensor *lt_scale_as(struct lt_ctx *ctx, struct lt_tensor *a, float s, enum lt_type type);
struct lt_tensor *lt_silu(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_sigmoid(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_softplus(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_exp(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_log(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_sqr(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_sqrt(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_sin(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_cos(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_abs(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_neg(struct lt_ctx *ctx, struct lt_tensor *a);
struct lt_tensor *lt_relu(struct lt_ctx *ctx, struct lt_tensor *a);

/* reductions */
struct lt_tensor *lt_sum_rows(struct lt_ctx *ctx, struct lt_tensor *a); /* [1, ne1, ne2, ne3] */
struct lt_tensor *lt_mean(struct lt_ctx *ctx, struct lt_tensor *a);     /* [1, ne1, ne2, ne3] */
struct lt_tensor *lt_sum(struct lt_ctx *ctx, struct lt_tensor *a);      /* [1] */
/* I32 [ne1, ne2, ne3]: for each row of a (F32, rows contiguous), the index of its largest
 * element among the first n (1 <= n <= ne0), the lowest among equals (+0 and -0 are equal;
 * a row all -inf gives 0); -1 when one of those n is NaN. A sampler's greedy pick, made
 * where the logits are. No backward rule: an index has no gradient. */
struct lt_tensor *lt_argmax(struct lt_ctx *ctx, struct lt_tensor *a, int64_t n);

/* x / sqrt(mean(x^2) + eps) over ne[0] */
struct lt_tensor *lt_rms_norm(struct lt_ctx *ctx, struct lt_tensor *a, float eps);
/* rms_norm(a) * w stored as type (F32, F16 or BF16): one RMS_NORM node reading w (F32
 * [ne0], contiguous) as its second source, the same values as lt_mul_as(lt_rms_norm(a), w,
 * type). Its backward rule is one RMS_NORM_MUL_BACK node (lt_rms_norm_mul_back). */
struct lt_tensor *lt_rms_norm_mul(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *w,
                                  float eps, enum lt_type type);
/* rms_norm(a) * w * silu(z) stored as type: the same node with the gate z (F32 of a's shape,
 * any strides) as its third source (Qwen3.5's gated norm of the DeltaNet output). silu(z) is
 * SWIGLU's z / (1 + e^-z), multiplied in last. */
struct lt_tensor *lt_rms_norm_mul_gated(struct lt_ctx *ctx, struct lt_tensor *a,
                                        struct lt_tensor *w, struct lt_tensor *z, float eps,
                                        enum lt_type type);
/* The gradients of y = rms_norm(x) * w (* silu(z), z may be NULL) given grad = dL/dy (F32 of
 * x's shape; grad, x and z of any strides; w F32 [ne0] contiguous): one RMS_NORM_MUL_BACK
 * node, F32 [ne0, rows * (z ? 2 : 1) + parts] (rows of x), holding dx's rows, then dz's, then
 * `parts` partial sums of dw: part p adds rows p * rows / parts up to the next part's (parts =
 * lt_rms_norm_mul_back_parts(x): LT_NORM_DW_ELEMENTS / ne0, at least 1, at most rows: 32,768
 * parts of 4 rows for Qwen3.5-0.8B's gated norm in a 16 x 512 step, 4,096 of 2 for its
 * hidden norms; a device gives each part a warp, and 1,024 warps of 8 rows left an H100's
 * SMs a block each). The rule views dx and dz and sums the parts with REPEAT_BACK. */
#define LT_NORM_DW_ELEMENTS (1 << 22)
struct lt_tensor *lt_rms_norm_mul_back(struct lt_ctx *ctx, struct lt_tensor *grad,
                                       struct lt_tensor *x, struct lt_tensor *w,
                                       struct lt_tensor *z, float eps);
/* The same with c (F32, contiguous, x's shape) added into dx: its fifth source, so dx's rows
 * hold c + dx (z may be NULL). The rule passes the gradient x already has (a residual
 * stream's, handed on whole by the next residual sum) this way, where an ADD took a pass of
 * its own over [ne0, rows]. */
struct lt_tensor *lt_rms_norm_mul_back_add(struct lt_ctx *ctx, struct lt_tensor *grad,
                                           struct lt_tensor *x, struct lt_tensor *w,
                                           struct lt_tensor *z, float eps, struct lt_tensor *c);
int64_t lt_rms_norm_mul_back_parts(const struct lt_tensor *x);
/* Whether an RMS_NORM_MUL_BACK node's sources and result are the shapes and types above (the
 * CPU's and CUDA's predicates both ask it) */
bool lt_rms_norm_mul_back_fits(const struct lt_tensor *node);
/* The residual sum r = a + b and rms_norm(r) * w in one ADD_RMS_NORM node (inference only,
 * no backward rule): a and b F32 [ne0, ne1] of any strides, w F32 [ne0] contiguous. The
 * result is F32 [ne0, ne1, 2]: r, then the normed rows; lt_add_rms_norm_sum / _out view
 * them (and the halves of a MUL_MAT_ADD_RMS_NORM's result alike). Each value is what lt_add, then
 * lt_rms_norm_mul(.., LT_TYPE_F32), store. */
struct lt_tensor *lt_add_rms_norm(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                  struct lt_tensor *w, float eps);
struct lt_tensor *lt_add_rms_norm_sum(struct lt_ctx *ctx, struct lt_tensor *r);
struct lt_tensor *lt_add_rms_norm_out(struct lt_ctx *ctx, struct lt_tensor *r);
/* x * rsqrt(sum(x^2) + eps) over ne[0]: the l2norm of Qwen3.5's Gated DeltaNet (HF/FLA),
 * with eps inside the root (not F.normalize's clamp) */
struct lt_tensor *lt_l2_norm(struct lt_ctx *ctx, struct lt_tensor *a, float eps);
/* The same L2_NORM, but its backward rule is one L2_NORM_BACK node over contiguous copies
 * instead of lt_l2_norm's primitives (llama.cpp's graph: SQR, SUM_ROWS, SQRT, DIV, MUL, SUB,
 * the k_conv scenario's shape), about ten passes over x fewer. A device's BF16 training step
 * takes it (model_graph.c); the F32 path keeps the primitives. */
struct lt_tensor *lt_l2_norm_fused_back(struct lt_ctx *ctx, struct lt_tensor *a, float eps);
/* dL/dx of rms_norm / l2_norm given grad = dL/dy (both F32 of x's shape, any strides) */
struct lt_tensor *lt_rms_norm_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x,
                                   float eps);
struct lt_tensor *lt_l2_norm_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x,
                                  float eps);

enum lt_rope_mode {
    LT_ROPE_NORMAL = 0, /* rotate pairs (2i, 2i+1) */
    LT_ROPE_NEOX = 2,   /* rotate pairs (i, i + n_dims/2): HF's rotate_half */
};
/* a [head_dim, n_head, n_tokens, ne3], pos I32 [n_tokens]. The first n_dims of head_dim
 * rotate (partial rotary), the rest pass through. theta_i = pos * base^(-2i/n_dims). */
struct lt_tensor *lt_rope(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *pos,
                          int n_dims, enum lt_rope_mode mode, float freq_base);
/* The adjoint of lt_rope (the inverse rotation) applied to grad = dL/dy, same arguments. */
struct lt_tensor *lt_rope_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *pos,
                               int n_dims, enum lt_rope_mode mode, float freq_base);
/* lt_rope(lt_rms_norm_mul(x, w, eps, F32), pos, ...) in one RMS_NORM_ROPE node (inference
 * only, no backward rule): x F32 [head_dim, n_head, n_tokens, ne3] of any strides, w F32
 * [head_dim]; the result F32, contiguous. Each row's values are the two nodes' (on the CPU
 * their kernels, one after the other, bit for bit). Qwen3.5's query and key norms before
 * their rotation in a decode step (src/model/model_graph.c): one launch for each. */
struct lt_tensor *lt_rms_norm_rope(struct lt_ctx *ctx, struct lt_tensor *x, struct lt_tensor *w,
                                   float eps, struct lt_tensor *pos, int n_dims,
                                   enum lt_rope_mode mode, float freq_base);

/* softmax over ne[0] of (a * scale + mask). mask (optional, F32, broadcast over a's dims
 * 2 and 3) is additive. causal: key i0 of query row i1 is masked when
 * i0 > i1 + (ne0 - ne1), i.e. queries are the last ne1 positions of ne0 keys. */
struct lt_tensor *lt_soft_max(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *mask,
                              float scale, bool causal);
/* One decode token's attention for each of S sequences, read from the KV cache: for
 * sequence s (cache slot seq_ids[s]) and query head h (KV head h / (H / Hkv)), softmax over
 * positions 0..pos[s] of scale * q.k_j, then the sum of p_j v_j, times sigmoid(gate) when a
 * gate is given. q [D, H, S] F32 and gate [D, H, S] F32 (NULL: none) of any strides; caches
 * [D, Hkv, n_ctx, n_slots] F32 or F16 with adjacent elements; seq_ids and pos I32 [S]. The
 * result is F32 [D * H, S]: what mul_mat, soft_max (scale, masked past pos), mul_mat, cont
 * and the gate's sigmoid and mul compute, to float rounding. Inference only.
 * k_new, v_new (F32 [D, Hkv, 1, S], any strides; both NULL: the caches already hold this
 * token's keys and values) are this token's keys and values: they are stored IN PLACE in
 * the caches at position pos[s] of slot seq_ids[s] (rounded to the cache's type, as
 * SET_ROWS stores them) and attended to as stored. The caches may then not be broadcast or
 * overlapping views; a sequence whose id or position is outside the caches stores
 * nothing. */
struct lt_tensor *lt_attn_decode(struct lt_ctx *ctx, struct lt_tensor *q, struct lt_tensor *k_cache,
                                 struct lt_tensor *v_cache, struct lt_tensor *seq_ids,
                                 struct lt_tensor *pos, struct lt_tensor *gate, float scale,
                                 struct lt_tensor *k_new, struct lt_tensor *v_new);
/* Scaled dot-product attention in one node: o[:, h, t, s] = sum_j p_j v[:, hk, j, s] with
 * p = softmax_j(scale q[:, h, t, s] . k[:, hk, j, s] + mask[j, t, h % m2, s % m3]) and
 * hk = h / (H / Hkv): what mul_mat, soft_max (scale, mask, causal), mul_mat and the merge of
 * the heads compute, SOFT_MAX's rules for dropped keys included (causal drops key j of
 * query t when j > t + (n_kv - T); a query with every key dropped gets zeros), with no
 * T x T tensor. q [D, H, T, S]; k and v [D, Hkv, n_kv, S] (F32, F16 or BF16, any strides);
 * mask F32 [n_kv, T, m2, m3] (optional), or I32 positions [T * S] in its place (a packed
 * step's: keys before query t's example, j < t + (n_kv - T) - pos[s T + t], are dropped).
 * The result is F32 [D, H, T, S]. */
struct lt_tensor *lt_flash_attn(struct lt_ctx *ctx, struct lt_tensor *q, struct lt_tensor *k,
                                struct lt_tensor *v, struct lt_tensor *mask, float scale,
                                bool causal);
/* The products' precision of a FLASH_ATTN node on a device (the CPU computes in F32 either
 * way): F32 (three TF32 tensor-core products each, about F32's precision), TF32 (one), or
 * BF16 (q, k, v, the probabilities and the gradients' operands rounded to BF16, F32 sums:
 * the BF16 tensor cores, for training and prefill whose other products round to BF16). The
 * backward rule passes it on. */
enum lt_flash_attn_prec {
    LT_FLASH_ATTN_PREC_F32 = 0,
    LT_FLASH_ATTN_PREC_TF32,
    LT_FLASH_ATTN_PREC_BF16,
};
void lt_flash_attn_set_prec(struct lt_tensor *t, enum lt_flash_attn_prec prec);
/* FLASH_ATTN's backward: dq, dk and dv of the node fwd given grad (its gradient, F32 of
 * its shape), in one flat F32 result that lt_flash_attn_back_grad views. */
struct lt_tensor *lt_flash_attn_back(struct lt_ctx *ctx, struct lt_tensor *grad,
                                     struct lt_tensor *fwd);
enum lt_flash_attn_grad { LT_FLASH_ATTN_GRAD_Q, LT_FLASH_ATTN_GRAD_K, LT_FLASH_ATTN_GRAD_V };
struct lt_tensor *lt_flash_attn_back_grad(struct lt_ctx *ctx, struct lt_tensor *r,
                                          enum lt_flash_attn_grad which);
/* dx = y * (dy - sum(dy * y)) over ne[0], given grad = dy and the softmax's output y: the
 * gradient with respect to the softmax's input (a * scale + mask; the scale is the caller's). */
struct lt_tensor *lt_soft_max_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *y);

/* silu(gate) * up, same shapes */
struct lt_tensor *lt_swiglu(struct lt_ctx *ctx, struct lt_tensor *gate, struct lt_tensor *up);
/* lt_swiglu with the result stored as type (F32, F16 or BF16), as lt_mul_as */
struct lt_tensor *lt_swiglu_as(struct lt_ctx *ctx, struct lt_tensor *gate, struct lt_tensor *up,
                               enum lt_type type);
/* The gate's activation of a gated unit act(gate) * up: SWIGLU's and SWIGLU_BACK's
 * op_params[0] (silu: the FFN's SwiGLU; sigmoid: Qwen3.5's gated attention output) */
enum lt_glu { LT_GLU_SILU = 0, LT_GLU_SIGMOID = 1 };
/* act(gate) * up as one SWIGLU node, stored as type; with LT_GLU_SIGMOID the value is
 * lt_mul(up, lt_sigmoid(gate))'s, bit for bit */
struct lt_tensor *lt_glu_as(struct lt_ctx *ctx, struct lt_tensor *gate, struct lt_tensor *up,
                            enum lt_glu act, enum lt_type type);
/* a SWIGLU or SWIGLU_BACK node's activation, and whether it is one of enum lt_glu (a
 * precondition every backend's claim checks) */
enum lt_glu lt_glu_of(const struct lt_tensor *node);
bool lt_glu_fits(const struct lt_tensor *node);

/* Causal depthwise conv1d. sx [d_conv - 1 + T, channels, n_seqs] holds, per channel, the
 * carried state (the previous d_conv - 1 inputs) followed by the T new inputs, time
 * innermost; w [d_conv, channels]. Result [channels, T, n_seqs]:
 *   y[c, t, s] = sum_k w[k, c] * sx[t + k, c, s].
 * The next state is the view of sx's last d_conv - 1 time steps. */
struct lt_tensor *lt_ssm_conv(struct lt_ctx *ctx, struct lt_tensor *sx, struct lt_tensor *w);

/* silu of the same conv over x [channels, T, n_seqs] F32 or BF16 (channels innermost: a
 * projection's output as it is, which a training step's q, k and v products store in BF16)
 * with no carried state (zeros before t = 0); w [d_conv, channels]:
 *   y[c, t, s] = silu(sum_k w[k, c] * x[c, t + k - (d_conv - 1), s]),
 * the values of silu(ssm_conv(concat(zeros, transpose(x)), w)) in one node (a training
 * step's layers, which carry no state). Result [channels, T, n_seqs]. */
struct lt_tensor *lt_conv_silu(struct lt_ctx *ctx, struct lt_tensor *x, struct lt_tensor *w);
/* The same over packed examples: pos (contiguous I32 of T * n_seqs, or NULL) holds each
 * step's position within its own example, and a tap that would reach back past the
 * example's first step reads zero, as before t = 0. */
struct lt_tensor *lt_conv_silu_packed(struct lt_ctx *ctx, struct lt_tensor *x, struct lt_tensor *w,
                                      struct lt_tensor *pos);

/* The gated delta rule of Gated DeltaNet (Qwen3.5's linear attention), per head h:
 *   S_t = exp(g_t) * S_{t-1};  S_t += k_t (beta_t * (v_t - S_t^T k_t))^T;  o_t = S_t^T q_t * scale
 * q, k [S_k, H_k, T, B]; v [S_v, H_v, T, B]; g, beta [H_v, T, B]; state [S_v, S_k, H_v, B]
 * (S[j, i] pairs value dim j with key dim i). H_v is a multiple of H_k: value head h reads
 * key head h % H_k (GGUF's tiled order). The result packs the output and the new state:
 * [S_v, H_v, T + S_k, B]; lt_delta_net_output and lt_delta_net_state view the two parts.
 * Sequences (T > 1) run chunked, a single token recurrently; both give the same result. */
struct lt_tensor *lt_delta_net(struct lt_ctx *ctx, struct lt_tensor *q, struct lt_tensor *k,
                               struct lt_tensor *v, struct lt_tensor *g, struct lt_tensor *beta,
                               struct lt_tensor *state, float scale);
/* [S_v, H_v, T, B] */
struct lt_tensor *lt_delta_net_output(struct lt_ctx *ctx, struct lt_tensor *r);
/* [S_v, S_k, H_v, B] (a view with H_v and S_k strides swapped; cont it to store) */
struct lt_tensor *lt_delta_net_state(struct lt_ctx *ctx, struct lt_tensor *r);
/* The code path of a DELTA_NET or DELTA_NET_BACK node (op_params[1]). On the CPU the
 * forward's AUTO runs T == 1 recurrently and T > 1 in chunks of 64, and the backward's AUTO
 * is the recurrent one (the oracle), CHUNKED the chunk algebra the CUDA backward runs. On
 * CUDA the backward runs chunked unless RECURRENT, the forward per token unless CHUNKED
 * (src/backend/cuda/delta_net.cu says why). Tests force one path to hold the other to it. */
enum lt_delta_net_path {
    LT_DELTA_NET_PATH_AUTO = 0,
    LT_DELTA_NET_PATH_RECURRENT,
    LT_DELTA_NET_PATH_CHUNKED,
};
void lt_delta_net_set_path(struct lt_tensor *r, enum lt_delta_net_path path);
/* The precision of a DELTA_NET or DELTA_NET_BACK node's matrix products (op_params[2]). F32,
 * the default, keeps float32's precision everywhere. TF32 lets a device round the operands
 * of its chunked kernels' products to TF32 (10-bit mantissas, F32 accumulation): a third of
 * their tensor-core work, each product ~1e-3 off in relative terms, which training with
 * BF16 products (whose operands have 7-bit mantissas) can take. BF16 is TF32 where a kernel
 * has no BF16 form, and BF16 operands (F32 accumulation) where it has: the device's
 * backward's grad kernel at S_k = S_v = 128. The CPU computes in F32 either way; the
 * per-token kernels have no products to round. The backward rule passes the forward's
 * precision on to DELTA_NET_BACK. */
enum lt_delta_net_prec {
    LT_DELTA_NET_PREC_F32 = 0,
    LT_DELTA_NET_PREC_TF32,
    LT_DELTA_NET_PREC_BF16,
};
void lt_delta_net_set_prec(struct lt_tensor *r, enum lt_delta_net_prec prec);

/* One token of a Gated DeltaNet layer for each of S sequences, from its projections to its
 * gated norm (inference only, no backward rule): for each sequence, the causal conv of the
 * q, k, v channels after their carried inputs, silu, l2-normalised q and k (eps 1e-6),
 * beta = sigmoid(beta), g = softplus(alpha + dt) * a, one step of the gated delta rule
 * (lt_delta_net, scale 1 / sqrt(S_k)) from ssm_state, and rms_norm(o, norm_eps) * norm_w *
 * silu(z) per value head: the values of the unfused graph (model_graph.c) at T = 1.
 *   qkv [C, S] (q channels [S_k, H_k], then k, then v [S_v, H_v]: C = 2 S_k H_k + S_v H_v);
 *   z [S_v H_v, S]; beta, alpha [H_v, S];
 *   conv_state [K - 1, C, S] (the previous inputs of each channel, oldest first);
 *   ssm_state [S_v, S_k, H_v, S] (lt_delta_net's state);
 *   conv_w [K, C] (F32, F16 or BF16; K >= 2), dt, a [H_v] (a holds -exp(A_log)),
 *   norm_w [S_v]; n_k_heads = H_k, a divisor of H_v (value head h reads key head h % H_k).
 * Everything else is F32; sources may have any strides. The result is one contiguous F32
 * tensor: y [S_v H_v, S], then the new conv state [K - 1, C, S], then the new ssm state
 * [S_v, S_k, H_v, S]; the three functions below view the parts (contiguous).
 *
 * With seq_ids (I32 [S]; NULL: the above) the states are the session's whole caches, read
 * and written where they are: conv_state [K - 1, C, N] and ssm_state [S_v, S_k, H_v, N]
 * (N >= 1 slots; ssm_state's dim 0 adjacent), and sequence s reads slot seq_ids[s]. The
 * new conv and ssm states are written IN PLACE into the caches' slots seq_ids[s], so the
 * result holds y only (lt_gdn_decode_conv and lt_gdn_decode_state refuse such a node).
 * The ids of one call must be distinct (a repeated id is the caller's error: which update
 * lands is undefined); an id outside [0, N) skips its sequence, which gets zeros for y and
 * leaves every slot as it was. */
struct lt_tensor *lt_gdn_decode(struct lt_ctx *ctx, struct lt_tensor *qkv, struct lt_tensor *z,
                                struct lt_tensor *beta, struct lt_tensor *alpha,
                                struct lt_tensor *conv_state, struct lt_tensor *ssm_state,
                                struct lt_tensor *conv_w, struct lt_tensor *dt, struct lt_tensor *a,
                                struct lt_tensor *norm_w, int64_t n_k_heads, float norm_eps,
                                struct lt_tensor *seq_ids);
/* views of its result */
struct lt_tensor *lt_gdn_decode_output(struct lt_ctx *ctx, struct lt_tensor *r); /* [Sv*Hv, S] */
/* [K-1, C, S]; NULL for a node given seq_ids (its new conv state is in the cache) */
struct lt_tensor *lt_gdn_decode_conv(struct lt_ctx *ctx, struct lt_tensor *r);
/* [Sv, Sk, Hv, S]; NULL for a node given seq_ids (its new state is in the cache) */
struct lt_tensor *lt_gdn_decode_state(struct lt_ctx *ctx, struct lt_tensor *r);

/* Backward of lt_ssm_conv. grad [channels, T, n_seqs] is the gradient of its result. The
 * result is one flat F32 tensor of nelements(sx) + nelements(w) elements: d sx, then d w;
 * lt_ssm_conv_back_sx and lt_ssm_conv_back_w view the parts, contiguous and shaped like
 * sx and w (d w is F32 whatever w's type). */
struct lt_tensor *lt_ssm_conv_back(struct lt_ctx *ctx, struct lt_tensor *grad,
                                   struct lt_tensor *sx, struct lt_tensor *w);
struct lt_tensor *lt_ssm_conv_back_sx(struct lt_ctx *ctx, struct lt_tensor *r);
struct lt_tensor *lt_ssm_conv_back_w(struct lt_ctx *ctx, struct lt_tensor *r);

/* Backward of lt_conv_silu: one flat F32 tensor, d x (x's shape, contiguous) then d w;
 * lt_conv_silu_back_x and _w view the parts. */
struct lt_tensor *lt_conv_silu_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x,
                                    struct lt_tensor *w, struct lt_tensor *pos);
/* The same with d x of type (F32 or BF16: each element rounded once). A BF16 result holds d x
 * (padded to an even count), then d w in F32 from byte lt_conv_silu_back_dw_offset. */
struct lt_tensor *lt_conv_silu_back_as(struct lt_ctx *ctx, struct lt_tensor *grad,
                                       struct lt_tensor *x, struct lt_tensor *w,
                                       struct lt_tensor *pos, enum lt_type type);
size_t lt_conv_silu_back_dw_offset(const struct lt_tensor *r);
struct lt_tensor *lt_conv_silu_back_x(struct lt_ctx *ctx, struct lt_tensor *r);
struct lt_tensor *lt_conv_silu_back_w(struct lt_ctx *ctx, struct lt_tensor *r);

/* Backward of lt_delta_net. grad [S_v, H_v, T + S_k, B] is the gradient of its packed
 * result (output rows, then the new state's rows; either part may be zero), or [S_v, H_v, T,
 * B], the output's alone, the new state's gradient zero (a training step, whose layers
 * carry no state: the rule passes the output's gradient as it is, without a zero of the
 * whole result to add it into); the other
 * sources and scale are the forward's. The result is one flat F32 tensor packing the
 * gradients of q, k, v, g, beta and state in enum order, each contiguous and shaped like
 * its source; lt_delta_net_back_grad views one. Seven sources. */
enum lt_delta_net_grad {
    LT_DELTA_NET_GRAD_Q = 0,
    LT_DELTA_NET_GRAD_K,
    LT_DELTA_NET_GRAD_V,
    LT_DELTA_NET_GRAD_G,
    LT_DELTA_NET_GRAD_BETA,
    LT_DELTA_NET_GRAD_STATE,
    LT_DELTA_NET_GRAD_COUNT
};
struct lt_tensor *lt_delta_net_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *q,
                                    struct lt_tensor *k, struct lt_tensor *v, struct lt_tensor *g,
                                    struct lt_tensor *beta, struct lt_tensor *state, float scale);
struct lt_tensor *lt_delta_net_back_grad(struct lt_ctx *ctx, struct lt_tensor *r,
                                         enum lt_delta_net_grad which);

/* Mean next-token cross-entropy: logits [V, N] (F32), labels I32 [N]; a label < 0 is
 * masked out (no loss, no gradient). Result [1]; 0 when every label is masked. */
struct lt_tensor *lt_cross_entropy(struct lt_ctx *ctx, struct lt_tensor *logits,
                                   struct lt_tensor *labels);
/* dL/dlogits [V, N] given grad_loss (one F32, dL/dloss): grad_loss / n_valid *
 * (softmax(logits) - onehot(label)) per unmasked row, 0 for masked rows. */
struct lt_tensor *lt_cross_entropy_back(struct lt_ctx *ctx, struct lt_tensor *grad_loss,
                                        struct lt_tensor *logits, struct lt_tensor *labels);

/* The LM head and lt_cross_entropy in one: w [D, V] (F32, F16 or BF16) the head, h [D, N]
 * F32 the final hidden states, labels I32 [N]; the mean loss of the logits w^T h without
 * storing them ([1], F32). */
struct lt_tensor *lt_linear_cross_entropy(struct lt_ctx *ctx, struct lt_tensor *w,
                                          struct lt_tensor *h, struct lt_tensor *labels);
/* What a LINEAR_CE_BACK node makes: bits of its op_params[1]. Its result is one flat F32
 * tensor holding the parts asked for, in this order: dh [D, N], dw [D, V] (F32 whatever w's
 * type), and the loss itself (one float, LINEAR_CE's value), which lets the backward of a
 * loss seeded by autodiff compute the loss in the same pass over the logits. At least one of
 * dh and dw. */
enum lt_linear_ce_part {
    LT_LINEAR_CE_DH = 1 << 0,
    LT_LINEAR_CE_DW = 1 << 1,
    LT_LINEAR_CE_LOSS = 1 << 2,
};
/* dh and dw given grad_loss (one F32, dL/dloss) */
struct lt_tensor *lt_linear_cross_entropy_back(struct lt_ctx *ctx, struct lt_tensor *grad_loss,
                                               struct lt_tensor *w, struct lt_tensor *h,
                                               struct lt_tensor *labels);
/* the parts (enum lt_linear_ce_part, or'd) given grad_loss */
struct lt_tensor *lt_linear_cross_entropy_back_parts(struct lt_ctx *ctx,
                                                     struct lt_tensor *grad_loss,
                                                     struct lt_tensor *w, struct lt_tensor *h,
                                                     struct lt_tensor *labels, unsigned parts);
/* Views of a LINEAR_CE_BACK's parts ([D, N], [D, V] and [1]); NULL, with the error naming
 * the node, when it does not hold that part. */
struct lt_tensor *lt_linear_cross_entropy_back_h(struct lt_ctx *ctx, struct lt_tensor *r);
struct lt_tensor *lt_linear_cross_entropy_back_w(struct lt_ctx *ctx, struct lt_tensor *r);
struct lt_tensor *lt_linear_cross_entropy_back_loss(struct lt_ctx *ctx, struct lt_tensor *r);
/* The first element of part `part` in LINEAR_CE_BACK node r's result, -1 when r does not
 * hold it; and the shape rule of r (its parts valid, its result their size, one grad_loss),
 * which the views, the CPU's and CUDA's kernels and preconditions all follow. */
int64_t lt_linear_cross_entropy_part_at(const struct lt_tensor *r, enum lt_linear_ce_part part);
bool lt_linear_cross_entropy_back_fits(const struct lt_tensor *r);
/* The most tokens a device kernel takes a chunk (op_params[0]; 0, the default: as many as
 * 1 GiB of logits hold). Tests set it to make small problems run in several chunks; the
 * backward rule passes it on. */
void lt_linear_cross_entropy_set_chunk(struct lt_tensor *r, int32_t tokens);

/* a with b added into the window of a given by strides nb1..nb3 and a byte offset
 * (b's shape). Used to send a gradient into a view of a larger tensor. */
struct lt_tensor *lt_acc(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b, size_t nb1,
                         size_t nb2, size_t nb3, size_t offset);
/* The window of an ACC node (lt_acc, lt_acc_inplace): its strides nb1..nb3 and byte offset
 * in the result; false for any other node. */
bool lt_acc_window(const struct lt_tensor *node, size_t nb[3], size_t *offset);
/* lt_acc written into a's own storage (the result is a view of a, as CPY's is of its
 * destination): for a contiguous F32 a that nothing else reads afterwards, the gradient
 * accumulator autodiff builds for a tensor with several views. Saves copying a whole. */
struct lt_tensor *lt_acc_inplace(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                 size_t nb1, size_t nb2, size_t nb3, size_t offset);
/* The adjoint of lt_repeat: a summed down to like's shape (lt_can_repeat(like, a)), F32. */
struct lt_tensor *lt_repeat_back(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *like);
/* The adjoint of lt_get_rows: F32 zeros of like's shape [n, rows, ne2, ne3] with the rows
 * of grad [n, k, ne2, ne3] added at ids (I32 [k, ne2, ne3]); repeated ids accumulate. */
struct lt_tensor *lt_get_rows_back(struct lt_ctx *ctx, struct lt_tensor *grad,
                                   struct lt_tensor *ids, struct lt_tensor *like);
/* The same rows added into `into` (contiguous F32 of the table's shape) in place: the result
 * is a view of into (GET_ROWS_BACK with into as source 2), no pass over the rows no id names
 * (a tied embedding's gradient, added to the LM head's) */
struct lt_tensor *lt_get_rows_back_into(struct lt_ctx *ctx, struct lt_tensor *grad,
                                        struct lt_tensor *ids, struct lt_tensor *into);
/* whether a GET_ROWS_BACK node's shapes fit (grad's rows, the ids, the result) and its
 * source 2, when it has one, is the contiguous F32 storage it writes over: the one shape rule
 * every backend's claim checks */
bool lt_get_rows_back_fits(const struct lt_tensor *node);
/* grad * d silu(x) / dx, same shapes */
struct lt_tensor *lt_silu_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x);
/* Both gradients of lt_swiglu(gate, up) for its result's gradient grad (all three float, one
 * shape [n0, n1, n2, n3]): one contiguous F32 result [n0, n1, n2, 2 n3], d gate then d up,
 * which the two functions after it view, each shaped like gate. lt_swiglu_back_as writes
 * the result in type (F32, F16 or BF16: computed in F32, rounded to nearest even), for
 * gradients that only half-precision products read. */
struct lt_tensor *lt_swiglu_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *gate,
                                 struct lt_tensor *up);
struct lt_tensor *lt_swiglu_back_as(struct lt_ctx *ctx, struct lt_tensor *grad,
                                    struct lt_tensor *gate, struct lt_tensor *up,
                                    enum lt_type type);
/* both gradients of lt_glu_as(gate, up, act) (d gate = g up act'(gate), d up = g act(gate)),
 * laid out as lt_swiglu_back's */
struct lt_tensor *lt_glu_back_as(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *gate,
                                 struct lt_tensor *up, enum lt_glu act, enum lt_type type);
struct lt_tensor *lt_swiglu_back_gate(struct lt_ctx *ctx, struct lt_tensor *r);
struct lt_tensor *lt_swiglu_back_up(struct lt_ctx *ctx, struct lt_tensor *r);
/* whether a SWIGLU_BACK node's sources and result have shapes that fit (the one shape rule
 * the CPU's and a device's preconditions share) */
bool lt_swiglu_back_fits(const struct lt_tensor *node);

/* Optimizer steps: update param (and the moments) in place; the result is a view of param.
 * grad is an accumulator: the step uses grad * grad_scale, then zeroes it. hp holds the
 * hyper-parameters (src/ops/optim.c): AdamW [lr, beta1, beta2, eps, weight_decay,
 * 1 - beta1^t, 1 - beta2^t, grad_scale]; SGD [lr, weight_decay, grad_scale]. F32. */
struct lt_tensor *lt_adamw_step(struct lt_ctx *ctx, struct lt_tensor *param, struct lt_tensor *grad,
                                struct lt_tensor *m, struct lt_tensor *v, struct lt_tensor *hp);
struct lt_tensor *lt_sgd_step(struct lt_ctx *ctx, struct lt_tensor *param, struct lt_tensor *grad,
                              struct lt_tensor *hp);

#ifdef __cplusplus
}
#endif
#endif
