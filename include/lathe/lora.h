/* lora.h: LoRA adapters: made for training, read and written as GGUF files in llama.cpp's
 * adapter layout, and handed to a model's graphs (lt_model_adapters) for training and
 * inference.
 *
 * An adapter pair adapts one 2-D weight W [n_in, n_out] (GGUF layout, ne0 first):
 *
 *   y = W x + s * B (A x),   a [n_in, rank],  b [rank, n_out],
 *   s = user_scale * alpha / rank   (alpha == 0 in a file: s = user_scale, as llama.cpp)
 *
 * The file: general.type = "adapter", general.architecture = the model's, adapter.type =
 * "lora", adapter.lora.alpha (F32); tensors "blk.N.<module>.weight.lora_a" with ne
 * (n_in, rank) and ".lora_b" with ne (rank, n_out), each lora_a before its lora_b. These
 * are the names and shapes llama.cpp's convert_lora_to_gguf.py writes and llama.cpp's
 * loader checks (a->ne0 == W->ne0, b->ne1 == W->ne1, a->ne1 == b->ne0).
 *
 * In memory every a and b is F32 on the host whatever type the file stored (F16, BF16,
 * Q8_0 adapters are converted when loaded), so a loaded adapter can be trained further. */
#ifndef LATHE_LORA_H
#define LATHE_LORA_H

#include <stdbool.h>
#include <stdint.h>

#include "lathe/model.h"
#include "lathe/status.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LT_LORA_MAX_TARGETS 16
#define LT_LORA_TARGET_NAME 32

/* The module names an adapter can target (the <module> of "blk.N.<module>.weight"):
 * attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, and qwen35's attn_qkv,
 * attn_gate, ssm_out. */
bool lt_lora_target_known(const char *module);
/* The comma list used when none is given: every attention projection the architecture has
 * (llama, qwen2: attn_q,attn_k,attn_v,attn_output; qwen35 adds attn_qkv,attn_gate,ssm_out). */
const char *lt_lora_default_targets(enum lt_arch arch);

/* Splits a comma list of module names ("attn_q, attn_v"). Empty items and spaces are
 * skipped; duplicates are dropped. An unknown name, an over-long name or more than
 * LT_LORA_MAX_TARGETS names is LT_ERR_INVALID naming it. */
lt_status lt_lora_parse_targets(const char *list, char names[][LT_LORA_TARGET_NAME], int *n);

struct lt_lora_params {
    int rank;            /* >= 1 */
    float alpha;         /* > 0 */
    const char *targets; /* comma list; NULL or "": lt_lora_default_targets */
    int top_layers;      /* adapt only the last K blocks; 0: all */
    uint64_t seed;       /* for A's initialisation */
};

struct lt_lora_pair {
    char weight[LT_MAX_NAME]; /* the weight adapted: "blk.3.attn_q.weight" */
    int layer;                /* N of blk.N */
    struct lt_tensor *a;      /* F32 [n_in, rank], host, named "<weight>.lora_a" */
    struct lt_tensor *b;      /* F32 [rank, n_out], host, named "<weight>.lora_b" */
};

struct lt_span; /* src/core/host_span.h */

struct lt_lora {
    char arch[32]; /* general.architecture of the model the adapter belongs to */
    float alpha;   /* adapter.lora.alpha; 0: none given */
    int n_pairs;
    struct lt_lora_pair *pairs;
    struct lt_ctx *ctx;   /* owns the tensor headers (no_alloc) */
    struct lt_span *span; /* owns their data: reserved, then committed (lt_lora_commit) */
    uint64_t seed;        /* draws A at the commit of an adapter lt_lora_reserve made */
    bool draw_a;          /* A is still to be drawn */
};

/* A new adapter for `m`: one pair per target weight of the last top_layers blocks, A drawn
 * Kaiming-uniform (U(-1/sqrt(n_in), 1/sqrt(n_in)), PEFT's default) from `seed`, B zero, so
 * the adapted model starts equal to the base. Targets the model lacks in some layers (qwen35
 * has attn_q only in its attention layers, attn_qkv only in its DeltaNet layers) are skipped
 * there. A target given explicitly that the model has in no layer at all is LT_ERR_INVALID
 * (a typo, or another architecture's module); so is an adapter that would have no pair. A
 * and B are flagged LT_FLAG_PARAM. */
lt_status lt_lora_new(const struct lt_model *m, const struct lt_lora_params *p,
                      struct lt_lora **out);
/* The adapter lt_lora_new would make, with its memory reserved but not committed: every
 * tensor has its shape, flags and final address, enough to build, place and measure graphs
 * that read it (training admission), and no byte of it may be read or written until
 * lt_lora_commit, which commits the memory and draws A (the values lt_lora_new gives).
 * Making one takes no memory beyond the headers, whatever the rank. */
lt_status lt_lora_reserve(const struct lt_model *m, const struct lt_lora_params *p,
                          struct lt_lora **out);
/* Commits a reserved adapter's memory and initialises it; LT_OK at once for one that is
 * committed (made by lt_lora_new or lt_lora_load). LT_ERR_NOMEM when the host will not
 * commit the memory; the adapter stays reserved. */
lt_status lt_lora_commit(struct lt_lora *l);
bool lt_lora_committed(const struct lt_lora *l);
/* Reads an adapter file (see the top of this file). Anything else (another general.type, a
 * tensor without a partner, mismatched ranks) is LT_ERR_FORMAT naming it. */
lt_status lt_lora_load(const char *path, struct lt_lora **out);
/* Checks that the adapter fits `m`: same architecture, every adapted weight present and of
 * matching shape. LT_ERR_INVALID naming the first mismatch. */
lt_status lt_lora_check(const struct lt_lora *l, const struct lt_model *m);
/* Writes the adapter (temporary file, then rename). Tensors are stored as F32. A reserved
 * adapter not yet committed is LT_ERR_INVALID. */
lt_status lt_lora_save(const struct lt_lora *l, const char *path);
void lt_lora_free(struct lt_lora *l); /* NULL is fine */

/* Rank of pair i (a->ne[1]). */
int lt_lora_rank(const struct lt_lora *l, int i);
/* The s of the formula above for pair i at user_scale. */
float lt_lora_scale(const struct lt_lora *l, int i, float user_scale);
/* Sets or clears LT_FLAG_PARAM on every a and b. */
void lt_lora_set_trainable(struct lt_lora *l, bool trainable);

/* The list a model graph reads: one lt_model_lora per pair of every adapter, adapter i at
 * scales[i] (several adapters may adapt the same weight: their products add). Each adapter
 * is checked against m first (lt_lora_check). *list is malloc'd (free it), NULL when
 * *n_list is 0. */
lt_status lt_lora_model_list(const struct lt_model *m, struct lt_lora *const *loras,
                             const float *scales, int n, struct lt_model_lora **list, int *n_list);

#ifdef __cplusplus
}
#endif
#endif
