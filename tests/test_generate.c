/* test_generate.c: the streaming logic of lt_gen_seq (generate.h) over a small made-up
 * byte-level vocabulary and a fake logits source (one-hot rows under greedy sampling):
 * stop strings across pieces, partial UTF-8 held back, max tokens, the context bound,
 * end-of-generation tokens, the errors, prompts (bos, chat template), and a randomized
 * comparison against a plain reference of what may be shown after every token. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "lathe/generate.h"

/* ---- the vocabulary: ids 0..255 are the bytes, then specials, then a few words ---- */

enum {
    TOK_EOT = 256,   /* <|endoftext|> (eos) */
    TOK_IM_END,      /* <|im_end|> */
    TOK_IM_START,    /* <|im_start|> */
    TOK_BOS,         /* <s> */
    TOK_HEL,         /* "Hel" */
    TOK_LO,          /* "lo" */
    TOK_WOR,         /* " wor" */
    TOK_LD,          /* "ld" */
    TOK_E_ACUTE,     /* "é" */
    TOK_EMOJI_HEAD,  /* "a" + first two bytes of 😀 */
    TOK_EMOJI_TAIL,  /* last two bytes of 😀 + "b" */
    TOK_CJK_HEAD,    /* first byte of 中 */
    TOK_CJK_TAIL,    /* last two bytes of 中 */
    TOK_STOP_WORD,   /* "###" */
    N_TOKENS
};

static const char *const word_bytes[] = {
    [TOK_HEL - TOK_HEL] = "Hel",
    [TOK_LO - TOK_HEL] = "lo",
    [TOK_WOR - TOK_HEL] = " wor",
    [TOK_LD - TOK_HEL] = "ld",
    [TOK_E_ACUTE - TOK_HEL] = "\xC3\xA9",
    [TOK_EMOJI_HEAD - TOK_HEL] = "a\xF0\x9F",
    [TOK_EMOJI_TAIL - TOK_HEL] = "\x98\x80" "b",
    [TOK_CJK_HEAD - TOK_HEL] = "\xE4",
    [TOK_CJK_TAIL - TOK_HEL] = "\xB8\xAD",
    [TOK_STOP_WORD - TOK_HEL] = "###",
};

/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the others for
 * code points from 256 up, in byte order. */
static uint32_t byte_char(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174))
            n++;
    return 256 + n;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* the alphabet stays below 0x800 */
}

static char token_text[N_TOKENS][64];
static const char *token_ptrs[N_TOKENS];
static int32_t token_types[N_TOKENS];

static void byte_text(const char *bytes, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += put_utf8(out + k, byte_char((unsigned char)bytes[i]));
    out[k] = 0;
}

/* The bytes token id stands for, by construction (the reference for decoding). */
static const char *ref_bytes(int id, size_t *len)
{
    static char one[256][1];
    if (id < 256) {
        one[id][0] = (char)id;
        *len = 1;
        return one[id];
    }
    if (id >= TOK_HEL) {
        *len = strlen(word_bytes[id - TOK_HEL]);
        return word_bytes[id - TOK_HEL];
    }
    *len = 0; /* control tokens show nothing */
    return "";
}

