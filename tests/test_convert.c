/* test_convert.c: the converter's name and transform tables (include/lathe/convert.h) without
 * files: config parsing, HF <-> GGUF names both ways, the value-head and rotary permutations
 * against index formulas written out here, and the gradient map checked as a true chain rule:
 * for L(x) = sum_k c_k F(x)_k, lt_convert_grad_to_hf(c, F(x)) must equal dL/dx measured by
 * finite differences through lt_convert_values. One end-to-end case writes a tokenizer-less
 * checkpoint to a temporary folder and converts it (the vocabulary-less keys, then lathe's
 * loader). (The end-to-end conversion is checked against llama.cpp's own reader in
 * tests/py/test_convert.py and test_convert_novocab.py.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "lathe/convert.h"
#include "lathe/gguf.h"
#include "lathe/model.h"
#include "lathe/tokenizer.h"

/* Hk = 2 key heads, Hv = 6 value heads (R = 3), d_k = 3, d_v = 2; 4 layers, full every 2nd */
static const char *qwen35_json =
    "{\"architectures\":[\"Qwen3_5ForCausalLM\"],\"hidden_size\":8,\"intermediate_size\":12,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":4,\"num_hidden_layers\":4,"
    "\"vocab_size\":32,\"max_position_embeddings\":128,\"rms_norm_eps\":1e-6,"
    "\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":3,\"linear_value_head_dim\":2,"
    "\"linear_num_key_heads\":2,\"linear_num_value_heads\":6,\"full_attention_interval\":2,"
    "\"layer_types\":[\"linear_attention\",\"full_attention\",\"linear_attention\","
    "\"full_attention\"],\"tie_word_embeddings\":true,"
    "\"rope_parameters\":{\"rope_theta\":10000.0,\"partial_rotary_factor\":0.5,"
    "\"rope_type\":\"default\"}}";

static const char *llama_json =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":12,\"intermediate_size\":20,"
    "\"num_attention_heads\":3,\"num_key_value_heads\":1,\"num_hidden_layers\":2,"
    "\"vocab_size\":40,\"rms_norm_eps\":1e-5,\"rope_theta\":100000.0}";

static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f;
}

static void test_config(void)
{
    struct lt_hf_config c;
    CHECK(lt_hf_config_parse(qwen35_json, strlen(qwen35_json), "q35", &c) == LT_OK, "%s",
          lt_last_error());
    CHECK(c.arch == LT_HF_ARCH_QWEN35 && !strcmp(lt_hf_arch_gguf_name(c.arch), "qwen35"));
    CHECK(c.n_layer == 4 && c.n_embd == 8 && c.n_head == 2 && c.n_head_kv == 1 &&
          c.head_dim == 4);
    CHECK(c.n_rot == 2, "n_rot %lld", (long long)c.n_rot); /* 4 * 0.5 */
    CHECK(c.ssm_n_k_heads == 2 && c.ssm_n_v_heads == 6 && c.ssm_d_k == 3 && c.ssm_d_v == 2);
    CHECK(c.full_attn_every == 2 && c.tie_word_embeddings && c.has_rope_theta &&
          c.rope_theta == 10000.0);
    CHECK(c.rope_sections[0] == 11 && c.rope_sections[1] == 11 && c.rope_sections[2] == 10 &&
          c.rope_sections[3] == 0);

    CHECK(lt_hf_config_parse(llama_json, strlen(llama_json), "llama", &c) == LT_OK, "%s",
          lt_last_error());
    CHECK(c.arch == LT_HF_ARCH_LLAMA && c.head_dim == 4 && c.n_rot == 4 && !c.has_head_dim);
    CHECK(c.rope_theta == 100000.0 && !c.has_tie_word_embeddings);

    /* refusals */
    const char *neox = "{\"architectures\":[\"GPTNeoXForCausalLM\"],\"hidden_size\":8}";
    CHECK(lt_hf_config_parse(neox, strlen(neox), "neox", &c) == LT_ERR_UNSUPPORTED);
    CHECK(strstr(lt_last_error(), "GPTNeoXForCausalLM") != NULL);
    const char *nolayers = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":8,"
                           "\"num_attention_heads\":2,\"vocab_size\":4}";
    CHECK(lt_hf_config_parse(nolayers, strlen(nolayers), "x", &c) == LT_ERR_FORMAT);
    CHECK(strstr(lt_last_error(), "num_hidden_layers") != NULL, "%s", lt_last_error());
    char bad[2048];
    snprintf(bad, sizeof(bad), "%s", qwen35_json);
    char *p = strstr(bad, "\"full_attention\",\"linear_attention\"");
    memcpy(p, "\"linear_attention\",\"full_attention\"", 35); /* layers 1 and 2 swapped */
    CHECK(lt_hf_config_parse(bad, strlen(bad), "x", &c) == LT_ERR_UNSUPPORTED, "%s",
          lt_last_error());
    CHECK(lt_hf_config_parse("{", 1, "x", &c) == LT_ERR_FORMAT);
}

