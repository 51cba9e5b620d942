/* test_train_bf16.c: the training graph a device builds (lt_model_adapters.bf16_products,
 * fused_loss) on every architecture of tests/test_model_util.h, run on the CPU, which has
 * every op of it:
 *   - Qwen3.5's q, k and v are three products, each conv'd on its own (no views of one
 *     conv output, whose gradient was a zero and three ACCs);
 *   - its weighted norms are RMS_NORM nodes with their weights (Qwen3.5's DeltaNet output
 *     norm with its gate, no SILU left), whose gradients are RMS_NORM_MUL_BACK nodes, and it
 *     gives the loss and gradients of the same graph with the norms' chain of ops
 *     (chain_norms) within 1e-5: the fusion changes no value beyond summation order;
 *   - the activations that only products read are written in BF16 by their producers (no
 *     CONT rounds a norm's output), and so are the FFN's gate and up gradients
 *     (SWIGLU_BACK in BF16, no CONT of them; so too with a LoRA adapter on ffn_up); the
 *     F32 graph keeps the chain (no RMS_NORM_MUL_BACK) and F32 gradients;
 *   - its loss is the F32 graph's within 1e-2 and its gradients within 0.1 of their largest
 *     (BF16 operands; the tiny random Qwen3.5 is the loosest, ~0.08);
 *   - its loss, LINEAR_CE, is folded into its backward (one LINEAR_CE_BACK making dh, dw and
 *     the loss; no LINEAR_CE left), and gives the F32 loss and gradients of the head through
 *     mul_mat and CROSS_ENTROPY within 1e-5 (a tied head's gradient has both parts); with
 *     LoRA, whose head is frozen, that node makes dh and the loss alone;
 *   - CUDA's verdict (types, shapes, strides: no GPU needed) refuses none of its nodes. */
#include <string.h>

#include "backend/cuda/cuda_verdict.h"
#include "check.h"
#include "lathe/lora.h"
#include "test_model_util.h"

#define T 11 /* tokens a sequence */
#define S 2  /* sequences */

struct graph_counts {
    int norm_mul_back, gated_norms, silu, cont_of_norm, conv_silu, conv_acc, half_swiglu_back,
        cont_of_swiglu_back, refused;
    int half_conv_back, cont_of_conv_back; /* CONV_SILU_BACK with a BF16 d x, roundings of one */
    int joined, concat_readers; /* products of joined operands (LoRA), readers of a join */
    int half_ffn, half_qkv;     /* products that store BF16: the FFN's gate and up, and
                                   Qwen3.5's q, k and v; its z (the gated norm's gate); other
                                   products that do */
    int half_z;
    int half_other;
    /* LoRA's A x: SCALE nodes with a half result (lt_scale_as of A), SCALE nodes of a
     * product (A x scaled), CONT nodes rounding an A x product, A x products storing BF16,
     * and A x's gradients made in BF16 by a product (SCALE and CONT of the forward's A x
     * products alone: a gradient's name starts "grad for") */
    int scale_half, scale_of_product, cont_of_ax, half_ax, half_ax_grad;
    /* lt_mb_lora_share_ax: products of several adapters' joined A's (half_ax counts them too),
     * and the products into the gradients of the norms' outputs that the projections read
     * (the base products' and the adapters' rank-r terms) */
    int shared_ax, into_norms;
    int lce, lce_back;          /* LINEAR_CE and LINEAR_CE_BACK nodes */
    unsigned lce_parts;   /* the LINEAR_CE_BACK's parts */
    int64_t lce_elements; /* and its result's elements */
    char why[256];
};

