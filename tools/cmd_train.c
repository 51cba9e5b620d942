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
#include <stddef.h>
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
        "  --examples FILE        chat JSONL: {\"prompt\",\"completion\"} or {\"messages\":[...]},\n"
        "                         optionally with \"tools\":[...]\n"
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
        "  --checkpoint auto|on|off  recompute each layer's activations in the backward\n"
        "                         instead of keeping them (less memory, ~1/3 more compute);\n"
        "                         auto (default): when the job would not fit otherwise\n"
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

/* What the command line gives: the job's parameters and what only the command uses. */
struct train_cli {
    struct lt_train_params p;
    const char *model_path, *backend;
    int threads;
};

#define TC(field) offsetof(struct train_cli, field)
/* options whose value is a string, kept as given */
static const struct {
    const char *name, *alt;
    size_t off;
} str_opts[] = {
    {"-m", "--model", TC(model_path)},         {"--text", NULL, TC(p.text_path)},
    {"--examples", NULL, TC(p.examples_path)}, {"--out", "-o", TC(p.out)},
    {"--targets", NULL, TC(p.targets)},        {"--backend", NULL, TC(backend)},
};
/* options whose value is an int within [lo, hi] */
static const struct {
    const char *name;
    long lo, hi;
    size_t off;
} int_opts[] = {
    {"--rank", 1, 1 << 20, TC(p.rank)},
    {"--window", 1, 1 << 24, TC(p.window)},
    {"--epochs", 1, 1 << 20, TC(p.epochs)},
    {"--batch", 1, 1 << 24, TC(p.batch)},
    {"--batch-tokens", 1, 1 << 24, TC(p.batch_tokens)},
    {"--grad-accum", 1, 1 << 24, TC(p.grad_accum)},
    {"--top-layers", 0, 1 << 20, TC(p.top_layers)},
    {"--threads", 1, 4096, TC(threads)},
};

/* One option with a value; 0, or 2 after reporting a bad or unknown one. */
static int train_option(struct train_cli *c, const char *a, const char *v)
{
    struct lt_train_params *p = &c->p;
    for (size_t k = 0; k < sizeof(str_opts) / sizeof(str_opts[0]); k++)
        if (!strcmp(a, str_opts[k].name) || (str_opts[k].alt && !strcmp(a, str_opts[k].alt))) {
            *(const char **)((char *)c + str_opts[k].off) = v;
            return 0;
        }
    for (size_t k = 0; k < sizeof(int_opts) / sizeof(int_opts[0]); k++)
        if (!strcmp(a, int_opts[k].name))
            return parse_int(v, int_opts[k].lo, int_opts[k].hi,
                             (int *)((char *)c + int_opts[k].off))
                       ? 0
                       : bad_value(a, v);
    int iv;
    if (!strcmp(a, "--fit"))
        return lt_fit_policy_parse(v, &p->fit) ? 0 : bad_value(a, v);
    if (!strcmp(a, "--checkpoint")) {
        if (!strcmp(v, "auto") || !strcmp(v, "on") || !strcmp(v, "off")) {
            p->checkpoint = v[0] == 'a' ? LT_CHECKPOINT_AUTO
                            : v[1] == 'n' ? LT_CHECKPOINT_ON
                                          : LT_CHECKPOINT_OFF;
            return 0;
        }
        return bad_value(a, v);
    }
    if (!strcmp(a, "--seed")) {
        if (!parse_int(v, 1, 2147483647, &iv))
            return bad_value(a, v);
        p->seed = (uint64_t)iv;
        return 0;
    }
    if (!strcmp(a, "--memory-budget-mib")) {
        if (!parse_int(v, 1, 1 << 30, &iv))
            return bad_value(a, v);
        p->memory_budget_mib = (size_t)iv;
        return 0;
    }
    if (!strcmp(a, "--alpha"))
        return parse_float(v, &p->alpha) && p->alpha > 0 ? 0 : bad_value(a, v);
    if (!strcmp(a, "--lr"))
        return parse_float(v, &p->lr) && p->lr > 0 ? 0 : bad_value(a, v);
    if (!strcmp(a, "--weight-decay"))
        return parse_float(v, &p->weight_decay) ? 0 : bad_value(a, v);
    if (!strcmp(a, "--val-split"))
        return parse_float(v, &p->val_split) ? 0 : bad_value(a, v);
    fprintf(stderr, "lathe train: unknown option %s\n", a);
    usage(stderr);
    return 2;
}

/* 0: parsed and valid; 1: --help printed; 2: a usage error (reported) */
static int train_args(int argc, char **argv, struct train_cli *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        bool *flag = !strcmp(a, "--full")           ? &c->p.full
                     : !strcmp(a, "--device-only")  ? &c->p.device_only
                     : !strcmp(a, "--f32-products") ? &c->p.f32_products
                     : !strcmp(a, "--dry-run")      ? &c->p.dry_run
                                                    : NULL;
        if (flag) {
            *flag = true;
            continue;
        }
        if (i + 1 >= argc || strncmp(a, "-", 1)) {
            fprintf(stderr, "lathe train: %s %s\n", a,
                    a[0] == '-' ? "needs a value" : "is not an option");
            usage(stderr);
            return 2;
        }
        int rc = train_option(c, a, argv[++i]);
        if (rc)
            return rc;
    }
    if (!c->model_path) {
        fprintf(stderr, "lathe train: -m MODEL.gguf is required\n");
        usage(stderr);
        return 2;
    }
    struct lt_train_errors errs;
    if (lt_train_params_validate(&c->p, &errs) != LT_OK) {
        for (int i = 0; i < errs.n; i++)
            fprintf(stderr, "lathe train: %s: %s\n", errs.e[i].field, errs.e[i].message);
        return 2;
    }
    return 0;
}

