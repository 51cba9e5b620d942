/* test_core.c: tensors, views, strides, graphs, half/bfloat16 conversion, the op table. */
#include <string.h>

#include "check.h"
#include "lathe/backend.h"
#include "lathe/ops.h"
#include "ops/op.h"

static void test_views(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_tensor *a = lt_new_tensor_3d(ctx, LT_TYPE_F32, 4, 3, 2);
    CHECK(lt_is_contiguous(a));
    CHECK(a->nb[1] == 16 && a->nb[2] == 48);
    struct lt_tensor *t = lt_transpose(ctx, a);
    CHECK(t->ne[0] == 3 && t->ne[1] == 4 && !lt_is_contiguous(t));
    CHECK(t->view_src == a && t->data == a->data);
    CHECK(!strcmp(lt_layout_name(t), "a transposed view"));
    struct lt_tensor *p = lt_permute(ctx, a, 2, 0, 1, 3);
    CHECK(p->ne[2] == 4 && p->ne[0] == 3 && p->ne[1] == 2);
    struct lt_tensor *v = lt_view_2d(ctx, a, 2, 3, a->nb[1], 8);
    CHECK(v->data == (char *)a->data + 8 && !lt_is_contiguous(v));
    struct lt_tensor *vv = lt_view_1d(ctx, v, 2, 16);
    CHECK(vv->view_src == a && vv->view_offs == 24);
    CHECK(lt_view_1d(ctx, a, 25, 0) == NULL); /* past the end */
    CHECK(lt_reshape_2d(ctx, t, 12, 2) == NULL); /* not contiguous */
    struct lt_tensor *r = lt_reshape_2d(ctx, a, 12, 2);
    CHECK(r && lt_is_contiguous(r) && r->data == a->data);
    float vals[24];
    for (int i = 0; i < 24; i++)
        vals[i] = (float)i;
    lt_tensor_fill_f32(a, vals);
    CHECK(lt_get_f32_nd(t, 2, 1, 0, 0) == 9.0f); /* a[1, 2] = 1 + 4 * 2 */
    float out[24];
    lt_tensor_read_f32(t, out);
    CHECK(out[0] == 0 && out[1] == 4 && out[2] == 8 && out[3] == 1);
    struct lt_tensor *q = lt_new_tensor_2d(ctx, LT_TYPE_Q4_K, 256, 3);
    CHECK(q && q->nb[1] == 144 && lt_nbytes(q) == 432);
    CHECK(lt_new_tensor_2d(ctx, LT_TYPE_Q4_K, 100, 3) == NULL);
    lt_ctx_free(ctx);
}

static void test_half(void)
{
    const float cases[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f,
                           0.333333f, 1e-3f, 70000.0f};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        float f = cases[i];
        float h = lt_fp16_to_fp32(lt_fp32_to_fp16(f));
        float expect = f > 65504.0f ? INFINITY : f;
        CHECK(fabsf(h - expect) <= fabsf(expect) * 1e-3f + 1e-7f || h == expect, "%g -> %g", f, h);
        float b = lt_bf16_to_fp32(lt_fp32_to_bf16(f));
        CHECK(fabsf(b - f) <= fabsf(f) * 8e-3f, "bf16 %g -> %g", f, b);
    }
    /* every half value survives a round trip through float */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue; /* nan */
        if (lt_fp32_to_fp16(lt_fp16_to_fp32((uint16_t)h)) != h)
            bad++;
    }
    CHECK(bad == 0, "%d half values do not round-trip", bad);
    CHECK(lt_fp32_to_bf16(1.00390625f) == 0x3f80); /* ties to even */
}

static void test_graph(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *a = lt_new_tensor_1d(ctx, LT_TYPE_F32, 8);
    struct lt_tensor *b = lt_new_tensor_1d(ctx, LT_TYPE_F32, 8);
    struct lt_tensor *c = lt_new_op_tensor(ctx, LT_OP_ADD, LT_TYPE_F32, 1, a->ne,
                                           (struct lt_tensor *[]){a, b}, 2);
    struct lt_tensor *d = lt_new_op_tensor(ctx, LT_OP_MUL, LT_TYPE_F32, 1, a->ne,
                                           (struct lt_tensor *[]){c, a}, 2);
    struct lt_tensor *e = lt_new_op_tensor(ctx, LT_OP_ADD, LT_TYPE_F32, 1, a->ne,
                                           (struct lt_tensor *[]){d, c}, 2);
    struct lt_graph *g = lt_graph_new(ctx, 64);
    CHECK(lt_graph_build(g, e) == LT_OK);
    CHECK(g->n_nodes == 3 && g->n_leafs == 2);
    CHECK(g->nodes[0] == c && g->nodes[1] == d && g->nodes[2] == e);
    CHECK(lt_graph_contains(g, a) && lt_graph_contains(g, b));
    lt_ctx_free(ctx);
}

static void test_op_table(void)
{
    for (int op = 0; op < LT_OP_COUNT; op++) {
        const struct lt_op_def *def = lt_op_def((enum lt_op)op);
        CHECK(def && def->name && def->name[0], "op %d has no table entry", op);
    }
    CHECK(!strcmp(lt_op_name(LT_OP_SQR), "SQR"));
    CHECK(!strcmp(lt_op_name(LT_OP_RMS_NORM), "RMS_NORM"));
}

int main(void)
{
    test_views();
    test_half();
    test_graph();
    test_op_table();
    return check_summary();
}