/* what the graph holds, counted before it is placed */
static void count(const struct lt_graph *g, void *user)
{
    struct graph_counts *c = user;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct lt_tensor *t = g->nodes[i];
        c->norm_mul_back += t->op == LT_OP_RMS_NORM_MUL_BACK;
        c->gated_norms += t->op == LT_OP_RMS_NORM && t->src[2] != NULL;
        c->silu += t->op == LT_OP_SILU;
        c->conv_silu += t->op == LT_OP_CONV_SILU;
        c->conv_acc += t->op == LT_OP_ACC && strstr(t->name, "conv_output") != NULL;
        c->half_swiglu_back += t->op == LT_OP_SWIGLU_BACK && t->type == LT_TYPE_BF16;
        /* a rounding of a SWIGLU_BACK's gradient (a copy of the gated attention's, which
         * the tiny models' attention permutes, keeps its type) */
        c->cont_of_swiglu_back += t->op == LT_OP_CONT && t->src[0] && t->src[0]->view_src &&
                                  t->src[0]->view_src->op == LT_OP_SWIGLU_BACK &&
                                  t->type != t->src[0]->type;
        c->cont_of_norm += t->op == LT_OP_CONT && t->src[0] && t->src[0]->op == LT_OP_RMS_NORM;
        c->half_conv_back += t->op == LT_OP_CONV_SILU_BACK && t->type == LT_TYPE_BF16;
        c->cont_of_conv_back += t->op == LT_OP_CONT && t->src[0] && t->src[0]->view_src &&
                                t->src[0]->view_src->op == LT_OP_CONV_SILU_BACK &&
                                t->type != t->src[0]->type;
        if (t->op == LT_OP_MUL_MAT && t->type == LT_TYPE_BF16) {
            if (strncmp(t->name, "ffn_gate", 8) == 0 || strncmp(t->name, "ffn_up", 6) == 0)
                c->half_ffn++;
            else if (strncmp(t->name, "linear_attn_qkv_mixed", 21) == 0)
                c->half_qkv++;
            else if (strncmp(t->name, "z-", 2) == 0)
                c->half_z++;
            else
                c->half_other++;
        }
        c->scale_half += t->op == LT_OP_SCALE && t->type != LT_TYPE_F32;
        c->scale_of_product +=
            t->op == LT_OP_SCALE && t->src[0]->op == LT_OP_MUL_MAT &&
            (strncmp(t->name, "lora_a", 6) == 0 || strncmp(t->src[0]->name, "lora_a", 6) == 0);
        c->cont_of_ax += t->op == LT_OP_CONT && t->src[0]->op == LT_OP_MUL_MAT &&
                         strncmp(t->src[0]->name, "lora_a", 6) == 0;
        c->half_ax +=
            t->op == LT_OP_MUL_MAT && t->type == LT_TYPE_BF16 && strncmp(t->name, "lora_a", 6) == 0;
        c->half_ax_grad += t->op == LT_OP_MUL_MAT && t->type == LT_TYPE_BF16 &&
                           strncmp(t->name, "grad for lora_a", 15) == 0;
        c->shared_ax += t->op == LT_OP_MUL_MAT && strncmp(t->name, "lora_a shared", 13) == 0;
        /* a product into an input's gradient whose contraction is the adapters' ranks: the
         * first operand's rows are A's (a view of a rounding of A, or of the joined A's) */
        c->into_norms += (t->op == LT_OP_MUL_MAT || t->op == LT_OP_MUL_MAT_ACC) &&
                         (strncmp(t->name, "grad for attn_norm", 18) == 0 ||
                          strncmp(t->name, "grad for ffn_norm", 17) == 0);
        c->joined += t->op == LT_OP_MUL_MAT && t->src[0]->op == LT_OP_CONCAT &&
                     t->src[1]->op == LT_OP_CONCAT;
        for (int k = 0; k < LT_MAX_SRC && t->src[k]; k++)
            c->concat_readers += t->src[k]->op == LT_OP_CONCAT && t->src[k]->type == LT_TYPE_BF16;
        c->lce += t->op == LT_OP_LINEAR_CE;
        if (t->op == LT_OP_LINEAR_CE_BACK) {
            c->lce_back++;
            c->lce_parts = (unsigned)lt_get_param_i32(t, 1);
            c->lce_elements = lt_nelements(t);
        }
        char reason[160];
        if (lt_cuda_compiled() && !lt_cuda_verdict(t, reason, sizeof(reason)) && c->refused++ == 0)
            snprintf(c->why, sizeof(c->why), "%s '%s': %s", lt_op_name(t->op), t->name, reason);
    }
}

/* The loss graph with its gradients: loss, the gradients of every trainable copy
 * (concatenated) and the counts above */
static lt_status run(const struct lt_model *m, struct lt_backend *cpu,
                     const struct lt_model_replace *rep, int n_rep, const int32_t *tok,
                     const int32_t *lab, bool bf16, bool chain, bool fused, float *loss,
                     float *grads, struct graph_counts *c)
{
    struct lt_model_adapters ad = {.replace = rep,
                                   .n_replace = n_rep,
                                   .fused_loss = fused,
                                   .bf16_products = bf16,
                                   .chain_norms = chain};
    memset(c, 0, sizeof(*c));
    return tm_loss_and_grads(m, cpu, &ad, tok, lab, T, S, NULL, loss, grads, count, c);
}

