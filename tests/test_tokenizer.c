/* test_tokenizer.c: byte-level BPE on a small hand-made vocabulary, checked against a plain
 * BPE loop written here; UTF-8 validity against a decoder written here; invalid bytes,
 * special tokens, missing byte tokens, vocabulary errors, decoding and the streaming
 * decoder's hold-back; loading from a GGUF file. (Real vocabularies are checked against
 * Hugging Face tokenizers in tests/py/test_tokenizer_cross.py.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lathe/gguf.h"
#include "lathe/tokenizer.h"

/* ---- the vocabulary: 256 byte tokens, merges over a, b, c and space, specials ---- */

static char byte_text[256][4];

static void make_byte_texts(void)
{
    /* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others
     * get 256, 257, ... in byte order */
    unsigned next = 256;
    for (unsigned b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = keep ? b : next++;
        char *s = byte_text[b];
        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
    }
}

/* merges in rank order: left, right */
static const char *const merge_pairs[][2] = {
    {"a", "b"},  {"b", "c"},  {"a", "a"}, {"Ġ", "a"},   {"ab", "c"}, {"c", "a"},
    {"aa", "a"}, {"Ġa", "b"}, {"c", "c"}, {"ab", "ab"}, {"bc", "a"}, {"Ġab", "c"},
    {"cc", "c"}, {"Ġ", "Ġ"},  {"Ġ", "c"}, {"abc", "a"}, {"1", "2"},  {"ca", "b"},
};
#define N_MERGES (sizeof(merge_pairs) / sizeof(merge_pairs[0]))

static const char *const specials[] = {"<|im_start|>", "<|im_end|>", "<think>", "<s>", "<s>x"};
#define N_SPECIALS (sizeof(specials) / sizeof(specials[0]))

struct test_vocab {
    const char *tokens[256 + N_MERGES + N_SPECIALS];
    int32_t types[256 + N_MERGES + N_SPECIALS];
    char merged[N_MERGES][16];
    char merge_text[N_MERGES][16];
    const char *merges[N_MERGES];
    size_t n_tokens;
};

static struct test_vocab V;

static void make_vocab(void)
{
    make_byte_texts();
    size_t n = 0;
    for (unsigned b = 0; b < 256; b++) {
        V.tokens[n] = byte_text[b];
        V.types[n++] = LT_TOKEN_TYPE_NORMAL;
    }
    for (size_t m = 0; m < N_MERGES; m++) {
        const char *l = merge_pairs[m][0], *r = merge_pairs[m][1];
        snprintf(V.merged[m], sizeof(V.merged[m]), "%s%s", l, r);
        snprintf(V.merge_text[m], sizeof(V.merge_text[m]), "%s %s", l, r);
        V.merges[m] = V.merge_text[m];
        V.tokens[n] = V.merged[m];
        V.types[n++] = LT_TOKEN_TYPE_NORMAL;
    }
    for (size_t s = 0; s < N_SPECIALS; s++) {
        V.tokens[n] = specials[s];
        V.types[n++] =
            strcmp(specials[s], "<think>") ? LT_TOKEN_TYPE_CONTROL : LT_TOKEN_TYPE_USER_DEFINED;
    }
    V.n_tokens = n;
}

static struct lt_vocab_desc desc(const char *pre)
{
    return (struct lt_vocab_desc){.model = "gpt2",
                                  .pre = pre,
                                  .n_tokens = V.n_tokens,
                                  .tokens = V.tokens,
                                  .token_types = V.types,
                                  .n_merges = N_MERGES,
                                  .merges = V.merges,
                                  .bos = LT_TOKEN_NONE,
                                  .eos = 256 + (lt_token)N_MERGES + 1,
                                  .eot = LT_TOKEN_NONE,
                                  .eom = LT_TOKEN_NONE,
                                  .pad = LT_TOKEN_NONE,
                                  .unk = LT_TOKEN_NONE};
}

static lt_token id_of(const char *text)
{
    for (size_t i = 0; i < V.n_tokens; i++)
        if (!strcmp(V.tokens[i], text))
            return (lt_token)i;
    return LT_TOKEN_NONE;
}

/* The reference: start from byte tokens, repeatedly merge the adjacent pair of lowest rank
 * (the leftmost on a tie) until no pair merges. */
