/* test_train_job.c: training jobs end to end on a tiny random model (test_train_tiny.h):
 * a LoRA job lowers the loss and writes an adapter that loads back; a full fine-tune
 * writes a model file with every key and tensor of the base and trained weights of the
 * same types; a dry run and refusals (device_only, memory) write nothing, allocate
 * nothing, and carry the refusal sentence unchanged; cancel stops a running job, leaves no
 * file and frees what it allocated; pause holds it and resume lets it finish. Chat examples
 * of different lengths are packed padding-free by default: the first step's loss (before
 * any update, over the same examples) is the one no_pack gives, and the job trains. */
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gap_backend.h"
#include "lathe/lora.h"
#include "lathe/train.h"
#include "test_train_tiny.h"

static char dir[400], model_path[600], out_path[600];
static const char *text;

static bool exists(const char *p)
{
    return access(p, F_OK) == 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

struct counter {
    int calls;
    int last_step;
    bool monotonic;
};

static void on_progress(void *user, const struct lt_train_progress *p)
{
    struct counter *c = user;
    c->monotonic = c->monotonic && p->step == c->last_step + 1 && p->n_steps > 0 &&
                   p->step <= p->n_steps && p->tokens > 0;
    c->last_step = p->step;
    c->calls++;
}

static struct lt_model *load(const char *path)
{
    struct lt_model *m = NULL;
    if (lt_model_load(path, NULL, &m) != LT_OK)
        fprintf(stderr, "load %s: %s\n", path, lt_last_error());
    return m;
}

static void test_lora_job(struct lt_model *m, struct lt_backend *cpu)
{
    remove(out_path);
    struct lt_train_params p = {.out = out_path,
                                .text = text,
                                .rank = 4,
                                .window = 32,
                                .epochs = 4,
                                .lr = 1e-2f,
                                .val_split = 0.2f,
                                .targets = "attn_q,attn_v,attn_output,ffn_down"};
    struct lt_train_result r;
    struct counter c = {0, 0, true};
    lt_status st = lt_train_job_run(m, &cpu, 1, &p, on_progress, &c, &r);
    CHECK(st == LT_OK && r.state == LT_TRAIN_DONE, "%s", r.error);
    if (st != LT_OK)
        return;
    printf("lora job: %d train / %d val windows, %d steps, train loss %.3f -> %.3f, eval %.3f -> "
           "%.3f, %.0f tokens/s, estimate %.2f MiB, allocated %.2f MiB\n",
           r.n_train, r.n_val, r.n_curve, r.train_loss[0], r.train_loss[r.n_epochs - 1],
           r.eval_loss[0], r.eval_loss[r.n_epochs - 1], r.tokens_per_s,
           (double)r.peak_bytes / (1 << 20), (double)r.allocated_bytes / (1 << 20));
    CHECK(r.n_epochs == 4 && r.n_val >= 1 && r.n_train >= 4, "epochs %d, split %d/%d", r.n_epochs,
          r.n_train, r.n_val);
    CHECK(r.train_loss[3] < 0.8f * r.train_loss[0], "train loss fell: %g -> %g", r.train_loss[0],
          r.train_loss[3]);
    CHECK(r.eval_loss[3] < r.eval_loss[0], "eval loss fell: %g -> %g", r.eval_loss[0],
          r.eval_loss[3]);
    CHECK(r.curve[0] > 4.0f, "the first step's loss %g is near log(259) = 5.56 (B = 0: the base)",
          r.curve[0]);
    CHECK(c.calls == r.n_curve && c.monotonic && r.n_curve == 4 * r.n_train, "progress: %d calls",
          c.calls);
    CHECK(r.tokens > 0 && r.tokens_per_s > 0 && r.seconds > 0, "throughput");
    CHECK(r.peak_bytes > 0 && r.allocated_bytes > 0 && r.n_trainable == 16, "admission numbers: %d",
          r.n_trainable);
    CHECK(r.n_trainable_elements ==
              2 * (4 * (32 + 32) + 4 * (32 + 16) + 4 * (32 + 32) + 4 * (64 + 32)),
          "trainable elements %lld", (long long)r.n_trainable_elements);
    CHECK(strstr(r.admission, "memory estimate") != NULL, "admission text: %s", r.admission);
    struct lt_lora *l = NULL;
    CHECK(exists(out_path) && lt_lora_load(out_path, &l) == LT_OK, "%s", lt_last_error());
    if (l) {
        CHECK(lt_lora_check(l, m) == LT_OK && l->n_pairs == 8 && l->alpha == 8,
              "the adapter fits the model: %d pairs, alpha %g", l->n_pairs, l->alpha);
        double bsum = 0;
        for (int i = 0; i < l->n_pairs; i++)
            for (int64_t k = 0; k < lt_nelements(l->pairs[i].b); k++)
                bsum += fabsf(((float *)l->pairs[i].b->data)[k]);
        CHECK(bsum > 0, "B trained away from zero");
        lt_lora_free(l);
    }
    char svg[700];
    snprintf(svg, sizeof(svg), "%s/test_train_job.svg", dir);
    CHECK(lt_train_plot_svg(&r, svg) == LT_OK, "%s", lt_last_error());
    FILE *f = fopen(svg, "r");
    char buf[8192] = {0};
    if (f) {
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = 0;
        fclose(f);
    }
    CHECK(strstr(buf, "<svg") && strstr(buf, "<polyline") && strstr(buf, "eval"), "svg");
    remove(svg);
    lt_train_result_free(&r);
    remove(out_path);
}

static void test_dry_run_and_refusals(struct lt_model *m)
{
    remove(out_path);
    struct lt_backend *gap = gap_backend_new("GAP0");
    struct lt_backend *cpu = lt_backend_cpu_new(1);
    struct lt_backend *both[2] = {gap, cpu};
    struct lt_train_params p = {.out = out_path, .text = text, .window = 32, .dry_run = true};
    struct lt_train_result r;
    CHECK(lt_train_job_run(m, both, 2, &p, NULL, NULL, &r) == LT_OK && r.state == LT_TRAIN_DONE,
          "dry run: %s", r.error);
    CHECK(!exists(out_path) && r.allocated_bytes == 0 && gap_of(gap)->bytes_allocated == 0,
          "a dry run writes and allocates nothing");
    CHECK(r.peak_bytes > 0 && r.n_fallback == 0 && strstr(r.admission, "GAP0"),
          "dry run report: %s", r.admission);
    lt_train_result_free(&r);

    /* the device can't run SOFT_MAX_BACK: allowed by default (fallback), refused device_only */
    gap_of(gap)->gap_always[LT_OP_SOFT_MAX_BACK] = true;
    gap_of(gap)->gap_always[LT_OP_FLASH_ATTN_BACK] = true; /* so the chain, and its gap */
    CHECK(lt_train_job_run(m, both, 2, &p, NULL, NULL, &r) == LT_OK && r.n_fallback > 0,
          "fallback reported: %d nodes", r.n_fallback);
    lt_train_result_free(&r);
    p.dry_run = false;
    p.device_only = true;
    lt_status st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
    CHECK(st == LT_ERR_REFUSED && r.state == LT_TRAIN_ERROR &&
              r.refusal.kind == LT_REFUSAL_DEVICE_ONLY,
          "device_only refusal: %s", r.error);
    /* the node itself may be unnamed (backward ops are named by their rules); its source is */
    CHECK(!strcmp(r.refusal.op, "SOFT_MAX_BACK") && r.refusal.source[0] &&
              strstr(r.refusal.sentence, "SOFT_MAX_BACK") &&
              strstr(r.refusal.sentence, r.refusal.source),
          "names op %s, node '%s', source '%s': %s", r.refusal.op, r.refusal.node, r.refusal.source,
          r.refusal.sentence);
    CHECK(!strcmp(r.error, r.refusal.sentence) && !strcmp(lt_last_error(), r.refusal.sentence),
          "the sentence is carried unchanged: %s", r.error);
    CHECK(!exists(out_path) && gap_of(gap)->bytes_allocated == 0,
          "refused: nothing written or allocated");
    lt_train_result_free(&r);

    gap_of(gap)->gap_always[LT_OP_SOFT_MAX_BACK] = false;
    gap_of(gap)->gap_always[LT_OP_FLASH_ATTN_BACK] = false;
    p.device_only = false;
    p.memory_budget_mib = 1;
    p.window = 512; /* attention scores alone: 512 x 512 x 4 heads x 4 bytes per layer */
    st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
    CHECK(st == LT_ERR_REFUSED && r.refusal.kind == LT_REFUSAL_MEMORY &&
              r.refusal.budget_bytes == (1u << 20) && r.refusal.need_bytes > (1u << 20),
          "memory refusal: %s", r.error);
    CHECK(!exists(out_path) && gap_of(gap)->bytes_allocated == 0, "nothing written or allocated");
    lt_train_result_free(&r);

    /* bad parameters: nothing starts */
    struct lt_train_job *job = NULL;
    struct lt_train_params bad = {.out = out_path, .text = text, .epochs = -1};
    CHECK(lt_train_job_start(m, both, 2, &bad, NULL, NULL, &job) == LT_ERR_INVALID && !job &&
              strstr(lt_last_error(), "epochs"),
          "%s", lt_last_error());
    /* a missing file: an error naming it, no output */
    struct lt_train_params missing = {.out = out_path, .text_path = "/nonexistent/x.txt"};
    CHECK(lt_train_job_run(m, both, 2, &missing, NULL, NULL, &r) == LT_ERR_IO &&
              strstr(r.error, "/nonexistent/x.txt") && !exists(out_path),
          "%s", r.error);
    lt_train_result_free(&r);

    /* an output nobody can write: refused before anything else, in a dry run too */
    for (int dry = 0; dry < 2; dry++) {
        struct lt_train_params nodir = {
            .out = "/nonexistent-dir/x.gguf", .text = text, .window = 32, .dry_run = dry};
        CHECK(lt_train_job_run(m, both, 2, &nodir, NULL, NULL, &r) == LT_ERR_IO &&
                  strstr(r.error, "cannot write the output '/nonexistent-dir/x.gguf'") &&
                  r.tokens == 0 && r.peak_bytes == 0,
              "unwritable output (dry run %d): %s", dry, r.error);
        lt_train_result_free(&r);
    }

    /* a budget larger than the device has lowers nothing and raises nothing */
    p = (struct lt_train_params){
        .out = out_path, .text = text, .window = 32, .dry_run = true, .memory_budget_mib = 1u << 30};
    gap_of(gap)->mem_free = 64u << 10; /* 64 KiB free: the job does not fit */
    st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
    CHECK(st == LT_ERR_REFUSED && r.refusal.kind == LT_REFUSAL_MEMORY &&
              r.refusal.budget_bytes <= (64u << 10),
          "a client's 1 TiB budget is capped by the device's free memory: %s", r.error);
    lt_train_result_free(&r);
    lt_backend_free(gap);
    lt_backend_free(cpu);
}

/* --checkpoint auto: without checkpointing where the job fits, else selective where that
 * fits, else whole layers, else a refusal. A model whose FFN is wide (SwiGLU's output, which
 * selective recomputes, is as large as the gate and up products, which only whole layers
 * do), short windows (the attention scores, kept by both, stay small). Each mode's need
 * comes from its own refusal under a 1 MiB budget; budgets between them pick each mode. */
static void test_checkpoint_ladder(void)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/test_train_job_wide.gguf", dir);
    struct tiny_spec sp = {64, 2, 1, 512, 4, LT_TYPE_F32, 11};
    struct lt_model *m = tiny_model_write(path, &sp) == 0 ? load(path) : NULL;
    CHECK(m != NULL, "the wide model");
    if (!m)
        return;
    struct lt_backend *gap = gap_backend_new("GAP0");
    struct lt_backend *cpu = lt_backend_cpu_new(1);
    struct lt_backend *both[2] = {gap, cpu};
    struct lt_train_params p = {.out = out_path,
                                .text = text,
                                .window = 32,
                                .batch_tokens = 4096,
                                .full = true,
                                .dry_run = true,
                                .memory_budget_mib = 1};
    static const enum lt_checkpoint modes[3] = {LT_CHECKPOINT_OFF, LT_CHECKPOINT_SELECTIVE,
                                                LT_CHECKPOINT_ON};
    static const char *const names[3] = {"off", "selective", "on"};
    size_t need[3] = {0};
    struct lt_train_result r;
    for (int i = 0; i < 3; i++) {
        p.checkpoint = modes[i];
        const lt_status st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
        need[i] = st == LT_ERR_REFUSED ? r.refusal.need_bytes : 0;
        lt_train_result_free(&r);
    }
    const size_t mib = 1u << 20;
    CHECK(need[0] > need[1] + 2 * mib && need[1] > need[2] + 2 * mib && need[2] > 2 * mib,
          "needs %zu (off) > %zu (selective) > %zu (on), a MiB or more apart", need[0], need[1],
          need[2]);
    p.checkpoint = LT_CHECKPOINT_AUTO;
    for (int i = 0; i < 4 && need[2] > 2 * mib; i++) {
        /* room for mode i alone (and those before it refused): between its need and the
         * need of the mode before it; i = 3: under every need */
        p.memory_budget_mib = i == 0  ? need[0] / mib + 2
                              : i < 3 ? need[i] / mib + 1
                                      : need[2] / mib - 1;
        const lt_status st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
        if (i == 3)
            CHECK(st == LT_ERR_REFUSED && r.refusal.kind == LT_REFUSAL_MEMORY,
                  "auto under every need: refused (%s)", r.error);
        else
            CHECK(st == LT_OK && (r.n_recomputed > 0) == (i > 0) &&
                      r.recompute_selective == (i == 1),
                  "auto with a budget of %zu MiB: %s, %d tensors recomputed%s (want %s)",
                  p.memory_budget_mib, st == LT_OK ? "admitted" : r.error, r.n_recomputed,
                  r.recompute_selective ? ", selective" : "", names[i]);
        lt_train_result_free(&r);
    }
    printf("checkpoint auto: needs %.1f / %.1f / %.1f MiB (off / selective / on), each taken "
           "under its budget\n",
           need[0] / (double)mib, need[1] / (double)mib, need[2] / (double)mib);
    lt_backend_free(gap);
    lt_backend_free(cpu);
    lt_model_free(m);
    remove(path);
}

