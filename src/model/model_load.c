/* model_load.c: a GGUF file to a struct lt_model: hyperparameters from llama.cpp's keys,
 * weights by llama.cpp's tensor names, each checked against the shape the graphs will
 * give it.
 *
 * Weight headers live in the model's own context; their data points into the GGUF mapping
 * (host, read only) or into one buffer of the backend the caller named. Tensors the graphs
 * never read (an MTP block, rope frequency tables) are left alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

const char *lt_arch_name(enum lt_arch a)
{
    static const char *names[LT_ARCH_COUNT] = {"llama", "qwen2", "qwen35"};
    return (int)a >= 0 && a < LT_ARCH_COUNT ? names[a] : "?";
}

struct loader {
    struct lt_model *m;
    const char *path;
    char arch[16];
    int cap_weights;
};

/* ---- metadata ---- */

static lt_status key_name(struct loader *L, const char *suffix, char *buf, size_t size)
{
    snprintf(buf, size, "%s.%s", L->arch, suffix);
    return LT_OK;
}

/* An integer key; arrays (per-layer values, as some converters write for hybrid models)
 * give their largest element. have (optional) says whether it was present; without it a
 * missing key is an error. */
static lt_status get_int(struct loader *L, const char *suffix, int64_t *out, bool *have)
{
    char key[96];
    key_name(L, suffix, key, sizeof(key));
    const struct lt_gguf *g = L->m->gguf;
    int64_t i = lt_gguf_find_key(g, key);
    if (i < 0) {
        if (have) {
            *have = false;
            return LT_OK;
        }
        return lt_fail(LT_ERR_FORMAT, "%s: missing key '%s'", L->path, key);
    }
    if (have)
        *have = true;
    const struct lt_gguf_value *v = lt_gguf_kv_value(g, i);
    if (v->type == LT_GGUF_TYPE_ARRAY) {
        enum lt_gguf_type et = lt_gguf_arr_type(v);
        uint64_t n = lt_gguf_arr_len(v);
        const void *d = lt_gguf_arr_data(v);
        int64_t best = 0;
        if (n == 0 || (et != LT_GGUF_TYPE_U32 && et != LT_GGUF_TYPE_I32))
            return lt_fail(LT_ERR_FORMAT, "%s: key '%s' is an array of %s; expected integers",
                           L->path, key, lt_gguf_type_name(et));
        for (uint64_t k = 0; k < n; k++) {
            int64_t e = et == LT_GGUF_TYPE_U32 ? (int64_t)((const uint32_t *)d)[k]
                                               : (int64_t)((const int32_t *)d)[k];
            best = e > best ? e : best;
        }
        *out = best;
        return LT_OK;
    }
    return lt_gguf_get_i64(g, key, out);
}

static lt_status get_float(struct loader *L, const char *suffix, float *out, float dflt,
                           bool required)
{
    char key[96];
    key_name(L, suffix, key, sizeof(key));
    if (!required && lt_gguf_find_key(L->m->gguf, key) < 0) {
        *out = dflt;
        return LT_OK;
    }
    return lt_gguf_get_f32(L->m->gguf, key, out);
}

static lt_status positive(struct loader *L, const char *what, int64_t v)
{
    if (v <= 0 || v > (1ll << 30))
        return lt_fail(LT_ERR_FORMAT, "%s: %s.%s is %lld; expected a positive count", L->path,
                       L->arch, what, (long long)v);
    return LT_OK;
}

