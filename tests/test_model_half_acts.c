/* test_model_half_acts.c: a model with BF16 (or F16) projection weights, prefilled with
 * half activations (the session's half_acts, which a device backend turns on by itself),
 * agrees with the same prefill in F32 activations within the rounding of those
 * activations, for each architecture (a tiny random GGUF written here):
 *   - twelve tokens (more than 8): the norms, SwiGLU and gated outputs write the half type,
 *     so the logits differ from the F32 run, but by no more than a few BF16 roundings;
 *   - eight tokens: activations stay F32 (a device's few-column kernel reads F32), so both
 *     runs give the same logits bit for bit;
 *   - one-token decode afterwards reads the caches the half prefill wrote, and stays close;
 *   - the loss graph (training: gradients may be wanted) keeps F32 activations: its logits
 *     are the F32 prefill's;
 *   - on an emulated CUDA device (CUDA's own preconditions, lt_cuda_verdict, computed on the
 *     CPU; a build with CUDA only), a session's default turns half activations on, and CUDA
 *     accepts every node that writes or multiplies them: none falls back to the CPU.
 * The CPU computes all of it (it is the oracle the device's products are checked against). */
#include <string.h>

#include "backend/cuda/cuda_verdict.h"
#include "check.h"
#include "gap_backend.h"
#include "test_model_util.h"

/* ---- an emulated CUDA device: CUDA's verdicts, the CPU's kernels, device memory ---- */

static int emu_half_nodes, emu_half_refused;
static int emu_norm_products; /* RMS_NORM_MUL_MAT and MUL_MAT_ACC nodes asked */

static bool half_type(enum lt_type t)
{
    return t == LT_TYPE_F16 || t == LT_TYPE_BF16;
}

static bool emu_supports(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                         size_t reason_size)
{
    bool ok =
        lt_cuda_verdict(node, reason, reason_size) && gap_verdict(be, node, reason, reason_size);
    if (node->op == LT_OP_RMS_NORM_MUL_MAT || node->op == LT_OP_MUL_MAT_ACC) {
        emu_norm_products++;
        if (!ok) {
            emu_half_refused++;
            fprintf(stderr, "CUDA refuses %s '%s': %s\n", lt_op_name(node->op), node->name, reason);
        }
    }
    bool half =
        half_type(node->type) || (node->op == LT_OP_MUL_MAT && half_type(node->src[1]->type));
    if (half) {
        emu_half_nodes++;
        if (!ok) {
            emu_half_refused++;
            fprintf(stderr, "CUDA refuses %s '%s': %s\n", lt_op_name(node->op), node->name, reason);
        }
    }
    return ok;
}

static struct lt_backend_iface emu_iface;

static struct lt_backend *emu_new(void)
{
    struct lt_backend *be = gap_backend_new("CUDA0-emu");
    emu_iface = gap_iface;
    emu_iface.supports_op = emu_supports;
    be->iface = &emu_iface;
    be->is_host = false; /* a device: the session's default turns half activations on */
    return be;
}

#define T_LONG 12
#define T_SHORT 8

/* Prefills tokens[0..n) into a fresh session (half_acts as given), all logits into out,
 * then decodes one more token into out + n * V. */
static lt_status run(const struct lt_model *m, struct lt_backend *cpu, int half_acts,
                     const int32_t *tokens, int n, float *out)
{
    struct lt_backend *bes[1] = {cpu};
    struct lt_session_params sp = {.n_ctx = T_LONG + 1,
                                   .n_seq_max = 1,
                                   .backends = bes,
                                   .n_backends = 1,
                                   .half_acts = half_acts};
    struct lt_session *s = NULL;
    lt_status st = lt_session_new(m, &sp, &s);
    if (st != LT_OK)
        return st;
    int seq = 0, V = (int)lt_model_hparams(m)->n_vocab;
    st = lt_session_prefill(s, 0, tokens, n, true, out);
    if (st == LT_OK)
        st = lt_session_decode(s, 1, &seq, &tokens[n], out + (size_t)n * V);
    lt_session_free(s);
    return st;
}