static enum lt_train_state wait_for(struct lt_train_job *job, int min_step, enum lt_train_state s)
{
    struct lt_train_progress pr;
    for (int i = 0; i < 3000; i++) {
        lt_train_job_progress(job, &pr);
        if ((min_step > 0 && pr.step >= min_step) || (s != LT_TRAIN_IDLE && pr.state == s) ||
            pr.state == LT_TRAIN_DONE || pr.state == LT_TRAIN_ERROR)
            break;
        sleep_ms(5);
    }
    return pr.state;
}

static void test_cancel_pause(struct lt_model *m)
{
    remove(out_path);
    struct lt_backend *gap = gap_backend_new("GAP0");
    struct lt_train_params p = {
        .out = out_path, .text = text, .window = 32, .epochs = LT_TRAIN_MAX_EPOCHS};
    struct lt_train_job *job;
    CHECK(lt_train_job_start(m, &gap, 1, &p, NULL, NULL, &job) == LT_OK, "%s", lt_last_error());
    wait_for(job, 2, LT_TRAIN_IDLE);
    lt_train_job_pause(job);
    CHECK(wait_for(job, 0, LT_TRAIN_PAUSED) == LT_TRAIN_PAUSED, "paused");
    struct lt_train_progress a, b;
    lt_train_job_progress(job, &a);
    sleep_ms(200);
    lt_train_job_progress(job, &b);
    CHECK(a.step == b.step && a.step >= 2 && b.state == LT_TRAIN_PAUSED,
          "no step while paused: %d -> %d", a.step, b.step);
    size_t live = gap_of(gap)->bytes_live;
    CHECK(live > 0, "the running job holds its memory: %zu bytes", live);
    lt_train_job_resume(job);
    wait_for(job, a.step + 2, LT_TRAIN_IDLE);
    lt_train_job_progress(job, &b);
    CHECK(b.step >= a.step + 2 && b.state == LT_TRAIN_RUNNING, "resumed: step %d", b.step);
    lt_train_job_cancel(job);
    struct lt_train_result r;
    lt_train_job_wait(job, &r);
    CHECK(r.state == LT_TRAIN_CANCELLED && r.status == LT_ERR_CANCELLED, "cancelled: %s",
          lt_train_state_name(r.state));
    CHECK(lt_train_job_state(job) == LT_TRAIN_CANCELLED, "state");
    CHECK(!exists(out_path), "a cancelled job leaves no file");
    CHECK(gap_of(gap)->bytes_live == 0 && gap_of(gap)->bytes_allocated > 0,
          "its memory is freed: %zu bytes live of %zu allocated", gap_of(gap)->bytes_live,
          gap_of(gap)->bytes_allocated);
    lt_train_result_free(&r);
    lt_train_job_free(job);

    /* freeing a running job cancels it */
    CHECK(lt_train_job_start(m, &gap, 1, &p, NULL, NULL, &job) == LT_OK, "%s", lt_last_error());
    wait_for(job, 1, LT_TRAIN_IDLE);
    lt_train_job_free(job);
    CHECK(!exists(out_path) && gap_of(gap)->bytes_live == 0, "free cancels and releases");
    lt_backend_free(gap);
}