/* A LoRA job's adapters (rank 4, alpha `alpha`) on m for `targets`, B drawn nonzero (B = 0
 * would hide the adapters' products in the forward) from the pattern `mul` and `mod`: the adapters'
 * A and B as the tensors whose gradients the runner reads (w NULL: no weight is replaced), and the
 * model's list of them; n_w their floats. False (checked) when the adapters can't be made. */
struct lora_job {
    struct lt_lora *l;
    struct lt_model_replace *rep;
    struct lt_model_lora *list;
    int n_list;
    size_t n_w;
};

static bool lora_job_new(const struct lt_model *m, const char *targets, uint64_t seed, float scale,
                         int mul, int mod, float alpha, struct lora_job *j)
{
    memset(j, 0, sizeof(*j));
    const struct lt_lora_params lp = {.rank = 4, .alpha = alpha, .targets = targets, .seed = seed};
    CHECK(lt_lora_new(m, &lp, &j->l) == LT_OK, "LoRA: %s", lt_last_error());
    if (!j->l)
        return false;
    j->rep = calloc((size_t)(2 * j->l->n_pairs), sizeof(*j->rep));
    for (int i = 0; i < j->l->n_pairs; i++) {
        float *bd = (float *)j->l->pairs[i].b->data;
        for (int64_t k = 0; k < lt_nelements(j->l->pairs[i].b); k++)
            bd[k] = scale * (float)((k * mul + i) % mod - mod / 2);
        j->rep[2 * i].with = j->l->pairs[i].a;
        j->rep[2 * i + 1].with = j->l->pairs[i].b;
        j->n_w += (size_t)(lt_nelements(j->l->pairs[i].a) + lt_nelements(j->l->pairs[i].b));
    }
    const float one = 1.0f;
    CHECK(lt_lora_model_list(m, &j->l, &one, 1, &j->list, &j->n_list) == LT_OK, "%s",
          lt_last_error());
    return j->list != NULL;
}

static void lora_job_free(struct lora_job *j)
{
    free(j->list);
    free(j->rep);
    lt_lora_free(j->l);
}

#define LORA_ALL_TARGETS                                                                           \
    "attn_qkv,attn_gate,ssm_out,attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down"

/* What a test comparing two runs of one LoRA job holds: the job (lora_job_new's arguments),
 * the tokens both runs read and a gradient buffer for each (n_w floats) */
struct lora_pair {
    struct lora_job j;
    float *ga, *gb;
    int32_t tok[S * T], lab[S * T];
};

static bool lora_pair_new(const struct lt_model *m, const char *targets, uint64_t seed, float scale,
                          int mul, int mod, float alpha, struct lora_pair *p)
{
    if (!lora_job_new(m, targets, seed, scale, mul, mod, alpha, &p->j)) {
        lora_job_free(&p->j);
        return false;
    }
    p->ga = malloc(p->j.n_w * sizeof(float));
    p->gb = malloc(p->j.n_w * sizeof(float));
    tm_next_tokens(p->tok, p->lab, T, S * T, (int)lt_model_hparams(m)->n_vocab);
    return true;
}

static void lora_pair_free(struct lora_pair *p)
{
    free(p->ga);
    free(p->gb);
    lora_job_free(&p->j);
}

/* the adapters of j in the device's training graph (fused loss, BF16 products) or, bf16
 * false, the same graph with F32 products */
static struct lt_model_adapters lora_adapters(const struct lora_job *j, bool chain, bool bf16)
{
    return (struct lt_model_adapters){.replace = j->rep,
                                      .n_replace = 2 * j->l->n_pairs,
                                      .lora = j->list,
                                      .n_lora = j->n_list,
                                      .fused_loss = true,
                                      .bf16_products = bf16,
                                      .chain_norms = chain};
}

/* The loss and adapter gradients of j's graph (chain_norms `chain`) on tok / lab, its nodes
 * counted into c, with every product storing F32 (LATHE_HALF_FFN=0, LATHE_HALF_QKV=0,
 * LATHE_HALF_Z=0): the
 * equivalence tests compare two graphs whose F32 sums differ in order, which BF16 results
 * would turn into whole BF16 steps */
