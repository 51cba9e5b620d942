/* test_ops_nn.c: RMS_NORM, L2_NORM, ROPE, SOFT_MAX, CROSS_ENTROPY and their _BACK ops on the
 * CPU, against plain reference loops in double written here, over contiguous, transposed,
 * permuted and sliced inputs and 1 and 2 threads. Each _BACK op is also held to a central
 * finite difference of the forward's double reference (so the gradient formula, not only
 * its code, is checked). MUL_MAT is in test_ops_nn_matmul.c. */
#include "ops/op.h"
#include "ops_nn_util.h"

#define FD_H 1e-4

static float *nn_alloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

/* op output (any shape, contiguous) into a dense array */
static void nn_read(const struct lt_tensor *t, float *out) { lt_tensor_read_f32(t, out); }

/* ---------------- norms ---------------- */

/* y = x * (S + eps)^(-1/2) per row of n, S = sum(x^2) (/ n for rms), in double */
static void ref_norm_row(bool rms, const double *x, int64_t n, float eps, double *y)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i] * x[i];
    if (rms)
        s /= (double)n;
    double r = 1.0 / sqrt(s + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * r;
}

/* L = sum g * norm(x) over one row, for the finite differences */
static double norm_row_loss(bool rms, const double *x, const float *g, int64_t n, float eps)
{
    double y[64], l = 0;
    ref_norm_row(rms, x, n, eps, y);
    for (int64_t i = 0; i < n; i++)
        l += g[i] * y[i];
    return l;
}

static void test_norms(void)
{
    const int64_t ne[4] = {37, 5, 3, 2};
    const int64_t n = ne[0], rows = ne[1] * ne[2] * ne[3], cnt = nn_count(ne);
    float *rx = nn_alloc(cnt), *rg = nn_alloc(cnt), *got = nn_alloc(cnt), *ref = nn_alloc(cnt);
    float *fd = nn_alloc(cnt);
    int bad = 0, runs = 0;
    for (int rms = 0; rms <= 1; rms++)
        for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++)
            for (int nth = 1; nth <= 2; nth++) {
                struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
                float eps = rms ? 1e-6f : 1e-5f;
                struct lt_tensor *x = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, ne);
                struct lt_tensor *g =
                    nn_make(ctx, LT_TYPE_F32, (enum nn_layout)((lay + 1) % NN_LAYOUT_COUNT), ne);
                nn_fill_rand(x, rx, 2.0f);
                nn_fill_rand(g, rg, 1.0f);
                struct lt_tensor *y = rms ? lt_rms_norm(ctx, x, eps) : lt_l2_norm(ctx, x, eps);
                struct lt_tensor *dx =
                    rms ? lt_rms_norm_back(ctx, g, x, eps) : lt_l2_norm_back(ctx, g, x, eps);
                CHECK(y && dx && nn_run(ctx, y, nth) == LT_OK && nn_run(ctx, dx, nth) == LT_OK,
                      "%s", lt_last_error());
                if (!y || !dx)
                    continue;
                runs++;
                /* forward */
                for (int64_t r = 0; r < rows; r++) {
                    double xd[64], yd[64];
                    for (int64_t i = 0; i < n; i++)
                        xd[i] = rx[r * n + i];
                    ref_norm_row(rms, xd, n, eps, yd);
                    for (int64_t i = 0; i < n; i++)
                        ref[r * n + i] = (float)yd[i];
                }
                nn_read(y, got);
                double e1 = check_max_ratio(got, ref, (long)cnt, 1e-6, 1e-5, NULL);
                CHECK(e1 <= 1.0, "%s forward, %s, %d threads: ratio %g", rms ? "rms" : "l2",
                      nn_layout_names[lay], nth, e1);
                /* backward: the closed form, and central differences of the reference */
                for (int64_t r = 0; r < rows; r++) {
                    double xd[64], s = 0, dot = 0;
                    for (int64_t i = 0; i < n; i++) {
                        xd[i] = rx[r * n + i];
                        s += xd[i] * xd[i];
                        dot += rg[r * n + i] * xd[i];
                    }
                    double m = rms ? (double)n : 1.0, f = 1.0 / sqrt(s / m + eps);
                    for (int64_t i = 0; i < n; i++) {
                        ref[r * n + i] = (float)(f * rg[r * n + i] - f * f * f * xd[i] * dot / m);
                        double keep = xd[i];
                        xd[i] = keep + FD_H;
                        double lp = norm_row_loss(rms, xd, rg + r * n, n, eps);
                        xd[i] = keep - FD_H;
                        double lm = norm_row_loss(rms, xd, rg + r * n, n, eps);
                        xd[i] = keep;
                        fd[r * n + i] = (float)((lp - lm) / (2 * FD_H));
                    }
                }
                nn_read(dx, got);
                double e2 = check_max_ratio(got, ref, (long)cnt, 1e-6, 1e-4, NULL);
                double e3 = check_max_ratio(got, fd, (long)cnt, 1e-5, 1e-3, NULL);
                CHECK(e2 <= 1.0 && e3 <= 1.0, "%s backward, %s, %d threads: ratio %g, fd %g",
                      rms ? "rms" : "l2", nn_layout_names[lay], nth, e2, e3);
                bad += !(e1 <= 1.0 && e2 <= 1.0 && e3 <= 1.0);
                lt_ctx_free(ctx);
            }
    printf("norms: %d runs, %d bad\n", runs, bad);
    /* refusals */
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *h = lt_new_tensor_2d(ctx, LT_TYPE_F16, 8, 2);
    struct lt_tensor *f = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 2);
    struct lt_tensor *f3 = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3);
    CHECK(lt_rms_norm(ctx, h, 1e-6f) == NULL, "f16 input");
    CHECK(lt_l2_norm(ctx, f, -1.0f) == NULL, "negative eps");
    CHECK(lt_rms_norm_back(ctx, f3, f, 1e-6f) == NULL, "shape mismatch");
    lt_ctx_free(ctx);
    free(rx);
    free(rg);
    free(got);
    free(ref);
    free(fd);
}

/* RMS_NORM with its weight stores exactly what rms_norm followed by mul_as stores, in F32,
 * F16 and BF16, for every layout; with the gate z, what those and then mul_as by silu(z)
 * store (its backward rule: test_grad_nn's finite differences). */