static lt_status load_hparams(struct loader *L)
{
    struct lt_model_hparams *hp = &L->m->hp;
    const char *arch;
    lt_status st = lt_gguf_get_str(L->m->gguf, "general.architecture", &arch);
    if (st != LT_OK)
        return st;
    if (!strcmp(arch, "llama"))
        hp->arch = LT_ARCH_LLAMA;
    else if (!strcmp(arch, "qwen2"))
        hp->arch = LT_ARCH_QWEN2;
    else if (!strcmp(arch, "qwen35"))
        hp->arch = LT_ARCH_QWEN35;
    else
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "%s: architecture '%s' is not supported (llama, qwen2, qwen35 are)", L->path,
                       arch);
    snprintf(L->arch, sizeof(L->arch), "%s", arch);

    bool have;
    int64_t v;
    if ((st = get_int(L, "embedding_length", &hp->n_embd, NULL)) ||
        (st = get_int(L, "block_count", &hp->n_layer_file, NULL)) ||
        (st = get_int(L, "feed_forward_length", &hp->n_ff, NULL)) ||
        (st = get_int(L, "attention.head_count", &hp->n_head, NULL)))
        return st;
    if ((st = positive(L, "embedding_length", hp->n_embd)) ||
        (st = positive(L, "block_count", hp->n_layer_file)) ||
        (st = positive(L, "feed_forward_length", hp->n_ff)) ||
        (st = positive(L, "attention.head_count", hp->n_head)))
        return st;
    if ((st = get_int(L, "context_length", &v, &have)))
        return st;
    hp->n_ctx_train = have ? v : 0;
    if ((st = get_int(L, "attention.head_count_kv", &v, &have)))
        return st;
    hp->n_head_kv = have ? v : hp->n_head;
    if ((st = get_int(L, "attention.key_length", &v, &have)))
        return st;
    hp->head_dim = have ? v : hp->n_embd / hp->n_head;
    if ((st = get_int(L, "rope.dimension_count", &v, &have)))
        return st;
    hp->n_rot = have ? v : hp->head_dim;
    if ((st = positive(L, "attention.head_count_kv", hp->n_head_kv)) ||
        (st = positive(L, "attention.key_length", hp->head_dim)) ||
        (st = positive(L, "rope.dimension_count", hp->n_rot)))
        return st;
    if (hp->n_head % hp->n_head_kv != 0)
        return lt_fail(LT_ERR_FORMAT, "%s: %lld heads do not group over %lld KV heads", L->path,
                       (long long)hp->n_head, (long long)hp->n_head_kv);
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return lt_fail(LT_ERR_FORMAT, "%s: rope.dimension_count %lld does not fit head_dim %lld",
                       L->path, (long long)hp->n_rot, (long long)hp->head_dim);
    if ((st = get_float(L, "rope.freq_base", &hp->rope_base, 10000.0f, false)) ||
        (st = get_float(L, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 0, true)))
        return st;
    char key[96];
    key_name(L, "rope.scaling.type", key, sizeof(key));
    const char *scaling;
    if (lt_gguf_find_key(L->m->gguf, key) >= 0 &&
        lt_gguf_get_str(L->m->gguf, key, &scaling) == LT_OK && strcmp(scaling, "none") != 0)
        return lt_fail(LT_ERR_UNSUPPORTED, "%s: %s '%s' is not supported", L->path, key, scaling);
    hp->rope_mode = hp->arch == LT_ARCH_LLAMA ? LT_ROPE_NORMAL : LT_ROPE_NEOX;
    hp->n_layer = hp->n_layer_file;

    if (hp->arch == LT_ARCH_QWEN35) {
        if ((st = get_int(L, "full_attention_interval", &v, &have)))
            return st;
        hp->full_attn_interval = have ? v : 4;
        if ((st = get_int(L, "nextn_predict_layers", &v, &have)))
            return st;
        if (have && (v < 0 || v >= hp->n_layer_file))
            return lt_fail(LT_ERR_FORMAT, "%s: %s.nextn_predict_layers %lld with %lld blocks",
                           L->path, L->arch, (long long)v, (long long)hp->n_layer_file);
        hp->n_layer = hp->n_layer_file - (have ? v : 0);
        if ((st = get_int(L, "ssm.conv_kernel", &hp->ssm_d_conv, NULL)) ||
            (st = get_int(L, "ssm.state_size", &hp->ssm_d_state, NULL)) ||
            (st = get_int(L, "ssm.group_count", &hp->ssm_n_k_heads, NULL)) ||
            (st = get_int(L, "ssm.time_step_rank", &hp->ssm_n_v_heads, NULL)) ||
            (st = get_int(L, "ssm.inner_size", &hp->ssm_d_inner, NULL)))
            return st;
        if ((st = positive(L, "full_attention_interval", hp->full_attn_interval)) ||
            (st = positive(L, "ssm.conv_kernel", hp->ssm_d_conv)) ||
            (st = positive(L, "ssm.state_size", hp->ssm_d_state)) ||
            (st = positive(L, "ssm.group_count", hp->ssm_n_k_heads)) ||
            (st = positive(L, "ssm.time_step_rank", hp->ssm_n_v_heads)) ||
            (st = positive(L, "ssm.inner_size", hp->ssm_d_inner)))
            return st;
        if (hp->ssm_n_v_heads % hp->ssm_n_k_heads != 0 || hp->ssm_d_inner % hp->ssm_n_v_heads != 0)
            return lt_fail(LT_ERR_FORMAT,
                           "%s: DeltaNet sizes do not fit: inner_size %lld, state_size %lld, "
                           "%lld value heads over %lld key heads",
                           L->path, (long long)hp->ssm_d_inner, (long long)hp->ssm_d_state,
                           (long long)hp->ssm_n_v_heads, (long long)hp->ssm_n_k_heads);
    }
    return LT_OK;
}

