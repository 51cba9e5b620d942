/* routes_complete.c: POST /v1/chat/completions and /v1/completions, whole or streamed.
 *
 * Both check every field first (type, range, unknown names), turn the request into one or
 * more prompts and one srv_gen per choice, and hand them to the engine. A whole response
 * waits for the end; a streamed one sends server-sent events as text becomes visible, and
 * always ends with "data: [DONE]" (after an error event when a generation failed). Whoever
 * holds a generation last frees it; a client that goes away cancels them, which frees
 * their slots.
 *
 * Choices. `n` (at most the slot count) and a list of prompts (legacy completions) give one
 * generation per prompt and choice, index prompt * n + choice, all queued at once, so they
 * decode side by side in the engine's batch. Choice j is seeded with seed + j when the
 * request gives a seed (so a list's equal prompts agree), freshly otherwise. Usage counts
 * each prompt once and every choice's completion tokens.
 *
 * Log-probabilities (`logprobs`/`top_logprobs` on chat, `logprobs: N` on legacy
 * completions, llama.cpp's `n_probs` on both) are OpenAI's: the log-softmax, in double over
 * the whole vocabulary, of the logits the model produced, before penalties, temperature and
 * the filters (lt_gen_logprobs). A token is reported once some of its text is shown, so a
 * stop string's tokens and the end-of-generation token never are. */
#ifdef LATHE_HAVE_JANSSON
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_check.h"
#include "server/routes.h"

#define MAX_STOP_LEN 256
#define MAX_PROMPTS 64        /* prompts in one legacy request */
#define MAX_LEGACY_LOGPROBS 5 /* OpenAI's limit for legacy `logprobs` */

enum kind {
    KIND_CHAT,
    KIND_TEXT,
};

static const struct srv_field common_fields[] = {
    {"model", SRV_JT_STRING, 0, 0, false},
    {"stream", SRV_JT_BOOL, 0, 0, false},
    {"stream_options", SRV_JT_OBJECT, 0, 0, false},
    {"max_tokens", SRV_JT_INT, 1, 1 << 24, false},
    {"max_completion_tokens", SRV_JT_INT, 1, 1 << 24, false},
    {"temperature", SRV_JT_NUMBER, 0, 2, false},
    {"top_p", SRV_JT_NUMBER, 0, 1, false},
    {"top_k", SRV_JT_INT, 0, 1 << 24, false},
    {"min_p", SRV_JT_NUMBER, 0, 1, false},
    {"repeat_penalty", SRV_JT_NUMBER, 1e-3, 100, false},
    {"repeat_last_n", SRV_JT_INT, -1, 1 << 24, false},
    {"seed", SRV_JT_INT, -1, 9.2e18, false},
    {"stop", SRV_JT_STRING | SRV_JT_ARRAY, 0, 0, false},
    {"n", SRV_JT_INT, 1, 1 << 16, false}, /* and at most the slot count */
    {"presence_penalty", SRV_JT_NUMBER, -2, 2, false},
    {"frequency_penalty", SRV_JT_NUMBER, -2, 2, false},
    {"n_probs", SRV_JT_INT, 0, LT_GEN_MAX_TOP_LOGPROBS, false}, /* llama.cpp's */
    {"ignore_eos", SRV_JT_BOOL, 0, 0, false},
    {"user", SRV_JT_STRING, 0, 0, false},
    {"lora", SRV_JT_ARRAY | SRV_JT_STRING, 0, 0, false},
    {"response_format", SRV_JT_OBJECT, 0, 0, false},
    {"grammar", SRV_JT_STRING, 0, 0, false},                   /* llama.cpp's */
    {"json_schema", SRV_JT_OBJECT | SRV_JT_BOOL, 0, 0, false}, /* llama.cpp's */
};
static const struct srv_field chat_fields[] = {
    {"messages", SRV_JT_ARRAY, 0, 0, true},
    {"chat_template_kwargs", SRV_JT_OBJECT, 0, 0, false},
    {"logprobs", SRV_JT_BOOL, 0, 0, false},
    {"top_logprobs", SRV_JT_INT, 0, LT_GEN_MAX_TOP_LOGPROBS, false},
    {"tools", SRV_JT_ARRAY, 0, 0, false}, /* and tool_choice: routes_tools.c */
    {"tool_choice", SRV_JT_STRING | SRV_JT_OBJECT, 0, 0, false},
    {"parallel_tool_calls", SRV_JT_BOOL, 0, 0, false}, /* accepted; calls are never limited */
};
static const struct srv_field text_fields[] = {
    {"prompt", SRV_JT_STRING | SRV_JT_ARRAY, 0, 0, true},
    {"logprobs", SRV_JT_INT, 0, MAX_LEGACY_LOGPROBS, false},
    {"echo", SRV_JT_BOOL, 0, 0, false},
};
#define N_COMMON (sizeof(common_fields) / sizeof(common_fields[0]))
#define N_CHAT (sizeof(chat_fields) / sizeof(chat_fields[0]))

