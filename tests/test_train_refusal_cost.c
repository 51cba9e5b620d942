/* test_train_refusal_cost.c: a training job refused for memory is refused from shapes alone,
 * before its trainable tensors take any memory or time.
 *
 * The model has Qwen3.5-0.8B's shape where the trainable tensors are (tests/gpu/configs/
 * qwen35-0.8b.json: 24 layers, every fourth full attention, hidden 1024, 8 query heads of
 * 256 with 2 KV heads, 16 DeltaNet heads of 128), with a byte-level vocabulary and a narrow
 * feed-forward block (no default LoRA target lies there) to keep the file small; its
 * matrices are Q4_1 zeros. A rank-4096 LoRA of it is 5.0 GB of F32; lathe used to allocate
 * and draw all of it before admission (23 s and 0.68 -> 5.57 GB of RSS for a refusal on the
 * H200). Here the refusal must come in milliseconds with the peak RSS (VmHWM, reset
 * through /proc/self/clear_refs) within 48 MiB of where it was (10 MiB measured). The same holds
 * for a full fine-tune of an F16 model of that shape cut to 4 layers (F32 copies: 160 MB), and on
 * an emulated device where the job sizes its micro-batch by trying sizes until one fits.
 *
 * What trained before still trains: admission of a reserved adapter gives the estimate and
 * the bytes against the budget that a committed one gets, and rank 8 on the same model is
 * admitted (dry run). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gap_backend.h"
#include "lathe/backend.h"
#include "lathe/gguf.h"
#include "lathe/lora.h"
#include "lathe/model.h"
#include "lathe/opt.h"
#include "lathe/train.h"
#include "test_train_tiny.h"

/* A refusal builds, places and measures the graphs of 24 layers: 15 ms here (2 cores,
 * RelWithDebInfo; 24 ms on the emulated device, which tries two micro-batch sizes), 190 and
 * 350 ms under ASan. The old path took 18 s (5 GB drawn), so 2 s separates the two with room
 * for a loaded CI machine running the sanitizer build. */
#define REFUSAL_MAX_S 2.0
/* The graphs' headers and the plan's bookkeeping; the old path grew by the tensors'
 * size (5 GB for the LoRA, 160 MB for the full fine-tune). */
#define RSS_GROWTH_MAX_MIB 48.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A /proc/self/status field in MiB, or -1. */
static double status_mib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    double v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, field, n) && line[n] == ':') {
            v = strtod(line + n + 1, NULL) / 1024.0; /* kB */
            break;
        }
    fclose(f);
    return v;
}

/* Resets VmHWM to the current RSS (Linux 4.0+); false where that is not possible. */
static bool reset_peak(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    if (fd < 0)
        return false;
    bool ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok;
}

struct shape {
    int n_layer, interval, n_embd, n_ff, n_head, n_head_kv, head_dim;
    int d_state, n_k_heads, n_v_heads, d_conv;
    enum lt_type wtype;
};

static lt_status zero_fill(void *user, void *dst, size_t nbytes)
{
    memset(dst, 0, nbytes);
    return LT_OK;
}

static bool add(struct lt_gguf_writer *w, const char *name, enum lt_type type, int64_t ne0,
                int64_t ne1)
{
    int64_t ne[2] = {ne0, ne1};
    size_t bytes = lt_row_size(type, ne0) * (size_t)ne1;
    return lt_gguf_writer_add_tensor_fill(w, name, type, ne1 > 1 ? 2 : 1, ne, bytes, zero_fill,
                                          NULL) == LT_OK;
}

static bool blk(struct lt_gguf_writer *w, int il, const char *suffix, enum lt_type type,
                int64_t ne0, int64_t ne1)
{
    char name[LT_MAX_NAME];
    snprintf(name, sizeof(name), "blk.%d.%s", il, suffix);
    return add(w, name, type, ne0, ne1);
}

static void key_u32(struct lt_gguf_writer *w, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof(key), "qwen35.%s", suffix);
    lt_gguf_writer_set_u32(w, key, v);
}