/* ---- tensors ---- */

static lt_status add_weight(struct loader *L, struct lt_tensor *t)
{
    struct lt_model *m = L->m;
    for (int i = 0; i < m->n_weights; i++)
        if (m->weights[i] == t)
            return LT_OK;
    if (m->n_weights == L->cap_weights) {
        int cap = L->cap_weights ? L->cap_weights * 2 : 64;
        struct lt_tensor **nw = realloc(m->weights, sizeof(*nw) * (size_t)cap);
        if (!nw)
            return lt_fail(LT_ERR_NOMEM, "out of memory loading %s", L->path);
        m->weights = nw;
        L->cap_weights = cap;
    }
    m->weights[m->n_weights++] = t;
    return LT_OK;
}

/* The tensor `name` with dims ne0 (and ne1 when > 0: a matrix). NULL with *st == LT_OK when
 * it is absent and optional. */
static struct lt_tensor *weight(struct loader *L, const char *name, int64_t ne0, int64_t ne1,
                                bool required, lt_status *st)
{
    *st = LT_OK;
    int64_t i = lt_gguf_find_tensor(L->m->gguf, name);
    if (i < 0) {
        if (required)
            *st = lt_fail(LT_ERR_FORMAT, "%s: missing tensor '%s' (%s)", L->path, name, L->arch);
        return NULL;
    }
    const struct lt_gguf_tensor_info *ti = lt_gguf_tensor(L->m->gguf, i);
    int64_t want1 = ne1 > 0 ? ne1 : 1;
    if (ti->ne[0] != ne0 || ti->ne[1] != want1 || ti->ne[2] != 1 || ti->ne[3] != 1) {
        *st = lt_fail(LT_ERR_FORMAT,
                      "%s: tensor '%s' is [%lld, %lld, %lld, %lld]; the hyperparameters give "
                      "[%lld, %lld]",
                      L->path, name, (long long)ti->ne[0], (long long)ti->ne[1],
                      (long long)ti->ne[2], (long long)ti->ne[3], (long long)ne0, (long long)want1);
        return NULL;
    }
    const struct lt_type_traits *tt = lt_type_traits(ti->type);
    if (!tt || !tt->to_float) {
        *st = lt_fail(LT_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which lathe cannot read",
                      L->path, name, lt_type_name(ti->type));
        return NULL;
    }
    struct lt_tensor *t =
        lt_new_tensor(L->m->ctx, ti->type, ne1 > 0 ? 2 : 1, (int64_t[]){ne0, want1});
    if (!t) {
        *st = lt_fail(LT_ERR_NOMEM, "out of memory loading %s", L->path);
        return NULL;
    }
    lt_set_name(t, name);
    t->data = (void *)ti->data;
    if ((*st = add_weight(L, t)) != LT_OK)
        return NULL;
    return t;
}

/* Loads blk.IL.SUFFIX; goto-free chains use *st to stop at the first error. */
static struct lt_tensor *blk(struct loader *L, int il, const char *suffix, int64_t ne0, int64_t ne1,
                             bool required, lt_status *st)
{
    if (*st != LT_OK)
        return NULL;
    char name[LT_MAX_NAME];
    snprintf(name, sizeof(name), "blk.%d.%s", il, suffix);
    return weight(L, name, ne0, ne1, required, st);
}

