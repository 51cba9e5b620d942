/* conformance.h: the harness of test_cuda_conformance.c. A case is a builder that makes one
 * op node (and its inputs, in a chosen layout) in a fresh no_alloc context; the harness
 * builds it twice, runs one copy on the CPU backend alone (the oracle) and the other
 * through the scheduler with {CUDA, CPU}, fills both copies' inputs with the same values,
 * and compares the results (and any tensors the op updates in place).
 *
 * What a case asserts: the node lands where CUDA's verdict says (CUDA on yes, the CPU on
 * no), the run succeeds, and the result matches the CPU's within the case's tolerance on
 * the normalised squared error (check_nmse), with NaN exactly where the CPU has NaN.
 * Inputs are written through their views into storage whose other elements are NaN (or an
 * invalid id for I32), so a kernel that reads outside its view shows up. */
#ifndef LATHE_TESTS_GPU_CONFORMANCE_H
#define LATHE_TESTS_GPU_CONFORMANCE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lathe/backend.h"
#include "lathe/backend_cuda.h"
#include "lathe/ops.h"
#include "lathe/sched.h"

enum layout { L_CONTIG, L_TRANSPOSED, L_PERMUTED, L_SLICED, L_BROADCAST, L_COUNT };
static const char *const layout_names[L_COUNT] = {"contig", "transp", "permut", "sliced",
                                                  "bcast"};

enum fill_kind {
    FILL_UNIFORM, /* uniform in [lo, hi) */
    FILL_MASK,    /* uniform in [lo, hi), about one in five -inf */
    FILL_INT,     /* integers in [lo, hi) (ids, positions, labels) */
    FILL_VALUES,  /* values[] in order */
    FILL_NONE,    /* left as it is (NaN): a destination */
};

struct input {
    struct lt_tensor *root; /* the leaf that owns storage */
    struct lt_tensor *view; /* what the op reads */
    enum fill_kind kind;
    float lo, hi;
    const float *values;
    uint64_t seed;
};

#define MAX_INPUTS 12
#define MAX_EXTRA 4

struct build {
    struct lt_ctx *ctx;
    struct input in[MAX_INPUTS];
    int n_in;
    struct lt_tensor *extra[MAX_EXTRA]; /* tensors the op updates in place, compared too */
    int n_extra;
    /* compared in place of the result: one part of a packed result of mixed types (the
     * others go in extra), whose bytes read as one type would mean nothing; NULL: the result */
    struct lt_tensor *out_as;
    uint64_t seed;
};

/* what a builder is given: layouts, types, sizes and flags, as the case wants them */
struct params {
    int lay[4];
    enum lt_type type[4];
    int64_t ne[4];
    int i[4];
    float f[4];
};

typedef struct lt_tensor *(*build_fn)(struct build *b, const struct params *p);

static struct lt_backend *g_cuda, *g_cpu;

/* ---- random numbers ---- */

static inline uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline float rng_unit(uint64_t *s) /* [0, 1) */
{
    return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0));
}

/* ---- inputs ---- */