/* A backend that is not the host (the gap backend, claiming device memory): trainables
 * must move to it, or every optimizer step would update a copy and be lost. */
static void test_device_backend(struct lt_model *m)
{
    remove(out_path);
    struct lt_backend *dev = gap_backend_new("DEV0");
    dev->is_host = false;
    struct lt_train_params p = {.out = out_path,
                                .text = text,
                                .rank = 4,
                                .window = 32,
                                .epochs = 2,
                                .lr = 1e-2f,
                                .targets = "attn_q,attn_v"};
    struct lt_train_result r;
    lt_status st = lt_train_job_run(m, &dev, 1, &p, NULL, NULL, &r);
    CHECK(st == LT_OK, "%s", r.error);
    CHECK(st != LT_OK || r.train_loss[1] < r.train_loss[0], "loss fell on the device: %g -> %g",
          r.train_loss[0], r.train_loss[1]);
    CHECK(gap_of(dev)->bytes_live == 0, "device memory freed: %zu", gap_of(dev)->bytes_live);
    struct lt_lora *l = NULL;
    CHECK(lt_lora_load(out_path, &l) == LT_OK, "%s", lt_last_error());
    if (l) {
        double bsum = 0;
        for (int i = 0; i < l->n_pairs; i++)
            for (int64_t k = 0; k < lt_nelements(l->pairs[i].b); k++)
                bsum += fabsf(((float *)l->pairs[i].b->data)[k]);
        CHECK(bsum > 0, "the saved B comes from the device, trained");
        lt_lora_free(l);
    }
    lt_train_result_free(&r);
    /* the trainables join the budget check on a device */
    p.dry_run = true;
    CHECK(lt_train_job_run(m, &dev, 1, &p, NULL, NULL, &r) == LT_OK && r.allocated_bytes == 0 &&
              gap_of(dev)->bytes_live == 0,
          "dry run on the device: %s", r.error);
    lt_train_result_free(&r);
    lt_backend_free(dev);
    remove(out_path);
}