static lt_status load_layer(struct loader *L, int il)
{
    struct lt_model *m = L->m;
    const struct lt_model_hparams *hp = &m->hp;
    struct lt_model_layer *ly = &m->layers[il];
    int64_t E = hp->n_embd, D = hp->head_dim;
    lt_status st = LT_OK;
    ly->attn_norm = blk(L, il, "attn_norm.weight", E, 0, true, &st);
    ly->ffn_norm =
        blk(L, il, hp->arch == LT_ARCH_QWEN35 ? "post_attention_norm.weight" : "ffn_norm.weight", E,
            0, true, &st);
    ly->ffn_gate = blk(L, il, "ffn_gate.weight", E, hp->n_ff, true, &st);
    ly->ffn_up = blk(L, il, "ffn_up.weight", E, hp->n_ff, true, &st);
    ly->ffn_down = blk(L, il, "ffn_down.weight", hp->n_ff, E, true, &st);
    ly->recurrent = hp->arch == LT_ARCH_QWEN35 && (il + 1) % hp->full_attn_interval != 0;
    if (ly->recurrent) {
        int64_t key_dim = hp->ssm_d_state * hp->ssm_n_k_heads, value_dim = hp->ssm_d_inner;
        int64_t channels = 2 * key_dim + value_dim, Hv = hp->ssm_n_v_heads;
        ly->ssm_qkv = blk(L, il, "attn_qkv.weight", E, channels, true, &st);
        ly->ssm_z = blk(L, il, "attn_gate.weight", E, value_dim, true, &st);
        ly->ssm_beta = blk(L, il, "ssm_beta.weight", E, Hv, true, &st);
        ly->ssm_alpha = blk(L, il, "ssm_alpha.weight", E, Hv, true, &st);
        ly->ssm_conv1d = blk(L, il, "ssm_conv1d.weight", hp->ssm_d_conv, channels, true, &st);
        ly->ssm_dt = blk(L, il, "ssm_dt.bias", Hv, 0, true, &st);
        ly->ssm_a = blk(L, il, "ssm_a", Hv, 0, true, &st);
        ly->ssm_norm = blk(L, il, "ssm_norm.weight", value_dim / Hv, 0, true, &st);
        ly->ssm_out = blk(L, il, "ssm_out.weight", value_dim, E, true, &st);
        return st;
    }
    int64_t q_rows = D * hp->n_head * (hp->arch == LT_ARCH_QWEN35 ? 2 : 1);
    int64_t kv_rows = D * hp->n_head_kv;
    ly->wq = blk(L, il, "attn_q.weight", E, q_rows, true, &st);
    ly->wk = blk(L, il, "attn_k.weight", E, kv_rows, true, &st);
    ly->wv = blk(L, il, "attn_v.weight", E, kv_rows, true, &st);
    ly->wo = blk(L, il, "attn_output.weight", D * hp->n_head, E, true, &st);
    /* qwen2 always has QKV biases; llama files may (attention_bias) */
    bool bias_required = hp->arch == LT_ARCH_QWEN2;
    ly->bq = blk(L, il, "attn_q.bias", q_rows, 0, bias_required, &st);
    ly->bk = blk(L, il, "attn_k.bias", kv_rows, 0, bias_required, &st);
    ly->bv = blk(L, il, "attn_v.bias", kv_rows, 0, bias_required, &st);
    if (hp->arch == LT_ARCH_QWEN35) {
        ly->q_norm = blk(L, il, "attn_q_norm.weight", D, 0, true, &st);
        ly->k_norm = blk(L, il, "attn_k_norm.weight", D, 0, true, &st);
    }
    return st;
}

