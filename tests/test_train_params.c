/* test_train_params.c: job parameters: defaults, and validation that names every bad field
 * with its own message (and only the bad ones). */
#include <math.h>
#include <string.h>

#include "check.h"
#include "lathe/comm.h"
#include "lathe/train.h"

static bool has_field(const struct lt_train_errors *e, const char *field, const char *words)
{
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->e[i].field, field) && strstr(e->e[i].message, words))
            return true;
    return false;
}

int main(void)
{
    struct lt_train_params p = {0};
    lt_train_params_defaults(&p);
    CHECK(p.rank == 8 && p.alpha == 16 && p.window == 256 && p.epochs == 1 && p.batch == 0 &&
              p.batch_tokens == 0 && p.grad_accum == 0 &&
              p.seed == 42,
          "defaults");
    CHECK(fabsf(p.lr - 1e-3f) < 1e-9f, "LoRA lr default %g", (double)p.lr);
    struct lt_train_params f = {.full = true, .rank = 4};
    lt_train_params_defaults(&f);
    CHECK(fabsf(f.lr - 1e-4f) < 1e-9f && f.alpha == 8, "full lr %g, alpha follows rank",
          (double)f.lr);

    struct lt_train_errors e;
    struct lt_train_params ok = {.out = "a.gguf", .text = "hello"};
    CHECK(lt_train_params_validate(&ok, &e) == LT_OK && e.n == 0, "minimal job: %s",
          lt_last_error());

    struct lt_train_params bad = {
        .text = "x",
        .examples_path = "y.jsonl",
        .rank = -1,
        .alpha = NAN,
        .targets = "attn_q,bogus",
        .top_layers = -2,
        .window = 1,
        .epochs = 1000,
        .lr = -1,
        .weight_decay = 2,
        .batch = -3,
        .batch_tokens = -5,
        .grad_accum = -4,
        .val_split = 1.5f,
        .fit = (enum lt_fit_policy)7,
    };
    CHECK(lt_train_params_validate(&bad, &e) == LT_ERR_INVALID, "bad parameters");
    CHECK(has_field(&e, "out", "output path"), "out");
    CHECK(has_field(&e, "examples", "only one"), "data");
    CHECK(has_field(&e, "rank", "-1"), "rank");
    CHECK(has_field(&e, "alpha", "positive"), "alpha");
    CHECK(has_field(&e, "targets", "bogus"), "targets");
    CHECK(has_field(&e, "top_layers", "-2"), "top_layers");
    CHECK(has_field(&e, "window", "not 1"), "window");
    CHECK(has_field(&e, "epochs", "1000"), "epochs");
    CHECK(has_field(&e, "lr", "-1"), "lr");
    CHECK(has_field(&e, "weight_decay", "2"), "weight_decay");
    CHECK(has_field(&e, "batch", "-3"), "batch");
    CHECK(has_field(&e, "batch_tokens", "-5"), "batch_tokens");
    CHECK(has_field(&e, "grad_accum", "-4"), "grad_accum");
    CHECK(has_field(&e, "val_split", "1.5"), "val_split");
    CHECK(has_field(&e, "fit", "none, middle or left"), "fit");
    CHECK(e.n == 15, "one message per bad field: %d", e.n);
    CHECK(strstr(lt_last_error(), "rank: rank must be") && strstr(lt_last_error(), "; "),
          "all messages in lt_last_error: %s", lt_last_error());

    struct lt_train_params both = {.out = "a.gguf", .text = "x", .batch = 8, .grad_accum = 2};
    CHECK(lt_train_params_validate(&both, &e) == LT_ERR_INVALID && e.n == 1 &&
              has_field(&e, "grad_accum", "not both"),
          "batch and grad_accum together");
    struct lt_train_params packed = {
        .out = "a.gguf", .text = "x", .batch_tokens = 8192, .grad_accum = 4};
    CHECK(lt_train_params_validate(&packed, &e) == LT_OK, "batch_tokens with grad_accum: %s",
          lt_last_error());

    struct lt_train_params nodata = {.out = "a.gguf"};
    CHECK(lt_train_params_validate(&nodata, &e) == LT_ERR_INVALID && e.n == 1 &&
              has_field(&e, "text", "training data"),
          "no data");
    struct lt_train_params fulltargets = {
        .out = "a.gguf", .text = "x", .full = true, .targets = "attn_q"};
    CHECK(lt_train_params_validate(&fulltargets, &e) == LT_ERR_INVALID &&
              has_field(&e, "targets", "full fine-tuning"),
          "targets with full");
    struct lt_train_params textfit = {.out = "a.gguf", .text_path = "t.txt", .fit = LT_FIT_LEFT};
    CHECK(lt_train_params_validate(&textfit, &e) == LT_ERR_INVALID && has_field(&e, "fit", "chat"),
          "fit with text");
    struct lt_train_params chatfit = {.out = "a.gguf",
                                      .examples = "{}",
                                      .fit = LT_FIT_MIDDLE,
                                      .val_split = 0.1f,
                                      .targets = " attn_qkv , ssm_out,"};
    CHECK(lt_train_params_validate(&chatfit, NULL) == LT_OK, "%s", lt_last_error());
    /* a validation file replaces val_split, and holds chat examples */
    struct lt_train_params held = {.out = "a.gguf", .examples = "{}", .val_examples_path = "v"};
    CHECK(lt_train_params_validate(&held, NULL) == LT_OK, "%s", lt_last_error());
    held.val_split = 0.2f;
    CHECK(lt_train_params_validate(&held, &e) == LT_ERR_INVALID && e.n == 1 &&
              has_field(&e, "val_split", "not both"),
          "val_split and a validation file");
    struct lt_train_params held_text = {.out = "a.gguf", .text = "x", .val_examples_path = "v"};
    CHECK(lt_train_params_validate(&held_text, &e) == LT_ERR_INVALID && e.n == 1 &&
              has_field(&e, "val_examples_path", "chat examples"),
          "a validation file for text");
    /* more than one GPU needs NCCL; a build without it says so and how to get it */
    struct lt_train_params gpus = {.out = "a.gguf", .text = "x", .gpus = 1};
    CHECK(lt_train_params_validate(&gpus, NULL) == LT_OK, "--gpus 1: %s", lt_last_error());
    gpus.gpus = 2;
    if (!lt_comm_have_nccl())
        CHECK(lt_train_params_validate(&gpus, &e) == LT_ERR_INVALID && e.n == 1 &&
                  has_field(&e, "--gpus", "-DLATHE_NCCL=ON"),
              "--gpus 2 without NCCL: %s", lt_last_error());
    gpus.gpus = 65;
    CHECK(lt_train_params_validate(&gpus, &e) == LT_ERR_INVALID && has_field(&e, "--gpus", "1..64"),
          "--gpus 65: %s", lt_last_error());

    enum lt_fit_policy fp;
    CHECK(lt_fit_policy_parse("middle", &fp) && fp == LT_FIT_MIDDLE, "middle");
    CHECK(lt_fit_policy_parse("left", &fp) && fp == LT_FIT_LEFT, "left");
    CHECK(!lt_fit_policy_parse("right", &fp), "right is not a policy");
    CHECK(!strcmp(lt_train_state_name(LT_TRAIN_CANCELLED), "cancelled"), "state name");
    return check_summary();
}