static void test_full(struct lt_backend *cpu, enum lt_type wtype)
{
    char base_path[700];
    snprintf(base_path, sizeof(base_path), "%s/test_train_job_full.gguf", dir);
    struct tiny_spec sp = {32, 4, 2, 64, 2, wtype, 11};
    if (tiny_model_write(base_path, &sp) != 0)
        return;
    struct lt_model *m = load(base_path);
    if (!m)
        return;
    remove(out_path);
    struct lt_train_params p = {
        .out = out_path, .text = text, .window = 32, .epochs = 2, .full = true, .lr = 3e-3f};
    struct lt_train_result r;
    lt_status st = lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r);
    if (wtype == LT_TYPE_Q8_0) {
        CHECK(st == LT_ERR_INVALID && strstr(r.error, "F32, F16 or BF16") && !exists(out_path),
              "full fine-tuning of a Q8_0 model is refused: %s", r.error);
        goto out_free;
    }
    CHECK(st == LT_OK, "%s", r.error);
    if (st != LT_OK)
        goto out_free;
    printf("full %s: train loss %.3f -> %.3f, %d trainable tensors\n", lt_type_name(wtype),
           r.train_loss[0], r.train_loss[1], r.n_trainable);
    CHECK(r.train_loss[1] < r.train_loss[0], "loss fell");
    CHECK(r.n_trainable == 3 + 9 * 2, "every weight trains: %d", r.n_trainable);
    struct lt_gguf *a = NULL, *b = NULL;
    CHECK(lt_gguf_open(base_path, &a) == LT_OK && lt_gguf_open(out_path, &b) == LT_OK, "%s",
          lt_last_error());
    if (a && b) {
        bool keys = lt_gguf_n_kv(a) == lt_gguf_n_kv(b);
        for (int64_t i = 0; keys && i < lt_gguf_n_kv(a); i++)
            keys = !strcmp(lt_gguf_key(a, i), lt_gguf_key(b, i)) &&
                   lt_gguf_kv_type(a, i) == lt_gguf_kv_type(b, i);
        CHECK(keys, "every metadata key kept");
        const char *name;
        CHECK(lt_gguf_get_str(b, "general.name", &name) == LT_OK &&
                  !strcmp(name, "tiny test model"),
              "general.name");
        bool same_layout = lt_gguf_n_tensors(a) == lt_gguf_n_tensors(b);
        int changed = 0;
        for (int64_t i = 0; same_layout && i < lt_gguf_n_tensors(a); i++) {
            const struct lt_gguf_tensor_info *ta = lt_gguf_tensor(a, i), *tb = lt_gguf_tensor(b, i);
            same_layout = !strcmp(ta->name, tb->name) && ta->type == tb->type &&
                          ta->nbytes == tb->nbytes && !memcmp(ta->ne, tb->ne, sizeof(ta->ne));
            changed += same_layout && memcmp(ta->data, tb->data, ta->nbytes) != 0;
        }
        CHECK(same_layout, "same tensors, types and shapes");
        CHECK(changed == (int)lt_gguf_n_tensors(a), "every weight changed: %d of %lld", changed,
              (long long)lt_gguf_n_tensors(a));
    }
    lt_gguf_close(a);
    lt_gguf_close(b);
    struct lt_model *m2 = load(out_path);
    CHECK(m2 != NULL, "the fine-tuned model loads");
    lt_model_free(m2);
    lt_train_result_free(&r);