static void test_rms_norm_mul(void)
{
    const int64_t ne[4] = {37, 5, 3, 2}, nw[4] = {37, 1, 1, 1};
    const int64_t cnt = nn_count(ne);
    static const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    float *rx = nn_alloc(cnt), *rw = nn_alloc(37), *a = nn_alloc(cnt), *b = nn_alloc(cnt);
    int runs = 0;
    for (int t = 0; t < 3; t++)
        for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++)
            for (int nth = 1; nth <= 2; nth++) {
                struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
                struct lt_tensor *x = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, ne);
                struct lt_tensor *w = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, nw);
                nn_fill_rand(x, rx, 2.0f);
                nn_fill_rand(w, rw, 1.5f);
                struct lt_tensor *fused = lt_rms_norm_mul(ctx, x, w, 1e-6f, types[t]);
                struct lt_tensor *two = lt_mul_as(ctx, lt_rms_norm(ctx, x, 1e-6f), w, types[t]);
                CHECK(fused && two && fused->op == LT_OP_RMS_NORM && fused->type == types[t] &&
                          nn_run(ctx, fused, nth) == LT_OK && nn_run(ctx, two, nth) == LT_OK,
                      "rms_norm_mul: %s", lt_last_error());
                if (fused && two) {
                    nn_read(fused, a);
                    nn_read(two, b);
                    CHECK(!memcmp(a, b, sizeof(float) * (size_t)cnt),
                          "rms_norm_mul %s, %s, %d threads: not rms_norm then mul_as",
                          lt_type_name(types[t]), nn_layout_names[lay], nth);
                    runs++;
                }
                /* the gate, in the next layout */
                struct lt_tensor *z =
                    nn_make(ctx, LT_TYPE_F32, (enum nn_layout)((lay + 1) % NN_LAYOUT_COUNT), ne);
                nn_fill_rand(z, rx, 3.0f);
                struct lt_tensor *gated = lt_rms_norm_mul_gated(ctx, x, w, z, 1e-6f, types[t]);
                struct lt_tensor *chain =
                    lt_mul_as(ctx, lt_mul_as(ctx, lt_rms_norm(ctx, x, 1e-6f), w, LT_TYPE_F32),
                              lt_silu(ctx, z), types[t]);
                CHECK(gated && chain && nn_run(ctx, gated, nth) == LT_OK &&
                          nn_run(ctx, chain, nth) == LT_OK,
                      "rms_norm_mul_gated: %s", lt_last_error());
                if (gated && chain) {
                    nn_read(gated, a);
                    nn_read(chain, b);
                    CHECK(!memcmp(a, b, sizeof(float) * (size_t)cnt),
                          "rms_norm_mul_gated %s, %s, %d threads: not the chain",
                          lt_type_name(types[t]), nn_layout_names[lay], nth);
                    runs++;
                }
                lt_ctx_free(ctx);
            }
    printf("rms_norm_mul (and gated): %d runs equal to the chain\n", runs);
    /* ADD_RMS_NORM: the sum and the weighted norm of it, each what lt_add and
     * lt_rms_norm_mul store, for every layout of the two addends */
    const int64_t ne2[4] = {37, 6, 1, 1};
    const int64_t cnt2 = nn_count(ne2);
    int runs2 = 0;
    for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++)
        for (int nth = 1; nth <= 2; nth++) {
            struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
            struct lt_tensor *x = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, ne2);
            struct lt_tensor *u =
                nn_make(ctx, LT_TYPE_F32, (enum nn_layout)((lay + 1) % NN_LAYOUT_COUNT), ne2);
            struct lt_tensor *w = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, nw);
            nn_fill_rand(x, rx, 2.0f);
            nn_fill_rand(u, rx, 1.0f);
            nn_fill_rand(w, rw, 1.5f);
            struct lt_tensor *r = lt_add_rms_norm(ctx, x, u, w, 1e-6f);
            struct lt_tensor *sum = lt_add_rms_norm_sum(ctx, r), *out = lt_add_rms_norm_out(ctx, r);
            struct lt_tensor *sum2 = lt_add(ctx, x, u);
            struct lt_tensor *out2 = lt_rms_norm_mul(ctx, sum2, w, 1e-6f, LT_TYPE_F32);
            CHECK(r && sum && out && out2 && nn_run(ctx, r, nth) == LT_OK &&
                      nn_run(ctx, out2, nth) == LT_OK,
                  "add_rms_norm: %s", lt_last_error());
            if (r && sum && out && out2) {
                nn_read(sum, a);
                nn_read(sum2, b);
                bool same = !memcmp(a, b, sizeof(float) * (size_t)cnt2);
                nn_read(out, a);
                nn_read(out2, b);
                same = same && !memcmp(a, b, sizeof(float) * (size_t)cnt2);
                CHECK(same, "add_rms_norm, %s, %d threads: not add then rms_norm_mul",
                      nn_layout_names[lay], nth);
                runs2 += same;
            }
            lt_ctx_free(ctx);
        }
    printf("add_rms_norm: %d runs equal to add + rms_norm_mul\n", runs2);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 2);
    struct lt_tensor *w7 = lt_set_name(lt_new_tensor_1d(ctx, LT_TYPE_F32, 7), "norm_w");
    CHECK(lt_rms_norm_mul(ctx, x, w7, 1e-6f, LT_TYPE_F32) == NULL &&
              strstr(lt_last_error(), "norm_w") != NULL,
          "a weight of the wrong length: %s", lt_last_error());
    lt_clear_error();
    struct lt_tensor *w8 = lt_new_tensor_1d(ctx, LT_TYPE_F32, 8);
    CHECK(lt_rms_norm_mul(ctx, x, w8, 1e-6f, LT_TYPE_Q8_0) == NULL, "a q8_0 result");
    lt_clear_error();
    CHECK(lt_add_rms_norm(ctx, x, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3), w8, 1e-6f) == NULL,
          "add_rms_norm of two shapes");
    CHECK(lt_add_rms_norm(ctx, x, x, w7, 1e-6f) == NULL && strstr(lt_last_error(), "norm_w"),
          "add_rms_norm with a short weight: %s", lt_last_error());
    lt_clear_error();
    CHECK(lt_add_rms_norm_sum(ctx, x) == NULL, "add_rms_norm_sum of another op");
    lt_clear_error();
    struct lt_tensor *z3 = lt_set_name(lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3), "gate_z");
    CHECK(lt_rms_norm_mul_gated(ctx, x, w8, z3, 1e-6f, LT_TYPE_F32) == NULL &&
              strstr(lt_last_error(), "gate_z") != NULL,
          "a gate of another shape: %s", lt_last_error());
    lt_clear_error();
    lt_ctx_free(ctx);
    free(rx);
    free(rw);
    free(a);
    free(b);
}

/* RMS_NORM_MUL_BACK against loops in double: rows of 64, more of them (70,000) than its
 * partial sums of dw (65,536), so some parts hold two rows; with the gate and without, on 1
 * and 2 threads; dw is the parts' sum. */
static void test_rms_norm_mul_back(void)
{
    const int64_t n = 64, rows = 70000, ne[4] = {n, rows, 1, 1}, nw[4] = {n, 1, 1, 1};
    const int64_t cnt = n * rows;
    float *rx = nn_alloc(cnt), *rg = nn_alloc(cnt), *rz = nn_alloc(cnt), *rw = nn_alloc(n);
    float *out = nn_alloc(2 * cnt + n * rows);
    double *dw = calloc((size_t)n, sizeof(double));
    int runs = 0;
    for (int gated = 0; gated < 2; gated++)
        for (int nth = 1; nth <= 2; nth++) {
            struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 192 << 20});
            struct lt_tensor *x = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, ne);
            struct lt_tensor *g = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, ne);
            struct lt_tensor *z = gated ? nn_make(ctx, LT_TYPE_F32, NN_CONTIG, ne) : NULL;
            struct lt_tensor *w = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, nw);
            nn_fill_rand(x, rx, 2.0f);
            nn_fill_rand(g, rg, 1.0f);
            if (z)
                nn_fill_rand(z, rz, 3.0f);
            nn_fill_rand(w, rw, 1.5f);
            struct lt_tensor *r = lt_rms_norm_mul_back(ctx, g, x, w, z, 1e-6f);
            const int64_t parts = r ? lt_rms_norm_mul_back_parts(x) : 0;
            CHECK(r && parts == 65536 && r->ne[1] == rows * (gated ? 2 : 1) + parts &&
                      nn_run(ctx, r, nth) == LT_OK,
                  "rms_norm_mul_back: %s", lt_last_error());
            if (!r) {
                lt_ctx_free(ctx);
                continue;
            }
            nn_read(r, out);
            double worst = 0;
            for (int64_t i = 0; i < n; i++)
                dw[i] = 0;
            for (int64_t row = 0; row < rows; row++) {
                const float *xr = rx + row * n, *gr = rg + row * n, *zr = rz + row * n;
                double ss = 0, dot = 0;
                for (int64_t i = 0; i < n; i++)
                    ss += (double)xr[i] * xr[i];
                const double f = 1.0 / sqrt(ss / n + 1e-6);
                for (int64_t i = 0; i < n; i++) {
                    const double sg = gated ? 1.0 / (1.0 + exp(-(double)zr[i])) : 1.0;
                    const double s = gated ? zr[i] * sg : 1.0, h = (double)gr[i] * rw[i] * s;
                    dot += h * xr[i];
                    dw[i] += (double)gr[i] * xr[i] * f * s;
                }
                dot /= n;
                for (int64_t i = 0; i < n; i++) {
                    const double sg = gated ? 1.0 / (1.0 + exp(-(double)zr[i])) : 1.0;
                    const double s = gated ? zr[i] * sg : 1.0, h = (double)gr[i] * rw[i] * s;
                    const double dx = f * h - f * f * f * dot * xr[i];
                    double e = fabs(out[row * n + i] - dx) / (1.0 + fabs(dx));
                    if (gated) {
                        const double dz =
                            (double)gr[i] * xr[i] * f * rw[i] * sg * (1.0 + zr[i] * (1.0 - sg));
                        const double ez = fabs(out[(rows + row) * n + i] - dz) / (1.0 + fabs(dz));
                        e = ez > e ? ez : e;
                    }
                    worst = e > worst ? e : worst;
                }
            }
            const float *pw = out + (gated ? 2 : 1) * cnt;
            for (int64_t i = 0; i < n; i++) {
                double sum = 0;
                for (int64_t q = 0; q < parts; q++)
                    sum += pw[q * n + i];
                const double e = fabs(sum - dw[i]) / (1.0 + fabs(dw[i]));
                worst = e > worst ? e : worst;
            }
            CHECK(worst < 1e-5, "rms_norm_mul_back%s, %d threads: worst error %g",
                  gated ? " gated" : "", nth, worst);
            runs++;
            lt_ctx_free(ctx);
        }
    printf("rms_norm_mul_back: %d runs against double loops (70,000 rows, 65,536 parts)\n", runs);
    free(rx);
    free(rg);
    free(rz);
    free(rw);
    free(out);
    free(dw);
}

/* ---------------- attention of one decode token over the cache ---------------- */

/* ATTN_DECODE against plain loops in double: caches of 3 slots (F32 and F16), 3 sequences
 * at slots {2, 0, 1} and positions {4, 0, 6}, 4 query heads over 2 KV heads, with and
 * without a gate, q in every layout. */
