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

/* The parameters' table as the README's markdown table (`lathe train --params-markdown`;
 * tests/py/test_train_params_doc.py checks that the README holds it as printed). */
static void params_markdown(FILE *f)
{
    static const char *const types[] = {
        [LT_TF_STRING] = "string",
        [LT_TF_INT] = "integer",
        [LT_TF_U64] = "integer",
        [LT_TF_SIZE] = "integer",
        [LT_TF_FLOAT] = "number",
        [LT_TF_BOOL] = "bool",
        [LT_TF_FIT] = "none, middle, left",
        [LT_TF_CHECKPOINT] = "auto, on, off, selective (JSON: also bool)",
    };
    fprintf(f, "| `/train` key | `lathe train` flag | fine-tuning key | type, range | default | "
               "meaning |\n| --- | --- | --- | --- | --- | --- |\n");
    size_t n;
    const struct lt_train_field *t = lt_train_fields(&n);
    for (size_t i = 0; i < n; i++) {
        char range[64];
        lt_train_field_range_text(&t[i], range, sizeof(range));
        fprintf(f, "| %s%s%s | %s%s%s | %s%s%s | %s%s%s | %s | %s |\n", t[i].key ? "`" : "",
                t[i].key ? t[i].key : "", t[i].key ? "`" : "", t[i].flag ? "`" : "",
                t[i].flag ? t[i].flag : "", t[i].flag ? "`" : "", t[i].ft_key ? "`" : "",
                t[i].ft_key ? t[i].ft_key : "", t[i].ft_key ? "`" : "", types[t[i].type],
                range[0] ? ", " : "", range, t[i].def ? t[i].def : "", t[i].help);
    }
}

/* "  OPT   text" with the text wrapped at 90 columns under its first line's start (an
 * option wider than its column gets a line of its own). */
static void print_wrapped(FILE *f, const char *opt, const char *text)
{
    enum { COL = 25, WIDTH = 90 };
    int at = fprintf(f, "  %-22s ", opt);
    if (at > COL) {
        fprintf(f, "\n%*s", COL, "");
        at = COL;
    }
    while (*text) {
        size_t word = strcspn(text, " ");
        if (at > COL && at + (int)word > WIDTH) {
            fprintf(f, "\n%*s", COL, "");
            at = COL;
        }
        at += fprintf(f, "%s%.*s", at > COL ? " " : "", (int)word, text);
        text += word;
        text += strspn(text, " ");
    }
    fprintf(f, "\n");
}

/* The usage line, then every flag of the parameters' table (lathe/train.h) by section, then
 * the command's own. */