static size_t ref_bpe(const unsigned char *s, size_t n, lt_token *out)
{
    size_t k = n;
    for (size_t i = 0; i < n; i++)
        out[i] = (lt_token)s[i];
    for (;;) {
        size_t best_rank = N_MERGES, at = 0;
        for (size_t i = 0; i + 1 < k; i++)
            for (size_t m = 0; m < N_MERGES; m++)
                if (m < best_rank && !strcmp(V.tokens[out[i]], merge_pairs[m][0]) &&
                    !strcmp(V.tokens[out[i + 1]], merge_pairs[m][1])) {
                    best_rank = m;
                    at = i;
                }
        if (best_rank == N_MERGES)
            return k;
        out[at] = (lt_token)(256 + best_rank);
        memmove(out + at + 1, out + at + 2, (k - at - 2) * sizeof(lt_token));
        k--;
    }
}

static bool same_ids(const struct lt_tokens *tk, const lt_token *want, size_t n)
{
    if (tk->n != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (tk->ids[i] != want[i])
            return false;
    return true;
}

static void test_bpe_against_reference(struct lt_tokenizer *t)
{
    /* a run of letters, optionally after one space, is one piece for the Qwen regexes */
    unsigned rng = 12345;
    int bad = 0;
    for (int trial = 0; trial < 3000; trial++) {
        unsigned char s[64];
        size_t n = 0;
        rng = rng * 1103515245u + 12345u;
        if ((rng >> 16) & 1)
            s[n++] = ' ';
        rng = rng * 1103515245u + 12345u;
        size_t len = 1 + (rng >> 16) % 40;
        for (size_t i = 0; i < len; i++) {
            rng = rng * 1103515245u + 12345u;
            s[n++] = (unsigned char)"abc"[(rng >> 16) % 3];
        }
        lt_token want[64];
        size_t nw = ref_bpe(s, n, want);
        struct lt_tokens tk = {0};
        CHECK(lt_tokenize(t, (const char *)s, n, 0, &tk) == LT_OK);
        if (!same_ids(&tk, want, nw) && bad++ < 3)
            CHECK(0, "BPE of '%.*s' differs from the reference", (int)n, s);
        lt_tokens_free(&tk);
    }
    CHECK(bad == 0, "%d of 3000 pieces differ from the reference BPE", bad);

    /* a long piece: the heap path against the reference (aaa... merges to aaa, aa) */
    unsigned char big[3001];
    for (int i = 0; i < 3001; i++)
        big[i] = 'a';
    lt_token *want = malloc(3001 * sizeof(lt_token));
    size_t nw = ref_bpe(big, 3001, want);
    struct lt_tokens tk = {0};
    CHECK(lt_tokenize(t, (const char *)big, 3001, 0, &tk) == LT_OK && same_ids(&tk, want, nw));
    lt_tokens_free(&tk);
    free(want);
}

static void test_pieces(struct lt_tokenizer *t)
{
    /* "ab c" -> "ab" + " c"; digits are single pieces for qwen2 ("12" never merges) */
    struct lt_tokens tk = {.want_offsets = true};
    CHECK(lt_tokenize(t, "ab c12", 6, 0, &tk) == LT_OK);
    lt_token want[] = {id_of("ab"), id_of("Ġc"), id_of("1"), id_of("2")};
    CHECK(same_ids(&tk, want, 4), "got %zu tokens", tk.n);
    size_t offs[] = {0, 2, 4, 5};
    for (size_t i = 0; i < 4 && i < tk.n; i++)
        CHECK(tk.offs[i] == offs[i], "offset %zu is %zu", i, tk.offs[i]);
    lt_tokens_free(&tk);
}

static void test_invalid_utf8(struct lt_tokenizer *t)
{
    /* each byte that starts no valid sequence is its own byte token; the valid runs around
     * it are tokenized on their own */
    const char s[] = "ab\xff"
                     "ab\xe2\x82"
                     "c\xed\xa0\x80"
                     "\xc3\xa9";
    struct lt_tokens tk = {.want_offsets = true};
    CHECK(lt_tokenize(t, s, sizeof(s) - 1, 0, &tk) == LT_OK);
    lt_token want[] = {id_of("ab"), 0xff, id_of("ab"), 0xe2, 0x82, id_of("c"),
                       0xed,        0xa0, 0x80,        0xc3, 0xa9};
    CHECK(same_ids(&tk, want, sizeof(want) / sizeof(want[0])), "got %zu tokens", tk.n);
    size_t offs[] = {0, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12};
    for (size_t i = 0; i < tk.n && i < 11; i++)
        CHECK(tk.offs[i] == offs[i], "offset %zu is %zu", i, tk.offs[i]);
    struct lt_strbuf b = {0};
    CHECK(lt_detokenize(t, tk.ids, tk.n, 0, &b) == LT_OK);
    CHECK(b.len == sizeof(s) - 1 && !memcmp(b.data, s, b.len));
    lt_strbuf_free(&b);
    lt_tokens_free(&tk);

    /* random bytes: decode(encode(x)) == x */
    unsigned rng = 7;
    for (int trial = 0; trial < 200; trial++) {
        unsigned char buf[300];
        size_t n = 1 + trial;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 1103515245u + 12345u;
            buf[i] = (unsigned char)(rng >> 16);
        }
        struct lt_tokens tk2 = {0};
        struct lt_strbuf out = {0};
        CHECK(lt_tokenize(t, (const char *)buf, n, LT_TOKENIZE_PARSE_SPECIAL, &tk2) == LT_OK);
        CHECK(lt_detokenize(t, tk2.ids, tk2.n, LT_DETOKENIZE_SPECIAL, &out) == LT_OK);
        CHECK(out.len == n && !memcmp(out.data, buf, n), "round trip of %zu random bytes", n);
        lt_strbuf_free(&out);
        lt_tokens_free(&tk2);
    }
}