static void test_names(void)
{
    struct lt_hf_config c;
    lt_hf_config_parse(qwen35_json, strlen(qwen35_json), "q35", &c);
    static const char *const pairs[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"},
        {"model.layers.0.post_attention_layernorm.weight", "blk.0.post_attention_norm.weight"},
        {"model.layers.0.linear_attn.in_proj_qkv.weight", "blk.0.attn_qkv.weight"},
        {"model.layers.0.linear_attn.in_proj_z.weight", "blk.0.attn_gate.weight"},
        {"model.layers.0.linear_attn.in_proj_a.weight", "blk.0.ssm_alpha.weight"},
        {"model.layers.0.linear_attn.in_proj_b.weight", "blk.0.ssm_beta.weight"},
        {"model.layers.2.linear_attn.A_log", "blk.2.ssm_a"},
        {"model.layers.2.linear_attn.dt_bias", "blk.2.ssm_dt.bias"},
        {"model.layers.2.linear_attn.conv1d.weight", "blk.2.ssm_conv1d.weight"},
        {"model.layers.2.linear_attn.norm.weight", "blk.2.ssm_norm.weight"},
        {"model.layers.2.linear_attn.out_proj.weight", "blk.2.ssm_out.weight"},
        {"model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"},
        {"model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"},
        {"model.layers.3.self_attn.k_norm.weight", "blk.3.attn_k_norm.weight"},
        {"model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"},
        {"model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight"},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        struct lt_convert_map m, back;
        CHECK(lt_convert_map_hf(&c, pairs[i][0], &m) == LT_OK, "%s: %s", pairs[i][0],
              lt_last_error());
        CHECK(!strcmp(m.gguf_name, pairs[i][1]) && !m.skip, "%s -> %s", pairs[i][0], m.gguf_name);
        CHECK(lt_convert_map_gguf(&c, pairs[i][1], &back) == LT_OK &&
                  !strcmp(back.hf_name, pairs[i][0]),
              "%s <- %s", pairs[i][1], back.hf_name);
        CHECK(back.fn == m.fn && back.perm == m.perm && back.squeeze == m.squeeze);
    }
    struct lt_convert_map m;
    /* transforms: +1 on the (1+w) norms, not on the gated norm; -exp on A_log */
    lt_convert_map_hf(&c, "model.layers.3.self_attn.k_norm.weight", &m);
    CHECK(m.fn == LT_CONVERT_FN_PLUS_ONE);
    lt_convert_map_hf(&c, "model.norm.weight", &m);
    CHECK(m.fn == LT_CONVERT_FN_PLUS_ONE);
    lt_convert_map_hf(&c, "model.layers.0.linear_attn.norm.weight", &m);
    CHECK(m.fn == LT_CONVERT_FN_COPY && m.perm == LT_CONVERT_PERM_NONE);
    lt_convert_map_hf(&c, "model.layers.0.linear_attn.A_log", &m);
    CHECK(m.fn == LT_CONVERT_FN_NEG_EXP && m.perm == LT_CONVERT_PERM_V_HEADS);
    /* multimodal prefixes, tied head, dropped names */
    CHECK(lt_convert_map_hf(&c, "model.language_model.layers.1.mlp.up_proj.weight", &m) == LT_OK &&
          !strcmp(m.gguf_name, "blk.1.ffn_up.weight") &&
          !strcmp(m.hf_name, "model.layers.1.mlp.up_proj.weight"));
    CHECK(lt_convert_map_hf(&c, "lm_head.weight", &m) == LT_OK && m.skip);
    CHECK(lt_convert_map_hf(&c, "mtp.fc.weight", &m) == LT_OK && m.skip);
    CHECK(lt_convert_map_hf(&c, "model.visual.blocks.0.attn.qkv.weight", &m) == LT_OK && m.skip);
    /* refusals */
    CHECK(lt_convert_map_hf(&c, "model.layers.0.mlp.mystery.weight", &m) == LT_ERR_UNSUPPORTED);
    CHECK(lt_convert_map_hf(&c, "model.layers.4.mlp.up_proj.weight", &m) == LT_ERR_FORMAT);
    CHECK(lt_convert_map_hf(&c, "model.layers.x.mlp.up_proj.weight", &m) == LT_ERR_UNSUPPORTED);
    CHECK(lt_convert_map_gguf(&c, "blk.0.ffn_norm.weight", &m) == LT_ERR_UNSUPPORTED);

    /* llama: ffn_norm, rotary permutation on q and k only */
    lt_hf_config_parse(llama_json, strlen(llama_json), "llama", &c);
    CHECK(lt_convert_map_hf(&c, "model.layers.1.post_attention_layernorm.weight", &m) == LT_OK &&
          !strcmp(m.gguf_name, "blk.1.ffn_norm.weight") && m.fn == LT_CONVERT_FN_COPY);
    CHECK(lt_convert_map_hf(&c, "model.layers.1.self_attn.q_proj.weight", &m) == LT_OK &&
          m.perm == LT_CONVERT_PERM_ROPE && m.perm_n_groups == 3 && m.perm_head_dim == 4);
    CHECK(lt_convert_map_hf(&c, "model.layers.1.self_attn.k_proj.weight", &m) == LT_OK &&
          m.perm == LT_CONVERT_PERM_ROPE && m.perm_n_groups == 1);
    CHECK(lt_convert_map_hf(&c, "model.layers.1.self_attn.v_proj.weight", &m) == LT_OK &&
          m.perm == LT_CONVERT_PERM_NONE);
    CHECK(lt_convert_map_hf(&c, "lm_head.weight", &m) == LT_OK && !m.skip &&
          !strcmp(m.gguf_name, "output.weight"));
}