static bool write_model(const char *path, const struct shape *s)
{
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    int E = s->n_embd, D = s->head_dim, V = TINY_VOCAB;
    int key_dim = s->d_state * s->n_k_heads, value_dim = s->d_state * s->n_v_heads;
    int C = 2 * key_dim + value_dim;
    enum lt_type mt = s->wtype, f32 = LT_TYPE_F32;
    lt_gguf_writer_set_str(w, "general.architecture", "qwen35");
    key_u32(w, "context_length", 4096);
    key_u32(w, "embedding_length", (uint32_t)E);
    key_u32(w, "block_count", (uint32_t)s->n_layer);
    key_u32(w, "feed_forward_length", (uint32_t)s->n_ff);
    key_u32(w, "attention.head_count", (uint32_t)s->n_head);
    key_u32(w, "attention.head_count_kv", (uint32_t)s->n_head_kv);
    key_u32(w, "attention.key_length", (uint32_t)D);
    key_u32(w, "attention.value_length", (uint32_t)D);
    key_u32(w, "rope.dimension_count", (uint32_t)(D / 4));
    lt_gguf_writer_set_f32(w, "qwen35.rope.freq_base", 1e7f);
    lt_gguf_writer_set_f32(w, "qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    key_u32(w, "full_attention_interval", (uint32_t)s->interval);
    key_u32(w, "ssm.conv_kernel", (uint32_t)s->d_conv);
    key_u32(w, "ssm.state_size", (uint32_t)s->d_state);
    key_u32(w, "ssm.group_count", (uint32_t)s->n_k_heads);
    key_u32(w, "ssm.time_step_rank", (uint32_t)s->n_v_heads);
    key_u32(w, "ssm.inner_size", (uint32_t)value_dim);
    tiny_write_tokenizer(w, "qwen2");
    lt_gguf_writer_set_str(w, "tokenizer.chat_template", tiny_chat_template);
    bool ok = add(w, "token_embd.weight", f32, E, V) && add(w, "output_norm.weight", f32, E, 1);
    for (int il = 0; il < s->n_layer && ok; il++) {
        ok = blk(w, il, "attn_norm.weight", f32, E, 1) &&
             blk(w, il, "post_attention_norm.weight", f32, E, 1) &&
             blk(w, il, "ffn_gate.weight", mt, E, s->n_ff) &&
             blk(w, il, "ffn_up.weight", mt, E, s->n_ff) &&
             blk(w, il, "ffn_down.weight", mt, s->n_ff, E);
        if (ok && (il + 1) % s->interval != 0)
            ok = blk(w, il, "attn_qkv.weight", mt, E, C) &&
                 blk(w, il, "attn_gate.weight", mt, E, value_dim) &&
                 blk(w, il, "ssm_beta.weight", f32, E, s->n_v_heads) &&
                 blk(w, il, "ssm_alpha.weight", f32, E, s->n_v_heads) &&
                 blk(w, il, "ssm_conv1d.weight", f32, s->d_conv, C) &&
                 blk(w, il, "ssm_dt.bias", f32, s->n_v_heads, 1) &&
                 blk(w, il, "ssm_a", f32, s->n_v_heads, 1) &&
                 blk(w, il, "ssm_norm.weight", f32, s->d_state, 1) &&
                 blk(w, il, "ssm_out.weight", mt, value_dim, E);
        else if (ok)
            ok = blk(w, il, "attn_q.weight", mt, E, 2 * D * s->n_head) &&
                 blk(w, il, "attn_k.weight", mt, E, D * s->n_head_kv) &&
                 blk(w, il, "attn_v.weight", mt, E, D * s->n_head_kv) &&
                 blk(w, il, "attn_output.weight", mt, D * s->n_head, E) &&
                 blk(w, il, "attn_q_norm.weight", f32, D, 1) &&
                 blk(w, il, "attn_k_norm.weight", f32, D, 1);
    }
    if (ok && lt_gguf_writer_write(w, path) != LT_OK)
        ok = false;
    if (!ok)
        fprintf(stderr, "write %s: %s\n", path, lt_last_error());
    lt_gguf_writer_free(w);
    return ok;
}

static const char *text_data(void)
{
    static char buf[4096];
    size_t n = 0;
    while (n + 64 < sizeof(buf))
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "the lathe turns while the chisel cuts. ");
    return buf;
}

