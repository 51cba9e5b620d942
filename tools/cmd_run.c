/* cmd_run.c: `lathe run -m MODEL.gguf -p PROMPT [options]`: generates a continuation of a
 * prompt (or, with --chat, the assistant's answer to it under the model's chat template)
 * and streams it to stdout as it comes, through the generation loop of generate.h.
 *
 * Every error (a bad flag, an empty prompt, a prompt longer than the context, a model file
 * that is missing or not a model, no GPU for --backend cuda) is one line on stderr,
 * "lathe run: ...", and a non-zero exit: 2 for usage, 1 for the rest. Timings go to stderr
 * only when asked (--timings, --verbose), so stdout holds the generated text alone. */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "lathe/generate.h"
#include "lathe/gguf.h"
#include "lathe/grammar.h"
#include "lathe/model.h"
#include "lathe/tokenizer.h"

#ifdef LATHE_HAVE_JANSSON
#include "server/json_schema.h"
#endif

#if defined(__has_include)
#if __has_include("lathe/backend_cuda.h")
#include "lathe/backend_cuda.h"
#define RUN_HAVE_CUDA_HEADER 1
#endif
#if __has_include("lathe/lora.h")
#include "lathe/lora.h"
#define RUN_HAVE_LORA 1
#endif
#endif

#define RUN_MAX_STOPS 16
#define RUN_MAX_LORAS 8

static const char usage_text[] =
    "usage: lathe run -m MODEL.gguf -p PROMPT [options]\n"
    "  -m, --model FILE        the model (GGUF)\n"
    "  -p, --prompt TEXT       the prompt\n"
    "  -n, --n-predict N       tokens to generate at most (default 256; <= 0: until the\n"
    "                          context is full)\n"
    "  --chat                  apply the model's chat template (the prompt is the user's\n"
    "                          message)\n"
    "  --system TEXT           a system message (with --chat)\n"
    "  --think                 let the model think first (Qwen3.5, with --chat)\n"
    "  --special               parse special tokens' text in a plain prompt, and show\n"
    "                          control tokens in the output\n"
    "  --temp T                temperature (default 0.8; 0: greedy)\n"
    "  --top-k K               (default 40; 0: off)\n"
    "  --top-p P               (default 0.95; 1: off)\n"
    "  --min-p P               (default 0.05; 0: off)\n"
    "  --repeat-penalty R      (default 1: off)\n"
    "  --repeat-last-n N       the penalties' window (default 64; -1: everything)\n"
    "  --presence-penalty P    a token seen in the window loses P (default 0: off)\n"
    "  --frequency-penalty F   ... and F for each time it was seen (default 0: off)\n"
    "  --seed S                the sampler's seed (default: from the clock)\n"
    "  --stop TEXT             stop before this text (repeatable)\n"
    "  --ignore-eos            keep generating past end-of-generation tokens\n"
    "  --grammar FILE          constrain the output to this GBNF grammar (root rule: root)\n"
#ifdef LATHE_HAVE_JANSSON
    "  --json                  constrain the output to a JSON object\n"
#endif
#ifdef RUN_HAVE_LORA
    "  --lora FILE[:SCALE]     apply a LoRA adapter (repeatable; scale default 1)\n"
#endif
    "  --backend cpu|cuda      where the model runs (default cpu)\n"
    "  -t, --threads N         CPU threads (default: all cores)\n"
    "  -c, --ctx N             context length (default: the model's, at most 4096)\n"
    "  -b, --batch N           prompt tokens per prefill step (default 512)\n"
    "  --timings               print prompt and generation speed on stderr\n"
    "  -v, --verbose           print the settings and timings on stderr\n";

struct run_lora {
    const char *path;
    float scale;
};

struct run_opts {
    const char *model, *prompt, *system, *backend, *grammar;
    bool have_prompt, chat, think, special, ignore_eos, timings, verbose, json;
    int n_predict, threads, ctx, batch;
    bool have_seed;
    struct lt_sampler_params sp;
    const char *stops[RUN_MAX_STOPS];
    size_t n_stops;
    struct run_lora loras[RUN_MAX_LORAS];
    int n_loras;
};

