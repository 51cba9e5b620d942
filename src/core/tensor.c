/* tensor.c: contexts (arenas), tensor headers, views and element access.
 *
 * An arena hands out 64-byte-aligned pieces from a list of chunks and frees them all at
 * once. A context made with no_alloc holds headers only; an allocator places their data
 * later (src/backend/alloc.c). Views never own storage: their data is view_src's data plus
 * view_offs, and is filled in when view_src's is. */
#include <assert.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor_access.h"
#include "lathe/tensor.h"

#define ARENA_ALIGN 64

/* A chunk comes zeroed from calloc and its memory is never handed out twice, so pieces are
 * zero without a memset: the pages of a large chunk stay untouched (out of the process's
 * resident memory) until a piece on them is written. A graph's node and hash arrays are
 * sized for the largest graph and mostly never written. */
struct arena_chunk {
    struct arena_chunk *next;
    void *raw; /* what calloc returned; the chunk is placed at its first aligned byte */
    size_t size, used;
    _Alignas(ARENA_ALIGN) unsigned char mem[];
};

struct lt_ctx {
    struct arena_chunk *chunks;
    size_t chunk_size;
    size_t used;
    bool no_alloc;
};

struct lt_ctx *lt_ctx_init(struct lt_ctx_params params)
{
    struct lt_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        lt_fail(LT_ERR_NOMEM, "cannot allocate a tensor context");
        return NULL;
    }
    ctx->chunk_size = params.mem_size ? params.mem_size : (1u << 20);
    ctx->no_alloc = params.no_alloc;
    return ctx;
}

void lt_ctx_free(struct lt_ctx *ctx)
{
    if (!ctx)
        return;
    struct arena_chunk *c = ctx->chunks;
    while (c) {
        struct arena_chunk *next = c->next;
        free(c->raw);
        c = next;
    }
    free(ctx);
}

size_t lt_ctx_used(const struct lt_ctx *ctx) { return ctx->used; }
bool lt_ctx_no_alloc(const struct lt_ctx *ctx) { return ctx->no_alloc; }

void *lt_ctx_alloc(struct lt_ctx *ctx, size_t size)
{
    size = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    struct arena_chunk *c = ctx->chunks;
    if (!c || c->size - c->used < size) {
        size_t csize = size > ctx->chunk_size ? size : ctx->chunk_size;
        void *raw = calloc(1, sizeof(*c) + csize + ARENA_ALIGN);
        if (!raw) {
            lt_fail(LT_ERR_NOMEM, "out of host memory allocating %zu bytes", size);
            return NULL;
        }
        uintptr_t at = ((uintptr_t)raw + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1);
        c = (struct arena_chunk *)at;
        c->raw = raw;
        c->size = csize;
        c->used = 0;
        c->next = ctx->chunks;
        ctx->chunks = c;
    }
    void *p = c->mem + c->used;
    c->used += size;
    ctx->used += size;
    return p; /* zero: see struct arena_chunk */
}

static void set_contiguous_strides(struct lt_tensor *t)
{
    const struct lt_type_traits *tt = lt_type_traits(t->type);
    t->nb[0] = tt->type_size;
    t->nb[1] = t->nb[0] * (size_t)(t->ne[0] / tt->block_size);
    for (int i = 2; i < LT_MAX_DIMS; i++)
        t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
}

static struct lt_tensor *new_header(struct lt_ctx *ctx, enum lt_type type, int n_dims,
                                    const int64_t *ne)
{
    const struct lt_type_traits *tt = lt_type_traits(type);
    if (!tt) {
        lt_fail(LT_ERR_INVALID, "unknown tensor type %d", (int)type);
        return NULL;
    }
    if (n_dims < 1 || n_dims > LT_MAX_DIMS) {
        lt_fail(LT_ERR_INVALID, "a tensor has 1 to %d dimensions, not %d", LT_MAX_DIMS, n_dims);
        return NULL;
    }
    struct lt_tensor *t = lt_ctx_alloc(ctx, sizeof(*t));
    if (!t)
        return NULL;
    t->type = type;
    for (int i = 0; i < LT_MAX_DIMS; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        if (t->ne[i] < 0) {
            lt_fail(LT_ERR_INVALID, "negative dimension %lld", (long long)t->ne[i]);
            return NULL;
        }
    }
    if (t->ne[0] % tt->block_size != 0) {
        lt_fail(LT_ERR_INVALID, "%s rows of %lld elements are not whole blocks of %lld",
                tt->name, (long long)t->ne[0], (long long)tt->block_size);
        return NULL;
    }
    set_contiguous_strides(t);
    return t;
}