static struct lt_tokenizer *make_tokenizer(bool add_bos)
{
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        byte_text(&c, 1, token_text[b]);
        token_types[b] = LT_TOKEN_TYPE_NORMAL;
    }
    strcpy(token_text[TOK_EOT], "<|endoftext|>");
    strcpy(token_text[TOK_IM_END], "<|im_end|>");
    strcpy(token_text[TOK_IM_START], "<|im_start|>");
    strcpy(token_text[TOK_BOS], "<s>");
    for (int id = TOK_EOT; id <= TOK_BOS; id++)
        token_types[id] = LT_TOKEN_TYPE_CONTROL;
    for (int id = TOK_HEL; id < N_TOKENS; id++) {
        const char *w = word_bytes[id - TOK_HEL];
        byte_text(w, strlen(w), token_text[id]);
        token_types[id] = LT_TOKEN_TYPE_NORMAL;
    }
    for (int i = 0; i < N_TOKENS; i++)
        token_ptrs[i] = token_text[i];
    struct lt_vocab_desc d = {.model = "gpt2", .pre = "smollm", .n_tokens = N_TOKENS,
                              .tokens = token_ptrs, .token_types = token_types,
                              .bos = TOK_BOS, .eos = TOK_EOT, .eot = LT_TOKEN_NONE,
                              .eom = LT_TOKEN_NONE, .pad = LT_TOKEN_NONE, .unk = LT_TOKEN_NONE,
                              .add_bos = add_bos};
    struct lt_tokenizer *t = NULL;
    lt_status st = lt_tokenizer_init(&d, &t);
    CHECK(st == LT_OK, "%s", lt_last_error());
    return t;
}

/* ---- a fake logits source: a one-hot row for each scripted token ---- */

static void one_hot(float *logits, size_t n, int id)
{
    for (size_t i = 0; i < n; i++)
        logits[i] = -5.0f + 0.001f * (float)(i % 7);
    logits[id] = 10.0f;
}

struct trace {
    char shown[4096]; /* the pieces, concatenated */
    size_t len;
    size_t n_pieces;
    size_t piece_len[256];
};

/* Feeds the script through step() until the sequence finishes or the script ends. */
static lt_status feed(struct lt_gen_seq *g, const int *script, size_t n, struct trace *tr)
{
    float logits[N_TOKENS];
    memset(tr, 0, sizeof(*tr));
    for (size_t i = 0; i < n && !lt_gen_seq_done(g); i++) {
        one_hot(logits, N_TOKENS, script[i]);
        lt_status st = lt_gen_seq_step(g, logits, N_TOKENS);
        if (st != LT_OK)
            return st;
        size_t len;
        const char *p = lt_gen_seq_piece(g, &len);
        memcpy(tr->shown + tr->len, p, len);
        tr->len += len;
        tr->piece_len[tr->n_pieces++] = len;
    }
    return LT_OK;
}

static struct lt_gen_params greedy(int max_tokens, const char *const *stops, size_t n_stops)
{
    struct lt_gen_params p = lt_gen_default_params();
    p.sampler.temperature = 0;
    p.max_tokens = max_tokens;
    p.stops = stops;
    p.n_stops = n_stops;
    return p;
}

static const lt_token prompt1[] = {'H', 'i'};

static void test_stop_across_pieces(struct lt_tokenizer *t)
{
    const char *stops[] = {"lo w"};
    struct lt_gen_params p = greedy(0, stops, 1);
    struct lt_gen_seq g;
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
    const int script[] = {TOK_HEL, TOK_LO, TOK_WOR, TOK_LD};
    struct trace tr;
    CHECK(feed(&g, script, 4, &tr) == LT_OK);
    /* "Hel": "l" may start "lo w", so "He"; "Hello": "lo" held, "l" shown; " wor" completes
     * the stop string at 3: nothing more; "ld" is never sampled */
    CHECK(tr.n_pieces == 3 && tr.piece_len[0] == 2 && tr.piece_len[1] == 1 && tr.piece_len[2] == 0,
          "%zu pieces", tr.n_pieces);
    CHECK(tr.len == 3 && !memcmp(tr.shown, "Hel", 3));
    CHECK(g.finish == LT_GEN_FINISH_STOP && g.stop_which == 0);
    CHECK(!strcmp(lt_gen_finish_reason(g.finish), "stop"));
    CHECK(g.text.len == 3 && !strcmp(g.text.data, "Hel"));
    CHECK(lt_gen_seq_stats(&g).n_generated == 3 && lt_gen_seq_stats(&g).n_prompt == 2);
    CHECK(g.pending == LT_TOKEN_NONE);
    /* stepping a finished sequence is an error, not a crash */
    float logits[N_TOKENS];
    one_hot(logits, N_TOKENS, 'x');
    CHECK(lt_gen_seq_step(&g, logits, N_TOKENS) == LT_ERR_INVALID);

    /* the same stop string inside one token, and two stop strings: the earliest wins */
    const char *stops2[] = {"world", "o w"};
    p = greedy(0, stops2, 2);
    lt_gen_seq_free(&g);
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
    CHECK(feed(&g, script, 4, &tr) == LT_OK);
    CHECK(tr.len == 4 && !memcmp(tr.shown, "Hell", 4) && g.finish == LT_GEN_FINISH_STOP &&
          g.stop_which == 1);
    lt_gen_seq_free(&g);
}

