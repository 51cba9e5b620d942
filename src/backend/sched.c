/* sched.c: placement, memory planning and execution of a graph over prioritised backends.
 *
 * The plan is computed twice with the same code: once to measure (no allocation) and
 * once to allocate, so the estimate that admission checks is exactly what allocation
 * takes. Storage is reused by liveness: a result dies after the last node that reads it
 * or any view of it; results flagged OUTPUT or LOSS live to the end of the graph. */
#include <stdlib.h>
#include <string.h>

#include "core/ptrmap.h"
#include "lathe/refusal.h"
#include "lathe/sched.h"
#include "ops/op.h"

#define SCHED_ALIGN 256

struct sched_copy {
    struct lt_tensor *node;  /* the reader */
    int node_index;          /* its position in the graph */
    int slot;                /* which of its sources */
    struct lt_tensor *orig;  /* the source as the graph made it */
    struct lt_tensor *root;  /* orig's storage */
    struct lt_tensor *local; /* a copy of root on the reader's backend */
    bool written;            /* the reader writes this source in place: copy it back after */
    void *node_data;         /* the reader's own data pointer before it was moved onto */
    struct lt_buffer *node_buffer; /* the copy (in-place writers are views of their target) */
};

struct lt_sched {
    struct lt_backend *be[LT_SCHED_MAX_BACKENDS];
    int n_be;
    struct lt_graph *g;
    int *node_be;
    int counts[LT_SCHED_MAX_BACKENDS];
    struct lt_tensor **fallback;
    int n_fallback;
    struct lt_buffer **bufs; /* copies' buffers, remade by each alloc */
    int n_bufs, cap_bufs;
    /* compute (0) and leaf (1) buffers per backend, kept across allocs and grown on demand,
     * so a graph rebuilt per token (decode) does not allocate per token */
    struct lt_buffer *kept[2][LT_SCHED_MAX_BACKENDS];
    size_t allocated;
    struct sched_copy *copies;
    int n_copies;
    struct lt_ctx *ctx; /* headers of copies */
};

/* CPY writes into existing storage: the node is a view of its destination. */
static bool writes_in_place(const struct lt_tensor *t) { return t->view_src != NULL && !lt_op_is_view(t->op); }

struct lt_sched *lt_sched_new(struct lt_backend *const *backends, int n_backends)
{
    if (n_backends < 1 || n_backends > LT_SCHED_MAX_BACKENDS) {
        lt_fail(LT_ERR_INVALID, "a scheduler takes 1 to %d backends", LT_SCHED_MAX_BACKENDS);
        return NULL;
    }
    struct lt_sched *s = calloc(1, sizeof(*s));
    if (!s) {
        lt_fail(LT_ERR_NOMEM, "out of memory for a scheduler");
        return NULL;
    }
    for (int i = 0; i < n_backends; i++)
        s->be[i] = backends[i];
    s->n_be = n_backends;
    return s;
}

static void drop_copies(struct lt_sched *s)
{
    for (int i = 0; i < s->n_bufs; i++) {
        s->allocated -= s->bufs[i]->size;
        lt_buffer_free(s->bufs[i]);
    }
    s->n_bufs = 0;
    /* undo source redirections so the graph reads its own tensors again (in reverse, so a
     * node moved onto a copy twice ends with its first pointer) */
    for (int i = s->n_copies - 1; i >= 0; i--) {
        struct sched_copy *cp = &s->copies[i];
        cp->node->src[cp->slot] = cp->orig;
        if (cp->node->view_src == cp->root) {
            cp->node->data = cp->node_data;
            cp->node->buffer = cp->node_buffer;
        }
    }
    free(s->copies);
    s->copies = NULL;
    s->n_copies = 0;
    lt_ctx_free(s->ctx);
    s->ctx = NULL;
}

void lt_sched_reset(struct lt_sched *s)
{
    drop_copies(s);
    s->g = NULL;
}

