/* test_server_fake.h: a fake engine for the server's HTTP and route tests (with the small
 * HTTP/1.0 client of http_client.h). The fake has a byte vocabulary (token id = byte value,
 * 256 tokens); a "chat" prompt is the bytes of "role:content\n" per message; a generation
 * produces the words "w0 w1 w2 ..." one per token, max_tokens of them (5 by default), on
 * a thread of its own, stopping early when cancelled. A prompt containing "FAIL" fails
 * with 500 after one word; one containing "SLOW" waits 30 ms per word and makes 400. */
#ifndef LATHE_TESTS_SERVER_FAKE_H
#define LATHE_TESTS_SERVER_FAKE_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http_client.h"
#include "server/server_impl.h"

/* ---- the fake engine ---- */

struct fake {
    atomic_int state;
    atomic_int running;   /* generation threads alive */
    atomic_int cancelled; /* generations that saw a cancel */
    atomic_int finished;
    /* what the routes passed in */
    pthread_mutex_t mu;
    struct lt_train_params train_p;
    char train_out[512], train_text[4096], train_examples[4096], train_targets[256];
    char train_examples_path[512];
    struct srv_train_meta train_meta;
    int train_starts;
    bool train_busy;
    enum srv_train_op last_op;
    char last_op_id[64];
    int n_ops;
    char lora_name[128], lora_path[512];
    float lora_scale;
    int lora_loads, lora_unloads;
    char last_info_id[64];
    struct srv_gen_params last_gen; /* sampling etc. (prompt not kept) */
};

static struct fake fake;

static void fake_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static enum srv_state fake_state(struct srv_engine *e, char *why, size_t n)
{
    int s = atomic_load(&fake.state);
    if (s == SRV_STATE_FAILED && why)
        snprintf(why, n, "fake failure");
    return (enum srv_state)s;
}

static void fake_info(struct srv_engine *e, struct srv_model_info *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->id, sizeof(out->id), "fake-model");
    snprintf(out->arch, sizeof(out->arch), "fake");
    out->n_ctx = 512;
    out->parallel = 4;
    out->n_vocab = 256;
    out->n_ctx_train = 512;
    out->n_layer = 4;
    out->has_chat_template = true;
}

static int fake_tokenize(struct srv_engine *e, const char *text, size_t len, unsigned flags,
                         struct lt_tokens *out)
{
    for (size_t i = 0; i < len; i++) {
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 64;
            lt_token *ids = realloc(out->ids, cap * sizeof(lt_token));
            if (!ids)
                return srv_fail(503, NULL, NULL, "oom");
            out->ids = ids;
            out->cap = cap;
        }
        out->ids[out->n++] = (unsigned char)text[i];
    }
    return 200;
}

static int fake_detokenize(struct srv_engine *e, const lt_token *ids, size_t n, unsigned flags,
                           struct lt_strbuf *out)
{
    for (size_t i = 0; i < n; i++) {
        char c = (char)ids[i];
        lt_strbuf_append(out, &c, 1);
    }
    return 200;
}

static int fake_prompt_chat(struct srv_engine *e, const struct lt_chat_message *msgs, size_t n,
                            const struct lt_chat_options *opts, struct lt_tokens *out)
{
    for (size_t i = 0; i < n; i++) {
        char buf[4096];
        int w = snprintf(buf, sizeof(buf), "%s:%s\n", msgs[i].role, msgs[i].content);
        fake_tokenize(e, buf, (size_t)w, 0, out);
    }
    return 200;
}

static int fake_prompt_text(struct srv_engine *e, const char *text, struct lt_tokens *out)
{
    return fake_tokenize(e, text, strlen(text), 0, out);
}

static bool prompt_has(const struct srv_gen *g, const char *word)
{
    size_t n = strlen(word);
    for (size_t i = 0; i + n <= g->p.n_prompt; i++) {
        size_t k = 0;
        while (k < n && g->p.prompt[i + k] == (unsigned char)word[k])
            k++;
        if (k == n)
            return true;
    }
    return false;
}

