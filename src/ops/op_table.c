/* op_table.c: the op table, indexed by enum lt_op. Entries live in their family files. */
#include <assert.h>

#include "ops/op.h"

static const struct lt_op_def *const op_table[] = {
    [LT_OP_NONE] = &lt_op_def_none,
    [LT_OP_VIEW] = &lt_op_def_view,
    [LT_OP_RESHAPE] = &lt_op_def_reshape,
    [LT_OP_PERMUTE] = &lt_op_def_permute,
    [LT_OP_TRANSPOSE] = &lt_op_def_transpose,
    [LT_OP_FILL] = &lt_op_def_fill,
    [LT_OP_CONT] = &lt_op_def_cont,
    [LT_OP_CPY] = &lt_op_def_cpy,
    [LT_OP_CONCAT] = &lt_op_def_concat,
    [LT_OP_REPEAT] = &lt_op_def_repeat,
    [LT_OP_GET_ROWS] = &lt_op_def_get_rows,
    [LT_OP_SET_ROWS] = &lt_op_def_set_rows,
    [LT_OP_MUL_MAT] = &lt_op_def_mul_mat,
    [LT_OP_MUL_MAT_ACC] = &lt_op_def_mul_mat_acc,
    [LT_OP_MUL_MAT_GLU] = &lt_op_def_mul_mat_glu,
    [LT_OP_MUL_MAT_ADD_RMS_NORM] = &lt_op_def_mul_mat_add_rms_norm,
    [LT_OP_RMS_NORM_MUL_MAT] = &lt_op_def_rms_norm_mul_mat,
    [LT_OP_ADD] = &lt_op_def_add,
    [LT_OP_SUB] = &lt_op_def_sub,
    [LT_OP_MUL] = &lt_op_def_mul,
    [LT_OP_DIV] = &lt_op_def_div,
    [LT_OP_SCALE] = &lt_op_def_scale,
    [LT_OP_SILU] = &lt_op_def_silu,
    [LT_OP_SIGMOID] = &lt_op_def_sigmoid,
    [LT_OP_SOFTPLUS] = &lt_op_def_softplus,
    [LT_OP_EXP] = &lt_op_def_exp,
    [LT_OP_LOG] = &lt_op_def_log,
    [LT_OP_SQR] = &lt_op_def_sqr,
    [LT_OP_SQRT] = &lt_op_def_sqrt,
    [LT_OP_SIN] = &lt_op_def_sin,
    [LT_OP_COS] = &lt_op_def_cos,
    [LT_OP_ABS] = &lt_op_def_abs,
    [LT_OP_NEG] = &lt_op_def_neg,
    [LT_OP_RELU] = &lt_op_def_relu,
    [LT_OP_SUM_ROWS] = &lt_op_def_sum_rows,
    [LT_OP_MEAN] = &lt_op_def_mean,
    [LT_OP_SUM] = &lt_op_def_sum,
    [LT_OP_ARGMAX] = &lt_op_def_argmax,
    [LT_OP_RMS_NORM] = &lt_op_def_rms_norm,
    [LT_OP_ADD_RMS_NORM] = &lt_op_def_add_rms_norm,
    [LT_OP_L2_NORM] = &lt_op_def_l2_norm,
    [LT_OP_ROPE] = &lt_op_def_rope,
    [LT_OP_RMS_NORM_ROPE] = &lt_op_def_rms_norm_rope,
    [LT_OP_SOFT_MAX] = &lt_op_def_soft_max,
    [LT_OP_ATTN_DECODE] = &lt_op_def_attn_decode,
    [LT_OP_FLASH_ATTN] = &lt_op_def_flash_attn,
    [LT_OP_SWIGLU] = &lt_op_def_swiglu,
    [LT_OP_SSM_CONV] = &lt_op_def_ssm_conv,
    [LT_OP_DELTA_NET] = &lt_op_def_delta_net,
    [LT_OP_GDN_DECODE] = &lt_op_def_gdn_decode,
    [LT_OP_CONV_SILU] = &lt_op_def_conv_silu,
    [LT_OP_CROSS_ENTROPY] = &lt_op_def_cross_entropy,
    [LT_OP_LINEAR_CE] = &lt_op_def_linear_ce,
    [LT_OP_ACC] = &lt_op_def_acc,
    [LT_OP_REPEAT_BACK] = &lt_op_def_repeat_back,
    [LT_OP_GET_ROWS_BACK] = &lt_op_def_get_rows_back,
    [LT_OP_SILU_BACK] = &lt_op_def_silu_back,
    [LT_OP_SWIGLU_BACK] = &lt_op_def_swiglu_back,
    [LT_OP_RMS_NORM_BACK] = &lt_op_def_rms_norm_back,
    [LT_OP_RMS_NORM_MUL_BACK] = &lt_op_def_rms_norm_mul_back,
    [LT_OP_L2_NORM_BACK] = &lt_op_def_l2_norm_back,
    [LT_OP_ROPE_BACK] = &lt_op_def_rope_back,
    [LT_OP_SOFT_MAX_BACK] = &lt_op_def_soft_max_back,
    [LT_OP_SSM_CONV_BACK] = &lt_op_def_ssm_conv_back,
    [LT_OP_CONV_SILU_BACK] = &lt_op_def_conv_silu_back,
    [LT_OP_DELTA_NET_BACK] = &lt_op_def_delta_net_back,
    [LT_OP_FLASH_ATTN_BACK] = &lt_op_def_flash_attn_back,
    [LT_OP_CROSS_ENTROPY_BACK] = &lt_op_def_cross_entropy_back,
    [LT_OP_LINEAR_CE_BACK] = &lt_op_def_linear_ce_back,
    [LT_OP_ADAMW] = &lt_op_def_adamw,
    [LT_OP_SGD] = &lt_op_def_sgd,
};

static_assert(sizeof(op_table) / sizeof(op_table[0]) == LT_OP_COUNT,
              "op_table and enum lt_op differ in length");

const struct lt_op_def *lt_op_def(enum lt_op op)
{
    assert(op >= 0 && op < LT_OP_COUNT);
    return op_table[op];
}

const char *lt_op_name(enum lt_op op)
{
    if (op < 0 || op >= LT_OP_COUNT || !op_table[op])
        return "?";
    return op_table[op]->name;
}