/* Runs a job that must be refused for memory and checks what the refusal cost. */
static void check_refusal_cost(const char *what, struct lt_model *m, struct lt_backend *cpu,
                               struct lt_train_params p, size_t min_need)
{
    bool peak_reset = reset_peak();
    double rss0 = status_mib("VmRSS"), t0 = now_s();
    struct lt_train_result r;
    lt_status st = lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r);
    double dt = now_s() - t0, peak = status_mib("VmHWM"), rss1 = status_mib("VmRSS");
    CHECK(st == LT_ERR_REFUSED && r.refusal.kind == LT_REFUSAL_MEMORY, "%s: refused for memory: %s",
          what, r.error);
    CHECK(r.refusal.need_bytes >= min_need,
          "%s: the estimate %zu counts the trainable tensors "
          "and the optimizer's state (at least %zu)",
          what, r.refusal.need_bytes, min_need);
    printf("%s: refused in %.1f ms; RSS %.1f MiB before, peak %.1f MiB during (%s), %.1f MiB "
           "after; estimate %.2f GiB over a budget of %.2f GiB\n",
           what, dt * 1e3, rss0, peak, peak_reset ? "reset before the job" : "process peak", rss1,
           (double)r.refusal.need_bytes / (1 << 30), (double)r.refusal.budget_bytes / (1 << 30));
    CHECK(dt < REFUSAL_MAX_S, "%s: the refusal took %.3f s", what, dt);
    CHECK(rss0 > 0 && peak > 0 && peak - rss0 < RSS_GROWTH_MAX_MIB,
          "%s: RSS grew from %.1f MiB to a peak of %.1f MiB", what, rss0, peak);
    lt_train_result_free(&r);
}

static const struct shape shape_08b = {.n_layer = 24,
                                       .interval = 4,
                                       .n_embd = 1024,
                                       .n_ff = 64,
                                       .n_head = 8,
                                       .n_head_kv = 2,
                                       .head_dim = 256,
                                       .d_state = 128,
                                       .n_k_heads = 16,
                                       .n_v_heads = 16,
                                       .d_conv = 4,
                                       .wtype = LT_TYPE_Q4_1};

/* Bytes of F32 LoRA pairs of `rank` over the default qwen35 targets of shape s. */
static size_t lora_bytes(const struct shape *s, int rank)
{
    int64_t E = s->n_embd, D = s->head_dim, value_dim = s->d_state * s->n_v_heads;
    int64_t C = 2 * s->d_state * s->n_k_heads + value_dim;
    int64_t delta = (E + C) + (E + value_dim) + (value_dim + E);
    int64_t attn = (E + 2 * D * s->n_head) + 2 * (E + D * s->n_head_kv) + (D * s->n_head + E);
    int n_attn = s->n_layer / s->interval, n_delta = s->n_layer - n_attn;
    return (size_t)(n_delta * delta + n_attn * attn) * (size_t)rank * sizeof(float);
}

/* On a device with no batch_tokens the job sizes its micro-batch itself: as many sequences
 * as 16384 tokens hold, halved while admission refuses for memory. A job that fits at no
 * size must still be refused at once (an emulated device: the CPU's kernels, 4 GiB free). */