static void test_partial_utf8(struct lt_tokenizer *t)
{
    struct lt_gen_params p = greedy(0, NULL, 0);
    struct lt_gen_seq g;
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
    const int script[] = {TOK_EMOJI_HEAD, TOK_EMOJI_TAIL, TOK_CJK_HEAD, TOK_CJK_TAIL, TOK_EOT};
    struct trace tr;
    CHECK(feed(&g, script, 5, &tr) == LT_OK);
    CHECK(tr.n_pieces == 5);
    CHECK(tr.piece_len[0] == 1 && tr.shown[0] == 'a', "emoji head: %zu", tr.piece_len[0]);
    CHECK(tr.piece_len[1] == 5 && !memcmp(tr.shown + 1, "\xF0\x9F\x98\x80" "b", 5));
    CHECK(tr.piece_len[2] == 0 && tr.piece_len[3] == 3 && tr.piece_len[4] == 0);
    CHECK(g.finish == LT_GEN_FINISH_EOG && lt_gen_seq_stats(&g).n_generated == 5);

    /* an end-of-generation token after half a character flushes the half: no byte is lost */
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
    const int script2[] = {TOK_EMOJI_HEAD, TOK_IM_END, 'z'};
    CHECK(feed(&g, script2, 3, &tr) == LT_OK);
    CHECK(tr.n_pieces == 2 && tr.piece_len[0] == 1 && tr.piece_len[1] == 2 &&
          !memcmp(tr.shown, "a\xF0\x9F", 3));
    CHECK(g.finish == LT_GEN_FINISH_EOG && g.last == TOK_IM_END);
    lt_gen_seq_free(&g);
}

static void test_limits(struct lt_tokenizer *t)
{
    const char *stops[] = {"Help"};
    struct lt_gen_params p = greedy(2, stops, 1);
    struct lt_gen_seq g;
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
    /* "Hel" is held (it may start "Help"); the second token is the last: all is shown */
    const int script[] = {'x', TOK_HEL, 'p'};
    struct trace tr;
    CHECK(feed(&g, script, 3, &tr) == LT_OK);
    CHECK(tr.n_pieces == 2 && tr.piece_len[0] == 1 && tr.piece_len[1] == 3 &&
          !memcmp(tr.shown, "xHel", 4));
    CHECK(g.finish == LT_GEN_FINISH_LENGTH && !strcmp(lt_gen_finish_reason(g.finish), "length"));
    CHECK(lt_gen_seq_stats(&g).n_generated == 2);

    /* the context bound, tighter than max_tokens */
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, 1) == LT_OK);
    CHECK(feed(&g, script, 3, &tr) == LT_OK);
    CHECK(tr.len == 1 && g.finish == LT_GEN_FINISH_CONTEXT && lt_gen_seq_stats(&g).n_generated == 1);
    /* no room at all, an empty prompt, a prompt token outside the vocabulary */
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, 0) == LT_ERR_INVALID);
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 0, 10) == LT_ERR_INVALID);
    const lt_token bad[] = {N_TOKENS};
    CHECK(lt_gen_seq_set_prompt(&g, bad, 1, 10) == LT_ERR_INVALID);
    lt_gen_seq_free(&g);

    /* max_tokens 0: only the context bounds it; ignore_eog runs through eog tokens */
    p = greedy(0, NULL, 0);
    p.ignore_eog = true;
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, 4) == LT_OK);
    const int script2[] = {'a', TOK_EOT, 'b', TOK_IM_END, 'c'};
    CHECK(feed(&g, script2, 5, &tr) == LT_OK);
    CHECK(tr.len == 2 && !memcmp(tr.shown, "ab", 2) && g.finish == LT_GEN_FINISH_CONTEXT &&
          lt_gen_seq_stats(&g).n_generated == 4);
    lt_gen_seq_free(&g);
}

