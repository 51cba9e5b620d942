/* test_cuda_placement.c: CUDA's placement of a training job, emulated on the CPU (no GPU
 * needed; skipped, 77, in a build without the CUDA backend).
 *
 * The backend here computes with the CPU but answers supports_op with the CUDA backend's
 * own preconditions (lt_cuda_verdict, which reads types, shapes and strides only), and its
 * memory counts as device memory. So the scheduler makes exactly the placement, fallbacks
 * and copies that a job on {CUDA0, CPU} gets on a GPU, and the loss curve must follow the
 * CPU's: a difference here is the scheduler's or the graph's, one only on the GPU is the
 * kernels'. The nodes CUDA refuses are listed with CUDA's reasons. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_verdict.h"
#include "check.h"
#include "lathe/model.h"
#include "lathe/opt.h"
#include "lathe/train.h"
#include "test_train_tiny.h"

struct emu {
    struct lt_backend *cpu;
    int n_refused_runs; /* compute calls that met a node CUDA would refuse (must stay 0) */
};

static bool emu_supports(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                         size_t reason_size)
{
    (void)be;
    return lt_cuda_verdict(node, reason, reason_size) &&
           lt_cpu_supports_op(node, reason, reason_size);
}

static lt_status emu_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out)
{
    struct emu *e = be->impl;
    lt_status st = e->cpu->iface->buffer_alloc(e->cpu, size, out);
    if (st == LT_OK)
        (*out)->backend = be;
    return st;
}

static void emu_buffer_free(struct lt_buffer *buf)
{
    struct emu *e = buf->backend->impl;
    buf->backend = e->cpu;
    lt_buffer_free(buf);
}

static lt_status emu_set(struct lt_tensor *t, const void *src, size_t off, size_t n)
{
    memcpy((char *)t->data + off, src, n);
    return LT_OK;
}

static lt_status emu_get(const struct lt_tensor *t, void *dst, size_t off, size_t n)
{
    memcpy(dst, (const char *)t->data + off, n);
    return LT_OK;
}

/* As CUDA's compute does: refuse a node the verdict refuses, and a source outside this
 * backend's memory (the scheduler must have copied it). */
static lt_status emu_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n)
{
    struct emu *e = be->impl;
    char reason[160];
    for (int i = 0; i < n; i++) {
        const struct lt_tensor *node = nodes[i];
        if (!emu_supports(be, node, reason, sizeof(reason))) {
            e->n_refused_runs++;
            return lt_fail(LT_ERR_UNSUPPORTED, "emulated CUDA0 refuses %s '%s': %s",
                           lt_op_name(node->op), node->name, reason);
        }
        for (int k = 0; k < LT_MAX_SRC; k++) {
            const struct lt_tensor *s = node->src[k];
            if (!s || node->op == LT_OP_VIEW || node->op == LT_OP_RESHAPE ||
                node->op == LT_OP_PERMUTE || node->op == LT_OP_TRANSPOSE || node->op == LT_OP_NONE)
                continue;
            const struct lt_tensor *r = s->view_src ? s->view_src : s;
            if (!r->buffer || r->buffer->backend != be)
                return lt_fail(LT_ERR_INVALID, "%s '%s': source %d '%s' is not in device memory",
                               lt_op_name(node->op), node->name, k, s->name);
        }
    }
    return lt_backend_compute(e->cpu, nodes, n);
}

static lt_status emu_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    (void)be;
    *free_bytes = (size_t)1 << 32;
    *total_bytes = (size_t)1 << 33;
    return LT_OK;
}

static void emu_free(struct lt_backend *be)
{
    struct emu *e = be->impl;
    lt_backend_free(e->cpu);
    free(e);
    free(be);
}

static const struct lt_backend_iface emu_iface = {
    .supports_op = emu_supports,
    .buffer_alloc = emu_buffer_alloc,
    .buffer_free = emu_buffer_free,
    .tensor_set = emu_set,
    .tensor_get = emu_get,
    .compute = emu_compute,
    .memory = emu_memory,
    .free = emu_free,
};

static struct lt_backend *emu_new(void)
{
    struct lt_backend *be = calloc(1, sizeof(*be));
    struct emu *e = calloc(1, sizeof(*e));
    if (!be || !e) {
        free(be);
        free(e);
        return NULL;
    }
    e->cpu = lt_backend_cpu_new(2);
    be->iface = &emu_iface;
    be->impl = e;
    be->is_host = false;
    snprintf(be->name, sizeof(be->name), "CUDA0-emulated");
    return be;
}

static char text[8192];

/* The jobs of tests/gpu/test_train_cuda.c's parity case (LoRA, or a full fine-tune), on
 * the CPU and on the emulation. */
static void test_parity(struct lt_backend *cpu, struct lt_backend *dev, bool weights_on_dev,
                        bool full)
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
                                .epochs = 2,
                                .lr = full ? 1e-3f : 5e-3f,
                                .full = full,
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
        printf("%s, weights in %s memory: CPU loss %.4f -> %.4f (first step %.4f); emulated CUDA "
               "%.4f -> %.4f (first step %.4f), %d fallback nodes; worst step difference %.2e "
               "over %d steps\n",
               full ? "full fine-tune" : "LoRA", weights_on_dev ? "device" : "host",
               rh.train_loss[0], rh.train_loss[1],
               rh.curve[0], rd.train_loss[0], rd.train_loss[1], rd.curve[0], rd.n_fallback,
               worst, n);
        CHECK(fabs(rh.curve[0] - rd.curve[0]) < 1e-4 * fabs(rh.curve[0]),
              "the first loss is the base model's on both");
        CHECK(rh.n_curve == rd.n_curve && worst < 1e-3, "emulated CUDA follows the CPU: %g",
              worst);
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
    test_parity(cpu, dev, true, false);
    test_parity(cpu, dev, false, false);
    test_parity(cpu, dev, true, true);
    CHECK(((struct emu *)dev->impl)->n_refused_runs == 0, "no refused node was run");
    lt_backend_free(dev);
    lt_backend_free(cpu);
    return check_summary();
}