/* The permutations against their index formulas. */
static void test_perms(void)
{
    struct lt_hf_config c;
    struct lt_convert_map m;
    lt_hf_config_parse(qwen35_json, strlen(qwen35_json), "q35", &c);
    const int hk = 2, r = 3, dk = 3, dv = 2;

    /* in_proj_z rows: HF value head j (key head j / R) -> tiled head (j % R) * Hk + j / R */
    lt_convert_map_hf(&c, "model.layers.0.linear_attn.in_proj_z.weight", &m);
    for (int j = 0; j < hk * r; j++)
        for (int d = 0; d < dv; d++) {
            int64_t want = ((j % r) * hk + j / r) * dv + d;
            CHECK(lt_convert_perm_index(&m, j * dv + d) == want, "z row %d", j * dv + d);
        }
    /* the tiled head h reads key head h % Hk, as lathe's delta_net op does */
    for (int h = 0; h < hk * r; h++) {
        int hf_head = -1;
        for (int j = 0; j < hk * r; j++)
            if (lt_convert_perm_index(&m, j * dv) == h * dv)
                hf_head = j;
        CHECK(hf_head >= 0 && hf_head / r == h % hk, "tiled head %d came from HF head %d", h,
              hf_head);
    }
    /* in_proj_qkv: q and k rows stay, v rows move like z's */
    lt_convert_map_hf(&c, "model.layers.0.linear_attn.in_proj_qkv.weight", &m);
    int qk = 2 * hk * dk;
    for (int x = 0; x < qk; x++)
        CHECK(lt_convert_perm_index(&m, x) == x);
    for (int j = 0; j < hk * r; j++)
        for (int d = 0; d < dv; d++)
            CHECK(lt_convert_perm_index(&m, qk + j * dv + d) == qk + ((j % r) * hk + j / r) * dv + d);

    /* forward values of in_proj_qkv [qk + Hv*dv, 8] against a plain loop */
    int rows = qk + hk * r * dv, cols = 8;
    float *x = malloc(sizeof(float) * rows * cols), *y = malloc(sizeof(float) * rows * cols);
    for (int i = 0; i < rows * cols; i++)
        x[i] = frand();
    int64_t shape[2] = {rows, cols};
    CHECK(lt_convert_values(&m, 2, shape, x, y) == LT_OK);
    int bad = 0;
    for (int row = 0; row < rows; row++) {
        int dst = row;
        if (row >= qk) {
            int j = (row - qk) / dv, d = (row - qk) % dv;
            dst = qk + ((j % r) * hk + j / r) * dv + d;
        }
        for (int col = 0; col < cols; col++)
            bad += y[dst * cols + col] != x[row * cols + col];
    }
    CHECK(bad == 0, "%d qkv values misplaced", bad);
    /* an axis the config sizes differently is refused */
    shape[0] = rows + 2;
    CHECK(lt_convert_values(&m, 2, shape, x, y) == LT_ERR_FORMAT);
    free(x);
    free(y);

    /* out_proj: columns move */
    lt_convert_map_hf(&c, "model.layers.0.linear_attn.out_proj.weight", &m);
    CHECK(m.perm_axis == 1);
    float a[8 * 12], b[8 * 12];
    for (int i = 0; i < 8 * 12; i++)
        a[i] = (float)i;
    int64_t oshape[2] = {8, 12};
    CHECK(lt_convert_values(&m, 2, oshape, a, b) == LT_OK);
    bad = 0;
    for (int row = 0; row < 8; row++)
        for (int col = 0; col < 12; col++) {
            int j = col / dv, d = col % dv;
            bad += b[row * 12 + ((j % r) * hk + j / r) * dv + d] != a[row * 12 + col];
        }
    CHECK(bad == 0, "%d out_proj values misplaced", bad);

    /* conv1d: [channels, 1, kernel] -> ne [kernel, channels], v channels reordered */
    lt_convert_map_hf(&c, "model.layers.0.linear_attn.conv1d.weight", &m);
    int64_t cshape[3] = {qk + hk * r * dv, 1, 4}, ne[4], back[8];
    int nd, hnd;
    CHECK(lt_convert_gguf_shape(&m, 3, cshape, &nd, ne) == LT_OK && nd == 2 && ne[0] == 4 &&
          ne[1] == cshape[0] && ne[2] == 1);
    lt_convert_hf_shape(&m, nd, ne, &hnd, back);
    CHECK(hnd == 3 && back[0] == cshape[0] && back[1] == 1 && back[2] == 4);
    int64_t wrong[3] = {cshape[0], 2, 2};
    CHECK(lt_convert_gguf_shape(&m, 3, wrong, &nd, ne) == LT_ERR_FORMAT);

    /* llama's rotary permutation: within each head, HF row j*(hd/2) + i -> 2*i + j */
    lt_hf_config_parse(llama_json, strlen(llama_json), "llama", &c);
    lt_convert_map_hf(&c, "model.layers.0.self_attn.q_proj.weight", &m);
    for (int h = 0; h < 3; h++)
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < 2; i++)
                CHECK(lt_convert_perm_index(&m, h * 4 + j * 2 + i) == h * 4 + 2 * i + j);
}

