/* test_model_decode_view.c: decode batches of every shape read the right cache regions.
 * For each architecture (a tiny random GGUF written here), every sequence's logits agree
 * with the cache-free forward of that sequence alone:
 *   - five sequences with prompts of different lengths (so positions differ in a batch);
 *   - batches (0,1,2,3,4), (0,2,4), (1,3), (4) (evenly spaced and increasing: one strided
 *     view of the cache could read them) and (3,0), (0,1,3) (no single view can),
 *     repeated, so each sequence advances through several batch shapes. */
#include <string.h>

#include "check.h"
#include "test_model_util.h"

#define T_LEN 16
#define N_SEQ 5

static void test_arch(const struct tm_spec *spec, const char *dir, struct lt_backend *cpu)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_model_decode_view_%s.gguf", dir, spec->arch);
    CHECK(tm_write_model(spec, path, 4321) == LT_OK, "%s", lt_last_error());
    struct lt_model *m = NULL;
    lt_status st = lt_model_load(path, NULL, &m);
    CHECK(st == LT_OK, "%s: %s", spec->arch, lt_last_error());
    if (st != LT_OK)
        return;
    int V = (int)lt_model_hparams(m)->n_vocab;
    int32_t tokens[N_SEQ][T_LEN];
    for (int q = 0; q < N_SEQ; q++)
        for (int t = 0; t < T_LEN; t++)
            tokens[q][t] = (int32_t)((q * 5 + t * 11 + t * t * 3) % V);
    float *full = malloc(sizeof(float) * N_SEQ * T_LEN * (size_t)V);
    float *out = malloc(sizeof(float) * N_SEQ * (size_t)V);
    struct lt_session *s = NULL;
    struct lt_backend *bes[1] = {cpu};
    struct lt_session_params sp = {
        .n_ctx = T_LEN, .n_seq_max = N_SEQ, .backends = bes, .n_backends = 1};
    if (!full || !out)
        goto out_free;
    /* each sequence's forward on its own */
    for (int q = 0; q < N_SEQ; q++) {
        st = tm_forward(m, cpu, tokens[q], T_LEN, 1, full + (size_t)q * T_LEN * V);
        CHECK(st == LT_OK, "%s forward: %s", spec->arch, lt_last_error());
    }
    st = lt_session_new(m, &sp, &s);
    CHECK(st == LT_OK, "%s session: %s", spec->arch, lt_last_error());
    if (st != LT_OK)
        goto out_free;
    int plen[N_SEQ] = {1, 4, 2, 3, 1};
    for (int q = 0; q < N_SEQ; q++)
        CHECK(lt_session_prefill(s, q, tokens[q], plen[q], false, out) == LT_OK, "%s",
              lt_last_error());

    static const int batches[][N_SEQ + 1] = {
        /* count, then the sequences */
        {5, 0, 1, 2, 3, 4}, {3, 0, 2, 4}, {2, 1, 3}, {1, 4}, {2, 3, 0}, {3, 0, 1, 3},
    };
    int n_batches = (int)(sizeof(batches) / sizeof(batches[0]));
    double worst = 0;
    int bad = -1, done = 0;
    for (int round = 0; round < 4; round++) {
        for (int bi = 0; bi < n_batches; bi++) {
            int n = batches[bi][0];
            const int *seqs = &batches[bi][1];
            int pos[N_SEQ];
            int32_t next[N_SEQ];
            bool room = true;
            for (int i = 0; i < n; i++) {
                pos[i] = lt_session_seq_pos(s, seqs[i]);
                room = room && pos[i] < T_LEN;
                next[i] = room ? tokens[seqs[i]][pos[i]] : 0;
            }
            if (!room)
                continue;
            st = lt_session_decode(s, n, seqs, next, out);
            CHECK(st == LT_OK, "%s batch %d: %s", spec->arch, bi, lt_last_error());
            if (st != LT_OK)
                goto out_free;
            done++;
            for (int i = 0; i < n; i++) {
                const float *want = full + ((size_t)seqs[i] * T_LEN + (size_t)pos[i]) * V;
                double e = tm_rel_err(out + (size_t)i * V, want, V);
                if (!(e <= 2e-4))
                    bad = bi;
                worst = e > worst || e != e ? e : worst;
            }
        }
    }
    CHECK(done >= 3 * n_batches, "%s: only %d batches ran", spec->arch, done);
    CHECK(bad < 0, "%s: batch %d differs from the forward (%g)", spec->arch, bad, worst);
    printf("%-7s decode batches of every shape agree with the forward (worst %.2e)\n", spec->arch,
           worst);
out_free:
    lt_session_free(s);
    lt_model_free(m);
    free(full);
    free(out);
    remove(path);
}

int main(void)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int i = 0; i < TM_N_SPECS; i++)
        test_arch(&tm_specs[i], dir, cpu);
    lt_backend_free(cpu);
    return check_summary();
}
