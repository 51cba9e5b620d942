/* test_server_lock.c: the server's locked backend proxy (src/server/backend_lock.c), which
 * lets the decode loop and a training job share one device backend. Run here around the CPU
 * backend, for each tiny architecture:
 *   - a model whose weights were uploaded through the proxy, decoding in a session on the
 *     proxy, gives exactly the logits of the same model on the plain CPU backend (the proxy
 *     is the same backend, not a copy: buffers name it, its inner functions find their
 *     context through it);
 *   - two threads decoding at once on two sessions sharing the proxy still give exactly the
 *     single-threaded logits, every step. */
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "server/engine_impl.h"
#include "test_model_util.h"

#define STEPS 10

struct run {
    struct lt_session *s;
    const int32_t *tokens;
    int n_vocab;
    float *logits; /* [STEPS, n_vocab] */
    lt_status st;
};

static void *decode_steps(void *arg)
{
    struct run *r = arg;
    int seq = 0;
    r->st = LT_OK;
    for (int i = 0; i < STEPS && r->st == LT_OK; i++)
        r->st = lt_session_decode(r->s, 1, &seq, &r->tokens[i], r->logits + (size_t)i * r->n_vocab);
    return NULL;
}

static void test_arch(const struct tm_spec *spec, const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/test_server_lock_%s.gguf", dir, spec->arch);
    CHECK(tm_write_model(spec, path, 99) == LT_OK, "%s", lt_last_error());
    struct lt_backend *cpu = lt_backend_cpu_new(1);
    struct lt_backend *proxy = srv_backend_locked_new(cpu);
    struct lt_backend *plain = lt_backend_cpu_new(1);
    CHECK(cpu && proxy && plain);
    struct lt_model *m_proxy = NULL, *m_plain = NULL;
    struct lt_model_params mp = {.weights_backend = proxy};
    CHECK(lt_model_load(path, &mp, &m_proxy) == LT_OK, "%s", lt_last_error());
    CHECK(lt_model_load(path, NULL, &m_plain) == LT_OK, "%s", lt_last_error());
    if (!m_proxy || !m_plain)
        goto out_free;
    int V = (int)lt_model_hparams(m_plain)->n_vocab;
    int32_t tokens[STEPS];
    for (int i = 0; i < STEPS; i++)
        tokens[i] = (i * 7 + 3) % V;

    struct lt_session_params sp_proxy = {.n_ctx = 32, .n_seq_max = 1, .backends = &proxy,
                                         .n_backends = 1};
    struct lt_session_params sp_plain = {.n_ctx = 32, .n_seq_max = 1, .backends = &plain,
                                         .n_backends = 1};
    struct lt_session *ref = NULL, *a = NULL, *b = NULL;
    CHECK(lt_session_new(m_plain, &sp_plain, &ref) == LT_OK, "%s", lt_last_error());
    CHECK(lt_session_new(m_proxy, &sp_proxy, &a) == LT_OK, "%s", lt_last_error());
    CHECK(lt_session_new(m_proxy, &sp_proxy, &b) == LT_OK, "%s", lt_last_error());
    if (!ref || !a || !b)
        goto out_free_sessions;

    size_t bytes = sizeof(float) * (size_t)STEPS * (size_t)V;
    struct run rr = {.s = ref, .tokens = tokens, .n_vocab = V, .logits = malloc(bytes)};
    struct run ra = {.s = a, .tokens = tokens, .n_vocab = V, .logits = malloc(bytes)};
    struct run rb = {.s = b, .tokens = tokens, .n_vocab = V, .logits = malloc(bytes)};
    decode_steps(&rr);
    CHECK(rr.st == LT_OK, "%s", lt_last_error());
    /* one thread on the proxy first */
    decode_steps(&ra);
    CHECK(ra.st == LT_OK && !memcmp(ra.logits, rr.logits, bytes), "%s: proxy == plain",
          spec->arch);
    /* then two threads at once */
    lt_session_seq_clear(a, 0);
    memset(ra.logits, 0, bytes);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, decode_steps, &ra);
    pthread_create(&tb, NULL, decode_steps, &rb);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(ra.st == LT_OK && rb.st == LT_OK);
    CHECK(!memcmp(ra.logits, rr.logits, bytes) && !memcmp(rb.logits, rr.logits, bytes),
          "%s: two threads on the proxy == one on plain", spec->arch);
    free(rr.logits);
    free(ra.logits);
    free(rb.logits);
out_free_sessions:
    lt_session_free(ref);
    lt_session_free(a);
    lt_session_free(b);
out_free:
    lt_model_free(m_proxy);
    lt_model_free(m_plain);
    lt_backend_free(proxy);
    lt_backend_free(cpu);
    lt_backend_free(plain);
    remove(path);
}

int main(void)
{
    (void)tm_forward; /* from test_model_util.h, unused here */
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    for (size_t i = 0; i < sizeof(tm_specs) / sizeof(tm_specs[0]); i++)
        test_arch(&tm_specs[i], dir);
    return check_summary();
}
