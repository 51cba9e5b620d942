/* cmd_train.c: `lathe train`: a LoRA or full fine-tuning job on a GGUF model, through the
 * same job API the server uses (include/lathe/train.h).
 *
 * Every job parameter is a flag of the same name. On a terminal a progress bar (loss,
 * tokens/s, ETA) redraws in place; otherwise plain lines are printed. --dry-run prints the
 * admission report (placement, fallback nodes, memory estimate) or the refusal and exits
 * without training. A refusal or failure is one line on stderr, the job's own sentence
 * unchanged, and exit status 1; nothing is written then. Ctrl-C cancels the job cleanly
 * (no output file). After a successful job the loss curve is written next to the output as
 * OUT.loss.svg. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "lathe/model.h"
#include "lathe/train.h"
#if __has_include("lathe/backend_cuda.h")
#include "lathe/backend_cuda.h"
#define TRAIN_HAVE_CUDA_HEADER 1
#endif

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: lathe train -m MODEL.gguf (--text FILE | --examples FILE.jsonl) --out OUT.gguf "
        "[options]\n"
        "\n"
        "data:\n"
        "  --text FILE            plain text, cut into windows that overlap by half\n"
        "  --examples FILE        chat JSONL: {\"prompt\",\"completion\"} or {\"messages\":[...]}\n"
        "  --window N             tokens per example (default 256)\n"
        "  --fit none|middle|left an example longer than the window: refuse (default), drop\n"
        "                         the oldest exchanges, or keep the tail\n"
        "  --val-split F          fraction held out for the eval loss (default 0)\n"
        "  --seed N               shuffling and LoRA init (default 42)\n"
        "LoRA (the default) or full fine-tuning:\n"
        "  --rank N               adapter rank (default 8)\n"
        "  --alpha F              adapter alpha (default 2 x rank)\n"
        "  --targets LIST         modules, e.g. attn_q,attn_v,ffn_down (default: attention)\n"
        "  --top-layers K         adapt only the last K blocks (default: all)\n"
        "  --full                 train every weight (F32/F16/BF16 models); writes a model\n"
        "schedule:\n"
        "  --epochs N             (default 1)\n"
        "  --lr F                 learning rate (default 1e-3 LoRA, 1e-4 full)\n"
        "  --weight-decay F       AdamW weight decay (default 0)\n"
        "  --batch-tokens N       tokens per micro-batch: N / window sequences side by side\n"
        "                         (default: on cuda the most that fit, up to 16384; on cpu one\n"
        "                         window)\n"
        "  --grad-accum K         micro-batches per optimizer step (default 1)\n"
        "  --batch N              examples per optimizer step instead (micro-batches of up to\n"
        "                         N sequences, as many as that takes)\n"
        "where:\n"
        "  --backend cpu|cuda     (default cpu)\n"
        "  --threads N            CPU threads (default: all cores)\n"
        "  --memory-budget-mib N  refuse a job whose estimated peak is larger\n"
        "  --device-only          refuse rather than run a node on the CPU\n"
        "  --f32-products         keep products by F32 weights in F32 on the device (slower;\n"
        "                         by default their operands are rounded to BF16)\n"
        "  --dry-run              admit and report, then stop without training\n");
}

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

struct ui {
    bool tty;
    int every; /* plain lines: every Nth step */
    double last_draw;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_eta(double s, char *out, size_t n)
{
    if (!isfinite(s) || s < 0)
        s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, n, "%lds", t);
}