out_free:
    remove(out_path);
    lt_model_free(m);
    remove(base_path);
}

/* LoRA over frozen F16, BF16 and Q8_0 bases: the gradient flows through the dequantised
 * weight to the activations. */
static void test_lora_bases(struct lt_backend *cpu)
{
    const enum lt_type types[] = {LT_TYPE_F16, LT_TYPE_BF16, LT_TYPE_Q8_0};
    char base_path[700];
    snprintf(base_path, sizeof(base_path), "%s/test_train_job_base.gguf", dir);
    for (int t = 0; t < 3; t++) {
        struct tiny_spec sp = {32, 4, 2, 64, 2, types[t], 13};
        if (tiny_model_write(base_path, &sp) != 0)
            continue;
        struct lt_model *m = load(base_path);
        if (!m)
            continue;
        remove(out_path);
        struct lt_train_params p = {.out = out_path,
                                    .text = text,
                                    .window = 32,
                                    .epochs = 2,
                                    .lr = 1e-2f,
                                    .targets = "attn_q,attn_v,ffn_up,ffn_down"};
        struct lt_train_result r;
        lt_status st = lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r);
        CHECK(st == LT_OK, "%s base: %s", lt_type_name(types[t]), r.error);
        if (st == LT_OK) {
            printf("LoRA on a %s base: train loss %.3f -> %.3f\n", lt_type_name(types[t]),
                   r.train_loss[0], r.train_loss[1]);
            CHECK(r.train_loss[1] < 0.95f * r.train_loss[0] && exists(out_path), "%s: loss fell",
                  lt_type_name(types[t]));
        }
        lt_train_result_free(&r);
        lt_model_free(m);
        remove(out_path);
    }
    remove(base_path);
}

