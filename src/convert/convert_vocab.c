/* convert_vocab.c: an HF byte-level BPE tokenizer (tokenizer.json) to GGUF's tokenizer keys.
 *
 * Follows llama.cpp's converter (_set_vocab_gpt2 and gguf-py's SpecialVocab): the token list
 * is padded to the config's vocab_size with "[PAD<i>]" (type UNUSED); added tokens are CONTROL
 * when special or special-looking ("<|...|>"), else USER_DEFINED; merges given as pairs are
 * joined with a space, a space inside a part written as U+0120. Special token ids come first
 * from tokenizer_config.json's *_token strings (resolved through added_tokens), then from
 * config.json's *_token_id.
 *
 * One difference: llama.cpp names the pre-tokenizer ("tokenizer.ggml.pre") by hashing what the
 * real tokenizer makes of a test string; lathe cannot run the tokenizer here, so it reads the
 * pre_tokenizer in tokenizer.json and recognises the regexes of the families it supports
 * (qwen2, qwen35, llama-bpe, smollm, gpt-2). An unrecognised one is refused, as llama.cpp
 * refuses an unknown hash.
 *
 * A folder without tokenizer.json gets llama.cpp's vocabulary-less keys instead
 * (tokenizer.ggml.model = "none" and {arch}.vocab_size): see write_no_vocab. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_impl.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>

enum tok_type { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

/* tokenizer.json pre-tokenizer regexes, as JSON-decoded strings */
static const struct {
    const char *regex;
    const char *pre;
} known_splits[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "qwen2"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
     "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "qwen35"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "llama-bpe"},
};

static const char *type_of(json_t *o)
{
    return json_is_object(o) ? json_string_value(json_object_get(o, "type")) : NULL;
}

static bool is_type(json_t *o, const char *t)
{
    const char *s = type_of(o);
    return s && !strcmp(s, t);
}

/* The name llama.cpp would give this pre_tokenizer, or NULL. */
static const char *detect_pre(json_t *pre)
{
    if (is_type(pre, "ByteLevel"))
        return json_is_false(json_object_get(pre, "use_regex")) ? NULL : "gpt-2";
    if (!is_type(pre, "Sequence"))
        return NULL;
    json_t *list = json_object_get(pre, "pretokenizers");
    if (!json_is_array(list) || json_array_size(list) != 2)
        return NULL;
    json_t *a = json_array_get(list, 0), *b = json_array_get(list, 1);
    if (!is_type(b, "ByteLevel"))
        return NULL;
    /* SmolLM: single digits, then GPT-2's byte-level split */
    if (is_type(a, "Digits") && json_is_true(json_object_get(a, "individual_digits")) &&
        !json_is_false(json_object_get(b, "use_regex")))
        return "smollm";
    if (!is_type(a, "Split") || !json_is_false(json_object_get(b, "use_regex")))
        return NULL;
    const char *re = json_string_value(json_object_get(json_object_get(a, "pattern"), "Regex"));
    if (!re)
        return NULL;
    for (size_t i = 0; i < sizeof(known_splits) / sizeof(known_splits[0]); i++)
        if (!strcmp(re, known_splits[i].regex))
            return known_splits[i].pre;
    return NULL;
}

/* llama.cpp's does_token_look_special */
static bool looks_special(const char *t)
{
    size_t n = strlen(t);
    if (!strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") ||
        !strcmp(t, "[@BOS@]"))
        return true;
    if (n >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>"))
        return true;
    /* "<｜" ... "｜>" (fullwidth vertical bar, U+FF5C) */
    if (n >= 8 && !strncmp(t, "<\xef\xbd\x9c", 4) && !strcmp(t + n - 4, "\xef\xbd\x9c>"))
        return true;
    return n >= 8 && !strncmp(t, "<unused", 7) && t[n - 1] == '>';
}

/* s with every U+2581 ("▁") replaced by a space; caller frees. */
static char *replace_sp_marks(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;
    if (!out)
        return NULL;
    while (*s) {
        if (!strncmp(s, "\xe2\x96\x81", 3)) {
            *o++ = ' ';
            s += 3;
        } else {
            *o++ = *s++;
        }
    }
    *o = 0;
    return out;
}

/* A merge given as a pair: "a b", a space inside a part written as U+0120. */
static char *join_pair(const char *a, const char *b)
{
    size_t n = 0;
    for (const char *p = a; *p; p++)
        n += *p == ' ' ? 2 : 1;
    for (const char *p = b; *p; p++)
        n += *p == ' ' ? 2 : 1;
    char *out = malloc(n + 2), *o = out;
    if (!out)
        return NULL;
    for (int k = 0; k < 2; k++) {
        for (const char *p = k ? b : a; *p; p++) {
            if (*p == ' ') {
                *o++ = (char)0xc4;
                *o++ = (char)0xa0;
            } else {
                *o++ = *p;
            }
        }
        if (!k)
            *o++ = ' ';
    }
    *o = 0;
    return out;
}

static json_t *load_json(const char *dir, const char *name, bool *present, lt_status *st)
{
    char path[4096];
    *present = false;
    *st = lt_convert_join(path, sizeof(path), dir, name);
    if (*st != LT_OK || !lt_convert_is_file(path))
        return NULL;
    *present = true;
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j)
        *st = lt_fail(LT_ERR_FORMAT, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
                      jerr.text);
    return j;
}

