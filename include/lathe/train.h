/* train.h: training jobs (LoRA and full fine-tuning) as a library API.
 *
 * A job is described by lt_train_params, validated as a whole before anything starts (one
 * message per bad field), admitted (src/opt: placement + memory, refused with a named op,
 * node and source), then run on a thread of its own. The caller can pause, resume or
 * cancel it from any thread and read its progress. The output file (an adapter GGUF in
 * llama.cpp's LoRA layout, or a whole model GGUF for full fine-tuning) is written to a
 * temporary file and renamed only when the job succeeds: a cancelled or failed job leaves
 * nothing behind. `lathe train` and the server's /train both run jobs through this API. */
#ifndef LATHE_TRAIN_H
#define LATHE_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/opt.h"
#include "lathe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct lt_model;
struct lt_backend;
struct lt_comm;

enum lt_fit_policy {
    LT_FIT_NONE = 0, /* an example longer than the window is refused with its index */
    LT_FIT_MIDDLE,   /* drop the oldest whole exchanges; keep system and the last exchange */
    LT_FIT_LEFT,     /* keep the tail */
};

#define LT_TRAIN_MAX_TARGETS 16
#define LT_TRAIN_MAX_EPOCHS 100 /* as CambrianTech's /train */

/* Zero numeric fields take the documented defaults (lt_train_params_defaults), so a
 * zeroed struct plus a data source and an output is a valid job. */
struct lt_train_params {
    const char *out; /* output .gguf path */
    /* data: exactly one of text / examples, each a file path or in-memory content */
    const char *text_path;     /* plain text file */
    const char *text;          /* plain text itself */
    const char *examples_path; /* JSONL: {"prompt","completion"} or {"messages":[...]} */
    const char *examples;      /* JSONL content itself */
    const char *val_examples_path; /* JSONL examples held out for the eval loss, instead of a
                                      val_split share of the examples (chat examples only) */
    /* LoRA */
    int rank;            /* default 8 */
    float alpha;         /* default 2 * rank */
    const char *targets; /* comma list of module names; NULL: the arch's attention set */
    int top_layers;      /* adapt only the last K blocks; 0: all */
    bool full;           /* full fine-tuning instead of LoRA */
    /* schedule */
    int window;             /* tokens per example window; default 256 */
    int epochs;             /* default 1 */
    float lr;               /* default 1e-4 (full), 1e-3 (LoRA) */
    float weight_decay;     /* default 0 */
    int batch;              /* examples per optimizer step; 0: batch_tokens' sequences x
                               grad_accum. Given alone: micro-batches of up to that many
                               sequences, as many as the step needs */
    int batch_tokens;       /* tokens per micro-batch graph: window-long sequences packed
                               side by side (batch_tokens / window of them); 0: on a device
                               the most that fit the memory budget, up to 16384 tokens, on
                               the host one window */
    int grad_accum;         /* micro-batches per optimizer step; 0: 1 (or what batch asks) */
    bool no_pack;           /* one example a sequence, padded, instead of padding-free
                               packing (examples one after another while they fit) */
    float val_split;        /* fraction held out for eval loss; default 0 */
    uint64_t seed;          /* shuffling and LoRA init; default 42 */
    enum lt_fit_policy fit; /* chat examples only */
    bool parse_special;     /* plain text: read special tokens' text (<|im_end|>) as those
                               tokens; chat examples always are, through their template */
    /* admission */
    size_t memory_budget_mib;   /* 0: the device's free memory less serving_reserve_mib */
    size_t serving_reserve_mib; /* default 1024 on a device, 0 on the host */
    bool device_only;           /* refuse rather than fall back to the CPU */
    bool f32_products;          /* on a device, keep products by F32 weights in F32 (slower;
                                   by default a device rounds their operands to BF16) */
    /* activation checkpointing (each layer's activations recomputed in the backward from
     * its input instead of kept): ON always, OFF never, SELECTIVE only the activations that
     * cost no product to make again (elementwise ops, norms, rope, SwiGLU, the short
     * convolution: less memory than OFF for a few passes over the activations); AUTO (0):
     * OFF, then SELECTIVE, then ON, the first that admission takes */
    enum lt_checkpoint {
        LT_CHECKPOINT_AUTO,
        LT_CHECKPOINT_ON,
        LT_CHECKPOINT_OFF,
        LT_CHECKPOINT_SELECTIVE
    } checkpoint;
    bool dry_run;               /* admit, report, and stop before allocating */
    /* data parallelism (lathe/comm.h) */
    int gpus;             /* ranks, one a GPU, for `lathe train` to start; 0: 1. More than one
                             needs a build with NCCL (-DLATHE_NCCL=ON) */
    struct lt_comm *comm; /* this job's rank of a data-parallel group (borrowed: it must outlive
                             the job; not copied): every rank runs the same job with the same
                             parameters and data, takes its share of each step's micro-batches,
                             and the gradients are summed before each optimizer step, so all
                             ranks apply the same update; only rank 0 writes the output. The
                             loss curve, progress and tokens are the whole step's, on every
                             rank. NULL: one process, one rank */
};

