/* test_ops_basic_copy.c: cont, cpy, concat, repeat, get_rows, set_rows and the backward helpers acc,
 * repeat_back and get_rows_back, on the CPU backend with 1 and 2 threads, against plain
 * reference loops, for contiguous, transposed, permuted and sliced sources. */
#include "test_ops_basic.h"

static const int64_t shape[4] = {7, 5, 3, 2};

/* a value rounded through `type` as a store into it would */
static float round_to(enum lt_type type, float v)
{
    switch (type) {
    case LT_TYPE_F16: return lt_fp16_to_fp32(lt_fp32_to_fp16(v));
    case LT_TYPE_BF16: return lt_bf16_to_fp32(lt_fp32_to_bf16(v));
    default: return v;
    }
}

/* ---- cont ---- */

static void test_cont(struct ops_test *t)
{
    const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16, LT_TYPE_I32};
    char what[128];
    for (int l = 0; l < LAYOUT_COUNT; l++)
        for (int ty = 0; ty < 4; ty++) {
            struct lt_tensor *x = input_new(t, types[ty], shape, l, -100, 100);
            float *ref = dense(x);
            struct lt_tensor *c = lt_cont(t->ctx, x);
            snprintf(what, sizeof(what), "cont of %s %s", lt_type_name(types[ty]), layout_names[l]);
            CHECK(c && c->type == types[ty] && lt_is_contiguous(c) && !c->view_src, "%s", what);
            check_op(t, c, ref, 0, 0, what);
            free(ref);
        }
    /* a quantised slice of whole rows is copied byte for byte */
    struct lt_tensor *q = lt_new_tensor_2d(t->ctx, LT_TYPE_Q8_0, 64, 5);
    for (size_t i = 0; i < lt_nbytes(q); i++)
        ((unsigned char *)q->data)[i] = (unsigned char)(i * 7 + 3);
    struct lt_tensor *qv = lt_view_2d(t->ctx, q, 64, 2, q->nb[1] * 2, q->nb[1]); /* rows 1, 3 */
    struct lt_tensor *qc = lt_cont(t->ctx, qv);
    struct lt_graph *g = lt_graph_new(t->ctx, 16);
    CHECK(qc && lt_graph_build(g, qc) == LT_OK && lt_cpu_graph_compute(t->cpu[1], g) == LT_OK);
    CHECK(qc && !memcmp(qc->data, (char *)q->data + q->nb[1], q->nb[1]) &&
              !memcmp((char *)qc->data + q->nb[1], (char *)q->data + 3 * q->nb[1], q->nb[1]),
          "cont of a q8_0 slice");
}

/* ---- cpy ---- */

/* Copies a [7 5 3 2] source of type `from` in layout la into a destination of type `to`
 * that is a (layout ld) view inside a larger tensor; checks the copied values, that the
 * rest of the destination's storage is untouched, and that a reader of the result runs
 * after the copy. */
static void check_cpy(struct ops_test *t, enum lt_type from, enum lt_type to, int la, int ld)
{
    char what[160];
    struct lt_tensor *a = input_new(t, from, shape, la, -3, 3);
    struct lt_tensor *dst = input_new(t, to, shape, ld, 50, 60);
    struct lt_tensor *root = lt_storage_root(dst);
    float *av = dense(a);
    float *before = dense(root);
    float ref[210];
    for (int i = 0; i < 210; i++)
        ref[i] = round_to(to, av[i]);
    struct lt_tensor *r = lt_cpy(t->ctx, a, dst);
    snprintf(what, sizeof(what), "cpy of %s %s into %s %s", lt_type_name(from), layout_names[la],
             lt_type_name(to), layout_names[ld]);
    CHECK(r && r->op == LT_OP_CPY && r->src[0] == a && r->src[1] == dst && r->type == to,
          "%s: the node", what);
    CHECK(r && r->view_src == root && r->data == dst->data && r->view_offs == dst->view_offs &&
              !memcmp(r->nb, dst->nb, sizeof(r->nb)),
          "%s: the result is a view of dst", what);
    check_op(t, r, ref, 0, 0, what);
    /* elements of the storage outside dst keep their values (NaN compares unequal: use bits) */
    float *after = dense(root);
    float *dv = dense(dst);
    int64_t n_outside = 0, changed = 0;
    for (int64_t i = 0; i < lt_nelements(root); i++) {
        bool same = !memcmp(&before[i], &after[i], sizeof(float));
        if (isnan(before[i])) {
            n_outside++;
            changed += !same;
        }
    }
    CHECK(changed == 0, "%s: %lld of %lld elements outside dst changed", what, (long long)changed,
          (long long)n_outside);
    CHECK(!memcmp(dv, ref, sizeof(ref)), "%s: dst holds the copy", what);
    /* a reader of the result sees the copied values */
    struct lt_tensor *plus = lt_scale(t->ctx, r, 2.0f);
    float ref2[210];
    for (int i = 0; i < 210; i++)
        ref2[i] = 2.0f * ref[i];
    snprintf(what, sizeof(what), "2 * (cpy of %s %s into %s %s)", lt_type_name(from),
             layout_names[la], lt_type_name(to), layout_names[ld]);
    check_op(t, plus, ref2, 0, 0, what);
    free(av);
    free(before);
    free(after);
    free(dv);
}

