/* cmd_bench.c: `lathe bench -m MODEL.gguf [-p 512] [-n 128] [-r 3] [--backend cpu|cuda]
 * [-t THREADS]`: prompt and generation speed, printed as a markdown table in the manner of
 * llama.cpp's llama-bench, so the two can be set side by side.
 *
 *   ppN: a prompt of N tokens processed in one prefill, from an empty context; tokens/s is
 *        N / the prefill's time.
 *   tgN: N tokens generated one at a time from an empty context: N decode steps of one
 *        token each; tokens/s is N / the time of the N steps.
 *
 * As llama-bench does, the prompt is pseudo-random token ids below the vocabulary size
 * (deterministic: the same every run), each decode step feeds the next id of that sequence
 * (nothing is sampled), one warm-up run of each test precedes the timed ones (after the
 * session's own warm-up, lt_session_warmup), and each cell is the mean ± the sample
 * standard deviation of the per-repetition tokens/s over -r repetitions. Every step reads
 * its logits back to the host, which waits for the device, so the times are the device's.
 *
 * The model column is the architecture, a size label from the parameter count and the type
 * most of the weight matrices have; size is the bytes of the file's tensors, params their
 * element count (MiB / GiB and M / B as llama-bench prints them).
 *
 * Every error (a bad flag or number, a missing or broken model, -p or -n longer than the
 * model's context, no GPU for --backend cuda) is one line on stderr, "lathe bench: ...",
 * and exit status 2 for usage, 1 for the rest. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "lathe/gguf.h"
#include "lathe/model.h"

#if defined(__has_include)
#if __has_include("lathe/backend_cuda.h")
#include "lathe/backend_cuda.h"
#define BENCH_HAVE_CUDA_HEADER 1
#endif
#endif

#define BENCH_MAX_REPS 1000

static const char usage_text[] =
    "usage: lathe bench -m MODEL.gguf [options]\n"
    "  -m, --model FILE         the model (GGUF)\n"
    "  -p, --n-prompt N         prompt tokens of the pp test (default 512; 0: skip it)\n"
    "  -n, --n-gen N            generated tokens of the tg test (default 128; 0: skip it)\n"
    "  -r, --repetitions N      timed runs of each test (default 3)\n"
    "  --backend cpu|cuda       where the model runs (default cpu)\n"
    "  -t, --threads N          CPU threads (default: all cores)\n"
    "Prints a markdown table (llama-bench's): tokens/s, mean ± sample sd over the runs.\n";

struct bench_opts {
    const char *model, *backend;
    int n_prompt, n_gen, reps, threads;
};

/* Prints "lathe bench: <message>" as one line (a newline inside becomes a space). */
static void say_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fprintf(stderr, "lathe bench: %s\n", msg);
}