static void *fake_gen_main(void *arg)
{
    struct srv_gen *g = arg;
    bool slow = prompt_has(g, "SLOW"), fail = prompt_has(g, "FAIL");
    int n = slow ? 400 : g->p.max_tokens > 0 ? g->p.max_tokens : 5;
    srv_gen_mark_started(g);
    enum srv_finish why = g->p.max_tokens > 0 ? SRV_FINISH_LENGTH : SRV_FINISH_STOP;
    for (int i = 0; i < n; i++) {
        if (srv_gen_cancelled(g)) {
            atomic_fetch_add(&fake.cancelled, 1);
            why = SRV_FINISH_CANCELLED;
            break;
        }
        char w[32];
        int len = snprintf(w, sizeof(w), "%sw%d", i ? " " : "", i);
        srv_gen_push(g, w, (size_t)len, i + 1);
        if (fail) {
            srv_gen_fail(g, 500, "the fake failed on purpose");
            why = SRV_FINISH_ERROR;
            break;
        }
        fake_sleep_ms(slow ? 30 : 1);
    }
    srv_gen_finish(g, why);
    srv_gen_unref(g);
    atomic_fetch_add(&fake.finished, 1);
    atomic_fetch_sub(&fake.running, 1);
    return NULL;
}

static int fake_submit(struct srv_engine *e, struct srv_gen *g)
{
    pthread_mutex_lock(&fake.mu);
    fake.last_gen = g->p;
    fake.last_gen.prompt = NULL;
    memset(fake.last_gen.stops, 0, sizeof(fake.last_gen.stops));
    pthread_mutex_unlock(&fake.mu);
    srv_gen_ref(g);
    atomic_fetch_add(&fake.running, 1);
    pthread_t t;
    if (pthread_create(&t, NULL, fake_gen_main, g) != 0) {
        atomic_fetch_sub(&fake.running, 1);
        srv_gen_unref(g);
        return srv_fail(503, NULL, NULL, "no thread");
    }
    pthread_detach(t);
    return 200;
}

static void fake_metrics(struct srv_engine *e, struct lt_strbuf *out)
{
    lt_strbuf_append(out, "fake_metric 1\n", 14);
}

static int fake_lora_list(struct srv_engine *e, struct srv_lora_info **out, int *n)
{
    pthread_mutex_lock(&fake.mu);
    *n = fake.lora_name[0] ? 1 : 0;
    *out = calloc(1, sizeof(**out));
    if (*n) {
        (*out)[0].id = 7;
        snprintf((*out)[0].name, sizeof((*out)[0].name), "%s", fake.lora_name);
        snprintf((*out)[0].path, sizeof((*out)[0].path), "%s", fake.lora_path);
        (*out)[0].scale = fake.lora_scale;
    }
    pthread_mutex_unlock(&fake.mu);
    return 200;
}

static int fake_lora_load(struct srv_engine *e, const char *name, const char *path, float scale)
{
    pthread_mutex_lock(&fake.mu);
    snprintf(fake.lora_name, sizeof(fake.lora_name), "%s", name);
    snprintf(fake.lora_path, sizeof(fake.lora_path), "%s", path);
    fake.lora_scale = scale;
    fake.lora_loads++;
    pthread_mutex_unlock(&fake.mu);
    return 200;
}

static int fake_lora_unload(struct srv_engine *e, const char *name)
{
    pthread_mutex_lock(&fake.mu);
    int st = 200;
    if (strcmp(name, fake.lora_name) != 0)
        st = srv_fail(404, "name", "lora_not_loaded", "no adapter named '%s'", name);
    else {
        fake.lora_name[0] = 0;
        fake.lora_unloads++;
    }
    pthread_mutex_unlock(&fake.mu);
    return st;
}

static int fake_lora_set_scale(struct srv_engine *e, const char *name, int id, float scale)
{
    pthread_mutex_lock(&fake.mu);
    int st = 200;
    if ((name && strcmp(name, fake.lora_name) != 0) || (!name && id != 7))
        st = srv_fail(404, "name", "lora_not_loaded", "no such adapter");
    else
        fake.lora_scale = scale;
    pthread_mutex_unlock(&fake.mu);
    return st;
}

static void copy_str(char *dst, size_t n, const char *s)
{
    snprintf(dst, n, "%s", s ? s : "");
}