/* The content of a tokenizer_config "*_token" entry (a string or {"content": ...}). */
static const char *token_content(json_t *e)
{
    if (json_is_string(e))
        return json_string_value(e);
    if (json_is_object(e))
        return json_string_value(json_object_get(e, "content"));
    return NULL;
}

struct special {
    const char *type;
    const char *key; /* NULL: llama.cpp has no key for it */
    int64_t id;      /* -1: unset */
};

static lt_status write_merges(struct lt_gguf_writer *w, json_t *merges, const char *path)
{
    size_t n = json_is_array(merges) ? json_array_size(merges) : 0;
    if (n == 0)
        return LT_OK;
    char **strs = calloc(n, sizeof(char *));
    if (!strs)
        return lt_fail(LT_ERR_NOMEM, "out of memory for %zu merges", n);
    lt_status st = LT_OK;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(merges, i);
        if (json_is_string(e)) {
            strs[i] = strdup(json_string_value(e));
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            strs[i] = join_pair(json_string_value(json_array_get(e, 0)),
                                json_string_value(json_array_get(e, 1)));
        } else {
            st = lt_fail(LT_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [a, b]",
                         path, i);
            goto out_free;
        }
        if (!strs[i]) {
            st = lt_fail(LT_ERR_NOMEM, "out of memory for merges");
            goto out_free;
        }
    }
    st = lt_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)strs, n);
out_free:
    for (size_t i = 0; i < n; i++)
        free(strs[i]);
    free(strs);
    return st;
}

/* What the post_processor says about adding bos/eos/sep (llama.cpp's crude reading). */
static void post_processor_adds(json_t *tok, json_t *tc, int add[3])
{
    json_t *pp = json_object_get(tok, "post_processor");
    if (!json_is_object(pp))
        return;
    json_t *list = json_object_get(pp, "processors");
    size_t n = json_is_array(list) ? json_array_size(list) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_is_array(list) ? json_array_get(list, i) : pp;
        if (is_type(p, "RobertaProcessing")) {
            add[0] = add[1] = add[2] = 1;
            continue;
        }
        if (!is_type(p, "TemplateProcessing"))
            continue;
        json_t *single = json_object_get(p, "single");
        if (!json_is_array(single) || json_array_size(single) < 2)
            continue;
        const char *bos = tc ? token_content(json_object_get(tc, "bos_token")) : NULL;
        const char *cls = tc ? token_content(json_object_get(tc, "cls_token")) : NULL;
        const char *eos = tc ? token_content(json_object_get(tc, "eos_token")) : NULL;
        const char *first = json_string_value(
            json_object_get(json_object_get(json_array_get(single, 0), "SpecialToken"), "id"));
        const char *last = json_string_value(json_object_get(
            json_object_get(json_array_get(single, json_array_size(single) - 1), "SpecialToken"),
            "id"));
        if (first && *first)
            add[0] = (bos && !strcmp(first, bos)) || (cls && !strcmp(first, cls)) || !tc;
        if (last && *last)
            add[1] = (eos && !strcmp(last, eos)) || !tc;
    }
}