static void lora_run(const struct lt_model *m, struct lt_backend *cpu, const struct lora_job *j,
                     bool chain, const int32_t *tok, const int32_t *lab, float *loss, float *grads,
                     struct graph_counts *c, const char *what)
{
    struct lt_model_adapters ad = lora_adapters(j, chain, true);
    memset(c, 0, sizeof(*c));
    setenv("LATHE_HALF_FFN", "0", 1);
    setenv("LATHE_HALF_QKV", "0", 1);
    setenv("LATHE_HALF_Z", "0", 1);
    CHECK(tm_loss_and_grads(m, cpu, &ad, tok, lab, T, S, NULL, loss, grads, count, c) == LT_OK,
          "LoRA, %s: %s", what, lt_last_error());
    unsetenv("LATHE_HALF_FFN");
    unsetenv("LATHE_HALF_QKV");
    unsetenv("LATHE_HALF_Z");
}

/* A LoRA job's device graph on Qwen3.5, adapters on the QKV, gate and up weights with B
 * drawn nonzero: q, k and v as three products (each adapter's B sliced alike, lt_mb_mm_rows)
 * give the one-projection graph's (chain_norms) loss and adapter gradients within 1e-5 */
static void test_lora_split(const struct lt_model *m, struct lt_backend *cpu)
{
    struct lora_pair lp;
    if (!lora_pair_new(m, "attn_qkv,attn_gate,ffn_up", 5, 0.02f, 37, 19, 8.0f, &lp))
        return;
    float ls = 0, lc = 0;
    struct graph_counts cs, cc;
    lora_run(m, cpu, &lp.j, false, lp.tok, lp.lab, &ls, lp.ga, &cs, "q, k, v split");
    lora_run(m, cpu, &lp.j, true, lp.tok, lp.lab, &lc, lp.gb, &cc, "chain_norms");
    const double e = tm_rel_err(lp.ga, lp.gb, (int)lp.j.n_w);
    CHECK(fabsf(ls - lc) <= 1e-6f * fabsf(lc) && e < 1e-5 && cs.conv_silu == 3 * cc.conv_silu &&
              cc.conv_silu > 0,
          "qwen35 LoRA: split q, k, v loss %.7f against %.7f, adapter gradients off by %.3g; "
          "%d CONV_SILU against %d",
          (double)ls, (double)lc, e, cs.conv_silu, cc.conv_silu);
    /* the head is frozen: its backward makes dh and the loss, no dw, and no LINEAR_CE runs */
    const struct lt_model_hparams *hp = lt_model_hparams(m);
    CHECK(cs.lce == 0 && cs.lce_back == 1 &&
              cs.lce_parts == (LT_LINEAR_CE_DH | LT_LINEAR_CE_LOSS) &&
              cs.lce_elements == hp->n_embd * S * T + 1,
          "qwen35 LoRA: %d LINEAR_CE, %d LINEAR_CE_BACK of parts %#x and %lld elements (want "
          "dh and the loss: %lld)",
          cs.lce, cs.lce_back, cs.lce_parts, (long long)cs.lce_elements,
          (long long)(hp->n_embd * S * T + 1));
    /* ffn_up is a LoRA target's product (joined with its adapter's, or added over it:
     * MUL_MAT_ACC), ffn_gate a plain one: both still take their gradients in BF16 from
     * SWIGLU_BACK, with no CONT rounding them */
    CHECK(cs.half_swiglu_back > 0 && cs.cont_of_swiglu_back == 0,
          "qwen35 LoRA: %d BF16 SWIGLU_BACK nodes, %d CONT of their gradients", cs.half_swiglu_back,
          cs.cont_of_swiglu_back);
    printf("qwen35 LoRA (%d adapters): split q, k, v within %.2g of one projection's\n",
           lp.j.l->n_pairs, e);
    lora_pair_free(&lp);
}

/* A LoRA job's device graph on Qwen3.5 with adapters on every projection, B drawn nonzero:
 * with the targets' products joined along the contraction ([W ; B] against [x ; A x], where
 * the outputs outnumber half the inputs) the loss and the adapters' gradients are those of
 * the base product added over the adapter's (LATHE_LORA_JOIN=0). The sums differ only in
 * order, in F32; an activation rounded to BF16 after them may land one step apart, so the
 * bound is 1e-4, not the 1e-5 of the same sums in the same order. Nothing but the joined
 * products reads a join (two each): no gradient of the joined weight [K + r, rows] is made. */
