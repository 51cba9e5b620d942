/* test_train_tiny.h: a tiny random llama model written as a GGUF file, with a byte-level
 * tokenizer (one token per byte, no merges, plus ChatML's control tokens) and a ChatML chat
 * template, for the training and LoRA tests. Because every ordinary token is one byte, the
 * token sequence of a text is predictable by hand: byte b is token b, and the control tokens
 * are TINY_ENDOFTEXT, TINY_IM_START and TINY_IM_END. */
#ifndef LATHE_TESTS_TEST_TRAIN_TINY_H
#define LATHE_TESTS_TEST_TRAIN_TINY_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/gguf.h"

#define TINY_ENDOFTEXT 256
#define TINY_IM_START 257
#define TINY_IM_END 258
#define TINY_VOCAB 259

struct tiny_spec {
    int n_embd, n_head, n_head_kv, n_ff, n_layer;
    enum lt_type wtype; /* type of the 2-D matmul weights (F32, F16, BF16, Q8_0) */
    uint64_t seed;
};

static const char tiny_chat_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* GPT-2's byte-to-character map, as UTF-8 text of one character. */
static inline void tiny_byte_text(int b, char out[4])
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0; /* rank among the bytes that are remapped */
        for (int k = 0; k < b; k++)
            if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* The byte-level vocabulary (256 bytes, then the three specials) and its eos id, with the
 * given pre-tokenizer name. */
static inline void tiny_write_tokenizer(struct lt_gguf_writer *w, const char *pre)
{
    static char texts[TINY_VOCAB][16];
    const char *toks[TINY_VOCAB];
    int32_t types[TINY_VOCAB];
    for (int b = 0; b < 256; b++) {
        tiny_byte_text(b, texts[b]);
        toks[b] = texts[b];
        types[b] = 1;
    }
    toks[TINY_ENDOFTEXT] = "<|endoftext|>";
    toks[TINY_IM_START] = "<|im_start|>";
    toks[TINY_IM_END] = "<|im_end|>";
    types[TINY_ENDOFTEXT] = types[TINY_IM_START] = types[TINY_IM_END] = 3;
    lt_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    lt_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    lt_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, TINY_VOCAB);
    lt_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LT_GGUF_TYPE_I32, types, TINY_VOCAB);
    lt_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", TINY_IM_END);
}

static uint64_t tiny_gguf_rng;
static inline float tiny_gguf_rand(void)
{
    tiny_gguf_rng = tiny_gguf_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((tiny_gguf_rng >> 40) / 16777216.0) * 2.0f - 1.0f;
}

/* Storage for the tensors until the write (the writer references data). */
struct tiny_store {
    void *blocks[64];
    int n;
};

static inline int tiny_add(struct lt_gguf_writer *w, struct tiny_store *s, const char *name,
                           enum lt_type type, int64_t ne0, int64_t ne1, float scale, float offset)
{
    int64_t n = ne0 * ne1;
    float *f = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        f[i] = offset + scale * tiny_gguf_rand();
    size_t bytes = lt_row_size(type, ne0) * (size_t)ne1;
    void *data = malloc(bytes);
    const struct lt_type_traits *tr = lt_type_traits(type);
    for (int64_t r = 0; r < ne1; r++)
        tr->from_float(f + r * ne0, (char *)data + (size_t)r * lt_row_size(type, ne0), ne0);
    free(f);
    s->blocks[s->n++] = data;
    int64_t ne[2] = {ne0, ne1};
    return lt_gguf_writer_add_tensor(w, name, type, ne1 > 1 ? 2 : 1, ne, data, bytes) == LT_OK;
}

/* Writes the model to path; returns 0 on success. */
static inline int tiny_model_write(const char *path, const struct tiny_spec *sp)
{
    tiny_gguf_rng = sp->seed;
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    struct tiny_store s = {{0}, 0};
    int E = sp->n_embd, D = E / sp->n_head;
    lt_gguf_writer_set_str(w, "general.architecture", "llama");
    lt_gguf_writer_set_str(w, "general.name", "tiny test model");
    lt_gguf_writer_set_u32(w, "llama.context_length", 512);
    lt_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)E);
    lt_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)sp->n_layer);
    lt_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)sp->n_ff);
    lt_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)sp->n_head);
    lt_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)sp->n_head_kv);
    lt_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    lt_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    tiny_write_tokenizer(w, "smollm");
    lt_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", TINY_ENDOFTEXT);
    lt_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    lt_gguf_writer_set_str(w, "tokenizer.chat_template", tiny_chat_template);
    /* weights */
    int ok = 1;
    float se = 1.0f / sqrtf((float)E), sf = 1.0f / sqrtf((float)sp->n_ff);
    ok &= tiny_add(w, &s, "token_embd.weight", LT_TYPE_F32, E, TINY_VOCAB, 1.0f, 0);
    ok &= tiny_add(w, &s, "output_norm.weight", LT_TYPE_F32, E, 1, 0.1f, 1.0f);
    ok &= tiny_add(w, &s, "output.weight", sp->wtype, E, TINY_VOCAB, se, 0);
    for (int l = 0; l < sp->n_layer; l++) {
        char name[64];
#define TINY_W(suffix, type, ne0, ne1, scale, offset)                                              \
    (snprintf(name, sizeof(name), "blk.%d.%s", l, suffix),                                         \
     tiny_add(w, &s, name, type, ne0, ne1, scale, offset))
        ok &= TINY_W("attn_norm.weight", LT_TYPE_F32, E, 1, 0.1f, 1.0f);
        ok &= TINY_W("attn_q.weight", sp->wtype, E, D * sp->n_head, se, 0);
        ok &= TINY_W("attn_k.weight", sp->wtype, E, D * sp->n_head_kv, se, 0);
        ok &= TINY_W("attn_v.weight", sp->wtype, E, D * sp->n_head_kv, se, 0);
        ok &= TINY_W("attn_output.weight", sp->wtype, D * sp->n_head, E, se, 0);
        ok &= TINY_W("ffn_norm.weight", LT_TYPE_F32, E, 1, 0.1f, 1.0f);
        ok &= TINY_W("ffn_gate.weight", sp->wtype, E, sp->n_ff, se, 0);
        ok &= TINY_W("ffn_up.weight", sp->wtype, E, sp->n_ff, se, 0);
        ok &= TINY_W("ffn_down.weight", sp->wtype, sp->n_ff, E, sf, 0);
#undef TINY_W
    }
    if (ok && lt_gguf_writer_write(w, path) != LT_OK)
        ok = 0;
    if (!ok)
        fprintf(stderr, "tiny_model_write(%s): %s\n", path, lt_last_error());
    lt_gguf_writer_free(w);
    for (int i = 0; i < s.n; i++)
        free(s.blocks[i]);
    return ok ? 0 : 1;
}

/* A path in the build folder (or /tmp) for a test's file. */
static inline void tiny_path(char *out, size_t size, const char *name)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    snprintf(out, size, "%s/%s", dir && *dir ? dir : "/tmp", name);
}

/* The text the small training jobs learn: the sentence 12 times (a static buffer). */
static inline const char *tiny_train_text(void)
{
    static char buf[1024];
    buf[0] = 0;
    for (int i = 0; i < 12; i++)
        strcat(buf, "the quick brown fox jumps over the lazy dog. ");
    return buf;
}

#endif