static bool alloc_data(struct lt_ctx *ctx, struct lt_tensor *t)
{
    if (ctx->no_alloc)
        return true;
    t->data = lt_ctx_alloc(ctx, lt_nbytes(t));
    return t->data != NULL;
}

struct lt_tensor *lt_new_tensor(struct lt_ctx *ctx, enum lt_type type, int n_dims,
                                const int64_t *ne)
{
    struct lt_tensor *t = new_header(ctx, type, n_dims, ne);
    if (!t || !alloc_data(ctx, t))
        return NULL;
    return t;
}

struct lt_tensor *lt_new_tensor_1d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0)
{
    return lt_new_tensor(ctx, type, 1, (int64_t[]){ne0});
}

struct lt_tensor *lt_new_tensor_2d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0, int64_t ne1)
{
    return lt_new_tensor(ctx, type, 2, (int64_t[]){ne0, ne1});
}

struct lt_tensor *lt_new_tensor_3d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0,
                                   int64_t ne1, int64_t ne2)
{
    return lt_new_tensor(ctx, type, 3, (int64_t[]){ne0, ne1, ne2});
}

struct lt_tensor *lt_new_tensor_4d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0,
                                   int64_t ne1, int64_t ne2, int64_t ne3)
{
    return lt_new_tensor(ctx, type, 4, (int64_t[]){ne0, ne1, ne2, ne3});
}

struct lt_tensor *lt_dup_tensor(struct lt_ctx *ctx, const struct lt_tensor *a)
{
    LT_REQUIRE("dup_tensor", a);
    return lt_new_tensor(ctx, a->type, LT_MAX_DIMS, a->ne);
}

struct lt_tensor *lt_new_op_tensor(struct lt_ctx *ctx, enum lt_op op, enum lt_type type,
                                   int n_dims, const int64_t *ne, struct lt_tensor *const *srcs,
                                   int n_srcs)
{
    assert(n_srcs <= LT_MAX_SRC);
    struct lt_tensor *t = lt_new_tensor(ctx, type, n_dims, ne);
    if (!t)
        return NULL;
    t->op = op;
    for (int i = 0; i < n_srcs; i++)
        t->src[i] = srcs[i];
    return t;
}

/* ---- views ---- */

bool lt_sources_present(const char *what, const char *names, const struct lt_tensor *const *srcs,
                        int n)
{
    for (int i = 0; i < n; i++) {
        if (srcs[i])
            continue;
        /* the i-th name of "a, b, c" */
        const char *name = names;
        for (int k = 0; k < i && name; k++) {
            name = strchr(name, ',');
            name = name ? name + 1 : NULL;
        }
        name = name ? name + strspn(name, " ") : "?";
        int len = (int)strcspn(name, ",");
        char prev[400];
        snprintf(prev, sizeof(prev), "%s", lt_last_error());
        lt_fail(LT_ERR_INVALID, "%s: its source '%.*s' is missing%s%s", what, len, name,
                prev[0] ? ": " : " (a NULL tensor)", prev);
        return false;
    }
    return true;
}

static struct lt_tensor *new_view_as(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *a,
                                     enum lt_type type, int n_dims, const int64_t *ne,
                                     const size_t *nb, size_t offset)
{
    struct lt_tensor *t = new_header(ctx, type, n_dims, ne);
    if (!t)
        return NULL;
    for (int i = 0; i < LT_MAX_DIMS; i++)
        if (nb)
            t->nb[i] = nb[i];
    t->op = op;
    t->src[0] = a;
    struct lt_tensor *root = a->view_src ? a->view_src : a;
    t->view_src = root;
    t->view_offs = (a->view_src ? a->view_offs : 0) + offset;
    t->buffer = root->buffer;
    if (root->data)
        t->data = (char *)root->data + t->view_offs;
    /* the view must lie inside its storage */
    if (t->view_offs + lt_nbytes(t) > lt_nbytes(root) && lt_nelements(t) > 0) {
        lt_fail(LT_ERR_INVALID,
                "view of '%s' at offset %zu spanning %zu bytes exceeds its %zu bytes", a->name,
                t->view_offs, lt_nbytes(t), lt_nbytes(root));
        return NULL;
    }
    lt_format_name(t, "%s (view)", a->name);
    return t;
}

