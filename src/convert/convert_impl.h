/* convert_impl.h (internal): what the converter's files share: the log sink, the tokenizer
 * step and the small file helpers. See include/lathe/convert.h for the whole. */
#ifndef LATHE_MODEL_CONVERT_IMPL_H
#define LATHE_MODEL_CONVERT_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/convert.h"
#include "lathe/gguf.h"

struct lt_convert_log {
    void (*fn)(void *user, const char *line);
    void *user;
};

void lt_convert_logf(const struct lt_convert_log *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* HF_DIR/NAME into dst; LT_ERR_INVALID when it does not fit. */
lt_status lt_convert_join(char *dst, size_t cap, const char *dir, const char *name);
bool lt_convert_is_file(const char *path);

/* Writes the tokenizer.ggml.* and tokenizer.chat_template keys from HF_DIR's tokenizer.json,
 * tokenizer_config.json, config.json (special token ids) and chat_template.jinja, as
 * llama.cpp's converter does for a byte-level BPE ("gpt2") tokenizer. Without tokenizer.json,
 * writes what llama.cpp writes for a model without a vocabulary: tokenizer.ggml.model = "none"
 * and {arch}.vocab_size (config.json's), and sets *n_tokens = 0. */
lt_status lt_convert_vocab(struct lt_gguf_writer *w, const char *hf_dir,
                           const struct lt_hf_config *cfg, const struct lt_convert_log *log,
                           int64_t *n_tokens);

#endif