/* Where lt_train_data_check found the data at fault. */
struct lt_train_data_fault {
    int example;      /* the chat example (0-based, blank lines not counted); -1: not one
                         example's fault (no example at all, none left after the split, text) */
    int line;         /* its JSONL line (1-based); -1 with example */
    char reason[512]; /* the message without the "example N (line L): " in front */
};

struct lt_tokenizer;
struct lt_chat_template;

/* Reads, renders and tokenizes the training data of params exactly as a job on a model with
 * this tokenizer and chat template (ct may be NULL: text only) will, and splits it, without a
 * model or any tensor: a caller (the server) can refuse bad data before it starts a job. LT_OK,
 * or the job's own failure with lt_last_error as the job would report it ("example 3 (line 4):
 * \"messages\" must be a non-empty array") and fault (may be NULL) filled. A fault in
 * val_examples_path's examples is reported the same way, lt_last_error starting with that
 * path: a caller that must tell the files apart checks that one alone first. */
lt_status lt_train_data_check(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                              const struct lt_train_params *params,
                              struct lt_train_data_fault *fault);

/* Fills the documented defaults into zero fields. */
void lt_train_params_defaults(struct lt_train_params *p);
/* "none", "middle", "left" -> the policy; false for anything else. */
bool lt_fit_policy_parse(const char *s, enum lt_fit_policy *out);

/* ---- the parameters' table ----
 * One row a parameter: its POST /train key, its `lathe train` flag, its key in
 * /v1/fine_tuning/jobs' hyperparameters, its type and range, its default and help text, and
 * the field of struct lt_train_params it sets. The CLI, /train and fine-tuning read their
 * names and limits from here, lt_train_params_validate checks the ranges from here, and
 * `lathe train --help` and the README's table are printed from it. */
enum lt_train_field_type {
    LT_TF_STRING,     /* const char * */
    LT_TF_INT,        /* int */
    LT_TF_U64,        /* uint64_t */
    LT_TF_SIZE,       /* size_t */
    LT_TF_FLOAT,      /* float */
    LT_TF_BOOL,       /* bool; a flag without a value */
    LT_TF_FIT,        /* enum lt_fit_policy: none, middle, left */
    LT_TF_CHECKPOINT, /* enum lt_checkpoint: auto, on, off, selective (JSON: those names, or
                         true / false for on / off; absent: auto) */
};

struct lt_train_field {
    const char *section; /* the help's heading of the rows from here on; NULL: the same */
    const char *key;    /* POST /train's key; NULL: not there */
    const char *flag;   /* lathe train's flag; NULL: not there */
    const char *ft_key; /* /v1/fine_tuning/jobs' hyperparameters' key; NULL: not there */
    enum lt_train_field_type type;
    double lo, hi;         /* numbers: the range of a given value (lo == hi == 0: none) */
    bool lo_open, hi_open; /* the bound itself is out */
    bool zero_default;     /* 0 stands for the default: not checked against the range */
    const char *value;     /* the flag's value in help text ("N", "F", "FILE") */
    const char *def;       /* the default, as help text; NULL: none (required or off) */
    const char *help;
    size_t offset;         /* in struct lt_train_params */
};

/* The table; *n rows. */
const struct lt_train_field *lt_train_fields(size_t *n);
const struct lt_train_field *lt_train_field_by_flag(const char *flag);
/* The row of a POST /train key or a fine-tuning hyperparameters' key; NULL: none. */
const struct lt_train_field *lt_train_field_by_key(const char *key);
/* Parses a flag's value into p's field by its type (a number, auto|on|off, a fit policy,
 * a string kept as given); false when the text is not one. The range is not checked here:
 * lt_train_params_validate does that, naming every bad field at once. */
bool lt_train_field_parse(const struct lt_train_field *f, const char *text,
                          struct lt_train_params *p);
/* Whether v lies in f's range. */
bool lt_train_field_in_range(const struct lt_train_field *f, double v);
/* The range as text ("1..4096", "(0, 1]"); "" when the field has none. */
void lt_train_field_range_text(const struct lt_train_field *f, char *out, size_t size);

/* Problems with parameters, one per field. */
#define LT_TRAIN_MAX_ERRORS 24
struct lt_train_errors {
    int n;
    struct {
        char field[32];
        char message[200];
    } e[LT_TRAIN_MAX_ERRORS];
};

/* LT_OK when every field is valid (zero fields count as their defaults); otherwise
 * LT_ERR_INVALID with errs (may be NULL) filled, one entry per bad field, and the messages
 * joined by "; " in lt_last_error. Checks values only (files are read when the job runs;
 * what depends on the model, such as a target it lacks, is checked then). */
lt_status lt_train_params_validate(const struct lt_train_params *p, struct lt_train_errors *errs);