static lt_status write_specials(struct lt_gguf_writer *w, const char *hf_dir, json_t *tok,
                                json_t *tc, int64_t n_vocab, const struct lt_convert_log *log)
{
    struct special sp[] = {
        {"bos", "tokenizer.ggml.bos_token_id", -1},
        {"eos", "tokenizer.ggml.eos_token_id", -1},
        {"unk", "tokenizer.ggml.unknown_token_id", -1},
        {"sep", "tokenizer.ggml.seperator_token_id", -1}, /* sic: llama.cpp's key */
        {"pad", "tokenizer.ggml.padding_token_id", -1},
        {"cls", NULL, -1},
        {"mask", "tokenizer.ggml.mask_token_id", -1},
    };
    const int n_sp = (int)(sizeof(sp) / sizeof(sp[0]));
    int order[16], n_order = 0; /* types in the order they were set (llama.cpp's dict order) */
    json_t *added = json_object_get(tok, "added_tokens");
    char key[64];
    if (tc) {
        for (int t = 0; t < n_sp; t++) {
            snprintf(key, sizeof(key), "%s_token", sp[t].type);
            const char *content = token_content(json_object_get(tc, key));
            if (!content)
                continue;
            for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
                json_t *a = json_array_get(added, i);
                const char *c = json_string_value(json_object_get(a, "content"));
                json_t *id = json_object_get(a, "id");
                if (c && !strcmp(c, content) && json_is_integer(id)) {
                    if (json_integer_value(id) >= 0) {
                        sp[t].id = (int64_t)json_integer_value(id);
                        order[n_order++] = t;
                    }
                    break;
                }
            }
        }
    }
    bool present;
    lt_status st;
    json_t *config = load_json(hf_dir, "config.json", &present, &st);
    if (st != LT_OK)
        return st;
    for (int t = 0; t < n_sp && config; t++) {
        snprintf(key, sizeof(key), "%s_token_id", sp[t].type);
        json_t *v = json_object_get(config, key);
        if (!v && json_is_object(json_object_get(config, "text_config")))
            v = json_object_get(json_object_get(config, "text_config"), key);
        if (sp[t].id < 0 && json_is_integer(v) && json_integer_value(v) >= 0) {
            sp[t].id = (int64_t)json_integer_value(v);
            order[n_order++] = t;
        }
    }
    json_decref(config);
    for (int k = 0; k < n_order; k++) {
        struct special *s = &sp[order[k]];
        if (!s->key)
            continue;
        if (s->id >= n_vocab) {
            lt_convert_logf(log, "warning: %s token id %lld is not below the vocabulary size "
                                 "%lld; not written",
                            s->type, (long long)s->id, (long long)n_vocab);
            continue;
        }
        if ((st = lt_gguf_writer_set_u32(w, s->key, (uint32_t)s->id)) != LT_OK)
            return st;
    }

    /* add_bos / add_eos / add_sep: the post_processor's reading, then tokenizer_config */
    static const char *const add_types[3] = {"bos", "eos", "sep"};
    int add[3] = {-1, -1, -1};
    post_processor_adds(tok, tc, add);
    for (int t = 0; t < 3 && tc; t++) {
        snprintf(key, sizeof(key), "add_%s_token", add_types[t]);
        json_t *v = json_object_get(tc, key);
        if (json_is_boolean(v))
            add[t] = json_is_true(v);
    }
    for (int t = 0; t < 3; t++) {
        if (add[t] < 0)
            continue;
        snprintf(key, sizeof(key), "tokenizer.ggml.add_%s_token", add_types[t]);
        if ((st = lt_gguf_writer_set_bool(w, key, add[t] == 1)) != LT_OK)
            return st;
    }
    return LT_OK;
}

/* tokenizer_config's chat_template, else chat_template.jinja, else chat_template.json; only
 * when tokenizer_config.json exists, as in llama.cpp. */
static lt_status write_chat_template(struct lt_gguf_writer *w, const char *hf_dir, json_t *tc,
                                     const struct lt_convert_log *log)
{
    if (!tc)
        return LT_OK;
    json_t *t = json_object_get(tc, "chat_template");
    if (json_is_string(t))
        return lt_gguf_writer_set_str(w, "tokenizer.chat_template", json_string_value(t));
    if (t && !json_is_null(t)) {
        lt_convert_logf(log, "warning: tokenizer_config.json's chat_template is not a string; "
                             "not written");
        return LT_OK;
    }
    char path[4096];
    lt_status st = lt_convert_join(path, sizeof(path), hf_dir, "chat_template.jinja");
    if (st != LT_OK)
        return st;
    if (lt_convert_is_file(path)) {
        FILE *f = fopen(path, "rb");
        if (!f)
            return lt_fail(LT_ERR_IO, "%s: cannot open", path);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            fclose(f);
            return lt_fail(LT_ERR_IO, "%s: cannot read", path);
        }
        fclose(f);
        st = lt_gguf_writer_set_strn(w, "tokenizer.chat_template", buf, (uint64_t)n);
        free(buf);
        return st;
    }
    bool present;
    json_t *j = load_json(hf_dir, "chat_template.json", &present, &st);
    if (st != LT_OK)
        return st;
    if (j && json_is_string(json_object_get(j, "chat_template")))
        st = lt_gguf_writer_set_str(w, "tokenizer.chat_template",
                                    json_string_value(json_object_get(j, "chat_template")));
    json_decref(j);
    return st;
}