/* The reference UTF-8 rule: decode the bits, then require the shortest form, no surrogate
 * and nothing past U+10FFFF. */
static size_t ref_utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n)
        return 0;
    unsigned long cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] >> 6) != 2)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const unsigned long min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        return 0;
    return len;
}

static void test_utf8_rule(void)
{
    unsigned char s[4];
    int bad = 0;
    for (unsigned a = 0; a < 256; a++)
        for (unsigned b = 0; b < 256; b++) {
            s[0] = (unsigned char)a;
            s[1] = (unsigned char)b;
            for (unsigned c = 0x70; c < 0xC8; c += 0x0F) { /* a spread of third bytes */
                s[2] = (unsigned char)c;
                s[3] = 0xBF - (unsigned char)(c & 0x3F);
                for (size_t n = 1; n <= 4; n++)
                    bad += lt_utf8_seq_len(s, n) != ref_utf8_len(s, n);
            }
        }
    CHECK(bad == 0, "%d byte strings where the UTF-8 rule disagrees with the reference", bad);
    CHECK(lt_utf8_seq_len((const unsigned char *)"\xf4\x8f\xbf\xbf", 4) == 4);
    CHECK(lt_utf8_seq_len((const unsigned char *)"\xf4\x90\x80\x80", 4) == 0);
    CHECK(lt_utf8_seq_len((const unsigned char *)"\xe0\x9f\xbf", 3) == 0);
}