static void test_cpy(struct ops_test *t)
{
    const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    for (int from = 0; from < 3; from++)
        for (int to = 0; to < 3; to++)
            for (int la = 0; la < LAYOUT_COUNT; la++)
                for (int ld = 0; ld < LAYOUT_COUNT; ld++) {
                    if (from != to && la != ld && la != LAYOUT_CONTIGUOUS)
                        continue; /* every layout pair for same types, fewer across types */
                    check_cpy(t, types[from], types[to], la, ld);
                }

    /* reshaping copies: rows of the same length, then of different lengths */
    for (int la = 0; la < LAYOUT_COUNT; la++) {
        struct lt_tensor *a = input_new(t, LT_TYPE_F32, shape, la, -3, 3);
        float *av = dense(a);
        float ref16[210];
        for (int i = 0; i < 210; i++)
            ref16[i] = round_to(LT_TYPE_F16, av[i]);
        struct lt_tensor *d1 = lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 7, 15, 2);
        check_op(t, lt_cpy(t->ctx, a, d1), av, 0, 0, "cpy of [7 5 3 2] into [7 15 2]");
        struct lt_tensor *d2 = lt_new_tensor_2d(t->ctx, LT_TYPE_F16, 35, 6);
        check_op(t, lt_cpy(t->ctx, a, d2), ref16, 0, 0, "cpy of [7 5 3 2] into f16 [35 6]");
        /* into a transposed [30 7] view (different row length, strided) */
        struct lt_tensor *base = lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 7, 30);
        check_op(t, lt_cpy(t->ctx, a, lt_transpose(t->ctx, base)), av, 0, 0,
                 "cpy of [7 5 3 2] into a transposed [30 7]");
        free(av);
    }

    /* i32 copies exactly (no trip through float) */
    struct lt_tensor *ia = lt_new_tensor_2d(t->ctx, LT_TYPE_I32, 3, 2);
    int32_t iv[6] = {16777217, -16777219, 2147483647, -2147483647, 5, 0};
    memcpy(ia->data, iv, sizeof(iv));
    struct lt_tensor *ib = lt_new_tensor_2d(t->ctx, LT_TYPE_I32, 2, 3);
    struct lt_tensor *ic = lt_cpy(t->ctx, ia, lt_transpose(t->ctx, ib));
    struct lt_graph *g = lt_graph_new(t->ctx, 16);
    CHECK(ic && lt_graph_build(g, ic) == LT_OK && lt_cpu_graph_compute(t->cpu[1], g) == LT_OK);
    const int32_t *ibv = ib->data;
    CHECK(ibv[0] == iv[0] && ibv[1] == iv[3] && ibv[2] == iv[1] && ibv[5] == iv[5],
          "i32 cpy: %d %d %d", ibv[0], ibv[1], ibv[2]);

    struct lt_tensor *a = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 7, 5), "k_cur");
    struct lt_tensor *kv = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F16, 7, 4), "cache_k");
    check_refused(lt_cpy(t->ctx, a, kv), "cache_k", "cpy of 35 into 28 elements");
    struct lt_tensor *q = lt_set_name(lt_new_tensor_1d(t->ctx, LT_TYPE_Q4_K, 256), "q4k");
    struct lt_tensor *f = lt_set_name(lt_new_tensor_1d(t->ctx, LT_TYPE_F32, 256), "f");
    check_refused(lt_cpy(t->ctx, f, q), "q4k", "cpy into q4_K (cannot be written)");
}