/* Chat examples through the job: loss on the answers only, and the window refusal names the
 * example unless a fit policy is given. */
static void test_chat_job(struct lt_model *m, struct lt_backend *cpu)
{
    remove(out_path);
    static char ex[8192];
    ex[0] = 0;
    for (int i = 0; i < 8; i++) {
        char line[256];
        snprintf(line, sizeof(line),
                 "{\"prompt\": \"what is %d plus %d?\", \"completion\": \"it is %d.\"}\n", i, i,
                 2 * i);
        strcat(ex, line);
    }
    strcat(ex, "{\"messages\": [{\"role\": \"user\", \"content\": \"a very long question that "
               "goes on and on and on\"}, {\"role\": \"assistant\", \"content\": \"yes.\"}]}\n");
    struct lt_train_params p = {.out = out_path,
                                .examples = ex,
                                .window = 48,
                                .epochs = 3,
                                .lr = 1e-2f,
                                .val_split = 0.25f};
    struct lt_train_result r;
    CHECK(lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r) == LT_ERR_INVALID &&
              strstr(r.error, "example 8 (line 9)") && !exists(out_path),
          "too long: %s", r.error);
    lt_train_result_free(&r);
    p.fit = LT_FIT_LEFT;
    lt_status st = lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r);
    CHECK(st == LT_OK && r.n_train + r.n_val == 9 && r.n_val == 2 && r.n_tokens_graph == 48,
          "chat job: %s (%d + %d examples, %d tokens)", r.error, r.n_train, r.n_val,
          r.n_tokens_graph);
    if (st == LT_OK)
        CHECK(r.train_loss[2] < r.train_loss[0] && isfinite(r.eval_loss[2]), "loss %g -> %g",
              r.train_loss[0], r.train_loss[2]);
    lt_train_result_free(&r);
    remove(out_path);
}