void lt_sched_release(struct lt_sched *s)
{
    drop_copies(s);
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < LT_SCHED_MAX_BACKENDS; b++) {
            lt_buffer_free(s->kept[k][b]);
            s->kept[k][b] = NULL;
        }
    s->allocated = 0;
}

void lt_sched_free(struct lt_sched *s)
{
    if (!s)
        return;
    lt_sched_release(s);
    free(s->bufs);
    free(s->node_be);
    free(s->fallback);
    free(s);
}

/* Can a node on backend `be` read storage held by backend `sb` (-1: plain host memory)? */
#define STORAGE_HOST (-1)    /* plain host memory, or a host backend's buffer */
#define STORAGE_FOREIGN (-3) /* device memory of a backend this scheduler does not hold */

static bool can_read(const struct lt_sched *s, int sb, int be)
{
    if (sb == be)
        return true;
    if (sb == STORAGE_FOREIGN)
        return false;
    bool host_storage = sb < 0 || s->be[sb]->is_host;
    return host_storage && s->be[be]->is_host;
}

/* The backend of this scheduler that holds t's storage, STORAGE_HOST for host memory, or
 * STORAGE_FOREIGN for another backend's device memory (readable only through a copy). */
static int storage_backend(const struct lt_sched *s, const struct lt_tensor *t)
{
    const struct lt_tensor *r = t->view_src ? t->view_src : t;
    if (!r->buffer)
        return STORAGE_HOST;
    for (int i = 0; i < s->n_be; i++)
        if (r->buffer->backend == s->be[i])
            return i;
    return r->buffer->backend->is_host ? STORAGE_HOST : STORAGE_FOREIGN;
}

lt_status lt_sched_place(struct lt_sched *s, struct lt_graph *g, bool device_only,
                         struct lt_refusal *refusal)
{
    free(s->node_be);
    free(s->fallback);
    s->node_be = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    s->fallback = malloc(sizeof(*s->fallback) * (size_t)(g->n_nodes + 1));
    s->n_fallback = 0;
    memset(s->counts, 0, sizeof(s->counts));
    s->g = g;
    if (!s->node_be || !s->fallback)
        return lt_fail(LT_ERR_NOMEM, "out of memory placing a graph");
    char reason[LT_REASON_MAX], first_reason[LT_REASON_MAX];
    for (int i = 0; i < g->n_nodes; i++) {
        struct lt_tensor *node = g->nodes[i];
        s->node_be[i] = -1;
        if (lt_op_is_view(node->op))
            continue;
        int chosen = -1;
        first_reason[0] = '\0';
        for (int b = 0; b < s->n_be && chosen < 0; b++) {
            reason[0] = '\0';
            if (lt_backend_supports_op(s->be[b], node, reason, sizeof(reason)))
                chosen = b;
            if (chosen < 0 && b == 0)
                memcpy(first_reason, reason, sizeof(reason));
        }
        if (chosen < 0) {
            if (refusal)
                lt_refusal_set_node(refusal, LT_REFUSAL_NO_BACKEND, node, s->be[0]->name,
                                    first_reason);
            return lt_fail(LT_ERR_UNSUPPORTED, "no backend can run %s '%s' (%s: %s)",
                           lt_op_name(node->op), node->name, s->be[0]->name, first_reason);
        }
        if (chosen > 0 && device_only) {
            if (refusal)
                lt_refusal_set_node(refusal, LT_REFUSAL_DEVICE_ONLY, node, s->be[0]->name,
                                    first_reason);
            return lt_fail(LT_ERR_UNSUPPORTED, "%s cannot run %s '%s' (%s) and device_only is set",
                           s->be[0]->name, lt_op_name(node->op), node->name, first_reason);
        }
        if (chosen > 0)
            s->fallback[s->n_fallback++] = node;
        s->node_be[i] = chosen;
        s->counts[chosen]++;
    }
    return LT_OK;
}