/* ---- concat ---- */

static void test_concat(struct ops_test *t)
{
    char what[160];
    for (int dim = 0; dim < 4; dim++)
        for (int la = 0; la < LAYOUT_COUNT; la++) {
            int lb = (la + 2) % LAYOUT_COUNT;
            int64_t sb[4] = {7, 5, 3, 2};
            sb[dim] = dim == 3 ? 1 : 4;
            struct lt_tensor *a = input_new(t, LT_TYPE_F32, shape, la, -1, 1);
            struct lt_tensor *b = input_new(t, la == 1 ? LT_TYPE_F16 : LT_TYPE_F32, sb, lb, -1, 1);
            float *av = dense(a), *bv = dense(b);
            int64_t ne[4] = {7, 5, 3, 2};
            ne[dim] += sb[dim];
            float *ref = malloc(sizeof(float) * (size_t)(ne[0] * ne[1] * ne[2] * ne[3]));
            for (int64_t i3 = 0; i3 < ne[3]; i3++)
                for (int64_t i2 = 0; i2 < ne[2]; i2++)
                    for (int64_t i1 = 0; i1 < ne[1]; i1++)
                        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                            int64_t i[4] = {i0, i1, i2, i3};
                            float v;
                            if (i[dim] < shape[dim]) {
                                v = av[flat(shape, i0, i1, i2, i3)];
                            } else {
                                i[dim] -= shape[dim];
                                v = bv[flat(sb, i[0], i[1], i[2], i[3])];
                            }
                            ref[flat(ne, i0, i1, i2, i3)] = v;
                        }
            struct lt_tensor *c = lt_concat(t->ctx, a, b, dim);
            CHECK(c && c->ne[dim] == ne[dim]);
            snprintf(what, sizeof(what), "concat along %d of %s and %s %s", dim, layout_names[la],
                     lt_type_name(b->type), layout_names[lb]);
            check_op(t, c, ref, 0, 0, what);
            free(ref);
            free(av);
            free(bv);
        }
    struct lt_tensor *a = lt_set_name(lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 3, 5, 2), "conv_state");
    struct lt_tensor *b = lt_set_name(lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 4, 6, 2), "qkv");
    check_refused(lt_concat(t->ctx, a, b, 0), "conv_state", "concat differing outside dim");
    check_refused(lt_concat(t->ctx, a, a, 4), "conv_state", "concat along dim 4");
}

/* ---- repeat and repeat_back ---- */

