/* test_train_crossing.c: a training job on a device that has gaps, emulated on the CPU.
 * The gap backend (tests/gap_backend.h) stands in for a GPU: its memory is treated as
 * device memory (not host-addressable), it holds the weights, and it says no to a few ops,
 * so those nodes fall back to the CPU and every crossing goes through the scheduler's
 * copies, in both directions, including in-place writes. The loss curve must follow the
 * same job run on the CPU alone. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gap_backend.h"
#include "lathe/model.h"
#include "lathe/train.h"
#include "test_train_tiny.h"

static char text[8192];

int main(void)
{
    char path[256], out[256];
    snprintf(path, sizeof(path), "/tmp/lathe-crossing-%d.gguf", (int)getpid());
    snprintf(out, sizeof(out), "/tmp/lathe-crossing-%d-out.gguf", (int)getpid());
    for (size_t i = 0; i + 1 < sizeof(text); i++)
        text[i] = "the quick brown fox jumps over the lazy dog. "[i % 45];
    struct tiny_spec sp = {64, 4, 2, 128, 2, LT_TYPE_F32, 7};
    CHECK(tiny_model_write(path, &sp) == 0);
    struct lt_backend *cpu = lt_backend_cpu_new(2), *dev = gap_backend_new("DEV0");
    dev->is_host = false;
    /* gaps in the forward pass, the backward pass and the optimizer */
    gap_of(dev)->gap_always[LT_OP_GET_ROWS] = true;
    gap_of(dev)->gap_always[LT_OP_SOFT_MAX_BACK] = true;
    gap_of(dev)->gap_always[LT_OP_FLASH_ATTN_BACK] = true; /* so the chain, and its gap */
    gap_of(dev)->gap_always[LT_OP_CROSS_ENTROPY_BACK] = true;
    gap_of(dev)->gap_always[LT_OP_CPY] = true;
    struct lt_model *mh = NULL, *md = NULL;
    CHECK(lt_model_load(path, NULL, &mh) == LT_OK, "%s", lt_last_error());
    CHECK(lt_model_load(path, &(struct lt_model_params){.weights_backend = dev}, &md) == LT_OK,
          "%s", lt_last_error());
    struct lt_train_params p = {.out = out,
                                .text = text,
                                .window = 64,
                                .batch_tokens = 256, /* packed steps of 4 windows, on both */
                                .f32_products = true, /* F32 on the device too */
                                .epochs = 2,
                                .lr = 5e-3f,
                                .targets = "attn_q,attn_v,attn_output,ffn_down"};
    struct lt_train_result rh, rd;
    struct lt_backend *both[2] = {dev, cpu};
    lt_status sh = lt_train_job_run(mh, &cpu, 1, &p, NULL, NULL, &rh);
    remove(out);
    lt_status sd = lt_train_job_run(md, both, 2, &p, NULL, NULL, &rd);
    remove(out);
    CHECK(sh == LT_OK, "CPU: %s", rh.error);
    CHECK(sd == LT_OK, "device: %s", rd.error);
    if (sh == LT_OK && sd == LT_OK) {
        double worst = 0;
        int n = rh.n_curve < rd.n_curve ? rh.n_curve : rd.n_curve;
        for (int i = 0; i < n; i++) {
            double d = fabs((double)rh.curve[i] - rd.curve[i]) / fmax(1e-3, fabs(rh.curve[i]));
            worst = d > worst ? d : worst;
        }
        printf("CPU loss %.4f -> %.4f; device with gaps %.4f -> %.4f (%d fallback nodes); worst "
               "step difference %.2e over %d steps\n",
               rh.train_loss[0], rh.train_loss[1], rd.train_loss[0], rd.train_loss[1],
               rd.n_fallback, worst, n);
        CHECK(rd.n_fallback > 0, "the gaps made nodes fall back");
        CHECK(rh.n_curve == rd.n_curve && worst < 1e-3, "the device follows the CPU: %g", worst);
        CHECK(rd.train_loss[1] < rd.train_loss[0]);
    }
    lt_train_result_free(&rh);
    lt_train_result_free(&rd);
    lt_model_free(mh);
    lt_model_free(md);
    lt_backend_free(dev);
    lt_backend_free(cpu);
    remove(path);
    return check_summary();
}
