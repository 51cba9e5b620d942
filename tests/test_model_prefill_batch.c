/* test_model_prefill_batch.c: several sequences' prompts prefilled in one step
 * (lt_session_prefill_batch) give what each sequence's cache-free forward gives. For each
 * architecture (a tiny random GGUF written here):
 *   - five sequences start at different positions (0 to 9 tokens already prefilled);
 *   - batches of prompts of different lengths (so the shorter ones are padded), listed out
 *     of slot order, with lengths 1 and 70 (past a 64-token chunk of the DeltaNet), then a
 *     batch of equal lengths (no padding), one of one sequence, and one padded to two steps
 *     (fewer than the conv keeps);
 *   - each sequence's logits after the batch are its last token's in the forward;
 *   - decode steps after the batches agree too, so the caches and the carried DeltaNet
 *     and conv states were kept at each sequence's own end, not the padding's;
 *   - the same on CUDA's emulation (cuda_emu.h, a session on that backend alone), where a
 *     node CUDA's preconditions refuse fails the step, so the batch's graph is CUDA's whole;
 *   - refusals: a sequence twice, an empty prompt, a prompt past the context. */
#include <string.h>

#include "check.h"
#include "cuda_emu.h"
#include "test_model_util.h"

#define T_LEN 96
#define N_SEQ 5

struct fixture {
    const char *arch;
    int V;
    int32_t tokens[N_SEQ][T_LEN];
    float *full; /* [N_SEQ][T_LEN][V]: each sequence's forward alone */
};

/* Logits of sequence q at position p agree with the forward's. */
static bool agrees(const struct fixture *f, const float *got, int q, int p, double *worst)
{
    double e = tm_rel_err(got, f->full + ((size_t)q * T_LEN + (size_t)p) * f->V, f->V);
    *worst = e > *worst || e != e ? e : *worst;
    return e <= 2e-4;
}

/* Prefills, batches and decodes on a session over backend be (weights loaded for it). */
static void run_session(const struct fixture *f, const struct lt_model *m, struct lt_backend *be,
                        const char *where)
{
    struct lt_session *s = NULL;
    struct lt_backend *bes[1] = {be};
    struct lt_session_params sp = {
        .n_ctx = T_LEN, .n_seq_max = N_SEQ, .backends = bes, .n_backends = 1};
    float *out = malloc(sizeof(float) * N_SEQ * (size_t)f->V);
    lt_status st = out ? lt_session_new(m, &sp, &s) : LT_ERR_NOMEM;
    CHECK(st == LT_OK, "%s %s session: %s", f->arch, where, lt_last_error());
    if (st != LT_OK)
        goto out;
    /* starting points: some sequences hold a few tokens already, one holds none */
    const int start[N_SEQ] = {3, 0, 9, 1, 5};
    for (int q = 0; q < N_SEQ; q++)
        if (start[q] > 0)
            CHECK(lt_session_prefill(s, q, f->tokens[q], start[q], false, NULL) == LT_OK, "%s",
                  lt_last_error());

    /* count, then (sequence, length) pairs */
    static const int batches[][1 + 2 * N_SEQ] = {
        {3, 2, 7, 0, 1, 4, 20},               /* padded: lengths 7, 1, 20 */
        {5, 1, 70, 3, 2, 0, 33, 2, 5, 4, 12}, /* past a 64-token chunk, all five */
        {2, 3, 6, 0, 6},                      /* equal lengths: no padding */
        {1, 4, 3},                            /* one sequence: the plain prefill */
        {2, 0, 1, 4, 2},                      /* padded to 2 steps, fewer than the conv keeps */
    };
    double worst = 0;
    int bad = -1;
    for (int bi = 0; bi < (int)(sizeof(batches) / sizeof(batches[0])); bi++) {
        int n = batches[bi][0], seqs[N_SEQ], lens[N_SEQ], pos[N_SEQ];
        const int32_t *toks[N_SEQ];
        for (int i = 0; i < n; i++) {
            seqs[i] = batches[bi][1 + 2 * i];
            lens[i] = batches[bi][2 + 2 * i];
            pos[i] = lt_session_seq_pos(s, seqs[i]);
            toks[i] = f->tokens[seqs[i]] + pos[i];
        }
        st = lt_session_prefill_batch(s, n, seqs, toks, lens, out);
        CHECK(st == LT_OK, "%s %s batch %d: %s", f->arch, where, bi, lt_last_error());
        if (st != LT_OK)
            goto out;
        for (int i = 0; i < n; i++) {
            CHECK(lt_session_seq_pos(s, seqs[i]) == pos[i] + lens[i]);
            if (!agrees(f, out + (size_t)i * f->V, seqs[i], pos[i] + lens[i] - 1, &worst))
                bad = bi;
        }
    }
    CHECK(bad < 0, "%s %s: batch %d differs from the forward (%g)", f->arch, where, bad, worst);

    /* decode the rest of every sequence, all five a step: the kept caches and states */
    double worst_dec = 0;
    int steps = 0;
    bad = -1;
    for (;;) {
        int n = 0, seqs[N_SEQ], pos[N_SEQ];
        int32_t next[N_SEQ];
        for (int q = 0; q < N_SEQ; q++) {
            int p = lt_session_seq_pos(s, q);
            if (p >= T_LEN)
                continue;
            seqs[n] = q;
            pos[n] = p;
            next[n++] = f->tokens[q][p];
        }
        if (n == 0 || steps >= 12)
            break;
        st = lt_session_decode(s, n, seqs, next, out);
        CHECK(st == LT_OK, "%s %s decode: %s", f->arch, where, lt_last_error());
        if (st != LT_OK)
            goto out;
        for (int i = 0; i < n; i++)
            if (!agrees(f, out + (size_t)i * f->V, seqs[i], pos[i], &worst_dec))
                bad = steps;
        steps++;
    }
    CHECK(steps == 12, "%s %s: %d decode steps", f->arch, where, steps);
    CHECK(bad < 0, "%s %s: decode step %d after the batches differs (%g)", f->arch, where, bad,
          worst_dec);
    printf("%-7s %-13s batched prefills agree with the forward (worst %.2e), and the decodes "
           "after them (%.2e)\n",
           f->arch, where, worst, worst_dec);
out:
    lt_session_free(s);
    free(out);
}