/* Prints "lathe run: <message>" as one line (a newline inside becomes a space). */
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
    fprintf(stderr, "lathe run: %s\n", msg);
}

static bool parse_int(const char *flag, const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < -2147483647L || v > 2147483647L) {
        say_error("%s: '%s' is not a whole number", flag, s);
        return false;
    }
    *out = (int)v;
    return true;
}

static bool parse_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end || errno || !isfinite(v)) {
        say_error("%s: '%s' is not a number", flag, s);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || *s == '-') {
        say_error("%s: '%s' is not a non-negative whole number", flag, s);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

#ifdef RUN_HAVE_LORA
/* FILE[:SCALE]: the scale is what follows the last ':' when it is a number, so a path with
 * a ':' in it still works without a scale. */
static void split_lora(const char *arg, struct run_lora *out, char *path, size_t size)
{
    snprintf(path, size, "%s", arg);
    out->scale = 1.0f;
    char *colon = strrchr(path, ':');
    if (colon && colon[1]) {
        char *end;
        float v = strtof(colon + 1, &end);
        if (!*end && isfinite(v)) {
            out->scale = v;
            *colon = 0;
        }
    }
}
#endif

/* The options with one value that land in a field of run_opts: the field's offset and how
 * its text is read ('s' kept as given, 'i' int, 'f' float, 'u' uint64). */
struct value_opt {
    const char *name, *alt;
    char kind;
    size_t off;
};

#define RO(field) offsetof(struct run_opts, field)
static const struct value_opt value_opts[] = {
    {"-m", "--model", 's', RO(model)},
    {"-p", "--prompt", 's', RO(prompt)},
    {"-n", "--n-predict", 'i', RO(n_predict)},
    {"--system", NULL, 's', RO(system)},
    {"--grammar", NULL, 's', RO(grammar)},
    {"--temp", NULL, 'f', RO(sp.temperature)},
    {"--top-k", NULL, 'i', RO(sp.top_k)},
    {"--top-p", NULL, 'f', RO(sp.top_p)},
    {"--min-p", NULL, 'f', RO(sp.min_p)},
    {"--repeat-penalty", NULL, 'f', RO(sp.repeat_penalty)},
    {"--repeat-last-n", NULL, 'i', RO(sp.repeat_last_n)},
    {"--presence-penalty", NULL, 'f', RO(sp.presence_penalty)},
    {"--frequency-penalty", NULL, 'f', RO(sp.frequency_penalty)},
    {"--seed", NULL, 'u', RO(sp.seed)},
    {"--backend", NULL, 's', RO(backend)},
    {"-t", "--threads", 'i', RO(threads)},
    {"-c", "--ctx", 'i', RO(ctx)},
    {"-b", "--batch", 'i', RO(batch)},
};

static const struct value_opt *find_value_opt(const char *a)
{
    for (size_t k = 0; k < sizeof(value_opts) / sizeof(value_opts[0]); k++)
        if (!strcmp(a, value_opts[k].name) || (value_opts[k].alt && !strcmp(a, value_opts[k].alt)))
            return &value_opts[k];
    return NULL;
}

/* v into the field of o that option a (described by vo) names */
static bool store_value(const struct value_opt *vo, const char *a, const char *v,
                        struct run_opts *o)
{
    char *field = (char *)o + vo->off;
    switch (vo->kind) {
    case 's': *(const char **)field = v; break;
    case 'i': return parse_int(a, v, (int *)field);
    case 'f': return parse_float(a, v, (float *)field);
    default: return parse_u64(a, v, (uint64_t *)field);
    }
    return true;
}

/* --stop and --lora, which may be given more than once */
static bool add_list_value(const char *a, const char *v, struct run_opts *o)
{
    if (!strcmp(a, "--stop")) {
        if (o->n_stops == RUN_MAX_STOPS) {
            say_error("at most %d stop strings", RUN_MAX_STOPS);
            return false;
        }
        o->stops[o->n_stops++] = v;
        return true;
    }
#ifdef RUN_HAVE_LORA
    static char lora_paths[RUN_MAX_LORAS][1024];
    if (o->n_loras == RUN_MAX_LORAS) {
        say_error("at most %d LoRA adapters", RUN_MAX_LORAS);
        return false;
    }
    struct run_lora *l = &o->loras[o->n_loras];
    split_lora(v, l, lora_paths[o->n_loras], sizeof(lora_paths[0]));
    l->path = lora_paths[o->n_loras++];
#endif
    return true;
}

static bool is_list_opt(const char *a)
{
#ifdef RUN_HAVE_LORA
    if (!strcmp(a, "--lora"))
        return true;
#endif
    return !strcmp(a, "--stop");
}

/* the flags without a value, or NULL */
static bool *find_flag(const char *a, struct run_opts *o)
{
    return !strcmp(a, "--chat")                          ? &o->chat
           : !strcmp(a, "--think")                       ? &o->think
           : !strcmp(a, "--special")                     ? &o->special
           : !strcmp(a, "--ignore-eos")                  ? &o->ignore_eos
           : !strcmp(a, "--timings")                     ? &o->timings
#ifdef LATHE_HAVE_JANSSON
           : !strcmp(a, "--json")                        ? &o->json
#endif
           : !strcmp(a, "-v") || !strcmp(a, "--verbose") ? &o->verbose
                                                         : NULL;
}

/* what must hold once every option is read; 0, or 2 after reporting */
static int check_opts(const struct run_opts *o)
{
    if (!o->model) {
        say_error("no model given (-m MODEL.gguf)");
        return 2;
    }
    if (!o->have_prompt) {
        say_error("no prompt given (-p PROMPT)");
        return 2;
    }
    if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
        say_error("--backend: '%s'; expected cpu or cuda", o->backend);
        return 2;
    }
    if (o->ctx < 0 || o->batch < 0) {
        say_error("%s must be positive", o->ctx < 0 ? "--ctx" : "--batch");
        return 2;
    }
    if (o->grammar && o->json) {
        say_error("--grammar and --json: give one");
        return 2;
    }
    if ((o->system || o->think) && !o->chat) {
        say_error("%s needs --chat", o->system ? "--system" : "--think");
        return 2;
    }
    return 0;
}