static void usage(FILE *f)
{
    fprintf(f, "usage: lathe train -m MODEL.gguf (--text FILE | --examples FILE.jsonl) --out "
               "OUT.gguf [options]\n");
    size_t n;
    const struct lt_train_field *t = lt_train_fields(&n);
    for (size_t i = 0; i < n; i++) {
        if (t[i].section)
            fprintf(f, "\n%s:\n", t[i].section);
        if (!t[i].flag)
            continue;
        char opt[64], range[64];
        snprintf(opt, sizeof(opt), "%s%s%s", t[i].flag, t[i].value ? " " : "",
                 t[i].value ? t[i].value : "");
        lt_train_field_range_text(&t[i], range, sizeof(range));
        char text[512];
        int k = snprintf(text, sizeof(text), "%s", t[i].help);
        if (range[0] || t[i].def)
            snprintf(text + k, sizeof(text) - (size_t)k, " (%s%s%s%s)", range[0] ? range : "",
                     range[0] && t[i].def ? "; " : "", t[i].def ? "default " : "",
                     t[i].def ? t[i].def : "");
        print_wrapped(f, opt, text);
    }
    fprintf(f, "\nthe command:\n"
               "  -m, --model FILE       the model (GGUF)\n"
               "  -o FILE                the same as --out\n"
               "  --backend cpu|cuda     (default cpu)\n"
               "  --threads N            CPU threads (default: all cores)\n"
               "  --params-markdown      print this table for the README, and stop\n");
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

/* One option with a value: the command's own (-m, -o, --backend, --threads) or a row of
 * the parameters' table. 0, or 2 after reporting a bad or unknown one. */
static int train_option(struct train_cli *c, const char *a, const char *v)
{
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        c->model_path = v;
        return 0;
    }
    if (!strcmp(a, "--backend")) {
        c->backend = v;
        return 0;
    }
    if (!strcmp(a, "--threads"))
        return parse_int(v, 1, 4096, &c->threads) ? 0 : bad_value(a, v);
    const struct lt_train_field *f = lt_train_field_by_flag(!strcmp(a, "-o") ? "--out" : a);
    if (f && f->type != LT_TF_BOOL) {
        bool number = f->type == LT_TF_INT || f->type == LT_TF_U64 || f->type == LT_TF_SIZE ||
                      f->type == LT_TF_FLOAT;
        /* a zero would read as "the default": refuse it where the range has no zero */
        bool zero_out = number && strtod(v, NULL) == 0 && !f->zero_default &&
                        !lt_train_field_in_range(f, 0);
        return !zero_out && lt_train_field_parse(f, v, &c->p) ? 0 : bad_value(a, v);
    }
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
        if (!strcmp(a, "--params-markdown")) {
            params_markdown(stdout);
            return 1;
        }
        const struct lt_train_field *flag = lt_train_field_by_flag(a);
        if (flag && flag->type == LT_TF_BOOL) {
            lt_train_field_parse(flag, NULL, &c->p);
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
    if (c->p.gpus > 1) { /* a build with NCCL: the library can run ranks, this command not yet */
        fprintf(stderr, "lathe train: --gpus %d: this command does not start one rank per GPU "
                "yet; a program can, through lathe/comm.h and lt_train_params.comm\n", c->p.gpus);
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

/* What the fit policy did to the examples, when it did anything */
static void train_print_fit(const struct lt_train_result *r)
{
    if (r->n_fitted > 0 || r->n_skipped > 0)
        printf("fit: %d examples shortened to the window, %d skipped (they could not fit)\n",
               r->n_fitted, r->n_skipped);
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
               "%d x %d tokens%s, %d a step; %d trainable tensors (%lld numbers)\n",
               (double)r->peak_bytes / (1 << 20), r->n_train, r->n_val, r->n_seqs_graph,
               r->n_tokens_graph, r->packed ? " (examples packed)" : "", r->grad_accum,
               r->n_trainable, (long long)r->n_trainable_elements);
    if (r->status == LT_OK)
        train_print_fit(r);
    if (r->status == LT_OK && r->n_recomputed > 0)
        printf("checkpointing%s: the backward recomputes %d forward tensors, a layer at a time\n",
               r->recompute_selective ? " (selective: no products)" : "", r->n_recomputed);
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
    printf("trained %lld tokens in %.1f s (%.0f tokens/s); micro-batch %d x %d tokens%s, %d a "
           "step; memory estimate %.1f MiB, allocated %.1f MiB; %d fallback nodes\n",
           (long long)r->tokens, r->seconds, r->tokens_per_s, r->n_seqs_graph, r->n_tokens_graph,
           r->packed ? " (examples packed)" : "", r->grad_accum, (double)r->peak_bytes / (1 << 20),
           (double)r->allocated_bytes / (1 << 20), r->n_fallback);
    train_print_fit(r);
    if (r->scratch_bytes || r->in_use_bytes)
        printf("the estimate counts %.1f MiB in use on the device before the job and %.1f MiB of "
               "kernels' working memory; allocated counts the job's graph buffers only\n",
               (double)r->in_use_bytes / (1 << 20), (double)r->scratch_bytes / (1 << 20));
    if (r->n_recomputed > 0)
        printf("checkpointing%s: the backward recomputed %d forward tensors, a layer at a time\n",
               r->recompute_selective ? " (selective: no products)" : "", r->n_recomputed);
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