static void test_errors(struct lt_tokenizer *t)
{
    struct lt_gen_params p = greedy(0, NULL, 0);
    struct lt_gen_seq g;
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
    float logits[N_TOKENS + 8];
    one_hot(logits, N_TOKENS, 'a');
    CHECK(lt_gen_seq_step(&g, logits, N_TOKENS) == LT_ERR_INVALID); /* no prompt yet */
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
    CHECK(lt_gen_seq_accept(&g, N_TOKENS) == LT_ERR_INVALID);
    CHECK(lt_gen_seq_accept(&g, -3) == LT_ERR_INVALID);
    logits[5] = NAN;
    CHECK(lt_gen_seq_step(&g, logits, N_TOKENS) != LT_OK);
    CHECK(!lt_gen_seq_done(&g) && lt_gen_seq_stats(&g).n_generated == 0);
    /* a model's row padded past the vocabulary: the padding is never drawn */
    one_hot(logits, N_TOKENS + 8, N_TOKENS + 3);
    logits['q'] = 9.0f;
    CHECK(lt_gen_seq_step(&g, logits, N_TOKENS + 8) == LT_OK && g.last == 'q');
    lt_gen_seq_free(&g);

    const char *stops[] = {"ok", NULL};
    p = greedy(0, stops, 2);
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_ERR_INVALID);
    p.sampler.top_p = -1;
    p.n_stops = 1;
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_ERR_INVALID);
    /* stop strings are copied: the caller's may go away */
    char mine[8] = "lo";
    const char *stops2[] = {mine};
    p = greedy(0, stops2, 1);
    CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
    strcpy(mine, "zz");
    CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
    const int script[] = {TOK_HEL, TOK_LO};
    struct trace tr;
    CHECK(feed(&g, script, 2, &tr) == LT_OK && g.finish == LT_GEN_FINISH_STOP && tr.len == 3);
    lt_gen_seq_free(&g);
}

/* With temperature > 0, a fixed seed gives the same tokens each time set_prompt restarts. */
static void test_seeded(struct lt_tokenizer *t)
{
    struct lt_gen_params p = lt_gen_default_params();
    p.sampler.temperature = 1.0f;
    p.sampler.seed = 1234;
    p.max_tokens = 32;
    p.ignore_eog = true;
    float logits[N_TOKENS];
    for (int i = 0; i < N_TOKENS; i++)
        logits[i] = (float)((i * 37) % 11) * 0.3f;
    lt_token runs[3][32];
    for (int r = 0; r < 3; r++) {
        if (r == 2)
            p.sampler.seed = 99;
        struct lt_gen_seq g;
        CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
        for (int again = 0; again < 2; again++) {
            CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, SIZE_MAX) == LT_OK);
            for (int k = 0; k < 32 && !lt_gen_seq_done(&g); k++)
                CHECK(lt_gen_seq_step(&g, logits, N_TOKENS) == LT_OK);
            CHECK(g.n_history == 34);
            if (again)
                CHECK(!memcmp(runs[r], g.history + 2, sizeof(runs[r])), "restart differs");
            memcpy(runs[r], g.history + 2, sizeof(runs[r]));
        }
        lt_gen_seq_free(&g);
    }
    CHECK(!memcmp(runs[0], runs[1], sizeof(runs[0])));
    CHECK(memcmp(runs[0], runs[2], sizeof(runs[0])) != 0);
}