enum lt_train_state {
    LT_TRAIN_IDLE = 0,
    LT_TRAIN_STARTING, /* loading data, admission, allocation */
    LT_TRAIN_RUNNING,
    LT_TRAIN_PAUSED,
    LT_TRAIN_DONE,
    LT_TRAIN_CANCELLED,
    LT_TRAIN_ERROR,
};
const char *lt_train_state_name(enum lt_train_state s); /* "idle", "running", ... */

struct lt_train_progress {
    enum lt_train_state state;
    int epoch, n_epochs; /* epoch counts from 1 */
    int step, n_steps;   /* optimizer steps done, and in the whole job */
    float loss;          /* of the last optimizer step (its micro-batches' token-weighted mean) */
    int64_t tokens;      /* input tokens processed so far (padding excluded) */
    double tokens_per_s; /* over the time spent running (pauses excluded) */
    double eta_s;
    int n_examples; /* examples (or text windows) loaded, both splits; 0 before loading */
    int n_fitted;   /* of those, shortened by the fit policy to fit the window */
    int n_skipped;  /* examples the fit policy could not fit (not among n_examples) */
    double step_s;  /* running time of the last optimizer step (pauses excluded) */
};

struct lt_train_result {
    enum lt_train_state state; /* DONE, CANCELLED or ERROR */
    int n_epochs;
    float train_loss[LT_TRAIN_MAX_EPOCHS]; /* mean per epoch */
    float eval_loss[LT_TRAIN_MAX_EPOCHS];  /* NAN without a validation split */
    int64_t tokens;                        /* trained (loss-bearing and context) */
    double seconds, tokens_per_s;
    size_t peak_bytes;            /* admission estimate (the trainable tensors included) */
    size_t scratch_bytes;         /* of which the kernels' working memory the job adds */
    size_t in_use_bytes;          /* of which device memory in use before the job */
    size_t allocated_bytes;       /* what allocation took */
    int n_fallback;               /* nodes not on the first backend */
    int n_train, n_val;           /* examples (or text windows) in each split */
    int n_fitted, n_skipped;      /* examples the fit policy shortened, and left out */
    int n_tokens_graph;           /* tokens per sequence of the micro-batch graph (<= window) */
    int n_seqs_graph;             /* sequences per micro-batch graph */
    bool packed;                  /* examples packed padding-free into the sequences */
    int n_recomputed;             /* forward tensors the backward recomputes (0: checkpointing
                                     off) */
    bool recompute_selective;     /* checkpointing was selective (the cheap tensors alone) */
    int grad_accum;               /* micro-batches per optimizer step (the last may be short) */
    int n_trainable;              /* trainable tensors */
    int64_t n_trainable_elements; /* trainable numbers */
    char admission[4096];         /* placement summary and memory estimate (text) */
    lt_status status;
    struct lt_refusal refusal; /* kind != NONE when admission refused */
    char error[1024];          /* the reason on failure (refusal sentence unchanged) */
    /* the loss curve (per optimizer step), for plots */
    int n_curve;
    float *curve;
};

/* Writes the loss curve (per step, with the per-epoch eval losses when present) as an SVG
 * image. */
lt_status lt_train_plot_svg(const struct lt_train_result *r, const char *path);

typedef void (*lt_train_progress_fn)(void *user, const struct lt_train_progress *p);

struct lt_train_job;

/* Starts a job on its own thread, training `model` on `backends` (priority order).
 * Parameters are validated first (LT_ERR_INVALID, nothing started). The model and the
 * backends must outlive the job; inference may go on using the model meanwhile (the job
 * trains adapters or its own F32 copies, never the served weights in place), but a backend
 * runs one graph at a time: give the job a backend object of its own (e.g. its own CPU
 * backend) unless the caller serialises compute. Parameters are copied (strings included).
 * The progress callback runs on the job's thread. */
lt_status lt_train_job_start(struct lt_model *model, struct lt_backend *const *backends,
                             int n_backends, const struct lt_train_params *params,
                             lt_train_progress_fn progress, void *user, struct lt_train_job **out);
/* Runs a job on the calling thread to the end (the CLI). The status is result->status;
 * the progress callback runs on the calling thread. result->curve is malloc'd: release it
 * with lt_train_result_free. */
lt_status lt_train_job_run(struct lt_model *model, struct lt_backend *const *backends,
                           int n_backends, const struct lt_train_params *params,
                           lt_train_progress_fn progress, void *user,
                           struct lt_train_result *result);

enum lt_train_state lt_train_job_state(struct lt_train_job *job);
void lt_train_job_progress(struct lt_train_job *job, struct lt_train_progress *out);
void lt_train_job_cancel(struct lt_train_job *job);
void lt_train_job_pause(struct lt_train_job *job);
void lt_train_job_resume(struct lt_train_job *job);
/* Waits for the end and copies the result; out->curve is a copy for the caller to release
 * with lt_train_result_free. */
void lt_train_job_wait(struct lt_train_job *job, struct lt_train_result *out);
/* Frees r->curve (NULL is fine). */
void lt_train_result_free(struct lt_train_result *r);
/* Cancels if running, waits, frees. */
void lt_train_job_free(struct lt_train_job *job);

#ifdef __cplusplus
}
#endif
#endif