/* tokenizer.json, which exists, to the tokenizer keys. */
static lt_status convert_tokenizer_json(struct lt_gguf_writer *w, const char *hf_dir,
                                        const struct lt_hf_config *cfg,
                                        const struct lt_convert_log *log, int64_t *n_tokens)
{
    char path[4096];
    bool present, tc_present;
    lt_status st;
    json_t *tok = load_json(hf_dir, "tokenizer.json", &present, &st);
    if (st != LT_OK)
        return st;
    if (!present)
        return lt_fail(LT_ERR_IO, "%s: tokenizer.json went away while converting", hf_dir);
    (void)lt_convert_join(path, sizeof(path), hf_dir, "tokenizer.json");
    json_t *tc = load_json(hf_dir, "tokenizer_config.json", &tc_present, &st);
    const char **tokens = NULL;
    int32_t *types = NULL;
    char **owned = NULL;
    int64_t n = cfg->n_vocab;
    if (st != LT_OK)
        goto out_free_json;
    json_t *model = json_object_get(tok, "model");
    json_t *vocab = json_object_get(model, "vocab");
    const char *mtype = type_of(model);
    if (!json_is_object(vocab) || (mtype && strcmp(mtype, "BPE"))) {
        st = lt_fail(LT_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", path,
                     mtype ? mtype : "?");
        goto out_free_json;
    }
    if (json_is_true(json_object_get(model, "byte_fallback"))) {
        st = lt_fail(LT_ERR_UNSUPPORTED,
                     "%s: a SentencePiece-style BPE (byte_fallback) is not supported, only "
                     "byte-level BPE",
                     path);
        goto out_free_json;
    }
    const char *pre = detect_pre(json_object_get(tok, "pre_tokenizer"));
    if (!pre) {
        char *dump = json_dumps(json_object_get(tok, "pre_tokenizer"), JSON_COMPACT);
        st = lt_fail(LT_ERR_UNSUPPORTED, "%s: pre_tokenizer not recognised: %.300s", path,
                     dump ? dump : "null");
        free(dump);
        goto out_free_json;
    }

    tokens = calloc((size_t)(n ? n : 1), sizeof(*tokens));
    types = calloc((size_t)(n ? n : 1), sizeof(*types));
    owned = calloc((size_t)(n ? n : 1), sizeof(*owned));
    if (!tokens || !types || !owned) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory for %lld tokens", (long long)n);
        goto out_free_tokens;
    }
    for (int64_t i = 0; i < n; i++)
        types[i] = TT_NORMAL;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= n) {
            st = lt_fail(LT_ERR_FORMAT, "%s: token '%s' has id %lld, outside the vocabulary of "
                                        "%lld (config.json vocab_size)",
                         path, key, json_is_integer(val) ? (long long)json_integer_value(val) : -1,
                         (long long)n);
            goto out_free_tokens;
        }
        tokens[json_integer_value(val)] = key;
    }
    json_t *added = json_object_get(tok, "added_tokens");
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!json_is_integer(id) || !content || json_integer_value(id) < 0 ||
            json_integer_value(id) >= n) {
            st = lt_fail(LT_ERR_FORMAT, "%s: added_tokens[%zu] has no valid id below %lld", path,
                         i, (long long)n);
            goto out_free_tokens;
        }
        int64_t t = (int64_t)json_integer_value(id);
        tokens[t] = content;
        if (json_is_true(json_object_get(a, "special")) || looks_special(content)) {
            types[t] = TT_CONTROL;
        } else {
            types[t] = TT_USER_DEFINED;
            if (!(owned[t] = replace_sp_marks(content))) {
                st = lt_fail(LT_ERR_NOMEM, "out of memory");
                goto out_free_tokens;
            }
            tokens[t] = owned[t];
        }
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i])
            continue;
        char pad[32];
        snprintf(pad, sizeof(pad), "[PAD%lld]", (long long)i);
        if (!(owned[i] = strdup(pad))) {
            st = lt_fail(LT_ERR_NOMEM, "out of memory");
            goto out_free_tokens;
        }
        tokens[i] = owned[i];
        types[i] = TT_UNUSED;
    }

    if (cfg->arch == LT_HF_ARCH_LLAMA && tc) {
        json_t *asp = json_object_get(tc, "add_prefix_space");
        if (json_is_boolean(asp) &&
            (st = lt_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix",
                                          json_is_true(asp))) != LT_OK)
            goto out_free_tokens;
    }
    if ((st = lt_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) != LT_OK ||
        (st = lt_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre)) != LT_OK ||
        (st = lt_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n)) !=
            LT_OK ||
        (st = lt_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LT_GGUF_TYPE_I32, types,
                                     (uint64_t)n)) != LT_OK ||
        (st = write_merges(w, json_object_get(model, "merges"), path)) != LT_OK ||
        (st = write_specials(w, hf_dir, tok, tc, n, log)) != LT_OK ||
        (st = write_chat_template(w, hf_dir, tc, log)) != LT_OK)
        goto out_free_tokens;
    /* llama.cpp: small granite-style vocabularies (SmolLM's included) do not add a BOS */
    if (cfg->arch == LT_HF_ARCH_LLAMA && n == 49152 &&
        (st = lt_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false)) != LT_OK)
        goto out_free_tokens;
    *n_tokens = n;
    lt_convert_logf(log, "tokenizer: %lld tokens, pre-tokenizer '%s'", (long long)n, pre);