static void test_prompts(void)
{
    struct lt_tokenizer *t = make_tokenizer(true);
    if (!t)
        return;
    struct lt_tokens tk = {0};
    CHECK(lt_gen_prompt_text(t, "", false, &tk) == LT_ERR_INVALID);
    CHECK(lt_gen_prompt_text(t, "ab", false, &tk) == LT_OK);
    CHECK(tk.n == 3 && tk.ids[0] == TOK_BOS && tk.ids[1] == 'a' && tk.ids[2] == 'b');
    CHECK(lt_gen_prompt_text(t, "x", false, &tk) == LT_ERR_INVALID); /* not empty */
    lt_tokens_free(&tk);
    /* special tokens' text: ordinary text unless asked; a bos the text starts with is not
     * doubled */
    CHECK(lt_gen_prompt_text(t, "<s>a", false, &tk) == LT_OK);
    CHECK(tk.n == 5 && tk.ids[0] == TOK_BOS && tk.ids[1] == '<');
    lt_tokens_free(&tk);
    CHECK(lt_gen_prompt_text(t, "<s>a", true, &tk) == LT_OK);
    CHECK(tk.n == 2 && tk.ids[0] == TOK_BOS && tk.ids[1] == 'a');
    lt_tokens_free(&tk);

    /* ChatML: the reference is the template written out by hand, token by token */
    struct lt_chat_template ct = {.kind = LT_CHAT_CHATML};
    struct lt_chat_message msgs[] = {{.role = "user", .content = "Hi"}};
    CHECK(lt_gen_prompt_chat(t, &ct, msgs, 1, false, &tk) == LT_OK);
    lt_token want[64];
    size_t n = 0;
    want[n++] = TOK_BOS;
    want[n++] = TOK_IM_START;
    for (const char *s = "user\nHi"; *s; s++)
        want[n++] = (unsigned char)*s;
    want[n++] = TOK_IM_END;
    want[n++] = '\n';
    want[n++] = TOK_IM_START;
    for (const char *s = "assistant\n"; *s; s++)
        want[n++] = (unsigned char)*s;
    CHECK(tk.n == n && !memcmp(tk.ids, want, n * sizeof(lt_token)), "%zu tokens, want %zu", tk.n, n);
    lt_tokens_free(&tk);
    lt_tokenizer_free(t);
}

/* ---- randomized: every step against a plain reference of what may be shown ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* Length of raw minus a UTF-8 sequence that starts but does not finish at its end (the
 * scripts below only ever make valid UTF-8 once complete). */
static size_t complete_len(const char *raw, size_t len)
{
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = (unsigned char)raw[len - back];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? len - back : len;
    }
    return len;
}

/* The earliest start of a complete stop string in s[0..len), or len when none. */
static size_t ref_find_stop(const char *s, size_t len, const char *const *stops, size_t n)
{
    for (size_t p = 0; p < len; p++)
        for (size_t k = 0; k < n; k++) {
            size_t sl = strlen(stops[k]);
            if (sl <= len - p && !memcmp(s + p, stops[k], sl))
                return p;
        }
    return len;
}

/* s[0..len) less its longest tail that is a proper prefix of a stop string. */
static size_t ref_safe_len(const char *s, size_t len, const char *const *stops, size_t n)
{
    for (size_t p = 0; p < len; p++)
        for (size_t k = 0; k < n; k++) {
            size_t sl = strlen(stops[k]);
            if (len - p < sl && !memcmp(s + p, stops[k], len - p))
                return p;
        }
    return len;
}