/* dL/dx by central differences through the forward transform, L = sum c . F(x). */
static void check_chain_rule(const struct lt_hf_config *c, const char *name, int nd,
                             const int64_t *shape)
{
    struct lt_convert_map m;
    CHECK(lt_convert_map_hf(c, name, &m) == LT_OK, "%s", lt_last_error());
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    float *cw = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = frand();
        cw[i] = frand();
    }
    CHECK(lt_convert_values(&m, nd, shape, x, y) == LT_OK);
    CHECK(lt_convert_grad_to_hf(&m, nd, shape, cw, y, g) == LT_OK, "%s", lt_last_error());
    double worst = 0;
    const float eps = 1e-2f;
    for (int64_t i = 0; i < n; i++) {
        float keep = x[i];
        double lp = 0, lm = 0;
        x[i] = keep + eps;
        lt_convert_values(&m, nd, shape, x, y);
        for (int64_t k = 0; k < n; k++)
            lp += (double)cw[k] * y[k];
        x[i] = keep - eps;
        lt_convert_values(&m, nd, shape, x, y);
        for (int64_t k = 0; k < n; k++)
            lm += (double)cw[k] * y[k];
        x[i] = keep;
        double fd = (lp - lm) / (2.0 * eps);
        double err = fabs(fd - g[i]) / (1e-3 + fabs(fd));
        if (err > worst)
            worst = err;
    }
    CHECK(worst < 2e-3, "%s: gradient differs from finite differences by %g", name, worst);
    free(x);
    free(y);
    free(cw);
    free(g);
}