static void test_arch(const struct tm_spec *spec, enum lt_type wtype, const char *dir,
                      struct lt_backend *cpu)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_model_half_acts_%s_%s.gguf", dir, spec->arch,
             lt_type_name(wtype));
    tm_matrix_type = wtype;
    lt_status st = tm_write_model(spec, path, 4321);
    tm_matrix_type = LT_TYPE_F32;
    CHECK(st == LT_OK, "%s", lt_last_error());
    struct lt_model *m = NULL;
    st = lt_model_load(path, NULL, &m);
    CHECK(st == LT_OK, "%s %s: %s", spec->arch, lt_type_name(wtype), lt_last_error());
    if (st != LT_OK)
        return;
    int V = (int)lt_model_hparams(m)->n_vocab;
    int32_t tokens[T_LONG + 1];
    for (int t = 0; t <= T_LONG; t++)
        tokens[t] = (int32_t)((t * 11 + 3 + t * t) % V);
    size_t nl = (size_t)(T_LONG + 1) * (size_t)V;
    float *f32 = malloc(sizeof(float) * nl), *half = malloc(sizeof(float) * nl);

    /* more than 8 tokens: half activations, close to F32 but not equal */
    bool ok = run(m, cpu, -1, tokens, T_LONG, f32) == LT_OK;
    ok = ok && run(m, cpu, 1, tokens, T_LONG, half) == LT_OK;
    CHECK(ok, "%s %s: %s", spec->arch, lt_type_name(wtype), lt_last_error());
    if (ok) {
        /* each half activation is rounded once (2^-9 relative for BF16, 2^-12 for F16);
         * a few of them in a row, through two layers, stay well inside 100 of those */
        double unit = wtype == LT_TYPE_BF16 ? 1.0 / 512 : 1.0 / 4096;
        double e = tm_rel_err(half, f32, T_LONG * V);
        double ed = tm_rel_err(half + (size_t)T_LONG * V, f32 + (size_t)T_LONG * V, V);
        CHECK(e <= 10 * unit, "%s %s prefill: half vs f32 activations %g (> %g)", spec->arch,
              lt_type_name(wtype), e, 10 * unit);
        CHECK(e > 0, "%s %s prefill: half activations gave the f32 logits exactly: not used?",
              spec->arch, lt_type_name(wtype));
        CHECK(ed <= 10 * unit, "%s %s decode after a half prefill: %g", spec->arch,
              lt_type_name(wtype), ed);
        float *fwd = malloc(sizeof(float) * (size_t)T_LONG * (size_t)V);
        double ef = 1;
        CHECK(tm_forward(m, cpu, tokens, T_LONG, 1, fwd) == LT_OK &&
                  (ef = tm_rel_err(fwd, f32, T_LONG * V)) <= 2e-4,
              "%s %s: the loss graph's forward vs the f32 prefill: %g (%s)", spec->arch,
              lt_type_name(wtype), ef, lt_last_error());
        free(fwd);
        printf("%s %s: prefill of %d tokens, half vs f32 activations: %.2e (decode %.2e)\n",
               spec->arch, lt_type_name(wtype), T_LONG, e, ed);
    }

    /* 8 tokens: F32 activations whatever half_acts says */
    ok = run(m, cpu, -1, tokens, T_SHORT, f32) == LT_OK;
    ok = ok && run(m, cpu, 1, tokens, T_SHORT, half) == LT_OK;
    CHECK(ok, "%s %s: %s", spec->arch, lt_type_name(wtype), lt_last_error());
    if (ok)
        CHECK(!memcmp(f32, half, sizeof(float) * (size_t)(T_SHORT + 1) * (size_t)V),
              "%s %s: a batch of %d tokens must keep f32 activations", spec->arch,
              lt_type_name(wtype), T_SHORT);

    /* the default on a CPU-only session is F32 activations */
    ok = run(m, cpu, 0, tokens, T_LONG, half) == LT_OK &&
         run(m, cpu, -1, tokens, T_LONG, f32) == LT_OK;
    CHECK(ok && !memcmp(f32, half, sizeof(float) * nl), "%s %s: the CPU default is f32", spec->arch,
          lt_type_name(wtype));

    /* {CUDA0 (emulated), CPU} with the default: the forced half run's logits, and no node
     * that writes or multiplies a half activation left to the CPU */
    if (lt_cuda_compiled()) {
        struct lt_backend *bes[2] = {emu_new(), cpu};
        struct lt_session_params sp = {
            .n_ctx = T_LONG + 1, .n_seq_max = 1, .backends = bes, .n_backends = 2};
        struct lt_session *s = NULL;
        emu_half_nodes = emu_half_refused = 0;
        ok = run(m, cpu, 1, tokens, T_LONG, half) == LT_OK && lt_session_new(m, &sp, &s) == LT_OK &&
             lt_session_prefill(s, 0, tokens, T_LONG, true, f32) == LT_OK;
        CHECK(ok, "%s %s on the emulated device: %s", spec->arch, lt_type_name(wtype),
              lt_last_error());
        double e = ok ? tm_rel_err(f32, half, T_LONG * V) : 1;
        CHECK(ok && e <= 1e-6, "%s %s: emulated device vs forced half activations: %g", spec->arch,
              lt_type_name(wtype), e);
        CHECK(gap_of(bes[0])->n_computed > 0, "%s %s: nothing ran on the emulated device",
              spec->arch, lt_type_name(wtype));
        CHECK(emu_half_nodes > 0 && emu_half_refused == 0,
              "%s %s: %d nodes with half activations asked, %d refused by CUDA", spec->arch,
              lt_type_name(wtype), emu_half_nodes, emu_half_refused);
        lt_session_free(s);

        /* a decode token on the emulated device: its norms taken into the products after
         * them (RMS_NORM_MUL_MAT, the residual added by MUL_MAT_ACC), the same logits bit for
         * bit as with LATHE_FUSE_NORM_MM=0 (MUL_MAT_ADD_RMS_NORM's norms), on the CPU's kernels */
        float *dec[2] = {f32, half};
        int seen[2] = {0, 0};
        for (int off = 0; off < 2 && ok; off++) {
            if (off)
                setenv("LATHE_FUSE_NORM_MM", "0", 1);
            int seq = 0;
            emu_norm_products = 0;
            ok = lt_session_new(m, &sp, &s) == LT_OK &&
                 lt_session_prefill(s, 0, tokens, T_LONG, false, NULL) == LT_OK &&
                 lt_session_decode(s, 1, &seq, &tokens[T_LONG], dec[off]) == LT_OK;
            seen[off] = emu_norm_products;
            lt_session_free(s);
            unsetenv("LATHE_FUSE_NORM_MM");
        }
        CHECK(ok, "%s %s: decode on the emulated device: %s", spec->arch, lt_type_name(wtype),
              lt_last_error());
        CHECK(emu_half_refused == 0, "%s %s: CUDA refused %d of the decode's nodes", spec->arch,
              lt_type_name(wtype), emu_half_refused);
        CHECK(!ok || (seen[0] > 0 && seen[1] == 0),
              "%s %s: norms taken into products on the device: %d nodes, %d with the switch off",
              spec->arch, lt_type_name(wtype), seen[0], seen[1]);
        CHECK(!ok || !memcmp(f32, half, sizeof(float) * (size_t)V),
              "%s %s: decode with the norms in the products differs from MUL_MAT_ADD_RMS_NORM's",
              spec->arch, lt_type_name(wtype));
        lt_backend_free(bes[0]);
    }
    free(f32);
    free(half);
    lt_model_free(m);
    remove(path);
}

int main(void)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int i = 0; i < TM_N_SPECS; i++) {
        test_arch(&tm_specs[i], LT_TYPE_BF16, dir, cpu);
        test_arch(&tm_specs[i], LT_TYPE_F16, dir, cpu);
    }
    lt_backend_free(cpu);
    return check_summary();
}