static void test_lora_device(struct lt_model *m, struct lt_backend *cpu, const char *out)
{
    struct lt_backend *dev = gap_backend_new("DEV0");
    dev->is_host = false;
    struct lt_backend *bes[2] = {dev, cpu};
    struct lt_train_params p = {.out = out, .text = text_data(), .window = 256, .rank = 4096};
    bool peak_reset = reset_peak();
    double rss0 = status_mib("VmRSS"), t0 = now_s();
    struct lt_train_result r;
    lt_status st = lt_train_job_run(m, bes, 2, &p, NULL, NULL, &r);
    double dt = now_s() - t0, peak = status_mib("VmHWM");
    CHECK(st == LT_ERR_REFUSED && r.refusal.kind == LT_REFUSAL_MEMORY,
          "device: refused for memory: %s", r.error);
    printf("LoRA rank 4096, 0.8B shape, emulated device, automatic micro-batch: refused in %.1f "
           "ms; RSS %.1f MiB before, peak %.1f MiB (%s); nothing allocated on the device: %s\n",
           dt * 1e3, rss0, peak, peak_reset ? "reset before the job" : "process peak",
           gap_of(dev)->bytes_allocated == 0 ? "yes" : "no");
    CHECK(dt < REFUSAL_MAX_S, "device: the refusal took %.3f s", dt);
    CHECK(rss0 > 0 && peak > 0 && peak - rss0 < RSS_GROWTH_MAX_MIB,
          "device: RSS grew from %.1f MiB to a peak of %.1f MiB", rss0, peak);
    CHECK(gap_of(dev)->bytes_allocated == 0, "the device was not touched");
    lt_train_result_free(&r);
    lt_backend_free(dev);
}

/* Admits a micro-batch graph of 64 tokens over the adapter l: the estimate when admitted
 * with no budget, and the bytes a refusal names under a budget of one byte. */
static void admit_with(struct lt_model *m, struct lt_backend *const *bes, int n_be,
                       struct lt_lora *l, size_t *estimate, size_t *need)
{
    *estimate = *need = 0;
    struct lt_model_lora *list = NULL;
    int n_list = 0;
    struct lt_lora *ls[1] = {l};
    CHECK(lt_lora_model_list(m, ls, NULL, 1, &list, &n_list) == LT_OK, "%s", lt_last_error());
    struct lt_model_adapters ad = {.lora = list, .n_lora = n_list};
    for (int pass = 0; pass < 2; pass++) {
        struct lt_ctx *ctx =
            lt_ctx_init((struct lt_ctx_params){.mem_size = 16u << 20, .no_alloc = true});
        struct lt_model_loss_graph lg;
        CHECK(lt_model_build_loss(m, ctx, 64, 1, &ad, &lg) == LT_OK, "%s", lt_last_error());
        struct lt_train_graph_params gp = {
            .backends = bes, .n_backends = n_be, .memory_budget = pass == 0 ? 0 : 1};
        struct lt_train_graph *tg = NULL;
        struct lt_refusal ref;
        lt_status st = lt_train_graph_new(ctx, lg.loss, &gp, &tg, &ref);
        if (pass == 0) {
            CHECK(st == LT_OK, "admitted: %s", lt_last_error());
            *estimate = tg ? lt_train_graph_estimate(tg) : 0;
        } else {
            CHECK(st == LT_ERR_REFUSED && ref.kind == LT_REFUSAL_MEMORY, "refused: %s",
                  lt_last_error());
            *need = ref.need_bytes;
        }
        lt_train_graph_free(tg);
        lt_ctx_free(ctx);
    }
    free(list);
}

/* Admission sees a reserved adapter exactly as a committed one: the same estimate, the same
 * bytes against the budget, on the host and on a device (where the trainable tensors' host
 * copies are discounted), so no job admitted before is refused now. */
static void test_same_admission(struct lt_model *m, struct lt_backend *cpu)
{
    struct lt_backend *dev = gap_backend_new("DEV0");
    dev->is_host = false;
    struct lt_backend *host_bes[1] = {cpu}, *dev_bes[2] = {dev, cpu};
    struct lt_lora_params lp = {.rank = 8, .alpha = 16, .seed = 1};
    struct lt_lora *reserved = NULL, *committed = NULL;
    CHECK(lt_lora_reserve(m, &lp, &reserved) == LT_OK && lt_lora_new(m, &lp, &committed) == LT_OK,
          "%s", lt_last_error());
    for (int d = 0; d < 2 && reserved && committed; d++) {
        size_t e1, n1, e2, n2;
        admit_with(m, d ? dev_bes : host_bes, d ? 2 : 1, reserved, &e1, &n1);
        admit_with(m, d ? dev_bes : host_bes, d ? 2 : 1, committed, &e2, &n2);
        printf("rank 8 on the %s: estimate %zu (reserved) %zu (committed), against the budget "
               "%zu %zu\n",
               d ? "emulated device" : "host", e1, e2, n1, n2);
        CHECK(e1 == e2 && n1 == n2 && e1 > 0 && n1 > 0, "the same admission on the %s",
              d ? "device" : "host");
    }
    lt_lora_free(reserved);
    lt_lora_free(committed);
    lt_backend_free(dev);
}