static void test_attn_decode(void)
{
    enum { D = 8, H = 4, HKV = 2, NCTX = 9, NSLOT = 3, S = 3 };
    const int32_t ids[S] = {2, 0, 1}, pos[S] = {4, 0, 6};
    const int64_t qne[4] = {D, H, S, 1}, cne[4] = {D, HKV, NCTX, NSLOT};
    float qv[D * H * S], gv[D * H * S], kv[D * HKV * NCTX * NSLOT], vv[D * HKV * NCTX * NSLOT];
    float got[D * H * S], ref[D * H * S];
    int runs = 0;
    for (int f16 = 0; f16 < 2; f16++)
        for (int gated = 0; gated < 2; gated++)
            for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++) {
                struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
                enum lt_type ct = f16 ? LT_TYPE_F16 : LT_TYPE_F32;
                struct lt_tensor *q = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, qne);
                struct lt_tensor *g = nn_make(ctx, LT_TYPE_F32, NN_TRANSPOSED, qne);
                struct lt_tensor *k = nn_make(ctx, ct, NN_CONTIG, cne);
                struct lt_tensor *v = nn_make(ctx, ct, NN_CONTIG, cne);
                struct lt_tensor *ti = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
                struct lt_tensor *tp = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
                memcpy(ti->data, ids, sizeof(ids));
                memcpy(tp->data, pos, sizeof(pos));
                nn_fill_rand(q, qv, 1.0f);
                nn_fill_rand(g, gv, 2.0f);
                nn_fill_rand(k, kv, 1.0f);
                nn_fill_rand(v, vv, 1.0f);
                const float scale = 0.35f;
                struct lt_tensor *o =
                    lt_attn_decode(ctx, q, k, v, ti, tp, gated ? g : NULL, scale, NULL, NULL);
                CHECK(o && nn_run(ctx, o, 1 + lay % 2) == LT_OK, "attn_decode: %s", lt_last_error());
                if (!o) {
                    lt_ctx_free(ctx);
                    continue;
                }
                nn_read(o, got);
                for (int sq = 0; sq < S; sq++)
                    for (int h = 0; h < H; h++) {
                        const int kh = h / (H / HKV), n = pos[sq] + 1, sl = ids[sq];
                        double sc[NCTX], mx = -1e300, sum = 0;
                        for (int j = 0; j < n; j++) {
                            double dot = 0;
                            for (int d = 0; d < D; d++)
                                dot += (double)qv[nn_idx(qne, d, h, sq, 0)] *
                                       kv[nn_idx(cne, d, kh, j, sl)];
                            sc[j] = dot * scale;
                            mx = sc[j] > mx ? sc[j] : mx;
                        }
                        for (int j = 0; j < n; j++)
                            sum += (sc[j] = exp(sc[j] - mx));
                        for (int d = 0; d < D; d++) {
                            double od = 0;
                            for (int j = 0; j < n; j++)
                                od += sc[j] / sum * vv[nn_idx(cne, d, kh, j, sl)];
                            if (gated)
                                od /= 1.0 + exp(-(double)gv[nn_idx(qne, d, h, sq, 0)]);
                            ref[(sq * H + h) * D + d] = (float)od;
                        }
                    }
                double e = check_max_ratio(got, ref, D * H * S, 1e-6, 1e-5, NULL);
                CHECK(e <= 1.0, "attn_decode %s cache, %s, q %s: ratio %g", f16 ? "f16" : "f32",
                      gated ? "gated" : "no gate", nn_layout_names[lay], e);
                runs += e <= 1.0;
                lt_ctx_free(ctx);
            }
    printf("attn_decode: %d runs agree with the reference\n", runs);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *q = lt_set_name(lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 4, 2), "q_bad");
    struct lt_tensor *k3 = lt_new_tensor_4d(ctx, LT_TYPE_F32, 8, 3, 9, 2);
    struct lt_tensor *i2 = lt_new_tensor_1d(ctx, LT_TYPE_I32, 2);
    CHECK(lt_attn_decode(ctx, q, k3, k3, i2, i2, NULL, 1.0f, NULL, NULL) == NULL &&
              strstr(lt_last_error(), "q_bad"),
          "3 KV heads for 4 query heads: %s", lt_last_error());
    lt_clear_error();
    lt_ctx_free(ctx);
}

/* ATTN_DECODE given this token's keys and values (k_new, v_new) against SET_ROWS' work done
 * by hand and then ATTN_DECODE without them: the same result and the same caches, bit for
 * bit (F32 and F16 caches, 1 and 2 threads, a sequence whose id is outside the caches); and
 * the refusals: k_new alone, a broadcast cache */
static void test_attn_decode_store(void)
{
    enum { D = 8, H = 4, HKV = 2, NCTX = 9, NSLOT = 3, S = 3 };
    const int32_t ids[S] = {2, 0, 5}, pos[S] = {4, 0, 6}; /* id 5: outside the caches */
    const int64_t qne[4] = {D, H, S, 1}, cne[4] = {D, HKV, NCTX, NSLOT}, nne[4] = {D, HKV, 1, S};
    static float qv[D * H * S], kv[D * HKV * NCTX * NSLOT], vv[D * HKV * NCTX * NSLOT],
        knv[D * HKV * S], vnv[D * HKV * S];
    int same = 0;
    for (int f16 = 0; f16 < 2; f16++)
        for (int nth = 1; nth <= 2; nth++) {
            struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
            enum lt_type ct = f16 ? LT_TYPE_F16 : LT_TYPE_F32;
            struct lt_tensor *q = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, qne);
            struct lt_tensor *ka = nn_make(ctx, ct, NN_CONTIG, cne),
                             *va = nn_make(ctx, ct, NN_CONTIG, cne);
            struct lt_tensor *kb = nn_make(ctx, ct, NN_CONTIG, cne),
                             *vb = nn_make(ctx, ct, NN_CONTIG, cne);
            struct lt_tensor *kn = nn_make(ctx, LT_TYPE_F32, NN_SLICED, nne);
            struct lt_tensor *vn = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, nne);
            struct lt_tensor *ti = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
            struct lt_tensor *tp = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
            memcpy(ti->data, ids, sizeof(ids));
            memcpy(tp->data, pos, sizeof(pos));
            nn_fill_rand(q, qv, 1.0f);
            nn_fill_rand(ka, kv, 1.0f);
            nn_fill_rand(va, vv, 1.0f);
            nn_fill_rand(kn, knv, 1.0f);
            nn_fill_rand(vn, vnv, 1.0f);
            memcpy(kb->data, ka->data, lt_nbytes(ka));
            memcpy(vb->data, va->data, lt_nbytes(va));
            for (int s = 0; s < S; s++) /* what SET_ROWS at (pos, slot) stores */
                for (int h = 0; ids[s] < NSLOT && h < HKV; h++)
                    for (int d = 0; d < D; d++) {
                        lt_set_f32_nd(kb, d, h, pos[s], ids[s], lt_get_f32_nd(kn, d, h, 0, s));
                        lt_set_f32_nd(vb, d, h, pos[s], ids[s], lt_get_f32_nd(vn, d, h, 0, s));
                    }
            struct lt_tensor *oa = lt_attn_decode(ctx, q, ka, va, ti, tp, NULL, 0.35f, kn, vn);
            struct lt_tensor *ob = lt_attn_decode(ctx, q, kb, vb, ti, tp, NULL, 0.35f, NULL, NULL);
            CHECK(oa && ob && nn_run(ctx, oa, nth) == LT_OK && nn_run(ctx, ob, nth) == LT_OK, "%s",
                  lt_last_error());
            const bool eq = oa && ob && memcmp(oa->data, ob->data, lt_nbytes(oa)) == 0 &&
                            memcmp(ka->data, kb->data, lt_nbytes(ka)) == 0 &&
                            memcmp(va->data, vb->data, lt_nbytes(va)) == 0;
            CHECK(eq,
                  "attn_decode storing k_new, v_new (%s cache, %d threads): result or caches "
                  "differ from SET_ROWS then attn_decode",
                  f16 ? "f16" : "f32", nth);
            same += eq;
            lt_ctx_free(ctx);
        }
    printf("attn_decode storing this token's keys and values: %d of 4 runs equal SET_ROWS then "
           "attn_decode, bit for bit\n",
           same);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *q = lt_new_tensor_3d(ctx, LT_TYPE_F32, D, H, S);
    struct lt_tensor *k = lt_new_tensor_4d(ctx, LT_TYPE_F32, D, HKV, NCTX, NSLOT);
    struct lt_tensor *one = lt_new_tensor_3d(ctx, LT_TYPE_F32, D, HKV, NCTX);
    struct lt_tensor *kbc = lt_view_4d(ctx, one, D, HKV, NCTX, NSLOT, one->nb[1], one->nb[2], 0, 0);
    struct lt_tensor *kn = lt_new_tensor_4d(ctx, LT_TYPE_F32, D, HKV, 1, S);
    struct lt_tensor *i3 = lt_new_tensor_1d(ctx, LT_TYPE_I32, S);
    CHECK(lt_attn_decode(ctx, q, k, k, i3, i3, NULL, 1.0f, kn, NULL) == NULL &&
              strstr(lt_last_error(), "k_new and v_new come together"),
          "k_new alone: %s", lt_last_error());
    CHECK(kbc && lt_attn_decode(ctx, q, kbc, kbc, i3, i3, NULL, 1.0f, kn, kn) == NULL &&
              strstr(lt_last_error(), "share memory"),
          "a broadcast cache written in place: %s", lt_last_error());
    lt_clear_error();
    lt_ctx_free(ctx);
}