int lt_sched_node_backend(const struct lt_sched *s, int i) { return s->node_be[i]; }
int lt_sched_count(const struct lt_sched *s, int b) { return s->counts[b]; }
int lt_sched_n_fallback(const struct lt_sched *s) { return s->n_fallback; }
struct lt_tensor *lt_sched_fallback_node(const struct lt_sched *s, int i) { return s->fallback[i]; }

void lt_sched_print(const struct lt_sched *s, FILE *f)
{
    fprintf(f, "placement:");
    for (int b = 0; b < s->n_be; b++)
        fprintf(f, "%s %s: %d nodes", b ? "," : "", s->be[b]->name, s->counts[b]);
    fprintf(f, "\n");
    if (s->n_fallback == 0)
        return;
    fprintf(f, "fallback (%d nodes not on %s):\n", s->n_fallback, s->be[0]->name);
    for (int i = 0; i < s->n_fallback; i++) {
        const struct lt_tensor *n = s->fallback[i];
        char reason[LT_REASON_MAX] = "";
        lt_backend_supports_op(s->be[0], n, reason, sizeof(reason));
        fprintf(f, "  %s '%s': %s\n", lt_op_name(n->op), n->name, reason);
    }
}

/* ---- memory planning ---- */

struct block {
    size_t offset, size;
};

struct arena_plan {
    struct block *live;
    int n_live, cap;
    size_t peak;
};

static size_t align_up(size_t n) { return (n + SCHED_ALIGN - 1) & ~(size_t)(SCHED_ALIGN - 1); }

/* First fit among the gaps between live blocks (kept sorted by offset). */
static bool plan_take(struct arena_plan *a, size_t size, size_t *offset)
{
    size_t at = 0;
    int pos = 0;
    for (; pos < a->n_live; pos++) {
        if (a->live[pos].offset - at >= size)
            break;
        at = a->live[pos].offset + a->live[pos].size;
    }
    if (a->n_live == a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        struct block *nb = realloc(a->live, sizeof(*nb) * (size_t)cap);
        if (!nb)
            return false;
        a->live = nb;
        a->cap = cap;
    }
    memmove(&a->live[pos + 1], &a->live[pos], sizeof(*a->live) * (size_t)(a->n_live - pos));
    a->live[pos] = (struct block){at, size};
    a->n_live++;
    if (at + size > a->peak)
        a->peak = at + size;
    *offset = at;
    return true;
}

static void plan_give(struct arena_plan *a, size_t offset)
{
    for (int i = 0; i < a->n_live; i++)
        if (a->live[i].offset == offset) {
            memmove(&a->live[i], &a->live[i + 1], sizeof(*a->live) * (size_t)(a->n_live - i - 1));
            a->n_live--;
            return;
        }
}

struct plan {
    size_t *offset;    /* per node: offset in its backend's compute buffer; SIZE_MAX: none */
    size_t compute[LT_SCHED_MAX_BACKENDS];
    int *leaf_be;      /* per leaf: backend to allocate it on, -1: has storage */
    size_t leafs[LT_SCHED_MAX_BACKENDS];
    size_t copies[LT_SCHED_MAX_BACKENDS]; /* storage copied in for readers on another backend */
};

static void plan_free(struct plan *p)
{
    free(p->offset);
    free(p->leaf_be);
}

/* Where a storage root will live once allocated: its buffer's backend, the backend of the
 * node that computes it, or the one planned for a leaf; -1 for plain host memory. */
static int planned_backend(const struct lt_sched *s, const struct lt_graph *g,
                           const struct plan *p, const struct lt_ptrmap *index,
                           const struct lt_tensor *root)
{
    if (root->buffer || root->data)
        return storage_backend(s, root);
    int i = lt_ptrmap_get(index, root, -1);
    if (i >= 0)
        return s->node_be[i];
    for (int l = 0; l < g->n_leafs; l++)
        if (g->leafs[l] == root)
            return p->leaf_be[l];
    return -1;
}