static void test_random(struct lt_tokenizer *t)
{
    static const char *const stop_pool[] = {"lo w", "###", "\xC3\xA9" "a", "a\xF0\x9F\x98\x80",
                                            "Hello", "\n\n", "ld ld", "\xE4\xB8\xAD!"};
    static const int pool[] = {TOK_HEL, TOK_LO, TOK_WOR, TOK_LD, TOK_E_ACUTE, TOK_EMOJI_HEAD,
                               TOK_EMOJI_TAIL, TOK_CJK_HEAD, TOK_CJK_TAIL, TOK_STOP_WORD,
                               'a', ' ', '\n', '!', '#', 'l', 'H'};
    int failures = 0;
    for (int trial = 0; trial < 3000 && failures < 5; trial++) {
        const char *stops[3];
        size_t n_stops = rnd(4);
        for (size_t k = 0; k < n_stops; k++)
            stops[k] = stop_pool[rnd(sizeof(stop_pool) / sizeof(stop_pool[0]))];
        int max_tokens = (int)rnd(40);
        size_t room = rnd(3) ? SIZE_MAX : 1 + rnd(30);
        /* a script that keeps UTF-8 valid: the head of a split character is followed by
         * its tail */
        int script[64];
        size_t n = 0;
        while (n < 60) {
            int id = pool[rnd(sizeof(pool) / sizeof(pool[0]))];
            if (id == TOK_EMOJI_TAIL || id == TOK_CJK_TAIL)
                continue;
            script[n++] = id;
            if (id == TOK_EMOJI_HEAD || id == TOK_CJK_HEAD)
                script[n++] = id + 1;
            if (!rnd(25))
                script[n++] = rnd(2) ? TOK_EOT : TOK_IM_END;
        }
        struct lt_gen_params p = greedy(max_tokens, stops, n_stops);
        struct lt_gen_seq g;
        CHECK(lt_gen_seq_init(&g, t, &p) == LT_OK);
        CHECK(lt_gen_seq_set_prompt(&g, prompt1, 2, room) == LT_OK);
        size_t limit = max_tokens > 0 && (size_t)max_tokens < room ? (size_t)max_tokens : room;

        char raw[1024], shown[1024];
        size_t raw_len = 0, shown_len = 0, k = 0;
        bool ok = true;
        enum lt_gen_finish want = LT_GEN_RUNNING;
        size_t want_final = 0;
        float logits[N_TOKENS];
        for (k = 0; k < n && want == LT_GEN_RUNNING && ok; k++) {
            one_hot(logits, N_TOKENS, script[k]);
            ok = lt_gen_seq_step(&g, logits, N_TOKENS) == LT_OK;
            size_t len;
            const char *piece = lt_gen_seq_piece(&g, &len);
            memcpy(shown + shown_len, piece, len);
            shown_len += len;
            /* the reference */
            bool eog = script[k] == TOK_EOT || script[k] == TOK_IM_END;
            if (!eog) {
                size_t bl;
                const char *b = ref_bytes(script[k], &bl);
                memcpy(raw + raw_len, b, bl);
                raw_len += bl;
            }
            size_t text_len = complete_len(raw, raw_len);
            size_t stop_at = ref_find_stop(raw, text_len, stops, n_stops);
            if (stop_at < text_len) {
                want = LT_GEN_FINISH_STOP;
                want_final = stop_at;
            } else if (eog || k + 1 >= limit) {
                want = eog ? LT_GEN_FINISH_EOG
                           : limit == room ? LT_GEN_FINISH_CONTEXT : LT_GEN_FINISH_LENGTH;
                stop_at = ref_find_stop(raw, raw_len, stops, n_stops);
                if (stop_at < raw_len)
                    want = LT_GEN_FINISH_STOP;
                want_final = stop_at;
            }
            size_t want_shown = want != LT_GEN_RUNNING
                                    ? want_final
                                    : ref_safe_len(raw, text_len, stops, n_stops);
            ok = ok && g.finish == want && shown_len == want_shown &&
                 !memcmp(shown, raw, shown_len);
        }
        ok = ok && lt_gen_seq_stats(&g).n_generated == k && g.text.len == shown_len &&
             !memcmp(g.text.data, shown, shown_len);
        if (!ok) {
            failures++;
            fprintf(stderr, "trial %d: token %zu, finish %s (want %s), shown %zu bytes\n",
                    trial, k, lt_gen_finish_name(g.finish), lt_gen_finish_name(want), shown_len);
        }
        CHECK(ok);
        lt_gen_seq_free(&g);
    }
}