static struct lt_tensor *new_view(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *a,
                                  int n_dims, const int64_t *ne, const size_t *nb, size_t offset)
{
    return new_view_as(ctx, op, a, a->type, n_dims, ne, nb, offset);
}

struct lt_tensor *lt_view_1d_as(struct lt_ctx *ctx, struct lt_tensor *a, enum lt_type type,
                                int64_t ne0, size_t offset)
{
    LT_REQUIRE("view_1d_as", a);
    const struct lt_type_traits *tt = lt_type_traits(type);
    if (tt->is_quantized || lt_type_traits(a->type)->is_quantized || offset % tt->type_size != 0) {
        lt_fail(LT_ERR_INVALID,
                "view of '%s' (%s) as %s at offset %zu: both types must be unblocked and the "
                "offset a multiple of the element",
                a->name, lt_type_name(a->type), lt_type_name(type), offset);
        return NULL;
    }
    return new_view_as(ctx, LT_OP_VIEW, a, type, 1, (int64_t[]){ne0}, NULL, offset);
}

struct lt_tensor *lt_view_1d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, size_t offset)
{
    LT_REQUIRE("view_1d", a);
    return new_view(ctx, LT_OP_VIEW, a, 1, (int64_t[]){ne0}, NULL, offset);
}

struct lt_tensor *lt_view_2d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                             size_t nb1, size_t offset)
{
    LT_REQUIRE("view_2d", a);
    size_t nb[4] = {a->nb[0], nb1, nb1 * (size_t)ne1, nb1 * (size_t)ne1};
    return new_view(ctx, LT_OP_VIEW, a, 2, (int64_t[]){ne0, ne1}, nb, offset);
}

struct lt_tensor *lt_view_3d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, size_t nb1, size_t nb2, size_t offset)
{
    LT_REQUIRE("view_3d", a);
    size_t nb[4] = {a->nb[0], nb1, nb2, nb2 * (size_t)ne2};
    return new_view(ctx, LT_OP_VIEW, a, 3, (int64_t[]){ne0, ne1, ne2}, nb, offset);
}

struct lt_tensor *lt_view_4d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3,
                             size_t offset)
{
    LT_REQUIRE("view_4d", a);
    size_t nb[4] = {a->nb[0], nb1, nb2, nb3};
    return new_view(ctx, LT_OP_VIEW, a, 4, (int64_t[]){ne0, ne1, ne2, ne3}, nb, offset);
}

static struct lt_tensor *reshape(struct lt_ctx *ctx, struct lt_tensor *a, int n_dims,
                                 const int64_t *ne)
{
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++)
        n *= ne[i];
    if (!lt_is_contiguous(a)) {
        lt_fail(LT_ERR_INVALID, "reshape of '%s', which is %s (cont it first)", a->name,
                lt_layout_name(a));
        return NULL;
    }
    if (n != lt_nelements(a)) {
        lt_fail(LT_ERR_INVALID, "reshape of '%s' from %lld to %lld elements", a->name,
                (long long)lt_nelements(a), (long long)n);
        return NULL;
    }
    return new_view(ctx, LT_OP_RESHAPE, a, n_dims, ne, NULL, 0);
}

struct lt_tensor *lt_reshape_2d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1)
{
    LT_REQUIRE("reshape_2d", a);
    return reshape(ctx, a, 2, (int64_t[]){ne0, ne1});
}

struct lt_tensor *lt_reshape_3d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2)
{
    LT_REQUIRE("reshape_3d", a);
    return reshape(ctx, a, 3, (int64_t[]){ne0, ne1, ne2});
}

struct lt_tensor *lt_reshape_4d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2, int64_t ne3)
{
    LT_REQUIRE("reshape_4d", a);
    return reshape(ctx, a, 4, (int64_t[]){ne0, ne1, ne2, ne3});
}

