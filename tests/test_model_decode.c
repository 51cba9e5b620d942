/* test_model_decode.c: for each architecture (a tiny random GGUF written here), the
 * inference paths agree with the full-sequence forward of the loss graph, which has no
 * cache and no carried state:
 *   - one-token decode from an empty sequence, at every position;
 *   - prefill of the whole sequence (all logits) and of two chunks in turn;
 *   - three sequences of different prompt lengths decoding in one batch, listed out of
 *     slot order, each against its own forward;
 *   - a cleared sequence starts again from nothing;
 *   - the kept decode step (the default) gives what a step built anew gives, across
 *     changes of batch size, a window that grows past 256 positions, and prefills between.
 * Also: loading refuses a missing tensor and a wrong shape with a message naming it. */
#include <string.h>

#include "check.h"
#include "test_model_util.h"

#define T_LEN 12
#define N_SEQ 3

/* Logits agree: within 2e-4 of the forward's, relative to its largest magnitude. */
static bool close_logits(const float *a, const float *b, int n, double *err)
{
    double mx = 0, d = 0;
    for (int i = 0; i < n; i++) {
        mx = fabs(b[i]) > mx ? fabs(b[i]) : mx;
        double e = fabs((double)a[i] - b[i]);
        d = e > d || e != e ? e : d;
    }
    *err = d / (mx > 0 ? mx : 1);
    return *err <= 2e-4;
}

/* The checks below with the sessions on `dev` (weights uploaded there, the CPU beside it)
 * when dev is given, else on the CPU; the reference forward is always the CPU's.
 * tests/gpu/test_model_decode_cuda.c runs them on CUDA0. */