static void test_repeat(struct ops_test *t)
{
    static const int64_t small[][4] = {{7, 5, 3, 2}, {1, 5, 1, 2}, {7, 1, 3, 1}};
    static const int64_t big[][4] = {{14, 10, 3, 4}, {7, 5, 3, 2}, {21, 2, 6, 3}};
    char what[160];
    for (int c = 0; c < 3; c++)
        for (int l = 0; l < LAYOUT_COUNT; l++) {
            const int64_t *s = small[c], *b = big[c];
            int64_t nb = b[0] * b[1] * b[2] * b[3], ns = s[0] * s[1] * s[2] * s[3];
            /* repeat: small (layout l) tiled to big */
            struct lt_tensor *x = input_new(t, c == 2 ? LT_TYPE_BF16 : LT_TYPE_F32, s, l, -2, 2);
            struct lt_tensor *like = lt_new_tensor_4d(t->ctx, LT_TYPE_F32, b[0], b[1], b[2], b[3]);
            float *xv = dense(x);
            float *ref = malloc(sizeof(float) * (size_t)nb);
            for (int64_t i3 = 0; i3 < b[3]; i3++)
                for (int64_t i2 = 0; i2 < b[2]; i2++)
                    for (int64_t i1 = 0; i1 < b[1]; i1++)
                        for (int64_t i0 = 0; i0 < b[0]; i0++)
                            ref[flat(b, i0, i1, i2, i3)] =
                                xv[flat(s, i0 % s[0], i1 % s[1], i2 % s[2], i3 % s[3])];
            snprintf(what, sizeof(what), "repeat of %s [%lld %lld %lld %lld]", layout_names[l],
                     (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
            check_op(t, lt_repeat(t->ctx, x, like), ref, 0, 0, what);
            free(ref);
            free(xv);

            /* repeat_back: big (layout l) summed down to small */
            struct lt_tensor *y = input_new(t, LT_TYPE_F32, b, l, -2, 2);
            struct lt_tensor *shape_of =
                lt_new_tensor_4d(t->ctx, LT_TYPE_F16, s[0], s[1], s[2], s[3]);
            float *yv = dense(y);
            double *acc = calloc((size_t)ns, sizeof(double));
            for (int64_t i3 = 0; i3 < b[3]; i3++)
                for (int64_t i2 = 0; i2 < b[2]; i2++)
                    for (int64_t i1 = 0; i1 < b[1]; i1++)
                        for (int64_t i0 = 0; i0 < b[0]; i0++)
                            acc[flat(s, i0 % s[0], i1 % s[1], i2 % s[2], i3 % s[3])] +=
                                yv[flat(b, i0, i1, i2, i3)];
            float *ref2 = malloc(sizeof(float) * (size_t)ns);
            for (int64_t i = 0; i < ns; i++)
                ref2[i] = (float)acc[i];
            struct lt_tensor *rb = lt_repeat_back(t->ctx, y, shape_of);
            CHECK(rb && rb->type == LT_TYPE_F32 && lt_same_shape(rb, shape_of));
            snprintf(what, sizeof(what), "repeat_back of %s [%lld %lld %lld %lld]", layout_names[l],
                     (long long)b[0], (long long)b[1], (long long)b[2], (long long)b[3]);
            check_op(t, rb, ref2, 1e-6, 1e-6, what);
            free(ref2);
            free(acc);
            free(yv);
        }
    struct lt_tensor *a = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 3, 5), "bias");
    struct lt_tensor *l = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 7, 5), "hidden");
    check_refused(lt_repeat(t->ctx, a, l), "bias", "repeat of 3 over 7");
    check_refused(lt_repeat_back(t->ctx, l, a), "hidden", "repeat_back of 7 onto 3");
}

/* ---- get_rows and get_rows_back ---- */

static struct lt_tensor *ids_new(struct ops_test *t, int64_t k, int64_t ne1, int64_t rows,
                                 bool transposed, const int32_t *fixed)
{
    struct lt_tensor *ids;
    if (transposed)
        ids = lt_transpose(t->ctx, lt_new_tensor_2d(t->ctx, LT_TYPE_I32, ne1, k));
    else
        ids = lt_new_tensor_2d(t->ctx, LT_TYPE_I32, k, ne1);
    for (int64_t j = 0; j < ne1; j++)
        for (int64_t i = 0; i < k; i++) {
            int32_t v =
                fixed ? fixed[j * k + i] : (int32_t)(rnd(t, 0, 1) * (float)rows) % (int32_t)rows;
            *(int32_t *)((char *)ids->data + i * ids->nb[0] + j * ids->nb[1]) = v;
        }
    return ids;
}