/* One choice: its generation and what a stream has sent of it. */
struct choice {
    struct srv_gen *g;
    char *echo; /* legacy `echo`: the prompt's text, owned; NULL: none */
    size_t echo_len;
    size_t sent, lp_sent; /* stream: text bytes and log-probability records sent */
    size_t seen;          /* stream: text bytes looked at (more than sent while held back) */
    bool ended;           /* stream: its finish chunk is out */
    bool called;          /* stream: its output held tool calls */
};

/* What a response needs besides the generations. */
struct completion {
    enum kind kind;
    bool stream, include_usage;
    int chat_top;   /* chat `top_logprobs` when `logprobs` is true; -1: no logprobs */
    int legacy_top; /* legacy `logprobs`; -1: none */
    int n_probs;    /* llama.cpp's; 0: none */
    char id[48];
    long long created;
    char model[SRV_NAME_MAX];
    int n_prompt; /* each prompt's tokens once */
    int n_choices;
    int per_prompt;    /* choices a prompt has (the request's `n`), side by side in ch */
    struct choice *ch; /* [n_choices] */
    struct srv_tools tools; /* chat: the request's tools (routes_tools.c) */
    enum lt_chat_kind chat_kind;
};

static void completion_free(struct completion *c)
{
    for (int i = 0; c->ch && i < c->n_choices; i++) {
        if (c->ch[i].g) {
            srv_gen_cancel(c->ch[i].g); /* no-op when it finished */
            srv_gen_unref(c->ch[i].g);
        }
        free(c->ch[i].echo);
    }
    free(c->ch);
    c->ch = NULL;
    c->n_choices = 0;
    srv_tools_free(&c->tools);
}

static atomic_ullong request_counter;

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fresh_random(void)
{
    uint64_t n = atomic_fetch_add(&request_counter, 1);
    return mix64(n ^ (uint64_t)(srv_now_mono() * 1e9) ^ ((uint64_t)srv_now_unix() << 20));
}

/* ---- reading the request ---- */

static int check_fields(const json_t *body, const struct srv_field *extra, size_t n_extra)
{
    struct srv_field all[N_COMMON + 8];
    memcpy(all, common_fields, sizeof(common_fields));
    memcpy(all + N_COMMON, extra, n_extra * sizeof(*extra));
    int st = srv_check_object(body, "", all, N_COMMON + n_extra);
    if (st != 200)
        return st;
    json_t *so = srv_json_get(body, "stream_options");
    if (so) {
        static const struct srv_field so_fields[] = {{"include_usage", SRV_JT_BOOL, 0, 0, false}};
        if ((st = srv_check_object(so, "stream_options", so_fields, 1)) != 200)
            return st;
    }
    return 200;
}

static int read_stops(const json_t *body, struct srv_gen_params *p)
{
    json_t *stop = srv_json_get(body, "stop");
    if (!stop)
        return 200;
    if (json_is_string(stop)) {
        if (json_string_length(stop) > MAX_STOP_LEN)
            return srv_fail(400, "stop", "out_of_range", "a stop string is at most %d bytes",
                            MAX_STOP_LEN);
        p->stops[0] = strdup(json_string_value(stop));
        if (!p->stops[0])
            return srv_fail(503, "stop", NULL, "out of memory");
        p->n_stops = 1;
        return 200;
    }
    if (json_array_size(stop) > SRV_MAX_STOPS)
        return srv_fail(400, "stop", "out_of_range", "at most %d stop strings", SRV_MAX_STOPS);
    char name[32];
    for (size_t i = 0; i < json_array_size(stop); i++) {
        json_t *s = json_array_get(stop, i);
        snprintf(name, sizeof(name), "stop[%zu]", i);
        int st = srv_check_value(s, name, SRV_JT_STRING, 0, 0);
        if (st != 200)
            return st;
        if (json_string_length(s) > MAX_STOP_LEN)
            return srv_fail(400, name, "out_of_range", "a stop string is at most %d bytes",
                            MAX_STOP_LEN);
        p->stops[p->n_stops] = strdup(json_string_value(s));
        if (!p->stops[p->n_stops])
            return srv_fail(503, name, NULL, "out of memory");
        p->n_stops++;
    }
    return 200;
}