static void test_refusals(const struct fixture *f, const struct lt_model *m, struct lt_backend *cpu)
{
    struct lt_session *s = NULL;
    struct lt_backend *bes[1] = {cpu};
    struct lt_session_params sp = {.n_ctx = 16, .n_seq_max = 3, .backends = bes, .n_backends = 1};
    if (lt_session_new(m, &sp, &s) != LT_OK) {
        CHECK(false, "%s", lt_last_error());
        return;
    }
    const int32_t *toks[3] = {f->tokens[0], f->tokens[1], f->tokens[2]};
    int twice[2] = {1, 1}, two[2] = {0, 1}, lens[2] = {2, 3}, empty[2] = {2, 0}, long_[2] = {2, 17};
    CHECK(lt_session_prefill_batch(s, 2, twice, toks, lens, NULL) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "appears twice"),
          "%s", lt_last_error());
    CHECK(lt_session_prefill_batch(s, 2, two, toks, empty, NULL) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "prefill of 0 tokens"),
          "%s", lt_last_error());
    CHECK(lt_session_prefill_batch(s, 2, two, toks, long_, NULL) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "exceed the context of 16"),
          "%s", lt_last_error());
    /* nothing was appended by a refused batch */
    CHECK(lt_session_seq_pos(s, 0) == 0 && lt_session_seq_pos(s, 1) == 0);
    lt_session_free(s);
}

static void test_arch(const struct tm_spec *spec, const char *dir, struct lt_backend *cpu,
                      struct lt_backend *emu)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_model_prefill_batch_%s_%d.gguf", dir, spec->arch,
             spec->n_head);
    CHECK(tm_write_model(spec, path, 2468) == LT_OK, "%s", lt_last_error());
    struct lt_model *m = NULL, *md = NULL;
    lt_status st = lt_model_load(path, NULL, &m);
    CHECK(st == LT_OK, "%s: %s", spec->arch, lt_last_error());
    struct fixture f = {.arch = spec->arch};
    if (st != LT_OK)
        goto out;
    f.V = (int)lt_model_hparams(m)->n_vocab;
    for (int q = 0; q < N_SEQ; q++)
        for (int t = 0; t < T_LEN; t++)
            f.tokens[q][t] = (int32_t)((q * 7 + t * 5 + t * t * 3) % f.V);
    f.full = malloc(sizeof(float) * N_SEQ * T_LEN * (size_t)f.V);
    if (!f.full)
        goto out;
    for (int q = 0; q < N_SEQ; q++) {
        st = tm_forward(m, cpu, f.tokens[q], T_LEN, 1, f.full + (size_t)q * T_LEN * f.V);
        CHECK(st == LT_OK, "%s forward: %s", spec->arch, lt_last_error());
    }
    run_session(&f, m, cpu, "on the CPU");
    test_refusals(&f, m, cpu);
    if (emu) {
        struct lt_model_params mp = {.weights_backend = emu};
        st = lt_model_load(path, &mp, &md);
        CHECK(st == LT_OK, "%s: %s", spec->arch, lt_last_error());
        if (st == LT_OK)
            run_session(&f, md, emu, "CUDA-emulated");
    }
out:
    lt_model_free(md);
    lt_model_free(m);
    free(f.full);
    remove(path);
}

int main(void)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_backend *emu = lt_cuda_compiled() ? emu_new() : NULL;
    if (!emu)
        printf("no CUDA build: the emulated CUDA runs are skipped\n");
    for (int i = 0; i < TM_N_SPECS; i++)
        test_arch(&tm_specs[i], dir, cpu, emu);
    if (emu) {
        CHECK(((struct emu *)emu->impl)->n_refused_runs == 0, "no refused node was run");
        lt_backend_free(emu);
    }
    lt_backend_free(cpu);
    return check_summary();
}
