/* test_train_cpu.c: end-to-end training on the CPU. A two-layer attention + SwiGLU model
 * (tests/tiny_model.h) learns a fixed token sequence with AdamW through the training-graph
 * API; the loss must fall well below its start, and two runs must agree bit for bit. */
#include <string.h>

#include "check.h"
#include "lathe/opt.h"
#include "tiny_model.h"

#define T 24
#define STEPS 150

static int schedule_calls;
/* linear warm-up over 10 steps, then constant */
static float warmup(void *user, int step, float lr)
{
    (void)user;
    schedule_calls++;
    return step < 10 ? lr * (float)step / 10.0f : lr;
}

static void run(float *losses)
{
    struct tiny_model m;
    tiny_model_init(&m, 40, 32, 4, 64, 2, 42);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *tokens = lt_new_tensor_1d(ctx, LT_TYPE_I32, T);
    struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, T);
    struct lt_tensor *labels = lt_new_tensor_1d(ctx, LT_TYPE_I32, T);
    struct lt_tensor *loss = tiny_model_loss(&m, ctx, tokens, pos, labels);
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_train_graph_params p = {.backends = &cpu, .n_backends = 1, .device_only = true,
                                      .weight_decay = 0.01f, .lr_schedule = warmup};
    struct lt_train_graph *tg;
    struct lt_refusal r;
    lt_status st = lt_train_graph_new(ctx, loss, &p, &tg, &r);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        goto out_free;
    struct lt_tensor *w = m.layers[0].wq;
    void *home = w->data; /* the tensor's own storage */
    CHECK(lt_train_graph_alloc(tg) == LT_OK, "%s", lt_last_error());
    int32_t tok[T], ps[T], lab[T];
    for (int i = 0; i < T; i++) {
        tok[i] = (i * 7 + 3) % 40; /* a fixed, learnable sequence */
        ps[i] = i;
    }
    for (int i = 0; i < T; i++)
        lab[i] = i + 1 < T ? tok[i + 1] : -1;
    lt_tensor_set(tokens, tok, 0, sizeof(tok));
    lt_tensor_set(pos, ps, 0, sizeof(ps));
    lt_tensor_set(labels, lab, 0, sizeof(lab));
    for (int s = 0; s < STEPS; s++) {
        st = lt_train_graph_accumulate(tg, &losses[s]);
        if (st == LT_OK)
            st = lt_train_graph_step(tg, 3e-3f);
        if (st != LT_OK) {
            CHECK(st == LT_OK, "step %d: %s", s, lt_last_error());
            break;
        }
    }
    /* the optimizer state is flat: while allocated, a trainable tensor lives in it; freed,
     * it is back in its own storage with the trained values */
    float trained[4];
    lt_tensor_get(w, trained, 0, sizeof(trained));
    CHECK(w->data != home && memcmp(trained, home, sizeof(trained)) != 0,
          "while allocated, the tensor lives in the flat state, its own storage untouched");
    lt_train_graph_free(tg);
    CHECK(w->data == home && memcmp(trained, home, sizeof(trained)) == 0,
          "after free the tensor holds its trained values in its own storage");
out_free:
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
    tiny_model_free(&m);
}

int main(void)
{
    static float a[STEPS], b[STEPS];
    run(a);
    run(b);
    printf("loss: step 0 %.4f, step 50 %.4f, step 100 %.4f, step %d %.4f\n", a[0], a[50], a[100],
           STEPS - 1, a[STEPS - 1]);
    CHECK(a[0] > 3.0f, "the first loss %g is near log(40) = 3.69", a[0]);
    CHECK(a[STEPS - 1] < 0.25f * a[0], "loss fell from %g to %g", a[0], a[STEPS - 1]);
    CHECK(memcmp(a, b, sizeof(a)) == 0, "two runs gave different losses");
    CHECK(schedule_calls == 2 * STEPS, "the schedule was asked %d times", schedule_calls);
    return check_summary();
}