static int read_loras(const json_t *body, struct srv_gen_params *p)
{
    json_t *lora = srv_json_get(body, "lora");
    if (!lora)
        return 200;
    p->lora_given = true;
    if (json_is_string(lora)) {
        if (json_string_length(lora) >= SRV_NAME_MAX)
            return srv_fail(400, "lora", "invalid_name", "an adapter name is shorter than %d",
                            SRV_NAME_MAX);
        snprintf(p->loras[0].name, SRV_NAME_MAX, "%s", json_string_value(lora));
        p->loras[0].id = -1;
        p->loras[0].scale = 1.0f;
        p->n_loras = 1;
        return 200;
    }
    static const struct srv_field fields[] = {
        {"name", SRV_JT_STRING, 0, 0, false},
        {"id", SRV_JT_INT, 0, 1 << 20, false},
        {"scale", SRV_JT_NUMBER, -100, 100, false},
    };
    if (json_array_size(lora) > SRV_MAX_REQ_LORAS)
        return srv_fail(400, "lora", "out_of_range", "at most %d adapters per request",
                        SRV_MAX_REQ_LORAS);
    char where[32];
    for (size_t i = 0; i < json_array_size(lora); i++) {
        json_t *e = json_array_get(lora, i);
        snprintf(where, sizeof(where), "lora[%zu]", i);
        int st = srv_check_object(e, where, fields, 3);
        if (st != 200)
            return st;
        const char *name = srv_json_str(e, "name", NULL);
        long long id = srv_json_int(e, "id", -1);
        if (!name == (id < 0))
            return srv_fail(400, where, "invalid_value", "'%s' needs either a name or an id",
                            where);
        struct srv_lora_choice *c = &p->loras[p->n_loras++];
        if (name && strlen(name) >= SRV_NAME_MAX)
            return srv_fail(400, where, "invalid_name", "an adapter name is shorter than %d",
                            SRV_NAME_MAX);
        snprintf(c->name, sizeof(c->name), "%s", name ? name : "");
        c->id = (int)id;
        c->scale = (float)srv_json_num(e, "scale", 1.0);
    }
    return 200;
}

static int read_sampling(const json_t *body, struct srv_gen_params *p)
{
    struct lt_sampler_params *s = &p->sampling;
    *s = lt_sampler_default_params();
    s->temperature = (float)srv_json_num(body, "temperature", s->temperature);
    s->top_p = (float)srv_json_num(body, "top_p", s->top_p);
    s->top_k = (int32_t)srv_json_int(body, "top_k", s->top_k);
    s->min_p = (float)srv_json_num(body, "min_p", s->min_p);
    s->repeat_penalty = (float)srv_json_num(body, "repeat_penalty", s->repeat_penalty);
    s->repeat_last_n = (int32_t)srv_json_int(body, "repeat_last_n", s->repeat_last_n);
    s->presence_penalty = (float)srv_json_num(body, "presence_penalty", s->presence_penalty);
    s->frequency_penalty = (float)srv_json_num(body, "frequency_penalty", s->frequency_penalty);
    long long seed = srv_json_int(body, "seed", -1);
    s->seed = seed >= 0 ? (uint64_t)seed : fresh_random();
    p->max_tokens = (int)srv_json_int(body, "max_completion_tokens",
                                      srv_json_int(body, "max_tokens", 0));
    p->ignore_eos = json_is_true(json_object_get(body, "ignore_eos"));
    int st = read_stops(body, p);
    if (st == 200)
        st = read_loras(body, p);
    if (st == 200)
        st = srv_read_grammar(body, &p->grammar);
    return st;
}

/* A prompt of a request: its tokens, and for legacy `echo` its text. */
struct prompt {
    lt_token *ids; /* [n], owned */
    size_t n;
    char *text; /* owned; NULL unless echo */
    size_t text_len;
};

static void prompts_free(struct prompt *pr, size_t n)
{
    for (size_t i = 0; pr && i < n; i++) {
        free(pr[i].ids);
        free(pr[i].text);
    }
    free(pr);
}

static int prompt_from_string(struct srv_app *app, const json_t *s, const char *name, bool echo,
                              struct prompt *out)
{
    if (json_string_length(s) == 0)
        return srv_fail(400, name, "invalid_value", "the prompt is empty");
    struct lt_tokens tk = {0};
    int st = app->engine->iface->prompt_text(app->engine, json_string_value(s), &tk);
    out->ids = tk.ids;
    out->n = tk.n;
    free(tk.offs);
    if (st == 200 && echo) {
        out->text_len = json_string_length(s);
        out->text = malloc(out->text_len + 1);
        if (!out->text)
            return srv_fail(503, name, NULL, "out of memory for the prompt's text");
        memcpy(out->text, json_string_value(s), out->text_len + 1);
    }
    return st;
}

static int prompt_from_ids(struct srv_app *app, const json_t *arr, const char *name, bool echo,
                           struct prompt *out)
{
    int st = srv_token_array(app, arr, name, &out->ids, &out->n);
    if (st != 200 || !echo)
        return st;
    struct lt_strbuf b = {0};
    st = app->engine->iface->detokenize(app->engine, out->ids, out->n, 0, &b);
    if (st == 200 && lt_strbuf_append(&b, "", 0) != LT_OK)
        st = srv_fail(503, name, NULL, "out of memory for the prompt's text");
    if (st != 200) {
        lt_strbuf_free(&b);
        return st;
    }
    out->text = b.data;
    out->text_len = b.len;
    return 200;
}

