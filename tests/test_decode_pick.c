/* test_decode_pick.c: the greedy pick made where the logits are.
 *   - ARGMAX on the CPU picks what the sampler's greedy pick does (lt_sampler_sample at
 *     temperature 0) over 2,000 rows full of ties, -inf, +0 and -0, and gives -1 where
 *     the sampler refuses a NaN; only the first n of a row count; rows of a slice (apart
 *     in memory) too. The constructor refuses what it cannot read.
 *   - lt_session_decode_pick, for each architecture (a tiny random GGUF written here), in
 *     the kept step and the rebuilt one: each row's id is the sampler's greedy pick of
 *     that row's logits from lt_session_decode (over the first pick_vocab of them), and the
 *     wanted rows come back packed, equal to those rows; a session without pick_vocab
 *     refuses the call. */
#include <string.h>

#include "check.h"
#include "lathe/sampling.h"
#include "test_model_util.h"

/* The sampler's greedy pick of l[0..n), or -1 when it refuses (a NaN). */
static int32_t sampler_pick(struct lt_sampler *s, const float *l, int n)
{
    lt_token out = -1;
    return lt_sampler_sample(s, l, (size_t)n, NULL, 0, &out) == LT_OK ? out : -1;
}

/* ARGMAX over rows [ROW_LEN, n_rows] read through a slice (every other row of storage twice
 * as long), the first n of each. */
#define ROW_LEN 300
static void test_op(struct lt_backend *cpu)
{
    struct lt_sampler_params sp = lt_sampler_default_params();
    sp.temperature = 0;
    struct lt_sampler s;
    CHECK(lt_sampler_init(&s, &sp) == LT_OK);
    enum { ROWS = 2000 };
    struct lt_ctx *ctx = lt_ctx_init(
        (struct lt_ctx_params){.mem_size = 64 * sizeof(struct lt_tensor), .no_alloc = true});
    struct lt_tensor *store = lt_new_tensor_2d(ctx, LT_TYPE_F32, ROW_LEN, 2 * ROWS);
    struct lt_tensor *rows = lt_view_2d(ctx, store, ROW_LEN, ROWS, 2 * store->nb[1], 0);
    const int n = ROW_LEN - 7; /* the last 7 of each row are not read */
    struct lt_tensor *pick = lt_argmax(ctx, rows, n);
    CHECK(pick && pick->type == LT_TYPE_I32 && pick->ne[0] == ROWS, "%s", lt_last_error());
    struct lt_graph *g = lt_graph_new(ctx, 16);
    struct lt_backend *bes[1] = {cpu};
    struct lt_sched *sch = lt_sched_new(bes, 1);
    if (!pick || !g || lt_graph_build(g, pick) != LT_OK ||
        lt_sched_place(sch, g, false, NULL) != LT_OK || lt_sched_alloc(sch, g) != LT_OK) {
        CHECK(false, "placing ARGMAX: %s", lt_last_error());
        goto out;
    }
    float *host = malloc(sizeof(float) * ROW_LEN * 2 * ROWS);
    int32_t *got = malloc(sizeof(int32_t) * ROWS);
    uint64_t r = 777;
    for (int64_t i = 0; i < (int64_t)ROW_LEN * 2 * ROWS; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int v = (int)(r >> 59); /* 0..31: many ties */
        host[i] = v == 0 ? -INFINITY : v == 1 ? -0.0f : v == 2 ? 0.0f : (float)(v % 7) - 3.0f;
    }
    int nan_rows = 0;
    for (int k = 0; k < ROWS; k++) {
        float *row = host + (size_t)2 * k * ROW_LEN;
        if (k % 3 == 0) { /* a NaN among the first n */
            row[(k * 37) % n] = NAN;
            nan_rows++;
        } else if (k % 3 == 1) { /* a NaN or a larger value past n: not read */
            row[n + k % 7] = k % 2 ? NAN : 100.0f;
        } else if (k % 50 == 5) { /* all -inf: the first */
            for (int i = 0; i < n; i++)
                row[i] = -INFINITY;
        }
    }
    int wrong = 0, nans = 0;
    if (lt_tensor_set(store, host, 0, lt_nbytes(store)) == LT_OK &&
        lt_sched_compute(sch, g) == LT_OK &&
        lt_tensor_get(pick, got, 0, lt_nbytes(pick)) == LT_OK) {
        for (int k = 0; k < ROWS; k++) {
            int32_t want = sampler_pick(&s, host + (size_t)2 * k * ROW_LEN, n);
            wrong += got[k] != want;
            nans += want < 0;
        }
    } else {
        CHECK(false, "running ARGMAX: %s", lt_last_error());
    }
    CHECK(wrong == 0 && nans == nan_rows,
          "ARGMAX over %d rows: %d differ from the sampler's greedy pick (%d NaN rows)", ROWS,
          wrong, nans);
    printf("ARGMAX agrees with the sampler's greedy pick on %d rows (%d with a NaN: -1)\n", ROWS,
           nans);
    free(host);
    free(got);
    /* refusals: a row not of contiguous floats, n out of range */
    struct lt_tensor *t = lt_transpose(ctx, rows);
    CHECK(!lt_argmax(ctx, t, 4) && strstr(lt_last_error(), "contiguous rows"), "%s",
          lt_last_error());
    CHECK(!lt_argmax(ctx, rows, ROW_LEN + 1) && strstr(lt_last_error(), "the first 301"), "%s",
          lt_last_error());
    CHECK(!lt_argmax(ctx, rows, 0), "n = 0 refused");
out:
    lt_sched_free(sch);
    lt_ctx_free(ctx);
    lt_sampler_free(&s);
}

