/* test_ops_null.c: the NULL policy (lathe/tensor.h, LT_REQUIRE). A constructor or view given
 * a NULL source (an earlier constructor failed) returns NULL, never dereferences it, and the
 * error names the constructor, the missing source and the failure that left it NULL; so a
 * chain of constructors fails once, at its end, with the first failure's reason. */
#include <string.h>

#include "check.h"
#include "lathe/ops.h"

/* The call must give NULL with an error that names `what` and `source`. */
#define NULL_CASE(call, what, source)                                                              \
    do {                                                                                           \
        lt_fail(LT_ERR_INVALID, "root cause");                                                     \
        struct lt_tensor *r_ = (call);                                                             \
        const char *e_ = lt_last_error();                                                          \
        CHECK(r_ == NULL && strstr(e_, what) && strstr(e_, "'" source "' is missing") &&          \
                  strstr(e_, "root cause"),                                                        \
              "%s: %s", #call, e_);                                                                \
    } while (0)

int main(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 4);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 8);
    struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, 4);
    struct lt_tensor *ids = lt_new_tensor_1d(ctx, LT_TYPE_I32, 4);
    struct lt_tensor *n = NULL;

    /* views: reshape and the views dereferenced their source before */
    NULL_CASE(lt_reshape_2d(ctx, n, 4, 8), "reshape", "a");
    NULL_CASE(lt_reshape_3d(ctx, n, 4, 4, 2), "reshape", "a");
    NULL_CASE(lt_view_1d(ctx, n, 8, 0), "view", "a");
    NULL_CASE(lt_view_2d(ctx, n, 4, 4, 32, 0), "view", "a");
    NULL_CASE(lt_permute(ctx, n, 1, 0, 2, 3), "permute", "a");
    NULL_CASE(lt_transpose(ctx, n), "transpose", "a");
    /* norms dereferenced it too */
    NULL_CASE(lt_rms_norm(ctx, n, 1e-6f), "rms_norm", "a");
    NULL_CASE(lt_l2_norm(ctx, n, 1e-6f), "l2_norm", "a");
    NULL_CASE(lt_rms_norm_back(ctx, x, n, 1e-6f), "rms_norm_back", "x");
    NULL_CASE(lt_rms_norm_mul(ctx, x, n, 1e-6f, LT_TYPE_F32), "rms_norm_mul", "w");
    /* each family, with the missing source in different places */
    NULL_CASE(lt_add(ctx, x, n), "ADD", "b");
    NULL_CASE(lt_mul(ctx, n, x), "MUL", "a");
    NULL_CASE(lt_silu(ctx, n), "SILU", "a");
    NULL_CASE(lt_swiglu(ctx, x, n), "SWIGLU", "b");
    NULL_CASE(lt_scale(ctx, n, 2.0f), "scale", "a");
    NULL_CASE(lt_mul_mat(ctx, w, n), "mul_mat", "b");
    NULL_CASE(lt_rope(ctx, n, pos, 8, LT_ROPE_NORMAL, 10000.0f), "rope", "a");
    NULL_CASE(lt_rope(ctx, lt_reshape_3d(ctx, x, 8, 1, 4), n, 8, LT_ROPE_NORMAL, 10000.0f),
              "rope", "pos");
    NULL_CASE(lt_soft_max(ctx, n, NULL, 1.0f, true), "soft_max", "a");
    NULL_CASE(lt_get_rows(ctx, w, n), "get_rows", "ids");
    NULL_CASE(lt_cont(ctx, n), "cont", "a");
    NULL_CASE(lt_concat(ctx, x, n, 1), "concat", "b");
    NULL_CASE(lt_sum_rows(ctx, n), "SUM_ROWS", "a");
    NULL_CASE(lt_cross_entropy(ctx, n, ids), "cross_entropy", "logits");
    NULL_CASE(lt_repeat(ctx, n, x), "repeat", "a");

    /* optional sources stay optional: no mask is no error */
    CHECK(lt_soft_max(ctx, x, NULL, 1.0f, true) != NULL, "soft_max without a mask: %s", lt_last_error());

    /* a chain fails once, at its end, keeping the first failure's reason */
    struct lt_tensor *bad = lt_mul_mat(ctx, w, lt_new_tensor_2d(ctx, LT_TYPE_F32, 5, 4));
    CHECK(bad == NULL, "a product of mismatched shapes fails");
    char first[256];
    snprintf(first, sizeof(first), "%s", lt_last_error());
    struct lt_tensor *y = lt_silu(ctx, lt_add(ctx, lt_rms_norm(ctx, bad, 1e-6f), x));
    CHECK(y == NULL && strstr(lt_last_error(), first), "the chain keeps the first reason: %s",
          lt_last_error());

    lt_ctx_free(ctx);
    return check_summary();
}