/* `prompt`: a string, token ids, or a list of either (one choice set per prompt). */
static int text_prompts(struct srv_app *app, const json_t *body, bool echo, struct prompt **out,
                        size_t *n_out)
{
    json_t *prompt = json_object_get(body, "prompt");
    if (!prompt)
        return srv_fail(400, "prompt", "missing_field", "'prompt' is required");
    if (!json_is_string(prompt) && !json_is_array(prompt))
        return srv_fail(400, "prompt", "invalid_type",
                        "'prompt' must be a string, token ids, or an array of either");
    size_t n = json_is_array(prompt) ? json_array_size(prompt) : 1;
    bool one_ids = json_is_array(prompt) && n > 0 && json_is_integer(json_array_get(prompt, 0));
    if (one_ids || json_is_string(prompt))
        n = 1;
    if (n == 0)
        return srv_fail(400, "prompt", "invalid_value", "the prompt is empty");
    if (n > MAX_PROMPTS)
        return srv_fail(400, "prompt", "out_of_range", "at most %d prompts in one request",
                        MAX_PROMPTS);
    struct prompt *pr = calloc(n, sizeof(*pr));
    if (!pr)
        return srv_fail(503, "prompt", NULL, "out of memory for %zu prompts", n);
    int st = 200;
    char name[32];
    if (json_is_string(prompt)) {
        st = prompt_from_string(app, prompt, "prompt", echo, &pr[0]);
    } else if (one_ids) {
        st = prompt_from_ids(app, prompt, "prompt", echo, &pr[0]);
    } else {
        for (size_t i = 0; i < n && st == 200; i++) {
            json_t *e = json_array_get(prompt, i);
            snprintf(name, sizeof(name), "prompt[%zu]", i);
            if (json_is_string(e))
                st = prompt_from_string(app, e, name, echo, &pr[i]);
            else if (json_is_array(e) && json_array_size(e) > 0)
                st = prompt_from_ids(app, e, name, echo, &pr[i]);
            else
                st = srv_fail(400, name, "invalid_value",
                              "'prompt' must be a string, token ids, or an array of strings or "
                              "of arrays of token ids");
        }
    }
    if (st != 200) {
        prompts_free(pr, n);
        return st;
    }
    *out = pr;
    *n_out = n;
    return 200;
}

/* Reads logprobs, top_logprobs, n_probs into c and p. */
static int read_logprobs(const json_t *body, enum kind kind, struct completion *c,
                         struct srv_gen_params *p)
{
    c->chat_top = c->legacy_top = -1;
    c->n_probs = (int)srv_json_int(body, "n_probs", 0);
    if (kind == KIND_CHAT) {
        bool on = srv_json_bool(body, "logprobs", false);
        if (srv_json_get(body, "top_logprobs") && !on)
            return srv_fail(400, "top_logprobs", "invalid_value",
                            "'top_logprobs' needs 'logprobs': true");
        if (on)
            c->chat_top = (int)srv_json_int(body, "top_logprobs", 0);
    } else {
        c->legacy_top = (int)srv_json_int(body, "logprobs", -1);
    }
    int top = c->chat_top > c->legacy_top ? c->chat_top : c->legacy_top;
    if (c->n_probs > 0 && c->n_probs > top)
        top = c->n_probs;
    /* -1: nobody asked (n_probs 0 is its default, not a request), and no step pays for two
     * passes of exp over the vocabulary */
    p->logprobs = top >= 0;
    p->top_logprobs = top > 0 ? top : 0;
    return 200;
}

/* A deep copy of base for one choice, with the prompt pr's tokens. */
static int params_for_choice(const struct srv_gen_params *base, const struct prompt *pr,
                             struct srv_gen_params *out)
{
    *out = *base;
    out->prompt = NULL;
    out->n_stops = 0;
    memset(out->stops, 0, sizeof(out->stops));
    out->grammar = base->grammar ? lt_grammar_ref(base->grammar) : NULL; /* one per choice */
    out->prompt = malloc(pr->n * sizeof(*out->prompt));
    if (!out->prompt)
        goto out_nomem;
    memcpy(out->prompt, pr->ids, pr->n * sizeof(*out->prompt));
    out->n_prompt = pr->n;
    for (size_t i = 0; i < base->n_stops; i++) {
        if (!(out->stops[i] = strdup(base->stops[i])))
            goto out_nomem;
        out->n_stops++;
    }
    return 200;
out_nomem:
    srv_gen_params_free(out);
    return srv_fail(503, NULL, NULL, "out of memory for a choice");
}

/* The request's prompts: the chat's messages rendered, or the legacy prompt(s); each must
 * be non-empty and leave a slot room to generate. Sets c->n_prompt. */