static void test_get_rows(struct ops_test *t)
{
    char what[160];
    const int64_t sa[4] = {7, 6, 3, 1};
    for (int l = 0; l < LAYOUT_COUNT; l++)
        for (int ty = 0; ty < 2; ty++) {
            struct lt_tensor *a = input_new(t, ty ? LT_TYPE_F16 : LT_TYPE_F32, sa, l, -5, 5);
            /* four ids per matrix, a repeat among them, ids transposed every other time */
            const int32_t fixed[12] = {5, 0, 5, 2, 1, 1, 3, 4, 0, 2, 5, 5};
            struct lt_tensor *ids = ids_new(t, 4, 3, 6, l % 2, fixed);
            float *av = dense(a);
            float ref[7 * 4 * 3];
            for (int64_t i2 = 0; i2 < 3; i2++)
                for (int64_t i1 = 0; i1 < 4; i1++)
                    for (int64_t i0 = 0; i0 < 7; i0++)
                        ref[(i2 * 4 + i1) * 7 + i0] = av[(i2 * 6 + fixed[i2 * 4 + i1]) * 7 + i0];
            struct lt_tensor *r = lt_get_rows(t->ctx, a, ids);
            CHECK(r && r->ne[0] == 7 && r->ne[1] == 4 && r->ne[2] == 3 && r->type == LT_TYPE_F32);
            snprintf(what, sizeof(what), "get_rows of %s %s, ids %s", lt_type_name(a->type),
                     layout_names[l], l % 2 ? "transposed" : "contiguous");
            check_op(t, r, ref, 0, 0, what);
            free(av);

            /* get_rows_back: grad [7, 4, 3] (layout l) scattered into [7, 6, 3] */
            const int64_t sg[4] = {7, 4, 3, 1};
            struct lt_tensor *grad = input_new(t, LT_TYPE_F32, sg, l, -1, 1);
            struct lt_tensor *like = lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 7, 6, 3);
            float *gv = dense(grad);
            float back[7 * 6 * 3] = {0};
            for (int64_t i2 = 0; i2 < 3; i2++)
                for (int64_t i1 = 0; i1 < 4; i1++)
                    for (int64_t i0 = 0; i0 < 7; i0++)
                        back[(i2 * 6 + fixed[i2 * 4 + i1]) * 7 + i0] += gv[(i2 * 4 + i1) * 7 + i0];
            snprintf(what, sizeof(what), "get_rows_back of %s", layout_names[l]);
            check_op(t, lt_get_rows_back(t->ctx, grad, ids, like), back, 1e-6, 1e-6, what);
            /* in place: the rows added to what a node wrote there (made again each run) */
            struct lt_tensor *base =
                input_new(t, LT_TYPE_F32, (int64_t[]){7, 6, 3, 1}, LAYOUT_CONTIGUOUS, -1, 1);
            struct lt_tensor *into = lt_scale(t->ctx, base, 2.0f);
            float *bv = dense(base);
            for (int i = 0; i < 7 * 6 * 3; i++)
                back[i] += 2.0f * bv[i];
            snprintf(what, sizeof(what), "get_rows_back of %s into a tensor", layout_names[l]);
            struct lt_tensor *r2 = lt_get_rows_back_into(t->ctx, grad, ids, into);
            CHECK(r2 && r2->view_src == into && r2->src[2] == into, "%s: a writer over it", what);
            check_op(t, r2, back, 1e-6, 1e-6, what);
            free(bv);
            free(gv);
        }

    /* 1-d ids into a token-embedding-like [7, 40] table; an out-of-range id gives NaN */
    struct lt_tensor *emb =
        input_new(t, LT_TYPE_F32, (int64_t[]){7, 40, 1, 1}, LAYOUT_SLICED, -1, 1);
    struct lt_tensor *tok = lt_new_tensor_1d(t->ctx, LT_TYPE_I32, 5);
    int32_t tv[5] = {39, 0, 17, 40, 17};
    memcpy(tok->data, tv, sizeof(tv));
    float *ev = dense(emb);
    float ref[35];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 7; j++)
            ref[i * 7 + j] = tv[i] < 40 ? ev[tv[i] * 7 + j] : NAN;
    check_op(t, lt_get_rows(t->ctx, emb, tok), ref, 0, 0, "get_rows with 1-d ids");
    free(ev);

    /* q8_0 rows: each block is an f16 scale d and 32 int8 q, value d * q */
    struct lt_tensor *q = lt_new_tensor_2d(t->ctx, LT_TYPE_Q8_0, 64, 3);
    float qref[3 * 64];
    for (int r = 0; r < 3; r++)
        for (int blk = 0; blk < 2; blk++) {
            unsigned char *p = (unsigned char *)q->data + r * q->nb[1] + blk * 34;
            uint16_t d = lt_fp32_to_fp16(0.25f * (float)(r + 1) + 0.125f * (float)blk);
            memcpy(p, &d, 2);
            for (int i = 0; i < 32; i++) {
                int8_t v = (int8_t)((r * 37 + blk * 11 + i * 5) % 255 - 127);
                p[2 + i] = (unsigned char)v;
                qref[r * 64 + blk * 32 + i] = lt_fp16_to_fp32(d) * (float)v;
            }
        }
    struct lt_tensor *qid = lt_new_tensor_1d(t->ctx, LT_TYPE_I32, 3);
    memcpy(qid->data, (int32_t[]){2, 0, 2}, 12);
    float qsel[3 * 64];
    for (int i = 0; i < 64; i++) {
        qsel[i] = qref[2 * 64 + i];
        qsel[64 + i] = qref[i];
        qsel[128 + i] = qref[2 * 64 + i];
    }
    check_op(t, lt_get_rows(t->ctx, q, qid), qsel, 0, 0, "get_rows of q8_0");

    struct lt_tensor *a = lt_set_name(lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 7, 6, 3), "token_embd");
    struct lt_tensor *bad = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_I32, 4, 2), "inp_tokens");
    check_refused(lt_get_rows(t->ctx, a, bad), "inp_tokens", "get_rows with [4 2] ids on 3 mats");
    struct lt_tensor *fid = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 4, 3), "float_ids");
    check_refused(lt_get_rows(t->ctx, a, fid), "float_ids", "get_rows with f32 ids");
    struct lt_tensor *g = lt_set_name(lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 5, 4, 3), "grad");
    struct lt_tensor *ids = lt_new_tensor_2d(t->ctx, LT_TYPE_I32, 4, 3);
    check_refused(lt_get_rows_back(t->ctx, g, ids, a), "grad", "get_rows_back of 5-wide rows");
    struct lt_tensor *half = lt_set_name(lt_new_tensor_3d(t->ctx, LT_TYPE_F16, 7, 6, 3), "half");
    struct lt_tensor *g7 = lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 7, 4, 3);
    check_refused(lt_get_rows_back_into(t->ctx, g7, ids, half), "half",
                  "get_rows_back into an f16 tensor");
}