static lt_status load_tensors(struct loader *L)
{
    struct lt_model *m = L->m;
    const struct lt_model_hparams *hp = &m->hp;
    lt_status st = LT_OK;
    int64_t i = lt_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (i < 0)
        return lt_fail(LT_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'", L->path);
    m->hp.n_vocab = lt_gguf_tensor(m->gguf, i)->ne[1];
    m->tok_embd = weight(L, "token_embd.weight", hp->n_embd, hp->n_vocab, true, &st);
    if (st == LT_OK)
        m->out_norm = weight(L, "output_norm.weight", hp->n_embd, 0, true, &st);
    if (st == LT_OK)
        m->output = weight(L, "output.weight", hp->n_embd, hp->n_vocab, false, &st);
    if (st != LT_OK)
        return st;
    m->hp.tied_output = m->output == NULL;
    if (!m->output)
        m->output = m->tok_embd;
    m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return lt_fail(LT_ERR_NOMEM, "out of memory loading %s", L->path);
    for (int il = 0; il < hp->n_layer && st == LT_OK; il++)
        st = load_layer(L, il);
    return st;
}

/* A layer's weights that one product may read together, and where their joint header
 * goes. */
struct group {
    struct lt_tensor **joint;
    struct lt_tensor *member[4];
    int n;
};

static int layer_groups(struct lt_model_layer *ly, struct group *g)
{
    g[0] = (struct group){&ly->ffn_gate_up, {ly->ffn_gate, ly->ffn_up}, 2};
    if (ly->recurrent) {
        g[1] = (struct group){&ly->ssm_in, {ly->ssm_qkv, ly->ssm_z, ly->ssm_beta, ly->ssm_alpha}, 4};
        return 2;
    }
    g[1] = (struct group){&ly->wqkv, {ly->wq, ly->wk, ly->wv}, 3};
    return 2;
}

/* Members of one type and row length, each present: their rows stack into one matrix. */
static bool group_fits(const struct group *g)
{
    for (int i = 0; i < g->n; i++)
        if (!g->member[i] || g->member[i]->type != g->member[0]->type ||
            g->member[i]->ne[0] != g->member[0]->ne[0])
            return false;
    return true;
}

static size_t padded(const struct lt_tensor *t) { return (lt_nbytes(t) + 255) & ~(size_t)255; }

/* Copies every weight into one buffer of `be` and points the headers there. The members
 * of each layer group that fits are placed back to back (no padding between them), and
 * the group gets a header spanning them. */
static lt_status upload(struct lt_model *m, struct lt_backend *be)
{
    size_t total = 0;
    for (int i = 0; i < m->n_weights; i++)
        total += padded(m->weights[i]);
    lt_status st = lt_backend_buffer_alloc(be, total, &m->buffer);
    if (st != LT_OK)
        return st;
    const int n = m->n_weights;
    bool *placed = calloc((size_t)(n ? n : 1), sizeof(*placed));
    if (!placed)
        return lt_fail(LT_ERR_NOMEM, "out of memory uploading the weights");
    size_t at = 0;
    struct lt_tensor *t;
    for (int il = 0; il < m->hp.n_layer && st == LT_OK; il++) {
        struct group g[2];
        int ng = layer_groups(&m->layers[il], g);
        for (int k = 0; k < ng && st == LT_OK; k++) {
            if (!group_fits(&g[k]))
                continue;
            size_t start = at;
            int64_t rows = 0;
            for (int i = 0; i < g[k].n && st == LT_OK; i++) {
                t = g[k].member[i];
                const void *src = t->data;
                t->buffer = m->buffer;
                t->data = (char *)m->buffer->base + at;
                st = lt_tensor_set(t, src, 0, lt_nbytes(t));
                at += lt_nbytes(t);
                rows += t->ne[1];
                for (int w = 0; w < n; w++)
                    placed[w] = placed[w] || m->weights[w] == t;
            }
            at = start + ((at - start + 255) & ~(size_t)255);
            struct lt_tensor *j = st == LT_OK ? lt_new_tensor_2d(m->ctx, g[k].member[0]->type,
                                                                 g[k].member[0]->ne[0], rows)
                                              : NULL;
            if (st == LT_OK && !j)
                st = lt_fail(LT_ERR_NOMEM, "out of memory uploading the weights");
            if (st != LT_OK)
                break;
            j->buffer = m->buffer;
            j->data = (char *)m->buffer->base + start;
            lt_format_name(j, "blk.%d.%s (joint)", il, k == 0 ? "ffn_gate_up" : "in_proj");
            *g[k].joint = j;
        }
    }
    for (int i = 0; i < n && st == LT_OK; i++) {
        if (placed[i])
            continue;
        t = m->weights[i];
        const void *src = t->data;
        t->buffer = m->buffer;
        t->data = (char *)m->buffer->base + at;
        st = lt_tensor_set(t, src, 0, lt_nbytes(t));
        at += padded(t);
    }
    free(placed);
    return st;
}

lt_status lt_model_load(const char *path, const struct lt_model_params *params,
                        struct lt_model **out)
{
    *out = NULL;
    struct lt_model *m = calloc(1, sizeof(*m));
    if (!m)
        return lt_fail(LT_ERR_NOMEM, "out of memory loading %s", path);
    struct loader L = {.m = m, .path = path};
    lt_status st = lt_gguf_open(path, &m->gguf);
    if (st != LT_OK)
        goto out_free;
    m->ctx = lt_ctx_init((struct lt_ctx_params){
        .mem_size = (size_t)(2 * lt_gguf_n_tensors(m->gguf) + 16) * sizeof(struct lt_tensor) + 4096,
        .no_alloc = true});
    if (!m->ctx) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory loading %s", path);
        goto out_free;
    }
    if ((st = load_hparams(&L)) != LT_OK || (st = load_tensors(&L)) != LT_OK)
        goto out_free;
    if (params && params->weights_backend && (st = upload(m, params->weights_backend)) != LT_OK)
        goto out_free;
    *out = m;
    return LT_OK;
out_free:
    lt_model_free(m);
    return st;
}