/* A leaf of type and logical shape ne read through layout `lay`, filled by `kind`. */
static struct lt_tensor *mk(struct build *b, enum lt_type type, int lay, int64_t ne0, int64_t ne1,
                            int64_t ne2, int64_t ne3, enum fill_kind kind, float lo, float hi)
{
    struct lt_ctx *ctx = b->ctx;
    const bool quant = lt_type_traits(type)->is_quantized;
    struct lt_tensor *r = NULL, *v = NULL;
    if (quant && lay != L_CONTIG && lay != L_SLICED)
        lay = L_SLICED; /* quantised rows cannot be transposed */
    switch (lay) {
    case L_TRANSPOSED:
        r = lt_new_tensor_4d(ctx, type, ne1, ne0, ne2, ne3);
        v = r ? lt_transpose(ctx, r) : NULL;
        break;
    case L_PERMUTED:
        r = lt_new_tensor_4d(ctx, type, ne2, ne0, ne1, ne3);
        v = r ? lt_permute(ctx, r, 2, 0, 1, 3) : NULL;
        break;
    case L_SLICED:
        if (quant) {
            r = lt_new_tensor_4d(ctx, type, ne0, ne1 + 2, ne2 + 1, ne3);
            v = r ? lt_view_4d(ctx, r, ne0, ne1, ne2, ne3, r->nb[1], r->nb[2], r->nb[3],
                               2 * r->nb[1] + r->nb[2])
                  : NULL;
        } else {
            r = lt_new_tensor_4d(ctx, type, ne0 + 3, ne1 + 2, ne2 + 1, ne3);
            v = r ? lt_view_4d(ctx, r, ne0, ne1, ne2, ne3, r->nb[1], r->nb[2], r->nb[3],
                               r->nb[0] + 2 * r->nb[1] + r->nb[2])
                  : NULL;
        }
        break;
    case L_BROADCAST: /* dim 1 read with stride 0 from a single row */
        r = lt_new_tensor_4d(ctx, type, ne0, 1, ne2, ne3);
        v = r ? lt_view_4d(ctx, r, ne0, ne1, ne2, ne3, 0, r->nb[2], r->nb[3], 0) : NULL;
        break;
    default:
        r = v = lt_new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3);
        break;
    }
    if (!r || !v || b->n_in == MAX_INPUTS) {
        fprintf(stderr, "cannot make an input: %s\n", lt_last_error());
        exit(1);
    }
    lt_format_name(r, "in%d", b->n_in);
    r->flags |= LT_FLAG_INPUT;
    struct input *in = &b->in[b->n_in];
    *in = (struct input){r, v, kind, lo, hi, NULL, b->seed * 1000003u + (uint64_t)b->n_in * 7919u + 1};
    b->n_in++;
    return v;
}

static struct lt_tensor *mk_values(struct build *b, int64_t n, const float *values)
{
    struct lt_tensor *t = mk(b, LT_TYPE_F32, L_CONTIG, n, 1, 1, 1, FILL_VALUES, 0, 0);
    b->in[b->n_in - 1].values = values;
    return t;
}

/* Random bytes for a quantised leaf, with each block's scales set to small f16 values. */
static void fill_quant(const struct input *in, uint8_t *host, size_t n, uint64_t *rng)
{
    const enum lt_type t = in->root->type;
    const size_t bs = lt_type_traits(t)->type_size;
    for (size_t i = 0; i < n; i++)
        host[i] = (uint8_t)(rng_next(rng) >> 56);
    int d_at = 0, m_at = -1;
    switch (t) {
    case LT_TYPE_Q4_1:
    case LT_TYPE_Q5_1: m_at = 2; break;
    case LT_TYPE_Q2_K: d_at = 80, m_at = 82; break;
    case LT_TYPE_Q3_K: d_at = 108; break;
    case LT_TYPE_Q4_K:
    case LT_TYPE_Q5_K: m_at = 2; break;
    case LT_TYPE_Q6_K: d_at = 208; break;
    default: break;
    }
    for (size_t blk = 0; blk + bs <= n; blk += bs) {
        if (t == LT_TYPE_Q8_K) {
            float d = 0.002f + 0.004f * rng_unit(rng);
            memcpy(host + blk, &d, 4);
            continue;
        }
        uint16_t d = lt_fp32_to_fp16(0.002f + 0.004f * rng_unit(rng));
        memcpy(host + blk + d_at, &d, 2);
        if (m_at >= 0) {
            uint16_t m = lt_fp32_to_fp16((t == LT_TYPE_Q4_1 || t == LT_TYPE_Q5_1 ? -0.05f : 0.002f) +
                                         0.004f * rng_unit(rng));
            memcpy(host + blk + m_at, &m, 2);
        }
    }
}