/* FLASH_ATTN against the chain it stands for (mul_mat, soft_max, mul_mat, the merge of the
 * heads), on the same sources: grouped heads, a cache longer than the queries (causal), a
 * mask with -inf entries and a query with every key dropped, two sequences, q in every
 * layout */
static void test_flash_attn_chain(void)
{
    enum { D = 8, H = 4, HKV = 2, T = 5, NK = 7, S = 2 };
    const int64_t qne[4] = {D, H, T, S}, kne[4] = {D, HKV, NK, S}, mne[4] = {NK, T, 1, S};
    float qv[D * H * T * S], kv[D * HKV * NK * S], vv[D * HKV * NK * S];
    float got[D * H * T * S], ref[D * H * T * S];
    int runs = 0;
    /* masked 2: packed examples by positions, against the chain's mask made of them */
    static const int32_t pv[S][T] = {{0, 1, 0, 1, 2}, {0, 1, 2, 3, 0}};
    for (int masked = 0; masked < 3; masked++)
        for (int causal = 0; causal < 2; causal++)
            for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++) {
                struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
                struct lt_tensor *q = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, qne);
                struct lt_tensor *k = nn_make(ctx, LT_TYPE_F32, NN_PERMUTED, kne);
                struct lt_tensor *v = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, kne);
                struct lt_tensor *m = lt_new_tensor_4d(ctx, LT_TYPE_F32, NK, T, 1, S);
                nn_fill_rand(q, qv, 1.5f);
                nn_fill_rand(k, kv, 1.5f);
                nn_fill_rand(v, vv, 1.0f);
                float *mv = m->data;
                for (int64_t i = 0; i < nn_count(mne); i++) {
                    const int64_t j = i % NK, t = i / NK % T, sq = i / (NK * T);
                    mv[i] = masked == 2 ? (j < t + (NK - T) - pv[sq][t] ? -INFINITY : 0.0f)
                            : i / NK == 3 || i % 4 == 1 ? -INFINITY
                                                        : 0.3f * nn_rand();
                }
                struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, T * S);
                memcpy(pos->data, pv, sizeof(pv));
                struct lt_tensor *mask = masked ? m : NULL;
                const float scale = 0.4f;
                struct lt_tensor *kq =
                    lt_mul_mat(ctx, lt_permute(ctx, k, 0, 2, 1, 3), lt_permute(ctx, q, 0, 2, 1, 3));
                struct lt_tensor *p = lt_soft_max(ctx, kq, mask, scale, causal);
                struct lt_tensor *o = lt_mul_mat(ctx, lt_permute(ctx, v, 1, 2, 0, 3), p);
                struct lt_tensor *chain = lt_cont(ctx, lt_permute(ctx, o, 0, 2, 1, 3));
                struct lt_tensor *fa =
                    lt_flash_attn(ctx, q, k, v, masked == 2 ? pos : mask, scale, causal);
                CHECK(chain && fa && nn_run(ctx, chain, 1) == LT_OK &&
                          nn_run(ctx, fa, 1 + lay % 2) == LT_OK,
                      "flash_attn: %s", lt_last_error());
                if (chain && fa) {
                    nn_read(chain, ref);
                    nn_read(fa, got);
                    double e = check_max_ratio(got, ref, D * H * T * S, 1e-6, 1e-5, NULL);
                    CHECK(e <= 1.0, "flash_attn%s%s, q %s: ratio %g to the chain",
                          masked == 2 ? " positions"
                          : masked    ? " masked"
                                      : "",
                          causal ? " causal" : "", nn_layout_names[lay], e);
                    runs += e <= 1.0;
                }
                lt_ctx_free(ctx);
            }
    printf("flash_attn: %d runs agree with the chain\n", runs);
    /* refusals name the tensor */
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *q = lt_set_name(lt_new_tensor_4d(ctx, LT_TYPE_F32, 8, 4, 5, 2), "q_bad");
    struct lt_tensor *k3 = lt_new_tensor_4d(ctx, LT_TYPE_F32, 8, 3, 5, 2);
    CHECK(lt_flash_attn(ctx, q, k3, k3, NULL, 1.0f, true) == NULL &&
              strstr(lt_last_error(), "q_bad"),
          "3 key heads for 4 query heads: %s", lt_last_error());
    lt_clear_error();
    lt_ctx_free(ctx);
}

/* ---------------- rope ---------------- */

/* y = rope(x) for one row of hd, Hugging Face's float32 rounding of the angle */
static void ref_rope_row(const double *x, int64_t hd, int n_dims, int mode, float base, int32_t pos,
                         bool exact_angle, bool inverse, double *y)
{
    for (int64_t i = 0; i < hd; i++)
        y[i] = x[i];
    for (int j = 0; j < n_dims / 2; j++) {
        double angle;
        if (exact_angle) {
            angle = pos * pow(base, -2.0 * j / n_dims);
        } else {
            float inv = 1.0f / (float)pow(base, (double)((float)(2 * j) / (float)n_dims));
            angle = (double)((float)pos * inv);
        }
        double c = cos(angle), s = inverse ? -sin(angle) : sin(angle);
        int i0 = mode == LT_ROPE_NEOX ? j : 2 * j, i1 = mode == LT_ROPE_NEOX ? j + n_dims / 2 : 2 * j + 1;
        y[i0] = x[i0] * c - x[i1] * s;
        y[i1] = x[i0] * s + x[i1] * c;
    }
}

