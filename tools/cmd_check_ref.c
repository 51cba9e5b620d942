/* cmd_check_ref.c: `lathe check-ref MODEL.gguf REFERENCE.safetensors [--backend cpu|cuda]
 * [--json PATH] [--no-grads] [--logits-out PATH]`: runs a model against what Hugging Face
 * transformers computed for it.
 *
 * The reference (tests/data/golden/README.md; tools/hf_reference.py makes one) holds
 * input_ids [B, T], logits [B, T, V], the mean next-token loss, d loss / d parameter for
 * every HF parameter ("grad.<name>") and a greedy continuation (greedy_prompt, greedy_ids).
 * lathe builds the loss graph over F32 trainable copies of every weight, differentiates it,
 * and maps each gradient back to the HF parameter it came from (convert.h undoes the
 * converter's permutations and element maps). Errors are relative, ||lathe - ref|| / ||ref||
 * per tensor. The table goes to stdout, then one line of JSON; the exit status is 0 only
 * when logits and loss are within 1e-4, every gradient within 1e-3 and the greedy ids
 * equal.
 *
 * --no-grads takes a reference that another inference engine made (tests/interop/ writes
 * llama.cpp's logits in this format): no backward pass is built, the reference needs no
 * grad.* tensors and the verdict is on logits, loss and greedy ids alone. --logits-out writes
 * lathe's logits as raw little-endian float32 [B, T, V], for a caller that wants more than
 * the relative error (the largest absolute difference, say). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "lathe/autodiff.h"
#include "lathe/convert.h"
#include "lathe/model.h"
#include "lathe/opt.h"
#include "lathe/sched.h"
#include "convert/safetensors.h"

#if defined(__has_include)
#if __has_include("lathe/backend_cuda.h")
#include "lathe/backend_cuda.h"
#define CHECK_REF_HAVE_CUDA_HEADER 1
#endif
#endif

#define TOL_LOGITS 1e-4
#define TOL_LOSS 1e-4
#define TOL_GRAD 1e-3

struct ref_run {
    const char *model_path, *ref_path, *backend_name, *json_path;
    const char *logits_out; /* --logits-out; NULL: not written */
    bool no_grads;          /* --no-grads: forward only, no grad.* in the reference */
    struct lt_model *model;
    struct lt_st_file *ref;
    struct lt_backend *be[2];
    int n_be;
    int64_t B, T, V;
    int32_t *ids; /* [B * T] */
    /* results */
    double logits_err, loss_err, grad_worst;
    char grad_worst_name[192];
    float loss, ref_loss;
    int n_grads, n_grads_bad;
    bool greedy_ok;
    int greedy_n, greedy_match;
};

static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (num != num)
        return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void row(const char *name, double err, double tol)
{
    printf("%-56s %12.3e %9.0e  %s\n", name, err, tol, err <= tol ? "ok" : "FAIL");
}

/* A reference tensor as floats (malloc'd), checking its element count when want > 0. */
static float *ref_floats(struct ref_run *r, const char *name, int64_t want, int64_t *n_out)
{
    const struct lt_st_tensor *t = lt_st_file_find(r->ref, name);
    if (!t) {
        lt_fail(LT_ERR_FORMAT, "%s: no tensor '%s'", r->ref_path, name);
        return NULL;
    }
    if (want > 0 && t->n_elements != want) {
        lt_fail(LT_ERR_FORMAT, "%s: '%s' has %lld elements, expected %lld", r->ref_path, name,
                (long long)t->n_elements, (long long)want);
        return NULL;
    }
    float *v = malloc(sizeof(float) * (size_t)(t->n_elements ? t->n_elements : 1));
    if (!v) {
        lt_fail(LT_ERR_NOMEM, "out of memory reading '%s'", name);
        return NULL;
    }
    lt_st_tensor_read_f32(t, v);
    if (n_out)
        *n_out = t->n_elements;
    return v;
}