static void test_gradients(void)
{
    struct lt_hf_config c;
    lt_hf_config_parse(qwen35_json, strlen(qwen35_json), "q35", &c);
    int64_t s_alog[1] = {6}, s_conv[3] = {12 + 12, 1, 4}, s_out[2] = {8, 12}, s_norm[1] = {8};
    int64_t s_qkv[2] = {24, 8}, s_b[2] = {6, 8};
    check_chain_rule(&c, "model.layers.0.linear_attn.A_log", 1, s_alog);
    check_chain_rule(&c, "model.layers.0.linear_attn.dt_bias", 1, s_alog);
    check_chain_rule(&c, "model.layers.0.linear_attn.conv1d.weight", 3, s_conv);
    check_chain_rule(&c, "model.layers.0.linear_attn.out_proj.weight", 2, s_out);
    check_chain_rule(&c, "model.layers.0.linear_attn.in_proj_qkv.weight", 2, s_qkv);
    check_chain_rule(&c, "model.layers.0.linear_attn.in_proj_b.weight", 2, s_b);
    check_chain_rule(&c, "model.layers.1.input_layernorm.weight", 1, s_norm);
    check_chain_rule(&c, "model.embed_tokens.weight", 2, s_b);

    /* A_log's gradient needs the GGUF values */
    struct lt_convert_map m;
    float gv[6] = {0}, out[6];
    lt_convert_map_hf(&c, "model.layers.0.linear_attn.A_log", &m);
    CHECK(lt_convert_grad_to_hf(&m, 1, s_alog, gv, NULL, out) == LT_ERR_INVALID);

    /* the one-call form the model checker uses: conv1d's gradient, GGUF ne [4, 24] */
    int64_t ne[4] = {4, 24, 1, 1}, hs[LT_MAX_DIMS + 1];
    float grad[96], ghf[96];
    char hf_name[128];
    int hnd = 0;
    for (int i = 0; i < 96; i++)
        grad[i] = (float)i;
    CHECK(lt_convert_grad_gguf_to_hf(&c, "blk.2.ssm_conv1d.weight", 2, ne, grad, NULL, hf_name,
                                     sizeof(hf_name), &hnd, hs, ghf) == LT_OK,
          "%s", lt_last_error());
    CHECK(!strcmp(hf_name, "model.layers.2.linear_attn.conv1d.weight"));
    CHECK(hnd == 3 && hs[0] == 24 && hs[1] == 1 && hs[2] == 4);
    int bad = 0;
    for (int ch = 0; ch < 24; ch++) {
        int src = ch; /* the GGUF channel HF channel ch was written to */
        if (ch >= 12) {
            int j = (ch - 12) / 2, d = (ch - 12) % 2;
            src = 12 + ((j % 3) * 2 + j / 3) * 2 + d;
        }
        for (int k = 0; k < 4; k++)
            bad += ghf[ch * 4 + k] != grad[src * 4 + k];
    }
    CHECK(bad == 0, "%d conv1d gradient entries misplaced", bad);
    CHECK(lt_convert_grad_gguf_to_hf(&c, "blk.2.nothing.weight", 2, ne, grad, NULL, hf_name,
                                     sizeof(hf_name), &hnd, hs, ghf) == LT_ERR_UNSUPPORTED);

    lt_hf_config_parse(llama_json, strlen(llama_json), "llama", &c);
    int64_t s_q[2] = {12, 12}, s_k[2] = {4, 12};
    check_chain_rule(&c, "model.layers.0.self_attn.q_proj.weight", 2, s_q);
    check_chain_rule(&c, "model.layers.0.self_attn.k_proj.weight", 2, s_k);
}

