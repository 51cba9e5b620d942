/* test_train_cuda.c: training jobs on the GPU (issue 7's H200 items). Skipped (77) without
 * a CUDA device.
 *
 * 1. Parity: the same LoRA job on a tiny model on the CPU and on {CUDA0, CPU} gives the same
 *    loss curve (to float rounding), and a full fine-tune on CUDA lowers the loss.
 * 2. The refusal path: with LATHE_CUDA_DISABLE_OPS=SOFT_MAX_BACK and device_only, the job is
 *    refused naming the op, nothing is written; a dry run says the same; without device_only
 *    the dry run reports the fallback nodes instead.
 * 3. Scale: a Qwen3.5-0.8B-shaped and a Qwen2.5-1.5B-shaped model (random weights, real
 *    dimensions and vocabulary sizes) as BF16 and Q8_0 bases: LoRA (all layers, and
 *    top_layers 4) and a full fine-tune of the BF16 model each run an epoch with no refusal
 *    and a falling loss; tokens/s and peak memory are printed.
 * Part 3 writes several GB and takes minutes: it runs only with LATHE_TRAIN_CUDA_SCALE=1
 * (LATHE_TRAIN_CUDA_SCALE=qwen35: the 0.8B-shaped model alone). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "lathe/backend_cuda.h"
#include "lathe/lora.h"
#include "lathe/train.h"
#include "test_model_util.h"
#include "test_train_tiny.h"

static char dir[400], out_path[600];
static char text[8192];

static bool exists(const char *p)
{
    return access(p, F_OK) == 0;
}

static struct lt_model *load(const char *path, struct lt_backend *weights_be)
{
    struct lt_model_params mp = {.weights_backend = weights_be};
    struct lt_model *m = NULL;
    if (lt_model_load(path, &mp, &m) != LT_OK)
        fprintf(stderr, "load %s: %s\n", path, lt_last_error());
    return m;
}

/* ---- 1. parity ---- */

/* the largest relative difference of job b's loss from reference job a's over their first
 * 30 steps */
static double worst_step(const struct lt_train_result *a, const struct lt_train_result *b)
{
    double worst = 0;
    int n = a->n_curve < b->n_curve ? a->n_curve : b->n_curve;
    for (int i = 0; i < n && i < 30; i++) {
        double d = fabs((double)a->curve[i] - b->curve[i]) / fmax(1e-3, fabs(a->curve[i]));
        worst = d > worst ? d : worst;
    }
    return worst;
}

