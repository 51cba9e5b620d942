/* tokenizer_gguf.c: building a tokenizer and a chat template from a GGUF file's metadata
 * (llama.cpp's tokenizer.ggml.* keys). Only reads through the GGUF reader; every array is
 * checked for its element type and length before use. */
#include <stdlib.h>
#include <string.h>

#include "lathe/gguf.h"
#include "tokenizer/tok_internal.h"

static lt_status opt_id(const struct lt_gguf *g, const char *key, lt_token *out)
{
    *out = LT_TOKEN_NONE;
    if (lt_gguf_find_key(g, key) < 0)
        return LT_OK;
    uint32_t v;
    lt_status st = lt_gguf_get_u32(g, key, &v);
    if (st)
        return st;
    if (v > INT32_MAX)
        return lt_fail(LT_ERR_FORMAT, "%s: id %u is out of range", key, v);
    *out = (lt_token)v;
    return LT_OK;
}

static lt_status str_array(const struct lt_gguf *g, const char *key, const char ***strs,
                           size_t **lens, size_t *n)
{
    const struct lt_gguf_value *v;
    lt_status st = lt_gguf_get_arr(g, key, LT_GGUF_TYPE_STRING, &v);
    if (st)
        return st;
    uint64_t count = lt_gguf_arr_len(v);
    *n = (size_t)count;
    *strs = malloc((count ? count : 1) * sizeof(char *));
    *lens = malloc((count ? count : 1) * sizeof(size_t));
    if (!*strs || !*lens)
        return lt_fail(LT_ERR_NOMEM, "%s: out of memory for %llu strings", key,
                       (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++) {
        uint64_t len;
        (*strs)[i] = lt_gguf_arr_str(v, i, &len);
        (*lens)[i] = (size_t)len;
    }
    return LT_OK;
}

lt_status lt_tokenizer_from_gguf(const struct lt_gguf *g, struct lt_tokenizer **out)
{
    *out = NULL;
    struct lt_vocab_desc d = {0};
    const char **tokens = NULL, **merges = NULL;
    size_t *token_lens = NULL, *merge_lens = NULL;
    int32_t *types = NULL;
    lt_status st;
    if ((st = lt_gguf_get_str(g, "tokenizer.ggml.model", &d.model)))
        goto out_free_arrays;
    if (lt_gguf_find_key(g, "tokenizer.ggml.pre") >= 0) {
        if ((st = lt_gguf_get_str(g, "tokenizer.ggml.pre", &d.pre)))
            goto out_free_arrays;
    } else {
        d.pre = "(none: tokenizer.ggml.pre is missing)";
    }
    if ((st = str_array(g, "tokenizer.ggml.tokens", &tokens, &token_lens, &d.n_tokens)))
        goto out_free_arrays;
    d.tokens = tokens;
    d.token_lens = token_lens;
    if (lt_gguf_find_key(g, "tokenizer.ggml.merges") >= 0) {
        if ((st = str_array(g, "tokenizer.ggml.merges", &merges, &merge_lens, &d.n_merges)))
            goto out_free_arrays;
        d.merges = merges;
        d.merge_lens = merge_lens;
    }
    if (lt_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        const struct lt_gguf_value *v;
        if ((st = lt_gguf_get_arr(g, "tokenizer.ggml.token_type", LT_GGUF_TYPE_COUNT, &v)))
            goto out_free_arrays;
        enum lt_gguf_type et = lt_gguf_arr_type(v);
        if (et != LT_GGUF_TYPE_I32 && et != LT_GGUF_TYPE_U32) {
            st = lt_fail(LT_ERR_FORMAT, "tokenizer.ggml.token_type: elements are %s, not i32",
                         lt_gguf_type_name(et));
            goto out_free_arrays;
        }
        if (lt_gguf_arr_len(v) != d.n_tokens) {
            st = lt_fail(LT_ERR_FORMAT, "tokenizer.ggml.token_type has %llu entries for %zu tokens",
                         (unsigned long long)lt_gguf_arr_len(v), d.n_tokens);
            goto out_free_arrays;
        }
        types = malloc((d.n_tokens ? d.n_tokens : 1) * sizeof(int32_t));
        if (!types) {
            st = lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory");
            goto out_free_arrays;
        }
        memcpy(types, lt_gguf_arr_data(v), d.n_tokens * sizeof(int32_t));
        d.token_types = types;
    }
    if ((st = opt_id(g, "tokenizer.ggml.bos_token_id", &d.bos)) ||
        (st = opt_id(g, "tokenizer.ggml.eos_token_id", &d.eos)) ||
        (st = opt_id(g, "tokenizer.ggml.eot_token_id", &d.eot)) ||
        (st = opt_id(g, "tokenizer.ggml.eom_token_id", &d.eom)) ||
        (st = opt_id(g, "tokenizer.ggml.padding_token_id", &d.pad)) ||
        (st = opt_id(g, "tokenizer.ggml.unknown_token_id", &d.unk)))
        goto out_free_arrays;
    if (lt_gguf_find_key(g, "tokenizer.ggml.add_bos_token") >= 0 &&
        (st = lt_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &d.add_bos)))
        goto out_free_arrays;
    st = lt_tokenizer_init(&d, out);

out_free_arrays:
    free(tokens);
    free(token_lens);
    free(merges);
    free(merge_lens);
    free(types);
    return st;
}

lt_status lt_chat_template_from_gguf(const struct lt_gguf *g, struct lt_chat_template *out)
{
    const char *jinja = NULL, *arch = NULL;
    lt_status st;
    if (lt_gguf_find_key(g, "tokenizer.chat_template") >= 0 &&
        (st = lt_gguf_get_str(g, "tokenizer.chat_template", &jinja)))
        return st;
    if (lt_gguf_find_key(g, "general.architecture") >= 0 &&
        (st = lt_gguf_get_str(g, "general.architecture", &arch)))
        return st;
    return lt_chat_template_detect(jinja, arch, out);
}