static int read_prompts(struct srv_app *app, const json_t *body, enum kind kind,
                        const struct srv_model_info *mi, bool echo, struct completion *c,
                        struct prompt **pr_out, size_t *n_out)
{
    int st;
    const char *prompt_field = kind == KIND_CHAT ? "messages" : "prompt";
    if (kind == KIND_CHAT) {
        struct lt_tokens tk = {0};
        if (!(*pr_out = calloc(1, sizeof(**pr_out))))
            return srv_fail(503, NULL, NULL, "out of memory");
        *n_out = 1;
        c->chat_kind = mi->chat_kind;
        st = srv_tools_read(body, mi->chat_kind, &c->tools);
        if (st == 200)
            st = srv_chat_prompt_tools(app, body, &c->tools, &tk);
        (*pr_out)->ids = tk.ids;
        (*pr_out)->n = tk.n;
        free(tk.offs);
    } else {
        st = text_prompts(app, body, echo, pr_out, n_out);
    }
    c->n_prompt = 0;
    for (size_t i = 0; st == 200 && i < *n_out; i++) {
        const struct prompt *p = &(*pr_out)[i];
        if (p->n == 0)
            return srv_fail(400, prompt_field, "invalid_value", "the prompt is empty");
        if ((int64_t)p->n >= mi->n_ctx)
            return srv_fail(400, prompt_field, "context_length_exceeded",
                            "the prompt has %zu tokens; a slot holds %d (prompt and completion)",
                            p->n, mi->n_ctx);
        c->n_prompt += (int)p->n;
    }
    return st;
}

/* One generation of prompt pr per each of the n choices asked for, queued in the engine;
 * a choice's seed is the request's plus its index among the prompt's choices. */
static int submit_choices(struct srv_app *app, const json_t *body, const struct srv_gen_params *p,
                          const struct prompt *pr, size_t n_pr, int n, struct completion *c)
{
    c->ch = calloc(n_pr * (size_t)n, sizeof(*c->ch));
    if (!c->ch)
        return srv_fail(503, NULL, NULL, "out of memory for %zu choices", n_pr * (size_t)n);
    c->per_prompt = n;
    long long seed = srv_json_int(body, "seed", -1);
    int st = 200;
    for (size_t i = 0; i < n_pr; i++) {
        for (int j = 0; j < n; j++) {
            struct choice *ch = &c->ch[c->n_choices];
            struct srv_gen_params cp;
            if ((st = params_for_choice(p, &pr[i], &cp)) != 200)
                return st;
            cp.sampling.seed = seed >= 0 ? (uint64_t)seed + (uint64_t)j : fresh_random();
            if ((st = srv_gen_new(&cp, &ch->g)) != 200)
                return st;
            c->n_choices++;
            if (pr[i].text) {
                if (!(ch->echo = malloc(pr[i].text_len + 1)))
                    return srv_fail(503, NULL, NULL, "out of memory for the prompt's text");
                memcpy(ch->echo, pr[i].text, pr[i].text_len + 1);
                ch->echo_len = pr[i].text_len;
            }
            if ((st = app->engine->iface->submit(app->engine, ch->g)) != 200)
                return st;
        }
    }
    return st;
}

/* The response's identity: kind, streaming, id, creation time and the model named. */
static void set_identity(const json_t *body, enum kind kind, const struct srv_model_info *mi,
                         struct completion *c)
{
    c->kind = kind;
    c->stream = srv_json_bool(body, "stream", false);
    c->include_usage = srv_json_bool(srv_json_get(body, "stream_options"), "include_usage", false);
    c->created = (long long)srv_now_unix();
    snprintf(c->id, sizeof(c->id), "%s-%016llx", kind == KIND_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)fresh_random());
    /* the id asked for (a fine-tuned model, an adapter's name), as OpenAI answers */
    const char *asked = srv_json_str(body, "model", NULL);
    snprintf(c->model, sizeof(c->model), "%s", asked && *asked ? asked : mi->id);
}

/* Everything up to submission; on success every c->ch[i].g is queued in the engine. */
static int start_completion(struct srv_app *app, const struct srv_request *rq, enum kind kind,
                            json_t **body_out, struct completion *c)
{
    json_t *body = NULL;
    struct srv_gen_params p = {0};
    struct prompt *pr = NULL;
    size_t n_pr = 0;
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    int st = srv_parse_body(rq, &body);
    *body_out = body;
    if (st == 200)
        st = kind == KIND_CHAT ? check_fields(body, chat_fields, N_CHAT)
                               : check_fields(body, text_fields, 3);
    if (st == 200)
        st = read_sampling(body, &p);
    if (st == 200)
        st = read_logprobs(body, kind, c, &p);
    int n = st == 200 ? (int)srv_json_int(body, "n", 1) : 1;
    if (st == 200 && n > mi.parallel)
        st = srv_fail(400, "n", "out_of_range",
                      "'n' is at most %d, the server's slot count (--parallel), not %d",
                      mi.parallel, n);
    bool echo = st == 200 && kind == KIND_TEXT && srv_json_bool(body, "echo", false);
    if (echo && (c->legacy_top >= 0 || c->n_probs > 0))
        st = srv_fail(400, "echo", "unsupported",
                      "'echo' with log-probabilities would need the prompt's, which lathe does "
                      "not compute; ask for one or the other");
    if (st == 200)
        st = read_prompts(app, body, kind, &mi, echo, c, &pr, &n_pr);
    if (st == 200) {
        set_identity(body, kind, &mi, c);
        st = submit_choices(app, body, &p, pr, n_pr, n, c);
    }
    if (st != 200)
        completion_free(c);
    prompts_free(pr, n_pr);
    srv_gen_params_free(&p);
    return st;
}