static void test_parity(struct lt_backend *cuda, struct lt_backend *cpu)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/test_train_cuda_tiny.gguf", dir);
    struct tiny_spec sp = {64, 4, 2, 128, 2, LT_TYPE_F32, 7};
    if (tiny_model_write(path, &sp))
        return;
    struct lt_model *mh = load(path, NULL), *md = load(path, cuda);
    if (!mh || !md) {
        CHECK(0, "tiny model");
        goto out_free;
    }
    /* the same packed steps on both, in F32 (a device's default rounds the products by the
     * tiny model's F32 weights to BF16: the full fine-tune below runs that way) */
    struct lt_train_params p = {.out = out_path,
                                .text = text,
                                .window = 64,
                                .batch_tokens = 256,
                                .f32_products = true,
                                .epochs = 2,
                                .lr = 5e-3f,
                                .targets = "attn_q,attn_v,attn_output,ffn_down"};
    struct lt_train_result rh, rd;
    struct lt_backend *both[2] = {cuda, cpu};
    size_t held0 = 0, held1 = 0;
    (void)lt_backend_scratch_bytes(cuda, NULL, 0, &held0);
    lt_status sh = lt_train_job_run(mh, &cpu, 1, &p, NULL, NULL, &rh);
    lt_status sd = lt_train_job_run(md, both, 2, &p, NULL, NULL, &rd);
    CHECK(sh == LT_OK, "CPU: %s", rh.error);
    CHECK(sd == LT_OK, "CUDA: %s", rd.error);
    /* the estimate counts the device's memory in use before the job and the scratch its
     * kernels grow (LATHE_CUDA_CHECK_SCRATCH fails any request past its family's figure) */
    (void)lt_backend_scratch_bytes(cuda, NULL, 0, &held1);
    printf("tiny LoRA on CUDA: estimate %zu bytes (in use before %zu, scratch %zu), allocated "
           "%zu; the scratch grew %zu -> %zu bytes\n",
           rd.peak_bytes, rd.in_use_bytes, rd.scratch_bytes, rd.allocated_bytes, held0, held1);
    CHECK(sd != LT_OK || (rd.in_use_bytes > 0 && rd.scratch_bytes > 0 &&
                          rd.peak_bytes >= rd.allocated_bytes + rd.in_use_bytes),
          "the estimate counts the device in use (%zu) and the scratch (%zu)", rd.in_use_bytes,
          rd.scratch_bytes);
    CHECK(sd != LT_OK || held1 <= held0 + rd.scratch_bytes,
          "the scratch grew past the estimate's: %zu -> %zu, estimated %zu more", held0, held1,
          rd.scratch_bytes);
    if (sh == LT_OK && sd == LT_OK) {
        const double worst = worst_step(&rh, &rd);
        /* train_loss[e] is epoch e's mean; curve[0] is the first step's loss, the base
         * model's on both (LoRA B starts at zero) */
        printf(
            "tiny LoRA: CPU epoch loss %.4f -> %.4f (first step %.4f), CUDA %.4f -> %.4f (first "
            "step %.4f) (worst step difference %.2e over 30 steps); CUDA %.0f tokens/s, %d "
            "fallback nodes, peak %.1f MiB\n",
            rh.train_loss[0], rh.train_loss[1], rh.curve[0], rd.train_loss[0], rd.train_loss[1],
            rd.curve[0], worst, rd.tokens_per_s, rd.n_fallback, (double)rd.peak_bytes / (1 << 20));
        CHECK(fabs(rh.curve[0] - rd.curve[0]) < 1e-4 * fabs(rh.curve[0]),
              "the first step's loss is the base model's on both: %g vs %g", rh.curve[0],
              rd.curve[0]);
        /* tests/test_cuda_placement.c emulates this job's placement with CUDA's own
         * preconditions: nothing falls back (with 8935ef1's placement by storage the 16
         * ADAMW steps did, and their updates were lost) */
        CHECK(rd.n_fallback == 0, "the tiny LoRA job runs entirely on CUDA0: %d fallback nodes",
              rd.n_fallback);
        if (rd.n_fallback)
            printf("%s\n", rd.admission);
        CHECK(rh.n_curve == rd.n_curve && worst < 2e-2, "CUDA follows the CPU's loss curve: %g",
              worst);
        CHECK(rd.train_loss[1] < rd.train_loss[0], "the CUDA job lowers the loss");
    }
    const double cpu_first = sh == LT_OK && rh.n_curve > 0 ? rh.curve[0] : NAN;
    lt_train_result_free(&rh);
    lt_train_result_free(&rd);
    remove(out_path);
    /* the same LoRA job at the device's own precision (BF16 products: the adapters' products
     * on BF16 operands, the frozen base product added over their output in place by
     * MUL_MAT_ACC, one BF16 rounding of each output gradient): all on CUDA, its first loss
     * the CPU's to BF16 rounding, and it lowers the loss */
    struct lt_train_params pb = p;
    pb.f32_products = false;
    setenv("LATHE_FLASH_ATTN", "0", 1); /* the chain of products and SOFT_MAX */
    sd = lt_train_job_run(md, both, 2, &pb, NULL, NULL, &rd);
    unsetenv("LATHE_FLASH_ATTN");
    CHECK(sd == LT_OK, "BF16 LoRA on CUDA: %s", rd.error);
    if (sd == LT_OK) {
        printf("tiny LoRA, BF16 products: epoch loss %.4f -> %.4f (first step %.4f, CPU F32 "
               "%.4f); %d fallback nodes\n",
               rd.train_loss[0], rd.train_loss[1], rd.curve[0], cpu_first, rd.n_fallback);
        CHECK(rd.n_fallback == 0, "the BF16 LoRA job runs entirely on CUDA0: %d fallback nodes",
              rd.n_fallback);
        CHECK(fabs(rd.curve[0] - cpu_first) < 2e-2 * fabs(cpu_first),
              "the BF16 job's first loss %g is the CPU's %g to BF16 rounding", rd.curve[0],
              cpu_first);
        CHECK(rd.train_loss[1] < rd.train_loss[0], "the BF16 LoRA job lowers the loss");
    }
    /* again as a job on a device takes it by default, attention as FLASH_ATTN
     * (flash_attn_bf16.cu at this precision, the packed examples' boundaries by positions):
     * all on CUDA, and its loss curve the chain's to BF16 rounding. The default is FLASH_ATTN
     * for BF16 products on CUDA only: prefill and --f32-products keep the chain unless
     * LATHE_FLASH_ATTN=1, and =0 turns it off */
    CHECK(lt_model_flash_attn_on(md, cuda, true) && !lt_model_flash_attn_on(md, cuda, false) &&
              !lt_model_flash_attn_on(md, cpu, false),
          "FLASH_ATTN by default for a device's BF16 training alone");
    setenv("LATHE_FLASH_ATTN", "1", 1);
    CHECK(lt_model_flash_attn_on(md, cuda, false), "LATHE_FLASH_ATTN=1 turns it on");
    setenv("LATHE_FLASH_ATTN", "0", 1);
    CHECK(!lt_model_flash_attn_on(md, cuda, true), "LATHE_FLASH_ATTN=0 turns it off");
    unsetenv("LATHE_FLASH_ATTN");
    struct lt_train_result rf;
    lt_status sf = lt_train_job_run(md, both, 2, &pb, NULL, NULL, &rf);
    CHECK(sf == LT_OK, "BF16 LoRA on CUDA with FLASH_ATTN: %s", rf.error);
    if (sd == LT_OK && sf == LT_OK) {
        const double worst = worst_step(&rd, &rf);
        printf("tiny LoRA, BF16 products, FLASH_ATTN: epoch loss %.4f -> %.4f (first step %.4f; "
               "the chain's %.4f), worst step difference %.2e over 30 steps; %d fallback nodes\n",
               rf.train_loss[0], rf.train_loss[1], rf.curve[0], rd.curve[0], worst, rf.n_fallback);
        CHECK(rf.n_fallback == 0, "the FLASH_ATTN job runs entirely on CUDA0: %d fallback nodes",
              rf.n_fallback);
        CHECK(rf.n_curve == rd.n_curve && worst < 2e-2,
              "the FLASH_ATTN job follows the chain's loss curve: %g", worst);
    }
    lt_train_result_free(&rf);
    lt_train_result_free(&rd);
    remove(out_path);
    struct lt_train_params f = {
        .out = out_path, .text = text, .window = 64, .epochs = 2, .full = true, .lr = 1e-3f};
    sd = lt_train_job_run(md, both, 2, &f, NULL, NULL, &rd);
    CHECK(sd == LT_OK && rd.train_loss[1] < rd.train_loss[0] && exists(out_path),
          "full fine-tune on CUDA: %s (%g -> %g)", rd.error, rd.train_loss[0], rd.train_loss[1]);
    remove(out_path);
    /* the same with checkpointing, whole layers and selective (the device's graph: weights
     * rounded to BF16, fused norms, the LINEAR_CE head): the same ops on the same inputs, so
     * the same loss curve; selective recomputes fewer tensors than whole layers */
    static const enum lt_checkpoint modes[] = {LT_CHECKPOINT_ON, LT_CHECKPOINT_SELECTIVE};
    int recomputed[2] = {0, 0};
    for (int i = 0; i < 2 && sd == LT_OK; i++) {
        struct lt_train_params fc = f;
        fc.checkpoint = modes[i];
        struct lt_train_result rc;
        lt_status sc = lt_train_job_run(md, both, 2, &fc, NULL, NULL, &rc);
        const char *name = i ? "selective" : "on";
        CHECK(sc == LT_OK, "full fine-tune on CUDA, checkpoint %s: %s", name, rc.error);
        if (sc == LT_OK) {
            const double worst = worst_step(&rd, &rc);
            recomputed[i] = rc.n_recomputed;
            printf("full fine-tune on CUDA, checkpoint %s: %d tensors recomputed, worst step "
                   "difference %.2e\n",
                   name, rc.n_recomputed, worst);
            CHECK(rc.n_curve == rd.n_curve && worst < 1e-6 && rc.n_fallback == 0,
                  "checkpoint %s follows the job without: %g", name, worst);
            CHECK(rc.recompute_selective == (i == 1), "the result says which checkpointing");
        }
        lt_train_result_free(&rc);
        remove(out_path);
    }
    CHECK(sd != LT_OK || (recomputed[1] > 0 && recomputed[1] < recomputed[0]),
          "selective recomputes %d tensors, whole layers %d", recomputed[1], recomputed[0]);
    lt_train_result_free(&rd);