/* ---- set_rows ---- */

/* Slices of a [3, 2, 4] source (each layout, F32 or BF16) go into rows {7, 0, 3, out of
 * range} of a [6, 9] destination of each float type that is a slice of a wider tensor;
 * the rows not written keep what they held (check_op fills them with NaN before each
 * run). */
static void test_set_rows(struct ops_test *t)
{
    const enum lt_type dst_types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    const int32_t idv[4] = {7, 0, 3, 9};
    const int64_t sshape[4] = {3, 2, 4, 1};
    char what[160];
    for (int l = 0; l < LAYOUT_COUNT; l++)
        for (int ty = 0; ty < 3; ty++) {
            enum lt_type from = l == LAYOUT_PERMUTED ? LT_TYPE_BF16 : LT_TYPE_F32;
            struct lt_tensor *src = input_new(t, from, sshape, l, -3, 3);
            struct lt_tensor *wide = lt_new_tensor_2d(t->ctx, dst_types[ty], 8, 9);
            struct lt_tensor *dst = lt_view_2d(t->ctx, wide, 6, 9, wide->nb[1], wide->nb[0]);
            struct lt_tensor *ids = lt_new_tensor_1d(t->ctx, LT_TYPE_I32, 4);
            memcpy(ids->data, idv, sizeof(idv));
            float *sv = dense(src), ref[54];
            for (int i = 0; i < 54; i++)
                ref[i] = NAN;
            for (int r = 0; r < 3; r++)
                for (int i = 0; i < 6; i++)
                    ref[idv[r] * 6 + i] = round_to(dst_types[ty], sv[r * 6 + i]);
            struct lt_tensor *w = lt_set_rows(t->ctx, src, dst, ids);
            snprintf(what, sizeof(what), "set_rows of %s %s into a %s slice", lt_type_name(from),
                     layout_names[l], lt_type_name(dst_types[ty]));
            CHECK(w && w->op == LT_OP_SET_ROWS && w->view_src == wide && w->data == dst->data &&
                      w->type == dst_types[ty],
                  "%s: the result is a view of dst", what);
            check_op(t, w, ref, 0, 0, what);
            free(sv);
        }
    struct lt_tensor *src = lt_set_name(lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 5, 1, 2), "k_new");
    struct lt_tensor *dst = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 6, 9), "cache");
    struct lt_tensor *ids = lt_new_tensor_1d(t->ctx, LT_TYPE_I32, 2);
    check_refused(lt_set_rows(t->ctx, src, dst, ids), "k_new", "set_rows of rows too short");
    struct lt_tensor *q = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_Q8_0, 32, 9), "q_cache");
    check_refused(lt_set_rows(t->ctx, lt_new_tensor_3d(t->ctx, LT_TYPE_F32, 32, 1, 2), q, ids),
                  "q_cache", "set_rows into a quantised destination");
}