void lt_model_free(struct lt_model *m)
{
    if (!m)
        return;
    if (m->buffer)
        lt_buffer_free(m->buffer);
    lt_ctx_free(m->ctx);
    lt_gguf_close(m->gguf);
    free(m->layers);
    free(m->weights);
    free(m);
}

const struct lt_model_hparams *lt_model_hparams(const struct lt_model *m)
{
    return &m->hp;
}
const struct lt_gguf *lt_model_gguf(const struct lt_model *m)
{
    return m->gguf;
}

bool lt_model_layer_is_recurrent(const struct lt_model *m, int il)
{
    return il >= 0 && il < m->hp.n_layer && m->layers[il].recurrent;
}

int lt_model_n_weights(const struct lt_model *m)
{
    return m->n_weights;
}

struct lt_tensor *lt_model_weight(const struct lt_model *m, int i)
{
    return i >= 0 && i < m->n_weights ? m->weights[i] : NULL;
}

struct lt_tensor *lt_model_find_weight(const struct lt_model *m, const char *name)
{
    for (int i = 0; i < m->n_weights; i++)
        if (!strcmp(m->weights[i]->name, name))
            return m->weights[i];
    return NULL;
}

/* whether the model's attention runs as one FLASH_ATTN node (and its backward) on be: asked
 * by a training job and a session's prefill */
bool lt_model_flash_attn_on(const struct lt_model *m, struct lt_backend *be, bool by_default)
{
    const char *env = getenv("LATHE_FLASH_ATTN");
    const struct lt_model_hparams *hp = lt_model_hparams(m);
    /* The F32 / TF32 kernels were right on the H200 (the same loss curve as the chain's) but
     * slower than the chain, 25% at 16 x 512 and 50% at 4 x 2048 tokens of Qwen3.5-0.8B. The
     * BF16 tensor-core kernels (flash_attn_bf16.cu) are faster than the chain in a BF16
     * training step (H100, 3818660: 16 x 512 +2.3% full, +2.2% LoRA; 4 x 2048 even; 4 to 5
     * GiB less), so such a job takes them by default. So does a device's prefill (session.c):
     * H100, Qwen3.5-0.8B BF16, `lathe bench` pp512 65.4k tokens/s against the chain's 63.2k,
     * pp2048 91.0k against 74.9k, the same greedy text (cf39614).
     * (On the CUDA emulation a SmolLM2 LoRA step's first loss through the F32 FLASH_ATTN is
     * 12.6789 against the chain's 12.6796: the attention outputs agree to 1.5e-9, and the
     * Q4_1 products round their activations to 8 bits, which turns that into 5e-5 in the
     * loss; on F32 weights the two agree.) */
    const bool want = env && *env ? strcmp(env, "1") == 0 : by_default;
    if (!want || hp->head_dim <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0)
        return false;
    char caller_error[1024]; /* a probe: the caller's last error stays as it was */
    snprintf(caller_error, sizeof(caller_error), "%s", lt_last_error());
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    if (!ctx)
        return false;
    const int64_t D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    struct lt_tensor *q = lt_new_tensor_4d(ctx, LT_TYPE_F32, D, H, 1, 1),
                     *k = lt_new_tensor_4d(ctx, LT_TYPE_F32, D, Hkv, 1, 1),
                     *v = lt_new_tensor_4d(ctx, LT_TYPE_F32, D, Hkv, 1, 1),
                     *mask = lt_new_tensor_4d(ctx, LT_TYPE_F32, 1, 1, 1, 1),
                     *g = lt_new_tensor_4d(ctx, LT_TYPE_F32, D, H, 1, 1);
    struct lt_tensor *o = lt_flash_attn(ctx, q, k, v, mask, 1.0f, true);
    struct lt_tensor *back = o && g ? lt_flash_attn_back(ctx, g, o) : NULL;
    char reason[160];
    bool ok = back && lt_backend_supports_op(be, o, reason, sizeof(reason)) &&
              lt_backend_supports_op(be, back, reason, sizeof(reason));
    lt_ctx_free(ctx);
    lt_fail(LT_OK, "%s", caller_error);
    return ok;
}