static void hf_config_of(const struct lt_model_hparams *hp, struct lt_hf_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->arch = hp->arch == LT_ARCH_LLAMA   ? LT_HF_ARCH_LLAMA
                : hp->arch == LT_ARCH_QWEN2 ? LT_HF_ARCH_QWEN2
                                            : LT_HF_ARCH_QWEN35;
    snprintf(cfg->hf_arch, sizeof(cfg->hf_arch), "%s", lt_arch_name(hp->arch));
    cfg->n_vocab = hp->n_vocab;
    cfg->n_embd = hp->n_embd;
    cfg->n_ff = hp->n_ff;
    cfg->n_layer = hp->n_layer;
    cfg->n_head = hp->n_head;
    cfg->n_head_kv = hp->n_head_kv;
    cfg->head_dim = hp->head_dim;
    cfg->n_rot = hp->n_rot;
    cfg->tie_word_embeddings = hp->tied_output;
    cfg->ssm_d_conv = hp->ssm_d_conv;
    cfg->ssm_n_k_heads = hp->ssm_n_k_heads;
    cfg->ssm_n_v_heads = hp->ssm_n_v_heads;
    cfg->ssm_d_k = hp->ssm_d_state;
    cfg->ssm_d_v = hp->ssm_n_v_heads ? hp->ssm_d_inner / hp->ssm_n_v_heads : 0;
    cfg->full_attn_every = hp->full_attn_interval;
}

/* Compares lathe's gradient of every trainable copy with the reference's. */
static lt_status compare_grads(struct ref_run *r, const struct lt_model_replace *list, int n)
{
    struct lt_hf_config cfg;
    hf_config_of(lt_model_hparams(r->model), &cfg);
    const struct lt_gguf *gg = lt_model_gguf(r->model);
    int64_t n_ref = lt_st_file_n_tensors(r->ref);
    bool *seen = calloc((size_t)n_ref + 1, sizeof(bool));
    if (!seen)
        return lt_fail(LT_ERR_NOMEM, "out of memory");
    lt_status st = LT_OK;
    for (int i = 0; i < n && st == LT_OK; i++) {
        struct lt_tensor *p = list[i].with;
        int64_t ne = lt_nelements(p);
        float *grad = calloc((size_t)ne, sizeof(float)),
              *grad_hf = malloc(sizeof(float) * (size_t)ne);
        float *ref = NULL;
        if (!grad || !grad_hf) {
            st = lt_fail(LT_ERR_NOMEM, "out of memory");
            goto next;
        }
        if (p->grad && (st = lt_tensor_get(p->grad, grad, 0, sizeof(float) * (size_t)ne)) != LT_OK)
            goto next;
        int64_t ti = lt_gguf_find_tensor(gg, p->name);
        int n_dims = ti >= 0 ? lt_gguf_tensor(gg, ti)->n_dims : lt_n_dims(p);
        char hf_name[160], key[176];
        int hf_n_dims;
        int64_t hf_shape[LT_MAX_DIMS + 1];
        st = lt_convert_grad_gguf_to_hf(&cfg, p->name, n_dims, p->ne, grad, p->data, hf_name,
                                        sizeof(hf_name), &hf_n_dims, hf_shape, grad_hf);
        if (st != LT_OK)
            goto next;
        snprintf(key, sizeof(key), "grad.%s", hf_name);
        for (int64_t k = 0; k < n_ref; k++)
            if (!strcmp(lt_st_file_tensor(r->ref, k)->name, key))
                seen[k] = true;
        ref = ref_floats(r, key, ne, NULL);
        if (!ref) {
            st = LT_ERR_FORMAT;
            goto next;
        }
        double e = rel_err(grad_hf, ref, ne);
        row(key, e, TOL_GRAD);
        r->n_grads++;
        if (!(e <= TOL_GRAD))
            r->n_grads_bad++;
        if (r->n_grads == 1 || !(e <= r->grad_worst)) {
            r->grad_worst = e;
            snprintf(r->grad_worst_name, sizeof(r->grad_worst_name), "%s", key);
        }
    next:
        free(grad);
        free(grad_hf);
        free(ref);
    }
    for (int64_t k = 0; k < n_ref && st == LT_OK; k++) {
        const char *name = lt_st_file_tensor(r->ref, k)->name;
        if (!strncmp(name, "grad.", 5) && !seen[k])
            st = lt_fail(LT_ERR_FORMAT, "the reference has '%s', which no weight of %s maps to",
                         name, r->model_path);
    }
    free(seen);
    return st;
}

/* Logits, loss and gradients from one forward + backward pass. */
/* The loss graph of a check, its gradients (when every op has a backward rule) and its
 * placement. */