static void test_lora(struct lt_backend *cpu, const char *dir)
{
    char path[600], out[600];
    snprintf(path, sizeof(path), "%s/refusal_cost_08b.gguf", dir);
    snprintf(out, sizeof(out), "%s/refusal_cost_lora.gguf", dir);
    CHECK(write_model(path, &shape_08b), "model written");
    struct lt_model *m = NULL;
    CHECK(lt_model_load(path, NULL, &m) == LT_OK, "%s", lt_last_error());
    if (!m)
        goto out_remove;
    struct lt_train_params p = {
        .out = out, .text = text_data(), .window = 256, .rank = 4096, .memory_budget_mib = 1024};
    size_t adapter = lora_bytes(&shape_08b, 4096);
    printf("rank-4096 adapter of the 0.8B shape: %.2f GiB of F32\n", (double)adapter / (1 << 30));
    /* weights, gradient accumulators, AdamW's m and v: four times the adapter at least */
    check_refusal_cost("LoRA rank 4096, 0.8B shape", m, cpu, p, 4 * adapter);
    CHECK(access(out, F_OK) != 0, "a refused job writes nothing");
    test_lora_device(m, cpu, out);
    test_same_admission(m, cpu);

    /* what trained before is admitted as before: rank 8, no budget given */
    p.rank = 8;
    p.memory_budget_mib = 0;
    p.dry_run = true;
    struct lt_train_result r;
    lt_status st = lt_train_job_run(m, &cpu, 1, &p, NULL, NULL, &r);
    CHECK(st == LT_OK && r.state == LT_TRAIN_DONE && r.peak_bytes >= 4 * lora_bytes(&shape_08b, 8),
          "rank 8 admitted: %s (estimate %zu)", r.error, r.peak_bytes);
    lt_train_result_free(&r);
    lt_model_free(m);
out_remove:
    remove(path);
}

static void test_full(struct lt_backend *cpu, const char *dir)
{
    struct shape s = shape_08b;
    s.n_layer = 4;
    s.wtype = LT_TYPE_F16;
    char path[600], out[600];
    snprintf(path, sizeof(path), "%s/refusal_cost_full.gguf", dir);
    snprintf(out, sizeof(out), "%s/refusal_cost_full_out.gguf", dir);
    CHECK(write_model(path, &s), "model written");
    struct lt_model *m = NULL;
    CHECK(lt_model_load(path, NULL, &m) == LT_OK, "%s", lt_last_error());
    if (!m)
        goto out_remove;
    size_t copies = 0;
    for (int i = 0; i < lt_model_n_weights(m); i++)
        copies += (size_t)lt_nelements(lt_model_weight(m, i)) * sizeof(float);
    printf("F32 copies of the 4-layer F16 model: %.1f MiB\n", (double)copies / (1 << 20));
    struct lt_train_params p = {
        .out = out, .text = text_data(), .window = 256, .full = true, .memory_budget_mib = 64};
    check_refusal_cost("full fine-tune, 4 layers of the 0.8B shape", m, cpu, p, 4 * copies);
    CHECK(access(out, F_OK) != 0, "a refused job writes nothing");
    lt_model_free(m);
out_remove:
    remove(path);
}

int main(void)
{
    char dir[400];
    tiny_path(dir, sizeof(dir), "");
    dir[strlen(dir) - 1] = 0; /* tiny_path joined "" with a slash */
    struct lt_backend *cpu = lt_backend_cpu_new(1);
    CHECK(cpu != NULL, "cpu backend");
    if (!cpu)
        return check_summary();
    test_lora(cpu, dir);
    test_full(cpu, dir);
    lt_backend_free(cpu);
    return check_summary();
}