/* ---- log-probabilities (their JSON: routes_logprobs.c) ---- */

/* Sets a choice's "logprobs" (and llama.cpp's "completion_probabilities") from records. */
static void choice_set_lp(struct srv_app *app, const struct completion *c,
                          const struct choice *ch, json_t *choice, const struct srv_token_lp *r,
                          size_t n)
{
    json_t *lp = json_null();
    if (c->kind == KIND_CHAT && c->chat_top >= 0)
        lp = json_pack("{s:o,s:n}", "content", srv_lp_content_json(app, r, n, c->chat_top, false),
                       "refusal");
    else if (c->kind == KIND_TEXT && c->legacy_top >= 0)
        lp = srv_lp_legacy_json(app, r, n, c->legacy_top, ch->echo_len);
    json_object_set_new(choice, "logprobs", lp);
    if (c->n_probs > 0)
        json_object_set_new(choice, "completion_probabilities",
                            srv_lp_content_json(app, r, n, c->n_probs, true));
}

/* ---- for llama.cpp's /completion (routes_native.c) ---- */

int srv_completion_params(struct srv_app *app, const json_t *body, struct srv_gen_params *p)
{
    struct prompt *pr = NULL;
    size_t n_pr = 0;
    int st = read_sampling(body, p);
    if (st == 200)
        st = text_prompts(app, body, false, &pr, &n_pr);
    if (st == 200 && n_pr != 1)
        st = srv_fail(400, "prompt", "invalid_value", "one prompt: a string or token ids");
    if (st == 200) {
        p->prompt = pr[0].ids;
        p->n_prompt = pr[0].n;
        pr[0].ids = NULL;
        /* n_probs: the log-probabilities llama.cpp reports by default (of the model's
         * logits, before sampling: lt_gen_logprobs) */
        long long np = srv_json_int(body, "n_probs", 0);
        p->logprobs = np > 0;
        p->top_logprobs = np > LT_GEN_MAX_TOP_LOGPROBS ? LT_GEN_MAX_TOP_LOGPROBS
                                                       : (np > 0 ? (int)np : 0);
    }
    prompts_free(pr, n_pr);
    return st;
}

/* ---- shaping the response ---- */

/* Token counts, OpenAI's form; cached_tokens: the prompt tokens a slot already held
 * (the prompt cache), counted for each prompt's first choice as prompt_tokens counts them. */
static json_t *usage_json(const struct completion *c, int n_completion)
{
    int cached = 0;
    for (int i = 0; i < c->n_choices; i += c->per_prompt > 0 ? c->per_prompt : 1) {
        pthread_mutex_lock(&c->ch[i].g->mu);
        cached += (int)c->ch[i].g->n_cached;
        pthread_mutex_unlock(&c->ch[i].g->mu);
    }
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", c->n_prompt, "completion_tokens",
                     n_completion, "total_tokens", c->n_prompt + n_completion,
                     "prompt_tokens_details", "cached_tokens", cached);
}

static json_t *timings_json(const struct srv_gen_snap *s)
{
    double gen_s = s->total_s - s->first_token_s;
    return json_pack("{s:f,s:f,s:f,s:f}", "queue_s", s->queue_s, "first_token_s",
                     s->first_token_s, "total_s", s->total_s, "tokens_per_s",
                     gen_s > 0 && s->n_completion > 1 ? (s->n_completion - 1) / gen_s : 0.0);
}

static const char *finish_reason(enum srv_finish f)
{
    return f == SRV_FINISH_LENGTH ? "length" : "stop";
}

static bool failed(const struct srv_gen_snap *s)
{
    return s->finish == SRV_FINISH_ERROR || s->finish == SRV_FINISH_CANCELLED;
}