struct ref_graph {
    struct lt_ctx *ctx;
    struct lt_graph *g;
    struct lt_model_loss_graph lg;
    struct lt_sched *sched;
    int n_forward; /* nodes of the forward part */
    bool grads;
    struct lt_refusal refusal;
};

static lt_status ref_graph_build(struct ref_run *r, const struct lt_model_adapters *ad,
                                 struct ref_graph *G)
{
    G->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 64 << 20, .no_alloc = true});
    G->g = G->ctx ? lt_graph_new(G->ctx, 1 << 18) : NULL;
    if (!G->g)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the graph");
    lt_status st;
    if ((st = lt_model_build_loss(r->model, G->ctx, r->T, r->B, ad, &G->lg)) != LT_OK ||
        (st = lt_graph_build(G->g, G->lg.loss)) != LT_OK)
        return st;
    G->lg.loss->flags |= LT_FLAG_LOSS;
    G->n_forward = G->g->n_nodes;
    /* without gradients (an op lacks its backward rule) the rest is still worth checking */
    G->grads =
        !r->no_grads && lt_autodiff_build(G->ctx, G->g, G->lg.loss, 1.0f, &G->refusal) == LT_OK;
    if (!G->grads && !r->no_grads) {
        fprintf(stderr, "lathe check-ref: gradients not checked: %s\n", lt_last_error());
        r->n_grads_bad++;
        snprintf(r->grad_worst_name, sizeof(r->grad_worst_name), "(not computed)");
        r->grad_worst = INFINITY;
        memset(&G->refusal, 0, sizeof(G->refusal));
    }
    for (int i = 0; G->grads && i < ad->n_replace; i++)
        if (ad->replace[i].with->grad)
            ad->replace[i].with->grad->flags |= LT_FLAG_OUTPUT;
    G->sched = lt_sched_new(r->be, r->n_be);
    if (!G->sched)
        return LT_ERR_NOMEM;
    if ((st = lt_sched_place(G->sched, G->g, false, &G->refusal)) != LT_OK ||
        (st = lt_sched_alloc(G->sched, G->g)) != LT_OK)
        return st;
    printf("training graph: %d nodes;", G->g->n_nodes);
    for (int b = 0; b < r->n_be; b++)
        printf("%s %s %d", b ? "," : "", r->be[b]->name, lt_sched_count(G->sched, b));
    printf(" (%d nodes fell back from %s)\n", lt_sched_n_fallback(G->sched), r->be[0]->name);
    return LT_OK;
}

/* The graph run on the reference's ids: the logits ([N, V], read between the forward and
 * the backward part, since the scheduler may reuse their storage once the backward pass has
 * read them) and r->loss. */
static lt_status ref_graph_run(struct ref_run *r, struct ref_graph *G, float *logits)
{
    const int64_t N = r->B * r->T;
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)N);
    if (!labels)
        return lt_fail(LT_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; b < r->B; b++)
        for (int64_t t = 0; t < r->T; t++)
            labels[b * r->T + t] = t + 1 < r->T ? r->ids[b * r->T + t + 1] : -1;
    const struct lt_model_loss_graph *lg = &G->lg;
    lt_status st;
    if ((st = lt_tensor_set(lg->tokens, r->ids, 0, sizeof(int32_t) * (size_t)N)) != LT_OK ||
        (st = lt_tensor_set(lg->labels, labels, 0, sizeof(int32_t) * (size_t)N)) != LT_OK ||
        (st = lt_model_loss_graph_set_pos(&G->lg)) != LT_OK ||
        (st = lt_sched_compute_range(G->sched, G->g, 0, G->n_forward)) != LT_OK ||
        (st = lt_tensor_get(lg->logits, logits, 0, sizeof(float) * (size_t)(N * r->V))) != LT_OK ||
        (st = lt_tensor_get(lg->loss, &r->loss, 0, sizeof(float))) != LT_OK)
        goto out;
    st = lt_sched_compute_range(G->sched, G->g, G->n_forward, G->g->n_nodes);
out:
    free(labels);
    return st;
}

/* --logits-out: n floats, raw (the host is little-endian, as GGUF assumes), written to a
 * temporary file that replaces path only when whole */