static void test_lora_join(const struct lt_model *m, struct lt_backend *cpu)
{
    struct lora_pair lp;
    if (!lora_pair_new(m, LORA_ALL_TARGETS, 9, 0.03f, 29, 17, 8.0f, &lp))
        return;
    setenv("LATHE_LORA_SHARE_A", "0", 1); /* an A x a weight, as counted below */
    const struct lora_job *j = &lp.j;
    const size_t n_w = j->n_w;
    float *gj = lp.ga, *ga = lp.gb, lj = 0, la = 0;
    struct graph_counts cj, ca;
    lora_run(m, cpu, j, false, lp.tok, lp.lab, &lj, gj, &cj, "joined");
    setenv("LATHE_LORA_JOIN", "0", 1);
    lora_run(m, cpu, j, false, lp.tok, lp.lab, &la, ga, &ca, "LATHE_LORA_JOIN=0");
    unsetenv("LATHE_LORA_JOIN");
    /* A x as one BF16 product of A rounded with the scale (2 here), and B rounded whole:
     * the bits of the chain before (LATHE_LORA_HALF_AX=0), a power of two scaling exactly */
    float *gc = malloc(n_w * sizeof(float)), lc = 0;
    struct graph_counts cc;
    setenv("LATHE_LORA_HALF_AX", "0", 1);
    lora_run(m, cpu, j, false, lp.tok, lp.lab, &lc, gc, &cc, "LATHE_LORA_HALF_AX=0");
    unsetenv("LATHE_LORA_HALF_AX");
    const double ec = tm_rel_err(gj, gc, (int)n_w);
    CHECK(lj == lc && ec == 0 && cj.half_ax == j->l->n_pairs && cc.half_ax == 0 &&
              cc.scale_of_product == j->l->n_pairs,
          "qwen35 LoRA: A x folded, loss %.7f against the chain's %.7f, adapter gradients off by "
          "%.3g; %d A x products storing BF16 (the chain: %d, with %d SCALE of them)",
          (double)lj, (double)lc, ec, cj.half_ax, cc.half_ax, cc.scale_of_product);
    free(gc);
    const double e = tm_rel_err(gj, ga, (int)n_w);
    CHECK(fabsf(lj - la) <= 1e-5f * fabsf(la) && e < 1e-4,
          "qwen35 LoRA: joined products' loss %.7f against %.7f, adapter gradients off by %.3g",
          (double)lj, (double)la, e);
    CHECK(cj.joined > 0 && ca.joined == 0 && cj.concat_readers == 2 * cj.joined &&
              ca.concat_readers == 0 && cj.refused == 0,
          "qwen35 LoRA: %d joined products (%d with the switch off), %d readers of the joins, "
          "%d nodes CUDA refuses (%s)",
          cj.joined, ca.joined, cj.concat_readers, cj.refused, cj.why);
    printf("qwen35 LoRA (%d adapters): %d joined products, loss and gradients within %.2g of "
           "the added ones'\n",
           j->l->n_pairs, cj.joined, e);
    unsetenv("LATHE_LORA_SHARE_A");
    lora_pair_free(&lp);
}

/* A LoRA job's device graph on Qwen3.5 with adapters on every projection: the adapters of
 * the products that read one input (the gate and up; a DeltaNet's q/k/v and gate; an
 * attention's q, k and v) take their A x as one product by their A's joined along the rank
 * (lt_mb_lora_share_ax), so the input's gradient takes their terms in one product where it took
 * one an adapter. The same sums of the same terms: the loss and the adapters' gradients are
 * those of an A x an adapter (LATHE_LORA_SHARE_A=0) to F32 order, and CUDA runs every node. */
static void test_lora_share(const struct lt_model *m, struct lt_backend *cpu)
{
    struct lora_pair lp;
    if (!lora_pair_new(m, LORA_ALL_TARGETS, 21, 0.03f, 41, 13, 8.0f, &lp))
        return;
    float ls = 0, lo = 0;
    struct graph_counts cs, co;
    lora_run(m, cpu, &lp.j, false, lp.tok, lp.lab, &ls, lp.ga, &cs, "A x shared");
    setenv("LATHE_LORA_SHARE_A", "0", 1);
    lora_run(m, cpu, &lp.j, false, lp.tok, lp.lab, &lo, lp.gb, &co, "LATHE_LORA_SHARE_A=0");
    unsetenv("LATHE_LORA_SHARE_A");
    const double e = tm_rel_err(lp.ga, lp.gb, (int)lp.j.n_w);
    CHECK(fabsf(ls - lo) <= 1e-6f * fabsf(lo) && e < 1e-5,
          "qwen35 LoRA: shared A x loss %.7f against %.7f, adapter gradients off by %.3g",
          (double)ls, (double)lo, e);
    CHECK(cs.shared_ax > 0 && co.shared_ax == 0 && cs.half_ax < co.half_ax &&
              cs.into_norms < co.into_norms && cs.refused == 0,
          "qwen35 LoRA: %d shared A x products (%d with the switch off), %d A x products "
          "in all against %d, %d products into the norms' gradients against %d, %d nodes CUDA "
          "refuses (%s)",
          cs.shared_ax, co.shared_ax, cs.half_ax, co.half_ax, cs.into_norms, co.into_norms,
          cs.refused, cs.why);
    printf("qwen35 LoRA (%d adapters): %d shared A x products, %d A x products against %d, "
           "%d products into the norms' gradients against %d; within %.2g\n",
           lp.j.l->n_pairs, cs.shared_ax, cs.half_ax, co.half_ax, cs.into_norms, co.into_norms, e);
    lora_pair_free(&lp);
}