static void respond_whole(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs, struct completion *c)
{
    struct srv_gen_snap s, last = {0};
    for (int i = 0; i < c->n_choices; i++) {
        size_t seen = 0;
        for (;;) {
            seen = srv_gen_wait(c->ch[i].g, seen, 100);
            srv_gen_snapshot(c->ch[i].g, 0, NULL, &s);
            if (s.done)
                break;
            if (!srv_conn_alive(rq->conn)) {
                srv_respond_error(rs, 499, NULL, "client_closed",
                                  "the client closed the connection");
                return; /* the caller cancels them all */
            }
        }
    }
    json_t *choices = json_array();
    int n_completion = 0;
    for (int i = 0; i < c->n_choices; i++) {
        struct choice *ch = &c->ch[i];
        struct lt_strbuf text = {0};
        if (ch->echo)
            lt_strbuf_append(&text, ch->echo, ch->echo_len);
        srv_gen_snapshot(ch->g, 0, &text, &s);
        if (failed(&s)) {
            srv_respond_error(rs, s.err_status ? s.err_status : 500, NULL, NULL, "%s",
                              s.err[0] ? s.err : "the generation was cancelled");
            lt_strbuf_free(&text);
            json_decref(choices);
            return;
        }
        n_completion += s.n_completion;
        if (s.total_s >= last.total_s)
            last = s;
        json_t *choice;
        if (c->kind == KIND_CHAT && c->tools.parse) {
            bool called = false;
            json_t *msg = srv_tool_message(&c->tools, c->chat_kind, text.data, text.len,
                                           fresh_random, &called);
            choice = json_pack("{s:i,s:o,s:s}", "index", i, "message", msg ? msg : json_null(),
                               "finish_reason", called ? "tool_calls" : finish_reason(s.finish));
        } else {
            json_t *content = srv_json_text(text.data, text.len);
            choice =
                c->kind == KIND_CHAT
                    ? json_pack("{s:i,s:{s:s,s:o},s:s}", "index", i, "message", "role", "assistant",
                                "content", content, "finish_reason", finish_reason(s.finish))
                    : json_pack("{s:i,s:o,s:s}", "index", i, "text", content, "finish_reason",
                                finish_reason(s.finish));
        }
        lt_strbuf_free(&text);
        struct srv_token_lp *r = NULL;
        size_t n_r = ch->g->p.logprobs ? srv_gen_logprobs(ch->g, 0, s.visible, &r) : 0;
        choice_set_lp(app, c, ch, choice, r, n_r);
        free(r);
        json_array_append_new(choices, choice);
    }
    srv_respond_json(rs, 200,
                     json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o,s:o}", "id", c->id, "object",
                               c->kind == KIND_CHAT ? "chat.completion" : "text_completion",
                               "created", (json_int_t)c->created, "model", c->model,
                               "system_fingerprint", "lathe", "choices", choices, "usage",
                               usage_json(c, n_completion), "timings", timings_json(&last)));
}

/* A streamed response in progress. */
struct stream_state {
    struct srv_app *app;
    struct completion c;
    bool opened; /* the role chunks (chat) or echoed prompts (legacy) are out */
    int n_completion;
    struct srv_gen_snap last; /* the choice that finished last */
};

static void sse_event(struct lt_strbuf *out, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return;
    lt_strbuf_append(out, "data: ", 6);
    lt_strbuf_append(out, s, strlen(s));
    lt_strbuf_append(out, "\n\n", 2);
    free(s);
}

/* One chunk of choice `index`; delta_or_text is the chat delta object or the completion text
 * (stolen). Its logprobs are null; choice_set_lp replaces them. */
static json_t *chunk_json(const struct completion *c, int index, json_t *delta_or_text,
                          const char *finish)
{
    json_t *choice =
        c->kind == KIND_CHAT
            ? json_pack("{s:i,s:o,s:n,s:s?}", "index", index, "delta", delta_or_text, "logprobs",
                        "finish_reason", finish)
            : json_pack("{s:i,s:o,s:n,s:s?}", "index", index, "text", delta_or_text, "logprobs",
                        "finish_reason", finish);
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o]}", "id", c->id, "object",
                     c->kind == KIND_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)c->created, "model", c->model, "system_fingerprint", "lathe",
                     "choices", choice);
}

static json_t *text_delta(const struct completion *c, const char *s, size_t n)
{
    json_t *t = srv_json_text(s, n);
    return c->kind == KIND_CHAT ? json_pack("{s:o}", "content", t) : t;
}

/* Sends what choice i has shown since the last call; true when it has ended now (finished,
 * or failed: then *err is its error event). */
static bool stream_choice(struct stream_state *ss, int i, struct lt_strbuf *out, bool *got,
                          json_t **err)
{
    struct completion *c = &ss->c;
    struct choice *ch = &c->ch[i];
    struct lt_strbuf text = {0};
    struct srv_gen_snap s;
    srv_gen_snapshot(ch->g, ch->sent, &text, &s);
    ch->seen = s.visible;
    /* with tools, text from where a call could start is held back until the end; a forced
     * call (prefill) holds it all */
    bool tools = c->kind == KIND_CHAT && c->tools.parse;
    size_t show = !tools             ? text.len
                  : c->tools.prefill ? 0
                                     : lt_chat_tool_safe_len(text.data, text.len);
    struct srv_token_lp *r = NULL;
    size_t n_r = ch->g->p.logprobs ? srv_gen_logprobs(ch->g, ch->lp_sent, s.visible, &r) : 0;
    /* records are kept even when not asked for; held-back text sends none on their own */
    bool lp_wanted = !tools || c->chat_top >= 0 || c->n_probs > 0;
    if (show > 0 || (n_r > 0 && lp_wanted)) {
        json_t *chunk = chunk_json(c, i, text_delta(c, text.data, show), NULL);
        if (n_r > 0 && chunk)
            choice_set_lp(ss->app, c, ch, json_array_get(json_object_get(chunk, "choices"), 0),
                          r, n_r);
        sse_event(out, chunk);
        ch->sent += show;
        ch->lp_sent += n_r;
        *got = true;
    }
    free(r);
    if (!s.done || failed(&s)) {
        lt_strbuf_free(&text);
        if (!s.done)
            return false;
        int status = s.err_status ? s.err_status : 500;
        *err = srv_error_json(status, NULL, NULL, s.err[0] ? s.err : "cancelled");
        return true;
    }
    if (tools) {
        json_t *deltas = srv_tool_deltas(&c->tools, c->chat_kind, c->tools.prefill != NULL,
                                         text.data ? text.data + show : "", text.len - show,
                                         fresh_random, &ch->called);
        for (size_t k = 0; k < json_array_size(deltas); k++)
            sse_event(out, chunk_json(c, i, json_incref(json_array_get(deltas, k)), NULL));
        json_decref(deltas);
    }
    lt_strbuf_free(&text);
    ss->n_completion += s.n_completion;
    if (s.total_s >= ss->last.total_s)
        ss->last = s;
    ch->ended = true;
    return true;
}

