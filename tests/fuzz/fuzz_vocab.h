/* fuzz_vocab.h: the small byte-level BPE vocabulary the tokenizer and chat fuzz targets
 * share, built in code (no file): 256 byte tokens (id = the byte value), merged tokens over
 * ASCII words, digits, whitespace and a few multi-byte characters, then special tokens.
 *
 * Every byte value has a token, so any input encodes and decodes back to itself. Token ids:
 * bytes 0..255, merges 256.., specials FUZZ_ID_SPECIAL0.. in the order of fuzz_specials
 * (CONTROL first, then USER_DEFINED). bos is <|endoftext|>, eos <|im_end|>; add_bos is off. */
#ifndef LATHE_FUZZ_VOCAB_H
#define LATHE_FUZZ_VOCAB_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "lathe/tokenizer.h"

/* Merges as raw byte strings (left, right), in rank order: é, 你 and the start of an
 * emoji among them, so byte-level tokens end inside characters. */
static const char *const fuzz_merge_raw[][2] = {
    {"a", "b"},   {"ab", "c"},          {" ", "a"},           {" ", " "},       {"1", "2"},
    {"12", "3"},  {"\xC3", "\xA9"},     {"\n", "\n"},         {"t", "h"},       {"th", "e"},
    {" ", "the"}, {"\xE4", "\xBD"},     {"\xE4\xBD", "\xA0"}, {"\xF0", "\x9F"}, {"'", "s"},
    {"  ", " "},  {" ", "ab"},          {"e", "r"},           {"h", "er"},      {"\t", "\t"},
    {"\r", "\n"}, {"\xF0\x9F", "\x98"}, {"c", "a"},           {" ", "\n"},      {"ca", "b"},
    {"u", "s"},   {"us", "er"},         {"\n", "<"},
};
#define FUZZ_N_MERGES (sizeof(fuzz_merge_raw) / sizeof(fuzz_merge_raw[0]))

/* "<s>" and "<s>x" test leftmost-longest matching; the last one, FUZZ_PAD_LEN bytes of
 * "<|pad===...|>" (filled in by fuzz_vocab_tokenizer), pads inputs past a size cheaply */
#define FUZZ_PAD_LEN 4096
static char fuzz_pad_text[FUZZ_PAD_LEN + 1];
static const char *const fuzz_specials[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>",
                                            "<think>",      "</think>",   "<s>",
                                            "<s>x",         fuzz_pad_text};
#define FUZZ_N_SPECIALS (sizeof(fuzz_specials) / sizeof(fuzz_specials[0]))
#define FUZZ_N_CONTROL 3
#define FUZZ_ID_SPECIAL0 (256 + (lt_token)FUZZ_N_MERGES)
#define FUZZ_ID_IM_START FUZZ_ID_SPECIAL0
#define FUZZ_ID_IM_END (FUZZ_ID_SPECIAL0 + 1)
#define FUZZ_ID_BOS (FUZZ_ID_SPECIAL0 + 2)
#define FUZZ_ID_PAD (FUZZ_ID_SPECIAL0 + (lt_token)FUZZ_N_SPECIALS - 1)
#define FUZZ_N_TOKENS (256 + FUZZ_N_MERGES + FUZZ_N_SPECIALS)

struct fuzz_vocab {
    char byte_text[256][4]; /* GPT-2's byte-level alphabet, UTF-8 */
    char merged_text[FUZZ_N_MERGES][32];
    char merge_line[FUZZ_N_MERGES][64];
    const char *tokens[FUZZ_N_TOKENS];
    int32_t types[FUZZ_N_TOKENS];
    const char *merges[FUZZ_N_MERGES];
};

/* Raw bytes to their byte-level text. */
static void fuzz_byte_level(const struct fuzz_vocab *v, const char *raw, char *dst, size_t cap)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
        size_t l = strlen(v->byte_text[*p]);
        if (n + l + 1 > cap)
            __builtin_trap();
        memcpy(dst + n, v->byte_text[*p], l);
        n += l;
    }
    dst[n] = '\0';
}

/* Fills v and builds a tokenizer over it with pre-tokenizer `pre`. */
static struct lt_tokenizer *fuzz_vocab_tokenizer(struct fuzz_vocab *v, enum lt_pretokenizer pre)
{
    memset(fuzz_pad_text, '=', FUZZ_PAD_LEN);
    memcpy(fuzz_pad_text, "<|pad", 5);
    memcpy(fuzz_pad_text + FUZZ_PAD_LEN - 2, "|>", 3);
    unsigned next = 256;
    for (unsigned b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = keep ? b : next++;
        char *s = v->byte_text[b];
        memset(s, 0, 4);
        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        v->tokens[b] = s;
        v->types[b] = LT_TOKEN_TYPE_NORMAL;
    }
    for (size_t m = 0; m < FUZZ_N_MERGES; m++) {
        char l[32], r[32], both[32];
        fuzz_byte_level(v, fuzz_merge_raw[m][0], l, sizeof(l));
        fuzz_byte_level(v, fuzz_merge_raw[m][1], r, sizeof(r));
        strcpy(both, fuzz_merge_raw[m][0]);
        strcat(both, fuzz_merge_raw[m][1]);
        fuzz_byte_level(v, both, v->merged_text[m], sizeof(v->merged_text[m]));
        strcpy(v->merge_line[m], l);
        strcat(v->merge_line[m], " ");
        strcat(v->merge_line[m], r);
        v->merges[m] = v->merge_line[m];
        v->tokens[256 + m] = v->merged_text[m];
        v->types[256 + m] = LT_TOKEN_TYPE_NORMAL;
    }
    for (size_t s = 0; s < FUZZ_N_SPECIALS; s++) {
        v->tokens[FUZZ_ID_SPECIAL0 + s] = fuzz_specials[s];
        v->types[FUZZ_ID_SPECIAL0 + s] =
            s < FUZZ_N_CONTROL ? LT_TOKEN_TYPE_CONTROL : LT_TOKEN_TYPE_USER_DEFINED;
    }
    struct lt_vocab_desc d = {.model = "gpt2",
                              .pre = lt_pretokenizer_name(pre),
                              .n_tokens = FUZZ_N_TOKENS,
                              .tokens = v->tokens,
                              .token_types = v->types,
                              .n_merges = FUZZ_N_MERGES,
                              .merges = v->merges,
                              .bos = FUZZ_ID_BOS,
                              .eos = FUZZ_ID_IM_END,
                              .eot = LT_TOKEN_NONE,
                              .eom = LT_TOKEN_NONE,
                              .pad = LT_TOKEN_NONE,
                              .unk = LT_TOKEN_NONE};
    struct lt_tokenizer *t = NULL;
    if (lt_tokenizer_init(&d, &t) != LT_OK || lt_tokenizer_missing_bytes(t, NULL) != 0)
        __builtin_trap();
    return t;
}

#endif
