/* cmd_tokenize.c: `lathe tokenize MODEL.gguf [options]`: encodes standard input with the
 * model's tokenizer, decodes token ids, or renders a chat, for people and for the Python
 * cross-checks (tests/py/test_tokenizer_cross.py). Input is read whole, as bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "lathe/gguf.h"
#include "lathe/tokenizer.h"

static const char usage_text[] =
    "usage: lathe tokenize MODEL.gguf [options] < INPUT\n"
    "  (default)      print the token ids of the input bytes, space-separated\n"
    "  --special      recognise special tokens' text (<|im_start|>, ...) in the input\n"
    "  --bos          prepend the bos token\n"
    "  --bin          write the ids as little-endian int32 instead of text\n"
    "  --offsets      print 'id offset' per line instead\n"
    "  --decode       read ids (whitespace-separated) and write their bytes\n"
    "                 (--special: render control tokens)\n"
    "  --chat         render conversations with the model's chat template; input: per\n"
    "                 conversation a field \"chat N [gen] [think]\" (gen: add the generation\n"
    "                 prompt; think: enable thinking) then N role, content pairs, every field\n"
    "                 ending with a NUL; output: each rendered text followed by a NUL.\n"
    "                 \"chat N tools\": a field with the tools' JSON follows the header; a\n"
    "                 role \"assistant calls\": a field with its tool_calls' JSON follows\n"
    "                 its content\n"
    "    --spans FILE   per conversation: its token ids, one line per assistant turn\n"
    "                   (message turn_begin content_begin content_end turn_end\n"
    "                   tok_turn_begin tok_turn_end tok_content_begin tok_content_end), '--'\n"
    "  --info         print the tokenizer's settings\n"
    "  --time         report the encoding time on stderr\n";

static int read_all(FILE *f, struct lt_strbuf *out)
{
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        if (lt_strbuf_append(out, buf, n))
            return -1;
    if (lt_strbuf_append(out, "", 0))
        return -1;
    return ferror(f) ? -1 : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct opts {
    const char *model, *spans;
    bool special, bos, bin, offsets, decode, chat, info, time;
};

static int run_encode(const struct lt_tokenizer *t, const struct opts *o,
                      const struct lt_strbuf *in)
{
    struct lt_tokens tk = {.want_offsets = o->offsets};
    unsigned flags =
        (o->special ? LT_TOKENIZE_PARSE_SPECIAL : 0) | (o->bos ? LT_TOKENIZE_ADD_BOS : 0);
    double t0 = now_s();
    if (lt_tokenize(t, in->data, in->len, flags, &tk)) {
        fprintf(stderr, "lathe tokenize: %s\n", lt_last_error());
        return 1;
    }
    double dt = now_s() - t0;
    if (o->time)
        fprintf(stderr, "lathe tokenize: %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n", in->len,
                tk.n, dt, dt > 0 ? (double)in->len / dt / 1e6 : 0.0);
    if (o->bin) {
        for (size_t i = 0; i < tk.n; i++) {
            unsigned char b[4] = {(unsigned char)tk.ids[i], (unsigned char)(tk.ids[i] >> 8),
                                  (unsigned char)(tk.ids[i] >> 16),
                                  (unsigned char)(tk.ids[i] >> 24)};
            fwrite(b, 1, 4, stdout);
        }
    } else if (o->offsets) {
        for (size_t i = 0; i < tk.n; i++)
            printf("%d %zu\n", tk.ids[i], tk.offs[i]);
    } else {
        for (size_t i = 0; i < tk.n; i++)
            printf(i ? " %d" : "%d", tk.ids[i]);
        printf("\n");
    }
    lt_tokens_free(&tk);
    return 0;
}

static int run_decode(const struct lt_tokenizer *t, const struct opts *o,
                      const struct lt_strbuf *in)
{
    struct lt_strbuf out = {0};
    const char *p = in->data;
    int rc = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p) {
            if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') {
                p++;
                continue;
            }
            fprintf(stderr, "lathe tokenize --decode: not a token id at '%.20s'\n", p);
            rc = 1;
            goto out_free_text;
        }
        lt_token id = (lt_token)v;
        if (errno || v != id ||
            lt_detokenize(t, &id, 1, o->special ? LT_DETOKENIZE_SPECIAL : 0, &out)) {
            fprintf(stderr, "lathe tokenize --decode: %s\n",
                    errno ? "id out of range" : lt_last_error());
            rc = 1;
            goto out_free_text;
        }
        p = end;
    }
    fwrite(out.data ? out.data : "", 1, out.len, stdout);
out_free_text:
    lt_strbuf_free(&out);
    return rc;
}

/* One conversation of the --chat input: a header field "chat N [gen] [think] [tools]" (then
 * the tools' JSON), then N role, content pairs (a role "ROLE calls": then the message's
 * tool_calls JSON); every field ends with a NUL. */
