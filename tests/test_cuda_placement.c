/* test_cuda_placement.c: CUDA's placement of a training job, emulated on the CPU (no GPU
 * needed; skipped, 77, in a build without the CUDA backend).
 *
 * The backend (cuda_emu.h) computes with the CPU but answers supports_op with the CUDA
 * backend's own preconditions (lt_cuda_verdict, which reads types, shapes and strides only),
 * and its memory counts as device memory. So the scheduler makes exactly the placement,
 * fallbacks and copies that a job on {CUDA0, CPU} gets on a GPU, and the loss curve must
 * follow the CPU's: a difference here is the scheduler's or the graph's, one only on the GPU
 * is the kernels'. The nodes CUDA refuses are listed with CUDA's reasons. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cuda_emu.h"
#include "lathe/model.h"
#include "lathe/opt.h"
#include "lathe/train.h"
#include "test_train_tiny.h"

static char text[8192];

/* The jobs of tests/gpu/test_train_cuda.c's parity case (LoRA, or a full fine-tune), on
 * the CPU and on the emulation. With bf16, the device job rounds the operands of its
 * products by the F32 weights to BF16 (its default): every node must still be CUDA's, and
 * it must follow the CPU's F32 job to within that rounding. */
static void test_parity(struct lt_backend *cpu, struct lt_backend *dev, bool weights_on_dev,
                        bool full, bool bf16)
{
    char path[256], out[256];
    snprintf(path, sizeof(path), "/tmp/lathe-cudaplace-%d.gguf", (int)getpid());
    snprintf(out, sizeof(out), "/tmp/lathe-cudaplace-%d-out.gguf", (int)getpid());
    struct tiny_spec sp = {64, 4, 2, 128, 2, LT_TYPE_F32, 7};
    CHECK(tiny_model_write(path, &sp) == 0);
    struct lt_model *mh = NULL, *md = NULL;
    CHECK(lt_model_load(path, NULL, &mh) == LT_OK, "%s", lt_last_error());
    struct lt_model_params mp = {.weights_backend = weights_on_dev ? dev : NULL};
    CHECK(lt_model_load(path, &mp, &md) == LT_OK, "%s", lt_last_error());
    struct lt_train_params p = {.out = out,
                                .text = text,
                                .window = 64,
                                .batch_tokens = 256, /* packed steps of 4 windows, on both */
                                .epochs = 2,
                                .lr = full ? 1e-3f : 5e-3f,
                                .full = full,
                                .f32_products = !bf16,
                                .targets = full ? NULL : "attn_q,attn_v,attn_output,ffn_down"};
    struct lt_train_result rh, rd;
    struct lt_backend *both[2] = {dev, cpu};
    lt_status sh = lt_train_job_run(mh, &cpu, 1, &p, NULL, NULL, &rh);
    remove(out);
    lt_status sd = lt_train_job_run(md, both, 2, &p, NULL, NULL, &rd);
    remove(out);
    CHECK(sh == LT_OK, "CPU: %s", rh.error);
    CHECK(sd == LT_OK, "emulated CUDA: %s", rd.error);
    if (sh == LT_OK && sd == LT_OK) {
        double worst = 0;
        int n = rh.n_curve < rd.n_curve ? rh.n_curve : rd.n_curve;
        for (int i = 0; i < n; i++) {
            double d = fabs((double)rh.curve[i] - rd.curve[i]) / fmax(1e-3, fabs(rh.curve[i]));
            worst = d > worst ? d : worst;
        }
        printf("%s%s, weights in %s memory: CPU loss %.4f -> %.4f (first step %.4f); emulated CUDA "
               "%.4f -> %.4f (first step %.4f), %d fallback nodes; worst step difference %.2e "
               "over %d steps\n",
               full ? "full fine-tune" : "LoRA", bf16 ? " (BF16 products)" : "", weights_on_dev ? "device" : "host",
               rh.train_loss[0], rh.train_loss[1],
               rh.curve[0], rd.train_loss[0], rd.train_loss[1], rd.curve[0], rd.n_fallback,
               worst, n);
        CHECK(fabs(rh.curve[0] - rd.curve[0]) < 1e-4 * fabs(rh.curve[0]),
              "the first loss is the base model's on both");
        CHECK(rh.n_curve == rd.n_curve && worst < (bf16 ? 3e-2 : 1e-3),
              "emulated CUDA follows the CPU: %g", worst);
        CHECK(!bf16 || rd.n_fallback == 0, "BF16 products: every node on CUDA, not %d",
              rd.n_fallback);
        CHECK(rd.train_loss[1] < rd.train_loss[0]);
    }
    lt_train_result_free(&rh);
    lt_train_result_free(&rd);
    lt_model_free(mh);
    lt_model_free(md);
    remove(path);
}

/* The fallbacks of that job's training graph, with CUDA's reasons. */
static void list_fallbacks(struct lt_backend *cpu, struct lt_backend *dev)
{
    char path[256];
    snprintf(path, sizeof(path), "/tmp/lathe-cudaplace-%d-fb.gguf", (int)getpid());
    struct tiny_spec sp = {64, 4, 2, 128, 2, LT_TYPE_F32, 7};
    CHECK(tiny_model_write(path, &sp) == 0);
    struct lt_model *m = NULL;
    struct lt_model_params mp = {.weights_backend = dev};
    CHECK(lt_model_load(path, &mp, &m) == LT_OK, "%s", lt_last_error());
    char out[256];
    snprintf(out, sizeof(out), "/tmp/lathe-cudaplace-%d-fb-out.gguf", (int)getpid());
    struct lt_train_params p = {.out = out,
                                .text = text,
                                .window = 64,
                                .dry_run = true,
                                .targets = "attn_q,attn_v,attn_output,ffn_down"};
    struct lt_backend *both[2] = {dev, cpu};
    struct lt_train_result r;
    lt_status st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
    CHECK(st == LT_OK, "dry run: %s", r.error);
    printf("dry run on {emulated CUDA0, CPU}: %d fallback nodes\n%s\n", r.n_fallback,
           r.admission);
    lt_train_result_free(&r);
    lt_model_free(m);
    remove(path);
}

int main(void)
{
    if (!lt_cuda_compiled()) {
        printf("no CUDA build: skipped\n");
        return 77;
    }
    /* tests/gpu/test_train_cuda.c's text, so the numbers compare with its output */
    for (int i = 0; strlen(text) + 64 < sizeof(text); i++) {
        char s[64];
        snprintf(s, sizeof(s), "line %d: the quick brown fox jumps over the lazy dog. ", i % 7);
        strcat(text, s);
    }
    struct lt_backend *cpu = lt_backend_cpu_new(2), *dev = emu_new();
    CHECK(cpu && dev);
    if (!cpu || !dev)
        return check_summary();
    list_fallbacks(cpu, dev);
    test_parity(cpu, dev, true, false, false);
    test_parity(cpu, dev, false, false, false);
    test_parity(cpu, dev, true, true, false);
    test_parity(cpu, dev, true, true, true);
    CHECK(((struct emu *)dev->impl)->n_refused_runs == 0, "no refused node was run");
    lt_backend_free(dev);
    lt_backend_free(cpu);
    return check_summary();
}