#define N_SEQ 4
#define T_LEN 10

static void test_session(const struct tm_spec *spec, const char *dir, struct lt_backend *cpu,
                         bool rebuild)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_decode_pick_%s_%d.gguf", dir, spec->arch, spec->n_head);
    CHECK(tm_write_model(spec, path, 97) == LT_OK, "%s", lt_last_error());
    struct lt_model *m = NULL;
    if (lt_model_load(path, NULL, &m) != LT_OK) {
        CHECK(false, "%s: %s", spec->arch, lt_last_error());
        remove(path);
        return;
    }
    const int V = (int)lt_model_hparams(m)->n_vocab, PV = V - 3; /* a padded head */
    struct lt_backend *bes[1] = {cpu};
    struct lt_session_params p = {.n_ctx = T_LEN + 2,
                                  .n_seq_max = N_SEQ,
                                  .backends = bes,
                                  .n_backends = 1,
                                  .decode_rebuild = rebuild,
                                  .pick_vocab = PV};
    struct lt_session *a = NULL, *b = NULL; /* a picks; b is the same without */
    struct lt_session_params pb = p;
    pb.pick_vocab = 0;
    float *full = malloc(sizeof(float) * N_SEQ * (size_t)V),
          *part = malloc(sizeof(float) * N_SEQ * (size_t)V);
    struct lt_sampler_params sp = lt_sampler_default_params();
    sp.temperature = 0;
    struct lt_sampler s;
    CHECK(lt_sampler_init(&s, &sp) == LT_OK);
    if (lt_session_new(m, &p, &a) != LT_OK || lt_session_new(m, &pb, &b) != LT_OK) {
        CHECK(false, "%s", lt_last_error());
        goto out;
    }
    int bad_id = 0, bad_rows = 0, steps = 0;
    int32_t tok[N_SEQ], ids[N_SEQ];
    for (int q = 0; q < N_SEQ; q++)
        tok[q] = (int32_t)((q * 11 + 3) % V);
    for (int t = 0; t < T_LEN; t++) {
        int n = 1 + (t % N_SEQ), seqs[N_SEQ];
        bool want[N_SEQ];
        for (int i = 0; i < n; i++) {
            seqs[i] = (i + t) % N_SEQ;
            want[i] = (i + t) % 3 == 0;
        }
        if (lt_session_decode(b, n, seqs, tok, full) != LT_OK ||
            lt_session_decode_pick(a, n, seqs, tok, want, part, ids) != LT_OK) {
            CHECK(false, "%s step %d: %s", spec->arch, t, lt_last_error());
            goto out;
        }
        steps++;
        int j = 0;
        for (int i = 0; i < n; i++) {
            const float *row = full + (size_t)i * V;
            bad_id += ids[i] != sampler_pick(&s, row, PV);
            if (want[i])
                bad_rows += memcmp(part + (size_t)j++ * V, row, sizeof(float) * (size_t)V) != 0;
        }
        for (int i = 0; i < n; i++)
            tok[i] = ids[i] >= 0 ? ids[i] : 0;
    }
    CHECK(bad_id == 0 && bad_rows == 0,
          "%s %s: %d picks differ from the sampler's, %d wanted rows from the logits", spec->arch,
          rebuild ? "rebuilt" : "kept", bad_id, bad_rows);
    /* every row wanted (want NULL): all logits as lt_session_decode gives them */
    int seq0 = 0;
    CHECK(lt_session_decode_pick(a, 1, &seq0, tok, NULL, part, ids) == LT_OK &&
              lt_session_decode(b, 1, &seq0, tok, full) == LT_OK &&
              !memcmp(part, full, sizeof(float) * (size_t)V),
          "%s", lt_last_error());
    CHECK(lt_session_decode_pick(b, 1, &seq0, tok, NULL, part, ids) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "pick_vocab 0"),
          "a session without pick_vocab refuses: %s", lt_last_error());
    printf("%-7s %-7s %d decode steps: picks equal the sampler's greedy ones, wanted rows equal\n",
           spec->arch, rebuild ? "rebuilt" : "kept", steps);
out:
    lt_sampler_free(&s);
    lt_session_free(a);
    lt_session_free(b);
    lt_model_free(m);
    free(full);
    free(part);
    remove(path);
}

int main(void)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    test_op(cpu);
    for (int i = 0; i < TM_N_SPECS; i++)
        for (int rebuild = 0; rebuild < 2; rebuild++)
            test_session(&tm_specs[i], dir, cpu, rebuild);
    lt_backend_free(cpu);
    return check_summary();
}