static void test_rope(void)
{
    const int64_t ne[4] = {10, 3, 5, 2};
    const int64_t hd = ne[0], cnt = nn_count(ne);
    const int32_t positions[5] = {0, 1, 7, 1000, 30000};
    float *rx = nn_alloc(cnt), *rg = nn_alloc(cnt), *got = nn_alloc(cnt), *ref = nn_alloc(cnt);
    float *exact = nn_alloc(cnt), *back = nn_alloc(cnt), *tol = nn_alloc(cnt);
    int runs = 0, bad = 0;
    for (int mi = 0; mi < 2; mi++)
        for (int nd = 6; nd <= 10; nd += 4)
            for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++)
                for (int nth = 1; nth <= 2; nth++) {
                    int mode = mi ? LT_ROPE_NEOX : LT_ROPE_NORMAL;
                    float base = nd == 6 ? 10000.0f : 1000000.0f;
                    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
                    struct lt_tensor *x = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, ne);
                    struct lt_tensor *g = nn_make(
                        ctx, LT_TYPE_F32, (enum nn_layout)((lay + 2) % NN_LAYOUT_COUNT), ne);
                    struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, ne[2]);
                    memcpy(pos->data, positions, sizeof(positions));
                    nn_fill_rand(x, rx, 1.0f);
                    nn_fill_rand(g, rg, 1.0f);
                    struct lt_tensor *y = lt_rope(ctx, x, pos, nd, (enum lt_rope_mode)mode, base);
                    struct lt_tensor *dx =
                        lt_rope_back(ctx, g, pos, nd, (enum lt_rope_mode)mode, base);
                    CHECK(y && dx && nn_run(ctx, y, nth) == LT_OK && nn_run(ctx, dx, nth) == LT_OK,
                          "%s", lt_last_error());
                    if (!y || !dx)
                        continue;
                    runs++;
                    double dot_y_g = 0, dot_x_dx = 0, dot_abs = 0;
                    for (int64_t r = 0; r < cnt / hd; r++) {
                        int32_t p = positions[(r / ne[1]) % ne[2]];
                        double xd[16], gd[16], yd[16], ed[16], bd[16];
                        for (int64_t i = 0; i < hd; i++) {
                            xd[i] = rx[r * hd + i];
                            gd[i] = rg[r * hd + i];
                        }
                        ref_rope_row(xd, hd, nd, mode, base, p, false, false, yd);
                        ref_rope_row(xd, hd, nd, mode, base, p, true, false, ed);
                        ref_rope_row(gd, hd, nd, mode, base, p, false, true, bd);
                        for (int64_t i = 0; i < hd; i++) {
                            ref[r * hd + i] = (float)yd[i];
                            exact[r * hd + i] = (float)ed[i];
                            back[r * hd + i] = (float)bd[i];
                            /* the float32 angle is off by up to ~pos * 2^-24 rad */
                            tol[r * hd + i] = 2e-6f + (float)p * 2.5e-7f;
                        }
                    }
                    nn_read(y, got);
                    double e1 = check_max_ratio(got, ref, (long)cnt, 2e-6, 1e-6, NULL);
                    int beyond = 0, passthrough_bad = 0;
                    for (int64_t i = 0; i < cnt; i++) {
                        beyond += fabsf(got[i] - exact[i]) > tol[i];
                        if (i % hd >= nd)
                            passthrough_bad += got[i] != rx[i];
                        dot_y_g += (double)got[i] * rg[i];
                        dot_abs += fabs((double)got[i] * rg[i]);
                    }
                    nn_read(dx, got);
                    double e2 = check_max_ratio(got, back, (long)cnt, 2e-6, 1e-6, NULL);
                    for (int64_t i = 0; i < cnt; i++)
                        dot_x_dx += (double)rx[i] * got[i];
                    /* rope_back is the adjoint: <rope(x), g> = <x, rope_back(g)> */
                    double adj = fabs(dot_y_g - dot_x_dx) / (1e-6 + dot_abs);
                    CHECK(e1 <= 1.0 && beyond == 0 && passthrough_bad == 0 && e2 <= 1.0 && adj < 1e-5,
                          "rope %s n_dims %d, %s, %d threads: fwd %g, %d past the float64 "
                          "bound, %d pass-through changed, back %g, adjoint %g",
                          mode ? "neox" : "normal", nd, nn_layout_names[lay], nth, e1, beyond,
                          passthrough_bad, e2, adj);
                    bad += !(e1 <= 1.0 && beyond == 0 && passthrough_bad == 0 && e2 <= 1.0 &&
                             adj < 1e-5);
                    lt_ctx_free(ctx);
                }
    printf("rope: %d runs, %d bad\n", runs, bad);

    /* rope_back against central differences of L = sum g * rope(x), on one small case */
    {
        struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
        const int64_t sne[4] = {8, 2, 3, 1};
        const int32_t sp[3] = {2, 5, 11};
        float sx[48], sg[48], sdx[48], sfd[48];
        struct lt_tensor *g = nn_make(ctx, LT_TYPE_F32, NN_TRANSPOSED, sne);
        struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, 3);
        memcpy(pos->data, sp, sizeof(sp));
        nn_fill_rand(g, sg, 1.0f);
        for (int i = 0; i < 48; i++)
            sx[i] = nn_rand();
        struct lt_tensor *dx = lt_rope_back(ctx, g, pos, 6, LT_ROPE_NEOX, 100.0f);
        CHECK(dx && nn_run(ctx, dx, 2) == LT_OK);
        nn_read(dx, sdx);
        for (int r = 0; r < 6; r++)
            for (int i = 0; i < 8; i++) {
                double xd[8], yd[8], lp = 0, lm = 0;
                for (int k = 0; k < 8; k++)
                    xd[k] = sx[r * 8 + k];
                xd[i] += FD_H;
                ref_rope_row(xd, 8, 6, LT_ROPE_NEOX, 100.0f, sp[r / 2], false, false, yd);
                for (int k = 0; k < 8; k++)
                    lp += sg[r * 8 + k] * yd[k];
                xd[i] -= 2 * FD_H;
                ref_rope_row(xd, 8, 6, LT_ROPE_NEOX, 100.0f, sp[r / 2], false, false, yd);
                for (int k = 0; k < 8; k++)
                    lm += sg[r * 8 + k] * yd[k];
                sfd[r * 8 + i] = (float)((lp - lm) / (2 * FD_H));
            }
        double e = check_max_ratio(sdx, sfd, 48, 1e-5, 1e-3, NULL);
        CHECK(e <= 1.0, "rope_back vs finite differences: ratio %g", e);
        lt_ctx_free(ctx);
    }

    /* refusals */
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 2, 4);
    struct lt_tensor *p4 = lt_new_tensor_1d(ctx, LT_TYPE_I32, 4);
    struct lt_tensor *p3 = lt_new_tensor_1d(ctx, LT_TYPE_I32, 3);
    CHECK(lt_rope(ctx, x, p3, 8, LT_ROPE_NEOX, 1e4f) == NULL, "positions per token");
    CHECK(lt_rope(ctx, x, p4, 7, LT_ROPE_NEOX, 1e4f) == NULL, "odd n_dims");
    CHECK(lt_rope(ctx, x, p4, 10, LT_ROPE_NEOX, 1e4f) == NULL, "n_dims > head_dim");
    CHECK(lt_rope(ctx, x, p4, 8, (enum lt_rope_mode)1, 1e4f) == NULL, "unknown mode");
    CHECK(lt_rope(ctx, x, p4, 8, LT_ROPE_NORMAL, 1e4f) != NULL);
    lt_ctx_free(ctx);
    free(rx);
    free(rg);
    free(got);
    free(ref);
    free(exact);
    free(back);
    free(tol);
}

/* ---------------- softmax ---------------- */

/* one row: y = softmax(x * scale + m) over keys [0, keep); dropped keys 0; all dropped: 0 */
static void ref_softmax_row(const double *x, const float *m, int64_t n, int64_t keep, double scale,
                            double *y)
{
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        y[i] = i < keep ? x[i] * scale + (m ? m[i] : 0.0) : -INFINITY;
        mx = y[i] > mx ? y[i] : mx;
    }
    if (mx == -INFINITY) {
        for (int64_t i = 0; i < n; i++)
            y[i] = 0;
        return;
    }
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += y[i] = exp(y[i] - mx);
    for (int64_t i = 0; i < n; i++)
        y[i] /= s;
}

/* RMS_NORM_ROPE: lt_rms_norm_rope equals lt_rope of lt_rms_norm_mul bit for bit (the CPU
 * runs the two kernels), over layouts of x (contiguous, transposed, permuted, sliced, and a
 * query's view: every other head_dim of a row), NEOX and NORMAL pairs, all and part of the
 * head rotated, 1 and 2 threads; and its refusals */
static void test_rms_norm_rope(void)
{
    const int64_t ne[4] = {12, 3, 4, 2};
    const int64_t cnt = nn_count(ne);
    const int32_t positions[4] = {0, 5, 999, 31000};
    float *rx = nn_alloc(cnt), *rw = nn_alloc(ne[0]), *want = nn_alloc(cnt), *got = nn_alloc(cnt);
    int runs = 0, bad = 0;
    for (int mi = 0; mi < 2; mi++)
        for (int nd = 8; nd <= 12; nd += 4)
            for (int lay = 0; lay <= NN_LAYOUT_COUNT; lay++)
                for (int nth = 1; nth <= 2; nth++, runs++) {
                    const enum lt_rope_mode mode = mi ? LT_ROPE_NEOX : LT_ROPE_NORMAL;
                    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
                    struct lt_tensor *x;
                    if (lay == NN_LAYOUT_COUNT) { /* the query half of [q, gate] rows */
                        struct lt_tensor *qg =
                            lt_new_tensor_4d(ctx, LT_TYPE_F32, 2 * ne[0], ne[1], ne[2], ne[3]);
                        x = lt_view_4d(ctx, qg, ne[0], ne[1], ne[2], ne[3], qg->nb[1], qg->nb[2],
                                       qg->nb[3], 0);
                    } else {
                        x = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, ne);
                    }
                    struct lt_tensor *w = lt_new_tensor_1d(ctx, LT_TYPE_F32, ne[0]);
                    struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, ne[2]);
                    memcpy(pos->data, positions, sizeof(positions));
                    nn_fill_rand(x, rx, 3.0f);
                    nn_fill_rand(w, rw, 1.0f);
                    struct lt_tensor *y =
                        lt_rms_norm_rope(ctx, x, w, 1e-6f, pos, nd, mode, 10000.0f);
                    struct lt_tensor *n = lt_rms_norm_mul(ctx, x, w, 1e-6f, LT_TYPE_F32);
                    struct lt_tensor *chain = n ? lt_rope(ctx, n, pos, nd, mode, 10000.0f) : NULL;
                    const bool ok = y && chain && y->op == LT_OP_RMS_NORM_ROPE &&
                                    nn_run(ctx, y, nth) == LT_OK &&
                                    nn_run(ctx, chain, nth) == LT_OK;
                    CHECK(ok, "rms_norm_rope: %s", lt_last_error());
                    if (ok) {
                        nn_read(y, got);
                        nn_read(chain, want);
                        const bool same = memcmp(got, want, sizeof(float) * (size_t)cnt) == 0;
                        CHECK(same,
                              "rms_norm_rope mode %d n_dims %d layout %d, %d threads: not "
                              "the chain's values",
                              (int)mode, nd, lay, nth);
                        bad += !same;
                    } else {
                        bad++;
                    }
                    lt_ctx_free(ctx);
                }
    printf("rms_norm_rope: %d runs, %d bad\n", runs, bad);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 2, 3);
    struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, 3);
    CHECK(lt_rms_norm_rope(ctx, x, lt_new_tensor_1d(ctx, LT_TYPE_F32, 7), 1e-6f, pos, 8,
                           LT_ROPE_NEOX, 1e4f) == NULL,
          "a weight of another length");
    CHECK(lt_rms_norm_rope(ctx, x, lt_new_tensor_1d(ctx, LT_TYPE_F32, 8), 1e-6f,
                           lt_new_tensor_1d(ctx, LT_TYPE_I32, 2), 8, LT_ROPE_NEOX, 1e4f) == NULL,
          "positions of another count");
    CHECK(lt_rms_norm_rope(ctx, x, lt_new_tensor_1d(ctx, LT_TYPE_F32, 8), 1e-6f, pos, 9,
                           LT_ROPE_NEOX, 1e4f) == NULL,
          "an odd n_dims");
    lt_ctx_free(ctx);
    free(rx);
    free(rw);
    free(want);
    free(got);
}