/* The bytes of an input's storage: outside the view NaN (or -7777 for I32). */
static void *input_bytes(const struct input *in)
{
    const struct lt_tensor *r = in->root, *v = in->view;
    const size_t n = lt_nbytes(r);
    uint8_t *host = calloc(1, n ? n : 1);
    uint64_t rng = in->seed;
    if (lt_type_traits(r->type)->is_quantized) {
        fill_quant(in, host, n, &rng);
        return host;
    }
    struct lt_tensor rh = *r;
    rh.data = host;
    const float outside = r->type == LT_TYPE_I32 ? -7777.0f : NAN;
    for (int64_t i3 = 0; i3 < r->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < r->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < r->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < r->ne[0]; i0++)
                    lt_set_f32_nd(&rh, i0, i1, i2, i3, outside);
    if (in->kind == FILL_NONE)
        return host;
    struct lt_tensor vh = *v;
    vh.data = host + (v == r ? 0 : v->view_offs);
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < v->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < v->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < v->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < v->ne[0]; i0++, k++) {
                    float x = in->lo + (in->hi - in->lo) * rng_unit(&rng);
                    if (in->kind == FILL_INT)
                        x = floorf(x);
                    else if (in->kind == FILL_MASK && rng_unit(&rng) < 0.2f)
                        x = -INFINITY;
                    else if (in->kind == FILL_VALUES)
                        x = in->values[k];
                    lt_set_f32_nd(&vh, i0, i1, i2, i3, x);
                }
    return host;
}

/* t's values (any layout, any readable type) as floats, read from wherever it is stored */
static float *read_floats(const struct lt_tensor *t)
{
    struct lt_tensor *r = lt_storage_root((struct lt_tensor *)t);
    size_t n = lt_nbytes(r);
    char *host = malloc(n ? n : 1);
    float *out = malloc(sizeof(float) * (size_t)(lt_nelements(t) ? lt_nelements(t) : 1));
    lt_status st = lt_tensor_get(r, host, 0, n);
    if (st != LT_OK) {
        fprintf(stderr, "reading '%s' back: %s\n", t->name, lt_last_error());
        for (int64_t i = 0; i < lt_nelements(t); i++)
            out[i] = NAN;
        free(host);
        return out;
    }
    struct lt_tensor h = *t;
    h.data = host + (t->view_src ? t->view_offs : 0);
    lt_tensor_read_f32(&h, out);
    free(host);
    return out;
}

/* ---- one run of a case ---- */

struct run_result {
    float *out, *extra[MAX_EXTRA];
    int64_t n_out, n_extra_el[MAX_EXTRA];
    int n_extra;
    int placed; /* backend index of the op node, -1 if not found */
    bool ok;
};

static void run_result_free(struct run_result *r)
{
    free(r->out);
    for (int i = 0; i < r->n_extra; i++)
        free(r->extra[i]);
}

static struct run_result run_on(struct lt_backend *const *bes, int n_be, build_fn fn,
                                const struct params *p, uint64_t seed, bool *verdict,
                                char *reason, size_t reason_size)
{
    struct run_result res = {0};
    res.placed = -1;
    struct build b = {0};
    b.seed = seed;
    b.ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *out = fn(&b, p);
    struct lt_sched *s = NULL;
    if (!out) {
        fprintf(stderr, "builder failed: %s\n", lt_last_error());
        goto out_ctx;
    }
    out->flags |= LT_FLAG_OUTPUT;
    if (verdict) {
        reason[0] = '\0';
        *verdict = lt_backend_supports_op(g_cuda, out, reason, reason_size);
    }
    struct lt_graph *g = lt_graph_new(b.ctx, 64);
    s = lt_sched_new(bes, n_be);
    if (!g || lt_graph_build(g, out) != LT_OK || !s ||
        lt_sched_place(s, g, false, NULL) != LT_OK) {
        fprintf(stderr, "placing '%s': %s\n", out->name, lt_last_error());
        goto out_sched;
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i] == out)
            res.placed = lt_sched_node_backend(s, i);
    if (lt_sched_alloc(s, g) != LT_OK) {
        fprintf(stderr, "allocating '%s': %s\n", out->name, lt_last_error());
        goto out_sched;
    }
    for (int i = 0; i < b.n_in; i++) {
        void *host = input_bytes(&b.in[i]);
        lt_status st = lt_tensor_set(b.in[i].root, host, 0, lt_nbytes(b.in[i].root));
        free(host);
        if (st != LT_OK) {
            fprintf(stderr, "setting an input: %s\n", lt_last_error());
            goto out_sched;
        }
    }
    if (lt_sched_compute(s, g) != LT_OK) {
        fprintf(stderr, "computing '%s': %s\n", out->name, lt_last_error());
        goto out_sched;
    }
    res.out = read_floats(b.out_as ? b.out_as : out);
    res.n_out = lt_nelements(b.out_as ? b.out_as : out);
    res.n_extra = b.n_extra;
    for (int i = 0; i < b.n_extra; i++) {
        res.extra[i] = read_floats(b.extra[i]);
        res.n_extra_el[i] = lt_nelements(b.extra[i]);
    }
    res.ok = true;