static lt_status write_logits(const char *path, const float *logits, int64_t n)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return lt_fail(LT_ERR_INVALID, "--logits-out %s: the path is too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return lt_fail(LT_ERR_IO, "--logits-out %s: cannot open for writing", path);
    size_t wrote = fwrite(logits, sizeof(float), (size_t)n, f);
    bool ok = fclose(f) == 0 && wrote == (size_t)n && rename(tmp, path) == 0;
    if (!ok) {
        remove(tmp);
        return lt_fail(LT_ERR_IO, "--logits-out %s: the write failed", path);
    }
    return LT_OK;
}

static lt_status check_loss_and_grads(struct ref_run *r)
{
    struct lt_model_f32_params *fp = NULL;
    struct ref_graph G = {0};
    float *logits = NULL, *ref_logits = NULL, *ref_loss = NULL;
    lt_status st = lt_model_f32_params_new(r->model, NULL, NULL, &fp);
    if (st != LT_OK)
        return st;
    int n_rep;
    const struct lt_model_replace *rep = lt_model_f32_params_list(fp, &n_rep);
    struct lt_model_adapters ad = {.replace = rep, .n_replace = n_rep};
    const int64_t N = r->B * r->T;
    if ((st = ref_graph_build(r, &ad, &G)) != LT_OK)
        goto out_free;
    if (!(logits = malloc(sizeof(float) * (size_t)(N * r->V)))) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    if ((st = ref_graph_run(r, &G, logits)) != LT_OK)
        goto out_free;
    if (!(ref_logits = ref_floats(r, "logits", N * r->V, NULL)) ||
        !(ref_loss = ref_floats(r, "loss", 1, NULL))) {
        st = LT_ERR_FORMAT;
        goto out_free;
    }
    if (r->logits_out && (st = write_logits(r->logits_out, logits, N * r->V)) != LT_OK)
        goto out_free;
    r->ref_loss = ref_loss[0];
    r->logits_err = rel_err(logits, ref_logits, N * r->V);
    r->loss_err = rel_err(&r->loss, ref_loss, 1);
    row("logits", r->logits_err, TOL_LOGITS);
    row("loss", r->loss_err, TOL_LOSS);
    if (G.grads)
        st = compare_grads(r, rep, n_rep);
out_free:
    if (st != LT_OK && G.refusal.kind != LT_REFUSAL_NONE)
        fprintf(stderr, "lathe check-ref: %s\n", G.refusal.sentence);
    lt_sched_free(G.sched);
    lt_ctx_free(G.ctx);
    lt_model_f32_params_free(fp);
    free(logits);
    free(ref_logits);
    free(ref_loss);
    return st;
}

static int32_t argmax(const float *v, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return (int32_t)best;
}

/* The greedy continuation of greedy_prompt through prefill and one-token decode. */
static lt_status check_greedy(struct ref_run *r)
{
    int64_t n_prompt, n_gen;
    float *prompt_f = ref_floats(r, "greedy_prompt", 0, &n_prompt);
    float *want_f = prompt_f ? ref_floats(r, "greedy_ids", 0, &n_gen) : NULL;
    struct lt_session *s = NULL;
    int32_t *prompt = NULL, *got = NULL;
    float *logits = NULL;
    lt_status st = LT_OK;
    if (!prompt_f || !want_f) {
        st = LT_ERR_FORMAT;
        goto out_free;
    }
    prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    got = malloc(sizeof(int32_t) * (size_t)(n_gen + 1));
    logits = malloc(sizeof(float) * (size_t)r->V);
    if (!prompt || !got || !logits) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    for (int64_t i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)prompt_f[i];
    struct lt_session_params sp = {.n_ctx = (int)(n_prompt + n_gen + 1),
                                   .n_seq_max = 1,
                                   .backends = r->be,
                                   .n_backends = r->n_be};
    if ((st = lt_session_new(r->model, &sp, &s)) != LT_OK ||
        (st = lt_session_prefill(s, 0, prompt, (int)n_prompt, false, logits)) != LT_OK)
        goto out_free;
    int seq = 0;
    for (int64_t i = 0; i < n_gen && st == LT_OK; i++) {
        got[i] = argmax(logits, r->V);
        if (i + 1 < n_gen)
            st = lt_session_decode(s, 1, &seq, &got[i], logits);
    }
    if (st != LT_OK)
        goto out_free;
    r->greedy_n = (int)n_gen;
    r->greedy_match = 0;
    for (int64_t i = 0; i < n_gen; i++)
        r->greedy_match += got[i] == (int32_t)want_f[i];
    r->greedy_ok = r->greedy_match == n_gen;
    printf("%-56s %6d / %-5d %9s  %s\n", "greedy ids equal", r->greedy_match, r->greedy_n, "all",
           r->greedy_ok ? "ok" : "FAIL");
    if (!r->greedy_ok) {
        printf("  lathe:    ");
        for (int64_t i = 0; i < n_gen; i++)
            printf(" %d", got[i]);
        printf("\n  expected: ");
        for (int64_t i = 0; i < n_gen; i++)
            printf(" %d", (int32_t)want_f[i]);
        printf("\n");
    }
out_free:
    lt_session_free(s);
    free(prompt_f);
    free(want_f);
    free(prompt);
    free(got);
    free(logits);
    return st;
}