/* A LoRA job's device graph on Qwen3.5 with adapters on every projection, at a scale that
 * is no power of two (alpha 6, rank 4): each adapter's A x is one product storing BF16 from
 * A scaled as it is rounded (lt_scale_as), with no SCALE or rounding of [r, T] after it, and
 * where one product reads A x its gradient is made in BF16 by the product that computes it.
 * The loss and the adapters' gradients stay within the BF16 products' bounds of the same
 * job's F32 graph (1e-2 and 0.1, as the whole models'). */
static void test_lora_ax(const struct lt_model *m, struct lt_backend *cpu)
{
    struct lora_pair lp;
    if (!lora_pair_new(m, LORA_ALL_TARGETS, 13, 0.03f, 31, 23, 6.0f, &lp))
        return;
    setenv("LATHE_LORA_SHARE_A", "0", 1); /* an A x a weight, as counted below */
    float *g16 = lp.ga, *g32 = lp.gb, l16 = 0, l32 = 0;
    struct graph_counts c16, c32;
    memset(&c16, 0, sizeof(c16));
    memset(&c32, 0, sizeof(c32));
    struct lt_model_adapters a16 = lora_adapters(&lp.j, false, true),
                             a32 = lora_adapters(&lp.j, false, false);
    CHECK(tm_loss_and_grads(m, cpu, &a16, lp.tok, lp.lab, T, S, NULL, &l16, g16, count, &c16) ==
              LT_OK,
          "LoRA, BF16 products: %s", lt_last_error());
    CHECK(tm_loss_and_grads(m, cpu, &a32, lp.tok, lp.lab, T, S, NULL, &l32, g32, count, &c32) ==
              LT_OK,
          "LoRA, F32 products: %s", lt_last_error());
    const double e = tm_rel_err(g16, g32, (int)lp.j.n_w);
    const int n = lp.j.l->n_pairs;
    CHECK(fabsf(l16 - l32) <= 1e-2f * fabsf(l32) && e < 0.1,
          "qwen35 LoRA at scale 1.5: BF16 products' loss %.6f against F32's %.6f, adapter "
          "gradients off by %.3g",
          (double)l16, (double)l32, e);
    CHECK(c16.scale_half == n && c16.half_ax == n && c16.scale_of_product == 0 &&
              c16.cont_of_ax == 0 && c16.half_ax_grad > 0 && c16.refused == 0,
          "qwen35 LoRA (%d adapters): %d half SCALE of A, %d A x products storing BF16, %d "
          "SCALE and %d CONT after a product, %d A x gradients made BF16, %d nodes CUDA refuses "
          "(%s)",
          n, c16.scale_half, c16.half_ax, c16.scale_of_product, c16.cont_of_ax, c16.half_ax_grad,
          c16.refused, c16.why);
    CHECK(c32.scale_of_product == n && c32.scale_half == 0 && c32.half_ax == 0,
          "qwen35 LoRA, F32 products: %d SCALE of A x (want %d), %d half SCALE, %d half A x",
          c32.scale_of_product, n, c32.scale_half, c32.half_ax);
    printf("qwen35 LoRA (%d adapters) at scale 1.5: BF16 loss %.5f (F32 %.5f), gradients within "
           "%.2g; %d A x gradients made in BF16\n",
           n, (double)l16, (double)l32, e, c16.half_ax_grad);
    unsetenv("LATHE_LORA_SHARE_A");
    lora_pair_free(&lp);
}