static void test_types(void)
{
    int64_t ne2[4] = {64, 8, 1, 1}, ne_odd[4] = {48, 8, 1, 1}, ne1[4] = {64, 1, 1, 1};
    CHECK(lt_convert_tensor_type(LT_CONVERT_OUT_Q8_0, "blk.0.ffn_up.weight", 2, ne2) ==
          LT_TYPE_Q8_0);
    CHECK(lt_convert_tensor_type(LT_CONVERT_OUT_Q8_0, "blk.0.ffn_up.weight", 2, ne_odd) ==
          LT_TYPE_F16);
    CHECK(lt_convert_tensor_type(LT_CONVERT_OUT_F16, "blk.0.attn_norm.weight", 1, ne1) ==
          LT_TYPE_F32);
    CHECK(lt_convert_tensor_type(LT_CONVERT_OUT_BF16, "blk.0.ssm_conv1d.weight", 2, ne2) ==
          LT_TYPE_F32);
    CHECK(lt_convert_tensor_type(LT_CONVERT_OUT_BF16, "blk.0.attn_q.bias", 1, ne1) ==
          LT_TYPE_F32);
    CHECK(lt_convert_tensor_type(LT_CONVERT_OUT_BF16, "token_embd.weight", 2, ne2) ==
          LT_TYPE_BF16);
    CHECK(lt_convert_tensor_type(LT_CONVERT_OUT_F32, "token_embd.weight", 2, ne2) == LT_TYPE_F32);
    enum lt_convert_outtype t;
    CHECK(lt_convert_outtype_parse("q8_0", &t) == LT_OK && t == LT_CONVERT_OUT_Q8_0);
    CHECK(lt_convert_outtype_parse("q4_0", &t) == LT_ERR_INVALID);
}

/* A checkpoint folder without tokenizer files (issue 18, item 9): a one-layer Qwen2 written
 * here as config.json + model.safetensors. The GGUF gets llama.cpp's vocabulary-less keys,
 * tokenizer.ggml.model = "none" and qwen2.vocab_size; lathe's loader takes the model, and the
 * tokenizer reader refuses it with a message instead of crashing. */
static void put_tensor(FILE *f, char *hdr, size_t cap, const char *name, int n_dims,
                       const int64_t *shape, uint64_t *offset)
{
    uint64_t n = 1;
    char dims[64] = "";
    for (int i = 0; i < n_dims; i++) {
        n *= (uint64_t)shape[i];
        snprintf(dims + strlen(dims), sizeof(dims) - strlen(dims), "%s%lld", i ? "," : "",
                 (long long)shape[i]);
    }
    snprintf(hdr + strlen(hdr), cap - strlen(hdr),
             "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
             *offset ? "," : "", name, dims, (unsigned long long)*offset,
             (unsigned long long)(*offset + 4 * n));
    *offset += 4 * n;
    if (f)
        for (uint64_t i = 0; i < n; i++) {
            float v = 0.1f * frand();
            fwrite(&v, 4, 1, f);
        }
}