out_free:
    lt_model_free(mh);
    lt_model_free(md);
    remove(path);
}

/* ---- 2. the refusal path ---- */

static void test_refusal(struct lt_backend *cpu)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/test_train_cuda_refusal.gguf", dir);
    struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 3};
    if (tiny_model_write(path, &sp))
        return;
    /* the attention's backward either way: FLASH_ATTN_BACK off, the chain's SOFT_MAX_BACK */
    setenv("LATHE_CUDA_DISABLE_OPS", "SOFT_MAX_BACK,FLASH_ATTN_BACK", 1);
    struct lt_backend *cuda = lt_backend_cuda_new(0);
    unsetenv("LATHE_CUDA_DISABLE_OPS");
    struct lt_model *m = cuda ? load(path, cuda) : NULL;
    if (!m) {
        CHECK(0, "%s", lt_last_error());
        goto out_free;
    }
    struct lt_backend *both[2] = {cuda, cpu};
    remove(out_path);
    struct lt_train_params p = {.out = out_path, .text = text, .window = 32, .device_only = true};
    struct lt_train_result r;
    lt_status st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
    printf("device_only with SOFT_MAX_BACK disabled: %s\n", r.error);
    CHECK(st == LT_ERR_REFUSED && !strcmp(r.refusal.op, "SOFT_MAX_BACK") &&
              strstr(r.error, "SOFT_MAX_BACK") && strstr(r.error, r.refusal.source) &&
              !exists(out_path),
          "refused, naming the op and its source; nothing written");
    lt_train_result_free(&r);
    p.dry_run = true;
    st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
    CHECK(st == LT_ERR_REFUSED && r.refusal.kind == LT_REFUSAL_DEVICE_ONLY,
          "dry run: the same refusal");
    lt_train_result_free(&r);
    p.device_only = false;
    st = lt_train_job_run(m, both, 2, &p, NULL, NULL, &r);
    CHECK(st == LT_OK && r.n_fallback > 0, "without device_only: admitted with %d fallback nodes",
          r.n_fallback);
    lt_train_result_free(&r);
    /* a job whose data fails keeps its reason on a device too (the attention probe after the
     * data once wiped it: "lathe train: " with nothing after) */
    struct lt_train_params bad = {.out = out_path, .examples = "{not json\n", .window = 32};
    st = lt_train_job_run(m, both, 2, &bad, NULL, NULL, &r);
    CHECK(st == LT_ERR_FORMAT && strstr(r.error, "example 0 (line 1)") && !exists(out_path),
          "a bad example's reason: %d '%s'", st, r.error);
    lt_train_result_free(&r);