/* Bytes of the copies readers on other backends need, one per (storage, backend). */
static lt_status plan_copy_bytes(struct lt_sched *s, struct lt_graph *g, struct plan *p)
{
    struct lt_ptrmap index = {0}, copied = {0};
    size_t keys = (size_t)(g->n_nodes + g->n_leafs) + 16;
    if (!lt_ptrmap_init(&index, keys) || !lt_ptrmap_init(&copied, keys)) {
        lt_ptrmap_free(&index);
        return lt_fail(LT_ERR_NOMEM, "out of memory planning copies");
    }
    for (int i = 0; i < g->n_nodes; i++)
        lt_ptrmap_set(&index, g->nodes[i], i);
    for (int i = 0; i < g->n_nodes; i++) {
        int be = s->node_be[i];
        if (be < 0)
            continue;
        for (int k = 0; k < LT_MAX_SRC; k++) {
            struct lt_tensor *src = g->nodes[i]->src[k];
            if (!src)
                continue;
            struct lt_tensor *root = lt_storage_root(src);
            if (can_read(s, planned_backend(s, g, p, &index, root), be))
                continue;
            int mask = lt_ptrmap_get(&copied, root, 0);
            if (mask & (1 << be))
                continue;
            lt_ptrmap_set(&copied, root, mask | (1 << be));
            p->copies[be] += align_up(lt_nbytes(root));
        }
    }
    lt_ptrmap_free(&index);
    lt_ptrmap_free(&copied);
    return LT_OK;
}

/* LATHE_SCHED_PEAK=N: after planning, the N largest intermediates alive when backend 0's
 * arena reached its peak (name, op, bytes, the nodes that make and last read it), and the
 * live bytes by op, on stderr: where a graph's memory goes. */
static int peak_report_rows(void)
{
    const char *e = getenv("LATHE_SCHED_PEAK");
    const int n = e ? atoi(e) : 0;
    return n > 0 ? n : 0;
}

static int cmp_bytes_desc(const void *x, const void *y)
{
    const size_t a = ((const size_t *)x)[0], b = ((const size_t *)y)[0];
    return a < b ? 1 : a > b ? -1 : 0;
}

static void peak_report(const struct lt_graph *g, const struct lt_sched *s, const int *dies,
                        const size_t *offset, int at, size_t peak, int rows)
{
    size_t(*live)[2] = malloc(sizeof(*live) * (size_t)(g->n_nodes + 1));
    double by_op[LT_OP_COUNT] = {0};
    if (!live)
        return;
    int n = 0;
    size_t sum = 0;
    for (int j = 0; j <= at; j++)
        if (offset[j] != SIZE_MAX && s->node_be[j] == 0 && dies[j] >= at) {
            live[n][0] = align_up(lt_nbytes(g->nodes[j]));
            live[n][1] = (size_t)j;
            sum += live[n][0];
            by_op[g->nodes[j]->op] += (double)live[n][0];
            n++;
        }
    qsort(live, (size_t)n, sizeof(*live), cmp_bytes_desc);
    fprintf(stderr,
            "sched peak: %.1f MiB of %s's arena at node %d of %d ('%s'), %d intermediates "
            "alive, %.1f MiB\n",
            (double)peak / (1 << 20), s->be[0]->name, at, g->n_nodes, g->nodes[at]->name, n,
            (double)sum / (1 << 20));
    for (int k = 0; k < n && k < rows; k++) {
        const int j = (int)live[k][1];
        const struct lt_tensor *t = g->nodes[j];
        fprintf(stderr, "  %9.1f MiB  %-14s made %6d, last read %6d  %s\n",
                (double)live[k][0] / (1 << 20), lt_op_name(t->op), j, dies[j], t->name);
    }
    for (int op = 0; op < LT_OP_COUNT; op++)
        if (by_op[op] >= (double)(64 << 20))
            fprintf(stderr, "  by op: %-14s %9.1f MiB\n", lt_op_name((enum lt_op)op),
                    by_op[op] / (1 << 20));
    free(live);
}