static void test_specials(struct lt_tokenizer *t)
{
    const char *s = "a<|im_start|>b<s>x<s><think><|im_end";
    struct lt_tokens tk = {0};
    CHECK(lt_tokenize(t, s, strlen(s), LT_TOKENIZE_PARSE_SPECIAL, &tk) == LT_OK);
    /* leftmost-longest: "<s>x" beats "<s>"; an unfinished special is text */
    lt_token want[] = {id_of("a"),   id_of("<|im_start|>"),
                       id_of("b"),   id_of("<s>x"),
                       id_of("<s>"), id_of("<think>"),
                       '<',          '|',
                       'i',          'm',
                       '_',          'e',
                       'n',          'd'};
    CHECK(same_ids(&tk, want, sizeof(want) / sizeof(want[0])), "got %zu tokens", tk.n);
    struct lt_strbuf b = {0};
    CHECK(lt_detokenize(t, tk.ids, tk.n, LT_DETOKENIZE_SPECIAL, &b) == LT_OK);
    CHECK(b.len == strlen(s) && !strcmp(b.data, s));
    lt_strbuf_free(&b);
    /* without LT_DETOKENIZE_SPECIAL control tokens vanish, user-defined ones stay */
    CHECK(lt_detokenize(t, tk.ids, tk.n, 0, &b) == LT_OK);
    CHECK(!strcmp(b.data, "ab<think><|im_end"), "got '%s'", b.data);
    lt_strbuf_free(&b);
    lt_tokens_free(&tk);

    /* without PARSE_SPECIAL the same text is ordinary text */
    CHECK(lt_tokenize(t, s, strlen(s), 0, &tk) == LT_OK);
    bool any_special = false;
    for (size_t i = 0; i < tk.n; i++)
        any_special |= tk.ids[i] >= 256 + (lt_token)N_MERGES;
    CHECK(!any_special);
    CHECK(lt_detokenize(t, tk.ids, tk.n, 0, &b) == LT_OK && !strcmp(b.data, s));
    lt_strbuf_free(&b);
    lt_tokens_free(&tk);

    /* bos: an error when there is none, and a failed call leaves the list as it was */
    CHECK(lt_tokenize(t, "ab", 2, 0, &tk) == LT_OK && tk.n == 1);
    CHECK(lt_tokenize(t, "ab", 2, LT_TOKENIZE_ADD_BOS, &tk) == LT_ERR_INVALID && tk.n == 1);
    lt_tokens_free(&tk);
    CHECK(lt_tokenizer_is_eog(t, id_of("<|im_end|>")));
    CHECK(!lt_tokenizer_is_eog(t, id_of("<|im_start|>")));
}

/* Whether the last bytes of s[0..n) are a proper prefix of some valid UTF-8 sequence:
 * tried by extending them with continuation bytes (the reference for the stream). */
static bool ref_incomplete(const unsigned char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char t2[4];
        memcpy(t2, s + n - k, k);
        if (t2[0] >= 0x80 && t2[0] < 0xC0)
            continue;
        for (unsigned c1 = 0x80; c1 < 0xC0; c1++) {
            t2[k] = (unsigned char)c1;
            if (ref_utf8_len(t2, k + 1) == k + 1)
                return true;
            for (unsigned c2 = 0x80; k + 1 < 4 && c2 < 0xC0; c2 += 0x3F) {
                t2[k + 1] = (unsigned char)c2;
                if (ref_utf8_len(t2, k + 2) == k + 2)
                    return true;
                t2[k + 2] = 0x80;
                if (k + 2 < 4 && ref_utf8_len(t2, k + 3) == k + 3)
                    return true;
            }
        }
        return false;
    }
    return false;
}

/* The stream's promise after `consumed` input bytes of data[0..n) with `emitted` bytes out:
 * it never cuts a valid character of the whole input, and holds back only a tail that can
 * still complete. */
static bool stream_ok(const unsigned char *data, size_t n, size_t consumed, size_t emitted)
{
    for (size_t i = 0; i < n;) {
        size_t l = ref_utf8_len(data + i, n - i);
        if (l > 1 && i < emitted && emitted < i + l)
            return false; /* a character of the input was cut */
        i += l ? l : 1;
    }
    if (emitted > consumed || consumed - emitted > 3)
        return false;
    return consumed == emitted || ref_incomplete(data, consumed);
}