struct lt_tensor *lt_permute(struct lt_ctx *ctx, struct lt_tensor *a, int ax0, int ax1, int ax2,
                             int ax3)
{
    LT_REQUIRE("permute", a);
    int ax[4] = {ax0, ax1, ax2, ax3};
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        if (ax[i] < 0 || ax[i] > 3 || (seen & (1 << ax[i]))) {
            lt_fail(LT_ERR_INVALID, "permute of '%s' with axes (%d %d %d %d)", a->name, ax0, ax1,
                    ax2, ax3);
            return NULL;
        }
        seen |= 1 << ax[i];
    }
    if (lt_type_traits(a->type)->is_quantized) {
        lt_fail(LT_ERR_INVALID, "permute of quantised '%s'", a->name);
        return NULL;
    }
    int64_t ne[4];
    size_t nb[4];
    for (int i = 0; i < 4; i++) {
        ne[ax[i]] = a->ne[i];
        nb[ax[i]] = a->nb[i];
    }
    struct lt_tensor *t = new_view(ctx, LT_OP_PERMUTE, a, 4, ne, nb, 0);
    if (t)
        for (int i = 0; i < 4; i++)
            t->op_params[i] = ax[i];
    return t;
}

struct lt_tensor *lt_transpose(struct lt_ctx *ctx, struct lt_tensor *a)
{
    LT_REQUIRE("transpose", a);
    struct lt_tensor *t = lt_permute(ctx, a, 1, 0, 2, 3);
    if (t)
        t->op = LT_OP_TRANSPOSE;
    return t;
}

/* ---- inspection ---- */

int64_t lt_nelements(const struct lt_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

int64_t lt_nrows(const struct lt_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t lt_nbytes(const struct lt_tensor *t)
{
    for (int i = 0; i < LT_MAX_DIMS; i++)
        if (t->ne[i] == 0)
            return 0;
    const struct lt_type_traits *tt = lt_type_traits(t->type);
    size_t n = lt_row_size(t->type, t->ne[0]);
    if (tt->block_size == 1) {
        n = tt->type_size;
        for (int i = 0; i < LT_MAX_DIMS; i++)
            n += (size_t)(t->ne[i] - 1) * t->nb[i];
        return n;
    }
    for (int i = 1; i < LT_MAX_DIMS; i++)
        n += (size_t)(t->ne[i] - 1) * t->nb[i];
    return n;
}

int lt_n_dims(const struct lt_tensor *t)
{
    for (int i = LT_MAX_DIMS - 1; i >= 1; i--)
        if (t->ne[i] > 1)
            return i + 1;
    return 1;
}

bool lt_shares_memory(const struct lt_tensor *t)
{
    /* its dims of more than one element, by stride, each stride at least the span of the
     * dims under it */
    int order[LT_MAX_DIMS], n = 0;
    for (int i = 0; i < LT_MAX_DIMS; i++)
        if (t->ne[i] > 1) {
            int j = n++;
            while (j > 0 && t->nb[order[j - 1]] > t->nb[i]) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = i;
        }
    size_t span = lt_type_traits(t->type)->type_size;
    for (int k = 0; k < n; k++) {
        if (t->nb[order[k]] < span)
            return true;
        span = t->nb[order[k]] * (size_t)t->ne[order[k]];
    }
    return false;
}

bool lt_is_contiguous(const struct lt_tensor *t)
{
    const struct lt_type_traits *tt = lt_type_traits(t->type);
    size_t expect = tt->type_size;
    if (t->ne[0] != tt->block_size && t->nb[0] != expect)
        return false;
    expect = lt_row_size(t->type, t->ne[0]);
    for (int i = 1; i < LT_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expect)
            return false;
        expect *= (size_t)t->ne[i];
    }
    return true;
}

bool lt_is_view(const struct lt_tensor *t) { return t->view_src != NULL; }

bool lt_same_shape(const struct lt_tensor *a, const struct lt_tensor *b)
{
    for (int i = 0; i < LT_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i])
            return false;
    return true;
}

bool lt_can_repeat(const struct lt_tensor *b, const struct lt_tensor *a)
{
    for (int i = 0; i < LT_MAX_DIMS; i++)
        if (b->ne[i] == 0 || a->ne[i] % b->ne[i] != 0)
            return false;
    return true;
}