static lt_status make_plan(struct lt_sched *s, struct lt_graph *g, struct plan *p)
{
    lt_status st = LT_OK;
    memset(p, 0, sizeof(*p));
    struct arena_plan arenas[LT_SCHED_MAX_BACKENDS] = {0};
    struct lt_ptrmap last_use = {0};
    p->offset = malloc(sizeof(size_t) * (size_t)(g->n_nodes + 1));
    p->leaf_be = malloc(sizeof(int) * (size_t)(g->n_leafs + 1));
    if (!p->offset || !p->leaf_be ||
        !lt_ptrmap_init(&last_use, (size_t)(g->n_nodes + g->n_leafs) + 16)) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory planning a graph");
        goto out_free;
    }
    /* when does each storage root last get read? */
    for (int i = 0; i < g->n_nodes; i++) {
        struct lt_tensor *n = g->nodes[i];
        for (int k = 0; k < LT_MAX_SRC; k++)
            if (n->src[k])
                lt_ptrmap_set(&last_use, lt_storage_root(n->src[k]), i);
    }
    /* outputs live to the end, whoever reads them (a second pass: a later reader must not
     * shorten that) */
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->flags & (LT_FLAG_OUTPUT | LT_FLAG_LOSS))
            lt_ptrmap_set(&last_use, lt_storage_root(g->nodes[i]), g->n_nodes);
    /* leaves without storage live on the backend of their first reader */
    for (int l = 0; l < g->n_leafs; l++) {
        struct lt_tensor *t = g->leafs[l];
        p->leaf_be[l] = -1;
        if (t->data)
            continue;
        int be = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            bool reads = false;
            for (int k = 0; k < LT_MAX_SRC; k++)
                reads |= g->nodes[i]->src[k] && lt_storage_root(g->nodes[i]->src[k]) == t;
            if (reads && s->node_be[i] >= 0) {
                be = s->node_be[i];
                break;
            }
        }
        p->leaf_be[l] = be;
        p->leafs[be] += align_up(lt_nbytes(t));
    }
    /* nodes in order: take a block, then give back the blocks whose last reader this is.
     * next_dying chains the nodes that die at the same index (head: first_dying). */
    int *first_dying = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    int *next_dying = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    const int report = peak_report_rows();
    int *dies_at = report ? malloc(sizeof(int) * (size_t)(g->n_nodes + 1)) : NULL;
    if (!first_dying || !next_dying || (report && !dies_at)) {
        free(first_dying);
        free(next_dying);
        free(dies_at);
        st = lt_fail(LT_ERR_NOMEM, "out of memory planning a graph");
        goto out_free;
    }
    for (int i = 0; i <= g->n_nodes; i++)
        first_dying[i] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        struct lt_tensor *n = g->nodes[i];
        p->offset[i] = SIZE_MAX;
        next_dying[i] = -1;
        if (lt_op_is_view(n->op) || writes_in_place(n) || n->data)
            continue;
        int dies = lt_ptrmap_get(&last_use, n, i);
        if (dies < i)
            dies = i;
        next_dying[i] = first_dying[dies];
        first_dying[dies] = i;
        if (dies_at)
            dies_at[i] = dies;
        p->offset[i] = 0; /* planned; the real offset comes below */
    }
    int peak_at = -1;
    for (int i = 0; i < g->n_nodes && st == LT_OK; i++) {
        const size_t before = arenas[0].peak;
        if (p->offset[i] != SIZE_MAX &&
            !plan_take(&arenas[s->node_be[i]], align_up(lt_nbytes(g->nodes[i])), &p->offset[i]))
            st = lt_fail(LT_ERR_NOMEM, "out of memory planning a graph");
        if (arenas[0].peak > before)
            peak_at = i;
        for (int j = first_dying[i]; j >= 0; j = next_dying[j])
            plan_give(&arenas[s->node_be[j]], p->offset[j]);
    }
    if (dies_at && st == LT_OK && peak_at >= 0)
        peak_report(g, s, dies_at, p->offset, peak_at, arenas[0].peak, report);
    free(dies_at);
    free(first_dying);
    free(next_dying);
    if (st != LT_OK)
        goto out_free;
    for (int b = 0; b < s->n_be; b++)
        p->compute[b] = arenas[b].peak;
    st = plan_copy_bytes(s, g, p);