static void test_packed_job(struct lt_model *m, struct lt_backend *cpu)
{
    static char ex[8192];
    ex[0] = 0;
    for (int i = 0; i < 12; i++) { /* one question in four long, the others short */
        char line[512], q[256] = "";
        for (int w = 0; w < (i % 4 == 0 ? 12 : 1); w++)
            strcat(q, w % 2 ? "very " : "big ");
        snprintf(line, sizeof(line), "{\"prompt\": \"is %d %s?\", \"completion\": \"it is %d.\"}\n",
                 i, q, 2 * i);
        strcat(ex, line);
    }
    float first[2] = {NAN, NAN};
    for (int no_pack = 0; no_pack < 2; no_pack++) {
        remove(out_path);
        struct lt_train_params p = {.out = out_path,
                                    .examples = ex,
                                    .window = 256,
                                    .epochs = 2,
                                    .lr = 1e-2f,
                                    .batch = 12,
                                    .no_pack = no_pack};
        struct lt_train_result r;
        lt_status st = lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r);
        CHECK(st == LT_OK && r.packed == !no_pack && r.n_curve == 2, "%s job: %s (packed %d)",
              no_pack ? "padded" : "packed", r.error, (int)r.packed);
        if (st == LT_OK) {
            first[no_pack] = r.curve[0];
            CHECK(r.curve[1] < r.curve[0], "%s job: loss %g -> %g", no_pack ? "padded" : "packed",
                  (double)r.curve[0], (double)r.curve[1]);
            printf("%s: %d x %d tokens, %d micro-batches a step, loss %.5f -> %.5f\n",
                   no_pack ? "padded" : "packed", r.n_seqs_graph, r.n_tokens_graph, r.grad_accum,
                   (double)r.curve[0], (double)r.curve[1]);
        }
        lt_train_result_free(&r);
    }
    CHECK(fabsf(first[0] - first[1]) <= 1e-5f * fabsf(first[1]),
          "the first step's loss over the same examples: packed %.7f, padded %.7f",
          (double)first[0], (double)first[1]);
    remove(out_path);
}

int main(void)
{
    tiny_path(dir, sizeof(dir), "");
    dir[strlen(dir) - 1] = 0; /* drop the trailing '/' */
    snprintf(model_path, sizeof(model_path), "%s/test_train_job.gguf", dir);
    snprintf(out_path, sizeof(out_path), "%s/test_train_job_out.gguf", dir);
    text = tiny_train_text();
    struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 7};
    if (tiny_model_write(model_path, &sp) != 0)
        return 1;
    struct lt_model *m = load(model_path);
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    if (m) {
        test_lora_job(m, cpu);
        test_dry_run_and_refusals(m);
        test_cancel_pause(m);
        test_device_backend(m);
        test_chat_job(m, cpu);
        test_packed_job(m, cpu);
        lt_model_free(m);
    }
    test_checkpoint_ladder();
    test_lora_bases(cpu);
    test_full(cpu, LT_TYPE_F32);
    test_full(cpu, LT_TYPE_F16);
    test_full(cpu, LT_TYPE_BF16);
    test_full(cpu, LT_TYPE_Q8_0);
    lt_backend_free(cpu);
    remove(model_path);
    return check_summary();
}