static void test_stream(struct lt_tokenizer *t)
{
    /* text whose tokens split multi-byte characters: each byte of é, 日, 😀 is its own token
     * here (no merges for them) */
    const char *s = "ab\xc3\xa9 c\xe6\x97\xa5\xf0\x9f\x98\x80\xe2\x82"
                    "a\xff\xf0\x9f";
    size_t n = strlen(s);
    struct lt_tokens tk = {.want_offsets = true};
    CHECK(lt_tokenize(t, s, n, 0, &tk) == LT_OK);
    struct lt_decode_stream ds;
    lt_decode_stream_init(&ds, t, 0);
    struct lt_strbuf out = {0};
    int bad = 0;
    for (size_t i = 0; i < tk.n; i++) {
        CHECK(lt_decode_stream_push(&ds, tk.ids[i], &out) == LT_OK);
        size_t consumed = i + 1 < tk.n ? tk.offs[i + 1] : n;
        bad += !stream_ok((const unsigned char *)s, n, consumed, out.len);
    }
    CHECK(bad == 0, "%d times the stream emitted or held the wrong bytes", bad);
    CHECK(ds.n_held == 2, "the trailing \\xf0\\x9f is held back (%zu held)", ds.n_held);
    CHECK(lt_decode_stream_flush(&ds, &out) == LT_OK);
    CHECK(out.len == n && !memcmp(out.data, s, out.len));
    lt_strbuf_free(&out);
    lt_tokens_free(&tk);

    /* random bytes in random chunks: the same bytes come out, never mid-character */
    unsigned rng = 99;
    for (int trial = 0; trial < 300; trial++) {
        unsigned char buf[64];
        size_t len = 1 + trial % 64;
        for (size_t i = 0; i < len; i++) {
            rng = rng * 1103515245u + 12345u;
            unsigned r = rng >> 16;
            buf[i] = (unsigned char)(r % 4 == 0   ? 0x80 + r % 64
                                     : r % 4 == 1 ? 0xC2 + r % 51
                                     : r % 4 == 2 ? 'a' + r % 3
                                                  : r);
        }
        lt_decode_stream_init(&ds, t, 0);
        for (size_t i = 0; i < len;) {
            rng = rng * 1103515245u + 12345u;
            size_t c = 1 + (rng >> 16) % 4;
            if (c > len - i)
                c = len - i;
            CHECK(lt_decode_stream_push_bytes(&ds, (const char *)buf + i, c, &out) == LT_OK);
            i += c;
            bad += !stream_ok(buf, len, i, out.len);
        }
        CHECK(lt_decode_stream_flush(&ds, &out) == LT_OK);
        CHECK(out.len == len && !memcmp(out.data, buf, len), "stream of %zu random bytes", len);
        lt_strbuf_free(&out);
    }
    CHECK(bad == 0, "%d times the stream emitted or held the wrong bytes", bad);
}

static void test_errors(void)
{
    struct lt_tokenizer *t = (struct lt_tokenizer *)1;
    struct lt_vocab_desc d = desc("qwen2");
    d.pre = "llama3";
    CHECK(lt_tokenizer_init(&d, &t) == LT_ERR_UNSUPPORTED && t == NULL);
    CHECK(strstr(lt_last_error(), "llama3") != NULL);
    d = desc("qwen2");
    d.model = "llama";
    CHECK(lt_tokenizer_init(&d, &t) == LT_ERR_UNSUPPORTED);
    d = desc("qwen2");
    const char *bad_merges[] = {"a b", "x y"};
    d.merges = bad_merges;
    d.n_merges = 2;
    CHECK(lt_tokenizer_init(&d, &t) == LT_ERR_FORMAT);
    CHECK(strstr(lt_last_error(), "merge 1") != NULL, "%s", lt_last_error());
    d = desc("qwen2");
    const char *no_space[] = {"ab"};
    d.merges = no_space;
    d.n_merges = 1;
    CHECK(lt_tokenizer_init(&d, &t) == LT_ERR_FORMAT);
    d = desc("qwen2");
    d.eos = 100000;
    CHECK(lt_tokenizer_init(&d, &t) == LT_ERR_FORMAT);

    /* a vocabulary without the token for byte 'z' (index 'z' in the byte tokens) */
    d = desc("qwen2");
    const char *tokens[sizeof(V.tokens) / sizeof(V.tokens[0])];
    memcpy(tokens, V.tokens, sizeof(tokens));
    tokens['z'] = "<unk>";
    d.tokens = tokens;
    CHECK(lt_tokenizer_init(&d, &t) == LT_OK);
    uint8_t missing[256];
    CHECK(lt_tokenizer_missing_bytes(t, missing) == 1 && missing[0] == 'z');
    struct lt_tokens tk = {0};
    CHECK(lt_tokenize(t, "abz", 3, 0, &tk) == LT_ERR_INVALID && tk.n == 0);
    CHECK(strstr(lt_last_error(), "0x7a") != NULL, "%s", lt_last_error());
    lt_tokenizer_free(t);
    d.unk = 'z';
    d.token_types = NULL;
    CHECK(lt_tokenizer_init(&d, &t) == LT_OK);
    CHECK(lt_tokenize(t, "abz", 3, 0, &tk) == LT_OK && tk.n == 2 && tk.ids[1] == 'z');
    lt_tokens_free(&tk);
    lt_tokenizer_free(t);

    struct lt_strbuf b = {0};
    d = desc("qwen2");
    CHECK(lt_tokenizer_init(&d, &t) == LT_OK);
    lt_token ids[] = {1, -1};
    CHECK(lt_detokenize(t, ids, 2, 0, &b) == LT_ERR_INVALID && b.len == 0);
    lt_strbuf_free(&b);
    lt_tokenizer_free(t);
}