static void on_progress(void *user, const struct lt_train_progress *p)
{
    struct ui *u = user;
    char eta[32];
    fmt_eta(p->eta_s, eta, sizeof(eta));
    if (u->tty) {
        double t = now_s();
        if (p->step != p->n_steps && t - u->last_draw < 0.1)
            return;
        u->last_draw = t;
        enum { BAR = 30 };
        int fill = p->n_steps > 0 ? (int)((double)BAR * p->step / p->n_steps) : 0;
        char bar[BAR + 1];
        for (int i = 0; i < BAR; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[BAR] = 0;
        fprintf(stderr, "\r[%s] %3d%% epoch %d/%d step %d/%d loss %.4f %.0f tok/s ETA %s  ", bar,
                p->n_steps ? 100 * p->step / p->n_steps : 0, p->epoch, p->n_epochs, p->step,
                p->n_steps, p->loss, p->tokens_per_s, eta);
        if (p->step == p->n_steps)
            fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    if (u->every <= 0)
        u->every = p->n_steps > 200 ? p->n_steps / 100 : 1;
    if (p->step % u->every == 0 || p->step == p->n_steps)
        printf("epoch %d/%d step %d/%d loss %.4f tokens/s %.0f eta %s\n", p->epoch, p->n_epochs,
               p->step, p->n_steps, p->loss, p->tokens_per_s, eta);
    fflush(stdout);
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static bool parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

/* OUT.gguf -> OUT.loss.svg */
static void curve_path(const char *out, char *buf, size_t n)
{
    size_t len = strlen(out);
    if (len > 5 && !strcmp(out + len - 5, ".gguf"))
        len -= 5;
    snprintf(buf, n, "%.*s.loss.svg", (int)len, out);
}

static int bad_value(const char *flag, const char *v)
{
    fprintf(stderr, "lathe train: %s: bad value '%s'\n", flag, v);
    return 2;
}

int cmd_train(int argc, char **argv)
{
    struct lt_train_params p = {0};
    const char *model_path = NULL, *backend = "cpu";
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        bool is_bool = !strcmp(a, "--full") || !strcmp(a, "--device-only") ||
                       !strcmp(a, "--dry-run") || !strcmp(a, "--f32-products");
        if (is_bool) {
            if (!strcmp(a, "--full"))
                p.full = true;
            else if (!strcmp(a, "--device-only"))
                p.device_only = true;
            else if (!strcmp(a, "--f32-products"))
                p.f32_products = true;
            else
                p.dry_run = true;
            continue;
        }
        if (i + 1 >= argc || strncmp(a, "-", 1)) {
            fprintf(stderr, "lathe train: %s %s\n", a,
                    a[0] == '-' ? "needs a value" : "is not an option");
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int iv;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--text"))
            p.text_path = v;
        else if (!strcmp(a, "--examples"))
            p.examples_path = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "-o"))
            p.out = v;
        else if (!strcmp(a, "--targets"))
            p.targets = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--fit")) {
            if (!lt_fit_policy_parse(v, &p.fit))
                return bad_value(a, v);
        } else if (!strcmp(a, "--rank")) {
            if (!parse_int(v, 1, 1 << 20, &p.rank))
                return bad_value(a, v);
        } else if (!strcmp(a, "--window")) {
            if (!parse_int(v, 1, 1 << 24, &p.window))
                return bad_value(a, v);
        } else if (!strcmp(a, "--epochs")) {
            if (!parse_int(v, 1, 1 << 20, &p.epochs))
                return bad_value(a, v);
        } else if (!strcmp(a, "--batch")) {
            if (!parse_int(v, 1, 1 << 24, &p.batch))
                return bad_value(a, v);
        } else if (!strcmp(a, "--batch-tokens")) {
            if (!parse_int(v, 1, 1 << 24, &p.batch_tokens))
                return bad_value(a, v);
        } else if (!strcmp(a, "--grad-accum")) {
            if (!parse_int(v, 1, 1 << 24, &p.grad_accum))
                return bad_value(a, v);
        } else if (!strcmp(a, "--top-layers")) {
            if (!parse_int(v, 0, 1 << 20, &p.top_layers))
                return bad_value(a, v);
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(v, 1, 4096, &threads))
                return bad_value(a, v);
        } else if (!strcmp(a, "--seed")) {
            if (!parse_int(v, 1, 2147483647, &iv))
                return bad_value(a, v);
            p.seed = (uint64_t)iv;
        } else if (!strcmp(a, "--memory-budget-mib")) {
            if (!parse_int(v, 1, 1 << 30, &iv))
                return bad_value(a, v);
            p.memory_budget_mib = (size_t)iv;
        } else if (!strcmp(a, "--alpha")) {
            if (!parse_float(v, &p.alpha) || !(p.alpha > 0))
                return bad_value(a, v);
        } else if (!strcmp(a, "--lr")) {
            if (!parse_float(v, &p.lr) || !(p.lr > 0))
                return bad_value(a, v);
        } else if (!strcmp(a, "--weight-decay")) {
            if (!parse_float(v, &p.weight_decay))
                return bad_value(a, v);
        } else if (!strcmp(a, "--val-split")) {
            if (!parse_float(v, &p.val_split))
                return bad_value(a, v);
        } else {
            fprintf(stderr, "lathe train: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "lathe train: -m MODEL.gguf is required\n");
        usage(stderr);
        return 2;
    }
    struct lt_train_errors errs;
    if (lt_train_params_validate(&p, &errs) != LT_OK) {
        for (int i = 0; i < errs.n; i++)
            fprintf(stderr, "lathe train: %s: %s\n", errs.e[i].field, errs.e[i].message);
        return 2;
    }

    int rc = 1;
    struct lt_backend *backends[2] = {NULL, NULL};
    int n_backends = 0;
    struct lt_model *model = NULL;
    struct lt_model_params mp = {0};
    if (!strcmp(backend, "cuda")) {
#ifdef TRAIN_HAVE_CUDA_HEADER
        backends[n_backends] = lt_backend_cuda_new(0);
        if (!backends[n_backends]) {
            fprintf(stderr, "lathe train: %s\n", lt_last_error());
            return 1;
        }
        mp.weights_backend = backends[n_backends++];
#else
        fprintf(stderr, "lathe train: this build has no CUDA backend\n");
        return 1;
#endif
    } else if (strcmp(backend, "cpu")) {
        return bad_value("--backend", backend);
    }
    backends[n_backends] = lt_backend_cpu_new(threads);
    if (!backends[n_backends]) {
        fprintf(stderr, "lathe train: %s\n", lt_last_error());
        goto out_free;
    }
    n_backends++;
    if (lt_model_load(model_path, &mp, &model) != LT_OK) {
        fprintf(stderr, "lathe train: %s\n", lt_last_error());
        goto out_free;
    }

    struct ui ui = {.tty = isatty(fileno(stderr)) && !p.dry_run};
    struct lt_train_job *job;
    if (lt_train_job_start(model, backends, n_backends, &p, p.dry_run ? NULL : on_progress, &ui,
                           &job) != LT_OK) {
        fprintf(stderr, "lathe train: %s\n", lt_last_error());
        goto out_free;
    }
    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, &old_sa);
    bool cancelled = false;
    for (;;) {
        enum lt_train_state s = lt_train_job_state(job);
        if (s == LT_TRAIN_DONE || s == LT_TRAIN_CANCELLED || s == LT_TRAIN_ERROR)
            break;
        if (interrupted && !cancelled) {
            fprintf(stderr, "\nlathe train: interrupted; cancelling (nothing will be written)\n");
            lt_train_job_cancel(job);
            cancelled = true;
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    struct lt_train_result r;
    lt_train_job_wait(job, &r);
    lt_train_job_free(job);
    sigaction(SIGINT, &old_sa, NULL);

    if (p.dry_run || r.status == LT_ERR_REFUSED) {
        if (r.admission[0])
            printf("%s", r.admission);
        if (r.n_fallback > 0)
            printf("fallback nodes: %d (they run on the CPU%s)\n", r.n_fallback,
                   p.device_only ? "; refused with --device-only" : "");
        if (r.status == LT_OK)
            printf(
                "memory estimate: %.1f MiB; %d examples for training, %d for eval; micro-batch "
                "%d x %d tokens, %d a step; %d trainable tensors (%lld numbers)\n",
                (double)r.peak_bytes / (1 << 20), r.n_train, r.n_val, r.n_seqs_graph,
                r.n_tokens_graph, r.grad_accum, r.n_trainable, (long long)r.n_trainable_elements);
    }
    if (r.status != LT_OK) {
        fprintf(stderr, "lathe train: %s\n", r.error);
        lt_train_result_free(&r);
        goto out_free;
    }
    if (p.dry_run) {
        printf("dry run: admitted; nothing was allocated or written\n");
        lt_train_result_free(&r);
        rc = 0;
        goto out_free;
    }
    for (int e = 0; e < r.n_epochs; e++) {
        printf("epoch %d: train loss %.4f", e + 1, r.train_loss[e]);
        if (!isnan(r.eval_loss[e]))
            printf(", eval loss %.4f", r.eval_loss[e]);
        printf("\n");
    }
    printf("trained %lld tokens in %.1f s (%.0f tokens/s); micro-batch %d x %d tokens, %d a "
           "step; memory estimate %.1f MiB, allocated %.1f MiB; %d fallback nodes\n",
           (long long)r.tokens, r.seconds, r.tokens_per_s, r.n_seqs_graph, r.n_tokens_graph,
           r.grad_accum, (double)r.peak_bytes / (1 << 20), (double)r.allocated_bytes / (1 << 20),
           r.n_fallback);
    printf("wrote %s (%s)\n", p.out, p.full ? "model" : "LoRA adapter");
    char svg[4096];
    curve_path(p.out, svg, sizeof(svg));
    if (lt_train_plot_svg(&r, svg) == LT_OK)
        printf("loss curve: %s\n", svg);
    else
        fprintf(stderr, "lathe train: loss curve: %s\n", lt_last_error());
    lt_train_result_free(&r);
    rc = 0;
out_free:
    lt_model_free(model);
    for (int i = 0; i < n_backends; i++)
        lt_backend_free(backends[i]);
    return rc;
}