const char *lt_layout_name(const struct lt_tensor *t)
{
    if (lt_is_contiguous(t))
        return t->view_src ? "a contiguous view" : "contiguous";
    if (t->op == LT_OP_TRANSPOSE || (t->nb[0] > t->nb[1] && t->ne[1] > 1))
        return "a transposed view";
    if (t->op == LT_OP_PERMUTE)
        return "a permuted view";
    for (int i = 0; i < LT_MAX_DIMS; i++)
        if (t->nb[i] == 0 && t->ne[i] > 1)
            return "a broadcast view";
    return "a non-contiguous view";
}

struct lt_tensor *lt_storage_root(struct lt_tensor *t) { return t->view_src ? t->view_src : t; }

struct lt_tensor *lt_set_name(struct lt_tensor *t, const char *name)
{
    snprintf(t->name, sizeof(t->name), "%s", name);
    return t;
}

struct lt_tensor *lt_format_name(struct lt_tensor *t, const char *fmt, ...)
{
    char buf[LT_MAX_NAME];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    memcpy(t->name, buf, sizeof(buf));
    return t;
}

void lt_set_param_f32(struct lt_tensor *t, int i, float v) { memcpy(&t->op_params[i], &v, 4); }

float lt_get_param_f32(const struct lt_tensor *t, int i)
{
    float v;
    memcpy(&v, &t->op_params[i], 4);
    return v;
}

/* ---- element access ---- */

float lt_get_f32_nd(const struct lt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    const void *p = lt_elem_ptr(t, i0, i1, i2, i3);
    switch (t->type) {
    case LT_TYPE_F32: return *(const float *)p;
    case LT_TYPE_F16: return lt_fp16_to_fp32(*(const uint16_t *)p);
    case LT_TYPE_BF16: return lt_bf16_to_fp32(*(const uint16_t *)p);
    case LT_TYPE_I32: return (float)*(const int32_t *)p;
    default: assert(!"lt_get_f32_nd: type without element access"); return 0;
    }
}

void lt_set_f32_nd(struct lt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v)
{
    void *p = lt_elem_ptr(t, i0, i1, i2, i3);
    switch (t->type) {
    case LT_TYPE_F32: *(float *)p = v; break;
    case LT_TYPE_F16: *(uint16_t *)p = lt_fp32_to_fp16(v); break;
    case LT_TYPE_BF16: *(uint16_t *)p = lt_fp32_to_bf16(v); break;
    case LT_TYPE_I32: *(int32_t *)p = (int32_t)v; break;
    default: assert(!"lt_set_f32_nd: type without element access");
    }
}

void lt_tensor_fill_f32(struct lt_tensor *t, const float *values)
{
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                    lt_set_f32_nd(t, i0, i1, i2, i3, values[k++]);
}

void lt_tensor_read_f32(const struct lt_tensor *t, float *out)
{
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++, k += t->ne[0])
                lt_row_to_f32(t, i1, i2, i3, out + k);
}

void lt_row_to_f32(const struct lt_tensor *t, int64_t i1, int64_t i2, int64_t i3, float *out)
{
    const struct lt_type_traits *tt = lt_type_traits(t->type);
    const char *row = (const char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
    if (tt->is_quantized || t->nb[0] == tt->type_size) {
        tt->to_float(row, out, t->ne[0]);
        return;
    }
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
        tt->to_float(row + i0 * t->nb[0], out + i0, 1);
}

void lt_row_from_f32(struct lt_tensor *t, int64_t i1, int64_t i2, int64_t i3, const float *in)
{
    const struct lt_type_traits *tt = lt_type_traits(t->type);
    char *row = (char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
    assert(tt->from_float);
    if (tt->is_quantized || t->nb[0] == tt->type_size) {
        tt->from_float(in, row, t->ne[0]);
        return;
    }
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
        tt->from_float(in + i0, row + i0 * t->nb[0], 1);
}

bool lt_op_is_view(enum lt_op op)
{
    return op == LT_OP_NONE || op == LT_OP_VIEW || op == LT_OP_RESHAPE || op == LT_OP_PERMUTE ||
           op == LT_OP_TRANSPOSE;
}