static void test_arch(const struct tm_spec *spec, const char *dir, struct lt_backend *cpu,
                      struct lt_backend *dev)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_model_decode_%s.gguf", dir, spec->arch);
    CHECK(tm_write_model(spec, path, 1234) == LT_OK, "%s", lt_last_error());
    struct lt_model *m = NULL;
    lt_status st = lt_model_load(path, NULL, &m);
    CHECK(st == LT_OK, "%s: %s", spec->arch, lt_last_error());
    if (st != LT_OK)
        return;
    const struct lt_model_hparams *hp = lt_model_hparams(m);
    int V = (int)hp->n_vocab;
    CHECK(hp->n_layer == spec->n_layer, "%s: %lld layers run", spec->arch, (long long)hp->n_layer);
    CHECK(hp->tied_output == spec->tied);

    /* token streams and their full forwards, all three sequences in one batch */
    int32_t tokens[N_SEQ][T_LEN];
    for (int s = 0; s < N_SEQ; s++)
        for (int t = 0; t < T_LEN; t++)
            tokens[s][t] = (int32_t)((s * 7 + t * 13 + t * t) % V);
    float *full = malloc(sizeof(float) * N_SEQ * T_LEN * (size_t)V);
    float *one = malloc(sizeof(float) * N_SEQ * T_LEN * (size_t)V);
    st = tm_forward(m, cpu, &tokens[0][0], T_LEN, N_SEQ, full);
    CHECK(st == LT_OK, "%s forward: %s", spec->arch, lt_last_error());
    /* the batch of the loss graph keeps sequences apart: sequence 1 alone gives the same */
    st = tm_forward(m, cpu, tokens[1], T_LEN, 1, one);
    double err;
    CHECK(st == LT_OK && close_logits(one, full + (size_t)T_LEN * V, T_LEN * V, &err),
          "%s: batched forward vs single: %g", spec->arch, err);

    struct lt_session *s = NULL;
    struct lt_model *md = NULL; /* the model on dev */
    if (dev)
        CHECK(lt_model_load(path, &(struct lt_model_params){.weights_backend = dev}, &md) == LT_OK,
              "%s on the device: %s", spec->arch, lt_last_error());
    struct lt_backend *bes[2] = {dev ? dev : cpu, cpu};
    struct lt_session_params sp = {
        .n_ctx = T_LEN, .n_seq_max = N_SEQ, .backends = bes, .n_backends = dev ? 2 : 1};
    st = lt_session_new(dev ? md : m, &sp, &s);
    CHECK(st == LT_OK, "%s session: %s", spec->arch, lt_last_error());
    if (st != LT_OK)
        goto out_free;
    /* a warm-up runs on sequence 0 and leaves it empty: its prefill below still matches */
    CHECK(lt_session_warmup(s) == LT_OK && lt_session_seq_pos(s, 0) == 0, "%s warm-up: %s",
          spec->arch, lt_last_error());

    /* decode token by token from an empty sequence */
    int seq = 1, worst_t = -1;
    double worst = 0;
    bool ok = true;
    for (int t = 0; t < T_LEN && ok; t++) {
        ok = lt_session_decode(s, 1, &seq, &tokens[1][t], one) == LT_OK;
        CHECK(ok, "%s decode %d: %s", spec->arch, t, lt_last_error());
        if (ok && !close_logits(one, full + ((size_t)T_LEN + t) * V, V, &err))
            worst_t = t;
        worst = err > worst ? err : worst;
    }
    CHECK(worst_t < 0, "%s: decode differs from the forward at position %d (%g)", spec->arch,
          worst_t, worst);
    CHECK(lt_session_seq_pos(s, 1) == T_LEN);
    CHECK(lt_session_decode(s, 1, &seq, &tokens[1][0], one) != LT_OK, "a full sequence decodes");

    /* prefill, all logits, then the same in two chunks */
    st = lt_session_prefill(s, 0, tokens[0], T_LEN, true, one);
    CHECK(st == LT_OK && close_logits(one, full, T_LEN * V, &err), "%s prefill: %s %g", spec->arch,
          lt_last_error(), err);
    CHECK(lt_session_warmup(s) == LT_ERR_INVALID, "a warm-up refuses a sequence 0 in use");
    CHECK(lt_session_seq_clear(s, 0) == LT_OK && lt_session_seq_pos(s, 0) == 0);
    st = lt_session_prefill(s, 0, tokens[0], 5, false, one);
    CHECK(st == LT_OK && close_logits(one, full + 4 * (size_t)V, V, &err), "%s chunk 1: %g",
          spec->arch, err);
    st = lt_session_prefill(s, 0, tokens[0] + 5, T_LEN - 5, true, one);
    CHECK(st == LT_OK && close_logits(one, full + 5 * (size_t)V, (T_LEN - 5) * V, &err),
          "%s chunk 2: %s %g", spec->arch, lt_last_error(), err);

    /* three sequences, prompts of 3, 7 and 1 tokens, then decoding together in the order
     * (2, 0, 1) until the longest is full */
    int plen[N_SEQ] = {3, 7, 1}, order[N_SEQ] = {2, 0, 1};
    for (int q = 0; q < N_SEQ; q++) {
        CHECK(lt_session_seq_clear(s, q) == LT_OK);
        CHECK(lt_session_prefill(s, q, tokens[q], plen[q], false, one) == LT_OK, "%s",
              lt_last_error());
    }
    int bad_step = -1;
    worst = 0;
    for (int step = 0; step < T_LEN - 7; step++) {
        int32_t next[N_SEQ];
        for (int i = 0; i < N_SEQ; i++)
            next[i] = tokens[order[i]][lt_session_seq_pos(s, order[i])];
        int pos_before[N_SEQ];
        for (int i = 0; i < N_SEQ; i++)
            pos_before[i] = lt_session_seq_pos(s, order[i]);
        st = lt_session_decode(s, N_SEQ, order, next, one);
        CHECK(st == LT_OK, "%s batch decode: %s", spec->arch, lt_last_error());
        if (st != LT_OK)
            break;
        for (int i = 0; i < N_SEQ; i++) {
            const float *want = full + ((size_t)order[i] * T_LEN + (size_t)pos_before[i]) * V;
            if (!close_logits(one + (size_t)i * V, want, V, &err))
                bad_step = step;
            worst = err > worst ? err : worst;
        }
    }
    CHECK(bad_step < 0, "%s: batched decode differs at step %d (%g)", spec->arch, bad_step, worst);
    printf("%-7s decode/prefill/batch on %s agree with the forward (worst %.2e)\n", spec->arch,
           dev ? "the device" : "the CPU", worst);

    /* an F16 KV cache: decode stays near the forward (keys and values rounded to half) */
    {
        struct lt_session *s16 = NULL;
        struct lt_session_params p16 = sp;
        p16.kv_type = LT_TYPE_F16;
        CHECK(lt_session_new(dev ? md : m, &p16, &s16) == LT_OK, "%s", lt_last_error());
        double worst16 = 0;
        for (int t = 0; s16 && t < T_LEN; t++) {
            CHECK(lt_session_decode(s16, 1, &seq, &tokens[1][t], one) == LT_OK);
            close_logits(one, full + ((size_t)T_LEN + t) * V, V, &err);
            worst16 = err > worst16 ? err : worst16;
        }
        CHECK(worst16 <= 1e-2, "%s: f16 cache error %g", spec->arch, worst16);
        lt_session_free(s16);
        p16.kv_type = LT_TYPE_Q8_0;
        CHECK(lt_session_new(dev ? md : m, &p16, &s16) == LT_ERR_INVALID && s16 == NULL);
    }

    /* a sequence asked twice in one batch, an unknown sequence, a bad token */
    int twice[2] = {0, 0}, bad_seq = N_SEQ;
    int32_t toks2[2] = {1, 2}, bad_tok = V;
    CHECK(lt_session_decode(s, 2, twice, toks2, one) == LT_ERR_INVALID);
    CHECK(lt_session_decode(s, 1, &bad_seq, toks2, one) == LT_ERR_INVALID);
    CHECK(lt_session_prefill(s, 2, &bad_tok, 1, false, one) == LT_ERR_INVALID);