static int fake_train_start(struct srv_engine *e, const struct lt_train_params *p,
                            const struct srv_train_meta *meta, char *id, size_t n)
{
    pthread_mutex_lock(&fake.mu);
    int st = 200;
    if (fake.train_busy) {
        st = srv_fail(409, NULL, "job_running", "a job is running");
    } else {
        fake.train_p = *p;
        copy_str(fake.train_out, sizeof(fake.train_out), p->out);
        copy_str(fake.train_text, sizeof(fake.train_text), p->text);
        copy_str(fake.train_examples, sizeof(fake.train_examples), p->examples);
        copy_str(fake.train_examples_path, sizeof(fake.train_examples_path), p->examples_path);
        copy_str(fake.train_targets, sizeof(fake.train_targets), p->targets);
        fake.train_meta = *meta;
        fake.train_starts++;
        snprintf(id, n, "ftjob-fake%d", fake.train_starts);
    }
    pthread_mutex_unlock(&fake.mu);
    return st;
}

static int fake_train_info(struct srv_engine *e, const char *id, struct srv_train_info *out)
{
    pthread_mutex_lock(&fake.mu);
    copy_str(fake.last_info_id, sizeof(fake.last_info_id), id);
    int st = 200;
    if (fake.train_starts == 0) {
        st = srv_fail(404, NULL, "not_found", "no training job has run");
    } else if (id && *id && strncmp(id, "ftjob-fake", 10) != 0) {
        st = srv_fail(404, NULL, "not_found", "no training job '%s'", id);
    } else {
        memset(out, 0, sizeof(*out));
        snprintf(out->id, sizeof(out->id), "ftjob-fake%d", fake.train_starts);
        out->meta = fake.train_meta;
        out->state = LT_TRAIN_ERROR;
        out->params = fake.train_p;
        out->params.out = NULL;
        out->have_result = true;
        out->result.state = LT_TRAIN_ERROR;
        out->result.refusal.kind = LT_REFUSAL_DEVICE_ONLY;
        snprintf(out->result.refusal.op, sizeof(out->result.refusal.op), "SQR");
        snprintf(out->result.refusal.node, sizeof(out->result.refusal.node), "grad for k_conv-2");
        snprintf(out->result.error, sizeof(out->result.error),
                 "refused: SQR 'grad for k_conv-2' on 'k_conv-2'");
        out->n_epochs = 1;
        out->train_loss[0] = 2.5f;
        out->eval_loss[0] = NAN;
        out->n_events = 2;
        snprintf(out->events[0].message, sizeof(out->events[0].message), "first");
        snprintf(out->events[0].level, sizeof(out->events[0].level), "info");
        snprintf(out->events[1].message, sizeof(out->events[1].message), "second");
        snprintf(out->events[1].level, sizeof(out->events[1].level), "error");
    }
    pthread_mutex_unlock(&fake.mu);
    return st;
}

static int fake_train_list(struct srv_engine *e, char (*ids)[48], int max, int *n)
{
    pthread_mutex_lock(&fake.mu);
    *n = fake.train_starts > 0 ? 1 : 0;
    if (*n)
        snprintf(ids[0], 48, "ftjob-fake%d", fake.train_starts);
    pthread_mutex_unlock(&fake.mu);
    return 200;
}

static int fake_train_control(struct srv_engine *e, const char *id, enum srv_train_op op)
{
    pthread_mutex_lock(&fake.mu);
    fake.last_op = op;
    copy_str(fake.last_op_id, sizeof(fake.last_op_id), id);
    fake.n_ops++;
    pthread_mutex_unlock(&fake.mu);
    return 200;
}

static const struct srv_engine_iface fake_iface = {
    .state = fake_state,
    .info = fake_info,
    .tokenize = fake_tokenize,
    .detokenize = fake_detokenize,
    .prompt_chat = fake_prompt_chat,
    .prompt_text = fake_prompt_text,
    .submit = fake_submit,
    .metrics = fake_metrics,
    .lora_list = fake_lora_list,
    .lora_load = fake_lora_load,
    .lora_unload = fake_lora_unload,
    .lora_set_scale = fake_lora_set_scale,
    .train_start = fake_train_start,
    .train_info = fake_train_info,
    .train_list = fake_train_list,
    .train_control = fake_train_control,
};

#endif