out_free:
    lt_model_free(m);
    lt_backend_free(cuda);
    remove(path);
}

/* ---- 3. scale ---- */

struct conv_job {
    const struct lt_gguf_tensor_info *ti;
    enum lt_type type;
};

static lt_status fill_conv(void *user, void *dst, size_t nbytes)
{
    const struct conv_job *c = user;
    const struct lt_type_traits *tr = lt_type_traits(c->type);
    const float *src = c->ti->data;
    int64_t ne0 = c->ti->ne[0], rows = c->ti->ne[1] * c->ti->ne[2] * c->ti->ne[3];
    size_t row = lt_row_size(c->type, ne0);
    for (int64_t r = 0; r < rows; r++)
        tr->from_float(src + r * ne0, (char *)dst + (size_t)r * row, ne0);
    (void)nbytes;
    return LT_OK;
}

/* Copies an F32 model with its matrices converted to `type` (rows of 32 or more) and
 * tests/test_train_tiny.h's byte tokenizer added. */
static lt_status convert(const char *src, const char *dst, enum lt_type type)
{
    struct lt_gguf *g;
    lt_status st = lt_gguf_open(src, &g);
    if (st != LT_OK)
        return st;
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    lt_gguf_writer_copy_kv(w, g);
    tiny_write_tokenizer(w, "qwen2");
    int64_t n = lt_gguf_n_tensors(g);
    struct conv_job *jobs = calloc((size_t)n, sizeof(*jobs));
    for (int64_t i = 0; i < n && st == LT_OK; i++) {
        const struct lt_gguf_tensor_info *ti = lt_gguf_tensor(g, i);
        bool matrix = ti->ne[1] > 1 && ti->ne[0] % 32 == 0 && ti->type == LT_TYPE_F32;
        if (!matrix) {
            st = lt_gguf_writer_add_tensor(w, ti->name, ti->type, ti->n_dims, ti->ne, ti->data,
                                           ti->nbytes);
            continue;
        }
        jobs[i] = (struct conv_job){ti, type};
        size_t nb = lt_row_size(type, ti->ne[0]) * (size_t)(ti->ne[1] * ti->ne[2] * ti->ne[3]);
        st = lt_gguf_writer_add_tensor_fill(w, ti->name, type, ti->n_dims, ti->ne, nb, fill_conv,
                                            &jobs[i]);
    }
    if (st == LT_OK)
        st = lt_gguf_writer_write(w, dst);
    lt_gguf_writer_free(w);
    free(jobs);
    lt_gguf_close(g);
    return st;
}