static int read_conversation(const struct lt_strbuf *in, size_t *pos, struct lt_chat_message **msgs,
                             size_t *n, struct lt_chat_options *co)
{
    const char *end = in->data + in->len, *p = in->data + *pos;
    const char *hdr = p;
    if (!memchr(p, 0, (size_t)(end - p)) || strncmp(hdr, "chat ", 5))
        return -1;
    *n = strtoul(hdr + 5, NULL, 10);
    co->add_generation_prompt = strstr(hdr, " gen") != NULL;
    co->enable_thinking = strstr(hdr, " think") != NULL;
    bool tools = strstr(hdr, " tools") != NULL;
    p += strlen(p) + 1;
    if (tools) {
        if (p >= end || !memchr(p, 0, (size_t)(end - p)))
            return -1;
        co->tools = p;
        p += strlen(p) + 1;
    }
    *msgs = calloc(*n + 1, sizeof(**msgs));
    if (!*msgs)
        return -1;
    for (size_t i = 0; i < *n; i++) {
        bool calls = false;
        for (int f = 0; f < 2 + calls; f++) {
            if (p >= end || !memchr(p, 0, (size_t)(end - p)))
                return -1;
            size_t len = strlen(p);
            if (f == 0 && len > 6 && !strcmp(p + len - 6, " calls")) {
                in->data[(size_t)(p - in->data) + len - 6] = 0; /* the role alone */
                calls = true;
            }
            if (f == 0)
                (*msgs)[i].role = p;
            else if (f == 1)
                (*msgs)[i].content = p;
            else
                (*msgs)[i].tool_calls = p;
            p += len + 1;
        }
    }
    *pos = (size_t)(p - in->data);
    return 0;
}

static int render_one(const struct lt_tokenizer *t, const struct lt_chat_template *ct,
                      const struct lt_chat_message *msgs, size_t n,
                      const struct lt_chat_options *co, FILE *spans_file)
{
    int rc = 1;
    struct lt_chat_render r;
    struct lt_tokens tk = {0};
    struct lt_chat_token_span *spans = NULL;
    if (lt_chat_render(ct, msgs, n, co, &r)) {
        fprintf(stderr, "lathe tokenize --chat: %s\n", lt_last_error());
        return 1;
    }
    fwrite(r.text.data, 1, r.text.len, stdout);
    fputc(0, stdout);
    if (spans_file) {
        spans = calloc(r.n_spans + 1, sizeof(*spans));
        if (!spans || lt_chat_tokenize(t, &r, &tk, spans)) {
            fprintf(stderr, "lathe tokenize --chat: %s\n",
                    spans ? lt_last_error() : "out of memory");
            goto out_free_render;
        }
        for (size_t i = 0; i < tk.n; i++)
            fprintf(spans_file, i ? " %d" : "%d", tk.ids[i]);
        fprintf(spans_file, "\n");
        for (size_t s = 0; s < r.n_spans; s++)
            fprintf(spans_file, "%zu %zu %zu %zu %zu %zu %zu %zu %zu\n", r.spans[s].message,
                    r.spans[s].turn_begin, r.spans[s].content_begin, r.spans[s].content_end,
                    r.spans[s].turn_end, spans[s].turn_begin, spans[s].turn_end,
                    spans[s].content_begin, spans[s].content_end);
        fprintf(spans_file, "--\n");
    }
    rc = 0;
out_free_render:
    free(spans);
    lt_tokens_free(&tk);
    lt_chat_render_free(&r);
    return rc;
}