static void test_softmax(void)
{
    const int64_t ne[4] = {11, 7, 4, 2}, mne[4] = {11, 7, 2, 1};
    const int64_t n = ne[0], cnt = nn_count(ne), mcnt = nn_count(mne);
    const float scale = 0.37f;
    float *rx = nn_alloc(cnt), *got = nn_alloc(cnt), *ref = nn_alloc(cnt), *rm = nn_alloc(mcnt);
    int runs = 0, bad = 0;
    for (int use_mask = 0; use_mask <= 1; use_mask++)
        for (int causal = 0; causal <= 1; causal++)
            for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++)
                for (int nth = 1; nth <= 2; nth++) {
                    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
                    struct lt_tensor *x = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, ne);
                    nn_fill_rand(x, rx, 4.0f);
                    struct lt_tensor *mask = NULL;
                    if (use_mask) {
                        mask = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)((lay + 3) % 4), mne);
                        for (int64_t i = 0; i < mcnt; i++) {
                            float u = nn_rand();
                            rm[i] = u < -0.6f ? -INFINITY : u;
                            if (i / n == 3) /* row 3 of head 0: every key masked */
                                rm[i] = -INFINITY;
                        }
                        nn_fill_values(mask, rm);
                    }
                    struct lt_tensor *y = lt_soft_max(ctx, x, mask, scale, causal);
                    CHECK(y && nn_run(ctx, y, nth) == LT_OK, "%s", lt_last_error());
                    if (!y)
                        continue;
                    runs++;
                    int nonzero_dropped = 0;
                    nn_read(y, got);
                    for (int64_t r = 0; r < cnt / n; r++) {
                        int64_t i1 = r % ne[1], i2 = (r / ne[1]) % ne[2], i3 = r / (ne[1] * ne[2]);
                        int64_t keep = causal ? i1 + (ne[0] - ne[1]) + 1 : n;
                        const float *m =
                            use_mask ? rm + nn_idx(mne, 0, i1, i2 % mne[2], i3 % mne[3]) : NULL;
                        double xd[16], yd[16];
                        for (int64_t i = 0; i < n; i++)
                            xd[i] = rx[r * n + i];
                        ref_softmax_row(xd, m, n, keep, scale, yd);
                        for (int64_t i = 0; i < n; i++) {
                            ref[r * n + i] = (float)yd[i];
                            bool dropped = i >= keep || (m && m[i] == -INFINITY);
                            nonzero_dropped += dropped && got[r * n + i] != 0.0f;
                        }
                    }
                    double e = check_max_ratio(got, ref, (long)cnt, 1e-7, 1e-5, NULL);
                    CHECK(e <= 1.0 && nonzero_dropped == 0,
                          "softmax mask %d causal %d, %s, %d threads: ratio %g, %d dropped "
                          "keys not 0",
                          use_mask, causal, nn_layout_names[lay], nth, e, nonzero_dropped);
                    bad += !(e <= 1.0 && nonzero_dropped == 0);
                    lt_ctx_free(ctx);
                }
    printf("softmax: %d runs, %d bad\n", runs, bad);

    /* backward: closed form and finite differences, d/d(input of the softmax) */
    runs = bad = 0;
    float *ry = nn_alloc(cnt), *rg = nn_alloc(cnt), *fd = nn_alloc(cnt);
    for (int lay = 0; lay < NN_LAYOUT_COUNT; lay++)
        for (int nth = 1; nth <= 2; nth++) {
            struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
            struct lt_tensor *g = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lay, ne);
            struct lt_tensor *yv = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)((lay + 1) % 4), ne);
            nn_fill_rand(g, rg, 1.0f);
            for (int64_t i = 0; i < cnt; i++)
                rx[i] = 3.0f * nn_rand();
            for (int64_t r = 0; r < cnt / n; r++) {
                double xd[16], yd[16];
                for (int64_t i = 0; i < n; i++)
                    xd[i] = rx[r * n + i];
                ref_softmax_row(xd, NULL, n, n, 1.0, yd);
                for (int64_t i = 0; i < n; i++)
                    ry[r * n + i] = (float)yd[i];
            }
            nn_fill_values(yv, ry);
            struct lt_tensor *dx = lt_soft_max_back(ctx, g, yv);
            CHECK(dx && nn_run(ctx, dx, nth) == LT_OK, "%s", lt_last_error());
            if (!dx)
                continue;
            runs++;
            for (int64_t r = 0; r < cnt / n; r++) {
                double dot = 0, xd[16], yd[16];
                for (int64_t i = 0; i < n; i++)
                    dot += (double)rg[r * n + i] * ry[r * n + i];
                for (int64_t i = 0; i < n; i++) {
                    ref[r * n + i] = (float)(ry[r * n + i] * (rg[r * n + i] - dot));
                    for (int64_t k = 0; k < n; k++)
                        xd[k] = rx[r * n + k];
                    double lp = 0, lm = 0;
                    xd[i] += FD_H;
                    ref_softmax_row(xd, NULL, n, n, 1.0, yd);
                    for (int64_t k = 0; k < n; k++)
                        lp += rg[r * n + k] * yd[k];
                    xd[i] -= 2 * FD_H;
                    ref_softmax_row(xd, NULL, n, n, 1.0, yd);
                    for (int64_t k = 0; k < n; k++)
                        lm += rg[r * n + k] * yd[k];
                    fd[r * n + i] = (float)((lp - lm) / (2 * FD_H));
                }
            }
            nn_read(dx, got);
            double e1 = check_max_ratio(got, ref, (long)cnt, 1e-7, 1e-5, NULL);
            double e2 = check_max_ratio(got, fd, (long)cnt, 1e-6, 1e-3, NULL);
            CHECK(e1 <= 1.0 && e2 <= 1.0, "softmax_back %s, %d threads: ratio %g, fd %g",
                  nn_layout_names[lay], nth, e1, e2);
            bad += !(e1 <= 1.0 && e2 <= 1.0);
            lt_ctx_free(ctx);
        }
    printf("softmax_back: %d runs, %d bad\n", runs, bad);

    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_4d(ctx, LT_TYPE_F32, 8, 4, 6, 1);
    CHECK(lt_soft_max(ctx, x, lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 4, 4), 1, false) == NULL,
          "4 mask heads do not divide 6");
    CHECK(lt_soft_max(ctx, x, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3), 1, false) == NULL,
          "mask rows differ");
    CHECK(lt_soft_max(ctx, x, lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 4, 3), 1, true) != NULL);
    lt_ctx_free(ctx);
    free(rx);
    free(got);
    free(ref);
    free(rm);
    free(ry);
    free(rg);
    free(fd);
}

/* ---------------- cross-entropy ---------------- */

enum { CE_V = 29, CE_N = 7 };

/* mean over unmasked rows of logsumexp(x) - x[label]; logits dense [V, N] in double */
static double ref_ce(const double *x, const int32_t *labels)
{
    double total = 0;
    int valid = 0;
    for (int n = 0; n < CE_N; n++) {
        if (labels[n] < 0)
            continue;
        const double *row = x + n * CE_V;
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < CE_V; i++)
            mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < CE_V; i++)
            s += exp(row[i] - mx);
        total += mx + log(s) - row[labels[n]];
        valid++;
    }
    return valid ? total / valid : 0.0;
}

/* logits [V, N] in one of four layouts: contiguous, transposed, sliced, and every other
 * element of a larger tensor (neither stride is the element size) */