out_sched:
    lt_sched_free(s);
out_ctx:
    lt_ctx_free(b.ctx);
    return res;
}

/* ---- comparison and the table ---- */

/* normalised squared error over positions where neither is NaN; NaN where only one is */
static double compare(const float *a, const float *ref, int64_t n, int64_t *first_bad)
{
    double num = 0, den = 0;
    *first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        bool na = isnan(a[i]), nr = isnan(ref[i]);
        if (na || nr) {
            if (na != nr) {
                *first_bad = i;
                return INFINITY;
            }
            continue;
        }
        if (isinf(ref[i]) || isinf(a[i])) {
            if (a[i] != ref[i]) {
                *first_bad = i;
                return INFINITY;
            }
            continue;
        }
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (*first_bad < 0 && fabs(d) > 1e-3 * (1 + fabs(ref[i])))
            *first_bad = i;
    }
    return den > 0 ? num / den : num;
}

struct op_row {
    int cases, yes, no, nan_cases; /* nan_cases: the CPU's result holds NaN */
    double worst;
    char labels[160];
};

static struct op_row table[LT_OP_COUNT];
static int case_counter;
static int cases_over_limit; /* skipped by LATHE_CONF_MAX_ELEMENTS */

/* LATHE_CONF_MAX_ELEMENTS=N: cases whose shape (the product of p->ne) passes N are skipped
 * and counted, for the CPU emulation of the device (tests/cuemu), where Qwen3.5-0.8B's
 * training shapes take minutes each. Unset (the default, and on a GPU): every case runs. */
static bool over_limit(const struct params *p)
{
    const char *hi = getenv("LATHE_CONF_MAX_ELEMENTS"), *lo = getenv("LATHE_CONF_MIN_ELEMENTS");
    double n = 1.0;
    for (int d = 0; d < 4; d++)
        n *= p->ne[d] > 0 ? (double)p->ne[d] : 1.0;
    /* LATHE_CONF_MIN_ELEMENTS=N runs only the cases past N: the large ones alone */
    return (hi && *hi && n > atof(hi)) || (lo && *lo && n <= atof(lo));
}

static void row_add_label(struct op_row *r, const char *label)
{
    if (strstr(r->labels, label))
        return;
    size_t len = strlen(r->labels);
    if (len + strlen(label) + 2 < sizeof(r->labels))
        snprintf(r->labels + len, sizeof(r->labels) - len, "%s%s", len ? " " : "", label);
}

/* Runs one case on both sides and records it under op; returns its normalised error
 * (NaN when a side failed). */