static int run_chat(const struct lt_tokenizer *t, const struct lt_gguf *g, const struct opts *o,
                    const struct lt_strbuf *in)
{
    struct lt_chat_template ct;
    if (lt_chat_template_from_gguf(g, &ct)) {
        fprintf(stderr, "lathe tokenize --chat: %s\n", lt_last_error());
        return 1;
    }
    int rc = 0;
    FILE *spans_file = NULL;
    if (o->spans && !(spans_file = fopen(o->spans, "w"))) {
        fprintf(stderr, "lathe tokenize --chat: cannot write %s: %s\n", o->spans, strerror(errno));
        rc = 1;
        goto out_free_template;
    }
    for (size_t pos = 0; pos < in->len && !rc;) {
        struct lt_chat_message *msgs = NULL;
        size_t n = 0;
        struct lt_chat_options co = {0};
        if (read_conversation(in, &pos, &msgs, &n, &co)) {
            fprintf(stderr,
                    "lathe tokenize --chat: malformed input at byte %zu (expected "
                    "\"chat N [gen] [think]\" then N role, content pairs, each "
                    "field ending with a NUL)\n",
                    pos);
            rc = 1;
        } else {
            rc = render_one(t, &ct, msgs, n, &co, spans_file);
        }
        free(msgs);
    }
    if (spans_file && fclose(spans_file)) {
        fprintf(stderr, "lathe tokenize --chat: writing %s failed\n", o->spans);
        rc = 1;
    }
out_free_template:
    lt_chat_template_free(&ct);
    return rc;
}

static void print_info(const struct lt_tokenizer *t, const struct lt_gguf *g)
{
    printf("pre-tokenizer: %s\n", lt_pretokenizer_name(lt_tokenizer_pre(t)));
    printf("tokens: %zu\n", lt_tokenizer_n_tokens(t));
    printf("bos: %d  eos: %d  eot: %d  pad: %d  add_bos: %s\n", lt_tokenizer_bos(t),
           lt_tokenizer_eos(t), lt_tokenizer_eot(t), lt_tokenizer_pad(t),
           lt_tokenizer_add_bos(t) ? "yes" : "no");
    printf("end of generation:");
    for (size_t i = 0; i < lt_tokenizer_n_tokens(t); i++)
        if (lt_tokenizer_is_eog(t, (lt_token)i))
            printf(" %zu '%s'", i, lt_tokenizer_token_text(t, (lt_token)i, NULL));
    printf("\n");
    struct lt_chat_template ct;
    if (lt_chat_template_from_gguf(g, &ct)) {
        printf("chat template: none usable (%s)\n", lt_last_error());
        return;
    }
    printf("chat template: %s", ct.kind == LT_CHAT_QWEN35 ? "qwen35" : "chatml");
    if (ct.default_system)
        printf(", default system prompt '%s'", ct.default_system);
    printf("\n");
    lt_chat_template_free(&ct);
}

int cmd_tokenize(int argc, char **argv)
{
    struct opts o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--special"))
            o.special = true;
        else if (!strcmp(a, "--bos"))
            o.bos = true;
        else if (!strcmp(a, "--bin"))
            o.bin = true;
        else if (!strcmp(a, "--offsets"))
            o.offsets = true;
        else if (!strcmp(a, "--decode"))
            o.decode = true;
        else if (!strcmp(a, "--chat"))
            o.chat = true;
        else if (!strcmp(a, "--info"))
            o.info = true;
        else if (!strcmp(a, "--time"))
            o.time = true;
        else if (!strcmp(a, "--spans") && i + 1 < argc)
            o.spans = argv[++i];
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (a[0] != '-' && !o.model)
            o.model = a;
        else {
            fprintf(stderr, "lathe tokenize: unknown argument '%s'\n%s", a, usage_text);
            return 2;
        }
    }
    if (!o.model) {
        fputs(usage_text, stderr);
        return 2;
    }
    struct lt_gguf *g;
    if (lt_gguf_open(o.model, &g)) {
        fprintf(stderr, "lathe tokenize: %s\n", lt_last_error());
        return 1;
    }
    int rc = 1;
    struct lt_tokenizer *t;
    struct lt_strbuf in = {0};
    if (lt_tokenizer_from_gguf(g, &t)) {
        fprintf(stderr, "lathe tokenize: %s: %s\n", o.model, lt_last_error());
        goto out_close_gguf;
    }
    if (o.info) {
        print_info(t, g);
        rc = 0;
        goto out_free_tokenizer;
    }
    if (read_all(stdin, &in)) {
        fprintf(stderr, "lathe tokenize: reading standard input failed\n");
        goto out_free_tokenizer;
    }
    if (o.decode)
        rc = run_decode(t, &o, &in);
    else if (o.chat)
        rc = run_chat(t, g, &o, &in);
    else
        rc = run_encode(t, &o, &in);
    if (fflush(stdout))
        rc = 1;
    lt_strbuf_free(&in);
out_free_tokenizer:
    lt_tokenizer_free(t);
out_close_gguf:
    lt_gguf_close(g);
    return rc;
}