out_free:
    for (int b = 0; b < LT_SCHED_MAX_BACKENDS; b++)
        free(arenas[b].live);
    lt_ptrmap_free(&last_use);
    return st;
}

lt_status lt_sched_measure(struct lt_sched *s, struct lt_graph *g, struct lt_sched_memory *m)
{
    if (s->g != g)
        return lt_fail(LT_ERR_INVALID, "measure a graph after placing it");
    struct plan p;
    lt_status st = make_plan(s, g, &p);
    if (st != LT_OK)
        return st;
    memset(m, 0, sizeof(*m));
    for (int b = 0; b < s->n_be; b++) {
        m->compute[b] = p.compute[b];
        m->leafs[b] = p.leafs[b];
        m->copies[b] = p.copies[b];
        m->total += p.compute[b] + p.leafs[b] + p.copies[b];
    }
    plan_free(&p);
    /* each backend's nodes, in order, for its scratch */
    struct lt_tensor **mine = malloc(sizeof(*mine) * (size_t)(g->n_nodes > 0 ? g->n_nodes : 1));
    if (!mine)
        return lt_fail(LT_ERR_NOMEM, "out of memory measuring scratch");
    for (int b = 0; b < s->n_be; b++) {
        int n = 0;
        for (int i = 0; i < g->n_nodes; i++)
            if (s->node_be[i] == b)
                mine[n++] = g->nodes[i];
        m->scratch[b] = lt_backend_scratch_bytes(s->be[b], mine, n, &m->scratch_held[b]);
    }
    free(mine);
    return LT_OK;
}

size_t lt_sched_allocated(const struct lt_sched *s) { return s->allocated; }

size_t lt_sched_leaf_bytes(const struct lt_tensor *t) { return align_up(lt_nbytes(t)); }

static lt_status add_buffer(struct lt_sched *s, int be, size_t size, struct lt_buffer **out)
{
    if (s->n_bufs == s->cap_bufs) {
        int cap = s->cap_bufs ? s->cap_bufs * 2 : 16;
        struct lt_buffer **nb = realloc(s->bufs, sizeof(*nb) * (size_t)cap);
        if (!nb)
            return lt_fail(LT_ERR_NOMEM, "out of memory for buffer bookkeeping");
        s->bufs = nb;
        s->cap_bufs = cap;
    }
    lt_status st = lt_backend_buffer_alloc(s->be[be], size ? size : SCHED_ALIGN, out);
    if (st != LT_OK)
        return st;
    s->bufs[s->n_bufs++] = *out;
    s->allocated += (*out)->size;
    return LT_OK;
}

static void bind(struct lt_tensor *t, struct lt_buffer *buf, size_t offset)
{
    t->buffer = buf;
    t->data = (char *)buf->base + offset;
}

/* Views made before their storage existed get their data pointers now. */
static void bind_views(struct lt_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        struct lt_tensor *t = g->nodes[i];
        if (t->view_src && t->view_src->data) {
            t->data = (char *)t->view_src->data + t->view_offs;
            t->buffer = t->view_src->buffer;
        }
    }
}

/* Does node write source k in place? CPY writes its destination; an optimizer step its
 * parameter, gradient accumulator and moments (every source but the hyper-parameters).
 * GDN_DECODE given seq_ids (source 10) has a result of its own, not a view, and writes
 * its ssm cache (source 5) besides (slots named in src/ops/gdn_decode.c). */