static void test_gguf(const struct lt_tokenizer *ref)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/test_tokenizer.gguf", dir ? dir : ".");
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    CHECK(w != NULL);
    if (!w)
        return;
    CHECK(lt_gguf_writer_set_str(w, "general.architecture", "qwen2") == LT_OK);
    CHECK(lt_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == LT_OK);
    CHECK(lt_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2") == LT_OK);
    CHECK(lt_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", V.tokens, V.n_tokens) == LT_OK);
    CHECK(lt_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", LT_GGUF_TYPE_I32, V.types,
                                 V.n_tokens) == LT_OK);
    CHECK(lt_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", V.merges, N_MERGES) == LT_OK);
    CHECK(lt_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)id_of("<|im_end|>")) ==
          LT_OK);
    CHECK(lt_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)id_of("<s>")) ==
          LT_OK);
    CHECK(lt_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true) == LT_OK);
    CHECK(lt_gguf_writer_write(w, path) == LT_OK, "%s", lt_last_error());
    lt_gguf_writer_free(w);

    struct lt_gguf *g;
    if (lt_gguf_open(path, &g) != LT_OK) {
        CHECK(0, "opening %s: %s", path, lt_last_error());
        return;
    }
    struct lt_tokenizer *t;
    CHECK(lt_tokenizer_from_gguf(g, &t) == LT_OK, "%s", lt_last_error());
    if (t) {
        CHECK(lt_tokenizer_n_tokens(t) == V.n_tokens);
        CHECK(lt_tokenizer_eos(t) == id_of("<|im_end|>") && lt_tokenizer_bos(t) == id_of("<s>"));
        CHECK(lt_tokenizer_add_bos(t) && lt_tokenizer_pad(t) == LT_TOKEN_NONE);
        CHECK(lt_tokenizer_token_type(t, id_of("<think>")) == LT_TOKEN_TYPE_USER_DEFINED);
        const char *s = "<s>abcab cab\xf0\x9f\x98\x80 12";
        struct lt_tokens a = {0}, b = {0};
        CHECK(lt_tokenize(t, s, strlen(s), LT_TOKENIZE_ADD_BOS | LT_TOKENIZE_PARSE_SPECIAL, &a) ==
              LT_OK);
        CHECK(lt_tokenize(ref, s, strlen(s), LT_TOKENIZE_PARSE_SPECIAL, &b) == LT_OK);
        CHECK(a.n == b.n + 1 && a.ids[0] == id_of("<s>") &&
              !memcmp(a.ids + 1, b.ids, b.n * sizeof(lt_token)));
        lt_tokens_free(&a);
        lt_tokens_free(&b);
        lt_tokenizer_free(t);
    }
    /* no chat template in this file: a clear error */
    struct lt_chat_template ct;
    CHECK(lt_chat_template_from_gguf(g, &ct) == LT_ERR_UNSUPPORTED);
    CHECK(strstr(lt_last_error(), "no tokenizer.chat_template") != NULL, "%s", lt_last_error());
    lt_gguf_close(g);
    remove(path);
}

int main(void)
{
    make_vocab();
    struct lt_tokenizer *t = NULL;
    struct lt_vocab_desc d = desc("qwen2");
    lt_status st = lt_tokenizer_init(&d, &t);
    if (st == LT_ERR_UNSUPPORTED && strstr(lt_last_error(), "PCRE2")) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (!t)
        return check_summary();
    CHECK(lt_tokenizer_missing_bytes(t, NULL) == 0);
    test_utf8_rule();
    test_bpe_against_reference(t);
    test_pieces(t);
    test_invalid_utf8(t);
    test_specials(t);
    test_stream(t);
    test_errors();
    test_gguf(t);
    lt_tokenizer_free(t);
    return check_summary();
}