/* lt_gen_logprobs against a plain log-softmax: the chosen token's value whether or not it is
 * in the top, the top sorted with ties by id, -inf logits, k bounds and the errors. */
static void test_logprobs(void)
{
    enum { V = 300 };
    float logits[V];
    for (int i = 0; i < V; i++)
        logits[i] = (float)((i * 37) % 101) * 0.05f - 2.0f; /* repeats: ties */
    logits[7] = -INFINITY;
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - max);
    double lse = max + log(sum);
    struct lt_gen_logprob lp;
    CHECK(lt_gen_logprobs(logits, V, 7, 20, &lp) == LT_OK && lp.id == 7 && isinf(lp.logprob) &&
          lp.logprob < 0 && lp.n_top == 20, "chosen -inf: %g, %d top", lp.logprob, lp.n_top);
    CHECK(lt_gen_logprobs(logits, V, 11, 20, &lp) == LT_OK &&
          fabs(lp.logprob - ((double)logits[11] - lse)) < 1e-12, "chosen %g", lp.logprob);
    double p = 0;
    for (int j = 0; j < lp.n_top; j++) {
        lt_token id = lp.top_id[j];
        CHECK(fabs(lp.top_logprob[j] - ((double)logits[id] - lse)) < 1e-12, "top %d", j);
        if (j > 0)
            CHECK(lp.top_logprob[j] < lp.top_logprob[j - 1] ||
                      (lp.top_logprob[j] == lp.top_logprob[j - 1] && id > lp.top_id[j - 1]),
                  "top %d not sorted (ties by id)", j);
        p += exp(lp.top_logprob[j]);
    }
    /* nothing outside the top is more likely than its last */
    int above = 0;
    for (int i = 0; i < V; i++) {
        bool in = false;
        for (int j = 0; j < lp.n_top; j++)
            in |= lp.top_id[j] == i;
        above += !in && logits[i] > lp.top_logprob[lp.n_top - 1] + lse + 1e-9;
    }
    CHECK(above == 0 && p <= 1.0, "%d tokens above the top's last; top mass %g", above, p);
    CHECK(lt_gen_logprobs(logits, 5, 0, 20, &lp) == LT_OK && lp.n_top == 5, "k > vocabulary");
    CHECK(lt_gen_logprobs(logits, V, 0, 0, &lp) == LT_OK && lp.n_top == 0, "k 0");
    CHECK(lt_gen_logprobs(logits, V, V, 5, &lp) == LT_ERR_INVALID, "chosen out of range");
    CHECK(lt_gen_logprobs(logits, V, 0, 21, &lp) == LT_ERR_INVALID, "k 21");
    float all_inf[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(lt_gen_logprobs(all_inf, 3, 0, 1, &lp) == LT_ERR_INVALID, "no finite logit");
}

int main(void)
{
    test_logprobs();
    struct lt_tokenizer *t = make_tokenizer(false);
    if (!t)
        return check_summary();
    test_stop_across_pieces(t);
    test_partial_utf8(t);
    test_limits(t);
    test_errors(t);
    test_seeded(t);
    test_prompts();
    test_random(t);
    CHECK(!strcmp(lt_gen_finish_name(LT_GEN_FINISH_EOG), "eog") &&
          lt_gen_finish_reason(LT_GEN_RUNNING) == NULL);
    lt_tokenizer_free(t);
    return check_summary();
}