static void run_job(const char *what, struct lt_model *m, struct lt_backend *const *be, int n_be,
                    const struct lt_train_params *p)
{
    struct lt_train_result r;
    remove(out_path);
    lt_status st = lt_train_job_run(m, be, n_be, p, NULL, NULL, &r);
    CHECK(st == LT_OK, "%s: %s", what, r.error);
    if (st == LT_OK) {
        int n = r.n_curve, k = n >= 12 ? 4 : 1;
        double head = 0, tail = 0;
        for (int i = 0; i < k; i++) {
            head += r.curve[i] / k;
            tail += r.curve[n - 1 - i] / k;
        }
        printf("%-44s %3d steps, loss %.3f -> %.3f, %7.0f tokens/s, peak %8.1f MiB (allocated "
               "%.1f), %d trainable tensors (%.1f M numbers), %d fallback nodes\n",
               what, n, head, tail, r.tokens_per_s, (double)r.peak_bytes / (1 << 20),
               (double)r.allocated_bytes / (1 << 20), r.n_trainable,
               (double)r.n_trainable_elements / 1e6, r.n_fallback);
        CHECK(tail < head, "%s: the loss fell (%g -> %g)", what, head, tail);
        CHECK(exists(out_path), "%s: output written", what);
    }
    lt_train_result_free(&r);
    remove(out_path);
}