static bool writes_source(const struct lt_tensor *node, int k)
{
    if (!node->src[k])
        return false;
    if (node->op == LT_OP_GDN_DECODE) /* given seq_ids, the conv and ssm caches */
        return node->src[10] && (k == 4 || k == 5);
    if (node->op == LT_OP_ATTN_DECODE) /* given this token's keys and values, the caches */
        return node->src[6] && (k == 1 || k == 2);
    if (!writes_in_place(node))
        return false;
    if (lt_storage_root(node->src[k]) == node->view_src)
        return true;
    return (node->op == LT_OP_ADAMW && k <= 3) || (node->op == LT_OP_SGD && k <= 1);
}

/* A node reading storage its backend can't address gets a copy of that storage; a node
 * writing such storage in place writes the copy, which goes back after its run. */
static lt_status plan_copies(struct lt_sched *s, struct lt_graph *g)
{
    int cap = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        int be = s->node_be[i];
        if (be < 0)
            continue;
        struct lt_tensor *n = g->nodes[i];
        for (int k = 0; k < LT_MAX_SRC; k++) {
            struct lt_tensor *src = n->src[k];
            if (!src)
                continue;
            if (can_read(s, storage_backend(s, src), be))
                continue;
            if (!s->ctx) {
                s->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
                if (!s->ctx)
                    return LT_ERR_NOMEM;
            }
            if (s->n_copies == cap) {
                cap = cap ? cap * 2 : 16;
                struct sched_copy *nc = realloc(s->copies, sizeof(*nc) * (size_t)cap);
                if (!nc)
                    return lt_fail(LT_ERR_NOMEM, "out of memory for copies");
                s->copies = nc;
            }
            struct lt_tensor *root = lt_storage_root(src);
            struct lt_tensor *local = NULL;
            for (int c = 0; c < s->n_copies && !local; c++)
                if (s->copies[c].root == root && s->copies[c].local->buffer->backend == s->be[be])
                    local = s->copies[c].local;
            if (!local) {
                local = lt_dup_tensor(s->ctx, root);
                if (!local)
                    return LT_ERR_NOMEM;
                lt_format_name(local, "%s (copy)", root->name);
                struct lt_buffer *buf;
                lt_status st = add_buffer(s, be, align_up(lt_nbytes(root)), &buf);
                if (st != LT_OK)
                    return st;
                bind(local, buf, 0);
            }
            /* the reader sees the same view, over the copy */
            struct lt_tensor *view = src;
            if (src != root) {
                view = lt_view_4d(s->ctx, local, src->ne[0], src->ne[1], src->ne[2], src->ne[3],
                                  src->nb[1], src->nb[2], src->nb[3], src->view_offs);
                if (!view)
                    return LT_ERR_NOMEM;
                view->nb[0] = src->nb[0];
            } else {
                view = local;
            }
            s->copies[s->n_copies++] = (struct sched_copy){
                n, i, k, src, root, local, writes_source(n, k), n->data, n->buffer};
            if (n->view_src == root) {
                /* an in-place writer is a view of its target: it writes through its own
                 * data pointer, which must now point into the copy */
                n->data = (char *)local->data + n->view_offs;
                n->buffer = local->buffer;
            }
            n->src[k] = view;
        }
    }
    return LT_OK;
}