static bool stream_fill(void *user, struct srv_conn *conn, struct lt_strbuf *out, bool *end)
{
    struct stream_state *ss = user;
    struct completion *c = &ss->c;
    if (!ss->opened) {
        ss->opened = true;
        for (int i = 0; i < c->n_choices; i++) {
            if (c->kind == KIND_CHAT)
                sse_event(out, chunk_json(c, i, json_pack("{s:s,s:s}", "role", "assistant",
                                                          "content", ""), NULL));
            else if (c->ch[i].echo)
                sse_event(out, chunk_json(c, i, text_delta(c, c->ch[i].echo, c->ch[i].echo_len),
                                          NULL));
        }
        if (out->len > 0)
            return true;
    }
    int first = 0;
    while (first < c->n_choices && c->ch[first].ended)
        first++;
    if (first < c->n_choices)
        srv_gen_wait(c->ch[first].g, c->ch[first].seen, c->n_choices > 1 ? 20 : 100);
    bool got = false;
    int left = 0;
    for (int i = 0; i < c->n_choices; i++) {
        if (c->ch[i].ended)
            continue;
        json_t *err = NULL;
        if (!stream_choice(ss, i, out, &got, &err)) {
            left++;
            continue;
        }
        if (err) {
            sse_event(out, err);
            lt_strbuf_append(out, "data: [DONE]\n\n", 14);
            *end = true;
            return true; /* stream_free cancels the others */
        }
        /* its finish chunk; the last one to finish carries the usage and timings */
        bool all = true;
        for (int k = 0; k < c->n_choices && all; k++)
            all = c->ch[k].ended;
        struct srv_gen_snap s;
        srv_gen_snapshot(c->ch[i].g, 0, NULL, &s);
        json_t *last = chunk_json(c, i, c->kind == KIND_CHAT ? json_object() : json_string(""),
                                  c->ch[i].called ? "tool_calls" : finish_reason(s.finish));
        if (all) {
            json_object_set_new(last, "usage", usage_json(c, ss->n_completion));
            json_object_set_new(last, "timings", timings_json(&ss->last));
        }
        sse_event(out, last);
    }
    if (left > 0) {
        if (!got && !srv_conn_alive(conn))
            return false; /* stream_free cancels them */
        return true;
    }
    if (c->include_usage) {
        json_t *u = chunk_json(c, 0, json_object(), NULL);
        json_object_set_new(u, "choices", json_array());
        json_object_set_new(u, "usage", usage_json(c, ss->n_completion));
        sse_event(out, u);
    }
    lt_strbuf_append(out, "data: [DONE]\n\n", 14);
    *end = true;
    return true;
}

static void stream_free(void *user)
{
    struct stream_state *ss = user;
    completion_free(&ss->c);
    free(ss);
}

static void route_completion(struct srv_app *app, const struct srv_request *rq,
                             struct srv_response *rs, enum kind kind)
{
    json_t *body = NULL;
    struct completion c = {0};
    if (!srv_require_ready(app, rs))
        return;
    int st = start_completion(app, rq, kind, &body, &c);
    json_decref(body);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        return;
    }
    if (!c.stream) {
        respond_whole(app, rq, rs, &c);
        completion_free(&c);
        return;
    }
    struct stream_state *ss = calloc(1, sizeof(*ss));
    if (!ss) {
        completion_free(&c);
        srv_respond_error(rs, 503, NULL, NULL, "out of memory for a stream");
        return;
    }
    ss->app = app;
    ss->c = c;
    rs->status = 200;
    rs->content_type = "text/event-stream";
    rs->is_stream = true;
    rs->stream = (struct srv_stream){.fill = stream_fill, .free = stream_free, .user = ss};
}

void srv_route_chat(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    route_completion(app, rq, rs, KIND_CHAT);
}

void srv_route_completions(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs)
{
    route_completion(app, rq, rs, KIND_TEXT);
}

#endif