static void json_summary(struct ref_run *r, bool pass, FILE *f)
{
    fprintf(f,
            "{\"model\": \"%s\", \"reference\": \"%s\", \"backend\": \"%s\", \"logits_rel_err\": "
            "%.6e, \"loss\": %.9g, \"ref_loss\": %.9g, \"loss_rel_err\": %.6e, \"n_grads\": %d, "
            "\"n_grads_over_tol\": %d, \"grad_worst_rel_err\": %.6e, \"grad_worst\": \"%s\", "
            "\"greedy_match\": %d, \"greedy_n\": %d, \"tolerances\": {\"logits\": %g, \"loss\": "
            "%g, \"grad\": %g}, \"pass\": %s}\n",
            r->model_path, r->ref_path, r->backend_name, r->logits_err, (double)r->loss,
            (double)r->ref_loss, r->loss_err, r->n_grads, r->n_grads_bad, r->grad_worst,
            r->grad_worst_name, r->greedy_match, r->greedy_n, TOL_LOGITS, TOL_LOSS, TOL_GRAD,
            pass ? "true" : "false");
}

static void check_ref_usage(FILE *f)
{
    fprintf(f, "usage: lathe check-ref MODEL.gguf REFERENCE.safetensors [--backend cpu|cuda] "
               "[--json PATH] [--no-grads] [--logits-out PATH]\n"
               "  compares logits, loss, every parameter's gradient and a greedy continuation\n"
               "  with a Hugging Face reference; exit 0 only within tolerance\n"
               "  --no-grads: forward only (a reference without grad.* tensors, e.g. from\n"
               "  another inference engine); --logits-out: lathe's logits as raw float32\n"
               "  [B, T, V]\n");
}

static lt_status open_backends(struct ref_run *r)
{
    if (!strcmp(r->backend_name, "cuda")) {
#ifdef CHECK_REF_HAVE_CUDA_HEADER
        r->be[0] = lt_backend_cuda_new(0);
        if (!r->be[0])
            return lt_fail(LT_ERR_UNSUPPORTED, "no CUDA device: %s", lt_last_error());
        r->be[1] = lt_backend_cpu_new(0);
        r->n_be = 2;
        return r->be[1] ? LT_OK : lt_fail(LT_ERR_NOMEM, "cannot start the CPU backend");
#else
        return lt_fail(LT_ERR_UNSUPPORTED, "this build of lathe has no CUDA backend");
#endif
    }
    if (strcmp(r->backend_name, "cpu"))
        return lt_fail(LT_ERR_INVALID, "unknown backend '%s' (cpu or cuda)", r->backend_name);
    r->be[0] = lt_backend_cpu_new(0);
    r->n_be = 1;
    return r->be[0] ? LT_OK : lt_fail(LT_ERR_NOMEM, "cannot start the CPU backend");
}

/* 0: parsed; 1: --help printed; 2: a usage error (reported) */
static int check_ref_args(int argc, char **argv, struct ref_run *r)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            check_ref_usage(stdout);
            return 1;
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            r->backend_name = argv[++i];
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            r->json_path = argv[++i];
        } else if (!strcmp(argv[i], "--logits-out") && i + 1 < argc) {
            r->logits_out = argv[++i];
        } else if (!strcmp(argv[i], "--no-grads")) {
            r->no_grads = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "lathe check-ref: unknown option '%s'\n", argv[i]);
            check_ref_usage(stderr);
            return 2;
        } else if (!r->model_path) {
            r->model_path = argv[i];
        } else if (!r->ref_path) {
            r->ref_path = argv[i];
        } else {
            check_ref_usage(stderr);
            return 2;
        }
    }
    if (!r->model_path || !r->ref_path) {
        check_ref_usage(stderr);
        return 2;
    }
    return 0;
}