static void test_no_tokenizer(void)
{
    char dir[] = "/tmp/lathe_test_convert_XXXXXX", path[256], out[256];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    static const struct {
        const char *name;
        int n_dims;
        int64_t shape[2];
    } ts[] = {
        {"model.embed_tokens.weight", 2, {24, 8}},
        {"model.norm.weight", 1, {8}},
        {"model.layers.0.input_layernorm.weight", 1, {8}},
        {"model.layers.0.post_attention_layernorm.weight", 1, {8}},
        {"model.layers.0.self_attn.q_proj.weight", 2, {8, 8}},
        {"model.layers.0.self_attn.q_proj.bias", 1, {8}},
        {"model.layers.0.self_attn.k_proj.weight", 2, {4, 8}},
        {"model.layers.0.self_attn.k_proj.bias", 1, {4}},
        {"model.layers.0.self_attn.v_proj.weight", 2, {4, 8}},
        {"model.layers.0.self_attn.v_proj.bias", 1, {4}},
        {"model.layers.0.self_attn.o_proj.weight", 2, {8, 8}},
        {"model.layers.0.mlp.gate_proj.weight", 2, {12, 8}},
        {"model.layers.0.mlp.up_proj.weight", 2, {12, 8}},
        {"model.layers.0.mlp.down_proj.weight", 2, {8, 12}},
    };
    const size_t n_ts = sizeof(ts) / sizeof(ts[0]);
    char hdr[4096] = "{";
    uint64_t off = 0;
    for (size_t i = 0; i < n_ts; i++)
        put_tensor(NULL, hdr + 1, sizeof(hdr) - 1, ts[i].name, ts[i].n_dims, ts[i].shape, &off);
    strcat(hdr, "}");
    while (strlen(hdr) % 8)
        strcat(hdr, " ");
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "%s", path);
    if (!f)
        return;
    uint64_t hlen = strlen(hdr);
    fwrite(&hlen, 8, 1, f);
    fwrite(hdr, 1, hlen, f);
    char scratch[4096] = "";
    off = 0;
    for (size_t i = 0; i < n_ts; i++)
        put_tensor(f, scratch, sizeof(scratch), ts[i].name, ts[i].n_dims, ts[i].shape, &off);
    fclose(f);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    f = fopen(path, "w");
    CHECK(f != NULL, "%s", path);
    if (!f)
        return;
    fputs("{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":8,"
          "\"intermediate_size\":12,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
          "\"num_hidden_layers\":1,\"vocab_size\":24,\"max_position_embeddings\":64,"
          "\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"tie_word_embeddings\":true}",
          f);
    fclose(f);

    snprintf(out, sizeof(out), "%s/out.gguf", dir);
    struct lt_convert_params p = {.hf_dir = dir, .out_path = out, .outtype = LT_CONVERT_OUT_F32};
    struct lt_convert_stats stats;
    CHECK(lt_convert_hf_to_gguf(&p, &stats) == LT_OK, "%s", lt_last_error());
    CHECK(stats.n_vocab == 0 && stats.n_tensors == (int64_t)n_ts);

    struct lt_gguf *g = NULL;
    CHECK(lt_gguf_open(out, &g) == LT_OK, "%s", lt_last_error());
    if (g) {
        const char *model = NULL;
        uint32_t n_vocab = 0;
        CHECK(lt_gguf_get_str(g, "tokenizer.ggml.model", &model) == LT_OK && !strcmp(model, "none"),
              "tokenizer.ggml.model: %s", model ? model : lt_last_error());
        CHECK(lt_gguf_get_u32(g, "qwen2.vocab_size", &n_vocab) == LT_OK && n_vocab == 24,
              "qwen2.vocab_size %u", n_vocab);
        CHECK(lt_gguf_find_key(g, "tokenizer.ggml.tokens") < 0);
        lt_gguf_close(g);
    }

    struct lt_model *m = NULL;
    CHECK(lt_model_load(out, NULL, &m) == LT_OK, "%s", lt_last_error());
    if (m) {
        CHECK(lt_model_hparams(m)->n_vocab == 24, "n_vocab %lld",
              (long long)lt_model_hparams(m)->n_vocab);
        struct lt_tokenizer *tok = NULL;
        CHECK(lt_tokenizer_from_gguf(lt_model_gguf(m), &tok) != LT_OK && tok == NULL);
        lt_model_free(m);
    }

    remove(out);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    remove(path);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    remove(path);
    rmdir(dir);
}

int main(void)
{
    test_config();
    test_names();
    test_perms();
    test_gradients();
    test_types();
    test_no_tokenizer();
    return check_summary();
}