static struct lt_tensor *ce_logits(struct lt_ctx *ctx, int lay)
{
    const int64_t ne[4] = {CE_V, CE_N, 1, 1};
    if (lay != 2)
        return nn_make(ctx, LT_TYPE_F32, (enum nn_layout)(lay == 3 ? NN_SLICED : lay), ne);
    struct lt_tensor *s = lt_new_tensor_3d(ctx, LT_TYPE_F32, 2, CE_V, CE_N);
    nn_fill_nan(s);
    struct lt_tensor *p = lt_permute(ctx, s, 2, 0, 1, 3); /* [V, N, 2], nb0 = 8 */
    return lt_view_2d(ctx, p, CE_V, CE_N, p->nb[1], sizeof(float));
}

static const char *const ce_layout_names[] = {"contiguous", "transposed", "strided", "sliced"};

static void test_cross_entropy(void)
{
    const int32_t labels_v[CE_N] = {3, -1, 28, 0, 17, -1, 5};
    const float grad_loss = 0.7f;
    float rx[CE_V * CE_N], got[CE_V * CE_N], ref[CE_V * CE_N], fd[CE_V * CE_N];
    int runs = 0, bad = 0;
    float loss_by_thread[3] = {0};
    for (int lay = 0; lay < 4; lay++)
        for (int nth = 1; nth <= 2; nth++) {
            struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
            struct lt_tensor *x = ce_logits(ctx, lay);
            CHECK(x && x->ne[0] == CE_V && x->ne[1] == CE_N, "%s", lt_last_error());
            if (!x)
                continue;
            nn_rng_state = 0x1234567u; /* the same logits for every layout and thread count */
            nn_fill_rand(x, rx, 3.0f);
            struct lt_tensor *labels = lt_new_tensor_1d(ctx, LT_TYPE_I32, CE_N);
            memcpy(labels->data, labels_v, sizeof(labels_v));
            struct lt_tensor *gl = lt_new_tensor_1d(ctx, LT_TYPE_F32, 1);
            memcpy(gl->data, &grad_loss, sizeof(grad_loss));
            struct lt_tensor *loss = lt_cross_entropy(ctx, x, labels);
            struct lt_tensor *dx = lt_cross_entropy_back(ctx, gl, x, labels);
            CHECK(loss && dx && nn_run(ctx, loss, nth) == LT_OK && nn_run(ctx, dx, nth) == LT_OK,
                  "%s", lt_last_error());
            if (!loss || !dx)
                continue;
            runs++;
            double xd[CE_V * CE_N];
            for (int i = 0; i < CE_V * CE_N; i++)
                xd[i] = rx[i];
            double want = ref_ce(xd, labels_v);
            float l = *(float *)loss->data;
            if (lay == 0)
                loss_by_thread[nth] = l;
            bool fwd_ok = fabs(l - want) <= 1e-6 + 1e-6 * fabs(want);
            /* closed form and central differences of grad_loss * ref_ce */
            int valid = 0;
            for (int n = 0; n < CE_N; n++)
                valid += labels_v[n] >= 0;
            for (int n = 0; n < CE_N; n++) {
                double mx = -INFINITY, s = 0;
                for (int i = 0; i < CE_V; i++)
                    mx = xd[n * CE_V + i] > mx ? xd[n * CE_V + i] : mx;
                for (int i = 0; i < CE_V; i++)
                    s += exp(xd[n * CE_V + i] - mx);
                for (int i = 0; i < CE_V; i++) {
                    double p = exp(xd[n * CE_V + i] - mx) / s - (i == labels_v[n]);
                    ref[n * CE_V + i] = labels_v[n] < 0 ? 0.0f : (float)(grad_loss * p / valid);
                    double keep = xd[n * CE_V + i];
                    xd[n * CE_V + i] = keep + FD_H;
                    double lp = ref_ce(xd, labels_v);
                    xd[n * CE_V + i] = keep - FD_H;
                    double lm = ref_ce(xd, labels_v);
                    xd[n * CE_V + i] = keep;
                    fd[n * CE_V + i] = (float)(grad_loss * (lp - lm) / (2 * FD_H));
                }
            }
            nn_read(dx, got);
            double e1 = check_max_ratio(got, ref, CE_V * CE_N, 1e-8, 1e-5, NULL);
            double e2 = check_max_ratio(got, fd, CE_V * CE_N, 1e-6, 1e-3, NULL);
            int masked_nonzero = 0;
            for (int n = 0; n < CE_N; n++)
                for (int i = 0; i < CE_V && labels_v[n] < 0; i++)
                    masked_nonzero += got[n * CE_V + i] != 0.0f;
            CHECK(fwd_ok && e1 <= 1.0 && e2 <= 1.0 && masked_nonzero == 0,
                  "cross_entropy %s, %d threads: loss %.9g vs %.9g, grad ratio %g, fd %g, %d "
                  "masked nonzero",
                  ce_layout_names[lay], nth, l, want, e1, e2, masked_nonzero);
            bad += !(fwd_ok && e1 <= 1.0 && e2 <= 1.0 && masked_nonzero == 0);
            lt_ctx_free(ctx);
        }
    printf("cross_entropy: %d runs, %d bad\n", runs, bad);
    CHECK(loss_by_thread[1] == loss_by_thread[2], "the loss depends on the thread count");

    /* every label masked: loss 0, gradient 0; a label >= V: NaN loss */
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, CE_V, 3);
    for (int i = 0; i < CE_V * 3; i++)
        ((float *)x->data)[i] = nn_rand();
    struct lt_tensor *lab = lt_new_tensor_1d(ctx, LT_TYPE_I32, 3);
    int32_t none[3] = {-1, -1, -100};
    memcpy(lab->data, none, sizeof(none));
    struct lt_tensor *gl = lt_new_tensor_1d(ctx, LT_TYPE_F32, 1);
    *(float *)gl->data = 1.0f;
    struct lt_tensor *loss = lt_cross_entropy(ctx, x, lab), *dx = lt_cross_entropy_back(ctx, gl, x, lab);
    CHECK(nn_run(ctx, loss, 2) == LT_OK && nn_run(ctx, dx, 2) == LT_OK);
    CHECK(*(float *)loss->data == 0.0f, "all masked: loss %g", *(float *)loss->data);
    int nz = 0;
    for (int i = 0; i < CE_V * 3; i++)
        nz += ((float *)dx->data)[i] != 0.0f;
    CHECK(nz == 0, "all masked: %d gradient entries nonzero", nz);
    int32_t out_of_range[3] = {1, CE_V, 2};
    memcpy(lab->data, out_of_range, sizeof(out_of_range));
    CHECK(nn_run(ctx, loss, 1) == LT_OK && isnan(*(float *)loss->data), "label >= V gives NaN");
    lt_ctx_free(ctx);

    ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *l3 = lt_new_tensor_3d(ctx, LT_TYPE_F32, 5, 2, 2);
    struct lt_tensor *lb2 = lt_new_tensor_1d(ctx, LT_TYPE_I32, 2);
    CHECK(lt_cross_entropy(ctx, l3, lb2) == NULL, "3d logits");
    CHECK(lt_cross_entropy(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 5, 3), lb2) == NULL,
          "label count");
    CHECK(lt_cross_entropy(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 5, 2),
                           lt_new_tensor_1d(ctx, LT_TYPE_F32, 2)) == NULL,
          "f32 labels");
    lt_ctx_free(ctx);
}

/* ---------------- linear_ce ---------------- */

/* LINEAR_CE and LINEAR_CE_BACK against their definition: the logits in double from the same
 * head and hidden states, the loss and d z as CROSS_ENTROPY's reference, dh = w dz and
 * dw = h dz^T in double; F32 and BF16 heads (the BF16 values as the kernel reads them), a
 * vocabulary of 301, 1 and 2 threads, masked labels and a label on the last token; then
 * the backward asked for fewer parts, or for the loss too */
#define LCE_D 24
#define LCE_V 301
#define LCE_N 9

/* LINEAR_CE_BACK with fewer parts gives the same numbers as with both gradients: dh alone,
 * dw alone (their views find them), and all three with the loss, which is LINEAR_CE's
 * value bit for bit */