static double run_case(enum lt_op op, const char *label, double tol, build_fn fn,
                       const struct params *p)
{
    double case_err = NAN;
    uint64_t seed = 0x5eed0000u + (uint64_t)++case_counter;
    if (over_limit(p)) {
        cases_over_limit++;
        printf("  skipped: %s [%s]: outside LATHE_CONF_MAX/MIN_ELEMENTS\n", lt_op_name(op), label);
        return case_err;
    }
    /* LATHE_CONF_OP=NAME runs that op's cases alone (the others keep their seeds) */
    const char *only = getenv("LATHE_CONF_OP");
    if (only && *only && strcmp(only, lt_op_name(op)) != 0)
        return case_err;
    struct lt_backend *cpu_only[1] = {g_cpu};
    struct lt_backend *both[2] = {g_cuda, g_cpu};
    bool yes = false;
    char reason[160];
    struct run_result ref = run_on(cpu_only, 1, fn, p, seed, NULL, NULL, 0);
    struct run_result dev = run_on(both, 2, fn, p, seed, &yes, reason, sizeof(reason));
    struct op_row *row = &table[op];
    row->cases++;
    row_add_label(row, label);
    if (yes)
        row->yes++;
    else
        row->no++;
    CHECK(ref.ok, "%s [%s]: the CPU run failed", lt_op_name(op), label);
    CHECK(dev.ok, "%s [%s]: the CUDA+CPU run failed", lt_op_name(op), label);
    CHECK(dev.placed == (yes ? 0 : 1), "%s [%s]: CUDA says %s but the node was placed on %d",
          lt_op_name(op), label, yes ? "yes" : "no", dev.placed);
    if (!yes)
        printf("  no: %-14s [%s]: %s\n", lt_op_name(op), label, reason);
    if (ref.ok) {
        int64_t n_nan = 0, n_zero = 0;
        for (int64_t i = 0; i < ref.n_out; i++) {
            n_nan += isnan(ref.out[i]);
            n_zero += ref.out[i] == 0.0f;
        }
        row->nan_cases += n_nan > 0;
        /* a result that is all NaN or all zero would compare equal to anything */
        CHECK(n_nan < ref.n_out && (n_zero < ref.n_out || op == LT_OP_GET_ROWS_BACK),
              "%s [%s]: the CPU's result has %lld NaN and %lld zeros of %lld", lt_op_name(op),
              label, (long long)n_nan, (long long)n_zero, (long long)ref.n_out);
    }
    if (ref.ok && dev.ok) {
        int64_t bad;
        double err = compare(dev.out, ref.out, ref.n_out, &bad);
        for (int i = 0; i < ref.n_extra && i < dev.n_extra; i++) {
            int64_t bad_e;
            double e = compare(dev.extra[i], ref.extra[i], ref.n_extra_el[i], &bad_e);
            if (e > err) {
                err = e;
                bad = -1;
            }
        }
        if (err > row->worst || err != err)
            row->worst = err != err ? INFINITY : err;
        case_err = err;
        CHECK(err <= tol, "%s [%s] on %s: normalised error %.3g over %.0e", lt_op_name(op), label,
              yes ? "CUDA" : "CPU", err, tol);
        if (!(err <= tol) && bad >= 0)
            fprintf(stderr, "    first mismatch at %lld: got %.9g, CPU %.9g\n", (long long)bad,
                    dev.out[bad], ref.out[bad]);
    }
    run_result_free(&ref);
    run_result_free(&dev);
    return case_err;
}

static void print_table(void)
{
    printf("\n%-19s %5s %4s %4s %4s  %-11s  %s\n", "op", "cases", "yes", "no", "nan",
           "worst nmse", "layouts / types tried");
    for (int op = 0; op < LT_OP_COUNT; op++) {
        const struct op_row *r = &table[op];
        if (!r->cases)
            continue;
        printf("%-19s %5d %4d %4d %4d  %-11.3g  %s\n", lt_op_name((enum lt_op)op), r->cases,
               r->yes, r->no, r->nan_cases, r->worst, r->labels);
    }
    if (cases_over_limit)
        printf("%d cases skipped: their shapes are outside LATHE_CONF_MAX/MIN_ELEMENTS\n",
               cases_over_limit);
    printf("\n");
}

#endif