out_free_tokens:
    for (int64_t i = 0; owned && i < n; i++)
        free(owned[i]);
    free(owned);
    free(types);
    free(tokens);
out_free_json:
    json_decref(tc);
    json_decref(tok);
    return st;
}

#else

static lt_status convert_tokenizer_json(struct lt_gguf_writer *w, const char *hf_dir,
                                        const struct lt_hf_config *cfg,
                                        const struct lt_convert_log *log, int64_t *n_tokens)
{
    (void)w;
    (void)cfg;
    (void)log;
    (void)n_tokens;
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: reading tokenizer.json needs jansson", hf_dir);
}

#endif

/* No tokenizer.json: what llama.cpp's converter writes for a model without a vocabulary
 * (TextModel._set_vocab_none, then add_vocab_size): tokenizer.ggml.model = "none" and
 * {arch}.vocab_size. llama.cpp's loader (llama_vocab::impl::load) then makes vocab_size
 * placeholder tokens, so token ids below it pass its batch check; without the key the file
 * does not load at all ("key not found in model: tokenizer.ggml.model"). */
static lt_status write_no_vocab(struct lt_gguf_writer *w, const char *hf_dir,
                                const struct lt_hf_config *cfg, const struct lt_convert_log *log)
{
    static const char *const ignored[] = {"tokenizer.model", "vocab.json"};
    char path[4096], key[128];
    for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
        if (lt_convert_join(path, sizeof(path), hf_dir, ignored[i]) == LT_OK &&
            lt_convert_is_file(path))
            lt_convert_logf(log,
                            "warning: %s: lathe reads only tokenizer.json, which is missing; the "
                            "GGUF gets no tokenizer",
                            path);
    if (cfg->n_vocab <= 0 || cfg->n_vocab > UINT32_MAX)
        return lt_fail(LT_ERR_FORMAT, "%s: config.json vocab_size %lld does not fit a u32", hf_dir,
                       (long long)cfg->n_vocab);
    snprintf(key, sizeof(key), "%s.vocab_size", lt_hf_arch_gguf_name(cfg->arch));
    lt_status st;
    if ((st = lt_gguf_writer_set_str(w, "tokenizer.ggml.model", "none")) != LT_OK ||
        (st = lt_gguf_writer_set_u32(w, key, (uint32_t)cfg->n_vocab)) != LT_OK)
        return st;
    lt_convert_logf(log, "tokenizer: none (no tokenizer.json); %s = %lld", key,
                    (long long)cfg->n_vocab);
    return LT_OK;
}

lt_status lt_convert_vocab(struct lt_gguf_writer *w, const char *hf_dir,
                           const struct lt_hf_config *cfg, const struct lt_convert_log *log,
                           int64_t *n_tokens)
{
    *n_tokens = 0;
    char path[4096];
    lt_status st = lt_convert_join(path, sizeof(path), hf_dir, "tokenizer.json");
    if (st != LT_OK)
        return st;
    if (!lt_convert_is_file(path))
        return write_no_vocab(w, hf_dir, cfg, log);
    return convert_tokenizer_json(w, hf_dir, cfg, log, n_tokens);
}