static void test_linear_ce_parts(struct lt_ctx *ctx, struct lt_tensor *gl, struct lt_tensor *w,
                                 struct lt_tensor *h, struct lt_tensor *labels,
                                 struct lt_tensor *both, struct lt_tensor *loss, int nth)
{
    static const unsigned sets[3] = {LT_LINEAR_CE_DH, LT_LINEAR_CE_DW,
                                     LT_LINEAR_CE_DH | LT_LINEAR_CE_DW | LT_LINEAR_CE_LOSS};
    const size_t bh = sizeof(float) * LCE_D * LCE_N, bw = sizeof(float) * LCE_D * LCE_V;
    const char *dh = both->data, *dw = (const char *)both->data + bh;
    for (int k = 0; k < 3; k++) {
        struct lt_tensor *r = lt_linear_cross_entropy_back_parts(ctx, gl, w, h, labels, sets[k]);
        CHECK(r && nn_run(ctx, r, nth) == LT_OK, "parts %#x: %s", sets[k], lt_last_error());
        if (!r)
            continue;
        const bool has_h = sets[k] & LT_LINEAR_CE_DH, has_w = sets[k] & LT_LINEAR_CE_DW,
                   has_loss = sets[k] & LT_LINEAR_CE_LOSS;
        CHECK(lt_nelements(r) ==
                  (has_h ? LCE_D * LCE_N : 0) + (has_w ? LCE_D * LCE_V : 0) + (has_loss ? 1 : 0),
              "parts %#x: %lld elements", sets[k], (long long)lt_nelements(r));
        struct lt_tensor *vh = lt_linear_cross_entropy_back_h(ctx, r);
        struct lt_tensor *vw = lt_linear_cross_entropy_back_w(ctx, r);
        struct lt_tensor *vl = lt_linear_cross_entropy_back_loss(ctx, r);
        CHECK((vh != NULL) == has_h && (vw != NULL) == has_w && (vl != NULL) == has_loss,
              "parts %#x: views dh %d, dw %d, loss %d", sets[k], vh != NULL, vw != NULL,
              vl != NULL);
        if (vh)
            CHECK(!memcmp(vh->data, dh, bh), "parts %#x nth %d: dh differs from dh and dw's",
                  sets[k], nth);
        if (vw)
            CHECK(!memcmp(vw->data, dw, bw), "parts %#x nth %d: dw differs from dh and dw's",
                  sets[k], nth);
        if (vl)
            CHECK(*(float *)vl->data == *(float *)loss->data,
                  "parts %#x nth %d: loss %.9g, LINEAR_CE's %.9g", sets[k], nth,
                  (double)*(float *)vl->data, (double)*(float *)loss->data);
    }
}

/* Part sets without a gradient, or with bits no part has, are refused with the parts named;
 * a view of a part the node lacks names the node */
static void test_linear_ce_parts_refused(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 5);
    struct lt_tensor *h = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 3);
    struct lt_tensor *y = lt_new_tensor_1d(ctx, LT_TYPE_I32, 3);
    struct lt_tensor *g = lt_new_tensor_1d(ctx, LT_TYPE_F32, 1);
    lt_set_name(h, "hidden");
    static const unsigned bad[3] = {0, LT_LINEAR_CE_LOSS, LT_LINEAR_CE_DH | 8u};
    for (int k = 0; k < 3; k++) {
        CHECK(lt_linear_cross_entropy_back_parts(ctx, g, w, h, y, bad[k]) == NULL &&
                  strstr(lt_last_error(), "parts") && strstr(lt_last_error(), "hidden"),
              "parts %#x: %s", bad[k], lt_last_error());
    }
    struct lt_tensor *r = lt_linear_cross_entropy_back_parts(ctx, g, w, h, y, LT_LINEAR_CE_DH);
    CHECK(r && lt_linear_cross_entropy_back_w(ctx, r) == NULL &&
              strstr(lt_last_error(), "without its dw"),
          "dw of a dh-only node: %s", lt_last_error());
    CHECK(lt_linear_cross_entropy_back_loss(ctx, r) == NULL &&
              strstr(lt_last_error(), "without its loss"),
          "the loss of a node without it: %s", lt_last_error());
    lt_ctx_free(ctx);
}

static void test_linear_ce(void)
{
    const int32_t labels_v[LCE_N] = {3, -1, 300, 0, 170, -1, 5, 299, 42};
    const float grad_loss = 0.7f;
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int nth = 1; nth <= 2; nth++) {
            struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
            struct lt_tensor *w32 = lt_new_tensor_2d(ctx, LT_TYPE_F32, LCE_D, LCE_V);
            struct lt_tensor *h = lt_new_tensor_2d(ctx, LT_TYPE_F32, LCE_D, LCE_N);
            static float rw[LCE_D * LCE_V], rh[LCE_D * LCE_N];
            nn_rng_state = 0x2468ace1u;
            nn_fill_rand(w32, rw, 1.0f);
            nn_fill_rand(h, rh, 1.0f);
            struct lt_tensor *w = w32;
            if (bf16) { /* the head as BF16, and its values as BF16 rounds them */
                w = lt_new_tensor_2d(ctx, LT_TYPE_BF16, LCE_D, LCE_V);
                for (int64_t v = 0; v < LCE_V; v++)
                    lt_row_from_f32(w, v, 0, 0, rw + v * LCE_D);
                for (int64_t v = 0; v < LCE_V; v++)
                    lt_row_to_f32(w, v, 0, 0, rw + v * LCE_D);
            }
            struct lt_tensor *labels = lt_new_tensor_1d(ctx, LT_TYPE_I32, LCE_N);
            memcpy(labels->data, labels_v, sizeof(labels_v));
            struct lt_tensor *gl = lt_new_tensor_1d(ctx, LT_TYPE_F32, 1);
            memcpy(gl->data, &grad_loss, sizeof(grad_loss));
            struct lt_tensor *loss = lt_linear_cross_entropy(ctx, w, h, labels);
            struct lt_tensor *back = lt_linear_cross_entropy_back(ctx, gl, w, h, labels);
            CHECK(loss && back && nn_run(ctx, loss, nth) == LT_OK && nn_run(ctx, back, nth) == LT_OK,
                  "%s", lt_last_error());
            if (!loss || !back) {
                lt_ctx_free(ctx);
                continue;
            }
            /* the reference, in double */
            static double z[LCE_V * LCE_N], dz[LCE_V * LCE_N];
            double total = 0;
            int valid = 0;
            for (int n = 0; n < LCE_N; n++)
                valid += labels_v[n] >= 0;
            for (int n = 0; n < LCE_N; n++) {
                double mx = -INFINITY, sum = 0;
                for (int v = 0; v < LCE_V; v++) {
                    double x = 0;
                    for (int i = 0; i < LCE_D; i++)
                        x += (double)rw[v * LCE_D + i] * rh[n * LCE_D + i];
                    z[n * LCE_V + v] = x;
                    mx = x > mx ? x : mx;
                }
                for (int v = 0; v < LCE_V; v++)
                    sum += exp(z[n * LCE_V + v] - mx);
                for (int v = 0; v < LCE_V; v++) {
                    double p = exp(z[n * LCE_V + v] - mx) / sum;
                    dz[n * LCE_V + v] =
                        labels_v[n] < 0 ? 0 : grad_loss / valid * (p - (v == labels_v[n]));
                }
                if (labels_v[n] >= 0)
                    total += mx + log(sum) - z[n * LCE_V + labels_v[n]];
            }
            const double want = total / valid;
            const float got = *(float *)loss->data;
            CHECK(fabs(got - want) <= 1e-5 * fabs(want), "linear_ce%s nth %d: loss %.9g, want %.9g",
                  bf16 ? " bf16" : "", nth, got, want);
            const float *dh = back->data, *dw = dh + LCE_D * LCE_N;
            double eh = 0, nh = 0, ew = 0, nw = 0;
            for (int n = 0; n < LCE_N; n++)
                for (int i = 0; i < LCE_D; i++) {
                    double x = 0;
                    for (int v = 0; v < LCE_V; v++)
                        x += dz[n * LCE_V + v] * rw[v * LCE_D + i];
                    eh += (dh[n * LCE_D + i] - x) * (dh[n * LCE_D + i] - x);
                    nh += x * x;
                }
            for (int v = 0; v < LCE_V; v++)
                for (int i = 0; i < LCE_D; i++) {
                    double x = 0;
                    for (int n = 0; n < LCE_N; n++)
                        x += dz[n * LCE_V + v] * rh[n * LCE_D + i];
                    ew += (dw[v * LCE_D + i] - x) * (dw[v * LCE_D + i] - x);
                    nw += x * x;
                }
            eh = sqrt(eh / nh), ew = sqrt(ew / nw);
            CHECK(eh < 1e-5 && ew < 1e-5, "linear_ce_back%s nth %d: dh rel err %g, dw %g",
                  bf16 ? " bf16" : "", nth, eh, ew);
            printf("linear_ce%s nth %d: loss %.7f (want %.7f), dh %.2e, dw %.2e\n",
                   bf16 ? " bf16" : "", nth, got, want, eh, ew);
            test_linear_ce_parts(ctx, gl, w, h, labels, back, loss, nth);
            lt_ctx_free(ctx);
        }
    test_linear_ce_parts_refused();
}

int main(void)
{
    nn_backends_init();
    test_norms();
    test_rms_norm_mul();
    test_rms_norm_mul_back();
    test_attn_decode();
    test_attn_decode_store();
    test_flash_attn_chain();
    test_rope();
    test_rms_norm_rope();
    test_softmax();
    test_cross_entropy();
    test_linear_ce();
    nn_backends_free();
    return check_summary();
}