/* The backends (CUDA first when asked, then the CPU) and the model. 0, or the exit code
 * after reporting. */
static int train_open(const struct train_cli *c, struct lt_backend **backends, int *n_backends,
                      struct lt_model **model)
{
    struct lt_model_params mp = {0};
    if (!strcmp(c->backend, "cuda")) {
#ifdef TRAIN_HAVE_CUDA_HEADER
        backends[*n_backends] = lt_backend_cuda_new(0);
        if (!backends[*n_backends]) {
            fprintf(stderr, "lathe train: %s\n", lt_last_error());
            return 1;
        }
        mp.weights_backend = backends[(*n_backends)++];
#else
        fprintf(stderr, "lathe train: this build has no CUDA backend\n");
        return 1;
#endif
    } else if (strcmp(c->backend, "cpu")) {
        return bad_value("--backend", c->backend);
    }
    backends[*n_backends] = lt_backend_cpu_new(c->threads);
    if (!backends[*n_backends]) {
        fprintf(stderr, "lathe train: %s\n", lt_last_error());
        return 1;
    }
    (*n_backends)++;
    if (lt_model_load(c->model_path, &mp, model) != LT_OK) {
        fprintf(stderr, "lathe train: %s\n", lt_last_error());
        return 1;
    }
    return 0;
}

/* Waits for the job (a SIGINT cancels it: nothing is written) and takes its result. */
static void train_watch(struct lt_train_job *job, struct lt_train_result *r)
{
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
    lt_train_job_wait(job, r);
    lt_train_job_free(job);
    sigaction(SIGINT, &old_sa, NULL);
}

/* The admission report of a dry run or a refusal */
static void train_print_admission(const struct lt_train_params *p, const struct lt_train_result *r)
{
    if (r->admission[0])
        printf("%s", r->admission);
    if (r->n_fallback > 0)
        printf("fallback nodes: %d (they run on the CPU%s)\n", r->n_fallback,
               p->device_only ? "; refused with --device-only" : "");
    if (r->status == LT_OK)
        printf("memory estimate: %.1f MiB; %d examples for training, %d for eval; micro-batch "
               "%d x %d tokens, %d a step; %d trainable tensors (%lld numbers)\n",
               (double)r->peak_bytes / (1 << 20), r->n_train, r->n_val, r->n_seqs_graph,
               r->n_tokens_graph, r->grad_accum, r->n_trainable,
               (long long)r->n_trainable_elements);
    if (r->status == LT_OK && r->n_recomputed > 0)
        printf("checkpointing: the backward recomputes %d forward tensors, a layer at a time\n",
               r->n_recomputed);
}

/* A finished job: the losses, the throughput, the output and its loss curve */
static void train_print_done(const struct lt_train_params *p, struct lt_train_result *r)
{
    for (int e = 0; e < r->n_epochs; e++) {
        printf("epoch %d: train loss %.4f", e + 1, r->train_loss[e]);
        if (!isnan(r->eval_loss[e]))
            printf(", eval loss %.4f", r->eval_loss[e]);
        printf("\n");
    }
    printf("trained %lld tokens in %.1f s (%.0f tokens/s); micro-batch %d x %d tokens, %d a "
           "step; memory estimate %.1f MiB, allocated %.1f MiB; %d fallback nodes\n",
           (long long)r->tokens, r->seconds, r->tokens_per_s, r->n_seqs_graph, r->n_tokens_graph,
           r->grad_accum, (double)r->peak_bytes / (1 << 20), (double)r->allocated_bytes / (1 << 20),
           r->n_fallback);
    if (r->n_recomputed > 0)
        printf("checkpointing: the backward recomputed %d forward tensors, a layer at a time\n",
               r->n_recomputed);
    printf("wrote %s (%s)\n", p->out, p->full ? "model" : "LoRA adapter");
    char svg[4096];
    curve_path(p->out, svg, sizeof(svg));
    if (lt_train_plot_svg(r, svg) == LT_OK)
        printf("loss curve: %s\n", svg);
    else
        fprintf(stderr, "lathe train: loss curve: %s\n", lt_last_error());
}

int cmd_train(int argc, char **argv)
{
    struct train_cli c = {.backend = "cpu"};
    int rc = train_args(argc, argv, &c);
    if (rc)
        return rc == 1 ? 0 : 2;
    const struct lt_train_params *p = &c.p;
    struct lt_backend *backends[2] = {NULL, NULL};
    int n_backends = 0;
    struct lt_model *model = NULL;
    if ((rc = train_open(&c, backends, &n_backends, &model)) != 0)
        goto out_free;
    rc = 1;
    struct ui ui = {.tty = isatty(fileno(stderr)) && !p->dry_run};
    struct lt_train_job *job;
    if (lt_train_job_start(model, backends, n_backends, p, p->dry_run ? NULL : on_progress, &ui,
                           &job) != LT_OK) {
        fprintf(stderr, "lathe train: %s\n", lt_last_error());
        goto out_free;
    }
    struct lt_train_result r;
    train_watch(job, &r);
    if (p->dry_run || r.status == LT_ERR_REFUSED)
        train_print_admission(p, &r);
    if (r.status != LT_OK)
        fprintf(stderr, "lathe train: %s\n", r.error);
    else if (p->dry_run)
        printf("dry run: admitted; nothing was allocated or written\n");
    else
        train_print_done(p, &r);
    rc = r.status == LT_OK ? 0 : 1;
    lt_train_result_free(&r);
out_free:
    lt_model_free(model);
    for (int i = 0; i < n_backends; i++)
        lt_backend_free(backends[i]);
    return rc;
}