static void test_arch(const struct tm_spec *sp, int idx, struct lt_backend *cpu)
{
    char path[600];
    tm_model_path(path, sizeof(path), "test_train_bf16", idx);
    struct lt_model *m;
    struct lt_model_f32_params *fp;
    const struct lt_model_replace *rep = NULL;
    int n_rep = 0;
    const size_t n_w = tm_load_f32(sp, path, 700 + (uint64_t)idx, &m, &fp, &rep, &n_rep);
    if (!n_w) {
        CHECK(0, "%s: %s", sp->arch, lt_last_error());
        return;
    }
    float *g32 = malloc(n_w * sizeof(float)), *g16 = malloc(n_w * sizeof(float)),
          *gch = malloc(n_w * sizeof(float)), *gmm = malloc(n_w * sizeof(float)),
          *gfu = malloc(n_w * sizeof(float));
    const int V = (int)lt_model_hparams(m)->n_vocab;
    int32_t tok[S * T], lab[S * T];
    tm_next_tokens(tok, lab, T, S * T, V);
    float l32, l16, lch, lmm;
    struct graph_counts c32, c16, cch, cmm;
    lt_status st = run(m, cpu, rep, n_rep, tok, lab, false, false, true, &l32, g32, &c32);
    CHECK(st == LT_OK, "%s F32: %s", sp->arch, lt_last_error());
    if (st == LT_OK) {
        st = run(m, cpu, rep, n_rep, tok, lab, true, false, true, &l16, g16, &c16);
        CHECK(st == LT_OK, "%s BF16 products: %s", sp->arch, lt_last_error());
    }
    /* the fused norms against their chain with the q, k, v and z products in F32 on both
     * sides (LATHE_HALF_QKV=0, LATHE_HALF_Z=0): the chain keeps Qwen3.5's q, k and v as one
     * F32 product, and its z, which SILU reads, in F32 */
    float lfu = 0;
    struct graph_counts cfu;
    setenv("LATHE_HALF_QKV", "0", 1);
    setenv("LATHE_HALF_Z", "0", 1);
    if (st == LT_OK) {
        st = run(m, cpu, rep, n_rep, tok, lab, true, true, true, &lch, gch, &cch);
        CHECK(st == LT_OK, "%s BF16 products, chained norms: %s", sp->arch, lt_last_error());
    }
    if (st == LT_OK) {
        st = run(m, cpu, rep, n_rep, tok, lab, true, false, true, &lfu, gfu, &cfu);
        CHECK(st == LT_OK, "%s BF16 products, F32 q, k, v: %s", sp->arch, lt_last_error());
    }
    unsetenv("LATHE_HALF_QKV");
    unsetenv("LATHE_HALF_Z");
    if (st == LT_OK) {
        st = run(m, cpu, rep, n_rep, tok, lab, false, false, false, &lmm, gmm, &cmm);
        CHECK(st == LT_OK, "%s F32, the head as mul_mat: %s", sp->arch, lt_last_error());
    }
    if (st == LT_OK) {
        const bool qwen35 = !strcmp(sp->arch, "qwen35");
        const double e = tm_rel_err(g16, g32, (int)n_w), ech = tm_rel_err(gfu, gch, (int)n_w);
        CHECK(fabsf(lfu - lch) <= 1e-6f * fabsf(lch) && ech < 1e-5,
              "%s: fused norms' loss %.7f against the chain's %.7f, gradients off by %.3g",
              sp->arch, (double)lfu, (double)lch, ech);
        CHECK(cch.norm_mul_back == 0 && cch.gated_norms == 0,
              "%s: chain_norms left %d RMS_NORM_MUL_BACK and %d gated norms", sp->arch,
              cch.norm_mul_back, cch.gated_norms);
        CHECK(fabsf(l16 - l32) <= 1e-2f * fabsf(l32), "%s: BF16 products' loss %.6f, F32 %.6f",
              sp->arch, (double)l16, (double)l32);
        CHECK(e < 0.1, "%s: BF16 products' gradients off by %.3g", sp->arch, e);
        CHECK(c32.norm_mul_back == 0 && c16.norm_mul_back > 0,
              "%s: RMS_NORM_MUL_BACK nodes: %d in the F32 graph, %d in the BF16 one", sp->arch,
              c32.norm_mul_back, c16.norm_mul_back);
        CHECK(c16.cont_of_norm == 0, "%s: %d CONT nodes round a norm's output", sp->arch,
              c16.cont_of_norm);
        if (qwen35)
            CHECK(c16.gated_norms > 0 && c16.silu == 0 && c32.silu > 0,
                  "qwen35: %d gated norms and %d SILU nodes with BF16 products (%d SILU in F32)",
                  c16.gated_norms, c16.silu, c32.silu);
        CHECK(c16.half_swiglu_back > 0 && c32.half_swiglu_back == 0 && c16.cont_of_swiglu_back == 0,
              "%s: BF16 SWIGLU_BACK nodes: %d with BF16 products (%d CONT of their gradients), "
              "%d in F32",
              sp->arch, c16.half_swiglu_back, c16.cont_of_swiglu_back, c32.half_swiglu_back);
        if (qwen35) /* q, k and v each their own product and conv: no ACC of views */
            CHECK(c16.conv_silu == 3 * cch.conv_silu && cch.conv_silu > 0 && c16.conv_acc == 0 &&
                      cch.conv_acc > 0,
                  "qwen35: %d CONV_SILU and %d ACC into a conv output (chained norms: %d and %d)",
                  c16.conv_silu, c16.conv_acc, cch.conv_silu, cch.conv_acc);
        /* their backwards write d x in BF16, which the q, k, v products read unrounded */
        if (qwen35)
            CHECK(c16.half_conv_back == c16.conv_silu && c16.cont_of_conv_back == 0 &&
                      c32.half_conv_back == 0 && c32.conv_silu > 0,
                  "qwen35: %d of %d CONV_SILU_BACK write BF16 (%d CONT of their d x); %d in F32",
                  c16.half_conv_back, c16.conv_silu, c16.cont_of_conv_back, c32.half_conv_back);
        /* the FFN's gate and up store BF16 (lt_mul_mat_as), a pair a layer, and so do
         * Qwen3.5's q, k and v, three a DeltaNet layer, and its z, one, in the BF16 graph
         * alone */
        const int n_layer = (int)lt_model_hparams(m)->n_layer;
        CHECK(c16.half_ffn == 2 * n_layer && (c16.half_qkv > 0) == qwen35 &&
                  c16.half_qkv % 3 == 0 && c16.half_z * 3 == c16.half_qkv && c16.half_other == 0 &&
                  c32.half_ffn + c32.half_qkv + c32.half_z + c32.half_other == 0,
              "%s: products that store BF16: %d of the FFN (want the %d layers' gate and up), %d "
              "q, k, v, %d z, %d others; %d in F32",
              sp->arch, c16.half_ffn, n_layer, c16.half_qkv, c16.half_z, c16.half_other,
              c32.half_ffn + c32.half_qkv + c32.half_z + c32.half_other);
        CHECK(c16.refused == 0, "%s: CUDA refuses %d nodes of the BF16 graph (%s)", sp->arch,
              c16.refused, c16.why);
        /* every weight trainable: the head's backward makes dh, dw and the loss, in place of
         * LINEAR_CE */
        const unsigned all = LT_LINEAR_CE_DH | LT_LINEAR_CE_DW | LT_LINEAR_CE_LOSS;
        CHECK(c16.lce == 0 && c16.lce_back == 1 && c16.lce_parts == all && c32.lce == 0 &&
                  c32.lce_parts == all && cmm.lce_back == 0,
              "%s: %d LINEAR_CE and %d LINEAR_CE_BACK of parts %#x (F32: %d, %#x)", sp->arch,
              c16.lce, c16.lce_back, c16.lce_parts, c32.lce, c32.lce_parts);
        /* the same loss and gradients as the head through mul_mat and CROSS_ENTROPY (a tied
         * head's gradient has the embedding's rows too), within the products' rounding */
        const double emm = tm_rel_err(g32, gmm, (int)n_w);
        CHECK(fabsf(l32 - lmm) <= 1e-6f * fabsf(lmm) && emm < 1e-5,
              "%s: the folded LINEAR_CE's loss %.7f against mul_mat's %.7f, gradients off by "
              "%.3g",
              sp->arch, (double)l32, (double)lmm, emm);
        printf("%s: BF16 products loss %.5f (F32 %.5f), gradients within %.2g of F32's, "
               "%.2g of the chained norms'; %d RMS_NORM_MUL_BACK, %d gated norms; the folded "
               "head's gradients within %.2g of mul_mat's\n",
               sp->arch, (double)l16, (double)l32, e, ech, c16.norm_mul_back, c16.gated_norms, emm);
        if (qwen35) {
            test_lora_split(m, cpu);
            test_lora_join(m, cpu);
            test_lora_ax(m, cpu);
            test_lora_share(m, cpu);
        }
    }
    free(g32);
    free(g16);
    free(gch);
    free(gmm);
    free(gfu);
    lt_model_f32_params_free(fp);
    lt_model_free(m);
    remove(path);
}

int main(void)
{
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int i = 0; i < TM_N_SPECS; i++)
        test_arch(&tm_specs[i], i, cpu);
    lt_backend_free(cpu);
    return check_summary();
}