static void test_scale(const struct tm_spec *sp, const char *name, struct lt_backend *cuda,
                       struct lt_backend *cpu)
{
    char f32[700], bf16[700], q8[700];
    snprintf(f32, sizeof(f32), "%s/train_cuda_%s_f32.gguf", dir, name);
    snprintf(bf16, sizeof(bf16), "%s/train_cuda_%s_bf16.gguf", dir, name);
    snprintf(q8, sizeof(q8), "%s/train_cuda_%s_q8_0.gguf", dir, name);
    lt_status st = tm_write_model(sp, f32, 5);
    if (st == LT_OK)
        st = convert(f32, bf16, LT_TYPE_BF16);
    if (st == LT_OK)
        st = convert(f32, q8, LT_TYPE_Q8_0);
    remove(f32);
    CHECK(st == LT_OK, "%s: %s", name, lt_last_error());
    struct lt_backend *both[2] = {cuda, cpu};
    char what[128];
    for (int k = 0; k < 2 && st == LT_OK; k++) {
        struct lt_model *m = load(k == 0 ? bf16 : q8, cuda);
        if (!m) {
            CHECK(0, "%s", name);
            continue;
        }
        const char *tn = k == 0 ? "BF16" : "Q8_0";
        struct lt_train_params p = {
            .out = out_path, .text = text, .window = 256, .rank = 16, .lr = 1e-3f};
        snprintf(what, sizeof(what), "%s %s LoRA", name, tn);
        run_job(what, m, both, 2, &p);
        p.top_layers = 4;
        snprintf(what, sizeof(what), "%s %s LoRA top_layers 4", name, tn);
        run_job(what, m, both, 2, &p);
        if (k == 0) {
            struct lt_train_params f = {
                .out = out_path, .text = text, .window = 256, .full = true, .lr = 1e-5f};
            snprintf(what, sizeof(what), "%s %s full fine-tune", name, tn);
            run_job(what, m, both, 2, &f);
        }
        lt_model_free(m);
    }
    remove(bf16);
    remove(q8);
}

int main(void)
{
    /* a node asking its family for more scratch than the family told admission fails */
    setenv("LATHE_CUDA_CHECK_SCRATCH", "1", 0);
    (void)tm_forward; /* test_model_util.h's, unused here */
    struct lt_backend *cuda = lt_backend_cuda_new(0);
    if (!cuda) {
        printf("no CUDA device (%s); skipped\n", lt_last_error());
        return 77;
    }
    tiny_path(dir, sizeof(dir), "");
    dir[strlen(dir) - 1] = 0;
    snprintf(out_path, sizeof(out_path), "%s/test_train_cuda_out.gguf", dir);
    for (int i = 0; strlen(text) + 64 < sizeof(text); i++) {
        char s[64];
        snprintf(s, sizeof(s), "line %d: the quick brown fox jumps over the lazy dog. ", i % 7);
        strcat(text, s);
    }
    struct lt_backend *cpu = lt_backend_cpu_new(0);
    test_parity(cuda, cpu);
    test_refusal(cpu);
    const char *scale = getenv("LATHE_TRAIN_CUDA_SCALE");
    if (scale && (!strcmp(scale, "1") || !strcmp(scale, "qwen35"))) {
        /* Qwen3.5-0.8B: 24 layers (every 4th full attention), hidden 1024, ffn 3584, 8 query and
         * 2 KV heads of 256 (rotary 64), DeltaNet 16 key and 16 value heads of 128, conv 4,
         * vocabulary 248320, tied head */
        struct tm_spec q35 = {.arch = "qwen35",
                              .n_vocab = 248320,
                              .n_embd = 1024,
                              .n_ff = 3584,
                              .n_layer = 24,
                              .n_head = 8,
                              .n_head_kv = 2,
                              .head_dim = 256,
                              .n_rot = 64,
                              .rope_base = 1e7f,
                              .rms_eps = 1e-6f,
                              .tied = true,
                              .interval = 4,
                              .d_conv = 4,
                              .d_state = 128,
                              .n_k_heads = 16,
                              .n_v_heads = 16};
        /* Qwen2.5-1.5B: 28 layers, hidden 1536, ffn 8960, 12 query and 2 KV heads of 128,
         * QKV bias, vocabulary 151936, tied head */
        struct tm_spec q2 = {.arch = "qwen2",
                             .n_vocab = 151936,
                             .n_embd = 1536,
                             .n_ff = 8960,
                             .n_layer = 28,
                             .n_head = 12,
                             .n_head_kv = 2,
                             .head_dim = 128,
                             .n_rot = 128,
                             .rope_base = 1e6f,
                             .rms_eps = 1e-6f,
                             .tied = true};
        test_scale(&q35, "qwen35-0.8B", cuda, cpu);
        if (!strcmp(scale, "1"))
            test_scale(&q2, "qwen2.5-1.5B", cuda, cpu);
    }
    lt_backend_free(cpu);
    lt_backend_free(cuda);
    return check_summary();
}