/* 0: parsed; 1: --help printed; 2: a usage error (reported). */
static int parse_args(int argc, char **argv, struct run_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 1;
        }
        bool *flag = find_flag(a, o);
        if (flag) {
            *flag = true;
            continue;
        }
        const struct value_opt *vo = find_value_opt(a);
        if (!vo && !is_list_opt(a)) {
            if (a[0] == '-')
                say_error("unknown option '%s' (lathe run --help lists them)", a);
            else
                say_error("unexpected argument '%s' (the prompt goes after -p)", a);
            return 2;
        }
        if (i + 1 >= argc) {
            say_error("%s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        if (vo ? !store_value(vo, a, v, o) : !add_list_value(a, v, o))
            return 2;
        o->have_prompt = o->have_prompt || (vo && vo->off == RO(prompt));
        o->have_seed = o->have_seed || (vo && vo->off == RO(sp.seed));
    }
    return check_opts(o);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct out_state {
    bool any;
    char last;
};

static bool write_piece(void *user, const char *piece, size_t len)
{
    struct out_state *os = user;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    os->any = true;
    os->last = piece[len - 1];
    return true;
}

/* Everything the run holds, freed in reverse order by run_free. */
struct run {
    struct lt_backend *cuda, *cpu;
    struct lt_model *model;
    struct lt_tokenizer *tok;
    struct lt_chat_template ct;
    bool have_ct;
    struct lt_tokens prompt;
#ifdef RUN_HAVE_LORA
    struct lt_lora *loras[RUN_MAX_LORAS];
    int n_loras;
    struct lt_model_lora *lora_list;
    int n_lora_list;
#endif
    struct lt_model_adapters adapters;
    struct lt_session *session;
    struct lt_generator gen;
    bool have_gen;
    struct lt_gen_seq seq;
    bool have_seq;
};

static void run_free(struct run *r)
{
    if (r->have_seq)
        lt_gen_seq_free(&r->seq);
    if (r->have_gen)
        lt_generator_free(&r->gen);
    lt_session_free(r->session);
#ifdef RUN_HAVE_LORA
    free(r->lora_list);
    for (int i = 0; i < r->n_loras; i++)
        lt_lora_free(r->loras[i]);
#endif
    lt_tokens_free(&r->prompt);
    if (r->have_ct)
        lt_chat_template_free(&r->ct);
    lt_tokenizer_free(r->tok);
    lt_model_free(r->model);
    if (r->cpu)
        lt_backend_free(r->cpu);
    if (r->cuda)
        lt_backend_free(r->cuda);
}

static lt_status make_backends(struct run *r, const struct run_opts *o)
{
    if (!strcmp(o->backend, "cuda")) {
#ifdef RUN_HAVE_CUDA_HEADER
        r->cuda = lt_backend_cuda_new(0);
        if (!r->cuda)
            return lt_fail(LT_ERR_UNSUPPORTED, "--backend cuda: %s", lt_last_error());
#else
        return lt_fail(LT_ERR_UNSUPPORTED, "--backend cuda: this lathe has no CUDA backend");
#endif
    }
    r->cpu = lt_backend_cpu_new(o->threads);
    if (!r->cpu)
        return lt_fail(LT_ERR_NOMEM, "cannot start the CPU backend");
    return LT_OK;
}

static lt_status make_prompt(struct run *r, const struct run_opts *o)
{
    if (!o->chat)
        return lt_gen_prompt_text(r->tok, o->prompt, o->special, &r->prompt);
    lt_status st = lt_chat_template_from_gguf(lt_model_gguf(r->model), &r->ct);
    if (st != LT_OK)
        return lt_fail(st, "--chat: %s", lt_last_error());
    r->have_ct = true;
    struct lt_chat_message msgs[2];
    size_t n = 0;
    if (o->system)
        msgs[n++] = (struct lt_chat_message){.role = "system", .content = o->system};
    msgs[n++] = (struct lt_chat_message){.role = "user", .content = o->prompt};
    return lt_gen_prompt_chat(r->tok, &r->ct, msgs, n, o->think, &r->prompt);
}

static lt_status load_loras(struct run *r, const struct run_opts *o)
{
#ifdef RUN_HAVE_LORA
    float scales[RUN_MAX_LORAS];
    for (int i = 0; i < o->n_loras; i++) {
        lt_status st = lt_lora_load(o->loras[i].path, &r->loras[i]);
        if (st != LT_OK && strstr(lt_last_error(), o->loras[i].path))
            return lt_fail(st, "--lora: %s", lt_last_error());
        if (st != LT_OK)
            return lt_fail(st, "--lora %s: %s", o->loras[i].path, lt_last_error());
        r->n_loras++;
        scales[i] = o->loras[i].scale;
    }
    if (r->n_loras) {
        lt_status st = lt_lora_model_list(r->model, r->loras, scales, r->n_loras, &r->lora_list,
                                          &r->n_lora_list);
        if (st != LT_OK)
            return lt_fail(st, "--lora: %s", lt_last_error());
        r->adapters.lora = r->lora_list;
        r->adapters.n_lora = r->n_lora_list;
    }
#endif
    return LT_OK;
}

static void print_timings(const struct lt_gen_seq *g, double t_load)
{
    struct lt_gen_stats s = lt_gen_seq_stats(g);
    /* the first token comes out of the prefill; each later one is one decode */
    size_t n_dec = s.n_generated > 1 ? s.n_generated - 1 : 0;
    fprintf(stderr, "lathe run: load %.2f s; prompt %zu tokens in %.3f s (%.1f tokens/s); "
                    "generation %zu tokens in %.3f s (%.1f tokens/s); finish: %s\n",
            t_load, s.n_prompt, s.t_prompt_s, s.t_prompt_s > 0 ? (double)s.n_prompt / s.t_prompt_s : 0.0,
            s.n_generated, s.t_gen_s, s.t_gen_s > 0 ? (double)n_dec / s.t_gen_s : 0.0,
            lt_gen_finish_name(g->finish));
    if (g->gm)
        fprintf(stderr, "lathe run: grammar: %.3f s of the generation (%.2f ms a token), %llu of "
                        "%zu tokens resampled under the mask\n",
                g->t_grammar_s, s.n_generated ? 1e3 * g->t_grammar_s / (double)s.n_generated : 0.0,
                (unsigned long long)g->n_masked, s.n_generated);
}

/* Backends, the model, its tokenizer, the prompt and the adapters; *n_ctx from --ctx or the
 * model. LT_OK, or the failure already reported. */
static lt_status load_all(struct run *r, const struct run_opts *o, int *n_ctx)
{
    lt_status st;
    if ((st = make_backends(r, o)) != LT_OK) {
        say_error("%s", lt_last_error());
        return st;
    }
    struct lt_model_params mp = {.weights_backend = r->cuda};
    if ((st = lt_model_load(o->model, &mp, &r->model)) != LT_OK) {
        /* the loader's messages name the file already */
        if (strstr(lt_last_error(), o->model))
            say_error("%s", lt_last_error());
        else
            say_error("%s: %s", o->model, lt_last_error());
        return st;
    }
    const struct lt_gguf *g = lt_model_gguf(r->model);
    const char *tok_model = NULL;
    if (lt_gguf_find_key(g, "tokenizer.ggml.model") < 0 ||
        (lt_gguf_get_str(g, "tokenizer.ggml.model", &tok_model) == LT_OK &&
         (!strcmp(tok_model, "none") || !strcmp(tok_model, "no_vocab")))) {
        /* converted from a checkpoint without tokenizer.json: the model itself loads */
        say_error("%s: the model has no tokenizer (tokenizer.ggml.model %s%s%s); lathe run needs "
                  "one to read the prompt and print text. Convert the checkpoint with its "
                  "tokenizer.json beside config.json",
                  o->model, tok_model ? "= \"" : "is missing", tok_model ? tok_model : "",
                  tok_model ? "\"" : "");
        return LT_ERR_UNSUPPORTED;
    }
    if ((st = lt_tokenizer_from_gguf(g, &r->tok)) != LT_OK) {
        say_error("%s: the tokenizer: %s", o->model, lt_last_error());
        return st;
    }
    const struct lt_model_hparams *hp = lt_model_hparams(r->model);
    *n_ctx = o->ctx;
    if (*n_ctx == 0)
        *n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < 4096 ? (int)hp->n_ctx_train : 4096;
    if ((st = make_prompt(r, o)) != LT_OK) {
        say_error("%s", lt_last_error());
        return st;
    }
    if (r->prompt.n > (size_t)*n_ctx) {
        say_error("the prompt is %zu tokens, longer than the context of %d (--ctx)", r->prompt.n,
                  *n_ctx);
        return LT_ERR_INVALID;
    }
    if ((st = load_loras(r, o)) != LT_OK)
        say_error("%s", lt_last_error());
    return st;
}

/* --grammar FILE's or --json's grammar into *out (NULL: none). LT_OK, or the failure
 * already reported. */
static lt_status load_grammar(const struct run_opts *o, struct lt_grammar **out)
{
    *out = NULL;
    struct lt_strbuf text = {0};
    lt_status st = LT_OK;
    if (o->grammar) {
        FILE *f = fopen(o->grammar, "rb");
        if (!f) {
            say_error("--grammar %s: %s", o->grammar, strerror(errno));
            return LT_ERR_IO;
        }
        char buf[4096];
        size_t n;
        while (st == LT_OK && (n = fread(buf, 1, sizeof(buf), f)) > 0)
            st = lt_strbuf_append(&text, buf, n);
        fclose(f);
    }
#ifdef LATHE_HAVE_JANSSON
    else if (o->json)
        st = srv_json_object_gbnf(&text);
#endif
    else
        return LT_OK;
    if (st == LT_OK)
        st = lt_grammar_parse(text.data ? text.data : "", text.len, out);
    if (st != LT_OK)
        say_error("%s%s%s", o->grammar ? o->grammar : "", o->grammar ? ": " : "", lt_last_error());
    lt_strbuf_free(&text);
    return st;
}

/* The session (warmed up on CUDA), the generator and the sequence's generation state.
 * LT_OK, or the failure already reported. */
static lt_status start_generation(struct run *r, const struct run_opts *o, int n_ctx)
{
    struct lt_backend *bes[2] = {r->cuda ? r->cuda : r->cpu, r->cpu};
    struct lt_session_params sp = {.n_ctx = n_ctx,
                                   .n_seq_max = 1,
                                   .backends = bes,
                                   .n_backends = r->cuda ? 2 : 1,
                                   .adapters = r->adapters.n_lora ? &r->adapters : NULL,
                                   /* a greedy run's tokens are picked where the logits are */
                                   .pick_vocab = (int)lt_tokenizer_n_tokens(r->tok)};
    lt_status st;
    if ((st = lt_session_new(r->model, &sp, &r->session)) != LT_OK) {
        say_error("%s", lt_last_error());
        return st;
    }
    /* on the GPU, load the kernels before the prompt (part of the load time, as llama.cpp) */
    if (r->cuda && (st = lt_session_warmup(r->session)) != LT_OK) {
        say_error("warming up on CUDA: %s", lt_last_error());
        return st;
    }
    if ((st = lt_generator_init(&r->gen, r->model, r->session, n_ctx, 1, o->batch)) != LT_OK) {
        say_error("%s", lt_last_error());
        return st;
    }
    r->have_gen = true;
    struct lt_gen_params gp = lt_gen_default_params();
    gp.sampler = o->sp;
    gp.max_tokens = o->n_predict;
    gp.stops = o->stops;
    gp.n_stops = o->n_stops;
    gp.detokenize_flags = o->special ? LT_DETOKENIZE_SPECIAL : 0;
    gp.ignore_eog = o->ignore_eos;
    if ((st = load_grammar(o, &gp.grammar)) != LT_OK)
        return st;
    st = lt_gen_seq_init(&r->seq, r->tok, &gp);
    lt_grammar_free(gp.grammar); /* the sequence holds its own reference */
    if (st != LT_OK) {
        say_error("%s", lt_last_error());
        return st;
    }
    r->have_seq = true;
    return LT_OK;
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o = {.backend = "cpu", .n_predict = 256, .sp = lt_sampler_default_params()};
    o.sp.temperature = 0.8f;
    o.sp.top_k = 40;
    o.sp.top_p = 0.95f;
    o.sp.min_p = 0.05f;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : 2;
    if (!o.prompt[0]) {
        say_error("the prompt is empty");
        return 2;
    }
    if (!o.have_seed)
        o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);

    struct run r = {0};
    struct out_state os = {0};
    int n_ctx = 0;
    rc = 1;
    double t0 = now_s();
    if (load_all(&r, &o, &n_ctx) != LT_OK || start_generation(&r, &o, n_ctx) != LT_OK)
        goto out_free_run;
    double t_load = now_s() - t0;
    if (o.verbose) {
        const struct lt_model_hparams *hp = lt_model_hparams(r.model);
        fprintf(stderr,
                "lathe run: %s (%s, %lld layers), backend %s, context %d, prompt %zu tokens, "
                "temp %g top-k %d top-p %g min-p %g repeat-penalty %g, seed %llu\n",
                o.model, lt_arch_name(hp->arch), (long long)hp->n_layer, o.backend, n_ctx,
                r.prompt.n, (double)o.sp.temperature, o.sp.top_k, (double)o.sp.top_p,
                (double)o.sp.min_p, (double)o.sp.repeat_penalty, (unsigned long long)o.sp.seed);
    }
    lt_status st = lt_generator_run(&r.gen, 0, &r.seq, r.prompt.ids, r.prompt.n, write_piece, &os);
    if (os.any && os.last != '\n')
        fputc('\n', stdout);
    fflush(stdout);
    if (st != LT_OK) {
        say_error("%s", lt_last_error());
        goto out_free_run;
    }
    if (o.timings || o.verbose)
        print_timings(&r.seq, t_load);
    rc = 0;
out_free_run:
    run_free(&r);
    return rc;
}