/* The backends, the model (a warning when a weight is not F32: the references are float32,
 * another type cannot meet 1e-4), the reference file and its input_ids [B, T]. */
static lt_status check_ref_load(struct ref_run *r)
{
    lt_status st = open_backends(r);
    if (st == LT_OK)
        st = lt_model_load(r->model_path, &(struct lt_model_params){r->n_be > 1 ? r->be[0] : NULL},
                           &r->model);
    if (st == LT_OK)
        st = lt_st_file_open(r->ref_path, &r->ref);
    if (st != LT_OK)
        return st;
    for (int i = 0; i < lt_model_n_weights(r->model); i++) {
        const struct lt_tensor *w = lt_model_weight(r->model, i);
        if (w->type != LT_TYPE_F32) {
            fprintf(stderr,
                    "lathe check-ref: warning: '%s' is %s, not f32; convert with --outtype f32 to "
                    "compare with a float32 reference\n",
                    w->name, lt_type_name(w->type));
            break;
        }
    }
    int64_t n_ids;
    const struct lt_st_tensor *ids = lt_st_file_find(r->ref, "input_ids");
    float *idf = ids && ids->n_dims == 2 ? ref_floats(r, "input_ids", 0, &n_ids) : NULL;
    if (!idf)
        return lt_fail(LT_ERR_FORMAT, "%s: no input_ids of shape [B, T]", r->ref_path);
    r->B = ids->shape[0];
    r->T = ids->shape[1];
    r->V = lt_model_hparams(r->model)->n_vocab;
    r->ids = malloc(sizeof(int32_t) * (size_t)n_ids);
    if (r->ids)
        for (int64_t i = 0; i < n_ids; i++)
            r->ids[i] = (int32_t)idf[i];
    free(idf);
    return r->ids ? LT_OK : lt_fail(LT_ERR_NOMEM, "out of memory");
}

/* the verdict line and the JSON summary (stdout, and --json FILE) */
static void check_ref_report(struct ref_run *r, bool pass)
{
    /* JSON has no infinity */
    if (!(r->grad_worst <= 1e300))
        r->grad_worst = -1;
    if (r->no_grads)
        printf("gradients: not checked (--no-grads)\n");
    else
        printf("worst gradient: %s (%.3e); %d of %d gradients over tolerance\n", r->grad_worst_name,
               r->grad_worst, r->n_grads_bad, r->n_grads);
    json_summary(r, pass, stdout);
    if (!r->json_path)
        return;
    FILE *f = fopen(r->json_path, "w");
    if (f) {
        json_summary(r, pass, f);
        fclose(f);
    } else {
        fprintf(stderr, "lathe check-ref: cannot write %s\n", r->json_path);
    }
}

int cmd_check_ref(int argc, char **argv)
{
    struct ref_run r = {.backend_name = "cpu"};
    int rc = check_ref_args(argc, argv, &r);
    if (rc)
        return rc == 1 ? 0 : 2;
    rc = 1;
    lt_status st = check_ref_load(&r);
    if (st != LT_OK)
        goto out;
    printf("lathe check-ref %s against %s (%s; %s, batch %lld x %lld tokens)\n", r.model_path,
           r.ref_path, r.backend_name, lt_arch_name(lt_model_hparams(r.model)->arch),
           (long long)r.B, (long long)r.T);
    printf("%-56s %12s %9s  %s\n", "tensor", "rel. error", "tolerance", "");
    if ((st = check_loss_and_grads(&r)) != LT_OK || (st = check_greedy(&r)) != LT_OK)
        goto out;
    bool grads_ok = r.no_grads || (r.n_grads_bad == 0 && r.n_grads > 0);
    bool pass = r.logits_err <= TOL_LOGITS && r.loss_err <= TOL_LOSS && grads_ok && r.greedy_ok;
    check_ref_report(&r, pass);
    rc = pass ? 0 : 1;
out:
    if (st != LT_OK)
        fprintf(stderr, "lathe check-ref: %s\n", lt_last_error());
    free(r.ids);
    lt_st_file_close(r.ref);
    lt_model_free(r.model);
    for (int i = 0; i < r.n_be; i++)
        lt_backend_free(r.be[i]);
    return rc;
}