out_free:
    lt_session_free(s);
    lt_model_free(md);
    lt_model_free(m);
    free(full);
    free(one);
    remove(path);
}

/* Three sessions fed alike: one keeping its decode step, one building each anew, and one
 * keeping it over the same model uploaded into a backend buffer (where each layer's
 * projections of one input are stacked into one matrix and multiplied at once). A long and
 * a short sequence decode together past position 256 (the kept step's window grows), then
 * one alone (the batch shrinks), then three after a prefill in between. */
static void test_kept_step(const struct tm_spec *spec, const char *dir, struct lt_backend *cpu)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_model_decode_kept_%s.gguf", dir, spec->arch);
    struct lt_model *m = NULL;
    CHECK(tm_write_model(spec, path, 99) == LT_OK && lt_model_load(path, NULL, &m) == LT_OK, "%s",
          lt_last_error());
    if (!m)
        return;
    struct lt_model *mu = NULL;
    CHECK(lt_model_load(path, &(struct lt_model_params){.weights_backend = cpu}, &mu) == LT_OK,
          "%s", lt_last_error());
    int V = (int)lt_model_hparams(m)->n_vocab;
    struct lt_backend *bes[1] = {cpu};
    struct lt_session_params sp = {.n_ctx = 300, .n_seq_max = 3, .backends = bes, .n_backends = 1};
    struct lt_session *kept = NULL, *anew = NULL, *joint = NULL;
    CHECK(lt_session_new(m, &sp, &kept) == LT_OK, "%s", lt_last_error());
    CHECK(mu && lt_session_new(mu, &sp, &joint) == LT_OK, "%s", lt_last_error());
    sp.decode_rebuild = true;
    CHECK(lt_session_new(m, &sp, &anew) == LT_OK, "%s", lt_last_error());
    int32_t prompt[250];
    for (int i = 0; i < 250; i++)
        prompt[i] = (int32_t)((i * 31 + 7) % V);
    float *a = malloc(sizeof(float) * 3 * (size_t)V), *b = malloc(sizeof(float) * 3 * (size_t)V);
    float *c = malloc(sizeof(float) * 3 * (size_t)V);
    struct lt_session *both[3] = {kept, anew, joint};
    for (int k = 0; k < 3 && kept && anew && joint; k++) {
        CHECK(lt_session_prefill(both[k], 0, prompt, 250, false, a) == LT_OK, "%s", lt_last_error());
        CHECK(lt_session_prefill(both[k], 1, prompt + 100, 5, false, a) == LT_OK);
    }
    /* the last two batch sizes come back: their kept steps serve again */
    static const int batches[][4] = {{2, 0, 1}, {1, 1}, {3, 2, 0, 1}, {2, 1, 0}, {1, 2}};
    static const int steps[] = {12, 3, 4, 3, 2};
    double worst = 0, worst_joint = 0;
    int n_bad = 0, n_steps = 0;
    for (int phase = 0; phase < 5 && kept && anew && joint; phase++) {
        int n = batches[phase][0];
        const int *seqs = &batches[phase][1];
        if (phase == 2)
            for (int k = 0; k < 3; k++)
                CHECK(lt_session_prefill(both[k], 2, prompt + 3, 9, false, a) == LT_OK);
        for (int t = 0; t < steps[phase]; t++) {
            int32_t tok[3];
            for (int i = 0; i < n; i++)
                tok[i] = (int32_t)((lt_session_seq_pos(kept, seqs[i]) * 17 + i) % V);
            lt_status s1 = lt_session_decode(kept, n, seqs, tok, a);
            lt_status s2 = lt_session_decode(anew, n, seqs, tok, b);
            lt_status s3 = lt_session_decode(joint, n, seqs, tok, c);
            CHECK(s1 == LT_OK && s2 == LT_OK && s3 == LT_OK, "%s: decode: %s", spec->arch,
                  lt_last_error());
            double err = 0, err_joint = 0;
            if (s1 == LT_OK && s2 == LT_OK && s3 == LT_OK &&
                (!close_logits(a, b, n * V, &err) || !close_logits(c, a, n * V, &err_joint)))
                n_bad++;
            worst = err > worst ? err : worst;
            worst_joint = err_joint > worst_joint ? err_joint : worst_joint;
            n_steps++;
        }
    }
    CHECK(lt_session_seq_pos(kept, 0) == 269 && lt_session_seq_pos(anew, 0) == 269);
    CHECK(n_bad == 0 && worst <= 1e-5 && worst_joint <= 1e-5,
          "%s: the kept step differs in %d of %d steps (worst %g, joint projections %g)",
          spec->arch, n_bad, n_steps, worst, worst_joint);
    printf("%-7s kept decode step vs built anew: %d steps, worst %.2e; joint projections %.2e\n",
           spec->arch, n_steps, worst, worst_joint);
    lt_session_free(kept);
    lt_session_free(anew);
    lt_session_free(joint);
    lt_model_free(m);
    lt_model_free(mu);
    free(a);
    free(b);
    free(c);
    remove(path);
}