/* A whole number in [lo, hi]. */
static bool parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < -2147483647L || v > 2147483647L) {
        say_error("%s: '%s' is not a whole number", flag, s);
        return false;
    }
    if (v < lo || v > hi) {
        say_error("%s: %ld is out of range (%d to %d)", flag, v, lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

/* 0: parsed; 1: --help printed; 2: a usage error (reported). */
static int parse_args(int argc, char **argv, struct bench_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 1;
        }
        static const char *const with_value[] = {
            "-m", "--model", "-p", "--n-prompt", "-n", "--n-gen", "-r", "--repetitions",
            "--backend", "-t", "--threads",
        };
        bool known = false;
        for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++)
            known = known || !strcmp(a, with_value[k]);
        if (!known) {
            if (a[0] == '-')
                say_error("unknown option '%s' (lathe bench --help lists them)", a);
            else
                say_error("unexpected argument '%s' (the model goes after -m)", a);
            return 2;
        }
        if (i + 1 >= argc) {
            say_error("%s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt"))
            ok = parse_int(a, v, 0, 1 << 24, &o->n_prompt);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen"))
            ok = parse_int(a, v, 0, 1 << 24, &o->n_gen);
        else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions"))
            ok = parse_int(a, v, 1, BENCH_MAX_REPS, &o->reps);
        else if (!strcmp(a, "--backend"))
            o->backend = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = parse_int(a, v, 0, 4096, &o->threads);
        if (!ok)
            return 2;
    }
    if (!o->model) {
        say_error("no model given (-m MODEL.gguf)");
        return 2;
    }
    if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
        say_error("--backend: '%s'; expected cpu or cuda", o->backend);
        return 2;
    }
    if (o->n_prompt == 0 && o->n_gen == 0) {
        say_error("-p 0 and -n 0: no test to run");
        return 2;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: the deterministic pseudo-random token ids. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- the model column ---- */

struct model_desc {
    char name[96];   /* "qwen35 0.8B BF16" */
    uint64_t bytes;  /* of the tensors */
    uint64_t params; /* elements of the tensors */
};

static void size_label(char *buf, size_t size, uint64_t params)
{
    double p = (double)params;
    if (p >= 10e9)
        snprintf(buf, size, "%.0fB", p / 1e9);
    else if (p >= 0.5e9)
        snprintf(buf, size, "%.1fB", p / 1e9);
    else if (p >= 1e6)
        snprintf(buf, size, "%.0fM", p / 1e6);
    else
        snprintf(buf, size, "%.0fK", p / 1e3);
}

static void describe(const struct lt_model *m, struct model_desc *d)
{
    const struct lt_gguf *g = lt_model_gguf(m);
    int64_t count[LT_TYPE_COUNT] = {0};
    d->bytes = d->params = 0;
    for (int64_t i = 0; i < lt_gguf_n_tensors(g); i++) {
        const struct lt_gguf_tensor_info *t = lt_gguf_tensor(g, i);
        d->bytes += t->nbytes;
        d->params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        /* the weight type is the matrices' (norms and biases are F32 in any file) */
        if (t->n_dims >= 2 && (int)t->type >= 0 && (int)t->type < LT_TYPE_COUNT)
            count[t->type]++;
    }
    int best = LT_TYPE_F32;
    for (int k = 0; k < LT_TYPE_COUNT; k++)
        if (count[k] > count[best])
            best = k;
    char type[16], label[24];
    snprintf(type, sizeof(type), "%s", lt_type_name((enum lt_type)best));
    for (char *p = type; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    size_label(label, sizeof(label), d->params);
    snprintf(d->name, sizeof(d->name), "%s %s %s", lt_arch_name(lt_model_hparams(m)->arch), label,
             type);
}

/* ---- the tests ---- */

struct bench {
    struct lt_backend *cuda, *cpu;
    struct lt_model *model;
    struct lt_session *session;
    int64_t n_vocab;
    int32_t *tokens; /* [max(n_prompt, n_gen)] */
    float *logits;   /* [n_vocab] */
};

static void bench_free(struct bench *b)
{
    free(b->logits);
    free(b->tokens);
    lt_session_free(b->session);
    lt_model_free(b->model);
    if (b->cpu)
        lt_backend_free(b->cpu);
    if (b->cuda)
        lt_backend_free(b->cuda);
}

/* One pp run: the prompt in one prefill from an empty sequence 0; *t its seconds (up to
 * the logits on the host). */
static lt_status run_pp(struct bench *b, int n, double *t)
{
    lt_status st = lt_session_seq_clear(b->session, 0);
    if (st != LT_OK)
        return st;
    double t0 = now_s();
    st = lt_session_prefill(b->session, 0, b->tokens, n, false, b->logits);
    *t = now_s() - t0;
    return st;
}

/* One tg run: n decode steps of one token from an empty sequence 0. */
static lt_status run_tg(struct bench *b, int n, double *t)
{
    lt_status st = lt_session_seq_clear(b->session, 0);
    if (st != LT_OK)
        return st;
    const int seq = 0;
    double t0 = now_s();
    for (int i = 0; i < n && st == LT_OK; i++)
        st = lt_session_decode(b->session, 1, &seq, &b->tokens[i], b->logits);
    *t = now_s() - t0;
    return st;
}

/* A warm-up run, then reps timed ones; prints the row. */
static lt_status run_test(struct bench *b, const struct bench_opts *o, const struct model_desc *d,
                          bool pp, int n)
{
    lt_status (*fn)(struct bench *, int, double *) = pp ? run_pp : run_tg;
    double t, ts[BENCH_MAX_REPS];
    lt_status st = fn(b, n, &t);
    for (int r = 0; st == LT_OK && r < o->reps; r++) {
        st = fn(b, n, &t);
        ts[r] = t > 0 ? (double)n / t : 0.0;
    }
    if (st != LT_OK)
        return st;
    double mean = 0, var = 0;
    for (int r = 0; r < o->reps; r++)
        mean += ts[r];
    mean /= o->reps;
    for (int r = 0; r < o->reps; r++)
        var += (ts[r] - mean) * (ts[r] - mean);
    double sd = o->reps > 1 ? sqrt(var / (o->reps - 1)) : 0.0;
    char size[32], params[32];
    if (d->bytes < 1024ull * 1024 * 1024)
        snprintf(size, sizeof(size), "%.2f MiB", (double)d->bytes / 1024.0 / 1024.0);
    else
        snprintf(size, sizeof(size), "%.2f GiB", (double)d->bytes / 1024.0 / 1024.0 / 1024.0);
    if (d->params < 1000000000ull)
        snprintf(params, sizeof(params), "%.2f M", (double)d->params / 1e6);
    else
        snprintf(params, sizeof(params), "%.2f B", (double)d->params / 1e9);
    printf("| %s | %s | %s | %s | %s%d | %.2f ± %.2f |\n", d->name, size, params,
           b->cuda ? "CUDA" : "CPU", pp ? "pp" : "tg", n, mean, sd);
    fflush(stdout);
    return LT_OK;
}

/* The backends and the model, checked against the test sizes. true, or false after
 * reporting. */
static bool bench_open(struct bench *b, const struct bench_opts *o)
{
    if (!strcmp(o->backend, "cuda")) {
#ifdef BENCH_HAVE_CUDA_HEADER
        b->cuda = lt_backend_cuda_new(0);
        if (!b->cuda) {
            say_error("--backend cuda: %s", lt_last_error());
            return false;
        }
#else
        say_error("--backend cuda: this lathe has no CUDA backend");
        return false;
#endif
    }
    b->cpu = lt_backend_cpu_new(o->threads);
    if (!b->cpu) {
        say_error("cannot start the CPU backend");
        return false;
    }
    struct lt_model_params mp = {.weights_backend = b->cuda};
    if (lt_model_load(o->model, &mp, &b->model) != LT_OK) {
        if (strstr(lt_last_error(), o->model))
            say_error("%s", lt_last_error());
        else
            say_error("%s: %s", o->model, lt_last_error());
        return false;
    }
    const int64_t n_ctx_train = lt_model_hparams(b->model)->n_ctx_train;
    if (n_ctx_train > 0 && (o->n_prompt > n_ctx_train || o->n_gen > n_ctx_train)) {
        bool p = o->n_prompt > n_ctx_train;
        say_error("%s %d is longer than the model's context of %lld tokens", p ? "-p" : "-n",
                  p ? o->n_prompt : o->n_gen, (long long)n_ctx_train);
        return false;
    }
    return true;
}

/* The same random ids every run, the logits' buffer and a warmed-up session. true, or false
 * after reporting. */
static bool bench_prepare(struct bench *b, const struct bench_opts *o)
{
    b->n_vocab = lt_model_hparams(b->model)->n_vocab;
    int n_ctx = o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen;
    b->tokens = malloc(sizeof(int32_t) * (size_t)n_ctx);
    b->logits = malloc(sizeof(float) * (size_t)b->n_vocab);
    if (!b->tokens || !b->logits) {
        say_error("out of memory");
        return false;
    }
    uint64_t rs = 0x6c617468652d6265ull;
    for (int i = 0; i < n_ctx; i++)
        b->tokens[i] = (int32_t)(next_random(&rs) % (uint64_t)b->n_vocab);
    struct lt_backend *bes[2] = {b->cuda ? b->cuda : b->cpu, b->cpu};
    struct lt_session_params sp = {
        .n_ctx = n_ctx, .n_seq_max = 1, .backends = bes, .n_backends = b->cuda ? 2 : 1};
    if (lt_session_new(b->model, &sp, &b->session) != LT_OK) {
        say_error("%s", lt_last_error());
        return false;
    }
    if (lt_session_warmup(b->session) != LT_OK) {
        say_error("warming up: %s", lt_last_error());
        return false;
    }
    return true;
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o = {.backend = "cpu", .n_prompt = 512, .n_gen = 128, .reps = 3};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : 2;
    struct bench b = {0};
    rc = 1;
    if (!bench_open(&b, &o) || !bench_prepare(&b, &o))
        goto out;
    struct model_desc d;
    describe(b.model, &d);
    printf("| model | size | params | backend | test | t/s |\n");
    printf("| --- | ---: | ---: | --- | --- | ---: |\n");
    fflush(stdout);
    if (o.n_prompt > 0 && run_test(&b, &o, &d, true, o.n_prompt) != LT_OK) {
        say_error("pp%d: %s", o.n_prompt, lt_last_error());
        goto out;
    }
    if (o.n_gen > 0 && run_test(&b, &o, &d, false, o.n_gen) != LT_OK) {
        say_error("tg%d: %s", o.n_gen, lt_last_error());
        goto out;
    }
    rc = 0;
out:
    bench_free(&b);
    if (rc == 0 && fflush(stdout) != 0) {
        say_error("cannot write the output");
        rc = 1;
    }
    return rc;
}