/* ---- acc ---- */

static void test_acc(struct ops_test *t)
{
    char what[160];
    /* b [3, 2, 3, 1] into a [7, 5, 3, 2] at (i0 = 2, i1 = 1, i2 = 0, i3 = 1) */
    const int64_t sb[4] = {3, 2, 3, 1};
    const size_t nb1 = 7 * 4, nb2 = 35 * 4, nb3 = 105 * 4;
    const size_t offset = (2 + 7 * 1 + 105 * 1) * 4;
    for (int la = 0; la < LAYOUT_COUNT; la++) {
        int lb = (la + 1) % LAYOUT_COUNT;
        struct lt_tensor *a = input_new(t, LT_TYPE_F32, shape, la, -1, 1);
        struct lt_tensor *b = input_new(t, LT_TYPE_F32, sb, lb, -1, 1);
        float *av = dense(a), *bv = dense(b);
        float ref[210];
        memcpy(ref, av, sizeof(ref));
        for (int64_t i2 = 0; i2 < 3; i2++)
            for (int64_t i1 = 0; i1 < 2; i1++)
                for (int64_t i0 = 0; i0 < 3; i0++)
                    ref[flat(shape, 2 + i0, 1 + i1, i2, 1)] += bv[flat(sb, i0, i1, i2, 0)];
        snprintf(what, sizeof(what), "acc of %s into %s", layout_names[lb], layout_names[la]);
        check_op(t, lt_acc(t->ctx, a, b, nb1, nb2, nb3, offset), ref, 1e-6, 1e-6, what);
        free(av);
        free(bv);
    }
    /* rows whose windows overlap (nb1 = 4: each row starts one element on) add up */
    struct lt_tensor *a =
        input_new(t, LT_TYPE_F32, (int64_t[]){10, 1, 1, 1}, LAYOUT_CONTIGUOUS, 0, 1);
    struct lt_tensor *b =
        input_new(t, LT_TYPE_F32, (int64_t[]){4, 6, 1, 1}, LAYOUT_TRANSPOSED, 0, 1);
    float *av = dense(a), *bv = dense(b);
    float ref[10];
    memcpy(ref, av, sizeof(ref));
    for (int r = 0; r < 6; r++)
        for (int i = 0; i < 4; i++)
            ref[r + i] += bv[r * 4 + i];
    check_op(t, lt_acc(t->ctx, a, b, 4, 24, 24, 0), ref, 1e-6, 1e-6, "acc of overlapping rows");
    free(av);
    free(bv);

    struct lt_tensor *big = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 12, 4), "qkv_grad");
    struct lt_tensor *part = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 4, 4), "k_grad");
    struct lt_tensor *ok = lt_acc(t->ctx, big, part, 48, 192, 192, 32);
    CHECK(ok != NULL, "acc of the last 4 columns: %s", lt_last_error());
    check_refused(lt_acc(t->ctx, big, part, 48, 192, 192, 36), "k_grad", "acc past the end");
    check_refused(lt_acc(t->ctx, big, part, 46, 192, 192, 0), "k_grad", "acc with a half stride");
}

int main(void)
{
    struct ops_test t;
    ops_test_init(&t);
    test_cont(&t);
    test_cpy(&t);
    test_concat(&t);
    test_repeat(&t);
    test_get_rows(&t);
    test_set_rows(&t);
    test_acc(&t);
    ops_test_free(&t);
    return check_summary();
}