#ifndef DECODE_ON_DEVICE /* loading, not decoding: the CPU test alone checks it */
/* A file missing a tensor, and one with a tensor of the wrong shape, are refused by name. */
static void test_refusals(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_model_decode_bad.gguf", dir);
    struct tm_spec spec = tm_specs[0];
    spec.n_layer = 2;
    /* block_count says 3, the file holds 2 blocks */
    struct tm_spec more = spec;
    more.n_mtp = 1;
    CHECK(tm_write_model(&more, path, 5) == LT_OK);
    struct lt_model *m = NULL;
    CHECK(lt_model_load(path, NULL, &m) == LT_ERR_FORMAT && m == NULL);
    CHECK(strstr(lt_last_error(), "blk.2.attn_norm.weight") != NULL, "%s", lt_last_error());
    /* the file's token_embd has n_embd 32; the keys claim 48 */
    struct lt_gguf *g = NULL;
    CHECK(tm_write_model(&spec, path, 5) == LT_OK);
    CHECK(lt_gguf_open(path, &g) == LT_OK);
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    lt_gguf_writer_copy_kv(w, g);
    lt_gguf_writer_set_u32(w, "llama.embedding_length", 48);
    for (int64_t i = 0; i < lt_gguf_n_tensors(g); i++) {
        const struct lt_gguf_tensor_info *ti = lt_gguf_tensor(g, i);
        lt_gguf_writer_add_tensor(w, ti->name, ti->type, ti->n_dims, ti->ne, ti->data, ti->nbytes);
    }
    char path2[520];
    snprintf(path2, sizeof(path2), "%s.2", path);
    CHECK(lt_gguf_writer_write(w, path2) == LT_OK);
    lt_gguf_writer_free(w);
    lt_gguf_close(g);
    CHECK(lt_model_load(path2, NULL, &m) == LT_ERR_FORMAT);
    CHECK(strstr(lt_last_error(), "token_embd.weight") != NULL, "%s", lt_last_error());
    remove(path);
    remove(path2);
}

int main(void)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int i = 0; i < TM_N_SPECS; i++)
        test_arch(&tm_specs[i], dir, cpu, NULL);
    for (int i = 0; i < TM_N_SPECS; i++)
        test_kept_step(&tm_specs[i], dir, cpu);
    test_refusals(dir);
    lt_backend_free(cpu);
    return check_summary();
}
#endif