lt_status lt_sched_alloc(struct lt_sched *s, struct lt_graph *g)
{
    if (s->g != g)
        return lt_fail(LT_ERR_INVALID, "allocate a graph after placing it");
    drop_copies(s);
    struct plan p;
    lt_status st = make_plan(s, g, &p);
    if (st != LT_OK)
        return st;
    struct lt_buffer **compute = s->kept[0], **leafs = s->kept[1];
    size_t leaf_at[LT_SCHED_MAX_BACKENDS] = {0};
    for (int b = 0; b < s->n_be && st == LT_OK; b++)
        for (int k = 0; k < 2 && st == LT_OK; k++) {
            size_t need = k == 0 ? p.compute[b] : p.leafs[b];
            struct lt_buffer **slot = &s->kept[k][b];
            if (*slot && (*slot)->size >= need)
                continue;
            if (*slot) {
                s->allocated -= (*slot)->size;
                lt_buffer_free(*slot);
                *slot = NULL;
            }
            if (need == 0)
                continue;
            st = lt_backend_buffer_alloc(s->be[b], need, slot);
            if (st == LT_OK)
                s->allocated += (*slot)->size;
        }
    if (st != LT_OK)
        goto out_release;
    for (int l = 0; l < g->n_leafs; l++) {
        int b = p.leaf_be[l];
        if (b < 0)
            continue;
        bind(g->leafs[l], leafs[b], leaf_at[b]);
        leaf_at[b] += align_up(lt_nbytes(g->leafs[l]));
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (p.offset[i] != SIZE_MAX)
            bind(g->nodes[i], compute[s->node_be[i]], p.offset[i]);
    bind_views(g);
    st = plan_copies(s, g);
    if (st != LT_OK)
        goto out_release;
    plan_free(&p);
    return LT_OK;
out_release:
    plan_free(&p);
    lt_sched_release(s);
    return st;
}

/* Brings the copies read by nodes [from, to) up to date with their originals, each once. */
static lt_status refresh_copies(struct lt_sched *s, int from, int to)
{
    for (int c = 0; c < s->n_copies; c++) {
        struct sched_copy *cp = &s->copies[c];
        if (cp->node_index < from || cp->node_index >= to)
            continue;
        bool done = false;
        for (int d = 0; d < c && !done; d++)
            done = s->copies[d].local == cp->local && s->copies[d].node_index >= from &&
                   s->copies[d].node_index < to;
        if (done)
            continue;
        size_t n = lt_nbytes(cp->root);
        void *host = malloc(n ? n : 1);
        if (!host)
            return lt_fail(LT_ERR_NOMEM, "out of host memory staging '%s'", cp->root->name);
        lt_status st = lt_tensor_get(cp->root, host, 0, n);
        if (st == LT_OK)
            st = lt_tensor_set(cp->local, host, 0, n);
        free(host);
        if (st != LT_OK)
            return st;
    }
    return LT_OK;
}

/* Copies written in place by nodes [from, to) go back to their originals. */
static lt_status write_back_copies(struct lt_sched *s, int from, int to)
{
    for (int c = 0; c < s->n_copies; c++) {
        struct sched_copy *cp = &s->copies[c];
        if (!cp->written || cp->node_index < from || cp->node_index >= to)
            continue;
        size_t n = lt_nbytes(cp->root);
        void *host = malloc(n ? n : 1);
        if (!host)
            return lt_fail(LT_ERR_NOMEM, "out of host memory staging '%s'", cp->root->name);
        lt_status st = lt_tensor_get(cp->local, host, 0, n);
        if (st == LT_OK)
            st = lt_tensor_set(cp->root, host, 0, n);
        free(host);
        if (st != LT_OK)
            return st;
    }
    return LT_OK;
}

lt_status lt_sched_compute(struct lt_sched *s, struct lt_graph *g)
{
    return lt_sched_compute_range(s, g, 0, g->n_nodes);
}

lt_status lt_sched_compute_range(struct lt_sched *s, struct lt_graph *g, int from, int to)
{
    if (s->g != g)
        return lt_fail(LT_ERR_INVALID, "compute a graph after placing and allocating it");
    int i = from;
    while (i < to) {
        if (s->node_be[i] < 0) {
            i++;
            continue;
        }
        int be = s->node_be[i], j = i + 1;
        while (j < to && (s->node_be[j] == be || s->node_be[j] < 0))
            j++;
        lt_status st = refresh_copies(s, i, j);
        if (st == LT_OK)
            st = lt_backend_compute(s->be[be], g->nodes + i, j - i);
        if (st == LT_OK && s->be[be]->iface->synchronize)
            st = s->be[be]->iface->synchronize(s->be[be]);
        if (st == LT_OK)
            st = write_back_copies(s, i, j);
        if (st != LT_OK)
            return st;
        i = j;
    }
    return LT_OK;
}
